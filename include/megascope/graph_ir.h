/* SPDX-License-Identifier: MIT */
/* The graph's IR: the kernels, task classes and buffers one decode step's
 * graph is made of (src/graph builds them; the compiler copies them into the
 * plan, megascope/plan_ir.h, which every reader of a plan walks). The graph's
 * door, so that the graph, below the compiler, includes nothing of it. Plain
 * arrays, the layout of one build, not a stable ABI; enum ms_kernel alone is
 * append-only (the schema and the hook ABI's enum ms_op name kernels by these
 * numbers). */
#ifndef MEGASCOPE_GRAPH_IR_H
#define MEGASCOPE_GRAPH_IR_H

#include <stdint.h>

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
  uint8_t norm;          /* 1: a pre-norm fused in (ms_graph_tiling.fuse_norm): each task RMS-norms
                            the rows of `in` itself, with the layer's attn_norm (qkv), ffn_norm
                            (gate_up) or the model's out_norm (lm_head) */
  uint8_t parts;         /* attention: each row's KV group's positions in this many shares, a task
                            each (tile_x the share), each with its own softmax, the last to finish
                            merging them (ms_compile_opts.attn_parts); 0, 1: one task */
  int16_t layer;         /* -1 outside the blocks */
  const char *region_class;  /* how the output is tiled */
  const char *dep_class;     /* how the input is read */
  int16_t in, in2, aux, out, out2;  /* buffer ids, -1 when unused */
  int32_t tile;          /* output columns per task */
  int32_t n_out;         /* output columns in all */
  int32_t n_tasks;
};

#ifdef __cplusplus
}
#endif

#endif
