/* SPDX-License-Identifier: MIT */
/* Inside the tokenizer object (see megascope/tokenizer.h). One handle type for
 * every tokenizer: the byte-level one (bytes_tokenizer.c) has no vocabulary; a
 * tokenizer read from a model file carries a byte-level BPE (tokenizer_bpe.c)
 * and the public calls forward to it. Private to src/model. */
#ifndef MS_MODEL_TOKENIZER_IMPL_H
#define MS_MODEL_TOKENIZER_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "megascope/tokenizer.h"

struct ms_bpe;

struct ms_tokenizer {
  int vocab;
  struct ms_bpe *bpe;  /* a vocabulary from a model file; NULL: the byte-level tokenizer */
};

int ms_bpe_encode(const struct ms_bpe *b, const char *text, size_t len, int32_t *out, int max);
long ms_bpe_decode(const struct ms_bpe *b, const int32_t *ids, int n, char *out, size_t size);
const char *ms_bpe_name(const struct ms_bpe *b);
void ms_bpe_free(struct ms_bpe *b);

/* Unicode classes the pre-tokenizers use (tokenizer_unicode.c). */
int ms_uni_is_letter(uint32_t cp);
int ms_uni_is_number(uint32_t cp);
int ms_uni_is_space(uint32_t cp);

/* Pre-tokenizers, by the regular expressions llama.cpp gives each family:
 *   GPT2:   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 *   SMOLLM: first \p{N} (every digit its own piece), then GPT2 inside each piece
 *   LLAMA3: (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
 *           ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
 *   QWEN2:  LLAMA3 with \p{N} in place of \p{N}{1,3} */
enum ms_pretok {
  MS_PRETOK_GPT2 = 0,
  MS_PRETOK_SMOLLM = 1,
  MS_PRETOK_LLAMA3 = 2,
  MS_PRETOK_QWEN2 = 3,
  MS_PRETOK_COUNT
};

/* Splits len bytes of UTF-8 text into pieces; calls piece(user, start, end) with
 * byte offsets, in order, covering the text. Invalid UTF-8 bytes stay whole
 * bytes (classed as symbols), so every byte of the input lands in a piece. */
int ms_pretok_split(enum ms_pretok kind, const char *text, size_t len,
                    int (*piece)(void *user, size_t start, size_t end), void *user);

#endif
