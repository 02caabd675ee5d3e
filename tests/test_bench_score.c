/* SPDX-License-Identifier: MIT */
/* The counterexample benchmark's scores (src/bench/score.c) against a small
 * file scored by hand, tests/data/score/hand_scored.json: ten cases, two
 * methods, one budget, graded answer by answer, with every expected figure
 * (accuracies, false confidence, bytes and perturbation per split and per fault
 * type, which answers are right, the reliability bins, the calibrated
 * confidences) worked out by hand from the rows. The cases hold the edge cases
 * of the definitions: an "unknown" cause with the right culprit (right, not
 * confidently wrong), an unknown cause naming no culprit at confidence 0.9
 * (incomplete, not confidently wrong), a healthy run blamed on a fault, a fault
 * called healthy, a case whose fault had no effect (counted apart) and one that
 * could not run (left out). The file is missing: exit 77. */
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench.h"
#include "test.h"

#define N_CASES 10

static const char *const methods[] = {"semantic", "kernel_timing"};

static int method_id(json_t *root, const char *name) {
  return (int)json_integer_value(json_object_get(json_object_get(root, "methods"), name));
}

static void answer_of(json_t *a, struct bench_answer *out) {
  json_t *ans = json_object_get(a, "ans");
  memset(out, 0, sizeof *out);
  out->cause = (int)json_integer_value(json_array_get(ans, 0));
  out->kind = (enum ms_culprit_kind)json_integer_value(json_array_get(ans, 1));
  out->id = (int)json_integer_value(json_array_get(ans, 2));
  out->confidence = json_number_value(json_object_get(a, "conf"));
  out->raw_confidence = json_number_value(json_object_get(a, "raw"));
  out->bytes = (uint64_t)json_integer_value(json_object_get(a, "bytes"));
  out->perturbation = json_number_value(json_object_get(a, "pert"));
  out->cause_ok = (int)json_integer_value(json_object_get(a, "c"));
  out->scope_ok = (int)json_integer_value(json_object_get(a, "s"));
  out->culprit_ok = (int)json_integer_value(json_object_get(a, "u"));
}

/* The report the file describes: one budget; methods not in the file answer
 * nothing (all zero). */
static int report_of(json_t *root, struct bench_report *r) {
  json_t *cases = json_object_get(root, "cases");
  memset(r, 0, sizeof *r);
  r->o.n_budgets = 1;
  r->n = (int)json_array_size(cases);
  if (r->n != N_CASES || !(r->cases = calloc((size_t)r->n, sizeof *r->cases))) return -1;
  for (int i = 0; i < r->n; i++) {
    json_t *c = json_array_get(cases, (size_t)i), *truth = json_object_get(c, "truth");
    struct bench_case *bc = &r->cases[i];
    bc->split = (int)json_integer_value(json_object_get(c, "split"));
    bc->truth_cause = (int)json_integer_value(json_array_get(truth, 0));
    bc->truth_kind = (enum ms_culprit_kind)json_integer_value(json_array_get(truth, 1));
    bc->truth_id = (int)json_integer_value(json_array_get(truth, 2));
    bc->no_effect = json_is_true(json_object_get(c, "no_effect"));
    const char *err = json_string_value(json_object_get(c, "error"));
    if (err) snprintf(bc->error, sizeof bc->error, "%s", err);
    for (size_t m = 0; m < sizeof methods / sizeof *methods; m++)
      answer_of(json_object_get(c, methods[m]), &bc->ans[method_id(root, methods[m])][0]);
  }
  return 0;
}

static int near(double a, double b) { return fabs(a - b) <= 1e-9 * (1 + fabs(b)); }

static void check_scores(json_t *root, const struct bench_report *r) {
  size_t i;
  json_t *s;
  json_array_foreach(json_object_get(root, "scores"), i, s) {
    const char *mname = json_string_value(json_object_get(s, "method"));
    int split = (int)json_integer_value(json_object_get(s, "split"));
    int type = (int)json_integer_value(json_object_get(s, "type"));
    struct bench_totals t;
    if (type == -2) bench_score(r, split, method_id(root, mname), 0, &t);
    else bench_score_type(r, split, method_id(root, mname), 0, type, &t);
#define WANT(field, key)                                                                                    \
  CHECKF(near((double)t.field, json_number_value(json_object_get(s, key))), "%s split %d type %d: " key " %g, " \
         "by hand %g", mname, split, type, (double)t.field, json_number_value(json_object_get(s, key)))
    WANT(n, "n");
    WANT(no_effect, "no_effect");
    WANT(cause_accuracy, "cause");
    WANT(culprit_accuracy, "culprit");
    WANT(scope_accuracy, "scope");
    WANT(false_confidence, "false_confidence");
    WANT(telemetry_bytes, "bytes");
    WANT(perturbation, "perturbation");
#undef WANT
  }
}

static void check_right(json_t *root, const struct bench_report *r) {
  for (size_t m = 0; m < sizeof methods / sizeof *methods; m++) {
    json_t *want = json_object_get(json_object_get(root, "right"), methods[m]);
    for (int i = 0; i < r->n; i++) {
      int got = bench_answer_right(&r->cases[i].ans[method_id(root, methods[m])][0]);
      CHECKF(got == json_integer_value(json_array_get(want, (size_t)i)), "%s case %d: right %d, by hand %lld",
             methods[m], i + 1, got, (long long)json_integer_value(json_array_get(want, (size_t)i)));
    }
  }
}

static void check_reliability(json_t *root, const struct bench_report *r) {
  json_t *rel = json_object_get(root, "reliability");
  int bins = (int)json_integer_value(json_object_get(rel, "bins")), n[16], right[16];
  bench_reliability(r, (int)json_integer_value(json_object_get(rel, "split")),
                    method_id(root, json_string_value(json_object_get(rel, "method"))), 0, bins, n, right);
  for (int k = 0; k < bins; k++) {
    CHECKF(n[k] == json_integer_value(json_array_get(json_object_get(rel, "n"), (size_t)k)), "bin %d: %d answers", k,
           n[k]);
    CHECKF(right[k] == json_integer_value(json_array_get(json_object_get(rel, "right"), (size_t)k)),
           "bin %d: %d right", k, right[k]);
  }
}

static void check_calibration(json_t *root, struct bench_report *r) {
  bench_calibrate(r);
  CHECK(r->cal.learned);
  json_t *cal = json_object_get(root, "calibrated");
  for (size_t m = 0; m < sizeof methods / sizeof *methods; m++)
    for (int i = 0; i < r->n; i++) {
      double got = r->cases[i].ans[method_id(root, methods[m])][0].confidence;
      double want = json_number_value(json_array_get(json_object_get(cal, methods[m]), (size_t)i));
      CHECKF(fabs(got - want) < 1e-9, "%s case %d: calibrated confidence %.6f, by hand %.6f", methods[m], i + 1, got,
             want);
    }
}

int main(void) {
  const char *src = getenv("MS_SRC") ? getenv("MS_SRC") : ".";
  char path[1024];
  snprintf(path, sizeof path, "%s/tests/data/score/hand_scored.json", src);
  json_error_t err;
  json_t *root = json_load_file(path, 0, &err);
  if (!root) {
    printf("SKIP: %s: %s\n", path, err.text);
    return 77;
  }
  struct bench_report r;
  CHECK(report_of(root, &r) == 0);
  if (r.cases) {
    check_scores(root, &r);
    check_right(root, &r);
    check_reliability(root, &r);
    check_calibration(root, &r);
  }
  free(r.cases);
  json_decref(root);
  TEST_MAIN_END();
}
