/* SPDX-License-Identifier: MIT */
/* Built-in telemetry of an engine, independent of monitors: request latency
 * histograms (TTFT, TPOT), an always-on per-class aggregate of task time,
 * queueing and dependency wait, and an on-demand task trace for Perfetto.
 * Exporters (Prometheus, OTLP, Chrome JSON and Perfetto traces: src/export,
 * megascope/export.h) read these. */
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

/* The last trace (stopped) as its writers read it (the Chrome JSON and
 * Perfetto writers of src/export, ms_engine_trace_save): the recording
 * window's events resolved to plain data, clipped to the window and sorted by
 * time, with event classes from each task's own bucket's plan and each flow's
 * producer and consumers found. Plain arrays, the layout of one build, not a
 * stable ABI. */
#define MS_TRACE_NONE UINT32_MAX

enum { MS_TRACE_SLICE = 0, MS_TRACE_COUNTER = 1 };  /* ms_trace_event.kind */

/* One event of the window: a task slice or a JIT queue depth sample. */
struct ms_trace_event {
  uint64_t ts, dur;          /* ns from the window's start, clipped to it (dur 0 for a counter) */
  uint64_t step;
  uint64_t queued_ns;        /* ready -> begin */
  uint32_t task;             /* a counter: the queue depth */
  uint32_t req_gen, wait_us;
  int32_t row, slot;         /* slot -1: no request */
  int32_t pos;               /* a row task's position (-1: none) */
  uint32_t cached;           /* its request's prompt positions read from the prefix cache */
  uint16_t worker, cls;      /* cls indexes v.classes */
  uint16_t ev_class;         /* index into v.ev_classes + 1, from the task's own plan; 0: waited on no event */
  uint8_t kind, bucket_log2, jit, waited;
  uint32_t wait_ev, fired_ev; /* events of its own plan it waited on and completed (UINT32_MAX: none) */
  uint32_t seq;              /* its record's index in its worker's buffer (the sort's last key) */
  uint32_t flow_from;        /* the producer's event index, MS_TRACE_NONE: no flow ends here */
  uint32_t flows_first, n_flows;  /* the consumers this slice's trigger released: v.flow_to[first .. +n] */
};

struct ms_trace_view {
  struct ms_trace_event *ev; /* [n], sorted by (ts, worker, record) */
  size_t n;
  uint32_t *flow_to;         /* consumer event indices, grouped by producer */
  int n_workers;
  const char *const *classes;  /* class names by class id (the schema's) */
  const char **ev_classes;   /* distinct event-class names over every bucket's plan */
  int n_ev_classes;
  uint64_t window_ns;
  uint64_t cut_ns;           /* the first event max_events left out begins here (window_ns: none) */
  uint64_t records, buffer_dropped, outside, budget_dropped;
  /* across ranks (rank 0 of an engine served across ranks): the workers of
   * each rank, tracks rank after rank (0: one process), and the bound on the
   * error of the clocks' alignment (each rank's offset from rank 0's clock,
   * taken at the trace's start over its control message: half the round trip) */
  int rank_workers;
  uint64_t clock_err_ns;
};
/* Builds v from the last trace (stopped), its first max_events events (0: all;
 * the rest counted in budget_dropped). 0, -EBUSY while recording, -ENOMEM.
 * Free it with ms_trace_view_free (also after a failure). */
int ms_engine_trace_view(const struct ms_engine *e, uint64_t max_events, struct ms_trace_view *v);
void ms_trace_view_free(struct ms_trace_view *v);

#ifdef __cplusplus
}
#endif
#endif
