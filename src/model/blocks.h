/* SPDX-License-Identifier: MIT */
/* The block formats as the model writes and lays them out: the quantizers of
 * every ms_dtype (ggml's reference rounding; the K-quants', Q5's and IQ4_NL's
 * in quant_k.h) and the packed layout (ms_weight.packed) the CPU's AVX-512
 * and AVX2 8-bit GEMVs read (src/kernels/quant.c, which includes this header for the
 * layout's sizes). The model repacks its weights at load (ms_model_repack)
 * and quantizes them when it writes a GGUF file, so they are the model's dtype
 * code, below the kernels that read them. */
#ifndef MS_MODEL_BLOCKS_H
#define MS_MODEL_BLOCKS_H

#include <stddef.h>

#include "megascope/model.h"

/* The packed layout's sizes (below): quant bytes, scale bytes and high-bit
 * bytes per (group of four rows, block pair). */
#define PK_QB(t) ((t) == MS_DTYPE_Q8_0 ? 256 : 128)
#define PK_SB(t) ((t) == MS_DTYPE_Q4_1 || (t) == MS_DTYPE_Q5_1 ? 32 : 16)
#define PK_HB(t) ((t) == MS_DTYPE_Q5_0 || (t) == MS_DTYPE_Q5_1 ? 32 : 0)
/* The K-quants' (below): quant bytes and high-bit bytes per (group, pair),
 * scales per row per super-block (one a piece or one a half), scale-record
 * bytes per (group, super-block). */
#define KP_QB(t) ((t) == MS_DTYPE_Q2_K || (t) == MS_DTYPE_Q3_K ? 64 : 128)
#define KP_HB(t) ((t) == MS_DTYPE_Q3_K || (t) == MS_DTYPE_Q5_K ? 32 : (t) == MS_DTYPE_Q6_K ? 64 : 0)
#define KP_NS(t) ((t) == MS_DTYPE_Q4_K || (t) == MS_DTYPE_Q5_K ? 8 : 16)
#define KP_MINS(t) ((t) == MS_DTYPE_Q4_K || (t) == MS_DTYPE_Q5_K)  /* a second byte array of minimums */
#define KP_KMIN(t) ((t) == MS_DTYPE_Q2_K || (t) == MS_DTYPE_Q4_K || (t) == MS_DTYPE_Q5_K)
#define KP_SB(t) (4 * KP_NS(t) * (1 + KP_MINS(t)) + 8 * (1 + KP_KMIN(t)))
/* The signed K-quants' offset to unsigned bytes: u = q + K_OFF. */
#define K_OFF(t) ((t) == MS_DTYPE_Q3_K ? 4 : (t) == MS_DTYPE_Q6_K ? 32 : (t) == MS_DTYPE_Q8_K ? 128 : 0)

/* Quantizes n values (n a multiple of the type's block) into out, which holds
 * ms_dtype_row_bytes(t, n) bytes, with ggml's reference rounding; every
 * ms_dtype works (F32 copies, BF16/F16 round to nearest even). -EINVAL when n
 * is not a multiple of the block. */
int ms_quant_row(enum ms_dtype t, const float *x, int n, void *out);

/* ---- repacked weights (ms_weight.packed) ----
 * Q8_0, Q4_0, Q4_1, Q5_0 and Q5_1 with an even number of blocks a row, and the
 * K-quants Q2_K .. Q6_K (below), on a CPU
 * with AVX2 (the AVX-512 VNNI and AVX2 kernels read the same bytes, quant.c
 * says how): rows in groups of four (the last rows % 4 stay in data
 * alone), one stream feeding four output rows. For group g, its blocks four
 * at a time (a quad: block pairs p, p + 1 for even p) and a last pair (blocks
 * % 4 == 2), each unit with its lanes L = nk j + k (row j, the unit's block k,
 * nk = 4 or 2), in three regions one after the other, each a unit the size of
 * its pairs:
 *   quants   eight steps s, step s holding each lane's four values 4s .. 4s + 3:
 *            Q8_0 as value + 128 (the unsigned operand of vpdpbusd), 4 nk
 *            bytes a step; the others as their low nibbles, steps s and s + 4
 *            in the low and the high nibbles of step s's bytes (s < 4);
 *   scales   the 4 nk halves d by lane, then (Q4_1, Q5_1) the 4 nk m;
 *   (Q5) high bits: a 16 nk-bit word a step, bit 4L + e the fifth bit of
 *            lane L's value 4s + e.
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
/* Both forms hold w's whole groups [g0, g1) (ms_weight.packed_g0, packed_gn;
 * every one by default), group g at index g - g0 of each region. */
static inline void ms_quant_packed_groups(const struct ms_weight *w, int *g0, int *g1) {
  *g0 = w->packed_gn ? w->packed_g0 : 0;
  *g1 = w->packed_gn ? w->packed_g0 + w->packed_gn : w->rows / 4;
}
/* Writes w's packed form (ms_quant_packed_bytes(w) bytes, 64-byte aligned). */
void ms_quant_repack(const struct ms_weight *w, void *out);

#endif
