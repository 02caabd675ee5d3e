/* SPDX-License-Identifier: MIT */
/* The HTTP front door of a serving engine (libmicrohttpd): the OpenAI API as
 * clients use it (POST /v1/completions and /v1/chat/completions, streamed or
 * not; GET /v1/models), llama-server's /tokenize, /detokenize and /health,
 * and GET /metrics in the Prometheus text format.
 *
 * DESIGN
 * Who runs what. The gate (gate.c) accepts connections on a thread of its
 * own, bounds them (in all and per client), holds requests to read deadlines
 * and hands the sockets it keeps to libmicrohttpd, which runs one thread per
 * connection. A generation handler parses the body into a job
 * (openai.c), checks it against the bounds of one request and the client's
 * fair share (share.c: 400 over a bound, 429 with Retry-After over the share
 * or when the engine's queue is full), submits one engine request per choice
 * (generate.c), tagged with the client for the engine's fair queue, and waits
 * on them in slices of 100 ms; the engine's continuous batching puts the
 * requests of all connections into shared decode steps. A streamed answer is
 * produced by libmicrohttpd's content reader, which blocks in the connection's
 * thread until the next tokens are sampled and returns their events.
 * A client gone. Between slices a handler checks the socket: a reset or an
 * error means the client has gone, and cancels the job (its slots and KV pages
 * are freed at the next step start). End of file alone does not: a client may
 * half-close after its request (RFC 9112 section 9.6) and still read the
 * answer. Once the peer's end is seen, the handler makes the socket speak so
 * a closed peer answers with a reset: a stream sends an SSE comment each
 * second it has nothing else to send, a whole answer turns into a chunked 200
 * whose body starts with a space (JSON allows it) and is sent when done.
 * Framing. A request with both Content-Length and Transfer-Encoding, two
 * different Content-Lengths, or a Transfer-Encoding other than chunked is
 * answered 400 (501 for a coding before chunked) and its connection closed,
 * before any of its body is read (libmicrohttpd 0.9.75 would take the one it
 * looks up first); a malformed chunked body is libmicrohttpd's 400.
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
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "control/gate.h"
#include "control/openai.h"
#include "control/share.h"
#include "control/structured.h"
#include "megascope/control.h"
#include "megascope/attach.h"
#include "megascope/export.h"
#include "megascope/json.h"
#include "megascope/telemetry.h"
#include "megascope/tokenizer.h"

#define MAX_BODY (1u << 20)
#define SLICE_MS 100

enum { FIN_STOP, FIN_LENGTH, FIN_ABORT, FIN_COUNT };
static const char *const fin_names[FIN_COUNT] = {"stop", "length", "abort"};

/* Why a generation request was refused by a bound (/metrics' reasons). */
enum {
  REF_REQUEST_TOKENS,   /* n x max_tokens over the request's bound: 400 */
  REF_PROMPT_TOKENS,    /* its prompts' tokens over the bound: 400 */
  REF_CLIENT_REQUESTS,  /* the client's share of requests: 429 */
  REF_CLIENT_TOKENS,    /* the client's share of tokens: 429 */
  REF_QUEUE_FULL,       /* the engine's queue: 429 */
  REF_COUNT
};
static const char *const ref_names[REF_COUNT] = {"request_tokens", "prompt_tokens", "client_requests",
                                                 "client_tokens", "queue_full"};

/* Tokens per request, on 1-2-5 bounds up to the context (as vLLM's
 * request_prompt_tokens and request_generation_tokens). Under ms_http.mu. */
#define TOK_BOUNDS 24
struct tok_hist {
  double bounds[TOK_BOUNDS];
  int n;
  uint64_t counts[TOK_BOUNDS + 1];
  double sum;
};

static void tok_hist_init(struct tok_hist *t, int max) {
  static const int step[3] = {1, 2, 5};
  memset(t, 0, sizeof *t);
  for (int k = 0; t->n < TOK_BOUNDS; k++) {
    long v = step[k % 3];
    for (int d = k / 3; d > 0; d--) v *= 10;
    t->bounds[t->n++] = (double)v;
    if (v >= max) break;
  }
}

static void tok_hist_observe(struct tok_hist *t, int v) {
  int i = 0;
  while (i < t->n && v > t->bounds[i]) i++;
  t->counts[i]++;
  t->sum += v;
}

struct ms_http {
  struct ms_engine *e;
  struct MHD_Daemon *d;
  struct oa_env env;
  struct ms_otlp *otlp;
  struct ms_control *control;
  char model[128], host[80], api_key[256];
  char labels[320];    /* the vLLM series' labels: model_name, engine */
  int compat;          /* --metrics-compat vllm */
  int port, has_key;
  struct ms_gate *gate;
  struct ms_share *share;
  struct gate_opts go;
  struct share_opts so;
  int max_request_tokens, max_prompt_tokens;
  _Atomic int draining, stopping;
  _Atomic uint64_t refused[REF_COUNT];
  _Atomic uint64_t next_id, completions, rejected, scrapes, in_flight, cancelled;
  _Atomic uint64_t prompt_tokens, generation_tokens, finished[FIN_COUNT];
  pthread_mutex_t mu;  /* the histograms below */
  struct ms_histogram e2e, queue, prefill, decode, inference;
  struct tok_hist prompt_hist, gen_hist;
};

struct body {
  char *buf;
  size_t len;
  int too_big;
};

/* ---- responses ---- */

/* hdrs: NULL, or name, value pairs ending in NULL. */
static enum MHD_Result respond_h(struct MHD_Connection *conn, unsigned status, const char *type, char *buf,
                                 size_t len, const char *const *hdrs) {
  struct MHD_Response *r = MHD_create_response_from_buffer(len, buf, MHD_RESPMEM_MUST_FREE);
  if (!r) {
    free(buf);
    return MHD_NO;
  }
  MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
  for (int i = 0; hdrs && hdrs[i]; i += 2) MHD_add_response_header(r, hdrs[i], hdrs[i + 1]);
  enum MHD_Result rc = MHD_queue_response(conn, status, r);
  MHD_destroy_response(r);
  return rc;
}

static enum MHD_Result respond(struct MHD_Connection *conn, unsigned status, const char *type, char *buf,
                               size_t len) {
  return respond_h(conn, status, type, buf, len, NULL);
}

static const char *const retry_after[] = {"Retry-After", "1", NULL};
static const char *const conn_close[] = {MHD_HTTP_HEADER_CONNECTION, "close", NULL};

/* An OpenAI-shaped error: {"error": {"message", "type", "param", "code"}}, with headers. */
static enum MHD_Result error_v(struct ms_http *h, struct MHD_Connection *conn, unsigned status, const char *param,
                               const char *code, const char *const *hdrs, const char *fmt, va_list ap) {
  char msg[768];
  vsnprintf(msg, sizeof msg, fmt, ap);
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
  return respond_h(conn, status, "application/json", buf, len, hdrs);
}

static enum MHD_Result respond_error_p(struct ms_http *h, struct MHD_Connection *conn, unsigned status,
                                       const char *param, const char *code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  enum MHD_Result rc = error_v(h, conn, status, param, code, NULL, fmt, ap);
  va_end(ap);
  return rc;
}

/* A refusal by a bound: counted by reason; 429s say when to retry. */
static enum MHD_Result respond_refused(struct ms_http *h, struct MHD_Connection *conn, int why, unsigned status,
                                       const char *param, const char *code, const char *fmt, ...) {
  atomic_fetch_add_explicit(&h->refused[why], 1, memory_order_relaxed);
  va_list ap;
  va_start(ap, fmt);
  enum MHD_Result rc = error_v(h, conn, status, param, code, status == 429 ? retry_after : NULL, fmt, ap);
  va_end(ap);
  return rc;
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

/* The peer as the socket shows it: still sending or quiet, done sending (end
 * of file: half-closed, or closed, which only a write can tell), or gone (a
 * reset, an error: a write failed or would). */
enum peer { PEER_HERE, PEER_EOF, PEER_GONE };

static enum peer peer_state(struct MHD_Connection *conn) {
  const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
  if (!ci) return PEER_HERE;
  struct pollfd p = {.fd = ci->connect_fd, .events = POLLIN | POLLRDHUP};
  if (poll(&p, 1, 0) <= 0) return PEER_HERE;
  if (p.revents & (POLLHUP | POLLERR | POLLNVAL)) return PEER_GONE;
  if (p.revents & POLLRDHUP) return PEER_EOF;
  char c;
  ssize_t n = recv(ci->connect_fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  if (n == 0) return PEER_EOF;
  return n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR ? PEER_GONE : PEER_HERE;
}

/* libmicrohttpd's inactivity timeout counts from the last byte moved: an
 * answer that was long in coming restarts it before its bytes go out (setting
 * the timeout from 0 stamps the connection's activity). */
static void touch(struct ms_http *h, struct MHD_Connection *conn) {
  MHD_set_connection_option(conn, MHD_CONNECTION_OPTION_TIMEOUT, 0u);
  MHD_set_connection_option(conn, MHD_CONNECTION_OPTION_TIMEOUT, (unsigned)((h->go.idle_ms + 999) / 1000));
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
  if (info->t_admit) ms_histogram_observe(&h->inference, secs(info->t_admit, done));
  tok_hist_observe(&h->prompt_hist, info->n_prompt);
  tok_hist_observe(&h->gen_hist, info->n_tokens);
  pthread_mutex_unlock(&h->mu);
  if (!h->otlp) return;
  struct ms_request_span s = {.route = oa_gen_is_chat(g) ? "/v1/chat/completions" : "/v1/completions",
                              .n_prompt = info->n_prompt, .n_tokens = info->n_tokens,
                              .max_tokens = oa_gen_max_tokens(g), .slot = info->slot, .generation = info->generation,
                              .finish_reason = finish ? finish : "cancelled", .error = !finish,
                              .t_submit = info->t_submit, .t_admit = info->t_admit, .t_first = info->t_first,
                              .t_done = done, .n_cached = info->n_cached};
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

/* An answer produced by libmicrohttpd's content reader: a stream of events,
 * or (whole) a JSON answer deferred because its client half-closed. */
struct stream {
  struct ms_http *h;
  struct MHD_Connection *conn;
  struct oa_gen *g;
  struct share_hold hold;
  char *buf;
  size_t len, off;
  int whole;            /* the body is the whole JSON answer, sent when done */
  int finished, failed;
  int probe;            /* the peer's end was seen: make the socket speak now and then */
  uint64_t next_probe;
};

/* What a job gives back when it ends: its in-flight count and its client's share. */
static void job_done(struct ms_http *h, struct oa_gen *g, struct share_hold *hold) {
  oa_gen_free(g);
  share_give(h->share, hold);
  atomic_fetch_sub_explicit(&h->in_flight, 1, memory_order_relaxed);
}

/* A probe for a peer that has sent its end: bytes the client ignores (an SSE
 * comment; a space before JSON), once a second, so a closed peer resets. */
static void stream_probe(struct stream *s, FILE *f) {
  uint64_t now = ms_now_ns();
  if (!s->probe || now < s->next_probe) return;
  s->next_probe = now + 1000000000ull;
  fputs(s->whole ? " " : ": waiting\n\n", f);
}

/* One slice of a stream's production into s->buf: new events, or the end. */
static void stream_produce(struct stream *s) {
  free(s->buf);
  s->buf = NULL;
  s->len = s->off = 0;
  FILE *f = open_memstream(&s->buf, &s->len);
  if (!f) return;
  if (atomic_load_explicit(&s->h->stopping, memory_order_acquire)) {
    oa_gen_cancel(s->g);
    if (s->whole)
      s->failed = 1;  /* the 200 is sent: the answer ends short, which says it failed */
    else
      oa_gen_write_abort(s->g, f, "the server is shutting down; the request was not finished");
    s->finished = 1;
  } else if (oa_gen_pump(s->g, s->whole ? NULL : f, SLICE_MS)) {
    if (oa_gen_failed(s->g)) {
      if (s->whole)
        s->failed = 1;
      else
        oa_gen_write_abort(s->g, f, "the request was cancelled by the engine");
    } else if (s->whole) {
      atomic_fetch_add_explicit(&s->h->completions, 1, memory_order_relaxed);
      oa_gen_write(s->g, f);
    }
    s->finished = 1;
  } else {
    stream_probe(s, f);
  }
  fclose(f);
}

static ssize_t stream_read(void *cls, uint64_t pos, char *out, size_t max) {
  struct stream *s = cls;
  while (s->off == s->len) {
    if (s->failed) return MHD_CONTENT_READER_END_WITH_ERROR;
    if (s->finished) return MHD_CONTENT_READER_END_OF_STREAM;
    enum peer p = peer_state(s->conn);
    if (p == PEER_GONE) return MHD_CONTENT_READER_END_WITH_ERROR;  /* stream_free cancels */
    s->probe |= p == PEER_EOF;
    stream_produce(s);
    if (!s->buf) return MHD_CONTENT_READER_END_WITH_ERROR;
  }
  size_t n = s->len - s->off < max ? s->len - s->off : max;
  memcpy(out, s->buf + s->off, n);
  s->off += n;
  touch(s->h, s->conn);
  return (ssize_t)n;
}

static void stream_free(void *cls) {
  struct stream *s = cls;
  oa_gen_cancel(s->g);  /* a client that left: its choices stop at the next step */
  job_done(s->h, s->g, &s->hold);
  free(s->buf);
  free(s);
}

/* Queues an answer made by the content reader: SSE events, or (whole) the JSON
 * answer of a client that half-closed, whose first byte goes out at once. */
static enum MHD_Result reader_answer(struct ms_http *h, struct MHD_Connection *conn, struct oa_gen *g,
                                     struct share_hold *hold, int whole) {
  struct stream *s = calloc(1, sizeof *s);
  if (!s) {
    oa_gen_cancel(g);
    job_done(h, g, hold);
    return MHD_NO;
  }
  *s = (struct stream){.h = h, .conn = conn, .g = g, .hold = *hold, .whole = whole, .probe = whole};
  struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, stream_read, s, stream_free);
  if (!r) {
    stream_free(s);
    return MHD_NO;
  }
  MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, whole ? "application/json" : "text/event-stream");
  MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
  if (!whole) atomic_fetch_add_explicit(&h->completions, 1, memory_order_relaxed);
  enum MHD_Result rc = MHD_queue_response(conn, 200, r);
  MHD_destroy_response(r);
  return rc;
}

static void write_gen(struct ms_http *h, FILE *f, void *g) { oa_gen_write(g, f); }

/* Waits for a whole answer; the client gone or the server stopping cancels
 * it; a client that half-closed gets it through the content reader. */
static enum MHD_Result whole_answer(struct ms_http *h, struct MHD_Connection *conn, struct oa_gen *g,
                                    struct share_hold *hold) {
  int gone = 0, stopped = 0;
  while (!oa_gen_pump(g, NULL, SLICE_MS)) {  /* not streaming: pump writes nothing */
    if ((stopped = atomic_load_explicit(&h->stopping, memory_order_acquire))) break;
    enum peer p = peer_state(conn);
    if ((gone = p == PEER_GONE)) break;
    if (p == PEER_EOF) return reader_answer(h, conn, g, hold, 1);
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
  job_done(h, g, hold);
  return rc;
}

/* The bounds of one request (400), then the client's share (429). */
static enum MHD_Result over_bounds(struct ms_http *h, struct MHD_Connection *conn, const struct oa_req *req,
                                   struct share_hold *hold) {
  long long asked = 0, prompt = 0, tokens = 0;
  for (int i = 0; i < req->n_prompts; i++) {
    asked += (long long)req->n * req->max_tokens;
    prompt += (long long)req->n * req->n_prompt[i];
    tokens += (long long)req->n * (req->n_prompt[i] + req->max_tokens);
  }
  if (asked > h->max_request_tokens)
    return respond_refused(h, conn, REF_REQUEST_TOKENS, 400, req->n > 1 ? "n" : "max_tokens", "request_too_large",
                           "the request asks for %lld tokens (choices x max_tokens); this server takes at most %d "
                           "in one request (--max-request-tokens)",
                           asked, h->max_request_tokens);
  if (prompt > h->max_prompt_tokens)
    return respond_refused(h, conn, REF_PROMPT_TOKENS, 400, req->chat ? "messages" : "prompt", "request_too_large",
                           "the request's prompts are %lld tokens over its choices; this server takes at most %d "
                           "in one request (--max-prompt-tokens)",
                           prompt, h->max_prompt_tokens);
  snprintf(hold->client, sizeof hold->client, "%s", gate_client(gate_conn_of(conn)));
  hold->requests = req->n_prompts * req->n;
  hold->tokens = (uint64_t)tokens;
  if (hold->requests > h->so.max_requests || hold->tokens > h->so.max_tokens)  /* retrying would not help */
    return respond_refused(h, conn, REF_REQUEST_TOKENS, 400, "n", "request_too_large",
                           "the request alone needs %d choices and %lld tokens (prompts and max_tokens); a client "
                           "holds at most %d and %llu (--client-max-requests, --client-max-tokens)",
                           hold->requests, tokens, h->so.max_requests, (unsigned long long)h->so.max_tokens);
  char msg[400];
  enum share_refusal why = share_take(h->share, hold, msg, sizeof msg);
  if (why != SHARE_OK)
    return respond_refused(h, conn, why == SHARE_REQUESTS ? REF_CLIENT_REQUESTS : REF_CLIENT_TOKENS, 429, NULL,
                           "rate_limit_exceeded", "%s", msg);
  return MHD_YES;
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
    if (status == 404)  /* as OpenAI answers a model it does not have: no param, this code */
      return respond_error_p(h, conn, 404, NULL, "model_not_found", "%s", msg);
    return respond_error_p(h, conn, status, param, NULL, "%s", msg);
  }
  struct share_hold hold = {0};
  enum MHD_Result refused = over_bounds(h, conn, &req, &hold);
  if (!hold.held) {  /* answered with the refusal */
    oa_req_free(&req);
    return refused;
  }
  req.client = share_client_id(hold.client);
  char id[48];
  snprintf(id, sizeof id, "%s-%lx%llu", chat ? "chatcmpl" : "cmpl", (long)getpid(),
           (unsigned long long)atomic_fetch_add_explicit(&h->next_id, 1, memory_order_relaxed));
  struct oa_sink sink = {on_request_done, h};
  struct ms_request_span tp = {0};
  const char *hdr = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "traceparent");
  int has_tp = hdr && !ms_otlp_traceparent(hdr, &tp);
  struct oa_gen *g = oa_gen_start(h->e, &h->env, &req, h->model, id, &sink, &status, msg, sizeof msg);
  if (!g) {
    share_give(h->share, &hold);
    if (status == 429) return respond_refused(h, conn, REF_QUEUE_FULL, 429, NULL, "queue_full", "%s", msg);
    return respond_error(h, conn, status, "%s", msg);
  }
  if (has_tp) oa_gen_set_traceparent(g, &tp);
  atomic_fetch_add_explicit(&h->in_flight, 1, memory_order_relaxed);
  return oa_gen_stream(g) ? reader_answer(h, conn, g, &hold, 0) : whole_answer(h, conn, g, &hold);
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

/* What the serving series are made of: one snapshot of the server's histograms. */
struct serving_snap {
  struct ms_histogram e2e, queue, prefill, decode, inference;
  struct tok_hist prompt, gen;
};

static void snap_take(struct ms_http *h, struct serving_snap *s) {
  pthread_mutex_lock(&h->mu);
  *s = (struct serving_snap){h->e2e, h->queue, h->prefill, h->decode, h->inference, h->prompt_hist, h->gen_hist};
  pthread_mutex_unlock(&h->mu);
}

static void vllm_counter(FILE *f, const struct ms_http *h, const char *name, const char *help, uint64_t v) {
  ms_prometheus_family(f, name, "counter", help);
  fprintf(f, "%s{%s} %llu\n", name, h->labels, (unsigned long long)v);
}

static void vllm_gauge(FILE *f, const struct ms_http *h, const char *name, const char *help, double v) {
  ms_prometheus_family(f, name, "gauge", help);
  fprintf(f, "%s{%s} %.9g\n", name, h->labels, v);
}

static void vllm_hist(FILE *f, const struct ms_http *h, const char *name, const char *help,
                      const struct ms_histogram *x) {
  ms_prometheus_histogram_n(f, name, help, h->labels, ms_latency_bounds, MS_LAT_BUCKETS, x->counts, x->sum);
}

/* --metrics-compat vllm: vLLM's names, types and label names (model_name,
 * engine, finished_reason) for the same quantities, so vLLM's Grafana
 * dashboards and the inference gateway's endpoint picker read megascope
 * unchanged. The list they are checked against is tests/data/vllm_metrics.txt
 * (from vLLM's metrics documentation). */
static void write_vllm_metrics(struct ms_http *h, FILE *f, const struct ms_engine_stats *st,
                               const struct ms_latency_stats *lat, const struct serving_snap *s) {
  vllm_gauge(f, h, "vllm:num_requests_running", "Number of requests in model execution batches.", st->running);
  vllm_gauge(f, h, "vllm:num_requests_waiting", "Number of requests waiting to be processed.", st->waiting);
  vllm_gauge(f, h, "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.",
             st->kv_pages ? (double)st->kv_pages_used / st->kv_pages : 0.0);
  vllm_counter(f, h, "vllm:prompt_tokens_total", "Number of prefill tokens processed.",
               atomic_load(&h->prompt_tokens));
  vllm_counter(f, h, "vllm:generation_tokens_total", "Number of generation tokens processed.",
               atomic_load(&h->generation_tokens));
  ms_prometheus_family(f, "vllm:request_success_total", "counter", "Count of successfully processed requests.");
  for (int i = 0; i < FIN_COUNT; i++)
    fprintf(f, "vllm:request_success_total{%s,finished_reason=\"%s\"} %llu\n", h->labels, fin_names[i],
            (unsigned long long)atomic_load(&h->finished[i]));
  vllm_counter(f, h, "vllm:num_preemptions_total", "Cumulative number of preemption from the engine.",
               st->preemptions);
  vllm_counter(f, h, "vllm:prefix_cache_queries_total",
               "Prefix cache queries, in terms of number of queried tokens.", st->prefix_queries);
  vllm_counter(f, h, "vllm:prefix_cache_hits_total", "Prefix cache hits, in terms of number of cached tokens.",
               st->prefix_hits);
  vllm_hist(f, h, "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", &lat->ttft);
  vllm_hist(f, h, "vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", &lat->itl);
  vllm_hist(f, h, "vllm:request_time_per_output_token_seconds",
            "Histogram of time_per_output_token_seconds per request.", &lat->tpot);
  vllm_hist(f, h, "vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", &s->e2e);
  vllm_hist(f, h, "vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.",
            &s->queue);
  vllm_hist(f, h, "vllm:request_inference_time_seconds", "Histogram of time spent in RUNNING phase for request.",
            &s->inference);
  vllm_hist(f, h, "vllm:request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request.",
            &s->prefill);
  vllm_hist(f, h, "vllm:request_decode_time_seconds", "Histogram of time spent in DECODE phase for request.",
            &s->decode);
  ms_prometheus_histogram_n(f, "vllm:request_prompt_tokens", "Number of prefill tokens processed.", h->labels,
                            s->prompt.bounds, s->prompt.n, s->prompt.counts, s->prompt.sum);
  ms_prometheus_histogram_n(f, "vllm:request_generation_tokens", "Number of generation tokens processed.", h->labels,
                            s->gen.bounds, s->gen.n, s->gen.counts, s->gen.sum);
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
  struct serving_snap s;
  snap_take(h, &s);
  ms_prometheus_histogram(f, "megascope_e2e_request_latency_seconds", "Request latency, arrival to last token.",
                          &s.e2e);
  ms_prometheus_histogram(f, "megascope_request_queue_time_seconds", "Time a request waited for a batch slot.",
                          &s.queue);
  ms_prometheus_histogram(f, "megascope_request_prefill_time_seconds", "Admission to first token, per request.",
                          &s.prefill);
  ms_prometheus_histogram(f, "megascope_request_decode_time_seconds", "First token to last token, per request.",
                          &s.decode);
  ms_prometheus_histogram(f, "megascope_request_inference_time_seconds", "Admission to last token, per request.",
                          &s.inference);
  ms_prometheus_histogram_n(f, "megascope_request_prompt_tokens", "Prompt tokens, per finished request.", "",
                            s.prompt.bounds, s.prompt.n, s.prompt.counts, s.prompt.sum);
  ms_prometheus_histogram_n(f, "megascope_request_generation_tokens", "Tokens generated, per finished request.", "",
                            s.gen.bounds, s.gen.n, s.gen.counts, s.gen.sum);
  if (h->compat) {
    struct ms_latency_stats lat;
    ms_engine_latency(h->e, &lat);
    write_vllm_metrics(h, f, &st, &lat, &s);
  }
}

/* Connections, fair shares and attachments against their bounds. */
static void write_limit_metrics(struct ms_http *h, FILE *f) {
  struct gate_stats gs;
  gate_get_stats(h->gate, &gs);
  gauge(f, "megascope_http_connections_open", "HTTP connections held.", gs.open);
  counter(f, "megascope_http_connections_accepted_total", "HTTP connections accepted.", gs.n[GATE_ACCEPTED]);
  ms_prometheus_family(f, "megascope_http_connections_refused_total", "counter",
                       "HTTP connections refused at accept (full: all busy, 503; client: the client's all busy, "
                       "429; fds: out of descriptors, 503).");
  static const struct { const char *label; int i; } refused[] = {
      {"full", GATE_REFUSED_FULL}, {"client", GATE_REFUSED_CLIENT}, {"fds", GATE_REFUSED_FDS}};
  for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++)
    fprintf(f, "megascope_http_connections_refused_total{reason=\"%s\"} %llu\n", refused[i].label,
            (unsigned long long)gs.n[refused[i].i]);
  ms_prometheus_family(f, "megascope_http_connections_closed_total", "counter",
                       "HTTP connections the server closed: evicted (idle, for room), or past a deadline.");
  for (int i = GATE_EVICTED; i < GATE_COUNT; i++)
    fprintf(f, "megascope_http_connections_closed_total{reason=\"%s\"} %llu\n", gate_count_names[i],
            (unsigned long long)gs.n[i]);
  ms_prometheus_family(f, "megascope_http_requests_refused_total", "counter",
                       "Generation requests refused by a bound: one request's (400) or a client's share or the "
                       "queue (429).");
  for (int i = 0; i < REF_COUNT; i++)
    fprintf(f, "megascope_http_requests_refused_total{reason=\"%s\"} %llu\n", ref_names[i],
            (unsigned long long)atomic_load_explicit(&h->refused[i], memory_order_relaxed));
  gauge(f, "megascope_http_clients_holding", "Clients with requests queued or running.", share_clients(h->share));
  ms_prometheus_family(f, "megascope_http_limit", "gauge", "The server's bounds (serve --help names them).");
  const struct { const char *name; double v; } lim[] = {
      {"max_connections", h->go.max_conns},           {"max_connections_per_client", h->go.max_per_client},
      {"read_timeout_seconds", h->go.read_ms / 1e3},  {"idle_timeout_seconds", h->go.idle_ms / 1e3},
      {"max_request_tokens", h->max_request_tokens},  {"max_prompt_tokens", h->max_prompt_tokens},
      {"client_max_requests", h->so.max_requests},    {"client_max_tokens", (double)h->so.max_tokens}};
  for (size_t i = 0; i < sizeof lim / sizeof lim[0]; i++)
    fprintf(f, "megascope_http_limit{limit=\"%s\"} %.9g\n", lim[i].name, lim[i].v);
  struct ms_attach_usage au;
  ms_engine_attach_usage(h->e, &au);
  gauge(f, "megascope_attach_attached", "Attachments attached.", au.attached);
  gauge(f, "megascope_attach_retained", "Closed generations kept for read-outs.", au.retained);
  gauge(f, "megascope_attach_fds", "Descriptors the attachments' maps hold.", au.fds);
  gauge(f, "megascope_attach_bytes", "Bytes the attachments' maps hold.", (double)au.bytes);
  counter(f, "megascope_attach_freed_early_total", "Closed generations freed before their retention, for room.",
          au.freed_early);
  counter(f, "megascope_attach_refused_total", "Attaches and replaces refused by the attachments' budget.",
          au.refused);
}

/* The serving series (requests, tokens, latencies, the KV and prefix caches):
 * the ones vLLM's dashboards filter by model_name. The engine's internals
 * (classes, attachments) and the server's own (http, control, otlp) carry
 * no model. */
static const char *const serving_families[] = {
    "megascope_num_requests_", "megascope_kv_cache_usage_perc", "megascope_prompt_tokens_total",
    "megascope_generation_tokens_total", "megascope_request_", "megascope_e2e_request_latency_seconds",
    "megascope_ttft_seconds", "megascope_tpot_seconds", "megascope_inter_token_latency_seconds",
    "megascope_num_preemptions_total", "megascope_prefix_cache_", "megascope_requests_finished_total",
    "megascope_requests_cancelled_total", "megascope_tokens_generated_total", "vllm:", NULL};

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
  write_limit_metrics(h, f);
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
  /* every serving series carries the served model's name, as vLLM's do (dashboards filter on it) */
  char *page = NULL;
  size_t plen = 0;
  FILE *g = open_memstream(&page, &plen);
  rc = g ? ms_prometheus_relabel(buf, len, "model_name", h->model, serving_families, g) : -ENOMEM;
  if (g && fclose(g)) rc = -EIO;
  free(buf);
  if (rc) {
    free(page);
    return respond_error(h, conn, 500, "cannot write the metrics");
  }
  return respond(conn, 200, MS_PROMETHEUS_CONTENT_TYPE, page, plen);
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

/* ---- framing (RFC 9112 section 6) ---- */

struct framing {
  int n_cl, n_te, cl_differ;
  char cl[32], te[128];
};

static enum MHD_Result framing_field(void *cls, enum MHD_ValueKind kind, const char *key, const char *value) {
  struct framing *f = cls;
  if (!value) value = "";
  if (!strcasecmp(key, MHD_HTTP_HEADER_CONTENT_LENGTH)) {
    if (f->n_cl++ == 0)
      snprintf(f->cl, sizeof f->cl, "%s", value);
    else if (strcmp(f->cl, value))
      f->cl_differ = 1;
  } else if (!strcasecmp(key, MHD_HTTP_HEADER_TRANSFER_ENCODING) && f->n_te++ == 0) {
    snprintf(f->te, sizeof f->te, "%s", value);
  }
  return MHD_YES;
}

/* Transfer-Encoding's codings: 0 when it is exactly chunked; 1 when chunked is
 * last after others (not supported); -1 when chunked is not last, or twice. */
static int codings(const char *te) {
  int chunked_at = -1, n = 0;
  char buf[128];
  snprintf(buf, sizeof buf, "%s", te);
  for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save), n++) {
    while (*t == ' ' || *t == '\t') t++;
    size_t k = strlen(t);
    while (k && (t[k - 1] == ' ' || t[k - 1] == '\t')) t[--k] = '\0';
    if (!strcasecmp(t, "chunked")) {
      if (chunked_at >= 0) return -1;
      chunked_at = n;
    }
  }
  if (chunked_at < 0 || chunked_at != n - 1) return -1;
  return n == 1 ? 0 : 1;
}

/* A response queued before the body is read closes the connection (libmicrohttpd discards the rest). */
static enum MHD_Result respond_close(struct ms_http *h, struct MHD_Connection *conn, unsigned status,
                                     const char *code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  enum MHD_Result rc = error_v(h, conn, status, NULL, code, conn_close, fmt, ap);
  va_end(ap);
  return rc;
}

/* Checks a request's framing once its head is in. MHD_YES: go on; otherwise
 * *answered is set and the refusal queued (400, 413 or 501; the connection closes). */
static enum MHD_Result check_framing(struct ms_http *h, struct MHD_Connection *conn, const char *version,
                                     int *answered) {
  struct framing f = {0};
  MHD_get_connection_values(conn, MHD_HEADER_KIND, framing_field, &f);
  *answered = 1;
  if (f.n_te && f.n_cl)
    return respond_close(h, conn, 400, "bad_framing",
                         "both Transfer-Encoding and Content-Length: the body's length is ambiguous");
  if (f.cl_differ)
    return respond_close(h, conn, 400, "bad_framing", "Content-Length given twice with different values");
  if (f.n_te && !strcmp(version, MHD_HTTP_VERSION_1_0))
    return respond_close(h, conn, 400, "bad_framing", "Transfer-Encoding in an HTTP/1.0 request");
  if (f.n_te > 1)
    return respond_close(h, conn, 400, "bad_framing", "Transfer-Encoding given more than once");
  int c = f.n_te ? codings(f.te) : 0;
  if (c < 0)
    return respond_close(h, conn, 400, "bad_framing", "Transfer-Encoding '%s': chunked must be its last coding, once",
                         f.te);
  if (c > 0)
    return respond_close(h, conn, 501, "bad_framing",
                         "Transfer-Encoding '%s': this server takes chunked alone", f.te);
  if (f.n_cl && strtoull(f.cl, NULL, 10) > MAX_BODY)
    return respond_close(h, conn, 413, "body_too_large", "the body is larger than %u bytes", MAX_BODY);
  *answered = 0;
  return MHD_YES;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **state) {
  struct ms_http *h = cls;
  int is_post = !strcmp(method, MHD_HTTP_METHOD_POST);
  struct gate_conn *gc = gate_conn_of(conn);
  if (!*state) {  /* the head is in: the body, if any, is arriving */
    struct body *b = calloc(1, sizeof *b);
    if (!b) return MHD_NO;
    *state = b;
    int answered;
    gate_set_phase(h->gate, gc, GATE_PHASE_BODY);
    enum MHD_Result rc = check_framing(h, conn, version, &answered);
    if (!answered && gate_reserved(gc) && strcmp(url, "/health") && strcmp(url, "/metrics")) {
      answered = 1;
      rc = respond_close(h, conn, 503, "overloaded",
                         "every connection of the server is answering a request; only /health and /metrics are "
                         "answered now: retry in a moment");
    }
    if (answered) {
      gate_set_phase(h->gate, gc, GATE_PHASE_BUSY);
      return rc;
    }
    /* the body (empty for a GET) follows: answering now would close the
     * connection (libmicrohttpd discards what it has not read) */
    return MHD_YES;
  }
  struct body *b = *state;
  if (*upload_size) {  /* a body: kept for a POST, read past otherwise */
    if (!is_post) {
      *upload_size = 0;
      return MHD_YES;
    }
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
  gate_set_phase(h->gate, gc, GATE_PHASE_BUSY);  /* the request is whole */
  return route(h, conn, url, method, b);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **state, enum MHD_RequestTerminationCode t) {
  struct ms_http *h = cls;
  struct body *b = *state;
  if (b) {
    free(b->buf);
    free(b);
  }
  *state = NULL;
  gate_set_phase(h->gate, gate_conn_of(conn), GATE_PHASE_WAIT);
}

/* The request line is in (libmicrohttpd's URI logger): its head is now due. */
static void *on_uri(void *cls, const char *uri, struct MHD_Connection *conn) {
  struct ms_http *h = cls;
  gate_set_phase(h->gate, gate_conn_of(conn), GATE_PHASE_HEAD);
  return NULL;
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
  /* structured output ends at the template's end of turn, or the model's EOS */
  int eot = o->tok && o->chat_ok ? ms_chat_eot_id(v->chat, o->tok) : -1, eos = m->cfg.eos;
  v->so = o->tok && (eot >= 0 || eos >= 0) ? so_engine_new(o->tok, v->vocab, eot >= 0 ? eot : eos, eot >= 0 ? eos : -1)
                                            : NULL;
}

/* The bounds, from the options or their defaults. */
static void set_limits(struct ms_http *h, const struct ms_http_opts *o) {
  int ctx2 = 2 * h->env.max_ctx;
  h->go = (struct gate_opts){.max_conns = o->max_connections > 0 ? o->max_connections : 512,
                             .max_per_client = o->max_connections_per_client > 0 ? o->max_connections_per_client : 128,
                             .read_ms = o->read_timeout_ms > 0 ? o->read_timeout_ms : 10000,
                             .idle_ms = o->idle_timeout_ms > 0 ? o->idle_timeout_ms : 15000};
  h->so = (struct share_opts){.max_requests = o->client_max_requests > 0 ? o->client_max_requests : 128,
                              .max_tokens = o->client_max_tokens > 0 ? (uint64_t)o->client_max_tokens
                                            : (uint64_t)(65536 > 8 * ctx2 ? 65536 : 8 * ctx2)};
  h->max_request_tokens = o->max_request_tokens > 0 ? o->max_request_tokens : 8192 > ctx2 ? 8192 : ctx2;
  h->max_prompt_tokens = o->max_prompt_tokens > 0 ? o->max_prompt_tokens : 8192 > ctx2 ? 8192 : ctx2;
}

static void http_release(struct ms_http *h) {
  so_engine_free(h->env.so);
  gate_free(h->gate);
  share_free(h->share);
  pthread_mutex_destroy(&h->mu);
  free(h);
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
  set_limits(h, o);
  snprintf(h->model, sizeof h->model, "%s", o->model_name ? o->model_name : "megascope");
  h->env.model = h->model;
  h->env.any_model = o->accept_any_model;
  h->compat = o->metrics_compat == 1;
  {
    FILE *lf = fmemopen(h->labels, sizeof h->labels, "w");
    if (lf) {
      fputs("model_name=", lf);
      ms_prometheus_label_value(lf, h->model);
      fputs(",engine=\"0\"", lf);  /* vLLM labels each engine core; megascope has one */
      fclose(lf);
    }
  }
  tok_hist_init(&h->prompt_hist, h->env.max_ctx);
  tok_hist_init(&h->gen_hist, h->env.max_ctx);
  pthread_mutex_init(&h->mu, NULL);
  socklen_t sl = ss.ss_family == AF_INET6 ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in);
  if (!(h->share = share_new(&h->so)) || !(h->gate = gate_new((struct sockaddr *)&ss, sl, &h->go, log))) {
    int err = errno ? errno : ENOMEM;
    ms_textbuf_printf(log, "http: cannot serve on %s:%d: %s\n", h->host, o->port, strerror(err));
    http_release(h);
    errno = err;
    return NULL;
  }
  h->port = gate_port(h->gate);
  /* the gate accepts and hands connections over; its limits are the real
   * ones, libmicrohttpd's is only above them (it would drop silently) */
  unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL |
                   MHD_USE_ERROR_LOG | MHD_USE_NO_LISTEN_SOCKET | MHD_USE_ITC;
  h->d = MHD_start_daemon(flags, 0, NULL, NULL, on_request, h, MHD_OPTION_CONNECTION_LIMIT,
                          (unsigned)(4 * h->go.max_conns + 64), MHD_OPTION_CONNECTION_TIMEOUT,
                          (unsigned)((h->go.idle_ms + 999) / 1000), MHD_OPTION_NOTIFY_COMPLETED, on_completed, h,
                          MHD_OPTION_NOTIFY_CONNECTION, gate_notify, h->gate, MHD_OPTION_URI_LOG_CALLBACK, on_uri, h,
                          MHD_OPTION_EXTERNAL_LOGGER, on_log, h, MHD_OPTION_END);
  int err = h->d ? -gate_start(h->gate, h->d) : (errno ? errno : EINVAL);
  if (err) {
    ms_textbuf_printf(log, "http: cannot start serving on %s:%d: %s\n", h->host, h->port, strerror(err));
    if (h->d) MHD_stop_daemon(h->d);
    http_release(h);
    errno = err;
    return NULL;
  }
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
  gate_stop(h->gate);  /* no new connections; then libmicrohttpd closes the ones it has */
  MHD_stop_daemon(h->d);
  http_release(h);
}

int ms_http_port(const struct ms_http *h) { return h->port; }
const char *ms_http_host(const struct ms_http *h) { return h->host; }

void ms_http_get_stats(const struct ms_http *h, struct ms_http_stats *out) {
  struct ms_http *m = (struct ms_http *)h;
  out->completions = atomic_load_explicit(&m->completions, memory_order_relaxed);
  out->rejected = atomic_load_explicit(&m->rejected, memory_order_relaxed);
  out->scrapes = atomic_load_explicit(&m->scrapes, memory_order_relaxed);
  out->cancelled = atomic_load_explicit(&m->cancelled, memory_order_relaxed);
  struct gate_stats gs;
  gate_get_stats(m->gate, &gs);
  out->connections = gs.open;
  out->conn_refused = gs.n[GATE_REFUSED_FULL] + gs.n[GATE_REFUSED_CLIENT] + gs.n[GATE_REFUSED_FDS];
  out->conn_closed = 0;
  for (int i = GATE_EVICTED; i < GATE_COUNT; i++) out->conn_closed += gs.n[i];
  out->over_share = 0;
  for (int i = REF_CLIENT_REQUESTS; i < REF_COUNT; i++)
    out->over_share += atomic_load_explicit(&m->refused[i], memory_order_relaxed);
}
