/* SPDX-License-Identifier: MIT */
/* Hook sites of the runtime (every backend fires the same): filling the
 * context of each hook from the plan (core/ctx_fill.h, the device's too), the
 * batch metadata and the worker.
 * Included by the files that fire hooks (step.c, requests.c, backend/cpu.c).
 * A site first checks ms_hook_armed (one relaxed load and a branch), fills the
 * context once and hands it to the hook table (every task hook's site is
 * step.c's ms_rt_task_hook); everything here runs only when something is
 * attached. */
#ifndef MS_RUNTIME_HOOKSITE_H
#define MS_RUNTIME_HOOKSITE_H

#include <string.h>

#include "core/ctx_fill.h"
#include "runtime/runtime_impl.h"
#include "runtime/work.h"

#define HOOK_ARMED(e, h) (HOOKS_ON(e) && ms_hook_armed((e)->hooks, (h)))

/* The fields every hook has; step and rows: the step the firing belongs to. */
static inline void ctx_base(struct ms_engine *e, struct ms_hook_ctx *c, int hook, int worker,
                     const struct plan_rt *rt, uint64_t step, int rows) {
  ms_ctx_fill_base(c, hook, ms_eng_now(e), (uint32_t)worker, (uint32_t)e->workers[worker].device, step,
                   rt ? (uint32_t)rows : 0, rt ? (uint32_t)rt->plan->batch : 0);
}

/* Hooks of the step in flight: fired by worker 0 at a step's start or end, or
 * from a task's body (its step cannot end before the task does). */
static inline void ctx_common(struct ms_engine *e, struct ms_hook_ctx *c, int hook, int worker,
                       const struct plan_rt *rt) {
  ctx_base(e, c, hook, worker, rt, atomic_load_explicit(&e->cur_step, memory_order_relaxed),
           rt ? rt->x.meta.n_rows : 0);
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

/* The request of batch row `row` (-1: none) in the layout of step `step`. A
 * hook fired after its task's trigger can read the rows while worker 0 lays out
 * the next step: it keeps them only when it read them inside one unchanged
 * layout of its own step (the seqlock publish_hook_rows writes, as msd_ctx_task
 * reads on the device); otherwise slot and gen stay MS_HOOK_NONE32 and ctx_len 0. */
struct row_req {
  uint32_t slot, gen, ctx_len;
};
static inline struct row_req row_req(struct ms_engine *e, int row, uint64_t step) {
  struct row_req none = {MS_HOOK_NONE32, MS_HOOK_NONE32, 0};
  if (row < 0) return none;
  const struct hook_row *h = &e->hook_rows[row];
  /* Acquire loads rather than relaxed ones and a fence (which ThreadSanitizer
   * does not model): each keeps the re-check below after it, and one that sees
   * a rewritten row also sees the odd count stored before that row (release). */
  uint32_t seq = atomic_load_explicit(&e->layout_seq, memory_order_acquire);
  uint32_t slot = atomic_load_explicit(&h->slot, memory_order_acquire);
  uint32_t gen = atomic_load_explicit(&h->gen, memory_order_acquire);
  uint32_t pos = atomic_load_explicit(&h->pos, memory_order_acquire);
  uint64_t at = atomic_load_explicit(&e->layout_step, memory_order_acquire);
  if ((seq & 1) || atomic_load_explicit(&e->layout_seq, memory_order_relaxed) != seq || at != step ||
      slot == MS_HOOK_NONE32)
    return none;
  return (struct row_req){slot, gen, pos + 1};
}

/* The context of task hook `hook` (task_ready, task_assign, task_begin,
 * task_end, dep_wait, dep_release) of task t on worker w, t < 0: the
 * end-of-step wait (no task), filled once: what the runtime knows is read
 * first (the row's request, when the task became ready), then written.
 * Hooks of a worker's tasks report the step the worker runs, not cur_step:
 * task_ready, task_assign, dep_release (and the JIT queue's queue_pressure)
 * fire after a trigger, and once the step's last trigger is counted worker 0
 * may publish the next step before they are done. task_begin and task_end (ABI
 * v2) carry the work the task does in its step (ms_rt_ctx_work, work.h).
 *
 * With comm, a communication task's start or end, comm gets its comm hook's
 * context: the task's fields, and the device's share of an all-gather issued
 * (start) or complete (end). comm_gen names the collective (every device's
 * share of it has the same): the step and the communication class. peer: the
 * next device in the ring. ABI v2: the remote side is the collective's event
 * (every device's share triggers it, and the peer's consumers wait on it) on
 * the peer, in this step. */
static inline void ctx_task_hook(struct worker *w, struct ms_hook_ctx *c, struct ms_hook_ctx *comm, int hook,
                                 const struct plan_rt *rt, int t, uint64_t gen, int ev, uint64_t arg) {
  struct ms_engine *e = w->e;
  const struct ms_task *k = t >= 0 ? &rt->plan->tasks[t] : NULL;
  uint64_t now = ms_eng_now(e);
  struct row_req q = row_req(e, k ? k->tile[1] : -1, w->step);
  uint64_t ready = k ? task_ready_ns(e, rt, t, gen, now) : 0;
  ms_ctx_fill_base(c, hook, now, (uint32_t)w->id, (uint32_t)w->device, w->step, rt ? (uint32_t)w->rows : 0,
                   rt ? (uint32_t)rt->plan->batch : 0);
  if (!k) {
    c->task_class = c->op = c->task_index = MS_HOOK_NONE32;
  } else {
    ms_ctx_fill_task(c, k, t);
    c->req_slot = q.slot;
    c->req_gen = q.gen;
    c->ctx_len = q.ctx_len;
    c->t_ready = ready;
  }
  if (comm && k) {  /* comm: a communication task's start or end, always a task */
    int D = e->o.tp > 1 ? e->o.tp : 1, dev = k->tile[2];
    *comm = *c;
    comm->hook = MS_HOOK_COMM;
    comm->device = (uint32_t)dev;
    comm->peer = (uint32_t)((dev + 1) % D);
    if (e->tx && dev != e->rank) {  /* across processes: this rank receives device dev's share */
      comm->device = (uint32_t)e->rank;
      comm->peer = (uint32_t)dev;
    }
    comm->comm_phase = hook == MS_HOOK_TASK_BEGIN ? MS_COMM_ISSUE : MS_COMM_COMPLETE;
    comm->comm_gen = comm->step << 16 | k->cls;
    comm->remote_event = k->trigger >= 0 ? (uint32_t)k->trigger : MS_HOOK_NONE32;
    comm->remote_device = k->trigger >= 0 ? comm->peer : MS_HOOK_NONE32;
    comm->remote_gen = k->trigger >= 0 ? comm->step : 0;
  }
  if (ev >= 0) ctx_event(c, rt, ev, gen);
  if (hook == MS_HOOK_TASK_BEGIN || hook == MS_HOOK_TASK_END) {
    c->t_begin = arg;
    c->wait_ns = w->wait_ns;
    ms_rt_ctx_work(e, c, rt, t, gen);
    if (hook == MS_HOOK_TASK_END) c->t_end = now;
  }
  if (hook == MS_HOOK_TASK_ASSIGN) c->queue_depth = (uint32_t)arg;  /* the queue it joined, or its tasks left */
  if (hook == MS_HOOK_DEP_WAIT) c->wait_reason = t >= 0 ? MS_WAIT_DEPENDENCY : MS_WAIT_STEP_END;
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

/* w: the worker whose JIT push crossed the threshold (the step it runs);
 * NULL: worker 0 at the step start (the mailbox, the step in flight). */
static inline void fire_queue_hook(struct ms_engine *e, const struct worker *w, const struct plan_rt *rt, int kind,
                            uint32_t depth) {
  struct ms_hook_ctx c;
  ctx_base(e, &c, MS_HOOK_QUEUE_PRESSURE, w ? w->id : 0, rt,
           w ? w->step : atomic_load_explicit(&e->cur_step, memory_order_relaxed),
           w ? w->rows : rt ? rt->x.meta.n_rows : 0);
  c.queue_kind = (uint32_t)kind;
  c.queue_depth = depth;
  c.queue_threshold = MS_QUEUE_THRESHOLD;
  ms_hook_fire(e->hooks, &c);
}

#endif
