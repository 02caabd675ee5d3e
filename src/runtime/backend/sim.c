/* SPDX-License-Identifier: MIT */
/* The sim backend: a deterministic virtual GPU.
 *
 * DESIGN
 * Who runs what. One thread drives every virtual SM through a discrete-event
 * loop over a virtual clock (ns). It runs the same code as the CPU backend for
 * everything that is not time: the step start (admission, batching, KV pages,
 * plan choice), the plan's per-worker AOT queues, the event counters and their
 * generations, the JIT queues, hook sites and telemetry (ms_rt_* in step.c).
 * The shared code reaches it through ms_backend_sim: the clock, fired (wake the
 * event's waiting SMs after the notification latency), and the two faults that
 * need the event loop (defer_trigger, poll_at).
 * What differs is only when things happen: a task starts when its SM is free and
 * its event has fired (plus the dispatch and notification latencies), and ends
 * after the time the cost model gives it. Workers are the SMs: hook contexts and
 * per-worker maps see one worker per SM.
 * Determinism. Events are ordered by (time, sequence number); the SMs pick work
 * in a fixed order; nothing depends on the host's timing, so a seed gives the
 * same run every time.
 * Modes. compute: the kernels run at each task's simulated start (results checked
 * against the reference like the CPU backend); shapes only: no kernels, no KV
 * cache, for models too large to hold.
 * Shutdown: as the CPU backend's worker 0 (a stop step ends the loop). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "core/event.h"
#include "runtime/runtime_impl.h"
#include "runtime/fault.h"
#include "runtime/work.h"

const char *const ms_sim_preset_names[] = {"a100", "h100", "h200", "b200", NULL};

int ms_sim_preset(const char *name, struct ms_sim_params *p) {
  /* Latencies common to all: what MPK-style persistent kernels pay per task
   * (queue fetch + descriptor load ~1 us), per event (a global-memory counter seen
   * by a spinning SM ~0.5 us), per JIT dispatch (a scheduler warp ~1 us). */
  *p = (struct ms_sim_params){.task_fixed_ns = 1000, .dispatch_ns = 300, .notify_ns = 500, .jit_ns = 1000,
                              .step_ns = 5000, .launch_ns = 4000, .link_latency_ns = 2000};
  if (!strcmp(name, "a100")) {
    p->n_sms = 108;
    p->hbm_gbps = 1555;  /* A100 40GB SXM */
    p->tflops = 312;
    p->link_gbps = 300;  /* NVLink 3, per direction */
  } else if (!strcmp(name, "h100")) {
    p->n_sms = 132;
    p->hbm_gbps = 3350;  /* H100 SXM */
    p->tflops = 989;
    p->link_gbps = 450;  /* NVLink 4, per direction */
  } else if (!strcmp(name, "h200")) {
    p->n_sms = 132;
    p->hbm_gbps = 4800;
    p->tflops = 989;
    p->link_gbps = 450;
  } else if (!strcmp(name, "b200")) {
    p->n_sms = 148;
    p->hbm_gbps = 8000;
    p->tflops = 2250;
    p->link_gbps = 900;  /* NVLink 5, per direction */
  } else {
    return -ENOENT;
  }
  return 0;
}

/* Every field of struct ms_sim_params by name, for ms_sim_param_set. */
#define SIM_PARAMS(X)                                                                                  \
  X(hbm_gbps) X(tflops) X(task_fixed_ns) X(dispatch_ns) X(notify_ns) X(jit_ns) X(step_ns) X(launch_ns) \
  X(jitter) X(link_gbps) X(link_latency_ns)
#define SIM_NAME(f) #f,
const char *const ms_sim_param_names[] = {"n_sms", "compute", SIM_PARAMS(SIM_NAME) NULL};

int ms_sim_param_set(struct ms_sim_params *p, const char *name, const char *value) {
  char *end;
  double v = strtod(value, &end);
  if (end == value || *end || !(v >= 0) || v > 1e12) return -EINVAL;
  if (!strcmp(name, "n_sms") || !strcmp(name, "compute")) {
    if (v != (double)(int)v || (!strcmp(name, "n_sms") && (v < 1 || v > 1024))) return -EINVAL;
    *(!strcmp(name, "n_sms") ? &p->n_sms : &p->compute) = (int)v;
    return 0;
  }
#define SIM_SET(f)            \
  if (!strcmp(name, #f)) {    \
    p->f = v;                 \
    return 0;                 \
  }
  SIM_PARAMS(SIM_SET)
#undef SIM_SET
  return -ENOENT;
}

enum { SM_IDLE = 0, SM_RUNNING = 1, SM_WAITING = 2 };
/* EV_TRIGGER, EV_POLL: fault injection (a held trigger counts; idle SMs look again) */
enum { EV_WAKE = 0, EV_END = 1, EV_TRIGGER = 2, EV_POLL = 3 };

struct sim_event {
  uint64_t t, seq;
  int kind, sm, task;
};

struct sim_sm {
  int state;
  int qpos;           /* next entry of its AOT queue (or per-op queue) */
  int task;           /* running task */
  uint64_t t0;        /* its start */
  uint64_t wait_from; /* when it began waiting */
  int wait_ev;        /* event it waits on, -1: the step's end or JIT work */
  int hooked;         /* dep_wait fired for the current head */
  int next_waiter;    /* in its event's waiter list */
  int listed_ev;      /* the event whose waiter list holds it, -1: none */
  int wake_pending;   /* a WAKE is queued */
};

struct ms_sim {
  struct ms_engine *e;
  struct ms_sim_params p;
  pthread_t th;
  _Atomic uint64_t clock;  /* the virtual clock, ns: written by the thread, read by any (relaxed: a reading) */
  struct sim_event *heap;
  size_t n_heap, cap_heap;
  uint64_t seq;
  struct sim_sm *sm;
  int *waiters;       /* [n_events of the largest plan] first waiting SM, -1 */
  int n_waiters;
  int step_done;
  struct plan_rt *rt;
  uint64_t gen;
  /* the PC-sampling analog (ms_sim_sampler): every SM every period */
  void (*sample_fn)(void *user, int sm, int kernel);
  void *sample_user;
  uint64_t sample_period, sample_next;
};

/* ---- the event heap: (t, seq) order ---- */

static int before(const struct sim_event *a, const struct sim_event *b) {
  return a->t != b->t ? a->t < b->t : a->seq < b->seq;
}

static void push(struct ms_sim *s, uint64_t t, int kind, int sm, int task) {
  if (s->n_heap == s->cap_heap) {
    size_t cap = s->cap_heap ? s->cap_heap * 2 : 1024;
    struct sim_event *h = realloc(s->heap, cap * sizeof *h);
    MS_ASSERT(h != NULL);
    s->heap = h;
    s->cap_heap = cap;
  }
  size_t i = s->n_heap++;
  s->heap[i] = (struct sim_event){t, s->seq++, kind, sm, task};
  while (i && before(&s->heap[i], &s->heap[(i - 1) / 2])) {
    struct sim_event tmp = s->heap[i];
    s->heap[i] = s->heap[(i - 1) / 2];
    s->heap[(i - 1) / 2] = tmp;
    i = (i - 1) / 2;
  }
}

static struct sim_event pop(struct ms_sim *s) {
  struct sim_event top = s->heap[0];
  s->heap[0] = s->heap[--s->n_heap];
  for (size_t i = 0;;) {
    size_t l = 2 * i + 1, r = l + 1, m = i;
    if (l < s->n_heap && before(&s->heap[l], &s->heap[m])) m = l;
    if (r < s->n_heap && before(&s->heap[r], &s->heap[m])) m = r;
    if (m == i) break;
    struct sim_event tmp = s->heap[i];
    s->heap[i] = s->heap[m];
    s->heap[m] = tmp;
    i = m;
  }
  return top;
}

static uint64_t now(struct ms_sim *s) { return atomic_load_explicit(&s->clock, memory_order_relaxed); }

static void set_now(struct ms_sim *s, uint64_t t) { atomic_store_explicit(&s->clock, t, memory_order_relaxed); }

static void wake(struct ms_sim *s, int sm, uint64_t at) {
  if (s->sm[sm].wake_pending) return;
  s->sm[sm].wake_pending = 1;
  push(s, at, EV_WAKE, sm, -1);
}

/* ---- the cost model ---- */

static double weight_row_bytes(const struct ms_weight *w) {
  return w ? (double)ms_weight_row_bytes(w) : 0;
}

/* A task's jitter: a factor in [1 - jitter, 1 + jitter] from the seed, the plan's
 * generation and the task (splitmix64), the same on every run. */
static double jitter(const struct ms_sim *s, uint64_t gen, int t) {
  uint64_t x = s->e->o.seed * 0x9e3779b97f4a7c15ull ^ gen * 0xbf58476d1ce4e5b9ull ^ (uint64_t)t * 0x94d049bb133111ebull;
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return 1 + s->p.jitter * (2 * ((double)(x >> 11) / 9007199254740992.0) - 1);
}

/* Simulated duration of task t: fixed + max(bytes / per-SM bandwidth, flops / per-SM throughput). */
static uint64_t cost(struct ms_sim *s, const struct plan_rt *rt, int t, int sm) {
  const struct ms_engine *e = s->e;
  const struct ms_plan *p = rt->plan;
  const struct ms_task *k = &p->tasks[t];
  const struct ms_task_class *cl = &p->classes[k->cls];
  const struct ms_model_config *c = &e->m->cfg;
  double bytes = 0, flops = 0, B = p->batch;
  int c0 = k->tile[0] * cl->tile, c1 = c0 + cl->tile < cl->n_out ? c0 + cl->tile : cl->n_out;
  double rows = c1 > c0 ? c1 - c0 : 0;
  /* bytes per element, block types included (a row's bytes over its columns) */
  double elt = (double)ms_dtype_row_bytes(c->dtype, 256) / 256.0;
  const struct ms_weight *const *w = rt->x.cls_w[k->cls];
  switch (k->kernel) {
  case MS_K_QKV:
  case MS_K_WO:
  case MS_K_DOWN:
  case MS_K_LM_HEAD:
    bytes = rows * weight_row_bytes(w[0]) + B * (weight_row_bytes(w[0]) / elt + rows) * 4;
    flops = 2 * rows * (w[0] ? w[0]->cols : 0) * B;
    break;
  case MS_K_SWIGLU:
    bytes = rows * (weight_row_bytes(w[0]) + weight_row_bytes(w[1]));
    flops = 4 * rows * (w[0] ? w[0]->cols : 0) * B;
    break;
  case MS_K_EXPERT_UP:
  case MS_K_EXPERT_DOWN: {
    int n = ms_rt_routed(e, rt, cl, k->tile[2]);  /* as the hooks' work_rows */
    if (n) {
      double cols = k->kernel == MS_K_EXPERT_UP ? c->dim : c->expert_ffn_dim;
      /* the weight tile once, and each routed row's activations in and out (as the dense GEMVs) */
      bytes = rows * cols * elt * (k->kernel == MS_K_EXPERT_UP ? 2 : 1) + n * (cols + rows) * 4;
      flops = 2 * rows * cols * n * (k->kernel == MS_K_EXPERT_UP ? 2 : 1);
    }
    break;
  }
  case MS_K_COMM: {
    /* one device's share of an all-gather: its columns of every row to each of
     * the other devices over its link (f32 activations) */
    int D = e->o.tp > 1 ? e->o.tp : 1;
    double share = (double)cl->n_out / D * B * 4 * (D - 1);
    double d = s->p.link_latency_ns + (s->p.link_gbps > 0 ? share / s->p.link_gbps : 0);
    if (e->faults) d += (double)ms_fault_extra_ns(e, rt, t, sm, (uint64_t)d);  /* fault injection (comm_delay) */
    return (uint64_t)d;
  }
  case MS_K_ATTN: {
    int r = k->tile[1];
    double ctx = r < rt->x.meta.n_rows && rt->x.meta.row_slot[r] >= 0 ? rt->x.meta.row_pos[r] + 1 : 0;
    double group = (double)c->n_heads / c->n_kv_heads;
    bytes = ctx * 2 * c->head_dim * elt + group * c->head_dim * 8;
    flops = 4 * group * c->head_dim * ctx;
    break;
  }
  case MS_K_STEP_START:
    return (uint64_t)s->p.step_ns;
  case MS_K_EMPTY:
    break;
  default: /* norms, rope, router, combine, embed, sample: activations only */
    bytes = (k->tile[1] >= 0 ? 1 : B) * (cl->n_out > 0 ? cl->n_out : c->dim) * 4 * 2;
    flops = bytes;
  }
  double bw = s->p.hbm_gbps / s->p.n_sms;          /* bytes per ns per SM */
  double fl = s->p.tflops * 1e3 / s->p.n_sms;      /* flops per ns per SM */
  double tm = bytes / bw, tc = flops / fl;
  uint64_t d = (uint64_t)((s->p.task_fixed_ns + (tm > tc ? tm : tc)) * (s->p.jitter > 0 ? jitter(s, s->gen, t) : 1));
  if (e->faults) d += ms_fault_extra_ns(e, rt, t, sm, d);  /* fault injection (slow_class, slow_request, ...) */
  if (rt->delay_ns && rt->delay_ns[t]) d += rt->delay_ns[t];
  return d;
}

/* ---- running a step (megakernel mode) ---- */

static int fired(const struct plan_rt *rt, int ev, uint64_t gen) {
  return atomic_load_explicit(&rt->counters[ev], memory_order_relaxed) >=
         ms_event_target(&rt->plan->events[ev], gen);
}

static void start_task(struct ms_sim *s, int sm, int t, int jit) {
  struct ms_engine *e = s->e;
  struct worker *w = &e->workers[sm];
  struct sim_sm *st = &s->sm[sm];
  uint64_t at = now(s);
  w->wait_ns = st->state == SM_WAITING ? at - st->wait_from : 0;
  st->state = SM_RUNNING;
  st->task = t;
  st->hooked = 0;
  st->t0 = ms_rt_task_start(w, s->rt, t, s->gen);
  ms_rt_task_body(w, s->rt, t);
  push(s, at + cost(s, s->rt, t, sm) + (jit ? (uint64_t)s->p.jit_ns : 0), EV_END, sm, t);
}

static void add_waiter(struct ms_sim *s, int sm, int ev) {
  struct sim_sm *st = &s->sm[sm];
  if (st->state != SM_WAITING) st->wait_from = now(s);
  st->state = SM_WAITING;
  st->wait_ev = ev;
  if (ev >= 0 && st->listed_ev != ev) {  /* once per list: a woken SM may wait again */
    st->next_waiter = s->waiters[ev];
    s->waiters[ev] = sm;
    st->listed_ev = ev;
  }
}

/* An SM with nothing running picks its next work: its AOT head when that task's
 * event has fired, else a ready JIT task, else it waits (like a CPU worker). */
static void sm_next(struct ms_sim *s, int sm) {
  struct sim_sm *st = &s->sm[sm];
  struct plan_rt *rt = s->rt;
  const struct ms_plan *p = rt->plan;
  int w = sm, head = st->qpos < rt->aot_n[w] ? rt->aot_q[w][st->qpos] : -1;
  if (head >= 0 && (p->tasks[head].wait < 0 || fired(rt, p->tasks[head].wait, s->gen))) {
    st->qpos++;
    start_task(s, sm, head, 0);
    return;
  }
  int64_t j;
  if (ms_rt_jit_pop(s->e, rt, &j) == 0) {
    start_task(s, sm, (int)j, 1);
    return;
  }
  int first = st->state != SM_WAITING || !st->hooked;
  add_waiter(s, sm, head >= 0 ? p->tasks[head].wait : -1);
  if (first) {
    /* the dep_wait hook once per head, as a CPU worker fires it */
    st->hooked = 1;
    ms_rt_dep_wait(&s->e->workers[sm], rt, head, s->gen, head >= 0 ? p->tasks[head].wait : p->end_event);
  }
}

/* Called by the shared trigger when event ev fired: wake its waiters after the
 * notification latency, and enough idle SMs for the JIT tasks it released. */
static void sim_fired(void *ctx, struct plan_rt *rt, int ev) {
  struct ms_sim *s = ctx;
  uint64_t at = now(s) + (uint64_t)s->p.notify_ns;
  for (int sm = s->waiters[ev]; sm >= 0;) {
    int next = s->sm[sm].next_waiter;
    s->sm[sm].listed_ev = -1;
    if (s->sm[sm].state == SM_WAITING && s->sm[sm].wait_ev == ev) wake(s, sm, at);
    sm = next;
  }
  s->waiters[ev] = -1;
  const struct ms_event *E = &rt->plan->events[ev];
  int jit = 0;
  for (int t = E->first; t <= E->last; t++) jit += rt->plan->tasks[t].launch == MS_LAUNCH_JIT;
  for (int sm = 0; sm < s->e->n_workers && jit > 0; sm++)
    if (s->sm[sm].state == SM_WAITING && !s->sm[sm].wake_pending) {
      wake(s, sm, at + (uint64_t)s->p.dispatch_ns);
      jit--;
    }
  if (ev == rt->plan->end_event) s->step_done = 1;
}

/* What every SM does at a sample time: the kernel of the task it runs, -1 in
 * the scheduler's wait loop, -2 between tasks. No task identity, as a PC sample. */
static void sample_sms(struct ms_sim *s, uint64_t upto) {
  while (s->sample_next <= upto) {
    for (int sm = 0; sm < s->e->n_workers; sm++) {
      const struct sim_sm *st = &s->sm[sm];
      int k = st->state == SM_RUNNING ? s->rt->plan->tasks[st->task].kernel : st->state == SM_WAITING ? -1 : -2;
      s->sample_fn(s->sample_user, sm, k);
    }
    s->sample_next += s->sample_period;
  }
}

void ms_sim_sampler(struct ms_engine *e, uint64_t period_ns, void (*fn)(void *user, int sm, int kernel), void *user) {
  MS_ASSERT(e->be == &ms_backend_sim && e->be_ctx);
  struct ms_sim *s = e->be_ctx;
  s->sample_fn = fn;
  s->sample_user = user;
  s->sample_period = period_ns ? period_ns : 1000;
  s->sample_next = now(s) + s->sample_period;
}

/* delayed_release: the trigger counts at now + delay, while its SM moves on. */
static int sim_defer_trigger(void *ctx, struct worker *w, int producer, uint64_t delay_ns) {
  struct ms_sim *s = ctx;
  push(s, now(s) + delay_ns, EV_TRIGGER, w->id, producer);
  return 1;
}

/* starve_task: an idle SM is woken when the held task is due. */
static void sim_poll_at(void *ctx, uint64_t at) { push(ctx, at, EV_POLL, -1, -1); }

static void run_step_mk(struct ms_sim *s) {
  struct ms_engine *e = s->e;
  uint64_t t = now(s);
  for (int sm = 0; sm < e->n_workers; sm++) {
    s->sm[sm] = (struct sim_sm){.state = SM_IDLE, .task = -1, .wait_ev = -1, .next_waiter = -1, .listed_ev = -1};
    wake(s, sm, t + (uint64_t)s->p.dispatch_ns);
  }
  for (int ev = 0; ev < s->n_waiters; ev++) s->waiters[ev] = -1;
  s->step_done = 0;
  while (s->n_heap) {
    struct sim_event x = pop(s);
    if (s->sample_fn) sample_sms(s, x.t);  /* the states held until this event */
    set_now(s, x.t);
    if (x.kind == EV_TRIGGER) {  /* fault injection: a held trigger counts now */
      ms_rt_trigger_now(&e->workers[x.sm], s->rt, s->rt->plan->tasks[x.task].trigger, s->gen, x.task);
      continue;
    }
    if (x.kind == EV_POLL) {  /* fault injection: a starved task's time has come */
      for (int sm = 0; sm < e->n_workers; sm++)
        if (s->sm[sm].state == SM_WAITING && !s->sm[sm].wake_pending) {
          wake(s, sm, x.t);
          break;
        }
      continue;
    }
    struct sim_sm *st = &s->sm[x.sm];
    if (x.kind == EV_WAKE) {
      st->wake_pending = 0;
      if (st->state != SM_RUNNING) sm_next(s, x.sm);
      continue;
    }
    /* EV_END: the shared finish triggers the task's event (and maybe fires it) */
    st->state = SM_IDLE;
    ms_rt_task_finish(&e->workers[x.sm], s->rt, x.task, s->gen, st->t0);
    wake(s, x.sm, x.t + (uint64_t)s->p.dispatch_ns);
    if (s->step_done) {
      /* drain: SMs still running finish; nothing else waits in this step */
      while (s->n_heap) {
        struct sim_event y = pop(s);
        if (y.kind == EV_END) {
          set_now(s, y.t);
          ms_rt_task_finish(&e->workers[y.sm], s->rt, y.task, s->gen, s->sm[y.sm].t0);
        }
      }
    }
  }
  for (int sm = 0; sm < e->n_workers; sm++) atomic_store(&e->workers[sm].waiting, -1);
}

/* ---- per-op mode: every operator a kernel, a launch gap between them ---- */

static void run_step_per_op(struct ms_sim *s) {
  struct ms_engine *e = s->e;
  struct plan_rt *rt = s->rt;
  uint64_t stage_start = now(s);
  int *pos = calloc((size_t)e->n_workers, sizeof *pos);
  MS_ASSERT(pos != NULL);
  for (int st = 0; st < rt->n_stages; st++) {
    uint64_t stage_end = stage_start;
    int any = 0;
    for (int sm = 0; sm < e->n_workers; sm++) {
      uint64_t t = stage_start;
      for (; pos[sm] < rt->op_end[sm][st]; pos[sm]++) {
        int task = rt->op_q[sm][pos[sm]];
        set_now(s, t);
        uint64_t t0 = ms_rt_task_start(&e->workers[sm], rt, task, s->gen);
        ms_rt_task_body(&e->workers[sm], rt, task);
        t += cost(s, rt, task, sm);
        set_now(s, t);
        ms_rt_task_finish(&e->workers[sm], rt, task, s->gen, t0);
        any = 1;
      }
      if (t > stage_end) stage_end = t;
    }
    stage_start = stage_end + (any ? (uint64_t)s->p.launch_ns : 0);
  }
  set_now(s, stage_start);
  free(pos);
}

static void *sim_main(void *arg) {
  struct ms_sim *s = arg;
  struct ms_engine *e = s->e;
  for (;;) {
    ms_rt_step_end(e);
    if (!ms_rt_step_begin(e)) break;
    s->rt = atomic_load_explicit(&e->cur, memory_order_relaxed);
    s->gen = atomic_load_explicit(&e->cur_gen, memory_order_relaxed);
    uint64_t step = atomic_load_explicit(&e->cur_step, memory_order_relaxed);
    for (int i = 0; i < e->n_workers; i++) {  /* what each SM's task hooks report */
      e->workers[i].step = step;
      e->workers[i].rows = s->rt->x.meta.n_rows;
    }
    if (e->o.mode == MS_MODE_PER_OP)
      run_step_per_op(s);
    else
      run_step_mk(s);
  }
  return NULL;
}

/* ---- the table ---- */

static void sim_defaults(struct ms_engine_opts *o) {
  o->max_batched_tokens = 0;  /* the simulator's figures are of decode steps */
  if (o->sim.n_sms <= 0) ms_sim_preset(MS_SIM_DEFAULT_GPU, &o->sim);
  o->n_workers = o->sim.n_sms * (o->tp > 1 ? o->tp : 1);  /* each device its own SMs */
  if (!o->tiles_per_op && !o->tile_rows) o->tiles_per_op = o->sim.n_sms;
  o->watchdog_ms = 0;  /* virtual time: nothing stalls in real time */
}

static int sim_shape_only(const struct ms_engine_opts *o) { return !o->sim.compute; }

static uint64_t sim_now(const void *ctx) {
  return atomic_load_explicit(&((struct ms_sim *)ctx)->clock, memory_order_relaxed);
}

/* The thread that published the step runs it: nothing to hand over. */
static void sim_publish_step(void *ctx) { (void)ctx; }

static void sim_free(struct ms_sim *s) {
  free(s->heap);
  free(s->sm);
  free(s->waiters);
  free(s);
}

static int sim_start(struct ms_engine *e, struct ms_textbuf *log) {
  (void)log;
  struct ms_sim *s = calloc(1, sizeof *s);
  if (!s) return -ENOMEM;
  s->e = e;
  s->p = e->o.sim;
  if (s->p.n_sms <= 0 || !(s->p.hbm_gbps > 0) || !(s->p.tflops > 0)) {
    free(s);
    return -EINVAL;
  }
  s->sm = calloc((size_t)e->n_workers, sizeof *s->sm);
  for (int i = 0; i < e->n_buckets; i++)
    if (e->rt[i].plan->n_events > s->n_waiters) s->n_waiters = e->rt[i].plan->n_events;
  s->waiters = malloc((size_t)s->n_waiters * sizeof *s->waiters);
  if (!s->sm || !s->waiters) goto fail;
  for (int i = 0; i < s->n_waiters; i++) s->waiters[i] = -1;
  e->be_ctx = s;  /* before the thread runs: the clock is read through it */
  if (pthread_create(&s->th, NULL, sim_main, s)) {
    e->be_ctx = NULL;
    goto fail;
  }
  return 0;
fail:
  sim_free(s);
  return -ENOMEM;
}

static void sim_stop(struct ms_engine *e) {
  struct ms_sim *s = e->be_ctx;
  pthread_join(s->th, NULL);
  e->be_ctx = NULL;
  sim_free(s);
}

const struct ms_backend_ops ms_backend_sim = {
    .info = {.name = "sim", .label = "simulator", .virtual_clock = 1, .cost_model = 1, .tiles_per_worker = 1,
             .q8_activations = 1, .prefix_cache = 1, .attn_parts_max = MS_ATTN_MAX_PARTS},
    .defaults = sim_defaults,
    .shape_only = sim_shape_only,
    .start = sim_start,
    .stop = sim_stop,
    .now = sim_now,
    .publish_step = sim_publish_step,
    .fired = sim_fired,
    .defer_trigger = sim_defer_trigger,
    .poll_at = sim_poll_at,
};
