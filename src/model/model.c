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
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "model/blocks.h"
#include "model/quant_k.h"
#include "megascope/base.h"

const char *const ms_preset_names[] = {"tiny", "tiny-qwen3", "tiny-qwen2", "tiny-gemma3", "tiny-256", "tiny-moe",
                                       "smollm2-135m", "llama-3.2-1b", "qwen3-8b", "gemma3-270m", NULL};

const char *ms_arch_name(enum ms_arch a) {
  static const char *const names[MS_ARCH_COUNT] = {
      [MS_ARCH_LLAMA] = "llama", [MS_ARCH_QWEN3] = "qwen3", [MS_ARCH_QWEN2] = "qwen2", [MS_ARCH_GEMMA3] = "gemma3"};
  return (unsigned)a < MS_ARCH_COUNT ? names[a] : "?";
}

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

/* Gemma 3's features (llama.cpp's gemma3: a global layer every sixth, local
 * RoPE base 10000); the caller sets the sizes, the window and the embedding scale. */
static void cfg_gemma3(struct ms_model_config *c) {
  c->arch = MS_ARCH_GEMMA3;
  c->rope_style = MS_ROPE_NEOX;
  c->rope_base = 1000000.0f;
  c->rope_base_local = 10000.0f;
  c->swa_pattern = 6;
  c->norm_eps = 1e-6f;
  c->qk_norm = 1;
  c->post_norms = 1;
  c->ffn_act = MS_ACT_GELU_TANH;
  c->tied_embeddings = 1;
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
    c->qk_norm = 1;
  } else if (!strcmp(name, "tiny-qwen2")) {
    /* tiny with Qwen2's blocks: biases on q, k and v */
    cfg_tiny(c);
    c->arch = MS_ARCH_QWEN2;
    c->rope_style = MS_ROPE_NEOX;
    c->rope_base = 1000000.0f;
    c->norm_eps = 1e-6f;
    c->qkv_bias = 1;
  } else if (!strcmp(name, "tiny-gemma3")) {
    /* Gemma 3's blocks at tiny size: six layers, so the sixth is global and
     * the first five see a window of 8 positions with their own RoPE base; q
     * heads wider than dim (as Gemma-3-270M's 4 x 256 over 640); a logit cap */
    cfg_tiny(c);
    cfg_gemma3(c);
    c->n_layers = 6;
    c->head_dim = 32;
    c->sliding_window = 8;
    c->embed_scale = sqrtf((float)c->dim);
    c->final_softcap = 20.0f;
  } else if (!strcmp(name, "gemma3-270m")) {
    /* shapes of Gemma-3-270M */
    cfg_gemma3(c);
    c->n_layers = 18;
    c->dim = 640;
    c->ffn_dim = 2048;
    c->n_heads = 4;
    c->n_kv_heads = 1;
    c->head_dim = 256;
    c->vocab = 262144;
    c->sliding_window = 512;
    c->embed_scale = sqrtf((float)c->dim);
    c->bos = 2;
    c->eos = 1;
  } else if (!strcmp(name, "tiny-256")) {
    /* tiny with every matrix width a multiple of 256, for the K-quants */
    cfg_tiny(c);
    c->dim = 256;
    c->ffn_dim = 512;
    c->head_dim = 64;
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
  } else if (!strcmp(name, "llama-3.2-1b")) {
    /* shapes of Llama-3.2-1B (for the simulator; too large to synthesise in tests) */
    c->arch = MS_ARCH_LLAMA;
    c->rope_style = MS_ROPE_NORM;
    c->n_layers = 16;
    c->dim = 2048;
    c->ffn_dim = 8192;
    c->n_heads = 32;
    c->n_kv_heads = 8;
    c->head_dim = 64;
    c->vocab = 128256;
    c->tied_embeddings = 1;
    c->rope_base = 500000.0f;
    c->norm_eps = 1e-5f;
    c->bos = 128000;
    c->eos = 128001;
  } else if (!strcmp(name, "qwen3-8b")) {
    /* shapes of Qwen3-8B */
    c->arch = MS_ARCH_QWEN3;
    c->rope_style = MS_ROPE_NEOX;
    c->n_layers = 36;
    c->dim = 4096;
    c->ffn_dim = 12288;
    c->n_heads = 32;
    c->n_kv_heads = 8;
    c->head_dim = 128;
    c->vocab = 151936;
    c->rope_base = 1000000.0f;
    c->norm_eps = 1e-6f;
    c->qk_norm = 1;
    c->bos = -1;
    c->eos = 151645;
  } else {
    return -ENOENT;
  }
  snprintf(c->name, sizeof c->name, "%s", name);
  c->dtype = dtype;
  return 0;
}

/* One element of a block-format row: block b = c / 32, index j = c % 32. */
static float block_get(enum ms_dtype t, const uint8_t *row, int c) {
  const uint8_t *b = row + (size_t)(c / 32) * ms_dtype_size(t);
  int j = c % 32;
  float d = ms_f16_to_f32((uint16_t)(b[0] | b[1] << 8));
  switch (t) {
  case MS_DTYPE_Q8_0: return d * (float)(int8_t)b[2 + j];
  case MS_DTYPE_Q4_0: return d * (float)((j < 16 ? b[2 + j] & 0xf : b[2 + j - 16] >> 4) - 8);
  case MS_DTYPE_Q4_1: {
    float m = ms_f16_to_f32((uint16_t)(b[2] | b[3] << 8));
    return d * (float)(j < 16 ? b[4 + j] & 0xf : b[4 + j - 16] >> 4) + m;
  }
  default: return 0.0f;
  }
}

float ms_weight_get(const struct ms_weight *w, int r, int c) {
  const uint8_t *row = (const uint8_t *)w->data + (size_t)r * ms_weight_row_bytes(w);
  if (ms_quant_k_handles(w->dtype)) {
    float blk[256];
    int n = ms_dtype_block(w->dtype);
    ms_quant_k_block_f32(w->dtype, row + (size_t)(c / n) * ms_dtype_size(w->dtype), blk);
    return blk[c % n];
  }
  switch (w->dtype) {
  case MS_DTYPE_F32: return ((const float *)row)[c];
  case MS_DTYPE_BF16: return ms_bf16_to_f32(((const uint16_t *)row)[c]);
  case MS_DTYPE_F16: return ms_f16_to_f32(((const uint16_t *)row)[c]);
  default: return block_get(w->dtype, row, c);
  }
}

void ms_weight_row_f32(const struct ms_weight *w, int r, float *out) {
  int blk = ms_dtype_block(w->dtype);
  if (blk == 1) {
    for (int c = 0; c < w->cols; c++) out[c] = ms_weight_get(w, r, c);
    return;
  }
  const uint8_t *b = (const uint8_t *)w->data + (size_t)r * ms_weight_row_bytes(w);
  if (ms_quant_k_handles(w->dtype)) {
    for (int c0 = 0; c0 < w->cols; c0 += blk, b += ms_dtype_size(w->dtype)) ms_quant_k_block_f32(w->dtype, b, out + c0);
    return;
  }
  for (int c0 = 0; c0 < w->cols; c0 += blk, b += ms_dtype_size(w->dtype)) {
    float d = ms_f16_to_f32((uint16_t)(b[0] | b[1] << 8));
    float m = w->dtype == MS_DTYPE_Q4_1 ? ms_f16_to_f32((uint16_t)(b[2] | b[3] << 8)) : 0.0f;
    const uint8_t *qs = b + (w->dtype == MS_DTYPE_Q4_1 ? 4 : 2);
    for (int j = 0; j < blk; j++) {
      if (w->dtype == MS_DTYPE_Q8_0) {
        out[c0 + j] = d * (float)(int8_t)qs[j];
        continue;
      }
      int q = j < blk / 2 ? qs[j] & 0xf : qs[j - blk / 2] >> 4;
      out[c0 + j] = w->dtype == MS_DTYPE_Q4_0 ? d * (float)(q - 8) : d * (float)q + m;
    }
  }
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
  char *cursor;     /* next free byte in storage; NULL: shapes only */
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
  if (!sy->cursor) return;
  if (dt == MS_DTYPE_BF16) {
    uint16_t *p = (uint16_t *)sy->cursor;
    for (size_t i = 0; i < n; i++) p[i] = ms_f32_to_bf16(bias + scale * uniform(&s));
  } else {
    float *p = (float *)sy->cursor;
    for (size_t i = 0; i < n; i++) p[i] = bias + scale * uniform(&s);
  }
  sy->cursor += (n * ms_dtype_size(dt) + 63) & ~(size_t)63;  /* (not reached for shapes only) */
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
  if (c->qkv_bias) layer += mat_bytes(1, q, MS_DTYPE_F32) + 2 * mat_bytes(1, kv, MS_DTYPE_F32);
  if (c->post_norms) layer += 2 * mat_bytes(1, c->dim, MS_DTYPE_F32);
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
      c->head_dim <= 0 || c->head_dim > MS_MAX_HEAD_DIM || c->vocab <= 0 || c->head_dim % 2)
    return 0;
  if (c->n_heads % c->n_kv_heads) return 0;
  if ((unsigned)c->ffn_act >= MS_ACT_COUNT || c->sliding_window < 0 || c->swa_pattern < 0) return 0;
  if (c->n_experts && (c->ffn_act != MS_ACT_SILU || c->post_norms)) return 0;  /* experts are SwiGLU, pre-norm only */
  if (c->n_experts ? (c->top_k <= 0 || c->top_k > c->n_experts || c->expert_ffn_dim <= 0)
                   : c->ffn_dim <= 0)
    return 0;
  return c->dtype == MS_DTYPE_F32 || c->dtype == MS_DTYPE_BF16;
}

static struct ms_model *build(const struct ms_model_config *cfg, uint64_t seed, int shape_only) {
  if (!cfg_valid(cfg)) {
    errno = EINVAL;
    return NULL;
  }
  struct ms_model *m = calloc(1, sizeof *m);
  if (!m) return NULL;
  m->cfg = *cfg;
  m->storage_bytes = shape_only ? 0 : synth_bytes(cfg);
  m->layers = calloc((size_t)cfg->n_layers, sizeof *m->layers);
  if (!shape_only && posix_memalign(&m->storage, 64, m->storage_bytes)) m->storage = NULL;
  if (!m->layers || (!shape_only && !m->storage)) goto fail;

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
    if (c->qkv_bias) {  /* tensors of the optional features come after, so the others keep their numbers */
      synth_matrix(&sy, &L->bq, MS_DTYPE_F32, 1, q, 0.5f, 0.0f);
      synth_matrix(&sy, &L->bk, MS_DTYPE_F32, 1, kv, 0.5f, 0.0f);
      synth_matrix(&sy, &L->bv, MS_DTYPE_F32, 1, kv, 0.5f, 0.0f);
    }
    if (c->post_norms) synth_norm(&sy, &L->attn_post_norm, c->dim);
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
    if (c->post_norms) synth_norm(&sy, &L->ffn_post_norm, c->dim);
  }
  synth_norm(&sy, &m->out_norm, c->dim);
  if (c->tied_embeddings)
    m->lm_head = m->tok_embd;
  else
    synth_proj(&sy, &m->lm_head, dt, c->vocab, c->dim);
  MS_ASSERT(shape_only || (size_t)(sy.cursor - (char *)m->storage) <= m->storage_bytes);
  return m;
fail:
  ms_model_free(m);
  errno = ENOMEM;
  return NULL;
}

struct ms_model *ms_model_synth(const struct ms_model_config *cfg, uint64_t seed) {
  return build(cfg, seed, 0);
}

struct ms_model *ms_model_shape(const struct ms_model_config *cfg) { return build(cfg, 0, 1); }

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
  ms_huge_unmap(m->packed, m->packed_bytes);
  if (m->release) m->release(m->release_arg);
  free(m);
}

/* Matrix i of the 1 + 7 * n_layers a decode step reads through ms_vec_q8_gemv:
 * the LM head, then each layer's (the routed experts' are separate weights). */
static struct ms_weight *matrix(struct ms_model *m, int i) {
  if (i == 0) return &m->lm_head;
  struct ms_layer_weights *L = &m->layers[(i - 1) / 7];
  struct ms_weight *ws[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
  return ws[(i - 1) % 7];
}

static size_t packed_span(const struct ms_weight *w) { return (ms_quant_packed_bytes(w) + 63) & ~(size_t)63; }

/* The matrices repacked by several threads at once, each taking the next
 * matrix not yet taken: a matrix's packed bytes are its own span, so the
 * threads share nothing but the counter. */
struct repack_job {
  struct ms_model *m;
  uint8_t *buf;
  const size_t *at;  /* [n]: each matrix's span in buf */
  int n, copy;       /* copy: the matrices with no packed form too (span_of) */
  atomic_int next;
};

/* A matrix's bytes in the model's buffer: its packed form; or, when the
 * buffer is in huge pages (copy), a matrix this CPU has no packed form for
 * (the 32-value types without AVX-512 VNNI, f16) as the file lays it out. */
static size_t span_of(const struct ms_weight *w, int copy) {
  size_t p = packed_span(w);
  if (p || !copy || !w->data || w->rows <= 0) return p;
  return ((size_t)w->rows * ms_weight_row_bytes(w) + 63) & ~(size_t)63;
}

static void *repack_thread(void *arg) {
  struct repack_job *j = arg;
  for (int i; (i = atomic_fetch_add(&j->next, 1)) < j->n;) {
    struct ms_weight *w = matrix(j->m, i);
    if (packed_span(w)) ms_quant_repack(w, j->buf + j->at[i]);
    else if (span_of(w, j->copy)) memcpy(j->buf + j->at[i], w->data, (size_t)w->rows * ms_weight_row_bytes(w));
  }
  return NULL;
}

/* As many threads as this process may run on (taskset counts), at most 8. */
static int repack_threads(void) {
  cpu_set_t set;
  int n = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
  return n < 1 ? 1 : n > 8 ? 8 : n;
}

/* Packs the model's matrices into one huge-page buffer (copy: those with no
 * packed form too, as the file lays them out), each matrix the groups its
 * packed_g0, packed_gn say: 0, or -ENOMEM with the model unchanged. */
static int pack_all(struct ms_model *m, int copy) {
  int n = 1 + 7 * m->cfg.n_layers;
  size_t total = 0, *at = malloc((size_t)n * sizeof *at);
  if (!at) return -ENOMEM;
  for (int i = 0; i < n; i++) at[i] = total, total += span_of(matrix(m, i), copy);
  uint8_t *buf = total ? ms_huge_map(total) : NULL;
  if (!buf) {
    free(at);
    return total ? -ENOMEM : 0;
  }
  struct repack_job job = {.m = m, .buf = buf, .at = at, .n = n, .copy = copy};
  atomic_init(&job.next, 0);
  pthread_t th[8];
  int started = 0, want = repack_threads();
  while (started < want - 1 && !pthread_create(&th[started], NULL, repack_thread, &job)) started++;
  repack_thread(&job);  /* this thread too; with no other, it does them all */
  for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
  for (int i = 0; i < n; i++) {
    struct ms_weight *w = matrix(m, i);
    if (packed_span(w)) w->packed = buf + at[i];
    else if (span_of(w, copy)) w->data = buf + at[i];  /* the file's bytes, in huge pages */
  }
  free(at);
  m->packed = buf;
  m->packed_bytes = total;
  return 0;
}

/* ms_model_repack's choice: its bytes, and whether it copies the matrices
 * with no packed form too (every matrix whole, whatever its range now). */
static size_t repack_whole(const struct ms_model *m, int *copy) {
  int n = 1 + 7 * m->cfg.n_layers;
  size_t total = 0, all = 0;
  for (int i = 0; i < n; i++) {
    struct ms_weight w = *matrix((struct ms_model *)m, i);
    w.packed_g0 = w.packed_gn = 0;
    total += span_of(&w, 0), all += span_of(&w, 1);
  }
  /* in huge pages, the matrices read as the file lays them out are copied in too */
  *copy = ms_huge_pages_wanted() && all >= MS_HUGE_PAGE /* less gains nothing */ && total < all;
  return *copy ? all : total;
}

size_t ms_model_repack_bytes(const struct ms_model *m) {
  int copy;
  return m->layers ? repack_whole(m, &copy) : 0;
}

/* The packed weights in transparent huge pages (ms_huge_map): a decode step
 * streams every byte of them, and in 4 KiB pages Gemma-3's head alone spans
 * some 35,000 of them, a TLB miss every 4 KiB of the stream. The matrices
 * with no packed form here are copied in too, as the file lays them out (the
 * file's own pages stay small); MEGASCOPE_NO_HUGEPAGES=1: no copies either. */
int ms_model_repack(struct ms_model *m) {
  if (m->packed || !m->layers) return 0;
  int copy;
  repack_whole(m, &copy);
  return pack_all(m, copy);
}

/* The rows of w that rows[0 .. n) name, as whole groups of four rounded out
 * and clipped to w's whole groups: [*g0, *g1), empty when none. */
static void rows_groups(const struct ms_weight *w, const struct ms_weight_rows *rows, int n, int *g0, int *g1) {
  *g0 = *g1 = 0;
  for (int k = 0; k < n; k++)
    if (rows[k].w == w && rows[k].r0 < rows[k].r1) {
      int G = w->rows / 4, a = rows[k].r0 / 4, b = (rows[k].r1 + 3) / 4;
      *g0 = a < 0 ? 0 : a;
      *g1 = b > G ? G : b;
      return;
    }
}

/* A rank packs its rows alone and copies nothing in the file's layout: the
 * copy would be a private copy of those matrices whole (a copy of some rows
 * needs a second pointer in every kernel that reads data), and the file's
 * pages are one copy for every rank of the machine. The groups a rank does
 * not pack are read from data, as the rows after the last whole group are. */
int ms_model_repack_rows(struct ms_model *m, const struct ms_weight_rows *rows, int n) {
  if (m->packed || !m->layers) return 0;
  int nm = 1 + 7 * m->cfg.n_layers;
  for (int i = 0; i < nm; i++) {
    struct ms_weight *w = matrix(m, i);
    int g0, g1;
    rows_groups(w, rows, n, &g0, &g1);
    /* no rows: an empty range packs nothing (ms_quant_packed_bytes is 0) */
    w->packed_g0 = g0;
    w->packed_gn = g1 > g0 ? g1 - g0 : -1;
  }
  int rc = pack_all(m, 0);
  for (int i = 0; i < nm; i++) {
    struct ms_weight *w = matrix(m, i);
    if (!w->packed) w->packed_g0 = w->packed_gn = 0;  /* back to the default: no packed form to describe */
  }
  return rc;
}

static size_t wbytes(const struct ms_weight *w) {
  return w->rows > 0 ? (size_t)w->rows * ms_weight_row_bytes(w) : 0;  /* shapes-only models count too */
}

size_t ms_model_weight_bytes(const struct ms_model *m) {
  size_t b = wbytes(&m->out_norm) + wbytes(&m->lm_head);
  for (int l = 0; l < m->cfg.n_layers; l++) {
    const struct ms_layer_weights *L = &m->layers[l];
    b += wbytes(&L->attn_norm) + wbytes(&L->wq) + wbytes(&L->wk) + wbytes(&L->wv) +
         wbytes(&L->wo) + wbytes(&L->ffn_norm) + wbytes(&L->w_gate) + wbytes(&L->w_up) +
         wbytes(&L->w_down) + wbytes(&L->router) + wbytes(&L->bq) + wbytes(&L->bk) + wbytes(&L->bv) +
         wbytes(&L->attn_post_norm) + wbytes(&L->ffn_post_norm);
    if (m->cfg.qk_norm) b += wbytes(&L->q_norm) + wbytes(&L->k_norm);
    for (int e = 0; e < m->cfg.n_experts; e++)
      b += wbytes(&L->exp_gate[e]) + wbytes(&L->exp_up[e]) + wbytes(&L->exp_down[e]);
  }
  return b;
}
