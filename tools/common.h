/* SPDX-License-Identifier: MIT */
/* Options and helpers the subcommands share: choosing a model, printing errors. */
#ifndef MS_TOOLS_COMMON_H
#define MS_TOOLS_COMMON_H

#include <stdint.h>

#include "megascope/model.h"

struct cli_model {
  const char *preset;   /* --synthetic */
  const char *dtype;    /* --dtype */
  uint64_t seed;        /* --model-seed */
};

#define CLI_MODEL_HELP                                                              \
  "  --synthetic PRESET   synthetic model: tiny, tiny-qwen3, tiny-moe, smollm2-135m\n" \
  "  --dtype T            weight type: f32 (default) or bf16\n"                      \
  "  --model-seed N       seed of the synthetic weights (default 1)\n"

/* Returns 1 when the option was a model option (consuming optarg). */
int cli_model_opt(struct cli_model *cm, const char *name, const char *arg);
/* Loads the model; prints the reason and returns NULL on failure. */
struct ms_model *cli_model_load(const struct cli_model *cm);

/* Strict integer parsing for option values: prints an error naming the option. */
int cli_int(const char *opt, const char *s, long lo, long hi, long *out);
int cli_u64(const char *opt, const char *s, uint64_t *out);

#endif
