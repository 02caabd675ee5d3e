/* SPDX-License-Identifier: MIT */
/* The semantic hook ABI as the engine and the verifier see it: hook and field
 * tables derived from include/megascope/bpf/megascope.h (the monitor authors'
 * header), parsing of program section names. */
#ifndef MEGASCOPE_HOOK_H
#define MEGASCOPE_HOOK_H

#include <stddef.h>
#include <stdint.h>

#include "megascope/bpf/megascope.h"

#ifdef __cplusplus
extern "C" {
#endif

struct ms_hook_field_desc {
  const char *name;
  uint32_t offset, size;
};

/* Every context field, indexed by enum ms_hook_field. */
extern const struct ms_hook_field_desc ms_hook_fields[MS_F_COUNT];
/* The fields each hook defines: bit f of ms_hook_field_mask[hook] for field f. */
extern const uint64_t ms_hook_field_mask[MS_HOOK_COUNT];

const char *ms_hook_name(int hook);           /* "task_end"; "?" when unknown */
int ms_hook_parse(const char *name);          /* hook id or -1 */
const char *ms_prog_type_name(int type);      /* "observe" / "sched_hint" */

/* The instructions one hook run may execute, counted alike by every engine
 * (the interpreter, the JIT, the device interpreter): each instruction
 * executed, lddw once. The verifier refuses a hook program that could execute
 * more, so a verified program never stops for budget. */
#define MS_HOOK_RUN_BUDGET 100000u

/* The ABI's helper sets: 1 when a program of this type may call helper id.
 * observe: every helper of the table; sched_hint: map_lookup_elem,
 * ktime_get_ns, get_smp_processor_id and ms_log2 (no map updates, no ring
 * buffer output: it returns a priority and nothing else). */
int ms_prog_type_helper_allowed(int type, uint32_t helper);

/* The field covering [off, off + size) of the context, if the access lies inside
 * one field: returns its index, or -1 (straddles fields, or outside the struct). */
int ms_hook_field_at(uint32_t off, uint32_t size);

/* Parses "megascope/<type>/<hook>"; 0, or -EINVAL with a reason in why[]. A
 * sched_hint program is valid only on task_ready. */
int ms_hook_parse_section(const char *section, int *type, int *hook, char *why, size_t why_size);

#ifdef __cplusplus
}
#endif
#endif
