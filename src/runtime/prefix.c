/* SPDX-License-Identifier: MIT */
/* Automatic prefix caching: the KV pages a request filled outlive it, keyed by
 * the tokens they hold, and a later request whose prompt begins with the same
 * pages shares them instead of computing them again.
 *
 * Why a hash chain over whole pages (as vLLM) and not a radix tree over tokens
 * (as SGLang): the KV cache is already paged, a page is the unit a slot's page
 * table maps and the unit that can be shared without copying, and a page
 * shared by requests must never be written. A radix tree matches prefixes to
 * the token, but a match that ends inside a page gains nothing here unless the
 * page is copied; keyed by whole pages, a lookup is one hash and one
 * comparison of page_size tokens per page, and the structure is a table of
 * pages, with no nodes to split or merge.
 *
 * A page's key is (the page before it in its chain and that page's epoch, its
 * tokens); its hash (FNV-1a over the tokens, seeded with the parent's hash,
 * then a splitmix64 finish: written here, a dozen lines) only picks the
 * bucket. A lookup compares the parent and every token, so a hash collision can
 * never hand out the wrong KV: a match is exact by induction from the chain's
 * first page. A page that leaves the cache bumps its epoch, so children keyed
 * to its old content are never matched through its new one.
 *
 * Lifecycle, all on the step start (one thread):
 *  - admission (ms_pc_admit): the longest chain of registered pages matching
 *    the prompt's whole pages, at most (n_prompt - 1) / page_size of them, so
 *    the last prompt position is always computed (its logits draw the first
 *    token) and goes into a page of the slot's own; the slot takes them (ref
 *    + 1, out of the LRU) and starts at the position after them;
 *  - each step start (ms_pc_publish): a slot's pages made whole by the steps
 *    that ended (every position written) are registered; a page whose key is
 *    already registered (two requests computed the same prefix at once) stays
 *    the slot's own and unregistered, and the slot's chain continues from the
 *    registered one;
 *  - retire (ms_pc_release): the slot's pages lose a reference, last page
 *    first; an unreferenced registered page joins the LRU's young end (so a
 *    chain's tail is evicted before its head), an unregistered one the free
 *    list;
 *  - a slot that needs a page (ms_pc_page_take) takes a free one, else evicts
 *    the LRU's oldest. There is always one: the pool holds max_pages per slot,
 *    and a slot holds at most max_pages, so the pages held never exceed it.
 * A slot writes only positions at or past its cached prefix, which lie in
 * pages of its own (a cached prefix is whole pages), so no shared page is
 * ever written. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/runtime_impl.h"

#define NONE (-1)

static uint64_t chain_hash(uint64_t parent, const int32_t *tok, int n) {
  uint64_t h = parent ^ 0xcbf29ce484222325ull;
  for (int i = 0; i < n; i++) {
    uint32_t v = (uint32_t)tok[i];
    for (int b = 0; b < 4; b++) {
      h ^= (v >> (8 * b)) & 0xff;
      h *= 0x100000001b3ull;
    }
  }
  h ^= h >> 30;  /* splitmix64's finish: spread the FNV bits over the bucket index */
  h *= 0xbf58476d1ce4e5b9ull;
  h ^= h >> 27;
  h *= 0x94d049bb133111ebull;
  return h ^ (h >> 31);
}

/* The token at position p of r's sequence (prompt, then the tokens generated). */
static int32_t token_at(const struct ms_request *r, int p) {
  return p < r->n_prompt ? r->prompt[p] : r->tokens[p - r->n_prompt];
}

int ms_pc_init(struct ms_engine *e) {
  struct prefix_cache *c = &e->pc;
  c->on = e->o.prefix_cache != 0;
  c->page_size = e->o.page_size;
  c->n_pages = e->pool_pages;
  c->lru_head = c->lru_tail = NONE;
  if (!c->on) return 0;
  size_t n = (size_t)c->n_pages;
  for (c->n_buckets = 1; c->n_buckets < 2 * c->n_pages; c->n_buckets <<= 1) {
  }
  c->ref = calloc(n, sizeof *c->ref);
  c->cached = calloc(n, sizeof *c->cached);
  c->hash = calloc(n, sizeof *c->hash);
  c->parent = calloc(n, sizeof *c->parent);
  c->epoch = calloc(n, sizeof *c->epoch);
  c->parent_epoch = calloc(n, sizeof *c->parent_epoch);
  c->tokens = calloc(n * (size_t)c->page_size, sizeof *c->tokens);
  c->next = calloc(n, sizeof *c->next);
  c->lru_prev = calloc(n, sizeof *c->lru_prev);
  c->lru_next = calloc(n, sizeof *c->lru_next);
  c->head = malloc((size_t)c->n_buckets * sizeof *c->head);
  if (!c->ref || !c->cached || !c->hash || !c->parent || !c->epoch || !c->parent_epoch || !c->tokens || !c->next ||
      !c->lru_prev || !c->lru_next || !c->head)
    return -ENOMEM;
  for (int b = 0; b < c->n_buckets; b++) c->head[b] = NONE;
  return 0;
}

void ms_pc_free(struct ms_engine *e) {
  struct prefix_cache *c = &e->pc;
  free(c->ref);
  free(c->cached);
  free(c->hash);
  free(c->parent);
  free(c->epoch);
  free(c->parent_epoch);
  free(c->tokens);
  free(c->next);
  free(c->lru_prev);
  free(c->lru_next);
  free(c->head);
  memset(c, 0, sizeof *c);
}

/* ---- the LRU of registered pages no slot holds ---- */

static void lru_remove(struct prefix_cache *c, int32_t p) {
  int32_t a = c->lru_prev[p], b = c->lru_next[p];
  if (a != NONE) c->lru_next[a] = b; else c->lru_head = b;
  if (b != NONE) c->lru_prev[b] = a; else c->lru_tail = a;
  atomic_store_explicit(&c->idle, atomic_load_explicit(&c->idle, memory_order_relaxed) - 1, memory_order_relaxed);
}

static void lru_push_young(struct prefix_cache *c, int32_t p) {
  c->lru_prev[p] = c->lru_tail;
  c->lru_next[p] = NONE;
  if (c->lru_tail != NONE) c->lru_next[c->lru_tail] = p; else c->lru_head = p;
  c->lru_tail = p;
  atomic_store_explicit(&c->idle, atomic_load_explicit(&c->idle, memory_order_relaxed) + 1, memory_order_relaxed);
}

/* ---- the table ---- */

static void table_remove(struct prefix_cache *c, int32_t p) {
  int32_t *at = &c->head[c->hash[p] & (uint64_t)(c->n_buckets - 1)];
  while (*at != p) at = &c->next[*at];
  *at = c->next[p];
  c->cached[p] = 0;
  c->epoch[p]++;  /* children keyed to this content no longer match through the page */
}

/* The registered page holding tokens tok after `parent` as it was in epoch
 * `pe` (NONE: a chain's first page) whose hash is h, or NONE. */
static int32_t table_find(const struct prefix_cache *c, uint64_t h, int32_t parent, uint32_t pe, const int32_t *tok) {
  for (int32_t p = c->head[h & (uint64_t)(c->n_buckets - 1)]; p != NONE; p = c->next[p]) {
    if (c->hash[p] != h || c->parent[p] != parent) continue;
    if (parent != NONE && c->parent_epoch[p] != pe) continue;  /* keyed to another content of that page */
    if (!memcmp(c->tokens + (size_t)p * (size_t)c->page_size, tok, sizeof *tok * (size_t)c->page_size)) return p;
  }
  return NONE;
}

int32_t ms_pc_page_take(struct ms_engine *e) {
  struct prefix_cache *c = &e->pc;
  int32_t p;
  if (e->n_free > 0) {
    p = e->free_pages[--e->n_free];
  } else {
    MS_ASSERT(c->on && c->lru_head != NONE);  /* the pool holds every slot's max_pages */
    p = c->lru_head;
    lru_remove(c, p);
    table_remove(c, p);
    atomic_fetch_add_explicit(&c->evictions, 1, memory_order_relaxed);
  }
  if (c->on) c->ref[p] = 1;
  c->held++;
  return p;
}

int ms_pc_admit(struct ms_engine *e, struct slot *sl, struct ms_request *r) {
  struct prefix_cache *c = &e->pc;
  sl->n_hashed = 0;
  sl->chain_page = NONE;
  sl->chain_epoch = 0;
  sl->chain_hash = 0;
  r->n_cached = 0;
  if (!c->on) return 0;
  int ps = c->page_size, most = (r->n_prompt - 1) / ps, k = 0;
  int32_t parent = NONE;
  uint64_t h = 0;
  for (; k < most; k++) {
    uint64_t hk = chain_hash(h, r->prompt + (size_t)k * (size_t)ps, ps);
    int32_t p = table_find(c, hk, parent, parent == NONE ? 0 : c->epoch[parent], r->prompt + (size_t)k * (size_t)ps);
    if (p == NONE) break;
    if (c->ref[p]++ == 0) {
      lru_remove(c, p);
      c->held++;
    }
    sl->pages[sl->n_pages++] = p;
    parent = p;
    h = hk;
  }
  sl->n_hashed = k;
  sl->chain_page = parent;
  sl->chain_epoch = parent == NONE ? 0 : c->epoch[parent];
  sl->chain_hash = h;
  r->n_cached = k * ps;
  if (r->record)  /* recorded logits: a position read from the cache has none */
    for (size_t i = 0; i < (size_t)r->n_cached * (size_t)e->m->cfg.vocab; i++) r->logits[i] = NAN;
  atomic_fetch_add_explicit(&c->queries, (uint64_t)r->n_prompt, memory_order_relaxed);
  if (k) {
    atomic_fetch_add_explicit(&c->hits, (uint64_t)r->n_cached, memory_order_relaxed);
    atomic_fetch_add_explicit(&c->hit_requests, 1, memory_order_relaxed);
  }
  return r->n_cached;
}

void ms_pc_publish(struct ms_engine *e, struct slot *sl) {
  struct prefix_cache *c = &e->pc;
  if (!c->on || !sl->req) return;
  int ps = c->page_size, whole = sl->pos / ps;  /* positions < pos are written: steps before this one */
  for (int k = sl->n_hashed; k < whole && k < sl->n_pages; k++) {
    int32_t p = sl->pages[k];
    /* the slot's own page (a cached prefix is hashed at admission), so its
     * key's tokens can be written in place before it is known to match */
    int32_t *t = c->tokens + (size_t)p * (size_t)ps;
    MS_ASSERT(!c->cached[p]);
    for (int i = 0; i < ps; i++) t[i] = token_at(sl->req, k * ps + i);
    uint64_t hk = chain_hash(sl->chain_hash, t, ps);
    int32_t have = table_find(c, hk, sl->chain_page, sl->chain_epoch, t);
    if (have == NONE) {  /* the first page of this content: findable from now on */
      c->cached[p] = 1;
      c->hash[p] = hk;
      c->parent[p] = sl->chain_page;
      c->parent_epoch[p] = sl->chain_epoch;
      size_t b = hk & (uint64_t)(c->n_buckets - 1);
      c->next[p] = c->head[b];
      c->head[b] = p;
      have = p;
    }
    /* the chain goes on from the cache's page of this content (an equal page
     * another request registered first: this one stays the slot's alone) */
    sl->chain_page = have;
    sl->chain_epoch = c->epoch[have];
    sl->chain_hash = hk;
    sl->n_hashed = k + 1;
  }
}

void ms_pc_release(struct ms_engine *e, struct slot *sl) {
  struct prefix_cache *c = &e->pc;
  for (int k = sl->n_pages - 1; k >= 0; k--) {  /* last page first: a chain's tail ages before its head */
    int32_t p = sl->pages[k];
    if (c->on && --c->ref[p] > 0) continue;
    c->held--;
    if (c->on && c->cached[p])
      lru_push_young(c, p);
    else
      e->free_pages[e->n_free++] = p;
  }
  sl->n_pages = 0;
  sl->n_hashed = 0;
}

int ms_pc_pages_held(const struct ms_engine *e) { return e->pc.held; }
