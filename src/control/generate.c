/* SPDX-License-Identifier: MIT */
/* Generation jobs of the OpenAI API (openai.h): one engine request per choice,
 * each token decoded as it is sampled, stop strings cut, whole UTF-8 out, as
 * one JSON answer or as server-sent events in OpenAI's chunk format.
 *
 * A choice's text goes through its own text stream (megascope/textstream.h):
 * a token's bytes are pushed, what can no longer be part of a stop string or a
 * split character is taken and sent. A stop string ends the choice at once
 * (ms_request_stop frees its slot at the next step start); so does the
 * engine's own end (EOS, end of turn, max_tokens). The token that ended a
 * choice by being special (EOS, end of turn) is counted in usage but has no
 * text; other control tokens have none either. */
#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "control/openai.h"
#include "control/structured.h"
#include "megascope/base.h"
#include "megascope/export.h"
#include "megascope/json.h"
#include "megascope/textstream.h"
#include "megascope/tokenizer.h"

struct choice {
  struct ms_request *r;
  struct ms_textstream *ts;
  int prompt;            /* which prompt */
  int seen;              /* tokens consumed */
  int used;              /* tokens that count: text, or the special token that ended it */
  int texted;            /* tokens whose text was pushed (logprobs cover these) */
  int string_stop;       /* a stop string matched */
  int done, failed;
  int role_sent;         /* chat streaming: the role delta went out */
  const char *finish;    /* "stop", "length"; NULL while running */
  char *text;            /* non-streaming: the whole text */
  size_t text_len, text_cap;
  size_t *offset;        /* [max_tokens] byte offset of each token's text (completions logprobs) */
  size_t raw_bytes;      /* decoded bytes pushed so far (echo included) */
  int lp_from;           /* streaming: the first token whose logprobs are not sent yet */
};

struct oa_gen {
  struct ms_engine *e;
  const struct oa_env *env;
  struct oa_req req;
  struct oa_sink sink;
  char model[64], id[64];
  int64_t created;
  int n;
  struct choice *c;
  int ended;             /* streaming: the final events were written */
  struct ms_request_span tp;  /* the caller's trace context (has_parent: there is one) */
};

static _Atomic uint64_t seed_counter;

/* Text as valid UTF-8 for JSON: invalid sequences (and NUL bytes) become U+FFFD. */
char *oa_utf8_repair(const char *s, size_t n) {
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

/* The bytes of one token (NUL-terminated in buf); 0 for a control token. */
static size_t token_bytes(const struct oa_env *env, int32_t id, char *buf, size_t size) {
  buf[0] = '\0';
  if (!env->tok || ms_tokenizer_is_control(env->tok, id)) return 0;
  long n = ms_tokenizer_decode(env->tok, &id, 1, buf, size);
  return n < 0 ? 0 : (size_t)n < size ? (size_t)n : size - 1;
}

static int append(struct choice *c, const char *s, size_t n) {
  if (c->text_len + n + 1 > c->text_cap) {
    size_t cap = (c->text_len + n + 1) * 2;
    char *t = realloc(c->text, cap);
    if (!t) return -ENOMEM;
    c->text = t;
    c->text_cap = cap;
  }
  memcpy(c->text + c->text_len, s, n);
  c->text_len += n;
  c->text[c->text_len] = '\0';
  return 0;
}

/* ---- starting ---- */

static struct ms_request *submit(struct oa_gen *g, int i) {
  const struct oa_req *q = &g->req;
  struct choice *c = &g->c[i];
  int32_t stop_ids[2];
  int n_stop = 0;
  const struct oa_env *env = g->env;
  if (env->tok && env->chat_ok && !q->ignore_eos) {  /* the template's end of turn ends a completion too */
    int eot = ms_chat_eot_id(env->chat, env->tok);
    if (eot >= 0) stop_ids[n_stop++] = eot;
  }
  uint64_t seed = q->has_seed ? q->seed + (uint64_t)(i % q->n)
                              : (uint64_t)time(NULL) * 0x9e3779b97f4a7c15ull ^ atomic_fetch_add(&seed_counter, 1);
  struct ms_request_opts ro = {.sz = sizeof ro, .prompt = q->prompts[c->prompt], .n_prompt = q->n_prompt[c->prompt],
                               .max_new_tokens = q->max_tokens, .stop_at_eos = !q->ignore_eos,
                               .temperature = q->temperature, .top_k = q->top_k > 0 ? q->top_k : 0,
                               .top_p = q->top_p, .sample_seed = seed, .min_p = q->min_p,
                               .presence_penalty = q->presence, .frequency_penalty = q->frequency,
                               .bias_ids = q->bias_ids, .bias_vals = q->bias_vals, .n_bias = q->n_bias,
                               .stop_ids = stop_ids, .n_stop_ids = n_stop, .logprobs = q->logprobs,
                               .top_logprobs = q->top_logprobs, .client = q->client};
  if (q->schema) {  /* each choice its own matcher; the engine frees it with the request */
    if (!(ro.constrain_user = so_constraint_new(q->schema))) return NULL;
    ro.constrain = so_constrain;
    ro.constrain_free = so_constraint_free;
  }
  struct ms_request *r = ms_engine_submit(g->e, &ro);
  if (!r) {
    int err = errno;
    so_constraint_free(ro.constrain_user);
    errno = err;
  }
  return r;
}

/* echo: the prompt's text starts the choice's text. */
static void echo_prompt(struct oa_gen *g, struct choice *c) {
  const int32_t *ids = g->req.prompts[c->prompt];
  int n = g->req.n_prompt[c->prompt];
  char buf[256];
  for (int i = 0; i < n; i++) {
    size_t k = token_bytes(g->env, ids[i], buf, sizeof buf);
    c->raw_bytes += k;
    append(c, buf, k);
  }
}

struct oa_gen *oa_gen_start(struct ms_engine *e, const struct oa_env *env, struct oa_req *r, const char *model,
                            const char *id, const struct oa_sink *sink, unsigned *status, char *msg, size_t msg_n) {
  struct oa_gen *g = calloc(1, sizeof *g);
  int n = r->n_prompts * r->n;
  if (g) g->c = calloc((size_t)n, sizeof *g->c);
  if (!g || !g->c) {
    free(g);
    oa_req_free(r);
    *status = 500;
    snprintf(msg, msg_n, "out of memory");
    return NULL;
  }
  g->e = e;
  g->env = env;
  g->req = *r;
  memset(r, 0, sizeof *r);
  if (sink) g->sink = *sink;
  snprintf(g->model, sizeof g->model, "%s", model);
  snprintf(g->id, sizeof g->id, "%s", id);
  g->created = (int64_t)time(NULL);
  g->n = n;
  for (int i = 0; i < n; i++) {
    struct choice *c = &g->c[i];
    c->prompt = i / g->req.n;
    c->ts = ms_textstream_new((const char *const *)g->req.stops, g->req.n_stops);
    c->offset = calloc((size_t)g->req.max_tokens, sizeof *c->offset);
    if (!c->ts || !c->offset) {
      *status = 500;
      snprintf(msg, msg_n, "out of memory");
      oa_gen_cancel(g);
      oa_gen_free(g);
      return NULL;
    }
    if (g->req.echo) echo_prompt(g, c);
    if (!(c->r = submit(g, i))) {
      int err = errno;
      *status = err == EINVAL || err == E2BIG ? 400 : err == EAGAIN ? 429 : 503;
      snprintf(msg, msg_n, "%s", err == E2BIG    ? "the prompt and max_tokens exceed the engine's context"
                                 : err == EINVAL ? "the engine refused the request's options"
                                 : err == EAGAIN ? "the engine's queue is full (--max-queued); retry in a moment"
                                 : err == ESHUTDOWN ? "the engine has stopped"
                                                    : "the engine cannot take the request now");
      oa_gen_cancel(g);
      oa_gen_free(g);
      return NULL;
    }
  }
  return g;
}

/* ---- consuming tokens ---- */

static const char *finish_name(const struct choice *c, const struct ms_request_info *info) {
  if (c->string_stop || info->finish == MS_FINISH_STOP) return "stop";
  if (info->finish == MS_FINISH_LENGTH) return "length";
  return NULL;
}

/* Feeds the choice's new tokens to its text stream; returns 1 once the choice is over. */
static int consume(struct oa_gen *g, struct choice *c, struct ms_request_info *info) {
  ms_request_get_info(c->r, info);
  int over = info->state == MS_REQ_DONE || info->state == MS_REQ_CANCELLED;
  int upto = info->n_tokens;
  char buf[256];
  for (int i = c->seen; i < upto && !c->string_stop; i++) {
    int special_end = over && i == upto - 1 && info->finish == MS_FINISH_STOP;
    c->used = i + 1;
    if (special_end) break;  /* EOS / end of turn: counted, no text */
    c->texted = i + 1;
    size_t k = token_bytes(g->env, info->tokens[i], buf, sizeof buf);
    c->offset[i] = c->raw_bytes;
    c->raw_bytes += k;
    if (ms_textstream_push(c->ts, buf, k) == 1) {
      c->string_stop = 1;
      ms_request_stop(c->r);  /* the engine may have sampled more: they are not this choice's */
    }
  }
  c->seen = upto;
  if (!c->string_stop && !over) return 0;
  ms_textstream_finish(c->ts);
  c->finish = finish_name(c, info);
  c->failed = !c->finish;
  return 1;
}

/* ---- JSON pieces ---- */

/* Opens a chat logprobs entry {token, logprob, bytes (the caller closes it). */
static void json_token(struct ms_json *j, const struct oa_env *env, int32_t id, float lp) {
  char buf[256];
  size_t k = token_bytes(env, id, buf, sizeof buf);
  char *s = oa_utf8_repair(buf, k);
  ms_json_obj_begin(j);
  ms_json_kstr(j, "token", s ? s : "");
  ms_json_knum(j, "logprob", lp);
  ms_json_key(j, "bytes");
  ms_json_arr_begin(j);
  for (size_t i = 0; i < k; i++) ms_json_int(j, (unsigned char)buf[i]);
  ms_json_arr_end(j);
  free(s);
}

/* chat: {"content": [{token, logprob, bytes, top_logprobs: [...]}, ...]} for tokens [from, to) */
static void json_logprobs_chat(struct ms_json *j, const struct oa_gen *g, const struct ms_request_info *info, int from,
                               int to) {
  ms_json_obj_begin(j);
  ms_json_key(j, "content");
  ms_json_arr_begin(j);
  int k = info->top_logprobs;
  for (int i = from; i < to; i++) {
    json_token(j, g->env, info->tokens[i], info->logprob[i]);
    ms_json_key(j, "top_logprobs");
    ms_json_arr_begin(j);
    for (int t = 0; t < k; t++) {
      json_token(j, g->env, info->top_ids[i * k + t], info->top_lp[i * k + t]);
      ms_json_obj_end(j);
    }
    ms_json_arr_end(j);
    ms_json_obj_end(j);
  }
  ms_json_arr_end(j);
  ms_json_obj_end(j);
}

static char *token_text(const struct oa_env *env, int32_t id) {
  char buf[256];
  size_t k = token_bytes(env, id, buf, sizeof buf);
  return oa_utf8_repair(buf, k);
}

/* completions: {"tokens", "token_logprobs", "top_logprobs", "text_offset"} for tokens [from, to) */
static void json_logprobs_legacy(struct ms_json *j, const struct oa_gen *g, const struct choice *c,
                                 const struct ms_request_info *info, int from, int to) {
  int k = info->top_logprobs;
  ms_json_obj_begin(j);
  ms_json_key(j, "tokens");
  ms_json_arr_begin(j);
  for (int i = from; i < to; i++) {
    char *s = token_text(g->env, info->tokens[i]);
    ms_json_str(j, s ? s : "");
    free(s);
  }
  ms_json_arr_end(j);
  ms_json_key(j, "token_logprobs");
  ms_json_arr_begin(j);
  for (int i = from; i < to; i++) ms_json_num(j, info->logprob[i]);
  ms_json_arr_end(j);
  ms_json_key(j, "top_logprobs");
  if (!k) {
    ms_json_null(j);
  } else {
    ms_json_arr_begin(j);
    for (int i = from; i < to; i++) {
      ms_json_obj_begin(j);
      for (int t = 0; t < k; t++) {
        char *s = token_text(g->env, info->top_ids[i * k + t]);
        ms_json_knum(j, s ? s : "", info->top_lp[i * k + t]);
        free(s);
      }
      ms_json_obj_end(j);
    }
    ms_json_arr_end(j);
  }
  ms_json_key(j, "text_offset");
  ms_json_arr_begin(j);
  for (int i = from; i < to; i++) ms_json_uint(j, c->offset[i]);
  ms_json_arr_end(j);
  ms_json_obj_end(j);
}

/* The logprobs of tokens [from, to) of a choice, or null. */
static void json_logprobs(struct ms_json *j, const struct oa_gen *g, const struct choice *c,
                          const struct ms_request_info *info, int from, int to) {
  ms_json_key(j, "logprobs");
  if (!g->req.logprobs || !info->logprob) {
    ms_json_null(j);
  } else if (g->req.chat) {
    json_logprobs_chat(j, g, info, from, to);
  } else {
    json_logprobs_legacy(j, g, c, info, from, to);
  }
}

static void json_usage(struct ms_json *j, const struct oa_gen *g) {
  int prompt = 0, completion = 0;
  for (int i = 0; i < g->req.n_prompts; i++) prompt += g->req.n_prompt[i];
  for (int i = 0; i < g->n; i++) completion += g->c[i].used;
  ms_json_key(j, "usage");
  ms_json_obj_begin(j);
  ms_json_kint(j, "prompt_tokens", prompt);
  ms_json_kint(j, "completion_tokens", completion);
  ms_json_kint(j, "total_tokens", prompt + completion);
  /* OpenAI's and vLLM's: the prompt tokens read from the prefix cache (each prompt's first choice) */
  int cached = 0;
  for (int p = 0; p < g->req.n_prompts; p++)
    for (int i = 0; i < g->n; i++) {
      if (g->c[i].prompt != p || !g->c[i].r) continue;
      struct ms_request_info info;
      ms_request_get_info(g->c[i].r, &info);
      cached += info.n_cached;
      break;
    }
  ms_json_key(j, "prompt_tokens_details");
  ms_json_obj_begin(j);
  ms_json_kint(j, "cached_tokens", cached);
  ms_json_obj_end(j);
  ms_json_obj_end(j);
}

static void json_head(struct ms_json *j, const struct oa_gen *g, int chunk) {
  ms_json_kstr(j, "id", g->id);
  ms_json_kstr(j, "object",
               g->req.chat ? (chunk ? "chat.completion.chunk" : "chat.completion") : "text_completion");
  ms_json_kint(j, "created", g->created);
  ms_json_kstr(j, "model", g->model);
  ms_json_kstr(j, "system_fingerprint", "megascope");
}

/* ---- streaming ---- */

/* One SSE event for choice i: text (may be empty), its tokens' logprobs, finish. */
static void sse_chunk(struct oa_gen *g, FILE *f, int i, const char *text, size_t n, const char *finish,
                      const struct ms_request_info *info, int role) {
  struct choice *c = &g->c[i];
  char *t = oa_utf8_repair(text, n);
  fputs("data: ", f);
  struct ms_json j;
  ms_json_init(&j, f, 0);
  ms_json_obj_begin(&j);
  json_head(&j, g, 1);
  ms_json_key(&j, "choices");
  ms_json_arr_begin(&j);
  ms_json_obj_begin(&j);
  ms_json_kint(&j, "index", i);
  if (g->req.chat) {
    ms_json_key(&j, "delta");
    ms_json_obj_begin(&j);
    if (role) ms_json_kstr(&j, "role", "assistant");
    if (role || n) ms_json_kstr(&j, "content", t ? t : "");
    ms_json_obj_end(&j);
  } else {
    ms_json_kstr(&j, "text", t ? t : "");
  }
  if (info && g->req.logprobs && c->texted > c->lp_from && !role) {
    json_logprobs(&j, g, c, info, c->lp_from, c->texted);
    c->lp_from = c->texted;
  } else {
    ms_json_key(&j, "logprobs");
    ms_json_null(&j);
  }
  ms_json_key(&j, "finish_reason");
  if (finish)
    ms_json_str(&j, finish);
  else
    ms_json_null(&j);
  ms_json_obj_end(&j);
  ms_json_arr_end(&j);
  if (g->req.include_usage) {
    ms_json_key(&j, "usage");
    ms_json_null(&j);
  }
  ms_json_obj_end(&j);
  ms_json_end(&j);  /* its newline, then the blank line that ends the event */
  fputs("\n", f);
  free(t);
}

static void sse_end(struct oa_gen *g, FILE *f) {
  if (g->req.include_usage) {
    fputs("data: ", f);
    struct ms_json j;
    ms_json_init(&j, f, 0);
    ms_json_obj_begin(&j);
    json_head(&j, g, 1);
    ms_json_key(&j, "choices");
    ms_json_arr_begin(&j);
    ms_json_arr_end(&j);
    json_usage(&j, g);
    ms_json_obj_end(&j);
    ms_json_end(&j);
    fputs("\n", f);
  }
  fputs("data: [DONE]\n\n", f);
  g->ended = 1;
}

static void report(struct oa_gen *g, int i, const struct ms_request_info *info) {
  if (g->sink.request_done) g->sink.request_done(g->sink.user, g, i, info, g->c[i].finish);
}

int oa_gen_pump(struct oa_gen *g, FILE *f, int timeout_ms) {
  if (g->ended) return 1;
  /* wait on the first unfinished choice; the others are looked at too */
  for (int i = 0; i < g->n; i++)
    if (!g->c[i].done) {
      ms_request_wait_tokens(g->c[i].r, g->c[i].seen, timeout_ms);
      break;
    }
  int all = 1;
  for (int i = 0; i < g->n; i++) {
    struct choice *c = &g->c[i];
    if (c->done) continue;
    struct ms_request_info info;
    int over = consume(g, c, &info);
    size_t n;
    const char *text = ms_textstream_take(c->ts, &n);
    if (g->req.stream) {
      if (g->req.chat && !c->role_sent) {
        sse_chunk(g, f, i, "", 0, NULL, NULL, 1);
        c->role_sent = 1;
      }
      if (g->req.echo && c->text_len) {  /* echo: the prompt first, once */
        sse_chunk(g, f, i, c->text, c->text_len, NULL, NULL, 0);
        c->text_len = 0;
      }
      if (n || (g->req.logprobs && c->texted > c->lp_from)) sse_chunk(g, f, i, text, n, NULL, &info, 0);
      if (over && !c->failed) sse_chunk(g, f, i, "", 0, c->finish, &info, 0);
    } else if (n) {
      append(c, text, n);
    }
    if (over) {
      c->done = 1;
      report(g, i, &info);
    } else {
      all = 0;
    }
  }
  if (all && g->req.stream && !oa_gen_failed(g)) sse_end(g, f);
  return all;
}

void oa_gen_write(const struct oa_gen *g, FILE *f) {
  struct ms_json j;
  ms_json_init(&j, f, 0);
  ms_json_obj_begin(&j);
  json_head(&j, g, 0);
  ms_json_key(&j, "choices");
  ms_json_arr_begin(&j);
  for (int i = 0; i < g->n; i++) {
    const struct choice *c = &g->c[i];
    struct ms_request_info info;
    ms_request_get_info(c->r, &info);
    ms_json_obj_begin(&j);
    ms_json_kint(&j, "index", i);
    if (g->req.chat) {
      ms_json_key(&j, "message");
      ms_json_obj_begin(&j);
      ms_json_kstr(&j, "role", "assistant");
      ms_json_kstr(&j, "content", c->text ? c->text : "");
      ms_json_obj_end(&j);
    } else {
      ms_json_kstr(&j, "text", c->text ? c->text : "");
    }
    json_logprobs(&j, g, c, &info, 0, c->texted);
    ms_json_kstr(&j, "finish_reason", c->finish ? c->finish : "abort");
    ms_json_obj_end(&j);
  }
  ms_json_arr_end(&j);
  json_usage(&j, g);
  ms_json_obj_end(&j);
  ms_json_end(&j);
}

void oa_gen_write_abort(struct oa_gen *g, FILE *f, const char *why) {
  fputs("data: ", f);
  oa_write_error(f, 503, why, NULL, "aborted");
  fputs("\ndata: [DONE]\n\n", f);
  g->ended = 1;
}

void oa_gen_cancel(struct oa_gen *g) {
  for (int i = 0; i < g->n; i++) {
    struct choice *c = &g->c[i];
    if (!c->r || c->done) continue;
    ms_request_cancel(c->r);
    struct ms_request_info info;
    ms_request_get_info(c->r, &info);
    c->done = c->failed = 1;
    c->finish = NULL;
    report(g, i, &info);
  }
}

int oa_gen_stream(const struct oa_gen *g) { return g->req.stream; }
void oa_gen_set_traceparent(struct oa_gen *g, const struct ms_request_span *tp) { g->tp = *tp; }
const struct ms_request_span *oa_gen_traceparent(const struct oa_gen *g) { return &g->tp; }
const char *oa_gen_id(const struct oa_gen *g) { return g->id; }
int oa_gen_is_chat(const struct oa_gen *g) { return g->req.chat; }
int oa_gen_max_tokens(const struct oa_gen *g) { return g->req.max_tokens; }

int oa_gen_failed(const struct oa_gen *g) {
  for (int i = 0; i < g->n; i++)
    if (g->c[i].failed) return 1;
  return 0;
}

void oa_gen_free(struct oa_gen *g) {
  if (!g) return;
  for (int i = 0; i < g->n; i++) {
    ms_request_free(g->c[i].r);  /* one still running is freed by the engine when it ends */
    ms_textstream_free(g->c[i].ts);
    free(g->c[i].text);
    free(g->c[i].offset);
  }
  free(g->c);
  oa_req_free(&g->req);
  free(g);
}
