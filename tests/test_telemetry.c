/* SPDX-License-Identifier: MIT */
/* Built-in telemetry: latency histograms count every finished request, the
 * always-on aggregate counts every task, the trace records every task (or counts
 * what it drops) and writes Chrome JSON with slices, flows and counters.
 * Traces over several batch buckets: each slice's event class is its own
 * plan's; times are whole nanoseconds; per-worker slices are ordered; flows
 * start inside their producers; a window cut through tasks clips them; the
 * Perfetto file of the same recording is several times smaller and, decoded
 * with Perfetto's own definitions (tests/trace_check.py), the same trace; the
 * event and byte budgets keep to their limits and count what they drop. */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "megascope/plan_ir.h"
#include "megascope/export.h"
#include "megascope/telemetry.h"
#include "runtime/runtime_impl.h"
#include "test.h"

static struct ms_model *tiny(void) {
  struct ms_model_config c;
  ms_preset_config("tiny", MS_DTYPE_F32, &c);
  return ms_model_synth(&c, 2);
}

static void decode(struct ms_engine *e, int n, int tokens) {
  struct ms_request *r[8];
  for (int i = 0; i < n; i++) {
    int32_t p[2] = {5 + i, 9};
    struct ms_request_opts ro = {.sz = sizeof ro, .prompt = p, .n_prompt = 1 + i % 2, .max_new_tokens = tokens};
    r[i] = ms_engine_submit(e, &ro);
  }
  for (int i = 0; i < n; i++) {
    ms_request_wait(r[i], -1);
    ms_request_free(r[i]);
  }
}

static size_t count(const char *s, const char *needle) {
  size_t n = 0;
  for (const char *p = s; (p = strstr(p, needle)); p++) n++;
  return n;
}

static long long ns_of(json_t *v) { return llround(json_number_value(v) * 1000); }

/* Writes the last trace into path; fills *w. */
static int save(struct ms_engine *e, const char *path, enum ms_trace_format fmt, uint64_t max_events,
                uint64_t max_bytes, struct ms_trace_written *w) {
  FILE *f = fopen(path, "wb");
  if (!f) return -errno;
  struct ms_trace_write_opts o = {.sz = sizeof o, .format = fmt, .max_events = max_events, .max_bytes = max_bytes};
  int rc = ms_engine_trace_save(e, f, &o, w);
  fclose(f);
  return rc;
}

/* Every JSON "ts" and "dur" is a whole number of nanoseconds: three decimals. */
static int exact_times(const char *text) {
  for (const char *p = text; (p = strstr(p, "\"ts\":")) || 0;) {
    p += 5;
    const char *dot = p;
    while (*dot >= '0' && *dot <= '9') dot++;
    if (dot == p || *dot != '.' || !(dot[1] >= '0' && dot[1] <= '9') || !(dot[2] >= '0' && dot[2] <= '9') ||
        !(dot[3] >= '0' && dot[3] <= '9') || (dot[4] >= '0' && dot[4] <= '9'))
      return 0;
  }
  return 1;
}

/* Slices of the JSON trace: event classes from the slice's own bucket's plan,
 * inside the window, ordered and disjoint per worker; flows inside their
 * producers. Returns the number of slices; *buckets gets the buckets seen. */
static int check_json(struct ms_engine *e, const char *text, int *buckets) {
  json_error_t err;
  json_t *d = json_loads(text, 0, &err), *x;
  CHECKF(d != NULL, "the trace is not JSON: %s", err.text);
  if (!d) return 0;
  long long window = ns_of(json_object_get(json_object_get(d, "metadata"), "window_us"));
  long long last_end[8] = {0}, slices = 0, wrong_class = 0, unordered = 0, outside = 0, loose_flows = 0;
  long long *ends = calloc(1 << 20, sizeof *ends), *begins = calloc(1 << 20, sizeof *begins);
  int *tids = calloc(1 << 20, sizeof *tids);
  size_t i, n_sl = 0;
  json_t *ev = json_object_get(d, "traceEvents");
  json_array_foreach(ev, i, x) {
    const char *ph = json_string_value(json_object_get(x, "ph"));
    int tid = (int)json_integer_value(json_object_get(x, "tid"));
    if (strcmp(ph, "X") || tid < 0 || tid >= 8) continue;
    long long ts = ns_of(json_object_get(x, "ts")), dur = ns_of(json_object_get(x, "dur"));
    json_t *a = json_object_get(x, "args");
    int bucket = (int)json_integer_value(json_object_get(a, "bucket"));
    int task = (int)json_integer_value(json_object_get(a, "task"));
    const struct ms_plan *p = ms_engine_plan(e, bucket);
    const char *want = p && task < p->n_tasks && p->tasks[task].wait >= 0
                           ? p->ev_classes[p->events[p->tasks[task].wait].cls] : NULL;
    const char *got = json_string_value(json_object_get(a, "event_class"));
    wrong_class += !p || (want ? !got || strcmp(want, got) : got != NULL);
    *buckets |= bucket;
    unordered += ts < last_end[tid];
    last_end[tid] = ts + dur;
    outside += ts < 0 || ts + dur > window;
    if (n_sl < (1 << 20)) begins[n_sl] = ts, ends[n_sl] = ts + dur, tids[n_sl++] = tid;
    slices++;
  }
  /* a flow's start lies inside a slice of its track (slices are few enough to scan) */
  json_array_foreach(ev, i, x) {
    if (strcmp(json_string_value(json_object_get(x, "ph")), "s")) continue;
    long long ts = ns_of(json_object_get(x, "ts"));
    int tid = (int)json_integer_value(json_object_get(x, "tid")), in = 0;
    for (size_t k = 0; k < n_sl && !in; k++) in = tids[k] == tid && begins[k] <= ts && ts < ends[k];
    loose_flows += !in;
  }
  CHECKF(wrong_class == 0, "%lld slices name an event class not of their own plan", wrong_class);
  CHECKF(unordered == 0, "%lld slices begin before the previous one on their worker ends", unordered);
  CHECKF(outside == 0, "%lld slices outside the window", outside);
  CHECKF(loose_flows == 0, "%lld flows start outside every slice of their producer's track", loose_flows);
  free(ends);
  free(begins);
  free(tids);
  json_decref(d);
  return (int)slices;
}

/* Steps of every bucket: eight requests of different lengths, so the batch
 * shrinks 8 -> 4 -> 2 -> 1 as they finish. */
static void traces_over_buckets(void) {
  struct ms_model *m = tiny();
  struct ms_engine_opts o = {.sz = sizeof o, .n_workers = 3, .max_batch = 8, .max_ctx = 128};
  struct ms_engine *e = ms_engine_new(m, &o, NULL);
  struct ms_request *r[8];
  CHECK(ms_engine_trace_start(e, 0) == 0);
  for (int i = 0; i < 8; i++) {
    int32_t p[2] = {3 + i, 7};
    struct ms_request_opts ro = {.sz = sizeof ro, .prompt = p, .n_prompt = 1, .max_new_tokens = 2 + 3 * i};
    r[i] = ms_engine_submit(e, &ro);
  }
  for (int i = 0; i < 8; i++) {
    ms_request_wait(r[i], -1);
    ms_request_free(r[i]);
  }
  CHECK(ms_engine_trace_stop(e) == 0);
  char dir[] = "/tmp/megascope-trace-XXXXXX", js[64], pf[64], cut[64];
  CHECK(mkdtemp(dir) != NULL);
  snprintf(js, sizeof js, "%s/t.json", dir);
  snprintf(pf, sizeof pf, "%s/t.pftrace", dir);
  snprintf(cut, sizeof cut, "%s/cut.json", dir);
  struct ms_trace_written wj, wp, wb;
  CHECK(save(e, js, MS_TRACE_JSON, 0, 0, &wj) == 0);
  CHECK(save(e, pf, MS_TRACE_PERFETTO, 0, 0, &wp) == 0);
  size_t len;
  char *text = ms_test_slurp(js, &len);
  CHECK(text && len == wj.bytes && exact_times(text));
  int buckets = 0;
  int slices = text ? check_json(e, text, &buckets) : 0;
  CHECKF(buckets == (1 | 2 | 4 | 8), "buckets seen: %#x", buckets);
  CHECK(slices > 0 && (uint64_t)slices == wj.slices && wj.slices == wp.slices && wj.flows == wp.flows &&
        wj.counters == wp.counters && wj.budget_dropped == 0 && wj.outside == 0 && wj.kept_ns == wj.window_ns);
  CHECKF(wp.bytes * 3 < wj.bytes, "perfetto %llu bytes, json %llu", (unsigned long long)wp.bytes,
         (unsigned long long)wj.bytes);
  printf("one recording of %llu slices: json %llu bytes, perfetto %llu bytes (%.1fx smaller)\n",
         (unsigned long long)wj.slices, (unsigned long long)wj.bytes, (unsigned long long)wp.bytes,
         (double)wj.bytes / (double)wp.bytes);
  free(text);

  /* Perfetto's own definitions decode the same trace (the test is skipped without them) */
  const char *src = getenv("MS_SRC");
  if (!src) SKIP_PART("no MS_SRC: the Perfetto decode (tests/trace_check.py) not run");
  if (src) {
    char cmd[512];
    snprintf(cmd, sizeof cmd, "python3 %s/tests/trace_check.py same %s %s", src, js, pf);
    int rc = system(cmd);
    rc = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
    if (rc == 77)
      SKIP_PART("python3 has no perfetto package: the Perfetto decode not run");
    else
      CHECKF(rc == 0, "trace_check same: exit %d", rc);
  }

  /* budgets: the first N events exactly; a file within N bytes */
  uint64_t events = wj.slices + wj.counters;
  for (int f = 0; f < MS_TRACE_FORMAT_COUNT; f++) {
    CHECK(save(e, cut, (enum ms_trace_format)f, 100, 0, &wb) == 0);
    CHECK(wb.slices + wb.counters == 100 && wb.budget_dropped == events - 100 && wb.kept_ns < wb.window_ns);
    CHECK(save(e, cut, (enum ms_trace_format)f, 0, 16384, &wb) == 0);
    CHECKF(wb.bytes <= 16384 && wb.budget_dropped > 0 && wb.slices + wb.counters + wb.budget_dropped == events,
           "%s: %llu bytes, %llu dropped", ms_trace_format_name((enum ms_trace_format)f), (unsigned long long)wb.bytes,
           (unsigned long long)wb.budget_dropped);
  }
  text = ms_test_slurp(cut, &len);
  CHECK(text && len <= 16384);
  free(text);
  text = NULL;
  CHECK(save(e, cut, MS_TRACE_JSON, 0, 100, &wb) == -EINVAL);  /* below the 4096 floor */
  CHECK(save(e, cut, MS_TRACE_JSON, 100, 0, &wb) == 0);
  text = ms_test_slurp(cut, &len);
  json_t *d = text ? json_loads(text, 0, NULL) : NULL;
  CHECK(d && json_integer_value(json_object_get(json_object_get(d, "metadata"), "budget_dropped")) ==
                 (json_int_t)(events - 100));
  json_decref(d);
  free(text);

  /* a window cut through tasks: a task begun before its start is drawn from
   * 0 with the part inside; one ended before it is left out, and counted */
  const struct trace_rec *mid = NULL;
  for (uint32_t i = ms_tel_published(e, 1) / 2; i < ms_tel_published(e, 1) && !mid; i++)
    if (e->workers[1].trace[i].kind == TR_TASK && e->workers[1].trace[i].t_end > e->workers[1].trace[i].t_begin + 1)
      mid = &e->workers[1].trace[i];
  CHECK(mid != NULL);
  if (mid) {
    uint64_t t0 = e->trace_t0, t1 = e->trace_t1, at = mid->t_begin + (mid->t_end - mid->t_begin) / 2;
    e->trace_t0 = at;
    CHECK(save(e, cut, MS_TRACE_JSON, 0, 0, &wb) == 0);
    text = ms_test_slurp(cut, &len);
    char want[160];
    snprintf(want, sizeof want, "\"tid\":1,\"ts\":0.000,\"dur\":%llu.%03llu,",
             (unsigned long long)((mid->t_end - at) / 1000), (unsigned long long)((mid->t_end - at) % 1000));
    CHECKF(text && strstr(text, want), "no clipped slice %s", want);
    CHECK(wb.outside > 0 && wb.window_ns == t1 - at && wb.slices + wb.counters + wb.outside == wj.slices + wj.counters);
    buckets = 0;
    CHECK(text && check_json(e, text, &buckets) == (int)wb.slices);
    free(text);
    e->trace_t0 = t0;
  }
  unlink(js);
  unlink(pf);
  unlink(cut);
  rmdir(dir);
  ms_engine_free(e);
  ms_model_free(m);
}

int main(void) {
  traces_over_buckets();
  struct ms_model *m = tiny();
  struct ms_engine_opts o = {.sz = sizeof o, .n_workers = 3, .max_batch = 4, .max_ctx = 128};
  struct ms_engine *e = ms_engine_new(m, &o, NULL);
  { /* nothing recorded yet: an empty trace, not an error */
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    int rc = ms_engine_trace_write(e, f);
    fclose(f);
    json_t *j = rc == 0 ? json_loadb(text, len, 0, NULL) : NULL;
    json_t *ev = json_object_get(j, "traceEvents");
    size_t k, slices = 0;
    json_t *x;
    json_array_foreach(ev, k, x) slices += !strcmp(json_string_value(json_object_get(x, "ph")) ?: "", "X");
    CHECKF(rc == 0 && json_is_array(ev) && slices == 0, "rc %d, %zu slices: %.200s", rc, slices, text ? text : "");
    json_decref(j);
    free(text);
  }
  CHECK(ms_engine_trace_start(e, 0) == 0);
  CHECK(ms_engine_trace_start(e, 0) == -EBUSY);
  decode(e, 4, 12);
  CHECK(ms_engine_trace_stop(e) == 0);
  CHECK(ms_engine_trace_stop(e) == -EINVAL);
  struct ms_engine_stats st;
  ms_engine_get_stats(e, &st);

  /* latency: four requests of twelve tokens */
  struct ms_latency_stats lat;
  ms_engine_latency(e, &lat);
  CHECK(lat.requests_finished == 4 && lat.ttft.count == 4 && lat.tpot.count == 4);
  uint64_t sum = 0;
  for (int i = 0; i <= MS_LAT_BUCKETS; i++) sum += lat.ttft.counts[i];
  CHECK(sum == 4 && lat.ttft.sum > 0);
  double q50 = ms_histogram_quantile(&lat.tpot, 0.5), q99 = ms_histogram_quantile(&lat.tpot, 0.99);
  CHECK(q50 > 0 && q50 <= q99);

  /* the always-on aggregate saw every task */
  struct ms_class_stat cs[512];
  int n = ms_engine_class_stats(e, cs, 512);
  uint64_t tasks = 0;
  for (int c = 0; c < n; c++) tasks += cs[c].tasks;
  CHECKF(tasks == st.tasks, "aggregate %llu tasks %llu", (unsigned long long)tasks, (unsigned long long)st.tasks);
  int found = 0;
  for (int c = 0; c < n; c++) found |= !strcmp(cs[c].name, "blk.0.qkv") && cs[c].tasks > 0 && cs[c].task_ns > 0;
  CHECK(found);
  n = ms_engine_event_class_stats(e, cs, 512);
  found = 0;
  for (int c = 0; c < n; c++) found |= !strcmp(cs[c].name, "attn->wo") && cs[c].tasks > 0;
  CHECK(found);

  /* the trace: every task recorded, none dropped */
  struct ms_trace_stats ts;
  ms_engine_trace_stats(e, &ts);
  char *text = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  CHECK(ms_engine_trace_write(e, f) == 0);
  fclose(f);
  CHECK(ts.dropped == 0 && !ts.active);
  size_t slices = count(text, "\"ph\":\"X\"");
  CHECKF(slices == st.tasks, "%zu slices for %llu tasks", slices, (unsigned long long)st.tasks);
  CHECK(count(text, "\"ph\":\"s\"") == count(text, "\"ph\":\"f\"") && count(text, "\"ph\":\"s\"") > 0);
  CHECK(count(text, "\"name\":\"thread_name\"") == 3);
  CHECK(strstr(text, "\"ph\":\"C\",\"name\":\"jit_queue_depth\"") != NULL);
  CHECK(strstr(text, "\"request\":\"slot 0 gen 1\"") != NULL);
  CHECK(strstr(text, "\"task_gen\":") != NULL && strstr(text, "\"wait_reason\":") != NULL);
  free(text);

  /* a small buffer drops, and says so */
  CHECK(ms_engine_trace_start(e, 16) == 0);
  decode(e, 2, 6);
  ms_engine_trace_stop(e);
  ms_engine_trace_stats(e, &ts);
  CHECK(ts.records <= 16 * 3 && ts.dropped > 0);
  ms_engine_free(e);
  ms_model_free(m);
  TEST_MAIN_END();
}
