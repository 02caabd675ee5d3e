/* SPDX-License-Identifier: MIT */
/* Quantized and half-precision weights: GEMV kernels that read the GGUF block
 * formats in place and dequantize inside the dot-product loop (a block of 32
 * weights is expanded into registers and used for every batch row; nothing is
 * copied to f32 first). The formats themselves, their quantizers and the
 * packed layout (ms_weight.packed) the AVX-512 and AVX2 paths read are the
 * model's dtype code: src/model/blocks.h and quant_k.h.
 *
 * Formats (ggml's, little-endian, 32 elements a block):
 *   Q8_0 {f16 d; int8 q[32]}          x[j] = d * q[j]
 *   Q4_0 {f16 d; uint8 qs[16]}        x[j] = d * ((qs[j] & 15) - 8), x[j+16] = d * ((qs[j] >> 4) - 8)
 *   Q4_1 {f16 d; f16 m; uint8 qs[16]} x[j] = d * (qs[j] & 15) + m,   x[j+16] = d * (qs[j] >> 4) + m
 * F16 is a plain array of IEEE halves; Q5_0, Q5_1, IQ4_NL and the K-quants are
 * in model/quant_k.h (their decoders there, their GEMV loops here). */
#ifndef MS_KERNELS_QUANT_H
#define MS_KERNELS_QUANT_H

#include "megascope/model.h"

/* 1 for the types these kernels handle (F16 and every block type). */
int ms_quant_handles(enum ms_dtype t);

/* ms_vec_gemv for the types above: y[b*ldy + (r - r0)] = W[r,:] . x[b*ldx + :].
 * `simd` selects the AVX2/FMA/F16C path (when this CPU has F16C too). */
void ms_quant_gemv(const struct ms_weight *w, int r0, int r1, const float *x, int ldx, int nb, float *y,
                   int ldy, int simd);

/* ---- 8-bit activations (the engine's q8_activations mode) ----
 *
 * The input rows of a GEMV are quantized once per call to blocks of qk values
 * (ms_q8_qk of the weight type: 32, or 256 for the K-quants' super-blocks):
 * x[j] ~ d * q[j], d = max|x| / 127 over the block (f32), q in [-127, 127]
 * rounded to nearest, ties to even; bs the sum of each 16 q; (qk 32) s = d *
 * sum(q) for Q4_1's minimum term.
 * The 32-element types then take each block's integer dot product with q
 * (exact) and add (d_w * d) * idot in f32, in four chains (a K-quant
 * super-block combines its sub-block scales and minimums as integers first:
 * one conversion per 256) - through the same float operations in the same order on the AVX2 and
 * AVX-512 paths and the portable one, so they give the same bits, and every
 * (weight row, input row) result is independent of the row range, the batch
 * size and the thread. NaN inputs give unspecified (but defined) results. */
struct ms_q8_act {
  int n, nb, qk;    /* nb rows of n values, n a multiple of qk (32 or 256) */
  int8_t *q;        /* (nb, n), each row 32-byte aligned */
  float *d;         /* (nb, n / qk) */
  float *s;         /* (nb, n / 32), qk 32 only; NULL for 256 */
  int16_t *bs;      /* (nb, n / 16): the sum of each 16 q (the K minimums' term) */
  int8_t *qa;       /* (nb, n), qk 32 only (NULL for 256): each row's q as the packed 32-element
                       kernels read it (quant.c) */
};

/* The activation block (qk) weights of type t take: 256 for the K-quants with
 * 256-element super-blocks (Q2_K .. Q6_K, Q8_K), 32 for every other type. */
int ms_q8_qk(enum ms_dtype t);

/* Bytes of a buffer holding nb rows of n values in 8 bits (n a multiple of 32),
 * at either qk. */
size_t ms_q8_act_bytes(int n, int nb);

/* Quantizes x[b*ldx + 0..n) for b in [0, nb) in blocks of qk (32 or 256, n a
 * multiple of it) into `buf` (ms_q8_act_bytes(n, nb) bytes, 32-byte aligned)
 * and points `a` at it. */
void ms_q8_quantize(struct ms_q8_act *a, void *buf, const float *x, int ldx, int nb, int n, int qk, int simd);

/* The best simd level ms_q8_gemv can take here: 2 (AVX-512 VNNI), 1 (AVX2), 0. */
int ms_q8_simd_level(void);

/* 1 for the weight types with an 8-bit-activation GEMV: every block type. */
int ms_q8_handles(enum ms_dtype t);

/* y[b*ldy + (r - r0)] = W[r,:] . (row b of a) for r in [r0, r1), b in [0, a->nb);
 * a->n == w->cols, a->qk == ms_q8_qk(w->dtype). simd: 0 the portable path, 1 AVX2, 2 AVX-512 VNNI for
 * Q8_0/Q4_0/Q4_1 where the CPU has it (AVX2 otherwise); all give the same bits. */
void ms_q8_gemv(const struct ms_weight *w, int r0, int r1, const struct ms_q8_act *a, float *y, int ldy,
                int simd);

#endif
