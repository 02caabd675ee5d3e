/* SPDX-License-Identifier: MIT */
/* Generated text, streamed: bytes in as tokens decode, whole UTF-8 out, stop
 * strings cut.
 *
 * A generation's decoded bytes are pushed as they come (a token may end in
 * the middle of a character or of a stop string). What take returns is always
 * valid UTF-8: an invalid sequence becomes U+FFFD as Python's
 * bytes.decode('utf-8', 'replace') makes it (one per maximal invalid
 * subpart), an incomplete sequence at the end is held until its next bytes
 * come. Stop strings are matched on the bytes, across pushes: the text stops
 * at the first point where one stop has been completed (if several complete
 * there, the longest counts), and nothing from its first byte on is ever
 * returned. Bytes are held back only while they could still be the start of a
 * stop. The output is therefore the same however the bytes were split into
 * pushes: that of the whole text cut before its earliest-ending stop, then
 * repaired. */
#ifndef MEGASCOPE_TEXTSTREAM_H
#define MEGASCOPE_TEXTSTREAM_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

struct ms_textstream;

/* n stop strings (NUL-terminated, copied; n may be 0 and stops then NULL).
 * NULL + errno EINVAL for n < 0, a NULL or empty stop; ENOMEM. */
struct ms_textstream *ms_textstream_new(const char *const *stops, int n);
void ms_textstream_free(struct ms_textstream *ts);

/* Adds n bytes. 1 once a stop has matched (then and on every later push,
 * whose bytes are ignored), 0 otherwise, -ENOMEM, or -MS_E_STATE after
 * ms_textstream_finish without a stop. */
int ms_textstream_push(struct ms_textstream *ts, const char *bytes, size_t n);
/* The end of the generation: held bytes are released (a stop prefix can no
 * longer complete), an incomplete trailing sequence becomes U+FFFD. */
void ms_textstream_finish(struct ms_textstream *ts);

/* The text that became safe since the last take, *n bytes (0 possible),
 * NUL-terminated; valid until the next call on ts. Never NULL. */
const char *ms_textstream_take(struct ms_textstream *ts, size_t *n);
/* Bytes returned by take so far: the offset in the whole output of what the
 * next take returns (OpenAI's logprobs text_offset). */
size_t ms_textstream_emitted(const struct ms_textstream *ts);
/* The index of the stop that matched, or -1. */
int ms_textstream_stopped(const struct ms_textstream *ts);

#ifdef __cplusplus
}
#endif
#endif
