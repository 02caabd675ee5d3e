/* SPDX-License-Identifier: MIT */
/* The language's reference tables, printed from the tables the compiler uses
 * (hooks and their fields from the hook ABI, the enums' names, the
 * aggregations), so that `megascope query --list` and docs/query.md cannot
 * drift from what compiles: a test compares the two. */
#include <stdio.h>

#include "query/query_impl.h"

static void enum_values(FILE *f, int field, int hook) {
  int any = 0;
  for (uint64_t v = 0; v < 16; v++) {
    const char *n = ms_query_enum_name(field, hook, v);
    if (n) fprintf(f, "%s`%s`", any++ ? ", " : "", n);
  }
}

int ms_query_write_reference(FILE *f) {
  fprintf(f, "| hook | fields |\n|---|---|\n");
  for (int h = 0; h < MS_HOOK_COUNT; h++) {
    fprintf(f, "| `%s` |", ms_hook_name(h));
    int any = 0;
    for (int i = 0; i < MS_F_COUNT; i++)
      if ((ms_hook_field_mask[h] & MS_FB(i)) && i != MS_F_RESERVED0)
        fprintf(f, "%s`%s`", any++ ? ", " : " ", ms_query_field_name(i));
    if (h == MS_HOOK_DEP_WAIT) fprintf(f, "; `wait_ns` (the wait seen when it ends: see below)");
    fprintf(f, " |\n");
  }
  fprintf(f, "\n| field | names it is compared with |\n|---|---|\n");
  fprintf(f, "| `class` | the schema's task classes (`blk.0.wo`, `lm_head`); `=~` takes a glob |\n");
  fprintf(f, "| `event_class` | the schema's event classes (`\"attn->wo\"`: quote names with `-` or `>`); `=~` |\n");
  fprintf(f, "| `op` | an op of the schema (`attn`, `wo`: the classes of that op) or a kernel (`gemv_residual`) |\n");
  fprintf(f, "| `hook` | ");
  enum_values(f, MS_F_HOOK, -1);
  fprintf(f, " |\n| `phase` | step: ");
  enum_values(f, MS_F_PHASE, MS_HOOK_STEP);
  fprintf(f, "; request: ");
  enum_values(f, MS_F_PHASE, MS_HOOK_REQUEST);
  static const int fields[] = {MS_F_WAIT_REASON, MS_F_LAUNCH_MODE, MS_F_QUEUE_KIND, MS_F_COMM_PHASE};
  for (size_t i = 0; i < sizeof fields / sizeof *fields; i++) {
    fprintf(f, " |\n| `%s` | ", ms_query_field_name(fields[i]));
    enum_values(f, fields[i], -1);
  }
  fprintf(f, " |\n");
  return ferror(f) ? -1 : 0;
}
