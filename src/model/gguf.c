/* SPDX-License-Identifier: MIT */
/* The GGUF reader (see megascope/gguf.h): maps a file and checks every byte of
 * its header, metadata and tensor infos before anything uses them.
 *
 * Parsing walks a cursor over the mapping; every read is bounds-checked and a
 * failure writes "offset N: <what>: <why>" into the caller's log and returns
 * -MS_E_FORMAT. Counts are checked against the bytes left before anything is
 * allocated for them, so a corrupt count cannot ask for gigabytes. Metadata
 * values stay in the mapping: a key records where its value starts (and, for
 * arrays of strings, where each element starts), and getters decode on demand. */
#include "megascope/gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "model/gguf_impl.h"

/* ggml's type table: block elements and bytes per block, for every type a file
 * may hold (so files with types megascope does not compute with still parse). */
static const struct {
  uint32_t id;
  const char *name;
  int blck;
  int size;
} ggml_types[] = {
    {0, "f32", 1, 4},        {1, "f16", 1, 2},        {2, "q4_0", 32, 18},     {3, "q4_1", 32, 20},
    {6, "q5_0", 32, 22},     {7, "q5_1", 32, 24},     {8, "q8_0", 32, 34},     {9, "q8_1", 32, 36},
    {10, "q2_K", 256, 84},   {11, "q3_K", 256, 110},  {12, "q4_K", 256, 144},  {13, "q5_K", 256, 176},
    {14, "q6_K", 256, 210},  {15, "q8_K", 256, 292},  {16, "iq2_xxs", 256, 66}, {17, "iq2_xs", 256, 74},
    {18, "iq3_xxs", 256, 98}, {19, "iq1_s", 256, 50}, {20, "iq4_nl", 32, 18},  {21, "iq3_s", 256, 110},
    {22, "iq2_s", 256, 82},  {23, "iq4_xs", 256, 136}, {24, "i8", 1, 1},       {25, "i16", 1, 2},
    {26, "i32", 1, 4},       {27, "i64", 1, 8},       {28, "f64", 1, 8},       {29, "iq1_m", 256, 56},
    {30, "bf16", 1, 2},      {34, "tq1_0", 256, 54},  {35, "tq2_0", 256, 66},  {39, "mxfp4", 32, 17},
};

static int type_index(uint32_t id) {
  for (size_t i = 0; i < sizeof ggml_types / sizeof ggml_types[0]; i++)
    if (ggml_types[i].id == id) return (int)i;
  return -1;
}

const char *ms_gguf_type_name(uint32_t t) {
  int i = type_index(t);
  return i < 0 ? "?" : ggml_types[i].name;
}

int ms_gguf_type_dtype(uint32_t t, enum ms_dtype *out) {
  switch (t) {
  case MS_GGML_F32: *out = MS_DTYPE_F32; return 0;
  case MS_GGML_F16: *out = MS_DTYPE_F16; return 0;
  case MS_GGML_BF16: *out = MS_DTYPE_BF16; return 0;
  case MS_GGML_Q8_0: *out = MS_DTYPE_Q8_0; return 0;
  case MS_GGML_Q4_0: *out = MS_DTYPE_Q4_0; return 0;
  case MS_GGML_Q4_1: *out = MS_DTYPE_Q4_1; return 0;
  case MS_GGML_Q5_0: *out = MS_DTYPE_Q5_0; return 0;
  case MS_GGML_Q5_1: *out = MS_DTYPE_Q5_1; return 0;
  case MS_GGML_IQ4_NL: *out = MS_DTYPE_IQ4_NL; return 0;
  case MS_GGML_Q2_K: *out = MS_DTYPE_Q2_K; return 0;
  case MS_GGML_Q3_K: *out = MS_DTYPE_Q3_K; return 0;
  case MS_GGML_Q4_K: *out = MS_DTYPE_Q4_K; return 0;
  case MS_GGML_Q5_K: *out = MS_DTYPE_Q5_K; return 0;
  case MS_GGML_Q6_K: *out = MS_DTYPE_Q6_K; return 0;
  case MS_GGML_Q8_K: *out = MS_DTYPE_Q8_K; return 0;
  default: return -MS_E_UNSUPP;
  }
}

uint32_t ms_gguf_dtype_type(enum ms_dtype t) {
  static const uint32_t ids[MS_DTYPE_COUNT] = {
      [MS_DTYPE_F32] = MS_GGML_F32,   [MS_DTYPE_BF16] = MS_GGML_BF16, [MS_DTYPE_F16] = MS_GGML_F16,
      [MS_DTYPE_Q8_0] = MS_GGML_Q8_0, [MS_DTYPE_Q4_0] = MS_GGML_Q4_0, [MS_DTYPE_Q4_1] = MS_GGML_Q4_1,
      [MS_DTYPE_Q5_0] = MS_GGML_Q5_0, [MS_DTYPE_Q5_1] = MS_GGML_Q5_1, [MS_DTYPE_IQ4_NL] = MS_GGML_IQ4_NL,
      [MS_DTYPE_Q2_K] = MS_GGML_Q2_K, [MS_DTYPE_Q3_K] = MS_GGML_Q3_K, [MS_DTYPE_Q4_K] = MS_GGML_Q4_K,
      [MS_DTYPE_Q5_K] = MS_GGML_Q5_K, [MS_DTYPE_Q6_K] = MS_GGML_Q6_K, [MS_DTYPE_Q8_K] = MS_GGML_Q8_K};
  return (unsigned)t < MS_DTYPE_COUNT ? ids[t] : UINT32_MAX;
}

/* ---- the cursor ---- */

struct cur {
  const uint8_t *p;
  size_t size, off;
  struct ms_textbuf *log;
};

__attribute__((format(printf, 3, 4))) static int fail(struct cur *c, size_t off, const char *fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (c->log) ms_textbuf_printf(c->log, "offset %zu: %s\n", off, msg);
  return -MS_E_FORMAT;
}

static size_t left(const struct cur *c) { return c->size - c->off; }

/* Reads n bytes into out, or fails naming `what`. */
static int take(struct cur *c, void *out, size_t n, const char *what) {
  if (left(c) < n) return fail(c, c->off, "%s: truncated (%zu bytes needed, %zu left)", what, n, left(c));
  memcpy(out, c->p + c->off, n);
  c->off += n;
  return 0;
}

static int take_u32(struct cur *c, uint32_t *v, const char *what) { return take(c, v, 4, what); }
static int take_u64(struct cur *c, uint64_t *v, const char *what) { return take(c, v, 8, what); }

/* A gguf string: u64 length, then the bytes. Returns its start in *s. */
static int take_str(struct cur *c, size_t *s, uint64_t *len, const char *what) {
  size_t at = c->off;
  int rc = take_u64(c, len, what);
  if (rc) return rc;
  if (*len > left(c))
    return fail(c, at, "%s: string of %llu bytes runs past the end of the file (%zu left)", what,
                (unsigned long long)*len, left(c));
  *s = c->off;
  c->off += (size_t)*len;
  return 0;
}

static size_t vtype_size(enum ms_gguf_vtype t) {
  static const size_t sz[MS_GGUF_VTYPE_COUNT] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
  return (unsigned)t < MS_GGUF_VTYPE_COUNT ? sz[t] : 0;
}

/* ---- metadata ---- */

static int parse_value(struct cur *c, struct gguf_kv *kv) {
  size_t at = c->off;
  char what[GGUF_MAX_NAME + 80];
  snprintf(what, sizeof what, "key '%.*s'", GGUF_MAX_NAME + 64, kv->key);
  kv->off = at;
  if (kv->type == MS_GGUF_STR) {
    size_t s = 0;
    uint64_t n = 0;
    return take_str(c, &s, &n, what);
  }
  if (kv->type != MS_GGUF_ARR) {
    size_t n = vtype_size(kv->type);
    if (left(c) < n) return fail(c, at, "key '%s': value truncated", kv->key);
    if (kv->type == MS_GGUF_BOOL && c->p[at] > 1)
      return fail(c, at, "key '%s': bool value %u is neither 0 nor 1", kv->key, c->p[at]);
    c->off += n;
    return 0;
  }
  uint32_t et = 0;
  uint64_t n = 0;
  int rc;
  if ((rc = take_u32(c, &et, what)) || (rc = take_u64(c, &n, what))) return rc;
  if (et >= MS_GGUF_VTYPE_COUNT) return fail(c, at, "key '%s': array element type %u unknown", kv->key, et);
  if (et == MS_GGUF_ARR) return fail(c, at, "key '%s': arrays of arrays are not supported", kv->key);
  kv->arr_type = (enum ms_gguf_vtype)et;
  kv->arr_n = n;
  kv->off = c->off;
  if (et != MS_GGUF_STR) {
    size_t es = vtype_size(kv->arr_type);
    if (n > left(c) / es)
      return fail(c, at, "key '%s': array of %llu x %zu-byte elements runs past the end of the file", kv->key,
                  (unsigned long long)n, es);
    c->off += (size_t)n * es;
    return 0;
  }
  if (n > left(c) / 8)
    return fail(c, at, "key '%s': array of %llu strings cannot fit in the %zu bytes left", kv->key,
                (unsigned long long)n, left(c));
  kv->str_off = malloc(sizeof(size_t) * (n ? (size_t)n : 1));
  if (!kv->str_off) return -ENOMEM;
  for (uint64_t i = 0; i < n; i++) {
    size_t s = 0;
    uint64_t len = 0;
    kv->str_off[i] = c->off;
    if ((rc = take_str(c, &s, &len, what))) return rc;
  }
  return 0;
}

static int parse_kvs(struct ms_gguf *g, struct cur *c, uint64_t n) {
  if (n > left(c) / 12)  /* key length (8) + value type (4) at least */
    return fail(c, c->off, "metadata count %llu cannot fit in the %zu bytes left", (unsigned long long)n, left(c));
  g->kvs = calloc(n ? (size_t)n : 1, sizeof *g->kvs);
  if (!g->kvs) return -ENOMEM;
  for (uint64_t i = 0; i < n; i++) {
    struct gguf_kv *kv = &g->kvs[i];
    size_t at = c->off, s = 0;
    uint64_t len = 0;
    uint32_t t = 0;
    char what[GGUF_MAX_NAME + 96];  /* the index, and the key before it: a count larger than the section shows here */
    snprintf(what, sizeof what, "metadata key %llu of %llu%s%.*s%s", (unsigned long long)i, (unsigned long long)n,
             i ? " (after '" : "", GGUF_MAX_NAME, i ? g->kvs[i - 1].key : "", i ? "')" : "");
    int rc = take_str(c, &s, &len, what);
    if (rc) return rc;
    if (!len || memchr(c->p + s, 0, (size_t)len)) return fail(c, at, "%s: empty or holds a NUL", what);
    if (!(kv->key = strndup((const char *)c->p + s, (size_t)len))) return -ENOMEM;
    g->n_kv = (int)i + 1;
    for (uint64_t j = 0; j < i; j++)
      if (!strcmp(g->kvs[j].key, kv->key)) return fail(c, at, "key '%s' appears twice", kv->key);
    if ((rc = take_u32(c, &t, "value type"))) return fail(c, c->off, "key '%s': its value type is cut off", kv->key);
    if (t >= MS_GGUF_VTYPE_COUNT) return fail(c, c->off - 4, "key '%s': value type %u unknown", kv->key, t);
    kv->type = (enum ms_gguf_vtype)t;
    if ((rc = parse_value(c, kv))) return rc;
  }
  return 0;
}

/* ---- tensor infos ---- */

static int parse_tensor(struct ms_gguf *g, struct cur *c, int i, char *name_out) {
  struct ms_gguf_tensor *t = &g->tensors[i];
  size_t at = c->off, s = 0;
  uint64_t len = 0, off = 0;
  uint32_t nd = 0, type = 0;
  int rc = take_str(c, &s, &len, "tensor name");
  if (rc) return rc;
  if (!len || len >= GGUF_MAX_NAME || memchr(c->p + s, 0, (size_t)len))
    return fail(c, at, "tensor %d: name of %llu bytes (1 to %d, no NUL)", i, (unsigned long long)len,
                GGUF_MAX_NAME - 1);
  memcpy(name_out, c->p + s, (size_t)len);
  name_out[len] = '\0';
  t->name = name_out;
  if ((rc = take_u32(c, &nd, t->name))) return rc;
  if (nd < 1 || nd > 4) return fail(c, c->off - 4, "tensor '%s': %u dimensions (1 to 4)", t->name, nd);
  t->n_dims = (int)nd;
  uint64_t elems = 1;
  for (int d = 0; d < 4; d++) t->ne[d] = 1;
  for (uint32_t d = 0; d < nd; d++) {
    uint64_t ne = 0;
    if ((rc = take_u64(c, &ne, t->name))) return rc;
    if (ne == 0 || ne > (uint64_t)INT64_MAX / elems)
      return fail(c, c->off - 8, "tensor '%s': dimension %u is %llu (zero or overflowing)", t->name, d,
                  (unsigned long long)ne);
    t->ne[d] = (int64_t)ne;
    elems *= ne;
  }
  if ((rc = take_u32(c, &type, t->name)) || (rc = take_u64(c, &off, t->name))) return rc;
  int ti = type_index(type);
  if (ti < 0)
    return fail(c, c->off - 12,
                "tensor '%s': type %u unknown (no ggml type has that number; supported: " MS_GGUF_SUPPORTED_TYPES ")",
                t->name, type);
  if (t->ne[0] % ggml_types[ti].blck)
    return fail(c, c->off - 12, "tensor '%s': %s rows of %lld elements are not whole blocks of %d", t->name,
                ggml_types[ti].name, (long long)t->ne[0], ggml_types[ti].blck);
  t->type = type;
  t->offset = off;
  uint64_t blocks = elems / (uint64_t)ggml_types[ti].blck;
  if (blocks > SIZE_MAX / (uint64_t)ggml_types[ti].size)
    return fail(c, at, "tensor '%s': %llu elements are too many", t->name, (unsigned long long)elems);
  t->bytes = (size_t)blocks * (size_t)ggml_types[ti].size;
  return 0;
}

static int by_name_cmp(const void *a, const void *b) {
  return strcmp((*(const struct ms_gguf_tensor *const *)a)->name, (*(const struct ms_gguf_tensor *const *)b)->name);
}

static int by_off_cmp(const void *a, const void *b) {
  const struct ms_gguf_tensor *x = *(const struct ms_gguf_tensor *const *)a, *y = *(const struct ms_gguf_tensor *const *)b;
  return x->offset < y->offset ? -1 : x->offset > y->offset;
}

/* A tensor info that fails to parse and is named like a metadata key is one:
 * the header's metadata count is smaller than the key-value section, and that
 * is said instead of what the key's bytes mean as dimensions. 0 if not so. */
static int misread_key(const struct ms_gguf *g, struct cur *c, size_t at, const struct ms_gguf_tensor *t, int i) {
  static const char *const prefixes[] = {"general.", "tokenizer."};
  for (size_t k = 0; t->name && k < sizeof prefixes / sizeof prefixes[0]; k++)
    if (!strncmp(t->name, prefixes[k], strlen(prefixes[k])))
      return fail(c, at, "tensor %d: '%s' is a metadata key, so the header's metadata count (%d) is smaller "
                  "than the key-values the file holds", i, t->name, g->n_kv);
  return 0;
}

static int parse_tensors(struct ms_gguf *g, struct cur *c, uint64_t n) {
  if (n > left(c) / 24)  /* name length, n_dims, one dim, type, offset at least */
    return fail(c, c->off, "tensor count %llu cannot fit in the %zu bytes left", (unsigned long long)n, left(c));
  g->tensors = calloc(n ? (size_t)n : 1, sizeof *g->tensors);
  g->names = malloc((n ? (size_t)n : 1) * GGUF_MAX_NAME);
  g->by_name = malloc((n ? (size_t)n : 1) * sizeof *g->by_name);
  if (!g->tensors || !g->names || !g->by_name) return -ENOMEM;
  for (uint64_t i = 0; i < n; i++) {
    size_t at = c->off;
    struct ms_textbuf *log = c->log;
    c->log = NULL;  /* quiet first: a misread key is reported as one */
    int rc = parse_tensor(g, c, (int)i, g->names + i * GGUF_MAX_NAME);
    c->log = log;
    if (rc == -MS_E_FORMAT && !(rc = misread_key(g, c, at, &g->tensors[i], (int)i))) {
      c->off = at;  /* not a key: parse it again to say what is wrong with it */
      rc = parse_tensor(g, c, (int)i, g->names + i * GGUF_MAX_NAME);
    }
    if (rc) return rc;
    g->by_name[i] = &g->tensors[i];
    g->n_tensors = (int)i + 1;
  }
  return 0;
}

/* ---- layout ---- */

static int parse_alignment(struct ms_gguf *g, struct cur *c) {
  g->alignment = GGUF_DEFAULT_ALIGNMENT;
  int k = ms_gguf_find_kv(g, "general.alignment");
  if (k < 0) return 0;
  if (g->kvs[k].type != MS_GGUF_U32)
    return fail(c, g->kvs[k].off, "key 'general.alignment': type %d, expected u32", g->kvs[k].type);
  uint32_t a;
  memcpy(&a, g->base + g->kvs[k].off, 4);
  if (!a || (a & (a - 1))) return fail(c, g->kvs[k].off, "key 'general.alignment': %u is not a power of two", a);
  g->alignment = a;
  return 0;
}

/* Data ranges: aligned, inside the file, not overlapping; names unique. */
static int check_layout(struct ms_gguf *g, struct cur *c) {
  size_t a = g->alignment;
  size_t data = (c->off + a - 1) / a * a;
  if (data > g->size && g->n_tensors)
    return fail(c, c->off, "the data section (at %zu after alignment %zu) starts past the end of the file", data, a);
  g->data_off = data;
  size_t room = g->size > data ? g->size - data : 0;
  for (int i = 0; i < g->n_tensors; i++) {
    struct ms_gguf_tensor *t = &g->tensors[i];
    if (t->offset % a) return fail(c, data, "tensor '%s': data offset %llu is not a multiple of the alignment %zu", t->name, (unsigned long long)t->offset, a);
    if (t->offset > room || t->bytes > room - t->offset)
      return fail(c, data, "tensor '%s': data [%llu, +%zu) runs past the end of the file (data section of %zu bytes)",
                  t->name, (unsigned long long)t->offset, t->bytes, room);
    t->data = g->base + data + t->offset;
  }
  const struct ms_gguf_tensor **order = malloc(sizeof *order * (g->n_tensors ? (size_t)g->n_tensors : 1));
  if (!order) return -ENOMEM;
  memcpy(order, g->by_name, sizeof *order * (size_t)g->n_tensors);
  qsort(order, (size_t)g->n_tensors, sizeof *order, by_off_cmp);
  int rc = 0;
  for (int i = 1; i < g->n_tensors && !rc; i++)
    if (order[i - 1]->offset + order[i - 1]->bytes > order[i]->offset)
      rc = fail(c, data + order[i]->offset, "tensor '%s' overlaps tensor '%s'", order[i]->name, order[i - 1]->name);
  free(order);
  if (rc) return rc;
  qsort(g->by_name, (size_t)g->n_tensors, sizeof *g->by_name, by_name_cmp);
  for (int i = 1; i < g->n_tensors; i++)
    if (!strcmp(g->by_name[i]->name, g->by_name[i - 1]->name))
      return fail(c, data, "tensor '%s' appears twice", g->by_name[i]->name);
  return 0;
}

static int parse(struct ms_gguf *g, struct ms_textbuf *log) {
  struct cur c = {g->base, g->size, 0, log};
  uint32_t magic = 0, version = 0;
  uint64_t n_tensors = 0, n_kv = 0;
  int rc;
  if ((rc = take_u32(&c, &magic, "magic"))) return rc;
  if (memcmp(&magic, "GGUF", 4)) return fail(&c, 0, "magic: not a GGUF file (the first bytes are not 'GGUF')");
  if ((rc = take_u32(&c, &version, "version"))) return rc;
  if (version >= 0x01000000u) return fail(&c, 4, "version: 0x%08x looks big-endian; only little-endian files are supported", version);
  if (version != 2 && version != 3) return fail(&c, 4, "version: %u is not supported (2 or 3)", version);
  g->version = version;
  if ((rc = take_u64(&c, &n_tensors, "tensor count")) || (rc = take_u64(&c, &n_kv, "metadata count"))) return rc;
  if ((rc = parse_kvs(g, &c, n_kv))) return rc;
  if ((rc = parse_tensors(g, &c, n_tensors))) return rc;
  if ((rc = parse_alignment(g, &c))) return rc;
  return check_layout(g, &c);
}

/* ---- object ---- */

struct ms_gguf *ms_gguf_open_mem(const void *data, size_t size, struct ms_textbuf *log) {
  struct ms_gguf *g = calloc(1, sizeof *g);
  if (!g) return NULL;
  atomic_init(&g->refs, 1);
  g->base = data;
  g->size = size;
  int rc = parse(g, log);
  if (rc) {
    ms_gguf_free(g);
    errno = -rc;
    return NULL;
  }
  return g;
}

struct ms_gguf *ms_gguf_open(const char *path, struct ms_textbuf *log) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int e = errno;
    if (log) ms_textbuf_printf(log, "%s: %s\n", path, strerror(e));
    errno = e;
    return NULL;
  }
  struct stat st;
  void *p = MAP_FAILED;
  int e = 0;
  if (fstat(fd, &st)) e = errno;
  else if (st.st_size < 8) e = MS_E_FORMAT;
  else if ((p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0)) == MAP_FAILED) e = errno;
  close(fd);
  if (e) {
    if (log)
      ms_textbuf_printf(log, "%s: %s\n", path,
                        e == MS_E_FORMAT ? "too short for a GGUF header (8 bytes)" : strerror(e));
    errno = e;
    return NULL;
  }
  struct ms_gguf *g = ms_gguf_open_mem(p, (size_t)st.st_size, log);
  if (!g) {
    e = errno;
    munmap(p, (size_t)st.st_size);
    errno = e;
    return NULL;
  }
  g->mapped = 1;
  return g;
}

struct ms_gguf *ms_gguf_ref(struct ms_gguf *g) {
  if (g) atomic_fetch_add_explicit(&g->refs, 1, memory_order_relaxed);  /* the caller holds one already */
  return g;
}

void ms_gguf_free(struct ms_gguf *g) {
  if (!g) return;
  /* acq_rel: the last owner sees every other owner's reads finished before it unmaps */
  if (atomic_fetch_sub_explicit(&g->refs, 1, memory_order_acq_rel) != 1) return;
  for (int i = 0; i < g->n_kv; i++) {
    free(g->kvs[i].key);
    free(g->kvs[i].str_off);
  }
  free(g->kvs);
  free(g->tensors);
  free(g->names);
  free(g->by_name);
  if (g->mapped) munmap((void *)g->base, g->size);
  free(g);
}

uint32_t ms_gguf_version(const struct ms_gguf *g) { return g->version; }
size_t ms_gguf_alignment(const struct ms_gguf *g) { return g->alignment; }
size_t ms_gguf_data_offset(const struct ms_gguf *g) { return g->data_off; }
size_t ms_gguf_file_size(const struct ms_gguf *g) { return g->size; }

int ms_gguf_n_tensors(const struct ms_gguf *g) { return g->n_tensors; }

const struct ms_gguf_tensor *ms_gguf_tensor(const struct ms_gguf *g, int i) {
  return i >= 0 && i < g->n_tensors ? &g->tensors[i] : NULL;
}

const struct ms_gguf_tensor *ms_gguf_find_tensor(const struct ms_gguf *g, const char *name) {
  int lo = 0, hi = g->n_tensors - 1;
  while (lo <= hi) {
    int mid = (lo + hi) / 2, c = strcmp(g->by_name[mid]->name, name);
    if (!c) return g->by_name[mid];
    if (c < 0) lo = mid + 1;
    else hi = mid - 1;
  }
  return NULL;
}
