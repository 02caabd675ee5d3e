/* SPDX-License-Identifier: MIT */
/* The names of a compiled plan, for queries compiled in the engine's own
 * process (run --query): the plan's schema JSON read back as a socket client
 * reads it. A file of its own so that the compiler alone (query.c, parse.c,
 * codegen.c) needs no plan: the query fuzzer links without one. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include "megascope/plan.h"
#include "query/query_impl.h"

struct ms_query_schema *ms_query_schema_of_plan(const struct ms_plan *p, struct ms_textbuf *log) {
  char *text = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  if (!f) return NULL;
  int rc = ms_plan_write_schema(p, f, 0);
  if (fclose(f) || rc) {
    ms_textbuf_printf(log, "cannot write the plan's schema\n");
    free(text);
    errno = EIO;
    return NULL;
  }
  struct ms_query_schema *s = ms_query_schema_parse(text, len, log);
  free(text);
  return s;
}

