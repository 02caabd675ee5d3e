/* SPDX-License-Identifier: MIT */
/* Task bodies of the CPU backend: one call computes one task (one tile of one
 * operator) of a plan. They read the batch metadata the step start wrote and the
 * paged KV cache; they know nothing of threads, events or queues. */
#ifndef MS_KERNELS_OPS_H
#define MS_KERNELS_OPS_H

#include "kernels/quant.h"
#include "megascope/plan_ir.h"

/* The batch of one step, written by the step-start task. Rows at or past n_rows
 * are padding up to the bucket: they compute on zeros and touch no cache. */
struct ms_batch_meta {
  int n_rows;
  int *row_slot;        /* [max_rows] request slot of each row, -1: padding */
  int *row_pos;         /* [max_rows] position of the token fed this step */
  int *row_token;       /* [max_rows] the token fed this step */
  int32_t **row_pages;  /* [max_rows] the slot's page table */
  /* Chunked prefill: when some_head_skipped, lm_head computes only the rows
   * with row_head[r] set (a chunk's last row samples; the others feed the KV
   * cache alone). */
  const uint8_t *row_head;
  int some_head_skipped;
  /* [max_rows][2][head_dim]: each row's RoPE cos then sin at its position, for
   * the model's base (0) and its local layers' (1), written by the row's embed
   * task; NULL: each RoPE task computes its own. */
  float *row_rope;
  uint64_t step;        /* the engine's step: what the 8-bit inputs a worker holds are keyed on */
};

/* What a worker's 8-bit buffer holds: the input rows it quantized last, so the
 * next task of the same class in the same step (the next tile of that GEMV)
 * takes them as they are instead of quantizing the same input again. Only its
 * worker reads or writes an entry. */
struct ms_q8_held {
  const void *x;        /* the plan's context */
  const float *in;
  int ldin, nb, n, qk, cls;
  uint64_t step;
  int cls_now;          /* the class of the task the worker runs now */
  struct ms_q8_act act;
};

/* A worker's copy of the input rows of a class with a fused pre-norm
 * (ms_task_class.norm), normed: its first task of that class in a step norms
 * them, its next tasks of the class read them (the input is complete before
 * the class's first task). Only its worker reads or writes it. */
struct ms_normed {
  float *rows;          /* max_rows x dim (ms_exec_ctx) */
  const void *x;        /* what it holds: the plan's context, class and step */
  int cls;
  uint64_t step;
};

struct ms_exec_ctx {
  const struct ms_model *m;
  const struct ms_plan *plan;
  float *const *buf;               /* [n_bufs] activation storage, NULL when logical */
  int max_rows;                    /* rows allocated per buffer plane */
  const struct ms_weight *const (*cls_w)[3];  /* weights each task class reads */
  struct ms_batch_meta meta;
  void *k_pool, *v_pool;           /* (n_layers, pool_pages, page_size, n_kv*hd): f32, or f16 with kv_f16 */
  int kv_f16;                      /* the pools hold f16 (ms_engine_opts.kv_f16) */
  float *const *kv_stage;          /* kv_f16: [worker] a page's rows of one KV head in f32 (page_size x hd) */
  int page_size, pool_pages;
  float *const *scratch;           /* [worker] max_ctx floats a q head of one KV group (attention's scores) */
  /* 8-bit activations (the engine's q8_activations): for block-format
   * weights (ms_q8_handles) a GEMV task quantizes its input rows, q8_rows at a time, into its
   * worker's buffer (ms_q8_act_bytes(q8_cols, q8_rows) bytes, 32-byte aligned)
   * and takes integer dot products. NULL: f32 activations everywhere. */
  void *const *q8;                 /* [worker] */
  struct ms_q8_held *q8_held;      /* [worker] */
  int q8_rows, q8_cols;
  struct ms_normed *normed;        /* [worker]; NULL where no plan fuses a norm */
  /* Attention cut over positions (ms_task_class.parts): each part's partial
   * result, MS_ATTN_MAX_PARTS slots of ms_ops_attn_part_floats floats a row
   * and KV group, and a count of the parts done a row and KV group (the last
   * merges and puts it back to 0; atomics). NULL where no plan cuts it. */
  float *attn_part;                /* [max_rows * n_kv_heads * MS_ATTN_MAX_PARTS] slots */
  uint64_t *attn_done;             /* [max_rows * n_kv_heads] */
};

/* Resolves, for each class of `p`, the weight matrices its kernel reads. */
void ms_ops_bind_weights(const struct ms_plan *p, const struct ms_model *m,
                         const struct ms_weight *(*out)[3]);

/* The rows of the weights ms_ops_bind_weights binds to class k (w[0 .. 2])
 * that a task of k over output columns [c0, c1) reads: rows[i] = {r0, r1},
 * r0 == r1 when it reads none of w[i]. 0; or -1 for a class that reads its
 * weights other than by output column (the embedding by token, the norms
 * whole, the router and the experts by route): every row of them. */
int ms_ops_weight_rows(const struct ms_task_class *k, const struct ms_weight *const *w, int c0, int c1,
                       int rows[3][2]);

/* Floats of one worker's scratch (ms_exec_ctx.scratch): attention keeps a row
 * of max_ctx scores for each q head of a KV group. Whoever lays out an
 * execution context sizes it by this. */
size_t ms_ops_scratch_floats(const struct ms_model *m, int max_ctx);

/* Floats of one part's slot (ms_exec_ctx.attn_part): for each q head of a KV
 * group its maximum score, its sum of exponentials and its output row before
 * the division, rounded up to a cache line (parts run on different workers). */
size_t ms_ops_attn_part_floats(const struct ms_model *m);

/* Runs task `t` (math kernels; the step start and sampling belong to the runtime). */
void ms_ops_run(const struct ms_exec_ctx *x, int t, int worker);

static inline float *ms_buf_row(const struct ms_exec_ctx *x, int buf, int plane, int row) {
  const struct ms_buf_desc *d = &x->plan->bufs[buf];
  return x->buf[buf] + ((size_t)plane * (size_t)x->max_rows + (size_t)row) * (size_t)d->cols;
}

#endif
