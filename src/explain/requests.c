/* SPDX-License-Identifier: MIT */
/* explain's requests: each request's attention against the other requests of
 * its batch, given their contexts.
 *
 * A request lives a few dozen steps, so a mean over its life is the machine's
 * load during those steps as much as the request. So the tables hold a cell
 * per (request, step), and:
 *   1. a robust line through the cells' (context, time) points (Theil-Sen:
 *      the median of the slopes between cells of one step, at least 0);
 *   2. each cell's log ratio to the line, less its step's pace (the median
 *      ratio of every cell of that step): what the step did to all of them;
 *   3. each request's effect: the weighted median of its cells' residuals,
 *      held against their scatter among the window's requests.
 * A long context is not slow: the line predicts it. It stands out in its
 * pace-corrected time against the other requests', which culprits.c reads.
 * A cell's time is its fastest task when known (a task preempted by another
 * thread moves a mean by milliseconds). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "explain/state.h"
#include "explain/stats.h"

#define MAX_FIT 2000   /* cells the line is fitted on (an even stride through them) */
#define MAX_PAIRS 200  /* each cell's slopes to the next 200 at most */
#define MIN_STEP_PAIRS 30  /* pairs within steps that fit the slope alone */
#define MIN_CUT_STEPS 8    /* steps of a request the window's edge cut before it is judged (below) */

/* The cells judged: the input's, or one a request from its sums. */
struct cells {
  struct ms_explain_req_cell *c;
  size_t n;
  double *line, *resid;  /* [n]: the line's time for the cell's context; its residual */
  double *load;          /* [n]: log of its attention time in all, less its step's median */
  size_t *by_step;       /* [n]: the cells' indices in step (slice) order */
};

static double cell_time(const struct ms_explain_req_cell *c) {
  return c->min_ns > 0 ? c->min_ns : c->n > 0 ? c->sum_ns / c->n : 0;
}

static int by_request_slice(const void *a, const void *b) {
  const struct ms_explain_req_cell *x = a, *y = b;
  if (x->request != y->request) return x->request < y->request ? -1 : 1;
  return (x->slice > y->slice) - (x->slice < y->slice);
}

/* Cells by worker: those of the workers not skipped, one a (request, slice)
 * (their tasks and time summed, the fastest of them, the least context). */
static void merge_workers(struct cells *cs) {
  size_t k = 0;
  qsort(cs->c, cs->n, sizeof *cs->c, by_request_slice);
  for (size_t j = 0; j < cs->n; j++) {
    struct ms_explain_req_cell *m = k ? &cs->c[k - 1] : NULL, *c = &cs->c[j];
    if (!m || by_request_slice(m, c)) {
      cs->c[k++] = *c;
      continue;
    }
    m->n += c->n, m->sum_ns += c->sum_ns;
    m->ctx = c->ctx < m->ctx ? c->ctx : m->ctx;
    if (c->min_ns > 0 && (m->min_ns <= 0 || c->min_ns < m->min_ns)) m->min_ns = c->min_ns;
  }
  cs->n = k;
}

static int by_slice(const void *a, const void *b, void *u) {
  const struct ms_explain_req_cell *c = u;
  int x = c[*(const size_t *)a].slice, y = c[*(const size_t *)b].slice;
  return (x > y) - (x < y);
}

static int make_cells(const struct ms_explain_input *in, const unsigned char *skip, int W, struct cells *cs) {
  size_t n = in->req_cells ? in->n_req_cells : (size_t)in->n_requests;
  int by_worker = in->req_cells && in->req_cells_by_worker;
  cs->c = calloc(n + 1, sizeof *cs->c);
  cs->line = calloc(n + 1, sizeof *cs->line);
  cs->resid = calloc(n + 1, sizeof *cs->resid);
  cs->load = calloc(n + 1, sizeof *cs->load);
  cs->by_step = calloc(n + 1, sizeof *cs->by_step);
  if (!cs->c || !cs->line || !cs->resid || !cs->load || !cs->by_step) return -1;
  for (size_t j = 0; j < n; j++) {
    struct ms_explain_req_cell c;
    if (in->req_cells) {
      c = in->req_cells[j];
    } else {
      const struct ms_explain_request *r = &in->requests[j];
      c = (struct ms_explain_req_cell){.request = (int)j, .slice = 0, .n = r->n, .sum_ns = r->sum_ns,
                                       .ctx = r->n > 0 ? r->ctx_sum / r->n : 0};
    }
    if (by_worker && skip && c.worker >= 0 && c.worker < W && skip[c.worker]) continue;
    if (c.request >= 0 && c.request < in->n_requests && c.n > 0 && cell_time(&c) > 0) cs->c[cs->n++] = c;
  }
  if (by_worker) merge_workers(cs);
  /* the slopes and the steps' paces read the cells step by step */
  for (size_t j = 0; j < cs->n; j++) cs->by_step[j] = j;
  qsort_r(cs->by_step, cs->n, sizeof *cs->by_step, by_slice, cs->c);
  return 0;
}

/* Slopes between the cells of one step: they share its pace, where pairs of
 * cells steps apart (most of them one request's, its context a step longer
 * each step) carry the load's drift between those steps. At most cap. */
static size_t step_slopes(const struct cells *cs, double *out, size_t cap) {
  const size_t *ord = cs->by_step;
  size_t np = 0;
  for (size_t a = 0, b; a < cs->n; a = b) {
    for (b = a; b < cs->n && cs->c[ord[b]].slice == cs->c[ord[a]].slice; b++) {}
    for (size_t i = a; i < b; i++)
      for (size_t j = i + 1; j < b && np < cap; j++) {
        const struct ms_explain_req_cell *x = &cs->c[ord[i]], *y = &cs->c[ord[j]];
        double dc = y->ctx - x->ctx;
        if (fabs(dc) >= 1) out[np++] = (cell_time(y) - cell_time(x)) / dc;
      }
  }
  return np;
}

/* The line through the cells' (context, time): slope and intercept into rq.
 * The slope from pairs within a step; with too few (one request a step), from
 * pairs across the window. */
static void fit_line(struct ex_req *rq, const struct cells *cs, double *scratch) {
  size_t stride = cs->n > MAX_FIT ? (cs->n + MAX_FIT - 1) / MAX_FIT : 1, k = 0;
  double tmin = INFINITY;
  size_t np = step_slopes(cs, scratch, (size_t)MAX_FIT * MAX_PAIRS);
  if (np < MIN_STEP_PAIRS) {
    np = 0;
    for (size_t i = 0; i < cs->n; i += stride)
      for (size_t j = i + stride, m = 0; j < cs->n && m < MAX_PAIRS; j += stride, m++) {
        double dc = cs->c[j].ctx - cs->c[i].ctx;
        if (fabs(dc) >= 1) scratch[np++] = (cell_time(&cs->c[j]) - cell_time(&cs->c[i])) / dc;
      }
  }
  double slope = np ? ex_median(scratch, np) : 0;
  rq->slope = slope > 0 ? slope : 0;
  for (size_t i = 0; i < cs->n; i += stride) {
    double t = cell_time(&cs->c[i]);
    scratch[k++] = t - rq->slope * cs->c[i].ctx;
    tmin = t < tmin ? t : tmin;
  }
  double icpt = ex_median(scratch, k);
  /* a line through the short contexts can cross zero: keep it positive */
  rq->intercept = icpt > 0.1 * tmin ? icpt : 0.1 * tmin;
}

/* Each cell's residual: its log ratio to the line less its step's pace (the
 * median of its step's cells; 0 for a step of one request). */
static int residuals(struct cells *cs, const struct ex_req *rq) {
  const size_t *ord = cs->by_step;
  double *v = malloc((cs->n + 1) * sizeof *v);
  if (!v) return -1;
  for (size_t j = 0; j < cs->n; j++) {
    cs->line[j] = rq->intercept + rq->slope * cs->c[j].ctx;
    cs->resid[j] = log(cell_time(&cs->c[j]) / cs->line[j]);
    cs->load[j] = log(cs->c[j].sum_ns > 0 ? cs->c[j].sum_ns : 1);
  }
  for (size_t a = 0, b; a < cs->n; a = b) {
    size_t k = 0;
    int requests = 0, first = cs->c[ord[a]].request;
    for (b = a; b < cs->n && cs->c[ord[b]].slice == cs->c[ord[a]].slice; b++) {
      v[k++] = cs->resid[ord[b]];
      requests += cs->c[ord[b]].request != first;
    }
    if (!requests) continue;  /* one request alone: no batch to hold it against */
    double pace = ex_median(v, k);
    for (size_t j = a; j < b; j++) cs->resid[ord[j]] -= pace;
    k = 0;
    for (size_t j = a; j < b; j++) v[k++] = cs->load[ord[j]];
    double load = ex_median(v, k);
    for (size_t j = a; j < b; j++) cs->load[ord[j]] -= load;
  }
  free(v);
  return 0;
}

/* Request i's weighted median over its cells of the residual (what = 0), the
 * paced log time (1), the context (2) or its attention in all against its
 * step's requests' (3); NAN without cells. */
static double of_request(const struct cells *cs, int i, int what, struct ex_vw *v) {
  size_t k = 0;
  for (size_t j = 0; j < cs->n; j++) {
    if (cs->c[j].request != i) continue;
    double pace = log(cell_time(&cs->c[j]) / cs->line[j]) - cs->resid[j];
    double x = what == 0 ? cs->resid[j] : what == 1 ? log(cell_time(&cs->c[j])) - pace : what == 2 ? cs->c[j].ctx : cs->load[j];
    v[k++] = (struct ex_vw){x, cs->c[j].n};
  }
  return ex_wmedian(v, k);
}

/* A request's place in its step: an engine that lays the batch's rows out in
 * slot order makes a row's place in the workers' static task order the
 * slot's (megascope's did: Gemma-3's attention ran 1.25x the context line at
 * slot 0 down to 0.78x at slot 7, SmolLM2's 1.10x to 0.93x; it now starts
 * the rows at another slot each step, runtime/step.c, and the trend left is
 * near 0). So the requests' residuals lose their robust trend against the
 * slot (Theil-Sen: the median of the pairwise slopes, which one slow slot
 * does not move) before a request is held against the others. e[k] in place. */
static void place_trend(const struct ms_explain_input *in, const int *idx, double *e, int k, double *scratch,
                        size_t cap) {
  size_t np = 0;
  for (int a = 0; a < k; a++)
    for (int b = a + 1; b < k && np < cap; b++) {
      double ds = (double)in->requests[idx[b]].slot - (double)in->requests[idx[a]].slot;
      if (ds != 0) scratch[np++] = (e[b] - e[a]) / ds;
    }
  if (np < 3) return;
  double slope = ex_median(scratch, np);
  for (int a = 0; a < k; a++) e[a] -= slope * (double)in->requests[idx[a]].slot;
}

/* The scatter of one cell's residual about its request's median, pooled over
 * the judged requests (a median absolute deviation: a few wild cells move it
 * little). e[a] is request idx[a]'s median before the place trend. */
static double cell_scatter(const struct cells *cs, const int *idx, const double *e, int k, int n, double *scratch) {
  int *pos = malloc(((size_t)n + 1) * sizeof *pos);
  if (!pos) return 0;
  for (int i = 0; i < n; i++) pos[i] = -1;
  for (int a = 0; a < k; a++) pos[idx[a]] = a;
  size_t m = 0;
  for (size_t j = 0; j < cs->n; j++) {
    int a = pos[cs->c[j].request];
    if (a >= 0) scratch[m++] = cs->resid[j] - e[a];
  }
  free(pos);
  return m >= 3 ? ex_mad_sd(scratch, m, 0) : 0;
}

/* Request a's noise: the requests' scatter, more for one that lived fewer
 * steps than the typical request. The scatter among requests holds the
 * error of a median of a typical request's cells; one of fewer cells errs
 * more (the median of c cells, 1.25 s / sqrt(c)). On 2,000 requests of
 * healthy and faulted live windows, those with under a quarter of the
 * median request's tasks stood |z| 1.5 at the median and 11 at most, the
 * others 0.6 and 4.4: a healthy SmolLM2 run named one at z 7.6. */
static double request_noise(double sd, double s, int cells, int typical) {
  double se = 1.2533 * s / sqrt(cells > 0 ? cells : 1), se_typ = 1.2533 * s / sqrt(typical > 0 ? typical : 1);
  double extra = se * se - se_typ * se_typ;
  return extra > 0 ? sqrt(sd * sd + extra) : sd;
}

void ex_request_effects(struct ex *x, struct ex_req *rq, const unsigned char *skip) {
  const struct ms_explain_input *in = x->in;
  int n = in->n_requests, k = 0;
  rq->slope = 0, rq->intercept = 0, rq->noise = rq->t_noise = 0.01, rq->ctx_center = rq->t_center = 0;
  struct cells cs = {0};
  double *e = malloc(((size_t)n + 1) * sizeof *e), *lt = malloc(((size_t)n + 1) * sizeof *lt);
  double *ctx = malloc(((size_t)n + 1) * sizeof *ctx);
  int *idx = malloc(((size_t)n + 1) * sizeof *idx);
  struct ex_vw *v = NULL;
  double *scratch = NULL;
  for (int i = 0; i < n; i++) x->out->request[i] = (struct ms_explain_effect){.z = NAN, .effect = NAN, .noise = NAN};
  for (int i = 0; rq->time && i < n; i++) rq->time[i] = NAN;
  if (!e || !lt || !ctx || !idx || !rq->time || make_cells(in, skip, x->W, &cs)) goto out;
  scratch = malloc((MAX_FIT * (MAX_PAIRS + 1) + cs.n + (size_t)n + 1) * sizeof *scratch);
  v = malloc((cs.n + 1) * sizeof *v);
  if (!scratch || !v || cs.n < 3) goto out;
  fit_line(rq, &cs, scratch);
  if (residuals(&cs, rq)) goto out;
  /* a request needs a few steps for its time to mean anything */
  int *steps = calloc((size_t)n + 1, sizeof *steps), *cells = malloc(((size_t)n + 1) * sizeof *cells);
  int *cut = calloc((size_t)n + 1, sizeof *cut);  /* a request the window's first or last step holds */
  if (!steps || !cells || !cut) {
    free(steps);
    free(cells);
    free(cut);
    goto out;
  }
  /* a request the window cut needs more: its first and last steps run apart from
   * its middle (eight healthy SmolLM2 windows, 885 cells each way: its last
   * steps 1.06x the line, its first three 0.91x, the prompt's KV just
   * written), so a few steps at an edge of the window say which end of its
   * life was seen, not how fast it is (held-out 24: two requests seen in
   * their last 3-5 steps, 1.30x at z 8-9, on a healthy run) */
  int s_lo = cs.c[cs.by_step[0]].slice, s_hi = cs.c[cs.by_step[cs.n - 1]].slice;  /* the window's edges */
  for (size_t j = 0; j < cs.n; j++) {
    steps[cs.c[j].request]++;
    cut[cs.c[j].request] |= cs.c[j].slice == s_lo || cs.c[j].slice == s_hi;
  }
  for (int i = 0; i < n; i++) {
    if (steps[i] < (cut[i] ? MIN_CUT_STEPS : 3)) continue;
    e[k] = of_request(&cs, i, 0, v);
    /* the attention it adds to its steps, against its batch's (a long context
     * reads more positions in every layer that reads them all: a Gemma-3
     * local layer reads its window, so its fastest task says little) */
    lt[k] = of_request(&cs, i, 3, v);
    /* how long its context is: the longest it reached (a prompt's first
     * chunk starts at one position) */
    ctx[k] = in->requests[i].ctx_max > 0 ? in->requests[i].ctx_max : of_request(&cs, i, 2, v);
    if (isnan(e[k]) || isnan(lt[k])) continue;
    cells[k] = steps[i];
    idx[k++] = i;
  }
  free(steps);
  free(cut);
  if (k < 3) {
    free(cells);
    goto out;
  }
  double s = cell_scatter(&cs, idx, e, k, n, scratch);
  for (int j = 0; j < k; j++) scratch[j] = cells[j];
  int typical = (int)ex_median(scratch, (size_t)k);
  place_trend(in, idx, e, k, scratch, MAX_FIT * (MAX_PAIRS + 1));
  memcpy(scratch, e, (size_t)k * sizeof *e);
  double center = ex_median(scratch, (size_t)k);
  memcpy(scratch, e, (size_t)k * sizeof *e);
  double sd = ex_mad_sd(scratch, (size_t)k, center);
  rq->noise = sd > 0.01 ? sd : 0.01;
  for (int j = 0; j < k; j++) scratch[j] = log(ctx[j] > 1 ? ctx[j] : 1);
  rq->ctx_center = ex_median(scratch, (size_t)k);
  memcpy(scratch, lt, (size_t)k * sizeof *lt);
  rq->t_center = ex_median(scratch, (size_t)k);
  memcpy(scratch, lt, (size_t)k * sizeof *lt);
  sd = ex_mad_sd(scratch, (size_t)k, rq->t_center);
  rq->t_noise = sd > 0.01 ? sd : 0.01;
  for (int j = 0; j < k; j++) {
    struct ms_explain_effect *o = &x->out->request[idx[j]];
    const struct ms_explain_request *r = &in->requests[idx[j]];
    o->effect = e[j] - center;
    o->noise = request_noise(rq->noise, s, cells[j], typical);
    o->z = o->effect / o->noise;
    o->n = r->n;
    o->peers = k - 1;
    o->excess_ns = (rq->intercept + rq->slope * ctx[j]) * (exp(o->effect) - 1) * o->n / (in->steps > 0 ? in->steps : 1);
    rq->time[idx[j]] = exp(lt[j]);
  }
  free(cells);
out:
  free(cs.c);
  free(cs.line);
  free(cs.resid);
  free(cs.load);
  free(cs.by_step);
  free(e);
  free(lt);
  free(ctx);
  free(idx);
  free(v);
  free(scratch);
}
