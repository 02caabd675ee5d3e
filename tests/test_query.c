/* SPDX-License-Identifier: MIT */
/* The query language: every documented example compiles and verifies on every
 * preset's schema; errors name their column (and the field and hook); answers
 * read from a running engine match what the engine itself counted (tasks,
 * steps, requests), aggregations agree with one another, the JIT and the
 * interpreter give the same maps, full maps count what they drop; program
 * bundles refuse malformed bytes; random programs compile to something the
 * verifier accepts or are refused with a message, never a crash. */
#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "megascope/bpf_jit.h"
#include "megascope/engine.h"
#include "megascope/hook.h"
#include "megascope/model.h"
#include "megascope/attach.h"
#include "megascope/plan.h"
#include "megascope/query.h"
#include "megascope/verifier.h"
#include "live_query.h"
#include "test.h"

static struct ms_model *preset(const char *name) {
  struct ms_model_config c;
  ms_preset_config(name, MS_DTYPE_F32, &c);
  return ms_model_synth(&c, 5);
}

static struct ms_query_schema *schema_of(const struct ms_model *m) {
  struct ms_compile_opts co = {.sz = sizeof co, .batch = 4};
  struct ms_plan *p = ms_plan_compile(m, &co, NULL);
  struct ms_query_schema *s = p ? ms_query_schema_of_plan(p, NULL) : NULL;
  ms_plan_free(p);
  return s;
}

/* Compiles src and verifies its bundle as a monitor; the monitor, or NULL
 * with the reason in log. */
static struct ms_monitor *compile_verify(const char *src, const struct ms_query_schema *s, struct ms_query **qout,
                                         char *log, size_t log_size) {
  struct ms_textbuf tb = {.buf = log, .size = log_size};
  log[0] = 0;
  struct ms_query *q = ms_query_compile(src, s, NULL, &tb);
  if (!q) return NULL;
  void *b = NULL;
  size_t n = 0;
  struct ms_monitor *mon = NULL;
  if (!ms_query_bundle(q, &b, &n)) mon = ms_monitor_open_mem(b, n, "query", &tb);
  free(b);
  if (qout && mon) *qout = q;
  else ms_query_free(q);
  return mon;
}

static const char *const examples[] = {
    "task_end /op == attn && req_gen == 1842/ { @us[tile_z] = hist((t_end - t_begin) / 1000) }",
    "dep_wait /wait_ns > 20us/ { @[event_class] = count() }",
    "task_end { @p99[class] = quantile(t_end - t_begin, 0.99) }",
    "task_end /class =~ \"blk.*.wo\"/ { @[worker] = sum(t_end - t_begin) }",
    "request /phase == finished/ { @[req_slot] = count() }",
    "step { @[batch_size] = count() }",
    "task_begin, task_end /launch_mode == jit/ { @[hook, class] = count() }",
    "dep_wait /wait_reason == step_end/ { @[worker] = count() }",
    "task_ready { @q[event_class] = max(event_count) }",
    "task_end { @lat = lhist((t_end - t_begin) / 1000, 0, 100, 10); @m = min(t_begin - t_ready); @a = avg(wait_ns) }",
    "task_end /tile_y >= 0 && tile_y < 2 || !(tile_z == -1)/ { @[tile_y, tile_z] = count() }",
    "queue_pressure { @[queue_kind] = max(queue_depth) } task_assign { @d = hist(queue_depth) }",
    "request /phase == token/ { @tok[req_slot, req_gen] = count() }",
    "task_end /op == gemv_residual/ { @ns[class] = sum(t_end - t_begin) }  # kernels name ops too",
    "task_end /event_class == \"attn->wo\"/ { @n = count() }",
    "task_end { @x[(task_gen >> 32) % 4, worker] = sum((t_end - t_begin) * 2 - 1 + 0x10) }",
};

static void test_examples_verify(void) {
  static const char *const presets[] = {"tiny", "tiny-moe", "tiny-qwen3"};
  for (size_t p = 0; p < 3; p++) {
    struct ms_model *m = preset(presets[p]);
    struct ms_query_schema *s = schema_of(m);
    CHECK(s != NULL);
    for (size_t i = 0; s && i < sizeof examples / sizeof *examples; i++) {
      char log[8192];
      struct ms_monitor *mon = compile_verify(examples[i], s, NULL, log, sizeof log);
      CHECKF(mon != NULL, "%s on %s: %s", examples[i], presets[p], log);
      ms_monitor_free(mon);
    }
    ms_query_schema_free(s);
    ms_model_free(m);
  }
}

/* Refusals name the column and what is wrong. */
static void test_errors(void) {
  static const struct {
    const char *src, *want;
  } cases[] = {
      {"dep_wait /t_end > 0/ { @ = count() }", "column 11: field 't_end' is not defined for hook 'dep_wait'"},
      {"step { @[class] = count() }", "column 10: field 'class' is not defined for hook 'step'"},
      {"dep_wait { @[x] = count() }", "column 14: 'x' is neither a field of hook 'dep_wait'"},
      {"task_end /class == blk.9.wo/ { @ = count() }", "column 20: 'blk.9.wo' is not a task class (task classes: step_start, embed,"},
      {"task_en { @ = count() }", "column 1: 'task_en' is not a hook"},
      {"task_end { @x = hist() }", "column 22: expected a field, a number or a name, found ')'"},
      {"task_end { @x = count(); @x = sum(1) }", "column 26: @x is a count() map (column 12); it cannot also take sum()"},
      {"task_end { @x = lhist(t_end, 10, 5, 1) }", "lhist needs min < max and step > 0"},
      {"task_end { @x = sum(t_end / 0) }", "column 29: division by zero"},
      {"task_end /class =~ \"nomatch*\"/ { @ = count() }", "column 17: pattern 'nomatch*' matches no task class"},
      {"request /phase == begin/ { @ = count() }", "column 19: 'begin' is not a phase (phases: admitted, first_token, token, finished)"},
      {"task_end /t_end > 0 { @ = count() }", "expected '/' to end the predicate"},
      {"task_end { @ = count() ", "block not closed with '}'"},
      {"task_end { @x = quantile(t_end) }", "quantile(v, q) needs at least one fraction q"},
      {"task_end { @x = quantile(t_end, 1.5) }", "a quantile is a fraction between 0 and 1"},
      {"task_end { @x = count(5) }", "count() takes no argument"},
      {"task_end { @x = frobnicate(t_end) }", "'frobnicate' is not an aggregation"},
      {"task_end { @x = sum(5ys) }", "unknown unit 'ys'"},
      {"task_end { @x = sum(\"abc) }", "string not closed"},
      {"task_end { }", "an empty block"},
      {"", "an empty query"},
      {"task_end { @[class] = count() } task_begin { @[worker] = count() }", "keys of one map mean one thing"},
      {"task_end { @x = sum(t_end ` 2) }", "column 27: unexpected character '`'"},
  };
  struct ms_model *m = preset("tiny");
  struct ms_query_schema *s = schema_of(m);
  for (size_t i = 0; s && i < sizeof cases / sizeof *cases; i++) {
    char log[4096] = "";
    struct ms_textbuf tb = {.buf = log, .size = sizeof log};
    struct ms_query *q = ms_query_compile(cases[i].src, s, NULL, &tb);
    CHECKF(q == NULL && errno == EINVAL, "accepted: %s", cases[i].src);
    CHECKF(strstr(log, cases[i].want) != NULL, "%s\n  want: %s\n  got:  %s", cases[i].src, cases[i].want, log);
    ms_query_free(q);
  }
  ms_query_schema_free(s);
  ms_model_free(m);
}

/* ---- a running engine ---- */

static json_t *map_of(json_t *r, const char *name) {
  size_t i;
  json_t *m;
  json_array_foreach(json_object_get(r, "maps"), i, m) if (!strcmp(json_string_value(json_object_get(m, "name")), name))
      return m;
  return NULL;
}

static double entry_num(json_t *e, const char *k) { return json_number_value(json_object_get(e, k)); }

/* Sum of "value" (or "count") over a map's entries. */
static double map_total(json_t *m, const char *field) {
  double t = 0;
  size_t i;
  json_t *e;
  json_array_foreach(json_object_get(m, "entries"), i, e) t += entry_num(e, field);
  return t;
}

static void decode(struct ms_engine *e, int n, int tokens) {
  struct ms_request *r[8];
  for (int i = 0; i < n; i++) {
    int32_t p[3] = {3 + i, 7, 11};
    struct ms_request_opts ro = {.sz = sizeof ro, .prompt = p, .n_prompt = 1 + i % 3, .max_new_tokens = tokens};
    r[i] = ms_engine_submit(e, &ro);
  }
  for (int i = 0; i < n; i++)
    if (r[i]) {
      ms_request_wait(r[i], -1);
      ms_request_free(r[i]);
    }
}

static void test_known_answers(void) {
  struct ms_model *m = preset("tiny");
  struct ms_engine_opts o = {.sz = sizeof o, .n_workers = 3, .max_batch = 4, .max_ctx = 256};
  struct ms_engine *e = ms_engine_new(m, &o, NULL);
  struct ms_query_schema *s = e ? engine_schema(e) : NULL;  /* the CPU's plans fuse the norms */
  struct live cls, attn, steps, fin, stats, wo, waited_dep, waited_begin, interp, drops, tiles;
  CHECK(attach_query(e, s, "task_end { @[class] = count() }", 0, 0, &cls) > 0);
  CHECK(attach_query(e, s, "task_end { @[class] = count() }", 1, 0, &interp) > 0);
  CHECK(attach_query(e, s, "task_end /op == attn/ { @n = count() }", 0, 0, &attn) > 0);
  CHECK(attach_query(e, s, "step /phase == end/ { @ = count() }", 0, 0, &steps) > 0);
  CHECK(attach_query(e, s, "request /phase == finished/ { @[req_slot, req_gen] = count() }", 0, 0, &fin) > 0);
  CHECK(attach_query(e, s,
                     "task_end { @h = hist(t_end - t_begin); @q = quantile(t_end - t_begin, 0.5, 0.9); "
                     "@lo = min(t_end - t_begin); @hi = max(t_end - t_begin); @avg = avg(t_end - t_begin) }",
                     0, 0, &stats) > 0);
  CHECK(attach_query(e, s, "task_end /class =~ \"blk.*.wo\"/ { @[worker] = count() }", 0, 0, &wo) > 0);
  CHECK(attach_query(e, s, "dep_wait /wait_ns > 0/ { @ = count() }", 0, 0, &waited_dep) > 0);
  CHECK(attach_query(e, s, "task_begin /wait_ns > 0/ { @ = count() }", 0, 0, &waited_begin) > 0);
  CHECK(attach_query(e, s, "task_end { @[task_index] = count() }", 0, 4, &drops) > 0);
  CHECK(attach_query(e, s, "task_end { @t = lhist(tile_y, -1, 4, 1) }", 0, 0, &tiles) > 0);
  decode(e, 4, 24);
  struct ms_engine_stats st;
  ms_engine_get_stats(e, &st);
  json_t *r_cls = readout(e, &cls), *r_int = readout(e, &interp), *r_attn = readout(e, &attn),
         *r_steps = readout(e, &steps), *r_fin = readout(e, &fin), *r_stats = readout(e, &stats),
         *r_wo = readout(e, &wo), *r_wd = readout(e, &waited_dep), *r_wb = readout(e, &waited_begin),
         *r_drop = readout(e, &drops), *r_tiles = readout(e, &tiles);
  CHECK(r_cls && r_int && r_attn && r_steps && r_fin && r_stats && r_wo && r_wd && r_wb && r_drop && r_tiles);
  if (!(r_cls && r_int && r_attn && r_steps && r_fin && r_stats && r_wo && r_wd && r_wb && r_drop && r_tiles))
    goto out;
  /* every task ended once, every step ended once, every request finished once */
  double tasks = map_total(map_of(r_cls, "@"), "value");
  CHECKF(tasks == (double)st.tasks, "tasks %.0f, engine %llu", tasks, (unsigned long long)st.tasks);
  CHECK(map_total(map_of(r_steps, "@"), "value") == (double)st.steps);
  CHECK(map_total(map_of(r_fin, "@"), "value") == 4);
  CHECK(json_array_size(json_object_get(map_of(r_fin, "@"), "entries")) == 4);
  /* coverage: attached before the first step, nothing throttled or lost */
  json_t *cov = json_object_get(r_cls, "coverage");
  CHECK(entry_num(cov, "eligible") == (double)st.tasks && entry_num(cov, "executed") == (double)st.tasks);
  CHECK(entry_num(cov, "throttled") == 0 && entry_num(cov, "failed") == 0 && entry_num(r_cls, "dropped") == 0);
  /* the interpreter and the JIT: the same answer */
  char *a = json_dumps(json_object_get(map_of(r_cls, "@"), "entries"), JSON_SORT_KEYS);
  char *b = json_dumps(json_object_get(map_of(r_int, "@"), "entries"), JSON_SORT_KEYS);
  CHECK(a && b && !strcmp(a, b));
  free(a);
  free(b);
  /* op == attn counts the attention classes' tasks; blk.*.wo the wo classes' */
  double attn_tasks = 0, wo_tasks = 0;
  size_t i;
  json_t *en;
  json_array_foreach(json_object_get(map_of(r_cls, "@"), "entries"), i, en) {
    const char *name = json_string_value(json_array_get(json_object_get(en, "key"), 0));
    size_t nl = strlen(name);
    if (nl > 5 && !strcmp(name + nl - 5, ".attn")) attn_tasks += entry_num(en, "value");
    if (nl > 3 && !strcmp(name + nl - 3, ".wo")) wo_tasks += entry_num(en, "value");
  }
  CHECK(attn_tasks > 0 && map_total(map_of(r_attn, "@n"), "value") == attn_tasks);
  CHECK(wo_tasks > 0 && map_total(map_of(r_wo, "@"), "value") == wo_tasks);
  /* a dependency wait seen when it ends is a task that began after waiting */
  CHECK(map_total(map_of(r_wd, "@"), "value") == map_total(map_of(r_wb, "@"), "value"));
  /* the aggregations of one value agree with one another */
  json_t *h = json_array_get(json_object_get(map_of(r_stats, "@h"), "entries"), 0);
  json_t *q = json_array_get(json_object_get(map_of(r_stats, "@q"), "entries"), 0);
  json_t *lo = json_array_get(json_object_get(map_of(r_stats, "@lo"), "entries"), 0);
  json_t *hi = json_array_get(json_object_get(map_of(r_stats, "@hi"), "entries"), 0);
  json_t *av = json_array_get(json_object_get(map_of(r_stats, "@avg"), "entries"), 0);
  CHECK(h && q && lo && hi && av);
  if (h && q && lo && hi && av) {
    CHECK(entry_num(h, "count") == (double)st.tasks && entry_num(q, "count") == (double)st.tasks);
    CHECK(entry_num(lo, "count") == (double)st.tasks && entry_num(av, "count") == (double)st.tasks);
    double p50 = entry_num(json_array_get(json_object_get(q, "quantiles"), 0), "value");
    double p90 = entry_num(json_array_get(json_object_get(q, "quantiles"), 1), "value");
    double vmin = entry_num(lo, "value"), vmax = entry_num(hi, "value"), mean = entry_num(av, "value");
    CHECKF(vmin * 0.96 <= p50 && p50 <= p90 && p90 <= vmax * 1.04, "min %g p50 %g p90 %g max %g", vmin, p50, p90,
           vmax);
    CHECK(vmin <= mean && mean <= vmax);
    double m2 = entry_num(av, "sum") / entry_num(av, "count");
    CHECK(m2 > mean * (1 - 1e-6) && m2 < mean * (1 + 1e-6));
  }
  /* a full map keeps max_keys keys and counts every update it could not place */
  json_t *dm = map_of(r_drop, "@");
  CHECK(json_integer_value(json_object_get(dm, "total_keys")) == 4);
  CHECKF(map_total(dm, "value") + entry_num(r_drop, "dropped") == (double)st.tasks, "kept %.0f dropped %.0f tasks %llu",
         map_total(dm, "value"), entry_num(r_drop, "dropped"), (unsigned long long)st.tasks);
  CHECK(entry_num(r_drop, "dropped") > 0);
  /* lhist over a signed field: -1 (all rows) lands in its own bucket, nothing outside */
  json_t *t = json_array_get(json_object_get(map_of(r_tiles, "@t"), "entries"), 0);
  CHECK(t && entry_num(t, "count") == (double)st.tasks);
  json_t *b0 = t ? json_array_get(json_object_get(t, "buckets"), 0) : NULL;
  CHECK(b0 && json_integer_value(json_object_get(b0, "lo")) == -1 && json_integer_value(json_object_get(b0, "hi")) == 0);
out:
  json_decref(r_cls), json_decref(r_int), json_decref(r_attn), json_decref(r_steps), json_decref(r_fin);
  json_decref(r_stats), json_decref(r_wo), json_decref(r_wd), json_decref(r_wb), json_decref(r_drop);
  json_decref(r_tiles);
  struct live *all[] = {&cls, &attn, &steps, &fin, &stats, &wo, &waited_dep, &waited_begin, &interp, &drops, &tiles};
  for (size_t k = 0; k < sizeof all / sizeof *all; k++) {
    ms_engine_detach(e, all[k]->id);
    ms_query_free(all[k]->q);
  }
  ms_engine_free(e);
  ms_query_schema_free(s);
  ms_model_free(m);
}

/* ---- bundles ---- */

static void test_bundle_refusals(void) {
  struct ms_model *m = preset("tiny");
  struct ms_query_schema *s = schema_of(m);
  struct ms_query *q = ms_query_compile("task_end { @[class] = hist(t_end - t_begin) }", s, NULL, NULL);
  CHECK(q != NULL);
  void *b = NULL;
  size_t n = 0;
  CHECK(q && ms_query_bundle(q, &b, &n) == 0);
  char log[2048];
  struct ms_textbuf tb = {.buf = log, .size = sizeof log};
  struct ms_bpf_object *o = ms_bpf_object_open_mem(b, n, "q", &tb);
  CHECK(o && ms_bpf_object_prog_count(o) == 1 && ms_bpf_object_map_count(o) == 3);
  size_t abi_n = 0;
  const void *abi = o ? ms_bpf_object_section(o, "megascope_abi", &abi_n) : NULL;
  CHECK(abi && abi_n == 4 && *(const uint32_t *)abi == MS_HOOK_ABI_VERSION);
  /* the schema's task class digest rides along; no event class digest: it reads no event_class */
  uint64_t want[2], got[2] = {0, 0};
  ms_query_schema_digest(s, want);
  size_t sch_n = 0;
  const uint8_t *sch = o ? ms_bpf_object_section(o, "megascope_schema", &sch_n) : NULL;
  if (sch && sch_n == 16) memcpy(got, sch, 16);
  CHECKF(sch && got[0] == want[0] && got[0] && got[1] == 0, "schema section %zu bytes: %016llx %016llx",
         sch_n, (unsigned long long)got[0], (unsigned long long)got[1]);
  ms_bpf_object_free(o);
  /* format 1 (no digests) still loads, and carries none */
  uint8_t *v1 = b ? malloc(n) : NULL;
  if (v1) {
    memcpy(v1, b, 24), memcpy(v1 + 24, (const uint8_t *)b + 40, n - 40);
    v1[8] = 1;
    log[0] = 0, tb.len = 0;
    o = ms_bpf_object_open_mem(v1, n - 16, "q", &tb);
    CHECKF(o && !ms_bpf_object_section(o, "megascope_schema", NULL), "format 1: %s", log);
    ms_bpf_object_free(o);
    free(v1);
  }
  /* a program that reads event_class vouches for the event class ids too */
  struct ms_query *qe = ms_query_compile("dep_wait { @[event_class] = count() }", s, NULL, NULL);
  void *be = NULL;
  size_t ne = 0;
  CHECK(qe && ms_query_bundle(qe, &be, &ne) == 0);
  o = be ? ms_bpf_object_open_mem(be, ne, "q", &tb) : NULL;
  sch = o ? ms_bpf_object_section(o, "megascope_schema", &sch_n) : NULL;
  memset(got, 0, sizeof got);
  if (sch && sch_n == 16) memcpy(got, sch, 16);
  CHECKF(got[0] == want[0] && got[1] == want[1] && got[1], "event_class: %016llx %016llx",
         (unsigned long long)got[0], (unsigned long long)got[1]);
  ms_bpf_object_free(o);
  free(be);
  ms_query_free(qe);
  /* truncated anywhere: refused with a message */
  for (size_t cut = 0; b && cut < n; cut += cut < 200 ? 1 : 97) {
    log[0] = 0, tb.len = 0;
    o = ms_bpf_object_open_mem(b, cut, "q", &tb);
    CHECKF(o == NULL && log[0], "a bundle cut at %zu of %zu", cut, n);
    ms_bpf_object_free(o);
  }
  /* a newer format, too many maps, an unterminated name, trailing bytes */
  uint8_t *c = malloc(n + 8);
  static const struct {
    size_t at;
    uint8_t v;
    const char *want;
  } flips[] = {{8, 3, "format 3"}, {16, 200, "maps, at most"}, {40 + 63, 'x', "not terminated"},
               {40, 0, "name empty"}};
  for (size_t i = 0; c && b && i < sizeof flips / sizeof *flips; i++) {
    memcpy(c, b, n);
    if (flips[i].at == 40 + 63) memset(c + 40, 'x', 64);
    else c[flips[i].at] = flips[i].v;
    log[0] = 0, tb.len = 0;
    o = ms_bpf_object_open_mem(c, n, "q", &tb);
    CHECKF(o == NULL && strstr(log, flips[i].want), "flip %zu: %s", i, log);
    ms_bpf_object_free(o);
  }
  if (c && b) {
    memcpy(c, b, n);
    memset(c + n, 0, 8);
    log[0] = 0, tb.len = 0;
    o = ms_bpf_object_open_mem(c, n + 8, "q", &tb);
    CHECKF(o == NULL && strstr(log, "8 bytes after the last program"), "%s", log);
    ms_bpf_object_free(o);
  }
  /* any byte changed: loaded and verified, or refused with a message; never a crash */
  srand(7);
  for (int it = 0; c && b && it < 3000; it++) {
    memcpy(c, b, n);
    for (int k = 0; k < 1 + it % 4; k++) c[(size_t)rand() % n] = (uint8_t)rand();
    log[0] = 0, tb.len = 0;
    struct ms_monitor *mon = ms_monitor_open_mem(c, n, "q", &tb);
    if (!mon) CHECK(log[0] != 0);
    ms_monitor_free(mon);
  }
  free(c);
  free(b);
  ms_query_free(q);
  ms_query_schema_free(s);
  ms_model_free(m);
}

static int interp_jit_agree(const struct ms_query *q, unsigned seed);

/* ---- random programs ---- */

static unsigned rng_state = 12345;
static unsigned rnd(unsigned n) {
  rng_state = rng_state * 1103515245u + 12345u;
  return (rng_state >> 16) % n;
}

static const char *const fields[] = {"class", "op", "worker", "step", "t_end", "t_begin", "wait_ns", "tile_y",
                                     "tile_z", "req_slot", "phase", "event_class", "queue_depth", "hook", "launch_mode"};
static const char *const names[] = {"attn", "blk.0.wo", "\"attn->wo\"", "finished", "jit", "end", "dependency", "zz"};

static void gen_expr(char *out, size_t size, int depth) {
  size_t len = strlen(out);
  static const char *const ops[] = {"+", "-", "*", "/", "%", "==", "!=", "<", ">=", "&&", "||", "&", "|", ">>"};
  switch (depth > 3 ? rnd(3) : rnd(6)) {
  case 0: snprintf(out + len, size - len, "%s", fields[rnd(sizeof fields / sizeof *fields)]); break;
  case 1: snprintf(out + len, size - len, "%u%s", rnd(5000), rnd(4) ? "" : "us"); break;
  case 2: snprintf(out + len, size - len, "%s", names[rnd(sizeof names / sizeof *names)]); break;
  case 3:
    snprintf(out + len, size - len, "(");
    gen_expr(out, size, depth + 1);
    len = strlen(out);
    snprintf(out + len, size - len, " %s ", ops[rnd(sizeof ops / sizeof *ops)]);
    gen_expr(out, size, depth + 1);
    len = strlen(out);
    snprintf(out + len, size - len, ")");
    break;
  case 4:
    snprintf(out + len, size - len, "%s", rnd(2) ? "!" : "-");
    gen_expr(out, size, depth + 1);
    break;
  default:
    snprintf(out + len, size - len, "class =~ \"%s\"", rnd(2) ? "blk.*" : "*norm");
    break;
  }
}

static void test_random_programs(void) {
  static const char *const hooks[] = {"task_end", "task_begin", "dep_wait", "step", "request", "task_ready",
                                      "queue_pressure", "dep_release"};
  static const char *const aggs[] = {"count()", "sum(E)", "min(E)", "max(E)", "avg(E)", "hist(E)",
                                     "lhist(E, 0, 50, 5)", "quantile(E, 0.5)"};
  struct ms_model *m = preset("tiny-moe");
  struct ms_query_schema *s = schema_of(m);
  int compiled = 0, refused = 0;
  for (int it = 0; s && it < 1500; it++) {
    char src[2048] = "", e1[512] = "", e2[512] = "";
    gen_expr(e1, sizeof e1, 0);
    gen_expr(e2, sizeof e2, 1);
    const char *agg = aggs[rnd(sizeof aggs / sizeof *aggs)];
    char a[600];
    const char *E = strstr(agg, "E");
    snprintf(a, sizeof a, "%.*s%s%s", E ? (int)(E - agg) : (int)strlen(agg), agg, E ? e2 : "", E ? E + 1 : "");
    snprintf(src, sizeof src, "%s %s%s%s { @m%u[%s] = %s }", hooks[rnd(sizeof hooks / sizeof *hooks)],
             rnd(2) ? "/" : "", "", "", rnd(3), fields[rnd(sizeof fields / sizeof *fields)], a);
    if (strchr(src, '/')) { /* a predicate */
      char *slash = strchr(src, '/');
      char rest[2048];
      snprintf(rest, sizeof rest, "%s", slash + 1);
      snprintf(slash, sizeof src - (size_t)(slash - src), "/%s/ %s", e1, rest);
    }
    /* and now and then a byte of it changed */
    if (rnd(4) == 0) src[rnd((unsigned)strlen(src))] = "{}()/@[],;=!\"x9 "[rnd(16)];
    char log[8192];
    struct ms_textbuf tb = {.buf = log, .size = sizeof log};
    log[0] = 0;
    struct ms_query *q = ms_query_compile(src, s, NULL, &tb);
    if (!q) {
      refused++;
      CHECKF(strncmp(log, "column ", 7) == 0, "refused without a column: %s -> %s", src, log);
      continue;
    }
    void *b = NULL;
    size_t n = 0;
    CHECK(ms_query_bundle(q, &b, &n) == 0);
    tb.len = 0;
    log[0] = 0;
    struct ms_monitor *mon = ms_monitor_open_mem(b, n, "q", &tb);
    CHECKF(mon != NULL, "compiled but not verified: %s\n%s", src, log);
    compiled += mon != NULL;
    if (mon && ms_bpf_jit_supported()) CHECKF(interp_jit_agree(q, (unsigned)it), "interpreter and JIT differ: %s", src);
    ms_monitor_free(mon);
    free(b);
    ms_query_free(q);
  }
  printf("random programs: %d compiled and verified, %d refused with a message\n", compiled, refused);
  CHECK(compiled > 100 && refused > 100);
  ms_query_schema_free(s);
  ms_model_free(m);
}

/* ---- the interpreter and the JIT agree on generated code ---- */

struct dump {
  char *buf;
  size_t len;
  FILE *f;
  const struct ms_bpf_map_def *def;
};

/* An entry whole: its key and every byte of its value (one worker's slot:
 * the maps here are made for one worker). */
static int dump_entry(void *user, const void *key, const void *values) {
  struct dump *d = user;
  fwrite(key, 1, d->def->key_size, d->f);
  fwrite(values, 1, d->def->value_size, d->f);
  return 0;
}

static int dump_record(void *user, const void *data, uint32_t size) {
  fwrite(data, 1, size, ((struct dump *)user)->f);
  return 0;
}

/* Every map's contents as bytes (entries in the order the map keeps them). */
static char *maps_bytes(struct ms_bpf_map **maps, size_t n, size_t *len) {
  struct dump d = {0};
  d.f = open_memstream(&d.buf, &d.len);
  for (size_t i = 0; i < n; i++) {
    const struct ms_bpf_map_def *def = ms_bpf_map_info(maps[i]);
    d.def = def;
    if (def->type == MS_BPF_MAP_RINGBUF) ms_bpf_ringbuf_consume(maps[i], dump_record, &d);
    else ms_bpf_map_foreach(maps[i], dump_entry, &d);
    fputc('|', d.f);
  }
  fclose(d.f);
  *len = d.len;
  return d.buf;
}

static void random_ctx(struct ms_hook_ctx *c, int hook, unsigned *seed) {
  memset(c, 0, sizeof *c);
  c->abi_version = MS_HOOK_ABI_VERSION;
  c->hook = (uint32_t)hook;
  c->worker = 0;
  c->step = (uint64_t)(rand_r(seed) % 64);
  c->batch_size = 1 + (uint32_t)(rand_r(seed) % 8);
  c->task_class = (uint32_t)(rand_r(seed) % 24);
  c->op = (uint32_t)(rand_r(seed) % 16);
  c->tile_y = rand_r(seed) % 5 - 1;
  c->tile_z = rand_r(seed) % 4 - 1;
  c->req_slot = (uint32_t)(rand_r(seed) % 8);
  c->t_ready = 1000 + (uint64_t)(rand_r(seed) % 100000);
  c->t_begin = c->t_ready + (uint64_t)(rand_r(seed) % 50000);
  c->t_end = c->t_begin + (uint64_t)(rand_r(seed) % (rand_r(seed) % 3 ? 20000 : 5000000));
  c->wait_ns = rand_r(seed) % 2 ? (uint64_t)(rand_r(seed) % 30000) : 0;
  c->event_class = (uint32_t)(rand_r(seed) % 14);
  c->phase = (uint32_t)(rand_r(seed) % 4);
  c->queue_depth = (uint32_t)(rand_r(seed) % 100);
  c->event_count = (uint64_t)(rand_r(seed) % 10);
}

/* Runs every program of q on the same random contexts with the interpreter
 * and with the JIT, each over maps of its own: same r0, same maps. */
static int interp_jit_agree(const struct ms_query *q, unsigned seed) {
  size_t nm = ms_query_map_count(q);
  struct ms_bpf_map *a[MS_BPF_MAX_MAPS], *b[MS_BPF_MAX_MAPS];
  for (size_t i = 0; i < nm; i++) {
    a[i] = ms_bpf_map_new(ms_query_map(q, i), 1, NULL);
    b[i] = ms_bpf_map_new(ms_query_map(q, i), 1, NULL);
  }
  int ok = 1;
  for (size_t p = 0; p < ms_query_prog_count(q) && ok; p++) {
    size_t n;
    const char *sec;
    const struct ms_bpf_insn *in = ms_query_prog(q, p, &n, &sec);
    int hook = ms_hook_parse(strrchr(sec, '/') + 1);
    struct ms_bpf_prog_opts po = {.sz = sizeof po, .section = sec, .maps = ms_query_map(q, 0), .n_maps = nm};
    struct ms_bpf_map_def defs[MS_BPF_MAX_MAPS];
    for (size_t i = 0; i < nm; i++) defs[i] = *ms_query_map(q, i);
    po.maps = defs;
    struct ms_bpf_prog *prog = ms_bpf_prog_new(in, n, &po);
    struct ms_verify_opts vo = {.sz = sizeof vo, .kind = MS_VERIFY_HOOK, .prog_type = MS_PROG_OBSERVE,
                                .hook = hook, .helpers = ms_monitor_helpers(),
                                .ctx = ms_hook_verify_ctx(MS_PROG_OBSERVE, hook)};
    struct ms_bpf_jit_opts jo = {.sz = sizeof jo, .verify = &vo, .helpers = ms_monitor_helpers(), .maps = b,
                                 .n_maps = nm};
    struct ms_bpf_jit *j = prog ? ms_bpf_jit_new(prog, &jo) : NULL;
    if (!j) ok = 0;
    for (int r = 0; ok && r < 300; r++) {
      struct ms_hook_ctx ctx;
      random_ctx(&ctx, hook, &seed);
      struct ms_bpf_run_opts ra = {.sz = sizeof ra, .helpers = ms_monitor_helpers(), .maps = a, .n_maps = nm,
                                   .ctx = &ctx, .ctx_size = sizeof ctx};
      struct ms_bpf_run_opts rb = ra;
      rb.maps = b;
      struct ms_bpf_run_result x, y;
      int ex = ms_bpf_run(prog, &ra, &x), ey = ms_bpf_jit_run(j, &rb, &y);
      if (ex != ey || x.r0 != y.r0 || x.insns != y.insns) ok = 0;
    }
    ms_bpf_jit_free(j);
    ms_bpf_prog_free(prog);
  }
  size_t la, lb;
  char *da = maps_bytes(a, nm, &la), *db = maps_bytes(b, nm, &lb);
  if (la != lb || memcmp(da, db, la)) ok = 0;
  free(da);
  free(db);
  for (size_t i = 0; i < nm; i++) {
    ms_bpf_map_free(a[i]);
    ms_bpf_map_free(b[i]);
  }
  return ok;
}

static void test_interp_jit(void) {
  if (!ms_bpf_jit_supported()) {
    SKIP_PART("no JIT on this host: interpreter/JIT agreement not checked");
    return;
  }
  struct ms_model *m = preset("tiny");
  struct ms_query_schema *s = schema_of(m);
  static const char *const more[] = {
      "task_end { @ev = record(class, t_end - t_begin, tile_y, -tile_z, wait_ns % 7) }",
      "task_end { @m[tile_y] = min(tile_y * 3 - 1); @x[tile_y] = max(-(t_end - t_begin)) }",
      "task_end /(t_end - t_begin) > 4us || tile_y < 0/ { @l = lhist(tile_y, -1, 3, 1); @h = hist(wait_ns) }",
  };
  for (size_t i = 0; s && i < sizeof examples / sizeof *examples + 3; i++) {
    const char *src = i < sizeof examples / sizeof *examples ? examples[i] : more[i - sizeof examples / sizeof *examples];
    struct ms_query *q = ms_query_compile(src, s, NULL, NULL);
    CHECKF(q && interp_jit_agree(q, 17 + (unsigned)i), "interpreter and JIT differ on %s", src);
    ms_query_free(q);
  }
  ms_query_schema_free(s);
  ms_model_free(m);
}

/* ---- the trigger ---- */

static void test_trigger(void) {
  struct ms_model *m = preset("tiny");
  struct ms_query_schema *s = schema_of(m);
  char log[4096];
  struct ms_textbuf tb = {.buf = log, .size = sizeof log};
  const char *src = "task_end { @n[class] = count() } when @n >= 3 capture 5:\n"
                    "  task_end /class == $top/ { @ev = record(class, task_index) }";
  struct ms_query *q = ms_query_compile(src, s, NULL, &tb);
  CHECKF(q != NULL, "%s", log);
  struct ms_query_trigger t;
  if (q) ms_query_get_trigger(q, &t);
  CHECK(q && t.has && !strcmp(t.map, "@n") && !strcmp(t.op, ">=") && t.threshold == 3 && t.capture == 5);
  CHECK(q && ms_query_prog_count(q) == 1); /* the capture part is not in the summary */
  /* the summary's maps filled by hand: class 9 has 4, class 3 has 2 */
  size_t nm = q ? ms_query_map_count(q) : 0;
  struct ms_bpf_map *maps[MS_BPF_MAX_MAPS];
  for (size_t i = 0; i < nm; i++) maps[i] = ms_bpf_map_new(ms_query_map(q, i), 2, NULL);
  struct ms_query_maps src_maps;
  ms_query_maps_of_engine(&src_maps, maps);
  uint64_t value = 0;
  char top[2][128];
  if (q) {
    uint64_t k = 3, v = 2;
    ms_bpf_map_update(maps[0], &k, &v, MS_BPF_ANY, 0);
    CHECK(ms_query_trigger_check(q, &src_maps, &value, top) == 0); /* 2 < 3 */
    k = 9, v = 3;
    ms_bpf_map_update(maps[0], &k, &v, MS_BPF_ANY, 1);
    v = 1;
    ms_bpf_map_update(maps[0], &k, &v, MS_BPF_ANY, 0); /* the workers add up to 4 */
    CHECK(ms_query_trigger_check(q, &src_maps, &value, top) == 1 && value == 4);
    CHECKF(!strcmp(top[0], "\"blk.0.down\"") && top[1][0] == 0, "top %s", top[0]);
    tb.len = 0;
    struct ms_query *c = ms_query_compile_capture(q, top, NULL, &tb);
    CHECKF(c != NULL, "%s", log);
    CHECK(c && ms_query_record_bytes(c) == 2 * 8 + 8);
    /* the capture part tests class == 9 */
    if (c) {
      struct ms_bpf_map *cm[MS_BPF_MAX_MAPS];
      size_t cn = ms_query_map_count(c);
      for (size_t i = 0; i < cn; i++) cm[i] = ms_bpf_map_new(ms_query_map(c, i), 1, NULL);
      size_t n;
      const struct ms_bpf_insn *in = ms_query_prog(c, 0, &n, NULL);
      struct ms_bpf_map_def defs[MS_BPF_MAX_MAPS];
      for (size_t i = 0; i < cn; i++) defs[i] = *ms_query_map(c, i);
      struct ms_bpf_prog_opts po = {.sz = sizeof po, .maps = defs, .n_maps = cn};
      struct ms_bpf_prog *p = ms_bpf_prog_new(in, n, &po);
      for (uint32_t cls = 0; p && cls < 20; cls++) {
        struct ms_hook_ctx ctx = {.hook = MS_HOOK_TASK_END, .task_class = cls, .task_index = 100 + cls};
        struct ms_bpf_run_opts ro = {.sz = sizeof ro, .helpers = ms_monitor_helpers(), .maps = cm, .n_maps = cn,
                                     .ctx = &ctx, .ctx_size = sizeof ctx};
        struct ms_bpf_run_result res;
        CHECK(ms_bpf_run(p, &ro, &res) == 0);
      }
      struct ms_query_maps cs;
      ms_query_maps_of_engine(&cs, cm);
      char *text = NULL;
      size_t len = 0;
      FILE *f = open_memstream(&text, &len);
      struct ms_query_print pr = {.sz = sizeof pr, .as_json = 1};
      ms_query_write(c, &cs, NULL, &pr, f);
      fclose(f);
      CHECKF(text && strstr(text, "\"total_records\":1,") && strstr(text, "\"records\":[[9,109]]"), "%s", text);
      free(text);
      ms_bpf_prog_free(p);
      for (size_t i = 0; i < cn; i++) ms_bpf_map_free(cm[i]);
    }
    ms_query_free(c);
  }
  for (size_t i = 0; i < nm; i++) ms_bpf_map_free(maps[i]);
  ms_query_free(q);
  /* refusals: the capture part is compiled (with a stand-in $top) before anything runs */
  static const struct {
    const char *src, *want;
  } bad[] = {
      {"task_end { @n[class] = count() } when @m > 3: task_end { @ = count() }", "column 39: 'when' watches @m"},
      {"when @n > 3: task_end { @ = count() }", "column 1: 'when' follows the probes"},
      {"task_end { @n[class] = count() } when @n > 3 capture 5: step { @[class] = count() }",
       "column 66: field 'class' is not defined for hook 'step'"},
      {"task_end /class == $top/ { @ = count() }", "column 20: $top is bound only in a capture part"},
      {"task_end { @n[class] = count() } when @n > 3: task_end /class == $bottom/ { @ = count() }",
       "unknown variable '$bottom'"},
      {"task_end { @n[class] = count() } when @n 3: task_end { @ = count() }", "expected a comparison after @n"},
      {"task_end { @n[class] = count() } when @n > 3 task_end { @ = count() }", "expected ':'"},
      {"task_end { @n[class] = count() } when @n > 3:", "an empty capture part"},
      {"task_end { @e[class] = record(t_end) }", "record() takes no keys"},
      {"task_end { @e = record(t_end); @e = record(t_end, t_begin) }", "@e records 1 values"},
  };
  for (size_t i = 0; s && i < sizeof bad / sizeof *bad; i++) {
    log[0] = 0, tb.len = 0;
    struct ms_query *x = ms_query_compile(bad[i].src, s, NULL, &tb);
    CHECKF(x == NULL && strstr(log, bad[i].want), "%s\n  want: %s\n  got:  %s", bad[i].src, bad[i].want, log);
    ms_query_free(x);
  }
  ms_query_schema_free(s);
  ms_model_free(m);
}

/* The fuzzer's corpus (the .q files of tests/fuzz/query: the documented examples and any
 * reproducer kept after a fix), replayed against the schema it fuzzes with. */
static void test_fuzz_corpus(void) {
  const char *root = getenv("MS_SRC");
  char dir[4096], path[4400];
  snprintf(dir, sizeof dir, "%s/tests/fuzz/query", root ? root : ".");
  snprintf(path, sizeof path, "%s/schema.json", dir);
  size_t len = 0;
  char *text = ms_test_slurp(path, &len);
  struct ms_query_schema *s = text ? ms_query_schema_parse(text, len, NULL) : NULL;
  free(text);
  CHECKF(s != NULL, "%s", path);
  DIR *d = s ? opendir(dir) : NULL;
  int n = 0;
  for (struct dirent *de; d && (de = readdir(d));) {
    size_t nl = strlen(de->d_name);
    if (nl < 3 || strcmp(de->d_name + nl - 2, ".q")) continue;
    snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
    char *src = ms_test_slurp(path, &len);
    char log[8192] = "";
    struct ms_monitor *mon = src ? compile_verify(src, s, NULL, log, sizeof log) : NULL;
    CHECKF(mon || !strncmp(log, "column ", 7), "%s: %s", de->d_name, log);
    ms_monitor_free(mon);
    free(src);
    n++;
  }
  if (d) closedir(d);
  CHECK(n >= 16);
  ms_query_schema_free(s);
}

static void test_durations(void) {
  uint64_t v = 0;
  CHECK(ms_query_parse_duration("2s", &v) == 0 && v == 2000000000ull);
  CHECK(ms_query_parse_duration("250ms", &v) == 0 && v == 250000000ull);
  CHECK(ms_query_parse_duration("1.5", &v) == 0 && v == 1500000000ull);
  CHECK(ms_query_parse_duration("20us", &v) == 0 && v == 20000);
  CHECK(ms_query_parse_duration("1m", &v) == 0 && v == 60000000000ull);
  CHECK(ms_query_parse_duration("2 s", &v) == -EINVAL && ms_query_parse_duration("-1s", &v) == -EINVAL);
  CHECK(ms_query_parse_duration("s", &v) == -EINVAL && ms_query_parse_duration("3parsecs", &v) == -EINVAL);
}

/* Two schemas name alike only when every id is the same class: a plan and
 * itself, two buckets' plans (classes do not follow the batch); not the CPU's
 * plan with its norms fused beside a plain one, and the log says where. */
static void test_schema_same(void) {
  struct ms_model *m = preset("tiny");
  struct ms_compile_opts co = {.sz = sizeof co, .batch = 1, .tile_bytes = 1024 * 1024, .min_tiles = 2,
                               .fuse_norm = 1};
  struct ms_plan *p = ms_plan_compile(m, &co, NULL);
  struct ms_query_schema *fused = p ? ms_query_schema_of_plan(p, NULL) : NULL, *plain = schema_of(m);
  co.batch = 8;
  struct ms_plan *p8 = ms_plan_compile(m, &co, NULL);
  struct ms_query_schema *fused8 = p8 ? ms_query_schema_of_plan(p8, NULL) : NULL;
  char lb[256] = "";
  struct ms_textbuf log = {.buf = lb, .size = sizeof lb};
  CHECK(fused && plain && fused8);
  if (fused && plain && fused8) {
    CHECK(ms_query_schema_same(plain, "a", plain, "b", &log) == 0 && !lb[0]);
    CHECK(ms_query_schema_same(fused, "a", fused8, "b", &log) == 0 && !lb[0]);
    CHECK(ms_query_schema_same(plain, "the file", fused, "the engine's", &log) == -1);
    CHECKF(strstr(lb, "task_class 2 is blk.0.attn_norm in the file, blk.0.qkv in the engine's"), "%s", lb);
    /* the digests: a plan's own and its schema's (through JSON) alike, the buckets' alike, plain != fused */
    uint64_t dp[2], df[2], d8[2], dplain[2];
    ms_plan_schema_digest(p, dp);
    ms_query_schema_digest(fused, df), ms_query_schema_digest(fused8, d8), ms_query_schema_digest(plain, dplain);
    CHECK(dp[0] && dp[1] && dp[0] == df[0] && dp[1] == df[1]);
    CHECK(d8[0] == df[0] && d8[1] == df[1]);
    CHECK(dplain[0] != df[0]);
  }
  ms_query_schema_free(fused), ms_query_schema_free(fused8), ms_query_schema_free(plain);
  ms_plan_free(p), ms_plan_free(p8);
  ms_model_free(m);
}

int main(void) {
  test_schema_same();
  test_examples_verify();
  test_errors();
  test_known_answers();
  test_bundle_refusals();
  test_random_programs();
  test_interp_jit();
  test_trigger();
  test_fuzz_corpus();
  test_durations();
  TEST_MAIN_END();
}
