/* SPDX-License-Identifier: MIT */
/* megascope: the command-line front end. Dispatches by the command table
 * (commands.c); `megascope help --markdown` writes the table for the docs. */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "megascope/base.h"

static void log_to_stderr(void *user, enum ms_log_level level, const char *msg) {
  static const char *names[] = {"error", "warning", "info", "debug"};
  fprintf(stderr, "megascope: %s: %s\n", names[level], msg);
}

void cli_log_init(int verbose) {
  ms_log_set(log_to_stderr, NULL, verbose ? MS_LOG_DEBUG : MS_LOG_INFO);
}

int main(int argc, char **argv) {
  cli_log_init(0);
  if (argc == 3 && !strcmp(argv[1], "help") && !strcmp(argv[2], "--markdown")) {
    cli_markdown(stdout, &cli_top);
    return 0;
  }
  return cli_dispatch(&cli_top, argc, argv);
}
