/* SPDX-License-Identifier: MIT */
/* The counterexample benchmark's report: JSON (per scenario the ground truth,
 * what was drawn, the paired run times and every method's answer at every
 * budget; per method the totals), a text table, and the data and gnuplot script
 * of the plot of accuracy against telemetry bytes. */
#include <errno.h>
#include <stdio.h>

#include "bench/bench.h"
#include "megascope/json.h"

#define RELIABILITY_BINS 4

static int split_cases(const struct bench_report *r, int split) {
  int n = 0;
  for (int i = 0; i < r->n; i++) n += r->cases[i].split == split;
  return n;
}

static const char *cause_name(int c) { return bench_cause_name(c); }

static void json_culprit(struct ms_json *j, enum ms_culprit_kind k, int id, const char *name) {
  ms_json_key(j, "culprit");
  ms_json_obj_begin(j);
  ms_json_kstr(j, "kind", ms_culprit_kind_name(k));
  ms_json_kint(j, "id", id);
  ms_json_kstr(j, "name", name);
  ms_json_obj_end(j);
}

static void json_totals(struct ms_json *j, const struct bench_totals *t) {
  ms_json_kint(j, "scenarios", t->n);
  ms_json_kint(j, "no_effect", t->no_effect);
  ms_json_knum(j, "cause_accuracy", t->cause_accuracy);
  ms_json_knum(j, "culprit_accuracy", t->culprit_accuracy);
  ms_json_knum(j, "scope_accuracy", t->scope_accuracy);
  ms_json_knum(j, "false_confidence", t->false_confidence);
  ms_json_knum(j, "telemetry_bytes", t->telemetry_bytes);
  ms_json_knum(j, "perturbation", t->perturbation);
}

static void json_truth(struct ms_json *j, const struct bench_case *c) {
  const struct bench_scenario *s = &c->sc;
  ms_json_key(j, "ground_truth");
  ms_json_obj_begin(j);
  ms_json_kstr(j, "cause", cause_name(c->truth_cause));
  json_culprit(j, c->truth_kind, c->truth_id, c->truth_name);
  if (c->n_truth > 1) {
    ms_json_key(j, "culprits");
    ms_json_arr_begin(j);
    for (int i = 0; i < c->n_truth; i++) {
      ms_json_obj_begin(j);
      ms_json_kstr(j, "cause", cause_name(c->truth[i].cause));
      json_culprit(j, c->truth[i].kind, c->truth[i].id, c->truth[i].name);
      ms_json_obj_end(j);
    }
    ms_json_arr_end(j);
  }
  const struct bench_interfere_spec *in = &s->intf;
  if (in->kind != BI_NONE) {
    ms_json_key(j, "interference");
    ms_json_obj_begin(j);
    ms_json_kstr(j, "kind", bench_interference_name(in->kind));
    if (in->kind == BI_SPIN || in->kind == BI_PREEMPT) {
      ms_json_kint(j, "worker", in->worker);
      ms_json_knum(j, "share", in->share);
    }
    if (in->kind == BI_LONG_CONTEXT) {
      ms_json_kint(j, "slot", in->slot);
      ms_json_kint(j, "tokens", in->tokens);
    }
    ms_json_knum(j, "slowdown", in->slowdown);
    ms_json_obj_end(j);
  }
  if (s->n_faults) {
    const struct bench_fault *f = &s->faults[0];
    int factor = ms_fault_uses_factor(f->type);
    ms_json_knum(j, factor ? "factor" : "delay_ns", f->magnitude);
    if (f->type == MS_FAULT_STARVE_TASK) ms_json_kint(j, "tile", f->tile);
    ms_json_kbool(j, "magnitude_tuned", !(f->given & BF_MAGNITUDE));
    if (f->severity > 0) ms_json_knum(j, "severity", f->severity);
  }
  ms_json_kstr(j, "drawn", s->drawn);
  ms_json_obj_end(j);
}

static void json_answer(struct ms_json *j, const struct bench_answer *a, uint64_t budget) {
  ms_json_obj_begin(j);
  ms_json_kuint(j, "budget", budget);
  ms_json_kstr(j, "cause", cause_name(a->cause));
  json_culprit(j, a->kind, a->id, a->name);
  ms_json_knum(j, "confidence", a->confidence);
  ms_json_knum(j, "raw_confidence", a->raw_confidence);
  if (a->weak) ms_json_kbool(j, "weak", 1);  /* named below the threshold by both judgements */
  ms_json_kuint(j, "telemetry_bytes", a->bytes);
  ms_json_knum(j, "coverage", a->coverage);
  ms_json_knum(j, "perturbation", a->perturbation);
  ms_json_kbool(j, "cause_ok", a->cause_ok);
  ms_json_kbool(j, "culprit_ok", a->culprit_ok);
  ms_json_kbool(j, "scope_ok", a->scope_ok);
  ms_json_kstr(j, "evidence", a->why);
  if (a->n_more) {
    ms_json_key(j, "more_culprits");
    ms_json_arr_begin(j);
    for (int i = 0; i < a->n_more; i++) {
      ms_json_obj_begin(j);
      ms_json_kstr(j, "cause", cause_name(a->more[i].cause));
      json_culprit(j, a->more[i].kind, a->more[i].id, a->more[i].name);
      ms_json_obj_end(j);
    }
    ms_json_arr_end(j);
  }
  ms_json_obj_end(j);
}

static void json_case(struct ms_json *j, const struct bench_report *r, const struct bench_case *c) {
  const struct bench_scenario *s = &c->sc;
  ms_json_obj_begin(j);
  ms_json_kstr(j, "name", s->name);
  ms_json_kstr(j, "split", c->split ? "held_out" : "training");
  ms_json_kstr(j, "preset", s->preset);
  if (s->gguf[0]) ms_json_kstr(j, "gguf", s->gguf);
  if (s->pin) ms_json_kbool(j, "workers_pinned", 1);
  ms_json_kstr(j, "backend", ms_backend_name(s->backend));
  if (ms_backend_info(s->backend)->cost_model) ms_json_kstr(j, "gpu", s->gpu);
  ms_json_kint(j, "batch", s->batch);
  ms_json_kint(j, "steps", s->steps);
  ms_json_kuint(j, "seed", s->seed);
  ms_json_kint(j, "tp", s->tp);
  if (c->ranks > 1) ms_json_kint(j, "ranks", c->ranks);  /* across ranks: a device is a rank */
  if (s->n_layers) ms_json_kint(j, "n_layers", s->n_layers);
  if (s->n_experts) ms_json_kint(j, "n_experts", s->n_experts);
  if (c->error[0]) {
    ms_json_kstr(j, "error", c->error);
    ms_json_obj_end(j);
    return;
  }
  json_truth(j, c);
  ms_json_knum(j, "healthy_ns", c->healthy_ns);
  ms_json_knum(j, "faulty_ns", c->faulty_ns);
  ms_json_knum(j, "slowdown", c->slowdown);
  if (!ms_backend_info(s->backend)->virtual_clock) {
    ms_json_knum(j, "healthy_ns_repeat", c->healthy_ns_b);
    ms_json_knum(j, "faulty_ns_repeat", c->faulty_ns_b);
    ms_json_knum(j, "run_to_run_spread", c->spread);
    ms_json_kint(j, "pairs", c->pairs);
    ms_json_knum(j, "slowdown_se", c->slowdown_se);
    ms_json_knum(j, "target", s->target);
  }
  ms_json_kint(j, "tuning_runs", c->tune_runs);
  ms_json_kbool(j, "no_effect", c->no_effect);
  if (c->effect[0]) ms_json_kstr(j, "effect", c->effect);
  ms_json_key(j, "answers");
  ms_json_obj_begin(j);
  for (int m = 0; m < BM_COUNT; m++) {
    ms_json_key(j, bench_method_name(m));
    ms_json_arr_begin(j);
    for (int b = 0; b < r->o.n_budgets; b++) json_answer(j, &c->ans[m][b], r->o.budgets[b]);
    ms_json_arr_end(j);
  }
  ms_json_obj_end(j);
  ms_json_obj_end(j);
}

static void json_method(struct ms_json *j, const struct bench_report *r, int split, int m) {
  struct bench_totals t;
  ms_json_key(j, bench_method_name(m));
  ms_json_obj_begin(j);
  ms_json_kuint(j, "budget", r->o.budgets[r->o.headline]);
  bench_score(r, split, m, r->o.headline, &t);
  json_totals(j, &t);
  ms_json_knum(j, "attach_ms", r->attach_ms[m]);
  ms_json_kstr(j, "attach_how", r->attach_how[m]);
  ms_json_key(j, "by_budget");
  ms_json_arr_begin(j);
  for (int b = 0; b < r->o.n_budgets; b++) {
    ms_json_obj_begin(j);
    ms_json_kuint(j, "budget", r->o.budgets[b]);
    bench_score(r, split, m, b, &t);
    json_totals(j, &t);
    ms_json_obj_end(j);
  }
  ms_json_arr_end(j);
  int n[RELIABILITY_BINS], right[RELIABILITY_BINS];
  bench_reliability(r, split, m, r->o.headline, RELIABILITY_BINS, n, right);
  ms_json_key(j, "reliability");
  ms_json_arr_begin(j);
  for (int k = 0; k < RELIABILITY_BINS; k++) {
    ms_json_obj_begin(j);
    ms_json_knum(j, "confidence_from", (double)k / RELIABILITY_BINS);
    ms_json_knum(j, "confidence_to", (double)(k + 1) / RELIABILITY_BINS);
    ms_json_kint(j, "answers", n[k]);
    ms_json_kint(j, "right", right[k]);
    ms_json_obj_end(j);
  }
  ms_json_arr_end(j);
  ms_json_key(j, "by_fault");
  ms_json_obj_begin(j);
  int types[64], nt = bench_types(types, 64);
  for (int ti = 0; ti < nt; ti++) {
    int f = types[ti];
    bench_score_type(r, split, m, r->o.headline, f, &t);
    if (!t.n && !t.no_effect) continue;
    ms_json_key(j, bench_type_name(f));
    ms_json_obj_begin(j);
    json_totals(j, &t);
    ms_json_obj_end(j);
  }
  ms_json_obj_end(j);
  ms_json_obj_end(j);
}

int bench_report_json(const struct bench_report *r, FILE *f) {
  struct ms_json j;
  ms_json_init(&j, f, 1);
  ms_json_obj_begin(&j);
  ms_json_kstr(&j, "benchmark", "counterexample");
  ms_json_kint(&j, "version", 1);
  ms_json_key(&j, "budgets");
  ms_json_arr_begin(&j);
  for (int b = 0; b < r->o.n_budgets; b++) ms_json_uint(&j, r->o.budgets[b]);
  ms_json_arr_end(&j);
  ms_json_kuint(&j, "headline_budget", r->o.budgets[r->o.headline]);
  ms_json_key(&j, "modelled_observation_ns");
  ms_json_obj_begin(&j);
  ms_json_knum(&j, "program_run", r->o.exec_ns);
  ms_json_knum(&j, "trace_record", r->o.record_ns);
  ms_json_knum(&j, "ring_record", r->o.ring_ns);
  ms_json_obj_end(&j);
  ms_json_key(&j, "scenarios");
  ms_json_arr_begin(&j);
  for (int i = 0; i < r->n; i++) json_case(&j, r, &r->cases[i]);
  ms_json_arr_end(&j);
  ms_json_key(&j, "methods");
  ms_json_obj_begin(&j);
  for (int m = 0; m < BM_COUNT; m++) json_method(&j, r, -1, m);
  ms_json_obj_end(&j);
  /* the same per split: thresholds come from the training split alone */
  ms_json_key(&j, "splits");
  ms_json_obj_begin(&j);
  for (int sp = 0; sp < 2; sp++) {
    if (!split_cases(r, sp)) continue;
    ms_json_key(&j, sp ? "held_out" : "training");
    ms_json_obj_begin(&j);
    for (int m = 0; m < BM_COUNT; m++) json_method(&j, r, sp, m);
    ms_json_obj_end(&j);
  }
  ms_json_obj_end(&j);
  ms_json_obj_end(&j);
  ms_json_end(&j);
  return ferror(f) ? -EIO : 0;
}

static void human_bytes(double b, char *buf, size_t n) {
  if (b >= 1 << 20)
    snprintf(buf, n, "%.1f MiB", b / (1 << 20));
  else if (b >= 1024)
    snprintf(buf, n, "%.1f KiB", b / 1024);
  else
    snprintf(buf, n, "%.0f B", b);
}

static const char *split_name(int sp) { return sp ? "held-out split" : "training split"; }

static void text_split(const struct bench_report *r, int sp, FILE *f) {
  char bb[32];
  struct bench_totals t;
  bench_score(r, sp, 0, r->o.headline, &t);
  human_bytes((double)r->o.budgets[r->o.headline], bb, sizeof bb);
  fprintf(f, "== %s: %d scenarios scored, %d left out (their fault had no measurable effect)\n\n", split_name(sp),
          t.n, t.no_effect);
  fprintf(f, "budget %s per scenario and method\n", bb);
  fprintf(f, "%-18s %8s %8s %8s %8s %11s %12s %10s\n", "method", "scope", "cause", "culprit", "falsely", "telemetry",
          "perturbation", "attach");
  fprintf(f, "%-18s %8s %8s %8s %8s %11s %12s %10s\n", "", "accuracy", "accuracy", "accuracy", "confident", "bytes", "",
          "ms");
  for (int m = 0; m < BM_COUNT; m++) {
    bench_score(r, sp, m, r->o.headline, &t);
    human_bytes(t.telemetry_bytes, bb, sizeof bb);
    fprintf(f, "%-18s %7.0f%% %7.0f%% %7.0f%% %8.0f%% %11s %+11.3f%% %10.2f\n", bench_method_name(m),
            100 * t.scope_accuracy, 100 * t.cause_accuracy, 100 * t.culprit_accuracy, 100 * t.false_confidence, bb,
            100 * t.perturbation, r->attach_ms[m]);
  }
  fprintf(f, "\nscope accuracy by budget\n%-18s", "method");
  for (int b = 0; b < r->o.n_budgets; b++) {
    human_bytes((double)r->o.budgets[b], bb, sizeof bb);
    fprintf(f, " %9s", bb);
  }
  fprintf(f, "\n");
  for (int m = 0; m < BM_COUNT; m++) {
    fprintf(f, "%-18s", bench_method_name(m));
    for (int b = 0; b < r->o.n_budgets; b++) {
      bench_score(r, sp, m, b, &t);
      fprintf(f, " %8.0f%%", 100 * t.scope_accuracy);
    }
    fprintf(f, "\n");
  }
  fprintf(f, "\nscope / cause accuracy by fault at the headline budget (scored, and left out for no effect)\n%-22s",
          "fault");
  for (int m = 0; m < BM_COUNT; m++) fprintf(f, " %17.17s", bench_method_name(m));
  fprintf(f, "\n");
  int types[64], nt = bench_types(types, 64);
  for (int ti = 0; ti < nt; ti++) {
    int ty = types[ti];
    struct bench_totals x;
    bench_score_type(r, sp, 0, r->o.headline, ty, &x);
    if (!x.n && !x.no_effect) continue;
    fprintf(f, "%-16s %2d+%-2d", bench_type_name(ty), x.n, x.no_effect);
    for (int m = 0; m < BM_COUNT; m++) {
      bench_score_type(r, sp, m, r->o.headline, ty, &x);
      if (x.n)
        fprintf(f, "        %4.0f/%4.0f", 100 * x.scope_accuracy, 100 * x.cause_accuracy);
      else
        fprintf(f, "        %9s", "-");
    }
    fprintf(f, "\n");
  }
  /* the seed's failure condition, said per fault type */
  fprintf(f, "\nwhere a baseline names the scope as often as the semantic monitors at the headline budget:\n");
  int any = 0;
  for (int ti = 0; ti < nt; ti++) {
    int ty = types[ti];
    struct bench_totals sem, x;
    bench_score_type(r, sp, BM_SEMANTIC, r->o.headline, ty, &sem);
    if (!sem.n) continue;
    char line[512];
    size_t len = 0;
    for (int m = 0; m < BM_COUNT; m++) {
      if (m == BM_SEMANTIC) continue;
      bench_score_type(r, sp, m, r->o.headline, ty, &x);
      if (x.scope_accuracy >= sem.scope_accuracy && len < sizeof line)
        len += (size_t)snprintf(line + len, sizeof line - len, "%s%s %.0f%%", len ? ", " : "", bench_method_name(m),
                                100 * x.scope_accuracy);
    }
    if (!len) continue;
    any = 1;
    fprintf(f, "  %-16s semantic_monitors %.0f%%; %s\n", bench_type_name(ty),
            100 * sem.scope_accuracy, line);
  }
  if (!any) fprintf(f, "  (none)\n");
  fprintf(f, "\nreliability at the headline budget: answers by stated confidence, and the share right\n%-18s",
          "method");
  for (int k = 0; k < RELIABILITY_BINS; k++) {
    char lab[24];
    snprintf(lab, sizeof lab, "%.2f-%.2f", (double)k / RELIABILITY_BINS, (double)(k + 1) / RELIABILITY_BINS);
    fprintf(f, " %14s", lab);
  }
  fprintf(f, "\n");
  for (int m = 0; m < BM_COUNT; m++) {
    int n[RELIABILITY_BINS], right[RELIABILITY_BINS];
    bench_reliability(r, sp, m, r->o.headline, RELIABILITY_BINS, n, right);
    fprintf(f, "%-18s", bench_method_name(m));
    for (int k = 0; k < RELIABILITY_BINS; k++) {
      if (n[k])
        fprintf(f, "   %3d at %3.0f%%", n[k], 100.0 * right[k] / n[k]);
      else
        fprintf(f, " %14s", "-");
    }
    fprintf(f, "\n");
  }
  fprintf(f, "\n");
}

static void text_side_by_side(const struct bench_report *r, FILE *f) {
  fprintf(f, "== side by side at the headline budget: scope / cause / falsely confident\n%-18s %22s %22s\n", "method",
          "training", "held out");
  for (int m = 0; m < BM_COUNT; m++) {
    struct bench_totals a, b;
    bench_score(r, 0, m, r->o.headline, &a);
    bench_score(r, 1, m, r->o.headline, &b);
    fprintf(f, "%-18s       %4.0f/%4.0f/%4.0f%%       %4.0f/%4.0f/%4.0f%%\n", bench_method_name(m),
            100 * a.scope_accuracy, 100 * a.cause_accuracy, 100 * a.false_confidence, 100 * b.scope_accuracy,
            100 * b.cause_accuracy, 100 * b.false_confidence);
  }
}

int bench_report_text(const struct bench_report *r, FILE *f) {
  int ran = 0;
  double hsum = 0, fsum = 0, worst = 0;
  for (int i = 0; i < r->n; i++) {
    const struct bench_case *c = &r->cases[i];
    if (c->error[0]) continue;
    ran++;
    hsum += c->healthy_ns;
    fsum += c->faulty_ns;
    if (c->slowdown > worst) worst = c->slowdown;
  }
  char bb[32];
  human_bytes((double)r->o.budgets[r->o.headline], bb, sizeof bb);
  fprintf(f, "%d scenarios ran of %d; the outer view: healthy %.3f ms, faulty %.3f ms on average (%+.2f%%, worst %+.2f%%)\n\n",
          ran, r->n, ran ? hsum / ran / 1e6 : 0, ran ? fsum / ran / 1e6 : 0, hsum > 0 ? 100 * (fsum / hsum - 1) : 0,
          100 * worst);
  for (int k = 0; k < MS_BACKEND_COUNT; k++) {  /* the backends on a real clock */
    const enum ms_backend be = (enum ms_backend)k;
    if (ms_backend_info(be)->virtual_clock) continue;
    double sp_sum = 0, tg_sum = 0;
    int n_real = 0;
    for (int i = 0; i < r->n; i++)
      if (!r->cases[i].error[0] && r->cases[i].sc.backend == be) {
        sp_sum += r->cases[i].spread;
        tg_sum += r->cases[i].sc.target;
        n_real++;
      }
    int pairs = 0;
    for (int i = 0; i < r->n; i++)
      if (!r->cases[i].error[0] && r->cases[i].sc.backend == be) pairs += r->cases[i].pairs;
    if (n_real)
      fprintf(f, "%s backend: two healthy runs differ by %.2f%% (the median of 5 pairs, mean over %d scenarios); "
                 "faults sized to at most %.2f%% on average (2x that, at least the scenario's target); effects "
                 "measured with %.1f paired runs on average (5 to %d, until the slowdown stood at 4 standard errors "
                 "or its standard error fell under a tenth of the target)\n\n",
              ms_backend_info(be)->label, 100 * sp_sum / n_real, n_real, 100 * tg_sum / n_real,
              (double)pairs / n_real, 30);
  }
  for (int sp = 0; sp < 2; sp++)
    if (split_cases(r, sp)) text_split(r, sp, f);
  if (split_cases(r, 0) && split_cases(r, 1)) text_side_by_side(r, f);
  return ferror(f) ? -EIO : 0;
}

int bench_report_plot(const struct bench_report *r, const char *dat_path, const char *gp_path, const char *png_path) {
  FILE *d = fopen(dat_path, "w");
  if (!d) return -errno;
  fprintf(d, "# method budget telemetry_bytes cause_accuracy culprit_accuracy false_confidence scope_accuracy\n");
  for (int m = 0; m < BM_COUNT; m++) {
    fprintf(d, "# %s\n", bench_method_name(m));
    for (int b = 0; b < r->o.n_budgets; b++) {
      struct bench_totals t;
      bench_score(r, -1, m, b, &t);
      fprintf(d, "%d %llu %.1f %.4f %.4f %.4f %.4f\n", m, (unsigned long long)r->o.budgets[b],
              t.telemetry_bytes > 1 ? t.telemetry_bytes : 1, t.cause_accuracy, t.culprit_accuracy, t.false_confidence,
              t.scope_accuracy);
    }
    fprintf(d, "\n\n");
  }
  int rc = fclose(d) ? -EIO : 0;
  FILE *g = fopen(gp_path, "w");
  if (!g) return -errno;
  int ran = 0;
  for (int i = 0; i < r->n; i++) ran += !r->cases[i].error[0];
  fprintf(g,
          "# gnuplot script written by megascope bench diagnose\n"
          "set terminal png size 1000,620 font \",11\" noenhanced\n"
          "set output '%s'\n"
          "set format x '%%.0b %%BB'\n"
          "set title 'Counterexample benchmark: %d scenarios, accuracy against telemetry bytes per scenario'\n"
          "set logscale x 2\n"
          "set xlabel 'telemetry bytes shipped per scenario (mean)'\n"
          "set ylabel 'accuracy'\n"
          "set yrange [-0.02:1.05]\n"
          "set key outside right top\n"
          "set grid\n"
          "plot ",
          png_path, ran);
  for (int m = 0; m < BM_COUNT; m++)
    fprintf(g, "'%s' index %d using 3:7 with linespoints lw 2 pt %d lc %d title '%s scope', \\\n"
               "     '%s' index %d using 3:4 with linespoints dt 2 pt 1 lc %d title '%s cause'%s",
            dat_path, m, 5 + m, m + 1, bench_method_name(m), dat_path, m, m + 1, bench_method_name(m),
            m + 1 < BM_COUNT ? ", \\\n     " : "\n");
  if (fclose(g)) rc = -EIO;
  return rc;
}
