/* SPDX-License-Identifier: MIT */
/* A tiny test harness: CHECK records a failure with file and line and goes on;
 * SKIP_PART says that a part could not run for lack of an input (a file, a
 * tool, a privilege); TEST_MAIN_END prints the closing line "N passed, M
 * failed" that ctest logs and exits 1 on a failure, else 77 (ctest's SKIP
 * code) when any part was skipped, so that a partial run never reads as a
 * pass. */
#ifndef MS_TEST_H
#define MS_TEST_H
#include <stdio.h>
#include <stdlib.h>

static int ms_test_passed, ms_test_failed, ms_test_skipped;

#define CHECK(cond)                                                          \
  do {                                                                       \
    if (cond) {                                                              \
      ms_test_passed++;                                                      \
    } else {                                                                 \
      ms_test_failed++;                                                      \
      fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
    }                                                                        \
  } while (0)

#define CHECKF(cond, ...)                                                    \
  do {                                                                       \
    if (cond) {                                                              \
      ms_test_passed++;                                                      \
    } else {                                                                 \
      ms_test_failed++;                                                      \
      fprintf(stderr, "%s:%d: check failed: %s: ", __FILE__, __LINE__, #cond); \
      fprintf(stderr, __VA_ARGS__);                                          \
      fputc('\n', stderr);                                                   \
    }                                                                        \
  } while (0)

/* A part of the test not run: printed as "SKIP: why" on stdout. */
#define SKIP_PART(...)                                                       \
  do {                                                                       \
    ms_test_skipped++;                                                       \
    printf("SKIP: ");                                                        \
    printf(__VA_ARGS__);                                                     \
    putchar('\n');                                                           \
  } while (0)

#define TEST_MAIN_END()                                                      \
  do {                                                                       \
    if (ms_test_skipped)                                                     \
      printf("%d passed, %d failed, %d skipped\n", ms_test_passed,           \
             ms_test_failed, ms_test_skipped);                               \
    else                                                                     \
      printf("%d passed, %d failed\n", ms_test_passed, ms_test_failed);      \
    return ms_test_failed ? 1 : ms_test_skipped ? 77 : 0;                    \
  } while (0)

/* The whole file at path, NUL-terminated (malloc'ed), its length in *len;
 * NULL (and *len 0) when it cannot be read. */
static inline char *ms_test_slurp(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  *len = 0;
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *buf = n >= 0 ? malloc((size_t)n + 1) : NULL;
  if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
    free(buf);
    buf = NULL;
  }
  fclose(f);
  if (!buf) return NULL;
  buf[n] = 0;
  *len = (size_t)n;
  return buf;
}

#endif
