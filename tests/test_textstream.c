/* SPDX-License-Identifier: MIT */
/* Streamed text with stop strings: stops split across pushes byte by byte, a
 * stop that is a prefix of another, overlapping partial matches, characters
 * split across pushes, invalid bytes against Python's
 * bytes.decode('utf-8', 'replace'), finish releasing a held prefix, no stops,
 * bad arguments, the emitted count, and random texts cut at random points
 * against a whole-text reference (cut before the earliest-ending stop, then
 * repair). */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "megascope/base.h"
#include "megascope/textstream.h"
#include "test.h"

struct run {
  char text[8192];
  size_t len;
  int rc;        /* the last push's result */
  int takes_ok;  /* every take was valid UTF-8 and NUL-terminated */
};

static int valid_utf8(const unsigned char *s, size_t n) {
  for (size_t i = 0; i < n;) {
    unsigned c = s[i];
    size_t need = c < 0x80 ? 1 : c >= 0xc2 && c <= 0xdf ? 2 : c >= 0xe0 && c <= 0xef ? 3 : c >= 0xf0 && c <= 0xf4 ? 4 : 0;
    if (!need || i + need > n) return 0;
    unsigned lo = c == 0xe0 ? 0xa0 : c == 0xf0 ? 0x90 : 0x80, hi = c == 0xed ? 0x9f : c == 0xf4 ? 0x8f : 0xbf;
    for (size_t k = 1; k < need; k++) {
      if (s[i + k] < (k == 1 ? lo : 0x80) || s[i + k] > (k == 1 ? hi : 0xbf)) return 0;
    }
    i += need;
  }
  return 1;
}

static void take_into(struct ms_textstream *ts, struct run *r) {
  size_t n;
  size_t before = ms_textstream_emitted(ts);
  const char *s = ms_textstream_take(ts, &n);
  if (!s || s[n] != '\0' || !valid_utf8((const unsigned char *)s, n) ||
      ms_textstream_emitted(ts) != before + n || r->len + n >= sizeof r->text)
    r->takes_ok = 0;
  else {
    memcpy(r->text + r->len, s, n);
    r->len += n;
    r->text[r->len] = '\0';
  }
}

/* Pushes text in pieces of the given sizes (the rest in one when they run
 * out), taking after each push, then finishes. */
static struct run stream(const char *const *stops, int n_stops, const char *text, size_t len,
                         const size_t *cuts, int n_cuts) {
  struct run r = {.takes_ok = 1};
  struct ms_textstream *ts = ms_textstream_new(stops, n_stops);
  if (!ts) {
    r.rc = -errno;
    return r;
  }
  size_t at = 0;
  for (int i = 0; at < len; i++) {
    size_t k = i < n_cuts ? cuts[i] : len - at;
    if (k > len - at) k = len - at;
    r.rc = ms_textstream_push(ts, text + at, k);
    at += k;
    take_into(ts, &r);
  }
  ms_textstream_finish(ts);
  take_into(ts, &r);
  if (ms_textstream_emitted(ts) != r.len) r.takes_ok = 0;
  ms_textstream_free(ts);
  return r;
}

static struct run bytewise(const char *const *stops, int n, const char *text) {
  size_t ones[512];
  for (int i = 0; i < 512; i++) ones[i] = 1;
  return stream(stops, n, text, strlen(text), ones, 512);
}

static struct run whole(const char *const *stops, int n, const char *text, size_t len) {
  return stream(stops, n, text, len, NULL, 0);
}

/* ---- the reference: whole text, earliest-ending stop, then repair ---- */

static size_t ref_cut(const char *s, size_t len, const char *const *stops, int n) {
  for (size_t end = 1; end <= len; end++) {
    size_t best = (size_t)-1;
    for (int i = 0; i < n; i++) {
      size_t l = strlen(stops[i]);
      if (l <= end && !memcmp(s + end - l, stops[i], l) && end - l < best) best = end - l;
    }
    if (best != (size_t)-1) return best;
  }
  return len;
}

/* Unicode's "maximal subpart" replacement, by the table of well-formed
 * sequences (Unicode 15, table 3-7), for the whole text at once. */
static size_t ref_repair(const unsigned char *s, size_t n, char *out) {
  static const struct {
    unsigned char lead_lo, lead_hi, lo1, hi1, len;
  } forms[] = {
      {0xc2, 0xdf, 0x80, 0xbf, 2}, {0xe0, 0xe0, 0xa0, 0xbf, 3}, {0xe1, 0xec, 0x80, 0xbf, 3},
      {0xed, 0xed, 0x80, 0x9f, 3}, {0xee, 0xef, 0x80, 0xbf, 3}, {0xf0, 0xf0, 0x90, 0xbf, 4},
      {0xf1, 0xf3, 0x80, 0xbf, 4}, {0xf4, 0xf4, 0x80, 0x8f, 4},
  };
  size_t o = 0;
  for (size_t i = 0; i < n;) {
    if (s[i] < 0x80) {
      out[o++] = (char)s[i++];
      continue;
    }
    int f = -1;
    for (int k = 0; k < 8; k++)
      if (s[i] >= forms[k].lead_lo && s[i] <= forms[k].lead_hi) f = k;
    size_t good = 1;  /* bytes of the longest well-formed prefix */
    if (f >= 0) {
      while (good < forms[f].len && i + good < n) {
        unsigned char lo = good == 1 ? forms[f].lo1 : 0x80, hi = good == 1 ? forms[f].hi1 : 0xbf;
        if (s[i + good] < lo || s[i + good] > hi) break;
        good++;
      }
    }
    if (f >= 0 && good == forms[f].len) {
      memcpy(out + o, s + i, good);
      o += good;
    } else {
      memcpy(out + o, "\xef\xbf\xbd", 3);
      o += 3;
    }
    i += good;
  }
  return o;
}

/* ---- cases ---- */

static void test_python_vectors(void) {
  /* bytes.decode('utf-8', 'replace').encode() in Python 3.11 */
  static const struct {
    const char *in;
    size_t n;
    const char *want;
  } v[] = {
      {"\x61\x80\x62", 3, "\x61\xef\xbf\xbd\x62"},
      {"\xe6\x97", 2, "\xef\xbf\xbd"},
      {"\xe6\x97\x78", 3, "\xef\xbf\xbd\x78"},
      {"\xf0\x80\x80", 3, "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"},
      {"\xed\xa0\x80", 3, "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"},
      {"\xf4\x90\x80\x80", 4, "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"},
      {"\xc0\xaf", 2, "\xef\xbf\xbd\xef\xbf\xbd"},
      {"\xe0\x80\xaf", 3, "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"},
      {"\xf0\x9f\x98", 3, "\xef\xbf\xbd"},
      {"\xf0\x9f\x98\x80\xff", 5, "\xf0\x9f\x98\x80\xef\xbf\xbd"},
      {"\xe2\x82\xac\xe2\x82", 5, "\xe2\x82\xac\xef\xbf\xbd"},
      {"\xc3", 1, "\xef\xbf\xbd"},
  };
  for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
    size_t ones[8] = {1, 1, 1, 1, 1, 1, 1, 1};
    struct run a = whole(NULL, 0, v[i].in, v[i].n);
    struct run b = stream(NULL, 0, v[i].in, v[i].n, ones, 8);
    char ref[64];
    size_t rn = ref_repair((const unsigned char *)v[i].in, v[i].n, ref);
    CHECKF(a.takes_ok && !strcmp(a.text, v[i].want), "vector %zu whole", i);
    CHECKF(b.takes_ok && !strcmp(b.text, v[i].want), "vector %zu bytewise", i);
    CHECKF(rn == strlen(v[i].want) && !memcmp(ref, v[i].want, rn), "vector %zu reference", i);
  }
}

static void test_stops(void) {
  const char *s1[] = {"STOP"};
  struct run r = bytewise(s1, 1, "hello STOP world");
  CHECK(r.takes_ok && !strcmp(r.text, "hello ") && r.rc == 1);
  r = whole(s1, 1, "hello STOP world", 16);
  CHECK(!strcmp(r.text, "hello ") && r.rc == 1);
  /* a held prefix that turns out not to be one is released in order */
  r = bytewise(s1, 1, "STO STOP");
  CHECK(!strcmp(r.text, "STO "));
  /* overlapping partial matches */
  const char *s2[] = {"ab"};
  r = bytewise(s2, 1, "aab");
  CHECK(!strcmp(r.text, "a") && r.rc == 1);
  const char *s3[] = {"aab"};
  r = bytewise(s3, 1, "aaab");
  CHECK(!strcmp(r.text, "a"));
  const char *s4[] = {"abab"};
  r = bytewise(s4, 1, "abaabababx");
  CHECK(!strcmp(r.text, "aba"));
  /* a stop that is a prefix of another: the shorter ends first */
  const char *s5[] = {"abc", "ab"};
  r = bytewise(s5, 2, "xxabc");
  CHECK(!strcmp(r.text, "xx"));
  /* one stop ending inside another that began earlier: the first to end wins */
  const char *s6[] = {"abcd", "bc"};
  r = whole(s6, 2, "xabcd", 5);
  CHECK(!strcmp(r.text, "xa"));
  /* two ending at once: the longer one counts */
  const char *s7[] = {"c", "abc"};
  r = whole(s7, 2, "xabc", 4);
  CHECK(!strcmp(r.text, "x"));
  /* what is pushed after the stop is ignored */
  struct ms_textstream *ts = ms_textstream_new(s1, 1);
  CHECK(ms_textstream_push(ts, "aSTOPb", 6) == 1 && ms_textstream_stopped(ts) == 0);
  CHECK(ms_textstream_push(ts, "more", 4) == 1);
  size_t n;
  const char *t = ms_textstream_take(ts, &n);
  CHECK(n == 1 && !strcmp(t, "a"));
  ms_textstream_finish(ts);
  t = ms_textstream_take(ts, &n);
  CHECK(n == 0 && t && t[0] == '\0');
  ms_textstream_free(ts);
}

static void test_held_and_finish(void) {
  const char *s[] = {"</answer>"};
  struct ms_textstream *ts = ms_textstream_new(s, 1);
  size_t n;
  CHECK(ms_textstream_push(ts, "done </ans", 10) == 0);
  const char *t = ms_textstream_take(ts, &n);
  CHECK(n == 5 && !memcmp(t, "done ", 5));  /* "</ans" could still be the stop */
  CHECK(ms_textstream_emitted(ts) == 5);
  ms_textstream_finish(ts);  /* it never completed */
  t = ms_textstream_take(ts, &n);
  CHECK(n == 5 && !strcmp(t, "</ans"));
  CHECK(ms_textstream_emitted(ts) == 10 && ms_textstream_stopped(ts) == -1);
  CHECK(ms_textstream_push(ts, "x", 1) == -MS_E_STATE);
  ms_textstream_free(ts);

  /* an incomplete character at the end becomes U+FFFD at finish only */
  ts = ms_textstream_new(NULL, 0);
  CHECK(ms_textstream_push(ts, "a\xe6\x97", 3) == 0);
  t = ms_textstream_take(ts, &n);
  CHECK(n == 1 && t[0] == 'a');
  ms_textstream_finish(ts);
  t = ms_textstream_take(ts, &n);
  CHECK(n == 3 && !memcmp(t, "\xef\xbf\xbd", 3));
  ms_textstream_free(ts);

  /* an incomplete character cut by a stop is final too */
  const char *s2[] = {"X"};
  struct run r = whole(s2, 1, "\xe6\x97X\xa5", 4);
  CHECK(!strcmp(r.text, "\xef\xbf\xbd"));
}

static void test_utf8_split(void) {
  /* 日本 and an emoji, split at every byte, with a stop made of a character */
  const char *text = "\xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x98\x80!";
  struct run r = bytewise(NULL, 0, text);
  CHECK(r.takes_ok && !strcmp(r.text, text));
  const char *s[] = {"\xf0\x9f\x98\x80"};
  r = bytewise(s, 1, text);
  CHECK(r.takes_ok && !strcmp(r.text, "\xe6\x97\xa5\xe6\x9c\xac "));
  /* a take never returns half a character */
  struct ms_textstream *ts = ms_textstream_new(NULL, 0);
  size_t n;
  ms_textstream_push(ts, "\xe6\x97", 2);
  ms_textstream_take(ts, &n);
  CHECK(n == 0);
  ms_textstream_push(ts, "\xa5", 1);
  const char *t = ms_textstream_take(ts, &n);
  CHECK(n == 3 && !memcmp(t, "\xe6\x97\xa5", 3));
  ms_textstream_free(ts);
  /* NUL bytes are text */
  r = whole(NULL, 0, "a\0b", 3);
  CHECK(r.len == 3 && r.text[1] == '\0' && r.text[2] == 'b');
}

static void test_no_stops_and_args(void) {
  struct run r = bytewise(NULL, 0, "plain text, nothing held");
  CHECK(r.takes_ok && !strcmp(r.text, "plain text, nothing held"));
  struct ms_textstream *ts = ms_textstream_new(NULL, 0);
  size_t n;
  CHECK(ms_textstream_push(ts, "abc", 3) == 0);
  CHECK(!strcmp(ms_textstream_take(ts, &n), "abc") && n == 3);  /* nothing held without stops */
  ms_textstream_free(ts);
  const char *empty[] = {"ok", ""};
  errno = 0;
  CHECK(!ms_textstream_new(empty, 2) && errno == EINVAL);
  const char *null[] = {NULL};
  errno = 0;
  CHECK(!ms_textstream_new(null, 1) && errno == EINVAL);
  errno = 0;
  CHECK(!ms_textstream_new(NULL, 1) && errno == EINVAL);
  errno = 0;
  CHECK(!ms_textstream_new(NULL, -1) && errno == EINVAL);
  ms_textstream_free(NULL);
}

/* ---- random texts against the reference ---- */

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static unsigned rnd(unsigned n) {
  rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
  return (unsigned)(rng % n);
}

static void random_text(char *s, size_t n) {
  /* few letters so stops occur; multi-byte and invalid pieces among them */
  static const char *const pieces[] = {"a", "b", "c", "a", "b", " ", "\xc3\xa9", "\xe2\x82\xac",
                                       "\xf0\x9f\x98\x80", "\x80", "\xe2\x82", "\xff", "\xed\xa0\x80"};
  size_t o = 0;
  while (o < n) {
    const char *p = pieces[rnd(sizeof pieces / sizeof pieces[0])];
    size_t l = strlen(p);
    if (o + l > n) l = n - o;
    memcpy(s + o, p, l);
    o += l;
  }
}

static void test_random(void) {
  static const char *const pool[] = {"ab", "aab", "ba", "abc", "b\xc3\xa9", "\xe2\x82\xac" "a",
                                     "cab", "\x80", "abab", "c c"};
  int failed = 0;
  for (int iter = 0; iter < 3000; iter++) {
    const char *stops[4];
    int n_stops = (int)rnd(5);
    for (int i = 0; i < n_stops; i++) stops[i] = pool[rnd(sizeof pool / sizeof pool[0])];
    char text[160];
    size_t len = 1 + rnd(sizeof text);
    random_text(text, len);
    char want[600];
    size_t cut = ref_cut(text, len, stops, n_stops);
    size_t wn = ref_repair((const unsigned char *)text, cut, want);
    size_t cuts[160];
    int n_cuts = 0;
    for (size_t at = 0; at < len && n_cuts < 160; n_cuts++) {
      cuts[n_cuts] = rnd(4) ? 1 + rnd(3) : rnd(8);  /* empty pushes too */
      at += cuts[n_cuts];
    }
    struct run r = stream(stops, n_stops, text, len, cuts, n_cuts);
    int stopped = cut < len;
    if (!r.takes_ok || r.len != wn || memcmp(r.text, want, wn) || (stopped && r.rc != 1)) {
      if (failed++ < 5) fprintf(stderr, "random %d: %zu bytes in, %zu out, want %zu\n", iter, len, r.len, wn);
    }
  }
  CHECKF(failed == 0, "%d of 3000 random streams differ from the reference", failed);
}

int main(void) {
  test_python_vectors();
  test_stops();
  test_held_and_finish();
  test_utf8_split();
  test_no_stops_and_args();
  test_random();
  TEST_MAIN_END();
}
