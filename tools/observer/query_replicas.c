/* SPDX-License-Identifier: MIT */
/* megascope query over several engines (replicas.h): the same compiled
 * program attached on each, read through each engine's read-only map
 * descriptors, merged by ms_query_maps_of_union, printed once with every
 * engine's coverage beside the total.
 *
 * An engine is answering, gone or unreachable. Unreachable: it could not be
 * asked for its schema or could not take the attach (a connection failure,
 * not a refusal): named, not in the total. Gone: it stopped answering in the
 * window (it died, or its attachment was detached by another client): its
 * maps stay readable through the descriptors this process holds, so the total
 * keeps what it counted until then, with its coverage as last read. A
 * refusal (the verifier, a budget) by any engine ends the question before it
 * starts: the engines already attached are detached. */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "megascope/base.h"
#include "megascope/control.h"
#include "query_client.h"
#include "replicas.h"

/* How often every engine's coverage is read: what a gone engine's coverage
 * misses at most (its maps miss nothing). */
#define POLL_NS 250000000ull
/* How long an engine may take to answer the schema or a coverage read before
 * it counts as not answering (a hung engine must not hold up the others). */
#define ANSWER_MS 5000


struct replica {
  const char *sock;
  char me[600];                 /* "query (S)": what its messages are prefixed with */
  enum ms_query_replica_state state;
  char why[512];
  struct live l;
  struct ms_coverage cov;       /* as last read */
  struct ms_coverage printed;   /* at the last print (--delta) */
  int has_cov;
  double cov_at;                /* when cov was read, s since the start */
  int hung;                     /* gone by not answering in time: it may run on, attached */
};

struct fleet {
  const char *me;
  struct replica *r;
  int n;
  uint64_t t0;
};

void fleet_free(struct fleet *f) {
  if (!f) return;
  for (int i = 0; i < f->n; i++) {
    struct replica *r = &f->r[i];
    if (r->state != MS_QUERY_REPLICA_ANSWERING) r->l.id = 0; /* nothing to ask the engine: free the readers */
    live_detach(&r->l, r->me, r->sock);
  }
  free(f->r);
  free(f);
}

static void unreachable(struct replica *r, const char *why) {
  r->state = MS_QUERY_REPLICA_UNREACHABLE;
  snprintf(r->why, sizeof r->why, "%s", why && why[0] ? why : "no answer");
}

/* The schema as text a plan is compared by; NULL when the engine did not
 * answer (marked) or refused (*refused set). */
static char *schema_text(struct replica *r, int *refused) {
  static const char req[] = "{\"cmd\":\"schema\"}";
  json_t *rep = cli_ctl_call(r->me, r->sock, req, strlen(req), ANSWER_MS, NULL, NULL);
  if (!rep) {
    int answered;
    const char *why = cli_ctl_last_error(&answered);
    if (answered) *refused = 1;
    else unreachable(r, why);
    return NULL;
  }
  char *text = json_dumps(json_object_get(rep, "schema"), JSON_COMPACT | JSON_SORT_KEYS);
  json_decref(rep);
  r->state = MS_QUERY_REPLICA_ANSWERING;
  return text;
}

struct fleet *fleet_open(const char *me, const char *const *socks, int n, struct ms_query_schema **schema) {
  struct fleet *f = calloc(1, sizeof *f);
  if (!f || !(f->r = calloc((size_t)n, sizeof *f->r))) {
    free(f);
    return NULL;
  }
  f->me = me;
  f->n = n;
  char *first = NULL;
  int ok = 1, first_i = -1;
  for (int i = 0; i < n && ok; i++) {
    struct replica *r = &f->r[i];
    r->sock = socks[i];
    r->state = MS_QUERY_REPLICA_UNREACHABLE; /* until it answers */
    snprintf(r->me, sizeof r->me, "%s (%s)", me, socks[i]);
    for (int k = 0; k < i; k++)
      if (!strcmp(socks[k], socks[i])) {
        fprintf(stderr, "megascope %s: --socket %s is given twice (its answer would count twice)\n", me, socks[i]);
        ok = 0;
      }
    int refused = 0;
    char *text = ok ? schema_text(r, &refused) : NULL;
    if (refused) ok = 0;
    if (!text) continue;
    if (!first) {
      first = text, first_i = i;
      continue;
    }
    if (strcmp(first, text)) {
      fprintf(stderr,
              "megascope %s: %s serves another plan than %s (their schemas differ): replicas asked one question\n"
              "  must serve the same model with the same options\n", me, socks[i], socks[first_i]);
      ok = 0;
    }
    free(text);
  }
  if (ok && !first) fprintf(stderr, "megascope %s: none of the %d engines could be reached\n", me, n);
  char lb[1024] = "";
  struct ms_textbuf log = {.buf = lb, .size = sizeof lb};
  if (ok && first && !(*schema = ms_query_schema_parse(first, strlen(first), &log))) {
    fprintf(stderr, "megascope %s: the engines' schema: %s", me, lb);
    ok = 0;
  }
  free(first);
  if (ok && first_i >= 0) return f;
  fleet_free(f);
  return NULL;
}

/* ---- the window ---- */

static double since_start(const struct fleet *f) { return (double)(ms_now_ns() - f->t0) / 1e9; }

/* Reads r's coverage; an engine that does not answer, or no longer lists the
 * attachment, is gone from here on. */
static void read_coverage(struct fleet *f, struct replica *r) {
  if (r->state != MS_QUERY_REPLICA_ANSWERING) return;
  struct ms_coverage c;
  if (!live_coverage(&r->l, r->me, r->sock, &c)) {
    r->cov = c;
    r->has_cov = 1;
    r->cov_at = since_start(f);
    return;
  }
  const char *why = cli_ctl_last_error(NULL);
  r->state = MS_QUERY_REPLICA_GONE;
  r->hung = strstr(why, "timed out") != NULL;
  snprintf(r->why, sizeof r->why, "stopped answering at %.2f s: %s; coverage as read at %.2f s", since_start(f),
           why[0] ? why : "its attachment is no longer listed (detached by another client)", r->cov_at);
  fprintf(stderr, "megascope %s: %s %s; the answer keeps its maps as it left them\n", f->me, r->sock, r->why);
}

static int answering(const struct fleet *f) {
  int n = 0;
  for (int i = 0; i < f->n; i++) n += f->r[i].state == MS_QUERY_REPLICA_ANSWERING;
  return n;
}

static struct ms_coverage cov_minus(struct ms_coverage a, const struct ms_coverage *b) {
  a.eligible -= b->eligible, a.executed -= b->executed, a.throttled -= b->throttled;
  a.lost -= b->lost, a.failed -= b->failed;
  a.first_step = b->last_step ? b->last_step : a.first_step;
  return a;
}

struct printer {
  const struct fleet_run *run;
  struct ms_query_snapshot *last;   /* --delta: the previous print's maps */
  struct ms_coverage last_total;
};

static int print(struct fleet *f, const struct ms_query *q, struct printer *p, int final) {
  struct ms_query_maps *srcs = calloc((size_t)f->n, sizeof *srcs);
  struct ms_query_replica *reps = calloc((size_t)f->n, sizeof *reps);
  int rc = -ENOMEM;
  if (!srcs || !reps) goto out;
  int interval = p->run->delta && !final;
  struct ms_coverage total = {0};
  for (int i = 0; i < f->n; i++) {
    struct replica *r = &f->r[i];
    read_coverage(f, r);
    int in = r->state != MS_QUERY_REPLICA_UNREACHABLE && r->l.readers;
    if (in) srcs[i] = r->l.src;
    if (in && r->has_cov) ms_query_coverage_add(&total, &r->cov);
    reps[i] = (struct ms_query_replica){.name = r->sock, .state = r->state,
                                        .why = r->why[0] ? r->why : NULL, .id = r->l.id, .in_total = in,
                                        .has_cov = r->has_cov, .cov = r->cov};
    if (interval && p->last) reps[i].cov = cov_minus(r->cov, &r->printed);
  }
  struct ms_query_union u = {.q = q, .srcs = srcs, .n = (size_t)f->n};
  struct ms_query_maps src;
  ms_query_maps_of_union(&src, &u);
  struct ms_query_snapshot *now = NULL;
  struct ms_query_print po = {.sz = sizeof po, .top = p->run->top, .as_json = p->run->as_json, .final = final,
                              .part = "summary", .elapsed_s = since_start(f), .replicas = reps,
                              .n_replicas = (size_t)f->n};
  if (interval) po.take = &now;
  if (interval && p->last) {
    po.since = p->last;
    po.since_cov = &p->last_total;
  }
  rc = ms_query_write(q, &src, &total, &po, stdout);
  if (interval) {
    ms_query_snapshot_free(p->last);
    p->last = now;
    p->last_total = total;
    for (int i = 0; i < f->n; i++) f->r[i].printed = f->r[i].cov;
  }
out:
  free(srcs);
  free(reps);
  return rc;
}

/* ---- attach, watch, detach ---- */

static int attach_all(struct fleet *f, const struct ms_query *q, const struct fleet_run *run) {
  for (int i = 0; i < f->n; i++) {
    struct replica *r = &f->r[i];
    if (r->state != MS_QUERY_REPLICA_ANSWERING) continue;
    if (!live_attach(&r->l, r->me, r->sock, q, "query", &run->budget)) {
      r->l.timeout_ms = ANSWER_MS;
      continue;
    }
    int answered;
    const char *why = cli_ctl_last_error(&answered);
    if (!answered && why[0]) { /* it could not be reached: the others answer without it */
      unreachable(r, why);
      continue;
    }
    fprintf(stderr, "megascope %s: %s refused the query; the others are detached: nothing is left attached\n",
            f->me, r->sock);
    for (int k = 0; k < f->n; k++)
      if (f->r[k].state == MS_QUERY_REPLICA_ANSWERING) live_detach(&f->r[k].l, f->r[k].me, f->r[k].sock);
    return -1;
  }
  for (int i = 0; i < f->n; i++)
    if (f->r[i].state == MS_QUERY_REPLICA_UNREACHABLE)
      fprintf(stderr, "megascope %s: %s is unreachable (%s): the answer names it and leaves it out\n", f->me,
              f->r[i].sock, f->r[i].why);
  if (answering(f)) return 0;
  fprintf(stderr, "megascope %s: none of the %d engines took the query\n", f->me, f->n);
  return -1;
}

int fleet_query(struct fleet *f, const struct ms_query *q, const struct fleet_run *run) {
  if (attach_all(f, q, run)) return 1;
  if (!run->as_json) {
    fprintf(stderr, "megascope %s: attached on %d of %d engines (", f->me, answering(f), f->n);
    for (int i = 0, k = 0; i < f->n; i++)
      if (f->r[i].state == MS_QUERY_REPLICA_ANSWERING)
        fprintf(stderr, "%s%s: %d", k++ ? ", " : "", f->r[i].sock, f->r[i].l.id);
    fprintf(stderr, "); %s%s\n",
            run->every_ns ? (run->delta ? "printing each interval's change, " : "printing every interval, ") : "",
            run->for_ns ? "and at the end" : "Ctrl-C to stop");
  }
  struct printer p = {.run = run};
  f->t0 = ms_now_ns();
  uint64_t next_print = run->every_ns ? f->t0 + run->every_ns : UINT64_MAX;
  uint64_t end = run->for_ns ? f->t0 + run->for_ns : UINT64_MAX, next_alive = f->t0;
  int rc = 0;
  while (!*run->stop) {
    uint64_t now = ms_now_ns();
    if (now >= next_alive) {
      for (int i = 0; i < f->n; i++) read_coverage(f, &f->r[i]);
      next_alive = now + POLL_NS;
      if (!answering(f)) {
        fprintf(stderr, "megascope %s: no engine answers any more\n", f->me);
        break;
      }
    }
    if (now >= end) break;
    if (now >= next_print) {
      if (!run->as_json) printf("--- %.1f s\n", (double)(now - f->t0) / 1e9);
      if (print(f, q, &p, 0)) rc = 1;
      next_print += run->every_ns;
    }
    uint64_t wake = next_print < end ? next_print : end, nap = 20000000ull;
    if (wake > now && wake - now < nap) nap = wake - now;
    live_sleep_ns(nap);
  }
  if (!run->as_json && run->every_ns) printf("--- end, %.1f s\n", since_start(f));
  if (print(f, q, &p, 1)) rc = 1;
  ms_query_snapshot_free(p.last);
  for (int i = 0; i < f->n; i++)
    if (f->r[i].state != MS_QUERY_REPLICA_ANSWERING) rc = 1;
  for (int i = 0; i < f->n; i++)
    if (f->r[i].state == MS_QUERY_REPLICA_ANSWERING) live_detach(&f->r[i].l, f->r[i].me, f->r[i].sock);
    else if (f->r[i].hung)
      fprintf(stderr, "megascope %s: %s may still hold attachment %d (it did not answer): `megascope detach "
              "--socket %s %d` once it answers\n", f->me, f->r[i].sock, f->r[i].l.id, f->r[i].sock, f->r[i].l.id);
  return rc;
}
