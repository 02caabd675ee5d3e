/* SPDX-License-Identifier: MIT */
/* GGUF: the writer and reader round trip (metadata of every type, alignment,
 * tensors), synthetic presets written in every weight type and loaded back
 * (configuration, weights, tokenizer, and the engine's logits against the
 * reference forward on the loaded model), and malformed files, each rejected
 * with a message that names the key or tensor and the offset. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernels/quant.h"
#include "model/blocks.h"
#include "megascope/engine.h"
#include "megascope/gguf.h"
#include "megascope/reference.h"
#include "megascope/tokenizer.h"
#include "test.h"

static char tmpdir[256];

static const char *tmp_path(const char *name) {
  static char p[4][512];  /* a few may be live at once */
  static int k;
  k = (k + 1) % 4;
  snprintf(p[k], sizeof p[k], "%s/%s", tmpdir, name);
  return p[k];
}

/* ---- writer/reader round trip ---- */

static void test_metadata(void) {
  struct ms_gguf_writer *w = ms_gguf_writer_new();
  const char *strs[] = {"a", "", "tr\xc3\xa8s"};
  int32_t ints[] = {-5, 7, 1 << 30};
  float fl[] = {0.5f, -2.0f};
  CHECK(ms_gguf_writer_set_alignment(w, 48) == -EINVAL);
  CHECK(ms_gguf_writer_set_alignment(w, 64) == 0);
  ms_gguf_writer_add_u32(w, "k.u32", 4000000000u);
  ms_gguf_writer_add_i32(w, "k.i32", -12);
  ms_gguf_writer_add_f32(w, "k.f32", 0.25f);
  ms_gguf_writer_add_bool(w, "k.bool", 1);
  ms_gguf_writer_add_str(w, "k.str", "hello");
  ms_gguf_writer_add_arr_str(w, "k.astr", strs, 3);
  ms_gguf_writer_add_arr_i32(w, "k.ai32", ints, 3);
  ms_gguf_writer_add_arr_f32(w, "k.af32", fl, 2);
  float t1[64 * 3];
  for (int i = 0; i < 64 * 3; i++) t1[i] = (float)i;
  uint8_t q[3 * 20];
  for (int r = 0; r < 3; r++) ms_quant_row(MS_DTYPE_Q4_1, t1 + 32 * r, 32, q + 20 * r);
  int64_t ne1[2] = {64, 3}, ne2[2] = {32, 3};
  ms_gguf_writer_add_tensor(w, "t.f32", MS_GGML_F32, 2, ne1, t1, sizeof t1);
  ms_gguf_writer_add_tensor(w, "t.q41", MS_GGML_Q4_1, 2, ne2, q, sizeof q);
  char buf[1024] = "";
  struct ms_textbuf log = {buf, sizeof buf, 0, 0};
  CHECKF(ms_gguf_writer_write(w, tmp_path("meta.gguf"), &log) == 0, "%s", buf);
  ms_gguf_writer_free(w);

  struct ms_gguf *g = ms_gguf_open(tmp_path("meta.gguf"), &log);
  CHECKF(g != NULL, "%s", buf);
  if (!g) return;
  int64_t iv;
  double fv;
  int bv;
  const char *s;
  size_t n;
  enum ms_gguf_vtype et;
  uint64_t cnt;
  CHECK(ms_gguf_version(g) == 3 && ms_gguf_alignment(g) == 64 && ms_gguf_data_offset(g) % 64 == 0);
  CHECK(ms_gguf_get_int(g, "k.u32", &iv) == 0 && iv == 4000000000ll);
  CHECK(ms_gguf_get_int(g, "k.i32", &iv) == 0 && iv == -12);
  CHECK(ms_gguf_get_float(g, "k.f32", &fv) == 0 && fv == 0.25);
  CHECK(ms_gguf_get_int(g, "k.f32", &iv) == -MS_E_FORMAT);
  CHECK(ms_gguf_get_float(g, "k.u32", &fv) == -MS_E_FORMAT);
  CHECK(ms_gguf_get_bool(g, "k.bool", &bv) == 0 && bv == 1);
  CHECK(ms_gguf_get_str(g, "k.str", &s, &n) == 0 && n == 5 && !memcmp(s, "hello", 5));
  CHECK(ms_gguf_get_str(g, "k.none", &s, &n) == -ENOENT);
  CHECK(ms_gguf_get_arr(g, "k.astr", &et, &cnt) == 0 && et == MS_GGUF_STR && cnt == 3);
  CHECK(ms_gguf_arr_str(g, "k.astr", 2, &s, &n) == 0 && n == 5 && !memcmp(s, "tr\xc3\xa8s", 5));
  CHECK(ms_gguf_arr_str(g, "k.astr", 1, &s, &n) == 0 && n == 0);
  CHECK(ms_gguf_arr_str(g, "k.astr", 3, &s, &n) == -ERANGE);
  CHECK(ms_gguf_arr_int(g, "k.ai32", 2, &iv) == 0 && iv == 1 << 30);
  CHECK(ms_gguf_arr_int(g, "k.ai32", 0, &iv) == 0 && iv == -5);
  CHECK(ms_gguf_arr_float(g, "k.af32", 1, &fv) == 0 && fv == -2.0);
  CHECK(ms_gguf_arr_int(g, "k.astr", 0, &iv) == -MS_E_FORMAT);
  char v[64];
  ms_gguf_kv_format(g, ms_gguf_find_kv(g, "k.astr"), v, sizeof v);
  CHECKF(!strcmp(v, "[3 x str]"), "%s", v);
  ms_gguf_kv_format(g, ms_gguf_find_kv(g, "k.str"), v, sizeof v);
  CHECKF(!strcmp(v, "'hello'"), "%s", v);
  CHECK(ms_gguf_find_kv(g, "general.alignment") >= 0);  /* written for a non-default alignment */
  const struct ms_gguf_tensor *a = ms_gguf_find_tensor(g, "t.f32"), *b = ms_gguf_find_tensor(g, "t.q41");
  CHECK(a && b && !ms_gguf_find_tensor(g, "t.none"));
  if (a && b) {
    CHECK(a->type == MS_GGML_F32 && a->ne[0] == 64 && a->ne[1] == 3 && a->bytes == sizeof t1);
    CHECK(!memcmp(a->data, t1, sizeof t1) && (uintptr_t)a->data % 64 == 0 && (uintptr_t)b->data % 64 == 0);
    CHECK(b->bytes == sizeof q && !memcmp(b->data, q, sizeof q));
  }
  ms_gguf_free(g);
}

/* ---- presets round trip ---- */

static double max_diff(const float *a, const float *b, size_t n) {
  double d = 0;
  for (size_t i = 0; i < n; i++) d = fmax(d, fabs((double)a[i] - b[i]));
  return d;
}

/* Engine logits of a short sequence (two requests, teacher-forced) against the reference. */
static double engine_vs_reference(const struct ms_model *m) {
  struct ms_engine_opts eo = {.sz = sizeof eo, .n_workers = 2, .max_batch = 2, .max_ctx = 32};
  struct ms_engine *e = ms_engine_new(m, &eo, NULL);
  if (!e) return INFINITY;
  int32_t prompt[2][5] = {{1, 200, 7, 33, 90}, {5, 6}};
  int np[2] = {5, 2};
  struct ms_request *r[2];
  for (int i = 0; i < 2; i++) {
    struct ms_request_opts ro = {.sz = sizeof ro, .prompt = prompt[i], .n_prompt = np[i], .max_new_tokens = 6,
                                 .record_logits = 1};
    r[i] = ms_engine_submit(e, &ro);
  }
  double worst = 0;
  int V = m->cfg.vocab;
  float *lg = malloc(sizeof(float) * (size_t)V);
  for (int i = 0; i < 2; i++) {
    if (!r[i] || ms_request_wait(r[i], 60000)) {
      worst = INFINITY;
      continue;
    }
    struct ms_request_info info;
    ms_request_get_info(r[i], &info);
    struct ms_ref *ref = ms_ref_new(m, 32);
    for (int p = 0; p < info.n_logits; p++) {
      int tok = p < np[i] ? prompt[i][p] : info.tokens[p - np[i]];
      ms_ref_step(ref, tok, lg);
      worst = fmax(worst, max_diff(lg, info.logits + (size_t)p * V, (size_t)V));
    }
    ms_ref_free(ref);
  }
  free(lg);
  for (int i = 0; i < 2; i++) ms_request_free(r[i]);
  ms_engine_free(e);
  return worst;
}

/* The largest |loaded - original| over a matrix, relative to its largest |original|. */
static double weight_err(const struct ms_weight *loaded, const struct ms_weight *orig) {
  double d = 0, mag = 1e-30;
  for (int r = 0; r < orig->rows; r++)
    for (int c = 0; c < orig->cols; c++) {
      double o = ms_weight_get(orig, r, c);
      d = fmax(d, fabs(ms_weight_get(loaded, r, c) - o));
      mag = fmax(mag, fabs(o));
    }
  return d / mag;
}

static void test_preset(const char *preset, int tied, enum ms_dtype type) {
  struct ms_model_config cfg;
  ms_preset_config(preset, MS_DTYPE_F32, &cfg);
  cfg.tied_embeddings = tied;
  struct ms_model *orig = ms_model_synth(&cfg, 3);
  char buf[2048] = "", name[96];
  struct ms_textbuf log = {buf, sizeof buf, 0, 0};
  snprintf(name, sizeof name, "%s-%d-%s.gguf", preset, tied, ms_dtype_name(type));
  CHECKF(ms_gguf_write_model(orig, type, tmp_path(name), &log) == 0, "%s: %s", name, buf);
  struct ms_model *m = NULL;
  struct ms_tokenizer *tok = NULL;
  int rc = ms_gguf_load(tmp_path(name), &m, &tok, &log);
  CHECKF(rc == 0, "%s: %s", name, buf);
  if (rc) {
    ms_model_free(orig);
    return;
  }
  const struct ms_model_config *c = &m->cfg;
  CHECKF(c->arch == cfg.arch && c->rope_style == cfg.rope_style && c->n_layers == cfg.n_layers && c->dim == cfg.dim &&
             c->ffn_dim == cfg.ffn_dim && c->n_heads == cfg.n_heads && c->n_kv_heads == cfg.n_kv_heads &&
             c->head_dim == cfg.head_dim && c->vocab == cfg.vocab && c->tied_embeddings == tied &&
             c->rope_base == cfg.rope_base && c->norm_eps == cfg.norm_eps && c->bos == cfg.bos && c->eos == cfg.eos &&
             c->dtype == type && !strcmp(c->name, preset) && c->qk_norm == cfg.qk_norm &&
             c->qkv_bias == cfg.qkv_bias && c->post_norms == cfg.post_norms && c->ffn_act == cfg.ffn_act &&
             c->embed_scale == cfg.embed_scale && c->attn_scale == cfg.attn_scale &&
             c->sliding_window == cfg.sliding_window && c->swa_pattern == cfg.swa_pattern &&
             c->rope_base_local == cfg.rope_base_local && c->final_softcap == cfg.final_softcap,
         "%s: configuration differs", name);
  /* the optional tensors: f32 and exact when the architecture has them */
  const struct ms_weight *opt[][2] = {{&m->layers[1].bq, &orig->layers[1].bq}, {&m->layers[1].bv, &orig->layers[1].bv},
                                      {&m->layers[1].q_norm, &orig->layers[1].q_norm},
                                      {&m->layers[1].attn_post_norm, &orig->layers[1].attn_post_norm},
                                      {&m->layers[1].ffn_post_norm, &orig->layers[1].ffn_post_norm}};
  int has[] = {cfg.qkv_bias, cfg.qkv_bias, cfg.qk_norm, cfg.post_norms, cfg.post_norms};
  for (size_t i = 0; i < sizeof has / sizeof has[0]; i++)
    CHECKF(has[i] ? opt[i][0]->data && opt[i][0]->dtype == MS_DTYPE_F32 && weight_err(opt[i][0], opt[i][1]) == 0
                  : !opt[i][0]->data,
           "%s: optional tensor %zu", name, i);
  CHECK(tied ? m->lm_head.data == m->tok_embd.data : m->lm_head.data != m->tok_embd.data);
  double tol = type == MS_DTYPE_F32 ? 0 : type == MS_DTYPE_F16 ? 1e-3 : type == MS_DTYPE_BF16 ? 8e-3
               : type == MS_DTYPE_Q8_0 || type == MS_DTYPE_Q8_K ? 1.2e-2 : type == MS_DTYPE_Q3_K ? 0.3
               : type == MS_DTYPE_Q2_K ? 0.6 : 0.15;
  double we = fmax(weight_err(&m->layers[1].wq, &orig->layers[1].wq), weight_err(&m->tok_embd, &orig->tok_embd));
  we = fmax(we, weight_err(&m->layers[0].w_down, &orig->layers[0].w_down));
  CHECKF(we <= tol, "%s: weights differ from the original by %.3g (allowed %.3g)", name, we, tol);
  CHECK(m->layers[0].attn_norm.dtype == MS_DTYPE_F32 && weight_err(&m->layers[0].attn_norm, &orig->layers[0].attn_norm) == 0);
  double d = engine_vs_reference(m);
  CHECKF(d <= 1e-3, "%s: engine vs reference on the loaded model: %.3g", name, d);
  CHECK(tok && !strcmp(ms_tokenizer_name(tok), "gpt2/gpt2"));
  if (tok) {
    int32_t ids[16];
    CHECK(ms_tokenizer_encode(tok, "h\xff i", 4, ids, 16) == 4 && ids[0] == 'h' && ids[1] == 0xff && ids[3] == 'i');
  }
  ms_tokenizer_free(tok);
  ms_model_free(m);
  ms_model_free(orig);
}

/* ---- malformed files, built byte by byte ---- */

struct raw {
  uint8_t b[16384];
  size_t n;
};

static void r_bytes(struct raw *r, const void *p, size_t n) {
  memcpy(r->b + r->n, p, n);
  r->n += n;
}
static void r_u32(struct raw *r, uint32_t v) { r_bytes(r, &v, 4); }
static void r_u64(struct raw *r, uint64_t v) { r_bytes(r, &v, 8); }
static void r_str(struct raw *r, const char *s) {
  r_u64(r, strlen(s));
  r_bytes(r, s, strlen(s));
}
static void r_pad(struct raw *r, size_t a) {
  while (r->n % a) r->b[r->n++] = 0;
}

/* A header with `nt` tensors and `nkv` pairs; the caller appends the rest. */
static void r_head(struct raw *r, uint32_t version, uint64_t nt, uint64_t nkv) {
  r->n = 0;
  r_bytes(r, "GGUF", 4);
  r_u32(r, version);
  r_u64(r, nt);
  r_u64(r, nkv);
}

static void r_tensor(struct raw *r, const char *name, uint32_t nd, const uint64_t *ne, uint32_t type, uint64_t off) {
  r_str(r, name);
  r_u32(r, nd);
  for (uint32_t i = 0; i < nd; i++) r_u64(r, ne[i]);
  r_u32(r, type);
  r_u64(r, off);
}

/* Expects the bytes to be rejected with every one of `needles` in the message. */
static void expect_reject(const struct raw *r, const char *what, const char *n1, const char *n2) {
  char buf[1024] = "";
  struct ms_textbuf log = {buf, sizeof buf, 0, 0};
  struct ms_gguf *g = ms_gguf_open_mem(r->b, r->n, &log);
  CHECKF(!g && errno == MS_E_FORMAT, "%s: accepted", what);
  CHECKF(strstr(buf, n1) && (!n2 || strstr(buf, n2)) && strstr(buf, "offset "), "%s: message '%s'", what, buf);
  ms_gguf_free(g);
}

static void test_malformed(void) {
  struct raw *r = calloc(1, sizeof *r);
  uint64_t ne[5] = {32, 2, 1, 1, 1};
  r_head(r, 3, 0, 0);
  memcpy(r->b, "GGUG", 4);
  expect_reject(r, "magic", "not a GGUF file", NULL);
  r_head(r, 1, 0, 0);
  expect_reject(r, "version 1", "version: 1 is not supported", NULL);
  r_head(r, 0x03000000u, 0, 0);
  expect_reject(r, "big-endian", "big-endian", NULL);
  r_head(r, 3, 0, 1);
  r_str(r, "general.name");
  r_u32(r, MS_GGUF_STR);
  r_u64(r, 100);
  r_bytes(r, "short", 5);
  expect_reject(r, "string past the end", "key 'general.name'", "past the end");
  r_head(r, 3, 0, 1);
  r_str(r, "k");
  r_u32(r, 77);
  expect_reject(r, "value type", "key 'k': value type 77 unknown", NULL);
  r_head(r, 3, 0, 2);
  r_str(r, "k");
  r_u32(r, MS_GGUF_U32);
  r_u32(r, 1);
  r_str(r, "k");
  r_u32(r, MS_GGUF_U32);
  r_u32(r, 2);
  expect_reject(r, "duplicate key", "key 'k' appears twice", NULL);
  r_head(r, 3, 0, 1);
  r_str(r, "k.arr");
  r_u32(r, MS_GGUF_ARR);
  r_u32(r, MS_GGUF_U64);
  r_u64(r, 1ull << 60);
  expect_reject(r, "huge array", "key 'k.arr'", "past the end");
  r_head(r, 3, 0, 1ull << 40);
  expect_reject(r, "huge kv count", "metadata count", NULL);
  r_head(r, 3, 1ull << 40, 0);
  expect_reject(r, "huge tensor count", "tensor count", NULL);
  r_head(r, 3, 0, 1);
  r_str(r, "general.alignment");
  r_u32(r, MS_GGUF_U32);
  r_u32(r, 24);
  expect_reject(r, "alignment", "'general.alignment': 24 is not a power of two", NULL);
  r_head(r, 3, 1, 0);
  r_tensor(r, "w", 2, ne, 99, 0);
  expect_reject(r, "unknown type", "tensor 'w': type 99 unknown",
                "(no ggml type has that number; supported: " MS_GGUF_SUPPORTED_TYPES ")");
  r_head(r, 3, 1, 0);
  r_tensor(r, "w", 5, ne, 0, 0);
  expect_reject(r, "n_dims", "tensor 'w': 5 dimensions", NULL);
  uint64_t ne_bad[2] = {48, 2};
  r_head(r, 3, 1, 0);
  r_tensor(r, "w", 2, ne_bad, MS_GGML_Q4_1, 0);
  expect_reject(r, "partial block", "tensor 'w': q4_1 rows of 48 elements", NULL);
  uint64_t ne_k[2] = {288, 2};  /* whole 32-blocks, not whole K-quant super-blocks of 256 */
  r_head(r, 3, 1, 0);
  r_tensor(r, "w", 2, ne_k, MS_GGML_Q4_K, 0);
  expect_reject(r, "partial super-block", "tensor 'w': q4_K rows of 288 elements", NULL);
  r_head(r, 3, 1, 0);
  r_tensor(r, "w", 2, ne, MS_GGML_F32, 8);
  r_pad(r, 32);
  r->n += 512;
  expect_reject(r, "misaligned", "tensor 'w': data offset 8 is not a multiple", NULL);
  r_head(r, 3, 1, 0);
  r_tensor(r, "w", 2, ne, MS_GGML_F32, 0);
  r_pad(r, 32);
  r->n += 100;  /* 256 bytes needed */
  expect_reject(r, "data past the end", "tensor 'w': data", "past the end");
  r_head(r, 3, 2, 0);
  r_tensor(r, "a", 2, ne, MS_GGML_F32, 0);
  r_tensor(r, "b", 2, ne, MS_GGML_F32, 128);
  r_pad(r, 32);
  r->n += 512;
  expect_reject(r, "overlap", "overlaps", NULL);
  r_head(r, 3, 2, 0);
  r_tensor(r, "a", 2, ne, MS_GGML_F32, 0);
  r_tensor(r, "a", 2, ne, MS_GGML_F32, 256);
  r_pad(r, 32);
  r->n += 512;
  expect_reject(r, "duplicate tensor", "tensor 'a' appears twice", NULL);
  r_head(r, 3, 1, 0);
  r_str(r, "0123456789012345678901234567890123456789012345678901234567890123456789");
  expect_reject(r, "long name", "tensor 0: name of 70 bytes", NULL);
  /* key-value counts that disagree with the section: the key or index is named, not a dimension count */
  r_head(r, 3, 1, 0);  /* the count says none; the keys are read as a tensor info */
  r_str(r, "general.architecture");
  r_u32(r, MS_GGUF_STR);
  r_str(r, "llama");
  r_tensor(r, "w", 2, ne, MS_GGML_F32, 0);
  expect_reject(r, "kv count 0, keys present", "tensor 0: 'general.architecture' is a metadata key",
                "metadata count (0) is smaller");
  r_head(r, 3, 1, 8);  /* the count says 8; the tensor infos follow at once */
  r_tensor(r, "token_embd.weight", 2, ne, MS_GGML_F32, 0);
  r_pad(r, 32);
  r->n += 256;
  expect_reject(r, "kv count 8, section empty", "metadata key 1 of 8 (after 'token_embd.weight')", NULL);
  r_head(r, 3, 0, 3);  /* 3 said, 2 written */
  r_str(r, "general.architecture");
  r_u32(r, MS_GGUF_STR);
  r_str(r, "llama");
  r_str(r, "llama.block_count");
  r_u32(r, MS_GGUF_U32);
  r_u32(r, 1);
  expect_reject(r, "kv count 3, 2 written", "metadata key 2 of 3 (after 'llama.block_count')", "truncated");
  /* a well-formed one for contrast */
  r_head(r, 3, 1, 0);
  r_tensor(r, "a", 2, ne, MS_GGML_F32, 0);
  r_pad(r, 32);
  r->n += 256;
  struct ms_gguf *g = ms_gguf_open_mem(r->b, r->n, NULL);
  CHECK(g && ms_gguf_n_tensors(g) == 1);
  ms_gguf_free(g);
  free(r);
  char buf[512] = "";
  struct ms_textbuf log = {buf, sizeof buf, 0, 0};
  CHECK(!ms_gguf_open(tmp_path("does-not-exist.gguf"), &log) && errno == ENOENT && strstr(buf, "does-not-exist"));
}

/* ---- files that parse but are not models megascope runs ---- */

/* Rewrites every copy of a k-byte string (same length) inside a file. */
static int patch_file(const char *src, const char *dst, const char *from, const char *to, size_t k) {
  FILE *f = fopen(src, "rb");
  if (!f) return -1;
  static uint8_t data[1 << 20];
  size_t n = fread(data, 1, sizeof data, f);
  fclose(f);
  int hits = 0;
  for (size_t i = 0; i + k <= n; i++)
    if (!memcmp(data + i, from, k)) memcpy(data + i, to, k), hits++;
  f = fopen(dst, "wb");
  if (!f) return -1;
  fwrite(data, 1, n, f);
  fclose(f);
  return hits;
}

#define PATCH(from, to, needle) expect_model_error("tiny-0-q8_0.gguf", from, to, sizeof(from) - 1, needle)

static void expect_model_error(const char *file, const char *from, const char *to, size_t k, const char *needle) {
  char buf[1024] = "";
  struct ms_textbuf log = {buf, sizeof buf, 0, 0};
  CHECKF(patch_file(tmp_path(file), tmp_path("bad.gguf"), from, to, k) > 0, "%s not found", from);
  struct ms_gguf *g = ms_gguf_open(tmp_path("bad.gguf"), &log);
  struct ms_model *m = g ? ms_gguf_model_new(g, &log) : NULL;
  CHECKF(g && !m && strstr(buf, needle), "%s -> %s: '%s'", from, to, buf);
  ms_model_free(m);
  ms_gguf_free(g);
}

/* What qwen2 and gemma3 files must have, and what the other architectures may not. */
#define FPATCH(file, from, to, needle) expect_model_error(file, from, to, sizeof(from) - 1, needle)

static void test_arch_errors(void) {
  FPATCH("tiny-qwen2-0-q8_0.gguf", "blk.1.attn_k.bias", "blk.1.attn_k.bia_",
                     "tensor 'blk.1.attn_k.bias': missing");
  /* a llama file with qwen2's biases */
  struct ms_model_config cfg;
  ms_preset_config("tiny-qwen2", MS_DTYPE_F32, &cfg);
  cfg.arch = MS_ARCH_LLAMA;
  struct ms_model *orig = ms_model_synth(&cfg, 3), *m = NULL;
  char buf[1024] = "";
  struct ms_textbuf log = {buf, sizeof buf, 0, 0};
  CHECK(ms_gguf_write_model(orig, MS_DTYPE_Q8_0, tmp_path("llama-bias.gguf"), &log) == 0);
  CHECKF(ms_gguf_load(tmp_path("llama-bias.gguf"), &m, NULL, &log) == -MS_E_UNSUPP &&
             strstr(buf, "tensor 'blk.0.attn_q.bias': biases are not supported for 'llama' (only qwen2's q, k and v biases)"),
         "llama with biases: %s", buf);
  ms_model_free(m);
  ms_model_free(orig);
  FPATCH("tiny-gemma3-1-q8_0.gguf", "gemma3.attention.sliding_window", "gemma3.attention.sliding_windoW",
                     "key 'gemma3.attention.sliding_window': missing");
  FPATCH("tiny-gemma3-1-q8_0.gguf", "blk.2.post_ffw_norm.weight", "blk.2.post_ffw_norm.weighT",
                     "tensor 'blk.2.post_ffw_norm.weight': missing");
  FPATCH("tiny-gemma3-1-q8_0.gguf", "\x06\0\0\0\0\0\0\0gemma3", "\x06\0\0\0\0\0\0\0gemma4",
                     "key 'general.architecture': architecture 'gemma4' is not supported "
                     "(supported: llama, qwen3, qwen2, gemma3)");
}

/* The list the refusals print is the set ms_gguf_type_dtype reads, name for name. */
static void test_supported_types(void) {
  const char *list = MS_GGUF_SUPPORTED_TYPES;
  int listed = 1, readable = 0;
  for (const char *p = list; *p; p++) listed += *p == ',';
  for (uint32_t t = 0; t < 64; t++) {
    enum ms_dtype dt;
    if (ms_gguf_type_dtype(t, &dt)) continue;
    readable++;
    char want[32];
    snprintf(want, sizeof want, "%s,", ms_gguf_type_name(t));
    size_t k = strlen(want) - 1;
    const char *hit = strstr(list, want);
    if (!hit && strlen(list) >= k && !strcmp(list + strlen(list) - k, ms_gguf_type_name(t))) hit = list;
    CHECKF(hit, "type %s (%u) is read but not in " MS_GGUF_SUPPORTED_TYPES, ms_gguf_type_name(t), t);
  }
  CHECKF(listed == readable, "%d types listed, %d read", listed, readable);
}

static void test_model_errors(void) {
  PATCH("blk.1.ffn_up.weight", "blk.1.ffn_up.wEight", "tensor 'blk.1.ffn_up.weight': missing");
  PATCH("llama.block_count", "llama.block_coun_", "key 'llama.block_count': missing");
  /* the first key the shapes follow from: named as missing, not as a shape mismatch */
  PATCH("llama.embedding_length", "llama.embedding_lengtH", "key 'llama.embedding_length': missing");
  PATCH("\x05\0\0\0\0\0\0\0llama", "\x05\0\0\0\0\0\0\0mamba", "'mamba' is not supported");
  /* blk.0.attn_q.weight: n_dims 2, ne [64, 64], type q8_0 (8) */
  PATCH("blk.0.attn_q.weight\x02\0\0\0\x40\0\0\0\0\0\0\0", "blk.0.attn_q.weight\x02\0\0\0\x20\0\0\0\0\0\0\0",
        "tensor 'blk.0.attn_q.weight': shape [32, 64, 1, 1], expected [64, 64]");
  PATCH("blk.0.attn_q.weight\x02\0\0\0\x40\0\0\0\0\0\0\0\x40\0\0\0\0\0\0\0\x08",
        "blk.0.attn_q.weight\x02\0\0\0\x40\0\0\0\0\0\0\0\x40\0\0\0\0\0\0\0\x18",
        "tensor 'blk.0.attn_q.weight': type i8 (24) is not supported (supported: " MS_GGUF_SUPPORTED_TYPES ")");
  /* q3_K (11) -> iq3_s (21), the same 110 bytes a block of 256: parsed, then refused with the list */
  static const char q3k[] = "blk.0.attn_q.weight\x02\0\0\0\0\x01\0\0\0\0\0\0\0\x01\0\0\0\0\0\0\x0b";
  static const char iq3s[] = "blk.0.attn_q.weight\x02\0\0\0\0\x01\0\0\0\0\0\0\0\x01\0\0\0\0\0\0\x15";
  expect_model_error("tiny-256-0-q3_k.gguf", q3k, iq3s, sizeof q3k - 1,
                     "tensor 'blk.0.attn_q.weight': type iq3_s (21) is not supported "
                     "(supported: f32, f16, bf16, q8_0, q4_0, q4_1, "
                     "q5_0, q5_1, iq4_nl, q2_K, q3_K, q4_K, q5_K, q6_K, q8_K)");
  PATCH("blk.0.attn_norm.weight\x01\0\0\0\x40\0\0\0\0\0\0\0\0", "blk.0.attn_norm.weight\x01\0\0\0\x40\0\0\0\0\0\0\0\x1e",
        "tensor 'blk.0.attn_norm.weight': a norm weight of type bf16");
  PATCH("llama.rope.dimension_count\x04\0\0\0\x10", "llama.rope.dimension_count\x04\0\0\0\x08",
        "partial rotary (8 of 16)");
}

int main(void) {
  snprintf(tmpdir, sizeof tmpdir, "%s/ms_gguf_XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
  if (!mkdtemp(tmpdir)) return 1;
  test_metadata();
  enum ms_dtype types[] = {MS_DTYPE_F32, MS_DTYPE_F16, MS_DTYPE_BF16, MS_DTYPE_Q8_0, MS_DTYPE_Q4_0, MS_DTYPE_Q4_1};
  for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
    test_preset("tiny", 0, types[t]);
    test_preset("tiny-qwen3", 0, types[t]);
    test_preset("tiny-qwen2", 0, types[t]);
  }
  test_preset("tiny-qwen2", 1, MS_DTYPE_Q8_0);  /* Qwen2.5-0.5B ties its embeddings */
  test_preset("tiny-gemma3", 1, MS_DTYPE_F32);
  test_preset("tiny-gemma3", 1, MS_DTYPE_Q8_0);
  test_preset("tiny-gemma3", 1, MS_DTYPE_Q4_0);
  test_preset("tiny", 1, MS_DTYPE_Q4_1);
  /* the other block types; the K-quants on widths of 256 */
  for (int t = MS_DTYPE_Q5_0; t < MS_DTYPE_COUNT; t++) {
    if (ms_dtype_block((enum ms_dtype)t) == 32) test_preset("tiny", 0, (enum ms_dtype)t);
    test_preset("tiny-256", 0, (enum ms_dtype)t);
  }
  test_malformed();
  test_supported_types();
  test_model_errors();
  test_arch_errors();
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
  if (system(cmd)) fprintf(stderr, "could not remove %s\n", tmpdir);
  TEST_MAIN_END();
}
