/* SPDX-License-Identifier: MIT */
/* The streaming JSON writer. See json.h. */
#include "megascope/json.h"

#include <inttypes.h>
#include <math.h>

void ms_json_init(struct ms_json *j, FILE *f, int pretty) {
  j->f = f;
  j->pretty = pretty;
  j->depth = 0;
  j->count[0] = 0;
  j->after_key = 0;
}

static void indent(struct ms_json *j) {
  if (!j->pretty) return;
  fputc('\n', j->f);
  for (int i = 0; i < j->depth; i++) fputs("  ", j->f);
}

/* Writes the separator a new value needs at the current depth. */
static void sep(struct ms_json *j) {
  if (j->after_key) {
    j->after_key = 0;
    return;
  }
  if (j->depth > 0) {
    if (j->count[j->depth]++) fputc(',', j->f);
    indent(j);
  }
}

static void open(struct ms_json *j, char c) {
  sep(j);
  fputc(c, j->f);
  if (j->depth < MS_JSON_MAX_DEPTH - 1) j->depth++;
  j->count[j->depth] = 0;
}

static void close(struct ms_json *j, char c) {
  int had = j->count[j->depth];
  if (j->depth > 0) j->depth--;
  if (had) indent(j);
  fputc(c, j->f);
}

void ms_json_obj_begin(struct ms_json *j) { open(j, '{'); }
void ms_json_obj_end(struct ms_json *j) { close(j, '}'); }
void ms_json_arr_begin(struct ms_json *j) { open(j, '['); }
void ms_json_arr_end(struct ms_json *j) { close(j, ']'); }

static void put_escaped(FILE *f, const char *s) {
  fputc('"', f);
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    switch (*p) {
    case '"': fputs("\\\"", f); break;
    case '\\': fputs("\\\\", f); break;
    case '\n': fputs("\\n", f); break;
    case '\r': fputs("\\r", f); break;
    case '\t': fputs("\\t", f); break;
    default:
      if (*p < 0x20)
        fprintf(f, "\\u%04x", *p);
      else
        fputc(*p, f);
    }
  }
  fputc('"', f);
}

void ms_json_key(struct ms_json *j, const char *k) {
  sep(j);
  put_escaped(j->f, k);
  fputs(j->pretty ? ": " : ":", j->f);
  j->after_key = 1;
}

void ms_json_str(struct ms_json *j, const char *s) {
  sep(j);
  if (s)
    put_escaped(j->f, s);
  else
    fputs("null", j->f);
}

void ms_json_int(struct ms_json *j, int64_t v) {
  sep(j);
  fprintf(j->f, "%" PRId64, v);
}

void ms_json_uint(struct ms_json *j, uint64_t v) {
  sep(j);
  fprintf(j->f, "%" PRIu64, v);
}

void ms_json_num(struct ms_json *j, double v) {
  sep(j);
  if (isfinite(v))
    fprintf(j->f, "%.9g", v);
  else
    fputs("null", j->f);
}

void ms_json_bool(struct ms_json *j, int v) {
  sep(j);
  fputs(v ? "true" : "false", j->f);
}

void ms_json_null(struct ms_json *j) {
  sep(j);
  fputs("null", j->f);
}

void ms_json_end(struct ms_json *j) {
  fputc('\n', j->f);
  fflush(j->f);
}

void ms_json_kstr(struct ms_json *j, const char *k, const char *v) { ms_json_key(j, k); ms_json_str(j, v); }
void ms_json_kint(struct ms_json *j, const char *k, int64_t v) { ms_json_key(j, k); ms_json_int(j, v); }
void ms_json_kuint(struct ms_json *j, const char *k, uint64_t v) { ms_json_key(j, k); ms_json_uint(j, v); }
void ms_json_knum(struct ms_json *j, const char *k, double v) { ms_json_key(j, k); ms_json_num(j, v); }
void ms_json_kbool(struct ms_json *j, const char *k, int v) { ms_json_key(j, k); ms_json_bool(j, v); }
