/* SPDX-License-Identifier: MIT */
/* The option groups several commands share (opt.h). */
#include "common.h"
#include "opt.h"

const struct cli_opt cli_model_opts[] = {
    CLI_OPT_STR(struct cli_model, preset, "synthetic", "PRESET",
                "synthetic model: tiny, tiny-qwen3, tiny-qwen2, tiny-gemma3,\n"
                "tiny-256, tiny-moe, smollm2-135m"),
    CLI_OPT_STR(struct cli_model, dtype, "dtype", "T", "weight type: f32 (default) or bf16"),
    CLI_OPT_U64(struct cli_model, seed, "model-seed", "N", "seed of the synthetic weights (default 1)"),
    CLI_OPT_STR(struct cli_model, path, "model", "F.gguf",
                "a GGUF model file (llama, qwen2, qwen3 or gemma3; f32, f16,\n"
                "bf16, q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl or K-quant\n"
                "weights) instead of --synthetic"),
    {0}};

/* Over one int: 1 for 8-bit activations, 0 for f32. */
const struct cli_opt cli_act_opts[] = {
    {.kind = CLI_FLAG, .name = "q8-activations", .set = 1,
     .help = "8-bit GEMV inputs and integer dot products for block-format\n"
             "weights (q8_0 .. the K-quants), as llama.cpp's CPU backend\n"
             "computes them (the default; logits within about 0.25 of the\n"
             "reference)"},
    {.kind = CLI_FLAG, .name = "f32-activations", .set = 0,
     .help = "f32 GEMV inputs, the exact path (logits within 1e-3)"},
    {0}};

/* Over one const char *: the control socket of a running engine. */
const struct cli_opt cli_socket_opts[] = {
    {.kind = CLI_STR, .name = "socket", .arg = "S",
     .help = "the engine's control socket (default: $MEGASCOPE_SOCKET, else\n"
             "the only engine-*.sock in the default directory)"},
    {0}};

const struct cli_opt cli_sockets_opts[] = {
    CLI_OPT_LIST(struct cli_sockets, path, n, "socket", "S",
                 "the engine's control socket (default: $MEGASCOPE_SOCKET, else\n"
                 "the only engine-*.sock in the default directory); give it again\n"
                 "for more engines (replicas): one answer, merged, with each\n"
                 "engine's part beside the total"),
    {0}};

const struct cli_opt cli_budget_opts[] = {
    CLI_OPT_INT(struct cli_budget, max_per_step, "max-per-step", "N", 0, 0xffffffffL,
                "budget: program runs per step per worker (0: no limit, the default)"),
    CLI_OPT_INT(struct cli_budget, sample, "sample", "N", 1, 0xffffffffL,
                "run 1 hook firing in N, chosen by task generation (default 1)"),
    CLI_OPT_U64(struct cli_budget, ringbuf_bytes, "ringbuf-bytes", "N",
                "budget: ring-buffer bytes per epoch (0: no limit, the default)"),
    CLI_OPT_FLAG(struct cli_budget, interp, "interp", "run the programs with the reference interpreter, not the JIT"),
    {0}};

/* Over one long: the engine's worker threads. */
const struct cli_opt cli_workers_opts[] = {
    {.kind = CLI_INT, .name = "workers", .arg = "N", .lo = 1, .hi = 1024,
     .help = "worker threads of each engine (default: one per core)"},
    {0}};

/* By enum ms_backend. */
static const char *const backend_names[] = {"cpu", "sim", "cuda", NULL};

const struct cli_opt cli_backend_opts[] = {
    CLI_OPT_CHOICE(struct cli_backend, backend, "backend", "B", backend_names,
                   "cpu (default: worker threads), sim (the deterministic virtual\n"
                   "GPU) or cuda (the persistent kernel on the GPU, fed a step at a\n"
                   "time; bf16 weights on the device)"),
    CLI_OPT_INT(struct cli_backend, sms, "sms", "N", 2, 1024,
                "cuda: CTAs of the persistent kernel, one a SM (default: every SM)"),
    {0}};
