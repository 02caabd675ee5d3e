/* SPDX-License-Identifier: MIT */
/* Hook sites of the runtime (every backend fires the same): filling the
 * context of each hook from the plan (hook/ctx_fill.h, the device's too), the
 * batch metadata and the worker.
 * Included by the files that fire hooks (step.c, requests.c, backend_cpu.c).
 * A site first checks ms_hook_armed (one relaxed load and a branch);
 * everything here runs only when something is attached. */
#ifndef MS_RUNTIME_HOOKSITE_H
#define MS_RUNTIME_HOOKSITE_H

#include <string.h>

#include "hook/ctx_fill.h"
#include "runtime/runtime_impl.h"
#include "runtime/work.h"

#define HOOK_ARMED(e, h) (HOOKS_ON(e) && ms_hook_armed((e)->hooks, (h)))

/* The fields every hook has; step and rows: the step the firing belongs to. */
static inline void ctx_base(struct ms_engine *e, struct ms_hook_ctx *c, int hook, int worker,
                     const struct plan_rt *rt, uint64_t step, int rows) {
  ms_ctx_fill_base(c, hook, ms_eng_now(e), (uint32_t)worker, (uint32_t)ms_rt_device(e, worker), step,
                   rt ? (uint32_t)rows : 0, rt ? (uint32_t)rt->plan->batch : 0);
}

/* Hooks of the step in flight: fired by worker 0 at a step's start or end, or
 * from a task's body (its step cannot end before the task does). */
static inline void ctx_common(struct ms_engine *e, struct ms_hook_ctx *c, int hook, int worker,
                       const struct plan_rt *rt) {
  ctx_base(e, c, hook, worker, rt, atomic_load_explicit(&e->cur_step, memory_order_relaxed),
           rt ? rt->x.meta.n_rows : 0);
}

/* Hooks of a worker's tasks: the step the worker runs, not cur_step. task_ready,
 * task_assign, dep_release and the JIT queue's queue_pressure fire after a
 * trigger, and once the step's last trigger is counted worker 0 may publish the
 * next step before they are done. */
static inline void ctx_worker(const struct worker *w, struct ms_hook_ctx *c, int hook, const struct plan_rt *rt) {
  ctx_base(w->e, c, hook, w->id, rt, w->step, w->rows);
}

static inline void ctx_event(struct ms_hook_ctx *c, const struct plan_rt *rt, int ev, uint64_t gen) {
  const struct ms_event *E = &rt->plan->events[ev];
  uint64_t cnt = atomic_load_explicit(&rt->counters[ev], memory_order_relaxed);
  uint64_t base = (uint64_t)E->needed * gen;
  ms_ctx_fill_event(c, E, ev);
  c->event_count = cnt > base ? cnt - base : 0;
  /* a late hook can see the next run of this plan count already: this step's count stops at needed */
  if (c->event_count > (uint64_t)E->needed) c->event_count = (uint64_t)E->needed;
}

/* When task t became ready: its event's firing, if the firing worker published
 * it for this generation; the step start for tasks that wait on nothing. */
static inline uint64_t task_ready_ns(struct ms_engine *e, const struct plan_rt *rt, int t, uint64_t gen,
                              uint64_t now) {
  int ev = rt->plan->tasks[t].wait;
  if (ev < 0) return e->step_t0;
  if (atomic_load_explicit(&rt->fire_gen[ev], memory_order_acquire) == gen + 1)
    return atomic_load_explicit(&rt->fire_ns[ev], memory_order_relaxed);
  return now;
}

/* The request fields of batch row `row` in the layout of c->step. A hook fired
 * after its task's trigger can read the rows while worker 0 lays out the next
 * step: it keeps them only when it read them inside one unchanged layout of its
 * own step (the seqlock publish_hook_rows writes, as msd_ctx_task reads on the
 * device); otherwise req_slot and req_gen stay MS_HOOK_NONE32 and ctx_len 0. */
static inline void ctx_row(struct ms_engine *e, struct ms_hook_ctx *c, int row) {
  const struct hook_row *h = &e->hook_rows[row];
  /* Acquire loads rather than relaxed ones and a fence (which ThreadSanitizer
   * does not model): each keeps the re-check below after it, and one that sees
   * a rewritten row also sees the odd count stored before that row (release). */
  uint32_t seq = atomic_load_explicit(&e->layout_seq, memory_order_acquire);
  uint32_t slot = atomic_load_explicit(&h->slot, memory_order_acquire);
  uint32_t gen = atomic_load_explicit(&h->gen, memory_order_acquire);
  uint32_t pos = atomic_load_explicit(&h->pos, memory_order_acquire);
  uint64_t step = atomic_load_explicit(&e->layout_step, memory_order_acquire);
  if ((seq & 1) || atomic_load_explicit(&e->layout_seq, memory_order_relaxed) != seq || step != c->step ||
      slot == MS_HOOK_NONE32)
    return;
  c->req_slot = slot;
  c->req_gen = gen;
  c->ctx_len = pos + 1;
}

static inline void ctx_task(struct ms_engine *e, struct ms_hook_ctx *c, const struct plan_rt *rt, int t,
                     uint64_t gen) {
  const struct ms_task *k = &rt->plan->tasks[t];
  ms_ctx_fill_task(c, k, t);
  if (k->tile[1] >= 0) ctx_row(e, c, k->tile[1]);
  c->t_ready = task_ready_ns(e, rt, t, gen, c->now_ns);
}

/* ABI v2, task_begin and task_end: the work task t does in its step (in
 * flight: the batch metadata is its own), how many other JIT tasks were taken
 * while it waited in a JIT queue (rt->passed, written by the pop that took it),
 * and its remote producer: when the trigger that completed its event in this
 * generation came from another device, that event, the device and the step. */
static inline void ctx_work(struct ms_engine *e, struct ms_hook_ctx *c, const struct plan_rt *rt, int t,
                            uint64_t gen) {
  const struct ms_task *k = &rt->plan->tasks[t];
  c->work_rows = ms_rt_task_rows(e, rt, t);
  c->work_bytes = ms_rt_task_bytes(e, rt, t, c->work_rows);
  c->passed_over = k->launch == MS_LAUNCH_JIT && e->o.mode == MS_MODE_MEGAKERNEL
                       ? atomic_load_explicit(&rt->passed[t], memory_order_relaxed)
                       : 0;
  if (k->wait < 0 || atomic_load_explicit(&rt->fire_gen[k->wait], memory_order_acquire) != gen + 1) return;
  uint32_t dev = atomic_load_explicit(&rt->fire_dev[k->wait], memory_order_relaxed);
  if (dev == c->device) return;
  c->remote_event = (uint32_t)k->wait;
  c->remote_device = dev;
  c->remote_gen = c->step;
}

/* Fires a task hook (t < 0: the end-of-step wait, no task); returns the
 * sched_hint priority, or -1. */
static inline int fire_task_hook(struct worker *w, int hook, struct plan_rt *rt, int t, uint64_t gen, int ev,
                          uint64_t t_begin) {
  struct ms_engine *e = w->e;
  struct ms_hook_ctx c;
  ctx_worker(w, &c, hook, rt);
  if (t >= 0)
    ctx_task(e, &c, rt, t, gen);
  else
    c.task_class = c.op = c.task_index = MS_HOOK_NONE32;
  if (ev >= 0) ctx_event(&c, rt, ev, gen);
  if (hook == MS_HOOK_TASK_BEGIN || hook == MS_HOOK_TASK_END) {
    c.t_begin = t_begin;
    c.wait_ns = w->wait_ns;
    ctx_work(e, &c, rt, t, gen);
    if (hook == MS_HOOK_TASK_END) c.t_end = c.now_ns;
  }
  if (hook == MS_HOOK_DEP_WAIT) c.wait_reason = t >= 0 ? MS_WAIT_DEPENDENCY : MS_WAIT_STEP_END;
  return ms_hook_fire(e->hooks, &c);
}

/* The comm hook of a communication task (tensor parallel): the device's share of
 * an all-gather is issued (task start) or complete (task end). comm_gen names
 * the collective (every device's share of it has the same): the step and the
 * communication class. peer: the next device in the ring. ABI v2: the remote
 * side is the collective's event (every device's share triggers it, and the
 * peer's consumers wait on it) on the peer, in this step. */
static inline void fire_comm_hook(struct worker *w, struct plan_rt *rt, int t, uint64_t gen, int phase) {
  struct ms_engine *e = w->e;
  const struct ms_task *k = &rt->plan->tasks[t];
  int D = e->o.tp > 1 ? e->o.tp : 1;
  struct ms_hook_ctx c;
  ctx_worker(w, &c, MS_HOOK_COMM, rt);
  ctx_task(e, &c, rt, t, gen);
  c.device = (uint32_t)k->tile[2];
  c.peer = (uint32_t)((k->tile[2] + 1) % D);
  if (e->tx && k->tile[2] != e->rank) {  /* across processes: this rank receives device tile[2]'s share */
    c.device = (uint32_t)e->rank;
    c.peer = (uint32_t)k->tile[2];
  }
  c.comm_phase = (uint32_t)phase;
  c.comm_gen = c.step << 16 | k->cls;
  c.remote_event = k->trigger >= 0 ? (uint32_t)k->trigger : MS_HOOK_NONE32;
  c.remote_device = k->trigger >= 0 ? c.peer : MS_HOOK_NONE32;
  c.remote_gen = k->trigger >= 0 ? c.step : 0;
  ms_hook_fire(e->hooks, &c);
}

static inline void fire_step_hook(struct ms_engine *e, const struct plan_rt *rt, int phase) {
  struct ms_hook_ctx c;
  ctx_common(e, &c, MS_HOOK_STEP, 0, rt);
  c.phase = (uint32_t)phase;
  ms_hook_fire(e->hooks, &c);
}

static inline void fire_request_hook(struct ms_engine *e, int worker, const struct plan_rt *rt, int slot,
                              int phase, int token) {
  struct ms_hook_ctx c;
  ctx_common(e, &c, MS_HOOK_REQUEST, worker, rt);
  c.req_slot = (uint32_t)slot;
  c.req_gen = e->slots[slot].gen;
  c.ctx_len = (uint32_t)e->slots[slot].pos;
  c.phase = (uint32_t)phase;
  c.token = (uint32_t)token;
  if (e->slots[slot].req) {
    c.prompt_tokens = (uint32_t)e->slots[slot].req->n_prompt;
    c.cached_tokens = (uint32_t)e->slots[slot].req->n_cached;
  }
  ms_hook_fire(e->hooks, &c);
}

/* w: the worker whose JIT push crossed the threshold; NULL: worker 0 at the
 * step start (the mailbox). */
static inline void fire_queue_hook(struct ms_engine *e, const struct worker *w, const struct plan_rt *rt, int kind,
                            uint32_t depth) {
  struct ms_hook_ctx c;
  if (w)
    ctx_worker(w, &c, MS_HOOK_QUEUE_PRESSURE, rt);
  else
    ctx_common(e, &c, MS_HOOK_QUEUE_PRESSURE, 0, rt);
  c.queue_kind = (uint32_t)kind;
  c.queue_depth = depth;
  c.queue_threshold = MS_QUEUE_THRESHOLD;
  ms_hook_fire(e->hooks, &c);
}

#endif
