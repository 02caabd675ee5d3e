/* SPDX-License-Identifier: MIT */
/* Tokenizers: the pre-tokenizers against the splits their regular expressions
 * give (the ASCII cases computed with Python's re from the same expressions;
 * the others by hand), byte-level BPE on a hand-made vocabulary (merge order,
 * ties, special tokens, bytes without a token), encode/decode round trips of
 * random bytes and text, the synthetic models' vocabulary against the
 * byte-level tokenizer, and rejections naming the key. With SmolLM2 in the
 * cache, its tokenizer against ids llama.cpp produced for the same strings. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "megascope/gguf.h"
#include "megascope/tokenizer.h"
#include "model/tokenizer_impl.h"
#include "test.h"

/* ---- pre-tokenizers ---- */

struct split {
  char out[512];
  size_t n;
  const char *text;
};

static int collect(void *user, size_t start, size_t end) {
  struct split *s = user;
  if (s->n) s->out[s->n++] = '|';
  memcpy(s->out + s->n, s->text + start, end - start);
  s->n += end - start;
  s->out[s->n] = '\0';
  return 0;
}

static const struct {
  enum ms_pretok kind;
  const char *text, *want;
} splits[] = {
    /* from Python's re with \p{L} -> [A-Za-z], \p{N} -> [0-9] (exact for ASCII) */
    {MS_PRETOK_GPT2, "Hello world", "Hello| world"},
    {MS_PRETOK_GPT2, "I'm here  now", "I|'m| here| | now"},
    {MS_PRETOK_GPT2, "abc123 def", "abc|123| def"},
    {MS_PRETOK_GPT2, "x!!! y", "x|!!!| y"},
    {MS_PRETOK_GPT2, "  \n\nfoo bar   ", "  \n|\n|foo| bar|   "},
    {MS_PRETOK_GPT2, "in 2024, we'LL see", "in| 2024|,| we|'|LL| see"},
    {MS_PRETOK_GPT2, "It's 3.14159 -- ok?\n", "It|'s| 3|.|14159| --| ok|?|\n"},
    {MS_PRETOK_GPT2, "a\tb  c\r\n\r\nd", "a|\t|b| | c|\r\n\r|\n|d"},
    {MS_PRETOK_GPT2, "(hello) [world]", "(|hello|)| [|world|]"},
    {MS_PRETOK_GPT2, "don't STOP'S 12345678", "don|'t| STOP|'|S| 12345678"},
    {MS_PRETOK_SMOLLM, "Hello world", "Hello| world"},
    {MS_PRETOK_SMOLLM, "I'm here  now", "I|'m| here| | now"},
    {MS_PRETOK_SMOLLM, "abc123 def", "abc|1|2|3| def"},
    {MS_PRETOK_SMOLLM, "x!!! y", "x|!!!| y"},
    {MS_PRETOK_SMOLLM, "  \n\nfoo bar   ", "  \n|\n|foo| bar|   "},
    {MS_PRETOK_SMOLLM, "in 2024, we'LL see", "in| |2|0|2|4|,| we|'|LL| see"},
    {MS_PRETOK_SMOLLM, "It's 3.14159 -- ok?\n", "It|'s| |3|.|1|4|1|5|9| --| ok|?|\n"},
    {MS_PRETOK_SMOLLM, "a\tb  c\r\n\r\nd", "a|\t|b| | c|\r\n\r|\n|d"},
    {MS_PRETOK_SMOLLM, "(hello) [world]", "(|hello|)| [|world|]"},
    {MS_PRETOK_SMOLLM, "don't STOP'S 12345678", "don|'t| STOP|'|S| |1|2|3|4|5|6|7|8"},
    {MS_PRETOK_LLAMA3, "Hello world", "Hello| world"},
    {MS_PRETOK_LLAMA3, "I'm here  now", "I|'m| here| | now"},
    {MS_PRETOK_LLAMA3, "abc123 def", "abc|123| def"},
    {MS_PRETOK_LLAMA3, "x!!! y", "x|!!!| y"},
    {MS_PRETOK_LLAMA3, "  \n\nfoo bar   ", "  \n\n|foo| bar|   "},
    {MS_PRETOK_LLAMA3, "in 2024, we'LL see", "in| |202|4|,| we|'LL| see"},
    {MS_PRETOK_LLAMA3, "It's 3.14159 -- ok?\n", "It|'s| |3|.|141|59| --| ok|?\n"},
    {MS_PRETOK_LLAMA3, "a\tb  c\r\n\r\nd", "a|\tb| | c|\r\n\r\n|d"},
    {MS_PRETOK_LLAMA3, "(hello) [world]", "(hello|)| [|world|]"},
    {MS_PRETOK_LLAMA3, "don't STOP'S 12345678", "don|'t| STOP|'S| |123|456|78"},
    {MS_PRETOK_QWEN2, "abc123 def", "abc|1|2|3| def"},
    {MS_PRETOK_QWEN2, "in 2024, we'LL see", "in| |2|0|2|4|,| we|'LL| see"},
    {MS_PRETOK_QWEN2, "a\tb  c\r\n\r\nd", "a|\tb| | c|\r\n\r\n|d"},
    /* beyond ASCII, by the Unicode categories */
    {MS_PRETOK_GPT2, "na\xc3\xafve caf\xc3\xa9", "na\xc3\xafve| caf\xc3\xa9"},
    {MS_PRETOK_GPT2, "\xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e \xe3\x83\x86\xe3\x82\xb9\xe3\x83\x88",
     "\xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e| \xe3\x83\x86\xe3\x82\xb9\xe3\x83\x88"},
    {MS_PRETOK_GPT2, "x\xd9\xa3\xd9\xa4y", "x|\xd9\xa3\xd9\xa4|y"},  /* Arabic-Indic digits are \p{N} */
    {MS_PRETOK_SMOLLM, "x\xd9\xa3\xd9\xa4y", "x|\xd9\xa3|\xd9\xa4|y"},
    {MS_PRETOK_GPT2, "\xe2\x82\xac" "100", "\xe2\x82\xac|100"},    /* the euro sign is a symbol */
    {MS_PRETOK_GPT2, "\xf0\x9f\x98\x80\xf0\x9f\x98\x80 ok", "\xf0\x9f\x98\x80\xf0\x9f\x98\x80| ok"},
    {MS_PRETOK_GPT2, "a\xc2\xa0\xc2\xa0" "b", "a|\xc2\xa0|\xc2\xa0|b"},  /* no-break spaces are \s, not ' ' */
    {MS_PRETOK_GPT2, "\xff\xfe abc", "\xff\xfe| abc"},  /* invalid bytes stay, as symbols */
    /* llama.cpp's default and falcon: stages of expressions (Python's re, the same
     * std::regex split semantics, \p{P} written out for ASCII) */
    {MS_PRETOK_DEFAULT, "Hello, world! 12345 x+y=z", "Hello|,| world|!| |123|45| x|+|y|=|z"},
    {MS_PRETOK_FALCON, "Hello, world! 12345 x+y=z", "Hello|,| world|!| |123|45| x|+|y|=|z"},
    {MS_PRETOK_DEFAULT, "a `b` ~c~ 1234567 $5.00", "a| `|b|`| |~|c|~| |123|456|7| |$|5|.|00"},
    {MS_PRETOK_FALCON, "a `b` ~c~ 1234567 $5.00", "a| |`|b|`| |~|c|~| |123|456|7| |$|5|.|00"},
    {MS_PRETOK_DEFAULT, "don't 'em  42\n\n x", "don|'|t| |'|em| | |42|\n\n| x"},
    {MS_PRETOK_FALCON, "don't 'em  42\n\n x", "don|'|t| |'|em| | 42|\n\n| x"},
    {MS_PRETOK_DEFAULT, "(a+b)*c >= d; e_f", "(|a|+|b|)*|c| |>=| d|;| e|_|f"},
    {MS_PRETOK_FALCON, "(a+b)*c >= d; e_f", "(|a|+|b|)*|c| |>=| d|;| e|_|f"},
    {MS_PRETOK_DEFAULT, "x\xc2\xbfy\xe3\x80\x82z", "x|\xc2\xbf|y|\xe3\x80\x82|z"},  /* inverted question mark, ideographic full stop: \p{P} */
    /* Unicode 16: CJK extension I (U+2EBF0) is a letter, Garay digits (U+10D40) numbers */
    {MS_PRETOK_GPT2, "a \xf0\xae\xaf\xb0\xf0\xae\xaf\xb1 b", "a| \xf0\xae\xaf\xb0\xf0\xae\xaf\xb1| b"},
    {MS_PRETOK_SMOLLM, "x\xf0\x90\xb5\x80\xf0\x90\xb5\x81", "x|\xf0\x90\xb5\x80|\xf0\x90\xb5\x81"},
};

static void test_splits(void) {
  for (size_t i = 0; i < sizeof splits / sizeof splits[0]; i++) {
    struct split s = {.text = splits[i].text};
    int rc = ms_pretok_split(splits[i].kind, s.text, strlen(s.text), collect, &s);
    CHECKF(rc == 0 && !strcmp(s.out, splits[i].want), "split %zu (kind %d): got '%s', want '%s'", i,
           splits[i].kind, s.out, splits[i].want);
  }
}

/* ---- a hand-made byte-level BPE ---- */

static char tmpdir[128];

/* GPT-2's spelling of byte b, as UTF-8. */
static void byte_str(int b, char *out) {
  int printable = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff), n = 0;
  for (int i = 0; i < b; i++)
    if (!((i >= 0x21 && i <= 0x7e) || (i >= 0xa1 && i <= 0xac) || (i >= 0xae && i <= 0xff))) n++;
  int cp = printable ? b : 256 + n;
  if (cp < 0x80) out[0] = (char)cp, out[1] = 0;
  else out[0] = (char)(0xc0 | cp >> 6), out[1] = (char)(0x80 | (cp & 0x3f)), out[2] = 0;
}

/* Extra tokens after the 256 bytes (ids 256..) and merges, in rank order. */
static const char *const extra[] = {"he", "ll", "hell", "hello", "\xc4\xa0w", "\xc4\xa0wo", "el",
                                    "<|im_start|>", "<|u|>", "<|u|>x", "\xc4\xa0\xc4\xa0"};
static const int extra_type[] = {1, 1, 1, 1, 1, 1, 1, 3, 4, 4, 1};
static const char *const merges[] = {"h e", "e l", "l l", "he ll", "hell o", "\xc4\xa0 w", "\xc4\xa0w o",
                                     "\xc4\xa0 \xc4\xa0", "x y"};
enum { T_HE = 256, T_LL, T_HELL, T_HELLO, T_GW, T_GWO, T_EL, T_IM, T_U, T_UX, T_GG, N_TOK };

static const char *write_vocab(const char *name, const char *model, const char *pre, int drop_byte, int add_bos) {
  static char path[256];
  static char bytes[256][4];
  const char *tok[N_TOK];
  int32_t type[N_TOK];
  for (int b = 0; b < 256; b++) {
    byte_str(b, bytes[b]);
    tok[b] = b == drop_byte ? "<unused>" : bytes[b];
    type[b] = b == drop_byte ? 5 : 1;
  }
  for (int i = 256; i < N_TOK; i++) tok[i] = extra[i - 256], type[i] = extra_type[i - 256];
  struct ms_gguf_writer *w = ms_gguf_writer_new();
  ms_gguf_writer_add_str(w, "tokenizer.ggml.model", model);
  if (pre) ms_gguf_writer_add_str(w, "tokenizer.ggml.pre", pre);
  ms_gguf_writer_add_arr_str(w, "tokenizer.ggml.tokens", tok, N_TOK);
  ms_gguf_writer_add_arr_i32(w, "tokenizer.ggml.token_type", type, N_TOK);
  ms_gguf_writer_add_arr_str(w, "tokenizer.ggml.merges", merges, sizeof merges / sizeof merges[0]);
  ms_gguf_writer_add_u32(w, "tokenizer.ggml.bos_token_id", T_IM);
  ms_gguf_writer_add_bool(w, "tokenizer.ggml.add_bos_token", add_bos);
  snprintf(path, sizeof path, "%s/%s", tmpdir, name);
  int rc = ms_gguf_writer_write(w, path, NULL);
  ms_gguf_writer_free(w);
  return rc ? NULL : path;
}

static struct ms_tokenizer *open_vocab(const char *path, char *log_buf, size_t n) {
  struct ms_textbuf log = {log_buf, n, 0, 0};
  struct ms_gguf *g = path ? ms_gguf_open(path, &log) : NULL;
  struct ms_tokenizer *t = g ? ms_tokenizer_gguf_new(g, &log) : NULL;
  ms_gguf_free(g);  /* the tokenizer copies what it needs */
  return t;
}

static int encode_is(struct ms_tokenizer *t, const char *text, const int32_t *want, int n) {
  int32_t ids[64];
  int k = ms_tokenizer_encode(t, text, strlen(text), ids, 64);
  if (k != n) {
    fprintf(stderr, "'%s': %d ids, want %d:", text, k, n);
    for (int i = 0; i < k && i < 64; i++) fprintf(stderr, " %d", ids[i]);
    fprintf(stderr, "\n");
    return 0;
  }
  for (int i = 0; i < n; i++)
    if (ids[i] != want[i]) {
      fprintf(stderr, "'%s': id %d is %d, want %d\n", text, i, ids[i], want[i]);
      return 0;
    }
  return 1;
}

#define ENC(t, text, ...)                                         \
  do {                                                            \
    const int32_t want_[] = {__VA_ARGS__};                        \
    CHECK(encode_is(t, text, want_, sizeof want_ / sizeof want_[0])); \
  } while (0)

/* Decoding gives back the text, or, for invalid UTF-8, the text as llama.cpp
 * reads it (U+FFFD for each invalid byte). */
static int round_trip(struct ms_tokenizer *t, const char *text, size_t n) {
  char *fixed;
  size_t fn;
  if (ms_utf8_repair(text, n, &fixed, &fn)) return 0;
  const char *want = fixed ? fixed : text;
  int32_t *ids = malloc(sizeof *ids * (fn + 1));
  char *back = malloc(fn + 1);
  int k = ms_tokenizer_encode(t, text, n, ids, (int)fn + 1);
  long m = k >= 0 ? ms_tokenizer_decode(t, ids, k, back, fn + 1) : -1;
  int ok = m == (long)fn && !memcmp(back, want, fn);
  free(ids);
  free(back);
  free(fixed);
  return ok;
}

static void test_bpe(void) {
  char buf[512] = "";
  struct ms_tokenizer *t = open_vocab(write_vocab("v.gguf", "gpt2", "smollm", -1, 1), buf, sizeof buf);
  CHECKF(t != NULL, "%s", buf);
  if (!t) return;
  CHECK(!strcmp(ms_tokenizer_name(t), "gpt2/smollm") && ms_tokenizer_vocab(t) == N_TOK);
  ENC(t, "hello", T_HELLO);
  ENC(t, "hello world", T_HELLO, T_GWO, 'r', 'l', 'd');
  ENC(t, "hell", T_HELL);
  ENC(t, "ell", T_EL, 'l');             /* "e l" ranks before "l l" */
  ENC(t, "lll", T_LL, 'l');             /* equal ranks: leftmost first */
  ENC(t, "llll", T_LL, T_LL);
  ENC(t, "<|im_start|>hello", T_IM, T_HELLO);
  ENC(t, "<|im_start", '<', '|', 'i', 'm', '_', 's', 't', 'a', 'r', 't');
  ENC(t, "a<|u|>xb", 'a', T_UX, 'b'); /* the longest special token wins */
  ENC(t, "<|u|>", T_U);
  ENC(t, "x  w", 'x', ' ', T_GW);     /* "  w": \s+(?!\S) leaves " w" to the word */
  ENC(t, "a   ", 'a', T_GG, ' ');
  ENC(t, "12", '1', '2');
  CHECK(ms_tokenizer_find(t, "<|im_start|>") == T_IM && ms_tokenizer_find(t, "hello") == T_HELLO);
  CHECK(ms_tokenizer_find(t, "nope") == -ENOENT);
  CHECK(ms_tokenizer_is_control(t, T_IM) && !ms_tokenizer_is_control(t, T_U) && !ms_tokenizer_is_control(t, 'a'));
  CHECK(ms_tokenizer_add_bos(t) == T_IM);
  int32_t ids[] = {T_IM, T_HELLO, T_GWO, 'r', 'l', 'd', 0xff, 0xc3};
  char out[64];
  long n = ms_tokenizer_decode(t, ids, 8, out, sizeof out);
  CHECKF(n == 25 && !memcmp(out, "<|im_start|>hello world\xff\xc3", 25), "decoded %ld '%s'", n, out);
  CHECK(ms_tokenizer_decode(t, (int32_t[]){N_TOK}, 1, out, sizeof out) == -EINVAL);
  CHECK(ms_tokenizer_decode(t, ids, 2, out, 5) == 17 && !strcmp(out, "<|im"));  /* snprintf's contract */
  /* round trips: random bytes, then text with every class */
  uint64_t r = 12345;
  char text[200];
  int bad = 0;
  for (int it = 0; it < 300; it++) {
    size_t len = (size_t)(it % 60);
    for (size_t i = 0; i < len; i++) {
      r ^= r << 13, r ^= r >> 7, r ^= r << 17;
      text[i] = it % 3 ? "hel o wrd<|>_im12\n\t'sx"[r % 23] : (char)(r & 0xff);
    }
    if (!round_trip(t, text, len)) bad++;
  }
  CHECKF(bad == 0, "%d round trips failed", bad);
  const char *utf8 = "Caf\xc3\xa9 \xe2\x82\xac" "12, \xf0\x9f\x98\x80 na\xc3\xafve\r\n\t<|im_start|>user\nhello";
  CHECK(round_trip(t, utf8, strlen(utf8)));
  ms_tokenizer_free(t);

  /* a byte the vocabulary cannot spell is dropped, as llama.cpp drops it */
  t = open_vocab(write_vocab("v2.gguf", "gpt2", "gpt2", 0x01, 0), buf, sizeof buf);
  CHECKF(t != NULL, "%s", buf);
  if (t) {
    ENC(t, "a\x01" "b", 'a', 'b');
    ENC(t, "a\xff", 'a', 0xff);  /* megascope's own "gpt2" keeps invalid bytes, as the byte-level tokenizer does */
    CHECK(ms_tokenizer_add_bos(t) == -1 && !strcmp(ms_tokenizer_name(t), "gpt2/gpt2"));
    ms_tokenizer_free(t);
  }
  /* rejections name the key */
  buf[0] = 0;
  CHECK(!open_vocab(write_vocab("v3.gguf", "bert", "smollm", -1, 0), buf, sizeof buf) &&
        strstr(buf, "key 'tokenizer.ggml.model': 'bert' is not supported (supported: gpt2, llama)"));
  buf[0] = 0;
  CHECK(!open_vocab(write_vocab("v4.gguf", "gpt2", "tekken", -1, 0), buf, sizeof buf) &&
        strstr(buf, "key 'tokenizer.ggml.pre': pre-tokenizer 'tekken' is not supported"));
  /* no token list, and one of the wrong type: each said as it is */
  for (int wrong = 0; wrong < 2; wrong++) {
    char path[600];
    struct ms_gguf_writer *w = ms_gguf_writer_new();
    ms_gguf_writer_add_str(w, "tokenizer.ggml.model", "gpt2");
    if (wrong) ms_gguf_writer_add_u32(w, "tokenizer.ggml.tokens", 7);
    snprintf(path, sizeof path, "%s/v5-%d.gguf", tmpdir, wrong);
    CHECK(ms_gguf_writer_write(w, path, NULL) == 0);
    ms_gguf_writer_free(w);
    buf[0] = 0;
    CHECKF(!open_vocab(path, buf, sizeof buf) &&
               strstr(buf, wrong ? "key 'tokenizer.ggml.tokens': not an array of strings"
                                 : "key 'tokenizer.ggml.tokens': missing"),
           "%s", buf);
  }
}

/* llama.cpp's conventions: its pre-tokenizer spellings, the warning for a file
 * without one, invalid UTF-8 read as U+FFFD, merges and pieces of any length. */
static char warned[1024];

static void capture(void *user, enum ms_log_level level, const char *msg) {
  (void)user;
  if (level == MS_LOG_WARN) snprintf(warned, sizeof warned, "%s", msg);
}

static void test_llamacpp_conventions(void) {
  char buf[2048] = "";
  static const char *const ok[][2] = {{"gpt-2", "gpt2/gpt-2"},       {"llama-bpe", "gpt2/llama-bpe"},
                                      {"qwen2", "gpt2/qwen2"},       {"smollm", "gpt2/smollm"},
                                      {"mpt", "gpt2/mpt"},           {"falcon", "gpt2/falcon"},
                                      {"default", "gpt2/default"},   {"starcoder", "gpt2/starcoder"}};
  for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
    struct ms_tokenizer *t = open_vocab(write_vocab("p.gguf", "gpt2", ok[i][0], -1, 0), buf, sizeof buf);
    CHECKF(t && !strcmp(ms_tokenizer_name(t), ok[i][1]), "pre '%s': %s", ok[i][0], t ? ms_tokenizer_name(t) : buf);
    ms_tokenizer_free(t);
  }
  /* refused by name, with the list of the supported ones */
  static const char *const refused[] = {"deepseek-llm", "deepseek-coder", "tekken", "chatglm-bpe", "bloom"};
  for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
    char want[80];
    buf[0] = 0;
    snprintf(want, sizeof want, "pre-tokenizer '%s' is not supported (supported: gpt-2, ", refused[i]);
    CHECKF(!open_vocab(write_vocab("p.gguf", "gpt2", refused[i], -1, 0), buf, sizeof buf) && strstr(buf, want) &&
               strstr(buf, "llama-bpe") && strstr(buf, "qwen2") && strstr(buf, "falcon"),
           "'%s': %s", refused[i], buf);
  }
  /* no pre-tokenizer: llama.cpp's default, with a warning through the log sink */
  warned[0] = 0;
  ms_log_set(capture, NULL, MS_LOG_WARN);
  struct ms_tokenizer *t = open_vocab(write_vocab("p.gguf", "gpt2", NULL, -1, 0), buf, sizeof buf);
  ms_log_set(NULL, NULL, MS_LOG_WARN);
  CHECKF(t && !strcmp(ms_tokenizer_name(t), "gpt2/default"), "%s", t ? ms_tokenizer_name(t) : buf);
  CHECKF(strstr(warned, "no key 'tokenizer.ggml.pre'") && strstr(warned, "'default'"), "warning: '%s'", warned);
  if (t) ENC(t, "hello, world", T_HELLO, ',', T_GWO, 'r', 'l', 'd');
  ms_tokenizer_free(t);

  /* invalid UTF-8 reads as U+FFFD (EF BF BD), overlong forms as their value */
  t = open_vocab(write_vocab("p.gguf", "gpt2", "gpt-2", -1, 0), buf, sizeof buf);
  if (t) {
    ENC(t, "a\xff" "b", 'a', 0xef, 0xbf, 0xbd, 'b');
    ENC(t, "\xe2\x82" "x", 0xef, 0xbf, 0xbd, 0xef, 0xbf, 0xbd, 'x');  /* a cut sequence: each byte */
    ENC(t, "\xc1\x81", 'A');
    ENC(t, "<|im_start|>\xff", T_IM, 0xef, 0xbf, 0xbd);  /* special tokens are found first, as bytes */
    ms_tokenizer_free(t);
  }

  /* merges and tokens of any length: a doubling chain up to 2,048 bytes */
  enum { CHAIN = 11 };
  const char *tok[256 + CHAIN], *mrg[CHAIN];
  char bytes[256][4], *chain[CHAIN + 1], *mbuf[CHAIN];
  for (int b = 0; b < 256; b++) byte_str(b, bytes[b]), tok[b] = bytes[b];
  for (int k = 0; k <= CHAIN; k++) {
    size_t n = (size_t)1 << k;
    chain[k] = malloc(n + 1);
    memset(chain[k], 'a', n);
    chain[k][n] = 0;
    if (k) tok[255 + k] = chain[k];
  }
  for (int k = 0; k < CHAIN; k++) {
    size_t n = (size_t)1 << k;
    mbuf[k] = malloc(2 * n + 2);
    snprintf(mbuf[k], 2 * n + 2, "%s %s", chain[k], chain[k]);
    mrg[k] = mbuf[k];
  }
  char path[256];
  snprintf(path, sizeof path, "%s/long.gguf", tmpdir);
  for (int pass = 0; pass < 2; pass++) {
    struct ms_gguf_writer *w = ms_gguf_writer_new();
    ms_gguf_writer_add_str(w, "tokenizer.ggml.model", "gpt2");
    ms_gguf_writer_add_str(w, "tokenizer.ggml.pre", pass ? "llama-bpe" : "gpt-2");
    ms_gguf_writer_add_arr_str(w, "tokenizer.ggml.tokens", tok, 256 + CHAIN);
    ms_gguf_writer_add_arr_str(w, "tokenizer.ggml.merges", mrg, pass ? CHAIN - 1 : CHAIN);
    CHECK(ms_gguf_writer_write(w, path, NULL) == 0);
    ms_gguf_writer_free(w);
    buf[0] = 0;
    t = open_vocab(path, buf, sizeof buf);
    CHECKF(t != NULL, "a 2,049-byte merge: %s", buf);
    int32_t id = -1;
    /* gpt-2: the chain of merges; llama-bpe without the last merge: the piece is a whole token */
    CHECK(t && ms_tokenizer_encode(t, chain[CHAIN], (size_t)1 << CHAIN, &id, 1) == 1 && id == 255 + CHAIN);
    ms_tokenizer_free(t);
  }
  for (int k = 0; k <= CHAIN; k++) free(chain[k]);
  for (int k = 0; k < CHAIN; k++) free(mbuf[k]);
}

/* ---- SentencePiece on a hand-made vocabulary ---- */

#define SP "\xe2\x96\x81" /* U+2581, SentencePiece's space */

static const struct {
  const char *text;
  float score;
} spm_pieces[] = {
    {SP, -10},    {"h", -10},       {"e", -10},     {"l", -10},       {"o", -10},      {"w", -10},
    {"r", -10},   {"d", -10},       {"a", -10},     {"b", -10},       {"c", -10},      {"i", -10},
    {"he", -1},   {"ll", -2},       {"hell", -3},   {"hello", -4},    {SP "hello", -5}, {SP "w", -6},
    {"or", -7},   {SP "wor", -8},   {"ab", -1},     {"bc", -0.5f},    {SP "a", -20},   {"hi", -3},
    {SP "world", -9}, {"ld", -7.5f},
};
enum { S_BYTE0 = 3, S_SP = 259, S_HELLO_ = 275, S_A_ = 281, S_BC = 280, S_HI = 282, S_WORLD_ = 283 };

static struct ms_tokenizer *spm_vocab(int space_prefix, char *buf, size_t size) {
  enum { N = 259 + sizeof spm_pieces / sizeof spm_pieces[0] };
  const char *tok[N];
  static char bytes[256][8];
  float score[N];
  int32_t type[N];
  tok[0] = "<unk>", tok[1] = "<s>", tok[2] = "</s>";
  type[0] = 2, type[1] = type[2] = 3;
  score[0] = score[1] = score[2] = 0;
  for (int b = 0; b < 256; b++) {
    snprintf(bytes[b], sizeof bytes[b], "<0x%02X>", b);
    tok[S_BYTE0 + b] = bytes[b], type[S_BYTE0 + b] = 6, score[S_BYTE0 + b] = 0;
  }
  for (size_t i = 0; i < sizeof spm_pieces / sizeof spm_pieces[0]; i++)
    tok[259 + i] = spm_pieces[i].text, type[259 + i] = 1, score[259 + i] = spm_pieces[i].score;
  char path[256];
  snprintf(path, sizeof path, "%s/spm.gguf", tmpdir);
  struct ms_gguf_writer *w = ms_gguf_writer_new();
  ms_gguf_writer_add_str(w, "tokenizer.ggml.model", "llama");
  ms_gguf_writer_add_arr_str(w, "tokenizer.ggml.tokens", tok, N);
  ms_gguf_writer_add_arr_f32(w, "tokenizer.ggml.scores", score, N);
  ms_gguf_writer_add_arr_i32(w, "tokenizer.ggml.token_type", type, N);
  ms_gguf_writer_add_u32(w, "tokenizer.ggml.bos_token_id", 1);
  ms_gguf_writer_add_u32(w, "tokenizer.ggml.unknown_token_id", 0);
  if (!space_prefix) ms_gguf_writer_add_bool(w, "tokenizer.ggml.add_space_prefix", 0);
  int rc = ms_gguf_writer_write(w, path, NULL);
  ms_gguf_writer_free(w);
  return rc ? NULL : open_vocab(path, buf, size);
}

static void test_spm(void) {
  char buf[1024] = "";
  struct ms_tokenizer *t = spm_vocab(1, buf, sizeof buf);
  CHECKF(t != NULL, "%s", buf);
  if (!t) return;
  CHECK(!strcmp(ms_tokenizer_name(t), "llama/spm") && ms_tokenizer_add_bos(t) == 1);
  ENC(t, "hello world", S_HELLO_, S_WORLD_);          /* the chain of merges, by score */
  ENC(t, "abc", S_A_, S_BC);                          /* "bc" scores above "ab" */
  ENC(t, "hello \xc3\xa9", S_HELLO_, S_SP, S_BYTE0 + 0xc3, S_BYTE0 + 0xa9);  /* byte fallback */
  ENC(t, "<s>hi", 1, S_SP, S_HI);                     /* a space after a special token */
  ENC(t, "hi<s>hi", S_SP, S_HI, 1, S_SP, S_HI);
  ENC(t, "hi  hi", S_SP, S_HI, S_SP, S_SP, S_HI);
  ENC(t, "a<unk>b", S_A_, 0, S_SP, 268);              /* the unknown token is found whole, as in llama.cpp */
  ENC(t, "a\xff", S_A_, S_BYTE0 + 0xff);               /* invalid UTF-8 stays bytes, as in llama.cpp */
  char out[64];
  long n = ms_tokenizer_decode(t, (int32_t[]){1, S_HELLO_, S_WORLD_, S_BYTE0 + 0xc3, S_BYTE0 + 0xa9}, 5, out, sizeof out);
  CHECKF(n == 17 && !strcmp(out, "<s> hello world\xc3\xa9"), "decoded %ld '%s'", n, out);
  CHECK(round_trip(t, "hello world", 11) == 0);  /* the leading space is the tokenizer's */
  ms_tokenizer_free(t);
  t = spm_vocab(0, buf, sizeof buf);
  CHECKF(t != NULL, "%s", buf);
  if (t) ENC(t, "hi hi", S_HI, S_SP, S_HI);       /* add_space_prefix false */
  ms_tokenizer_free(t);
}

/* The synthetic models' vocabulary (bytes, no merges) tokenizes like the byte-level tokenizer. */
static void test_synthetic(void) {
  char path[256], buf[512] = "";
  snprintf(path, sizeof path, "%s/tiny.gguf", tmpdir);
  struct ms_model_config cfg;
  ms_preset_config("tiny", MS_DTYPE_F32, &cfg);
  cfg.vocab = 300;  /* ids 256.. are control tokens "<|id|>" */
  struct ms_model *m = ms_model_synth(&cfg, 1);
  CHECK(ms_gguf_write_model(m, MS_DTYPE_Q8_0, path, NULL) == 0);
  ms_model_free(m);
  struct ms_tokenizer *t = open_vocab(path, buf, sizeof buf), *b = ms_tokenizer_bytes_new(300);
  CHECKF(t && b, "%s", buf);
  if (!t || !b) return;
  uint64_t r = 99;
  int bad = 0;
  for (int it = 0; it < 200; it++) {
    char text[80];
    int32_t x[80], y[80];
    char dx[200], dy[200];
    int len = it % 80;
    for (int i = 0; i < len; i++) r ^= r << 13, r ^= r >> 7, r ^= r << 17, text[i] = (char)(r & 0xff);
    int nx = ms_tokenizer_encode(t, text, (size_t)len, x, 80), ny = ms_tokenizer_encode(b, text, (size_t)len, y, 80);
    if (nx != ny || memcmp(x, y, sizeof *x * (size_t)(nx > 0 ? nx : 0))) bad++;
    int32_t ids[3] = {(int32_t)(r % 300), 257, 'a'};
    long lx = ms_tokenizer_decode(t, ids, 3, dx, sizeof dx), ly = ms_tokenizer_decode(b, ids, 3, dy, sizeof dy);
    if (lx != ly || memcmp(dx, dy, (size_t)lx)) bad++;
  }
  CHECKF(bad == 0, "%d differences from the byte-level tokenizer", bad);
  CHECK(ms_tokenizer_find(b, "<|260|>") == 260 && ms_tokenizer_find(t, "<|260|>") == 260);
  CHECK(ms_tokenizer_is_control(b, 260) && ms_tokenizer_is_control(t, 260) && !ms_tokenizer_is_control(t, 'a'));
  int32_t one;
  CHECK(ms_tokenizer_encode(t, "<|260|>", 7, &one, 1) == 1 && one == 260);
  ms_tokenizer_free(t);
  ms_tokenizer_free(b);
}

/* ---- the real SmolLM2 vocabulary, when cached ---- */

/* ids from llama.cpp for the same file (llama-cpp-python 0.3.36,
 * Llama.tokenize(text, add_bos=False, special=True)) */
static const struct {
  const char *text;
  int n;
  int32_t ids[24];
} smol[] = {
    {"Hello world! The year 2024 isn't over.",
     14, {19556, 905, 17, 378, 713, 216, 34, 32, 34, 36, 3247, 982, 690, 30}},
    {"The quick brown fox, in 1999, jumped over 3 lazy dogs!\n\n  Done.",
     22, {504, 2365, 6354, 16438, 28, 281, 216, 33, 41, 41, 41, 28, 25437, 690, 216, 35, 23790, 5046, 17, 8866, 38063, 30}},
    {"<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
     16, {1, 4093, 198, 1780, 314, 216, 34, 27, 34, 47, 2, 198, 1, 520, 9531, 198}},
    {"Caf\xc3\xa9 \xe2\x82\xac" "12 \xf0\x9f\x98\x80 \xe6\x97\xa5\xe6\x9c\xac",
     12, {51, 1939, 2756, 24927, 33, 34, 40303, 218, 17097, 241, 115, 40993}},
    {"  leading spaces and\ttabs\r\nwindows lines   ",
     12, {216, 2899, 5600, 284, 197, 100, 7366, 201, 198, 37066, 3204, 333}},
    {"don't STOP'S we'LL it's I'm you're they've",
     17, {12420, 982, 5022, 7627, 23, 67, 392, 23, 16421, 357, 506, 339, 5248, 346, 2316, 502, 3543}},
    {"x = f(y) + 3.14159 * arr[2]; // comment",
     22, {104, 446, 275, 24, 105, 25, 1232, 216, 35, 30, 33, 36, 33, 37, 41, 1672, 2418, 75, 34, 26695, 13241, 5189}},
    {"na\xc3\xafve r\xc3\xa9sum\xc3\xa9 \xc3\xbc" "ber stra\xc3\x9f" "e \xd9\x85\xd8\xb1\xd8\xad\xd8\xa8\xd8\xa7 \xd9\xa3\xd9\xa4",
     22, {3546, 46494, 412, 2756, 5422, 2756, 5549, 137, 593, 4040, 34878, 85, 36395, 20602, 44626, 31462, 10805, 216, 164, 113, 164, 114}},
};

static void test_smollm2(void) {
  char path[512];
  const char *env = getenv("MS_SMOLLM2"), *home = getenv("HOME");
  if (env) snprintf(path, sizeof path, "%s", env);
  else snprintf(path, sizeof path, "%s/.cache/megascope/SmolLM2-135M-Instruct.Q4_1.gguf", home ? home : "");
  if (access(path, R_OK)) {
    SKIP_PART("SmolLM2 not cached (%s): its vocabulary not checked (scripts/get-smollm2.sh)", path);
    return;
  }
  char buf[512] = "";
  struct ms_tokenizer *t = open_vocab(path, buf, sizeof buf);
  CHECKF(t != NULL, "%s", buf);
  if (!t) return;
  CHECK(!strcmp(ms_tokenizer_name(t), "gpt2/smollm") && ms_tokenizer_vocab(t) == 49152);
  CHECK(ms_tokenizer_find(t, "<|im_start|>") == 1 && ms_tokenizer_find(t, "<|im_end|>") == 2);
  CHECK(ms_tokenizer_find(t, "<|endoftext|>") == 0);  /* id 0 is a token, not "not found" */
  for (size_t i = 0; i < sizeof smol / sizeof smol[0]; i++)
    if (smol[i].n) CHECK(encode_is(t, smol[i].text, smol[i].ids, smol[i].n));
  const char *texts[] = {"The quick brown fox, in 1999, jumped over 3 lazy dogs!\n\n  Done.",
                         "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
                         "Caf\xc3\xa9 \xe2\x82\xac" "12 \xf0\x9f\x98\x80 \xe6\x97\xa5\xe6\x9c\xac"};
  for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) CHECK(round_trip(t, texts[i], strlen(texts[i])));
  printf("SmolLM2 vocabulary checked (%s)\n", path);
  ms_tokenizer_free(t);
}

int main(void) {
  snprintf(tmpdir, sizeof tmpdir, "/tmp/ms_tok_XXXXXX");
  if (!mkdtemp(tmpdir)) return 1;
  test_splits();
  test_bpe();
  test_llamacpp_conventions();
  test_spm();
  test_synthetic();
  test_smollm2();
  /* the byte-level tokenizer keeps its contract */
  struct ms_tokenizer *b = ms_tokenizer_bytes_new(256);
  int32_t ids[4];
  char out[16];
  CHECK(b && ms_tokenizer_encode(b, "abc", 3, ids, 4) == 3 && ids[2] == 'c' && !strcmp(ms_tokenizer_name(b), "bytes"));
  CHECK(ms_tokenizer_decode(b, ids, 3, out, sizeof out) == 3 && !strcmp(out, "abc"));
  CHECK(!ms_tokenizer_bytes_new(255) && errno == EINVAL);
  ms_tokenizer_free(b);
  char cmd[200];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
  if (system(cmd)) fprintf(stderr, "could not remove %s\n", tmpdir);
  TEST_MAIN_END();
}
