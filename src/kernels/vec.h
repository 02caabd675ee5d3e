/* SPDX-License-Identifier: MIT */
/* Vector kernels: GEMV tiles over a small batch, dot products, and the helpers the
 * task bodies share. AVX2/FMA where the CPU has them (chosen once at start-up),
 * a portable loop elsewhere; the results of one path are the same for any tiling
 * and any thread, so a plan's tokens do not depend on the schedule. */
#ifndef MS_KERNELS_VEC_H
#define MS_KERNELS_VEC_H

#include "kernels/quant.h"
#include "megascope/model.h"

/* y[b*ldy + (r - r0)] = W[r,:] . x[b*ldx + :]  for r in [r0, r1), b in [0, nb). */
void ms_vec_gemv(const struct ms_weight *w, int r0, int r1, const float *x, int ldx, int nb,
                 float *y, int ldy);

/* The 8-bit-activation GEMV (kernels/quant.h) on the path ms_vec_gemv uses:
 * the rows of x quantized into buf in blocks of qk (ms_q8_qk of the weight
 * type), then W[r0:r1] . x for a weight type that ms_q8_handles. */
void ms_vec_q8_quantize(struct ms_q8_act *a, void *buf, const float *x, int ldx, int nb, int n, int qk);
void ms_vec_q8_gemv(const struct ms_weight *w, int r0, int r1, const struct ms_q8_act *a, float *y, int ldy);

float ms_vec_dot(const float *a, const float *b, int n);

/* y += a * x */
void ms_vec_axpy(float *y, float a, const float *x, int n);

/* Attention over one run of positions whose rows lie `ld` floats apart (one
 * KV page): s[p] = scale * q . k[p] for p in [0, n), each dot as ms_vec_dot
 * computes it; and o[0, hd) += w[p] * v[p] over the run, in position order
 * (o held in registers across the run, 64 columns at a time). */
void ms_vec_dot_run(const float *q, const float *k, size_t ld, int n, int hd, float scale, float *s);
void ms_vec_axpy_run(float *o, const float *w, const float *v, size_t ld, int n, int hd);

/* The same for the ng query heads that share one KV head (q and o: ng rows of
 * hd floats; s and w: ng rows sld floats apart): each head's results are the
 * bits the calls above give it, and the run's K and V rows are read once for
 * all the heads instead of once a head. */
void ms_vec_dot_runs(const float *q, int ng, const float *k, size_t ld, int n, int hd, float scale, float *s,
                     size_t sld);
void ms_vec_axpy_runs(float *o, int ng, const float *w, size_t sld, const float *v, size_t ld, int n, int hd);

/* f16 rows (the KV cache in f16, ms_engine_opts.kv_f16): n values converted
 * each way, to the nearest f16 (ties to even; above 65504 to infinity) and
 * back exactly, the same bits on every path (F16C or ms_f32_to_f16). */
void ms_vec_f32_to_f16(uint16_t *dst, const float *src, int n);
void ms_vec_f16_to_f32(float *dst, const uint16_t *src, int n);

/* Each of the ng rows of s (sld floats apart) over [p0, n) made its softmax:
 * exp(s[p] - max) / sum, exp the GLU's polynomial, the sum in eight lanes:
 * the same bits on both paths. Each row's values depend on that row alone. */
void ms_vec_softmax_rows(float *s, int ng, size_t sld, int p0, int n);
/* Its steps before the division, for a share of the positions whose results a
 * merge rescales: s[p] over [p0, n) made exp(s[p] - m), each row's maximum m
 * into mx[g] and the sum of its exponentials into sum[g] (the same lanes and
 * bits). An empty range gives -inf and 0. */
void ms_vec_softmax_rows_part(float *s, int ng, size_t sld, int p0, int n, float *mx, float *sum);

/* out = x * w / rms(x), the squares summed in eight lanes (the same bits on
 * both paths) */
void ms_vec_rmsnorm(float *out, const float *x, const float *w, int n, float eps);

/* The gated FFN's product out[i] = act(g[i]) * u[i], act SiLU (gelu 0) or
 * GELU's tanh form (gelu 1), both as g / (1 + exp(-k)): k = g for SiLU, 2 *
 * 0.7978845608 (g + 0.044715 g^3) for GELU (0.5 (1 + tanh(z)) is
 * sigmoid(2z)). exp is Cephes' polynomial (within 2 ulp of expf), eight lanes
 * at a time on the AVX2 path and the same steps one float at a time on the
 * portable path: both give the same bits. (SiLU took expf on every path until
 * 2026-12-07; the vector exp makes SmolLM2's gate_up tasks 8% shorter.) Each
 * element's value depends on that element alone. */
void ms_vec_glu(float *out, const float *g, const float *u, int n, int gelu);

/* 1 when the AVX2/FMA path is in use. */
int ms_vec_simd(void);

/* Forces the portable path (tests compare both). */
void ms_vec_force_portable(int on);

#endif
