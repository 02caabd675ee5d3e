/* SPDX-License-Identifier: MIT */
/* The watchdog: a thread that notices when no task has finished for a while in a
 * step that has work left, and reports by name which tasks wait on which event,
 * the event's count against what it needs, and which producers have not
 * triggered it. It only reads (relaxed loads of state the workers publish for it);
 * it changes nothing, so a slow step is reported, not broken. */
#include <inttypes.h>
#include <string.h>

#include "core/event.h"
#include "runtime/runtime_impl.h"

static uint64_t tasks_done(struct ms_engine *e) {
  uint64_t n = 0;
  for (int w = 0; w < e->n_workers; w++) n += atomic_load_explicit(&e->workers[w].tasks_done, memory_order_relaxed);
  return n;
}

static int step_in_flight(struct ms_engine *e, struct plan_rt **rt_out, uint64_t *gen_out) {
  struct plan_rt *rt = atomic_load_explicit(&e->cur, memory_order_acquire);
  if (!rt || atomic_load_explicit(&e->cur_stop, memory_order_relaxed)) return 0;
  uint64_t gen = atomic_load_explicit(&e->cur_gen, memory_order_relaxed);
  const struct ms_event *end = &rt->plan->events[rt->plan->end_event];
  uint64_t c = atomic_load_explicit(&rt->counters[rt->plan->end_event], memory_order_relaxed);
  *rt_out = rt;
  *gen_out = gen;
  return c < ms_event_target(end, gen);
}

struct out {
  char *buf;
  size_t n, len;
};

static void put(struct out *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(struct out *o, const char *fmt, ...) {
  if (o->len + 1 >= o->n) return;
  va_list ap;
  va_start(ap, fmt);
  int k = vsnprintf(o->buf + o->len, o->n - o->len, fmt, ap);
  va_end(ap);
  if (k > 0) o->len = o->len + (size_t)k < o->n ? o->len + (size_t)k : o->n - 1;
}

static int running_on(struct ms_engine *e, int t) {
  for (int w = 0; w < e->n_workers; w++)
    if (atomic_load_explicit(&e->workers[w].running, memory_order_relaxed) == t) return w;
  return -1;
}

static void report_wait(struct ms_engine *e, struct plan_rt *rt, uint64_t gen, int t, struct out *o) {
  const struct ms_plan *p = rt->plan;
  char name[96];
  int ev = t >= 0 ? p->tasks[t].wait : p->end_event;
  const struct ms_event *E = &p->events[ev];
  uint64_t c = atomic_load_explicit(&rt->counters[ev], memory_order_relaxed);
  uint64_t base = (uint64_t)E->needed * gen;
  if (t >= 0) {
    ms_plan_task_name(p, t, name, sizeof name);
    put(o, "waits to run %s (task %d) on event %d (%s): %" PRIu64 "/%d triggers this step\n", name, t, ev,
        p->ev_classes[E->cls], c > base ? c - base : 0, E->needed);
  } else {
    put(o, "waits for the end of the step, event %d (%s): %" PRIu64 "/%d triggers\n", ev,
        p->ev_classes[E->cls], c > base ? c - base : 0, E->needed);
  }
  int listed = 0;
  for (int i = p->trig_off[ev]; i < p->trig_off[ev + 1]; i++) {
    int q = p->trig[i];
    if (atomic_load_explicit(&rt->done_gen[q], memory_order_relaxed) >= gen + 1) continue;
    if (listed++ >= 6) continue;
    ms_plan_task_name(p, q, name, sizeof name);
    int w = running_on(e, q);
    if (w >= 0)
      put(o, "      not yet triggered: %s (task %d), running on worker %d\n", name, q, w);
    else
      put(o, "      not yet triggered: %s (task %d), waiting on event %d\n", name, q, p->tasks[q].wait);
  }
  if (listed > 6) put(o, "      ... and %d more producers not yet triggered\n", listed - 6);
}

void ms_watchdog_report(struct ms_engine *e, uint64_t idle_ms, char *buf, size_t n) {
  struct out o = {buf, n, 0};
  buf[0] = 0;
  struct plan_rt *rt;
  uint64_t gen, now = ms_now_ns();
  if (!step_in_flight(e, &rt, &gen)) return;
  put(&o, "stall: no task finished for %" PRIu64 " ms in step %" PRIu64 " (plan for batch %d, generation %" PRIu64 ")\n",
      idle_ms, atomic_load_explicit(&e->cur_step, memory_order_relaxed), rt->plan->batch, gen);
  char name[96];
  for (int w = 0; w < e->n_workers; w++) {
    struct worker *wk = &e->workers[w];
    int run = atomic_load_explicit(&wk->running, memory_order_relaxed);
    int wait = atomic_load_explicit(&wk->waiting, memory_order_relaxed);
    uint64_t since = atomic_load_explicit(&wk->since, memory_order_relaxed);
    uint64_t ms = now > since ? (now - since) / 1000000ull : 0;
    put(&o, "  worker %d: ", w);
    if (run >= 0) {
      ms_plan_task_name(rt->plan, run, name, sizeof name);
      put(&o, "running %s (task %d) for %" PRIu64 " ms\n", name, run, ms);
    } else if (wait != -1) {
      report_wait(e, rt, gen, wait, &o);
    } else {
      put(&o, "idle\n");
    }
  }
}

void *ms_watchdog_main(void *arg) {
  struct ms_engine *e = arg;
  int period = e->o.watchdog_ms / 4 > 0 ? e->o.watchdog_ms / 4 : 1;
  uint64_t last = tasks_done(e), last_change = ms_now_ns();
  int reported = 0;
  while (!atomic_load(&e->wd_stop)) {
    ms_futex_wait(&e->wd_stop, 0, period);
    uint64_t now = ms_now_ns(), done = tasks_done(e);
    struct plan_rt *rt;
    uint64_t gen;
    if (done != last || !step_in_flight(e, &rt, &gen)) {
      last = done;
      last_change = now;
      reported = 0;
      continue;
    }
    uint64_t idle_ms = (now - last_change) / 1000000ull;
    if (reported || idle_ms < (uint64_t)e->o.watchdog_ms) continue;
    char report[8192];
    ms_watchdog_report(e, idle_ms, report, sizeof report);
    if (!report[0]) continue;
    reported = 1;
    atomic_fetch_add(&e->stalls, 1);
    pthread_mutex_lock(&e->log_mu);
    snprintf(e->stall_report, sizeof e->stall_report, "%s", report);
    pthread_mutex_unlock(&e->log_mu);
    ms_logf(MS_LOG_WARN, "%s", report);
  }
  return NULL;
}
