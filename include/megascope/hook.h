/* SPDX-License-Identifier: MIT */
/* The semantic hook ABI as the engine and the verifier see it: hook and field
 * tables derived from include/megascope/bpf/megascope.h (the monitor authors'
 * header), parsing of program section names. */
#ifndef MEGASCOPE_HOOK_H
#define MEGASCOPE_HOOK_H

#include <stddef.h>
#include <stdint.h>

#include "megascope/bpf/megascope.h"
#include "megascope/verifier.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Every context field, indexed by enum ms_hook_field. */
extern const struct ms_verify_field ms_hook_fields[MS_F_COUNT];
/* The fields each hook defines: bit f of ms_hook_field_mask[hook] for field f. */
extern const uint64_t ms_hook_field_mask[MS_HOOK_COUNT];

const char *ms_hook_name(int hook);           /* "task_end"; "?" when unknown */
int ms_hook_parse(const char *name);          /* hook id or -1 */
const char *ms_prog_type_name(int type);      /* "observe" / "sched_hint" */

/* The ABI described in words, from the same tables (`megascope hooks`, which
 * generates docs/hooks.md's tables): when a hook fires, a field's C type in
 * the monitor authors' header ("__u32", "__s32", "__u64"), its meaning, and
 * the ABI version that added it. "?" (or 0) out of range. */
const char *ms_hook_fires(int hook);
const char *ms_hook_field_type(int field);
const char *ms_hook_field_meaning(int field);
int ms_hook_field_version(int field);

/* The instructions one hook run may execute, counted alike by every engine
 * (the interpreter, the JIT, the device interpreter): each instruction
 * executed, lddw once. The verifier refuses a hook program that could execute
 * more, so a verified program never stops for budget. */
#define MS_HOOK_RUN_BUDGET 100000u

/* The highest priority a sched_hint program returns (0..MS_SCHED_HINT_MAX):
 * the engines keep a JIT queue per priority. */
#define MS_SCHED_HINT_MAX 7

/* What a program of type `type` on hook `hook` may read, call, write and
 * return, for the verifier (ms_verify_opts.ctx): the context's fields and the
 * ones the hook defines, this ABI's version and run budget, and for sched_hint
 * its helpers, its return range, no map writes, and a refusal anywhere but
 * task_ready. Static; NULL for an unknown type or hook. */
const struct ms_verify_ctx *ms_hook_verify_ctx(int type, int hook);

/* Parses "megascope/<type>/<hook>"; 0, or -EINVAL with a reason in why[]. A
 * sched_hint program is valid only on task_ready. */
int ms_hook_parse_section(const char *section, int *type, int *hook, char *why, size_t why_size);

#ifdef __cplusplus
}
#endif
#endif
