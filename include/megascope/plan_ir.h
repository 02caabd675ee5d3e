/* SPDX-License-Identifier: MIT */
/* The plan's IR: the layout of a compiled plan (struct ms_plan behind the opaque
 * handle of megascope/plan.h) as its readers walk it. The compiler (src/compile)
 * writes it from the graph it lowers (src/graph, whose kernels, task classes
 * and buffers are megascope/graph_ir.h); the runtime, the CPU task bodies, the
 * hook tables, the benchmark and the CUDA backend read it, which is why it is a
 * public header, compile's door, and not a private one of src/compile: every
 * part that includes it lies above compile. Everything here is plain arrays
 * indexed by task, event or class: the runtime walks it without pointers to
 * chase. It is the layout of one build, not a stable ABI: no size or version
 * field. */
#ifndef MEGASCOPE_PLAN_IR_H
#define MEGASCOPE_PLAN_IR_H

#include <stdint.h>

#include "megascope/graph_ir.h"
#include "megascope/plan.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Tile coordinates: x the output column tile (attention: its part of the row's
 * positions, ms_task_class.parts), y the batch row (-1: all rows),
 * z the kv head or the expert (-1: none). */
struct ms_task {
  uint16_t cls;
  uint8_t kernel;
  uint8_t launch;
  int32_t wait;      /* event this task waits on, -1: none (the step start) */
  int32_t trigger;   /* event this task triggers, -1: none */
  int16_t tile[3];
};

struct ms_event {
  int32_t needed;    /* triggers per step */
  int32_t first, last;  /* successors: tasks [first, last]; last < first: none */
  uint16_t cls;      /* event class */
};

struct ms_plan {
  const struct ms_model *model;
  int batch;
  struct ms_task_class *classes;
  int n_classes;
  char (*ev_classes)[64];
  int n_ev_classes;
  struct ms_task *tasks;
  int n_tasks;
  int32_t *graph_index;      /* [n_tasks] the task's index in the graph, -1: empty task */
  struct ms_event *events;
  int n_events;
  int end_event;             /* triggered by every sink; releases the next step */
  int32_t *trig_off, *trig;  /* producers of event e: trig[trig_off[e] .. trig_off[e+1]) */
  struct ms_buf_desc *bufs;
  int n_bufs;
  int meta_buf;
  struct ms_plan_stats stats;
};

#ifdef __cplusplus
}
#endif

#endif
