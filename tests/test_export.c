/* SPDX-License-Identifier: MIT */
/* Exports: the Prometheus page follows the text format 0.0.4 (HELP and TYPE
 * before a family's samples, each family one group, histogram buckets
 * cumulative up to +Inf = _count, escaped label values), its counters never go
 * down (coverage across a replace included); the OTLP body has the shape of an
 * ExportTraceServiceRequest (hex ids, string nanoseconds, integer enums, child
 * spans pointing at their parent); the OTLP exporter never blocks its caller and
 * counts what a dead collector costs. */
#include <errno.h>
#include <jansson.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "megascope/bpf_jit.h"
#include "megascope/engine.h"
#include "megascope/export.h"
#include "megascope/attach.h"
#include "test.h"

static void decode(struct ms_engine *e, int n, int tokens) {
  struct ms_request *r[8];
  for (int i = 0; i < n && i < 8; i++) {
    int32_t p[2] = {3 + i, 11};
    struct ms_request_opts ro = {.sz = sizeof ro, .prompt = p, .n_prompt = 1 + i % 2, .max_new_tokens = tokens};
    r[i] = ms_engine_submit(e, &ro);
  }
  for (int i = 0; i < n && i < 8; i++) {
    ms_request_wait(r[i], -1);
    ms_request_free(r[i]);
  }
}

static char *metrics(struct ms_engine *e) {
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  CHECK(ms_prometheus_write_engine(e, f) == 0);
  fclose(f);
  return buf;
}

/* The value of the sample line that starts with `series ` (NaN if none). */
static double sample(const char *page, const char *series) {
  size_t n = strlen(series);
  for (const char *p = page; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL)
    if (!strncmp(p, series, n) && p[n] == ' ') return strtod(p + n + 1, NULL);
  return 0.0 / 0.0;
}

/* Checks the page's structure line by line. */
static void check_format(const char *page) {
  char family[128] = "", type[32] = "", seen[256][128];
  int n_seen = 0, bad = 0;
  double last_bucket = -1;
  const char *p = page;
  CHECK(page[strlen(page) - 1] == '\n');
  while (*p) {
    const char *e = strchr(p, '\n');
    size_t len = e ? (size_t)(e - p) : strlen(p);
    char line[1024];
    snprintf(line, sizeof line, "%.*s", (int)(len < sizeof line ? len : sizeof line - 1), p);
    p += len + (e ? 1 : 0);
    char name[128], t[32];
    if (sscanf(line, "# HELP %127s", name) == 1) {
      for (int i = 0; i < n_seen; i++) bad += !strcmp(seen[i], name);  /* one group per family */
      if (n_seen < 256) snprintf(seen[n_seen++], 128, "%s", name);
      snprintf(family, sizeof family, "%s", name);
      type[0] = '\0';
      last_bucket = -1;
      continue;
    }
    if (sscanf(line, "# TYPE %127s %31s", name, t) == 2) {
      bad += strcmp(name, family) != 0;
      snprintf(type, sizeof type, "%s", t);
      continue;
    }
    /* a sample: its name is the family's (+ _bucket/_sum/_count for histograms) */
    size_t k = strcspn(line, "{ ");
    snprintf(name, sizeof name, "%.*s", (int)k, line);
    int ok = !strcmp(name, family);
    if (!strcmp(type, "histogram")) {
      char b[160];
      snprintf(b, sizeof b, "%s_bucket", family);
      if (!strcmp(name, b)) {
        double v = strtod(strrchr(line, ' ') + 1, NULL);
        bad += v < last_bucket;  /* cumulative */
        last_bucket = v;
        ok = 1;
      }
      snprintf(b, sizeof b, "%s_sum", family);
      ok |= !strcmp(name, b);
      snprintf(b, sizeof b, "%s_count", family);
      if (!strcmp(name, b)) {
        ok = 1;
        bad += strtod(strrchr(line, ' ') + 1, NULL) != last_bucket;  /* +Inf == _count */
      }
    }
    if (!strcmp(type, "counter")) ok &= strlen(name) > 6 && !strcmp(name + strlen(name) - 6, "_total");
    if (!ok || !type[0]) {
      fprintf(stderr, "bad sample line (family %s, type %s): %s\n", family, type, line);
      bad++;
    }
  }
  CHECK(bad == 0);
}

static void test_prometheus(const char *mons) {
  struct ms_model_config cfg;
  ms_preset_config("tiny", MS_DTYPE_F32, &cfg);
  struct ms_model *m = ms_model_synth(&cfg, 1);
  struct ms_engine_opts eo = {.sz = sizeof eo, .n_workers = 2, .max_batch = 4, .max_ctx = 64};
  struct ms_engine *e = ms_engine_new(m, &eo, NULL);
  decode(e, 4, 8);
  char *page = metrics(e);
  check_format(page);
  CHECK(sample(page, "megascope_ttft_seconds_count") == 4);
  CHECK(sample(page, "megascope_ttft_seconds_bucket{le=\"+Inf\"}") == 4);
  CHECK(sample(page, "megascope_tokens_generated_total") == 32);
  CHECK(sample(page, "megascope_class_tasks_total{class=\"blk.0.qkv\"}") > 0);
  CHECK(sample(page, "megascope_class_dep_wait_seconds_total{class=\"blk.1.attn\"}") >= 0);
  CHECK(strstr(page, "# TYPE megascope_tpot_seconds histogram\n") != NULL);
  CHECK(strstr(page, "megascope_event_class_dep_wait_seconds_total{event_class=\"") != NULL);

  /* coverage counters carry the attachment's id, generation and monitor: a
   * replace starts the new generation's series and leaves the old one's */
  char f1[512], f2[512];
  snprintf(f1, sizeof f1, "%s/class_time.bpf.o", mons);
  snprintf(f2, sizeof f2, "%s/queueing.bpf.o", mons);
  struct ms_monitor *a = ms_monitor_open(f1, NULL), *b = ms_monitor_open(f2, NULL);
  if (a && b) {
    struct ms_attach_opts ao = {.sz = sizeof ao};
    int id = ms_engine_attach(e, a, &ao, NULL);
    CHECK(id > 0);
    decode(e, 2, 6);
    free(page);
    page = metrics(e);
    check_format(page);
    char series[160], old1[160];
    snprintf(old1, sizeof old1,
             "megascope_attachment_eligible_total{id=\"%d\",generation=\"1\",monitor=\"class_time.bpf.o\"}", id);
    double before = sample(page, old1);
    CHECK(before > 0);
    CHECK(ms_engine_replace(e, id, b, NULL) == 0);
    b = NULL;
    decode(e, 2, 6);
    free(page);
    page = metrics(e);
    check_format(page);
    snprintf(series, sizeof series,
             "megascope_attachment_eligible_total{id=\"%d\",generation=\"2\",monitor=\"queueing.bpf.o\"}", id);
    double fresh = sample(page, series), old = sample(page, old1);
    CHECKF(fresh > 0, "%g for generation 2", fresh);
    CHECKF(old >= before, "generation 1: %g after the replace, %g before", old, before);
    /* generation 2's counts are not under generation 1's labels */
    snprintf(series, sizeof series, "megascope_attachment_eligible_total{id=\"%d\",generation=\"1\",monitor=\"queueing",
             id);
    CHECK(strstr(page, series) == NULL);
    snprintf(series, sizeof series,
             "megascope_attachment_generation{id=\"%d\",generation=\"2\",monitor=\"queueing.bpf.o\"}", id);
    CHECK(sample(page, series) == 2);
    /* queueing has one program, JIT-compiled where this host has the JIT */
    snprintf(series, sizeof series,
             "megascope_attachment_jitted_programs{id=\"%d\",generation=\"2\",monitor=\"queueing.bpf.o\"}", id);
    CHECKF(sample(page, series) == (ms_bpf_jit_supported() ? 1 : 0), "%g", sample(page, series));
    /* every coverage series is its own figure: one firing in 4 run, so
     * throttled is not 0 and differs from failed and lost */
    struct ms_monitor *c = ms_monitor_open(f1, NULL);
    struct ms_attach_opts so = {.sz = sizeof so, .sample_every = 4};
    int sid = c ? ms_engine_attach(e, c, &so, NULL) : -1;
    CHECK(sid > 0);
    decode(e, 2, 6);
    struct ms_coverage cov;
    CHECK(sid > 0 && ms_engine_attach_coverage(e, sid, 0, &cov) == 0);
    free(page);
    page = metrics(e);
    static const char *const cov_names[] = {"eligible", "executed", "throttled", "lost", "failed"};
    const uint64_t cov_values[] = {cov.eligible, cov.executed, cov.throttled, cov.lost, cov.failed};
    CHECKF(cov.throttled > 0 && cov.executed > 0, "sampled 1 in 4: throttled %llu", (unsigned long long)cov.throttled);
    for (int k = 0; k < 5; k++) {
      snprintf(series, sizeof series,
               "megascope_attachment_%s_total{id=\"%d\",generation=\"1\",monitor=\"class_time.bpf.o\"}", cov_names[k],
               sid);
      CHECKF(sample(page, series) == (double)cov_values[k], "%s: %g, coverage %llu", cov_names[k],
             sample(page, series), (unsigned long long)cov_values[k]);
    }
    /* a write that fails is an error, not a short page */
    FILE *full = fopen("/dev/full", "w");
    if (full) {
      setvbuf(full, NULL, _IONBF, 0);
      CHECK(ms_prometheus_write_engine(e, full) == -EIO);
      fclose(full);
    } else {
      SKIP_PART("no /dev/full: a failed write not checked");
    }
  } else {
    SKIP_PART("no shipped monitors in %s: the coverage metrics not checked", mons);
    ms_monitor_free(a);
  }
  ms_monitor_free(b);
  free(page);
  ms_engine_free(e);
  ms_model_free(m);

  /* escaping */
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  ms_prometheus_label_value(f, "a\"b\\c\nd");
  ms_prometheus_family(f, "x_total", "counter", "back\\slash\nnewline");
  fclose(f);
  CHECK(!strcmp(buf, "\"a\\\"b\\\\c\\nd\"# HELP x_total back\\\\slash\\nnewline\n# TYPE x_total counter\n"));
  free(buf);
}

static void test_otlp_json(void) {
  struct ms_request_span s[2] = {
      {.request_id = "cmpl-1", .route = "/v1/completions", .n_prompt = 5, .n_tokens = 8, .max_tokens = 8,
       .slot = 1, .generation = 3, .finish_reason = "length", .t_submit = 1000, .t_admit = 2000, .t_first = 5000,
       .t_done = 9000, .trace_id = {1, 2, 3}, .span_id = {0xab, 0, 0, 0, 0, 0, 0, 0x10}},
      {.request_id = "cmpl-2", .n_prompt = 1, .finish_reason = "cancelled", .error = 1, .t_submit = 100,
       .t_done = 200, .trace_id = {9}, .span_id = {7}},
  };
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  CHECK(ms_otlp_write_json(f, "svc", "tiny", s, 2, 1700000000000000000ll) == 0);
  fclose(f);
  json_error_t err;
  json_t *j = json_loadb(buf, len, 0, &err);
  CHECKF(j != NULL, "%s", err.text);
  json_t *rs = json_array_get(json_object_get(j, "resourceSpans"), 0);
  json_t *attrs = json_object_get(json_object_get(rs, "resource"), "attributes");
  CHECK(!strcmp(json_string_value(json_object_get(json_array_get(attrs, 0), "key")), "service.name"));
  json_t *spans = json_object_get(json_array_get(json_object_get(rs, "scopeSpans"), 0), "spans");
  CHECK(json_array_size(spans) == 5);  /* 1 + 3 phases, 1 + 0 (never admitted) */
  json_t *root = json_array_get(spans, 0);
  CHECK(!strcmp(json_string_value(json_object_get(root, "traceId")), "01020300000000000000000000000000"));
  CHECK(!strcmp(json_string_value(json_object_get(root, "spanId")), "ab00000000000010"));
  CHECK(!strcmp(json_string_value(json_object_get(root, "name")), "text_completion megascope"));
  CHECK(json_integer_value(json_object_get(root, "kind")) == 2);
  CHECK(!strcmp(json_string_value(json_object_get(root, "startTimeUnixNano")), "1700000000000001000"));
  CHECK(!strcmp(json_string_value(json_object_get(root, "endTimeUnixNano")), "1700000000000009000"));
  json_t *ev = json_object_get(root, "events");
  CHECK(json_array_size(ev) == 3);
  CHECK(!strcmp(json_string_value(json_object_get(json_array_get(ev, 1), "name")), "first_token"));
  CHECK(!strcmp(json_string_value(json_object_get(json_array_get(ev, 1), "timeUnixNano")), "1700000000000005000"));
  for (int k = 1; k <= 3; k++) {
    json_t *c = json_array_get(spans, (size_t)k);
    CHECK(!strcmp(json_string_value(json_object_get(c, "parentSpanId")), "ab00000000000010"));
    CHECK(strcmp(json_string_value(json_object_get(c, "spanId")), "ab00000000000010") != 0);
  }
  CHECK(!strcmp(json_string_value(json_object_get(json_array_get(spans, 2), "name")), "prefill"));
  json_t *failed = json_array_get(spans, 4);
  CHECK(json_integer_value(json_object_get(json_object_get(failed, "status"), "code")) == 2);
  json_decref(j);
  free(buf);
}

/* A collector that is not there: adding never blocks, failures are counted. */
/* W3C traceparent: a valid header continues the trace, malformed ones are refused. */
static void test_traceparent(void) {
  struct ms_request_span s = {0};
  CHECK(ms_otlp_traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", &s) == 0);
  CHECK(s.has_parent && s.trace_id[0] == 0x4b && s.trace_id[15] == 0x36 && s.parent_span_id[7] == 0xb7);
  static const char *const bad[] = {
      "",  "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",     /* no flags */
      "00-00000000000000000000000000000000-00f067aa0ba902b7-01",      /* zero trace */
      "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",      /* zero parent */
      "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",      /* upper case */
      "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",      /* version ff */
      "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra", /* version 00 has no more */
      "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    struct ms_request_span t = {0};
    CHECKF(ms_otlp_traceparent(bad[i], &t) == -EINVAL && !t.has_parent, "'%s' accepted", bad[i]);
  }
  CHECK(ms_otlp_traceparent(NULL, &s) == -EINVAL);
}

static void test_otlp_dead_collector(void) {
  int s = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t sl = sizeof sa;
  bind(s, (struct sockaddr *)&sa, sizeof sa);
  getsockname(s, (struct sockaddr *)&sa, &sl);
  close(s);  /* a port nobody listens on */
  char url[128];
  snprintf(url, sizeof url, "http://127.0.0.1:%d/v1/traces", ntohs(sa.sin_port));
  struct ms_otlp_opts o = {.sz = sizeof o, .url = url, .flush_ms = 20, .max_queue = 4, .timeout_ms = 500};
  struct ms_otlp *x = ms_otlp_new(&o, NULL);
  CHECK(x != NULL);
  struct ms_request_span sp = {.request_id = "r", .t_submit = 1, .t_done = 2};
  int refused = 0;
  for (int i = 0; i < 100; i++) refused += ms_otlp_add(x, &sp) == -ENOSPC;
  CHECK(refused > 0);  /* a full queue refuses at once instead of waiting */
  struct ms_otlp_stats st = {0};
  for (int i = 0; i < 500 && !st.failed_posts; i++) {
    usleep(10000);
    ms_otlp_get_stats(x, &st);
  }
  CHECK(st.failed_posts >= 1 && st.exported == 0 && st.last_status == 0);
  CHECK(st.dropped >= (uint64_t)refused && st.queued + (uint64_t)refused == 100);
  ms_otlp_free(x);  /* tries what is left, fails, stops */

  struct ms_otlp_opts bad = {.sz = sizeof bad, .url = "ftp://x"};
  CHECK(ms_otlp_new(&bad, NULL) == NULL && errno == EINVAL);
}

int main(void) {
  const char *mons = getenv("MS_MONITORS") ? getenv("MS_MONITORS") : "build/monitors";
  test_prometheus(mons);
  test_otlp_json();
  test_traceparent();
  test_otlp_dead_collector();
  TEST_MAIN_END();
}
