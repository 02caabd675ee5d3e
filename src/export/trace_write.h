/* SPDX-License-Identifier: MIT */
/* The task trace's writers (private): the Chrome JSON writer (trace_json.c)
 * and the Perfetto writer (trace_perfetto.c) over the runtime's view of a
 * stopped recording (struct ms_trace_view, megascope/telemetry.h), each
 * under a byte budget. */
#ifndef MS_EXPORT_TRACE_WRITE_H
#define MS_EXPORT_TRACE_WRITE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "megascope/export.h"
#include "megascope/telemetry.h"

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
/* Writes n bytes unless they would break the budget; 0 written, 1 refused.
 * Inline here, both writers' one sink, so neither writer calls into the other. */
static inline int tv_put(struct tv_out *o, const void *p, size_t n) {
  if (o->full) return 1;
  if (o->max_bytes && o->bytes + n + o->reserve > o->max_bytes) {
    o->full = 1;
    return 1;
  }
  if (n && fwrite(p, 1, n, o->f) != n) o->err = 1;
  o->bytes += n;
  return 0;
}

/* The closing part: written from the reserve. */
static inline void tv_put_final(struct tv_out *o, const void *p, size_t n) {
  if (n && fwrite(p, 1, n, o->f) != n) o->err = 1;
  o->bytes += n;
}

/* The writers: each writes the view's events in order until the budget says
 * no, and counts what it wrote (w->slices, counters, flows) and what it did not
 * (w->budget_dropped, w->kept_ns). */
int tv_write_json(const struct ms_trace_view *v, struct tv_out *o, struct ms_trace_written *w);
int tv_write_perfetto(const struct ms_trace_view *v, struct tv_out *o, struct ms_trace_written *w);

#endif
