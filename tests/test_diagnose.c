/* SPDX-License-Identifier: MIT */
/* The counterexample benchmark's parts: scenario files are read strictly (each
 * rejection names the scenario and the key), written back and read again to the
 * same scenarios; the generator gives every fault type and healthy runs; what a
 * file leaves out is drawn from the scenario's seed, the same every time, and
 * said; each observer ships no more than its budget; the semantic read-out
 * names a fault's culprit from its own evidence; the scores add up. Small
 * simulated runs only (16 SMs, two layers). */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench.h"
#include "megascope/plan_ir.h"
#include "test.h"

static char mon_dir[4096];

static int parse(const char *text, struct bench_scenario **s, int *n, char *err, size_t errn) {
  struct ms_textbuf log = {err, errn, 0, 0};
  err[0] = 0;
  return bench_scenarios_parse(text, strlen(text), s, n, &log);
}

static void test_parse(void) {
  char err[1024];
  struct bench_scenario *s;
  int n;
  const char *good =
      "[{\"name\": \"a\", \"preset\": \"llama-3.2-1b\", \"backend\": \"sim\", \"batch\": 4, \"steps\": 3, \"seed\": 9,"
      "  \"gpu\": \"a100\", \"tp\": 2, \"model\": {\"n_layers\": 2}, \"sim\": {\"n_sms\": 16, \"jitter\": 0.02},"
      "  \"faults\": [{\"type\": \"comm_delay\", \"target\": 1, \"delay_us\": 2.5}]},"
      " {\"name\": \"b\", \"preset\": \"tiny\", \"backend\": \"cpu\", \"batch\": 2, \"steps\": 5, \"seed\": 1,"
      "  \"faults\": [{\"type\": \"slow_class\", \"target\": \"blk.1.wo\", \"factor\": 2}]}]";
  CHECKF(parse(good, &s, &n, err, sizeof err) == 0 && n == 2, "%s", err);
  if (n == 2) {
    CHECK(s[0].tp == 2 && s[0].n_layers == 2 && s[0].n_params == 2 && !strcmp(s[0].gpu, "a100"));
    CHECK(s[0].faults[0].type == MS_FAULT_COMM_DELAY && s[0].faults[0].magnitude == 2500 &&
          s[0].faults[0].given == (BF_TARGET | BF_MAGNITUDE));
    CHECK(s[1].backend == MS_BACKEND_CPU && s[1].faults[0].magnitude == 2 && !strcmp(s[1].faults[0].target, "blk.1.wo"));
    CHECK(s[0].target == 0.05 && s[0].jitter == 0.05);
    /* written and read back: the same */
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    CHECK(bench_scenarios_write(f, s, n) == 0);
    fclose(f);
    struct bench_scenario *t;
    int m;
    CHECKF(parse(buf, &t, &m, err, sizeof err) == 0 && m == 2, "%s\n%s", err, buf);
    if (m == 2)
      CHECK(t[0].tp == 2 && t[0].faults[0].magnitude == 2500 && t[1].faults[0].given == (BF_TARGET | BF_MAGNITUDE) &&
            !strcmp(t[0].params[0][0], "n_sms") && t[1].seed == 1);
    free(t);
    free(buf);
  }
  free(s);
  static const struct {
    const char *text, *msg;
  } bad[] = {
      {"{}", "non-empty JSON array"},
      {"[{\"name\": \"x\", \"preset\": \"tiny\", \"batch\": 1, \"steps\": 1, \"seed\": 1, \"faults\": [], \"colour\": 2}]",
       "scenario 0 (x): unknown key \"colour\""},
      {"[{\"name\": \"x\", \"preset\": \"tiny\", \"steps\": 1, \"seed\": 1, \"faults\": []}]", "\"batch\" is required"},
      {"[{\"name\": \"x\", \"preset\": \"nope\", \"batch\": 1, \"steps\": 1, \"seed\": 1, \"faults\": []}]",
       "must name a model preset"},
      {"[{\"name\": \"x\", \"preset\": \"tiny\", \"batch\": 1, \"steps\": 1, \"seed\": 1, \"faults\": [{\"type\": \"boom\"}]}]",
       "fault 0: unknown fault type \"boom\""},
      {"[{\"name\": \"x\", \"preset\": \"tiny\", \"batch\": 1, \"steps\": 1, \"seed\": 1, \"faults\": "
       "[{\"type\": \"starve_task\", \"factor\": 2}]}]",
       "starve_task takes \"delay_us\", not \"factor\""},
      {"[{\"name\": \"x\", \"preset\": \"tiny\", \"batch\": 1, \"steps\": 1, \"seed\": 1, \"faults\": [], "
       "\"sim\": {\"warp\": 9}}]",
       "bad cost parameter \"warp\""},
      {"[{\"name\": \"x\", \"preset\": \"tiny\", \"batch\": 1, \"steps\": 1, \"seed\": 1, \"faults\": "
       "[{\"type\": \"routing_skew\", \"factor\": 3}]}]",
       "\"factor\" must be a number in 0..1"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    int rc = parse(bad[i].text, &s, &n, err, sizeof err);
    CHECKF(rc == -EINVAL && strstr(err, bad[i].msg), "case %zu: %s", i, err);
    if (!rc) free(s);
  }
}

static void test_generate(void) {
  struct bench_scenario *s;
  int n, count[MS_FAULT_TYPE_COUNT] = {0}, healthy = 0, several = 0;
  CHECK(bench_scenarios_generate(8, 3, MS_BACKEND_SIM, &s, &n) == 0);
  CHECK(n == 8 * MS_FAULT_TYPE_COUNT + 8 + 8);
  int tp_seen[5] = {0}, batch_lo = 99, batch_hi = 0, moe = 0, presets = 0, gpus = 0;
  char seen_p[16][32], seen_g[8][16];
  for (int i = 0; i < n; i++) {
    if (s[i].n_faults == 2) {
      /* two faults: culprits of different kinds, never a late admission */
      several++;
      CHECK(ms_fault_culprit_kind(s[i].faults[0].type) != ms_fault_culprit_kind(s[i].faults[1].type));
      CHECK(s[i].faults[0].type != MS_FAULT_LATE_ADMISSION && s[i].faults[1].type != MS_FAULT_LATE_ADMISSION);
    } else if (s[i].n_faults) {
      count[s[i].faults[0].type]++;
    } else {
      healthy++;
    }
    CHECK(s[i].faults[0].given == 0 || !s[i].n_faults);
    /* every configuration dimension drawn, devices wherever a fault needs them */
    CHECK(s[i].tp >= 1 && s[i].tp <= 4 && s[i].batch >= 1 && s[i].batch <= 16);
    tp_seen[s[i].tp]++;
    if (s[i].batch < batch_lo) batch_lo = s[i].batch;
    if (s[i].batch > batch_hi) batch_hi = s[i].batch;
    moe += s[i].n_experts > 0 || !strcmp(s[i].preset, "tiny-moe");
    if (s[i].n_faults && (s[i].faults[0].type == MS_FAULT_COMM_DELAY || s[i].faults[0].type == MS_FAULT_BANDWIDTH_STEAL))
      CHECK(s[i].tp >= 2);
    if (s[i].n_faults && s[i].faults[0].type == MS_FAULT_ROUTING_SKEW)
      CHECK(s[i].n_experts > 0 || !strcmp(s[i].preset, "tiny-moe"));
    /* a starved task: expert tasks wherever the preset takes experts (not Gemma's) */
    if (s[i].n_faults == 1 && s[i].faults[0].type == MS_FAULT_STARVE_TASK && !strstr(s[i].preset, "gemma"))
      CHECKF(s[i].n_experts > 0 || !strcmp(s[i].preset, "tiny-moe"), "%s: %s", s[i].name, s[i].preset);
    int k = 0;
    while (k < presets && strcmp(seen_p[k], s[i].preset)) k++;
    if (k == presets && presets < 16) snprintf(seen_p[presets++], 32, "%s", s[i].preset);
    k = 0;
    while (k < gpus && strcmp(seen_g[k], s[i].gpu)) k++;
    if (k == gpus && gpus < 8) snprintf(seen_g[gpus++], 16, "%s", s[i].gpu);
  }
  for (int t = 0; t < MS_FAULT_TYPE_COUNT; t++) CHECK(count[t] == 8);
  CHECK(healthy == 8 && several == 8);
  CHECK(tp_seen[1] && tp_seen[2] && tp_seen[3] && tp_seen[4] && batch_lo <= 2 && batch_hi >= 15);
  CHECKF(presets >= 6 && gpus == 4 && moe > 8 && moe < n, "presets %d gpus %d moe %d", presets, gpus, moe);
  struct bench_scenario *again;
  int m;
  CHECK(bench_scenarios_generate(8, 3, MS_BACKEND_SIM, &again, &m) == 0 && m == n);
  CHECK(!memcmp(s, again, sizeof *s * (size_t)n));
  free(again);
  free(s);
}

/* Drawing: the same seed, the same culprit; said in `drawn`; names resolved. */
static void test_draw(void) {
  char err[1024];
  struct bench_scenario *s;
  int n;
  const char *text =
      "[{\"name\": \"d\", \"preset\": \"llama-3.2-1b\", \"batch\": 4, \"steps\": 2, \"seed\": 77, \"model\": {\"n_layers\": 3},"
      "  \"faults\": [{\"type\": \"starve_task\"}]},"
      " {\"name\": \"e\", \"preset\": \"llama-3.2-1b\", \"batch\": 4, \"steps\": 2, \"seed\": 77, \"model\": {\"n_layers\": 3},"
      "  \"faults\": [{\"type\": \"delayed_release\", \"target\": \"rope->attn\", \"delay_us\": 1}]},"
      " {\"name\": \"f\", \"preset\": \"llama-3.2-1b\", \"batch\": 4, \"steps\": 2, \"seed\": 77, \"model\": {\"n_layers\": 3},"
      "  \"faults\": [{\"type\": \"slow_class\", \"target\": \"blk.9.wo\"}]}]";
  CHECKF(parse(text, &s, &n, err, sizeof err) == 0 && n == 3, "%s", err);
  struct ms_model *m = bench_model(&s[0], NULL);
  struct ms_compile_opts co = {.sz = sizeof co, .batch = 4, .tiles_per_op = 16};
  struct ms_plan *p = ms_plan_compile(m, &co, NULL);
  struct ms_textbuf log = {err, sizeof err, 0, 0};
  struct bench_scenario a = s[0], b = s[0];
  CHECK(bench_scenario_draw(&a, p, 16, &log) == 0 && bench_scenario_draw(&b, p, 16, &log) == 0);
  CHECK(a.faults[0].target_id == b.faults[0].target_id && a.faults[0].tile == b.faults[0].tile);
  CHECK(p->classes[a.faults[0].target_id].launch == MS_LAUNCH_JIT);
  CHECKF(strstr(a.drawn, "target blk.") && strstr(a.drawn, "tile") && strstr(a.drawn, "severity"), "%s", a.drawn);
  CHECK(bench_scenario_draw(&s[1], p, 16, &log) == 0 && !strcmp(p->ev_classes[s[1].faults[0].target_id], "rope->attn"));
  CHECK(s[1].drawn[0] == 0);  /* nothing left out, nothing drawn */
  err[0] = 0;
  log.len = 0;
  CHECK(bench_scenario_draw(&s[2], p, 16, &log) == -EINVAL);
  CHECKF(strstr(err, "target \"blk.9.wo\" names no task_class"), "%s", err);
  ms_plan_free(p);
  ms_model_free(m);
  free(s);
}

/* Observers keep to their budgets; the semantic read-out finds a slow class. */
static void test_observe_and_diagnose(void) {
  char err[4096];
  struct bench_scenario *s;
  int n;
  const char *text =
      "[{\"name\": \"o\", \"preset\": \"llama-3.2-1b\", \"batch\": 4, \"steps\": 4, \"seed\": 5, \"model\": {\"n_layers\": 2},"
      "  \"sim\": {\"n_sms\": 16}, \"faults\": [{\"type\": \"slow_class\", \"target\": \"blk.0.gate_up\", \"factor\": 2}]}]";
  CHECKF(parse(text, &s, &n, err, sizeof err) == 0, "%s", err);
  struct ms_textbuf log = {err, sizeof err, 0, 0};
  struct ms_model *m = bench_model(&s[0], &log);
  struct ms_compile_opts co = {.sz = sizeof co, .batch = 4, .tiles_per_op = 16};
  struct ms_plan *p = ms_plan_compile(m, &co, NULL);
  CHECK(bench_scenario_draw(&s[0], p, 16, &log) == 0);
  struct ms_fault f = {.type = MS_FAULT_SLOW_CLASS, .target = s[0].faults[0].target_id, .factor = 2};
  struct bench_opts o = {.n_budgets = 1, .budgets = {4096}, .monitors = mon_dir};
  struct bench_engine_cfg healthy = {.m = m, .sc = &s[0], .seed = 99}, faulty = {.m = m, .sc = &s[0], .faults = &f,
                                                                                 .n_faults = 1, .seed = 5};
  for (int meth = 0; meth < BM_COUNT; meth++) {
    struct bench_evidence ref, ev;
    uint64_t budget = meth == BM_TASK_TRACE || meth == BM_SAMPLED_EVENTS || meth == BM_PROFILER ? 4096 : 0;
    err[0] = 0;
    log.len = 0;
    int r1 = bench_observe(&o, &healthy, meth, budget, &ref, &log);
    int r2 = bench_observe(&o, &faulty, meth, budget, &ev, &log);
    CHECKF(r1 == 0 && r2 == 0, "%s: %s", bench_method_name(meth), err);
    ev.budget = 4096;
    struct bench_answer a;
    bench_diagnose(&ref, &ev, p, &s[0], &a);
    CHECKF(a.bytes <= 4096, "%s shipped %llu bytes", bench_method_name(meth), (unsigned long long)a.bytes);
    CHECK(a.confidence >= 0 && a.confidence <= 1);
    if (meth == BM_SEMANTIC) {
      CHECKF(a.cause == MS_FAULT_SLOW_CLASS && a.kind == MS_CULPRIT_TASK_CLASS && a.id == f.target, "%s: %s",
             a.name, a.why);
      CHECK(ev.attach_ns > 0);  /* attached to the live engine at step 1 */
    }
    if (meth == BM_KERNEL_TIMING) CHECK(ev.n_steps == 4 && a.cause != MS_FAULT_SLOW_CLASS);
    bench_evidence_free(&ref);
    bench_evidence_free(&ev);
  }
  ms_plan_free(p);
  ms_model_free(m);
  free(s);
}

/* A test's scenario parsed from text, its model and, with batch > 0, its plan
 * (tiles_per_op tiles, 0: from the byte target); the log writes into err. */
struct tcase {
  struct bench_scenario *s;
  struct ms_model *m;
  struct ms_plan *p;
  char err[4096];
  struct ms_textbuf log;
};

static void tcase_open(struct tcase *t, const char *text, int batch, int tiles) {
  int n;
  memset(t, 0, sizeof *t);
  t->log = (struct ms_textbuf){t->err, sizeof t->err, 0, 0};
  CHECKF(parse(text, &t->s, &n, t->err, sizeof t->err) == 0, "%s", t->err);
  t->m = t->s ? bench_model(&t->s[0], &t->log) : NULL;
  struct ms_compile_opts co = {.sz = sizeof co, .batch = batch, .tiles_per_op = tiles};
  t->p = t->m && batch > 0 ? ms_plan_compile(t->m, &co, NULL) : NULL;
  CHECKF(t->m && (batch <= 0 || t->p), "%s", t->err);
}

static void tcase_close(struct tcase *t) {
  ms_plan_free(t->p);
  ms_model_free(t->m);
  free(t->s);
}

/* Two faults at once, a slow layer and a slow class inside it: each stands out
 * on its own (the layer by its classes' median, the class beyond its layer's
 * factor), so the semantic read-out names both. */
static void test_layer_and_class(void) {
  struct tcase t;
  tcase_open(&t, "[{\"name\": \"lc\", \"preset\": \"llama-3.2-1b\", \"batch\": 4, \"steps\": 4, \"seed\": 5, \"model\": {\"n_layers\": 3},"
      "  \"sim\": {\"n_sms\": 16}, \"faults\": [{\"type\": \"slow_layer\", \"target\": \"1\", \"factor\": 1.3},"
      "                                          {\"type\": \"slow_class\", \"target\": \"blk.1.wo\", \"factor\": 3}]}]", 4, 16);
  CHECK(bench_scenario_draw(&t.s[0], t.p, 16, &t.log) == 0);
  int wo = t.s[0].faults[1].target_id;
  CHECK(wo >= 0 && t.p->classes[wo].layer == 1);
  struct ms_fault f[2] = {{.type = MS_FAULT_SLOW_LAYER, .target = 1, .factor = 1.3},
                          {.type = MS_FAULT_SLOW_CLASS, .target = wo, .factor = 3}};
  struct bench_opts o = {.n_budgets = 1, .budgets = {16384}, .monitors = mon_dir};
  struct bench_engine_cfg healthy = {.m = t.m, .sc = &t.s[0], .seed = 99},
                          faulty = {.m = t.m, .sc = &t.s[0], .faults = f, .n_faults = 2, .seed = 5};
  struct bench_evidence ref, ev;
  CHECKF(bench_observe(&o, &healthy, BM_SEMANTIC, 0, &ref, &t.log) == 0 &&
             bench_observe(&o, &faulty, BM_SEMANTIC, 0, &ev, &t.log) == 0, "%s", t.err);
  ev.budget = 16384;
  struct bench_answer a;
  bench_diagnose(&ref, &ev, t.p, &t.s[0], &a);
  int layer = a.kind == MS_CULPRIT_LAYER && a.id == 1, cls = a.kind == MS_CULPRIT_TASK_CLASS && a.id == wo;
  for (int i = 0; i < a.n_more; i++) {
    layer |= a.more[i].kind == MS_CULPRIT_LAYER && a.more[i].id == 1;
    cls |= a.more[i].kind == MS_CULPRIT_TASK_CLASS && a.more[i].id == wo;
  }
  CHECKF(layer && cls && a.n_more == 1, "%s: %s", a.name, a.why);
  bench_evidence_free(&ref);
  bench_evidence_free(&ev);
  tcase_close(&t);
}

/* A request admitted late (heldout-8's late_admission-1: Llama-3.2-1B's
 * shapes, 4 layers, tensor parallel 4, batch 9): the batch changes over the
 * run, and with it device 0's tasks against their classes' running means
 * (1.045x, z 13); the request is named alone. */
static void test_late_request_alone(void) {
  struct tcase t;
  tcase_open(&t, "[{\"name\": \"la\", \"preset\": \"llama-3.2-1b\", \"backend\": \"sim\", \"batch\": 9, \"steps\": 5,"
                     "  \"seed\": 819501, \"gpu\": \"h100\", \"jitter\": 0.05, \"tp\": 4, \"model\": {\"n_layers\": 4},"
                     "  \"faults\": [{\"type\": \"late_admission\"}]}]", 0, 0);
  struct bench_engine_cfg healthy = {.m = t.m, .sc = &t.s[0], .seed = 99};
  struct ms_engine *e = t.m ? bench_engine_new(&healthy, &t.log) : NULL;
  CHECKF(e, "%s", t.err);
  int workers = e ? ms_engine_n_workers(e) : 0;
  ms_engine_free(e);
  /* the plan as the benchmark compiles it (src/bench/run.c) */
  struct ms_compile_opts co = {.sz = sizeof co, .batch = ms_bucket_for(9), .tiles_per_op = workers, .tp = 4};
  t.p = ms_plan_compile(t.m, &co, NULL);
  CHECKF(t.p, "%s", t.err);
  CHECK(bench_scenario_draw(&t.s[0], t.p, workers, &t.log) == 0);
  struct ms_fault f = {.type = MS_FAULT_LATE_ADMISSION, .target = t.s[0].faults[0].target_id, .delay_ns = 400000};
  struct bench_opts o = {.n_budgets = 1, .budgets = {16384}, .monitors = mon_dir};
  struct bench_engine_cfg faulty = {.m = t.m, .sc = &t.s[0], .faults = &f, .n_faults = 1, .seed = 5};
  struct bench_evidence ref, ev;
  CHECKF(bench_observe(&o, &healthy, BM_SEMANTIC, 0, &ref, &t.log) == 0 &&
             bench_observe(&o, &faulty, BM_SEMANTIC, 0, &ev, &t.log) == 0, "%s", t.err);
  ev.budget = 16384;
  struct bench_answer a;
  bench_diagnose(&ref, &ev, t.p, &t.s[0], &a);
  CHECKF(a.kind == MS_CULPRIT_REQUEST && a.id == t.s[0].faults[0].target_id && a.n_more == 0, "%s: %s", a.name, a.why);
  bench_evidence_free(&ref);
  bench_evidence_free(&ev);
  tcase_close(&t);
}

/* Synthetic semantic rows, the same in a run and its reference: every class 40
 * tasks of 1 us (1% scatter), 16 workers whose tasks scatter by about 1.5%
 * against their classes' means, two devices of 400 tasks each. */
static void quiet_rows(struct bench_features *f, const struct ms_plan *p) {
  for (int c = 0; c < p->n_classes; c++) {
    struct bench_stat *x = &f->row[FS_CLASS][c], *o = &f->row[FS_OP][p->classes[c].kernel];
    *x = (struct bench_stat){.n = 40, .sum = 40e3, .sumsq = 40e6 * 1.0001, .max = 1100, .qsum = 40e3, .qmax = 2e3,
                             .have = 1};
    o->n += x->n, o->sum += x->sum, o->sumsq += x->sumsq, o->qsum += x->qsum, o->max = 1100, o->qmax = 2e3;
    o->have = 1;
  }
  for (int w = 0; w < f->n[FS_WORKER]; w++)
    f->row[FS_WORKER][w] = (struct bench_stat){.n = 50, .sum = 5e3, .qsum = 5e3, .ratio = 50 * (w % 2 ? 1.01 : 1),
                                               .ratio_n = 50, .have = 1};
  for (int d = 0; d < f->n[FS_DEVBUSY]; d++) f->row[FS_DEVBUSY][d] = (struct bench_stat){.n = 400, .sum = 400, .have = 1};
  for (int x = 0; x < f->n[FS_EXPERT]; x++)
    f->row[FS_EXPERT][x] = (struct bench_stat){.n = 40, .sum = 40e3, .sumsq = 40e6 * 1.0001, .max = 1100, .work = 100,
                                               .have = 1};
}

/* A layer slowed about 3.9x whose classes ran 3.4x to 4.4x (on the CPU each
 * spins a multiple of its own time): the layer is named alone, its most
 * slowed class being the layer, not a class of its own (judged against how
 * much the layer's classes differ among themselves); test_layer_and_class
 * keeps a class 3x inside a layer 1.3x named beside it. */
static void test_layer_classes_uneven(void) {
  struct tcase t;
  tcase_open(&t, "[{\"name\": \"lu\", \"preset\": \"llama-3.2-1b\", \"batch\": 4, \"steps\": 4, \"seed\": 5,"
                     "  \"model\": {\"n_layers\": 6}, \"sim\": {\"n_sms\": 16}, \"faults\": []}]", 4, 16);
  struct bench_evidence ref = {.method = BM_SEMANTIC, .coverage = 1}, ev = {.method = BM_SEMANTIC, .coverage = 1};
  ref.feat = bench_feat_new(t.p, 32, 4, 2);
  ev.feat = bench_feat_new(t.p, 32, 4, 2);
  quiet_rows(ref.feat, t.p);
  quiet_rows(ev.feat, t.p);
  ref.feat->coverage = ev.feat->coverage = 1;
  int k = 0, top = -1;
  for (int c = 0; c < t.p->n_classes; c++) {
    if (t.p->classes[c].kernel == MS_K_EMPTY || t.p->classes[c].kernel == MS_K_COMM) continue;
    /* the other layers' classes wander 0.94-1.06x (a real run's 4-5%) */
    double f = t.p->classes[c].layer != 2 ? 0.94 + 0.03 * ((c * 3) % 5) : 3.4 + (double)((k * 5) % 7) / 6;
    k += t.p->classes[c].layer == 2;
    struct bench_stat *x = &ev.feat->row[FS_CLASS][c], *o = &ev.feat->row[FS_OP][t.p->classes[c].kernel];
    o->sum += x->sum * (f - 1), o->sumsq += x->sumsq * (f * f - 1);
    x->sum *= f, x->sumsq *= f * f, x->max *= f, x->qsum *= f;
    if (f >= 4.4 - 1e-9) top = c;
  }
  CHECK(k >= 4 && top >= 0);
  ev.budget = 16384;
  struct bench_answer a;
  bench_diagnose(&ref, &ev, t.p, &t.s[0], &a);
  CHECKF(a.kind == MS_CULPRIT_LAYER && a.id == 2 && a.n_more == 0, "%s: %s", a.name, a.why);
  bench_evidence_free(&ref);
  bench_evidence_free(&ev);
  tcase_close(&t);
}

/* A routing skew whose expert's tasks all ran on device 1: that device's
 * tasks, against their classes' means, carry the expert's excess, and it is
 * not named beside the expert; device 0, slow on its own beside it, still is. */
static void test_device_beside_culprit(void) {
  struct tcase t;
  tcase_open(&t, "[{\"name\": \"db\", \"preset\": \"tiny-moe\", \"batch\": 4, \"steps\": 4, \"seed\": 5, \"tp\": 2,"
                     "  \"sim\": {\"n_sms\": 16}, \"faults\": [{\"type\": \"routing_skew\", \"target\": 3, \"factor\": 0.5}]}]", 4, 16);
  const int E = t.m->cfg.n_experts, X = 3;
  CHECK(E >= 4);
  for (int own = 0; own < 2 && E >= 4; own++) {
    struct bench_evidence ref = {.method = BM_SEMANTIC, .coverage = 1}, ev = {.method = BM_SEMANTIC, .coverage = 1};
    ref.feat = bench_feat_new(t.p, 16, 4, 2);
    ev.feat = bench_feat_new(t.p, 16, 4, 2);
    quiet_rows(ref.feat, t.p);
    quiet_rows(ev.feat, t.p);
    ref.feat->coverage = ev.feat->coverage = 1;
    /* expert 3 takes twice its rows and time, the others less: the expert
     * classes' means stay; its 40 tasks' excess (40) sits on device 1 */
    for (int x = 0; x < E; x++) {
      struct bench_stat *r = &ev.feat->row[FS_EXPERT][x];
      double k = x == X ? 2 : 1 - 1.0 / (E - 1);
      r->sum *= k, r->sumsq *= k * k, r->max *= k, r->work *= k;
    }
    ev.feat->row[FS_DEVBUSY][1].sum += 40;
    if (own) ev.feat->row[FS_DEVBUSY][0].sum *= 1.4;  /* device 0: 1.4x on its own */
    struct bench_answer a;
    bench_diagnose(&ref, &ev, t.p, &t.s[0], &a);
    int expert = a.kind == MS_CULPRIT_EXPERT && a.id == X, dev[2] = {0, 0};
    for (int d = 0; d < 2; d++) dev[d] = a.kind == MS_CULPRIT_DEVICE && a.id == d;
    for (int i = 0; i < a.n_more; i++) {
      expert |= a.more[i].kind == MS_CULPRIT_EXPERT && a.more[i].id == X;
      for (int d = 0; d < 2; d++) dev[d] |= a.more[i].kind == MS_CULPRIT_DEVICE && a.more[i].id == d;
    }
    CHECKF(expert && !dev[1] && dev[0] == own && a.n_more == own, "%s: %s", a.name, a.why);
    bench_evidence_free(&ref);
    bench_evidence_free(&ev);
  }
  tcase_close(&t);
}

/* A CPU server's two workers, kernel by kernel: worker 1 at 1.08x the other
 * at every kernel is named; worker 1 at 1.3x at the head alone (one kernel
 * whose tiles move with the memory bandwidth, most of a worker's tasks on a
 * model with a large vocabulary) is not. */
static void test_few_workers_by_kernel(void) {
  struct tcase t;
  tcase_open(&t, "[{\"name\": \"fw\", \"preset\": \"tiny\", \"backend\": \"cpu\", \"batch\": 4, \"steps\": 4,"
                     "  \"seed\": 5, \"workers\": 2, \"faults\": []}]", 4, 0);
  for (int head_only = 0; head_only < 2 && t.p; head_only++) {
    struct bench_evidence ref = {.method = BM_SEMANTIC, .coverage = 1}, ev = {.method = BM_SEMANTIC, .coverage = 1};
    ref.feat = bench_feat_new(t.p, 2, 4, 1);
    ev.feat = bench_feat_new(t.p, 2, 4, 1);
    struct bench_evidence *both[2] = {&ref, &ev};
    for (int i = 0; i < 2; i++) {
      struct bench_features *f = both[i]->feat;
      quiet_rows(f, t.p);
      f->coverage = 1;
      f->row[FS_BTOP][0] = (struct bench_stat){.n = 1, .sum = 1, .have = 1};  /* the slowest worker: 1 */
      for (int w = 0; w < 2; w++)
        for (int k = 0; k < MS_K_COUNT; k++) {
          double slow = i && w == 1 && (head_only ? k == MS_K_LM_HEAD : 1) ? (head_only ? 1.3 : 1.08) : 1;
          f->row[FS_WOP][w * MS_K_COUNT + k] = (struct bench_stat){.n = 100, .sum = 100e3 * slow, .have = 1};
        }
    }
    ev.budget = 16384;
    struct bench_answer a;
    bench_diagnose(&ref, &ev, t.p, &t.s[0], &a);
    int named = a.kind == MS_CULPRIT_WORKER && a.id == 1;
    for (int i = 0; i < a.n_more; i++) named |= a.more[i].kind == MS_CULPRIT_WORKER && a.more[i].id == 1;
    CHECKF(named == !head_only, "head only %d: %s: %s", head_only, a.name, a.why);
    bench_evidence_free(&ref);
    bench_evidence_free(&ev);
  }
  tcase_close(&t);
}

/* A CPU server's two workers, counted: the plan places its AOT tasks, so a
 * worker's share of them moves only when its queue took tasks from the other
 * (queue_saturation, named by the count, the tasks' times unchanged); the same
 * share moved in counts that were cut short (coverage under 1) or in a JIT
 * kernel's tasks (taken by whichever worker was free) is not. */
static void test_few_workers_aot_share(void) {
  struct tcase t;
  tcase_open(&t, "[{\"name\": \"fq\", \"preset\": \"tiny\", \"backend\": \"cpu\", \"batch\": 4, \"steps\": 4,"
                     "  \"seed\": 5, \"workers\": 2, \"faults\": []}]", 4, 0);
  int jit = -1;  /* a kernel run just in time (attention) */
  for (int c = 0; t.p && c < t.p->n_classes; c++)
    if (t.p->classes[c].launch == MS_LAUNCH_JIT) jit = t.p->classes[c].kernel;
  CHECK(jit >= 0);
  /* 0: shares as in the reference; 1: worker 1 holds 3% more of the AOT
   * tasks; 2: the same, counted over half the run; 3: only the JIT kernel moved */
  for (int kind = 0; kind < 4 && t.p && jit >= 0; kind++) {
    struct bench_evidence ref = {.method = BM_SEMANTIC, .coverage = 1},
                          ev = {.method = BM_SEMANTIC, .coverage = kind == 2 ? 0.5 : 1};
    ref.feat = bench_feat_new(t.p, 2, 4, 1);
    ev.feat = bench_feat_new(t.p, 2, 4, 1);
    struct bench_evidence *both[2] = {&ref, &ev};
    for (int i = 0; i < 2; i++) {
      struct bench_features *f = both[i]->feat;
      quiet_rows(f, t.p);
      f->coverage = both[i]->coverage;
      f->row[FS_BTOP][0] = (struct bench_stat){.n = 1, .sum = 1, .have = 1};
      for (int w = 0; w < 2; w++)
        for (int k = 0; k < MS_K_COUNT; k++) {
          int moved = i && kind > 0 && (kind == 3 ? k == jit : k != jit);
          double n = 1000 + (moved ? (w == 1 ? 30 : -30) : 0);  /* each task 1 us wherever it ran */
          f->row[FS_WOP][w * MS_K_COUNT + k] = (struct bench_stat){.n = n, .sum = n * 1e3, .have = 1};
        }
    }
    ev.budget = 16384;
    struct bench_answer a;
    bench_diagnose(&ref, &ev, t.p, &t.s[0], &a);
    int named = a.cause == MS_FAULT_QUEUE_SATURATION && a.kind == MS_CULPRIT_WORKER && a.id == 1;
    CHECKF(named == (kind == 1), "case %d: %s %s: %s", kind, bench_cause_name(a.cause), a.name, a.why);
    bench_evidence_free(&ref);
    bench_evidence_free(&ev);
  }
  tcase_close(&t);
}

/* Scores: counted over the scenarios that ran and had an effect, per split, as
 * documented; scope apart from the cause; "unknown cause, scope X" right. */
static void test_score(void) {
  struct bench_case cases[6];
  memset(cases, 0, sizeof cases);
  struct bench_report r = {.n = 6, .cases = cases, .o = {.n_budgets = 1, .budgets = {1024}}};
  /* 0: right cause, wrong class, confident: falsely confident */
  cases[0].truth_cause = MS_FAULT_SLOW_CLASS;
  cases[0].truth_kind = MS_CULPRIT_TASK_CLASS;
  cases[0].truth_id = 4;
  cases[0].ans[BM_SEMANTIC][0] = (struct bench_answer){.cause = MS_FAULT_SLOW_CLASS, .kind = MS_CULPRIT_TASK_CLASS,
                                                       .id = 5, .confidence = 0.9, .bytes = 100, .cause_ok = 1};
  /* 1: healthy, "none" */
  cases[1].truth_cause = -1;
  cases[1].ans[BM_SEMANTIC][0] = (struct bench_answer){.cause = -1, .id = -1, .confidence = 0.9, .bytes = 300,
                                                       .cause_ok = 1, .culprit_ok = 1, .scope_ok = 1};
  /* 2: did not run */
  snprintf(cases[2].error, sizeof cases[2].error, "did not run");
  /* 3: an open-ended cause, "unknown cause, worker 7", confident: right scope, not falsely confident */
  cases[3].truth_cause = MS_FAULT_SLOW_WORKER;
  cases[3].truth_kind = MS_CULPRIT_WORKER;
  cases[3].truth_id = 7;
  cases[3].ans[BM_SEMANTIC][0] = (struct bench_answer){.cause = -2, .kind = MS_CULPRIT_WORKER, .id = 7,
                                                       .confidence = 0.8, .bytes = 200, .scope_ok = 1};
  /* 4: no measurable effect: left out, counted */
  cases[4].truth_cause = MS_FAULT_QUEUE_SATURATION;
  cases[4].no_effect = 1;
  cases[4].ans[BM_SEMANTIC][0] = (struct bench_answer){.cause = -1, .confidence = 0.9};
  /* 5: held out: the right scope, a wrong cause named with confidence */
  cases[5].split = 1;
  cases[5].truth_cause = MS_FAULT_SLOW_WORKER;
  cases[5].truth_kind = MS_CULPRIT_WORKER;
  cases[5].truth_id = 2;
  cases[5].ans[BM_SEMANTIC][0] = (struct bench_answer){.cause = MS_FAULT_QUEUE_SATURATION, .kind = MS_CULPRIT_WORKER,
                                                       .id = 2, .confidence = 0.7, .bytes = 50, .scope_ok = 1};
  struct bench_totals t;
  bench_score(&r, 0, BM_SEMANTIC, 0, &t);
  CHECK(t.n == 3 && t.no_effect == 1 && t.telemetry_bytes == 200);
  CHECK(fabs(t.cause_accuracy - 2.0 / 3) < 1e-9 && fabs(t.culprit_accuracy - 1.0 / 3) < 1e-9);
  CHECK(fabs(t.scope_accuracy - 2.0 / 3) < 1e-9 && fabs(t.false_confidence - 1.0 / 3) < 1e-9);
  bench_score(&r, 1, BM_SEMANTIC, 0, &t);
  CHECK(t.n == 1 && t.scope_accuracy == 1 && t.cause_accuracy == 0 && t.false_confidence == 1);
  bench_score(&r, -1, BM_SEMANTIC, 0, &t);
  CHECK(t.n == 4 && t.no_effect == 1);
  bench_score_type(&r, 0, BM_SEMANTIC, 0, -1, &t);
  CHECK(t.n == 1 && t.culprit_accuracy == 1);
  int n[4], right[4];
  bench_reliability(&r, -1, BM_SEMANTIC, 0, 4, n, right);
  /* confidences 0.9 (wrong), 0.9 (right), 0.8 (right), 0.7 (wrong cause) */
  CHECK(n[0] == 0 && n[1] == 0 && n[2] == 1 && right[2] == 0 && n[3] == 3 && right[3] == 2);
}

/* Several culprits: naming some of them only is incomplete (not right, not
 * falsely confident); naming one that is none of them is confidently wrong;
 * the report counts them as their own type. */
static void test_score_several(void) {
  struct bench_case cases[3];
  memset(cases, 0, sizeof cases);
  struct bench_report r = {.n = 3, .cases = cases, .o = {.n_budgets = 1, .budgets = {1024}}};
  for (int i = 0; i < 3; i++) {
    cases[i].n_truth = 2;
    cases[i].truth[0] = (struct bench_culprit){.cause = MS_FAULT_SLOW_CLASS, .kind = MS_CULPRIT_TASK_CLASS, .id = 4};
    cases[i].truth[1] = (struct bench_culprit){.cause = MS_FAULT_SLOW_REQUEST, .kind = MS_CULPRIT_REQUEST, .id = 1};
    cases[i].truth_cause = MS_FAULT_SLOW_CLASS;
    CHECK(bench_case_type(&cases[i]) == BENCH_TYPE_MULTI);
  }
  /* 0: the class only, confident: incomplete */
  cases[0].ans[BM_SEMANTIC][0] = (struct bench_answer){.cause = MS_FAULT_SLOW_CLASS, .kind = MS_CULPRIT_TASK_CLASS,
                                                       .id = 4, .confidence = 0.9, .multi = 1};
  /* 1: both: right */
  cases[1].ans[BM_SEMANTIC][0] = (struct bench_answer){.cause = MS_FAULT_SLOW_CLASS, .kind = MS_CULPRIT_TASK_CLASS,
                                                       .id = 4, .confidence = 0.9, .multi = 1, .n_more = 1,
                                                       .scope_ok = 1, .cause_ok = 1, .culprit_ok = 1};
  /* 2: the class and a wrong worker, confident: falsely confident */
  cases[2].ans[BM_SEMANTIC][0] = (struct bench_answer){.cause = MS_FAULT_SLOW_CLASS, .kind = MS_CULPRIT_TASK_CLASS,
                                                       .id = 4, .confidence = 0.9, .multi = 1, .n_more = 1,
                                                       .wrong_named = 1};
  struct bench_totals t;
  bench_score_type(&r, 0, BM_SEMANTIC, 0, BENCH_TYPE_MULTI, &t);
  CHECK(t.n == 3 && fabs(t.scope_accuracy - 1.0 / 3) < 1e-9 && fabs(t.false_confidence - 1.0 / 3) < 1e-9);
  CHECK(!bench_answer_right(&cases[0].ans[BM_SEMANTIC][0]) && bench_answer_right(&cases[1].ans[BM_SEMANTIC][0]));
  CHECK(!strcmp(bench_type_name(BENCH_TYPE_MULTI), "several") && !strcmp(bench_type_name(BENCH_TYPE_INTERFERE + BI_SPIN), "spin"));
}

/* Calibration: learned from the training split alone, each answer stated as its
 * bin's training accuracy shrunk toward 0 (right / (n + 2)); the held-out
 * split is stated by what training learned, never by itself. (Bins pooled
 * where the accuracy falls as the raw confidence rises: test_bench_score.) */
static void test_calibrate(void) {
  struct bench_case cases[5];
  memset(cases, 0, sizeof cases);
  struct bench_report r = {.n = 5, .cases = cases, .o = {.n_budgets = 1, .budgets = {1024}}};
  for (int i = 0; i < 5; i++) {
    cases[i].truth_cause = MS_FAULT_SLOW_WORKER;
    cases[i].truth_kind = MS_CULPRIT_WORKER;
    cases[i].truth_id = 3;
    cases[i].split = i >= 3;
    for (int m = 0; m < BM_COUNT; m++)
      cases[i].ans[m][0] = (struct bench_answer){.cause = -2, .kind = MS_CULPRIT_WORKER, .id = 3, .scope_ok = 1,
                                                 .raw_confidence = 0.9};
  }
  cases[2].ans[BM_SEMANTIC][0].id = 4;  /* training: 2 right, 1 wrong in the top bin */
  cases[2].ans[BM_SEMANTIC][0].scope_ok = 0;
  cases[4].ans[BM_SEMANTIC][0] = (struct bench_answer){.cause = -1, .id = -1, .raw_confidence = 0.9};  /* a "none" */
  bench_calibrate(&r);
  CHECK(r.cal.learned);
  CHECK(fabs(cases[0].ans[BM_SEMANTIC][0].confidence - 2.0 / 5) < 1e-12);
  CHECK(fabs(cases[3].ans[BM_SEMANTIC][0].confidence - 2.0 / 5) < 1e-12);  /* held out: training's bin */
  CHECK(cases[4].ans[BM_SEMANTIC][0].confidence == 0);  /* no training "none" answers: no confidence */
  CHECK(fabs(cases[3].ans[BM_KERNEL_TIMING][0].confidence - 3.0 / 5) < 1e-12);
  CHECK(cases[3].ans[BM_SEMANTIC][0].raw_confidence == 0.9);
  /* a weak finding is a kind of its own: the training weak one (right) states
   * 1/3, the named answers' bin is left with 1 right of 2 (1/4) */
  cases[1].ans[BM_SEMANTIC][0].weak = 1;
  cases[3].ans[BM_SEMANTIC][0].weak = 1;
  bench_calibrate(&r);
  CHECK(fabs(cases[3].ans[BM_SEMANTIC][0].confidence - 1.0 / 3) < 1e-12);
  CHECK(fabs(cases[0].ans[BM_SEMANTIC][0].confidence - 1.0 / 4) < 1e-12);
}

/* A bin above the others states more only with enough answers of its own: ten
 * training "none" answers at raw 0.5 (five right) and four at raw 0.7 (all
 * right) are one pool, 9 right of 14 (9/16), where alone the four would state
 * 4/6 and the ten 5/12; with eight at raw 0.7 (all right) the two stand apart. */
static void test_calibrate_min_pool(void) {
  enum { N = 19 };
  struct bench_case cases[N];
  memset(cases, 0, sizeof cases);
  struct bench_report r = {.n = N, .cases = cases, .o = {.n_budgets = 1, .budgets = {1024}}};
  for (int i = 0; i < N; i++) {
    cases[i].truth_cause = i < 5 || i >= 10 ? -1 : MS_FAULT_SLOW_WORKER;
    cases[i].split = i == N - 1;
    for (int m = 0; m < BM_COUNT; m++)
      cases[i].ans[m][0] = (struct bench_answer){.cause = -1, .id = -1, .scope_ok = cases[i].truth_cause == -1,
                                                 .cause_ok = cases[i].truth_cause == -1,
                                                 .raw_confidence = i < 10 ? 0.5 : 0.7};
  }
  for (int i = 14; i < N - 1; i++) cases[i].error[0] = 'x';  /* four at raw 0.7 scored, one held out */
  bench_calibrate(&r);
  CHECK(fabs(cases[N - 1].ans[BM_SEMANTIC][0].confidence - 9.0 / 16) < 1e-12);
  CHECK(fabs(cases[0].ans[BM_SEMANTIC][0].confidence - 9.0 / 16) < 1e-12);
  for (int i = 14; i < N - 1; i++) cases[i].error[0] = 0;
  bench_calibrate(&r);
  CHECK(fabs(cases[N - 1].ans[BM_SEMANTIC][0].confidence - 8.0 / 10) < 1e-12);
  CHECK(fabs(cases[0].ans[BM_SEMANTIC][0].confidence - 5.0 / 12) < 1e-12);
}

/* A judgement that held one scope (kind, id) of cause at z near the threshold. */
static struct bench_near near1(int cause, enum ms_culprit_kind kind, int id, double z) {
  struct bench_near n = {.n = 1, .z = {z}};
  n.scope[0] = (struct bench_culprit){.cause = cause, .kind = kind, .id = id};
  return n;
}

/* The workers and devices held at half the threshold (6) or more: named where
 * both judgements hold the same one and name nothing in common, or where one
 * names it and the other said "none" holding it; never a class, never two
 * different workers. */
static void test_agree_near(const struct ms_plan *p, const struct bench_answer *none, const struct bench_answer *wrk,
                            const struct bench_answer *cls) {
  struct bench_near n4 = near1(-2, MS_CULPRIT_WORKER, 1, 4.0), n35 = near1(-2, MS_CULPRIT_WORKER, 1, 3.5);
  struct bench_answer a = *none;
  bench_answer_agree(&a, none, &n4, &n35, p, 2);  /* the smaller z: 0.5 * 3.5 / 6 */
  CHECKF(a.kind == MS_CULPRIT_WORKER && a.id == 1 && a.cause == -2 && fabs(a.confidence - 0.5 * 3.5 / 6) < 1e-9 &&
         a.weak && strstr(a.why, "weak finding"), "%s: %s", a.name, a.why);
  struct bench_near q = near1(MS_FAULT_QUEUE_SATURATION, MS_CULPRIT_WORKER, 1, 4.0);
  a = *none;
  bench_answer_agree(&a, none, &q, &n35, p, 2);  /* the two say unlike causes: unknown */
  CHECK(a.id == 1 && a.cause == -2);
  struct bench_near w0 = near1(-2, MS_CULPRIT_WORKER, 0, 5.0);
  a = *none;
  bench_answer_agree(&a, none, &w0, &n35, p, 2);  /* different workers: none, the lower confidence */
  CHECK(a.cause == -1 && a.id == -1 && a.confidence == 0.7);
  a = *none;
  bench_answer_agree(&a, none, &n4, NULL, p, 2);  /* held by one only */
  CHECK(a.cause == -1);
  struct bench_near n3 = near1(-2, MS_CULPRIT_WORKER, 1, 3.0);
  a = *wrk;
  bench_answer_agree(&a, none, NULL, &n3, p, 2);  /* named by one, held by the other: 0.6 * 3 / 6 */
  CHECK(a.kind == MS_CULPRIT_WORKER && a.id == 1 && a.cause == MS_FAULT_SLOW_WORKER &&
        fabs(a.confidence - 0.3) < 1e-9 && !a.weak);
  a = *none;
  bench_answer_agree(&a, wrk, &n3, NULL, p, 2);  /* the same the other way round */
  CHECKF(a.kind == MS_CULPRIT_WORKER && a.id == 1 && a.cause == MS_FAULT_SLOW_WORKER && fabs(a.confidence - 0.3) < 1e-9,
         "%s %g", a.name, a.confidence);
  a = *cls;
  bench_answer_agree(&a, none, NULL, &n3, p, 2);  /* a class is not held near: none */
  CHECK(a.cause == -1);
  a = *cls;
  bench_answer_agree(&a, none, &n4, &n3, p, 2);  /* nothing named in common, a worker held by both: it */
  CHECK(a.kind == MS_CULPRIT_WORKER && a.id == 1 && a.n_more == 0 && fabs(a.confidence - 0.25) < 1e-9);
  a = *cls;
  bench_answer_agree(&a, wrk, &n4, &w0, p, 2);  /* unlike culprits, unlike workers held: none, 1 - 0.9 */
  CHECK(a.cause == -1 && fabs(a.confidence - 0.1) < 1e-9);
  struct bench_near d4 = near1(-2, MS_CULPRIT_DEVICE, 1, 4.0), w5 = near1(-2, MS_CULPRIT_WORKER, 1, 5.0);
  a = *none;
  bench_answer_agree(&a, none, &d4, &w5, p, 1);  /* a device and its one worker */
  CHECK(a.kind == MS_CULPRIT_DEVICE && a.id == 1 && fabs(a.confidence - 0.5 * 4 / 6) < 1e-9);
  a = *none;
  bench_answer_agree(&a, none, &d4, &w5, p, 2);  /* two workers a device: not the same */
  CHECK(a.cause == -1);
}

/* Answers against the healthy runs before and after the faulty one agree:
 * the culprits both name, at the lower confidence; "none" when they share
 * none, as sure as the surer of them is wrong. */
static void test_answer_agree(void) {
  const char *text = "[{\"name\": \"g\", \"preset\": \"llama-3.2-1b\", \"batch\": 1, \"steps\": 1, \"seed\": 1,"
                     " \"model\": {\"n_layers\": 2}, \"faults\": []}]";
  char err[512];
  struct bench_scenario *s;
  int n;
  CHECKF(parse(text, &s, &n, err, sizeof err) == 0, "%s", err);
  struct ms_model *m = bench_model(&s[0], NULL);
  struct ms_compile_opts co = {.sz = sizeof co, .batch = 1, .tiles_per_op = 4};
  struct ms_plan *p = ms_plan_compile(m, &co, NULL);
  struct bench_answer none = {.cause = -1, .kind = MS_CULPRIT_NONE, .id = -1, .confidence = 0.7};
  struct bench_answer cls = {.cause = MS_FAULT_SLOW_CLASS, .kind = MS_CULPRIT_TASK_CLASS, .id = 3, .confidence = 0.9};
  struct bench_answer wrk = {.cause = MS_FAULT_SLOW_WORKER, .kind = MS_CULPRIT_WORKER, .id = 1, .confidence = 0.6};
  struct bench_answer two = cls;  /* the class and worker 1 */
  two.n_more = 1;
  two.more[0] = (struct bench_culprit){.cause = MS_FAULT_SLOW_WORKER, .kind = MS_CULPRIT_WORKER, .id = 1};
  two.confidence = 0.8;
  struct bench_answer a = cls, b = cls;
  b.confidence = 0.5;
  bench_answer_agree(&a, &b, NULL, NULL, p, 2);
  CHECK(a.cause == MS_FAULT_SLOW_CLASS && a.id == 3 && a.confidence == 0.5);
  a = two;
  bench_answer_agree(&a, &wrk, NULL, NULL, p, 2);  /* only the worker is named by both */
  CHECKF(a.kind == MS_CULPRIT_WORKER && a.id == 1 && a.n_more == 0 && a.confidence == 0.6, "%s", a.name);
  a = cls;
  bench_answer_agree(&a, &none, NULL, NULL, p, 2);  /* the run after shows nothing: none, 1 - 0.9 sure */
  CHECKF(a.cause == -1 && a.id == -1 && fabs(a.confidence - 0.1) < 1e-9 && strstr(a.why, "not against both"), "%s",
         a.why);
  a = none;
  bench_answer_agree(&a, &wrk, NULL, NULL, p, 2);
  CHECK(a.cause == -1 && fabs(a.confidence - 0.4) < 1e-9);
  a = cls;
  bench_answer_agree(&a, &wrk, NULL, NULL, p, 2);  /* different culprits: none, 1 - 0.9 */
  CHECK(a.cause == -1 && fabs(a.confidence - 0.1) < 1e-9);
  a = wrk, b = wrk;  /* a device and its one worker are one scope: worker 1 kept */
  b.kind = MS_CULPRIT_DEVICE;
  bench_answer_agree(&a, &b, NULL, NULL, p, 1);
  CHECK(a.kind == MS_CULPRIT_WORKER && a.id == 1);
  a = wrk;
  bench_answer_agree(&a, &b, NULL, NULL, p, 2);  /* two workers a device: not the same */
  CHECK(a.cause == -1);
  a = none, b = none;
  b.confidence = 0.3;
  bench_answer_agree(&a, &b, NULL, NULL, p, 2);
  CHECK(a.cause == -1 && a.confidence == 0.3);
  test_agree_near(p, &none, &wrk, &cls);
  ms_plan_free(p);
  ms_model_free(m);
  free(s);
}

int main(void) {
  const char *d = getenv("MS_MONITORS");
  snprintf(mon_dir, sizeof mon_dir, "%s", d ? d : "build/monitors");
  test_parse();
  test_generate();
  test_draw();
  test_observe_and_diagnose();
  test_layer_and_class();
  test_device_beside_culprit();
  test_few_workers_by_kernel();
  test_few_workers_aot_share();
  test_late_request_alone();
  test_layer_classes_uneven();
  test_score();
  test_score_several();
  test_calibrate();
  test_calibrate_min_pool();
  test_answer_agree();
  TEST_MAIN_END();
}
