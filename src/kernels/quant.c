/* SPDX-License-Identifier: MIT */
/* Quantized and half-precision GEMV. See quant.h (the formats and the packed
 * layout they read: src/model/blocks.h, quant_k.h).
 *
 * Both paths walk a weight row block by block: the portable one expands a block
 * into 32 floats on the stack, the AVX2 one into four registers, and each batch
 * row then takes its dot product with that block. Accumulation is in f32, one
 * running sum per batch row in a fixed order, so results do not depend on how
 * the rows are tiled or which thread runs them. */
#include "kernels/quant.h"
#include "model/blocks.h"
#include "model/quant_k.h"

#include <errno.h>
#include <float.h>
#include <math.h>
#include <string.h>

#include "megascope/base.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define MS_X86 1
#endif

#define QK 32

static int have_f16c, have_vnni512;

#ifdef MS_X86
__attribute__((constructor)) static void quant_detect(void) {
  have_f16c = ms_cpu_level() >= MS_CPU_AVX2;
  have_vnni512 = ms_cpu_level() >= MS_CPU_AVX512_VNNI;
}
#endif

int ms_q8_simd_level(void) { return have_vnni512 ? 2 : have_f16c ? 1 : 0; }

int ms_quant_handles(enum ms_dtype t) {
  return t == MS_DTYPE_F16 || t == MS_DTYPE_Q8_0 || t == MS_DTYPE_Q4_0 || t == MS_DTYPE_Q4_1 ||
         ms_quant_k_handles(t);
}

static inline uint16_t rd16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }

/* The packed paths' split of rows [r0, r1): the whole groups [*g0, *g1) that
 * w's packed form holds (*g1 <= *g0: none) come from it, the rows before and
 * after them from data, the same bits either way. *p0 and *pn: the groups
 * the packed form holds (every whole one, or a rank's: ms_weight.packed_g0),
 * for its regions' offsets. */
static inline void pk_groups(const struct ms_weight *w, int r0, int r1, int *g0, int *g1, int *p0, int *pn) {
  int p1;
  ms_quant_packed_groups(w, p0, &p1);
  *pn = p1 - *p0;
  *g0 = (r0 + 3) / 4 > *p0 ? (r0 + 3) / 4 : *p0;
  *g1 = r1 / 4 < p1 ? r1 / 4 : p1;
}

/* ---- portable ---- */

/* Expands block `blk` of a row into 32 floats. */
static void block_decode(enum ms_dtype t, const uint8_t *b, float *out) {
  float d = ms_f16_to_f32(rd16(b));
  switch (t) {
  case MS_DTYPE_Q8_0:
    for (int j = 0; j < QK; j++) out[j] = d * (float)(int8_t)b[2 + j];
    break;
  case MS_DTYPE_Q4_0:
    for (int j = 0; j < QK / 2; j++) {
      out[j] = d * (float)((b[2 + j] & 0xf) - 8);
      out[j + QK / 2] = d * (float)((b[2 + j] >> 4) - 8);
    }
    break;
  case MS_DTYPE_Q4_1: {
    float m = ms_f16_to_f32(rd16(b + 2));
    for (int j = 0; j < QK / 2; j++) {
      out[j] = d * (float)(b[4 + j] & 0xf) + m;
      out[j + QK / 2] = d * (float)(b[4 + j] >> 4) + m;
    }
    break;
  }
  default:
    break;
  }
}

/* The formats of quant_k.c: each block (32 or 256 elements) decoded by the
 * reference decoder into floats, then the dot in element order. */
static void gemv_k_portable(const struct ms_weight *w, int r0, int r1, const float *x, int ldx, int nb,
                            float *y, int ldy) {
  size_t rb = ms_weight_row_bytes(w), bs = ms_dtype_size(w->dtype);
  int n = w->cols, blk = ms_dtype_block(w->dtype);
  float f[256];
  for (int r = r0; r < r1; r++) {
    const uint8_t *row = (const uint8_t *)w->data + (size_t)r * rb;
    for (int b = 0; b < nb; b++) {
      const float *xb = x + (size_t)b * ldx;
      float s = 0.0f;
      for (int c = 0; c < n; c += blk) {
        ms_quant_k_block_f32(w->dtype, row + (size_t)(c / blk) * bs, f);
        for (int j = 0; j < blk; j++) s += f[j] * xb[c + j];
      }
      y[(size_t)b * ldy + (r - r0)] = s;
    }
  }
}

static void gemv_portable(const struct ms_weight *w, int r0, int r1, const float *x, int ldx, int nb,
                          float *y, int ldy) {
  if (ms_quant_k_handles(w->dtype)) {
    gemv_k_portable(w, r0, r1, x, ldx, nb, y, ldy);
    return;
  }
  size_t rb = ms_weight_row_bytes(w), bs = ms_dtype_size(w->dtype);
  int n = w->cols;
  for (int r = r0; r < r1; r++) {
    const uint8_t *row = (const uint8_t *)w->data + (size_t)r * rb;
    for (int b = 0; b < nb; b++) {
      const float *xb = x + (size_t)b * ldx;
      float s = 0.0f;
      if (w->dtype == MS_DTYPE_F16) {
        for (int c = 0; c < n; c++) s += ms_f16_to_f32(rd16(row + 2 * (size_t)c)) * xb[c];
      } else {
        float blk[QK];
        for (int c = 0; c < n; c += QK) {
          block_decode(w->dtype, row + (size_t)(c / QK) * bs, blk);
          for (int j = 0; j < QK; j++) s += blk[j] * xb[c + j];
        }
      }
      y[(size_t)b * ldy + (r - r0)] = s;
    }
  }
}

/* ---- AVX2 / FMA / F16C ---- */
#ifdef MS_X86
#define TGT __attribute__((target("avx2,fma,f16c")))
#define STAGE_MAX 8192  /* longest row staged for batches over four (32 KiB) */
/* Batch 1 reads each weight row once, a stream the hardware prefetchers alone
 * do not keep up with, so the kernels prefetch it in two levels: Q8_NEAR
 * bytes ahead of the block in hand into L1 and Q8_FAR bytes ahead into the
 * outer caches, which holds more lines in flight than L1's fill buffers
 * allow. One level at 4096 bytes (the choice before) reached 0.81-0.90 of a
 * 16-stream read of the same 96 MB on an Intel Xeon (SmolLM2's matrices and
 * tasks, a harness alternating the two, 2026-12-07), 2048 near and 8192 far
 * 0.92-0.98; 1024 and 8192 0.90-0.94, 1024 and 4096 0.87-0.89. Earlier, one
 * level on an AMD EPYC (Zen 5): 2048 bytes a median of 157 tokens/s, 4096
 * 176. -DQ8_NEAR=N -DQ8_FAR=N to try. */
#ifndef Q8_NEAR
#define Q8_NEAR 2048
#endif
#ifndef Q8_FAR
#define Q8_FAR 8192
#endif

/* Prefetches a stream's line at p in both levels, each `num / den` of the
 * quants' distance ahead (a region read at that rate of the quants'). */
#define Q8_PF(p, num, den)                                                                     \
  do {                                                                                         \
    _mm_prefetch((const char *)(p) + (size_t)Q8_NEAR * (num) / (den), _MM_HINT_T0);            \
    _mm_prefetch((const char *)(p) + (size_t)Q8_FAR * (num) / (den), _MM_HINT_T2);             \
  } while (0)

TGT static inline float hsum(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_add_ps(lo, hi);
  lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
  return _mm_cvtss_f32(lo);
}

TGT static inline float h2f(const uint8_t *p) { return _cvtsh_ss(rd16(p)); }

/* Q5_0 / Q5_1's quants as 32 bytes in element order, 0..31: the nibbles as
 * for Q4 (low ones elements 0-15), the fifth bits of qh spread to one a byte
 * (ggml's bytes_from_bits_32: byte j of the word broadcast to bytes 8j..8j+7,
 * every bit but one set, compared with all ones). */
TGT static inline __m256i q5_bytes(const uint8_t *qh, const uint8_t *qs) {
  uint32_t h;
  memcpy(&h, qh, 4);
  const __m256i spread = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0);
  __m256i bits = _mm256_or_si256(_mm256_shuffle_epi8(_mm256_set1_epi32((int)h), spread),
                                 _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe));
  __m256i hi = _mm256_and_si256(_mm256_cmpeq_epi8(bits, _mm256_set1_epi64x(-1)), _mm256_set1_epi8(0x10));
  __m256i q = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)qs));
  q = _mm256_and_si256(_mm256_srlv_epi64(q, _mm256_setr_epi64x(0, 0, 4, 4)), _mm256_set1_epi8(0x0f));
  return _mm256_or_si256(q, hi);
}

/* IQ4_NL's 32 values (signed bytes) in element order: the nibbles looked up in the table. */
TGT static inline __m256i iq4nl_bytes(const uint8_t *qs) {
  const __m256i kv = _mm256_setr_epi8(-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
                                      -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113);
  __m256i q = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)qs));
  q = _mm256_and_si256(_mm256_srlv_epi64(q, _mm256_setr_epi64x(0, 0, 4, 4)), _mm256_set1_epi8(0x0f));
  return _mm256_shuffle_epi8(kv, q);
}

/* The 32-element types of quant_k.c as signed bytes (Q5_0's offset applied). */
TGT static inline __m256i q5nl_bytes(enum ms_dtype t, const uint8_t *b) {
  if (t == MS_DTYPE_IQ4_NL) return iq4nl_bytes(b + 2);
  if (t == MS_DTYPE_Q5_1) return q5_bytes(b + 4, b + 8);
  return _mm256_sub_epi8(q5_bytes(b + 2, b + 6), _mm256_set1_epi8(16));
}

/* Block b of the row into w[0..3] (elements 0-7, 8-15, 16-23, 24-31). */
TGT static inline void block_regs(enum ms_dtype t, const uint8_t *b, __m256 *w) {
  __m256 d = _mm256_set1_ps(h2f(b));
  if (t == MS_DTYPE_Q5_0 || t == MS_DTYPE_Q5_1 || t == MS_DTYPE_IQ4_NL) {
    __m256i q = q5nl_bytes(t, b);
    __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
    __m256 f[4] = {_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo)),
                   _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8))),
                   _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi)),
                   _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8)))};
    __m256 m = _mm256_set1_ps(t == MS_DTYPE_Q5_1 ? h2f(b + 2) : 0.0f);  /* d q exact: fma rounds as d q + m */
    for (int k = 0; k < 4; k++) w[k] = _mm256_fmadd_ps(f[k], d, m);
    return;
  }
  if (t == MS_DTYPE_Q8_0) {
    __m256i q = _mm256_loadu_si256((const __m256i *)(b + 2));
    __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
    w[0] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo)));
    w[1] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8))));
    w[2] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi)));
    w[3] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8))));
    return;
  }
  int q41 = t == MS_DTYPE_Q4_1;
  __m128i qs = _mm_loadu_si128((const __m128i *)(b + (q41 ? 4 : 2)));
  __m128i mask = _mm_set1_epi8(0x0f);
  __m128i lo = _mm_and_si128(qs, mask), hi = _mm_and_si128(_mm_srli_epi16(qs, 4), mask);
  __m256 f0 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(lo));
  __m256 f1 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8)));
  __m256 f2 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(hi));
  __m256 f3 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8)));
  /* Q4_0: d * (q - 8) = d * q + (-8 d); Q4_1: d * q + m */
  __m256 m = q41 ? _mm256_set1_ps(h2f(b + 2)) : _mm256_mul_ps(d, _mm256_set1_ps(-8.0f));
  w[0] = _mm256_fmadd_ps(f0, d, m);
  w[1] = _mm256_fmadd_ps(f1, d, m);
  w[2] = _mm256_fmadd_ps(f2, d, m);
  w[3] = _mm256_fmadd_ps(f3, d, m);
}

/* Each (weight row, batch row) pair accumulates in two registers, the even and
 * the odd 8-lane groups of every block, added at the end: two dependency chains
 * instead of one, and the same order whatever is computed alongside, so a
 * row's result does not depend on the batch size or on the row grouping. */
TGT static inline void dot32(const __m256 *w, const float *x, __m256 *e, __m256 *o) {
  *e = _mm256_fmadd_ps(w[0], _mm256_loadu_ps(x), *e);
  *o = _mm256_fmadd_ps(w[1], _mm256_loadu_ps(x + 8), *o);
  *e = _mm256_fmadd_ps(w[2], _mm256_loadu_ps(x + 16), *e);
  *o = _mm256_fmadd_ps(w[3], _mm256_loadu_ps(x + 24), *o);
}

/* One block-format row against up to four batch rows: each block is expanded
 * once and used from registers for every batch row. */
TGT static void row_blocks_x4(enum ms_dtype t, const uint8_t *row, int n, size_t bs, const float *x,
                              int ldx, int nb, float *out) {
  __m256 e0 = _mm256_setzero_ps(), e1 = e0, e2 = e0, e3 = e0, o0 = e0, o1 = e0, o2 = e0, o3 = e0, w[4];
  for (int c = 0; c < n; c += QK, row += bs) {
    block_regs(t, row, w);
    dot32(w, x + c, &e0, &o0);
    if (nb > 1) dot32(w, x + ldx + c, &e1, &o1);
    if (nb > 2) dot32(w, x + 2 * (size_t)ldx + c, &e2, &o2);
    if (nb > 3) dot32(w, x + 3 * (size_t)ldx + c, &e3, &o3);
  }
  out[0] = hsum(_mm256_add_ps(e0, o0)), out[1] = hsum(_mm256_add_ps(e1, o1));
  out[2] = hsum(_mm256_add_ps(e2, o2)), out[3] = hsum(_mm256_add_ps(e3, o3));
}

/* Batches over four rows: the row is expanded once into `wrow` (in L1, never a
 * copy of the matrix) and each group of four batch rows reads it from there,
 * with the same two accumulators per pair, so the sums match row_blocks_x4. */
TGT static void stage_row(enum ms_dtype t, const uint8_t *row, int n, size_t bs, float *wrow) {
  __m256 w[4];
  for (int c = 0; c < n; c += QK, row += bs) {
    block_regs(t, row, w);
    for (int k = 0; k < 4; k++) _mm256_store_ps(wrow + c + 8 * k, w[k]);
  }
}

TGT static void staged_x4(const float *wrow, int n, const float *x, int ldx, int nb, float *out) {
  __m256 e0 = _mm256_setzero_ps(), e1 = e0, e2 = e0, e3 = e0, o0 = e0, o1 = e0, o2 = e0, o3 = e0, w[4];
  for (int c = 0; c < n; c += QK) {
    for (int k = 0; k < 4; k++) w[k] = _mm256_load_ps(wrow + c + 8 * k);
    dot32(w, x + c, &e0, &o0);
    if (nb > 1) dot32(w, x + ldx + c, &e1, &o1);
    if (nb > 2) dot32(w, x + 2 * (size_t)ldx + c, &e2, &o2);
    if (nb > 3) dot32(w, x + 3 * (size_t)ldx + c, &e3, &o3);
  }
  out[0] = hsum(_mm256_add_ps(e0, o0)), out[1] = hsum(_mm256_add_ps(e1, o1));
  out[2] = hsum(_mm256_add_ps(e2, o2)), out[3] = hsum(_mm256_add_ps(e3, o3));
}

/* Batch 1: two weight rows at once, for four independent chains. */
TGT static void rows2_blocks_x1(enum ms_dtype t, const uint8_t *ra, const uint8_t *rb, int n, size_t bs,
                                const float *x, float *out_a, float *out_b) {
  __m256 ea = _mm256_setzero_ps(), oa = ea, eb = ea, ob = ea, wa[4], wb[4];
  for (int c = 0; c < n; c += QK, ra += bs, rb += bs) {
    block_regs(t, ra, wa);
    block_regs(t, rb, wb);
    dot32(wa, x + c, &ea, &oa);
    dot32(wb, x + c, &eb, &ob);
  }
  *out_a = hsum(_mm256_add_ps(ea, oa));
  *out_b = hsum(_mm256_add_ps(eb, ob));
}

TGT static void row_f16_x4(const uint8_t *row, int n, const float *x, int ldx, int nb, float *out) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  int n8 = n & ~7;
  for (int c = 0; c < n8; c += 8) {
    __m256 wv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(row + 2 * (size_t)c)));
    a0 = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + c), a0);
    if (nb > 1) a1 = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + ldx + c), a1);
    if (nb > 2) a2 = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + 2 * (size_t)ldx + c), a2);
    if (nb > 3) a3 = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + 3 * (size_t)ldx + c), a3);
  }
  out[0] = hsum(a0), out[1] = hsum(a1), out[2] = hsum(a2), out[3] = hsum(a3);
  for (int c = n8; c < n; c++) {
    float wc = h2f(row + 2 * (size_t)c);
    for (int b = 0; b < nb; b++) out[b] += wc * x[(size_t)b * ldx + c];
  }
}

/* Group s (32 elements) of a K-quant super-block as 32 bytes in element
 * order: the formulas of quant_k.c with 16-bit shifts (the masks keep only
 * bits of the byte itself); signed for Q3_K, Q6_K and Q8_K. */
TGT static inline __m256i kq_bytes(enum ms_dtype t, const uint8_t *b, int s) {
#define LD(p) _mm256_loadu_si256((const __m256i *)(p))
#define SRL(v, k, mask) _mm256_and_si256(_mm256_srl_epi16(v, _mm_cvtsi32_si128(k)), _mm256_set1_epi8(mask))
  switch (t) {
  case MS_DTYPE_Q2_K: return SRL(LD(b + 16 + 32 * (s / 4)), 2 * (s % 4), 3);
  case MS_DTYPE_Q3_K: {
    __m256i q = SRL(LD(b + 32 + 32 * (s / 4)), 2 * (s % 4), 3), hb = SRL(LD(b), s, 1);
    return _mm256_sub_epi8(q, _mm256_and_si256(_mm256_cmpeq_epi8(hb, _mm256_setzero_si256()), _mm256_set1_epi8(4)));
  }
  case MS_DTYPE_Q4_K: return SRL(LD(b + 16 + 32 * (s / 2)), 4 * (s & 1), 15);
  case MS_DTYPE_Q5_K: {
    __m256i q = SRL(LD(b + 48 + 32 * (s / 2)), 4 * (s & 1), 15), hb = SRL(LD(b + 16), s, 1);
    return _mm256_or_si256(q, _mm256_slli_epi16(hb, 4));
  }
  case MS_DTYPE_Q6_K: {
    int h = s / 4, g = s % 4;
    __m256i lo = SRL(LD(b + 64 * h + 32 * (g & 1)), 4 * (g >> 1), 15), hi = SRL(LD(b + 128 + 32 * h), 2 * g, 3);
    return _mm256_sub_epi8(_mm256_or_si256(lo, _mm256_slli_epi16(hi, 4)), _mm256_set1_epi8(32));
  }
  default: return LD(b + 4 + 32 * s);  /* Q8_K */
  }
#undef LD
#undef SRL
}

/* The K-quants: each group of 32 expanded into four registers (the scales
 * and minimums as ms_quant_k_piece_scales gives them; d sc q is exact, so
 * fmsub rounds as the reference's d sc q - dmin m) and used from there for
 * up to four batch rows, with the even/odd accumulators of row_blocks_x4, so
 * every pair's sum is the same whatever the batch or the row range. */
TGT static void gemv_k_avx2(const struct ms_weight *w, int r0, int r1, const float *x, int ldx, int nb,
                            float *y, int ldy) {
  size_t rb = ms_weight_row_bytes(w), bs = ms_dtype_size(w->dtype);
  enum ms_dtype t = w->dtype;
  struct ms_qk_scales ks;
  for (int r = r0; r < r1; r++) {
    const uint8_t *row = (const uint8_t *)w->data + (size_t)r * rb;
    for (int b0 = 0; b0 < nb; b0 += 4) {
      int n = nb - b0 < 4 ? nb - b0 : 4;
      const float *xb = x + (size_t)b0 * ldx;
      __m256 e0 = _mm256_setzero_ps(), e1 = e0, e2 = e0, e3 = e0, o0 = e0, o1 = e0, o2 = e0, o3 = e0, v[4];
      for (int i = 0, c = 0; c < w->cols; i++, c += QK) {
        const uint8_t *sb = row + (size_t)(i / 8) * bs;
        if (i % 8 == 0) ms_quant_k_scales(t, sb, &ks);
        __m256i q = kq_bytes(t, sb, i % 8);
        __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
        __m256 f[4] = {_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo)),
                       _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8))),
                       _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi)),
                       _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8)))};
        for (int k = 0; k < 4; k++) {
          int g = 2 * (i % 8) + k / 2;
          __m256 dl = _mm256_set1_ps(ks.d * (float)ks.sc[g]), ml = _mm256_set1_ps(ks.dmin * (float)ks.mn[g]);
          v[k] = _mm256_fmsub_ps(f[k], dl, ml);
        }
        dot32(v, xb + c, &e0, &o0);
        if (n > 1) dot32(v, xb + ldx + c, &e1, &o1);
        if (n > 2) dot32(v, xb + 2 * (size_t)ldx + c, &e2, &o2);
        if (n > 3) dot32(v, xb + 3 * (size_t)ldx + c, &e3, &o3);
      }
      float out[4] = {hsum(_mm256_add_ps(e0, o0)), hsum(_mm256_add_ps(e1, o1)), hsum(_mm256_add_ps(e2, o2)),
                      hsum(_mm256_add_ps(e3, o3))};
      for (int b = 0; b < n; b++) y[(size_t)(b0 + b) * ldy + (r - r0)] = out[b];
    }
  }
}

TGT static void gemv_avx2(const struct ms_weight *w, int r0, int r1, const float *x, int ldx, int nb,
                          float *y, int ldy) {
  if (ms_quant_k_handles(w->dtype) && ms_dtype_block(w->dtype) != QK) {
    gemv_k_avx2(w, r0, r1, x, ldx, nb, y, ldy);
    return;
  }
  size_t rb = ms_weight_row_bytes(w), bs = ms_dtype_size(w->dtype);
  int r = r0;
  if (nb > 4 && w->dtype != MS_DTYPE_F16 && w->cols <= STAGE_MAX) {
    float wrow[STAGE_MAX] __attribute__((aligned(32)));
    for (; r < r1; r++) {
      stage_row(w->dtype, (const uint8_t *)w->data + (size_t)r * rb, w->cols, bs, wrow);
      for (int b0 = 0; b0 < nb; b0 += 4) {
        int n = nb - b0 < 4 ? nb - b0 : 4;
        float out[4];
        staged_x4(wrow, w->cols, x + (size_t)b0 * ldx, ldx, n, out);
        for (int b = 0; b < n; b++) y[(size_t)(b0 + b) * ldy + (r - r0)] = out[b];
      }
    }
    return;
  }
  if (nb == 1 && w->dtype != MS_DTYPE_F16)
    for (; r + 1 < r1; r += 2) {
      const uint8_t *row = (const uint8_t *)w->data + (size_t)r * rb;
      rows2_blocks_x1(w->dtype, row, row + rb, w->cols, bs, x, &y[r - r0], &y[r + 1 - r0]);
    }
  for (; r < r1; r++) {
    const uint8_t *row = (const uint8_t *)w->data + (size_t)r * rb;
    for (int b0 = 0; b0 < nb; b0 += 4) {
      int n = nb - b0 < 4 ? nb - b0 : 4;
      float out[4];
      const float *xb = x + (size_t)b0 * ldx;
      if (w->dtype == MS_DTYPE_F16)
        row_f16_x4(row, w->cols, xb, ldx, n, out);
      else
        row_blocks_x4(w->dtype, row, w->cols, bs, xb, ldx, n, out);
      for (int b = 0; b < n; b++) y[(size_t)(b0 + b) * ldy + (r - r0)] = out[b];
    }
  }
}
#endif

void ms_quant_gemv(const struct ms_weight *w, int r0, int r1, const float *x, int ldx, int nb, float *y,
                   int ldy, int simd) {
#ifdef MS_X86
  if (simd && have_f16c) {
    gemv_avx2(w, r0, r1, x, ldx, nb, y, ldy);
    return;
  }
#endif
  gemv_portable(w, r0, r1, x, ldx, nb, y, ldy);
}

/* ---- 8-bit activations ----
 *
 * The 32-element types (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL) take one order
 * on every path. Block i's 32 products are summed in int32 first,
 *   isum_i = sum_j w_ij q_ij      (exact: |isum| <= 32 * 128 * 127 < 2^24,
 *                                  so its conversion is exact too),
 * then each (weight row, input row) pair keeps four f32 chains, block i in
 * chain c = i mod 4,
 *   acc_c = fma(d_w * d_x, (float)isum_i, acc_c)
 *   min_c = fma(m_w, s_x, min_c)                   (Q4_1, Q5_1)
 * and y = (acc_0 + acc_1) + (acc_2 + acc_3) [+ ((min_0 + min_1) + (min_2 + min_3))].
 * One float step per 32 products: the float pipes, which every 4 products
 * took before, no longer bound the tile (docs/performance.md, "The 32-element
 * tile's float steps"). Four chains because the AVX-512 packed form puts four
 * blocks of four rows in a vector (lane 4j + k: row j, block 4Q + k), and the
 * AVX2 path sums four blocks' lanes in one transposing add. The paths reach
 * the same integers any way they like (AVX2 multiplies |w| by q carrying w's
 * sign; AVX-512 VNNI takes u = w + Q8_OFF and subtracts Q8_OFF times the
 * block's sum of q) and then take these float operations: the same bits.
 * The K-quants take inputs quantized per 256 and sum a super-block as
 * integers first (q8_k_gemv_portable). */

size_t ms_q8_act_bytes(int n, int nb) {
  return (size_t)nb * (2 * (size_t)n + 2 * sizeof(float) * (size_t)(n / QK) + sizeof(int16_t) * (size_t)(n / 16));
}

int ms_q8_qk(enum ms_dtype t) { return ms_quant_k_handles(t) && ms_dtype_block(t) == 256 ? 256 : QK; }

int ms_q8_handles(enum ms_dtype t) {
  return t == MS_DTYPE_Q8_0 || t == MS_DTYPE_Q4_0 || t == MS_DTYPE_Q4_1 || ms_quant_k_handles(t);
}

/* Inverse scale of a block whose largest magnitude is amax, and its scale in *d;
 * 0 and 0 for a block of zeros or one too small to scale (amax < 127 / FLT_MAX). */
static inline float q8_inv(float amax, float *d) {
  float id = amax > 0.0f ? 127.0f / amax : 0.0f;
  if (!(id <= FLT_MAX)) id = 0.0f;
  *d = id != 0.0f ? amax / 127.0f : 0.0f;
  return id;
}

/* One row in blocks of qk (32 or 256): d per block, bs per 16, s per 32 (qk 32). */
static void q8_row_portable(const float *x, int n, int qk, int8_t *q, float *d, float *s, int16_t *bs) {
  for (int i = 0; i < n / qk; i++, x += qk, q += qk) {
    float amax = 0.0f;
    for (int j = 0; j < qk; j++) amax = fmaxf(amax, fabsf(x[j]));
    float id = q8_inv(amax, &d[i]);
    for (int h = 0; h < qk / 16; h++) {
      int sum = 0;
      for (int j = 16 * h; j < 16 * h + 16; j++) {
        float v = rintf(x[j] * id);  /* the default rounding: to nearest, ties to even */
        int qi = fabsf(v) <= 127.0f ? (int)v : 0;
        q[j] = (int8_t)qi;
        sum += qi;
      }
      bs[i * (qk / 16) + h] = (int16_t)sum;
    }
    if (qk == QK) s[i] = d[i] * (float)(bs[2 * i] + bs[2 * i + 1]);
  }
}

/* Block b of a weight row as 32 signed integers (Q4_0's offset applied); its
 * scale is returned and Q4_1's minimum stored in *m. */
static float q8_wblock(enum ms_dtype t, const uint8_t *b, int8_t *w, float *m) {
  switch (t) {
  case MS_DTYPE_Q8_0:
    memcpy(w, b + 2, QK);
    break;
  case MS_DTYPE_Q4_0:
  case MS_DTYPE_Q4_1: {
    int q41 = t == MS_DTYPE_Q4_1, off = q41 ? 0 : 8;
    const uint8_t *qs = b + (q41 ? 4 : 2);
    for (int j = 0; j < QK / 2; j++) {
      w[j] = (int8_t)((qs[j] & 0xf) - off);
      w[j + QK / 2] = (int8_t)((qs[j] >> 4) - off);
    }
    *m = q41 ? ms_f16_to_f32(rd16(b + 2)) : 0.0f;
    break;
  }
  default:
    break;
  }
  return ms_f16_to_f32(rd16(b));
}

/* Block i of a 32-element row as 32 signed integers, its scale returned and
 * (Q4_1, Q5_1) its minimum in *m. */
static float q8_block32(enum ms_dtype t, const uint8_t *row, size_t bs, int i, int8_t *w, float *m) {
  if (!ms_quant_k_handles(t)) return q8_wblock(t, row + (size_t)i * bs, w, m);
  struct ms_qk_piece p;
  ms_quant_k_piece(t, row, i, &p);  /* sc is 1 for the 32-element types */
  memcpy(w, p.q, QK);
  *m = p.m;
  return p.d;
}

/* The order of the section's comment, one product at a time. */
static void q8_32_gemv_portable(const struct ms_weight *w, int r0, int r1, const struct ms_q8_act *a, float *y,
                                int ldy) {
  size_t rb = ms_weight_row_bytes(w), bs = ms_dtype_size(w->dtype);
  int nblk = w->cols / QK, hasm = w->dtype == MS_DTYPE_Q4_1 || w->dtype == MS_DTYPE_Q5_1;
  for (int r = r0; r < r1; r++) {
    const uint8_t *row = (const uint8_t *)w->data + (size_t)r * rb;
    for (int b = 0; b < a->nb; b++) {
      const int8_t *q = a->q + (size_t)b * (size_t)a->n;
      const float *dx = a->d + (size_t)b * (size_t)nblk, *sx = a->s + (size_t)b * (size_t)nblk;
      float acc[4] = {0}, mins[4] = {0};
      for (int i = 0; i < nblk; i++, q += QK) {
        int8_t wq[QK];
        float m = 0.0f, sc = q8_block32(w->dtype, row, bs, i, wq, &m) * dx[i];
        int32_t isum = 0;
        for (int j = 0; j < QK; j++) isum += wq[j] * q[j];
        acc[i & 3] = fmaf(sc, (float)isum, acc[i & 3]);
        if (hasm) mins[i & 3] = fmaf(m, sx[i], mins[i & 3]);
      }
      float v = (acc[0] + acc[1]) + (acc[2] + acc[3]);
      y[(size_t)b * ldy + (r - r0)] = hasm ? v + ((mins[0] + mins[1]) + (mins[2] + mins[3])) : v;
    }
  }
}

/* The K-quants (256-element super-blocks) against activations quantized per
 * 256 (qk 256: one d_x a super-block, bs per 16), as ggml's q8_K dots do. In
 * super-block s, with the weights' integer q, sub-block scales sc[h] and
 * minimums mn[h] for its 16 groups of 16 (ms_quant_k_scales; the K minimums'
 * term takes the input's group sums bs[h] instead of the values):
 *   isum = sum_h sc[h] * sum_{j in h} q_w[j] q_x[j]        (int32, exact)
 *   msum = sum_h mn[h] * bs[h]                             (int32, exact)
 *   acc  = fma(d_w d_x, (float)isum, acc)
 *   acc  = fma(-(dmin_w d_x), (float)msum, acc)            (Q2_K, Q4_K, Q5_K)
 * and y = acc after the last super-block: one chain, two roundings per 256
 * values (the conversions of isum and msum are exact below 2^24; above, they
 * round to nearest on every path alike). |isum| <= 256 * 32 * 128 * 127 (Q6_K)
 * < 2^31. Every path computes the same two integers any way it likes (the
 * signed types' offsets, the lanes' order) and then these float operations. */
static int k_has_mins(enum ms_dtype t) { return t == MS_DTYPE_Q2_K || t == MS_DTYPE_Q4_K || t == MS_DTYPE_Q5_K; }

static void q8_k_gemv_portable(const struct ms_weight *w, int r0, int r1, const struct ms_q8_act *a, float *y,
                               int ldy) {
  size_t rb = ms_weight_row_bytes(w), sbytes = ms_dtype_size(w->dtype);
  int nsb = w->cols / 256, kmin = k_has_mins(w->dtype);
  struct ms_qk_piece p;
  struct ms_qk_scales ks;
  for (int r = r0; r < r1; r++) {
    const uint8_t *row = (const uint8_t *)w->data + (size_t)r * rb;
    for (int b = 0; b < a->nb; b++) {
      const int8_t *q = a->q + (size_t)b * (size_t)a->n;
      const float *dx = a->d + (size_t)b * (size_t)nsb;
      const int16_t *bs = a->bs + (size_t)b * 16 * (size_t)nsb;
      float acc = 0.0f;
      for (int sb = 0; sb < nsb; sb++, bs += 16) {
        ms_quant_k_scales(w->dtype, row + (size_t)sb * sbytes, &ks);
        int32_t isum = 0, msum = 0;
        for (int i = 0; i < 8; i++, q += QK) {
          ms_quant_k_piece(w->dtype, row, 8 * sb + i, &p);
          for (int h = 0; h < 2; h++) {
            int32_t dot = 0;
            for (int j = 16 * h; j < 16 * h + 16; j++) dot += p.q[j] * q[j];
            isum += ks.sc[2 * i + h] * dot;
          }
        }
        for (int h = 0; h < 16; h++) msum += ks.mn[h] * bs[h];
        acc = fmaf(ks.d * dx[sb], (float)isum, acc);
        if (kmin) acc = fmaf(-(ks.dmin * dx[sb]), (float)msum, acc);
      }
      y[(size_t)b * ldy + (r - r0)] = acc;
    }
  }
}

static void q8_gemv_portable(const struct ms_weight *w, int r0, int r1, const struct ms_q8_act *a, float *y,
                             int ldy) {
  if (a->qk == 256)
    q8_k_gemv_portable(w, r0, r1, a, y, ldy);
  else
    q8_32_gemv_portable(w, r0, r1, a, y, ldy);
}

#ifdef MS_X86
#define TGT_INL TGT static inline __attribute__((always_inline))
/* The 32-element types with a float minimum (Q4_1, Q5_1): unsigned quants, m * s_x per block.
 * Q5_0, Q5_1 and IQ4_NL take these loops too; their sums are q8_k32_gemv_portable's. */
#define Q8_HAS_M(t) ((t) == MS_DTYPE_Q4_1 || (t) == MS_DTYPE_Q5_1)

TGT static inline int hsum_i32(__m256i v) {
  __m128i x = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  x = _mm_add_epi32(x, _mm_shuffle_epi32(x, 0x4e));
  x = _mm_add_epi32(x, _mm_shuffle_epi32(x, 0xb1));
  return _mm_cvtsi128_si32(x);
}

/* The same roundings as q8_row_portable: the largest magnitude is exact in any
 * order, the product and the rounding to nearest even are IEEE operations. */
TGT static void q8_row_avx2(const float *x, int n, int qk, int8_t *q, float *d, float *s, int16_t *bs) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  const __m256i perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (int i = 0; i < n / qk; i++) {
    __m256 mx = _mm256_setzero_ps();
    for (int j = 0; j < qk; j += 8) mx = _mm256_max_ps(mx, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + j)));
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    __m256 id = _mm256_set1_ps(q8_inv(_mm_cvtss_f32(h), &d[i]));
    for (int k = 0; k < qk / QK; k++, x += QK, q += QK, bs += 2) {
      __m256 v0 = _mm256_loadu_ps(x), v1 = _mm256_loadu_ps(x + 8);
      __m256 v2 = _mm256_loadu_ps(x + 16), v3 = _mm256_loadu_ps(x + 24);
#define Q8_RN(v) _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v, id), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC))
      __m256i i0 = Q8_RN(v0), i1 = Q8_RN(v1), i2 = Q8_RN(v2), i3 = Q8_RN(v3);
#undef Q8_RN
      /* packs interleave the 128-bit lanes; the permutation puts the bytes back in order */
      __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3));
      _mm256_store_si256((__m256i *)q, _mm256_permutevar8x32_epi32(p, perm));
      bs[0] = (int16_t)hsum_i32(_mm256_add_epi32(i0, i1)), bs[1] = (int16_t)hsum_i32(_mm256_add_epi32(i2, i3));
      if (qk == QK) s[i] = d[i] * (float)(bs[0] + bs[1]);
    }
  }
}

/* Block b of a weight row as 32 bytes in element order: signed for Q8_0 and
 * Q4_0 (offset applied), unsigned nibbles for Q4_1. */
TGT_INL __m256i q8_wregs(enum ms_dtype t, const uint8_t *b) {
  if (t == MS_DTYPE_Q8_0) return _mm256_loadu_si256((const __m256i *)(b + 2));
  if (t == MS_DTYPE_Q5_0 || t == MS_DTYPE_Q5_1 || t == MS_DTYPE_IQ4_NL) return q5nl_bytes(t, b);
  /* the 16 bytes in both halves, the upper half shifted by a nibble, then masked */
  __m256i qs = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(b + (t == MS_DTYPE_Q4_1 ? 4 : 2))));
  __m256i v = _mm256_and_si256(_mm256_srlv_epi64(qs, _mm256_setr_epi64x(0, 0, 4, 4)), _mm256_set1_epi8(0x0f));
  return t == MS_DTYPE_Q4_0 ? _mm256_sub_epi8(v, _mm256_set1_epi8(8)) : v;
}

/* The sums of v[0..3]'s lanes, in that order. */
TGT_INL __m128i a_hsum4(const __m256i *v) {
  __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
  return _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
}

/* The eight int32 lanes of a block's w . q (lane k: elements 4k .. 4k + 3);
 * wa: |w| for the signed types, w for the unsigned ones (Q4_1, Q5_1). */
TGT_INL __m256i q8_lanes(enum ms_dtype t, __m256i w, __m256i wa, __m256i q) {
  __m256i p = Q8_HAS_M(t) ? _mm256_maddubs_epi16(wa, q) : _mm256_maddubs_epi16(wa, _mm256_sign_epi8(q, w));
  return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
}

/* The scales d (and Q4_1's, Q5_1's minimums m) of the first nk of four blocks
 * bs bytes apart, 0 past nk, gathered in registers (four scalar stores and a
 * vector load of them would stall on store forwarding). */
TGT_INL void q8_scales4(enum ms_dtype t, const uint8_t *blk, size_t bs, int nk, __m128 *d, __m128 *m) {
  if (!Q8_HAS_M(t)) {
    short h0 = (short)rd16(blk), h1 = nk > 1 ? (short)rd16(blk + bs) : 0;
    short h2 = nk > 2 ? (short)rd16(blk + 2 * bs) : 0, h3 = nk > 3 ? (short)rd16(blk + 3 * bs) : 0;
    *d = *m = _mm_cvtph_ps(_mm_setr_epi16(h0, h1, h2, h3, 0, 0, 0, 0));
    return;
  }
  uint32_t v[4] = {0};  /* {d, m} of each block, as its first four bytes */
  for (int k = 0; k < nk; k++) memcpy(&v[k], blk + (size_t)k * bs, 4);
  __m256 dm = _mm256_cvtph_ps(_mm_setr_epi32((int)v[0], (int)v[1], (int)v[2], (int)v[3]));
  dm = _mm256_permutevar8x32_ps(dm, _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7));
  *d = _mm256_castps256_ps128(dm), *m = _mm256_extractf128_ps(dm, 1);
}

/* n floats from p, 0 after (n <= 4): a masked load, nothing read past them. */
TGT_INL __m128 ld4(const float *p, int n) {
  if (n == 4) return _mm_loadu_ps(p);
  return _mm_maskload_ps(p, _mm_cmpgt_epi32(_mm_set1_epi32(n), _mm_setr_epi32(0, 1, 2, 3)));
}

/* Blocks i .. i + nk - 1 (nk <= 4, i a multiple of 4; block i + k in lane k)
 * of weight rows row + j rb, j < NR, against input rows b0 .. b0 + NB - 1:
 * each block's lanes summed into its isum by one transposing add of four,
 * then one float step a block into the (row, input)'s four chains acc[j NB + b]. */
TGT_INL void q8_quad_avx2(enum ms_dtype t, const int NR, const int NB, const int nk, const uint8_t *row, size_t rb,
                          size_t bs, const struct ms_q8_act *a, int b0, int i, int ahead, __m128 *acc,
                          __m128 *mins) {
  int n = a->n, nblk = n / QK;
#pragma GCC unroll 4
  for (int j = 0; j < NR; j++) {
    const uint8_t *blk = row + (size_t)j * rb + (size_t)i * bs;
    if (ahead)
      for (size_t o = 0; o < (size_t)nk * bs; o += 64) Q8_PF(blk + o, 1, 1);
    __m256i w[4], wa[4];
    for (int k = 0; k < 4; k++) {
      w[k] = k < nk ? q8_wregs(t, blk + (size_t)k * bs) : _mm256_setzero_si256();
      wa[k] = Q8_HAS_M(t) ? w[k] : _mm256_sign_epi8(w[k], w[k]);
    }
    __m128 d, m;
    q8_scales4(t, blk, bs, nk, &d, &m);
#pragma GCC unroll 4
    for (int b = 0; b < NB; b++) {
      const int8_t *q = a->q + (size_t)(b0 + b) * (size_t)n + (size_t)i * QK;
      size_t ib = (size_t)(b0 + b) * (size_t)nblk + (size_t)i;
      __m256i l[4];
      for (int k = 0; k < 4; k++)
        l[k] = k < nk ? q8_lanes(t, w[k], wa[k], _mm256_load_si256((const __m256i *)(q + (size_t)k * QK)))
                      : _mm256_setzero_si256();
      acc[j * NB + b] = _mm_fmadd_ps(_mm_mul_ps(d, ld4(a->d + ib, nk)), _mm_cvtepi32_ps(a_hsum4(l)), acc[j * NB + b]);
      if (Q8_HAS_M(t)) mins[j * NB + b] = _mm_fmadd_ps(m, ld4(a->s + ib, nk), mins[j * NB + b]);
    }
  }
}

/* Weight rows row + j rb (j < NR) against input rows b0 .. b0 + NB - 1 (NR x
 * NB <= 4, constants where it is called: the accumulators stay in registers
 * and the whole quads take a loop without a branch); y[b ldy + j]. */
TGT_INL void q8_tile_avx2(enum ms_dtype t, const int NR, const int NB, const uint8_t *row, size_t rb, size_t bs,
                          const struct ms_q8_act *a, int b0, float *y, int ldy, int ahead) {
  int nblk = a->n / QK, nfull = nblk & ~3;
  __m128 acc[4], mins[4];
  for (int k = 0; k < 4; k++) acc[k] = mins[k] = _mm_setzero_ps();  /* [j NB + b], kept in registers */
  for (int i = 0; i < nfull; i += 4) q8_quad_avx2(t, NR, NB, 4, row, rb, bs, a, b0, i, ahead, acc, mins);
  switch (nblk - nfull) {  /* the last blocks, each count its own instance */
  case 3: q8_quad_avx2(t, NR, NB, 3, row, rb, bs, a, b0, nfull, 0, acc, mins); break;
  case 2: q8_quad_avx2(t, NR, NB, 2, row, rb, bs, a, b0, nfull, 0, acc, mins); break;
  case 1: q8_quad_avx2(t, NR, NB, 1, row, rb, bs, a, b0, nfull, 0, acc, mins); break;
  default: break;
  }
  for (int j = 0; j < NR; j++)
    for (int b = 0; b < NB; b++) {  /* (c0 + c1) + (c2 + c3), the minimums' the same way */
      __m128 v = acc[j * NB + b], u = mins[j * NB + b];
      v = _mm_add_ps(v, _mm_movehdup_ps(v));  /* lanes 0, 2: c0 + c1, c2 + c3 */
      v = _mm_add_ss(v, _mm_movehl_ps(v, v));
      if (Q8_HAS_M(t)) {
        u = _mm_add_ps(u, _mm_movehdup_ps(u));
        v = _mm_add_ss(v, _mm_add_ss(u, _mm_movehl_ps(u, u)));
      }
      y[(size_t)b * ldy + j] = _mm_cvtss_f32(v);
    }
}

TGT_INL void q8_gemv_avx2_t(enum ms_dtype t, const struct ms_weight *w, int r0, int r1,
                            const struct ms_q8_act *a, float *y, int ldy) {
  size_t rb = ms_weight_row_bytes(w), bs = ms_dtype_size(t);
  int r = r0;
  if (a->nb == 1)  /* two rows share each input block */
    for (; r + 1 < r1; r += 2)
      q8_tile_avx2(t, 2, 1, (const uint8_t *)w->data + (size_t)r * rb, rb, bs, a, 0, y + (r - r0), ldy, 1);
  for (; r < r1; r++) {
    const uint8_t *row = (const uint8_t *)w->data + (size_t)r * rb;
    for (int b0 = 0; b0 < a->nb; b0 += 4) {
      float *yb = y + (size_t)b0 * ldy + (r - r0);
      switch (a->nb - b0 < 4 ? a->nb - b0 : 4) {  /* one unrolled instance each */
      case 4: q8_tile_avx2(t, 1, 4, row, rb, bs, a, b0, yb, ldy, 0); break;
      case 3: q8_tile_avx2(t, 1, 3, row, rb, bs, a, b0, yb, ldy, 0); break;
      case 2: q8_tile_avx2(t, 1, 2, row, rb, bs, a, b0, yb, ldy, 0); break;
      default: q8_tile_avx2(t, 1, 1, row, rb, bs, a, b0, yb, ldy, a->nb == 1); break;
      }
    }
  }
}

/* q8_k_gemv_portable's sums with vectors: each piece unpacked once per group
 * of four input rows; _mm256_maddubs_epi16(|w|, q_x signed as w) leaves the
 * pairs' sums in int16 (at most 2 * 128 * 127: no saturation) and
 * _mm256_madd_epi16 by [sc[2i] x8, sc[2i + 1] x8] scales and adds them into
 * int32 lanes, summed over the super-block and then across the lanes into
 * isum; msum is the input's group sums times the minimums the same way. */
TGT_INL __m256i k_sc16(const int16_t *sc, int i) {  /* [sc[2i] x8, sc[2i + 1] x8] */
  return _mm256_set_m128i(_mm_set1_epi16(sc[2 * i + 1]), _mm_set1_epi16(sc[2 * i]));
}

TGT static void q8_k_gemv_avx2(const struct ms_weight *w, int r0, int r1, const struct ms_q8_act *a, float *y,
                               int ldy) {
  size_t rb = ms_weight_row_bytes(w), sbytes = ms_dtype_size(w->dtype);
  int nsb = a->n / 256, kmin = k_has_mins(w->dtype), n = a->n;
  enum ms_dtype t = w->dtype;
  struct ms_qk_scales ks;
  for (int r = r0; r < r1; r++) {
    const uint8_t *row = (const uint8_t *)w->data + (size_t)r * rb;
    for (int b0 = 0; b0 < a->nb; b0 += 4) {
      int nb = a->nb - b0 < 4 ? a->nb - b0 : 4;
      float acc[4] = {0};
      for (int s = 0; s < nsb; s++) {
        const uint8_t *sb = row + (size_t)s * sbytes;
        if (a->nb == 1) Q8_PF(sb, 1, 1);
        ms_quant_k_scales(t, sb, &ks);
        __m256i ia[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256()};
        for (int i = 0; i < 8; i++) {
          __m256i wv = kq_bytes(t, sb, i), wa = _mm256_sign_epi8(wv, wv), sc = k_sc16(ks.sc, i);
          for (int b = 0; b < 4; b++)
            if (b < nb) {
              const int8_t *qx = a->q + (size_t)(b0 + b) * (size_t)n + (size_t)(8 * s + i) * QK;
              __m256i p = _mm256_maddubs_epi16(wa, _mm256_sign_epi8(_mm256_load_si256((const __m256i *)qx), wv));
              ia[b] = _mm256_add_epi32(ia[b], _mm256_madd_epi16(p, sc));
            }
        }
        __m256i mn = _mm256_loadu_si256((const __m256i *)ks.mn);
        for (int b = 0; b < nb; b++) {
          size_t ib = (size_t)(b0 + b) * (size_t)nsb + (size_t)s;
          float dx = a->d[ib];
          acc[b] = fmaf(ks.d * dx, (float)hsum_i32(ia[b]), acc[b]);
          if (kmin) {
            __m256i bs = _mm256_loadu_si256((const __m256i *)(a->bs + 16 * ib));
            acc[b] = fmaf(-(ks.dmin * dx), (float)hsum_i32(_mm256_madd_epi16(mn, bs)), acc[b]);
          }
        }
      }
      for (int b = 0; b < nb; b++) y[(size_t)(b0 + b) * ldy + (r - r0)] = acc[b];
    }
  }
}

/* ---- AVX2 on the packed K-quants (blocks.h) ----
 * The same stream the AVX-512 path reads: its runs are already what 256-bit
 * integer code takes well. A 32-byte half of a pair's run is one piece (32
 * values in element order, as the input's bytes), so a row's weights come out
 * of a shared load with one shift and one mask (two rows a nibble, four a
 * 2-bit field), q6_K's high bits of four rows with one shift, mask and or, and
 * the unpacked scales of four rows in one 8-byte load. Only q3_K's and q5_K's
 * 64-bit high-bit masks, made for AVX-512's mask registers, cost a byte
 * expansion here (q5_bytes' shuffle and compare; Gemma-3's Q4_K_M file has
 * neither type), and one layout means one repack and the two kernels checked
 * on the same bytes.
 * Each row's isum and msum are q8_k_gemv_avx2's integers: maddubs(u, q) then
 * madd by the groups' scales, the signed types' u = w + K_OFF taken back as
 * K_OFF times sum_h sc[h] bs[h] (the input's group sums), then the same float
 * operations, so the bits are the file layout's. */

/* 32 bytes, bit k of m set to `one` (byte k), else 0 (q5_bytes' expansion). */
TGT_INL __m256i a_bits(uint32_t m, char one) {
  const __m256i spread = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0);
  __m256i bits = _mm256_or_si256(_mm256_shuffle_epi8(_mm256_set1_epi32((int)m), spread),
                                 _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe));
  return _mm256_and_si256(_mm256_cmpeq_epi8(bits, _mm256_set1_epi64x(-1)), _mm256_set1_epi8(one));
}

/* Row j's piece c (0: the pair's first, 1: its second) as 32 bytes u = q + K_OFF. */
TGT_INL __m256i a_kpk_w(enum ms_dtype t, const uint8_t *qp, const uint8_t *hp, int j, int c) {
  __m256i w;
  if (KP_QB(t) == 128) {  /* rows 2h, 2h + 1: the low and the high nibbles of bytes 64h + 32c .. */
    __m256i v = _mm256_load_si256((const __m256i *)(qp + 64 * (j / 2) + 32 * c));
    w = _mm256_and_si256(j & 1 ? _mm256_srli_epi16(v, 4) : v, _mm256_set1_epi8(0x0f));
  } else {  /* row j: bits 2j, 2j + 1 */
    __m256i v = _mm256_load_si256((const __m256i *)(qp + 32 * c));
    w = _mm256_and_si256(j ? _mm256_srli_epi16(v, 2 * j) : v, _mm256_set1_epi8(3));
  }
  if (t == MS_DTYPE_Q5_K || t == MS_DTYPE_Q3_K) {
    uint32_t m;
    memcpy(&m, hp + 8 * j + 4 * c, 4);
    w = _mm256_or_si256(w, a_bits(m, t == MS_DTYPE_Q5_K ? 0x10 : 4));
  }
  if (t == MS_DTYPE_Q6_K) {  /* row j's bits 2j, 2j + 1 to bits 4, 5 (the 16-bit shifts' spill masked off) */
    __m256i h = _mm256_load_si256((const __m256i *)(hp + 32 * c));
    h = j == 0 ? _mm256_slli_epi16(h, 4) : j == 1 ? _mm256_slli_epi16(h, 2) : j == 2 ? h : _mm256_srli_epi16(h, 2);
    w = _mm256_or_si256(w, _mm256_and_si256(h, _mm256_set1_epi8(0x30)));
  }
  return w;
}

/* A packed super-block's scale record (blocks.h) in registers: s[0], s[1]
 * its first 64 bytes (the scales; Q4_K's and Q5_K's minimums in s[1]). */
TGT_INL void a_rec(const uint8_t *sr, __m256i *s) {
  s[0] = _mm256_loadu_si256((const __m256i *)sr);
  s[1] = _mm256_loadu_si256((const __m256i *)(sr + 32));
}

/* Row j's lane scales of pair p's piece c, [sc(4p + 2c) x8, sc(4p + 2c + 1) x8]
 * as int16, by one byte shuffle of the record's bytes. */
TGT_INL __m256i a_sc16(enum ms_dtype t, const __m256i *s, int p, int c, int j) {
  if (KP_NS(t) == 8) {  /* byte 8p + 2j + c, one scale a piece */
    __m256i v = _mm256_broadcastsi128_si256(p < 2 ? _mm256_castsi256_si128(s[0]) : _mm256_extracti128_si256(s[0], 1));
    return _mm256_shuffle_epi8(v, _mm256_set1_epi16((short)(0x8000 | (8 * (p % 2) + 2 * j + c))));
  }
  /* bytes 16p + 4j + 2c (low lane) and + 1 (high lane), in both bytes of a word, then shifted down */
  __m128i h = p % 2 ? _mm256_extracti128_si256(s[p / 2], 1) : _mm256_castsi256_si128(s[p / 2]);
  int i = 4 * j + 2 * c;
  __m256i m = _mm256_add_epi16(_mm256_set1_epi16((short)(i * 0x101)), _mm256_setr_epi64x(0, 0, 0x0101010101010101, 0x0101010101010101));
  __m256i v = _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(h), m);
  return t == MS_DTYPE_Q2_K ? _mm256_and_si256(_mm256_srli_epi16(v, 8), _mm256_set1_epi16(15)) : _mm256_srai_epi16(v, 8);
}

/* Row j's 16 group scales (mins 0) or minimums (mins 1) as int16, group h = 4p + 2c + e. */
TGT_INL __m256i a_row16(enum ms_dtype t, const __m256i *s, int j, int mins) {
  if (KP_NS(t) == 8) {  /* byte 8p + 2j + c of the scales (s[0]) or the minimums (s[1]), p % 2 in each lane */
    const __m256i m = _mm256_setr_epi8(0, -128, 0, -128, 1, -128, 1, -128, 8, -128, 8, -128, 9, -128, 9, -128, 0, -128, 0,
                                       -128, 1, -128, 1, -128, 8, -128, 8, -128, 9, -128, 9, -128);
    return _mm256_shuffle_epi8(s[mins], _mm256_add_epi16(m, _mm256_set1_epi16((short)(2 * j))));
  }
  /* bytes 16p + 4j + e: [p0 | p2] and [p1 | p3] shuffled into groups 0-3 | 8-11 and 4-7 | 12-15 */
  __m256i lo = _mm256_permute2x128_si256(s[0], s[1], 0x20), hi = _mm256_permute2x128_si256(s[0], s[1], 0x31);
  const __m256i ma = _mm256_setr_epi8(0, 0, 1, 1, 2, 2, 3, 3, -128, -128, -128, -128, -128, -128, -128, -128, 0, 0, 1, 1,
                                      2, 2, 3, 3, -128, -128, -128, -128, -128, -128, -128, -128);
  const __m256i mb = _mm256_setr_epi8(-128, -128, -128, -128, -128, -128, -128, -128, 0, 0, 1, 1, 2, 2, 3, 3, -128, -128,
                                      -128, -128, -128, -128, -128, -128, 0, 0, 1, 1, 2, 2, 3, 3);
  const __m256i add = _mm256_set1_epi16((short)(4 * j * 0x101));
  /* -128 + 4j stays negative (bit 7 set): still a zero byte */
  __m256i v = _mm256_or_si256(_mm256_shuffle_epi8(lo, _mm256_add_epi8(ma, add)), _mm256_shuffle_epi8(hi, _mm256_add_epi8(mb, add)));
  if (t != MS_DTYPE_Q2_K) return _mm256_srai_epi16(v, 8);
  v = _mm256_srli_epi16(v, 8);
  return mins ? _mm256_srli_epi16(v, 4) : _mm256_and_si256(v, _mm256_set1_epi16(15));
}

#define A_NB 16  /* inputs a group's super-block serves before the next one is unpacked */

/* One packed K-quant group (four rows) against inputs b0 .. b0 + nb - 1 (nb <=
 * A_NB): y[b * ldy + j] for row j. Over one input (ONE) the weights and lane
 * scales are unpacked as they are used; over more, a super-block's are
 * unpacked once into L1 for all the inputs. Each input's four isums and msums
 * come out of one transposing add, and its four float chains run as one
 * vector, lane j (the same operations as the scalar ones). */
TGT_INL void a_kpk_rows4_t(enum ms_dtype t, const int ONE, const uint8_t *qg, const uint8_t *hg, const uint8_t *sg,
                           const struct ms_q8_act *a, int b0, int nb, int nsb, float *y, int ldy) {
  const int kmin = KP_KMIN(t), off = K_OFF(t), ns = KP_NS(t);
  __m256i wb[4][2][4], sb16[4][2][4];  /* [pair][piece][row] */
  __m128 acc[A_NB];
  for (int b = 0; b < nb; b++) acc[b] = _mm_setzero_ps();
  for (int sb = 0; sb < nsb; sb++) {
    const uint8_t *sr = sg + (size_t)sb * KP_SB(t), *dr = sr + 4 * ns * (1 + KP_MINS(t));
    const uint8_t *qs = qg + (size_t)sb * 4 * KP_QB(t), *hs = hg + (size_t)sb * 4 * KP_HB(t);
    __m256i rec[2];
    a_rec(sr, rec);
    if (!ONE)
      for (int p = 0; p < 4; p++)
        for (int c = 0; c < 2; c++)
          for (int j = 0; j < 4; j++) {
            wb[p][c][j] = a_kpk_w(t, qs + (size_t)p * KP_QB(t), hs + (size_t)p * KP_HB(t), j, c);
            sb16[p][c][j] = a_sc16(t, rec, p, c, j);
          }
    __m128 d = _mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)dr));
    __m128 dm = kmin ? _mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)(dr + 8))) : d;
    for (int b = 0; b < nb; b++) {
      size_t ib = (size_t)(b0 + b) * (size_t)nsb + (size_t)sb;
      const int8_t *qx = a->q + (size_t)(b0 + b) * (size_t)a->n + (size_t)sb * 256;
      __m256i bs = _mm256_loadu_si256((const __m256i *)(a->bs + 16 * ib)), ia[4];
      for (int j = 0; j < 4; j++)  /* -K_OFF sum_h sc[h] bs[h], as lanes */
        ia[j] = off ? _mm256_sub_epi32(_mm256_setzero_si256(),
                                       _mm256_madd_epi16(_mm256_slli_epi16(a_row16(t, rec, j, 0), off == 4 ? 2 : 5), bs))
                    : _mm256_setzero_si256();
      for (int p = 0; p < 4; p++) {
        if (ONE) {
          const uint8_t *qp = qs + (size_t)p * KP_QB(t), *hp = hs + (size_t)p * KP_HB(t);
          for (int k = 0; k < KP_QB(t); k += 64) Q8_PF(qp + k, 1, 1);
          if (KP_HB(t)) Q8_PF(hp, 1, 2);
        }
        for (int c = 0; c < 2; c++) {
          __m256i q = _mm256_load_si256((const __m256i *)(qx + (size_t)(2 * p + c) * QK));
          for (int j = 0; j < 4; j++) {
            __m256i w = ONE ? a_kpk_w(t, qs + (size_t)p * KP_QB(t), hs + (size_t)p * KP_HB(t), j, c) : wb[p][c][j];
            __m256i sc = ONE ? a_sc16(t, rec, p, c, j) : sb16[p][c][j];
            ia[j] = _mm256_add_epi32(ia[j], _mm256_madd_epi16(_mm256_maddubs_epi16(w, q), sc));
          }
        }
      }
      __m128 dx = _mm_set1_ps(a->d[ib]);
      acc[b] = _mm_fmadd_ps(_mm_mul_ps(d, dx), _mm_cvtepi32_ps(a_hsum4(ia)), acc[b]);
      if (kmin) {
        __m256i m[4];
        for (int j = 0; j < 4; j++) m[j] = _mm256_madd_epi16(a_row16(t, rec, j, 1), bs);
        acc[b] = _mm_fnmadd_ps(_mm_mul_ps(dm, dx), _mm_cvtepi32_ps(a_hsum4(m)), acc[b]);
      }
    }
  }
  for (int b = 0; b < nb; b++) _mm_storeu_ps(y + (size_t)(b0 + b) * ldy, acc[b]);
}

TGT_INL void a_kpk_rows4(enum ms_dtype t, const uint8_t *qg, const uint8_t *hg, const uint8_t *sg,
                         const struct ms_q8_act *a, int b0, int nb, int nsb, int ahead, float *y, int ldy) {
  if (nb == 1 && ahead)
    a_kpk_rows4_t(t, 1, qg, hg, sg, a, b0, 1, nsb, y, ldy);
  else
    a_kpk_rows4_t(t, 0, qg, hg, sg, a, b0, nb, nsb, y, ldy);
}

/* The packed K-quants at any batch: the whole groups of four in [r0, r1)
 * from the packed regions, each against the inputs A_NB at a time (the
 * group's run stays in L1 after the first), the rows before and after them
 * from data. */
TGT_INL void a_kpk_gemv_t(enum ms_dtype t, const struct ms_weight *w, int r0, int r1, const struct ms_q8_act *a,
                          float *y, int ldy) {
  int nsb = a->n / 256, g0, g1, P0, PN;
  pk_groups(w, r0, r1, &g0, &g1, &P0, &PN);
  if (g0 >= g1) {
    q8_k_gemv_avx2(w, r0, r1, a, y, ldy);
    return;
  }
  size_t n = (size_t)PN * (size_t)nsb;
  const uint8_t *qs = w->packed, *hs = qs + n * 4 * KP_QB(t), *ss = hs + n * 4 * KP_HB(t);
  if (r0 < 4 * g0) q8_k_gemv_avx2(w, r0, 4 * g0, a, y, ldy);
  for (int g = g0; g < g1; g++) {
    size_t at = (size_t)(g - P0) * (size_t)nsb;
    for (int b0 = 0; b0 < a->nb; b0 += A_NB)
      a_kpk_rows4(t, qs + at * 4 * KP_QB(t), hs + at * 4 * KP_HB(t), ss + at * KP_SB(t), a, b0,
                  a->nb - b0 < A_NB ? a->nb - b0 : A_NB, nsb, a->nb == 1, y + 4 * g - r0, ldy);
  }
  if (4 * g1 < r1) q8_k_gemv_avx2(w, 4 * g1, r1, a, y + 4 * g1 - r0, ldy);
}

/* 1 when w has a packed K-quant form and it was taken. */
TGT static int a_kpk_gemv(const struct ms_weight *w, int r0, int r1, const struct ms_q8_act *a, float *y, int ldy) {
  if (!w->packed) return 0;
  switch (w->dtype) {  /* one instance per type */
  case MS_DTYPE_Q2_K: a_kpk_gemv_t(MS_DTYPE_Q2_K, w, r0, r1, a, y, ldy); return 1;
  case MS_DTYPE_Q3_K: a_kpk_gemv_t(MS_DTYPE_Q3_K, w, r0, r1, a, y, ldy); return 1;
  case MS_DTYPE_Q4_K: a_kpk_gemv_t(MS_DTYPE_Q4_K, w, r0, r1, a, y, ldy); return 1;
  case MS_DTYPE_Q5_K: a_kpk_gemv_t(MS_DTYPE_Q5_K, w, r0, r1, a, y, ldy); return 1;
  case MS_DTYPE_Q6_K: a_kpk_gemv_t(MS_DTYPE_Q6_K, w, r0, r1, a, y, ldy); return 1;
  default: return 0;
  }
}

/* The unit (a quad, or the last pair) at quad Q of a packed group's three
 * regions (blocks.h): its quants, scales and high bits. */
struct pk_unit {
  const uint8_t *q, *h;
  const uint16_t *d;
};

static inline struct pk_unit pk_at(enum ms_dtype t, const uint8_t *qg, const uint16_t *dg, const uint8_t *hg, int Q) {
  size_t p = 2 * (size_t)Q;  /* its first block pair */
  return (struct pk_unit){.q = qg + p * PK_QB(t), .h = hg + p * PK_HB(t), .d = dg + p * (PK_SB(t) / 2)};
}

/* Batch 1's streams, prefetched (Q8_PF) ahead of quad u and each other
 * region as far ahead in time: a quad's scales (32 or 64 bytes) and high bits
 * (64) are one line each. */
TGT_INL void pk_prefetch(enum ms_dtype t, struct pk_unit u) {
  for (int k = 0; k < 2 * PK_QB(t); k += 64) Q8_PF(u.q + k, 1, 1);
  Q8_PF(u.d, PK_SB(t), PK_QB(t));
  if (PK_HB(t)) Q8_PF(u.h, PK_HB(t), PK_QB(t));
}

/* ---- AVX2 on the packed 32-element types (blocks.h) ----
 * The AVX-512 packed form read 256 bits at a time: half h of a quad's step
 * (its bytes 32h .. 32h + 31) is rows 2h and 2h + 1, lanes 4j' + k, so
 * _mm256_maddubs_epi16 with the input's step (its 16 bytes in both 128-bit
 * lanes) and _mm256_madd_epi16 by ones leave each lane's four products in
 * int32 as vpdpbusd does. No int16 saturation: the 4- and 5-bit types' u <=
 * 31 (their offset taken back as A_OFF times the block's sum of q), and
 * Q8_0's bytes go back to signed w, multiplied as |w| by q carrying w's
 * sign. Then the float steps of the section on 8-bit activations, a vector
 * a half: the bits are the file layout's. A last pair (lanes 2j + k, one
 * 256-bit step) is permuted into the halves' chains 0 and 1 and blended. */
#define A_OFF(t) ((t) == MS_DTYPE_Q4_0 ? 8 : (t) == MS_DTYPE_Q5_0 ? 16 : 0)

/* Step s's weights of half h of a quad (vb 64) or of a last pair (vb 32, h 0):
 * u for the 4- and 5-bit types, Q8_0's signed w. */
TGT_INL __m256i a_pk_w(enum ms_dtype t, const uint8_t *qp, const uint8_t *hp, int vb, int h, int s) {
  if (t == MS_DTYPE_Q8_0)
    return _mm256_xor_si256(_mm256_load_si256((const __m256i *)(qp + 32 * h + vb * s)), _mm256_set1_epi8((char)0x80));
  __m256i v = _mm256_load_si256((const __m256i *)(qp + 32 * h + vb * (s & 3)));
  __m256i w = _mm256_and_si256(s < 4 ? v : _mm256_srli_epi16(v, 4), _mm256_set1_epi8(0x0f));
  if (PK_HB(t)) {  /* bits 32h .. 32h + 31 of step s's word */
    uint32_t m;
    memcpy(&m, hp + (vb / 8) * s + 4 * h, 4);
    w = _mm256_or_si256(w, a_bits(m, 0x10));
  }
  return w;
}

/* Each lane's four products of weights w (a_pk_w's) and input bytes x. */
TGT_INL __m256i a_pk_dot(enum ms_dtype t, __m256i w, __m256i x) {
  __m256i p = t == MS_DTYPE_Q8_0 ? _mm256_maddubs_epi16(_mm256_abs_epi8(w), _mm256_sign_epi8(x, w))
                                 : _mm256_maddubs_epi16(w, x);
  return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
}

/* -A_OFF times an input's block sums from its halves' sums bs (nk = 4: [s0..s3] x2; 2: [s0, s1] x4). */
TGT_INL __m256i a_pk_init(enum ms_dtype t, const int16_t *bs, int nk) {
  if (!A_OFF(t)) return _mm256_setzero_si256();
  __m128i h = nk == 4 ? _mm_loadu_si128((const __m128i *)bs) : _mm_loadl_epi64((const __m128i *)bs);
  __m128i s = _mm_mullo_epi32(_mm_madd_epi16(h, _mm_set1_epi16(1)), _mm_set1_epi32(-A_OFF(t)));
  return nk == 4 ? _mm256_broadcastsi128_si256(s) : _mm256_broadcastq_epi64(s);
}

/* A last pair's lanes 2j + k moved to half h's lanes 4j' + k (j = 2h + j'). */
TGT_INL __m256 a_pk_pair_half(__m256 v, int h) {
  return _mm256_permutevar8x32_ps(v, _mm256_setr_epi32(4 * h, 4 * h + 1, 0, 0, 4 * h + 2, 4 * h + 3, 0, 0));
}

/* Four rows of a packed group against the NB (1 or 2) input rows from b0;
 * the minimums (Q4_1, Q5_1) in a loop of their own after, to leave the main
 * loop its 16 registers. */
TGT_INL void a_pk_tile(enum ms_dtype t, const int NB, const uint8_t *qg, const uint16_t *dg, const uint8_t *hg,
                       const struct ms_q8_act *a, int b0, int np, int ahead, float *y, int ldy) {
  const int n = a->n, nblk = n / QK, nq = np / 2;
  __m256 c[2][2], mn[2][2];  /* [b][h] */
  for (int b = 0; b < NB; b++) c[b][0] = c[b][1] = mn[b][0] = mn[b][1] = _mm256_setzero_ps();
  for (int Q = 0; Q < nq; Q++) {
    struct pk_unit u = pk_at(t, qg, dg, hg, Q);
    const uint8_t *qp = u.q, *hp = u.h;
    const uint16_t *dp = u.d;
    if (ahead) pk_prefetch(t, u);
    for (int h = 0; h < 2; h++) {
      __m256i W[8];
      for (int s = 0; s < 8; s++) W[s] = a_pk_w(t, qp, hp, 64, h, s);
      __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(dp + 8 * h)));
      for (int b = 0; b < NB; b++) {
        size_t ib = (size_t)(b0 + b) * (size_t)nblk + 4 * (size_t)Q;
        const int8_t *xa = a->qa + (size_t)(b0 + b) * (size_t)n + (size_t)Q * 128;
        __m256i i0 = a_pk_init(t, a->bs + 2 * ib, 4), i1 = _mm256_setzero_si256();
        for (int s = 0; s < 8; s += 2) {
          i0 = _mm256_add_epi32(i0, a_pk_dot(t, W[s], _mm256_broadcastsi128_si256(
                                                           _mm_loadu_si128((const __m128i *)(xa + 16 * s)))));
          i1 = _mm256_add_epi32(i1, a_pk_dot(t, W[s + 1], _mm256_broadcastsi128_si256(
                                                               _mm_loadu_si128((const __m128i *)(xa + 16 * s + 16)))));
        }
        __m256 dx = _mm256_broadcast_ps((const __m128 *)(const void *)(a->d + ib));
        c[b][h] = _mm256_fmadd_ps(_mm256_mul_ps(dw, dx), _mm256_cvtepi32_ps(_mm256_add_epi32(i0, i1)), c[b][h]);
      }
    }
  }
  if (np & 1) {  /* the last pair: blocks 4 nq, 4 nq + 1 into chains 0 and 1 */
    struct pk_unit u = pk_at(t, qg, dg, hg, nq);
    const uint8_t *qp = u.q, *hp = u.h;
    const uint16_t *dp = u.d;
    __m256i W[8];
    for (int s = 0; s < 8; s++) W[s] = a_pk_w(t, qp, hp, 32, 0, s);
    __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)dp));
    for (int b = 0; b < NB; b++) {
      size_t ib = (size_t)(b0 + b) * (size_t)nblk + 4 * (size_t)nq;
      const int8_t *xa = a->qa + (size_t)(b0 + b) * (size_t)n + (size_t)nq * 128;
      __m256i is = a_pk_init(t, a->bs + 2 * ib, 2);
      for (int s = 0; s < 8; s++) {
        int64_t x8;
        memcpy(&x8, xa + 8 * s, 8);
        is = _mm256_add_epi32(is, a_pk_dot(t, W[s], _mm256_set1_epi64x(x8)));
      }
      __m256 dx = _mm256_castpd_ps(_mm256_broadcast_sd((const double *)(const void *)(a->d + ib)));
      __m256 sc = _mm256_mul_ps(dw, dx), f = _mm256_cvtepi32_ps(is);
      for (int h = 0; h < 2; h++)
        c[b][h] = _mm256_blend_ps(
            c[b][h], _mm256_fmadd_ps(a_pk_pair_half(sc, h), a_pk_pair_half(f, h), c[b][h]), 0x33);
    }
  }
  if (Q8_HAS_M(t))
    for (int b = 0; b < NB; b++) {
      const float *sx = a->s + (size_t)(b0 + b) * (size_t)nblk;
      for (int Q = 0; Q < nq; Q++)
        for (int h = 0; h < 2; h++) {
          const uint16_t *mp = pk_at(t, qg, dg, hg, Q).d + 16 + 8 * h;  /* the quad's m, after its 16 d */
          mn[b][h] = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)mp)),
                                     _mm256_broadcast_ps((const __m128 *)(const void *)(sx + 4 * Q)), mn[b][h]);
        }
      if (np & 1) {
        __m256 mw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(pk_at(t, qg, dg, hg, nq).d + 8)));
        __m256 s2 = _mm256_castpd_ps(_mm256_broadcast_sd((const double *)(const void *)(sx + 4 * nq)));
        for (int h = 0; h < 2; h++)
          mn[b][h] = _mm256_blend_ps(
              mn[b][h], _mm256_fmadd_ps(a_pk_pair_half(mw, h), a_pk_pair_half(s2, h), mn[b][h]), 0x33);
      }
    }
  for (int b = 0; b < NB; b++)
    for (int h = 0; h < 2; h++) {  /* lanes 0 and 4: (c0 + c1) + (c2 + c3) of rows 2h, 2h + 1 */
      __m256 v = _mm256_add_ps(c[b][h], _mm256_permute_ps(c[b][h], 0xb1));
      v = _mm256_add_ps(v, _mm256_permute_ps(v, 0x4e));
      if (Q8_HAS_M(t)) {
        __m256 u = _mm256_add_ps(mn[b][h], _mm256_permute_ps(mn[b][h], 0xb1));
        v = _mm256_add_ps(v, _mm256_add_ps(u, _mm256_permute_ps(u, 0x4e)));
      }
      y[(size_t)(b0 + b) * ldy + 2 * h] = _mm256_cvtss_f32(v);
      y[(size_t)(b0 + b) * ldy + 2 * h + 1] = _mm_cvtss_f32(_mm256_extractf128_ps(v, 1));
    }
}

/* The packed form at any batch: each whole group of four in [r0, r1) against
 * the inputs two at a time, the rows outside them from data. */
TGT_INL void a_pk_gemv_t(enum ms_dtype t, const struct ms_weight *w, int r0, int r1, const struct ms_q8_act *a,
                         float *y, int ldy) {
  int np = a->n / (2 * QK), g0, g1, P0, PN;
  pk_groups(w, r0, r1, &g0, &g1, &P0, &PN);
  if (g0 >= g1) {
    q8_gemv_avx2_t(t, w, r0, r1, a, y, ldy);
    return;
  }
  size_t n = (size_t)PN * (size_t)np;
  const uint8_t *qs = w->packed;
  const uint16_t *ds = (const uint16_t *)(qs + n * PK_QB(t));
  const uint8_t *hs = (const uint8_t *)ds + n * PK_SB(t);
  if (r0 < 4 * g0) q8_gemv_avx2_t(t, w, r0, 4 * g0, a, y, ldy);
  for (int g = g0; g < g1; g++) {
    size_t at = (size_t)(g - P0) * (size_t)np;
    const uint8_t *qg = qs + at * PK_QB(t), *hg = hs + at * PK_HB(t);
    const uint16_t *dg = ds + at * (PK_SB(t) / 2);
    float *yg = y + 4 * g - r0;
    int b0 = 0;
    for (; b0 + 1 < a->nb; b0 += 2) a_pk_tile(t, 2, qg, dg, hg, a, b0, np, 0, yg, ldy);
    if (b0 < a->nb) a_pk_tile(t, 1, qg, dg, hg, a, b0, np, a->nb == 1, yg, ldy);
  }
  if (4 * g1 < r1) q8_gemv_avx2_t(t, w, 4 * g1, r1, a, y + 4 * g1 - r0, ldy);
}

/* ---- AVX-512 VNNI on the packed 32-element types (blocks.h) ----
 * A group of four rows, four blocks at a time (a quad): lane 4j + k of a
 * vector is row j's block 4Q + k, so _mm512_dpbusd_epi32 of a step's weight
 * bytes (u = w + Q8_OFF: unsigned) with the input's step broadcast to the four
 * rows (ms_q8_act.qa: the 16 bytes q[4Q + k][4s .. 4s + 3]) adds four
 * products into each lane, and after the eight steps each lane holds its
 * block's isum (no int16 saturation on the way; the lanes start at -Q8_OFF
 * times the block's sum of q). Then one conversion and FMA for 16 blocks:
 * lane 4j + k is row j's chain k, the order of the section on 8-bit
 * activations, so the bits are the portable path's. A last pair of blocks
 * (the row's blocks % 4 == 2) takes the same steps on 256 bits, lanes 2j + k,
 * into chains 0 and 1. The rows outside the packed groups, and weights with no
 * packed form, take the AVX2 path (q8_gemv_avx2): the same bits. */
#define TGT512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))
#define TGT512_INL TGT512 static inline __attribute__((always_inline))

/* The unsigned offset of a type's weight bytes: u = w + off. */
#define Q8_OFF(t)                                                                         \
  ((t) == MS_DTYPE_Q8_0 || (t) == MS_DTYPE_IQ4_NL ? 128 : (t) == MS_DTYPE_Q4_0 ? 8 : (t) == MS_DTYPE_Q5_0 ? 16 : 0)

TGT static void q8_gemv_avx2(const struct ms_weight *w, int r0, int r1, const struct ms_q8_act *a, float *y,
                             int ldy);

/* The eight steps' weights of a quad (512 bits) or a last pair (256 bits,
 * V = __m256i): Q8_0 as stored, the others' low nibbles steps 0-3 and high
 * nibbles steps 4-7, Q5's fifth bits added from one mask a step. */
#define PK_STEPS(V, LOAD, AND, SRLI, SET1, MADD, MASK, t, qp, hp, W)            \
  do {                                                                         \
    const int vb_ = (int)sizeof(V);                                            \
    if ((t) == MS_DTYPE_Q8_0)                                                  \
      for (int s_ = 0; s_ < 8; s_++) W[s_] = LOAD((const void *)((qp) + vb_ * s_)); \
    else                                                                       \
      for (int s_ = 0; s_ < 4; s_++) {                                         \
        V v_ = LOAD((const void *)((qp) + vb_ * s_));                          \
        W[s_] = AND(v_, SET1(0x0f));                                           \
        W[s_ + 4] = AND(SRLI(v_, 4), SET1(0x0f));                              \
      }                                                                        \
    if (PK_HB(t))                                                              \
      for (int s_ = 0; s_ < 8; s_++) W[s_] = MADD(W[s_], MASK(hp, s_), W[s_], SET1(0x10)); \
  } while (0)
#define PK_M64(hp, s) _cvtu64_mask64(((const uint64_t *)(const void *)(hp))[s])
#define PK_M32(hp, s) _cvtu32_mask32(((const uint32_t *)(const void *)(hp))[s])

/* -Q8_OFF times the sums of an input's blocks 4Q .. 4Q + 3, from its halves' sums bs (8 of them). */
TGT512_INL __m512i v_quad_init(enum ms_dtype t, const int16_t *bs) {
  __m128i s = _mm_madd_epi16(_mm_loadu_si128((const __m128i *)bs), _mm_set1_epi16(1));
  return _mm512_broadcast_i32x4(_mm_mullo_epi32(s, _mm_set1_epi32(-Q8_OFF(t))));
}

/* The same for a last pair (4 halves), as [s0, s1] x4. */
TGT512_INL __m256i v_pair_init(enum ms_dtype t, const int16_t *bs) {
  __m128i s = _mm_madd_epi16(_mm_loadl_epi64((const __m128i *)bs), _mm_set1_epi16(1));
  return _mm256_broadcastq_epi64(_mm_mullo_epi32(s, _mm_set1_epi32(-Q8_OFF(t))));
}

/* Four rows of a packed group against the NB input rows from b0 (NB <= 4, a
 * constant where it is called: the accumulators stay in registers and the
 * loops unroll), np block pairs a row; ahead: batch 1's stream, prefetched.
 * qg, dg, hg: the group's quants, scales (f16) and high bits (blocks.h). */
TGT512_INL void v_pk_tile(enum ms_dtype t, const int NB, const uint8_t *qg, const uint16_t *dg, const uint8_t *hg,
                          const struct ms_q8_act *a, int b0, int np, int ahead, float *y, int ldy) {
  const int n = a->n, nblk = n / QK, nq = np / 2, hasm = Q8_HAS_M(t);
  __m512 c[4], m[4];
  for (int b = 0; b < NB; b++) c[b] = m[b] = _mm512_setzero_ps();
  for (int Q = 0; Q < nq; Q++) {
    struct pk_unit u = pk_at(t, qg, dg, hg, Q);
    const uint8_t *qp = u.q, *hp = u.h;
    const uint16_t *dp = u.d;
    if (ahead) pk_prefetch(t, u);
    __m512i W[8];
    PK_STEPS(__m512i, _mm512_load_si512, _mm512_and_si512, _mm512_srli_epi16, _mm512_set1_epi8,
             _mm512_mask_add_epi8, PK_M64, t, qp, hp, W);
    __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)dp));
    __m512 mw = hasm ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(dp + 16))) : dw;
    for (int b = 0; b < NB; b++) {
      size_t ib = (size_t)(b0 + b) * (size_t)nblk + 4 * (size_t)Q;
      const int8_t *xa = a->qa + (size_t)(b0 + b) * (size_t)n + (size_t)Q * 128;
      __m512i is[4];  /* four short chains of integer adds */
      for (int s = 0; s < 4; s++)
        is[s] = _mm512_dpbusd_epi32(s == 0 && Q8_OFF(t) ? v_quad_init(t, a->bs + 2 * ib) : _mm512_setzero_si512(),
                                    W[s], _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(xa + 16 * s))));
      for (int s = 4; s < 8; s++)
        is[s - 4] = _mm512_dpbusd_epi32(is[s - 4], W[s],
                                        _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(xa + 16 * s))));
      __m512i isum = _mm512_add_epi32(_mm512_add_epi32(is[0], is[1]), _mm512_add_epi32(is[2], is[3]));
      __m512 dx = _mm512_broadcast_f32x4(_mm_loadu_ps(a->d + ib));
      c[b] = _mm512_fmadd_ps(_mm512_mul_ps(dw, dx), _mm512_cvtepi32_ps(isum), c[b]);
      if (hasm) m[b] = _mm512_fmadd_ps(mw, _mm512_broadcast_f32x4(_mm_loadu_ps(a->s + ib)), m[b]);
    }
  }
  if (np & 1) {  /* the last pair: lanes 2j + k, moved to lanes 4j + k (chains 0 and 1) */
    struct pk_unit u = pk_at(t, qg, dg, hg, nq);
    const uint8_t *qp = u.q, *hp = u.h;
    const uint16_t *dp = u.d;
    const __m512i to4 = _mm512_setr_epi32(0, 1, 0, 0, 2, 3, 0, 0, 4, 5, 0, 0, 6, 7, 0, 0);
    const __mmask16 lanes = 0x3333;
    __m256i W[8];
    PK_STEPS(__m256i, _mm256_load_si256, _mm256_and_si256, _mm256_srli_epi16, _mm256_set1_epi8,
             _mm256_mask_add_epi8, PK_M32, t, qp, hp, W);
    __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)dp));
    __m256 mw = hasm ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(dp + 8))) : dw;
    for (int b = 0; b < NB; b++) {
      size_t ib = (size_t)(b0 + b) * (size_t)nblk + 4 * (size_t)nq;
      const int8_t *xa = a->qa + (size_t)(b0 + b) * (size_t)n + (size_t)nq * 128;
      __m256i is = Q8_OFF(t) ? v_pair_init(t, a->bs + 2 * ib) : _mm256_setzero_si256();
      for (int s = 0; s < 8; s++) {
        int64_t x8;
        memcpy(&x8, xa + 8 * s, 8);
        is = _mm256_dpbusd_epi32(is, W[s], _mm256_set1_epi64x(x8));
      }
      __m256 dx = _mm256_castpd_ps(_mm256_broadcast_sd((const double *)(const void *)(a->d + ib)));
      __m512 sc = _mm512_permutexvar_ps(to4, _mm512_castps256_ps512(_mm256_mul_ps(dw, dx)));
      __m512 f = _mm512_permutexvar_ps(to4, _mm512_castps256_ps512(_mm256_cvtepi32_ps(is)));
      c[b] = _mm512_mask3_fmadd_ps(sc, f, c[b], lanes);
      if (hasm) {
        __m256 sx = _mm256_castpd_ps(_mm256_broadcast_sd((const double *)(const void *)(a->s + ib)));
        m[b] = _mm512_mask3_fmadd_ps(_mm512_permutexvar_ps(to4, _mm512_castps256_ps512(mw)),
                                     _mm512_permutexvar_ps(to4, _mm512_castps256_ps512(sx)), m[b], lanes);
      }
    }
  }
  /* lane 4j: (c0 + c1) + (c2 + c3) of row j, the minimums' the same way added */
  const __m512i first = _mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
  for (int b = 0; b < NB; b++) {
    __m512 v = _mm512_add_ps(c[b], _mm512_permute_ps(c[b], 0xb1));  /* lanes 4j, 4j + 2: c0 + c1, c2 + c3 */
    v = _mm512_add_ps(v, _mm512_permute_ps(v, 0x4e));
    if (hasm) {
      __m512 u = _mm512_add_ps(m[b], _mm512_permute_ps(m[b], 0xb1));
      v = _mm512_add_ps(v, _mm512_add_ps(u, _mm512_permute_ps(u, 0x4e)));
    }
    _mm_storeu_ps(y + (size_t)(b0 + b) * ldy, _mm512_castps512_ps128(_mm512_permutexvar_ps(first, v)));
  }
}

/* v_pk_tile for nb (1 .. 4) input rows: one unrolled instance each. */
TGT512_INL void v_pk_rows4(enum ms_dtype t, const uint8_t *qg, const uint16_t *dg, const uint8_t *hg,
                           const struct ms_q8_act *a, int b0, int nb, int np, float *y, int ldy) {
  switch (nb) {
  case 4: v_pk_tile(t, 4, qg, dg, hg, a, b0, np, 0, y, ldy); break;
  case 3: v_pk_tile(t, 3, qg, dg, hg, a, b0, np, 0, y, ldy); break;
  case 2: v_pk_tile(t, 2, qg, dg, hg, a, b0, np, 0, y, ldy); break;
  default: v_pk_tile(t, 1, qg, dg, hg, a, b0, np, a->nb == 1, y, ldy); break;
  }
}

/* The packed form at any batch: each whole group of four in [r0, r1) against
 * the inputs four at a time, the rows outside them by the AVX2 path. */
TGT512_INL void pk_gemv_t(enum ms_dtype t, const struct ms_weight *w, int r0, int r1, const struct ms_q8_act *a,
                          float *y, int ldy) {
  int np = a->n / (2 * QK), g0, g1, P0, PN;
  pk_groups(w, r0, r1, &g0, &g1, &P0, &PN);
  if (g0 >= g1) {
    q8_gemv_avx2(w, r0, r1, a, y, ldy);
    return;
  }
  size_t n = (size_t)PN * (size_t)np;
  const uint8_t *qs = w->packed;
  const uint16_t *ds = (const uint16_t *)(qs + n * PK_QB(t));
  const uint8_t *hs = (const uint8_t *)ds + n * PK_SB(t);
  if (r0 < 4 * g0) q8_gemv_avx2(w, r0, 4 * g0, a, y, ldy);
  for (int g = g0; g < g1; g++) {
    size_t at = (size_t)(g - P0) * (size_t)np;
    for (int b0 = 0; b0 < a->nb; b0 += 4)
      v_pk_rows4(t, qs + at * PK_QB(t), ds + at * (PK_SB(t) / 2), hs + at * PK_HB(t), a, b0,
                 a->nb - b0 < 4 ? a->nb - b0 : 4, np, y + 4 * g - r0, ldy);
  }
  if (4 * g1 < r1) q8_gemv_avx2(w, 4 * g1, r1, a, y + 4 * g1 - r0, ldy);
}

/* [v0 x4, v1 x4, v2 x4, v3 x4] */
TGT512_INL __m512 v_x4(__m128 v) {
  const __m512i idx = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
  return _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(v));
}

/* The K-quants from the file's layout (rows outside whole groups of four, or
 * no packed form): q8_k_gemv_avx2's loop, the same bits. */
TGT512_INL void q8_k_gemv_avx512_t(enum ms_dtype t, const struct ms_weight *w, int r0, int r1,
                                   const struct ms_q8_act *a, float *y, int ldy) {
  (void)t;
  q8_k_gemv_avx2(w, r0, r1, a, y, ldy);
}

/* ---- AVX-512 VNNI on the packed K-quants ----
 * Four rows of a group against NB input rows (a constant where it is called:
 * the 4 x NB integer accumulators stay in registers and the loops unroll
 * without a branch). Per pair of pieces, each row's 64 weights u = q + K_OFF
 * are unpacked once for every input; _mm512_maddubs_epi16(u, q_x) leaves the
 * pairs' sums in int16 (at most 2 * 63 * 127) and _mm512_dpwssd_epi32 adds
 * them times the group scales (the int16 lanes of a pair: group 4p + m / 8)
 * into int32 lanes. A super-block's lanes start at -K_OFF sc[h] bs[h] (the
 * signed types' offset taken back), are summed across (four rows x NB inputs
 * at once, a transposing reduction) into q8_k_gemv_portable's isum, and the
 * minimums' msum comes from the input's group sums the same way; then its
 * float operations, lane 4b + j of one vector holding (row j, input b). */

/* Row j's 64 weights of a pair as unsigned bytes (u = q + K_OFF). */
TGT512_INL __m512i v_kpk_w(enum ms_dtype t, const uint8_t *qp, const uint8_t *hp, int j) {
  __m512i w;
  if (KP_QB(t) == 128) {
    __m512i nib = _mm512_load_si512((const void *)(qp + 64 * (j / 2)));
    w = _mm512_and_si512(j & 1 ? _mm512_srli_epi16(nib, 4) : nib, _mm512_set1_epi8(0x0f));
  } else {
    __m512i nib = _mm512_load_si512((const void *)qp);
    w = _mm512_and_si512(j ? _mm512_srli_epi16(nib, 2 * j) : nib, _mm512_set1_epi8(3));
  }
  if (t == MS_DTYPE_Q5_K || t == MS_DTYPE_Q3_K) {
    uint64_t m;
    memcpy(&m, hp + 8 * j, 8);
    w = _mm512_mask_add_epi8(w, _cvtu64_mask64(m), w, _mm512_set1_epi8(t == MS_DTYPE_Q5_K ? 16 : 4));
  }
  if (t == MS_DTYPE_Q6_K) {  /* row j's two high bits (2j, 2j + 1) to bits 4, 5: w | (them & 0x30) */
    __m512i hb = _mm512_load_si512((const void *)hp);
    __m512i h = j == 0 ? _mm512_slli_epi16(hb, 4) : j == 1 ? _mm512_slli_epi16(hb, 2) : j == 2 ? hb
                                                                                            : _mm512_srli_epi16(hb, 2);
    w = _mm512_ternarylogic_epi32(w, h, _mm512_set1_epi8(0x30), 0xf8);
  }
  return w;
}

/* The sums of x[0..15] (16 int32 lanes each): lane l of the result is x[l]'s. */
TGT512_INL __m512i v_red16(const __m512i *x) {
  __m512i u[8], w[4];
  for (int k = 0; k < 8; k++)
    u[k] = _mm512_add_epi32(_mm512_unpacklo_epi32(x[2 * k], x[2 * k + 1]), _mm512_unpackhi_epi32(x[2 * k], x[2 * k + 1]));
  for (int k = 0; k < 4; k++)  /* each 128-bit lane: the partial sums of x[4k .. 4k + 3] */
    w[k] = _mm512_add_epi32(_mm512_unpacklo_epi64(u[2 * k], u[2 * k + 1]), _mm512_unpackhi_epi64(u[2 * k], u[2 * k + 1]));
  __m512i r0 = _mm512_add_epi32(_mm512_shuffle_i32x4(w[0], w[1], 0x44), _mm512_shuffle_i32x4(w[0], w[1], 0xee));
  __m512i r1 = _mm512_add_epi32(_mm512_shuffle_i32x4(w[2], w[3], 0x44), _mm512_shuffle_i32x4(w[2], w[3], 0xee));
  return _mm512_add_epi32(_mm512_shuffle_i32x4(r0, r1, 0x88), _mm512_shuffle_i32x4(r0, r1, 0xdd));
}

/* The sums of x[0..3] in lanes 0..3. */
TGT512_INL __m512i v_red4(const __m512i *x) {
  __m512i u0 = _mm512_add_epi32(_mm512_unpacklo_epi32(x[0], x[1]), _mm512_unpackhi_epi32(x[0], x[1]));
  __m512i u1 = _mm512_add_epi32(_mm512_unpacklo_epi32(x[2], x[3]), _mm512_unpackhi_epi32(x[2], x[3]));
  __m512i w = _mm512_add_epi32(_mm512_unpacklo_epi64(u0, u1), _mm512_unpackhi_epi64(u0, u1));
  w = _mm512_add_epi32(w, _mm512_shuffle_i32x4(w, w, 0x4e));
  return _mm512_add_epi32(w, _mm512_shuffle_i32x4(w, w, 0xb1));
}

/* The 8-lane halves of x[0..7] summed: x[k]'s low half is entry (k % 4, 2 (k / 4)),
 * its high half (k % 4, 2 (k / 4) + 1); lane 4 b + j of the result is entry (j, b)'s. */
TGT512_INL __m512i v_red8h(const __m512i *x) {
  __m512i u[4], w[2];
  for (int k = 0; k < 4; k++)
    u[k] = _mm512_add_epi32(_mm512_unpacklo_epi32(x[2 * k], x[2 * k + 1]), _mm512_unpackhi_epi32(x[2 * k], x[2 * k + 1]));
  for (int k = 0; k < 2; k++)
    w[k] = _mm512_add_epi32(_mm512_unpacklo_epi64(u[2 * k], u[2 * k + 1]), _mm512_unpackhi_epi64(u[2 * k], u[2 * k + 1]));
  return _mm512_add_epi32(_mm512_shuffle_i32x4(w[0], w[1], 0x88), _mm512_shuffle_i32x4(w[0], w[1], 0xdd));
}

/* A super-block's scale record (blocks.h) as int16: z[0] (and z[1] for the
 * 16-group types) the scales, zm[0], zm[1] the minimums; then row j's 16
 * groups (g = 2 piece + half) from them. */
TGT512_INL void v_kpk_rec(enum ms_dtype t, const uint8_t *sr, __m512i *z, __m512i *zm) {
  if (KP_NS(t) == 8) {  /* lane 8p + 2j + c: pair p, row j, piece c */
    z[0] = z[1] = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)sr));
    zm[0] = zm[1] = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(sr + 32)));
    return;
  }
  for (int k = 0; k < 2; k++) {  /* z[k] lane 16 (p % 2) + 4j + h, p = 2k, 2k + 1 */
    __m256i v = _mm256_loadu_si256((const __m256i *)(sr + 32 * k));
    if (t == MS_DTYPE_Q2_K) {
      __m512i u = _mm512_cvtepu8_epi16(v);
      z[k] = _mm512_and_si512(u, _mm512_set1_epi16(15));
      zm[k] = _mm512_srli_epi16(u, 4);
    } else {
      z[k] = _mm512_cvtepi8_epi16(v);
      zm[k] = _mm512_setzero_si512();
    }
  }
}

/* Pair p's int16 lane scales of row j: lane m takes group 4p + m / 8. */
TGT512_INL __m512i v_kpk_sc16(enum ms_dtype t, const __m512i *z, int p, int j) {
  if (KP_NS(t) == 8) {
    const __m512i hi = _mm512_set_epi64(0x0001000100010001, 0x0001000100010001, 0x0001000100010001, 0x0001000100010001,
                                        0, 0, 0, 0);
    return _mm512_permutexvar_epi16(_mm512_add_epi16(hi, _mm512_set1_epi16((short)(8 * p + 2 * j))), z[0]);
  }
  const __m512i q8 = _mm512_set_epi64(0x0003000300030003, 0x0003000300030003, 0x0002000200020002, 0x0002000200020002,
                                      0x0001000100010001, 0x0001000100010001, 0, 0);
  return _mm512_permutexvar_epi16(_mm512_add_epi16(q8, _mm512_set1_epi16((short)(16 * (p % 2) + 4 * j))), z[p / 2]);
}

/* Row j's 16 groups (int16, the low 256 bits) from a record's pair of vectors. */
TGT512_INL __m512i v_kpk_row16(enum ms_dtype t, const __m512i *z, int j) {
  /* group h: ns 8 lane 8 (h / 4) + 2j + (h / 2) % 2; ns 16 lane 32 (h / 8) + 16 ((h / 4) % 2) + 4j + h % 4 */
  const __m512i i8 = _mm512_set_epi16(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 25, 25, 24, 24, 17, 17, 16, 16, 9, 9,
                                      8, 8, 1, 1, 0, 0);
  const __m512i i16 = _mm512_set_epi16(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 51, 50, 49, 48, 35, 34, 33, 32, 19,
                                       18, 17, 16, 3, 2, 1, 0);
  __m512i r;
  if (KP_NS(t) == 8)
    r = _mm512_permutexvar_epi16(_mm512_add_epi16(i8, _mm512_set1_epi16((short)(2 * j))), z[0]);
  else
    r = _mm512_permutex2var_epi16(z[0], _mm512_add_epi16(i16, _mm512_set1_epi16((short)(4 * j))), z[1]);
  return _mm512_zextsi256_si512(_mm512_castsi512_si256(r));
}

/* msum of (row j, input b) in lane 4b + j for the types with one minimum a
 * piece (zm: v_kpk_rec's, int32 word 4p + j = row j's minimums of pieces 2p,
 * 2p + 1): the inputs' group sums added in pairs to piece sums (at most 32 *
 * 127: int16), packed to words, and four vpdpwssd over the piece pairs, each
 * operand's words laid out by one permute. No reduction: the lanes are the sums. */
TGT512_INL __m512i v_kpk_msum8(__m512i zm, const int16_t *bs, size_t ld, const int NB) {
  __m256i v[4];
  for (int b = 0; b < 4; b++)
    v[b] = b < NB ? _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)(bs + (size_t)b * ld)), _mm256_set1_epi16(1))
                  : _mm256_setzero_si256();
  /* word 8 (b & 1) + 2 (b >> 1) + (k & 1) + 4 (k >> 1): input b's pieces 2k, 2k + 1 */
  __m512i w = _mm512_packs_epi32(_mm512_inserti64x4(_mm512_castsi256_si512(v[0]), v[1], 1),
                                 _mm512_inserti64x4(_mm512_castsi256_si512(v[2]), v[3], 1));
  const __m512i jj = _mm512_setr_epi32(0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3);
  const __m512i bb = _mm512_setr_epi32(0, 0, 0, 0, 8, 8, 8, 8, 2, 2, 2, 2, 10, 10, 10, 10);
  __m512i m = _mm512_setzero_si512();
  for (int k = 0; k < 4; k++)
    m = _mm512_dpwssd_epi32(m, _mm512_permutexvar_epi32(_mm512_add_epi32(jj, _mm512_set1_epi32(4 * k)), zm),
                            _mm512_permutexvar_epi32(_mm512_add_epi32(bb, _mm512_set1_epi32((k & 1) + 4 * (k >> 1))), w));
  return m;
}

TGT512_INL void v_kpk_tile(enum ms_dtype t, const int NB, const uint8_t *qg, const uint8_t *hg, const uint8_t *sg,
                           const struct ms_q8_act *a, int b0, int nsb, int ahead, float *y, int ldy) {
  const int kmin = KP_KMIN(t), off = K_OFF(t), ns = KP_NS(t), n = a->n;
  const int8_t *q0 = a->q + (size_t)b0 * (size_t)n;
  const int16_t *bs0 = a->bs + (size_t)b0 * 16 * (size_t)nsb;
  const float *d0 = a->d + (size_t)b0 * (size_t)nsb;
  __m512 acc = _mm512_setzero_ps();  /* lane 4b + j: (row j, input b) */
  for (int sb = 0; sb < nsb; sb++) {
    const uint8_t *sr = sg + (size_t)sb * KP_SB(t), *dr = sr + 4 * ns * (1 + KP_MINS(t));
#define BS(b) _mm512_zextsi256_si512(_mm256_loadu_si256((const __m256i *)(bs0 + 16 * ((size_t)(b) * (size_t)nsb + (size_t)sb))))
    __m512i z[2], zm[2], I[4][4];
    v_kpk_rec(t, sr, z, zm);
    for (int b = 0; b < 4; b++)
      for (int j = 0; j < 4; j++) I[b][j] = _mm512_setzero_si512();
    if (off)  /* -K_OFF sum_h sc[h] bs[h] */
      for (int j = 0; j < 4; j++) {
        __m512i r = _mm512_slli_epi16(v_kpk_row16(t, z, j), off == 4 ? 2 : 5);
        for (int b = 0; b < NB; b++) I[b][j] = _mm512_dpwssd_epi32(I[b][j], _mm512_sub_epi16(_mm512_setzero_si512(), BS(b)), r);
      }
#pragma GCC unroll 4
    for (int p = 0; p < 4; p++) {
      const uint8_t *qp = qg + ((size_t)sb * 4 + (size_t)p) * KP_QB(t), *hp = hg + ((size_t)sb * 4 + (size_t)p) * KP_HB(t);
      const int8_t *qx = q0 + (size_t)(8 * sb + 2 * p) * QK;
      if (ahead) {
        for (int k = 0; k < KP_QB(t); k += 64) Q8_PF(qp + k, 1, 1);
        if (KP_HB(t)) Q8_PF(hp, 1, 2);
      }
      /* one row's weights and scales live at a time, the inputs from memory; the rows written out, so
       * each one's unpacking is straight-line code */
#define KROW(J)                                                                                                     \
  do {                                                                                                              \
    __m512i w = v_kpk_w(t, qp, hp, J), sc = v_kpk_sc16(t, z, p, J);                                                  \
    for (int b = 0; b < NB; b++)                                                                                    \
      I[b][J] = _mm512_dpwssd_epi32(I[b][J], _mm512_maddubs_epi16(w, _mm512_loadu_si512((const void *)(qx + (size_t)b * (size_t)n))), sc); \
  } while (0)
      KROW(0);
      KROW(1);
      KROW(2);
      KROW(3);
#undef KROW
    }
    float dxs[4] = {0};
    for (int b = 0; b < NB; b++) dxs[b] = d0[(size_t)b * (size_t)nsb + (size_t)sb];
    __m512 dx = v_x4(_mm_loadu_ps(dxs));
    __m512 d = _mm512_broadcast_f32x4(_mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)dr)));
    __m512i isum;
    if (NB == 1) {
      isum = v_red4(I[0]);
    } else {
      __m512i x[16];
      for (int b = 0; b < 4; b++)
        for (int j = 0; j < 4; j++) x[4 * b + j] = I[b][j];
      isum = v_red16(x);
    }
    acc = _mm512_fmadd_ps(_mm512_mul_ps(d, dx), _mm512_cvtepi32_ps(isum), acc);
    if (kmin) {
      __m512 dm = _mm512_broadcast_f32x4(_mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)(dr + 8))));
      __m512i mn[4], msum;
      for (int j = 0; j < 4; j++) mn[j] = ns == 8 ? _mm512_setzero_si512() : v_kpk_row16(t, zm, j);
      if (ns == 8) {  /* Q4_K, Q5_K: one minimum a piece, so the input's piece sums (v_kpk_msum8) */
        msum = v_kpk_msum8(zm[0], bs0 + 16 * (size_t)sb, 16 * (size_t)nsb, NB);
      } else if (NB == 1) {  /* rows (0, 1) and (2, 3) in the halves of two vectors */
        __m512i b2 = _mm512_broadcast_i64x4(_mm512_castsi512_si256(BS(0)));
        __m512i m0 = _mm512_dpwssd_epi32(_mm512_setzero_si512(), b2, _mm512_inserti64x4(mn[0], _mm512_castsi512_si256(mn[1]), 1));
        __m512i m1 = _mm512_dpwssd_epi32(_mm512_setzero_si512(), b2, _mm512_inserti64x4(mn[2], _mm512_castsi512_si256(mn[3]), 1));
        __m512i x[8] = {m0, m1, _mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512(),
                        _mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512()};
        /* v_red8h's entries: m0's halves land in lanes 0 and 4 (rows 0, 1), m1's in 1 and 5 (rows 2, 3) */
        msum = _mm512_permutexvar_epi32(_mm512_setr_epi32(0, 4, 1, 5, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), v_red8h(x));
      } else {
        __m512i x[8];
        for (int k = 0; k < 8; k++) {
          int j = k % 4, bp = 2 * (k / 4);
          if (bp < NB) {
            __m512i b2 = _mm512_inserti64x4(BS(bp), _mm512_castsi512_si256(bp + 1 < NB ? BS(bp + 1) : _mm512_setzero_si512()), 1);
            x[k] = _mm512_dpwssd_epi32(_mm512_setzero_si512(), b2, _mm512_inserti64x4(mn[j], _mm512_castsi512_si256(mn[j]), 1));
          } else {
            x[k] = _mm512_setzero_si512();
          }
        }
        msum = v_red8h(x);
      }
      acc = _mm512_fnmadd_ps(_mm512_mul_ps(dm, dx), _mm512_cvtepi32_ps(msum), acc);
    }
#undef BS
  }
  float o[16];
  _mm512_storeu_ps(o, acc);
  for (int b = 0; b < NB; b++)
    for (int j = 0; j < 4; j++) y[(size_t)(b0 + b) * ldy + j] = o[4 * b + j];
}

/* Batch 1 on a packed K-quant group: v_kpk_tile for one input, its stream prefetched. */
TGT512_INL void v_kpk_rows4_x1(enum ms_dtype t, const uint8_t *qg, const uint8_t *hg, const uint8_t *sg,
                               const struct ms_q8_act *a, int nsb, float *y) {
  v_kpk_tile(t, 1, qg, hg, sg, a, 0, nsb, 1, y, 1);
}

/* v_kpk_tile for nb (1 .. 4) input rows: one unrolled instance each. */
TGT512_INL void v_kpk_rows4_x4(enum ms_dtype t, const uint8_t *qg, const uint8_t *hg, const uint8_t *sg,
                               const struct ms_q8_act *a, int b0, int nb, int nsb, float *y, int ldy) {
  switch (nb) {
  case 4: v_kpk_tile(t, 4, qg, hg, sg, a, b0, nsb, 0, y, ldy); break;
  case 3: v_kpk_tile(t, 3, qg, hg, sg, a, b0, nsb, 0, y, ldy); break;
  case 2: v_kpk_tile(t, 2, qg, hg, sg, a, b0, nsb, 0, y, ldy); break;
  default: v_kpk_tile(t, 1, qg, hg, sg, a, b0, nsb, 0, y, ldy); break;
  }
}

/* Batches over one, packed K-quants: each whole group of four against the
 * inputs four at a time, the rows outside whole groups from data. */
TGT512_INL void kpk_gemv_x4_t(enum ms_dtype t, const struct ms_weight *w, int r0, int r1, const struct ms_q8_act *a,
                              float *y, int ldy) {
  int nsb = a->n / 256, g0, g1, P0, PN;
  pk_groups(w, r0, r1, &g0, &g1, &P0, &PN);
  if (g0 >= g1) {
    q8_k_gemv_avx512_t(t, w, r0, r1, a, y, ldy);
    return;
  }
  size_t n = (size_t)PN * (size_t)nsb;
  const uint8_t *qs = w->packed, *hs = qs + n * 4 * KP_QB(t), *ss = hs + n * 4 * KP_HB(t);
  if (r0 < 4 * g0) q8_k_gemv_avx512_t(t, w, r0, 4 * g0, a, y, ldy);
  for (int g = g0; g < g1; g++) {
    size_t at = (size_t)(g - P0) * (size_t)nsb;
    for (int b0 = 0; b0 < a->nb; b0 += 4)
      v_kpk_rows4_x4(t, qs + at * 4 * KP_QB(t), hs + at * 4 * KP_HB(t), ss + at * KP_SB(t), a, b0,
                     a->nb - b0 < 4 ? a->nb - b0 : 4, nsb, y + 4 * g - r0, ldy);
  }
  if (4 * g1 < r1) q8_k_gemv_avx512_t(t, w, 4 * g1, r1, a, y + 4 * g1 - r0, ldy);
}

/* One function per type (the tile's code specialised to it; profiles name each). */
#define KPK_X4(name, T)                                                                                              \
  TGT512 static __attribute__((noinline)) void name(const struct ms_weight *w, int r0, int r1,                       \
                                                    const struct ms_q8_act *a, float *y, int ldy) {                  \
    kpk_gemv_x4_t(T, w, r0, r1, a, y, ldy);                                                                          \
  }
KPK_X4(kpk_x4_q2k, MS_DTYPE_Q2_K)
KPK_X4(kpk_x4_q3k, MS_DTYPE_Q3_K)
KPK_X4(kpk_x4_q4k, MS_DTYPE_Q4_K)
KPK_X4(kpk_x4_q5k, MS_DTYPE_Q5_K)
KPK_X4(kpk_x4_q6k, MS_DTYPE_Q6_K)
#undef KPK_X4

/* Batch 1, packed K-quants: the whole groups of four in [r0, r1) from the
 * packed regions, the rows before and after them from data. */
TGT512_INL void kpk_gemv_x1_t(enum ms_dtype t, const struct ms_weight *w, int r0, int r1, const struct ms_q8_act *a,
                              float *y) {
  int nsb = a->n / 256, g0, g1, P0, PN;
  pk_groups(w, r0, r1, &g0, &g1, &P0, &PN);
  if (g0 >= g1) {
    q8_k_gemv_avx512_t(t, w, r0, r1, a, y, 1);
    return;
  }
  size_t n = (size_t)PN * (size_t)nsb;
  const uint8_t *qs = w->packed, *hs = qs + n * 4 * KP_QB(t), *ss = hs + n * 4 * KP_HB(t);
  if (r0 < 4 * g0) q8_k_gemv_avx512_t(t, w, r0, 4 * g0, a, y, 1);
  for (int g = g0; g < g1; g++) {
    size_t at = (size_t)(g - P0) * (size_t)nsb;
    v_kpk_rows4_x1(t, qs + at * 4 * KP_QB(t), hs + at * 4 * KP_HB(t), ss + at * KP_SB(t), a, nsb, y + 4 * g - r0);
  }
  if (4 * g1 < r1) q8_k_gemv_avx512_t(t, w, 4 * g1, r1, a, y + 4 * g1 - r0, 1);
}

TGT512 static void pk_gemv_x1(const struct ms_weight *w, int r0, int r1, const struct ms_q8_act *a, float *y) {
  switch (w->dtype) {  /* one instance per type */
  case MS_DTYPE_Q2_K: kpk_gemv_x1_t(MS_DTYPE_Q2_K, w, r0, r1, a, y); break;
  case MS_DTYPE_Q3_K: kpk_gemv_x1_t(MS_DTYPE_Q3_K, w, r0, r1, a, y); break;
  case MS_DTYPE_Q4_K: kpk_gemv_x1_t(MS_DTYPE_Q4_K, w, r0, r1, a, y); break;
  case MS_DTYPE_Q5_K: kpk_gemv_x1_t(MS_DTYPE_Q5_K, w, r0, r1, a, y); break;
  case MS_DTYPE_Q6_K: kpk_gemv_x1_t(MS_DTYPE_Q6_K, w, r0, r1, a, y); break;
  case MS_DTYPE_Q8_0: pk_gemv_t(MS_DTYPE_Q8_0, w, r0, r1, a, y, 1); break;
  case MS_DTYPE_Q4_0: pk_gemv_t(MS_DTYPE_Q4_0, w, r0, r1, a, y, 1); break;
  case MS_DTYPE_Q4_1: pk_gemv_t(MS_DTYPE_Q4_1, w, r0, r1, a, y, 1); break;
  case MS_DTYPE_Q5_0: pk_gemv_t(MS_DTYPE_Q5_0, w, r0, r1, a, y, 1); break;
  default: pk_gemv_t(MS_DTYPE_Q5_1, w, r0, r1, a, y, 1); break;
  }
}

/* 1 when the AVX-512 path took it (the packed forms and the K-quants; the
 * 32-element types' file layout is the AVX2 path's). */
TGT512 static int q8_gemv_avx512(const struct ms_weight *w, int r0, int r1, const struct ms_q8_act *a, float *y,
                                 int ldy) {
  if (w->packed && a->nb == 1) {
    pk_gemv_x1(w, r0, r1, a, y);
    return 1;
  }
  if (w->packed)
    switch (w->dtype) {  /* one instance per type */
    case MS_DTYPE_Q2_K: kpk_x4_q2k(w, r0, r1, a, y, ldy); return 1;
    case MS_DTYPE_Q3_K: kpk_x4_q3k(w, r0, r1, a, y, ldy); return 1;
    case MS_DTYPE_Q4_K: kpk_x4_q4k(w, r0, r1, a, y, ldy); return 1;
    case MS_DTYPE_Q5_K: kpk_x4_q5k(w, r0, r1, a, y, ldy); return 1;
    case MS_DTYPE_Q6_K: kpk_x4_q6k(w, r0, r1, a, y, ldy); return 1;
    case MS_DTYPE_Q8_0: pk_gemv_t(MS_DTYPE_Q8_0, w, r0, r1, a, y, ldy); return 1;
    case MS_DTYPE_Q4_0: pk_gemv_t(MS_DTYPE_Q4_0, w, r0, r1, a, y, ldy); return 1;
    case MS_DTYPE_Q4_1: pk_gemv_t(MS_DTYPE_Q4_1, w, r0, r1, a, y, ldy); return 1;
    case MS_DTYPE_Q5_0: pk_gemv_t(MS_DTYPE_Q5_0, w, r0, r1, a, y, ldy); return 1;
    case MS_DTYPE_Q5_1: pk_gemv_t(MS_DTYPE_Q5_1, w, r0, r1, a, y, ldy); return 1;
    default: break;
    }
  switch (w->dtype) {  /* one instance per type: kq_bytes' switch folds away */
  case MS_DTYPE_Q2_K: q8_k_gemv_avx512_t(MS_DTYPE_Q2_K, w, r0, r1, a, y, ldy); return 1;
  case MS_DTYPE_Q3_K: q8_k_gemv_avx512_t(MS_DTYPE_Q3_K, w, r0, r1, a, y, ldy); return 1;
  case MS_DTYPE_Q4_K: q8_k_gemv_avx512_t(MS_DTYPE_Q4_K, w, r0, r1, a, y, ldy); return 1;
  case MS_DTYPE_Q5_K: q8_k_gemv_avx512_t(MS_DTYPE_Q5_K, w, r0, r1, a, y, ldy); return 1;
  case MS_DTYPE_Q6_K: q8_k_gemv_avx512_t(MS_DTYPE_Q6_K, w, r0, r1, a, y, ldy); return 1;
  case MS_DTYPE_Q8_K: q8_k_gemv_avx512_t(MS_DTYPE_Q8_K, w, r0, r1, a, y, ldy); return 1;
  default: return 0;
  }
}

TGT static void q8_gemv_avx2(const struct ms_weight *w, int r0, int r1, const struct ms_q8_act *a, float *y,
                             int ldy) {
  if (w->packed)
    switch (w->dtype) {  /* one instance per type */
    case MS_DTYPE_Q8_0: a_pk_gemv_t(MS_DTYPE_Q8_0, w, r0, r1, a, y, ldy); return;
    case MS_DTYPE_Q4_0: a_pk_gemv_t(MS_DTYPE_Q4_0, w, r0, r1, a, y, ldy); return;
    case MS_DTYPE_Q4_1: a_pk_gemv_t(MS_DTYPE_Q4_1, w, r0, r1, a, y, ldy); return;
    case MS_DTYPE_Q5_0: a_pk_gemv_t(MS_DTYPE_Q5_0, w, r0, r1, a, y, ldy); return;
    case MS_DTYPE_Q5_1: a_pk_gemv_t(MS_DTYPE_Q5_1, w, r0, r1, a, y, ldy); return;
    default: break;
    }
  switch (w->dtype) {
  case MS_DTYPE_Q5_0: q8_gemv_avx2_t(MS_DTYPE_Q5_0, w, r0, r1, a, y, ldy); return;
  case MS_DTYPE_Q5_1: q8_gemv_avx2_t(MS_DTYPE_Q5_1, w, r0, r1, a, y, ldy); return;
  case MS_DTYPE_IQ4_NL: q8_gemv_avx2_t(MS_DTYPE_IQ4_NL, w, r0, r1, a, y, ldy); return;
  default: break;
  }
  if (a_kpk_gemv(w, r0, r1, a, y, ldy)) return;
  if (ms_quant_k_handles(w->dtype)) {
    q8_k_gemv_avx2(w, r0, r1, a, y, ldy);
    return;
  }
  switch (w->dtype) {
  case MS_DTYPE_Q8_0: q8_gemv_avx2_t(MS_DTYPE_Q8_0, w, r0, r1, a, y, ldy); break;
  case MS_DTYPE_Q4_0: q8_gemv_avx2_t(MS_DTYPE_Q4_0, w, r0, r1, a, y, ldy); break;
  case MS_DTYPE_Q4_1: q8_gemv_avx2_t(MS_DTYPE_Q4_1, w, r0, r1, a, y, ldy); break;
  default: break;
  }
}
#endif

/* Input row b of a, quantized from xb. */
static void q8_row(const float *xb, int n, int qk, struct ms_q8_act *a, int b, int simd) {
  size_t nblk = (size_t)(n / qk);
  int8_t *q = a->q + (size_t)b * (size_t)n;
  float *d = a->d + (size_t)b * nblk, *s = a->s ? a->s + (size_t)b * nblk : NULL;
  int16_t *bs = a->bs + (size_t)b * (size_t)(n / 16);
#ifdef MS_X86
  if (simd && have_f16c) {
    q8_row_avx2(xb, n, qk, q, d, s, bs);
    return;
  }
#else
  (void)simd;
#endif
  q8_row_portable(xb, n, qk, q, d, s, bs);
}

/* A row's q as the packed 32-element kernels read it (quant.h, ms_q8_act.qa): for
 * each four blocks 4Q .. 4Q + 3, step s (0..7) is the 16 bytes q[4Q + k][4s ..
 * 4s + 3] for k = 0..3; the last nblk % 4 blocks the same with nblk % 4 of them. */
static void q8_arrange(const int8_t *q, int n, int8_t *qa) {
  int nblk = n / QK;
  for (int i = 0; i < nblk; i += 4) {
    int nk = nblk - i < 4 ? nblk - i : 4;
    for (int s = 0; s < 8; s++)
      for (int k = 0; k < nk; k++, qa += 4) memcpy(qa, q + (size_t)(i + k) * QK + 4 * s, 4);
  }
}

void ms_q8_quantize(struct ms_q8_act *a, void *buf, const float *x, int ldx, int nb, int n, int qk, int simd) {
  MS_ASSERT((qk == QK || qk == 256) && n % qk == 0);
  size_t nblk = (size_t)(n / qk), n32 = qk == QK ? nblk : 0;
  *a = (struct ms_q8_act){.n = n, .nb = nb, .qk = qk, .q = buf};
  a->d = (float *)(a->q + (size_t)nb * (size_t)n);
  a->s = n32 ? a->d + (size_t)nb * nblk : NULL;
  a->bs = (int16_t *)(a->d + (size_t)nb * (nblk + n32));
  a->qa = n32 ? (int8_t *)(a->bs + (size_t)nb * (size_t)(n / 16)) : NULL;  /* the K-quants' kernels never read it */
  for (int b = 0; b < nb; b++) {
    q8_row(x + (size_t)b * (size_t)ldx, n, qk, a, b, simd);
    if (a->qa) q8_arrange(a->q + (size_t)b * (size_t)n, n, a->qa + (size_t)b * (size_t)n);
  }
}

void ms_q8_gemv(const struct ms_weight *w, int r0, int r1, const struct ms_q8_act *a, float *y, int ldy,
                int simd) {
  MS_ASSERT(ms_q8_handles(w->dtype) && a->n == w->cols && a->qk == ms_q8_qk(w->dtype));
#ifdef MS_X86
  if (simd >= 2 && have_vnni512 && q8_gemv_avx512(w, r0, r1, a, y, ldy)) return;
  if (simd && have_f16c) {
    q8_gemv_avx2(w, r0, r1, a, y, ldy);
    return;
  }
#endif
  q8_gemv_portable(w, r0, r1, a, y, ldy);
}
