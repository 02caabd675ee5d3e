/* SPDX-License-Identifier: MIT */
/* Vector kernels, AVX2/FMA and portable. See vec.h. */
#include "kernels/vec.h"

#include <math.h>

#include "kernels/quant.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define MS_X86 1
#endif

static int use_simd;

#ifdef MS_X86
__attribute__((constructor)) static void vec_detect(void) {
  __builtin_cpu_init();
  use_simd = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}
#endif

int ms_vec_simd(void) { return use_simd; }

void ms_vec_force_portable(int on) {
#ifdef MS_X86
  if (on)
    use_simd = 0;
  else
    vec_detect();
#endif
}

/* ---- portable ---- */

static float row_get(const struct ms_weight *w, const void *row, int c) {
  return w->dtype == MS_DTYPE_BF16 ? ms_bf16_to_f32(((const uint16_t *)row)[c])
                                   : ((const float *)row)[c];
}

static void gemv_portable(const struct ms_weight *w, int r0, int r1, const float *x, int ldx,
                          int nb, float *y, int ldy) {
  size_t rb = ms_weight_row_bytes(w);
  for (int r = r0; r < r1; r++) {
    const void *row = (const char *)w->data + (size_t)r * rb;
    for (int b = 0; b < nb; b++) {
      const float *xb = x + (size_t)b * ldx;
      float s = 0.0f;
      for (int c = 0; c < w->cols; c++) s += row_get(w, row, c) * xb[c];
      y[(size_t)b * ldy + (r - r0)] = s;
    }
  }
}

/* ---- AVX2 / FMA ---- */
#ifdef MS_X86
__attribute__((target("avx2,fma"))) static inline float hsum256(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_add_ps(lo, hi);
  lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
  return _mm_cvtss_f32(lo);
}

__attribute__((target("avx2,fma"))) static inline __m256 load8(const void *row, int c, int bf16) {
  if (bf16) {
    __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)row + c));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  return _mm256_loadu_ps((const float *)row + c);
}

/* One weight row against up to four batch rows: the row is loaded once per
 * eight columns and reused from registers for every batch row. */
__attribute__((target("avx2,fma"))) static void row_x4(const struct ms_weight *w, const void *row,
                                                       const float *x, int ldx, int nb, float *out) {
  int bf16 = w->dtype == MS_DTYPE_BF16, n = w->cols, n8 = n & ~7;
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  for (int c = 0; c < n8; c += 8) {
    __m256 wv = load8(row, c, bf16);
    a0 = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + c), a0);
    if (nb > 1) a1 = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + ldx + c), a1);
    if (nb > 2) a2 = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + 2 * (size_t)ldx + c), a2);
    if (nb > 3) a3 = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + 3 * (size_t)ldx + c), a3);
  }
  float s[4] = {hsum256(a0), hsum256(a1), hsum256(a2), hsum256(a3)};
  for (int c = n8; c < n; c++) {
    float wc = row_get(w, row, c);
    for (int b = 0; b < nb; b++) s[b] += wc * x[(size_t)b * ldx + c];
  }
  for (int b = 0; b < nb; b++) out[b] = s[b];
}

__attribute__((target("avx2,fma"))) static void gemv_avx2(const struct ms_weight *w, int r0, int r1,
                                                          const float *x, int ldx, int nb, float *y,
                                                          int ldy) {
  size_t rb = ms_weight_row_bytes(w);
  for (int r = r0; r < r1; r++) {
    const void *row = (const char *)w->data + (size_t)r * rb;
    for (int b0 = 0; b0 < nb; b0 += 4) {
      int n = nb - b0 < 4 ? nb - b0 : 4;
      float out[4];
      row_x4(w, row, x + (size_t)b0 * ldx, ldx, n, out);
      for (int b = 0; b < n; b++) y[(size_t)(b0 + b) * ldy + (r - r0)] = out[b];
    }
  }
}

__attribute__((target("avx2,fma"))) static float dot_avx2(const float *a, const float *b, int n) {
  __m256 acc = _mm256_setzero_ps();
  int i = 0;
  for (; i + 8 <= n; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
  float s = hsum256(acc);
  for (; i < n; i++) s += a[i] * b[i];
  return s;
}
#endif

void ms_vec_gemv(const struct ms_weight *w, int r0, int r1, const float *x, int ldx, int nb,
                 float *y, int ldy) {
  if (ms_quant_handles(w->dtype)) {  /* f16 and the block formats: kernels/quant.c */
    ms_quant_gemv(w, r0, r1, x, ldx, nb, y, ldy, use_simd);
    return;
  }
#ifdef MS_X86
  if (use_simd) {
    gemv_avx2(w, r0, r1, x, ldx, nb, y, ldy);
    return;
  }
#endif
  gemv_portable(w, r0, r1, x, ldx, nb, y, ldy);
}

void ms_vec_q8_quantize(struct ms_q8_act *a, void *buf, const float *x, int ldx, int nb, int n) {
  ms_q8_quantize(a, buf, x, ldx, nb, n, use_simd);
}

void ms_vec_q8_gemv(const struct ms_weight *w, int r0, int r1, const struct ms_q8_act *a, float *y, int ldy) {
  ms_q8_gemv(w, r0, r1, a, y, ldy, use_simd ? 2 : 0);
}

float ms_vec_dot(const float *a, const float *b, int n) {
#ifdef MS_X86
  if (use_simd) return dot_avx2(a, b, n);
#endif
  float s = 0.0f;
  for (int i = 0; i < n; i++) s += a[i] * b[i];
  return s;
}

void ms_vec_axpy(float *y, float a, const float *x, int n) {
  for (int i = 0; i < n; i++) y[i] += a * x[i];
}

void ms_vec_rmsnorm(float *out, const float *x, const float *w, int n, float eps) {
  float ss = 0.0f;
  for (int i = 0; i < n; i++) ss += x[i] * x[i];
  float inv = 1.0f / sqrtf(ss / (float)n + eps);
  for (int i = 0; i < n; i++) out[i] = x[i] * inv * w[i];
}
