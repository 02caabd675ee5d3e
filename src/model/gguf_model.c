/* SPDX-License-Identifier: MIT */
/* Models from GGUF files: the configuration from `<arch>.*` metadata, the
 * weights from llama.cpp's tensor names, pointing into the mapping.
 *
 * GGUF stores a matrix of `rows` outputs by `cols` inputs with ne = [cols, rows]
 * (ne[0] contiguous), which is exactly megascope's row-major (rows, cols), so no
 * weight is transposed or copied. Architectures: `llama` (RoPE on adjacent
 * pairs, as llama.cpp's convert script permutes q/k for it), `qwen2` (NEOX
 * pairs, biases on q, k and v), `qwen3` (NEOX pairs, per-head q/k RMSNorm) and
 * `gemma3` (NEOX, q/k norm, post-attention and post-FFN norms, GeGLU, embeddings
 * scaled by sqrt(dim), a global layer every sixth between sliding-window ones
 * whose RoPE base is 10000, as llama.cpp's gemma3 graph has them). Gemma's
 * RMSNorm multiplies by (1 + w); llama.cpp's convert script adds the 1 to every
 * `*norm.weight` it writes, so a GGUF norm is applied as it is, like llama's.
 * Every rejection names the key or the tensor. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "megascope/tokenizer.h"
#include "model/gguf_impl.h"

struct loader {
  struct ms_gguf *g;
  struct ms_textbuf *log;
  char arch[16];
  int err;                       /* first error (negative errno) */
};

__attribute__((format(printf, 3, 4))) static int lfail(struct loader *L, int err, const char *fmt, ...) {
  if (!L->err) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (L->log) ms_textbuf_printf(L->log, "%s\n", msg);
    L->err = err;
  }
  return err;
}

/* `<arch>.<name>` as an integer in [lo, hi]; `def` when absent and def >= lo. */
static int arch_int(struct loader *L, const char *name, long lo, long hi, long def, int *out) {
  char key[128];
  int64_t v;
  snprintf(key, sizeof key, "%s.%s", L->arch, name);
  int rc = ms_gguf_get_int(L->g, key, &v);
  if (rc == -ENOENT && def >= lo) {
    *out = (int)def;
    return 0;
  }
  if (rc == -ENOENT) return lfail(L, -MS_E_FORMAT, "key '%s': missing", key);
  if (rc) return lfail(L, -MS_E_FORMAT, "key '%s': not an integer", key);
  if (v < lo || v > hi) return lfail(L, -MS_E_FORMAT, "key '%s': %lld is out of range [%ld, %ld]", key, (long long)v, lo, hi);
  *out = (int)v;
  return 0;
}

static int arch_float(struct loader *L, const char *name, double def, int required, float *out) {
  char key[128];
  double v;
  snprintf(key, sizeof key, "%s.%s", L->arch, name);
  int rc = ms_gguf_get_float(L->g, key, &v);
  if (rc == -ENOENT && !required) {
    *out = (float)def;
    return 0;
  }
  if (rc == -ENOENT) return lfail(L, -MS_E_FORMAT, "key '%s': missing", key);
  if (rc || !(v > 0)) return lfail(L, -MS_E_FORMAT, "key '%s': not a positive float", key);
  *out = (float)v;
  return 0;
}

/* "llama, qwen3, ..." from ms_arch_name's table, for the refusal. */
static const char *arch_list(char *buf, size_t size) {
  size_t o = 0;
  buf[0] = '\0';
  for (int a = 0; a < MS_ARCH_COUNT && o < size; a++)
    o += (size_t)snprintf(buf + o, size - o, "%s%s", a ? ", " : "", ms_arch_name((enum ms_arch)a));
  return buf;
}

static int read_arch(struct loader *L, struct ms_model_config *c) {
  const char *s;
  size_t n;
  char list[128];
  int rc = ms_gguf_get_str(L->g, "general.architecture", &s, &n);
  if (rc) return lfail(L, -MS_E_FORMAT, "key 'general.architecture': %s", rc == -ENOENT ? "missing" : "not a string");
  int a = 0;
  while (a < MS_ARCH_COUNT && !(strlen(ms_arch_name((enum ms_arch)a)) == n && !memcmp(s, ms_arch_name((enum ms_arch)a), n)))
    a++;
  if (a == MS_ARCH_COUNT)
    return lfail(L, -MS_E_UNSUPP, "key 'general.architecture': architecture '%.*s' is not supported (supported: %s)",
                 (int)(n < 40 ? n : 40), s, arch_list(list, sizeof list));
  c->arch = (enum ms_arch)a;
  c->rope_style = c->arch == MS_ARCH_LLAMA ? MS_ROPE_NORM : MS_ROPE_NEOX;
  c->qk_norm = c->arch == MS_ARCH_QWEN3 || c->arch == MS_ARCH_GEMMA3;
  c->qkv_bias = c->arch == MS_ARCH_QWEN2;
  if (c->arch == MS_ARCH_GEMMA3) {
    c->post_norms = 1;
    c->ffn_act = MS_ACT_GELU_TANH;
    c->swa_pattern = 6;            /* llama.cpp: set_swa_pattern(6), rope_freq_base_train_swa 10000 */
    c->rope_base_local = 10000.0f;
  }
  memcpy(L->arch, s, n);
  L->arch[n] = '\0';
  return 0;
}

/* Rope scaling and experts change the maths; refuse them rather than run wrong. */
static int check_unsupported(struct loader *L) {
  char key[128];
  const char *s;
  size_t n;
  int64_t v;
  snprintf(key, sizeof key, "%s.rope.scaling.type", L->arch);
  if (!ms_gguf_get_str(L->g, key, &s, &n) && !(n == 4 && !memcmp(s, "none", 4)))
    return lfail(L, -MS_E_UNSUPP, "key '%s': rope scaling '%.*s' is not supported", key, (int)(n < 20 ? n : 20), s);
  snprintf(key, sizeof key, "%s.expert_count", L->arch);
  if (!ms_gguf_get_int(L->g, key, &v) && v > 0)
    return lfail(L, -MS_E_UNSUPP, "key '%s': mixture-of-experts files are not supported", key);
  if (ms_gguf_find_tensor(L->g, "rope_freqs.weight"))
    return lfail(L, -MS_E_UNSUPP, "tensor 'rope_freqs.weight': per-dimension rope frequencies are not supported");
  return 0;
}

/* gemma3's own keys: the window (required, as llama.cpp reads it), the logit
 * cap (optional); the embedding scale and the attention scale as llama.cpp's
 * gemma3 graph sets them (its 27B, 62 layers, scales by 1/sqrt(dim / heads)). */
static int read_gemma3(struct loader *L, struct ms_model_config *c) {
  if (arch_int(L, "attention.sliding_window", 1, 1 << 24, -1, &c->sliding_window) ||
      arch_float(L, "final_logit_softcapping", 0.0, 0, &c->final_softcap))
    return L->err;
  c->embed_scale = sqrtf((float)c->dim);
  if (c->n_layers == 62) c->attn_scale = 1.0f / sqrtf((float)(c->dim / c->n_heads));
  return 0;
}

static int read_config(struct loader *L, struct ms_model_config *c) {
  if (read_arch(L, c) || check_unsupported(L)) return L->err;
  const char *s;
  size_t n;
  if (!ms_gguf_get_str(L->g, "general.name", &s, &n) && n)
    snprintf(c->name, sizeof c->name, "%.*s", (int)(n < sizeof c->name ? n : sizeof c->name - 1), s);
  else
    snprintf(c->name, sizeof c->name, "%s", L->arch);
  int rot = 0;
  if (arch_int(L, "embedding_length", 1, 1 << 16, -1, &c->dim) ||
      arch_int(L, "block_count", 1, 4096, -1, &c->n_layers) ||
      arch_int(L, "feed_forward_length", 1, 1 << 18, -1, &c->ffn_dim) ||
      arch_int(L, "attention.head_count", 1, 1024, -1, &c->n_heads) ||
      arch_int(L, "attention.head_count_kv", 1, 1024, c->n_heads, &c->n_kv_heads) ||
      arch_int(L, "attention.key_length", 2, 4096, c->dim / c->n_heads, &c->head_dim) ||
      arch_float(L, "attention.layer_norm_rms_epsilon", 0, 1, &c->norm_eps) ||
      arch_float(L, "rope.freq_base", 10000.0, 0, &c->rope_base) ||
      arch_int(L, "context_length", 0, 1 << 24, 0, &c->ctx_train))
    return L->err;
  int vlen;
  if (arch_int(L, "attention.value_length", 2, 4096, c->head_dim, &vlen) ||
      arch_int(L, "rope.dimension_count", 2, 4096, c->head_dim, &rot))
    return L->err;
  if (vlen != c->head_dim)
    return lfail(L, -MS_E_UNSUPP, "key '%s.attention.value_length': %d differs from the key length %d", L->arch, vlen, c->head_dim);
  if (rot != c->head_dim)
    return lfail(L, -MS_E_UNSUPP, "key '%s.rope.dimension_count': partial rotary (%d of %d) is not supported", L->arch, rot, c->head_dim);
  if (c->head_dim % 2) return lfail(L, -MS_E_FORMAT, "key '%s.attention.key_length': %d is odd", L->arch, c->head_dim);
  if (c->head_dim > MS_MAX_HEAD_DIM)
    return lfail(L, -MS_E_UNSUPP, "key '%s.attention.key_length': %d is above the %d the kernels take", L->arch,
                 c->head_dim, MS_MAX_HEAD_DIM);
  if (c->n_heads % c->n_kv_heads)
    return lfail(L, -MS_E_FORMAT, "key '%s.attention.head_count_kv': %d does not divide %d heads", L->arch, c->n_kv_heads, c->n_heads);
  if (c->arch == MS_ARCH_GEMMA3 && read_gemma3(L, c)) return L->err;
  const struct ms_gguf_tensor *e = ms_gguf_find_tensor(L->g, "token_embd.weight");
  if (!e) return lfail(L, -MS_E_FORMAT, "tensor 'token_embd.weight': missing");
  if (arch_int(L, "vocab_size", 1, 1 << 24, e->ne[1] <= (1 << 24) ? (long)e->ne[1] : -1, &c->vocab)) return L->err;
  int64_t id;
  c->bos = !ms_gguf_get_int(L->g, "tokenizer.ggml.bos_token_id", &id) && id >= 0 && id < c->vocab ? (int)id : -1;
  c->eos = !ms_gguf_get_int(L->g, "tokenizer.ggml.eos_token_id", &id) && id >= 0 && id < c->vocab ? (int)id : -1;
  return 0;
}

/* Binds tensor `name` of shape (rows, cols) to w; norms (rows 0) must be f32 vectors. */
static int bind(struct loader *L, struct ms_weight *w, const char *name, int rows, int cols) {
  const struct ms_gguf_tensor *t = ms_gguf_find_tensor(L->g, name);
  if (!t) return lfail(L, -MS_E_FORMAT, "tensor '%s': missing", name);
  int vec = rows == 0;
  int64_t want1 = vec ? 1 : rows;
  if (t->ne[0] != cols || t->ne[1] != want1 || t->ne[2] != 1 || t->ne[3] != 1 || (vec && t->n_dims != 1))
    return lfail(L, -MS_E_FORMAT, "tensor '%s': shape [%lld, %lld, %lld, %lld], expected [%d, %lld]", name,
                 (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2], (long long)t->ne[3], cols,
                 (long long)want1);
  enum ms_dtype dt;
  if (ms_gguf_type_dtype(t->type, &dt))
    return lfail(L, -MS_E_UNSUPP, "tensor '%s': type %s (%u) is not supported (supported: " MS_GGUF_SUPPORTED_TYPES ")",
                 name, ms_gguf_type_name(t->type), t->type);
  if (vec && dt != MS_DTYPE_F32)
    return lfail(L, -MS_E_UNSUPP, "tensor '%s': a norm weight of type %s (only f32)", name, ms_gguf_type_name(t->type));
  if ((uintptr_t)t->data % (dt == MS_DTYPE_F32 ? 4 : 2))
    return lfail(L, -MS_E_FORMAT, "tensor '%s': data misaligned for %s", name, ms_gguf_type_name(t->type));
  *w = (struct ms_weight){.dtype = dt, .rows = vec ? 1 : rows, .cols = cols, .data = t->data};
  return 0;
}

static int bind_layer(struct loader *L, const struct ms_model_config *c, int l, struct ms_layer_weights *W) {
  int q = c->n_heads * c->head_dim, kv = c->n_kv_heads * c->head_dim;
  char n[GGUF_MAX_NAME + 16];
#define B(field, suffix, rows, cols) \
  (snprintf(n, sizeof n, "blk.%d." suffix, l), bind(L, &W->field, n, rows, cols))
  if (B(attn_norm, "attn_norm.weight", 0, c->dim) || B(wq, "attn_q.weight", q, c->dim) ||
      B(wk, "attn_k.weight", kv, c->dim) || B(wv, "attn_v.weight", kv, c->dim) ||
      B(wo, "attn_output.weight", c->dim, q) || B(ffn_norm, "ffn_norm.weight", 0, c->dim) ||
      B(w_gate, "ffn_gate.weight", c->ffn_dim, c->dim) || B(w_up, "ffn_up.weight", c->ffn_dim, c->dim) ||
      B(w_down, "ffn_down.weight", c->dim, c->ffn_dim))
    return L->err;
  if (c->qk_norm &&
      (B(q_norm, "attn_q_norm.weight", 0, c->head_dim) || B(k_norm, "attn_k_norm.weight", 0, c->head_dim)))
    return L->err;
  if (c->qkv_bias && (B(bq, "attn_q.bias", 0, q) || B(bk, "attn_k.bias", 0, kv) || B(bv, "attn_v.bias", 0, kv)))
    return L->err;
  if (c->post_norms && (B(attn_post_norm, "post_attention_norm.weight", 0, c->dim) ||
                        B(ffn_post_norm, "post_ffw_norm.weight", 0, c->dim)))
    return L->err;
#undef B
  /* what this architecture does not apply: refused rather than ignored */
  static const char *const extra[] = {"attn_q.bias", "attn_k.bias", "attn_v.bias", "attn_output.bias",
                                      "ffn_gate.bias", "ffn_up.bias", "ffn_down.bias"};
  for (size_t i = c->qkv_bias ? 3 : 0; i < sizeof extra / sizeof extra[0]; i++) {
    snprintf(n, sizeof n, "blk.%d.%s", l, extra[i]);
    if (ms_gguf_find_tensor(L->g, n))
      return lfail(L, -MS_E_UNSUPP, "tensor '%s': biases are not supported for '%s' (only qwen2's q, k and v biases)",
                   n, L->arch);
  }
  return 0;
}

static void release_gguf(void *g) { ms_gguf_free(g); }

static struct ms_model *model_new(struct ms_gguf *g, unsigned flags, struct ms_textbuf *log) {
  struct loader L = {.g = g, .log = log};
  struct ms_model *m = calloc(1, sizeof *m);
  if (!m) return NULL;
  struct ms_model_config *c = &m->cfg;
  if (read_config(&L, c)) goto fail;
  if (!(m->layers = calloc((size_t)c->n_layers, sizeof *m->layers))) {
    L.err = -ENOMEM;
    goto fail;
  }
  if (bind(&L, &m->tok_embd, "token_embd.weight", c->vocab, c->dim) ||
      bind(&L, &m->out_norm, "output_norm.weight", 0, c->dim))
    goto fail;
  c->tied_embeddings = !ms_gguf_find_tensor(g, "output.weight");
  if (c->tied_embeddings) m->lm_head = m->tok_embd;
  else if (bind(&L, &m->lm_head, "output.weight", c->vocab, c->dim)) goto fail;
  for (int l = 0; l < c->n_layers; l++)
    if (bind_layer(&L, c, l, &m->layers[l])) goto fail;
  c->dtype = m->layers[0].wq.dtype;  /* the type of the matrices (tile sizes follow it) */
  m->release = release_gguf;
  m->release_arg = ms_gguf_ref(g);
  /* the faster layouts this CPU has (MEGASCOPE_NO_REPACK=1: not, to save their
   * memory); without the memory for them the file's own layout serves, slower */
  const char *no = getenv("MEGASCOPE_NO_REPACK");
  if (!(flags & MS_GGUF_LOAD_UNPACKED) && !(no && *no && strcmp(no, "0")) && ms_model_repack(m) && log)
    ms_textbuf_printf(log, "gguf: no memory to repack the weights; using them as stored\n");
  return m;
fail:
  ms_model_free(m);
  errno = -L.err;
  return NULL;
}

struct ms_model *ms_gguf_model_new(struct ms_gguf *g, struct ms_textbuf *log) { return model_new(g, 0, log); }

int ms_gguf_load(const char *path, struct ms_model **model, struct ms_tokenizer **tok, struct ms_textbuf *log) {
  return ms_gguf_load_flags(path, 0, model, tok, log);
}

int ms_gguf_load_flags(const char *path, unsigned flags, struct ms_model **model, struct ms_tokenizer **tok,
                       struct ms_textbuf *log) {
  *model = NULL;
  if (tok) *tok = NULL;
  struct ms_gguf *g = ms_gguf_open(path, log);
  if (!g) return -errno;
  int rc = 0;
  *model = model_new(g, flags, log);
  if (!*model) rc = -errno;
  else if (tok && !(*tok = ms_tokenizer_gguf_new(g, log))) rc = -errno;
  if (rc) {
    ms_model_free(*model);
    *model = NULL;
  }
  ms_gguf_free(g);  /* the model holds its own reference */
  return rc;
}
