/* SPDX-License-Identifier: MIT */
/* The step machine: what every backend runs, whoever plays the SMs.
 *
 * The step start (ms_rt_step_begin, on one SM: the CPU's worker 0, the
 * simulator's thread) retires finished requests, admits queued ones (continuous
 * batching), plans the rows (chunked prefill), lays them out with their KV
 * pages, picks the bucket's plan and publishes the step through the backend.
 * A task's life is ms_rt_task_start, ms_rt_task_body (the kernel, or the
 * sampling of its row) and ms_rt_task_finish, whose trigger counts the task's
 * event; the trigger that completes an event releases its successors (hooks,
 * JIT queues) and tells the backend (fired). The step ends when the end-of-step
 * event fires; ms_rt_step_end then does its bookkeeping.
 *
 * Ordering. A task's writes are published by the acq_rel fetch_add of its
 * trigger; a consumer's acquire load of the counter (or its acquire pop of a JIT
 * task pushed after the firing fetch_add) makes them visible. The step's
 * metadata is published by the backend's publish_step (a release). Hazards
 * across steps cannot occur: the next step starts only after the end-of-step
 * event. Hooks are the exception: task_ready, task_assign and dep_release fire
 * after the trigger that released their task, so they can overlap the next
 * step's start. They report the step their worker runs (worker.step, not
 * cur_step) and read a row's request from copies of the layout under a seqlock
 * (hook_rows, written by publish_hook_rows, read by row_req in hooksite.h). */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "megascope/reference.h"
#include "core/event.h"
#include "runtime/runtime_impl.h"
#include "runtime/fault.h"
#include "runtime/hooksite.h"

static void sample_row(struct worker *w, struct plan_rt *rt, const struct ms_task_class *k, int row);

/* ---- JIT queues (by sched_hint priority) ---- */

static uint32_t jit_depth(const struct ms_mpmc *q) {
  return (uint32_t)(atomic_load_explicit(&q->tail, memory_order_relaxed) -
                    atomic_load_explicit(&q->head, memory_order_relaxed));
}

static int jit_pop_any(struct ms_engine *e, struct plan_rt *rt, int64_t *t) {
  if (HOOKS_ON(e) && atomic_load_explicit(&e->hooks->hinted, memory_order_relaxed)) {
    for (int p = MS_PRIO_LEVELS - 1; p > 0; p--)
      if (!ms_mpmc_pop(&rt->jit[p], t)) return 0;
  }
  return ms_mpmc_pop(&rt->jit[0], t);
}

/* Hook ABI v2 passed_over: a JIT task queued at jit_mark[t] = the takes so
 * far is taken after jit_pops - jit_mark[t] other tasks were. Relaxed: the mark
 * is published by the queue's push and read after its pop, which order it.
 * Counted only while hook sites are checked (HOOKS_ON), so that the engine
 * with hooks off does no shared counting; a task pushed before hooks came on
 * reports the takes since its earlier mark (at most one step's worth). */
static void jit_taken(struct plan_rt *rt, int64_t t) {
  uint64_t n = atomic_fetch_add_explicit(&rt->jit_pops, 1, memory_order_relaxed);
  uint64_t m = atomic_load_explicit(&rt->jit_mark[t], memory_order_relaxed), d = n > m ? n - m : 0;
  atomic_store_explicit(&rt->passed[t], d < UINT32_MAX ? (uint32_t)d : UINT32_MAX - 1, memory_order_relaxed);
}

int ms_rt_jit_pop(struct ms_engine *e, struct plan_rt *rt, int64_t *t) {
  int rc = jit_pop_any(e, rt, t);
  /* fault injection (starve_task): the starved task goes back behind the next
   * one (keeping its mark: the tasks taken meanwhile passed it over) */
  if (!rc && e->faults && ms_fault_starved(e, rt, (int)*t)) {
    int64_t held = *t;
    rc = jit_pop_any(e, rt, t);
    MS_ASSERT(ms_mpmc_push(&rt->jit[0], held) == 0);
  }
  if (!rc && HOOKS_ON(e)) jit_taken(rt, *t);
  return rc;
}

int ms_rt_jit_empty(struct plan_rt *rt) {
  for (int p = 0; p < MS_PRIO_LEVELS; p++)
    if (atomic_load_explicit(&rt->jit[p].tail, memory_order_acquire) !=
        atomic_load_explicit(&rt->jit[p].head, memory_order_acquire))
      return 0;
  return 1;
}

/* ---- triggers and a task's life ---- */

/* The hook site of a task's hooks (runtime_impl.h): the context is filled
 * once, then handed to the hook table; a communication task's comm hook fires
 * after its task_begin and before its task_end. */
int ms_rt_task_hook(struct worker *w, int hook, struct plan_rt *rt, int t, uint64_t gen, int ev, uint64_t arg) {
  struct ms_engine *e = w->e;
  if (!HOOKS_ON(e)) return -1;
  int edge = t >= 0 && (hook == MS_HOOK_TASK_BEGIN || hook == MS_HOOK_TASK_END) &&
             rt->plan->tasks[t].kernel == MS_K_COMM;
  int own = ms_hook_armed(e->hooks, hook), comm = edge && ms_hook_armed(e->hooks, MS_HOOK_COMM);
  if (!own && !comm) return -1;
  struct ms_hook_ctx c, cc;
  ctx_task_hook(w, &c, comm ? &cc : NULL, hook, rt, t, gen, ev, arg);
  int prio = -1;
  if (comm && hook == MS_HOOK_TASK_END) ms_hook_fire(e->hooks, &cc);
  if (own) prio = ms_hook_fire(e->hooks, &c);
  if (comm && hook == MS_HOOK_TASK_BEGIN) ms_hook_fire(e->hooks, &cc);
  return prio;
}

/* Releases the successors of event ev, which producer's trigger fired:
 * dep_release, then for each successor task_ready (a sched_hint program may
 * give a JIT task a priority), JIT tasks onto the queue (task_assign,
 * queue_pressure at the threshold), and the queue's depth into the trace. */
static void release(struct worker *w, struct plan_rt *rt, int ev, uint64_t gen, int producer) {
  struct ms_engine *e = w->e;
  const struct ms_event *E = &rt->plan->events[ev];
  ms_rt_task_hook(w, MS_HOOK_DEP_RELEASE, rt, producer, gen, ev, 0);
  for (int t = E->first; t <= E->last; t++) {
    int prio = ms_rt_task_hook(w, MS_HOOK_TASK_READY, rt, t, gen, ev, 0);
    if (e->o.mode != MS_MODE_MEGAKERNEL || rt->plan->tasks[t].launch != MS_LAUNCH_JIT) continue;
    struct ms_mpmc *q = &rt->jit[prio > 0 ? prio : 0];
    if (HOOKS_ON(e))
      atomic_store_explicit(&rt->jit_mark[t], atomic_load_explicit(&rt->jit_pops, memory_order_relaxed),
                            memory_order_relaxed);
    MS_ASSERT(ms_mpmc_push(q, t) == 0);
    uint32_t depth = jit_depth(q);
    if (HOOKS_ON(e)) {
      ms_rt_task_hook(w, MS_HOOK_TASK_ASSIGN, rt, t, gen, -1, depth);
      if (depth == MS_QUEUE_THRESHOLD && ms_hook_armed(e->hooks, MS_HOOK_QUEUE_PRESSURE))
        fire_queue_hook(e, w, rt, MS_QUEUE_JIT, depth);
    }
    if (atomic_load_explicit(&e->trace_on, memory_order_relaxed)) ms_tel_qdepth(w, depth);
  }
}

/* Counts one trigger of event ev; returns 1 when it completed the event. */
int ms_rt_trigger_now(struct worker *w, struct plan_rt *rt, int ev, uint64_t gen, int producer) {
  struct ms_engine *e = w->e;
  const struct ms_event *E = &rt->plan->events[ev];
  uint64_t target = ms_event_target(E, gen);
  uint64_t old = atomic_fetch_add_explicit(&rt->counters[ev], 1, memory_order_acq_rel);
  if (old + 1 != target) return 0;
  /* published before the JIT pushes, so a JIT task always finds its t_ready */
  atomic_store_explicit(&rt->fire_ns[ev], ms_eng_now(e), memory_order_relaxed);
  /* across processes, a received share completes the event for its sender: the remote producer */
  const struct ms_task *pk = producer >= 0 ? &rt->plan->tasks[producer] : NULL;
  int dev = e->tx && pk && pk->kernel == MS_K_COMM ? pk->tile[2] : w->device;
  atomic_store_explicit(&rt->fire_dev[ev], (uint32_t)dev, memory_order_relaxed);
  atomic_store_explicit(&rt->fire_gen[ev], gen + 1, memory_order_release);
  release(w, rt, ev, gen, producer);
  e->be->fired(e->be_ctx, rt, ev);
  return 1;
}

/* A task's life in three parts, shared by every backend: the CPU runs them one
 * after the other on a worker thread, the simulator start and body at the
 * task's simulated begin and finish at its simulated end. */
uint64_t ms_rt_task_start(struct worker *w, struct plan_rt *rt, int t, uint64_t gen) {
  struct ms_engine *e = w->e;
  const struct ms_task *k = &rt->plan->tasks[t];
  uint64_t t0 = ms_eng_now(e);
  atomic_store_explicit(&w->since, t0, memory_order_relaxed);
  atomic_store_explicit(&w->running, t, memory_order_relaxed);
  ms_rt_task_hook(w, MS_HOOK_TASK_BEGIN, rt, t, gen, k->wait, t0);
  return t0;
}

void ms_rt_task_body(struct worker *w, struct plan_rt *rt, int t) {
  const struct ms_task *k = &rt->plan->tasks[t];
  if (rt->remote && (rt->remote[t] || atomic_load_explicit(&w->e->tx_failed, memory_order_relaxed))) {
    /* another rank's tile (its share comes with the gather), or the ranks
     * failed: the step runs out with no work and draws no token */
    return;
  }
  if (k->kernel == MS_K_COMM)
    ms_rt_comm_run(w, rt, t);
  else if (k->kernel == MS_K_SAMPLE)
    sample_row(w, rt, &rt->plan->classes[k->cls], k->tile[1]);
  else if (k->kernel != MS_K_STEP_START && !w->e->shape_only)  /* the step start's body ran before publication */
    ms_ops_run(&rt->x, t, w->id);
  /* fault injection (routing_skew): the router's output, where kernels run */
  if (k->kernel == MS_K_ROUTER && w->e->faults && !w->e->shape_only) ms_fault_route_row(w->e, rt, t);
}

/* A worker starts waiting for task t's event (t < 0: for the step's end). */
void ms_rt_dep_wait(struct worker *w, struct plan_rt *rt, int t, uint64_t gen, int ev) {
  atomic_store_explicit(&w->since, ms_eng_now(w->e), memory_order_relaxed);
  atomic_store_explicit(&w->waiting, t, memory_order_relaxed);
  ms_rt_task_hook(w, MS_HOOK_DEP_WAIT, rt, t, gen, ev, 0);
}

/* The task's end: its hooks, its telemetry (the trace record is filled now,
 * while the step's rows are its own, and published after the trigger with the
 * event it completed), then its trigger. fault injection (delayed_release): the
 * completing trigger may be held; a held one (simulator) completes the event
 * later, so it counts as firing. */
void ms_rt_task_finish(struct worker *w, struct plan_rt *rt, int t, uint64_t gen, uint64_t t0) {
  struct ms_engine *e = w->e;
  const struct ms_task *k = &rt->plan->tasks[t];
  uint64_t t1 = ms_eng_now(e);
  ms_rt_task_hook(w, MS_HOOK_TASK_END, rt, t, gen, k->wait, t0);
  struct trace_rec rec;
  int traced = ms_tel_task(w, rt, t, t0, t1, &rec);
  atomic_store_explicit(&w->running, -1, memory_order_relaxed);
  atomic_store_explicit(&rt->done_gen[t], gen + 1, memory_order_relaxed);
  atomic_fetch_add_explicit(&w->tasks_done, 1, memory_order_relaxed);
  w->wait_ns = 0;
  int ev = k->trigger;
  int fired = e->faults && ms_fault_hold(w, rt, ev, ms_event_target(&rt->plan->events[ev], gen), t)
                  ? 1
                  : ms_rt_trigger_now(w, rt, ev, gen, t);
  if (traced) ms_tel_publish(w, &rec, fired ? (uint32_t)ev : MS_HOOK_NONE32);
}

/* ---- the step start ---- */

/* The step budget (ms_engine_opts.step_target_us): the prompt rows a step
 * with `decoding` running streams may take, from the measured step times: the
 * target less a step without a chunk, over what a chunk row adds. Without a
 * running stream, or before a chunk step was measured, or with the target
 * off: all of `left`. At least min(4, left): a queued prompt always advances. */
static int chunk_budget(const struct ms_engine *e, int decoding, int left) {
  if (e->o.step_target_us <= 0 || !decoding || e->est_row_ns <= 0) return left;
  double room = (double)e->o.step_target_us * 1e3 - e->est_step_ns, rows = room / e->est_row_ns;
  int floor = left < 4 ? left : 4;
  if (rows >= left) return left;  /* compared as doubles: a loose target is no int */
  return rows < floor ? floor : (int)rows;
}

/* Learns from the step just ended (worker 0, at its end): an average of the
 * step time without a chunk, and of what each chunk row added to a step with
 * one. The latter is (time - the former) / rows, so a chunk's fixed cost is
 * spread over its rows: a chunk sized from it converges to the one whose
 * step takes the target (the fixed point of k' = k * room / (time - base)). */
static void learn_step(struct ms_engine *e, const struct ms_step_record *r) {
  if (r->t_end <= r->t_begin) return;
  double t = (double)(r->t_end - r->t_begin);
  if (!r->chunk_rows) {
    e->est_step_ns = e->est_step_ns > 0 ? 0.75 * e->est_step_ns + 0.25 * t : t;
    return;
  }
  double base = e->est_step_ns < 0.5 * t ? e->est_step_ns : 0.5 * t, row = (t - base) / r->chunk_rows;
  e->est_row_ns = e->est_row_ns > 0 ? 0.75 * e->est_row_ns + 0.25 * row : row;
}

/* Chunked prefill: how many rows each active slot gets this step (sl->chunk),
 * the total in *rows, the slots in *slots, the running streams in *decoding;
 * 1 when the step needs the bucket's prefill plan. A slot past its prompt
 * gets one row (decode rows first); the rows left under the token budget
 * (and the step budget, chunk_budget) go to slots still in their prompt, at
 * most the rest of the prompt but its last position (whose row samples the
 * first token): in slot order, or with the step budget on, oldest admitted
 * first. The budget is also the largest prefill plan compiled so far. */
static int plan_chunks(struct ms_engine *e, int *rows, int *slots, int *decoding) {
  int active = 0, chunked = 0, dec = 0;
  for (int s = 0; s < e->n_slots; s++)
    if (e->slots[s].req) {
      e->slots[s].chunk = 1, active++;
      dec += e->slots[s].pos >= e->slots[s].req->n_prompt - 1;
    }
  *slots = active;
  *decoding = dec;
  int ready = atomic_load_explicit(&e->prefill_ready, memory_order_acquire);  /* rows of the largest */
  int left = (e->o.max_batched_tokens < ready ? e->o.max_batched_tokens : ready) - active;
  if (left > 0) left = chunk_budget(e, dec, left);
  int by_age = e->o.step_target_us > 0;
  for (int s = 0; s < e->n_slots && left > 0;) {
    int pick = s;
    if (by_age) {  /* the oldest admitted slot still in its prompt without rows beyond its one */
      pick = -1;
      for (int q = 0; q < e->n_slots; q++) {
        struct slot *c = &e->slots[q];
        if (c->req && c->chunk == 1 && c->pos < c->req->n_prompt - 1 &&
            (pick < 0 || c->admit_seq < e->slots[pick].admit_seq))
          pick = q;
      }
      if (pick < 0) break;
    } else {
      s++;
    }
    struct slot *sl = &e->slots[pick];
    if (!sl->req || sl->pos >= sl->req->n_prompt - 1) continue;
    int extra = sl->req->n_prompt - 1 - sl->pos;
    if (extra > left) extra = left;
    sl->chunk += extra;
    left -= extra;
    active += extra;
    chunked = 1;
  }
  *rows = active;
  return chunked;
}

/* Lays out the rows of the step: active slots in slot order from a slot that
 * moves on by one each step, each its chunk of consecutive positions (one row
 * but in chunked prefill), padding to the bucket, KV pages for every position.
 * Why it moves: a row's place in the step is a place in the workers' static
 * task order, and places cost differently (Gemma-3 at batch 8, slots in a
 * fixed order: slots 0 and 1's attention 0.97-1.31x the context line, slots
 * 2-4's 0.71-0.99x, in one window); with each slot on every row in turn that
 * cost is no request's, and explain finds a slot slow in itself (Gemma-3's
 * requests slowed 2x: missed in five of the six held-out sets before, found
 * in the two after). */
static int layout_rows(struct ms_engine *e, int bucket) {
  int n = 0, first = e->n_slots > 0 ? (int)(e->next_step % (uint64_t)e->n_slots) : 0;
  for (int i = 0; i < e->n_slots; i++) {
    int s = (first + i) % e->n_slots;
    struct slot *sl = &e->slots[s];
    if (!sl->req) continue;
    for (int j = 0; j < sl->chunk; j++) {
      int pos = sl->pos + j;
      ms_rt_kv_reserve(e, sl, pos);
      e->row_slot[n] = s;
      e->row_pos[n] = pos;
      e->row_token[n] = j ? sl->req->prompt[pos] : sl->next_token;  /* a chunk lies inside the prompt */
      e->row_pages[n] = sl->pages;
      /* its logits are read: the row that draws a token (a chunk's last row
       * once the prompt is in; a prompt chunk's feeds the next prompt token and
       * needs none, row_advance), or every row of a recorded request */
      e->row_head[n] = (j == sl->chunk - 1 && pos + 1 >= sl->req->n_prompt) || sl->req->record;
      n++;
    }
  }
  for (int r = n; r < bucket; r++) {
    e->row_slot[r] = -1;
    e->row_pos[r] = 0;
    e->row_token[r] = 0;
    e->row_pages[r] = NULL;
  }
  return n;
}

/* Copies the rows' request fields for hooks, a seqlock write (see hook_rows in
 * runtime_impl.h; the device does the same in msd_step_start). */
static void publish_hook_rows(struct ms_engine *e, int bucket, uint64_t step) {
  uint32_t seq = atomic_load_explicit(&e->layout_seq, memory_order_relaxed);  /* worker 0 only writes it */
  atomic_store_explicit(&e->layout_seq, seq + 1, memory_order_relaxed);
  /* Odd before any row changes. Each row store is a release (not relaxed
   * stores after a fence, which ThreadSanitizer does not model): a reader whose
   * acquire load sees a new value also sees the odd count on its re-check. */
  for (int r = 0; r < bucket; r++) {
    int s = e->row_slot[r];
    struct hook_row *h = &e->hook_rows[r];
    atomic_store_explicit(&h->slot, s >= 0 ? (uint32_t)s : MS_HOOK_NONE32, memory_order_release);
    atomic_store_explicit(&h->gen, s >= 0 ? e->slots[s].gen : MS_HOOK_NONE32, memory_order_release);
    atomic_store_explicit(&h->pos, (uint32_t)e->row_pos[r], memory_order_release);
  }
  atomic_store_explicit(&e->layout_step, step, memory_order_release);
  /* even again: a reader that loads this with acquire sees every row above */
  atomic_store_explicit(&e->layout_seq, seq + 2, memory_order_release);
}

static void log_step_end(struct ms_engine *e) {
  pthread_mutex_lock(&e->log_mu);
  struct ms_step_record r = {0};
  if (e->step_log_n) {
    struct ms_step_record *last = &e->step_log[(e->step_log_n - 1) % MS_STEP_LOG];
    last->t_end = ms_eng_now(e);
    r = *last;
  }
  pthread_mutex_unlock(&e->log_mu);
  if (e->step_log_n) learn_step(e, &r);
}

/* The hooks of a step's start, fired by worker 0 after it published the step. */
static void step_hooks(struct ms_engine *e, struct plan_rt *rt, const int *admitted, int n_admitted) {
  if (HOOK_ARMED(e, MS_HOOK_STEP)) fire_step_hook(e, rt, MS_STEP_BEGIN);
  if (HOOK_ARMED(e, MS_HOOK_REQUEST))
    for (int i = 0; i < n_admitted; i++) fire_request_hook(e, 0, rt, admitted[i], MS_REQ_ADMITTED, 0);
  uint32_t depth = (uint32_t)atomic_load_explicit(&e->queued, memory_order_relaxed);
  if (depth >= MS_QUEUE_THRESHOLD && HOOK_ARMED(e, MS_HOOK_QUEUE_PRESSURE))
    fire_queue_hook(e, NULL, rt, MS_QUEUE_MAILBOX, depth);
}

/* A pause requested for this step: wait (worker 0) until resumed or stopped.
 * pause_seq is read before pause_at is checked, so a resume in between wakes
 * the futex wait at once. */
static void maybe_pause(struct ms_engine *e) {
  if (e->next_step < atomic_load_explicit(&e->pause_at, memory_order_acquire)) return;
  /* paused holds the step it waits at, + 1 (0: running) */
  atomic_store_explicit(&e->paused, (uint32_t)e->next_step + 1, memory_order_release);
  ms_futex_wake_all(&e->paused);
  for (;;) {
    uint32_t seq = atomic_load_explicit(&e->pause_seq, memory_order_acquire);
    if (e->next_step < atomic_load_explicit(&e->pause_at, memory_order_acquire) ||
        atomic_load_explicit(&e->stop_req, memory_order_acquire))
      break;
    if (e->lead == MS_LEAD_LEADER) ms_rt_lead_idle(e);  /* the followers hear it is alive */
    ms_futex_wait(&e->pause_seq, seq, 200);
  }
  atomic_store_explicit(&e->paused, 0, memory_order_release);
}

/* A stop step: every request left cancelled; the workers exit on it. A
 * leader tells its followers first. */
static int publish_stop(struct ms_engine *e) {
  if (e->lead == MS_LEAD_LEADER) ms_rt_lead_stop(e);
  ms_rt_retire(e, 1);
  ms_rt_cancel_mailbox(e);
  atomic_store_explicit(&e->cur_stop, 1, memory_order_relaxed);
  e->be->publish_step(e->be_ctx);
  atomic_store_explicit(&e->stopped, 1, memory_order_release);
  ms_futex_wake_all(&e->stopped);
  return 0;
}

/* A follower's step (lead.c set each slot's chunk from rank 0's header): the
 * rows, slots and running streams as plan_chunks counts them; 1 with a chunk. */
static int follow_chunks(struct ms_engine *e, int *rows, int *slots, int *decoding) {
  int n = 0, active = 0, dec = 0, chunked = 0;
  for (int s = 0; s < e->n_slots; s++) {
    struct slot *sl = &e->slots[s];
    if (!sl->req) continue;
    active++;
    n += sl->chunk;
    chunked |= sl->chunk > 1;
    dec += sl->pos >= sl->req->n_prompt - 1;
  }
  *rows = n;
  *slots = active;
  *decoding = dec;
  return chunked;
}

/* The leader's and a lone engine's step start up to the rows: retire, admit
 * (waiting while there is nothing to run), chunk. 1, or 0 when it stops. */
static int decide_step(struct ms_engine *e, uint64_t *t0, int *retired, int *admitted, int *rows, int *slots,
                       int *decoding, int *chunked) {
  if (e->lead == MS_LEAD_LEADER) ms_rt_lead_mark(e);
  *retired = ms_rt_retire(e, 0);
  *admitted = 0;
  for (;;) {
    *admitted += ms_rt_admit(e, e->admit_slots + *admitted);
    if (atomic_load_explicit(&e->stop_req, memory_order_acquire)) return 0;
    if (ms_rt_active_slots(e)) break;
    atomic_store_explicit(&e->stat_running, 0, memory_order_relaxed);
    atomic_store_explicit(&e->stat_pages_used, ms_pc_pages_held(e), memory_order_relaxed);
    maybe_pause(e);  /* a pause asked for while idle: before admitting more */
    if (e->lead == MS_LEAD_LEADER) ms_rt_lead_idle(e);
    uint32_t seq = atomic_load_explicit(&e->mail_seq, memory_order_acquire);
    if (atomic_load_explicit(&e->mail.tail, memory_order_acquire) ==
            atomic_load_explicit(&e->mail.head, memory_order_acquire) &&
        !atomic_load_explicit(&e->stop_req, memory_order_acquire))
      ms_futex_wait(&e->mail_seq, seq, 200);
    *t0 = ms_eng_now(e);  /* idle time is not step time */
  }
  *chunked = plan_chunks(e, rows, slots, decoding);
  /* across processes, serving: the followers learn the step */
  return e->lead != MS_LEAD_LEADER || !ms_rt_lead_send(e, *admitted);
}

/* The step-start task's body, on worker 0. Returns 0 when a stop was published. */
int ms_rt_step_begin(struct ms_engine *e) {
  maybe_pause(e);
  uint64_t t0 = ms_eng_now(e);
  int retired = 0, admitted = 0, rows = 0, slots = 0, decoding = 0, chunked = 0;
  if (e->lead == MS_LEAD_FOLLOWER) {  /* rank 0 decided this step: its header says what */
    if (!ms_rt_follow(e, &retired, &admitted)) return publish_stop(e);
    t0 = ms_eng_now(e);  /* waiting for rank 0 is not step time */
    chunked = follow_chunks(e, &rows, &slots, &decoding);
  } else if (!decide_step(e, &t0, &retired, &admitted, &rows, &slots, &decoding, &chunked)) {
    return publish_stop(e);
  }
  int bucket = ms_bucket_for(rows);
  struct plan_rt *rt = chunked ? &e->rt_prefill[ms_rt_bucket_index(bucket)] : &e->rt[ms_rt_bucket_index(bucket)];
  int n = layout_rows(e, bucket);
  /* across processes: every rank must have laid out this very step */
  if (e->tx && ms_rt_dist_agree(e, bucket, n, chunked)) return publish_stop(e);
  rt->x.meta.some_head_skipped = 0;
  for (int r = 0; r < n; r++) rt->x.meta.some_head_skipped |= !e->row_head[r];
  atomic_store_explicit(&e->stat_running, slots, memory_order_relaxed);  /* requests, not rows */
  atomic_store_explicit(&e->stat_pages_used, ms_pc_pages_held(e), memory_order_relaxed);
  rt->x.meta.n_rows = n;
  rt->x.meta.step = e->next_step;
  publish_hook_rows(e, bucket, e->next_step);
  pthread_mutex_lock(&e->log_mu);
  struct ms_step_record *rec = &e->step_log[e->step_log_n++ % MS_STEP_LOG];
  *rec = (struct ms_step_record){.step = e->next_step, .rows = n, .bucket = bucket,
                                 .admitted = admitted, .retired = retired, .t_begin = t0,
                                 .decoding = decoding, .chunk_rows = n - slots};
  pthread_mutex_unlock(&e->log_mu);
  atomic_store_explicit(&e->cur_step, e->next_step++, memory_order_relaxed);
  atomic_store_explicit(&e->cur_gen, rt->gen++, memory_order_relaxed);
  atomic_store_explicit(&e->cur, rt, memory_order_relaxed);
  atomic_fetch_add_explicit(&e->positions, (uint64_t)n, memory_order_relaxed);
  e->step_t0 = t0;
  e->be->publish_step(e->be_ctx);
  if (HOOKS_ON(e)) step_hooks(e, rt, e->admit_slots, admitted);
  return 1;
}

void ms_rt_step_end(struct ms_engine *e) {
  if (!e->step_log_n) return;  /* no step yet */
  if (HOOK_ARMED(e, MS_HOOK_STEP)) fire_step_hook(e, atomic_load_explicit(&e->cur, memory_order_relaxed), MS_STEP_END);
  log_step_end(e);
  atomic_fetch_add_explicit(&e->steps, 1, memory_order_relaxed);
}

/* ---- sampling a row ---- */

/* The log-probabilities of draw n under the model's own distribution (before
 * penalties, bias and temperature): the chosen token's, and the top_lp best
 * (most probable first, lower id on ties). */
static void record_logprobs(struct ms_request *r, const float *lg, int vocab, int n, int tok) {
  float mx = lg[ms_argmax(lg, vocab)];
  double z = 0;
  for (int i = 0; i < vocab; i++) z += exp((double)(lg[i] - mx));
  float lse = mx + (float)log(z);
  r->lp[n] = lg[tok] - lse;
  int k = r->top_lp, have = 0;
  if (!k) return;
  int32_t *ids = r->top_ids + (size_t)n * (size_t)k;
  float *vals = r->top_vals + (size_t)n * (size_t)k;
  for (int i = 0; i < vocab; i++) {  /* insertion into the k best so far */
    if (have == k && !(lg[i] > vals[k - 1])) continue;
    int j = have < k ? have++ : k - 1;
    while (j > 0 && lg[i] > vals[j - 1]) {
      vals[j] = vals[j - 1];
      ids[j] = ids[j - 1];
      j--;
    }
    vals[j] = lg[i];
    ids[j] = i;
  }
  for (int j = 0; j < k; j++) vals[j] -= lse;
}

/* The logits draw n samples from: logit_bias added, presence and frequency
 * penalties subtracted for the tokens generated so far (r->adj, this row's
 * task its only writer). stamp[t] == n + 1 marks a token already penalised
 * for presence in this draw, so each distinct token pays it once, in O(n). */
static const float *adjusted_logits(struct ms_request *r, const float *lg, int vocab, int n) {
  if (!r->adj) return lg;
  memcpy(r->adj, lg, sizeof(float) * (size_t)vocab);
  for (int i = 0; i < r->n_bias; i++) r->adj[r->bias_ids[i]] += r->bias_vals[i];
  if (!r->stamp) return r->adj;
  for (int i = 0; i < n; i++) {
    int t = r->tokens[i];
    r->adj[t] -= r->frequency;
    if (r->stamp[t] != n + 1) {
      r->stamp[t] = n + 1;
      r->adj[t] -= r->presence;
    }
  }
  return r->adj;
}

static int is_stop_token(const struct ms_engine *e, const struct ms_request *r, int tok) {
  if (r->stop_eos && tok == e->m->cfg.eos) return 1;
  for (int i = 0; i < r->n_stop; i++)
    if (r->stop_ids[i] == tok) return 1;
  return 0;
}

/* Token n of slot s's request is tok: its bookkeeping (finish, wake, hook). */
static void emit_token(struct worker *w, struct plan_rt *rt, int s, int n, int tok) {
  struct ms_engine *e = w->e;
  struct slot *sl = &e->slots[s];
  struct ms_request *r = sl->req;
  r->tokens[n] = tok;
  uint64_t now = ms_eng_now(e);
  if (n > 0) {  /* inter-token latency: since this request's previous token */
    uint64_t d = now - atomic_load_explicit(&r->t_last, memory_order_relaxed);
    int b = 0;
    while (b < MS_LAT_BUCKETS && (double)d > ms_latency_bounds[b] * 1e9) b++;
    atomic_fetch_add_explicit(&w->itl_counts[b], 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&w->itl_sum_ns, d, memory_order_relaxed);
  }
  atomic_store_explicit(&r->t_last, now, memory_order_relaxed);
  if (n == 0) r->t_first = now;
  atomic_store_explicit(&r->n_tokens, n + 1, memory_order_release);
  atomic_fetch_add_explicit(&e->tokens, 1, memory_order_relaxed);
  sl->next_token = tok;
  if (is_stop_token(e, r, tok))
    atomic_store_explicit(&r->finish, MS_FINISH_STOP, memory_order_relaxed);
  else if (n + 1 >= r->max_new)
    atomic_store_explicit(&r->finish, MS_FINISH_LENGTH, memory_order_relaxed);
  if (atomic_load_explicit(&r->finish, memory_order_relaxed)) sl->finishing = 1;
  ms_rt_request_tick(r);
  if (HOOK_ARMED(e, MS_HOOK_REQUEST))
    fire_request_hook(e, w->id, rt, s, n == 0 ? MS_REQ_FIRST_TOKEN : MS_REQ_TOKEN, tok);
}

/* The slot of row `row` when the row moves its request on (its last row of
 * the step; a prompt position feeds the next prompt token): the slot and
 * its request's token count, or -1 when the row draws no token. */
static int row_advance(struct ms_engine *e, const struct ms_exec_ctx *x, int row, int *n) {
  int s = x->meta.row_slot[row];
  /* In chunked prefill the slot's other rows come before this one; only the
   * last touches the slot, so it keeps one writer per step. */
  if (row + 1 < x->meta.n_rows && x->meta.row_slot[row + 1] == s) return -1;
  struct slot *sl = &e->slots[s];
  struct ms_request *r = sl->req;
  sl->pos = x->meta.row_pos[row] + 1;
  if (sl->pos < r->n_prompt) {
    sl->next_token = r->prompt[sl->pos];
    return -1;
  }
  *n = atomic_load_explicit(&r->n_tokens, memory_order_relaxed);
  return s;
}

/* Sampling for one row, and the request's bookkeeping: prompt positions feed
 * the next prompt token, later ones emit a token. Only this row's task touches
 * this slot during the step. */
static void sample_row(struct worker *w, struct plan_rt *rt, const struct ms_task_class *k, int row) {
  struct ms_engine *e = w->e;
  const struct ms_exec_ctx *x = &rt->x;
  int s = x->meta.row_slot[row], n;
  if (row >= x->meta.n_rows || s < 0) return;
  if (e->lead == MS_LEAD_FOLLOWER) {  /* rank 0 draws; its token comes with the next step's header */
    row_advance(e, x, row, &n);
    return;
  }
  struct ms_request *r = e->slots[s].req;
  int vocab = e->m->cfg.vocab, pos = x->meta.row_pos[row];
  const float *lg = ms_buf_row(x, k->in, 0, row);
  int last = row + 1 >= x->meta.n_rows || x->meta.row_slot[row + 1] != s;
  if (r->record) {  /* each row its own position; read once the request is done */
    memcpy(r->logits + (size_t)pos * (size_t)vocab, lg, sizeof(float) * (size_t)vocab);
    if (last) atomic_store_explicit(&r->n_logits, pos + 1, memory_order_release);
  }
  if (row_advance(e, x, row, &n) < 0) return;
  const float *use = adjusted_logits(r, lg, vocab, n);
  if (r->constrain) {  /* r->adj is allocated with a constraint, and use is it */
    r->constrain(r->constrain_user, r->tokens, n, r->adj, vocab);
    use = r->adj;
  }
  /* draw n of this request: seeded, schedule-independent; greedy is the argmax
   * (lowest id on ties) inside ms_sample, so the logits are scanned once */
  int tok = ms_sample(use, vocab, &r->sample, (uint64_t)n);
  if (tok < 0) tok = ms_argmax(use, vocab);  /* no memory for the candidates */
  if (r->logprobs) record_logprobs(r, lg, vocab, n, tok);
  emit_token(w, rt, s, n, tok);
}

int ms_rt_needs_logits(const struct ms_request *r) { return r->record || r->logprobs || r->adj != NULL; }

void ms_rt_sample_drawn(struct worker *w, struct plan_rt *rt, int row, int tok) {
  const struct ms_exec_ctx *x = &rt->x;
  int n, s;
  if (row >= x->meta.n_rows || x->meta.row_slot[row] < 0) return;
  if ((s = row_advance(w->e, x, row, &n)) >= 0) emit_token(w, rt, s, n, tok);
}
