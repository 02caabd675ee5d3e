/* SPDX-License-Identifier: MIT */
/* A query's read-out: each map's entries merged over workers (sums add,
 * histograms and sketches add bucket by bucket, min and max take the extreme
 * of the workers that saw a value), sorted largest first, keys named through
 * the schema; printed as bpftrace prints its maps, or as one JSON object. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "megascope/json.h"
#include "query/query_impl.h"

struct entry {
  uint64_t key[Q_MAX_KEYS];
  uint64_t *v;      /* merged value words */
  double sort;
};

struct collect {
  const struct q_map *m;
  uint32_t n_workers;
  struct entry *e;
  size_t n, cap;
  int err;
};

static void merge(const struct q_map *m, uint64_t *out, const uint64_t *w) {
  size_t words = m->value_size / 8;
  if (m->agg == Q_AGG_MIN || m->agg == Q_AGG_MAX) {
    if (!w[0]) return;
    int take = !out[0];
    if (!take) {
      int less = m->arg_signed ? (int64_t)w[1] < (int64_t)out[1] : w[1] < out[1];
      take = m->agg == Q_AGG_MIN ? less : !less && w[1] != out[1];
    }
    if (take) out[1] = w[1];
    out[0] += w[0];
    return;
  }
  for (size_t i = 0; i < words; i++) out[i] += w[i];
}

static double total(const struct q_map *m, const uint64_t *v) {
  size_t words = m->value_size / 8;
  double t = 0;
  for (size_t i = 0; i < words; i++) t += (double)v[i];
  return t;
}

static double sort_key(const struct q_map *m, const uint64_t *v) {
  switch (m->agg) {
  case Q_AGG_COUNT: case Q_AGG_SUM: return (double)v[0];
  case Q_AGG_AVG: return v[0] ? (double)v[1] / (double)v[0] : 0;
  case Q_AGG_MIN: case Q_AGG_MAX: return m->arg_signed ? (double)(int64_t)v[1] : (double)v[1];
  default: return total(m, v);
  }
}

static int collect_one(void *user, const void *key, const void *values) {
  struct collect *c = user;
  const struct q_map *m = c->m;
  if (c->n == c->cap) {
    size_t cap = c->cap ? 2 * c->cap : 64;
    struct entry *e = realloc(c->e, cap * sizeof *e);
    if (!e) return c->err = -ENOMEM;
    c->e = e;
    c->cap = cap;
  }
  struct entry *e = &c->e[c->n];
  memset(e->key, 0, sizeof e->key);
  if (m->array_size) {
    uint32_t idx;
    memcpy(&idx, key, sizeof idx);
    e->key[0] = idx;
  } else if (m->n_keys) {
    memcpy(e->key, key, 8 * (size_t)m->n_keys);
  }
  if (!(e->v = calloc(1, m->value_size))) return c->err = -ENOMEM;
  for (uint32_t w = 0; w < c->n_workers; w++) {
    uint64_t tmp[1024]; /* the largest value: lhist's 1002 words */
    memcpy(tmp, (const uint8_t *)values + (size_t)w * m->value_size, m->value_size);
    merge(m, e->v, tmp);
  }
  if ((!m->n_keys || m->array_size) && total(m, e->v) == 0) { /* an array's entry, never written */
    free(e->v);
    return 0;
  }
  e->sort = sort_key(m, e->v);
  c->n++;
  return 0;
}

static int by_sort(const void *a, const void *b) {
  const struct entry *x = a, *y = b;
  if (x->sort != y->sort) return x->sort < y->sort ? 1 : -1;
  for (int i = 0; i < Q_MAX_KEYS; i++)
    if (x->key[i] != y->key[i]) return x->key[i] < y->key[i] ? -1 : 1;
  return 0;
}

/* ---- names ---- */

static void key_name(const struct ms_query *q, const struct q_map *m, int k, uint64_t v, char *out, size_t size) {
  const struct ms_query_schema *s = q->names;
  switch (m->key_kind[k]) {
  case Q_KEY_CLASS:
    for (size_t i = 0; i < s->n_classes; i++)
      if (s->classes[i].id == v) {
        snprintf(out, size, "%s", s->classes[i].name);
        return;
      }
    snprintf(out, size, "class#%llu", (unsigned long long)v);
    return;
  case Q_KEY_EVCLASS:
    if (v < s->n_evclasses && s->evclasses[v]) snprintf(out, size, "%s", s->evclasses[v]);
    else snprintf(out, size, "evclass#%llu", (unsigned long long)v);
    return;
  case Q_KEY_OP: {
    size_t len = 0;
    out[0] = 0;
    for (size_t i = 0; i < s->n_classes; i++) {
      if (s->classes[i].kernel_id != v) continue;
      int seen = 0;
      for (size_t j = 0; j < i; j++) seen |= s->classes[j].kernel_id == v && !strcmp(s->classes[j].op, s->classes[i].op);
      if (!seen && len + 1 < size) len += (size_t)snprintf(out + len, size - len, "%s%s", len ? "|" : "", s->classes[i].op);
    }
    if (!len) snprintf(out, size, "op#%llu", (unsigned long long)v);
    return;
  }
  case Q_KEY_HOOK: case Q_KEY_ENUM: {
    const char *n = ms_query_enum_name(m->key_field[k], m->hook, v);
    if (n) snprintf(out, size, "%s", n);
    else snprintf(out, size, "%llu", (unsigned long long)v);
    return;
  }
  case Q_KEY_SIGNED: snprintf(out, size, "%lld", (long long)(int64_t)v); return;
  default:
    /* MS_HOOK_NONE32 in a request field: the row has no request */
    if (v == MS_HOOK_NONE32 && (m->key_field[k] == MS_F_REQ_SLOT || m->key_field[k] == MS_F_REQ_GEN))
      snprintf(out, size, "none");
    else
      snprintf(out, size, "%llu", (unsigned long long)v);
    return;
  }
}

static int key_is_text(const struct q_map *m, int k) {
  return m->key_kind[k] == Q_KEY_CLASS || m->key_kind[k] == Q_KEY_EVCLASS || m->key_kind[k] == Q_KEY_OP ||
         m->key_kind[k] == Q_KEY_HOOK || m->key_kind[k] == Q_KEY_ENUM;
}

/* ---- buckets ---- */

/* Bucket b of a sketch: [lo, lo + width). */
static void sketch_bucket(int b, uint64_t *lo, uint64_t *width) {
  if (b < 16) {
    *lo = (uint64_t)b, *width = 1;
    return;
  }
  int e = (b - 16) / Q_SKETCH_SUB + 4, m = (b - 16) % Q_SKETCH_SUB;
  *width = 1ull << (e - 4);
  *lo = (1ull << e) + (uint64_t)m * *width;
}

static double quantile_of(const uint64_t *v, double q) {
  double n = 0;
  for (int b = 0; b < Q_SKETCH_BUCKETS; b++) n += (double)v[b];
  if (n == 0) return NAN;
  double rank = ceil(q * n);
  if (rank < 1) rank = 1;
  double seen = 0;
  for (int b = 0; b < Q_SKETCH_BUCKETS; b++) {
    seen += (double)v[b];
    if (seen >= rank) {
      uint64_t lo, w;
      sketch_bucket(b, &lo, &w);
      return (double)lo + (double)(w - 1) / 2.0;
    }
  }
  return NAN;
}

/* [lo, hi) of histogram bucket b; *open_lo / *open_hi for lhist's ends. */
static void hist_bucket(const struct q_map *m, int b, int64_t *lo, int64_t *hi, int *open_lo, int *open_hi) {
  *open_lo = *open_hi = 0;
  if (m->agg == Q_AGG_HIST) {
    *lo = b == 0 ? 0 : (int64_t)(1ull << (b - 1));
    *hi = b == 0 ? 1 : b == 64 ? INT64_MAX : (int64_t)(1ull << b);
    if (b == 64) *open_hi = 1;
    return;
  }
  int64_t nb = (int64_t)(m->value_size / 8) - 2;
  if (b == 0) {
    *open_lo = 1, *lo = 0, *hi = m->lo;
  } else if (b == nb + 1) {
    *open_hi = 1, *lo = m->hi, *hi = 0;
  } else {
    *lo = m->lo + (b - 1) * m->step;
    *hi = *lo + m->step;
    if (*hi > m->hi) *hi = m->hi;
  }
}

/* ---- text ---- */

static void text_num(char *out, size_t size, int64_t v, int u) {
  if (u && (uint64_t)v >= (1ull << 63)) snprintf(out, size, "%llu", (unsigned long long)v);
  else snprintf(out, size, "%lld", (long long)v);
}

static void text_buckets(const struct q_map *m, const uint64_t *v, FILE *f) {
  int nb = (int)(m->value_size / 8), first = -1, last = -1;
  uint64_t peak = 0;
  for (int b = 0; b < nb; b++)
    if (v[b]) {
      if (first < 0) first = b;
      last = b;
      if (v[b] > peak) peak = v[b];
    }
  for (int b = first; b >= 0 && b <= last; b++) {
    int64_t lo, hi;
    int ol, oh;
    hist_bucket(m, b, &lo, &hi, &ol, &oh);
    char range[64], a[24], z[24];
    text_num(a, sizeof a, lo, 1);
    text_num(z, sizeof z, hi, 1);
    if (m->agg == Q_AGG_HIST && b == 0) snprintf(range, sizeof range, "[0]");
    else if (ol) snprintf(range, sizeof range, "(..., %s)", z);
    else if (oh) snprintf(range, sizeof range, "[%s, ...)", a);
    else snprintf(range, sizeof range, "[%s, %s)", a, z);
    int bar = peak ? (int)((v[b] * 50 + peak - 1) / peak) : 0;
    fprintf(f, "%-22s %10llu |%-50.*s|\n", range, (unsigned long long)v[b], bar,
            "@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@");
  }
}

static void text_entry(const struct ms_query *q, const struct q_map *m, const struct entry *e, FILE *f) {
  fprintf(f, "%s", m->name);
  if (m->n_keys) {
    fputc('[', f);
    for (int k = 0; k < m->n_keys; k++) {
      char name[256];
      key_name(q, m, k, e->key[k], name, sizeof name);
      fprintf(f, "%s%s", k ? ", " : "", name);
    }
    fputc(']', f);
  }
  const uint64_t *v = e->v;
  switch (m->agg) {
  case Q_AGG_COUNT: case Q_AGG_SUM: fprintf(f, ": %llu\n", (unsigned long long)v[0]); break;
  case Q_AGG_AVG: fprintf(f, ": %.6g (n %llu)\n", v[0] ? (double)v[1] / (double)v[0] : 0, (unsigned long long)v[0]); break;
  case Q_AGG_MIN: case Q_AGG_MAX:
    if (m->arg_signed) fprintf(f, ": %lld (n %llu)\n", (long long)(int64_t)v[1], (unsigned long long)v[0]);
    else fprintf(f, ": %llu (n %llu)\n", (unsigned long long)v[1], (unsigned long long)v[0]);
    break;
  case Q_AGG_QUANTILE:
    fputc(':', f);
    for (int i = 0; i < m->n_q; i++) fprintf(f, " p%g %.6g", m->q[i] * 100, quantile_of(v, m->q[i]));
    fprintf(f, " (n %.0f, within 3.2%%)\n", total(m, v));
    break;
  default:
    fprintf(f, ":\n");
    text_buckets(m, v, f);
    break;
  }
}

static void text_counts(const struct ms_coverage *c, FILE *f) {
  fprintf(f, "eligible %llu, executed %llu, throttled %llu, lost %llu, failed %llu, generation %u",
          (unsigned long long)c->eligible, (unsigned long long)c->executed, (unsigned long long)c->throttled,
          (unsigned long long)c->lost, (unsigned long long)c->failed, c->generation);
}

static const char *const replica_state[MS_QUERY_REPLICA_STATE_COUNT] = {"answering", "gone", "unreachable"};

static const char *state_of(const struct ms_query_replica *r) {
  return (unsigned)r->state < MS_QUERY_REPLICA_STATE_COUNT ? replica_state[r->state] : "?";
}

/* One line an engine, then the total's (its steps are each engine's own). */
static void text_replicas(const struct ms_query_print *po, FILE *f) {
  size_t in = 0;
  for (size_t i = 0; i < po->n_replicas; i++) {
    const struct ms_query_replica *r = &po->replicas[i];
    in += r->in_total != 0;
    fprintf(f, "replica %s: %s", r->name, state_of(r));
    if (r->why) fprintf(f, " (%s)", r->why);
    if (r->id) fprintf(f, ", attachment %d", r->id);
    if (r->has_cov) {
      fprintf(f, "; %s", r->state != MS_QUERY_REPLICA_ANSWERING ? "coverage as last read: " : "");
      text_counts(&r->cov, f);
      fprintf(f, ", steps %llu-%llu", (unsigned long long)r->cov.first_step, (unsigned long long)r->cov.last_step);
    }
    fprintf(f, "%s\n", r->in_total ? "" : "; not in the total");
  }
  fprintf(f, "coverage of %zu of %zu engines: ", in, po->n_replicas);
}

/* One line a rank, before the total's. */
static void text_ranks(const struct ms_query_print *po, FILE *f) {
  for (size_t i = 0; i < po->n_ranks; i++) {
    fprintf(f, "rank %zu: ", i);
    text_counts(&po->ranks[i], f);
    fprintf(f, ", steps %llu-%llu\n", (unsigned long long)po->ranks[i].first_step,
            (unsigned long long)po->ranks[i].last_step);
  }
  if (po->n_ranks) fprintf(f, "every rank's ");
}

static void text_coverage(const struct ms_coverage *c, uint64_t dropped, const struct ms_query_print *po, FILE *f) {
  text_ranks(po, f);
  if (po->n_replicas) {
    text_replicas(po, f);
    text_counts(c, f);
    fprintf(f, "; dropped keys %llu; %.3f s\n", (unsigned long long)dropped, po->elapsed_s);
    return;
  }
  fprintf(f, "coverage: ");
  text_counts(c, f);
  fprintf(f, ", steps %llu-%llu; dropped keys %llu; %.3f s\n", (unsigned long long)c->first_step,
          (unsigned long long)c->last_step, (unsigned long long)dropped, po->elapsed_s);
}

/* ---- JSON ---- */

static const char *const agg_json[Q_AGG_COUNT_KINDS] = {"count", "sum", "min", "max", "avg",
                                                         "hist", "lhist", "quantile", "record"};

static void json_entry(const struct ms_query *q, const struct q_map *m, const struct entry *e, struct ms_json *j) {
  ms_json_obj_begin(j);
  ms_json_key(j, "key");
  ms_json_arr_begin(j);
  for (int k = 0; k < m->n_keys; k++) {
    char name[256];
    key_name(q, m, k, e->key[k], name, sizeof name);
    if (key_is_text(m, k)) ms_json_str(j, name);
    else if (m->key_kind[k] == Q_KEY_SIGNED) ms_json_int(j, (int64_t)e->key[k]);
    else ms_json_uint(j, e->key[k]);
  }
  ms_json_arr_end(j);
  const uint64_t *v = e->v;
  switch (m->agg) {
  case Q_AGG_COUNT: case Q_AGG_SUM: ms_json_kuint(j, "value", v[0]); break;
  case Q_AGG_AVG:
    ms_json_kuint(j, "count", v[0]);
    ms_json_kuint(j, "sum", v[1]);
    ms_json_knum(j, "value", v[0] ? (double)v[1] / (double)v[0] : 0);
    break;
  case Q_AGG_MIN: case Q_AGG_MAX:
    ms_json_kuint(j, "count", v[0]);
    if (m->arg_signed) ms_json_kint(j, "value", (int64_t)v[1]);
    else ms_json_kuint(j, "value", v[1]);
    break;
  case Q_AGG_QUANTILE:
    ms_json_knum(j, "count", total(m, v));
    ms_json_knum(j, "relative_error", 1.0 / (2 * Q_SKETCH_SUB));
    ms_json_key(j, "quantiles");
    ms_json_arr_begin(j);
    for (int i = 0; i < m->n_q; i++) {
      ms_json_obj_begin(j);
      ms_json_knum(j, "q", m->q[i]);
      ms_json_knum(j, "value", quantile_of(v, m->q[i]));
      ms_json_obj_end(j);
    }
    ms_json_arr_end(j);
    break;
  default:
    ms_json_knum(j, "count", total(m, v));
    ms_json_key(j, "buckets");
    ms_json_arr_begin(j);
    for (int b = 0; b < (int)(m->value_size / 8); b++) {
      if (!v[b]) continue;
      int64_t lo, hi;
      int ol, oh;
      hist_bucket(m, b, &lo, &hi, &ol, &oh);
      ms_json_obj_begin(j);
      ms_json_key(j, "lo");
      if (ol) ms_json_null(j);
      else ms_json_int(j, lo);
      ms_json_key(j, "hi");
      if (oh) ms_json_null(j);
      else ms_json_int(j, hi);
      ms_json_kuint(j, "count", v[b]);
      ms_json_obj_end(j);
    }
    ms_json_arr_end(j);
    break;
  }
  ms_json_obj_end(j);
}

static void json_coverage(const struct ms_coverage *c, struct ms_json *j) {
  ms_json_key(j, "coverage");
  ms_coverage_write_json(j, c);
}

/* "ranks": each rank's coverage, the total's parts. */
static void json_ranks(const struct ms_query_print *po, struct ms_json *j) {
  ms_json_key(j, "ranks");
  ms_json_arr_begin(j);
  for (size_t i = 0; i < po->n_ranks; i++) {
    ms_json_obj_begin(j);
    ms_json_kuint(j, "rank", i);
    json_coverage(&po->ranks[i], j);
    ms_json_obj_end(j);
  }
  ms_json_arr_end(j);
}

/* "replicas": each engine's part; "engines_in_total": how many the total covers. */
static void json_replicas(const struct ms_query_print *po, struct ms_json *j) {
  size_t in = 0;
  ms_json_key(j, "replicas");
  ms_json_arr_begin(j);
  for (size_t i = 0; i < po->n_replicas; i++) {
    const struct ms_query_replica *r = &po->replicas[i];
    in += r->in_total != 0;
    ms_json_obj_begin(j);
    ms_json_kstr(j, "socket", r->name);
    ms_json_kstr(j, "state", state_of(r));
    if (r->why) ms_json_kstr(j, "error", r->why);
    if (r->id) ms_json_kint(j, "id", r->id);
    ms_json_kbool(j, "in_total", r->in_total);
    if (r->has_cov) json_coverage(&r->cov, j);
    ms_json_obj_end(j);
  }
  ms_json_arr_end(j);
  ms_json_kuint(j, "engines_in_total", in);
  ms_json_kuint(j, "engines", po->n_replicas);
}

/* ---- records ---- */

struct records {
  const struct q_map *m;
  uint64_t *rows; /* n_fields words each */
  size_t n, cap, bytes;
  int err;
};

static int take_record(void *user, const void *data, uint32_t size) {
  struct records *r = user;
  size_t words = (size_t)r->m->n_fields;
  r->bytes += size + MS_BPF_RINGBUF_HDR_SIZE;
  if (size != 8 * words) return 0; /* not this query's record */
  if (r->n == r->cap) {
    size_t cap = r->cap ? 2 * r->cap : 256;
    uint64_t *v = realloc(r->rows, cap * words * 8);
    if (!v) return r->err = -ENOMEM;
    r->rows = v;
    r->cap = cap;
  }
  memcpy(r->rows + r->n * words, data, size);
  r->n++;
  return 0;
}

static void text_records(const struct ms_query *q, const struct q_map *m, const struct records *r, size_t shown,
                         FILE *f) {
  fprintf(f, "%s: %zu records, %zu bytes\n", m->name, r->n, r->bytes);
  if (!r->n) return;
  for (int k = 0; k < m->n_fields; k++) fprintf(f, "%s%16s", k ? " " : "  ", m->field_text[k]);
  fputc('\n', f);
  for (size_t i = 0; i < shown; i++) {
    for (int k = 0; k < m->n_fields; k++) {
      char cell[32];
      snprintf(cell, sizeof cell, "%llu", (unsigned long long)r->rows[i * (size_t)m->n_fields + (size_t)k]);
      fprintf(f, "%s%16s", k ? " " : "  ", cell);
    }
    fputc('\n', f);
  }
  if (shown < r->n) fprintf(f, "  ... %zu more records\n", r->n - shown);
}

static void json_records(const struct q_map *m, const struct records *r, size_t shown, struct ms_json *j) {
  ms_json_obj_begin(j);
  ms_json_kstr(j, "name", m->name);
  ms_json_kstr(j, "agg", "record");
  ms_json_key(j, "fields");
  ms_json_arr_begin(j);
  for (int k = 0; k < m->n_fields; k++) ms_json_str(j, m->field_text[k]);
  ms_json_arr_end(j);
  ms_json_kuint(j, "total_records", r->n);
  ms_json_kuint(j, "bytes", r->bytes);
  ms_json_key(j, "records");
  ms_json_arr_begin(j);
  for (size_t i = 0; i < shown; i++) {
    ms_json_arr_begin(j);
    for (int k = 0; k < m->n_fields; k++) ms_json_uint(j, r->rows[i * (size_t)m->n_fields + (size_t)k]);
    ms_json_arr_end(j);
  }
  ms_json_arr_end(j);
  ms_json_obj_end(j);
}

static int write_records(const struct ms_query *q, const struct ms_query_maps *maps, int i, uint32_t top, FILE *f,
                         struct ms_json *j) {
  struct records r = {.m = &q->maps[i]};
  int rc = maps->ring ? maps->ring(maps->user, (size_t)i, take_record, &r) : -ENOTSUP;
  if (r.err) rc = r.err;
  if (rc >= 0) {
    size_t shown = top && top < r.n ? top : r.n;
    if (j) json_records(r.m, &r, shown, j);
    else text_records(q, r.m, &r, shown, f);
  }
  free(r.rows);
  return rc < 0 ? rc : 0;
}

/* ---- the read-out ---- */

static int read_map(const struct ms_query *q, const struct ms_query_maps *src, int i, struct collect *c) {
  memset(c, 0, sizeof *c);
  c->m = &q->maps[i];
  c->n_workers = src->n_workers(src->user, (size_t)i);
  if (c->n_workers == 0) c->n_workers = 1;
  int rc = src->foreach(src->user, (size_t)i, collect_one, c);
  if (c->err) rc = c->err;
  if (!rc) qsort(c->e, c->n, sizeof *c->e, by_sort);
  return rc < 0 ? rc : 0;
}

static void collect_free(struct collect *c) {
  for (size_t i = 0; i < c->n; i++) free(c->e[i].v);
  free(c->e);
}

/* ---- intervals ---- */

struct ms_query_snapshot {
  struct collect maps[Q_MAX_MAPS]; /* entries sorted by key */
  int n;
};

static int by_key(const void *a, const void *b) {
  const struct entry *x = a, *y = b;
  for (int i = 0; i < Q_MAX_KEYS; i++)
    if (x->key[i] != y->key[i]) return x->key[i] < y->key[i] ? -1 : 1;
  return 0;
}

void ms_query_snapshot_free(struct ms_query_snapshot *s) {
  if (!s) return;
  for (int i = 0; i < s->n; i++) collect_free(&s->maps[i]);
  free(s);
}

/* A copy of c, sorted by key, into the snapshot's map i. */
static int keep(struct ms_query_snapshot *s, int i, const struct collect *c) {
  struct collect *k = &s->maps[i];
  *k = (struct collect){.m = c->m, .n_workers = c->n_workers};
  if (!c->n) return 0;
  if (!(k->e = malloc(c->n * sizeof *k->e))) return -ENOMEM;
  for (size_t x = 0; x < c->n; x++, k->n++) {
    k->e[x] = c->e[x];
    if (!(k->e[x].v = malloc(c->m->value_size))) return -ENOMEM;
    memcpy(k->e[x].v, c->e[x].v, c->m->value_size);
  }
  qsort(k->e, k->n, sizeof *k->e, by_key);
  return 0;
}

/* c becomes what changed since the snapshot's map: values subtracted (min and
 * max kept: they do not subtract), unchanged entries dropped, re-sorted. */
static void subtract(struct collect *c, const struct collect *old) {
  const struct q_map *m = c->m;
  size_t words = m->value_size / 8, kept = 0;
  int extreme = m->agg == Q_AGG_MIN || m->agg == Q_AGG_MAX;
  for (size_t i = 0; i < c->n; i++) {
    struct entry *e = &c->e[i];
    const struct entry *o = old->n ? bsearch(e, old->e, old->n, sizeof *old->e, by_key) : NULL;
    int changed = !o;
    if (o && extreme) changed = e->v[0] != o->v[0];
    for (size_t w = 0; o && !extreme && w < words; w++) {
      changed |= e->v[w] != o->v[w];
      e->v[w] -= o->v[w];
    }
    if (!changed) {
      free(e->v);
      continue;
    }
    e->sort = sort_key(m, e->v);
    c->e[kept++] = *e;
  }
  c->n = kept;
  qsort(c->e, c->n, sizeof *c->e, by_sort);
}

static int sum_dropped(void *user, const void *key, const void *values) {
  uint64_t *out = ((uint64_t **)user)[0];
  uint32_t n = (uint32_t)(uintptr_t)((uint64_t **)user)[1];
  for (uint32_t w = 0; w < n; w++) {
    uint64_t v;
    memcpy(&v, (const uint8_t *)values + 8 * w, 8);
    *out += v;
  }
  return 0;
}

static uint64_t dropped(const struct ms_query *q, const struct ms_query_maps *src) {
  uint64_t n = 0;
  size_t idx = (size_t)q->n_maps + 1;
  void *u[2] = {&n, (void *)(uintptr_t)src->n_workers(src->user, idx)};
  src->foreach(src->user, idx, sum_dropped, u);
  return n;
}

static void json_map(const struct ms_query *q, const struct q_map *m, const struct collect *c, size_t shown,
                     struct ms_json *j) {
  ms_json_obj_begin(j);
  ms_json_kstr(j, "name", m->name);
  ms_json_kstr(j, "agg", agg_json[m->agg]);
  if (m->arg_text[0]) ms_json_kstr(j, "of", m->arg_text);
  ms_json_key(j, "keys");
  ms_json_arr_begin(j);
  for (int k = 0; k < m->n_keys; k++) ms_json_str(j, m->key_text[k]);
  ms_json_arr_end(j);
  ms_json_kuint(j, "total_keys", c->n);
  ms_json_key(j, "entries");
  ms_json_arr_begin(j);
  for (size_t e = 0; e < shown; e++) json_entry(q, m, &c->e[e], j);
  ms_json_arr_end(j);
  ms_json_obj_end(j);
}

/* Both forms: j set writes JSON into it, else text to f. */
static int write_any(const struct ms_query *q, const struct ms_query_maps *maps, const struct ms_coverage *cov,
                     const struct ms_query_print *po_in, FILE *f, struct ms_json *j) {
  struct ms_query_print po = {0};
  if (po_in) memcpy(&po, po_in, po_in->sz < sizeof po ? po_in->sz : sizeof po);
  struct ms_coverage none = {0}, diff;
  if (!cov) cov = &none;
  if (po.since && po.since_cov) { /* the interval's coverage */
    diff = *cov;
    diff.eligible -= po.since_cov->eligible, diff.executed -= po.since_cov->executed;
    diff.throttled -= po.since_cov->throttled, diff.lost -= po.since_cov->lost, diff.failed -= po.since_cov->failed;
    diff.first_step = po.since_cov->last_step;
    cov = &diff;
  }
  uint64_t drops = dropped(q, maps);
  if (j) {
    ms_json_obj_begin(j);
    ms_json_kstr(j, "query", q->src);
    if (po.part) ms_json_kstr(j, "part", po.part);
    if (po.id) ms_json_kint(j, "id", po.id);
    ms_json_kbool(j, "final", po.final);
    ms_json_kbool(j, "interval", po.since || po.take); /* the first interval starts at the attach */
    ms_json_knum(j, "elapsed_s", po.elapsed_s);
    json_coverage(cov, j);
    if (po.n_replicas) json_replicas(&po, j);
    if (po.n_ranks) json_ranks(&po, j);
    ms_json_kuint(j, "dropped", drops);
    ms_json_key(j, "maps");
    ms_json_arr_begin(j);
  }
  int rc = 0;
  struct ms_query_snapshot *taken = po.take ? calloc(1, sizeof *taken) : NULL;
  if (po.take && !taken) rc = -ENOMEM;
  for (int i = 0; i < q->n_maps && !rc; i++) {
    struct collect c;
    if (taken) taken->n = i + 1;
    if (q->maps[i].agg == Q_AGG_RECORD) {
      rc = write_records(q, maps, i, po.top ? po.top : j ? 0 : 20, f, j);
      continue;
    }
    if ((rc = read_map(q, maps, i, &c))) break;
    if (taken && (rc = keep(taken, i, &c))) {
      collect_free(&c);
      break;
    }
    if (po.since && i < po.since->n) subtract(&c, &po.since->maps[i]);
    const struct q_map *m = &q->maps[i];
    size_t shown = po.top && po.top < c.n ? po.top : c.n;
    if (j) {
      json_map(q, m, &c, shown, j);
    } else {
      if (!c.n) fprintf(f, "%s: %s\n", m->name, po.since ? "(no change)" : "(empty)");
      for (size_t e = 0; e < shown; e++) text_entry(q, m, &c.e[e], f);
      if (shown < c.n) fprintf(f, "%s: ... %zu more keys\n", m->name, c.n - shown);
    }
    collect_free(&c);
  }
  if (j) {
    ms_json_arr_end(j);
    ms_json_obj_end(j);
  } else {
    text_coverage(cov, drops, &po, f);
  }
  if (po.take) {
    if (rc) ms_query_snapshot_free(taken), taken = NULL;
    *po.take = taken;
  }
  return rc;
}

int ms_query_write(const struct ms_query *q, const struct ms_query_maps *maps, const struct ms_coverage *cov,
                   const struct ms_query_print *po, FILE *f) {
  int rc;
  if (po && po->as_json) {
    struct ms_json j;
    ms_json_init(&j, f, po->pretty);
    rc = write_any(q, maps, cov, po, f, &j);
    ms_json_end(&j);
  } else {
    rc = write_any(q, maps, cov, po, f, NULL);
  }
  fflush(f);
  return rc;
}

int ms_query_write_json(const struct ms_query *q, const struct ms_query_maps *maps, const struct ms_coverage *cov,
                        const struct ms_query_print *po, struct ms_json *j) {
  return write_any(q, maps, cov, po, NULL, j);
}

/* ---- the trigger ---- */

static double trigger_value(const struct q_map *m, const struct entry *e) {
  if (m->agg == Q_AGG_QUANTILE) return quantile_of(e->v, m->q[0]);
  if (m->agg == Q_AGG_HIST || m->agg == Q_AGG_LHIST) return total(m, e->v);
  return e->sort;
}

int ms_query_trigger_check(const struct ms_query *q, const struct ms_query_maps *maps, uint64_t *value,
                           char top[2][128]) {
  const struct q_trigger *t = &q->trigger;
  int mi = -1;
  for (int i = 0; i < q->n_maps; i++)
    if (!strcmp(q->maps[i].name, t->map)) mi = i;
  if (!t->has || mi < 0) return 0;
  struct collect c;
  int rc = read_map(q, maps, mi, &c);
  if (rc) return rc;
  const struct q_map *m = &q->maps[mi];
  int fired = 0;
  size_t worst = 0;
  double best = 0;
  /* the entry furthest past the threshold: the largest for > and >=, the smallest for < and <= */
  for (size_t i = 0; i < c.n; i++) {
    double v = trigger_value(m, &c.e[i]), th = (double)t->threshold;
    int hit = t->op == Q_OP_GT ? v > th : t->op == Q_OP_GE ? v >= th : t->op == Q_OP_LT ? v < th
            : t->op == Q_OP_LE ? v <= th : t->op == Q_OP_EQ ? v == th : v != th;
    int further = !fired || (t->op == Q_OP_LT || t->op == Q_OP_LE ? v < best : v > best);
    if (hit && further) fired = 1, worst = i, best = v;
  }
  if (fired) {
    *value = best < 0 ? 0 : (uint64_t)best;
    for (int k = 0; k < 2; k++) {
      top[k][0] = 0;
      if (k >= m->n_keys) continue;
      char name[120];
      key_name(q, m, k, c.e[worst].key[k], name, sizeof name);
      int text = m->key_kind[k] == Q_KEY_CLASS || m->key_kind[k] == Q_KEY_EVCLASS || m->key_kind[k] == Q_KEY_OP;
      if (text) snprintf(top[k], 128, "\"%s\"", name);
      else snprintf(top[k], 128, "%llu", (unsigned long long)c.e[worst].key[k]);
    }
  }
  collect_free(&c);
  return fired;
}

/* ---- map sources ---- */

static int engine_foreach(void *user, size_t i, ms_bpf_map_entry_fn fn, void *fn_user) {
  return ms_bpf_map_foreach(((struct ms_bpf_map **)user)[i], fn, fn_user);
}
static uint32_t engine_workers(void *user, size_t i) { return ms_bpf_map_workers(((struct ms_bpf_map **)user)[i]); }
static int reader_foreach(void *user, size_t i, ms_bpf_map_entry_fn fn, void *fn_user) {
  return ms_bpf_map_reader_foreach(((struct ms_bpf_map_reader **)user)[i], fn, fn_user);
}
static uint32_t reader_workers(void *user, size_t i) {
  return ms_bpf_map_reader_header(((struct ms_bpf_map_reader **)user)[i])->n_workers;
}

/* In process the records are consumed (a read-out is the last one). */
static int engine_ring(void *user, size_t i, ms_bpf_ringbuf_fn fn, void *fn_user) {
  return ms_bpf_ringbuf_consume(((struct ms_bpf_map **)user)[i], fn, fn_user);
}

/* Through a read-only mapping the records stay where they are: walked from the
 * consumer position, which nobody advances, to the producer's. A capture's ring
 * is never consumed, so it fills once and then drops (counted as lost): that is
 * its bound, and no record wraps the end of the data. */
static int reader_ring(void *user, size_t i, ms_bpf_ringbuf_fn fn, void *fn_user) {
  const struct ms_bpf_map_shm *h = ms_bpf_map_reader_header(((struct ms_bpf_map_reader **)user)[i]);
  const uint8_t *base = (const uint8_t *)h, *data = base + h->ring_data_off;
  uint64_t cons = __atomic_load_n((const uint64_t *)(base + h->ring_cons_off), __ATOMIC_ACQUIRE);
  uint64_t prod = __atomic_load_n((const uint64_t *)(base + h->ring_prod_off), __ATOMIC_ACQUIRE);
  uint64_t mask = h->ring_size - 1;
  int n = 0;
  for (uint64_t pos = cons; pos < prod;) {
    uint32_t len = __atomic_load_n((const uint32_t *)(data + (pos & mask)), __ATOMIC_ACQUIRE);
    if (len & MS_BPF_RINGBUF_BUSY_BIT) break;
    uint32_t size = len & ~(MS_BPF_RINGBUF_BUSY_BIT | MS_BPF_RINGBUF_DISCARD_BIT);
    uint64_t start = (pos + MS_BPF_RINGBUF_HDR_SIZE) & mask;
    if (start + size > h->ring_size) break; /* would wrap: not a capture's ring */
    if (!(len & MS_BPF_RINGBUF_DISCARD_BIT)) {
      int rc = fn(fn_user, data + start, size);
      if (rc < 0) return rc;
      n++;
    }
    pos += (MS_BPF_RINGBUF_HDR_SIZE + size + 7) & ~7ull;
  }
  return n;
}

int ms_query_maps_of_engine(struct ms_query_maps *out, struct ms_bpf_map **maps) {
  *out = (struct ms_query_maps){engine_foreach, engine_workers, engine_ring, maps};
  return 0;
}

int ms_query_maps_of_readers(struct ms_query_maps *out, struct ms_bpf_map_reader **readers) {
  *out = (struct ms_query_maps){reader_foreach, reader_workers, reader_ring, readers};
  return 0;
}
