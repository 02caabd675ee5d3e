/* SPDX-License-Identifier: MIT */
/* The prefix cache: a request that shares a prompt prefix with earlier ones
 * computes only the positions past its cached prefix, and its tokens and the
 * logits of every position it computes are the same bits as an engine without
 * the cache computes them: a shared system prompt, a second turn that resends
 * the first turn and its answer, a prompt the cache holds whole (its last
 * page is computed, for the logits that draw the first token), requests that
 * compute one new prefix at once, and eviction from a pool too small to keep
 * everything; with chunked prefill and without, on synthetic models of four
 * architectures and, when the file is there, SmolLM2's Q4_1 GGUF with 8-bit
 * activations (the serving path). The cache's own bookkeeping (references,
 * the LRU, the free list) is checked after every run. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "megascope/gguf.h"
#include "runtime/runtime_impl.h"
#include "test.h"

#define NEW 10      /* tokens generated per request */
#define MAXP 160    /* longest prompt */
#define NSEQ 10     /* requests per run */

struct req_out {
  int n_prompt, n_cached, n_tokens;
  int32_t tokens[NEW];
  float *logits;    /* (n_prompt + NEW - 1, vocab) */
};

struct run_out {
  struct req_out r[NSEQ];
  int n;
  struct ms_engine_stats st;
  int bookkeeping_ok;
};

/* The cache's invariants, read while the engine idles between requests (the
 * step start is asleep on its mailbox): every page is exactly one of free,
 * held by slots (its count of references equal to the slots that list it),
 * or registered and idle in the LRU; the counters agree. */
static int check_bookkeeping(struct ms_engine *e) {
  struct prefix_cache *c = &e->pc;
  int n = e->pool_pages, ok = 1;
  int *refs = calloc((size_t)n, sizeof *refs), *seen = calloc((size_t)n, sizeof *seen);
  for (int s = 0; s < e->n_slots; s++)
    for (int k = 0; k < e->slots[s].n_pages; k++) refs[e->slots[s].pages[k]]++;
  for (int i = 0; i < e->n_free; i++) seen[e->free_pages[i]]++;
  int idle = 0, held = 0;
  if (c->on) {
    int32_t prev = -1;
    for (int32_t p = c->lru_head; p != -1 && idle <= n; p = c->lru_next[p], idle++) {
      ok &= c->lru_prev[p] == prev && c->ref[p] == 0 && c->cached[p];
      seen[p]++;
      prev = p;
    }
    ok &= c->lru_tail == prev && idle == atomic_load(&c->idle);
  }
  for (int p = 0; p < n; p++) {
    if (refs[p]) held++, seen[p]++;
    ok &= seen[p] == 1;
    if (c->on) ok &= c->ref[p] == refs[p];
  }
  ok &= held == c->held;
  free(refs);
  free(seen);
  return ok;
}

/* Submits one request and waits for it (requests run one after another, so
 * which prefixes are cached does not depend on timing). */
static int one(struct ms_engine *e, const int32_t *prompt, int n, struct req_out *out, int vocab) {
  struct ms_request_opts o = {.sz = sizeof o, .prompt = prompt, .n_prompt = n, .max_new_tokens = NEW,
                              .record_logits = 1};
  struct ms_request *r = ms_engine_submit(e, &o);
  if (!r) return -1;
  ms_request_wait(r, -1);
  struct ms_request_info info;
  ms_request_get_info(r, &info);
  out->n_prompt = n;
  out->n_cached = info.n_cached;
  out->n_tokens = info.n_tokens;
  memcpy(out->tokens, info.tokens, sizeof(int32_t) * (size_t)(info.n_tokens < NEW ? info.n_tokens : NEW));
  size_t sz = (size_t)(n + NEW - 1) * (size_t)vocab * sizeof(float);
  out->logits = malloc(sz);
  if (out->logits && info.n_logits == n + NEW - 1) memcpy(out->logits, info.logits, sz);
  int ok = info.state == MS_REQ_DONE && info.n_tokens == NEW && info.n_logits == n + NEW - 1;
  ms_request_free(r);
  return ok ? 0 : -1;
}

/* Four requests at once that share a prefix no earlier request had: they
 * compute it side by side, one registers it, the others' equal pages stay
 * their own. */
static int together(struct ms_engine *e, int32_t (*p)[MAXP], const int *n, int k, struct req_out *out, int vocab) {
  struct ms_request *r[4];
  ms_engine_pause_at(e, 0);  /* the idle engine's next step start waits */
  ms_engine_wait_paused(e, 10000);
  for (int i = 0; i < k; i++) {
    struct ms_request_opts o = {.sz = sizeof o, .prompt = p[i], .n_prompt = n[i], .max_new_tokens = NEW,
                                .record_logits = 1};
    if (!(r[i] = ms_engine_submit(e, &o))) return -1;
  }
  ms_engine_resume(e);
  int ok = 1;
  for (int i = 0; i < k; i++) {
    ms_request_wait(r[i], -1);
    struct ms_request_info info;
    ms_request_get_info(r[i], &info);
    out[i].n_prompt = n[i];
    out[i].n_cached = info.n_cached;
    out[i].n_tokens = info.n_tokens;
    memcpy(out[i].tokens, info.tokens, sizeof(int32_t) * (size_t)(info.n_tokens < NEW ? info.n_tokens : NEW));
    size_t sz = (size_t)(n[i] + NEW - 1) * (size_t)vocab * sizeof(float);
    if ((out[i].logits = malloc(sz)) && info.n_logits == n[i] + NEW - 1) memcpy(out[i].logits, info.logits, sz);
    ok &= info.state == MS_REQ_DONE && info.n_tokens == NEW;
    ms_request_free(r[i]);
  }
  return ok ? 0 : -1;
}

/* The sequence every engine runs. sys: a 37-token system prompt. */
static int sequence(const struct ms_model *m, struct ms_engine_opts o, struct run_out *res) {
  int vocab = m->cfg.vocab;
  o.sz = sizeof o;
  struct ms_engine *e = ms_engine_new(m, &o, NULL);
  if (!e) return -1;
  int32_t sys[37], p[NSEQ][MAXP], n[NSEQ];
  for (int i = 0; i < 37; i++) sys[i] = (int32_t)((i * 29 + 11) % vocab);
  int rc = 0, k = 0;
  /* 0: the system prompt and a question */
  memcpy(p[0], sys, sizeof sys);
  for (int i = 0; i < 5; i++) p[0][37 + i] = (int32_t)((i * 7 + 3) % vocab);
  n[0] = 42;
  rc |= one(e, p[0], n[0], &res->r[k++], vocab);
  /* 1: the same system prompt, another question: two whole pages cached */
  memcpy(p[1], sys, sizeof sys);
  for (int i = 0; i < 7; i++) p[1][37 + i] = (int32_t)((i * 5 + 1) % vocab);
  n[1] = 44;
  rc |= one(e, p[1], n[1], &res->r[k++], vocab);
  /* 2: the second turn: the first turn, its answer, a new question */
  memcpy(p[2], p[0], sizeof(int32_t) * 42);
  memcpy(p[2] + 42, res->r[0].tokens, sizeof(int32_t) * NEW);
  for (int i = 0; i < 6; i++) p[2][52 + i] = (int32_t)((i * 3 + 2) % vocab);
  n[2] = 58;
  rc |= one(e, p[2], n[2], &res->r[k++], vocab);
  /* 3: request 0's prompt again, all of it cached but its last page */
  memcpy(p[3], p[0], sizeof(int32_t) * 42);
  n[3] = 42;
  rc |= one(e, p[3], n[3], &res->r[k++], vocab);
  /* 4: a prompt of exactly two pages, both cached: the second is computed again */
  memcpy(p[4], sys, sizeof(int32_t) * 32);
  n[4] = 32;
  rc |= one(e, p[4], n[4], &res->r[k++], vocab);
  /* 5-8: four at once on a new 40-token prefix */
  int32_t q[4][MAXP];
  int nq[4];
  for (int j = 0; j < 4; j++) {
    for (int i = 0; i < 40; i++) q[j][i] = (int32_t)((i * 17 + 5) % vocab);
    for (int i = 0; i < 3 + j; i++) q[j][40 + i] = (int32_t)((i * 11 + j * 3 + 1) % vocab);
    nq[j] = 43 + j;
  }
  rc |= together(e, q, nq, 4, &res->r[k], vocab);
  k += 4;
  /* 9: the new prefix again, now registered once */
  memcpy(p[9], q[0], sizeof(int32_t) * 43);
  p[9][43] = 1;
  n[9] = 44;
  rc |= one(e, p[9], n[9], &res->r[k++], vocab);
  res->n = k;
  ms_engine_get_stats(e, &res->st);
  res->bookkeeping_ok = check_bookkeeping(e);
  ms_engine_free(e);
  return rc;
}

static void free_run(struct run_out *r) {
  for (int i = 0; i < r->n; i++) free(r->r[i].logits);
}

/* A cached run against an uncached one: tokens equal; logits equal bit for
 * bit at every computed position, NaN at the cached ones. */
static void compare(const char *what, const struct ms_model *m, const struct run_out *off, const struct run_out *on) {
  int vocab = m->cfg.vocab;
  for (int i = 0; i < on->n && i < off->n; i++) {
    const struct req_out *a = &off->r[i], *b = &on->r[i];
    CHECKF(!memcmp(a->tokens, b->tokens, sizeof a->tokens), "%s request %d: tokens differ", what, i);
    CHECKF(a->n_cached == 0, "%s request %d: %d cached without the cache", what, i, a->n_cached);
    if (!a->logits || !b->logits) continue;
    int rows = a->n_prompt + NEW - 1, bad = -1, nan_ok = 1;
    for (int r = 0; r < rows && bad < 0; r++) {
      const float *x = a->logits + (size_t)r * (size_t)vocab, *y = b->logits + (size_t)r * (size_t)vocab;
      if (r < b->n_cached)
        nan_ok &= isnan(y[0]) && isnan(y[vocab - 1]);
      else if (memcmp(x, y, sizeof(float) * (size_t)vocab))
        bad = r;
    }
    CHECKF(bad < 0, "%s request %d: logits of position %d differ", what, i, bad);
    CHECKF(nan_ok, "%s request %d: a cached position has logits", what, i);
  }
}

static void expect_hits(const char *what, const struct run_out *on) {
  /* pages of 16: 37 shared tokens are 2 whole pages; request 0 fed 42 + 9 positions, 3 whole pages */
  static const int want[NSEQ] = {0, 32, 48, 32, 16, -1, -1, -1, -1, 32};
  for (int i = 0; i < on->n; i++)
    if (want[i] >= 0) CHECKF(on->r[i].n_cached == want[i], "%s request %d: %d cached, want %d", what, i,
                             on->r[i].n_cached, want[i]);
  /* the four at once: admitted in one step, none finds the others' pages */
  for (int i = 5; i < 9; i++) CHECKF(on->r[i].n_cached == 0, "%s request %d: %d cached", what, i, on->r[i].n_cached);
  uint64_t q = 0, h = 0;
  for (int i = 0; i < on->n; i++) q += (uint64_t)on->r[i].n_prompt, h += (uint64_t)on->r[i].n_cached;
  CHECKF(on->st.prefix_queries == q && on->st.prefix_hits == h && on->st.prefix_hit_requests == 5,
         "%s: stats queries %llu (want %llu) hits %llu (want %llu) hit requests %llu", what,
         (unsigned long long)on->st.prefix_queries, (unsigned long long)q, (unsigned long long)on->st.prefix_hits,
         (unsigned long long)h, (unsigned long long)on->st.prefix_hit_requests);
  CHECKF(on->bookkeeping_ok, "%s: the cache's bookkeeping is inconsistent", what);
  CHECK(on->st.prefix_pages_cached > 0);
}

static void check_model(const char *name, const struct ms_model *m, int q8) {
  /* chunked prefill (a budget that splits every prompt) and one position a step */
  const int budgets[2] = {12, 0};
  for (int b = 0; b < 2; b++) {
    struct ms_engine_opts o = {.n_workers = 2, .max_batch = 4, .max_ctx = 96, .max_batched_tokens = budgets[b],
                               .q8_activations = q8};
    struct run_out off = {0}, on = {0};
    char what[96];
    snprintf(what, sizeof what, "%s%s", name, b ? "" : " chunked");
    CHECKF(sequence(m, o, &off) == 0, "%s: the run without the cache failed", what);
    o.prefix_cache = 1;
    CHECKF(sequence(m, o, &on) == 0, "%s: the run with the cache failed", what);
    compare(what, m, &off, &on);
    expect_hits(what, &on);
    CHECKF(off.bookkeeping_ok && off.st.prefix_queries == 0, "%s: without the cache", what);
    /* the cache computes fewer positions: every cached one is a row not run */
    CHECKF(off.st.positions - on.st.positions == on.st.prefix_hits, "%s: %llu positions, %llu with the cache, %llu hits",
           what, (unsigned long long)off.st.positions, (unsigned long long)on.st.positions,
           (unsigned long long)on.st.prefix_hits);
    free_run(&off);
    free_run(&on);
  }
}

/* A pool too small for every prefix: 2 slots of 4 pages hold 8 pages in all.
 * Eviction takes the least recently used idle page: prefix 0, cached first but
 * used again since, outlives prefixes cached after it; and every answer is
 * still the uncached engine's. */
static void test_eviction(void) {
  struct ms_model_config c;
  ms_preset_config("tiny", MS_DTYPE_F32, &c);
  struct ms_model *m = ms_model_synth(&c, 3);
  int vocab = m->cfg.vocab;
  int32_t p[9][MAXP];
  for (int j = 0; j < 9; j++)
    for (int i = 0; i < 20; i++) p[j][i] = (int32_t)((i * (j + 3) + 7 * j + 1) % vocab);
  /* each request: 20 prompt tokens, 29 positions fed, 2 pages, 1 whole one
   * cached after it (19 / 16: a hit is 16 positions) */
  const int order[] = {0, 1, 2, 3, 0, 4, 5, 6, 7, 8, 0, 2};
  const int want[] = {0, 0, 0, 0, 16, 0, 0, 0, 0, 0, 16, 0};
  enum { N = sizeof order / sizeof order[0] };
  struct req_out off[N], on[N];
  memset(off, 0, sizeof off);
  memset(on, 0, sizeof on);
  for (int pass = 0; pass < 2; pass++) {
    struct ms_engine_opts o = {.sz = sizeof o, .n_workers = 2, .max_batch = 2, .max_ctx = 64,
                               .max_batched_tokens = 8, .prefix_cache = pass};
    struct ms_engine *e = ms_engine_new(m, &o, NULL);
    CHECK(e && e->pool_pages == 8);
    if (!e) break;
    for (int k = 0; k < N; k++) {
      CHECK(one(e, p[order[k]], 20, pass ? &on[k] : &off[k], vocab) == 0);
      if (pass) {
        CHECKF(check_bookkeeping(e), "eviction: bookkeeping after request %d", k);
        CHECKF(on[k].n_cached == want[k], "eviction: request %d (prefix %d): %d cached, want %d", k, order[k],
               on[k].n_cached, want[k]);
      }
    }
    struct ms_engine_stats st;
    ms_engine_get_stats(e, &st);
    if (pass) CHECKF(st.prefix_evictions > 0 && st.prefix_pages_cached <= 8, "%llu evictions",
                     (unsigned long long)st.prefix_evictions);
    ms_engine_free(e);
  }
  for (int k = 0; k < N; k++) {
    CHECKF(!memcmp(off[k].tokens, on[k].tokens, sizeof off[k].tokens), "eviction request %d: tokens differ", k);
    for (int r = on[k].n_cached; r < 20 + NEW - 1 && off[k].logits && on[k].logits; r++)
      if (memcmp(off[k].logits + (size_t)r * (size_t)vocab, on[k].logits + (size_t)r * (size_t)vocab,
                 sizeof(float) * (size_t)vocab)) {
        CHECKF(0, "eviction request %d: logits of position %d differ", k, r);
        break;
      }
    free(off[k].logits);
    free(on[k].logits);
  }
  ms_model_free(m);
}

/* The CUDA backend keeps the cache off (its page table learns pages from
 * rows); the option's zero is off. */
static void test_defaults(void) {
  struct ms_engine_opts o = {.sz = sizeof o};
  CHECK(o.prefix_cache == 0);
}

int main(void) {
  const char *presets[] = {"tiny", "tiny-gemma3", "tiny-moe", "tiny-qwen3"};
  for (size_t i = 0; i < sizeof presets / sizeof *presets; i++) {
    struct ms_model_config c;
    if (ms_preset_config(presets[i], MS_DTYPE_F32, &c)) continue;
    struct ms_model *m = ms_model_synth(&c, 3);
    CHECK(m != NULL);
    if (m) check_model(presets[i], m, 0);
    ms_model_free(m);
  }
  test_eviction();
  test_defaults();
  /* the serving path on a real file: Q4_1 weights, 8-bit activations */
  char path[1024];
  const char *home = getenv("HOME");
  snprintf(path, sizeof path, "%s/.cache/megascope/SmolLM2-135M-Instruct.Q4_1.gguf", home ? home : "");
  if (access(path, R_OK)) {
    SKIP_PART("%s is not there (scripts/get-smollm2.sh fetches it)", path);
  } else {
    struct ms_model *m = NULL;
    CHECK(ms_gguf_load(path, &m, NULL, NULL) == 0);
    if (m) check_model("SmolLM2-135M Q4_1", m, 1);
    ms_model_free(m);
  }
  TEST_MAIN_END();
}
