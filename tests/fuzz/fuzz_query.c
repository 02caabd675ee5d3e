/* SPDX-License-Identifier: MIT */
/* libFuzzer target for the query language (src/query): any text either
 * compiles to programs the verifier accepts, through the same path as an
 * attach (the bundle read back by the loader, every program verified against
 * its hook), or is refused with a message that names its column. A compiled
 * program the verifier refuses is a compiler bug: the target aborts. The names
 * come from a tiny-moe schema compiled into the target (tests/fuzz/query/
 * schema.json, turned into a C string by scripts/fuzz_query.sh). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "megascope/monitor.h"
#include "megascope/query.h"

extern const char ms_fuzz_schema[];

static struct ms_query_schema *schema;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc, (void)argv;
  schema = ms_query_schema_parse(ms_fuzz_schema, strlen(ms_fuzz_schema), NULL);
  if (!schema) abort();
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *src = malloc(size + 1);
  if (!src) return 0;
  memcpy(src, data, size);
  src[size] = 0;
  char log[8192] = "";
  struct ms_textbuf tb = {.buf = log, .size = sizeof log};
  struct ms_query *q = ms_query_compile(src, schema, NULL, &tb);
  if (!q) {
    if (strncmp(log, "column ", 7)) { /* every refusal names its column */
      fprintf(stderr, "refused without a column: %s\n", log);
      abort();
    }
    free(src);
    return 0;
  }
  void *b = NULL;
  size_t n = 0;
  if (ms_query_bundle(q, &b, &n)) abort();
  tb.len = 0;
  log[0] = 0;
  struct ms_monitor *m = ms_monitor_open_mem(b, n, "fuzz", &tb);
  if (!m) {
    fprintf(stderr, "compiled but refused:\n%s\n---\n%s\n", src, log);
    abort();
  }
  ms_monitor_free(m);
  free(b);
  ms_query_free(q);
  free(src);
  return 0;
}
