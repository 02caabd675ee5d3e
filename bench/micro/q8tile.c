/* SPDX-License-Identifier: MIT */
/* A microbenchmark of the 32-element 8-bit GEMV tile's layouts, outside the
 * engine: 2048 rows x 640 columns of Q8_0-like weights (u8 = w + 128) against
 * 64 inputs, each form's best of 30 alternating runs, one thread. It measures
 * what a layout costs the FP pipes, to decide the sums' order
 * (docs/performance.md, "The 32-element tile's float steps"):
 *   today's lanes   a 4-row x 4-input tile converting every lane of 4 products
 *                   to float and scaling it (the order src/kernels/quant.c's
 *                   paths shared until 2026-12-06; a simplified kernel);
 *   8 rows x 2      the same lanes and chains, 8 rows x 2 blocks a vector, the
 *                   input's step a 64-bit broadcast (one permute and multiply
 *                   fewer per 64 products; that order's bits);
 *   16 rows         the same lanes and chains, 16 rows a vector;
 *   4-row groups    a block's 32 products summed in int32 first, lanes (block
 *                   of 4, row), the activations arranged per step (other bits);
 *   interleaved 16  a block's 32 products summed in int32 first, lanes = 16
 *                   rows, the input a 32-bit broadcast (other bits: ggml's
 * order). The engine's own packed tile (the first line) has summed a block in
 * int32 first since 2026-12-06, four rows by four blocks a vector. Build and
 * run (after `make`):
 *   gcc -O2 -march=native -DMS_ENGINE -Isrc -Iinclude -o /tmp/q8tile
 * bench/micro/q8tile.c \ build/libms_model.a build/libms_kernels.a
 * build/libms_model.a build/libms_base.a -lm -lpthread taskset -c 0 /tmp/q8tile
 */
#ifdef MS_ENGINE
#include "kernels/quant.h"
#include "model/blocks.h"
#endif
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#define R 2048
#define K 640
#define NBLK (K / 32)
#define NB 64
static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}
static uint8_t wu[R * K]; /* row-major, u8 = w + 128 */
static float dw[R * NBLK];
static int8_t xq[NB * K];
static float dx[NB * NBLK];
static int32_t xs[NB * NBLK]; /* sum of a block's x */
static uint8_t wi[R * K];   /* interleaved: group g of 16 rows, block k, step s:
                               16 lanes x 4 bytes */
static float dwi[R * NBLK]; /* group g, block k: 16 scales */
static float ya[NB * R], yb[NB * R], yc[NB * R];
static uint8_t
    wq4[R * K]; /* group of 4 rows, quad q, step s: lanes (kk, j) x 4 bytes */
static float dq4[R * NBLK];   /* group, quad: 16 scales, lane (kk, j) */
static int8_t xa[NB * K * 4]; /* input b, quad q, step s: lanes (kk, j): x(4q +
                                 kk)[4s .. 4s + 3] */
static int32_t xsa[NB * NBLK * 4]; /* input b, quad q: lanes (kk, j): -128 sum
                                      of block 4q + kk */
static float
    dxa[NB * NBLK * 4]; /* input b, quad q: lanes (kk, j): d_x(4q + kk) */

__attribute__((target("avx512f,avx512bw,avx512vnni,avx512vl,fma"))) static void
tile_a(void) {
  for (int r = 0; r < R; r += 4)
    for (int b0 = 0; b0 < NB; b0 += 4) {
      __m512 c[4][4];
      for (int b = 0; b < 4; b++)
        for (int j = 0; j < 4; j++)
          c[b][j] = _mm512_setzero_ps();
      for (int p = 0; p < NBLK / 2; p++) {
        __m512i w[4];
        __m512 dwj[4];
        for (int j = 0; j < 4; j++) {
          w[j] = _mm512_loadu_si512(wu + (size_t)(r + j) * K + 64 * p);
          dwj[j] = _mm512_mask_broadcastss_ps(
              _mm512_set1_ps(dw[(r + j) * NBLK + 2 * p]), 0xff00,
              _mm_load_ss(&dw[(r + j) * NBLK + 2 * p + 1]));
        }
        for (int b = 0; b < 4; b++) {
          const int8_t *xb = xq + (size_t)(b0 + b) * K + 64 * p;
          __m512i q = _mm512_loadu_si512(xb);
          __m512i init = _mm512_dpbusd_epi32(_mm512_setzero_si512(),
                                             _mm512_set1_epi8((char)0x80), q);
          init = _mm512_sub_epi32(_mm512_setzero_si512(), init);
          const float *d = dx + (b0 + b) * NBLK + 2 * p;
          __m512 dxv = _mm512_mask_broadcastss_ps(_mm512_set1_ps(d[0]), 0xff00,
                                                  _mm_load_ss(d + 1));
          for (int j = 0; j < 4; j++)
            c[b][j] = _mm512_fmadd_ps(
                _mm512_mul_ps(dwj[j], dxv),
                _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(init, w[j], q)),
                c[b][j]);
        }
      }
      for (int b = 0; b < 4; b++)
        for (int j = 0; j < 4; j++)
          ya[(b0 + b) * R + r + j] = _mm512_reduce_add_ps(c[b][j]);
    }
}

#define TC 4
__attribute__((target("avx512f,avx512bw,avx512vnni,avx512vl,fma"))) static void
tile_c(void) {
  const int NQ = NBLK / 4;
  for (int g = 0; g < R / 4; g++)
    for (int b0 = 0; b0 < NB; b0 += TC) {
      __m512 acc[TC];
      for (int b = 0; b < TC; b++)
        acc[b] = _mm512_setzero_ps();
      for (int q = 0; q < NQ; q++) {
        const uint8_t *wk = wq4 + ((size_t)g * NQ + q) * 512;
        __m512i W[8];
        for (int s = 0; s < 8; s++)
          W[s] = _mm512_load_si512(wk + 64 * s);
        __m512 sc = _mm512_loadu_ps(dq4 + ((size_t)g * NQ + q) * 16);
        for (int b = 0; b < TC; b++) {
          const int8_t *xb = xa + ((size_t)(b0 + b) * NQ + q) * 512;
          __m512i is =
              _mm512_loadu_si512(xsa + ((size_t)(b0 + b) * NQ + q) * 16);
          for (int s = 0; s < 8; s++)
            is = _mm512_dpbusd_epi32(is, W[s], _mm512_load_si512(xb + 64 * s));
          acc[b] = _mm512_fmadd_ps(
              _mm512_mul_ps(
                  sc, _mm512_loadu_ps(dxa + ((size_t)(b0 + b) * NQ + q) * 16)),
              _mm512_cvtepi32_ps(is), acc[b]);
        }
      }
      for (int b = 0; b < TC; b++) {
        float t[16];
        _mm512_storeu_ps(t, acc[b]);
        for (int j = 0; j < 4; j++)
          yc[(size_t)(b0 + b) * R + 4 * g + j] =
              (t[j] + t[4 + j]) + (t[8 + j] + t[12 + j]);
      }
    }
}

/* today's bits, 16-row interleave: lane = row, 16 accumulators (block parity c,
 * lane k) per input */
static int32_t
    corr[NB * NBLK * 8]; /* -128 x the sum of x[4k .. 4k + 3] of block i */
static float yd[NB * R];
__attribute__((target("avx512f,avx512bw,avx512vnni,avx512vl,fma"))) static void
tile_d(void) {
  for (int g = 0; g < R / 16; g++)
    for (int b = 0; b < NB; b++) {
      __m512 acc[2][8];
      for (int c = 0; c < 2; c++)
        for (int k = 0; k < 8; k++)
          acc[c][k] = _mm512_setzero_ps();
      const uint8_t *wg = wi + (size_t)g * 16 * K;
      const int32_t *xb = (const int32_t *)(xq + (size_t)b * K);
      const int32_t *cb = corr + (size_t)b * NBLK * 8;
      for (int i = 0; i < NBLK; i++) {
        const uint8_t *wk = wg + (size_t)i * 512;
        __m512 sc =
            _mm512_mul_ps(_mm512_loadu_ps(dwi + ((size_t)g * NBLK + i) * 16),
                          _mm512_set1_ps(dx[b * NBLK + i]));
        for (int k = 0; k < 8; k++) {
          __m512i is = _mm512_dpbusd_epi32(_mm512_set1_epi32(cb[8 * i + k]),
                                           _mm512_load_si512(wk + 64 * k),
                                           _mm512_set1_epi32(xb[8 * i + k]));
          acc[i & 1][k] =
              _mm512_fmadd_ps(sc, _mm512_cvtepi32_ps(is), acc[i & 1][k]);
        }
      }
      __m512 t = _mm512_setzero_ps();
      for (int k = 0; k < 8; k++)
        t = _mm512_add_ps(t, _mm512_add_ps(acc[0][k], acc[1][k]));
      _mm512_storeu_ps(yd + (size_t)b * R + 16 * g, t);
    }
}

/* the design: 8-row groups, lanes (row l, block parity c) = 2l + c, activations
 * pair-interleaved by dword
 * ([x(2p)_k, x(2p+1)_k] for k = 0..7), a 64-bit broadcast per step; today's
 * lanes and chains (8 accumulators an input, lane k of each block its own);
 * corr per (b, p, k) pair from a table. */
static uint8_t w8[R * K]; /* group g, pair p, step k: 64 B, lane 2l + c: row l's
                             block 2p + c bytes 4k .. 4k+3 */
static float d8[R * NBLK]; /* group g, pair p: 16 lanes */
static int8_t
    xp[NB * K]; /* input b, pair p: 64 B, dword 2k + c = x(2p + c) dword k */
static int32_t cp[NB * K / 4]; /* input b, pair p: 16 ints, 2k + c: -128 sum of
                                  x(2p + c) dword k */
static float ye4[NB * R];
__attribute__((target("avx512f,avx512bw,avx512vnni,avx512vl,fma"))) static void
tile_e(void) {
  const int NP = NBLK / 2;
  for (int g = 0; g < R / 8; g++)
    for (int b = 0; b < NB; b++) {
      __m512 acc[8];
      for (int k = 0; k < 8; k++)
        acc[k] = _mm512_setzero_ps();
      const uint8_t *wg = w8 + (size_t)g * 8 * K;
      const int64_t *xb = (const int64_t *)(xp + (size_t)b * K);
      const int64_t *cb = (const int64_t *)(cp + (size_t)b * K / 4);
      for (int p = 0; p < NP; p++) {
        const uint8_t *wk = wg + (size_t)p * 512;
        __m512 dxv = _mm512_castpd_ps(
            _mm512_set1_pd(*(const double *)(dx + b * NBLK + 2 * p)));
        __m512 sc =
            _mm512_mul_ps(_mm512_loadu_ps(d8 + ((size_t)g * NP + p) * 16), dxv);
        for (int k = 0; k < 8; k++) {
          __m512i is = _mm512_dpbusd_epi32(_mm512_set1_epi64(cb[8 * p + k]),
                                           _mm512_load_si512(wk + 64 * k),
                                           _mm512_set1_epi64(xb[8 * p + k]));
          acc[k] = _mm512_fmadd_ps(sc, _mm512_cvtepi32_ps(is), acc[k]);
        }
      }
      __m512 t = _mm512_setzero_ps();
      for (int k = 0; k < 8; k++)
        t = _mm512_add_ps(t, acc[k]);
      float o[16];
      _mm512_storeu_ps(o, t);
      for (int l = 0; l < 8; l++)
        ye4[(size_t)b * R + 8 * g + l] = o[2 * l] + o[2 * l + 1];
    }
}

#define TB 8
__attribute__((target("avx512f,avx512bw,avx512vnni,avx512vl,fma"))) static void
tile_b(void) {
  for (int g = 0; g < R / 16; g++)
    for (int b0 = 0; b0 < NB; b0 += TB) {
      __m512 acc[TB];
      for (int b = 0; b < TB; b++)
        acc[b] = _mm512_setzero_ps();
      const uint8_t *wg = wi + (size_t)g * 16 * K;
      for (int k = 0; k < NBLK; k++) {
        const uint8_t *wk = wg + (size_t)k * 512;
        __m512i W[8];
        for (int s = 0; s < 8; s++)
          W[s] = _mm512_load_si512(wk + 64 * s);
        __m512 sc = _mm512_loadu_ps(dwi + ((size_t)g * NBLK + k) * 16);
        for (int b = 0; b < TB; b++) {
          const int32_t *xb =
              (const int32_t *)(xq + (size_t)(b0 + b) * K + 32 * k);
          __m512i is = _mm512_set1_epi32(-128 * xs[(b0 + b) * NBLK + k]);
          for (int s = 0; s < 8; s++)
            is = _mm512_dpbusd_epi32(is, W[s], _mm512_set1_epi32(xb[s]));
          acc[b] = _mm512_fmadd_ps(
              _mm512_mul_ps(sc, _mm512_set1_ps(dx[(b0 + b) * NBLK + k])),
              _mm512_cvtepi32_ps(is), acc[b]);
        }
      }
      for (int b = 0; b < TB; b++)
        _mm512_storeu_ps(yb + (size_t)(b0 + b) * R + 16 * g, acc[b]);
    }
}

/* The pipes' rate: twelve independent vpdpbusd (then FMA) chains. */
#define R12(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)
__attribute__((target("avx512f,avx512bw,avx512vnni,fma"))) static void
pipes(void) {
#define DECLA(i) __m512i a##i = _mm512_set1_epi32(i);
  R12(DECLA)
  __m512i w = _mm512_set1_epi8(3), x = _mm512_set1_epi8(5);
  __m512 m = _mm512_set1_ps(0.999f);
  long N = 20000000;
  double t0 = now();
  for (long n = 0; n < N; n++) {
#define DP(i) a##i = _mm512_dpbusd_epi32(a##i, w, x);
    R12(DP)
    __asm__ volatile("" : "+v"(w), "+v"(x));
  }
  double t1 = now();
  int s = 0;
#define SUMA(i) s += _mm512_reduce_add_epi32(a##i);
  R12(SUMA)
#define DECLF(i) __m512 f##i = _mm512_set1_ps(i * 0.001f);
  R12(DECLF)
  for (long n = 0; n < N; n++) {
#define FM(i) f##i = _mm512_fmadd_ps(f##i, m, m);
    R12(FM)
    __asm__ volatile("" : "+v"(m));
  }
  double t2 = now();
#define SUMF(i) s += (int)_mm512_reduce_add_ps(f##i);
  R12(SUMF)
  printf("pipes: vpdpbusd zmm %.2f G/s, vfmadd zmm %.2f G/s (%d)\n",
         12.0 * N / (t1 - t0) / 1e9, 12.0 * N / (t2 - t1) / 1e9, s & 1);
}

int main(void) {
  pipes();
  srand(1);
  for (int i = 0; i < R * K; i++)
    wu[i] = (uint8_t)(rand() % 255 + 1);
  for (int i = 0; i < R * NBLK; i++)
    dw[i] = (rand() % 1000 + 1) * 1e-4f;
  for (int i = 0; i < NB * K; i++)
    xq[i] = (int8_t)(rand() % 255 - 127);
  for (int i = 0; i < NB * NBLK; i++)
    dx[i] = (rand() % 1000 + 1) * 1e-4f;
  for (int b = 0; b < NB; b++)
    for (int k = 0; k < NBLK; k++) {
      int s = 0;
      for (int j = 0; j < 32; j++)
        s += xq[b * K + 32 * k + j];
      xs[b * NBLK + k] = s;
    }
  for (int g = 0; g < R / 16; g++)
    for (int k = 0; k < NBLK; k++) {
      for (int s = 0; s < 8; s++)
        for (int l = 0; l < 16; l++)
          for (int e = 0; e < 4; e++)
            wi[(size_t)g * 16 * K + (size_t)k * 512 + 64 * s + 4 * l + e] =
                wu[(size_t)(16 * g + l) * K + 32 * k + 4 * s + e];
      for (int l = 0; l < 16; l++)
        dwi[((size_t)g * NBLK + k) * 16 + l] = dw[(16 * g + l) * NBLK + k];
    }
  {
    const int NQ = NBLK / 4;
    for (int g = 0; g < R / 4; g++)
      for (int q = 0; q < NQ; q++)
        for (int s = 0; s < 8; s++)
          for (int kk = 0; kk < 4; kk++)
            for (int j = 0; j < 4; j++)
              for (int e = 0; e < 4; e++)
                wq4[((size_t)g * NQ + q) * 512 + 64 * s + 16 * kk + 4 * j + e] =
                    wu[(size_t)(4 * g + j) * K + 32 * (4 * q + kk) + 4 * s + e];
    for (int g = 0; g < R / 4; g++)
      for (int q = 0; q < NQ; q++)
        for (int kk = 0; kk < 4; kk++)
          for (int j = 0; j < 4; j++)
            dq4[((size_t)g * NQ + q) * 16 + 4 * kk + j] =
                dw[(4 * g + j) * NBLK + 4 * q + kk];
    for (int b = 0; b < NB; b++)
      for (int q = 0; q < NQ; q++)
        for (int kk = 0; kk < 4; kk++)
          for (int j = 0; j < 4; j++) {
            xsa[((size_t)b * NQ + q) * 16 + 4 * kk + j] =
                -128 * xs[b * NBLK + 4 * q + kk];
            dxa[((size_t)b * NQ + q) * 16 + 4 * kk + j] =
                dx[b * NBLK + 4 * q + kk];
            for (int s = 0; s < 8; s++)
              for (int e = 0; e < 4; e++)
                xa[((size_t)b * NQ + q) * 512 + 64 * s + 16 * kk + 4 * j + e] =
                    xq[b * K + 32 * (4 * q + kk) + 4 * s + e];
          }
  }
  for (int b = 0; b < NB; b++)
    for (int i = 0; i < NBLK; i++)
      for (int k = 0; k < 8; k++) {
        int sm = 0;
        for (int e = 0; e < 4; e++)
          sm += xq[b * K + 32 * i + 4 * k + e];
        corr[(b * NBLK + i) * 8 + k] = -128 * sm;
      }
  {
    const int NP = NBLK / 2;
    for (int g = 0; g < R / 8; g++)
      for (int p = 0; p < NP; p++)
        for (int k = 0; k < 8; k++)
          for (int l = 0; l < 8; l++)
            for (int c = 0; c < 2; c++)
              for (int e = 0; e < 4; e++)
                w8[((size_t)g * NP + p) * 512 + 64 * k + 4 * (2 * l + c) + e] =
                    wu[(size_t)(8 * g + l) * K + 32 * (2 * p + c) + 4 * k + e];
    for (int g = 0; g < R / 8; g++)
      for (int p = 0; p < NP; p++)
        for (int l = 0; l < 8; l++)
          for (int c = 0; c < 2; c++)
            d8[((size_t)g * NP + p) * 16 + 2 * l + c] =
                dw[(8 * g + l) * NBLK + 2 * p + c];
    for (int b = 0; b < NB; b++)
      for (int p = 0; p < NP; p++)
        for (int k = 0; k < 8; k++)
          for (int c = 0; c < 2; c++) {
            int sm = 0;
            for (int e = 0; e < 4; e++) {
              xp[(size_t)b * K + 64 * p + 4 * (2 * k + c) + e] =
                  xq[b * K + 32 * (2 * p + c) + 4 * k + e];
              sm += xq[b * K + 32 * (2 * p + c) + 4 * k + e];
            }
            cp[(size_t)b * K / 4 + 16 * p + 2 * k + c] = -128 * sm;
          }
  }
#ifdef MS_ENGINE
  { /* the engine's own packed q8_0 tile (ms_q8_gemv on ms_quant_repack's form),
       the same weights and inputs */
    static uint8_t file[(size_t)R * (K / 32) * 34];
    static float xf[NB * K], ye[NB * R];
    for (int r = 0; r < R; r++)
      for (int i = 0; i < NBLK; i++) {
        uint8_t *b = file + ((size_t)r * NBLK + i) * 34;
        uint16_t h = (uint16_t)(0x2000 + (r * 7 + i) % 1000); /* an f16 scale */
        memcpy(b, &h, 2);
        for (int j = 0; j < 32; j++)
          b[2 + j] = (uint8_t)(wu[(size_t)r * K + 32 * i + j] ^ 0x80);
      }
    for (int i = 0; i < NB * K; i++)
      xf[i] = (float)xq[i] * 0.01f;
    struct ms_weight w = {
        .dtype = MS_DTYPE_Q8_0, .rows = R, .cols = K, .data = file};
    void *pk =
             aligned_alloc(64, (ms_quant_packed_bytes(&w) + 63) & ~(size_t)63),
         *abuf = aligned_alloc(64, ms_q8_act_bytes(K, NB) + 64);
    ms_quant_repack(&w, pk);
    w.packed = pk;
    struct ms_q8_act a;
    ms_q8_quantize(&a, abuf, xf, K, NB, K, 32, 1);
    double be = 1e9;
    for (int rep = 0; rep < 30; rep++) {
      double t0 = now();
      ms_q8_gemv(&w, 0, R, &a, ye, R, 2);
      double t1 = now();
      if (t1 - t0 < be)
        be = t1 - t0;
    }
    printf("the engine's packed q8_0 tile (ms_q8_gemv): %.3f ms %.1f GMAC/s\n",
           be * 1e3, (double)R * K * NB / be / 1e9);
  }
#endif
  /* the forms alternate, each its best of 30; every one against today's lanes'
   * sums */
  static const struct {
    const char *name;
    void (*run)(void);
    const float *y;
  } forms[] = {
      {"today's lanes, 4x4 (simplified)", tile_a, ya},
      {"8 rows x 2 blocks, pair-interleaved activations", tile_e, ye4},
      {"16 rows, today's lanes and chains (16 accumulators an input)", tile_d,
       yd},
      {"4-row groups, lanes (block of 4, row), activations arranged", tile_c,
       yc},
      {"interleaved 16 rows, int32 first", tile_b, yb},
  };
  enum { NF = sizeof forms / sizeof forms[0] };
  double best[NF];
  for (int f = 0; f < NF; f++)
    best[f] = 1e9;
  for (int rep = 0; rep < 30; rep++)
    for (int f = 0; f < NF; f++) {
      double t0 = now();
      forms[f].run();
      double t1 = now();
      if (t1 - t0 < best[f])
        best[f] = t1 - t0;
    }
  for (int f = 0; f < NF; f++) {
    double worst = 0;
    for (int i = 0; f && i < NB * R; i++) {
      double d = __builtin_fabs(ya[i] - forms[f].y[i]) /
                 (1e-3 + __builtin_fabs(ya[i]));
      if (d > worst)
        worst = d;
    }
    printf("%s: %.3f ms %.1f GMAC/s", forms[f].name, best[f] * 1e3,
           (double)R * K * NB / best[f] / 1e9);
    if (f)
      printf("; worst rel diff %.2g", worst);
    printf("\n");
  }
  return 0;
}
