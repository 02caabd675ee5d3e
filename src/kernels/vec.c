/* SPDX-License-Identifier: MIT */
/* Vector kernels, AVX2/FMA and portable. See vec.h. */
#include "kernels/vec.h"

#include <math.h>
#include <string.h>

#include "kernels/quant.h"
#include "megascope/base.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define MS_X86 1
#endif

static int use_simd;

#ifdef MS_X86
__attribute__((constructor)) static void vec_detect(void) {
  use_simd = ms_cpu_level() >= MS_CPU_AVX2;
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

__attribute__((target("avx2,fma"))) static inline float hmax256(__m256 v) {
  __m128 lo = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  lo = _mm_max_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_max_ss(lo, _mm_movehdup_ps(lo));
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

void ms_vec_q8_quantize(struct ms_q8_act *a, void *buf, const float *x, int ldx, int nb, int n, int qk) {
  ms_q8_quantize(a, buf, x, ldx, nb, n, qk, use_simd);
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

#ifdef MS_X86
/* Positions a run of K or V rows is prefetched ahead of the one in hand. A
 * head's rows are a few lines, one KV row (every head's) apart, so the
 * hardware prefetchers miss most of them, and the weights' stream has evicted
 * them since the last step: without it SmolLM2's attention read its K and V at
 * about 6 GB/s on an Intel Xeon, an eighth of a step's time at 128 tokens. */
#define KV_AHEAD 8

/* The lines of `bytes` bytes at p, into L1. */
static inline void prefetch_span(const float *p, size_t bytes) {
  for (size_t b = 0; b < bytes; b += 64) _mm_prefetch((const char *)p + b, _MM_HINT_T0);
}

/* o[c0, c0 + 8 * nv) += w[p] * v[p] over the run: nv <= 8 accumulators, so a
 * run reads o once and writes it once; ahead: V's rows are prefetched (the
 * first head's pass of a slab: the others find them in L1). */
__attribute__((target("avx2,fma"))) static inline void axpy_block(float *o, const float *w, const float *v,
                                                                  size_t ld, int n, int nv, int ahead) {
  __m256 acc[8];
  for (int j = 0; j < nv; j++) acc[j] = _mm256_loadu_ps(o + 8 * j);
  for (int p = 0; p < n; p++) {
    __m256 a = _mm256_broadcast_ss(w + p);
    const float *vp = v + (size_t)p * ld;
    if (ahead && p + KV_AHEAD < n) prefetch_span(vp + KV_AHEAD * ld, sizeof(float) * 8 * (size_t)nv);
    for (int j = 0; j < nv; j++) acc[j] = _mm256_fmadd_ps(a, _mm256_loadu_ps(vp + 8 * j), acc[j]);
  }
  for (int j = 0; j < nv; j++) _mm256_storeu_ps(o + 8 * j, acc[j]);
}

/* The ng heads' o[g * hd + c] += w[g * sld + p] * v[p][c] over the run, a
 * column slab at a time for every head before the next: each head's floats
 * and order are axpy_block's alone, and the slab of V (the run's rows, 64
 * columns) is read from memory once and from L1 by the other heads. */
__attribute__((target("avx2,fma"))) static void axpy_runs_avx2(float *o, int ng, const float *w, size_t sld,
                                                               const float *v, size_t ld, int n, int hd) {
  for (int r = 0; r < KV_AHEAD && r < n; r++) prefetch_span(v + (size_t)r * ld, sizeof(float) * (size_t)hd);
  int c = 0;
  for (; c + 64 <= hd; c += 64)
    for (int g = 0; g < ng; g++) axpy_block(o + (size_t)g * hd + c, w + g * sld, v + c, ld, n, 8, g == 0);
  if (c + 8 <= hd)
    for (int g = 0; g < ng; g++)
      axpy_block(o + (size_t)g * hd + c, w + g * sld, v + c, ld, n, (hd - c) / 8, g == 0);
  for (c += (hd - c) / 8 * 8; c < hd; c++)
    for (int g = 0; g < ng; g++)
      for (int p = 0; p < n; p++) o[(size_t)g * hd + c] += w[g * sld + p] * v[(size_t)p * ld + c];
}
#endif

#ifdef MS_X86
/* Four positions' dots at once, each its own chain in dot_avx2's order (the
 * same floats): one chain waits on its FMA's latency, four fill the pipe. */
__attribute__((target("avx2,fma"))) static inline void dot4_avx2(const float *q, const float *k0, size_t ld, int hd,
                                                                 float scale, float *s) {
  const float *k1 = k0 + ld, *k2 = k1 + ld, *k3 = k2 + ld;
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  for (int i = 0; i < hd; i += 8) {
    __m256 qv = _mm256_loadu_ps(q + i);
    a0 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + i), a0);
    a1 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k1 + i), a1);
    a2 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k2 + i), a2);
    a3 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k3 + i), a3);
  }
  s[0] = hsum256(a0) * scale, s[1] = hsum256(a1) * scale;
  s[2] = hsum256(a2) * scale, s[3] = hsum256(a3) * scale;
}

/* The ng heads' dots against each four positions before the next four: the
 * positions' K rows come from memory once and from L1 for the other heads;
 * each (head, position) is dot_run's chain, so the bits are per head's. */
__attribute__((target("avx2,fma"))) static void dot_runs_avx2(const float *q, int ng, const float *k, size_t ld,
                                                              int n, int hd, float scale, float *s, size_t sld) {
  int p = 0;
  for (int r = 0; r < KV_AHEAD && r < n; r++) prefetch_span(k + (size_t)r * ld, sizeof(float) * (size_t)hd);
  for (; p + 4 <= n && hd % 8 == 0; p += 4) {
    for (int r = p + KV_AHEAD; r < p + KV_AHEAD + 4 && r < n; r++)
      prefetch_span(k + (size_t)r * ld, sizeof(float) * (size_t)hd);
    for (int g = 0; g < ng; g++) dot4_avx2(q + (size_t)g * hd, k + (size_t)p * ld, ld, hd, scale, s + g * sld + p);
  }
  for (; p < n; p++)
    for (int g = 0; g < ng; g++) s[g * sld + p] = dot_avx2(q + (size_t)g * hd, k + (size_t)p * ld, hd) * scale;
}
#endif

void ms_vec_dot_runs(const float *q, int ng, const float *k, size_t ld, int n, int hd, float scale, float *s,
                     size_t sld) {
#ifdef MS_X86
  if (use_simd) {
    dot_runs_avx2(q, ng, k, ld, n, hd, scale, s, sld);
    return;
  }
#endif
  for (int g = 0; g < ng; g++)
    for (int p = 0; p < n; p++) s[g * sld + p] = ms_vec_dot(q + (size_t)g * hd, k + (size_t)p * ld, hd) * scale;
}

#ifdef MS_X86
__attribute__((target("avx2,f16c"))) static void to_f16_avx2(uint16_t *d, const float *s, int n) {
  int i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128((__m128i *)(d + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(s + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  for (; i < n; i++) d[i] = ms_f32_to_f16(s[i]);
}

__attribute__((target("avx2,f16c"))) static void from_f16_avx2(float *d, const uint16_t *s, int n) {
  int i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(d + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + i))));
  for (; i < n; i++) d[i] = ms_f16_to_f32(s[i]);
}
#endif

void ms_vec_f32_to_f16(uint16_t *dst, const float *src, int n) {
#ifdef MS_X86
  if (use_simd) {
    to_f16_avx2(dst, src, n);
    return;
  }
#endif
  for (int i = 0; i < n; i++) dst[i] = ms_f32_to_f16(src[i]);
}

void ms_vec_f16_to_f32(float *dst, const uint16_t *src, int n) {
#ifdef MS_X86
  if (use_simd) {
    from_f16_avx2(dst, src, n);
    return;
  }
#endif
  for (int i = 0; i < n; i++) dst[i] = ms_f16_to_f32(src[i]);
}

void ms_vec_dot_run(const float *q, const float *k, size_t ld, int n, int hd, float scale, float *s) {
  ms_vec_dot_runs(q, 1, k, ld, n, hd, scale, s, 0);
}

void ms_vec_axpy_runs(float *o, int ng, const float *w, size_t sld, const float *v, size_t ld, int n, int hd) {
#ifdef MS_X86
  if (use_simd) {
    axpy_runs_avx2(o, ng, w, sld, v, ld, n, hd);
    return;
  }
#endif
  for (int g = 0; g < ng; g++)
    for (int p = 0; p < n; p++) ms_vec_axpy(o + (size_t)g * hd, w[g * sld + p], v + (size_t)p * ld, hd);
}

void ms_vec_axpy_run(float *o, const float *w, const float *v, size_t ld, int n, int hd) {
  ms_vec_axpy_runs(o, 1, w, 0, v, ld, n, hd);
}

#ifdef MS_X86
/* The sum of x[i]^2 in eight lanes (lane j the values j mod 8 apart, an FMA
 * each), then hsum256's order across them. */
__attribute__((target("avx2,fma"))) static float sumsq_avx2(const float *x, int n) {
  __m256 acc = _mm256_setzero_ps();
  int i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 v = _mm256_loadu_ps(x + i);
    acc = _mm256_fmadd_ps(v, v, acc);
  }
  if (i < n) {
    __m256i k = _mm256_cmpgt_epi32(_mm256_set1_epi32(n - i), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    __m256 v = _mm256_maskload_ps(x + i, k);  /* the lanes past n hold 0: +0 * 0 adds nothing */
    acc = _mm256_fmadd_ps(v, v, acc);
  }
  return hsum256(acc);
}
#endif

/* Eight lanes added across in hsum256's order: (0 + 4) + (2 + 6), (1 + 5) + (3 + 7). */
static inline float lanes8_total(const float *lane) {
  return ((lane[0] + lane[4]) + (lane[2] + lane[6])) + ((lane[1] + lane[5]) + (lane[3] + lane[7]));
}

/* sumsq_avx2's steps one value at a time: the same bits. */
static float sumsq_scalar(const float *x, int n) {
  float lane[8] = {0};
  for (int i = 0; i < n; i++) lane[i % 8] = fmaf(x[i], x[i], lane[i % 8]);
  return lanes8_total(lane);
}

/* The sum of squares in eight lanes on both paths (the same bits): one
 * chain of 576 dependent adds made SmolLM2's norm task about 0.8 us. */
void ms_vec_rmsnorm(float *out, const float *x, const float *w, int n, float eps) {
#ifdef MS_X86
  float ss = use_simd ? sumsq_avx2(x, n) : sumsq_scalar(x, n);
#else
  float ss = sumsq_scalar(x, n);
#endif
  float inv = 1.0f / sqrtf(ss / (float)n + eps);
  for (int i = 0; i < n; i++) out[i] = x[i] * inv * w[i];
}

/* ---- the gated FFN's activation ---- */

/* exp(x): x = n ln2 + r (ln2 in two parts), Cephes' degree-6 polynomial on r,
 * times 2^n built in the exponent bits; x clamped to [-87.3, 88.7] so 2^n
 * stays a normal float (exp's tails are 0 and inf, which the sigmoid takes as
 * 1 and 0 the same way). Within 2 ulp of expf. exp256 below takes these steps
 * eight lanes at a time, in this order, and fmaf rounds once as the FMA does:
 * both paths give the same bits. */
static inline float exp_poly(float x) {
  x = x > -87.3f ? x : -87.3f;  /* MAXPS, MINPS: a NaN becomes the bound */
  x = x < 88.7f ? x : 88.7f;
  float n = rintf(x * 1.44269504088896341f);  /* nearest, ties to even */
  float r = fmaf(-n, 0.693359375f, x);
  r = fmaf(-n, -2.12194440e-4f, r);
  float p = 1.9875691500e-4f;
  p = fmaf(p, r, 1.3981999507e-3f);
  p = fmaf(p, r, 8.3334519073e-3f);
  p = fmaf(p, r, 4.1665795894e-2f);
  p = fmaf(p, r, 1.6666665459e-1f);
  p = fmaf(p, r, 5.0000001201e-1f);
  float pr = p * r, y = fmaf(pr, r, r) + 1.0f;
  uint32_t e = (uint32_t)((int32_t)n + 127) << 23;
  float scale;
  memcpy(&scale, &e, sizeof scale);
  return y * scale;
}

/* The exponent's argument: k = g for SiLU, 2 * 0.7978845608 * (g + 0.044715
 * g^3) for GELU, as glu8 computes it. */
static inline float glu_k(float g, int gelu) {
  if (!gelu) return g;
  float g3 = g * g * g;
  return (2.0f * 0.7978845608f) * fmaf(0.044715f, g3, g);
}

#ifdef MS_X86
/* exp_poly eight lanes at a time. */
__attribute__((target("avx2,fma"))) static inline __m256 exp256(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3f)), _mm256_set1_ps(88.7f));
  __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                             _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  __m256 y = _mm256_add_ps(_mm256_fmadd_ps(_mm256_mul_ps(p, r), r, r), _mm256_set1_ps(1.0f));
  __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

__attribute__((target("avx2,fma"))) static inline __m256 glu8(__m256 gv, __m256 uv, int gelu) {
  __m256 k = gv;
  if (gelu) {
    __m256 g3 = _mm256_mul_ps(_mm256_mul_ps(gv, gv), gv);
    k = _mm256_mul_ps(_mm256_set1_ps(2.0f * 0.7978845608f), _mm256_fmadd_ps(_mm256_set1_ps(0.044715f), g3, gv));
  }
  __m256 den = _mm256_add_ps(_mm256_set1_ps(1.0f), exp256(_mm256_sub_ps(_mm256_setzero_ps(), k)));
  return _mm256_mul_ps(_mm256_div_ps(gv, den), uv);
}

__attribute__((target("avx2,fma"))) static void glu_avx2(float *out, const float *g, const float *u, int n, int gelu) {
  int i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, glu8(_mm256_loadu_ps(g + i), _mm256_loadu_ps(u + i), gelu));
  if (i < n) {  /* the tail through the same lanes, masked (each element's value is its own; a copy
                 * through a stack buffer stalled its load on the copy's stores: a quarter of the time
                 * here on Gemma-3's runs of 4 mod 8 columns) */
    __m256i m = _mm256_cmpgt_epi32(_mm256_set1_epi32(n - i), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    _mm256_maskstore_ps(out + i, m, glu8(_mm256_maskload_ps(g + i, m), _mm256_maskload_ps(u + i, m), gelu));
  }
}
#endif

#ifdef MS_X86
/* One row of ms_vec_softmax_rows up to its division: v[i] made exp(v[i] -
 * max), the maximum into *mo, the sum returned, both in eight lanes (then
 * across them), the tail masked; about ten times expf's speed (SmolLM2's
 * attention at 512 positions: 5 us a task in softmax before). */
__attribute__((target("avx2,fma"))) static float softmax_exp_avx2(float *v, int n, float *mo) {
  int i = 0;
  __m256 mx = _mm256_set1_ps(-INFINITY);
  for (; i + 8 <= n; i += 8) mx = _mm256_max_ps(_mm256_loadu_ps(v + i), mx);
  float m = hmax256(mx);
  for (; i < n; i++) m = v[i] > m ? v[i] : m;
  *mo = m;
  __m256 mv = _mm256_set1_ps(m), sum = _mm256_setzero_ps();
  for (i = 0; i + 8 <= n; i += 8) {
    __m256 e = exp256(_mm256_sub_ps(_mm256_loadu_ps(v + i), mv));
    _mm256_storeu_ps(v + i, e);
    sum = _mm256_add_ps(sum, e);
  }
  if (i < n) {
    __m256i k = _mm256_cmpgt_epi32(_mm256_set1_epi32(n - i), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    __m256 e = _mm256_and_ps(exp256(_mm256_sub_ps(_mm256_maskload_ps(v + i, k), mv)), _mm256_castsi256_ps(k));
    _mm256_maskstore_ps(v + i, k, e);
    sum = _mm256_add_ps(sum, e);
  }
  return hsum256(sum);
}

__attribute__((target("avx2,fma"))) static void softmax_avx2(float *v, int n) {
  float m;
  __m256 inv = _mm256_set1_ps(1.0f / softmax_exp_avx2(v, n, &m));
  int i;
  for (i = 0; i + 8 <= n; i += 8) _mm256_storeu_ps(v + i, _mm256_mul_ps(_mm256_loadu_ps(v + i), inv));
  for (; i < n; i++) v[i] *= _mm256_cvtss_f32(inv);
}
#endif

/* softmax_avx2's steps one value at a time: the maximum (exact in any
 * order), exp_poly, the sum in eight lanes (lane j the values j mod 8 apart,
 * then hsum256's order across them) and one reciprocal: the same bits. */
static float softmax_exp_scalar(float *v, int n, float *mo) {
  float m = -INFINITY, lane[8] = {0};
  for (int i = 0; i < n; i++) m = v[i] > m ? v[i] : m;
  for (int i = 0; i < n; i++) lane[i % 8] += (v[i] = exp_poly(v[i] - m));
  *mo = m;
  return lanes8_total(lane);
}

static void softmax_scalar(float *v, int n) {
  float m, inv = 1.0f / softmax_exp_scalar(v, n, &m);
  for (int i = 0; i < n; i++) v[i] *= inv;
}

void ms_vec_softmax_rows(float *s, int ng, size_t sld, int p0, int n) {
  for (int g = 0; g < ng; g++) {
    float *v = s + (size_t)g * sld + p0;
#ifdef MS_X86
    if (use_simd) {
      softmax_avx2(v, n - p0);
      continue;
    }
#endif
    softmax_scalar(v, n - p0);
  }
}

void ms_vec_softmax_rows_part(float *s, int ng, size_t sld, int p0, int n, float *mx, float *sum) {
  for (int g = 0; g < ng; g++) {
    float *v = s + (size_t)g * sld + p0;
    if (n <= p0) {
      mx[g] = -INFINITY, sum[g] = 0;
      continue;
    }
#ifdef MS_X86
    if (use_simd) {
      sum[g] = softmax_exp_avx2(v, n - p0, &mx[g]);
      continue;
    }
#endif
    sum[g] = softmax_exp_scalar(v, n - p0, &mx[g]);
  }
}

void ms_vec_glu(float *out, const float *g, const float *u, int n, int gelu) {
#ifdef MS_X86
  if (use_simd) {
    glu_avx2(out, g, u, n, gelu);
    return;
  }
#endif
  for (int i = 0; i < n; i++) out[i] = g[i] / (1.0f + exp_poly(-glu_k(g[i], gelu))) * u[i];
}
