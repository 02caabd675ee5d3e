/* SPDX-License-Identifier: MIT */
/* Built-in telemetry of an engine, independent of monitors: request latency
 * histograms (TTFT, TPOT), an always-on per-class aggregate of task time,
 * queueing and dependency wait, and an on-demand task trace for Perfetto.
 * Exporters (Prometheus, OTLP, Chrome JSON and Perfetto traces) read these. */
#ifndef MEGASCOPE_TELEMETRY_H
#define MEGASCOPE_TELEMETRY_H

#include <stdint.h>
#include <stdio.h>

#include "megascope/engine.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Latency histograms with fixed upper bounds (seconds), Prometheus-style:
 * counts[i] counts observations <= bounds[i] (not cumulative); counts[n_bounds]
 * the rest (+Inf). */
#define MS_LAT_BUCKETS 16
extern const double ms_latency_bounds[MS_LAT_BUCKETS];

struct ms_histogram {
  uint64_t counts[MS_LAT_BUCKETS + 1];
  uint64_t count;
  double sum;            /* seconds */
};

struct ms_latency_stats {
  struct ms_histogram ttft;   /* submit -> first token, per finished request */
  struct ms_histogram tpot;   /* (done - first token) / (tokens - 1), per request with >= 2 tokens */
  uint64_t requests_finished;
  uint64_t requests_cancelled;
  struct ms_histogram itl;    /* a request's token n >= 1 less its token n - 1, per token (inter-token latency) */
};
void ms_engine_latency(const struct ms_engine *e, struct ms_latency_stats *out);
/* Counts one observation of s seconds (the caller serialises its writers). */
void ms_histogram_observe(struct ms_histogram *h, double s);
/* A quantile (0..1) of a histogram, by linear interpolation inside the bucket. */
double ms_histogram_quantile(const struct ms_histogram *h, double q);
/* The TTFT (which 0) or TPOT (1), in seconds, of the last requests that
 * finished (at most MS_LAT_RECENT, oldest first), exact: the figures quantiles
 * are measured from, not bucket edges. Returns how many were written. */
#define MS_LAT_RECENT 4096
int ms_engine_latency_recent(const struct ms_engine *e, int which, double *out, int max);

/* The always-on aggregate: per task class, summed over workers. */
struct ms_class_stat {
  const char *name;       /* the class name in the schema ("blk.3.qkv"); valid while the engine lives */
  uint64_t tasks;         /* tasks run */
  uint64_t task_ns;       /* sum of task time (begin -> end) */
  uint64_t queue_ns;      /* sum of ready -> begin */
  uint64_t wait_ns;       /* sum of time workers waited for these tasks' events */
};
/* Fills up to max classes (in schema order); returns the number of classes. */
int ms_engine_class_stats(const struct ms_engine *e, struct ms_class_stat *out, int max);
/* The same per event class (name "attn->wo"): tasks and wait_ns of the tasks
 * that waited on an event of that class. */
int ms_engine_event_class_stats(const struct ms_engine *e, struct ms_class_stat *out, int max);

/* The task trace: while on, every worker records each task it runs (begin, end,
 * class, row, request, step, generation, the event it waited on and when that
 * fired) into its own bounded buffer; records that do not fit are counted as
 * dropped, never silently lost. */
int ms_engine_trace_start(struct ms_engine *e, uint32_t records_per_worker);
int ms_engine_trace_stop(struct ms_engine *e);
struct ms_trace_stats {
  uint64_t records, dropped;
  int active;
};
void ms_engine_trace_stats(const struct ms_engine *e, struct ms_trace_stats *out);
/* Writes the last trace (stopped) as Chrome JSON (the Trace Event Format that
 * Perfetto loads): one track per worker, a slice per task with its class, task
 * generation, request, step and wait reason in args, flow arrows from an event's
 * release to its successors' begin, and a counter track of JIT queue depth.
 * The same as ms_engine_trace_save with MS_TRACE_JSON and no budget. */
int ms_engine_trace_write(const struct ms_engine *e, FILE *f);

/* One task record of the last trace as a reader sees it (the benchmark's
 * observers): times on the engine's clock, not clipped to the window. */
struct ms_trace_task {
  int worker;
  int bucket;                 /* the rows of the plan that ran it (ms_engine_plan) */
  uint32_t task;              /* of that plan */
  int32_t slot;               /* -1: no request */
  int fired;                  /* its trigger completed its event */
  uint64_t step, t_begin, t_end, t_ready;
};
/* fn for every task record of the last trace (stopped), each worker's in the
 * order it wrote them; fn returns nonzero to stop. -EBUSY while recording;
 * otherwise the records visited. */
long ms_engine_trace_tasks(const struct ms_engine *e, int (*fn)(void *user, const struct ms_trace_task *r),
                           void *user);

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

#ifdef __cplusplus
}
#endif
#endif
