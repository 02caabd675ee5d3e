/* SPDX-License-Identifier: MIT */
/* Hooks and monitors on a running engine, with several workers: coverage
 * identities (eligible = executed + throttled; generations add up across a
 * replace), map contents that agree with the engine's own counts, budgets,
 * sampling, ring-buffer losses, attach and detach while requests run, clear
 * errors for bad monitors. Uses the shipped monitors built into $MS_MONITORS. */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hook/hook_impl.h"
#include "megascope/attach.h"
#include "runtime/runtime_impl.h"
#include "test.h"

static char mon_dir[4096];

static struct ms_monitor *open_mon(const char *name) {
  char path[4200], buf[16384] = "";
  struct ms_textbuf log = {buf, sizeof buf, 0, 0};
  snprintf(path, sizeof path, "%s/%s.bpf.o", mon_dir, name);
  struct ms_monitor *m = ms_monitor_open(path, &log);
  if (!m) fprintf(stderr, "%s: %s\n%s", path, ms_strerror(errno), buf);
  return m;
}

static struct ms_model *tiny(void) {
  struct ms_model_config c;
  ms_preset_config("tiny", MS_DTYPE_F32, &c);
  return ms_model_synth(&c, 5);
}

static struct ms_engine *engine(const struct ms_model *m, int workers) {
  struct ms_engine_opts o = {.sz = sizeof o, .n_workers = workers, .max_batch = 4, .max_ctx = 256};
  return ms_engine_new(m, &o, NULL);
}

/* Runs n requests of `tokens` tokens each; returns the number of tokens made. */
static int decode(struct ms_engine *e, int n, int tokens) {
  struct ms_request *r[16];
  int made = 0;
  for (int i = 0; i < n; i++) {
    int32_t p[3] = {3 + i, 7, 11};
    struct ms_request_opts ro = {.sz = sizeof ro, .prompt = p, .n_prompt = 1 + i % 3, .max_new_tokens = tokens};
    r[i] = ms_engine_submit(e, &ro);
  }
  for (int i = 0; i < n; i++) {
    if (!r[i]) continue;
    ms_request_wait(r[i], -1);
    struct ms_request_info info;
    ms_request_get_info(r[i], &info);
    made += info.n_tokens;
    ms_request_free(r[i]);
  }
  return made;
}

static uint64_t map_sum(struct ms_gen *g, const char *name, int n_workers) {
  for (int i = 0; i < g->n_maps; i++) {
    if (strcmp(ms_bpf_map_info(g->maps[i])->name, name)) continue;
    uint64_t total = 0;
    struct ms_bpf_map *m = g->maps[i];
    uint32_t n = ms_bpf_map_info(m)->max_entries;
    for (uint32_t k = 0; k < n; k++)
      for (int w = 0; w < n_workers; w++) {
        uint64_t *v = ms_bpf_map_lookup(m, &k, (uint32_t)w);
        if (v) total += *v;
      }
    return total;
  }
  return UINT64_MAX;
}

static void test_counts_agree(void) {
  struct ms_model *m = tiny();
  struct ms_engine *e = engine(m, 3);
  struct ms_monitor *mon = open_mon("class_time");
  CHECK(mon != NULL);
  int id = ms_engine_attach(e, mon, NULL, NULL);
  CHECK(id > 0);
  CHECK(decode(e, 4, 20) == 80);
  struct ms_engine_stats st;
  ms_engine_get_stats(e, &st);
  struct ms_coverage cov;
  CHECK(ms_engine_attach_coverage(e, id, 0, &cov) == 0);
  /* two programs (task_begin, task_end) saw every task */
  CHECKF(cov.eligible == 2 * st.tasks, "eligible %llu tasks %llu", (unsigned long long)cov.eligible,
         (unsigned long long)st.tasks);
  CHECK(cov.executed == cov.eligible && cov.throttled == 0 && cov.lost == 0 && cov.failed == 0);
  struct attachment *a = ms_hook_find(e->hooks, id);
  CHECK(map_sum(a->cur, "began_by_class", 3) == st.tasks);
  CHECK(map_sum(a->cur, "hist_class_task_ns", 3) == st.tasks);
  /* the read-out decodes class names */
  char *text = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  CHECK(ms_engine_attach_write(e, id, f, 1) == 0);
  fclose(f);
  CHECK(strstr(text, "\"row\": \"blk.1.attn\"") != NULL);
  CHECK(strstr(text, "\"eligible\"") && strstr(text, "\"executed\"") && strstr(text, "\"throttled\"") &&
        strstr(text, "\"lost\"") && strstr(text, "\"generation\""));
  free(text);
  CHECK(ms_engine_detach(e, id) == 0);
  CHECK(ms_engine_detach(e, id) == -ENOENT);  /* twice */
  CHECK(ms_engine_detach(e, 99) == -ENOENT);
  ms_engine_free(e);
  ms_model_free(m);
}

/* The same monitor attached twice, natively (the JIT) and interpreted, sees
 * the same firings: its counting map must agree entry by entry, worker by
 * worker, and the attachments must say how they run. */
static uint64_t map_entry(struct ms_gen *g, const char *name, uint32_t k, int w) {
  for (int i = 0; i < g->n_maps; i++)
    if (!strcmp(ms_bpf_map_info(g->maps[i])->name, name)) {
      uint64_t *v = ms_bpf_map_lookup(g->maps[i], &k, (uint32_t)w);
      return v ? *v : UINT64_MAX;
    }
  return UINT64_MAX;
}

static void test_jit_and_interp_agree(void) {
  if (!ms_bpf_jit_supported()) return;
  struct ms_model *m = tiny();
  struct ms_engine *e = engine(m, 3);
  struct ms_attach_opts interp = {.sz = sizeof interp, .interpret = 1};
  int jid = ms_engine_attach(e, open_mon("class_time"), NULL, NULL);
  int iid = ms_engine_attach(e, open_mon("class_time"), &interp, NULL);
  CHECK(jid > 0 && iid > 0);
  CHECK(decode(e, 4, 20) == 80);
  struct ms_attach_info info[2];
  CHECK(ms_engine_attach_list(e, info, 2) == 2);
  CHECKF(info[0].n_progs == 2 && info[0].n_jitted == 2, "jit: %u of %u", info[0].n_jitted, info[0].n_progs);
  CHECKF(info[1].n_progs == 2 && info[1].n_jitted == 0, "interp: %u of %u", info[1].n_jitted, info[1].n_progs);
  struct ms_gen *gj = ms_hook_find(e->hooks, jid)->cur, *gi = ms_hook_find(e->hooks, iid)->cur;
  int differ = 0;
  uint32_t n = 0;
  for (int i = 0; i < gj->n_maps; i++)
    if (!strcmp(ms_bpf_map_info(gj->maps[i])->name, "began_by_class")) n = ms_bpf_map_info(gj->maps[i])->max_entries;
  CHECK(n > 0);
  for (uint32_t k = 0; k < n; k++)
    for (int w = 0; w < 3; w++)
      differ += map_entry(gj, "began_by_class", k, w) != map_entry(gi, "began_by_class", k, w);
  CHECKF(differ == 0, "%d entries differ", differ);
  CHECK(map_sum(gj, "hist_class_task_ns", 3) == map_sum(gi, "hist_class_task_ns", 3));
  struct ms_coverage cj, ci;
  CHECK(ms_engine_attach_coverage(e, jid, 0, &cj) == 0 && ms_engine_attach_coverage(e, iid, 0, &ci) == 0);
  CHECK(cj.eligible == ci.eligible && cj.executed == ci.executed && cj.failed == 0 && ci.failed == 0);
  ms_engine_free(e);
  ms_model_free(m);
}

struct bg {
  struct ms_engine *e;
  int made;
};
static void *bg_decode(void *p) {
  struct bg *b = p;
  b->made = decode(b->e, 4, 60);
  return NULL;
}

static uint64_t steps_now(struct ms_engine *e) {
  struct ms_engine_stats st;
  ms_engine_get_stats(e, &st);
  return st.steps;
}

static void test_replace_while_running(void) {
  struct ms_model *m = tiny();
  struct ms_engine *e = engine(m, 4);
  int id = ms_engine_attach(e, open_mon("class_time"), NULL, NULL);
  CHECK(id > 0);
  struct bg b = {e, 0};
  pthread_t th;
  pthread_create(&th, NULL, bg_decode, &b);
  while (steps_now(e) < 10) usleep(200);
  CHECK(ms_engine_replace(e, id, open_mon("class_time"), NULL) == 0);
  while (steps_now(e) < 20) usleep(200);
  CHECK(ms_engine_replace(e, id, open_mon("class_time"), NULL) == 0);
  pthread_join(th, NULL);
  CHECK(b.made == 240);  /* no request failed or stalled */
  struct ms_engine_stats st;
  ms_engine_get_stats(e, &st);
  struct ms_coverage c1, c2, c3;
  CHECK(ms_engine_attach_coverage(e, id, 1, &c1) == 0);
  CHECK(ms_engine_attach_coverage(e, id, 2, &c2) == 0);
  CHECK(ms_engine_attach_coverage(e, id, 3, &c3) == 0);
  CHECK(c1.generation == 1 && c2.generation == 2 && c3.generation == 3);
  /* every firing was seen by exactly one generation */
  CHECKF(c1.eligible + c2.eligible + c3.eligible == 2 * st.tasks, "%llu + %llu + %llu != 2 x %llu",
         (unsigned long long)c1.eligible, (unsigned long long)c2.eligible, (unsigned long long)c3.eligible,
         (unsigned long long)st.tasks);
  CHECK(c1.eligible > 0 && c2.eligible > 0 && c3.eligible > 0);
  CHECK(c1.t_end != 0 && c2.t_end != 0 && c3.t_end == 0);
  CHECK(c2.first_step >= c1.first_step && c3.first_step >= 19);
  ms_engine_free(e);
  ms_model_free(m);
}

static void test_budgets(void) {
  struct ms_model *m = tiny();
  struct ms_engine *e = engine(m, 2);
  struct ms_attach_opts sample = {.sz = sizeof sample, .sample_every = 4};
  struct ms_attach_opts budget = {.sz = sizeof budget, .max_per_step = 3};
  int a = ms_engine_attach(e, open_mon("class_time"), &sample, NULL);
  int b = ms_engine_attach(e, open_mon("queueing"), &budget, NULL);
  CHECK(a > 0 && b > 0);
  decode(e, 3, 30);
  struct ms_engine_stats st;
  ms_engine_get_stats(e, &st);
  struct ms_coverage ca, cb;
  ms_engine_attach_coverage(e, a, 0, &ca);
  ms_engine_attach_coverage(e, b, 0, &cb);
  CHECK(ca.eligible == 2 * st.tasks && ca.executed + ca.throttled == ca.eligible);
  CHECKF(ca.executed * 10 > ca.eligible && ca.executed * 10 < ca.eligible * 4, "1-in-4 sampling ran %llu of %llu",
         (unsigned long long)ca.executed, (unsigned long long)ca.eligible);
  /* sampling keys on the task generation: begin and end of a task are sampled together */
  struct attachment *at = ms_hook_find(e->hooks, a);
  CHECK(map_sum(at->cur, "began_by_class", 2) == map_sum(at->cur, "hist_class_task_ns", 2));
  CHECK(cb.eligible == st.tasks && cb.executed + cb.throttled == cb.eligible);
  CHECKF(cb.executed <= 3 * 2 * (st.steps + 1), "budget 3/step/worker ran %llu in %llu steps",
         (unsigned long long)cb.executed, (unsigned long long)st.steps);
  CHECK(cb.throttled > 0);
  ms_engine_free(e);
  ms_model_free(m);
}

static void test_ringbuf_lost(void) {
  struct ms_model *m = tiny();
  struct ms_engine *e = engine(m, 2);
  int a = ms_engine_attach(e, open_mon("step_trace"), NULL, NULL);
  struct ms_attach_opts ob = {.sz = sizeof ob, .ringbuf_bytes = 320};
  int b = ms_engine_attach(e, open_mon("step_trace"), &ob, NULL);
  CHECK(a > 0 && b > 0);
  decode(e, 1, 150);  /* 300 step records of 40 bytes: more than 4096 bytes hold */
  struct ms_coverage ca, cb;
  ms_engine_attach_coverage(e, a, 0, &ca);
  ms_engine_attach_coverage(e, b, 0, &cb);
  CHECK(ca.eligible == ca.executed && ca.eligible >= 300);
  CHECKF(ca.lost > 0 && ca.lost < ca.eligible, "lost %llu of %llu", (unsigned long long)ca.lost,
         (unsigned long long)ca.eligible);
  /* the byte budget counts record data: 320 bytes hold ten 32-byte records */
  CHECKF(cb.lost == cb.eligible - 10, "budget: lost %llu of %llu",
         (unsigned long long)cb.lost, (unsigned long long)cb.eligible);
  ms_engine_free(e);
  ms_model_free(m);
}

static void test_attach_midrun_and_hint(void) {
  struct ms_model *m = tiny();
  struct ms_engine *ref = engine(m, 2);
  struct ms_engine *e = engine(m, 3);
  /* tokens with a scheduling hint attached are the tokens without */
  CHECK(ms_engine_attach(e, open_mon("attn_priority"), NULL, NULL) > 0);
  int32_t p = 9;
  struct ms_request_opts ro = {.sz = sizeof ro, .prompt = &p, .n_prompt = 1, .max_new_tokens = 40};
  struct ms_request *r1 = ms_engine_submit(ref, &ro), *r2 = ms_engine_submit(e, &ro);
  /* attach two more monitors while the request runs */
  while (steps_now(e) < 5) usleep(100);
  int d = ms_engine_attach(e, open_mon("dep_wait"), NULL, NULL);
  int q = ms_engine_attach(e, open_mon("request_time"), NULL, NULL);
  CHECK(d > 0 && q > 0);
  ms_request_wait(r1, -1);
  ms_request_wait(r2, -1);
  struct ms_request_info i1, i2;
  ms_request_get_info(r1, &i1);
  ms_request_get_info(r2, &i2);
  CHECK(i1.n_tokens == 40 && i2.n_tokens == 40 && !memcmp(i1.tokens, i2.tokens, 40 * sizeof(int32_t)));
  struct ms_coverage cd;
  ms_engine_attach_coverage(e, d, 0, &cd);
  CHECK(cd.first_step >= 5 && cd.eligible > 0);
  struct attachment *at = ms_hook_find(e->hooks, q);
  CHECK(at->cur->n_maps >= 2);
  ms_request_free(r1);
  ms_request_free(r2);
  ms_engine_free(ref);
  ms_engine_free(e);
  ms_model_free(m);
}

static void test_bad_monitors(void) {
  char buf[4096] = "";
  struct ms_textbuf log = {buf, sizeof buf, 0, 0};
  CHECK(ms_monitor_open("/nonexistent/x.bpf.o", &log) == NULL);
  CHECK(strlen(buf) > 0);
  static const char garbage[] = "\x7f" "ELF this is not an object";
  log.len = 0;
  buf[0] = 0;
  CHECK(ms_monitor_open_mem(garbage, sizeof garbage, "garbage", &log) == NULL);
  CHECKF(strlen(buf) > 0, "no message for a malformed object");
}

int main(void) {
  const char *d = getenv("MS_MONITORS");
  snprintf(mon_dir, sizeof mon_dir, "%s", d ? d : "monitors");
  char probe[4200];
  snprintf(probe, sizeof probe, "%s/class_time.bpf.o", mon_dir);
  if (access(probe, R_OK)) {
    printf("skipped: %s not built\n", probe);
    return 77;
  }
  test_counts_agree();
  test_jit_and_interp_agree();
  test_replace_while_running();
  test_budgets();
  test_ringbuf_lost();
  test_attach_midrun_and_hint();
  test_bad_monitors();
  TEST_MAIN_END();
}
