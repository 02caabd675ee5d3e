/* SPDX-License-Identifier: MIT */
/* The task trace as Perfetto's native protobuf: a perfetto.protos.Trace whose
 * TracePackets carry TrackDescriptors (the engine as a process, a thread track
 * per worker, a counter track for JIT queue depth) and TrackEvents (a
 * SLICE_BEGIN/SLICE_END pair per task, COUNTER samples, flows by flow_ids and
 * terminating_flow_ids), with every name and repeated string interned.
 *
 * Written by hand: the encoder below is the few wire types a trace needs
 * (varints, fixed64, length-delimited), about a hundred lines, so no protobuf
 * library (and no code generation) is needed in C. Field numbers are those of
 * Perfetto's protos/perfetto/trace/perfetto_trace.proto; tests/cli_trace.sh
 * decodes the output with Perfetto's own generated definitions.
 *
 * Sequences. Each worker's events form one packet sequence (its
 * trusted_packet_sequence_id is the worker + 1), whose first packet clears the
 * incremental state and sets the defaults (the worker's track), so an END
 * packet is only a timestamp, the sequence and the type; the counter samples
 * have a sequence of their own after the workers'. A name is interned on its
 * sequence the first time that sequence uses it.
 * Time. The view's nanoseconds from the window's start are BOOTTIME
 * nanoseconds here (the default trace clock); each sequence defines its own
 * incremental clock (id 64, as Perfetto's SDK does), so a packet's timestamp
 * is the delta from the sequence's previous one, a byte or two. A packet that
 * would go back in time (never on the CPU backend, whose worker runs one task
 * at a time) gives its absolute BOOTTIME timestamp instead.
 * Args are the Chrome JSON's, less two the others give: "class" (the slice's
 * name) and "task_gen" (step << 32 | task); "queued_ns" is JSON's queued_us in
 * integer nanoseconds, and a task with no row or no request has no such arg. */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "export/trace_write.h"

/* ---- a protobuf encoder ---- */

enum { PB_VARINT = 0, PB_FIXED64 = 1, PB_LEN = 2 };

struct pb {
  uint8_t *p;
  size_t n, cap;
  size_t open[8];  /* offset of each open message's length byte, written when it closes */
  int depth, err;
};

static void pb_reserve(struct pb *b, size_t k) {
  if (b->n + k <= b->cap) return;
  size_t cap = b->cap ? b->cap : 4096;
  while (cap < b->n + k) cap *= 2;
  uint8_t *np = realloc(b->p, cap);
  if (!np) {
    b->err = 1;  /* nothing more is encoded; the write fails with ENOMEM */
    return;
  }
  b->p = np;
  b->cap = cap;
}

static void pb_varint(struct pb *b, uint64_t v) {
  pb_reserve(b, 10);
  if (b->err) return;
  do {
    uint8_t c = v & 0x7f;
    v >>= 7;
    b->p[b->n++] = (uint8_t)(c | (v ? 0x80 : 0));
  } while (v);
}

static void pb_tag(struct pb *b, uint32_t field, int wire) { pb_varint(b, (uint64_t)field << 3 | (unsigned)wire); }

static void pb_uint(struct pb *b, uint32_t field, uint64_t v) {
  pb_tag(b, field, PB_VARINT);
  pb_varint(b, v);
}

static void pb_fixed64(struct pb *b, uint32_t field, uint64_t v) {
  pb_tag(b, field, PB_FIXED64);
  pb_reserve(b, 8);
  if (b->err) return;
  for (int i = 0; i < 8; i++) b->p[b->n++] = (uint8_t)(v >> (8 * i));  /* little-endian */
}

static void pb_bytes(struct pb *b, uint32_t field, const void *s, size_t n) {
  pb_tag(b, field, PB_LEN);
  pb_varint(b, n);
  pb_reserve(b, n);
  if (b->err) return;
  memcpy(b->p + b->n, s, n);
  b->n += n;
}

static void pb_str(struct pb *b, uint32_t field, const char *s) { pb_bytes(b, field, s, strlen(s)); }

/* A nested message: its length is known only at its end, so one byte is kept
 * for it and the body moved when the length needs more. */
static void pb_open(struct pb *b, uint32_t field) {
  pb_tag(b, field, PB_LEN);
  pb_reserve(b, 1);
  if (b->err || b->depth == 8) {
    b->err = 1;
    return;
  }
  b->open[b->depth++] = b->n;
  b->p[b->n++] = 0;
}

static void pb_close(struct pb *b) {
  if (b->err || !b->depth) return;
  size_t at = b->open[--b->depth], len = b->n - at - 1, k = 1;
  for (uint64_t v = len >> 7; v; v >>= 7) k++;
  if (k > 1) {
    pb_reserve(b, k - 1);
    if (b->err) return;
    memmove(b->p + at + k, b->p + at + 1, len);
    b->n += k - 1;
  }
  uint64_t v = len;
  for (size_t i = 0; i < k; i++, v >>= 7) b->p[at + i] = (uint8_t)((v & 0x7f) | (i + 1 < k ? 0x80 : 0));
}

/* ---- Perfetto's field numbers (perfetto_trace.proto) ---- */

enum {
  TRACE_PACKET = 1,
  /* TracePacket */
  TP_CLOCK_SNAPSHOT = 6, TP_TIMESTAMP = 8, TP_SEQUENCE_ID = 10, TP_TRACK_EVENT = 11, TP_INTERNED_DATA = 12, TP_SEQUENCE_FLAGS = 13,
  TP_TIMESTAMP_CLOCK_ID = 58, TP_DEFAULTS = 59, TP_TRACK_DESCRIPTOR = 60, TP_FIRST_ON_SEQUENCE = 87,
  /* ClockSnapshot, ClockSnapshot.Clock */
  CS_CLOCKS = 1, CLK_ID = 1, CLK_TIMESTAMP = 2, CLK_INCREMENTAL = 3,
  CLOCK_BOOTTIME = 6, CLOCK_SEQUENCE = 64,
  SEQ_INCREMENTAL_STATE_CLEARED = 1, SEQ_NEEDS_INCREMENTAL_STATE = 2,
  /* TracePacketDefaults, TrackEventDefaults */
  TPD_TIMESTAMP_CLOCK_ID = 58, TPD_TRACK_EVENT_DEFAULTS = 11, TED_TRACK_UUID = 11,
  /* TrackEvent */
  TE_CATEGORY_IIDS = 3, TE_DEBUG_ANNOTATIONS = 4, TE_TYPE = 9, TE_NAME_IID = 10, TE_TRACK_UUID = 11, TE_NAME = 23,
  TE_COUNTER_VALUE = 30, TE_FLOW_IDS = 47, TE_TERMINATING_FLOW_IDS = 48,
  TYPE_SLICE_BEGIN = 1, TYPE_SLICE_END = 2, TYPE_INSTANT = 3, TYPE_COUNTER = 4,
  /* DebugAnnotation */
  DA_NAME_IID = 1, DA_UINT = 3, DA_STRING = 6, DA_NAME = 10, DA_STRING_IID = 17,
  /* InternedData and its entries (each {iid = 1, name or str = 2}) */
  ID_EVENT_CATEGORIES = 1, ID_EVENT_NAMES = 2, ID_ANNOTATION_NAMES = 3, ID_STRING_VALUES = 29,
  /* TrackDescriptor, ProcessDescriptor, ThreadDescriptor */
  TD_UUID = 1, TD_NAME = 2, TD_PROCESS = 3, TD_THREAD = 4, TD_PARENT_UUID = 5, TD_COUNTER = 8,
  PD_PID = 1, PD_PROCESS_NAME = 6, THD_PID = 1, THD_TID = 2, THD_THREAD_NAME = 5,
};

enum { UUID_PROCESS = 1, UUID_QUEUE = 2, UUID_WORKER = 16 };
enum { PID = 1 };

/* Debug annotation names, interned on every sequence at its start. */
enum { AN_TASK = 1, AN_STEP, AN_BUCKET, AN_ROW, AN_REQUEST, AN_LAUNCH, AN_WAIT_REASON, AN_WAIT_US,
       AN_QUEUED_NS, AN_EVENT_CLASS, AN_POS, AN_CACHED, AN_COUNT };
static const char *const annotation_names[AN_COUNT] = {
    [AN_TASK] = "task",         [AN_STEP] = "step",
    [AN_BUCKET] = "bucket",     [AN_ROW] = "row",           [AN_REQUEST] = "request",
    [AN_LAUNCH] = "launch",     [AN_WAIT_REASON] = "wait_reason", [AN_WAIT_US] = "wait_us",
    [AN_QUEUED_NS] = "queued_ns", [AN_EVENT_CLASS] = "event_class", [AN_POS] = "pos",
    [AN_CACHED] = "prompt_cached"};

/* Interned string values: the constants, then event classes, then requests. */
enum { SV_JIT = 1, SV_AOT, SV_DEPENDENCY, SV_NONE, SV_EV_CLASS0 = 16 };
static const char *const const_values[] = {[SV_JIT] = "jit", [SV_AOT] = "aot", [SV_DEPENDENCY] = "dependency",
                                           [SV_NONE] = "none"};
#define CAT_TASK 1

/* What one sequence has interned: classes and event classes by bitmap, request
 * strings ("slot 3 gen 7") in a small hash of (slot, gen) -> iid. */
struct seq {
  uint8_t *cls_seen, *evc_seen;
  uint64_t *req_key;   /* [req_cap], 0: empty; key = (slot + 1) << 32 | gen */
  uint32_t *req_iid;
  size_t req_cap, req_n;
  uint32_t next_iid;
  uint64_t last_ts;    /* the incremental clock: the last timestamp written on it */
};

static uint32_t req_find(struct seq *s, uint64_t key, int *fresh) {
  if (2 * (s->req_n + 1) > s->req_cap) {
    size_t cap = s->req_cap ? 2 * s->req_cap : 64;
    uint64_t *k = calloc(cap, sizeof *k);
    uint32_t *v = calloc(cap, sizeof *v);
    if (!k || !v) {
      free(k);
      free(v);
      return 0;
    }
    for (size_t i = 0; i < s->req_cap; i++) {
      if (!s->req_key[i]) continue;
      size_t h = (size_t)(s->req_key[i] * 0x9e3779b97f4a7c15ull >> 20) & (cap - 1);
      while (k[h]) h = (h + 1) & (cap - 1);
      k[h] = s->req_key[i];
      v[h] = s->req_iid[i];
    }
    free(s->req_key);
    free(s->req_iid);
    s->req_key = k;
    s->req_iid = v;
    s->req_cap = cap;
  }
  size_t h = (size_t)(key * 0x9e3779b97f4a7c15ull >> 20) & (s->req_cap - 1);
  while (s->req_key[h] && s->req_key[h] != key) h = (h + 1) & (s->req_cap - 1);
  *fresh = !s->req_key[h];
  if (*fresh) {
    s->req_key[h] = key;
    s->req_iid[h] = s->next_iid++;
    s->req_n++;
  }
  return s->req_iid[h];
}

static void interned_entry(struct pb *b, uint32_t field, uint64_t iid, const char *name) {
  pb_open(b, field);
  pb_uint(b, 1, iid);
  pb_str(b, 2, name);
  pb_close(b);
}

/* A packet on sequence seq (0-based) at ts; *clock is the sequence's
 * incremental clock, advanced when the packet can use it. */
static void packet_begin(struct pb *b, uint64_t ts, int seq, uint64_t *clock, uint32_t flags) {
  pb_open(b, TRACE_PACKET);
  if (clock && ts >= *clock) {
    pb_uint(b, TP_TIMESTAMP, ts - *clock);
    *clock = ts;
  } else {
    pb_uint(b, TP_TIMESTAMP, ts);
    pb_uint(b, TP_TIMESTAMP_CLOCK_ID, CLOCK_BOOTTIME);
  }
  pb_uint(b, TP_SEQUENCE_ID, (uint64_t)seq + 1);
  if (flags) pb_uint(b, TP_SEQUENCE_FLAGS, flags);
}

static void snapshot_clock(struct pb *b, uint32_t id, int incremental) {
  pb_open(b, CS_CLOCKS);
  pb_uint(b, CLK_ID, id);
  pb_uint(b, CLK_TIMESTAMP, 0);
  if (incremental) pb_uint(b, CLK_INCREMENTAL, 1);
  pb_close(b);
}

/* The first packet of sequence seq: state cleared, its incremental clock at 0
 * (BOOTTIME 0, the window's start), its default track, the names every
 * sequence uses. (A track descriptor needs a packet of its own: it and the
 * clock snapshot are members of one oneof.) */
static void sequence_open(struct pb *b, int seq, uint64_t track) {
  packet_begin(b, 0, seq, NULL, SEQ_INCREMENTAL_STATE_CLEARED);
  pb_uint(b, TP_FIRST_ON_SEQUENCE, 1);
  pb_open(b, TP_CLOCK_SNAPSHOT);
  snapshot_clock(b, CLOCK_BOOTTIME, 0);
  snapshot_clock(b, CLOCK_SEQUENCE, 1);
  pb_close(b);
  pb_open(b, TP_DEFAULTS);
  pb_uint(b, TPD_TIMESTAMP_CLOCK_ID, CLOCK_SEQUENCE);
  pb_open(b, TPD_TRACK_EVENT_DEFAULTS);
  pb_uint(b, TED_TRACK_UUID, track);
  pb_close(b);
  pb_close(b);
  pb_open(b, TP_INTERNED_DATA);
  interned_entry(b, ID_EVENT_CATEGORIES, CAT_TASK, "task");
  for (int a = 1; a < AN_COUNT; a++) interned_entry(b, ID_ANNOTATION_NAMES, (uint64_t)a, annotation_names[a]);
  for (int v = SV_JIT; v <= SV_NONE; v++) interned_entry(b, ID_STRING_VALUES, (uint64_t)v, const_values[v]);
  pb_close(b);
  pb_close(b);
}

/* The start of worker w's sequence, and the worker's thread track (the
 * sequence's default). */
static void worker_start(struct pb *b, int w, int rank_workers) {
  char name[48];
  if (rank_workers)  /* across ranks: rank after rank */
    snprintf(name, sizeof name, "rank %d worker %d", w / rank_workers, w % rank_workers);
  else
    snprintf(name, sizeof name, "worker %d", w);
  sequence_open(b, w, UUID_WORKER + (uint64_t)w);
  packet_begin(b, 0, w, NULL, 0);
  pb_open(b, TP_TRACK_DESCRIPTOR);
  pb_uint(b, TD_UUID, UUID_WORKER + (uint64_t)w);
  pb_uint(b, TD_PARENT_UUID, UUID_PROCESS);
  pb_open(b, TD_THREAD);
  pb_uint(b, THD_PID, PID);
  pb_uint(b, THD_TID, (uint64_t)w + 1);  /* tid 0 means the idle task to Perfetto */
  pb_str(b, THD_THREAD_NAME, name);
  pb_close(b);
  pb_close(b);
  pb_close(b);
}

/* The start of the counter samples' sequence (seq), the engine as a process
 * track and the queue-depth counter under it. */
static void process_tracks(struct pb *b, int seq) {
  sequence_open(b, seq, UUID_QUEUE);
  packet_begin(b, 0, seq, NULL, 0);
  pb_open(b, TP_TRACK_DESCRIPTOR);
  pb_uint(b, TD_UUID, UUID_PROCESS);
  pb_open(b, TD_PROCESS);
  pb_uint(b, PD_PID, PID);
  pb_str(b, PD_PROCESS_NAME, "megascope engine");
  pb_close(b);
  pb_close(b);
  pb_close(b);
  packet_begin(b, 0, seq, NULL, 0);
  pb_open(b, TP_TRACK_DESCRIPTOR);
  pb_uint(b, TD_UUID, UUID_QUEUE);
  pb_uint(b, TD_PARENT_UUID, UUID_PROCESS);
  pb_str(b, TD_NAME, "jit_queue_depth");
  pb_open(b, TD_COUNTER);
  pb_close(b);
  pb_close(b);
  pb_close(b);
}

static void annotation_uint(struct pb *b, uint32_t name, uint64_t v) {
  pb_open(b, TE_DEBUG_ANNOTATIONS);
  pb_uint(b, DA_NAME_IID, name);
  pb_uint(b, DA_UINT, v);
  pb_close(b);
}

static void annotation_iid(struct pb *b, uint32_t name, uint64_t iid) {
  pb_open(b, TE_DEBUG_ANNOTATIONS);
  pb_uint(b, DA_NAME_IID, name);
  pb_uint(b, DA_STRING_IID, iid);
  pb_close(b);
}

/* A task: its BEGIN packet (interning what this sequence has not seen, its
 * args, the flows it starts and the one it ends) and its END packet. */
static void slice(const struct ms_trace_view *v, size_t i, struct seq *s, uint64_t *clk, struct pb *b) {
  const struct ms_trace_event *x = &v->ev[i];
  int fresh_cls = !s->cls_seen[x->cls], fresh_evc = x->ev_class && !s->evc_seen[x->ev_class - 1], fresh_req = 0;
  uint32_t req = 0;
  char rq[48] = "";
  if (x->slot >= 0) {
    req = req_find(s, ((uint64_t)x->slot + 1) << 32 | x->req_gen, &fresh_req);
    snprintf(rq, sizeof rq, "slot %d gen %" PRIu32, x->slot, x->req_gen);
  }
  packet_begin(b, x->ts, x->worker, clk, SEQ_NEEDS_INCREMENTAL_STATE);
  if (fresh_cls || fresh_evc || fresh_req) {
    pb_open(b, TP_INTERNED_DATA);
    if (fresh_cls) interned_entry(b, ID_EVENT_NAMES, (uint64_t)x->cls + 1, v->classes[x->cls]);
    if (fresh_evc) interned_entry(b, ID_STRING_VALUES, SV_EV_CLASS0 + x->ev_class - 1u, v->ev_classes[x->ev_class - 1]);
    if (fresh_req) interned_entry(b, ID_STRING_VALUES, req, rq);
    pb_close(b);
    s->cls_seen[x->cls] = 1;
    if (x->ev_class) s->evc_seen[x->ev_class - 1] = 1;
  }
  pb_open(b, TP_TRACK_EVENT);
  pb_uint(b, TE_TYPE, TYPE_SLICE_BEGIN);
  pb_uint(b, TE_NAME_IID, (uint64_t)x->cls + 1);
  pb_uint(b, TE_CATEGORY_IIDS, CAT_TASK);
  annotation_uint(b, AN_TASK, x->task);
  annotation_uint(b, AN_STEP, x->step);
  annotation_uint(b, AN_BUCKET, 1u << x->bucket_log2);
  if (x->row >= 0) annotation_uint(b, AN_ROW, (uint64_t)x->row);
  if (req) annotation_iid(b, AN_REQUEST, req);
  if (req && x->pos >= 0) {
    annotation_uint(b, AN_POS, (uint64_t)x->pos);
    annotation_uint(b, AN_CACHED, x->cached);
  }
  annotation_iid(b, AN_LAUNCH, x->jit ? SV_JIT : SV_AOT);
  annotation_iid(b, AN_WAIT_REASON, x->waited ? SV_DEPENDENCY : SV_NONE);
  annotation_uint(b, AN_WAIT_US, x->wait_us);
  annotation_uint(b, AN_QUEUED_NS, x->queued_ns);
  if (x->ev_class) annotation_iid(b, AN_EVENT_CLASS, SV_EV_CLASS0 + x->ev_class - 1u);
  /* a flow's id is its consumer's event index + 1 */
  for (uint32_t k = 0; k < x->n_flows; k++) pb_fixed64(b, TE_FLOW_IDS, (uint64_t)v->flow_to[x->flows_first + k] + 1);
  if (x->flow_from != MS_TRACE_NONE) pb_fixed64(b, TE_TERMINATING_FLOW_IDS, (uint64_t)i + 1);
  pb_close(b);
  pb_close(b);
  packet_begin(b, x->ts + x->dur, x->worker, clk, SEQ_NEEDS_INCREMENTAL_STATE);
  pb_open(b, TP_TRACK_EVENT);
  pb_uint(b, TE_TYPE, TYPE_SLICE_END);
  pb_close(b);
  pb_close(b);
}

static void counter(const struct ms_trace_event *x, int seq, uint64_t *clk, struct pb *b) {
  packet_begin(b, x->ts, seq, clk, SEQ_NEEDS_INCREMENTAL_STATE);
  pb_open(b, TP_TRACK_EVENT);
  pb_uint(b, TE_TYPE, TYPE_COUNTER);  /* on the sequence's default track, the queue's */
  pb_uint(b, TE_COUNTER_VALUE, x->task);
  pb_close(b);
  pb_close(b);
}

static void annotation_named(struct pb *b, const char *name, uint64_t v) {
  pb_open(b, TE_DEBUG_ANNOTATIONS);
  pb_str(b, DA_NAME, name);
  pb_uint(b, DA_UINT, v);
  pb_close(b);
}

/* The closing packet: an instant on the process track at the window's end
 * saying what the file holds and what it lacks. */
static void summary(const struct ms_trace_view *v, const struct ms_trace_written *w, int seq, uint64_t *clk, struct pb *b) {
  packet_begin(b, v->window_ns, seq, clk, SEQ_NEEDS_INCREMENTAL_STATE);
  pb_open(b, TP_TRACK_EVENT);
  pb_uint(b, TE_TYPE, TYPE_INSTANT);
  pb_uint(b, TE_TRACK_UUID, UUID_PROCESS);
  pb_str(b, TE_NAME, "trace summary");
  annotation_named(b, "records", v->records);
  annotation_named(b, "dropped", v->buffer_dropped);
  annotation_named(b, "budget_dropped", w->budget_dropped);
  annotation_named(b, "outside_window", v->outside);
  annotation_named(b, "window_ns", v->window_ns);
  annotation_named(b, "kept_ns", w->kept_ns);
  pb_close(b);
  pb_close(b);
}

static void seqs_free(struct seq *s, int n) {
  for (int w = 0; s && w < n; w++) {
    free(s[w].cls_seen);
    free(s[w].evc_seen);
    free(s[w].req_key);
    free(s[w].req_iid);
  }
  free(s);
}

int tv_write_perfetto(const struct ms_trace_view *v, struct tv_out *o, struct ms_trace_written *w) {
  int n_cls = 0, n_seq = v->n_workers + 1, cseq = v->n_workers, rc = -ENOMEM;  /* cseq: the counters' */
  for (size_t i = 0; i < v->n; i++)
    if (v->ev[i].cls + 1 > n_cls) n_cls = v->ev[i].cls + 1;
  struct seq *s = calloc((size_t)n_seq, sizeof *s);
  struct pb b = {0};
  if (!s) goto out;
  for (int k = 0; k < n_seq; k++) {
    s[k].cls_seen = calloc((size_t)n_cls + 1, 1);
    s[k].evc_seen = calloc((size_t)v->n_ev_classes + 1, 1);
    s[k].next_iid = SV_EV_CLASS0 + (uint32_t)v->n_ev_classes;  /* after the constants and event classes */
    if (!s[k].cls_seen || !s[k].evc_seen) goto out;
  }
  process_tracks(&b, cseq);
  for (int k = 0; k < v->n_workers; k++) worker_start(&b, k, v->rank_workers);
  rc = b.err ? -ENOMEM : tv_put(o, b.p, b.n) ? -ENOSPC : 0;
  if (rc) goto out;
  size_t i = 0;
  for (; i < v->n; i++) {
    const struct ms_trace_event *x = &v->ev[i];
    int q = x->kind == MS_TRACE_COUNTER ? cseq : x->worker;
    uint64_t clk = s[q].last_ts;  /* advanced only if the event is written */
    b.n = 0;
    if (x->kind == MS_TRACE_COUNTER)
      counter(x, q, &clk, &b);
    else
      slice(v, i, &s[q], &clk, &b);
    if (b.err) {
      rc = -ENOMEM;
      goto out;
    }
    /* a refused slice may have interned names its sequence never got: nothing
     * more is written on any sequence after it, so nothing uses them */
    if (tv_put(o, b.p, b.n)) break;
    s[q].last_ts = clk;
    if (x->kind == MS_TRACE_COUNTER)
      w->counters++;
    else
      w->slices++, w->flows += x->flow_from != MS_TRACE_NONE;
  }
  w->budget_dropped = v->budget_dropped + (v->n - i);
  w->kept_ns = i < v->n ? v->ev[i].ts : v->cut_ns;
  b.n = 0;
  summary(v, w, cseq, &s[cseq].last_ts, &b);
  if (b.err) {
    rc = -ENOMEM;
    goto out;
  }
  tv_put_final(o, b.p, b.n);
out:
  free(b.p);
  seqs_free(s, n_seq);
  return rc;
}
