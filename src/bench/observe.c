/* SPDX-License-Identifier: MIT */
/* The five observers of the counterexample benchmark. Each runs the scenario's
 * engine once and keeps only what its way of observing would ship, counting the
 * bytes:
 *   (a) kernel timing   the time of every step (8 bytes a step);
 *   (b) PC sampling     every SM sampled periodically: the kernel it runs or that
 *                       it waits, summed per (device, kernel, state) as CUPTI
 *                       aggregates PC samples per function (16 bytes a row); no
 *                       task identity;
 *   (c) task trace      the engine's always-on trace (ms_engine_trace_*): each
 *                       worker keeps its first budget / (32 x workers) records,
 *                       32 bytes each, the rest counted as dropped;
 *   (d) sampled events  the diag_sample monitor at a fixed 1-in-N rate that fits
 *                       the budget, 32-byte records into a ring buffer;
 *   (e) semantic        the diag_semantic monitor attached at step 1 of the live
 *                       engine; its maps aggregate in place and the diagnoser reads
 *                       rows (key + value bytes each) until the budget is spent.
 * (c), (d) and (e) are turned into the same feature tables (bench_features), so
 * their diagnoses differ only by the evidence, not by the reasoning. */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench.h"
#include "megascope/bpf.h"
#include "megascope/attach.h"
#include "megascope/plan_ir.h"
#include "megascope/telemetry.h"

#define REC_BYTES 32      /* a trace or sampled task record as shipped */
#define PC_ROW_BYTES 16   /* (device, kernel, state) and a count */
#define STEP_BYTES 8
#define COVERAGE_BYTES 64 /* the semantic read-out's coverage record */
#define PC_PERIOD_NS 1000 /* the simulator's sampling period per SM (about 2^11 cycles) */

const char *bench_method_name(int m) {
  static const char *const names[BM_COUNT] = {"kernel_timing", "pc_sampling",       "task_trace",
                                              "sampled_events", "semantic_monitors", "task_profiler"};
  return m >= 0 && m < BM_COUNT ? names[m] : "?";
}

/* ---- feature tables ---- */

/* A task record as the trace and the sampler ship it. */
struct trace_row {
  int32_t worker, idx, task, bucket, slot, fired;
  uint64_t step, t_begin, t_end, t_ready;
};


/* Key + value bytes of one row of each section, as the semantic monitor's maps
 * hold them (diag_semantic.bpf.c); what reading a row costs. */
const unsigned bench_row_bytes[FS_COUNT] = {
    [FS_CLASS] = 4 + 48,   [FS_OP] = 4 + 48,     [FS_EVCLASS] = 4 + 32, [FS_WORKER] = 4 + 32,
    [FS_REQUEST] = 8 + 40, [FS_EXPERT] = 4 + 40, [FS_DEVICE] = 4 + 32, [FS_WTOP] = 4 + 16,
    [FS_BTOP] = 4 + 16,    [FS_DEVBUSY] = 4 + 16, [FS_OSWORKER] = 4 + 24, [FS_WOP] = 4 + 16,
};

/* diag_semantic.bpf.c's worker_op: the workers it keeps rows for, and its key's stride */
#define WOP_WORKERS 64
#define WOP_STRIDE 32

struct bench_features *bench_feat_new(const struct ms_plan *p, int n_workers, int n_slots, int n_devices) {
  struct bench_features *f = calloc(1, sizeof *f);
  if (!f) return NULL;
  f->n[FS_CLASS] = p->n_classes;
  f->n[FS_OP] = MS_K_COUNT;
  f->n[FS_EVCLASS] = p->n_ev_classes;
  f->n[FS_WORKER] = n_workers;
  f->n[FS_REQUEST] = n_slots;
  f->n[FS_EXPERT] = p->model->cfg.n_experts;
  f->n[FS_DEVICE] = n_devices;
  f->n[FS_WTOP] = 2;
  f->n[FS_BTOP] = 2;
  f->n[FS_DEVBUSY] = n_devices;
  f->n[FS_OSWORKER] = n_workers <= BENCH_MAX_OS_WORKERS ? n_workers : 0;
  f->n[FS_WOP] = (n_workers < WOP_WORKERS ? n_workers : WOP_WORKERS) * MS_K_COUNT;
  f->per_device = (n_workers + n_devices - 1) / (n_devices > 0 ? n_devices : 1);
  for (int s = 0; s < FS_COUNT; s++)
    if (!(f->row[s] = calloc((size_t)f->n[s] + 1, sizeof **f->row))) {
      bench_feat_free(f);
      return NULL;
    }
  return f;
}

void bench_feat_free(struct bench_features *f) {
  if (!f) return;
  for (int s = 0; s < FS_COUNT; s++) free(f->row[s]);
  free(f);
}

int bench_feat_read(struct bench_features *f, int sec, int i) {
  if (i < 0 || i >= f->n[sec]) return 0;
  struct bench_stat *r = &f->row[sec][i];
  if (!f->lazy || r->have) return r->have;
  if (*f->bytes + bench_row_bytes[sec] > f->budget) return 0;
  *f->bytes += bench_row_bytes[sec];
  r->have = 1;
  return 1;
}

static void stat_add(struct bench_stat *s, double v, double q) {
  s->n += 1;
  s->sum += v;
  s->sumsq += v * v;
  if (v > s->max) s->max = v;
  s->qsum += q;
  if (q > s->qmax) s->qmax = q;
  s->have = 1;
}

/* The two largest of the sums in section sec into the top section. */
static void feat_tops(struct bench_features *f, int sec, int top, double (*val)(const struct bench_stat *)) {
  int a = -1, b = -1;
  for (int i = 0; i < f->n[sec]; i++) {
    double v = val(&f->row[sec][i]);
    if (!(v > 0)) continue;
    if (a < 0 || v > val(&f->row[sec][a])) b = a, a = i;
    else if (b < 0 || v > val(&f->row[sec][b])) b = i;
  }
  int who[2] = {a, b};
  for (int j = 0; j < 2; j++)
    if (who[j] >= 0)
      f->row[top][j] = (struct bench_stat){.n = who[j], .sum = val(&f->row[sec][who[j]]), .have = 1};
}

static double queue_of(const struct bench_stat *s) { return s->sum; }
static double excess_of(const struct bench_stat *s) { return s->ratio - s->ratio_n; }

void bench_feat_tops(struct bench_features *f) {
  memset(f->row[FS_WTOP], 0, sizeof **f->row * (size_t)f->n[FS_WTOP]);
  memset(f->row[FS_BTOP], 0, sizeof **f->row * (size_t)f->n[FS_BTOP]);
  feat_tops(f, FS_WORKER, FS_WTOP, queue_of);
  feat_tops(f, FS_WORKER, FS_BTOP, excess_of);
}

/* After the task records: each record's time against its class's mean (the
 * monitor uses the running mean; here the whole record set's), and the top
 * workers (what the monitor keeps as it goes). */
static void feat_finish(struct bench_features *f, struct ms_engine *e, const struct trace_row *rows, size_t n,
                        int keep_per_worker) {
  for (size_t i = 0; i < n; i++) {
    const struct trace_row *r = &rows[i];
    const struct ms_plan *p = ms_engine_plan(e, r->bucket);
    if ((keep_per_worker >= 0 && r->idx >= keep_per_worker) || !p || r->task >= p->n_tasks || r->worker >= f->n[FS_WORKER])
      continue;
    const struct bench_stat *c = &f->row[FS_CLASS][p->tasks[r->task].cls];
    if (c->sum > 0 && p->tasks[r->task].kernel != MS_K_COMM) {
      double ratio = (double)(r->t_end - r->t_begin) * c->n / c->sum;
      f->row[FS_WORKER][r->worker].ratio += ratio;
      f->row[FS_WORKER][r->worker].ratio_n += 1;
      /* a device's tasks against their classes' means: its mix of classes (the
       * step start, the LM head and sampling run on device 0 alone) cancels */
      int d = r->worker / (f->per_device > 0 ? f->per_device : 1);
      if (d < f->n[FS_DEVBUSY]) stat_add(&f->row[FS_DEVBUSY][d], ratio, 0);
    }
  }
  feat_tops(f, FS_WORKER, FS_WTOP, queue_of);
  feat_tops(f, FS_WORKER, FS_BTOP, excess_of);
}

/* One task record into every section it informs. */
static void feat_task(struct bench_features *f, const struct ms_plan *p, int t, int worker, int slot, double ns,
                      double q, double t_begin) {
  if (t < 0 || t >= p->n_tasks) return;
  const struct ms_task *k = &p->tasks[t];
  stat_add(&f->row[FS_CLASS][k->cls], ns, q);
  stat_add(&f->row[FS_OP][k->kernel], ns, q);
  if (worker >= 0 && worker < f->n[FS_WORKER]) {
    stat_add(&f->row[FS_WORKER][worker], q, q);
  }
  if (worker >= 0 && (worker + 1) * MS_K_COUNT <= f->n[FS_WOP])
    stat_add(&f->row[FS_WOP][worker * MS_K_COUNT + k->kernel], ns, q);
  if (k->kernel == MS_K_ATTN && slot >= 0 && slot < f->n[FS_REQUEST]) {
    struct bench_stat *r = &f->row[FS_REQUEST][slot];
    if (t_begin + ns > r->last) r->last = t_begin + ns;
    stat_add(r, ns, q);
  }
  if ((k->kernel == MS_K_EXPERT_UP || k->kernel == MS_K_EXPERT_DOWN) && k->tile[2] >= 0 && k->tile[2] < f->n[FS_EXPERT])
    stat_add(&f->row[FS_EXPERT][k->tile[2]], ns, q);
  if (k->kernel == MS_K_COMM && k->tile[2] >= 0 && k->tile[2] < f->n[FS_DEVICE])
    stat_add(&f->row[FS_DEVICE][k->tile[2]], ns, q);
}

/* ---- engines ---- */

/* The long-context request's prompt, when the run carries one (0: none). */
static int long_prompt(const struct bench_engine_cfg *c) {
  const struct bench_interfere_spec *in = &c->sc->intf;
  return c->interfere && in->kind == BI_LONG_CONTEXT ? in->tokens : 0;
}

struct ms_engine *bench_engine_new(const struct bench_engine_cfg *c, struct ms_textbuf *log) {
  const struct bench_scenario *s = c->sc;
  int ctx = s->steps + 2;
  if (s->intf.kind == BI_LONG_CONTEXT) ctx += s->intf.tokens;  /* healthy or not: the same engine */
  const struct ms_backend_info *be = ms_backend_info(s->backend);
  struct ms_engine_opts o = {.sz = sizeof o, .max_batch = s->batch, .max_ctx = ctx, .backend = s->backend,
                             .seed = c->seed, .faults = c->faults, .n_faults = c->n_faults, .tp = s->tp,
                             .start_paused = 1, .pin_workers = s->pin && be->os_workers,
                             .n_workers = be->os_workers ? (s->workers ? s->workers : 2) : 0,
                             /* the CPU's tasks as the recorded scenarios and the calibration had them
                              * (64 KiB a GEMV task, attention one task a row and KV group), not the CPU
                              * backend's later defaults (1 MiB, attention in two parts) */
                             .tile_bytes = be->os_workers ? BENCH_CPU_TILE_BYTES : 0, .attn_parts = 1,
                             .transport = c->tx, .comm_timeout_ms = c->tx ? 60000 : 0};
  if (be->cost_model) {
    ms_sim_preset(s->gpu, &o.sim);
    o.sim.jitter = s->jitter;
    for (int i = 0; i < s->n_params; i++)
      if (ms_sim_param_set(&o.sim, s->params[i][0], s->params[i][1])) {
        ms_textbuf_printf(log, "%s: bad cost parameter %s\n", s->name, s->params[i][0]);
        errno = EINVAL;
        return NULL;
      }
  }
  return ms_engine_new(c->m, &o, log);
}

/* The requests: batch of them, one prompt token each (the long-context one a
 * long prompt), steps tokens each, submitted while the engine is paused so
 * that all join the first step. */
static int submit_all(struct ms_engine *e, const struct bench_engine_cfg *c, struct ms_request **r) {
  const struct bench_scenario *s = c->sc;
  int n = s->batch < 64 ? s->batch : 64, lp = long_prompt(c);
  int32_t *prompt = lp ? malloc(sizeof *prompt * (size_t)lp) : NULL;
  for (int i = 0; i < lp && prompt; i++) prompt[i] = 1 + (int32_t)((i * 7919u) % 200u);
  for (int i = 0; i < n; i++) {
    int32_t tok = 1 + i;
    int longer = prompt && i == s->intf.slot;
    struct ms_request_opts ro = {.sz = sizeof ro, .prompt = longer ? prompt : &tok, .n_prompt = longer ? lp : 1,
                                 .max_new_tokens = s->steps};
    r[i] = ms_engine_submit(e, &ro);
  }
  free(prompt);
  return n;
}

/* The scenario's interference thread for this run (spin, preempt), started just
 * before the engine resumes; NULL when there is none or on failure (*failed).
 * Across ranks it runs in its rank's process alone, on the CPU the engine
 * pinned that rank's worker to (the workers count rank after rank). */
static struct bench_interferer *interfere_begin(struct ms_engine *e, const struct bench_engine_cfg *c, int *failed) {
  const struct bench_interfere_spec *in = &c->sc->intf;
  *failed = 0;
  if (!c->interfere || (in->kind != BI_SPIN && in->kind != BI_PREEMPT) || !(in->share > 0)) return NULL;
  int rank = in->rank > 0 ? in->rank : 0, tp = c->sc->tp > 1 ? c->sc->tp : 1;
  if (c->tx && c->tx->rank != rank) return NULL;
  /* worker w of device (rank) r: r x its workers + w, as the engine pins them */
  int w = in->worker + rank * (c->tx ? ms_engine_n_workers(e) : ms_engine_n_workers(e) / tp);
  struct bench_interfere_opts o = {.kind = in->kind, .cpu = bench_worker_cpu(w), .seconds = 600,
                                   .seed = c->seed + 1};
  if (in->kind == BI_SPIN) o.duty = in->share;
  else o.gap_us = 3750.0 * (1 - (in->share < 0.95 ? in->share : 0.95)) / (in->share < 0.95 ? in->share : 0.95);
  char buf[256];
  struct ms_textbuf log = {buf, sizeof buf, 0, 0};
  struct bench_interferer *x = bench_interfere_start(&o, &log);
  if (!x) {
    fprintf(stderr, "bench: %s: %s", c->sc->name, buf);
    *failed = 1;
  }
  return x;
}

/* A run whose requests have not all finished in this long has stalled (its
 * steps take milliseconds): better a named error than a benchmark that hangs. */
#define RUN_LIMIT_MS (10 * 60 * 1000)

/* Waits for the requests and frees them; -ETIMEDOUT when the run stalled: the
 * rest are cancelled, and stderr says which were left and in what state. */
static int wait_all(struct ms_request **r, int n, const char *name) {
  uint64_t until = ms_now_ns() + (uint64_t)RUN_LIMIT_MS * 1000000ull;
  int stalled = 0;
  for (int i = 0; i < n; i++) {
    if (!r[i]) continue;
    uint64_t now = ms_now_ns();
    int left = stalled || now >= until ? 0 : (int)((until - now) / 1000000ull);
    if (ms_request_wait(r[i], left) == -ETIMEDOUT) {
      struct ms_request_info ri;
      ms_request_get_info(r[i], &ri);
      fprintf(stderr, "bench: %s: request %d of %d not finished after %d s (%d tokens, state %d): the run "
              "stalled; cancelling it\n", name, i, n, RUN_LIMIT_MS / 1000, ri.n_tokens, (int)ri.state);
      stalled = 1;
      ms_request_cancel(r[i]);
      ms_request_wait(r[i], 5000);
    }
    ms_request_free(r[i]);
  }
  return stalled ? -ETIMEDOUT : 0;
}

/* The run's time: virtual on the simulator; on the real-clock backends the sum
 * of its steps' times (what the requests waited for, without the engine's
 * start and stop), the wall time when no step was logged. */
static uint64_t since(struct ms_engine *e, const struct bench_scenario *s, uint64_t t0, uint64_t sim0) {
  if (ms_backend_info(s->backend)->virtual_clock) return ms_engine_sim_now(e) - sim0;
  uint64_t wall = ms_now_ns() - t0, sum = 0;
  struct ms_step_record log[512];
  int n = ms_engine_step_log(e, log, 512);
  for (int i = 0; i < n; i++) sum += log[i].t_end > log[i].t_begin ? log[i].t_end - log[i].t_begin : 0;
  return n < 1 || n == 512 || !sum ? wall : sum;
}

/* The OS's view of the workers' threads: counters now into os[w] (sign 1), or
 * their growth since (sign -1 after a first read with sign 1). */
static int os_read(struct ms_engine *e, double os[][3], int sign) {
  int n = ms_engine_n_workers(e), got = 0;
  for (int w = 0; w < n && w < BENCH_MAX_OS_WORKERS; w++) {
    struct ms_worker_os o;
    if (ms_engine_worker_os(e, w, &o) || o.last_cpu < 0) return 0;
    double v[3] = {(double)o.runqueue_ns, (double)o.run_ns, (double)o.preempted};
    for (int k = 0; k < 3; k++) os[w][k] = sign > 0 ? v[k] : v[k] - os[w][k];
    got++;
  }
  return got;
}

/* The OS rows of the features from the evidence (bench_feat_new made them). */
static void feat_os(struct bench_features *f, struct bench_evidence *ev) {
  for (int w = 0; f && w < ev->os_n && w < f->n[FS_OSWORKER]; w++) {
    f->row[FS_OSWORKER][w] =
        (struct bench_stat){.n = 1, .sum = ev->os[w][0], .ratio = ev->os[w][1], .max = ev->os[w][2], .have = 1};
    ev->bytes += bench_row_bytes[FS_OSWORKER];  /* the semantic read-out charges again as it reads */
  }
}

uint64_t bench_engine_drive_os(struct ms_engine *e, const struct bench_engine_cfg *c, struct bench_evidence *ev) {
  const struct bench_scenario *s = c->sc;
  struct ms_request *r[64];
  int n = submit_all(e, c, r), failed, os_n = 0;
  double os[BENCH_MAX_OS_WORKERS][3];
  uint64_t t0 = ms_now_ns(), sim0 = ms_engine_sim_now(e);
  struct bench_interferer *x = interfere_begin(e, c, &failed);
  if (ev && ms_backend_info(s->backend)->os_workers) os_n = os_read(e, os, 1);
  ms_engine_resume(e);
  int stalled = wait_all(r, n, s->name);
  if (ev && os_n && os_read(e, os, -1) == os_n) {
    memcpy(ev->os, os, sizeof os);
    ev->os_n = os_n;
  }
  bench_interfere_stop(x, NULL);
  if (stalled || failed) return 0;
  return since(e, s, t0, sim0);
}

uint64_t bench_engine_drive(struct ms_engine *e, const struct bench_engine_cfg *c) {
  return bench_engine_drive_os(e, c, NULL);
}

static const struct ms_plan *batch_plan(struct ms_engine *e, const struct bench_scenario *s) {
  return ms_engine_plan(e, s->batch);
}

/* ---- (a) kernel timing ---- */

static int observe_timing(struct ms_engine *e, const struct bench_engine_cfg *c, struct bench_evidence *ev) {
  const struct bench_scenario *s = c->sc;
  ev->run_ns = bench_engine_drive(e, c);
  struct ms_step_record *log = calloc((size_t)s->steps + 8, sizeof *log);
  ev->step_ns = calloc((size_t)s->steps + 8, sizeof *ev->step_ns);
  if (!log || !ev->step_ns) {
    free(log);
    return -ENOMEM;
  }
  ev->n_steps = ms_engine_step_log(e, log, s->steps + 8);
  for (int i = 0; i < ev->n_steps; i++) ev->step_ns[i] = (double)(log[i].t_end - log[i].t_begin);
  ev->bytes = (uint64_t)ev->n_steps * STEP_BYTES;
  ev->coverage = 1;
  free(log);
  return 0;
}

/* ---- (b) PC sampling ---- */

struct pc_ctx {
  struct bench_evidence *ev;
  int per_device, first;  /* first: the device of worker 0 (across ranks: this rank's) */
  struct ms_engine *e;
  _Atomic int stop;
};

static void pc_count(struct pc_ctx *pc, int sm, int kernel) {
  int d = pc->first + sm / pc->per_device;
  if (d >= BENCH_MAX_DEVICES) d = BENCH_MAX_DEVICES - 1;
  pc->ev->pc[d][kernel + 2] += 1;
  pc->ev->pc_total += 1;
}

static void pc_sim_sample(void *user, int sm, int kernel) { pc_count(user, sm, kernel); }

/* The real-clock backends' sampler: a thread reads what each worker publishes
 * for the watchdog (the task it runs, the task it waits for; on the CUDA
 * backend each CTA's heartbeat), every 20 us. */
static void *pc_thread(void *arg) {
  struct pc_ctx *pc = arg;
  struct ms_engine *e = pc->e;
  int kernel[1024];
  while (!atomic_load_explicit(&pc->stop, memory_order_acquire)) {
    int n = ms_engine_sample_kernels(e, kernel, 1024);
    for (int w = 0; w < n; w++) pc_count(pc, w, kernel[w]);
    struct timespec ts = {0, 20000};
    nanosleep(&ts, NULL);
  }
  return NULL;
}

static int observe_pc(struct ms_engine *e, const struct bench_engine_cfg *c, struct bench_evidence *ev) {
  const struct bench_scenario *s = c->sc;
  struct pc_ctx pc = {.ev = ev, .e = e};
  int D = s->tp > 1 ? s->tp : 1;
  pc.per_device = (ms_engine_n_workers(e) + D - 1) / D;
  if (c->tx) pc.per_device = ms_engine_n_workers(e), pc.first = c->tx->rank;  /* a rank is one device */
  ev->pc_devices = D;
  pthread_t th;
  int threaded = 0;
  if (ms_backend_info(s->backend)->virtual_clock)
    ms_sim_sampler(e, PC_PERIOD_NS, pc_sim_sample, &pc);
  else
    threaded = !pthread_create(&th, NULL, pc_thread, &pc);
  ev->run_ns = bench_engine_drive(e, c);
  if (threaded) {
    atomic_store_explicit(&pc.stop, 1, memory_order_release);
    pthread_join(th, NULL);
  }
  int rows = 0;
  for (int d = 0; d < BENCH_MAX_DEVICES; d++)
    for (int k = 0; k < 20; k++) rows += ev->pc[d][k] > 0;
  ev->bytes = (uint64_t)rows * PC_ROW_BYTES;
  ev->coverage = 1;
  return 0;
}

/* ---- (c) the task trace ---- */

/* One record as (c) ships it; `fired`: its trigger completed its event. */
struct trace_rows {
  struct trace_row *r;
  int n, cap;
};

/* Each worker's records in order: idx is the record's place among its worker's. */
static int keep_task(void *user, const struct ms_trace_task *r) {
  struct trace_rows *tr = user;
  if (tr->n == tr->cap) return 1;
  int idx = tr->n && tr->r[tr->n - 1].worker == r->worker ? tr->r[tr->n - 1].idx + 1 : 0;
  tr->r[tr->n++] = (struct trace_row){.worker = r->worker, .idx = idx, .task = (int)r->task, .bucket = r->bucket,
                                      .slot = r->slot, .fired = r->fired, .step = r->step, .t_begin = r->t_begin,
                                      .t_end = r->t_end, .t_ready = r->t_ready};
  return 0;
}

static int trace_collect(struct ms_engine *e, struct bench_evidence *ev) {
  struct ms_trace_stats ts0;
  ms_engine_trace_stats(e, &ts0);  /* every record the buffers hold: the task records and the queue depths */
  struct trace_rows *tr = calloc(1, sizeof *tr);
  if (!tr || !(tr->r = calloc((size_t)ts0.records + 1, sizeof *tr->r))) {
    free(tr);
    return -ENOMEM;
  }
  tr->cap = (int)ts0.records;
  long rc = ms_engine_trace_tasks(e, keep_task, tr);
  if (rc < 0) {
    free(tr->r);
    free(tr);
    return (int)rc;
  }
  struct ms_trace_stats ts;
  ms_engine_trace_stats(e, &ts);
  ev->coverage = ts.records + ts.dropped ? (double)ts.records / (double)(ts.records + ts.dropped) : 0;
  ev->obs_records = ts.records;
  ev->bytes = ts.records * REC_BYTES;  /* every record the buffer held (queue depths too) */
  ev->feat = (struct bench_features *)tr;  /* raw rows; bench_trace_features makes the tables */
  return 0;
}

struct fire_key {
  uint64_t step;
  int32_t ev;
  double end;
};

static int cmp_fire(const void *a, const void *b) {
  const struct fire_key *x = a, *y = b;
  if (x->step != y->step) return x->step < y->step ? -1 : 1;
  return (x->ev > y->ev) - (x->ev < y->ev);
}

/* Release lags from task records: for every (step, event) whose producer end is
 * known (exact: the producer whose trigger completed it; approximate: the last
 * end among the producers seen), the first consumer seen gives its ready time. */
static void feat_lags(struct bench_features *f, struct ms_engine *e, struct fire_key *fk, size_t nf,
                      const struct trace_row *rows, size_t n, int keep_per_worker) {
  qsort(fk, nf, sizeof *fk, cmp_fire);
  /* merge duplicates (approximate mode): the latest end per (step, event) */
  size_t m = 0;
  for (size_t i = 0; i < nf; i++) {
    if (m && !cmp_fire(&fk[m - 1], &fk[i])) {
      if (fk[i].end > fk[m - 1].end) fk[m - 1].end = fk[i].end;
      continue;
    }
    fk[m++] = fk[i];
  }
  for (size_t i = 0; i < n; i++) {
    const struct trace_row *r = &rows[i];
    if (keep_per_worker >= 0 && r->idx >= keep_per_worker) continue;
    const struct ms_plan *p = ms_engine_plan(e, r->bucket);
    if (!p || r->task >= p->n_tasks || p->tasks[r->task].wait < 0) continue;
    struct fire_key key = {r->step, p->tasks[r->task].wait, 0};
    struct fire_key *hit = bsearch(&key, fk, m, sizeof *fk, cmp_fire);
    if (!hit || hit->end < 0) continue;
    double lag = (double)r->t_ready - hit->end;
    stat_add(&f->row[FS_EVCLASS][p->events[key.ev].cls], lag > 0 ? lag : 0, 0);
    hit->end = -1;  /* one lag per firing */
  }
}

/* The tables of a trace as shipped under `budget` (every worker its first
 * budget / (32 x workers) records; budget 0: all). */
static struct bench_features *trace_features(struct ms_engine *e, const struct bench_scenario *s,
                                             const struct trace_rows *tr, uint64_t *bytes) {
  const struct ms_plan *p0 = batch_plan(e, s);
  struct bench_features *f = bench_feat_new(p0, ms_engine_n_workers(e), p0->batch, s->tp > 1 ? s->tp : 1);
  if (!f) return NULL;
  int keep = -1;  /* the engine kept what the budget allowed */
  size_t nf = 0, kept = 0;
  struct fire_key *fk = calloc((size_t)tr->n + 1, sizeof *fk);
  for (int i = 0; i < tr->n; i++) {
    const struct trace_row *r = &tr->r[i];
    if (keep >= 0 && r->idx >= keep) continue;
    const struct ms_plan *p = ms_engine_plan(e, r->bucket);
    if (!p) continue;
    kept++;
    feat_task(f, p, r->task, r->worker, r->slot, (double)(r->t_end - r->t_begin),
              r->t_begin > r->t_ready ? (double)(r->t_begin - r->t_ready) : 0, (double)r->t_begin);
    if (r->fired && fk && r->task < p->n_tasks && p->tasks[r->task].trigger >= 0)
      fk[nf++] = (struct fire_key){r->step, p->tasks[r->task].trigger, (double)r->t_end};
  }
  if (fk) feat_lags(f, e, fk, nf, tr->r, (size_t)tr->n, keep);
  feat_finish(f, e, tr->r, (size_t)tr->n, keep);
  free(fk);
  if (!*bytes) *bytes = kept * REC_BYTES;
  return f;
}

static int observe_trace(struct ms_engine *e, const struct bench_engine_cfg *c, uint64_t budget,
                         struct bench_evidence *ev) {
  const struct bench_scenario *s = c->sc;
  uint64_t per = budget / ((uint64_t)REC_BYTES * (uint64_t)ms_engine_n_workers(e));
  if (!budget) /* the reference: everything (twice a worker's even share, for the JIT tasks it picks up) */
    per = (uint64_t)ms_engine_plan(e, s->batch)->n_tasks * (uint64_t)(s->steps + 1) * 2 / (uint64_t)ms_engine_n_workers(e) + 256;
  if (per > (1u << 24)) per = 1u << 24;
  if (per && ms_engine_trace_start(e, (uint32_t)per)) return -ENOMEM;
  ev->run_ns = bench_engine_drive_os(e, c, ev);
  if (per) ms_engine_trace_stop(e);
  struct trace_rows empty = {0};
  int rc = per ? trace_collect(e, ev) : 0;
  if (rc) return rc;
  struct trace_rows *tr = per ? (struct trace_rows *)ev->feat : &empty;
  ev->feat = trace_features(e, s, tr, &ev->bytes);
  feat_os(ev->feat, ev);
  if (!per) ev->coverage = 0;
  if (tr != &empty) {
    free(tr->r);
    free(tr);
  }
  return ev->feat ? 0 : -ENOMEM;
}

/* ---- (f) the compiler-native profiler ---- */

static int cmp_row_begin(const void *a, const void *b) {
  const struct trace_row *x = a, *y = b;
  return (x->t_begin > y->t_begin) - (x->t_begin < y->t_begin);
}

/* MPK's profiler records every task's begin and end into a buffer, with a
 * filter fixed when the kernel is built. The filter that fits a budget without
 * knowing the question: whole steps, evenly spaced (a full timeline of every
 * k-th step); when not even one step fits, the first records of step 1 in time
 * order (a window). Recorded in full and filtered here: the same records as a
 * filtered profiler, costed as such (only the kept records count). */
static int observe_profiler(struct ms_engine *e, const struct bench_engine_cfg *c, uint64_t budget,
                            struct bench_evidence *ev) {
  const struct bench_scenario *s = c->sc;
  const struct ms_plan *p = batch_plan(e, s);
  uint64_t per = (uint64_t)p->n_tasks * (uint64_t)(s->steps + 1) * 2 / (uint64_t)ms_engine_n_workers(e) + 256;
  if (per > (1u << 24)) per = 1u << 24;
  if (ms_engine_trace_start(e, (uint32_t)per)) return -ENOMEM;
  ev->run_ns = bench_engine_drive_os(e, c, ev);
  ms_engine_trace_stop(e);
  int rc = trace_collect(e, ev);
  if (rc) return rc;
  struct trace_rows *tr = (struct trace_rows *)ev->feat;
  ev->feat = NULL;
  size_t total = (size_t)tr->n, kept = 0;
  double per_step = p->n_tasks > 0 ? p->n_tasks : 1, fit = budget ? (double)budget / REC_BYTES / per_step : 1e300;
  if (fit >= 1) {
    int stride = fit >= s->steps ? 1 : (int)ceil(s->steps / fit);
    for (size_t i = 0; i < total; i++)
      if (tr->r[i].step % (uint64_t)stride == 0) tr->r[kept++] = tr->r[i];
  } else {
    for (size_t i = 0; i < total; i++)
      if (tr->r[i].step == 1) tr->r[kept++] = tr->r[i];
    qsort(tr->r, kept, sizeof *tr->r, cmp_row_begin);
    if (kept > budget / REC_BYTES) kept = budget / REC_BYTES;
  }
  /* filtered records carry no per-worker index cut: keep them all */
  for (size_t i = 0; i < kept; i++) tr->r[i].idx = 0;
  tr->n = (int)kept;
  ev->bytes = 0;
  ev->feat = trace_features(e, s, tr, &ev->bytes);
  feat_os(ev->feat, ev);
  ev->coverage = total ? (double)kept / (double)total : 0;
  ev->obs_records = kept;
  free(tr->r);
  free(tr);
  return ev->feat ? 0 : -ENOMEM;
}

/* ---- monitors ---- */

static struct ms_monitor *open_monitor(const struct bench_opts *o, const char *name, struct ms_textbuf *log) {
  char path[4200];
  snprintf(path, sizeof path, "%s/%s.bpf.o", o->monitors ? o->monitors : "build/monitors", name);
  return ms_monitor_open(path, log);
}

/* A map of attachment id by name, up to date (the attachment stays readable
 * after detach). */
static struct ms_bpf_map *att_map(struct ms_engine *e, int id, const char *name) {
  struct ms_bpf_map *maps[64];
  int n = ms_engine_attach_maps(e, id, maps, 64);
  for (int i = 0; i < n; i++)
    if (!strcmp(ms_bpf_map_info(maps[i])->name, name)) return maps[i];
  return NULL;
}

/* ---- (d) sampled task events ---- */

struct sample_rec {
  uint64_t task_gen, t_end;
  uint32_t ns, queue_ns;
  uint16_t worker, req_slot, bucket, pad;
};

struct sample_ctx {
  struct ms_engine *e;
  struct bench_features *f;
  struct fire_key *fk;
  struct trace_row *rows;
  size_t n, cap;
};

static int sample_one(void *user, const void *data, uint32_t size) {
  struct sample_ctx *c = user;
  const struct sample_rec *r = data;
  if (size < sizeof *r || c->n == c->cap) return 0;
  const struct ms_plan *p = ms_engine_plan(c->e, r->bucket);
  int t = (int)(r->task_gen & 0xffffffffu);
  if (!p || t >= p->n_tasks) return 0;
  uint64_t t_begin = r->t_end - r->ns;
  feat_task(c->f, p, t, r->worker, r->req_slot == 0xffff ? -1 : r->req_slot, r->ns, r->queue_ns, (double)t_begin);
  /* release lags where a sample knows them: an event with one producer (with
   * several, the sampled producer's end is rarely the one that completed it,
   * and the lag from it measures when the others ended, not the release) */
  int trig = p->tasks[t].trigger;
  if (trig >= 0 && p->events[trig].needed == 1)
    c->fk[c->n] = (struct fire_key){r->task_gen >> 32, trig, (double)r->t_end};
  else
    c->fk[c->n] = (struct fire_key){UINT64_MAX, -1, -1};
  c->rows[c->n] = (struct trace_row){.worker = r->worker, .task = t, .bucket = r->bucket, .step = r->task_gen >> 32,
                                     .t_begin = t_begin, .t_end = r->t_end, .t_ready = t_begin - r->queue_ns};
  c->n++;
  return 0;
}

static int observe_sampled(const struct bench_opts *o, struct ms_engine *e, const struct bench_engine_cfg *c,
                           uint64_t budget, struct bench_evidence *ev, struct ms_textbuf *log) {
  const struct bench_scenario *s = c->sc;
  const struct ms_plan *p = batch_plan(e, s);
  double events = (double)p->n_tasks * s->steps;
  uint32_t every = budget ? (uint32_t)(events * REC_BYTES / (double)budget) + 1 : 1;
  struct ms_monitor *mon = open_monitor(o, "diag_sample", log);
  if (!mon) return -errno;
  struct ms_attach_opts ao = {.sz = sizeof ao, .sample_every = every, .ringbuf_bytes = budget};
  int id = ms_engine_attach(e, mon, &ao, log);
  if (id <= 0) {
    ms_monitor_free(mon);
    return id ? id : -EINVAL;
  }
  ev->run_ns = bench_engine_drive_os(e, c, ev);
  struct ms_coverage cov;
  ms_engine_attach_coverage(e, id, 0, &cov);
  ms_engine_detach(e, id);
  struct bench_features *f = bench_feat_new(p, ms_engine_n_workers(e), p->batch, s->tp > 1 ? s->tp : 1);
  size_t cap = (size_t)(budget ? budget / REC_BYTES : events) + 16;
  struct sample_ctx sc = {.e = e, .f = f, .fk = calloc(cap, sizeof *sc.fk), .rows = calloc(cap, sizeof *sc.rows), .cap = cap};
  struct ms_bpf_map *ring = att_map(e, id, "task_samples");
  if (f && sc.fk && sc.rows && ring) ms_bpf_ringbuf_consume(ring, sample_one, &sc);
  if (f && sc.fk) feat_lags(f, e, sc.fk, sc.n, sc.rows, sc.n, -1);
  if (f) feat_finish(f, e, sc.rows, sc.n, -1);
  free(sc.fk);
  free(sc.rows);
  ev->feat = f;
  feat_os(f, ev);
  ev->bytes = sc.n * REC_BYTES;
  ev->coverage = cov.eligible ? (double)sc.n / (double)cov.eligible : 0;
  ev->obs_execs = cov.executed;
  ev->obs_ring = sc.n;
  return f ? 0 : -ENOMEM;
}

/* ---- (e) semantic monitors ---- */

struct map_copy {
  struct bench_features *f;
  int sec;
  int kind;  /* 0: task_stat, 1: time_stat, 2: wstat (worker), 3: top, 4: expert, 5: req, 6: stat2 (busy) */
};

static void copy_row(struct map_copy *c, int i, const uint64_t *v) {
  if (i < 0 || i >= c->f->n[c->sec]) return;
  struct bench_stat *s = &c->f->row[c->sec][i];
  if (c->kind == 0) *s = (struct bench_stat){.n = (double)v[0], .sum = (double)v[1], .sumsq = (double)v[2],
                                             .qsum = (double)v[3], .qmax = (double)v[4], .max = (double)v[5]};
  if (c->kind == 1) *s = (struct bench_stat){.n = (double)v[0], .sum = (double)v[1], .sumsq = (double)v[2], .max = (double)v[3]};
  if (c->kind == 2)
    *s = (struct bench_stat){.n = (double)v[0], .sum = (double)v[1], .qsum = (double)v[1],
                             .ratio = (double)v[2] / 1000, .ratio_n = (double)v[3]};
  if (c->kind == 3) *s = (struct bench_stat){.n = (double)v[0], .sum = (double)v[1]};  /* worker, its sum */
  if (c->kind == 4)
    *s = (struct bench_stat){.n = (double)v[0], .sum = (double)v[1], .sumsq = (double)v[2], .max = (double)v[3],
                             .work = (double)v[4]};
  if (c->kind == 5)
    *s = (struct bench_stat){.n = (double)v[0], .sum = (double)v[1], .sumsq = (double)v[2], .max = (double)v[3],
                             .last = (double)v[4]};
  if (c->kind == 6) *s = (struct bench_stat){.n = (double)v[0], .sum = (double)v[1] / 1000};  /* per mille */
  if (c->kind == 7) *s = (struct bench_stat){.n = (double)v[0], .sum = (double)v[1]};
}

static int copy_entry(void *user, const void *key, const void *values) {
  struct map_copy *c = user;
  const uint64_t *v = values;
  if (c->kind != 3 && !v[0]) return 0;
  if (c->sec == FS_REQUEST) {
    uint64_t k = *(const uint64_t *)key;
    copy_row(c, (int)(k >> 32), v);
  } else if (c->sec == FS_WOP) {  /* worker x WOP_STRIDE + kernel */
    uint32_t k = *(const uint32_t *)key;
    if (k % WOP_STRIDE < MS_K_COUNT) copy_row(c, (int)(k / WOP_STRIDE * MS_K_COUNT + k % WOP_STRIDE), v);
  } else {
    copy_row(c, (int)*(const uint32_t *)key, v);
  }
  return 0;
}

static void copy_map(struct ms_engine *e, int id, const char *name, struct bench_features *f, int sec, int kind) {
  struct ms_bpf_map *m = att_map(e, id, name);
  struct map_copy c = {f, sec, kind};
  if (m) ms_bpf_map_foreach(m, copy_entry, &c);
}

static int observe_semantic(const struct bench_opts *o, struct ms_engine *e, const struct bench_engine_cfg *c,
                            struct bench_evidence *ev, struct ms_textbuf *log) {
  const struct bench_scenario *s = c->sc;
  const struct ms_plan *p = batch_plan(e, s);
  /* late-bound: the engine runs step 0 unobserved; the question is attached to
   * the live engine at the next step boundary */
  struct ms_request *r[64];
  int n = submit_all(e, c, r), failed;
  uint64_t t0 = ms_now_ns(), sim0 = ms_engine_sim_now(e);
  struct bench_interferer *x = interfere_begin(e, c, &failed);
  ms_engine_pause_at(e, 1);
  int id = -1;
  if (s->steps > 1 && ms_engine_wait_paused(e, 60000) == 0) {
    uint64_t a0 = ms_now_ns();
    struct ms_monitor *mon = open_monitor(o, "diag_semantic", log);
    struct ms_attach_opts ao = {.sz = sizeof ao};
    id = mon ? ms_engine_attach(e, mon, &ao, log) : -1;
    if (mon && id <= 0) ms_monitor_free(mon);
    ev->attach_ns = ms_now_ns() - a0;
  }
  double os[BENCH_MAX_OS_WORKERS][3];
  int os_n = ms_backend_info(s->backend)->os_workers ? os_read(e, os, 1) : 0;  /* from the attach on, as the monitor */
  ms_engine_resume(e);
  ev->run_ns = wait_all(r, n, s->name) || failed ? 0 : since(e, s, t0, sim0);
  if (os_n && os_read(e, os, -1) == os_n) {
    memcpy(ev->os, os, sizeof os);
    ev->os_n = os_n;
  }
  bench_interfere_stop(x, NULL);
  if (id <= 0) return -EINVAL;
  struct ms_coverage cov;
  ms_engine_attach_coverage(e, id, 0, &cov);
  struct bench_features *f = bench_feat_new(p, ms_engine_n_workers(e), p->batch, s->tp > 1 ? s->tp : 1);
  if (!f) return -ENOMEM;
  copy_map(e, id, "class_stat", f, FS_CLASS, 0);
  copy_map(e, id, "op_stat", f, FS_OP, 0);
  copy_map(e, id, "evclass_lag", f, FS_EVCLASS, 1);
  copy_map(e, id, "worker_queue", f, FS_WORKER, 2);
  copy_map(e, id, "worker_top", f, FS_WTOP, 3);
  copy_map(e, id, "worker_slow_top", f, FS_BTOP, 3);
  copy_map(e, id, "req_attn", f, FS_REQUEST, 5);
  copy_map(e, id, "expert_stat", f, FS_EXPERT, 4);
  copy_map(e, id, "device_comm", f, FS_DEVICE, 1);
  copy_map(e, id, "device_busy", f, FS_DEVBUSY, 6);
  copy_map(e, id, "worker_op", f, FS_WOP, 7);
  feat_os(f, ev);
  for (int sec = 0; sec < FS_COUNT; sec++)
    for (int i = 0; i < f->n[sec]; i++) f->row[sec][i].have = 0;  /* shipped only when read */
  f->lazy = 1;
  ev->feat = f;
  ev->coverage = cov.eligible ? (double)cov.executed / (double)cov.eligible : 0;
  ev->bytes = COVERAGE_BYTES;
  ev->obs_execs = cov.executed;
  ms_engine_detach(e, id);
  return 0;
}

/* ---- one observed run ---- */

int bench_observe(const struct bench_opts *o, const struct bench_engine_cfg *c, int m, uint64_t budget,
                  struct bench_evidence *ev, struct ms_textbuf *log) {
  memset(ev, 0, sizeof *ev);
  ev->method = m;
  ev->budget = budget;
  struct ms_engine *e = bench_engine_new(c, log);
  if (!e) return -errno;
  int rc;
  switch (m) {
  case BM_KERNEL_TIMING: rc = observe_timing(e, c, ev); break;
  case BM_PC_SAMPLING: rc = observe_pc(e, c, ev); break;
  case BM_TASK_TRACE: rc = observe_trace(e, c, budget, ev); break;
  case BM_SAMPLED_EVENTS: rc = observe_sampled(o, e, c, budget, ev, log); break;
  case BM_PROFILER: rc = observe_profiler(e, c, budget, ev); break;
  case BM_SEMANTIC: rc = observe_semantic(o, e, c, ev, log); break;
  default: rc = -EINVAL;
  }
  if (ev->feat) ev->feat->coverage = ev->coverage;
  ms_engine_free(e);
  if (!rc && !ev->run_ns) {  /* the run stalled (wait_all said which request) */
    ms_textbuf_printf(log, "%s: the observed run stalled\n", c->sc->name);
    rc = -ETIMEDOUT;
  }
  return rc;
}

void bench_evidence_free(struct bench_evidence *ev) {
  free(ev->step_ns);
  bench_feat_free(ev->feat);
  memset(ev, 0, sizeof *ev);
}
