/* SPDX-License-Identifier: MIT */
/* Built-in telemetry of an engine, independent of monitors: request latency
 * histograms (TTFT, TPOT), an always-on per-class aggregate of task time,
 * queueing and dependency wait, and an on-demand task trace for Perfetto.
 * Exporters (Prometheus, OTLP, Chrome JSON) read these. */
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
};
void ms_engine_latency(const struct ms_engine *e, struct ms_latency_stats *out);
/* A quantile (0..1) of a histogram, by linear interpolation inside the bucket. */
double ms_histogram_quantile(const struct ms_histogram *h, double q);

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
 * release to its successors' begin, and a counter track of JIT queue depth. */
int ms_engine_trace_write(const struct ms_engine *e, FILE *f);

#ifdef __cplusplus
}
#endif
#endif
