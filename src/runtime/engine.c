/* SPDX-License-Identifier: MIT */
/* The persistent CPU runtime.
 *
 * DESIGN
 * Who runs what. n worker threads play the SMs; they are created by
 * ms_engine_new and live until ms_engine_free. Worker 0 also runs the step start:
 * it retires finished requests, admits queued ones (continuous batching), lays
 * out the batch rows, allocates KV pages, picks the bucket's plan and publishes
 * the step (cur, cur_gen, then step_seq with release). Every worker then walks its
 * AOT queue for that plan: for each task it waits until the task's event has
 * fired for this generation (counter >= needed * (gen + 1): counters are never
 * reset), runs it and triggers its event. The worker whose trigger fires an event
 * pushes the event's JIT successors onto the plan's MPMC queue; waiting workers
 * run JIT tasks while they wait. The step ends when the end-of-step event (fed by
 * every sink task) fires; worker 0 then starts the next step.
 * Per-op mode runs the same tasks by stage (operator), a barrier after each.
 *
 * Ordering. A task's writes are published by the acq_rel fetch_add of its
 * trigger; a consumer's acquire load of the counter (or its acquire pop of a JIT
 * task pushed after the firing fetch_add) makes them visible. The step's
 * metadata is published by the release store of step_seq. Hazards across steps
 * cannot occur: the next step starts only after the end-of-step event. Hooks
 * are the exception: task_ready, task_assign and dep_release fire after the
 * trigger that released their task, so they can overlap the next step's start.
 * They report the step their worker runs (worker.step, not cur_step) and read a
 * row's request from copies of the layout under a seqlock (hook_rows, written by
 * publish_hook_rows, read by ctx_row in hooksite.h).
 *
 * Sleeping. Waiters spin, then yield, then sleep on `progress`, a futex word
 * bumped after every event fire; `sleepers` is raised before the waiter reads
 * `progress` and re-checks its condition (seq_cst on both sides), so a fire
 * either is seen by the re-check or finds a sleeper to wake. An idle engine
 * (no requests) sleeps in worker 0 on mail_seq and in the others on step_seq.
 *
 * Shutdown. ms_engine_free raises stop_req and wakes worker 0; it finishes the
 * step in flight, cancels what is left and publishes a stop step; workers exit
 * and are joined. */
#include <errno.h>
#include <math.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kernels/quant.h"
#include "megascope/reference.h"
#include "runtime/engine_impl.h"
#include "runtime/fault.h"
#include "runtime/hooksite.h"

const char *ms_mode_name(enum ms_mode m) { return m == MS_MODE_PER_OP ? "per-op" : "megakernel"; }

int ms_mode_parse(const char *s, enum ms_mode *out) {
  if (!strcmp(s, "megakernel") || !strcmp(s, "mk"))
    *out = MS_MODE_MEGAKERNEL;
  else if (!strcmp(s, "per-op") || !strcmp(s, "perop"))
    *out = MS_MODE_PER_OP;
  else
    return -EINVAL;
  return 0;
}

static uint64_t rng_next(uint64_t *s) {
  uint64_t x = *s;
  x ^= x << 13;
  x ^= x >> 7;
  x ^= x << 17;
  return *s = x;
}

/* ---- wake-ups ---- */

static void notify(struct ms_engine *e) {
  atomic_fetch_add_explicit(&e->progress, 1, memory_order_seq_cst);
  if (atomic_load_explicit(&e->sleepers, memory_order_seq_cst)) ms_futex_wake_all(&e->progress);
}

/* ---- running one task ---- */

static void shuffle_delay(struct worker *w) {
  struct ms_engine *e = w->e;
  uint64_t r = rng_next(&w->rng);
  if (r & 1) return;
  uint64_t ns = (r >> 8) % ((uint64_t)e->o.shuffle_max_us * 1000 + 1);
  uint64_t until = ms_now_ns() + ns;
  if ((r >> 4) & 1) sched_yield();
  while (ms_now_ns() < until) ms_cpu_relax();
}

static void sleep_ns(uint64_t ns) {
  struct timespec ts = {(time_t)(ns / 1000000000ull), (long)(ns % 1000000000ull)};
  while (nanosleep(&ts, &ts) && errno == EINTR) {
  }
}

static void sample_row(struct worker *w, struct plan_rt *rt, const struct ms_task_class *k, int row);

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

int ms_rt_jit_pop(struct ms_engine *e, struct plan_rt *rt, int64_t *t) {
  int rc = jit_pop_any(e, rt, t);
  /* fault injection (starve_task): the starved task goes back behind the next one */
  if (rc || !e->faults || !ms_fault_starved(e, rt, (int)*t)) return rc;
  int64_t held = *t;
  rc = jit_pop_any(e, rt, t);
  MS_ASSERT(ms_mpmc_push(&rt->jit[0], held) == 0);
  return rc;
}

static int jit_empty(struct plan_rt *rt) {
  for (int p = 0; p < MS_PRIO_LEVELS; p++)
    if (atomic_load_explicit(&rt->jit[p].tail, memory_order_acquire) !=
        atomic_load_explicit(&rt->jit[p].head, memory_order_acquire))
      return 0;
  return 1;
}

/* Releases the successors of a fired event: task_ready for each (a sched_hint
 * program may give a JIT task a priority), JIT tasks onto the queue. */
static void release(struct worker *w, struct plan_rt *rt, int ev, uint64_t gen) {
  struct ms_engine *e = w->e;
  const struct ms_event *E = &rt->plan->events[ev];
  int ready = HOOK_ARMED(e, MS_HOOK_TASK_READY), assign = HOOK_ARMED(e, MS_HOOK_TASK_ASSIGN);
  for (int t = E->first; t <= E->last; t++) {
    int prio = ready ? fire_task_hook(w, MS_HOOK_TASK_READY, rt, t, gen, ev, 0) : -1;
    if (e->o.mode != MS_MODE_MEGAKERNEL || rt->plan->tasks[t].launch != MS_LAUNCH_JIT) continue;
    struct ms_mpmc *q = &rt->jit[prio > 0 ? prio : 0];
    MS_ASSERT(ms_mpmc_push(q, t) == 0);
    if (atomic_load_explicit(&e->trace_on, memory_order_relaxed)) ms_tel_qdepth(w, jit_depth(q));
    if (!HOOKS_ON(e)) continue;
    uint32_t depth = jit_depth(q);
    if (assign) fire_task_hook(w, MS_HOOK_TASK_ASSIGN, rt, t, gen, -1, depth);
    if (depth == MS_QUEUE_THRESHOLD && HOOK_ARMED(e, MS_HOOK_QUEUE_PRESSURE))
      fire_queue_hook(e, w, rt, MS_QUEUE_JIT, depth);
  }
}

/* Counts one trigger of event ev; returns 1 when it completed the event. */
int ms_rt_trigger_now(struct worker *w, struct plan_rt *rt, int ev, uint64_t gen, int producer) {
  struct ms_engine *e = w->e;
  const struct ms_event *E = &rt->plan->events[ev];
  uint64_t target = (uint64_t)E->needed * (gen + 1);
  uint64_t old = atomic_fetch_add_explicit(&rt->counters[ev], 1, memory_order_acq_rel);
  if (old + 1 != target) return 0;
  /* published before the JIT pushes, so a JIT task always finds its t_ready */
  atomic_store_explicit(&rt->fire_ns[ev], ms_eng_now(e), memory_order_relaxed);
  atomic_store_explicit(&rt->fire_gen[ev], gen + 1, memory_order_release);
  if (HOOK_ARMED(e, MS_HOOK_DEP_RELEASE)) fire_task_hook(w, MS_HOOK_DEP_RELEASE, rt, producer, gen, ev, 0);
  release(w, rt, ev, gen);
  if (e->sim)
    ms_sim_fired(e, rt, ev);
  else
    notify(e);
  return 1;
}

static int trigger(struct worker *w, struct plan_rt *rt, int ev, uint64_t gen, int producer) {
  /* fault injection (delayed_release): the completing trigger may be held; a
   * held one (simulator) completes the event later, so it counts as firing */
  if (w->e->faults &&
      ms_fault_hold(w, rt, ev, (uint64_t)rt->plan->events[ev].needed * (gen + 1), producer))
    return 1;
  return ms_rt_trigger_now(w, rt, ev, gen, producer);
}

/* A task's life in three parts, shared by the CPU backend (one after the other,
 * on a worker thread) and the simulator (start and body at the task's simulated
 * begin, finish at its simulated end). */
uint64_t ms_rt_task_start(struct worker *w, struct plan_rt *rt, int t, uint64_t gen) {
  struct ms_engine *e = w->e;
  const struct ms_task *k = &rt->plan->tasks[t];
  uint64_t t0 = ms_eng_now(e);
  atomic_store_explicit(&w->since, t0, memory_order_relaxed);
  atomic_store_explicit(&w->running, t, memory_order_relaxed);
  if (HOOK_ARMED(e, MS_HOOK_TASK_BEGIN)) fire_task_hook(w, MS_HOOK_TASK_BEGIN, rt, t, gen, k->wait, t0);
  if (k->kernel == MS_K_COMM && HOOK_ARMED(e, MS_HOOK_COMM)) fire_comm_hook(w, rt, t, gen, MS_COMM_ISSUE);
  return t0;
}

void ms_rt_task_body(struct worker *w, struct plan_rt *rt, int t) {
  const struct ms_task *k = &rt->plan->tasks[t];
  if (k->kernel == MS_K_SAMPLE)
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
  if (HOOK_ARMED(w->e, MS_HOOK_DEP_WAIT)) fire_task_hook(w, MS_HOOK_DEP_WAIT, rt, t, gen, ev, 0);
}

static void run_task(struct worker *w, struct plan_rt *rt, int t, uint64_t gen) {
  struct ms_engine *e = w->e;
  if (e->o.shuffle) shuffle_delay(w);
  uint64_t t0 = ms_rt_task_start(w, rt, t, gen);
  if (rt->delay_ns && rt->delay_ns[t]) sleep_ns(rt->delay_ns[t]);
  ms_rt_task_body(w, rt, t);
  if (e->faults) {
    /* fault injection (slow_class, slow_request, comm_delay): the worker stays busy */
    uint64_t now = ms_now_ns(), until = now + ms_fault_extra_ns(e, rt, t, now - t0);
    while (ms_now_ns() < until) ms_cpu_relax();
  }
  ms_rt_task_finish(w, rt, t, gen, t0);
}

void ms_rt_task_finish(struct worker *w, struct plan_rt *rt, int t, uint64_t gen, uint64_t t0) {
  struct ms_engine *e = w->e;
  const struct ms_task *k = &rt->plan->tasks[t];
  uint64_t t1 = ms_eng_now(e);
  if (k->kernel == MS_K_COMM && HOOK_ARMED(e, MS_HOOK_COMM)) fire_comm_hook(w, rt, t, gen, MS_COMM_COMPLETE);
  if (HOOK_ARMED(e, MS_HOOK_TASK_END)) fire_task_hook(w, MS_HOOK_TASK_END, rt, t, gen, k->wait, t0);
  struct trace_rec *rec = NULL;
  ms_tel_task(w, rt, t, t0, t1, &rec);
  atomic_store_explicit(&w->running, -1, memory_order_relaxed);
  atomic_store_explicit(&rt->done_gen[t], gen + 1, memory_order_relaxed);
  atomic_fetch_add_explicit(&w->tasks_done, 1, memory_order_relaxed);
  w->wait_ns = 0;
  /* the trigger may record JIT queue depths into the slot rec reserved: keep a
   * copy and take the next free slot again afterwards */
  struct trace_rec staged;
  if (rec) staged = *rec;
  int fired = trigger(w, rt, k->trigger, gen, t);
  if (rec) {
    if ((rec = ms_tel_slot(w))) {
      /* the record is published only now, with the event its trigger completed */
      *rec = staged;
      rec->fired_ev = fired ? (uint32_t)k->trigger : MS_HOOK_NONE32;
      atomic_store_explicit(&w->trace_n, atomic_load_explicit(&w->trace_n, memory_order_relaxed) + 1,
                            memory_order_release);
    }
    ms_tel_leave(w);  /* entered by ms_tel_task when it reserved the record */
  }
}

/* Runs a JIT task popped while waiting in generation gen. Between a waiter's
 * counter check and its pop, its step can end and the next step (same plan)
 * release JIT tasks, so the task may belong to the next generation: its own is
 * the one its event last fired for (published before the push, and it cannot
 * fire again before the task runs). Such a task runs as the next step's, with
 * that step's number and rows for its hooks, instead of under gen, whose
 * trigger target it would miss (a possible hang) and whose hooks would misname it. */
static void run_jit_task(struct worker *w, struct plan_rt *rt, int t, uint64_t gen) {
  const struct ms_task *k = &rt->plan->tasks[t];
  uint64_t own = atomic_load_explicit(&rt->fire_gen[k->wait], memory_order_acquire) - 1;
  if (own == gen) {
    run_task(w, rt, t, gen);
    return;
  }
  uint64_t step = w->step;
  int rows = w->rows;
  w->step = atomic_load_explicit(&w->e->cur_step, memory_order_relaxed);  /* the next step has begun */
  w->rows = rt->x.meta.n_rows;
  run_task(w, rt, t, own);
  w->step = step;
  w->rows = rows;
}

/* Waits until event `ev` reached `target`, running JIT tasks meanwhile. */
static void wait_event(struct worker *w, struct plan_rt *rt, int ev, uint64_t target, uint64_t gen,
                       int task) {
  struct ms_engine *e = w->e;
  int announced = 0, hooked = 0;
  uint64_t waited = 0;
  for (int spins = 0;;) {
    if (atomic_load_explicit(&rt->counters[ev], memory_order_acquire) >= target) break;
    int64_t j;
    if (e->o.mode == MS_MODE_MEGAKERNEL && ms_rt_jit_pop(e, rt, &j) == 0) {
      if (announced) waited += ms_now_ns() - atomic_load_explicit(&w->since, memory_order_relaxed);
      run_jit_task(w, rt, (int)j, gen);
      spins = 0;
      announced = 0;
      continue;
    }
    if (!announced) {
      if (!hooked) {
        ms_rt_dep_wait(w, rt, task, gen, ev);
      } else {
        atomic_store_explicit(&w->since, ms_now_ns(), memory_order_relaxed);
        atomic_store_explicit(&w->waiting, task, memory_order_relaxed);
      }
      announced = 1;
      hooked = 1;
    }
    if (++spins < 1000) {
      ms_cpu_relax();
    } else if (spins < 1100) {
      sched_yield();
    } else {
      atomic_fetch_add_explicit(&e->sleepers, 1, memory_order_seq_cst);
      uint32_t seq = atomic_load_explicit(&e->progress, memory_order_seq_cst);
      if (atomic_load_explicit(&rt->counters[ev], memory_order_acquire) < target && jit_empty(rt))
        ms_futex_wait(&e->progress, seq, 100);
      atomic_fetch_sub_explicit(&e->sleepers, 1, memory_order_seq_cst);
    }
  }
  if (announced) waited += ms_now_ns() - atomic_load_explicit(&w->since, memory_order_relaxed);
  w->wait_ns = waited;
  atomic_store_explicit(&w->waiting, -1, memory_order_relaxed);
}

/* ---- requests and the step start ---- */

static void request_free_parts(struct ms_request *r) {
  free(r->prompt);
  free(r->tokens);
  free(r->logits);
  free(r->bias_ids);
  free(r->bias_vals);
  free(r->stop_ids);
  free(r->adj);
  free(r->stamp);
  free(r->lp);
  free(r->top_vals);
  free(r->top_ids);
  free(r);
}

static void request_release(struct ms_request *r) {
  if (atomic_fetch_sub_explicit(&r->refs, 1, memory_order_acq_rel) != 1) return;
  request_free_parts(r);
}

/* Wakes streaming readers (ms_request_wait_tokens) after a token or the end. */
static void request_tick(struct ms_request *r) {
  atomic_fetch_add_explicit(&r->tok_seq, 1, memory_order_seq_cst);
  if (atomic_load_explicit(&r->waiters, memory_order_seq_cst)) ms_futex_wake_all(&r->tok_seq);
}

static void request_finish(struct ms_request *r, enum ms_request_state st) {
  r->t_done = ms_eng_now(r->e);
  if (st == MS_REQ_CANCELLED) atomic_store_explicit(&r->finish, MS_FINISH_CANCELLED, memory_order_relaxed);
  ms_tel_request_done(r->e, r, st == MS_REQ_CANCELLED);
  r->slot = -1;
  atomic_store_explicit(&r->state, st, memory_order_release);
  ms_futex_wake_all(&r->state);
  request_tick(r);
  request_release(r);
}

static int cancel_asked(const struct ms_request *r) {
  return atomic_load_explicit(&((struct ms_request *)r)->cancel, memory_order_acquire);
}

static int retire(struct ms_engine *e, int cancel_all) {
  int n = 0;
  for (int s = 0; s < e->n_slots; s++) {
    struct slot *sl = &e->slots[s];
    if (!sl->req || (!sl->finishing && !cancel_all && !cancel_asked(sl->req))) continue;
    if (HOOK_ARMED(e, MS_HOOK_REQUEST))
      fire_request_hook(e, 0, atomic_load_explicit(&e->cur, memory_order_relaxed), s, MS_REQ_FINISHED,
                        sl->next_token);
    for (int p = 0; p < sl->n_pages; p++) e->free_pages[e->n_free++] = sl->pages[p];
    sl->n_pages = 0;
    struct ms_request *r = sl->req;
    int stopped = !sl->finishing && !cancel_all && cancel_asked(r) == 2;  /* ms_request_stop */
    if (stopped) atomic_store_explicit(&r->finish, MS_FINISH_STOP, memory_order_relaxed);
    request_finish(r, sl->finishing || stopped ? MS_REQ_DONE : MS_REQ_CANCELLED);
    sl->req = NULL;
    sl->finishing = 0;
    n++;
  }
  return n;
}

/* The next queued request not cancelled while it waited, or NULL. */
static struct ms_request *next_mail(struct ms_engine *e) {
  int64_t v;
  while (!ms_mpmc_pop(&e->mail, &v)) {
    struct ms_request *r = (struct ms_request *)(intptr_t)v;
    if (!cancel_asked(r)) return r;
    request_finish(r, MS_REQ_CANCELLED);
  }
  return NULL;
}

static int admit(struct ms_engine *e, int *slots) {
  int n = 0;
  for (int s = 0; s < e->n_slots; s++) {
    if (e->slots[s].req) continue;
    struct ms_request *r = next_mail(e);
    if (!r) break;
    struct slot *sl = &e->slots[s];
    sl->req = r;
    sl->pos = 0;
    sl->next_token = r->prompt[0];
    sl->finishing = 0;
    sl->gen++;
    r->slot = s;
    r->generation = sl->gen;
    r->t_admit = ms_eng_now(e);
    if (e->sim) r->t_submit = r->t_admit;  /* simulated time starts at admission */
    atomic_store_explicit(&r->state, MS_REQ_ACTIVE, memory_order_release);
    slots[n++] = s;
  }
  return n;
}

static int active_rows(struct ms_engine *e) {
  int n = 0;
  for (int s = 0; s < e->n_slots; s++)
    if (e->slots[s].req) n++;
  return n;
}

static void cancel_mailbox(struct ms_engine *e) {
  int64_t v;
  while (!ms_mpmc_pop(&e->mail, &v)) {
    struct ms_request *r = (struct ms_request *)(intptr_t)v;
    request_finish(r, MS_REQ_CANCELLED);
  }
}

static int bucket_index(int rows) {
  int i = 0;
  while ((1 << i) < rows) i++;
  return i;
}

/* Chunked prefill: how many rows each active slot gets this step (sl->chunk),
 * the total in *rows; 1 when the step needs the bucket's prefill plan. A slot
 * past its prompt gets one row; the rows left under the token budget go to
 * slots still in their prompt, in slot order, at most the rest of the prompt
 * but its last position (whose row samples the first token). The budget is
 * also the largest prefill plan compiled so far. */
static int plan_chunks(struct ms_engine *e, int *rows) {
  int active = 0, chunked = 0;
  for (int s = 0; s < e->n_slots; s++)
    if (e->slots[s].req) e->slots[s].chunk = 1, active++;
  int ready = atomic_load_explicit(&e->prefill_ready, memory_order_acquire);  /* rows of the largest */
  int left = (e->o.max_batched_tokens < ready ? e->o.max_batched_tokens : ready) - active;
  for (int s = 0; s < e->n_slots && left > 0; s++) {
    struct slot *sl = &e->slots[s];
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

/* Lays out the rows of the step: active slots in slot order, each its chunk
 * of consecutive positions (one row but in chunked prefill), padding to the
 * bucket, KV pages for every position. */
static int layout_rows(struct ms_engine *e, int bucket) {
  int n = 0;
  for (int s = 0; s < e->n_slots; s++) {
    struct slot *sl = &e->slots[s];
    if (!sl->req) continue;
    for (int j = 0; j < sl->chunk; j++) {
      int pos = sl->pos + j, need = pos / e->o.page_size;
      if (need >= sl->n_pages) {
        MS_ASSERT(e->n_free > 0 && sl->n_pages < e->max_pages);
        sl->pages[sl->n_pages++] = e->free_pages[--e->n_free];
      }
      e->row_slot[n] = s;
      e->row_pos[n] = pos;
      e->row_token[n] = j ? sl->req->prompt[pos] : sl->next_token;  /* a chunk lies inside the prompt */
      e->row_pages[n] = sl->pages;
      e->row_head[n] = j == sl->chunk - 1 || sl->req->record;  /* its logits are read */
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
 * engine_impl.h; the device does the same in msd_step_start). */
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
  if (e->step_log_n) e->step_log[(e->step_log_n - 1) % MS_STEP_LOG].t_end = ms_eng_now(e);
  pthread_mutex_unlock(&e->log_mu);
}

/* The hooks of a step's start, fired by worker 0 after it published the step. */
static void step_hooks(struct ms_engine *e, struct plan_rt *rt, const int *admitted, int n_admitted) {
  if (HOOK_ARMED(e, MS_HOOK_STEP)) fire_step_hook(e, rt, MS_STEP_BEGIN);
  if (HOOK_ARMED(e, MS_HOOK_REQUEST))
    for (int i = 0; i < n_admitted; i++) fire_request_hook(e, 0, rt, admitted[i], MS_REQ_ADMITTED, 0);
  uint32_t depth = (uint32_t)(atomic_load(&e->mail.tail) - atomic_load(&e->mail.head));
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
    ms_futex_wait(&e->pause_seq, seq, 200);
  }
  atomic_store_explicit(&e->paused, 0, memory_order_release);
}

/* The step-start task's body, on worker 0. Returns 0 when a stop was published. */
int ms_rt_step_begin(struct ms_engine *e) {
  maybe_pause(e);
  uint64_t t0 = ms_eng_now(e);
  int retired = retire(e, 0), admitted = 0;
  for (;;) {
    admitted += admit(e, e->admit_slots + admitted);
    if (atomic_load_explicit(&e->stop_req, memory_order_acquire)) {
      retired += retire(e, 1);
      cancel_mailbox(e);
      atomic_store_explicit(&e->cur_stop, 1, memory_order_relaxed);
      atomic_fetch_add_explicit(&e->step_seq, 1, memory_order_release);
      ms_futex_wake_all(&e->step_seq);
      return 0;
    }
    if (active_rows(e)) break;
    atomic_store_explicit(&e->stat_running, 0, memory_order_relaxed);
    atomic_store_explicit(&e->stat_pages_used, e->pool_pages - e->n_free, memory_order_relaxed);
    maybe_pause(e);  /* a pause asked for while idle: before admitting more */
    uint32_t seq = atomic_load_explicit(&e->mail_seq, memory_order_acquire);
    if (atomic_load_explicit(&e->mail.tail, memory_order_acquire) ==
            atomic_load_explicit(&e->mail.head, memory_order_acquire) &&
        !atomic_load_explicit(&e->stop_req, memory_order_acquire))
      ms_futex_wait(&e->mail_seq, seq, 200);
    t0 = ms_eng_now(e);  /* idle time is not step time */
  }
  int rows = 0, chunked = plan_chunks(e, &rows);
  int bucket = ms_bucket_for(rows);
  struct plan_rt *rt = chunked ? &e->rt_prefill[bucket_index(bucket)] : &e->rt[bucket_index(bucket)];
  int n = layout_rows(e, bucket);
  rt->x.meta.some_head_skipped = 0;
  for (int r = 0; r < n; r++) rt->x.meta.some_head_skipped |= !e->row_head[r];
  atomic_store_explicit(&e->stat_running, active_rows(e), memory_order_relaxed);  /* requests, not rows */
  atomic_store_explicit(&e->stat_pages_used, e->pool_pages - e->n_free, memory_order_relaxed);
  rt->x.meta.n_rows = n;
  publish_hook_rows(e, bucket, e->next_step);
  pthread_mutex_lock(&e->log_mu);
  struct ms_step_record *rec = &e->step_log[e->step_log_n++ % MS_STEP_LOG];
  *rec = (struct ms_step_record){.step = e->next_step, .rows = n, .bucket = bucket,
                                 .admitted = admitted, .retired = retired, .t_begin = t0};
  pthread_mutex_unlock(&e->log_mu);
  atomic_store_explicit(&e->cur_step, e->next_step++, memory_order_relaxed);
  atomic_store_explicit(&e->cur_gen, rt->gen++, memory_order_relaxed);
  atomic_store_explicit(&e->cur, rt, memory_order_relaxed);
  atomic_fetch_add_explicit(&e->positions, (uint64_t)n, memory_order_relaxed);
  e->step_t0 = t0;
  atomic_fetch_add_explicit(&e->step_seq, 1, memory_order_release);
  ms_futex_wake_all(&e->step_seq);
  if (HOOKS_ON(e)) step_hooks(e, rt, e->admit_slots, admitted);
  return 1;
}

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

/* Sampling for one row, and the request's bookkeeping: prompt positions feed
 * the next prompt token, later ones emit a token. Only this row's task touches
 * this slot during the step. */
static void sample_row(struct worker *w, struct plan_rt *rt, const struct ms_task_class *k, int row) {
  struct ms_engine *e = w->e;
  const struct ms_exec_ctx *x = &rt->x;
  int s = x->meta.row_slot[row];
  if (row >= x->meta.n_rows || s < 0) return;
  struct slot *sl = &e->slots[s];
  struct ms_request *r = sl->req;
  int vocab = e->m->cfg.vocab, pos = x->meta.row_pos[row];
  const float *lg = ms_buf_row(x, k->in, 0, row);
  /* In chunked prefill the slot's other rows come before this one; only the
   * last touches the slot, so it keeps one writer per step. */
  int last = row + 1 >= x->meta.n_rows || x->meta.row_slot[row + 1] != s;
  if (r->record) {  /* each row its own position; read once the request is done */
    memcpy(r->logits + (size_t)pos * (size_t)vocab, lg, sizeof(float) * (size_t)vocab);
    if (last) atomic_store_explicit(&r->n_logits, pos + 1, memory_order_release);
  }
  if (!last) return;
  sl->pos = pos + 1;
  if (sl->pos < r->n_prompt) {
    sl->next_token = r->prompt[sl->pos];
    return;
  }
  int n = atomic_load_explicit(&r->n_tokens, memory_order_relaxed);
  const float *use = adjusted_logits(r, lg, vocab, n);
  int tok = ms_argmax(use, vocab);
  if (!ms_sample_is_greedy(&r->sample)) {  /* draw n of this request: seeded, schedule-independent */
    int drawn = ms_sample(use, vocab, &r->sample, (uint64_t)n);
    if (drawn >= 0) tok = drawn;
  }
  if (r->logprobs) record_logprobs(r, lg, vocab, n, tok);
  r->tokens[n] = tok;
  uint64_t now = ms_eng_now(e);
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
  request_tick(r);
  if (HOOK_ARMED(e, MS_HOOK_REQUEST))
    fire_request_hook(e, w->id, rt, s, n == 0 ? MS_REQ_FIRST_TOKEN : MS_REQ_TOKEN, tok);
}

/* ---- worker loops ---- */

static uint32_t wait_step(struct ms_engine *e, uint32_t seen) {
  for (int i = 0;; i++) {
    uint32_t s = atomic_load_explicit(&e->step_seq, memory_order_acquire);
    if (s != seen) return s;
    if (i < 1000)
      ms_cpu_relax();
    else if (i < 1100)
      sched_yield();
    else
      ms_futex_wait(&e->step_seq, seen, 200);
  }
}

static void run_megakernel_step(struct worker *w, struct plan_rt *rt, uint64_t gen) {
  const struct ms_plan *p = rt->plan;
  if (HOOK_ARMED(w->e, MS_HOOK_TASK_ASSIGN))
    for (int i = 0; i < rt->aot_n[w->id]; i++)
      fire_task_hook(w, MS_HOOK_TASK_ASSIGN, rt, rt->aot_q[w->id][i], gen, -1,
                     (uint64_t)(rt->aot_n[w->id] - i));
  for (int i = 0; i < rt->aot_n[w->id]; i++) {
    int t = rt->aot_q[w->id][i];
    int ev = p->tasks[t].wait;
    if (ev >= 0) wait_event(w, rt, ev, (uint64_t)p->events[ev].needed * (gen + 1), gen, t);
    run_task(w, rt, t, gen);
  }
  int end = p->end_event;
  wait_event(w, rt, end, (uint64_t)p->events[end].needed * (gen + 1), gen, -1);
}

static void run_per_op_step(struct worker *w, struct plan_rt *rt, uint64_t gen) {
  int i = 0;
  for (int s = 0; s < rt->n_stages; s++) {
    for (; i < rt->op_end[w->id][s]; i++) run_task(w, rt, rt->op_q[w->id][i], gen);
    ms_barrier_wait(&w->e->bar);
  }
}

void ms_rt_step_end(struct ms_engine *e) {
  if (!e->step_log_n) return;  /* no step yet */
  if (HOOK_ARMED(e, MS_HOOK_STEP)) fire_step_hook(e, atomic_load_explicit(&e->cur, memory_order_relaxed), MS_STEP_END);
  log_step_end(e);
  atomic_fetch_add_explicit(&e->steps, 1, memory_order_relaxed);
}

static void *worker_main(void *arg) {
  struct worker *w = arg;
  struct ms_engine *e = w->e;
  uint32_t seen = 0;
  for (;;) {
    if (w->id == 0) {
      ms_rt_step_end(e);
      ms_rt_step_begin(e);
    }
    seen = wait_step(e, seen);
    if (atomic_load_explicit(&e->cur_stop, memory_order_relaxed)) break;
    struct plan_rt *rt = atomic_load_explicit(&e->cur, memory_order_relaxed);
    uint64_t gen = atomic_load_explicit(&e->cur_gen, memory_order_relaxed);
    w->step = atomic_load_explicit(&e->cur_step, memory_order_relaxed);
    w->rows = rt->x.meta.n_rows;
    if (e->o.mode == MS_MODE_PER_OP)
      run_per_op_step(w, rt, gen);
    else
      run_megakernel_step(w, rt, gen);
  }
  return NULL;
}

/* ---- building the runtime's view of a plan ---- */

static int stage_of(const struct ms_plan *p, int t) {
  const struct ms_task *k = &p->tasks[t];
  if (k->kernel != MS_K_EMPTY) return k->cls;
  /* an empty task runs with the operator of the producer it stands behind */
  return p->tasks[p->trig[p->trig_off[k->wait]]].cls;
}

static int place(struct ms_engine *e, uint64_t *rng, int *rr) {
  if (e->o.shuffle) return (int)(rng_next(rng) % (uint64_t)e->n_workers);
  int w = *rr;
  *rr = (w + 1) % e->n_workers;
  return w;
}

int ms_rt_device(const struct ms_engine *e, int worker) {
  int D = e->o.tp > 1 ? e->o.tp : 1;
  return worker / ((e->n_workers + D - 1) / D);
}

/* Tensor parallel: a device's communication task runs on one of its own SMs
 * (worker w is on device w / (workers / tp)), a different one for each layer. */
static int comm_worker(const struct ms_engine *e, const struct ms_plan *p, int t) {
  int D = e->o.tp > 1 ? e->o.tp : 1, per = e->n_workers / D;
  int layer = p->classes[p->tasks[t].cls].layer;
  return p->tasks[t].tile[2] * per + (layer >= 0 ? layer * 7 + 3 : 0) % per;
}

static int rt_queues(struct ms_engine *e, struct plan_rt *rt, uint64_t seed) {
  const struct ms_plan *p = rt->plan;
  int W = e->n_workers, rr = 0;
  uint64_t rng = seed | 1;
  int *owner = malloc((size_t)p->n_tasks * sizeof *owner);
  rt->aot_q = calloc((size_t)W, sizeof *rt->aot_q);
  rt->aot_n = calloc((size_t)W, sizeof *rt->aot_n);
  rt->op_q = calloc((size_t)W, sizeof *rt->op_q);
  rt->op_n = calloc((size_t)W, sizeof *rt->op_n);
  rt->op_end = calloc((size_t)W, sizeof *rt->op_end);
  rt->n_stages = p->n_classes;
  if (!owner || !rt->aot_q || !rt->aot_n || !rt->op_q || !rt->op_n || !rt->op_end) goto fail;
  for (int w = 0; w < W; w++) {
    rt->aot_q[w] = malloc(((size_t)p->n_tasks + 1) * sizeof(int32_t));
    rt->op_q[w] = malloc(((size_t)p->n_tasks + 1) * sizeof(int32_t));
    rt->op_end[w] = calloc((size_t)rt->n_stages, sizeof(int32_t));
    if (!rt->aot_q[w] || !rt->op_q[w] || !rt->op_end[w]) goto fail;
  }
  /* AOT: round-robin (or random) in plan order, so every queue is in topological
   * order; the step start always on worker 0, which ran its body. */
  for (int t = 0; t < p->n_tasks; t++) {
    if (p->tasks[t].launch != MS_LAUNCH_AOT) continue;
    int w = t == 0 ? 0 : place(e, &rng, &rr);
    if (p->tasks[t].kernel == MS_K_COMM) w = comm_worker(e, p, t);
    rt->aot_q[w][rt->aot_n[w]++] = t;
  }
  /* per-op: every task (JIT included) placed by stage. */
  for (int t = 0; t < p->n_tasks; t++) owner[t] = t == 0 ? 0 : place(e, &rng, &rr);
  for (int s = 0; s < rt->n_stages; s++)
    for (int w = 0; w < W; w++) rt->op_end[w][s] = rt->op_n[w];
  for (int s = 0; s < rt->n_stages; s++) {
    for (int t = 0; t < p->n_tasks; t++)
      if (stage_of(p, t) == s) rt->op_q[owner[t]][rt->op_n[owner[t]]++] = t;
    for (int w = 0; w < W; w++) rt->op_end[w][s] = rt->op_n[w];
  }
  free(owner);
  return 0;
fail:
  free(owner);
  return -ENOMEM;
}

static void rt_free(struct ms_engine *e, struct plan_rt *rt) {
  for (int w = 0; w < e->n_workers; w++) {
    if (rt->aot_q) free(rt->aot_q[w]);
    if (rt->op_q) free(rt->op_q[w]);
    if (rt->op_end) free(rt->op_end[w]);
  }
  free(rt->aot_q);
  free(rt->aot_n);
  free(rt->op_q);
  free(rt->op_n);
  free(rt->op_end);
  free((void *)rt->counters);
  free((void *)rt->done_gen);
  free(rt->delay_ns);
  free(rt->cls_w);
  for (int p = 0; p < MS_PRIO_LEVELS; p++) ms_mpmc_destroy(&rt->jit[p]);
  free((void *)rt->fire_ns);
  free((void *)rt->fire_gen);
  ms_plan_free(rt->plan);
}

static int rt_init(struct ms_engine *e, struct plan_rt *rt, int batch, int prefill, struct ms_textbuf *log) {
  struct ms_compile_opts co = {.sz = sizeof co, .batch = batch, .tile_bytes = e->o.tile_bytes,
                               .tile_rows = e->o.tile_rows, .tiles_per_op = e->o.tiles_per_op,
                               .tp = e->o.tp, .prefill = prefill};
  rt->plan = ms_plan_compile(e->m, &co, log);
  if (!rt->plan) return -errno;
  if (e->o.plan_hook) e->o.plan_hook(rt->plan, e->o.plan_hook_user);
  const struct ms_plan *p = rt->plan;
  rt->counters = calloc((size_t)p->n_events, sizeof *rt->counters);
  rt->done_gen = calloc((size_t)p->n_tasks, sizeof *rt->done_gen);
  rt->cls_w = calloc((size_t)p->n_classes, sizeof *rt->cls_w);
  if (!rt->counters || !rt->done_gen || !rt->cls_w) return -ENOMEM;
  for (int q = 0; q < MS_PRIO_LEVELS; q++)
    if (ms_mpmc_init(&rt->jit[q], (uint64_t)p->stats.jit_tasks + 2)) return -ENOMEM;
  rt->fire_ns = calloc((size_t)p->n_events, sizeof *rt->fire_ns);
  rt->fire_gen = calloc((size_t)p->n_events, sizeof *rt->fire_gen);
  if (!rt->fire_ns || !rt->fire_gen) return -ENOMEM;
  ms_ops_bind_weights(p, e->m, rt->cls_w);
  int rc = rt_queues(e, rt, e->o.seed * 0x9e3779b97f4a7c15ull + (uint64_t)batch);
  if (rc) return rc;
  rt->x = (struct ms_exec_ctx){
      .m = e->m, .plan = p, .buf = e->buf, .max_rows = e->max_rows,
      .cls_w = (const struct ms_weight *const (*)[3])rt->cls_w,
      .meta = {.row_slot = e->row_slot, .row_pos = e->row_pos, .row_token = e->row_token,
               .row_pages = e->row_pages, .row_head = e->row_head},
      .k_pool = e->k_pool, .v_pool = e->v_pool, .page_size = e->o.page_size,
      .pool_pages = e->pool_pages, .scratch = e->scratch,
      .q8 = e->q8, .q8_rows = e->q8_rows, .q8_cols = e->q8_cols};
  return 0;
}

/* 8-bit activations: a buffer per worker for up to 64 input rows of the widest
 * GEMV input (dim, the attention output, an FFN hidden row). */
static int alloc_q8(struct ms_engine *e) {
  const struct ms_model_config *c = &e->m->cfg;
  int n = c->dim;
  if (c->n_heads * c->head_dim > n) n = c->n_heads * c->head_dim;
  if (c->ffn_dim > n) n = c->ffn_dim;
  if (c->expert_ffn_dim > n) n = c->expert_ffn_dim;
  e->q8_cols = (n + 31) / 32 * 32;
  e->q8_rows = e->max_rows < 64 ? e->max_rows : 64;
  size_t bytes = (ms_q8_act_bytes(e->q8_cols, e->q8_rows) + 63) / 64 * 64;
  if (!(e->q8 = calloc((size_t)e->n_workers, sizeof *e->q8))) return -ENOMEM;
  for (int w = 0; w < e->n_workers; w++)
    if (!(e->q8[w] = aligned_alloc(64, bytes))) return -ENOMEM;
  return 0;
}

/* Activation buffers, KV pool, slots, rows: sized for max_rows, shared by plans. */
static int alloc_storage(struct ms_engine *e, const struct ms_plan *p) {
  const struct ms_model_config *c = &e->m->cfg;
  e->n_bufs = p->n_bufs;
  e->buf = calloc((size_t)p->n_bufs, sizeof *e->buf);
  if (!e->buf) return -ENOMEM;
  for (int b = 0; b < p->n_bufs; b++) {
    if (p->bufs[b].logical) continue;
    e->buf[b] = calloc((size_t)p->bufs[b].planes * (size_t)e->max_rows * (size_t)p->bufs[b].cols, sizeof(float));
    if (!e->buf[b]) return -ENOMEM;
  }
  e->max_pages = (e->o.max_ctx + e->o.page_size - 1) / e->o.page_size;
  e->pool_pages = e->max_pages * e->n_slots;
  size_t kv = (size_t)c->n_layers * (size_t)e->pool_pages * (size_t)e->o.page_size *
              (size_t)c->n_kv_heads * (size_t)c->head_dim;
  if (!e->shape_only) {  /* shapes only: no kernel reads or writes the cache */
    e->k_pool = calloc(kv, sizeof(float));
    e->v_pool = calloc(kv, sizeof(float));
    if (!e->k_pool || !e->v_pool) return -ENOMEM;
  }
  e->free_pages = malloc((size_t)e->pool_pages * sizeof *e->free_pages);
  e->slots = calloc((size_t)e->n_slots, sizeof *e->slots);
  e->row_slot = calloc((size_t)e->max_rows, sizeof(int));
  e->row_pos = calloc((size_t)e->max_rows, sizeof(int));
  e->row_token = calloc((size_t)e->max_rows, sizeof(int));
  e->row_head = calloc((size_t)e->max_rows, sizeof *e->row_head);
  e->admit_slots = calloc((size_t)e->n_slots, sizeof(int));
  e->row_pages = calloc((size_t)e->max_rows, sizeof(int32_t *));
  e->hook_rows = calloc((size_t)e->max_rows, sizeof *e->hook_rows);
  e->scratch = calloc((size_t)e->n_workers, sizeof *e->scratch);
  if (!e->free_pages || !e->slots || !e->row_slot || !e->row_pos || !e->admit_slots ||
      !e->row_token || !e->row_head || !e->row_pages || !e->hook_rows || !e->scratch)
    return -ENOMEM;
  /* pages are handed out lowest first */
  for (int i = 0; i < e->pool_pages; i++) e->free_pages[i] = e->pool_pages - 1 - i;
  e->n_free = e->pool_pages;
  for (int s = 0; s < e->n_slots; s++)
    if (!(e->slots[s].pages = calloc((size_t)e->max_pages, sizeof(int32_t)))) return -ENOMEM;
  for (int w = 0; w < e->n_workers; w++)
    if (!(e->scratch[w] = calloc((size_t)e->o.max_ctx, sizeof(float)))) return -ENOMEM;
  return e->o.q8_activations && !e->shape_only ? alloc_q8(e) : 0;
}

/* Compiles the prefill plans, smallest bucket first (2 rows up to max_rows),
 * each published by raising prefill_ready to its rows: steps chunk prompts up
 * to the largest one ready and feed one position per step before the first. A
 * plan of many token rows takes seconds to compile, which the engine does not
 * wait for. A failure only leaves the larger buckets unused. */
static void *prefill_main(void *arg) {
  struct ms_engine *e = arg;
  for (int i = 1; (1 << i) <= e->max_rows && !atomic_load_explicit(&e->stop_req, memory_order_acquire); i++) {
    char lb[512] = "";
    struct ms_textbuf log = {.buf = lb, .size = sizeof lb};
    struct plan_rt *rt = &e->rt_prefill[i];
    if (rt_init(e, rt, 1 << i, 1, &log)) {
      ms_logf(MS_LOG_WARN, "engine: the prefill plan for %d rows: %s", 1 << i, lb[0] ? lb : "failed");
      rt_free(e, rt);
      memset(rt, 0, sizeof *rt);
      break;
    }
    atomic_store_explicit(&e->prefill_ready, 1 << i, memory_order_release);
  }
  return NULL;
}

static void set_defaults(struct ms_engine_opts *o) {
  if (o->backend == MS_BACKEND_SIM) {
    o->max_batched_tokens = 0;  /* the simulator's figures are of decode steps */
    if (o->sim.n_sms <= 0) ms_sim_preset("h100", &o->sim);
    o->n_workers = o->sim.n_sms * (o->tp > 1 ? o->tp : 1);  /* each device its own SMs */
    if (!o->tiles_per_op && !o->tile_rows) o->tiles_per_op = o->sim.n_sms;
    o->watchdog_ms = 0;  /* virtual time: nothing stalls in real time */
  }
  if (o->n_workers <= 0) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    o->n_workers = n > 0 ? (int)n : 1;
  }
  if (o->max_batch <= 0) o->max_batch = 16;
  if (o->max_ctx <= 0) o->max_ctx = 512;
  if (o->page_size <= 0) o->page_size = 16;
  if (o->shuffle_max_us <= 0) o->shuffle_max_us = 50;
}

struct ms_engine *ms_engine_new(const struct ms_model *m, const struct ms_engine_opts *o,
                                struct ms_textbuf *log) {
  struct ms_engine *e = calloc(1, sizeof *e);
  int rc = -ENOMEM;
  if (!e) return NULL;
  memcpy(&e->o, o, o->sz < sizeof e->o ? o->sz : sizeof e->o);
  e->o.sz = sizeof e->o;
  set_defaults(&e->o);
  e->m = m;
  e->n_workers = e->o.n_workers;
  e->shape_only = e->o.backend == MS_BACKEND_SIM && !e->o.sim.compute;
  if (!e->shape_only && !m->tok_embd.data) {
    ms_textbuf_printf(log, "engine: model '%s' has shapes only: it can run only on the simulator without --compute\n",
                      m->cfg.name);
    rc = -EINVAL;
    goto fail;
  }
  if (e->o.max_batch > 4096 || e->n_workers > 1024 || e->o.tp > 64 || e->n_workers < e->o.tp) {
    ms_textbuf_printf(log, "engine: max_batch %d (at most 4096), workers %d (at most 1024, at least tp %d) out of range\n",
                      e->o.max_batch, e->n_workers, e->o.tp);
    rc = -EINVAL;
    goto fail;
  }
  atomic_init(&e->pause_at, e->o.start_paused ? 0 : UINT64_MAX);
  e->n_slots = ms_bucket_for(e->o.max_batch);
  e->n_buckets = bucket_index(e->n_slots) + 1;
  e->max_rows = e->n_slots;
  if (e->o.max_batched_tokens > 0) {  /* token rows: buffers for the budget's bucket */
    if (e->o.max_batched_tokens > 4096) e->o.max_batched_tokens = 4096;
    int b = ms_bucket_for(e->o.max_batched_tokens);
    if (b > e->max_rows) e->max_rows = b;
  }
  pthread_mutex_init(&e->log_mu, NULL);
  ms_barrier_init(&e->bar, e->n_workers);
  if (ms_mpmc_init(&e->mail, 1024)) goto fail;
  for (int i = 0; i < e->n_buckets; i++) {
    if (i == 0) {
      /* storage first: the plans' runtime contexts point into it */
      struct ms_compile_opts co = {.sz = sizeof co, .batch = 1, .tile_bytes = e->o.tile_bytes,
                                   .tile_rows = e->o.tile_rows, .tiles_per_op = e->o.tiles_per_op,
                                   .tp = e->o.tp};
      struct ms_plan *p0 = ms_plan_compile(m, &co, log);
      if (!p0) {
        rc = -errno;
        goto fail;
      }
      rc = alloc_storage(e, p0);
      ms_plan_free(p0);
      if (rc) goto fail;
    }
    if ((rc = rt_init(e, &e->rt[i], 1 << i, 0, log))) goto fail;
  }
  e->hooks = ms_hook_table_new(e->n_workers);
  atomic_init(&e->hooks_on, 1);
  e->workers = calloc((size_t)e->n_workers, sizeof *e->workers);
  if (!e->hooks || !e->workers) goto fail;
  for (int w = 0; w < e->n_workers; w++) e->workers[w].e = e;
  if ((rc = ms_tel_init(e))) goto fail;
  if ((rc = ms_fault_init(e, log))) goto fail;
  for (int w = 0; w < e->n_workers; w++) {
    struct worker *wk = &e->workers[w];
    wk->e = e;
    wk->id = w;
    wk->rng = (e->o.seed + 1) * 0x9e3779b97f4a7c15ull ^ (uint64_t)(w + 1) * 0xbf58476d1ce4e5b9ull;
    if (!wk->rng) wk->rng = 1;
    atomic_init(&wk->running, -1);
    atomic_init(&wk->waiting, -1);
  }
  if (e->o.backend == MS_BACKEND_SIM) {
    if ((rc = ms_sim_start(e))) goto fail;
    return e;
  }
  if (e->o.max_batched_tokens > 1 && !e->o.prefill_async) prefill_main(e);
  if (e->o.max_batched_tokens > 1 && e->o.prefill_async)  /* compiled while the engine already serves */
    e->prefill_thread = !pthread_create(&e->prefill_th, NULL, prefill_main, e);
  for (int w = 0; w < e->n_workers; w++)
    if (pthread_create(&e->workers[w].th, NULL, worker_main, &e->workers[w])) {
      /* Worker 0, when it started, publishes the stop and the others exit on it. */
      atomic_store(&e->stop_req, 1);
      atomic_fetch_add(&e->mail_seq, 1);
      ms_futex_wake_all(&e->mail_seq);
      for (int j = 0; j < w; j++) pthread_join(e->workers[j].th, NULL);
      rc = -EAGAIN;
      goto fail;
    }
  e->threads = e->n_workers;
  if (e->o.watchdog_ms > 0) {
    e->watchdog_on = !pthread_create(&e->watchdog, NULL, ms_watchdog_main, e);
  }
  return e;
fail:
  ms_textbuf_printf(log, "engine: %s\n", ms_strerror(rc));
  ms_tel_free(e);
  free(e->workers);
  e->workers = NULL;
  for (int i = 0; i < e->n_buckets; i++) rt_free(e, &e->rt[i]);
  e->n_buckets = 0;
  ms_engine_free(e);
  errno = -rc;
  return NULL;
}

void ms_engine_free(struct ms_engine *e) {
  if (!e) return;
  atomic_store_explicit(&e->stop_req, 1, memory_order_release);
  atomic_fetch_add_explicit(&e->pause_seq, 1, memory_order_release);
  ms_futex_wake_all(&e->pause_seq);
  atomic_fetch_add_explicit(&e->mail_seq, 1, memory_order_release);
  ms_futex_wake_all(&e->mail_seq);
  for (int w = 0; w < e->threads; w++) pthread_join(e->workers[w].th, NULL);
  if (e->prefill_thread) pthread_join(e->prefill_th, NULL);  /* stops after the plan it compiles */
  if (e->sim) ms_sim_stop(e);
  if (e->watchdog_on) {
    atomic_store(&e->wd_stop, 1);
    ms_futex_wake_all(&e->wd_stop);
    pthread_join(e->watchdog, NULL);
  }
  ms_tel_free(e);
  ms_fault_free(e);
  free(e->workers);
  for (int i = 0; i < e->n_buckets; i++) rt_free(e, &e->rt[i]);
  for (int i = 0; i < MS_MAX_BUCKETS; i++)
    if (e->rt_prefill[i].plan) rt_free(e, &e->rt_prefill[i]);
  ms_hook_table_free(e->hooks);
  if (e->buf)
    for (int b = 0; b < e->n_bufs; b++) free(e->buf[b]);
  free(e->buf);
  free(e->k_pool);
  free(e->v_pool);
  free(e->free_pages);
  if (e->slots)
    for (int s = 0; s < e->n_slots; s++) free(e->slots[s].pages);
  free(e->slots);
  free(e->row_slot);
  free(e->row_pos);
  free(e->row_token);
  free(e->row_head);
  free(e->admit_slots);
  free(e->row_pages);
  free(e->hook_rows);
  if (e->scratch)
    for (int w = 0; w < e->o.n_workers; w++) free(e->scratch[w]);
  free(e->scratch);
  if (e->q8)
    for (int w = 0; w < e->o.n_workers; w++) free(e->q8[w]);
  free(e->q8);
  ms_mpmc_destroy(&e->mail);
  pthread_mutex_destroy(&e->log_mu);
  free(e);
}

int ms_engine_n_workers(const struct ms_engine *e) { return e->n_workers; }
const struct ms_model *ms_engine_model(const struct ms_engine *e) { return e->m; }
enum ms_mode ms_engine_mode(const struct ms_engine *e) { return e->o.mode; }

const struct ms_plan *ms_engine_plan(const struct ms_engine *e, int rows) {
  int i = bucket_index(rows < 1 ? 1 : rows);
  return i < e->n_buckets ? e->rt[i].plan : NULL;
}

/* ---- the request API ---- */

/* A request's arrays (1, or 0 when one could not be had). */
static int request_alloc(struct ms_request *r, const struct ms_request_opts *x, int positions, int vocab) {
  int penal = x->presence_penalty != 0.0f || x->frequency_penalty != 0.0f;
  r->prompt = malloc((size_t)x->n_prompt * sizeof *r->prompt);
  r->tokens = malloc((size_t)x->max_new_tokens * sizeof *r->tokens);
  if (r->record) r->logits = malloc((size_t)positions * (size_t)vocab * sizeof(float));
  if (x->n_bias || penal) r->adj = malloc((size_t)vocab * sizeof *r->adj);
  if (penal) r->stamp = calloc((size_t)vocab, sizeof *r->stamp);
  if (x->n_bias) {
    r->bias_ids = malloc((size_t)x->n_bias * sizeof *r->bias_ids);
    r->bias_vals = malloc((size_t)x->n_bias * sizeof *r->bias_vals);
    if (r->bias_ids && r->bias_vals) {
      memcpy(r->bias_ids, x->bias_ids, (size_t)x->n_bias * sizeof *r->bias_ids);
      memcpy(r->bias_vals, x->bias_vals, (size_t)x->n_bias * sizeof *r->bias_vals);
    }
    r->n_bias = x->n_bias;
  }
  if (x->n_stop_ids) {
    if ((r->stop_ids = malloc((size_t)x->n_stop_ids * sizeof *r->stop_ids)))
      memcpy(r->stop_ids, x->stop_ids, (size_t)x->n_stop_ids * sizeof *r->stop_ids);
    r->n_stop = x->n_stop_ids;
  }
  r->logprobs = x->logprobs || x->top_logprobs > 0;
  r->top_lp = x->top_logprobs;
  if (r->logprobs) r->lp = malloc((size_t)x->max_new_tokens * sizeof *r->lp);
  if (r->top_lp) {
    r->top_ids = malloc((size_t)x->max_new_tokens * (size_t)r->top_lp * sizeof *r->top_ids);
    r->top_vals = malloc((size_t)x->max_new_tokens * (size_t)r->top_lp * sizeof *r->top_vals);
  }
  return r->prompt && r->tokens && (!r->record || r->logits) && (!(x->n_bias || penal) || r->adj) &&
         (!penal || r->stamp) && (!x->n_bias || (r->bias_ids && r->bias_vals)) &&
         (!x->n_stop_ids || r->stop_ids) && (!r->logprobs || r->lp) && (!r->top_lp || (r->top_ids && r->top_vals));
}

struct ms_request *ms_engine_submit(struct ms_engine *e, const struct ms_request_opts *o) {
  if (!o->prompt || o->n_prompt < 1 || o->max_new_tokens < 1) {
    errno = EINVAL;
    return NULL;
  }
  for (int i = 0; i < o->n_prompt; i++)
    if (o->prompt[i] < 0 || o->prompt[i] >= e->m->cfg.vocab) {
      errno = EINVAL;
      return NULL;
    }
  int positions = o->n_prompt + o->max_new_tokens - 1;
  if (positions > e->o.max_ctx) {
    errno = E2BIG;
    return NULL;
  }
  struct ms_request_opts x = {0};  /* the caller's fields, later ones zero */
  memcpy(&x, o, o->sz < sizeof x ? o->sz : sizeof x);
  x.n_prompt = o->n_prompt;  /* the first fields every caller has */
  x.max_new_tokens = o->max_new_tokens;
  if ((x.n_bias && (!x.bias_ids || !x.bias_vals)) || x.n_bias < 0 || (x.n_stop_ids && !x.stop_ids) ||
      x.n_stop_ids < 0 || x.top_logprobs < 0 || x.top_logprobs > 20 || x.presence_penalty != x.presence_penalty ||
      x.frequency_penalty != x.frequency_penalty) {
    errno = EINVAL;
    return NULL;
  }
  for (int i = 0; i < x.n_bias; i++)
    if (x.bias_ids[i] < 0 || x.bias_ids[i] >= e->m->cfg.vocab) {
      errno = EINVAL;
      return NULL;
    }
  struct ms_request *r = calloc(1, sizeof *r);
  if (!r) return NULL;
  r->e = e;
  r->n_prompt = o->n_prompt;
  r->max_new = o->max_new_tokens;
  r->stop_eos = o->stop_at_eos && e->m->cfg.eos >= 0;
  r->record = o->record_logits;
  r->sample = (struct ms_sample_params){x.temperature, x.top_k, x.top_p, x.sample_seed, x.min_p};
  r->presence = x.presence_penalty;
  r->frequency = x.frequency_penalty;
  r->slot = -1;
  int ok = request_alloc(r, &x, positions, e->m->cfg.vocab);
  if (ok) memcpy(r->prompt, o->prompt, (size_t)o->n_prompt * sizeof *r->prompt);
  atomic_init(&r->refs, 2);
  atomic_init(&r->state, MS_REQ_QUEUED);
  r->t_submit = ms_now_ns();
  if (!ok || atomic_load(&e->stop_req) || ms_mpmc_push(&e->mail, (int64_t)(intptr_t)r)) {
    request_free_parts(r);
    errno = ok ? EAGAIN : ENOMEM;
    return NULL;
  }
  atomic_fetch_add_explicit(&e->mail_seq, 1, memory_order_release);
  ms_futex_wake_all(&e->mail_seq);
  return r;
}

int ms_request_wait(struct ms_request *r, int timeout_ms) {
  uint64_t until = timeout_ms >= 0 ? ms_now_ns() + (uint64_t)timeout_ms * 1000000ull : UINT64_MAX;
  for (;;) {
    uint32_t s = atomic_load_explicit(&r->state, memory_order_acquire);
    if (s == MS_REQ_DONE || s == MS_REQ_CANCELLED) return 0;
    uint64_t now = ms_now_ns();
    if (now >= until) return -ETIMEDOUT;
    uint64_t left_ms = (until - now) / 1000000ull + 1;
    ms_futex_wait(&r->state, s, left_ms > 100 ? 100 : (int)left_ms);
  }
}

int ms_request_wait_tokens(struct ms_request *r, int seen, int timeout_ms) {
  uint64_t until = timeout_ms >= 0 ? ms_now_ns() + (uint64_t)timeout_ms * 1000000ull : UINT64_MAX;
  atomic_fetch_add_explicit(&r->waiters, 1, memory_order_seq_cst);
  int rc = 0;
  for (;;) {
    /* read the sequence before the condition: a token after the check bumps it */
    uint32_t seq = atomic_load_explicit(&r->tok_seq, memory_order_seq_cst);
    uint32_t st = atomic_load_explicit(&r->state, memory_order_acquire);
    if (st == MS_REQ_DONE || st == MS_REQ_CANCELLED ||
        atomic_load_explicit(&r->n_tokens, memory_order_acquire) > seen)
      break;
    uint64_t now = ms_now_ns();
    if (now >= until) {
      rc = -ETIMEDOUT;
      break;
    }
    uint64_t left_ms = (until - now) / 1000000ull + 1;
    ms_futex_wait(&r->tok_seq, seq, left_ms > 100 ? 100 : (int)left_ms);
  }
  atomic_fetch_sub_explicit(&r->waiters, 1, memory_order_relaxed);
  return rc;
}

static void request_end_early(struct ms_request *r, int how) {
  int none = 0;
  if (!atomic_compare_exchange_strong_explicit(&r->cancel, &none, how, memory_order_acq_rel, memory_order_acquire))
    return;
  /* an idle worker 0 sleeps on the mailbox: wake it to retire the request */
  atomic_fetch_add_explicit(&r->e->mail_seq, 1, memory_order_release);
  ms_futex_wake_all(&r->e->mail_seq);
}

void ms_request_cancel(struct ms_request *r) {
  if (r) request_end_early(r, 1);
}

void ms_request_stop(struct ms_request *r) {
  if (r) request_end_early(r, 2);
}

void ms_request_get_info(const struct ms_request *r, struct ms_request_info *out) {
  struct ms_request *w = (struct ms_request *)r;
  out->state = atomic_load_explicit(&w->state, memory_order_acquire);
  out->slot = r->slot;
  out->generation = r->generation;
  out->n_prompt = r->n_prompt;
  out->n_tokens = atomic_load_explicit(&w->n_tokens, memory_order_acquire);
  out->tokens = r->tokens;
  out->n_logits = atomic_load_explicit(&w->n_logits, memory_order_acquire);
  out->logits = r->logits;
  out->t_submit = r->t_submit;
  out->t_admit = r->t_admit;
  out->t_first = r->t_first;
  out->t_done = r->t_done;
  out->finish = (enum ms_finish)atomic_load_explicit(&w->finish, memory_order_relaxed);
  if (out->state != MS_REQ_DONE && out->state != MS_REQ_CANCELLED) out->finish = MS_FINISH_NONE;
  out->logprob = r->lp;
  out->top_logprobs = r->top_lp;
  out->top_ids = r->top_ids;
  out->top_lp = r->top_vals;
}

void ms_request_free(struct ms_request *r) {
  if (r) request_release(r);
}

/* ---- read-outs and faults ---- */

void ms_engine_get_stats(const struct ms_engine *e, struct ms_engine_stats *out) {
  struct ms_engine *m = (struct ms_engine *)e;
  memset(out, 0, sizeof *out);
  out->steps = atomic_load(&m->steps);
  out->tokens = atomic_load(&m->tokens);
  out->positions = atomic_load(&m->positions);
  out->stalls = atomic_load(&m->stalls);
  out->n_workers = e->n_workers;
  for (int w = 0; w < e->n_workers; w++) out->tasks += atomic_load(&m->workers[w].tasks_done);
  out->running = atomic_load_explicit(&m->stat_running, memory_order_relaxed);
  uint64_t tail = atomic_load_explicit(&m->mail.tail, memory_order_relaxed),
           head = atomic_load_explicit(&m->mail.head, memory_order_relaxed);
  out->waiting = tail > head ? (int)(tail - head) : 0;
  out->kv_pages_used = atomic_load_explicit(&m->stat_pages_used, memory_order_relaxed);
  out->kv_pages = e->pool_pages;
}

int ms_engine_step_log(const struct ms_engine *e, struct ms_step_record *out, int max) {
  struct ms_engine *m = (struct ms_engine *)e;
  pthread_mutex_lock(&m->log_mu);
  uint64_t n = m->step_log_n, have = n < MS_STEP_LOG ? n : MS_STEP_LOG;
  if ((uint64_t)max > have) max = (int)have;
  for (int i = 0; i < max; i++) out[i] = m->step_log[(n - (uint64_t)max + (uint64_t)i) % MS_STEP_LOG];
  pthread_mutex_unlock(&m->log_mu);
  return max;
}

int ms_engine_set_task_delay(struct ms_engine *e, int rows, int task, uint64_t ns) {
  int i = bucket_index(rows < 1 ? 1 : rows);
  if (i >= e->n_buckets) return -EINVAL;
  struct plan_rt *rt = &e->rt[i];
  if (task < 0 || task >= rt->plan->n_tasks) return -EINVAL;
  /* Set before the plan runs (the array is read by workers without locks). */
  if (!rt->delay_ns && !(rt->delay_ns = calloc((size_t)rt->plan->n_tasks, sizeof(uint64_t)))) return -ENOMEM;
  rt->delay_ns[task] = ns;
  return 0;
}

int ms_engine_pause_at(struct ms_engine *e, uint64_t step) {
  atomic_store_explicit(&e->pause_at, step, memory_order_release);
  /* an engine paused at an earlier step goes on to this one */
  atomic_fetch_add_explicit(&e->pause_seq, 1, memory_order_release);
  ms_futex_wake_all(&e->pause_seq);
  return 0;
}

int ms_engine_wait_paused(struct ms_engine *e, int timeout_ms) {
  uint64_t until = timeout_ms >= 0 ? ms_now_ns() + (uint64_t)timeout_ms * 1000000ull : UINT64_MAX;
  for (;;) {
    uint32_t p = atomic_load_explicit(&e->paused, memory_order_acquire);
    uint64_t at = atomic_load_explicit(&e->pause_at, memory_order_acquire);
    if (p && p - 1 >= at) return 0;  /* paused at (or past) the requested step */
    if (ms_now_ns() >= until) return -ETIMEDOUT;
    ms_futex_wait(&e->paused, p, 50);
  }
}

int ms_engine_resume(struct ms_engine *e) {
  atomic_store_explicit(&e->pause_at, UINT64_MAX, memory_order_release);
  atomic_fetch_add_explicit(&e->pause_seq, 1, memory_order_release);
  ms_futex_wake_all(&e->pause_seq);
  return 0;
}

uint64_t ms_engine_sim_now(const struct ms_engine *e) {
  return e->sim ? atomic_load(&((struct ms_engine *)e)->sim_now) : 0;
}

uint64_t ms_engine_last_stall(const struct ms_engine *e, char *buf, size_t n) {
  struct ms_engine *m = (struct ms_engine *)e;
  pthread_mutex_lock(&m->log_mu);
  snprintf(buf, n, "%s", m->stall_report);
  pthread_mutex_unlock(&m->log_mu);
  return atomic_load(&m->stalls);
}
