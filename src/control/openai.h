/* SPDX-License-Identifier: MIT */
/* The OpenAI API of the HTTP server (private to src/control): a request body
 * parsed and checked into one generation job, and the job run against the
 * engine into a JSON answer or a stream of server-sent events.
 *
 * Parsing (openai.c) refuses a wrong type or an out-of-range value with the
 * field it names (OpenAI's error "param"), never ignores a field it knows.
 * Generation (generate.c) submits one engine request per choice (prompts x n),
 * decodes each token as it is sampled, cuts stop strings and returns whole
 * UTF-8 characters (megascope/textstream.h); special tokens end a choice and
 * never reach its text. */
#ifndef MS_CONTROL_OPENAI_H
#define MS_CONTROL_OPENAI_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "megascope/chat.h"
#include "megascope/engine.h"

struct so_engine;
struct so_schema;

#define OA_MAX_STOPS 4
#define OA_MAX_CHOICES 64   /* prompts x n in one request */

/* What parsing needs to know about the server. */
struct oa_env {
  const struct ms_tokenizer *tok;   /* NULL: prompts are token ids only */
  int vocab, max_ctx;
  int max_tokens_default;
  float temperature_default;
  enum ms_chat_template chat;       /* the template chat requests are rendered with */
  int chat_ok;                      /* 0: no template (chat requests are refused) */
  int bos;                          /* put before a rendered chat prompt; -1: none */
  struct so_engine *so;             /* structured output (control/structured.h); NULL: refused */
  const char *model;                /* the served model's id: a request naming another gets 404 */
  int any_model;                    /* 1: serve whatever model a request names */
};

/* One parsed request. */
struct oa_req {
  int chat;                         /* /v1/chat/completions */
  int stream, include_usage, echo;
  int ignore_eos;                   /* vLLM's extension: EOS and the end of turn do not stop it */
  int n, max_tokens;
  int logprobs, top_logprobs;       /* completions: logprobs = k gives k alternatives */
  float temperature, top_p, min_p, presence, frequency;
  int top_k;
  int has_seed;
  uint64_t seed;
  int32_t *bias_ids;
  float *bias_vals;
  int n_bias;
  char *stops[OA_MAX_STOPS];
  int n_stops;
  int32_t **prompts;                /* [n_prompts] token ids */
  int *n_prompt;
  int n_prompts;
  char *prompt_text;                /* a chat request's rendered prompt (for echo/logging) */
  uint64_t client;                  /* the engine's fair-queue client (set by the server; 0: none) */
  struct so_schema *schema;         /* response_format json_object / json_schema: every choice's constraint */
};

/* 0, or the HTTP status (400, 500) with the message in msg and the field in
 * param ("" when the whole body is at fault). */
unsigned oa_parse(const struct oa_env *env, const char *body, size_t len, int chat, struct oa_req *r, char *msg,
                  size_t msg_n, char *param, size_t param_n);
void oa_req_free(struct oa_req *r);

/* Writes an OpenAI error object {"error": {message, type, param, code}}. */
void oa_write_error(FILE *f, unsigned status, const char *msg, const char *param, const char *code);

/* ---- generation (generate.c) ---- */

struct oa_gen;
struct ms_http;

/* Where generation reports (the server's counters and exporters). */
struct oa_sink {
  void (*request_done)(void *user, const struct oa_gen *g, int choice, const struct ms_request_info *info,
                       const char *finish);
  void *user;
};

/* Submits every choice of r (which it takes over). NULL with the HTTP status
 * and message set when the engine refuses one (a choice already submitted is
 * cancelled). */
struct oa_gen *oa_gen_start(struct ms_engine *e, const struct oa_env *env, struct oa_req *r, const char *model,
                            const char *id, const struct oa_sink *sink, unsigned *status, char *msg, size_t msg_n);
/* Consumes what the engine produced, waiting up to timeout_ms for something
 * new; with streaming, writes the SSE events for it to f (NULL when not
 * streaming). 1 when every choice has finished (and, streaming, the final
 * events are written), else 0. */
int oa_gen_pump(struct oa_gen *g, FILE *f, int timeout_ms);
/* The whole answer of a finished non-streaming job (JSON). */
void oa_gen_write(const struct oa_gen *g, FILE *f);
/* Ends every unfinished choice (the client left, or the server is stopping). */
void oa_gen_cancel(struct oa_gen *g);
/* Streaming: the error event for a job cut short, then [DONE]. */
void oa_gen_write_abort(struct oa_gen *g, FILE *f, const char *why);
int oa_gen_stream(const struct oa_gen *g);
int oa_gen_failed(const struct oa_gen *g);     /* a choice ended without finishing (cancelled) */
const char *oa_gen_id(const struct oa_gen *g);
int oa_gen_is_chat(const struct oa_gen *g);
int oa_gen_max_tokens(const struct oa_gen *g);
/* The caller's W3C trace context, carried to the job's spans. */
struct ms_request_span;
void oa_gen_set_traceparent(struct oa_gen *g, const struct ms_request_span *tp);
const struct ms_request_span *oa_gen_traceparent(const struct oa_gen *g);
/* Text as valid UTF-8 for JSON: invalid sequences and NUL bytes become U+FFFD (malloc'ed). */
char *oa_utf8_repair(const char *s, size_t n);
void oa_gen_free(struct oa_gen *g);

#endif
