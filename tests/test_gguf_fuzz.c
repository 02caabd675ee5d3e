/* SPDX-License-Identifier: MIT */
/* Fuzz-style checks of the GGUF reader and everything built on it: a small
 * model file (tiny, q4_1, with its byte-level vocabulary) is cut at every length
 * of its header and at many lengths of its data, has random bits flipped, and
 * has random bytes put in place of its header; each variant is parsed from an
 * exactly-sized heap copy (so AddressSanitizer sees any read past the end),
 * and whatever parses is turned into a model, a tokenizer, a tokenized string
 * and a reference forward step. Nothing may crash; truncated files must be
 * rejected. Iterations: MS_FUZZ_ITERS (default 3000); seed MS_FUZZ_SEED. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "megascope/gguf.h"
#include "megascope/reference.h"
#include "megascope/tokenizer.h"
#include "test.h"

static uint64_t rng;

static uint64_t next(void) {
  rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
  return rng;
}

/* Writes tiny as q4_1 and adds a few merges so the BPE path runs too. */
static uint8_t *make_file(size_t *n, size_t *data_off) {
  char dir[] = "/tmp/ms_fuzz_XXXXXX", path[64];
  if (!mkdtemp(dir)) return NULL;
  snprintf(path, sizeof path, "%s/t.gguf", dir);
  struct ms_model_config cfg;
  ms_preset_config("tiny", MS_DTYPE_F32, &cfg);
  struct ms_model *m = ms_model_synth(&cfg, 5);
  int rc = ms_gguf_write_model(m, MS_DTYPE_Q4_1, path, NULL);
  ms_model_free(m);
  uint8_t *buf = NULL;
  FILE *f = rc ? NULL : fopen(path, "rb");
  if (f) {
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    buf = malloc(*n);
    if (buf && fread(buf, 1, *n, f) != *n) buf = (free(buf), NULL);
    fclose(f);
  }
  unlink(path);
  rmdir(dir);
  struct ms_gguf *g = buf ? ms_gguf_open_mem(buf, *n, NULL) : NULL;
  *data_off = g ? ms_gguf_data_offset(g) : 0;
  ms_gguf_free(g);
  return buf;
}

static long parsed, models, toks;

/* Parses an exact-size copy and exercises what parses. Returns 1 when it parsed. */
static int try_bytes(const uint8_t *src, size_t n) {
  uint8_t *b = malloc(n ? n : 1);
  memcpy(b, src, n);
  char buf[512] = "";
  struct ms_textbuf log = {buf, sizeof buf, 0, 0};
  struct ms_gguf *g = ms_gguf_open_mem(b, n, &log);
  int ok = g != NULL;
  if (g) {
    parsed++;
    char v[96];
    for (int i = 0; i < ms_gguf_n_kv(g); i++) ms_gguf_kv_format(g, i, v, sizeof v);
    struct ms_model *m = ms_gguf_model_new(g, &log);
    struct ms_tokenizer *t = ms_tokenizer_gguf_new(g, &log);
    if (t) {
      toks++;
      int32_t ids[64];
      char out[256];
      int k = ms_tokenizer_encode(t, "Hello, world 123! \xf0\x9f\x98\x80 ok", 26, ids, 64);
      if (k > 0) ms_tokenizer_decode(t, ids, k < 64 ? k : 64, out, sizeof out);
    }
    if (m) {
      models++;
      struct ms_ref *r = ms_ref_new(m, 4);
      float *lg = malloc(sizeof(float) * (size_t)m->cfg.vocab);
      if (r && lg) ms_ref_step(r, 1 % m->cfg.vocab, lg);
      free(lg);
      ms_ref_free(r);
    }
    ms_tokenizer_free(t);
    ms_model_free(m);
    ms_gguf_free(g);
  } else {
    CHECKF(buf[0] != '\0' || errno != MS_E_FORMAT, "rejected without a message");
  }
  free(b);
  return ok;
}

int main(void) {
  size_t n = 0, data_off = 0;
  uint8_t *file = make_file(&n, &data_off);
  CHECK(file != NULL && data_off > 0);
  if (!file) TEST_MAIN_END();
  rng = getenv("MS_FUZZ_SEED") ? strtoull(getenv("MS_FUZZ_SEED"), NULL, 0) : 0x9e3779b97f4a7c15ull;
  long iters = getenv("MS_FUZZ_ITERS") ? atol(getenv("MS_FUZZ_ITERS")) : 3000;
  CHECK(try_bytes(file, n) == 1 && models == 1 && toks == 1);

  /* every truncation of the header and tensor infos, a sample of the data */
  int accepted = 0;
  for (size_t len = 0; len < n; len += len < data_off + 64 ? 1 : 97) accepted += try_bytes(file, len);
  CHECKF(accepted == 0, "%d truncated files were accepted", accepted);

  uint8_t *mut = malloc(n);
  for (long it = 0; it < iters; it++) {
    memcpy(mut, file, n);
    int flips = 1 + (int)(next() % 8);
    for (int f = 0; f < flips; f++) {
      /* mostly the header, where every byte matters; sometimes anywhere */
      size_t at = next() % 4 ? next() % data_off : next() % n;
      mut[at] ^= (uint8_t)(1u << (next() % 8));
    }
    if (it % 10 == 0) {  /* overwrite a run with random bytes */
      size_t at = next() % data_off, len = 1 + next() % 16;
      for (size_t i = at; i < at + len && i < n; i++) mut[i] = (uint8_t)next();
    }
    if (it % 50 == 0) {  /* and a cut */
      try_bytes(mut, next() % n);
      continue;
    }
    try_bytes(mut, n);
  }
  printf("%ld mutants: %ld parsed, %ld models built, %ld tokenizers built\n", iters, parsed, models, toks);
  free(mut);
  free(file);
  TEST_MAIN_END();
}
