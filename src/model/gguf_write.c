/* SPDX-License-Identifier: MIT */
/* The GGUF writer (see megascope/gguf.h): metadata and tensors collected in
 * memory, then written in one pass as version 3 with aligned tensor data; and
 * ms_gguf_write_model, which lays out a megascope model under llama.cpp's
 * tensor and key names, quantizing its matrices on the way. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/blocks.h"
#include "model/gguf_impl.h"

struct wtensor {
  char name[GGUF_MAX_NAME];
  uint32_t type;
  int n_dims;
  int64_t ne[4];
  void *data;
  size_t bytes;
};

struct ms_gguf_writer {
  uint8_t *kv;            /* serialized metadata pairs */
  size_t kv_len, kv_cap;
  int n_kv;
  struct wtensor *t;
  int n_t, cap_t;
  uint32_t alignment;
  int err;                /* first failure, reported by write */
};

struct ms_gguf_writer *ms_gguf_writer_new(void) {
  struct ms_gguf_writer *w = calloc(1, sizeof *w);
  if (w) w->alignment = GGUF_DEFAULT_ALIGNMENT;
  return w;
}

void ms_gguf_writer_free(struct ms_gguf_writer *w) {
  if (!w) return;
  for (int i = 0; i < w->n_t; i++) free(w->t[i].data);
  free(w->t);
  free(w->kv);
  free(w);
}

static int put(struct ms_gguf_writer *w, const void *p, size_t n) {
  if (w->err) return w->err;
  if (w->kv_len + n > w->kv_cap) {
    size_t cap = w->kv_cap ? w->kv_cap : 4096;
    while (cap < w->kv_len + n) cap *= 2;
    uint8_t *k = realloc(w->kv, cap);
    if (!k) return w->err = -ENOMEM;
    w->kv = k;
    w->kv_cap = cap;
  }
  memcpy(w->kv + w->kv_len, p, n);
  w->kv_len += n;
  return 0;
}

static int put_u32(struct ms_gguf_writer *w, uint32_t v) { return put(w, &v, 4); }
static int put_u64(struct ms_gguf_writer *w, uint64_t v) { return put(w, &v, 8); }

static int put_str(struct ms_gguf_writer *w, const char *s) {
  size_t n = strlen(s);
  return put_u64(w, n) || put(w, s, n) ? w->err : 0;
}

static int key(struct ms_gguf_writer *w, const char *k, enum ms_gguf_vtype t) {
  if (!k || !*k) return w->err = -EINVAL;
  w->n_kv++;
  return put_str(w, k) || put_u32(w, (uint32_t)t) ? w->err : 0;
}

int ms_gguf_writer_set_alignment(struct ms_gguf_writer *w, uint32_t a) {
  if (!a || (a & (a - 1))) return -EINVAL;
  w->alignment = a;
  return 0;
}

int ms_gguf_writer_add_u32(struct ms_gguf_writer *w, const char *k, uint32_t v) {
  return key(w, k, MS_GGUF_U32) || put_u32(w, v) ? w->err : 0;
}

int ms_gguf_writer_add_i32(struct ms_gguf_writer *w, const char *k, int32_t v) {
  return key(w, k, MS_GGUF_I32) || put(w, &v, 4) ? w->err : 0;
}

int ms_gguf_writer_add_f32(struct ms_gguf_writer *w, const char *k, float v) {
  return key(w, k, MS_GGUF_F32) || put(w, &v, 4) ? w->err : 0;
}

int ms_gguf_writer_add_bool(struct ms_gguf_writer *w, const char *k, int v) {
  uint8_t b = v != 0;
  return key(w, k, MS_GGUF_BOOL) || put(w, &b, 1) ? w->err : 0;
}

int ms_gguf_writer_add_str(struct ms_gguf_writer *w, const char *k, const char *v) {
  return key(w, k, MS_GGUF_STR) || put_str(w, v) ? w->err : 0;
}

static int arr_head(struct ms_gguf_writer *w, const char *k, enum ms_gguf_vtype et, size_t n) {
  return key(w, k, MS_GGUF_ARR) || put_u32(w, (uint32_t)et) || put_u64(w, n) ? w->err : 0;
}

int ms_gguf_writer_add_arr_str(struct ms_gguf_writer *w, const char *k, const char *const *v, size_t n) {
  if (arr_head(w, k, MS_GGUF_STR, n)) return w->err;
  for (size_t i = 0; i < n; i++)
    if (put_str(w, v[i])) return w->err;
  return 0;
}

int ms_gguf_writer_add_arr_i32(struct ms_gguf_writer *w, const char *k, const int32_t *v, size_t n) {
  return arr_head(w, k, MS_GGUF_I32, n) || put(w, v, 4 * n) ? w->err : 0;
}

int ms_gguf_writer_add_arr_f32(struct ms_gguf_writer *w, const char *k, const float *v, size_t n) {
  return arr_head(w, k, MS_GGUF_F32, n) || put(w, v, 4 * n) ? w->err : 0;
}

/* Takes ownership of data (freed on failure too). */
static int add_tensor_owned(struct ms_gguf_writer *w, const char *name, uint32_t type, int n_dims,
                            const int64_t *ne, void *data, size_t bytes) {
  if (w->err || strlen(name) >= GGUF_MAX_NAME || n_dims < 1 || n_dims > 4) {
    free(data);
    return w->err ? w->err : (w->err = -EINVAL);
  }
  if (w->n_t == w->cap_t) {
    int cap = w->cap_t ? 2 * w->cap_t : 64;
    struct wtensor *t = realloc(w->t, sizeof *t * (size_t)cap);
    if (!t) {
      free(data);
      return w->err = -ENOMEM;
    }
    w->t = t;
    w->cap_t = cap;
  }
  struct wtensor *t = &w->t[w->n_t++];
  memset(t, 0, sizeof *t);
  snprintf(t->name, sizeof t->name, "%s", name);
  t->type = type;
  t->n_dims = n_dims;
  for (int d = 0; d < 4; d++) t->ne[d] = d < n_dims ? ne[d] : 1;
  t->data = data;
  t->bytes = bytes;
  return 0;
}

int ms_gguf_writer_add_tensor(struct ms_gguf_writer *w, const char *name, uint32_t type, int n_dims,
                              const int64_t *ne, const void *data, size_t bytes) {
  void *copy = malloc(bytes ? bytes : 1);
  if (!copy) return w->err = -ENOMEM;
  memcpy(copy, data, bytes);
  return add_tensor_owned(w, name, type, n_dims, ne, copy, bytes);
}

static int wfail(struct ms_textbuf *log, const char *path, int err) {
  if (log) ms_textbuf_printf(log, "%s: %s\n", path, ms_strerror(err));
  return err;
}

static int write_all(FILE *f, const void *p, size_t n) { return fwrite(p, 1, n, f) == n ? 0 : -EIO; }

static int write_pad(FILE *f, size_t *pos, size_t a) {
  static const uint8_t zeros[256];
  size_t pad = (a - *pos % a) % a;
  *pos += pad;
  for (; pad; pad -= pad > sizeof zeros ? sizeof zeros : pad)
    if (write_all(f, zeros, pad > sizeof zeros ? sizeof zeros : pad)) return -EIO;
  return 0;
}

static int write_infos(const struct ms_gguf_writer *w, FILE *f, size_t *pos) {
  uint64_t off = 0;
  for (int i = 0; i < w->n_t; i++) {
    const struct wtensor *t = &w->t[i];
    uint64_t len = strlen(t->name), ne[4];
    uint32_t nd = (uint32_t)t->n_dims;
    for (int d = 0; d < 4; d++) ne[d] = (uint64_t)t->ne[d];
    if (write_all(f, &len, 8) || write_all(f, t->name, len) || write_all(f, &nd, 4) ||
        write_all(f, ne, 8 * nd) || write_all(f, &t->type, 4) || write_all(f, &off, 8))
      return -EIO;
    *pos += 8 + len + 4 + 8 * nd + 4 + 8;
    off += (t->bytes + w->alignment - 1) / w->alignment * w->alignment;
  }
  return 0;
}

int ms_gguf_writer_write(const struct ms_gguf_writer *w, const char *path, struct ms_textbuf *log) {
  if (w->err) return wfail(log, path, w->err);
  struct ms_gguf_writer tmp = *w;  /* general.alignment is added to a copy of the metadata */
  uint8_t *extra = NULL;
  if (w->alignment != GGUF_DEFAULT_ALIGNMENT) {
    tmp.kv = NULL, tmp.kv_len = tmp.kv_cap = 0, tmp.n_kv = 0;
    if (put(&tmp, w->kv, w->kv_len) || ms_gguf_writer_add_u32(&tmp, "general.alignment", w->alignment))
      return wfail(log, path, tmp.err);
    extra = tmp.kv;
  }
  FILE *f = fopen(path, "wb");
  if (!f) {
    int e = errno;
    free(extra);
    return wfail(log, path, -e);
  }
  uint32_t hdr[2] = {0x46554747u /* "GGUF" */, 3};
  uint64_t counts[2] = {(uint64_t)w->n_t, (uint64_t)(w->n_kv + (extra ? 1 : 0))};
  size_t pos = 24 + tmp.kv_len;
  int rc = write_all(f, hdr, 8) || write_all(f, counts, 16) || write_all(f, tmp.kv, tmp.kv_len) ? -EIO : 0;
  if (!rc) rc = write_infos(w, f, &pos);
  if (!rc) rc = write_pad(f, &pos, w->alignment);
  for (int i = 0; i < w->n_t && !rc; i++) {
    rc = write_all(f, w->t[i].data, w->t[i].bytes);
    pos += w->t[i].bytes;
    if (!rc) rc = write_pad(f, &pos, w->alignment);
  }
  if (fclose(f) && !rc) rc = -errno;
  free(extra);
  return rc ? wfail(log, path, rc) : 0;
}

/* ---- models ---- */

/* Bytes 0..255 as GPT-2's byte-level BPE spells them: printable Latin-1 bytes
 * stand for themselves, the rest are shifted to U+0100 and up, in order. */
static int byte_unicode(int b) {
  if ((b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff)) return b;
  int n = 0;
  for (int i = 0; i < b; i++)
    if (!((i >= 0x21 && i <= 0x7e) || (i >= 0xa1 && i <= 0xac) || (i >= 0xae && i <= 0xff))) n++;
  return 256 + n;
}

static void utf8_put(char *out, int cp) {
  if (cp < 0x80) {
    out[0] = (char)cp, out[1] = 0;
  } else {
    out[0] = (char)(0xc0 | cp >> 6), out[1] = (char)(0x80 | (cp & 0x3f)), out[2] = 0;
  }
}

static int write_vocab(struct ms_gguf_writer *w, const struct ms_model_config *c) {
  int n = c->vocab;
  char **tok = calloc((size_t)n, sizeof *tok);
  int32_t *type = malloc(sizeof *type * (size_t)n);
  int rc = -ENOMEM;
  if (!tok || !type) goto out;
  for (int i = 0; i < n; i++) {
    if (!(tok[i] = malloc(24))) goto out;
    if (i < 256) utf8_put(tok[i], byte_unicode(i));
    else snprintf(tok[i], 24, "<|%d|>", i);
    type[i] = i < 256 ? 1 /* normal */ : 3 /* control */;
  }
  ms_gguf_writer_add_str(w, "tokenizer.ggml.model", "gpt2");
  ms_gguf_writer_add_str(w, "tokenizer.ggml.pre", "gpt2");
  ms_gguf_writer_add_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)tok, (size_t)n);
  ms_gguf_writer_add_arr_i32(w, "tokenizer.ggml.token_type", type, (size_t)n);
  ms_gguf_writer_add_arr_str(w, "tokenizer.ggml.merges", NULL, 0);
  if (c->bos >= 0) ms_gguf_writer_add_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)c->bos);
  if (c->eos >= 0) ms_gguf_writer_add_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)c->eos);
  rc = ms_gguf_writer_add_bool(w, "tokenizer.ggml.add_bos_token", 0);
out:
  if (tok)
    for (int i = 0; i < n; i++) free(tok[i]);
  free(tok);
  free(type);
  return rc ? rc : w->err;
}

static int write_config(struct ms_gguf_writer *w, const struct ms_model_config *c, enum ms_dtype type) {
  const char *a = ms_arch_name(c->arch);
  char k[96];
  static const uint32_t file_type[MS_DTYPE_COUNT] = {
      [MS_DTYPE_F32] = 0, [MS_DTYPE_F16] = 1, [MS_DTYPE_Q4_0] = 2, [MS_DTYPE_Q4_1] = 3,
      [MS_DTYPE_Q8_0] = 7, [MS_DTYPE_BF16] = 32, [MS_DTYPE_Q5_0] = 8, [MS_DTYPE_Q5_1] = 9,
      [MS_DTYPE_Q2_K] = 10, [MS_DTYPE_Q3_K] = 11, [MS_DTYPE_Q4_K] = 14, [MS_DTYPE_Q5_K] = 16,
      [MS_DTYPE_Q6_K] = 18, [MS_DTYPE_IQ4_NL] = 25, [MS_DTYPE_Q8_K] = 7};
  ms_gguf_writer_add_str(w, "general.architecture", a);
  ms_gguf_writer_add_str(w, "general.name", c->name);
  ms_gguf_writer_add_u32(w, "general.file_type", file_type[type]);
  ms_gguf_writer_add_u32(w, "general.quantization_version", 2);
#define KU(name, v) (snprintf(k, sizeof k, "%s." name, a), ms_gguf_writer_add_u32(w, k, (uint32_t)(v)))
#define KF(name, v) (snprintf(k, sizeof k, "%s." name, a), ms_gguf_writer_add_f32(w, k, (v)))
  KU("context_length", 4096);
  KU("embedding_length", c->dim);
  KU("block_count", c->n_layers);
  KU("feed_forward_length", c->ffn_dim);
  KU("attention.head_count", c->n_heads);
  KU("attention.head_count_kv", c->n_kv_heads);
  KU("attention.key_length", c->head_dim);
  KU("attention.value_length", c->head_dim);
  KU("rope.dimension_count", c->head_dim);
  KU("vocab_size", c->vocab);
  KF("rope.freq_base", c->rope_base);
  KF("attention.layer_norm_rms_epsilon", c->norm_eps);
  if (c->arch == MS_ARCH_GEMMA3) {
    KU("attention.sliding_window", c->sliding_window);
    if (c->final_softcap > 0) KF("final_logit_softcapping", c->final_softcap);
  }
#undef KU
#undef KF
  return write_vocab(w, c);
}

/* Quantizes w (read as f32 through ms_weight_row_f32) to `type`, row by row. */
static int put_weight(struct ms_gguf_writer *gw, const char *name, const struct ms_weight *w, enum ms_dtype type,
                      int vec) {
  if (vec) type = MS_DTYPE_F32;
  size_t rb = ms_dtype_row_bytes(type, w->cols);
  if (w->cols % ms_dtype_block(type)) return gw->err = -EINVAL;
  uint8_t *out = malloc(rb * (size_t)w->rows + 1);
  float *row = malloc(sizeof(float) * (size_t)w->cols);
  if (!out || !row) {
    free(out);
    free(row);
    return gw->err = -ENOMEM;
  }
  for (int r = 0; r < w->rows; r++) {
    ms_weight_row_f32(w, r, row);
    ms_quant_row(type, row, w->cols, out + (size_t)r * rb);
  }
  free(row);
  int64_t ne[2] = {w->cols, w->rows};
  return add_tensor_owned(gw, name, ms_gguf_dtype_type(type), vec ? 1 : 2, ne, out, rb * (size_t)w->rows);
}

static int write_weights(struct ms_gguf_writer *gw, const struct ms_model *m, enum ms_dtype type) {
  const struct ms_model_config *c = &m->cfg;
  char n[GGUF_MAX_NAME];
  put_weight(gw, "token_embd.weight", &m->tok_embd, type, 0);
  for (int l = 0; l < c->n_layers; l++) {
    const struct ms_layer_weights *L = &m->layers[l];
#define P(suffix, field, vec) (snprintf(n, sizeof n, "blk.%d." suffix, l), put_weight(gw, n, &L->field, type, vec))
    P("attn_norm.weight", attn_norm, 1);
    P("attn_q.weight", wq, 0);
    P("attn_k.weight", wk, 0);
    P("attn_v.weight", wv, 0);
    if (c->qkv_bias) {
      P("attn_q.bias", bq, 1);
      P("attn_k.bias", bk, 1);
      P("attn_v.bias", bv, 1);
    }
    if (c->qk_norm) {
      P("attn_q_norm.weight", q_norm, 1);
      P("attn_k_norm.weight", k_norm, 1);
    }
    P("attn_output.weight", wo, 0);
    if (c->post_norms) P("post_attention_norm.weight", attn_post_norm, 1);
    P("ffn_norm.weight", ffn_norm, 1);
    P("ffn_gate.weight", w_gate, 0);
    P("ffn_up.weight", w_up, 0);
    P("ffn_down.weight", w_down, 0);
    if (c->post_norms) P("post_ffw_norm.weight", ffn_post_norm, 1);
#undef P
  }
  put_weight(gw, "output_norm.weight", &m->out_norm, type, 1);
  if (!c->tied_embeddings) put_weight(gw, "output.weight", &m->lm_head, type, 0);
  return gw->err;
}

int ms_gguf_write_model(const struct ms_model *m, enum ms_dtype type, const char *path, struct ms_textbuf *log) {
  const struct ms_model_config *c = &m->cfg;
  if ((unsigned)type >= MS_DTYPE_COUNT) return wfail(log, path, -EINVAL);
  if (c->n_experts) {
    if (log) ms_textbuf_printf(log, "%s: model '%s': mixture-of-experts models have no GGUF form here\n", path, c->name);
    return -MS_E_UNSUPP;
  }
  int blk = ms_dtype_block(type);
  if (c->dim % blk || c->ffn_dim % blk || (c->n_heads * c->head_dim) % blk) {
    if (log)
      ms_textbuf_printf(log, "%s: model '%s': matrix widths (%d, %d, %d) are not multiples of the %s block (%d)\n",
                        path, c->name, c->dim, c->ffn_dim, c->n_heads * c->head_dim, ms_dtype_name(type), blk);
    return -EINVAL;
  }
  struct ms_gguf_writer *w = ms_gguf_writer_new();
  if (!w) return wfail(log, path, -ENOMEM);
  int rc = write_config(w, c, type);
  if (!rc) rc = write_weights(w, m, type);
  rc = rc ? wfail(log, path, rc) : ms_gguf_writer_write(w, path, log);
  ms_gguf_writer_free(w);
  return rc;
}
