/* SPDX-License-Identifier: MIT */
/* explain's judgement (megascope/explain.h): each part of the engine against
 * its peers in the same window, each effect against the scatter the same
 * window shows among healthy peers and across its own time slices.
 *
 * The tables: a cell is (class, bucket, worker, slice). Buckets are judged
 * apart (a prefill chunk's tasks are not a decode step's) and slices give each
 * part many small windows, so a task preempted once moves one slice of one
 * class, which the weighted median over slices ignores. The order:
 *   classes  (class_effects)   r = log(mean / the peers' median mean) per
 *            bucket and slice; the class's effect is their weighted median;
 *   layers   (layer_effects)   the median of the layer's classes' effects;
 *   workers  (group_effects)   a worker's task time against what the other
 *            workers took for the same classes in the same bucket and slice;
 *   devices  the same over devices;
 *   queues   (queue_effects)   a worker's share of the plan's AOT tasks
 *            against an even share (round robin places them evenly);
 *   cpu      (cpu_effects)     the run-queue wait the OS reports;
 *   requests (requests.c)      attention time against a robust line through
 *            the window's requests' (context, time) points, each step's pace
 *            and the trend against the row's place in the step taken out (a
 *            request against the others of its batch).
 * Then (culprits.c) the parts above the noise, the broader ones first, each
 * narrower part they explain left out: the OS's view, devices and workers
 * first; then classes and layers, judged again without the workers named (a
 * worker's own trouble stays its own), and requests. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "explain/state.h"
#include "explain/stats.h"

/* Cells a class needs to be judged, and slices a worker needs. */
#define MIN_CELLS 8
#define MIN_SLICES 4

const char *ms_explain_kind_name(enum ms_explain_kind k) {
  static const char *const names[] = {"class", "layer", "worker", "device", "request", "slot", "cpu"};
  return (unsigned)k < MS_EXPLAIN_KIND_COUNT ? names[k] : "?";
}

/* ---- the tables ---- */

static int bucket_index(struct ex *x, int bucket) {
  for (int i = 0; i < x->B; i++)
    if (x->buckets[i] == bucket) return i;
  return -1;
}

static int ex_init(struct ex *x, const struct ms_explain_input *in, struct ms_explain_result *out) {
  memset(x, 0, sizeof *x);
  x->in = in, x->out = out;
  x->C = in->n_classes, x->S = in->n_slices > 0 ? in->n_slices : 1, x->W = in->n_workers > 0 ? in->n_workers : 1;
  x->buckets = calloc(in->n_cells + 1, sizeof *x->buckets);
  x->D = 1;
  for (int w = 0; in->device && w < in->n_workers; w++)
    if (in->device[w] + 1 > x->D) x->D = in->device[w] + 1;
  if (!x->buckets) return -ENOMEM;
  for (size_t i = 0; i < in->n_cells; i++)
    if (bucket_index(x, in->cells[i].bucket) < 0) x->buckets[x->B++] = in->cells[i].bucket;
  size_t cells = (size_t)x->C * (size_t)(x->B ? x->B : 1) * (size_t)x->S;
  x->n = calloc(cells, sizeof *x->n);
  x->s = calloc(cells, sizeof *x->s);
  if (x->D > 1) {
    x->nd = calloc(cells * (size_t)x->D, sizeof *x->nd);
    x->sd = calloc(cells * (size_t)x->D, sizeof *x->sd);
  }
  /* per worker when it fits in 4M cells (a simulator of 132 SMs and a large
   * model does not: then over every worker) */
  x->Wc = cells * (size_t)x->W <= ((size_t)1 << 22) ? x->W : 1;
  x->nw = calloc(cells * (size_t)x->Wc, sizeof *x->nw);
  x->sw = calloc(cells * (size_t)x->Wc, sizeof *x->sw);
  x->mw = calloc(cells * (size_t)x->Wc, sizeof *x->mw);
  if (!x->n || !x->s || !x->nw || !x->sw || !x->mw || (x->D > 1 && (!x->nd || !x->sd))) return -ENOMEM;
  for (size_t i = 0; i < in->n_cells; i++) {
    const struct ms_explain_cell *c = &in->cells[i];
    if (c->cls < 0 || c->cls >= x->C || c->slice < 0 || c->slice >= x->S || !(c->n > 0)) continue;
    size_t k = EX_AT(x, c->cls, bucket_index(x, c->bucket), c->slice);
    x->n[k] += c->n, x->s[k] += c->sum_ns;
    int w = x->Wc > 1 && c->worker >= 0 && c->worker < x->Wc ? c->worker : 0;
    size_t kw = EX_ATW(x, c->cls, bucket_index(x, c->bucket), w, c->slice);
    x->nw[kw] += c->n, x->sw[kw] += c->sum_ns;
    if (c->min_ns > 0 && (!(x->mw[kw] > 0) || c->min_ns < x->mw[kw])) x->mw[kw] = c->min_ns;
    if (x->D > 1) {
      int d = ex_device(x, c->worker);
      x->nd[k * (size_t)x->D + (size_t)d] += c->n, x->sd[k * (size_t)x->D + (size_t)d] += c->sum_ns;
    }
  }
  return 0;
}

static void ex_free(struct ex *x) {
  free(x->buckets);
  free(x->n);
  free(x->s);
  free(x->nd);
  free(x->sd);
  free(x->nw);
  free(x->sw);
  free(x->mw);
  for (int c = 0; x->peer && c < x->C; c++) free(x->peer[c]);
  free(x->peer);
  free(x->n_peer);
}

/* ---- classes ---- */

/* Peers do the same work: the same op in another layer, reading about the same
 * bytes a task (within 10%; unknown bytes match anything). */
static int peers(const struct ms_explain_class *a, const struct ms_explain_class *b) {
  if (a == b || a->layer < 0 || b->layer < 0 || strcmp(a->op, b->op)) return 0;
  if (!(a->work_bytes > 0) || !(b->work_bytes > 0)) return 1;
  return fabs(log(a->work_bytes / b->work_bytes)) <= 0.1;
}

/* Each class's peers, once. */
static int find_peers(struct ex *x) {
  x->peer = calloc((size_t)x->C + 1, sizeof *x->peer);
  x->n_peer = calloc((size_t)x->C + 1, sizeof *x->n_peer);
  if (!x->peer || !x->n_peer) return -ENOMEM;
  for (int c = 0; c < x->C; c++) {
    for (int p = 0; p < x->C; p++) x->n_peer[c] += peers(&x->in->classes[c], &x->in->classes[p]);
    if (!x->n_peer[c]) continue;
    if (!(x->peer[c] = malloc((size_t)x->n_peer[c] * sizeof *x->peer[c]))) return -ENOMEM;
    for (int p = 0, k = 0; p < x->C; p++)
      if (peers(&x->in->classes[c], &x->in->classes[p])) x->peer[c][k++] = p;
  }
  return 0;
}

/* A cell's value: its fastest task when known, else its mean. */
static double cell_value(const struct ex *x, size_t i) { return x->mw[i] > 0 ? x->mw[i] : x->sw[i] / x->nw[i]; }

/* The peers' median value (fastest == 1) or mean task time in one bucket,
 * worker and slice; NAN without one. */
static double peer_ref(struct ex *x, int c, int b, int w, int s, int fastest, double *scratch) {
  int k = 0;
  for (int j = 0; j < x->n_peer[c]; j++) {
    size_t i = EX_ATW(x, x->peer[c][j], b, w, s);
    if (x->nw[i] > 0) scratch[k++] = fastest ? cell_value(x, i) : x->sw[i] / x->nw[i];
  }
  return ex_median(scratch, (size_t)k);
}

/* Each judged class's effect less the median of its layer's (layers of at
 * least three judged classes) into v; returns how many. */
static int layer_residuals(struct ex *x, double *v) {
  int L = 0, k = 0;
  for (int c = 0; c < x->C; c++)
    if (x->in->classes[c].layer + 1 > L) L = x->in->classes[c].layer + 1;
  double *m = malloc(((size_t)x->C + 1) * sizeof *m);
  for (int l = 0; m && l < L; l++) {
    int n = 0;
    for (int c = 0; c < x->C; c++)
      if (x->in->classes[c].layer == l && !isnan(x->out->cls[c].effect)) m[n++] = x->out->cls[c].effect;
    if (n < 3) continue;
    double med = ex_median(m, (size_t)n);
    for (int c = 0; c < x->C; c++)
      if (x->in->classes[c].layer == l && !isnan(x->out->cls[c].effect)) v[k++] = x->out->cls[c].effect - med;
  }
  free(m);
  return k;
}

/* Class c against where it stood in the healthy reference, if any: the
 * effect less the reference's, the two noises added in squares, the excess
 * shrunk to what the move costs. */
static void against_base(const struct ex *x, int c, struct ms_explain_effect *e) {
  const double *base = x->in->class_base, *bn = x->in->class_base_noise;
  if (!base || !bn || !isfinite(base[c]) || !isfinite(bn[c])) return;
  double before = exp(e->effect) - 1, after;
  e->effect -= base[c];
  e->noise = sqrt(e->noise * e->noise + bn[c] * bn[c]);
  after = exp(e->effect) - 1;
  e->excess_ns = before > 0.01 ? e->excess_ns * (after > 0 ? after : 0) / before : e->excess_ns;
}

/* skip: [W] workers whose cells are left out (NULL: none). */
static void class_effects(struct ex *x, const unsigned char *skip) {
  double *scratch = malloc(((size_t)x->C + 1) * sizeof *scratch);
  struct ex_vw *cell = malloc(((size_t)x->B * (size_t)x->Wc * (size_t)x->S + 1) * sizeof *cell);
  double *effects = malloc(((size_t)x->C + 1) * sizeof *effects);
  if (!scratch || !cell || !effects || (!x->peer && find_peers(x))) goto out;
  int judged = 0;
  for (int c = 0; c < x->C; c++) {
    struct ms_explain_effect *e = &x->out->cls[c];
    *e = (struct ms_explain_effect){.z = NAN, .effect = NAN, .noise = NAN, .peers = x->n_peer[c]};
    size_t k = 0;
    double all = 0;  /* the class's tasks on every worker, set aside or not */
    /* a cell per bucket, worker and slice: few tasks each, so a preempted
     * task moves few cells, and a worker's own pace cancels */
    for (int b = 0; e->peers && b < x->B; b++)
      for (int w = 0; w < x->Wc; w++)
        for (int s = 0; s < x->S; s++) {
          size_t i = EX_ATW(x, c, b, w, s);
          all += x->nw[i];
          if (skip && skip[w]) continue;
          if (!(x->nw[i] > 0)) continue;
          double ref = peer_ref(x, c, b, w, s, 1, scratch), v = cell_value(x, i);
          double mref = peer_ref(x, c, b, w, s, 0, scratch), mean = x->sw[i] / x->nw[i];
          if (!(ref > 0) || !(v > 0)) continue;
          cell[k++] = (struct ex_vw){log(v / ref), x->nw[i]};
          e->n += x->nw[i];
          /* the time a step loses: by the means (what the steps paid) */
          if (mref > 0) e->excess_ns += (mean - mref) * x->nw[i];
        }
    /* a class of a few cells (a window of a few steps) says nothing: its own
     * scatter cannot be known */
    if (k < MIN_CELLS) {
      e->n = 0, e->excess_ns = 0;
      continue;
    }
    /* the workers set aside run the class too: its excess at their share */
    e->excess_ns *= all / e->n;
    e->effect = ex_wmedian(cell, k);
    /* the class's own scatter across its cells: a standard error of the
     * median, widened for few cells (about Student's t) */
    e->noise = 1.2533 * ex_wmad_sd(cell, k, e->effect) / sqrt((double)k) * (1 + 4.0 / (double)k);
    e->excess_ns /= x->in->steps > 0 ? x->in->steps : 1;
    effects[judged++] = e->effect;
  }
  /* the peers' scatter: how far a class that does the same work as its peers
   * lands from them in this window, measured within each layer (each class's
   * effect less its layer's median), so a whole slow layer — half the classes
   * of a two-layer model — does not count as scatter; a few culprits barely
   * move it. A floor of 0.5%: a deterministic simulator's identical classes. */
  double center = ex_median(effects, (size_t)judged);
  int resid = layer_residuals(x, effects);
  if (resid < 3) {  /* too few layers of three classes: the plain scatter */
    resid = 0;
    for (int c = 0; c < x->C; c++)
      if (!isnan(x->out->cls[c].effect)) effects[resid++] = x->out->cls[c].effect - center;
  }
  double sigma = ex_mad_sd(effects, (size_t)resid, 0);
  x->center = judged ? center : 0;
  x->sigma = judged && sigma > 0.005 ? sigma : 0.005;
  x->out->class_noise = x->sigma;
  for (int c = 0; c < x->C; c++) {
    struct ms_explain_effect *e = &x->out->cls[c];
    if (isnan(e->effect)) continue;
    e->effect -= x->center;
    e->noise = sqrt(x->sigma * x->sigma + e->noise * e->noise);
    against_base(x, c, e);
    e->z = e->effect / e->noise;
  }
out:
  free(scratch);
  free(cell);
  free(effects);
}

/* ---- layers ---- */

static void layer_effects(struct ex *x) {
  int L = 0;
  for (int c = 0; c < x->C; c++)
    if (x->in->classes[c].layer + 1 > L) L = x->in->classes[c].layer + 1;
  x->out->n_layers = L;
  free(x->out->layer);  /* judged again without the named workers */
  x->out->layer = NULL;
  if (!L || !(x->out->layer = calloc((size_t)L, sizeof *x->out->layer))) return;
  double *v = malloc(((size_t)x->C + 1) * sizeof *v);
  for (int l = 0; v && l < L; l++) {
    struct ms_explain_effect *e = &x->out->layer[l];
    *e = (struct ms_explain_effect){.z = NAN, .effect = NAN, .noise = NAN};
    int k = 0;
    for (int c = 0; c < x->C; c++)
      if (x->in->classes[c].layer == l && !isnan(x->out->cls[c].effect)) {
        v[k++] = x->out->cls[c].effect;
        e->n += x->out->cls[c].n;
        e->excess_ns += x->out->cls[c].excess_ns;
        e->peers = L - 1;
      }
    /* one slow class leaves a layer's median where it was; a layer needs
     * enough classes for its median to say anything */
    if (k < 3) continue;
    e->effect = ex_median(v, (size_t)k);
    e->noise = 1.2533 * x->sigma / sqrt((double)k);
  }
  /* with five layers or more, also how far healthy layers land from each
   * other in this window (a layer-wide effect common in healthy runs, say the
   * first layer's cold caches, is then no culprit) */
  int k = 0;
  for (int l = 0; v && l < L; l++)
    if (!isnan(x->out->layer[l].effect)) v[k++] = x->out->layer[l].effect;
  double between = k >= 5 ? ex_mad_sd(v, (size_t)k, 0) : 0;
  for (int l = 0; l < L; l++) {
    struct ms_explain_effect *e = &x->out->layer[l];
    if (isnan(e->effect)) continue;
    if (between > e->noise) e->noise = between;
    e->z = e->effect / e->noise;
  }
  free(v);
}

/* ---- workers and devices ---- */

/* The group a worker belongs to: itself, or its device. */
static int group_of(const struct ex *x, int worker, int by_device) {
  return by_device ? ex_device(x, worker) : worker;
}

/* A device's own pace, per slice into v (returns how many): in each class
 * (communication aside), bucket and slice, its workers' fastest task (a cell's
 * value, as the classes take it) against the other devices' fastest, the
 * median over classes weighted by the device's time in each (a fault on the
 * tasks that stream memory slows most of a step's time and not its norms). A thread that shares a worker's CPU
 * moves that worker's mean and not its fastest task, so a device is named for
 * its own work (a neighbour taking its memory bandwidth slows every task), and
 * a worker for its CPU (the mean, below): across processes rank 0's worker
 * shares its CPU with the server's threads, 1.4-1.6x its peers' mean on a
 * healthy tiny engine. */
static size_t device_pace(struct ex *x, int d, struct ex_vw *v) {
  size_t k = 0, nc = (size_t)x->C * (size_t)x->B;
  struct ex_vw *cv = malloc((nc + 1) * sizeof *cv);
  if (!cv) return 0;
  for (int s = 0; s < x->S; s++) {
    size_t kc = 0;
    double w = 0;
    for (int c = 0; c < x->C; c++) {
      if (!strncmp(x->in->classes[c].op, "comm", 4)) continue;
      for (int b = 0; b < x->B; b++) {
        double mine = INFINITY, others = INFINITY, n = 0;
        for (int wk = 0; wk < x->W; wk++) {
          size_t i = EX_ATW(x, c, b, wk, s);
          if (!(x->nw[i] > 0)) continue;
          double val = cell_value(x, i);
          if (ex_device(x, wk) == d) mine = val < mine ? val : mine, n += x->sw[i];
          else others = val < others ? val : others;
        }
        if (!isfinite(mine) || !isfinite(others) || !(mine > 0) || !(others > 0)) continue;
        cv[kc++] = (struct ex_vw){log(mine / others), n};
        w += n;
      }
    }
    if (kc) v[k++] = (struct ex_vw){ex_wmedian(cv, kc), w};
  }
  free(cv);
  return k;
}

/* A part judged over the window's slices: v[k] its per-slice log ratios,
 * weighted; the effect their weighted median, its noise their robust scatter
 * over sqrt(k) (about Student's t for few slices), with the same 0.5% floor as
 * the classes (timers, identical simulated tasks). Too few slices: not judged. */
static void slice_judge(struct ms_explain_effect *e, struct ex_vw *v, size_t k) {
  if (k < MIN_SLICES) return;
  e->effect = ex_wmedian(v, k);
  double se = 1.2533 * ex_wmad_sd(v, k, e->effect) / sqrt((double)k) * (1 + 4.0 / (double)k);
  e->noise = se > 0.005 ? se : 0.005;
  e->z = e->effect / e->noise;
}

/* Each group's task time against what the other groups took for the same
 * class, bucket and slice: log(time / expected), per slice, then the weighted
 * median over slices and its standard error. */
static void group_effects(struct ex *x, int by_device, struct ms_explain_effect *out, int G) {
  double *act = calloc((size_t)G * (size_t)x->S, sizeof *act), *exp_ = calloc((size_t)G * (size_t)x->S, sizeof *exp_);
  double *cnt = calloc((size_t)G * (size_t)x->S, sizeof *cnt);
  struct ex_vw *v = malloc(((size_t)x->S + 1) * sizeof *v);
  if (!act || !exp_ || !cnt || !v) goto out;
  const struct ms_explain_input *in = x->in;
  for (size_t i = 0; i < in->n_cells; i++) {
    const struct ms_explain_cell *c = &in->cells[i];
    if (c->cls < 0 || c->cls >= x->C || c->slice < 0 || c->slice >= x->S || !(c->n > 0)) continue;
    if (c->worker < 0 || c->worker >= in->n_workers) continue;
    /* on several devices a communication task lasts until the other devices'
     * shares arrive: a device that waits for a slow one would pass for as slow
     * as it (the wait offsets its own quicker tasks); its own pace is the rest */
    if (by_device && !strncmp(in->classes[c->cls].op, "comm", 4)) continue;
    size_t k = EX_AT(x, c->cls, bucket_index(x, c->bucket), c->slice);
    int g = group_of(x, c->worker, by_device);
    double on, os;  /* the others' tasks and time for this cell */
    if (by_device) {
      on = x->n[k] - x->nd[k * (size_t)x->D + (size_t)g], os = x->s[k] - x->sd[k * (size_t)x->D + (size_t)g];
    } else {
      on = x->n[k] - c->n, os = x->s[k] - c->sum_ns;
    }
    if (!(on > 0) || !(os > 0)) continue;
    size_t a = (size_t)g * (size_t)x->S + (size_t)c->slice;
    act[a] += c->sum_ns;
    exp_[a] += c->n * os / on;
    cnt[a] += c->n;
  }
  for (int g = 0; g < G; g++) {
    struct ms_explain_effect *e = &out[g];
    *e = (struct ms_explain_effect){.z = NAN, .effect = NAN, .noise = NAN, .peers = G - 1};
    size_t k = 0;
    for (int s = 0; s < x->S; s++) {
      size_t a = (size_t)g * (size_t)x->S + (size_t)s;
      if (!(exp_[a] > 0) || !(act[a] > 0)) continue;
      v[k++] = (struct ex_vw){log(act[a] / exp_[a]), cnt[a]};
      e->n += cnt[a];
      e->excess_ns += act[a] - exp_[a];
    }
    e->excess_ns /= in->steps > 0 ? in->steps : 1;
    if (by_device && x->Wc == x->W) k = device_pace(x, g, v);
    slice_judge(e, v, k);
  }
out:
  free(act);
  free(exp_);
  free(cnt);
  free(v);
}

/* ---- each worker's share of the plan's tasks (a saturated queue) ---- */

/* The plan places its AOT tasks round robin, so each worker holds an even
 * share of them, to a task a step; a worker whose queue holds more makes the
 * step wait for it though none of its tasks is slower. Per slice, a worker's
 * AOT tasks against the slice's over the workers (log of share x workers);
 * the effect is their weighted median, its noise their scatter over the
 * slices (a 0.5% floor); the excess, its AOT tasks' time beyond an even part
 * of theirs, per step. One device only (several devices' plans place their
 * communication apart). */
static void queue_effects(struct ex *x) {
  const struct ms_explain_input *in = x->in;
  struct ms_explain_effect *out = x->out->queue;
  for (int w = 0; w < x->W; w++) out[w] = (struct ms_explain_effect){.z = NAN, .effect = NAN, .noise = NAN};
  if (x->W < 2 || x->D > 1 || in->rank_workers > 0) return;
  size_t ws = (size_t)x->W * (size_t)x->S;
  /* [W * S] each worker's AOT tasks and time per slice; [S] every worker's */
  double *cnt = calloc(ws + 1, sizeof *cnt), *ns = calloc(ws + 1, sizeof *ns);
  double *all = calloc((size_t)x->S + 1, sizeof *all), *all_ns = calloc((size_t)x->S + 1, sizeof *all_ns);
  struct ex_vw *v = malloc(((size_t)x->S + 1) * sizeof *v);
  if (!cnt || !ns || !all || !all_ns || !v) goto out;
  for (size_t i = 0; i < in->n_cells; i++) {
    const struct ms_explain_cell *c = &in->cells[i];
    if (c->cls < 0 || c->cls >= x->C || !in->classes[c->cls].aot || c->slice < 0 || c->slice >= x->S) continue;
    if (c->worker < 0 || c->worker >= x->W || !(c->n > 0)) continue;
    cnt[(size_t)c->worker * (size_t)x->S + (size_t)c->slice] += c->n;
    ns[(size_t)c->worker * (size_t)x->S + (size_t)c->slice] += c->sum_ns;
    all[c->slice] += c->n;
    all_ns[c->slice] += c->sum_ns;
  }
  for (int w = 0; w < x->W; w++) {
    struct ms_explain_effect *e = &out[w];
    size_t k = 0;
    for (int s = 0; s < x->S; s++) {
      double mine = cnt[(size_t)w * (size_t)x->S + (size_t)s];
      if (!(mine > 0) || !(all[s] > 0)) continue;
      v[k++] = (struct ex_vw){log(mine * x->W / all[s]), all[s]};
      e->n += mine;
      e->excess_ns += ns[(size_t)w * (size_t)x->S + (size_t)s] - all_ns[s] / x->W;
    }
    e->excess_ns /= in->steps > 0 ? in->steps : 1;
    e->peers = x->W - 1;
    slice_judge(e, v, k);
  }
out:
  free(cnt);
  free(ns);
  free(all);
  free(all_ns);
  free(v);
}

/* ---- each device's shares (tensor parallel) ---- */

/* Each device's shares against the others': in each class, bucket and slice,
 * the tasks that carry device d's share against what the same number of the
 * other devices' took (log); per slice the median over classes (weighted by
 * tasks: the first gather of a step may wait for a device that starts its step
 * later, and stays one class of many), the fastest tasks when known (a share
 * late every time, not a rank late now and then), then the weighted median over slices
 * and its standard error, as a group's. Every device sends its share once and
 * receives every other one, so the shares' tasks are alike on a healthy engine. */
static void share_effects(struct ex *x) {
  const struct ms_explain_input *in = x->in;
  int D = x->D;
  size_t keys = (size_t)x->C * (size_t)(x->B ? x->B : 1) * (size_t)x->S;
  double *n = calloc(keys * (size_t)D, sizeof *n), *sum = calloc(keys * (size_t)D, sizeof *sum);
  double *mn = calloc(keys * (size_t)D, sizeof *mn);
  struct ex_vw *v = malloc(((size_t)x->S + 1) * sizeof *v), *cv = malloc(((size_t)x->C * (size_t)(x->B ? x->B : 1) + 1) * sizeof *cv);
  if (!n || !sum || !mn || !v || !cv) goto out;
  for (size_t i = 0; i < in->n_share_cells; i++) {
    const struct ms_explain_share_cell *c = &in->share_cells[i];
    int b = bucket_index(x, c->bucket);
    if (c->cls < 0 || c->cls >= x->C || b < 0 || c->slice < 0 || c->slice >= x->S || c->device < 0 ||
        c->device >= D || !(c->n > 0))
      continue;
    size_t k = EX_AT(x, c->cls, b, c->slice) * (size_t)D + (size_t)c->device;
    n[k] += c->n, sum[k] += c->sum_ns;
    if (c->min_ns > 0 && (!(mn[k] > 0) || c->min_ns < mn[k])) mn[k] = c->min_ns;
  }
  for (int d = 0; d < D; d++) {
    struct ms_explain_effect *e = &x->out->share[d];
    *e = (struct ms_explain_effect){.z = NAN, .effect = NAN, .noise = NAN, .peers = D - 1};
    size_t ks = 0;
    for (int s = 0; s < x->S; s++) {
      size_t kc = 0;
      double w = 0;
      for (int c = 0; c < x->C; c++)
        for (int b = 0; b < x->B; b++) {
          size_t k = EX_AT(x, c, b, s) * (size_t)D;
          double on = 0, os = 0, om = INFINITY;
          for (int o = 0; o < D; o++)
            if (o != d) on += n[k + (size_t)o], os += sum[k + (size_t)o], om = mn[k + (size_t)o] < om ? mn[k + (size_t)o] : om;
          double nd = n[k + (size_t)d], sd = sum[k + (size_t)d], md = mn[k + (size_t)d];
          if (!(nd > 0) || !(sd > 0) || !(on > 0) || !(os > 0)) continue;
          /* the fastest tasks when known on every device, else the means */
          double r = md > 0 && om > 0 && isfinite(om) ? md / om : sd / (nd * os / on);
          cv[kc++] = (struct ex_vw){log(r), nd};
          w += nd;
          e->n += nd;
          e->excess_ns += sd - nd * os / on;
        }
      if (kc) v[ks++] = (struct ex_vw){ex_wmedian(cv, kc), w};
    }
    e->excess_ns /= in->steps > 0 ? in->steps : 1;
    slice_judge(e, v, ks);
  }
out:
  free(n);
  free(sum);
  free(mn);
  free(v);
  free(cv);
}

/* ---- the OS's view: time waiting for a CPU ---- */

/* One worker's share of each OS slice's wall time (run == 1: the time it
 * ran; 0: the time it waited for a CPU): the median over slices into *share,
 * its scatter (a standard error, 1% at least: the scheduler's accounting and
 * the engine's own service threads move it by about that) into *noise. */
static int os_share(const struct ms_explain_input *in, int W, int w, int run, double *v, double *share, double *noise) {
  int k = 0;
  for (int s = 0; s < in->n_os_slices; s++) {
    const struct ms_explain_os *o = &in->os[(size_t)s * (size_t)W + (size_t)w];
    if (o->known && o->wall_ns > 0) v[k++] = (run ? o->run_ns : o->runqueue_ns) / o->wall_ns;
  }
  if (!k) return 0;
  *share = ex_median(v, (size_t)k);
  double se = k >= 3 ? 1.2533 * ex_mad_sd(v, (size_t)k, *share) / sqrt((double)k) : 0;
  *noise = se > 0.01 ? se : 0.01;
  return k;
}

/* Per worker: the share of the window it ran and the share it waited for a
 * CPU; and every worker's wait together. A waiting worker spins and yields,
 * so its run-queue wait grows whenever any other thread shares its CPU, its
 * partner's too when one worker is held up; the time it ran is what its CPU
 * gave it, and is what tells one worker's CPU from another's. */
static void cpu_effects(struct ex *x, struct ex_cpu *cpu) {
  const struct ms_explain_input *in = x->in;
  memset(cpu, 0, sizeof *cpu);
  if (!in->os) return;
  int S = in->n_os_slices;
  double *v = malloc(((size_t)S + 1) * sizeof *v), *all = malloc(((size_t)S + 1) * sizeof *all);
  if (!v || !all) goto out;
  int k_all = 0;
  for (int s = 0; s < S; s++) {
    double rq = 0, wall = 0;
    for (int w = 0; w < x->W; w++) {
      const struct ms_explain_os *o = &in->os[(size_t)s * (size_t)x->W + (size_t)w];
      if (o->known && o->wall_ns > 0) rq += o->runqueue_ns, wall += o->wall_ns;
    }
    if (wall > 0) all[k_all++] = rq / wall;
  }
  for (int w = 0; w < x->W && w < EX_MAX_CPU; w++) {
    if (!os_share(in, x->W, w, 0, v, &cpu->share[w], &cpu->noise[w])) continue;
    os_share(in, x->W, w, 1, v, &cpu->ran[w], &cpu->ran_noise[w]);
    cpu->known[w] = 1;
    for (int s = 0; s < S; s++) {
      const struct ms_explain_os *o = &in->os[(size_t)s * (size_t)x->W + (size_t)w];
      if (!o->known) continue;
      cpu->preempted[w] += o->preempted;
      cpu->pinned[w] = o->pinned_cpu, cpu->last[w] = o->last_cpu;
    }
  }
  cpu->all = k_all ? ex_median(all, (size_t)k_all) : 0;
  x->out->runqueue_share = cpu->all;
out:
  free(v);
  free(all);
}

/* ---- the whole judgement ---- */

int ms_explain_judge(const struct ms_explain_input *in, struct ms_explain_result *out) {
  memset(out, 0, sizeof *out);
  struct ex x;
  int rc = ex_init(&x, in, out);
  out->cls = calloc((size_t)in->n_classes + 1, sizeof *out->cls);
  out->worker = calloc((size_t)x.W + 1, sizeof *out->worker);
  out->device = calloc((size_t)x.D + 1, sizeof *out->device);
  out->request = calloc((size_t)in->n_requests + 1, sizeof *out->request);
  out->share = calloc((size_t)x.D + 1, sizeof *out->share);
  out->queue = calloc((size_t)x.W + 1, sizeof *out->queue);
  out->n_devices = x.D;
  if (rc || !out->cls || !out->worker || !out->device || !out->request || !out->share || !out->queue) {
    ex_free(&x);
    ms_explain_result_free(out);
    return -ENOMEM;
  }
  struct ex_cpu cpu;
  struct ex_req rq = {.time = malloc(((size_t)in->n_requests + 1) * sizeof *rq.time)};
  class_effects(&x, NULL);
  layer_effects(&x);
  group_effects(&x, 0, out->worker, x.W);
  queue_effects(&x);
  if (x.D > 1) group_effects(&x, 1, out->device, x.D);
  for (int d = 0; d < x.D; d++) out->share[d] = (struct ms_explain_effect){.z = NAN, .effect = NAN, .noise = NAN};
  if (x.D > 1 && in->n_share_cells) share_effects(&x);
  cpu_effects(&x, &cpu);
  int ok = rq.time != NULL && (out->set_aside = calloc((size_t)x.W + 1, 1));
  if (ok) {
    out->n_set_aside = ex_worker_culprits(&x, &cpu, out->set_aside);
    /* a named worker's cells out of the class and layer judgement, when
     * others are left to judge on (and the per-worker tables were kept) */
    if (out->n_set_aside > 0 && out->n_set_aside < x.W && x.Wc == x.W) {
      class_effects(&x, out->set_aside);
      layer_effects(&x);
    } else {
      memset(out->set_aside, 0, (size_t)x.W);
      out->n_set_aside = 0;
    }
    /* the requests on the same workers' tasks (when the cells say whose) */
    ex_request_effects(&x, &rq, out->n_set_aside ? out->set_aside : NULL);
    ex_part_culprits(&x, &rq);
  }
  free(rq.time);
  ex_free(&x);
  return ok ? 0 : -ENOMEM;
}

void ms_explain_result_free(struct ms_explain_result *r) {
  if (!r) return;
  free(r->cls);
  free(r->layer);
  free(r->worker);
  free(r->device);
  free(r->request);
  free(r->share);
  free(r->queue);
  free(r->set_aside);
  r->set_aside = NULL;
  r->cls = r->layer = r->worker = r->device = r->request = r->share = r->queue = NULL;
}
