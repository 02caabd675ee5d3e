/* SPDX-License-Identifier: MIT */
/* Shared CLI helpers. */
#include "common.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "megascope/engine.h"

#include "megascope/base.h"
#include "megascope/gguf.h"
#include "megascope/tokenizer.h"

/* --model F.gguf: the file's model (and tokenizer). */
static struct ms_model *load_gguf(const struct cli_model *cm, struct ms_tokenizer **tok) {
  char buf[2048] = "";
  struct ms_textbuf log = {buf, sizeof buf, 0, 0};
  struct ms_model *m = NULL;
  if (cm->preset) {
    fprintf(stderr, "megascope: give either --model or --synthetic, not both\n");
    return NULL;
  }
  int rc = ms_gguf_load(cm->path, &m, tok, &log);
  if (rc) fprintf(stderr, "megascope: cannot load %s: %s\n%s", cm->path, ms_strerror(rc), buf);
  return m;
}

struct ms_model *cli_model_load_tok(const struct cli_model *cm, struct ms_tokenizer **tok) {
  *tok = NULL;
  if (cm->path) return load_gguf(cm, tok);
  struct ms_model *m = cli_model_load(cm);
  if (m && m->cfg.vocab >= 256) *tok = ms_tokenizer_bytes_new(m->cfg.vocab);
  return m;
}

struct ms_model *cli_model_load(const struct cli_model *cm) {
  if (cm->path) return load_gguf(cm, NULL);
  if (!cm->preset) {
    fprintf(stderr, "megascope: no model: give --synthetic PRESET or --model F.gguf\n");
    return NULL;
  }
  enum ms_dtype dt = MS_DTYPE_F32;
  if (cm->dtype && (ms_dtype_parse(cm->dtype, &dt) || (dt != MS_DTYPE_F32 && dt != MS_DTYPE_BF16))) {
    fprintf(stderr, "megascope: --dtype '%s': expected f32 or bf16 (the other types come from GGUF files)\n", cm->dtype);
    return NULL;
  }
  struct ms_model_config cfg;
  if (ms_preset_config(cm->preset, dt, &cfg)) {
    fprintf(stderr, "megascope: unknown preset '%s'; presets:", cm->preset);
    for (int i = 0; ms_preset_names[i]; i++) fprintf(stderr, " %s", ms_preset_names[i]);
    fprintf(stderr, "\n");
    return NULL;
  }
  struct ms_model *m = cm->shape_only ? ms_model_shape(&cfg) : ms_model_synth(&cfg, cm->seed ? cm->seed : 1);
  if (!m) fprintf(stderr, "megascope: cannot build model '%s': %s\n", cm->preset, ms_strerror(errno));
  return m;
}

int cli_int(const char *opt, const char *s, long lo, long hi, long *out) {
  char *end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (errno || end == s || *end || v < lo || v > hi) {
    fprintf(stderr, "megascope: %s '%s': expected an integer in %ld..%ld\n", opt, s, lo, hi);
    return -1;
  }
  *out = v;
  return 0;
}

int cli_u64(const char *opt, const char *s, uint64_t *out) {
  char *end;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 0);
  if (errno || end == s || *end || s[0] == '-') {
    fprintf(stderr, "megascope: %s '%s': expected a non-negative integer\n", opt, s);
    return -1;
  }
  *out = v;
  return 0;
}

double cli_decode_tps(struct ms_engine *e, const struct ms_model *m, int batch, int steps) {
  return cli_decode_tps_at(e, m, batch, steps, 0);
}

double cli_decode_tps_at(struct ms_engine *e, const struct ms_model *m, int batch, int steps, int lockstep) {
  struct ms_request *r[4096];
  int n = 0, ok = 1;
  if (batch > 4096) batch = 4096;
  if (lockstep) {  /* every request in the mailbox before the next step starts */
    struct ms_engine_stats st;
    ms_engine_get_stats(e, &st);
    ms_engine_pause_at(e, st.steps);
    if (ms_engine_wait_paused(e, 60000)) return -1;
  }
  uint64_t t0 = ms_now_ns();
  for (; n < batch; n++) {
    int32_t tok = (int32_t)(1 + n % (m->cfg.vocab - 1));
    struct ms_request_opts ro = {.sz = sizeof ro, .prompt = &tok, .n_prompt = 1, .max_new_tokens = steps};
    if (!(r[n] = ms_engine_submit(e, &ro))) {
      ok = 0;
      break;
    }
  }
  if (lockstep) ms_engine_resume(e);
  for (int i = 0; i < n; i++) ms_request_wait(r[i], -1);
  double s = (double)(ms_now_ns() - t0) / 1e9;
  for (int i = 0; i < n; i++) ms_request_free(r[i]);
  return ok ? (double)batch * steps / s : -1;
}

void cli_shipped_monitor(const char *name, char *buf, size_t n) {
  char exe[4096];
  ssize_t k = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (k <= 0) {
    snprintf(buf, n, "monitors/%s", name);
    return;
  }
  exe[k] = 0;
  char *slash = strrchr(exe, '/');
  if (slash) *slash = 0;
  snprintf(buf, n, "%.*s/monitors/%s", (int)(n > 128 ? n - 128 : 0), exe, name);
}
