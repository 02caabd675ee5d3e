/* SPDX-License-Identifier: MIT */
/* BPE pre-tokenizers, written by hand after the regular expressions in
 * tokenizer_impl.h, with the same decisions llama.cpp's hand-written matchers
 * (unicode.cpp) make: each matcher walks code points left to right and, at each
 * position, tries the alternatives of its expression in order; the pieces of
 * one stage (SMOLLM's digits) bound the matches of the next. The text is read
 * as llama.cpp reads it (ms_utf8_decode). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "model/tokenizer_impl.h"

#define OUT_OF_RANGE 0xffffffffu

struct text {
  const uint32_t *cp;   /* [n] code points */
  const size_t *off;    /* [n + 1] byte offset of each code point, then the length */
  size_t ini, end;      /* the piece being split, in code points */
  size_t prev;          /* end of the last emitted piece */
  size_t *cuts, n_cuts; /* the pieces found: their ends */
  int (*piece)(void *user, size_t start, size_t end);
  void *user;
  int rc;
};

enum { F_LETTER = 1, F_NUMBER = 2, F_SPACE = 4, F_IN = 8 };

static uint32_t get(const struct text *t, size_t i) { return i >= t->ini && i < t->end ? t->cp[i] : OUT_OF_RANGE; }

static int flags(const struct text *t, size_t i) {
  uint32_t c = get(t, i);
  if (c == OUT_OF_RANGE) return 0;
  return F_IN | (ms_uni_is_letter(c) ? F_LETTER : 0) | (ms_uni_is_number(c) ? F_NUMBER : 0) |
         (ms_uni_is_space(c) ? F_SPACE : 0);
}

static void add(struct text *t, size_t end) {
  if (end > t->prev) t->cuts[t->n_cuts++] = end;
  t->prev = end;
}

/* 's 't 're 've 'm 'll 'd (ASCII case folded when `fold`): the match's length, or 0. */
static int contraction(const struct text *t, size_t pos, int fold) {
  if (get(t, pos) != '\'' || pos + 1 >= t->end) return 0;
  uint32_t a = get(t, pos + 1), b = pos + 2 < t->end ? get(t, pos + 2) : 0;
  if (fold) {
    a = a < 0x80 && a >= 'A' && a <= 'Z' ? a + 32 : a;
    b = b < 0x80 && b >= 'A' && b <= 'Z' ? b + 32 : b;
  }
  if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
  if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
  return 0;
}

/* \s+(?!\S) then \s+ ; returns 1 when it emitted. */
static int spaces(struct text *t, size_t *pos) {
  size_t n = 0;
  while (flags(t, *pos + n) & F_SPACE) n++;
  if (n > 1 && get(t, *pos + n) != OUT_OF_RANGE) {
    *pos += n - 1;  /* leave the last space to prefix the next word */
  } else if (n > 0) {
    *pos += n;
  } else {
    return 0;
  }
  add(t, *pos);
  return 1;
}

static void split_gpt2(struct text *t) {
  for (size_t pos = t->ini; pos < t->end && !t->rc;) {
    uint32_t c = get(t, pos);
    int k = contraction(t, pos, 0);
    if (k) {
      add(t, pos += (size_t)k);
      continue;
    }
    int f2 = c == ' ' ? flags(t, pos + 1) : flags(t, pos);
    int cls = f2 & F_LETTER ? F_LETTER : f2 & F_NUMBER ? F_NUMBER : 0;
    if (cls) {  /* ' ?\p{L}+' or ' ?\p{N}+' */
      pos += c == ' ';
      while (flags(t, pos) & cls) pos++;
      add(t, pos);
      continue;
    }
    if (!(f2 & (F_SPACE | F_LETTER | F_NUMBER)) && (f2 & F_IN)) {  /* ' ?[^\s\p{L}\p{N}]+' */
      pos += c == ' ';
      for (int f = flags(t, pos); !(f & (F_SPACE | F_LETTER | F_NUMBER)) && (f & F_IN); f = flags(t, ++pos)) {}
      add(t, pos);
      continue;
    }
    if (!spaces(t, &pos)) add(t, ++pos);
  }
}

static void split_llama3(struct text *t, int max_digits) {
  for (size_t pos = t->ini; pos < t->end && !t->rc;) {
    uint32_t c = get(t, pos);
    int f = flags(t, pos), k = contraction(t, pos, 1);
    if (k) {
      add(t, pos += (size_t)k);
      continue;
    }
    /* [^\r\n\p{L}\p{N}]?\p{L}+ */
    if (c != '\r' && c != '\n' && !(f & F_NUMBER) && ((f & F_LETTER) || (flags(t, pos + 1) & F_LETTER))) {
      pos++;
      while (flags(t, pos) & F_LETTER) pos++;
      add(t, pos);
      continue;
    }
    if (f & F_NUMBER) {  /* \p{N}{1,max} */
      size_t ini = pos;
      while (flags(t, pos) & F_NUMBER)
        if (++pos - ini >= (size_t)max_digits) add(t, ini = pos);
      add(t, pos);
      continue;
    }
    int f2 = c == ' ' ? flags(t, pos + 1) : f;
    if (!(f2 & (F_SPACE | F_LETTER | F_NUMBER)) && (f & F_IN)) {  /* ' ?[^\s\p{L}\p{N}]+[\r\n]*' */
      pos += c == ' ';
      while (!(f2 & (F_SPACE | F_LETTER | F_NUMBER)) && (f2 & F_IN)) f2 = flags(t, ++pos);
      for (uint32_t c2 = get(t, pos); c2 == '\r' || c2 == '\n'; c2 = get(t, ++pos)) {}
      add(t, pos);
      continue;
    }
    size_t n = 0, last_nl = 0;  /* \s*[\r\n]+ */
    for (; flags(t, pos + n) & F_SPACE; n++)
      if (get(t, pos + n) == '\r' || get(t, pos + n) == '\n') last_nl = pos + n + 1;
    if (last_nl) {
      add(t, pos = last_nl);
      continue;
    }
    if (!spaces(t, &pos)) add(t, ++pos);
  }
}

uint32_t ms_utf8_decode(const unsigned char *s, size_t n, size_t *used) {
  unsigned char c = s[0];
  int k = c < 0x80 ? 1 : (c & 0xe0) == 0xc0 ? 2 : (c & 0xf0) == 0xe0 ? 3 : (c & 0xf8) == 0xf0 ? 4 : 0;
  *used = 1;
  if (k == 1) return c;
  if (!k || (size_t)k > n) return 0xfffd;
  uint32_t cp = c & (0x7f >> k);
  for (int i = 1; i < k; i++) {
    if ((s[i] & 0xc0) != 0x80) return 0xfffd;
    cp = cp << 6 | (s[i] & 0x3f);
  }
  if (cp > 0x10ffff) return 0xfffd;
  *used = (size_t)k;
  return cp;
}

size_t ms_utf8_encode(char *out, uint32_t cp) {
  if (cp < 0x80) return out[0] = (char)cp, 1;
  if (cp < 0x800) return out[0] = (char)(0xc0 | cp >> 6), out[1] = (char)(0x80 | (cp & 0x3f)), 2;
  if (cp < 0x10000) {
    out[0] = (char)(0xe0 | cp >> 12), out[1] = (char)(0x80 | ((cp >> 6) & 0x3f)), out[2] = (char)(0x80 | (cp & 0x3f));
    return 3;
  }
  out[0] = (char)(0xf0 | cp >> 18), out[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
  out[2] = (char)(0x80 | ((cp >> 6) & 0x3f)), out[3] = (char)(0x80 | (cp & 0x3f));
  return 4;
}

int ms_utf8_repair(const char *text, size_t len, char **out, size_t *out_len) {
  const unsigned char *s = (const unsigned char *)text;
  size_t need = 0, used;
  int same = 1;
  char tmp[4];
  for (size_t i = 0; i < len; i += used) {
    size_t k = ms_utf8_encode(tmp, ms_utf8_decode(s + i, len - i, &used));
    if (k != used || memcmp(tmp, s + i, k)) same = 0;
    need += k;
  }
  *out = NULL;
  *out_len = len;
  if (same) return 0;
  if (!(*out = malloc(need ? need : 1))) return -ENOMEM;
  for (size_t i = 0, at = 0; i < len; i += used) at += ms_utf8_encode(*out + at, ms_utf8_decode(s + i, len - i, &used));
  *out_len = need;
  return 0;
}

/* ---- stages that are one expression ---- */

static int is_p_default(uint32_t c) { return ms_uni_is_punct(c) || (c < 0x80 && c && strchr("$+<=>^~|", (int)c)); }
static int is_p_falcon(uint32_t c) { return ms_uni_is_punct(c) || (c < 0x80 && c && strchr("$+<=>^~|`", (int)c)); }
static int is_ascii_digit(uint32_t c) { return c >= '0' && c <= '9'; }

/* Matches of `class` runs (chunk 0: each maximal run; chunk k: runs of exactly
 * k, leftmost first) become pieces; the text between them stays whole. */
static void split_class(struct text *t, int (*class)(uint32_t), size_t chunk) {
  for (size_t pos = t->ini; pos < t->end && !t->rc;) {
    size_t n = 0;
    while (pos + n < t->end && class(t->cp[pos + n]) && (!chunk || n < chunk)) n++;
    if (!n || (chunk && n < chunk)) {
      pos += n ? n : 1;
      continue;
    }
    add(t, pos);
    add(t, pos += n);
  }
  add(t, t->end);
}

/* ---- the driver ---- */

enum stage { ST_GPT2, ST_LLAMA3, ST_QWEN2, ST_NUMBER_EACH, ST_NUMBER_RUN, ST_DIGIT3, ST_P_DEFAULT, ST_P_FALCON };

static const struct {
  int n;
  enum stage st[4];
} pipelines[MS_PRETOK_COUNT] = {
    [MS_PRETOK_GPT2] = {1, {ST_GPT2}},
    [MS_PRETOK_SMOLLM] = {2, {ST_NUMBER_EACH, ST_GPT2}},
    [MS_PRETOK_LLAMA3] = {1, {ST_LLAMA3}},
    [MS_PRETOK_QWEN2] = {1, {ST_QWEN2}},
    [MS_PRETOK_DEFAULT] = {4, {ST_P_DEFAULT, ST_GPT2, ST_NUMBER_RUN, ST_DIGIT3}},
    [MS_PRETOK_FALCON] = {3, {ST_P_FALCON, ST_GPT2, ST_DIGIT3}},
};

static void run_stage(struct text *t, enum stage st) {
  switch (st) {
  case ST_GPT2: split_gpt2(t); break;
  case ST_LLAMA3: split_llama3(t, 3); break;
  case ST_QWEN2: split_llama3(t, 1); break;
  case ST_NUMBER_EACH: split_class(t, ms_uni_is_number, 1); break;
  case ST_NUMBER_RUN: split_class(t, ms_uni_is_number, 0); break;
  case ST_DIGIT3: split_class(t, is_ascii_digit, 3); break;
  case ST_P_DEFAULT: split_class(t, is_p_default, 0); break;
  case ST_P_FALCON: split_class(t, is_p_falcon, 0); break;
  }
  add(t, t->end);  /* a matcher that stopped short leaves the rest as one piece */
}

int ms_pretok_split(enum ms_pretok kind, const char *text, size_t len,
                    int (*piece)(void *user, size_t start, size_t end), void *user) {
  if ((unsigned)kind >= MS_PRETOK_COUNT || (!text && len)) return -EINVAL;
  uint32_t *cp = malloc(sizeof *cp * (len + 1));
  size_t *off = malloc(sizeof *off * (len + 1)), n = 0;
  size_t *cuts[2] = {malloc(sizeof(size_t) * (len + 1)), malloc(sizeof(size_t) * (len + 1))};
  struct text t = {.cp = cp, .off = off, .piece = piece, .user = user};
  if (!cp || !off || !cuts[0] || !cuts[1]) {
    t.rc = -ENOMEM;
    goto out;
  }
  for (size_t i = 0, used; i < len; i += used, n++) {
    off[n] = i;
    cp[n] = ms_utf8_decode((const unsigned char *)text + i, len - i, &used);
  }
  off[n] = len;
  /* the pieces of one stage (their ends, in code points) bound the next's */
  size_t n_in = 0;
  if (n) cuts[0][n_in++] = n;
  for (int s = 0; s < pipelines[kind].n && !t.rc; s++) {
    t.cuts = cuts[(s + 1) & 1];
    t.n_cuts = 0;
    for (size_t i = 0, ini = 0; i < n_in; ini = cuts[s & 1][i++]) {
      t.ini = t.prev = ini, t.end = cuts[s & 1][i];
      run_stage(&t, pipelines[kind].st[s]);
    }
    n_in = t.n_cuts;
  }
  size_t *last = cuts[pipelines[kind].n & 1];
  for (size_t i = 0, ini = 0; i < n_in && !t.rc; ini = last[i++]) t.rc = piece(user, off[ini], off[last[i]]);
out:
  free(cp);
  free(off);
  free(cuts[0]);
  free(cuts[1]);
  return t.rc;
}
