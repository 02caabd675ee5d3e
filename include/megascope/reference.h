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

/* on: the reference of the engine's 8-bit activations. Before each product
 * with a block-format weight (ms_q8_handles: q8_0 .. the K-quants) its input
 * is rounded as the engine rounds it (to float, then blocks of 32 of
 * d * q, q = round(x / d) in [-127, 127], d = max|x| / 127), and the product
 * of the rounded input is taken in double. What is left between this and the
 * engine is the f32 accumulation and the rare input that rounds to the other
 * step. off (the default): the exact forward. Set before the first step. */
void ms_ref_set_q8(struct ms_ref *r, int on);

/* on: the reference of the engine's KV cache in f16 (ms_engine_opts.kv_f16):
 * each K (after RoPE) and V value is cached as the nearest f16 of its float.
 * Set before the first step. */
void ms_ref_set_kv_f16(struct ms_ref *r, int on);

/* Feeds `token` at the next position and writes the vocab logits. -ENOSPC when
 * the context is full, -EINVAL for a token out of range. */
int ms_ref_step(struct ms_ref *r, int token, float *logits);

/* Index of the largest logit, the lowest index on ties (the greedy rule). */
int ms_argmax(const float *v, int n);

#ifdef __cplusplus
}
#endif
#endif
