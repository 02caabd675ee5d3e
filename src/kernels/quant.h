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
 * F16 is a plain array of IEEE halves. */
#ifndef MS_KERNELS_QUANT_H
#define MS_KERNELS_QUANT_H

#include "megascope/model.h"

/* 1 for the types these kernels handle (F16, Q8_0, Q4_0, Q4_1). */
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

#endif
