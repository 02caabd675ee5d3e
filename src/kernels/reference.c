/* SPDX-License-Identifier: MIT */
/* The reference forward: the model's maths written as plainly as possible, one
 * sequence at a time, in double precision. See reference.h. */
#include "megascope/reference.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "megascope/base.h"
#include "megascope/sample.h"

#include "core/layer.h"
#include "kernels/quant.h"

struct ms_ref {
  const struct ms_model *m;
  int max_ctx, pos;
  double *x, *xn, *q, *k, *v, *att, *o, *h, *g, *u, *tmp, *moe; /* scratch */
  double *kcache, *vcache;  /* (n_layers, max_ctx, n_kv*hd) */
  int q8;                   /* ms_ref_set_q8 */
  int kv_f16;               /* ms_ref_set_kv_f16 */
  double *xq;               /* a product's input, rounded as the engine's 8-bit activations */
  float *xf;
  void *qbuf;
};

static double wget(const struct ms_weight *w, int r, int c) { return ms_weight_get(w, r, c); }

/* Row by row, in double; the element type is switched on once per row. The
 * block formats and f16 are decoded by model.c's plain scalar decoder into a
 * row of floats first (never by the kernels under test). */
static double dot_row(const struct ms_weight *w, int r, const double *x) {
  double s = 0;
  if (w->dtype == MS_DTYPE_BF16) {
    const uint16_t *p = (const uint16_t *)((const char *)w->data + (size_t)r * ms_weight_row_bytes(w));
    for (int c = 0; c < w->cols; c++) s += (double)ms_bf16_to_f32(p[c]) * x[c];
  } else if (w->dtype == MS_DTYPE_F32) {
    const float *p = (const float *)((const char *)w->data + (size_t)r * ms_weight_row_bytes(w));
    for (int c = 0; c < w->cols; c++) s += (double)p[c] * x[c];
  } else {
    float stack[8192], *row = w->cols <= 8192 ? stack : malloc(sizeof(float) * (size_t)w->cols);
    MS_ASSERT(row);
    ms_weight_row_f32(w, r, row);
    for (int c = 0; c < w->cols; c++) s += (double)row[c] * x[c];
    if (row != stack) free(row);
  }
  return s;
}

/* x as the engine feeds it to w: itself, or with 8-bit activations on a
 * block-format weight, rounded through ms_q8_quantize's portable path (the
 * quantizer the engine's paths agree with bit for bit). */
static const double *as_input(struct ms_ref *r, const struct ms_weight *w, const double *x) {
  if (!r->q8 || !ms_q8_handles(w->dtype)) return x;
  struct ms_q8_act a;
  for (int c = 0; c < w->cols; c++) r->xf[c] = (float)x[c];
  ms_q8_quantize(&a, r->qbuf, r->xf, w->cols, 1, w->cols, ms_q8_qk(w->dtype), 0);
  for (int c = 0; c < w->cols; c++) r->xq[c] = (double)a.d[c / a.qk] * a.q[c];
  return r->xq;
}

static void matvec(struct ms_ref *rf, const struct ms_weight *w, const double *x, double *y) {
  const double *in = as_input(rf, w, x);
  for (int r = 0; r < w->rows; r++) y[r] = dot_row(w, r, in);
}

static void rmsnorm(double *out, const double *x, const struct ms_weight *w, int n, double eps) {
  double ss = 0;
  for (int i = 0; i < n; i++) ss += x[i] * x[i];
  double inv = 1.0 / sqrt(ss / n + eps);
  for (int i = 0; i < n; i++) out[i] = x[i] * inv * wget(w, 0, i);
}

static void rope(double *v, int hd, int pos, double base, enum ms_rope_style style) {
  for (int i = 0; i < hd / 2; i++) {
    double theta = pos * pow(base, -2.0 * i / hd);
    double c = cos(theta), s = sin(theta);
    int a = style == MS_ROPE_NEOX ? i : 2 * i;
    int b = style == MS_ROPE_NEOX ? i + hd / 2 : 2 * i + 1;
    double va = v[a], vb = v[b];
    v[a] = va * c - vb * s;
    v[b] = va * s + vb * c;
  }
}

static double silu(double x) { return x / (1.0 + exp(-x)); }

/* GELU, tanh approximation (ggml_gelu, PyTorch's approximate="tanh") */
static double gelu_tanh(double x) { return 0.5 * x * (1.0 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))); }

struct ms_ref *ms_ref_new(const struct ms_model *m, int max_ctx) {
  const struct ms_model_config *c = &m->cfg;
  struct ms_ref *r = calloc(1, sizeof *r);
  if (!r) return NULL;
  r->m = m;
  r->max_ctx = max_ctx;
  int q = c->n_heads * c->head_dim, kv = c->n_kv_heads * c->head_dim;
  int f = c->ffn_dim > c->expert_ffn_dim ? c->ffn_dim : c->expert_ffn_dim;
  int big = c->dim > q ? c->dim : q;
  double **bufs[] = {&r->x, &r->xn, &r->o, &r->tmp, &r->moe};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) *bufs[i] = calloc((size_t)big, sizeof(double));
  r->q = calloc((size_t)q, sizeof(double));
  r->k = calloc((size_t)kv, sizeof(double));
  r->v = calloc((size_t)kv, sizeof(double));
  r->att = calloc((size_t)max_ctx + (size_t)c->n_experts, sizeof(double));
  r->h = calloc((size_t)f, sizeof(double));
  r->g = calloc((size_t)f, sizeof(double));
  r->u = calloc((size_t)f, sizeof(double));
  size_t cache = (size_t)c->n_layers * (size_t)max_ctx * (size_t)kv;
  r->kcache = calloc(cache, sizeof(double));
  r->vcache = calloc(cache, sizeof(double));
  int wide = (f > big ? f : big) + 32;  /* the longest product input, in whole blocks */
  r->xq = calloc((size_t)wide, sizeof(double));
  r->xf = calloc((size_t)wide, sizeof(float));
  r->qbuf = aligned_alloc(64, (ms_q8_act_bytes(wide / 32 * 32, 1) + 63) / 64 * 64);
  if (!r->x || !r->xn || !r->o || !r->tmp || !r->moe || !r->q || !r->k || !r->v || !r->att ||
      !r->h || !r->g || !r->u || !r->kcache || !r->vcache || !r->xq || !r->xf || !r->qbuf) {
    ms_ref_free(r);
    errno = ENOMEM;
    return NULL;
  }
  return r;
}

void ms_ref_free(struct ms_ref *r) {
  if (!r) return;
  double *bufs[] = {r->x, r->xn, r->q, r->k, r->v, r->att, r->o, r->h, r->g, r->u, r->tmp, r->moe, r->kcache, r->vcache,
                    r->xq};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
  free(r->xf);
  free(r->qbuf);
  free(r);
}

void ms_ref_set_q8(struct ms_ref *r, int on) { r->q8 = on; }

void ms_ref_set_kv_f16(struct ms_ref *r, int on) { r->kv_f16 = on; }

/* A cached K or V value as the engine's f16 cache holds it (the engine rounds its f32 value). */
static double kv_round(const struct ms_ref *r, double v) {
  return r->kv_f16 ? (double)ms_f16_to_f32(ms_f32_to_f16((float)v)) : v;
}

/* Causal attention of every head over positions [t0, pos]: all of them, or the
 * last `window` on a local layer. */
static void attention(struct ms_ref *r, int l) {
  const struct ms_model_config *c = &r->m->cfg;
  int hd = c->head_dim, kv = c->n_kv_heads * hd, group = c->n_heads / c->n_kv_heads;
  int win = ms_layer_window(c, l), t0 = win && r->pos - win + 1 > 0 ? r->pos - win + 1 : 0;
  double scale = (double)ms_attn_scale(c);
  const double *kc = r->kcache + (size_t)l * r->max_ctx * kv;
  const double *vc = r->vcache + (size_t)l * r->max_ctx * kv;
  for (int h = 0; h < c->n_heads; h++) {
    int kh = h / group;
    double mx = -INFINITY, sum = 0;
    for (int t = t0; t <= r->pos; t++) {
      double s = 0;
      for (int i = 0; i < hd; i++) s += r->q[h * hd + i] * kc[(size_t)t * kv + kh * hd + i];
      r->att[t] = s * scale;
      if (r->att[t] > mx) mx = r->att[t];
    }
    for (int t = t0; t <= r->pos; t++) sum += (r->att[t] = exp(r->att[t] - mx));
    for (int i = 0; i < hd; i++) {
      double s = 0;
      for (int t = t0; t <= r->pos; t++) s += r->att[t] * vc[(size_t)t * kv + kh * hd + i];
      r->o[h * hd + i] = s / sum;
    }
  }
}

static void dense_ffn(struct ms_ref *r, const struct ms_weight *wg, const struct ms_weight *wu,
                      const struct ms_weight *wd, double *out) {
  int gelu = r->m->cfg.ffn_act == MS_ACT_GELU_TANH;
  matvec(r, wg, r->xn, r->g);
  matvec(r, wu, r->xn, r->u);
  for (int i = 0; i < wg->rows; i++) r->h[i] = (gelu ? gelu_tanh(r->g[i]) : silu(r->g[i])) * r->u[i];
  matvec(r, wd, r->h, out);
}

static void moe_ffn(struct ms_ref *r, const struct ms_layer_weights *L) {
  const struct ms_model_config *c = &r->m->cfg;
  double *logit = r->att;  /* reuse: n_experts entries */
  matvec(r, &L->router, r->xn, logit);
  int chosen[64];
  double wsum = 0, w[64];
  for (int k = 0; k < c->top_k; k++) {
    int best = -1;
    for (int e = 0; e < c->n_experts; e++) {
      int used = 0;
      for (int j = 0; j < k; j++) used |= chosen[j] == e;
      if (!used && (best < 0 || logit[e] > logit[best])) best = e;
    }
    chosen[k] = best;
  }
  for (int k = 0; k < c->top_k; k++) wsum += (w[k] = exp(logit[chosen[k]] - logit[chosen[0]]));
  for (int k = 0; k < c->top_k; k++) {
    int e = chosen[k];
    dense_ffn(r, &L->exp_gate[e], &L->exp_up[e], &L->exp_down[e], r->moe);
    for (int i = 0; i < c->dim; i++) r->x[i] += w[k] / wsum * r->moe[i];
  }
}

/* tmp (a sublayer's output) = rmsnorm(tmp) * w, before its residual add (gemma3) */
static void post_norm(struct ms_ref *r, const struct ms_weight *w) {
  int dim = r->m->cfg.dim;
  rmsnorm(r->xn, r->tmp, w, dim, r->m->cfg.norm_eps);
  memcpy(r->tmp, r->xn, sizeof(double) * (size_t)dim);
}

int ms_ref_step(struct ms_ref *r, int token, float *logits) {
  const struct ms_model *m = r->m;
  const struct ms_model_config *c = &m->cfg;
  if (token < 0 || token >= c->vocab) return -EINVAL;
  if (r->pos >= r->max_ctx) return -ENOSPC;
  int hd = c->head_dim, kv = c->n_kv_heads * hd;
  double escale = c->embed_scale > 0 ? (double)c->embed_scale : 1.0;
  for (int i = 0; i < c->dim; i++) r->x[i] = wget(&m->tok_embd, token, i) * escale;
  for (int l = 0; l < c->n_layers; l++) {
    const struct ms_layer_weights *L = &m->layers[l];
    double base = (double)ms_layer_rope_base(c, l);
    rmsnorm(r->xn, r->x, &L->attn_norm, c->dim, c->norm_eps);
    matvec(r, &L->wq, r->xn, r->q);
    matvec(r, &L->wk, r->xn, r->k);
    matvec(r, &L->wv, r->xn, r->v);
    if (c->qkv_bias) {
      for (int i = 0; i < c->n_heads * hd; i++) r->q[i] += wget(&L->bq, 0, i);
      for (int i = 0; i < kv; i++) r->k[i] += wget(&L->bk, 0, i);
      for (int i = 0; i < kv; i++) r->v[i] += wget(&L->bv, 0, i);
    }
    for (int h = 0; h < c->n_heads; h++) {
      if (c->qk_norm) {
        rmsnorm(r->tmp, r->q + h * hd, &L->q_norm, hd, c->norm_eps);
        memcpy(r->q + h * hd, r->tmp, sizeof(double) * (size_t)hd);
      }
      rope(r->q + h * hd, hd, r->pos, base, c->rope_style);
    }
    for (int h = 0; h < c->n_kv_heads; h++) {
      if (c->qk_norm) {
        rmsnorm(r->tmp, r->k + h * hd, &L->k_norm, hd, c->norm_eps);
        memcpy(r->k + h * hd, r->tmp, sizeof(double) * (size_t)hd);
      }
      rope(r->k + h * hd, hd, r->pos, base, c->rope_style);
    }
    size_t at = ((size_t)l * r->max_ctx + (size_t)r->pos) * kv;
    for (int i = 0; i < kv; i++) r->kcache[at + (size_t)i] = kv_round(r, r->k[i]);
    for (int i = 0; i < kv; i++) r->vcache[at + (size_t)i] = kv_round(r, r->v[i]);
    attention(r, l);
    matvec(r, &L->wo, r->o, r->tmp);
    if (c->post_norms) post_norm(r, &L->attn_post_norm);
    for (int i = 0; i < c->dim; i++) r->x[i] += r->tmp[i];
    rmsnorm(r->xn, r->x, &L->ffn_norm, c->dim, c->norm_eps);
    if (c->n_experts) {
      moe_ffn(r, L);
    } else {
      dense_ffn(r, &L->w_gate, &L->w_up, &L->w_down, r->tmp);
      if (c->post_norms) post_norm(r, &L->ffn_post_norm);
      for (int i = 0; i < c->dim; i++) r->x[i] += r->tmp[i];
    }
  }
  rmsnorm(r->xn, r->x, &m->out_norm, c->dim, c->norm_eps);
  const double *in = as_input(r, &m->lm_head, r->xn);
  for (int v = 0; v < c->vocab; v++) {
    double z = dot_row(&m->lm_head, v, in), cap = c->final_softcap;
    logits[v] = (float)(cap > 0 ? cap * tanh(z / cap) : z);
  }
  r->pos++;
  return 0;
}

int ms_argmax(const float *v, int n) { return ms_sample_argmax(v, n); }
