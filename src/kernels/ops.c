/* SPDX-License-Identifier: MIT */
/* CPU task bodies. Each output element is computed by exactly one task, in an
 * order that depends only on the plan, so results are bit-identical whatever the
 * worker count, placement or interleaving. */
#include "kernels/ops.h"

#include <math.h>
#include <string.h>

#include "core/atomics.h"
#include "core/layer.h"
#include "kernels/vec.h"

size_t ms_ops_scratch_floats(const struct ms_model *m, int max_ctx) {
  const struct ms_model_config *c = &m->cfg;
  size_t group = (size_t)(c->n_kv_heads > 0 && c->n_heads > c->n_kv_heads ? c->n_heads / c->n_kv_heads : 1);
  return (size_t)(max_ctx > 0 ? max_ctx : 1) * group;
}

void ms_ops_bind_weights(const struct ms_plan *p, const struct ms_model *m,
                         const struct ms_weight *(*out)[3]) {
  for (int c = 0; c < p->n_classes; c++) {
    const struct ms_task_class *k = &p->classes[c];
    const struct ms_layer_weights *L = k->layer >= 0 ? &m->layers[k->layer] : NULL;
    const struct ms_weight **w = out[c];
    w[0] = w[1] = w[2] = NULL;
    switch (k->kernel) {
    case MS_K_EMBED: w[0] = &m->tok_embd; break;
    case MS_K_RMSNORM:
      w[0] = !L                                 ? &m->out_norm
             : !strcmp(k->op, "attn_norm")      ? &L->attn_norm
             : !strcmp(k->op, "attn_post_norm") ? &L->attn_post_norm
             : !strcmp(k->op, "ffn_post_norm")  ? &L->ffn_post_norm
                                                : &L->ffn_norm;
      break;
    case MS_K_QKV: w[0] = &L->wq; w[1] = &L->wk; w[2] = &L->wv; break;
    case MS_K_ROPE: w[0] = &L->q_norm; w[1] = &L->k_norm; break;
    case MS_K_WO: w[0] = &L->wo; break;
    case MS_K_SWIGLU: w[0] = &L->w_gate; w[1] = &L->w_up; break;
    case MS_K_DOWN: w[0] = &L->w_down; break;
    case MS_K_ROUTER: w[0] = &L->router; break;
    case MS_K_LM_HEAD: w[0] = &m->lm_head; break;
    default: break;
    }
  }
}

/* As the kernels below read them: q | k | v concatenated (qkv), a column a
 * row of both the gate and the up matrix (swiglu), a column a row (wo, down,
 * the LM head). */
int ms_ops_weight_rows(const struct ms_task_class *k, const struct ms_weight *const *w, int c0, int c1,
                       int rows[3][2]) {
  for (int i = 0; i < 3; i++) rows[i][0] = rows[i][1] = 0;
  switch (k->kernel) {
  case MS_K_QKV:
    for (int i = 0, base = 0; i < 3; base += w[i]->rows, i++) {
      int lo = c0 > base ? c0 : base, hi = c1 < base + w[i]->rows ? c1 : base + w[i]->rows;
      if (lo < hi) rows[i][0] = lo - base, rows[i][1] = hi - base;
    }
    return 0;
  case MS_K_SWIGLU:
    rows[0][0] = rows[1][0] = c0, rows[0][1] = rows[1][1] = c1;
    return 0;
  case MS_K_WO:
  case MS_K_DOWN:
  case MS_K_LM_HEAD:
    rows[0][0] = c0, rows[0][1] = c1;
    return 0;
  default:
    return -1;
  }
}

static int row_valid(const struct ms_exec_ctx *x, int r) {
  return r < x->meta.n_rows && x->meta.row_slot[r] >= 0;
}

/* ---- 8-bit activations (x->q8 set; see ops.h) ---- */

static int q8_on(const struct ms_exec_ctx *x, const struct ms_weight *w) {
  return x->q8 && ms_q8_handles(w->dtype);
}

/* Input rows [0, nb) of `in` (nb <= q8_rows) quantized into the worker's
 * buffer, unless it already holds them: the same rows of the same class's
 * input in the same step (a class's input is complete before its first task
 * and not written again in that step), as its previous tile left them. */
static void q8_load(const struct ms_exec_ctx *x, int worker, const float *in, int ldin, int nb, int n, int qk,
                    struct ms_q8_act *a) {
  MS_ASSERT(nb <= x->q8_rows && n <= x->q8_cols);
  struct ms_q8_held *h = x->q8_held ? &x->q8_held[worker] : NULL;
  if (h && h->x == x && h->in == in && h->ldin == ldin && h->nb == nb && h->n == n && h->qk == qk &&
      h->cls == h->cls_now && h->step == x->meta.step) {
    *a = h->act;
    return;
  }
  ms_vec_q8_quantize(a, x->q8[worker], in, ldin, nb, n, qk);
  if (h)
    *h = (struct ms_q8_held){.x = x, .in = in, .ldin = ldin, .nb = nb, .n = n, .qk = qk, .cls = h->cls_now,
                             .step = x->meta.step, .cls_now = h->cls_now, .act = *a};
}

/* One chunk of input rows: the integer GEMV over `a` when the weight takes
 * 8-bit activations, else the f32 one over `in`. */
static void gemv_chunk(const struct ms_exec_ctx *x, int worker, const struct ms_weight *w, int r0, int r1,
                       struct ms_q8_act *a, const float *in, int ldin, int nb, float *y, int ldy) {
  if (q8_on(x, w)) {
    int qk = ms_q8_qk(w->dtype);  /* matrices of one task quantized for another block size: again for this one */
    if (a->qk != qk) q8_load(x, worker, in, ldin, nb, w->cols, qk, a);
    ms_vec_q8_gemv(w, r0, r1, a, y, ldy);
  } else
    ms_vec_gemv(w, r0, r1, in, ldin, nb, y, ldy);
}

/* ms_vec_gemv, or, for a weight that takes 8-bit activations, the input
 * quantized q8_rows rows at a time and the integer GEMV. */
static void gemv(const struct ms_exec_ctx *x, int worker, const struct ms_weight *w, int r0, int r1,
                 const float *in, int ldin, int nb, float *y, int ldy) {
  if (!q8_on(x, w)) {
    ms_vec_gemv(w, r0, r1, in, ldin, nb, y, ldy);
    return;
  }
  for (int b0 = 0; b0 < nb; b0 += x->q8_rows) {
    struct ms_q8_act a;
    q8_load(x, worker, in + (size_t)b0 * ldin, ldin, nb - b0 < x->q8_rows ? nb - b0 : x->q8_rows, w->cols,
            ms_q8_qk(w->dtype), &a);
    ms_vec_q8_gemv(w, r0, r1, &a, y + (size_t)b0 * ldy, ldy);
  }
}

/* The rotation at one position: each pair's cos and sin, the same float
 * operations as one head at a time. */
#define ROPE_MAX_PAIRS (MS_MAX_HEAD_DIM / 2)
static void rope_angles(float *cs, float *sn, int hd, int pos, float base) {
  for (int i = 0; i < hd / 2; i++) {
    float theta = (float)pos * powf(base, -2.0f * (float)i / (float)hd);
    cs[i] = cosf(theta), sn[i] = sinf(theta);
  }
}

/* Row r's rotations for every RoPE task of the step, once, by its embed task
 * (each RoPE task computed its own before: the same powf, cosf and sinf calls
 * for every layer and KV head; SmolLM2 at batch 8, a RoPE task 1260 ns on
 * average before, 1010 after). */
static void row_rotations(const struct ms_exec_ctx *x, int r) {
  const struct ms_model_config *c = &x->m->cfg;
  int hd = c->head_dim;
  float *a = x->meta.row_rope + (size_t)r * 2 * (size_t)hd;
  rope_angles(a, a + hd / 2, hd, x->meta.row_pos[r], c->rope_base);
  if (c->rope_base_local > 0) rope_angles(a + hd, a + hd + hd / 2, hd, x->meta.row_pos[r], c->rope_base_local);
}

static void embed(const struct ms_exec_ctx *x, const struct ms_task_class *k, const struct ms_task *t) {
  int r = t->tile[1], dim = x->m->cfg.dim;
  float *out = ms_buf_row(x, k->out, 0, r);
  if (!row_valid(x, r)) {
    memset(out, 0, sizeof(float) * (size_t)dim);
    return;
  }
  const struct ms_weight *e = &x->m->tok_embd;
  int tok = x->meta.row_token[r];
  float scale = x->m->cfg.embed_scale;
  ms_weight_row_f32(e, tok, out);  /* a row decoded by blocks (per element: 13 us of a SmolLM2 step) */
  if (scale > 0)
    for (int i = 0; i < dim; i++) out[i] *= scale;
  if (x->meta.row_rope) row_rotations(x, r);
}

/* out = rmsnorm(in) * w, plus the residual in2 when the class has one (a post-norm) */
static void rmsnorm_row(const struct ms_exec_ctx *x, const struct ms_task_class *k,
                        const struct ms_task *t, const struct ms_weight *w) {
  int r = t->tile[1], n = x->plan->bufs[k->out].cols;
  float *out = ms_buf_row(x, k->out, 0, r);
  ms_vec_rmsnorm(out, ms_buf_row(x, k->in, 0, r), w->data, n, x->m->cfg.norm_eps);
  if (k->in2 < 0) return;
  const float *res = ms_buf_row(x, k->in2, 0, r);
  for (int i = 0; i < n; i++) out[i] += res[i];
}

/* The weight of a class's fused pre-norm (ms_task_class.norm). */
static const struct ms_weight *fused_norm_weight(const struct ms_exec_ctx *x, const struct ms_task_class *k) {
  if (k->layer < 0) return &x->m->out_norm;
  const struct ms_layer_weights *L = &x->m->layers[k->layer];
  return k->kernel == MS_K_QKV ? &L->attn_norm : &L->ffn_norm;
}

/* Row 0 of the input of task t's class as its kernel reads it (*ldin floats
 * a row): the buffer itself, or, with a fused pre-norm, the worker's normed
 * copy of its rows, normed by the worker's first task of the class in this
 * step as rmsnorm_row would (the same bits). */
static const float *task_in(const struct ms_exec_ctx *x, const struct ms_task_class *k, const struct ms_task *t,
                            int worker, int *ldin) {
  const float *in = ms_buf_row(x, k->in, 0, 0);
  *ldin = x->plan->bufs[k->in].cols;
  if (!k->norm) return in;
  struct ms_normed *h = &x->normed[worker];
  int B = x->plan->batch, n = *ldin;
  MS_ASSERT(x->normed && B <= x->max_rows);
  if (h->x != x || h->cls != t->cls || h->step != x->meta.step) {
    const float *w = fused_norm_weight(x, k)->data;
    for (int r = 0; r < B; r++)
      ms_vec_rmsnorm(h->rows + (size_t)r * n, in + (size_t)r * n, w, n, x->m->cfg.norm_eps);
    *h = (struct ms_normed){.rows = h->rows, .x = x, .cls = t->cls, .step = x->meta.step};
  }
  return h->rows;
}

/* Adds the q | k | v biases (qwen2) to output columns [c0, c1) of every row of the batch. */
static void qkv_bias(const struct ms_exec_ctx *x, const struct ms_task_class *k, int c0, int c1) {
  const struct ms_layer_weights *L = &x->m->layers[k->layer];
  const struct ms_weight *bias[3] = {&L->bq, &L->bk, &L->bv};
  int ld = x->plan->bufs[k->out].cols, B = x->plan->batch, base = 0;
  float *out = ms_buf_row(x, k->out, 0, 0);
  for (int m = 0; m < 3; m++) {
    const float *bv = bias[m]->data;
    int n = bias[m]->cols;
    int lo = c0 > base ? c0 : base, hi = c1 < base + n ? c1 : base + n;
    for (int b = 0; b < B; b++)
      for (int i = lo; i < hi; i++) out[(size_t)b * ld + i] += bv[i - base];
    base += n;
  }
}

/* qkv with 8-bit activations: the input quantized once per chunk of rows for all three matrices. */
static void qkv_q8(const struct ms_exec_ctx *x, const struct ms_task_class *k, const struct ms_task *t,
                   const struct ms_weight *const *w, int worker) {
  int c0 = t->tile[0] * k->tile, c1 = c0 + k->tile < k->n_out ? c0 + k->tile : k->n_out;
  int ld = x->plan->bufs[k->out].cols, ldin, B = x->plan->batch;
  const float *in0 = task_in(x, k, t, worker, &ldin);
  for (int b0 = 0; b0 < B; b0 += x->q8_rows) {
    int nb = B - b0 < x->q8_rows ? B - b0 : x->q8_rows, base = 0;
    const float *in = in0 + (size_t)b0 * ldin;
    float *out = ms_buf_row(x, k->out, 0, b0);
    struct ms_q8_act a;
    q8_load(x, worker, in, ldin, nb, w[0]->cols, ms_q8_qk(w[0]->dtype), &a);
    for (int m = 0; m < 3; m++) {
      int lo = c0 > base ? c0 : base, hi = c1 < base + w[m]->rows ? c1 : base + w[m]->rows;
      if (lo < hi) gemv_chunk(x, worker, w[m], lo - base, hi - base, &a, in, ldin, nb, out + lo, ld);
      base += w[m]->rows;
    }
  }
}

/* Output columns [c0, c1) of the concatenated (q | k | v) projection. */
static void qkv(const struct ms_exec_ctx *x, const struct ms_task_class *k, const struct ms_task *t,
                const struct ms_weight *const *w, int worker) {
  int c0 = t->tile[0] * k->tile, c1 = c0 + k->tile < k->n_out ? c0 + k->tile : k->n_out;
  if (q8_on(x, w[0]) || q8_on(x, w[1]) || q8_on(x, w[2])) {
    qkv_q8(x, k, t, w, worker);
  } else {
    int ld = x->plan->bufs[k->out].cols, B = x->plan->batch, base = 0, ldin;
    const float *in = task_in(x, k, t, worker, &ldin);
    float *out = ms_buf_row(x, k->out, 0, 0);
    for (int m = 0; m < 3; m++) {
      int lo = c0 > base ? c0 : base, hi = c1 < base + w[m]->rows ? c1 : base + w[m]->rows;
      if (lo < hi)
        ms_vec_gemv(w[m], lo - base, hi - base, in, ldin, B, out + lo, ld);
      base += w[m]->rows;
    }
  }
  if (x->m->cfg.qkv_bias) qkv_bias(x, k, c0, c1);  /* the epilogue */
}

static void rope_vec(float *v, int hd, const float *cs, const float *sn, enum ms_rope_style style) {
  for (int i = 0; i < hd / 2; i++) {
    int a = style == MS_ROPE_NEOX ? i : 2 * i, b = style == MS_ROPE_NEOX ? i + hd / 2 : 2 * i + 1;
    float va = v[a], vb = v[b];
    v[a] = va * cs[i] - vb * sn[i];
    v[b] = va * sn[i] + vb * cs[i];
  }
}

/* Position pos's row (n_kv * hd values, f32 or f16) of a pool: its element index. */
static size_t kv_index(const struct ms_exec_ctx *x, int layer, int row, int pos) {
  const struct ms_model_config *c = &x->m->cfg;
  int page = x->meta.row_pages[row][pos / x->page_size];
  size_t kvdim = (size_t)c->n_kv_heads * (size_t)c->head_dim;
  return (((size_t)layer * (size_t)x->pool_pages + (size_t)page) * (size_t)x->page_size +
          (size_t)(pos % x->page_size)) * kvdim;
}

static float *kv_at(const struct ms_exec_ctx *x, void *pool, int layer, int row, int pos) {
  return (float *)pool + kv_index(x, layer, row, pos);
}

static uint16_t *kv_at16(const struct ms_exec_ctx *x, void *pool, int layer, int row, int pos) {
  return (uint16_t *)pool + kv_index(x, layer, row, pos);
}

/* The first position past p's KV page, or n: the positions of one page lie
 * one row apart. */
static int page_end(const struct ms_exec_ctx *x, int p, int n) {
  int next = (p / x->page_size + 1) * x->page_size;
  return next < n ? next : n;
}

/* q/k norm (qwen3, gemma3), RoPE (the layer's base) on the group's q heads and its k head, KV append. */
static void rope(const struct ms_exec_ctx *x, const struct ms_task_class *k, const struct ms_task *t,
                 const struct ms_weight *const *w) {
  const struct ms_model_config *c = &x->m->cfg;
  int r = t->tile[1], kh = t->tile[2], hd = c->head_dim, group = c->n_heads / c->n_kv_heads;
  int nq = c->n_heads * hd, nkv = c->n_kv_heads * hd;
  const float *in = ms_buf_row(x, k->in, 0, r);
  float *qo = ms_buf_row(x, k->out, 0, r);
  if (!row_valid(x, r)) {
    memset(qo + kh * group * hd, 0, sizeof(float) * (size_t)(group * hd));
    return;
  }
  int pos = x->meta.row_pos[r], qkn = c->qk_norm;
  float own[2][ROPE_MAX_PAIRS];
  const float *cs = own[0], *sn = own[1];
  if (x->meta.row_rope) {  /* the row's embed task computed them (row_rotations) */
    int local = ms_layer_window(c, k->layer) && c->rope_base_local > 0;
    cs = x->meta.row_rope + ((size_t)r * 2 + (size_t)local) * (size_t)hd, sn = cs + hd / 2;
  } else {
    rope_angles(own[0], own[1], hd, pos, ms_layer_rope_base(c, k->layer));
  }
  for (int h = kh * group; h < (kh + 1) * group; h++) {
    if (qkn)
      ms_vec_rmsnorm(qo + h * hd, in + h * hd, w[0]->data, hd, c->norm_eps);
    else
      memcpy(qo + h * hd, in + h * hd, sizeof(float) * (size_t)hd);
    rope_vec(qo + h * hd, hd, cs, sn, c->rope_style);
  }
  float kf[MS_MAX_HEAD_DIM], *kd = x->kv_f16 ? kf : kv_at(x, x->k_pool, k->layer, r, pos) + kh * hd;
  if (qkn)
    ms_vec_rmsnorm(kd, in + nq + kh * hd, w[1]->data, hd, c->norm_eps);
  else
    memcpy(kd, in + nq + kh * hd, sizeof(float) * (size_t)hd);
  rope_vec(kd, hd, cs, sn, c->rope_style);
  const float *v = in + nq + nkv + kh * hd;
  if (x->kv_f16) {  /* rounded once, as written: every later read sees these values */
    ms_vec_f32_to_f16(kv_at16(x, x->k_pool, k->layer, r, pos) + kh * hd, kd, hd);
    ms_vec_f32_to_f16(kv_at16(x, x->v_pool, k->layer, r, pos) + kh * hd, v, hd);
  } else {
    memcpy(kv_at(x, x->v_pool, k->layer, r, pos) + kh * hd, v, sizeof(float) * (size_t)hd);
  }
}

size_t ms_ops_attn_part_floats(const struct ms_model *m) {
  const struct ms_model_config *c = &m->cfg;
  size_t n = (size_t)(c->n_heads / c->n_kv_heads) * (size_t)(c->head_dim + 2);
  return (n + 15) / 16 * 16;
}

/* The parts' slots of row r's KV group kh merged into out (group rows of hd):
 * each part's exponentials were taken against its own maximum, so each is
 * rescaled to the largest, out = sum(a o) / sum(a l). An empty part (-inf,
 * 0) weighs nothing. */
static void attn_merge(const float *slot, size_t pf, int parts, int group, int hd, float *out) {
  for (int g = 0; g < group; g++) {
    float m = -INFINITY, a[MS_ATTN_MAX_PARTS], l = 0;
    for (int i = 0; i < parts; i++) m = fmaxf(m, slot[(size_t)i * pf + (size_t)g]);
    for (int i = 0; i < parts; i++) {
      const float *pi = slot + (size_t)i * pf;
      a[i] = pi[group + g] > 0 ? expf(pi[g] - m) : 0;
      l += a[i] * pi[group + g];
    }
    float *o = out + (size_t)g * (size_t)hd, inv = 1.0f / l;
    for (int j = 0; j < hd; j++) o[j] = 0;
    for (int i = 0; i < parts; i++) {  /* the parts in order for each element, a row at a time */
      const float *oi = slot + (size_t)i * pf + 2 * (size_t)group + (size_t)g * (size_t)hd;
      for (int j = 0; j < hd; j++) o[j] += a[i] * oi[j];
    }
    for (int j = 0; j < hd; j++) o[j] *= inv;
  }
}

/* With the KV cache in f16: head kh's rows of positions [p, end) (one page)
 * of a pool, in f32, hd apart in the worker's staging (*ld = hd); the kernels
 * then take them as they take an f32 cache, so the only difference between
 * the two is the values' rounding when RoPE wrote them. */
static const float *kv_run32(const struct ms_exec_ctx *x, void *pool, int layer, int r, int p, int end, int kh,
                             int worker, size_t *ld) {
  const struct ms_model_config *c = &x->m->cfg;
  int hd = c->head_dim;
  size_t kvdim = (size_t)c->n_kv_heads * (size_t)hd;
  float *st = x->kv_stage[worker];
  const uint16_t *src = kv_at16(x, pool, layer, r, p) + kh * hd;
  int n = end - p;
  /* a head's rows are a few lines a KV row apart, which the prefetchers miss: each is fetched 8 rows ahead */
  for (int i = -8; i < n; i++) {
    if (i + 8 < n)
      for (int b = 0; b < hd * 2; b += 64) __builtin_prefetch((const char *)(src + (size_t)(i + 8) * kvdim) + b, 0, 3);
    if (i >= 0) ms_vec_f16_to_f32(st + (size_t)i * (size_t)hd, src + (size_t)i * kvdim, hd);
  }
  *ld = (size_t)hd;
  return st;
}

/* Row r's attention for the q heads sharing kv head `kh` over positions
 * [p0, p1) of its n. The group's heads go through each KV page together (K and
 * V read once for all of them), each head's scores a row of the worker's
 * scratch (group x max_ctx floats); acc gets the weighted V rows. Without ml
 * the softmax is whole (acc is the output); with it (a part's slot) the
 * exponentials stay unnormalised and each head's maximum and sum go to ml[g]
 * and ml[group + g], for attn_merge. */
static void attn_range(const struct ms_exec_ctx *x, const struct ms_task_class *k, int r, int kh, int n, int p0,
                       int p1, int worker, float *acc, float *ml) {
  const struct ms_model_config *c = &x->m->cfg;
  int hd = c->head_dim, group = c->n_heads / c->n_kv_heads;
  const float *q = ms_buf_row(x, k->in, 0, r) + kh * group * hd;
  float *s = x->scratch[worker], scale = ms_attn_scale(c);  /* (group, n) */
  size_t ld = (size_t)c->n_kv_heads * (size_t)hd;  /* one position's K (or V) row to the next */
  for (int p = p0, end; p < p1; p = end) {  /* a page at a time: its positions lie ld apart */
    end = page_end(x, p, p1);
    size_t kld = ld;
    const float *kr = x->kv_f16 ? kv_run32(x, x->k_pool, k->layer, r, p, end, kh, worker, &kld)
                                : kv_at(x, x->k_pool, k->layer, r, p) + kh * hd;
    ms_vec_dot_runs(q, group, kr, kld, end - p, hd, scale, s + p, (size_t)n);
  }
  if (ml)
    ms_vec_softmax_rows_part(s, group, (size_t)n, p0, p1, ml, ml + group);
  else
    ms_vec_softmax_rows(s, group, (size_t)n, p0, p1);
  memset(acc, 0, sizeof(float) * (size_t)(group * hd));
  for (int p = p0, end; p < p1; p = end) {
    end = page_end(x, p, p1);
    size_t vld = ld;
    const float *vr = x->kv_f16 ? kv_run32(x, x->v_pool, k->layer, r, p, end, kh, worker, &vld)
                                : kv_at(x, x->v_pool, k->layer, r, p) + kh * hd;
    ms_vec_axpy_runs(acc, group, s + p, (size_t)n, vr, vld, end - p, hd);
  }
}

/* Paged attention of one row for the q heads sharing kv head `kh`, over every
 * position so far, or the last `window` on a local layer. With parts
 * (ms_task_class.parts) the task takes share tile_x of the positions into its
 * slot, and the last of the parts' tasks to finish merges the slots. */
static void attn(const struct ms_exec_ctx *x, const struct ms_task_class *k, const struct ms_task *t,
                 int worker) {
  const struct ms_model_config *c = &x->m->cfg;
  int r = t->tile[1], kh = t->tile[2], hd = c->head_dim, group = c->n_heads / c->n_kv_heads;
  int parts = k->parts > 1 ? k->parts : 1, part = t->tile[0];
  float *out = ms_buf_row(x, k->out, 0, r) + kh * group * hd;
  if (!row_valid(x, r)) {  /* every part alike: none counts */
    memset(out, 0, sizeof(float) * (size_t)(group * hd));
    return;
  }
  int n = x->meta.row_pos[r] + 1, p0, p1;
  ms_layer_attn_share(c, k->layer, n, part, parts, &p0, &p1);
  if (parts == 1) {
    attn_range(x, k, r, kh, n, p0, p1, worker, out, NULL);
    return;
  }
  size_t at = (size_t)r * (size_t)c->n_kv_heads + (size_t)kh, pf = ms_ops_attn_part_floats(x->m);
  MS_ASSERT(x->attn_part && x->attn_done && part < parts);  /* sized by whoever laid x out */
  float *slot = x->attn_part + at * MS_ATTN_MAX_PARTS * pf;  /* a part's: [maximum, sum] a head, its rows */
  float *mine = slot + (size_t)part * pf;
  attn_range(x, k, r, kh, n, p0, p1, worker, mine + 2 * group, mine);
  /* The count's acq_rel orders every part's slot before the last one reads
   * them; the last puts it back to 0 before its task completes, and the next
   * step's parts depend on that completion. */
  if (ms_at_add_acq_rel64(&x->attn_done[at], 1) + 1 < (uint64_t)parts) return;
  ms_at_st_rlx64(&x->attn_done[at], 0);
  attn_merge(slot, pf, parts, group, hd, out);
}

/* out[:, c0:c1] = residual[:, c0:c1] + W[c0:c1] . in */
static void gemv_residual(const struct ms_exec_ctx *x, const struct ms_task_class *k,
                          const struct ms_task *t, const struct ms_weight *w, int worker) {
  int c0 = t->tile[0] * k->tile, c1 = c0 + k->tile < k->n_out ? c0 + k->tile : k->n_out;
  int ld = x->plan->bufs[k->out].cols, B = x->plan->batch, ldi;
  const float *in = task_in(x, k, t, worker, &ldi);
  float *out = ms_buf_row(x, k->out, 0, 0);
  if (t->kernel == MS_K_LM_HEAD && x->meta.some_head_skipped) {  /* only the rows that sample */
    for (int b = 0; b < x->meta.n_rows; b++)
      if (x->meta.row_head[b]) gemv(x, worker, w, c0, c1, in + (size_t)b * ldi, ldi, 1, out + (size_t)b * ld + c0, ld);
  } else {
    gemv(x, worker, w, c0, c1, in, ldi, B, out + c0, ld);
  }
  float cap = x->m->cfg.final_softcap;
  if (t->kernel == MS_K_LM_HEAD && cap > 0)  /* gemma's final logit cap */
    for (int b = 0; b < B; b++)
      for (int i = c0; i < c1; i++) out[(size_t)b * ld + i] = cap * tanhf(out[(size_t)b * ld + i] / cap);
  if (k->in2 < 0) return;
  for (int b = 0; b < B; b++) {
    const float *res = ms_buf_row(x, k->in2, 0, b);
    for (int i = c0; i < c1; i++) out[(size_t)b * ld + i] += res[i];
  }
}

static float silu(float v) { return v / (1.0f + expf(-v)); }

/* GELU, tanh approximation (ggml_gelu) */
static float gelu_tanh(float v) { return 0.5f * v * (1.0f + tanhf(0.7978845608f * (v + 0.044715f * v * v * v))); }

/* The gated FFN's activation of the gate: SiLU (SwiGLU) or GELU (GeGLU). */
static float glu_act(const struct ms_exec_ctx *x, float g) {
  return x->m->cfg.ffn_act == MS_ACT_GELU_TANH ? gelu_tanh(g) : silu(g);
}

/* h[rows, c0:c1] = silu(Wg x) * (Wu x) for the given rows (all, or routed ones). */
static void swiglu_rows(const struct ms_weight *wg, const struct ms_weight *wu, int c0, int c1,
                        const float *in, int ldin, float *out, int ldout, const int *rows, int nr) {
  for (int i = c0; i < c1; i++)
    for (int j = 0; j < nr; j++) {
      float g, u;
      const float *xr = in + (size_t)rows[j] * ldin;
      ms_vec_gemv(wg, i, i + 1, xr, ldin, 1, &g, 1);
      ms_vec_gemv(wu, i, i + 1, xr, ldin, 1, &u, 1);
      out[(size_t)rows[j] * ldout + i] = silu(g) * u;
    }
}

/* The end of a run of at most R weight rows (R a multiple of 4) from i0:
 * runs after the first start at a multiple of four, so the repacked matrices'
 * groups of four rows (kernels/quant.h) are whole in them. */
static int run_end(int i0, int c1, int R) {
  int e = i0 / 4 * 4 + R;
  return e < c1 ? e : c1;
}

/* h[rows, c0:c1] with 8-bit activations: each input row quantized once, then
 * the gate and up rows in runs (g, u hold 256 results). */
static void swiglu_q8(const struct ms_exec_ctx *x, const struct ms_weight *wg, const struct ms_weight *wu,
                      int c0, int c1, const float *in, int ldin, float *out, int ldout, const int *rows, int nr,
                      int worker) {
  float g[256], u[256];
  for (int j = 0; j < nr; j++) {
    const float *xr = in + (size_t)rows[j] * ldin;
    struct ms_q8_act a;
    q8_load(x, worker, xr, ldin, 1, wg->cols, ms_q8_qk(wg->dtype), &a);
    for (int i0 = c0, i1; i0 < c1; i0 = i1) {
      i1 = run_end(i0, c1, 256);
      gemv_chunk(x, worker, wg, i0, i1, &a, xr, ldin, 1, g, 256);
      gemv_chunk(x, worker, wu, i0, i1, &a, xr, ldin, 1, u, 256);
      ms_vec_glu(out + (size_t)rows[j] * ldout + i0, g, u, i1 - i0, 0);
    }
  }
}

static void swiglu_batch_q8(const struct ms_exec_ctx *x, const struct ms_task_class *k, const struct ms_task *t,
                            const struct ms_weight *const *w, int worker) {
  int c0 = t->tile[0] * k->tile, c1 = c0 + k->tile < k->n_out ? c0 + k->tile : k->n_out;
  int B = x->plan->batch, ld = x->plan->bufs[k->out].cols, ldin;
  const float *in0 = task_in(x, k, t, worker, &ldin);
  float g[256], u[256];
  for (int b0 = 0; b0 < B; b0 += x->q8_rows) {
    int nb = B - b0 < x->q8_rows ? B - b0 : x->q8_rows, R = 256 / nb / 4 * 4;  /* weight rows per run */
    const float *in = in0 + (size_t)b0 * ldin;
    float *out = ms_buf_row(x, k->out, 0, b0);
    struct ms_q8_act a;
    q8_load(x, worker, in, ldin, nb, w[0]->cols, ms_q8_qk(w[0]->dtype), &a);
    for (int i0 = c0, i1; i0 < c1; i0 = i1) {
      i1 = run_end(i0, c1, R);
      gemv_chunk(x, worker, w[0], i0, i1, &a, in, ldin, nb, g, R);
      gemv_chunk(x, worker, w[1], i0, i1, &a, in, ldin, nb, u, R);
      for (int b = 0; b < nb; b++)
        ms_vec_glu(out + (size_t)b * ld + i0, g + b * R, u + b * R, i1 - i0, x->m->cfg.ffn_act == MS_ACT_GELU_TANH);
    }
  }
}

static void swiglu(const struct ms_exec_ctx *x, const struct ms_task_class *k, const struct ms_task *t,
                   const struct ms_weight *const *w, int worker) {
  if (q8_on(x, w[0]) || q8_on(x, w[1])) {
    swiglu_batch_q8(x, k, t, w, worker);
    return;
  }
  int c0 = t->tile[0] * k->tile, c1 = c0 + k->tile < k->n_out ? c0 + k->tile : k->n_out;
  int B = x->plan->batch, ld = x->plan->bufs[k->out].cols, ldin;
  float g[64], u[64];
  const float *in = task_in(x, k, t, worker, &ldin);
  float *out = ms_buf_row(x, k->out, 0, 0);
  /* The whole batch per weight row: each row of Wg and Wu is read once. */
  for (int i = c0; i < c1; i++)
    for (int b0 = 0; b0 < B; b0 += 64) {
      int nb = B - b0 < 64 ? B - b0 : 64;
      ms_vec_gemv(w[0], i, i + 1, in + (size_t)b0 * ldin, ldin, nb, g, 1);
      ms_vec_gemv(w[1], i, i + 1, in + (size_t)b0 * ldin, ldin, nb, u, 1);
      for (int b = 0; b < nb; b++) out[(size_t)(b0 + b) * ld + i] = glu_act(x, g[b]) * u[b];
    }
}

/* Router: top-k experts by logit (lowest index on ties), weights softmax-normalised
 * over the chosen. route row = [k expert ids as int32 | k weights]. */
static void router(const struct ms_exec_ctx *x, const struct ms_task_class *k, const struct ms_task *t,
                   const struct ms_weight *w, int worker) {
  const struct ms_model_config *c = &x->m->cfg;
  int r = t->tile[1], E = c->n_experts, K = c->top_k;
  float logit[256];
  float *route = ms_buf_row(x, k->out, 0, r);
  int32_t *ids = (int32_t *)route;
  gemv(x, worker, w, 0, E, ms_buf_row(x, k->in, 0, r), c->dim, 1, logit, 1);
  for (int j = 0; j < K; j++) {
    int best = -1;
    for (int e = 0; e < E; e++) {
      int used = 0;
      for (int i = 0; i < j; i++) used |= ids[i] == e;
      if (!used && (best < 0 || logit[e] > logit[best])) best = e;
    }
    ids[j] = best;
  }
  float sum = 0.0f;
  for (int j = 0; j < K; j++) sum += (route[K + j] = expf(logit[ids[j]] - logit[ids[0]]));
  for (int j = 0; j < K; j++) route[K + j] /= sum;
}

/* Rows of the batch routed to expert e (valid rows only). */
static int routed_rows(const struct ms_exec_ctx *x, int route_buf, int e, int *rows) {
  int n = 0, K = x->m->cfg.top_k;
  for (int r = 0; r < x->meta.n_rows; r++) {
    if (x->meta.row_slot[r] < 0) continue;
    const int32_t *ids = (const int32_t *)ms_buf_row(x, route_buf, 0, r);
    for (int j = 0; j < K; j++)
      if (ids[j] == e) {
        rows[n++] = r;
        break;
      }
  }
  return n;
}

static void expert_up(const struct ms_exec_ctx *x, const struct ms_task_class *k, const struct ms_task *t,
                      int worker) {
  const struct ms_layer_weights *L = &x->m->layers[k->layer];
  int e = t->tile[2], rows[4096];
  int c0 = t->tile[0] * k->tile, c1 = c0 + k->tile < k->n_out ? c0 + k->tile : k->n_out;
  int nr = routed_rows(x, k->in2, e, rows);
  if (q8_on(x, &L->exp_gate[e]) || q8_on(x, &L->exp_up[e])) {
    swiglu_q8(x, &L->exp_gate[e], &L->exp_up[e], c0, c1, ms_buf_row(x, k->in, 0, 0), x->plan->bufs[k->in].cols,
              ms_buf_row(x, k->out, e, 0), x->plan->bufs[k->out].cols, rows, nr, worker);
    return;
  }
  swiglu_rows(&L->exp_gate[e], &L->exp_up[e], c0, c1, ms_buf_row(x, k->in, 0, 0),
              x->plan->bufs[k->in].cols, ms_buf_row(x, k->out, e, 0), x->plan->bufs[k->out].cols, rows, nr);
}

static void expert_down(const struct ms_exec_ctx *x, const struct ms_task_class *k, const struct ms_task *t,
                        int worker) {
  const struct ms_layer_weights *L = &x->m->layers[k->layer];
  int e = t->tile[2], rows[4096];
  int c0 = t->tile[0] * k->tile, c1 = c0 + k->tile < k->n_out ? c0 + k->tile : k->n_out;
  int nr = routed_rows(x, k->in2, e, rows), ld = x->plan->bufs[k->out].cols;
  for (int j = 0; j < nr; j++)
    gemv(x, worker, &L->exp_down[e], c0, c1, ms_buf_row(x, k->in, e, rows[j]), x->plan->bufs[k->in].cols, 1,
         ms_buf_row(x, k->out, e, rows[j]) + c0, ld);
}

static void moe_combine(const struct ms_exec_ctx *x, const struct ms_task_class *k, const struct ms_task *t) {
  int K = x->m->cfg.top_k, B = x->plan->batch;
  int c0 = t->tile[0] * k->tile, c1 = c0 + k->tile < k->n_out ? c0 + k->tile : k->n_out;
  for (int r = 0; r < B; r++) {
    float *out = ms_buf_row(x, k->out, 0, r);
    const float *res = ms_buf_row(x, k->in2, 0, r);
    for (int i = c0; i < c1; i++) out[i] = res[i];
    if (!row_valid(x, r)) continue;
    const float *route = ms_buf_row(x, k->aux, 0, r);
    const int32_t *ids = (const int32_t *)route;
    for (int j = 0; j < K; j++) ms_vec_axpy(out + c0, route[K + j], ms_buf_row(x, k->in, ids[j], r) + c0, c1 - c0);
  }
}

void ms_ops_run(const struct ms_exec_ctx *x, int ti, int worker) {
  const struct ms_task *t = &x->plan->tasks[ti];
  const struct ms_task_class *k = &x->plan->classes[t->cls];
  const struct ms_weight *const *w = x->cls_w[t->cls];
  if (x->q8_held) x->q8_held[worker].cls_now = t->cls;
  switch (t->kernel) {
  case MS_K_EMBED: embed(x, k, t); break;
  case MS_K_RMSNORM: rmsnorm_row(x, k, t, w[0]); break;
  case MS_K_QKV: qkv(x, k, t, w, worker); break;
  case MS_K_ROPE: rope(x, k, t, w); break;
  case MS_K_ATTN: attn(x, k, t, worker); break;
  case MS_K_WO:
  case MS_K_DOWN:
  case MS_K_LM_HEAD: gemv_residual(x, k, t, w[0], worker); break;
  case MS_K_SWIGLU: swiglu(x, k, t, w, worker); break;
  case MS_K_ROUTER: router(x, k, t, w[0], worker); break;
  case MS_K_EXPERT_UP: expert_up(x, k, t, worker); break;
  case MS_K_EXPERT_DOWN: expert_down(x, k, t, worker); break;
  case MS_K_MOE_COMBINE: moe_combine(x, k, t); break;
  default: break;  /* step start, sampling: the runtime's; empty: nothing */
  }
}
