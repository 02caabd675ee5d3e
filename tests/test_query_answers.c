/* SPDX-License-Identifier: MIT */
/* The figures a query prints, against an independent reference. One program
 * per aggregation is compiled from the query language, run by the interpreter
 * on task_end contexts whose durations (t_end - t_begin) are drawn from several
 * distributions and spread over three workers' slots, and read out by
 * ms_query_write as a user reads it (JSON, and the text line of a quantile).
 * The same durations, kept raw here, give the reference: count, sum, min and
 * max exactly, the mean to double precision, every hist and lhist bucket's
 * count exactly (buckets computed here from their definition), and each
 * quantile as the exact nearest-rank quantile (the value of rank ceil(q n))
 * within the 3.2% the output states (1/32: a sketch bucket's half width over its
 * lower edge; values under 16 are exact). */
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "megascope/bpf.h"
#include "megascope/engine.h"
#include "megascope/hook.h"
#include "megascope/model.h"
#include "megascope/monitor.h"
#include "megascope/plan.h"
#include "megascope/query.h"
#include "test.h"

#define N_WORKERS 3
#define QUANTILE_ERROR 0.032 /* what the output says: "within 3.2%" */

static const double fractions[] = {0.01, 0.25, 0.5, 0.9, 0.99, 0.999, 1.0};
#define N_FRACTIONS (sizeof fractions / sizeof *fractions)

/* ---- values ---- */

static uint64_t rng = 0x2545f4914f6cdd1dull;
static uint64_t next_u64(void) {
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return rng;
}
static double uniform01(void) { return ((double)(next_u64() >> 11) + 0.5) / 9007199254740992.0; }
static double normal01(void) { return sqrt(-2 * log(uniform01())) * cos(2 * M_PI * uniform01()); }

enum dist { D_UNIFORM, D_LOGNORMAL, D_EXPONENTIAL, D_BIMODAL, D_PARETO, D_SMALL, D_CONSTANT, D_HUGE, D_COUNT };
static const char *const dist_name[D_COUNT] = {"uniform",  "lognormal", "exponential", "bimodal",
                                               "pareto",   "small",     "constant",    "huge"};

static uint64_t draw(enum dist d) {
  switch (d) {
  case D_UNIFORM: return 1000 + next_u64() % 99000;
  case D_LOGNORMAL: return (uint64_t)exp(9.0 + 1.5 * normal01());
  case D_EXPONENTIAL: return (uint64_t)(-20000.0 * log(uniform01()));
  case D_BIMODAL: return uniform01() < 0.9 ? 1800 + next_u64() % 400 : 400000 + next_u64() % 200000;
  case D_PARETO: return (uint64_t)(3000.0 / pow(uniform01(), 1 / 1.2));
  case D_SMALL: return next_u64() % 21;  /* 0..20: the sketch's exact buckets and the first wide ones */
  case D_CONSTANT: return 12345;
  case D_HUGE: return (1ull << 40) + next_u64() % (1ull << 41);
  default: return 0;
  }
}

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return (x > y) - (x < y);
}

/* A signed field's value (tile_z) made from a duration: -1000..1000. */
static int32_t signed_of(uint64_t v) { return (int32_t)(v % 2001) - 1000; }

/* ---- one query, run on the values ---- */

struct run {
  struct ms_query *q;
  struct ms_bpf_map *maps[MS_BPF_MAX_MAPS];
  size_t n_maps;
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

/* Compiles src and runs its one task_end program on every value, value i on
 * worker i % N_WORKERS; 0, or -1 with the reason printed. */
static int run_query(const struct ms_query_schema *s, const char *src, const uint64_t *v, size_t n, struct run *r) {
  char log[4096] = "";
  struct ms_textbuf tb = {.buf = log, .size = sizeof log};
  memset(r, 0, sizeof *r);
  if (!(r->q = ms_query_compile(src, s, NULL, &tb))) {
    fprintf(stderr, "%s: %s\n", src, log);
    return -1;
  }
  r->n_maps = ms_query_map_count(r->q);
  struct ms_bpf_map_def defs[MS_BPF_MAX_MAPS];
  for (size_t i = 0; i < r->n_maps; i++) {
    defs[i] = *ms_query_map(r->q, i);
    if (!(r->maps[i] = ms_bpf_map_new(&defs[i], N_WORKERS, NULL))) return -1;
  }
  if (ms_query_prog_count(r->q) != 1) return -1;
  size_t ni;
  const char *sec;
  const struct ms_bpf_insn *in = ms_query_prog(r->q, 0, &ni, &sec);
  struct ms_bpf_prog_opts po = {.sz = sizeof po, .section = sec, .maps = defs, .n_maps = r->n_maps};
  struct ms_bpf_prog *prog = ms_bpf_prog_new(in, ni, &po);
  if (!prog) return -1;
  int rc = 0;
  for (size_t i = 0; i < n && !rc; i++) {
    struct ms_hook_ctx ctx = {.abi_version = MS_HOOK_ABI_VERSION, .hook = MS_HOOK_TASK_END, .step = i / 64,
                              .worker = (uint32_t)(i % N_WORKERS), .tile_y = (int32_t)(i % 4),
                              .tile_z = signed_of(v[i]),
                              .t_ready = 500, .t_begin = 1000};
    ctx.t_end = ctx.t_begin + v[i];
    struct ms_bpf_env env = {.worker = ctx.worker};
    struct ms_bpf_run_opts ro = {.sz = sizeof ro, .helpers = ms_monitor_helpers(), .maps = r->maps,
                                 .n_maps = r->n_maps, .ctx = &ctx, .ctx_size = sizeof ctx, .env = &env};
    struct ms_bpf_run_result res;
    if (ms_bpf_run(prog, &ro, &res) < 0) rc = -1;
  }
  ms_bpf_prog_free(prog);
  return rc;
}

static void run_free(struct run *r) {
  for (size_t i = 0; i < r->n_maps; i++) ms_bpf_map_free(r->maps[i]);
  ms_query_free(r->q);
}

/* The read-out as a user gets it: JSON (parsed) or text. */
static char *readout_text(const struct run *r, int as_json) {
  struct ms_query_maps src;
  ms_query_maps_of_engine(&src, (struct ms_bpf_map **)r->maps);
  struct ms_coverage cov = {.generation = 1};
  char *text = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  struct ms_query_print po = {.sz = sizeof po, .as_json = as_json, .final = 1};
  int rc = ms_query_write(r->q, &src, &cov, &po, f);
  fclose(f);
  if (rc) {
    free(text);
    return NULL;
  }
  return text;
}

static json_t *readout_json(const struct run *r) {
  char *text = readout_text(r, 1);
  json_t *j = text ? json_loads(text, 0, NULL) : NULL;
  free(text);
  return j;
}

static json_t *first_entry(json_t *r, const char *name) {
  size_t i;
  json_t *m;
  json_array_foreach(json_object_get(r, "maps"), i, m) if (!strcmp(json_string_value(json_object_get(m, "name")), name))
      return json_array_get(json_object_get(m, "entries"), 0);
  return NULL;
}

static double num(json_t *e, const char *k) { return json_number_value(json_object_get(e, k)); }

/* ---- the checks ---- */

/* count, sum, min, max, avg: exact (the mean to double precision). */
static void check_scalars(const struct ms_query_schema *s, const char *what, const uint64_t *v, size_t n) {
  struct run r;
  CHECKF(run_query(s, "task_end { @n = count(); @s = sum(t_end - t_begin); @lo = min(t_end - t_begin); "
                      "@hi = max(t_end - t_begin); @a = avg(t_end - t_begin); @nlo = min(tile_z); @nhi = max(tile_z) }", v, n, &r) == 0, "%s", what);
  json_t *j = readout_json(&r);
  CHECKF(j != NULL, "%s: no JSON read-out", what);
  uint64_t sum = 0, lo = UINT64_MAX, hi = 0;
  for (size_t i = 0; i < n; i++) {
    sum += v[i];
    lo = v[i] < lo ? v[i] : lo;
    hi = v[i] > hi ? v[i] : hi;
  }
  json_t *en = first_entry(j, "@n"), *es = first_entry(j, "@s"), *el = first_entry(j, "@lo"),
         *eh = first_entry(j, "@hi"), *ea = first_entry(j, "@a");
  CHECKF(en && es && el && eh && ea, "%s: a map is missing", what);
  if (en && es && el && eh && ea) {
    CHECKF(json_integer_value(json_object_get(en, "value")) == (json_int_t)n, "%s: count %g, want %zu", what,
           num(en, "value"), n);
    CHECKF((uint64_t)json_integer_value(json_object_get(es, "value")) == sum, "%s: sum %g, want %llu", what,
           num(es, "value"), (unsigned long long)sum);
    CHECKF((uint64_t)json_integer_value(json_object_get(el, "value")) == lo, "%s: min %g, want %llu", what,
           num(el, "value"), (unsigned long long)lo);
    CHECKF((uint64_t)json_integer_value(json_object_get(eh, "value")) == hi, "%s: max %g, want %llu", what,
           num(eh, "value"), (unsigned long long)hi);
    long double mean = 0;
    for (size_t i = 0; i < n; i++) mean += (long double)v[i];
    mean /= (long double)n;
    /* JSON numbers carry 9 significant digits, the text line 6: each within its rounding */
    double got = num(ea, "value");
    CHECKF(fabsl((long double)got - mean) <= 5e-9L * mean, "%s: avg %.17g, want %.17Lg", what, got, mean);
    char *text = readout_text(&r, 0), *p = text ? strstr(text, "@a: ") : NULL;
    double shown = p ? strtod(p + 4, NULL) : NAN;
    CHECKF(fabsl((long double)shown - mean) <= 5e-6L * mean, "%s: text avg %.9g, want %.9Lg", what, shown, mean);
    CHECKF(num(ea, "count") == (double)n, "%s: avg's count %g", what, num(ea, "count"));
    /* a signed field, merged over the workers as signed numbers */
    int32_t zlo = INT32_MAX, zhi = INT32_MIN;
    for (size_t i = 0; i < n; i++) {
      zlo = signed_of(v[i]) < zlo ? signed_of(v[i]) : zlo;
      zhi = signed_of(v[i]) > zhi ? signed_of(v[i]) : zhi;
    }
    json_t *nl = first_entry(j, "@nlo"), *nh = first_entry(j, "@nhi");
    CHECKF(nl && json_integer_value(json_object_get(nl, "value")) == zlo, "%s: signed min %g, want %d", what,
           nl ? num(nl, "value") : 0, zlo);
    CHECKF(nh && json_integer_value(json_object_get(nh, "value")) == zhi, "%s: signed max %g, want %d", what,
           nh ? num(nh, "value") : 0, zhi);
    /* the text lines a user reads */
    char want[256];
    snprintf(want, sizeof want, "@n: %zu\n@s: %llu\n@lo: %llu (n %zu)\n@hi: %llu (n %zu)\n", n,
             (unsigned long long)sum, (unsigned long long)lo, n, (unsigned long long)hi, n);
    CHECKF(text && strstr(text, want), "%s: text lacks '%s': %s", what, want, text ? text : "");
    snprintf(want, sizeof want, "@nlo: %d (n %zu)\n@nhi: %d (n %zu)\n", zlo, n, zhi, n);
    CHECKF(text && strstr(text, want), "%s: text lacks '%s': %s", what, want, text ? text : "");
    free(text);
  }
  json_decref(j);
  run_free(&r);
}

/* The text histogram of @h as a user reads it: from the first bucket with a
 * count to the last, "[0]" or "[lo, hi)", the count, and a bar of
 * ceil(50 count / peak) '@'s. */
static void check_text_hist(const struct run *r, const char *what, const uint64_t *want) {
  char *text = readout_text(r, 0);
  const char *p = text ? strstr(text, "@h:\n") : NULL;
  int first = -1, last = -1, bad = 0, lines = 0;
  uint64_t peak = 0;
  for (int b = 0; b < 65; b++)
    if (want[b]) {
      if (first < 0) first = b;
      last = b;
      peak = want[b] > peak ? want[b] : peak;
    }
  for (int b = first; p && b >= 0 && b <= last; b++, lines++) {
    p = strchr(p, '\n') + 1;  /* the bucket's line */
    char expect[64];
    if (b == 0) snprintf(expect, sizeof expect, "[0]");
    else snprintf(expect, sizeof expect, "[%llu, %llu)", 1ull << (b - 1), 1ull << b);
    size_t el = strlen(expect);
    if (strncmp(p, expect, el)) {
      bad++;
      continue;
    }
    char *end;
    uint64_t c = strtoull(p + el, &end, 10);
    const char *bar = strchr(end, '|');
    uint64_t at = 0;
    while (bar && bar[1 + at] == '@') at++;
    bad += c != want[b] || at != (want[b] * 50 + peak - 1) / peak;
  }
  CHECKF(p && !bad && lines == last - first + 1, "%s: the text histogram differs from the reference (%d lines, %d bad): %s",
         what, lines, bad, text ? text : "");
  free(text);
}

/* hist: bucket 0 holds 0, bucket b >= 1 holds [2^(b-1), 2^b); lhist(v, 0,
 * 100000, 5000): an underflow bucket, [k*5000, (k+1)*5000), and [100000, ...). */
static void check_histograms(const struct ms_query_schema *s, const char *what, const uint64_t *v, size_t n) {
  struct run r;
  CHECKF(run_query(s, "task_end { @h = hist(t_end - t_begin); @l = lhist(t_end - t_begin, 0, 100000, 5000) }", v, n,
                   &r) == 0, "%s", what);
  json_t *j = readout_json(&r);
  uint64_t want_h[65] = {0}, want_l[22] = {0};
  for (size_t i = 0; i < n; i++) {
    int b = 0;
    for (uint64_t x = v[i]; x; x >>= 1) b++;
    want_h[b]++;
    want_l[v[i] >= 100000 ? 21 : 1 + v[i] / 5000]++;
  }
  json_t *h = first_entry(j, "@h"), *l = first_entry(j, "@l");
  CHECKF(h && l, "%s: a histogram is missing", what);
  size_t i;
  json_t *bk;
  uint64_t seen_h = 0, seen_l = 0;
  int bad = 0;
  json_array_foreach(json_object_get(h, "buckets"), i, bk) {
    uint64_t lo = (uint64_t)json_integer_value(json_object_get(bk, "lo")), c = (uint64_t)num(bk, "count");
    int b = 0;
    for (uint64_t x = lo; x; x >>= 1) b++;
    bad += c != want_h[b];
    bad += (uint64_t)json_integer_value(json_object_get(bk, "hi")) != (lo ? 2 * lo : 1);  /* no value reaches 2^63 */
    seen_h += c;
  }
  check_text_hist(&r, what, want_h);
  json_array_foreach(json_object_get(l, "buckets"), i, bk) {
    json_t *lo = json_object_get(bk, "lo");
    uint64_t c = (uint64_t)num(bk, "count");
    int b = json_is_null(lo) ? 0 : json_integer_value(lo) >= 100000 ? 21 : 1 + (int)(json_integer_value(lo) / 5000);
    bad += c != want_l[b];
    if (!json_is_null(lo) && json_integer_value(lo) < 100000)
      bad += json_integer_value(json_object_get(bk, "hi")) != json_integer_value(lo) + 5000;
    seen_l += c;
  }
  CHECKF(!bad && seen_h == n && seen_l == n, "%s: %d buckets differ from the reference (%llu, %llu of %zu counted)",
         what, bad, (unsigned long long)seen_h, (unsigned long long)seen_l, n);
  CHECKF(h && num(h, "count") == (double)n && l && num(l, "count") == (double)n, "%s: histogram counts", what);
  json_decref(j);
  run_free(&r);
}

/* The text line's figure for pNN: "p50 1234.5". */
static double text_quantile(const char *text, double q) {
  char key[32];
  snprintf(key, sizeof key, " p%g ", q * 100);
  const char *p = strstr(text, key);
  return p ? strtod(p + strlen(key), NULL) : NAN;
}

static void check_quantiles(const struct ms_query_schema *s, const char *what, const uint64_t *v, size_t n) {
  char src[256];
  size_t len = (size_t)snprintf(src, sizeof src, "task_end { @q = quantile(t_end - t_begin");
  for (size_t k = 0; k < N_FRACTIONS; k++) len += (size_t)snprintf(src + len, sizeof src - len, ", %g", fractions[k]);
  snprintf(src + len, sizeof src - len, ") }");
  struct run r;
  CHECKF(run_query(s, src, v, n, &r) == 0, "%s", what);
  json_t *j = readout_json(&r);
  char *text = readout_text(&r, 0);
  uint64_t *sorted = malloc(n * sizeof *sorted);
  memcpy(sorted, v, n * sizeof *sorted);
  qsort(sorted, n, sizeof *sorted, cmp_u64);
  json_t *e = first_entry(j, "@q");
  CHECKF(e && num(e, "count") == (double)n, "%s: quantile count", what);
  CHECKF(e && fabs(num(e, "relative_error") - 1.0 / 32) < 1e-12, "%s: relative_error %g", what,
         e ? num(e, "relative_error") : -1);
  CHECKF(text && strstr(text, "within 3.2%"), "%s: the text line states no error: %s", what, text ? text : "");
  json_t *qs = json_object_get(e, "quantiles");
  CHECKF(json_array_size(qs) == N_FRACTIONS, "%s: %zu quantiles", what, json_array_size(qs));
  for (size_t k = 0; k < N_FRACTIONS && k < json_array_size(qs); k++) {
    double q = fractions[k];
    size_t rank = (size_t)ceil(q * (double)n);
    double exact = (double)sorted[(rank < 1 ? 1 : rank) - 1];
    double got = num(json_array_get(qs, k), "value"), shown = text ? text_quantile(text, q) : NAN;
    double tol = exact < 16 ? 0 : QUANTILE_ERROR * exact;
    CHECKF(num(json_array_get(qs, k), "q") == q, "%s: quantile %zu is q %g", what, k,
           num(json_array_get(qs, k), "q"));
    CHECKF(fabs(got - exact) <= tol, "%s: p%g %.6g, exact %.6g (off by %.2f%%)", what, q * 100, got, exact,
           100 * fabs(got - exact) / (exact ? exact : 1));
    /* the text prints 6 significant digits: within the error and the rounding */
    CHECKF(fabs(shown - exact) <= tol + 5e-6 * exact, "%s: text p%g %.6g, exact %.6g", what, q * 100, shown, exact);
  }
  free(text);
  free(sorted);
  json_decref(j);
  run_free(&r);
}

/* A keyed quantile: each key's answer from that key's values alone, in JSON
 * and in the text line a user reads ("@q[2]: p50 ... p90 ... (n ...)"). */
static void check_keyed(const struct ms_query_schema *s, const uint64_t *v, size_t n) {
  struct run r;
  CHECK(run_query(s, "task_end { @q[tile_y] = quantile(t_end - t_begin, 0.5, 0.9) }", v, n, &r) == 0);
  json_t *j = readout_json(&r);
  char *text = readout_text(&r, 0);
  size_t i, seen = 0;
  json_t *e, *m = json_array_get(json_object_get(j, "maps"), 0);
  json_array_foreach(json_object_get(m, "entries"), i, e) {
    json_int_t key = json_integer_value(json_array_get(json_object_get(e, "key"), 0));
    uint64_t *mine = malloc(n * sizeof *mine);
    size_t c = 0;
    for (size_t t = 0; t < n; t++)
      if ((json_int_t)(t % 4) == key) mine[c++] = v[t];
    qsort(mine, c, sizeof *mine, cmp_u64);
    for (int k = 0; k < 2; k++) {
      double q = k ? 0.9 : 0.5, exact = (double)mine[(size_t)ceil(q * (double)c) - 1];
      double got = num(json_array_get(json_object_get(e, "quantiles"), (size_t)k), "value");
      CHECKF(fabs(got - exact) <= QUANTILE_ERROR * exact, "tile_y %lld: p%g %.6g, exact %.6g", (long long)key,
             q * 100, got, exact);
      char head[32];
      snprintf(head, sizeof head, "@q[%lld]:", (long long)key);
      const char *line = text ? strstr(text, head) : NULL;
      const char *eol = line ? strchr(line, '\n') : NULL;
      char one[256] = "";
      if (line && eol && eol - line < (long)sizeof one) memcpy(one, line, (size_t)(eol - line));
      double shown = text_quantile(one, q);
      CHECKF(fabs(shown - exact) <= QUANTILE_ERROR * exact + 5e-6 * exact, "text %s p%g %.6g, exact %.6g: '%s'", head,
             q * 100, shown, exact, one);
    }
    CHECKF(num(e, "count") == (double)c, "tile_y %lld: count %g, want %zu", (long long)key, num(e, "count"), c);
    seen++;
    free(mine);
  }
  CHECKF(seen == 4, "%zu keys, want 4", seen);
  free(text);
  json_decref(j);
  run_free(&r);
}

int main(void) {
  struct ms_query_schema *s = tiny_schema();
  CHECK(s != NULL);
  if (!s) TEST_MAIN_END();
  const size_t n = 6000;
  uint64_t *v = malloc(n * sizeof *v);
  for (int d = 0; d < D_COUNT; d++) {
    for (size_t i = 0; i < n; i++) v[i] = draw((enum dist)d);
    size_t m = d == D_SMALL ? 997 : n;  /* an odd count too */
    check_scalars(s, dist_name[d], v, m);
    check_histograms(s, dist_name[d], v, m);
    check_quantiles(s, dist_name[d], v, m);
    if (d == D_LOGNORMAL) check_keyed(s, v, m);
  }
  /* one value alone: every quantile is it */
  v[0] = 777;
  check_quantiles(s, "one value", v, 1);
  check_scalars(s, "one value", v, 1);
  free(v);
  ms_query_schema_free(s);
  TEST_MAIN_END();
}
