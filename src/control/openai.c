/* SPDX-License-Identifier: MIT */
/* Request bodies of the OpenAI API checked into generation jobs (openai.h).
 *
 * Every field the API defines for completions and chat completions is either
 * honoured or refused by name; the checks follow OpenAI's documented ranges
 * (temperature 0..2, penalties -2..2, logit_bias -100..100, at most 4 stop
 * strings, top_logprobs 0..20, completions' logprobs 0..5) and vLLM's for its
 * extensions (top_k, min_p). Unknown fields are ignored, as vLLM does. */
#include <errno.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "control/openai.h"
#include "control/structured.h"
#include "megascope/json.h"
#include "megascope/tokenizer.h"

#define MAX_PROMPT_BYTES (1 << 20)
#define MAX_STOP_BYTES 512

struct pctx {
  const struct oa_env *env;
  struct oa_req *r;
  char *msg, *param;
  size_t msg_n, param_n;
  unsigned status;
};

static unsigned fail(struct pctx *c, unsigned status, const char *param, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(c->msg, c->msg_n, fmt, ap);
  va_end(ap);
  snprintf(c->param, c->param_n, "%s", param);
  return c->status = status;
}

/* A number field in [lo, hi] (absent or null: *out unchanged). */
static unsigned get_num(struct pctx *c, json_t *o, const char *k, double lo, double hi, float *out) {
  json_t *v = json_object_get(o, k);
  if (!v || json_is_null(v)) return 0;
  if (!json_is_number(v)) return fail(c, 400, k, "'%s' must be a number", k);
  double d = json_number_value(v);
  if (!(d >= lo && d <= hi)) return fail(c, 400, k, "'%s' is %g; it must be in [%g, %g]", k, d, lo, hi);
  *out = (float)d;
  return 0;
}

static unsigned get_int(struct pctx *c, json_t *o, const char *k, long long lo, long long hi, int *out) {
  json_t *v = json_object_get(o, k);
  if (!v || json_is_null(v)) return 0;
  if (!json_is_integer(v)) return fail(c, 400, k, "'%s' must be an integer", k);
  long long x = json_integer_value(v);
  if (x < lo || x > hi) return fail(c, 400, k, "'%s' is %lld; it must be in [%lld, %lld]", k, x, lo, hi);
  *out = (int)x;
  return 0;
}

static unsigned get_bool(struct pctx *c, json_t *o, const char *k, int *out) {
  json_t *v = json_object_get(o, k);
  if (!v || json_is_null(v)) return 0;
  if (!json_is_boolean(v)) return fail(c, 400, k, "'%s' must be true or false", k);
  *out = json_is_true(v);
  return 0;
}

static unsigned get_stops(struct pctx *c, json_t *o) {
  json_t *v = json_object_get(o, "stop");
  if (!v || json_is_null(v)) return 0;
  json_t *one[1] = {v};
  size_t n = json_is_array(v) ? json_array_size(v) : 1;
  if (!json_is_string(v) && !json_is_array(v)) return fail(c, 400, "stop", "'stop' must be a string or an array of strings");
  if (n > OA_MAX_STOPS) return fail(c, 400, "stop", "'stop' has %zu strings; at most %d", n, OA_MAX_STOPS);
  for (size_t i = 0; i < n; i++) {
    json_t *s = json_is_array(v) ? json_array_get(v, i) : one[0];
    if (!json_is_string(s)) return fail(c, 400, "stop", "'stop'[%zu] must be a string", i);
    size_t len = json_string_length(s);
    if (len == 0 || len > MAX_STOP_BYTES)
      return fail(c, 400, "stop", "'stop'[%zu] must be 1..%d bytes long", i, MAX_STOP_BYTES);
    if (!(c->r->stops[c->r->n_stops++] = strdup(json_string_value(s)))) return fail(c, 500, "", "out of memory");
  }
  return 0;
}

/* logit_bias: {"token id": bias}; ids as decimal strings, as OpenAI sends them. */
static unsigned get_bias(struct pctx *c, json_t *o) {
  json_t *v = json_object_get(o, "logit_bias");
  if (!v || json_is_null(v)) return 0;
  if (!json_is_object(v)) return fail(c, 400, "logit_bias", "'logit_bias' must be an object of token id: bias");
  size_t n = json_object_size(v);
  if (n > 1024) return fail(c, 400, "logit_bias", "'logit_bias' has %zu entries; at most 1024", n);
  struct oa_req *r = c->r;
  r->bias_ids = malloc((n ? n : 1) * sizeof *r->bias_ids);
  r->bias_vals = malloc((n ? n : 1) * sizeof *r->bias_vals);
  if (!r->bias_ids || !r->bias_vals) return fail(c, 500, "", "out of memory");
  const char *k;
  json_t *b;
  json_object_foreach(v, k, b) {
    char *end;
    errno = 0;
    long id = strtol(k, &end, 10);
    if (!*k || *end || errno || id < 0 || id >= c->env->vocab)
      return fail(c, 400, "logit_bias", "'logit_bias' key '%s' is not a token id in [0, %d)", k, c->env->vocab);
    if (!json_is_number(b) || json_number_value(b) < -100 || json_number_value(b) > 100)
      return fail(c, 400, "logit_bias", "'logit_bias'[\"%s\"] must be a number in [-100, 100]", k);
    r->bias_ids[r->n_bias] = (int32_t)id;
    r->bias_vals[r->n_bias++] = (float)json_number_value(b);
  }
  return 0;
}

/* ---- prompts ---- */

static int32_t *add_prompt(struct pctx *c, int n) {
  struct oa_req *r = c->r;
  if (r->n_prompts == OA_MAX_CHOICES) {
    fail(c, 400, "prompt", "at most %d prompts in one request", OA_MAX_CHOICES);
    return NULL;
  }
  int32_t **pp = realloc(r->prompts, (size_t)(r->n_prompts + 1) * sizeof *pp);
  int *np = pp ? realloc(r->n_prompt, (size_t)(r->n_prompts + 1) * sizeof *np) : NULL;
  if (pp) r->prompts = pp;
  if (np) r->n_prompt = np;
  int32_t *ids = np ? malloc((size_t)(n > 0 ? n : 1) * sizeof *ids) : NULL;
  if (!ids) {
    fail(c, 500, "", "out of memory");
    return NULL;
  }
  r->prompts[r->n_prompts] = ids;
  r->n_prompt[r->n_prompts++] = n;
  return ids;
}

/* Encodes text (with the BOS the tokenizer asks for, or `bos` when >= 0). */
static unsigned encode(struct pctx *c, const char *param, const char *text, size_t len, int bos) {
  if (!c->env->tok)
    return fail(c, 400, param, "this model has no vocabulary of 256 ids or more: send 'prompt' as token ids");
  if (len > MAX_PROMPT_BYTES) return fail(c, 400, param, "'%s' is longer than %d bytes", param, MAX_PROMPT_BYTES);
  int max = (int)len + 1;
  int32_t *ids = add_prompt(c, max);
  if (!ids) return c->status;
  int off = 0;
  if (bos < 0) bos = ms_tokenizer_add_bos(c->env->tok);
  if (bos >= 0) ids[off++] = bos;
  int k = len ? ms_tokenizer_encode(c->env->tok, text, len, ids + off, max - off) : 0;
  if (k < 0 || k > max - off) return fail(c, 400, param, "cannot tokenize '%s'", param);
  if (k + off == 0) return fail(c, 400, param, "'%s' is empty", param);
  c->r->n_prompt[c->r->n_prompts - 1] = k + off;
  return 0;
}

static unsigned ids_prompt(struct pctx *c, json_t *a, const char *where) {
  size_t n = json_array_size(a);
  if (n == 0) return fail(c, 400, "prompt", "%s is an empty list of token ids", where);
  int32_t *ids = add_prompt(c, (int)n);
  if (!ids) return c->status;
  for (size_t i = 0; i < n; i++) {
    json_t *v = json_array_get(a, i);
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= c->env->vocab)
      return fail(c, 400, "prompt", "%s[%zu] is not a token id in [0, %d)", where, i, c->env->vocab);
    ids[i] = (int32_t)json_integer_value(v);
  }
  return 0;
}

/* A string, a list of strings, a list of ids, or a list of lists of ids. */
static unsigned get_prompt(struct pctx *c, json_t *o) {
  json_t *p = json_object_get(o, "prompt");
  if (!p || json_is_null(p)) return fail(c, 400, "prompt", "missing field 'prompt'");
  if (json_is_string(p)) return encode(c, "prompt", json_string_value(p), json_string_length(p), -1);
  if (!json_is_array(p) || json_array_size(p) == 0)
    return fail(c, 400, "prompt", "'prompt' must be a string, a list of strings, token ids or lists of token ids");
  json_t *first = json_array_get(p, 0);
  if (json_is_integer(first)) return ids_prompt(c, p, "'prompt'");
  for (size_t i = 0; i < json_array_size(p); i++) {
    json_t *v = json_array_get(p, i);
    char where[32];
    snprintf(where, sizeof where, "'prompt'[%zu]", i);
    unsigned st = json_is_string(v) && json_is_string(first)
                      ? encode(c, "prompt", json_string_value(v), json_string_length(v), -1)
                  : json_is_array(v) && json_is_array(first)
                      ? ids_prompt(c, v, where)
                      : fail(c, 400, "prompt", "%s must be a %s like 'prompt'[0]", where,
                             json_is_string(first) ? "string" : "list of token ids");
    if (st) return st;
  }
  return 0;
}

/* A message's content: a string, null, or a list of {"type": "text", "text"} parts. */
static char *message_text(struct pctx *c, json_t *content, size_t i) {
  if (!content || json_is_null(content)) return strdup("");
  if (json_is_string(content)) return strdup(json_string_value(content));
  if (!json_is_array(content)) {
    fail(c, 400, "messages", "messages[%zu].content must be a string or a list of text parts", i);
    return NULL;
  }
  size_t total = 1;
  for (size_t k = 0; k < json_array_size(content); k++) {
    json_t *part = json_array_get(content, k), *type = json_object_get(part, "type");
    json_t *text = json_object_get(part, "text");
    if (!json_is_object(part) || !json_is_string(type) || strcmp(json_string_value(type), "text") ||
        !json_is_string(text)) {
      fail(c, 400, "messages", "messages[%zu].content[%zu] must be {\"type\": \"text\", \"text\": ...} (%s)", i, k,
           json_is_string(type) ? json_string_value(type) : "no type");
      return NULL;
    }
    total += json_string_length(text);
  }
  char *s = malloc(total), *o = s;
  if (!s) return NULL;
  for (size_t k = 0; k < json_array_size(content); k++) {
    json_t *text = json_object_get(json_array_get(content, k), "text");
    memcpy(o, json_string_value(text), json_string_length(text));
    o += json_string_length(text);
  }
  *o = '\0';
  return s;
}

static unsigned get_messages(struct pctx *c, json_t *o) {
  json_t *m = json_object_get(o, "messages");
  if (!m || !json_is_array(m) || json_array_size(m) == 0)
    return fail(c, 400, "messages", "'messages' must be a non-empty list of {role, content}");
  if (!c->env->chat_ok)
    return fail(c, 400, "messages", "this model has no chat template megascope knows: start serve with "
                                    "--chat-template NAME (" MS_CHAT_TEMPLATE_NAMES ")");
  size_t n = json_array_size(m);
  if (n > 4096) return fail(c, 400, "messages", "at most 4096 messages");
  struct ms_chat_message *msgs = calloc(n, sizeof *msgs);
  char **texts = calloc(n, sizeof *texts);
  unsigned st = msgs && texts ? 0 : fail(c, 500, "", "out of memory");
  for (size_t i = 0; !st && i < n; i++) {
    json_t *e = json_array_get(m, i), *role = json_object_get(e, "role");
    if (!json_is_object(e) || !json_is_string(role)) {
      st = fail(c, 400, "messages", "messages[%zu] must be an object with a string 'role'", i);
      break;
    }
    if (!(texts[i] = message_text(c, json_object_get(e, "content"), i))) {
      if (!c->status) fail(c, 500, "", "out of memory");
      st = c->status;
      break;
    }
    msgs[i] = (struct ms_chat_message){json_string_value(role), texts[i]};
  }
  if (!st) {
    char lb[512] = "";
    struct ms_textbuf log = {.buf = lb, .size = sizeof lb};
    int rc = ms_chat_render(c->env->chat, msgs, (int)n, &c->r->prompt_text, &log);
    if (rc) {
      lb[strcspn(lb, "\n")] = '\0';
      st = rc == -EINVAL ? fail(c, 400, "messages", "%s", lb[0] ? lb : "the messages cannot be rendered")
                         : fail(c, 500, "", "cannot render the chat template");
    }
  }
  if (!st) st = encode(c, "messages", c->r->prompt_text, strlen(c->r->prompt_text), c->env->bos);
  for (size_t i = 0; texts && i < n; i++) free(texts[i]);
  free(texts);
  free(msgs);
  return st;
}

/* ---- the request ---- */

static unsigned get_sampling(struct pctx *c, json_t *o) {
  struct oa_req *r = c->r;
  unsigned st;
  if ((st = get_num(c, o, "temperature", 0, 2, &r->temperature)) || (st = get_num(c, o, "top_p", 0, 1, &r->top_p)) ||
      (st = get_num(c, o, "min_p", 0, 1, &r->min_p)) ||
      (st = get_num(c, o, "presence_penalty", -2, 2, &r->presence)) ||
      (st = get_num(c, o, "frequency_penalty", -2, 2, &r->frequency)) ||
      (st = get_int(c, o, "top_k", -1, 1 << 20, &r->top_k)) || (st = get_bias(c, o)))
    return st;
  if (r->top_p == 0.0f && json_object_get(o, "top_p") && !json_is_null(json_object_get(o, "top_p")))
    return fail(c, 400, "top_p", "'top_p' must be greater than 0");
  json_t *seed = json_object_get(o, "seed");
  if (seed && !json_is_null(seed)) {
    if (!json_is_integer(seed)) return fail(c, 400, "seed", "'seed' must be an integer");
    r->has_seed = 1;
    r->seed = (uint64_t)json_integer_value(seed);
  }
  return 0;
}

static unsigned get_logprobs(struct pctx *c, json_t *o) {
  struct oa_req *r = c->r;
  unsigned st;
  if (!r->chat) {  /* completions: "logprobs": k, the count of alternatives */
    int k = -1;
    if ((st = get_int(c, o, "logprobs", 0, 5, &k))) return st;
    r->logprobs = k >= 0;
    r->top_logprobs = k > 0 ? k : 0;
    return 0;
  }
  if ((st = get_bool(c, o, "logprobs", &r->logprobs)) || (st = get_int(c, o, "top_logprobs", 0, 20, &r->top_logprobs)))
    return st;
  if (r->top_logprobs && !r->logprobs) return fail(c, 400, "top_logprobs", "'top_logprobs' needs \"logprobs\": true");
  return 0;
}

static unsigned get_lengths(struct pctx *c, json_t *o) {
  struct oa_req *r = c->r;
  unsigned st;
  int mt = 0, mct = 0;
  if ((st = get_int(c, o, "max_tokens", 1, 1 << 24, &mt)) ||
      (st = get_int(c, o, "max_completion_tokens", 1, 1 << 24, &mct)) ||
      (st = get_int(c, o, "n", 1, OA_MAX_CHOICES, &r->n)))
    return st;
  r->max_tokens = mct ? mct : mt;
  return 0;
}

static unsigned check_unsupported(struct pctx *c, json_t *o) {
  json_t *v;
  if ((v = json_object_get(o, "best_of")) && !json_is_null(v) && !(json_is_integer(v) && json_integer_value(v) == 1))
    return fail(c, 400, "best_of", "'best_of' other than 1 is not supported");
  if ((v = json_object_get(o, "suffix")) && !json_is_null(v))
    return fail(c, 400, "suffix", "'suffix' is not supported");
  if ((v = json_object_get(o, "tools")) && !json_is_null(v) && json_array_size(v) > 0)
    return fail(c, 400, "tools",
                "tool calls are not served: the chat template megascope renders for this model (%s) has no tool "
                "definitions; for a structured answer use response_format json_schema",
                ms_chat_template_name(c->env->chat));
  if ((v = json_object_get(o, "functions")) && !json_is_null(v) && json_array_size(v) > 0)
    return fail(c, 400, "functions", "function calls are not served (see 'tools')");
  if ((v = json_object_get(o, "model")) && !json_is_null(v) && !json_is_string(v))
    return fail(c, 400, "model", "'model' must be a string");
  if ((v = json_object_get(o, "user")) && !json_is_null(v) && !json_is_string(v))
    return fail(c, 400, "user", "'user' must be a string");
  if ((v = json_object_get(o, "stream_options")) && !json_is_null(v) && !json_is_object(v))
    return fail(c, 400, "stream_options", "'stream_options' must be an object");
  return 0;
}

/* ---- response_format: structured output ---- */

/* OpenAI's strict mode: every object schema lists all its properties, so an
 * object without additionalProperties is closed (OpenAI refuses such a schema
 * in strict mode; here it is taken as it must be meant). Walks the schema
 * keywords that hold schemas. */
static void close_objects(json_t *s, int depth) {
  if (!json_is_object(s) || depth > 64) return;
  json_t *props = json_object_get(s, "properties");
  if (json_is_object(props) && !json_object_get(s, "additionalProperties"))
    json_object_set_new(s, "additionalProperties", json_false());
  static const char *const maps[] = {"properties", "$defs", "definitions", "patternProperties"};
  static const char *const lists[] = {"anyOf", "oneOf", "allOf", "prefixItems"};
  static const char *const ones[] = {"items", "additionalProperties", "not", "if", "then", "else"};
  for (size_t i = 0; i < 4; i++) {
    const char *k;
    json_t *v, *m = json_object_get(s, maps[i]), *l = json_object_get(s, lists[i]);
    if (json_is_object(m)) json_object_foreach(m, k, v) close_objects(v, depth + 1);
    for (size_t j = 0; json_is_array(l) && j < json_array_size(l); j++) close_objects(json_array_get(l, j), depth + 1);
  }
  for (size_t i = 0; i < 6; i++) close_objects(json_object_get(s, ones[i]), depth + 1);
}

/* At most 20 bytes of JSON whitespace wherever it may stand, as llama.cpp's
 * grammars allow: a small model never loops on blanks. A schema that sets its
 * own x-guidance keeps it. */
#define SO_WHITESPACE "[\\x20\\x0A\\x0D\\x09]{0,20}"

/* {"type": "json_object"} or {"type": "json_schema", "json_schema": {"name",
 * "schema", "strict"}}, OpenAI's shapes; "text" is no constraint. */
static unsigned get_response_format(struct pctx *c, json_t *o) {
  json_t *v = json_object_get(o, "response_format");
  if (!v || json_is_null(v)) return 0;
  json_t *t = json_is_object(v) ? json_object_get(v, "type") : NULL;
  if (!json_is_string(t))
    return fail(c, 400, "response_format", "'response_format' must be {\"type\": \"text\" | \"json_object\" | \"json_schema\"}");
  const char *type = json_string_value(t);
  if (!strcmp(type, "text")) return 0;
  json_t *schema = NULL;
  int strict = 0;
  if (!strcmp(type, "json_schema")) {
    json_t *js = json_object_get(v, "json_schema"), *st = json_object_get(js, "strict");
    if (!json_is_object(js))
      return fail(c, 400, "response_format", "response_format json_schema needs 'json_schema': {\"name\", \"schema\"}");
    json_t *s = json_object_get(js, "schema");
    if (s && !json_is_null(s) && !json_is_object(s))
      return fail(c, 400, "response_format", "'response_format.json_schema.schema' must be a JSON schema object");
    if (st && !json_is_null(st) && !json_is_boolean(st))
      return fail(c, 400, "response_format", "'response_format.json_schema.strict' must be true or false");
    strict = json_is_true(st);
    schema = json_is_object(s) ? json_deep_copy(s) : NULL;
  } else if (strcmp(type, "json_object")) {
    return fail(c, 400, "response_format", "response_format type '%.40s': expected text, json_object or json_schema",
                type);
  }
  if (!schema) schema = json_pack("{s:s}", "type", "object");  /* json_object, or a schema left out */
  if (!schema) return fail(c, 500, "", "out of memory");
  if (strict) close_objects(schema, 0);
  if (!json_object_get(schema, "x-guidance"))
    json_object_set_new(schema, "x-guidance", json_pack("{s:s}", "whitespace_pattern", SO_WHITESPACE));
  char *text = json_dumps(schema, JSON_COMPACT);  /* key order kept: properties come in the schema's order */
  json_decref(schema);
  if (!text) return fail(c, 500, "", "out of memory");
  if (!c->env->so) {
    free(text);
    return fail(c, 400, "response_format", "structured output needs the model's tokenizer and an end token");
  }
  char why[1024];
  int unavailable = 0;
  c->r->schema = so_schema_get(c->env->so, "json_schema", text, why, sizeof why, &unavailable);
  free(text);
  if (!c->r->schema)
    return unavailable ? fail(c, 501, "response_format", "%s", why)
                       : fail(c, 400, "response_format", "the schema cannot be used: %s", why);
  return 0;
}

/* A request naming another model than the one served: OpenAI's 404. */
static unsigned check_model(struct pctx *c, json_t *o) {
  json_t *v = json_object_get(o, "model");
  if (c->env->any_model || !c->env->model || !json_is_string(v) || !strcmp(json_string_value(v), c->env->model))
    return 0;
  return fail(c, 404, "model", "The model `%.200s` does not exist. This server serves `%s` (GET /v1/models).",
              json_string_value(v), c->env->model);
}

/* Prompt and completion together within the engine's context. */
static unsigned check_context(struct pctx *c) {
  struct oa_req *r = c->r;
  int longest = 0;
  for (int i = 0; i < r->n_prompts; i++)
    if (r->n_prompt[i] > longest) longest = r->n_prompt[i];
  int room = c->env->max_ctx - longest + 1;
  if (room < 1)
    return fail(c, 400, r->chat ? "messages" : "prompt",
                "the prompt is %d tokens; this server's context is %d tokens (--max-ctx)", longest, c->env->max_ctx);
  if (!r->max_tokens) r->max_tokens = r->chat ? room : (c->env->max_tokens_default < room ? c->env->max_tokens_default : room);
  if (r->max_tokens > room)
    return fail(c, 400, "max_tokens",
                "the prompt (%d tokens) and max_tokens (%d) exceed this server's context of %d tokens (--max-ctx)",
                longest, r->max_tokens, c->env->max_ctx);
  if (r->n_prompts * r->n > OA_MAX_CHOICES)
    return fail(c, 400, "n", "%d prompts x n = %d choices; at most %d", r->n_prompts, r->n_prompts * r->n,
                OA_MAX_CHOICES);
  return 0;
}

unsigned oa_parse(const struct oa_env *env, const char *body, size_t len, int chat, struct oa_req *r, char *msg,
                  size_t msg_n, char *param, size_t param_n) {
  struct pctx c = {env, r, msg, param, msg_n, param_n, 0};
  memset(r, 0, sizeof *r);
  r->chat = chat;
  r->n = 1;
  r->temperature = env->temperature_default;
  r->top_p = 1.0f;
  msg[0] = param[0] = '\0';
  json_error_t err;
  json_t *o = json_loadb(body ? body : "", len, 0, &err);
  if (!o) return fail(&c, 400, "", "malformed JSON at line %d column %d: %s", err.line, err.column, err.text);
  unsigned st = 0;
  if (!json_is_object(o)) st = fail(&c, 400, "", "the body must be a JSON object");
  if (!st) st = check_unsupported(&c, o);
  if (!st) st = check_model(&c, o);
  if (!st) st = get_bool(&c, o, "stream", &r->stream);
  json_t *so = json_object_get(o, "stream_options");
  if (!st && so && json_is_object(so)) st = get_bool(&c, so, "include_usage", &r->include_usage);
  if (!st && !chat) st = get_bool(&c, o, "echo", &r->echo);
  if (!st) st = get_bool(&c, o, "ignore_eos", &r->ignore_eos);
  if (!st) st = get_lengths(&c, o);
  if (!st) st = get_sampling(&c, o);
  if (!st) st = get_logprobs(&c, o);
  if (!st) st = get_stops(&c, o);
  if (!st) st = get_response_format(&c, o);
  if (!st) st = chat ? get_messages(&c, o) : get_prompt(&c, o);
  if (!st) st = check_context(&c);
  json_decref(o);
  return st;
}

void oa_req_free(struct oa_req *r) {
  if (!r) return;
  for (int i = 0; i < r->n_prompts; i++) free(r->prompts[i]);
  free(r->prompts);
  free(r->n_prompt);
  for (int i = 0; i < r->n_stops; i++) free(r->stops[i]);
  free(r->bias_ids);
  free(r->bias_vals);
  free(r->prompt_text);
  so_schema_put(r->schema);
  memset(r, 0, sizeof *r);
}

void oa_write_error(FILE *f, unsigned status, const char *msg, const char *param, const char *code) {
  struct ms_json j;
  ms_json_init(&j, f, 0);
  ms_json_obj_begin(&j);
  ms_json_key(&j, "error");
  ms_json_obj_begin(&j);
  ms_json_kstr(&j, "message", msg);
  ms_json_kstr(&j, "type",
               status == 401   ? "authentication_error"
               : status == 404 && !(code && !strcmp(code, "model_not_found")) ? "not_found_error"
               : status == 429 ? "rate_limit_error"
               : status >= 500 ? (status == 503 ? "unavailable_error" : "server_error")
                               : "invalid_request_error");
  ms_json_key(&j, "param");
  if (param && param[0])
    ms_json_str(&j, param);
  else
    ms_json_null(&j);
  ms_json_key(&j, "code");
  if (code)
    ms_json_str(&j, code);
  else
    ms_json_null(&j);
  ms_json_obj_end(&j);
  ms_json_obj_end(&j);
  ms_json_end(&j);
}
