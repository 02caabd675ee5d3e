/* SPDX-License-Identifier: MIT */
/* One question to several engines (replicas of one service behind a load
 * balancer, --socket given more than once): `query` attaches the compiled
 * program on every engine and prints one answer, merged (ms_query_maps_of_union),
 * with each engine's coverage beside the total; `stats` adds what the engines
 * count. An engine that cannot be reached, or stops answering in the window,
 * is named in the answer with what the total holds of it, never dropped
 * unsaid. */
#ifndef MS_TOOLS_REPLICAS_H
#define MS_TOOLS_REPLICAS_H

#include <signal.h>
#include <stdint.h>

#include "megascope/query.h"
#include "opt.h"

struct fleet;

/* The engines' schemas: every engine that answers must serve the same plan
 * (the same schema), else NULL with the difference named. Engines that cannot
 * be reached are kept, named; NULL when none can be. *schema: the plan's
 * names, parsed (free it). */
struct fleet *fleet_open(const char *me, const char *const *socks, int n, struct ms_query_schema **schema);
void fleet_free(struct fleet *f);

struct fleet_run {
  struct cli_budget budget;
  uint64_t for_ns, every_ns;  /* for_ns 0: until Ctrl-C (stop set) */
  int delta, as_json;
  uint32_t top;
  volatile sig_atomic_t *stop; /* set by the caller's signal handler */
};
/* Attaches q on every engine that answers (a refusal by one detaches the
 * others and ends it), prints the merged answer every every_ns and at the end,
 * detaches. The exit code: 0 when every engine answered to the end; 1 when one
 * refused, or could not be reached or stopped answering (the answer printed
 * names it). */
int fleet_query(struct fleet *f, const struct ms_query *q, const struct fleet_run *r);

/* `megascope stats` over several sockets: the exit code. */
int stats_replicas(const char *const *socks, int n, int as_json);

#endif
