/* SPDX-License-Identifier: MIT */
/* The persistent kernel on CPU threads, for tests (tests/test_megakernel_host.c,
 * tests/test_monitors_host.c): src/cuda/megakernel.cuh compiled through
 * src/cuda/host_emu.h with the CPU task bodies (ms_ops_run) in place of the
 * device ones, and engine.cu's setup on host memory.
 *
 * The includer includes cuda/host_emu.h first, then supplies struct msd_hooks
 * and the hook functions (msd_hook_armed, msd_hook_fire, msd_hook_sched_hint,
 * msd_hooks_quiescent: fakes, or the real ones of cuda/bpf_dev.cuh), then
 * includes this header once and defines `__thread struct msd_emu_dim blockIdx`.
 *
 * Requests: n_req prompts of HARNESS_PROMPT tokens, n_new new tokens each,
 * HARNESS_B rows; every request's prompt is harness_prompt(i, k). */
#ifndef MS_TESTS_EMU_HARNESS_H
#define MS_TESTS_EMU_HARNESS_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "megascope/plan_ir.h"
#include "cuda/dev.h"
#include "cuda/layout.h"
#include "kernels/ops.h"
#include "megascope/engine.h"
#include "megascope/reference.h"

/* ---- task bodies from the CPU ------------------------------------------- */

static const struct ms_exec_ctx *g_x;   /* the CPU context over the same buffers */
static int g_delay_us;                  /* random delay before each task, 0: none */
static int harness_stop_eos;            /* requests finish on the model's eos */
static __thread uint64_t g_rng;
static _Atomic int g_stuck_task = -1;   /* this task blocks until g_release */
static _Atomic int g_release;

static void msd_task_prefetch(const struct msd_ctx *x, int t, int tid, int n) {
  (void)x, (void)t, (void)tid, (void)n;
}

static void msd_task_run(const struct msd_ctx *x, int t, int cta) {
  if (t == atomic_load(&g_stuck_task))
    while (!atomic_load(&g_release)) usleep(1000);
  if (g_delay_us) {
    g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
    if ((g_rng >> 33) % 3 == 0) usleep((useconds_t)((g_rng >> 40) % (uint64_t)g_delay_us));
  }
  struct ms_exec_ctx tx = *g_x;
  tx.meta.n_rows = *(volatile int32_t *)x->n_rows;
  const struct ms_task *k = &tx.plan->tasks[t];
  if (k->kernel == MS_K_SAMPLE) {
    int r = k->tile[1];
    if (r < tx.meta.n_rows && tx.meta.row_slot[r] >= 0)
      x->sampled[r] = ms_argmax(ms_buf_row(&tx, tx.plan->classes[k->cls].in, 0, r), tx.m->cfg.vocab);
    return;
  }
  ms_ops_run(&tx, t, cta);
}

#include "cuda/megakernel.cuh"

/* ---- the harness: engine.cu's setup, on host memory ---------------------- */

#define HARNESS_B 4
#define HARNESS_PROMPT 3
#define HARNESS_PAGE 4
#define HARNESS_MAX_CTAS 16

struct harness {
  struct ms_plan *plan;
  struct ms_exec_ctx x;
  struct msd_ctx dx;
  struct msd_rt rt;
  struct msd_sched sched;
  struct msd_host host;
  int n_req, n_new;
  struct msd_hreq *req;          /* [n_req] */
  int32_t *prompt, *out;         /* [n_req * HARNESS_PROMPT], [n_req * n_new] */
  struct msd_beat *beats;
  /* storage */
  float **buf, *k_pool, *v_pool, **scratch;
  const struct ms_weight *(*cls_w)[3];
  int32_t n_rows, row_slot[HARNESS_B], row_pos[HARNESS_B], row_token[HARNESS_B], sampled[HARNESS_B], *pages,
      *row_pages[HARNESS_B];
  uint64_t *counters;
  int32_t *aot, *aot_off, *jit_q, *fired;
  uint32_t *jit_head, *jit_tail, fired_tail, step_seq;
  uint64_t cur_step;
};

static inline int32_t harness_prompt(const struct ms_model *m, int i, int k) {
  return (5 + 37 * i + 11 * k) % m->cfg.vocab;
}


/* n_ctas CTAs (the scheduler and n_ctas - 1 workers); hooks: the kernel's
 * table or NULL; cut edits the plan before anything is built from it. */
static inline int harness_setup(struct harness *h, const struct ms_model *m, int n_ctas, int n_req, int n_new,
                         struct msd_hooks *hooks, void (*cut)(struct ms_plan *)) {
  memset(h, 0, sizeof *h);
  struct ms_compile_opts co = {.sz = sizeof co, .batch = HARNESS_B, .tiles_per_op = n_ctas - 1};
  if (n_ctas < 2 || n_ctas > HARNESS_MAX_CTAS || !(h->plan = ms_plan_compile(m, &co, NULL))) return -1;
  if (cut) cut(h->plan);
  const struct ms_plan *p = h->plan;
  const struct ms_model_config *c = &m->cfg;
  const int B = HARNESS_B, max_ctx = HARNESS_PROMPT + n_new + 1;
  int W = n_ctas - 1, max_pages = (max_ctx + HARNESS_PAGE - 1) / HARNESS_PAGE, pool_pages = max_pages * B;
  h->n_req = n_req;
  h->n_new = n_new;
  /* activations, KV cache, scratch as the CPU engine lays them out */
  h->buf = calloc((size_t)p->n_bufs, sizeof *h->buf);
  for (int b = 0; b < p->n_bufs; b++)
    if (!p->bufs[b].logical)
      h->buf[b] = calloc((size_t)p->bufs[b].planes * B * (size_t)p->bufs[b].cols, sizeof(float));
  size_t kv = (size_t)c->n_layers * (size_t)pool_pages * HARNESS_PAGE * (size_t)(c->n_kv_heads * c->head_dim);
  h->k_pool = calloc(kv, sizeof(float));
  h->v_pool = calloc(kv, sizeof(float));
  h->scratch = calloc((size_t)n_ctas + 1, sizeof *h->scratch);  /* NULL-terminated */
  for (int i = 0; i < n_ctas; i++) h->scratch[i] = calloc(ms_ops_scratch_floats(m, max_ctx), sizeof(float));
  h->cls_w = calloc((size_t)p->n_classes, sizeof *h->cls_w);
  ms_ops_bind_weights(p, m, h->cls_w);
  h->pages = calloc((size_t)pool_pages, sizeof(int32_t));
  for (int i = 0; i < pool_pages; i++) h->pages[i] = pool_pages - 1 - i;  /* not the identity */
  for (int r = 0; r < B; r++) h->row_pages[r] = h->pages + r * max_pages;
  h->x = (struct ms_exec_ctx){.m = m, .plan = p, .buf = h->buf, .max_rows = B,
                              .cls_w = (const struct ms_weight *const(*)[3])h->cls_w,
                              .meta = {.n_rows = 0, .row_slot = h->row_slot, .row_pos = h->row_pos,
                                       .row_token = h->row_token, .row_pages = h->row_pages},
                              .k_pool = h->k_pool, .v_pool = h->v_pool, .page_size = HARNESS_PAGE,
                              .pool_pages = pool_pages, .scratch = h->scratch};
  /* the device context: only what the scheduler reads */
  h->dx.tasks = p->tasks;
  h->dx.n_tasks = p->n_tasks;
  h->dx.cfg.vocab = c->vocab;
  h->dx.cfg.eos = c->eos;
  h->dx.max_rows = h->dx.batch = B;
  h->dx.n_rows = &h->n_rows;
  h->dx.row_slot = h->row_slot;
  h->dx.row_pos = h->row_pos;
  h->dx.row_token = h->row_token;
  h->dx.sampled = h->sampled;
  /* the queues laid out by engine.cu's code (cuda/layout.h) */
  h->aot = calloc((size_t)p->n_tasks + 1, sizeof(int32_t));
  h->aot_off = calloc((size_t)W + 1, sizeof(int32_t));
  msd_place_aot(p, W, h->aot, h->aot_off);
  uint32_t jit_cap = msd_jit_cap(p), fired_cap = msd_fired_cap(p);
  h->counters = calloc((size_t)p->n_events, sizeof(uint64_t));
  h->jit_q = calloc((size_t)W * jit_cap, sizeof(int32_t));
  h->jit_head = calloc((size_t)W, sizeof(uint32_t));
  h->jit_tail = calloc((size_t)W, sizeof(uint32_t));
  h->fired = calloc(fired_cap, sizeof(int32_t));
  h->beats = calloc((size_t)n_ctas, sizeof *h->beats);
  h->req = calloc((size_t)n_req, sizeof *h->req);
  h->prompt = calloc((size_t)n_req * HARNESS_PROMPT, sizeof(int32_t));
  h->out = calloc((size_t)n_req * (size_t)n_new, sizeof(int32_t));
  for (int i = 0; i < MSD_MAX_SLOTS; i++) h->sched.slot_req[i] = -1;
  struct msd_rt *r = &h->rt;
  r->x = &h->dx;
  r->events = p->events;
  r->end_event = p->end_event;
  r->n_workers = W;
  r->counters = h->counters;
  r->aot_q = h->aot;
  r->aot_off = h->aot_off;
  r->jit_q = h->jit_q;
  r->jit_head = h->jit_head;
  r->jit_tail = h->jit_tail;
  r->jit_cap = jit_cap;
  r->fired = h->fired;
  r->fired_tail = &h->fired_tail;
  r->fired_cap = fired_cap;
  r->step_seq = &h->step_seq;
  r->cur_step = &h->cur_step;
  r->sched = &h->sched;
  r->host = &h->host;
  r->req = h->req;
  r->prompt_pool = h->prompt;
  r->out_pool = h->out;
  r->beats = h->beats;
  r->hooks = hooks;
  for (int i = 0; i < n_req; i++) {
    h->req[i] = (struct msd_hreq){.n_prompt = HARNESS_PROMPT, .max_new = n_new, .prompt_off = i * HARNESS_PROMPT,
                                  .out_off = i * n_new, .logits_off = -1,
                                  .stop_eos = harness_stop_eos};
    for (int k = 0; k < HARNESS_PROMPT; k++) h->prompt[i * HARNESS_PROMPT + k] = harness_prompt(m, i, k);
  }
  h->host.n_submitted = (uint32_t)n_req;
  h->host.exit_when_idle = 1;
  g_x = &h->x;
  return 0;
}

static inline void harness_teardown(struct harness *h) {
  for (int b = 0; h->plan && b < h->plan->n_bufs; b++) free(h->buf[b]);
  for (int i = 0; h->scratch && h->scratch[i]; i++) free(h->scratch[i]);
  free(h->buf), free(h->k_pool), free(h->v_pool), free(h->scratch), free(h->cls_w), free(h->pages);
  free(h->aot), free(h->aot_off), free(h->counters), free(h->jit_q), free(h->jit_head), free(h->jit_tail);
  free(h->fired), free(h->beats), free(h->req), free(h->prompt), free(h->out);
  ms_plan_free(h->plan);
}

struct harness_cta {
  struct harness *h;
  unsigned cta;
};

static inline void *harness_cta_main(void *arg) {
  struct harness_cta *a = arg;
  blockIdx.x = a->cta;
  g_rng = 0x9e3779b97f4a7c15ull * (a->cta + 1);
  msd_megakernel(a->h->rt);
  return NULL;
}

/* Runs the kernel: one thread per CTA; 0 when every CTA returned. */
static inline int harness_launch(struct harness *h, int n_ctas) {
  pthread_t th[HARNESS_MAX_CTAS];
  struct harness_cta args[HARNESS_MAX_CTAS];
  int n = 0, rc = 0;
  for (; n < n_ctas; n++) {
    args[n] = (struct harness_cta){h, (unsigned)n};
    if (pthread_create(&th[n], NULL, harness_cta_main, &args[n])) {
      rc = -1;  /* the others cannot finish without it: a hang, not a return */
      break;
    }
  }
  for (int i = 0; i < n; i++) pthread_join(th[i], NULL);
  return rc;
}

/* The kernel in the background (the host's side of a launch): start, join. */
struct harness_bg {
  struct harness *h;
  int n_ctas, rc;
  pthread_t th;
};

static inline void *harness_bg_main(void *arg) {
  struct harness_bg *b = arg;
  b->rc = harness_launch(b->h, b->n_ctas);
  return NULL;
}

static inline int harness_start(struct harness_bg *b, struct harness *h, int n_ctas) {
  b->h = h;
  b->n_ctas = n_ctas;
  b->rc = -1;
  return pthread_create(&b->th, NULL, harness_bg_main, b) ? -1 : 0;
}

static inline int harness_join(struct harness_bg *b) {
  pthread_join(b->th, NULL);
  return b->rc;
}

/* The CPU engine's tokens for the same prompts: out[n_req * n_new]. */
static inline void harness_cpu_tokens(const struct ms_model *m, int n_req, int n_new, int32_t *out) {
  struct ms_engine_opts eo = {.sz = sizeof eo, .max_batch = HARNESS_B, .max_ctx = HARNESS_PROMPT + n_new + 1,
                              .n_workers = 2};
  struct ms_engine *e = ms_engine_new(m, &eo, NULL);
  for (int i = 0; i < n_req; i++) {
    int32_t prompt[HARNESS_PROMPT];
    for (int k = 0; k < HARNESS_PROMPT; k++) prompt[k] = harness_prompt(m, i, k);
    struct ms_request_opts ro = {.sz = sizeof ro, .prompt = prompt, .n_prompt = HARNESS_PROMPT,
                                 .max_new_tokens = n_new, .stop_at_eos = harness_stop_eos};
    struct ms_request *q = ms_engine_submit(e, &ro);
    ms_request_wait(q, -1);
    struct ms_request_info info;
    ms_request_get_info(q, &info);
    memset(out + (size_t)i * n_new, 0, sizeof(int32_t) * (size_t)n_new);  /* past an eos stop: 0, as on the device */
    memcpy(out + (size_t)i * n_new, info.tokens, sizeof(int32_t) * (size_t)info.n_tokens);
    ms_request_free(q);
  }
  ms_engine_free(e);
}

/* Tasks a step runs on workers: all but the step start. */
static inline int harness_body_tasks(const struct ms_plan *p) { return p->n_tasks - 1; }

/* Events with a trigger: dep_release fires once per step for each. */
static inline int harness_trigger_events(const struct ms_plan *p) {
  int n = 0;
  for (int e = 0; e < p->n_events; e++) n += p->trig_off[e + 1] > p->trig_off[e];
  return n;
}

#endif
