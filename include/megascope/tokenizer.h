/* SPDX-License-Identifier: MIT */
/* Text to token ids and back.
 *
 * The synthetic presets carry no vocabulary, so the only tokenizer for now is a
 * byte-level one: encoding maps each UTF-8 byte b of the text to token id b
 * (it needs a vocabulary of at least 256 ids), decoding maps ids below 256 back
 * to those bytes and renders any other id as "<|id|>". The interface is kept to
 * encode and decode so that real tokenizers (BPE, SentencePiece) can replace it
 * behind the same calls. Decoded text is raw bytes: it may hold NUL bytes and
 * invalid UTF-8, which a caller that needs text (JSON) must repair. */
#ifndef MEGASCOPE_TOKENIZER_H
#define MEGASCOPE_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct ms_tokenizer;

/* The byte-level tokenizer for a model of `vocab` ids; NULL + errno EINVAL when
 * vocab < 256 (the bytes would not all be ids). */
struct ms_tokenizer *ms_tokenizer_bytes_new(int vocab);
void ms_tokenizer_free(struct ms_tokenizer *t);
/* "bytes" */
const char *ms_tokenizer_name(const struct ms_tokenizer *t);

/* Encodes len bytes of text into at most max ids. Returns the number of ids the
 * whole text needs (> max: out holds the first max), or a negative errno. */
int ms_tokenizer_encode(const struct ms_tokenizer *t, const char *text, size_t len, int32_t *out, int max);
/* Decodes n ids into out (size bytes, always NUL-terminated when size > 0).
 * Returns the number of bytes the whole text needs, NUL excluded (snprintf's
 * contract), or a negative errno (-EINVAL for a negative id). */
long ms_tokenizer_decode(const struct ms_tokenizer *t, const int32_t *ids, int n, char *out, size_t size);

#ifdef __cplusplus
}
#endif
#endif
