/* SPDX-License-Identifier: MIT */
/* Several engines' maps of one query as one map source (replicas behind a
 * load balancer, asked one question). A merged map's entries are the union of
 * the engines' keys; each entry's values are every engine's workers side by
 * side, engine after engine, with zeros where an engine never wrote the key
 * (a zero is what an unwritten per-worker value holds, and what min and max
 * read as "no value"). The writer then merges engines exactly as it merges
 * one engine's workers (output.c), so there is one merge rule, not two.
 *
 * Each read builds the union afresh: a small open-addressed table of the keys
 * seen, in the order first seen, then one call per key. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "query/query_impl.h"

struct slot {
  uint8_t *key;     /* key_size bytes */
  uint8_t *values;  /* total_workers * value_size bytes */
};

struct uview {
  const struct ms_query_union *u;
  size_t map;
  uint32_t key_size, value_size, total_workers;
  size_t worker_off;      /* the engine being read: its first worker's index */
  uint32_t cur_workers;   /* and its workers */
  struct slot *slots;     /* in the order first seen */
  size_t n, cap;
  uint32_t *index;        /* open addressing over slots: i + 1, 0 empty */
  size_t index_cap;       /* a power of two */
  int err;
};

static uint64_t key_hash(const uint8_t *k, uint32_t n) {
  uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */
  for (uint32_t i = 0; i < n; i++) h = (h ^ k[i]) * 0x100000001b3ull;
  return h ^ (h >> 29);
}

static int regrow(struct uview *v) {
  size_t cap = v->index_cap ? 2 * v->index_cap : 64;
  uint32_t *ix = calloc(cap, sizeof *ix);
  if (!ix) return -ENOMEM;
  for (size_t i = 0; i < v->n; i++) {
    size_t h = (size_t)key_hash(v->slots[i].key, v->key_size) & (cap - 1);
    while (ix[h]) h = (h + 1) & (cap - 1);
    ix[h] = (uint32_t)(i + 1);
  }
  free(v->index);
  v->index = ix;
  v->index_cap = cap;
  return 0;
}

/* The slot holding key, added (zeroed) when absent; NULL on ENOMEM. */
static struct slot *find(struct uview *v, const uint8_t *key) {
  if (2 * (v->n + 1) > v->index_cap && regrow(v)) return NULL;
  size_t h = (size_t)key_hash(key, v->key_size) & (v->index_cap - 1);
  for (; v->index[h]; h = (h + 1) & (v->index_cap - 1)) {
    struct slot *s = &v->slots[v->index[h] - 1];
    if (!memcmp(s->key, key, v->key_size)) return s;
  }
  if (v->n == v->cap) {
    size_t cap = v->cap ? 2 * v->cap : 64;
    struct slot *ns = realloc(v->slots, cap * sizeof *ns);
    if (!ns) return NULL;
    v->slots = ns;
    v->cap = cap;
  }
  struct slot *s = &v->slots[v->n];
  s->key = malloc(v->key_size ? v->key_size : 1);
  s->values = calloc(v->total_workers, v->value_size);
  if (!s->key || !s->values) {
    free(s->key);
    free(s->values);
    return NULL;
  }
  memcpy(s->key, key, v->key_size);
  v->index[h] = (uint32_t)(++v->n);
  return s;
}

static uint32_t engine_workers(const struct ms_query_maps *m, size_t map) {
  uint32_t w = m->n_workers(m->user, map);
  return w ? w : 1; /* as the writer reads a source that names none */
}

static int take(void *user, const void *key, const void *values) {
  struct uview *v = user;
  struct slot *s = find(v, key);
  if (!s) return v->err = -ENOMEM;
  memcpy(s->values + v->worker_off * v->value_size, values, (size_t)v->cur_workers * v->value_size);
  return 0;
}

static void view_free(struct uview *v) {
  for (size_t i = 0; i < v->n; i++) {
    free(v->slots[i].key);
    free(v->slots[i].values);
  }
  free(v->slots);
  free(v->index);
}

static int in_union(const struct ms_query_maps *m) { return m->foreach && m->n_workers; }

static int union_foreach(void *user, size_t map, ms_bpf_map_entry_fn fn, void *fn_user) {
  const struct ms_query_union *u = user;
  if (map >= ms_query_map_count(u->q)) return -EINVAL;
  const struct ms_bpf_map_def *d = ms_query_map(u->q, map);
  if (d->type == MS_BPF_MAP_RINGBUF) return -EINVAL;
  struct uview v = {.u = u, .map = map, .key_size = d->key_size, .value_size = d->value_size};
  for (size_t e = 0; e < u->n; e++)
    if (in_union(&u->srcs[e])) v.total_workers += engine_workers(&u->srcs[e], map);
  int rc = 0;
  for (size_t e = 0; e < u->n && !rc; e++) {
    const struct ms_query_maps *m = &u->srcs[e];
    if (!in_union(m)) continue;
    v.cur_workers = engine_workers(m, map);
    rc = m->foreach(m->user, map, take, &v);
    if (v.err) rc = v.err;
    v.worker_off += v.cur_workers;
  }
  for (size_t i = 0; i < v.n && !rc; i++) rc = fn(fn_user, v.slots[i].key, v.slots[i].values);
  view_free(&v);
  return rc;
}

static uint32_t union_workers(void *user, size_t map) {
  const struct ms_query_union *u = user;
  uint32_t n = 0;
  for (size_t e = 0; e < u->n; e++)
    if (in_union(&u->srcs[e])) n += engine_workers(&u->srcs[e], map);
  return n;
}

/* Records engine after engine; the count of all, or the first error. */
static int union_ring(void *user, size_t map, ms_bpf_ringbuf_fn fn, void *fn_user) {
  const struct ms_query_union *u = user;
  int total = 0;
  for (size_t e = 0; e < u->n; e++) {
    const struct ms_query_maps *m = &u->srcs[e];
    if (!in_union(m) || !m->ring) continue;
    int rc = m->ring(m->user, map, fn, fn_user);
    if (rc < 0) return rc;
    total += rc;
  }
  return total;
}

int ms_query_maps_of_union(struct ms_query_maps *out, const struct ms_query_union *u) {
  if (!u || !u->q || (u->n && !u->srcs)) return -EINVAL;
  *out = (struct ms_query_maps){union_foreach, union_workers, union_ring, (void *)u};
  return 0;
}

void ms_query_coverage_add(struct ms_coverage *total, const struct ms_coverage *c) {
  total->eligible += c->eligible;
  total->executed += c->executed;
  total->throttled += c->throttled;
  total->lost += c->lost;
  total->failed += c->failed;
  if (c->generation > total->generation) total->generation = c->generation;
}
