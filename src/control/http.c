/* SPDX-License-Identifier: MIT */
/* The HTTP front door of a serving engine (libmicrohttpd): POST /v1/completions
 * in the OpenAI shape, GET /metrics in the Prometheus text format.
 *
 * DESIGN
 * Who runs what. libmicrohttpd runs one thread per connection (plus its
 * listening thread). A completion handler parses the body (jansson), submits
 * one request to the engine and waits for it; the engine's continuous batching
 * puts the requests of all connections into shared decode steps. Handlers wait
 * in slices of 100 ms so that they notice shutdown. A finished request is handed
 * to the OTLP exporter's queue (never blocking). /metrics reads the engine's
 * counters and the other servers' statistics; none of this takes a lock the
 * engine's workers take.
 * Shutdown. ms_http_free raises `stopping` (release; handlers load it with
 * acquire between waits): handlers still waiting answer 503 and leave their
 * request to finish or be cancelled by the engine; then MHD_stop_daemon closes
 * the listener and joins the connection threads. */
#include <errno.h>
#include <jansson.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "megascope/control.h"
#include "megascope/export.h"
#include "megascope/json.h"
#include "megascope/tokenizer.h"

#define MAX_BODY (1u << 20)
#define MAX_PROMPT 65536

struct ms_http {
  struct ms_engine *e;
  struct MHD_Daemon *d;
  const struct ms_tokenizer *tok;
  struct ms_otlp *otlp;
  struct ms_control *control;
  char model[64];
  int port, max_tokens_default;
  _Atomic int stopping;
  _Atomic uint64_t next_id, completions, rejected, scrapes, in_flight;
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

/* An OpenAI-style error: {"error": {"message", "type", "param", "code"}}. */
static enum MHD_Result respond_error(struct ms_http *h, struct MHD_Connection *conn, unsigned status,
                                     const char *fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  atomic_fetch_add_explicit(&h->rejected, 1, memory_order_relaxed);  /* statistics only */
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  if (!f) return MHD_NO;
  struct ms_json j;
  ms_json_init(&j, f, 0);
  ms_json_obj_begin(&j);
  ms_json_key(&j, "error");
  ms_json_obj_begin(&j);
  ms_json_kstr(&j, "message", msg);
  ms_json_kstr(&j, "type", status >= 500 ? "server_error" : "invalid_request_error");
  ms_json_key(&j, "param");
  ms_json_null(&j);
  ms_json_key(&j, "code");
  ms_json_null(&j);
  ms_json_obj_end(&j);
  ms_json_obj_end(&j);
  ms_json_end(&j);
  if (fclose(f)) {
    free(buf);
    return MHD_NO;
  }
  return respond(conn, status, "application/json", buf, len);
}

/* Text as valid UTF-8 for JSON: NUL bytes and invalid sequences (overlong,
 * surrogates, beyond U+10FFFF, truncated) become U+FFFD. */
static char *utf8_repair(const char *s, size_t n) {
  char *out = malloc(n * 3 + 1), *o = out;
  if (!out) return NULL;
  const unsigned char *p = (const unsigned char *)s, *end = p + n;
  while (p < end) {
    unsigned c = *p;
    int k = c < 0x80 ? 0 : (c & 0xe0) == 0xc0 ? 1 : (c & 0xf0) == 0xe0 ? 2 : (c & 0xf8) == 0xf0 ? 3 : -1;
    int ok = c != 0 && k >= 0 && p + k < end;
    unsigned cp = k == 0 ? c : k == 1 ? c & 0x1f : k == 2 ? c & 0x0f : c & 0x07;
    for (int i = 1; ok && i <= k; i++) {
      ok = (p[i] & 0xc0) == 0x80;
      cp = cp << 6 | (p[i] & 0x3f);
    }
    if (ok && k > 0) {
      static const unsigned min[] = {0, 0x80, 0x800, 0x10000};
      ok = cp >= min[k] && cp <= 0x10ffff && !(cp >= 0xd800 && cp <= 0xdfff);
    }
    if (ok) {
      memcpy(o, p, (size_t)k + 1);
      o += k + 1;
      p += k + 1;
    } else {
      memcpy(o, "\xef\xbf\xbd", 3);
      o += 3;
      p++;
    }
  }
  *o = '\0';
  return out;
}

/* ---- POST /v1/completions ---- */

struct completion {
  int32_t *prompt;
  int n_prompt;
  long max_tokens;
};

/* Parses the request body; 0, or an HTTP status with msg filled. */
static unsigned parse_completion(struct ms_http *h, const struct body *b, struct completion *c, char *msg,
                                 size_t n) {
  json_error_t err;
  json_t *req = json_loadb(b->buf ? b->buf : "", b->len, 0, &err);
  unsigned status = 400;
  if (!req) {
    snprintf(msg, n, "malformed JSON at line %d column %d: %s", err.line, err.column, err.text);
    return 400;
  }
  json_t *p = json_object_get(req, "prompt"), *mt = json_object_get(req, "max_tokens");
  json_t *stream = json_object_get(req, "stream"), *nn = json_object_get(req, "n");
  if (!json_is_object(req)) {
    snprintf(msg, n, "the body must be a JSON object");
  } else if (!p) {
    snprintf(msg, n, "missing field \"prompt\"");
  } else if (mt && !json_is_null(mt) && (!json_is_integer(mt) || json_integer_value(mt) < 1 ||
                                        json_integer_value(mt) > MAX_PROMPT)) {
    snprintf(msg, n, "\"max_tokens\" must be an integer in 1..%d", MAX_PROMPT);
  } else if (stream && json_is_true(stream)) {
    snprintf(msg, n, "\"stream\": true is not supported");
  } else if (nn && (!json_is_integer(nn) || json_integer_value(nn) != 1)) {
    snprintf(msg, n, "only \"n\": 1 is supported");
  } else {
    c->max_tokens = mt && json_is_integer(mt) ? (long)json_integer_value(mt) : h->max_tokens_default;
    status = 0;
    if (json_is_string(p)) {
      size_t len = json_string_length(p);
      if (!h->tok) {
        snprintf(msg, n, "this engine has no tokenizer: send \"prompt\" as an array of token ids");
        status = 400;
      } else if (len == 0) {
        snprintf(msg, n, "\"prompt\" is empty");
        status = 400;
      } else if (len > MAX_PROMPT) {
        snprintf(msg, n, "\"prompt\" is longer than %d bytes", MAX_PROMPT);
        status = 400;
      } else if (!(c->prompt = malloc(sizeof *c->prompt * len))) {
        status = 500;
        snprintf(msg, n, "out of memory");
      } else {
        int k = ms_tokenizer_encode(h->tok, json_string_value(p), len, c->prompt, (int)len);
        if (k < 0 || k > (int)len) {
          snprintf(msg, n, "cannot tokenize \"prompt\"");
          status = 400;
        }
        c->n_prompt = k;
      }
    } else if (json_is_array(p) && json_array_size(p) >= 1 && json_array_size(p) <= MAX_PROMPT) {
      size_t len = json_array_size(p);
      if (!(c->prompt = malloc(sizeof *c->prompt * len))) {
        status = 500;
        snprintf(msg, n, "out of memory");
      }
      for (size_t i = 0; !status && i < len; i++) {
        json_t *v = json_array_get(p, i);
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > INT32_MAX) {
          snprintf(msg, n, "\"prompt\" must be a string or an array of token ids (element %zu is not)", i);
          status = 400;
        } else {
          c->prompt[i] = (int32_t)json_integer_value(v);
        }
      }
      c->n_prompt = (int)len;
    } else {
      snprintf(msg, n, "\"prompt\" must be a non-empty string or array of at most %d token ids", MAX_PROMPT);
      status = 400;
    }
  }
  json_decref(req);
  return status;
}

static enum MHD_Result write_completion(struct ms_http *h, struct MHD_Connection *conn, const char *id,
                                        const struct ms_request_info *info, const char *finish) {
  char *text = NULL;
  if (h->tok) {
    long need = ms_tokenizer_decode(h->tok, info->tokens, info->n_tokens, NULL, 0);
    char *raw = need >= 0 ? malloc((size_t)need + 1) : NULL;
    if (raw) ms_tokenizer_decode(h->tok, info->tokens, info->n_tokens, raw, (size_t)need + 1);
    text = raw ? utf8_repair(raw, (size_t)need) : NULL;
    free(raw);
    if (!text) return respond_error(h, conn, 500, "cannot decode the generated tokens");
  }
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  if (!f) {
    free(text);
    return MHD_NO;
  }
  struct ms_json j;
  ms_json_init(&j, f, 0);
  ms_json_obj_begin(&j);
  ms_json_kstr(&j, "id", id);
  ms_json_kstr(&j, "object", "text_completion");
  ms_json_kint(&j, "created", (int64_t)time(NULL));
  ms_json_kstr(&j, "model", h->model);
  ms_json_key(&j, "choices");
  ms_json_arr_begin(&j);
  ms_json_obj_begin(&j);
  ms_json_kstr(&j, "text", text ? text : "");
  ms_json_kint(&j, "index", 0);
  ms_json_key(&j, "logprobs");
  ms_json_null(&j);
  ms_json_kstr(&j, "finish_reason", finish);
  ms_json_key(&j, "tokens");  /* an extension: the generated ids themselves */
  ms_json_arr_begin(&j);
  for (int i = 0; i < info->n_tokens; i++) ms_json_int(&j, info->tokens[i]);
  ms_json_arr_end(&j);
  ms_json_obj_end(&j);
  ms_json_arr_end(&j);
  ms_json_key(&j, "usage");
  ms_json_obj_begin(&j);
  ms_json_kint(&j, "prompt_tokens", info->n_prompt);
  ms_json_kint(&j, "completion_tokens", info->n_tokens);
  ms_json_kint(&j, "total_tokens", info->n_prompt + info->n_tokens);
  ms_json_obj_end(&j);
  ms_json_obj_end(&j);
  ms_json_end(&j);
  free(text);
  if (fclose(f)) {
    free(buf);
    return MHD_NO;
  }
  atomic_fetch_add_explicit(&h->completions, 1, memory_order_relaxed);  /* statistics only */
  return respond(conn, 200, "application/json", buf, len);
}

static void export_span(struct ms_http *h, const char *id, const struct ms_request_info *info, long max_tokens,
                        const char *finish) {
  if (!h->otlp) return;
  struct ms_request_span s = {.route = "/v1/completions", .n_prompt = info->n_prompt, .n_tokens = info->n_tokens,
                              .max_tokens = (int)max_tokens, .slot = info->slot, .generation = info->generation,
                              .finish_reason = finish, .error = info->state != MS_REQ_DONE,
                              .t_submit = info->t_submit, .t_admit = info->t_admit, .t_first = info->t_first,
                              .t_done = info->t_done ? info->t_done : ms_now_ns()};
  snprintf(s.request_id, sizeof s.request_id, "%s", id);
  ms_otlp_add(h->otlp, &s);
}

static enum MHD_Result handle_completion(struct ms_http *h, struct MHD_Connection *conn, const struct body *b) {
  if (b->too_big) return respond_error(h, conn, 413, "the body is larger than %u bytes", MAX_BODY);
  struct completion c = {0};
  char msg[512];
  unsigned status = parse_completion(h, b, &c, msg, sizeof msg);
  if (status) {
    free(c.prompt);
    return respond_error(h, conn, status, "%s", msg);
  }
  struct ms_request_opts ro = {.sz = sizeof ro, .prompt = c.prompt, .n_prompt = c.n_prompt,
                               .max_new_tokens = (int)c.max_tokens, .stop_at_eos = 1};
  struct ms_request *r = ms_engine_submit(h->e, &ro);
  free(c.prompt);
  if (!r) {
    int err = errno;
    if (err == E2BIG)
      return respond_error(h, conn, 400,
                           "the prompt (%d tokens) and max_tokens (%ld) exceed the engine's context (--max-ctx)",
                           c.n_prompt, c.max_tokens);
    if (err == EINVAL) return respond_error(h, conn, 400, "a prompt token id is outside the model's vocabulary");
    return respond_error(h, conn, 503, "the engine cannot take the request now: %s", ms_strerror(err));
  }
  char id[48];
  snprintf(id, sizeof id, "cmpl-%lx-%llu", (long)getpid(),
           (unsigned long long)atomic_fetch_add_explicit(&h->next_id, 1, memory_order_relaxed));
  atomic_fetch_add_explicit(&h->in_flight, 1, memory_order_relaxed);
  int stopped = 0, slot = -1;
  struct ms_request_info info;
  while (ms_request_wait(r, 100) == -ETIMEDOUT) {
    ms_request_get_info(r, &info);  /* the slot is known only while the request is active */
    if (info.slot >= 0) slot = info.slot;
    if (atomic_load_explicit(&h->stopping, memory_order_acquire)) {
      stopped = 1;
      break;
    }
  }
  atomic_fetch_sub_explicit(&h->in_flight, 1, memory_order_relaxed);
  ms_request_get_info(r, &info);
  if (info.slot < 0) info.slot = slot;
  enum MHD_Result rc;
  if (stopped || info.state != MS_REQ_DONE) {
    export_span(h, id, &info, c.max_tokens, "cancelled");
    rc = respond_error(h, conn, 503, "the server is shutting down; the request was not finished");
  } else {
    const char *finish = info.n_tokens < c.max_tokens ? "stop" : "length";
    export_span(h, id, &info, c.max_tokens, finish);
    rc = write_completion(h, conn, id, &info, finish);
  }
  ms_request_free(r);  /* an unfinished request is freed by the engine when it ends */
  return rc;
}

/* ---- GET /metrics ---- */

static enum MHD_Result handle_metrics(struct ms_http *h, struct MHD_Connection *conn) {
  atomic_fetch_add_explicit(&h->scrapes, 1, memory_order_relaxed);
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  if (!f) return MHD_NO;
  int rc = ms_prometheus_write_engine(h->e, f);
  ms_prometheus_family(f, "megascope_http_completions_total", "counter", "Completions answered 200.");
  fprintf(f, "megascope_http_completions_total %llu\n", (unsigned long long)atomic_load(&h->completions));
  ms_prometheus_family(f, "megascope_http_rejected_total", "counter", "HTTP requests answered with an error.");
  fprintf(f, "megascope_http_rejected_total %llu\n", (unsigned long long)atomic_load(&h->rejected));
  ms_prometheus_family(f, "megascope_http_requests_in_flight", "gauge", "Completions waiting for their tokens.");
  fprintf(f, "megascope_http_requests_in_flight %llu\n", (unsigned long long)atomic_load(&h->in_flight));
  if (h->control) {
    struct ms_control_stats cs;
    ms_control_get_stats(h->control, &cs);
    ms_prometheus_family(f, "megascope_control_requests_total", "counter", "Control socket requests answered.");
    fprintf(f, "megascope_control_requests_total %llu\n", (unsigned long long)cs.requests);
    ms_prometheus_family(f, "megascope_control_errors_total", "counter", "Control socket error replies.");
    fprintf(f, "megascope_control_errors_total %llu\n", (unsigned long long)cs.errors);
    ms_prometheus_family(f, "megascope_control_refused_total", "counter",
                         "Control socket connections refused (uid, too many clients).");
    fprintf(f, "megascope_control_refused_total %llu\n", (unsigned long long)cs.refused);
  }
  if (h->otlp) {
    struct ms_otlp_stats os;
    ms_otlp_get_stats(h->otlp, &os);
    ms_prometheus_family(f, "megascope_otlp_requests_exported_total", "counter",
                         "Requests exported as OTLP spans.");
    fprintf(f, "megascope_otlp_requests_exported_total %llu\n", (unsigned long long)os.exported);
    ms_prometheus_family(f, "megascope_otlp_requests_dropped_total", "counter",
                         "Requests whose spans were dropped (queue full, collector failed).");
    fprintf(f, "megascope_otlp_requests_dropped_total %llu\n", (unsigned long long)os.dropped);
  }
  if (fclose(f) || rc) {
    free(buf);
    return respond_error(h, conn, 500, "cannot write the metrics");
  }
  return respond(conn, 200, MS_PROMETHEUS_CONTENT_TYPE, buf, len);
}

/* ---- dispatch ---- */

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **state) {
  struct ms_http *h = cls;
  int is_post = !strcmp(method, MHD_HTTP_METHOD_POST);
  if (!*state && is_post) {
    struct body *b = calloc(1, sizeof *b);
    if (!b) return MHD_NO;
    *state = b;
    return MHD_YES;
  }
  if (is_post && *upload_size) {
    struct body *b = *state;
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
  if (!strcmp(url, "/v1/completions")) {
    if (!is_post) return respond_error(h, conn, 405, "use POST for /v1/completions");
    return handle_completion(h, conn, *state);
  }
  if (!strcmp(url, "/metrics")) {
    if (strcmp(method, MHD_HTTP_METHOD_GET)) return respond_error(h, conn, 405, "use GET for /metrics");
    return handle_metrics(h, conn);
  }
  if (!strcmp(url, "/") || !strcmp(url, "/health")) {
    char *s = strdup(!strcmp(url, "/") ? "megascope: POST /v1/completions, GET /metrics\n" : "ok\n");
    return s ? respond(conn, 200, "text/plain; charset=utf-8", s, strlen(s)) : MHD_NO;
  }
  return respond_error(h, conn, 404, "no such endpoint: %s (try POST /v1/completions or GET /metrics)", url);
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

struct ms_http *ms_http_new(struct ms_engine *e, const struct ms_http_opts *o, struct ms_textbuf *log) {
  if (!e || !o || o->sz < sizeof *o || o->port < 0 || o->port > 65535) {
    errno = EINVAL;
    return NULL;
  }
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)o->port)};
  const char *addr = o->addr ? o->addr : "127.0.0.1";
  if (inet_pton(AF_INET, addr, &sa.sin_addr) != 1) {
    ms_textbuf_printf(log, "http: '%s' is not an IPv4 address\n", addr);
    errno = EINVAL;
    return NULL;
  }
  struct ms_http *h = calloc(1, sizeof *h);
  if (!h) return NULL;
  h->e = e;
  h->tok = o->tok;
  h->otlp = o->otlp;
  h->control = o->control;
  h->max_tokens_default = o->max_tokens_default > 0 ? o->max_tokens_default : 16;
  snprintf(h->model, sizeof h->model, "%s", o->model_name ? o->model_name : "megascope");
  unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL | MHD_USE_ERROR_LOG;
  h->d = MHD_start_daemon(flags, (uint16_t)o->port, NULL, NULL, on_request, h, MHD_OPTION_SOCK_ADDR,
                          (struct sockaddr *)&sa, MHD_OPTION_CONNECTION_LIMIT,
                          (unsigned)(o->max_connections > 0 ? o->max_connections : 256),
                          MHD_OPTION_CONNECTION_TIMEOUT, 120u, MHD_OPTION_NOTIFY_COMPLETED, on_completed, h,
                          MHD_OPTION_EXTERNAL_LOGGER, on_log, h, MHD_OPTION_END);
  if (!h->d) {
    int err = errno ? errno : EADDRINUSE;
    ms_textbuf_printf(log, "http: cannot listen on %s:%d: %s\n", addr, o->port, strerror(err));
    free(h);
    errno = err;
    return NULL;
  }
  const union MHD_DaemonInfo *di = MHD_get_daemon_info(h->d, MHD_DAEMON_INFO_BIND_PORT);
  h->port = di ? di->port : o->port;
  return h;
}

void ms_http_free(struct ms_http *h) {
  if (!h) return;
  atomic_store_explicit(&h->stopping, 1, memory_order_release);
  MHD_stop_daemon(h->d);
  free(h);
}

int ms_http_port(const struct ms_http *h) { return h->port; }

void ms_http_get_stats(const struct ms_http *h, struct ms_http_stats *out) {
  struct ms_http *m = (struct ms_http *)h;
  out->completions = atomic_load_explicit(&m->completions, memory_order_relaxed);
  out->rejected = atomic_load_explicit(&m->rejected, memory_order_relaxed);
  out->scrapes = atomic_load_explicit(&m->scrapes, memory_order_relaxed);
}
