/* SPDX-License-Identifier: MIT */
/* Writing the task trace: the view of a stopped recording (its records clipped
 * to the window, in time order, with event classes from each task's own
 * bucket's plan and flows from producer to consumers) and the Chrome JSON
 * writer. The Perfetto protobuf writer is src/runtime/trace_perfetto.c.
 *
 * Time. Every time is an integer count of nanoseconds from the window's start
 * (trace_start) to its end (trace_stop); JSON's "ts" and "dur" are microseconds,
 * printed as the exact fixed-point decimal of those nanoseconds (1234.567), never
 * through a floating-point number, so a flow's start (its producer's end less
 * 1 ns) lies inside its producer's slice however long the trace.
 * The writer runs on the caller's thread after the stop: workers no longer write
 * any record below the published counts, and the window's ends were set by the
 * same caller. */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/runtime_impl.h"
#include "runtime/trace_view.h"

static const char *const format_names[MS_TRACE_FORMAT_COUNT] = {[MS_TRACE_JSON] = "json",
                                                                [MS_TRACE_PERFETTO] = "perfetto"};

const char *ms_trace_format_name(enum ms_trace_format f) {
  return (unsigned)f < MS_TRACE_FORMAT_COUNT ? format_names[f] : "?";
}

int ms_trace_format_parse(const char *s, enum ms_trace_format *out) {
  for (int i = 0; i < MS_TRACE_FORMAT_COUNT; i++)
    if (s && !strcmp(s, format_names[i])) {
      *out = (enum ms_trace_format)i;
      return 0;
    }
  return -EINVAL;
}

/* ---- output under a byte budget ---- */

int tv_put(struct tv_out *o, const void *p, size_t n) {
  if (o->full) return 1;
  if (o->max_bytes && o->bytes + n + o->reserve > o->max_bytes) {
    o->full = 1;
    return 1;
  }
  if (n && fwrite(p, 1, n, o->f) != n) o->err = 1;
  o->bytes += n;
  return 0;
}

void tv_put_final(struct tv_out *o, const void *p, size_t n) {
  if (n && fwrite(p, 1, n, o->f) != n) o->err = 1;
  o->bytes += n;
}

/* ---- the view ---- */

static int cmp_event(const void *a, const void *b) {
  const struct tv_event *x = a, *y = b;
  if (x->ts != y->ts) return x->ts < y->ts ? -1 : 1;
  if (x->worker != y->worker) return x->worker < y->worker ? -1 : 1;
  return (x->seq > y->seq) - (x->seq < y->seq);
}

/* A producer: the slice whose trigger completed event ev in step step. */
struct fire_key {
  uint64_t step;
  uint32_t ev, idx;
};

static int cmp_fire(const void *a, const void *b) {
  const struct fire_key *x = a, *y = b;
  if (x->step != y->step) return x->step < y->step ? -1 : 1;
  return (x->ev > y->ev) - (x->ev < y->ev);
}

/* Event-class names of every bucket's plan, deduplicated (class ids differ
 * between plans: a small bucket's plan has fewer fused events): map[b][c] is
 * the index of bucket b's event class c. */
static int ev_class_table(const struct ms_engine *e, struct tv *v, uint16_t **map) {
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

/* Appends record r of worker w, clipped to [t0, t1]; 0 when it lies outside. */
static int add_record(const struct ms_engine *e, uint16_t *const *map, int w, uint32_t i, uint64_t t0, uint64_t t1,
                      struct tv_event *x) {
  const struct trace_rec *r = &e->workers[w].trace[i];
  uint64_t b = r->t_begin, end = r->kind == TR_TASK ? r->t_end : r->t_begin;
  if (end < t0 || b > t1 || end < b) return 0;
  if (b < t0) b = t0;
  if (end > t1) end = t1;
  *x = (struct tv_event){.ts = b - t0, .dur = end - b, .worker = (uint16_t)w, .seq = i, .kind = TV_COUNTER,
                         .wait_ev = MS_HOOK_NONE32, .fired_ev = MS_HOOK_NONE32, .flow_from = TV_NONE};
  if (r->kind == TR_QDEPTH) {
    x->task = r->depth;
    return 1;
  }
  x->kind = TV_SLICE;
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
static int link_flows(struct tv *v) {
  size_t nf = 0;
  struct fire_key *fires = malloc((v->n + 1) * sizeof *fires);
  uint32_t *fill = calloc(v->n + 1, sizeof *fill);
  v->flow_to = malloc((v->n + 1) * sizeof *v->flow_to);
  int rc = -ENOMEM;
  if (!fires || !fill || !v->flow_to) goto out;
  for (size_t i = 0; i < v->n; i++)
    if (v->ev[i].kind == TV_SLICE && v->ev[i].fired_ev != MS_HOOK_NONE32)
      fires[nf++] = (struct fire_key){v->ev[i].step, v->ev[i].fired_ev, (uint32_t)i};
  if (nf > 1) qsort(fires, nf, sizeof *fires, cmp_fire);
  for (size_t i = 0; i < v->n; i++) {
    struct tv_event *c = &v->ev[i];
    if (c->kind != TV_SLICE || c->wait_ev == MS_HOOK_NONE32) continue;
    struct fire_key key = {c->step, c->wait_ev, 0};
    const struct fire_key *f = nf ? bsearch(&key, fires, nf, sizeof *fires, cmp_fire) : NULL;
    if (!f || f->idx >= i) continue;
    const struct tv_event *p = &v->ev[f->idx];
    if (p->ts + p->dur > c->ts || p->bucket_log2 != c->bucket_log2) continue;
    c->flow_from = f->idx;
    v->ev[f->idx].n_flows++;
  }
  uint32_t at = 0;
  for (size_t i = 0; i < v->n; i++) {
    v->ev[i].flows_first = at;
    at += v->ev[i].n_flows;
  }
  for (size_t i = 0; i < v->n; i++) {
    uint32_t p = v->ev[i].flow_from;
    if (p != TV_NONE) v->flow_to[v->ev[p].flows_first + fill[p]++] = (uint32_t)i;
  }
  rc = 0;
out:
  free(fires);
  free(fill);
  return rc;
}

static void view_free(struct tv *v) {
  free(v->ev);
  free(v->flow_to);
  free(v->ev_classes);
  free((void *)v->classes);
}

static int view_build(const struct ms_engine *e, uint64_t max_events, struct tv *v) {
  uint64_t t0 = e->trace_t0, t1 = e->trace_t1 > t0 ? e->trace_t1 : t0;
  uint16_t *map[64] = {0};
  size_t total = 0;
  int rc = -ENOMEM;
  memset(v, 0, sizeof *v);
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
  if (!(v->ev = malloc((total + 1) * sizeof *v->ev))) goto out;
  for (int w = 0; w < e->n_workers; w++) {
    uint32_t n = ms_tel_published(e, w);
    v->records += n;
    v->buffer_dropped += atomic_load(&((struct worker *)&e->workers[w])->trace_dropped);
    for (uint32_t i = 0; i < n; i++) {
      if (add_record(e, map, w, i, t0, t1, &v->ev[v->n]))
        v->n++;
      else
        v->outside++;
    }
  }
  if (v->n > 1) qsort(v->ev, v->n, sizeof *v->ev, cmp_event);
  v->cut_ns = v->window_ns;
  if (max_events && v->n > max_events) {
    v->budget_dropped = v->n - max_events;
    v->n = max_events;
    v->cut_ns = v->ev[max_events].ts;
  }
  rc = link_flows(v);
out:
  for (int b = 0; b < 64; b++) free(map[b]);
  return rc;
}

/* ---- Chrome JSON ---- */

/* ns as microseconds, exactly: 1234567 -> "1234.567". */
static int fx(char *b, size_t n, uint64_t ns) {
  return snprintf(b, n, "%" PRIu64 ".%03u", ns / 1000, (unsigned)(ns % 1000));
}

/* s as a JSON string body (at most 256 bytes of it). */
static int esc(char *b, size_t n, const char *s) {
  size_t k = 0;
  for (size_t i = 0; s[i] && i < 256 && k + 8 < n; i++) {
    unsigned char c = (unsigned char)s[i];
    if (c == '"' || c == '\\')
      b[k++] = '\\', b[k++] = (char)c;
    else if (c < 0x20)
      k += (size_t)snprintf(b + k, n - k, "\\u%04x", c);
    else
      b[k++] = (char)c;
  }
  b[k] = 0;
  return (int)k;
}

struct jbuf {
  char b[8192];
  size_t n;
};

static void jp(struct jbuf *j, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void jp(struct jbuf *j, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int k = vsnprintf(j->b + j->n, sizeof j->b - j->n, fmt, ap);
  va_end(ap);
  if (k > 0) j->n = j->n + (size_t)k < sizeof j->b ? j->n + (size_t)k : sizeof j->b - 1;
}

static void json_slice(const struct tv *v, const struct tv_event *x, struct jbuf *j) {
  char name[2048], ts[32], dur[32], q[32];
  esc(name, sizeof name, v->classes[x->cls]);
  fx(ts, sizeof ts, x->ts);
  fx(dur, sizeof dur, x->dur);
  fx(q, sizeof q, x->queued_ns);
  jp(j, ",\n{\"ph\":\"X\",\"cat\":\"task\",\"name\":\"%s\",\"pid\":1,\"tid\":%u,\"ts\":%s,\"dur\":%s,\"args\":{", name,
     x->worker, ts, dur);
  jp(j, "\"class\":\"%s\",\"task\":%" PRIu32 ",\"task_gen\":%" PRIu64 ",\"step\":%" PRIu64 ",\"bucket\":%d,\"row\":%d",
     name, x->task, x->step << 32 | x->task, x->step, 1 << x->bucket_log2, x->row);
  if (x->slot >= 0)
    jp(j, ",\"request\":\"slot %d gen %" PRIu32 "\"", x->slot, x->req_gen);
  if (x->slot >= 0 && x->pos >= 0)
    jp(j, ",\"pos\":%" PRId32 ",\"prompt_cached\":%" PRIu32, x->pos, x->cached);
  if (x->slot < 0)
    jp(j, ",\"request\":null");
  jp(j, ",\"launch\":\"%s\",\"wait_reason\":\"%s\",\"wait_us\":%" PRIu32 ",\"queued_us\":%s", x->jit ? "jit" : "aot",
     x->waited ? "dependency" : "none", x->wait_us, q);
  if (x->ev_class) {
    esc(name, sizeof name, v->ev_classes[x->ev_class - 1]);
    jp(j, ",\"event_class\":\"%s\"", name);
  }
  jp(j, "}}");
}

/* The flow into consumer x (event index i): its start 1 ns before the
 * producer's end, inside the producer's slice; its end at x's begin. */
static void json_flow(const struct tv *v, const struct tv_event *x, size_t i, struct jbuf *j) {
  const struct tv_event *p = &v->ev[x->flow_from];
  uint64_t s = p->dur ? p->ts + p->dur - 1 : p->ts;
  char a[32], b[32];
  fx(a, sizeof a, s);
  fx(b, sizeof b, x->ts);
  jp(j, ",\n{\"ph\":\"s\",\"cat\":\"release\",\"name\":\"release\",\"id\":%zu,\"pid\":1,\"tid\":%u,\"ts\":%s}", i + 1,
     p->worker, a);
  jp(j, ",\n{\"ph\":\"f\",\"bp\":\"e\",\"cat\":\"release\",\"name\":\"release\",\"id\":%zu,\"pid\":1,\"tid\":%u,\"ts\":%s}",
     i + 1, x->worker, b);
}

int tv_write_json(const struct tv *v, struct tv_out *o, struct ms_trace_written *w) {
  struct jbuf j = {.n = 0};
  jp(&j, "{\"displayTimeUnit\":\"ns\",\"traceEvents\":[\n{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":1,"
         "\"args\":{\"name\":\"megascope engine\"}}");
  for (int k = 0; k < v->n_workers; k++) {
    jp(&j, ",\n{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":1,\"tid\":%d,\"args\":{\"name\":\"worker %d\"}}", k, k);
    if (j.n > sizeof j.b / 2 || k == v->n_workers - 1) {
      if (tv_put(o, j.b, j.n)) return -ENOSPC;
      j.n = 0;
    }
  }
  size_t i = 0;
  for (; i < v->n; i++) {
    const struct tv_event *x = &v->ev[i];
    char ts[32];
    j.n = 0;
    if (x->kind == TV_COUNTER) {
      fx(ts, sizeof ts, x->ts);
      jp(&j, ",\n{\"ph\":\"C\",\"name\":\"jit_queue_depth\",\"pid\":1,\"ts\":%s,\"args\":{\"depth\":%" PRIu32 "}}", ts,
         x->task);
    } else {
      json_slice(v, x, &j);
      if (x->flow_from != TV_NONE) json_flow(v, x, i, &j);
    }
    if (tv_put(o, j.b, j.n)) break;
    if (x->kind == TV_COUNTER)
      w->counters++;
    else
      w->slices++, w->flows += x->flow_from != TV_NONE;
  }
  w->budget_dropped = v->budget_dropped + (v->n - i);
  w->kept_ns = i < v->n ? v->ev[i].ts : v->cut_ns;
  char win[32], kept[32];
  fx(win, sizeof win, v->window_ns);
  fx(kept, sizeof kept, w->kept_ns);
  j.n = 0;
  jp(&j,
     "\n],\"metadata\":{\"clock\":\"ns since the recording started\",\"records\":%" PRIu64 ",\"dropped\":%" PRIu64
     ",\"budget_dropped\":%" PRIu64 ",\"outside_window\":%" PRIu64 ",\"workers\":%d,\"window_us\":%s,\"kept_us\":%s}}\n",
     v->records, v->buffer_dropped, w->budget_dropped, v->outside, v->n_workers, win, kept);
  tv_put_final(o, j.b, j.n);
  return 0;
}

/* ---- the entry points ---- */

int ms_engine_trace_save(const struct ms_engine *e, FILE *f, const struct ms_trace_write_opts *o,
                         struct ms_trace_written *out) {
  struct ms_trace_write_opts d = {.sz = sizeof d};
  if (!o) o = &d;
  if (o->sz < sizeof *o || (unsigned)o->format >= MS_TRACE_FORMAT_COUNT || (o->max_bytes && o->max_bytes < 4096))
    return -EINVAL;
  if (atomic_load(&((struct ms_engine *)e)->trace_on)) return -EBUSY;
  struct tv v;
  struct ms_trace_written w = {0};
  int rc = view_build(e, o->max_events, &v);
  if (!rc) {
    struct tv_out to = {.f = f, .max_bytes = o->max_bytes, .reserve = 1024};
    rc = o->format == MS_TRACE_PERFETTO ? tv_write_perfetto(&v, &to, &w) : tv_write_json(&v, &to, &w);
    if (!rc && (to.err || fflush(f) || ferror(f))) rc = -EIO;
    w.outside = v.outside;
    w.buffer_dropped = v.buffer_dropped;
    w.window_ns = v.window_ns;
    w.bytes = to.bytes;
  }
  view_free(&v);
  if (out) *out = w;
  return rc;
}

int ms_engine_trace_write(const struct ms_engine *e, FILE *f) { return ms_engine_trace_save(e, f, NULL, NULL); }
