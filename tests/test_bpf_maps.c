/* SPDX-License-Identifier: MIT */
/* Maps: each type's semantics (Linux's flags and errors), the lock-free hash
 * under four updating threads (counts must add up exactly, no key twice),
 * the ring buffer (order, discard, lost, wrap) and the read-only reader in
 * another process (fork; the child maps the memfd read-only while the parent
 * keeps writing). Programs drive the helpers through the interpreter too. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "megascope/bpf.h"
#include "test.h"

static char logbuf[1024];
static struct ms_textbuf tlog;

static void log_reset(void) {
  logbuf[0] = 0;
  tlog = (struct ms_textbuf){logbuf, sizeof logbuf, 0, 0};
}

static struct ms_bpf_map *map_of(uint32_t type, uint32_t key, uint32_t value, uint32_t max, uint32_t workers) {
  struct ms_bpf_map_def d = {.type = type, .key_size = key, .value_size = value, .max_entries = max};
  snprintf(d.name, sizeof d.name, "t%u", type);
  log_reset();
  return ms_bpf_map_new(&d, workers, &tlog);
}

static int count_entries(void *user, const void *key, const void *values) {
  (*(int *)user)++;
  return 0;
}

static void test_defs(void) {
  CHECK(!map_of(MS_BPF_MAP_ARRAY, 8, 8, 4, 1) && strstr(logbuf, "array keys are 4 bytes"));
  CHECK(!map_of(MS_BPF_MAP_RINGBUF, 0, 0, 5000, 1) && errno == EINVAL && strstr(logbuf, "power of two"));
  CHECK(!map_of(9, 4, 8, 4, 1) && strstr(logbuf, "unsupported map type 9"));
  CHECK(!map_of(MS_BPF_MAP_HASH, 0, 8, 4, 1));
  CHECK(!map_of(MS_BPF_MAP_PERCPU_ARRAY, 4, 8, 4, 0) && strstr(logbuf, "workers"));
  CHECK(!map_of(MS_BPF_MAP_ARRAY, 4, 65536, 1u << 20, 1) && errno == E2BIG);
  /* a hash map's slots are a power of two over twice max_entries: a huge
   * max_entries (a bit flip in an object) is refused, not looped on */
  CHECK(!map_of(MS_BPF_MAP_HASH, 4, 8, 0x80000001u, 1) && errno == E2BIG && strstr(logbuf, "a hash map holds"));
  CHECK(!map_of(MS_BPF_MAP_PERCPU_HASH, 4, 8, 0xffffffffu, 2) && errno == E2BIG);
}

static void test_array(void) {
  struct ms_bpf_map *m = map_of(MS_BPF_MAP_ARRAY, 4, 12, 8, 3);
  CHECK(m && ms_bpf_map_fd(m) >= 0 && ms_bpf_map_count(m) == 8);
  uint32_t k = 5, big = 8;
  uint8_t v[12] = {1, 2, 3}, *p;
  CHECK(ms_bpf_map_update(m, &k, v, MS_BPF_ANY, 0) == 0);
  CHECK((p = ms_bpf_map_lookup(m, &k, 2)) && p[2] == 3); /* not per-worker: worker is ignored */
  CHECK(ms_bpf_map_update(m, &k, v, MS_BPF_NOEXIST, 0) == -EEXIST);
  CHECK(ms_bpf_map_update(m, &k, v, MS_BPF_EXIST, 0) == 0);
  CHECK(ms_bpf_map_update(m, &big, v, MS_BPF_ANY, 0) == -E2BIG);
  CHECK(ms_bpf_map_update(m, &k, v, 7, 0) == -EINVAL);
  CHECK(ms_bpf_map_lookup(m, &big, 0) == NULL);
  CHECK(ms_bpf_map_delete(m, &k) == -EINVAL);
  int n = 0;
  CHECK(ms_bpf_map_foreach(m, count_entries, &n) == 0 && n == 8);
  ms_bpf_map_clear(m);
  CHECK((p = ms_bpf_map_lookup(m, &k, 0)) && p[2] == 0);
  ms_bpf_map_free(m);
  ms_bpf_map_free(NULL);
}

static void test_percpu_array(void) {
  struct ms_bpf_map *m = map_of(MS_BPF_MAP_PERCPU_ARRAY, 4, 8, 4, 4);
  uint32_t k = 1;
  uint64_t v;
  for (uint32_t w = 0; w < 4; w++) {
    v = 100 + w;
    CHECK(ms_bpf_map_update(m, &k, &v, MS_BPF_ANY, w) == 0);
  }
  for (uint32_t w = 0; w < 4; w++) CHECK(*(uint64_t *)ms_bpf_map_lookup(m, &k, w) == 100 + w);
  CHECK(ms_bpf_map_lookup(m, &k, 4) == NULL);
  CHECK(ms_bpf_map_update(m, &k, &v, MS_BPF_ANY, 4) == -EINVAL);
  ms_bpf_map_free(m);
}

static void test_hash(void) {
  struct ms_bpf_map *m = map_of(MS_BPF_MAP_HASH, 3, 8, 8, 1); /* odd key size on purpose */
  uint8_t k[3] = {1, 2, 3};
  uint64_t v = 11, *p;
  CHECK(ms_bpf_map_lookup(m, k, 0) == NULL);
  CHECK(ms_bpf_map_update(m, k, &v, MS_BPF_EXIST, 0) == -ENOENT);
  CHECK(ms_bpf_map_update(m, k, &v, MS_BPF_NOEXIST, 0) == 0);
  CHECK(ms_bpf_map_update(m, k, &v, MS_BPF_NOEXIST, 0) == -EEXIST);
  v = 12;
  CHECK(ms_bpf_map_update(m, k, &v, MS_BPF_EXIST, 0) == 0);
  CHECK((p = ms_bpf_map_lookup(m, k, 0)) && *p == 12 && ms_bpf_map_count(m) == 1);
  CHECK(ms_bpf_map_delete(m, k) == 0 && ms_bpf_map_delete(m, k) == -ENOENT);
  CHECK(ms_bpf_map_lookup(m, k, 0) == NULL && ms_bpf_map_count(m) == 0);
  v = 13;
  CHECK(ms_bpf_map_update(m, k, &v, MS_BPF_ANY, 0) == 0); /* revives the key's bucket */
  CHECK((p = ms_bpf_map_lookup(m, k, 0)) && *p == 13);
  /* max_entries live entries, then -E2BIG until one is deleted */
  for (uint8_t i = 0; i < 7; i++) {
    uint8_t kk[3] = {9, 9, i};
    CHECK(ms_bpf_map_update(m, kk, &v, MS_BPF_ANY, 0) == 0);
  }
  uint8_t extra[3] = {7, 7, 7};
  CHECK(ms_bpf_map_update(m, extra, &v, MS_BPF_ANY, 0) == -E2BIG && ms_bpf_map_count(m) == 8);
  CHECK(ms_bpf_map_delete(m, k) == 0 && ms_bpf_map_update(m, extra, &v, MS_BPF_ANY, 0) == 0);
  int n = 0;
  CHECK(ms_bpf_map_foreach(m, count_entries, &n) == 0 && n == 8);
  ms_bpf_map_clear(m);
  CHECK(ms_bpf_map_count(m) == 0 && ms_bpf_map_lookup(m, extra, 0) == NULL);
  ms_bpf_map_free(m);
}

/* A deleted key keeps its bucket: distinct keys ever inserted are bounded by
 * the slot count (2 * max_entries rounded up to a power of two, at least 8). */
static void test_hash_slots(void) {
  struct ms_bpf_map *m = map_of(MS_BPF_MAP_HASH, 4, 8, 4, 1);
  uint64_t v = 1;
  uint32_t k;
  for (k = 0; k < 8; k++) CHECK(ms_bpf_map_update(m, &k, &v, MS_BPF_ANY, 0) == 0 && ms_bpf_map_delete(m, &k) == 0);
  CHECK(ms_bpf_map_update(m, &k, &v, MS_BPF_ANY, 0) == -E2BIG); /* a ninth distinct key: no bucket */
  k = 3;
  CHECK(ms_bpf_map_update(m, &k, &v, MS_BPF_ANY, 0) == 0); /* an old key still has its own */
  ms_bpf_map_free(m);
}

static void test_percpu_hash(void) {
  struct ms_bpf_map *m = map_of(MS_BPF_MAP_PERCPU_HASH, 8, 8, 16, 3);
  uint64_t k = 42, v = 5, *p;
  CHECK(ms_bpf_map_update(m, &k, &v, MS_BPF_ANY, 1) == 0);
  CHECK(*(uint64_t *)ms_bpf_map_lookup(m, &k, 0) == 0 && *(uint64_t *)ms_bpf_map_lookup(m, &k, 1) == 5);
  v = 7;
  CHECK(ms_bpf_map_update(m, &k, &v, MS_BPF_ANY, 2) == 0);
  CHECK((p = ms_bpf_map_lookup(m, &k, 1)) && *p == 5 && *(uint64_t *)ms_bpf_map_lookup(m, &k, 2) == 7);
  /* delete and re-insert: the other workers' slots start from zero again */
  CHECK(ms_bpf_map_delete(m, &k) == 0 && ms_bpf_map_update(m, &k, &v, MS_BPF_ANY, 0) == 0);
  CHECK(*(uint64_t *)ms_bpf_map_lookup(m, &k, 1) == 0 && *(uint64_t *)ms_bpf_map_lookup(m, &k, 0) == 7);
  ms_bpf_map_free(m);
}

/* ---- four threads on one hash ------------------------------------------- */

enum { THREADS = 4, KEYS = 200, ITERS = 50000 };

struct worker_arg {
  struct ms_bpf_map *hash, *percpu;
  uint32_t id;
  int errors;
};

static void *hash_worker(void *p) {
  struct worker_arg *a = p;
  uint64_t zero = 0, rng = 0x1234567 + a->id;
  for (int i = 0; i < ITERS; i++) {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    uint64_t key = (rng >> 33) % KEYS;
    uint64_t *v = ms_bpf_map_lookup(a->hash, &key, a->id);
    if (!v) {
      int err = ms_bpf_map_update(a->hash, &key, &zero, MS_BPF_NOEXIST, a->id);
      if (err && err != -EEXIST) a->errors++;
      v = ms_bpf_map_lookup(a->hash, &key, a->id);
    }
    if (!v) {
      a->errors++;
      continue;
    }
    __atomic_fetch_add(v, 1, __ATOMIC_RELAXED);
    /* per-worker: no atomics needed, each thread owns its slot */
    if (!(v = ms_bpf_map_lookup(a->percpu, &key, a->id))) {
      ms_bpf_map_update(a->percpu, &key, &zero, MS_BPF_NOEXIST, a->id);
      v = ms_bpf_map_lookup(a->percpu, &key, a->id);
    }
    if (v) (*v)++;
    else a->errors++;
  }
  return NULL;
}

struct sums {
  uint64_t total, per_worker[THREADS];
  int keys, bad_key;
};

static int sum_entry(void *user, const void *key, const void *values) {
  struct sums *s = user;
  uint64_t k, v[THREADS];
  memcpy(&k, key, 8);
  memcpy(v, values, sizeof v);
  s->keys++;
  s->bad_key |= k >= KEYS;
  for (int w = 0; w < THREADS; w++) s->per_worker[w] += v[w], s->total += v[w];
  return 0;
}

static void test_hash_threads(void) {
  struct ms_bpf_map *hash = map_of(MS_BPF_MAP_HASH, 8, 8, KEYS, 1);
  struct ms_bpf_map *percpu = map_of(MS_BPF_MAP_PERCPU_HASH, 8, 8, KEYS, THREADS);
  pthread_t t[THREADS];
  struct worker_arg a[THREADS];
  for (uint32_t i = 0; i < THREADS; i++) {
    a[i] = (struct worker_arg){hash, percpu, i, 0};
    pthread_create(&t[i], NULL, hash_worker, &a[i]);
  }
  int errors = 0;
  for (int i = 0; i < THREADS; i++) pthread_join(t[i], NULL), errors += a[i].errors;
  CHECK(errors == 0);
  int keys = 0;
  ms_bpf_map_foreach(hash, count_entries, &keys);
  uint64_t total = 0;
  for (uint64_t k = 0; k < KEYS; k++) {
    uint64_t *v = ms_bpf_map_lookup(hash, &k, 0);
    total += v ? *v : 0;
  }
  CHECKF(total == (uint64_t)THREADS * ITERS, "hash total %llu", (unsigned long long)total);
  CHECKF(keys == KEYS && ms_bpf_map_count(hash) == KEYS, "%d keys visited, count %u", keys, ms_bpf_map_count(hash));
  struct sums ps = {0};
  ms_bpf_map_foreach(percpu, sum_entry, &ps);
  CHECK(ps.keys == KEYS && !ps.bad_key && ps.total == (uint64_t)THREADS * ITERS);
  for (int w = 0; w < THREADS; w++) CHECK(ps.per_worker[w] == ITERS);
  ms_bpf_map_free(hash);
  ms_bpf_map_free(percpu);
}

/* ---- the same through programs ----------------------------------------- */

/* count[ctx[0] % 64]++ with lookup-or-insert, as a monitor would */
static const char count_prog[] =
    "ldxdw %r6, [%r1+0]\n"
    "and %r6, 63\n"
    "stxdw [%r10-8], %r6\n"
    "lddw %r1, map[0]\n"
    "mov %r2, %r10\nadd %r2, -8\n"
    "call 1\n"
    "jne %r0, 0, have\n"
    "stdw [%r10-16], 0\n"
    "lddw %r1, map[0]\n"
    "mov %r2, %r10\nadd %r2, -8\n"
    "mov %r3, %r10\nadd %r3, -16\n"
    "mov %r4, 1\n" /* BPF_NOEXIST: a racing insert of the same key is fine */
    "call 2\n"
    "lddw %r1, map[0]\n"
    "mov %r2, %r10\nadd %r2, -8\n"
    "call 1\n"
    "jeq %r0, 0, out\n"
    "have: mov %r1, 1\n"
    "lock add [%r0+0], %r1\n"
    "out: mov %r0, 0\n"
    "exit\n";

struct prog_arg {
  const struct ms_bpf_prog *prog;
  struct ms_bpf_map *map;
  const struct ms_bpf_helpers *helpers;
  uint32_t id;
  int errors;
};

static void *prog_worker(void *p) {
  struct prog_arg *a = p;
  struct ms_bpf_env env = {.worker = a->id};
  uint64_t ctx[1];
  struct ms_bpf_run_opts o = {.sz = sizeof o, .helpers = a->helpers, .maps = &a->map, .n_maps = 1,
                              .ctx = ctx, .ctx_size = sizeof ctx, .env = &env};
  for (int i = 0; i < ITERS / 5; i++) {
    struct ms_bpf_run_result res;
    ctx[0] = (uint64_t)i * 7 + a->id;
    if (ms_bpf_run(a->prog, &o, &res)) a->errors++;
  }
  return NULL;
}

static void test_program_threads(void) {
  struct ms_bpf_map_def def = {.name = "count", .type = MS_BPF_MAP_HASH, .key_size = 8, .value_size = 8, .max_entries = 64};
  struct ms_bpf_insn *insns;
  size_t n;
  log_reset();
  CHECKF(ms_bpf_asm(count_prog, &insns, &n, &tlog) == 0, "%s", logbuf);
  struct ms_bpf_prog_opts po = {.sz = sizeof po, .maps = &def, .n_maps = 1, .log = &tlog};
  struct ms_bpf_prog *prog = ms_bpf_prog_new(insns, n, &po);
  free(insns);
  CHECKF(prog != NULL, "%s", logbuf);
  struct ms_bpf_map *m = ms_bpf_map_new(&def, 1, &tlog);
  struct ms_bpf_helpers *h = ms_bpf_helpers_new();
  ms_bpf_helpers_add_std(h);
  pthread_t t[THREADS];
  struct prog_arg a[THREADS];
  for (uint32_t i = 0; i < THREADS; i++) {
    a[i] = (struct prog_arg){prog, m, h, i, 0};
    pthread_create(&t[i], NULL, prog_worker, &a[i]);
  }
  int errors = 0;
  for (int i = 0; i < THREADS; i++) pthread_join(t[i], NULL), errors += a[i].errors;
  CHECK(errors == 0);
  uint64_t total = 0;
  for (uint64_t k = 0; k < 64; k++) {
    uint64_t *v = ms_bpf_map_lookup(m, &k, 0);
    total += v ? *v : 0;
  }
  CHECKF(total == (uint64_t)THREADS * (ITERS / 5) && ms_bpf_map_count(m) == 64, "total %llu count %u",
         (unsigned long long)total, ms_bpf_map_count(m));
  ms_bpf_helpers_free(h);
  ms_bpf_map_free(m);
  ms_bpf_prog_free(prog);
}

/* ---- ring buffer -------------------------------------------------------- */

struct seen {
  int n;
  uint32_t sizes[64];
  uint8_t first[64];
};

static int take(void *user, const void *data, uint32_t size) {
  struct seen *s = user;
  if (s->n < 64) s->sizes[s->n] = size, s->first[s->n] = *(const uint8_t *)data;
  s->n++;
  return 0;
}

static void test_ringbuf(void) {
  struct ms_bpf_map *rb = map_of(MS_BPF_MAP_RINGBUF, 0, 0, 4096, 1);
  CHECK(rb && ms_bpf_map_lookup(rb, "k", 0) == NULL && ms_bpf_map_count(rb) == 0);
  uint8_t *a = ms_bpf_ringbuf_reserve(rb, 100), *b = ms_bpf_ringbuf_reserve(rb, 5);
  CHECK(a && b && b - a == 112); /* 8-byte header, sizes rounded to 8 */
  a[0] = 'a';
  b[0] = 'b';
  struct seen s = {0};
  ms_bpf_ringbuf_submit(rb, b);
  CHECK(ms_bpf_ringbuf_consume(rb, take, &s) == 0); /* a is still being written */
  ms_bpf_ringbuf_submit(rb, a);
  CHECK(ms_bpf_ringbuf_consume(rb, take, &s) == 2 && s.first[0] == 'a' && s.sizes[0] == 100 && s.sizes[1] == 5);
  uint8_t *c = ms_bpf_ringbuf_reserve(rb, 16);
  ms_bpf_ringbuf_discard(rb, c);
  CHECK(ms_bpf_ringbuf_consume(rb, take, &s) == 0 && s.n == 2);
  /* full: drops are counted, nothing blocks */
  int kept = 0;
  while (ms_bpf_ringbuf_output(rb, "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx", 32) == 0) kept++;
  CHECK(kept == 4096 / 40 && ms_bpf_ringbuf_lost(rb) == 1);
  CHECK(ms_bpf_ringbuf_reserve(rb, 24) == NULL && ms_bpf_ringbuf_lost(rb) == 2);
  CHECK(ms_bpf_ringbuf_reserve(rb, 4096) == NULL && ms_bpf_ringbuf_lost(rb) == 2); /* too big: not "lost" */
  s.n = 0;
  CHECK(ms_bpf_ringbuf_consume(rb, take, &s) == kept);
  /* records that wrap read back whole, through the double mapping */
  int ok = 1;
  for (int i = 0; i < 500 && ok; i++) {
    uint8_t *r = ms_bpf_ringbuf_reserve(rb, 300);
    if (!r) break;
    for (int j = 0; j < 300; j++) r[j] = (uint8_t)(i + j);
    ms_bpf_ringbuf_submit(rb, r);
    struct seen one = {0};
    ok = ms_bpf_ringbuf_consume(rb, take, &one) == 1 && one.sizes[0] == 300 && one.first[0] == (uint8_t)i;
  }
  CHECK(ok);
  ms_bpf_map_free(rb);
}

static const char rb_prog[] =
    "mov %r6, %r1\n"
    "lddw %r1, map[0]\nmov %r2, 16\nmov %r3, 0\ncall 131\n"
    "jeq %r0, 0, out\n"
    "stxdw [%r0+0], %r6\nstdw [%r0+8], 7\n"
    "mov %r1, %r0\nmov %r2, 0\ncall 132\n"
    "out: mov %r0, 0\nexit\n";

/* rb_prog with Linux's BPF_RB_FORCE_WAKEUP on the submit */
static const char rb_force_prog[] =
    "mov %r6, %r1\n"
    "lddw %r1, map[0]\nmov %r2, 16\nmov %r3, 0\ncall 131\n"
    "jeq %r0, 0, out\n"
    "stxdw [%r0+0], %r6\nstdw [%r0+8], 7\n"
    "mov %r1, %r0\nmov %r2, 2\ncall 132\n"
    "out: mov %r0, 0\nexit\n";

static const char rb_leak_prog[] = "lddw %r1, map[0]\nmov %r2, 16\nmov %r3, 0\ncall 131\nmov %r0, 0\nexit\n";
static const char rb_bogus_prog[] = "mov %r1, %r10\nadd %r1, -16\nmov %r2, 0\ncall 132\nexit\n";

static int run_rb(const char *text, struct ms_bpf_map *rb, const struct ms_bpf_helpers *h, void *mem) {
  struct ms_bpf_map_def def = *ms_bpf_map_info(rb);
  struct ms_bpf_insn *insns;
  size_t n;
  log_reset();
  if (ms_bpf_asm(text, &insns, &n, &tlog)) return -1000;
  struct ms_bpf_prog_opts po = {.sz = sizeof po, .maps = &def, .n_maps = 1, .log = &tlog};
  struct ms_bpf_prog *p = ms_bpf_prog_new(insns, n, &po);
  free(insns);
  struct ms_bpf_run_opts o = {.sz = sizeof o, .helpers = h, .maps = &rb, .n_maps = 1, .mem = mem, .mem_size = 8, .log = &tlog};
  struct ms_bpf_run_result res;
  int err = p ? ms_bpf_run(p, &o, &res) : -1001;
  ms_bpf_prog_free(p);
  return err;
}

static void test_ringbuf_helpers(void) {
  struct ms_bpf_map *rb = map_of(MS_BPF_MAP_RINGBUF, 0, 0, 4096, 1);
  struct ms_bpf_helpers *h = ms_bpf_helpers_new();
  ms_bpf_helpers_add_std(h);
  uint64_t mem = 0;
  CHECK(run_rb(rb_prog, rb, h, &mem) == 0);
  struct seen s = {0};
  CHECK(ms_bpf_ringbuf_consume(rb, take, &s) == 1 && s.sizes[0] == 16);
  /* a run that leaves a record reserved fails, and the record is discarded */
  int err = run_rb(rb_leak_prog, rb, h, &mem);
  CHECKF(err == -EINVAL && strstr(logbuf, "neither submitted nor discarded"), "%d %s", err, logbuf);
  CHECK(run_rb(rb_prog, rb, h, &mem) == 0);
  s.n = 0;
  CHECK(ms_bpf_ringbuf_consume(rb, take, &s) == 1); /* the leaked record did not block it */
  err = run_rb(rb_bogus_prog, rb, h, &mem);
  CHECKF(err == -EINVAL && strstr(logbuf, "not a ring buffer record this run reserved"), "%s", logbuf);
  /* a program's submit flags reach the reader: FORCE wakes it with one record in the ring */
  char path[64];
  snprintf(path, sizeof path, "/proc/self/fd/%d", ms_bpf_map_fd(rb));
  int fd = open(path, O_RDWR | O_CLOEXEC);
  struct ms_bpf_map_reader *r = fd >= 0 ? ms_bpf_map_reader_new(fd, MS_BPF_READER_CONSUME, NULL) : NULL;
  uint64_t v = 0;
  CHECK(r && ms_bpf_map_reader_arm(r) == 0 && run_rb(rb_prog, rb, h, &mem) == 0);
  CHECK(read(ms_bpf_map_wake_fd(rb), &v, sizeof v) < 0 && errno == EAGAIN);
  CHECK(run_rb(rb_force_prog, rb, h, &mem) == 0);
  CHECK(read(ms_bpf_map_wake_fd(rb), &v, sizeof v) == (ssize_t)sizeof v && v == 1);
  ms_bpf_map_reader_free(r);
  if (fd >= 0) close(fd);
  ms_bpf_helpers_free(h);
  ms_bpf_map_free(rb);
}

/* ---- another process ---------------------------------------------------- */

struct child_check {
  int ok;
};

static int child_entry(void *user, const void *key, const void *values) {
  uint64_t k, v[2];
  memcpy(&k, key, 8);
  memcpy(v, values, sizeof v);
  if (v[0] != k * 10 || v[1] != k * 10 + 1) ((struct child_check *)user)->ok = 0;
  return 0;
}

/* The child: read-only mappings of the engine's maps. Exit code = failures. */
static int child_main(int hash_fd, int array_fd, int ring_fd, int go_fd) {
  char path[64];
  snprintf(path, sizeof path, "/proc/self/fd/%d", hash_fd);
  int ro = open(path, O_RDONLY); /* a read-only descriptor, as the control socket would hand over */
  struct ms_bpf_map_reader *r = ms_bpf_map_reader_new(ro, 0, NULL);
  int fails = 0;
  if (!r) return 100;
  const struct ms_bpf_map_shm *h = ms_bpf_map_reader_header(r);
  fails += h->type != MS_BPF_MAP_PERCPU_HASH || h->n_workers != 2 || h->key_size != 8 || strcmp(h->name, "t5");
  struct child_check cc = {1};
  fails += ms_bpf_map_reader_foreach(r, child_entry, &cc) != 0 || !cc.ok;
  uint64_t key = 3, vals[2];
  fails += ms_bpf_map_reader_lookup(r, &key, vals) != 0 || vals[0] != 30 || vals[1] != 31;
  key = 99;
  fails += ms_bpf_map_reader_lookup(r, &key, vals) != -ENOENT;
  fails += ms_bpf_map_reader_consume(r, NULL, NULL) != -EPERM;
  ms_bpf_map_reader_free(r);
  close(ro);
  /* a counter the parent keeps incrementing: never goes backwards, ends at 100000 */
  snprintf(path, sizeof path, "/proc/self/fd/%d", array_fd);
  ro = open(path, O_RDONLY);
  r = ms_bpf_map_reader_new(ro, MS_BPF_READER_CONSUME, NULL);
  fails += r != NULL; /* consume needs a ring buffer (and a writable fd) */
  r = ms_bpf_map_reader_new(ro, 0, NULL);
  uint64_t last = 0, v = 0;
  uint32_t idx = 0;
  char done;
  if (write(go_fd, "g", 1) != 1) fails++;
  for (int spins = 0; spins < 100000000 && v < 100000; spins++) {
    ms_bpf_map_reader_lookup(r, &idx, &v);
    if (v < last) fails++;
    last = v;
  }
  fails += v != 100000;
  ms_bpf_map_reader_free(r);
  close(ro);
  /* the ring buffer: consume what the parent produced */
  r = ms_bpf_map_reader_new(ring_fd, MS_BPF_READER_CONSUME, NULL);
  if (read(go_fd, &done, 1) != 1) fails++;
  struct seen s = {0};
  fails += !r || ms_bpf_map_reader_consume(r, take, &s) != 3 || s.first[2] != 'z';
  ms_bpf_map_reader_free(r);
  return fails;
}

/* The reader's wake-up: armed, it is woken once when a submit leaves the ring
 * half full, not before and not again until it arms anew; arming a ring that
 * is half full already says so instead; Linux's FORCE and NO wake-up flags;
 * other map types have no eventfd. */
static void test_ringbuf_wake(void) {
  struct ms_bpf_map *rb = map_of(MS_BPF_MAP_RINGBUF, 0, 0, 4096, 1), *arr = map_of(MS_BPF_MAP_ARRAY, 4, 8, 1, 1);
  CHECK(ms_bpf_map_wake_fd(arr) == -1 && ms_bpf_map_wake_fd(rb) >= 0);
  char path[64];
  snprintf(path, sizeof path, "/proc/self/fd/%d", ms_bpf_map_fd(rb));
  int fd = open(path, O_RDWR | O_CLOEXEC), efd = ms_bpf_map_wake_fd(rb);
  struct ms_bpf_map_reader *r = fd >= 0 ? ms_bpf_map_reader_new(fd, MS_BPF_READER_CONSUME, NULL) : NULL;
  struct ms_bpf_map_reader *ro = fd >= 0 ? ms_bpf_map_reader_new(fd, 0, NULL) : NULL;
  CHECK(r && ro && ms_bpf_map_reader_arm(ro) == -EPERM);
  uint64_t v = 0;
  char rec[32] = "a record of 32 bytes, 40 a slot";
  CHECK(ms_bpf_map_reader_arm(r) == 0);
  int i = 0;
  for (; i < 2048 / 40; i++) ms_bpf_ringbuf_output(rb, rec, sizeof rec);  /* 2040 bytes: under half */
  CHECK(read(efd, &v, sizeof v) < 0 && errno == EAGAIN);
  ms_bpf_ringbuf_output(rb, rec, sizeof rec);  /* 2080: half full */
  ms_bpf_ringbuf_output(rb, rec, sizeof rec);  /* the reader is woken once */
  CHECK(read(efd, &v, sizeof v) == (ssize_t)sizeof v && v == 1);
  CHECK(read(efd, &v, sizeof v) < 0 && errno == EAGAIN);
  CHECK(ms_bpf_map_reader_arm(r) == 1);  /* half full already: drain, do not sleep */
  ms_bpf_ringbuf_output(rb, rec, sizeof rec);
  CHECK(read(efd, &v, sizeof v) < 0 && errno == EAGAIN);
  struct seen s = {0};
  CHECK(ms_bpf_map_reader_consume(r, take, &s) == 2048 / 40 + 3);
  /* Linux's flags: FORCE wakes at once, NO never (the helpers pass them through) */
  CHECK(ms_bpf_map_reader_arm(r) == 0);
  CHECK(ms_bpf_ringbuf_output_flags(rb, rec, sizeof rec, MS_BPF_RB_FORCE_WAKEUP) == 0);
  CHECK(read(efd, &v, sizeof v) == (ssize_t)sizeof v && v == 1);
  CHECK(ms_bpf_map_reader_arm(r) == 0);
  for (i = 0; i < 2048 / 40 + 2; i++) ms_bpf_ringbuf_output_flags(rb, rec, sizeof rec, MS_BPF_RB_NO_WAKEUP);
  void *one = ms_bpf_ringbuf_reserve(rb, sizeof rec);
  CHECK(one != NULL);
  ms_bpf_ringbuf_submit_flags(rb, one, MS_BPF_RB_NO_WAKEUP);
  CHECK(read(efd, &v, sizeof v) < 0 && errno == EAGAIN);  /* past half, asleep, and not woken */
  CHECK(ms_bpf_map_reader_arm(r) == 1);
  CHECK(ms_bpf_map_reader_consume(r, take, &s) == 1 + 2048 / 40 + 2 + 1);
  /* disarmed: no wake-up however full */
  CHECK(ms_bpf_map_reader_arm(r) == 0);
  ms_bpf_map_reader_disarm(r);
  while (ms_bpf_ringbuf_output(rb, rec, sizeof rec) == 0) {
  }
  CHECK(read(efd, &v, sizeof v) < 0 && errno == EAGAIN);
  ms_bpf_map_reader_free(ro);
  ms_bpf_map_reader_free(r);
  close(fd);
  ms_bpf_map_free(arr);
  ms_bpf_map_free(rb);
}

/* A reader asleep in poll() on the eventfd while another thread writes
 * records one at a time, waiting whenever the ring is full: the reader is
 * woken every time, or the writer would wait for it for good. */
struct wake_writer {
  struct ms_bpf_map *rb;
  int rounds, done;
};

static void *wake_writer_main(void *arg) {
  struct wake_writer *w = arg;
  char rec[24] = "twenty-four bytes each.";
  for (int i = 0; i < w->rounds; i++)
    while (ms_bpf_ringbuf_output(w->rb, rec, sizeof rec)) sched_yield();  /* full: wait for the reader */
  __atomic_store_n(&w->done, 1, __ATOMIC_RELEASE);
  uint64_t one = 1;  /* the last records may leave the ring under half: end a sleep the reader's interval would */
  if (write(ms_bpf_map_wake_fd(w->rb), &one, sizeof one) < 0) return NULL;
  return NULL;
}

static void test_ringbuf_wake_threads(void) {
  struct ms_bpf_map *rb = map_of(MS_BPF_MAP_RINGBUF, 0, 0, 4096, 1);
  char path[64];
  snprintf(path, sizeof path, "/proc/self/fd/%d", ms_bpf_map_fd(rb));
  int fd = open(path, O_RDWR | O_CLOEXEC);
  struct ms_bpf_map_reader *r = ms_bpf_map_reader_new(fd, MS_BPF_READER_CONSUME, NULL);
  CHECK(r != NULL);
  struct wake_writer w = {rb, 20000, 0};
  pthread_t th;
  CHECK(pthread_create(&th, NULL, wake_writer_main, &w) == 0);
  struct seen s = {0};
  int got = 0, sleeps = 0, timeouts = 0;
  while (got < w.rounds) {
    int k = ms_bpf_map_reader_consume(r, take, &s);
    got += k > 0 ? k : 0;
    /* the writer done (its last records may stay under half) or a miss seen: drain and end */
    if (got >= w.rounds || timeouts || __atomic_load_n(&w.done, __ATOMIC_ACQUIRE) || ms_bpf_map_reader_arm(r) == 1)
      continue;
    struct pollfd pf = {.fd = ms_bpf_map_wake_fd(rb), .events = POLLIN};
    sleeps++;
    /* a missed wake-up shows as a stall: the writer waits on a full ring. Once
     * it is done, its last records may leave the ring under half: no wake-up
     * is due (a reader's own interval shows them). */
    if (poll(&pf, 1, 2000) == 0 && !__atomic_load_n(&w.done, __ATOMIC_ACQUIRE)) timeouts++;
    ms_bpf_map_reader_disarm(r);
    uint64_t v;
    if (read(pf.fd, &v, sizeof v) < 0) v = 0;
  }
  pthread_join(th, NULL);
  CHECKF(got == w.rounds && timeouts == 0, "got %d of %d, %d sleeps, %d timed out", got, w.rounds, sleeps,
         timeouts);
  ms_bpf_map_reader_free(r);
  close(fd);
  ms_bpf_map_free(rb);
}

static void test_cross_process(void) {
  struct ms_bpf_map *hash = map_of(MS_BPF_MAP_PERCPU_HASH, 8, 8, 32, 2);
  struct ms_bpf_map *arr = map_of(MS_BPF_MAP_ARRAY, 4, 8, 1, 1);
  struct ms_bpf_map *rb = map_of(MS_BPF_MAP_RINGBUF, 0, 0, 8192, 1);
  for (uint64_t k = 0; k < 20; k++)
    for (uint32_t w = 0; w < 2; w++) {
      uint64_t v = k * 10 + w;
      ms_bpf_map_update(hash, &k, &v, MS_BPF_ANY, w);
    }
  int sv[2];
  CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
  fflush(NULL);
  pid_t pid = fork();
  if (pid == 0) {
    close(sv[0]);
    _exit(child_main(ms_bpf_map_fd(hash), ms_bpf_map_fd(arr), ms_bpf_map_fd(rb), sv[1]));
  }
  close(sv[1]);
  char go;
  CHECK(read(sv[0], &go, 1) == 1);
  uint32_t idx = 0;
  uint64_t *counter = ms_bpf_map_lookup(arr, &idx, 0);
  for (int i = 0; i < 100000; i++) __atomic_fetch_add(counter, 1, __ATOMIC_RELAXED);
  ms_bpf_ringbuf_output(rb, "x", 1);
  ms_bpf_ringbuf_output(rb, "y", 1);
  ms_bpf_ringbuf_output(rb, "z", 1);
  CHECK(write(sv[0], "d", 1) == 1);
  int status = 0;
  waitpid(pid, &status, 0);
  CHECKF(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child status 0x%x", status);
  /* the child consumed: the parent's consumer sees nothing left */
  struct seen s = {0};
  CHECK(ms_bpf_ringbuf_consume(rb, take, &s) == 0);
  close(sv[0]);
  ms_bpf_map_free(hash);
  ms_bpf_map_free(arr);
  ms_bpf_map_free(rb);
}

static void test_reader_rejects(void) {
  int fd = memfd_create("junk", 0);
  char junk[4096] = "definitely not a map";
  CHECK(write(fd, junk, sizeof junk) == (ssize_t)sizeof junk);
  log_reset();
  CHECK(ms_bpf_map_reader_new(fd, 0, &tlog) == NULL && strstr(logbuf, "not a megascope map"));
  /* a header whose offsets disagree with its sizes */
  struct ms_bpf_map *m = map_of(MS_BPF_MAP_ARRAY, 4, 8, 4, 1);
  struct ms_bpf_map_shm h;
  CHECK(pread(ms_bpf_map_fd(m), &h, sizeof h, 0) == (ssize_t)sizeof h);
  h.value_off += 4096;
  CHECK(pwrite(fd, &h, sizeof h, 0) == (ssize_t)sizeof h);
  log_reset();
  CHECK(ms_bpf_map_reader_new(fd, 0, &tlog) == NULL && strstr(logbuf, "does not match"));
  close(fd);
  ms_bpf_map_free(m);
}

int main(void) {
  test_defs();
  test_array();
  test_percpu_array();
  test_hash();
  test_hash_slots();
  test_percpu_hash();
  test_hash_threads();
  test_program_threads();
  test_ringbuf();
  test_ringbuf_helpers();
  test_ringbuf_wake();
  test_ringbuf_wake_threads();
  test_cross_process();
  test_reader_rejects();
  TEST_MAIN_END();
}
