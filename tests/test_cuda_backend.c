/* SPDX-License-Identifier: MIT */
/* The CUDA backend behind the engine (label gpu; exits 77 without a GPU):
 * ms_engine_new with MS_BACKEND_CUDA, in megakernel and per-op mode, against
 * the CPU engine on the same bf16 model: greedy and seeded-sampling tokens
 * equal, logits within 1e-2; without recorded logits, the seeded draws made
 * on the device (only token ids come back: the backend's log counts the
 * rows drawn there) and still equal; more requests than rows, requests submitted while
 * the resident kernel runs, the engine's statistics and step log filled
 * by the shared step machine, and its per-class aggregates by the device;
 * attention's work_rows on sliding-window layers as the CPU engine counts
 * them. tests/test_cuda_backend_host.c runs the same
 * checks against the CUDA sources compiled for the CPU (tests/emu). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "megascope/cuda.h"
#include "megascope/cuda_diag.h"
#include "megascope/engine.h"
#include "megascope/attach.h"
#include "megascope/plan.h"
#include "megascope/query.h"
#include "megascope/export.h"
#include "megascope/telemetry.h"
#include "live_query.h"
#include "test.h"
#ifdef MS_CUDA_EMU_COUNTS  /* tests/test_cuda_backend_host.c: the emulated runtime counts calls that may block */
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

struct result {
  int n_tokens[NREQ];
  int32_t tokens[NREQ][NEW];
  float *logits[NREQ];
};

/* The device's task trace of a whole run (started before the first request,
 * stopped after the last): a record for every task the device ran, none lost,
 * all inside the recording window; written out with slices on every device
 * worker's track and flows from producers to consumers. */
static void check_trace(struct ms_engine *e, const struct ms_engine_stats *st) {
  CHECK(ms_engine_trace_stop(e) == 0);
  struct ms_trace_stats ts;
  ms_engine_trace_stats(e, &ts);
  CHECKF(ts.records == st->tasks && ts.dropped == 0, "cuda trace: %llu records (%llu dropped), %llu tasks ran",
         (unsigned long long)ts.records, (unsigned long long)ts.dropped, (unsigned long long)st->tasks);
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  struct ms_trace_write_opts wo = {.sz = sizeof wo, .format = MS_TRACE_JSON};
  struct ms_trace_written w;
  CHECK(f && ms_engine_trace_save(e, f, &wo, &w) == 0);
  if (f) fclose(f);
  CHECKF(w.slices == ts.records && w.flows > 0 && w.outside == 0,
         "cuda trace written: %llu slices, %llu flows, %llu outside the window", (unsigned long long)w.slices,
         (unsigned long long)w.flows, (unsigned long long)w.outside);
  int tracks = 0;
  for (int k = 0; k < ms_engine_n_workers(e); k++) {
    char name[48];
    snprintf(name, sizeof name, "\"tid\":%d,", k);
    tracks += buf && strstr(buf, name) != NULL;
  }
  CHECKF(tracks == ms_engine_n_workers(e) && tracks > 1, "cuda trace: tasks on %d of %d workers' tracks", tracks,
         ms_engine_n_workers(e));
  free(buf);
}

/* class_time attached through the engine while the resident kernel runs;
 * its id, or 0 (and a failed check). */
static int attach_live(struct ms_engine *e) {
  const char *dir = getenv("MS_MONITORS");
  char path[512];
  snprintf(path, sizeof path, "%s/class_time.bpf.o", dir ? dir : "build/monitors");
  struct ms_textbuf log = fresh_log();
  struct ms_monitor *m = ms_monitor_open(path, &log);
  int id = m ? ms_engine_attach(e, m, NULL, &log) : -1;
  CHECKF(id > 0, "attach %s while serving: %d %s", path, id, log_text);
  if (id <= 0 && m) ms_monitor_free(m);
  return id > 0 ? id : 0;
}

/* Runs NREQ requests (half of them submitted once the first has a token, so
 * they arrive while the engine runs; on the megakernel a monitor is attached
 * then) and keeps tokens and logits. */
/* The backend's log line at the engine's stop (its handover figures). */
static char be_log[1024];
static void capture_log(void *user, enum ms_log_level level, const char *msg) {
  (void)user;
  if (level <= MS_LOG_INFO && strstr(msg, "steps handed over")) snprintf(be_log, sizeof be_log, "%s", msg);
}

/* record: the requests record their logits (then the host draws every token). */
static int run(const struct ms_model *m, enum ms_backend be, enum ms_mode mode, int sampled, int record,
               struct result *out) {
  struct ms_textbuf log = fresh_log();
  struct ms_engine_opts eo = {.sz = sizeof eo, .backend = be, .mode = mode, .max_batch = 4,
                              .max_ctx = PROMPT + NEW + 1, .n_workers = 2, .watchdog_ms = 20000};
  struct ms_engine *e = ms_engine_new(m, &eo, &log);
  CHECKF(e != NULL, "engine (%s): %s", ms_backend_name(be), log_text);
  if (!e) return -1;
  const int traced = be == MS_BACKEND_CUDA && mode == MS_MODE_MEGAKERNEL;
  if (be == MS_BACKEND_CUDA)  /* the device's trace; per-op mode's graph has none */
    CHECKF(ms_engine_trace_start(e, 0) == (traced ? 0 : -MS_E_UNSUPP), "trace start on cuda %s",
           traced ? "megakernel" : "per-op");
#ifdef MS_CUDA_EMU_COUNTS
  const uint64_t blocking0 = ms_emu_cuda_blocking;
#endif
  int mon_id = 0;
  struct ms_request *q[NREQ];
  int32_t prompt[NREQ][PROMPT];
  for (int i = 0; i < NREQ; i++) {
    for (int k = 0; k < PROMPT; k++) prompt[i][k] = (5 + 37 * i + 11 * k) % m->cfg.vocab;
    struct ms_request_opts ro = {.sz = sizeof ro, .prompt = prompt[i], .n_prompt = PROMPT,
                                 .max_new_tokens = NEW, .record_logits = record};
    if (sampled) {
      ro.temperature = 0.8f;
      ro.top_p = 0.9f;
      ro.sample_seed = 1000 + (uint64_t)i;
    }
    if (i == NREQ / 2) {  /* the rest arrive while it runs, and a monitor is attached */
      ms_request_wait_tokens(q[0], 0, -1);
      if (be == MS_BACKEND_CUDA && mode == MS_MODE_MEGAKERNEL) mon_id = attach_live(e);
    }
    q[i] = ms_engine_submit(e, &ro);
    CHECKF(q[i] != NULL, "submit %d", i);
    if (!q[i]) return -1;
  }
  for (int i = 0; i < NREQ; i++) {
    CHECK(ms_request_wait(q[i], 60000) == 0);
    struct ms_request_info info;
    ms_request_get_info(q[i], &info);
    CHECKF(info.state == MS_REQ_DONE, "request %d: state %d", i, (int)info.state);
    out->n_tokens[i] = info.n_tokens;
    memcpy(out->tokens[i], info.tokens, sizeof(int32_t) * (size_t)info.n_tokens);
    if (record) {
      out->logits[i] = malloc(sizeof(float) * (size_t)info.n_logits * (size_t)m->cfg.vocab);
      memcpy(out->logits[i], info.logits, sizeof(float) * (size_t)info.n_logits * (size_t)m->cfg.vocab);
    }
    CHECKF(info.n_logits == (record ? PROMPT + NEW - 1 : 0), "request %d: %d logits rows", i, info.n_logits);
    ms_request_free(q[i]);
  }
  struct ms_engine_stats st;
  ms_engine_get_stats(e, &st);
  CHECKF(st.tokens == NREQ * NEW, "%s: %llu tokens counted", ms_backend_name(be), (unsigned long long)st.tokens);
  CHECK(st.steps >= (PROMPT + NEW - 1) * 2);  /* more requests than rows: two rounds at least */
  if (be == MS_BACKEND_CUDA && mode == MS_MODE_MEGAKERNEL) {  /* the device's aggregates, final once drained */
    struct ms_class_stat cs[256];
    int nc = ms_engine_class_stats(e, cs, 256);
    uint64_t tasks = 0, queue_ns = 0;
    for (int c = 0; c < nc && c < 256; c++) tasks += cs[c].tasks, queue_ns += cs[c].queue_ns;
    CHECKF(tasks > 0 && tasks == st.tasks, "class stats on cuda: %llu tasks, %llu counted",
           (unsigned long long)tasks, (unsigned long long)st.tasks);
    CHECKF(queue_ns > 0, "class stats on cuda: queue_ns %llu (the device times ready -> begin)",
           (unsigned long long)queue_ns);
  }
  if (traced) check_trace(e, &st);
  struct ms_step_record rec[4];
  CHECK(ms_engine_step_log(e, rec, 4) == 4 && rec[3].t_end >= rec[3].t_begin && rec[3].rows >= 1);
  if (mon_id > 0) {  /* it ran on the device while the requests did */
    struct ms_coverage cv;
    CHECK(ms_engine_attach_coverage(e, mon_id, 1, &cv) == 0);
    CHECKF(cv.executed > 0 && cv.failed == 0, "class_time attached while serving: executed %llu, failed %llu",
           (unsigned long long)cv.executed, (unsigned long long)cv.failed);
    CHECK(ms_engine_detach(e, mon_id) == 0);
  }
#ifdef MS_CUDA_EMU_COUNTS
  /* the driver's steps, the attach, the read-outs and the detach beside the resident kernel */
  if (be == MS_BACKEND_CUDA)
    CHECKF(ms_emu_cuda_blocking == blocking0, "%llu calls that may wait for the resident kernel, the last %s",
           (unsigned long long)(ms_emu_cuda_blocking - blocking0), ms_emu_cuda_blocking_what);
#endif
  be_log[0] = 0;
  ms_log_set(capture_log, NULL, MS_LOG_INFO);
  ms_engine_free(e);
  ms_log_set(NULL, NULL, MS_LOG_WARN);
  if (be == MS_BACKEND_CUDA) {  /* the handover, measured; and where the tokens were drawn */
    const char *d = strstr(be_log, "rows drawn on the device ");
    long dev = d ? strtol(d + 25, NULL, 10) : -1;
    printf("%s %s %s: %s\n", m->cfg.name, mode == MS_MODE_PER_OP ? "per-op" : "megakernel",
           record ? "(logits recorded)" : "(tokens only)", be_log);
    CHECKF(record ? dev == 0 : dev > 0, "%s: %ld rows drawn on the device (%s)", record ? "recorded" : "tokens only",
           dev, be_log);
  }
  return 0;
}

static void compare(const char *what, const struct ms_model *m, const struct result *ref, const struct result *got) {
  const int V = m->cfg.vocab;
  for (int i = 0; i < NREQ; i++) {
    CHECKF(got->n_tokens[i] == NEW, "%s request %d: %d tokens", what, i, got->n_tokens[i]);
    CHECKF(!memcmp(ref->tokens[i], got->tokens[i], sizeof(int32_t) * NEW), "%s request %d: tokens differ", what, i);
    if (!got->logits[i]) continue;  /* tokens only */
    double worst = 0, scale = 1e-6;
    for (size_t k = 0; k < (size_t)(PROMPT + NEW - 1) * V; k++) {
      double a = ref->logits[i][k], b = got->logits[i][k];
      if (fabs(a) > scale) scale = fabs(a);
      if (fabs(a - b) > worst) worst = fabs(a - b);
    }
    CHECKF(worst <= 1e-2 * scale, "%s request %d: max |logit diff| %g (scale %g)", what, i, worst, scale);
  }
}

static void result_free(struct result *r) {
  for (int i = 0; i < NREQ; i++) free(r->logits[i]);
  memset(r, 0, sizeof *r);
}

static void check_model(const char *preset) {
  struct ms_model_config cfg;
  if (ms_preset_config(preset, MS_DTYPE_BF16, &cfg)) {
    CHECKF(0, "preset %s", preset);
    return;
  }
  struct ms_model *m = ms_model_synth(&cfg, 1);
  for (int sampled = 0; sampled < 2; sampled++) {
    struct result ref = {0};
    if (run(m, MS_BACKEND_CPU, MS_MODE_MEGAKERNEL, sampled, 1, &ref)) continue;
    for (int mode = 0; mode < 2; mode++)
      for (int record = 1; record >= 0; record--) {
        struct result got = {0};
        char what[96];
        snprintf(what, sizeof what, "%s %s %s%s", preset, mode ? "per-op" : "megakernel",
                 sampled ? "sampled" : "greedy", record ? "" : " (tokens only)");
        if (!run(m, MS_BACKEND_CUDA, mode ? MS_MODE_PER_OP : MS_MODE_MEGAKERNEL, sampled, record, &got)) {
          compare(what, m, &ref, &got);
          printf("%s: tokens of request 0:", what);
          for (int k = 0; k < got.n_tokens[0]; k++) printf(" %d", got.tokens[0][k]);
          printf("\n");
        }
        result_free(&got);
      }
    result_free(&ref);
  }
  ms_model_free(m);
}

/* Hook ABI v2's work_rows of attention on a model with sliding-window layers
 * (tiny-gemma3: five of six layers see the last 8 positions), the same
 * requests greedy on the CPU engine and on the device (megakernel): each
 * attention class's positions summed, equal on both (the CPU's two parts a
 * row and KV group each count their share), and below the context lengths'
 * sum (over each row and group's first part: every part has the row's
 * length) on every local layer (the window counted) but equal to it on the
 * global one. */
#define WIN_CLASSES 16
struct attn_rows {
  char name[WIN_CLASSES][32];
  double rows[WIN_CLASSES], ctx[WIN_CLASSES];
  int n;
};

static int attn_rows_of(json_t *r, int ctx, struct attn_rows *a) {
  size_t i, j;
  json_t *m, *en;
  int found = 0;
  json_array_foreach(json_object_get(r, "maps"), i, m) {
    json_array_foreach(json_object_get(m, "entries"), j, en) {
      const char *k = json_string_value(json_array_get(json_object_get(en, "key"), 0));
      if (!k) continue;
      int c = 0;
      while (c < a->n && strcmp(a->name[c], k)) c++;
      if (c == a->n) {
        if (a->n == WIN_CLASSES) continue;
        snprintf(a->name[a->n++], sizeof a->name[0], "%s", k);
      }
      (ctx ? a->ctx : a->rows)[c] += json_number_value(json_object_get(en, "value"));
      found++;
    }
  }
  return found;
}

/* The schema is the engine's own (its plan's classes: the CPU's fuse the
 * pre-norms, the device's do not), as `run --query` takes it. */
static void window_run(const struct ms_model *m, enum ms_backend be, struct attn_rows *out) {
  struct ms_textbuf log = fresh_log();
  struct ms_engine_opts eo = {.sz = sizeof eo, .backend = be, .max_batch = 4, .max_ctx = PROMPT + NEW + 1,
                              .n_workers = 2, .watchdog_ms = 20000};
  struct ms_engine *e = ms_engine_new(m, &eo, &log);
  CHECKF(e != NULL, "engine (%s): %s", ms_backend_name(be), log_text);
  if (!e) return;
  struct ms_query_schema *s = ms_query_schema_of_plan(ms_engine_plan(e, 1), NULL);
  CHECK(s != NULL);
  struct live rows, ctx;
  CHECK(attach_query(e, s, "task_end /op == attn/ { @[task_class] = sum(work_rows) }", 0, 0, &rows) > 0);
  CHECK(attach_query(e, s, "task_end /op == attn && tile_x == 0/ { @[task_class] = sum(ctx_len) }", 0, 0, &ctx) > 0);
  struct ms_request *q[NREQ];
  int32_t prompt[NREQ][PROMPT];
  for (int i = 0; i < NREQ; i++) {
    for (int k = 0; k < PROMPT; k++) prompt[i][k] = (5 + 37 * i + 11 * k) % m->cfg.vocab;
    struct ms_request_opts ro = {.sz = sizeof ro, .prompt = prompt[i], .n_prompt = PROMPT, .max_new_tokens = NEW};
    q[i] = ms_engine_submit(e, &ro);
    CHECKF(q[i] != NULL, "submit %d", i);
  }
  for (int i = 0; i < NREQ; i++)
    if (q[i]) {  /* no bound of its own: the engine's watchdog ends a stuck run */
      CHECK(ms_request_wait(q[i], -1) == 0);
      struct ms_request_info info;
      ms_request_get_info(q[i], &info);
      CHECKF(info.state == MS_REQ_DONE && info.n_tokens == NEW, "%s request %d: state %d, %d tokens",
             ms_backend_name(be), i, (int)info.state, info.n_tokens);
      ms_request_free(q[i]);
    }
  json_t *r1 = rows.id > 0 ? readout(e, &rows) : NULL, *r2 = ctx.id > 0 ? readout(e, &ctx) : NULL;
  CHECKF(r1 && r2 && attn_rows_of(r1, 0, out) > 0 && attn_rows_of(r2, 1, out) > 0,
         "%s: the attention queries' read-outs", ms_backend_name(be));
  json_decref(r1), json_decref(r2);
  ms_query_free(rows.q), ms_query_free(ctx.q);
  ms_query_schema_free(s);
  ms_engine_free(e);
}

static void check_window(void) {
  struct ms_model_config cfg;
  ms_preset_config("tiny-gemma3", MS_DTYPE_BF16, &cfg);
  struct ms_model *m = ms_model_synth(&cfg, 1);
  CHECK(cfg.sliding_window > 0 && cfg.sliding_window < PROMPT + NEW);
  struct attn_rows cpu = {0}, dev = {0};
  window_run(m, MS_BACKEND_CPU, &cpu);
  window_run(m, MS_BACKEND_CUDA, &dev);
  int local = 0, global = 0;
  CHECKF(cpu.n == cfg.n_layers && dev.n == cpu.n, "attention classes: %d on the CPU, %d on the device", cpu.n, dev.n);
  for (int c = 0; c < cpu.n; c++) {
    int d = 0;
    while (d < dev.n && strcmp(dev.name[d], cpu.name[c])) d++;
    double dr = d < dev.n ? dev.rows[d] : -1;
    printf("  %s: work_rows %.0f on the CPU, %.0f on the device; ctx_len %.0f\n", cpu.name[c], cpu.rows[c], dr,
           cpu.ctx[c]);
    CHECKF(dr == cpu.rows[c], "%s: work_rows %.0f on the device, %.0f on the CPU", cpu.name[c], dr, cpu.rows[c]);
    if (cpu.rows[c] < cpu.ctx[c]) local++;
    if (cpu.rows[c] == cpu.ctx[c] && cpu.ctx[c] > 0) global++;
  }
  CHECKF(local == cfg.n_layers - 1 && global == 1, "%d layers counted their window, %d the whole context", local,
         global);
  ms_model_free(m);
}

/* What the backend does not run is refused by name, and the engine is not made. */
static void check_refusals(void) {
  struct ms_model_config cfg;
  ms_preset_config("tiny", MS_DTYPE_BF16, &cfg);
  struct ms_model *m = ms_model_synth(&cfg, 1);
  struct ms_textbuf log = fresh_log();
  struct ms_engine_opts eo = {.sz = sizeof eo, .backend = MS_BACKEND_CUDA, .max_batch = 2, .tp = 2, .n_workers = 2};
  struct ms_engine *e = ms_engine_new(m, &eo, &log);
  CHECKF(!e && strstr(log_text, "tensor parallelism"), "tp 2 on cuda: %s", log_text);
  ms_engine_free(e);
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
  check_refusals();
  check_window();
  check_model("tiny");
  check_model("tiny-moe");
#ifndef MS_CUDA_ENGINE_SMALL  /* the CPU emulation: the small presets only */
  check_model("tiny-qwen2");
  check_model("smollm2-135m");
#endif
  TEST_MAIN_END();
}
