/* SPDX-License-Identifier: MIT */
/* Scheduler fault injection (megascope/fault.h): the faults the counterexample
 * benchmark diagnoses, applied by the runtime code both backends share.
 *
 * Where each fault acts (the call sites are marked "fault injection" in
 * step.c, backend/cpu.c and backend/sim.c; what differs by backend goes
 * through its table, struct ms_backend_ops):
 *   slow_class, slow_request, comm_delay, slow_worker, bandwidth_steal, slow_layer
 *       a task takes longer: the simulator adds ms_fault_extra_ns to its cost; a
 *       CPU worker spins it after the body; across processes (MPI) comm_delay
 *       holds the target rank's send instead (ms_fault_before_ns), so its
 *       share arrives late over the real transport;
 *   routing_skew     the router's choice: the simulator's shape spread, or the
 *                    router kernel's output (compute mode, CPU);
 *   delayed_release  the trigger that completes an event of the class is held
 *                    (simulator: deferred; CPU: the worker spins first);
 *   queue_saturation the AOT queues are rebuilt once, at engine creation;
 *   starve_task      the JIT pop puts the task back until its time has come;
 *   late_admission   admission holds one request back, keeping its slot, until
 *                    its delay has passed.
 * The fault list is copied at creation and never written again, so workers read
 * it without synchronisation (late_admission's held request is written by the
 * admitting thread, which alone reads it). */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/runtime_impl.h"
#include "runtime/fault.h"

struct ms_faults {
  int n;
  struct ms_fault f[MS_FAULT_MAX];
  int starve[MS_FAULT_MAX][MS_MAX_BUCKETS];  /* starve_task: the task index in each bucket's plan */
  /* late_admission: the request held back, the slot kept for it, when it may
   * join, and how many requests were admitted before. The fields written while
   * the engine runs, by the admitting thread alone. */
  struct ms_request *held;
  int held_slot, admitted;
  uint64_t open_at;
};

static const char *const type_names[MS_FAULT_TYPE_COUNT] = {
    [MS_FAULT_SLOW_CLASS] = "slow_class",       [MS_FAULT_ROUTING_SKEW] = "routing_skew",
    [MS_FAULT_DELAYED_RELEASE] = "delayed_release", [MS_FAULT_QUEUE_SATURATION] = "queue_saturation",
    [MS_FAULT_COMM_DELAY] = "comm_delay",       [MS_FAULT_STARVE_TASK] = "starve_task",
    [MS_FAULT_SLOW_REQUEST] = "slow_request",   [MS_FAULT_SLOW_WORKER] = "slow_worker",
    [MS_FAULT_BANDWIDTH_STEAL] = "bandwidth_steal", [MS_FAULT_SLOW_LAYER] = "slow_layer",
    [MS_FAULT_LATE_ADMISSION] = "late_admission",
};

static const enum ms_culprit_kind culprit_of[MS_FAULT_TYPE_COUNT] = {
    [MS_FAULT_SLOW_CLASS] = MS_CULPRIT_TASK_CLASS,      [MS_FAULT_ROUTING_SKEW] = MS_CULPRIT_EXPERT,
    [MS_FAULT_DELAYED_RELEASE] = MS_CULPRIT_EVENT_CLASS, [MS_FAULT_QUEUE_SATURATION] = MS_CULPRIT_WORKER,
    [MS_FAULT_COMM_DELAY] = MS_CULPRIT_DEVICE,          [MS_FAULT_STARVE_TASK] = MS_CULPRIT_TASK_CLASS,
    [MS_FAULT_SLOW_REQUEST] = MS_CULPRIT_REQUEST,       [MS_FAULT_SLOW_WORKER] = MS_CULPRIT_WORKER,
    [MS_FAULT_BANDWIDTH_STEAL] = MS_CULPRIT_DEVICE,     [MS_FAULT_SLOW_LAYER] = MS_CULPRIT_LAYER,
    [MS_FAULT_LATE_ADMISSION] = MS_CULPRIT_REQUEST,
};

static const char *const culprit_names[MS_CULPRIT_KIND_COUNT] = {
    "none", "task_class", "event_class", "request", "worker", "device", "expert", "layer"};

const char *ms_fault_type_name(enum ms_fault_type t) {
  return (unsigned)t < MS_FAULT_TYPE_COUNT ? type_names[t] : "?";
}

int ms_fault_type_parse(const char *s, enum ms_fault_type *out) {
  for (int i = 0; i < MS_FAULT_TYPE_COUNT; i++)
    if (!strcmp(s, type_names[i])) {
      *out = (enum ms_fault_type)i;
      return 0;
    }
  return -EINVAL;
}

enum ms_culprit_kind ms_fault_culprit_kind(enum ms_fault_type t) {
  return (unsigned)t < MS_FAULT_TYPE_COUNT ? culprit_of[t] : MS_CULPRIT_NONE;
}

const char *ms_culprit_kind_name(enum ms_culprit_kind k) {
  return (unsigned)k < MS_CULPRIT_KIND_COUNT ? culprit_names[k] : "?";
}

int ms_fault_factor_is_slowdown(enum ms_fault_type t) {
  return t == MS_FAULT_SLOW_CLASS || t == MS_FAULT_SLOW_REQUEST || t == MS_FAULT_SLOW_WORKER ||
         t == MS_FAULT_BANDWIDTH_STEAL || t == MS_FAULT_SLOW_LAYER;
}

int ms_fault_uses_factor(enum ms_fault_type t) {
  return ms_fault_factor_is_slowdown(t) || t == MS_FAULT_ROUTING_SKEW || t == MS_FAULT_QUEUE_SATURATION;
}

/* ---- checking a fault against the engine's plans ---- */

static int target_bound(const struct ms_engine *e, enum ms_fault_type t) {
  const struct ms_plan *p = e->rt[0].plan;
  switch (ms_fault_culprit_kind(t)) {
  case MS_CULPRIT_TASK_CLASS: return p->n_classes;
  case MS_CULPRIT_EVENT_CLASS: return p->n_ev_classes;
  case MS_CULPRIT_REQUEST: return e->n_slots;
  case MS_CULPRIT_WORKER: return e->be->remote_tasks ? 1024 : e->n_workers;  /* remote: ms_fault_table_new checks */
  case MS_CULPRIT_DEVICE: return e->o.tp > 1 ? e->o.tp : t == MS_FAULT_BANDWIDTH_STEAL;
  case MS_CULPRIT_EXPERT: return e->m->cfg.n_experts;
  case MS_CULPRIT_LAYER: return e->m->cfg.n_layers;
  default: return 0;
  }
}

static int check_one(const struct ms_engine *e, const struct ms_fault *f, struct ms_textbuf *log) {
  const char *name = ms_fault_type_name(f->type);
  if ((unsigned)f->type >= MS_FAULT_TYPE_COUNT) {
    ms_textbuf_printf(log, "fault: unknown type %d\n", (int)f->type);
    return -EINVAL;
  }
  int bound = target_bound(e, f->type);
  if (f->target < 0 || f->target >= bound) {
    ms_textbuf_printf(log, "fault %s: target %d out of range 0..%d%s\n", name, f->target, bound - 1,
                      bound ? "" : " (this engine has none: a MoE model, tp >= 2?)");
    return -EINVAL;
  }
  int factor_ok = 1;
  if (ms_fault_factor_is_slowdown(f->type)) factor_ok = f->factor >= 1 && f->factor < 1e6;
  if (f->type == MS_FAULT_ROUTING_SKEW || f->type == MS_FAULT_QUEUE_SATURATION) factor_ok = f->factor >= 0 && f->factor <= 1;
  if (!factor_ok) {
    ms_textbuf_printf(log, "fault %s: factor %g out of range\n", name, f->factor);
    return -EINVAL;
  }
  if (f->type == MS_FAULT_STARVE_TASK) {
    const struct ms_task_class *c = &e->rt[0].plan->classes[f->target];
    if (c->launch != MS_LAUNCH_JIT) {
      ms_textbuf_printf(log, "fault starve_task: class %s is not JIT (only the scheduler's dispatch starves)\n", c->name);
      return -EINVAL;
    }
  }
  return 0;
}

/* ---- queue saturation: one worker's AOT queue takes a share of the others' ---- */

/* Deterministic share selection: task t moves when frac(t * golden) < share,
 * which spreads the moved tasks evenly over the plan. */
static int moved(int t, double share) {
  double x = (double)t * 0.6180339887498949;
  return x - floor(x) < share;
}

static int saturate(struct ms_engine *e, struct plan_rt *rt, int target, double share) {
  const struct ms_plan *p = rt->plan;
  int W = e->n_workers;
  int *owner = malloc((size_t)p->n_tasks * sizeof *owner);
  if (!owner) return -ENOMEM;
  for (int t = 0; t < p->n_tasks; t++) owner[t] = -1;
  for (int w = 0; w < W; w++)
    for (int i = 0; i < rt->aot_n[w]; i++) owner[rt->aot_q[w][i]] = w;
  /* the step start stays on worker 0, which ran its body; queues keep plan
   * order, so they stay topological and the run cannot deadlock */
  for (int t = 1; t < p->n_tasks; t++)
    if (owner[t] >= 0 && owner[t] != target && moved(t, share)) owner[t] = target;
  for (int w = 0; w < W; w++) rt->aot_n[w] = 0;
  for (int t = 0; t < p->n_tasks; t++)
    if (owner[t] >= 0) rt->aot_q[owner[t]][rt->aot_n[owner[t]]++] = t;
  free(owner);
  return 0;
}

/* starve_task: the tile-th task of the class in plan order, -1 for other faults. */
static int starved_task(const struct ms_plan *p, const struct ms_fault *f) {
  if (f->type != MS_FAULT_STARVE_TASK) return -1;
  int want = f->tile % p->classes[f->target].n_tasks;
  for (int t = 0; t < p->n_tasks; t++)
    if (p->tasks[t].cls == f->target && want-- == 0) return t;
  return -1;
}

int ms_fault_init(struct ms_engine *e, struct ms_textbuf *log) {
  if (!e->o.faults || e->o.n_faults <= 0) return 0;
  if (e->o.n_faults > MS_FAULT_MAX) {
    ms_textbuf_printf(log, "fault: %d faults, at most %d\n", e->o.n_faults, MS_FAULT_MAX);
    return -EINVAL;
  }
  struct ms_faults *fs = calloc(1, sizeof *fs);
  if (!fs) return -ENOMEM;
  for (int i = 0; i < e->o.n_faults; i++) {
    int rc = check_one(e, &e->o.faults[i], log);
    if (rc) {
      free(fs);
      return rc;
    }
    fs->f[fs->n++] = e->o.faults[i];
  }
  for (int i = 0; i < fs->n; i++)
    for (int b = 0; b < e->n_buckets; b++) fs->starve[i][b] = starved_task(e->rt[b].plan, &fs->f[i]);
  for (int i = 0; i < fs->n; i++) {
    if (fs->f[i].type != MS_FAULT_QUEUE_SATURATION) continue;
    for (int b = 0; b < e->n_buckets; b++) {
      int rc = saturate(e, &e->rt[b], fs->f[i].target, fs->f[i].factor);
      if (rc) {
        free(fs);
        return rc;
      }
    }
  }
  e->faults = fs;
  return 0;
}

void ms_fault_free(struct ms_engine *e) {
  free(e->faults);
  e->faults = NULL;
}

/* ---- a task takes longer ---- */

static int row_slot(const struct plan_rt *rt, int row) {
  return row >= 0 && row < rt->x.meta.n_rows ? rt->x.meta.row_slot[row] : -1;
}

/* Kernels that stream weights or the KV cache: what a neighbour taking the
 * device's memory bandwidth slows. */
static int streams_memory(int kernel) {
  switch (kernel) {
  case MS_K_QKV: case MS_K_ATTN: case MS_K_WO: case MS_K_SWIGLU: case MS_K_DOWN:
  case MS_K_EXPERT_UP: case MS_K_EXPERT_DOWN: case MS_K_LM_HEAD: return 1;
  default: return 0;
  }
}

uint64_t ms_fault_extra_ns(const struct ms_engine *e, const struct plan_rt *rt, int t, int worker, uint64_t base_ns) {
  const struct ms_task *k = &rt->plan->tasks[t];
  double extra = 0;
  for (int i = 0; i < e->faults->n; i++) {
    const struct ms_fault *f = &e->faults->f[i];
    switch (f->type) {
    case MS_FAULT_SLOW_CLASS:
      if (k->cls == f->target) extra += (double)base_ns * (f->factor - 1);
      break;
    case MS_FAULT_SLOW_REQUEST:
      if (k->kernel == MS_K_ATTN && row_slot(rt, k->tile[1]) == f->target) extra += (double)base_ns * (f->factor - 1);
      break;
    case MS_FAULT_COMM_DELAY:  /* across processes: ms_fault_before_ns */
      if (!e->tx && k->kernel == MS_K_COMM && k->tile[2] == f->target) extra += (double)f->delay_ns;
      break;
    case MS_FAULT_SLOW_WORKER:
      if (worker == f->target) extra += (double)base_ns * (f->factor - 1);
      break;
    case MS_FAULT_BANDWIDTH_STEAL:
      if (streams_memory(k->kernel) && worker >= 0 && ms_rt_device(e, worker) == f->target)
        extra += (double)base_ns * (f->factor - 1);
      break;
    case MS_FAULT_SLOW_LAYER:
      if (rt->plan->classes[k->cls].layer == f->target) extra += (double)base_ns * (f->factor - 1);
      break;
    default:
      break;
    }
  }
  return (uint64_t)extra;
}

uint64_t ms_fault_before_ns(const struct ms_engine *e, const struct plan_rt *rt, int t) {
  const struct ms_task *k = &rt->plan->tasks[t];
  uint64_t ns = 0;
  if (!e->tx || k->kernel != MS_K_COMM || k->tile[2] != e->rank) return 0;
  for (int i = 0; i < e->faults->n; i++)
    if (e->faults->f[i].type == MS_FAULT_COMM_DELAY && e->faults->f[i].target == e->rank) ns += e->faults->f[i].delay_ns;
  return ns;
}

/* ---- the same as tables (a backend whose SMs apply them) ---- */

void ms_fault_table_free(struct ms_fault_table *t) {
  free(t->cls);
  free(t->worker);
  free(t->release_ns);
  memset(t, 0, sizeof *t);
}

int ms_fault_on_device(enum ms_fault_type t) {
  switch (t) {
  case MS_FAULT_SLOW_CLASS:
  case MS_FAULT_SLOW_LAYER:
  case MS_FAULT_SLOW_WORKER:
  case MS_FAULT_SLOW_REQUEST:
  case MS_FAULT_DELAYED_RELEASE:
  case MS_FAULT_LATE_ADMISSION: return 1;
  default: return 0;
  }
}

int ms_fault_table_new(const struct ms_engine *e, const struct ms_plan *p, int n_workers, struct ms_fault_table *out,
                       struct ms_textbuf *log) {
  memset(out, 0, sizeof *out);
  out->slot = -1;
  out->cls = calloc((size_t)p->n_classes + 1, sizeof *out->cls);
  out->worker = calloc((size_t)n_workers + 1, sizeof *out->worker);
  out->release_ns = calloc((size_t)p->n_ev_classes + 1, sizeof *out->release_ns);
  if (!out->cls || !out->worker || !out->release_ns) {
    ms_fault_table_free(out);
    return -ENOMEM;
  }
  for (int i = 0; e->faults && i < e->faults->n; i++) {
    const struct ms_fault *f = &e->faults->f[i];
    float c = (float)(f->factor - 1);
    if (!ms_fault_on_device(f->type)) {
      ms_textbuf_printf(log, "fault: %s is not injected on this backend (task delays, delayed_release, "
                        "slow_request and late_admission are)\n", ms_fault_type_name(f->type));
      ms_fault_table_free(out);
      return -MS_E_UNSUPP;
    }
    switch (f->type) {
    case MS_FAULT_SLOW_CLASS:
      if (f->target >= 0 && f->target < p->n_classes) out->cls[f->target] += c;
      break;
    case MS_FAULT_SLOW_LAYER:
      for (int k = 0; k < p->n_classes; k++)
        if (p->classes[k].layer == f->target) out->cls[k] += c;
      break;
    case MS_FAULT_SLOW_WORKER:
      if (f->target < 0 || f->target >= n_workers) {
        ms_textbuf_printf(log, "fault: slow_worker %d: the SMs here have workers 0..%d\n", f->target, n_workers - 1);
        ms_fault_table_free(out);
        return -EINVAL;
      }
      out->worker[f->target] += c;
      break;
    case MS_FAULT_SLOW_REQUEST:
      out->slot = f->target;
      out->slot_coef += c;
      break;
    case MS_FAULT_DELAYED_RELEASE:
      if (f->target >= 0 && f->target < p->n_ev_classes) out->release_ns[f->target] += f->delay_ns;
      break;
    case MS_FAULT_LATE_ADMISSION:
      break;  /* the shared admission holds the request */
    default:
      break;  /* not on the device: refused above */
    }
  }
  return 0;
}

/* ---- a delayed dependency notification ---- */

int ms_fault_hold(struct worker *w, struct plan_rt *rt, int ev, uint64_t target, int producer) {
  struct ms_engine *e = w->e;
  for (int i = 0; i < e->faults->n; i++) {
    const struct ms_fault *f = &e->faults->f[i];
    if (f->type != MS_FAULT_DELAYED_RELEASE || rt->plan->events[ev].cls != f->target) continue;
    /* only the trigger that completes the event (on the CPU a racy guess: two
     * producers finishing together may both pass, and then neither is held) */
    if (atomic_load_explicit(&rt->counters[ev], memory_order_acquire) + 1 != target) return 0;
    if (e->o.mode == MS_MODE_PER_OP) return 0;  /* barriers, not events, order per-op mode */
    return ms_eng_defer_trigger(e, w, producer, f->delay_ns);
  }
  return 0;
}

/* ---- a starved task ---- */

int ms_fault_starved(struct ms_engine *e, struct plan_rt *rt, int t) {
  const struct ms_task *k = &rt->plan->tasks[t];
  int b = (int)(rt - e->rt);
  for (int i = 0; i < e->faults->n; i++) {
    if (e->faults->starve[i][b] != t || k->wait < 0) continue;
    const struct ms_fault *f = &e->faults->f[i];
    uint64_t ready = atomic_load_explicit(&rt->fire_ns[k->wait], memory_order_relaxed);
    uint64_t due = ready + f->delay_ns, now = ms_eng_now(e);
    if (now >= due) return 0;
    ms_eng_poll_at(e, due);  /* an idle SM must look again then */
    return 1;
  }
  return 0;
}

/* ---- a request admitted late ---- */

static const struct ms_fault *late(const struct ms_engine *e) {
  for (int i = 0; i < e->faults->n; i++)
    if (e->faults->f[i].type == MS_FAULT_LATE_ADMISSION) return &e->faults->f[i];
  return NULL;
}

int ms_fault_hold_request(struct ms_engine *e, struct ms_request *r, int slot) {
  const struct ms_fault *f = late(e);
  struct ms_faults *fs = e->faults;
  if (!f || fs->admitted++ != f->target) return 0;
  fs->held = r;
  fs->held_slot = slot;
  fs->open_at = ms_eng_now(e) + f->delay_ns;
  return 1;
}

int ms_fault_slot_reserved(const struct ms_engine *e, int slot) {
  return e->faults->held && e->faults->held_slot == slot;
}

struct ms_request *ms_fault_take_held(struct ms_engine *e) {
  struct ms_faults *fs = e->faults;
  /* with nothing else running the wait would never end on a virtual clock */
  if (ms_eng_now(e) < fs->open_at && ms_rt_active_slots(e) > 0) return NULL;
  struct ms_request *r = fs->held;
  fs->held = NULL;
  return r;
}

struct ms_request *ms_fault_drop_held(struct ms_engine *e) {
  struct ms_request *r = e->faults->held;
  e->faults->held = NULL;
  return r;
}

/* ---- MoE routing skew ---- */

int ms_fault_skewed_row(double share, int r) {
  double x = (double)(r + 1) * 0.6180339887498949;
  return x - floor(x) < share;
}

int ms_fault_skew_moves(double share, int rows, int n_experts, int top_k, int hot) {
  int n = 0;
  for (int r = 0; r < rows && n_experts > 0; r++) {
    int has_hot = 0;
    for (int j = 0; j < top_k; j++) has_hot |= (r + j) % n_experts == hot;
    n += !has_hot && ms_fault_skewed_row(share, r);
  }
  return n;
}

static const struct ms_fault *skew(const struct ms_engine *e) {
  for (int i = 0; i < e->faults->n; i++)
    if (e->faults->f[i].type == MS_FAULT_ROUTING_SKEW) return &e->faults->f[i];
  return NULL;
}

/* The shape spread (row r takes experts r .. r+k-1 mod E), a skewed row
 * trading its last choice for the hot expert when it lacks it (another fault on
 * a MoE model: the plain spread). */
int ms_fault_routed(const struct ms_engine *e, const struct plan_rt *rt, int expert) {
  const struct ms_model_config *c = &e->m->cfg;
  const struct ms_fault *f = skew(e);
  int n = 0;
  for (int r = 0; r < rt->x.meta.n_rows; r++) {
    if (rt->x.meta.row_slot[r] < 0) continue;
    int has_hot = 0, picks = 0;
    for (int j = 0; f && j < c->top_k; j++) has_hot |= (r + j) % c->n_experts == f->target;
    for (int j = 0; j < c->top_k; j++) {
      int x = (r + j) % c->n_experts;
      if (f && j == c->top_k - 1 && !has_hot && ms_fault_skewed_row(f->factor, r)) x = f->target;
      picks |= x == expert;
    }
    n += picks;
  }
  return n;
}

void ms_fault_route_row(struct ms_engine *e, struct plan_rt *rt, int t) {
  const struct ms_fault *f = skew(e);
  const struct ms_task *k = &rt->plan->tasks[t];
  const struct ms_task_class *cl = &rt->plan->classes[k->cls];
  int r = k->tile[1], K = e->m->cfg.top_k;
  if (!f || row_slot(rt, r) < 0 || !ms_fault_skewed_row(f->factor, r)) return;
  int32_t *ids = (int32_t *)ms_buf_row(&rt->x, cl->out, 0, r);  /* [k ids | k weights] */
  for (int j = 0; j < K; j++)
    if (ids[j] == f->target) return;
  ids[K - 1] = f->target;
}
