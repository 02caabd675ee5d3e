/* SPDX-License-Identifier: MIT */
/* The device copy of a model and a plan: see upload.h for the layout. Host code
 * only; every CUDA call is checked and named in the log when it fails. */
#include "cuda/upload.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

extern "C" {
#include "kernels/ops.h"
}

#define ALIGN 256

/* One weight in the arena: a single matrix, or a layer's experts (planes). */
struct up_weight {
  const struct ms_weight *src;  /* the matrix, or expert 0 of `planes` */
  int planes, f32;
  size_t off, plane_bytes;
};

struct up {
  const struct ms_model *m;
  struct ms_textbuf *log;
  struct up_weight *w;
  int n, cap;
  size_t wsize;
};

static size_t align_up(size_t v) { return (v + ALIGN - 1) & ~(size_t)(ALIGN - 1); }

static int cuda_fail(struct ms_textbuf *log, const char *what, cudaError_t e) {
  ms_textbuf_printf(log, "cuda: %s: %s (%s)\n", what, cudaGetErrorString(e), cudaGetErrorName(e));
  return e == cudaErrorMemoryAllocation ? -ENOMEM : -EIO;
}

#define CK(call, what)                                   \
  do {                                                   \
    cudaError_t ck_e = (call);                           \
    if (ck_e != cudaSuccess) {                           \
      rc = cuda_fail(log, what, ck_e);                   \
      goto fail;                                         \
    }                                                    \
  } while (0)

/* The arena index of a weight (added on first use); -1 on bad shapes or no memory. */
static int weight_slot(struct up *u, const struct ms_weight *src, int planes, int f32, const char *cls) {
  for (int i = 0; i < u->n; i++)
    if (u->w[i].src->data == src->data && u->w[i].planes == planes && u->w[i].f32 == f32 &&
        u->w[i].src->rows == src->rows && u->w[i].src->cols == src->cols)
      return i;
  for (int e = 0; e < planes; e++)
    if (!src[e].data || src[e].rows != src[0].rows || src[e].cols != src[0].cols || src[e].rows < 1 ||
        src[e].cols < 1) {
      ms_textbuf_printf(u->log, "cuda: class %s: weight %d of %d has no data or another shape\n", cls, e,
                        planes);
      return -1;
    }
  if (u->n == u->cap) {
    int cap = u->cap ? 2 * u->cap : 64;
    struct up_weight *w = (struct up_weight *)realloc(u->w, (size_t)cap * sizeof *w);
    if (!w) {
      ms_textbuf_printf(u->log, "cuda: out of host memory\n");
      return -1;
    }
    u->w = w, u->cap = cap;
  }
  struct up_weight *w = &u->w[u->n];
  w->src = src, w->planes = planes, w->f32 = f32;
  w->plane_bytes = (size_t)src->rows * (size_t)src->cols * (f32 ? 4u : 2u);
  w->off = u->wsize;
  u->wsize = align_up(u->wsize + w->plane_bytes * (size_t)planes);
  return u->n++;
}

/* One plane converted into dst: bf16 (matrices) or f32 (norms, router). */
static void convert(const struct ms_weight *w, int f32, void *dst, float *tmp) {
  size_t rb = ms_weight_row_bytes(w);
  for (int r = 0; r < w->rows; r++) {
    if ((w->dtype == MS_DTYPE_BF16 && !f32) || (w->dtype == MS_DTYPE_F32 && f32)) {
      memcpy((char *)dst + (size_t)r * rb, (const char *)w->data + (size_t)r * rb, rb);
      continue;
    }
    ms_weight_row_f32(w, r, tmp);
    if (f32) {
      memcpy((float *)dst + (size_t)r * w->cols, tmp, sizeof(float) * (size_t)w->cols);
    } else {
      uint16_t *d = (uint16_t *)dst + (size_t)r * w->cols;
      for (int c = 0; c < w->cols; c++) d[c] = ms_f32_to_bf16(tmp[c]);
    }
  }
}

/* Device weights of each class, as ms_ops_bind_weights maps them (indices into
 * u->w in slot[c][i], -1: none); qkv's q/k/v biases (qwen2) in slot[c][3..5]. */
static int map_classes(struct up *u, const struct ms_plan *p, int (*slot)[6]) {
  const struct ms_model *m = u->m;
  const struct ms_weight *(*bw)[3] = (const struct ms_weight *(*)[3])calloc((size_t)p->n_classes, sizeof *bw);
  if (!bw) return -ENOMEM;
  ms_ops_bind_weights(p, m, bw);
  int rc = 0;
  for (int c = 0; c < p->n_classes && !rc; c++) {
    const struct ms_task_class *k = &p->classes[c];
    const struct ms_layer_weights *L = k->layer >= 0 ? &m->layers[k->layer] : NULL;
    int f32 = k->kernel == MS_K_RMSNORM || k->kernel == MS_K_ROPE || k->kernel == MS_K_ROUTER;
    for (int i = 0; i < 6; i++) slot[c][i] = -1;
    if (k->kernel == MS_K_EXPERT_UP || k->kernel == MS_K_EXPERT_DOWN) {
      const struct ms_weight *src[2] = {k->kernel == MS_K_EXPERT_UP ? L->exp_gate : L->exp_down,
                                        k->kernel == MS_K_EXPERT_UP ? L->exp_up : NULL};
      for (int i = 0; i < 2 && !rc; i++)
        if (src[i] && (slot[c][i] = weight_slot(u, src[i], m->cfg.n_experts, 0, k->name)) < 0) rc = -EINVAL;
      continue;
    }
    for (int i = 0; i < 3 && !rc; i++) {
      if (!bw[c][i] || (k->kernel == MS_K_ROPE && !m->cfg.qk_norm)) continue;
      if ((slot[c][i] = weight_slot(u, bw[c][i], 1, f32, k->name)) < 0) rc = -EINVAL;
    }
    const struct ms_weight *bias[3] = {L ? &L->bq : NULL, L ? &L->bk : NULL, L ? &L->bv : NULL};
    for (int i = 0; k->kernel == MS_K_QKV && m->cfg.qkv_bias && i < 3 && !rc; i++)
      if ((slot[c][3 + i] = weight_slot(u, bias[i], 1, 1, k->name)) < 0) rc = -EINVAL;
  }
  free(bw);
  return rc;
}

static int check_model(const struct ms_model *m, const struct ms_plan *p, const struct msd_upload_opts *o,
                       struct ms_textbuf *log) {
  const struct ms_model_config *c = &m->cfg;
  if (p->model != m && (p->model->cfg.dim != c->dim || p->model->cfg.n_layers != c->n_layers)) {
    ms_textbuf_printf(log, "cuda: the plan was compiled for another model\n");
    return -EINVAL;
  }
  if (c->n_kv_heads < 1 || c->n_heads % c->n_kv_heads || c->head_dim < 2 || c->head_dim % 2 ||
      c->head_dim > 1024) {
    ms_textbuf_printf(log, "cuda: heads %d/%d of %d: the device needs whole groups and an even head_dim <= 1024\n",
                      c->n_heads, c->n_kv_heads, c->head_dim);
    return -MS_E_UNSUPP;
  }
  if (c->ffn_act != MS_ACT_SILU && c->ffn_act != MS_ACT_GELU_TANH) {
    ms_textbuf_printf(log, "cuda: architecture %s: FFN activation %d is not on the device\n",
                      ms_arch_name((enum ms_arch)c->arch), (int)c->ffn_act);
    return -MS_E_UNSUPP;
  }
  if (c->n_experts && (c->n_experts > 256 || c->top_k < 1 || c->top_k > 32 || c->top_k > c->n_experts)) {
    ms_textbuf_printf(log, "cuda: %d experts, top %d: the device router takes up to 256 experts, top-k <= 32\n",
                      c->n_experts, c->top_k);
    return -MS_E_UNSUPP;
  }
  if (o->n_ctas < 1 || o->max_ctx < 1 || o->page_size < 1 || o->n_slots < 0 || o->pool_pages < 0) {
    ms_textbuf_printf(log, "cuda: upload options: n_ctas %d, max_ctx %d, page_size %d, n_slots %d, pool_pages %d\n",
                      o->n_ctas, o->max_ctx, o->page_size, o->n_slots, o->pool_pages);
    return -EINVAL;
  }
  return 0;
}

/* Converts and copies every weight into the arena. */
static int put_weights(struct up *u, char *arena, struct ms_textbuf *log) {
  size_t most = 0;
  int cols = 1, rc = 0;
  for (int i = 0; i < u->n; i++) {
    if (u->w[i].plane_bytes > most) most = u->w[i].plane_bytes;
    if (u->w[i].src->cols > cols) cols = u->w[i].src->cols;
  }
  void *stage = malloc(most ? most : 1);
  float *tmp = (float *)malloc(sizeof(float) * (size_t)cols);
  if (!stage || !tmp) {
    ms_textbuf_printf(log, "cuda: out of host memory (%zu bytes of staging)\n", most);
    rc = -ENOMEM;
    goto fail;
  }
  for (int i = 0; i < u->n; i++) {
    const struct up_weight *w = &u->w[i];
    for (int e = 0; e < w->planes; e++) {
      convert(&w->src[e], w->f32, stage, tmp);
      CK(cudaMemcpy(arena + w->off + (size_t)e * w->plane_bytes, stage, w->plane_bytes, cudaMemcpyHostToDevice),
         "cudaMemcpy(weights)");
    }
  }
fail:
  free(stage);
  free(tmp);
  return rc;
}

/* Offsets in the state arena. */
struct lay {
  size_t ctx, tasks, classes, events, bufp, bufc, meta, slot, pos, tok, pages, kp, vp, scratch, sampled, logits;
  size_t *buf;
  size_t total;
};

static size_t take(size_t *at, size_t bytes) {
  size_t o = *at;
  *at = align_up(o + bytes);
  return o;
}

int msd_upload(const struct ms_model *m, const struct ms_plan *p, const struct msd_upload_opts *o,
               struct msd_dev *out, struct ms_textbuf *log) {
  const struct ms_model_config *c = &m->cfg;
  struct up u = {m, log, NULL, 0, 0, 0};
  struct lay L = {};
  struct msd_class *cls = NULL;
  int (*slot)[6] = NULL;
  int rc = check_model(m, p, o, log);
  memset(out, 0, sizeof *out);
  if (rc) return rc;
  int B = p->batch, n_slots = o->n_slots ? o->n_slots : B;
  int max_pages = (o->max_ctx + o->page_size - 1) / o->page_size;
  int pool_pages = o->pool_pages ? o->pool_pages : n_slots * max_pages;
  size_t kvdim = (size_t)c->n_kv_heads * (size_t)c->head_dim;
  size_t pool = (size_t)c->n_layers * (size_t)pool_pages * (size_t)o->page_size * kvdim * sizeof(float);
  char *sa;

  /* weights */
  slot = (int(*)[6])calloc((size_t)p->n_classes, sizeof *slot);
  cls = (struct msd_class *)calloc((size_t)p->n_classes, sizeof *cls);
  out->bufs = (float **)calloc((size_t)p->n_bufs, sizeof *out->bufs);
  out->buf_bytes = (size_t *)calloc((size_t)p->n_bufs, sizeof *out->buf_bytes);
  L.buf = (size_t *)calloc((size_t)p->n_bufs, sizeof *L.buf);
  if (!slot || !cls || !out->bufs || !out->buf_bytes || !L.buf) {
    ms_textbuf_printf(log, "cuda: out of host memory\n");
    rc = -ENOMEM;
    goto fail;
  }
  if ((rc = map_classes(&u, p, slot))) goto fail;
  out->weight_bytes = u.wsize + ALIGN;  /* padded: widened prefetches stay inside */
  CK(cudaMalloc(&out->warena, out->weight_bytes), "cudaMalloc(weights)");
  CK(cudaMemset(out->warena, 0, out->weight_bytes), "cudaMemset(weights)");
  if ((rc = put_weights(&u, (char *)out->warena, log))) goto fail;

  /* state layout */
  {
    size_t at = 0;
    L.ctx = take(&at, sizeof(struct msd_ctx));
    L.tasks = take(&at, (size_t)p->n_tasks * sizeof(struct ms_task));
    L.classes = take(&at, (size_t)p->n_classes * sizeof(struct msd_class));
    L.events = take(&at, (size_t)p->n_events * sizeof(struct ms_event));
    L.bufp = take(&at, (size_t)p->n_bufs * sizeof(float *));
    L.bufc = take(&at, (size_t)p->n_bufs * sizeof(int32_t));
    for (int b = 0; b < p->n_bufs; b++) {
      const struct ms_buf_desc *d = &p->bufs[b];
      out->buf_bytes[b] = d->logical ? 0 : (size_t)d->cols * (size_t)d->planes * (size_t)B * sizeof(float);
      L.buf[b] = d->logical ? 0 : take(&at, out->buf_bytes[b]);
    }
    L.meta = take(&at, sizeof(int32_t));
    L.slot = take(&at, (size_t)B * sizeof(int32_t));
    L.pos = take(&at, (size_t)B * sizeof(int32_t));
    L.tok = take(&at, (size_t)B * sizeof(int32_t));
    L.pages = take(&at, (size_t)n_slots * (size_t)max_pages * sizeof(int32_t));
    L.kp = take(&at, pool);
    L.vp = take(&at, pool);
    L.scratch = take(&at, (size_t)o->n_ctas * (size_t)o->max_ctx * sizeof(float));
    L.sampled = take(&at, (size_t)B * sizeof(int32_t));
    L.logits = o->logits_out ? take(&at, (size_t)B * (size_t)c->vocab * sizeof(float)) : 0;
    L.total = at;
  }
  CK(cudaMalloc(&out->sarena, L.total), "cudaMalloc(state)");
  sa = (char *)out->sarena;
  CK(cudaMemset(sa, 0, L.total), "cudaMemset(state)");
  CK(cudaMemset(sa + L.slot, 0xff, (size_t)B * sizeof(int32_t)), "cudaMemset(row_slot)");
  CK(cudaMemset(sa + L.pages, 0xff, (size_t)n_slots * (size_t)max_pages * sizeof(int32_t)),
     "cudaMemset(page_table)");
  out->total_bytes = out->weight_bytes + L.total;

  /* the context */
  {
    struct msd_ctx *h = &out->h;
    h->cfg = (struct msd_cfg){c->arch, c->rope_style, c->n_layers, c->dim, c->ffn_dim, c->n_heads,
                              c->n_kv_heads, c->head_dim, c->vocab, c->n_experts, c->top_k,
                              c->expert_ffn_dim, c->rope_base, c->norm_eps, c->eos, c->qk_norm, *c};
    h->tasks = (const struct ms_task *)(sa + L.tasks);
    h->n_tasks = p->n_tasks;
    h->classes = (const struct msd_class *)(sa + L.classes);
    h->n_classes = p->n_classes;
    h->buf = (float *const *)(sa + L.bufp);
    h->buf_cols = (const int32_t *)(sa + L.bufc);
    h->n_bufs = p->n_bufs;
    h->max_rows = B;
    h->batch = B;
    h->n_rows = (int32_t *)(sa + L.meta);
    h->row_slot = (int32_t *)(sa + L.slot);
    h->row_pos = (int32_t *)(sa + L.pos);
    h->row_token = (int32_t *)(sa + L.tok);
    h->page_table = (int32_t *)(sa + L.pages);
    h->max_pages = max_pages;
    h->k_pool = (float *)(sa + L.kp);
    h->v_pool = (float *)(sa + L.vp);
    h->page_size = o->page_size;
    h->pool_pages = pool_pages;
    h->max_ctx = o->max_ctx;
    h->scratch = (float *)(sa + L.scratch);
    h->sampled = (int32_t *)(sa + L.sampled);
    h->logits_out = o->logits_out ? (float *)(sa + L.logits) : NULL;
    out->d = (struct msd_ctx *)(sa + L.ctx);
    out->events = (struct ms_event *)(sa + L.events);
    out->n_events = p->n_events;
    out->n_slots = n_slots;
  }
  for (int b = 0; b < p->n_bufs; b++) out->bufs[b] = p->bufs[b].logical ? NULL : (float *)(sa + L.buf[b]);
  for (int k = 0; k < p->n_classes; k++) {
    const struct ms_task_class *s = &p->classes[k];
    struct msd_class *d = &cls[k];
    *d = (struct msd_class){s->kernel, s->launch, s->layer, s->in, s->in2, s->aux, s->out, s->out2,
                            s->tile, s->n_out, s->n_tasks};
    for (int i = 0; i < 6; i++) {
      if (slot[k][i] < 0) continue;
      const struct up_weight *w = &u.w[slot[k][i]];
      (i < 3 ? d->w : d->bias)[i % 3] =
          (struct msd_weight){(const char *)out->warena + w->off, w->f32 ? MS_DTYPE_F32 : MS_DTYPE_BF16,
                              w->src->rows, w->src->cols,
                              w->planes > 1 ? (int64_t)w->src->rows * w->src->cols : 0};
    }
  }
  {
    int32_t *cols = (int32_t *)malloc((size_t)p->n_bufs * sizeof *cols + 1);
    if (!cols) {
      ms_textbuf_printf(log, "cuda: out of host memory\n");
      rc = -ENOMEM;
      goto fail;
    }
    for (int b = 0; b < p->n_bufs; b++) cols[b] = p->bufs[b].cols;
    cudaError_t e = cudaMemcpy(sa + L.bufc, cols, (size_t)p->n_bufs * sizeof *cols, cudaMemcpyHostToDevice);
    free(cols);
    CK(e, "cudaMemcpy(buf_cols)");
  }
  CK(cudaMemcpy(sa + L.bufp, out->bufs, (size_t)p->n_bufs * sizeof(float *), cudaMemcpyHostToDevice),
     "cudaMemcpy(buf)");
  CK(cudaMemcpy(sa + L.tasks, p->tasks, (size_t)p->n_tasks * sizeof(struct ms_task), cudaMemcpyHostToDevice),
     "cudaMemcpy(tasks)");
  CK(cudaMemcpy(sa + L.classes, cls, (size_t)p->n_classes * sizeof *cls, cudaMemcpyHostToDevice),
     "cudaMemcpy(classes)");
  CK(cudaMemcpy(sa + L.events, p->events, (size_t)p->n_events * sizeof(struct ms_event), cudaMemcpyHostToDevice),
     "cudaMemcpy(events)");
  CK(cudaMemcpy(out->d, &out->h, sizeof out->h, cudaMemcpyHostToDevice), "cudaMemcpy(ctx)");
  rc = 0;
  goto out;
fail:
  msd_release(out);
out:
  free(u.w);
  free(slot);
  free(cls);
  free(L.buf);
  return rc;
}

void msd_release(struct msd_dev *d) {
  if (!d) return;
  if (d->warena) cudaFree(d->warena);
  if (d->sarena) cudaFree(d->sarena);
  free(d->bufs);
  free(d->buf_bytes);
  memset(d, 0, sizeof *d);
}
