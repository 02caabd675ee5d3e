/* SPDX-License-Identifier: MIT */
/* The view of a stopped task trace (ms_engine_trace_view): its records clipped
 * to the window, in time order, with event classes from each task's own
 * bucket's plan and flows from producer to consumers. Its writers (Chrome
 * JSON, Perfetto) are src/export's.
 *
 * Time. Every time is an integer count of nanoseconds from the window's start
 * (trace_start) to its end (trace_stop).
 * The view is built on the caller's thread after the stop: workers no longer
 * write any record below the published counts, and the window's ends were set
 * by the same caller. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "megascope/telemetry.h"
#include "runtime/runtime_impl.h"

/* ---- the view ---- */

static int cmp_event(const void *a, const void *b) {
  const struct ms_trace_event *x = a, *y = b;
  if (x->ts != y->ts) return x->ts < y->ts ? -1 : 1;
  if (x->worker != y->worker) return x->worker < y->worker ? -1 : 1;
  return (x->seq > y->seq) - (x->seq < y->seq);
}

/* A producer: the slice whose trigger completed event ev in step step, on
 * rank rank (every rank completes its own copy of each event). */
struct fire_key {
  uint64_t step;
  uint32_t ev, idx;
  int rank;
};

static int cmp_fire(const void *a, const void *b) {
  const struct fire_key *x = a, *y = b;
  if (x->step != y->step) return x->step < y->step ? -1 : 1;
  if (x->rank != y->rank) return x->rank < y->rank ? -1 : 1;
  return (x->ev > y->ev) - (x->ev < y->ev);
}

static int rank_of(const struct ms_trace_view *v, const struct ms_trace_event *x) {
  return v->rank_workers ? x->worker / v->rank_workers : 0;
}

/* Across ranks, a communication task that received device d's share on
 * another rank: its flow starts at the task that sent it, the same task of
 * the same step on rank d (the remote producer), found by (step, task, rank). */
struct send_key {
  uint64_t step;
  uint32_t task, idx;
  int rank, bucket;
};

static int cmp_send(const void *a, const void *b) {
  const struct send_key *x = a, *y = b;
  if (x->step != y->step) return x->step < y->step ? -1 : 1;
  if (x->rank != y->rank) return x->rank < y->rank ? -1 : 1;
  if (x->bucket != y->bucket) return x->bucket < y->bucket ? -1 : 1;
  return (x->task > y->task) - (x->task < y->task);
}

/* The rank whose share task x moves when it is a communication task of the
 * plan that ran it (tile[2], dist.c), else -1. */
static int comm_device(const struct ms_engine *e, const struct ms_trace_event *x) {
  if (x->kind != MS_TRACE_SLICE || x->bucket_log2 >= e->n_buckets) return -1;
  const struct ms_plan *p = e->rt[x->bucket_log2].plan;
  if (x->task >= (uint32_t)p->n_tasks || p->tasks[x->task].kernel != MS_K_COMM) return -1;
  return p->tasks[x->task].tile[2];
}

static void link_remote(const struct ms_engine *e, struct ms_trace_view *v) {
  size_t ns = 0;
  struct send_key *sends = v->rank_workers ? malloc((v->n + 1) * sizeof *sends) : NULL;
  if (!sends) return;
  for (size_t i = 0; i < v->n; i++) {
    int d = comm_device(e, &v->ev[i]);
    if (d >= 0 && d == rank_of(v, &v->ev[i]))
      sends[ns++] = (struct send_key){v->ev[i].step, v->ev[i].task, (uint32_t)i, d, v->ev[i].bucket_log2};
  }
  if (ns > 1) qsort(sends, ns, sizeof *sends, cmp_send);
  for (size_t i = 0; i < v->n && ns; i++) {
    struct ms_trace_event *c = &v->ev[i];
    int d = comm_device(e, c);
    if (d < 0 || d == rank_of(v, c)) continue;
    struct send_key key = {c->step, c->task, 0, d, c->bucket_log2};
    const struct send_key *f = bsearch(&key, sends, ns, sizeof *sends, cmp_send);
    if (!f || f->idx >= i) continue;  /* the send began first, in time order */
    c->flow_from = f->idx;  /* the remote producer, rather than this rank's bodiless tiles */
  }
  free(sends);
}

/* Event-class names of every bucket's plan, deduplicated (class ids differ
 * between plans: a small bucket's plan has fewer fused events): map[b][c] is
 * the index of bucket b's event class c. */
static int ev_class_table(const struct ms_engine *e, struct ms_trace_view *v, uint16_t **map) {
  int total = 0;
  for (int b = 0; b < e->n_buckets; b++) total += e->rt[b].plan->n_ev_classes;
  v->ev_classes = calloc((size_t)total + 1, sizeof *v->ev_classes);
  for (int b = 0; b < e->n_buckets; b++) map[b] = calloc((size_t)e->rt[b].plan->n_ev_classes + 1, sizeof **map);
  if (!v->ev_classes) return -ENOMEM;
  for (int b = 0; b < e->n_buckets; b++) {
    const struct ms_plan *p = e->rt[b].plan;
    if (!map[b]) return -ENOMEM;
    for (int c = 0; c < p->n_ev_classes; c++) {
      int k = 0;
      while (k < v->n_ev_classes && strcmp(v->ev_classes[k], p->ev_classes[c])) k++;
      if (k == v->n_ev_classes) v->ev_classes[v->n_ev_classes++] = p->ev_classes[c];
      map[b][c] = (uint16_t)k;
    }
  }
  return 0;
}

/* Appends record r (index i) of worker w, clipped to [t0, t1]; 0 when it lies outside. */
static int add_record(const struct ms_engine *e, uint16_t *const *map, int w, const struct trace_rec *r, uint32_t i,
                      uint64_t t0, uint64_t t1, struct ms_trace_event *x) {
  uint64_t b = r->t_begin, end = r->kind == TR_TASK ? r->t_end : r->t_begin;
  if (end < t0 || b > t1 || end < b) return 0;
  if (b < t0) b = t0;
  if (end > t1) end = t1;
  *x = (struct ms_trace_event){.ts = b - t0, .dur = end - b, .worker = (uint16_t)w, .seq = i, .kind = MS_TRACE_COUNTER,
                         .wait_ev = MS_HOOK_NONE32, .fired_ev = MS_HOOK_NONE32, .flow_from = MS_TRACE_NONE};
  if (r->kind == TR_QDEPTH) {
    x->task = r->depth;
    return 1;
  }
  x->kind = MS_TRACE_SLICE;
  x->step = r->step;
  x->queued_ns = r->t_begin > r->t_ready ? r->t_begin - r->t_ready : 0;
  x->task = r->task;
  x->req_gen = r->req_gen;
  x->wait_us = r->wait_ns_us;
  x->row = r->row;
  x->slot = r->slot;
  x->pos = r->pos;
  x->cached = r->cached;
  x->cls = (uint16_t)r->cls;
  x->bucket_log2 = r->bucket_log2;
  x->jit = r->launch == MS_LAUNCH_JIT;
  x->waited = r->waited;
  /* the event's class in the plan that ran the task, not the largest bucket's */
  if (r->bucket_log2 < e->n_buckets) {
    const struct ms_plan *p = e->rt[r->bucket_log2].plan;
    if (r->wait_ev < (uint32_t)p->n_events) {
      x->wait_ev = r->wait_ev;
      x->ev_class = (uint16_t)(map[r->bucket_log2][p->events[r->wait_ev].cls] + 1);
    }
    if (r->fired_ev < (uint32_t)p->n_events) x->fired_ev = r->fired_ev;
  }
  return 1;
}

/* Each consumer's flow starts at the producer whose trigger completed its event
 * in its step, when that producer is in the view before it and ended no later
 * than it began. */
static int link_flows(const struct ms_engine *e, struct ms_trace_view *v) {
  size_t nf = 0;
  struct fire_key *fires = malloc((v->n + 1) * sizeof *fires);
  uint32_t *fill = calloc(v->n + 1, sizeof *fill);
  v->flow_to = malloc((v->n + 1) * sizeof *v->flow_to);
  int rc = -ENOMEM;
  if (!fires || !fill || !v->flow_to) goto out;
  for (size_t i = 0; i < v->n; i++)
    if (v->ev[i].kind == MS_TRACE_SLICE && v->ev[i].fired_ev != MS_HOOK_NONE32)
      fires[nf++] = (struct fire_key){v->ev[i].step, v->ev[i].fired_ev, (uint32_t)i, rank_of(v, &v->ev[i])};
  if (nf > 1) qsort(fires, nf, sizeof *fires, cmp_fire);
  for (size_t i = 0; i < v->n; i++) {
    struct ms_trace_event *c = &v->ev[i];
    if (c->kind != MS_TRACE_SLICE || c->wait_ev == MS_HOOK_NONE32) continue;
    struct fire_key key = {c->step, c->wait_ev, 0, rank_of(v, c)};
    const struct fire_key *f = nf ? bsearch(&key, fires, nf, sizeof *fires, cmp_fire) : NULL;
    if (!f || f->idx >= i) continue;
    const struct ms_trace_event *p = &v->ev[f->idx];
    if (p->ts + p->dur > c->ts || p->bucket_log2 != c->bucket_log2) continue;
    c->flow_from = f->idx;
  }
  link_remote(e, v);
  for (size_t i = 0; i < v->n; i++)
    if (v->ev[i].flow_from != MS_TRACE_NONE) v->ev[v->ev[i].flow_from].n_flows++;
  uint32_t at = 0;
  for (size_t i = 0; i < v->n; i++) {
    v->ev[i].flows_first = at;
    at += v->ev[i].n_flows;
  }
  for (size_t i = 0; i < v->n; i++) {
    uint32_t p = v->ev[i].flow_from;
    if (p != MS_TRACE_NONE) v->flow_to[v->ev[p].flows_first + fill[p]++] = (uint32_t)i;
  }
  rc = 0;
out:
  free(fires);
  free(fill);
  return rc;
}

/* Across ranks, rank p's workers are tracks p * n_workers + w, after rank
 * 0's (a rank with another worker count is left out, counted in outside). */
static void add_ranks(const struct ms_engine *e, uint16_t *const *map, uint64_t t0, uint64_t t1,
                      struct ms_trace_view *v) {
  for (int p = 1; p < 64; p++) {
    const struct ms_rank_trace *rt = ms_rt_ranks_trace_of(e, p);
    if (!rt) continue;
    v->rank_workers = e->n_workers;
    if (rt->err_ns > v->clock_err_ns) v->clock_err_ns = rt->err_ns;
    for (int w = 0; w < rt->n_workers; w++) {
      v->records += rt->n[w];
      v->buffer_dropped += rt->dropped[w];
      if (rt->n_workers != e->n_workers) {
        v->outside += rt->n[w];
        continue;
      }
      for (uint32_t i = 0; i < rt->n[w]; i++) {
        if (add_record(e, map, p * e->n_workers + w, &rt->rec[w][i], i, t0, t1, &v->ev[v->n]))
          v->n++;
        else
          v->outside++;
      }
    }
    v->n_workers = (p + 1) * e->n_workers;
  }
}

void ms_trace_view_free(struct ms_trace_view *v) {
  free(v->ev);
  free(v->flow_to);
  free(v->ev_classes);
  free((void *)v->classes);
}

int ms_engine_trace_view(const struct ms_engine *e, uint64_t max_events, struct ms_trace_view *v) {
  uint64_t t0 = e->trace_t0, t1 = e->trace_t1 > t0 ? e->trace_t1 : t0;
  uint16_t *map[64] = {0};
  size_t total = 0;
  int rc = -ENOMEM;
  memset(v, 0, sizeof *v);
  if (atomic_load(&((struct ms_engine *)e)->trace_on)) return -EBUSY;
  v->n_workers = e->n_workers;
  v->window_ns = t1 - t0;
  if (e->n_buckets > 64) return -EINVAL;
  const char **names = calloc((size_t)e->n_classes + 1, sizeof *names);
  if (!names) goto out;
  for (int c = 0; c < e->n_classes; c++) names[c] = e->names->classes[c].name;
  v->classes = names;
  if ((rc = ev_class_table(e, v, map))) goto out;
  rc = -ENOMEM;
  for (int w = 0; w < e->n_workers; w++) total += ms_tel_published(e, w);
  for (int p = 1; p < 64; p++) {  /* across ranks: the others' records, on this rank's clock */
    const struct ms_rank_trace *rt = ms_rt_ranks_trace_of(e, p);
    for (int w = 0; rt && rt->n_workers == e->n_workers && w < rt->n_workers; w++) total += rt->n[w];
  }
  if (!(v->ev = malloc((total + 1) * sizeof *v->ev))) goto out;
  for (int w = 0; w < e->n_workers; w++) {
    uint32_t n = ms_tel_published(e, w);
    v->records += n;
    v->buffer_dropped += atomic_load(&((struct worker *)&e->workers[w])->trace_dropped);
    for (uint32_t i = 0; i < n; i++) {
      if (add_record(e, map, w, &e->workers[w].trace[i], i, t0, t1, &v->ev[v->n]))
        v->n++;
      else
        v->outside++;
    }
  }
  add_ranks(e, map, t0, t1, v);
  if (v->n > 1) qsort(v->ev, v->n, sizeof *v->ev, cmp_event);
  v->cut_ns = v->window_ns;
  if (max_events && v->n > max_events) {
    v->budget_dropped = v->n - max_events;
    v->n = max_events;
    v->cut_ns = v->ev[max_events].ts;
  }
  rc = link_flows(e, v);
out:
  for (int b = 0; b < 64; b++) free(map[b]);
  return rc;
}
