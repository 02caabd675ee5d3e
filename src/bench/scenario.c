/* SPDX-License-Identifier: MIT */
/* Scenarios of the counterexample benchmark: reading them from JSON (untrusted
 * input: every key checked, every error named with the scenario and the key),
 * generating them, writing them back, and drawing from a scenario's seed what
 * its file left out (the culprit, a starved task's tile, the share of the target
 * slowdown the magnitude is tuned to), so a run says exactly what it injected.
 *
 * A file is a JSON array of objects:
 *   {"name": "...", "preset": "llama-3.2-1b", "backend": "sim", "batch": 8, "steps": 8,
 *    "seed": 7, "faults": [{"type": "slow_class", "target": "blk.3.wo", "factor": 2.5}]}
 * and optionally "gpu", "tp", "workers", "jitter", "target" (the slowdown bound,
 * 0.05), "model" ({"n_layers", "n_experts", "top_k", "expert_ffn_dim"}) and "sim"
 * ({cost parameter: number}). A fault takes "type" and optionally "target" (a
 * name or a number), "factor", "delay_us", "tile" and "severity". */
#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench.h"
#include "megascope/gguf.h"
#include "megascope/plan_ir.h"

/* ---- reading ---- */

static int only_keys(json_t *o, const char *const *allowed, const char *what, struct ms_textbuf *log) {
  const char *k;
  json_t *v;
  json_object_foreach(o, k, v) {
    int ok = 0;
    for (const char *const *a = allowed; *a; a++) ok |= !strcmp(k, *a);
    if (!ok) {
      ms_textbuf_printf(log, "%s: unknown key \"%s\"\n", what, k);
      return -EINVAL;
    }
  }
  return 0;
}

/* An integer member in lo..hi; absent: def (required: an error). */
static int get_int(json_t *o, const char *key, long long lo, long long hi, long long def, int required,
                   long long *out, const char *what, struct ms_textbuf *log) {
  json_t *v = json_object_get(o, key);
  if (!v) {
    if (required) {
      ms_textbuf_printf(log, "%s: \"%s\" is required\n", what, key);
      return -EINVAL;
    }
    *out = def;
    return 0;
  }
  if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi) {
    ms_textbuf_printf(log, "%s: \"%s\" must be an integer in %lld..%lld\n", what, key, lo, hi);
    return -EINVAL;
  }
  *out = json_integer_value(v);
  return 0;
}

static int get_num(json_t *o, const char *key, double lo, double hi, double def, double *out, const char *what,
                   struct ms_textbuf *log) {
  json_t *v = json_object_get(o, key);
  if (!v) {
    *out = def;
    return 0;
  }
  if (!json_is_number(v) || json_number_value(v) < lo || json_number_value(v) > hi) {
    ms_textbuf_printf(log, "%s: \"%s\" must be a number in %g..%g\n", what, key, lo, hi);
    return -EINVAL;
  }
  *out = json_number_value(v);
  return 0;
}

static int get_str(json_t *o, const char *key, const char *def, char *out, size_t n, const char *what,
                   struct ms_textbuf *log) {
  json_t *v = json_object_get(o, key);
  if (!v) {
    snprintf(out, n, "%s", def);
    return 0;
  }
  if (!json_is_string(v) || strlen(json_string_value(v)) >= n || !json_string_value(v)[0]) {
    ms_textbuf_printf(log, "%s: \"%s\" must be a string of 1..%zu characters\n", what, key, n - 1);
    return -EINVAL;
  }
  snprintf(out, n, "%s", json_string_value(v));
  return 0;
}

static int parse_fault(json_t *o, struct bench_fault *f, const char *what, struct ms_textbuf *log) {
  static const char *const keys[] = {"type", "target", "factor", "delay_us", "tile", "severity", NULL};
  char type[32];
  long long tile;
  double v;
  memset(f, 0, sizeof *f);
  if (!json_is_object(o)) {
    ms_textbuf_printf(log, "%s: a fault must be an object\n", what);
    return -EINVAL;
  }
  int rc = only_keys(o, keys, what, log);
  if (!rc) rc = get_str(o, "type", "", type, sizeof type, what, log);
  if (rc) return rc;
  if (ms_fault_type_parse(type, &f->type)) {
    ms_textbuf_printf(log, "%s: unknown fault type \"%s\"\n", what, type);
    return -EINVAL;
  }
  json_t *t = json_object_get(o, "target");
  if (t && json_is_integer(t) && json_integer_value(t) >= 0 && json_integer_value(t) < 1 << 20) {
    snprintf(f->target, sizeof f->target, "%lld", (long long)json_integer_value(t));
    f->given |= BF_TARGET;
  } else if (t && json_is_string(t) && strlen(json_string_value(t)) < sizeof f->target) {
    snprintf(f->target, sizeof f->target, "%s", json_string_value(t));
    f->given |= BF_TARGET;
  } else if (t) {
    ms_textbuf_printf(log, "%s: \"target\" must be a name or a number\n", what);
    return -EINVAL;
  }
  const char *mag = ms_fault_uses_factor(f->type) ? "factor" : "delay_us";
  const char *other = ms_fault_uses_factor(f->type) ? "delay_us" : "factor";
  if (json_object_get(o, other)) {
    ms_textbuf_printf(log, "%s: %s takes \"%s\", not \"%s\"\n", what, type, mag, other);
    return -EINVAL;
  }
  if (json_object_get(o, mag)) {
    double lo = ms_fault_factor_is_slowdown(f->type) ? 1 : 0;
    double hi = lo == 1 ? 1e5 : ms_fault_uses_factor(f->type) ? 1 : 1e6;
    if ((rc = get_num(o, mag, lo, hi, 0, &v, what, log))) return rc;
    f->magnitude = ms_fault_uses_factor(f->type) ? v : v * 1000;
    f->given |= BF_MAGNITUDE;
  }
  if ((rc = get_int(o, "tile", 0, 1 << 20, -1, 0, &tile, what, log))) return rc;
  if (tile >= 0) {
    f->tile = (int)tile;
    f->given |= BF_TILE;
  }
  return get_num(o, "severity", 0.05, 1, -1, &f->severity, what, log);
}

/* "interference": {"kind": "spin", "worker": 1, "share": 0.3} and the like;
 * with "tp", "rank": R puts it beside device R's worker (across ranks: in rank
 * R's process, on the CPU its worker is pinned to). */
static int parse_interference(json_t *o, struct bench_interfere_spec *in, const char *what, struct ms_textbuf *log) {
  static const char *const keys[] = {"kind", "worker", "rank", "slot", "tokens", "share", "severity", NULL};
  char kind[32], w[160];
  long long v;
  snprintf(w, sizeof w, "%s, interference", what);
  memset(in, 0, sizeof *in);
  in->worker = in->slot = -1;
  if (!json_is_object(o)) {
    ms_textbuf_printf(log, "%s: must be an object\n", w);
    return -EINVAL;
  }
  int rc = only_keys(o, keys, w, log);
  if (!rc) rc = get_str(o, "kind", "", kind, sizeof kind, w, log);
  if (rc) return rc;
  if (bench_interference_parse(kind, &in->kind) || in->kind == BI_NONE) {
    ms_textbuf_printf(log, "%s: unknown kind \"%s\" (spin, preempt, long_context, cold, membw)\n", w, kind);
    return -EINVAL;
  }
  if (in->kind == BI_MEMBW) {
    ms_textbuf_printf(log, "%s: membw is measured (megascope interfere), not scored: its culprit is the machine\n", w);
    return -EINVAL;
  }
  int who = in->kind == BI_SPIN || in->kind == BI_PREEMPT, slot = in->kind == BI_LONG_CONTEXT;
  if (json_object_get(o, "worker") && !who) return ms_textbuf_printf(log, "%s: only spin and preempt take \"worker\"\n", w), -EINVAL;
  if ((json_object_get(o, "slot") || json_object_get(o, "tokens")) && !slot)
    return ms_textbuf_printf(log, "%s: only long_context takes \"slot\" and \"tokens\"\n", w), -EINVAL;
  if (json_object_get(o, "share") && !who) return ms_textbuf_printf(log, "%s: only spin and preempt take \"share\"\n", w), -EINVAL;
  if (json_object_get(o, "rank") && !who) return ms_textbuf_printf(log, "%s: only spin and preempt take \"rank\"\n", w), -EINVAL;
  if ((rc = get_int(o, "worker", 0, 1023, -1, 0, &v, w, log))) return rc;
  if (v >= 0) in->worker = (int)v, in->given |= BI_GIVEN_WHO;
  if ((rc = get_int(o, "rank", 0, BENCH_MAX_DEVICES - 1, 0, 0, &v, w, log))) return rc;
  in->rank = (int)v;
  if (json_object_get(o, "rank")) in->given |= BI_GIVEN_RANK;
  if ((rc = get_int(o, "slot", 0, 63, -1, 0, &v, w, log))) return rc;
  if (v >= 0) in->slot = (int)v, in->given |= BI_GIVEN_WHO;
  if ((rc = get_int(o, "tokens", 1, 1 << 16, 0, 0, &v, w, log))) return rc;
  if (v > 0) in->tokens = (int)v, in->given |= BI_GIVEN_TOKENS;
  if ((rc = get_num(o, "share", 0.001, 1, 0, &in->share, w, log))) return rc;
  if (in->share > 0) in->given |= BI_GIVEN_SHARE;
  return get_num(o, "severity", 0.05, 1, -1, &in->severity, w, log);
}

/* A GGUF file by path, or by bare name in $MS_CACHE or ~/.cache/megascope. */
static void gguf_path(const char *name, char *out, size_t n) {
  const char *cache = getenv("MS_CACHE"), *home = getenv("HOME");
  if (strchr(name, '/'))
    snprintf(out, n, "%s", name);
  else if (cache && *cache)
    snprintf(out, n, "%s/%s", cache, name);
  else
    snprintf(out, n, "%s/.cache/megascope/%s", home ? home : ".", name);
}

static int parse_model(json_t *o, struct bench_scenario *s, const char *what, struct ms_textbuf *log) {
  static const char *const keys[] = {"n_layers", "n_experts", "top_k", "expert_ffn_dim", NULL};
  long long v[4];
  if (!json_is_object(o)) {
    ms_textbuf_printf(log, "%s: \"model\" must be an object\n", what);
    return -EINVAL;
  }
  int rc = only_keys(o, keys, what, log);
  for (int i = 0; !rc && i < 4; i++) rc = get_int(o, keys[i], 1, 1 << 16, 0, 0, &v[i], what, log);
  if (rc) return rc;
  s->n_layers = (int)v[0];
  s->n_experts = (int)v[1];
  s->top_k = (int)v[2];
  s->expert_ffn_dim = (int)v[3];
  return 0;
}

static int parse_sim(json_t *o, struct bench_scenario *s, const char *what, struct ms_textbuf *log) {
  const char *k;
  json_t *v;
  struct ms_sim_params probe;
  if (!json_is_object(o)) {
    ms_textbuf_printf(log, "%s: \"sim\" must be an object\n", what);
    return -EINVAL;
  }
  ms_sim_preset("h100", &probe);
  json_object_foreach(o, k, v) {
    char val[32];
    if (s->n_params == BENCH_MAX_PARAMS || strlen(k) >= 32 || !json_is_number(v)) {
      ms_textbuf_printf(log, "%s: \"sim\": \"%s\" must be a cost parameter with a number\n", what, k);
      return -EINVAL;
    }
    snprintf(val, sizeof val, "%.17g", json_number_value(v));
    if (ms_sim_param_set(&probe, k, val)) {
      ms_textbuf_printf(log, "%s: \"sim\": bad cost parameter \"%s\" = %s\n", what, k, val);
      return -EINVAL;
    }
    snprintf(s->params[s->n_params][0], 32, "%s", k);
    snprintf(s->params[s->n_params][1], 32, "%s", val);
    s->n_params++;
  }
  return 0;
}

static int parse_one(json_t *o, int idx, struct bench_scenario *s, struct ms_textbuf *log) {
  static const char *const keys[] = {"name",   "preset", "backend", "batch", "steps", "seed",  "faults",
                                     "gpu",    "tp",     "workers", "jitter", "target", "model", "sim",
                                     "gguf",   "pin",    "interference", NULL};
  char what[128], backend[8];
  long long batch, steps, seed, tp, workers, pin;
  memset(s, 0, sizeof *s);
  snprintf(what, sizeof what, "scenario %d", idx);
  if (!json_is_object(o)) {
    ms_textbuf_printf(log, "%s: must be an object\n", what);
    return -EINVAL;
  }
  int rc = get_str(o, "name", what, s->name, sizeof s->name, what, log);
  if (rc) return rc;
  snprintf(what, sizeof what, "scenario %d (%s)", idx, s->name);
  if ((rc = only_keys(o, keys, what, log)) || (rc = get_str(o, "preset", "", s->preset, sizeof s->preset, what, log)) ||
      (rc = get_str(o, "backend", "sim", backend, sizeof backend, what, log)) ||
      (rc = get_str(o, "gpu", "h100", s->gpu, sizeof s->gpu, what, log)) ||
      (rc = get_int(o, "batch", 1, 64, 0, 1, &batch, what, log)) ||
      (rc = get_int(o, "steps", 1, 4096, 0, 1, &steps, what, log)) ||
      (rc = get_int(o, "seed", 0, INT64_MAX, 0, 1, &seed, what, log)) ||
      (rc = get_int(o, "tp", 1, BENCH_MAX_DEVICES, 1, 0, &tp, what, log)) ||
      (rc = get_int(o, "workers", 0, 1024, 0, 0, &workers, what, log)) ||
      (rc = get_num(o, "jitter", 0, 0.5, 0.05, &s->jitter, what, log)) ||
      (rc = get_num(o, "target", 0.001, 1, 0.05, &s->target, what, log)) ||
      (rc = get_str(o, "gguf", "", s->gguf, sizeof s->gguf, what, log)) ||
      (rc = get_int(o, "pin", 0, 1, 0, 0, &pin, what, log)))
    return rc;
  s->pin = (int)pin;
  struct ms_model_config cfg;
  if (s->gguf[0]) {
    if (ms_backend_parse(backend, &s->backend) || ms_backend_info(s->backend)->cost_model || s->preset[0] ||
        json_object_get(o, "model")) {
      ms_textbuf_printf(log, "%s: \"gguf\" runs a real model on the cpu or cuda backend, without \"preset\" "
                        "or \"model\"\n", what);
      return -EINVAL;
    }
    snprintf(s->preset, sizeof s->preset, "gguf");
  } else if (!s->preset[0] || ms_preset_config(s->preset, MS_DTYPE_F32, &cfg)) {
    ms_textbuf_printf(log, "%s: \"preset\" must name a model preset (tiny, tiny-moe, llama-3.2-1b, ...)\n", what);
    return -EINVAL;
  }
  if (ms_backend_parse(backend, &s->backend)) {
    ms_textbuf_printf(log, "%s: \"backend\" must be \"sim\", \"cpu\" or \"cuda\"\n", what);
    return -EINVAL;
  }
  struct ms_sim_params sp;
  if (ms_sim_preset(s->gpu, &sp)) {
    ms_textbuf_printf(log, "%s: \"gpu\" must be a100, h100, h200 or b200\n", what);
    return -EINVAL;
  }
  s->batch = (int)batch;
  s->steps = (int)steps;
  s->seed = (uint64_t)seed;
  s->tp = (int)tp;
  s->workers = (int)workers;
  json_t *m = json_object_get(o, "model"), *sim = json_object_get(o, "sim"), *fl = json_object_get(o, "faults");
  if ((m && (rc = parse_model(m, s, what, log))) || (sim && (rc = parse_sim(sim, s, what, log)))) return rc;
  if (!json_is_array(fl) || json_array_size(fl) > BENCH_MAX_FAULTS) {
    ms_textbuf_printf(log, "%s: \"faults\" must be an array of at most %d faults ([] when healthy)\n", what,
                      BENCH_MAX_FAULTS);
    return -EINVAL;
  }
  json_t *in = json_object_get(o, "interference");
  s->intf.worker = s->intf.slot = -1;
  if (in && (rc = parse_interference(in, &s->intf, what, log))) return rc;
  if (in && s->intf.rank >= s->tp && (s->intf.given & BI_GIVEN_RANK)) {
    ms_textbuf_printf(log, "%s: interference beside rank %d: \"tp\" is %d (ranks 0..%d)\n", what, s->intf.rank, s->tp,
                      s->tp - 1);
    return -EINVAL;
  }
  if (in && ms_backend_info(s->backend)->virtual_clock) {
    ms_textbuf_printf(log, "%s: interference is real: the cpu backend (or cuda) produces it, not the simulator\n", what);
    return -EINVAL;
  }
  if (in && s->intf.kind == BI_COLD && !s->gguf[0]) {
    ms_textbuf_printf(log, "%s: a cold model is a file's pages: it needs \"gguf\"\n", what);
    return -EINVAL;
  }
  for (size_t i = 0; i < json_array_size(fl); i++) {
    char fw[160];
    snprintf(fw, sizeof fw, "%s, fault %zu", what, i);
    if ((rc = parse_fault(json_array_get(fl, i), &s->faults[i], fw, log))) return rc;
    if (!ms_backend_injects(s->backend, s->faults[i].type)) {
      ms_textbuf_printf(log, "%s: %s is not injected on the %s backend (task delays, slow_request, "
                        "delayed_release and late_admission are)\n", fw, ms_fault_type_name(s->faults[i].type),
                        ms_backend_name(s->backend));
      return -EINVAL;
    }
    s->n_faults++;
  }
  return 0;
}

int bench_scenarios_parse(const char *text, size_t len, struct bench_scenario **out, int *n,
                          struct ms_textbuf *log) {
  json_error_t err;
  json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &err);
  int rc = 0;
  *out = NULL;
  *n = 0;
  if (!root) {
    ms_textbuf_printf(log, "line %d: %s\n", err.line, err.text);
    return -EINVAL;
  }
  if (!json_is_array(root) || !json_array_size(root) || json_array_size(root) > 100000) {
    ms_textbuf_printf(log, "a scenario file is a non-empty JSON array of scenarios\n");
    rc = -EINVAL;
    goto out;
  }
  *out = calloc(json_array_size(root), sizeof **out);
  if (!*out) {
    rc = -ENOMEM;
    goto out;
  }
  for (size_t i = 0; i < json_array_size(root); i++) {
    if ((rc = parse_one(json_array_get(root, i), (int)i, &(*out)[i], log))) break;
    (*n)++;
  }
  if (rc) {
    free(*out);
    *out = NULL;
    *n = 0;
  }
out:
  json_decref(root);
  return rc;
}

int bench_scenarios_read(const char *path, struct bench_scenario **out, int *n, struct ms_textbuf *log) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    ms_textbuf_printf(log, "%s: %s\n", path, strerror(errno));
    return -errno;
  }
  size_t cap = 1 << 16, len = 0;
  char *buf = malloc(cap);
  while (buf) {
    len += fread(buf + len, 1, cap - len, f);
    if (len < cap) break;
    char *nb = cap < (size_t)64 << 20 ? realloc(buf, cap * 2) : NULL;
    if (!nb) free(buf);
    buf = nb;
    cap *= 2;
  }
  fclose(f);
  if (!buf) {
    ms_textbuf_printf(log, "%s: too large or out of memory\n", path);
    return -ENOMEM;
  }
  int rc = bench_scenarios_parse(buf, len, out, n, log);
  free(buf);
  return rc;
}

/* ---- drawing from a seed ---- */

static uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

static uint64_t rnd(uint64_t *s) { return mix(*s += 0x9e3779b97f4a7c15ull); }
static int pick(uint64_t *s, int n) { return n > 0 ? (int)(rnd(s) % (uint64_t)n) : 0; }
static double uniform(uint64_t *s, double lo, double hi) {
  return lo + (hi - lo) * (double)(rnd(s) >> 11) / 9007199254740992.0;
}

/* ---- generating ---- */

static const char *const gpus[] = {"h100", "a100", "h200", "b200"};

/* The simulator's model presets: dense Llama-style, Qwen3-style (q/k norms),
 * Gemma-3-style, small and large shapes; MoE comes from any of them with
 * experts added. */
static const char *const sim_presets[] = {"llama-3.2-1b", "smollm2-135m", "qwen3-8b", "gemma3-270m",
                                          "tiny",         "tiny-qwen3",   "tiny-moe"};

static int needs_devices(int type) { return type == MS_FAULT_COMM_DELAY || type == MS_FAULT_BANDWIDTH_STEAL; }

static void gen_config(struct bench_scenario *s, int type, uint64_t *r, enum ms_backend backend) {
  s->backend = backend;
  s->target = 0.05;
  s->tp = 1;
  const struct ms_backend_info *be = ms_backend_info(backend);
  s->jitter = be->cost_model ? 0.05 : 0;
  if (!be->virtual_clock) {
    /* four layers of SmolLM2-135M (synthetic weights), two workers: the CPU
     * backend computes for real, and its tasks (tens of us) should stand above
     * the scheduling noise of a shared machine; the CUDA backend runs the same
     * on the device's workers (workers is the CPU's alone) */
    snprintf(s->preset, sizeof s->preset, "smollm2-135m");
    snprintf(s->gpu, sizeof s->gpu, "h100");
    s->n_layers = 4;
    s->workers = be->os_workers ? 2 : 0;
    s->batch = 4;
    s->steps = 12;
    if (type == MS_FAULT_ROUTING_SKEW) {
      s->n_experts = 4;
      s->top_k = 2;
      s->expert_ffn_dim = 512;
    }
    if (needs_devices(type)) s->tp = 2;
    return;
  }
  /* every preset, GPU, batch 1-16, 2-8 layers, tensor parallelism 1-4 (2-4 where
   * the fault needs devices); MoE always for routing skew and for a starved task
   * where the preset takes experts, else one time in four */
  int np = (int)(sizeof sim_presets / sizeof *sim_presets);
  snprintf(s->preset, sizeof s->preset, "%s", sim_presets[pick(r, np)]);
  snprintf(s->gpu, sizeof s->gpu, "%s", gpus[pick(r, 4)]);
  s->n_layers = 2 + pick(r, 7);
  s->batch = 1 + pick(r, 16);
  s->steps = 4 + pick(r, 5);
  s->tp = needs_devices(type) ? 2 + pick(r, 3) : 1 + pick(r, 4);
  struct ms_model_config pc;
  ms_preset_config(s->preset, MS_DTYPE_BF16, &pc);
  /* experts are SwiGLU and pre-norm: a GeGLU, post-norm (Gemma) preset cannot take them */
  int can_moe = pc.ffn_act == MS_ACT_SILU && !pc.post_norms;
  if (type == MS_FAULT_ROUTING_SKEW && !can_moe) snprintf(s->preset, sizeof s->preset, "tiny-moe");
  int moe = !strcmp(s->preset, "tiny-moe") || type == MS_FAULT_ROUTING_SKEW || (can_moe && pick(r, 4) == 0);
  if (moe && strcmp(s->preset, "tiny-moe")) {
    s->n_experts = 4 << pick(r, 2);   /* 4 or 8 experts, top 2 */
    s->top_k = 2;
    s->expert_ffn_dim = 0;            /* the preset's ffn / 4 */
  } else if (type == MS_FAULT_STARVE_TASK && can_moe && strcmp(s->preset, "tiny-moe")) {
    /* a starved task is a JIT task: experts make most of them expert tasks
     * (8 experts, drawn with nothing more, so the draws after are as before) */
    s->n_experts = 8;
    s->top_k = 2;
    s->expert_ffn_dim = 0;
  }
  if (type == MS_FAULT_ROUTING_SKEW && s->batch < 4) s->batch += 3;  /* routing decides work over rows */
  if (type == MS_FAULT_LATE_ADMISSION && s->batch < 2) s->batch = 2;  /* a slot closes while others run */
}

/* Two faults whose culprits are of different kinds, both possible on the
 * configuration drawn for the first (routing skew where there are experts, the
 * device faults where there are devices); never a late admission, which alone
 * costs a whole step. */
static void gen_several(struct bench_scenario *s, int i, uint64_t *r) {
  int t1;
  do t1 = pick(r, MS_FAULT_TYPE_COUNT);
  while (t1 == MS_FAULT_LATE_ADMISSION);
  gen_config(s, t1, r, MS_BACKEND_SIM);
  int cand[MS_FAULT_TYPE_COUNT], nc = 0;
  for (int t = 0; t < MS_FAULT_TYPE_COUNT; t++) {
    int ok = t != MS_FAULT_LATE_ADMISSION && ms_fault_culprit_kind((enum ms_fault_type)t) !=
                                                ms_fault_culprit_kind((enum ms_fault_type)t1);
    if (t == MS_FAULT_ROUTING_SKEW && !s->n_experts && strcmp(s->preset, "tiny-moe")) ok = 0;
    if (needs_devices(t) && s->tp < 2) ok = 0;
    if (ok) cand[nc++] = t;
  }
  int t2 = cand[pick(r, nc)];
  s->seed = rnd(r) % 1000000;
  snprintf(s->name, sizeof s->name, "several-%d", i);
  s->n_faults = 2;
  s->faults[0].type = (enum ms_fault_type)t1;
  s->faults[1].type = (enum ms_fault_type)t2;
  s->faults[0].severity = s->faults[1].severity = -1;
}

/* Whether the backend injects fault type t (the runtime says). */
static int injected(enum ms_backend backend, int t) { return ms_backend_injects(backend, t); }

/* The CPU backend's scenarios: the two real models megascope's tests fetch
 * (SmolLM2-135M Q4_1, Gemma-3-270M Q4_K_M), in turn; two workers pinned one to
 * a CPU; every fault type a dense model has (routing skew needs experts), the
 * device faults on a two-device plan; the real interference (a spinning
 * neighbour and a random preemptor on one worker's CPU, a long-context request,
 * a cold model); twice as many healthy runs. */
static const char *const cpu_models[] = {"SmolLM2-135M-Instruct.Q4_1.gguf", "gemma-3-270m-q4_k_m.gguf"};
static const int cpu_interference[] = {BI_SPIN, BI_PREEMPT, BI_LONG_CONTEXT, BI_COLD};

static void gen_cpu(struct bench_scenario *s, int i, uint64_t *r) {
  snprintf(s->gguf, sizeof s->gguf, "%s", cpu_models[i % 2]);
  snprintf(s->preset, sizeof s->preset, "gguf");
  snprintf(s->gpu, sizeof s->gpu, "h100");
  s->backend = MS_BACKEND_CPU;
  s->target = 0.05;
  s->tp = 1;
  s->workers = 2;
  s->pin = 1;
  s->batch = 4;
  s->steps = 12;
  s->seed = rnd(r) % 1000000;
  s->intf.worker = s->intf.slot = -1;
}

static int generate_cpu(int per_type, uint64_t seed, struct bench_scenario **out, int *n) {
  const int n_intf = (int)(sizeof cpu_interference / sizeof *cpu_interference);
  int total = per_type * (MS_FAULT_TYPE_COUNT - 1 + n_intf) + 2 * per_type, k = 0;
  struct bench_scenario *s = calloc((size_t)total, sizeof *s);
  uint64_t r = seed;
  if (!s) return -ENOMEM;
  for (int t = 0; t < MS_FAULT_TYPE_COUNT; t++)
    for (int i = 0; i < per_type && t != MS_FAULT_ROUTING_SKEW; i++, k++) {
      gen_cpu(&s[k], k, &r);
      if (needs_devices(t)) s[k].tp = 2;
      snprintf(s[k].name, sizeof s[k].name, "%s-%d", ms_fault_type_name((enum ms_fault_type)t), i);
      s[k].n_faults = 1;
      s[k].faults[0].type = (enum ms_fault_type)t;
      s[k].faults[0].severity = -1;
    }
  for (int j = 0; j < n_intf; j++)
    for (int i = 0; i < per_type; i++, k++) {
      gen_cpu(&s[k], k, &r);
      s[k].intf.kind = cpu_interference[j];
      snprintf(s[k].name, sizeof s[k].name, "%s-%d", bench_interference_name(cpu_interference[j]), i);
    }
  for (int i = 0; i < 2 * per_type; i++, k++) {
    gen_cpu(&s[k], k, &r);
    snprintf(s[k].name, sizeof s[k].name, "healthy-%d", i);
  }
  *out = s;
  *n = k;
  return 0;
}

int bench_scenarios_generate(int per_type, uint64_t seed, enum ms_backend backend, struct bench_scenario **out,
                             int *n) {
  const struct ms_backend_info *be = ms_backend_info(backend);
  if (be->os_workers) return generate_cpu(per_type, seed, out, n);
  int types = 0;
  for (int t = 0; t < MS_FAULT_TYPE_COUNT; t++) types += injected(backend, t);
  int healthy = per_type, total = per_type * types + healthy + (be->virtual_clock ? per_type : 0);
  struct bench_scenario *s = calloc((size_t)total, sizeof *s);
  uint64_t r = seed;
  if (!s) return -ENOMEM;
  int k = 0;
  for (int t = 0; t < MS_FAULT_TYPE_COUNT; t++)
    for (int i = 0; i < per_type && injected(backend, t); i++, k++) {
      gen_config(&s[k], t, &r, backend);
      s[k].seed = rnd(&r) % 1000000;
      snprintf(s[k].name, sizeof s[k].name, "%s-%d", ms_fault_type_name((enum ms_fault_type)t), i);
      s[k].n_faults = 1;
      s[k].faults[0].type = (enum ms_fault_type)t;
      s[k].faults[0].severity = -1;
    }
  for (int i = 0; i < healthy; i++, k++) {
    /* healthy runs of each configuration kind in turn: does anyone see a fault that is not there? */
    int like = i % MS_FAULT_TYPE_COUNT;
    gen_config(&s[k], like, &r, backend);
    s[k].seed = rnd(&r) % 1000000;
    snprintf(s[k].name, sizeof s[k].name, "healthy-%d", i);
  }
  /* several faults at once (the simulator): two of different kinds of culprit,
   * each tuned to its share of half the target; after the rest, so that a seed
   * draws the same single-fault scenarios as before */
  for (int i = 0; i < per_type && be->virtual_clock; i++, k++) gen_several(&s[k], i, &r);
  *out = s;
  *n = k;
  return 0;
}

/* ---- writing ---- */

int bench_scenarios_write(FILE *f, const struct bench_scenario *s, int n) {
  fprintf(f, "[\n");
  for (int i = 0; i < n; i++) {
    const struct bench_scenario *x = &s[i];
    fprintf(f, "  {\"name\": \"%s\", ", x->name);
    if (!x->gguf[0]) fprintf(f, "\"preset\": \"%s\", ", x->preset);
    fprintf(f, "\"backend\": \"%s\", \"batch\": %d, \"steps\": %d, \"seed\": %llu", ms_backend_name(x->backend),
            x->batch, x->steps, (unsigned long long)x->seed);
    if (ms_backend_info(x->backend)->cost_model) fprintf(f, ", \"gpu\": \"%s\", \"jitter\": %g", x->gpu, x->jitter);
    if (x->tp > 1) fprintf(f, ", \"tp\": %d", x->tp);
    if (x->workers) fprintf(f, ", \"workers\": %d", x->workers);
    if (x->target != 0.05) fprintf(f, ", \"target\": %g", x->target);
    if (x->n_layers || x->n_experts) {
      fprintf(f, ",\n   \"model\": {");
      const char *sep = "";
      if (x->n_layers) fprintf(f, "\"n_layers\": %d", x->n_layers), sep = ", ";
      if (x->n_experts) fprintf(f, "%s\"n_experts\": %d, \"top_k\": %d", sep, x->n_experts, x->top_k);
      if (x->n_experts && x->expert_ffn_dim) fprintf(f, ", \"expert_ffn_dim\": %d", x->expert_ffn_dim);
      fprintf(f, "}");
    }
    if (x->n_params) {
      fprintf(f, ", \"sim\": {");
      for (int p = 0; p < x->n_params; p++) fprintf(f, "%s\"%s\": %s", p ? ", " : "", x->params[p][0], x->params[p][1]);
      fprintf(f, "}");
    }
    if (x->gguf[0]) fprintf(f, ", \"gguf\": \"%s\"", x->gguf);
    if (x->pin) fprintf(f, ", \"pin\": 1");
    const struct bench_interfere_spec *in = &x->intf;
    if (in->kind != BI_NONE) {
      fprintf(f, ",\n   \"interference\": {\"kind\": \"%s\"", bench_interference_name(in->kind));
      if (in->given & BI_GIVEN_WHO) {
        if (in->kind == BI_LONG_CONTEXT) fprintf(f, ", \"slot\": %d", in->slot);
        else fprintf(f, ", \"worker\": %d", in->worker);
      }
      if (in->given & BI_GIVEN_RANK) fprintf(f, ", \"rank\": %d", in->rank);
      if (in->given & BI_GIVEN_TOKENS) fprintf(f, ", \"tokens\": %d", in->tokens);
      if (in->given & BI_GIVEN_SHARE) fprintf(f, ", \"share\": %g", in->share);
      if (in->severity > 0) fprintf(f, ", \"severity\": %g", in->severity);
      fprintf(f, "}");
    }
    fprintf(f, ",\n   \"faults\": [");
    for (int j = 0; j < x->n_faults; j++) {
      const struct bench_fault *fl = &x->faults[j];
      fprintf(f, "%s{\"type\": \"%s\"", j ? ", " : "", ms_fault_type_name(fl->type));
      if (fl->given & BF_TARGET) fprintf(f, ", \"target\": \"%s\"", fl->target);
      if (fl->given & BF_TILE) fprintf(f, ", \"tile\": %d", fl->tile);
      if (fl->given & BF_MAGNITUDE) {
        if (ms_fault_uses_factor(fl->type))
          fprintf(f, ", \"factor\": %.9g", fl->magnitude);
        else
          fprintf(f, ", \"delay_us\": %.9g", fl->magnitude / 1000);
      }
      if (fl->severity > 0) fprintf(f, ", \"severity\": %g", fl->severity);
      fprintf(f, "}");
    }
    fprintf(f, "]}%s\n", i + 1 < n ? "," : "");
  }
  fprintf(f, "]\n");
  return ferror(f) ? -EIO : 0;
}

/* ---- the model ---- */

void bench_gguf_path(const struct bench_scenario *s, char *out, size_t n) { gguf_path(s->gguf, out, n); }

struct ms_model *bench_model(const struct bench_scenario *s, struct ms_textbuf *log) {
  struct ms_model_config c;
  int sim = ms_backend_info(s->backend)->cost_model;
  if (s->gguf[0]) {
    char path[512];
    struct ms_model *m = NULL;
    gguf_path(s->gguf, path, sizeof path);
    int rc = ms_gguf_load(path, &m, NULL, log);
    if (rc) {
      ms_textbuf_printf(log, "%s: cannot load %s: %s\n", s->name, path, ms_strerror(rc));
      errno = -rc;
      return NULL;
    }
    return m;
  }
  if (ms_preset_config(s->preset, sim ? MS_DTYPE_BF16 : MS_DTYPE_F32, &c)) {
    ms_textbuf_printf(log, "%s: unknown preset %s\n", s->name, s->preset);
    errno = ENOENT;
    return NULL;
  }
  if (s->n_layers) c.n_layers = s->n_layers;
  if (s->n_experts) {
    c.n_experts = s->n_experts;
    c.top_k = s->top_k ? s->top_k : 2;
    c.expert_ffn_dim = s->expert_ffn_dim ? s->expert_ffn_dim : c.ffn_dim / 4;
  }
  struct ms_model *m = sim ? ms_model_shape(&c) : ms_model_synth(&c, 1);
  if (!m)
    ms_textbuf_printf(log, "%s: preset %s with these overrides is not a model megascope builds (%s)\n", s->name,
                      s->preset, c.n_experts ? "experts need a SwiGLU, pre-norm preset" : ms_strerror(-errno));
  return m;
}

/* ---- names and drawing ---- */

void bench_culprit_name(const struct ms_plan *p, enum ms_culprit_kind k, int id, char *buf, size_t n) {
  if (id < 0) {
    snprintf(buf, n, k == MS_CULPRIT_NONE ? "-" : "(%s not named)", ms_culprit_kind_name(k));
    return;
  }
  switch (k) {
  case MS_CULPRIT_TASK_CLASS: snprintf(buf, n, "%s", id < p->n_classes ? p->classes[id].name : "?"); break;
  case MS_CULPRIT_EVENT_CLASS: snprintf(buf, n, "%s", id < p->n_ev_classes ? p->ev_classes[id] : "?"); break;
  case MS_CULPRIT_REQUEST: snprintf(buf, n, "request slot %d", id); break;
  case MS_CULPRIT_WORKER: snprintf(buf, n, "worker %d", id); break;
  case MS_CULPRIT_DEVICE: snprintf(buf, n, "device %d", id); break;
  case MS_CULPRIT_EXPERT: snprintf(buf, n, "expert %d", id); break;
  case MS_CULPRIT_LAYER: snprintf(buf, n, "layer %d", id); break;
  default: snprintf(buf, n, "-"); break;
  }
}

/* Classes a slow_class fault may pick: every operator that computes (not the
 * step start, the normalisation's empty tasks or communication). */
static int compute_class(const struct ms_task_class *c) {
  return c->kernel != MS_K_STEP_START && c->kernel != MS_K_EMPTY && c->kernel != MS_K_COMM;
}

/* Event classes a delayed_release may pick: those that release tasks. */
static int task_event_class(const struct ms_plan *p, int ec) {
  for (int e = 0; e < p->n_events; e++)
    if (p->events[e].cls == ec && e != p->end_event && p->events[e].last >= p->events[e].first) return 1;
  return 0;
}

static int draw_from(uint64_t *r, const struct ms_plan *p, int type, int limit) {
  int cand[4096], n = 0;
  for (int i = 0; i < limit && n < 4096; i++) {
    int ok = 1;
    if (type == MS_FAULT_SLOW_CLASS) ok = compute_class(&p->classes[i]);
    if (type == MS_FAULT_STARVE_TASK) ok = p->classes[i].launch == MS_LAUNCH_JIT;
    if (type == MS_FAULT_DELAYED_RELEASE) ok = task_event_class(p, i);
    if (ok) cand[n++] = i;
  }
  return n ? cand[pick(r, n)] : -1;
}

static int resolve(struct bench_fault *f, const struct ms_plan *p, int bound, struct ms_textbuf *log,
                   const char *what) {
  enum ms_culprit_kind k = ms_fault_culprit_kind(f->type);
  char *end;
  long v = strtol(f->target, &end, 10);
  if (*f->target && !*end) {
    f->target_id = (int)v;
  } else {
    f->target_id = -1;
    if (k == MS_CULPRIT_TASK_CLASS)
      for (int i = 0; i < p->n_classes; i++)
        if (!strcmp(p->classes[i].name, f->target)) f->target_id = i;
    if (k == MS_CULPRIT_EVENT_CLASS)
      for (int i = 0; i < p->n_ev_classes; i++)
        if (!strcmp(p->ev_classes[i], f->target)) f->target_id = i;
  }
  if (f->target_id < 0 || f->target_id >= bound) {
    ms_textbuf_printf(log, "%s: %s target \"%s\" names no %s of this plan (0..%d)\n", what,
                      ms_fault_type_name(f->type), f->target, ms_culprit_kind_name(k), bound - 1);
    return -EINVAL;
  }
  return 0;
}

static int kind_bound(const struct ms_plan *p, enum ms_culprit_kind k, const struct bench_scenario *s,
                      int n_workers) {
  switch (k) {
  case MS_CULPRIT_TASK_CLASS: return p->n_classes;
  case MS_CULPRIT_EVENT_CLASS: return p->n_ev_classes;
  case MS_CULPRIT_REQUEST: return s->batch;
  case MS_CULPRIT_WORKER: return n_workers;
  case MS_CULPRIT_DEVICE: return s->tp > 1 ? s->tp : 0;
  case MS_CULPRIT_EXPERT: return p->model->cfg.n_experts;
  case MS_CULPRIT_LAYER: return p->model->cfg.n_layers;
  default: return 0;
  }
}

int bench_scenario_draw(struct bench_scenario *s, const struct ms_plan *p, int n_workers,
                        struct ms_textbuf *log) {
  size_t len = 0;
  s->drawn[0] = 0;
  for (int i = 0; i < s->n_faults; i++) {
    struct bench_fault *f = &s->faults[i];
    enum ms_culprit_kind k = ms_fault_culprit_kind(f->type);
    int bound = kind_bound(p, k, s, n_workers);
    uint64_t r = mix(s->seed * 31 + (uint64_t)i + 1);
    char what[128], name[80];
    snprintf(what, sizeof what, "scenario %s, fault %d", s->name, i);
    if (f->given & BF_TARGET) {
      if (resolve(f, p, bound, log, what)) return -EINVAL;
    } else {
      int limit = bound;
      if (k == MS_CULPRIT_WORKER) {
        /* workers that run the plan's tasks (AOT tasks are dealt round-robin: a
         * small model on many SMs leaves some idle, and an idle one cannot be slow) */
        int aot = 0;
        for (int t = 0; t < p->n_tasks; t++) aot += p->classes[p->tasks[t].cls].launch == MS_LAUNCH_AOT;
        if (aot > 0 && aot < limit) limit = bound = aot;
      }
      f->target_id = k == MS_CULPRIT_TASK_CLASS || k == MS_CULPRIT_EVENT_CLASS ? draw_from(&r, p, f->type, limit)
                                                                             : (bound > 0 ? pick(&r, bound) : -1);
      if (f->target_id < 0) {
        ms_textbuf_printf(log, "%s: this plan has no %s for %s\n", what, ms_culprit_kind_name(k),
                          ms_fault_type_name(f->type));
        return -EINVAL;
      }
      bench_culprit_name(p, k, f->target_id, name, sizeof name);
      if (k == MS_CULPRIT_TASK_CLASS || k == MS_CULPRIT_EVENT_CLASS)
        snprintf(f->target, sizeof f->target, "%.63s", name);
      else
        snprintf(f->target, sizeof f->target, "%d", f->target_id);
      len += (size_t)snprintf(s->drawn + len, sizeof s->drawn - len, "%starget %s", len ? "; " : "", name);
    }
    if (f->type == MS_FAULT_STARVE_TASK && !(f->given & BF_TILE)) {
      f->tile = pick(&r, p->classes[f->target_id].n_tasks);
      len += (size_t)snprintf(s->drawn + len, sizeof s->drawn - len, "%stile %d", len ? "; " : "", f->tile);
    }
    if (!(f->given & BF_MAGNITUDE) && f->severity <= 0) {
      f->severity = uniform(&r, 0.4, 0.9);
      len += (size_t)snprintf(s->drawn + len, sizeof s->drawn - len, "%sseverity %.2f of the %g%% target",
                              len ? "; " : "", f->severity, s->target * 100);
    }
    if (len >= sizeof s->drawn) len = sizeof s->drawn - 1;
  }
  struct bench_interfere_spec *in = &s->intf;
  if (in->kind != BI_NONE) {
    uint64_t r = mix(s->seed * 31 + 97);
    int who = in->kind == BI_SPIN || in->kind == BI_PREEMPT;
    if (in->kind == BI_LONG_CONTEXT && in->slot < 0) {
      in->slot = pick(&r, s->batch);
      len += (size_t)snprintf(s->drawn + len, sizeof s->drawn - len, "%slong request in slot %d", len ? "; " : "",
                              in->slot);
    }
    /* beside a rank: one of its device's workers */
    int among = (in->given & BI_GIVEN_RANK) && s->tp > 1 ? n_workers / s->tp : n_workers;
    if (who && in->worker < 0) {
      in->worker = pick(&r, among);
      len += (size_t)snprintf(s->drawn + len, sizeof s->drawn - len, "%s%s on worker %d's CPU", len ? "; " : "",
                              bench_interference_name(in->kind), in->worker);
    }
    if (len >= sizeof s->drawn) len = sizeof s->drawn - 1;
    if ((who && in->worker >= among) || (in->kind == BI_LONG_CONTEXT && in->slot >= s->batch)) {
      ms_textbuf_printf(log, "scenario %s: %s names no %s of this engine\n", s->name, bench_interference_name(in->kind),
                        who ? "worker" : "request slot");
      return -EINVAL;
    }
    int tuned = (who && !(in->given & BI_GIVEN_SHARE)) || (in->kind == BI_LONG_CONTEXT && !(in->given & BI_GIVEN_TOKENS));
    if (tuned && in->severity <= 0) {
      in->severity = uniform(&r, 0.4, 0.9);
      len += (size_t)snprintf(s->drawn + len, sizeof s->drawn - len, "%sseverity %.2f of the %g%% target",
                              len ? "; " : "", in->severity, s->target * 100);
    }
  }
  return 0;
}

/* ---- megascope run --fault ---- */

int bench_fault_spec(const char *spec, struct bench_fault *f, struct ms_textbuf *log) {
  char buf[160], *save = NULL;
  memset(f, 0, sizeof *f);
  if (strlen(spec) >= sizeof buf) {
    ms_textbuf_printf(log, "--fault '%.40s...': too long\n", spec);
    return -EINVAL;
  }
  snprintf(buf, sizeof buf, "%s", spec);
  char *type = strtok_r(buf, ":", &save), *target = strtok_r(NULL, ":", &save), *mag = strtok_r(NULL, ":", &save);
  if (!type || !target || !mag || strtok_r(NULL, ":", &save) || ms_fault_type_parse(type, &f->type)) {
    char types[512];
    size_t len = 0;
    for (int t = 0; t < MS_FAULT_TYPE_COUNT && len < sizeof types; t++)
      len += (size_t)snprintf(types + len, sizeof types - len, "%s%s", t ? ", " : "",
                              ms_fault_type_name((enum ms_fault_type)t));
    ms_textbuf_printf(log, "--fault '%s': expected TYPE:TARGET:MAGNITUDE, e.g. slow_class:blk.3.wo:2.5 or "
                           "delayed_release:rope->attn:20us (types: %s)\n", spec, types);
    return -EINVAL;
  }
  char *at = strchr(target, '@');
  if (at) {
    *at = 0;
    f->tile = atoi(at + 1);
    f->given |= BF_TILE;
  }
  snprintf(f->target, sizeof f->target, "%s", target);
  char *end;
  double v = strtod(mag, &end);
  double unit = !strcmp(end, "us") ? 1e3 : !strcmp(end, "ms") ? 1e6 : !strcmp(end, "ns") || !*end ? 1 : -1;
  if (end == mag || unit < 0 || !(v >= 0) || (ms_fault_uses_factor(f->type) && *end)) {
    ms_textbuf_printf(log, "--fault '%s': magnitude '%s': a factor for %s%s\n", spec, mag, type,
                      ms_fault_uses_factor(f->type) ? "" : ", or a delay in ns, us or ms");
    return -EINVAL;
  }
  f->magnitude = v * (ms_fault_uses_factor(f->type) ? 1 : unit);
  f->given |= BF_TARGET | BF_MAGNITUDE;
  return 0;
}

int bench_fault_resolve(struct bench_fault *f, const struct ms_plan *p, int n_workers, int batch, int tp,
                        struct ms_fault *out, struct ms_textbuf *log) {
  struct bench_scenario s = {.batch = batch, .tp = tp};
  int bound = kind_bound(p, ms_fault_culprit_kind(f->type), &s, n_workers);
  if (resolve(f, p, bound, log, "--fault")) return -EINVAL;
  *out = (struct ms_fault){.type = f->type, .target = f->target_id, .tile = f->tile};
  if (ms_fault_uses_factor(f->type))
    out->factor = f->magnitude;
  else
    out->delay_ns = (uint64_t)f->magnitude;
  return 0;
}
