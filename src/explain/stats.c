/* SPDX-License-Identifier: MIT */
/* Robust statistics for explain (stats.h). */
#include <math.h>
#include <stdlib.h>

#include "explain/stats.h"

static int by_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static int by_value(const void *a, const void *b) {
  const struct ex_vw *x = a, *y = b;
  return (x->v > y->v) - (x->v < y->v);
}

double ex_median(double *v, size_t n) {
  if (!n) return NAN;
  qsort(v, n, sizeof *v, by_double);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

double ex_wmedian(struct ex_vw *x, size_t n) {
  double total = 0, acc = 0;
  for (size_t i = 0; i < n; i++) total += x[i].w;
  if (!(total > 0)) return NAN;
  qsort(x, n, sizeof *x, by_value);
  /* the value where the cumulative weight reaches half; between two values
   * when it reaches half exactly there (as the unweighted median of an even n) */
  for (size_t i = 0; i < n; i++) {
    acc += x[i].w;
    if (acc > total / 2) return x[i].v;
    if (acc == total / 2) return i + 1 < n ? (x[i].v + x[i + 1].v) / 2 : x[i].v;
  }
  return x[n - 1].v;
}

double ex_mad_sd(double *v, size_t n, double center) {
  for (size_t i = 0; i < n; i++) v[i] = fabs(v[i] - center);
  return EX_MAD_SD * ex_median(v, n);
}

double ex_wmad_sd(struct ex_vw *x, size_t n, double center) {
  for (size_t i = 0; i < n; i++) x[i].v = fabs(x[i].v - center);
  return EX_MAD_SD * ex_wmedian(x, n);
}
