/* SPDX-License-Identifier: MIT */
/* Scores of the counterexample benchmark, per split, method and budget, over
 * the scenarios that ran and whose fault had a measurable effect:
 *   cause_accuracy    the cause named is the injected one ("none" for healthy runs);
 *   culprit_accuracy  the cause and the culprit (kind and id) are both right;
 *   scope_accuracy    the culprit is right whatever the cause label ("unknown
 *                     cause, worker 7" is right for a throttled worker 7); for a
 *                     healthy run, "none";
 *   false_confidence  confidence >= 0.5 and wrong in something asserted: a
 *                     culprit named and wrong, or a cause named (not "unknown")
 *                     and wrong; an answer that names no culprit, or some of
 *                     several, is incomplete, not confidently wrong about them;
 *   telemetry_bytes   the mean bytes the method shipped per scenario;
 *   perturbation      the mean of observed / unobserved run time - 1 (measured on
 *                     the CPU backend, modelled on the simulator).
 * Scenarios whose tuned fault had no measurable effect are counted apart
 * (no_effect) and left out of every score. */
#include <string.h>

#include "bench/bench.h"

static int cause_wrong(const struct bench_answer *a) { return a->cause != -2 && !a->cause_ok; }
static int scope_wrong(const struct bench_answer *a) { return a->id >= 0 && !a->scope_ok; }

int bench_answer_right(const struct bench_answer *a) {
  /* healthy: scope_ok is "said none"; faulty: the culprit, and the cause unless "unknown";
   * several culprits: each named, each with its cause or "unknown" */
  return a->multi ? a->scope_ok && !a->wrong_named : a->scope_ok && !cause_wrong(a);
}

static int wrongly_confident(const struct bench_answer *a) {
  return a->confidence >= 0.5 && (a->multi ? a->wrong_named : cause_wrong(a) || scope_wrong(a));
}

/* Bin k of n_bins equal bins of confidence 0..1. */
static int conf_bin(double c, int n_bins) {
  int k = (int)(c * n_bins);
  return k < 0 ? 0 : k >= n_bins ? n_bins - 1 : k;
}

int bench_case_type(const struct bench_case *c) {
  if (c->n_truth > 1) return BENCH_TYPE_MULTI;
  if (c->n_truth == 1 && c->truth[0].cause >= BENCH_CAUSE_INTERFERE)
    return BENCH_TYPE_INTERFERE + c->truth[0].cause - BENCH_CAUSE_INTERFERE;
  return c->truth_cause;
}

const char *bench_type_name(int type) {
  if (type == -1) return "healthy";
  if (type == BENCH_TYPE_MULTI) return "several";
  if (type >= BENCH_TYPE_INTERFERE) return bench_interference_name(type - BENCH_TYPE_INTERFERE);
  return ms_fault_type_name((enum ms_fault_type)type);
}

int bench_types(int *out, int max) {
  int n = 0;
  for (int t = -1; t < MS_FAULT_TYPE_COUNT && n < max; t++) out[n++] = t;
  for (int k = BI_SPIN; k < BI_COUNT && n < max; k++) out[n++] = BENCH_TYPE_INTERFERE + k;
  if (n < max) out[n++] = BENCH_TYPE_MULTI;
  return n;
}

static int counted(const struct bench_report *r, int i, int split, int type) {
  const struct bench_case *c = &r->cases[i];
  return !c->error[0] && (split < 0 || c->split == split) && (type == -2 || bench_case_type(c) == type);
}

void bench_score_type(const struct bench_report *r, int split, int method, int b, int type, struct bench_totals *out) {
  *out = (struct bench_totals){0};
  for (int i = 0; i < r->n; i++) {
    if (!counted(r, i, split, type)) continue;
    const struct bench_case *c = &r->cases[i];
    if (c->no_effect) {
      out->no_effect++;
      continue;
    }
    const struct bench_answer *a = &c->ans[method][b];
    out->n++;
    out->cause_accuracy += a->cause_ok;
    out->culprit_accuracy += a->culprit_ok;
    out->scope_accuracy += a->scope_ok;
    out->false_confidence += wrongly_confident(a);
    out->telemetry_bytes += (double)a->bytes;
    out->perturbation += a->perturbation;
  }
  if (!out->n) return;
  out->cause_accuracy /= out->n;
  out->culprit_accuracy /= out->n;
  out->scope_accuracy /= out->n;
  out->false_confidence /= out->n;
  out->telemetry_bytes /= out->n;
  out->perturbation /= out->n;
}

void bench_score(const struct bench_report *r, int split, int method, int b, struct bench_totals *out) {
  bench_score_type(r, split, method, b, -2, out);
}

void bench_reliability(const struct bench_report *r, int split, int method, int b, int n_bins, int *n, int *right) {
  for (int k = 0; k < n_bins; k++) n[k] = right[k] = 0;
  for (int i = 0; i < r->n; i++) {
    if (!counted(r, i, split, -2) || r->cases[i].no_effect) continue;
    const struct bench_answer *a = &r->cases[i].ans[method][b];
    int k = conf_bin(a->confidence, n_bins);
    n[k]++;
    right[k] += bench_answer_right(a);
  }
}

/* What each bin of raw confidence states: the training accuracy of the run of
 * bins it is pooled with, shrunk toward 0 by two answers (a bin has to earn its
 * confidence: one right answer states 1/3, not 2/3). Bins are pooled with their
 * neighbours until the accuracy never falls as the raw confidence rises (pool
 * adjacent violators): with a handful of answers a bin, training cannot show a
 * higher raw score to be less sure, so a bin that happened to be right three
 * times in three is not read as surer than its neighbour's two wrong. Nor can
 * it show one to be surer: a pool of fewer than CAL_MIN_POOL answers joins the
 * pool below it, so a higher raw score states more only where training saw
 * enough answers there to tell (a share of 4 answers is +-0.25 by its standard
 * error alone; on the CPU's 30 training cases "none" at raw 0.2-0.6, one pool,
 * was right 3 times in 4 and stated 0.50 while "none" answers were right about
 * half the time over fifteen held-out files). Joining lifts what the pool below states
 * too: on the simulator, whose training "none" answers were right 5 of 5, a
 * low raw "none" states 0.71 where it stated 0.33 (docs/benchmark.md, section
 * 7). An empty bin states what the pool below it does (0 below every answer):
 * it has earned nothing more. */
#define CAL_MIN_POOL 8
static void monotone(const int *n, const int *right, double *out) {
  int lo[BENCH_CAL_BINS], cnt[BENCH_CAL_BINS], ok[BENCH_CAL_BINS], k = 0;
  for (int i = 0; i < BENCH_CAL_BINS; i++) {
    if (!n[i]) continue;
    lo[k] = i, cnt[k] = n[i], ok[k] = right[i];
    /* merge while the pool before has the higher accuracy (ok/cnt, cross-multiplied) */
    while (k > 0 && (long)ok[k - 1] * cnt[k] > (long)ok[k] * cnt[k - 1]) {
      cnt[k - 1] += cnt[k];
      ok[k - 1] += ok[k];
      k--;
    }
    k++;
  }
  /* small pools join the one below (never the one above: that would raise
   * what a low raw score states); the accuracies still rise, a merged pool's
   * lying between its two, both at or below the pool above */
  int m = k ? 1 : 0;
  for (int j = 1; j < k; j++) {
    if (cnt[j] < CAL_MIN_POOL) {
      cnt[m - 1] += cnt[j];
      ok[m - 1] += ok[j];
    } else {
      lo[m] = lo[j], cnt[m] = cnt[j], ok[m] = ok[j];
      m++;
    }
  }
  k = m;
  double v = 0;
  for (int i = 0, j = 0; i < BENCH_CAL_BINS; i++) {
    while (j < k && lo[j] <= i) {
      v = ok[j] / (cnt[j] + 2.0);
      j++;
    }
    out[i] = v;
  }
}

/* The kind of answer a calibration bin holds: "none", a scope named, or a
 * weak finding (named below the threshold by two judgements agreeing: its
 * raw confidence is not the named answers' scale, so it earns its own). */
static int cal_kind(const struct bench_answer *a) { return a->cause == -1 ? 0 : a->weak ? 2 : 1; }

void bench_calibrate(struct bench_report *r) {
  struct bench_calibration *cal = &r->cal;
  memset(cal, 0, sizeof *cal);
  for (int i = 0; i < r->n; i++) {
    const struct bench_case *c = &r->cases[i];
    if (c->error[0] || c->no_effect || c->split != 0) continue;
    cal->learned = 1;
    for (int m = 0; m < BM_COUNT; m++)
      for (int b = 0; b < r->o.n_budgets; b++) {
        const struct bench_answer *a = &c->ans[m][b];
        int kind = cal_kind(a), k = conf_bin(a->raw_confidence, BENCH_CAL_BINS);
        cal->n[m][b][kind][k]++;
        cal->right[m][b][kind][k] += bench_answer_right(a);
      }
  }
  if (!cal->learned) return;
  double stated[BM_COUNT][BENCH_MAX_BUDGETS][BENCH_CAL_KINDS][BENCH_CAL_BINS];
  for (int m = 0; m < BM_COUNT; m++)
    for (int b = 0; b < r->o.n_budgets; b++)
      for (int kind = 0; kind < BENCH_CAL_KINDS; kind++)
        monotone(cal->n[m][b][kind], cal->right[m][b][kind], stated[m][b][kind]);
  for (int i = 0; i < r->n; i++)
    for (int m = 0; m < BM_COUNT && !r->cases[i].error[0]; m++)
      for (int b = 0; b < r->o.n_budgets; b++) {
        struct bench_answer *a = &r->cases[i].ans[m][b];
        int kind = cal_kind(a), k = conf_bin(a->raw_confidence, BENCH_CAL_BINS);
        a->confidence = stated[m][b][kind][k];
      }
}
