/* SPDX-License-Identifier: MIT */
/* Options and helpers the subcommands share: choosing a model, printing errors. */
#ifndef MS_TOOLS_COMMON_H
#define MS_TOOLS_COMMON_H

#include <stddef.h>
#include <stdint.h>

#include "megascope/model.h"

struct cli_model {
  const char *preset;   /* --synthetic */
  const char *dtype;    /* --dtype */
  uint64_t seed;        /* --model-seed */
  int shape_only;       /* set by the caller: shapes without weights (the simulator) */
  const char *path;     /* --model F.gguf */
};

#define CLI_MODEL_HELP                                                              \
  "  --synthetic PRESET   synthetic model: tiny, tiny-qwen3, tiny-qwen2, tiny-gemma3,\n" \
  "                       tiny-256, tiny-moe, smollm2-135m\n"                        \
  "  --dtype T            weight type: f32 (default) or bf16\n"                      \
  "  --model-seed N       seed of the synthetic weights (default 1)\n"                \
  "  --model F.gguf       a GGUF model file (llama, qwen2, qwen3 or gemma3; f32, f16,\n" \
  "                       bf16, q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl or K-quant\n"   \
  "                       weights) instead of --synthetic\n"

/* --q8-activations / --f32-activations, the same in every command that runs the
 * engine on a model (8-bit activations are the default). */
#define CLI_ACT_HELP                                                                          \
  "  --q8-activations     8-bit GEMV inputs and integer dot products for block-format\n"     \
  "                       weights (q8_0 .. the K-quants), as llama.cpp's CPU backend\n"     \
  "                       computes them (the default; logits within about 0.25 of the\n"   \
  "                       reference)\n"                                                    \
  "  --f32-activations    f32 GEMV inputs, the exact path (logits within 1e-3)\n"

#define CLI_ACT_OPTIONS {"q8-activations", no_argument, 0, 0}, {"f32-activations", no_argument, 0, 0}

/* 1 when name is --q8-activations (*q8 = 1) or --f32-activations (*q8 = 0). */
int cli_act_opt(const char *name, int *q8);

/* Returns 1 when the option was a model option (consuming optarg). */
int cli_model_opt(struct cli_model *cm, const char *name, const char *arg);
/* Loads the model; prints the reason and returns NULL on failure. */
struct ms_model *cli_model_load(const struct cli_model *cm);
struct ms_tokenizer;
/* Loads the model and its tokenizer: the file's own with --model, the
 * byte-level one for a synthetic model (*tok is NULL when its vocabulary is
 * under 256 ids). Prints the reason and returns NULL on failure. */
struct ms_model *cli_model_load_tok(const struct cli_model *cm, struct ms_tokenizer **tok);

/* Strict integer parsing for option values: prints an error naming the option. */
int cli_int(const char *opt, const char *s, long lo, long hi, long *out);
int cli_u64(const char *opt, const char *s, uint64_t *out);

struct ms_engine;
/* Generated tokens per second for `batch` one-token prompts of `steps` tokens
 * each, timed from submission to the last completion; -1 when the engine
 * refuses a request (the ones already submitted are waited for and freed). */
double cli_decode_tps(struct ms_engine *e, const struct ms_model *m, int batch, int steps);

/* The control socket as attach, maps and the rest find it (--socket, then
 * $MEGASCOPE_SOCKET, then the one engine socket in the default directory), and
 * one request to it: the parsed reply when it says ok, else NULL with the
 * engine's error and log printed (cmd_ctl.c). fds: up to MS_CONTROL_MAX_FDS
 * descriptors handed over, or NULL. */
typedef struct json_t json_t;
int cli_ctl_socket(const char *me, const char *given, char *buf, size_t size);
json_t *cli_ctl_call(const char *me, const char *path, const char *req, size_t len, int timeout_ms, int *fds,
                     int *n_fds);

/* The path of a shipped monitor object: <dir of this executable>/monitors/NAME. */
void cli_shipped_monitor(const char *name, char *buf, size_t n);

#endif
