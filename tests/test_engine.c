/* SPDX-License-Identifier: MIT */
/* The runtime: the reference forward is the oracle; modes, worker counts and
 * shuffled interleavings give identical tokens; continuous batching admits and
 * retires requests between steps; counters are generation-based; an idle engine
 * sleeps; a plan with one dependency removed is caught by shuffled runs; the
 * watchdog names a stall; the CPU backend's default tiling. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "megascope/reference.h"
#include "runtime/runtime_impl.h"
#include "ref_check.h"
#include "test.h"

#define NREQ 4
#define STEPS 24

static struct ms_model *load(const char *preset, enum ms_dtype dt) {
  struct ms_model_config c;
  if (ms_preset_config(preset, dt, &c)) return NULL;
  return ms_model_synth(&c, 3);
}

static int prompt_of(int i, int vocab, int32_t *out) {
  int n = 1 + (5 * i) % 7;
  for (int j = 0; j < n; j++) out[j] = (int32_t)((i * 31 + j * 17 + 5) % vocab);
  return n;
}

struct result {
  int32_t tokens[NREQ][STEPS];
  double max_diff;  /* against the reference, when checked */
};

static int run(const struct ms_model *m, struct ms_engine_opts o, int check, struct result *res) {
  o.sz = sizeof o;
  if (!o.max_batch) o.max_batch = NREQ;
  o.max_ctx = 64;
  struct ms_engine *e = ms_engine_new(m, &o, NULL);
  if (!e) return -1;
  struct ms_request *r[NREQ];
  int32_t prompts[NREQ][8];
  int n[NREQ];
  for (int i = 0; i < NREQ; i++) {
    n[i] = prompt_of(i, m->cfg.vocab, prompts[i]);
    struct ms_request_opts ro = {.sz = sizeof ro, .prompt = prompts[i], .n_prompt = n[i],
                                 .max_new_tokens = STEPS, .record_logits = check};
    r[i] = ms_engine_submit(e, &ro);
  }
  res->max_diff = 0;
  for (int i = 0; i < NREQ; i++) {
    ms_request_wait(r[i], -1);
    struct ms_request_info info;
    ms_request_get_info(r[i], &info);
    memcpy(res->tokens[i], info.tokens, sizeof res->tokens[i]);
    if (info.n_tokens != STEPS || info.state != MS_REQ_DONE) res->max_diff = INFINITY;
    if (check) {
      double d = test_ref_diff(m, &info, prompts[i]);
      if (!(d <= res->max_diff)) res->max_diff = d;
    }
    ms_request_free(r[i]);
  }
  ms_engine_free(e);
  return 0;
}

static void test_oracle_and_determinism(void) {
  const char *presets[] = {"tiny", "tiny-qwen3", "tiny-moe", "tiny-qwen2", "tiny-gemma3"};
  for (int pi = 0; pi < (int)(sizeof presets / sizeof *presets); pi++)
    for (int dt = 0; dt < 2; dt++) {
      struct ms_model *m = load(presets[pi], dt ? MS_DTYPE_BF16 : MS_DTYPE_F32);
      struct result base, other;
      CHECK(run(m, (struct ms_engine_opts){.n_workers = 2}, 1, &base) == 0);
      CHECKF(base.max_diff <= 1e-3, "%s %s: max diff %g", presets[pi], dt ? "bf16" : "f32", base.max_diff);
      struct ms_engine_opts variants[] = {
          {.n_workers = 1}, {.n_workers = 3}, {.n_workers = 4}, {.n_workers = 2, .mode = MS_MODE_PER_OP},
          {.n_workers = 3, .mode = MS_MODE_PER_OP, .shuffle = 1, .seed = 9},
          {.n_workers = 2, .shuffle = 1, .seed = 1}, {.n_workers = 4, .shuffle = 1, .seed = 2},
          {.n_workers = 2, .max_batch = 16},
          /* the caller's tiling: no norm fused into qkv, gate_up and the LM head (the default fuses) */
          {.n_workers = 2, .tile_bytes = 64 * 1024}, {.n_workers = 1, .tile_bytes = 1024 * 1024, .min_tiles = 2},
          /* chunked prefill: prompts in chunks beside decode rows, under budgets that split them */
          {.n_workers = 2, .max_batched_tokens = 8}, {.n_workers = 3, .max_batched_tokens = 5, .shuffle = 1, .seed = 4},
          {.n_workers = 2, .mode = MS_MODE_PER_OP, .max_batched_tokens = 16},
          /* attention in one task a row and KV group, or in three or four parts (some of them empty
           * at the first positions): other sums, as near the reference */
          {.n_workers = 2, .attn_parts = 1}, {.n_workers = 3, .attn_parts = 3, .shuffle = 1, .seed = 5},
          {.n_workers = 4, .attn_parts = 4, .tile_bytes = 64 * 1024}};
      for (size_t v = 0; v < sizeof variants / sizeof variants[0]; v++) {
        /* unfused: its logits the same bits as the fused base's, so the same distance from the reference */
        int unfused = variants[v].tile_bytes != 0, parts = variants[v].attn_parts && variants[v].attn_parts != 2;
        CHECK(run(m, variants[v], unfused || parts, &other) == 0);
        CHECKF(!memcmp(base.tokens, other.tokens, sizeof base.tokens), "%s variant %zu: tokens differ",
               presets[pi], v);
        if (parts)
          CHECKF(other.max_diff <= 1e-3, "%s variant %zu: max diff %g", presets[pi], v, other.max_diff);
        else
          CHECKF(other.max_diff == (unfused ? base.max_diff : 0), "%s variant %zu: max diff %g, fused %g",
                 presets[pi], v, other.max_diff, base.max_diff);
      }
      ms_model_free(m);
    }
}

/* Chunked prefill: a long prompt takes a few steps instead of one per position,
 * every position's logits still match the reference, the tokens are those of
 * one position per step, and a decode row shares the steps. */
static void test_chunked_prefill(void) {
  const char *presets[] = {"tiny", "tiny-moe", "tiny-gemma3"};
  for (int pi = 0; pi < 3; pi++) {
    struct ms_model *m = load(presets[pi], MS_DTYPE_F32);
    int32_t longp[40], shortp[2] = {3, 4};
    for (int i = 0; i < 40; i++) longp[i] = (int32_t)((i * 13 + 7) % m->cfg.vocab);
    int32_t tokens[2][12];
    uint64_t steps[2];
    for (int k = 0; k < 2; k++) {
      struct ms_engine_opts o = {.sz = sizeof o, .n_workers = 2, .max_batch = 2, .max_ctx = 64,
                                 .max_batched_tokens = k ? 16 : 0};
      struct ms_engine *e = ms_engine_new(m, &o, NULL);
      CHECK(e != NULL);
      if (!e) return;
      ms_engine_pause_at(e, 0);
      struct ms_request_opts a = {.sz = sizeof a, .prompt = longp, .n_prompt = 40, .max_new_tokens = 12,
                                  .record_logits = 1};
      struct ms_request_opts b = {.sz = sizeof b, .prompt = shortp, .n_prompt = 2, .max_new_tokens = 20};
      struct ms_request *ra = ms_engine_submit(e, &a), *rb = ms_engine_submit(e, &b);
      ms_engine_resume(e);
      ms_request_wait(ra, -1);
      ms_request_wait(rb, -1);
      struct ms_request_info ia;
      ms_request_get_info(ra, &ia);
      CHECKF(ia.n_tokens == 12 && ia.n_logits == 51, "%s: %d tokens, %d logits", presets[pi], ia.n_tokens, ia.n_logits);
      double d = test_ref_diff(m, &ia, longp);
      CHECKF(d <= 1e-3, "%s chunked %d: max diff %g", presets[pi], k, d);
      memcpy(tokens[k], ia.tokens, sizeof tokens[k]);
      struct ms_engine_stats st;
      ms_engine_get_stats(e, &st);
      steps[k] = st.steps;
      ms_request_free(ra);
      ms_request_free(rb);
      ms_engine_free(e);
    }
    CHECK(!memcmp(tokens[0], tokens[1], sizeof tokens[0]));
    /* 39 prompt positions before the first token: 3 chunks of at most 15 (a decode row takes one) */
    CHECKF(steps[0] >= 51 && steps[1] <= 15 + 12, "%s: %llu steps per position, %llu chunked", presets[pi],
           (unsigned long long)steps[0], (unsigned long long)steps[1]);
    ms_model_free(m);
  }
}

/* The reference's logits at position `at` of a fixed sequence. */
static void ref_logits(const struct ms_model *m, int at, float *lg) {
  struct ms_ref *r = ms_ref_new(m, 64);
  for (int p = 0; p <= at; p++) ms_ref_step(r, (p * 37 + 11) % m->cfg.vocab, lg);
  ms_ref_free(r);
}

/* Each feature of qwen2 and gemma3 changes the reference's logits, so an engine
 * that matches the reference (test_oracle_and_determinism) applies every one:
 * the q/k/v biases, the q/k norm, the post-norms, GeGLU, the embedding scale,
 * the sliding window and its RoPE base, the global layer and the logit cap. */
static void test_arch_features_matter(void) {
  static const char *const what[] = {"qkv bias", "q/k norm", "post-norms", "GeGLU", "embedding scale",
                                     "sliding window", "local RoPE base", "global layer", "logit cap"};
  float *base = malloc(sizeof(float) * 256), *lg = malloc(sizeof(float) * 256);
  for (int f = 0; f < (int)(sizeof what / sizeof *what); f++) {
    struct ms_model *m = load(f ? "tiny-gemma3" : "tiny-qwen2", MS_DTYPE_F32);
    ref_logits(m, 20, base);
    struct ms_model_config *c = &m->cfg;
    switch (f) {
    case 0: c->qkv_bias = 0; break;
    case 1: c->qk_norm = 0; break;
    case 2: c->post_norms = 0; break;
    case 3: c->ffn_act = MS_ACT_SILU; break;
    case 4: c->embed_scale = 0; break;
    case 5: c->sliding_window = 0; break;
    case 6: c->rope_base_local = 0; break;
    case 7: c->swa_pattern = 0; break;  /* the sixth layer local too */
    default: c->final_softcap = 0; break;
    }
    ref_logits(m, 20, lg);
    double d = 0;
    for (int v = 0; v < c->vocab; v++) d = fmax(d, fabs((double)lg[v] - (double)base[v]));
    CHECKF(d > 1e-2, "%s: without it the logits move by %g only", what[f], d);
    ms_model_free(m);
  }
  free(base);
  free(lg);
}

static void test_normalised_plan_runs(void) {
  struct ms_model *m = load("tiny", MS_DTYPE_F32);
  struct result a, b;
  CHECK(run(m, (struct ms_engine_opts){.n_workers = 2}, 0, &a) == 0);
  CHECK(run(m, (struct ms_engine_opts){.n_workers = 3, .tile_rows = 32, .shuffle = 1, .seed = 4}, 1, &b) == 0);
  CHECK(b.max_diff <= 1e-3);
  ms_model_free(m);
}

/* Tasks in bucket 1's plan of an engine with options o (max_batch 1). */
static int engine_tasks(const struct ms_model *m, struct ms_engine_opts o) {
  o.sz = sizeof o, o.max_batch = 1, o.max_ctx = 64;
  struct ms_engine *e = ms_engine_new(m, &o, NULL);
  if (!e) return -1;
  struct ms_plan_stats st;
  ms_plan_get_stats(ms_engine_plan(e, 1), &st);
  ms_engine_free(e);
  return st.tasks;
}

/* Tasks in a plan compiled with co, its attention in `parts`. */
static int compiled_plan_tasks(struct ms_compile_opts *co, const struct ms_model *m, int parts) {
  co->attn_parts = parts;
  struct ms_plan *p = ms_plan_compile(m, co, NULL);
  if (!p) return -1;
  struct ms_plan_stats st;
  ms_plan_get_stats(p, &st);
  ms_plan_free(p);
  return st.tasks;
}

/* Tasks in a plan compiled for batch 1 with tile_bytes tb and at least
 * `least` GEMV tasks an operator (0: the compiler's eight), the pre-norms
 * fused or not. */
static int compiled_tasks(const struct ms_model *m, int tb, int least, int fuse) {
  struct ms_compile_opts co = {.sz = sizeof co, .batch = 1, .tile_bytes = tb, .min_tiles = least, .fuse_norm = fuse};
  return compiled_plan_tasks(&co, m, 0);
}

/* The CPU backend tiles GEMVs by 1 MiB of weights, at least two tasks an
 * operator, fuses the pre-norms into their consumers and cuts each decode
 * row's attention over a KV group in two, unless the caller tiles
 * (runtime/backend/cpu.c): tiny-256's operators are large enough that 64 KiB
 * and 1 MiB give different plans, and small enough that the floor decides at
 * 1 MiB; fused, a layer has two tasks fewer a row (its attn_norm and
 * ffn_norm), the step one fewer (out_norm); in parts, a layer one more a KV
 * group and part; a caller's tile_bytes wins, with the compiler's floor of
 * eight and no fusion, attention still in parts (the same sums whatever the
 * tiling). A backend whose kernels do not norm their
 * own inputs refuses fusion, one that does not merge parts refuses them;
 * prefill plans are cut alike (a position's logits the same bits in a
 * prompt chunk as in a decode step). */
static void test_cpu_tiling_default(void) {
  struct ms_model *m = load("tiny-256", MS_DTYPE_F32);
  const struct ms_backend_info *bi = ms_backend_info(MS_BACKEND_CPU);
  CHECK(bi->tile_bytes == 1024 * 1024 && bi->min_tiles == 2 && bi->fuse_norm);
  int small = compiled_tasks(m, 64 * 1024, 0, 0), large = compiled_tasks(m, 1024 * 1024, 0, 0);
  int floor2 = compiled_tasks(m, 1024 * 1024, bi->min_tiles, 0);
  int fused = compiled_tasks(m, 1024 * 1024, bi->min_tiles, 1);
  CHECK(small > large && large > floor2 && floor2 > 0);
  CHECKF(fused == floor2 - 2 * m->cfg.n_layers - 1, "fused %d, unfused %d", fused, floor2);
  int groups = m->cfg.n_layers * m->cfg.n_kv_heads;
  CHECK(bi->attn_parts == 2 && bi->attn_parts_max == MS_ATTN_MAX_PARTS);
  CHECK(engine_tasks(m, (struct ms_engine_opts){.n_workers = 2}) == fused + groups);
  CHECK(engine_tasks(m, (struct ms_engine_opts){.n_workers = 2, .attn_parts = 4}) == fused + 3 * groups);
  CHECK(engine_tasks(m, (struct ms_engine_opts){.n_workers = 2, .attn_parts = 1}) == fused);
  struct ms_compile_opts pre = {.sz = sizeof pre, .batch = 2, .tile_bytes = 1024 * 1024, .attn_parts = 2};
  int one = compiled_plan_tasks(&pre, m, 0), two = compiled_plan_tasks(&pre, m, 2);
  pre.prefill = 1;
  CHECKF(two == one + 2 * groups && compiled_plan_tasks(&pre, m, 2) == compiled_plan_tasks(&pre, m, 0) + 2 * groups,
         "decode %d / %d tasks, prefill in parts %d", one, two, compiled_plan_tasks(&pre, m, 2));
  char lb[256] = "";
  struct ms_textbuf log = {.buf = lb, .size = sizeof lb};
  struct ms_engine_opts so = {.sz = sizeof so, .backend = MS_BACKEND_SIM, .fuse_norm = 1};
  CHECK(ms_engine_new(m, &so, &log) == NULL && strstr(lb, "fuse_norm"));
  CHECK(!ms_backend_info(MS_BACKEND_SIM)->fuse_norm && !ms_backend_info(MS_BACKEND_CUDA)->fuse_norm);
  CHECK(!ms_backend_info(MS_BACKEND_CUDA)->attn_parts_max && !ms_backend_info(MS_BACKEND_SIM)->attn_parts);
  struct ms_engine_opts five = {.sz = sizeof five, .n_workers = 2, .attn_parts = MS_ATTN_MAX_PARTS + 1};
  lb[0] = 0, log.len = 0;
  CHECK(ms_engine_new(m, &five, &log) == NULL && strstr(lb, "attn_parts"));
  CHECK(engine_tasks(m, (struct ms_engine_opts){.n_workers = 2, .tile_bytes = 64 * 1024}) == small + groups);
  CHECK(engine_tasks(m, (struct ms_engine_opts){.n_workers = 2, .tile_bytes = 1024 * 1024}) == large + groups);
  struct ms_compile_opts bad = {.sz = sizeof bad, .batch = 1, .min_tiles = -1};
  CHECK(ms_plan_compile(m, &bad, NULL) == NULL);
  bad.min_tiles = 0, bad.attn_parts = MS_ATTN_MAX_PARTS + 1;
  CHECK(ms_plan_compile(m, &bad, NULL) == NULL);
  ms_model_free(m);
}

static void test_continuous_batching(void) {
  struct ms_model *m = load("tiny", MS_DTYPE_F32);
  struct ms_engine_opts o = {.sz = sizeof o, .n_workers = 2, .max_batch = 2, .max_ctx = 64, .page_size = 4};
  struct ms_engine *e = ms_engine_new(m, &o, NULL);
  struct ms_request *r[5];
  int32_t prompt[8];
  for (int i = 0; i < 5; i++) {
    int n = prompt_of(i, m->cfg.vocab, prompt);
    struct ms_request_opts ro = {.sz = sizeof ro, .prompt = prompt, .n_prompt = n, .max_new_tokens = 3 + 4 * i};
    r[i] = ms_engine_submit(e, &ro);
    CHECK(r[i] != NULL);
  }
  int max_gen = 0, all_done = 1;
  for (int i = 0; i < 5; i++) {
    CHECK(ms_request_wait(r[i], 10000) == 0);
    struct ms_request_info info;
    ms_request_get_info(r[i], &info);
    all_done &= info.state == MS_REQ_DONE && info.n_tokens == 3 + 4 * i;
    if ((int)info.generation > max_gen) max_gen = (int)info.generation;
    CHECK(info.t_submit <= info.t_admit && info.t_admit <= info.t_first && info.t_first <= info.t_done);
  }
  CHECK(all_done);
  CHECK(max_gen >= 2);  /* a slot was reused: its generation grew */
  struct ms_step_record log[MS_STEP_LOG];
  int n = ms_engine_step_log(e, log, MS_STEP_LOG);
  int late_admit = 0, retire = 0, bucket1 = 0, bucket2 = 0;
  for (int i = 0; i < n; i++) {
    if (i > 0 && log[i].admitted) late_admit = 1;
    retire += log[i].retired;
    bucket1 |= log[i].bucket == 1;
    bucket2 |= log[i].bucket == 2;
    CHECK(log[i].rows <= log[i].bucket);
  }
  CHECK(late_admit);  /* requests joined a running batch */
  CHECK(retire >= 4);
  CHECK(bucket1 && bucket2);
  /* KV pages all returned */
  CHECK(e->n_free == e->pool_pages - 0 || e->n_free >= e->pool_pages - e->max_pages);
  /* generation counters: every event has fired exactly needed x runs times */
  int consistent = 1;
  for (int b = 0; b < e->n_buckets; b++) {
    struct plan_rt *rt = &e->rt[b];
    for (int ev = 0; ev < rt->plan->n_events; ev++)
      consistent &= atomic_load(&rt->counters[ev]) == (uint64_t)rt->plan->events[ev].needed * rt->gen;
  }
  CHECK(consistent);
  for (int i = 0; i < 5; i++) ms_request_free(r[i]);
  ms_engine_free(e);
  ms_model_free(m);
}

static double cpu_seconds(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return (double)ru.ru_utime.tv_sec + (double)ru.ru_stime.tv_sec +
         ((double)ru.ru_utime.tv_usec + (double)ru.ru_stime.tv_usec) / 1e6;
}

static void test_idle_sleeps(void) {
  struct ms_model *m = load("tiny", MS_DTYPE_F32);
  struct ms_engine_opts o = {.sz = sizeof o, .n_workers = 4, .max_batch = 2};
  struct ms_engine *e = ms_engine_new(m, &o, NULL);
  usleep(100000);
  double c0 = cpu_seconds();
  usleep(500000);  /* four idle workers for half a second */
  double used = cpu_seconds() - c0;
  CHECKF(used < 0.1, "idle engine used %.3f s of CPU in 0.5 s", used);
  ms_engine_free(e);
  ms_model_free(m);
}

/* Drops one producer from an event: the consumers no longer wait for it (it
 * triggers the end-of-step event instead, so the step still ends after it). The
 * last task of the class is chosen: a worker runs its queue in order, so an
 * earlier one would still be forced before the event by the tasks behind it. */
struct drop {
  const char *cls;
  int dropped;
};

static void drop_edge(struct ms_plan *p, void *user) {
  struct drop *d = user;
  for (int t = p->n_tasks - 1; t >= 0; t--) {
    if (strcmp(p->classes[p->tasks[t].cls].name, d->cls)) continue;
    int ev = p->tasks[t].trigger;
    if (p->events[ev].needed < 2 || ev == p->end_event) continue;
    p->events[ev].needed--;
    p->events[p->end_event].needed++;
    p->tasks[t].trigger = p->end_event;
    d->dropped++;
    return;
  }
}

static void test_missing_edge_caught(void) {
  struct ms_model *m = load("tiny", MS_DTYPE_F32);
  int caught = 0, control_ok = 1;
  for (int seed = 1; seed <= 6; seed++) {
    struct result res;
    struct drop d = {"lm_head", 0};
    struct ms_engine_opts o = {.n_workers = 3, .shuffle = 1, .seed = (uint64_t)seed, .shuffle_max_us = 200,
                               .plan_hook = drop_edge, .plan_hook_user = &d};
    CHECK(run(m, o, 1, &res) == 0);
    CHECK(d.dropped > 0);
    if (getenv("MS_TEST_VERBOSE")) fprintf(stderr, "seed %d: missing edge, max diff %g\n", seed, res.max_diff);
    if (res.max_diff > 1e-3) caught++;
    o.plan_hook = NULL;
    CHECK(run(m, o, 1, &res) == 0);
    control_ok &= res.max_diff <= 1e-3;
  }
  CHECKF(caught > 0, "no shuffled run caught the missing dependency");
  CHECK(control_ok);
  ms_model_free(m);
}

static char logged[16384];
static pthread_mutex_t logged_mu = PTHREAD_MUTEX_INITIALIZER;
static void capture(void *user, enum ms_log_level level, const char *msg) {
  pthread_mutex_lock(&logged_mu);
  if (level == MS_LOG_WARN) snprintf(logged + strlen(logged), sizeof logged - strlen(logged), "%s", msg);
  pthread_mutex_unlock(&logged_mu);
}

static void test_watchdog(void) {
  struct ms_model *m = load("tiny", MS_DTYPE_F32);
  struct ms_engine_opts o = {.sz = sizeof o, .n_workers = 2, .max_batch = 1, .max_ctx = 64, .watchdog_ms = 100};
  struct ms_engine *e = ms_engine_new(m, &o, NULL);
  const struct ms_plan *p = ms_engine_plan(e, 1);
  int slow = -1;
  for (int t = 0; t < p->n_tasks && slow < 0; t++)
    if (!strcmp(p->classes[p->tasks[t].cls].name, "blk.1.attn")) slow = t;
  CHECK(slow > 0);
  CHECK(ms_engine_set_task_delay(e, 1, slow, 900000000ull) == 0);
  ms_log_set(capture, NULL, MS_LOG_WARN);
  int32_t tok = 5;
  struct ms_request_opts ro = {.sz = sizeof ro, .prompt = &tok, .n_prompt = 1, .max_new_tokens = 1};
  struct ms_request *r = ms_engine_submit(e, &ro);
  CHECK(ms_request_wait(r, 20000) == 0);
  char report[8192];
  uint64_t stalls = ms_engine_last_stall(e, report, sizeof report);
  ms_log_set(NULL, NULL, MS_LOG_WARN);
  CHECK(stalls >= 1);
  CHECKF(strstr(report, "stall: no task finished") != NULL, "report: %s", report);
  CHECKF(strstr(report, "running blk.1.attn[row 0, head") != NULL, "report: %s", report);
  CHECKF(strstr(report, "waits to run blk.1.wo") != NULL || strstr(report, "waits for the end") != NULL,
         "report: %s", report);
  CHECKF(strstr(report, "not yet triggered: blk.1.attn") != NULL, "report: %s", report);
  pthread_mutex_lock(&logged_mu);
  CHECK(strstr(logged, "stall") != NULL);
  pthread_mutex_unlock(&logged_mu);
  struct ms_request_info info;
  ms_request_get_info(r, &info);
  CHECK(info.state == MS_REQ_DONE && info.n_tokens == 1);
  ms_request_free(r);
  ms_engine_free(e);
  ms_model_free(m);
}

static void test_bad_requests(void) {
  struct ms_model *m = load("tiny", MS_DTYPE_F32);
  struct ms_engine_opts o = {.sz = sizeof o, .n_workers = 1, .max_batch = 1, .max_ctx = 8};
  struct ms_engine *e = ms_engine_new(m, &o, NULL);
  int32_t toks[16] = {0};
  struct ms_request_opts ro = {.sz = sizeof ro, .prompt = toks, .n_prompt = 4, .max_new_tokens = 6};
  CHECK(ms_engine_submit(e, &ro) == NULL && errno == E2BIG);
  ro.max_new_tokens = 0;
  CHECK(ms_engine_submit(e, &ro) == NULL && errno == EINVAL);
  toks[1] = 100000;
  ro.max_new_tokens = 2;
  CHECK(ms_engine_submit(e, &ro) == NULL && errno == EINVAL);
  toks[1] = 3;
  /* a request still queued when the engine stops is cancelled, not lost */
  struct ms_request *r = ms_engine_submit(e, &ro);
  CHECK(r != NULL);
  ms_engine_free(e);
  struct ms_request_info info;
  ms_request_get_info(r, &info);
  CHECK(info.state == MS_REQ_DONE || info.state == MS_REQ_CANCELLED);
  ms_request_free(r);
  ms_model_free(m);
}

int main(void) {
  test_oracle_and_determinism();
  test_arch_features_matter();
  test_chunked_prefill();
  test_normalised_plan_runs();
  test_cpu_tiling_default();
  test_continuous_batching();
  test_idle_sleeps();
  test_missing_edge_caught();
  test_watchdog();
  test_bad_requests();
  TEST_MAIN_END();
}
