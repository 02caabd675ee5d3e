/* SPDX-License-Identifier: MIT */
/* megascope base: error codes, the log callback, the engine clock.
 *
 * Errors: int functions return 0 or a negative errno; project-specific codes sit
 * above the errno range (MS_E_*) and ms_strerror() names both. Library code never
 * prints: it writes through the log callback the caller installs. */
#ifndef MEGASCOPE_BASE_H
#define MEGASCOPE_BASE_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum ms_err {
  MS_E_FIRST = 4096,
  MS_E_FORMAT = 4097,  /* malformed input (file, message, text) */
  MS_E_VERIFY = 4098,  /* a program was rejected by the verifier */
  MS_E_STALL = 4099,   /* the engine made no progress */
  MS_E_LIMIT = 4100,   /* a fixed capacity was exceeded */
  MS_E_STATE = 4101,   /* the call is not valid in the object's state */
  MS_E_UNSUPP = 4102,  /* a valid request this build does not support */
  MS_E_COUNT
};

/* Names an error code, negative or positive, errno or MS_E_*. */
const char *ms_strerror(int err);

enum ms_log_level {
  MS_LOG_ERROR = 0,
  MS_LOG_WARN = 1,
  MS_LOG_INFO = 2,
  MS_LOG_DEBUG = 3,
  MS_LOG_LEVEL_COUNT
};

/* The process-wide log sink. Without one, messages at WARN or worse go to stderr
 * (a library default a CLI replaces). The callback may be called from any thread. */
typedef void (*ms_log_fn)(void *user, enum ms_log_level level, const char *msg);
void ms_log_set(ms_log_fn fn, void *user, enum ms_log_level max_level);
void ms_logf(enum ms_log_level level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* A caller-given text buffer for diagnostics that point (verifier and loader
 * logs). Appends are truncated at size, never overflow; `truncated` says so. */
struct ms_textbuf {
  char *buf;
  size_t size;
  size_t len;
  int truncated;
};
void ms_textbuf_printf(struct ms_textbuf *tb, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* The engine clock: CLOCK_MONOTONIC in nanoseconds. */
uint64_t ms_now_ns(void);

/* A schema digest (FNV-1a, 64 bits, never 0) of names by id, ids without a
 * name left out: what a program compiled against a schema's class ids assumes
 * of the plan it attaches to (ms_plan_schema_digest, ms_query_schema_digest).
 * Here, under both: the plan's side and the query compiler's are one function.
 * One name into h (start from MS_SCHEMA_DIGEST_SEED, names in id order; an
 * empty or NULL name is left out). */
#define MS_SCHEMA_DIGEST_SEED 1469598103934665603ull
uint64_t ms_schema_digest_add(uint64_t h, size_t id, const char *name);
/* The digest of the last h: h, or 1 where it came out 0 (0 means "not relied on"). */
static inline uint64_t ms_schema_digest_end(uint64_t h) { return h ? h : 1; }

/* The vector paths the kernels may take on this CPU: 2 AVX-512 VNNI (and the
 * packed weight layouts it reads), 1 AVX2/FMA/F16C, 0 portable C. The
 * environment's MEGASCOPE_SIMD=avx2 or portable caps it, so one machine can
 * run what a CPU without AVX-512 (or x86) would; read once. */
enum { MS_CPU_PORTABLE = 0, MS_CPU_AVX2 = 1, MS_CPU_AVX512_VNNI = 2 };
int ms_cpu_level(void);

/* Memory streamed at every step (the packed weights) in transparent huge pages:
 * a mapping of bytes, zeroed and committed as it is touched, 2 MiB-aligned and
 * madvise(MADV_HUGEPAGE)d (the mode most distributions ship asks for that),
 * unless the environment's MEGASCOPE_NO_HUGEPAGES=1 keeps 4 KiB pages (to
 * compare). NULL when the address space is short. ms_huge_unmap takes the
 * same bytes. ms_huge_pages_wanted: whether they are asked for. */
#define MS_HUGE_PAGE ((size_t)2 << 20)  /* the x86-64 transparent huge page */
void *ms_huge_map(size_t bytes);
void ms_huge_unmap(void *p, size_t bytes);
int ms_huge_pages_wanted(void);

/* Always-on check for state corruption: reports file and line, then aborts. */
#define MS_ASSERT(cond)                                                  \
  do {                                                                   \
    if (__builtin_expect(!(cond), 0)) ms_assert_fail(#cond, __FILE__, __LINE__); \
  } while (0)
#ifdef __cplusplus
[[noreturn]] void ms_assert_fail(const char *what, const char *file, int line);
#else
_Noreturn void ms_assert_fail(const char *what, const char *file, int line);
#endif

#ifdef __cplusplus
}
#endif
#endif
