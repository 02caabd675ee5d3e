/* SPDX-License-Identifier: MIT */
/* Robust statistics for explain: medians, weighted medians and the median
 * absolute deviation, on small arrays the caller owns (they are sorted in
 * place). 1.4826 x MAD estimates a normal scatter's standard deviation while a
 * few culprits among the values move it little; that is the whole reason to
 * use it here. */
#ifndef MS_EXPLAIN_STATS_H
#define MS_EXPLAIN_STATS_H

#include <stddef.h>

#define EX_MAD_SD 1.4826

struct ex_vw {
  double v, w;
};

/* The median of v[0..n) (sorts v); NAN when n == 0. */
double ex_median(double *v, size_t n);
/* The weighted median of (v, w) pairs (sorts them); NAN when no weight. */
double ex_wmedian(struct ex_vw *x, size_t n);
/* 1.4826 x the median of |v - center| (overwrites v); NAN when n == 0. */
double ex_mad_sd(double *v, size_t n, double center);
/* The same with weights (overwrites x). */
double ex_wmad_sd(struct ex_vw *x, size_t n, double center);

#endif
