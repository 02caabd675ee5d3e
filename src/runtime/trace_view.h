/* SPDX-License-Identifier: MIT */
/* The task trace as its writers see it (private): the recording window's
 * events resolved to plain data, clipped to the window and sorted by time, with
 * each flow's producer and consumers found. trace_view.c builds it from the
 * workers' buffers; the Chrome JSON writer (trace_view.c) and the Perfetto
 * writer (src/runtime/trace_perfetto.c) only read it. */
#ifndef MEGASCOPE_TRACE_VIEW_H
#define MEGASCOPE_TRACE_VIEW_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "megascope/telemetry.h"

#define TV_NONE UINT32_MAX

enum { TV_SLICE = 0, TV_COUNTER = 1 };

/* One event of the window: a task slice or a JIT queue depth sample. */
struct tv_event {
  uint64_t ts, dur;          /* ns from the window's start, clipped to it (dur 0 for a counter) */
  uint64_t step;
  uint64_t queued_ns;        /* ready -> begin */
  uint32_t task;             /* a counter: the queue depth */
  uint32_t req_gen, wait_us;
  int32_t row, slot;         /* slot -1: no request */
  int32_t pos;               /* a row task's position (-1: none) */
  uint32_t cached;           /* its request's prompt positions read from the prefix cache */
  uint16_t worker, cls;      /* cls indexes tv.classes */
  uint16_t ev_class;         /* index into tv.ev_classes + 1, from the task's own plan; 0: waited on no event */
  uint8_t kind, bucket_log2, jit, waited;
  uint32_t wait_ev, fired_ev; /* events of its own plan it waited on and completed (MS_HOOK_NONE32: none) */
  uint32_t seq;              /* its record's index in its worker's buffer (the sort's last key) */
  uint32_t flow_from;        /* the producer's event index, TV_NONE: no flow ends here */
  uint32_t flows_first, n_flows;  /* the consumers this slice's trigger released: tv.flow_to[first .. +n] */
};

struct tv {
  struct tv_event *ev;       /* [n], sorted by (ts, worker, record) */
  size_t n;
  uint32_t *flow_to;         /* consumer event indices, grouped by producer */
  int n_workers;
  const char *const *classes;  /* class names by class id (the schema's) */
  const char **ev_classes;   /* distinct event-class names over every bucket's plan */
  int n_ev_classes;
  uint64_t window_ns;
  uint64_t cut_ns;           /* the first event max_events left out begins here (window_ns: none) */
  uint64_t records, buffer_dropped, outside, budget_dropped;
};

/* Where a writer's bytes go: each event is formatted whole into buf first, so a
 * byte budget can refuse it before anything of it is written. */
struct tv_out {
  FILE *f;
  uint64_t bytes;            /* written so far */
  uint64_t max_bytes;        /* 0: no limit */
  uint64_t reserve;          /* kept free for the writer's closing part */
  int full;                  /* an event did not fit: nothing more is written */
  int err;
};
/* Writes n bytes unless they would break the budget; 0 written, 1 refused. */
int tv_put(struct tv_out *o, const void *p, size_t n);
/* The closing part: written from the reserve. */
void tv_put_final(struct tv_out *o, const void *p, size_t n);

/* The writers: each writes the view's events in order until the budget says
 * no, and counts what it wrote (w->slices, counters, flows) and what it did not
 * (w->budget_dropped, w->kept_ns). */
int tv_write_json(const struct tv *v, struct tv_out *o, struct ms_trace_written *w);
int tv_write_perfetto(const struct tv *v, struct tv_out *o, struct ms_trace_written *w);

/* telemetry.c: records of worker w in the current session (0 when it has not seen it). */
uint32_t ms_tel_published(const struct ms_engine *e, int w);

#endif
