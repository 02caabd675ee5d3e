/* SPDX-License-Identifier: MIT */
/* The CUDA backend against the CPU engine (label gpu; exits 77 without a GPU):
 * tokens of the persistent kernel and of the per-op baseline equal the CPU
 * engine's on tiny, tiny-moe, tiny-qwen2, tiny-gemma3 and smollm2-135m (bf16 weights on both sides), with
 * more requests than rows (continuous batching); logits agree within 1e-2; a
 * monitor attached, replaced and detached while the kernel runs counts its
 * coverage on the device and leaves the tokens unchanged; a trigger that is
 * never counted (a fault for tests) ends the run with the watchdog's report
 * naming the waiting task, its event and the producer that did not trigger,
 * and the engine frees cleanly (the kernel was asked to return), in a run
 * and in fed mode (a step handed over, as the engine's backend does).
 * tests/test_engine_host.c runs these checks (small presets) against
 * engine.cu compiled for the CPU. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "megascope/cuda.h"
#include "megascope/cuda_diag.h"
#include "megascope/engine.h"
#include "megascope/monitor.h"
#include "megascope/plan_ir.h"
#include "test.h"
#ifdef MS_CUDA_EMU_COUNTS  /* tests/test_engine_host.c: the emulated runtime counts calls that may block */
#include "emu/cuda_runtime.h"
#endif

#define NREQ 6
#define PROMPT 3
#define NEW 8

static char log_text[1 << 16];

static struct ms_textbuf fresh_log(void) {
  log_text[0] = 0;
  struct ms_textbuf t = {log_text, sizeof log_text, 0, 0};
  return t;
}

struct run {
  int32_t prompt[NREQ][PROMPT];
  int32_t tokens[NREQ][NEW];
  float *logits[NREQ];
  struct ms_cuda_request r[NREQ];
};

static void run_init(struct run *x, int vocab, int with_logits) {
  memset(x, 0, sizeof *x);
  for (int i = 0; i < NREQ; i++) {
    for (int k = 0; k < PROMPT; k++) x->prompt[i][k] = (5 + 37 * i + 11 * k) % vocab;
    x->r[i].prompt = x->prompt[i];
    x->r[i].n_prompt = PROMPT;
    x->r[i].max_new = NEW;
    x->r[i].tokens = x->tokens[i];
    if (with_logits) x->r[i].logits = x->logits[i] = malloc(sizeof(float) * (PROMPT + NEW - 1) * (size_t)vocab);
  }
}

static void run_free(struct run *x) {
  for (int i = 0; i < NREQ; i++) free(x->logits[i]);
}

/* The CPU engine's tokens and logits for the same prompts. */
static int cpu_reference(const struct ms_model *m, struct run *ref) {
  struct ms_textbuf log = fresh_log();
  struct ms_engine_opts eo = {.sz = sizeof eo, .max_batch = 4, .max_ctx = PROMPT + NEW + 1, .n_workers = 2};
  struct ms_engine *e = ms_engine_new(m, &eo, &log);
  if (!e) return -1;
  for (int i = 0; i < NREQ; i++) {
    struct ms_request_opts ro = {.sz = sizeof ro, .prompt = ref->prompt[i], .n_prompt = PROMPT,
                                 .max_new_tokens = NEW, .record_logits = 1};
    struct ms_request *q = ms_engine_submit(e, &ro);
    if (!q) return -1;
    ms_request_wait(q, -1);
    struct ms_request_info info;
    ms_request_get_info(q, &info);
    ref->r[i].n_tokens = info.n_tokens;
    memcpy(ref->tokens[i], info.tokens, sizeof(int32_t) * (size_t)info.n_tokens);
    memcpy(ref->logits[i], info.logits, sizeof(float) * (size_t)info.n_logits * (size_t)m->cfg.vocab);
    ms_request_free(q);
  }
  ms_engine_free(e);
  return 0;
}

static void compare(const char *what, const struct ms_model *m, const struct run *ref, const struct run *got) {
  int V = m->cfg.vocab;
  for (int i = 0; i < NREQ; i++) {
    CHECKF(got->r[i].n_tokens == NEW, "%s request %d: %d tokens", what, i, got->r[i].n_tokens);
    int same = !memcmp(ref->tokens[i], got->tokens[i], sizeof(int32_t) * NEW);
    CHECKF(same, "%s request %d: tokens differ from the CPU engine's", what, i);
    if (!got->logits[i]) continue;
    double worst = 0, scale = 1e-6;
    for (int p = 0; p < PROMPT + NEW - 1; p++)
      for (int v = 0; v < V; v++) {
        double a = ref->logits[i][(size_t)p * V + v], b = got->logits[i][(size_t)p * V + v];
        if (fabs(a) > scale) scale = fabs(a);
        if (fabs(a - b) > worst) worst = fabs(a - b);
      }
    CHECKF(worst <= 1e-2 * scale, "%s request %d: max |logit diff| %g (scale %g)", what, i, worst, scale);
  }
}

static struct ms_cuda_engine *engine(const struct ms_model *m, enum ms_cuda_mode mode) {
  struct ms_textbuf log = fresh_log();
  struct ms_cuda_opts o = {.sz = sizeof o, .mode = mode, .max_batch = 4, .max_ctx = PROMPT + NEW + 1,
                           .watchdog_ms = 10000};
  struct ms_cuda_engine *e = ms_cuda_engine_new(m, &o, &log);
  if (!e) fprintf(stderr, "engine: %s\n", log_text);
  return e;
}

static void check_model(const char *preset) {
  struct ms_model_config cfg;
  if (ms_preset_config(preset, MS_DTYPE_BF16, &cfg)) {
    CHECKF(0, "preset %s", preset);
    return;
  }
  struct ms_model *m = ms_model_synth(&cfg, 1);
  struct run ref, mk, po;
  run_init(&ref, cfg.vocab, 1);
  run_init(&mk, cfg.vocab, 1);
  run_init(&po, cfg.vocab, 1);
  CHECK(cpu_reference(m, &ref) == 0);
  for (int mode = 0; mode < 2; mode++) {
    struct run *x = mode ? &po : &mk;
    struct ms_cuda_engine *e = engine(m, mode ? MS_CUDA_PER_OP : MS_CUDA_MEGAKERNEL);
    CHECKF(e != NULL, "%s: engine", preset);
    if (!e) continue;
    struct ms_textbuf log = fresh_log();
    int rc = ms_cuda_generate(e, x->r, NREQ, &log);
    CHECKF(rc == 0, "%s %s: %d %s", preset, mode ? "per-op" : "megakernel", rc, log_text);
    char what[64];
    snprintf(what, sizeof what, "%s %s", preset, mode ? "per-op" : "megakernel");
    if (!rc) compare(what, m, &ref, x);
    printf("%s: tokens of request 0:", what);
    for (int k = 0; k < x->r[0].n_tokens; k++) printf(" %d", x->tokens[0][k]);
    printf("\n");
    ms_cuda_engine_free(e);
  }
  run_free(&ref);
  run_free(&mk);
  run_free(&po);
  ms_model_free(m);
}

/* A monitor attached, replaced and detached while the kernel runs. */
static void check_monitors(void) {
  const char *dir = getenv("MS_MONITORS");
  char a[512], b[512];
  snprintf(a, sizeof a, "%s/class_time.bpf.o", dir ? dir : "build/monitors");
  snprintf(b, sizeof b, "%s/queueing.bpf.o", dir ? dir : "build/monitors");
  struct ms_model_config cfg;
  ms_preset_config("tiny", MS_DTYPE_BF16, &cfg);
  struct ms_model *m = ms_model_synth(&cfg, 1);
  struct run ref, x;
  run_init(&ref, cfg.vocab, 1);
  run_init(&x, cfg.vocab, 0);
  CHECK(cpu_reference(m, &ref) == 0);
  struct ms_cuda_engine *e = engine(m, MS_CUDA_MEGAKERNEL);
  CHECK(e != NULL);
  if (!e) goto out;
  struct ms_textbuf log = fresh_log();
  CHECKF(ms_cuda_start(e, x.r, NREQ, &log) == 0, "start: %s", log_text);
#ifdef MS_CUDA_EMU_COUNTS
  const uint64_t blocking0 = ms_emu_cuda_blocking;
#endif
  struct ms_monitor *ma = ms_monitor_open(a, &log), *mb = ms_monitor_open(b, &log);
  CHECKF(ma && mb, "open: %s", log_text);
  int id = ma ? ms_cuda_attach(e, ma, NULL, &log) : -1;
  CHECKF(id > 0, "attach: %d %s", id, log_text);
  struct ms_coverage cv = {0};
  while (id > 0 && !ms_cuda_coverage(e, id, &cv) && !cv.executed && ms_cuda_finished(e) < NREQ) {
  }
  CHECKF(cv.executed > 0 || ms_cuda_finished(e) == NREQ, "generation 1 ran no program");
  int rr = id > 0 && mb ? ms_cuda_replace(e, id, mb, &log) : -1;
  CHECKF(rr == 0, "replace: %d %s", rr, log_text);
#ifdef MS_CUDA_EMU_COUNTS  /* the attach, its read-outs and the replace beside the kernel */
  CHECKF(ms_emu_cuda_blocking == blocking0, "%llu calls that may wait for the running kernel, the last %s",
         (unsigned long long)(ms_emu_cuda_blocking - blocking0), ms_emu_cuda_blocking_what);
#endif
  CHECK(ms_cuda_wait(e, &log) == 0);
  CHECK(ms_cuda_coverage(e, id, &cv) == 0);
  CHECK(cv.generation == 2);
  printf("monitor: generation %u, eligible %llu, executed %llu, throttled %llu\n", (unsigned)cv.generation,
         (unsigned long long)cv.eligible, (unsigned long long)cv.executed, (unsigned long long)cv.throttled);
  CHECKF(cv.eligible >= cv.executed + cv.throttled, "eligible %llu executed %llu throttled %llu",
         (unsigned long long)cv.eligible, (unsigned long long)cv.executed, (unsigned long long)cv.throttled);
  CHECK(cv.failed == 0);
  CHECK(ms_cuda_detach(e, id) == 0);
  CHECK(ms_cuda_detach(e, id) == -ENOENT);
  FILE *f = tmpfile();
  CHECK(ms_cuda_attach_write(e, id, f, 1) == 0);
  if (f) fclose(f);
  for (int i = 0; i < NREQ; i++) CHECKF(!memcmp(ref.tokens[i], x.tokens[i], sizeof(int32_t) * NEW), "req %d", i);
  ms_cuda_engine_free(e);
out:
  run_free(&ref);
  run_free(&x);
  ms_model_free(m);
}

/* A task whose trigger is lost: its event never fires, the CTAs waiting on it
 * spin (and beat), and the watchdog must say who waits on what. */
static void check_stuck(void) {
  struct ms_model_config cfg;
  ms_preset_config("tiny", MS_DTYPE_BF16, &cfg);
  struct ms_model *m = ms_model_synth(&cfg, 1);
  struct ms_cuda_engine *e = engine(m, MS_CUDA_MEGAKERNEL);
  int lost = -1;
  const struct ms_plan *p = e ? ms_cuda_plan(e) : NULL;
  for (int t = 1; p && t < p->n_tasks && lost < 0; t++) {  /* a task whose event others wait on */
    int ev = p->tasks[t].trigger;
    if (ev >= 0 && ev != p->end_event && p->events[ev].first <= p->events[ev].last) lost = t;
  }
  char name[96] = "", want[160];
  if (p && lost >= 0) ms_plan_task_name(p, lost, name, sizeof name);
  ms_cuda_engine_free(e);
  CHECKF(lost >= 0, "tiny's plan has no task with consumers");
  struct ms_textbuf log = fresh_log();
  struct ms_cuda_opts o = {.sz = sizeof o, .mode = MS_CUDA_MEGAKERNEL, .max_batch = 4, .max_ctx = PROMPT + NEW + 1,
                           .watchdog_ms = 1000, .fault_lost_trigger = lost + 1};
  e = lost >= 0 ? ms_cuda_engine_new(m, &o, &log) : NULL;
  struct run x;
  run_init(&x, cfg.vocab, 0);
  if (e) {
    log = fresh_log();
    uint64_t t0 = ms_now_ns();
    int rc = ms_cuda_generate(e, x.r, NREQ, &log);
    printf("lost trigger of %s: rc %d after %.1f s; the report:\n%s", name, rc, (double)(ms_now_ns() - t0) / 1e9,
           log_text);
    snprintf(want, sizeof want, "not yet triggered: %s (task %d)", name, lost);
    CHECKF(rc == -MS_E_STALL && strstr(log_text, "cuda: stuck: no task finished") && strstr(log_text, "waits to run") &&
               strstr(log_text, want),
           "lost trigger: rc %d, report: %s", rc, log_text);
    ms_cuda_engine_free(e);
  }
  run_free(&x);
  ms_model_free(m);
}

/* The same lost trigger in fed mode (the engine's CUDA backend's path): the
 * step's wait gives up with the watchdog's report, and the kernel was asked
 * to return, so the feed stops and the engine frees. */
static void check_stuck_fed(void) {
  struct ms_model_config cfg;
  ms_preset_config("tiny", MS_DTYPE_BF16, &cfg);
  struct ms_model *m = ms_model_synth(&cfg, 1);
  struct ms_textbuf log = fresh_log();
  struct ms_cuda_opts o = {.sz = sizeof o, .mode = MS_CUDA_MEGAKERNEL, .max_batch = 4, .max_ctx = PROMPT + NEW + 1,
                           .watchdog_ms = 1000, .fault_lost_trigger = 1 + 1};  /* task 1: embed[row 0] */
  struct ms_cuda_engine *e = ms_cuda_engine_new(m, &o, &log);
  CHECKF(e != NULL, "engine: %s", log_text);
  if (e) {
    char name[96] = "", want[160];
    ms_plan_task_name(ms_cuda_plan(e), 1, name, sizeof name);
    snprintf(want, sizeof want, "not yet triggered: %s (task 1)", name);
    struct ms_cuda_row row = {.slot = 0, .pos = 0, .token = 5, .page = 0, .gen = 1};
    const int32_t *tokens = NULL;
    const float *logits = NULL;
    log = fresh_log();
    int rc = ms_cuda_feed_start(e, &log);
    CHECKF(rc == 0, "feed start: %d %s", rc, log_text);
    uint64_t t0 = ms_now_ns();
    if (!rc) rc = ms_cuda_feed_step(e, 1, &row, 1, NULL, 0, &log);
    if (!rc) rc = ms_cuda_feed_wait(e, &tokens, &logits, &log);
    printf("fed step with the lost trigger of %s: rc %d after %.1f s\n", name, rc, (double)(ms_now_ns() - t0) / 1e9);
    CHECKF(rc == -MS_E_STALL && strstr(log_text, "cuda: stuck: no task finished") && strstr(log_text, want),
           "fed lost trigger: rc %d, report: %s", rc, log_text);
    ms_cuda_feed_stop(e, NULL);
    ms_cuda_engine_free(e);
  }
  ms_model_free(m);
}

int main(void) {
  char why[256];
  if (!ms_cuda_available(why, sizeof why)) {
    printf("skipped: %s\n", why);
    return 77;
  }
  char desc[256];
  ms_cuda_describe(desc, sizeof desc);
  printf("device: %s\n", desc);
  check_model("tiny");
  check_model("tiny-moe");
  check_model("tiny-qwen2");
  check_model("tiny-gemma3");
#ifndef MS_CUDA_ENGINE_SMALL  /* tests/test_engine_host.c: the CPU emulation, small presets only */
  check_model("smollm2-135m");
#endif
  check_monitors();
  check_stuck();
  check_stuck_fed();
  TEST_MAIN_END();
}
