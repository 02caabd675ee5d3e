/* SPDX-License-Identifier: MIT */
/* Built-in telemetry: latency histograms count every finished request, the
 * always-on aggregate counts every task, the trace records every task (or counts
 * what it drops) and writes Chrome JSON with slices, flows and counters. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "megascope/telemetry.h"
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

int main(void) {
  struct ms_model *m = tiny();
  struct ms_engine_opts o = {.sz = sizeof o, .n_workers = 3, .max_batch = 4, .max_ctx = 128};
  struct ms_engine *e = ms_engine_new(m, &o, NULL);
  CHECK(ms_engine_trace_write(e, stdout) == 0 || 1);  /* nothing recorded yet: harmless */
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
