/* SPDX-License-Identifier: MIT */
/* The cpu backend: worker threads play the SMs, in real time.
 *
 * DESIGN
 * Who runs what. n worker threads, created by start (at the end of
 * ms_engine_new) and joined by stop (in ms_engine_free). Worker 0 also runs the
 * step start (ms_rt_step_begin in step.c), which publishes the step through
 * publish_step: a release increment of step_seq. Every worker then walks its
 * AOT queue for that plan: for each task it waits until the task's event has
 * fired for this generation (counter >= needed * (gen + 1): counters are never
 * reset), runs it and triggers its event. The worker whose trigger fires an
 * event pushes the event's JIT successors onto the plan's MPMC queue; waiting
 * workers run JIT tasks while they wait. The step ends when the end-of-step
 * event (fed by every sink task) fires; worker 0 then starts the next step.
 * Per-op mode runs the same tasks by stage (operator), a barrier after each.
 * The memory orders of the step machine are in step.c.
 *
 * Sleeping. Waiters spin, then yield, then sleep on `progress`, a futex word
 * bumped after every event fire (fired); `sleepers` is raised before the waiter
 * reads `progress` and re-checks its condition (seq_cst on both sides), so a
 * fire either is seen by the re-check or finds a sleeper to wake. An idle
 * engine (no requests) sleeps in worker 0 on mail_seq and in the others on
 * step_seq.
 *
 * Shutdown. ms_engine_free raises stop_req and wakes worker 0; it finishes the
 * step in flight, cancels what is left and publishes a stop step; workers exit
 * on it and stop joins them. */
/* _GNU_SOURCE (the build defines it): pthread_attr_setaffinity_np, CPU_SET, gettid */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "core/event.h"
#include "runtime/runtime_impl.h"
#include "runtime/fault.h"
#include "runtime/hooksite.h"

struct cpu {
  struct ms_engine *e;
  pthread_t *th;                       /* [n_workers] */
  int threads;                         /* started: joined by stop */
  _Alignas(64) _Atomic uint32_t step_seq;  /* bumped (release) for every step published */
  /* wake-ups: bumped on every event fire; sleepers counted to skip the syscall */
  _Alignas(64) _Atomic uint32_t progress;
  _Atomic int sleepers;
  struct ms_barrier bar;               /* per-op mode: the end of a stage */
};

static struct cpu *cpu_of(const struct worker *w) { return w->e->be_ctx; }

/* ---- wake-ups ---- */

static void cpu_fired(void *ctx, struct plan_rt *rt, int ev) {
  struct cpu *c = ctx;
  (void)rt;
  (void)ev;
  atomic_fetch_add_explicit(&c->progress, 1, memory_order_seq_cst);
  if (atomic_load_explicit(&c->sleepers, memory_order_seq_cst)) ms_futex_wake_all(&c->progress);
}

static void cpu_publish_step(void *ctx) {
  struct cpu *c = ctx;
  atomic_fetch_add_explicit(&c->step_seq, 1, memory_order_release);  /* the step's metadata with it */
  ms_futex_wake_all(&c->step_seq);
}

/* ---- running one task ---- */

static void shuffle_delay(struct worker *w) {
  struct ms_engine *e = w->e;
  uint64_t r = ms_rt_rng_next(&w->rng);
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

static void run_task(struct worker *w, struct plan_rt *rt, int t, uint64_t gen) {
  struct ms_engine *e = w->e;
  if (e->o.shuffle) shuffle_delay(w);
  uint64_t t0 = ms_rt_task_start(w, rt, t, gen);
  if (rt->delay_ns && rt->delay_ns[t]) sleep_ns(rt->delay_ns[t]);
  if (e->faults) {
    /* fault injection (comm_delay across processes): the share leaves late,
     * the worker asleep meanwhile as it is while it polls for a late share
     * (spinning, it would pass for a worker waiting for its CPU) */
    uint64_t ns = ms_fault_before_ns(e, rt, t);
    if (ns) sleep_ns(ns);
  }
  ms_rt_task_body(w, rt, t);
  if (e->faults) {
    /* fault injection (slow_class, slow_request, comm_delay, slow_worker, ...): the worker stays busy */
    uint64_t now = ms_now_ns(), until = now + ms_fault_extra_ns(e, rt, t, w->id, now - t0);
    while (ms_now_ns() < until) ms_cpu_relax();
  }
  ms_rt_task_finish(w, rt, t, gen, t0);
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
      struct cpu *c = cpu_of(w);
      atomic_fetch_add_explicit(&c->sleepers, 1, memory_order_seq_cst);
      uint32_t seq = atomic_load_explicit(&c->progress, memory_order_seq_cst);
      if (atomic_load_explicit(&rt->counters[ev], memory_order_acquire) < target && ms_rt_jit_empty(rt))
        ms_futex_wait(&c->progress, seq, 100);
      atomic_fetch_sub_explicit(&c->sleepers, 1, memory_order_seq_cst);
    }
  }
  if (announced) waited += ms_now_ns() - atomic_load_explicit(&w->since, memory_order_relaxed);
  w->wait_ns = waited;
  atomic_store_explicit(&w->waiting, -1, memory_order_relaxed);
}

/* ---- worker loops ---- */

static uint32_t wait_step(struct cpu *c, uint32_t seen) {
  for (int i = 0;; i++) {
    uint32_t s = atomic_load_explicit(&c->step_seq, memory_order_acquire);
    if (s != seen) return s;
    if (i < 1000)
      ms_cpu_relax();
    else if (i < 1100)
      sched_yield();
    else
      ms_futex_wait(&c->step_seq, seen, 200);
  }
}

static void run_megakernel_step(struct worker *w, struct plan_rt *rt, uint64_t gen) {
  const struct ms_plan *p = rt->plan;
  if (HOOK_ARMED(w->e, MS_HOOK_TASK_ASSIGN))
    for (int i = 0; i < rt->aot_n[w->id]; i++)
      ms_rt_task_hook(w, MS_HOOK_TASK_ASSIGN, rt, rt->aot_q[w->id][i], gen, -1,
                      (uint64_t)(rt->aot_n[w->id] - i));
  for (int i = 0; i < rt->aot_n[w->id]; i++) {
    int t = rt->aot_q[w->id][i];
    int ev = p->tasks[t].wait;
    if (ev >= 0) wait_event(w, rt, ev, ms_event_target(&p->events[ev], gen), gen, t);
    run_task(w, rt, t, gen);
  }
  int end = p->end_event;
  wait_event(w, rt, end, ms_event_target(&p->events[end], gen), gen, -1);
}

static void run_per_op_step(struct worker *w, struct plan_rt *rt, uint64_t gen) {
  int i = 0;
  for (int s = 0; s < rt->n_stages; s++) {
    for (; i < rt->op_end[w->id][s]; i++) run_task(w, rt, rt->op_q[w->id][i], gen);
    ms_barrier_wait(&cpu_of(w)->bar);
  }
}

static void *worker_main(void *arg) {
  struct worker *w = arg;
  struct ms_engine *e = w->e;
  uint32_t seen = 0;
  /* relaxed: read by ms_engine_worker_os for /proc, never to order anything */
  atomic_store_explicit(&w->tid, (int)gettid(), memory_order_relaxed);
  for (;;) {
    if (w->id == 0) {
      ms_rt_step_end(e);
      ms_rt_step_begin(e);
    }
    seen = wait_step(cpu_of(w), seen);
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

/* ---- the table ---- */

static uint64_t cpu_now(const void *ctx) {
  (void)ctx;
  return ms_now_ns();
}

/* GEMV tasks of CPU_TILE_BYTES of weights (at least CPU_MIN_TILES an
 * operator), unless the caller tiles. A decode step streams each
 * weight once; a task of 64 KiB (the compiler's default) ends before the
 * hardware prefetchers are at speed and hands the core back to the scheduler
 * 1500-2000 times a step: on SmolLM2 and Gemma-3 at batch 1, 1 MiB tasks decode
 * 1.10-1.18x faster (docs/performance.md, "Larger GEMV tasks on the CPU"). A size in
 * bytes, not a count a worker: replicas with different worker counts serve the
 * same plan (a query's event classes follow the tiling), and a large model
 * still gets tens of tasks an operator for many cores. */
#define CPU_TILE_BYTES (1024 * 1024)
/* And at least two tasks an operator where 1 MiB cuts fewer (the compiler's
 * eight was for exercising the scheduler): at batch 1 a small model's
 * operators are a few hundred KiB, and each task is a hand-over between
 * workers and a prefetch stream started cold (q/k/v keeps eight where its
 * matrices' types differ, and so do operators whose tasks would hold under
 * 64 KiB: graph.c qkv_tile, gemv_tile_least).
 * SmolLM2 (1431 -> 891 tasks a step) at two workers 1.08-1.11x, one level;
 * Gemma-3 (763 -> 439) level to 1.11x; batch 8 and 512-token prompts level
 * (docs/performance.md, "Fewer tasks an operator"). A fixed floor, not the
 * worker count: the plan stays the same for every worker count. */
#define CPU_MIN_TILES 2
/* With its own tiling the CPU's plans also fuse the pre-norms into qkv,
 * gate_up and the LM head (ms_compile_opts.fuse_norm; its kernels norm their
 * own inputs, kernels/ops.c task_in): a norm was a task of its own between
 * two phases, which one worker ran while the other waited, twice a layer
 * (docs/performance.md, "The pre-norms inside their consumers"). The engine
 * applies all three where its caller tiles nothing (engine.c set_defaults). */
#define CPU_FUSE_NORM 1
/* And each row's attention over a KV group is two tasks over the two halves
 * of its positions, the second to finish merging them
 * (ms_compile_opts.attn_parts): SmolLM2's three groups were three tasks a
 * layer, and on two workers one worker ran two while the other waited before
 * wo (docs/performance.md, "Attention in halves"). */
#define CPU_ATTN_PARTS 2

static int cpu_shape_only(const struct ms_engine_opts *o) {
  (void)o;
  return 0;
}

/* delayed_release: the worker spins the delay first, then counts the trigger
 * itself (a CPU worker has nothing else to do meanwhile). */
static int cpu_defer_trigger(void *ctx, struct worker *w, int producer, uint64_t delay_ns) {
  (void)ctx;
  (void)w;
  (void)producer;
  uint64_t until = ms_now_ns() + delay_ns;
  while (ms_now_ns() < until) ms_cpu_relax();
  return 0;
}

/* starve_task: waiting workers poll the JIT queues anyway. */
static void cpu_poll_at(void *ctx, uint64_t at) {
  (void)ctx;
  (void)at;
}

static void cpu_free(struct cpu *c) {
  free(c->th);
  free(c);
}

static void cpu_stop(struct ms_engine *e) {
  struct cpu *c = e->be_ctx;
  for (int w = 0; w < c->threads; w++) pthread_join(c->th[w], NULL);
  e->be_ctx = NULL;
  cpu_free(c);
}

/* pin_workers: worker w on the (w mod n)-th of the n CPUs the process may use,
 * set in the attributes it starts with (pinned_cpu is written before the thread
 * exists, so readers need no ordering). Across processes the workers count
 * rank after rank: ranks that mpirun left on the same CPUs (--bind-to none)
 * take different ones, and a rank bound to its own takes its own. 0, or -1:
 * start it unpinned. */
static int cpu_pin_attr(struct ms_engine *e, int w, pthread_attr_t *attr) {
  cpu_set_t allowed, one;
  int n = 0;
  if (!e->o.pin_workers || sched_getaffinity(0, sizeof allowed, &allowed)) return -1;
  int want = ((e->tx ? e->rank * e->n_workers : 0) + w) % CPU_COUNT(&allowed);
  for (int i = 0; i < CPU_SETSIZE; i++)
    if (CPU_ISSET(i, &allowed) && n++ == want) {
      CPU_ZERO(&one);
      CPU_SET(i, &one);
      if (pthread_attr_setaffinity_np(attr, sizeof one, &one)) return -1;
      e->workers[w].pinned_cpu = i;
      return 0;
    }
  return -1;
}

static int cpu_start(struct ms_engine *e, struct ms_textbuf *log) {
  struct cpu *c = calloc(1, sizeof *c);
  if (!c || !(c->th = calloc((size_t)e->n_workers, sizeof *c->th))) {
    free(c);
    return -ENOMEM;
  }
  c->e = e;
  ms_barrier_init(&c->bar, e->n_workers);
  e->be_ctx = c;  /* before any worker runs: they read it */
  for (int w = 0; w < e->n_workers; w++, c->threads++) {
    pthread_attr_t attr;
    int made = !pthread_attr_init(&attr);
    if (made && e->o.pin_workers && cpu_pin_attr(e, w, &attr))
      ms_textbuf_printf(log, "engine: worker %d could not be pinned; the OS places it\n", w);
    int rc = pthread_create(&c->th[w], made ? &attr : NULL, worker_main, &e->workers[w]);
    if (made) pthread_attr_destroy(&attr);
    if (rc) {
      /* Worker 0, when it started, publishes the stop and the others exit on it. */
      atomic_store(&e->stop_req, 1);
      atomic_fetch_add(&e->mail_seq, 1);
      ms_futex_wake_all(&e->mail_seq);
      cpu_stop(e);
      return -EAGAIN;
    }
  }
  return 0;
}

const struct ms_backend_ops ms_backend_cpu = {
    .info = {.name = "cpu", .label = "CPU", .os_workers = 1, .q8_activations = 1, .kv_f16 = 1, .prefix_cache = 1,
             .tile_bytes = CPU_TILE_BYTES, .min_tiles = CPU_MIN_TILES, .fuse_norm = CPU_FUSE_NORM,
             .attn_parts = CPU_ATTN_PARTS, .attn_parts_max = MS_ATTN_MAX_PARTS},
    .shape_only = cpu_shape_only,
    .start = cpu_start,
    .stop = cpu_stop,
    .now = cpu_now,
    .publish_step = cpu_publish_step,
    .fired = cpu_fired,
    .defer_trigger = cpu_defer_trigger,
    .poll_at = cpu_poll_at,
};
