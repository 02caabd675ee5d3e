/* SPDX-License-Identifier: MIT */
/* Presets and synthetic models.
 *
 * A synthetic model's weights come from a counter-based generator (splitmix64 of
 * seed and tensor number), so any preset is reproduced bit for bit from its seed
 * without shipping a file. Matrices are uniform in +-sqrt(3/cols) (unit variance of
 * the output for unit-variance input); norm weights are 1 plus a little noise, so
 * that a missing norm multiply is caught by the reference check. */
#include "megascope/model.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "megascope/base.h"

const char *const ms_preset_names[] = {"tiny", "tiny-qwen3", "tiny-moe", "smollm2-135m", NULL};

static void cfg_tiny(struct ms_model_config *c) {
  c->arch = MS_ARCH_LLAMA;
  c->rope_style = MS_ROPE_NORM;
  c->n_layers = 2;
  c->dim = 64;
  c->ffn_dim = 160;
  c->n_heads = 4;
  c->n_kv_heads = 2;
  c->head_dim = 16;
  c->vocab = 256;
  c->rope_base = 10000.0f;
  c->norm_eps = 1e-5f;
  c->bos = 1;
  c->eos = -1;  /* synthetic text has no end: runs stop at max tokens */
}

int ms_preset_config(const char *name, enum ms_dtype dtype, struct ms_model_config *c) {
  memset(c, 0, sizeof *c);
  if (!strcmp(name, "tiny")) {
    cfg_tiny(c);
  } else if (!strcmp(name, "tiny-qwen3")) {
    cfg_tiny(c);
    c->arch = MS_ARCH_QWEN3;
    c->rope_style = MS_ROPE_NEOX;
    c->rope_base = 1000000.0f;
    c->norm_eps = 1e-6f;
  } else if (!strcmp(name, "tiny-moe")) {
    cfg_tiny(c);
    c->n_experts = 4;
    c->top_k = 2;
    c->expert_ffn_dim = 96;
  } else if (!strcmp(name, "smollm2-135m")) {
    c->arch = MS_ARCH_LLAMA;
    c->rope_style = MS_ROPE_NORM;
    c->n_layers = 30;
    c->dim = 576;
    c->ffn_dim = 1536;
    c->n_heads = 9;
    c->n_kv_heads = 3;
    c->head_dim = 64;
    c->vocab = 49152;
    c->tied_embeddings = 1;
    c->rope_base = 100000.0f;
    c->norm_eps = 1e-5f;
    c->bos = 1;
    c->eos = 2;
  } else {
    return -ENOENT;
  }
  snprintf(c->name, sizeof c->name, "%s", name);
  c->dtype = dtype;
  return 0;
}

const char *ms_dtype_name(enum ms_dtype t) {
  switch (t) {
  case MS_DTYPE_F32: return "f32";
  case MS_DTYPE_BF16: return "bf16";
  default: return "?";
  }
}

int ms_dtype_parse(const char *s, enum ms_dtype *out) {
  if (!strcmp(s, "f32")) *out = MS_DTYPE_F32;
  else if (!strcmp(s, "bf16")) *out = MS_DTYPE_BF16;
  else return -EINVAL;
  return 0;
}

size_t ms_dtype_size(enum ms_dtype t) { return t == MS_DTYPE_BF16 ? 2 : 4; }

float ms_weight_get(const struct ms_weight *w, int r, int c) {
  size_t i = (size_t)r * (size_t)w->cols + (size_t)c;
  if (w->dtype == MS_DTYPE_BF16) return ms_bf16_to_f32(((const uint16_t *)w->data)[i]);
  return ((const float *)w->data)[i];
}

/* ---- synthetic weights ---- */

static uint64_t splitmix64(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

struct synth {
  uint64_t seed;
  unsigned tensor;  /* tensors are numbered in creation order */
  char *cursor;     /* next free byte in storage */
};

static float uniform(uint64_t *s) {  /* in [-1, 1) */
  return (float)((int64_t)(splitmix64(s) >> 11) - (1ll << 52)) / (float)(1ll << 52);
}

static void synth_matrix(struct synth *sy, struct ms_weight *w, enum ms_dtype dt, int rows,
                         int cols, float scale, float bias) {
  uint64_t s = sy->seed * 0x100000001b3ull + ++sy->tensor;
  size_t n = (size_t)rows * (size_t)cols;
  w->dtype = dt;
  w->rows = rows;
  w->cols = cols;
  w->data = sy->cursor;
  if (dt == MS_DTYPE_BF16) {
    uint16_t *p = (uint16_t *)sy->cursor;
    for (size_t i = 0; i < n; i++) p[i] = ms_f32_to_bf16(bias + scale * uniform(&s));
  } else {
    float *p = (float *)sy->cursor;
    for (size_t i = 0; i < n; i++) p[i] = bias + scale * uniform(&s);
  }
  sy->cursor += (n * ms_dtype_size(dt) + 63) & ~(size_t)63;
}

static void synth_norm(struct synth *sy, struct ms_weight *w, int n) {
  synth_matrix(sy, w, MS_DTYPE_F32, 1, n, 0.1f, 1.0f);
}

static void synth_proj(struct synth *sy, struct ms_weight *w, enum ms_dtype dt, int rows, int cols) {
  synth_matrix(sy, w, dt, rows, cols, sqrtf(3.0f / (float)cols), 0.0f);
}

/* Storage is sized by running the same layout with byte counting only. */
static size_t mat_bytes(int rows, int cols, enum ms_dtype dt) {
  return ((size_t)rows * (size_t)cols * ms_dtype_size(dt) + 63) & ~(size_t)63;
}

static size_t synth_bytes(const struct ms_model_config *c) {
  enum ms_dtype dt = c->dtype;
  int q = c->n_heads * c->head_dim, kv = c->n_kv_heads * c->head_dim;
  size_t layer = 2 * mat_bytes(1, c->dim, MS_DTYPE_F32) + mat_bytes(q, c->dim, dt) +
                 2 * mat_bytes(kv, c->dim, dt) + mat_bytes(c->dim, q, dt) +
                 2 * mat_bytes(1, c->head_dim, MS_DTYPE_F32);
  if (c->n_experts)
    layer += mat_bytes(c->n_experts, c->dim, MS_DTYPE_F32) +
             (size_t)c->n_experts * (2 * mat_bytes(c->expert_ffn_dim, c->dim, dt) +
                                     mat_bytes(c->dim, c->expert_ffn_dim, dt));
  else
    layer += 2 * mat_bytes(c->ffn_dim, c->dim, dt) + mat_bytes(c->dim, c->ffn_dim, dt);
  size_t total = (size_t)c->n_layers * layer + mat_bytes(c->vocab, c->dim, dt) +
                 mat_bytes(1, c->dim, MS_DTYPE_F32);
  if (!c->tied_embeddings) total += mat_bytes(c->vocab, c->dim, dt);
  return total + 64;
}

static int cfg_valid(const struct ms_model_config *c) {
  if (c->n_layers <= 0 || c->dim <= 0 || c->n_heads <= 0 || c->n_kv_heads <= 0 ||
      c->head_dim <= 0 || c->vocab <= 0 || c->head_dim % 2)
    return 0;
  if (c->n_heads % c->n_kv_heads) return 0;
  if (c->n_experts ? (c->top_k <= 0 || c->top_k > c->n_experts || c->expert_ffn_dim <= 0)
                   : c->ffn_dim <= 0)
    return 0;
  return c->dtype == MS_DTYPE_F32 || c->dtype == MS_DTYPE_BF16;
}

struct ms_model *ms_model_synth(const struct ms_model_config *cfg, uint64_t seed) {
  if (!cfg_valid(cfg)) {
    errno = EINVAL;
    return NULL;
  }
  struct ms_model *m = calloc(1, sizeof *m);
  if (!m) return NULL;
  m->cfg = *cfg;
  m->storage_bytes = synth_bytes(cfg);
  m->layers = calloc((size_t)cfg->n_layers, sizeof *m->layers);
  if (posix_memalign(&m->storage, 64, m->storage_bytes)) m->storage = NULL;
  if (!m->layers || !m->storage) goto fail;

  const struct ms_model_config *c = cfg;
  enum ms_dtype dt = c->dtype;
  int q = c->n_heads * c->head_dim, kv = c->n_kv_heads * c->head_dim;
  struct synth sy = {.seed = seed, .cursor = m->storage};
  /* The embedding is scaled up so that the residual stream starts near unit RMS. */
  synth_matrix(&sy, &m->tok_embd, dt, c->vocab, c->dim, 1.0f, 0.0f);
  for (int l = 0; l < c->n_layers; l++) {
    struct ms_layer_weights *L = &m->layers[l];
    synth_norm(&sy, &L->attn_norm, c->dim);
    synth_proj(&sy, &L->wq, dt, q, c->dim);
    synth_proj(&sy, &L->wk, dt, kv, c->dim);
    synth_proj(&sy, &L->wv, dt, kv, c->dim);
    synth_norm(&sy, &L->q_norm, c->head_dim);
    synth_norm(&sy, &L->k_norm, c->head_dim);
    synth_proj(&sy, &L->wo, dt, c->dim, q);
    synth_norm(&sy, &L->ffn_norm, c->dim);
    if (c->n_experts) {
      synth_proj(&sy, &L->router, MS_DTYPE_F32, c->n_experts, c->dim);
      L->exp_gate = calloc((size_t)c->n_experts, sizeof *L->exp_gate);
      L->exp_up = calloc((size_t)c->n_experts, sizeof *L->exp_up);
      L->exp_down = calloc((size_t)c->n_experts, sizeof *L->exp_down);
      if (!L->exp_gate || !L->exp_up || !L->exp_down) goto fail;
      for (int e = 0; e < c->n_experts; e++) {
        synth_proj(&sy, &L->exp_gate[e], dt, c->expert_ffn_dim, c->dim);
        synth_proj(&sy, &L->exp_up[e], dt, c->expert_ffn_dim, c->dim);
        synth_proj(&sy, &L->exp_down[e], dt, c->dim, c->expert_ffn_dim);
      }
    } else {
      synth_proj(&sy, &L->w_gate, dt, c->ffn_dim, c->dim);
      synth_proj(&sy, &L->w_up, dt, c->ffn_dim, c->dim);
      synth_proj(&sy, &L->w_down, dt, c->dim, c->ffn_dim);
    }
  }
  synth_norm(&sy, &m->out_norm, c->dim);
  if (c->tied_embeddings)
    m->lm_head = m->tok_embd;
  else
    synth_proj(&sy, &m->lm_head, dt, c->vocab, c->dim);
  MS_ASSERT((size_t)(sy.cursor - (char *)m->storage) <= m->storage_bytes);
  return m;
fail:
  ms_model_free(m);
  errno = ENOMEM;
  return NULL;
}

void ms_model_free(struct ms_model *m) {
  if (!m) return;
  if (m->layers)
    for (int l = 0; l < m->cfg.n_layers; l++) {
      free(m->layers[l].exp_gate);
      free(m->layers[l].exp_up);
      free(m->layers[l].exp_down);
    }
  free(m->layers);
  free(m->storage);
  free(m);
}

static size_t wbytes(const struct ms_weight *w) {
  return w->data ? (size_t)w->rows * (size_t)w->cols * ms_dtype_size(w->dtype) : 0;
}

size_t ms_model_weight_bytes(const struct ms_model *m) {
  size_t b = wbytes(&m->out_norm) + wbytes(&m->lm_head);
  for (int l = 0; l < m->cfg.n_layers; l++) {
    const struct ms_layer_weights *L = &m->layers[l];
    b += wbytes(&L->attn_norm) + wbytes(&L->wq) + wbytes(&L->wk) + wbytes(&L->wv) +
         wbytes(&L->wo) + wbytes(&L->ffn_norm) + wbytes(&L->w_gate) + wbytes(&L->w_up) +
         wbytes(&L->w_down) + wbytes(&L->router);
    if (m->cfg.arch == MS_ARCH_QWEN3) b += wbytes(&L->q_norm) + wbytes(&L->k_norm);
    for (int e = 0; e < m->cfg.n_experts; e++)
      b += wbytes(&L->exp_gate[e]) + wbytes(&L->exp_up[e]) + wbytes(&L->exp_down[e]);
  }
  return b;
}
