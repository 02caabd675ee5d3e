/* SPDX-License-Identifier: MIT */
/* Built-in telemetry: request latency histograms, the always-on per-class
 * aggregate, and the recording of the task trace (trace_view.c views it).
 *
 * DESIGN
 * Who writes what. Each worker owns its aggregate rows and its trace buffer and
 * is their only writer (relaxed stores; the trace count is published with a
 * release store after a record is complete). Readers (exporters, the control
 * thread) sum the rows and read records below the published count. Latency
 * histograms are written by worker 0 when it retires a request, under log_mu.
 * Sessions. A trace start bumps trace_session; a worker resets its own count when
 * it first sees the new session, so nobody else ever writes a worker's count. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "megascope/json.h"
#include "runtime/runtime_impl.h"

const double ms_latency_bounds[MS_LAT_BUCKETS] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                                  0.5,   1,      2.5,   5,    10,    25,   50,  100};

void ms_histogram_observe(struct ms_histogram *h, double s) {
  int i = 0;
  while (i < MS_LAT_BUCKETS && s > ms_latency_bounds[i]) i++;
  h->counts[i]++;
  h->count++;
  h->sum += s;
}

double ms_histogram_quantile(const struct ms_histogram *h, double q) {
  if (!h->count) return 0;
  double want = q * (double)h->count, seen = 0;
  for (int i = 0; i <= MS_LAT_BUCKETS; i++) {
    if (seen + (double)h->counts[i] >= want && h->counts[i]) {
      double lo = i ? ms_latency_bounds[i - 1] : 0;
      double hi = i < MS_LAT_BUCKETS ? ms_latency_bounds[i] : ms_latency_bounds[MS_LAT_BUCKETS - 1];
      return lo + (hi - lo) * (want - seen) / (double)h->counts[i];
    }
    seen += (double)h->counts[i];
  }
  return ms_latency_bounds[MS_LAT_BUCKETS - 1];
}

int ms_tel_init(struct ms_engine *e) {
  e->names = e->rt[e->n_buckets - 1].plan;
  e->n_classes = e->names->n_classes;
  e->n_ev_classes = e->names->n_ev_classes;
  for (int i = 0; i < e->n_buckets; i++)
    if (e->rt[i].plan->n_classes != e->n_classes || e->rt[i].plan->n_ev_classes > e->n_ev_classes) {
      /* class ids must mean the same in every bucket's plan */
      ms_logf(MS_LOG_ERROR, "telemetry: bucket plans disagree on their classes");
      return -MS_E_STATE;
    }
  for (int w = 0; w < e->n_workers; w++) {
    struct worker *wk = &e->workers[w];
    wk->acc = calloc((size_t)e->n_classes, sizeof *wk->acc);
    wk->ev_acc = calloc((size_t)e->n_ev_classes + 1, sizeof *wk->ev_acc);
    if (!wk->acc || !wk->ev_acc) return -ENOMEM;
  }
  return 0;
}

void ms_tel_free(struct ms_engine *e) {
  if (!e->workers) return;
  for (int w = 0; w < e->n_workers; w++) {
    free(e->workers[w].acc);
    free(e->workers[w].ev_acc);
    free(e->workers[w].trace);
    e->workers[w].acc = e->workers[w].ev_acc = NULL;
    e->workers[w].trace = NULL;
  }
}

static void add(_Atomic uint64_t *c, uint64_t v) {
  atomic_store_explicit(c, atomic_load_explicit(c, memory_order_relaxed) + v, memory_order_relaxed);
}

/* When task t became ready (the firing of its event, or the step start). */
static uint64_t ready_ns(struct ms_engine *e, const struct plan_rt *rt, int t, uint64_t t0) {
  int ev = rt->plan->tasks[t].wait;
  if (ev < 0) return e->step_t0;
  uint64_t gen = atomic_load_explicit(&e->cur_gen, memory_order_relaxed);
  if (atomic_load_explicit(&rt->fire_gen[ev], memory_order_acquire) == gen + 1) {
    uint64_t f = atomic_load_explicit(&rt->fire_ns[ev], memory_order_relaxed);
    return f < t0 ? f : t0;
  }
  return t0;
}

int ms_tel_enter(struct worker *w) {
  atomic_store_explicit(&w->trace_busy, atomic_load_explicit(&w->trace_busy, memory_order_relaxed) + 1,
                        memory_order_seq_cst);
  if (atomic_load_explicit(&w->e->trace_on, memory_order_seq_cst)) return 1;
  atomic_store_explicit(&w->trace_busy, atomic_load_explicit(&w->trace_busy, memory_order_relaxed) - 1,
                        memory_order_release);
  return 0;
}

void ms_tel_leave(struct worker *w) {
  atomic_store_explicit(&w->trace_busy, atomic_load_explicit(&w->trace_busy, memory_order_relaxed) - 1,
                        memory_order_release);
}

static struct trace_rec *trace_slot(struct worker *w) {
  struct ms_engine *e = w->e;
  uint64_t s = atomic_load_explicit(&e->trace_session, memory_order_acquire);
  if (atomic_load_explicit(&w->trace_session, memory_order_relaxed) != s) {  /* only this worker writes it */
    atomic_store_explicit(&w->trace_n, 0, memory_order_relaxed);
    /* release: a reader that sees the new session sees the count reset */
    atomic_store_explicit(&w->trace_session, s, memory_order_release);
  }
  uint32_t n = atomic_load_explicit(&w->trace_n, memory_order_relaxed);
  if (!w->trace || n >= e->trace_cap) {
    add(&w->trace_dropped, 1);
    return NULL;
  }
  return &w->trace[n];
}

struct trace_rec *ms_tel_slot(struct worker *w) { return trace_slot(w); }

int ms_tel_task(struct worker *w, const struct plan_rt *rt, int t, uint64_t t0, uint64_t t1, struct trace_rec *rec) {
  struct ms_engine *e = w->e;
  const struct ms_task *k = &rt->plan->tasks[t];
  uint64_t ready = ready_ns(e, rt, t, t0);
  struct cls_acc *a = &w->acc[k->cls];
  add(&a->tasks, 1);
  add(&a->task_ns, t1 - t0);
  add(&a->queue_ns, t0 - ready);
  add(&a->wait_ns, w->wait_ns);
  if (k->wait >= 0) {
    struct cls_acc *b = &w->ev_acc[rt->plan->events[k->wait].cls];
    add(&b->tasks, 1);
    add(&b->wait_ns, w->wait_ns);
  }
  if (!atomic_load_explicit(&e->trace_on, memory_order_relaxed) || !ms_tel_enter(w)) return 0;
  /* read now: once the task's trigger counts, the next step may lay out other rows */
  int row = k->tile[1], slot = row >= 0 && row < rt->x.meta.n_rows ? rt->x.meta.row_slot[row] : -1;
  ms_tel_fill(rec, rt->plan, t, t0, t1, ready, atomic_load_explicit(&e->cur_step, memory_order_relaxed), w->wait_ns,
              slot, slot >= 0 ? e->slots[slot].gen : 0);
  if (slot >= 0) {  /* a computed position; the request's cached prefix (positions never computed) beside it */
    rec->pos = rt->x.meta.row_pos[row];
    rec->cached = e->slots[slot].req ? (uint32_t)e->slots[slot].req->n_cached : 0;
  }
  return 1;
}

void ms_tel_publish(struct worker *w, const struct trace_rec *rec, uint32_t fired_ev) {
  struct trace_rec *r = trace_slot(w);
  if (r) {
    *r = *rec;
    r->fired_ev = fired_ev;
    atomic_store_explicit(&w->trace_n, atomic_load_explicit(&w->trace_n, memory_order_relaxed) + 1,
                          memory_order_release);
  }
  ms_tel_leave(w);  /* entered by ms_tel_task */
}

void ms_tel_fill(struct trace_rec *r, const struct ms_plan *p, int t, uint64_t t0, uint64_t t1, uint64_t ready,
                 uint64_t step, uint64_t wait_ns, int slot, uint32_t req_gen) {
  const struct ms_task *k = &p->tasks[t];
  *r = (struct trace_rec){.kind = TR_TASK, .t_begin = t0, .t_end = t1, .t_ready = ready, .step = step,
                          .task = (uint32_t)t, .cls = k->cls,
                          .wait_ev = k->wait >= 0 ? (uint32_t)k->wait : MS_HOOK_NONE32,
                          .fired_ev = MS_HOOK_NONE32, .row = k->tile[1], .slot = slot >= 0 ? slot : -1,
                          .req_gen = slot >= 0 ? req_gen : 0, .launch = k->launch, .waited = wait_ns > 0,
                          .wait_ns_us = (uint32_t)(wait_ns / 1000), .pos = -1};
  for (int b = p->batch; b > 1; b >>= 1) r->bucket_log2++;
}

void ms_tel_qdepth(struct worker *w, uint32_t depth) {
  if (!ms_tel_enter(w)) return;
  struct trace_rec *r = trace_slot(w);
  if (r) {
    *r = (struct trace_rec){.kind = TR_QDEPTH, .t_begin = ms_eng_now(w->e), .depth = depth};
    atomic_store_explicit(&w->trace_n, atomic_load_explicit(&w->trace_n, memory_order_relaxed) + 1,
                          memory_order_release);
  }
  ms_tel_leave(w);
}

void ms_tel_request_done(struct ms_engine *e, const struct ms_request *r, int cancelled) {
  pthread_mutex_lock(&e->log_mu);
  if (cancelled) {
    e->req_cancelled++;
  } else {
    e->req_done++;
    int n = atomic_load_explicit(&((struct ms_request *)r)->n_tokens, memory_order_relaxed);
    double ttft = (double)(r->t_first - r->t_submit) / 1e9, tpot = (double)(r->t_last - r->t_first) / 1e9 / (n - 1);
    if (n >= 1 && r->t_first) {
      ms_histogram_observe(&e->ttft, ttft);
      e->recent_lat[0][e->n_recent_lat[0]++ % MS_LAT_RECENT] = (float)ttft;
    }
    if (n >= 2) {
      ms_histogram_observe(&e->tpot, tpot);
      e->recent_lat[1][e->n_recent_lat[1]++ % MS_LAT_RECENT] = (float)tpot;
    }
  }
  pthread_mutex_unlock(&e->log_mu);
}

int ms_engine_latency_recent(const struct ms_engine *e, int which, double *out, int max) {
  struct ms_engine *m = (struct ms_engine *)e;
  if (which < 0 || which > 1 || max < 0) return 0;
  pthread_mutex_lock(&m->log_mu);
  uint64_t n = m->n_recent_lat[which], have = n < MS_LAT_RECENT ? n : MS_LAT_RECENT;
  int k = (int)(have < (uint64_t)max ? have : (uint64_t)max);
  for (int i = 0; i < k; i++) out[i] = m->recent_lat[which][(n - (uint64_t)k + (uint64_t)i) % MS_LAT_RECENT];
  pthread_mutex_unlock(&m->log_mu);
  return k;
}

void ms_engine_latency(const struct ms_engine *e, struct ms_latency_stats *out) {
  struct ms_engine *m = (struct ms_engine *)e;
  pthread_mutex_lock(&m->log_mu);
  out->ttft = m->ttft;
  out->tpot = m->tpot;
  out->requests_finished = m->req_done;
  out->requests_cancelled = m->req_cancelled;
  pthread_mutex_unlock(&m->log_mu);
  memset(&out->itl, 0, sizeof out->itl);
  uint64_t sum_ns = 0;
  for (int w = 0; m->workers && w < m->n_workers; w++) {
    for (int b = 0; b <= MS_LAT_BUCKETS; b++)
      out->itl.counts[b] += atomic_load_explicit(&m->workers[w].itl_counts[b], memory_order_relaxed);
    sum_ns += atomic_load_explicit(&m->workers[w].itl_sum_ns, memory_order_relaxed);
  }
  for (int b = 0; b <= MS_LAT_BUCKETS; b++) out->itl.count += out->itl.counts[b];
  out->itl.sum = (double)sum_ns / 1e9;
}

static int class_stats(const struct ms_engine *e, int ev, struct ms_class_stat *out, int max) {
  int n = ev ? e->n_ev_classes : e->n_classes;
  for (int c = 0; c < n && c < max; c++) {
    struct ms_class_stat *s = &out[c];
    memset(s, 0, sizeof *s);
    s->name = ev ? e->names->ev_classes[c] : e->names->classes[c].name;
    for (int w = 0; w < e->n_workers; w++) {
      struct cls_acc *a = ev ? &e->workers[w].ev_acc[c] : &e->workers[w].acc[c];
      s->tasks += atomic_load_explicit(&a->tasks, memory_order_relaxed);
      s->task_ns += atomic_load_explicit(&a->task_ns, memory_order_relaxed);
      s->queue_ns += atomic_load_explicit(&a->queue_ns, memory_order_relaxed);
      s->wait_ns += atomic_load_explicit(&a->wait_ns, memory_order_relaxed);
    }
  }
  return n;
}

int ms_engine_class_stats(const struct ms_engine *e, struct ms_class_stat *out, int max) {
  return class_stats(e, 0, out, max);
}

int ms_engine_event_class_stats(const struct ms_engine *e, struct ms_class_stat *out, int max) {
  return class_stats(e, 1, out, max);
}

/* ---- the trace ---- */

int ms_engine_trace_start(struct ms_engine *e, uint32_t records_per_worker) {
  if (e->be->can_trace && !e->be->can_trace(e)) return -MS_E_UNSUPP;
  if (atomic_load(&e->trace_on)) return -EBUSY;
  if (!records_per_worker) records_per_worker = 1u << 18;
  if (records_per_worker != e->trace_cap) {
    /* the trace is off: once no worker is still inside a record it started
     * before the stop, nobody touches the buffers and they can be swapped */
    for (int w = 0; w < e->n_workers; w++)
      while (atomic_load_explicit(&e->workers[w].trace_busy, memory_order_seq_cst)) sched_yield();
    for (int w = 0; w < e->n_workers; w++) {
      free(e->workers[w].trace);
      e->workers[w].trace = NULL;
    }
    e->trace_cap = 0;
    for (int w = 0; w < e->n_workers; w++)
      if (!(e->workers[w].trace = malloc(sizeof(struct trace_rec) * records_per_worker))) return -ENOMEM;
    e->trace_cap = records_per_worker;
  }
  for (int w = 0; w < e->n_workers; w++) atomic_store(&e->workers[w].trace_dropped, 0);
  e->trace_t0 = ms_eng_now(e);
  atomic_fetch_add_explicit(&e->trace_session, 1, memory_order_release);
  atomic_store_explicit(&e->trace_on, 1, memory_order_release);
  /* across ranks (rank 0 leading): every rank records (ranks.c) */
  int rc = ms_rt_ranks_trace(e, 1, records_per_worker);
  if (rc) ms_engine_trace_stop(e);
  return rc;
}

int ms_engine_trace_stop(struct ms_engine *e) {
  if (!atomic_exchange(&e->trace_on, 0)) return -EINVAL;
  /* a record begun before the stop may still end after this: writers clip it */
  e->trace_t1 = ms_eng_now(e);
  return ms_rt_ranks_trace(e, 0, 0);  /* and the other ranks' records come here */
}

/* Records of worker w in the current session (0 when it has not seen it). */
uint32_t ms_tel_published(const struct ms_engine *e, int w) {
  const struct worker *wk = &e->workers[w];
  if (atomic_load_explicit(&((struct worker *)wk)->trace_session, memory_order_acquire) !=
      atomic_load(&((struct ms_engine *)e)->trace_session))
    return 0;
  return atomic_load_explicit(&((struct worker *)wk)->trace_n, memory_order_acquire);
}

long ms_engine_trace_tasks(const struct ms_engine *e, int (*fn)(void *user, const struct ms_trace_task *r),
                           void *user) {
  if (atomic_load(&((struct ms_engine *)e)->trace_on)) return -EBUSY;
  long n = 0;
  for (int w = 0; w < e->n_workers; w++) {
    uint32_t k = ms_tel_published(e, w);
    for (uint32_t i = 0; i < k; i++) {
      const struct trace_rec *x = &e->workers[w].trace[i];
      if (x->kind != TR_TASK) continue;
      struct ms_trace_task r = {.worker = w, .bucket = 1 << x->bucket_log2, .task = x->task, .slot = x->slot,
                                .fired = x->fired_ev != MS_HOOK_NONE32, .step = x->step, .t_begin = x->t_begin,
                                .t_end = x->t_end, .t_ready = x->t_ready};
      n++;
      if (fn(user, &r)) return n;
    }
  }
  return n;
}

void ms_engine_trace_stats(const struct ms_engine *e, struct ms_trace_stats *out) {
  memset(out, 0, sizeof *out);
  out->active = atomic_load(&((struct ms_engine *)e)->trace_on);
  for (int w = 0; w < e->n_workers; w++) {
    out->records += ms_tel_published(e, w);
    out->dropped += atomic_load(&((struct worker *)&e->workers[w])->trace_dropped);
  }
  for (int p = 1; p < 64 && !out->active; p++) {  /* across ranks: the others' last trace too */
    const struct ms_rank_trace *rt = ms_rt_ranks_trace_of(e, p);
    for (int w = 0; rt && w < rt->n_workers; w++) out->records += rt->n[w], out->dropped += rt->dropped[w];
  }
}
