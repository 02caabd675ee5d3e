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
int ms_uni_is_punct(uint32_t cp);

/* One code point from s (n > 0 bytes left) as llama.cpp's unicode.cpp reads
 * it: the length comes from the lead byte and the continuation bytes are
 * checked, nothing more (an overlong form reads as its value, a surrogate as
 * itself). A byte that starts no such sequence reads as U+FFFD and counts one
 * byte; so does a sequence above U+10FFFF (llama.cpp raises an error there). */
uint32_t ms_utf8_decode(const unsigned char *s, size_t n, size_t *used);
size_t ms_utf8_encode(char *out, uint32_t cp);  /* 1 to 4 bytes, surrogates too */
/* The text as llama.cpp's BPE pre-tokenizers see it: each code point read by
 * ms_utf8_decode and written back, so an invalid byte becomes U+FFFD (3 bytes)
 * and an overlong form its shortest spelling. A malloc'd copy in *out (NULL and
 * *out_len == len when the text is already written so); 0 or -ENOMEM. */
int ms_utf8_repair(const char *text, size_t len, char **out, size_t *out_len);

/* Pre-tokenizers, by the regular expressions llama.cpp gives each family:
 *   GPT2:   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 *   SMOLLM: first \p{N} (every digit its own piece), then GPT2 inside each piece
 *   LLAMA3: (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
 *           ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
 *   QWEN2:  LLAMA3 with \p{N} in place of \p{N}{1,3}
 *   DEFAULT (llama.cpp's for "default" and for a file without a pre-tokenizer):
 *           [\p{P}\$\+<=>\^~\|]+ , then GPT2, then \p{N}+ , then [0-9][0-9][0-9]
 *   FALCON: [\p{P}\$\+<=>\^~\|`]+ , then GPT2, then [0-9][0-9][0-9]
 * A "then" stage splits each piece of the one before; a stage that is one
 * expression (not GPT2) makes its matches pieces and leaves the text between
 * them as pieces, as llama.cpp's std::regex path does. */
enum ms_pretok {
  MS_PRETOK_GPT2 = 0,
  MS_PRETOK_SMOLLM = 1,
  MS_PRETOK_LLAMA3 = 2,
  MS_PRETOK_QWEN2 = 3,
  MS_PRETOK_DEFAULT = 4,
  MS_PRETOK_FALCON = 5,
  MS_PRETOK_COUNT
};

/* Splits len bytes of UTF-8 text into pieces; calls piece(user, start, end) with
 * byte offsets, in order, covering the text. Invalid UTF-8 bytes stay whole
 * bytes (classed as symbols), so every byte of the input lands in a piece. */
int ms_pretok_split(enum ms_pretok kind, const char *text, size_t len,
                    int (*piece)(void *user, size_t start, size_t end), void *user);

#endif
