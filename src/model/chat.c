/* SPDX-License-Identifier: MIT */
/* Chat templates without Jinja: a template is recognised from markers in its
 * text (ms_chat_template_detect) and rendered by the C function of its family
 * (render_chatml, render_llama3, render_turns). Each renderer writes what the
 * real template writes for string contents, add_generation_prompt on, no
 * tools, the leading BOS left to the caller (megascope/chat.h). Where a
 * template strips ("| trim", ".strip()") the strip is Python's: Unicode
 * whitespace at both ends. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "megascope/chat.h"
#include "megascope/gguf.h"
#include "megascope/model.h"
#include "megascope/tokenizer.h"

static const char *const names[MS_CHAT_TEMPLATE_COUNT] = {
    [MS_CHAT_CHATML] = "chatml",   [MS_CHAT_SMOLLM2] = "smollm2",   [MS_CHAT_QWEN2] = "qwen2",
    [MS_CHAT_QWEN25] = "qwen2.5",  [MS_CHAT_QWEN3] = "qwen3",       [MS_CHAT_LLAMA3] = "llama3",
    [MS_CHAT_LLAMA31] = "llama3.1", [MS_CHAT_LLAMA32] = "llama3.2", [MS_CHAT_GEMMA] = "gemma",
    [MS_CHAT_LLAMA2] = "llama2",   [MS_CHAT_MISTRAL] = "mistral",
};

/* The default system messages of the ChatML variants, NULL for none. */
static const char *const default_system[MS_CHAT_TEMPLATE_COUNT] = {
    [MS_CHAT_SMOLLM2] = "You are a helpful AI assistant named SmolLM, trained by Hugging Face",
    [MS_CHAT_QWEN2] = "You are a helpful assistant.",
    [MS_CHAT_QWEN25] = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.",
};

int ms_chat_template_parse(const char *name, enum ms_chat_template *out) {
  for (int i = 0; name && i < MS_CHAT_TEMPLATE_COUNT; i++) {
    if (!strcmp(name, names[i])) {
      *out = (enum ms_chat_template)i;
      return 0;
    }
  }
  return -EINVAL;
}

const char *ms_chat_template_name(enum ms_chat_template t) {
  return (unsigned)t < MS_CHAT_TEMPLATE_COUNT ? names[t] : "?";
}

static int is_chatml(enum ms_chat_template t) { return t <= MS_CHAT_QWEN3; }
static int is_llama3(enum ms_chat_template t) { return t >= MS_CHAT_LLAMA3 && t <= MS_CHAT_LLAMA32; }

const char *ms_chat_template_eot(enum ms_chat_template t) {
  if ((unsigned)t >= MS_CHAT_TEMPLATE_COUNT) return NULL;
  if (is_chatml(t)) return "<|im_end|>";
  if (is_llama3(t)) return "<|eot_id|>";
  return t == MS_CHAT_GEMMA ? "<end_of_turn>" : "</s>";
}

const char *ms_chat_template_bos(enum ms_chat_template t) {
  if ((unsigned)t >= MS_CHAT_TEMPLATE_COUNT || is_chatml(t)) return NULL;
  if (is_llama3(t)) return "<|begin_of_text|>";
  return t == MS_CHAT_GEMMA ? "<bos>" : "<s>";
}

int ms_chat_bos_id(enum ms_chat_template t, const struct ms_tokenizer *tok) {
  int id = ms_tokenizer_add_bos(tok);
  if (id >= 0) return id;
  const char *bos = ms_chat_template_bos(t);
  id = bos ? ms_tokenizer_find(tok, bos) : -1;
  return id >= 0 ? id : -1;
}

int ms_chat_eot_id(enum ms_chat_template t, const struct ms_tokenizer *tok) {
  const char *eot = ms_chat_template_eot(t);
  return eot ? ms_tokenizer_find(tok, eot) : -ENOENT;
}

/* ---- detection ---- */

static const char *find(const char *s, size_t len, const char *what) {
  return memmem(s, len, what, strlen(what));
}

/* Whether every "<|im_start|>ROLE" followed by a newline (written as itself or
 * as the escape \n) ends its string literal right there, or goes on with
 * exactly `allowed` (NULL: nothing allowed). A literal that goes on otherwise
 * is text of the template's own (a default system message, a generation
 * prompt that opens a think block) that this renderer would not write. */
static int im_start_literals_ok(const char *s, size_t len, const char *role, const char *allowed) {
  char key[32];
  snprintf(key, sizeof key, "<|im_start|>%s", role);
  size_t kl = strlen(key);
  for (const char *p = s, *end = s + len; (p = memmem(p, (size_t)(end - p), key, kl)); p += kl) {
    const char *q = p + kl;
    if (q < end && *q == '\n') q++;
    else if (end - q >= 2 && q[0] == '\\' && q[1] == 'n') q += 2;
    else continue;  /* '<|im_start|>' + role, or the role in a variable */
    if (q < end && (*q == '\'' || *q == '"')) continue;
    if (allowed && (size_t)(end - q) >= strlen(allowed) && !memcmp(q, allowed, strlen(allowed))) continue;
    return 0;
  }
  return 1;
}

static int detect_chatml(const char *s, size_t len, enum ms_chat_template *out) {
  if (find(s, len, "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.")) {
    *out = MS_CHAT_QWEN25;
    return 0;
  }
  if (find(s, len, "You are a helpful AI assistant named SmolLM, trained by Hugging Face")) {
    *out = MS_CHAT_SMOLLM2;
    return 0;
  }
  if (!im_start_literals_ok(s, len, "assistant", NULL)) return -ENOENT;  /* QwQ's "<think>\n" */
  if (find(s, len, "</think>")) {
    if (!find(s, len, "enable_thinking") || !find(s, len, "reasoning_content")) return -ENOENT;
    *out = MS_CHAT_QWEN3;
    return 0;
  }
  if (find(s, len, "trim") || find(s, len, "strip(")) return -ENOENT;
  if (find(s, len, "You are a helpful assistant.<|im_end|>")) {
    if (!im_start_literals_ok(s, len, "system", "You are a helpful assistant.<|im_end|>")) return -ENOENT;
    *out = MS_CHAT_QWEN2;
    return 0;
  }
  if (!im_start_literals_ok(s, len, "system", NULL)) return -ENOENT;
  *out = MS_CHAT_CHATML;
  return 0;
}

static int detect_family(const char *s, size_t len, enum ms_chat_template *out) {
  if (find(s, len, "<start_of_turn>") && find(s, len, "<end_of_turn>")) {
    *out = MS_CHAT_GEMMA;
    return 0;
  }
  if (find(s, len, "<|start_header_id|>") && find(s, len, "<|eot_id|>")) {
    if (find(s, len, "Cutting Knowledge Date: December 2023")) {
      *out = find(s, len, "strftime_now") ? MS_CHAT_LLAMA32 : MS_CHAT_LLAMA31;
      return 0;
    }
    if (find(s, len, "tools") || !find(s, len, "trim")) return -ENOENT;  /* functionary, ... */
    *out = MS_CHAT_LLAMA3;
    return 0;
  }
  if (find(s, len, "<|im_start|>") && find(s, len, "<|im_end|>")) return detect_chatml(s, len, out);
  if (find(s, len, "[INST]")) {
    if (find(s, len, "<<SYS>>")) {
      *out = MS_CHAT_LLAMA2;
      return 0;
    }
    if (find(s, len, "'[INST] ' + message['content'] + ' [/INST]'")) {
      *out = MS_CHAT_MISTRAL;
      return 0;
    }
  }
  return -ENOENT;
}

/* The first bytes of s as a C-escaped quotation. */
static void quote_start(char *buf, size_t size, const char *s, size_t len) {
  size_t o = 0;
  for (size_t i = 0; i < len && i < 60 && o + 5 < size; i++) {
    unsigned char c = (unsigned char)s[i];
    if (c == '\n') o += (size_t)snprintf(buf + o, size - o, "\\n");
    else if (c == '"' || c == '\\') o += (size_t)snprintf(buf + o, size - o, "\\%c", c);
    else if (c < 0x20 || c == 0x7f) o += (size_t)snprintf(buf + o, size - o, "\\x%02x", c);
    else buf[o++] = (char)c;
  }
  buf[o] = '\0';
}

static int report_unknown(int rc, const char *what, const char *s, size_t len, struct ms_textbuf *log) {
  char q[256];
  quote_start(q, sizeof q, s, len);
  ms_textbuf_printf(log, "%s not recognised: \"%s\"%s (%zu bytes); known templates: %s", what, q,
                    len > 60 ? "..." : "", len, MS_CHAT_TEMPLATE_NAMES);
  return rc;
}

int ms_chat_template_detect(const char *jinja, size_t len, enum ms_chat_template *out,
                            struct ms_textbuf *log) {
  int rc = detect_family(jinja, len, out);
  return rc ? report_unknown(rc, "chat template", jinja, len, log) : 0;
}

int ms_chat_template_from_gguf(const struct ms_gguf *g, enum ms_chat_template *out,
                               struct ms_textbuf *log) {
  const char *s;
  size_t len;
  int rc = ms_gguf_get_str(g, "tokenizer.chat_template", &s, &len);
  if (rc == -ENOENT || rc == -MS_E_FORMAT) {
    ms_textbuf_printf(log, "tokenizer.chat_template: %s; known templates: %s",
                      rc == -ENOENT ? "absent" : "not a string", MS_CHAT_TEMPLATE_NAMES);
    return -ENOENT;
  }
  if (rc) return rc;
  rc = detect_family(s, len, out);
  return rc ? report_unknown(rc, "tokenizer.chat_template:", s, len, log) : 0;
}

int ms_chat_template_for_model(const char *path, int arch, enum ms_chat_template *out, char *note, size_t n) {
  enum ms_chat_template own = arch == MS_ARCH_GEMMA3 ? MS_CHAT_GEMMA : MS_CHAT_CHATML;
  if (!path) {
    *out = own;
    snprintf(note, n, "%s (a synthetic model has none of its own; %s's)", ms_chat_template_name(own),
             ms_arch_name((enum ms_arch)arch));
    return 0;
  }
  char lb[512] = "";
  struct ms_textbuf log = {.buf = lb, .size = sizeof lb};
  struct ms_gguf *g = ms_gguf_open(path, &log);
  int rc = g ? ms_chat_template_from_gguf(g, out, &log) : -ENOENT;
  int absent = g && ms_gguf_find_kv(g, "tokenizer.chat_template") < 0;
  ms_gguf_free(g);
  lb[strcspn(lb, "\n")] = '\0';
  if (absent) {  /* the architecture's own turns (Gemma files often carry none) */
    *out = own;
    snprintf(note, n, "%s (the file names no template; %s's)", ms_chat_template_name(own),
             ms_arch_name((enum ms_arch)arch));
    return 0;
  }
  if (rc) {
    snprintf(note, n, "%s", lb);
    return -ENOENT;
  }
  snprintf(note, n, "%s (from the file's tokenizer.chat_template)", ms_chat_template_name(*out));
  return 0;
}

/* ---- the output text ---- */

struct out {
  char *p;
  size_t len, cap;
  int oom;
};

static void put_n(struct out *o, const char *s, size_t n) {
  if (o->oom) return;
  if (o->len + n + 1 > o->cap) {
    size_t cap = o->cap ? o->cap : 256;
    while (cap < o->len + n + 1) cap *= 2;
    char *p = realloc(o->p, cap);
    if (!p) {
      o->oom = 1;
      return;
    }
    o->p = p;
    o->cap = cap;
  }
  memcpy(o->p + o->len, s, n);
  o->len += n;
  o->p[o->len] = '\0';
}

static void put(struct out *o, const char *s) { put_n(o, s, strlen(s)); }

/* A view of part of a message's content. */
struct span {
  const char *s;
  size_t n;
};

static struct span span_of(const char *s) { return (struct span){s ? s : "", s ? strlen(s) : 0}; }
static void put_span(struct out *o, struct span sp) { put_n(o, sp.s, sp.n); }

/* The length of the UTF-8 character at s (n bytes available) when it is one
 * Python's str.isspace() counts, else 0. */
static size_t space_at(const unsigned char *s, size_t n) {
  if (n >= 1 && ((s[0] >= 0x09 && s[0] <= 0x0d) || (s[0] >= 0x1c && s[0] <= 0x20))) return 1;
  if (n >= 2 && s[0] == 0xc2 && (s[1] == 0x85 || s[1] == 0xa0)) return 2;
  if (n < 3) return 0;
  unsigned cp = ((s[0] & 0x0fu) << 12) | ((s[1] & 0x3fu) << 6) | (s[2] & 0x3fu);
  if ((s[0] & 0xf0) != 0xe0 || (s[1] & 0xc0) != 0x80 || (s[2] & 0xc0) != 0x80) return 0;
  if (cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 || cp == 0x2029 ||
      cp == 0x202f || cp == 0x205f || cp == 0x3000)
    return 3;
  return 0;
}

/* Python's str.strip(): leading and trailing Unicode whitespace. */
static struct span trim(struct span sp) {
  const unsigned char *s = (const unsigned char *)sp.s;
  size_t a = 0, b = sp.n, k;
  while (a < b && (k = space_at(s + a, b - a))) a += k;
  while (a < b) {
    /* the last character starts at the last byte that is not a continuation */
    size_t st = b - 1;
    while (st > a && (s[st] & 0xc0) == 0x80 && b - st < 3) st--;
    if ((k = space_at(s + st, b - st)) && st + k == b) b = st;
    else break;
  }
  return (struct span){sp.s + a, b - a};
}

static struct span lstrip_nl(struct span sp) {
  while (sp.n && sp.s[0] == '\n') sp.s++, sp.n--;
  return sp;
}

static struct span rstrip_nl(struct span sp) {
  while (sp.n && sp.s[sp.n - 1] == '\n') sp.n--;
  return sp;
}

/* The last occurrence of what in sp, or NULL. */
static const char *find_last(struct span sp, const char *what) {
  size_t wl = strlen(what);
  const char *last = NULL;
  for (const char *p = sp.s, *end = sp.s + sp.n; (p = memmem(p, (size_t)(end - p), what, wl)); p++) last = p;
  return last;
}

/* ---- the renderers ---- */

enum role { ROLE_SYSTEM, ROLE_USER, ROLE_ASSISTANT };

static int check_roles(const struct ms_chat_message *m, int n, enum role *roles, struct ms_textbuf *log) {
  for (int i = 0; i < n; i++) {
    const char *r = m[i].role ? m[i].role : "(null)";
    if (!strcmp(r, "system")) roles[i] = ROLE_SYSTEM;
    else if (!strcmp(r, "user")) roles[i] = ROLE_USER;
    else if (!strcmp(r, "assistant")) roles[i] = ROLE_ASSISTANT;
    else {
      ms_textbuf_printf(log, "messages[%d].role: '%s' is not one of system, user, assistant", i, r);
      return -EINVAL;
    }
  }
  return 0;
}

/* Qwen3: an assistant message's text after its last </think> (newlines before
 * it dropped), and the reasoning between the <think> and the first </think>. */
static void qwen3_split(struct span c, struct span *content, struct span *reasoning) {
  *content = c;
  *reasoning = (struct span){"", 0};
  const char *last = find_last(c, "</think>");
  if (!last) return;
  *content = lstrip_nl((struct span){last + 8, (size_t)(c.s + c.n - last - 8)});
  const char *first = memmem(c.s, c.n, "</think>", 8);
  struct span before = rstrip_nl((struct span){c.s, (size_t)(first - c.s)});
  const char *open = find_last(before, "<think>");
  if (open) before = (struct span){open + 7, (size_t)(before.s + before.n - open - 7)};
  *reasoning = lstrip_nl(before);
}

static int starts_ends(struct span sp, const char *a, const char *b) {
  size_t al = strlen(a), bl = strlen(b);
  return sp.n >= al && sp.n >= bl && !memcmp(sp.s, a, al) && !memcmp(sp.s + sp.n - bl, b, bl);
}

static void render_chatml(enum ms_chat_template t, const struct ms_chat_message *m, const enum role *roles,
                          int n, struct out *o) {
  static const char *const role_names[] = {"system", "user", "assistant"};
  if (default_system[t] && roles[0] != ROLE_SYSTEM) {
    put(o, "<|im_start|>system\n");
    put(o, default_system[t]);
    put(o, "<|im_end|>\n");
  }
  int last_query = n - 1;  /* Qwen3: the last user message that is not a tool response */
  for (int i = n - 1; i >= 0; i--) {
    if (roles[i] == ROLE_USER && !starts_ends(span_of(m[i].content), "<tool_response>", "</tool_response>")) {
      last_query = i;
      break;
    }
  }
  for (int i = 0; i < n; i++) {
    struct span c = span_of(m[i].content), content, reasoning;
    put(o, "<|im_start|>");
    put(o, role_names[roles[i]]);
    put(o, "\n");
    if (t == MS_CHAT_QWEN3 && roles[i] == ROLE_ASSISTANT) {
      qwen3_split(c, &content, &reasoning);
      if (i > last_query && (i == n - 1 || reasoning.n)) {
        put(o, "<think>\n");
        put_span(o, rstrip_nl(lstrip_nl(reasoning)));
        put(o, "\n</think>\n\n");
        content = lstrip_nl(content);
      }
      c = content;
    }
    put_span(o, c);
    put(o, "<|im_end|>\n");
  }
  put(o, "<|im_start|>assistant\n");
}

/* Today's date as Llama 3.2's strftime_now("%d %b %Y") writes it in the C locale. */
static void today(char *buf, size_t size) {
  static const char *const months[] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                       "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
  time_t now = time(NULL);
  struct tm tm;
  if (!localtime_r(&now, &tm)) tm = (struct tm){.tm_mday = 1, .tm_year = 70};
  snprintf(buf, size, "%02d %s %d", tm.tm_mday, months[tm.tm_mon % 12], tm.tm_year + 1900);
}

static void render_llama3(enum ms_chat_template t, const struct ms_chat_message *m, const enum role *roles,
                          int n, struct out *o) {
  static const char *const role_names[] = {"system", "user", "assistant"};
  int first = 0;
  if (t != MS_CHAT_LLAMA3) {
    char date[32] = "26 Jul 2024";
    if (t == MS_CHAT_LLAMA32) today(date, sizeof date);
    put(o, "<|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\nToday Date: ");
    put(o, date);
    put(o, "\n\n");
    if (roles[0] == ROLE_SYSTEM) put_span(o, trim(span_of(m[0].content)));
    put(o, "<|eot_id|>");
    first = roles[0] == ROLE_SYSTEM;
  }
  for (int i = first; i < n; i++) {
    put(o, "<|start_header_id|>");
    put(o, role_names[roles[i]]);
    put(o, "<|end_header_id|>\n\n");
    put_span(o, trim(span_of(m[i].content)));
    put(o, "<|eot_id|>");
  }
  put(o, "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

/* Gemma, llama2 and mistral: user and assistant turns that alternate, a
 * system message (first only) folded into the first user turn. */
static int render_turns(enum ms_chat_template t, const struct ms_chat_message *m, const enum role *roles,
                        int n, struct out *o, struct ms_textbuf *log) {
  const char *name = names[t];
  int first = t != MS_CHAT_MISTRAL && roles[0] == ROLE_SYSTEM;
  for (int i = first; i < n; i++) {
    enum role due = (i - first) % 2 ? ROLE_ASSISTANT : ROLE_USER;
    if (roles[i] == ROLE_SYSTEM) {
      ms_textbuf_printf(log, "messages[%d].role: 'system' %s with template %s", i,
                        t == MS_CHAT_MISTRAL ? "has no place" : "is allowed only first", name);
      return -EINVAL;
    }
    if (roles[i] != due) {
      ms_textbuf_printf(log, "messages[%d].role: '%s' where '%s' is due: template %s needs turns that "
                        "alternate user, assistant, user, ...", i, m[i].role,
                        due == ROLE_USER ? "user" : "assistant", name);
      return -EINVAL;
    }
  }
  for (int i = first; i < n; i++) {
    struct span c = span_of(m[i].content);
    int user = roles[i] == ROLE_USER;
    if (t == MS_CHAT_GEMMA) {
      put(o, user ? "<start_of_turn>user\n" : "<start_of_turn>model\n");
      if (first && i == 1) {
        put(o, m[0].content ? m[0].content : "");
        put(o, "\n\n");
      }
      put_span(o, trim(c));
      put(o, "<end_of_turn>\n");
    } else if (t == MS_CHAT_LLAMA2) {
      if (user) {
        if (i > first) put(o, "<s>");
        put(o, "[INST] ");
        if (first && i == 1) {
          /* content.strip() of '<<SYS>>\n' + system + '\n<</SYS>>\n\n' + content */
          struct out sys = {0};
          put(&sys, "<<SYS>>\n");
          put(&sys, m[0].content ? m[0].content : "");
          put(&sys, "\n<</SYS>>\n\n");
          put_span(&sys, c);
          if (sys.oom) o->oom = 1;
          else put_span(o, trim((struct span){sys.p, sys.len}));
          free(sys.p);
        } else {
          put_span(o, trim(c));
        }
        put(o, " [/INST]");
      } else {
        put(o, " ");
        put_span(o, trim(c));
        put(o, " </s>");
      }
    } else {
      put(o, user ? "[INST] " : "");
      put_span(o, c);
      put(o, user ? " [/INST]" : "</s>");
    }
  }
  if (t == MS_CHAT_GEMMA) put(o, "<start_of_turn>model\n");
  return 0;
}

int ms_chat_render(enum ms_chat_template t, const struct ms_chat_message *msgs, int n, char **out,
                   struct ms_textbuf *log) {
  *out = NULL;
  if ((unsigned)t >= MS_CHAT_TEMPLATE_COUNT) {
    ms_textbuf_printf(log, "chat template %d: no such template", (int)t);
    return -EINVAL;
  }
  if (n < 1 || !msgs) {
    ms_textbuf_printf(log, "messages: at least one message is needed");
    return -EINVAL;
  }
  enum role *roles = malloc((size_t)n * sizeof *roles);
  if (!roles) return -ENOMEM;
  struct out o = {0};
  int rc = check_roles(msgs, n, roles, log);
  if (rc) goto out;
  if (is_chatml(t)) render_chatml(t, msgs, roles, n, &o);
  else if (is_llama3(t)) render_llama3(t, msgs, roles, n, &o);
  else rc = render_turns(t, msgs, roles, n, &o, log);
  if (!rc && o.oom) rc = -ENOMEM;
  if (!rc && !o.p) put(&o, "");  /* gemma with a system message alone writes only the prompt */
  if (!rc && o.oom) rc = -ENOMEM;
out:
  free(roles);
  if (rc) free(o.p);
  else *out = o.p;
  return rc;
}
