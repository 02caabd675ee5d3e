/* SPDX-License-Identifier: MIT */
/* Hook ABI v2: the data-dependent work fields (work_rows, work_bytes,
 * passed_over) and the remote producer fields, as monitors read them.
 *
 * - A routing skew is visible from counts at zero slowdown: tiny-moe decoded
 *   with and without routing_skew on the simulator (deterministic) and on the
 *   CPU engine (router kernels really run), a query summing work_rows per
 *   expert; the hot expert stands out, the healthy run is even, the routed
 *   total and (simulator) the run time do not move.
 * - The other v2 fields are filled as documented: attention's rows are its
 *   positions, bytes follow the shapes, JIT tasks that wait are passed over,
 *   tensor-parallel runs name remote producers on other devices.
 * - Version 1 monitors load and run unchanged: an object built against the
 *   version 1 header (tests/data/monitors/v1, made from
 *   monitors/class_time.bpf.c with clang -target bpf against the header of
 *   ABI 1), and a bundle declaring version 1; a read of a v2 field on a hook
 *   that does not fill it is refused naming the field and the hook (the
 *   verifier, and the query compiler). */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "megascope/bpf.h"
#include "megascope/engine.h"
#include "megascope/fault.h"
#include "megascope/hook.h"
#include "megascope/model.h"
#include "megascope/attach.h"
#include "megascope/plan.h"
#include "megascope/query.h"
#include "live_query.h"
#include "test.h"

#define HOT 1  /* the skewed expert */

static struct ms_model *preset(const char *name) {
  struct ms_model_config c;
  ms_preset_config(name, MS_DTYPE_F32, &c);
  return ms_model_synth(&c, 5);
}

static struct ms_query_schema *schema_of(const struct ms_model *m, int tp) {
  struct ms_compile_opts co = {.sz = sizeof co, .batch = 4, .tp = tp};
  struct ms_plan *p = ms_plan_compile(m, &co, NULL);
  struct ms_query_schema *s = p ? ms_query_schema_of_plan(p, NULL) : NULL;
  ms_plan_free(p);
  return s;
}

/* Entries of map `name` as key (first key part, a number) -> value, into v[0..n). */
static int map_values(json_t *r, const char *name, double *v, int n) {
  size_t i, j;
  json_t *m, *en;
  memset(v, 0, sizeof *v * (size_t)n);
  int found = 0;
  json_array_foreach(json_object_get(r, "maps"), i, m) {
    if (strcmp(json_string_value(json_object_get(m, "name")), name)) continue;
    json_array_foreach(json_object_get(m, "entries"), j, en) {
      json_t *k = json_array_get(json_object_get(en, "key"), 0);
      int key = !k                 ? 0  /* a map without keys */
                : json_is_number(k) ? (int)json_number_value(k)
                : json_is_string(k) ? atoi(json_string_value(k))
                                    : -1;
      if (key >= 0 && key < n) v[key] += json_number_value(json_object_get(en, "value"));
      found++;
    }
  }
  return found;
}

/* n requests, all in the engine before its first step when it started paused
 * (ms_engine_opts.start_paused): then a simulator run is a function of its seed,
 * however slowly this thread submits. */
static void decode(struct ms_engine *e, int n, int tokens) {
  struct ms_request *r[8];
  for (int i = 0; i < n; i++) {
    int32_t p[3] = {3 + i, 7, 11};
    struct ms_request_opts ro = {.sz = sizeof ro, .prompt = p, .n_prompt = 1 + i % 3, .max_new_tokens = tokens};
    r[i] = ms_engine_submit(e, &ro);
  }
  ms_engine_resume(e);
  for (int i = 0; i < n; i++)
    if (r[i]) {
      ms_request_wait(r[i], -1);
      ms_request_free(r[i]);
    }
}

/* ---- routing skew from row counts ---- */

struct moe_run {
  double rows[4];  /* work_rows of expert_up tasks, summed per expert */
  double total, max_share, min_share;
  uint64_t sim_ns;
};

static int run_moe(const struct ms_model *m, int sim, const struct ms_fault *f, struct moe_run *out) {
  struct ms_engine_opts o = {.sz = sizeof o, .max_batch = 8, .max_ctx = 64, .seed = 7, .start_paused = 1};
  if (sim) {
    o.backend = MS_BACKEND_SIM;
    ms_sim_preset("h100", &o.sim);
    o.sim.n_sms = 8;
  } else {
    o.n_workers = 2;
  }
  if (f) {
    o.faults = f;
    o.n_faults = 1;
  }
  struct ms_engine *e = ms_engine_new(m, &o, NULL);
  if (!e) return -1;
  struct live q = {0};
  int rc = -1;
  struct ms_query_schema *s = engine_schema(e);  /* the CPU's plans fuse the norms: their ids are not a plain plan's */
  if (s && attach_query(e, s, "task_end /op == expert_up/ { @rows[tile_z] = sum(work_rows) }", 0, 0, &q) > 0) {
    decode(e, 8, 12);
    json_t *r = readout(e, &q);
    if (r && map_values(r, "@rows", out->rows, 4) > 0) rc = 0;
    json_decref(r);
  }
  out->sim_ns = sim ? ms_engine_sim_now(e) : 0;
  out->total = 0;
  for (int x = 0; x < 4; x++) out->total += out->rows[x];
  out->max_share = 0, out->min_share = 1;
  for (int x = 0; x < 4 && out->total > 0; x++) {
    double sh = out->rows[x] / out->total;
    if (sh > out->max_share) out->max_share = sh;
    if (sh < out->min_share) out->min_share = sh;
  }
  ms_query_free(q.q);
  ms_query_schema_free(s);
  ms_engine_free(e);
  return rc;
}

static void check_skew(int sim) {
  const char *where = sim ? "sim" : "cpu";
  struct ms_model *m = preset("tiny-moe");
  struct ms_fault fl = {.type = MS_FAULT_ROUTING_SKEW, .target = HOT, .factor = 1};
  struct moe_run h, f;
  CHECKF(run_moe(m, sim, NULL, &h) == 0, "%s: healthy run", where);
  CHECKF(run_moe(m, sim, &fl, &f) == 0, "%s: skewed run", where);
  char th[64] = "", tf[64] = "";
  if (sim) {
    snprintf(th, sizeof th, ", run %llu ns", (unsigned long long)h.sim_ns);
    snprintf(tf, sizeof tf, ", run %llu ns (%+.3f%%)", (unsigned long long)f.sim_ns,
             100.0 * ((double)f.sim_ns / (double)(h.sim_ns ? h.sim_ns : 1) - 1));
  }
  printf("  %s healthy: work_rows per expert %.0f %.0f %.0f %.0f (shares %.3f..%.3f)%s\n", where, h.rows[0],
         h.rows[1], h.rows[2], h.rows[3], h.min_share, h.max_share, th);
  printf("  %s routing_skew expert %d: work_rows per expert %.0f %.0f %.0f %.0f (hot share %.3f)%s\n", where, HOT,
         f.rows[0], f.rows[1], f.rows[2], f.rows[3], f.rows[HOT] / (f.total > 0 ? f.total : 1), tf);
  /* top-2 of 4: the simulator's spread gives each expert a quarter of the
   * routed rows; the CPU's router (synthetic weights) is less even but no
   * expert is near half. With the skew every row takes the hot expert: half
   * of all picks. */
  double even = sim ? 0.02 : 0.2;
  CHECKF(h.total > 0 && h.max_share - h.min_share < even && h.max_share < 0.4,
         "%s: healthy run uneven (%.3f..%.3f)", where, h.min_share, h.max_share);
  CHECKF(f.total > 0 && f.rows[HOT] == f.total / 2, "%s: hot expert's share %.3f", where, f.rows[HOT] / f.total);
  CHECKF(f.rows[HOT] / f.total > h.rows[HOT] / h.total + 0.15, "%s: hot share %.3f, healthy %.3f", where,
         f.rows[HOT] / f.total, h.rows[HOT] / h.total);
  for (int x = 0; x < 4; x++)
    if (x != HOT) CHECKF(f.rows[HOT] > 1.5 * f.rows[x], "%s: expert %d (%.0f) near the hot one (%.0f)", where, x,
                         f.rows[x], f.rows[HOT]);
  /* the skew moves rows, not their number: the total routed is the same */
  CHECKF(f.total == h.total, "%s: routed rows %.0f vs %.0f", where, f.total, h.total);
  /* at no slowdown: the simulated run moves by well under 1% */
  if (sim)
    CHECKF((double)f.sim_ns < 1.01 * (double)h.sim_ns && (double)f.sim_ns > 0.99 * (double)h.sim_ns,
           "sim: run %llu vs %llu ns", (unsigned long long)f.sim_ns, (unsigned long long)h.sim_ns);
  ms_model_free(m);
}

static void test_routing_skew_sim(void) { check_skew(1); }
static void test_routing_skew_cpu(void) { check_skew(0); }

/* ---- the other v2 fields ---- */

/* Attention's rows are its positions; bytes follow the shapes; every task
 * reports its work; JIT tasks that queue are passed over. */
static void test_work_fields(void) {
  struct ms_model *m = preset("tiny");
  struct ms_query_schema *s = schema_of(m, 0);
  struct ms_engine_opts o = {.sz = sizeof o, .max_batch = 4, .max_ctx = 64, .backend = MS_BACKEND_SIM};
  ms_sim_preset("h100", &o.sim);
  o.sim.n_sms = 4;
  struct ms_engine *e = ms_engine_new(m, &o, NULL);
  CHECK(e != NULL);
  if (!e) goto out;
  struct live attn_rows, attn_ctx, attn_bytes, wo_bytes, passed, jit, none;
  CHECK(attach_query(e, s, "task_end /op == attn/ { @ = sum(work_rows) }", 0, 0, &attn_rows) > 0);
  CHECK(attach_query(e, s, "task_end /op == attn/ { @ = sum(ctx_len) }", 0, 0, &attn_ctx) > 0);
  CHECK(attach_query(e, s, "task_end /op == attn/ { @ = sum(work_bytes) }", 0, 0, &attn_bytes) > 0);
  CHECK(attach_query(e, s, "task_end /op == wo/ { @ = max(work_bytes) }", 0, 0, &wo_bytes) > 0);
  CHECK(attach_query(e, s, "task_begin /launch_mode == jit/ { @ = sum(passed_over) }", 0, 0, &passed) > 0);
  CHECK(attach_query(e, s, "task_begin /launch_mode == jit/ { @ = count() }", 0, 0, &jit) > 0);
  CHECK(attach_query(e, s, "task_begin /remote_event != 0xffffffff/ { @ = count() }", 0, 0, &none) > 0);
  decode(e, 4, 10);
  json_t *r1 = readout(e, &attn_rows), *r2 = readout(e, &attn_ctx), *r3 = readout(e, &attn_bytes),
         *r4 = readout(e, &wo_bytes), *r5 = readout(e, &passed), *r6 = readout(e, &jit), *r7 = readout(e, &none);
  CHECK(r1 && r2 && r3 && r4 && r5 && r6 && r7);
  if (r1 && r2 && r3 && r4 && r5 && r6 && r7) {
    double rows, ctx, bytes, wo, pass, njit, remote = 0;
    map_values(r1, "@", &rows, 1), map_values(r2, "@", &ctx, 1), map_values(r3, "@", &bytes, 1);
    map_values(r4, "@", &wo, 1), map_values(r5, "@", &pass, 1), map_values(r6, "@", &njit, 1);
    map_values(r7, "@", &remote, 1);
    const struct ms_model_config *c = &m->cfg;
    printf("  attention: %.0f positions, %.0f bytes; wo tile %.0f bytes; %.0f JIT tasks passed over %.0f times\n",
           rows, bytes, wo, njit, pass);
    CHECKF(rows > 0 && rows == ctx, "attention rows %.0f, ctx_len %.0f", rows, ctx);
    CHECKF(bytes == rows * 2 * c->head_dim * 4, "attention bytes %.0f for %.0f positions", bytes, rows);
    /* a wo tile reads its rows of wo, at most all of them */
    size_t wo_all = (size_t)c->dim * ms_dtype_row_bytes(m->cfg.dtype, c->n_heads * c->head_dim);
    CHECKF(wo > 0 && wo <= (double)wo_all, "wo tile bytes %.0f of %zu", wo, wo_all);
    CHECK(njit == 0 || pass >= 0);
    CHECKF(remote == 0, "%.0f remote producers without tensor parallelism", remote);
  }
  json_decref(r1), json_decref(r2), json_decref(r3), json_decref(r4), json_decref(r5), json_decref(r6);
  json_decref(r7);
  ms_query_free(attn_rows.q), ms_query_free(attn_ctx.q), ms_query_free(attn_bytes.q), ms_query_free(wo_bytes.q);
  ms_query_free(passed.q), ms_query_free(jit.q), ms_query_free(none.q);
  ms_engine_free(e);
out:
  ms_query_schema_free(s);
  ms_model_free(m);
}

/* Tensor parallel on the simulator: the norms after an all-gather wait on an
 * event that the last device's share completes; on the other devices that is
 * a remote producer, named with its device and step. The comm hook names the
 * collective's event on the peer. */
static void test_remote_fields(void) {
  struct ms_model *m = preset("tiny");
  struct ms_query_schema *s = schema_of(m, 2);
  struct ms_engine_opts o = {.sz = sizeof o, .max_batch = 4, .max_ctx = 64, .backend = MS_BACKEND_SIM, .tp = 2};
  ms_sim_preset("h100", &o.sim);
  o.sim.n_sms = 4;
  struct ms_engine *e = ms_engine_new(m, &o, NULL);
  CHECK(e != NULL);
  if (!e) goto out;
  struct live rem, same_step, other_dev, comm;
  CHECK(attach_query(e, s, "task_begin /remote_event != 0xffffffff/ { @[remote_device] = count() }", 0, 0, &rem) > 0);
  CHECK(attach_query(e, s, "task_begin /remote_event != 0xffffffff && remote_gen == step && remote_event == event_id/"
                           " { @ = count() }", 0, 0, &same_step) > 0);
  CHECK(attach_query(e, s, "task_begin /remote_event != 0xffffffff && remote_device == device/ { @ = count() }",
                     0, 0, &other_dev) > 0);
  CHECK(attach_query(e, s, "comm /remote_device == peer && remote_gen == step/ { @ = count() }", 0, 0, &comm) > 0);
  decode(e, 4, 6);
  json_t *r1 = readout(e, &rem), *r2 = readout(e, &same_step), *r3 = readout(e, &other_dev), *r4 = readout(e, &comm);
  CHECK(r1 && r2 && r3 && r4);
  if (r1 && r2 && r3 && r4) {
    double by_dev[2], consistent, wrong, comms;
    map_values(r1, "@", by_dev, 2), map_values(r2, "@", &consistent, 1), map_values(r3, "@", &wrong, 1);
    map_values(r4, "@", &comms, 1);
    printf("  tp 2: %.0f + %.0f task starts with a remote producer on device 0 / 1; %.0f comm firings\n", by_dev[0],
           by_dev[1], comms);
    CHECKF(by_dev[0] + by_dev[1] > 0, "no remote producers under tp 2");
    CHECK(consistent == by_dev[0] + by_dev[1]);
    CHECKF(wrong == 0, "%.0f remote producers on the task's own device", wrong);
    CHECK(comms > 0);
  }
  json_decref(r1), json_decref(r2), json_decref(r3), json_decref(r4);
  ms_query_free(rem.q), ms_query_free(same_step.q), ms_query_free(other_dev.q), ms_query_free(comm.q);
  ms_engine_free(e);
out:
  ms_query_schema_free(s);
  ms_model_free(m);
}

/* ---- version 1 compatibility ---- */

static struct ms_monitor *open_v1_object(char *log, size_t n) {
  const char *src = getenv("MS_SRC");
  char path[4096];
  snprintf(path, sizeof path, "%s/tests/data/monitors/v1/class_time.bpf.o", src ? src : ".");
  struct ms_textbuf tb = {.buf = log, .size = n};
  return ms_monitor_open(path, &tb);
}

/* A version 1 object and a version 1 bundle load, attach and run on every task. */
static void test_v1_runs(void) {
  char log[16384] = "";
  struct ms_monitor *obj = open_v1_object(log, sizeof log);
  CHECKF(obj != NULL, "v1 object: %s", log);
  /* the bundle: a task_end program that reads v1 fields only, declared version 1 */
  struct ms_bpf_insn *insns = NULL;
  size_t n = 0;
  struct ms_textbuf tb = {.buf = log, .size = sizeof log};
  CHECK(ms_bpf_asm("ldxdw %r2, [%r1+104]\nldxdw %r3, [%r1+96]\nsub %r2, %r3\nldxdw %r0, [%r1+168]\nmov %r0, 0\nexit",
                   &insns, &n, &tb) == 0);
  struct ms_bpf_bundle_prog bp = {.name = "v1_end", .section = "megascope/observe/task_end", .insns = insns, .n = n};
  void *b = NULL;
  size_t len = 0;
  CHECK(ms_bpf_bundle_write(NULL, 0, &bp, 1, 1, NULL, &b, &len) == 0);
  struct ms_monitor *bun = b ? ms_monitor_open_mem(b, len, "v1_bundle", &tb) : NULL;
  CHECKF(bun != NULL, "v1 bundle: %s", log);
  free(b);
  free(insns);
  struct ms_model *m = preset("tiny-moe");
  struct ms_engine_opts o = {.sz = sizeof o, .n_workers = 2, .max_batch = 4, .max_ctx = 64};
  struct ms_engine *e = ms_engine_new(m, &o, NULL);
  CHECK(e != NULL);
  if (e && obj && bun) {
    struct ms_attach_opts ao = {.sz = sizeof ao};
    int a = ms_engine_attach(e, obj, &ao, &tb), c = ms_engine_attach(e, bun, &ao, &tb);
    CHECKF(a > 0 && c > 0, "attach: %s", log);
    if (a > 0) obj = NULL;  /* the engine owns them now */
    if (c > 0) bun = NULL;
    decode(e, 4, 6);
    struct ms_engine_stats st;
    ms_engine_get_stats(e, &st);
    struct ms_coverage ca, cb;
    CHECK(a > 0 && ms_engine_attach_coverage(e, a, 0, &ca) == 0);
    CHECK(c > 0 && ms_engine_attach_coverage(e, c, 0, &cb) == 0);
    /* class_time has two programs (task_begin, task_end): every task ran both */
    CHECKF(ca.executed == 2 * st.tasks && ca.failed == 0, "v1 object: %llu runs for %llu tasks",
           (unsigned long long)ca.executed, (unsigned long long)st.tasks);
    CHECKF(cb.executed == st.tasks && cb.failed == 0, "v1 bundle: %llu runs for %llu tasks",
           (unsigned long long)cb.executed, (unsigned long long)st.tasks);
  }
  ms_monitor_free(obj);
  ms_monitor_free(bun);
  ms_engine_free(e);
  ms_model_free(m);
}

/* A v2 field read on a hook that does not fill it is refused, naming both. */
static void test_v2_refused(void) {
  static const struct {
    const char *section, *asm_text, *want;
  } cases[] = {
      {"megascope/observe/task_ready", "ldxw %r0, [%r1+184]\nexit",
       "invalid read of ctx field work_rows at offset 184 size 4: hook task_ready does not define field work_rows"},
      {"megascope/observe/dep_release", "ldxdw %r0, [%r1+192]\nexit",
       "hook dep_release does not define field work_bytes"},
      {"megascope/observe/request", "ldxw %r0, [%r1+200]\nexit", "hook request does not define field remote_event"},
      {"megascope/sched_hint/task_ready", "ldxw %r0, [%r1+188]\nexit",
       "hook task_ready does not define field passed_over"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char log[8192] = "";
    struct ms_textbuf tb = {.buf = log, .size = sizeof log};
    struct ms_bpf_insn *insns = NULL;
    size_t n = 0;
    CHECK(ms_bpf_asm(cases[i].asm_text, &insns, &n, &tb) == 0);
    struct ms_bpf_bundle_prog bp = {.name = "v2_read", .section = cases[i].section, .insns = insns, .n = n};
    void *b = NULL;
    size_t len = 0;
    CHECK(ms_bpf_bundle_write(NULL, 0, &bp, 1, MS_HOOK_ABI_VERSION, NULL, &b, &len) == 0);
    struct ms_monitor *mon = b ? ms_monitor_open_mem(b, len, "v2", &tb) : NULL;
    CHECKF(mon == NULL && strstr(log, cases[i].want), "%s: want '%s', got: %s", cases[i].section, cases[i].want, log);
    ms_monitor_free(mon);
    free(b);
    free(insns);
  }
  /* the query compiler refuses it too, naming the field and the hook */
  struct ms_model *m = preset("tiny");
  struct ms_query_schema *s = schema_of(m, 0);
  char log[4096] = "";
  struct ms_textbuf tb = {.buf = log, .size = sizeof log};
  struct ms_query *q = ms_query_compile("task_ready { @ = sum(work_rows) }", s, NULL, &tb);
  CHECKF(q == NULL && strstr(log, "work_rows") && strstr(log, "task_ready"), "query: %s", log);
  ms_query_free(q);
  /* a newer program than the engine is refused */
  tb = (struct ms_textbuf){.buf = log, .size = sizeof log};
  log[0] = 0;
  struct ms_bpf_insn *insns = NULL;
  size_t n = 0;
  CHECK(ms_bpf_asm("mov %r0, 0\nexit", &insns, &n, &tb) == 0);
  struct ms_bpf_bundle_prog bp = {.name = "future", .section = "megascope/observe/step", .insns = insns, .n = n};
  void *b = NULL;
  size_t len = 0;
  CHECK(ms_bpf_bundle_write(NULL, 0, &bp, 1, MS_HOOK_ABI_VERSION + 1, NULL, &b, &len) == 0);
  struct ms_monitor *mon = b ? ms_monitor_open_mem(b, len, "future", &tb) : NULL;
  CHECKF(mon == NULL && strstr(log, "this engine implements version 3"), "future: %s", log);
  ms_monitor_free(mon);
  free(b);
  free(insns);
  ms_query_schema_free(s);
  ms_model_free(m);
}

int main(void) {
  test_routing_skew_sim();
  test_routing_skew_cpu();
  test_work_fields();
  test_remote_fields();
  test_v1_runs();
  test_v2_refused();
  TEST_MAIN_END();
}
