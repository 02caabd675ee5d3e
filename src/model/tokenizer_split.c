/* SPDX-License-Identifier: MIT */
/* BPE pre-tokenizers, written by hand after the regular expressions in
 * tokenizer_impl.h, with the same decisions llama.cpp's hand-written matchers
 * (unicode.cpp) make: each matcher walks code points left to right and, at each
 * position, tries the alternatives of its expression in order; the pieces of
 * one split (SMOLLM's digits) bound the matches of the next. */
#include <errno.h>
#include <stdlib.h>

#include "model/tokenizer_impl.h"

#define OUT_OF_RANGE 0xffffffffu

struct text {
  const uint32_t *cp;   /* [n] code points */
  const size_t *off;    /* [n + 1] byte offset of each code point, then the length */
  size_t ini, end;      /* the piece being split, in code points */
  size_t prev;          /* end of the last emitted piece */
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
  if (end > t->prev && !t->rc) t->rc = t->piece(t->user, t->off[t->prev], t->off[end]);
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

/* Decodes one UTF-8 sequence at s (n bytes left); invalid bytes come back one
 * at a time as U+FFFD (a symbol), keeping their place in the text. */
static uint32_t utf8_next(const unsigned char *s, size_t n, size_t *used) {
  unsigned char c = s[0];
  int k = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
  *used = 1;
  if (k == 1) return c;
  if (!k || (size_t)k > n) return 0xfffd;
  uint32_t cp = c & (0x7f >> k);
  for (int i = 1; i < k; i++) {
    if ((s[i] & 0xc0) != 0x80) return 0xfffd;
    cp = cp << 6 | (s[i] & 0x3f);
  }
  static const uint32_t min[5] = {0, 0, 0x80, 0x800, 0x10000};
  if (cp < min[k] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0xfffd;
  *used = (size_t)k;
  return cp;
}

static void run(struct text *t, enum ms_pretok kind) {
  if (kind == MS_PRETOK_GPT2 || kind == MS_PRETOK_SMOLLM) split_gpt2(t);
  else split_llama3(t, kind == MS_PRETOK_LLAMA3 ? 3 : 1);
}

int ms_pretok_split(enum ms_pretok kind, const char *text, size_t len,
                    int (*piece)(void *user, size_t start, size_t end), void *user) {
  if ((unsigned)kind >= MS_PRETOK_COUNT || (!text && len)) return -EINVAL;
  uint32_t *cp = malloc(sizeof *cp * (len + 1));
  size_t *off = malloc(sizeof *off * (len + 1)), n = 0;
  if (!cp || !off) {
    free(cp);
    free(off);
    return -ENOMEM;
  }
  for (size_t i = 0, used; i < len; i += used, n++) {
    off[n] = i;
    cp[n] = utf8_next((const unsigned char *)text + i, len - i, &used);
  }
  off[n] = len;
  struct text t = {.cp = cp, .off = off, .piece = piece, .user = user};
  if (kind != MS_PRETOK_SMOLLM) {
    t.ini = t.prev = 0, t.end = n;
    run(&t, kind);
  } else {
    /* \p{N}: every number its own piece; the runs between are split by GPT2 */
    for (size_t i = 0; i < n && !t.rc;) {
      size_t j = i + 1;
      if (!ms_uni_is_number(cp[i]))
        while (j < n && !ms_uni_is_number(cp[j])) j++;
      t.ini = t.prev = i, t.end = j;
      run(&t, kind);
      i = j;
    }
  }
  free(cp);
  free(off);
  return t.rc;
}
