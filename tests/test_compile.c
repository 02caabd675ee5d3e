/* SPDX-License-Identifier: MIT */
/* The compiler: every region-derived dependency is enforced by the plan's events;
 * plans keep their structural promises for every preset and bucket; normalisation
 * inserts empty tasks when a producer feeds several events; the schema is JSON. */
#include <stdlib.h>
#include <string.h>

#include "megascope/plan_ir.h"
#include "graph/graph.h"
#include "test.h"

static struct ms_model *load(const char *preset, enum ms_dtype dt) {
  struct ms_model_config c;
  if (ms_preset_config(preset, dt, &c)) return NULL;
  return ms_model_synth(&c, 1);
}

/* Ancestors of plan task t through events (wait event -> its producers). */
static void ancestors(const struct ms_plan *p, int t, int *stamp, int *stack) {
  int sp = 0;
  stack[sp++] = t;
  while (sp) {
    int u = stack[--sp], ev = p->tasks[u].wait;
    if (ev < 0) continue;
    for (int i = p->trig_off[ev]; i < p->trig_off[ev + 1]; i++) {
      int q = p->trig[i];
      if (stamp[q] == t) continue;
      stamp[q] = t;
      stack[sp++] = q;
    }
  }
}

/* Recomputes the pairwise dependencies from the graph's regions, naively, and
 * checks that the plan orders every producer before its consumer. */
static int edges_enforced(const struct ms_plan *p, const struct ms_model *m, int batch, int tile_rows,
                          long *n_edges) {
  struct ms_graph g;
  if (ms_graph_build(m, batch, 0, tile_rows, 0, &g, NULL)) return 0;
  int *to_plan = malloc(sizeof(int) * (size_t)g.n_tasks);
  int *stamp = malloc(sizeof(int) * (size_t)p->n_tasks);
  int *stack = malloc(sizeof(int) * (size_t)p->n_tasks * 4);
  int ok = g.n_tasks + p->stats.empty_tasks == p->n_tasks;
  for (int t = 0; t < p->n_tasks; t++) {
    stamp[t] = -1;
    if (p->graph_index[t] >= 0) to_plan[p->graph_index[t]] = t;
  }
  *n_edges = 0;
  for (int c = 0; c < g.n_tasks && ok; c++) {
    int pc = to_plan[c];
    ancestors(p, pc, stamp, stack);
    for (int q = 0; q < c && ok; q++) {
      int hit = 0;
      for (int r = 0; r < g.tasks[c].n_reads; r++)
        for (int w = 0; w < g.tasks[q].n_writes; w++)
          hit |= ms_region_overlap(&g.tasks[c].reads[r], &g.tasks[q].writes[w]);
      if (!hit) continue;
      (*n_edges)++;
      if (stamp[to_plan[q]] != pc) {
        fprintf(stderr, "edge %d -> %d not enforced\n", q, c);
        ok = 0;
      }
    }
  }
  free(to_plan);
  free(stamp);
  free(stack);
  ms_graph_free(&g);
  return ok;
}

static void test_presets(void) {
  const char *presets[] = {"tiny", "tiny-qwen3", "tiny-moe", "tiny-qwen2", "tiny-gemma3"};
  for (size_t i = 0; i < sizeof presets / sizeof *presets; i++) {
    struct ms_model *m = load(presets[i], MS_DTYPE_F32);
    CHECK(m != NULL);
    for (int b = 1; b <= 16 && m; b *= 2) {
      char buf[512] = "";
      struct ms_textbuf log = {buf, sizeof buf, 0, 0};
      struct ms_compile_opts o = {.sz = sizeof o, .batch = b};
      struct ms_plan *p = ms_plan_compile(m, &o, &log);
      CHECKF(p != NULL, "%s batch %d: %s", presets[i], b, buf);
      if (!p) continue;
      CHECK(ms_plan_validate(p, &log) == 0);
      long n = 0;
      CHECKF(edges_enforced(p, m, b, 0, &n), "%s batch %d", presets[i], b);
      CHECK(n == p->stats.pairwise_edges);
      CHECK(p->stats.reduced_edges <= p->stats.pairwise_edges);
      CHECK(p->stats.events < p->stats.pairwise_edges);
      /* attention (and MoE experts) are JIT, everything else AOT */
      for (int t = 0; t < p->n_tasks; t++) {
        int k = p->tasks[t].kernel;
        int jit = k == MS_K_ATTN || k == MS_K_EXPERT_UP || k == MS_K_EXPERT_DOWN;
        CHECK(p->tasks[t].launch == (jit ? MS_LAUNCH_JIT : MS_LAUNCH_AOT));
      }
      ms_plan_free(p);
    }
    ms_model_free(m);
  }
}

static void test_fusion_counts(void) {
  /* tiny, batch 4: every qkv tile waits on one event triggered by the four
   * attn_norm rows; wo waits on one event triggered by every attention task. */
  struct ms_model *m = load("tiny", MS_DTYPE_F32);
  struct ms_compile_opts o = {.sz = sizeof o, .batch = 4};
  struct ms_plan *p = ms_plan_compile(m, &o, NULL);
  CHECK(p != NULL);
  int qkv_ev = -1, wo_ev = -1, consistent = 1;
  for (int t = 0; t < p->n_tasks; t++) {
    const struct ms_task_class *c = &p->classes[p->tasks[t].cls];
    if (!strcmp(c->name, "blk.0.qkv")) {
      if (qkv_ev >= 0 && qkv_ev != p->tasks[t].wait) consistent = 0;
      qkv_ev = p->tasks[t].wait;
    }
    if (!strcmp(c->name, "blk.0.wo")) {
      if (wo_ev >= 0 && wo_ev != p->tasks[t].wait) consistent = 0;
      wo_ev = p->tasks[t].wait;
    }
  }
  CHECK(consistent);
  CHECK(qkv_ev >= 0 && p->events[qkv_ev].needed == 4);
  CHECK(wo_ev >= 0 && p->events[wo_ev].needed == 4 * m->cfg.n_kv_heads);
  CHECK(!strcmp(p->ev_classes[p->events[wo_ev].cls], "attn->wo"));
  ms_plan_free(p);
  ms_model_free(m);
}

static void test_normalisation(void) {
  /* 32-row q/k/v tiles: the tile holding k of both kv heads feeds the rope tasks of
   * both head groups, whose predecessor sets differ, so it would trigger two
   * events; normalisation must put empty tasks behind it. */
  struct ms_model *m = load("tiny", MS_DTYPE_F32);
  struct ms_compile_opts o = {.sz = sizeof o, .batch = 2, .tile_rows = 32};
  char buf[512] = "";
  struct ms_textbuf log = {buf, sizeof buf, 0, 0};
  struct ms_plan *p = ms_plan_compile(m, &o, &log);
  CHECKF(p != NULL, "%s", buf);
  CHECK(p->stats.empty_tasks > 0);
  CHECK(ms_plan_validate(p, &log) == 0);
  long n;
  CHECK(edges_enforced(p, m, 2, 32, &n));
  int fanout_seen = 0;
  for (int e = 0; e < p->n_events; e++) fanout_seen |= strstr(p->ev_classes[p->events[e].cls], "fanout") != NULL;
  CHECK(fanout_seen);
  ms_plan_free(p);
  ms_model_free(m);
}

static void test_validate_rejects(void) {
  struct ms_model *m = load("tiny", MS_DTYPE_F32);
  struct ms_compile_opts o = {.sz = sizeof o, .batch = 1};
  struct ms_plan *p = ms_plan_compile(m, &o, NULL);
  char buf[512] = "";
  struct ms_textbuf log = {buf, sizeof buf, 0, 0};
  int t = p->n_tasks - 1, saved = p->tasks[t].wait;
  p->tasks[t].wait = 0;  /* a task outside the range of the event it waits on */
  CHECK(ms_plan_validate(p, &log) == -MS_E_FORMAT);
  CHECKF(strstr(buf, "outside its range") != NULL, "log: %s", buf);
  p->tasks[t].wait = saved;
  log.len = 0;
  p->events[p->tasks[t].wait].needed++;
  CHECK(ms_plan_validate(p, &log) == -MS_E_FORMAT);
  CHECKF(strstr(buf, "producers") != NULL, "log: %s", buf);
  ms_plan_free(p);
  ms_model_free(m);
}

static void test_schema(void) {
  struct ms_model *m = load("tiny-moe", MS_DTYPE_F32);
  struct ms_compile_opts o = {.sz = sizeof o, .batch = 2};
  struct ms_plan *p = ms_plan_compile(m, &o, NULL);
  char *text = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  CHECK(ms_plan_write_schema(p, f, 0) == 0);
  fclose(f);
  CHECK(strstr(text, "\"schema_version\":1") != NULL);
  for (int c = 0; c < p->n_classes; c++) {
    char key[80];
    snprintf(key, sizeof key, "\"name\":\"%s\"", p->classes[c].name);
    CHECKF(strstr(text, key) != NULL, "class %s missing", p->classes[c].name);
  }
  CHECK(strstr(text, "\"launch\":\"jit\"") != NULL);
  CHECK(strstr(text, "blk.1.expert_up") != NULL);
  free(text);
  ms_plan_free(p);
  ms_model_free(m);
}

/* The class of op in layer l (-1: outside the blocks), or NULL. */
static const struct ms_task_class *class_of(const struct ms_plan *p, const char *op, int l) {
  for (int i = 0; i < p->n_classes; i++)
    if (!strcmp(p->classes[i].op, op) && p->classes[i].layer == l) return &p->classes[i];
  return NULL;
}

/* The CPU backend's tiling on SmolLM2's shapes (bf16): at 1 MiB its LM head
 * cuts into 55 tasks, and with the floor of two into an even count; fused,
 * no norm task is left (a llama has pre-norms only), the three consumers
 * say they norm, and the plan still validates. */
static void test_cpu_tiling(const struct ms_model *m) {
  struct ms_compile_opts plain = {.sz = sizeof plain, .batch = 1, .tile_bytes = 1024 * 1024};
  struct ms_compile_opts cpu = {.sz = sizeof cpu, .batch = 1, .tile_bytes = 1024 * 1024, .min_tiles = 2,
                                .fuse_norm = 1};
  struct ms_plan *a = ms_plan_compile(m, &plain, NULL), *b = ms_plan_compile(m, &cpu, NULL);
  CHECK(a && b);
  if (a && b) {
    const struct ms_task_class *ha = class_of(a, "lm_head", -1), *hb = class_of(b, "lm_head", -1);
    CHECKF(ha && hb && ha->n_tasks % 2 == 1 && hb->n_tasks == ha->n_tasks + 1, "lm_head: %d, then %d tasks",
           ha ? ha->n_tasks : -1, hb ? hb->n_tasks : -1);
    int norms = 0, fused = 0;
    for (int i = 0; i < b->n_classes; i++) {
      const struct ms_task_class *k = &b->classes[i];
      norms += k->kernel == MS_K_RMSNORM;
      fused += k->norm;
      if (k->kernel == MS_K_WO || k->kernel == MS_K_SWIGLU || k->kernel == MS_K_DOWN || k->kernel == MS_K_LM_HEAD)
        CHECKF(k->n_tasks % 2 == 0, "%s: %d tasks", k->name, k->n_tasks);
    }
    CHECK(norms == 0 && fused == 2 * m->cfg.n_layers + 1);
    CHECK(class_of(b, "qkv", 3)->norm && class_of(b, "gate_up", 3)->norm && !class_of(b, "down", 3)->norm);
    CHECK(class_of(a, "attn_norm", 3) && !class_of(b, "attn_norm", 3) && !class_of(a, "qkv", 3)->norm);
    CHECK(ms_plan_validate(b, NULL) == 0);
  }
  ms_plan_free(a);
  ms_plan_free(b);
}

static void test_smollm2_shapes(void) {
  struct ms_model_config c;
  CHECK(ms_preset_config("smollm2-135m", MS_DTYPE_BF16, &c) == 0);
  CHECK(c.n_layers == 30 && c.dim == 576 && c.ffn_dim == 1536 && c.n_heads == 9 && c.n_kv_heads == 3);
  CHECK(c.head_dim == 64 && c.vocab == 49152 && c.tied_embeddings && c.rope_base == 100000.0f);
  CHECK(c.norm_eps == 1e-5f);
  struct ms_model *m = ms_model_synth(&c, 7);
  CHECK(m != NULL);
  struct ms_compile_opts o = {.sz = sizeof o, .batch = 1};
  struct ms_plan *p = ms_plan_compile(m, &o, NULL);
  CHECK(p != NULL);
  if (p) {
    CHECK(p->stats.fused_edges * 4 < p->stats.pairwise_edges);
    CHECK(ms_plan_validate(p, NULL) == 0);
    CHECK(p->classes[p->n_classes - 2].kernel == MS_K_SAMPLE);
  }
  /* bf16 weights: 2 bytes per matrix element, tied lm_head counted once */
  CHECK(ms_model_weight_bytes(m) > 130000000u * 2 / 1 - 20000000u && ms_model_weight_bytes(m) < 140000000u * 2);
  ms_plan_free(p);
  test_cpu_tiling(m);
  ms_model_free(m);
}

int main(void) {
  test_presets();
  test_fusion_counts();
  test_normalisation();
  test_validate_rejects();
  test_schema();
  test_smollm2_shapes();
  TEST_MAIN_END();
}
