/* SPDX-License-Identifier: MIT */
/* The byte-level tokenizer (see megascope/tokenizer.h): byte b <-> token id b,
 * ids from 256 up rendered as "<|id|>". Synthetic models use it; GGUF files bring their own
 * vocabulary (tokenizer_bpe.c), to which this file forwards. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "megascope/tokenizer.h"
#include "model/tokenizer_impl.h"  /* the handle; a file's BPE hangs off it */

struct ms_tokenizer *ms_tokenizer_bytes_new(int vocab) {
  if (vocab < 256) {
    errno = EINVAL;
    return NULL;
  }
  struct ms_tokenizer *t = calloc(1, sizeof *t);
  if (!t) return NULL;
  t->vocab = vocab;
  return t;
}

void ms_tokenizer_free(struct ms_tokenizer *t) {
  if (t) ms_bpe_free(t->bpe);
  free(t);
}

const char *ms_tokenizer_name(const struct ms_tokenizer *t) { return t->bpe ? ms_bpe_name(t->bpe) : "bytes"; }

int ms_tokenizer_encode(const struct ms_tokenizer *t, const char *text, size_t len, int32_t *out, int max) {
  if (!t || (!text && len) || max < 0) return -EINVAL;
  if (len > (size_t)INT32_MAX) return -E2BIG;
  if (t->bpe) return ms_bpe_encode(t->bpe, text, len, out, max);
  for (size_t i = 0; i < len && i < (size_t)max; i++) out[i] = (int32_t)(unsigned char)text[i];
  return (int)len;
}

long ms_tokenizer_decode(const struct ms_tokenizer *t, const int32_t *ids, int n, char *out, size_t size) {
  if (!t || n < 0 || (n && !ids) || (size && !out)) return -EINVAL;
  if (t->bpe) return ms_bpe_decode(t->bpe, ids, n, out, size);
  size_t len = 0;
  for (int i = 0; i < n; i++) {
    char piece[16];
    size_t k;
    if (ids[i] < 0) return -EINVAL;
    if (ids[i] < 256) {
      piece[0] = (char)ids[i];
      k = 1;
    } else {
      k = (size_t)snprintf(piece, sizeof piece, "<|%d|>", (int)ids[i]);
    }
    for (size_t c = 0; c < k; c++, len++)
      if (len + 1 < size) out[len] = piece[c];
  }
  if (size) out[len < size ? len : size - 1] = '\0';
  return (long)len;
}
