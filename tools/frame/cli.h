/* SPDX-License-Identifier: MIT */
/* The megascope CLI: one file per subcommand, each an entry `int cmd_X(argc, argv)`
 * where argv[0] is the subcommand's name. The CLI alone owns stderr and exit codes:
 * 0 success, 1 the work failed (a check, a rejection), 2 a usage error. */
#ifndef MS_TOOLS_CLI_H
#define MS_TOOLS_CLI_H

int cmd_compile(int argc, char **argv);
int cmd_run(int argc, char **argv);
int cmd_model(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_bpf(int argc, char **argv);
int cmd_verify(int argc, char **argv);
int cmd_serve(int argc, char **argv);
int cmd_cuda(int argc, char **argv);
int cmd_attach(int argc, char **argv);
int cmd_replace(int argc, char **argv);
int cmd_detach(int argc, char **argv);
int cmd_ls(int argc, char **argv);
int cmd_maps(int argc, char **argv);
int cmd_schema(int argc, char **argv);
int cmd_stats(int argc, char **argv);
int cmd_trace(int argc, char **argv);
int cmd_records(int argc, char **argv);
int cmd_cflags(int argc, char **argv);
int cmd_query(int argc, char **argv);
int cmd_explain(int argc, char **argv);
int cmd_interfere(int argc, char **argv);
int cmd_hooks(int argc, char **argv);
int bench_hooks(int argc, char **argv);
int bench_attach(int argc, char **argv);
int bench_sim(int argc, char **argv);
int bench_prefill(int argc, char **argv);
int bench_diagnose_main(int argc, char **argv);

/* Installs a log sink that prints "megascope: LEVEL: msg" on stderr. */
void cli_log_init(int verbose);

#endif
