/* SPDX-License-Identifier: MIT */
/* The device's eBPF core (src/core/bpf_core.h) compiled as C and held against
 * the reference (interp.c, helpers.c, maps.c, ringbuf.c), since the machine
 * that builds it may have no GPU:
 *   - every conformance file of the public suite: the core's r0, error,
 *     instruction count, failing instruction and final -- mem bytes equal the
 *     reference's, and the file's expectation;
 *   - error paths the suite does not reach (bounds, read-only context, depth,
 *     budget, unknown helper, a record left open, map binding);
 *   - map operations, op by op on twin maps of every type (codes and final
 *     bytes), the ring buffer with wrap (on a double mapping and on a plain
 *     device-style image with the spare tail);
 *   - every shipped monitor program run on synthetic contexts through both,
 *     on separate map instances: results per run, then every map's shared
 *     memory byte for byte, ring buffers consumed along the way through the
 *     reference consumer, and the core's maps read back through the
 *     cross-process reader (ms_bpf_map_reader_*);
 *   - that the comparisons can fail (a corrupted map or result is caught). */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "core/bpf_core.h"
#include "hook/hook_impl.h"
#include "megascope/bpf.h"
#include "test.h"

#define W 4 /* workers of per-worker maps */

static char logbuf[4096];
static struct ms_textbuf tlog;

static void log_reset(void) {
  logbuf[0] = 0;
  tlog = (struct ms_textbuf){logbuf, sizeof logbuf, 0, 0};
}

/* ---- twin maps: a reference map and one the core writes -------------------- */

struct twin {
  struct ms_bpf_map *ref, *core;
  uint8_t *core_img; /* the core map's memfd, mapped here */
  size_t core_len;
  struct msd_map view;
};

static int twin_init(struct twin *t, const struct ms_bpf_map_def *d, uint32_t workers) {
  memset(t, 0, sizeof *t);
  log_reset();
  t->ref = ms_bpf_map_new(d, workers, &tlog);
  t->core = ms_bpf_map_new(d, workers, &tlog);
  if (!t->ref || !t->core) return -1;
  struct ms_bpf_map_shm h;
  if (pread(ms_bpf_map_fd(t->core), &h, sizeof h, 0) != (ssize_t)sizeof h) return -1;
  int ring = h.type == MS_BPF_MAP_RINGBUF;
  /* as maps.c maps it: the ring data twice, back to back */
  t->core_len = h.total_size + (ring ? h.ring_size : 0);
  uint8_t *base = mmap(NULL, t->core_len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (base == MAP_FAILED) return -1;
  if (mmap(base, h.total_size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, ms_bpf_map_fd(t->core), 0) ==
          MAP_FAILED ||
      (ring && mmap(base + h.total_size, h.ring_size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED,
                    ms_bpf_map_fd(t->core), (off_t)h.ring_data_off) == MAP_FAILED))
    return -1;
  t->core_img = base;
  msd_map_init(&t->view, &h, base);
  return 0;
}

static void twin_free(struct twin *t) {
  if (t->core_img) munmap(t->core_img, t->core_len);
  ms_bpf_map_free(t->ref);
  ms_bpf_map_free(t->core);
}

/* Byte-compares the two memfds; returns the first differing offset or -1. */
static long twin_diff(const struct twin *t) {
  struct ms_bpf_map_shm h;
  if (pread(ms_bpf_map_fd(t->ref), &h, sizeof h, 0) != (ssize_t)sizeof h) return 0;
  uint8_t *a = malloc(h.total_size), *b = malloc(h.total_size);
  long at = -1;
  if (pread(ms_bpf_map_fd(t->ref), a, h.total_size, 0) != (ssize_t)h.total_size ||
      pread(ms_bpf_map_fd(t->core), b, h.total_size, 0) != (ssize_t)h.total_size)
    at = 0;
  for (uint64_t i = 0; at < 0 && i < h.total_size; i++)
    if (a[i] != b[i]) at = (long)i;
  free(a);
  free(b);
  return at;
}

/* ---- conformance files --------------------------------------------------- */

/* The -- raw words and -- mem bytes of a file (the parser's rules, see
 * testfile.c: `#` comments, `--` lines switch section). */
static void parse_raw_mem(char *text, struct ms_bpf_insn **raw, size_t *n_raw, uint8_t **mem, size_t *n_mem) {
  enum { OTHER, RAW, MEM } sec = OTHER;
  *raw = NULL;
  *mem = NULL;
  *n_raw = *n_mem = 0;
  for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
    char *hash = strchr(line, '#');
    if (hash) *hash = 0;
    if (strstr(line, "--")) {
      sec = strstr(line, "asm") || strstr(line, "result") ? OTHER
            : strstr(line, "mem") ? MEM : strstr(line, "raw") ? RAW : OTHER;
      continue;
    }
    for (char *tok = line; sec != OTHER && *tok;) {
      char *end;
      while (*tok == ' ' || *tok == '\t' || *tok == '\r') tok++;
      if (!*tok) break;
      if (sec == RAW) {
        uint64_t w = strtoull(tok, &end, strncmp(tok, "0x", 2) ? 10 : 16);
        *raw = realloc(*raw, (*n_raw + 1) * sizeof **raw);
        memcpy(&(*raw)[(*n_raw)++], &w, 8);
      } else {
        unsigned long v = strtoul(tok, &end, 16);
        *mem = realloc(*mem, *n_mem + 1);
        (*mem)[(*n_mem)++] = (uint8_t)v;
      }
      if (end == tok) break;
      tok = end;
    }
  }
}

static uint64_t identity(struct ms_bpf_exec *x, uint64_t a1, uint64_t a2, uint64_t a3, uint64_t a4,
                         uint64_t a5) {
  return a1;
}

struct conf_counts {
  int files, compared, skipped, decided_early;
};

/* Runs insns through both with copies of mem; checks that everything agrees
 * and returns 1 when they do. */
static int compare_conformance(const char *name, const struct ms_bpf_insn *insns, size_t n,
                               const uint8_t *mem, size_t mem_size, const struct ms_bpf_test_report *rep) {
  static const struct ms_bpf_helper_proto id5 = {5, "identity", MS_BPF_RET_INTEGER, {MS_BPF_ARG_ANYTHING}, 0};
  struct ms_bpf_helpers *h = ms_bpf_helpers_new();
  ms_bpf_helpers_set(h, &id5, identity);
  log_reset();
  struct ms_bpf_prog_opts po = {.sz = sizeof po, .name = name, .log = &tlog};
  struct ms_bpf_prog *p = ms_bpf_prog_new(insns, n, &po);
  uint8_t *ma = malloc(mem_size + 1), *mb = malloc(mem_size + 1);
  memcpy(ma, mem, mem_size);
  memcpy(mb, mem, mem_size);
  int ok = 1;
  if (p) {
    struct ms_bpf_run_opts ro = {.sz = sizeof ro, .helpers = h, .mem = mem_size ? ma : NULL,
                                 .mem_size = mem_size, .insn_budget = 1u << 24, .log = &tlog};
    struct ms_bpf_run_result ra;
    int ea = ms_bpf_run(p, &ro, &ra);
    struct msd_run in;
    msd_run_init(&in);
    in.insns = insns;
    in.n_insns = (uint32_t)n;
    in.mem = mem_size ? mb : NULL;
    in.mem_size = mem_size;
    in.budget = 1u << 24;
    in.flags = MSD_RUN_CONFORMANCE;
    struct msd_result rb;
    int eb = msd_bpf_run(&in, &rb);
    CHECKF(ea == eb, "%s: reference error %d, core %d", name, ea, eb);
    CHECKF(ea || ra.r0 == rb.r0, "%s: r0 0x%llx vs core 0x%llx", name, (unsigned long long)ra.r0,
           (unsigned long long)rb.r0);
    CHECKF(ra.insns == rb.insns, "%s: %llu vs %llu instructions", name, (unsigned long long)ra.insns,
           (unsigned long long)rb.insns);
    CHECKF(ra.err_insn == rb.err_insn, "%s: stopped at %lld vs %lld", name, (long long)ra.err_insn,
           (long long)rb.err_insn);
    CHECKF(!mem_size || !memcmp(ma, mb, mem_size), "%s: -- mem differs after the run", name);
    /* and the file's own expectation */
    if (rep->expect_error)
      CHECKF(eb != 0, "%s: expected an error, the core returned 0x%llx", name, (unsigned long long)rb.r0);
    else
      CHECKF(eb == 0 && rb.r0 == rep->expected, "%s: core error %d r0 0x%llx, expected 0x%llx", name, eb,
             (unsigned long long)rb.r0, (unsigned long long)rep->expected);
    ok = ea == eb && (ea || ra.r0 == rb.r0) && ra.insns == rb.insns;
  }
  ms_bpf_prog_free(p);
  ms_bpf_helpers_free(h);
  free(ma);
  free(mb);
  return p ? ok : -1;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static int test_conformance(struct conf_counts *c) {
  const char *shared = getenv("MS_SHARED");
  char dir[1024];
  snprintf(dir, sizeof dir, "%s/third_party/bpf_conformance/tests", shared ? shared : "../shared");
  DIR *d = opendir(dir);
  if (!d) return 77;
  char *names[1024];
  int n = 0;
  for (struct dirent *e; (e = readdir(d)) && n < 1024;) {
    size_t l = strlen(e->d_name);
    if (l > 5 && !strcmp(e->d_name + l - 5, ".data")) names[n++] = strdup(e->d_name);
  }
  closedir(d);
  qsort(names, (size_t)n, sizeof names[0], cmp_str);
  for (int i = 0; i < n; i++) {
    char path[1400];
    size_t len;
    snprintf(path, sizeof path, "%s/%s", dir, names[i]);
    char *text = ms_test_slurp(path, &len);
    c->files++;
    log_reset();
    struct ms_bpf_testfile *t = text ? ms_bpf_testfile_parse(text, len, &tlog) : NULL;
    struct ms_bpf_test_report rep;
    CHECKF(t && ms_bpf_testfile_check(t, &rep) == 0, "%s: parse/check", names[i]);
    if (!t) {
      free(text);
      free(names[i]);
      continue;
    }
    struct ms_bpf_insn *raw, *insns = NULL;
    uint8_t *mem;
    size_t n_raw, n_mem, n_insns = 0;
    parse_raw_mem(text, &raw, &n_raw, &mem, &n_mem);
    if (n_raw) {
      insns = raw;
      n_insns = n_raw;
      raw = NULL;
    } else if (ms_bpf_testfile_asm(t)) {
      log_reset();
      if (ms_bpf_asm(ms_bpf_testfile_asm(t), &insns, &n_insns, &tlog)) insns = NULL;
    }
    if (rep.status == MS_BPF_TEST_SKIP) {
      c->skipped++;
    } else if (!insns) {
      c->decided_early++; /* assembly refused: the outcome is the file's, nothing to run */
      CHECKF(rep.status == MS_BPF_TEST_PASS, "%s: reference %s", names[i], rep.why);
    } else {
      CHECKF(rep.status == MS_BPF_TEST_PASS, "%s: reference fails: %s", names[i], rep.why);
      int r = compare_conformance(names[i], insns, n_insns, mem, n_mem, &rep);
      if (r < 0) c->decided_early++;
      else c->compared++;
    }
    free(raw);
    free(insns);
    free(mem);
    ms_bpf_testfile_free(t);
    free(text);
    free(names[i]);
  }
  return 0;
}

/* ---- error paths --------------------------------------------------------- */

/* Runs text through both with an 8-byte read-only ctx and a 16-byte mem; the
 * codes, instruction counts and failing instructions must agree, and the
 * reference must stop with want (0: no error). */
static void same_outcome(const char *text, int want) {
  struct ms_bpf_insn *insns;
  size_t n;
  log_reset();
  if (ms_bpf_asm(text, &insns, &n, &tlog)) {
    CHECKF(0, "assembly of '%s': %s", text, logbuf);
    return;
  }
  struct ms_bpf_prog_opts po = {.sz = sizeof po, .log = &tlog};
  struct ms_bpf_prog *p = ms_bpf_prog_new(insns, n, &po);
  CHECKF(p, "'%s' refused: %s", text, logbuf);
  uint64_t ctx = 0x1122334455667788ull;
  uint8_t ma[16] = {1, 2, 3}, mb[16] = {1, 2, 3};
  struct ms_bpf_run_opts ro = {.sz = sizeof ro, .helpers = ms_monitor_helpers(), .ctx = &ctx, .ctx_size = 8,
                               .mem = ma, .mem_size = sizeof ma, .insn_budget = 1000, .log = &tlog};
  struct ms_bpf_run_result ra;
  int ea = p ? ms_bpf_run(p, &ro, &ra) : -1;
  struct msd_run in;
  msd_run_init(&in);
  in.insns = insns;
  in.n_insns = (uint32_t)n;
  in.ctx = &ctx;
  in.ctx_size = 8;
  in.mem = mb;
  in.mem_size = sizeof mb;
  in.budget = 1000;
  struct msd_result rb;
  int eb = msd_bpf_run(&in, &rb);
  CHECKF(ea == want, "'%s': reference %d, want %d (%s)", text, ea, want, logbuf);
  CHECKF(ea == eb && ra.err_insn == rb.err_insn && ra.insns == rb.insns && (ea || ra.r0 == rb.r0),
         "'%s': reference %d at %lld (%llu insns, r0 %llu), core %d at %lld (%llu, %llu)", text, ea,
         (long long)ra.err_insn, (unsigned long long)ra.insns, (unsigned long long)ra.r0, eb,
         (long long)rb.err_insn, (unsigned long long)rb.insns, (unsigned long long)rb.r0);
  CHECK(!memcmp(ma, mb, sizeof ma));
  ms_bpf_prog_free(p);
  free(insns);
}

static void test_errors(void) {
  same_outcome("ldxdw %r0, [%r1]\nexit", 0);                      /* ctx read */
  same_outcome("ldxdw %r0, [%r1+1]\nexit", -EFAULT);              /* past ctx */
  same_outcome("stdw [%r1], 1\nexit", -EFAULT);                   /* ctx is read-only */
  same_outcome("mov %r0, 1\nlock add [%r1], %r0\nexit", -EFAULT); /* atomic on ctx */
  same_outcome("stdw [%r10-520], 9\nldxdw %r0, [%r10-520]\nexit", 0); /* the stack holds all frames */
  same_outcome("ldxdw %r0, [%r10]\nexit", -EFAULT);               /* above the stack */
  same_outcome("mov %r0, 0\nstdw [%r10-8], 7\nmov %r1, 1\nlock add [%r10-7], %r1\nexit", -EFAULT);
  same_outcome("mov %r0, 0\nstdw [%r10-8], 7\nmov %r1, 5\nlock fetch add [%r10-8], %r1\n"
               "ldxdw %r0, [%r10-8]\nadd %r0, %r1\nexit", 0);
  same_outcome("mov %r0, 0\nja -1\nexit", -MS_E_LIMIT);           /* budget */
  same_outcome("call local f\nexit\nf:\ncall local f\nexit", -MS_E_LIMIT); /* depth */
  same_outcome("call 99\nexit", -ENOENT);
  same_outcome("call 8\nexit", 0);                                /* the worker */
  same_outcome("mov %r1, 1000\ncall 0x10000\nexit", 0);           /* ms_log2 */
  same_outcome("mov %r1, 0\ncall 0x10000\nexit", 0);
  same_outcome("mov %r1, 1\ncall 1\nexit", -EINVAL);              /* not a map */
  same_outcome("mov %r1, 0\ncall 132\nexit", -EINVAL);            /* not a record */
  same_outcome("mov %r0, 1", -EFAULT);                            /* off the end */
  same_outcome("lddw %r0, 0x1234567890\nexit", 0);
  same_outcome("ldxb %r0, [%r1+7]\nexit", 0);
  same_outcome("ldxh %r0, [%r1+7]\nexit", -EFAULT);
  same_outcome("mov %r0, 0\nstdw [%r10-8], 7\nmov %r1, 3\nlock xchg [%r10-8], %r1\n"
               "ldxdw %r0, [%r10-8]\nlsh %r0, 8\nadd %r0, %r1\nexit", 0);
}

/* ---- map operations, op by op -------------------------------------------- */

static struct ms_bpf_map_def def_of(uint32_t type, uint32_t key, uint32_t value, uint32_t max) {
  struct ms_bpf_map_def d = {.type = type, .key_size = key, .value_size = value, .max_entries = max};
  snprintf(d.name, sizeof d.name, "m%u", type);
  return d;
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint32_t rnd(uint32_t n) {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return (uint32_t)(rng_state % n);
}

static void test_map_ops(uint32_t type, uint32_t key_size, uint32_t value_size, uint32_t max) {
  struct ms_bpf_map_def d = def_of(type, key_size, value_size, max);
  struct twin t;
  CHECKF(twin_init(&t, &d, W) == 0, "map type %u: %s", type, logbuf);
  if (!t.core_img) return;
  int same_rc = 1, same_lookup = 1;
  uint8_t key[16], val[24];
  for (int i = 0; i < 4000; i++) {
    memset(key, 0, sizeof key);
    uint32_t k = rnd(max * 3 + 2);
    memcpy(key, &k, 4);
    key[key_size - 1] ^= (uint8_t)(k * 7); /* the last byte matters too */
    for (uint32_t j = 0; j < value_size; j++) val[j] = (uint8_t)rnd(256);
    uint32_t w = rnd(W + (i % 97 == 0)); /* now and then a worker out of range */
    uint32_t op = rnd(10);
    if (op < 5) {
      uint64_t flags = rnd(20) == 0 ? 5 : rnd(3);
      int a = ms_bpf_map_update(t.ref, key, val, flags, w);
      int b = ms_mapc_update(&t.view, key, val, flags, w);
      same_rc &= a == b;
    } else if (op < 7) {
      int a = ms_bpf_map_delete(t.ref, key);
      int b = ms_mapc_delete(&t.view, key);
      same_rc &= a == b;
    } else {
      uint8_t *a = ms_bpf_map_lookup(t.ref, key, w);
      uint8_t *b = ms_mapc_lookup(&t.view, key, w);
      same_lookup &= !a == !b && (!a || !memcmp(a, b, value_size));
    }
  }
  CHECKF(same_rc, "map type %u: update/delete codes differ", type);
  CHECKF(same_lookup, "map type %u: lookups differ", type);
  long at = twin_diff(&t);
  CHECKF(at < 0, "map type %u: shared memory differs at byte %ld", type, at);
  CHECK(ms_bpf_map_count(t.ref) == ms_bpf_map_count(t.core));
  /* the comparison can fail: one value byte changed is caught */
  if (t.view.values) {
    t.view.values[3] ^= 0x5a;
    CHECKF(twin_diff(&t) >= 0, "map type %u: a corrupted byte went unnoticed", type);
    t.view.values[3] ^= 0x5a;
  }
  twin_free(&t);
}

struct rec_list {
  int n;
  uint8_t buf[1 << 16];
  size_t len;
};

static int collect(void *user, const void *data, uint32_t size) {
  struct rec_list *l = user;
  if (l->len + size + 4 > sizeof l->buf) return -ENOSPC;
  memcpy(l->buf + l->len, &size, 4);
  memcpy(l->buf + l->len + 4, data, size);
  l->len += size + 4;
  l->n++;
  return 0;
}

/* The ring buffer: records of varied sizes, some discarded, consumed now and
 * then, so that it fills (lost) and wraps. With plain = 1 the core's image is
 * a device-style buffer (no second mapping, a spare tail) and only the data it
 * hands a consumer is compared. */
static void test_ringbuf(int plain) {
  struct ms_bpf_map_def d = def_of(MS_BPF_MAP_RINGBUF, 0, 0, 4096);
  struct twin t;
  CHECK(twin_init(&t, &d, 1) == 0);
  if (!t.core_img) return;
  struct ms_bpf_map_shm h;
  memcpy(&h, t.core_img, sizeof h);
  uint8_t *img = NULL;
  struct msd_map view = t.view;
  if (plain) {
    img = calloc(1, msd_map_image_size(&h));
    memcpy(img, t.core_img, h.total_size);
    msd_map_init(&view, &h, img);
  }
  struct rec_list *ra = calloc(1, sizeof *ra), *rb = calloc(1, sizeof *rb);
  int same = 1;
  for (int i = 0; i < 600; i++) {
    uint64_t size = 1 + rnd(300);
    uint8_t data[512];
    for (uint64_t j = 0; j < size; j++) data[j] = (uint8_t)(i + j);
    uint8_t *a = ms_bpf_ringbuf_reserve(t.ref, size);
    uint8_t *b = msd_ringbuf_reserve(&view, size);
    same &= !a == !b;
    if (a && b) {
      memcpy(a, data, size);
      memcpy(b, data, size);
      int discard = rnd(5) == 0;
      if (discard) ms_bpf_ringbuf_discard(t.ref, a);
      else ms_bpf_ringbuf_submit(t.ref, a);
      ms_mapc_ring_release(&view, b, discard);
    }
    if (rnd(8) == 0) {
      ms_bpf_ringbuf_consume(t.ref, collect, ra);
      if (!plain) {
        ms_bpf_ringbuf_consume(t.core, collect, rb);
      } else {
        /* what a host consumer would see after a device-to-host copy */
        memcpy(t.core_img + h.ring_prod_off, img + h.ring_prod_off, h.total_size - h.ring_prod_off);
        memcpy(t.core_img, img, sizeof h);
        ms_bpf_ringbuf_consume(t.core, collect, rb);
        memcpy(img + h.ring_cons_off, t.core_img + h.ring_cons_off, 8); /* and back */
      }
    }
  }
  CHECKF(same, "ring buffer (%s): reserve outcomes differ", plain ? "plain image" : "double mapping");
  CHECKF(ra->n > 100 && ra->n == rb->n && ra->len == rb->len && !memcmp(ra->buf, rb->buf, ra->len),
         "ring buffer (%s): consumed %d vs %d records", plain ? "plain image" : "double mapping", ra->n, rb->n);
  CHECK(ms_bpf_ringbuf_lost(t.ref) > 0 && ms_bpf_ringbuf_lost(t.ref) == (plain ? ((struct ms_bpf_map_shm *)img)->lost
                                                                              : ms_bpf_ringbuf_lost(t.core)));
  if (!plain) CHECKF(twin_diff(&t) < 0, "ring buffer: shared memory differs at %ld", twin_diff(&t));
  free(ra);
  free(rb);
  free(img);
  twin_free(&t);
}

/* ---- the shipped monitors ------------------------------------------------ */

static uint64_t clock_tick(void *user) { return *(uint64_t *)user += 1000; }

static void fill_ctx(struct ms_hook_ctx *c, int hook, int i, uint64_t now) {
  memset(c, 0, sizeof *c);
  c->abi_version = MS_HOOK_ABI_VERSION;
  c->hook = (uint32_t)hook;
  c->now_ns = now;
  c->worker = (uint32_t)(i % W);
  c->step = (uint64_t)(i / 16);
  c->batch_size = 1 + rnd(8);
  c->bucket = 8;
  c->task_class = rnd(12);
  c->op = rnd(20);
  c->task_index = rnd(100);
  c->launch_mode = rnd(2);
  c->task_gen = c->step << 32 | c->task_index;
  c->tile_x = (int32_t)rnd(8);
  c->tile_y = (int32_t)rnd(9) - 1;
  c->tile_z = -1;
  c->req_slot = rnd(5) == 0 ? MS_HOOK_NONE32 : rnd(4);
  c->req_gen = c->req_slot == MS_HOOK_NONE32 ? MS_HOOK_NONE32 : rnd(3);
  c->ctx_len = rnd(512);
  c->t_ready = now - rnd(100000);
  c->t_begin = now - rnd(50000);
  c->t_end = now;
  c->event_id = rnd(50);
  c->event_class = rnd(10);
  c->event_needed = 1 + rnd(4);
  c->wait_reason = rnd(2);
  c->event_count = rnd(4);
  c->queue_depth = rnd(64);
  c->queue_threshold = 32;
  c->phase = rnd(4);
  c->token = rnd(1000);
  c->wait_ns = rnd(1u << 30) * (uint64_t)rnd(4);
  c->queue_kind = rnd(2);
}

struct foreach_list {
  int n;
  size_t len;
  uint8_t buf[1 << 18];
  size_t key_size, values_size;
};

static int collect_entry(void *user, const void *key, const void *values) {
  struct foreach_list *l = user;
  if (l->len + l->key_size + l->values_size > sizeof l->buf) return 0;
  memcpy(l->buf + l->len, key, l->key_size);
  memcpy(l->buf + l->len + l->key_size, values, l->values_size);
  l->len += l->key_size + l->values_size;
  l->n++;
  return 0;
}

/* The core's map read through the cross-process reader agrees with the
 * reference map read through its owner. */
static void check_reader(const struct twin *t) {
  const struct ms_bpf_map_def *d = ms_bpf_map_info(t->ref);
  if (d->type == MS_BPF_MAP_RINGBUF) return;
  log_reset();
  struct ms_bpf_map_reader *r = ms_bpf_map_reader_new(ms_bpf_map_fd(t->core), 0, &tlog);
  CHECKF(r, "map %s: reader: %s", d->name, logbuf);
  if (!r) return;
  struct foreach_list *a = calloc(1, sizeof *a), *b = calloc(1, sizeof *b);
  uint32_t workers = ms_bpf_map_reader_header(r)->n_workers;
  a->key_size = b->key_size = d->key_size;
  a->values_size = b->values_size = (size_t)d->value_size * workers;
  ms_bpf_map_foreach(t->ref, collect_entry, a);
  ms_bpf_map_reader_foreach(r, collect_entry, b);
  CHECKF(a->n == b->n && a->len == b->len && !memcmp(a->buf, b->buf, a->len),
         "map %s: %d entries through the reader, %d in the reference", d->name, b->n, a->n);
  /* and each key looked up */
  int found = 0;
  uint8_t *out = malloc(a->values_size);
  for (size_t off = 0; off < a->len; off += a->key_size + a->values_size) {
    found += ms_bpf_map_reader_lookup(r, a->buf + off, out) == 0 &&
             !memcmp(out, a->buf + off + a->key_size, a->values_size);
  }
  CHECKF(found == a->n, "map %s: %d of %d keys found by the reader", d->name, found, a->n);
  free(out);
  free(a);
  free(b);
  ms_bpf_map_reader_free(r);
}

static void test_monitor(const char *path, int *n_progs, long *n_runs) {
  log_reset();
  struct ms_monitor *m = ms_monitor_open(path, &tlog);
  CHECKF(m, "%s: %s", path, logbuf);
  if (!m) return;
  int n_maps = (int)ms_bpf_object_map_count(m->obj);
  struct twin tw[MS_BPF_MAX_MAPS];
  struct ms_bpf_map *refs[MS_BPF_MAX_MAPS];
  struct msd_map views[MS_BPF_MAX_MAPS];
  for (int i = 0; i < n_maps; i++) {
    CHECKF(twin_init(&tw[i], ms_bpf_object_map(m->obj, (size_t)i), W) == 0, "%s map %d: %s", path, i, logbuf);
    size_t n;
    const void *init = ms_bpf_object_map_init(m->obj, (size_t)i, &n);
    uint32_t key = 0;
    for (int w = 0; init && n && w < W; w++) { /* as table.c does */
      CHECK(ms_bpf_map_update(tw[i].ref, &key, init, MS_BPF_ANY, (uint32_t)w) == 0);
      CHECK(ms_mapc_update(&tw[i].view, &key, init, MS_BPF_ANY, (uint32_t)w) == 0);
    }
    refs[i] = tw[i].ref;
    views[i] = tw[i].view;
  }
  uint64_t clk_a = 5000000, clk_b = 5000000;
  int same = 1, fails = 0, prio_seen = 0;
  struct rec_list *ra = calloc(1, sizeof *ra), *rb = calloc(1, sizeof *rb);
  for (int p = 0; p < m->n_progs; p++) {
    size_t n;
    const struct ms_bpf_insn *insns = ms_bpf_prog_insns(m->progs[p], &n);
    (*n_progs)++;
    for (int i = 0; i < 1500; i++) {
      struct ms_hook_ctx ctx;
      fill_ctx(&ctx, m->hook[p], i, clk_a + 1);
      struct ms_bpf_env env = {.worker = ctx.worker, .clock = clock_tick, .clock_user = &clk_a};
      struct ms_bpf_run_opts ro = {.sz = sizeof ro, .helpers = ms_monitor_helpers(), .maps = refs,
                                   .n_maps = (size_t)n_maps, .ctx = &ctx, .ctx_size = sizeof ctx,
                                   .insn_budget = 100000, .env = &env, .log = &tlog};
      struct ms_bpf_run_result a;
      log_reset();
      int ea = ms_bpf_run(m->progs[p], &ro, &a);
      struct msd_run in;
      msd_run_init(&in);
      in.insns = insns;
      in.n_insns = (uint32_t)n;
      in.maps = views;
      in.n_maps = (uint32_t)n_maps;
      in.ctx = &ctx;
      in.ctx_size = sizeof ctx;
      in.budget = 100000;
      in.worker = ctx.worker;
      in.clock = clock_tick;
      in.clock_user = &clk_b;
      struct msd_result b;
      int eb = msd_bpf_run(&in, &b);
      fails += ea != 0;
      prio_seen |= m->type[p] == MS_PROG_SCHED_HINT && a.r0 > 0;
      int ok = ea == eb && a.r0 == b.r0 && a.insns == b.insns && a.err_insn == b.err_insn;
      if (!ok && same)
        fprintf(stderr, "%s prog %d run %d: reference %d r0 %llu %llu insns; core %d r0 %llu %llu insns (%s)\n",
                path, p, i, ea, (unsigned long long)a.r0, (unsigned long long)a.insns, eb,
                (unsigned long long)b.r0, (unsigned long long)b.insns, logbuf);
      same &= ok;
      (*n_runs)++;
      if (i % 37 == 36)
        for (int k = 0; k < n_maps; k++)
          if (ms_bpf_map_info(refs[k])->type == MS_BPF_MAP_RINGBUF) {
            ms_bpf_ringbuf_consume(tw[k].ref, collect, ra);
            ms_bpf_ringbuf_consume(tw[k].core, collect, rb);
          }
    }
  }
  CHECKF(same, "%s: runs differ", path);
  CHECKF(fails == 0, "%s: %d reference runs failed", path, fails);
  CHECKF(clk_a == clk_b, "%s: the clock was read %llu vs %llu times", path,
         (unsigned long long)(clk_a - 5000000) / 1000, (unsigned long long)(clk_b - 5000000) / 1000);
  CHECKF(ra->n == rb->n && ra->len == rb->len && !memcmp(ra->buf, rb->buf, ra->len),
         "%s: ring records %d vs %d", path, ra->n, rb->n);
  int touched = 0;
  for (int i = 0; i < n_maps; i++) {
    long at = twin_diff(&tw[i]);
    CHECKF(at < 0, "%s: map %s differs at byte %ld", path, ms_bpf_map_info(refs[i])->name, at);
    check_reader(&tw[i]);
    /* the run did something: some map holds non-zero values */
    struct ms_bpf_map_shm h;
    memcpy(&h, tw[i].core_img, sizeof h);
    for (uint64_t j = h.value_off ? h.value_off : h.ring_data_off; j < h.total_size && !touched; j++)
      touched = tw[i].core_img[j] != 0;
  }
  /* a monitor without maps (a pure sched_hint) must have returned priorities */
  CHECKF(touched || ra->n || (n_maps == 0 && prio_seen), "%s: no map was written", path);
  free(ra);
  free(rb);
  for (int i = 0; i < n_maps; i++) twin_free(&tw[i]);
  ms_monitor_free(m);
}

static void test_monitors(int *n_mon, int *n_progs, long *n_runs) {
  const char *dir = getenv("MS_MONITORS");
  DIR *d = dir ? opendir(dir) : NULL;
  CHECKF(d, "MS_MONITORS (%s) is not a folder of built monitors", dir ? dir : "unset");
  if (!d) return;
  for (struct dirent *e; (e = readdir(d));) {
    size_t l = strlen(e->d_name);
    if (l < 7 || strcmp(e->d_name + l - 6, ".bpf.o")) continue;
    char path[1400];
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    test_monitor(path, n_progs, n_runs);
    (*n_mon)++;
  }
  closedir(d);
  CHECKF(*n_mon >= 9, "%d shipped monitors found", *n_mon);
}

/* ---- the core's own comparisons can fail ---------------------------------- */

static void test_can_fail(void) {
  /* a core run on a different mem gives a different r0 than the reference */
  struct ms_bpf_insn prog[] = {{.code = MS_BPF_LDX | MS_BPF_MEM | MS_BPF_B, .dst_reg = 0, .src_reg = 1},
                               {.code = MS_BPF_JMP | MS_BPF_EXIT}};
  uint8_t mem[1] = {42};
  struct msd_run in;
  msd_run_init(&in);
  in.insns = prog;
  in.n_insns = 2;
  in.mem = mem;
  in.mem_size = 1;
  struct msd_result r;
  CHECK(msd_bpf_run(&in, &r) == 0 && r.r0 == 42 && r.insns == 2);
  in.mem_size = 0; /* no region: the load must fault */
  CHECK(msd_bpf_run(&in, &r) == -EFAULT && r.err_insn == 0);
  in.n_insns = 1; /* falls off the end */
  in.mem_size = 1;
  CHECK(msd_bpf_run(&in, &r) == -EFAULT && r.err_insn == 1);
}

int main(void) {
  struct conf_counts c = {0};
  /* without the conformance suite the rest still runs (it needs nothing outside
   * the repo), and the test then reports itself skipped */
  if (test_conformance(&c) == 77) {
    SKIP_PART("conformance: no suite under $MS_SHARED");
  } else {
    printf("conformance: %d files, %d compared, %d skipped, %d decided before running\n", c.files, c.compared,
           c.skipped, c.decided_early);
    CHECKF(c.compared >= c.files - 3, "only %d of %d files compared", c.compared, c.files);
  }
  test_errors();
  test_map_ops(MS_BPF_MAP_HASH, 8, 16, 40);
  test_map_ops(MS_BPF_MAP_PERCPU_HASH, 5, 12, 40);
  test_map_ops(MS_BPF_MAP_ARRAY, 4, 24, 50);
  test_map_ops(MS_BPF_MAP_PERCPU_ARRAY, 4, 8, 50);
  test_ringbuf(0);
  test_ringbuf(1);
  int n_mon = 0, n_progs = 0;
  long n_runs = 0;
  test_monitors(&n_mon, &n_progs, &n_runs);
  printf("monitors: %d objects, %d programs, %ld runs compared\n", n_mon, n_progs, n_runs);
  test_can_fail();
  TEST_MAIN_END();
}
