/* SPDX-License-Identifier: MIT */
/* Running the counterexample benchmark: for every scenario, the paired healthy
 * and faulty runs (same seed, unobserved: the outer view), the magnitude tuning
 * that keeps the faulty run within the target of the healthy one, every
 * method's observed run and diagnosis at every budget, and the healthy
 * references the diagnosers compare with (one per configuration and method,
 * another seed, cached).
 *
 * Tuning. A fault whose magnitude the file left out gets the one whose slowdown
 * is closest to severity x target without passing the target: start from a
 * small magnitude, grow it until the run is measurably slower, then scale it
 * by goal / slowdown (the slowdown is close to proportional) a few times. On
 * the simulator a run is exact; on the CPU and CUDA backends (real clocks) a
 * slowdown is the median of five paired runs and the tuning is as good as the
 * machine's noise allows (the report shows the pairs). */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench.h"
#include "megascope/plan_ir.h"

#define MAX_CONFIGS 64

/* The healthy references of one configuration: per method, and for the trace
 * and the sampled events per budget (a reference taken the same way, so that a
 * truncation or a sampling rate biases both sides alike). */
struct ref_entry {
  char key[320];
  struct bench_evidence ev[BM_COUNT][BENCH_MAX_BUDGETS];
  int have[BM_COUNT][BENCH_MAX_BUDGETS];
};

struct runner {
  const struct bench_opts *o;
  struct ref_entry refs[MAX_CONFIGS];
  int n_refs;
  char logbuf[8192];
  struct ms_textbuf log;
  double restart_ns_sum, attach_ns_sum;
  int restart_n, attach_n;
};

static void say(struct runner *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void say(struct runner *r, const char *fmt, ...) {
  if (!r->o->progress) return;
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  r->o->progress(r->o->progress_user, msg);
}

static void config_key(const struct bench_scenario *s, char *k, size_t n) {
  int len = snprintf(k, n, "%s|%d|%d|%d|%d|%s|%d|%d|%d|%d|%d|%g", s->preset, s->n_layers, s->n_experts, s->top_k,
                     s->expert_ffn_dim, s->gpu, (int)s->backend, s->batch, s->steps, s->tp, s->workers, s->jitter);
  for (int i = 0; i < s->n_params && len > 0 && (size_t)len < n; i++)
    len += snprintf(k + len, n - (size_t)len, "|%s=%s", s->params[i][0], s->params[i][1]);
}

/* ---- faults and slowdowns ---- */

static double magnitude_of(enum ms_fault_type t, double s) {
  if (ms_fault_factor_is_slowdown(t)) return 1 + s;
  if (t == MS_FAULT_ROUTING_SKEW || t == MS_FAULT_QUEUE_SATURATION) return s < 1 ? s : 1;
  return s;
}

static double initial_strength(enum ms_fault_type t, double healthy_ns, int steps, int workers) {
  switch (t) {
  case MS_FAULT_SLOW_CLASS:
  case MS_FAULT_SLOW_REQUEST: return 0.25;
  case MS_FAULT_SLOW_WORKER:
  case MS_FAULT_BANDWIDTH_STEAL:
  case MS_FAULT_SLOW_LAYER: return 0.02;
  case MS_FAULT_ROUTING_SKEW: return 0.25;
  case MS_FAULT_QUEUE_SATURATION: return 0.5 / workers;
  default: return 0.002 * healthy_ns / steps;  /* a delay of 0.2% of a step */
  }
}

static void to_faults(const struct bench_scenario *s, struct ms_fault *out) {
  for (int i = 0; i < s->n_faults; i++) {
    const struct bench_fault *f = &s->faults[i];
    out[i] = (struct ms_fault){.type = f->type, .target = f->target_id, .tile = f->tile};
    if (ms_fault_uses_factor(f->type))
      out[i].factor = f->magnitude;
    else
      out[i].delay_ns = (uint64_t)f->magnitude;
  }
}

/* One unobserved run's time; 0 on failure. */
static double run_once(struct runner *r, const struct ms_model *m, const struct bench_scenario *s, int faulty,
                       uint64_t seed) {
  struct ms_fault fl[BENCH_MAX_FAULTS];
  to_faults(s, fl);
  struct bench_engine_cfg c = {.m = m, .sc = s, .faults = faulty ? fl : NULL, .n_faults = faulty ? s->n_faults : 0,
                               .seed = seed};
  r->log.len = 0;
  struct ms_engine *e = bench_engine_new(&c, &r->log);
  if (!e) return 0;
  double t = (double)bench_engine_drive(e, s);
  ms_engine_free(e);
  return t;
}

static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* Faulty / healthy - 1, paired on the seed: exact on the simulator; on the CPU
 * the median of five back-to-back pairs' ratios (a shared machine's speed
 * drifts between pairs more than within one), with the pair's times the
 * medians. */
static double slowdown(struct runner *r, const struct ms_model *m, const struct bench_scenario *s, double *healthy,
                       double *faulty) {
  int reps = s->backend == MS_BACKEND_SIM ? 1 : 5;
  double h[5], f[5], q[5];
  for (int i = 0; i < reps; i++) {
    h[i] = run_once(r, m, s, 0, s->seed);
    f[i] = run_once(r, m, s, 1, s->seed);
    q[i] = h[i] > 0 ? f[i] / h[i] : 1;
  }
  qsort(h, (size_t)reps, sizeof *h, cmp_d);
  qsort(f, (size_t)reps, sizeof *f, cmp_d);
  qsort(q, (size_t)reps, sizeof *q, cmp_d);
  *healthy = h[reps / 2];
  *faulty = f[reps / 2];
  return q[reps / 2] - 1;
}

/* The CPU backend: how much two healthy runs of the same seed differ (the median
 * of five back-to-back pairs), and the target raised to three times that: a
 * fault sized below the machine's own noise measures the machine, not the
 * methods. The report gives both. */
static void size_to_noise(struct runner *r, const struct ms_model *m, struct bench_case *c) {
  struct bench_scenario *s = &c->sc;
  if (s->backend == MS_BACKEND_SIM) return;
  double q[5];
  for (int i = 0; i < 5; i++) {
    double a = run_once(r, m, s, 0, s->seed), b = run_once(r, m, s, 0, s->seed);
    q[i] = a > 0 && b > 0 ? fabs(a / b - 1) : 0;
  }
  qsort(q, 5, sizeof *q, cmp_d);
  c->spread = q[2];
  if (s->target < 3 * c->spread) s->target = 3 * c->spread;
}

static void tune(struct runner *r, const struct ms_model *m, struct bench_case *c, int workers) {
  struct bench_scenario *s = &c->sc;
  double h = 0, f = 0;
  size_to_noise(r, m, c);
  for (int i = 0; i < s->n_faults; i++) {
    struct bench_fault *fl = &s->faults[i];
    if (fl->given & BF_MAGNITUDE) continue;
    double goal = fl->severity * s->target, st = initial_strength(fl->type, c->healthy_ns, s->steps, workers);
    double best_s = -1, best_d = 0, low_s = st, low_d = 1e9;
    double lo = -1, d_lo = 0, hi = -1, d_hi = 0;  /* strengths known to fall short of / pass the goal */
    int iters = s->backend == MS_BACKEND_SIM ? 12 : 6;
    for (int it = 0; it < iters; it++) {
      fl->magnitude = magnitude_of(fl->type, st);
      double d = slowdown(r, m, s, &h, &f);
      c->tune_runs++;
      if (d < low_d) low_d = d, low_s = st;
      if (d <= s->target && (best_s < 0 || fabs(d - goal) < fabs(best_d - goal))) best_s = st, best_d = d;
      if (d <= s->target && fabs(d - goal) <= 0.2 * goal) break;
      if (d < goal)
        lo = st, d_lo = d;
      else
        hi = st, d_hi = d;
      double next;
      if (lo >= 0 && hi >= 0) {
        /* bracketed: interpolate, or halve (geometrically when the bracket is wide) */
        next = lo + (hi - lo) * (goal - d_lo) / (d_hi - d_lo);
        if (!(next > lo + 0.05 * (hi - lo) && next < hi - 0.05 * (hi - lo)))
          next = hi > 4 * lo && lo > 0 ? sqrt(lo * hi) : (lo + hi) / 2;
      } else if (hi < 0) {
        next = d < 1e-4 ? st * 8 : fmin(st * goal / d, st * 10);
      } else {
        next = fmax(st * goal / d, st / 10);
      }
      if (magnitude_of(fl->type, next) == magnitude_of(fl->type, st)) break;  /* a share at 1 cannot grow */
      st = next;
    }
    fl->magnitude = magnitude_of(fl->type, best_s >= 0 ? best_s : low_s);
  }
  c->healthy_ns = 0;
  double d = slowdown(r, m, s, &c->healthy_ns, &c->faulty_ns);
  c->slowdown = d;
  for (int i = 0; i < s->n_faults; i++) s->faults[i].slowdown = d;
  if (s->backend != MS_BACKEND_SIM) slowdown(r, m, s, &c->healthy_ns_b, &c->faulty_ns_b);
}

/* ---- references ---- */

static int per_budget(int method) {
  return method == BM_TASK_TRACE || method == BM_SAMPLED_EVENTS || method == BM_PROFILER;
}

static void ref_free(struct ref_entry *e) {
  for (int k = 0; k < BM_COUNT; k++)
    for (int b = 0; b < BENCH_MAX_BUDGETS; b++) bench_evidence_free(&e->ev[k][b]);
}

static const struct bench_evidence *reference(struct runner *r, const struct ms_model *m,
                                              const struct bench_scenario *s, int method, int b) {
  char key[320];
  config_key(s, key, sizeof key);
  struct ref_entry *e = NULL;
  for (int i = 0; i < r->n_refs; i++)
    if (!strcmp(r->refs[i].key, key)) e = &r->refs[i];
  if (!e) {
    if (r->n_refs == MAX_CONFIGS) {  /* forget the oldest */
      ref_free(&r->refs[0]);
      memmove(&r->refs[0], &r->refs[1], sizeof r->refs[0] * (MAX_CONFIGS - 1));
      r->n_refs--;
    }
    e = &r->refs[r->n_refs++];
    memset(e, 0, sizeof *e);
    snprintf(e->key, sizeof e->key, "%s", key);
  }
  if (!per_budget(method)) b = 0;
  if (!e->have[method][b]) {
    uint64_t seed = 0x5eed;
    for (const char *p = key; *p; p++) seed = seed * 131 + (unsigned char)*p;
    struct bench_engine_cfg c = {.m = m, .sc = s, .seed = seed % 1000003};
    r->log.len = 0;
    if (bench_observe(r->o, &c, method, per_budget(method) ? r->o->budgets[b] : 0, &e->ev[method][b], &r->log))
      return NULL;
    e->have[method][b] = 1;
  }
  return &e->ev[method][b];
}

/* ---- one scenario ---- */

static void truth_of(struct bench_case *c, const struct ms_plan *p) {
  if (!c->sc.n_faults) {
    c->truth_cause = -1;
    c->truth_kind = MS_CULPRIT_NONE;
    c->truth_id = -1;
    snprintf(c->truth_name, sizeof c->truth_name, "-");
    return;
  }
  const struct bench_fault *f = &c->sc.faults[0];
  c->truth_cause = f->type;
  c->truth_kind = ms_fault_culprit_kind(f->type);
  c->truth_id = f->target_id;
  bench_culprit_name(p, c->truth_kind, c->truth_id, c->truth_name, sizeof c->truth_name);
}

static void judge(const struct bench_case *c, struct bench_answer *a) {
  a->cause_ok = a->cause == c->truth_cause;
  a->scope_ok = c->truth_cause < 0 ? a->cause == -1 : a->kind == c->truth_kind && a->id == c->truth_id;
  a->culprit_ok = a->cause_ok && a->scope_ok;
}

/* Whether the tuned fault does anything measurable: routing skew by the rows it
 * moves (under the simulator's shape spread; on the CPU the router's real
 * choices, counted as the rows it would move), every other fault by the outer
 * view. A fault that does nothing is reported and left out of the scores: no
 * method can be asked to see it. */
static void check_effect(struct bench_case *c, const struct ms_model *m) {
  const struct bench_scenario *s = &c->sc;
  if (!s->n_faults) return;
  const struct bench_fault *f = &s->faults[0];
  if (f->type == MS_FAULT_ROUTING_SKEW) {
    const struct ms_model_config *mc = &m->cfg;
    int moved = s->backend == MS_BACKEND_SIM ? ms_fault_skew_moves(f->magnitude, s->batch, mc->n_experts, mc->top_k,
                                                                   f->target_id)
                                             : ms_fault_skew_moves(f->magnitude, s->batch, 1 << 30, 1, -1);
    snprintf(c->effect, sizeof c->effect, "%d of %d rows routed to expert %d instead of their last choice", moved,
             s->batch, f->target_id);
    c->no_effect = moved == 0;
    return;
  }
  /* the simulator's pairs share their jitter, so 0.1% is a real difference; the
   * CPU's pairs move by their measured spread */
  double floor = s->backend == MS_BACKEND_SIM ? 0.001 : fmax(0.01, 2 * c->spread);
  snprintf(c->effect, sizeof c->effect, "the run %+.3f%% slower than its healthy pair (measurable from %+.1f%%)",
           100 * c->slowdown, 100 * floor);
  c->no_effect = !(c->slowdown >= floor);
}

static double perturbation(const struct runner *r, const struct bench_case *c, const struct bench_evidence *ev,
                           int workers) {
  if (c->faulty_ns <= 0) return 0;
  if (c->sc.backend != MS_BACKEND_SIM) return (double)ev->run_ns / c->faulty_ns - 1;
  /* the simulator: observation costs no virtual time, so it is modelled: the
   * observation work spread over the SMs, against the run */
  double work = (double)ev->obs_execs * r->o->exec_ns + (double)ev->obs_records * r->o->record_ns +
                (double)ev->obs_ring * r->o->ring_ns;
  return work / workers / c->faulty_ns;
}

static int run_case(struct runner *r, struct bench_case *c) {
  const struct bench_opts *o = r->o;
  struct bench_scenario *s = &c->sc;
  r->log.len = 0;
  r->logbuf[0] = 0;
  struct ms_model *m = bench_model(s, &r->log);
  if (!m) {
    snprintf(c->error, sizeof c->error, "%.250s", r->logbuf[0] ? r->logbuf : "the model could not be built");
    return -EINVAL;
  }
  int rc = -EINVAL;
  struct bench_engine_cfg hc = {.m = m, .sc = s, .seed = s->seed};
  uint64_t t0 = ms_now_ns();
  struct ms_engine *e = bench_engine_new(&hc, &r->log);
  if (!e) {
    rc = -errno;
    goto out_model;
  }
  r->restart_ns_sum += (double)(ms_now_ns() - t0);
  r->restart_n++;
  int workers = ms_engine_n_workers(e);
  struct ms_compile_opts co = {.sz = sizeof co, .batch = ms_bucket_for(s->batch),
                               .tiles_per_op = s->backend != MS_BACKEND_CPU ? workers : 0, .tp = s->tp};
  struct ms_plan *p = ms_plan_compile(m, &co, &r->log);
  c->healthy_ns = (double)bench_engine_drive(e, s);
  ms_engine_free(e);
  if (!p) goto out_model;
  if ((rc = bench_scenario_draw(s, p, workers, &r->log))) goto out_plan;
  truth_of(c, p);
  tune(r, m, c, workers);
  check_effect(c, m);
  say(r, "%s: %s %s, healthy %.3f ms, faulty %.3f ms (%+.2f%%)%s", s->name,
      s->n_faults ? ms_fault_type_name(s->faults[0].type) : "healthy", c->truth_name, c->healthy_ns / 1e6,
      c->faulty_ns / 1e6, 100 * c->slowdown, c->no_effect ? "; no measurable effect: not scored" : "");
  struct ms_fault fl[BENCH_MAX_FAULTS];
  to_faults(s, fl);
  struct bench_engine_cfg fc = {.m = m, .sc = s, .faults = fl, .n_faults = s->n_faults, .seed = s->seed};
  for (int meth = 0; meth < BM_COUNT; meth++) {
    struct bench_evidence ev = {0};
    for (int b = 0; b < o->n_budgets; b++) {
      const struct bench_evidence *ref = reference(r, m, s, meth, b);
      if (!ref) {
        snprintf(c->error, sizeof c->error, "reference of %s: %.200s", bench_method_name(meth), r->logbuf);
        bench_evidence_free(&ev);
        rc = -EINVAL;
        goto out_plan;
      }
      if (per_budget(meth) || b == 0) {
        bench_evidence_free(&ev);
        r->log.len = 0;
        if ((rc = bench_observe(o, &fc, meth, per_budget(meth) ? o->budgets[b] : 0, &ev, &r->log))) {
          snprintf(c->error, sizeof c->error, "%s: %.200s", bench_method_name(meth), r->logbuf);
          bench_evidence_free(&ev);
          goto out_plan;
        }
        if (meth == BM_SEMANTIC && ev.attach_ns) {
          r->attach_ns_sum += (double)ev.attach_ns;
          r->attach_n++;
        }
      }
      ev.budget = o->budgets[b];
      struct bench_answer *a = &c->ans[meth][b];
      bench_diagnose(ref, &ev, p, s, a);
      a->raw_confidence = a->confidence;
      a->perturbation = perturbation(r, c, &ev, workers);
      judge(c, a);
    }
    bench_evidence_free(&ev);
  }
  rc = 0;
out_plan:
  ms_plan_free(p);
out_model:
  ms_model_free(m);
  if (rc && !c->error[0]) snprintf(c->error, sizeof c->error, "%.250s", r->logbuf[0] ? r->logbuf : ms_strerror(rc));
  return rc;
}

int bench_run(const struct bench_opts *o, const struct bench_scenario *sc, int n, struct bench_report *out) {
  memset(out, 0, sizeof *out);
  out->o = *o;
  out->cases = calloc((size_t)n, sizeof *out->cases);
  struct runner *r = calloc(1, sizeof *r);
  if (!out->cases || !r) {
    free(out->cases);
    free(r);
    out->cases = NULL;
    return -ENOMEM;
  }
  r->o = &out->o;
  r->log = (struct ms_textbuf){r->logbuf, sizeof r->logbuf, 0, 0};
  out->n = n;
  for (int i = 0; i < n; i++) {
    out->cases[i].sc = sc[i];
    out->cases[i].split = sc[i].split;
    if (run_case(r, &out->cases[i])) say(r, "%s: not run: %s", sc[i].name, out->cases[i].error);
  }
  bench_calibrate(out);
  double restart = r->restart_n ? r->restart_ns_sum / r->restart_n / 1e6 : 0;
  for (int m = 0; m < BM_COUNT; m++) {
    out->attach_ms[m] = restart;
    snprintf(out->attach_how[m], sizeof out->attach_how[m], "restart the engine with a new setting");
  }
  out->attach_ms[BM_SEMANTIC] = r->attach_n ? r->attach_ns_sum / r->attach_n / 1e6 : 0;
  snprintf(out->attach_how[BM_SEMANTIC], sizeof out->attach_how[BM_SEMANTIC], "open, verify, attach to the live engine");
  for (int i = 0; i < r->n_refs; i++) ref_free(&r->refs[i]);
  free(r);
  return 0;
}

void bench_report_free(struct bench_report *r) {
  free(r->cases);
  memset(r, 0, sizeof *r);
}
