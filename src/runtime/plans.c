/* SPDX-License-Identifier: MIT */
/* The runtime's view of the plans: one compiled plan per bucket (and, for
 * chunked prefill, a prefill plan per bucket, compiled in the background), with
 * its event counters, per-task state, JIT queues and the per-worker AOT and
 * per-op queues; and the storage every plan of an engine shares (activation
 * buffers, the KV pool, slots, the step's rows), since one step runs at a time. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/quant.h"
#include "runtime/runtime_impl.h"

static int stage_of(const struct ms_plan *p, int t) {
  const struct ms_task *k = &p->tasks[t];
  if (k->kernel != MS_K_EMPTY) return k->cls;
  /* an empty task runs with the operator of the producer it stands behind */
  return p->tasks[p->trig[p->trig_off[k->wait]]].cls;
}

static int place(struct ms_engine *e, uint64_t *rng, int *rr) {
  if (e->o.shuffle) return (int)(ms_rt_rng_next(rng) % (uint64_t)e->n_workers);
  int w = *rr;
  *rr = (w + 1) % e->n_workers;
  return w;
}

/* Tensor parallel: the device whose shard task t computes, or -1 for a task
 * any device's SMs may run. A column-tiled operator's tiles are split as the
 * devices' contiguous shares of its output columns (the shares their
 * communication tasks then gather), so device d's tiles run on device d's SMs,
 * as in a real TP split; row tasks, operators of fewer tiles than devices and
 * the communication tasks (comm_worker) are not pinned. */
static int shard_device(const struct ms_engine *e, const struct ms_plan *p, int t) {
  int D = e->o.tp;
  const struct ms_task *k = &p->tasks[t];
  const struct ms_task_class *c = &p->classes[k->cls];
  if (e->tx) return -1;  /* across processes: each rank's workers are its device's */
  if (D <= 1 || k->kernel == MS_K_COMM || k->kernel == MS_K_EMPTY || c->tile <= 0 || k->tile[0] < 0) return -1;
  int nx = (c->n_out + c->tile - 1) / c->tile;
  return nx >= D ? (int)((int64_t)k->tile[0] * D / nx) : -1;
}

/* A worker for task t: its device's next (round-robin per device, or at random
 * when shuffled) when it is pinned to one, else the next of all. */
static int place_task(struct ms_engine *e, const struct ms_plan *p, int t, uint64_t *rng, int *rr, int *rr_dev) {
  int d = shard_device(e, p, t);
  if (d < 0) return place(e, rng, rr);
  int per = (e->n_workers + e->o.tp - 1) / e->o.tp, base = d * per;
  int n = base + per <= e->n_workers ? per : e->n_workers - base;
  if (n <= 0) return place(e, rng, rr);
  if (e->o.shuffle) return base + (int)(ms_rt_rng_next(rng) % (uint64_t)n);
  return base + rr_dev[d]++ % n;
}

int ms_rt_device(const struct ms_engine *e, int worker) {
  if (e->tx) return e->rank;
  int D = e->o.tp > 1 ? e->o.tp : 1;
  return worker / ((e->n_workers + D - 1) / D);
}

/* Tensor parallel: a device's communication task runs on one of its own SMs
 * (worker w is on device w / (workers / tp)), a different one for each layer. */
static int comm_worker(const struct ms_engine *e, const struct ms_plan *p, int t) {
  int D = e->o.tp > 1 ? e->o.tp : 1, per = e->n_workers / D;
  int layer = p->classes[p->tasks[t].cls].layer;
  return p->tasks[t].tile[2] * per + (layer >= 0 ? layer * 7 + 3 : 0) % per;
}

static int rt_queues(struct ms_engine *e, struct plan_rt *rt, uint64_t seed) {
  const struct ms_plan *p = rt->plan;
  int W = e->n_workers, rr = 0;
  uint64_t rng = seed | 1;
  int *owner = malloc((size_t)p->n_tasks * sizeof *owner);
  int rr_dev[64] = {0}, rr_op[64] = {0};  /* tp is at most 64 (ms_engine_new) */
  rt->aot_q = calloc((size_t)W, sizeof *rt->aot_q);
  rt->aot_n = calloc((size_t)W, sizeof *rt->aot_n);
  rt->op_q = calloc((size_t)W, sizeof *rt->op_q);
  rt->op_n = calloc((size_t)W, sizeof *rt->op_n);
  rt->op_end = calloc((size_t)W, sizeof *rt->op_end);
  rt->n_stages = p->n_classes;
  if (!owner || !rt->aot_q || !rt->aot_n || !rt->op_q || !rt->op_n || !rt->op_end) goto fail;
  for (int w = 0; w < W; w++) {
    rt->aot_q[w] = malloc(((size_t)p->n_tasks + 1) * sizeof(int32_t));
    rt->op_q[w] = malloc(((size_t)p->n_tasks + 1) * sizeof(int32_t));
    rt->op_end[w] = calloc((size_t)rt->n_stages, sizeof(int32_t));
    if (!rt->aot_q[w] || !rt->op_q[w] || !rt->op_end[w]) goto fail;
  }
  /* AOT: round-robin (or random) in plan order, so every queue is in topological
   * order; the step start always on worker 0, which ran its body. */
  for (int t = 0; t < p->n_tasks; t++) {
    if (p->tasks[t].launch != MS_LAUNCH_AOT) continue;
    int w = t == 0 ? 0 : place_task(e, p, t, &rng, &rr, rr_dev);
    if (p->tasks[t].kernel == MS_K_COMM && !e->tx) w = comm_worker(e, p, t);
    rt->aot_q[w][rt->aot_n[w]++] = t;
  }
  /* per-op: every task (JIT included) placed by stage. */
  for (int t = 0; t < p->n_tasks; t++) owner[t] = t == 0 ? 0 : place_task(e, p, t, &rng, &rr, rr_op);
  for (int s = 0; s < rt->n_stages; s++)
    for (int w = 0; w < W; w++) rt->op_end[w][s] = rt->op_n[w];
  for (int s = 0; s < rt->n_stages; s++) {
    for (int t = 0; t < p->n_tasks; t++)
      if (stage_of(p, t) == s) rt->op_q[owner[t]][rt->op_n[owner[t]]++] = t;
    for (int w = 0; w < W; w++) rt->op_end[w][s] = rt->op_n[w];
  }
  free(owner);
  return 0;
fail:
  free(owner);
  return -ENOMEM;
}

void ms_rt_plan_free(struct ms_engine *e, struct plan_rt *rt) {
  for (int w = 0; w < e->n_workers; w++) {
    if (rt->aot_q) free(rt->aot_q[w]);
    if (rt->op_q) free(rt->op_q[w]);
    if (rt->op_end) free(rt->op_end[w]);
  }
  free(rt->aot_q);
  free(rt->aot_n);
  free(rt->op_q);
  free(rt->op_n);
  free(rt->op_end);
  free((void *)rt->counters);
  free((void *)rt->done_gen);
  free(rt->delay_ns);
  free(rt->cls_w);
  for (int p = 0; p < MS_PRIO_LEVELS; p++) ms_mpmc_destroy(&rt->jit[p]);
  free((void *)rt->fire_ns);
  free((void *)rt->fire_gen);
  free((void *)rt->fire_dev);
  free((void *)rt->jit_mark);
  free((void *)rt->passed);
  free(rt->remote);
  ms_plan_free(rt->plan);
}

int ms_rt_plan_init(struct ms_engine *e, struct plan_rt *rt, int batch, int prefill, struct ms_textbuf *log) {
  struct ms_compile_opts co = {.sz = sizeof co, .batch = batch, .tile_bytes = e->o.tile_bytes,
                               .tile_rows = e->o.tile_rows, .tiles_per_op = e->o.tiles_per_op,
                               .min_tiles = e->o.min_tiles, .fuse_norm = e->o.fuse_norm,
                               .attn_parts = e->o.attn_parts, .tp = e->o.tp, .prefill = prefill,
                               .tp_split = e->tx != NULL};
  rt->plan = ms_plan_compile(e->m, &co, log);
  if (!rt->plan) return -errno;
  if (e->o.plan_hook) e->o.plan_hook(rt->plan, e->o.plan_hook_user);
  const struct ms_plan *p = rt->plan;
  rt->counters = calloc((size_t)p->n_events, sizeof *rt->counters);
  rt->done_gen = calloc((size_t)p->n_tasks, sizeof *rt->done_gen);
  rt->cls_w = calloc((size_t)p->n_classes, sizeof *rt->cls_w);
  if (!rt->counters || !rt->done_gen || !rt->cls_w) return -ENOMEM;
  for (int q = 0; q < MS_PRIO_LEVELS; q++)
    if (ms_mpmc_init(&rt->jit[q], (uint64_t)p->stats.jit_tasks + 2)) return -ENOMEM;
  rt->fire_ns = calloc((size_t)p->n_events, sizeof *rt->fire_ns);
  rt->fire_gen = calloc((size_t)p->n_events, sizeof *rt->fire_gen);
  rt->fire_dev = calloc((size_t)p->n_events, sizeof *rt->fire_dev);
  rt->jit_mark = calloc((size_t)p->n_tasks, sizeof *rt->jit_mark);
  rt->passed = calloc((size_t)p->n_tasks, sizeof *rt->passed);
  if (!rt->fire_ns || !rt->fire_gen || !rt->fire_dev || !rt->jit_mark || !rt->passed) return -ENOMEM;
  ms_ops_bind_weights(p, e->m, rt->cls_w);
  if (ms_rt_dist_plan(e, rt)) return -ENOMEM;
  int rc = rt_queues(e, rt, e->o.seed * 0x9e3779b97f4a7c15ull + (uint64_t)batch);
  if (rc) return rc;
  rt->x = (struct ms_exec_ctx){
      .m = e->m, .plan = p, .buf = e->buf, .max_rows = e->max_rows,
      .cls_w = (const struct ms_weight *const (*)[3])rt->cls_w,
      .meta = {.row_slot = e->row_slot, .row_pos = e->row_pos, .row_token = e->row_token,
               .row_pages = e->row_pages, .row_head = e->row_head, .row_rope = e->row_rope},
      .k_pool = e->k_pool, .v_pool = e->v_pool, .kv_f16 = e->o.kv_f16, .kv_stage = e->kv_stage,
      .page_size = e->o.page_size,
      .pool_pages = e->pool_pages, .scratch = e->scratch,
      .q8 = e->q8, .q8_held = e->q8_held, .q8_rows = e->q8_rows, .q8_cols = e->q8_cols,
      .normed = e->normed, .attn_part = e->attn_part, .attn_done = e->attn_done};
  return 0;
}

/* 8-bit activations: a buffer per worker for up to 64 input rows of the widest
 * GEMV input (dim, the attention output, an FFN hidden row). */
static int alloc_q8(struct ms_engine *e) {
  const struct ms_model_config *c = &e->m->cfg;
  int n = c->dim;
  if (c->n_heads * c->head_dim > n) n = c->n_heads * c->head_dim;
  if (c->ffn_dim > n) n = c->ffn_dim;
  if (c->expert_ffn_dim > n) n = c->expert_ffn_dim;
  e->q8_cols = (n + 31) / 32 * 32;
  e->q8_rows = e->max_rows < 64 ? e->max_rows : 64;
  size_t bytes = (ms_q8_act_bytes(e->q8_cols, e->q8_rows) + 63) / 64 * 64;
  if (!(e->q8 = calloc((size_t)e->n_workers, sizeof *e->q8)) ||
      !(e->q8_held = calloc((size_t)e->n_workers, sizeof *e->q8_held)))
    return -ENOMEM;
  for (int w = 0; w < e->n_workers; w++)
    if (!(e->q8[w] = aligned_alloc(64, bytes))) return -ENOMEM;
  return 0;
}

/* Activation buffers, KV pool, slots, rows: sized for max_rows, shared by plans. */
int ms_rt_storage_alloc(struct ms_engine *e, const struct ms_plan *p) {
  const struct ms_model_config *c = &e->m->cfg;
  e->n_bufs = p->n_bufs;
  e->buf = calloc((size_t)p->n_bufs, sizeof *e->buf);
  if (!e->buf) return -ENOMEM;
  for (int b = 0; b < p->n_bufs; b++) {
    if (p->bufs[b].logical) continue;
    e->buf[b] = calloc((size_t)p->bufs[b].planes * (size_t)e->max_rows * (size_t)p->bufs[b].cols, sizeof(float));
    if (!e->buf[b]) return -ENOMEM;
  }
  e->max_pages = (e->o.max_ctx + e->o.page_size - 1) / e->o.page_size;
  e->pool_pages = e->max_pages * e->n_slots;
  size_t kv = (size_t)c->n_layers * (size_t)e->pool_pages * (size_t)e->o.page_size *
              (size_t)c->n_kv_heads * (size_t)c->head_dim;
  if (!e->shape_only) {  /* shapes only: no kernel reads or writes the cache */
    /* In 4 KiB pages, committed as written. In huge pages attention read
     * faster (SmolLM2 decoding 1024 tokens, 100-113 -> 122-126 tokens/s on an
     * Intel Xeon), but each layer's first write into a 2 MiB region faults it
     * in (zeroed, and compacted under THP's defrag=madvise) inside a RoPE
     * task: a spike in one task. Taken back on the suspicion that this made
     * explain name a worker on a healthy engine across ranks
     * (tests/cli_mpi_faults.sh); that test failed the same way later without
     * it, so the suspicion is not borne out. Huge pages with each region
     * faulted in as a slot takes a page (between steps) were tried after:
     * 1024-token decodes level (docs/performance.md, "Fewer tasks an
     * operator"), so small pages stay. */
    size_t el = e->o.kv_f16 ? sizeof(uint16_t) : sizeof(float);
    e->k_pool = calloc(kv, el);
    e->v_pool = calloc(kv, el);
    if (!e->k_pool || !e->v_pool) return -ENOMEM;
    if (e->o.kv_f16) {  /* attention reads a page's rows of a KV head as f32 from here */
      if (!(e->kv_stage = calloc((size_t)e->n_workers, sizeof *e->kv_stage))) return -ENOMEM;
      for (int w = 0; w < e->n_workers; w++)
        if (!(e->kv_stage[w] = malloc((size_t)e->o.page_size * (size_t)c->head_dim * sizeof(float))))
          return -ENOMEM;
    }
  }
  e->free_pages = malloc((size_t)e->pool_pages * sizeof *e->free_pages);
  e->slots = calloc((size_t)e->n_slots, sizeof *e->slots);
  e->row_slot = calloc((size_t)e->max_rows, sizeof(int));
  e->row_pos = calloc((size_t)e->max_rows, sizeof(int));
  e->row_token = calloc((size_t)e->max_rows, sizeof(int));
  e->row_head = calloc((size_t)e->max_rows, sizeof *e->row_head);
  e->row_rope = calloc((size_t)e->max_rows * 2 * (size_t)c->head_dim, sizeof *e->row_rope);
  e->admit_slots = calloc((size_t)e->n_slots, sizeof(int));
  e->row_pages = calloc((size_t)e->max_rows, sizeof(int32_t *));
  e->hook_rows = calloc((size_t)e->max_rows, sizeof *e->hook_rows);
  e->scratch = calloc((size_t)e->n_workers, sizeof *e->scratch);
  if (!e->free_pages || !e->slots || !e->row_slot || !e->row_pos || !e->admit_slots ||
      !e->row_token || !e->row_head || !e->row_rope || !e->row_pages || !e->hook_rows || !e->scratch)
    return -ENOMEM;
  /* pages are handed out lowest first */
  for (int i = 0; i < e->pool_pages; i++) e->free_pages[i] = e->pool_pages - 1 - i;
  e->n_free = e->pool_pages;
  if (ms_pc_init(e)) return -ENOMEM;
  for (int s = 0; s < e->n_slots; s++)
    if (!(e->slots[s].pages = calloc((size_t)e->max_pages, sizeof(int32_t)))) return -ENOMEM;
  size_t scratch = ms_ops_scratch_floats(e->m, e->o.max_ctx);
  for (int w = 0; w < e->n_workers; w++)
    if (!(e->scratch[w] = calloc(scratch, sizeof(float)))) return -ENOMEM;
  if (e->o.fuse_norm && !e->shape_only) {  /* a step's rows, decode or prefill */
    if (!(e->normed = calloc((size_t)e->n_workers, sizeof *e->normed))) return -ENOMEM;
    size_t bytes = ((size_t)e->max_rows * (size_t)c->dim * sizeof(float) + 63) / 64 * 64;
    for (int w = 0; w < e->n_workers; w++)
      if (!(e->normed[w].rows = aligned_alloc(64, bytes))) return -ENOMEM;
  }
  if (e->o.attn_parts > 1 && !e->shape_only) {  /* attention in parts: a slot a part, row and group */
    size_t groups = (size_t)e->max_rows * (size_t)c->n_kv_heads;
    size_t bytes = groups * MS_ATTN_MAX_PARTS * ms_ops_attn_part_floats(e->m) * sizeof(float);
    if (!(e->attn_part = aligned_alloc(64, bytes)) || !(e->attn_done = calloc(groups, sizeof *e->attn_done)))
      return -ENOMEM;
  }
  return e->o.q8_activations && !e->shape_only ? alloc_q8(e) : 0;
}

/* Compiles the prefill plans, smallest bucket first (2 rows up to max_rows),
 * each published by raising prefill_ready to its rows: steps chunk prompts up
 * to the largest one ready and feed one position per step before the first. A
 * plan of many token rows takes seconds to compile, which the engine does not
 * wait for. A failure only leaves the larger buckets unused. */
void *ms_rt_prefill_main(void *arg) {
  struct ms_engine *e = arg;
  for (int i = 1; (1 << i) <= e->max_rows && !atomic_load_explicit(&e->stop_req, memory_order_acquire); i++) {
    char lb[512] = "";
    struct ms_textbuf log = {.buf = lb, .size = sizeof lb};
    struct plan_rt *rt = &e->rt_prefill[i];
    if (ms_rt_plan_init(e, rt, 1 << i, 1, &log)) {
      ms_logf(MS_LOG_WARN, "engine: the prefill plan for %d rows: %s", 1 << i, lb[0] ? lb : "failed");
      ms_rt_plan_free(e, rt);
      memset(rt, 0, sizeof *rt);
      break;
    }
    atomic_store_explicit(&e->prefill_ready, 1 << i, memory_order_release);
  }
  return NULL;
}

void ms_rt_storage_free(struct ms_engine *e) {
  if (e->buf)
    for (int b = 0; b < e->n_bufs; b++) free(e->buf[b]);
  free(e->buf);
  free(e->k_pool);
  free(e->v_pool);
  if (e->kv_stage)
    for (int w = 0; w < e->n_workers; w++) free(e->kv_stage[w]);
  free(e->kv_stage);
  free(e->free_pages);
  ms_pc_free(e);
  if (e->slots)
    for (int s = 0; s < e->n_slots; s++) free(e->slots[s].pages);
  free(e->slots);
  free(e->row_slot);
  free(e->row_pos);
  free(e->row_rope);
  free(e->row_token);
  free(e->row_head);
  free(e->admit_slots);
  free(e->row_pages);
  free(e->hook_rows);
  if (e->scratch)
    for (int w = 0; w < e->o.n_workers; w++) free(e->scratch[w]);
  free(e->scratch);
  if (e->q8)
    for (int w = 0; w < e->o.n_workers; w++) free(e->q8[w]);
  free(e->q8);
  free(e->q8_held);
  if (e->normed)
    for (int w = 0; w < e->o.n_workers; w++) free(e->normed[w].rows);
  free(e->normed);
  free(e->attn_part);
  free(e->attn_done);
}
