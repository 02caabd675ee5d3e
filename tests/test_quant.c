/* SPDX-License-Identifier: MIT */
/* Quantized weights: the half-precision conversions (all 65536 halves), the
 * block decoders on hand-made blocks, the quantizers' error bounds, and the
 * GEMV kernels (AVX2 and portable, every batch size and row range) against a
 * double-precision dot product over the dequantized rows. The 8-bit-activation
 * GEMV: its quantizer, its dot against the exact one, its distance from the f32
 * path within a derived bound, and bit-identical results across paths and tilings. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/quant.h"
#include "model/blocks.h"
#include "model/quant_k.h"
#include "kernels/vec.h"
#include "megascope/base.h"
#include "megascope/model.h"
#include "test.h"

static uint64_t rng = 0x243f6a8885a308d3ull;

static float frand(void) {  /* in [-1, 1) */
  rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
  return (float)((double)(rng >> 11) / 4503599627370496.0 - 1.0);
}

static void test_f16(void) {
  int bad = 0;
  for (uint32_t h = 0; h < 65536; h++) {
    float f = ms_f16_to_f32((uint16_t)h);
    uint16_t back = ms_f32_to_f16(f);
    int nan = ((h >> 10) & 0x1f) == 0x1f && (h & 0x3ff);
    if (nan ? !isnan(f) || (back & 0x7e00) != 0x7e00 : back != h) bad++;
  }
  CHECKF(bad == 0, "%d halves do not survive f16 -> f32 -> f16", bad);
  CHECK(ms_f16_to_f32(0x3c00) == 1.0f && ms_f16_to_f32(0xc000) == -2.0f);
  CHECK(ms_f16_to_f32(0x0001) == ldexpf(1.0f, -24));  /* least subnormal */
  CHECK(ms_f16_to_f32(0x7bff) == 65504.0f);
  CHECK(ms_f32_to_f16(65520.0f) == 0x7c00);             /* rounds to inf */
  CHECK(ms_f32_to_f16(65519.0f) == 0x7bff);
  CHECK(ms_f32_to_f16(1.0f + ldexpf(1.0f, -11)) == 0x3c00);  /* tie to even */
  CHECK(ms_f32_to_f16(1.0f + 3 * ldexpf(1.0f, -11)) == 0x3c02);
  CHECK(ms_f32_to_f16(ldexpf(1.0f, -25)) == 0x0000);    /* half the least subnormal: to even (0) */
  CHECK(ms_f32_to_f16(ldexpf(1.5f, -25)) == 0x0001);
  /* round to nearest: every float between two halves goes to the nearer */
  int worse = 0;
  for (int i = 0; i < 200000; i++) {
    float f = frand() * 70000.0f * (i % 2 ? 1e-4f : 1.0f);
    uint16_t h = ms_f32_to_f16(f);
    float g = ms_f16_to_f32(h);
    if (isinf(g)) continue;
    float up = ms_f16_to_f32((uint16_t)(h + 1)), dn = ms_f16_to_f32((uint16_t)(h - 1));
    if ((h & 0x7fff) && (fabsf(up - f) < fabsf(g - f) || fabsf(dn - f) < fabsf(g - f))) worse++;
  }
  CHECKF(worse == 0, "%d floats not rounded to the nearest half", worse);
}

/* Hand-made blocks, decoded through ms_weight_get. */
static void test_blocks(void) {
  uint8_t q8[34], q40[18], q41[20];
  q8[0] = 0x00, q8[1] = 0x38;  /* d = 0.5 */
  for (int j = 0; j < 32; j++) q8[2 + j] = (uint8_t)(int8_t)(j - 16);
  struct ms_weight w8 = {.dtype = MS_DTYPE_Q8_0, .rows = 1, .cols = 32, .data = q8};
  int ok = 1;
  for (int j = 0; j < 32; j++) ok &= ms_weight_get(&w8, 0, j) == 0.5f * (float)(j - 16);
  CHECK(ok);
  q40[0] = 0x00, q40[1] = 0x40;  /* d = 2 */
  for (int j = 0; j < 16; j++) q40[2 + j] = (uint8_t)(j | (15 - j) << 4);
  struct ms_weight w40 = {.dtype = MS_DTYPE_Q4_0, .rows = 1, .cols = 32, .data = q40};
  ok = 1;
  for (int j = 0; j < 16; j++) {
    ok &= ms_weight_get(&w40, 0, j) == 2.0f * (float)(j - 8);         /* low nibbles: elements 0..15 */
    ok &= ms_weight_get(&w40, 0, j + 16) == 2.0f * (float)(7 - j);    /* high nibbles: 16..31 */
  }
  CHECK(ok);
  q41[0] = 0x00, q41[1] = 0x34;  /* d = 0.25 */
  q41[2] = 0x00, q41[3] = 0xbc;  /* m = -1 */
  for (int j = 0; j < 16; j++) q41[4 + j] = (uint8_t)(j | 3 << 4);
  struct ms_weight w41 = {.dtype = MS_DTYPE_Q4_1, .rows = 1, .cols = 32, .data = q41};
  ok = 1;
  for (int j = 0; j < 16; j++) {
    ok &= ms_weight_get(&w41, 0, j) == 0.25f * (float)j - 1.0f;
    ok &= ms_weight_get(&w41, 0, j + 16) == 0.25f * 3.0f - 1.0f;
  }
  CHECK(ok);
  float row[32];
  ms_weight_row_f32(&w41, 0, row);
  ok = 1;
  for (int j = 0; j < 32; j++) ok &= row[j] == ms_weight_get(&w41, 0, j);
  CHECK(ok);
  CHECK(ms_dtype_row_bytes(MS_DTYPE_Q4_1, 576) == 18 * 20 && ms_dtype_row_bytes(MS_DTYPE_Q8_0, 64) == 68);
  CHECK(ms_dtype_block(MS_DTYPE_Q4_0) == 32 && ms_dtype_block(MS_DTYPE_F16) == 1);
  CHECK(ms_quant_row(MS_DTYPE_Q8_0, row, 31, q8) == -EINVAL);
}

/* Quantization error per block stays within the format's step. */
static void test_quantizers(void) {
  enum ms_dtype types[] = {MS_DTYPE_F16, MS_DTYPE_BF16, MS_DTYPE_Q8_0, MS_DTYPE_Q4_0, MS_DTYPE_Q4_1};
  int n = 256;
  float x[256], y[256];
  uint8_t buf[1024];
  for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
    double worst = 0;
    for (int rep = 0; rep < 50; rep++) {
      float scale = rep % 5 == 0 ? 1e-3f : rep % 5 == 1 ? 30.0f : 1.0f;
      for (int i = 0; i < n; i++) x[i] = frand() * scale + (rep % 7 == 0 ? scale : 0);
      if (rep == 3) memset(x, 0, sizeof x);
      CHECK(ms_quant_row(types[t], x, n, buf) == 0);
      struct ms_weight w = {.dtype = types[t], .rows = 1, .cols = n, .data = buf};
      ms_weight_row_f32(&w, 0, y);
      for (int b = 0; b < n; b += 32) {
        float lo = x[b], hi = x[b], amax = 0;
        for (int j = b; j < b + 32; j++) {
          lo = fminf(lo, x[j]), hi = fmaxf(hi, x[j]), amax = fmaxf(amax, fabsf(x[j]));
        }
        /* half a step (a whole one for Q4_0, whose largest value clamps), plus the
         * f16 rounding of the scale (relative 2^-11, absolute 2^-25 when subnormal)
         * times the largest quant, plus that of Q4_1's minimum */
        double h = ldexp(1.0, -11), sub = ldexp(1.0, -25), bound;
        if (types[t] == MS_DTYPE_Q8_0) bound = amax / 127.0 * (0.5 + 127 * h) + 127 * sub;
        else if (types[t] == MS_DTYPE_Q4_0) bound = amax / 8.0 * (1 + 8 * h) + 8 * sub;
        else if (types[t] == MS_DTYPE_Q4_1) bound = (hi - lo) / 15.0 * (0.5 + 15 * h) + 16 * sub + fabsf(lo) * h;
        else if (types[t] == MS_DTYPE_F16) bound = amax * h + sub;
        else bound = amax * ldexp(1.0, -8);
        for (int j = b; j < b + 32; j++) {
          double e = fabs((double)y[j] - x[j]);
          if (e > bound + 1e-30) worst = fmax(worst, e / (bound + 1e-30));
        }
      }
    }
    CHECKF(worst == 0, "%s: error %.3g x its bound", ms_dtype_name(types[t]), worst);
  }
}

/* quant_k.c's quantizers: the largest error of a group of 32 stays within a
 * fraction of the group's largest magnitude (these are per-group max/min
 * roundings, not ggml's searches), and the quantizer keeps zeros zero. */
static void test_k_quantizers(void) {
  /* the fractions: half a step (range / 2 nmax: q5_1 1/31, q4_k 1/15, q5_k
   * 1/31, q2_k 1/3 of the range, twice amax), a whole one where the largest
   * value clamps (q5_0 1/16, q3_k 1/4, q6_k 1/32 of amax), iq4_nl's widest
   * gap (23/2 of 127), each widened by its scale's rounding to f16 and to the
   * 4-, 6- or 8-bit sub-scales */
  static const struct { enum ms_dtype t; double frac; } bounds[] = {
      {MS_DTYPE_Q5_0, 0.07}, {MS_DTYPE_Q5_1, 0.04}, {MS_DTYPE_IQ4_NL, 0.12}, {MS_DTYPE_Q2_K, 0.4},
      {MS_DTYPE_Q3_K, 0.3},  {MS_DTYPE_Q4_K, 0.08}, {MS_DTYPE_Q5_K, 0.04},   {MS_DTYPE_Q6_K, 0.05},
      {MS_DTYPE_Q8_K, 0.005}};
  float x[512], y[512];
  uint8_t buf[2048];
  for (size_t i = 0; i < sizeof bounds / sizeof bounds[0]; i++) {
    enum ms_dtype t = bounds[i].t;
    double worst = 0;
    for (int rep = 0; rep < 40; rep++) {
      float scale = rep % 5 == 0 ? 1e-3f : rep % 5 == 1 ? 30.0f : 1.0f;
      for (int j = 0; j < 512; j++) x[j] = frand() * scale + (rep % 7 == 0 ? scale : 0);
      if (rep == 3) memset(x, 0, sizeof x);
      CHECK(ms_quant_row(t, x, 512, buf) == 0);
      struct ms_weight w = {.dtype = t, .rows = 1, .cols = 512, .data = buf};
      ms_weight_row_f32(&w, 0, y);
      for (int b = 0; b < 512; b += 32) {
        float amax = 0;
        for (int j = b; j < b + 32; j++) amax = fmaxf(amax, fabsf(x[j]));
        for (int j = b; j < b + 32; j++) worst = fmax(worst, fabs((double)y[j] - x[j]) / (amax + 1e-30));
        if (rep == 3) CHECK(y[b] == 0.0f);
      }
    }
    if (getenv("MS_Q8_VERBOSE")) printf("%s: largest error %.3g of the group's largest magnitude\n", ms_dtype_name(t), worst);
    CHECKF(worst <= bounds[i].frac, "%s: error %.3g of the group's largest magnitude (allowed %.3g)", ms_dtype_name(t),
           worst, bounds[i].frac);
  }
}

/* GEMV of every batch size and a row range against double dots of the dequantized rows. */
static void check_gemv(enum ms_dtype t, int rows, int cols, int portable) {
  size_t rb = ms_dtype_row_bytes(t, cols);
  uint8_t *data = malloc(rb * (size_t)rows);
  float *src = malloc(sizeof(float) * (size_t)cols), *deq = malloc(sizeof(float) * (size_t)cols);
  int ldx = cols + 3, maxb = 9;
  float *x = malloc(sizeof(float) * (size_t)ldx * (size_t)maxb), *y = malloc(sizeof(float) * (size_t)rows * (size_t)maxb);
  for (int r = 0; r < rows; r++) {
    for (int c = 0; c < cols; c++) src[c] = frand() * (1.0f + (float)(r % 3));
    ms_quant_row(t, src, cols, data + (size_t)r * rb);
  }
  for (int i = 0; i < ldx * maxb; i++) x[i] = frand();
  struct ms_weight w = {.dtype = t, .rows = rows, .cols = cols, .data = data};
  ms_vec_force_portable(portable);
  double worst = 0;
  int variant = 0;
  float *one = malloc(sizeof(float) * (size_t)rows);
  for (int nb = 1; nb <= maxb; nb++) {
    int r0 = nb % 3, r1 = rows - (nb % 2);
    int ldy = r1 - r0 + 1;
    ms_vec_gemv(&w, r0, r1, x, ldx, nb, y, ldy);
    /* batch invariance: each batch row alone (nb = 1, all rows) gives the same bits */
    for (int b = 0; b < nb; b++) {
      ms_vec_gemv(&w, 0, rows, x + (size_t)b * ldx, ldx, 1, one, rows);
      for (int r = r0; r < r1; r++) variant += one[r] != y[(size_t)b * ldy + (r - r0)];
    }
    for (int r = r0; r < r1; r++) {
      ms_weight_row_f32(&w, r, deq);
      for (int b = 0; b < nb; b++) {
        double ref = 0, mag = 0;
        for (int c = 0; c < cols; c++) {
          ref += (double)deq[c] * x[(size_t)b * ldx + c];
          mag += fabs((double)deq[c] * x[(size_t)b * ldx + c]);
        }
        double e = fabs(y[(size_t)b * ldy + (r - r0)] - ref) / (mag * 1e-6 + 1e-6);
        worst = fmax(worst, e);
      }
    }
  }
  ms_vec_force_portable(0);
  free(one);
  CHECKF(variant == 0, "%s %dx%d %s: %d results depend on the batch size or row range", ms_dtype_name(t), rows, cols,
         portable ? "portable" : "simd", variant);
  CHECKF(worst <= 1.0, "%s %dx%d %s: error %.3g x (1e-6 of the absolute sum)", ms_dtype_name(t), rows, cols,
         portable ? "portable" : "simd", worst);
  free(data), free(src), free(deq), free(x), free(y);
}

/* ---- 8-bit activations ---- */

#define U24 5.9604644775390625e-08 /* 2^-24: f32 unit roundoff */

static void *q8_buf(int n, int nb) {  /* aligned_alloc wants a multiple of the alignment */
  return aligned_alloc(32, (ms_q8_act_bytes(n, nb) + 31) / 32 * 32);
}

/* Rows of test activations: a different scale per block, some blocks zero, and
 * in row 1 values that land on ties (x * 127 / amax = k + 0.5). */
static void q8_inputs(float *x, int ldx, int nb, int cols) {
  for (int b = 0; b < nb; b++)
    for (int c = 0; c < cols; c += 32) {
      float scale = (c / 32 + b) % 5 == 0 ? 1e-3f : (c / 32 + b) % 5 == 1 ? 20.0f : 1.0f;
      int zero = (c / 32 + 2 * b) % 11 == 3;
      for (int j = 0; j < 32; j++) x[(size_t)b * ldx + c + j] = zero ? 0.0f : frand() * scale;
      if (b == 1 && !zero) {
        x[(size_t)b * ldx + c] = 127.0f;  /* amax 127: the scale is 1, x itself is rounded */
        for (int j = 1; j < 32; j++) x[(size_t)b * ldx + c + j] = (float)(j - 16) + (j % 3 ? 0.5f : 0.25f);
      }
    }
}

/* The quantizer: |x - d q| <= d/2 (plus the rounding of the product), ties to
 * even, s = d * sum(q), zero blocks, and the AVX2 path equal to the portable one. */
static void test_q8_quantize(void) {
  int n = 160, nb = 3, ldx = n + 5, bad = 0, ties = 0;
  float *x = malloc(sizeof(float) * (size_t)ldx * (size_t)nb);
  void *b1 = q8_buf(n, nb), *b2 = q8_buf(n, nb);
  q8_inputs(x, ldx, nb, n);
  struct ms_q8_act a, p;
  ms_q8_quantize(&a, b1, x, ldx, nb, n, 32, 1);
  ms_q8_quantize(&p, b2, x, ldx, nb, n, 32, 0);
  CHECK(!memcmp(b1, b2, ms_q8_act_bytes(n, nb)));  /* q, d and s: the same bytes */
  CHECK(a.n == n && a.nb == nb && ((uintptr_t)a.q & 31) == 0);
  for (int b = 0; b < nb; b++)
    for (int i = 0; i < n / 32; i++) {
      float d = a.d[b * (n / 32) + i], amax = 0;
      int sum = 0;
      for (int j = 0; j < 32; j++) {
        float v = x[(size_t)b * ldx + 32 * i + j];
        int q = a.q[(size_t)b * n + 32 * i + j];
        amax = fmaxf(amax, fabsf(v));
        sum += q;
        bad += q < -127 || q > 127 || fabs(v - (double)d * q) > d * 0.5 + 3 * U24 * fabsf(v) + 1e-30;
        if (b == 1 && fabsf(v - truncf(v)) == 0.5f) {  /* scale 1: a tie goes to the even neighbour */
          ties++;
          bad += q != (int)rintf(v) || q % 2 != 0;
        }
      }
      bad += d != amax / 127.0f || a.s[b * (n / 32) + i] != d * (float)sum;
      if (amax == 0) bad += d != 0 || sum != 0;
    }
  CHECKF(bad == 0, "%d quantized values off", bad);
  CHECKF(ties > 20, "only %d ties tested", ties);
  free(x), free(b1), free(b2);
}

/* The K-quants' activations (qk 256): one d per 256 values, |x - d q| <= d/2,
 * bs the sum of each 16 q, no s, and the AVX2 path equal to the portable one. */
static void test_q8_quantize_k(void) {
  int n = 768, nb = 3, ldx = n + 5, bad = 0;
  float *x = malloc(sizeof(float) * (size_t)ldx * (size_t)nb);
  void *b1 = q8_buf(n, nb), *b2 = q8_buf(n, nb);
  q8_inputs(x, ldx, nb, n);
  struct ms_q8_act a, p;
  ms_q8_quantize(&a, b1, x, ldx, nb, n, 256, 1);
  ms_q8_quantize(&p, b2, x, ldx, nb, n, 256, 0);
  size_t used = (size_t)nb * ((size_t)n + sizeof(float) * (size_t)(n / 256) + sizeof(int16_t) * (size_t)(n / 16));
  CHECK(!memcmp(b1, b2, used) && a.qk == 256 && !a.s && a.bs == p.bs - (int16_t *)b2 + (int16_t *)b1);
  for (int b = 0; b < nb; b++)
    for (int i = 0; i < n / 256; i++) {
      float d = a.d[b * (n / 256) + i], amax = 0;
      for (int j = 0; j < 256; j++) amax = fmaxf(amax, fabsf(x[(size_t)b * ldx + 256 * i + j]));
      bad += d != amax / 127.0f;
      for (int h = 0; h < 16; h++) {
        int sum = 0;
        for (int j = 16 * h; j < 16 * h + 16; j++) {
          float v = x[(size_t)b * ldx + 256 * i + j];
          int q = a.q[(size_t)b * n + 256 * i + j];
          sum += q;
          bad += q < -127 || q > 127 || fabs(v - (double)d * q) > d * 0.5 + 3 * U24 * fabsf(v) + 1e-30;
        }
        bad += a.bs[b * (n / 16) + 16 * i + h] != sum;
      }
    }
  CHECKF(bad == 0, "%d quantized values off (qk 256)", bad);
  free(x), free(b1), free(b2);
}

/* The row bounds the packed checks try: each end of the matrix and each edge
 * of the groups the packed form holds (rows 4 * g0 and 4 * g1), and the rows
 * around them, sorted, each once. */
static int packed_bounds(const struct ms_weight *w, int *at) {
  int g0, g1, n = 0, edges[] = {0, 0, 0, w->rows};
  ms_quant_packed_groups(w, &g0, &g1);
  edges[1] = 4 * g0, edges[2] = 4 * g1;
  for (int r = 0; r <= w->rows; r++) {
    int near = 0;
    for (int e = 0; e < 4; e++) near |= r >= edges[e] - 5 && r <= edges[e] + 5;
    if (near) at[n++] = r;
  }
  return n;
}

/* The repacked form (ms_weight.packed, where this CPU has one): every batch
 * (1, 2, 3, 4, 5, 8 and 9 input rows: the AVX-512 tiles of four inputs, whole
 * and partial) gives the bits of the file's layout for every row range that
 * starts and ends near an end of the matrix or an edge of the packed groups
 * (wp's packed_g0, packed_gn: all of them, or a rank's part), aligned to the
 * groups of four or not. x holds 9 input rows (ldx cols + 3); buf room for them. */
/* One path (simd 2: AVX-512 VNNI, 1: AVX2) on w's packed form against the
 * same path on the file's layout; `reads` when that path takes the packed form. */
static void check_packed_at(const struct ms_weight *w, const struct ms_weight *wp, const float *x, void *buf,
                            int simd, int reads) {
  int nbs[] = {1, 2, 3, 4, 5, 8, 9}, ldy = w->rows, g0, g1, *at = malloc(sizeof(int) * (size_t)(w->rows + 1));
  int nat = packed_bounds(wp, at);
  ms_quant_packed_groups(wp, &g0, &g1);
  float *y = malloc(sizeof(float) * (size_t)w->rows * 9), *yp = malloc(sizeof(float) * (size_t)w->rows * 9);
  size_t data_bytes = (size_t)w->rows * ms_weight_row_bytes(w);
  void *zero = calloc(1, data_bytes);
  const char *path = simd == 2 ? "avx512" : "avx2";
  for (size_t k = 0; k < sizeof nbs / sizeof nbs[0]; k++) {
    int nb = nbs[k];
    struct ms_q8_act a;
    ms_q8_quantize(&a, buf, x, w->cols + 3, nb, w->cols, ms_q8_qk(w->dtype), 1);
    int diff = 0, ranges = 0;
    for (int i = 0; i < nat; i++)
      for (int j = i + 1; j < nat; j++) {
        int r0 = at[i], r1 = at[j];
        ms_q8_gemv(w, r0, r1, &a, y, ldy, simd);
        ms_q8_gemv(wp, r0, r1, &a, yp, ldy, simd);
        int d = 0;
        for (int b = 0; b < nb; b++)
          d |= memcmp(y + (size_t)b * ldy, yp + (size_t)b * ldy, sizeof(float) * (size_t)(r1 - r0)) != 0;
        diff += d;
        ranges++;
      }
    CHECKF(ranges > 0 && diff == 0,
           "q8 %s %dx%d packed (groups %d..%d), %s, batch %d: %d of %d row ranges differ from the file's layout",
           ms_dtype_name(w->dtype), w->rows, w->cols, g0, g1, path, nb, diff, ranges);
    if (!reads) continue;
    /* the packed groups come from the packed stream alone: with data zeroed
     * the same sums, so the check above did not pass by reading data */
    struct ms_weight wz = *wp;
    wz.data = zero;
    ms_q8_gemv(w, 4 * g0, 4 * g1, &a, y, ldy, simd);
    ms_q8_gemv(&wz, 4 * g0, 4 * g1, &a, yp, ldy, simd);
    int same = 1;
    for (int b = 0; b < nb; b++)
      same &= memcmp(y + (size_t)b * ldy, yp + (size_t)b * ldy, sizeof(float) * (size_t)(4 * (g1 - g0))) == 0;
    CHECKF(same, "q8 %s %dx%d packed (groups %d..%d), %s, batch %d: rows %d..%d read from data",
           ms_dtype_name(w->dtype), w->rows, w->cols, g0, g1, path, nb, 4 * g0, 4 * g1);
  }
  free(at);
  free(zero);
  free(y);
  free(yp);
}

/* w's packed form of groups [g0, g0 + gn) (0, 0: all of them) on each path
 * that can read it; its size that of the groups it holds. */
static void check_packed_groups(const struct ms_weight *w, int g0, int gn, const float *x, void *buf) {
  struct ms_weight wp = *w;
  wp.packed_g0 = g0, wp.packed_gn = gn;
  size_t bytes = ms_quant_packed_bytes(&wp), all = ms_quant_packed_bytes(w);
  CHECKF(bytes * (size_t)(w->rows / 4) == all * (size_t)(gn ? gn : w->rows / 4),
         "%s %dx%d: the packed form of %d of %d groups is %zu bytes of %zu", ms_dtype_name(w->dtype), w->rows,
         w->cols, gn, w->rows / 4, bytes, all);
  void *packed = aligned_alloc(64, (bytes + 63) & ~(size_t)63);
  memset(packed, 0xa5, (bytes + 63) & ~(size_t)63);  /* a byte the repack leaves unwritten: a wrong sum */
  ms_quant_repack(&wp, packed);
  wp.packed = packed;
  if (ms_q8_simd_level() == 2) check_packed_at(w, &wp, x, buf, 2, 1);
  check_packed_at(w, &wp, x, buf, 1, 1);
  free(packed);
}

/* The packed form (model/blocks.h), where this CPU (or MEGASCOPE_SIMD's cap)
 * gives w one, on each path that can read it (AVX-512 VNNI and AVX2 both read
 * every packed form).
 * Whole, and as a rank of tensor parallelism across processes packs it
 * (ms_model_repack_rows): the groups in the middle (the first and last read
 * from data), the second half, the first group alone. */
static void check_packed(const struct ms_weight *w, const float *x, void *buf) {
  if (!ms_quant_packed_bytes(w)) return;
  int G = w->rows / 4;
  check_packed_groups(w, 0, 0, x, buf);
  if (G >= 3) check_packed_groups(w, 1, G - 2, x, buf);
  if (G >= 2) check_packed_groups(w, G / 2, G - G / 2, x, buf);
  if (G >= 2) check_packed_groups(w, 0, 1, x, buf);
}

/* The 8-bit GEMV on rows x cols: against a double dot of the dequantized weights
 * and the quantized activations (near-exact: only the f32 accumulation rounds);
 * against the f32 path within the activations' rounding; AVX2 and portable
 * equal; the same bits for every row range, batch size and chunk of input rows. */
static void check_q8_gemv(enum ms_dtype t, int rows, int cols) {
  size_t rb = ms_dtype_row_bytes(t, cols);
  int ldx = cols + 3, maxb = 9, nblk = cols / 32, qk = ms_q8_qk(t);
  uint8_t *data = malloc(rb * (size_t)rows);
  float *src = malloc(sizeof(float) * (size_t)cols), *deq = malloc(sizeof(float) * (size_t)cols);
  float *x = malloc(sizeof(float) * (size_t)ldx * (size_t)maxb);
  float *y = malloc(sizeof(float) * (size_t)rows * (size_t)maxb), *yp = malloc(sizeof(float) * (size_t)rows * (size_t)maxb);
  float *yf = malloc(sizeof(float) * (size_t)rows * (size_t)maxb), *one = malloc(sizeof(float) * (size_t)rows);
  void *buf = q8_buf(cols, maxb), *buf1 = q8_buf(cols, maxb);
  for (int r = 0; r < rows; r++) {
    for (int c = 0; c < cols; c++) src[c] = frand() * (1.0f + (float)(r % 3)) + (r % 4 == 1 ? 0.7f : 0.0f);
    ms_quant_row(t, src, cols, data + (size_t)r * rb);
  }
  q8_inputs(x, ldx, maxb, cols);
  struct ms_weight w = {.dtype = t, .rows = rows, .cols = cols, .data = data};
  double worst_exact = 0, worst_f32 = 0, typical = 0;
  int variant = 0, simd_diff = 0, count = 0;
  for (int nb = 1; nb <= maxb; nb++) {
    struct ms_q8_act a, a1;
    ms_q8_quantize(&a, buf, x, ldx, nb, cols, qk, 1);
    int r0 = nb % 3, r1 = rows - (nb % 2), ldy = r1 - r0 + 1;
    ms_q8_gemv(&w, r0, r1, &a, y, ldy, 2);  /* the best path: AVX-512 VNNI where the CPU has it */
    ms_vec_gemv(&w, r0, r1, x, ldx, nb, yf, ldy);
    for (int level = 0; level < 2; level++) {  /* the portable path, then AVX2 */
      ms_q8_gemv(&w, r0, r1, &a, yp, ldy, level);
      for (int b = 0; b < nb; b++)
        for (int r = r0; r < r1; r++)
          simd_diff += memcmp(&y[(size_t)b * ldy + r - r0], &yp[(size_t)b * ldy + r - r0], 4) != 0;
    }
    /* tilings: each input row quantized alone, all weight rows at once (batch 1's
     * row pairs), and the weight rows split in two at every third row */
    for (int b = 0; b < nb; b++) {
      ms_q8_quantize(&a1, buf1, x + (size_t)b * ldx, ldx, 1, cols, qk, 1);
      ms_q8_gemv(&w, 0, rows, &a1, one, rows, 2);
      for (int r = r0; r < r1; r++) variant += memcmp(&one[r], &y[(size_t)b * ldy + r - r0], 4) != 0;
    }
    for (int k = r0 + 1; k < r1; k += 3) {
      ms_q8_gemv(&w, r0, k, &a, yp, ldy, 2);
      ms_q8_gemv(&w, k, r1, &a, yp + (k - r0), ldy, 2);
      for (int b = 0; b < nb; b++)
        for (int r = r0; r < r1; r++) variant += memcmp(&yp[(size_t)b * ldy + r - r0], &y[(size_t)b * ldy + r - r0], 4) != 0;
    }
    for (int r = r0; r < r1; r++) {
      ms_weight_row_f32(&w, r, deq);
      const uint8_t *row = data + (size_t)r * rb;
      for (int b = 0; b < nb; b++) {
        const float *xb = x + (size_t)b * ldx;
        double ref_q = 0, mag_q = 0, ref_f = 0, mag_f = 0, round_q = 0;
        for (int c = 0; c < cols; c++) {
          size_t ib = (size_t)b * (size_t)(cols / qk) + (size_t)(c / qk);  /* the activations' block */
          double xq = (double)a.d[ib] * a.q[(size_t)b * cols + c];
          ref_q += (double)deq[c] * xq;
          if (ms_quant_k_handles(t)) {  /* |d sc q_w d_x q_x|, |dmin mn d_x q_x|, |m d_x q_x| */
            struct ms_qk_piece pc;
            ms_quant_k_piece(t, row, c / 32, &pc);
            int j = c % 32;
            mag_q += fabs((double)pc.d * pc.sc[j / 16] * pc.q[j] * xq) + fabs((double)pc.dmin * pc.mn[j / 16] * xq) +
                     fabs((double)pc.m * xq);
          } else {
            const uint8_t *blk = row + (size_t)(c / 32) * ms_dtype_size(t);  /* Q4_1: {d, m, qs} */
            float mb = t == MS_DTYPE_Q4_1 ? ms_f16_to_f32((uint16_t)(blk[2] | blk[3] << 8)) : 0.0f;
            /* what the accumulators hold: |d_w q_w d_x q_x| and Q4_1's |m d_x q_x| */
            mag_q += fabs(((double)deq[c] - mb) * xq) + fabs((double)mb * xq);
          }
          ref_f += (double)deq[c] * xb[c];
          mag_f += fabs((double)deq[c] * xb[c]);
          round_q += fabs((double)deq[c]) * (a.d[ib] * 0.5 + 3 * U24 * fabsf(xb[c]));
        }
        double got = y[(size_t)b * ldy + (r - r0)], got_f = yf[(size_t)b * ldy + (r - r0)];
        /* the f32 accumulation: a rounding per block in its chain, the chains'
         * adds, the scale products and Q4_1's s (gamma_(nblk+8) of the magnitudes) */
        double acc_q = (nblk + 8) * U24 * mag_q + 1e-30, acc_f = (cols + 8) * U24 * mag_f;
        worst_exact = fmax(worst_exact, fabs(got - ref_q) / acc_q);
        /* against the f32 path: the activations' rounding (half a step per
         * value, times |w|) plus both accumulations */
        double tol = round_q + acc_q + acc_f + 1e-30;
        worst_f32 = fmax(worst_f32, fabs(got - got_f) / tol);
        typical += fabs(got - got_f) / tol;
        count++;
      }
    }
  }
  const char *tn = ms_dtype_name(t);
  CHECKF(simd_diff == 0, "q8 %s %dx%d: %d results differ between the paths (AVX-512, AVX2, portable)", tn, rows,
         cols, simd_diff);
  CHECKF(variant == 0, "q8 %s %dx%d: %d results depend on the row range or batch", tn, rows, cols, variant);
  check_packed(&w, x, buf);
  CHECKF(worst_exact <= 1.0, "q8 %s %dx%d: %.3g x the accumulation bound off the exact dot", tn, rows, cols, worst_exact);
  CHECKF(worst_f32 <= 1.0, "q8 %s %dx%d: %.3g x the rounding bound off the f32 path", tn, rows, cols, worst_f32);
  if (getenv("MS_Q8_VERBOSE"))
    printf("q8 %s %dx%d: exact-dot error %.3g of its bound; vs f32 worst %.3g, mean %.3g of the bound\n", tn, rows,
           cols, worst_exact, worst_f32, typical / count);
  free(data), free(src), free(deq), free(x), free(y), free(yp), free(yf), free(one), free(buf), free(buf1);
}

/* ms_huge_map, where the packed weights live: 2 MiB-aligned, zeroed,
 * writable to its last byte; nothing for 0 bytes. */
static void test_huge_map(void) {
  size_t n = (5u << 20) + 123;
  unsigned char *p = ms_huge_map(n);
  CHECK(p != NULL && ((uintptr_t)p & (MS_HUGE_PAGE - 1)) == 0);
  if (p) {
    int zero = p[0] == 0 && p[n / 2] == 0 && p[n - 1] == 0;
    p[0] = 1, p[n - 1] = 2;
    CHECK(zero && p[0] == 1 && p[n - 1] == 2);
    ms_huge_unmap(p, n);
  }
  CHECK(ms_huge_map(0) == NULL);
}

int main(void) {
  test_huge_map();
  test_f16();
  test_blocks();
  test_quantizers();
  enum ms_dtype types[] = {MS_DTYPE_F16, MS_DTYPE_Q8_0, MS_DTYPE_Q4_0, MS_DTYPE_Q4_1};
  for (size_t t = 0; t < sizeof types / sizeof types[0]; t++)
    for (int portable = 0; portable < 2; portable++) {
      check_gemv(types[t], 37, 64, portable);
      check_gemv(types[t], 11, 576, portable);
      check_gemv(types[t], 5, 1536, portable);
    }
  /* quant_k.c's formats: blocks of 32, and the K-quants' super-blocks of 256 */
  for (int t = MS_DTYPE_Q5_0; t < MS_DTYPE_COUNT; t++)
    for (int portable = 0; portable < 2; portable++) {
      int k = ms_dtype_block((enum ms_dtype)t) == 256;
      check_gemv((enum ms_dtype)t, 37, k ? 256 : 64, portable);
      check_gemv((enum ms_dtype)t, 11, k ? 768 : 576, portable);
      check_gemv((enum ms_dtype)t, 5, 1536, portable);
    }
  test_k_quantizers();
  test_q8_quantize();
  test_q8_quantize_k();
  enum ms_dtype q8types[] = {MS_DTYPE_Q8_0, MS_DTYPE_Q4_0, MS_DTYPE_Q4_1};
  int q8shapes[][2] = {{37, 32}, {11, 96}, {8, 160}, {13, 576}, {5, 1536}};  /* not all multiples of 64 or 256 */
  for (size_t t = 0; t < 3; t++)
    for (size_t k = 0; k < sizeof q8shapes / sizeof q8shapes[0]; k++) check_q8_gemv(q8types[t], q8shapes[k][0], q8shapes[k][1]);
  int kshapes[][2] = {{37, 256}, {11, 512}, {5, 1536}};
  for (int t = MS_DTYPE_Q5_0; t < MS_DTYPE_COUNT; t++) {
    int k = ms_dtype_block((enum ms_dtype)t) == 256;
    for (size_t i = 0; i < 3; i++) check_q8_gemv((enum ms_dtype)t, kshapes[i][0], kshapes[i][1]);
    if (!k) check_q8_gemv((enum ms_dtype)t, 13, 96), check_q8_gemv((enum ms_dtype)t, 9, 192);  /* a last pair */
  }
  check_gemv(MS_DTYPE_F16, 7, 45, 0);  /* f16 rows need not be whole blocks */
  check_gemv(MS_DTYPE_F16, 7, 45, 1);
  printf("simd path: %s\n", ms_q8_simd_level() == 2 ? "avx2, and avx512-vnni for the 8-bit activations"
                            : ms_vec_simd()            ? "avx2"
                                                       : "portable only");
  TEST_MAIN_END();
}
