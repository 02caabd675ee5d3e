/* SPDX-License-Identifier: MIT */
/* Test helpers: a query compiled, attached to a running engine as a monitor,
 * and its answer read back as JSON, the way `megascope query` does it in the
 * process (tests/test_query.c, tests/test_hook_v2.c). */
#ifndef MS_TESTS_LIVE_QUERY_H
#define MS_TESTS_LIVE_QUERY_H

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>

#include "megascope/bpf.h"
#include "megascope/engine.h"
#include "megascope/attach.h"
#include "megascope/query.h"

struct live {
  struct ms_query *q;
  int id;
};

/* The engine's own schema (its plan's class and event class ids, as `run
 * --query` compiles against): a query compiled against another plan's is
 * refused at attach. */
static inline struct ms_query_schema *engine_schema(struct ms_engine *e) {
  return ms_query_schema_of_plan(ms_engine_plan(e, 1), NULL);
}

static int attach_query(struct ms_engine *e, const struct ms_query_schema *s, const char *src, int interpret,
                        uint32_t max_keys, struct live *out) {
  char log[8192] = "";
  struct ms_textbuf tb = {.buf = log, .size = sizeof log};
  struct ms_query_opts qo = {.sz = sizeof qo, .max_keys = max_keys};
  out->q = ms_query_compile(src, s, &qo, &tb);
  void *b = NULL;
  size_t n = 0;
  struct ms_monitor *mon = NULL;
  if (out->q && !ms_query_bundle(out->q, &b, &n)) mon = ms_monitor_open_mem(b, n, "query", &tb);
  free(b);
  struct ms_attach_opts ao = {.sz = sizeof ao, .interpret = (uint32_t)interpret};
  out->id = mon ? ms_engine_attach(e, mon, &ao, &tb) : -1;
  if (out->id < 0) {
    fprintf(stderr, "%s: %s\n", src, log);
    ms_monitor_free(mon);
  }
  return out->id;
}

/* The query's read-out as parsed JSON. */
static json_t *readout(struct ms_engine *e, const struct live *l) {
  struct ms_bpf_map *maps[MS_BPF_MAX_MAPS];
  struct ms_coverage cov;
  if (ms_engine_attach_maps(e, l->id, maps, MS_BPF_MAX_MAPS) != (int)ms_query_map_count(l->q) ||
      ms_engine_attach_coverage(e, l->id, 0, &cov))
    return NULL;
  struct ms_query_maps src;
  ms_query_maps_of_engine(&src, maps);
  char *text = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  struct ms_query_print po = {.sz = sizeof po, .as_json = 1, .final = 1};
  int rc = ms_query_write(l->q, &src, &cov, &po, f);
  fclose(f);
  json_t *j = rc ? NULL : json_loadb(text, len, 0, NULL);
  free(text);
  return j;
}

#endif
