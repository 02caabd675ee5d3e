/* SPDX-License-Identifier: MIT */
/* Queries: the schema's names (read with jansson from the task schema JSON),
 * compilation (parse.c, then codegen.c), the program bundle and durations. */
#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "megascope/base.h"
#include "query/query_impl.h"

/* ---- schema ---- */

static const char *or_none(const char *s) { return s ? s : "(none)"; }

int ms_query_schema_same(const struct ms_query_schema *a, const char *label_a, const struct ms_query_schema *b,
                         const char *label_b, struct ms_textbuf *log) {
  size_t n = a->n_classes > b->n_classes ? a->n_classes : b->n_classes;
  for (size_t i = 0; i < n; i++) {
    const char *x = i < a->n_classes ? a->classes[i].name : NULL, *y = i < b->n_classes ? b->classes[i].name : NULL;
    if (x && y && !strcmp(x, y)) continue;
    ms_textbuf_printf(log, "task_class %zu is %s in %s, %s in %s (%zu and %zu classes)\n", i, or_none(x), label_a,
                      or_none(y), label_b, a->n_classes, b->n_classes);
    return -1;
  }
  n = a->n_evclasses > b->n_evclasses ? a->n_evclasses : b->n_evclasses;
  for (size_t i = 0; i < n; i++) {
    const char *x = i < a->n_evclasses ? a->evclasses[i] : NULL, *y = i < b->n_evclasses ? b->evclasses[i] : NULL;
    if ((!x && !y) || (x && y && !strcmp(x, y))) continue;
    ms_textbuf_printf(log, "event_class %zu is %s in %s, %s in %s\n", i, or_none(x), label_a, or_none(y), label_b);
    return -1;
  }
  return 0;
}

void ms_query_schema_digest(const struct ms_query_schema *s, uint64_t d[2]) {
  d[0] = d[1] = MS_SCHEMA_DIGEST_SEED;
  for (size_t i = 0; i < s->n_classes; i++) d[0] = ms_schema_digest_add(d[0], i, s->classes[i].name);
  for (size_t i = 0; i < s->n_evclasses; i++) d[1] = ms_schema_digest_add(d[1], i, s->evclasses[i]);
  for (int k = 0; k < 2; k++) d[k] = ms_schema_digest_end(d[k]);
}

void ms_query_schema_free(struct ms_query_schema *s) {
  if (!s) return;
  for (size_t i = 0; i < s->n_classes; i++) {
    free(s->classes[i].name);
    free(s->classes[i].op);
    free(s->classes[i].kernel);
  }
  for (size_t i = 0; i < s->n_evclasses; i++) free(s->evclasses[i]);
  free(s->classes);
  free(s->evclasses);
  free(s);
}

static char *jstr(json_t *o, const char *key) {
  const char *v = json_string_value(json_object_get(o, key));
  return strdup(v ? v : "");
}

static int read_classes(struct ms_query_schema *s, json_t *arr, struct ms_textbuf *log) {
  size_t n = json_array_size(arr);
  s->classes = calloc(n ? n : 1, sizeof *s->classes);
  if (!s->classes) return -ENOMEM;
  for (size_t i = 0; i < n; i++) {
    json_t *c = json_array_get(arr, i);
    json_t *id = json_object_get(c, "id"), *kid = json_object_get(c, "kernel_id");
    if (!json_is_integer(id) || json_integer_value(id) < 0 || json_integer_value(id) > UINT32_MAX) {
      ms_textbuf_printf(log, "schema: task_classes[%zu] has no integer \"id\"\n", i);
      return -EINVAL;
    }
    struct q_class *q = &s->classes[s->n_classes++];
    q->id = (uint32_t)json_integer_value(id);
    q->kernel_id = json_is_integer(kid) ? (uint32_t)json_integer_value(kid) : UINT32_MAX;
    q->name = jstr(c, "name");
    q->op = jstr(c, "op");
    q->kernel = jstr(c, "kernel");
    if (!q->name || !q->op || !q->kernel) return -ENOMEM;
  }
  return 0;
}

static int read_evclasses(struct ms_query_schema *s, json_t *arr, struct ms_textbuf *log) {
  size_t n = json_array_size(arr), max = 0;
  for (size_t i = 0; i < n; i++) {
    json_t *id = json_object_get(json_array_get(arr, i), "id");
    if (!json_is_integer(id) || json_integer_value(id) < 0 || json_integer_value(id) >= 1 << 20) {
      ms_textbuf_printf(log, "schema: event_classes[%zu] has no integer \"id\" below 2^20\n", i);
      return -EINVAL;
    }
    if ((size_t)json_integer_value(id) + 1 > max) max = (size_t)json_integer_value(id) + 1;
  }
  s->evclasses = calloc(max ? max : 1, sizeof *s->evclasses);
  if (!s->evclasses) return -ENOMEM;
  s->n_evclasses = max;
  for (size_t i = 0; i < n; i++) {
    json_t *e = json_array_get(arr, i);
    size_t id = (size_t)json_integer_value(json_object_get(e, "id"));
    free(s->evclasses[id]);
    if (!(s->evclasses[id] = jstr(e, "name"))) return -ENOMEM;
  }
  return 0;
}

struct ms_query_schema *ms_query_schema_parse(const char *json, size_t len, struct ms_textbuf *log) {
  json_error_t je;
  json_t *root = json_loadb(json, len, 0, &je);
  struct ms_query_schema *s = calloc(1, sizeof *s);
  int rc = -ENOMEM;
  if (!s) goto out;
  rc = -EINVAL;
  if (!root) {
    ms_textbuf_printf(log, "schema: line %d column %d: %s\n", je.line, je.column, je.text);
    goto out;
  }
  json_t *tc = json_object_get(root, "task_classes"), *ec = json_object_get(root, "event_classes");
  if (!json_is_array(tc) || !json_is_array(ec)) {
    ms_textbuf_printf(log, "schema: no \"task_classes\" and \"event_classes\" arrays\n");
    goto out;
  }
  if ((rc = read_classes(s, tc, log)) || (rc = read_evclasses(s, ec, log))) goto out;
out:
  json_decref(root);
  if (rc) {
    ms_query_schema_free(s);
    errno = -rc;
    return NULL;
  }
  return s;
}

struct ms_query_schema *ms_query_schema_copy(const struct ms_query_schema *s) {
  struct ms_query_schema *c = calloc(1, sizeof *c);
  if (!c) return NULL;
  c->classes = calloc(s->n_classes ? s->n_classes : 1, sizeof *c->classes);
  c->evclasses = calloc(s->n_evclasses ? s->n_evclasses : 1, sizeof *c->evclasses);
  if (!c->classes || !c->evclasses) goto fail;
  for (size_t i = 0; i < s->n_classes; i++, c->n_classes++) {
    c->classes[i] = s->classes[i];
    c->classes[i].name = strdup(s->classes[i].name);
    c->classes[i].op = strdup(s->classes[i].op);
    c->classes[i].kernel = strdup(s->classes[i].kernel);
    if (!c->classes[i].name || !c->classes[i].op || !c->classes[i].kernel) {
      c->n_classes++;
      goto fail;
    }
  }
  for (size_t i = 0; i < s->n_evclasses; i++, c->n_evclasses++)
    if (s->evclasses[i] && !(c->evclasses[i] = strdup(s->evclasses[i]))) goto fail;
  return c;
fail:
  ms_query_schema_free(c);
  return NULL;
}

/* ---- compiling ---- */

void ms_query_free(struct ms_query *q) {
  if (!q) return;
  for (int i = 0; i < q->n_probes; i++) {
    ms_query_node_free(q->probes[i].pred);
    for (int j = 0; j < q->probes[i].n_stmts; j++) {
      ms_query_node_free(q->probes[i].stmts[j].arg);
      for (int k = 0; k < q->probes[i].stmts[j].n_keys; k++) ms_query_node_free(q->probes[i].stmts[j].keys[k]);
    }
  }
  for (int i = 0; i < q->n_progs; i++) free(q->progs[i].insns);
  ms_query_schema_free(q->names);
  free(q->src);
  free(q);
}

static int check_capture(struct ms_query *q, struct ms_textbuf *log);

struct ms_query *ms_query_compile(const char *src, const struct ms_query_schema *s, const struct ms_query_opts *o,
                                  struct ms_textbuf *log) {
  struct ms_query_opts opts = {0};
  if (o) memcpy(&opts, o, o->sz < sizeof opts ? o->sz : sizeof opts);
  struct ms_query *q = calloc(1, sizeof *q);
  int rc = -ENOMEM;
  if (!q || !(q->src = strdup(src ? src : ""))) goto out;
  q->schema = s;
  q->max_keys = opts.max_keys;
  q->ring_bytes = opts.ring_bytes;
  rc = -EINVAL;
  if (q->ring_bytes && (q->ring_bytes < 4096 || (q->ring_bytes & (q->ring_bytes - 1)))) {
    ms_textbuf_printf(log, "column 1: a ring buffer's bytes must be a power of two of at least 4096, not %u\n",
                      q->ring_bytes);
    goto out;
  }
  if ((rc = ms_query_parse(q, log)) || (rc = ms_query_codegen(q, log))) goto out;
  if (q->trigger.has && (rc = check_capture(q, log))) goto out;
  rc = -ENOMEM;
  if (!(q->names = ms_query_schema_copy(s))) goto out;
  q->schema = NULL;
  rc = 0;
out:
  if (rc) {
    ms_query_free(q);
    errno = -rc;
    return NULL;
  }
  return q;
}

const char *ms_query_source(const struct ms_query *q) { return q->src; }

/* ---- escalation ---- */

_Static_assert(MS_QUERY_RECORD_MAX_BYTES == 8 * Q_MAX_FIELDS + MS_BPF_RINGBUF_HDR_SIZE, "record() sizes");

uint32_t ms_query_record_bytes(const struct ms_query *q) {
  uint32_t most = 0;
  for (int i = 0; i < q->n_maps; i++)
    if (q->maps[i].agg == Q_AGG_RECORD && 8u * (uint32_t)q->maps[i].n_fields + MS_BPF_RINGBUF_HDR_SIZE > most)
      most = 8u * (uint32_t)q->maps[i].n_fields + MS_BPF_RINGBUF_HDR_SIZE;
  return most;
}

void ms_query_get_trigger(const struct ms_query *q, struct ms_query_trigger *out) {
  static const char *const ops[] = {[Q_OP_GT] = ">", [Q_OP_GE] = ">=", [Q_OP_LT] = "<",
                                    [Q_OP_LE] = "<=", [Q_OP_EQ] = "==", [Q_OP_NE] = "!="};
  const struct q_trigger *t = &q->trigger;
  memset(out, 0, sizeof *out);
  if (!t->has) return;
  out->has = 1;
  snprintf(out->map, sizeof out->map, "%s", t->map);
  out->op = ops[t->op];
  out->threshold = t->threshold;
  out->capture = t->capture;
  out->capture_src = q->src + t->capture_at;
}

struct ms_query *ms_query_compile_capture(const struct ms_query *q, const char top[2][128], const struct ms_query_opts *o,
                                          struct ms_textbuf *log) {
  if (!q->trigger.has) {
    errno = EINVAL;
    return NULL;
  }
  struct ms_query_opts opts = {0};
  if (o) memcpy(&opts, o, o->sz < sizeof opts ? o->sz : sizeof opts);
  struct ms_query *c = calloc(1, sizeof *c);
  int rc = -ENOMEM;
  if (!c || !(c->src = strdup(q->src))) goto out;
  c->schema = q->names ? q->names : q->schema;
  c->max_keys = opts.max_keys;
  c->ring_bytes = opts.ring_bytes;
  c->src_offset = q->trigger.capture_at;
  for (int i = 0; i < 2; i++) {
    int quoted = top[i][0] == '"'; /* a quoted name: the lexer takes it without its quotes */
    snprintf(c->bind_text[i], sizeof c->bind_text[i], "%s", top[i] + quoted);
    size_t n = strlen(c->bind_text[i]);
    if (quoted && n && c->bind_text[i][n - 1] == '"') c->bind_text[i][n - 1] = 0;
    c->binds[i] = top[i][0] ? c->bind_text[i] : NULL;
    c->bind_is_num[i] = top[i][0] && !quoted;
  }
  if ((rc = ms_query_parse(c, log)) || (rc = ms_query_codegen(c, log))) goto out;
  rc = -ENOMEM;
  if (!(c->names = ms_query_schema_copy(c->schema))) goto out;
  c->schema = NULL;
  rc = 0;
out:
  if (rc) {
    ms_query_free(c);
    errno = -rc;
    return NULL;
  }
  return c;
}

/* The capture part compiles with $top bound to a value of the watched map's
 * key kind, so its errors come at compile time, before anything runs. */
static int check_capture(struct ms_query *q, struct ms_textbuf *log) {
  const struct q_map *m = NULL;
  for (int i = 0; i < q->n_maps; i++)
    if (!strcmp(q->maps[i].name, q->trigger.map)) m = &q->maps[i];
  char top[2][128] = {"0", "0"};
  for (int k = 0; m && k < 2 && k < m->n_keys; k++) {
    const struct ms_query_schema *s = q->schema;
    if (m->key_kind[k] == Q_KEY_CLASS && s->n_classes) snprintf(top[k], sizeof top[k], "\"%s\"", s->classes[0].name);
    if (m->key_kind[k] == Q_KEY_EVCLASS && s->n_evclasses && s->evclasses[0])
      snprintf(top[k], sizeof top[k], "\"%s\"", s->evclasses[0]);
    if (m->key_kind[k] == Q_KEY_OP && s->n_classes) snprintf(top[k], sizeof top[k], "\"%s\"", s->classes[0].kernel);
  }
  struct ms_query *c = ms_query_compile_capture(q, top, NULL, log); /* q->names is not set yet: q->schema */
  if (!c) return -EINVAL;
  ms_query_free(c);
  return 0;
}

int ms_query_bundle(const struct ms_query *q, void **out, size_t *len) {
  struct ms_bpf_bundle_prog progs[Q_MAX_PROBES * MS_HOOK_COUNT];
  for (int i = 0; i < q->n_progs; i++)
    progs[i] = (struct ms_bpf_bundle_prog){q->progs[i].name, q->progs[i].section, q->progs[i].insns, q->progs[i].n};
  uint64_t d[2] = {0, 0};
  if (q->names) ms_query_schema_digest(q->names, d);
  if (!q->uses_evclass) d[1] = 0;  /* its programs name no event class: any plan's ids serve */
  return ms_bpf_bundle_write(q->defs, (size_t)q->n_defs, progs, (size_t)q->n_progs, MS_HOOK_ABI_VERSION, d, out,
                             len);
}

size_t ms_query_prog_count(const struct ms_query *q) { return (size_t)q->n_progs; }

const struct ms_bpf_insn *ms_query_prog(const struct ms_query *q, size_t i, size_t *n, const char **section) {
  if (i >= (size_t)q->n_progs) return NULL;
  if (n) *n = q->progs[i].n;
  if (section) *section = q->progs[i].section;
  return q->progs[i].insns;
}

size_t ms_query_map_count(const struct ms_query *q) { return (size_t)q->n_defs; }
const struct ms_bpf_map_def *ms_query_map(const struct ms_query *q, size_t i) {
  return i < (size_t)q->n_defs ? &q->defs[i] : NULL;
}

/* ---- durations ---- */

int ms_query_parse_duration(const char *s, uint64_t *out) {
  if (!s || !isdigit((unsigned char)*s)) return -EINVAL;
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  if (errno || v < 0) return -EINVAL;
  static const struct {
    const char *unit;
    double ns;
  } units[] = {{"", 1e9}, {"s", 1e9}, {"ms", 1e6}, {"us", 1e3}, {"ns", 1}, {"m", 60e9}, {"h", 3600e9}};
  for (size_t i = 0; i < sizeof units / sizeof *units; i++)
    if (!strcmp(end, units[i].unit)) {
      double ns = v * units[i].ns;
      if (ns > 1.8e19) return -EINVAL;
      *out = (uint64_t)ns;
      return 0;
    }
  return -EINVAL;
}
