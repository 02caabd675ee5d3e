/* SPDX-License-Identifier: MIT */
/* The persistent kernel's scheduler and workers (src/cuda/megakernel.cuh),
 * compiled for the CPU through src/cuda/host_emu.h: one host thread per CTA,
 * the CPU task bodies (ms_ops_run) in place of the device ones. Runs on every
 * machine, GPU or not. Checks, for tiny, tiny-moe and tiny-qwen3 (bf16), with
 * 2, 3 and 6 CTAs, with and without random delays before tasks:
 *   - every request's tokens equal the CPU engine's (continuous batching: more
 *     requests than rows), the kernel exits, counts add up;
 *   - the hook sites fire as the ABI says: task_begin and task_end once per task
 *     per step, dep_release once per event per step, step begin/end once per
 *     step, request admitted/first_token/token/finished per request, with
 *     consistent contexts; a sched_hint program's priorities are honoured
 *     (dispatch order within a release);
 *   - a plan with one dependency removed gives different results under delays
 *     (the harness can see a wrong order);
 *   - every CTA's heartbeat moves, and names the task a stuck CTA is running. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cuda/host_emu.h"
#include "cuda/dev.h"
#include "compile/plan_impl.h"
#include "kernels/ops.h"
#include "megascope/bpf/megascope.h"
#include "megascope/engine.h"
#include "megascope/reference.h"
#include "test.h"

__thread struct msd_emu_dim blockIdx;

/* ---- the includer's part: hooks that count, task bodies from the CPU ---- */

struct msd_hooks {
  int armed[MS_HOOK_COUNT];
  _Atomic uint64_t fired[MS_HOOK_COUNT];
  _Atomic uint64_t bad;          /* contexts that break the ABI's promises */
  _Atomic uint64_t phase[4];     /* request phases */
  int hint;                      /* sched_hint attached */
  _Atomic uint64_t hinted;
};

static int msd_hook_armed(const struct msd_hooks *h, int hook) { return h->armed[hook]; }
static void msd_hooks_quiescent(struct msd_hooks *h, int sm) {
  (void)h;
  (void)sm;
}
static void msd_hook_fire(struct msd_hooks *h, struct ms_hook_ctx *c, int sm) {
  (void)sm;
  atomic_fetch_add(&h->fired[c->hook], 1);
  int bad = c->abi_version != MS_HOOK_ABI_VERSION;
  if (c->hook == MS_HOOK_TASK_END) bad |= c->t_end < c->t_begin || (c->task_gen >> 32) != c->step;
  if (c->hook == MS_HOOK_DEP_RELEASE) bad |= c->event_count != c->event_needed;
  if (c->hook == MS_HOOK_REQUEST && c->phase < 4) atomic_fetch_add(&h->phase[c->phase], 1);
  if (bad) atomic_fetch_add(&h->bad, 1);
}
static int msd_hook_sched_hint(struct msd_hooks *h, struct ms_hook_ctx *c, int sm) {
  (void)sm;
  if (!h->hint) return -1;
  atomic_fetch_add(&h->hinted, 1);
  return (int)(c->task_index % 8);
}

static const struct ms_exec_ctx *g_x;   /* the CPU context over the same buffers */
static int g_delay_us;                  /* random delay before each task, 0: none */
static __thread uint64_t g_rng;

static void msd_task_prefetch(const struct msd_ctx *x, int t, int tid, int n) {
  (void)x, (void)t, (void)tid, (void)n;
}

static _Atomic int g_stuck_task = -1;   /* this task blocks until g_release */
static _Atomic int g_release;

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

#define B 4
#define NREQ 6
#define PROMPT 3
#define NEW 8
#define MAXCTX (PROMPT + NEW + 1)
#define PAGE 4

struct harness {
  struct ms_plan *plan;
  struct ms_exec_ctx x;
  struct msd_ctx dx;
  struct msd_rt rt;
  struct msd_sched sched;
  struct msd_host host;
  struct msd_hreq req[NREQ];
  int32_t prompt[NREQ * PROMPT], out[NREQ * NEW];
  struct msd_beat *beats;
  struct msd_hooks hooks;
  /* storage */
  float **buf, *k_pool, *v_pool, **scratch;
  const struct ms_weight *(*cls_w)[3];
  int32_t n_rows, row_slot[B], row_pos[B], row_token[B], sampled[B], *pages, *row_pages[B];
  uint64_t *counters;
  int32_t *aot, *aot_off, *jit_q, *fired;
  uint32_t *jit_head, *jit_tail, fired_tail, step_seq;
  uint64_t cur_step;
};

static uint32_t pow2_at_least(uint64_t x) {
  uint32_t p = 16;
  while (p < x) p <<= 1;
  return p;
}

static int setup(struct harness *h, const struct ms_model *m, int n_ctas, void (*cut)(struct ms_plan *)) {
  memset(h, 0, sizeof *h);
  struct ms_compile_opts co = {.sz = sizeof co, .batch = B, .tiles_per_op = n_ctas - 1};
  if (!(h->plan = ms_plan_compile(m, &co, NULL))) return -1;
  if (cut) cut(h->plan);
  const struct ms_plan *p = h->plan;
  const struct ms_model_config *c = &m->cfg;
  int W = n_ctas - 1, max_pages = (MAXCTX + PAGE - 1) / PAGE, pool_pages = max_pages * B;
  /* activations, KV cache, scratch as the CPU engine lays them out */
  h->buf = calloc((size_t)p->n_bufs, sizeof *h->buf);
  for (int b = 0; b < p->n_bufs; b++)
    if (!p->bufs[b].logical)
      h->buf[b] = calloc((size_t)p->bufs[b].planes * B * (size_t)p->bufs[b].cols, sizeof(float));
  size_t kv = (size_t)c->n_layers * (size_t)pool_pages * PAGE * (size_t)(c->n_kv_heads * c->head_dim);
  h->k_pool = calloc(kv, sizeof(float));
  h->v_pool = calloc(kv, sizeof(float));
  h->scratch = calloc((size_t)n_ctas + 1, sizeof *h->scratch);  /* NULL-terminated */
  for (int i = 0; i < n_ctas; i++) h->scratch[i] = calloc(MAXCTX, sizeof(float));
  h->cls_w = calloc((size_t)p->n_classes, sizeof *h->cls_w);
  ms_ops_bind_weights(p, m, h->cls_w);
  h->pages = calloc((size_t)pool_pages, sizeof(int32_t));
  for (int i = 0; i < pool_pages; i++) h->pages[i] = pool_pages - 1 - i;  /* not the identity */
  for (int r = 0; r < B; r++) h->row_pages[r] = h->pages + r * max_pages;
  h->x = (struct ms_exec_ctx){.m = m, .plan = p, .buf = h->buf, .max_rows = B,
                              .cls_w = (const struct ms_weight *const(*)[3])h->cls_w,
                              .meta = {.n_rows = 0, .row_slot = h->row_slot, .row_pos = h->row_pos,
                                       .row_token = h->row_token, .row_pages = h->row_pages},
                              .k_pool = h->k_pool, .v_pool = h->v_pool, .page_size = PAGE,
                              .pool_pages = pool_pages, .scratch = h->scratch};
  /* the device context: only what the scheduler reads */
  h->dx.tasks = p->tasks;
  h->dx.n_tasks = p->n_tasks;
  h->dx.cfg.vocab = c->vocab;
  h->dx.max_rows = h->dx.batch = B;
  h->dx.n_rows = &h->n_rows;
  h->dx.row_slot = h->row_slot;
  h->dx.row_pos = h->row_pos;
  h->dx.row_token = h->row_token;
  h->dx.sampled = h->sampled;
  /* AOT lists round-robin in plan order, the step start is the scheduler's (as engine.cu) */
  h->aot = calloc((size_t)p->n_tasks + 1, sizeof(int32_t));
  h->aot_off = calloc((size_t)W + 1, sizeof(int32_t));
  int n = 0;
  for (int w = 0; w < W; w++) {
    h->aot_off[w] = n;
    int rr = 0;
    for (int t = 1; t < p->n_tasks; t++) {
      if (p->tasks[t].launch != MS_LAUNCH_AOT) continue;
      if (rr++ % W == w) h->aot[n++] = t;
    }
  }
  h->aot_off[W] = n;
  uint32_t jit_cap = pow2_at_least((uint64_t)p->stats.jit_tasks + 1);
  uint32_t fired_cap = pow2_at_least(2ull * (uint64_t)p->n_events);
  h->counters = calloc((size_t)p->n_events, sizeof(uint64_t));
  h->jit_q = calloc((size_t)W * jit_cap, sizeof(int32_t));
  h->jit_head = calloc((size_t)W, sizeof(uint32_t));
  h->jit_tail = calloc((size_t)W, sizeof(uint32_t));
  h->fired = calloc(fired_cap, sizeof(int32_t));
  h->beats = calloc((size_t)n_ctas, sizeof *h->beats);
  for (int i = 0; i < MSD_MAX_SLOTS; i++) h->sched.slot_req[i] = -1;
  struct msd_rt *r = &h->rt;
  r->x = &h->dx;
  r->events = p->events;
  r->n_events = p->n_events;
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
  r->slot_gen = h->sched.slot_gen;
  r->host = &h->host;
  r->req = h->req;
  r->prompt_pool = h->prompt;
  r->out_pool = h->out;
  r->n_req = NREQ;
  r->beats = h->beats;
  r->hooks = &h->hooks;
  for (int i = 0; i < NREQ; i++) {
    h->req[i] = (struct msd_hreq){.n_prompt = PROMPT, .max_new = NEW, .prompt_off = i * PROMPT,
                                  .out_off = i * NEW, .logits_off = -1};
    for (int k = 0; k < PROMPT; k++) h->prompt[i * PROMPT + k] = (5 + 37 * i + 11 * k) % c->vocab;
  }
  h->host.n_submitted = NREQ;
  h->host.exit_when_idle = 1;
  g_x = &h->x;
  return 0;
}

static void teardown(struct harness *h) {
  for (int b = 0; h->plan && b < h->plan->n_bufs; b++) free(h->buf[b]);
  for (int i = 0; h->scratch && h->scratch[i]; i++) free(h->scratch[i]);
  free(h->buf), free(h->k_pool), free(h->v_pool), free(h->scratch), free(h->cls_w), free(h->pages);
  free(h->aot), free(h->aot_off), free(h->counters), free(h->jit_q), free(h->jit_head), free(h->jit_tail);
  free(h->fired), free(h->beats);
  ms_plan_free(h->plan);
}

struct cta_arg {
  struct harness *h;
  unsigned cta;
};

static void *cta_main(void *arg) {
  struct cta_arg *a = arg;
  blockIdx.x = a->cta;
  g_rng = 0x9e3779b97f4a7c15ull * (a->cta + 1);
  msd_megakernel(a->h->rt);
  return NULL;
}

/* Runs the kernel: one thread per CTA; 0 when every CTA returned. */
static int launch(struct harness *h, int n_ctas) {
  pthread_t th[16];
  struct cta_arg args[16];
  for (int i = 0; i < n_ctas; i++) {
    args[i] = (struct cta_arg){h, (unsigned)i};
    if (pthread_create(&th[i], NULL, cta_main, &args[i])) return -1;
  }
  for (int i = 0; i < n_ctas; i++) pthread_join(th[i], NULL);
  return 0;
}

/* The CPU engine's tokens for the same prompts. */
static void cpu_tokens(const struct ms_model *m, int32_t out[NREQ][NEW]) {
  struct ms_engine_opts eo = {.sz = sizeof eo, .max_batch = B, .max_ctx = MAXCTX, .n_workers = 2};
  struct ms_engine *e = ms_engine_new(m, &eo, NULL);
  for (int i = 0; i < NREQ; i++) {
    int32_t prompt[PROMPT];
    for (int k = 0; k < PROMPT; k++) prompt[k] = (5 + 37 * i + 11 * k) % m->cfg.vocab;
    struct ms_request_opts ro = {.sz = sizeof ro, .prompt = prompt, .n_prompt = PROMPT, .max_new_tokens = NEW};
    struct ms_request *q = ms_engine_submit(e, &ro);
    ms_request_wait(q, -1);
    struct ms_request_info info;
    ms_request_get_info(q, &info);
    memcpy(out[i], info.tokens, sizeof(int32_t) * NEW);
    ms_request_free(q);
  }
  ms_engine_free(e);
}

static int body_tasks(const struct ms_plan *p) {
  return p->n_tasks - 1;  /* all but the step start run on a worker */
}

static int trigger_events(const struct ms_plan *p) {
  int n = 0;
  for (int e = 0; e < p->n_events; e++) n += p->trig_off[e + 1] > p->trig_off[e];
  return n;
}

static void check_preset(const char *preset) {
  struct ms_model_config cfg;
  CHECK(ms_preset_config(preset, MS_DTYPE_BF16, &cfg) == 0);
  struct ms_model *m = ms_model_synth(&cfg, 1);
  int32_t ref[NREQ][NEW];
  cpu_tokens(m, ref);
  static const int ctas[] = {2, 3, 6};
  for (int ci = 0; ci < 3; ci++)
    for (int delay = 0; delay < 2; delay++) {
      struct harness *h = calloc(1, sizeof *h);
      CHECK(setup(h, m, ctas[ci], NULL) == 0);
      for (int k = 0; k < MS_HOOK_COUNT; k++) h->hooks.armed[k] = 1;
      h->hooks.hint = delay;  /* the second run also dispatches by priority */
      g_delay_us = delay ? 200 : 0;
      CHECK(launch(h, ctas[ci]) == 0);
      const struct ms_plan *p = h->plan;
      uint64_t steps = h->host.steps;
      int same = 1;
      for (int i = 0; i < NREQ; i++) same &= !memcmp(ref[i], h->out + i * NEW, sizeof(int32_t) * NEW);
      CHECKF(same, "%s, %d CTAs, delays %d: tokens differ from the CPU engine's", preset, ctas[ci], delay);
      CHECKF(h->host.exited && h->host.n_finished == NREQ, "%s: exited %u finished %u", preset, h->host.exited,
             h->host.n_finished);
      for (int i = 0; i < NREQ; i++) CHECK(h->req[i].done && h->req[i].n_tokens == NEW);
      /* every request needs PROMPT + NEW - 1 positions; B rows at a time */
      CHECKF(h->host.positions == (uint64_t)NREQ * (PROMPT + NEW - 1), "positions %llu",
             (unsigned long long)h->host.positions);
      CHECK(h->host.tokens == (uint64_t)NREQ * NEW);
      struct msd_hooks *k = &h->hooks;
      CHECKF(k->fired[MS_HOOK_TASK_BEGIN] == steps * (uint64_t)body_tasks(p) &&
                 k->fired[MS_HOOK_TASK_END] == k->fired[MS_HOOK_TASK_BEGIN],
             "task_begin %llu task_end %llu, want %llu", (unsigned long long)k->fired[MS_HOOK_TASK_BEGIN],
             (unsigned long long)k->fired[MS_HOOK_TASK_END], (unsigned long long)(steps * body_tasks(p)));
      CHECKF(k->fired[MS_HOOK_DEP_RELEASE] == steps * (uint64_t)trigger_events(p), "dep_release %llu want %llu",
             (unsigned long long)k->fired[MS_HOOK_DEP_RELEASE], (unsigned long long)(steps * trigger_events(p)));
      CHECK(k->fired[MS_HOOK_TASK_READY] == steps * (uint64_t)body_tasks(p));
      CHECK(k->fired[MS_HOOK_STEP] == 2 * steps);
      CHECK(k->phase[MS_REQ_ADMITTED] == NREQ && k->phase[MS_REQ_FINISHED] == NREQ);
      CHECK(k->phase[MS_REQ_FIRST_TOKEN] == NREQ && k->phase[MS_REQ_TOKEN] == NREQ * (NEW - 1));
      CHECK(k->fired[MS_HOOK_TASK_ASSIGN] == steps * (uint64_t)p->stats.jit_tasks);
      CHECK(k->bad == 0);
      for (int c = 0; c < ctas[ci]; c++) CHECKF(h->beats[c].beats > 0, "CTA %d never beat", c);
      if (delay) CHECK(k->hinted == steps * (uint64_t)body_tasks(p));
      printf("%s, %d CTAs, delays %s: %llu steps, tokens %s\n", preset, ctas[ci], delay ? "on" : "off",
             (unsigned long long)steps, same ? "equal" : "DIFFER");
      teardown(h);
      free(h);
    }
  ms_model_free(m);
}

/* A negative control: the first output projection of layer 1 (an AOT task)
 * waits on the step start's event instead of its own, so it can run before the
 * attention it reads. With delays, the tokens must change in some run: the
 * harness can observe a broken order. */
static int cut_target;
static void cut_attention(struct ms_plan *p) {
  for (int t = 0; t < p->n_tasks; t++)
    if (p->tasks[t].kernel == MS_K_WO && p->tasks[t].launch == MS_LAUNCH_AOT &&
        p->classes[p->tasks[t].cls].layer == 1) {
      cut_target = t;
      p->tasks[t].wait = p->tasks[0].trigger;
      return;
    }
}

static void check_negative(void) {
  struct ms_model_config cfg;
  ms_preset_config("tiny", MS_DTYPE_BF16, &cfg);
  struct ms_model *m = ms_model_synth(&cfg, 1);
  int32_t ref[NREQ][NEW];
  cpu_tokens(m, ref);
  int differed = 0;
  for (int run = 0; run < 4 && !differed; run++) {
    struct harness *h = calloc(1, sizeof *h);
    CHECK(setup(h, m, 3, cut_attention) == 0);
    g_delay_us = 3000;
    CHECK(launch(h, 3) == 0);
    for (int i = 0; i < NREQ; i++) differed |= memcmp(ref[i], h->out + i * NEW, sizeof(int32_t) * NEW) != 0;
    teardown(h);
    free(h);
  }
  g_delay_us = 0;
  CHECKF(differed, "a removed dependency (task %d) went unnoticed in 4 delayed runs", cut_target);
  ms_model_free(m);
}

/* A task that never ends: the heartbeat names it while the run is stuck (what
 * the host's watchdog reports), and the run finishes once it is let go. */
struct stuck_run {
  struct harness *h;
  int n_ctas;
};

static void *stuck_main(void *arg) {
  struct stuck_run *r = arg;
  launch(r->h, r->n_ctas);
  return NULL;
}

static void check_heartbeat(void) {
  struct ms_model_config cfg;
  ms_preset_config("tiny", MS_DTYPE_BF16, &cfg);
  struct ms_model *m = ms_model_synth(&cfg, 1);
  struct harness *h = calloc(1, sizeof *h);
  CHECK(setup(h, m, 3, NULL) == 0);
  int t = -1;
  for (int i = 0; i < h->plan->n_tasks && t < 0; i++)
    if (h->plan->tasks[i].kernel == MS_K_DOWN) t = i;
  atomic_store(&g_release, 0);
  atomic_store(&g_stuck_task, t);
  struct stuck_run r = {h, 3};
  pthread_t th;
  CHECK(pthread_create(&th, NULL, stuck_main, &r) == 0);
  int seen = -1;
  for (int ms = 0; ms < 10000 && seen < 0; ms++) {
    usleep(1000);
    for (int c = 1; c < 3; c++)
      if (h->beats[c].running == t) seen = c;
  }
  char name[96];
  ms_plan_task_name(h->plan, t, name, sizeof name);
  CHECKF(seen > 0, "no CTA's heartbeat names the stuck task %s", name);
  CHECK(h->host.n_finished == 0);
  printf("heartbeat: CTA %d reports running %s while it is stuck\n", seen, name);
  atomic_store(&g_release, 1);
  pthread_join(th, NULL);
  atomic_store(&g_stuck_task, -1);
  CHECK(h->host.exited && h->host.n_finished == NREQ);
  teardown(h);
  free(h);
  ms_model_free(m);
}

int main(void) {
  check_heartbeat();
  check_preset("tiny");
  check_preset("tiny-moe");
  check_preset("tiny-qwen3");
  check_negative();
  TEST_MAIN_END();
}
