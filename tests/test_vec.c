/* SPDX-License-Identifier: MIT */
/* Vector kernels: the AVX2/FMA path against the portable one, f32 and bf16,
 * with batch sizes and widths that leave tails; bf16 rounding; the gated
 * FFN's activations against a double reference on both paths; attention's
 * runs over a KV page. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/vec.h"
#include "test.h"

static float frand(uint64_t *s) {
  *s = *s * 6364136223846793005ull + 1442695040888963407ull;
  return (float)((*s >> 40) & 0xffffff) / (float)0x800000 - 1.0f;
}

static void test_gemv(enum ms_dtype dt) {
  uint64_t s = 42;
  const int widths[] = {7, 8, 16, 61, 64, 576, 1000};
  for (size_t wi = 0; wi < sizeof widths / sizeof widths[0]; wi++) {
    int cols = widths[wi], rows = 19, nb = 9;
    size_t esz = ms_dtype_size(dt);
    void *data = malloc((size_t)rows * cols * esz);
    float *x = malloc(sizeof(float) * (size_t)nb * cols);
    float *y1 = malloc(sizeof(float) * (size_t)nb * rows), *y2 = malloc(sizeof(float) * (size_t)nb * rows);
    for (int i = 0; i < rows * cols; i++) {
      float v = frand(&s);
      if (dt == MS_DTYPE_BF16)
        ((uint16_t *)data)[i] = ms_f32_to_bf16(v);
      else
        ((float *)data)[i] = v;
    }
    for (int i = 0; i < nb * cols; i++) x[i] = frand(&s);
    struct ms_weight w = {.dtype = dt, .rows = rows, .cols = cols, .data = data};
    ms_vec_force_portable(1);
    ms_vec_gemv(&w, 2, rows, x, cols, nb, y1, rows);
    ms_vec_force_portable(0);
    ms_vec_gemv(&w, 2, rows, x, cols, nb, y2, rows);
    double worst = 0;
    for (int b = 0; b < nb; b++)
      for (int r = 0; r < rows - 2; r++) {
        double ref = 0;
        for (int c = 0; c < cols; c++) ref += (double)ms_weight_get(&w, r + 2, c) * x[b * cols + c];
        double d1 = fabs(y1[b * rows + r] - ref), d2 = fabs(y2[b * rows + r] - ref);
        if (d1 > worst) worst = d1;
        if (d2 > worst) worst = d2;
      }
    CHECKF(worst < 1e-4 * sqrt((double)cols), "%s cols %d: worst %g", ms_dtype_name(dt), cols, worst);
    free(data);
    free(x);
    free(y1);
    free(y2);
  }
}

static void test_dot_and_norm(void) {
  uint64_t s = 7;
  float a[131], b[131], out[131], w[131];
  for (int i = 0; i < 131; i++) a[i] = frand(&s), b[i] = frand(&s), w[i] = 1.0f + 0.1f * frand(&s);
  double ref = 0;
  for (int i = 0; i < 131; i++) ref += (double)a[i] * b[i];
  CHECK(fabs(ms_vec_dot(a, b, 131) - ref) < 1e-4);
  ms_vec_rmsnorm(out, a, w, 131, 1e-5f);
  double ss = 0;
  for (int i = 0; i < 131; i++) ss += (double)a[i] * a[i];
  double inv = 1.0 / sqrt(ss / 131 + 1e-5);
  for (int i = 0; i < 131; i++) CHECK(fabs(out[i] - a[i] * inv * w[i]) < 1e-5);
  /* both paths sum the squares in the same eight lanes: the same bits, every tail */
  int differ = 0;
  float alt[131];
  for (int n = 1; n <= 131; n++) {
    ms_vec_force_portable(1);
    ms_vec_rmsnorm(alt, a, w, n, 1e-5f);
    ms_vec_force_portable(0);
    ms_vec_rmsnorm(out, a, w, n, 1e-5f);
    differ += memcmp(alt, out, sizeof(float) * (size_t)n) != 0;
  }
  CHECKF(differ == 0, "rmsnorm: the paths differ at %d lengths", differ);
}

/* The attention runs over positions `ld` floats apart: the scores equal
 * ms_vec_dot's bit for bit, and the weighted sum of value rows (added to what
 * o held) a double reference, on both paths, for head widths that leave every
 * tail (a 64-column block, 8-column vectors, single columns). */
static void test_attention_runs(void) {
  enum { N = 37, LD = 300 };
  static float k[N * LD], v[N * LD];
  uint64_t s = 11;
  for (int i = 0; i < N * LD; i++) k[i] = frand(&s), v[i] = frand(&s);
  const int widths[] = {64, 256, 72, 136, 13, 5};
  for (int portable = 0; portable < 2; portable++) {
    ms_vec_force_portable(portable);
    for (size_t wi = 0; wi < sizeof widths / sizeof *widths; wi++) {
      int hd = widths[wi];
      float q[256], sc[N], w[N], o[256];
      double ref[256];
      for (int i = 0; i < hd; i++) q[i] = frand(&s), o[i] = ref[i] = frand(&s);
      ms_vec_dot_run(q, k + 3, LD, N, hd, 0.125f, sc);
      int same = 1;
      for (int p = 0; p < N; p++) same &= sc[p] == ms_vec_dot(q, k + 3 + (size_t)p * LD, hd) * 0.125f;
      CHECKF(same, "dot run, hd %d, portable %d", hd, portable);
      for (int p = 0; p < N; p++) w[p] = 0.5f + 0.5f * frand(&s);
      ms_vec_axpy_run(o, w, v + 3, LD, N, hd);
      double err = 0;
      for (int i = 0; i < hd; i++) {
        for (int p = 0; p < N; p++) ref[i] += (double)w[p] * v[3 + (size_t)p * LD + i];
        err = fmax(err, fabs(o[i] - ref[i]));
      }
      CHECKF(err < 1e-4, "axpy run, hd %d, portable %d: error %g", hd, portable, err);
      /* three heads at once (a KV group): each head's bits as its own run's */
      float q3[3 * 256], s3[3 * (N + 2)], o3[3 * 256], og[256];
      for (int i = 0; i < 3 * hd; i++) q3[i] = frand(&s), o3[i] = frand(&s);
      ms_vec_dot_runs(q3, 3, k + 3, LD, N, hd, 0.125f, s3, N + 2);
      same = 1;
      for (int g = 0; g < 3; g++) {
        ms_vec_dot_run(q3 + g * hd, k + 3, LD, N, hd, 0.125f, sc);
        for (int p = 0; p < N; p++) same &= s3[g * (N + 2) + p] == sc[p];
      }
      CHECKF(same, "dot runs of 3 heads, hd %d, portable %d", hd, portable);
      float o3in[3 * 256];
      memcpy(o3in, o3, sizeof o3in);
      ms_vec_axpy_runs(o3, 3, s3, N + 2, v + 3, LD, N, hd);
      same = 1;
      for (int g = 0; g < 3; g++) {
        memcpy(og, o3in + g * hd, sizeof(float) * (size_t)hd);
        ms_vec_axpy_run(og, s3 + g * (N + 2), v + 3, LD, N, hd);
        same &= !memcmp(og, o3 + g * hd, sizeof(float) * (size_t)hd);
      }
      CHECKF(same, "axpy runs of 3 heads, hd %d, portable %d", hd, portable);
    }
  }
  ms_vec_force_portable(0);
}

static void test_bf16(void) {
  CHECK(ms_f32_to_bf16(1.0f) == 0x3f80);
  CHECK(ms_bf16_to_f32(0x3f80) == 1.0f);
  /* round to nearest even: 1 + 2^-8 is a tie between 1 and 1 + 2^-7 */
  CHECK(ms_f32_to_bf16(1.00390625f) == 0x3f80);
  CHECK(ms_f32_to_bf16(1.01171875f) == 0x3f82);
  CHECK(isnan(ms_bf16_to_f32(ms_f32_to_bf16(NAN))));
  CHECK(ms_bf16_to_f32(ms_f32_to_bf16(-INFINITY)) == -INFINITY);
}

/* ms_vec_glu: SiLU and GELU (tanh form, as llama.cpp's ggml_gelu) times u,
 * against double on both paths: within 4 ulp of the result's magnitude plus
 * what an input's rounding moves it, over |g| up to 100 (the exp's tails),
 * with widths that leave a tail; and each element's value is its own (the
 * same inside a longer call). */
static double gelu_ref(double v) { return 0.5 * v * (1.0 + tanh(0.7978845608028654 * (v + 0.044715 * v * v * v))); }

static void test_glu(void) {
  enum { N = 1000 };
  float g[N], u[N], out[N], one[8], simd_out[2][N];
  uint64_t s = 7;
  for (int i = 0; i < N; i++) {
    g[i] = frand(&s) * (i < 900 ? 8.0f : 100.0f);
    u[i] = frand(&s) * 2.0f;
  }
  g[0] = 0.0f, g[1] = -100.0f, g[2] = 100.0f, g[3] = 1e-30f;
  for (int portable = 0; portable < 2; portable++) {
    ms_vec_force_portable(portable);
    for (int gelu = 0; gelu < 2; gelu++) {
      ms_vec_glu(out, g, u, N - 3, gelu);
      if (!portable) memcpy(simd_out[gelu], out, sizeof out);
      else  /* one exp (exp_poly), the same operations: the same bits on both paths */
        CHECKF(memcmp(simd_out[gelu], out, sizeof(float) * (N - 3)) == 0, "glu %s: the paths differ",
               gelu ? "gelu" : "silu");
      double worst = 0;
      int own = 0;
      for (int i = 0; i < N - 3; i++) {
        double v = g[i], a = gelu ? gelu_ref(v) : v / (1.0 + exp(-v)), ref = a * u[i];
        /* |d act / dg| <= 1.13, an input's rounding 2^-24 |g| */
        double tol = 4 * 0x1p-24 * fabs(ref) + 1.2 * 0x1p-24 * fabs(v * u[i]) + 1e-37;
        worst = fmax(worst, fabs(out[i] - ref) / tol);
      }
      for (int i = 0; i < 40; i += 5) {
        ms_vec_glu(one, g + i, u + i, 3, gelu);
        own += memcmp(one, out + i, 3 * sizeof(float)) != 0;
      }
      if (getenv("MS_GLU_VERBOSE")) printf("glu %d %d worst %.3g\n", gelu, portable, worst);
      CHECKF(worst <= 1.0, "glu %s (%s): %.3g x the bound off double", gelu ? "gelu" : "silu",
             portable ? "portable" : "simd", worst);
      CHECKF(own == 0, "glu %s (%s): %d elements depend on their neighbours", gelu ? "gelu" : "silu",
             portable ? "portable" : "simd", own);
    }
  }
  ms_vec_force_portable(0);
}

/* Softmax rows on both paths against double: every length's tail (the AVX2
 * path masks it), a first position past 0, rows apart from each other, a
 * score far below the row's maximum (exp underflows to 0) and a row of one. */
static void test_softmax(void) {
  enum { G = 3, LD = 80 };
  float s[G * LD], ref_in[G * LD], alt[G * LD];
  uint64_t z = 11;
  int differ = 0;
  for (int portable = 0; portable < 2; portable++) {
    ms_vec_force_portable(portable);
    double worst = 0;
    int other = 0;
    for (int n = 1; n <= 70; n++)
      for (int p0 = 0; p0 < n && p0 < 5; p0 += 2) {
        for (int i = 0; i < G * LD; i++) ref_in[i] = s[i] = frand(&z) * 12.0f;
        ref_in[LD + p0] = s[LD + p0] = -200.0f;
        ms_vec_softmax_rows(s, G, LD, p0, n);
        memcpy(alt, ref_in, sizeof alt);  /* the other path on the same scores: the same bits */
        ms_vec_force_portable(!portable);
        ms_vec_softmax_rows(alt, G, LD, p0, n);
        ms_vec_force_portable(portable);
        differ += memcmp(alt, s, sizeof s) != 0;
        for (int g = 0; g < G; g++) {
          const float *in = ref_in + g * LD;
          double mx = -INFINITY, sum = 0;
          for (int p = p0; p < n; p++) mx = fmax(mx, in[p]);
          for (int p = p0; p < n; p++) sum += exp(in[p] - mx);
          for (int p = p0; p < n; p++) {
            /* in - mx rounded (|in - mx| ulp of exp's argument), exp within 2 ulp, a sum of n terms */
            double ref = exp(in[p] - mx) / sum, rel = (fabs(in[p] - mx) + 4 + n) * 0x1p-24;
            worst = fmax(worst, fabs(s[g * LD + p] - ref) / (rel * ref + 1e-30));
          }
          for (int p = 0; p < LD; p++) other += (p < p0 || p >= n) && s[g * LD + p] != in[p];
        }
      }
    CHECKF(worst <= 1.0, "softmax (%s): %.3g x the bound off double", portable ? "portable" : "simd", worst);
    CHECKF(other == 0, "softmax (%s): %d values outside [p0, n) written", portable ? "portable" : "simd", other);
  }
  CHECKF(differ == 0, "softmax: the paths differ in %d rows", differ);
  ms_vec_force_portable(0);
}

int main(void) {
  printf("simd path: %s\n", ms_vec_simd() ? "avx2+fma" : "portable only");
  test_gemv(MS_DTYPE_F32);
  test_gemv(MS_DTYPE_BF16);
  test_dot_and_norm();
  test_attention_runs();
  test_bf16();
  test_glu();
  test_softmax();
  TEST_MAIN_END();
}
