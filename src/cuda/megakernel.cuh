/* SPDX-License-Identifier: MIT */
/* The persistent kernel: the plan's decode loop as one cooperative launch of one
 * CTA per SM (private to src/cuda; included by engine.cu only).
 *
 * DESIGN
 * Roles. CTA 0 is the scheduler: at each step start it retires finished requests,
 * admits new ones from host-mapped memory into free slots (a slot is a batch
 * row), writes the batch metadata and publishes the step; it then dispatches JIT
 * tasks as their events fire, and after the step's end event it does the
 * per-row bookkeeping (prompt position or emitted token). CTAs 1..n are workers:
 * worker w = CTA w + 1.
 * Queues. AOT tasks are placed round-robin in plan order on per-worker lists at
 * upload (cuda/layout.h; so each list is in topological order); JIT tasks are
 * pushed by the scheduler into per-worker rings in global memory, round-robin
 * (a full ring is counted and skipped, and the push retried; ring heads are
 * cached and re-read only when a ring looks deep), in the order of their
 * sched_hint priority when a hint program is attached. A worker takes JIT work
 * before its next AOT task, but never a ring entry once its step's end event
 * has fired: that entry is the next step's.
 * Events. counters[e] counts triggers since launch and is never reset: the step
 * of generation g has fired e once counters[e] >= needed * (g + 1). A producer
 * adds with acq_rel at GPU scope after a CTA barrier (every thread's output
 * written before it); the last producer of an event with JIT successors puts the
 * event on the scheduler's fired ring (release). Consumers spin with
 * ld.acquire.gpu on thread 0, then fence and barrier before reading.
 * Waiting. A worker whose next AOT task is not ready runs JIT work from its ring
 * if any; otherwise it prefetches that task's weights into L2 once and spins.
 * Heartbeat. Thread 0 of every CTA writes to host-mapped memory what it runs,
 * what it waits for (a task and its event, or the step's end event) and since
 * when, and the tasks it finished, as they change; {beats, step, since} at most
 * every MSD_BEAT_NS. The host's watchdog reads it: no beat for watchdog_ms is
 * a dead CTA; no task finished for watchdog_ms while a CTA spins on one event
 * is a stuck event, named with its count and the producers that have not
 * triggered it (done_gen). Every spin beats, and once a beat period a CTA
 * reads the host's abort word: set, every CTA returns (the watchdog's way out
 * of a hang it reported).
 * Hooks. Each site is "if (h && msd_hook_armed(h, hook))": with hooks_off the
 * pointer is NULL and the sites cost a register test.
 * Exit. When the host has set exit_when_idle and every submitted request is done,
 * the scheduler publishes MSD_SEQ_EXIT and every CTA returns. */
#ifndef MS_CUDA_MEGAKERNEL_CUH
#define MS_CUDA_MEGAKERNEL_CUH

#include <stdint.h>

#ifdef MSD_HOST_EMU
/* compiled for the CPU by a test (cuda/host_emu.h): the includer supplies the
 * task bodies and the hook functions */
#include "cuda/dev.h"
#include "megascope/base.h"
#else
#include "cuda/bpf_dev.cuh"
#include "cuda/dev.h"
#include "cuda/ops.cuh"
#endif
#include "core/atomics.h"      /* one vocabulary of atomics, the interpreter's and the maps' */
#include "core/ctx_fill.h"  /* the context's plan fields, as the CPU engines fill them */

#define MSD_SEQ_EXIT 0xffffffffu
#define MSD_BEAT_NS 50000ull          /* heartbeat period (host-mapped writes) */
#define MSD_QUEUE_THRESHOLD 64        /* queue_pressure, as on the CPU */

/* One request as the host hands it over (host-mapped; written before n_submitted). */
struct msd_hreq {
  int32_t n_prompt, max_new;
  int32_t prompt_off, out_off;  /* into the prompt and token pools */
  int64_t logits_off;           /* into the device logits record, -1: none */
  int32_t stop_eos;             /* finish on the model's eos token */
  volatile int32_t n_tokens;    /* device: tokens emitted so far */
  volatile int32_t done;
  volatile uint64_t t_admit, t_first, t_done;  /* device: %globaltimer */
};

/* Host-mapped control block. */
struct msd_host {
  volatile uint32_t n_submitted;     /* host: requests published (after their records) */
  volatile uint32_t exit_when_idle;  /* host: return once every submitted request is done */
  volatile uint32_t n_finished;      /* device */
  volatile uint32_t exited;          /* device: the scheduler published the exit */
  volatile uint64_t steps, positions, tokens, queue_full;
  volatile uint64_t t_start, t_end;  /* %globaltimer at launch and exit */
  volatile uint32_t abort;           /* host: every CTA returns (read once a beat period) */
};

/* Per-CTA heartbeat (host-mapped), device clock. */
struct msd_beat {
  volatile uint64_t beats, step, since;  /* since: the last beat */
  volatile int32_t running, waiting;     /* task, -1: none */
  volatile int32_t wait_ev;              /* the event it spins on, -1: none */
  volatile int32_t pad0;
  volatile uint64_t wait_since;          /* when that wait began */
  volatile uint64_t done;                /* tasks it finished */
  uint64_t pad[1];
};

#define MSD_MAX_SLOTS 256

/* Fed mode (the engine's CUDA backend, src/runtime/backend/cuda.c): the host's
 * step machine admits, batches and keeps the requests; the kernel runs the
 * steps it is handed and draws their tokens. A row of a fed step is
 * cuda/dev.h's struct msd_feed_row (pages are given as positions are first
 * reached, so the page table of a slot is complete up to its position). */

/* A request event of the host's step machine (admitted, a token sampled,
 * finished), for the device's request hook: phase as enum ms_req_phase. */
struct msd_feed_event {
  int32_t phase, slot, token;
  uint32_t gen;
  uint64_t step;                    /* the engine step it happened in */
};
#define MSD_FEED_EVENTS (3 * MSD_MAX_SLOTS)

/* A fed step as the host lays it out: copied into device memory, and complete
 * there, before the host moves msd_feed.seq. rows 0: events only. */
struct msd_feed_step {
  uint64_t step;                    /* the engine's step number */
  int32_t rows;                     /* rows laid out (the host plan's bucket); past them padding */
  int32_t n_events;
  int32_t trace;                    /* 1: the workers record the step's tasks (msd_rt.trace) */
  struct msd_feed_event ev[MSD_FEED_EVENTS];
  struct msd_feed_row row[MSD_MAX_SLOTS];
};

/* The fed mode's handshake (host-mapped; the host's half, the steps handed
 * over, is msd_rt.feed_seq in device memory). */
struct msd_feed {
  volatile uint32_t done;           /* device: handovers done (a step's end event fired: its tokens written) */
  volatile uint32_t pad;
  volatile uint64_t t_seen;         /* device: its clock as it saw the last handover */
  volatile uint64_t t_done;         /* device: its clock as it moved done (the host's clock offset) */
};

/* One task of a traced step (host-mapped, per worker a ring of trace_cap):
 * device clock; ready is when its event fired (the step start for a task
 * that waits on none). */
struct msd_trace_rec {
  uint64_t t_begin, t_end, t_ready, step;
  uint32_t task, wait_ns;
  uint32_t fired, pad;              /* fired: its trigger completed its event */
};

/* The scheduler's view of the JIT rings: it alone pushes, so it owns the tails;
 * heads are cached and re-read only when a ring looks full or deep (an L2 round
 * trip per worker per dispatch would cost more than the tasks it places). */
struct msd_rings {
  uint32_t tail[1024], head[1024];
  int rr;
};

/* The scheduler's state (device memory; CTA 0 thread 0 only). Counters are kept
 * here and copied to the host-mapped block with plain stores. */
struct msd_sched {
  uint64_t queue_full, n_finished, tokens, steps, positions;
  uint32_t next_req;
  /* per slot (= batch row): the request, its position, its record cached */
  int32_t slot_req[MSD_MAX_SLOTS], slot_pos[MSD_MAX_SLOTS], slot_fin[MSD_MAX_SLOTS];
  int32_t slot_next[MSD_MAX_SLOTS];   /* the token the last step sampled */
  int32_t slot_nprompt[MSD_MAX_SLOTS], slot_maxnew[MSD_MAX_SLOTS];
  int32_t slot_poff[MSD_MAX_SLOTS], slot_ooff[MSD_MAX_SLOTS];
  int64_t slot_loff[MSD_MAX_SLOTS];
  int32_t slot_stop[MSD_MAX_SLOTS];   /* stop at eos */
  uint32_t slot_gen[MSD_MAX_SLOTS];
  struct msd_rings rings;             /* in global memory, not the kernel's stack frame */
  /* A seqlock over the batch layout (row_slot, row_pos, slot_gen): odd while the
   * step start writes it. A task_ready hook runs after its event's trigger and
   * can overlap the next step start; it keeps the row fields only when it read
   * them inside one even layout of its own step. */
  uint32_t layout_seq;
  uint64_t layout_step;
  uint32_t tracing;                   /* fed mode: the published step is traced */
};

/* The runtime's device state (device memory), built by the host. */
struct msd_rt {
  struct msd_ctx *x;                /* device copy */
  const struct ms_event *events;
  int32_t end_event;                /* the step start is task 0 (checked at upload) */
  int32_t n_workers;
  uint64_t *counters;               /* [the plan's events] */
  const int32_t *aot_q, *aot_off;   /* worker w's AOT tasks: aot_q[aot_off[w] .. aot_off[w+1]) */
  int32_t *jit_q;                   /* [n_workers * jit_cap] */
  uint32_t *jit_head, *jit_tail;    /* [n_workers] */
  uint32_t jit_cap;                 /* power of two */
  int32_t *fired;                   /* [fired_cap] event + 1, 0: empty */
  uint32_t *fired_tail;
  uint32_t fired_cap;               /* power of two */
  uint32_t *step_seq;               /* generation + 1 of the published step, or MSD_SEQ_EXIT */
  uint64_t *cur_step;
  struct msd_sched *sched;          /* the scheduler's own state */
  /* requests */
  struct msd_host *host;
  struct msd_hreq *req;             /* [requests] host-mapped */
  const int32_t *prompt_pool;       /* host-mapped */
  int32_t *out_pool;                /* host-mapped */
  float *logits_rec;                /* device, or NULL */
  struct msd_beat *beats;           /* [n_ctas] host-mapped */
  uint32_t *done_gen;               /* [the plan's tasks] generation + 1 of each task's last trigger, or NULL */
  int32_t lost_trigger;             /* tests: task + 1 whose trigger is never counted (its event never fires); 0: none */
  struct msd_hooks *hooks;          /* NULL: no hook sites */
  int32_t device;                   /* device index for the hook context */
  /* fed mode: NULL when the kernel admits requests itself (req, host) */
  struct msd_feed *feed;            /* host-mapped */
  const struct msd_feed_step *feed_step;  /* device */
  const uint32_t *feed_seq;         /* device: handovers so far, MSD_SEQ_EXIT: return (the host's copy stream writes it) */
  /* The engine's always-on aggregates (fed mode; NULL: off): per task class
   * {tasks, task_ns, wait_ns}, per class of the event waited on {tasks,
   * wait_ns}, summed over workers with one add each (device memory; the
   * host copies them out). */
  uint64_t *cls_acc, *ev_acc;
  /* Fault injection (fed mode; NULL: healthy), as the engine's
   * ms_fault_table_new gives it: a task's extra time is its healthy time times
   * fault_cls[class] + fault_worker[worker] (+ fault_slot_coef for the
   * attention of a row of slot fault_slot); fault_release_ns[event class]
   * holds the trigger that completes such an event. */
  const float *fault_cls, *fault_worker;
  int32_t fault_slot;
  float fault_slot_coef;
  const uint64_t *fault_release_ns;
  /* When each event last fired (fed mode; NULL: not kept): the completing
   * trigger's clock with its low byte the step + 1, so a task's ready
   * time (queue_ns, the trace) is read only from its own step's firing. */
  uint64_t *fire_ns;                /* [the plan's events] */
  /* The task trace (fed mode; NULL: none): worker w's records go to
   * trace[w * trace_cap ..] as a ring; at the end of a traced step it
   * publishes its count (trace_n[w]), then the step + 1 (trace_step[w]), so
   * the host reads the step's records once every worker's mark moved. */
  struct msd_trace_rec *trace;      /* host-mapped */
  uint32_t *trace_n;                /* host-mapped [n_workers] */
  uint64_t *trace_step;             /* host-mapped [n_workers] */
  uint32_t trace_cap;               /* power of two */
};

/* ---- GPU-scope atomics: core/atomics.h, the device interpreter's and the maps' ---- */

#ifdef MSD_HOST_EMU
static inline uint64_t msd_now(void) { return ms_now_ns(); }
#else
static __device__ __forceinline__ uint64_t msd_now(void) {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
#endif

/* ---- heartbeat and hooks ------------------------------------------------- */

/* The heartbeat's local state: writes to host-mapped memory are write-only
 * (a read would cross the bus), except the abort word's, once a beat period.
 * What the CTA runs or waits on is written when it changes, so a CTA stuck in
 * a task is reported in it; the beat counter and its time at most every
 * MSD_BEAT_NS. done counts the CTA's finished tasks (written at its next beat). */
struct msd_beat_state {
  uint64_t last, n, done, done_put;
  int32_t running, waiting, ev;
  int abort;
};
#define MSD_BEAT_INIT {0, 0, 0, 0, -1, -1, -1, 0}

/* Returns 1 once the host asked every CTA to return (msd_host.abort). */
static __device__ int msd_beat(const struct msd_rt *rt, int cta, uint64_t step, int running, int waiting, int ev,
                               struct msd_beat_state *bs) {
  struct msd_beat *b = &rt->beats[cta];
  uint64_t now = msd_now();
  if (running != bs->running) ms_at_word_st32((void *)&b->running, (uint32_t)(bs->running = running));
  if (waiting != bs->waiting || ev != bs->ev) {  /* a new wait: its start first, then what it is */
    if (ev >= 0) ms_at_word_st64((void *)&b->wait_since, now);
    ms_at_word_st32((void *)&b->waiting, (uint32_t)(bs->waiting = waiting));
    ms_at_word_st32((void *)&b->wait_ev, (uint32_t)(bs->ev = ev));
  }
  if (bs->done != bs->done_put) ms_at_word_st64((void *)&b->done, bs->done_put = bs->done);
  if (now - bs->last < MSD_BEAT_NS) return bs->abort;
  bs->last = now;
  ms_at_word_st64((void *)&b->step, step);
  ms_at_word_st64((void *)&b->since, now);
  ms_at_word_st64((void *)&b->beats, ++bs->n);
  if (ms_at_word_ld32((const void *)&rt->host->abort)) bs->abort = 1;
  return bs->abort;
}

/* When task t of step `step` became ready: its event's firing in that step
 * (the step start's time t_step for a task that waits on none), at most t0;
 * t0 when the firing's time is not there yet (the trigger stores it after its
 * add, tagged with the step's low byte). */
static __device__ uint64_t msd_ready_ns(const struct msd_rt *rt, int t, uint64_t step, uint64_t t_step,
                                        uint64_t t0) {
  int ev = rt->x->tasks[t].wait;
  uint64_t f = t_step;
  if (ev >= 0) {
    uint64_t v = ms_at_word_ld64(&rt->fire_ns[ev]);
    f = (v & 0xffu) == ((step + 1) & 0xffu) && v > 0xffu ? v & ~(uint64_t)0xffu : t0;
  }
  return f < t0 ? f : t0;
}

static __device__ void msd_ctx_base(const struct msd_rt *rt, struct ms_hook_ctx *c, int hook, int worker,
                                    uint64_t step, int rows) {
  /* core/ctx_fill.h, as the CPU engines fill it; one device per engine: no remote producer */
  ms_ctx_fill_base(c, hook, msd_now(), (uint32_t)worker, (uint32_t)rt->device, step, (uint32_t)rows,
                   (uint32_t)rt->x->batch);
}

static __device__ void msd_ctx_task(const struct msd_rt *rt, struct ms_hook_ctx *c, int t, uint64_t step) {
  const struct ms_task *k = &rt->x->tasks[t];
  ms_ctx_fill_task(c, k, t);  /* c->step is step (msd_ctx_base) */
  int row = k->tile[1];
  if (row >= 0 && row < rt->x->max_rows) {
    const struct msd_sched *S = rt->sched;
    uint32_t v1 = ms_at_word_ld32(&S->layout_seq);
    ms_at_fence_acq_rel();
    int s = (int)ms_at_word_ld32(&rt->x->row_slot[row]);
    uint32_t gen = s >= 0 && s < MSD_MAX_SLOTS ? ms_at_word_ld32(&rt->sched->slot_gen[s]) : 0;
    uint32_t pos = ms_at_word_ld32(&rt->x->row_pos[row]);
    uint64_t lstep = ms_at_word_ld64(&S->layout_step);
    ms_at_fence_acq_rel();
    if (s >= 0 && !(v1 & 1) && ms_at_word_ld32(&S->layout_seq) == v1 && lstep == step) {
      c->req_slot = (uint32_t)s;
      c->req_gen = gen;
      c->ctx_len = pos + 1;
    }
  }
  if (k->wait >= 0) ms_ctx_fill_event(c, &rt->events[k->wait], k->wait);
  /* t_ready as the CPU fills it (fed mode keeps the firings' times) */
  if (rt->fire_ns) c->t_ready = msd_ready_ns(rt, t, step, c->now_ns, c->now_ns);
}

/* Hook ABI v2 on the device, task_begin and task_end (thread 0, after the
 * task's event fired: the router's output is visible). work_rows as the CPU
 * engine fills it (src/runtime/work.h): an expert's routed rows read from the
 * router's output, attention's positions (a sliding-window layer's window at
 * most: ms_layer_attn_first, one rule for both), a row task's row (1, or 0 for
 * padding), 0 for the step start and empty tasks, the step's live rows
 * otherwise. work_bytes is MS_HOOK_NONE64 and a JIT task's passed_over
 * MS_HOOK_NONE32: the device does not size a task's reads, nor do its rings
 * keep queueing marks, yet (AOT tasks: 0, as everywhere). The remote fields
 * stay none (msd_ctx_base). */
static __device__ void msd_ctx_work(const struct msd_rt *rt, struct ms_hook_ctx *c, int t, int rows) {
  const struct msd_ctx *x = rt->x;
  const struct ms_task *k = &x->tasks[t];
  int r = k->tile[1], n = rows < x->max_rows ? rows : x->max_rows;
  int live = r >= 0 && r < n && (int32_t)ms_at_word_ld32(&x->row_slot[r]) >= 0;
  c->work_bytes = MS_HOOK_NONE64;
  c->passed_over = k->launch == MS_LAUNCH_MODE_JIT ? MS_HOOK_NONE32 : 0;
  switch (k->kernel) {
  case MS_OP_STEP_START:
  case MS_OP_EMPTY:
    c->work_rows = 0;
    break;
  case MS_OP_EXPERT_UP:
  case MS_OP_EXPERT_DOWN: {
    /* no router output to read (a scheduler-only context, tests/emu/harness.h): unknown */
    const struct msd_class *cl = x->classes ? &x->classes[k->cls] : NULL;
    uint32_t routed = 0;
    if (!cl || !x->buf || cl->in2 < 0 || !x->buf[cl->in2]) {
      c->work_rows = MS_HOOK_NONE32;
      break;
    }
    for (int i = 0; i < n; i++) {
      if ((int32_t)ms_at_word_ld32(&x->row_slot[i]) < 0) continue;
      const int32_t *ids = (const int32_t *)msd_buf_row(x, cl->in2, 0, i);  /* [k ids | k weights] */
      for (int j = 0; j < x->cfg.top_k; j++) routed += ids[j] == k->tile[2];
    }
    c->work_rows = routed;
    break;
  }
  case MS_OP_ATTN: {
    /* the positions it reads, by the host's rule (model.h): a local layer's
     * window at most; without a class table (a scheduler-only context) the
     * layer is unknown, and so is a windowed model's count */
    int n = live ? (int)ms_at_word_ld32(&x->row_pos[r]) + 1 : 0;
    if (x->classes)
      c->work_rows = (uint32_t)(n - ms_layer_attn_first(&x->cfg.mc, x->classes[k->cls].layer, n));
    else
      c->work_rows = x->cfg.mc.sliding_window > 0 && live ? MS_HOOK_NONE32 : (uint32_t)n;
    break;
  }
  default:
    c->work_rows = r >= 0 ? (uint32_t)live : (uint32_t)n;
  }
}

/* ---- workers ------------------------------------------------------------- */

static __device__ __forceinline__ int msd_event_fired(const struct msd_rt *rt, int ev, uint64_t gen) {
  return ev < 0 || ms_at_ld_acq64(&rt->counters[ev]) >= ms_event_target(&rt->events[ev], gen);
}


/* Thread 0: counts one trigger of t's event; the last one puts an event with
 * JIT successors on the fired ring. Returns whether it completed the event. */
static __device__ int msd_trigger(const struct msd_rt *rt, int t, uint64_t gen, uint64_t step, int worker,
                                  int rows) {
  int ev = rt->x->tasks[t].trigger;
  if (ev < 0 || t + 1 == rt->lost_trigger) return 0;
  const struct ms_event *E = &rt->events[ev];
  uint64_t target = ms_event_target(E, gen);
  /* fault injection (delayed_release): the trigger that completes the event
   * is held (the last one: a guess when producers finish together, as on the CPU) */
  if (rt->fault_release_ns && rt->fault_release_ns[E->cls] && ms_at_ld_acq64(&rt->counters[ev]) + 1 == target) {
    uint64_t until = msd_now() + rt->fault_release_ns[E->cls];
    while (msd_now() < until) __nanosleep(100);
  }
  __threadfence();
  uint64_t old = ms_at_add_acq_rel64(&rt->counters[ev], 1);
  if (rt->done_gen) ms_at_word_st32(&rt->done_gen[t], (uint32_t)gen + 1);  /* the watchdog's list; no order needed */
  if (old + 1 != target) return 0;
  if (rt->fire_ns) ms_at_word_st64(&rt->fire_ns[ev], (msd_now() & ~(uint64_t)0xffu) | ((step + 1) & 0xffu));
  if (rt->hooks && msd_hook_armed(rt->hooks, MS_HOOK_DEP_RELEASE)) {
    struct ms_hook_ctx c;
    msd_ctx_base(rt, &c, MS_HOOK_DEP_RELEASE, worker, step, rows);
    c.event_id = (uint32_t)ev;
    c.event_class = E->cls;
    c.event_needed = (uint32_t)E->needed;
    c.event_count = (uint64_t)E->needed;
    msd_hook_fire(rt->hooks, &c, worker);
  }
  int jit = 0;
  for (int s = E->first; s <= E->last && !jit; s++) jit = rt->x->tasks[s].launch == MS_LAUNCH_JIT;
  if (!jit) {
    /* AOT successors are on their workers' lists already: task_ready here. Only
     * events with JIT successors go on the ring: the scheduler must see those
     * before the step can end, so nothing of a step is left on it after. */
    if (rt->hooks && msd_hook_armed(rt->hooks, MS_HOOK_TASK_READY))
      for (int s = E->first; s <= E->last; s++) {
        struct ms_hook_ctx c;
        msd_ctx_base(rt, &c, MS_HOOK_TASK_READY, worker, step, rows);
        msd_ctx_task(rt, &c, s, step);
        c.t_ready = c.now_ns;
        msd_hook_sched_hint(rt->hooks, &c, worker);  /* seen by hint programs too; AOT order is fixed */
        msd_hook_fire(rt->hooks, &c, worker);
      }
    return 1;
  }
  uint32_t slot = atomicAdd(rt->fired_tail, 1u) & (rt->fired_cap - 1);
  ms_at_st_rel32((uint32_t *)&rt->fired[slot], (uint32_t)ev + 1);
  return 1;
}

static __device__ void msd_task_hook(const struct msd_rt *rt, int hook, int t, uint64_t step, int worker,
                                     int rows, uint64_t t_begin, uint64_t t_end, uint64_t wait_ns) {
  struct ms_hook_ctx c;
  msd_ctx_base(rt, &c, hook, worker, step, rows);
  msd_ctx_task(rt, &c, t, step);
  c.t_begin = t_begin;
  c.t_end = t_end;
  c.wait_ns = wait_ns;
  if (hook == MS_HOOK_TASK_BEGIN || hook == MS_HOOK_TASK_END) msd_ctx_work(rt, &c, t, rows);
  if (hook == MS_HOOK_DEP_WAIT) c.wait_reason = MS_WAIT_DEPENDENCY;
  msd_hook_fire(rt->hooks, &c, worker);
}

/* Fault injection (slow_class, slow_layer, slow_worker, slow_request): the
 * worker stays busy past the task's healthy time (thread 0, after the body;
 * the CTA waits at its next barrier), as ms_fault_extra_ns sums it. */
static __device__ void msd_fault_spin(const struct msd_rt *rt, int t, int w, uint64_t t0) {
  const struct ms_task *k = &rt->x->tasks[t];
  float c = rt->fault_cls[k->cls] + rt->fault_worker[w];
  int r = k->tile[1];
  if (k->kernel == MS_OP_ATTN && rt->fault_slot >= 0 && r >= 0 && r < *rt->x->n_rows &&
      (int32_t)ms_at_word_ld32(&rt->x->row_slot[r]) == rt->fault_slot)
    c += rt->fault_slot_coef;
  if (c <= 0) return;
  uint64_t now = msd_now(), until = now + (uint64_t)((double)(now - t0) * (double)c);
  while (msd_now() < until) __nanosleep(100);
}

/* The always-on aggregates of one task (thread 0, before its trigger). */
static __device__ void msd_account(const struct msd_rt *rt, int t, uint64_t task_ns, uint64_t queue_ns,
                                   uint64_t wait_ns) {
  const struct ms_task *k = &rt->x->tasks[t];
  uint64_t *a = rt->cls_acc + 4 * (size_t)k->cls;  /* counters: relaxed adds, they order nothing */
  ms_at_fetch_add64(&a[0], 1);
  ms_at_fetch_add64(&a[1], task_ns);
  ms_at_fetch_add64(&a[2], queue_ns);
  ms_at_fetch_add64(&a[3], wait_ns);
  if (k->wait < 0) return;
  uint64_t *b = rt->ev_acc + 2 * (size_t)rt->events[k->wait].cls;
  ms_at_fetch_add64(&b[0], 1);
  ms_at_fetch_add64(&b[1], wait_ns);
}

/* A traced task's record (thread 0, after its trigger: the step's records
 * are published together at its end, msd_trace_publish). */
static __device__ void msd_trace_task(const struct msd_rt *rt, int w, uint32_t *n, int t, uint64_t step,
                                      uint64_t t0, uint64_t t1, uint64_t ready, uint64_t wait_ns, int fired) {
  struct msd_trace_rec *r = &rt->trace[(size_t)w * rt->trace_cap + (*n & (rt->trace_cap - 1))];
  r->t_begin = t0;
  r->t_end = t1;
  r->t_ready = ready;
  r->step = step;
  r->task = (uint32_t)t;
  r->wait_ns = wait_ns > 0xffffffffull ? 0xffffffffu : (uint32_t)wait_ns;
  r->fired = (uint32_t)fired;
  ++*n;
}

/* The end of a traced step on worker w: its records, then their count, then
 * the step's mark, each visible to the host before the next. */
static __device__ void msd_trace_publish(const struct msd_rt *rt, int w, uint32_t n, uint64_t step) {
  __threadfence_system();
  ms_at_word_st32(&rt->trace_n[w], n);
  __threadfence_system();
  ms_at_word_st64(&rt->trace_step[w], step + 1);
}

/* The worker loop of CTA cta (worker cta - 1). */
static __device__ void msd_worker(const struct msd_rt *rt, int cta) {
  __shared__ int s_task, s_exit;
  __shared__ uint64_t s_gen, s_step;
  const int w = cta - 1, tid = threadIdx.x;
  uint32_t seen = 0;
  struct msd_beat_state beat = MSD_BEAT_INIT;
  const uint32_t cap = rt->jit_cap;
  int32_t *jq = rt->jit_q + (size_t)w * cap;
  uint32_t head = 0;  /* this worker's ring: it alone consumes */
  uint32_t n_traced = 0;  /* records written since launch (thread 0) */
  if (tid == 0) s_step = 0;
  for (;;) {
    if (tid == 0) {
      uint32_t seq;
      int abort = 0;
      while ((seq = ms_at_ld_acq32(rt->step_seq)) == seen && !abort) {
        if (rt->hooks) msd_hooks_quiescent(rt->hooks, w);
        abort = msd_beat(rt, cta, s_step, -1, -1, -1, &beat);
        __nanosleep(200);
      }
      ms_at_fence_acq_rel();
      s_exit = seq == MSD_SEQ_EXIT || abort;
      seen = seq;
      s_gen = seq - 1u;
      s_step = *(volatile uint64_t *)rt->cur_step;
    }
    __syncthreads();
    if (s_exit) return;
    const uint64_t gen = s_gen, step = s_step;
    const int rows = *(volatile int32_t *)rt->x->n_rows;
    /* thread 0's: the step as this worker saw it start, and whether it is traced */
    const uint64_t t_step = tid == 0 ? msd_now() : 0;
    const int tracing = tid == 0 && rt->trace && ms_at_word_ld32(&rt->sched->tracing);
    int ai = rt->aot_off[w];
    const int aend = rt->aot_off[w + 1];
    int prefetched = -1, waited = -1;
    uint64_t wait_t0 = 0;
    for (;;) {
      uint64_t wait_ns = 0;
      if (tid == 0) {
        int t = -1;
        for (;;) {
          uint32_t tail = ms_at_ld_acq32(&rt->jit_tail[w]);
          if (head != tail) {
            /* Every task of a step precedes its end event, so once that event
             * fired for gen an entry can only be the next step's: the scheduler
             * dispatches it as soon as it has published that step, possibly
             * before this worker saw the end. Run with gen it would wait on and
             * count against the wrong generation (a last trigger would miss
             * the fired ring: deadlock). Leave it for the next step's pass. */
            if (msd_event_fired(rt, rt->end_event, gen)) {
              t = -1;
              break;
            }
            t = jq[head & (cap - 1)];
            head++;
            /* release: the entry's load completes before the scheduler may
             * reuse its slot (a plain store would let it be overwritten first) */
            ms_at_st_rel32((uint32_t *)&rt->jit_head[w], head);
            break;
          }
          if (ai < aend) {
            int a = rt->aot_q[ai];
            int ev = rt->x->tasks[a].wait;
            if (msd_event_fired(rt, ev, gen)) {
              t = a;
              ai++;
              if (waited == a) wait_ns = msd_now() - wait_t0;
              break;
            }
            if (waited != a) {  /* the first look at a task that is not ready */
              waited = a;
              wait_t0 = msd_now();
              if (rt->hooks && msd_hook_armed(rt->hooks, MS_HOOK_DEP_WAIT))
                msd_task_hook(rt, MS_HOOK_DEP_WAIT, a, step, w, rows, 0, 0, 0);
            }
            if (prefetched != a) {  /* warm L2 with its weights, with the whole CTA */
              prefetched = a;
              t = -3 - a;
              break;
            }
            if (msd_beat(rt, cta, step, -1, a, ev, &beat)) {
              t = -2;  /* the host's abort */
              break;
            }
          } else if (msd_event_fired(rt, rt->end_event, gen)) {
            t = -1;  /* the step is over */
            break;
          } else if (msd_beat(rt, cta, step, -1, -1, rt->end_event, &beat)) {
            t = -2;
            break;
          }
          if (rt->hooks) msd_hooks_quiescent(rt->hooks, w);
          __nanosleep(64);
        }
        if (t >= 0) {
          /* JIT tasks were dispatched ready; the acquire is what orders their reads */
          int ev = rt->x->tasks[t].wait;
          while (!msd_event_fired(rt, ev, gen) && !beat.abort) {
            msd_beat(rt, cta, step, -1, t, ev, &beat);
            __nanosleep(32);
          }
          ms_at_fence_acq_rel();
          if (beat.abort) t = -2;
        }
        s_task = t;  /* -1: the step's end; -2: return (the host's abort); <= -3: prefetch -3 - t */
      }
      __syncthreads();
      int t = s_task;
      if (t == -1) break;
      if (t == -2) return;
      if (t <= -3) {
        msd_task_prefetch(rt->x, -3 - t, tid, MSD_THREADS);
        __syncthreads();
        continue;
      }
      uint64_t t0 = 0;
      if (tid == 0) {
        t0 = msd_now();
        msd_beat(rt, cta, step, t, -1, -1, &beat);
        if (rt->hooks && msd_hook_armed(rt->hooks, MS_HOOK_TASK_BEGIN))
          msd_task_hook(rt, MS_HOOK_TASK_BEGIN, t, step, w, rows, t0, 0, wait_ns);
      }
      msd_task_run(rt->x, t, cta);  /* ends with a barrier: every output is written */
      if (rt->feed && rt->x->tasks[t].kernel == MS_OP_SAMPLE) {
        /* fed mode: the row's logits went to host-mapped memory; each writer
         * makes its own stores visible to the host before the trigger, so the
         * host's read after `done` does not lean on cumulativity across scopes */
        __threadfence_system();
        __syncthreads();
      }
      if (tid == 0) {
        if (rt->fault_cls) msd_fault_spin(rt, t, w, t0);
        /* task_end before the trigger, as on the CPU (ms_rt_task_finish): once
         * the trigger is counted the step may end and the scheduler rewrite the
         * row metadata and slot generations this hook's context reads */
        if (rt->hooks && msd_hook_armed(rt->hooks, MS_HOOK_TASK_END))
          msd_task_hook(rt, MS_HOOK_TASK_END, t, step, w, rows, t0, msd_now(), wait_ns);
        const uint64_t t1 = msd_now();
        const uint64_t ready = rt->fire_ns ? msd_ready_ns(rt, t, step, t_step, t0) : t0;
        if (rt->cls_acc) msd_account(rt, t, t1 - t0, t0 - ready, wait_ns);
        int fired = msd_trigger(rt, t, gen, step, w, rows);
        beat.done++;
        if (tracing) msd_trace_task(rt, w, &n_traced, t, step, t0, t1, ready, wait_ns, fired);
        if (rt->hooks) msd_hooks_quiescent(rt->hooks, w);
      }
    }
    if (tid == 0) {
      msd_beat(rt, cta, step, -1, -1, -1, &beat);
      if (tracing) msd_trace_publish(rt, w, n_traced, step);
      /* the step's last wait, for dep_wait's step-end reason */
      if (rt->hooks && msd_hook_armed(rt->hooks, MS_HOOK_DEP_WAIT)) {
        struct ms_hook_ctx c;
        msd_ctx_base(rt, &c, MS_HOOK_DEP_WAIT, w, step, rows);
        c.wait_reason = MS_WAIT_STEP_END;
        c.event_id = (uint32_t)rt->end_event;
        c.event_class = rt->events[rt->end_event].cls;
        c.event_needed = (uint32_t)rt->events[rt->end_event].needed;
        msd_hook_fire(rt->hooks, &c, w);
      }
    }
  }
}

/* ---- the scheduler ------------------------------------------------------- */


/* JIT dispatch of task t: round-robin over the workers, skipping a ring that is
 * full (counted in queue_full; retried until one has room). */
static __device__ void msd_dispatch(const struct msd_rt *rt, int t, uint64_t step, int rows, struct msd_rings *q) {
  const int W = rt->n_workers;
  const uint32_t cap = rt->jit_cap;
  for (int tries = 0;; tries++) {
    int w = q->rr;
    q->rr = (w + 1) % W;
    uint32_t depth = q->tail[w] - q->head[w];
    if (depth + 1 >= MSD_QUEUE_THRESHOLD || depth >= cap) {  /* refresh: the worker may have drained it */
      q->head[w] = ms_at_ld_acq32(&rt->jit_head[w]);  /* pairs with the worker's release: its load is done */
      depth = q->tail[w] - q->head[w];
    }
    if (depth >= cap) {
      rt->host->queue_full = ++rt->sched->queue_full;
      if (tries >= W) {  /* every ring full: the workers are slow, stuck, or gone at the host's abort */
        if (ms_at_word_ld32((const void *)&rt->host->abort)) return;
        __nanosleep(100);
      }
      continue;
    }
    rt->jit_q[(size_t)w * cap + (q->tail[w] & (cap - 1))] = t;
    ms_at_st_rel32(&rt->jit_tail[w], ++q->tail[w]);
    if (rt->hooks && msd_hook_armed(rt->hooks, MS_HOOK_TASK_ASSIGN)) {
      struct ms_hook_ctx c;
      msd_ctx_base(rt, &c, MS_HOOK_TASK_ASSIGN, w, step, rows);
      msd_ctx_task(rt, &c, t, step);
      c.queue_depth = depth + 1;
      msd_hook_fire(rt->hooks, &c, rt->n_workers);
    }
    if (depth + 1 == MSD_QUEUE_THRESHOLD && rt->hooks && msd_hook_armed(rt->hooks, MS_HOOK_QUEUE_PRESSURE)) {
      struct ms_hook_ctx c;
      msd_ctx_base(rt, &c, MS_HOOK_QUEUE_PRESSURE, w, step, rows);
      c.queue_depth = depth + 1;
      c.queue_threshold = MSD_QUEUE_THRESHOLD;
      c.queue_kind = 0;
      msd_hook_fire(rt->hooks, &c, rt->n_workers);
    }
    return;
  }
}

/* The successors of fired event ev: task_ready for each (a sched_hint program
 * may give a priority), JIT ones dispatched, higher priorities first. */
static __device__ void msd_release_succ(const struct msd_rt *rt, int ev, uint64_t step, int rows,
                                        struct msd_rings *q) {
  const struct ms_event *E = &rt->events[ev];
  const int S = rt->n_workers;  /* the scheduler's hook "worker" index: after the workers */
  int ready = rt->hooks && msd_hook_armed(rt->hooks, MS_HOOK_TASK_READY);
  if (!ready) {
    for (int t = E->first; t <= E->last; t++)
      if (rt->x->tasks[t].launch == MS_LAUNCH_JIT) msd_dispatch(rt, t, step, rows, q);
    return;
  }
  /* priorities 0..7 in 3 bits per task, up to 64 successors at a time */
  for (int b = E->first; b <= E->last; b += 64) {
    int n = E->last - b + 1 < 64 ? E->last - b + 1 : 64;
    uint8_t prio[64];
    for (int i = 0; i < n; i++) {
      struct ms_hook_ctx c;
      msd_ctx_base(rt, &c, MS_HOOK_TASK_READY, S, step, rows);
      msd_ctx_task(rt, &c, b + i, step);
      c.t_ready = c.now_ns;
      int p = msd_hook_sched_hint(rt->hooks, &c, S);
      msd_hook_fire(rt->hooks, &c, S);
      prio[i] = (uint8_t)(p > 0 && p < 8 ? p : 0);
    }
    for (int p = 7; p >= 0; p--)
      for (int i = 0; i < n; i++)
        if (prio[i] == p && rt->x->tasks[b + i].launch == MS_LAUNCH_JIT) msd_dispatch(rt, b + i, step, rows, q);
  }
}

static __device__ void msd_request_hook(const struct msd_rt *rt, int phase, int slot, int token, uint64_t step,
                                        int rows) {
  if (!rt->hooks || !msd_hook_armed(rt->hooks, MS_HOOK_REQUEST)) return;
  struct ms_hook_ctx c;
  msd_ctx_base(rt, &c, MS_HOOK_REQUEST, rt->n_workers, step, rows);
  c.req_slot = (uint32_t)slot;
  c.req_gen = rt->sched->slot_gen[slot];
  c.phase = (uint32_t)phase;
  c.token = (uint32_t)token;
  msd_hook_fire(rt->hooks, &c, rt->n_workers);
}

static __device__ void msd_step_hook(const struct msd_rt *rt, int phase, uint64_t step, int rows) {
  if (!rt->hooks || !msd_hook_armed(rt->hooks, MS_HOOK_STEP)) return;
  struct ms_hook_ctx c;
  msd_ctx_base(rt, &c, MS_HOOK_STEP, rt->n_workers, step, rows);
  c.phase = (uint32_t)phase;
  msd_hook_fire(rt->hooks, &c, rt->n_workers);
}

/* Step start: retire, admit, lay out rows. Returns the rows in use (0: idle). */
static __device__ int msd_step_start(const struct msd_rt *rt, uint64_t step) {
  struct msd_ctx *x = rt->x;
  struct msd_sched *S = rt->sched;
  const int B = x->batch;
  int active = 0;
  uint32_t submitted = 0xffffffffu;  /* read from the host once, when a slot is free */
  const uint32_t seq = S->layout_seq;
  ms_at_word_st32(&S->layout_seq, seq + 1);  /* the layout is being written (see msd_sched) */
  ms_at_fence_acq_rel();
  for (int s = 0; s < B; s++) {
    int r = S->slot_req[s];
    if (r >= 0 && S->slot_fin[s]) {
      struct msd_hreq *q = &rt->req[r];
      q->t_done = msd_now();
      __threadfence_system();
      q->done = 1;
      rt->host->n_finished = (uint32_t)++S->n_finished;
      msd_request_hook(rt, MS_REQ_FINISHED, s, 0, step, B);
      S->slot_req[s] = r = -1;
    }
    if (r < 0) {
      if (submitted == 0xffffffffu) {
        submitted = rt->host->n_submitted;
        __threadfence_system();  /* the records before the count */
      }
      if (S->next_req < submitted) {
        r = (int)S->next_req++;
        const struct msd_hreq *q = &rt->req[r];
        S->slot_req[s] = r;
        S->slot_pos[s] = 0;
        S->slot_fin[s] = 0;
        S->slot_nprompt[s] = q->n_prompt;
        S->slot_maxnew[s] = q->max_new;
        S->slot_poff[s] = q->prompt_off;
        S->slot_ooff[s] = q->out_off;
        S->slot_loff[s] = q->logits_off;
        S->slot_stop[s] = q->stop_eos;
        ms_at_word_st32(&S->slot_gen[s], S->slot_gen[s] + 1);
        rt->req[r].t_admit = msd_now();
        msd_request_hook(rt, MS_REQ_ADMITTED, s, 0, step, B);
      }
    }
    if (r >= 0) {
      int pos = S->slot_pos[s];
      ms_at_word_st32(&x->row_slot[s], (uint32_t)s);
      ms_at_word_st32(&x->row_pos[s], (uint32_t)pos);
      x->row_token[s] = pos < S->slot_nprompt[s] ? rt->prompt_pool[S->slot_poff[s] + pos] : S->slot_next[s];
      active++;
    } else {
      ms_at_word_st32(&x->row_slot[s], 0xffffffffu);
      ms_at_word_st32(&x->row_pos[s], 0);
      x->row_token[s] = 0;
    }
  }
  *x->n_rows = active ? B : 0;
  ms_at_word_st64(&S->layout_step, step);
  ms_at_fence_acq_rel();
  ms_at_word_st32(&S->layout_seq, seq + 2);
  return active;
}

/* Step end: per row, the sampled token feeds the next prompt position or is
 * emitted. A request's last token marks it finishing (retired at the next start). */
static __device__ void msd_step_end(const struct msd_rt *rt, uint64_t step) {
  struct msd_ctx *x = rt->x;
  struct msd_sched *S = rt->sched;
  const int B = x->batch, V = x->cfg.vocab;
  for (int s = 0; s < B; s++) {
    int r = S->slot_req[s];
    if (r < 0 || S->slot_fin[s]) continue;
    struct msd_hreq *q = &rt->req[r];
    int pos = S->slot_pos[s], tok = x->sampled[s];
    if (rt->logits_rec && S->slot_loff[s] >= 0 && x->logits_out) {
      const float *src = x->logits_out + (size_t)s * V;
      float *dst = rt->logits_rec + S->slot_loff[s] + (int64_t)pos * V;
      for (int i = 0; i < V; i++) dst[i] = src[i];
    }
    S->slot_pos[s] = ++pos;
    if (pos < S->slot_nprompt[s]) continue;
    int n = pos - S->slot_nprompt[s];  /* tokens before this one */
    S->slot_next[s] = tok;
    rt->out_pool[S->slot_ooff[s] + n] = tok;
    if (n == 0) q->t_first = msd_now();
    __threadfence_system();
    q->n_tokens = n + 1;
    rt->host->tokens = ++S->tokens;
    msd_request_hook(rt, n == 0 ? MS_REQ_FIRST_TOKEN : MS_REQ_TOKEN, s, tok, step, B);
    if (n + 1 >= S->slot_maxnew[s] || (S->slot_stop[s] && tok == x->cfg.eos)) S->slot_fin[s] = 1;
  }
}

/* The request hook of a fed event (the host's step machine admitted,
 * sampled or retired it; the slot's generation comes with it). */
static __device__ void msd_feed_events(const struct msd_rt *rt, const struct msd_feed_step *f) {
  if (!rt->hooks || !msd_hook_armed(rt->hooks, MS_HOOK_REQUEST)) return;
  for (int i = 0; i < f->n_events && i < MSD_FEED_EVENTS; i++) {
    const struct msd_feed_event *v = &f->ev[i];
    struct ms_hook_ctx c;
    msd_ctx_base(rt, &c, MS_HOOK_REQUEST, rt->n_workers, v->step, f->rows);
    c.req_slot = (uint32_t)v->slot;
    c.req_gen = v->gen;
    c.phase = (uint32_t)v->phase;
    c.token = (uint32_t)v->token;
    msd_hook_fire(rt->hooks, &c, rt->n_workers);
  }
}

/* Fed mode's step start: waits for the host's next step (fed steps so far:
 * *fed) and lays out its rows; a handover of events alone fires them and
 * waits again. Returns the live rows, -1 when the host asked the kernel to
 * return. */
static __device__ int msd_feed_start(const struct msd_rt *rt, uint32_t *fed, uint64_t *step,
                                     struct msd_beat_state *beat) {
  struct msd_ctx *x = rt->x;
  struct msd_sched *S = rt->sched;
  const struct msd_feed_step *f = rt->feed_step;
  for (;;) {
    uint32_t seq;
    /* device memory, written by the host's copy stream after the step's
     * records: polled at L2 latency, not across the bus; the acquire orders
     * the records' loads after it */
    while ((seq = ms_at_ld_acq32(rt->feed_seq)) == *fed) {
      if (msd_beat(rt, 0, *step, -1, -1, -1, beat)) return -1;
      if (rt->hooks) msd_hooks_quiescent(rt->hooks, rt->n_workers);
      __nanosleep(100);
    }
    rt->feed->t_seen = msd_now();
    if (seq == MSD_SEQ_EXIT) return -1;
    ++*fed;
    if (f->rows > 0) break;
    msd_feed_events(rt, f);
    __threadfence_system();
    rt->feed->t_done = msd_now();
    rt->feed->done = *fed;
  }
  const int B = x->batch, n = f->rows < B ? f->rows : B;
  int active = 0;
  *step = f->step;
  const uint32_t lseq = S->layout_seq;
  ms_at_word_st32(&S->layout_seq, lseq + 1);  /* the layout is being written (see msd_sched) */
  ms_at_fence_acq_rel();
  for (int r = 0; r < B; r++) {
    const struct msd_feed_row *q = &f->row[r];
    int live = r < n && q->slot >= 0 && q->slot < B;
    if (live) {
      ms_at_word_st32(&S->slot_gen[q->slot], q->gen);
      x->page_table[(int64_t)q->slot * x->max_pages + q->pos / x->page_size] = q->page;
      active++;
    }
    ms_at_word_st32(&x->row_slot[r], live ? (uint32_t)q->slot : 0xffffffffu);
    ms_at_word_st32(&x->row_pos[r], live ? (uint32_t)q->pos : 0);
    x->row_token[r] = live ? q->token : 0;
  }
  *x->n_rows = n;
  ms_at_word_st32(&S->tracing, (uint32_t)(f->trace != 0));  /* published with the step */
  ms_at_word_st64(&S->layout_step, *step);
  ms_at_fence_acq_rel();
  ms_at_word_st32(&S->layout_seq, lseq + 2);
  msd_feed_events(rt, f);
  return active;
}

/* The scheduler: CTA 0, thread 0. */
static __device__ void msd_scheduler(const struct msd_rt *rt) {
  if (threadIdx.x != 0) return;
  struct msd_sched *S = rt->sched;
  uint32_t fired_head = 0;
  struct msd_rings *rings = &S->rings;
  for (int w = 0; w < rt->n_workers; w++) rings->tail[w] = rings->head[w] = rt->jit_tail[w];
  rings->rr = 0;
  struct msd_beat_state beat = MSD_BEAT_INIT;
  uint64_t gen = 0, step = *rt->cur_step;
  const struct ms_event *end = &rt->events[rt->end_event];
  uint32_t fed = 0;  /* fed mode: steps the host handed over so far */
  rt->host->t_start = msd_now();
  for (;;) {
    int active;
    if (rt->feed) {
      if ((active = msd_feed_start(rt, &fed, &step, &beat)) < 0) break;
    } else if (!(active = msd_step_start(rt, step))) {
      if (rt->host->exit_when_idle && S->next_req >= rt->host->n_submitted) break;
      if (msd_beat(rt, 0, step, -1, -1, -1, &beat)) break;
      if (rt->hooks) msd_hooks_quiescent(rt->hooks, rt->n_workers);
      __nanosleep(1000);
      continue;
    }
    const int rows = rt->feed ? *rt->x->n_rows : rt->x->batch;
    *(volatile uint64_t *)rt->cur_step = step;
    __threadfence();
    ms_at_st_rel32(rt->step_seq, (uint32_t)gen + 1);
    msd_step_hook(rt, MS_STEP_BEGIN, step, rows);
    /* the step start task: its body ran above; trigger its event */
    msd_trigger(rt, 0, gen, step, rt->n_workers, rows);
    const uint64_t end_target = ms_event_target(end, gen);
    while (ms_at_ld_acq64(&rt->counters[rt->end_event]) < end_target && !beat.abort) {
      uint32_t v = ms_at_ld_acq32((const uint32_t *)&rt->fired[fired_head & (rt->fired_cap - 1)]);
      if (!v) {
        msd_beat(rt, 0, step, -1, -1, rt->end_event, &beat);
        if (rt->hooks) msd_hooks_quiescent(rt->hooks, rt->n_workers);
        __nanosleep(32);
        continue;
      }
      rt->fired[fired_head & (rt->fired_cap - 1)] = 0;
      fired_head++;
      msd_release_succ(rt, (int)v - 1, step, rows, rings);
    }
    if (beat.abort) break;  /* the host's watchdog gave up on this step */
    msd_beat(rt, 0, step, -1, -1, -1, &beat);
    /* events whose release is still on the ring belong to this step: drain */
    for (;;) {
      uint32_t v = ms_at_ld_acq32((const uint32_t *)&rt->fired[fired_head & (rt->fired_cap - 1)]);
      if (!v) break;
      rt->fired[fired_head & (rt->fired_cap - 1)] = 0;
      fired_head++;
      msd_release_succ(rt, (int)v - 1, step, rows, rings);
    }
    ms_at_fence_acq_rel();
    if (rt->feed) {
      /* the sample tasks wrote their rows' logits to host-mapped memory before
       * their triggers; the fence makes them, then done, visible to the host */
      __threadfence_system();
      rt->feed->t_done = msd_now();
      rt->feed->done = fed;
    } else {
      msd_step_end(rt, step);
    }
    msd_step_hook(rt, MS_STEP_END, step, rows);
    if (rt->hooks) msd_hooks_quiescent(rt->hooks, rt->n_workers);
    rt->host->steps = ++S->steps;
    rt->host->positions = S->positions += (uint64_t)active;
    step++;
    gen++;
  }
  rt->host->t_end = msd_now();
  __threadfence_system();
  ms_at_st_rel32(rt->step_seq, MSD_SEQ_EXIT);
  rt->host->exited = 1;
}

static __global__ void __launch_bounds__(MSD_THREADS, 1) msd_megakernel(struct msd_rt rt) {
  if (blockIdx.x == 0)
    msd_scheduler(&rt);
  else
    msd_worker(&rt, (int)blockIdx.x);
}

#endif
