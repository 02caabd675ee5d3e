/* SPDX-License-Identifier: MIT */
/* A streaming JSON writer for everything megascope prints with --json and writes
 * as files (schema, reports, traces). Written by hand: output is streamed (traces
 * can be large), numbers are printed exactly as we choose (%.9g floats, integers
 * as integers), and it needs commas and escaping only, about a hundred lines. */
#ifndef MEGASCOPE_JSON_H
#define MEGASCOPE_JSON_H

#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

#define MS_JSON_MAX_DEPTH 32

struct ms_json {
  FILE *f;
  int pretty;
  int depth;
  int count[MS_JSON_MAX_DEPTH];  /* items written at each depth */
  int after_key;
};

void ms_json_init(struct ms_json *j, FILE *f, int pretty);
void ms_json_obj_begin(struct ms_json *j);
void ms_json_obj_end(struct ms_json *j);
void ms_json_arr_begin(struct ms_json *j);
void ms_json_arr_end(struct ms_json *j);
void ms_json_key(struct ms_json *j, const char *k);
void ms_json_str(struct ms_json *j, const char *s);
void ms_json_int(struct ms_json *j, int64_t v);
void ms_json_uint(struct ms_json *j, uint64_t v);
void ms_json_num(struct ms_json *j, double v);  /* non-finite values print null */
void ms_json_bool(struct ms_json *j, int v);
void ms_json_null(struct ms_json *j);
/* Finishes the document with a newline. */
void ms_json_end(struct ms_json *j);

/* key + value shorthands */
void ms_json_kstr(struct ms_json *j, const char *k, const char *v);
void ms_json_kint(struct ms_json *j, const char *k, int64_t v);
void ms_json_kuint(struct ms_json *j, const char *k, uint64_t v);
void ms_json_knum(struct ms_json *j, const char *k, double v);
void ms_json_kbool(struct ms_json *j, const char *k, int v);

#ifdef __cplusplus
}
#endif
#endif
