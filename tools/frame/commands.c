/* SPDX-License-Identifier: MIT */
/* The commands of `megascope`, in the order --help lists them: the one place a
 * command is named and summed up (cli.h says what else reads this table). */
#include <stddef.h>

#include "cli.h"

static const struct cli_cmd top_cmds[] = {
    CLI_CMD("compile", NULL, "compile a model's decode step into a task graph (plan)", cmd_compile),
    CLI_CMD("run", NULL, "run decode steps in the persistent megakernel runtime", cmd_run),
    CLI_SUB("model", "model files: write synthetic GGUF, inspect, tokenize, logits", &model_group),
    CLI_SUB("bench", "benchmarks (decode: megakernel vs per-op vs bandwidth bound)", &bench_group),
    CLI_SUB("bpf", "eBPF tools (conformance suite, assembler, disassembler)", &bpf_group),
    CLI_CMD("verify", NULL, "verify an eBPF monitor object against the hook ABI", cmd_verify),
    CLI_CMD("hooks", NULL, "the hook ABI: program types, hooks and their fields, the context's layout", cmd_hooks),
    CLI_CMD("cuda", NULL, "the CUDA backend: device info, run, task bodies vs CPU twins, bench", cmd_cuda),
    CLI_CMD("serve", NULL, "run the engine as a server: HTTP completions, /metrics, control socket, OTLP", cmd_serve),
    CLI_CMD("attach", NULL, "attach a monitor to a running engine (control socket)", cmd_ctl),
    CLI_CMD("replace", NULL, "replace an attachment's monitor in a running engine", cmd_ctl),
    CLI_CMD("detach", NULL, "detach a monitor from a running engine", cmd_ctl),
    CLI_CMD("ls", NULL, "list a running engine's attachments with their coverage", cmd_ctl),
    CLI_CMD("maps", NULL, "print an attachment's maps, decoded, with coverage", cmd_ctl),
    CLI_CMD("schema", NULL, "print a running engine's task schema", cmd_ctl),
    CLI_CMD("stats", NULL, "print a running engine's (or replicas', summed) steps, tokens, TTFT and TPOT", cmd_ctl),
    CLI_CMD("trace", NULL, "record a running engine's task trace (Chrome JSON for Perfetto)", cmd_ctl),
    CLI_CMD("records", NULL, "stream an attachment's ring-buffer records, decoded", cmd_records),
    CLI_CMD("cflags", NULL, "clang flags for compiling a monitor", cmd_cflags),
    CLI_CMD("query", NULL, "ask a running engine (or replicas, merged) a question in one line (a verified monitor)",
            cmd_query),
    CLI_CMD("explain", NULL, "which class, layer, worker, request or CPU makes steps slow, with raw evidence for it",
            cmd_explain),
    CLI_CMD("interfere", NULL, "real interference: a noisy neighbour, a memory hog, preemption, a cold model",
            cmd_interfere),
    {0}};

const struct cli_group cli_top = {
    .path = "megascope", .noun = "command", .one = "a command", .width = 10, .help_word = 1, .cmds = top_cmds};
