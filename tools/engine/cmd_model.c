/* SPDX-License-Identifier: MIT */
/* megascope model: model files.
 *   synth:    write a synthetic preset as GGUF, its matrices in any weight type
 *   info:     what a GGUF file holds: metadata, tensors, the model megascope sees
 *   tokenize: text to ids (or --decode ids to text) with a model's tokenizer
 *   logits:   teacher-forced logits of a token sequence (megakernel or reference),
 *             written as raw f32 for comparisons with other implementations
 *   dump:     one tensor of a file, dequantized to raw f32 (cross-checks) */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "common.h"
#include "opt.h"
#include "megascope/engine.h"
#include "megascope/gguf.h"
#include "megascope/json.h"
#include "megascope/reference.h"
#include "megascope/tokenizer.h"

/* ---- synth ---- */

struct synth_args {
  const char *preset, *type, *out;
  uint64_t seed;
};

#define YA struct synth_args
static const struct cli_opt synth_opts[] = {
    CLI_OPT_STR(YA, preset, "preset", "P", "the preset (required)"),
    CLI_OPT_STR(YA, type, "type", "T", "the weights' type (default f32)"),
    CLI_OPT_STR(YA, out, "out", "F.gguf", "the file to write (required)"),
    CLI_OPT_U64(YA, seed, "model-seed", "N", "seed of the synthetic weights (default 1)"),
    {0}};
#undef YA

static const char synth_head[] =
    "usage: megascope model synth --preset P --type T --out F.gguf [options]\n\n"
    "Writes a synthetic preset (tiny, tiny-qwen3, tiny-qwen2, tiny-gemma3, tiny-256, smollm2-135m) as a GGUF file:\n"
    "deterministic f32 weights quantized to T (f32, f16, bf16, q8_0, q4_0, q4_1, q5_0,\n"
    "q5_1, iq4_nl, q2_k, q3_k, q4_k, q5_k, q6_k, q8_k; norms stay f32; the K-quants\n"
    "need matrix widths that are multiples of 256, as tiny-256 has), llama.cpp's\n"
    "tensor and key names, and the byte-level vocabulary as a gpt2 tokenizer without\n"
    "merges (token b is byte b).\n\n";

static int cmd_synth(int argc, char **argv) {
  struct synth_args a = {.type = "f32", .seed = 1};
  int prc = cli_parse("model synth", synth_head, synth_opts, &a, argc, argv, NULL);
  if (prc) return prc > 0 ? 0 : 2;
  const char *preset = a.preset, *type = a.type, *out = a.out;
  uint64_t seed = a.seed;
  if (!preset || !out) {
    fprintf(stderr, "megascope model synth: --preset and --out are required\n"
                    "(try 'megascope model synth --help')\n");
    return 2;
  }
  enum ms_dtype dt;
  if (ms_dtype_parse(type, &dt)) {
    fprintf(stderr, "megascope model synth: --type '%s': expected f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, "
            "iq4_nl, q2_k, q3_k, q4_k, q5_k, q6_k or q8_k\n", type);
    return 2;
  }
  struct ms_model_config cfg;
  if (ms_preset_config(preset, MS_DTYPE_F32, &cfg)) {
    fprintf(stderr, "megascope model synth: unknown preset '%s'\n", preset);
    return 2;
  }
  struct ms_model *m = ms_model_synth(&cfg, seed);
  if (!m) {
    fprintf(stderr, "megascope model synth: cannot build '%s': %s\n", preset, ms_strerror(errno));
    return 1;
  }
  char buf[1024] = "";
  struct ms_textbuf log = {buf, sizeof buf, 0, 0};
  int rc = ms_gguf_write_model(m, dt, out, &log);
  if (rc) fprintf(stderr, "megascope model synth: %s%s", buf[0] ? "" : ms_strerror(rc), buf[0] ? buf : "\n");
  else
    printf("wrote %s: %s, %s, %d layers, dim %d, vocab %d, seed %" PRIu64 "\n", out, preset, type, cfg.n_layers,
           cfg.dim, cfg.vocab, seed);
  ms_model_free(m);
  return rc ? 1 : 0;
}

/* ---- info ---- */

static void info_text(const struct ms_gguf *g, const struct ms_model *m, const struct ms_tokenizer *tok,
                      const char *why, int all_tensors) {
  char v[160];
  printf("GGUF v%u, %zu bytes, alignment %zu, data at %zu, %d keys, %d tensors\n", ms_gguf_version(g),
         ms_gguf_file_size(g), ms_gguf_alignment(g), ms_gguf_data_offset(g), ms_gguf_n_kv(g), ms_gguf_n_tensors(g));
  for (int i = 0; i < ms_gguf_n_kv(g); i++) {
    ms_gguf_kv_format(g, i, v, sizeof v);
    printf("  %-44s %s\n", ms_gguf_kv_key(g, i), v);
  }
  int n = ms_gguf_n_tensors(g), shown = all_tensors || n <= 24 ? n : 16;
  for (int i = 0; i < shown; i++) {
    const struct ms_gguf_tensor *t = ms_gguf_tensor(g, i);
    printf("  %-32s %-5s [", t->name, ms_gguf_type_name(t->type));
    for (int d = 0; d < t->n_dims; d++) printf("%s%" PRId64, d ? ", " : "", t->ne[d]);
    printf("] at %" PRIu64 ", %zu bytes\n", t->offset, t->bytes);
  }
  if (shown < n) printf("  ... %d more tensors (--tensors lists all)\n", n - shown);
  if (!m) {
    printf("model: not loadable: %s", why);
    return;
  }
  const struct ms_model_config *c = &m->cfg;
  printf("model: %s, %s blocks, %d layers, dim %d, ffn %d, heads %d/%d x %d, vocab %d, %s, rope %s base %g, "
         "eps %g, bos %d, eos %d, weights %s (%zu bytes read per step)\n",
         c->name, ms_arch_name(c->arch), c->n_layers, c->dim, c->ffn_dim, c->n_heads,
         c->n_kv_heads, c->head_dim, c->vocab, c->tied_embeddings ? "tied embeddings" : "separate lm_head",
         c->rope_style == MS_ROPE_NEOX ? "neox" : "norm", c->rope_base, c->norm_eps, c->bos, c->eos,
         ms_dtype_name(c->dtype), ms_model_weight_bytes(m));
  printf("tokenizer: %s\n%s", tok ? ms_tokenizer_name(tok) : "none: ", tok ? "" : why);
}

static void info_json(const struct ms_gguf *g, const struct ms_model *m, const struct ms_tokenizer *tok,
                      const char *why) {
  struct ms_json j;
  char v[160];
  ms_json_init(&j, stdout, 1);
  ms_json_obj_begin(&j);
  ms_json_kuint(&j, "version", ms_gguf_version(g));
  ms_json_kuint(&j, "file_bytes", ms_gguf_file_size(g));
  ms_json_kuint(&j, "alignment", ms_gguf_alignment(g));
  ms_json_kuint(&j, "data_offset", ms_gguf_data_offset(g));
  ms_json_key(&j, "metadata");
  ms_json_obj_begin(&j);
  for (int i = 0; i < ms_gguf_n_kv(g); i++) {
    ms_gguf_kv_format(g, i, v, sizeof v);
    ms_json_kstr(&j, ms_gguf_kv_key(g, i), v);
  }
  ms_json_obj_end(&j);
  ms_json_key(&j, "tensors");
  ms_json_arr_begin(&j);
  for (int i = 0; i < ms_gguf_n_tensors(g); i++) {
    const struct ms_gguf_tensor *t = ms_gguf_tensor(g, i);
    ms_json_obj_begin(&j);
    ms_json_kstr(&j, "name", t->name);
    ms_json_kstr(&j, "type", ms_gguf_type_name(t->type));
    ms_json_key(&j, "shape");
    ms_json_arr_begin(&j);
    for (int d = 0; d < t->n_dims; d++) ms_json_int(&j, t->ne[d]);
    ms_json_arr_end(&j);
    ms_json_kuint(&j, "offset", t->offset);
    ms_json_kuint(&j, "bytes", t->bytes);
    ms_json_obj_end(&j);
  }
  ms_json_arr_end(&j);
  if (m) {
    const struct ms_model_config *c = &m->cfg;
    ms_json_key(&j, "model");
    ms_json_obj_begin(&j);
    ms_json_kstr(&j, "name", c->name);
    ms_json_kstr(&j, "arch", ms_arch_name(c->arch));
    ms_json_kint(&j, "layers", c->n_layers);
    ms_json_kint(&j, "dim", c->dim);
    ms_json_kint(&j, "ffn_dim", c->ffn_dim);
    ms_json_kint(&j, "heads", c->n_heads);
    ms_json_kint(&j, "kv_heads", c->n_kv_heads);
    ms_json_kint(&j, "head_dim", c->head_dim);
    ms_json_kint(&j, "vocab", c->vocab);
    ms_json_kbool(&j, "tied_embeddings", c->tied_embeddings);
    ms_json_knum(&j, "rope_base", c->rope_base);
    ms_json_knum(&j, "norm_eps", c->norm_eps);
    ms_json_kint(&j, "bos", c->bos);
    ms_json_kint(&j, "eos", c->eos);
    ms_json_kstr(&j, "dtype", ms_dtype_name(c->dtype));
    ms_json_kuint(&j, "weight_bytes_per_step", ms_model_weight_bytes(m));
    ms_json_kstr(&j, "tokenizer", tok ? ms_tokenizer_name(tok) : "none");
    ms_json_obj_end(&j);
  } else {
    ms_json_kstr(&j, "model_error", why);
  }
  ms_json_obj_end(&j);
  ms_json_end(&j);
}

struct info_args {
  int as_json, all;
};

static const struct cli_opt info_opts[] = {
    CLI_OPT_FLAG(struct info_args, as_json, "json", "print as JSON"),
    CLI_OPT_FLAG(struct info_args, all, "tensors", "list every tensor"),
    {0}};

static int cmd_info(int argc, char **argv) {
  struct info_args a = {0};
  int first, prc = cli_parse("model info",
                             "usage: megascope model info F.gguf [--json] [--tensors]\n\n"
                             "Checks the whole file and prints its metadata, its tensors and the model\n"
                             "megascope builds from it (or why it cannot).\n\n",
                             info_opts, &a, argc, argv, &first);
  if (prc) return prc > 0 ? 0 : 2;
  if (first != argc - 1) {
    fprintf(stderr, "megascope model info: expected one file (try 'megascope model info --help')\n");
    return 2;
  }
  int as_json = a.as_json, all = a.all;
  char buf[2048] = "", mbuf[1024] = "";
  struct ms_textbuf log = {buf, sizeof buf, 0, 0}, mlog = {mbuf, sizeof mbuf, 0, 0};
  struct ms_gguf *g = ms_gguf_open(argv[first], &log);
  if (!g) {
    fprintf(stderr, "megascope model info: %s: %s\n%s", argv[first], ms_strerror(errno), buf);
    return 1;
  }
  struct ms_model *m = ms_gguf_model_new(g, &mlog);
  struct ms_tokenizer *tok = m ? ms_tokenizer_gguf_new(g, &mlog) : NULL;
  if (as_json) info_json(g, m, tok, mbuf);
  else info_text(g, m, tok, mbuf, all);
  ms_tokenizer_free(tok);
  ms_model_free(m);
  ms_gguf_free(g);
  return 0;
}

/* ---- tokenize ---- */

/* "1,2,3" into a malloc'd array. */
static int parse_ids(const char *s, int32_t **ids, int *n) {
  int cap = 16;
  *n = 0;
  *ids = malloc(sizeof **ids * (size_t)cap);
  while (*ids && *s) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || v < 0 || v > INT32_MAX || (*end && *end != ',')) break;
    if (*n == cap) {
      int32_t *p = realloc(*ids, sizeof *p * (size_t)(cap *= 2));
      if (!p) break;
      *ids = p;
    }
    (*ids)[(*n)++] = (int32_t)v;
    s = *end ? end + 1 : end;
  }
  if (!*ids || *s || !*n) {
    fprintf(stderr, "megascope model: expected token ids like 1,2,3\n");
    free(*ids);
    *ids = NULL;
    return -1;
  }
  return 0;
}

/* llama.cpp's tokenizer test vectors (tests/test-tokenizer-0.cpp): the texts of
 * F.inp, each followed by "\n__ggml_vocab_test__\n", encoded one by one, each
 * printed as a line of " id" pieces (the .out format). */
static int tokenize_inp(const struct ms_tokenizer *tok, const char *path) {
  static const char sep[] = "\n__ggml_vocab_test__\n";
  FILE *f = fopen(path, "rb");
  char *buf = NULL;
  long len = -1;
  if (f && !fseek(f, 0, SEEK_END) && (len = ftell(f)) >= 0 && !fseek(f, 0, SEEK_SET) &&
      (buf = malloc((size_t)len + 1)) && fread(buf, 1, (size_t)len, f) == (size_t)len) {
    buf[len] = 0;
  } else {
    fprintf(stderr, "megascope model tokenize: cannot read %s: %s\n", path, ms_strerror(errno));
    if (f) fclose(f);
    free(buf);
    return 1;
  }
  fclose(f);
  int rc = 0;
  int32_t *ids = NULL;
  for (char *p = buf; p < buf + len && !rc;) {
    char *e = strstr(p, sep);
    size_t n_text = e ? (size_t)(e - p) : strlen(p);
    int n = ms_tokenizer_encode(tok, p, n_text, NULL, 0);
    int32_t *grown = n >= 0 ? realloc(ids, sizeof *ids * (size_t)(n + 1)) : NULL;
    if (!grown || ms_tokenizer_encode(tok, p, n_text, grown, n) != n) {
      fprintf(stderr, "megascope model tokenize: cannot encode text at byte %ld of %s\n", (long)(p - buf), path);
      if (grown) ids = grown;
      rc = 1;
      break;
    }
    ids = grown;
    for (int i = 0; i < n; i++) printf(" %d", ids[i]);
    printf("\n");
    p = e ? e + sizeof sep - 1 : buf + len;
  }
  free(ids);
  free(buf);
  return rc;
}

struct tokenize_args {
  struct cli_model cm;
  const char *text, *dec, *vocab, *inp;
  int as_json;
};

#define TA struct tokenize_args
static const struct cli_opt tokenize_opts[] = {
    CLI_OPT_GROUP(TA, cm, cli_model_opts),
    CLI_OPT_STR(TA, vocab, "vocab", "F.gguf", "only the tokenizer of a GGUF file (which need hold no tensors)"),
    CLI_OPT_STR(TA, text, "text", "TEXT", "encode TEXT"),
    CLI_OPT_STR(TA, dec, "decode", "IDS", "decode comma-separated ids"),
    CLI_OPT_STR(TA, inp, "inp", "F.inp", "encode each text of a llama.cpp tokenizer test file"),
    CLI_OPT_FLAG(TA, as_json, "json", "print JSON with both the ids and the text"),
    {0}};
#undef TA

static const char tokenize_head[] =
    "usage: megascope model tokenize (--model F.gguf | --vocab F.gguf | --synthetic P)\n"
    "                                (--text TEXT | --decode IDS | --inp F.inp) [--json]\n\n"
    "Encodes TEXT with the model's tokenizer (special tokens kept whole), or decodes\n"
    "comma-separated ids. Prints the ids (or the text), or JSON with both. --vocab\n"
    "reads only the tokenizer of a GGUF file, which need hold no tensors (llama.cpp's\n"
    "vocabulary files). --inp encodes each text of a llama.cpp tokenizer test file\n"
    "(texts each followed by \"\\n__ggml_vocab_test__\\n\") and prints one line per text\n"
    "in the matching .out format: \" ID ID ...\".\n\n";

static int cmd_tokenize(int argc, char **argv) {
  struct tokenize_args a = {0};
  int prc = cli_parse("model tokenize", tokenize_head, tokenize_opts, &a, argc, argv, NULL);
  if (prc) return prc > 0 ? 0 : 2;
  struct cli_model cm = a.cm;
  const char *text = a.text, *dec = a.dec, *vocab = a.vocab, *inp = a.inp;
  int as_json = a.as_json;
  if (!!text + !!dec + !!inp != 1) {
    fprintf(stderr, "megascope model tokenize: give one of --text, --decode or --inp\n");
    return 2;
  }
  if (vocab && (cm.path || cm.preset)) {
    fprintf(stderr, "megascope model tokenize: give --vocab or a model, not both\n");
    return 2;
  }
  struct ms_tokenizer *tok = NULL;
  struct ms_model *m = NULL;
  if (vocab) {
    char buf[2048] = "";
    struct ms_textbuf log = {buf, sizeof buf, 0, 0};
    struct ms_gguf *g = ms_gguf_open(vocab, &log);
    tok = g ? ms_tokenizer_gguf_new(g, &log) : NULL;
    if (!tok) fprintf(stderr, "megascope model tokenize: %s: %s\n%s", vocab, ms_strerror(errno), buf);
    ms_gguf_free(g);
    if (!tok) return 1;
  } else if (!(m = cli_model_load_tok(&cm, &tok))) {
    return 2;
  }
  int rc = 1, n = 0;
  int32_t *ids = NULL;
  char *out = NULL;
  if (!tok) {
    fprintf(stderr, "megascope model tokenize: the model has no tokenizer\n");
    goto done;
  }
  if (inp) {
    rc = tokenize_inp(tok, inp);
    goto done;
  }
  if (text) {
    n = ms_tokenizer_encode(tok, text, strlen(text), NULL, 0);
    ids = n >= 0 ? malloc(sizeof *ids * (size_t)(n + 1)) : NULL;
    if (!ids || ms_tokenizer_encode(tok, text, strlen(text), ids, n) != n) goto done;
  } else if (parse_ids(dec, &ids, &n)) {
    goto done;
  }
  long len = ms_tokenizer_decode(tok, ids, n, NULL, 0);
  if (len < 0 || !(out = malloc((size_t)len + 1))) {
    fprintf(stderr, "megascope model tokenize: cannot decode: %s\n", ms_strerror((int)len));
    goto done;
  }
  ms_tokenizer_decode(tok, ids, n, out, (size_t)len + 1);
  if (as_json) {
    struct ms_json j;
    ms_json_init(&j, stdout, 0);
    ms_json_obj_begin(&j);
    ms_json_kstr(&j, "tokenizer", ms_tokenizer_name(tok));
    ms_json_key(&j, "ids");
    ms_json_arr_begin(&j);
    for (int i = 0; i < n; i++) ms_json_int(&j, ids[i]);
    ms_json_arr_end(&j);
    ms_json_kstr(&j, "text", out);
    ms_json_obj_end(&j);
    ms_json_end(&j);
  } else if (text) {
    for (int i = 0; i < n; i++) printf("%s%d", i ? "," : "", ids[i]);
    printf("\n");
  } else {
    fwrite(out, 1, (size_t)len, stdout);
    printf("\n");
  }
  rc = 0;
done:
  free(ids);
  free(out);
  ms_tokenizer_free(tok);
  ms_model_free(m);
  return rc;
}

/* ---- logits ---- */

/* Teacher-forced logits of every position through the engine (one request
 * whose prompt is the whole sequence), into lg (n, vocab). */
static int engine_logits(const struct ms_model *m, const int32_t *ids, int n, long workers, int q8, float *lg) {
  char buf[1024] = "";
  struct ms_textbuf log = {buf, sizeof buf, 0, 0};
  struct ms_engine_opts eo = {.sz = sizeof eo, .n_workers = (int)workers, .max_batch = 1, .max_ctx = n + 1,
                              .q8_activations = q8};
  struct ms_engine *e = ms_engine_new(m, &eo, &log);
  if (!e) {
    fprintf(stderr, "megascope model logits: %s", buf);
    return -1;
  }
  struct ms_request_opts ro = {.sz = sizeof ro, .prompt = ids, .n_prompt = n, .max_new_tokens = 1,
                               .record_logits = 1};
  struct ms_request *r = ms_engine_submit(e, &ro);
  int rc = -1;
  if (r && !ms_request_wait(r, -1)) {
    struct ms_request_info info;
    ms_request_get_info(r, &info);
    if (info.n_logits >= n) {
      memcpy(lg, info.logits, sizeof(float) * (size_t)n * (size_t)m->cfg.vocab);
      rc = 0;
    }
  }
  if (rc) fprintf(stderr, "megascope model logits: the request failed\n");
  ms_request_free(r);
  ms_engine_free(e);
  return rc;
}

static int reference_logits(const struct ms_model *m, const int32_t *ids, int n, int q8, float *lg) {
  struct ms_ref *ref = ms_ref_new(m, n);
  int rc = ref ? 0 : -1;
  if (ref) ms_ref_set_q8(ref, q8);
  for (int i = 0; i < n && !rc; i++) rc = ms_ref_step(ref, ids[i], lg + (size_t)i * (size_t)m->cfg.vocab);
  ms_ref_free(ref);
  if (rc) fprintf(stderr, "megascope model logits: the reference forward failed\n");
  return rc;
}

struct logits_args {
  struct cli_model cm;
  const char *tokens, *out;
  long workers;
  int use_ref, q8;
};

#define LA struct logits_args
static const struct cli_opt logits_opts[] = {
    CLI_OPT_GROUP(LA, cm, cli_model_opts),
    CLI_OPT_STR(LA, tokens, "tokens", "IDS", "the comma-separated ids to feed (required)"),
    CLI_OPT_FLAG(LA, use_ref, "reference",
                 "the double-precision reference forward, not the engine: the\n"
                 "exact one, or with --q8-activations the reference of the 8-bit\n"
                 "activations (each matrix input rounded as the engine rounds it)"),
    CLI_OPT_GROUP(LA, workers, cli_workers_opts),
    CLI_OPT_GROUP(LA, q8, cli_act_opts),
    CLI_OPT_STR(LA, out, "out", "F", "write the logits to F"),
    {0}};
#undef LA

static const char logits_head[] =
    "usage: megascope model logits (--model F.gguf | --synthetic P) --tokens IDS [options]\n\n"
    "Feeds the comma-separated ids one position at a time (teacher forcing) and\n"
    "prints each position's top token; --out writes all logits as raw little-endian\n"
    "f32, (positions, vocab) row-major.\n\n";

static int cmd_logits(int argc, char **argv) {
  struct logits_args a = {.q8 = -1};
  int prc = cli_parse("model logits", logits_head, logits_opts, &a, argc, argv, NULL);
  if (prc) return prc > 0 ? 0 : 2;
  struct cli_model cm = a.cm;
  const char *tokens = a.tokens, *out = a.out;
  long workers = a.workers;
  int use_ref = a.use_ref, q8 = a.q8;
  if (!tokens) {
    fprintf(stderr, "megascope model logits: --tokens IDS is required\n");
    return 2;
  }
  if (q8 < 0) q8 = !use_ref;  /* the engine's default; the reference's exact forward */
  int32_t *ids = NULL;
  int n = 0;
  if (!tokens || parse_ids(tokens, &ids, &n)) return 2;
  struct ms_model *m = cli_model_load(&cm);
  if (!m) {
    free(ids);
    return 2;
  }
  int rc = 1, V = m->cfg.vocab;
  float *lg = malloc(sizeof *lg * (size_t)n * (size_t)V);
  for (int i = 0; i < n; i++)
    if (ids[i] >= V) {
      fprintf(stderr, "megascope model logits: token %d is outside the vocabulary (%d)\n", ids[i], V);
      goto done;
    }
  if (!lg || (use_ref ? reference_logits(m, ids, n, q8, lg) : engine_logits(m, ids, n, workers, q8, lg))) goto done;
  for (int i = 0; i < n; i++) {
    const float *row = lg + (size_t)i * (size_t)V;
    int best = ms_argmax(row, V);
    printf("%d%s", best, i + 1 < n ? "," : "\n");
    (void)row;
  }
  if (out) {
    FILE *f = fopen(out, "wb");
    if (!f || fwrite(lg, sizeof *lg, (size_t)n * (size_t)V, f) != (size_t)n * (size_t)V) {
      fprintf(stderr, "megascope model logits: cannot write %s\n", out);
      if (f) fclose(f);
      goto done;
    }
    if (fclose(f)) goto done;
  }
  rc = 0;
done:
  free(lg);
  free(ids);
  ms_model_free(m);
  return rc;
}

/* ---- dump ---- */

static int cmd_dump(int argc, char **argv) {
  if (argc != 5 || strcmp(argv[3], "--out")) {
    fprintf(argc == 2 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) ? stdout : stderr,
            "usage: megascope model dump F.gguf TENSOR --out F.bin\n\n"
            "Writes the tensor's values, dequantized by megascope's decoder, as raw\n"
            "little-endian f32 in file order (ne[0] fastest).\n");
    return argc == 2 ? 0 : 2;
  }
  char buf[2048] = "";
  struct ms_textbuf log = {buf, sizeof buf, 0, 0};
  struct ms_gguf *g = ms_gguf_open(argv[1], &log);
  if (!g) {
    fprintf(stderr, "megascope model dump: %s: %s\n%s", argv[1], ms_strerror(errno), buf);
    return 1;
  }
  const struct ms_gguf_tensor *t = ms_gguf_find_tensor(g, argv[2]);
  enum ms_dtype dt;
  int rc = 1;
  if (!t) {
    fprintf(stderr, "megascope model dump: no tensor '%s'\n", argv[2]);
  } else if (ms_gguf_type_dtype(t->type, &dt)) {
    fprintf(stderr,
            "megascope model dump: tensor '%s': type %s (%u) is not supported (supported: " MS_GGUF_SUPPORTED_TYPES
            ")\n",
            t->name, ms_gguf_type_name(t->type), t->type);
  } else {
    int64_t rows = t->ne[1] * t->ne[2] * t->ne[3];
    struct ms_weight w = {.dtype = dt, .rows = (int)rows, .cols = (int)t->ne[0], .data = t->data};
    float *row = malloc(sizeof *row * (size_t)t->ne[0]);
    FILE *f = fopen(argv[4], "wb");
    rc = row && f ? 0 : 1;
    for (int r = 0; r < w.rows && !rc; r++) {
      ms_weight_row_f32(&w, r, row);
      if (fwrite(row, sizeof *row, (size_t)w.cols, f) != (size_t)w.cols) rc = 1;
    }
    if (f && fclose(f)) rc = 1;
    free(row);
    if (rc) fprintf(stderr, "megascope model dump: cannot write %s\n", argv[4]);
    else printf("%s: %s, %lld x %d values\n", t->name, ms_gguf_type_name(t->type), (long long)rows, w.cols);
  }
  ms_gguf_free(g);
  return rc;
}

/* The subcommands, in --help's order (frame/cli.h reads the table). */
static const struct cli_cmd model_cmds[] = {
    CLI_CMD("synth", "--preset P --type T --out F.gguf", "write a synthetic preset as GGUF", cmd_synth),
    CLI_CMD("info", "F.gguf", "metadata, tensors and model of a file", cmd_info),
    CLI_CMD("tokenize", "--model F.gguf --text TEXT", "text -> ids (--decode IDS: ids -> text)", cmd_tokenize),
    CLI_CMD("logits", "--model F.gguf --tokens IDS", "teacher-forced logits (raw f32 with --out)", cmd_logits),
    CLI_CMD("dump", "F.gguf TENSOR --out F.bin", "one tensor dequantized to raw f32", cmd_dump),
    {0}};

const struct cli_group model_group = {
    .path = "megascope model", .noun = "command", .one = "one", .width = 9, .args_width = 34, .cmds = model_cmds};
