/* SPDX-License-Identifier: MIT */
/* A compiled query attached to a running engine through its control socket,
 * as megascope query and megascope explain drive it: the attach (the bundle
 * through `attach`, with a budget), read-only readers over its maps (`maps`
 * with `fds`), its coverage (`list`), its read-out, the detach. */
#ifndef MS_TOOLS_QUERY_CLIENT_H
#define MS_TOOLS_QUERY_CLIENT_H

#include <stdint.h>
#include <stdio.h>

#include "megascope/monitor.h"
#include "megascope/query.h"
#include "opt.h" /* struct cli_budget */

struct live {
  int id;                     /* > 0 while attached */
  const struct ms_query *q;
  struct ms_bpf_map_reader **readers;
  size_t n_readers;           /* the query's maps x n_ranks */
  struct ms_query_maps src;
  int timeout_ms;             /* live_coverage's wait for the engine (0: 30 s) */
  /* an engine across ranks: readers holds n_ranks x the query's maps, rank
   * after rank, and src merges the ranks (ms_query_maps_of_union) */
  int n_ranks;
  struct ms_query_maps *rank_src;  /* [n_ranks] */
  struct ms_query_union u;
  struct ms_coverage *rank_cov;    /* [n_ranks] each rank's, as live_coverage last read them */
};

/* The engine's schema, for compiling (prints why and returns NULL). */
struct ms_query_schema *live_schema(const char *me, const char *sock);
/* Attaches q and opens its maps; 0, or -1 with the reason printed. */
int live_attach(struct live *l, const char *me, const char *sock, const struct ms_query *q, const char *name,
                const struct cli_budget *b);
int live_coverage(const struct live *l, const char *me, const char *sock, struct ms_coverage *out);
/* Records in l's ring buffers now (record() maps). */
size_t live_records(const struct live *l);
/* Detaches and closes the readers; nothing when l is not attached. */
void live_detach(struct live *l, const char *me, const char *sock);

/* Sleeps ns nanoseconds. */
void live_sleep_ns(uint64_t ns);
/* --slo tpot=DURATION, as query and explain take it: 0, or -1 with the reason printed. */
int live_parse_slo(const char *me, const char *arg, uint64_t *ns);
/* The engine's TPOT figures (stats): the sum in seconds and the count of the
 * requests they cover; a window is the difference of two reads. 0 or -1. */
int live_tpot(const char *me, const char *sock, double *sum_s, uint64_t *count);

/* One request/reply as JSON text built by the caller (cli_ctl_call, parsed). */
typedef struct json_t json_t;
json_t *live_call(const char *me, const char *sock, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

#endif
