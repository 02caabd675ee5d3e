/* SPDX-License-Identifier: MIT */
/* explain's working state, shared by explain.c (the effects), requests.c (the
 * requests' effects) and culprits.c (which parts are named), each handed it as
 * a parameter. Private to src/explain/. */
#ifndef MS_EXPLAIN_STATE_H
#define MS_EXPLAIN_STATE_H

#include "megascope/explain.h"

#define EX_MAX_CPU 1024

struct ex {
  const struct ms_explain_input *in;
  struct ms_explain_result *out;
  int C, B, S, W, D;      /* classes, buckets seen, slices, workers, devices */
  int *buckets;           /* [B]: the bucket values seen */
  double *n, *s;          /* [C][B][S]: tasks and their time, over every worker */
  double *nd, *sd;        /* [C][B][S][D]: the same per device (D > 1) */
  int Wc;                 /* W, or 1 when the per-worker tables would be too large */
  double *nw, *sw, *mw;   /* [C][B][Wc][S]: per worker, what the class effects compare
                             (mw: the fastest task, 0: not known) */
  int **peer, *n_peer;    /* [C]: each class's peers */
  double center, sigma;   /* the class effects' median and peer scatter */
};
#define EX_ATW(x, c, b, w, s) \
  (((((size_t)(c)) * (size_t)(x)->B + (size_t)(b)) * (size_t)(x)->Wc + (size_t)(w)) * (size_t)(x)->S + (size_t)(s))
#define EX_AT(x, c, b, s) ((((size_t)(c)) * (size_t)(x)->B + (size_t)(b)) * (size_t)(x)->S + (size_t)(s))

/* What the OS said, per worker over the window. */
struct ex_cpu {
  int known[EX_MAX_CPU], pinned[EX_MAX_CPU], last[EX_MAX_CPU];
  double share[EX_MAX_CPU];     /* the median slice's run-queue wait over wall time */
  double noise[EX_MAX_CPU];     /* its scatter over slices (at least 1%) */
  double ran[EX_MAX_CPU];       /* the median slice's run time over wall time */
  double ran_noise[EX_MAX_CPU];
  double preempted[EX_MAX_CPU];
  double all;                   /* every worker's together */
};

/* The requests' line and scatters (request_effects). */
struct ex_req {
  double slope, intercept;      /* attention ns a task = intercept + slope x context */
  double noise;                 /* the residuals' scatter (log) */
  double ctx_center;            /* the contexts' median (log positions) */
  double t_center, t_noise;     /* the requests' attention loads' median and scatter (log) */
  double *time;                 /* [n_requests]: each one's attention in all a step against its
                                   batch's median (NAN: not judged) */
};

/* The device of worker (0 when the input names none). */
static inline int ex_device(const struct ex *x, int worker) {
  const struct ms_explain_input *in = x->in;
  if (!in->device || worker < 0 || worker >= in->n_workers || in->device[worker] < 0) return 0;
  return in->device[worker] < x->D ? in->device[worker] : 0;
}
/* requests.c: each request's effect into x->out->request, the line and
 * scatters into rq; with skip (NULL: none) and cells by worker, on the tasks
 * of the workers w with skip[w] == 0 alone. */
void ex_request_effects(struct ex *x, struct ex_req *rq, const unsigned char *skip);
/* culprits.c, in two turns. First the OS's view, devices and workers: named[w]
 * = 1 for each worker named; returns how many. Then layers, classes and
 * requests (judged again by the caller without the named workers), the order
 * and the confidence of "none". */
int ex_worker_culprits(struct ex *x, const struct ex_cpu *cpu, unsigned char *named);
void ex_part_culprits(struct ex *x, const struct ex_req *rq);

#endif
