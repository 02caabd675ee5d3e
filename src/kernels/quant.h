/* SPDX-License-Identifier: MIT */
/* Quantized and half-precision weights: GEMV kernels that read the GGUF block
 * formats in place and dequantize inside the dot-product loop (a block of 32
 * weights is expanded into registers and used for every batch row; nothing is
 * copied to f32 first), and the quantizers that write those formats.
 *
 * Formats (ggml's, little-endian, 32 elements a block):
 *   Q8_0 {f16 d; int8 q[32]}          x[j] = d * q[j]
 *   Q4_0 {f16 d; uint8 qs[16]}        x[j] = d * ((qs[j] & 15) - 8), x[j+16] = d * ((qs[j] >> 4) - 8)
 *   Q4_1 {f16 d; f16 m; uint8 qs[16]} x[j] = d * (qs[j] & 15) + m,   x[j+16] = d * (qs[j] >> 4) + m
 * F16 is a plain array of IEEE halves; Q5_0, Q5_1, IQ4_NL and the K-quants are
 * in quant_k.h (their decoders there, their GEMV loops here). */
#ifndef MS_KERNELS_QUANT_H
#define MS_KERNELS_QUANT_H

#include "megascope/model.h"

/* 1 for the types these kernels handle (F16 and every block type). */
int ms_quant_handles(enum ms_dtype t);

/* ms_vec_gemv for the types above: y[b*ldy + (r - r0)] = W[r,:] . x[b*ldx + :].
 * `simd` selects the AVX2/FMA/F16C path (when this CPU has F16C too). */
void ms_quant_gemv(const struct ms_weight *w, int r0, int r1, const float *x, int ldx, int nb, float *y,
                   int ldy, int simd);

/* Quantizes n values (n a multiple of the type's block) into out, which holds
 * ms_dtype_row_bytes(t, n) bytes, with ggml's reference rounding; every
 * ms_dtype works (F32 copies, BF16/F16 round to nearest even). -EINVAL when n
 * is not a multiple of the block. */
int ms_quant_row(enum ms_dtype t, const float *x, int n, void *out);

/* ---- 8-bit activations (the engine's q8_activations mode) ----
 *
 * The input rows of a GEMV are quantized once per call to blocks of 32:
 * x[j] ~ d * q[j], d = max|x| / 127 over the block (f32), q in [-127, 127]
 * rounded to nearest, ties to even; s = d * sum(q) for Q4_1's minimum term.
 * Q8_0, Q4_0 and Q4_1 weights (and quant_k.h's, see quant.c) then take integer dot products with q (exact),
 * and each block adds (d_w * d) * idot in f32 - through the same float
 * operations in the same order on the AVX2 path and the portable one, so the
 * two give the same bits, and every (weight row, input row) result is
 * independent of the row range, the batch size and the thread. NaN inputs give
 * unspecified (but defined) results. */
struct ms_q8_act {
  int n, nb;        /* nb rows of n values, n a multiple of 32 */
  int8_t *q;        /* (nb, n), each row 32-byte aligned */
  float *d, *s;     /* (nb, n / 32) */
  int16_t *bs;      /* (nb, n / 16): the sum of each 16 q (the K minimums' term) */
};

/* Bytes of a buffer holding nb rows of n values in 8 bits (n a multiple of 32). */
size_t ms_q8_act_bytes(int n, int nb);

/* Quantizes x[b*ldx + 0..n) for b in [0, nb) into `buf` (ms_q8_act_bytes(n, nb)
 * bytes, 32-byte aligned) and points `a` at it. */
void ms_q8_quantize(struct ms_q8_act *a, void *buf, const float *x, int ldx, int nb, int n, int simd);

/* The best simd level ms_q8_gemv can take here: 2 (AVX-512 VNNI), 1 (AVX2), 0. */
int ms_q8_simd_level(void);

/* 1 for the weight types with an 8-bit-activation GEMV: every block type. */
int ms_q8_handles(enum ms_dtype t);

/* y[b*ldy + (r - r0)] = W[r,:] . (row b of a) for r in [r0, r1), b in [0, a->nb);
 * a->n == w->cols. simd: 0 the portable path, 1 AVX2, 2 AVX-512 VNNI for
 * Q8_0/Q4_0/Q4_1 where the CPU has it (AVX2 otherwise); all give the same bits. */
void ms_q8_gemv(const struct ms_weight *w, int r0, int r1, const struct ms_q8_act *a, float *y, int ldy,
                int simd);

/* ---- repacked weights (ms_weight.packed) ----
 * Q8_0, Q4_0, Q4_1, Q5_0 and Q5_1 with an even number of blocks a row, and the
 * K-quants Q2_K .. Q6_K (below), on a CPU
 * with AVX-512 VNNI: rows in groups of four (the last rows % 4 stay in data
 * alone), one stream feeding four output rows. For group g and block pair p
 * (blocks 2p, 2p + 1), in three regions one after the other:
 *   quants   Q8_0: 256 bytes, for each row its two blocks' 32 values + 128 (the
 *            unsigned operand of vpdpbusd); the others: 128 bytes, rows 2h and
 *            2h + 1 in the low and the high nibbles of 64 bytes, each byte k
 *            value k of the pair in element order (the fifth bits apart);
 *   scales   the eight halves d[row][block] in row order, then (Q4_1, Q5_1)
 *            the eight m[row][block];
 *   (Q5) high bits: for each row a 64-bit word, bit k the fifth bit of value k.
 * The sums are bit for bit those of data. 0 when w gets no packed form here. */
size_t ms_quant_packed_bytes(const struct ms_weight *w);
/* The K-quants: groups of four rows as above, per (group g, super-block s)
 * and its four block pairs p (elements 64p .. 64p + 63 of the super-block),
 * every value as u = q + 4 (Q3_K), q + 32 (Q6_K) or q, in three regions:
 *   quants   per (g, s, p), Q4_K, Q5_K, Q6_K: 128 bytes, the low nibbles of u
 *            as Q4_0's above; Q2_K, Q3_K: 64 bytes, byte k bits 2j, 2j + 1
 *            the low two bits of value k of row j;
 *   high     per (g, s, p), Q5_K (bit 4 of u) and Q3_K (bit 2): a 64-bit word
 *            a row, bit k value k's; Q6_K: 64 bytes, byte k bits 2j, 2j + 1
 *            bits 4, 5 of value k of row j;
 *   scales   per (g, s): the integer scales as bytes, for each p and row j its
 *            two pieces' (Q4_K, Q5_K: [p][j][2], then the minimums the same
 *            way) or four halves' ([p][j][4]: Q3_K's and Q6_K's signed, Q2_K's
 *            the file's sc | mn << 4 bytes), then d of rows 0..3 (f16), then
 *            dmin of rows 0..3 (Q2_K, Q4_K, Q5_K). */
/* Writes w's packed form (ms_quant_packed_bytes(w) bytes, 64-byte aligned). */
void ms_quant_repack(const struct ms_weight *w, void *out);

#endif
