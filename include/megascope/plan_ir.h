/* SPDX-License-Identifier: MIT */
/* The plan's IR: the layout of a compiled plan (struct ms_plan behind the opaque
 * handle of megascope/plan.h) as its readers walk it. The compiler (src/compile,
 * with the graph it lowers, src/graph) writes it; the runtime, the CPU task
 * bodies, the hook tables, the benchmark and the CUDA backend read it, which is
 * why it is a public header of its own and not a private one of src/compile.
 * Everything here is plain arrays indexed by task, event or class: the runtime
 * walks it without pointers to chase. It is the layout of one build, not a
 * stable ABI: no size or version field; enum ms_kernel alone is append-only
 * (the schema and the hook ABI's enum ms_op name kernels by these numbers). */
#ifndef MEGASCOPE_PLAN_IR_H
#define MEGASCOPE_PLAN_IR_H

#include <stdint.h>

#include "megascope/plan.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Task bodies. Append-only: the schema names kernels by these numbers. */
enum ms_kernel {
  MS_K_STEP_START = 0,
  MS_K_EMBED = 1,
  MS_K_RMSNORM = 2,
  MS_K_QKV = 3,
  MS_K_ROPE = 4,        /* q/k norm (qwen3), RoPE, KV-cache append */
  MS_K_ATTN = 5,        /* paged attention for one (row, kv head) */
  MS_K_WO = 6,          /* output projection + residual */
  MS_K_SWIGLU = 7,      /* gate and up projections, silu(g) * u */
  MS_K_DOWN = 8,        /* down projection + residual */
  MS_K_ROUTER = 9,      /* MoE router: top-k experts and weights per row */
  MS_K_EXPERT_UP = 10,  /* one expert's gate/up tile over the rows routed to it */
  MS_K_EXPERT_DOWN = 11,
  MS_K_MOE_COMBINE = 12, /* weighted sum of expert outputs + residual */
  MS_K_LM_HEAD = 13,
  MS_K_SAMPLE = 14,
  MS_K_EMPTY = 15,      /* inserted by normalisation: waits, then triggers */
  MS_K_COMM = 16,       /* tensor parallel: one device's share of an all-gather (fires the comm hook) */
  MS_K_COUNT
};

enum ms_launch {
  MS_LAUNCH_AOT = 0,   /* pre-placed on a worker queue, waits on its event there */
  MS_LAUNCH_JIT = 1,   /* dispatched when its event fires (work known only then) */
  MS_LAUNCH_COUNT
};

const char *ms_kernel_name(int k);

struct ms_buf_desc {
  char name[32];
  int32_t cols;     /* floats per row */
  int32_t planes;   /* experts for per-expert buffers, else 1 */
  uint8_t logical;  /* a name for dependencies only (KV cache, metadata): no storage */
};

struct ms_task_class {
  char name[48];         /* "blk.3.qkv" */
  char op[24];           /* "qkv": the layer-free name */
  uint8_t kernel;        /* enum ms_kernel */
  uint8_t launch;        /* enum ms_launch */
  int16_t layer;         /* -1 outside the blocks */
  const char *region_class;  /* how the output is tiled */
  const char *dep_class;     /* how the input is read */
  int16_t in, in2, aux, out, out2;  /* buffer ids, -1 when unused */
  int32_t tile;          /* output columns per task */
  int32_t n_out;         /* output columns in all */
  int32_t n_tasks;
};

/* Tile coordinates: x the output column tile, y the batch row (-1: all rows),
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
