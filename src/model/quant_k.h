/* SPDX-License-Identifier: MIT */
/* The K-quants and the other 5- and 4-bit GGUF formats: their scalar decoders
 * (the reference every kernel and test compares with), their quantizers, and
 * the unpacking of a 32-element piece of a weight row into small integers for
 * the 8-bit-activation dot products. quant.c holds the GEMV loops over them.
 *
 * Layouts (ggml's ggml-common.h, little-endian; QK_K = 256 elements a super-block):
 *   Q5_0   {f16 d; u8 qh[4]; u8 qs[16]}                   32 elems, 22 bytes
 *          x[j] = d * ((qs[j] & 15 | bit j of qh << 4) - 16), x[j+16] from qs[j] >> 4 and bit j+16
 *   Q5_1   {f16 d; f16 m; u8 qh[4]; u8 qs[16]}            32 elems, 24 bytes; d * q + m
 *   IQ4_NL {f16 d; u8 qs[16]}                             32 elems, 18 bytes; d * kvalues[nibble]
 *   Q2_K   {u8 scales[16]; u8 qs[64]; f16 d, dmin}        256 elems, 84 bytes
 *          16 groups of 16: d * (sc & 15) * q - dmin * (sc >> 4), q 2 bits
 *   Q3_K   {u8 hmask[32]; u8 qs[64]; u8 scales[12]; f16 d} 256 elems, 110 bytes
 *          16 groups of 16: d * (sc6 - 32) * (q2 - (hbit ? 0 : 4))
 *   Q4_K   {f16 d, dmin; u8 scales[12]; u8 qs[128]}       256 elems, 144 bytes
 *          8 groups of 32: d * sc6 * q4 - dmin * m6
 *   Q5_K   {f16 d, dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]} 256 elems, 176 bytes; q5 = q4 | hbit << 4
 *   Q6_K   {u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d}  256 elems, 210 bytes
 *          16 groups of 16: d * sc8 * (q6 - 32)
 *   Q8_K   {f32 d; i8 qs[256]; i16 bsums[16]}             256 elems, 292 bytes; d * q
 * The bit positions within a super-block are in quant_k.c beside each decoder
 * (ggml-quants.c's dequantize_row_* give the same order). */
#ifndef MS_MODEL_QUANT_K_H
#define MS_MODEL_QUANT_K_H

#include <stdint.h>

#include "megascope/model.h"

/* 1 for the types of this file. */
int ms_quant_k_handles(enum ms_dtype t);

/* Decodes one block (ms_dtype_block(t) elements) into out, with the float
 * operations in the order gguf-py's and ggml's dequantizers use (so the
 * values are the same bits). */
void ms_quant_k_block_f32(enum ms_dtype t, const uint8_t *b, float *out);

/* Quantizes one block of x into b (a simple per-group max/min rounding for the
 * K-quants and IQ4_NL; ggml's reference rounding for Q5_0 and Q5_1). */
void ms_quant_k_block(enum ms_dtype t, const float *x, uint8_t *b);

/* 32 elements [32 i, 32 i + 32) of a weight row as integers for the 8-bit dot:
 *   x[j] = d * sc[j / 16] * q[j] - dmin * mn[j / 16] + m
 * (sc, mn small integers; mn and dmin 0 for the types without K minimums, m
 * Q5_1's float minimum and 0 otherwise). */
struct ms_qk_piece {
  int8_t q[32];
  int16_t sc[2], mn[2];
  float d, dmin, m;
};
void ms_quant_k_piece(enum ms_dtype t, const uint8_t *row, int i, struct ms_qk_piece *p);
/* The integer scales and minimums of a K-quant super-block's 16 groups of 16
 * (the same per pair for Q4_K and Q5_K), with its d and dmin: the pieces'
 * sc, mn, d and dmin without a call per piece. */
struct ms_qk_scales {
  int16_t sc[16], mn[16];
  float d, dmin;
};
void ms_quant_k_scales(enum ms_dtype t, const uint8_t *b, struct ms_qk_scales *s);
/* The same without q (the AVX2 paths unpack q themselves). */
void ms_quant_k_piece_scales(enum ms_dtype t, const uint8_t *row, int i, struct ms_qk_piece *p);

#endif
