/* SPDX-License-Identifier: MIT */
/* One question to several engines (ms_query_maps_of_union): the merged
 * read-out equals, byte for byte, the read-out of one engine that ran every
 * firing on as many workers, for every aggregation (count, sum, min and max
 * signed and unsigned, avg, hist, lhist, quantile, records) and keyed maps
 * whose keys only one engine saw; the merged count is the sum of each
 * engine's own; an engine left out of the union is not counted; the writer
 * names each engine with its state and coverage and sums the total. */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "megascope/bpf.h"
#include "megascope/hook.h"
#include "megascope/model.h"
#include "megascope/monitor.h"
#include "megascope/plan.h"
#include "megascope/query.h"
#include "test.h"

#define N_VALUES 3000

static const char *const program =
    "task_end { @n = count(); @s = sum(t_end - t_begin); @lo = min(t_end - t_begin); @hi = max(t_end - t_begin); "
    "@zlo = min(tile_z); @zhi = max(tile_z); @a = avg(t_end - t_begin); @h = hist(t_end - t_begin); "
    "@l = lhist(t_end - t_begin, 0, 100000, 5000); @q = quantile(t_end - t_begin, 0.5, 0.9, 0.99); "
    "@k[tile_y] = count(); @kq[tile_y] = quantile(t_end - t_begin, 0.5); @r = record(tile_y, t_end - t_begin) }";

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint64_t next_u64(void) {
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return rng;
}

struct engine {
  struct ms_bpf_map *maps[MS_BPF_MAX_MAPS];
  size_t n_maps;
  uint32_t workers;
};

static struct ms_query_schema *tiny_schema(void) {
  struct ms_model_config c;
  ms_preset_config("tiny", MS_DTYPE_F32, &c);
  struct ms_model *m = ms_model_synth(&c, 5);
  struct ms_compile_opts co = {.sz = sizeof co, .batch = 4};
  struct ms_plan *p = m ? ms_plan_compile(m, &co, NULL) : NULL;
  struct ms_query_schema *s = p ? ms_query_schema_of_plan(p, NULL) : NULL;
  ms_plan_free(p);
  ms_model_free(m);
  return s;
}

static int engine_new(struct engine *e, const struct ms_query *q, uint32_t workers) {
  memset(e, 0, sizeof *e);
  e->workers = workers;
  e->n_maps = ms_query_map_count(q);
  for (size_t i = 0; i < e->n_maps; i++)
    if (!(e->maps[i] = ms_bpf_map_new(ms_query_map(q, i), workers, NULL))) return -1;
  return 0;
}

static void engine_free(struct engine *e) {
  for (size_t i = 0; i < e->n_maps; i++) ms_bpf_map_free(e->maps[i]);
}

/* Runs the query's program on e for one firing: value v on worker w, key y. */
static int fire(const struct ms_query *q, struct ms_bpf_prog *prog, struct engine *e, uint32_t w, uint64_t v,
                int32_t y) {
  (void)q;
  struct ms_hook_ctx ctx = {.abi_version = MS_HOOK_ABI_VERSION, .hook = MS_HOOK_TASK_END, .worker = w,
                            .tile_y = y, .tile_z = (int32_t)(v % 2001) - 1000, .t_ready = 500, .t_begin = 1000};
  ctx.t_end = ctx.t_begin + v;
  struct ms_bpf_env env = {.worker = w};
  struct ms_bpf_run_opts ro = {.sz = sizeof ro, .helpers = ms_monitor_helpers(), .maps = e->maps,
                               .n_maps = e->n_maps, .ctx = &ctx, .ctx_size = sizeof ctx, .env = &env};
  struct ms_bpf_run_result res;
  return ms_bpf_run(prog, &ro, &res) < 0 ? -1 : 0;
}

static char *readout(const struct ms_query *q, const struct ms_query_maps *src, const struct ms_coverage *cov,
                     const struct ms_query_print *po_in) {
  struct ms_query_print po = {.sz = sizeof po, .as_json = 1, .final = 1};
  if (po_in) po = *po_in;
  char *text = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  int rc = ms_query_write(q, src, cov, &po, f);
  fclose(f);
  if (rc) {
    free(text);
    return NULL;
  }
  return text;
}

static json_t *entry_of(json_t *r, const char *name, int i) {
  size_t k;
  json_t *m;
  json_array_foreach(json_object_get(r, "maps"), k, m) if (!strcmp(json_string_value(json_object_get(m, "name")), name))
      return json_array_get(json_object_get(m, "entries"), (size_t)i);
  return NULL;
}

static long long count_of(const char *json) {
  json_t *r = json ? json_loads(json, 0, NULL) : NULL;
  long long n = json_integer_value(json_object_get(entry_of(r, "@n", 0), "value"));
  json_decref(r);
  return n;
}

int main(void) {
  struct ms_query_schema *s = tiny_schema();
  CHECK(s != NULL);
  char log[4096] = "";
  struct ms_textbuf tb = {.buf = log, .size = sizeof log};
  struct ms_query *q = s ? ms_query_compile(program, s, NULL, &tb) : NULL;
  CHECKF(q != NULL, "%s", log);
  if (!q) {
    ms_query_schema_free(s);
    TEST_MAIN_END();
  }
  /* engine A: 3 workers; B: 2 workers; one: 5 workers, A's firings on its
   * workers 0-2 and B's on 3-4, in the same order */
  struct engine a, b, one;
  CHECK(engine_new(&a, q, 3) == 0 && engine_new(&b, q, 2) == 0 && engine_new(&one, q, 5) == 0);
  size_t ni;
  const char *sec;
  const struct ms_bpf_insn *in = ms_query_prog(q, 0, &ni, &sec);
  struct ms_bpf_map_def defs[MS_BPF_MAX_MAPS];
  for (size_t i = 0; i < ms_query_map_count(q); i++) defs[i] = *ms_query_map(q, i);
  struct ms_bpf_prog_opts po = {.sz = sizeof po, .section = sec, .maps = defs, .n_maps = ms_query_map_count(q)};
  struct ms_bpf_prog *prog = ms_bpf_prog_new(in, ni, &po);
  CHECK(ms_query_prog_count(q) == 1 && prog != NULL);
  int bad = 0;
  for (int pass = 0; pass < 2 && prog; pass++) { /* A's firings, then B's */
    for (int i = 0; i < N_VALUES / 2; i++) {
      uint64_t v = next_u64() % (pass ? 300000 : 90000);
      /* keys 0-3 on A, 2-5 on B: some on one engine only */
      int32_t y = (int32_t)(next_u64() % 4) + 2 * pass;
      uint32_t w = (uint32_t)(next_u64() % (pass ? 2 : 3));
      bad |= fire(q, prog, pass ? &b : &a, w, v, y);
      bad |= fire(q, prog, &one, w + (pass ? 3 : 0), v, y);
    }
  }
  CHECK(!bad);
  ms_bpf_prog_free(prog);

  struct ms_coverage cov = {.generation = 1, .eligible = N_VALUES, .executed = N_VALUES};
  struct ms_query_maps srcs[3], merged, alone;
  ms_query_maps_of_engine(&srcs[0], a.maps);
  ms_query_maps_of_engine(&srcs[1], b.maps);
  ms_query_maps_of_engine(&alone, one.maps);
  /* a third engine left out (no foreach): an unreachable replica */
  srcs[2] = (struct ms_query_maps){0};
  struct ms_query_union u = {.q = q, .srcs = srcs, .n = 3};
  CHECK(ms_query_maps_of_union(&merged, &u) == 0);
  CHECK(merged.n_workers(merged.user, 0) == 5);

  /* records are consumed by a read in process: the JSON read-outs compare
   * them (A's then B's, as the single engine ran them), the later ones not */
  char *got = readout(q, &merged, &cov, NULL), *want = readout(q, &alone, &cov, NULL);
  CHECK(got && want);
  CHECKF(got && want && !strcmp(got, want), "merged:\n%s\none engine:\n%s", got ? got : "", want ? want : "");
  json_t *gj = got ? json_loads(got, 0, NULL) : NULL;
  json_t *rec = NULL;
  size_t k;
  json_t *m;
  json_array_foreach(json_object_get(gj, "maps"), k, m) {
    if (!strcmp(json_string_value(json_object_get(m, "name")), "@r")) rec = m;
  }
  CHECKF(json_integer_value(json_object_get(rec, "total_records")) == N_VALUES, "records %lld",
         (long long)json_integer_value(json_object_get(rec, "total_records")));
  json_decref(gj);
  /* each engine's own answer: the merged count is their sum */
  char *own_a = readout(q, &srcs[0], &cov, NULL), *own_b = readout(q, &srcs[1], &cov, NULL);
  long long na = count_of(own_a), nb = count_of(own_b);
  CHECKF(na == N_VALUES / 2 && nb == N_VALUES / 2, "A %lld, B %lld", na, nb);
  CHECKF(count_of(got) == na + nb, "merged count %lld, A + B %lld", count_of(got), na + nb);
  free(own_a);
  free(own_b);
  free(got);
  free(want);
  /* the text form too */
  struct ms_query_print text = {.sz = sizeof text, .final = 1};
  got = readout(q, &merged, &cov, &text);
  want = readout(q, &alone, &cov, &text);
  CHECKF(got && want && !strcmp(got, want), "text differs:\n%s\n%s", got ? got : "", want ? want : "");
  free(got);
  free(want);

  /* the writer names every engine: its state, attachment, coverage; the total
   * sums those in it */
  struct ms_query_replica reps[3] = {
      {.name = "/s/a.sock", .state = MS_QUERY_REPLICA_ANSWERING, .id = 4, .in_total = 1, .has_cov = 1,
       .cov = {.eligible = 100, .executed = 90, .throttled = 10, .generation = 1, .first_step = 5, .last_step = 50}},
      {.name = "/s/b.sock", .state = MS_QUERY_REPLICA_GONE, .why = "the engine closed the connection", .id = 2,
       .in_total = 1, .has_cov = 1,
       .cov = {.eligible = 40, .executed = 40, .lost = 3, .generation = 2, .first_step = 7, .last_step = 9}},
      {.name = "/s/c.sock", .state = MS_QUERY_REPLICA_UNREACHABLE, .why = "connect: No such file or directory"}};
  struct ms_coverage total = {0};
  for (int i = 0; i < 3; i++)
    if (reps[i].in_total) ms_query_coverage_add(&total, &reps[i].cov);
  CHECK(total.eligible == 140 && total.executed == 130 && total.throttled == 10 && total.lost == 3 &&
        total.generation == 2 && total.first_step == 0 && total.last_step == 0);
  struct ms_query_print rp = {.sz = sizeof rp, .as_json = 1, .final = 1, .replicas = reps, .n_replicas = 3};
  got = readout(q, &merged, &total, &rp);
  json_t *r = got ? json_loads(got, 0, NULL) : NULL;
  json_t *ra = json_object_get(r, "replicas");
  CHECKF(json_array_size(ra) == 3, "%s", got ? got : "");
  CHECK(json_integer_value(json_object_get(r, "engines_in_total")) == 2 &&
        json_integer_value(json_object_get(r, "engines")) == 3);
  CHECK(json_integer_value(json_object_get(json_object_get(r, "coverage"), "executed")) == 130);
  json_t *r1 = json_array_get(ra, 1), *r2 = json_array_get(ra, 2);
  CHECK(!strcmp(json_string_value(json_object_get(r1, "state")) ?: "", "gone") &&
        json_is_true(json_object_get(r1, "in_total")) &&
        json_integer_value(json_object_get(json_object_get(r1, "coverage"), "lost")) == 3);
  CHECK(!strcmp(json_string_value(json_object_get(r2, "socket")) ?: "", "/s/c.sock") &&
        json_is_false(json_object_get(r2, "in_total")) && !json_object_get(r2, "coverage") &&
        !strcmp(json_string_value(json_object_get(r2, "error")) ?: "", "connect: No such file or directory"));
  json_decref(r);
  free(got);
  rp.as_json = 0;
  got = readout(q, &merged, &total, &rp);
  CHECKF(got && strstr(got, "replica /s/a.sock: answering, attachment 4; eligible 100, executed 90, throttled 10, "
                            "lost 0, failed 0, generation 1, steps 5-50\n"), "%s", got ? got : "");
  CHECKF(got && strstr(got, "replica /s/b.sock: gone (the engine closed the connection), attachment 2; coverage as "
                            "last read: eligible 40"), "%s", got ? got : "");
  CHECKF(got && strstr(got, "replica /s/c.sock: unreachable (connect: No such file or directory); not in the total\n"),
         "%s", got ? got : "");
  CHECKF(got && strstr(got, "coverage of 2 of 3 engines: eligible 140, executed 130, throttled 10, lost 3, failed 0, "
                            "generation 2; dropped keys 0;"), "%s", got ? got : "");
  free(got);
  engine_free(&a);
  engine_free(&b);
  engine_free(&one);
  ms_query_free(q);
  ms_query_schema_free(s);
  TEST_MAIN_END();
}
