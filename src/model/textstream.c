/* SPDX-License-Identifier: MIT */
/* Streamed text with stop strings (megascope/textstream.h).
 *
 * Two stages. The stop stage keeps `hold`, the bytes after the last one known
 * not to begin a stop: after each byte pushed it checks whether a stop ends
 * there (a match in hold, since every byte before hold began no stop), and
 * after each push it releases the bytes before the longest suffix of hold
 * that is a proper prefix of some stop. Released bytes go to the UTF-8 stage,
 * a decoder that keeps at most three bytes of a sequence still incomplete and
 * writes whole characters or U+FFFD into `out`, which take hands over. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "megascope/base.h"
#include "megascope/textstream.h"

struct bytes {
  char *p;
  size_t len, cap;
};

struct ms_textstream {
  char **stops;
  size_t *stop_len;
  int n_stops;
  size_t max_stop;     /* the longest stop's length */
  struct bytes hold;   /* the stop stage's held bytes */
  unsigned char seq[4]; /* the UTF-8 stage's incomplete sequence */
  int seq_len, seq_need; /* bytes in seq, bytes the sequence has in all */
  struct bytes out;    /* safe text not yet taken; NUL-terminated */
  size_t emitted;
  int stopped;         /* index of the stop that matched, -1 */
  int finished;
  int oom;
};

static int bytes_put(struct bytes *b, const void *s, size_t n) {
  if (b->len + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 64;
    while (cap < b->len + n + 1) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) return -ENOMEM;
    b->p = p;
    b->cap = cap;
  }
  memcpy(b->p + b->len, s, n);
  b->len += n;
  b->p[b->len] = '\0';
  return 0;
}

void ms_textstream_free(struct ms_textstream *ts) {
  if (!ts) return;
  for (int i = 0; i < ts->n_stops; i++) free(ts->stops ? ts->stops[i] : NULL);
  free(ts->stops);
  free(ts->stop_len);
  free(ts->hold.p);
  free(ts->out.p);
  free(ts);
}

struct ms_textstream *ms_textstream_new(const char *const *stops, int n) {
  if (n < 0 || (n > 0 && !stops)) {
    errno = EINVAL;
    return NULL;
  }
  for (int i = 0; i < n; i++) {
    if (!stops[i] || !stops[i][0]) {
      errno = EINVAL;
      return NULL;
    }
  }
  struct ms_textstream *ts = calloc(1, sizeof *ts);
  if (!ts) goto nomem;
  ts->stopped = -1;
  if (n) {
    ts->stops = calloc((size_t)n, sizeof *ts->stops);
    ts->stop_len = calloc((size_t)n, sizeof *ts->stop_len);
    if (!ts->stops || !ts->stop_len) goto nomem;
  }
  for (; ts->n_stops < n; ts->n_stops++) {
    int i = ts->n_stops;
    if (!(ts->stops[i] = strdup(stops[i]))) goto nomem;
    ts->stop_len[i] = strlen(stops[i]);
    if (ts->stop_len[i] > ts->max_stop) ts->max_stop = ts->stop_len[i];
  }
  if (bytes_put(&ts->out, "", 0)) goto nomem;  /* take's text is never NULL */
  return ts;
nomem:
  ms_textstream_free(ts);
  errno = ENOMEM;
  return NULL;
}

/* ---- the UTF-8 stage ---- */

static void emit(struct ms_textstream *ts, const void *s, size_t n) {
  if (bytes_put(&ts->out, s, n)) ts->oom = 1;
}

static void emit_fffd(struct ms_textstream *ts) { emit(ts, "\xef\xbf\xbd", 3); }

/* Whether c may be byte k (1..3) of the sequence that began with lead. */
static int continues(unsigned char lead, int k, unsigned char c) {
  if (k == 1) {
    if (lead == 0xe0) return c >= 0xa0 && c <= 0xbf;
    if (lead == 0xed) return c >= 0x80 && c <= 0x9f;
    if (lead == 0xf0) return c >= 0x90 && c <= 0xbf;
    if (lead == 0xf4) return c >= 0x80 && c <= 0x8f;
  }
  return (c & 0xc0) == 0x80;
}

static void decode_byte(struct ms_textstream *ts, unsigned char c) {
  if (ts->seq_len) {
    if (continues(ts->seq[0], ts->seq_len, c)) {
      ts->seq[ts->seq_len++] = c;
      if (ts->seq_len == ts->seq_need) {
        emit(ts, ts->seq, (size_t)ts->seq_len);
        ts->seq_len = 0;
      }
      return;
    }
    emit_fffd(ts);  /* the maximal subpart so far; c starts afresh */
    ts->seq_len = 0;
  }
  int need = c < 0x80 ? 1 : c >= 0xc2 && c <= 0xdf ? 2 : c >= 0xe0 && c <= 0xef ? 3 : c >= 0xf0 && c <= 0xf4 ? 4 : 0;
  if (need == 1) {
    emit(ts, &c, 1);
  } else if (!need) {
    emit_fffd(ts);
  } else {
    ts->seq[0] = c;
    ts->seq_len = 1;
    ts->seq_need = need;
  }
}

/* Passes n bytes to the UTF-8 stage, runs of ASCII at once. */
static void release(struct ms_textstream *ts, const char *s, size_t n) {
  size_t i = 0;
  while (i < n) {
    size_t j = i;
    if (!ts->seq_len)
      while (j < n && (unsigned char)s[j] < 0x80) j++;
    if (j > i) {
      emit(ts, s + i, j - i);
      i = j;
    } else {
      decode_byte(ts, (unsigned char)s[i++]);
    }
  }
}

static void decode_end(struct ms_textstream *ts) {
  if (ts->seq_len) emit_fffd(ts);
  ts->seq_len = 0;
}

/* ---- the stop stage ---- */

/* The start of the longest stop that ends at hold[end], or -1. */
static long stop_ending_at(const struct ms_textstream *ts, size_t end, int *which) {
  long best = -1;
  for (int i = 0; i < ts->n_stops; i++) {
    size_t l = ts->stop_len[i];
    if (l > end + 1 || ts->hold.p[end] != ts->stops[i][l - 1]) continue;
    size_t start = end + 1 - l;
    if (!memcmp(ts->hold.p + start, ts->stops[i], l) && (best < 0 || (long)start < best)) {
      best = (long)start;
      *which = i;
    }
  }
  return best;
}

/* The start of the longest suffix of hold that some stop begins with. */
static size_t held_from(const struct ms_textstream *ts) {
  size_t len = ts->hold.len;
  size_t h = len + 1 > ts->max_stop ? len + 1 - ts->max_stop : 0;
  for (; h < len; h++) {
    for (int i = 0; i < ts->n_stops; i++) {
      if (len - h < ts->stop_len[i] && !memcmp(ts->hold.p + h, ts->stops[i], len - h)) return h;
    }
  }
  return len;
}

int ms_textstream_push(struct ms_textstream *ts, const char *bytes, size_t n) {
  if (ts->stopped >= 0) return 1;
  if (ts->finished) return -MS_E_STATE;
  if (!ts->n_stops) {
    release(ts, bytes, n);
    return ts->oom ? -ENOMEM : 0;
  }
  size_t old = ts->hold.len;
  if (bytes_put(&ts->hold, bytes, n)) return -ENOMEM;
  for (size_t e = old; e < ts->hold.len; e++) {
    int which = -1;
    long start = stop_ending_at(ts, e, &which);
    if (start >= 0) {
      release(ts, ts->hold.p, (size_t)start);
      decode_end(ts);
      ts->hold.len = 0;
      ts->stopped = which;
      return ts->oom ? -ENOMEM : 1;
    }
  }
  size_t h = held_from(ts);
  release(ts, ts->hold.p, h);
  memmove(ts->hold.p, ts->hold.p + h, ts->hold.len - h);
  ts->hold.len -= h;
  return ts->oom ? -ENOMEM : 0;
}

void ms_textstream_finish(struct ms_textstream *ts) {
  if (ts->finished) return;
  ts->finished = 1;
  if (ts->stopped < 0) release(ts, ts->hold.p, ts->hold.len);
  ts->hold.len = 0;
  decode_end(ts);
}

const char *ms_textstream_take(struct ms_textstream *ts, size_t *n) {
  if (!ts->out.len) ts->out.p[0] = '\0';  /* the last take's text is over */
  *n = ts->out.len;
  ts->emitted += ts->out.len;
  ts->out.len = 0;  /* the bytes stay, NUL-terminated, until the next write */
  return ts->out.p;
}

size_t ms_textstream_emitted(const struct ms_textstream *ts) { return ts->emitted; }

int ms_textstream_stopped(const struct ms_textstream *ts) { return ts->stopped; }
