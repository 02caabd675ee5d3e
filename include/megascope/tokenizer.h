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
/* "bytes", or "gpt2/<pre>" for a file's BPE */
const char *ms_tokenizer_name(const struct ms_tokenizer *t);

/* Encodes len bytes of text into at most max ids. Returns the number of ids the
 * whole text needs (> max: out holds the first max), or a negative errno. */
int ms_tokenizer_encode(const struct ms_tokenizer *t, const char *text, size_t len, int32_t *out, int max);
/* Decodes n ids into out (size bytes, always NUL-terminated when size > 0).
 * Returns the number of bytes the whole text needs, NUL excluded (snprintf's
 * contract), or a negative errno (-EINVAL for a negative id). */
long ms_tokenizer_decode(const struct ms_tokenizer *t, const int32_t *ids, int n, char *out, size_t size);

/* ---- vocabularies from model files (src/model/tokenizer_bpe.c) ----
 * A GGUF file's tokenizer behind the same encode/decode calls, as llama.cpp
 * reads it: tokenizer.ggml.model = gpt2 is GPT-2 byte-level BPE with the file's
 * merges and pre-tokenizer (llama.cpp's spellings: gpt-2, llama-bpe, qwen2,
 * smollm, falcon, default and their kin; name "gpt2/<pre>"; a file without one
 * splits as llama.cpp's 'default' and warns through the log sink); llama is
 * SentencePiece (scores, <0xXX> byte fallback, the U+2581 space prefix; name
 * "llama/spm"). Encoding keeps special tokens whole ("<|im_start|>" is one id)
 * and adds no BOS by itself; BPE reads invalid UTF-8 as U+FFFD, as llama.cpp
 * does (megascope's own "gpt2" spelling, the synthetic models' byte
 * vocabulary, keeps the bytes). Decoding renders control tokens as their text
 * and SentencePiece's U+2581 as a space. The file may hold no tensors. */
struct ms_gguf;
struct ms_textbuf;
/* NULL + errno, with the reason naming the key in log. */
struct ms_tokenizer *ms_tokenizer_gguf_new(const struct ms_gguf *g, struct ms_textbuf *log);
int ms_tokenizer_vocab(const struct ms_tokenizer *t);
/* The id of the token spelled exactly `text` ("<|im_end|>"), or -ENOENT. */
int ms_tokenizer_find(const struct ms_tokenizer *t, const char *text);
/* The id to put before an encoded prompt (tokenizer.ggml.add_bos_token), or -1. */
int ms_tokenizer_add_bos(const struct ms_tokenizer *t);
/* 1 when id is a control token (never produced from plain text but by its name). */
int ms_tokenizer_is_control(const struct ms_tokenizer *t, int32_t id);

#ifdef __cplusplus
}
#endif
#endif
