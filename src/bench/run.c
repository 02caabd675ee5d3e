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
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench/bench.h"
#include "megascope/plan_ir.h"

#define MAX_CONFIGS 64
#define MAX_REFS 4      /* real clocks: healthy references per method (the first compared with, all for the null) */
#define MAX_PAIRS 30    /* real clocks: the most paired runs one slowdown is measured with */
#define RUN_INTF (1u << 31)  /* run_once's mask: the scenario's interference; bit i: fault i */

/* The healthy references of one configuration: per method, and for the trace
 * and the sampled events per budget (a reference taken the same way, so that a
 * truncation or a sampling rate biases both sides alike); on real clocks
 * MAX_REFS of each, so that a diagnoser can see how much its hypotheses move
 * between healthy runs. */
struct ref_entry {
  char key[600];
  struct bench_evidence ev[BM_COUNT][BENCH_MAX_BUDGETS][MAX_REFS];
  int have[BM_COUNT][BENCH_MAX_BUDGETS];
};

/* A loaded GGUF model, kept across the scenarios that run it. */
struct model_cache {
  char path[512];
  struct ms_model *m;
};

struct runner {
  const struct bench_opts *o;
  struct ref_entry refs[MAX_CONFIGS];
  int n_refs;
  struct model_cache models[2];
  char logbuf[8192];
  struct ms_textbuf log;
  double restart_ns_sum, attach_ns_sum;
  int restart_n, attach_n;
  /* cold-model runs: a private copy of the file (the scenario's model keeps the
   * original mapped, and mapped pages stay in the page cache), load times, first
   * steps and the copy's resident pages after each drop, warm and cold */
  char cold_path[256];
  int idx;               /* the case running: its record's number */
  double load_ms[2], first_ms[2], resident_after;
  int loads[2], drops;
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
  int len = snprintf(k, n, "%s|%s|%d|%d|%d|%d|%s|%d|%d|%d|%d|%d|%d|%g", s->preset, s->gguf, s->n_layers, s->n_experts,
                     s->top_k, s->expert_ffn_dim, s->gpu, (int)s->backend, s->batch, s->steps, s->tp, s->workers,
                     s->pin, s->jitter);
  for (int i = 0; i < s->n_params && len > 0 && (size_t)len < n; i++)
    len += snprintf(k + len, n - (size_t)len, "|%s=%s", s->params[i][0], s->params[i][1]);
}

static int real_clock(const struct bench_scenario *s) { return !ms_backend_info(s->backend)->virtual_clock; }

/* ---- models ---- */

/* The scenario's model: GGUF files loaded once and kept (the runner frees
 * them), the presets built anew. *owned: the caller frees it. */
static struct ms_model *model_of(struct runner *r, const struct bench_scenario *s, int *owned) {
  *owned = 1;
  if (!s->gguf[0]) return bench_model(s, &r->log);
  char path[512];
  bench_gguf_path(s, path, sizeof path);
  for (int i = 0; i < 2; i++)
    if (r->models[i].m && !strcmp(r->models[i].path, path)) {
      *owned = 0;
      return r->models[i].m;
    }
  struct ms_model *m = bench_model(s, &r->log);
  if (!m) return NULL;
  struct model_cache *slot = r->models[0].m ? &r->models[1] : &r->models[0];
  ms_model_free(slot->m);
  snprintf(slot->path, sizeof slot->path, "%s", path);
  slot->m = m;
  *owned = 0;
  return m;
}

/* A cold model: the file's pages dropped from the page cache, then loaded (or,
 * for its healthy pair, loaded warm); the load's time counted. */
static struct ms_model *model_fresh(struct runner *r, const struct bench_scenario *s, int cold) {
  struct bench_scenario cs = *s;
  snprintf(cs.gguf, sizeof cs.gguf, "%.255s", r->cold_path);
  if (cold) {
    struct bench_interfere_stats st = {0};
    if (!bench_evict_file(r->cold_path, &st, &r->log) && st.file_pages) {
      r->resident_after += (double)st.resident_after / (double)st.file_pages;
      r->drops++;
    }
  }
  uint64_t t0 = ms_now_ns();
  struct ms_model *m = bench_model(&cs, &r->log);
  r->load_ms[cold] += (double)(ms_now_ns() - t0) / 1e6;
  r->loads[cold]++;
  return m;
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

/* The faults of mask (bit i: fault i) as the engine takes them; their count. */
static int to_faults(const struct bench_scenario *s, unsigned mask, struct ms_fault *out) {
  int n = 0;
  for (int i = 0; i < s->n_faults; i++) {
    if (!(mask & (1u << i))) continue;
    const struct bench_fault *f = &s->faults[i];
    out[n] = (struct ms_fault){.type = f->type, .target = f->target_id, .tile = f->tile};
    if (ms_fault_uses_factor(f->type))
      out[n].factor = f->magnitude;
    else
      out[n].delay_ns = (uint64_t)f->magnitude;
    n++;
  }
  return n;
}

static unsigned all_culprits(const struct bench_scenario *s) {
  return (1u << s->n_faults) - 1 + (s->intf.kind != BI_NONE ? RUN_INTF : 0);
}

/* One unobserved run's time with the culprits of mask; 0 on failure. */
static double run_once(struct runner *r, const struct ms_model *m, const struct bench_scenario *s, unsigned mask,
                       uint64_t seed) {
  struct ms_fault fl[BENCH_MAX_FAULTS];
  int cold = s->intf.kind == BI_COLD, intf = (mask & RUN_INTF) != 0;
  struct ms_model *fresh = NULL;
  if (cold && !(fresh = model_fresh(r, s, intf))) return 0;
  struct bench_engine_cfg c = {.m = fresh ? fresh : m, .sc = s, .faults = fl, .n_faults = to_faults(s, mask, fl),
                               .interfere = intf, .seed = seed, .tx = r->o->tx};
  r->log.len = 0;
  struct ms_engine *e = bench_engine_new(&c, &r->log);
  double t = 0;
  if (e) {
    t = (double)bench_engine_drive(e, &c);
    struct ms_step_record first;
    if (cold && ms_engine_step_log(e, &first, 1) == 1) r->first_ms[intf] += (double)(first.t_end - first.t_begin) / 1e6;
    ms_engine_free(e);
  }
  ms_model_free(fresh);
  if (bench_ranks_agree(r->o->tx, &t, sizeof t)) t = 0;  /* rank 0's clock decides */
  return t;
}

static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* A paired measurement: the slowdown as exp(mean log ratio) - 1 over n pairs
 * (healthy and faulty back to back, same seed), its standard error, and the
 * pairs' median times. */
struct pairs {
  double slowdown, se, healthy, faulty;
  int n;
};

/* Culprits of mask against the healthy run, paired on the seed: exact on the
 * simulator (one pair); on real clocks as many pairs as the noise needs: at
 * least min_n, then until the slowdown stands at 4 standard errors from 0 or
 * the standard error is below se_goal, at most max_n (a shared machine's speed
 * drifts between pairs more than within one). */
static void paired(struct runner *r, const struct ms_model *m, const struct bench_scenario *s, unsigned mask,
                   int min_n, int max_n, double se_goal, struct pairs *out) {
  double h[MAX_PAIRS], f[MAX_PAIRS], l[MAX_PAIRS], sum = 0, sq = 0;
  int n = 0, reps = real_clock(s) ? max_n : 1;
  if (reps > MAX_PAIRS) reps = MAX_PAIRS;
  memset(out, 0, sizeof *out);
  while (n < reps) {
    h[n] = run_once(r, m, s, 0, s->seed);
    f[n] = run_once(r, m, s, mask, s->seed);
    if (!(h[n] > 0) || !(f[n] > 0)) break;
    l[n] = log(f[n] / h[n]);
    sum += l[n];
    sq += l[n] * l[n];
    n++;
    if (n >= min_n && n >= 2) {
      double mean = sum / n, var = (sq - n * mean * mean) / (n - 1);
      double se = sqrt(var > 0 ? var / n : 0);
      if (fabs(mean) >= 4 * se || se <= se_goal) break;
    }
  }
  if (!n) return;
  double mean = sum / n, var = n > 1 ? (sq - n * mean * mean) / (n - 1) : 0;
  out->n = n;
  out->slowdown = exp(mean) - 1;
  out->se = n > 1 ? sqrt(var > 0 ? var / n : 0) * exp(mean) : 0;
  qsort(h, (size_t)n, sizeof *h, cmp_d);
  qsort(f, (size_t)n, sizeof *f, cmp_d);
  out->healthy = h[n / 2];
  out->faulty = f[n / 2];
}

/* Real clocks: how much two healthy runs of the same seed differ (the median of
 * five back-to-back pairs), and the target raised to twice that: a fault
 * sized below the machine's own noise measures the machine, not the methods,
 * and one sized far above it is no longer the small fault this is about; the
 * paired runs that measure its effect are as many as that noise needs
 * (paired). The report gives both. */
static void size_to_noise(struct runner *r, const struct ms_model *m, struct bench_case *c) {
  struct bench_scenario *s = &c->sc;
  if (!real_clock(s)) return;
  double q[5];
  for (int i = 0; i < 5; i++) {
    double a = run_once(r, m, s, 0, s->seed), b = run_once(r, m, s, 0, s->seed);
    q[i] = a > 0 && b > 0 ? fabs(a / b - 1) : 0;
  }
  qsort(q, 5, sizeof *q, cmp_d);
  c->spread = q[2];
  if (s->target < 2 * c->spread) s->target = 2 * c->spread;
}

static int tuned(const struct bench_scenario *s, int j) {
  if (j < s->n_faults) return !(s->faults[j].given & BF_MAGNITUDE);
  const struct bench_interfere_spec *in = &s->intf;
  if (in->kind == BI_SPIN || in->kind == BI_PREEMPT) return !(in->given & BI_GIVEN_SHARE);
  if (in->kind == BI_LONG_CONTEXT) return !(in->given & BI_GIVEN_TOKENS);
  return 0;
}

/* Sets culprit j's strength st (the tuner's unit); 0 when it cannot move (a
 * share at 1). */
static int set_strength(struct bench_scenario *s, int j, double st) {
  if (j < s->n_faults) {
    double v = magnitude_of(s->faults[j].type, st);
    int moved = v != s->faults[j].magnitude;
    s->faults[j].magnitude = v;
    return moved;
  }
  if (s->intf.kind == BI_LONG_CONTEXT) {
    int t = st < 8 ? 8 : st > 4096 ? 4096 : (int)st;
    int moved = t != s->intf.tokens;
    s->intf.tokens = t;
    return moved;
  }
  double v = st < 0.01 ? 0.01 : st > 1 ? 1 : st;
  int moved = v != s->intf.share;
  s->intf.share = v;
  return moved;
}

/* Tunes culprit j alone toward severity x target / culprits: start small, grow
 * until the run is measurably slower, then scale by goal / slowdown (the
 * slowdown is close to proportional), bracketing when it overshoots. */
/* Real clocks: the share of a healthy run's task time that a slowdown factor
 * fault multiplies (its class, layer, request's attention, worker or device's
 * streaming tasks), from one traced healthy run; 0 when it does not say. The
 * tuning starts from the factor that share predicts, so that a class of 1% of
 * a step does not take a dozen noisy rounds to reach its size. */
static double work_share(struct runner *r, const struct ms_model *m, const struct bench_scenario *s,
                         const struct ms_plan *p, const struct bench_fault *f, int workers) {
  struct bench_evidence ev;
  struct bench_engine_cfg c = {.m = m, .sc = s, .seed = s->seed, .tx = r->o->tx};
  r->log.len = 0;
  if (bench_ranks_agree_rc(r->o->tx, bench_observe(r->o, &c, BM_TASK_TRACE, 0, &ev, &r->log))) {
    bench_evidence_free(&ev);
    return 0;
  }
  const struct bench_features *x = ev.feat;
  double total = 0, part = 0;
  for (int i = 0; x && i < x->n[FS_CLASS] && i < p->n_classes; i++) {
    double t = x->row[FS_CLASS][i].sum;
    const struct ms_task_class *k = &p->classes[i];
    total += t;
    if (f->type == MS_FAULT_SLOW_CLASS && i == f->target_id) part += t;
    if (f->type == MS_FAULT_SLOW_LAYER && k->layer == f->target_id) part += t;
    if (f->type == MS_FAULT_BANDWIDTH_STEAL && k->kernel != MS_K_COMM && k->kernel != MS_K_EMPTY) part += t / s->tp;
  }
  if (f->type == MS_FAULT_SLOW_REQUEST && x && f->target_id < x->n[FS_REQUEST]) part = x->row[FS_REQUEST][f->target_id].sum;
  if (f->type == MS_FAULT_SLOW_WORKER) part = total / workers;
  bench_evidence_free(&ev);
  double share = total > 0 ? part / total : 0;
  if (bench_ranks_agree(r->o->tx, &share, sizeof share)) share = 0;
  return share;
}

/* Returns the strength chosen (in the tuner's unit). */
static double tune_one(struct runner *r, const struct ms_model *m, const struct ms_plan *p, struct bench_case *c, int j,
                       int workers, int culprits) {
  struct bench_scenario *s = &c->sc;
  int intf = j == s->n_faults, real = real_clock(s), iters = real ? 4 : 12;
  double severity = intf ? s->intf.severity : s->faults[j].severity;
  double goal = (severity > 0 ? severity : 0.65) * s->target / culprits;
  double st = intf ? (s->intf.kind == BI_LONG_CONTEXT ? 64 : goal)
                   : initial_strength(s->faults[j].type, c->healthy_ns, s->steps, workers);
  if (real && !intf && ms_fault_factor_is_slowdown(s->faults[j].type)) {
    double share = work_share(r, m, s, p, &s->faults[j], workers);
    if (share > 0) st = fmin(fmax(goal / share, 0.05), 400);
  }
  double best_s = -1, best_d = 0, low_s = st, low_d = 1e9;
  double lo = -1, d_lo = 0, hi = -1, d_hi = 0;  /* strengths known to fall short of / pass the goal */
  unsigned mask = intf ? RUN_INTF : 1u << j;
  set_strength(s, j, st);
  for (int it = 0; it < iters; it++) {
    struct pairs pr;
    paired(r, m, s, mask, real ? 4 : 1, 8, goal / 5, &pr);
    double d = pr.slowdown;
    c->tune_runs += 2 * (pr.n ? pr.n : 1);
    /* real clocks: a slowdown within two standard errors of 0 was not measured */
    if (real && d < 2 * pr.se) d = fmin(d, 0);
    if (d < low_d) low_d = d, low_s = st;
    if (d <= s->target / culprits && (best_s < 0 || fabs(d - goal) < fabs(best_d - goal))) best_s = st, best_d = d;
    /* close enough: 20% of the goal (real clocks: what their noise allows) */
    if (d <= s->target / culprits && fabs(d - goal) <= (real ? 0.35 : 0.2) * goal) break;
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
      next = d < 1e-4 ? st * (real ? 3 : 8) : fmin(st * goal / d, st * 10);
    } else {
      next = fmax(st * goal / d, st / 10);
    }
    if (!set_strength(s, j, next)) break;  /* a share at 1 cannot grow */
    st = next;
  }
  double chosen = best_s >= 0 ? best_s : low_s;
  set_strength(s, j, chosen);
  return chosen;
}

static void tune(struct runner *r, const struct ms_model *m, const struct ms_plan *p, struct bench_case *c,
                 int workers) {
  struct bench_scenario *s = &c->sc;
  size_to_noise(r, m, c);
  int thread = s->intf.kind != BI_NONE && s->intf.kind != BI_COLD;  /* an interference that is tuned */
  int culprits = s->n_faults + thread;
  double chosen[BENCH_MAX_CULPRITS] = {0};
  for (int j = 0; j < s->n_faults + thread; j++)
    if (tuned(s, j)) chosen[j] = tune_one(r, m, p, c, j, workers, culprits);
  /* several culprits: each one's own effect, alone */
  if (culprits > 1)
    for (int j = 0; j < culprits; j++) {
      struct pairs pr;
      paired(r, m, s, j < s->n_faults ? 1u << j : RUN_INTF, 5, MAX_PAIRS, s->target / 20, &pr);
      if (j < s->n_faults) s->faults[j].slowdown = pr.slowdown;
      else s->intf.slowdown = pr.slowdown;
    }
  /* the effect of them all: as many pairs as the noise needs to tell it from 0
   * at a tenth of the target */
  struct pairs pr;
  paired(r, m, s, all_culprits(s), 5, MAX_PAIRS, s->target / 10, &pr);
  /* real clocks: the tuner's last rounds are a few noisy pairs each, and the
   * magnitude closest to the goal was often lucky: when the effect of them all
   * does not stand at three standard errors, the tuned culprits are made
   * stronger once, toward the goal, and measured again */
  if (real_clock(s) && culprits && !(pr.slowdown >= 3 * pr.se && pr.slowdown > 0)) {
    double goal = 0.65 * s->target, k = pr.slowdown > goal / 3 ? goal / pr.slowdown : 3;
    int moved = 0;
    for (int j = 0; j < culprits; j++)
      if (chosen[j] > 0) moved |= set_strength(s, j, chosen[j] * (k < 1.5 ? 1.5 : k > 3 ? 3 : k));
    if (moved) paired(r, m, s, all_culprits(s), 5, MAX_PAIRS, s->target / 10, &pr);
  }
  c->healthy_ns = pr.healthy;
  c->faulty_ns = pr.faulty;
  c->slowdown = pr.slowdown;
  c->slowdown_se = pr.se;
  c->pairs = pr.n;
  c->healthy_ns_b = c->healthy_ns;
  c->faulty_ns_b = c->faulty_ns;
  if (culprits <= 1) {
    for (int i = 0; i < s->n_faults; i++) s->faults[i].slowdown = pr.slowdown;
    if (s->intf.kind != BI_NONE) s->intf.slowdown = pr.slowdown;
  }
}

/* ---- references ---- */

static int per_budget(int method) {
  return method == BM_TASK_TRACE || method == BM_SAMPLED_EVENTS || method == BM_PROFILER;
}

/* One observed run (bench_observe). Across ranks every rank runs it at once:
 * the verdict is agreed on, and rank 0's ev holds every rank's evidence
 * merged (bench_ranks_merge); a byte budget is the engine's, so each rank
 * ships its share of it. */
static int observe(struct runner *r, const struct bench_engine_cfg *c, int meth, uint64_t budget,
                   struct bench_evidence *ev) {
  const struct ms_transport *tx = r->o->tx;
  uint64_t mine = tx && budget ? (budget / (uint64_t)tx->size ? budget / (uint64_t)tx->size : 1) : budget;
  int rc = bench_ranks_agree_rc(tx, bench_observe(r->o, c, meth, mine, ev, &r->log));
  if (!rc && tx) rc = bench_ranks_agree_rc(tx, bench_ranks_merge(tx, ev));
  ev->budget = budget;
  return rc;
}

static void ref_free(struct ref_entry *e) {
  for (int k = 0; k < BM_COUNT; k++)
    for (int b = 0; b < BENCH_MAX_BUDGETS; b++)
      for (int i = 0; i < MAX_REFS; i++) bench_evidence_free(&e->ev[k][b][i]);
}

/* The healthy references of method at budget b: the first is compared with,
 * the others (real clocks) show the noise; their count, 0 on failure. */
static int reference(struct runner *r, const struct ms_model *m, const struct bench_scenario *s, int method, int b,
                     const struct bench_evidence **out) {
  char key[600];
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
  int want = real_clock(s) ? MAX_REFS : 1;
  /* a cold model's references are warm ones: no interference, no fault */
  struct bench_scenario hs = *s;
  hs.intf.kind = s->intf.kind == BI_LONG_CONTEXT ? BI_LONG_CONTEXT : BI_NONE;
  while (e->have[method][b] < want) {
    int k = e->have[method][b];
    uint64_t seed = 0x5eed;
    for (const char *p = key; *p; p++) seed = seed * 131 + (unsigned char)*p;
    struct bench_engine_cfg c = {.m = m, .sc = &hs, .seed = seed % 1000003 + (uint64_t)k * 7919, .tx = r->o->tx};
    r->log.len = 0;
    if (observe(r, &c, method, per_budget(method) ? r->o->budgets[b] : 0, &e->ev[method][b][k])) return 0;
    e->have[method][b]++;
  }
  for (int i = 0; i < want; i++) out[i] = &e->ev[method][b][i];
  return want;
}

/* ---- one scenario ---- */

static void truth_add(struct bench_case *c, const struct ms_plan *p, int cause, enum ms_culprit_kind k, int id) {
  struct bench_culprit *t = &c->truth[c->n_truth++];
  *t = (struct bench_culprit){.cause = cause, .kind = k, .id = id};
  if (cause == BENCH_CAUSE_INTERFERE + BI_COLD)
    snprintf(t->name, sizeof t->name, "the model's pages");
  else
    bench_culprit_name(p, k, id, t->name, sizeof t->name);
}

static void truth_of(struct bench_case *c, const struct ms_plan *p) {
  const struct bench_scenario *s = &c->sc;
  c->n_truth = 0;
  for (int i = 0; i < s->n_faults; i++)
    truth_add(c, p, s->faults[i].type, ms_fault_culprit_kind(s->faults[i].type), s->faults[i].target_id);
  const struct bench_interfere_spec *in = &s->intf;
  /* beside a rank (or a device of one process): that device's worker */
  int w = in->worker + (in->rank > 0 ? in->rank * c->per_device : 0);
  if (in->kind == BI_SPIN || in->kind == BI_PREEMPT) truth_add(c, p, BENCH_CAUSE_INTERFERE + in->kind, MS_CULPRIT_WORKER, w);
  if (in->kind == BI_LONG_CONTEXT) truth_add(c, p, BENCH_CAUSE_INTERFERE + in->kind, MS_CULPRIT_REQUEST, in->slot);
  if (in->kind == BI_COLD) truth_add(c, p, BENCH_CAUSE_INTERFERE + in->kind, MS_CULPRIT_NONE, -1);
  if (!c->n_truth) {
    c->truth_cause = -1;
    c->truth_kind = MS_CULPRIT_NONE;
    c->truth_id = -1;
    snprintf(c->truth_name, sizeof c->truth_name, "-");
    return;
  }
  c->truth_cause = c->truth[0].cause;
  c->truth_kind = c->truth[0].kind;
  c->truth_id = c->truth[0].id;
  size_t len = 0;
  for (int i = 0; i < c->n_truth && len < sizeof c->truth_name; i++)
    len += (size_t)snprintf(c->truth_name + len, sizeof c->truth_name - len, "%s%s", i ? " + " : "", c->truth[i].name);
}

/* The answer's named culprits (its first and the more): their count. */
static int named(const struct bench_answer *a, struct bench_culprit *out) {
  int n = 0;
  if (a->id >= 0) out[n++] = (struct bench_culprit){.cause = a->cause, .kind = a->kind, .id = a->id};
  for (int i = 0; i < a->n_more && n < BENCH_MAX_CULPRITS; i++) out[n++] = a->more[i];
  return n;
}

/* Whether two scopes are one: the same kind and id, or a device and its one
 * worker (a plan of as many devices as workers: one hardware). */
static int same_scope(const struct bench_case *c, enum ms_culprit_kind ka, int a, enum ms_culprit_kind kb, int b) {
  if (ka == kb) return a == b;
  if (c->per_device != 1) return 0;
  return ((ka == MS_CULPRIT_DEVICE && kb == MS_CULPRIT_WORKER) || (ka == MS_CULPRIT_WORKER && kb == MS_CULPRIT_DEVICE)) &&
         a == b;
}

/* Healthy: right when it says "none". One culprit: the scope is the culprit's
 * kind and id, and the cause the one injected; several: every culprit named
 * (scope), each with its cause (cause), and nothing else. A cold model has no
 * scope: right when "something is slower" names none. */
static void judge(const struct bench_case *c, struct bench_answer *a) {
  if (c->n_truth == 0) {
    a->cause_ok = a->scope_ok = a->cause == -1;
  } else if (c->n_truth == 1 && c->truth[0].kind == MS_CULPRIT_NONE) {
    a->scope_ok = a->cause != -1 && a->id < 0 && !a->n_more;
    a->cause_ok = a->cause == c->truth_cause;
  } else if (c->n_truth == 1) {
    a->cause_ok = a->cause == c->truth_cause;
    a->scope_ok = a->id >= 0 && same_scope(c, a->kind, a->id, c->truth_kind, c->truth_id) && !a->n_more;
  } else {
    /* several: each named culprit is one of them (with its cause, or "unknown"),
     * or it is wrong; an answer naming some of them only is incomplete */
    struct bench_culprit got[BENCH_MAX_CULPRITS];
    int n = named(a, got), found = 0, causes = 0;
    a->multi = 1;
    for (int i = 0; i < n; i++) {
      int t = 0;
      while (t < c->n_truth && !same_scope(c, got[i].kind, got[i].id, c->truth[t].kind, c->truth[t].id)) t++;
      if (t == c->n_truth) {
        a->wrong_named = 1;
        continue;
      }
      found++;
      causes += got[i].cause == c->truth[t].cause;
      a->wrong_named |= got[i].cause != c->truth[t].cause && got[i].cause != -2;
    }
    if (n == 0 && a->cause >= 0) {  /* a known cause named with no culprit: one of theirs? */
      int any = 0;
      for (int t = 0; t < c->n_truth; t++) any |= c->truth[t].cause == a->cause;
      a->wrong_named |= !any;
    }
    a->scope_ok = found == c->n_truth && n == c->n_truth;
    a->cause_ok = causes == c->n_truth;
  }
  a->culprit_ok = a->cause_ok && a->scope_ok;
}

/* Whether the tuned culprits do anything measurable: routing skew by the rows
 * it moves (under the simulator's shape spread; on the CPU the router's real
 * choices, counted as the rows it would move), everything else by the outer
 * view: on the simulator 0.1% (its pairs share their jitter), on real clocks a
 * slowdown at three standard errors of its paired runs. With several culprits
 * each must have had an effect alone. A scenario without one is reported and
 * left out of the scores: no method can be asked to see it. */
static void check_effect(struct bench_case *c, const struct ms_model *m) {
  const struct bench_scenario *s = &c->sc;
  if (!c->n_truth) return;
  size_t len = 0;
  int none = 0;
  for (int i = 0; i < s->n_faults; i++) {
    const struct bench_fault *f = &s->faults[i];
    if (f->type != MS_FAULT_ROUTING_SKEW) continue;
    const struct ms_model_config *mc = &m->cfg;
    int moved = ms_backend_info(s->backend)->cost_model ? ms_fault_skew_moves(f->magnitude, s->batch, mc->n_experts, mc->top_k,
                                                                   f->target_id)
                                             : ms_fault_skew_moves(f->magnitude, s->batch, 1 << 30, 1, -1);
    len += (size_t)snprintf(c->effect + len, sizeof c->effect - len, "%d of %d rows routed to expert %d instead of "
                            "their last choice; ", moved, s->batch, f->target_id);
    none |= moved == 0;
    if (len >= sizeof c->effect) len = sizeof c->effect - 1;
  }
  int timed = c->n_truth > (s->n_faults == 1 && s->faults[0].type == MS_FAULT_ROUTING_SKEW);
  if (timed) {
    double floor = real_clock(s) ? 3 * c->slowdown_se : 0.001;
    snprintf(c->effect + len, sizeof c->effect - len, "the run %+.3f%% slower than its healthy pair (%d pairs, "
             "measurable from %+.2f%%)", 100 * c->slowdown, c->pairs ? c->pairs : 1, 100 * floor);
    none |= !(c->slowdown >= floor) || !(c->slowdown > 0);
    if (c->n_truth > 1) {
      double each = real_clock(s) ? s->target / 10 : 0.001;
      for (int i = 0; i < s->n_faults; i++)
        none |= s->faults[i].type != MS_FAULT_ROUTING_SKEW && !(s->faults[i].slowdown >= each);
      if (s->intf.kind != BI_NONE && s->intf.kind != BI_COLD) none |= !(s->intf.slowdown >= each);
    }
  }
  c->no_effect = none;
}

static double perturbation(const struct runner *r, const struct bench_case *c, const struct bench_evidence *ev,
                           int workers) {
  if (c->faulty_ns <= 0) return 0;
  if (!ms_backend_info(c->sc.backend)->virtual_clock) return (double)ev->run_ns / c->faulty_ns - 1;
  /* the simulator: observation costs no virtual time, so it is modelled: the
   * observation work spread over the SMs, against the run */
  double work = (double)ev->obs_execs * r->o->exec_ns + (double)ev->obs_records * r->o->record_ns +
                (double)ev->obs_ring * r->o->ring_ns;
  return work / workers / c->faulty_ns;
}

/* The end of the run's log, where its error is: the lines before it (the
 * backend's set-up, a verifier's statistics) only say how far it came. */
static const char *log_tail(const struct runner *r) {
  size_t n = strlen(r->logbuf);
  while (n && r->logbuf[n - 1] == '\n') n--;
  size_t at = n > 200 ? n - 200 : 0;
  while (at && r->logbuf[at - 1] != '\n') at++;
  return r->logbuf + at;
}

/* One method's diagnosis at budget b, judged against the case's truth. With
 * healthy runs taken beside the faulty one (nf: 1, or 2 before and after),
 * each is the reference in turn and the answers agree (bench_answer_agree):
 * what the machine did while one of them ran is not the faulty run's. */
static void diagnose_one(struct runner *r, struct bench_case *c, int meth, int b, const struct bench_evidence *fresh,
                         int nf, const struct bench_evidence *const *ref, int nref, struct bench_evidence *ev,
                         const struct ms_plan *p, int workers) {
  struct bench_answer *a = &c->ans[meth][b];
  struct bench_near near[2];
  if (nf > 0)
    bench_diagnose_near(&fresh[0], ref[0], ref + 1, nref - 1, ev, p, &c->sc, a, &near[0]);
  else
    bench_diagnose(ref[0], ev, p, &c->sc, a);
  if (nf > 1) {
    /* the same rows the first read (a lazy read-out reads within the budget
     * once: the second judgement is of the same evidence, not of more) */
    struct bench_answer after;
    int lazy = ev->feat ? ev->feat->lazy : 0;
    if (lazy) ev->feat->lazy = 0;
    bench_diagnose_near(&fresh[1], ref[0], ref + 1, nref - 1, ev, p, &c->sc, &after, &near[1]);
    if (lazy) ev->feat->lazy = lazy;
    bench_answer_agree(a, &after, &near[0], &near[1], p, c->per_device);
  }
  a->raw_confidence = a->confidence;
  a->perturbation = perturbation(r, c, ev, workers);
  if (c->ranks > 1 && a->kind == MS_CULPRIT_DEVICE && a->id >= 0) snprintf(a->name, sizeof a->name, "rank %d", a->id);
  for (int i = 0; c->ranks > 1 && i < a->n_more; i++)  /* across ranks a device is a rank */
    if (a->more[i].kind == MS_CULPRIT_DEVICE) snprintf(a->more[i].name, sizeof a->more[i].name, "rank %d", a->more[i].id);
  judge(c, a);
}

/* A healthy observed run of the scenario's seed (real clocks: a reference
 * taken beside the faulty run); a cold model's is warm. */
static int observe_healthy(struct runner *r, const struct bench_scenario *s, struct bench_engine_cfg *hc,
                           const struct ms_model *m, int cold, int meth, uint64_t budget, struct bench_evidence *out) {
  struct ms_model *warm = cold ? model_fresh(r, s, 0) : NULL;
  if (warm) hc->m = warm;
  int rc = cold && !warm ? -EIO : observe(r, hc, meth, budget, out);
  hc->m = m;
  ms_model_free(warm);
  return rc;
}

/* Every method's observed run of the faulty scenario and its diagnosis at
 * every budget. */
static int observe_all(struct runner *r, struct bench_case *c, const struct ms_model *m, const struct ms_plan *p,
                       int workers) {
  const struct bench_opts *o = r->o;
  struct bench_scenario *s = &c->sc;
  struct ms_fault fl[BENCH_MAX_FAULTS];
  int rc = 0, cold = s->intf.kind == BI_COLD;
  struct bench_engine_cfg fc = {.m = m, .sc = s, .faults = fl, .n_faults = to_faults(s, (1u << s->n_faults) - 1, fl),
                                .interfere = s->intf.kind != BI_NONE, .seed = s->seed, .tx = o->tx};
  struct bench_engine_cfg hc = {.m = m, .sc = s, .seed = s->seed, .tx = o->tx};
  int lead = !o->tx || o->tx->rank == 0;  /* across ranks rank 0 judges (the followers only observe) */
  FILE *rec = o->record && lead ? bench_record_begin(o->record, r->idx, c, workers, o) : NULL;
  if (o->record && lead && !rec) say(r, "%s: cannot write its record in %s", s->name, o->record);
  for (int meth = 0; meth < BM_COUNT && !rc; meth++) {
    struct bench_evidence ev = {0}, fresh[2] = {{0}};  /* real clocks: healthy runs before and after ev */
    for (int b = 0; b < o->n_budgets; b++) {
      const struct bench_evidence *ref[MAX_REFS];
      int nref = reference(r, m, s, meth, b, ref);
      if (!nref) {
        snprintf(c->error, sizeof c->error, "reference of %s: %.200s", bench_method_name(meth), log_tail(r));
        rc = -EINVAL;
        break;
      }
      if (per_budget(meth) || b == 0) {
        bench_evidence_free(&ev);
        bench_evidence_free(&fresh[0]);
        bench_evidence_free(&fresh[1]);
        r->log.len = 0;
        uint64_t budget = per_budget(meth) ? o->budgets[b] : 0;
        /* real clocks: the run is compared with healthy runs of the same seed
         * taken just before and just after it (a shared machine drifts between
         * the cached references and now, and may change pace while it runs);
         * the cached ones size the noise */
        if (real_clock(s)) rc = observe_healthy(r, s, &hc, m, cold, meth, budget, &fresh[0]);
        struct ms_model *cm = !rc && cold ? model_fresh(r, s, 1) : NULL;
        if (cm) fc.m = cm;
        if (!rc) rc = cold && !cm ? -EIO : observe(r, &fc, meth, budget, &ev);
        fc.m = m;
        ms_model_free(cm);
        if (!rc && real_clock(s)) rc = observe_healthy(r, s, &hc, m, cold, meth, budget, &fresh[1]);
        if (rc) {
          snprintf(c->error, sizeof c->error, "%s: %.200s", bench_method_name(meth), log_tail(r));
          break;
        }
        if (meth == BM_SEMANTIC && ev.attach_ns) {
          r->attach_ns_sum += (double)ev.attach_ns;
          r->attach_n++;
        }
      }
      ev.budget = o->budgets[b];
      int nf = real_clock(s) ? 2 : 0;
      if (rec && bench_record_group(rec, meth, b, fresh, nf, ref, nref, &ev)) {
        say(r, "%s: its record in %s could not be written", s->name, o->record);
        fclose(rec);
        rec = NULL;
      }
      if (lead) diagnose_one(r, c, meth, b, fresh, nf, ref, nref, &ev, p, workers);
    }
    bench_evidence_free(&ev);
    bench_evidence_free(&fresh[0]);
    bench_evidence_free(&fresh[1]);
  }
  if (rec && bench_record_end(rec)) say(r, "%s: its record in %s could not be written", s->name, o->record);
  return rc;
}

/* A case again from its record: the plan compiled anew, every recorded
 * method and budget judged by this build's diagnosers. */
static int replay_case(struct runner *r, struct bench_case *c, int i) {
  /* the held-out records follow the training ones, numbered from 0 in their own directory */
  int held = r->o->replay_heldout && i >= r->o->replay_n, idx = held ? i - r->o->replay_n : i;
  const char *dir = held ? r->o->replay_heldout : r->o->replay;
  struct bench_evidence fresh[2] = {{0}}, ev = {0}, refs[MAX_REFS] = {{0}};
  int workers = 0, rc = 0, owned = 0, done = 0, bmap[BENCH_MAX_BUDGETS];
  FILE *f = bench_replay_begin(dir, idx, r->o, c, &workers, bmap, c->error, sizeof c->error);
  if (!f) {
    /* its scenario was not read: the error line names the record by its place */
    if (!c->sc.name[0]) snprintf(c->sc.name, sizeof c->sc.name, "record %d", idx);
    return -EINVAL;
  }
  c->split = c->sc.split = held;
  c->error[0] = 0;
  memset(c->ans, 0, sizeof c->ans);
  struct bench_scenario *s = &c->sc;
  struct ms_model *m = model_of(r, s, &owned);
  struct ms_compile_opts co = {.sz = sizeof co, .batch = ms_bucket_for(s->batch),
                               .tiles_per_op = ms_backend_info(s->backend)->tiles_per_worker ? workers : 0,
                               .tp = s->tp, .tp_split = c->ranks > 1};
  struct ms_plan *p = m ? ms_plan_compile(m, &co, &r->log) : NULL;
  if (!p) rc = -EINVAL;
  while (!rc && !done) {
    int meth, b, nref, nf;
    rc = bench_replay_group(f, &meth, &b, fresh, &nf, refs, MAX_REFS, &nref, &ev);
    if (rc == 1) {
      done = 1;
      rc = 0;
    } else if (!rc && bmap[b] >= 0) {
      b = bmap[b];
      ev.budget = r->o->budgets[b];
      const struct bench_evidence *ref[MAX_REFS];
      for (int i = 0; i < nref; i++) ref[i] = &refs[i];
      if (meth == BM_SEMANTIC && ev.attach_ns && b == 0) {
        r->attach_ns_sum += (double)ev.attach_ns;
        r->attach_n++;
      }
      diagnose_one(r, c, meth, b, fresh, nf, ref, nref, &ev, p, workers);
    }
    bench_evidence_free(&fresh[0]);
    bench_evidence_free(&fresh[1]);
    bench_evidence_free(&ev);
    for (int i = 0; i < MAX_REFS; i++) bench_evidence_free(&refs[i]);
  }
  fclose(f);
  ms_plan_free(p);
  if (owned) ms_model_free(m);
  if (rc) snprintf(c->error, sizeof c->error, "its record in %s: %s", dir,
                   !p ? "the plan could not be compiled again" : rc == -EIO ? "cut short" : ms_strerror(rc));
  return rc;
}

/* The cold-model scenario's private copy of its file (r->cold_path). */
static int cold_copy(struct runner *r, const struct bench_scenario *s) {
  char src[512];
  const char *tmp = getenv("TMPDIR");
  bench_gguf_path(s, src, sizeof src);
  snprintf(r->cold_path, sizeof r->cold_path, "%s/megascope-cold-XXXXXX", tmp && *tmp ? tmp : "/var/tmp");
  int out = mkstemp(r->cold_path), in = open(src, O_RDONLY | O_CLOEXEC), rc = 0;
  char *buf = malloc(1 << 20);
  ssize_t k = 1;
  while (out >= 0 && in >= 0 && buf && (k = read(in, buf, 1 << 20)) > 0)
    if (write(out, buf, (size_t)k) != k) k = -1;
  if (out < 0 || in < 0 || !buf || k < 0 || fsync(out)) rc = -EIO;
  free(buf);
  if (in >= 0) close(in);
  if (out >= 0) close(out);
  if (rc) {
    ms_textbuf_printf(&r->log, "cold: cannot copy %s to %s\n", src, r->cold_path);
    if (out >= 0) unlink(r->cold_path);
    r->cold_path[0] = 0;
  }
  return rc;
}

static int run_case(struct runner *r, struct bench_case *c) {
  struct bench_scenario *s = &c->sc;
  r->log.len = 0;
  r->logbuf[0] = 0;
  int owned;
  struct ms_model *m = model_of(r, s, &owned);
  if (!m) {
    snprintf(c->error, sizeof c->error, "%.250s", r->logbuf[0] ? r->logbuf : "the model could not be built");
    return -EINVAL;
  }
  int rc = -EINVAL;
  struct bench_engine_cfg hc = {.m = m, .sc = s, .seed = s->seed, .tx = r->o->tx};
  uint64_t t0 = ms_now_ns();
  struct ms_engine *e = bench_engine_new(&hc, &r->log);
  if (!e) {
    rc = -errno;
    goto out_model;
  }
  r->restart_ns_sum += (double)(ms_now_ns() - t0);
  r->restart_n++;
  /* across ranks each rank runs its own workers: the engine's are every rank's */
  c->ranks = r->o->tx ? r->o->tx->size : 1;
  int local = ms_engine_n_workers(e), workers = local * c->ranks;
  /* the engine's plan: across ranks each holds its share of a split output */
  struct ms_compile_opts co = {.sz = sizeof co, .batch = ms_bucket_for(s->batch),
                               .tiles_per_op = ms_backend_info(s->backend)->tiles_per_worker ? local : 0,
                               .tp = s->tp, .tp_split = c->ranks > 1};
  struct ms_plan *p = ms_plan_compile(m, &co, &r->log);
  c->healthy_ns = (double)bench_engine_drive(e, &hc);
  ms_engine_free(e);
  if (bench_ranks_agree(r->o->tx, &c->healthy_ns, sizeof c->healthy_ns)) c->healthy_ns = 0;
  if (!p) goto out_model;
  if ((rc = bench_scenario_draw(s, p, workers, &r->log))) goto out_plan;
  if (s->intf.kind == BI_COLD && (rc = cold_copy(r, s))) goto out_plan;
  c->per_device = workers / (s->tp > 1 ? s->tp : 1);
  truth_of(c, p);
  tune(r, m, p, c, workers);
  check_effect(c, m);
  say(r, "%s: %s %s, healthy %.3f ms, faulty %.3f ms (%+.2f%%)%s", s->name,
      c->n_truth ? bench_cause_name(c->truth_cause) : "healthy", c->truth_name, c->healthy_ns / 1e6,
      c->faulty_ns / 1e6, 100 * c->slowdown, c->no_effect ? "; no measurable effect: not scored" : "");
  rc = observe_all(r, c, m, p, workers);
out_plan:
  ms_plan_free(p);
  if (r->cold_path[0]) unlink(r->cold_path);
  r->cold_path[0] = 0;
out_model:
  if (owned) ms_model_free(m);
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
    r->idx = i;
    if (o->replay) {
      if (replay_case(r, &out->cases[i], i)) say(r, "case %d: not replayed: %s", i, out->cases[i].error);
      continue;
    }
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
  for (int m = 0; m < BM_COUNT && o->replay; m++)  /* the records keep the attach times, not the restarts */
    if (m != BM_SEMANTIC) snprintf(out->attach_how[m], sizeof out->attach_how[m], "restart: not measured in a replay");
  for (int i = 0; i < r->n_refs; i++) ref_free(&r->refs[i]);
  for (int i = 0; i < 2; i++) ms_model_free(r->models[i].m);
  if (r->loads[0] && r->loads[1])
    say(r, "cold model: loads %.1f ms cold against %.1f ms warm, first step %.2f ms against %.2f ms (means of %d and "
        "%d); %.1f%% of the file's pages still cached after a drop", r->load_ms[1] / r->loads[1],
        r->load_ms[0] / r->loads[0], r->first_ms[1] / r->loads[1], r->first_ms[0] / r->loads[0], r->loads[1],
        r->loads[0], r->drops ? 100 * r->resident_after / r->drops : 0);
  free(r);
  return 0;
}

void bench_report_free(struct bench_report *r) {
  free(r->cases);
  memset(r, 0, sizeof *r);
}
