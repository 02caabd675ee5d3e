/* SPDX-License-Identifier: MIT */
/* The CUDA backend: the engine's step machine on one host thread (the driver),
 * each step's tasks on the GPU (megascope/cuda.h's fed mode).
 *
 * The driver plays worker 0 of the CPU engine: ms_rt_step_end and
 * ms_rt_step_begin (retire, admit, lay out the rows with their KV pages), then
 * publish_step hands the rows to the resident kernel and the driver waits for
 * the step's end. The device runs every task of its plan (compiled once for
 * max_batch rows; rows past the step's are padding, which its tasks skip) and
 * draws each row's token with the request's sampler (megascope/sample.h's,
 * token for token: the seed, the draw number and the parameters go with the
 * row), so only token ids come back; a row whose request needs its logits
 * (penalties, logit bias, logprobs, recorded logits), or whose draw the
 * device found too close to call, comes back as logits and the driver samples
 * it with the CPU engine's own code (ms_rt_task_body on the bucket plan's
 * sample tasks). Either way a seed draws the same tokens on every backend. The engine's slots
 * and page ids are the device's: the device's page table takes the page of
 * each row's position as the row reaches it.
 *
 * Monitors: the hook table stays their registry, with this backend as its
 * runner (hook/hook_impl.h): each generation's programs run on the device with
 * the table's maps as their host side, copied back before read-outs and every
 * 100 ms; the request hook's events, which happen here, are handed over for
 * the device to fire: admissions and retirements with the step's rows, a
 * step's tokens with the next step's (or at once when the engine is about to
 * go idle), each with its own step number. The always-on aggregates are the
 * device's counts.
 *
 * Faults: the task delays, delayed_release and slow_request as tables the
 * device applies (ms_fault_table_new); late_admission in the shared admission.
 *
 * The task trace: while one is recorded each step is handed over traced; the
 * device's records of it (in the host's clock) go to the engine's workers'
 * buffers as the CPU's would, after the step: one host worker per device
 * worker, and the engine's largest bucket plan is the device's (the same
 * compile: cuda_defaults gives the device's tiling; checked at the start).
 *
 * Not here yet: chunked prefill (prompts feed one position a step), tensor
 * parallelism and the other fault types (refused at the start). */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "megascope/cuda.h"
#include "runtime/runtime_impl.h"
#include "runtime/fault.h"

/* An attachment of the hook table and its id on the device. */
struct dev_att {
  int id, dev_id, attached;
};

struct cuda_be {
  struct ms_engine *e;
  struct ms_cuda_engine *dev;
  pthread_t th;
  pthread_mutex_t mu;         /* atts */
  struct dev_att *atts;
  int n_atts, cap_atts;
  uint64_t t_synced;          /* the driver's last copy of the device's maps and totals */
  uint64_t *cls_tot, *ev_tot; /* the device's aggregates, copied (NULL: its plan's classes differ) */
  struct ms_cuda_row *rows;   /* [n_slots] the step being handed over */
  /* request events for the device's request hook (the host's sites stay
   * off): each slot's request generation as last handed over (0: none),
   * whether its finish was told, the tokens each row had before sampling */
  struct ms_cuda_event *ev;   /* [3 * n_slots] */
  int n_ev;
  uint32_t *told_gen;
  uint8_t *told_done;
  int *tokens_before;         /* [n_slots] by row */
  int handed;                 /* publish_step handed a step over: the driver waits for it */
  int traceable;              /* the device's plan is the engine's largest bucket's (trace records name its tasks) */
  int failed;                 /* the device failed: the engine stops */
  char log_text[4096];
};

static struct ms_textbuf driver_log(struct cuda_be *c) {
  c->log_text[0] = 0;
  return (struct ms_textbuf){.buf = c->log_text, .size = sizeof c->log_text};
}

/* A device that failed stops the engine: its report is the engine's last stall,
 * and the next step start cancels every request. */
static void device_failed(struct cuda_be *c) {
  struct ms_engine *e = c->e;
  c->failed = 1;
  pthread_mutex_lock(&e->log_mu);
  snprintf(e->stall_report, sizeof e->stall_report, "%s", c->log_text);
  pthread_mutex_unlock(&e->log_mu);
  atomic_fetch_add(&e->stalls, 1);
  atomic_store_explicit(&e->stop_req, 1, memory_order_release);
}

static void add_event(struct cuda_be *c, int phase, int slot, uint32_t gen, int token) {
  uint64_t step = atomic_load_explicit(&c->e->cur_step, memory_order_relaxed);
  if (c->n_ev < 3 * c->e->n_slots)
    c->ev[c->n_ev++] = (struct ms_cuda_event){.phase = phase, .slot = slot, .token = token, .gen = gen, .step = step};
}

/* Whether a program on the request hook is attached (the table's set: its
 * own sites are off, the device runs them). */
static int request_hooked(const struct ms_engine *e) {
  const struct hook_set *h = atomic_load_explicit(&e->hooks->set[MS_HOOK_REQUEST], memory_order_acquire);
  return h && h->n > 0;
}

/* Slots emptied or refilled since the last handover: finished (a cancel
 * retires without a last token) and admitted, as the CPU engine's step start
 * reports them. */
static void slot_events(struct cuda_be *c) {
  struct ms_engine *e = c->e;
  for (int s = 0; s < e->n_slots; s++) {
    uint32_t now = e->slots[s].req ? e->slots[s].gen : 0;
    if (now == c->told_gen[s]) continue;
    if (c->told_gen[s] && !c->told_done[s]) add_event(c, MS_REQ_FINISHED, s, c->told_gen[s], 0);
    if (now) add_event(c, MS_REQ_ADMITTED, s, now, 0);
    c->told_gen[s] = now;
    c->told_done[s] = 0;
  }
}

/* Row r of the step as the device runs it: where it is, and how its token
 * is drawn (the request's sampler; greedy at a prompt position, whose draw
 * nobody uses; the host's when the request needs the logits). */
static void fill_row(struct ms_engine *e, int r, struct ms_cuda_row *q) {
  int s = e->row_slot[r], pos = e->row_pos[r];
  *q = (struct ms_cuda_row){.slot = s, .pos = pos, .token = e->row_token[r]};
  if (s < 0) return;
  const struct slot *sl = &e->slots[s];
  const struct ms_request *req = sl->req;
  q->gen = sl->gen;
  q->page = sl->pages[pos / e->o.page_size];
  q->host_draws = ms_rt_needs_logits(req);
  if (pos + 1 < req->n_prompt) return;
  q->temperature = req->sample.temperature;
  q->top_k = req->sample.top_k;
  q->top_p = req->sample.top_p;
  q->min_p = req->sample.min_p;
  q->seed = req->sample.seed;
  q->draw = (uint64_t)atomic_load_explicit(&req->n_tokens, memory_order_relaxed);
}

/* The step start published a step: its rows to the device, with the request
 * events since the last handover (the last step's tokens first). */
static void cuda_publish_step(void *ctx) {
  struct cuda_be *c = ctx;
  struct ms_engine *e = c->e;
  c->handed = 0;
  if (atomic_load_explicit(&e->cur_stop, memory_order_relaxed) || c->failed) return;
  struct plan_rt *rt = atomic_load_explicit(&e->cur, memory_order_relaxed);
  int n = rt->x.meta.n_rows;
  slot_events(c);
  for (int r = 0; r < n; r++) fill_row(e, r, &c->rows[r]);
  if (c->traceable) ms_cuda_feed_trace(c->dev, atomic_load_explicit(&e->trace_on, memory_order_relaxed));
  struct ms_textbuf log = driver_log(c);
  if (ms_cuda_feed_step(c->dev, atomic_load_explicit(&e->cur_step, memory_order_relaxed), c->rows, n, c->ev,
                        request_hooked(e) ? c->n_ev : 0, &log))
    device_failed(c);
  else
    c->handed = 1;
  c->n_ev = 0;
}

/* One device record of the step just waited for, into its worker's trace
 * buffer as the CPU engine's ms_tel_task writes it (the rows are the step's:
 * the driver drains before it lays out the next). */
static void trace_put(void *user, int w, const struct ms_cuda_trace_rec *d) {
  struct cuda_be *c = user;
  struct ms_engine *e = c->e;
  const struct plan_rt *rt = &e->rt[e->n_buckets - 1];
  if (w < 0 || w >= e->n_workers || d->task >= (uint32_t)rt->plan->n_tasks) return;
  struct worker *wk = &e->workers[w];
  if (!ms_tel_enter(wk)) return;
  struct trace_rec *r = ms_tel_slot(wk);
  if (r) {
    const struct ms_task *k = &rt->plan->tasks[d->task];
    const struct plan_rt *cur = atomic_load_explicit(&e->cur, memory_order_relaxed);
    int row = k->tile[1], live = row >= 0 && row < cur->x.meta.n_rows;
    ms_tel_fill(r, rt->plan, (int)d->task, d->t_begin, d->t_end, d->t_ready, d->step, d->wait_ns,
                live ? c->rows[row].slot : -1, live ? c->rows[row].gen : 0);
    if (d->fired && k->trigger >= 0) r->fired_ev = (uint32_t)k->trigger;
    atomic_store_explicit(&wk->trace_n, atomic_load_explicit(&wk->trace_n, memory_order_relaxed) + 1,
                          memory_order_release);
  }
  ms_tel_leave(wk);
}

static void drain_trace(struct cuda_be *c) {
  uint64_t lost = 0;
  if (!c->traceable || ms_cuda_feed_trace_drain(c->dev, trace_put, c, &lost) || !lost) return;
  atomic_fetch_add_explicit(&c->e->workers[0].trace_dropped, lost, memory_order_relaxed);
}

/* The step's rows: the device's tokens, or drawn here from their logits as
 * the CPU engine's sample tasks do. */
static void sample_rows(struct cuda_be *c, struct plan_rt *rt, const int32_t *tokens, const float *logits) {
  struct ms_engine *e = c->e;
  const struct ms_plan *p = rt->plan;
  const size_t V = (size_t)e->m->cfg.vocab;
  int n = rt->x.meta.n_rows;
  for (int r = 0; r < n; r++) {
    const struct slot *sl = e->row_slot[r] >= 0 ? &e->slots[e->row_slot[r]] : NULL;
    c->tokens_before[r] = sl ? atomic_load_explicit(&sl->req->n_tokens, memory_order_relaxed) : 0;
  }
  for (int t = 0; t < p->n_tasks; t++) {
    const struct ms_task *k = &p->tasks[t];
    if (k->kernel != MS_K_SAMPLE || k->tile[1] >= n) continue;
    int row = k->tile[1];
    if (tokens[row] >= 0 && !c->rows[row].host_draws) {
      ms_rt_sample_drawn(&e->workers[0], rt, row, tokens[row]);
      continue;
    }
    memcpy(ms_buf_row(&rt->x, p->classes[k->cls].in, 0, row), logits + (size_t)row * V, V * sizeof(float));
    ms_rt_task_body(&e->workers[0], rt, t);
  }
}

static int all_finishing(const struct ms_engine *e);

/* The tokens the step's rows drew, and the finishes they made, for the
 * device's request hook (the CPU engine fires them as it samples, in this
 * step): they go with the next step's handover, which the device fires
 * before that step, each with this step's number, so no round trip of their
 * own, but at once (as events alone) when no request goes on, or a map
 * read-out while the engine idles would miss them. */
static int token_events(struct cuda_be *c, struct plan_rt *rt) {
  struct ms_engine *e = c->e;
  for (int r = 0; r < rt->x.meta.n_rows; r++) {
    int s = e->row_slot[r];
    if (s < 0) continue;
    const struct slot *sl = &e->slots[s];
    int k = c->tokens_before[r];
    if (atomic_load_explicit(&sl->req->n_tokens, memory_order_relaxed) > k)
      add_event(c, k ? MS_REQ_TOKEN : MS_REQ_FIRST_TOKEN, s, sl->gen, sl->req->tokens[k]);
    if (sl->finishing && !c->told_done[s]) {
      add_event(c, MS_REQ_FINISHED, s, sl->gen, 0);
      c->told_done[s] = 1;
    }
  }
  if (!c->n_ev || !all_finishing(e)) return 0;
  struct ms_textbuf log = driver_log(c);
  const float *unused;
  const int32_t *none;
  uint64_t step = atomic_load_explicit(&e->cur_step, memory_order_relaxed);
  int rc = ms_cuda_feed_step(c->dev, step, NULL, 0, c->ev, c->n_ev, &log) ||
           ms_cuda_feed_wait(c->dev, &none, &unused, &log);
  c->n_ev = 0;
  return rc ? -1 : 0;
}

/* ---- monitors: the hook table's programs run on the device ---- */

static struct dev_att *dev_att_find(struct cuda_be *c, int id) {
  for (int i = 0; i < c->n_atts; i++)
    if (c->atts[i].id == id) return &c->atts[i];
  return NULL;
}

/* The table's new generation g: its programs on the device, with its maps.
 * The table's lock orders take, drop and forget among themselves; c->mu only
 * guards the list, never a call into the device, so the driver's periodic
 * copy (sync_all) never waits behind an attach's copies. */
static int cuda_take(void *ctx, int id, struct ms_gen *g, int replace, struct ms_textbuf *log) {
  struct cuda_be *c = ctx;
  if (c->e->o.mode == MS_MODE_PER_OP) {
    ms_textbuf_printf(log, "engine: the CUDA backend's per-op mode has no hook sites (attach on the megakernel)\n");
    return -MS_E_UNSUPP;
  }
  pthread_mutex_lock(&c->mu);
  struct dev_att *a = dev_att_find(c, id);
  int dev_id = a ? a->dev_id : 0, rc = 0;
  if (!replace && c->n_atts == c->cap_atts) {
    struct dev_att *n = realloc(c->atts, sizeof *n * (size_t)(c->cap_atts * 2 + 8));
    if (n) {
      c->atts = n;
      c->cap_atts = c->cap_atts * 2 + 8;
    } else {
      rc = -ENOMEM;
    }
  }
  pthread_mutex_unlock(&c->mu);
  if (rc) return rc;
  if (replace) return dev_id ? ms_cuda_replace_shared(c->dev, dev_id, g->mon, g->maps, g->n_maps, &g->opts, log)
                             : -ENOENT;
  if ((dev_id = ms_cuda_attach_shared(c->dev, g->mon, g->maps, g->n_maps, &g->opts, log)) <= 0) return dev_id;
  pthread_mutex_lock(&c->mu);
  c->atts[c->n_atts++] = (struct dev_att){.id = id, .dev_id = dev_id, .attached = 1};
  pthread_mutex_unlock(&c->mu);
  return 0;
}

/* The device id of id's attachment, 0 when there is none (or it is detached
 * and attached_only). */
static int dev_id_of(struct cuda_be *c, int id, int attached_only) {
  pthread_mutex_lock(&c->mu);
  struct dev_att *a = dev_att_find(c, id);
  int d = a && (a->attached || !attached_only) ? a->dev_id : 0;
  pthread_mutex_unlock(&c->mu);
  return d;
}

/* Detach: the device lets go; its last map contents are in the table's maps. */
static void cuda_drop(void *ctx, int id) {
  struct cuda_be *c = ctx;
  int d = dev_id_of(c, id, 1);
  if (!d) return;
  pthread_mutex_lock(&c->mu);
  struct dev_att *a = dev_att_find(c, id);
  if (a) a->attached = 0;  /* the driver stops copying it first */
  pthread_mutex_unlock(&c->mu);
  ms_cuda_detach(c->dev, d);
}

static int cuda_mon_coverage(void *ctx, int id, uint32_t generation, struct ms_coverage *out) {
  struct cuda_be *c = ctx;
  int d = dev_id_of(c, id, 0);
  return d ? ms_cuda_coverage_of(c->dev, d, generation, out) : -ENOENT;
}

/* The table freed a detached attachment: so does the device side. */
static void cuda_forget(void *ctx, int id) {
  struct cuda_be *c = ctx;
  pthread_mutex_lock(&c->mu);
  struct dev_att *a = dev_att_find(c, id);
  int d = a && !a->attached ? a->dev_id : 0;
  if (d) *a = c->atts[--c->n_atts];
  pthread_mutex_unlock(&c->mu);
  if (d) ms_cuda_forget(c->dev, d);
}

/* A detached attachment's maps were brought back at its detach. */
static int cuda_mon_sync(void *ctx, int id) {
  struct cuda_be *c = ctx;
  if (!dev_id_of(c, id, 0)) return -ENOENT;
  int d = dev_id_of(c, id, 1);
  return d ? ms_cuda_sync_maps(c->dev, d) : 0;
}

/* Readers of the maps' memfds see the device's counts at most 100 ms old. */
#define SYNC_EVERY_NS 100000000ull

/* The device's running totals become worker 0's always-on aggregates (the
 * one host worker: class_stats and Prometheus sum over workers). */
static void copy_totals(struct cuda_be *c) {
  struct ms_engine *e = c->e;
  if (!c->cls_tot || ms_cuda_feed_totals(c->dev, c->cls_tot, c->ev_tot)) return;
  struct worker *w = &e->workers[0];
  uint64_t tasks = 0;
  for (int k = 0; k < e->n_classes; k++) {
    const uint64_t *v = c->cls_tot + 4 * (size_t)k;
    atomic_store_explicit(&w->acc[k].tasks, v[0], memory_order_relaxed);
    atomic_store_explicit(&w->acc[k].task_ns, v[1], memory_order_relaxed);
    atomic_store_explicit(&w->acc[k].queue_ns, v[2], memory_order_relaxed);
    atomic_store_explicit(&w->acc[k].wait_ns, v[3], memory_order_relaxed);
    tasks += v[0];
  }
  for (int k = 0; k < e->n_ev_classes; k++) {
    atomic_store_explicit(&w->ev_acc[k].tasks, c->ev_tot[2 * (size_t)k], memory_order_relaxed);
    atomic_store_explicit(&w->ev_acc[k].wait_ns, c->ev_tot[2 * (size_t)k + 1], memory_order_relaxed);
  }
  atomic_store_explicit(&w->tasks_done, tasks, memory_order_relaxed);
}

/* Whether every request in a slot has its last token: the engine may go idle
 * after this step (read-outs then see the device's final figures). */
static int all_finishing(const struct ms_engine *e) {
  for (int s = 0; s < e->n_slots; s++)
    if (e->slots[s].req && !e->slots[s].finishing) return 0;
  return 1;
}

static void sync_all(struct cuda_be *c) {
  uint64_t now = ms_now_ns();
  if (now - c->t_synced < SYNC_EVERY_NS && !all_finishing(c->e)) return;
  c->t_synced = now;
  copy_totals(c);
  int ids[64], n = 0;
  for (int i = 0;; i += n) {  /* the list's ids in batches: no lock across a copy */
    pthread_mutex_lock(&c->mu);
    n = 0;
    for (int k = i; k < c->n_atts && n < 64; k++) ids[n++] = c->atts[k].attached ? c->atts[k].dev_id : 0;
    pthread_mutex_unlock(&c->mu);
    /* skipped, not waited for, while an attach holds the device's table: the next 100 ms retry */
    for (int k = 0; k < n; k++)
      if (ids[k]) ms_cuda_sync_maps_try(c->dev, ids[k]);
    if (n < 64) break;
  }
}

static void *driver_main(void *arg) {
  struct cuda_be *c = arg;
  struct ms_engine *e = c->e;
  for (;;) {
    ms_rt_step_end(e);
    if (!ms_rt_step_begin(e)) break;
    if (!c->handed) continue;  /* the device failed: the next start stops */
    const float *logits = NULL;
    const int32_t *tokens = NULL;
    struct ms_textbuf log = driver_log(c);
    if (ms_cuda_feed_wait(c->dev, &tokens, &logits, &log)) {
      device_failed(c);
      continue;
    }
    drain_trace(c);
    struct plan_rt *rt = atomic_load_explicit(&e->cur, memory_order_relaxed);
    sample_rows(c, rt, tokens, logits);
    if (request_hooked(e) && token_events(c, rt)) {
      device_failed(c);
      continue;
    }
    sync_all(c);
  }
  copy_totals(c);  /* the last steps' */
  return NULL;
}

/* ---- the table ---- */

static uint64_t cuda_now(const void *ctx) {
  (void)ctx;
  return ms_now_ns();
}

/* One host thread (the driver) and a worker for each of the device's (its
 * trace and per-worker figures); rows are slots (no chunked prefill yet). The
 * plans are tiled as the device's (ms_cuda_engine_new's default), so that the
 * largest bucket's is the device's. A tp asked for keeps its workers, so that
 * the start refuses it by name. */
/* The faults the device's tables carry (ms_fault_table_new). */
static int cuda_injects(int fault_type) { return ms_fault_on_device((enum ms_fault_type)fault_type); }

static int cuda_device(struct ms_device_info *out, char *why, size_t n) {
  struct ms_cuda_device d;
  int rc = ms_cuda_device_info(&d, why, n);
  if (rc) return rc;
  snprintf(out->name, sizeof out->name, "%s", d.name);
  out->sms = d.sms;
  out->major = d.major;
  out->minor = d.minor;
  out->mem_gib = d.mem_gib;
  out->peak_gbs = d.peak_gbs;
  return 0;
}

static void cuda_defaults(struct ms_engine_opts *o) {
  int w = ms_cuda_workers(o->cuda_sms);
  o->n_workers = o->tp > 1 ? o->tp : w > 0 ? w : 1;
  if (o->tiles_per_op <= 0 && w > 0) o->tiles_per_op = w;
  o->max_batched_tokens = 0;
  /* the device's page table learns a slot's pages from its rows, and a cached
   * prefix has no rows: not yet here */
  o->prefix_cache = 0;
}

/* Whether the device's plan is the engine's largest bucket plan, task for task. */
static int same_plan(const struct ms_plan *a, const struct ms_plan *b) {
  if (a->n_tasks != b->n_tasks || a->n_events != b->n_events || a->batch != b->batch) return 0;
  for (int t = 0; t < a->n_tasks; t++) {
    const struct ms_task *x = &a->tasks[t], *y = &b->tasks[t];
    if (x->kernel != y->kernel || x->cls != y->cls || x->wait != y->wait || x->trigger != y->trigger ||
        x->tile[1] != y->tile[1] || x->launch != y->launch)
      return 0;
  }
  return 1;
}

/* What the device's workers run: their heartbeats (ms_engine_sample_kernels). */
static int cuda_sample(void *ctx, const struct ms_plan **plan, int32_t *running, int32_t *waiting, int n) {
  struct cuda_be *c = ctx;
  *plan = ms_cuda_plan(c->dev);
  return ms_cuda_sample(c->dev, running, waiting, n);
}

/* A task trace needs the megakernel and the device's plan named by the engine's. */
static int cuda_can_trace(const struct ms_engine *e) {
  const struct cuda_be *c = e->be_ctx;
  return c && c->traceable;
}

/* The host runs no kernel and keeps no KV cache: the device does both. */
static int cuda_shape_only(const struct ms_engine_opts *o) {
  (void)o;
  return 1;
}

static void cuda_fired(void *ctx, struct plan_rt *rt, int ev) {
  (void)ctx;
  (void)rt;
  (void)ev;
}

static int cuda_defer_trigger(void *ctx, struct worker *w, int producer, uint64_t delay_ns) {
  (void)ctx;
  (void)w;
  (void)producer;
  (void)delay_ns;
  return 0;  /* never reached: faults are refused at the start */
}

static void cuda_poll_at(void *ctx, uint64_t at) {
  (void)ctx;
  (void)at;
}

static void cuda_free(struct cuda_be *c) {
  if (!c) return;
  if (c->dev) {
    ms_cuda_feed_stop(c->dev, NULL);
    ms_cuda_engine_free(c->dev);
  }
  free(c->rows);
  free(c->ev);
  free(c->told_gen);
  free(c->told_done);
  free(c->tokens_before);
  free(c->cls_tot);
  free(c->ev_tot);
  free(c->atts);
  pthread_mutex_destroy(&c->mu);
  free(c);
}

/* What the handovers cost and what crossed the bus, for the log (the
 * device check reads it from `megascope run --backend cuda`). */
static void log_handover(struct cuda_be *c) {
  struct ms_cuda_stats st;
  ms_cuda_get_stats(c->dev, &st);
  if (!st.fed_steps) return;
  ms_logf(MS_LOG_INFO,
          "cuda: %llu steps handed over: handover %.1f us a step (largest %.1f), device %.1f us a step; "
          "rows drawn on the device %llu, on the host %llu",
          (unsigned long long)st.fed_steps, (double)st.handover_ns / 1e3 / (double)st.fed_steps,
          (double)st.handover_max_ns / 1e3, (double)st.device_step_ns / 1e3 / (double)st.fed_steps,
          (unsigned long long)st.rows_device_drawn, (unsigned long long)st.rows_host_drawn);
}

static void cuda_stop(struct ms_engine *e) {
  struct cuda_be *c = e->be_ctx;
  pthread_join(c->th, NULL);
  e->be_ctx = NULL;
  log_handover(c);
  cuda_free(c);
}

/* What this backend does not run yet, refused by name. */
static int cuda_refuses(const struct ms_engine *e, struct ms_textbuf *log) {
  const char *why = !e->m->tok_embd.data                       ? "a model with shapes only (no weights to upload)"
                    : e->o.tp > 1                               ? "tensor parallelism (tp > 1)"
                    : e->faults && e->o.mode == MS_MODE_PER_OP ? "fault injection in per-op mode"
                    : e->o.shuffle                              ? "shuffled placement"
                                                                : NULL;
  if (why) ms_textbuf_printf(log, "engine: the CUDA backend does not run %s\n", why);
  return why ? -MS_E_UNSUPP : 0;
}

static int cuda_start(struct ms_engine *e, struct ms_textbuf *log) {
  int rc = cuda_refuses(e, log);
  if (rc) return rc;
  struct cuda_be *c = calloc(1, sizeof *c);
  if (!c) return -ENOMEM;
  c->e = e;
  pthread_mutex_init(&c->mu, NULL);
  const size_t S = (size_t)e->n_slots;
  c->rows = calloc(S, sizeof *c->rows);
  c->ev = calloc(3 * S, sizeof *c->ev);
  c->told_gen = calloc(S, sizeof *c->told_gen);
  c->told_done = calloc(S, sizeof *c->told_done);
  c->tokens_before = calloc(S, sizeof *c->tokens_before);
  if (!c->rows || !c->ev || !c->told_gen || !c->told_done || !c->tokens_before) {
    cuda_free(c);
    return -ENOMEM;
  }
  struct ms_cuda_opts co = {.sz = sizeof co,
                            .mode = e->o.mode == MS_MODE_PER_OP ? MS_CUDA_PER_OP : MS_CUDA_MEGAKERNEL,
                            .max_batch = e->n_slots,
                            .max_ctx = e->o.max_ctx,
                            .page_size = e->o.page_size,
                            .n_sms = e->o.cuda_sms,
                            .tiles_per_op = e->o.tiles_per_op,
                            .watchdog_ms = e->o.watchdog_ms};
  if (!(c->dev = ms_cuda_engine_new(e->m, &co, log))) {
    rc = errno ? -errno : -MS_E_STATE;
    cuda_free(c);
    return rc;
  }
  /* Fault injection: the engine's faults as tables the device applies */
  if (e->faults) {
    struct ms_fault_table ft;
    const struct ms_plan *fp = ms_cuda_plan(c->dev);
    int W = ms_cuda_ctas(c->dev) - 1;
    if (!(rc = ms_fault_table_new(e, fp, W, &ft, log))) {
      rc = ms_cuda_set_faults(c->dev, ft.cls, fp->n_classes, ft.worker, W, ft.slot, ft.slot_coef, ft.release_ns,
                              fp->n_ev_classes, log);
      ms_fault_table_free(&ft);
    }
    if (rc) {
      cuda_free(c);
      return rc;
    }
  }
  /* The always-on aggregates come from the device when its plan's classes
   * are the engine's (the same compiler, one more bucket: they are) */
  const struct ms_plan *dp = ms_cuda_plan(c->dev);
  if (e->o.mode == MS_MODE_MEGAKERNEL && dp->n_classes == e->n_classes && dp->n_ev_classes == e->n_ev_classes) {
    c->cls_tot = calloc(4 * (size_t)e->n_classes + 1, sizeof *c->cls_tot);
    c->ev_tot = calloc(2 * (size_t)e->n_ev_classes + 1, sizeof *c->ev_tot);
  }
  /* The hook table is the registry of the device's monitors: remade for the
   * kernel's CTAs (per-worker maps get a slot for each), with the device as
   * its runner; the table's own sites stay off (nothing runs tasks here). */
  struct ms_hook_table *t = ms_hook_table_new(ms_cuda_ctas(c->dev));
  if (!t) {
    cuda_free(c);
    return -ENOMEM;
  }
  t->retention_ns = e->hooks->retention_ns;
  t->runner = (struct ms_hook_runner){.ctx = c, .take = cuda_take, .drop = cuda_drop,
                                      .coverage = cuda_mon_coverage, .sync = cuda_mon_sync,
                                      .forget = cuda_forget};
  ms_hook_table_free(e->hooks);
  e->hooks = t;
  atomic_store_explicit(&e->hooks_on, 0, memory_order_relaxed);
  c->traceable = e->o.mode == MS_MODE_MEGAKERNEL && ms_cuda_ctas(c->dev) - 1 == e->n_workers &&
                 same_plan(dp, e->rt[e->n_buckets - 1].plan);
  if ((rc = ms_cuda_feed_start(c->dev, log))) {
    cuda_free(c);
    return rc;
  }
  e->be_ctx = c;  /* before the driver runs: publish_step reads it */
  if (pthread_create(&c->th, NULL, driver_main, c)) {
    e->be_ctx = NULL;
    cuda_free(c);
    return -EAGAIN;
  }
  return 0;
}

const struct ms_backend_ops ms_backend_cuda = {
    .info = {.name = "cuda", .label = "CUDA", .on_device = 1, .device_sms = 1, .tiles_per_worker = 1,
             .bf16_weights = 1},
    .remote_tasks = 1,
    .defaults = cuda_defaults,
    .shape_only = cuda_shape_only,
    .start = cuda_start,
    .stop = cuda_stop,
    .now = cuda_now,
    .publish_step = cuda_publish_step,
    .fired = cuda_fired,
    .defer_trigger = cuda_defer_trigger,
    .poll_at = cuda_poll_at,
    .can_trace = cuda_can_trace,
    .sample = cuda_sample,
    .injects = cuda_injects,
    .device = cuda_device,
};
