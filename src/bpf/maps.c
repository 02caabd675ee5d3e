/* SPDX-License-Identifier: MIT */
/* eBPF maps in shared memory: array, per-worker array, hash, per-worker hash
 * (the ring buffer's record logic is in ringbuf.c), and the read-only reader
 * another process uses on a map's fd.
 *
 * Storage. Each map is one memfd (memfd_create + ftruncate + mmap MAP_SHARED,
 * sealed against resizing) that starts with struct ms_bpf_map_shm: magic,
 * version, type, sizes, worker count and the offsets of the areas. A reader
 * recomputes the layout from those fields and refuses a header that does not
 * match it, so it never trusts an offset it did not derive.
 *
 * DESIGN (hash maps; who runs what, and the ordering).
 * Writers are engine worker threads calling the helpers (any number at once);
 * readers are the same threads (lookup) and other processes (iteration, with
 * a read-only mapping). There is no lock. Buckets are open-addressed (linear
 * probing over a power-of-two slot count of at least twice max_entries); each
 * has a u32 state word:
 *
 *   EMPTY --CAS--> CLAIMING --(key, value written; store-release)--> LIVE
 *   LIVE  --CAS (delete)--> KEYED
 *   KEYED --CAS (insert again)--> WRITING --(value; store-release)--> LIVE
 *
 * A bucket leaves EMPTY once and its key never changes afterwards, so a key
 * owns at most one bucket for the map's life: two threads inserting the same
 * key race on the same CAS (the loser waits while the bucket is CLAIMING, then
 * sees the key), and a delete leaves no tombstone to skip or reuse wrongly —
 * the bucket simply turns KEYED and a later insert of that key revives it.
 * Probe chains never break because no bucket returns to EMPTY (only
 * ms_bpf_map_clear, with the map idle, resets them). The price: distinct keys
 * ever inserted are bounded by the slot count; when no EMPTY bucket is left an
 * insert of a new key fails with -E2BIG, as it does when max_entries live
 * entries exist (the live count is a separate atomic, reserved before a bucket
 * becomes LIVE).
 *
 * Ordering: every key/value write happens before the release store (or the
 * acq_rel CAS) that makes the state LIVE; every reader loads the state with
 * acquire before reading key or value. A LIVE entry's value is updated in
 * place (as Linux does for per-cpu and array maps): readers may see a value
 * mid-update, but 8-byte words are moved with relaxed atomics so a counter is
 * never torn. Per-worker maps write only the caller's worker slot; a new key
 * starts with every other slot zero. Lookups that find a bucket CLAIMING wait
 * (a key write is a memcpy); the cross-process reader waits a bounded time
 * and then treats the bucket as not matching. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/atomics.h"
#include "bpf/bpf_internal.h"
#include "bpf/map_view.h"

#define MAX_KEY_SIZE 512
#define MAX_VALUE_SIZE 65536
#define MAX_WORKERS 4096
#define MAX_MAP_BYTES (1ull << 32) /* one map's shared memory */
#define MAX_HASH_ENTRIES (1u << 30)  /* twice that in slots still fits a u32 */

struct ms_bpf_map {
  struct ms_bpf_map_def def;
  uint32_t n_workers;
  int fd;
  int wake_fd;  /* ring buffer: the reader's wake-up eventfd, -1 otherwise */
  uint8_t *base;
  size_t map_len;
  struct map_view v;
};

struct ms_bpf_map_reader {
  int consume;
  uint8_t *base;
  size_t map_len;
  uint8_t *cons_page; /* writable consumer position, MS_BPF_READER_CONSUME */
  size_t page;
  struct map_view v;
};

static uint64_t round_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

/* Bytes a ring buffer holds for its reader (reserved records included). */
static uint64_t ring_pending(const struct map_view *v) {
  return __atomic_load_n(v->prod_pos, __ATOMIC_RELAXED) - __atomic_load_n(v->cons_pos, __ATOMIC_RELAXED);
}

/* A ring buffer's "reader asleep" flag (MS_BPF_RINGBUF_WAKE_OFF). */
static uint32_t *wake_flag(const struct map_view *v) {
  return (uint32_t *)((uint8_t *)v->cons_pos + MS_BPF_RINGBUF_WAKE_OFF);
}

/* x <= 2^31 (check_def bounds max_entries), so the result fits and the loop ends */
static uint32_t next_pow2(uint64_t x) {
  uint32_t p = 8;
  while (p < x && p < (1u << 31)) p <<= 1;
  return p;
}

static int is_hash(uint32_t type) { return type == MS_BPF_MAP_HASH || type == MS_BPF_MAP_PERCPU_HASH; }
static int is_percpu(uint32_t type) {
  return type == MS_BPF_MAP_PERCPU_HASH || type == MS_BPF_MAP_PERCPU_ARRAY;
}

/* ---- layout ------------------------------------------------------------- */

static int check_def(const struct ms_bpf_map_def *d, uint32_t n_workers, struct ms_textbuf *log) {
  const char *name = d->name[0] ? d->name : "(unnamed)";
  if (n_workers < 1 || n_workers > MAX_WORKERS) {
    ms_textbuf_printf(log, "map %s: %u workers (1..%d)\n", name, n_workers, MAX_WORKERS);
    return -EINVAL;
  }
  switch (d->type) {
  case MS_BPF_MAP_RINGBUF:
    if (d->key_size || d->value_size || d->max_entries < 4096 || d->max_entries & (d->max_entries - 1)) {
      ms_textbuf_printf(log, "map %s: a ring buffer has key and value size 0 and max_entries a "
                        "power of two of at least 4096 (got %u/%u/%u)\n", name, d->key_size,
                        d->value_size, d->max_entries);
      return -EINVAL;
    }
    return 0;
  case MS_BPF_MAP_ARRAY: case MS_BPF_MAP_PERCPU_ARRAY:
    if (d->key_size != 4) {
      ms_textbuf_printf(log, "map %s: array keys are 4 bytes (got %u)\n", name, d->key_size);
      return -EINVAL;
    }
    break;
  case MS_BPF_MAP_HASH: case MS_BPF_MAP_PERCPU_HASH:
    if (d->key_size < 1 || d->key_size > MAX_KEY_SIZE) {
      ms_textbuf_printf(log, "map %s: key size %u (1..%d)\n", name, d->key_size, MAX_KEY_SIZE);
      return -EINVAL;
    }
    break;
  default:
    ms_textbuf_printf(log, "map %s: unsupported map type %u\n", name, d->type);
    return -MS_E_UNSUPP;
  }
  if (is_hash(d->type) && d->max_entries > MAX_HASH_ENTRIES) {
    ms_textbuf_printf(log, "map %s: max_entries %u is over the %u entries a hash map holds\n", name,
                      d->max_entries, MAX_HASH_ENTRIES);
    return -E2BIG;
  }
  if (d->value_size < 1 || d->value_size > MAX_VALUE_SIZE || d->max_entries < 1) {
    ms_textbuf_printf(log, "map %s: value size %u (1..%d), max_entries %u (>= 1)\n", name,
                      d->value_size, MAX_VALUE_SIZE, d->max_entries);
    return -EINVAL;
  }
  return 0;
}

int map_layout(const struct ms_bpf_map_def *def, uint32_t n_workers, uint64_t page,
               struct ms_bpf_map_shm *h, struct ms_textbuf *log) {
  int err = check_def(def, n_workers, log);
  if (err) return err;
  memset(h, 0, sizeof *h);
  h->magic = MS_BPF_MAP_SHM_MAGIC;
  h->version = MS_BPF_MAP_SHM_VERSION;
  h->header_size = sizeof *h;
  h->type = def->type;
  h->key_size = def->key_size;
  h->value_size = def->value_size;
  h->max_entries = def->max_entries;
  h->n_workers = is_percpu(def->type) ? n_workers : 1;
  h->flags = def->flags;
  memcpy(h->name, def->name, sizeof h->name);
  h->name[sizeof h->name - 1] = 0;
  uint64_t off = round_up(sizeof *h, 64);
  if (def->type == MS_BPF_MAP_RINGBUF) {
    h->ring_cons_off = round_up(off, page);
    h->ring_prod_off = h->ring_cons_off + page;
    h->ring_data_off = h->ring_prod_off + page;
    h->ring_size = def->max_entries;
    h->total_size = h->ring_data_off + h->ring_size;
  } else {
    h->key_stride = (uint32_t)round_up(def->key_size, 8);
    h->value_stride = (uint32_t)round_up(def->value_size, 8);
    h->n_slots = is_hash(def->type) ? next_pow2(2ull * def->max_entries) : def->max_entries;
    if (is_hash(def->type)) {
      h->state_off = off;
      h->key_off = round_up(off + 4ull * h->n_slots, 64);
      off = h->key_off + (uint64_t)h->key_stride * h->n_slots;
    }
    h->value_off = round_up(off, 64);
    h->total_size = round_up(h->value_off + (uint64_t)h->value_stride * h->n_slots * h->n_workers, page);
  }
  if (h->total_size > MAX_MAP_BYTES) {
    ms_textbuf_printf(log, "map %s: %llu bytes of shared memory, the limit is %llu\n", h->name,
                      (unsigned long long)h->total_size, (unsigned long long)MAX_MAP_BYTES);
    return -E2BIG;
  }
  return 0;
}

/* ---- copies ------------------------------------------------------------- */

void map_copy_out(void *dst, const void *src, size_t n) {
  uint8_t *d = dst;
  const uint8_t *s = src;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w = __atomic_load_n((const uint64_t *)(s + i), __ATOMIC_RELAXED);
    memcpy(d + i, &w, 8);
  }
  for (; i < n; i++) d[i] = __atomic_load_n(s + i, __ATOMIC_RELAXED);
}

/* ---- hash: core/map_core.h, the device's own ------------------------------- */

static void relax(uint64_t spins) {
  ms_at_relax();
  if (spins > 1024) sched_yield(); /* more threads than cores: let the writer run */
}

#define MS_MAPC_FN static inline
#define MS_MAPC_VIEW struct map_view
#define MS_MAPC_RELAX(spins) relax(spins)
#define MS_MAPC_RING_SPARE 0 /* the data is mapped twice back to back: a record that wraps is contiguous */
#include "core/map_core.h"

void map_view_init(struct map_view *v, const struct ms_bpf_map_shm *h, uint8_t *base) {
  memset(v, 0, sizeof *v);
  ms_mapc_view_init(v, h, base);
}

void *ringbuf_reserve(struct map_view *v, uint64_t size) { return ms_mapc_ring_reserve(v, size); }
void ringbuf_release(struct map_view *v, void *rec, int discard) { ms_mapc_ring_release(v, rec, discard); }

int64_t map_hash_find(const struct map_view *v, const void *key, int bounded) {
  return ms_mapc_hash_find(v, key, bounded);
}

/* ---- array -------------------------------------------------------------- */

static int array_index(const struct map_view *v, const void *key, uint32_t *idx) {
  memcpy(idx, key, 4);
  return *idx < v->max_entries ? 0 : -E2BIG;
}

/* ---- the engine's side -------------------------------------------------- */

void ms_bpf_map_free(struct ms_bpf_map *m) {
  if (!m) return;
  if (m->base) munmap(m->base, m->map_len);
  if (m->fd >= 0) close(m->fd);
  if (m->wake_fd >= 0) close(m->wake_fd);
  free(m);
}

/* Maps [0, total) of fd at a fresh address; a ring buffer's data is mapped a
 * second time right after itself so records that wrap read contiguously. */
static uint8_t *map_fd(int fd, const struct ms_bpf_map_shm *h, int prot, size_t *len) {
  int ring = h->type == MS_BPF_MAP_RINGBUF;
  *len = h->total_size + (ring ? h->ring_size : 0);
  uint8_t *base = mmap(NULL, *len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (base == MAP_FAILED) return NULL;
  if (mmap(base, h->total_size, prot, MAP_SHARED | MAP_FIXED, fd, 0) == MAP_FAILED ||
      (ring && mmap(base + h->total_size, h->ring_size, prot, MAP_SHARED | MAP_FIXED, fd,
                    (off_t)h->ring_data_off) == MAP_FAILED)) {
    int e = errno;
    munmap(base, *len);
    errno = e;
    return NULL;
  }
  return base;
}

struct ms_bpf_map *ms_bpf_map_new(const struct ms_bpf_map_def *def, uint32_t n_workers,
                                  struct ms_textbuf *log) {
  struct ms_bpf_map_shm h;
  int err = def ? map_layout(def, n_workers, (uint64_t)sysconf(_SC_PAGESIZE), &h, log) : -EINVAL;
  if (err) {
    errno = -err;
    return NULL;
  }
  struct ms_bpf_map *m = calloc(1, sizeof *m);
  if (!m) return NULL;
  m->fd = m->wake_fd = -1;
  m->def = *def;
  m->def.name[sizeof m->def.name - 1] = 0;
  m->n_workers = n_workers;
  char name[80] = "ms-map-";
  strncat(name, h.name, sizeof name - 8);
  m->fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (m->fd < 0 || ftruncate(m->fd, (off_t)h.total_size) < 0) goto fail;
  /* A reader can then trust the size it sees: the file never shrinks under it. */
  if (fcntl(m->fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0) goto fail;
  m->base = map_fd(m->fd, &h, PROT_READ | PROT_WRITE, &m->map_len);
  if (!m->base) goto fail;
  memcpy(m->base, &h, sizeof h);
  map_view_init(&m->v, &h, m->base);
  /* without one a reader polls: records still arrive, later */
  if (def->type == MS_BPF_MAP_RINGBUF) m->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  return m;
fail:
  err = errno;
  ms_textbuf_printf(log, "map %s: shared memory: %s\n", h.name, ms_strerror(err));
  ms_bpf_map_free(m);
  errno = err;
  return NULL;
}

const struct ms_bpf_map_def *ms_bpf_map_info(const struct ms_bpf_map *m) { return &m->def; }
uint32_t ms_bpf_map_workers(const struct ms_bpf_map *m) { return m->n_workers; }
int ms_bpf_map_fd(const struct ms_bpf_map *m) { return m->fd; }
int ms_bpf_map_wake_fd(const struct ms_bpf_map *m) { return m->wake_fd; }
uint64_t ms_bpf_map_bytes(const struct ms_bpf_map *m) {
  return m ? ((const struct ms_bpf_map_shm *)m->base)->total_size : 0;
}

int ms_bpf_map_snapshot(const struct ms_bpf_map *m, void *dst, size_t n) {
  uint64_t total = ms_bpf_map_bytes(m);
  if (!m || !dst) return -EINVAL;
  if (n < total) return -EMSGSIZE;
  map_copy_out(dst, m->base, (size_t)total);
  return 0;
}

/* The copy's header must be m's, but for its two live counters, which the
 * copy brings. */
int ms_bpf_map_restore(struct ms_bpf_map *m, const void *src, size_t n) {
  const struct ms_bpf_map_shm *mine = (const struct ms_bpf_map_shm *)m->base;
  struct ms_bpf_map_shm theirs;
  if (!m || !src || n < sizeof theirs) return -EINVAL;
  memcpy(&theirs, src, sizeof theirs);
  int same_name = !strncmp(theirs.name, mine->name, sizeof theirs.name);
  theirs.count = mine->count;
  theirs.lost = mine->lost;
  memcpy(theirs.name, mine->name, sizeof theirs.name);
  if (!same_name || memcmp(&theirs, mine, sizeof theirs) || n != mine->total_size) return -MS_E_FORMAT;
  const struct ms_bpf_map_shm *h = src;
  ms_at_copy_in(m->base + mine->header_size, (const uint8_t *)src + mine->header_size,
                mine->total_size - mine->header_size);
  __atomic_store_n(&((struct ms_bpf_map_shm *)m->base)->count, h->count, __ATOMIC_RELAXED);
  __atomic_store_n(&((struct ms_bpf_map_shm *)m->base)->lost, h->lost, __ATOMIC_RELAXED);
  return 0;
}

/* core/map_core.h's operations, after the checks of a public entry point. */
void *ms_bpf_map_lookup(struct ms_bpf_map *m, const void *key, uint32_t worker) {
  return m && key ? ms_mapc_lookup(&m->v, key, worker) : NULL;
}

int ms_bpf_map_update(struct ms_bpf_map *m, const void *key, const void *value, uint64_t flags,
                      uint32_t worker) {
  return m && key && value ? ms_mapc_update(&m->v, key, value, flags, worker) : -EINVAL;
}

int ms_bpf_map_delete(struct ms_bpf_map *m, const void *key) {
  return m && key ? ms_mapc_delete(&m->v, key) : -EINVAL;
}

uint32_t ms_bpf_map_count(const struct ms_bpf_map *m) {
  if (is_hash(m->def.type)) return (uint32_t)__atomic_load_n(&m->v.hdr->count, __ATOMIC_RELAXED);
  return m->def.type == MS_BPF_MAP_RINGBUF ? 0 : m->def.max_entries;
}

void ms_bpf_map_clear(struct ms_bpf_map *m) {
  struct map_view *v = &m->v;
  if (v->type == MS_BPF_MAP_RINGBUF) {
    *v->cons_pos = *v->prod_pos = 0;
    return;
  }
  memset(v->values, 0, (uint64_t)v->value_stride * v->n_slots * v->n_workers);
  if (is_hash(v->type)) {
    memset(v->state, 0, 4ull * v->n_slots);
    memset(v->keys, 0, (uint64_t)v->key_stride * v->n_slots);
    v->hdr->count = 0;
  }
}

int ms_bpf_map_foreach(const struct ms_bpf_map *m, ms_bpf_map_entry_fn fn, void *user) {
  return map_view_foreach(&m->v, fn, user);
}

void ms_bpf_map_region(const struct ms_bpf_map *m, struct ms_bpf_region *r) {
  const struct map_view *v = &m->v;
  if (v->type == MS_BPF_MAP_RINGBUF) {
    *r = (struct ms_bpf_region){(uintptr_t)v->data, 2 * v->ring_size, 1};
    return;
  }
  *r = (struct ms_bpf_region){(uintptr_t)v->values,
                              (uint64_t)v->value_stride * v->n_slots * v->n_workers,
                              !(m->def.flags & MS_BPF_MAP_F_RDONLY_PROG)};
}

int ms_bpf_map_array_layout(const struct ms_bpf_map *m, struct ms_bpf_array_layout *out) {
  const struct map_view *v = &m->v;
  if (v->type != MS_BPF_MAP_ARRAY && v->type != MS_BPF_MAP_PERCPU_ARRAY) return -1;
  *out = (struct ms_bpf_array_layout){v->values, v->max_entries, v->n_slots, v->n_workers, v->value_stride,
                                      is_percpu(v->type)};
  return 0;
}

void *ms_bpf_map_direct_value(struct ms_bpf_map *m, uint32_t off) {
  if (m->def.type != MS_BPF_MAP_ARRAY || off >= m->def.value_size) return NULL;
  return m->v.values + off;
}

/* ---- iteration, shared with readers ------------------------------------- */

static int visit(const struct map_view *v, const void *key, uint32_t slot, uint8_t *buf,
                 ms_bpf_map_entry_fn fn, void *user) {
  for (uint32_t w = 0; w < v->n_workers; w++)
    map_copy_out(buf + (uint64_t)w * v->value_size, map_value_at(v, slot, w), v->value_size);
  return fn(user, key, buf);
}

int map_view_foreach(const struct map_view *v, ms_bpf_map_entry_fn fn, void *user) {
  if (v->type == MS_BPF_MAP_RINGBUF) return -EINVAL;
  uint8_t *buf = malloc((uint64_t)v->value_size * v->n_workers + v->key_stride);
  if (!buf) return -ENOMEM;
  uint8_t *key = buf + (uint64_t)v->value_size * v->n_workers;
  int ret = 0;
  for (uint32_t i = 0; i < v->n_slots && !ret; i++) {
    if (!is_hash(v->type)) {
      ret = visit(v, &i, i, buf, fn, user);
      continue;
    }
    if (ms_at_ld_acq32(&v->state[i]) != MS_BPF_SLOT_LIVE) continue;
    map_copy_out(key, v->keys + (uint64_t)i * v->key_stride, v->key_size);
    ret = visit(v, key, i, buf, fn, user);
  }
  free(buf);
  return ret;
}

int map_view_lookup_copy(const struct map_view *v, const void *key, void *out) {
  uint32_t slot;
  if (is_hash(v->type)) {
    int64_t b = map_hash_find(v, key, 1);
    if (b < 0 || ms_at_ld_acq32(&v->state[b]) != MS_BPF_SLOT_LIVE) return -ENOENT;
    slot = (uint32_t)b;
  } else if (v->type == MS_BPF_MAP_RINGBUF || array_index(v, key, &slot)) {
    return -ENOENT;
  }
  for (uint32_t w = 0; w < v->n_workers; w++)
    map_copy_out((uint8_t *)out + (uint64_t)w * v->value_size, map_value_at(v, slot, w), v->value_size);
  return 0;
}

/* ---- the reader in another process -------------------------------------- */

/* The header must be exactly what map_layout derives from its own fields. */
static int reader_check(const struct ms_bpf_map_shm *h, uint64_t file_size, uint64_t page,
                        struct ms_textbuf *log) {
  if (h->magic != MS_BPF_MAP_SHM_MAGIC || h->version != MS_BPF_MAP_SHM_VERSION ||
      h->header_size < sizeof *h) {
    ms_textbuf_printf(log, "not a megascope map (magic 0x%llx, version %u)\n",
                      (unsigned long long)h->magic, h->version);
    return -MS_E_FORMAT;
  }
  struct ms_bpf_map_def def = {.type = h->type, .key_size = h->key_size, .value_size = h->value_size,
                               .max_entries = h->max_entries, .flags = h->flags};
  memcpy(def.name, h->name, sizeof def.name);
  def.name[sizeof def.name - 1] = 0;
  struct ms_bpf_map_shm want;
  int err = map_layout(&def, h->n_workers, page, &want, log);
  if (err) return -MS_E_FORMAT;
  if (want.n_workers != h->n_workers || want.total_size != h->total_size ||
      want.n_slots != h->n_slots || want.value_off != h->value_off || want.key_off != h->key_off ||
      want.state_off != h->state_off || want.ring_data_off != h->ring_data_off ||
      want.key_stride != h->key_stride || want.value_stride != h->value_stride ||
      want.ring_size != h->ring_size || want.ring_cons_off != h->ring_cons_off ||
      want.ring_prod_off != h->ring_prod_off) {
    ms_textbuf_printf(log, "map %s: header layout does not match its own sizes\n", def.name);
    return -MS_E_FORMAT;
  }
  if (h->total_size > file_size) {
    ms_textbuf_printf(log, "map %s: header says %llu bytes, the file has %llu\n", def.name,
                      (unsigned long long)h->total_size, (unsigned long long)file_size);
    return -MS_E_FORMAT;
  }
  return 0;
}

void ms_bpf_map_reader_free(struct ms_bpf_map_reader *r) {
  if (!r) return;
  if (r->base) munmap(r->base, r->map_len);
  if (r->cons_page) munmap(r->cons_page, r->page);
  free(r);
}

struct ms_bpf_map_reader *ms_bpf_map_reader_new(int fd, unsigned flags, struct ms_textbuf *log) {
  struct stat st;
  struct ms_bpf_map_shm h;
  uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
  int err = -EINVAL;
  if (fstat(fd, &st) < 0 || (uint64_t)st.st_size < sizeof h) {
    ms_textbuf_printf(log, "map fd %d: too small or unreadable\n", fd);
    errno = EINVAL;
    return NULL;
  }
  if (pread(fd, &h, sizeof h, 0) != (ssize_t)sizeof h) {
    ms_textbuf_printf(log, "map fd %d: cannot read the header\n", fd);
    errno = EIO;
    return NULL;
  }
  err = reader_check(&h, (uint64_t)st.st_size, page, log);
  if (err) {
    errno = -err;
    return NULL;
  }
  struct ms_bpf_map_reader *r = calloc(1, sizeof *r);
  if (!r) return NULL;
  r->page = page;
  r->base = map_fd(fd, &h, PROT_READ, &r->map_len);
  if (!r->base) goto fail;
  /* Decode from the checked copy: the shared header could change under us. */
  map_view_init(&r->v, &h, r->base);
  if (flags & MS_BPF_READER_CONSUME) {
    if (h.type != MS_BPF_MAP_RINGBUF) {
      errno = EINVAL;
      goto fail;
    }
    r->cons_page = mmap(NULL, page, PROT_READ | PROT_WRITE, MAP_SHARED, fd, (off_t)h.ring_cons_off);
    if (r->cons_page == MAP_FAILED) {
      r->cons_page = NULL;
      goto fail;
    }
    r->v.cons_pos = (uint64_t *)r->cons_page;
    r->consume = 1;
  }
  return r;
fail:
  err = errno;
  ms_textbuf_printf(log, "map %s: mapping fd %d: %s\n", h.name, fd, ms_strerror(err));
  ms_bpf_map_reader_free(r);
  errno = err;
  return NULL;
}

const struct ms_bpf_map_shm *ms_bpf_map_reader_header(const struct ms_bpf_map_reader *r) {
  return r->v.hdr;
}

int ms_bpf_map_reader_foreach(const struct ms_bpf_map_reader *r, ms_bpf_map_entry_fn fn, void *user) {
  return map_view_foreach(&r->v, fn, user);
}

int ms_bpf_map_reader_lookup(const struct ms_bpf_map_reader *r, const void *key, void *out) {
  return map_view_lookup_copy(&r->v, key, out);
}

int ms_bpf_map_reader_consume(struct ms_bpf_map_reader *r, ms_bpf_ringbuf_fn fn, void *user) {
  if (!r->consume) return -EPERM;
  return ringbuf_consume(&r->v, fn, user);
}

int ms_bpf_map_reader_arm(struct ms_bpf_map_reader *r) {
  if (!r->consume) return -EPERM;
  uint32_t *flag = wake_flag(&r->v);
  __atomic_store_n(flag, 1, __ATOMIC_RELAXED);
  __atomic_thread_fence(__ATOMIC_SEQ_CST);  /* ring_wake's pair */
  if (ring_pending(&r->v) < r->v.ring_size / 2) return 0;
  __atomic_store_n(flag, 0, __ATOMIC_RELAXED);
  return 1;
}

void ms_bpf_map_reader_disarm(struct ms_bpf_map_reader *r) {
  if (r->consume) __atomic_store_n(wake_flag(&r->v), 0, __ATOMIC_RELAXED);
}

/* ---- ring buffer entry points on the engine's side ---------------------- */

void *ms_bpf_ringbuf_reserve(struct ms_bpf_map *m, uint64_t size) {
  return m->def.type == MS_BPF_MAP_RINGBUF ? ringbuf_reserve(&m->v, size) : NULL;
}

/* After a submit: wakes a sleeping reader once the ring is half full, or at
 * once with MS_BPF_RB_FORCE_WAKEUP, never with MS_BPF_RB_NO_WAKEUP (Linux's
 * flags). The fence pairs with the reader's in ms_bpf_map_reader_arm (its
 * flag store before its position load, our position store before this flag
 * load): one of the two sees the other, so a reader never sleeps past a
 * half-full ring. Below half nothing is read but the positions. */
static void ring_wake(struct ms_bpf_map *m, uint64_t flags) {
  const struct map_view *v = &m->v;
  if (m->wake_fd < 0 || (flags & MS_BPF_RB_NO_WAKEUP)) return;
  if (!(flags & MS_BPF_RB_FORCE_WAKEUP) && ring_pending(v) < v->ring_size / 2) return;
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
  uint32_t *flag = wake_flag(v);
  if (!__atomic_load_n(flag, __ATOMIC_RELAXED) || !__atomic_exchange_n(flag, 0, __ATOMIC_ACQ_REL)) return;
  uint64_t one = 1;
  if (write(m->wake_fd, &one, sizeof one) < 0) return;  /* EAGAIN: the counter is full, the reader awake */
}

void ms_bpf_ringbuf_submit_flags(struct ms_bpf_map *m, void *rec, uint64_t flags) {
  ringbuf_release(&m->v, rec, 0);
  ring_wake(m, flags);
}
void ms_bpf_ringbuf_submit(struct ms_bpf_map *m, void *rec) { ms_bpf_ringbuf_submit_flags(m, rec, 0); }
void ms_bpf_ringbuf_discard(struct ms_bpf_map *m, void *rec) { ringbuf_release(&m->v, rec, 1); }

int ms_bpf_ringbuf_output_flags(struct ms_bpf_map *m, const void *data, uint64_t size, uint64_t flags) {
  if (m->def.type != MS_BPF_MAP_RINGBUF) return -EINVAL;
  void *rec = ringbuf_reserve(&m->v, size);
  if (!rec) return -EAGAIN;
  memcpy(rec, data, size);
  ringbuf_release(&m->v, rec, 0);
  ring_wake(m, flags);
  return 0;
}

int ms_bpf_ringbuf_output(struct ms_bpf_map *m, const void *data, uint64_t size) {
  return ms_bpf_ringbuf_output_flags(m, data, size, 0);
}

uint64_t ms_bpf_ringbuf_lost(const struct ms_bpf_map *m) {
  return __atomic_load_n(&m->v.hdr->lost, __ATOMIC_RELAXED);
}

int ms_bpf_ringbuf_consume(struct ms_bpf_map *m, ms_bpf_ringbuf_fn fn, void *user) {
  if (m->def.type != MS_BPF_MAP_RINGBUF) return -EINVAL;
  return ringbuf_consume(&m->v, fn, user);
}
