/* SPDX-License-Identifier: MIT */
/* For engine tests: how far a finished request's recorded logits are from the
 * double-precision reference forward run over the same tokens. */
#ifndef MS_TEST_REF_CHECK_H
#define MS_TEST_REF_CHECK_H

#include <math.h>
#include <stdlib.h>

#include "megascope/engine.h"
#include "megascope/reference.h"

/* Largest |logit - reference| over every recorded position of in (prompt,
 * then generated tokens). */
static inline double test_ref_diff(const struct ms_model *m, const struct ms_request_info *in,
                                   const int32_t *prompt) {
  struct ms_ref *r = ms_ref_new(m, 64);
  float *lg = malloc(sizeof(float) * (size_t)m->cfg.vocab);
  double worst = 0;
  for (int pos = 0; pos < in->n_logits; pos++) {
    int tok = pos < in->n_prompt ? prompt[pos] : in->tokens[pos - in->n_prompt];
    ms_ref_step(r, tok, lg);
    for (int v = 0; v < m->cfg.vocab; v++) {
      double d = fabs((double)lg[v] - (double)in->logits[(size_t)pos * (size_t)m->cfg.vocab + (size_t)v]);
      if (!(d <= worst)) worst = d;
    }
  }
  free(lg);
  ms_ref_free(r);
  return worst;
}

#endif
