/* SPDX-License-Identifier: MIT */
/* The query language's lexer and parser: text to probes, predicates and
 * aggregation statements (query_impl.h). Recursive descent over a grammar small
 * enough to read in docs/query.md; every error names its column. Names are not
 * resolved here (that needs the hook and the comparison: codegen.c), but a
 * field the hook does not define is, since the hooks are known by then. */
#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "query/query_impl.h"

enum tok_kind {
  T_END, T_IDENT, T_NUM, T_FLOAT, T_STR, T_MAP, /* @name */
  T_PUNCT,                                       /* text holds it: "==", "{", ... */
};

struct tok {
  enum tok_kind kind;
  int col;
  char text[128];
  uint64_t u;
  double f;
};

struct parser {
  struct ms_query *q;
  const char *s;
  size_t pos;
  struct tok t;
  int paren;            /* nesting, so that '/' inside a predicate's parentheses divides */
  int in_pred;
  int depth;            /* parentheses and unary operators open now (the parser's recursion) */
  struct ms_textbuf *log;
  int err;
};

__attribute__((format(printf, 3, 4))) static int fail(struct parser *p, int col, const char *fmt, ...) {
  if (p->err) return p->err;
  char msg[400];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  ms_textbuf_printf(p->log, "column %d: %s\n", col, msg);
  p->err = -EINVAL;
  return p->err;
}

/* ---- fields ---- */

static const struct {
  const char *alias;
  int field;
} aliases[] = {{"class", MS_F_TASK_CLASS}};

int ms_query_field_parse(const char *name) {
  for (size_t i = 0; i < sizeof aliases / sizeof *aliases; i++)
    if (!strcmp(name, aliases[i].alias)) return aliases[i].field;
  for (int f = 0; f < MS_F_COUNT; f++)
    if (f != MS_F_RESERVED0 && !strcmp(name, ms_hook_fields[f].name)) return f;
  return -1;
}

const char *ms_query_field_name(int field) {
  if (field == MS_F_TASK_CLASS) return "class";
  return field >= 0 && field < MS_F_COUNT ? ms_hook_fields[field].name : "?";
}

int ms_query_field_signed(int field) { return field == MS_F_TILE_X || field == MS_F_TILE_Y || field == MS_F_TILE_Z; }

/* ---- lexer ---- */

static int unit_scale(const char *u, uint64_t *scale) {
  static const struct {
    const char *name;
    uint64_t scale;
  } units[] = {{"ns", 1}, {"us", 1000}, {"ms", 1000000}, {"s", 1000000000ull},
               {"k", 1000}, {"K", 1024}, {"M", 1048576}, {"G", 1073741824ull}};
  for (size_t i = 0; i < sizeof units / sizeof *units; i++)
    if (!strcmp(u, units[i].name)) {
      *scale = units[i].scale;
      return 0;
    }
  return -1;
}

static int lex_number(struct parser *p, int col) {
  const char *s = p->s + p->pos;
  char *end;
  errno = 0;
  if (s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) {
    p->t.u = strtoull(s, &end, 16);
  } else {
    size_t n = strspn(s, "0123456789");
    if (s[n] == '.' && isdigit((unsigned char)s[n + 1])) {
      p->t.kind = T_FLOAT;
      p->t.f = strtod(s, &end);
      p->pos += (size_t)(end - s);
      return 0;
    }
    p->t.u = strtoull(s, &end, 10);
  }
  if (errno) return fail(p, col, "number out of range");
  size_t ulen = 0;
  while (isalpha((unsigned char)end[ulen])) ulen++;
  if (ulen) {
    char u[8] = "";
    uint64_t scale = 0;
    if (ulen >= sizeof u || (memcpy(u, end, ulen), u[ulen] = 0, unit_scale(u, &scale)))
      return fail(p, col, "unknown unit '%.*s' (units: ns, us, ms, s; k, K, M, G)", (int)ulen, end);
    if (p->t.u > UINT64_MAX / scale) return fail(p, col, "number out of range");
    p->t.u *= scale;
    end += ulen;
  }
  p->t.kind = T_NUM;
  p->pos += (size_t)(end - s);
  return 0;
}

static int lex_string(struct parser *p, int col) {
  size_t n = 0;
  p->pos++;
  for (;;) {
    char c = p->s[p->pos];
    if (!c) return fail(p, col, "string not closed");
    p->pos++;
    if (c == '"') break;
    if (c == '\\' && (p->s[p->pos] == '"' || p->s[p->pos] == '\\')) c = p->s[p->pos++];
    if (n + 1 >= sizeof p->t.text) return fail(p, col, "string longer than %zu bytes", sizeof p->t.text - 1);
    p->t.text[n++] = c;
  }
  p->t.text[n] = 0;
  p->t.kind = T_STR;
  return 0;
}

/* $top, $top2: the worst entry's keys, bound while a capture part compiles. */
static int lex_bind(struct parser *p, int col) {
  size_t start = ++p->pos;
  while (isalnum((unsigned char)p->s[p->pos])) p->pos++;
  size_t n = p->pos - start;
  int which = n == 3 && !strncmp(p->s + start, "top", 3) ? 0 : n == 4 && !strncmp(p->s + start, "top2", 4) ? 1 : -1;
  if (which < 0) return fail(p, col, "unknown variable '$%.*s' (a capture part knows $top and $top2)", (int)n, p->s + start);
  const char *v = p->q->binds[which];
  if (!v) return fail(p, col, "$%s is bound only in a capture part (after 'when ...:')", which ? "top2" : "top");
  if (p->q->bind_is_num[which]) {
    p->t.kind = T_NUM;
    p->t.u = strtoull(v, NULL, 10);
  } else {
    p->t.kind = T_STR;
    snprintf(p->t.text, sizeof p->t.text, "%s", v);
  }
  return 0;
}

static int next(struct parser *p) {
  const char *s = p->s;
  for (;;) {
    while (isspace((unsigned char)s[p->pos])) p->pos++;
    if (s[p->pos] == '#' || (s[p->pos] == '/' && s[p->pos + 1] == '/')) {
      while (s[p->pos] && s[p->pos] != '\n') p->pos++;
      continue;
    }
    break;
  }
  memset(&p->t, 0, sizeof p->t);
  int col = p->t.col = (int)p->pos + 1;
  char c = s[p->pos];
  if (!c) return p->t.kind = T_END, 0;
  if (isdigit((unsigned char)c)) return lex_number(p, col);
  if (c == '$') return lex_bind(p, col);
  if (c == '"') return lex_string(p, col);
  if (isalpha((unsigned char)c) || c == '_' || c == '@') {
    size_t n = 0, start = p->pos + (c == '@');
    p->pos = start;
    /* dots and digits continue a name: class names are blk.3.wo */
    while (isalnum((unsigned char)s[p->pos]) || s[p->pos] == '_' ||
           (s[p->pos] == '.' && (isalnum((unsigned char)s[p->pos + 1]) || s[p->pos + 1] == '_')))
      p->pos++;
    n = p->pos - start;
    if (n >= 48) return fail(p, col, "name longer than 47 characters");
    memcpy(p->t.text, s + start, n);
    p->t.text[n] = 0;
    p->t.kind = c == '@' ? T_MAP : T_IDENT;
    if (c == '@' && n && !(isalpha((unsigned char)p->t.text[0]) || p->t.text[0] == '_'))
      return fail(p, col, "a map name starts with a letter");
    return 0;
  }
  static const char *const two[] = {"==", "!=", "<=", ">=", "&&", "||", "=~", "!~", "<<", ">>"};
  for (size_t i = 0; i < sizeof two / sizeof *two; i++)
    if (!strncmp(s + p->pos, two[i], 2)) {
      memcpy(p->t.text, two[i], 3);
      p->pos += 2;
      return p->t.kind = T_PUNCT, 0;
    }
  if (strchr("/{}[](),;=<>!+-*%&|^~:", c)) {
    p->t.text[0] = c;
    p->pos++;
    return p->t.kind = T_PUNCT, 0;
  }
  return fail(p, col, "unexpected character '%c'", isprint((unsigned char)c) ? c : '?');
}

static int is(struct parser *p, const char *punct) { return p->t.kind == T_PUNCT && !strcmp(p->t.text, punct); }

static int expect(struct parser *p, const char *punct, const char *where) {
  if (!is(p, punct)) {
    const char *got = p->t.kind == T_END ? "the end" : p->t.text[0] ? p->t.text : "a number";
    return fail(p, p->t.col, "expected '%s' %s, found '%s'", punct, where, got);
  }
  return next(p);
}

/* ---- expressions ---- */

static struct q_node *node(struct parser *p, enum q_node_kind kind, int col) {
  struct q_node *n = calloc(1, sizeof *n);
  if (!n) {
    p->err = -ENOMEM;
    return NULL;
  }
  n->kind = kind;
  n->col = col;
  n->field = -1;
  n->height = 1;
  return n;
}

void ms_query_node_free(struct q_node *n) {
  if (!n) return;
  ms_query_node_free(n->a);
  ms_query_node_free(n->b);
  free(n->text);
  free(n);
}

static struct q_node *expr(struct parser *p);

/* Untrusted text must not choose how deep the parser, the code generator and
 * the tree's free recurse: an expression nests at most Q_MAX_DEPTH levels, counting
 * parentheses and unary operators as they open (the parser's recursion) and
 * the height of the tree a chain of binary operators builds (a + a + ... is
 * as deep as it is long for the code generator). */
static int too_deep(struct parser *p, int depth, int col) {
  if (depth <= Q_MAX_DEPTH) return 0;
  fail(p, col, "expression nested too deeply: more than %d levels (parentheses, unary operators and chained "
       "binary operators each count one)", Q_MAX_DEPTH);
  return 1;
}

/* A node over a and b is one level above the higher of them. */
static int height_of(const struct q_node *a, const struct q_node *b) {
  int h = a ? a->height : 0;
  if (b && b->height > h) h = b->height;
  return h + 1;
}

static struct q_node *primary(struct parser *p) {
  int col = p->t.col;
  struct q_node *n = NULL;
  if (p->err) return NULL;
  if (is(p, "(")) {
    if (too_deep(p, p->depth + 1, col)) return NULL;
    p->paren++;
    p->depth++;
    next(p);
    n = expr(p);
    p->paren--;
    p->depth--;
    if (expect(p, ")", "to close '('")) goto bad;
    return n;
  }
  if (p->t.kind == T_NUM) {
    if (!(n = node(p, Q_NUM, col))) return NULL;
    n->u = p->t.u;
  } else if (p->t.kind == T_IDENT || p->t.kind == T_STR) {
    int f = p->t.kind == T_IDENT ? ms_query_field_parse(p->t.text) : -1;
    if (!(n = node(p, f >= 0 ? Q_FIELD : Q_NAME, col))) return NULL;
    n->field = f; /* a string is never a field: always a name */
    if (!(n->text = strdup(p->t.text))) p->err = -ENOMEM;
  } else if (p->t.kind == T_FLOAT) {
    fail(p, col, "a fraction is only a quantile's argument");
  } else {
    fail(p, col, "expected a field, a number or a name, found '%s'", p->t.kind == T_END ? "the end" : p->t.text);
  }
  if (p->err) goto bad;
  next(p);
  return n;
bad:
  ms_query_node_free(n);
  return NULL;
}

static struct q_node *unary(struct parser *p) {
  if (is(p, "!") || is(p, "-") || is(p, "~")) {
    int col = p->t.col, op = p->t.text[0];
    if (too_deep(p, p->depth + 1, col)) return NULL;
    p->depth++;
    next(p);
    struct q_node *a = unary(p), *n = a ? node(p, Q_UNARY, col) : NULL;
    p->depth--;
    if (!n) return ms_query_node_free(a), NULL;
    n->op = op;
    n->a = a;
    n->height = height_of(a, NULL);
    return n;
  }
  return primary(p);
}

/* Binary levels, loosest first. */
static const struct level {
  const char *ops[6];
  int codes[6];
} levels[] = {
    {{"||"}, {Q_OP_LOR}},
    {{"&&"}, {Q_OP_LAND}},
    {{"|"}, {Q_OP_OR}},
    {{"^"}, {Q_OP_XOR}},
    {{"&"}, {Q_OP_AND}},
    {{"==", "!=", "=~", "!~"}, {Q_OP_EQ, Q_OP_NE, -1, -2}},
    {{"<", "<=", ">", ">="}, {Q_OP_LT, Q_OP_LE, Q_OP_GT, Q_OP_GE}},
    {{"<<", ">>"}, {Q_OP_SHL, Q_OP_SHR}},
    {{"+", "-"}, {Q_OP_ADD, Q_OP_SUB}},
    {{"*", "/", "%"}, {Q_OP_MUL, Q_OP_DIV, Q_OP_MOD}},
};
#define N_LEVELS (int)(sizeof levels / sizeof *levels)

static int level_op(struct parser *p, int lv) {
  for (int i = 0; levels[lv].ops[i]; i++)
    if (is(p, levels[lv].ops[i])) {
      /* a '/' outside parentheses ends a predicate */
      if (!strcmp(levels[lv].ops[i], "/") && p->in_pred && p->paren == 0) return 0;
      return levels[lv].codes[i];
    }
  return 0;
}

static struct q_node *binary(struct parser *p, int lv) {
  if (lv == N_LEVELS) return unary(p);
  struct q_node *a = binary(p, lv + 1);
  int code;
  while (a && !p->err && (code = level_op(p, lv))) {
    int col = p->t.col;
    next(p);
    struct q_node *n;
    if (code < 0) { /* =~ "glob" */
      if (p->t.kind != T_STR) {
        fail(p, p->t.col, "'=~' takes a pattern in double quotes (\"blk.*.wo\")");
        break;
      }
      if (!(n = node(p, Q_MATCH, col)) || !(n->text = strdup(p->t.text))) {
        free(n);
        p->err = -ENOMEM;
        break;
      }
      n->negate = code == -2;
      n->a = a;
      n->height = height_of(a, NULL);
      a = n;
      if (too_deep(p, a->height, col)) break;
      next(p);
      continue;
    }
    struct q_node *b = binary(p, lv + 1);
    if (!b || !(n = node(p, Q_BINARY, col))) {
      ms_query_node_free(b);
      break;
    }
    n->op = code;
    n->a = a;
    n->b = b;
    n->height = height_of(a, b);
    a = n;
    if (too_deep(p, a->height, col)) break;
  }
  if (p->err) {
    ms_query_node_free(a);
    return NULL;
  }
  return a;
}

static struct q_node *expr(struct parser *p) { return binary(p, 0); }

/* The text of [from, to) columns, trimmed, for printing what was aggregated. */
static void source_text(struct parser *p, int from, size_t to, char *out, size_t size) {
  size_t a = (size_t)from - 1;
  while (to > a && isspace((unsigned char)p->s[to - 1])) to--;
  size_t n = to - a < size - 1 ? to - a : size - 1;
  memcpy(out, p->s + a, n);
  out[n] = 0;
}

/* ---- statements ---- */

static const char *const agg_names[Q_AGG_COUNT_KINDS] = {"count", "sum", "min", "max", "avg",
                                                          "hist", "lhist", "quantile", "record"};

static int find_or_add_map(struct parser *p, const char *name, enum q_agg agg, int n_keys, int col) {
  struct ms_query *q = p->q;
  for (int i = 0; i < q->n_maps; i++) {
    struct q_map *m = &q->maps[i];
    if (strcmp(m->name, name)) continue;
    if (m->agg != agg)
      return fail(p, col, "%s is a %s() map (column %d); it cannot also take %s()", name, agg_names[m->agg], m->col,
                  agg_names[agg]);
    if (m->n_keys != n_keys)
      return fail(p, col, "%s has %d keys (column %d), here %d", name, m->n_keys, m->col, n_keys);
    return i;
  }
  if (q->n_maps == Q_MAX_MAPS) return fail(p, col, "at most %d maps in one query", Q_MAX_MAPS);
  struct q_map *m = &q->maps[q->n_maps];
  snprintf(m->name, sizeof m->name, "%s", name);
  m->agg = agg;
  m->n_keys = n_keys;
  m->col = col;
  m->hook = -1;
  return q->n_maps++;
}

/* A constant argument (lhist's bounds): a number, or minus one. */
static int const_arg(struct parser *p, int64_t *out, const char *what) {
  int neg = 0, col = p->t.col;
  if (is(p, "-")) {
    neg = 1;
    next(p);
  }
  if (p->t.kind != T_NUM || p->t.u > INT64_MAX) return fail(p, col, "%s must be a constant integer", what);
  *out = neg ? -(int64_t)p->t.u : (int64_t)p->t.u;
  return next(p);
}

/* record(v, ...): up to Q_MAX_FIELDS values, each named by its text. */
static int record_args(struct parser *p, struct q_stmt *st, struct q_map *m, int col) {
  if (st->n_keys) return fail(p, st->col, "record() takes no keys: put them among its values");
  for (;;) {
    if (st->n_fields == Q_MAX_FIELDS) return fail(p, p->t.col, "at most %d values in one record()", Q_MAX_FIELDS);
    int from = p->t.col;
    struct q_node *v = expr(p);
    if (!v) return p->err ? p->err : fail(p, from, "expected a value to record");
    char text[48];
    source_text(p, from, (size_t)p->t.col - 1, text, sizeof text);
    if (m->n_fields == 0 || st->n_fields >= m->n_fields) memcpy(m->field_text[st->n_fields], text, sizeof text);
    st->fields[st->n_fields++] = v;
    if (!is(p, ",")) break;
    next(p);
  }
  if (m->n_fields && m->n_fields != st->n_fields)
    return fail(p, col, "%s records %d values (column %d), here %d", m->name, m->n_fields, m->col, st->n_fields);
  m->n_fields = st->n_fields;
  return expect(p, ")", "to close record()");
}

static int agg_args(struct parser *p, struct q_stmt *st, enum q_agg agg, struct q_map *m, int col) {
  if (agg == Q_AGG_COUNT) return expect(p, ")", "count() takes no argument");
  if (agg == Q_AGG_RECORD) return record_args(p, st, m, col);
  int from = p->t.col;
  if (!(st->arg = expr(p))) return p->err ? p->err : fail(p, from, "expected an expression");
  source_text(p, from, (size_t)p->t.col - 1, m->arg_text, sizeof m->arg_text);
  if (agg == Q_AGG_LHIST) {
    int64_t lo = 0, hi = 0, step = 0;
    if (expect(p, ",", "after lhist's value (lhist(v, min, max, step))") || const_arg(p, &lo, "lhist's min") ||
        expect(p, ",", "after lhist's min") || const_arg(p, &hi, "lhist's max") ||
        expect(p, ",", "after lhist's max") || const_arg(p, &step, "lhist's step"))
      return p->err;
    if (hi <= lo || step <= 0) return fail(p, col, "lhist needs min < max and step > 0");
    if ((hi - lo + step - 1) / step > Q_LHIST_MAX) return fail(p, col, "lhist: more than %d buckets", Q_LHIST_MAX);
    m->lo = lo, m->hi = hi, m->step = step;
  }
  if (agg == Q_AGG_QUANTILE) {
    int n = 0;
    while (is(p, ",")) {
      next(p);
      if (p->t.kind != T_FLOAT && !(p->t.kind == T_NUM && p->t.u <= 1))
        return fail(p, p->t.col, "a quantile is a fraction between 0 and 1 (0.99)");
      double v = p->t.kind == T_FLOAT ? p->t.f : (double)p->t.u;
      if (v < 0 || v > 1) return fail(p, p->t.col, "a quantile is a fraction between 0 and 1 (0.99)");
      if (n == Q_MAX_QUANTILES) return fail(p, p->t.col, "at most %d quantiles in one quantile()", Q_MAX_QUANTILES);
      m->q[n++] = v;
      next(p);
    }
    if (!n) return fail(p, col, "quantile(v, q) needs at least one fraction q (0.99)");
    m->n_q = n;
  }
  return expect(p, ")", "to close the aggregation's arguments");
}

static int statement(struct parser *p, struct q_probe *pr) {
  if (p->t.kind != T_MAP) return fail(p, p->t.col, "expected a map ('@name[keys] = count()')");
  if (pr->n_stmts == Q_MAX_STMTS) return fail(p, p->t.col, "at most %d statements in one probe", Q_MAX_STMTS);
  struct q_stmt *st = &pr->stmts[pr->n_stmts++];
  char name[48];
  int col = st->col = p->t.col;
  name[0] = '@';
  memcpy(name + 1, p->t.text, strnlen(p->t.text, 46) + 1); /* the lexer keeps names below 48 */
  name[47] = 0;
  next(p);
  char key_text[Q_MAX_KEYS][64];
  if (is(p, "[")) {
    next(p);
    for (;;) {
      if (st->n_keys == Q_MAX_KEYS) return fail(p, p->t.col, "at most %d keys", Q_MAX_KEYS);
      int from = p->t.col;
      if (!(st->keys[st->n_keys] = expr(p))) return p->err ? p->err : fail(p, from, "expected a key");
      source_text(p, from, (size_t)p->t.col - 1, key_text[st->n_keys], sizeof key_text[0]);
      st->n_keys++;
      if (is(p, "]")) break;
      if (expect(p, ",", "between keys")) return p->err;
    }
    next(p);
  }
  if (expect(p, "=", "after the map (@name[keys] = agg(...))")) return p->err;
  int fcol = p->t.col;
  int agg = -1;
  for (int i = 0; p->t.kind == T_IDENT && i < Q_AGG_COUNT_KINDS; i++)
    if (!strcmp(p->t.text, agg_names[i])) agg = i;
  if (agg < 0)
    return fail(p, fcol, "'%s' is not an aggregation (count, sum, min, max, avg, hist, lhist, quantile, record)",
                p->t.kind == T_END ? "the end" : p->t.text);
  next(p);
  if (expect(p, "(", "after the aggregation's name")) return p->err;
  int mi = find_or_add_map(p, name, (enum q_agg)agg, st->n_keys, col);
  if (mi < 0) return mi;
  st->map = mi;
  struct q_map *m = &p->q->maps[mi];
  for (int k = 0; k < st->n_keys; k++) /* the first use names the keys */
    if (!m->key_text[k][0]) memcpy(m->key_text[k], key_text[k], sizeof m->key_text[k]);
  return agg_args(p, st, (enum q_agg)agg, m, fcol);
}

static int probe(struct parser *p) {
  struct ms_query *q = p->q;
  if (q->n_probes == Q_MAX_PROBES) return fail(p, p->t.col, "at most %d probes in one query", Q_MAX_PROBES);
  struct q_probe *pr = &q->probes[q->n_probes++];
  for (;;) {
    if (p->t.kind != T_IDENT) return fail(p, p->t.col, "expected a hook name (task_end, dep_wait, step, ...)");
    int h = ms_hook_parse(p->t.text);
    if (h < 0) {
      char all[256] = "";
      for (int i = 0; i < MS_HOOK_COUNT; i++)
        snprintf(all + strlen(all), sizeof all - strlen(all), "%s%s", i ? ", " : "", ms_hook_name(i));
      return fail(p, p->t.col, "'%s' is not a hook (hooks: %s)", p->t.text, all);
    }
    if (pr->n_hooks == MS_HOOK_COUNT) return fail(p, p->t.col, "a hook named twice");
    pr->hook_col[pr->n_hooks] = p->t.col;
    pr->hooks[pr->n_hooks++] = h;
    next(p);
    if (!is(p, ",")) break;
    next(p);
  }
  if (is(p, "/")) {
    p->in_pred = 1;
    next(p);
    int col = p->t.col;
    pr->pred = expr(p);
    p->in_pred = 0;
    if (!pr->pred) return p->err ? p->err : fail(p, col, "expected a predicate");
    if (expect(p, "/", "to end the predicate (inside it, divide in parentheses)")) return p->err;
  }
  if (expect(p, "{", "to open the probe's block")) return p->err;
  while (!is(p, "}")) {
    if (p->t.kind == T_END) return fail(p, p->t.col, "block not closed with '}'");
    if (statement(p, pr)) return p->err;
    if (is(p, ";")) next(p);
    else if (p->t.kind == T_END) return fail(p, p->t.col, "block not closed with '}'");
    else if (!is(p, "}")) return fail(p, p->t.col, "expected ';' or '}' after a statement");
  }
  if (!pr->n_stmts) return fail(p, p->t.col, "an empty block: nothing to aggregate");
  return next(p);
}

/* when @map OP value [capture N]: -- the rest of the text is the capture part,
 * compiled only when the trigger fires (ms_query_compile_capture). */
static int trigger(struct parser *p) {
  struct ms_query *q = p->q;
  struct q_trigger *t = &q->trigger;
  if (q->src_offset) return fail(p, p->t.col, "a capture part cannot hold another 'when'");
  if (!q->n_probes) return fail(p, p->t.col, "'when' follows the probes whose map it watches");
  next(p);
  if (p->t.kind != T_MAP) return fail(p, p->t.col, "expected the map to watch ('when @p99 > 2ms capture 100: ...')");
  t->map[0] = '@';
  memcpy(t->map + 1, p->t.text, strnlen(p->t.text, 46) + 1); /* the lexer keeps names below 48 */
  t->map[47] = 0;
  int found = 0;
  for (int i = 0; i < q->n_maps; i++) found |= !strcmp(q->maps[i].name, t->map) && q->maps[i].agg != Q_AGG_RECORD;
  if (!found) return fail(p, p->t.col, "'when' watches %s, which no probe before it aggregates", t->map);
  next(p);
  static const char *const ops[] = {">", ">=", "<", "<=", "==", "!="};
  static const int codes[] = {Q_OP_GT, Q_OP_GE, Q_OP_LT, Q_OP_LE, Q_OP_EQ, Q_OP_NE};
  t->op = 0;
  for (int i = 0; i < 6; i++)
    if (is(p, ops[i])) t->op = codes[i];
  if (!t->op) return fail(p, p->t.col, "expected a comparison after %s (>, >=, <, <=, ==, !=)", t->map);
  next(p);
  if (p->t.kind != T_NUM) return fail(p, p->t.col, "expected the threshold, a number (2ms, 100)");
  t->threshold = p->t.u;
  next(p);
  if (p->t.kind == T_IDENT && !strcmp(p->t.text, "capture")) {
    next(p);
    if (p->t.kind != T_NUM || p->t.u == 0 || p->t.u > 1000000)
      return fail(p, p->t.col, "capture takes how many records, 1 to 1000000");
    t->capture = (uint32_t)p->t.u;
    next(p);
  }
  if (!is(p, ":")) return fail(p, p->t.col, "expected ':' and the capture part's probes");
  t->capture_at = p->pos;
  t->has = 1;
  return 0;
}

int ms_query_parse(struct ms_query *q, struct ms_textbuf *log) {
  struct parser p = {.q = q, .s = q->src, .pos = q->src_offset, .log = log};
  if (next(&p)) return p.err;
  if (p.t.kind == T_END) return fail(&p, p.t.col, q->src_offset ? "an empty capture part" : "an empty query");
  while (p.t.kind != T_END && !p.err) {
    if (p.t.kind == T_IDENT && !strcmp(p.t.text, "when")) {
      if (!trigger(&p)) break; /* the rest is the capture part */
    } else {
      probe(&p);
    }
  }
  return p.err;
}
