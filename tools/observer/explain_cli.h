/* SPDX-License-Identifier: MIT */
/* megascope explain's parts inside the CLI: what cmd_explain.c gathers from
 * the live engine (the window's tables, the OS's view, the evidence) and
 * explain_report.c prints. The judgement itself is src/explain. */
#ifndef MS_TOOLS_EXPLAIN_CLI_H
#define MS_TOOLS_EXPLAIN_CLI_H

#include <jansson.h>
#include <stdint.h>

#include "megascope/explain.h"

#define EXPLAIN_MAX_EVIDENCE 4  /* culprits whose tasks are captured */
#define EXPLAIN_OS_SLICES 8     /* reads of the OS's view over the window */
#define EXPLAIN_MAX_OS_SLICES 32 /* ... and at most, when the window is stretched */
#define EXPLAIN_MIN_STEPS 32    /* steps a window needs: it is stretched (to 4x) until it has them */
#define EXPLAIN_MAX_BASELINES 8 /* --baseline files */

struct explain_args {
  const char *socket;
  uint64_t slo_ns, window_ns;   /* window: at least; stretched to 4x until EXPLAIN_MIN_STEPS */
  long evidence, slices;
  int as_json;
  const char *baseline[EXPLAIN_MAX_BASELINES];  /* earlier --json reports of healthy windows */
  int n_baseline;
};

/* One culprit's raw records, fetched after the summary (the escalation). */
struct explain_evidence {
  int culprit;                 /* index in the result's culprits */
  char query[512];             /* the capture's predicate and record */
  size_t n;                    /* records */
  uint64_t bytes, eligible, executed, lost;
  double p50_ns, p99_ns, max_ns, mean_wait_ns, mean_ctx;
  int workers[64], n_workers;
  int64_t later_gen;           /* a request's slot's newest generation seen (-1: none) */
  int ended;                   /* a request that ended before the capture: no record can come */
  json_t *first;               /* the first records, for the report (owned) */
};

struct explain_window {
  json_t *schema;              /* the engine's schema (owns the class names) */
  struct ms_explain_class *cls;
  int n_cls;
  struct ms_explain_cell *cells;
  size_t n_cells, cap_cells;
  struct ms_explain_share_cell *shares;  /* tensor parallel: each device's shares' tasks */
  size_t n_shares;
  struct ms_explain_request *req;
  int n_req;
  struct ms_explain_req_cell *req_cells;
  size_t n_req_cells;
  struct ms_explain_os *os;    /* [n_os][n_workers] */
  int n_os;                    /* OS slices read (EXPLAIN_OS_SLICES, more for a stretched window) */
  int *device;                 /* [n_workers] */
  int n_workers, slices;
  /* an engine across ranks (serve --tp): the workers of one rank; the
   * window's workers are every rank's, rank r's worker k numbered
   * r * rank_workers + k (0: one process, workers as the engine numbers them) */
  int rank_workers;
  double steps, window_ns;
  uint64_t summary_keys, summary_bytes, dropped;
  json_t *coverage;            /* the summary's (owned) */
  double tpot_ms;              /* of the requests finished in the window; 0: none */
  uint64_t finished;
  struct ms_explain_input in;
  struct ms_explain_result res;
  struct explain_evidence ev[EXPLAIN_MAX_EVIDENCE];
  int n_ev;
  uint64_t evidence_bytes;
  double *base, *base_noise;   /* [n_cls]: --baseline's class effects and noises (NAN: none) */
  int n_base;                  /* classes the baselines name */
};

void explain_report_text(const struct explain_args *a, const struct explain_window *w);
void explain_report_json(const struct explain_args *a, const struct explain_window *w);

#endif
