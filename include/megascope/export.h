/* SPDX-License-Identifier: MIT */
/* Exports of a running engine for standard tools: the Prometheus text format
 * (0.0.4) for /metrics, and OTLP/HTTP JSON request spans for OpenTelemetry
 * collectors, and the task trace's files (Chrome JSON, Perfetto's protobuf) from
 * the runtime's view of it (megascope/telemetry.h). (Monitors' maps are
 * megascope/attach.h's.) */
#ifndef MEGASCOPE_EXPORT_H
#define MEGASCOPE_EXPORT_H

#include <stdint.h>
#include <stdio.h>

#include "megascope/base.h"
#include "megascope/engine.h"
#include "megascope/telemetry.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- Prometheus text format 0.0.4 ---- */

#define MS_PROMETHEUS_CONTENT_TYPE "text/plain; version=0.0.4; charset=utf-8"

/* Writes the engine's families: TTFT and TPOT histograms, step, token, task and
 * request counters, per-class task time, queueing and dependency wait from the
 * always-on aggregate (label class), per-event-class dependency wait (label
 * event_class), and every attachment's coverage counters, one series per
 * generation it still holds (labels id, generation, monitor), so that each only
 * grows and a replace never shows new counts under old labels. Names start
 * "megascope_". */
int ms_prometheus_write_engine(struct ms_engine *e, FILE *f);
/* For other writers of the same page: a family's HELP and TYPE lines (help is
 * escaped), and a label value escaped (\\, \", \n) between quotes. */
void ms_prometheus_family(FILE *f, const char *name, const char *type, const char *help);
void ms_prometheus_label_value(FILE *f, const char *v);
/* A histogram family over ms_latency_bounds (HELP, TYPE, cumulative buckets, _sum, _count). */
struct ms_histogram;
void ms_prometheus_histogram(FILE *f, const char *name, const char *help, const struct ms_histogram *h);
/* The same over any n bounds: counts[i] observations <= bounds[i] (not
 * cumulative), counts[n] the rest; labels ("" or `k="v",...`, escaped by the
 * caller) go into every sample before le. */
void ms_prometheus_histogram_n(FILE *f, const char *name, const char *help, const char *labels,
                               const double *bounds, int n, const uint64_t *counts, double sum);
/* Copies a page (len bytes) to out with label="value" (value escaped) added
 * to every sample line that has no label of that name and whose metric name
 * begins with one of families (NULL-terminated; NULL: every sample): a
 * constant label (model_name) on the serving series. -EIO on a write error. */
int ms_prometheus_relabel(const char *page, size_t len, const char *label, const char *value,
                          const char *const *families, FILE *out);

/* ---- OTLP/HTTP JSON request spans ---- */

/* One finished (or failed) request, in the engine clock (ms_now_ns). */
struct ms_request_span {
  char request_id[48];       /* "cmpl-..." */
  const char *route;         /* "/v1/completions"; static storage */
  int n_prompt, n_tokens, max_tokens;
  int slot;                  /* batch slot it was decoded in; -1: not known */
  uint32_t generation;       /* the slot's request generation */
  const char *finish_reason; /* "length", "stop", "cancelled"; static storage */
  int error;                 /* the request failed */
  uint64_t t_submit, t_admit, t_first, t_done;   /* 0: did not happen */
  uint8_t trace_id[16], span_id[8];              /* zero: chosen at random */
  /* OpenTelemetry GenAI: gen_ai.operation.name ("chat", "text_completion"),
   * the model asked for and the one that answered (static or caller storage
   * copied by ms_otlp_add); the caller's span when the request carried a W3C
   * traceparent (trace_id then holds its trace). */
  char operation[24], request_model[128], response_model[128];
  uint8_t parent_span_id[8];
  int has_parent;
  int n_cached;              /* prompt tokens read from the prefix cache (gen_ai.usage.cache_read.input_tokens) */
};

/* Parses a W3C traceparent header ("00-<32 hex>-<16 hex>-<2 hex>") into the
 * span's trace_id and parent_span_id: 0, or -EINVAL (all-zero ids included). */
int ms_otlp_traceparent(const char *header, struct ms_request_span *s);

struct ms_otlp_opts {
  size_t sz;                 /* sizeof(struct ms_otlp_opts) */
  const char *url;           /* http://host:port/v1/traces */
  const char *service_name;  /* resource service.name; NULL: "megascope" */
  const char *model_name;    /* resource attribute; may be NULL */
  int flush_ms;              /* export at least this often while spans wait; 0: 1000 */
  int max_batch;             /* requests per POST; 0: 256 */
  int max_queue;             /* requests waiting; more are dropped and counted; 0: 8192 */
  int timeout_ms;            /* per POST; 0: 2000 */
};

struct ms_otlp;

/* Starts the exporter thread. Nothing is sent until spans arrive; a collector
 * that is down costs dropped batches (counted), never a blocked caller. */
struct ms_otlp *ms_otlp_new(const struct ms_otlp_opts *o, struct ms_textbuf *log);
/* Sends what is queued (one last try, bounded by timeout_ms), then stops. */
void ms_otlp_free(struct ms_otlp *x);
/* Queues a request's spans; never blocks on the network. -ENOSPC when the
 * queue is full (the span is counted as dropped). */
int ms_otlp_add(struct ms_otlp *x, const struct ms_request_span *s);

struct ms_otlp_stats {
  uint64_t queued, exported, dropped;   /* requests */
  uint64_t posts, failed_posts;
  long last_status;                     /* HTTP status of the last POST; 0: none or no answer */
};
void ms_otlp_get_stats(const struct ms_otlp *x, struct ms_otlp_stats *out);

/* Writes an ExportTraceServiceRequest for n requests: per request a SERVER span
 * "POST /v1/completions" from submit to done with events "admitted",
 * "first_token" and "finished", and child spans "queued" (submit -> admit),
 * "prefill" (admit -> first token) and "decode" (first token -> done).
 * unix_offset_ns converts the engine clock to Unix time. */
int ms_otlp_write_json(FILE *f, const char *service_name, const char *model_name, const struct ms_request_span *s,
                       int n, int64_t unix_offset_ns);

/* ---- the task trace's files ---- */

/* Trace file formats. */
enum ms_trace_format {
  MS_TRACE_JSON = 0,      /* Chrome JSON ("ts" in microseconds, printed exactly: 1234.567) */
  MS_TRACE_PERFETTO = 1,  /* Perfetto's protobuf (a Trace of TracePackets with TrackEvents, names interned) */
  MS_TRACE_FORMAT_COUNT
};
const char *ms_trace_format_name(enum ms_trace_format f);       /* "json", "perfetto" */
int ms_trace_format_parse(const char *s, enum ms_trace_format *out);  /* 0 or -EINVAL */

/* How to write a trace. Time is the recording window's, in integer nanoseconds
 * from the start: a task begun before the start or ended after the stop is
 * clipped to the window. Events (task slices and counter samples; a flow goes
 * with the slice it ends at) are written in time order, so a budget keeps the
 * window's first part whole and counts the rest as dropped. */
struct ms_trace_write_opts {
  size_t sz;                    /* sizeof(struct ms_trace_write_opts) */
  enum ms_trace_format format;
  uint64_t max_events;          /* 0: no limit */
  uint64_t max_bytes;           /* 0: no limit; else the file never exceeds it (at least 4096) */
};

/* What a write wrote. */
struct ms_trace_written {
  uint64_t slices, counters, flows;  /* events written */
  uint64_t budget_dropped;           /* events left out by max_events or max_bytes */
  uint64_t outside;                  /* records wholly outside the window (begun before it and ended before it, ...) */
  uint64_t buffer_dropped;           /* records the workers' buffers had no room for (ms_trace_stats.dropped) */
  uint64_t window_ns;                /* the recording window's length */
  uint64_t kept_ns;                  /* the part of it the file covers whole: window_ns unless a budget cut it */
  uint64_t bytes;
};
/* Writes the last trace (stopped). out may be NULL. -EBUSY while recording,
 * -EINVAL for bad options, -EIO when the file fails. */
int ms_engine_trace_save(const struct ms_engine *e, FILE *f, const struct ms_trace_write_opts *o,
                         struct ms_trace_written *out);
/* Writes the last trace (stopped) as Chrome JSON (the Trace Event Format that
 * Perfetto loads): one track per worker, a slice per task with its class, task
 * generation, request, step and wait reason in args, flow arrows from an event's
 * release to its successors' begin, and a counter track of JIT queue depth.
 * The same as ms_engine_trace_save with MS_TRACE_JSON and no budget. */
int ms_engine_trace_write(const struct ms_engine *e, FILE *f);

#ifdef __cplusplus
}
#endif
#endif
