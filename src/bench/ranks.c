/* SPDX-License-Identifier: MIT */
/* The counterexample benchmark across ranks (mpirun -np N megascope bench
 * diagnose --tp N): one engine in N processes, each rank one device.
 *
 * Lockstep. Every rank runs the same scenarios through run.c's flow, building
 * the same engines with the same requests in the same order, so that their
 * communication tasks meet. What depends on a clock or on a measurement (a
 * run's time, the share of work a fault touches, an observation's success) is
 * rank 0's: bench_ranks_agree hands it to every rank (the transport's
 * exchange: rank 0's part kept), and every choice made from it (the magnitude
 * tuning, how many pairs, the target raised to the noise, whether a reference
 * is taken again) comes out the same on every rank.
 *
 * Evidence. After each observed run (its engine freed, so that the transport
 * is the benchmark's alone) the followers send what they observed to rank 0
 * (gather), which merges it into its own: the rows the diagnosers read, as
 * ranks.c in the runtime merges a served engine's maps for a query (counts and
 * sums add, maxima take the largest), except that a worker's rows are not
 * added to another rank's worker of the same number: rank r's workers follow
 * the ranks before it, so that a worker, and the device it belongs to, stays
 * one scope. The diagnosers on rank 0 then judge the merged evidence with the
 * device hypotheses the simulator's tensor-parallel plans use; a device is a
 * rank. Messages carry raw structs: every rank runs the same executable (the
 * CLI's launch check). */
#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench.h"
#include "megascope/plan_ir.h"

#define AGREE_TIMEOUT_MS 600000  /* a rank's longest run between two agreements (10 min, as a stalled run) */

int bench_ranks_agree(const struct ms_transport *tx, void *v, size_t n) {
  if (!tx) return 0;
  uint8_t *all = malloc(n * (size_t)tx->size);
  if (!all) return -ENOMEM;
  struct ms_transport_wait w = {.peer = -1};
  int rc = tx->exchange(tx->ctx, v, all, n, AGREE_TIMEOUT_MS, &w);
  if (!rc) memcpy(v, all, n);  /* rank 0's */
  free(all);
  return rc;
}

int bench_ranks_agree_rc(const struct ms_transport *tx, int rc) {
  if (!tx) return rc;
  int32_t mine = rc, all[64];
  if (tx->size > 64) return -EINVAL;
  struct ms_transport_wait w = {.peer = -1};
  int xrc = tx->exchange(tx->ctx, &mine, all, sizeof mine, AGREE_TIMEOUT_MS, &w);
  if (xrc) return xrc;
  for (int r = 0; r < tx->size; r++)
    if (all[r]) return all[r];
  return 0;
}

/* ---- a follower's evidence as sent ---- */

struct ev_head {
  int32_t has_feat, lazy, os_n, pad;
  int32_t n[FS_COUNT];
  uint64_t bytes, obs_execs, obs_records, obs_ring;
  double coverage, pc_total;
  double pc[BENCH_MAX_DEVICES][20];
};

static size_t ev_size(const struct ev_head *h) {
  size_t n = sizeof *h + sizeof(double[3]) * (size_t)h->os_n;
  for (int s = 0; h->has_feat && s < FS_COUNT; s++) n += sizeof(struct bench_stat) * (size_t)h->n[s];
  return n;
}

static void *ev_pack(const struct bench_evidence *ev, size_t *len) {
  struct ev_head h = {.has_feat = ev->feat != NULL, .lazy = ev->feat ? ev->feat->lazy : 0, .os_n = ev->os_n,
                      .bytes = ev->bytes, .obs_execs = ev->obs_execs, .obs_records = ev->obs_records,
                      .obs_ring = ev->obs_ring, .coverage = ev->coverage, .pc_total = ev->pc_total};
  memcpy(h.pc, ev->pc, sizeof h.pc);
  for (int s = 0; ev->feat && s < FS_COUNT; s++) h.n[s] = ev->feat->n[s];
  *len = ev_size(&h);
  uint8_t *buf = malloc(*len), *at = buf;
  if (!buf) return NULL;
  memcpy(at, &h, sizeof h), at += sizeof h;
  memcpy(at, ev->os, sizeof(double[3]) * (size_t)h.os_n), at += sizeof(double[3]) * (size_t)h.os_n;
  for (int s = 0; ev->feat && s < FS_COUNT; s++) {
    memcpy(at, ev->feat->row[s], sizeof(struct bench_stat) * (size_t)h.n[s]);
    at += sizeof(struct bench_stat) * (size_t)h.n[s];
  }
  return buf;
}

/* ---- rank 0: the merge ---- */

/* One rank's row added to the merged one (ms_query_maps_of_union's rule). */
static void stat_add_row(struct bench_stat *d, const struct bench_stat *s) {
  d->n += s->n, d->sum += s->sum, d->sumsq += s->sumsq, d->qsum += s->qsum;
  d->ratio += s->ratio, d->ratio_n += s->ratio_n, d->work += s->work;
  if (s->max > d->max) d->max = s->max;
  if (s->qmax > d->qmax) d->qmax = s->qmax;
  if (s->last > d->last) d->last = s->last;
  d->have |= s->have;
}

/* The merged tables: rank 0's shape with every rank's workers. */
static struct bench_features *feat_merged(const struct bench_features *f0, int ranks) {
  struct bench_features *f = calloc(1, sizeof *f);
  if (!f) return NULL;
  int local = f0->n[FS_WORKER], W = local * ranks;
  memcpy(f->n, f0->n, sizeof f->n);
  f->n[FS_WORKER] = W;
  f->n[FS_OSWORKER] = f0->n[FS_OSWORKER] && W <= BENCH_MAX_OS_WORKERS ? W : 0;
  f->n[FS_WOP] = (W < 64 ? W : 64) * MS_K_COUNT;  /* as bench_feat_new keeps them */
  f->lazy = f0->lazy;
  f->per_device = local;  /* a rank is a device */
  for (int s = 0; s < FS_COUNT; s++)
    if (!(f->row[s] = calloc((size_t)f->n[s] + 1, sizeof **f->row))) {
      bench_feat_free(f);
      return NULL;
    }
  return f;
}

/* Rank p's tables (n[s] rows each, at rows[s]) into the merged ones. */
static void feat_add(struct bench_features *f, int p, int local, const int32_t *n, struct bench_stat *const *rows) {
  for (int s = 0; s < FS_COUNT; s++) {
    for (int i = 0; i < n[s]; i++) {
      const struct bench_stat *x = &rows[s][i];
      int at = i;
      switch (s) {
      case FS_WTOP:
      case FS_BTOP: continue;                       /* taken again from the merged workers */
      case FS_DEVBUSY: at = p; break;               /* every task of rank p ran on its device */
      case FS_WORKER:
      case FS_OSWORKER: at = p * local + i; break;  /* rank p's workers after the ranks before */
      case FS_WOP: at = (p * local + i / MS_K_COUNT) * MS_K_COUNT + i % MS_K_COUNT; break;
      default: break;                               /* classes, operators, events, requests, shares */
      }
      if (at < f->n[s]) stat_add_row(&f->row[s][at], x);
    }
  }
}

/* Rank p's evidence (its head, its OS rows) into ev. */
static void ev_add(struct bench_evidence *ev, int p, int local, const struct ev_head *h, const double (*os)[3]) {
  ev->bytes += h->bytes, ev->obs_execs += h->obs_execs, ev->obs_records += h->obs_records;
  ev->obs_ring += h->obs_ring, ev->coverage += h->coverage, ev->pc_total += h->pc_total;
  for (int d = 0; d < BENCH_MAX_DEVICES; d++)
    for (int k = 0; k < 20; k++) ev->pc[d][k] += h->pc[d][k];
  for (int w = 0; w < h->os_n && p * local + w < BENCH_MAX_OS_WORKERS; w++) {
    memcpy(ev->os[p * local + w], os[w], sizeof os[w]);
    if (p * local + w + 1 > ev->os_n) ev->os_n = p * local + w + 1;
  }
}

/* A task's time against its class's mean was taken on each rank against that
 * rank's tasks alone, where a rank slowed as a whole is as slow as its own
 * means: across ranks it is taken again from the workers' rows kernel by
 * kernel (FS_WOP), against the kernel's mean over every rank's tasks, for
 * each worker (FS_WORKER's ratio) and each device (FS_DEVBUSY), so that a
 * slower rank stands out as a slower device does in one process.
 * Communication aside: its time is the link's. */
static void ratios_across(struct bench_features *f) {
  int W = f->n[FS_WORKER], D = f->n[FS_DEVBUSY];
  if (W * MS_K_COUNT > f->n[FS_WOP] || f->per_device <= 0) return;  /* not every worker's kernel rows */
  double mean[MS_K_COUNT];
  for (int k = 0; k < MS_K_COUNT; k++) {
    double n = 0, sum = 0;
    for (int w = 0; w < W; w++) n += f->row[FS_WOP][w * MS_K_COUNT + k].n, sum += f->row[FS_WOP][w * MS_K_COUNT + k].sum;
    mean[k] = n > 0 && k != MS_K_COMM && k != MS_K_EMPTY ? sum / n : 0;
  }
  for (int d = 0; d < D; d++) f->row[FS_DEVBUSY][d] = (struct bench_stat){0};
  for (int w = 0; w < W; w++) {
    double ratio = 0, n = 0;
    for (int k = 0; k < MS_K_COUNT; k++) {
      const struct bench_stat *x = &f->row[FS_WOP][w * MS_K_COUNT + k];
      if (mean[k] > 0 && x->n > 0) ratio += x->sum / mean[k], n += x->n;
    }
    struct bench_stat *r = &f->row[FS_WORKER][w], *b = &f->row[FS_DEVBUSY][w / f->per_device < D ? w / f->per_device : D - 1];
    r->ratio = ratio, r->ratio_n = n;
    b->n += n, b->sum += ratio, b->have |= n > 0;
  }
}

static int merge_at_root(const struct ms_transport *tx, struct bench_evidence *ev, void **out, size_t *len) {
  int ranks = tx->size, local = ev->feat ? ev->feat->n[FS_WORKER] : ev->os_n;
  struct bench_features *f = ev->feat ? feat_merged(ev->feat, ranks) : NULL;
  if (ev->feat && !f) return -ENOMEM;
  if (f) feat_add(f, 0, local, ev->feat->n, ev->feat->row);
  for (int p = 1; p < ranks; p++) {
    struct ev_head h;
    if (len[p] < sizeof h) goto bad;
    memcpy(&h, out[p], sizeof h);
    if (h.os_n < 0 || h.os_n > BENCH_MAX_OS_WORKERS || h.has_feat != (f != NULL)) goto bad;
    for (int s = 0; h.has_feat && s < FS_COUNT; s++)
      if (h.n[s] < 0 || h.n[s] != ev->feat->n[s]) goto bad;  /* the same tables on every rank */
    if (ev_size(&h) != len[p]) goto bad;
    const uint8_t *at = (const uint8_t *)out[p] + sizeof h;
    ev_add(ev, p, local, &h, (const double(*)[3])at);
    at += sizeof(double[3]) * (size_t)h.os_n;
    struct bench_stat *rows[FS_COUNT] = {0};
    for (int s = 0; f && s < FS_COUNT; s++) {
      rows[s] = (struct bench_stat *)at;  /* malloc'd by the transport: aligned for any struct */
      at += sizeof(struct bench_stat) * (size_t)h.n[s];
    }
    if (f) feat_add(f, p, local, h.n, rows);
  }
  ev->coverage /= ranks;  /* each rank's share of its own events: their mean */
  ev->pc_devices = ranks;
  if (f) {
    ratios_across(f);
    bench_feat_tops(f);
    if (f->lazy)  /* the semantic read-out: shipped only when read, as on one rank */
      for (int s = 0; s < FS_COUNT; s++)
        for (int i = 0; i < f->n[s]; i++) f->row[s][i].have = 0;
    f->coverage = ev->coverage;
    bench_feat_free(ev->feat);
    ev->feat = f;
  }
  return 0;
bad:
  bench_feat_free(f);
  return -EPROTO;
}

int bench_ranks_merge(const struct ms_transport *tx, struct bench_evidence *ev) {
  if (!tx || tx->size < 2) return 0;
  if (tx->sz < offsetof(struct ms_transport, gather) + sizeof tx->gather || !tx->gather || tx->size > 64)
    return -ENOTSUP;
  struct ms_transport_wait w = {.peer = -1};
  if (tx->rank != 0) {
    size_t len;
    void *buf = ev_pack(ev, &len);
    if (!buf) return -ENOMEM;
    int rc = tx->gather(tx->ctx, 0, buf, len, NULL, NULL, AGREE_TIMEOUT_MS, &w);
    free(buf);
    return rc;
  }
  void *out[64] = {0};
  size_t len[64] = {0};
  int rc = tx->gather(tx->ctx, 0, NULL, 0, out, len, AGREE_TIMEOUT_MS, &w);
  if (!rc) rc = merge_at_root(tx, ev, out, len);
  for (int p = 0; p < tx->size; p++) free(out[p]);
  return rc;
}
