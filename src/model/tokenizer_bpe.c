/* SPDX-License-Identifier: MIT */
/* GPT-2 byte-level BPE from a GGUF file's vocabulary (tokenizer.ggml.model =
 * gpt2): tokens, their types and the ranked merges.
 *
 * Encoding: the text is first cut at special tokens (control, user-defined and
 * unknown tokens, longest match first), which become their ids whole. Each remaining
 * fragment is split by the file's pre-tokenizer (tokenizer_split.c); each piece
 * starts as one symbol per byte (GPT-2 spells byte b as one code point,
 * byte_map below) and adjacent symbols are merged, lowest merge rank first
 * and leftmost among equals, until no ranked pair is left. A byte the
 * vocabulary has no token for (SmolLM2 lacks 21, all rare controls or bytes
 * that valid UTF-8 never holds) is dropped, as llama.cpp drops it. Decoding maps each
 * token's code points back to bytes; control tokens decode to their text.
 * Strings are copied out of the file, so the tokenizer outlives it. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "megascope/base.h"
#include "megascope/gguf.h"
#include "model/tokenizer_impl.h"

enum { TT_NORMAL = 1, TT_UNKNOWN = 2, TT_CONTROL = 3, TT_USER = 4, TT_UNUSED = 5, TT_BYTE = 6 };

struct merge {
  uint64_t pair;          /* left id << 32 | right id; 0 with rank -1: empty slot */
  int32_t rank, id;
};

struct ms_bpe {
  int n;                  /* vocabulary size */
  char *text;             /* token strings as the file spells them, NUL-separated */
  size_t *text_off;       /* [n] */
  char *bytes;            /* each token decoded to bytes */
  size_t *bytes_off;      /* [n + 1] */
  uint8_t *type;          /* [n] */
  int32_t *tok_hash;      /* open addressing over token strings: ids, -1 empty */
  size_t tok_mask;
  struct merge *merges;   /* open addressing over pairs */
  size_t merge_mask;
  int32_t byte_tok[256];  /* the token of each single byte */
  int32_t *special;       /* control and user-defined ids, by first byte then longest first */
  int special_at[257];    /* special[special_at[b] .. special_at[b+1]) start with byte b */
  enum ms_pretok pre;
  int ignore_merges;      /* llama-3: a piece that is a whole token is taken as is */
  int raw_bytes;          /* invalid UTF-8 kept as bytes (megascope's "gpt2"), not read as U+FFFD */
  int spm;                /* tokenizer.ggml.model = llama: SentencePiece (below), not byte-level BPE */
  float *score;           /* [n] SentencePiece scores: the higher merges first */
  int32_t spm_byte[256];  /* <0xXX> of each byte (byte fallback), or -1 */
  int32_t unk;            /* the unknown token, or -1 */
  int add_space_prefix;   /* SentencePiece: a space before text that starts the input or follows a special token */
  int add_bos;            /* bos id to prepend, or -1 */
  char name[64];
};

/* ---- GPT-2's byte <-> code point map ---- */

static int printable(int b) { return (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff); }

static void byte_map(uint32_t *to_cp) {
  int n = 0;
  for (int b = 0; b < 256; b++) to_cp[b] = printable(b) ? (uint32_t)b : (uint32_t)(256 + n++);
}

static size_t utf8_put(char *out, uint32_t cp) {
  if (cp < 0x80) return out[0] = (char)cp, 1;
  if (cp < 0x800) return out[0] = (char)(0xc0 | cp >> 6), out[1] = (char)(0x80 | (cp & 0x3f)), 2;
  out[0] = (char)(0xe0 | cp >> 12), out[1] = (char)(0x80 | ((cp >> 6) & 0x3f)), out[2] = (char)(0x80 | (cp & 0x3f));
  return 3;
}

/* ---- hashing ---- */

static uint64_t fnv(const char *s, size_t n) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 0x100000001b3ull;
  return h;
}

static uint64_t mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  return x ^ (x >> 33);
}

static const char *tok_text(const struct ms_bpe *b, int id) { return b->text + b->text_off[id]; }

static int32_t tok_find(const struct ms_bpe *b, const char *s, size_t n) {
  for (size_t i = fnv(s, n) & b->tok_mask;; i = (i + 1) & b->tok_mask) {
    int32_t id = b->tok_hash[i];
    if (id < 0) return -1;
    const char *t = tok_text(b, id);
    if (!strncmp(t, s, n) && t[n] == '\0') return id;
  }
}

static const struct merge *merge_find(const struct ms_bpe *b, int32_t l, int32_t r) {
  uint64_t key = (uint64_t)(uint32_t)l << 32 | (uint32_t)r;
  for (size_t i = mix(key) & b->merge_mask;; i = (i + 1) & b->merge_mask) {
    const struct merge *m = &b->merges[i];
    if (m->rank < 0) return NULL;
    if (m->pair == key) return m;
  }
}

static size_t table_size(size_t n) {
  size_t s = 16;
  while (s < 2 * n) s *= 2;
  return s;
}

/* ---- construction ---- */

struct build {
  const struct ms_gguf *g;
  struct ms_textbuf *log;
};

__attribute__((format(printf, 3, 4))) static int bfail(struct build *B, int err, const char *fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (B->log) ms_textbuf_printf(B->log, "%s\n", msg);
  return err;
}

/* The pre-tokenizer spellings llama.cpp writes (convert_hf_to_gguf.py) and
 * reads (llama-vocab.cpp), each with the expression llama.cpp splits it by;
 * "gpt2" is megascope's own spelling (synthetic models, whose vocabulary keeps
 * invalid UTF-8 as bytes, as the byte-level tokenizer does). Others are refused by
 * name: their expressions (deepseek's, tekken's, ...) are not written here. */
static const struct pre_name {
  const char *name;
  enum ms_pretok kind;
  int ignore_merges;
} pres[] = {
    {"gpt-2", MS_PRETOK_GPT2, 0},        {"gpt2", MS_PRETOK_GPT2, 0},        {"phi-2", MS_PRETOK_GPT2, 0},
    {"mpt", MS_PRETOK_GPT2, 0},          {"olmo", MS_PRETOK_GPT2, 0},        {"jais", MS_PRETOK_GPT2, 0},
    {"trillion", MS_PRETOK_GPT2, 0},     {"gigachat", MS_PRETOK_GPT2, 0},    {"jina-es", MS_PRETOK_GPT2, 0},
    {"jina-de", MS_PRETOK_GPT2, 0},      {"jina-v2-es", MS_PRETOK_GPT2, 0},  {"jina-v2-de", MS_PRETOK_GPT2, 0},
    {"smollm", MS_PRETOK_SMOLLM, 0},     {"starcoder", MS_PRETOK_SMOLLM, 0}, {"refact", MS_PRETOK_SMOLLM, 0},
    {"command-r", MS_PRETOK_SMOLLM, 0},  {"codeshell", MS_PRETOK_SMOLLM, 0}, {"exaone", MS_PRETOK_SMOLLM, 0},
    {"minerva-7b", MS_PRETOK_SMOLLM, 0}, {"llama-bpe", MS_PRETOK_LLAMA3, 1}, {"llama3", MS_PRETOK_LLAMA3, 1},
    {"llama-v3", MS_PRETOK_LLAMA3, 1},   {"falcon3", MS_PRETOK_LLAMA3, 1},   {"dbrx", MS_PRETOK_LLAMA3, 0},
    {"smaug-bpe", MS_PRETOK_LLAMA3, 0},  {"qwen2", MS_PRETOK_QWEN2, 0},      {"deepseek-r1-qwen", MS_PRETOK_QWEN2, 0},
    {"stablelm2", MS_PRETOK_QWEN2, 0},   {"default", MS_PRETOK_DEFAULT, 0},  {"falcon", MS_PRETOK_FALCON, 0},
};

/* "gpt-2, gpt2, phi-2, ..." into buf. */
static const char *pre_list(char *buf, size_t size) {
  size_t at = 0;
  buf[0] = '\0';
  for (size_t i = 0; i < sizeof pres / sizeof pres[0] && at < size; i++)
    at += (size_t)snprintf(buf + at, size - at, "%s%s", i ? ", " : "", pres[i].name);
  return buf;
}

static void set_pre(struct ms_bpe *b, const struct pre_name *p) {
  b->pre = p->kind;
  b->ignore_merges = p->ignore_merges;
  /* the synthetic models' vocabulary is the byte-level tokenizer in a file:
   * every byte stays its own token there */
  b->raw_bytes = !strcmp(p->name, "gpt2");
  snprintf(b->name, sizeof b->name, "gpt2/%s", p->name);
}

static int read_pre(struct build *B, struct ms_bpe *b) {
  const char *s;
  size_t n;
  char list[600];
  int rc = ms_gguf_get_str(B->g, "tokenizer.ggml.pre", &s, &n);
  if (rc == -ENOENT || (!rc && n == 0)) {
    /* llama.cpp's choice, and its warning: the split is a guess */
    for (size_t i = 0; i < sizeof pres / sizeof pres[0]; i++)
      if (pres[i].kind == MS_PRETOK_DEFAULT) set_pre(b, &pres[i]);
    ms_logf(MS_LOG_WARN, "tokenizer: the file has no key 'tokenizer.ggml.pre' (an old conversion): splitting text "
                         "with llama.cpp's 'default' pre-tokenizer, which is likely not the one the model was "
                         "trained with, so its tokens (and the model's answers) may be wrong; convert the model "
                         "again with a current llama.cpp");
    return 0;
  }
  if (rc) return bfail(B, -MS_E_FORMAT, "key 'tokenizer.ggml.pre': not a string");
  for (size_t i = 0; i < sizeof pres / sizeof pres[0]; i++)
    if (strlen(pres[i].name) == n && !memcmp(pres[i].name, s, n)) {
      set_pre(b, &pres[i]);
      return 0;
    }
  return bfail(B, -MS_E_UNSUPP, "key 'tokenizer.ggml.pre': pre-tokenizer '%.*s' is not supported (supported: %s)",
               (int)(n < 40 ? n : 40), s, pre_list(list, sizeof list));
}

/* Copies the token strings; decodes each into bytes. */
static int read_tokens(struct build *B, struct ms_bpe *b, uint64_t n) {
  size_t total = 0, len;
  const char *s;
  for (uint64_t i = 0; i < n; i++) {
    if (ms_gguf_arr_str(B->g, "tokenizer.ggml.tokens", i, &s, &len))
      return bfail(B, -MS_E_FORMAT, "key 'tokenizer.ggml.tokens': element %llu is not a string", (unsigned long long)i);
    total += len + 1;
  }
  b->text = malloc(total ? total : 1);
  b->text_off = malloc(sizeof *b->text_off * (size_t)n);
  b->bytes = malloc(total ? total : 1);  /* decoding never grows a token */
  b->bytes_off = malloc(sizeof *b->bytes_off * ((size_t)n + 1));
  b->type = malloc((size_t)n);
  if (!b->text || !b->text_off || !b->bytes || !b->bytes_off || !b->type) return -ENOMEM;
  size_t at = 0;
  for (uint64_t i = 0; i < n; i++) {
    ms_gguf_arr_str(B->g, "tokenizer.ggml.tokens", i, &s, &len);
    if (memchr(s, 0, len))
      return bfail(B, -MS_E_FORMAT, "key 'tokenizer.ggml.tokens': token %llu holds a NUL byte", (unsigned long long)i);
    memcpy(b->text + at, s, len);
    b->text[at + len] = '\0';
    b->text_off[i] = at;
    at += len + 1;
    int64_t t = TT_NORMAL;
    if (!ms_gguf_arr_int(B->g, "tokenizer.ggml.token_type", i, &t) && (t < 1 || t > 6))
      return bfail(B, -MS_E_FORMAT, "key 'tokenizer.ggml.token_type': token %llu has type %lld (1 to 6)",
                   (unsigned long long)i, (long long)t);
    b->type[i] = (uint8_t)t;
  }
  return 0;
}

/* A SentencePiece token's bytes into out: a byte token <0xXX> is its byte,
 * U+2581 is a space in normal and user-defined tokens, control and unknown
 * tokens are their text. Never longer than the spelling. */
static size_t spm_token_bytes(const struct ms_bpe *b, int id, char *out) {
  const char *s = tok_text(b, id);
  size_t n = strlen(s), k = 0;
  unsigned v;
  char tail;
  if (b->type[id] == TT_BYTE && n == 6 && sscanf(s, "<0x%2x%c", &v, &tail) == 2 && tail == '>') return out[0] = (char)v, 1;
  if (b->type[id] == TT_CONTROL || b->type[id] == TT_UNKNOWN) return memcpy(out, s, n), n;
  for (size_t i = 0; i < n; i++) {
    if (i + 3 <= n && !memcmp(s + i, "\xe2\x96\x81", 3)) {
      out[k++] = ' ';
      i += 2;
    } else {
      out[k++] = s[i];
    }
  }
  return k;
}

/* Each token's bytes: control tokens as spelled; others through the inverse
 * byte map, code points outside it (user-defined text) kept as UTF-8. */
static void decode_tokens(struct ms_bpe *b) {
  uint32_t to_cp[256];
  int16_t from_cp[512];
  byte_map(to_cp);
  for (int i = 0; i < 512; i++) from_cp[i] = -1;
  for (int i = 0; i < 256; i++) from_cp[to_cp[i]] = (int16_t)i;
  size_t at = 0;
  for (int id = 0; id < b->n; id++) {
    const unsigned char *s = (const unsigned char *)tok_text(b, id);
    b->bytes_off[id] = at;
    if (b->spm) {
      at += spm_token_bytes(b, id, b->bytes + at);
      continue;
    }
    if (b->type[id] == TT_CONTROL) {
      size_t n = strlen((const char *)s);
      memcpy(b->bytes + at, s, n);
      at += n;
      continue;
    }
    while (*s) {
      uint32_t cp = *s;
      size_t k = 1;
      if ((*s & 0xe0) == 0xc0 && (s[1] & 0xc0) == 0x80) cp = (uint32_t)(*s & 0x1f) << 6 | (s[1] & 0x3f), k = 2;
      if (cp < 512 && from_cp[cp] >= 0 && (k == 2 || cp < 0x80)) {
        b->bytes[at++] = (char)from_cp[cp];
      } else {
        memcpy(b->bytes + at, s, k);
        at += k;
      }
      s += k;
    }
  }
  b->bytes_off[b->n] = at;
}

static int index_tokens(struct build *B, struct ms_bpe *b) {
  size_t size = table_size((size_t)b->n);
  b->tok_mask = size - 1;
  if (!(b->tok_hash = malloc(sizeof *b->tok_hash * size))) return -ENOMEM;
  memset(b->tok_hash, 0xff, sizeof *b->tok_hash * size);
  for (int id = 0; id < b->n; id++) {
    const char *t = tok_text(b, id);
    size_t n = strlen(t), i = fnv(t, n) & b->tok_mask;
    while (b->tok_hash[i] >= 0) {
      if (!strcmp(tok_text(b, b->tok_hash[i]), t)) break;  /* a duplicate: the first id wins */
      i = (i + 1) & b->tok_mask;
    }
    if (b->tok_hash[i] < 0) b->tok_hash[i] = id;
  }
  uint32_t to_cp[256];
  byte_map(to_cp);
  for (int c = 0; c < 256; c++) {
    char s[4];
    size_t n = utf8_put(s, to_cp[c]);
    b->byte_tok[c] = tok_find(b, s, n);  /* -1: a byte the vocabulary cannot spell (0xff in SmolLM2) */
  }
  return 0;
}

static int read_merges(struct build *B, struct ms_bpe *b) {
  enum ms_gguf_vtype et;
  uint64_t n = 0;
  int rc = ms_gguf_get_arr(B->g, "tokenizer.ggml.merges", &et, &n);
  if (rc && rc != -ENOENT) return bfail(B, -MS_E_FORMAT, "key 'tokenizer.ggml.merges': not an array");
  if (!rc && n && et != MS_GGUF_STR) return bfail(B, -MS_E_FORMAT, "key 'tokenizer.ggml.merges': not an array of strings");
  size_t size = table_size((size_t)n);
  b->merge_mask = size - 1;
  if (!(b->merges = malloc(sizeof *b->merges * size))) return -ENOMEM;
  for (size_t i = 0; i < size; i++) b->merges[i] = (struct merge){0, -1, -1};
  char *buf = NULL;  /* left and right joined; as long as the longest merge */
  size_t cap = 0;
  for (uint64_t r = 0; r < n; r++) {
    const char *s, *sp;
    size_t len;
    ms_gguf_arr_str(B->g, "tokenizer.ggml.merges", r, &s, &len);
    if (len < 3 || !(sp = memchr(s + 1, ' ', len - 1))) {
      free(buf);
      return bfail(B, -MS_E_FORMAT, "key 'tokenizer.ggml.merges': merge %llu is not 'left right'", (unsigned long long)r);
    }
    if (len > cap) {
      char *nb = realloc(buf, cap = len);
      if (!nb) {
        free(buf);
        return -ENOMEM;
      }
      buf = nb;
    }
    size_t ln = (size_t)(sp - s), rn = len - ln - 1;
    memcpy(buf, s, ln);
    memcpy(buf + ln, sp + 1, rn);
    int32_t l = tok_find(b, s, ln), rt = tok_find(b, sp + 1, rn), id = tok_find(b, buf, ln + rn);
    if (l < 0 || rt < 0 || id < 0) continue;  /* a merge whose parts are not tokens never applies */
    uint64_t key = (uint64_t)(uint32_t)l << 32 | (uint32_t)rt;
    size_t i = mix(key) & b->merge_mask;
    while (b->merges[i].rank >= 0 && b->merges[i].pair != key) i = (i + 1) & b->merge_mask;
    if (b->merges[i].rank < 0) b->merges[i] = (struct merge){key, (int32_t)r, id};  /* first rank wins */
  }
  free(buf);
  return 0;
}

/* SentencePiece: scores, the byte tokens, the unknown token, the space prefix. */
static int read_scores(struct build *B, struct ms_bpe *b) {
  enum ms_gguf_vtype et;
  uint64_t n = 0;
  int rc = ms_gguf_get_arr(B->g, "tokenizer.ggml.scores", &et, &n);
  if (rc && rc != -ENOENT) return bfail(B, -MS_E_FORMAT, "key 'tokenizer.ggml.scores': not an array");
  if (!rc && n != (uint64_t)b->n)
    return bfail(B, -MS_E_FORMAT, "key 'tokenizer.ggml.scores': %llu scores for %d tokens", (unsigned long long)n, b->n);
  if (!(b->score = calloc((size_t)b->n, sizeof *b->score))) return -ENOMEM;
  for (uint64_t i = 0; i < n; i++) {
    double v;
    if (ms_gguf_arr_float(B->g, "tokenizer.ggml.scores", i, &v))
      return bfail(B, -MS_E_FORMAT, "key 'tokenizer.ggml.scores': element %llu is not a number", (unsigned long long)i);
    b->score[i] = (float)v;
  }
  for (int c = 0; c < 256; c++) {
    char hex[8];
    snprintf(hex, sizeof hex, "<0x%02X>", c);
    b->spm_byte[c] = tok_find(b, hex, 6);
    if (b->spm_byte[c] < 0 && c) b->spm_byte[c] = tok_find(b, (char[]){(char)c}, 1);  /* llama.cpp's second try */
  }
  int64_t unk = -1;
  ms_gguf_get_int(B->g, "tokenizer.ggml.unknown_token_id", &unk);
  b->unk = unk >= 0 && unk < b->n ? (int32_t)unk : -1;
  b->add_space_prefix = 1;
  ms_gguf_get_bool(B->g, "tokenizer.ggml.add_space_prefix", &b->add_space_prefix);
  return 0;
}

static int len_desc(const void *x, const void *y, void *ctx) {
  const struct ms_bpe *b = ctx;
  int32_t p = *(const int32_t *)x, q = *(const int32_t *)y;
  const unsigned char *s = (const unsigned char *)tok_text(b, p), *t = (const unsigned char *)tok_text(b, q);
  if (s[0] != t[0]) return s[0] - t[0];
  size_t m = strlen((const char *)s), n = strlen((const char *)t);
  return m != n ? (m > n ? -1 : 1) : (p > q) - (p < q);
}

/* Control, user-defined and unknown tokens are found whole in text, as
 * llama.cpp's cache_special_tokens has them ("<unk>" is the unknown id). */
static int is_special(const struct ms_bpe *b, int id) {
  return (b->type[id] == TT_CONTROL || b->type[id] == TT_USER || b->type[id] == TT_UNKNOWN) && tok_text(b, id)[0];
}

static int index_special(struct ms_bpe *b) {
  int n = 0;
  for (int id = 0; id < b->n; id++) n += is_special(b, id);
  if (!(b->special = malloc(sizeof *b->special * (size_t)(n ? n : 1)))) return -ENOMEM;
  n = 0;
  for (int id = 0; id < b->n; id++)
    if (is_special(b, id)) b->special[n++] = id;
  qsort_r(b->special, (size_t)n, sizeof *b->special, len_desc, b);
  for (int c = 0, i = 0; c <= 256; c++) {
    while (i < n && (unsigned char)tok_text(b, b->special[i])[0] < c) i++;
    b->special_at[c] = c == 256 ? n : i;
  }
  return 0;
}

void ms_bpe_free(struct ms_bpe *b) {
  if (!b) return;
  free(b->text);
  free(b->text_off);
  free(b->bytes);
  free(b->bytes_off);
  free(b->type);
  free(b->tok_hash);
  free(b->merges);
  free(b->special);
  free(b->score);
  free(b);
}

static int build(struct build *B, struct ms_bpe *b) {
  const char *s;
  size_t n;
  int rc = ms_gguf_get_str(B->g, "tokenizer.ggml.model", &s, &n);
  if (rc) return bfail(B, -MS_E_FORMAT, "key 'tokenizer.ggml.model': %s", rc == -ENOENT ? "missing" : "not a string");
  b->spm = n == 5 && !memcmp(s, "llama", 5);
  if (!b->spm && (n != 4 || memcmp(s, "gpt2", 4)))
    return bfail(B, -MS_E_UNSUPP, "key 'tokenizer.ggml.model': '%.*s' is not supported (supported: gpt2, llama)",
                 (int)(n < 40 ? n : 40), s);
  enum ms_gguf_vtype et;
  uint64_t count, min = b->spm ? 1 : 256;
  if ((rc = ms_gguf_get_arr(B->g, "tokenizer.ggml.tokens", &et, &count)) || et != MS_GGUF_STR)
    return bfail(B, -MS_E_FORMAT, "key 'tokenizer.ggml.tokens': %s",
                 rc == -ENOENT ? "missing" : "not an array of strings");
  if (count < min || count > (1u << 24))
    return bfail(B, -MS_E_FORMAT, "key 'tokenizer.ggml.tokens': %llu tokens (%llu to 2^24)", (unsigned long long)count,
                 (unsigned long long)min);
  b->n = (int)count;
  int64_t bos = -1;
  int add = b->spm;  /* llama.cpp's default: SentencePiece vocabularies add BOS */
  ms_gguf_get_int(B->g, "tokenizer.ggml.bos_token_id", &bos);
  ms_gguf_get_bool(B->g, "tokenizer.ggml.add_bos_token", &add);
  b->add_bos = add && bos >= 0 && bos < b->n ? (int)bos : -1;
  if (b->spm) {
    snprintf(b->name, sizeof b->name, "llama/spm");
    if ((rc = read_tokens(B, b, count)) || (rc = index_tokens(B, b)) || (rc = read_scores(B, b)) ||
        (rc = index_special(b)))
      return rc;
  } else if ((rc = read_pre(B, b)) || (rc = read_tokens(B, b, count)) || (rc = index_tokens(B, b)) ||
             (rc = read_merges(B, b)) || (rc = index_special(b))) {
    return rc;
  }
  decode_tokens(b);
  return 0;
}

struct ms_tokenizer *ms_tokenizer_gguf_new(const struct ms_gguf *g, struct ms_textbuf *log) {
  struct build B = {g, log};
  struct ms_tokenizer *t = calloc(1, sizeof *t);
  struct ms_bpe *b = calloc(1, sizeof *b);
  int rc = t && b ? build(&B, b) : -ENOMEM;
  if (rc) {
    ms_bpe_free(b);
    free(t);
    errno = -rc;
    return NULL;
  }
  t->vocab = b->n;
  t->bpe = b;
  return t;
}

const char *ms_bpe_name(const struct ms_bpe *b) { return b->name; }

int ms_tokenizer_vocab(const struct ms_tokenizer *t) { return t->vocab; }

int ms_tokenizer_find(const struct ms_tokenizer *t, const char *text) {
  if (!t->bpe) {  /* byte-level: single bytes and "<|id|>" */
    int id;
    char tail;
    if (text[0] && !text[1]) return (unsigned char)text[0];
    if (sscanf(text, "<|%d|%c", &id, &tail) == 2 && tail == '>' && id >= 256 && id < t->vocab) return id;
    return -ENOENT;
  }
  int32_t id = tok_find(t->bpe, text, strlen(text));
  return id < 0 ? -ENOENT : id;
}

int ms_tokenizer_add_bos(const struct ms_tokenizer *t) { return t->bpe ? t->bpe->add_bos : -1; }

int ms_tokenizer_is_control(const struct ms_tokenizer *t, int32_t id) {
  if (id < 0 || id >= t->vocab) return 0;
  return t->bpe ? t->bpe->type[id] == TT_CONTROL : id >= 256;
}

/* ---- encoding ---- */

struct pair {
  int32_t rank, left, right;  /* symbol indices */
  int32_t lid, rid;           /* their ids when pushed: stale entries are skipped */
};

struct enc {
  const struct ms_bpe *b;
  const char *text;
  int32_t *out;
  int max;
  long n;                     /* ids the text needs so far */
  int32_t *id, *next, *prev;  /* symbols of the piece being merged */
  struct pair *heap;
  size_t cap;                 /* symbols the arrays hold */
  char *spell;                /* a piece spelled with GPT-2's byte map (2 bytes a byte at most) */
  size_t spell_cap;
};

static void emit(struct enc *e, int32_t id) {
  if (e->n < e->max) e->out[e->n] = id;
  e->n++;
}

static int pair_less(const struct pair *a, const struct pair *b) {
  return a->rank < b->rank || (a->rank == b->rank && a->left < b->left);
}

static void heap_push(struct pair *h, int *n, struct pair p) {
  int i = (*n)++;
  for (; i > 0 && pair_less(&p, &h[(i - 1) / 2]); i = (i - 1) / 2) h[i] = h[(i - 1) / 2];
  h[i] = p;
}

static struct pair heap_pop(struct pair *h, int *n) {
  struct pair top = h[0], last = h[--*n];
  int i = 0;
  for (;;) {
    int c = 2 * i + 1;
    if (c >= *n) break;
    if (c + 1 < *n && pair_less(&h[c + 1], &h[c])) c++;
    if (!pair_less(&h[c], &last)) break;
    h[i] = h[c];
    i = c;
  }
  if (*n) h[i] = last;
  return top;
}

static void push_pair(struct enc *e, int *nh, int32_t l) {
  if (l < 0 || e->next[l] < 0) return;
  int32_t r = e->next[l];
  const struct merge *m = merge_find(e->b, e->id[l], e->id[r]);
  if (m) heap_push(e->heap, nh, (struct pair){m->rank, l, r, e->id[l], e->id[r]});
}

static int grow(struct enc *e, size_t n) {
  if (n <= e->cap) return 0;
  size_t cap = e->cap ? e->cap : 64;
  while (cap < n) cap *= 2;
  int32_t *id = realloc(e->id, sizeof *id * cap), *nx = id ? realloc(e->next, sizeof *nx * cap) : NULL;
  if (id) e->id = id;
  if (nx) e->next = nx;
  int32_t *pv = nx ? realloc(e->prev, sizeof *pv * cap) : NULL;
  if (pv) e->prev = pv;
  struct pair *h = pv ? realloc(e->heap, sizeof *h * 3 * cap) : NULL;
  if (!h) return -ENOMEM;
  e->heap = h;
  e->cap = cap;
  return 0;
}

/* The llama-3 rule: a piece that is itself a token is taken whole. */
static int whole_piece(struct enc *e, const unsigned char *s, size_t n) {
  uint32_t to_cp[256];
  size_t k = 0;
  if (2 * n > e->spell_cap) {
    char *p = realloc(e->spell, 2 * n);
    if (!p) return -ENOMEM;
    e->spell = p;
    e->spell_cap = 2 * n;
  }
  byte_map(to_cp);
  for (size_t i = 0; i < n; i++) k += utf8_put(e->spell + k, to_cp[s[i]]);
  int32_t id = tok_find(e->b, e->spell, k);
  if (id < 0) return 0;
  emit(e, id);
  return 1;
}

static int bpe_piece(void *user, size_t start, size_t end) {
  struct enc *e = user;
  const unsigned char *s = (const unsigned char *)e->text + start;
  int32_t n = (int32_t)(end - start), nh = 0;
  int whole = e->b->ignore_merges ? whole_piece(e, s, (size_t)n) : 0;
  if (whole) return whole < 0 ? whole : 0;
  if (grow(e, (size_t)n)) return -ENOMEM;
  for (int32_t i = 0; i < n; i++) {
    e->id[i] = e->b->byte_tok[s[i]];
    e->prev[i] = i - 1;
    e->next[i] = i + 1 < n ? i + 1 : -1;
  }
  for (int32_t i = 0; i + 1 < n; i++) push_pair(e, &nh, i);
  while (nh) {
    struct pair p = heap_pop(e->heap, &nh);
    if (e->id[p.left] != p.lid || e->next[p.left] != p.right || e->id[p.right] != p.rid) continue;
    e->id[p.left] = merge_find(e->b, p.lid, p.rid)->id;
    e->id[p.right] = -1;  /* dead */
    e->next[p.left] = e->next[p.right];
    if (e->next[p.left] >= 0) e->prev[e->next[p.left]] = p.left;
    push_pair(e, &nh, e->prev[p.left]);
    push_pair(e, &nh, p.left);
  }
  for (int32_t i = 0; i >= 0 && i < n; i = e->next[i])
    if (e->id[i] >= 0) emit(e, e->id[i]);  /* bytes without a token are dropped, as llama.cpp drops them */
  return 0;
}

/* The longest special token spelled at text[i..len), or -1. */
static int32_t special_at(const struct ms_bpe *b, const char *text, size_t i, size_t len) {
  unsigned char c = (unsigned char)text[i];
  for (int k = b->special_at[c]; k < b->special_at[c + 1]; k++) {
    const char *t = tok_text(b, b->special[k]);
    size_t n = strlen(t);
    if (n <= len - i && !memcmp(text + i, t, n)) return b->special[k];
  }
  return -1;
}

/* ---- SentencePiece (llama.cpp's llm_tokenizer_spm) ----
 * A fragment becomes one symbol per UTF-8 character (its length read from the
 * lead byte, as llama.cpp reads it: invalid UTF-8 is not replaced here); the
 * adjacent pair whose joined text is a token with the highest score merges
 * first, leftmost among equals, until no pair is a token. A symbol left that is
 * no token falls back to its bytes' <0xXX> tokens (the unknown token where the
 * vocabulary has none). */

struct spair {
  float score;
  int32_t left, right;
  size_t size;  /* bytes of the joined text when pushed: stale entries are skipped */
};

static int spair_before(const struct spair *a, const struct spair *b) {
  return a->score > b->score || (a->score == b->score && a->left < b->left);
}

static void spair_push(struct spair *h, int *n, struct spair p) {
  int i = (*n)++;
  for (; i > 0 && spair_before(&p, &h[(i - 1) / 2]); i = (i - 1) / 2) h[i] = h[(i - 1) / 2];
  h[i] = p;
}

static struct spair spair_pop(struct spair *h, int *n) {
  struct spair top = h[0], last = h[--*n];
  int i = 0;
  for (;;) {
    int c = 2 * i + 1;
    if (c >= *n) break;
    if (c + 1 < *n && spair_before(&h[c + 1], &h[c])) c++;
    if (!spair_before(&h[c], &last)) break;
    h[i] = h[c];
    i = c;
  }
  if (*n) h[i] = last;
  return top;
}

struct spm_sym {
  size_t at, n;         /* bytes of the text; n 0: merged away */
  int32_t prev, next;
};

static void spm_try(const struct ms_bpe *b, const char *s, struct spm_sym *sym, struct spair *h, int *nh,
                    int32_t l, int32_t r) {
  if (l < 0 || r < 0) return;
  int32_t id = tok_find(b, s + sym[l].at, sym[l].n + sym[r].n);
  if (id >= 0) spair_push(h, nh, (struct spair){b->score[id], l, r, sym[l].n + sym[r].n});
}

/* Tokenizes n bytes at s (spaces already escaped to U+2581). */
static int spm_fragment(struct enc *e, const char *s, size_t n) {
  const struct ms_bpe *b = e->b;
  struct spm_sym *sym = malloc(sizeof *sym * (n ? n : 1));
  struct spair *h = malloc(sizeof *h * 3 * (n ? n : 1));  /* n - 1 pairs first, then two per merge */
  int32_t k = 0;
  int nh = 0;
  if (!sym || !h) {
    free(sym);
    free(h);
    return -ENOMEM;
  }
  static const unsigned char len8[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  for (size_t at = 0; at < n; k++) {
    size_t c = len8[(unsigned char)s[at] >> 4];
    if (c > n - at) c = n - at;
    sym[k] = (struct spm_sym){at, c, k - 1, at + c < n ? k + 1 : -1};
    at += c;
  }
  for (int32_t i = 0; i + 1 < k; i++) spm_try(b, s, sym, h, &nh, i, i + 1);
  while (nh) {
    struct spair p = spair_pop(h, &nh);
    struct spm_sym *l = &sym[p.left], *r = &sym[p.right];
    if (!l->n || !r->n || l->n + r->n != p.size) continue;
    l->n += r->n;
    r->n = 0;
    l->next = r->next;
    if (r->next >= 0) sym[r->next].prev = p.left;
    spm_try(b, s, sym, h, &nh, l->prev, p.left);
    spm_try(b, s, sym, h, &nh, p.left, l->next);
  }
  for (int32_t i = k ? 0 : -1; i >= 0; i = sym[i].next) {
    int32_t id = tok_find(b, s + sym[i].at, sym[i].n);
    if (id >= 0) {
      emit(e, id);
      continue;
    }
    for (size_t j = 0; j < sym[i].n; j++) {
      int32_t t = b->spm_byte[(unsigned char)s[sym[i].at + j]];
      if (t < 0) t = b->unk;
      if (t >= 0) emit(e, t);
    }
  }
  free(sym);
  free(h);
  return 0;
}

/* Text between special tokens: a space first when it starts the input or
 * follows a special token (add_space_prefix), every space as U+2581. */
static int spm_text(struct enc *e, const char *text, size_t len, int prefix) {
  size_t spaces = prefix;
  for (size_t i = 0; i < len; i++) spaces += text[i] == ' ';
  char *s = malloc(len + 2 * spaces + 1);
  if (!s) return -ENOMEM;
  size_t n = 0;
  for (size_t i = 0; i < len + (size_t)prefix; i++) {
    char c = i < (size_t)prefix ? ' ' : text[i - (size_t)prefix];
    if (c == ' ') memcpy(s + n, "\xe2\x96\x81", 3), n += 3;
    else s[n++] = c;
  }
  int rc = spm_fragment(e, s, n);
  free(s);
  return rc;
}

int ms_bpe_encode(const struct ms_bpe *b, const char *text, size_t len, int32_t *out, int max) {
  struct enc e = {.b = b, .text = text, .out = out, .max = max};
  int prev_special = 1;  /* SentencePiece: the input starts as after a special token */
  int rc = 0;
  size_t frag = 0;
  for (size_t i = 0; i <= len && !rc; i++) {
    int32_t sp = i < len ? special_at(b, text, i, len) : -1;
    if (sp < 0 && i < len) continue;
    if (i > frag && b->spm) {
      rc = spm_text(&e, text + frag, i - frag, b->add_space_prefix && prev_special);
      prev_special = 0;
    } else if (i > frag) {
      /* invalid UTF-8 reads as U+FFFD, as llama.cpp reads it; piece offsets
       * are relative to the fragment */
      char *fixed;
      size_t n;
      if (b->raw_bytes) fixed = NULL, n = i - frag;
      else if ((rc = ms_utf8_repair(text + frag, i - frag, &fixed, &n))) break;
      e.text = fixed ? fixed : text + frag;
      rc = ms_pretok_split(b->pre, e.text, n, bpe_piece, &e);
      free(fixed);
    }
    if (sp >= 0) {
      emit(&e, sp);
      prev_special = 1;
      i += strlen(tok_text(b, sp)) - 1;
    }
    frag = i + 1;
  }
  free(e.id);
  free(e.next);
  free(e.prev);
  free(e.heap);
  free(e.spell);
  if (rc) return rc;
  return e.n > INT32_MAX ? -E2BIG : (int)e.n;
}

long ms_bpe_decode(const struct ms_bpe *b, const int32_t *ids, int n, char *out, size_t size) {
  size_t len = 0;
  for (int i = 0; i < n; i++) {
    if (ids[i] < 0 || ids[i] >= b->n) return -EINVAL;
    const char *s = b->bytes + b->bytes_off[ids[i]];
    size_t k = b->bytes_off[ids[i] + 1] - b->bytes_off[ids[i]];
    for (size_t c = 0; c < k; c++, len++)
      if (len + 1 < size) out[len] = s[c];
  }
  if (size) out[len < size ? len : size - 1] = '\0';
  return (long)len;
}
