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
 *   - every CTA's heartbeat moves, and names the task a stuck CTA is running;
 *   - the per-op baseline's kernels (levels) run every task after its producers. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/host_emu.h"
#include "cuda/dev.h"
#include "cuda/layout.h"
#include "megascope/bpf/megascope.h"
#include "test.h"

__thread struct msd_emu_dim blockIdx;

/* ---- the includer's part: hooks that count ------------------------------ */

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

#include "emu/harness.h"

#define NREQ 6
#define NEW 8

static void check_preset(const char *preset) {
  struct ms_model_config cfg;
  CHECK(ms_preset_config(preset, MS_DTYPE_BF16, &cfg) == 0);
  struct ms_model *m = ms_model_synth(&cfg, 1);
  int32_t ref[NREQ][NEW];
  harness_cpu_tokens(m, NREQ, NEW, &ref[0][0]);
  static const int ctas[] = {2, 3, 6};
  for (int ci = 0; ci < 3; ci++)
    for (int delay = 0; delay < 2; delay++) {
      struct harness *h = calloc(1, sizeof *h);
      struct msd_hooks *k = calloc(1, sizeof *k);
      CHECK(harness_setup(h, m, ctas[ci], NREQ, NEW, k, NULL) == 0);
      for (int i = 0; i < MS_HOOK_COUNT; i++) k->armed[i] = 1;
      k->hint = delay;  /* the second run also dispatches by priority */
      g_delay_us = delay ? 200 : 0;
      CHECK(harness_launch(h, ctas[ci]) == 0);
      const struct ms_plan *p = h->plan;
      uint64_t steps = h->host.steps;
      int same = 1;
      for (int i = 0; i < NREQ; i++) same &= !memcmp(ref[i], h->out + i * NEW, sizeof(int32_t) * NEW);
      CHECKF(same, "%s, %d CTAs, delays %d: tokens differ from the CPU engine's", preset, ctas[ci], delay);
      CHECKF(h->host.exited && h->host.n_finished == NREQ, "%s: exited %u finished %u", preset, h->host.exited,
             h->host.n_finished);
      for (int i = 0; i < NREQ; i++) CHECK(h->req[i].done && h->req[i].n_tokens == NEW);
      /* every request needs PROMPT + NEW - 1 positions; B rows at a time */
      CHECKF(h->host.positions == (uint64_t)NREQ * (HARNESS_PROMPT + NEW - 1), "positions %llu",
             (unsigned long long)h->host.positions);
      CHECK(h->host.tokens == (uint64_t)NREQ * NEW);
      CHECKF(k->fired[MS_HOOK_TASK_BEGIN] == steps * (uint64_t)harness_body_tasks(p) &&
                 k->fired[MS_HOOK_TASK_END] == k->fired[MS_HOOK_TASK_BEGIN],
             "task_begin %llu task_end %llu, want %llu", (unsigned long long)k->fired[MS_HOOK_TASK_BEGIN],
             (unsigned long long)k->fired[MS_HOOK_TASK_END], (unsigned long long)(steps * harness_body_tasks(p)));
      CHECKF(k->fired[MS_HOOK_DEP_RELEASE] == steps * (uint64_t)harness_trigger_events(p), "dep_release %llu want %llu",
             (unsigned long long)k->fired[MS_HOOK_DEP_RELEASE], (unsigned long long)(steps * harness_trigger_events(p)));
      CHECK(k->fired[MS_HOOK_TASK_READY] == steps * (uint64_t)harness_body_tasks(p));
      CHECK(k->fired[MS_HOOK_STEP] == 2 * steps);
      CHECK(k->phase[MS_REQ_ADMITTED] == NREQ && k->phase[MS_REQ_FINISHED] == NREQ);
      CHECK(k->phase[MS_REQ_FIRST_TOKEN] == NREQ && k->phase[MS_REQ_TOKEN] == NREQ * (NEW - 1));
      CHECK(k->fired[MS_HOOK_TASK_ASSIGN] == steps * (uint64_t)p->stats.jit_tasks);
      CHECK(k->bad == 0);
      for (int c = 0; c < ctas[ci]; c++) CHECKF(h->beats[c].beats > 0, "CTA %d never beat", c);
      if (delay) CHECK(k->hinted == steps * (uint64_t)harness_body_tasks(p));
      printf("%s, %d CTAs, delays %s: %llu steps, tokens %s\n", preset, ctas[ci], delay ? "on" : "off",
             (unsigned long long)steps, same ? "equal" : "DIFFER");
      harness_teardown(h);
      free(h);
      free(k);
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
  harness_cpu_tokens(m, NREQ, NEW, &ref[0][0]);
  int differed = 0;
  for (int run = 0; run < 4 && !differed; run++) {
    struct harness *h = calloc(1, sizeof *h);
    CHECK(harness_setup(h, m, 3, NREQ, NEW, NULL, cut_attention) == 0);
    g_delay_us = 3000;
    CHECK(harness_launch(h, 3) == 0);
    for (int i = 0; i < NREQ; i++) differed |= memcmp(ref[i], h->out + i * NEW, sizeof(int32_t) * NEW) != 0;
    harness_teardown(h);
    free(h);
  }
  g_delay_us = 0;
  CHECKF(differed, "a removed dependency (task %d) went unnoticed in 4 delayed runs", cut_target);
  ms_model_free(m);
}

/* A task that never ends: the heartbeat names it while the run is stuck (what
 * the host's watchdog reports), and the run finishes once it is let go. */
static void check_heartbeat(void) {
  struct ms_model_config cfg;
  ms_preset_config("tiny", MS_DTYPE_BF16, &cfg);
  struct ms_model *m = ms_model_synth(&cfg, 1);
  struct harness *h = calloc(1, sizeof *h);
  CHECK(harness_setup(h, m, 3, NREQ, NEW, NULL, NULL) == 0);
  int t = -1;
  for (int i = 0; i < h->plan->n_tasks && t < 0; i++)
    if (h->plan->tasks[i].kernel == MS_K_DOWN) t = i;
  atomic_store(&g_release, 0);
  atomic_store(&g_stuck_task, t);
  struct harness_bg bg;
  CHECK(harness_start(&bg, h, 3) == 0);
  int seen = -1;
  for (int ms = 0; ms < 10000 && seen < 0; ms++) {
    usleep(1000);
    for (int c = 1; c < 3; c++)
      if ((int32_t)__atomic_load_n((const int32_t *)&h->beats[c].running, __ATOMIC_RELAXED) == t) seen = c;
  }
  char name[96];
  ms_plan_task_name(h->plan, t, name, sizeof name);
  CHECKF(seen > 0, "no CTA's heartbeat names the stuck task %s", name);
  CHECK(h->host.n_finished == 0);
  printf("heartbeat: CTA %d reports running %s while it is stuck\n", seen, name);
  atomic_store(&g_release, 1);
  CHECK(harness_join(&bg) == 0);
  atomic_store(&g_stuck_task, -1);
  CHECK(h->host.exited && h->host.n_finished == NREQ);
  harness_teardown(h);
  free(h);
  ms_model_free(m);
}

/* The per-op baseline's levels (cuda/layout.h, what engine.cu launches): every
 * task with a body appears once, after every producer it waits on; bodiless
 * tasks are left out. */
static void check_levels(const char *preset, int batch) {
  struct ms_model_config cfg;
  ms_preset_config(preset, MS_DTYPE_BF16, &cfg);
  struct ms_model *m = ms_model_shape(&cfg);
  struct ms_compile_opts co = {.sz = sizeof co, .batch = batch, .tiles_per_op = 8};
  struct ms_plan *p = ms_plan_compile(m, &co, NULL);
  int32_t *order = calloc((size_t)p->n_tasks, sizeof *order), *off = calloc((size_t)p->n_tasks + 1, sizeof *off);
  int *lev = malloc((size_t)p->n_tasks * sizeof *lev), nl = msd_levels(p, order, off), bad = 0, bodies = 0;
  for (int t = 0; t < p->n_tasks; t++) {
    int k = p->tasks[t].kernel;
    lev[t] = -1;
    bodies += k != MS_K_STEP_START && k != MS_K_EMPTY && k != MS_K_COMM;
  }
  for (int l = 0; l < nl; l++)
    for (int i = off[l]; i < off[l + 1]; i++) bad += lev[order[i]] != -1, lev[order[i]] = l;
  CHECKF(off[nl] == bodies && !bad, "%s: %d tasks in levels, %d with bodies, %d twice", preset, off[nl], bodies, bad);
  /* a producer's level: its own, or (bodiless) the highest of its producers' */
  for (int t = 0; t < p->n_tasks; t++) {
    if (lev[t] >= 0 || p->tasks[t].wait < 0) continue;
    int e = p->tasks[t].wait;
    for (int i = p->trig_off[e]; i < p->trig_off[e + 1]; i++)
      if (lev[p->trig[i]] > lev[t]) lev[t] = lev[p->trig[i]];
  }
  for (int t = 0; t < p->n_tasks; t++) {
    int k = p->tasks[t].kernel, e = p->tasks[t].wait;
    if (k == MS_K_STEP_START || k == MS_K_EMPTY || k == MS_K_COMM || e < 0) continue;
    for (int i = p->trig_off[e]; i < p->trig_off[e + 1]; i++) bad += lev[p->trig[i]] >= lev[t];
  }
  CHECKF(!bad, "%s: %d producers not in an earlier level", preset, bad);
  printf("%s batch %d: %d tasks in %d per-op kernels\n", preset, batch, off[nl], nl);
  free(order), free(off), free(lev);
  ms_plan_free(p);
  ms_model_free(m);
}

/* Requests that stop at the model's eos: the eos is made a token the first
 * request emits mid-way, so it finishes early there, exactly as on the CPU. */
static void check_eos(void) {
  struct ms_model_config cfg;
  ms_preset_config("tiny", MS_DTYPE_BF16, &cfg);
  struct ms_model *m = ms_model_synth(&cfg, 1);
  int32_t ref[NREQ][NEW];
  harness_cpu_tokens(m, NREQ, NEW, &ref[0][0]);
  m->cfg.eos = ref[0][NEW / 2];
  harness_stop_eos = 1;
  harness_cpu_tokens(m, NREQ, NEW, &ref[0][0]);
  struct harness *h = calloc(1, sizeof *h);
  CHECK(harness_setup(h, m, 3, NREQ, NEW, NULL, NULL) == 0);
  CHECK(harness_launch(h, 3) == 0);
  int same = 1, early = 0;
  for (int i = 0; i < NREQ; i++) {
    same &= !memcmp(ref[i], h->out + i * NEW, sizeof(int32_t) * NEW);
    early += h->req[i].n_tokens < NEW;
  }
  CHECKF(same, "eos stop: tokens differ from the CPU engine's");
  CHECKF(early > 0 && h->host.n_finished == NREQ, "eos stop: %d requests stopped early, %u finished", early,
         h->host.n_finished);
  printf("eos %d: %d of %d requests stopped early, tokens equal\n", m->cfg.eos, early, NREQ);
  harness_stop_eos = 0;
  harness_teardown(h);
  free(h);
  ms_model_free(m);
}

int main(void) {
  check_eos();
  check_levels("tiny-moe", 4);
  check_levels("smollm2-135m", 1);
  check_heartbeat();
  check_preset("tiny");
  check_preset("tiny-moe");
  check_preset("tiny-qwen3");
  check_negative();
  TEST_MAIN_END();
}
