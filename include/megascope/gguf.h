/* SPDX-License-Identifier: MIT */
/* GGUF files: reading, the models in them, and writing.
 *
 * A GGUF file (version 2 or 3, little-endian) is a header, metadata key/value
 * pairs, tensor infos and an aligned data section. ms_gguf_open maps the file
 * read-only and checks all of it before returning: every length, count and
 * offset against the file's size, key and tensor names for duplicates, tensor
 * types against ggml's table, shapes against their type's block, data ranges
 * for alignment, bounds and overlap. A rejection says what, where (the byte
 * offset) and which key or tensor. Tensor data is never copied: a model built
 * from the file points its weights into the mapping, and the kernels read the
 * quantized blocks in place.
 *
 * The object is reference-counted so that a model can keep the mapping alive
 * after its opener is done with it: ms_gguf_free drops one reference. */
#ifndef MEGASCOPE_GGUF_H
#define MEGASCOPE_GGUF_H

#include <stddef.h>
#include <stdint.h>

#include "megascope/base.h"
#include "megascope/model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Metadata value types, as numbered in the file. */
enum ms_gguf_vtype {
  MS_GGUF_U8 = 0,
  MS_GGUF_I8 = 1,
  MS_GGUF_U16 = 2,
  MS_GGUF_I16 = 3,
  MS_GGUF_U32 = 4,
  MS_GGUF_I32 = 5,
  MS_GGUF_F32 = 6,
  MS_GGUF_BOOL = 7,
  MS_GGUF_STR = 8,
  MS_GGUF_ARR = 9,
  MS_GGUF_U64 = 10,
  MS_GGUF_I64 = 11,
  MS_GGUF_F64 = 12,
  MS_GGUF_VTYPE_COUNT
};

/* ggml tensor type ids of the types megascope computes with. */
enum {
  MS_GGML_F32 = 0,
  MS_GGML_F16 = 1,
  MS_GGML_Q4_0 = 2,
  MS_GGML_Q4_1 = 3,
  MS_GGML_Q5_0 = 6,
  MS_GGML_Q5_1 = 7,
  MS_GGML_Q8_0 = 8,
  MS_GGML_Q2_K = 10,
  MS_GGML_Q3_K = 11,
  MS_GGML_Q4_K = 12,
  MS_GGML_Q5_K = 13,
  MS_GGML_Q6_K = 14,
  MS_GGML_Q8_K = 15,
  MS_GGML_IQ4_NL = 20,
  MS_GGML_BF16 = 30,
};

/* One tensor, read-only view into the mapping. */
struct ms_gguf_tensor {
  const char *name;
  int n_dims;
  int64_t ne[4];       /* ggml order: ne[0] is the contiguous dimension (a row) */
  uint32_t type;       /* ggml type id */
  uint64_t offset;     /* from the start of the data section */
  size_t bytes;
  const void *data;
};

struct ms_gguf;

/* NULL + errno (ENOENT.., or MS_E_FORMAT for a malformed file, with the reason in log). */
struct ms_gguf *ms_gguf_open(const char *path, struct ms_textbuf *log);
/* Parses `size` bytes at `data`, which must outlive the object (tests, fuzzing). */
struct ms_gguf *ms_gguf_open_mem(const void *data, size_t size, struct ms_textbuf *log);
struct ms_gguf *ms_gguf_ref(struct ms_gguf *g);
void ms_gguf_free(struct ms_gguf *g);

uint32_t ms_gguf_version(const struct ms_gguf *g);
size_t ms_gguf_alignment(const struct ms_gguf *g);
size_t ms_gguf_data_offset(const struct ms_gguf *g);
size_t ms_gguf_file_size(const struct ms_gguf *g);

/* Metadata. Getters return 0, -ENOENT when the key is absent, or -MS_E_FORMAT
 * when its value has another type (integers convert to each other when the
 * value fits, floats from f32/f64). Strings are not NUL-terminated. */
int ms_gguf_n_kv(const struct ms_gguf *g);
const char *ms_gguf_kv_key(const struct ms_gguf *g, int i);
enum ms_gguf_vtype ms_gguf_kv_type(const struct ms_gguf *g, int i);
int ms_gguf_find_kv(const struct ms_gguf *g, const char *key);  /* index or -ENOENT */
int ms_gguf_get_int(const struct ms_gguf *g, const char *key, int64_t *out);
int ms_gguf_get_float(const struct ms_gguf *g, const char *key, double *out);
int ms_gguf_get_bool(const struct ms_gguf *g, const char *key, int *out);
int ms_gguf_get_str(const struct ms_gguf *g, const char *key, const char **s, size_t *len);
/* Arrays: the element type and count, then elements by index. */
int ms_gguf_get_arr(const struct ms_gguf *g, const char *key, enum ms_gguf_vtype *elem, uint64_t *n);
int ms_gguf_arr_int(const struct ms_gguf *g, const char *key, uint64_t i, int64_t *out);
int ms_gguf_arr_float(const struct ms_gguf *g, const char *key, uint64_t i, double *out);
int ms_gguf_arr_str(const struct ms_gguf *g, const char *key, uint64_t i, const char **s, size_t *len);
/* Prints one value as text ("576", "'llama'", "[49152 x str]") into buf. */
void ms_gguf_kv_format(const struct ms_gguf *g, int i, char *buf, size_t size);

int ms_gguf_n_tensors(const struct ms_gguf *g);
const struct ms_gguf_tensor *ms_gguf_tensor(const struct ms_gguf *g, int i);
const struct ms_gguf_tensor *ms_gguf_find_tensor(const struct ms_gguf *g, const char *name);

/* ggml's name of a tensor type ("q4_1"), "?" when unknown. */
const char *ms_gguf_type_name(uint32_t ggml_type);
/* The ms_dtype of a ggml type: 0, or -MS_E_UNSUPP for a type megascope does not compute with. */
#define MS_GGUF_SUPPORTED_TYPES "f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl, q2_K, q3_K, q4_K, q5_K, q6_K, q8_K"

int ms_gguf_type_dtype(uint32_t ggml_type, enum ms_dtype *out);
uint32_t ms_gguf_dtype_type(enum ms_dtype t);

/* A model of architecture `llama`, `qwen2`, `qwen3` or `gemma3` from the file: configuration from
 * the metadata, weights pointing into the mapping (the model takes a reference
 * on g). NULL + errno with the reason, naming the key or tensor, in log. */
struct ms_model *ms_gguf_model_new(struct ms_gguf *g, struct ms_textbuf *log);

/* Flags of ms_gguf_load_flags. */
enum ms_gguf_load_flag {
  /* No packed form at load (ms_model_repack): the caller packs what it reads
   * itself (ms_model_repack_rows, a rank of tensor parallelism across
   * processes), so that the whole model is never packed first. */
  MS_GGUF_LOAD_UNPACKED = 1,
};

struct ms_tokenizer;
/* Opens path and builds its model and (when tok is not NULL) its tokenizer;
 * the model keeps the file mapped until ms_model_free. 0 or a negative errno. */
int ms_gguf_load(const char *path, struct ms_model **model, struct ms_tokenizer **tok, struct ms_textbuf *log);
/* ms_gguf_load with flags (enum ms_gguf_load_flag, or'ed). */
int ms_gguf_load_flags(const char *path, unsigned flags, struct ms_model **model, struct ms_tokenizer **tok,
                       struct ms_textbuf *log);

/* ---- writing ---- */

struct ms_gguf_writer;

struct ms_gguf_writer *ms_gguf_writer_new(void);
void ms_gguf_writer_free(struct ms_gguf_writer *w);
/* Data alignment (a power of two, default 32); written as general.alignment when not 32. */
int ms_gguf_writer_set_alignment(struct ms_gguf_writer *w, uint32_t alignment);
int ms_gguf_writer_add_u32(struct ms_gguf_writer *w, const char *key, uint32_t v);
int ms_gguf_writer_add_i32(struct ms_gguf_writer *w, const char *key, int32_t v);
int ms_gguf_writer_add_f32(struct ms_gguf_writer *w, const char *key, float v);
int ms_gguf_writer_add_bool(struct ms_gguf_writer *w, const char *key, int v);
int ms_gguf_writer_add_str(struct ms_gguf_writer *w, const char *key, const char *v);
int ms_gguf_writer_add_arr_str(struct ms_gguf_writer *w, const char *key, const char *const *v, size_t n);
int ms_gguf_writer_add_arr_i32(struct ms_gguf_writer *w, const char *key, const int32_t *v, size_t n);
int ms_gguf_writer_add_arr_f32(struct ms_gguf_writer *w, const char *key, const float *v, size_t n);
/* A tensor of ggml type `type` and shape ne[0..n_dims) (ggml order); `data`
 * (bytes long, which must match the shape) is copied. */
int ms_gguf_writer_add_tensor(struct ms_gguf_writer *w, const char *name, uint32_t type, int n_dims,
                              const int64_t *ne, const void *data, size_t bytes);
int ms_gguf_writer_write(const struct ms_gguf_writer *w, const char *path, struct ms_textbuf *log);

/* Writes a model (a synthetic one: dense llama, qwen2, qwen3 or gemma3 blocks)
 * as GGUF with its matrices quantized to `type` (norms and biases stay f32) and the byte-level
 * vocabulary as a gpt2 tokenizer without merges: token b is byte b, ids from
 * 256 up are control tokens "<|id|>". 0 or a negative errno. */
int ms_gguf_write_model(const struct ms_model *m, enum ms_dtype type, const char *path,
                        struct ms_textbuf *log);

#ifdef __cplusplus
}
#endif
#endif
