/* SPDX-License-Identifier: MIT */
/* The engine's public API: creation (options, plans, storage, then the
 * backend's start), shutdown, and the read-outs (statistics, the step log,
 * pausing at a step, the last stall). The runtime's parts: step.c (the step
 * machine every backend runs), requests.c (requests, slots, KV pages), plans.c
 * (plans and shared storage), backend/cpu.c and backend/sim.c (who runs the
 * SMs, behind struct ms_backend_ops), fault.c, telemetry.c, watchdog.c. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/runtime_impl.h"
#include "runtime/fault.h"

const char *ms_mode_name(enum ms_mode m) { return m == MS_MODE_PER_OP ? "per-op" : "megakernel"; }

int ms_mode_parse(const char *s, enum ms_mode *out) {
  if (!strcmp(s, "megakernel") || !strcmp(s, "mk"))
    *out = MS_MODE_MEGAKERNEL;
  else if (!strcmp(s, "per-op") || !strcmp(s, "perop"))
    *out = MS_MODE_PER_OP;
  else
    return -EINVAL;
  return 0;
}

/* The backend's own tiling where the caller tiles nothing (ms_backend_info,
 * as ms_backend_plan_tiling gives it to a caller's plan) and its attention
 * parts where the caller names none, then its defaults first: it may fix the
 * worker count. */
static void set_defaults(const struct ms_backend_ops *be, struct ms_engine_opts *o) {
  const struct ms_backend_info *bi = &be->info;
  if (bi->tile_bytes && !o->tile_bytes && !o->tile_rows && !o->tiles_per_op) {
    o->tile_bytes = bi->tile_bytes;
    o->min_tiles = bi->min_tiles;
    o->fuse_norm = bi->fuse_norm;
  }
  /* attention's parts whatever the GEMV tiling: the same sums in every plan */
  if (!o->attn_parts) o->attn_parts = bi->attn_parts;
  if (be->defaults) be->defaults(o);
  if (o->n_workers <= 0) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    o->n_workers = n > 0 ? (int)n : 1;
  }
  if (o->max_batch <= 0) o->max_batch = 16;
  if (o->max_ctx <= 0) o->max_ctx = 512;
  if (o->page_size <= 0) o->page_size = 16;
  if (o->shuffle_max_us <= 0) o->shuffle_max_us = 50;
}

struct ms_engine *ms_engine_new(const struct ms_model *m, const struct ms_engine_opts *o,
                                struct ms_textbuf *log) {
  struct ms_engine *e = calloc(1, sizeof *e);
  int rc = -ENOMEM;
  if (!e) return NULL;
  memcpy(&e->o, o, o->sz < sizeof e->o ? o->sz : sizeof e->o);
  e->o.sz = sizeof e->o;
  if (!(e->be = ms_backend_get(e->o.backend))) {
    ms_textbuf_printf(log, "engine: no backend %d\n", (int)e->o.backend);
    rc = -EINVAL;
    goto fail;
  }
  set_defaults(e->be, &e->o);
  e->m = m;
  e->n_workers = e->o.n_workers;
  e->shape_only = e->be->shape_only(&e->o);
  if (!e->shape_only && !m->tok_embd.data) {
    ms_textbuf_printf(log, "engine: model '%s' has shapes only: it can run only on the simulator without --compute\n",
                      m->cfg.name);
    rc = -EINVAL;
    goto fail;
  }
  if (e->o.max_batch > 4096 || e->n_workers > 1024 || e->o.tp > 64 ||
      (!e->o.transport && e->n_workers < e->o.tp)) {  /* across processes: each rank one device */
    ms_textbuf_printf(log, "engine: max_batch %d (at most 4096), workers %d (at most 1024, at least tp %d) out of range\n",
                      e->o.max_batch, e->n_workers, e->o.tp);
    rc = -EINVAL;
    goto fail;
  }
  if (e->o.fuse_norm && !e->be->info.fuse_norm) {
    ms_textbuf_printf(log, "engine: fuse_norm: the %s backend's kernels do not norm their own inputs\n",
                      e->be->info.name);
    rc = -EINVAL;
    goto fail;
  }
  if (e->o.kv_f16 && !e->be->info.kv_f16) {
    ms_textbuf_printf(log, "engine: kv_f16: the %s backend keeps its KV cache in f32\n", e->be->info.name);
    rc = -EINVAL;
    goto fail;
  }
  int most_parts = e->be->info.attn_parts_max > 1 ? e->be->info.attn_parts_max : 1;
  if (e->o.attn_parts < 0 || e->o.attn_parts > most_parts) {
    if (most_parts == 1)
      ms_textbuf_printf(log, "engine: attn_parts %d: the %s backend's kernels take a row's attention in one task\n",
                        e->o.attn_parts, e->be->info.name);
    else
      ms_textbuf_printf(log, "engine: attn_parts %d: the %s backend's kernels merge 1 to %d parts\n",
                        e->o.attn_parts, e->be->info.name, most_parts);
    rc = -EINVAL;
    goto fail;
  }
  if ((rc = ms_rt_dist_check(e, log))) goto fail;
  /* serving across ranks: a follower lays out the prompt chunks rank 0 chose,
   * so every plan it may need is compiled before the first step, on every rank */
  if (e->lead) e->o.prefill_async = 0;
  atomic_init(&e->pause_at, e->o.start_paused ? 0 : UINT64_MAX);
  e->n_slots = ms_bucket_for(e->o.max_batch);
  e->n_buckets = ms_rt_bucket_index(e->n_slots) + 1;
  e->max_rows = e->n_slots;
  if (e->o.max_batched_tokens > 0) {  /* token rows: buffers for the budget's bucket */
    if (e->o.max_batched_tokens > 4096) e->o.max_batched_tokens = 4096;
    int b = ms_bucket_for(e->o.max_batched_tokens);
    if (b > e->max_rows) e->max_rows = b;
  }
  pthread_mutex_init(&e->log_mu, NULL);
  atomic_init(&e->max_queued, MS_QUEUE_DEFAULT);
  if (ms_mpmc_init(&e->mail, MS_QUEUE_CAP) || ms_fq_init(&e->fq, MS_QUEUE_CAP)) goto fail;
  for (int i = 0; i < e->n_buckets; i++) {
    if (i == 0) {
      /* storage first: the plans' runtime contexts point into it */
      struct ms_compile_opts co = {.sz = sizeof co, .batch = 1, .tile_bytes = e->o.tile_bytes,
                                   .tile_rows = e->o.tile_rows, .tiles_per_op = e->o.tiles_per_op,
                                   .min_tiles = e->o.min_tiles, .fuse_norm = e->o.fuse_norm,
                                   .attn_parts = e->o.attn_parts, .tp = e->o.tp, .tp_split = e->tx != NULL};
      struct ms_plan *p0 = ms_plan_compile(m, &co, log);
      if (!p0) {
        rc = -errno;
        goto fail;
      }
      rc = ms_rt_storage_alloc(e, p0);
      ms_plan_free(p0);
      if (rc) goto fail;
    }
    if ((rc = ms_rt_plan_init(e, &e->rt[i], 1 << i, 0, log))) goto fail;
  }
  if ((rc = ms_rt_lead_init(e))) goto fail;
  e->hooks = ms_hook_table_new(e->n_workers);
  atomic_init(&e->hooks_on, 1);
  e->workers = calloc((size_t)e->n_workers, sizeof *e->workers);
  if (!e->hooks || !e->workers) goto fail;
  for (int w = 0; w < e->n_workers; w++) e->workers[w].e = e, e->workers[w].pinned_cpu = -1;
  if ((rc = ms_tel_init(e))) goto fail;
  if ((rc = ms_fault_init(e, log))) goto fail;
  for (int w = 0; w < e->n_workers; w++) {
    struct worker *wk = &e->workers[w];
    wk->e = e;
    wk->id = w;
    wk->device = ms_rt_device(e, w);
    wk->rng = (e->o.seed + 1) * 0x9e3779b97f4a7c15ull ^ (uint64_t)(w + 1) * 0xbf58476d1ce4e5b9ull;
    if (!wk->rng) wk->rng = 1;
    atomic_init(&wk->running, -1);
    atomic_init(&wk->waiting, -1);
  }
  if (e->o.max_batched_tokens > 1 && !e->o.prefill_async) ms_rt_prefill_main(e);
  ms_rt_dist_weights(e);  /* the plans compiled so far: a rank packs the rows they read */
  if (e->o.max_batched_tokens > 1 && e->o.prefill_async)  /* compiled while the engine already serves */
    e->prefill_thread = !pthread_create(&e->prefill_th, NULL, ms_rt_prefill_main, e);
  if ((rc = e->be->start(e, log))) goto fail;
  if (e->o.watchdog_ms > 0) {
    e->watchdog_on = !pthread_create(&e->watchdog, NULL, ms_watchdog_main, e);
  }
  return e;
fail:
  ms_textbuf_printf(log, "engine: %s\n", ms_strerror(rc));
  ms_tel_free(e);
  free(e->workers);
  e->workers = NULL;
  for (int i = 0; i < e->n_buckets; i++) ms_rt_plan_free(e, &e->rt[i]);
  e->n_buckets = 0;
  ms_engine_free(e);
  errno = -rc;
  return NULL;
}

void ms_engine_free(struct ms_engine *e) {
  if (!e) return;
  atomic_store_explicit(&e->stop_req, 1, memory_order_release);
  atomic_fetch_add_explicit(&e->pause_seq, 1, memory_order_release);
  ms_futex_wake_all(&e->pause_seq);
  atomic_fetch_add_explicit(&e->mail_seq, 1, memory_order_release);
  ms_futex_wake_all(&e->mail_seq);
  if (e->be_ctx) e->be->stop(e);  /* the step in flight ends, then the stop step */
  if (e->prefill_thread) pthread_join(e->prefill_th, NULL);  /* stops after the plan it compiles */
  if (e->watchdog_on) {
    atomic_store(&e->wd_stop, 1);
    ms_futex_wake_all(&e->wd_stop);
    pthread_join(e->watchdog, NULL);
  }
  ms_tel_free(e);
  ms_fault_free(e);
  free(e->workers);
  for (int i = 0; i < e->n_buckets; i++) ms_rt_plan_free(e, &e->rt[i]);
  for (int i = 0; i < MS_MAX_BUCKETS; i++)
    if (e->rt_prefill[i].plan) ms_rt_plan_free(e, &e->rt_prefill[i]);
  ms_hook_table_free(e->hooks);
  ms_rt_storage_free(e);
  ms_rt_lead_free(e);
  free(e->wrows);
  ms_mpmc_destroy(&e->mail);
  ms_fq_free(&e->fq);
  pthread_mutex_destroy(&e->log_mu);
  free(e);
}

int ms_engine_n_workers(const struct ms_engine *e) { return e->n_workers; }

size_t ms_engine_kv_position_bytes(const struct ms_model *m, int kv_f16) {
  const struct ms_model_config *c = &m->cfg;
  return (size_t)c->n_layers * 2 * (size_t)c->n_kv_heads * (size_t)c->head_dim *
         (kv_f16 ? sizeof(uint16_t) : sizeof(float));
}
const struct ms_model *ms_engine_model(const struct ms_engine *e) { return e->m; }
enum ms_mode ms_engine_mode(const struct ms_engine *e) { return e->o.mode; }

const struct ms_plan *ms_engine_plan(const struct ms_engine *e, int rows) {
  int i = ms_rt_bucket_index(rows < 1 ? 1 : rows);
  return i < e->n_buckets ? e->rt[i].plan : NULL;
}

int ms_engine_sample_kernels(const struct ms_engine *e, int *kernel, int max) {
  int32_t run[1024], wait[1024];
  int n = e->n_workers < max ? e->n_workers : max;
  if (n > 1024) n = 1024;
  struct ms_engine *m = (struct ms_engine *)e;
  const struct ms_plan *p = NULL;
  if (e->be->sample && e->be_ctx) {
    n = e->be->sample(e->be_ctx, &p, run, wait, n);
  } else {
    const struct plan_rt *rt = atomic_load_explicit(&m->cur, memory_order_relaxed);
    p = rt ? rt->plan : NULL;
    for (int w = 0; w < n; w++) {
      run[w] = atomic_load_explicit(&m->workers[w].running, memory_order_relaxed);
      wait[w] = atomic_load_explicit(&m->workers[w].waiting, memory_order_relaxed);
    }
  }
  for (int w = 0; w < n; w++)
    kernel[w] = p && run[w] >= 0 && run[w] < p->n_tasks ? (int)p->tasks[run[w]].kernel : wait[w] != -1 ? -1 : -2;
  return n;
}

/* ---- read-outs and faults ---- */

void ms_engine_get_stats(const struct ms_engine *e, struct ms_engine_stats *out) {
  struct ms_engine *m = (struct ms_engine *)e;
  memset(out, 0, sizeof *out);
  out->steps = atomic_load(&m->steps);
  out->tokens = atomic_load(&m->tokens);
  out->positions = atomic_load(&m->positions);
  out->stalls = atomic_load(&m->stalls);
  out->n_workers = e->n_workers;
  for (int w = 0; w < e->n_workers; w++) out->tasks += atomic_load(&m->workers[w].tasks_done);
  out->running = atomic_load_explicit(&m->stat_running, memory_order_relaxed);
  int queued = atomic_load_explicit(&m->queued, memory_order_relaxed);
  out->waiting = queued > 0 ? queued : 0;
  out->kv_pages_used = atomic_load_explicit(&m->stat_pages_used, memory_order_relaxed);
  out->kv_pages = e->pool_pages;
  out->prefix_queries = atomic_load_explicit(&m->pc.queries, memory_order_relaxed);
  out->prefix_hits = atomic_load_explicit(&m->pc.hits, memory_order_relaxed);
  out->prefix_evictions = atomic_load_explicit(&m->pc.evictions, memory_order_relaxed);
  out->prefix_hit_requests = atomic_load_explicit(&m->pc.hit_requests, memory_order_relaxed);
  out->prefix_pages_cached = atomic_load_explicit(&m->pc.idle, memory_order_relaxed);
  out->prefix_cache = e->pc.on;
  out->preemptions = 0;  /* the pool holds every slot's whole context: nothing is preempted */
}

int ms_engine_set_max_queued(struct ms_engine *e, int n) {
  n = n < 1 ? 1 : n > MS_QUEUE_CAP ? MS_QUEUE_CAP : n;
  atomic_store_explicit(&e->max_queued, n, memory_order_relaxed);  /* read by submit alone */
  return n;
}

int ms_engine_step_log(const struct ms_engine *e, struct ms_step_record *out, int max) {
  struct ms_engine *m = (struct ms_engine *)e;
  pthread_mutex_lock(&m->log_mu);
  uint64_t n = m->step_log_n, have = n < MS_STEP_LOG ? n : MS_STEP_LOG;
  if ((uint64_t)max > have) max = (int)have;
  for (int i = 0; i < max; i++) out[i] = m->step_log[(n - (uint64_t)max + (uint64_t)i) % MS_STEP_LOG];
  pthread_mutex_unlock(&m->log_mu);
  return max;
}

int ms_engine_set_task_delay(struct ms_engine *e, int rows, int task, uint64_t ns) {
  int i = ms_rt_bucket_index(rows < 1 ? 1 : rows);
  if (i >= e->n_buckets) return -EINVAL;
  struct plan_rt *rt = &e->rt[i];
  if (task < 0 || task >= rt->plan->n_tasks) return -EINVAL;
  /* Set before the plan runs (the array is read by workers without locks). */
  if (!rt->delay_ns && !(rt->delay_ns = calloc((size_t)rt->plan->n_tasks, sizeof(uint64_t)))) return -ENOMEM;
  rt->delay_ns[task] = ns;
  return 0;
}

int ms_engine_pause_at(struct ms_engine *e, uint64_t step) {
  atomic_store_explicit(&e->pause_at, step, memory_order_release);
  /* an engine paused at an earlier step goes on to this one */
  atomic_fetch_add_explicit(&e->pause_seq, 1, memory_order_release);
  ms_futex_wake_all(&e->pause_seq);
  return 0;
}

int ms_engine_wait_paused(struct ms_engine *e, int timeout_ms) {
  uint64_t until = timeout_ms >= 0 ? ms_now_ns() + (uint64_t)timeout_ms * 1000000ull : UINT64_MAX;
  for (;;) {
    uint32_t p = atomic_load_explicit(&e->paused, memory_order_acquire);
    uint64_t at = atomic_load_explicit(&e->pause_at, memory_order_acquire);
    if (p && p - 1 >= at) return 0;  /* paused at (or past) the requested step */
    if (ms_now_ns() >= until) return -ETIMEDOUT;
    ms_futex_wait(&e->paused, p, 50);
  }
}

int ms_engine_resume(struct ms_engine *e) {
  atomic_store_explicit(&e->pause_at, UINT64_MAX, memory_order_release);
  atomic_fetch_add_explicit(&e->pause_seq, 1, memory_order_release);
  ms_futex_wake_all(&e->pause_seq);
  return 0;
}

uint64_t ms_engine_sim_now(const struct ms_engine *e) {
  return e->be->info.virtual_clock && e->be_ctx ? ms_eng_now(e) : 0;
}

uint64_t ms_engine_last_stall(const struct ms_engine *e, char *buf, size_t n) {
  struct ms_engine *m = (struct ms_engine *)e;
  pthread_mutex_lock(&m->log_mu);
  snprintf(buf, n, "%s", m->stall_report);
  pthread_mutex_unlock(&m->log_mu);
  return atomic_load(&m->stalls);
}
