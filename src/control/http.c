/* SPDX-License-Identifier: MIT */
/* The HTTP front door of a serving engine (libmicrohttpd): the OpenAI API as
 * clients use it (POST /v1/completions and /v1/chat/completions, streamed or
 * not; GET /v1/models), llama-server's /tokenize, /detokenize and /health,
 * and GET /metrics in the Prometheus text format.
 *
 * DESIGN
 * Who runs what. libmicrohttpd runs one thread per connection (plus its
 * listening thread). A generation handler parses the body into a job
 * (openai.c), submits one engine request per choice (generate.c) and waits on
 * them in slices of 100 ms; the engine's continuous batching puts the requests
 * of all connections into shared decode steps. A streamed answer is produced
 * by libmicrohttpd's content reader, which blocks in the connection's thread
 * until the next tokens are sampled and returns their events. Between slices
 * a handler checks whether its client has gone (the socket reads EOF or hangs
 * up) and whether the server is stopping; either cancels the job, which frees
 * its slots and KV pages at the next step start.
 * Shutdown. ms_http_drain raises `draining` (new jobs get 503), waits for the
 * jobs in flight, then raises `stopping`: jobs still running are cancelled and
 * answered 503 (or an error event). ms_http_free then stops the daemon, which
 * joins the connection threads. Counters are atomics (statistics only); the
 * latency histograms are under `mu`, never taken by an engine thread. */
#include <arpa/inet.h>
#include <errno.h>
#include <jansson.h>
#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "control/openai.h"
#include "megascope/control.h"
#include "megascope/export.h"
#include "megascope/json.h"
#include "megascope/telemetry.h"
#include "megascope/tokenizer.h"

#define MAX_BODY (1u << 20)
#define SLICE_MS 100

enum { FIN_STOP, FIN_LENGTH, FIN_ABORT, FIN_COUNT };
static const char *const fin_names[FIN_COUNT] = {"stop", "length", "abort"};

struct ms_http {
  struct ms_engine *e;
  struct MHD_Daemon *d;
  struct oa_env env;
  struct ms_otlp *otlp;
  struct ms_control *control;
  char model[64], host[80], api_key[256];
  int port, has_key;
  _Atomic int draining, stopping;
  _Atomic uint64_t next_id, completions, rejected, scrapes, in_flight, cancelled;
  _Atomic uint64_t prompt_tokens, generation_tokens, finished[FIN_COUNT];
  pthread_mutex_t mu;  /* the histograms below */
  struct ms_histogram e2e, queue, prefill, decode;
};

struct body {
  char *buf;
  size_t len;
  int too_big;
};

/* ---- responses ---- */

static enum MHD_Result respond(struct MHD_Connection *conn, unsigned status, const char *type, char *buf,
                               size_t len) {
  struct MHD_Response *r = MHD_create_response_from_buffer(len, buf, MHD_RESPMEM_MUST_FREE);
  if (!r) {
    free(buf);
    return MHD_NO;
  }
  MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
  enum MHD_Result rc = MHD_queue_response(conn, status, r);
  MHD_destroy_response(r);
  return rc;
}

/* An OpenAI-shaped error: {"error": {"message", "type", "param", "code"}}. */
static enum MHD_Result respond_error_p(struct ms_http *h, struct MHD_Connection *conn, unsigned status,
                                       const char *param, const char *code, const char *fmt, ...) {
  char msg[768];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  atomic_fetch_add_explicit(&h->rejected, 1, memory_order_relaxed);
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  if (!f) return MHD_NO;
  oa_write_error(f, status, msg, param, code);
  if (fclose(f)) {
    free(buf);
    return MHD_NO;
  }
  return respond(conn, status, "application/json", buf, len);
}

#define respond_error(h, conn, status, ...) respond_error_p(h, conn, status, NULL, NULL, __VA_ARGS__)

/* A JSON answer built by fn into a memory stream. */
static enum MHD_Result respond_json(struct MHD_Connection *conn, void (*fn)(struct ms_http *, FILE *, void *),
                                    struct ms_http *h, void *arg) {
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  if (!f) return MHD_NO;
  fn(h, f, arg);
  if (fclose(f)) {
    free(buf);
    return MHD_NO;
  }
  return respond(conn, 200, "application/json", buf, len);
}

/* The client has closed its end (EOF or hang-up on the socket). */
static int client_gone(struct MHD_Connection *conn) {
  const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
  if (!ci) return 0;
  struct pollfd p = {.fd = ci->connect_fd, .events = POLLIN | POLLRDHUP};
  if (poll(&p, 1, 0) <= 0) return 0;
  if (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) return 1;
  char c;
  return recv(ci->connect_fd, &c, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
}

/* ---- what a finished choice reports ---- */

static double secs(uint64_t from, uint64_t to) { return from && to > from ? (double)(to - from) / 1e9 : 0.0; }

static void on_request_done(void *user, const struct oa_gen *g, int choice, const struct ms_request_info *info,
                            const char *finish) {
  struct ms_http *h = user;
  uint64_t now = ms_now_ns(), done = info->t_done ? info->t_done : now;
  int fin = !finish ? FIN_ABORT : !strcmp(finish, "length") ? FIN_LENGTH : FIN_STOP;
  atomic_fetch_add_explicit(&h->finished[fin], 1, memory_order_relaxed);
  atomic_fetch_add_explicit(&h->generation_tokens, (uint64_t)info->n_tokens, memory_order_relaxed);
  atomic_fetch_add_explicit(&h->prompt_tokens, (uint64_t)info->n_prompt, memory_order_relaxed);
  if (!finish) atomic_fetch_add_explicit(&h->cancelled, 1, memory_order_relaxed);
  pthread_mutex_lock(&h->mu);
  ms_histogram_observe(&h->e2e, secs(info->t_submit, done));
  if (info->t_admit) ms_histogram_observe(&h->queue, secs(info->t_submit, info->t_admit));
  if (info->t_first) ms_histogram_observe(&h->prefill, secs(info->t_admit, info->t_first));
  if (info->t_first) ms_histogram_observe(&h->decode, secs(info->t_first, done));
  pthread_mutex_unlock(&h->mu);
  if (!h->otlp) return;
  struct ms_request_span s = {.route = oa_gen_is_chat(g) ? "/v1/chat/completions" : "/v1/completions",
                              .n_prompt = info->n_prompt, .n_tokens = info->n_tokens,
                              .max_tokens = oa_gen_max_tokens(g), .slot = info->slot, .generation = info->generation,
                              .finish_reason = finish ? finish : "cancelled", .error = !finish,
                              .t_submit = info->t_submit, .t_admit = info->t_admit, .t_first = info->t_first,
                              .t_done = done};
  if (choice > 0)  /* the n choices of one request: one span each */
    snprintf(s.request_id, sizeof s.request_id, "%.36s-%d", oa_gen_id(g), choice % 1000);
  else
    snprintf(s.request_id, sizeof s.request_id, "%s", oa_gen_id(g));
  snprintf(s.operation, sizeof s.operation, "%s", oa_gen_is_chat(g) ? "chat" : "text_completion");
  snprintf(s.request_model, sizeof s.request_model, "%s", h->model);
  snprintf(s.response_model, sizeof s.response_model, "%s", h->model);
  const struct ms_request_span *tp = oa_gen_traceparent(g);
  if (tp && tp->has_parent) {
    memcpy(s.trace_id, tp->trace_id, 16);
    memcpy(s.parent_span_id, tp->parent_span_id, 8);
    s.has_parent = 1;
  }
  ms_otlp_add(h->otlp, &s);
}

/* ---- generation ---- */

struct stream {
  struct ms_http *h;
  struct MHD_Connection *conn;
  struct oa_gen *g;
  char *buf;
  size_t len, off;
  int finished;
};

/* One slice of a stream's production into s->buf: new events, or the end. */
static void stream_produce(struct stream *s) {
  free(s->buf);
  s->buf = NULL;
  s->len = s->off = 0;
  FILE *f = open_memstream(&s->buf, &s->len);
  if (!f) return;
  if (atomic_load_explicit(&s->h->stopping, memory_order_acquire)) {
    oa_gen_cancel(s->g);
    oa_gen_write_abort(s->g, f, "the server is shutting down; the request was not finished");
    s->finished = 1;
  } else if (oa_gen_pump(s->g, f, SLICE_MS)) {
    if (oa_gen_failed(s->g)) oa_gen_write_abort(s->g, f, "the request was cancelled by the engine");
    s->finished = 1;
  }
  fclose(f);
}

static ssize_t stream_read(void *cls, uint64_t pos, char *out, size_t max) {
  struct stream *s = cls;
  while (s->off == s->len) {
    if (s->finished) return MHD_CONTENT_READER_END_OF_STREAM;
    if (client_gone(s->conn)) return MHD_CONTENT_READER_END_WITH_ERROR;  /* stream_free cancels */
    stream_produce(s);
    if (!s->buf) return MHD_CONTENT_READER_END_WITH_ERROR;
  }
  size_t n = s->len - s->off < max ? s->len - s->off : max;
  memcpy(out, s->buf + s->off, n);
  s->off += n;
  return (ssize_t)n;
}

static void stream_free(void *cls) {
  struct stream *s = cls;
  oa_gen_cancel(s->g);  /* a client that left: its choices stop at the next step */
  oa_gen_free(s->g);
  atomic_fetch_sub_explicit(&s->h->in_flight, 1, memory_order_relaxed);
  free(s->buf);
  free(s);
}

static enum MHD_Result stream_answer(struct ms_http *h, struct MHD_Connection *conn, struct oa_gen *g) {
  struct stream *s = calloc(1, sizeof *s);
  if (!s) {
    oa_gen_cancel(g);
    oa_gen_free(g);
    atomic_fetch_sub_explicit(&h->in_flight, 1, memory_order_relaxed);
    return MHD_NO;
  }
  *s = (struct stream){.h = h, .conn = conn, .g = g};
  struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, stream_read, s, stream_free);
  if (!r) {
    stream_free(s);
    return MHD_NO;
  }
  MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
  MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
  atomic_fetch_add_explicit(&h->completions, 1, memory_order_relaxed);
  enum MHD_Result rc = MHD_queue_response(conn, 200, r);
  MHD_destroy_response(r);
  return rc;
}

static void write_gen(struct ms_http *h, FILE *f, void *g) { oa_gen_write(g, f); }

/* Waits for a whole answer; the client leaving or the server stopping cancels it. */
static enum MHD_Result whole_answer(struct ms_http *h, struct MHD_Connection *conn, struct oa_gen *g) {
  int gone = 0, stopped = 0;
  while (!oa_gen_pump(g, NULL, SLICE_MS)) {  /* not streaming: pump writes nothing */
    if ((stopped = atomic_load_explicit(&h->stopping, memory_order_acquire)) || (gone = client_gone(conn))) break;
  }
  enum MHD_Result rc;
  if (gone) {
    oa_gen_cancel(g);
    rc = MHD_NO;  /* nobody to answer: close the connection */
  } else if (stopped || oa_gen_failed(g)) {
    oa_gen_cancel(g);
    rc = respond_error_p(h, conn, 503, NULL, "aborted", "the server is shutting down; the request was not finished");
  } else {
    atomic_fetch_add_explicit(&h->completions, 1, memory_order_relaxed);
    rc = respond_json(conn, write_gen, h, g);
  }
  oa_gen_free(g);
  atomic_fetch_sub_explicit(&h->in_flight, 1, memory_order_relaxed);
  return rc;
}

static enum MHD_Result handle_generate(struct ms_http *h, struct MHD_Connection *conn, const struct body *b, int chat) {
  if (b->too_big) return respond_error(h, conn, 413, "the body is larger than %u bytes", MAX_BODY);
  if (atomic_load_explicit(&h->draining, memory_order_acquire))
    return respond_error_p(h, conn, 503, NULL, "draining", "the server is shutting down and takes no new requests");
  struct oa_req req;
  char msg[768], param[32];
  unsigned status = oa_parse(&h->env, b->buf, b->len, chat, &req, msg, sizeof msg, param, sizeof param);
  if (status) {
    oa_req_free(&req);
    return respond_error_p(h, conn, status, param, NULL, "%s", msg);
  }
  char id[48];
  snprintf(id, sizeof id, "%s-%lx%llu", chat ? "chatcmpl" : "cmpl", (long)getpid(),
           (unsigned long long)atomic_fetch_add_explicit(&h->next_id, 1, memory_order_relaxed));
  struct oa_sink sink = {on_request_done, h};
  struct ms_request_span tp = {0};
  const char *hdr = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "traceparent");
  int has_tp = hdr && !ms_otlp_traceparent(hdr, &tp);
  struct oa_gen *g = oa_gen_start(h->e, &h->env, &req, h->model, id, &sink, &status, msg, sizeof msg);
  if (!g) return respond_error(h, conn, status, "%s", msg);
  if (has_tp) oa_gen_set_traceparent(g, &tp);
  atomic_fetch_add_explicit(&h->in_flight, 1, memory_order_relaxed);
  return oa_gen_stream(g) ? stream_answer(h, conn, g) : whole_answer(h, conn, g);
}

/* ---- small endpoints ---- */

static void write_models(struct ms_http *h, FILE *f, void *arg) {
  struct ms_json j;
  ms_json_init(&j, f, 0);
  ms_json_obj_begin(&j);
  ms_json_kstr(&j, "object", "list");
  ms_json_key(&j, "data");
  ms_json_arr_begin(&j);
  ms_json_obj_begin(&j);
  ms_json_kstr(&j, "id", h->model);
  ms_json_kstr(&j, "object", "model");
  ms_json_kint(&j, "created", 0);
  ms_json_kstr(&j, "owned_by", "megascope");
  ms_json_kint(&j, "max_model_len", h->env.max_ctx);
  ms_json_obj_end(&j);
  ms_json_arr_end(&j);
  ms_json_obj_end(&j);
  ms_json_end(&j);
}

struct ids {
  int32_t *v;
  int n;
  int pieces;
};

static void write_tokens(struct ms_http *h, FILE *f, void *arg) {
  const struct ids *t = arg;
  struct ms_json j;
  ms_json_init(&j, f, 0);
  ms_json_obj_begin(&j);
  ms_json_key(&j, "tokens");
  ms_json_arr_begin(&j);
  for (int i = 0; i < t->n; i++) {
    if (!t->pieces) {
      ms_json_int(&j, t->v[i]);
      continue;
    }
    char buf[256] = "";
    long k = ms_tokenizer_decode(h->env.tok, &t->v[i], 1, buf, sizeof buf);
    ms_json_obj_begin(&j);
    ms_json_kint(&j, "id", t->v[i]);
    ms_json_kstr(&j, "piece", k > 0 ? buf : "");
    ms_json_obj_end(&j);
  }
  ms_json_arr_end(&j);
  ms_json_obj_end(&j);
  ms_json_end(&j);
}

/* POST /tokenize {"content", "add_special", "with_pieces"} -> {"tokens"} (llama-server's shape). */
static enum MHD_Result handle_tokenize(struct ms_http *h, struct MHD_Connection *conn, const struct body *b) {
  json_t *o = json_loadb(b->buf ? b->buf : "", b->len, 0, NULL);
  json_t *c = json_object_get(o, "content"), *sp = json_object_get(o, "add_special"),
         *wp = json_object_get(o, "with_pieces");
  enum MHD_Result rc;
  if (!h->env.tok) {
    rc = respond_error(h, conn, 400, "this model has no vocabulary to tokenize with");
  } else if (!json_is_object(o) || !json_is_string(c) || (sp && !json_is_boolean(sp)) || (wp && !json_is_boolean(wp))) {
    rc = respond_error_p(h, conn, 400, "content", NULL,
                         "the body must be {\"content\": string, \"add_special\": bool, \"with_pieces\": bool}");
  } else {
    size_t len = json_string_length(c);
    struct ids t = {malloc((len + 2) * sizeof(int32_t)), 0, json_is_true(wp)};
    int bos = json_is_true(sp) ? ms_tokenizer_add_bos(h->env.tok) : -1;
    if (t.v && bos >= 0) t.v[t.n++] = bos;
    int k = t.v ? ms_tokenizer_encode(h->env.tok, json_string_value(c), len, t.v + t.n, (int)len + 1) : -ENOMEM;
    if (k < 0) {
      rc = respond_error(h, conn, 400, "cannot tokenize 'content'");
    } else {
      t.n += k;
      rc = respond_json(conn, write_tokens, h, &t);
    }
    free(t.v);
  }
  json_decref(o);
  return rc;
}

static void write_content(struct ms_http *h, FILE *f, void *arg) {
  struct ms_json j;
  ms_json_init(&j, f, 0);
  ms_json_obj_begin(&j);
  ms_json_kstr(&j, "content", arg);
  ms_json_obj_end(&j);
  ms_json_end(&j);
}

/* POST /detokenize {"tokens": [ids]} -> {"content"} */
static enum MHD_Result handle_detokenize(struct ms_http *h, struct MHD_Connection *conn, const struct body *b) {
  json_t *o = json_loadb(b->buf ? b->buf : "", b->len, 0, NULL), *t = json_object_get(o, "tokens");
  enum MHD_Result rc;
  size_t n = json_array_size(t);
  int32_t *ids = malloc((n ? n : 1) * sizeof *ids);
  int ok = h->env.tok && json_is_array(t) && ids;
  for (size_t i = 0; ok && i < n; i++) {
    json_t *v = json_array_get(t, i);
    ok = json_is_integer(v) && json_integer_value(v) >= 0 && json_integer_value(v) < h->env.vocab;
    if (ok) ids[i] = (int32_t)json_integer_value(v);
  }
  if (!ok) {
    rc = respond_error_p(h, conn, 400, "tokens", NULL, "the body must be {\"tokens\": [token ids in [0, %d)]}",
                         h->env.vocab);
  } else {
    long need = ms_tokenizer_decode(h->env.tok, ids, (int)n, NULL, 0);
    char *raw = need >= 0 ? malloc((size_t)need + 1) : NULL;
    if (raw) ms_tokenizer_decode(h->env.tok, ids, (int)n, raw, (size_t)need + 1);
    char *text = raw ? oa_utf8_repair(raw, (size_t)need) : NULL;
    rc = text ? respond_json(conn, write_content, h, text) : respond_error(h, conn, 500, "cannot decode");
    free(raw);
    free(text);
  }
  free(ids);
  json_decref(o);
  return rc;
}

static enum MHD_Result handle_health(struct ms_http *h, struct MHD_Connection *conn) {
  int draining = atomic_load_explicit(&h->draining, memory_order_acquire);
  char *s = strdup(draining ? "{\"status\":\"draining\"}" : "{\"status\":\"ok\"}");
  return s ? respond(conn, draining ? 503 : 200, "application/json", s, strlen(s)) : MHD_NO;
}

/* ---- GET /metrics ---- */

static void counter(FILE *f, const char *name, const char *help, uint64_t v) {
  ms_prometheus_family(f, name, "counter", help);
  fprintf(f, "%s %llu\n", name, (unsigned long long)v);
}

static void gauge(FILE *f, const char *name, const char *help, double v) {
  ms_prometheus_family(f, name, "gauge", help);
  fprintf(f, "%s %.9g\n", name, v);
}

/* The serving series vLLM's dashboards graph, under megascope's prefix. */
static void write_serving_metrics(struct ms_http *h, FILE *f) {
  struct ms_engine_stats st;
  ms_engine_get_stats(h->e, &st);
  gauge(f, "megascope_num_requests_running", "Requests holding a batch slot.", st.running);
  gauge(f, "megascope_num_requests_waiting", "Requests queued for a batch slot.", st.waiting);
  gauge(f, "megascope_kv_cache_usage_perc", "KV-cache pages held by requests over the pool's pages (0..1).",
        st.kv_pages ? (double)st.kv_pages_used / st.kv_pages : 0.0);
  counter(f, "megascope_prompt_tokens_total", "Prompt tokens of finished requests.",
          atomic_load(&h->prompt_tokens));
  counter(f, "megascope_generation_tokens_total", "Tokens generated for finished requests.",
          atomic_load(&h->generation_tokens));
  ms_prometheus_family(f, "megascope_request_success_total", "counter",
                       "Finished requests by finish reason (abort: cancelled or cut short).");
  for (int i = 0; i < FIN_COUNT; i++)
    fprintf(f, "megascope_request_success_total{finished_reason=\"%s\"} %llu\n", fin_names[i],
            (unsigned long long)atomic_load(&h->finished[i]));
  struct ms_histogram e2e, queue, prefill, decode;
  pthread_mutex_lock(&h->mu);
  e2e = h->e2e, queue = h->queue, prefill = h->prefill, decode = h->decode;
  pthread_mutex_unlock(&h->mu);
  ms_prometheus_histogram(f, "megascope_e2e_request_latency_seconds", "Request latency, arrival to last token.", &e2e);
  ms_prometheus_histogram(f, "megascope_request_queue_time_seconds", "Time a request waited for a batch slot.",
                          &queue);
  ms_prometheus_histogram(f, "megascope_request_prefill_time_seconds", "Admission to first token, per request.",
                          &prefill);
  ms_prometheus_histogram(f, "megascope_request_decode_time_seconds", "First token to last token, per request.",
                          &decode);
}

static enum MHD_Result handle_metrics(struct ms_http *h, struct MHD_Connection *conn) {
  atomic_fetch_add_explicit(&h->scrapes, 1, memory_order_relaxed);
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  if (!f) return MHD_NO;
  int rc = ms_prometheus_write_engine(h->e, f);
  write_serving_metrics(h, f);
  counter(f, "megascope_http_completions_total", "Completions answered 200 (streams included).",
          atomic_load(&h->completions));
  counter(f, "megascope_http_rejected_total", "HTTP requests answered with an error.", atomic_load(&h->rejected));
  counter(f, "megascope_http_cancelled_total", "Generations cut short (the client left or the server stopped).",
          atomic_load(&h->cancelled));
  gauge(f, "megascope_http_requests_in_flight", "Generation requests being answered.",
        (double)atomic_load(&h->in_flight));
  if (h->control) {
    struct ms_control_stats cs;
    ms_control_get_stats(h->control, &cs);
    counter(f, "megascope_control_requests_total", "Control socket requests answered.", cs.requests);
    counter(f, "megascope_control_errors_total", "Control socket error replies.", cs.errors);
    counter(f, "megascope_control_refused_total", "Control socket connections refused (uid, too many clients).",
            cs.refused);
  }
  if (h->otlp) {
    struct ms_otlp_stats os;
    ms_otlp_get_stats(h->otlp, &os);
    counter(f, "megascope_otlp_requests_exported_total", "Requests exported as OTLP spans.", os.exported);
    counter(f, "megascope_otlp_requests_dropped_total",
            "Requests whose spans were dropped (queue full, collector failed).", os.dropped);
  }
  if (fclose(f) || rc) {
    free(buf);
    return respond_error(h, conn, 500, "cannot write the metrics");
  }
  return respond(conn, 200, MS_PROMETHEUS_CONTENT_TYPE, buf, len);
}

/* ---- dispatch ---- */

static int authorised(struct ms_http *h, struct MHD_Connection *conn) {
  if (!h->has_key) return 1;
  const char *a = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
  return a && !strncmp(a, "Bearer ", 7) && !strcmp(a + 7, h->api_key);
}

static enum MHD_Result route(struct ms_http *h, struct MHD_Connection *conn, const char *url, const char *method,
                             const struct body *b) {
  int get = !strcmp(method, MHD_HTTP_METHOD_GET), post = !strcmp(method, MHD_HTTP_METHOD_POST);
  if (!strcmp(url, "/health")) return handle_health(h, conn);
  if (!strcmp(url, "/metrics")) {
    if (!get) return respond_error(h, conn, 405, "use GET for /metrics");
    return handle_metrics(h, conn);
  }
  if (!authorised(h, conn))
    return respond_error_p(h, conn, 401, NULL, "invalid_api_key",
                           "a valid API key is needed: send \"Authorization: Bearer KEY\"");
  static const struct {
    const char *url;
    int post, kind;  /* kind: 0 completions, 1 chat, 2 tokenize, 3 detokenize, 4 models */
  } routes[] = {{"/v1/completions", 1, 0},     {"/completions", 1, 0}, {"/v1/chat/completions", 1, 1},
                {"/chat/completions", 1, 1}, {"/tokenize", 1, 2},    {"/detokenize", 1, 3},
                {"/v1/models", 0, 4},         {"/models", 0, 4}};
  for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++) {
    if (strcmp(url, routes[i].url)) continue;
    if (routes[i].post ? !post : !get)
      return respond_error(h, conn, 405, "use %s for %s", routes[i].post ? "POST" : "GET", url);
    switch (routes[i].kind) {
    case 0: return handle_generate(h, conn, b, 0);
    case 1: return handle_generate(h, conn, b, 1);
    case 2: return handle_tokenize(h, conn, b);
    case 3: return handle_detokenize(h, conn, b);
    default: return respond_json(conn, write_models, h, NULL);
    }
  }
  if (!strcmp(url, "/")) {
    char *s = strdup("megascope: POST /v1/completions, POST /v1/chat/completions, GET /v1/models, "
                     "POST /tokenize, POST /detokenize, GET /health, GET /metrics\n");
    return s ? respond(conn, 200, "text/plain; charset=utf-8", s, strlen(s)) : MHD_NO;
  }
  return respond_error_p(h, conn, 404, NULL, "not_found",
                         "no such endpoint: %s (try POST /v1/chat/completions, POST /v1/completions, "
                         "GET /v1/models or GET /metrics)",
                         url);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **state) {
  struct ms_http *h = cls;
  int is_post = !strcmp(method, MHD_HTTP_METHOD_POST);
  if (!*state) {
    struct body *b = calloc(1, sizeof *b);
    if (!b) return MHD_NO;
    *state = b;
    if (is_post) return MHD_YES;  /* the body follows */
  }
  struct body *b = *state;
  if (is_post && *upload_size) {
    if (!b->too_big && b->len + *upload_size <= MAX_BODY) {
      char *nb = realloc(b->buf, b->len + *upload_size + 1);
      if (!nb) return MHD_NO;
      memcpy(nb + b->len, upload, *upload_size);
      b->buf = nb;
      b->len += *upload_size;
    } else {
      b->too_big = 1;
    }
    *upload_size = 0;
    return MHD_YES;
  }
  return route(h, conn, url, method, b);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **state, enum MHD_RequestTerminationCode t) {
  struct body *b = *state;
  if (b) {
    free(b->buf);
    free(b);
  }
  *state = NULL;
}

static void on_log(void *cls, const char *fmt, va_list ap) {
  char msg[512];
  vsnprintf(msg, sizeof msg, fmt, ap);
  msg[strcspn(msg, "\n")] = '\0';
  ms_logf(MS_LOG_DEBUG, "http: %s", msg);
}

/* ---- life cycle ---- */

/* addr: a name or a numeric address (IPv4 or IPv6, brackets allowed). */
static int resolve(const char *addr, int port, struct sockaddr_storage *ss, char *host, size_t host_n,
                   struct ms_textbuf *log) {
  char name[256];
  size_t n = strlen(addr);
  if (n >= 2 && addr[0] == '[' && addr[n - 1] == ']')
    snprintf(name, sizeof name, "%.*s", (int)(n - 2), addr + 1);
  else
    snprintf(name, sizeof name, "%s", addr);
  struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE}, *res = NULL;
  int rc = getaddrinfo(name, NULL, &hints, &res);
  if (rc || !res) {
    ms_textbuf_printf(log, "http: cannot resolve '%s': %s\n", addr, gai_strerror(rc));
    return -EINVAL;
  }
  memcpy(ss, res->ai_addr, res->ai_addrlen);
  char num[INET6_ADDRSTRLEN] = "";
  if (ss->ss_family == AF_INET6) {
    ((struct sockaddr_in6 *)ss)->sin6_port = htons((uint16_t)port);
    inet_ntop(AF_INET6, &((struct sockaddr_in6 *)ss)->sin6_addr, num, sizeof num);
    snprintf(host, host_n, "[%s]", num);
  } else {
    ((struct sockaddr_in *)ss)->sin_port = htons((uint16_t)port);
    inet_ntop(AF_INET, &((struct sockaddr_in *)ss)->sin_addr, num, sizeof num);
    snprintf(host, host_n, "%s", num);
  }
  freeaddrinfo(res);
  return 0;
}

static void set_env(struct ms_http *h, struct ms_engine *e, const struct ms_http_opts *o) {
  const struct ms_model *m = ms_engine_model(e);
  struct oa_env *v = &h->env;
  v->tok = o->tok;
  v->vocab = m->cfg.vocab;
  v->max_ctx = o->max_ctx > 0 ? o->max_ctx : 512;
  v->max_tokens_default = o->max_tokens_default > 0 ? o->max_tokens_default : 16;
  v->temperature_default = o->temperature_set ? o->temperature_default : 1.0f;
  v->chat = (enum ms_chat_template)o->chat_template;
  v->chat_ok = o->chat_ok;
  v->bos = o->tok && o->chat_ok ? ms_chat_bos_id(v->chat, o->tok) : -1;
}

struct ms_http *ms_http_new(struct ms_engine *e, const struct ms_http_opts *o, struct ms_textbuf *log) {
  if (!e || !o || o->sz < sizeof *o || o->port < 0 || o->port > 65535) {
    errno = EINVAL;
    return NULL;
  }
  struct ms_http *h = calloc(1, sizeof *h);
  if (!h) return NULL;
  struct sockaddr_storage ss = {0};
  if (resolve(o->addr ? o->addr : "127.0.0.1", o->port, &ss, h->host, sizeof h->host, log)) {
    free(h);
    errno = EINVAL;
    return NULL;
  }
  h->e = e;
  h->otlp = o->otlp;
  h->control = o->control;
  if (o->api_key && o->api_key[0]) {
    snprintf(h->api_key, sizeof h->api_key, "%s", o->api_key);
    h->has_key = 1;
  }
  set_env(h, e, o);
  snprintf(h->model, sizeof h->model, "%s", o->model_name ? o->model_name : "megascope");
  pthread_mutex_init(&h->mu, NULL);
  unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL | MHD_USE_ERROR_LOG;
  if (ss.ss_family == AF_INET6) flags |= MHD_USE_IPv6;
  h->d = MHD_start_daemon(flags, (uint16_t)o->port, NULL, NULL, on_request, h, MHD_OPTION_SOCK_ADDR,
                          (struct sockaddr *)&ss, MHD_OPTION_CONNECTION_LIMIT,
                          (unsigned)(o->max_connections > 0 ? o->max_connections : 256),
                          MHD_OPTION_CONNECTION_TIMEOUT, 600u, MHD_OPTION_NOTIFY_COMPLETED, on_completed, h,
                          MHD_OPTION_EXTERNAL_LOGGER, on_log, h, MHD_OPTION_END);
  if (!h->d) {
    int err = errno ? errno : EADDRINUSE;
    ms_textbuf_printf(log, "http: cannot listen on %s:%d: %s\n", h->host, o->port, strerror(err));
    pthread_mutex_destroy(&h->mu);
    free(h);
    errno = err;
    return NULL;
  }
  const union MHD_DaemonInfo *di = MHD_get_daemon_info(h->d, MHD_DAEMON_INFO_BIND_PORT);
  h->port = di ? di->port : o->port;
  return h;
}

int ms_http_drain(struct ms_http *h, int timeout_ms) {
  if (!h) return 0;
  atomic_store_explicit(&h->draining, 1, memory_order_release);
  uint64_t until = ms_now_ns() + (uint64_t)(timeout_ms > 0 ? timeout_ms : 0) * 1000000ull;
  while (atomic_load(&h->in_flight) && ms_now_ns() < until) usleep(20000);
  uint64_t before = atomic_load(&h->cancelled);
  atomic_store_explicit(&h->stopping, 1, memory_order_release);
  /* the handlers notice within a slice; give them a few to answer */
  for (int i = 0; i < 100 && atomic_load(&h->in_flight); i++) usleep(20000);
  return (int)(atomic_load(&h->cancelled) - before);
}

void ms_http_free(struct ms_http *h) {
  if (!h) return;
  ms_http_drain(h, 0);
  MHD_stop_daemon(h->d);
  pthread_mutex_destroy(&h->mu);
  free(h);
}

int ms_http_port(const struct ms_http *h) { return h->port; }
const char *ms_http_host(const struct ms_http *h) { return h->host; }

void ms_http_get_stats(const struct ms_http *h, struct ms_http_stats *out) {
  struct ms_http *m = (struct ms_http *)h;
  out->completions = atomic_load_explicit(&m->completions, memory_order_relaxed);
  out->rejected = atomic_load_explicit(&m->rejected, memory_order_relaxed);
  out->scrapes = atomic_load_explicit(&m->scrapes, memory_order_relaxed);
  out->cancelled = atomic_load_explicit(&m->cancelled, memory_order_relaxed);
}
