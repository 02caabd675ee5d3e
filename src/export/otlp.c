/* SPDX-License-Identifier: MIT */
/* OTLP/HTTP JSON export of request spans, batched by a background thread.
 *
 * DESIGN
 * Who runs what. Request handlers (HTTP threads) call ms_otlp_add, which copies
 * the span into a bounded queue under a mutex and signals; it never waits for
 * the network, and a full queue drops the span and counts it. One exporter
 * thread takes up to max_batch spans when the oldest has waited flush_ms (or
 * the batch is full, or on shutdown), writes an ExportTraceServiceRequest and
 * POSTs it with libcurl (chosen over a hand-written client: it gets HTTP/1.1
 * right, chunked replies and keep-alive included, and gives per-request
 * timeouts; https endpoints work for free). The engine's workers never touch
 * this code.
 * Ordering. Spans leave in the order they were added. A failed POST (no answer,
 * or a status other than 2xx) drops its batch and counts it; collectors are
 * telemetry, not a durable log.
 * Shutdown. ms_otlp_free sets stop and signals; the thread sends what is
 * queued (each POST bounded by timeout_ms) and exits; it is joined. */
#include <curl/curl.h>
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "megascope/export.h"
#include "megascope/json.h"

struct ms_otlp {
  char url[512], service[64], model[64];
  int flush_ms, max_batch, max_queue, timeout_ms;
  int64_t unix_offset_ns;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  pthread_t thread;
  int started, stop;                 /* under mu */
  struct ms_request_span *q;         /* ring of max_queue, under mu */
  int q_head, q_len;
  uint64_t oldest_ns;                /* when the oldest queued span arrived */
  struct ms_otlp_stats st;           /* under mu */
};

/* ---- the JSON body ---- */

static void hex(char *out, const uint8_t *b, int n) {
  static const char d[] = "0123456789abcdef";
  for (int i = 0; i < n; i++) {
    out[2 * i] = d[b[i] >> 4];
    out[2 * i + 1] = d[b[i] & 15];
  }
  out[2 * n] = '\0';
}

static void time_str(struct ms_json *j, const char *key, uint64_t t, int64_t off) {
  char buf[32];
  snprintf(buf, sizeof buf, "%lld", (long long)((int64_t)t + off));
  ms_json_kstr(j, key, buf);  /* 64-bit integers as decimal strings, as OTLP/JSON allows */
}

static void attr_str(struct ms_json *j, const char *k, const char *v) {
  ms_json_obj_begin(j);
  ms_json_kstr(j, "key", k);
  ms_json_key(j, "value");
  ms_json_obj_begin(j);
  ms_json_kstr(j, "stringValue", v);
  ms_json_obj_end(j);
  ms_json_obj_end(j);
}

static void attr_int(struct ms_json *j, const char *k, long long v) {
  char buf[32];
  snprintf(buf, sizeof buf, "%lld", v);
  ms_json_obj_begin(j);
  ms_json_kstr(j, "key", k);
  ms_json_key(j, "value");
  ms_json_obj_begin(j);
  ms_json_kstr(j, "intValue", buf);
  ms_json_obj_end(j);
  ms_json_obj_end(j);
}

static void span_begin(struct ms_json *j, const struct ms_request_span *s, const uint8_t *span_id,
                       const uint8_t *parent, const char *name, int kind, uint64_t t0, uint64_t t1, int64_t off) {
  char t[33], id[17], p[17];
  hex(t, s->trace_id, 16);
  hex(id, span_id, 8);
  ms_json_obj_begin(j);
  ms_json_kstr(j, "traceId", t);
  ms_json_kstr(j, "spanId", id);
  if (parent) {
    hex(p, parent, 8);
    ms_json_kstr(j, "parentSpanId", p);
  }
  ms_json_kstr(j, "name", name);
  ms_json_kint(j, "kind", kind);
  time_str(j, "startTimeUnixNano", t0, off);
  time_str(j, "endTimeUnixNano", t1, off);
}

static void attr_str_array(struct ms_json *j, const char *k, const char *v) {
  ms_json_obj_begin(j);
  ms_json_kstr(j, "key", k);
  ms_json_key(j, "value");
  ms_json_obj_begin(j);
  ms_json_key(j, "arrayValue");
  ms_json_obj_begin(j);
  ms_json_key(j, "values");
  ms_json_arr_begin(j);
  ms_json_obj_begin(j);
  ms_json_kstr(j, "stringValue", v);
  ms_json_obj_end(j);
  ms_json_arr_end(j);
  ms_json_obj_end(j);
  ms_json_obj_end(j);
  ms_json_obj_end(j);
}

/* The request's span, named as the GenAI conventions say: "{operation} {model}". */
static void write_request(struct ms_json *j, const struct ms_request_span *s, int64_t off) {
  uint64_t end = s->t_done ? s->t_done : s->t_submit;
  const char *op = s->operation[0] ? s->operation : "text_completion";
  char name[sizeof s->operation + sizeof s->request_model + 2];
  snprintf(name, sizeof name, "%s %s", op, s->request_model[0] ? s->request_model : "megascope");
  span_begin(j, s, s->span_id, s->has_parent ? s->parent_span_id : NULL, name, 2 /* SERVER */, s->t_submit, end,
             off);
  ms_json_key(j, "attributes");
  ms_json_arr_begin(j);
  attr_str(j, "megascope.request_id", s->request_id);
  attr_str(j, "gen_ai.operation.name", op);
  attr_str(j, "gen_ai.provider.name", "megascope");
  if (s->request_model[0]) attr_str(j, "gen_ai.request.model", s->request_model);
  if (s->response_model[0]) attr_str(j, "gen_ai.response.model", s->response_model);
  attr_str(j, "gen_ai.response.id", s->request_id);
  if (s->route) attr_str(j, "http.route", s->route);
  attr_int(j, "gen_ai.request.max_tokens", s->max_tokens);
  attr_int(j, "gen_ai.usage.input_tokens", s->n_prompt);  /* cached ones included, as the conventions count */
  attr_int(j, "gen_ai.usage.cache_read.input_tokens", s->n_cached);
  attr_int(j, "gen_ai.usage.output_tokens", s->n_tokens);
  if (s->error) attr_str(j, "error.type", s->finish_reason ? s->finish_reason : "_OTHER");
  attr_str_array(j, "gen_ai.response.finish_reasons", s->finish_reason ? s->finish_reason : "");
  if (s->slot >= 0) {  /* (slot, generation) names the request in monitors' maps and the trace */
    attr_int(j, "megascope.slot", s->slot);
    attr_int(j, "megascope.request_generation", s->generation);
  }
  ms_json_arr_end(j);
  ms_json_key(j, "events");
  ms_json_arr_begin(j);
  static const char *const names[] = {"admitted", "first_token", "finished"};
  uint64_t ts[] = {s->t_admit, s->t_first, s->t_done};
  for (int k = 0; k < 3; k++) {
    if (!ts[k]) continue;
    ms_json_obj_begin(j);
    time_str(j, "timeUnixNano", ts[k], off);
    ms_json_kstr(j, "name", names[k]);
    ms_json_obj_end(j);
  }
  ms_json_arr_end(j);
  ms_json_key(j, "status");
  ms_json_obj_begin(j);
  ms_json_kint(j, "code", s->error ? 2 : 1);  /* STATUS_CODE_ERROR / OK */
  if (s->error) ms_json_kstr(j, "message", s->finish_reason ? s->finish_reason : "failed");
  ms_json_obj_end(j);
  ms_json_obj_end(j);
  /* the phases, as children: queued, prefill, decode */
  static const char *const phase[] = {"queued", "prefill", "decode"};
  uint64_t from[] = {s->t_submit, s->t_admit, s->t_first}, to[] = {s->t_admit, s->t_first, s->t_done};
  for (int k = 0; k < 3; k++) {
    if (!from[k] || !to[k] || to[k] < from[k]) continue;
    uint8_t id[8];
    memcpy(id, s->span_id, 8);
    id[7] ^= (uint8_t)(k + 1);  /* unique within the request's trace */
    span_begin(j, s, id, s->span_id, phase[k], 1 /* INTERNAL */, from[k], to[k], off);
    ms_json_obj_end(j);
  }
}

int ms_otlp_write_json(FILE *f, const char *service_name, const char *model_name, const struct ms_request_span *s,
                       int n, int64_t unix_offset_ns) {
  struct ms_json j;
  ms_json_init(&j, f, 0);
  ms_json_obj_begin(&j);
  ms_json_key(&j, "resourceSpans");
  ms_json_arr_begin(&j);
  ms_json_obj_begin(&j);
  ms_json_key(&j, "resource");
  ms_json_obj_begin(&j);
  ms_json_key(&j, "attributes");
  ms_json_arr_begin(&j);
  attr_str(&j, "service.name", service_name ? service_name : "megascope");
  if (model_name && model_name[0]) attr_str(&j, "megascope.model", model_name);
  ms_json_arr_end(&j);
  ms_json_obj_end(&j);
  ms_json_key(&j, "scopeSpans");
  ms_json_arr_begin(&j);
  ms_json_obj_begin(&j);
  ms_json_key(&j, "scope");
  ms_json_obj_begin(&j);
  ms_json_kstr(&j, "name", "megascope");
  ms_json_kstr(&j, "version", "1");
  ms_json_obj_end(&j);
  ms_json_key(&j, "spans");
  ms_json_arr_begin(&j);
  for (int i = 0; i < n; i++) write_request(&j, &s[i], unix_offset_ns);
  ms_json_arr_end(&j);
  ms_json_obj_end(&j);
  ms_json_arr_end(&j);
  ms_json_obj_end(&j);
  ms_json_arr_end(&j);
  ms_json_obj_end(&j);
  ms_json_end(&j);
  return ferror(f) ? -EIO : 0;
}

/* ---- sending ---- */

static size_t discard(char *p, size_t size, size_t n, void *user) { return size * n; }

/* POSTs body; returns the HTTP status, or 0 when there was no answer. */
static long post(struct ms_otlp *x, CURL *curl, const char *body, size_t len, int *cerr) {
  struct curl_slist *h = curl_slist_append(NULL, "Content-Type: application/json");
  curl_easy_reset(curl);
  curl_easy_setopt(curl, CURLOPT_URL, x->url);
  curl_easy_setopt(curl, CURLOPT_HTTPHEADER, h);
  curl_easy_setopt(curl, CURLOPT_POSTFIELDS, body);
  curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)len);
  curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, (long)x->timeout_ms);
  curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS, (long)x->timeout_ms);
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, discard);
  curl_easy_setopt(curl, CURLOPT_PROTOCOLS_STR, "http,https");
  long status = 0;
  CURLcode cc = curl_easy_perform(curl);
  *cerr = (int)cc;
  if (cc == CURLE_OK) curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &status);
  curl_slist_free_all(h);
  return status;
}

static void *exporter_main(void *arg) {
  struct ms_otlp *x = arg;
  CURL *curl = curl_easy_init();
  struct ms_request_span *batch = malloc(sizeof *batch * (size_t)x->max_batch);
  pthread_mutex_lock(&x->mu);
  for (;;) {
    while (!x->stop && (x->q_len == 0 || (x->q_len < x->max_batch &&
                                          ms_now_ns() < x->oldest_ns + (uint64_t)x->flush_ms * 1000000ull))) {
      /* until the oldest span is due (ms_now_ns is CLOCK_MONOTONIC, the cv's clock) */
      uint64_t due = (x->q_len ? x->oldest_ns : ms_now_ns()) + (uint64_t)x->flush_ms * 1000000ull;
      struct timespec ts = {(time_t)(due / 1000000000ull), (long)(due % 1000000000ull)};
      pthread_cond_timedwait(&x->cv, &x->mu, &ts);
    }
    if (x->q_len == 0) break;  /* stopping, nothing left */
    int n = x->q_len < x->max_batch ? x->q_len : x->max_batch;
    for (int i = 0; i < n && batch; i++) batch[i] = x->q[(x->q_head + i) % x->max_queue];
    x->q_head = (x->q_head + n) % x->max_queue;
    x->q_len -= n;
    x->oldest_ns = ms_now_ns();
    pthread_mutex_unlock(&x->mu);
    char *body = NULL;
    size_t len = 0;
    long status = 0;
    int cerr = 0;
    FILE *f = batch && curl ? open_memstream(&body, &len) : NULL;
    if (f) {
      int rc = ms_otlp_write_json(f, x->service, x->model, batch, n, x->unix_offset_ns);
      if (!fclose(f) && !rc) status = post(x, curl, body, len, &cerr);
    }
    free(body);
    pthread_mutex_lock(&x->mu);
    x->st.posts++;
    x->st.last_status = status;
    if (status >= 200 && status < 300) {
      x->st.exported += (uint64_t)n;
    } else {
      x->st.failed_posts++;
      x->st.dropped += (uint64_t)n;
      if (x->st.failed_posts == 1 || x->st.failed_posts % 100 == 0)
        ms_logf(MS_LOG_WARN, "otlp: POST %s: %s %ld; %d requests' spans dropped (%llu failed posts so far)",
                x->url, status ? "HTTP status" : "no answer, curl error", status ? status : (long)cerr, n,
                (unsigned long long)x->st.failed_posts);
    }
  }
  pthread_mutex_unlock(&x->mu);
  free(batch);
  if (curl) curl_easy_cleanup(curl);
  return NULL;
}

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static void curl_init_once(void) { curl_global_init(CURL_GLOBAL_DEFAULT); }

struct ms_otlp *ms_otlp_new(const struct ms_otlp_opts *o, struct ms_textbuf *log) {
  if (!o || o->sz < sizeof *o || !o->url) {
    errno = EINVAL;
    return NULL;
  }
  if (strncmp(o->url, "http://", 7) && strncmp(o->url, "https://", 8)) {
    ms_textbuf_printf(log, "otlp: endpoint '%s' is not an http:// or https:// URL\n", o->url);
    errno = EINVAL;
    return NULL;
  }
  if (strlen(o->url) >= sizeof((struct ms_otlp *)0)->url) {
    ms_textbuf_printf(log, "otlp: endpoint URL too long\n");
    errno = ENAMETOOLONG;
    return NULL;
  }
  pthread_once(&curl_once, curl_init_once);
  struct ms_otlp *x = calloc(1, sizeof *x);
  if (!x) return NULL;
  snprintf(x->url, sizeof x->url, "%s", o->url);
  snprintf(x->service, sizeof x->service, "%s", o->service_name ? o->service_name : "megascope");
  snprintf(x->model, sizeof x->model, "%s", o->model_name ? o->model_name : "");
  x->flush_ms = o->flush_ms > 0 ? o->flush_ms : 1000;
  x->max_batch = o->max_batch > 0 ? o->max_batch : 256;
  x->max_queue = o->max_queue > 0 ? o->max_queue : 8192;
  x->timeout_ms = o->timeout_ms > 0 ? o->timeout_ms : 2000;
  struct timespec rt;
  clock_gettime(CLOCK_REALTIME, &rt);
  x->unix_offset_ns = (int64_t)rt.tv_sec * 1000000000ll + rt.tv_nsec - (int64_t)ms_now_ns();
  pthread_mutex_init(&x->mu, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&x->cv, &ca);
  pthread_condattr_destroy(&ca);
  int rc;
  if (!(x->q = calloc((size_t)x->max_queue, sizeof *x->q))) {
    rc = ENOMEM;
    goto fail;
  }
  if ((rc = pthread_create(&x->thread, NULL, exporter_main, x))) {
    ms_textbuf_printf(log, "otlp: cannot start the exporter thread: %s\n", strerror(rc));
    goto fail;
  }
  x->started = 1;
  return x;
fail:
  ms_otlp_free(x);
  errno = rc;
  return NULL;
}

void ms_otlp_free(struct ms_otlp *x) {
  if (!x) return;
  if (x->started) {
    pthread_mutex_lock(&x->mu);
    x->stop = 1;
    pthread_cond_signal(&x->cv);
    pthread_mutex_unlock(&x->mu);
    pthread_join(x->thread, NULL);
  }
  pthread_cond_destroy(&x->cv);
  pthread_mutex_destroy(&x->mu);
  free(x->q);
  free(x);
}

int ms_otlp_add(struct ms_otlp *x, const struct ms_request_span *s) {
  struct ms_request_span c = *s;
  static const uint8_t zero[16];
  if (!memcmp(c.trace_id, zero, 16) && getrandom(c.trace_id, 16, 0) != 16) c.trace_id[0] = 1;
  if (!memcmp(c.span_id, zero, 8) && getrandom(c.span_id, 8, 0) != 8) c.span_id[0] = 1;
  c.span_id[7] &= 0xf0;  /* the low bits number the phase spans */
  if (!c.span_id[0]) c.span_id[0] = 1;
  pthread_mutex_lock(&x->mu);
  int rc = 0;
  if (x->q_len == x->max_queue || x->stop) {
    x->st.dropped++;
    rc = -ENOSPC;
  } else {
    if (!x->q_len) x->oldest_ns = ms_now_ns();
    x->q[(x->q_head + x->q_len) % x->max_queue] = c;
    x->q_len++;
    x->st.queued++;
    if (x->q_len >= x->max_batch) pthread_cond_signal(&x->cv);
  }
  pthread_mutex_unlock(&x->mu);
  return rc;
}

void ms_otlp_get_stats(const struct ms_otlp *x, struct ms_otlp_stats *out) {
  struct ms_otlp *m = (struct ms_otlp *)x;
  pthread_mutex_lock(&m->mu);
  *out = m->st;
  pthread_mutex_unlock(&m->mu);
}

static int hexval(char c) {
  return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;  /* lower case only, as W3C says */
}

static int unhex(const char *s, uint8_t *out, int n) {
  int any = 0;
  for (int i = 0; i < n; i++) {
    int hi = hexval(s[2 * i]), lo = hexval(s[2 * i + 1]);
    if (hi < 0 || lo < 0) return -EINVAL;
    out[i] = (uint8_t)(hi << 4 | lo);
    any |= out[i];
  }
  return any ? 0 : -EINVAL;
}

int ms_otlp_traceparent(const char *h, struct ms_request_span *s) {
  /* version "00": 2 + 1 + 32 + 1 + 16 + 1 + 2 = 55 characters; later versions may append fields */
  if (!h || strlen(h) < 55 || h[2] != '-' || h[35] != '-' || h[52] != '-' || !strncmp(h, "ff", 2) ||
      hexval(h[0]) < 0 || hexval(h[1]) < 0 || (!strncmp(h, "00", 2) && h[55] != '\0'))
    return -EINVAL;
  uint8_t trace[16], parent[8];
  if (unhex(h + 3, trace, 16) || unhex(h + 36, parent, 8)) return -EINVAL;
  memcpy(s->trace_id, trace, 16);
  memcpy(s->parent_span_id, parent, 8);
  s->has_parent = 1;
  return 0;
}
