/* SPDX-License-Identifier: MIT */
/* The reference forward: a naive, single-threaded decoder for one sequence, with
 * double-precision accumulation. It shares no code with the task kernels and is the
 * oracle every backend is checked against. */
#ifndef MEGASCOPE_REFERENCE_H
#define MEGASCOPE_REFERENCE_H

#include "megascope/model.h"

#ifdef __cplusplus
extern "C" {
#endif

struct ms_ref;

struct ms_ref *ms_ref_new(const struct ms_model *m, int max_ctx);
void ms_ref_free(struct ms_ref *r);

/* Feeds `token` at the next position and writes the vocab logits. -ENOSPC when
 * the context is full, -EINVAL for a token out of range. */
int ms_ref_step(struct ms_ref *r, int token, float *logits);

/* Index of the largest logit, the lowest index on ties (the greedy rule). */
int ms_argmax(const float *v, int n);

#ifdef __cplusplus
}
#endif
#endif
