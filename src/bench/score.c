/* SPDX-License-Identifier: MIT */
/* Scores of the counterexample benchmark, per method and budget, over the
 * scenarios that ran:
 *   cause_accuracy    the cause named is the injected one ("none" for healthy runs);
 *   culprit_accuracy  the cause and the culprit (kind and id) are both right;
 *   false_confidence  confidence >= 0.5 with the cause wrong or a culprit named
 *                     and wrong (an answer that names no culprit is incomplete,
 *                     not confidently wrong about it);
 *   telemetry_bytes   the mean bytes the method shipped per scenario;
 *   perturbation      the mean of observed / unobserved run time - 1 (measured on
 *                     the CPU backend, modelled on the simulator). */
#include "bench/bench.h"

static int wrongly_confident(const struct bench_answer *a) {
  return a->confidence >= 0.5 && (!a->cause_ok || (a->id >= 0 && !a->culprit_ok));
}

void bench_score_type(const struct bench_report *r, int method, int b, int type, struct bench_totals *out) {
  *out = (struct bench_totals){0};
  for (int i = 0; i < r->n; i++) {
    const struct bench_case *c = &r->cases[i];
    if (c->error[0] || (type != -2 && c->truth_cause != type)) continue;
    const struct bench_answer *a = &c->ans[method][b];
    out->n++;
    out->cause_accuracy += a->cause_ok;
    out->culprit_accuracy += a->culprit_ok;
    out->false_confidence += wrongly_confident(a);
    out->telemetry_bytes += (double)a->bytes;
    out->perturbation += a->perturbation;
  }
  if (!out->n) return;
  out->cause_accuracy /= out->n;
  out->culprit_accuracy /= out->n;
  out->false_confidence /= out->n;
  out->telemetry_bytes /= out->n;
  out->perturbation /= out->n;
}

void bench_score(const struct bench_report *r, int method, int b, struct bench_totals *out) {
  bench_score_type(r, method, b, -2, out);
}
