/* SPDX-License-Identifier: MIT */
/* The CUDA backend's host side: device discovery, the engine (plan compiled for
 * the bucket of max_batch rows, uploaded once), the persistent kernel's launch,
 * request hand-over through host-mapped memory, the watchdog, the per-op
 * baseline (a CUDA Graph of one kernel per operator level), and the monitors'
 * entry points (src/cuda/monitors.cu does the work). */
#include <errno.h>
#include <sched.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime.h>

extern "C" {
#include "megascope/cuda.h"
#include "megascope/cuda_diag.h"
#include "megascope/json.h"
#include "megascope/plan_ir.h"
}

#include "cuda/layout.h"
#include "cuda/megakernel.cuh"
#include "cuda/monitors.h"
#include "cuda/upload.h"

#define CK(call)                                                                             \
  do {                                                                                       \
    cudaError_t ck_ = (call);                                                                \
    if (ck_ != cudaSuccess) {                                                                \
      ms_textbuf_printf(log, "cuda: %s failed: %s (%s:%d)\n", #call, cudaGetErrorString(ck_), \
                        __FILE__, __LINE__);                                                 \
      rc = -MS_E_STATE;                                                                      \
      goto out;                                                                              \
    }                                                                                        \
  } while (0)

struct ms_cuda_engine {
  const struct ms_model *m;
  struct ms_cuda_opts o;
  struct ms_plan *plan;
  struct msd_dev dev;
  cudaDeviceProp prop;
  int n_ctas, n_workers;
  /* the persistent kernel's state */
  struct msd_rt rt;                /* by value: the kernel's argument */
  uint64_t *counters;
  int32_t *aot_q, *aot_off;
  int32_t *jit_q;
  uint32_t *jit_head, *jit_tail;
  int32_t *fired;
  uint32_t *fired_tail, *step_seq;
  uint64_t *cur_step;
  struct msd_sched *sched;
  struct msd_host *host;           /* host-mapped */
  struct msd_beat *beats;          /* host-mapped [n_ctas] */
  /* requests of the run in flight */
  struct msd_hreq *req;            /* host-mapped */
  int32_t *prompt_pool, *out_pool; /* host-mapped */
  float *logits_rec;               /* device */
  float *logits_buf;               /* device [batch * vocab]: the sample task's copy, when asked */
  int32_t *sampled_dev;            /* device [batch]: the sample tasks' tokens (msd_ctx.sampled outside fed mode) */
  float *samp_w;                   /* device [batch * vocab]: the sampler's weights (fed mode) */
  struct ms_cuda_request *user;
  int n_user;
  int running;
  uint64_t t_launch;
  /* per-op mode */
  int32_t *level_tasks;            /* device: tasks level by level */
  int *level_off, n_levels;        /* host */
  cudaGraphExec_t graph;
  int have_graph;
  cudaStream_t ks;                 /* the kernel's stream */
  struct ms_cuda_mon *mon;
  /* fed mode (ms_cuda_feed_*): the engine's step machine hands over steps */
  int feeding;                     /* between feed_start and feed_stop */
  uint32_t fed;                    /* steps handed over */
  int fed_rows;                    /* rows of the step in flight (0: events alone) */
  int in_flight;                   /* handed over, not yet waited for */
  struct msd_feed *feed;           /* host-mapped handshake */
  struct msd_feed_step *feed_dev;  /* device: the step's rows */
  struct msd_feed_step *feed_stage;/* pinned: the same, staged for the copy */
  uint32_t *feed_seq;              /* device: msd_rt.feed_seq */
  uint32_t *seq_src;               /* pinned [2]: the sources of the seq copies (a handover's, the exit's) */
  int32_t *feed_tok;               /* [max_batch] the device's tokens: host-mapped (megakernel) or pinned (per-op) */
  uint64_t t_handed;               /* the host's clock as it handed the step in flight over */
  cudaEvent_t ev0, ev1;            /* per-op mode: a step's graph timed on the device */
  float *feed_logits;              /* [max_batch * vocab]: host-mapped (megakernel) or pinned (per-op) */
  int32_t *feed_meta;              /* pinned: per-op mode's layout staging */
  cudaStream_t cs;                 /* copies while the resident kernel runs */
  uint64_t *acc;                   /* device: the kernel's aggregates (msd_rt.cls_acc, then ev_acc) */
  void *faults;                    /* device: the fault tables (msd_rt.fault_*), NULL: healthy */
  size_t acc_n;                    /* words */
  uint64_t *fire_ns;               /* device [events]: msd_rt.fire_ns */
  uint32_t *done_gen;              /* device [tasks]: msd_rt.done_gen (the watchdog's producers) */
  /* the task trace (msd_rt.trace): host-mapped rings, what the host read of
   * each, whether the next handover and the one in flight are traced */
  struct msd_trace_rec *trace;
  uint32_t *trace_n, *trace_rd;
  uint64_t *trace_step;
  uint32_t trace_cap;
  int trace_want, traced;
  uint64_t traced_step;
  /* device clock -> host clock: the least (host time seeing done - device
   * time moving it) seen, so the bus's latency is counted once */
  int64_t clock_off;
  int have_off;
  struct ms_cuda_stats st;
  int broken;                      /* a stall was reported: the kernel may still hold the device */
};

static int set_sample_out(struct ms_cuda_engine *e, float *logits, int32_t *tokens, const struct msd_feed_row *rows,
                          struct ms_textbuf *log);

extern "C" int ms_cuda_available(char *why, size_t n) {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    if (why && n)
      snprintf(why, n, "no CUDA device: %s", err != cudaSuccess ? cudaGetErrorString(err) : "none found");
    return 0;
  }
  return 1;
}

extern "C" void ms_cuda_describe(char *buf, size_t n) {
  if (!ms_cuda_available(buf, n)) return;
  cudaDeviceProp p;
  int dev = 0;
  cudaGetDevice(&dev);
  if (cudaGetDeviceProperties(&p, dev) != cudaSuccess) {
    snprintf(buf, n, "CUDA device %d (properties unavailable)", dev);
    return;
  }
  snprintf(buf, n, "%s (%d SMs, sm_%d%d, %.0f GiB)", p.name, p.multiProcessorCount, p.major, p.minor,
           (double)p.totalGlobalMem / (1024.0 * 1024 * 1024));
}

extern "C" int ms_cuda_device_info(struct ms_cuda_device *out, char *why, size_t n) {
  memset(out, 0, sizeof *out);
  if (!ms_cuda_available(why, n)) return -MS_E_UNSUPP;
  int dev = 0, clock_khz = 0, bus_bits = 0;
  cudaDeviceProp p;
  if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&p, dev) != cudaSuccess) {
    snprintf(why, n, "CUDA device %d: properties unavailable", dev);
    return -MS_E_UNSUPP;
  }
  snprintf(out->name, sizeof out->name, "%.127s", p.name);
  out->sms = p.multiProcessorCount;
  out->major = p.major;
  out->minor = p.minor;
  out->mem_gib = (double)p.totalGlobalMem / (1024.0 * 1024 * 1024);
  if (cudaDeviceGetAttribute(&clock_khz, cudaDevAttrMemoryClockRate, dev) == cudaSuccess &&
      cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, dev) == cudaSuccess)
    out->peak_gbs = 2.0 * (double)clock_khz * 1e3 * (double)bus_bits / 8.0 / 1e9;
  return 0;
}

/* ---- creation ------------------------------------------------------------ */

/* The per-op baseline's kernels (cuda/layout.h). */
static int build_levels(struct ms_cuda_engine *e, int32_t **host_tasks, struct ms_textbuf *log) {
  const struct ms_plan *p = e->plan;
  int32_t *order = (int32_t *)malloc((size_t)p->n_tasks * sizeof(int32_t));
  e->level_off = (int *)calloc((size_t)p->n_tasks + 1, sizeof(int));
  int nl = order && e->level_off ? msd_levels(p, order, e->level_off) : -1;
  if (nl < 0) {
    free(order);
    return -ENOMEM;
  }
  e->n_levels = nl;
  *host_tasks = order;
  ms_textbuf_printf(log, "cuda: per-op mode: %d kernels a step\n", nl);
  return 0;
}

static int widest_level(const struct ms_cuda_engine *e) {
  int w = 0;
  for (int l = 0; l < e->n_levels; l++)
    if (e->level_off[l + 1] - e->level_off[l] > w) w = e->level_off[l + 1] - e->level_off[l];
  return w;
}


static int alloc_runtime(struct ms_cuda_engine *e, struct ms_textbuf *log) {
  int rc = 0;
  const struct ms_plan *p = e->plan;
  const int W = e->n_workers;
  int32_t *aot = NULL, *off = NULL;
  uint32_t jit_cap = msd_jit_cap(p), fired_cap = msd_fired_cap(p);
  aot = (int32_t *)malloc(((size_t)p->n_tasks + 1) * sizeof(int32_t));
  off = (int32_t *)calloc((size_t)W + 1, sizeof(int32_t));
  if (!aot || !off) {
    rc = -ENOMEM;
    goto out;
  }
  {
    int n = msd_place_aot(p, W, aot, off);
    CK(cudaMalloc(&e->aot_q, ((size_t)n + 1) * sizeof(int32_t)));
    CK(cudaMemcpy(e->aot_q, aot, (size_t)n * sizeof(int32_t), cudaMemcpyHostToDevice));
    CK(cudaMalloc(&e->aot_off, ((size_t)W + 1) * sizeof(int32_t)));
    CK(cudaMemcpy(e->aot_off, off, ((size_t)W + 1) * sizeof(int32_t), cudaMemcpyHostToDevice));
  }
  CK(cudaMalloc(&e->counters, (size_t)p->n_events * sizeof(uint64_t)));
  CK(cudaMalloc(&e->done_gen, ((size_t)p->n_tasks + 1) * sizeof(uint32_t)));
  CK(cudaMalloc(&e->jit_q, (size_t)W * jit_cap * sizeof(int32_t)));
  CK(cudaMalloc(&e->jit_head, (size_t)W * sizeof(uint32_t)));
  CK(cudaMalloc(&e->jit_tail, (size_t)W * sizeof(uint32_t)));
  CK(cudaMalloc(&e->fired, (size_t)fired_cap * sizeof(int32_t)));
  CK(cudaMalloc(&e->fired_tail, sizeof(uint32_t)));
  CK(cudaMalloc(&e->step_seq, sizeof(uint32_t)));
  CK(cudaMalloc(&e->cur_step, sizeof(uint64_t)));
  CK(cudaMalloc(&e->sched, sizeof(struct msd_sched)));
  CK(cudaHostAlloc(&e->host, sizeof(struct msd_host), cudaHostAllocMapped));
  CK(cudaHostAlloc(&e->beats, (size_t)e->n_ctas * sizeof(struct msd_beat), cudaHostAllocMapped));
  memset((void *)e->host, 0, sizeof(struct msd_host));
  memset((void *)e->beats, 0, (size_t)e->n_ctas * sizeof(struct msd_beat));
  {
    struct msd_rt *r = &e->rt;
    memset(r, 0, sizeof *r);
    r->x = e->dev.d;
    r->events = e->dev.events;
    r->end_event = p->end_event;
    r->n_workers = W;
    r->counters = e->counters;
    r->aot_q = e->aot_q;
    r->aot_off = e->aot_off;
    r->jit_q = e->jit_q;
    r->jit_head = e->jit_head;
    r->jit_tail = e->jit_tail;
    r->jit_cap = jit_cap;
    r->fired = e->fired;
    r->fired_tail = e->fired_tail;
    r->fired_cap = fired_cap;
    r->step_seq = e->step_seq;
    r->cur_step = e->cur_step;
    r->sched = e->sched;
    r->done_gen = e->done_gen;
    r->lost_trigger = e->o.fault_lost_trigger;
    CK(cudaHostGetDevicePointer((void **)&r->host, (void *)e->host, 0));
    CK(cudaHostGetDevicePointer((void **)&r->beats, (void *)e->beats, 0));
  }
out:
  free(aot);
  free(off);
  return rc;
}

static void release_runtime(struct ms_cuda_engine *e) {
  cudaFree(e->aot_q);
  cudaFree(e->aot_off);
  cudaFree(e->counters);
  cudaFree(e->done_gen);
  cudaFree(e->jit_q);
  cudaFree(e->jit_head);
  cudaFree(e->jit_tail);
  cudaFree(e->fired);
  cudaFree(e->fired_tail);
  cudaFree(e->step_seq);
  cudaFree(e->cur_step);
  cudaFree(e->sched);
  if (e->host) cudaFreeHost((void *)e->host);
  if (e->beats) cudaFreeHost((void *)e->beats);
}

static void free_requests(struct ms_cuda_engine *e) {
  if (e->req) cudaFreeHost(e->req);
  if (e->prompt_pool) cudaFreeHost(e->prompt_pool);
  if (e->out_pool) cudaFreeHost(e->out_pool);
  cudaFree(e->logits_rec);
  e->req = NULL;
  e->prompt_pool = e->out_pool = NULL;
  e->logits_rec = NULL;
}

static void free_feed(struct ms_cuda_engine *e) {
  if (e->feed) cudaFreeHost((void *)e->feed);
  if (e->feed_stage) cudaFreeHost(e->feed_stage);
  if (e->feed_logits) cudaFreeHost(e->feed_logits);
  if (e->feed_meta) cudaFreeHost(e->feed_meta);
  cudaFree(e->feed_dev);
  cudaFree(e->acc);
  cudaFree(e->faults);
  cudaFree(e->fire_ns);
  if (e->trace) cudaFreeHost(e->trace);
  if (e->trace_n) cudaFreeHost(e->trace_n);
  if (e->trace_step) cudaFreeHost(e->trace_step);
  free(e->trace_rd);
  cudaFree(e->feed_seq);
  cudaFree(e->samp_w);
  if (e->seq_src) cudaFreeHost(e->seq_src);
  if (e->feed_tok) cudaFreeHost(e->feed_tok);
  if (e->ev0) cudaEventDestroy(e->ev0);
  if (e->ev1) cudaEventDestroy(e->ev1);
  /* alloc_feed tells a fed engine by feed_logits: all go back to none */
  e->feed = NULL;
  e->feed_stage = NULL;
  e->feed_logits = NULL;
  e->feed_meta = NULL;
  e->feed_dev = NULL;
  e->acc = NULL;
  e->faults = NULL;
  e->fire_ns = NULL;
  e->trace = NULL;
  e->trace_n = e->trace_rd = NULL;
  e->trace_step = NULL;
  e->feed_seq = e->seq_src = NULL;
  e->samp_w = NULL;
  e->feed_tok = NULL;
  e->ev0 = e->ev1 = NULL;
}

extern "C" void ms_cuda_engine_free(struct ms_cuda_engine *e) {
  if (!e) return;
  /* a run still in flight is waited for first; that wait's own watchdog may find
   * it stalled (broken), so the test below comes after it, not before: freeing
   * under a kernel that never ends would block in cudaFree for ever */
  if (e->running && !e->broken) ms_cuda_wait(e, NULL);
  if (e->running && e->broken) {
    /* the stalled kernel may still run: cudaFree / cudaFreeHost would block on
     * it (they synchronise the device) or pull memory from under it. Leak the
     * device side and the host-mapped blocks; free plain host memory only. */
    free(e->level_off);
    ms_plan_free(e->plan);
    free(e);
    return;
  }
  if (e->feeding) ms_cuda_feed_stop(e, NULL);
  if (e->have_graph) cudaGraphExecDestroy(e->graph);
  if (e->mon) ms_cuda_mon_free(e->mon);
  free_feed(e);
  free_requests(e);
  release_runtime(e);
  cudaFree(e->level_tasks);
  free(e->level_off);
  msd_release(&e->dev);
  if (e->ks) cudaStreamDestroy(e->ks);
  if (e->cs) cudaStreamDestroy(e->cs);
  ms_plan_free(e->plan);
  free(e);
}

/* The persistent kernel's CTAs: one per SM (n_sms > 0: that many, fewer than
 * the device has), at most 1024. */
static int ctas_for(const cudaDeviceProp *p, int n_sms) {
  int n = n_sms > 0 && n_sms < p->multiProcessorCount ? n_sms : p->multiProcessorCount;
  return n > 1024 ? 1024 : n;
}

extern "C" struct ms_cuda_engine *ms_cuda_engine_new(const struct ms_model *m, const struct ms_cuda_opts *o,
                                                     struct ms_textbuf *log) {
  char why[256];
  int rc = 0;
  int32_t *levels = NULL;
  if (!ms_cuda_available(why, sizeof why)) {
    ms_textbuf_printf(log, "cuda: %s\n", why);
    errno = MS_E_UNSUPP;
    return NULL;
  }
  struct ms_cuda_engine *e = (struct ms_cuda_engine *)calloc(1, sizeof *e);
  if (!e) {
    errno = ENOMEM;
    return NULL;
  }
  e->m = m;
  memcpy(&e->o, o, o->sz < sizeof e->o ? o->sz : sizeof e->o);
  if (e->o.max_batch <= 0) e->o.max_batch = 1;
  if (e->o.max_ctx <= 0) e->o.max_ctx = 512;
  if (e->o.page_size <= 0) e->o.page_size = 16;
  if (e->o.max_batch > MSD_MAX_SLOTS) {
    ms_textbuf_printf(log, "cuda: max_batch %d is over the %d rows this backend holds\n", e->o.max_batch,
                      MSD_MAX_SLOTS);
    free(e);
    errno = MS_E_LIMIT;
    return NULL;
  }
  {
    int dev = 0;
    CK(cudaGetDevice(&dev));
    CK(cudaGetDeviceProperties(&e->prop, dev));
    e->n_ctas = ctas_for(&e->prop, e->o.n_sms);
    if (e->n_ctas < 2) {
      ms_textbuf_printf(log, "cuda: the megakernel needs 2 CTAs at least (a scheduler and a worker)\n");
      rc = -EINVAL;
      goto out;
    }
    e->n_workers = e->n_ctas - 1;
    int coop = 0, per_sm = 0;
    CK(cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, dev));
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, msd_megakernel, MSD_THREADS, 0));
    if (!coop || per_sm < 1) {
      ms_textbuf_printf(log, "cuda: the persistent kernel cannot be co-resident (cooperative launch %s, "
                        "%d CTAs of %d threads per SM)\n", coop ? "supported" : "unsupported", per_sm,
                        MSD_THREADS);
      rc = -MS_E_UNSUPP;
      goto out;
    }
    CK(cudaStreamCreateWithFlags(&e->ks, cudaStreamNonBlocking));
    /* copies while the kernel runs (fed mode's handovers, the watchdog's reads): made now, before any launch */
    CK(cudaStreamCreateWithFlags(&e->cs, cudaStreamNonBlocking));
  }
  {
    struct ms_compile_opts co;
    memset(&co, 0, sizeof co);
    co.sz = sizeof co;
    co.batch = e->o.max_batch;
    co.tiles_per_op = e->o.tiles_per_op > 0 ? e->o.tiles_per_op : e->n_workers;
    if (!(e->plan = ms_plan_compile(m, &co, log))) {
      rc = -errno;
      goto out;
    }
    if ((rc = ms_plan_validate(e->plan, log))) goto out;
    if (e->plan->tasks[0].kernel != MS_K_STEP_START) {
      ms_textbuf_printf(log, "cuda: the plan's first task is not the step start\n");
      rc = -MS_E_FORMAT;
      goto out;
    }
  }
  if ((rc = build_levels(e, &levels, log))) goto out;
  {
    struct msd_upload_opts uo;
    memset(&uo, 0, sizeof uo);
    int max_pages = (e->o.max_ctx + e->o.page_size - 1) / e->o.page_size;
    int wide = widest_level(e);
    uo.n_ctas = wide > e->n_ctas ? wide : e->n_ctas;  /* per-op kernels index scratch by CTA */
    uo.n_slots = e->o.max_batch;
    uo.max_ctx = e->o.max_ctx;
    uo.page_size = e->o.page_size;
    uo.pool_pages = max_pages * e->o.max_batch;
    uo.logits_out = 1;
    if ((rc = msd_upload(m, e->plan, &uo, &e->dev, log))) goto out;
    /* the logits rows are copied only for runs that record them */
    e->logits_buf = e->dev.h.logits_out;
    e->sampled_dev = e->dev.h.sampled;
    e->dev.h.logits_out = NULL;
    CK(cudaMemcpy(e->dev.d, &e->dev.h, sizeof e->dev.h, cudaMemcpyHostToDevice));
    /* pages: slot s owns [s * max_pages, (s + 1) * max_pages) of the pool; attention
     * still goes through the page table, as on the CPU */
    int32_t *pt = (int32_t *)malloc((size_t)uo.pool_pages * sizeof(int32_t));
    if (!pt) {
      rc = -ENOMEM;
      goto out;
    }
    for (int i = 0; i < uo.pool_pages; i++) pt[i] = i;
    cudaError_t ce = cudaMemcpy(e->dev.h.page_table, pt, (size_t)uo.pool_pages * sizeof(int32_t),
                                cudaMemcpyHostToDevice);
    free(pt);
    CK(ce);
    int n = e->level_off[e->n_levels];
    CK(cudaMalloc(&e->level_tasks, ((size_t)n + 1) * sizeof(int32_t)));
    CK(cudaMemcpy(e->level_tasks, levels, (size_t)n * sizeof(int32_t), cudaMemcpyHostToDevice));
  }
  if ((rc = alloc_runtime(e, log))) goto out;
  /* the uploads above went through the legacy stream (pageable cudaMemcpy may
   * return before its DMA lands); the kernels run on the non-blocking e->ks,
   * which is not ordered after it: let everything land now (the legacy stream
   * only: a device-wide sync would wait for another engine's running kernel) */
  CK(cudaStreamSynchronize(cudaStreamLegacy));
  if (!e->o.hooks_off) {
    if (!(e->mon = ms_cuda_mon_new(e->n_ctas, (size_t)(e->o.monitor_mib > 0 ? e->o.monitor_mib : 0) << 20, log))) {
      rc = -errno;
      goto out;
    }
    e->rt.hooks = ms_cuda_mon_device(e->mon);
    ms_cuda_mon_set_stream(e->mon, e->ks);
  }
out:
  free(levels);
  if (rc) {
    ms_cuda_engine_free(e);
    errno = rc < 0 ? -rc : rc;
    return NULL;
  }
  return e;
}

/* ---- requests ------------------------------------------------------------ */

static int prepare_requests(struct ms_cuda_engine *e, struct ms_cuda_request *r, int n, struct ms_textbuf *log) {
  int rc = 0;
  size_t np = 0, no = 0, nl = 0;
  const size_t V = (size_t)e->m->cfg.vocab;
  free_requests(e);
  for (int i = 0; i < n; i++) {
    if (r[i].n_prompt < 1 || r[i].max_new < 1 || r[i].n_prompt + r[i].max_new > e->o.max_ctx) {
      ms_textbuf_printf(log, "cuda: request %d: %d prompt tokens + %d new do not fit max_ctx %d\n", i,
                        r[i].n_prompt, r[i].max_new, e->o.max_ctx);
      return -E2BIG;
    }
    for (int j = 0; j < r[i].n_prompt; j++)
      if (r[i].prompt[j] < 0 || r[i].prompt[j] >= e->m->cfg.vocab) {
        ms_textbuf_printf(log, "cuda: request %d: prompt token %d (%d) is outside the vocabulary of %d\n", i,
                          j, r[i].prompt[j], e->m->cfg.vocab);
        return -EINVAL;
      }
    np += (size_t)r[i].n_prompt;
    no += (size_t)r[i].max_new;
    if (r[i].logits) nl += (size_t)(r[i].n_prompt + r[i].max_new - 1) * V;
  }
  CK(cudaHostAlloc(&e->req, (size_t)(n ? n : 1) * sizeof(struct msd_hreq), cudaHostAllocMapped));
  CK(cudaHostAlloc(&e->prompt_pool, (np + 1) * sizeof(int32_t), cudaHostAllocMapped));
  CK(cudaHostAlloc(&e->out_pool, (no + 1) * sizeof(int32_t), cudaHostAllocMapped));
  if (nl) CK(cudaMalloc(&e->logits_rec, nl * sizeof(float)));
  {
    size_t po = 0, oo = 0, lo = 0;
    for (int i = 0; i < n; i++) {
      struct msd_hreq *q = &e->req[i];
      memset((void *)q, 0, sizeof *q);
      q->n_prompt = r[i].n_prompt;
      q->max_new = r[i].max_new;
      q->prompt_off = (int32_t)po;
      q->out_off = (int32_t)oo;
      q->logits_off = r[i].logits ? (int64_t)lo : -1;
      q->stop_eos = r[i].stop_at_eos && e->m->cfg.eos >= 0;
      memcpy(e->prompt_pool + po, r[i].prompt, (size_t)r[i].n_prompt * sizeof(int32_t));
      po += (size_t)r[i].n_prompt;
      oo += (size_t)r[i].max_new;
      if (r[i].logits) lo += (size_t)(r[i].n_prompt + r[i].max_new - 1) * V;
      r[i].n_tokens = 0;
      r[i].t_submit = ms_now_ns();
    }
  }
  e->user = r;
  e->n_user = n;
out:
  return rc;
}

/* Copies what the device wrote back into the callers' requests. */
static int collect(struct ms_cuda_engine *e, struct ms_textbuf *log) {
  int rc = 0;
  const size_t V = (size_t)e->m->cfg.vocab;
  uint64_t g0 = e->host->t_start, h_end = ms_now_ns();
  /* device %globaltimer -> host clock: anchor the kernel's end at the host's */
  uint64_t g_end = e->host->t_end ? e->host->t_end : g0;
  for (int i = 0; i < e->n_user; i++) {
    struct ms_cuda_request *u = &e->user[i];
    const struct msd_hreq *q = &e->req[i];
    u->n_tokens = q->n_tokens;
    memcpy(u->tokens, e->out_pool + q->out_off, (size_t)u->n_tokens * sizeof(int32_t));
    u->t_first = q->t_first ? h_end - (g_end - q->t_first) : 0;
    u->t_done = q->t_done ? h_end - (g_end - q->t_done) : h_end;
    if (u->logits && q->logits_off >= 0)
      CK(cudaMemcpy(u->logits, e->logits_rec + q->logits_off,
                    (size_t)(u->n_prompt + u->max_new - 1) * V * sizeof(float), cudaMemcpyDeviceToHost));
  }
out:
  return rc;
}

/* ---- the megakernel ------------------------------------------------------ */

static int reset_state(struct ms_cuda_engine *e, struct ms_textbuf *log) {
  int rc = 0;
  const struct ms_plan *p = e->plan;
  struct msd_sched s;
  memset(&s, 0, sizeof s);
  for (int i = 0; i < MSD_MAX_SLOTS; i++) s.slot_req[i] = -1;
  CK(cudaMemsetAsync(e->counters, 0, (size_t)p->n_events * sizeof(uint64_t), e->ks));
  CK(cudaMemsetAsync(e->done_gen, 0, (size_t)p->n_tasks * sizeof(uint32_t), e->ks));
  CK(cudaMemsetAsync(e->jit_head, 0, (size_t)e->n_workers * sizeof(uint32_t), e->ks));
  CK(cudaMemsetAsync(e->jit_tail, 0, (size_t)e->n_workers * sizeof(uint32_t), e->ks));
  CK(cudaMemsetAsync(e->fired, 0, (size_t)e->rt.fired_cap * sizeof(int32_t), e->ks));
  CK(cudaMemsetAsync(e->fired_tail, 0, sizeof(uint32_t), e->ks));
  CK(cudaMemsetAsync(e->step_seq, 0, sizeof(uint32_t), e->ks));
  CK(cudaMemcpyAsync(e->cur_step, &e->st.steps, sizeof(uint64_t), cudaMemcpyHostToDevice, e->ks));
  CK(cudaMemcpyAsync(e->sched, &s, sizeof s, cudaMemcpyHostToDevice, e->ks));
  CK(cudaStreamSynchronize(e->ks));
  memset((void *)e->host, 0, sizeof(struct msd_host));
  memset((void *)e->beats, 0, (size_t)e->n_ctas * sizeof(struct msd_beat));
  for (int i = 0; i < e->n_ctas; i++) e->beats[i].running = e->beats[i].waiting = e->beats[i].wait_ev = -1;
out:
  return rc;
}

/* The persistent kernel's cooperative launch with e->rt as its argument. */
static int launch(struct ms_cuda_engine *e, struct ms_textbuf *log) {
  int rc = 0;
  void *args[] = {&e->rt};
  e->t_launch = ms_now_ns();
  CK(cudaLaunchCooperativeKernel((const void *)msd_megakernel, dim3((unsigned)e->n_ctas), dim3(MSD_THREADS), args,
                                 0, e->ks));
  e->running = 1;
  if (e->mon) ms_cuda_mon_set_running(e->mon, 1);
out:
  return rc;
}

extern "C" int ms_cuda_start(struct ms_cuda_engine *e, struct ms_cuda_request *r, int n, struct ms_textbuf *log) {
  int rc = 0;
  if (e->running || e->broken) {
    ms_textbuf_printf(log, "cuda: %s\n", e->broken ? "the engine stalled earlier; make a new one"
                                                     : "a run is in flight");
    return -MS_E_STATE;
  }
  if (e->o.mode != MS_CUDA_MEGAKERNEL) {
    ms_textbuf_printf(log, "cuda: ms_cuda_start runs the megakernel; use ms_cuda_generate in per-op mode\n");
    return -EINVAL;
  }
  if ((rc = prepare_requests(e, r, n, log))) return rc;
  if ((rc = reset_state(e, log))) return rc;
  e->rt.req = NULL;
  CK(cudaHostGetDevicePointer((void **)&e->rt.req, e->req, 0));
  CK(cudaHostGetDevicePointer((void **)&e->rt.prompt_pool, e->prompt_pool, 0));
  CK(cudaHostGetDevicePointer((void **)&e->rt.out_pool, e->out_pool, 0));
  e->rt.logits_rec = e->logits_rec;
  /* greedy, the tokens in device memory; the sample task copies logits rows
   * only when some request records them */
  if ((rc = set_sample_out(e, e->logits_rec ? e->logits_buf : NULL, e->sampled_dev, NULL, log))) return rc;
  /* the records, then the count: the kernel reads the count first */
  e->rt.feed = NULL;  /* the kernel admits these itself (a fed run may have come before) */
  e->rt.feed_step = NULL;
  e->rt.cls_acc = e->rt.ev_acc = NULL;
  e->rt.fire_ns = NULL;
  e->rt.trace = NULL;  /* the trace is fed mode's */
  e->rt.fault_cls = e->rt.fault_worker = NULL;  /* faults are fed mode's */
  e->rt.fault_release_ns = NULL;
  __sync_synchronize();
  e->host->n_submitted = (uint32_t)n;
  e->host->exit_when_idle = 1;
  __sync_synchronize();
  rc = launch(e, log);
out:
  return rc;
}

extern "C" int ms_cuda_finished(struct ms_cuda_engine *e) { return e->host ? (int)e->host->n_finished : 0; }

extern "C" uint64_t ms_cuda_steps_done(const struct ms_cuda_engine *e) { return e->host ? e->host->steps : 0; }

/* ---- the watchdog -------------------------------------------------------- */

/* What a host thread waiting on the kernel watches: every CTA's beat counter
 * (a CTA that stops beating is dead, or stuck inside a task) and the tasks
 * they finished (none for watchdog_ms while a CTA beats on, spinning on one
 * event, is a stuck event: a lost trigger, a wrong count). */
struct watch {
  uint64_t *last;      /* [n_ctas] beat counters at the last change */
  uint64_t beat_t;     /* when one last moved */
  uint64_t done, done_t;  /* the CTAs' finished tasks, and when that last moved */
};

static uint64_t done_sum(const struct ms_cuda_engine *e) {
  uint64_t n = 0;
  for (int c = 0; c < e->n_ctas; c++) n += e->beats[c].done;
  return n;
}

static void watch_init(struct ms_cuda_engine *e, struct watch *w) {
  w->last = (uint64_t *)calloc((size_t)e->n_ctas, sizeof(uint64_t));
  w->beat_t = w->done_t = ms_now_ns();
  w->done = done_sum(e);
}

static const char *cta_role(int c) { return c ? "worker" : "scheduler"; }

/* The dead-CTA report: what each CTA was doing at its last heartbeat. */
static void stall_report(struct ms_cuda_engine *e, uint64_t idle_ms, struct ms_textbuf *log) {
  ms_textbuf_printf(log, "cuda: no heartbeat for %llu ms (step %llu); per CTA:\n", (unsigned long long)idle_ms,
                    (unsigned long long)e->beats[0].step);
  int shown = 0;
  for (int c = 0; c < e->n_ctas && shown < 16; c++) {
    char name[96] = "";
    const struct msd_beat *b = &e->beats[c];
    int t = b->running >= 0 ? b->running : b->waiting;
    if (t < 0) continue;
    ms_plan_task_name(e->plan, t, name, sizeof name);
    ms_textbuf_printf(log, "  %s %d: %s %s (beats %llu)\n", cta_role(c), c ? c - 1 : 0,
                      b->running >= 0 ? "running" : "waiting on", name, (unsigned long long)b->beats);
    shown++;
  }
  if (!shown) ms_textbuf_printf(log, "  every CTA was idle at its last heartbeat\n");
}

/* The CTA running task t (from the beats), or -1. */
static int running_on(const struct ms_cuda_engine *e, int t) {
  for (int c = 0; c < e->n_ctas; c++)
    if (e->beats[c].running == t) return c;
  return -1;
}

/* CTA c's wait on event ev (task t waits on it; -1: the step's end), with the
 * event's count this generation and the producers that have not triggered
 * it (done_gen), as the CPU engine's watchdog reports them. */
static void report_wait(struct ms_cuda_engine *e, int c, int t, int ev, uint64_t gen, uint64_t ms,
                        const uint64_t *cnt, const uint32_t *dg, struct ms_textbuf *log) {
  const struct ms_plan *p = e->plan;
  const struct ms_event *E = &p->events[ev];
  char name[96];
  uint64_t base = (uint64_t)E->needed * gen, have = cnt[ev] > base ? cnt[ev] - base : 0;
  if (c)
    ms_textbuf_printf(log, "  worker %d: ", c - 1);
  else
    ms_textbuf_printf(log, "  scheduler: ");
  if (t >= 0) {
    ms_plan_task_name(p, t, name, sizeof name);
    ms_textbuf_printf(log, "waits to run %s (task %d) on event %d (%s): %llu/%d triggers this step, for %llu ms\n",
                      name, t, ev, p->ev_classes[E->cls], (unsigned long long)have, E->needed,
                      (unsigned long long)ms);
  } else {
    ms_textbuf_printf(log, "waits for the end of the step, event %d (%s): %llu/%d triggers, for %llu ms\n", ev,
                      p->ev_classes[E->cls], (unsigned long long)have, E->needed, (unsigned long long)ms);
  }
  int listed = 0;
  for (int i = p->trig_off[ev]; i < p->trig_off[ev + 1]; i++) {
    int q = p->trig[i];
    if (dg[q] >= (uint32_t)gen + 1 || listed++ >= 6) continue;
    ms_plan_task_name(p, q, name, sizeof name);
    int r = running_on(e, q);
    if (r >= 0)
      ms_textbuf_printf(log, "      not yet triggered: %s (task %d), running on %s %d\n", name, q, cta_role(r),
                        r ? r - 1 : 0);
    else
      ms_textbuf_printf(log, "      not yet triggered: %s (task %d), waiting on event %d\n", name, q,
                        p->tasks[q].wait);
  }
  if (listed > 6) ms_textbuf_printf(log, "      ... and %d more producers not yet triggered\n", listed - 6);
}

/* The stuck-event report: every CTA that has spun on one event for longer
 * than bound_ns, named with the event's state (read from device memory on
 * the copy stream, which the kernel does not hold up). 0 when no CTA does. */
static int stuck_report(struct ms_cuda_engine *e, uint64_t idle_ms, uint64_t bound_ns, struct ms_textbuf *log) {
  const struct ms_plan *p = e->plan;
  int n = 0;
  for (int c = 0; c < e->n_ctas; c++)
    n += e->beats[c].wait_ev >= 0 && e->beats[c].since - e->beats[c].wait_since > bound_ns;
  if (!n) return 0;
  uint64_t *cnt = (uint64_t *)calloc((size_t)p->n_events + 1, sizeof *cnt);
  uint32_t *dg = (uint32_t *)calloc((size_t)p->n_tasks + 1, sizeof *dg), seq = 0;
  int ok = cnt && dg &&
           cudaMemcpyAsync(cnt, e->counters, (size_t)p->n_events * sizeof *cnt, cudaMemcpyDeviceToHost, e->cs) ==
               cudaSuccess &&
           cudaMemcpyAsync(dg, e->done_gen, (size_t)p->n_tasks * sizeof *dg, cudaMemcpyDeviceToHost, e->cs) ==
               cudaSuccess &&
           cudaMemcpyAsync(&seq, e->step_seq, sizeof seq, cudaMemcpyDeviceToHost, e->cs) == cudaSuccess &&
           cudaStreamSynchronize(e->cs) == cudaSuccess;
  uint64_t gen = seq ? seq - 1 : 0;
  ms_textbuf_printf(log, "cuda: stuck: no task finished for %llu ms in step %llu (generation %llu), %d CTA%s "
                    "spinning on one event for longer; per CTA:\n", (unsigned long long)idle_ms,
                    (unsigned long long)e->beats[0].step, (unsigned long long)gen, n, n > 1 ? "s" : "");
  for (int c = 0, shown = 0; c < e->n_ctas && shown < 16; c++) {
    const struct msd_beat *b = &e->beats[c];
    int ev = b->wait_ev, t = b->waiting;
    if (b->running >= 0) {
      char name[96];
      ms_plan_task_name(p, b->running, name, sizeof name);
      ms_textbuf_printf(log, "  %s %d: running %s (task %d)\n", cta_role(c), c ? c - 1 : 0, name, b->running);
      shown++;
    } else if (ev >= 0 && ev < p->n_events && ok) {
      report_wait(e, c, t, ev, gen, (b->since - b->wait_since) / 1000000ull, cnt, dg, log);
      shown++;
    }
  }
  if (!ok) ms_textbuf_printf(log, "  (the events' counts could not be read from the device)\n");
  free(cnt);
  free(dg);
  return 1;
}

/* After a report: every CTA is asked to return (msd_host.abort, read once a
 * beat period) and the kernel waited for, at most 2 s. Either way the engine
 * is broken; only a kernel that did not return keeps its memory for good. */
static void abort_kernel(struct ms_cuda_engine *e) {
  e->broken = 1;
  __sync_synchronize();
  e->host->abort = 1;
  __sync_synchronize();
  for (uint64_t t0 = ms_now_ns(); ms_now_ns() - t0 < 2000000000ull;) {
    if (cudaStreamQuery(e->ks) != cudaErrorNotReady) {
      cudaStreamSynchronize(e->ks);  /* complete: the join, not a wait */
      e->running = 0;
      if (e->mon) ms_cuda_mon_set_running(e->mon, 0);
      return;
    }
    struct timespec ts = {0, 1000000};
    nanosleep(&ts, NULL);
  }
}

/* One look of a host thread waiting on the kernel: 1 when the watchdog
 * fired (its report in log, the kernel asked to return), else 0. */
static int watch_poll(struct ms_cuda_engine *e, struct watch *w, struct ms_textbuf *log) {
  if (e->o.watchdog_ms <= 0) return 0;
  const uint64_t now = ms_now_ns(), bound = (uint64_t)e->o.watchdog_ms * 1000000ull;
  for (int c = 0; c < e->n_ctas; c++)
    if (e->beats[c].beats != w->last[c]) {
      w->last[c] = e->beats[c].beats;
      w->beat_t = now;
    }
  uint64_t d = done_sum(e);
  if (d != w->done) {
    w->done = d;
    w->done_t = now;
  }
  if (now - w->beat_t > bound)
    stall_report(e, (now - w->beat_t) / 1000000ull, log);
  else if (now - w->done_t <= bound || !stuck_report(e, (now - w->done_t) / 1000000ull, bound, log))
    return 0;
  abort_kernel(e);
  return 1;
}

extern "C" int ms_cuda_wait(struct ms_cuda_engine *e, struct ms_textbuf *log) {
  int rc = 0;
  if (!e->running) return e->o.mode == MS_CUDA_MEGAKERNEL ? 0 : -EINVAL;
  struct watch w;
  watch_init(e, &w);
  for (;;) {
    cudaError_t q = cudaStreamQuery(e->ks);
    if (q == cudaSuccess) break;
    if (q != cudaErrorNotReady) CK(q);
    if (w.last && watch_poll(e, &w, log)) {
      rc = -MS_E_STALL;
      goto out;
    }
    struct timespec ts = {0, 200000};
    nanosleep(&ts, NULL);
  }
  CK(cudaStreamSynchronize(e->ks));
  {
    uint64_t t1 = ms_now_ns();
    e->running = 0;
    if (e->mon) ms_cuda_mon_set_running(e->mon, 0);
    double ms = e->host->t_end > e->host->t_start ? (double)(e->host->t_end - e->host->t_start) / 1e6
                                                   : (double)(t1 - e->t_launch) / 1e6;
    e->st.steps += e->host->steps;
    e->st.positions += e->host->positions;
    e->st.tokens += e->host->tokens;
    e->st.queue_full += e->host->queue_full;
    e->st.kernel_ms = ms;
    e->st.tokens_per_s = ms > 0 ? (double)e->host->tokens / (ms / 1e3) : 0;
    for (int c = 0; c < e->n_ctas; c++) e->st.heartbeats += e->beats[c].beats;
    rc = collect(e, log);
  }
out:
  free(w.last);
  return rc;
}

/* ---- the per-op baseline ------------------------------------------------- */

static __global__ void __launch_bounds__(MSD_THREADS) msd_level_kernel(const struct msd_ctx *x,
                                                                     const int32_t *tasks) {
  msd_task_run(x, tasks[blockIdx.x], (int)blockIdx.x);
}

static int build_graph(struct ms_cuda_engine *e, struct ms_textbuf *log) {
  int rc = 0, capturing = 0;
  cudaGraph_t g = NULL;
  CK(cudaStreamBeginCapture(e->ks, cudaStreamCaptureModeThreadLocal));
  capturing = 1;
  for (int l = 0; l < e->n_levels; l++) {
    int n = e->level_off[l + 1] - e->level_off[l];
#ifdef MSD_HOST_EMU  /* the CPU run (tests/emu/engine_emu.cc): no <<<>>> in g++; the same launch, captured */
    {
      const struct msd_ctx *x = e->dev.d;
      const int32_t *tk = e->level_tasks + e->level_off[l];
      CK(ms_emu_launch(e->ks, n, [=] { msd_level_kernel(x, tk); }));
    }
#else
    msd_level_kernel<<<n, MSD_THREADS, 0, e->ks>>>(e->dev.d, e->level_tasks + e->level_off[l]);
    /* <<<>>> returns nothing: a refused launch (resources, configuration) would
     * only show as an invalidated capture, and stay the thread's last error for
     * whichever call reads it next */
    CK(cudaGetLastError());
#endif
  }
  capturing = 0;
  CK(cudaStreamEndCapture(e->ks, &g));
  CK(cudaGraphInstantiate(&e->graph, g, 0));
  e->have_graph = 1;
out:
  if (capturing) {  /* a failed launch: leave capture mode, or the stream refuses all later work */
    cudaStreamEndCapture(e->ks, &g);
    (void)cudaGetLastError();  /* that capture's error is reported above */
  }
  if (g) cudaGraphDestroy(g);
  return rc;
}

/* The same batching as the scheduler's, on the host: one graph launch a step. */
static int run_per_op(struct ms_cuda_engine *e, struct ms_cuda_request *r, int n, struct ms_textbuf *log) {
  int rc = 0;
  const int B = e->o.max_batch, V = e->m->cfg.vocab;
  int slot_req[MSD_MAX_SLOTS], slot_pos[MSD_MAX_SLOTS], slot_next[MSD_MAX_SLOTS];
  /* the batch metadata and the sampled tokens go through pinned memory, so the
   * copies around each graph launch are real asynchronous DMA */
  int32_t *stage = NULL, *row_slot, *row_pos, *row_tok, *nrows, *sampled;
  int next = 0, done = 0;
  float *row_logits = NULL;
  uint64_t t0 = ms_now_ns(), steps = 0, positions = 0, tokens = 0;
  cudaEvent_t ev[2] = {NULL, NULL};  /* the loop on the device's clock, as the megakernel's is */
  if (!e->have_graph && (rc = build_graph(e, log))) return rc;
  CK(cudaEventCreate(&ev[0]));
  CK(cudaEventCreate(&ev[1]));
  CK(cudaHostAlloc(&stage, (4 * (size_t)B + 1) * sizeof(int32_t), cudaHostAllocDefault));
  row_slot = stage;
  row_pos = stage + B;
  row_tok = stage + 2 * B;
  nrows = stage + 3 * B;
  sampled = stage + 3 * B + 1;
  for (int i = 0; i < n; i++) {
    if (r[i].n_prompt < 1 || r[i].max_new < 1 || r[i].n_prompt + r[i].max_new > e->o.max_ctx) {
      ms_textbuf_printf(log, "cuda: request %d does not fit max_ctx %d\n", i, e->o.max_ctx);
      rc = -E2BIG;
      goto out;
    }
    r[i].n_tokens = 0;
    r[i].t_submit = t0;
  }
  {
    int want = 0;
    for (int i = 0; i < n; i++) want |= r[i].logits != NULL;
    float *lo = want ? e->logits_buf : NULL;
    if ((rc = set_sample_out(e, lo, e->sampled_dev, NULL, log))) goto out;
    if (want && !(row_logits = (float *)malloc((size_t)B * V * sizeof(float)))) {
      rc = -ENOMEM;
      goto out;
    }
  }
  for (int s = 0; s < B; s++) slot_req[s] = -1;
  CK(cudaEventRecord(ev[0], e->ks));
  while (done < n) {
    int active = 0;
    for (int s = 0; s < B; s++) {
      if (slot_req[s] < 0 && next < n) {
        slot_req[s] = next++;
        slot_pos[s] = 0;
      }
      int q = slot_req[s];
      row_slot[s] = q >= 0 ? s : -1;
      row_pos[s] = q >= 0 ? slot_pos[s] : 0;
      row_tok[s] = q < 0 ? 0 : slot_pos[s] < r[q].n_prompt ? r[q].prompt[slot_pos[s]] : slot_next[s];
      active += q >= 0;
    }
    *nrows = B;
    CK(cudaMemcpyAsync(e->dev.h.row_slot, row_slot, (size_t)B * sizeof(int32_t), cudaMemcpyHostToDevice, e->ks));
    CK(cudaMemcpyAsync(e->dev.h.row_pos, row_pos, (size_t)B * sizeof(int32_t), cudaMemcpyHostToDevice, e->ks));
    CK(cudaMemcpyAsync(e->dev.h.row_token, row_tok, (size_t)B * sizeof(int32_t), cudaMemcpyHostToDevice, e->ks));
    CK(cudaMemcpyAsync(e->dev.h.n_rows, nrows, sizeof *nrows, cudaMemcpyHostToDevice, e->ks));
    CK(cudaGraphLaunch(e->graph, e->ks));
    CK(cudaMemcpyAsync(sampled, e->dev.h.sampled, (size_t)B * sizeof(int32_t), cudaMemcpyDeviceToHost, e->ks));
    if (row_logits)
      CK(cudaMemcpyAsync(row_logits, e->dev.h.logits_out, (size_t)B * V * sizeof(float), cudaMemcpyDeviceToHost,
                         e->ks));
    CK(cudaStreamSynchronize(e->ks));
    steps++;
    positions += (uint64_t)active;
    for (int s = 0; s < B; s++) {
      int q = slot_req[s];
      if (q < 0) continue;
      struct ms_cuda_request *u = &r[q];
      if (row_logits && u->logits)
        memcpy(u->logits + (size_t)slot_pos[s] * V, row_logits + (size_t)s * V, (size_t)V * sizeof(float));
      if (++slot_pos[s] < u->n_prompt) continue;
      slot_next[s] = sampled[s];
      u->tokens[u->n_tokens++] = sampled[s];
      tokens++;
      if (u->n_tokens == 1) u->t_first = ms_now_ns();
      if (u->n_tokens >= u->max_new || (u->stop_at_eos && e->m->cfg.eos >= 0 && sampled[s] == e->m->cfg.eos)) {
        u->t_done = ms_now_ns();
        slot_req[s] = -1;
        done++;
      }
    }
  }
  CK(cudaEventRecord(ev[1], e->ks));
  CK(cudaEventSynchronize(ev[1]));
  {
    float dms = 0;
    CK(cudaEventElapsedTime(&dms, ev[0], ev[1]));
    double ms = dms;
    e->st.steps += steps;
    e->st.positions += positions;
    e->st.tokens += tokens;
    e->st.kernel_ms = ms;
    e->st.tokens_per_s = ms > 0 ? (double)tokens / (ms / 1e3) : 0;
  }
out:
  free(row_logits);
  if (stage) cudaFreeHost(stage);
  for (int i = 0; i < 2; i++)
    if (ev[i]) cudaEventDestroy(ev[i]);
  return rc;
}

extern "C" int ms_cuda_generate(struct ms_cuda_engine *e, struct ms_cuda_request *r, int n, struct ms_textbuf *log) {
  if (e->o.mode == MS_CUDA_PER_OP) return run_per_op(e, r, n, log);
  int rc = ms_cuda_start(e, r, n, log);
  return rc ? rc : ms_cuda_wait(e, log);
}

/* ---- fed mode: the engine's CUDA backend --------------------------------- */

extern "C" const struct ms_plan *ms_cuda_plan(const struct ms_cuda_engine *e) { return e->plan; }
extern "C" int ms_cuda_ctas(const struct ms_cuda_engine *e) { return e->n_ctas; }

static int alloc_feed(struct ms_cuda_engine *e, struct ms_textbuf *log) {
  int rc = 0;
  const size_t B = (size_t)e->o.max_batch, V = (size_t)e->m->cfg.vocab;
  if (e->feed_logits) return 0;
  CK(cudaHostAlloc(&e->feed, sizeof(struct msd_feed), cudaHostAllocMapped));
  CK(cudaMalloc(&e->feed_seq, sizeof(uint32_t)));
  CK(cudaHostAlloc(&e->seq_src, 2 * sizeof(uint32_t), cudaHostAllocDefault));
  CK(cudaMalloc(&e->samp_w, B * V * sizeof(float)));
  CK(cudaEventCreate(&e->ev0));
  CK(cudaEventCreate(&e->ev1));
  CK(cudaHostAlloc(&e->feed_stage, sizeof(struct msd_feed_step), cudaHostAllocDefault));
  CK(cudaHostAlloc(&e->feed_meta, (5 * B + 1) * sizeof(int32_t), cudaHostAllocDefault));
  CK(cudaMalloc(&e->feed_dev, sizeof(struct msd_feed_step)));
  e->acc_n = 4 * (size_t)e->plan->n_classes + 2 * (size_t)e->plan->n_ev_classes;
  CK(cudaMalloc(&e->acc, (e->acc_n + 1) * sizeof(uint64_t)));
  CK(cudaMemsetAsync(e->acc, 0, (e->acc_n + 1) * sizeof(uint64_t), e->cs));
  CK(cudaMalloc(&e->fire_ns, ((size_t)e->plan->n_events + 1) * sizeof(uint64_t)));
  CK(cudaStreamSynchronize(e->cs));
  if (e->o.mode == MS_CUDA_MEGAKERNEL) {
    /* a ring per worker for a step's tasks: its share of the plan four
     * times over (JIT work goes where there is room), rounded up */
    const size_t W = (size_t)e->n_workers;
    size_t want = 4 * (size_t)e->plan->n_tasks / W + 256;
    e->trace_cap = 256;
    while (e->trace_cap < want && e->trace_cap < (1u << 20)) e->trace_cap <<= 1;
    CK(cudaHostAlloc(&e->trace, W * e->trace_cap * sizeof(struct msd_trace_rec), cudaHostAllocMapped));
    CK(cudaHostAlloc(&e->trace_n, W * sizeof(uint32_t), cudaHostAllocMapped));
    CK(cudaHostAlloc(&e->trace_step, W * sizeof(uint64_t), cudaHostAllocMapped));
    if (!(e->trace_rd = (uint32_t *)calloc(W, sizeof(uint32_t)))) {
      rc = -ENOMEM;
      goto out;
    }
  }
  /* megakernel: the sample tasks write the rows' tokens, and the logits of
   * the rows the host draws, straight to the host */
  {
    unsigned fl = e->o.mode == MS_CUDA_MEGAKERNEL ? cudaHostAllocMapped : cudaHostAllocDefault;
    CK(cudaHostAlloc(&e->feed_tok, B * sizeof(int32_t), fl));
    CK(cudaHostAlloc(&e->feed_logits, B * V * sizeof(float), fl));
  }
  memset((void *)e->feed, 0, sizeof(struct msd_feed));
out:
  if (rc) free_feed(e);
  return rc;
}

/* Where the sample tasks put their work (device addresses): the logits rows
 * they copy, their tokens, and the fed rows they draw with (NULL: greedy).
 * Before a launch, on the kernel's stream: a pageable cudaMemcpy may return
 * before its DMA lands, and the non-blocking stream is not ordered after the
 * legacy one. */
static int set_sample_out(struct ms_cuda_engine *e, float *logits, int32_t *tokens, const struct msd_feed_row *rows,
                          struct ms_textbuf *log) {
  int rc = 0;
  struct msd_ctx *h = &e->dev.h;
  if (h->logits_out == logits && h->sampled == tokens && h->feed_rows == rows) return 0;
  h->logits_out = logits;
  h->sampled = tokens;
  h->feed_rows = rows;
  h->samp_w = e->samp_w;
  CK(cudaMemcpyAsync(e->dev.d, h, sizeof *h, cudaMemcpyHostToDevice, e->ks));
  CK(cudaStreamSynchronize(e->ks));
out:
  return rc;
}

extern "C" int ms_cuda_feed_start(struct ms_cuda_engine *e, struct ms_textbuf *log) {
  int rc = 0;
  if (e->running || e->feeding || e->broken) {
    ms_textbuf_printf(log, "cuda: %s\n", e->broken ? "the engine stalled earlier; make a new one"
                                                     : "a run is in flight");
    return -MS_E_STATE;
  }
  if ((rc = alloc_feed(e, log))) return rc;
  free_requests(e);  /* a run of ms_cuda_start's before: nothing to collect at the stop */
  e->user = NULL;
  e->n_user = 0;
  e->fed = 0;
  e->fed_rows = 0;
  e->in_flight = 0;
  memset((void *)e->feed, 0, sizeof(struct msd_feed));
  if (e->o.mode == MS_CUDA_PER_OP) {
    if (!e->have_graph && (rc = build_graph(e, log))) return rc;
    if ((rc = set_sample_out(e, e->logits_buf, e->sampled_dev, e->feed_dev->row, log))) return rc;
    e->feeding = 1;
    return 0;
  }
  float *dl = NULL;
  int32_t *dt = NULL;
  CK(cudaHostGetDevicePointer((void **)&dl, e->feed_logits, 0));
  CK(cudaHostGetDevicePointer((void **)&dt, e->feed_tok, 0));
  if ((rc = set_sample_out(e, dl, dt, e->feed_dev->row, log))) return rc;
  if ((rc = reset_state(e, log))) return rc;
  CK(cudaMemsetAsync(e->feed_seq, 0, sizeof(uint32_t), e->ks));  /* before the launch, on its stream */
  CK(cudaHostGetDevicePointer((void **)&e->rt.feed, (void *)e->feed, 0));
  e->rt.feed_step = e->feed_dev;
  e->rt.feed_seq = e->feed_seq;
  e->rt.cls_acc = e->acc;
  e->rt.ev_acc = e->acc + 4 * (size_t)e->plan->n_classes;
  /* the kernel's counters start again from zero: so do the firing times and
   * the rings. On the kernel's stream: the legacy stream's memset would not be
   * ordered before a launch on the non-blocking one */
  CK(cudaMemsetAsync(e->fire_ns, 0, ((size_t)e->plan->n_events + 1) * sizeof(uint64_t), e->ks));
  e->rt.fire_ns = e->fire_ns;
  memset(e->trace_n, 0, (size_t)e->n_workers * sizeof(uint32_t));
  memset(e->trace_step, 0, (size_t)e->n_workers * sizeof(uint64_t));
  memset(e->trace_rd, 0, (size_t)e->n_workers * sizeof(uint32_t));
  e->traced = 0;
  CK(cudaHostGetDevicePointer((void **)&e->rt.trace, e->trace, 0));
  CK(cudaHostGetDevicePointer((void **)&e->rt.trace_n, e->trace_n, 0));
  CK(cudaHostGetDevicePointer((void **)&e->rt.trace_step, e->trace_step, 0));
  e->rt.trace_cap = e->trace_cap;
  __sync_synchronize();
  if (!(rc = launch(e, log))) e->feeding = 1;
out:
  return rc;
}

/* The handover's rows as the device reads them (cuda/dev.h). */
static void fill_rows(struct msd_feed_step *f, const struct ms_cuda_row *rows, int n) {
  for (int r = 0; r < n; r++) {
    struct msd_feed_row *q = &f->row[r];
    const struct ms_cuda_row *u = &rows[r];
    q->slot = u->slot;
    q->pos = u->pos;
    q->token = u->token;
    q->page = u->page;
    q->gen = u->gen;
    q->top_k = u->top_k;
    q->temperature = u->temperature;
    q->top_p = u->top_p;
    q->min_p = u->min_p;
    q->flags = u->host_draws ? MSD_ROW_HOST : 0;
    q->seed = u->seed;
    q->draw = u->draw;
  }
}

/* Per-op mode's step: the layout and the rows copied in, one graph launch
 * timed on the device, the tokens back, and the logits of the rows the host
 * draws (all on the kernel's stream; ms_cuda_feed_wait synchronises). */
static int feed_step_per_op(struct ms_cuda_engine *e, const struct ms_cuda_row *rows, int n,
                            struct ms_textbuf *log) {
  int rc = 0;
  const int B = e->o.max_batch;
  const size_t V = (size_t)e->m->cfg.vocab;
  int32_t *row_slot = e->feed_meta, *row_pos = row_slot + B, *row_tok = row_slot + 2 * B;
  int32_t *page = row_slot + 3 * B, *nrows = row_slot + 5 * B;
  for (int r = 0; r < B; r++) {
    int live = r < n && rows[r].slot >= 0 && rows[r].slot < B;
    row_slot[r] = live ? rows[r].slot : -1;
    row_pos[r] = live ? rows[r].pos : 0;
    row_tok[r] = live ? rows[r].token : 0;
    page[r] = live ? rows[r].page : 0;
  }
  *nrows = n;
  for (int r = 0; r < n; r++)  /* each live row's page of its position (see msd_feed_row) */
    if (row_slot[r] >= 0)
      CK(cudaMemcpyAsync(e->dev.h.page_table + (size_t)row_slot[r] * e->dev.h.max_pages +
                             row_pos[r] / e->dev.h.page_size,
                         &page[r], sizeof(int32_t), cudaMemcpyHostToDevice, e->ks));
  CK(cudaMemcpyAsync(e->dev.h.row_slot, row_slot, (size_t)B * sizeof(int32_t), cudaMemcpyHostToDevice, e->ks));
  CK(cudaMemcpyAsync(e->dev.h.row_pos, row_pos, (size_t)B * sizeof(int32_t), cudaMemcpyHostToDevice, e->ks));
  CK(cudaMemcpyAsync(e->dev.h.row_token, row_tok, (size_t)B * sizeof(int32_t), cudaMemcpyHostToDevice, e->ks));
  CK(cudaMemcpyAsync(e->dev.h.n_rows, nrows, sizeof *nrows, cudaMemcpyHostToDevice, e->ks));
  fill_rows(e->feed_stage, rows, n);
  CK(cudaMemcpyAsync(e->feed_dev->row, e->feed_stage->row, (size_t)n * sizeof e->feed_stage->row[0],
                     cudaMemcpyHostToDevice, e->ks));
  e->t_handed = ms_now_ns();
  CK(cudaEventRecord(e->ev0, e->ks));
  CK(cudaGraphLaunch(e->graph, e->ks));
  CK(cudaEventRecord(e->ev1, e->ks));
  CK(cudaMemcpyAsync(e->feed_tok, e->sampled_dev, (size_t)n * sizeof(int32_t), cudaMemcpyDeviceToHost, e->ks));
  for (int r = 0; r < n; r++)  /* the rows the host draws: their logits (a row too close to call comes later) */
    if (rows[r].host_draws)
      CK(cudaMemcpyAsync(e->feed_logits + (size_t)r * V, e->logits_buf + (size_t)r * V, V * sizeof(float),
                         cudaMemcpyDeviceToHost, e->ks));
out:
  return rc;
}

extern "C" int ms_cuda_feed_step(struct ms_cuda_engine *e, uint64_t step, const struct ms_cuda_row *rows, int n,
                                 const struct ms_cuda_event *ev, int n_ev, struct ms_textbuf *log) {
  int rc = 0;
  if (!e->feeding || e->broken || e->in_flight) {
    ms_textbuf_printf(log, "cuda: %s\n", e->broken ? "the engine stalled"
                                      : e->in_flight ? "a step is in flight: ms_cuda_feed_wait first"
                                                     : "ms_cuda_feed_start first");
    return -MS_E_STATE;
  }
  if (n < 0 || n > e->o.max_batch || n_ev < 0 || n_ev > MSD_FEED_EVENTS || (!n && !n_ev)) {
    ms_textbuf_printf(log, "cuda: a handover of %d rows (0 .. %d) and %d events (0 .. %d), not both none\n", n,
                      e->o.max_batch, n_ev, MSD_FEED_EVENTS);
    return -EINVAL;
  }
  e->fed_rows = n;
  if (e->o.mode == MS_CUDA_PER_OP) {  /* no hook sites: the events have no reader */
    if (!n) return 0;
    e->in_flight = 1;
    return feed_step_per_op(e, rows, n, log);
  }
  struct msd_feed_step *f = e->feed_stage;
  f->step = step;
  f->rows = n;
  f->n_events = n_ev;
  f->trace = n > 0 && e->trace_want;
  e->traced = f->trace;
  e->traced_step = step;
  for (int i = 0; i < n_ev; i++) {
    f->ev[i].phase = ev[i].phase;
    f->ev[i].slot = ev[i].slot;
    f->ev[i].token = ev[i].token;
    f->ev[i].gen = ev[i].gen;
    f->ev[i].step = ev[i].step;
  }
  fill_rows(f, rows, n);
  /* The header with the events, the rows (only what is used), then the
   * sequence word, all on the copy stream and in that order, without waiting:
   * the scheduler polls the word in device memory and finds the rows there
   * before it. The staging (pinned) is reused only after this step's done,
   * which the device moves after it saw the word, so after every copy ran. */
  e->seq_src[0] = ++e->fed;
  e->t_handed = ms_now_ns();
  CK(cudaMemcpyAsync(e->feed_dev, f, offsetof(struct msd_feed_step, ev) + (size_t)n_ev * sizeof f->ev[0],
                     cudaMemcpyHostToDevice, e->cs));
  if (n)
    CK(cudaMemcpyAsync(e->feed_dev->row, f->row, (size_t)n * sizeof f->row[0], cudaMemcpyHostToDevice, e->cs));
  CK(cudaMemcpyAsync(e->feed_seq, &e->seq_src[0], sizeof(uint32_t), cudaMemcpyHostToDevice, e->cs));
  e->in_flight = 1;
out:
  return rc;
}

/* A traced step's end: every worker publishes its records once it sees the
 * end event, just after done; wait for the marks (a worker that never marks
 * is reported, as a stall would be). */
static int trace_marks(struct ms_cuda_engine *e, struct ms_textbuf *log) {
  const uint64_t want = e->traced_step + 1, t0 = ms_now_ns();
  for (int w = 0; w < e->n_workers; w++)
    while (*(volatile uint64_t *)&e->trace_step[w] != want) {
      if (ms_now_ns() - t0 > 1000000000ull * (e->o.watchdog_ms > 0 ? (uint64_t)e->o.watchdog_ms / 1000 + 1 : 5)) {
        ms_textbuf_printf(log, "cuda: worker %d did not publish the trace of step %llu\n", w,
                          (unsigned long long)e->traced_step);
        return -MS_E_STALL;
      }
      struct timespec ts = {0, 2000};
      nanosleep(&ts, NULL);
    }
  __sync_synchronize();  /* the counts and records after the marks */
  return 0;
}

extern "C" int ms_cuda_feed_trace(struct ms_cuda_engine *e, int on) {
  if (e->o.mode != MS_CUDA_MEGAKERNEL) return -MS_E_UNSUPP;
  e->trace_want = on != 0;
  return 0;
}

extern "C" int ms_cuda_feed_trace_drain(struct ms_cuda_engine *e,
                                        void (*fn)(void *user, int worker, const struct ms_cuda_trace_rec *r),
                                        void *user, uint64_t *lost) {
  *lost = 0;
  if (!e->trace || e->in_flight) return -MS_E_STATE;
  if (!e->traced) return 0;
  e->traced = 0;
  const int64_t off = e->clock_off;
  for (int w = 0; w < e->n_workers; w++) {
    uint32_t n = e->trace_n[w], rd = e->trace_rd[w];
    if (n - rd > e->trace_cap) {  /* the ring went round: the oldest are gone */
      *lost += n - rd - e->trace_cap;
      rd = n - e->trace_cap;
    }
    for (; rd != n; rd++) {
      const struct msd_trace_rec *d = &e->trace[(size_t)w * e->trace_cap + (rd & (e->trace_cap - 1))];
      struct ms_cuda_trace_rec r = {(uint64_t)((int64_t)d->t_begin + off), (uint64_t)((int64_t)d->t_end + off),
                                    (uint64_t)((int64_t)d->t_ready + off), d->step, d->task, d->wait_ns,
                                    (int32_t)d->fired};
      fn(user, w, &r);
    }
    e->trace_rd[w] = n;
  }
  return 0;
}

extern "C" int ms_cuda_sample(const struct ms_cuda_engine *e, int32_t *running, int32_t *waiting, int max) {
  int n = e->n_workers < max ? e->n_workers : max;
  if (!e->beats) return 0;
  for (int w = 0; w < n; w++) {  /* worker w is CTA w + 1 */
    running[w] = e->beats[w + 1].running;
    waiting[w] = e->beats[w + 1].waiting;
  }
  return n;
}

extern "C" int ms_cuda_workers(int n_sms) {
  int dev = 0;
  cudaDeviceProp p;
  if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&p, dev) != cudaSuccess) return -1;
  return ctas_for(&p, n_sms) - 1;
}

/* The host's wait for the handover in flight: spin, then yield, then (past
 * MSD_WAIT_YIELD_NS) sleep a little a poll, so a short step is seen within a
 * spin and a long one costs a core no more than it must. The watchdog and the
 * kernel's stream are looked at once the spin is over. */
#define MSD_WAIT_SPIN_NS 50000ull
#define MSD_WAIT_YIELD_NS 5000000ull

static inline void host_pause(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

static int wait_done(struct ms_cuda_engine *e, struct ms_textbuf *log) {
  struct watch w = {NULL, 0, 0, 0};
  const uint64_t t0 = ms_now_ns();
  int rc = 0;
  for (unsigned spins = 0; *(volatile uint32_t *)&e->feed->done != e->fed; spins++) {
    if ((spins & 63) != 63) {
      host_pause();
      continue;
    }
    uint64_t waited = ms_now_ns() - t0;
    if (waited < MSD_WAIT_SPIN_NS) continue;
    if (!w.last) watch_init(e, &w);
    cudaError_t q = cudaStreamQuery(e->ks);
    if (q == cudaSuccess) {  /* the kernel is gone: it cannot finish this step */
      ms_textbuf_printf(log, "cuda: the resident kernel returned during step %u\n", e->fed);
      rc = -MS_E_STATE;
      break;
    }
    if (q != cudaErrorNotReady) {
      ms_textbuf_printf(log, "cuda: the resident kernel failed: %s\n", cudaGetErrorString(q));
      e->broken = 1;
      rc = -MS_E_STATE;
      break;
    }
    if (w.last && watch_poll(e, &w, log)) {
      rc = -MS_E_STALL;
      break;
    }
    if (waited < MSD_WAIT_YIELD_NS) {
      sched_yield();
    } else {
      struct timespec ts = {0, 20000};
      nanosleep(&ts, NULL);
    }
  }
  free(w.last);
  return rc;
}

/* A handover's figures: the host's time from handing it over to seeing it
 * done, less the device's from seeing it to moving done (both clocks' own
 * differences: no offset needed), is what crossing the bus both ways and
 * noticing it cost. */
static void count_handover(struct ms_cuda_engine *e, uint64_t host_ns) {
  uint64_t dev = e->feed->t_done > e->feed->t_seen ? e->feed->t_done - e->feed->t_seen : 0;
  uint64_t ho = host_ns > dev ? host_ns - dev : 0;
  e->st.fed_steps++;
  e->st.device_step_ns += dev;
  e->st.handover_ns += ho;
  if (ho > e->st.handover_max_ns) e->st.handover_max_ns = ho;
}

/* Per-op mode: the logits of the rows whose token came back -1 without the
 * host having asked for them (a draw too close to call), fetched now. */
static int late_logits(struct ms_cuda_engine *e, struct ms_textbuf *log) {
  int rc = 0;
  const size_t V = (size_t)e->m->cfg.vocab;
  int late = 0;
  for (int r = 0; r < e->fed_rows; r++)
    if (e->feed_tok[r] < 0 && !(e->feed_stage->row[r].flags & MSD_ROW_HOST)) {
      CK(cudaMemcpyAsync(e->feed_logits + (size_t)r * V, e->logits_buf + (size_t)r * V, V * sizeof(float),
                         cudaMemcpyDeviceToHost, e->ks));
      late = 1;
    }
  if (late) CK(cudaStreamSynchronize(e->ks));
out:
  return rc;
}

/* Counts what crossed the bus for the step just done: rows drawn on the
 * device (a token) and on the host (a logits row). */
static void count_rows(struct ms_cuda_engine *e) {
  for (int r = 0; r < e->fed_rows; r++)
    if (e->feed_stage->row[r].slot >= 0) {
      if (e->feed_tok[r] >= 0)
        e->st.rows_device_drawn++;
      else
        e->st.rows_host_drawn++;
    }
}

extern "C" int ms_cuda_feed_wait(struct ms_cuda_engine *e, const int32_t **tokens, const float **logits,
                                 struct ms_textbuf *log) {
  int rc = 0;
  if (!e->feeding) {
    ms_textbuf_printf(log, "cuda: ms_cuda_feed_start first\n");
    return -MS_E_STATE;
  }
  *tokens = e->feed_tok;
  *logits = e->feed_logits;
  if (!e->in_flight) return 0;  /* per-op mode's events alone: nothing was handed over */
  if (e->o.mode == MS_CUDA_PER_OP) {
    CK(cudaStreamSynchronize(e->ks));
    if ((rc = late_logits(e, log))) goto out;
    float ms = 0;
    if (e->fed_rows && cudaEventElapsedTime(&ms, e->ev0, e->ev1) == cudaSuccess) {
      uint64_t dev = (uint64_t)((double)ms * 1e6), host = ms_now_ns() - e->t_handed;
      e->st.fed_steps++;
      e->st.device_step_ns += dev;
      e->st.handover_ns += host > dev ? host - dev : 0;
      if (host - dev > e->st.handover_max_ns && host > dev) e->st.handover_max_ns = host - dev;
    }
  } else {
    rc = wait_done(e, log);
    __sync_synchronize();  /* the tokens and logits rows after done */
    if (!rc) {
      uint64_t now = ms_now_ns();
      int64_t off = (int64_t)(now - e->feed->t_done);
      if (!e->have_off || off < e->clock_off) e->clock_off = off;
      e->have_off = 1;
      if (e->fed_rows) count_handover(e, now - e->t_handed);
    }
    if (!rc && e->traced) rc = trace_marks(e, log);
  }
  if (!rc) count_rows(e);
  e->fed_rows = 0;
  e->in_flight = 0;
out:
  return rc;
}

extern "C" int ms_cuda_set_faults(struct ms_cuda_engine *e, const float *cls, int n_cls, const float *worker,
                                  int n_workers, int slot, float slot_coef, const uint64_t *release_ns, int n_ev,
                                  struct ms_textbuf *log) {
  int rc = 0;
  if (e->running || e->feeding) {
    ms_textbuf_printf(log, "cuda: faults are set before the kernel starts\n");
    return -MS_E_STATE;
  }
  if (n_cls != e->plan->n_classes || n_workers != e->n_workers || n_ev != e->plan->n_ev_classes) {
    ms_textbuf_printf(log, "cuda: fault tables for %d classes, %d workers, %d event classes; the plan has %d, %d, %d\n",
                      n_cls, n_workers, n_ev, e->plan->n_classes, e->n_workers, e->plan->n_ev_classes);
    return -EINVAL;
  }
  if (e->o.mode != MS_CUDA_MEGAKERNEL) {
    ms_textbuf_printf(log, "cuda: per-op mode injects no faults\n");
    return -MS_E_UNSUPP;
  }
  size_t nr = (size_t)n_ev * sizeof(uint64_t), nc = (size_t)n_cls * sizeof(float),
         nw = (size_t)n_workers * sizeof(float);
  cudaFree(e->faults);
  e->faults = NULL;
  CK(cudaMalloc(&e->faults, nr + nc + nw + 8));
  {
    uint8_t *d = (uint8_t *)e->faults;  /* the u64 table first: aligned */
    CK(cudaMemcpy(d, release_ns, nr, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d + nr, cls, nc, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d + nr + nc, worker, nw, cudaMemcpyHostToDevice));
    CK(cudaStreamSynchronize(cudaStreamLegacy));
    e->rt.fault_release_ns = (const uint64_t *)d;
    e->rt.fault_cls = (const float *)(d + nr);
    e->rt.fault_worker = (const float *)(d + nr + nc);
    e->rt.fault_slot = slot;
    e->rt.fault_slot_coef = slot_coef;
  }
out:
  return rc;
}

extern "C" int ms_cuda_feed_totals(struct ms_cuda_engine *e, uint64_t *cls, uint64_t *ev) {
  if (!e->acc || e->o.mode != MS_CUDA_MEGAKERNEL) return -MS_E_STATE;
  size_t nc = 4 * (size_t)e->plan->n_classes;
  uint64_t *h = (uint64_t *)malloc((e->acc_n + 1) * sizeof *h);
  if (!h) return -ENOMEM;
  cudaError_t ce = cudaMemcpyAsync(h, e->acc, e->acc_n * sizeof *h, cudaMemcpyDeviceToHost, e->cs);
  if (ce == cudaSuccess) ce = cudaStreamSynchronize(e->cs);
  if (ce == cudaSuccess) {
    memcpy(cls, h, nc * sizeof *h);
    memcpy(ev, h + nc, (e->acc_n - nc) * sizeof *h);
  }
  free(h);
  return ce == cudaSuccess ? 0 : -MS_E_STATE;
}

extern "C" int ms_cuda_feed_stop(struct ms_cuda_engine *e, struct ms_textbuf *log) {
  if (!e->feeding) return 0;
  e->feeding = 0;
  if (e->o.mode == MS_CUDA_PER_OP || !e->running) return 0;
  e->seq_src[1] = MSD_SEQ_EXIT;  /* the word the scheduler polls, through the same stream as every handover */
  if (cudaMemcpyAsync(e->feed_seq, &e->seq_src[1], sizeof(uint32_t), cudaMemcpyHostToDevice, e->cs) != cudaSuccess ||
      cudaStreamSynchronize(e->cs) != cudaSuccess) {
    ms_textbuf_printf(log, "cuda: the exit could not be handed over\n");
    abort_kernel(e);
    return -MS_E_STATE;
  }
  return ms_cuda_wait(e, log);  /* the kernel's step count joins the statistics there */
}

extern "C" void ms_cuda_get_stats(const struct ms_cuda_engine *e, struct ms_cuda_stats *out) { *out = e->st; }

/* ---- monitors ------------------------------------------------------------ */

static int no_hooks(const struct ms_cuda_engine *e, struct ms_textbuf *log) {
  if (e->mon) return 0;
  ms_textbuf_printf(log, "cuda: this engine was made with hooks_off: it has no hook sites\n");
  return -MS_E_STATE;
}

/* A monitor compiled against another plan's class ids is refused (ms_monitor_check_schema). */
static int same_schema(const struct ms_cuda_engine *e, const struct ms_monitor *m, struct ms_textbuf *log) {
  uint64_t d[2];
  ms_plan_schema_digest(e->plan, d);
  return ms_monitor_check_schema(m, d, log);
}

extern "C" int ms_cuda_attach(struct ms_cuda_engine *e, struct ms_monitor *m, const struct ms_attach_opts *o,
                              struct ms_textbuf *log) {
  int rc = no_hooks(e, log);
  if (!rc) rc = same_schema(e, m, log);
  if (rc) return rc;
  uint64_t t0 = ms_now_ns();
  rc = ms_cuda_mon_attach(e->mon, m, o, log);
  e->st.attach_ns_last = ms_now_ns() - t0;
  return rc;
}

extern "C" int ms_cuda_replace(struct ms_cuda_engine *e, int id, struct ms_monitor *m, struct ms_textbuf *log) {
  int rc = no_hooks(e, log);
  if (!rc) rc = same_schema(e, m, log);
  if (rc) return rc;
  uint64_t t0 = ms_now_ns();
  rc = ms_cuda_mon_replace(e->mon, id, m, log);
  e->st.attach_ns_last = ms_now_ns() - t0;
  return rc;
}

extern "C" int ms_cuda_attach_shared(struct ms_cuda_engine *e, struct ms_monitor *m, struct ms_bpf_map **maps,
                                     int n_maps, const struct ms_attach_opts *o, struct ms_textbuf *log) {
  int rc = no_hooks(e, log);
  if (!rc) rc = same_schema(e, m, log);
  if (rc) return rc;
  uint64_t t0 = ms_now_ns();
  rc = ms_cuda_mon_attach_shared(e->mon, m, maps, n_maps, o, log);
  e->st.attach_ns_last = ms_now_ns() - t0;
  return rc;
}

extern "C" int ms_cuda_replace_shared(struct ms_cuda_engine *e, int id, struct ms_monitor *m,
                                      struct ms_bpf_map **maps, int n_maps, const struct ms_attach_opts *o,
                                      struct ms_textbuf *log) {
  int rc = no_hooks(e, log);
  if (rc) return rc;
  uint64_t t0 = ms_now_ns();
  rc = ms_cuda_mon_replace_shared(e->mon, id, m, maps, n_maps, o, log);
  e->st.attach_ns_last = ms_now_ns() - t0;
  return rc;
}

extern "C" int ms_cuda_coverage_of(struct ms_cuda_engine *e, int id, uint32_t generation, struct ms_coverage *out) {
  return e->mon ? ms_cuda_mon_coverage_of(e->mon, id, generation, out) : -MS_E_STATE;
}

extern "C" int ms_cuda_forget(struct ms_cuda_engine *e, int id) {
  return e->mon ? ms_cuda_mon_forget(e->mon, id) : -MS_E_STATE;
}

extern "C" int ms_cuda_sync_maps(struct ms_cuda_engine *e, int id) {
  return e->mon ? ms_cuda_mon_sync_maps(e->mon, id) : -MS_E_STATE;
}

extern "C" int ms_cuda_sync_maps_try(struct ms_cuda_engine *e, int id) {
  return e->mon ? ms_cuda_mon_sync_maps_try(e->mon, id) : -MS_E_STATE;
}

extern "C" int ms_cuda_detach(struct ms_cuda_engine *e, int id) {
  return e->mon ? ms_cuda_mon_detach(e->mon, id) : -MS_E_STATE;
}

extern "C" int ms_cuda_coverage(struct ms_cuda_engine *e, int id, struct ms_coverage *out) {
  return e->mon ? ms_cuda_mon_coverage(e->mon, id, out) : -MS_E_STATE;
}

extern "C" int ms_cuda_attach_write(struct ms_cuda_engine *e, int id, FILE *f, int as_json) {
  if (!e->mon) return -MS_E_STATE;
  int rc = ms_cuda_mon_sync_maps(e->mon, id);
  if (rc) return rc;
  struct ms_coverage cv;
  if ((rc = ms_cuda_mon_coverage(e->mon, id, &cv))) return rc;
  struct ms_bpf_map **maps = NULL;
  int n = 0;
  if ((rc = ms_cuda_mon_maps(e->mon, id, &maps, &n))) return rc;
  return ms_monitor_write_maps(ms_cuda_mon_name(e->mon, id), maps, n, (uint32_t)e->n_ctas, &cv, e->plan, f, as_json);
}
