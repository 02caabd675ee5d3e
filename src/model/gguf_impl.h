/* SPDX-License-Identifier: MIT */
/* The GGUF reader's object, shared by its files (gguf.c parses, gguf_kv.c
 * answers metadata queries, gguf_model.c builds models). Private to src/model. */
#ifndef MS_MODEL_GGUF_IMPL_H
#define MS_MODEL_GGUF_IMPL_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "megascope/gguf.h"

#define GGUF_MAX_NAME 64         /* ggml's limit on tensor names, bytes */
#define GGUF_DEFAULT_ALIGNMENT 32

struct gguf_kv {
  char *key;
  enum ms_gguf_vtype type;
  size_t off;                    /* of the value (of the first element for arrays) */
  enum ms_gguf_vtype arr_type;
  uint64_t arr_n;
  size_t *str_off;               /* arrays of strings: [arr_n] offsets of each element */
};

struct ms_gguf {
  _Atomic int refs;              /* relaxed increments; acq_rel on the last decrement */
  const uint8_t *base;
  size_t size;
  int mapped;                    /* munmap on free */
  uint32_t version;
  size_t alignment, data_off;
  struct gguf_kv *kvs;
  int n_kv;
  struct ms_gguf_tensor *tensors;
  int n_tensors;
  const struct ms_gguf_tensor **by_name;  /* sorted by name */
  char *names;                   /* NUL-terminated tensor names */
};

#endif
