/* SPDX-License-Identifier: MIT */
/* The diagnosers of the counterexample benchmark. Each sees only its own
 * method's evidence, that method's evidence from a healthy reference run of the
 * same configuration (another seed: "last week's profile"), and the plan's schema
 * (class names, kernels, layers: what a compiler publishes). Each answers with a
 * cause, a culprit and a confidence in 0..1.
 *
 * How they reason:
 *   kernel timing  the mean step time against the reference: slower names no
 *                  cause ("unknown"), the same says "none";
 *   PC sampling    the per-kernel sample shares against the reference; the
 *                  kernel that gained names the cause by the kernel's kind
 *                  (communication, MoE experts, attention, other kernels, or only
 *                  waiting) and a culprit only where the kernel or the device
 *                  identifies one (a kernel that runs for one class only);
 *   trace, sampled events, semantic monitors, profiler
 *                  the same hypothesis test over their feature tables: for every
 *                  (cause, culprit) a z-score of its feature against the
 *                  reference (a class's or an expert's or a request's or a
 *                  device's mean task time, an event class's release lag, a
 *                  class's longest queue, a worker's mean queue, an expert's
 *                  share of the routed rows); the largest wins if it clears
 *                  z_min. The semantic read-out first reads the cheap rows
 *                  (kernels, top workers, devices, event classes, experts,
 *                  requests), then the class rows of the kernel the first
 *                  answer points to, while its byte budget lasts.
 *   open-ended     questions of "where" that any slowness answers, with the
 *                  cause "unknown": a worker slower than its classes' means, a
 *                  device slower than the others, a layer whose classes stand
 *                  out against all layers, a request that finished late.
 * Confidence: the margin over the runner-up times the strength of the winner;
 * an answer of "none" is only as confident as the share of the run the evidence
 * covered, so a truncated trace that saw nothing does not claim health. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench.h"
#include "megascope/plan_ir.h"

#define Z_MIN 6.0
/* A further culprit stands above the threshold as the first does, and not lost
 * beside it (5% of its z: a fault's consequences elsewhere are a small fraction
 * of its own evidence; below that, a second fault's is taken for one). */
#define MULTI_Z 1.0
#define MULTI_REL 0.05
/* A worker's tasks, against their classes' means, carry whatever slow class's
 * or request's tasks it happened to run (a request's attention runs on a few
 * workers): a further worker stands at 15% of the first's z. */
#define MULTI_REL_WORKER 0.15
#define MAX_HYP 8192

struct hyp {
  int cause;
  enum ms_culprit_kind kind;
  int id;
  double z;
  double zin;     /* a class: the z of its excess beyond its layer's factor (the median of its layer's classes); else z */
  int queue;      /* judged by queueing alone (a task waited), not by work or time spent */
  int busy;       /* a device or worker judged by its tasks' times against their classes' means */
  int late;       /* a request judged by how late its last task ended (admitted late) */
  int stat;       /* the statistic that judged it (FAM_*): its family's */
  char why[160];
};

static double clamp01(double x) { return x < 0 ? 0 : x > 1 ? 1 : x; }

static void answer_none(struct bench_answer *a, double conf, const char *why) {
  a->cause = -1;
  a->kind = MS_CULPRIT_NONE;
  a->id = -1;
  snprintf(a->name, sizeof a->name, "-");
  a->confidence = clamp01(conf);
  snprintf(a->why, sizeof a->why, "%s", why);
}

static void answer_hyp(struct bench_answer *a, const struct hyp *h, double conf, const struct ms_plan *p) {
  a->cause = h->cause;
  a->kind = h->kind;
  a->id = h->id;
  bench_culprit_name(p, h->kind, h->id, a->name, sizeof a->name);
  a->confidence = clamp01(conf);
  snprintf(a->why, sizeof a->why, "%s", h->why);
}

/* ---- (a) kernel timing ---- */

static void mean_sd(const double *v, int n, double *mean, double *sd) {
  double s = 0, q = 0;
  for (int i = 0; i < n; i++) s += v[i];
  *mean = n ? s / n : 0;
  for (int i = 0; i < n; i++) q += (v[i] - *mean) * (v[i] - *mean);
  *sd = n > 1 ? sqrt(q / (n - 1)) : 0;
}

/* z of the mean of cur's first n step times against the reference's. */
static double timing_z(const struct bench_evidence *ref, const struct bench_evidence *cur, int n, double *ratio,
                       double *rel_sigma) {
  double mc, sc, mr, sr;
  if (n > cur->n_steps) n = cur->n_steps;
  mean_sd(cur->step_ns, n, &mc, &sc);
  mean_sd(ref->step_ns, ref->n_steps, &mr, &sr);
  double sigma = sqrt(sc * sc / n + sr * sr / (ref->n_steps ? ref->n_steps : 1)) + 0.002 * mr;
  *ratio = mr > 0 ? mc / mr : 1;
  *rel_sigma = mr > 0 ? sigma / mr : 1;
  return sigma > 0 ? (mc - mr) / sigma : 0;
}

static void diagnose_timing(const struct bench_evidence *ref, const struct bench_evidence *null_ref,
                            const struct bench_evidence *const *alt, int n_alt, struct bench_evidence *ev,
                            const struct bench_scenario *scn, struct bench_answer *a) {
  int n = ev->n_steps, keep = (int)(ev->budget / 8);
  if (ev->budget && keep < n) n = keep;
  a->bytes = (uint64_t)n * 8;
  a->coverage = ev->n_steps ? (double)n / ev->n_steps : 0;
  if (n < 1) {
    answer_none(a, 0, "no step times within the budget");
    return;
  }
  double ratio, rel, z = timing_z(ref, ev, n, &ratio, &rel), null = 0;
  /* what the same comparison says between healthy runs (real clocks) */
  for (int k = 0; k < n_alt; k++) {
    double rk, sk, zk = timing_z(null_ref, alt[k], n, &rk, &sk);
    if (fabs(zk) > null) null = fabs(zk);
  }
  if (null > 2) z *= 2 / null, rel *= null / 2;
  if (z > 4) {
    a->cause = -2;
    a->kind = MS_CULPRIT_NONE;
    a->id = -1;
    snprintf(a->name, sizeof a->name, "-");
    a->confidence = 0;
    snprintf(a->why, sizeof a->why, "steps %.2f%% slower than the reference (z %.1f): nothing says why",
             100 * (ratio - 1), z);
    return;
  }
  char why[160];
  snprintf(why, sizeof why, "step time within noise of the reference (%+.2f%%, z %.1f)", 100 * (ratio - 1), z);
  /* "none" means "not slower by the target": only as sure as the noise is below it */
  answer_none(a, 0.8 * a->coverage * (1 - clamp01(z / 4)) * clamp01(1 - 4 * rel / scn->target), why);
}

/* ---- (b) PC sampling ---- */

static int kernel_classes(const struct ms_plan *p, int k, int *only) {
  int n = 0;
  for (int c = 0; c < p->n_classes; c++)
    if (p->classes[c].kernel == k) {
      *only = c;
      n++;
    }
  return n;
}

/* The largest z of a (device, kernel or state) share of cur against the reference's. */
static double pc_best(const struct bench_evidence *ref, const double cur[BENCH_MAX_DEVICES][20], double rel,
                      double abs_floor) {
  double nc = 0, nr = ref->pc_total, best = 0;
  for (int d = 0; d < BENCH_MAX_DEVICES; d++)
    for (int k = 0; k < 20; k++) nc += cur[d][k];
  if (nc <= 0 || nr <= 0) return 0;
  for (int d = 0; d < BENCH_MAX_DEVICES; d++)
    for (int k = 0; k < 20; k++) {
      double pc = cur[d][k] / nc, pr = ref->pc[d][k] / nr;
      double z = (pc - pr) / (sqrt(pr * (1 - pr) / nc + pr * (1 - pr) / nr) + abs_floor + rel * pr);
      if (z > best) best = z;
    }
  return best;
}

static void diagnose_pc(const struct bench_evidence *ref, const struct bench_evidence *null_ref,
                        const struct bench_evidence *const *alt, int n_alt, struct bench_evidence *ev,
                        const struct ms_plan *p, const struct bench_scenario *sc, struct bench_answer *a) {
  /* what differs between two healthy runs beyond sampling noise: little on the
   * simulator, much on a shared CPU */
  const int sim = ms_backend_info(sc->backend)->virtual_clock;
  double rel = sim ? 0.02 : 0.15, abs_floor = sim ? 2e-5 : 2e-3;
  /* and what it reaches between healthy runs here (real clocks): z sized against it */
  double null = 0, f = 1;
  for (int k = 0; k < n_alt; k++) {
    double zk = pc_best(null_ref, alt[k]->pc, rel, abs_floor);
    if (zk > null) null = zk;
  }
  if (null > Z_MIN / 2) f = Z_MIN / 2 / null;
  /* the budget keeps the rows with the most samples */
  int rows = 0, keep = ev->budget ? (int)(ev->budget / 16) : 1 << 30;
  double cur[BENCH_MAX_DEVICES][20];
  memcpy(cur, ev->pc, sizeof cur);
  for (;;) {
    int n = 0;
    double least = 1e300;
    int ld = -1, lk = -1;
    for (int d = 0; d < BENCH_MAX_DEVICES; d++)
      for (int k = 0; k < 20; k++)
        if (cur[d][k] > 0) {
          n++;
          if (cur[d][k] < least) least = cur[d][k], ld = d, lk = k;
        }
    rows = n;
    if (n <= keep || ld < 0) break;
    cur[ld][lk] = 0;
  }
  a->bytes = (uint64_t)rows * 16;
  a->coverage = 1;
  double nc = 0, nr = ref->pc_total;
  for (int d = 0; d < BENCH_MAX_DEVICES; d++)
    for (int k = 0; k < 20; k++) nc += cur[d][k];
  if (nc <= 0 || nr <= 0) {
    answer_none(a, 0, "no samples within the budget");
    return;
  }
  /* z of each (device, kernel or state) share against the reference */
  double best = 0, second = 0;
  int bd = -1, bk = -1;
  double zk[20] = {0};
  for (int d = 0; d < BENCH_MAX_DEVICES; d++)
    for (int k = 0; k < 20; k++) {
      double pc = cur[d][k] / nc, pr = ref->pc[d][k] / nr;
      if (cur[d][k] <= 0 && ref->pc[d][k] <= 0) continue;
      /* sampling noise, and a floor for what differs between two healthy runs */
      double sd = sqrt(pr * (1 - pr) / nc + pr * (1 - pr) / nr) + abs_floor + rel * pr;
      double z = (pc - pr) / sd * f;
      if (z > zk[k]) zk[k] = z;
      if (z > best) {
        second = best;
        best = z, bd = d, bk = k;
      } else if (z > second) {
        second = z;
      }
    }
  if (best < Z_MIN) {
    char why[160];
    snprintf(why, sizeof why, "no kernel or stall state gained samples (best z %.1f)", best);
    answer_none(a, 0.8 * (1 - best / Z_MIN) * clamp01(1 - rel / (2 * sc->target)), why);
    return;
  }
  /* the strongest kernel (not a wait state) names the cause */
  int kb = -1;
  double zb = 0;
  for (int k = 2; k < 20; k++)
    if (zk[k] > zb) zb = zk[k], kb = k;
  struct hyp h = {.cause = -2, .kind = MS_CULPRIT_NONE, .id = -1, .z = best};
  double conf = clamp01(1 - second / best) * clamp01(best / (2 * Z_MIN));
  if (kb >= 0 && zb >= Z_MIN) {
    int k = kb - 2, only = -1, n = kernel_classes(p, k, &only);
    if (k == MS_K_COMM) {
      int dev = 0;
      double zd = 0;
      for (int d = 0; d < BENCH_MAX_DEVICES; d++) {
        double pc = cur[d][kb] / nc, pr = ref->pc[d][kb] / nr;
        double z = (pc - pr) / (sqrt(pr * (1 - pr) / nc + pr * (1 - pr) / nr) + abs_floor + rel * pr) * f;
        if (z > zd) zd = z, dev = d;
      }
      h = (struct hyp){.cause = MS_FAULT_COMM_DELAY, .kind = MS_CULPRIT_DEVICE, .id = dev, .z = zd};
    } else if (k == MS_K_EXPERT_UP || k == MS_K_EXPERT_DOWN) {
      h = (struct hyp){.cause = MS_FAULT_ROUTING_SKEW, .kind = MS_CULPRIT_EXPERT, .id = -1, .z = zb};
    } else if (k == MS_K_ATTN) {
      h = (struct hyp){.cause = MS_FAULT_SLOW_REQUEST, .kind = MS_CULPRIT_REQUEST, .id = -1, .z = zb};
    } else {
      h = (struct hyp){.cause = MS_FAULT_SLOW_CLASS, .kind = MS_CULPRIT_TASK_CLASS, .id = n == 1 ? only : -1, .z = zb};
    }
    snprintf(h.why, sizeof h.why, "kernel %s gained samples (z %.1f)%s", ms_kernel_name(k), zb,
             n > 1 && h.kind == MS_CULPRIT_TASK_CLASS ? ": it runs for several classes, which one is not sampled" : "");
  } else {
    /* only waiting grew: a held release, a starved task and a saturated queue look alike */
    h = (struct hyp){.cause = MS_FAULT_DELAYED_RELEASE, .kind = MS_CULPRIT_EVENT_CLASS, .id = -1, .z = best};
    snprintf(h.why, sizeof h.why, "only %s samples grew (z %.1f): the wait is visible, not what it waits for",
             bk == 1 ? "scheduler-wait" : "idle", best);
    conf = clamp01(conf) * 0.34;
  }
  (void)bd;
  answer_hyp(a, &h, conf, p);
}

/* ---- the feature diagnoser: trace, sampled events, semantic monitors ---- */

struct fctx {
  const struct bench_features *ref;
  struct bench_features *cur;
  const struct ms_plan *p;
  double floor_abs;     /* ns: below this, a difference is noise */
  double drift;         /* how much slower every class ran than in the reference (the median) */
  double spread;        /* how much the classes' ratios scatter around it */
  double step_ns;       /* the run's time per step (the late-request scale) */
  int sim;              /* the evidence comes from the simulator */
  int steps;            /* the run's steps (what its monitor saw of them) */
  double op_drift[MS_K_COUNT];  /* CPU: the median cur / ref ratio of each kernel's classes (0: too few) */
  double stream_drift;  /* CPU: the same over the layers' weight-streaming classes (0: too few) */
  struct hyp *h;
  int n;
  const double *scale;  /* per hypothesis family (fam_of): what the z is multiplied by; NULL: 1 */
  int queueing;         /* the hypotheses being added are judged by queueing alone */
  int busy;             /* ... by a device's or worker's tasks against their classes' means */
  int late;             /* ... by how late a request's last task ended */
  int stat;             /* ... by which statistic, where a scope has several of unlike noise (FAM_*) */
  int whole;            /* the evidence counts every task of the run (coverage 1: not sampled, not cut short) */
};

/* Hypothesis families: a cause and a kind of scope, named or not (kernel-level
 * hypotheses apart). Their z is sized against how far the same family reaches
 * between healthy runs (bench_diagnose_null). A scope judged by statistics of
 * unlike noise (a worker: its tasks kernel by kernel, the OS's count of its
 * thread's waits for a CPU) gives each its own family, so that the one that
 * wanders more between healthy runs does not size the other's z. */
enum { FAM_ANY, FAM_OS, FAM_STATS };
#define N_FAM ((MS_FAULT_TYPE_COUNT + 2) * MS_CULPRIT_KIND_COUNT * 2 * FAM_STATS)
static int fam_of(int cause, enum ms_culprit_kind kind, int id, int stat) {
  int c = cause + 2 < 0 ? 0 : cause + 2 > MS_FAULT_TYPE_COUNT + 1 ? MS_FAULT_TYPE_COUNT + 1 : cause + 2;
  return ((c * MS_CULPRIT_KIND_COUNT + (int)kind) * 2 + (id < 0)) * FAM_STATS + stat;
}

static int have(const struct fctx *c, int sec, int i) {
  return i >= 0 && i < c->cur->n[sec] && c->cur->row[sec][i].have && c->cur->row[sec][i].n > 0 &&
         c->ref->row[sec][i].n > 0;
}

/* z of a row's mean against the reference's. */
/* A row's count, sum and sum of squares; on real clocks without its longest
 * sample where the row keeps it (one preemption of a millisecond moves the
 * mean of a hundred tasks of twenty microseconds by half). */
struct moments {
  double n, sum, sumsq;
};
static struct moments moments_of(const struct fctx *c, const struct bench_stat *x) {
  struct moments m = {x->n, x->sum, x->sumsq};
  if (!c->sim && x->n >= 4 && x->max > 0 && x->max <= x->sum) {
    m.n -= 1;
    m.sum -= x->max;
    m.sumsq = fmax(0, m.sumsq - x->max * x->max);
  }
  return m;
}
static double mean_of(const struct fctx *c, const struct bench_stat *x) {
  struct moments m = moments_of(c, x);
  return m.n > 0 ? m.sum / m.n : 0;
}

static double z_mean(struct fctx *c, int sec, int i, double *ratio) {
  const struct bench_stat *xs = &c->cur->row[sec][i], *rs = &c->ref->row[sec][i];
  struct moments xm = moments_of(c, xs), rm = moments_of(c, rs);
  const struct moments *x = &xm, *r = &rm;
  /* task times against the run's drift (a loaded machine slows every class);
   * on the CPU a class against the other layers' classes of its kernel, in the
   * same run, where there are enough of them */
  double d = sec == FS_EVCLASS ? 1 : c->drift;
  if (sec == FS_CLASS && c->op_drift[c->p->classes[i].kernel] > 0) d = c->op_drift[c->p->classes[i].kernel];
  /* the head streams the most weights of any class and has no peers of its
   * kernel: it is read against the layers' streaming classes, which the
   * memory bandwidth the run got moves with it */
  if (sec == FS_CLASS && c->p->classes[i].kernel == MS_K_LM_HEAD && c->stream_drift > d) d = c->stream_drift;
  double mx = x->sum / x->n / d, mr = r->sum / r->n;
  /* one sample says nothing of the spread: assume it as large as the value */
  double vx = x->n > 1 ? fmax(0, x->sumsq / x->n / (d * d) - mx * mx) : mx * mx;
  double vr = r->n > 1 ? fmax(0, r->sumsq / r->n - mr * mr) : mr * mr;
  /* few samples: a wider interval (about Student's t); on real clocks the
   * absolute floor (what one task's time moves by, unaccounted) is a mean's:
   * divided by the root of its samples */
  double floor = c->sim ? c->floor_abs : c->floor_abs / sqrt(fmin(x->n, r->n) > 1 ? fmin(x->n, r->n) : 1);
  double sd = sqrt(vx / x->n * (1 + 4 / x->n) + vr / r->n * (1 + 4 / r->n)) + 0.01 * mr + floor;
  *ratio = mr > 0 ? mx / mr : 0;
  return (mx - mr) / sd;
}

static void sort_d(double *r, int n) {
  for (int i = 1; i < n; i++)  /* insertion sort: a few hundred values */
    for (int j = i; j > 0 && r[j] < r[j - 1]; j--) {
      double t = r[j];
      r[j] = r[j - 1];
      r[j - 1] = t;
    }
}

static void add(struct fctx *c, int cause, enum ms_culprit_kind kind, int id, double z, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));
static void add(struct fctx *c, int cause, enum ms_culprit_kind kind, int id, double z, const char *fmt, ...) {
  if (c->scale) z *= c->scale[fam_of(cause, kind, id, c->stat)];
  if (c->n == MAX_HYP || !(z > 0)) return;
  struct hyp *h = &c->h[c->n++];
  *h = (struct hyp){.cause = cause, .kind = kind, .id = id, .z = z, .zin = z, .queue = c->queueing, .busy = c->busy,
                    .late = c->late, .stat = c->stat};
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(h->why, sizeof h->why, fmt, ap);
  va_end(ap);
}

/* The factor class i's layer ran at: the median ratio to the reference of the
 * layer's classes (communication and empty tasks aside); 1 when the class has
 * no layer or the layer fewer than 3 classes seen. *sd: how much the layer's
 * classes' log ratios scatter around it (1.4826 x their median absolute
 * deviation; 0 with fewer than 4 classes). */
static double layer_factor(struct fctx *c, int i, double *sd) {
  int l = c->p->classes[i].layer, n = 0;
  double r[256], d[256];
  *sd = 0;
  if (l < 0) return 1;
  for (int j = 0; j < c->cur->n[FS_CLASS] && n < 256; j++) {
    const struct ms_task_class *k = &c->p->classes[j];
    if (k->layer != l || k->kernel == MS_K_EMPTY || k->kernel == MS_K_COMM || !have(c, FS_CLASS, j)) continue;
    double ratio;
    z_mean(c, FS_CLASS, j, &ratio);
    r[n++] = ratio;
  }
  if (n < 3) return 1;
  sort_d(r, n);
  if (n >= 4) {
    for (int j = 0; j < n; j++) d[j] = fabs(log(r[j] / r[n / 2]));
    sort_d(d, n);
    *sd = 1.4826 * d[n / 2];
  }
  return r[n / 2] > 1 ? r[n / 2] : 1;
}

/* One (cause, culprit) per row of a section, by its mean against the
 * reference. A slow class is one class: when `broad` classes stand out at once
 * the cause is broader (a layer, a device, a request), and each row's z is
 * divided by the square root of how many do. */
static void hyp_time(struct fctx *c, int sec, int cause, enum ms_culprit_kind kind, const char *what, int broad) {
  double div = broad > 1 ? sqrt(broad) : 1;
  for (int i = 0; i < c->cur->n[sec]; i++) {
    if (!have(c, sec, i)) continue;
    double ratio, z = z_mean(c, sec, i, &ratio) / div;
    int before = c->n;
    char name[80];
    bench_culprit_name(c->p, kind, i, name, sizeof name);
    const struct bench_stat *x = &c->cur->row[sec][i], *r = &c->ref->row[sec][i];
    if (sec == FS_EVCLASS)  /* a healthy lag is about 0: absolute times say more than a ratio */
      add(c, cause, kind, i, z, "%s %s: release lag %.2f us, reference %.2f us (z %.1f, %.0f samples)", what, name,
          x->sum / x->n / 1e3, r->sum / r->n / 1e3, z, x->n);
    else
      add(c, cause, kind, i, z, "%s %s: %.2fx the reference task time (z %.1f, %.0f samples%s)", what, name, ratio, z,
          x->n, div > 1 ? "; other classes too" : "");
    /* a class beside a slow layer it is in: what of its excess its layer's
     * factor leaves (the layer explains the classes' breadth, so undivided) */
    if (sec == FS_CLASS && c->n > before && ratio > 1) {
      double sd, lf = layer_factor(c, i, &sd);
      c->h[c->n - 1].zin = c->h[c->n - 1].z * div * clamp01((ratio - lf) / (ratio - 1));
      /* in a slow layer, also against how much its classes differ among
       * themselves: a layer slowed 3.7x on the CPU ran its classes at 3.6x to
       * 4.2x (each spins a multiple of its own time), so one at 4.2x is the
       * layer, not a class of its own */
      if (lf > 1 && sd > 0 && log(ratio / lf) / sd < c->h[c->n - 1].zin) c->h[c->n - 1].zin = log(ratio / lf) / sd;
    }
  }
}

/* Longest queue per class: one starved task. Many classes at once is a worker's
 * queue, not a starved task: the z is divided by how many classes share it. */
static void hyp_starve(struct fctx *c) {
  double z[1024];
  int n = c->cur->n[FS_CLASS] < 1024 ? c->cur->n[FS_CLASS] : 1024, broad = 0;
  for (int i = 0; i < n; i++) {
    z[i] = 0;
    if (!have(c, FS_CLASS, i)) continue;
    double qc = c->cur->row[FS_CLASS][i].qmax, qr = c->ref->row[FS_CLASS][i].qmax;
    if (!c->sim && c->steps > 1) {
      /* real clocks: one preemption makes one queue long once; a starved task
       * waits every step, so its class's queue in all grows by steps times as
       * much: the longest queue counts only as far as the total bears it out */
      const struct bench_stat *x = &c->cur->row[FS_CLASS][i], *r = &c->ref->row[FS_CLASS][i];
      double per_step = (x->qsum - r->qsum * x->n / r->n) / c->steps;
      if (qc - qr > per_step) qc = qr + (per_step > 0 ? per_step : 0);
    }
    z[i] = (qc - qr) / (0.15 * qr + c->floor_abs + 50);
    broad += z[i] > Z_MIN;
  }
  /* queueing as long as the longest's half: a wider cause than one task */
  double top = 0;
  for (int i = 0; i < n; i++)
    if (z[i] > top) top = z[i];
  broad = 0;
  for (int i = 0; i < n; i++) broad += z[i] > Z_MIN && z[i] >= 0.5 * top;
  c->queueing = 1;
  for (int i = 0; i < n; i++)
    if (z[i] > 0 && c->p->classes[i].launch == MS_LAUNCH_JIT)
      add(c, MS_FAULT_STARVE_TASK, MS_CULPRIT_TASK_CLASS, i, z[i] / (broad > 1 ? broad : 1),
          "class %s: a task queued %.1f us (reference longest %.1f us; %d classes queue long)",
          c->p->classes[i].name, c->cur->row[FS_CLASS][i].qmax / 1e3, c->ref->row[FS_CLASS][i].qmax / 1e3, broad);
  c->queueing = 0;
}

/* Kernel-level hypotheses (the semantic read-out's first look, and what is left
 * when the class rows do not fit the budget): culprit not named. */
static void hyp_ops(struct fctx *c) {
  for (int k = 0; k < c->cur->n[FS_OP]; k++) {
    if (!have(c, FS_OP, k) || k == MS_K_COMM || k == MS_K_EMPTY || k == MS_K_STEP_START) continue;
    double ratio, z = z_mean(c, FS_OP, k, &ratio);
    int only = -1, n = kernel_classes(c->p, k, &only);
    if (n == 1) continue;  /* the class row says the same, and names it */
    add(c, MS_FAULT_SLOW_CLASS, MS_CULPRIT_TASK_CLASS, -1, z * 0.9, "kernel %s: %.2fx the reference task time (z %.1f)",
        ms_kernel_name(k), ratio, z);
    double qc = c->cur->row[FS_OP][k].qmax, qr = c->ref->row[FS_OP][k].qmax;
    if (!c->sim && c->steps > 1) {  /* as in hyp_starve: what the kernel's total queue bears out */
      const struct bench_stat *x = &c->cur->row[FS_OP][k], *r = &c->ref->row[FS_OP][k];
      double per_step = (x->qsum - r->qsum * x->n / r->n) / c->steps;
      if (qc - qr > per_step) qc = qr + (per_step > 0 ? per_step : 0);
    }
    c->queueing = 1;
    if (k == MS_K_ATTN || k == MS_K_EXPERT_UP || k == MS_K_EXPERT_DOWN)
      add(c, MS_FAULT_STARVE_TASK, MS_CULPRIT_TASK_CLASS, -1, 0.9 * (qc - qr) / (0.25 * qr + 4 * c->floor_abs + 200),
          "kernel %s: a task queued %.1f us (reference %.1f us)", ms_kernel_name(k), qc / 1e3, qr / 1e3);
    c->queueing = 0;
  }
}

/* A worker's tasks' times against their classes' means (1: as fast as the
 * class), divided by the same for that worker in the reference (a worker that
 * runs the step start or the sampler is slower in both). 1: not known. */
static double worker_task_ratio(const struct fctx *c, int w) {
  if (w < 0 || w >= c->cur->n[FS_WORKER] || !c->cur->row[FS_WORKER][w].have) return 1;
  const struct bench_stat *x = &c->cur->row[FS_WORKER][w], *r = &c->ref->row[FS_WORKER][w];
  if (x->ratio_n < 3 || r->ratio_n < 3 || !(x->ratio > 0) || !(r->ratio > 0)) return 1;
  return (x->ratio / x->ratio_n) / (r->ratio / r->ratio_n);
}

/* How far the reference's workers' mean task ratios (each task's time over its
 * class's mean) scatter: a robust sd over the workers, and the median number
 * of tasks a worker's mean is of. -1 when fewer than 4 workers say. */
static int worker_scatter(const struct fctx *c, double *sd, double *m) {
  double dev[1024], cnt[1024];
  int n = 0;
  for (int i = 0; i < c->ref->n[FS_WORKER] && n < 1024; i++) {
    const struct bench_stat *r = &c->ref->row[FS_WORKER][i];
    if (r->ratio_n >= 3 && r->ratio > 0) dev[n] = r->ratio / r->ratio_n, cnt[n++] = r->ratio_n;
  }
  if (n < 4) return -1;
  sort_d(dev, n);
  sort_d(cnt, n);
  double med = dev[n / 2];
  for (int i = 0; i < n; i++) dev[i] = fabs(dev[i] - med);
  sort_d(dev, n);
  *sd = 1.4826 * dev[n / 2];
  *m = cnt[n / 2];
  return 0;
}

/* Open-ended: the worker whose tasks ran longest against their classes' means,
 * if that is more than its own reference: a cause no diagnoser here was written
 * for, so "unknown", scope the worker. */
/* A CPU server's few cores (2 or 3 workers) cannot say how workers scatter, and
 * every class's mean is half the slow worker's: worker w's tasks against their
 * classes' means, over the other workers' (in this run), against the same in
 * the reference, which a throttled worker moves by its whole factor. The
 * noise: 1% nominal, sized on real clocks by what this hypothesis reaches
 * between healthy runs (bench_diagnose_null). */
static int by_kernel(struct fctx *c, int w);
static void few_workers_slow(struct fctx *c, int w) {
  if (by_kernel(c, w)) return;
  double xo = 0, ro = 0;
  int no = 0;
  for (int o = 0; o < c->cur->n[FS_WORKER]; o++) {
    if (o == w || !bench_feat_read(c->cur, FS_WORKER, o)) continue;
    const struct bench_stat *x = &c->cur->row[FS_WORKER][o], *r = &c->ref->row[FS_WORKER][o];
    if (x->ratio_n < 3 || r->ratio_n < 3 || !(x->ratio > 0) || !(r->ratio > 0)) continue;
    xo += x->ratio / x->ratio_n;
    ro += r->ratio / r->ratio_n;
    no++;
  }
  const struct bench_stat *x = &c->cur->row[FS_WORKER][w], *r = &c->ref->row[FS_WORKER][w];
  if (!no || x->ratio_n < 3 || r->ratio_n < 3 || !(x->ratio > 0) || !(r->ratio > 0)) return;
  double ratio = (x->ratio / x->ratio_n / (xo / no)) / (r->ratio / r->ratio_n / (ro / no));
  add(c, -2, MS_CULPRIT_WORKER, w, (ratio - 1) / 0.01, "worker %d: its tasks ran %.2fx the other workers' against "
      "their classes' means, over the same in the reference (%.0f tasks)", w, ratio, x->ratio_n);
}

/* Worker w's mean task time against the other workers', kernel by kernel,
 * over the same in the reference: log ratios, one a kernel with enough tasks
 * on both sides (waits and communication aside: their time is another's).
 * Their count. */
#define KR_MIN_TASKS 30  /* a kernel's tasks on each side: the step's one-a-step kernels (embed, sample) say little */
static int kernel_ratios(const struct fctx *c, int w, double *out) {
  const struct bench_features *f = c->cur, *g = c->ref;
  int W = f->n[FS_WOP] / MS_K_COUNT, n = 0;
  if (w < 0 || w >= W || g->n[FS_WOP] != f->n[FS_WOP]) return 0;
  for (int k = 0; k < MS_K_COUNT; k++) {
    /* kernels whose tasks do the same work wherever they run: not waits or
     * communication (their time is another's), not attention or the experts
     * (a task's work is its request's context, its expert's rows: which
     * worker got the long ones is chance) */
    if (k == MS_K_COMM || k == MS_K_EMPTY || k == MS_K_ATTN || k == MS_K_EXPERT_UP || k == MS_K_EXPERT_DOWN) continue;
    double m[2][2];  /* [cur, ref][w, the others]: mean time */
    int ok = 1;
    for (int side = 0; side < 2 && ok; side++) {
      const struct bench_features *h = side ? g : f;
      double wn = 0, ws = 0, on = 0, os = 0;
      for (int o = 0; o < W; o++) {
        const struct bench_stat *x = &h->row[FS_WOP][o * MS_K_COUNT + k];
        if (!side && !x->have) {
          if (x->n > 0) ok = 0;  /* not read within the budget: the kernel is not judged */
          continue;
        }
        if (o == w) wn += x->n, ws += x->sum;
        else on += x->n, os += x->sum;
      }
      if (wn < KR_MIN_TASKS || on < KR_MIN_TASKS || !(ws > 0) || !(os > 0)) ok = 0;
      else m[side][0] = ws / wn, m[side][1] = os / on;
    }
    if (ok) out[n++] = log(m[0][0] / m[0][1]) - log(m[1][0] / m[1][1]);
  }
  return n;
}

/* The few-workers hypothesis kernel by kernel: the median of worker w's
 * kernels' ratios (above), its noise their scatter over the kernels (a
 * standard error, 0.5% at least). A worker slowed as a whole is slower at
 * every kernel; a kernel whose tiles move with the memory bandwidth the
 * moment gets (a large head's) is one vote of many. 0 when fewer than four
 * kernels say (then the tasks' ratios decide). */
static int by_kernel(struct fctx *c, int w) {
  double r[MS_K_COUNT], d[MS_K_COUNT];
  int n = kernel_ratios(c, w, r);
  if (n < 4) return 0;
  sort_d(r, n);
  double med = n % 2 ? r[n / 2] : (r[n / 2 - 1] + r[n / 2]) / 2;
  for (int i = 0; i < n; i++) d[i] = fabs(r[i] - med);
  sort_d(d, n);
  double mad = n % 2 ? d[n / 2] : (d[n / 2 - 1] + d[n / 2]) / 2;
  double se = 1.2533 * 1.4826 * mad / sqrt((double)n) * (1 + 4.0 / n);
  if (se < 0.005) se = 0.005;
  c->busy = 1;  /* beside a culprit whose tasks it ran, judged by what is left (busy_left) */
  add(c, -2, MS_CULPRIT_WORKER, w, med / se, "worker %d: its tasks ran %.3fx the other workers' kernel by kernel "
      "(the median of %d kernels, scatter %.1f%%), over the same in the reference", w, exp(med), n, 100 * se);
  c->busy = 0;
  return 1;
}

/* Whether every class of kernel k is placed ahead of time (AOT): its tasks
 * are on the workers' queues the plan built, never taken by whoever is free. */
static int aot_kernel(const struct ms_plan *p, int k) {
  int any = 0;
  for (int i = 0; i < p->n_classes; i++)
    if (p->classes[i].kernel == k) {
      if (p->classes[i].launch == MS_LAUNCH_JIT) return 0;
      any = 1;
    }
  return any;
}

/* A saturated queue, counted: worker w's share of the AOT kernels' tasks
 * against its share in the reference. The plan fixes where those tasks run,
 * so between healthy runs of a configuration the shares agree to a few
 * hundredths of a per cent (the batch shapes' mix; measured on the CPU
 * held-out records: z at most 0.1 at this noise); a saturated queue holds
 * tasks moved onto it from the others. Its noise, 0.2% of the share, is
 * sized further by the null. Only where every task was counted (a sampled
 * or cut-short count's share moves with where it sampled or stopped), and
 * on real clocks only: the simulator has no healthy runs to size it. */
#define AOT_SHARE_NOISE 0.002
static void hyp_aot_share(struct fctx *c) {
  const struct bench_features *f = c->cur, *g = c->ref;
  int W = f->n[FS_WOP] / MS_K_COUNT;
  double cur[64] = {0}, ref[64] = {0}, tc = 0, tr = 0;
  if (c->sim || !c->whole || W < 2 || W > 64 || g->n[FS_WOP] != f->n[FS_WOP]) return;
  for (int k = 0; k < MS_K_COUNT; k++) {
    if (k == MS_K_COMM || k == MS_K_EMPTY || !aot_kernel(c->p, k)) continue;
    for (int w = 0; w < W; w++) {
      const struct bench_stat *x = &f->row[FS_WOP][w * MS_K_COUNT + k];
      if (x->n > 0 && !x->have) return;  /* not read within the budget: a share of part says nothing */
      cur[w] += x->n;
      ref[w] += g->row[FS_WOP][w * MS_K_COUNT + k].n;
    }
  }
  for (int w = 0; w < W; w++) tc += cur[w], tr += ref[w];
  if (!(tc > 0) || !(tr > 0)) return;
  c->queueing = 1;
  for (int w = 0; w < W; w++) {
    if (!(ref[w] > 0)) continue;
    double ratio = (cur[w] / tc) / (ref[w] / tr);
    add(c, MS_FAULT_QUEUE_SATURATION, MS_CULPRIT_WORKER, w, (ratio - 1) / AOT_SHARE_NOISE,
        "worker %d: it ran %.2f%% of the tasks the plan places ahead of time, %.2f%% in the reference (%.0f tasks)",
        w, 100 * cur[w] / tc, 100 * ref[w] / tr, tc);
  }
  c->queueing = 0;
}

static void hyp_slow_worker(struct fctx *c) {
  if (!c->cur->row[FS_BTOP][0].have) return;
  int w = (int)c->cur->row[FS_BTOP][0].n;
  if (w < 0 || w >= c->cur->n[FS_WORKER] || !bench_feat_read(c->cur, FS_WORKER, w)) return;
  const struct bench_stat *x = &c->cur->row[FS_WORKER][w];
  double ratio = worker_task_ratio(c, w);
  /* the noise of a worker's mean, from the reference: how far its workers'
   * means scatter around 1 (a robust sd over the workers, which the mix of
   * classes on each worker widens beyond the noise of one mean) */
  double sd, m;
  if (worker_scatter(c, &sd, &m)) {
    if (c->sim || c->cur->n[FS_WORKER] >= 4) return;
    /* every one of the few: a slowed worker runs fewer tasks, and the top
     * worker by time against its classes' means may be the one that took
     * them over (its tasks the faster for it) */
    for (int o = 0; o < c->cur->n[FS_WORKER]; o++)
      if (bench_feat_read(c->cur, FS_WORKER, o)) few_workers_slow(c, o);
    return;
  }
  double z = (ratio - 1) / (sd + 0.003);
  /* one throttled worker stands out from the next slowest; when the next is as
   * slow, the cause is wider than a worker (its device, its layer) */
  if (c->cur->row[FS_BTOP][1].have && ratio > 1) {
    int w2 = (int)c->cur->row[FS_BTOP][1].n;
    if (w2 >= 0 && w2 != w && bench_feat_read(c->cur, FS_WORKER, w2)) {
      double u = (ratio - worker_task_ratio(c, w2)) / (ratio - 1);
      z *= u < 0.2 ? 0.2 : u > 1 ? 1 : u;
    }
  }
  c->busy = 1;
  add(c, -2, MS_CULPRIT_WORKER, w, z, "worker %d: its tasks ran %.2fx their classes' mean time, against its own "
      "reference (%.0f tasks; workers scatter by %.1f%%)", w, ratio, x->ratio_n, 100 * sd);
  c->busy = 0;
}

/* How much one task's time scatters around its class's mean, relative to it,
 * as the reference shows it: its workers' mean ratios scatter by sd (a robust
 * sd over the workers), each a mean of about m tasks, so one task by sd x
 * sqrt(m). 0.5 when the reference has too few workers to say. */
static double task_scatter(const struct fctx *c) {
  double sd, m;
  if (worker_scatter(c, &sd, &m)) return 0.5;
  sd *= sqrt(m);
  return sd < 0.02 ? 0.02 : sd > 0.5 ? 0.5 : sd;
}

/* The devices' means of section sec, in this run (mc) and the reference (mr):
 * their count, or 0 when a device has fewer than min_n samples on either side. */
static int device_means(const struct fctx *c, int sec, double min_n, double *mc, double *mr) {
  int D = c->cur->n[sec];
  if (D < 2 || D > BENCH_MAX_DEVICES) return 0;
  for (int d = 0; d < D; d++) {
    const struct bench_stat *x = &c->cur->row[sec][d], *r = &c->ref->row[sec][d];
    if (!x->have || x->n < min_n || r->n < min_n || !(x->sum > 0) || !(r->sum > 0)) return 0;
    mc[d] = x->sum / x->n;
    mr[d] = r->sum / r->n;
  }
  return D;
}

/* Device d's mean over the other devices' mean, in this run, over the same in
 * the reference: what moves every device alike (the run's drift, its shapes,
 * the mix of tasks) cancels. */
static double against_others(const double *mc, const double *mr, int D, int d) {
  double sc = 0, sr = 0;
  for (int i = 0; i < D; i++) sc += mc[i], sr += mr[i];
  return (mc[d] / ((sc - mc[d]) / (D - 1))) / (mr[d] / ((sr - mr[d]) / (D - 1)));
}

/* Open-ended: a device whose tasks (communication aside) ran slower against
 * their classes' means than the other devices' did, against the same in the
 * reference. Its mean's noise is the tasks' scatter (task_scatter) over its
 * tasks, in this run and the reference. */
static void hyp_device_busy(struct fctx *c) {
  double mc[BENCH_MAX_DEVICES], mr[BENCH_MAX_DEVICES];
  int D = device_means(c, FS_DEVBUSY, 8, mc, mr);
  if (!D) return;
  const double scatter = task_scatter(c);
  for (int d = 0; d < D; d++) {
    double ratio = against_others(mc, mr, D, d);
    double z = (ratio - 1) / (0.003 + scatter * sqrt(2 / c->cur->row[FS_DEVBUSY][d].n));
    c->busy = 1;
    add(c, -2, MS_CULPRIT_DEVICE, d, z, "device %d: its tasks ran %.3fx their classes' mean time against the other "
        "devices' (and the reference)", d, ratio);
    c->busy = 0;
  }
}

/* A device whose communication took longer against the other devices' in the
 * same run, against the same in the reference: the devices' shares of a
 * collective are alike, so the noise left is the times' own scatter (no
 * absolute floor: a simulated link's times do not scatter at all). */
static void hyp_comm_device(struct fctx *c) {
  double mc[BENCH_MAX_DEVICES], mr[BENCH_MAX_DEVICES];
  int D = device_means(c, FS_DEVICE, 2, mc, mr);
  for (int d = 0; d < D; d++) {
    const struct bench_stat *x = &c->cur->row[FS_DEVICE][d], *r = &c->ref->row[FS_DEVICE][d];
    double vx = fmax(0, x->sumsq / x->n - mc[d] * mc[d]), vr = fmax(0, r->sumsq / r->n - mr[d] * mr[d]);
    double rel = sqrt(vx / (x->n * mc[d] * mc[d]) + vr / (r->n * mr[d] * mr[d]));
    double ratio = against_others(mc, mr, D, d), z = (ratio - 1) / (0.01 + 2 * rel);
    add(c, MS_FAULT_COMM_DELAY, MS_CULPRIT_DEVICE, d, z,
        "communication of device %d: %.2fx the other devices' against the reference (%.0f samples)", d, ratio, x->n);
  }
}

/* Open-ended: a layer most of whose classes ran slower (the median of their
 * z-scores, above the other layers' median, combined over the layer's
 * classes); one slow class in a layer leaves the median at the noise. */
static void hyp_layer(struct fctx *c, const double *zc, int nz) {
  int L = c->p->model->cfg.n_layers;
  if (L < 2) return;
  int *layer_of = malloc(((size_t)nz + 1) * sizeof *layer_of);
  double *z = malloc(((size_t)nz + 1) * sizeof *z);
  if (!layer_of || !z) {
    free(layer_of);
    free(z);
    return;
  }
  for (int i = 0; i < nz; i++) {
    const struct ms_task_class *k = &c->p->classes[i];
    layer_of[i] = k->layer >= 0 && have(c, FS_CLASS, i) && k->kernel != MS_K_EMPTY && k->kernel != MS_K_COMM ? k->layer : -1;
  }
  for (int l = 0; l < L; l++) {
    /* the layer's classes, and (against them) the other layers' classes: a cause
     * as wide as the device or the run moves them all alike */
    int k = 0, o = 0;
    for (int i = 0; i < nz; i++)
      if (layer_of[i] == l) z[k++] = zc[i];
    if (k < 3) continue;
    sort_d(z, k);
    double med = z[k / 2];
    for (int i = 0; i < nz; i++)
      if (layer_of[i] >= 0 && layer_of[i] != l) z[o++] = zc[i];
    sort_d(z, o);
    double base = o ? z[o / 2] : 0;
    add(c, -2, MS_CULPRIT_LAYER, l, (med - (base > 0 ? base : 0)) * sqrt(k),
        "layer %d: the median of its %d classes' task times is %.1f sigma above the reference (other layers: %.1f)", l,
        k, med, base);
  }
  /* the same by the classes' ratios to the reference: a layer's median ratio
   * against the other layers' classes', whose scatter (a robust sd) is the
   * noise, narrowed by the root of the layer's classes; a layer a few per cent
   * slow moves each class by less than its own times scatter, and all alike */
  double *r = z;
  for (int l = 0; l < L; l++) {
    int k = 0, o = 0;
    for (int i = 0; i < nz; i++)
      if (layer_of[i] == l) {
        double ratio;
        z_mean(c, FS_CLASS, i, &ratio);
        r[k++] = ratio;
      }
    if (k < 3) continue;
    sort_d(r, k);
    double med = r[k / 2];
    for (int i = 0; i < nz; i++)
      if (layer_of[i] >= 0 && layer_of[i] != l) {
        double ratio;
        z_mean(c, FS_CLASS, i, &ratio);
        r[o++] = ratio;
      }
    if (o < 3) continue;
    sort_d(r, o);
    double base = r[o / 2];
    for (int i = 0; i < o; i++) r[i] = fabs(r[i] - base);
    sort_d(r, o);
    double sd = 1.4826 * r[o / 2];
    add(c, -2, MS_CULPRIT_LAYER, l, (med - base) / (1.25 * sd / sqrt(k) + 0.005),
        "layer %d: its %d classes ran %.3fx the reference (median), the other layers' %.3fx (scatter %.1f%%)", l, k,
        med, base, 100 * sd);
  }
  free(layer_of);
  free(z);
}

/* Open-ended: a request whose last attention task ended much later than the
 * other requests' (they all join the first step and run as many steps): one
 * step late is about z 25. */
static void hyp_late_request(struct fctx *c) {
  int n = c->cur->n[FS_REQUEST];
  double cmin = 1e300, rmin = 1e300, rmax = 0;
  for (int i = 0; i < n; i++) {
    const struct bench_stat *x = &c->cur->row[FS_REQUEST][i], *r = &c->ref->row[FS_REQUEST][i];
    if (x->have && x->n > 0 && x->last > 0 && x->last < cmin) cmin = x->last;
    if (r->n > 0 && r->last > 0 && r->last < rmin) rmin = r->last;
    if (r->n > 0 && r->last > rmax) rmax = r->last;
  }
  if (cmin >= 1e300 || rmin >= 1e300 || !(c->step_ns > 0)) return;
  for (int i = 0; i < n; i++) {
    const struct bench_stat *x = &c->cur->row[FS_REQUEST][i];
    if (!x->have || x->n <= 0 || !(x->last > 0)) continue;
    double late = x->last - cmin, ref_late = rmax - rmin;
    double z = (late - ref_late) / (0.04 * c->step_ns + c->floor_abs);
    c->late = 1;
    add(c, -2, MS_CULPRIT_REQUEST, i, z, "request slot %d: its last attention ended %.1f us after the first "
        "request's (reference: %.1f us at most)", i, late / 1e3, ref_late / 1e3);
    c->late = 0;
  }
}

/* Routing by counts (ABI v2 work_rows): an expert whose share of the routed
 * rows grew, whatever it cost in time. */
static void hyp_rows(struct fctx *c) {
  double tc = 0, tr = 0;
  for (int x = 0; x < c->cur->n[FS_EXPERT]; x++) {
    if (!have(c, FS_EXPERT, x)) return;
    tc += c->cur->row[FS_EXPERT][x].work;
    tr += c->ref->row[FS_EXPERT][x].work;
  }
  if (!(tc > 0) || !(tr > 0)) return;
  for (int x = 0; x < c->cur->n[FS_EXPERT]; x++) {
    double sc = c->cur->row[FS_EXPERT][x].work / tc, sr = c->ref->row[FS_EXPERT][x].work / tr;
    /* the simulator routes by a fixed spread, the same in every run of a
     * configuration; a real router's choices differ with the tokens (binomial) */
    double sd = c->sim ? 0.01 * sr + 1e-3 : 0.05 * sr + sqrt(sr * (1 - sr) / tc) + 1e-3;
    double z = (sc - sr) / sd;
    add(c, MS_FAULT_ROUTING_SKEW, MS_CULPRIT_EXPERT, x, z,
        "expert %d: %.1f%% of the routed rows, reference %.1f%% (z %.1f)", x, 100 * sc, 100 * sr, z);
  }
}

/* The worker whose tasks queue longest in all (ready -> begin, summed): a
 * saturated queue holds back everything placed on it. Measured against its
 * peers in the same run (a loaded machine delays every worker), and that ratio
 * against the reference's worst worker's. */
static void hyp_worker(struct fctx *c) {
  int top = -1;
  if (c->cur->lazy) {
    if (c->cur->row[FS_WTOP][0].have) top = (int)c->cur->row[FS_WTOP][0].n;
  } else {
    double best = -1;
    for (int w = 0; w < c->cur->n[FS_WORKER]; w++)
      if (c->cur->row[FS_WORKER][w].have && c->cur->row[FS_WORKER][w].sum > best)
        best = c->cur->row[FS_WORKER][w].sum, top = w;
  }
  if (top < 0 || top >= c->cur->n[FS_WORKER] || !c->cur->row[FS_WORKER][top].have || c->cur->row[FS_WORKER][top].n <= 0)
    return;
  double s = 0, m = 0;
  int n = 0;
  for (int w = 0; w < c->ref->n[FS_WORKER]; w++) {
    const struct bench_stat *r = &c->ref->row[FS_WORKER][w];
    if (r->n <= 0) continue;
    s += r->sum;
    if (r->sum > m) m = r->sum;
    n++;
  }
  /* the run's queueing in all: its kernels' rows (every task is in one) */
  double total = 0;
  for (int k = 0; k < c->cur->n[FS_OP]; k++)
    if (c->cur->row[FS_OP][k].have) total += c->cur->row[FS_OP][k].qsum;
  const struct bench_stat *me = &c->cur->row[FS_WORKER][top];
  int W = c->cur->n[FS_WORKER];
  double tasks = 0;
  for (int k = 0; k < c->cur->n[FS_OP]; k++)
    if (c->cur->row[FS_OP][k].have) tasks += c->cur->row[FS_OP][k].n;
  /* a ratio of a few samples says nothing: enough tasks of the worker and of its peers */
  if (n < 2 || W < 2 || total <= me->sum || me->n < 8 || tasks < 2.0 * W) return;
  double peers = (total - me->sum) / (W - 1), ref_peers = (s - m) / (n - 1);
  double r_cur = me->sum / (peers + c->floor_abs), r_ref = m / (ref_peers + c->floor_abs);
  /* the worst of many workers that hold a few tasks each is as noisy as a few
   * queues: past the 10% of a well-sampled ratio, 1 / sqrt(tasks a worker) */
  double few = 1 / sqrt(tasks / W) - 0.1;
  double z = (r_cur - r_ref) / (0.1 * r_ref + 0.05 + r_ref * (few > 0 ? few : 0));
  /* a saturated queue moves work onto the worker; it does not make the work
   * slower. A worker whose tasks are slower too is something else. */
  double slow = worker_task_ratio(c, top);
  int cause = slow > 1.05 ? -2 : MS_FAULT_QUEUE_SATURATION;
  c->queueing = 1;
  add(c, cause, MS_CULPRIT_WORKER, top, z,
      "worker %d: its tasks queued %.1fx as long as its peers' (%.1f us in all; reference: the worst worker %.1fx; "
      "%.1f tasks a worker)%s",
      top, r_cur, me->sum / 1e3, r_ref, tasks / W, cause == -2 ? "; its tasks also ran slower" : "");
  c->queueing = 0;
  /* a saturated queue holds the tasks moved onto it: the worker ran more tasks
   * than its share of the reference's (AOT tasks are placed by the plan; its
   * JIT share moves by 1% and a fraction of the root of its count) */
  const struct bench_stat *mr = &c->ref->row[FS_WORKER][top];
  double ref_tasks = 0;
  for (int k = 0; k < c->ref->n[FS_OP]; k++) ref_tasks += c->ref->row[FS_OP][k].n;
  if (mr->n > 0 && ref_tasks > 0) {
    double want = mr->n * tasks / ref_tasks;  /* its share of the reference's tasks, of this run's */
    double zc = (me->n - want) / (0.25 * sqrt(want) + 0.01 * want + 1);
    add(c, cause, MS_CULPRIT_WORKER, top, zc, "worker %d: it ran %.0f tasks, %.0f at its share in the reference%s", top,
        me->n, want, cause == -2 ? "; its tasks also ran slower" : "");
  }
}

/* Open-ended, real clocks: a worker whose thread waited for its CPU (runnable,
 * not running: another thread had it) a larger share of its time than the other
 * workers did, against the same in the reference; the OS's own view of the
 * workers (ms_engine_worker_os). OS_WAIT_NOISE of the time nominal noise, sized
 * by what this statistic alone reaches between healthy runs (its own family:
 * bench_diagnose_null). */
#define OS_WAIT_NOISE 0.005
static void hyp_os_worker(struct fctx *c) {
  int W = c->cur->n[FS_OSWORKER];
  double sc[BENCH_MAX_OS_WORKERS], sr[BENCH_MAX_OS_WORKERS];
  if (W < 2 || W > BENCH_MAX_OS_WORKERS) return;
  for (int w = 0; w < W; w++) {
    const struct bench_stat *x = &c->cur->row[FS_OSWORKER][w], *r = &c->ref->row[FS_OSWORKER][w];
    if (!bench_feat_read(c->cur, FS_OSWORKER, w) || !x->have || r->n <= 0) return;
    double tx = x->sum + x->ratio, tr = r->sum + r->ratio;
    if (!(tx > 0) || !(tr > 0)) return;
    sc[w] = x->sum / tx;
    sr[w] = r->sum / tr;
  }
  for (int w = 0; w < W; w++) {
    double oc = 0, orf = 0;
    for (int o = 0; o < W; o++)
      if (o != w) oc += sc[o], orf += sr[o];
    oc /= W - 1;
    orf /= W - 1;
    /* the reference's own difference is taken out when this worker waited
     * more there too (a service thread on its CPU); a reference whose other
     * workers waited more was disturbed, and says nothing of this one */
    double d = (sc[w] - oc) - fmax(0, sr[w] - orf);
    c->stat = FAM_OS;
    add(c, -2, MS_CULPRIT_WORKER, w, d / OS_WAIT_NOISE, "worker %d: its thread waited for its CPU %.1f%% of the run "
        "(the others %.1f%%; reference %.1f%% and %.1f%%; preempted %.0f times)", w, 100 * sc[w], 100 * oc,
        100 * sr[w], 100 * orf, c->cur->row[FS_OSWORKER][w].max);
    c->stat = FAM_ANY;
  }
}

/* The median of cur / ref mean task time over the classes seen enough on both
 * sides, and (spread) the median distance of those ratios from it: how much a
 * healthy-looking class disagrees with the reference, i.e. the evidence's noise. */
static double drift_of(const struct fctx *c, double *spread) {
  double r[1024];
  int n = 0;
  for (int i = 0; i < c->cur->n[FS_CLASS] && n < 1024; i++) {
    const struct bench_stat *x = &c->cur->row[FS_CLASS][i], *y = &c->ref->row[FS_CLASS][i];
    if (x->have && x->n >= 3 && y->n >= 3 && y->sum > 0) r[n++] = mean_of(c, x) / mean_of(c, y);
  }
  *spread = 1;  /* too few classes to know: as noisy as can be */
  if (n < 5) return 1;
  sort_d(r, n);
  double med = r[n / 2] > 0 ? r[n / 2] : 1;
  for (int i = 0; i < n; i++) r[i] = fabs(r[i] - med);
  sort_d(r, n);
  *spread = r[n / 2];
  return med;
}

/* The median cur / ref ratio of the classes that stream a layer's weights
 * (qkv, wo, gate/up, down) on real clocks; 0 when fewer than 3 say. */
static double stream_drift(const struct fctx *c) {
  double r[1024];
  int n = 0;
  for (int i = 0; !c->sim && i < c->cur->n[FS_CLASS] && n < 1024; i++) {
    int k = c->p->classes[i].kernel;
    const struct bench_stat *x = &c->cur->row[FS_CLASS][i], *y = &c->ref->row[FS_CLASS][i];
    if ((k == MS_K_QKV || k == MS_K_WO || k == MS_K_SWIGLU || k == MS_K_DOWN) && x->have && x->n >= 3 && y->n >= 3 &&
        y->sum > 0)
      r[n++] = mean_of(c, x) / mean_of(c, y);
  }
  sort_d(r, n);
  return n >= 3 ? r[n / 2] : 0;
}

static void collect(struct fctx *c) {
  c->n = 0;
  c->drift = drift_of(c, &c->spread);
  /* the simulator's clock is virtual: nothing slows every class at once but a
   * fault, which the median would then absorb (half the classes of a two-layer
   * model for a slow layer) */
  if (c->sim) c->drift = 1;
  for (int k = 0; k < MS_K_COUNT; k++) {
    double r[256];
    int n = 0;
    for (int i = 0; !c->sim && i < c->cur->n[FS_CLASS] && n < 256; i++) {
      const struct bench_stat *x = &c->cur->row[FS_CLASS][i], *y = &c->ref->row[FS_CLASS][i];
      if (c->p->classes[i].kernel == k && x->have && x->n >= 3 && y->n >= 3 && y->sum > 0)
        r[n++] = mean_of(c, x) / mean_of(c, y);
    }
    sort_d(r, n);
    c->op_drift[k] = n >= 3 ? r[n / 2] : 0;
  }
  c->stream_drift = stream_drift(c);
  int nz = c->cur->n[FS_CLASS];
  double *zc = calloc((size_t)nz + 1, sizeof *zc);
  for (int i = 0; zc && i < nz; i++) {
    double ratio;
    if (have(c, FS_CLASS, i)) zc[i] = z_mean(c, FS_CLASS, i, &ratio);
  }
  int broad = 0;  /* classes standing out */
  for (int i = 0; zc && i < nz; i++) broad += have(c, FS_CLASS, i) && zc[i] > Z_MIN;
  if (zc) hyp_layer(c, zc, nz);
  free(zc);
  hyp_slow_worker(c);
  hyp_os_worker(c);
  hyp_device_busy(c);
  hyp_late_request(c);
  hyp_rows(c);
  hyp_time(c, FS_CLASS, MS_FAULT_SLOW_CLASS, MS_CULPRIT_TASK_CLASS, "class", broad);
  hyp_time(c, FS_REQUEST, MS_FAULT_SLOW_REQUEST, MS_CULPRIT_REQUEST, "attention of", 0);
  hyp_time(c, FS_EXPERT, MS_FAULT_ROUTING_SKEW, MS_CULPRIT_EXPERT, "tasks of", 0);
  hyp_time(c, FS_DEVICE, MS_FAULT_COMM_DELAY, MS_CULPRIT_DEVICE, "communication of", 0);
  hyp_comm_device(c);
  hyp_time(c, FS_EVCLASS, MS_FAULT_DELAYED_RELEASE, MS_CULPRIT_EVENT_CLASS, "event class", 0);
  hyp_starve(c);
  hyp_worker(c);
  hyp_aot_share(c);
  hyp_ops(c);
}

static int by_z(const void *a, const void *b) {
  const struct hyp *x = a, *y = b;
  return (x->z < y->z) - (x->z > y->z);
}

/* The semantic read-out: the cheap rows first, in this order, while the budget lasts. */
static void read_triage(struct bench_features *f, const struct ms_plan *p) {
  int kernels[MS_K_COUNT] = {0};
  for (int c = 0; c < p->n_classes; c++) kernels[p->classes[c].kernel] = 1;
  bench_feat_read(f, FS_WTOP, 0);
  bench_feat_read(f, FS_WTOP, 1);
  if (f->row[FS_WTOP][0].have) bench_feat_read(f, FS_WORKER, (int)f->row[FS_WTOP][0].n);
  bench_feat_read(f, FS_BTOP, 0);
  bench_feat_read(f, FS_BTOP, 1);
  if (f->row[FS_BTOP][0].have) bench_feat_read(f, FS_WORKER, (int)f->row[FS_BTOP][0].n);
  if (f->row[FS_BTOP][1].have) bench_feat_read(f, FS_WORKER, (int)f->row[FS_BTOP][1].n);
  for (int w = 0; w < f->n[FS_OSWORKER] && f->row[FS_OSWORKER][w].n > 0; w++) bench_feat_read(f, FS_OSWORKER, w);
  /* a CPU server's few workers, kernel by kernel (few_workers_slow) */
  for (int w = 0; f->n[FS_WORKER] < 4 && (w + 1) * MS_K_COUNT <= f->n[FS_WOP]; w++)
    for (int k = 0; k < MS_K_COUNT; k++)
      if (kernels[k] && k != MS_K_COMM && k != MS_K_EMPTY) bench_feat_read(f, FS_WOP, w * MS_K_COUNT + k);
  for (int d = 0; d < f->n[FS_DEVICE] && f->n[FS_DEVICE] > 1; d++) bench_feat_read(f, FS_DEVICE, d);
  for (int d = 0; d < f->n[FS_DEVBUSY] && f->n[FS_DEVBUSY] > 1; d++) bench_feat_read(f, FS_DEVBUSY, d);
  for (int k = 0; k < MS_K_COUNT; k++)
    if (kernels[k]) bench_feat_read(f, FS_OP, k);
  for (int e = 0; e < p->n_ev_classes; e++) bench_feat_read(f, FS_EVCLASS, e);
  for (int x = 0; x < f->n[FS_EXPERT]; x++) bench_feat_read(f, FS_EXPERT, x);
  for (int r = 0; r < f->n[FS_REQUEST]; r++) bench_feat_read(f, FS_REQUEST, r);
  /* singleton kernels' classes (embed, lm_head, ...) are named by their kernel row */
  for (int c = 0; c < p->n_classes; c++) {
    int only;
    if (kernel_classes(p, p->classes[c].kernel, &only) == 1) bench_feat_read(f, FS_CLASS, c);
  }
}

/* The second look: class rows, kernel by kernel in the order the first look
 * ranks the kernels (the one the best hypothesis names first), while the budget
 * lasts. */
static void read_focus(struct bench_features *f, const struct ms_plan *p, const struct hyp *h, int n) {
  int done[MS_K_COUNT] = {0};
  for (int i = 0; i <= n; i++) {
    for (int k = 0; k < MS_K_COUNT; k++) {
      char tag[48];
      snprintf(tag, sizeof tag, "kernel %s:", ms_kernel_name(k));
      if (done[k] || (i < n && strncmp(h[i].why, tag, strlen(tag)))) continue;
      done[k] = 1;  /* i == n: the kernels no hypothesis named, last */
      for (int c = 0; c < p->n_classes; c++)
        if (p->classes[c].kernel == k) bench_feat_read(f, FS_CLASS, c);
    }
  }
}

/* A healthy reference read as if it were a run under diagnosis: every row it
 * holds is there (a semantic reference's rows are marked unread when copied). */
static void as_run(struct bench_features *f) {
  f->lazy = 0;
  for (int s = 0; s < FS_COUNT; s++)
    for (int i = 0; i < f->n[s]; i++) {
      struct bench_stat *r = &f->row[s][i];
      r->have = s == FS_WTOP || s == FS_BTOP ? r->sum > 0 : r->n > 0;
    }
}

/* MEGASCOPE_DIAG_TRACE=METHOD (a method's name, as the report spells it):
 * every hypothesis of that method's diagnoses on stderr, strongest first, with
 * the null's scale of its family; for trying rules on records (--replay). */
/* The trace also prints how much longer the observed run took than its healthy
 * one, and the most two cached healthy runs (alt against null_ref) differ by:
 * not judged by, since one observed run's time moves by up to 25% between
 * healthy runs on a shared machine, more than the faults the rules miss. */
static void trace_hyps(const struct fctx *c, const struct bench_evidence *ev, const struct bench_evidence *ref,
                       const struct bench_evidence *null_ref, const struct bench_evidence *const *alt, int n_alt,
                       const struct bench_scenario *sc, const double *scale) {
  const char *want = getenv("MEGASCOPE_DIAG_TRACE");
  if (!want || strcmp(want, bench_method_name(ev->method))) return;
  double run = ev->run_ns && ref->run_ns ? (double)ev->run_ns / ref->run_ns - 1 : 0, apart = 0;
  for (int k = 0; k < n_alt && null_ref->run_ns; k++)
    apart = fmax(apart, fabs((double)alt[k]->run_ns / null_ref->run_ns - 1));
  fprintf(stderr, "-- %s %s budget %llu: drift %.3f spread %.3f run %+.4f (healthy runs apart %.4f)\n", sc->name,
          want, (unsigned long long)ev->budget, c->drift, c->spread, run, apart);
  for (int i = 0; i < c->n && i < 12; i++) {
    const struct hyp *h = &c->h[i];
    fprintf(stderr, "   z %6.2f (scale %.2f) cause %d kind %d id %d: %s\n", h->z,
            c->scale ? scale[fam_of(h->cause, h->kind, h->id, h->stat)] : 1.0, h->cause, h->kind, h->id, h->why);
  }
}

/* The null: for every hypothesis family, the largest z it reaches between
 * healthy runs (each alt against ref); each family's z is then scaled so that
 * this stays at half the threshold. Families quiet between healthy runs keep 1. */
static void null_scales(struct fctx *base, const struct bench_evidence *const *alt, int n_alt, double *scale) {
  double top[N_FAM] = {0};
  for (int k = 0; k < n_alt; k++) {
    if (!alt[k]->feat) continue;
    struct bench_features *f = alt[k]->feat;
    as_run(f);
    struct fctx c = *base;
    c.cur = f;
    c.scale = NULL;
    c.step_ns = base->step_ns;
    collect(&c);
    for (int i = 0; i < c.n; i++) {
      int fam = fam_of(c.h[i].cause, c.h[i].kind, c.h[i].id, c.h[i].stat);
      if (c.h[i].z > top[fam]) top[fam] = c.h[i].z;
    }
  }
  for (int i = 0; i < N_FAM; i++) scale[i] = top[i] > Z_MIN / 2 ? Z_MIN / 2 / top[i] : 1;
}

/* Whether culprit x is a consequence of culprit a, or the same finding: the same
 * scope; a request and the attention classes it slows; a device and the
 * communication classes its collectives are; a worker and its device. A class
 * and its layer are judged apart (in_named_layer). */
static int explains(const struct ms_plan *p, int per_device, const struct hyp *a, const struct hyp *x) {
  if (a->kind == x->kind && a->id == x->id) return 1;
  const struct hyp *cl = a->kind == MS_CULPRIT_TASK_CLASS ? a : x->kind == MS_CULPRIT_TASK_CLASS ? x : NULL;
  const struct hyp *other = cl == a ? x : a;
  if (cl && cl->id >= 0 && cl->id < p->n_classes) {
    const struct ms_task_class *k = &p->classes[cl->id];
    if (other->kind == MS_CULPRIT_REQUEST && k->kernel == MS_K_ATTN) return 1;
    /* the requests decide which rows the head computes (a prompt chunk's rows
     * but its last skip it): a long or late request moves the head's tasks */
    if (other->kind == MS_CULPRIT_REQUEST && k->kernel == MS_K_LM_HEAD) return 1;
    if (other->kind == MS_CULPRIT_DEVICE && k->kernel == MS_K_COMM) return 1;  /* its collective's class */
  }
  const struct hyp *w = a->kind == MS_CULPRIT_WORKER ? a : x->kind == MS_CULPRIT_WORKER ? x : NULL;
  const struct hyp *dv = a->kind == MS_CULPRIT_DEVICE ? a : x->kind == MS_CULPRIT_DEVICE ? x : NULL;
  if (w && dv && per_device > 0 && w->id / per_device == dv->id) return 1;
  /* a request admitted late changes the batch over the run (steps without
   * it, then steps with it alone): what is judged by the mix of the run's work
   * moves with it, a device's or worker's tasks against their classes' running
   * means (device 0, which runs the step's unsplit tasks, stood 1.045x against
   * the other devices for that alone) and the experts' shares of the routed
   * rows (heldout-8: four of five late admissions named with a device, a
   * worker or an expert beside the request) */
  const struct hyp *lr = a->late ? a : x->late ? x : NULL, *o = lr == a ? x : a;
  if (lr && (o->busy || o->kind == MS_CULPRIT_EXPERT)) return 1;
  return 0;
}

/* The excess, in tasks (each task's time over its class's mean, less 1, summed),
 * that culprit h's own tasks carry beyond the reference: an expert's tasks
 * against the expert kernels' mean time, a request's attention against the
 * attention kernel's. Whichever devices and workers ran those tasks carry it
 * in their tasks against their classes' means. 0: none known. */
static double culprit_excess(const struct fctx *c, const struct hyp *h) {
  int sec, ks[2], nk;
  if (h->kind == MS_CULPRIT_EXPERT) sec = FS_EXPERT, ks[0] = MS_K_EXPERT_UP, ks[1] = MS_K_EXPERT_DOWN, nk = 2;
  else if (h->kind == MS_CULPRIT_REQUEST) sec = FS_REQUEST, ks[0] = MS_K_ATTN, nk = 1;
  else return 0;
  if (!have(c, sec, h->id)) return 0;
  double cn = 0, cs = 0, rn = 0, rs = 0;
  for (int j = 0; j < nk; j++) {
    if (!have(c, FS_OP, ks[j])) continue;
    cn += c->cur->row[FS_OP][ks[j]].n, cs += c->cur->row[FS_OP][ks[j]].sum;
    rn += c->ref->row[FS_OP][ks[j]].n, rs += c->ref->row[FS_OP][ks[j]].sum;
  }
  const struct bench_stat *x = &c->cur->row[sec][h->id], *r = &c->ref->row[sec][h->id];
  if (!(cs > 0) || !(rs > 0) || !(r->sum > 0)) return 0;
  double e = x->n * (x->sum / x->n / (cs / cn) - r->sum / r->n / (rs / rn));
  return e > 0 ? e : 0;
}

/* A device's or worker's hypothesis by its tasks against their classes' means
 * (h->busy), once `excess` tasks' worth (culprit_excess of the culprits named
 * beside it) is taken out of its tasks: its z, scaled by what is left of its
 * ratio's excess over 1. Where the culprit's tasks ran is not known: all of
 * them on this device or worker is the most they can explain. Else h->z. */
static double busy_left(const struct fctx *c, const struct hyp *h, double excess) {
  if (!h->busy || !(excess > 0)) return h->z;
  double before = 1, after = 1;
  if (h->kind == MS_CULPRIT_DEVICE) {
    double mc[BENCH_MAX_DEVICES], mr[BENCH_MAX_DEVICES];
    int D = device_means(c, FS_DEVBUSY, 8, mc, mr);
    if (h->id < 0 || h->id >= D) return h->z;
    const struct bench_stat *x = &c->cur->row[FS_DEVBUSY][h->id];
    before = against_others(mc, mr, D, h->id);
    mc[h->id] = fmax(0, x->sum - excess) / x->n;
    after = against_others(mc, mr, D, h->id);
  } else if (h->kind == MS_CULPRIT_WORKER && h->id >= 0 && h->id < c->cur->n[FS_WORKER]) {
    const struct bench_stat *x = &c->cur->row[FS_WORKER][h->id];
    before = worker_task_ratio(c, h->id);
    if (!(x->ratio > 0)) return h->z;
    after = before * fmax(0, x->ratio - excess) / x->ratio;
  }
  if (!(before > 1)) return h->z;
  return h->z * clamp01((after - 1) / (before - 1));
}

/* What of busy hypothesis h is left beside the culprits out[0..k) that are
 * not themselves devices or workers judged that way (h itself aside). */
static double left_beside(const struct fctx *c, const struct hyp *h, const struct hyp *all, const int *out, int k) {
  double e = 0;
  for (int j = 0; c && h->busy && j < k; j++)
    if (&all[out[j]] != h && !all[out[j]].busy) e += culprit_excess(c, &all[out[j]]);
  return c ? busy_left(c, h, e) : h->z;
}

/* Whether h is a class in a layer one of out[0..k) names. */
static int in_named_layer(const struct ms_plan *p, const struct hyp *h, const struct hyp *all, const int *out, int k) {
  if (h->kind != MS_CULPRIT_TASK_CLASS || h->id < 0 || h->id >= p->n_classes) return 0;
  for (int j = 0; j < k; j++)
    if (all[out[j]].kind == MS_CULPRIT_LAYER && all[out[j]].id == p->classes[h->id].layer) return 1;
  return 0;
}

/* The culprits an answer names: the strongest hypothesis, then every other one
 * above the threshold that names a scope of its own, not a consequence of one
 * already named (several faults at once). A layer and a class in it are both
 * named when each stands out on its own: the layer by the median of its
 * classes (which one slow class does not move), the class by its excess
 * beyond its layer's factor; a class whose excess the layer's factor explains
 * is the layer seen through one class, and is dropped. Their count; h sorted
 * by z. */
static int pick_culprits(const struct fctx *c, const struct ms_plan *p, int per_device, int real, const struct hyp *h,
                         int n, int *out) {
  int k = 0;
  if (!n || h[0].z < Z_MIN) return 0;
  out[k++] = 0;
  /* real clocks: a task that ran slower makes the tasks behind it wait, so
   * queueing names the culprit only when nothing ran slower or worked more */
  if (real && h[0].queue)
    for (int i = 1; i < n && h[i].z >= Z_MIN; i++)
      if (!h[i].queue) {
        out[0] = i;
        break;
      }
  /* a finding that names no culprit (a kernel) is not added to */
  const struct hyp *first = &h[out[0]];
  for (int i = 1; i < n && k < BENCH_MAX_CULPRITS && first->id >= 0; i++) {
    if (h[i].z < MULTI_Z * Z_MIN || h[i].z < MULTI_REL * first->z) break;
    /* queueing alone is what any culprit makes the tasks behind it do: never a
     * further one, but for one starved task (one class's longest queue; the
     * simulator's clock: nothing else makes one task wait) */
    int starved = !real && h[i].cause == MS_FAULT_STARVE_TASK && h[i].kind == MS_CULPRIT_TASK_CLASS;
    if (h[i].id < 0 || i == out[0] || (h[i].queue && !starved)) continue;
    if (h[i].kind == MS_CULPRIT_WORKER && h[i].z < MULTI_REL_WORKER * first->z) continue;
    /* two culprits of one kind read as one wider cause: the stronger is named */
    int related = 0;
    for (int j = 0; j < k && !related; j++)
      related = h[out[j]].kind == h[i].kind || explains(p, per_device, &h[out[j]], &h[i]);
    if (!related && in_named_layer(p, &h[i], h, out, k))
      related = h[i].zin < MULTI_Z * Z_MIN || h[i].zin < MULTI_REL * first->z;
    if (!related) out[k++] = i;
  }
  /* a class named before its layer: kept only if it stands out beyond it */
  int m = 0;
  for (int j = 0; j < k; j++)
    if (k == 1 || !in_named_layer(p, &h[out[j]], h, out, k) || h[out[j]].zin >= MULTI_Z * Z_MIN) out[m++] = out[j];
  /* a device or a worker beside a culprit whose tasks it may have run (an
   * expert's, a request's attention): named only if what is left of its
   * excess, without that culprit's, still stands out by the same rule */
  k = m, m = 0;
  for (int j = 0; j < k; j++) {
    const struct hyp *x = &h[out[j]];
    double top = 0;
    for (int i = 0; i < k; i++)
      if (i != j && !h[out[i]].busy && h[out[i]].z > top) top = h[out[i]].z;
    double left = left_beside(c, x, h, out, k);
    double rel = x->kind == MS_CULPRIT_WORKER ? MULTI_REL_WORKER : MULTI_REL;
    if (!x->busy || !(top > 0) || (left >= MULTI_Z * Z_MIN && left >= rel * top)) out[m++] = out[j];
  }
  return m;
}

/* The workers and devices at half the threshold or more (c->h sorted by z),
 * each once, the strongest first: the few scopes a second judgement may agree
 * on below the threshold (bench_answer_agree). */
static void near_scopes(const struct fctx *c, const struct ms_plan *p, struct bench_near *near) {
  near->n = 0;
  for (int i = 0; i < c->n && near->n < BENCH_NEAR && c->h[i].z >= Z_MIN / 2; i++) {
    const struct hyp *x = &c->h[i];
    if ((x->kind != MS_CULPRIT_WORKER && x->kind != MS_CULPRIT_DEVICE) || x->id < 0) continue;
    int seen = 0;
    for (int j = 0; j < near->n; j++) seen |= near->scope[j].kind == x->kind && near->scope[j].id == x->id;
    if (seen) continue;
    struct bench_culprit *m = &near->scope[near->n];
    *m = (struct bench_culprit){.cause = x->cause, .kind = x->kind, .id = x->id};
    bench_culprit_name(p, x->kind, x->id, m->name, sizeof m->name);
    near->z[near->n++] = x->z;
  }
}

static void diagnose_features(const struct bench_evidence *ref, const struct bench_evidence *null_ref,
                              const struct bench_evidence *const *alt, int n_alt, struct bench_evidence *ev,
                              const struct ms_plan *p, const struct bench_scenario *sc, struct bench_answer *a,
                              struct bench_near *near) {
  struct bench_features *f = ev->feat;
  a->coverage = ev->coverage;
  if (!f || !ref->feat) {
    a->bytes = ev->bytes;
    answer_none(a, 0, "no evidence within the budget");
    return;
  }
  const int sim = ms_backend_info(sc->backend)->virtual_clock;
  struct fctx c = {.ref = ref->feat, .cur = f, .p = p, .floor_abs = sim ? 50 : 3000,
                   .step_ns = sc->steps > 0 ? (double)ev->run_ns / sc->steps : 0,
                   .sim = sim, .steps = sc->steps, .whole = ev->coverage >= 0.999,
                   .h = calloc(MAX_HYP, sizeof *c.h)};
  double scale[N_FAM];
  if (!c.h) {
    answer_none(a, 0, "out of memory");
    return;
  }
  if (n_alt > 0 && null_ref->feat) {
    c.ref = null_ref->feat;  /* the null: the healthy runs against their own reference */
    null_scales(&c, alt, n_alt, scale);
    c.ref = ref->feat;
    c.cur = f;
    c.scale = scale;
  }
  double read_share = 1;
  if (f->lazy) {
    uint64_t bytes = ev->bytes;
    for (int s = 0; s < FS_COUNT; s++)
      for (int i = 0; i < f->n[s]; i++) f->row[s][i].have = 0;
    f->budget = ev->budget ? ev->budget : UINT64_MAX;
    f->bytes = &bytes;
    read_triage(f, p);
    collect(&c);
    qsort(c.h, (size_t)c.n, sizeof *c.h, by_z);
    read_focus(f, p, c.h, c.n);
    a->bytes = bytes;
    /* what it read of what a full read-out would have read */
    int want = 0, got = 0;
    for (int s = 0; s < FS_COUNT; s++)
      for (int i = 0; i < f->n[s] && s != FS_WORKER; i++)  /* the top workers stand for them */
        if (ref->feat->row[s][i].n > 0) {
          want++;
          got += f->row[s][i].have;
        }
    read_share = want ? (double)got / want : 0;
  } else {
    a->bytes = ev->bytes;
  }
  collect(&c);
  qsort(c.h, (size_t)c.n, sizeof *c.h, by_z);
  trace_hyps(&c, ev, ref, null_ref, alt, n_alt, sc, scale);
  if (!c.sim && near) near_scopes(&c, p, near);
  double z1 = c.n ? c.h[0].z : 0;
  int picked[BENCH_MAX_CULPRITS], np = pick_culprits(&c, p, f->per_device, !c.sim, c.h, c.n, picked);
  if (!np) {
    char why[160];
    snprintf(why, sizeof why, "nothing stands out (best: %.130s)", c.n ? c.h[0].why : "no comparable rows");
    /* absence of evidence is only as strong as the evidence is quiet: a class
     * ratio scattering by 20% hides a fault of a few per cent of the run */
    answer_none(a, ev->coverage * read_share * (1 - z1 / Z_MIN) * clamp01(1 - 5 * c.spread), why);
  } else {
    /* the runner-up: the best hypothesis not named that names something else (a
     * kernel-level one of the same cause is the same finding, seen coarser) */
    const struct hyp *last = &c.h[picked[np - 1]], *rival = NULL;
    double z2 = 0;
    for (int i = 0; i < c.n; i++) {
      /* real clocks: the queueing behind a culprit that ran slower is its consequence, not a rival */
      if (!c.sim && c.h[i].queue && !c.h[picked[0]].queue) continue;
      int chosen = 0, other_scope = c.h[i].id >= 0, other_cause = 0;
      for (int j = 0; j < np; j++) {
        const struct hyp *w = &c.h[picked[j]], *x = &c.h[i];
        chosen |= i == picked[j];
        /* the same scope, or a consequence of a culprit named (its layer's
         * classes that do not stand out beyond it) */
        if ((x->kind == w->kind && x->id == w->id) || explains(p, f->per_device, w, x)) other_scope = 0;
        other_cause |= x->kind == w->kind && x->id == w->id && x->cause != w->cause && x->cause >= 0 && w->cause >= 0;
      }
      if (in_named_layer(p, &c.h[i], c.h, picked, np) && c.h[i].zin < MULTI_Z * Z_MIN) other_scope = 0;
      /* a device or worker whose excess the named culprits' tasks explain */
      if (c.h[i].busy && left_beside(&c, &c.h[i], c.h, picked, np) < MULTI_Z * Z_MIN) other_scope = 0;
      if (!chosen && (other_scope || other_cause)) {
        z2 = c.h[i].z;
        rival = &c.h[i];
        break;
      }
    }
    double zl = last->z;
    /* a rival that stands above the threshold itself and is not named (another
     * fault, or one the rules read as a consequence): half as sure */
    double doubt = rival && z2 >= Z_MIN && !rival->queue ? 0.5 : 1;
    answer_hyp(a, &c.h[picked[0]], doubt * (1 - z2 / zl) * clamp01(zl / (2 * Z_MIN)), p);
    for (int j = 1; j < np; j++) {
      const struct hyp *x = &c.h[picked[j]];
      struct bench_culprit *m = &a->more[a->n_more++];
      *m = (struct bench_culprit){.cause = x->cause, .kind = x->kind, .id = x->id};
      bench_culprit_name(p, x->kind, x->id, m->name, sizeof m->name);
      size_t len = strlen(a->name);
      snprintf(a->name + len, sizeof a->name - len, " + %s", m->name);
    }
  }
  free(c.h);
}

const char *bench_cause_name(int c) {
  if (c == -1) return "none";
  if (c == -2) return "unknown";
  if (c >= BENCH_CAUSE_INTERFERE) return bench_interference_name(c - BENCH_CAUSE_INTERFERE);
  return ms_fault_type_name((enum ms_fault_type)c);
}

void bench_diagnose_null(const struct bench_evidence *ref, const struct bench_evidence *null_ref,
                         const struct bench_evidence *const *alt, int n_alt, struct bench_evidence *ev,
                         const struct ms_plan *p, const struct bench_scenario *sc, struct bench_answer *out) {
  bench_diagnose_near(ref, null_ref, alt, n_alt, ev, p, sc, out, NULL);
}

void bench_diagnose_near(const struct bench_evidence *ref, const struct bench_evidence *null_ref,
                         const struct bench_evidence *const *alt, int n_alt, struct bench_evidence *ev,
                         const struct ms_plan *p, const struct bench_scenario *sc, struct bench_answer *out,
                         struct bench_near *near) {
  memset(out, 0, sizeof *out);
  if (near) near->n = 0;
  if (!null_ref) null_ref = ref;
  switch (ev->method) {
  case BM_KERNEL_TIMING: diagnose_timing(ref, null_ref, alt, n_alt, ev, sc, out); break;
  case BM_PC_SAMPLING: diagnose_pc(ref, null_ref, alt, n_alt, ev, p, sc, out); break;
  default: diagnose_features(ref, null_ref, alt, n_alt, ev, p, sc, out, near); break;
  }
}

/* Culprit i of an answer (0: the first, then more[]), as (cause, kind, id). */
static struct bench_culprit culprit_at(const struct bench_answer *a, int i) {
  if (i == 0) return (struct bench_culprit){.cause = a->cause, .kind = a->kind, .id = a->id};
  return a->more[i - 1];
}

/* Whether x and y are one scope: the same kind and id (a device and its one
 * worker, per_device 1, are one), or for a finding that names no scope (a
 * kernel), the same cause. */
static int same_scope(const struct bench_culprit *x, const struct bench_culprit *y, int per_device) {
  int dw = per_device == 1 && x->id >= 0 && y->id == x->id &&
           ((y->kind == MS_CULPRIT_DEVICE && x->kind == MS_CULPRIT_WORKER) ||
            (y->kind == MS_CULPRIT_WORKER && x->kind == MS_CULPRIT_DEVICE));
  return dw || (y->kind == x->kind && y->id == x->id && (x->id >= 0 || y->cause == x->cause));
}

/* Whether b names culprit x. */
static int names(const struct bench_answer *b, const struct bench_culprit *x, int per_device) {
  if (b->cause == -1) return 0;
  for (int i = 0; i <= b->n_more; i++) {
    struct bench_culprit y = culprit_at(b, i);
    if (same_scope(x, &y, per_device)) return 1;
  }
  return 0;
}

/* Where a judgement held scope x at half the threshold or more; -1: it did not. */
static int near_at(const struct bench_near *b, const struct bench_culprit *x, int per_device) {
  for (int i = 0; b && i < b->n; i++)
    if (same_scope(x, &b->scope[i], per_device)) return i;
  return -1;
}

/* The z at which it held x; 0: it did not. */
static double near_z(const struct bench_near *b, const struct bench_culprit *x, int per_device) {
  int i = near_at(b, x, per_device);
  return i < 0 ? 0 : b->z[i];
}

/* An answer in a word: its culprits, or its cause where it names none. */
static const char *label(const struct bench_answer *a) {
  return a->cause == -1 ? "none" : a->id >= 0 ? a->name : bench_cause_name(a->cause);
}

/* a names the k culprits kept (k >= 1). */
static void answer_culprits(struct bench_answer *a, const struct bench_culprit *kept, int k, const struct ms_plan *p) {
  a->cause = kept[0].cause;
  a->kind = kept[0].kind;
  a->id = kept[0].id;
  bench_culprit_name(p, a->kind, a->id, a->name, sizeof a->name);
  a->n_more = k - 1;
  for (int j = 1; j < k; j++) {
    a->more[j - 1] = kept[j];
    size_t len = strlen(a->name);
    snprintf(a->name + len, sizeof a->name - len, " + %s", kept[j].name);
  }
}

/* The worker or device both judgements held at half the threshold or more
 * (the one whose smaller z is largest) in *x, and that z; 0: none. A
 * worker or device is one of a few scopes (two workers here, against hundreds
 * of classes), so the largest z healthy runs reach among them stays lower
 * than among the many, and the same one standing out against two healthy runs
 * taken apart is a finding, if a weak one. Its cause: the two's, or unknown
 * where they differ. */
static double near_both(const struct bench_near *a, const struct bench_near *b, int per_device,
                        struct bench_culprit *x) {
  double best = 0;
  for (int i = 0; a && i < a->n; i++) {
    int j = near_at(b, &a->scope[i], per_device);
    double z = j < 0 ? 0 : fmin(a->z[i], b->z[j]);
    if (!(z > best)) continue;
    best = z;
    *x = a->scope[i];
    if (b->scope[j].cause != x->cause) x->cause = -2;
  }
  return best;
}

/* a names x, held at z or more by both judgements under the threshold. */
static void answer_weak(struct bench_answer *a, const struct bench_culprit *x, double z, const struct ms_plan *p) {
  answer_culprits(a, x, 1, p);
  a->weak = 1;
  a->confidence = 0.5 * clamp01(z / Z_MIN);
  snprintf(a->why, sizeof a->why, "%.60s: z %.1f or more against both healthy runs (under the threshold, %.0f: "
           "a weak finding)", x->name, z, Z_MIN);
}

void bench_answer_agree(struct bench_answer *a, const struct bench_answer *b, const struct bench_near *na,
                        const struct bench_near *nb, const struct ms_plan *p, int per_device) {
  double ca = a->confidence, cb = b->confidence;
  /* the worker or device both held near the threshold: what they agree on
   * where they name nothing in common */
  struct bench_culprit weak;
  double zw = near_both(na, nb, per_device, &weak);
  if (a->cause == -1 && b->cause == -1) {
    if (zw > 0)
      answer_weak(a, &weak, zw, p);
    else
      a->confidence = ca < cb ? ca : cb;
    return;
  }
  /* the one that names culprits (n) and the other (o): o names them too, or,
   * if it said "none", held them at half the threshold or more */
  const struct bench_answer *n = a->cause == -1 ? b : a, *o = n == a ? b : a;
  const struct bench_near *on = n == a ? nb : na;
  double sure = 1;
  struct bench_culprit kept[BENCH_MAX_CULPRITS];
  int k = 0;
  for (int i = 0; i <= n->n_more; i++) {
    struct bench_culprit x = culprit_at(n, i);  /* more[]'s carry their names; the first is named anew */
    double z = o->cause == -1 ? near_z(on, &x, per_device) : 0;
    if (names(o, &x, per_device) || z > 0) kept[k++] = x;
    if (z > 0 && clamp01(z / Z_MIN) < sure) sure = clamp01(z / Z_MIN);
  }
  if (!k && zw > 0) {
    answer_weak(a, &weak, zw, p);
    return;
  }
  if (!k) {
    /* one of them names what the other does not: nothing stands out against
     * both, as sure as the surer of them is wrong */
    char why[sizeof a->why];
    snprintf(why, sizeof why, "not against both healthy runs: %.60s / %.60s", label(a), label(b));
    double none = a->cause == -1 ? (ca < 1 - cb ? ca : 1 - cb) : b->cause == -1 ? (cb < 1 - ca ? cb : 1 - ca)
                                                                                : 1 - (ca > cb ? ca : cb);
    answer_none(a, none, why);
    a->n_more = 0;
    return;
  }
  /* named by both: the lower confidence; held near by a "none": the namer's,
   * as far as the other's z reaches toward the threshold (a is o or n: read first) */
  double conf = o->cause == -1 ? (n == a ? ca : cb) * sure : ca < cb ? ca : cb;
  if (n != a) snprintf(a->why, sizeof a->why, "%s", n->why);
  answer_culprits(a, kept, k, p);
  a->confidence = conf;
}

void bench_diagnose(const struct bench_evidence *ref, struct bench_evidence *ev, const struct ms_plan *p,
                    const struct bench_scenario *sc, struct bench_answer *out) {
  bench_diagnose_null(ref, NULL, NULL, 0, ev, p, sc, out);
}
