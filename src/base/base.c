/* SPDX-License-Identifier: MIT */
/* Error names, the log sink, the text buffer and the engine clock. */
#include "megascope/base.h"

#include <stdatomic.h>
#if defined(__x86_64__)
#include <cpuid.h>
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

static const char *const ms_err_names[] = {
    [MS_E_FORMAT - MS_E_FIRST] = "malformed input",
    [MS_E_VERIFY - MS_E_FIRST] = "program rejected by the verifier",
    [MS_E_STALL - MS_E_FIRST] = "engine stalled",
    [MS_E_LIMIT - MS_E_FIRST] = "capacity exceeded",
    [MS_E_STATE - MS_E_FIRST] = "invalid in the current state",
    [MS_E_UNSUPP - MS_E_FIRST] = "not supported",
};

const char *ms_strerror(int err) {
  if (err < 0) err = -err;
  if (err > MS_E_FIRST && err < MS_E_COUNT) return ms_err_names[err - MS_E_FIRST];
  return strerror(err);
}

/* The sink can be changed while engine threads log: each part is an atomic, read
 * relaxed (a message racing with a change may reach either sink). */
static _Atomic(ms_log_fn) log_fn;
static _Atomic(void *) log_user;
static _Atomic int log_max = MS_LOG_WARN;

void ms_log_set(ms_log_fn fn, void *user, enum ms_log_level max_level) {
  atomic_store_explicit(&log_user, user, memory_order_relaxed);
  atomic_store_explicit(&log_fn, fn, memory_order_release);
  atomic_store_explicit(&log_max, (int)max_level, memory_order_relaxed);
}

void ms_logf(enum ms_log_level level, const char *fmt, ...) {
  if ((int)level > atomic_load_explicit(&log_max, memory_order_relaxed)) return;
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  ms_log_fn fn = atomic_load_explicit(&log_fn, memory_order_acquire);
  if (fn)
    fn(atomic_load_explicit(&log_user, memory_order_relaxed), level, msg);
  else
    fprintf(stderr, "megascope: %s\n", msg);
}

void ms_textbuf_printf(struct ms_textbuf *tb, const char *fmt, ...) {
  if (!tb || !tb->buf || tb->size == 0) return;
  if (tb->len >= tb->size - 1) {
    tb->truncated = 1;
    return;
  }
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(tb->buf + tb->len, tb->size - tb->len, fmt, ap);
  va_end(ap);
  if (n < 0) return;
  if ((size_t)n >= tb->size - tb->len) {
    tb->len = tb->size - 1;
    tb->truncated = 1;
  } else {
    tb->len += (size_t)n;
  }
}

uint64_t ms_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint64_t fnv(uint64_t h, const char *s) {
  for (; *s; s++) h = (h ^ (uint8_t)*s) * 1099511628211ull;
  return h;
}

uint64_t ms_schema_digest_add(uint64_t h, size_t id, const char *name) {
  if (!name || !name[0]) return h;
  char head[24];
  snprintf(head, sizeof head, "%zu ", id);
  return fnv(fnv(fnv(h, head), name), "\n");
}

#if defined(__x86_64__)
/* F16C by CPUID (leaf 1, ECX): clang before 15 has no "f16c" for __builtin_cpu_supports, and the
 * fuzz scripts build this file with clang */
static int has_f16c(void) {
  unsigned a, b, c, d;
  return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
}
#endif

static int cpu_level_here(void) {
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma") || !has_f16c())
    return MS_CPU_PORTABLE;
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                 __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni")
             ? MS_CPU_AVX512_VNNI
             : MS_CPU_AVX2;
#else
  return MS_CPU_PORTABLE;
#endif
}

int ms_cpu_level(void) {
  static _Atomic int level = -1;  /* two first callers compute the same */
  int v = atomic_load_explicit(&level, memory_order_relaxed);
  if (v < 0) {
    int l = cpu_level_here();
    const char *cap = getenv("MEGASCOPE_SIMD");
    if (cap && !strcmp(cap, "avx2") && l > MS_CPU_AVX2) l = MS_CPU_AVX2;
    else if (cap && !strcmp(cap, "portable")) l = MS_CPU_PORTABLE;
    else if (cap && *cap && strcmp(cap, "native") && strcmp(cap, "avx2"))
      fprintf(stderr, "megascope: MEGASCOPE_SIMD=%s is not native, avx2 or portable; ignored\n", cap);
    atomic_store_explicit(&level, l, memory_order_relaxed);
    v = l;
  }
  return v;
}

void ms_assert_fail(const char *what, const char *file, int line) {
  fprintf(stderr, "megascope: assertion failed: %s at %s:%d\n", what, file, line);
  abort();
}

/* ---- huge pages ---- */

int ms_huge_pages_wanted(void) {
  const char *no = getenv("MEGASCOPE_NO_HUGEPAGES");
  return !(no && *no && strcmp(no, "0"));
}

/* Mapped 2 MiB more than asked and trimmed to a 2 MiB boundary, so that every
 * whole 2 MiB of it can be one huge page. */
void *ms_huge_map(size_t bytes) {
  if (!bytes) return NULL;
  size_t len = (bytes + MS_HUGE_PAGE - 1) & ~(MS_HUGE_PAGE - 1);
  uint8_t *m = mmap(NULL, len + MS_HUGE_PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) return NULL;
  uint8_t *p = (uint8_t *)(((uintptr_t)m + MS_HUGE_PAGE - 1) & ~(uintptr_t)(MS_HUGE_PAGE - 1));
  if (p > m) munmap(m, (size_t)(p - m));
  if (m + MS_HUGE_PAGE > p) munmap(p + len, (size_t)(m + MS_HUGE_PAGE - p));
  if (ms_huge_pages_wanted()) (void)madvise(p, len, MADV_HUGEPAGE);  /* a hint: without THP they stay small */
  return p;
}

void ms_huge_unmap(void *p, size_t bytes) {
  if (p) munmap(p, (bytes + MS_HUGE_PAGE - 1) & ~(MS_HUGE_PAGE - 1));
}
