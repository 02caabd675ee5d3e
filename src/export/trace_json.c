/* SPDX-License-Identifier: MIT */
/* Writing the task trace: the Chrome JSON writer and the entry points
 * (ms_engine_trace_save), over the runtime's view of a stopped recording
 * (ms_engine_trace_view, megascope/telemetry.h). The Perfetto protobuf writer
 * is trace_perfetto.c.
 *
 * Time. The view's times are integer nanoseconds from the window's start;
 * JSON's "ts" and "dur" are microseconds, printed as the exact fixed-point
 * decimal of those nanoseconds (1234.567), never through a floating-point
 * number, so a flow's start (its producer's end less 1 ns) lies inside its
 * producer's slice however long the trace. The writers run on the caller's
 * thread after the stop. */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "export/trace_write.h"
#include "megascope/export.h"
#include "megascope/telemetry.h"

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

static void json_slice(const struct ms_trace_view *v, const struct ms_trace_event *x, struct jbuf *j) {
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
static void json_flow(const struct ms_trace_view *v, const struct ms_trace_event *x, size_t i, struct jbuf *j) {
  const struct ms_trace_event *p = &v->ev[x->flow_from];
  uint64_t s = p->dur ? p->ts + p->dur - 1 : p->ts;
  char a[32], b[32];
  fx(a, sizeof a, s);
  fx(b, sizeof b, x->ts);
  jp(j, ",\n{\"ph\":\"s\",\"cat\":\"release\",\"name\":\"release\",\"id\":%zu,\"pid\":1,\"tid\":%u,\"ts\":%s}", i + 1,
     p->worker, a);
  jp(j, ",\n{\"ph\":\"f\",\"bp\":\"e\",\"cat\":\"release\",\"name\":\"release\",\"id\":%zu,\"pid\":1,\"tid\":%u,\"ts\":%s}",
     i + 1, x->worker, b);
}

int tv_write_json(const struct ms_trace_view *v, struct tv_out *o, struct ms_trace_written *w) {
  struct jbuf j = {.n = 0};
  jp(&j, "{\"displayTimeUnit\":\"ns\",\"traceEvents\":[\n{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":1,"
         "\"args\":{\"name\":\"megascope engine\"}}");
  for (int k = 0; k < v->n_workers; k++) {
    if (v->rank_workers)  /* across ranks: rank after rank */
      jp(&j, ",\n{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":1,\"tid\":%d,\"args\":{\"name\":\"rank %d worker %d\"}}",
         k, k / v->rank_workers, k % v->rank_workers);
    else
      jp(&j, ",\n{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":1,\"tid\":%d,\"args\":{\"name\":\"worker %d\"}}", k, k);
    if (j.n > sizeof j.b / 2 || k == v->n_workers - 1) {
      if (tv_put(o, j.b, j.n)) return -ENOSPC;
      j.n = 0;
    }
  }
  size_t i = 0;
  for (; i < v->n; i++) {
    const struct ms_trace_event *x = &v->ev[i];
    char ts[32];
    j.n = 0;
    if (x->kind == MS_TRACE_COUNTER) {
      fx(ts, sizeof ts, x->ts);
      jp(&j, ",\n{\"ph\":\"C\",\"name\":\"jit_queue_depth\",\"pid\":1,\"ts\":%s,\"args\":{\"depth\":%" PRIu32 "}}", ts,
         x->task);
    } else {
      json_slice(v, x, &j);
      if (x->flow_from != MS_TRACE_NONE) json_flow(v, x, i, &j);
    }
    if (tv_put(o, j.b, j.n)) break;
    if (x->kind == MS_TRACE_COUNTER)
      w->counters++;
    else
      w->slices++, w->flows += x->flow_from != MS_TRACE_NONE;
  }
  w->budget_dropped = v->budget_dropped + (v->n - i);
  w->kept_ns = i < v->n ? v->ev[i].ts : v->cut_ns;
  char win[32], kept[32];
  fx(win, sizeof win, v->window_ns);
  fx(kept, sizeof kept, w->kept_ns);
  j.n = 0;
  jp(&j,
     "\n],\"metadata\":{\"clock\":\"ns since the recording started\",\"records\":%" PRIu64 ",\"dropped\":%" PRIu64
     ",\"budget_dropped\":%" PRIu64 ",\"outside_window\":%" PRIu64 ",\"workers\":%d,\"window_us\":%s,\"kept_us\":%s",
     v->records, v->buffer_dropped, w->budget_dropped, v->outside, v->n_workers, win, kept);
  if (v->rank_workers)  /* across ranks: each rank's clock moved onto rank 0's, within this bound */
    jp(&j, ",\"ranks\":%d,\"rank_workers\":%d,\"clock_error_ns\":%" PRIu64, v->n_workers / v->rank_workers,
       v->rank_workers, v->clock_err_ns);
  jp(&j, "}}\n");
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
  struct ms_trace_view v;
  struct ms_trace_written w = {0};
  int rc = ms_engine_trace_view(e, o->max_events, &v);
  if (rc == -EBUSY) return rc;  /* recording: nothing was built */
  if (!rc) {
    struct tv_out to = {.f = f, .max_bytes = o->max_bytes, .reserve = 1024};
    rc = o->format == MS_TRACE_PERFETTO ? tv_write_perfetto(&v, &to, &w) : tv_write_json(&v, &to, &w);
    if (!rc && (to.err || fflush(f) || ferror(f))) rc = -EIO;
    w.outside = v.outside;
    w.buffer_dropped = v.buffer_dropped;
    w.window_ns = v.window_ns;
    w.bytes = to.bytes;
  }
  ms_trace_view_free(&v);
  if (out) *out = w;
  return rc;
}

int ms_engine_trace_write(const struct ms_engine *e, FILE *f) { return ms_engine_trace_save(e, f, NULL, NULL); }
