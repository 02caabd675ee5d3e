/* SPDX-License-Identifier: MIT */
/* Choosing the next token from logits: greedy, or a seeded draw with
 * temperature, top-k and top-p (nucleus) filtering.
 *
 * The draw for a sequence's i-th generated token depends only on (seed, i) and
 * the logits, never on the thread, the batch or earlier draws, so a request
 * with a fixed seed produces the same text however it is scheduled. Order of
 * the filters (as in Hugging Face transformers and llama2.c): the logits are
 * divided by the temperature and turned into probabilities; top-k keeps the k
 * most probable tokens; top-p then keeps the smallest prefix of those, by
 * decreasing probability, whose mass reaches p; min-p then drops those less
 * probable than min_p times the most probable (as vLLM orders them); the
 * survivors are renormalised and one is drawn. Ties in probability are ordered by token id. */
#ifndef MEGASCOPE_SAMPLE_H
#define MEGASCOPE_SAMPLE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct ms_sample_params {
  float temperature;  /* <= 0: greedy (the largest logit, the lowest id on ties) */
  int top_k;          /* <= 0: no top-k */
  float top_p;        /* <= 0 or >= 1: no top-p */
  uint64_t seed;
  float min_p;        /* <= 0: off; else drops tokens less probable than min_p x the most probable */
};

/* 1 when p asks for greedy decoding (NULL does too). */
int ms_sample_is_greedy(const struct ms_sample_params *p);

/* The token for draw number `counter` of a sequence, or a negative errno
 * (-EINVAL: n < 1). Allocates a scratch array of n entries unless greedy or
 * neither filter is on. */
int ms_sample(const float *logits, int n, const struct ms_sample_params *p, uint64_t counter);

/* The distribution ms_sample draws from: probs[i] for every token (0 for the
 * filtered ones), summing to 1. 0 or a negative errno. */
int ms_sample_probs(const float *logits, int n, const struct ms_sample_params *p, float *probs);

/* The uniform number in [0, 1) used by draw `counter` under `seed`. */
double ms_sample_uniform(uint64_t seed, uint64_t counter);

/* Index of the largest of v[0..n), the lowest index on ties; NaNs are never
 * taken (a NaN at 0 is the answer: nothing compares above it). The greedy rule. */
int ms_sample_argmax(const float *v, int n);

#ifdef __cplusplus
}
#endif
#endif
