/* SPDX-License-Identifier: MIT */
/* Building the device copy of a model and a compiled plan (private to src/cuda;
 * .cu files only, as dev.h).
 *
 * msd_upload lays everything out in two device allocations:
 *  - the weight arena: every matrix as bf16 (bf16 copied as is, f32 rounded to
 *    nearest even, f16 and the block formats decoded then rounded), norms and the
 *    router as f32; a layer's experts contiguous (msd_weight.plane_stride apart);
 *    each matrix 256-byte aligned and the arena padded, so 16-byte vector loads
 *    and widened L2 prefetches stay inside it. A weight read by several classes
 *    (tied embeddings) is uploaded once.
 *  - the state arena: struct msd_ctx itself, the task, class and event tables
 *    (tasks and events copied unchanged), the activation buffers of plan->bufs
 *    (cols * planes * batch floats each; logical buffers have none), the batch
 *    metadata, the page table, the KV pools, the attention scratch, sampled and,
 *    when asked, logits_out. Zeroed, except row_slot and the page table (-1).
 * The caller owns the batch metadata and the page table from then on: nothing
 * here writes them after the upload. */
#ifndef MS_CUDA_UPLOAD_H
#define MS_CUDA_UPLOAD_H

#include <stddef.h>

extern "C" {
#include "megascope/plan_ir.h"
#include "megascope/base.h"
#include "megascope/model.h"
}
#include "cuda/dev.h"

struct msd_upload_opts {
  int n_ctas;      /* CTAs that may run attention (scratch rows); >= 1 */
  int n_slots;     /* request slots of the page table; 0: the plan's batch */
  int max_ctx;     /* positions per request; >= 1 */
  int page_size;   /* positions per KV page; >= 1 */
  int pool_pages;  /* pages in each layer's pool; 0: n_slots * ceil(max_ctx / page_size) */
  int logits_out;  /* 1: allocate logits_out (batch * vocab floats) for the sample task */
};

struct msd_dev {
  struct msd_ctx h;               /* host copy of the context: device pointers */
  struct msd_ctx *d;              /* the device copy (in the state arena) */
  struct ms_event *events;        /* [n_events] device copy of plan->events */
  int n_events;
  float **bufs;                   /* host array [n_bufs]: each buffer's device pointer (NULL: logical) */
  size_t *buf_bytes;              /* host array [n_bufs]: bytes of each buffer (0: logical) */
  int n_slots;
  void *warena, *sarena;          /* the two device allocations */
  size_t weight_bytes;            /* weight arena */
  size_t total_bytes;             /* both arenas */
};

/* Uploads m (any weight dtype) and p (compiled for m). 0, or a negative error with
 * the failing step (and cudaGetErrorString) in log; nothing is left allocated on
 * failure. out is overwritten. */
int msd_upload(const struct ms_model *m, const struct ms_plan *p, const struct msd_upload_opts *o,
               struct msd_dev *out, struct ms_textbuf *log);

/* Frees what msd_upload allocated; a zeroed struct msd_dev is fine. */
void msd_release(struct msd_dev *d);

#endif
