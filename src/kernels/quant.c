/* SPDX-License-Identifier: MIT */
/* Quantized and half-precision GEMV, and the quantizers. See quant.h.
 *
 * Both paths walk a weight row block by block: the portable one expands a block
 * into 32 floats on the stack, the AVX2 one into four registers, and each batch
 * row then takes its dot product with that block. Accumulation is in f32, one
 * running sum per batch row in a fixed order, so results do not depend on how
 * the rows are tiled or which thread runs them. */
#include "kernels/quant.h"

#include <errno.h>
#include <float.h>
#include <math.h>
#include <string.h>

#if defined(__x86_64__)
#include <immintrin.h>
#define MS_X86 1
#endif

#define QK 32

static int have_f16c;

#ifdef MS_X86
__attribute__((constructor)) static void quant_detect(void) {
  __builtin_cpu_init();
  have_f16c = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
              __builtin_cpu_supports("f16c");
}
#endif

int ms_quant_handles(enum ms_dtype t) {
  return t == MS_DTYPE_F16 || t == MS_DTYPE_Q8_0 || t == MS_DTYPE_Q4_0 || t == MS_DTYPE_Q4_1;
}

static inline uint16_t rd16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }

static inline void wr16(uint8_t *p, uint16_t v) {
  p[0] = (uint8_t)v;
  p[1] = (uint8_t)(v >> 8);
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

static void gemv_portable(const struct ms_weight *w, int r0, int r1, const float *x, int ldx, int nb,
                          float *y, int ldy) {
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

TGT static inline float hsum(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_add_ps(lo, hi);
  lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
  return _mm_cvtss_f32(lo);
}

TGT static inline float h2f(const uint8_t *p) { return _cvtsh_ss(rd16(p)); }

/* Block b of the row into w[0..3] (elements 0-7, 8-15, 16-23, 24-31). */
TGT static inline void block_regs(enum ms_dtype t, const uint8_t *b, __m256 *w) {
  __m256 d = _mm256_set1_ps(h2f(b));
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

TGT static void gemv_avx2(const struct ms_weight *w, int r0, int r1, const float *x, int ldx, int nb,
                          float *y, int ldy) {
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

/* ---- quantizers (ggml's reference rounding) ---- */

static void quant_q8_0(const float *x, uint8_t *b) {
  float amax = 0.0f;
  for (int j = 0; j < QK; j++) amax = fmaxf(amax, fabsf(x[j]));
  float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
  wr16(b, ms_f32_to_f16(d));
  for (int j = 0; j < QK; j++) b[2 + j] = (uint8_t)(int8_t)roundf(x[j] * id);
}

static void quant_q4_0(const float *x, uint8_t *b) {
  float amax = 0.0f, max = 0.0f;
  for (int j = 0; j < QK; j++)
    if (amax < fabsf(x[j])) amax = fabsf(x[j]), max = x[j];
  float d = max / -8.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
  wr16(b, ms_f32_to_f16(d));
  for (int j = 0; j < QK / 2; j++) {
    int q0 = (int8_t)(x[j] * id + 8.5f), q1 = (int8_t)(x[j + QK / 2] * id + 8.5f);
    q0 = q0 < 15 ? q0 : 15;
    q1 = q1 < 15 ? q1 : 15;
    b[2 + j] = (uint8_t)(q0 | q1 << 4);
  }
}

static void quant_q4_1(const float *x, uint8_t *b) {
  float min = FLT_MAX, max = -FLT_MAX;
  for (int j = 0; j < QK; j++) {
    if (x[j] < min) min = x[j];
    if (x[j] > max) max = x[j];
  }
  float d = (max - min) / 15.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
  wr16(b, ms_f32_to_f16(d));
  wr16(b + 2, ms_f32_to_f16(min));
  for (int j = 0; j < QK / 2; j++) {
    int q0 = (int8_t)((x[j] - min) * id + 0.5f), q1 = (int8_t)((x[j + QK / 2] - min) * id + 0.5f);
    q0 = q0 < 15 ? q0 : 15;
    q1 = q1 < 15 ? q1 : 15;
    b[4 + j] = (uint8_t)(q0 | q1 << 4);
  }
}

int ms_quant_row(enum ms_dtype t, const float *x, int n, void *out) {
  uint8_t *o = out;
  int blk = ms_dtype_block(t);
  if (blk <= 0 || n < 0 || n % blk) return -EINVAL;
  size_t bs = ms_dtype_size(t);
  for (int i = 0; i < n / blk; i++, x += blk, o += bs) {
    switch (t) {
    case MS_DTYPE_F32: memcpy(o, x, sizeof(float)); break;
    case MS_DTYPE_BF16: wr16(o, ms_f32_to_bf16(*x)); break;
    case MS_DTYPE_F16: wr16(o, ms_f32_to_f16(*x)); break;
    case MS_DTYPE_Q8_0: quant_q8_0(x, o); break;
    case MS_DTYPE_Q4_0: quant_q4_0(x, o); break;
    case MS_DTYPE_Q4_1: quant_q4_1(x, o); break;
    default: return -EINVAL;
    }
  }
  return 0;
}
