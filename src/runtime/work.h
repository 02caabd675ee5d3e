/* SPDX-License-Identifier: MIT */
/* The work a task does in the step in flight (private to src/runtime): the
 * rows (tokens) it processes and the bytes of weights and KV cache it reads,
 * from the plan, the model's shapes and the step's batch. The hook sites fill
 * work_rows and work_bytes (hook ABI v2) from here and the simulator's cost
 * model counts an expert's rows with the same function, so what a monitor sees
 * is what the backend ran. Valid while the task's step is in flight (its
 * task_begin and task_end): the batch metadata is that step's. */
#ifndef MS_RUNTIME_WORK_H
#define MS_RUNTIME_WORK_H

#include "core/layer.h"
#include "runtime/runtime_impl.h"
#include "runtime/fault.h"

/* Rows of the step routed to expert `expert`: the router's output when kernels
 * run; with shapes only, a fixed spread (row r takes experts r..r+k-1 mod E),
 * the routing_skew fault applied. */
static inline int ms_rt_routed(const struct ms_engine *e, const struct plan_rt *rt, const struct ms_task_class *cl,
                               int expert) {
  const struct ms_model_config *c = &e->m->cfg;
  int n = 0;
  if (e->faults && e->shape_only) return ms_fault_routed(e, rt, expert);  /* fault injection (routing_skew) */
  for (int r = 0; r < rt->x.meta.n_rows; r++) {
    if (rt->x.meta.row_slot[r] < 0) continue;
    const int32_t *ids = e->shape_only ? NULL : (const int32_t *)ms_buf_row(&rt->x, cl->in2, 0, r);
    for (int j = 0; j < c->top_k; j++)
      if ((ids ? ids[j] : (r + j) % c->n_experts) == expert) n++;
  }
  return n;
}

static inline int ms_rt_row_live(const struct plan_rt *rt, int r) {
  return r >= 0 && r < rt->x.meta.n_rows && rt->x.meta.row_slot[r] >= 0;
}

/* work_rows: an expert task's routed rows, attention's positions (those it
 * reads: the row's context, or a local layer's window), a row task's row (1, or 0 for padding), 0 for the step start and
 * empty tasks, the step's live rows for every other task (GEMV tiles, comm). */
static inline uint32_t ms_rt_task_rows(const struct ms_engine *e, const struct plan_rt *rt, int t) {
  const struct ms_task *k = &rt->plan->tasks[t];
  int r = k->tile[1];
  switch (k->kernel) {
  case MS_K_STEP_START:
  case MS_K_EMPTY:
    return 0;
  case MS_K_EXPERT_UP:
  case MS_K_EXPERT_DOWN:
    return (uint32_t)ms_rt_routed(e, rt, &rt->plan->classes[k->cls], k->tile[2]);
  case MS_K_ATTN: {
    /* the positions it reads: a sliding-window layer's window at most, its
     * part's share of them, by the rule the kernels read them with
     * (megakernel.cuh's msd_ctx_work too, whose plans are never in parts) */
    if (!ms_rt_row_live(rt, r)) return 0;
    const struct ms_task_class *c = &rt->plan->classes[k->cls];
    int n = rt->x.meta.row_pos[r] + 1, p0, p1;
    ms_layer_attn_share(&e->m->cfg, c->layer, n, k->tile[0], c->parts, &p0, &p1);
    return (uint32_t)(p1 - p0);
  }
  default:
    return r >= 0 ? (uint32_t)ms_rt_row_live(rt, r) : (uint32_t)rt->x.meta.n_rows;
  }
}

static inline uint64_t ms_rt_wbytes(const struct ms_weight *w, int rows) {
  return w && rows > 0 ? (uint64_t)rows * ms_weight_row_bytes(w) : 0;
}

/* work_bytes: weights and KV cache as the kernel reads them. A GEMV tile reads
 * its output rows of each weight once for the whole batch (the q|k|v tile: the
 * rows of each it overlaps); an expert tile its rows of the expert's matrices,
 * nothing when no row was routed to it; attention the row's K and V (f32, one
 * kv head) at every position; an embedding the token rows; norms, RoPE and the
 * router their whole (small) weights; everything else reads activations only
 * (0). `rows`: ms_rt_task_rows of the task. */
static inline uint64_t ms_rt_task_bytes(const struct ms_engine *e, const struct plan_rt *rt, int t, uint32_t rows) {
  const struct ms_task *k = &rt->plan->tasks[t];
  const struct ms_task_class *cl = &rt->plan->classes[k->cls];
  const struct ms_model_config *c = &e->m->cfg;
  const struct ms_weight *const *w = rt->x.cls_w[k->cls];
  int c0 = k->tile[0] * cl->tile, c1 = c0 + cl->tile < cl->n_out ? c0 + cl->tile : cl->n_out;
  int n = c1 > c0 ? c1 - c0 : 0;
  uint64_t b = 0;
  switch (k->kernel) {
  case MS_K_QKV:
    for (int m = 0, base = 0; m < 3 && w[m]; base += w[m]->rows, m++) {
      int lo = c0 > base ? c0 : base, hi = c1 < base + w[m]->rows ? c1 : base + w[m]->rows;
      b += ms_rt_wbytes(w[m], hi - lo);
    }
    return b;
  case MS_K_WO:
  case MS_K_SWIGLU:
  case MS_K_DOWN:
  case MS_K_LM_HEAD:
    for (int j = 0; j < 3; j++) b += ms_rt_wbytes(w[j], n);
    return b;
  case MS_K_EXPERT_UP:
    return rows ? 2 * (uint64_t)n * ms_dtype_row_bytes(c->dtype, c->dim) : 0;
  case MS_K_EXPERT_DOWN:
    return rows ? (uint64_t)n * ms_dtype_row_bytes(c->dtype, c->expert_ffn_dim) : 0;
  case MS_K_ATTN:
    return (uint64_t)rows * 2 * (uint64_t)c->head_dim * sizeof(float);
  case MS_K_EMBED:
    return ms_rt_wbytes(w[0], (int)(k->tile[1] >= 0 ? ms_rt_row_live(rt, k->tile[1]) : rt->x.meta.n_rows));
  case MS_K_RMSNORM:
  case MS_K_ROPE:
  case MS_K_ROUTER:
    for (int j = 0; j < 3; j++) b += w[j] ? ms_rt_wbytes(w[j], w[j]->rows) : 0;
    return b;
  default:
    return 0;
  }
}

/* The ABI v2 fields of task_begin and task_end: the work task t does in its
 * step (in flight: the batch metadata is its own), how many other JIT tasks
 * were taken while it waited in a JIT queue (rt->passed, written by the pop
 * that took it), and its remote producer: when the trigger that completed its
 * event in this generation came from another device (c->device is its own),
 * that event, the device and the step. */
static inline void ms_rt_ctx_work(const struct ms_engine *e, struct ms_hook_ctx *c, const struct plan_rt *rt, int t,
                                  uint64_t gen) {
  const struct ms_task *k = &rt->plan->tasks[t];
  c->work_rows = ms_rt_task_rows(e, rt, t);
  c->work_bytes = ms_rt_task_bytes(e, rt, t, c->work_rows);
  c->passed_over = k->launch == MS_LAUNCH_JIT && e->o.mode == MS_MODE_MEGAKERNEL
                       ? atomic_load_explicit(&rt->passed[t], memory_order_relaxed)
                       : 0;
  if (k->wait < 0 || atomic_load_explicit(&rt->fire_gen[k->wait], memory_order_acquire) != gen + 1) return;
  uint32_t dev = atomic_load_explicit(&rt->fire_dev[k->wait], memory_order_relaxed);
  if (dev == c->device) return;
  c->remote_event = (uint32_t)k->wait;
  c->remote_device = dev;
  c->remote_gen = c->step;
}

#endif
