/* SPDX-License-Identifier: MIT */
/* The control protocol's commands and their request fields (megascope/control.h):
 * the server's dispatch and field checks (commands.c) and the CLI's requests
 * (tools/observer/cmd_ctl.c, the query client) read this one table. */
#include <string.h>

#include "megascope/control.h"

#define FIELDS(...) ((const char *const[]){__VA_ARGS__, NULL})
#define NO_FIELDS ((const char *const[]){NULL})
#define BUDGET "max_per_step", "sample", "ringbuf_bytes", "interpret"

const struct ms_control_command ms_control_commands[] = {
    {"info", NO_FIELDS},
    {"attach", FIELDS("object", "name", BUDGET)},
    {"replace", FIELDS("id", "object", "name", BUDGET)},
    {"detach", FIELDS("id")},
    {"list", FIELDS("id")},
    {"maps", FIELDS("id", "fds", "release", "rank")},
    {"schema", FIELDS("rows")},
    {"stats", FIELDS("recent")},
    {"trace", FIELDS("seconds", "records_per_worker", "format", "max_events", "max_bytes")},
    {"records", FIELDS("id", "rank")},
};
const int ms_control_n_commands = (int)(sizeof ms_control_commands / sizeof ms_control_commands[0]);

const struct ms_control_command *ms_control_command_find(const char *name) {
  for (int i = 0; name && i < ms_control_n_commands; i++)
    if (!strcmp(ms_control_commands[i].name, name)) return &ms_control_commands[i];
  return NULL;
}

int ms_control_command_takes(const char *cmd, const char *field) {
  const struct ms_control_command *c = ms_control_command_find(cmd);
  for (int i = 0; c && c->fields[i]; i++)
    if (!strcmp(c->fields[i], field)) return 1;
  return 0;
}
