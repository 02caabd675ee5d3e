/* SPDX-License-Identifier: MIT */
/* The CUDA backend's device-side data (private to src/cuda). Everything here is
 * plain data that the host builds from a compiled plan and a model and copies to
 * the device once; the persistent kernel (megakernel.cu) and the per-op kernels
 * read it. Only .cu files include this header: the C core never sees CUDA.
 *
 * The plan's own task and event records (struct ms_task, struct ms_event from
 * megascope/plan_ir.h) are plain data and are copied to the device unchanged, so
 * a task index means the same task on both sides. */
#ifndef MS_CUDA_DEV_H
#define MS_CUDA_DEV_H

#include <stdint.h>

#include "core/event.h"  /* the event rule, the CPU engines' own */
#include "core/layer.h"  /* the layer rules, the CPU kernels' own */
#include "megascope/plan_ir.h"
#include "megascope/model.h"

#define MSD_THREADS 256               /* threads per CTA (8 warps) */
#define MSD_WARPS (MSD_THREADS / 32)

/* One weight matrix on the device: bf16 (matrices) or f32 (norms, router). */
struct msd_weight {
  const void *data;       /* device pointer, (rows, cols) row-major; NULL: none */
  int32_t dtype;          /* MS_DTYPE_BF16 or MS_DTYPE_F32 */
  int32_t rows, cols;
  int64_t plane_stride;   /* experts: elements between expert e and e+1; else 0 */
};

/* One task class as the device runs it (struct ms_task_class without names). */
struct msd_class {
  int32_t kernel, launch, layer;
  int32_t in, in2, aux, out, out2;   /* buffer ids, -1 when unused */
  int32_t tile, n_out, n_tasks;
  /* The weights of ms_ops_bind_weights' w[0..2]; for expert_up w[0] = gate and
   * w[1] = up over all experts (plane_stride apart), for expert_down w[0] = down. */
  struct msd_weight w[3];
  /* qkv with q/k/v biases (qwen2): the f32 biases of w[0..2], (1, rows) each */
  struct msd_weight bias[3];
};

struct msd_cfg {
  int32_t arch, rope_style;
  int32_t n_layers, dim, ffn_dim, n_heads, n_kv_heads, head_dim, vocab;
  int32_t n_experts, top_k, expert_ffn_dim;
  float rope_base, norm_eps;
  int32_t eos;              /* -1: none */
  int32_t qk_norm;          /* q/k RMSNorm before RoPE (qwen3, gemma3) */
  /* The whole configuration, for the layer rules core/layer.h compiles for
   * both sides (ms_layer_window, ms_layer_rope_base, ms_attn_scale) and the
   * architecture features: q/k/v biases, post-norms, GeGLU, scaled embeddings,
   * sliding windows, the logit cap. */
  struct ms_model_config mc;
};

/* One row of a fed step (the engine's CUDA backend; megakernel.cuh's
 * handover): its request slot (-1: padding), position, input token, the
 * slot's generation (hook contexts), the KV page holding the position, and how
 * the sample task draws its token: megascope/sample.h's parameters, seed and
 * draw number (the request's tokens so far), or MSD_ROW_HOST: the host draws
 * it (penalties, logit bias, logprobs or recorded logits need the logits). */
struct msd_feed_row {
  int32_t slot, pos, token, page;
  uint32_t gen;
  int32_t top_k;            /* <= 0: off */
  float temperature;        /* <= 0: greedy */
  float top_p, min_p;       /* top_p <= 0 or >= 1: off; min_p <= 0: off */
  uint32_t flags;           /* MSD_ROW_HOST */
  uint64_t seed, draw;
};
#define MSD_ROW_HOST 1u

/* What every task body reads: the plan's tables, activations, the batch of the
 * step in flight and the paged KV cache. All pointers are device pointers. */
struct msd_ctx {
  struct msd_cfg cfg;
  const struct ms_task *tasks;
  int32_t n_tasks;
  const struct msd_class *classes;
  int32_t n_classes;
  float *const *buf;           /* [n_bufs] activations (NULL for logical buffers) */
  const int32_t *buf_cols;     /* [n_bufs] floats per row */
  int32_t n_bufs;
  int32_t max_rows;            /* rows per buffer plane (= the plan's batch) */
  int32_t batch;               /* the plan's batch */
  /* The batch of the step in flight, written by the scheduler at step start
   * (before the step's first event is released) */
  int32_t *n_rows;             /* [1] rows in use; rows past it are padding */
  int32_t *row_slot;           /* [max_rows] request slot, -1: padding */
  int32_t *row_pos;            /* [max_rows] position of the token fed this step */
  int32_t *row_token;          /* [max_rows] the token fed this step */
  int32_t *page_table;         /* [n_slots * max_pages] page of each slot's page i */
  int32_t max_pages;
  /* KV cache, f32 like the CPU backend: (n_layers, pool_pages, page_size, n_kv*hd) */
  float *k_pool, *v_pool;
  int32_t page_size, pool_pages, max_ctx;
  float *scratch;              /* [n_ctas * max_ctx] attention scores, per CTA */
  int32_t *sampled;            /* [max_rows] the sample task's token; -1: the host's to draw (fed mode) */
  float *logits_out;           /* [max_rows * vocab] or NULL: sample copies the row's logits (fed
                                * mode: only the rows whose token is -1) */
  /* Fed mode: the rows as handed over, with their sampling; NULL: greedy, the
   * kernel's own requests (ms_cuda_start) */
  const struct msd_feed_row *feed_rows;  /* [max_rows] */
  float *samp_w;               /* [max_rows * vocab] the sampler's weights, a row's own */
};

static inline __device__ float *msd_buf_row(const struct msd_ctx *x, int buf, int plane, int row) {
  return x->buf[buf] + ((int64_t)plane * x->max_rows + row) * (int64_t)x->buf_cols[buf];
}

#endif
