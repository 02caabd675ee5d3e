/* SPDX-License-Identifier: MIT */
/* Structured output through llguidance's C API (structured.h).
 *
 * Threads: schemas are asked for by the HTTP threads (under se->lock: the
 * library's loading, the tokenizer, the cache); a constraint belongs to one
 * request and is called by the worker that draws its row, one draw at a time
 * (the engine's promise), and freed by the engine at the request's last
 * release. A schema is reference-counted: the cache holds one reference and
 * every constraint cloned from it another, so an eviction never frees a
 * matcher in use. */
#include "control/structured.h"

#include <dlfcn.h>
#include <errno.h>
#include <glob.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "megascope/base.h"
#include "megascope/tokenizer.h"

/* ---- the part of llguidance's C API used here (its parser/llguidance.h,
 * version 1.8.0, the one scripts/deps.sh installs; MIT) ---- */

struct llg_tokenizer;
struct llg_matcher;

typedef size_t (*llg_tokenize_fn)(const void *user, const uint8_t *bytes, size_t n, uint32_t *out, size_t out_n);

/* LlgTokenizerInitV2: the library reads struct_size bytes of it. */
struct llg_tokenizer_init_v2 {
  size_t struct_size;
  uint32_t vocab_size;
  uint32_t tok_eos;
  const uint32_t *token_lens;
  const uint8_t *token_bytes;
  const char *tokenizer_json;
  bool tokenize_assumes_string;
  llg_tokenize_fn tokenize_fn;
  bool use_approximate_greedy_tokenize_fn;
  const void *tokenize_user_data;
  const char *const *slices;
  const uint32_t *tok_eos_extra;
  uint32_t tok_eos_extra_count;
};

/* LlgConstraintInit carries no size: it is filled by the library's own
 * llg_constraint_init_set_defaults into room larger than the struct this
 * version has, and only its first field (the tokenizer) is written here. */
union llg_constraint_init {
  const struct llg_tokenizer *tokenizer;
  unsigned char room[1024];
};

struct llg_api {
  void (*init_defaults)(union llg_constraint_init *, const struct llg_tokenizer *);
  struct llg_tokenizer *(*new_tokenizer_v2)(const struct llg_tokenizer_init_v2 *, char *, size_t);
  void (*free_tokenizer)(struct llg_tokenizer *);
  struct llg_matcher *(*new_matcher)(const union llg_constraint_init *, const char *, const char *);
  const char *(*matcher_error)(struct llg_matcher *);
  int32_t (*compute_mask_into)(struct llg_matcher *, uint32_t *, size_t);
  size_t (*mask_bytes)(const struct llg_matcher *);
  int32_t (*consume_token)(struct llg_matcher *, uint32_t);
  bool (*is_error)(const struct llg_matcher *);
  struct llg_matcher *(*clone_matcher)(const struct llg_matcher *);
  void (*free_matcher)(struct llg_matcher *);
  const char *(*version)(void);
};

/* ---- the engine ---- */

struct so_schema {
  struct so_engine *se;
  char *key;                  /* kind, NUL, data: the cache's key */
  size_t key_len;
  struct llg_matcher *proto; /* compiled, never advanced: cloned per choice */
  _Atomic int refs;
  uint64_t used;              /* the cache's clock when last asked for (under se->lock) */
};

struct so_engine {
  pthread_mutex_t lock;
  const struct ms_tokenizer *tok;
  int vocab, eos, eos2;
  int tried;                  /* loading was attempted (its result stays) */
  char why[1024];             /* why llguidance is unavailable */
  void *lib;
  struct llg_api api;
  struct llg_tokenizer *ltok;
  size_t mask_bytes;
  struct so_schema *cache[SO_CACHE_SCHEMAS];
  uint64_t clock;
};

struct so_constraint {
  struct so_schema *s;
  struct llg_matcher *m;
  int fed;                    /* tokens consumed */
  int failed;                 /* the matcher is in error: only the ends are allowed */
  uint32_t mask[];            /* mask_bytes */
};

/* The first file a glob pattern matches, into out. */
static int glob_first(const char *pattern, char *out, size_t n) {
  glob_t g;
  int found = glob(pattern, 0, NULL, &g) == 0 && g.gl_pathc > 0;
  if (found) snprintf(out, n, "%s", g.gl_pathv[0]);
  globfree(&g);
  return found ? 0 : -1;
}

#define LLG_IN_VENV "/.venv/lib/python3*/site-packages/llguidance/_lib*.so"

/* $MEGASCOPE_LLGUIDANCE, else the .venv beside the binary's folder, else the
 * source tree's. */
static int find_library(char *out, size_t n) {
  const char *env = getenv("MEGASCOPE_LLGUIDANCE");
  if (env && env[0]) {
    snprintf(out, n, "%s", env);
    return 0;
  }
  char exe[4096], pat[4200];
  ssize_t k = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (k > 0) {
    exe[k] = '\0';
    char *slash = strrchr(exe, '/');
    if (slash) *slash = '\0';
    snprintf(pat, sizeof pat, "%s/.." LLG_IN_VENV, exe);
    if (!glob_first(pat, out, n)) return 0;
  }
#ifdef MS_SOURCE_DIR
  if (!glob_first(MS_SOURCE_DIR LLG_IN_VENV, out, n)) return 0;
#endif
  return -1;
}

/* The shared libpython3 the library's Python half refers to, made global. */
static int load_libpython(char *why, size_t n) {
  static const char *const names[] = {"libpython3.13.so.1.0", "libpython3.12.so.1.0", "libpython3.11.so.1.0",
                                      "libpython3.10.so.1.0", "libpython3.9.so.1.0", "libpython3.14.so.1.0"};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
    if (dlopen(names[i], RTLD_NOW | RTLD_GLOBAL)) return 0;
  snprintf(why, n, "no shared libpython3 (libpython3.X.so.1.0) to load it with: Debian's libpython3-dev has it");
  return -1;
}

static int bind_api(struct so_engine *se) {
  struct llg_api *a = &se->api;
#define SYM(f, name) (*(void **)&a->f = dlsym(se->lib, name)) == NULL
  if (SYM(init_defaults, "llg_constraint_init_set_defaults") || SYM(new_tokenizer_v2, "llg_new_tokenizer_v2") ||
      SYM(free_tokenizer, "llg_free_tokenizer") || SYM(new_matcher, "llg_new_matcher") ||
      SYM(matcher_error, "llg_matcher_get_error") || SYM(compute_mask_into, "llg_matcher_compute_mask_into") ||
      SYM(mask_bytes, "llg_matcher_get_mask_byte_size") || SYM(consume_token, "llg_matcher_consume_token") ||
      SYM(is_error, "llg_matcher_is_error") || SYM(clone_matcher, "llg_clone_matcher") ||
      SYM(free_matcher, "llg_free_matcher") || SYM(version, "llg_get_version"))
    return -1;
#undef SYM
  return 0;
}

/* llguidance calls it to tokenize text it forces (thread-safe: the tokenizer
 * is read-only). */
static size_t tokenize_cb(const void *user, const uint8_t *bytes, size_t n, uint32_t *out, size_t out_n) {
  const struct ms_tokenizer *tok = user;
  int32_t small[64], *ids = out_n <= 64 ? small : malloc(out_n * sizeof *ids);
  if (!ids) return 0;
  int k = ms_tokenizer_encode(tok, (const char *)bytes, n, ids, (int)(out_n > 64 ? out_n : 64));
  for (int i = 0; i < k && (size_t)i < out_n; i++) out[i] = (uint32_t)ids[i];
  if (ids != small) free(ids);
  return k < 0 ? 0 : (size_t)k;
}

/* The library's tokenizer: every id's bytes (a control token as 0xFF and its
 * name, llguidance's mark for a special token), the ends, the tokenize call. */
static int make_tokenizer(struct so_engine *se) {
  size_t cap = (size_t)se->vocab * 16 + 4096, off = 0;
  uint32_t *lens = malloc((size_t)se->vocab * sizeof *lens);
  uint8_t *bytes = malloc(cap);
  int rc = lens && bytes ? 0 : -ENOMEM;
  for (int id = 0; !rc && id < se->vocab; id++) {
    char buf[512];
    int32_t t = id;
    int special = ms_tokenizer_is_control(se->tok, t);
    long k = ms_tokenizer_decode(se->tok, &t, 1, buf, sizeof buf);
    if (k < 0 || (size_t)k >= sizeof buf) k = 0;
    if (off + (size_t)k + 1 > cap) {
      uint8_t *nb = realloc(bytes, cap *= 2);
      if (!nb) {
        rc = -ENOMEM;
        break;
      }
      bytes = nb;
    }
    if (special && k > 0) bytes[off++] = 0xff;
    memcpy(bytes + off, buf, (size_t)k);
    off += (size_t)k;
    lens[id] = (uint32_t)k + (special && k > 0);
  }
  uint32_t extra = (uint32_t)se->eos2;
  struct llg_tokenizer_init_v2 ti = {.struct_size = sizeof ti, .vocab_size = (uint32_t)se->vocab,
                                     .tok_eos = (uint32_t)se->eos, .token_lens = lens, .token_bytes = bytes,
                                     .tokenize_assumes_string = true, .tokenize_fn = tokenize_cb,
                                     .tokenize_user_data = se->tok, .tok_eos_extra = se->eos2 >= 0 ? &extra : NULL,
                                     .tok_eos_extra_count = se->eos2 >= 0};
  char err[512] = "";
  if (!rc && !(se->ltok = se->api.new_tokenizer_v2(&ti, err, sizeof err))) {
    snprintf(se->why, sizeof se->why, "llguidance refused the vocabulary: %s", err);
    rc = -EINVAL;
  }
  free(lens);
  free(bytes);
  return rc;
}

/* Loads llguidance once (under se->lock); 0, or -1 with se->why. */
static int load(struct so_engine *se) {
  if (se->tried) return se->ltok ? 0 : -1;
  se->tried = 1;
  char path[4096];
  if (find_library(path, sizeof path)) {
    snprintf(se->why, sizeof se->why,
             "structured output needs llguidance (the PyPI wheel, in the project's .venv: scripts/deps.sh "
             "installs it; or $MEGASCOPE_LLGUIDANCE naming its _lib.abi3.so)");
    return -1;
  }
  if (load_libpython(se->why, sizeof se->why)) return -1;
  if (!(se->lib = dlopen(path, RTLD_NOW | RTLD_LOCAL))) {
    snprintf(se->why, sizeof se->why, "cannot load llguidance (%.400s): %.500s", path, dlerror());
    return -1;
  }
  if (bind_api(se)) {
    snprintf(se->why, sizeof se->why, "%.400s lacks llguidance's C API (llg_new_matcher ...)", path);
    return -1;
  }
  if (make_tokenizer(se)) {
    if (!se->why[0]) snprintf(se->why, sizeof se->why, "out of memory building llguidance's vocabulary");
    return -1;
  }
  ms_logf(MS_LOG_INFO, "structured output: %s from %s", se->api.version(), path);
  return 0;
}

struct so_engine *so_engine_new(const struct ms_tokenizer *tok, int vocab, int eos, int eos2) {
  if (!tok || vocab < 1 || eos < 0 || eos >= vocab || eos2 >= vocab) {
    errno = EINVAL;
    return NULL;
  }
  struct so_engine *se = calloc(1, sizeof *se);
  if (!se) return NULL;
  pthread_mutex_init(&se->lock, NULL);
  se->tok = tok;
  se->vocab = vocab;
  se->eos = eos;
  se->eos2 = eos2 == eos ? -1 : eos2;
  return se;
}

static void schema_free(struct so_schema *s) {
  if (s->proto) s->se->api.free_matcher(s->proto);
  free(s->key);
  free(s);
}

void so_schema_put(struct so_schema *s) {
  if (s && atomic_fetch_sub_explicit(&s->refs, 1, memory_order_acq_rel) == 1) schema_free(s);
}

void so_engine_free(struct so_engine *se) {
  if (!se) return;
  for (int i = 0; i < SO_CACHE_SCHEMAS; i++) so_schema_put(se->cache[i]);
  if (se->ltok) se->api.free_tokenizer(se->ltok);
  /* the library stays loaded: a Rust runtime's thread-locals do not unload */
  pthread_mutex_destroy(&se->lock);
  free(se);
}

const char *so_version(struct so_engine *se) { return se && se->ltok ? se->api.version() : NULL; }

/* Compiles kind/data (under se->lock). */
static struct so_schema *compile(struct so_engine *se, const char *key, size_t key_len, const char *kind,
                                 const char *data, char *msg, size_t msg_n) {
  union llg_constraint_init ci;
  memset(&ci, 0, sizeof ci);
  se->api.init_defaults(&ci, se->ltok);
  struct so_schema *s = calloc(1, sizeof *s);
  if (!s || !(s->key = malloc(key_len))) {
    free(s);
    snprintf(msg, msg_n, "out of memory");
    return NULL;
  }
  memcpy(s->key, key, key_len);
  s->key_len = key_len;
  s->se = se;
  atomic_init(&s->refs, 1);
  s->proto = se->api.new_matcher(&ci, kind, data ? data : "{}");
  const char *err = s->proto ? se->api.matcher_error(s->proto) : "llguidance returned no matcher";
  if (err) {
    snprintf(msg, msg_n, "%s", err);
    schema_free(s);
    return NULL;
  }
  if (!se->mask_bytes) se->mask_bytes = se->api.mask_bytes(s->proto);
  return s;
}

struct so_schema *so_schema_get(struct so_engine *se, const char *kind, const char *data, char *msg, size_t msg_n,
                                int *unavailable) {
  *unavailable = 0;
  size_t kn = strlen(kind), dn = data ? strlen(data) : 0, key_len = kn + 1 + dn;
  char *key = malloc(key_len);
  if (!key) {
    snprintf(msg, msg_n, "out of memory");
    return NULL;
  }
  memcpy(key, kind, kn + 1);
  if (dn) memcpy(key + kn + 1, data, dn);
  struct so_schema *s = NULL;
  pthread_mutex_lock(&se->lock);
  if (load(se)) {
    snprintf(msg, msg_n, "%s", se->why);
    *unavailable = 1;
    goto out;
  }
  int free_i = -1, old_i = 0;
  for (int i = 0; i < SO_CACHE_SCHEMAS; i++) {
    struct so_schema *c = se->cache[i];
    if (!c) {
      if (free_i < 0) free_i = i;
      continue;
    }
    if (c->key_len == key_len && !memcmp(c->key, key, key_len)) {
      s = c;
      break;
    }
    if (se->cache[old_i] && c->used < se->cache[old_i]->used) old_i = i;
  }
  if (!s && (s = compile(se, key, key_len, kind, data, msg, msg_n))) {
    int at = free_i >= 0 ? free_i : old_i;
    so_schema_put(se->cache[at]);  /* constraints cloned from it keep theirs */
    se->cache[at] = s;
  }
  if (s) {
    s->used = ++se->clock;
    atomic_fetch_add_explicit(&s->refs, 1, memory_order_relaxed);
  }
out:
  pthread_mutex_unlock(&se->lock);
  free(key);
  return s;
}

void *so_constraint_new(struct so_schema *s) {
  struct so_engine *se = s->se;
  struct so_constraint *c = calloc(1, sizeof *c + se->mask_bytes);
  if (!c) return NULL;
  if (!(c->m = se->api.clone_matcher(s->proto))) {
    free(c);
    errno = ENOMEM;
    return NULL;
  }
  atomic_fetch_add_explicit(&s->refs, 1, memory_order_relaxed);
  c->s = s;
  return c;
}

void so_constraint_free(void *user) {
  struct so_constraint *c = user;
  if (!c) return;
  c->s->se->api.free_matcher(c->m);
  so_schema_put(c->s);
  free(c);
}

void so_constrain(void *user, const int32_t *tokens, int n, float *logits, int vocab) {
  struct so_constraint *c = user;
  const struct so_engine *se = c->s->se;
  const struct llg_api *a = &se->api;
  for (; c->fed < n && !c->failed; c->fed++)
    if (a->consume_token(c->m, (uint32_t)tokens[c->fed])) c->failed = 1;
  if (!c->failed && a->compute_mask_into(c->m, c->mask, se->mask_bytes)) c->failed = 1;
  if (c->failed) {  /* a token the grammar did not allow, or its error: end the text */
    memset(c->mask, 0, se->mask_bytes);
    c->mask[se->eos / 32] |= 1u << (se->eos % 32);
    if (se->eos2 >= 0) c->mask[se->eos2 / 32] |= 1u << (se->eos2 % 32);
  }
  int words = (int)(se->mask_bytes / 4);
  for (int w = 0; w < words; w++) {
    uint32_t m = c->mask[w];
    if (m == 0xffffffffu) continue;
    for (int b = 0; b < 32; b++)
      if (!(m >> b & 1) && w * 32 + b < vocab) logits[w * 32 + b] = -INFINITY;
  }
}
