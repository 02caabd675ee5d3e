/* SPDX-License-Identifier: MIT */
/* The megascope CLI's commands, declared once: a table of rows (name, what it
 * takes, a one-line summary, and either a handler or a group of subcommands),
 * from which the frame dispatches (cli_dispatch), writes every group's --help
 * (cli_group_usage) and writes docs/commands.md's list (cli_markdown,
 * `megascope help --markdown`). The top-level table is cli_top (commands.c);
 * a command with subcommands (bench, model, bpf) keeps its group in its own
 * file, and its row in cli_top points at it.
 *
 * A handler is `int fn(argc, argv)` with argv[0] the command's own name. The
 * CLI alone owns stderr and exit codes: 0 success, 1 the work failed (a check,
 * a rejection), 2 a usage error. */
#ifndef MS_TOOLS_CLI_H
#define MS_TOOLS_CLI_H

#include <stdio.h>

struct cli_group;

struct cli_cmd {
  const char *name;
  const char *args;     /* what it takes, listed when its group has args_width */
  const char *summary;  /* one line */
  int (*fn)(int argc, char **argv);
  const struct cli_group *sub;  /* instead of fn: a group of subcommands */
};

#define CLI_CMD(n, a, s, f) {.name = n, .args = a, .summary = s, .fn = f}
#define CLI_SUB(n, s, g) {.name = n, .summary = s, .sub = g}

struct cli_group {
  const char *path;    /* "megascope", "megascope bench": in usage and errors */
  const char *noun;    /* "command", "benchmark": "<noun>" in the usage, "nouns:" over the list */
  const char *one;     /* the usage's last line: "'<path> <noun> --help' describes <one>." */
  int width;           /* the name column */
  int args_width;      /* the args column; 0: none */
  int help_word;       /* 1: `<path> help` is --help too */
  const struct cli_cmd *cmds;  /* ended by {0} */
};

/* argv[0] is the group's command; argv[1] names a row. Runs it with argv + 1;
 * --help, -h (and `help` where help_word): the usage on stdout, 0; nothing or an
 * unknown name: the usage on stderr, 2. */
int cli_dispatch(const struct cli_group *g, int argc, char **argv);
void cli_group_usage(FILE *f, const struct cli_group *g);
/* Every command and subcommand as a Markdown table, between the markers that
 * docs/commands.md carries (tests/cli_commands.sh compares the two). */
void cli_markdown(FILE *f, const struct cli_group *g);

extern const struct cli_group cli_top;  /* commands.c */
extern const struct cli_group bench_group;  /* benchmarks/cmd_bench.c */
extern const struct cli_group model_group;  /* engine/cmd_model.c */
extern const struct cli_group bpf_group;    /* observer/cmd_bpf.c */

/* The handlers the tables name, by folder. */
int cmd_compile(int argc, char **argv);
int cmd_run(int argc, char **argv);
int cmd_serve(int argc, char **argv);
int cmd_cuda(int argc, char **argv);
int cmd_verify(int argc, char **argv);
int cmd_hooks(int argc, char **argv);
int cmd_ctl(int argc, char **argv); /* attach, replace, detach, ls, maps, schema, stats, trace */
int cmd_records(int argc, char **argv);
int cmd_cflags(int argc, char **argv);
int cmd_query(int argc, char **argv);
int cmd_explain(int argc, char **argv);
int cmd_interfere(int argc, char **argv);
int bench_hooks(int argc, char **argv);
int bench_attach(int argc, char **argv);
int bench_sim(int argc, char **argv);
int bench_prefill(int argc, char **argv);
int bench_diagnose_main(int argc, char **argv);

/* Installs a log sink that prints "megascope: LEVEL: msg" on stderr. */
void cli_log_init(int verbose);

#endif
