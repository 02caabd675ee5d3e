/* SPDX-License-Identifier: MIT */
/* GGUF metadata queries: values are decoded from the mapping on demand, with
 * integer types converting to each other when the value fits (writers differ
 * on u32 versus u64 counts and i32 versus u32 ids). */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "model/gguf_impl.h"

int ms_gguf_n_kv(const struct ms_gguf *g) { return g->n_kv; }

const char *ms_gguf_kv_key(const struct ms_gguf *g, int i) {
  return i >= 0 && i < g->n_kv ? g->kvs[i].key : NULL;
}

enum ms_gguf_vtype ms_gguf_kv_type(const struct ms_gguf *g, int i) {
  return i >= 0 && i < g->n_kv ? g->kvs[i].type : MS_GGUF_VTYPE_COUNT;
}

int ms_gguf_find_kv(const struct ms_gguf *g, const char *key) {
  for (int i = 0; i < g->n_kv; i++)
    if (!strcmp(g->kvs[i].key, key)) return i;
  return -ENOENT;
}

/* Decodes a scalar of type t at p: integers into *iv (ok_int set), floats into *fv. */
static void scalar(enum ms_gguf_vtype t, const uint8_t *p, int64_t *iv, double *fv, int *is_int, int *fits) {
  uint64_t u = 0;
  *is_int = 1;
  *fits = 1;
  switch (t) {
  case MS_GGUF_U8: case MS_GGUF_BOOL: *iv = p[0]; return;
  case MS_GGUF_I8: *iv = (int8_t)p[0]; return;
  case MS_GGUF_U16: { uint16_t v; memcpy(&v, p, 2); *iv = v; return; }
  case MS_GGUF_I16: { int16_t v; memcpy(&v, p, 2); *iv = v; return; }
  case MS_GGUF_U32: { uint32_t v; memcpy(&v, p, 4); *iv = v; return; }
  case MS_GGUF_I32: { int32_t v; memcpy(&v, p, 4); *iv = v; return; }
  case MS_GGUF_I64: memcpy(iv, p, 8); return;
  case MS_GGUF_U64:
    memcpy(&u, p, 8);
    *fits = u <= (uint64_t)INT64_MAX;
    *iv = (int64_t)u;
    return;
  case MS_GGUF_F32: { float v; memcpy(&v, p, 4); *fv = v; *is_int = 0; return; }
  case MS_GGUF_F64: memcpy(fv, p, 8); *is_int = 0; return;
  default: *is_int = 0; *fits = 0; return;
  }
}

static const struct gguf_kv *find(const struct ms_gguf *g, const char *key) {
  int i = ms_gguf_find_kv(g, key);
  return i < 0 ? NULL : &g->kvs[i];
}

static int get_int_at(enum ms_gguf_vtype t, const uint8_t *p, int64_t *out) {
  int64_t iv = 0;
  double fv = 0;
  int is_int, fits;
  if (t == MS_GGUF_BOOL || t == MS_GGUF_F32 || t == MS_GGUF_F64 || t == MS_GGUF_STR || t == MS_GGUF_ARR)
    return -MS_E_FORMAT;
  scalar(t, p, &iv, &fv, &is_int, &fits);
  if (!is_int || !fits) return -MS_E_FORMAT;
  *out = iv;
  return 0;
}

static int get_float_at(enum ms_gguf_vtype t, const uint8_t *p, double *out) {
  int64_t iv = 0;
  double fv = 0;
  int is_int, fits;
  if (t != MS_GGUF_F32 && t != MS_GGUF_F64) return -MS_E_FORMAT;
  scalar(t, p, &iv, &fv, &is_int, &fits);
  *out = fv;
  return 0;
}

int ms_gguf_get_int(const struct ms_gguf *g, const char *key, int64_t *out) {
  const struct gguf_kv *kv = find(g, key);
  return kv ? get_int_at(kv->type, g->base + kv->off, out) : -ENOENT;
}

int ms_gguf_get_float(const struct ms_gguf *g, const char *key, double *out) {
  const struct gguf_kv *kv = find(g, key);
  return kv ? get_float_at(kv->type, g->base + kv->off, out) : -ENOENT;
}

int ms_gguf_get_bool(const struct ms_gguf *g, const char *key, int *out) {
  const struct gguf_kv *kv = find(g, key);
  if (!kv) return -ENOENT;
  if (kv->type != MS_GGUF_BOOL) return -MS_E_FORMAT;
  *out = g->base[kv->off] != 0;
  return 0;
}

static void str_at(const struct ms_gguf *g, size_t off, const char **s, size_t *len) {
  uint64_t n;
  memcpy(&n, g->base + off, 8);
  *s = (const char *)g->base + off + 8;
  *len = (size_t)n;
}

int ms_gguf_get_str(const struct ms_gguf *g, const char *key, const char **s, size_t *len) {
  const struct gguf_kv *kv = find(g, key);
  if (!kv) return -ENOENT;
  if (kv->type != MS_GGUF_STR) return -MS_E_FORMAT;
  str_at(g, kv->off, s, len);
  return 0;
}

int ms_gguf_get_arr(const struct ms_gguf *g, const char *key, enum ms_gguf_vtype *elem, uint64_t *n) {
  const struct gguf_kv *kv = find(g, key);
  if (!kv) return -ENOENT;
  if (kv->type != MS_GGUF_ARR) return -MS_E_FORMAT;
  *elem = kv->arr_type;
  *n = kv->arr_n;
  return 0;
}

static const struct gguf_kv *find_arr(const struct ms_gguf *g, const char *key, uint64_t i, int *rc) {
  const struct gguf_kv *kv = find(g, key);
  *rc = !kv ? -ENOENT : kv->type != MS_GGUF_ARR ? -MS_E_FORMAT : i >= kv->arr_n ? -ERANGE : 0;
  return *rc ? NULL : kv;
}

int ms_gguf_arr_int(const struct ms_gguf *g, const char *key, uint64_t i, int64_t *out) {
  int rc;
  const struct gguf_kv *kv = find_arr(g, key, i, &rc);
  if (!kv) return rc;
  if (kv->arr_type == MS_GGUF_STR) return -MS_E_FORMAT;
  /* element sizes: every non-string array element is a fixed-size scalar */
  static const size_t sz[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
  return get_int_at(kv->arr_type, g->base + kv->off + (size_t)i * sz[kv->arr_type], out);
}

int ms_gguf_arr_float(const struct ms_gguf *g, const char *key, uint64_t i, double *out) {
  int rc;
  const struct gguf_kv *kv = find_arr(g, key, i, &rc);
  if (!kv) return rc;
  if (kv->arr_type != MS_GGUF_F32 && kv->arr_type != MS_GGUF_F64) return -MS_E_FORMAT;
  return get_float_at(kv->arr_type, g->base + kv->off + (size_t)i * (kv->arr_type == MS_GGUF_F32 ? 4 : 8), out);
}

int ms_gguf_arr_str(const struct ms_gguf *g, const char *key, uint64_t i, const char **s, size_t *len) {
  int rc;
  const struct gguf_kv *kv = find_arr(g, key, i, &rc);
  if (!kv) return rc;
  if (kv->arr_type != MS_GGUF_STR) return -MS_E_FORMAT;
  str_at(g, kv->str_off[i], s, len);
  return 0;
}

static const char *vtype_name(enum ms_gguf_vtype t) {
  static const char *n[] = {"u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "str", "arr", "u64", "i64", "f64"};
  return (unsigned)t < MS_GGUF_VTYPE_COUNT ? n[t] : "?";
}

/* Writes a string value with non-printable bytes escaped, cut at 60 bytes. */
static void fmt_str(char *buf, size_t size, const char *s, size_t len) {
  size_t o = 0;
  if (size < 8) {
    if (size) buf[0] = '\0';
    return;
  }
  buf[o++] = '\'';
  for (size_t i = 0; i < len && i < 60 && o + 6 < size; i++) {
    unsigned char ch = (unsigned char)s[i];
    if (ch >= 0x20 && ch != 0x7f && ch != '\\') buf[o++] = (char)ch;
    else o += (size_t)snprintf(buf + o, size - o, "\\x%02x", ch);
  }
  if (len > 60 && o + 4 < size) buf[o++] = '.', buf[o++] = '.', buf[o++] = '.';
  buf[o++] = '\'';
  buf[o] = '\0';
}

void ms_gguf_kv_format(const struct ms_gguf *g, int i, char *buf, size_t size) {
  if (i < 0 || i >= g->n_kv) {
    snprintf(buf, size, "?");
    return;
  }
  const struct gguf_kv *kv = &g->kvs[i];
  const uint8_t *p = g->base + kv->off;
  int64_t iv = 0;
  double fv = 0;
  int is_int, fits;
  if (kv->type == MS_GGUF_STR) {
    const char *s;
    size_t len;
    str_at(g, kv->off, &s, &len);
    fmt_str(buf, size, s, len);
  } else if (kv->type == MS_GGUF_ARR) {
    snprintf(buf, size, "[%" PRIu64 " x %s]", kv->arr_n, vtype_name(kv->arr_type));
  } else if (kv->type == MS_GGUF_BOOL) {
    snprintf(buf, size, "%s", p[0] ? "true" : "false");
  } else {
    scalar(kv->type, p, &iv, &fv, &is_int, &fits);
    if (!is_int) snprintf(buf, size, "%.9g", fv);
    else if (!fits) snprintf(buf, size, "%" PRIu64, (uint64_t)iv);
    else snprintf(buf, size, "%" PRId64, iv);
  }
}
