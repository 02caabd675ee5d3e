/* SPDX-License-Identifier: MIT */
/* megascope: the command-line front end. Dispatches to one subcommand. */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "megascope/base.h"

/* The eBPF subcommand lives in its own file; until it is linked in, the command
 * reports itself unavailable. */
int cmd_bpf(int argc, char **argv) __attribute__((weak));

struct cli_cmd {
  const char *name;
  const char *summary;
  int (*fn)(int argc, char **argv);
};

static const struct cli_cmd cmds[] = {
    {"compile", "compile a model's decode step into a task graph (plan)", cmd_compile},
    {"run", "run decode steps in the persistent megakernel runtime", cmd_run},
    {"model", "model files: write synthetic GGUF, inspect, tokenize, logits", cmd_model},
    {"bench", "benchmarks (decode: megakernel vs per-op vs bandwidth bound)", cmd_bench},
    {"bpf", "eBPF tools (conformance suite, assembler, disassembler)", cmd_bpf},
    {"verify", "verify an eBPF monitor object against the hook ABI", cmd_verify},
    {"hooks", "the hook ABI: program types, hooks and their fields, the context's layout", cmd_hooks},
    {"cuda", "the CUDA backend: device info, run, task bodies vs CPU twins, bench", cmd_cuda},
    {"serve", "run the engine as a server: HTTP completions, /metrics, control socket, OTLP", cmd_serve},
    {"attach", "attach a monitor to a running engine (control socket)", cmd_attach},
    {"replace", "replace an attachment's monitor in a running engine", cmd_replace},
    {"detach", "detach a monitor from a running engine", cmd_detach},
    {"ls", "list a running engine's attachments with their coverage", cmd_ls},
    {"maps", "print an attachment's maps, decoded, with coverage", cmd_maps},
    {"schema", "print a running engine's task schema", cmd_schema},
    {"stats", "print a running engine's steps, tokens, TTFT and TPOT", cmd_stats},
    {"trace", "record a running engine's task trace (Chrome JSON for Perfetto)", cmd_trace},
    {"records", "stream an attachment's ring-buffer records, decoded", cmd_records}, {"cflags", "clang flags for compiling a monitor", cmd_cflags},
    {"query", "ask a running engine a question in one line (compiled to a verified monitor)", cmd_query},
    {"explain", "which task class explains the step time, with raw evidence for it alone", cmd_explain},
    {"interfere", "real interference: a noisy neighbour, a memory hog, preemption, a cold model", cmd_interfere},
};

static void usage(FILE *f) {
  fprintf(f, "usage: megascope <command> [options]\n\ncommands:\n");
  for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++)
    fprintf(f, "  %-10s %s\n", cmds[i].name, cmds[i].summary);
  fprintf(f, "\n'megascope <command> --help' describes a command.\n");
}

static void log_to_stderr(void *user, enum ms_log_level level, const char *msg) {
  static const char *names[] = {"error", "warning", "info", "debug"};
  fprintf(stderr, "megascope: %s: %s\n", names[level], msg);
}

void cli_log_init(int verbose) {
  ms_log_set(log_to_stderr, NULL, verbose ? MS_LOG_DEBUG : MS_LOG_INFO);
}

int main(int argc, char **argv) {
  cli_log_init(0);
  if (argc < 2) {
    usage(stderr);
    return 2;
  }
  if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
    usage(stdout);
    return 0;
  }
  for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++)
    if (!strcmp(argv[1], cmds[i].name)) {
      if (!cmds[i].fn) {
        fprintf(stderr, "megascope: '%s' is not available in this build\n", argv[1]);
        return 2;
      }
      return cmds[i].fn(argc - 1, argv + 1);
    }
  fprintf(stderr, "megascope: unknown command '%s'\n", argv[1]);
  usage(stderr);
  return 2;
}
