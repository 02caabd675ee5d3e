/* SPDX-License-Identifier: MIT */
/* A sanity check of an object's .BTF section before libbpf parses it.
 *
 * libbpf 1.1 (the version these machines carry) checks BTF's layout but not
 * what the types say: a type id past the last type, a name outside the
 * string section or a typedef/const chain that loops back on itself makes it
 * crash or spin while it reads BTF-defined maps (later libbpf releases added
 * such a check). So the ELF loader runs this first, the same rules as newer
 * libbpf's btf_validate_type plus a cycle check on the chains libbpf follows
 * without a depth bound. Only native-endian BTF is accepted: objects are
 * little-endian and so is every host megascope runs on. */
#include <errno.h>
#include <linux/btf.h>
#include <stdlib.h>
#include <string.h>

#include "bpf/bpf_internal.h"

struct btf_view {
  const uint8_t *types; /* the type section */
  uint32_t types_len;
  const char *strs;
  uint32_t strs_len;
  const struct btf_type **by_id; /* [1..n] */
  uint32_t n;
  struct ms_textbuf *log;
};

static int bad(struct btf_view *b, uint32_t id, const char *what, uint32_t v) {
  ms_textbuf_printf(b->log, ".BTF type [%u]: %s (%u)\n", id, what, v);
  return -MS_E_FORMAT;
}

/* Bytes that follow the common struct btf_type for a kind, or -1. */
static int64_t trailing_size(const struct btf_type *t) {
  uint32_t vlen = BTF_INFO_VLEN(t->info);
  switch (BTF_INFO_KIND(t->info)) {
  case BTF_KIND_INT: return 4;
  case BTF_KIND_PTR: case BTF_KIND_FWD: case BTF_KIND_TYPEDEF: case BTF_KIND_VOLATILE:
  case BTF_KIND_CONST: case BTF_KIND_RESTRICT: case BTF_KIND_FUNC: case BTF_KIND_FLOAT:
  case BTF_KIND_TYPE_TAG:
    return 0;
  case BTF_KIND_ARRAY: return sizeof(struct btf_array);
  case BTF_KIND_STRUCT: case BTF_KIND_UNION: return (int64_t)vlen * sizeof(struct btf_member);
  case BTF_KIND_ENUM: return (int64_t)vlen * sizeof(struct btf_enum);
  case BTF_KIND_FUNC_PROTO: return (int64_t)vlen * sizeof(struct btf_param);
  case BTF_KIND_VAR: return sizeof(struct btf_var);
  case BTF_KIND_DATASEC: return (int64_t)vlen * sizeof(struct btf_var_secinfo);
  case BTF_KIND_DECL_TAG: return sizeof(struct btf_decl_tag);
  case BTF_KIND_ENUM64: return (int64_t)vlen * sizeof(struct btf_enum64);
  default: return -1;
  }
}

static int check_str(struct btf_view *b, uint32_t id, uint32_t off) {
  return off < b->strs_len ? 0 : bad(b, id, "name offset outside the string section", off);
}

static int check_id(struct btf_view *b, uint32_t id, uint32_t ref) {
  return ref <= b->n ? 0 : bad(b, id, "refers to a type id past the last type", ref);
}

static int check_type(struct btf_view *b, uint32_t id) {
  const struct btf_type *t = b->by_id[id];
  const void *extra = t + 1;
  uint32_t vlen = BTF_INFO_VLEN(t->info);
  int err = check_str(b, id, t->name_off);
  switch (BTF_INFO_KIND(t->info)) {
  case BTF_KIND_PTR: case BTF_KIND_TYPEDEF: case BTF_KIND_VOLATILE: case BTF_KIND_CONST:
  case BTF_KIND_RESTRICT: case BTF_KIND_VAR: case BTF_KIND_DECL_TAG: case BTF_KIND_TYPE_TAG:
    return err ? err : check_id(b, id, t->type);
  case BTF_KIND_FUNC:
    if (err || (err = check_id(b, id, t->type))) return err;
    if (!t->type || BTF_INFO_KIND(b->by_id[t->type]->info) != BTF_KIND_FUNC_PROTO)
      return bad(b, id, "function whose type is not a prototype", t->type);
    return 0;
  case BTF_KIND_ARRAY: {
    const struct btf_array *a = extra;
    return err ? err : check_id(b, id, a->type) ? -MS_E_FORMAT : check_id(b, id, a->index_type);
  }
  case BTF_KIND_STRUCT: case BTF_KIND_UNION: {
    const struct btf_member *m = extra;
    for (uint32_t i = 0; i < vlen && !err; i++) err = check_str(b, id, m[i].name_off) ? -MS_E_FORMAT : check_id(b, id, m[i].type);
    return err;
  }
  case BTF_KIND_ENUM: {
    const struct btf_enum *e = extra;
    for (uint32_t i = 0; i < vlen && !err; i++) err = check_str(b, id, e[i].name_off);
    return err;
  }
  case BTF_KIND_ENUM64: {
    const struct btf_enum64 *e = extra;
    for (uint32_t i = 0; i < vlen && !err; i++) err = check_str(b, id, e[i].name_off);
    return err;
  }
  case BTF_KIND_FUNC_PROTO: {
    const struct btf_param *p = extra;
    err = err ? err : check_id(b, id, t->type);
    for (uint32_t i = 0; i < vlen && !err; i++) err = check_str(b, id, p[i].name_off) ? -MS_E_FORMAT : check_id(b, id, p[i].type);
    return err;
  }
  case BTF_KIND_DATASEC: {
    const struct btf_var_secinfo *v = extra;
    for (uint32_t i = 0; i < vlen && !err; i++) err = check_id(b, id, v[i].type);
    return err;
  }
  default: return err; /* INT, FWD, FLOAT */
  }
}

/* The one type a non-pointer type leads to (what libbpf follows without a
 * depth bound when it skips modifiers and typedefs), or 0. */
static uint32_t successor(const struct btf_view *b, uint32_t id) {
  const struct btf_type *t = b->by_id[id];
  switch (BTF_INFO_KIND(t->info)) {
  case BTF_KIND_TYPEDEF: case BTF_KIND_VOLATILE: case BTF_KIND_CONST: case BTF_KIND_RESTRICT:
  case BTF_KIND_TYPE_TAG: case BTF_KIND_VAR: case BTF_KIND_DECL_TAG: case BTF_KIND_FUNC:
    return t->type;
  case BTF_KIND_ARRAY: return ((const struct btf_array *)(t + 1))->type;
  default: return 0;
  }
}

/* Chains must end: a walk longer than the type count has looped. Walks stop
 * early at types already proved to end (done[]). */
static int check_cycles(struct btf_view *b) {
  uint8_t *done = calloc(b->n + 1, 1);
  if (!done) return -ENOMEM;
  done[0] = 1;
  int err = 0;
  for (uint32_t id = 1; id <= b->n && !err; id++) {
    uint32_t steps = 0, t = id;
    while (!done[t] && steps++ <= b->n) t = successor(b, t);
    if (!done[t]) {
      err = bad(b, id, "starts a chain of typedefs/modifiers/arrays that loops", steps);
      break;
    }
    for (t = id; !done[t]; t = successor(b, t)) done[t] = 1;
  }
  free(done);
  return err;
}

static int index_types(struct btf_view *b) {
  uint32_t cap = 64, n = 0;
  b->by_id = malloc(cap * sizeof *b->by_id);
  if (!b->by_id) return -ENOMEM;
  for (uint32_t off = 0; off < b->types_len;) {
    if (b->types_len - off < sizeof(struct btf_type)) return bad(b, n + 1, "type record cut off", off);
    const struct btf_type *t = (const struct btf_type *)(b->types + off);
    int64_t extra = trailing_size(t);
    if (extra < 0) return bad(b, n + 1, "unknown kind", BTF_INFO_KIND(t->info));
    if ((uint64_t)extra > b->types_len - off - sizeof *t) return bad(b, n + 1, "type record runs past the section", off);
    if (n + 1 >= cap) {
      const struct btf_type **p = realloc(b->by_id, (cap *= 2) * sizeof *p);
      if (!p) return -ENOMEM;
      b->by_id = p;
    }
    b->by_id[++n] = t;
    off += (uint32_t)(sizeof *t + (uint64_t)extra);
  }
  b->n = n;
  return 0;
}

static int check_layout(struct btf_view *b, const uint8_t *data, size_t size) {
  struct btf_header h;
  if (size < sizeof h) return bad(b, 0, "section shorter than its header", (uint32_t)size);
  memcpy(&h, data, sizeof h);
  if (h.magic != BTF_MAGIC || h.version != 1) return bad(b, 0, "bad magic or version", h.magic);
  if (h.hdr_len < sizeof h || h.hdr_len > size || h.hdr_len % 4) return bad(b, 0, "bad header length", h.hdr_len);
  uint64_t body = size - h.hdr_len;
  if ((uint64_t)h.type_off + h.type_len > body || (uint64_t)h.str_off + h.str_len > body || h.type_off % 4)
    return bad(b, 0, "type or string section outside .BTF", h.type_off);
  b->types = data + h.hdr_len + h.type_off;
  b->types_len = h.type_len;
  b->strs = (const char *)data + h.hdr_len + h.str_off;
  b->strs_len = h.str_len;
  if (!b->strs_len || b->strs[0] || b->strs[b->strs_len - 1])
    return bad(b, 0, "string section not NUL-delimited", b->strs_len);
  return 0;
}

int ms_bpf_btf_check(const uint8_t *data, size_t size, struct ms_textbuf *log) {
  struct btf_view b = {.log = log};
  uint8_t *copy = malloc(size ? size : 1); /* aligned: the section may sit anywhere in the file */
  if (!copy) return -ENOMEM;
  memcpy(copy, data, size);
  int err = check_layout(&b, copy, size);
  if (!err) err = index_types(&b);
  for (uint32_t id = 1; !err && id <= b.n; id++) err = check_type(&b, id);
  if (!err) err = check_cycles(&b);
  free(b.by_id);
  free(copy);
  return err;
}
