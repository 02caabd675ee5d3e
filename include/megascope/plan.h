/* SPDX-License-Identifier: MIT */
/* The plan: one decode step of a model, compiled into an SM-level task graph.
 *
 * Each operator's output is tiled into tasks sized for one worker; dependencies
 * come from intersecting the regions tasks write with the regions they read;
 * consumers with equal predecessor sets share one event (so producers releasing
 * equal successor sets trigger the same event); empty tasks are inserted so that
 * every task waits on at most one event and triggers at most one; tasks are then
 * ordered so that each event releases one contiguous range. One plan per batch
 * bucket. The schema (task classes, event classes) is written as versioned JSON. */
#ifndef MEGASCOPE_PLAN_H
#define MEGASCOPE_PLAN_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "megascope/base.h"
#include "megascope/model.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MS_SCHEMA_VERSION 1

/* ms_compile_opts.attn_parts at most */
#define MS_ATTN_MAX_PARTS 4

struct ms_plan;

struct ms_compile_opts {
  size_t sz;              /* sizeof(struct ms_compile_opts) */
  int batch;              /* rows of the bucket */
  int tile_bytes;         /* target weight bytes per GEMV task; 0: 64 KiB */
  int tile_rows;          /* fixed output rows per GEMV task (rounded to a head for
                             q/k/v); 0: derived from tile_bytes */
  int tiles_per_op;       /* about this many tasks per GEMV operator (e.g. one per SM);
                             overrides tile_bytes; 0: not used */
  int tp;                 /* tensor-parallel devices: >= 2 adds an all-gather of communication
                             tasks after every wo and down (docs/benchmark.md); 0, 1: none */
  int prefill;            /* rows are token rows of chunked prefill: a row's attention waits for
                             the KV of every row of its layer (a request's chunk is consecutive
                             rows at consecutive positions); 0: one row per request */
  int tp_split;           /* with tp >= 2: every device holds only its share of every split
                             output (tensor parallelism across processes), so an all-gather
                             follows every column-tiled operator, qkv, gate_up and lm_head too;
                             dense models only. 0: the devices share one memory (the simulator) */
  int min_tiles;          /* GEMV tasks an operator at least, where tile_bytes would cut fewer
                             (not with tile_rows or tiles_per_op); 0: eight */
  int fuse_norm;          /* 1: the RMS norms before qkv, a dense gate_up and the LM head are
                             computed inside those operators' tasks, each worker norming the
                             rows once per operator, instead of as a task of their own: two
                             fewer dependent phases a layer (one device: not with tp; not a
                             MoE FFN's). The class says so (ms_task_class.norm);
                             the CPU's kernels run it. 0: a norm task a row */
  int attn_parts;         /* a row's attention over one KV group cut into this many tasks (at
                             most MS_ATTN_MAX_PARTS), each over a share of the positions, the
                             last to finish merging their softmaxes (the class says so:
                             ms_task_class.parts); decode and prefill plans alike, one device or
                             tp, so a position's logits do not follow the plan that computed it.
                             The CPU's and the simulator's kernels run it. 0, 1: one task */
};

struct ms_plan_stats {
  int tasks;
  int events;
  int task_classes;
  int event_classes;
  int aot_tasks, jit_tasks, empty_tasks;
  int64_t pairwise_edges;  /* producer->consumer pairs from region intersection */
  int64_t reduced_edges;   /* after removing transitively implied pairs */
  int64_t fused_edges;     /* sum over events of triggers + successors */
  int max_event_triggers, max_event_successors;
  size_t metadata_bytes;   /* tasks + events + classes as the runtime holds them */
  double compile_ms;
};

/* Compiles one decode step of `m` for a batch bucket. NULL + errno on failure,
 * with the reason in `log` when given. */
struct ms_plan *ms_plan_compile(const struct ms_model *m, const struct ms_compile_opts *o,
                                struct ms_textbuf *log);
void ms_plan_free(struct ms_plan *p);

void ms_plan_get_stats(const struct ms_plan *p, struct ms_plan_stats *out);
int ms_plan_batch(const struct ms_plan *p);

/* "blk.3.qkv[tile 2]"-style name of task `t`. */
void ms_plan_task_name(const struct ms_plan *p, int t, char *buf, size_t n);

/* Checks the plan's structural promises (one wait, one trigger, contiguous
 * successor ranges, producers before consumers). 0 or -MS_E_FORMAT with the first
 * violation in log. */
int ms_plan_validate(const struct ms_plan *p, struct ms_textbuf *log);

/* Writes the task schema as JSON (schema_version MS_SCHEMA_VERSION). */
int ms_plan_write_schema(const struct ms_plan *p, FILE *f, int pretty);

/* What a program compiled against a schema's ids assumes of the engine it
 * attaches to: the digests of its class names by id (ms_schema_digest_add,
 * megascope/base.h), d[0] of the task classes, d[1] of the event classes. The
 * plan's here, and the same over the names a schema holds
 * (ms_query_schema_digest): a program bundle carries them (megascope/bpf.h)
 * and an engine refuses a monitor whose digests are not its plan's
 * (ms_engine_attach). */
void ms_plan_schema_digest(const struct ms_plan *p, uint64_t d[2]);

/* The smallest bucket (1, 2, 4, ...) that holds n rows. */
int ms_bucket_for(int n);

#ifdef __cplusplus
}
#endif
#endif
