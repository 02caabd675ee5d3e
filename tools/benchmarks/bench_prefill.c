/* SPDX-License-Identifier: MIT */
/* megascope bench prefill: time to first token with chunked prefill against
 * one position per step, in one run. Two engines on the same model live side
 * by side (an idle one sleeps on its futexes); each round asks both, in
 * alternating order, for one token after a prompt of each length, so drift in
 * the machine's speed falls on both. Reported: the median and best TTFT of
 * each, their ratio, and prompt tokens per second. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "common.h"
#include "opt.h"
#include "megascope/engine.h"
#include "megascope/json.h"

#define MAX_LENS 8
#define MAX_ROUNDS 64

/* Seconds from submit to the first token of one request of `len` prompt tokens. */
static double ttft(struct ms_engine *e, const struct ms_model *m, int len) {
  int32_t *p = malloc((size_t)len * sizeof *p);
  if (!p) return -1;
  for (int i = 0; i < len; i++) p[i] = (int32_t)((i * 7919u + 13u) % (unsigned)m->cfg.vocab);
  struct ms_request_opts ro = {.sz = sizeof ro, .prompt = p, .n_prompt = len, .max_new_tokens = 1};
  struct ms_request *r = ms_engine_submit(e, &ro);
  free(p);
  double s = -1;
  if (r && !ms_request_wait(r, -1)) {
    struct ms_request_info info;
    ms_request_get_info(r, &info);
    if (info.t_first) s = (double)(info.t_first - info.t_submit) / 1e9;
  }
  ms_request_free(r);
  return s;
}

struct prefill_args {
  struct cli_model cm;
  int lens[MAX_LENS], n_lens, q8, as_json, only;
  long mbt, rounds, workers, attn_parts;
};

/* --prompts L,L,...: every length checked, no more than MAX_LENS. */
static int lens_opt(void *dst, const char *s) {
  struct prefill_args *a = dst;
  int n = 0, rc = 0;
  char *copy = strdup(s), *save = NULL;
  if (!copy) return -1;
  for (char *t = strtok_r(copy, ",", &save); t && !rc; t = strtok_r(NULL, ",", &save)) {
    long v;
    if (n == MAX_LENS) {
      fprintf(stderr, "megascope bench prefill: --prompts '%s': at most %d lengths\n", s, MAX_LENS);
      rc = -1;
    } else if (cli_int("--prompts", t, 1, 1 << 16, &v)) {
      rc = -1;
    } else {
      a->lens[n++] = (int)v;
    }
  }
  free(copy);
  if (!rc && !n) {
    fprintf(stderr, "megascope bench prefill: --prompts '%s': no length\n", s);
    rc = -1;
  }
  if (!rc) a->n_lens = n;
  return rc;
}

#define PA struct prefill_args
static const struct cli_opt prefill_opts[] = {
    CLI_OPT_GROUP(PA, cm, cli_model_opts),
    CLI_OPT_FN("prompts", "L,L,...", lens_opt, "prompt lengths in tokens (default 32,128,512; at most 8)"),
    CLI_OPT_INT(PA, mbt, "max-batched-tokens", "N", 2, 4096, "the chunked engine's token budget per step (default 64)"),
    CLI_OPT_INT(PA, rounds, "rounds", "N", 1, MAX_ROUNDS, "measurements per length and engine (default 3)"),
    CLI_OPT_FLAG(PA, only, "chunked-only", "measure the chunked engine alone (e.g. against another engine)"),
    CLI_OPT_GROUP(PA, workers, cli_workers_opts),
    CLI_OPT_INT(PA, attn_parts, "attn-parts", "N", 1, MS_ATTN_MAX_PARTS,
                "each row's attention over a KV group in N tasks (run --attn-parts;\n"
                "default: the backend's, 2 on the CPU)"),
    CLI_OPT_GROUP(PA, q8, cli_act_opts),
    CLI_OPT_FLAG(PA, as_json, "json", "one JSON object"),
    {0}};
#undef PA

static const char prefill_head[] =
    "usage: megascope bench prefill (--synthetic PRESET | --model F.gguf) [options]\n\n"
    "Time to first token for prompts of several lengths: chunked prefill (--max-batched-tokens)\n"
    "against one prompt position per decode step, alternating the two engines in one run.\n\n";

int bench_prefill(int argc, char **argv) {
  struct prefill_args a = {.lens = {32, 128, 512}, .n_lens = 3, .q8 = 1, .mbt = 64, .rounds = 3};
  int prc = cli_parse("bench prefill", prefill_head, prefill_opts, &a, argc, argv, NULL);
  if (prc) return prc > 0 ? 0 : 2;
  struct cli_model cm = a.cm;
  int *lens = a.lens, n_lens = a.n_lens, q8 = a.q8, as_json = a.as_json, only = a.only;
  long mbt = a.mbt, rounds = a.rounds, workers = a.workers;
  struct ms_model *m = cli_model_load(&cm);
  if (!m) return 2;
  int longest = 0;
  for (int i = 0; i < n_lens; i++) longest = lens[i] > longest ? lens[i] : longest;
  struct ms_engine *e[2] = {0};
  char lb[2048] = "";
  struct ms_textbuf log = {lb, sizeof lb, 0, 0};
  int rc = 1;
  for (int k = only; k < 2; k++) {  /* 0: one position per step, 1: chunked */
    struct ms_engine_opts eo = {.sz = sizeof eo, .n_workers = (int)workers, .max_batch = 1,
                                .max_ctx = longest + 2, .q8_activations = q8,
                                .max_batched_tokens = k ? (int)mbt : 0, .attn_parts = (int)a.attn_parts};
    if (!as_json) fprintf(stderr, "bench prefill: starting the %s engine%s\n", k ? "chunked" : "per-step",
                          k ? " (compiling its prefill plans)" : "");
    if (!(e[k] = ms_engine_new(m, &eo, &log))) {
      fprintf(stderr, "megascope bench prefill: %s", lb);
      goto out;
    }
  }
  double t[MAX_LENS][2][MAX_ROUNDS];
  for (int r = 0; r < rounds; r++)
    for (int i = 0; i < n_lens; i++)
      for (int j = 0; j < 2; j++) {
        int k = (r + i + j) % 2;  /* alternate which engine goes first */
        if (!e[k]) continue;
        if ((t[i][k][r] = ttft(e[k], m, lens[i])) < 0) {
          fprintf(stderr, "megascope bench prefill: a request of %d tokens failed\n", lens[i]);
          goto out;
        }
        if (!as_json) fprintf(stderr, "  round %d, %d tokens, %s: %.1f ms\n", r + 1, lens[i],
                              k ? "chunked" : "per-step", t[i][k][r] * 1e3);
      }
  struct ms_json j;
  ms_json_init(&j, stdout, 0);
  if (as_json) {
    ms_json_obj_begin(&j);
    ms_json_kstr(&j, "model", m->cfg.name);
    ms_json_kint(&j, "workers", ms_engine_n_workers(e[1]));
    ms_json_kint(&j, "max_batched_tokens", mbt);
    ms_json_kint(&j, "rounds", rounds);
    ms_json_kbool(&j, "q8_activations", q8);
    ms_json_key(&j, "prompts");
    ms_json_arr_begin(&j);
  } else {
    printf("%s, %d workers, chunked prefill at %ld tokens per step against one position per step\n",
           m->cfg.name, ms_engine_n_workers(e[1]), mbt);
    printf("%8s  %14s  %14s  %7s  %16s\n", "prompt", "per-step ms", "chunked ms", "ratio", "chunked tok/s");
  }
  for (int i = 0; i < n_lens; i++) {
    double best[2], med[2];
    for (int k = 0; k < 2; k++) {
      med[k] = e[k] ? cli_median(t[i][k], (int)rounds) : NAN;
      best[k] = e[k] ? t[i][k][0] : NAN;  /* sorted by cli_median() */
    }
    if (as_json) {
      ms_json_obj_begin(&j);
      ms_json_kint(&j, "tokens", lens[i]);
      ms_json_knum(&j, "per_step_ttft_ms_median", med[0] * 1e3);
      ms_json_knum(&j, "per_step_ttft_ms_best", best[0] * 1e3);
      ms_json_knum(&j, "chunked_ttft_ms_median", med[1] * 1e3);
      ms_json_knum(&j, "chunked_ttft_ms_best", best[1] * 1e3);
      ms_json_knum(&j, "speedup_median", med[0] / med[1]);
      ms_json_knum(&j, "chunked_prompt_tokens_per_s", lens[i] / med[1]);
      ms_json_knum(&j, "per_step_prompt_tokens_per_s", lens[i] / med[0]);
      ms_json_obj_end(&j);
    } else {
      printf("%8d  %6.1f (%5.1f)  %6.1f (%5.1f)  %6.2fx  %16.0f\n", lens[i], med[0] * 1e3, best[0] * 1e3,
             med[1] * 1e3, best[1] * 1e3, med[0] / med[1], lens[i] / med[1]);
    }
  }
  if (as_json) {
    ms_json_arr_end(&j);
    ms_json_obj_end(&j);
    ms_json_end(&j);
  } else {
    printf("(median of %ld rounds, best in brackets; ratio = per-step / chunked)\n", rounds);
  }
  rc = 0;
out:
  ms_engine_free(e[0]);
  ms_engine_free(e[1]);
  ms_model_free(m);
  return rc;
}
