/* SPDX-License-Identifier: MIT */
/* Tensor parallelism across processes: one engine in N processes (ranks), each
 * running the same plan (compiled with tp = N and tp_split) on the same model
 * file, with the transport of megascope/transport.h between them.
 *
 * Who computes what. A column-tiled operator's tile is computed by the ranks
 * whose share of the gathered columns it overlaps (a tile across a share's
 * edge by both, with the same result); every other task (norms, RoPE,
 * attention, the sampling) runs on every rank on whole rows that every rank
 * holds after the gathers, so each rank keeps the whole KV cache and draws the
 * same tokens. A rank's kernels read only its rows of the split matrices: the
 * weights are the GGUF file's, mapped read-only (ms_gguf_open), so one copy
 * of the file sits in the page cache for every rank of a machine. The packed
 * form the kernels read is private to each rank, so a rank packs only those
 * rows: while it compiles its plans the engine collects, matrix by matrix,
 * the rows its tasks that are not remote read (plan_rows), and before the
 * workers start hands them to weight_rows_hook, whose caller packs them
 * (ms_model_repack_rows, on a model loaded without its packed form). A plan
 * compiled after that (background prefill) adds nothing: what it reads
 * outside those rows comes from the file's layout, the same bits.
 *
 * The communication tasks. Task d of a gather on rank d sends its share of the
 * buffer's columns (the step's rows) to every other rank; on another rank it
 * receives that share from d. Its trigger then releases the next operator as
 * any event does: the wait on the remote rank is the communication task's
 * body, polled by the worker (the transport's non-blocking calls).
 *
 * Agreement. The step start of every rank decides the same step (the same
 * requests in the same slots, from the same submissions); worker 0 checks it
 * each step by exchanging a hash of the layout, so ranks that drift apart stop
 * at once with a report instead of exchanging wrong shares.
 *
 * Failure. A wait that times out (a rank died or hangs) or a disagreement
 * stops the engine: the report names this rank, the remote one and the event,
 * in tx_report; the next step start cancels every request. The caller ends
 * every rank (the transport's abort). */
#include <errno.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "megascope/transport.h"
#include "runtime/runtime_impl.h"

static int timeout_ms(const struct ms_engine *e) { return e->o.comm_timeout_ms > 0 ? e->o.comm_timeout_ms : 10000; }

int ms_rt_dist_check(struct ms_engine *e, struct ms_textbuf *log) {
  const struct ms_transport *tx = e->o.transport;
  e->tx = tx;
  e->rank = 0;
  if (!tx) return 0;
  if (tx->sz < sizeof *tx || !tx->share || !tx->exchange) {
    ms_textbuf_printf(log, "engine: the transport's table is incomplete\n");
    return -EINVAL;
  }
  if (e->o.backend != MS_BACKEND_CPU) {
    ms_textbuf_printf(log, "engine: tensor parallelism across processes runs on the cpu backend, not %s\n",
                      ms_backend_name(e->o.backend));
    return -ENOTSUP;
  }
  if (e->o.tp != tx->size || tx->size < 2) {
    ms_textbuf_printf(log, "engine: --tp %d across %d ranks: each rank is one device, so --tp must equal the "
                      "number of ranks (mpirun -np %d), at least 2\n", e->o.tp, tx->size, e->o.tp);
    return -EINVAL;
  }
  if (e->m->cfg.n_experts) {
    ms_textbuf_printf(log, "engine: tensor parallelism across processes: model '%s' has experts; dense models only\n",
                      e->m->cfg.name);
    return -ENOTSUP;
  }
  if (e->o.tp_lead && (tx->sz < offsetof(struct ms_transport, bcast) + sizeof tx->bcast || !tx->bcast)) {
    ms_textbuf_printf(log, "engine: the transport '%s' has no bcast: rank 0 cannot lead the others\n", tx->name);
    return -EINVAL;
  }
  e->rank = tx->rank;
  e->lead = !e->o.tp_lead ? MS_LEAD_NONE : e->rank == 0 ? MS_LEAD_LEADER : MS_LEAD_FOLLOWER;
  return 0;
}

/* The gather (communication class) of buffer buf, or -1. */
static int gather_of(const struct ms_plan *p, int buf) {
  for (int c = 0; c < p->n_classes; c++)
    if (p->classes[c].kernel == MS_K_COMM && p->classes[c].in == buf) return c;
  return -1;
}

/* Rows [r0, r1) of w merged into the engine's list (min .. max). */
static int rows_add(struct ms_engine *e, const struct ms_weight *w, int r0, int r1) {
  if (!w || r0 >= r1) return 0;
  for (int i = 0; i < e->n_wrows; i++)
    if (e->wrows[i].w == w) {
      struct ms_weight_rows *x = &e->wrows[i];
      x->r0 = r0 < x->r0 ? r0 : x->r0;
      x->r1 = r1 > x->r1 ? r1 : x->r1;
      return 0;
    }
  struct ms_weight_rows *grown = realloc(e->wrows, (size_t)(e->n_wrows + 1) * sizeof *grown);
  if (!grown) return -ENOMEM;
  e->wrows = grown;
  e->wrows[e->n_wrows++] = (struct ms_weight_rows){.w = w, .r0 = r0, .r1 = r1};
  return 0;
}

/* The rows of each weight this rank's tasks of rt read: each task that is
 * not remote, by the columns of its tile (ms_ops_weight_rows), every row of
 * a weight read otherwise. */
static int plan_rows(struct ms_engine *e, const struct plan_rt *rt) {
  const struct ms_plan *p = rt->plan;
  for (int t = 0; t < p->n_tasks; t++) {
    const struct ms_task *k = &p->tasks[t];
    const struct ms_task_class *cl = &p->classes[k->cls];
    const struct ms_weight *const *w = rt->cls_w[k->cls];
    if (rt->remote[t] || k->kernel == MS_K_EMPTY || (!w[0] && !w[1] && !w[2])) continue;
    int c0 = k->tile[0] * cl->tile, c1 = c0 + cl->tile < cl->n_out ? c0 + cl->tile : cl->n_out, rows[3][2];
    int whole = cl->tile <= 0 || k->tile[0] < 0 || ms_ops_weight_rows(cl, w, c0, c1, rows);
    for (int i = 0; i < 3; i++)
      if (w[i] && rows_add(e, w[i], whole ? 0 : rows[i][0], whole ? w[i]->rows : rows[i][1])) return -ENOMEM;
  }
  return 0;
}

int ms_rt_dist_plan(struct ms_engine *e, struct plan_rt *rt) {
  const struct ms_plan *p = rt->plan;
  if (!e->tx) return 0;
  if (!(rt->remote = calloc((size_t)p->n_tasks, 1))) return -ENOMEM;
  int D = e->tx->size, r = e->rank;
  for (int t = 0; t < p->n_tasks; t++) {
    const struct ms_task *k = &p->tasks[t];
    const struct ms_task_class *cl = &p->classes[k->cls];
    if (k->kernel == MS_K_COMM || k->kernel == MS_K_EMPTY || cl->tile <= 0 || k->tile[0] < 0 || cl->out < 0 ||
        strcmp(cl->region_class, "cols"))
      continue;
    if (gather_of(p, cl->out) < 0) continue;  /* not gathered: every rank computes it */
    int cols = p->bufs[cl->out].cols, s0 = (int)((int64_t)r * cols / D), s1 = (int)((int64_t)(r + 1) * cols / D);
    int c0 = k->tile[0] * cl->tile, c1 = c0 + cl->tile < cl->n_out ? c0 + cl->tile : cl->n_out;
    rt->remote[t] = !(c0 < s1 && s0 < c1);
  }
  return e->wrows_handed ? 0 : plan_rows(e, rt);
}

void ms_rt_dist_weights(struct ms_engine *e) {
  if (!e->tx || e->wrows_handed) return;
  e->wrows_handed = 1;  /* before the prefill thread starts: the plans it compiles add nothing */
  if (e->o.weight_rows_hook) e->o.weight_rows_hook(e->wrows, e->n_wrows, e->o.weight_rows_user);
}

/* A wait on another rank failed: the report, and the engine stops. */
static void comm_failed(struct worker *w, struct plan_rt *rt, int t, int src, int rc,
                        const struct ms_transport_wait *wt) {
  struct ms_engine *e = w->e;
  const struct ms_plan *p = rt->plan;
  char name[96];
  int expected = 0;
  if (!atomic_compare_exchange_strong_explicit(&e->tx_failed, &expected, 1, memory_order_acq_rel,
                                               memory_order_relaxed))
    return;  /* the first failure is the report */
  ms_plan_task_name(p, t, name, sizeof name);
  const struct ms_task *k = &p->tasks[t];
  uint64_t step = atomic_load_explicit(&e->cur_step, memory_order_relaxed);
  pthread_mutex_lock(&e->log_mu);
  if (src == e->rank && wt->peer >= 0)
    snprintf(e->tx_report, sizeof e->tx_report,
             "rank %d: rank %d did not take rank %d's share of %s (task %d, which triggers event %d, %s, on every "
             "rank) within %.0f ms, step %" PRIu64 ": %s\n",
             e->rank, wt->peer, e->rank, name, t, k->trigger, p->ev_classes[p->events[k->trigger].cls],
             (double)wt->waited_ns / 1e6, step, rc == -ETIMEDOUT ? "it hangs or died" : ms_strerror(rc));
  else if (src == e->rank)
    snprintf(e->tx_report, sizeof e->tx_report,
             "rank %d: sending its share of %s (task %d, which triggers event %d, %s) failed, step %" PRIu64 ": %s\n",
             e->rank, name, t, k->trigger, p->ev_classes[p->events[k->trigger].cls], step,
             rc == -ETIMEDOUT ? "a rank died or hangs" : ms_strerror(rc));
  else
    snprintf(e->tx_report, sizeof e->tx_report,
             "rank %d: waited %.0f ms for rank %d's share of %s (task %d; the remote event it releases: %d, %s; "
             "step %" PRIu64 ", generation %" PRIu64 "): %s\n",
             e->rank, (double)wt->waited_ns / 1e6, src, name, t, k->trigger,
             p->ev_classes[p->events[k->trigger].cls], step, atomic_load_explicit(&e->cur_gen, memory_order_relaxed),
             rc == -ETIMEDOUT ? "it hangs or died" : ms_strerror(rc));
  snprintf(e->stall_report, sizeof e->stall_report, "%s", e->tx_report);
  pthread_mutex_unlock(&e->log_mu);
  atomic_fetch_add(&e->stalls, 1);
  atomic_store_explicit(&e->stop_req, 1, memory_order_release);
}

void ms_rt_comm_run(struct worker *w, struct plan_rt *rt, int t) {
  struct ms_engine *e = w->e;
  const struct ms_transport *tx = e->tx;
  if (!tx || atomic_load_explicit(&e->tx_failed, memory_order_relaxed)) return;  /* one memory: already there */
  const struct ms_plan *p = rt->plan;
  const struct ms_task *k = &p->tasks[t];
  const struct ms_task_class *cl = &p->classes[k->cls];
  int D = tx->size, d = k->tile[2], cols = p->bufs[cl->in].cols;
  int c0 = (int)((int64_t)d * cols / D), c1 = (int)((int64_t)(d + 1) * cols / D);
  int rows = rt->x.meta.n_rows;
  struct ms_transport_wait wt = {0};
  if (c1 <= c0 || rows <= 0) return;
  int rc = tx->share(tx->ctx, d, k->cls, ms_buf_row(&rt->x, cl->in, 0, 0) + c0, rows, c1 - c0, cols,
                     timeout_ms(e), &wt);
  if (rc) {
    comm_failed(w, rt, t, d, rc, &wt);
    return;
  }
  if (d == e->rank) {
    atomic_fetch_add_explicit(&e->tx_sent, 1, memory_order_relaxed);
    return;
  }
  atomic_fetch_add_explicit(&e->tx_received, 1, memory_order_relaxed);
  atomic_fetch_add_explicit(&e->tx_bytes, (uint64_t)rows * (uint64_t)(c1 - c0) * sizeof(float), memory_order_relaxed);
  atomic_fetch_add_explicit(&e->tx_wait_ns, wt.waited_ns, memory_order_relaxed);
}

void ms_engine_comm_stats(const struct ms_engine *e, struct ms_comm_stats *out) {
  struct ms_engine *m = (struct ms_engine *)e;  /* relaxed loads of counters */
  *out = (struct ms_comm_stats){.sent = atomic_load_explicit(&m->tx_sent, memory_order_relaxed),
                                .received = atomic_load_explicit(&m->tx_received, memory_order_relaxed),
                                .bytes_received = atomic_load_explicit(&m->tx_bytes, memory_order_relaxed),
                                .wait_ns = atomic_load_explicit(&m->tx_wait_ns, memory_order_relaxed)};
}

/* What worker 0 laid out for the step, as every rank must have it. */
struct step_id {
  uint64_t step, hash;
  int32_t rows, bucket, chunked, pad;
};

static uint64_t fnv(uint64_t h, const void *p, size_t n) {
  const unsigned char *b = p;
  for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

int ms_rt_dist_agree(struct ms_engine *e, int bucket, int rows, int chunked) {
  const struct ms_transport *tx = e->tx;
  if (!tx) return 0;
  struct step_id mine = {.step = e->next_step, .rows = rows, .bucket = bucket, .chunked = chunked};
  uint64_t h = 1469598103934665603ull;
  h = fnv(h, e->row_slot, sizeof *e->row_slot * (size_t)rows);
  h = fnv(h, e->row_pos, sizeof *e->row_pos * (size_t)rows);
  h = fnv(h, e->row_token, sizeof *e->row_token * (size_t)rows);
  mine.hash = h;
  struct step_id all[64];
  struct ms_transport_wait wt = {.peer = -1};
  int rc = tx->exchange(tx->ctx, &mine, all, sizeof mine, timeout_ms(e), &wt), bad = -1;
  for (int r = 0; !rc && r < tx->size && bad < 0; r++)
    if (memcmp(&all[r], &all[0], sizeof all[0])) bad = r;
  if (!rc && bad < 0) return 0;
  int expected = 0;
  if (atomic_compare_exchange_strong(&e->tx_failed, &expected, 1)) {
    pthread_mutex_lock(&e->log_mu);
    if (rc && wt.peer >= 0)
      snprintf(e->tx_report, sizeof e->tx_report,
               "rank %d: rank %d sent nothing for the start of step %" PRIu64 " (the layout every rank checks "
               "before the step's first event) within %d ms: %s\n",
               e->rank, wt.peer, e->next_step, timeout_ms(e), rc == -ETIMEDOUT ? "it hangs or died" : ms_strerror(rc));
    else if (rc)
      snprintf(e->tx_report, sizeof e->tx_report, "rank %d: the start of step %" PRIu64 " failed: %s\n", e->rank,
               e->next_step, ms_strerror(rc));
    else
      snprintf(e->tx_report, sizeof e->tx_report,
               "rank %d: rank %d laid out another step than rank 0 (step %" PRIu64 " of %d rows, bucket %d, layout "
               "%016" PRIx64 ", against step %" PRIu64 " of %d rows, bucket %d, layout %016" PRIx64
               "): the ranks were given different requests\n",
               e->rank, bad, all[bad].step, all[bad].rows, all[bad].bucket, all[bad].hash, all[0].step, all[0].rows,
               all[0].bucket, all[0].hash);
    snprintf(e->stall_report, sizeof e->stall_report, "%s", e->tx_report);
    pthread_mutex_unlock(&e->log_mu);
    atomic_fetch_add(&e->stalls, 1);
  }
  atomic_store_explicit(&e->stop_req, 1, memory_order_release);
  return -EPROTO;
}

int ms_engine_comm_failed(const struct ms_engine *e, char *buf, size_t n) {
  if (!atomic_load(&((struct ms_engine *)e)->tx_failed)) {
    if (n) buf[0] = 0;
    return 0;
  }
  pthread_mutex_lock((pthread_mutex_t *)&e->log_mu);
  snprintf(buf, n, "%s", e->tx_report);
  pthread_mutex_unlock((pthread_mutex_t *)&e->log_mu);
  return 1;
}
