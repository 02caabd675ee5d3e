/* SPDX-License-Identifier: MIT */
/* Hook and field tables of the semantic hook ABI (version MS_HOOK_ABI_VERSION). */
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "megascope/bpf.h"
#include "megascope/hook.h"

#define F(e, member) [e] = {#member, offsetof(struct ms_hook_ctx, member), sizeof(((struct ms_hook_ctx *)0)->member)}

const struct ms_verify_field ms_hook_fields[MS_F_COUNT] = {
    F(MS_F_ABI_VERSION, abi_version), F(MS_F_HOOK, hook), F(MS_F_NOW_NS, now_ns),
    F(MS_F_WORKER, worker), F(MS_F_DEVICE, device), F(MS_F_STEP, step),
    F(MS_F_BATCH_SIZE, batch_size), F(MS_F_BUCKET, bucket), F(MS_F_TASK_CLASS, task_class),
    F(MS_F_OP, op), F(MS_F_TASK_INDEX, task_index), F(MS_F_LAUNCH_MODE, launch_mode),
    F(MS_F_TASK_GEN, task_gen), F(MS_F_TILE_X, tile_x), F(MS_F_TILE_Y, tile_y),
    F(MS_F_TILE_Z, tile_z), F(MS_F_REQ_SLOT, req_slot), F(MS_F_REQ_GEN, req_gen),
    F(MS_F_CTX_LEN, ctx_len), F(MS_F_T_READY, t_ready), F(MS_F_T_BEGIN, t_begin),
    F(MS_F_T_END, t_end), F(MS_F_EVENT_ID, event_id), F(MS_F_EVENT_CLASS, event_class),
    F(MS_F_EVENT_NEEDED, event_needed), F(MS_F_WAIT_REASON, wait_reason),
    F(MS_F_EVENT_COUNT, event_count), F(MS_F_QUEUE_DEPTH, queue_depth),
    F(MS_F_QUEUE_THRESHOLD, queue_threshold), F(MS_F_PEER, peer), F(MS_F_COMM_PHASE, comm_phase),
    F(MS_F_COMM_GEN, comm_gen), F(MS_F_PHASE, phase), F(MS_F_TOKEN, token),
    F(MS_F_WAIT_NS, wait_ns), F(MS_F_QUEUE_KIND, queue_kind), F(MS_F_RESERVED0, reserved0),
    /* version 2 */
    F(MS_F_WORK_ROWS, work_rows), F(MS_F_PASSED_OVER, passed_over), F(MS_F_WORK_BYTES, work_bytes),
    F(MS_F_REMOTE_EVENT, remote_event), F(MS_F_REMOTE_DEVICE, remote_device),
    F(MS_F_REMOTE_GEN, remote_gen),
    /* version 3 */
    F(MS_F_PROMPT_TOKENS, prompt_tokens), F(MS_F_CACHED_TOKENS, cached_tokens),
};

/* The ABI is append-only: these pin version 1's layout and the fields
 * versions 2 and 3 appended (version 1 ended at 184 bytes, 2 at 216). */
_Static_assert(offsetof(struct ms_hook_ctx, task_gen) == 56, "hook ABI v1 layout");
_Static_assert(offsetof(struct ms_hook_ctx, event_count) == 128, "hook ABI v1 layout");
_Static_assert(offsetof(struct ms_hook_ctx, wait_ns) == 168, "hook ABI v1 layout");
_Static_assert(offsetof(struct ms_hook_ctx, reserved0) == 180, "hook ABI v1 layout");
_Static_assert(offsetof(struct ms_hook_ctx, work_rows) == 184, "hook ABI v2 layout");
_Static_assert(offsetof(struct ms_hook_ctx, work_bytes) == 192, "hook ABI v2 layout");
_Static_assert(offsetof(struct ms_hook_ctx, remote_event) == 200, "hook ABI v2 layout");
_Static_assert(offsetof(struct ms_hook_ctx, remote_gen) == 208, "hook ABI v2 layout");
_Static_assert(offsetof(struct ms_hook_ctx, prompt_tokens) == 216, "hook ABI v3 layout");
_Static_assert(offsetof(struct ms_hook_ctx, cached_tokens) == 220, "hook ABI v3 layout");
_Static_assert(sizeof(struct ms_hook_ctx) == 224, "hook ABI v3 size");
_Static_assert(MS_F_WORK_ROWS == MS_F_RESERVED0 + 1, "v2 fields follow v1's");
_Static_assert(MS_F_PROMPT_TOKENS == MS_F_REMOTE_GEN + 1, "v3 fields follow v2's");
_Static_assert(MS_F_COUNT <= 64, "field masks are 64-bit");

const uint64_t ms_hook_field_mask[MS_HOOK_COUNT] = {
    [MS_HOOK_TASK_READY] = MS_HOOK_FIELDS_TASK_READY,
    [MS_HOOK_TASK_ASSIGN] = MS_HOOK_FIELDS_TASK_ASSIGN,
    [MS_HOOK_TASK_BEGIN] = MS_HOOK_FIELDS_TASK_BEGIN,
    [MS_HOOK_TASK_END] = MS_HOOK_FIELDS_TASK_END,
    [MS_HOOK_DEP_WAIT] = MS_HOOK_FIELDS_DEP_WAIT,
    [MS_HOOK_DEP_RELEASE] = MS_HOOK_FIELDS_DEP_RELEASE,
    [MS_HOOK_COMM] = MS_HOOK_FIELDS_COMM,
    [MS_HOOK_STEP] = MS_HOOK_FIELDS_STEP,
    [MS_HOOK_REQUEST] = MS_HOOK_FIELDS_REQUEST,
    [MS_HOOK_QUEUE_PRESSURE] = MS_HOOK_FIELDS_QUEUE_PRESSURE,
};

static const char *const hook_names[MS_HOOK_COUNT] = {
    "task_ready", "task_assign", "task_begin", "task_end", "dep_wait",
    "dep_release", "comm", "step", "request", "queue_pressure",
};

/* When each hook fires (docs/hooks.md, `megascope hooks`). */
static const char *const hook_fires[MS_HOOK_COUNT] = {
    [MS_HOOK_TASK_READY] = "a task's event fired: it can run (fired by the worker whose trigger fired the event, once per successor; a sched_hint program here returns the task's JIT dispatch priority 0-7)",
    [MS_HOOK_TASK_ASSIGN] = "a task was placed on a worker queue: JIT tasks when dispatched (queue_depth: the priority queue it joined), AOT tasks when their worker starts the step (queue_depth: tasks left in its queue)",
    [MS_HOOK_TASK_BEGIN] = "a worker starts a task; the event fields name the event it waited on; wait_ns is how long this worker waited for it",
    [MS_HOOK_TASK_END] = "a worker finished a task (same fields as task_begin, plus t_end)",
    [MS_HOOK_DEP_WAIT] = "a worker reached a task whose event has not fired and starts waiting (wait_reason 0); or its queue is done and it waits for the step's end (wait_reason 1, no task fields)",
    [MS_HOOK_DEP_RELEASE] = "an event reached its count and releases its successors; the task fields name the producer whose trigger completed it",
    [MS_HOOK_COMM] = "a communication task of a tensor-parallel plan (`--tp N`, docs/benchmark.md) issues (phase 0, task start) or completes (phase 1, task end) its device's share of an all-gather; `device` is that device, `peer` the next one in the ring, `comm_gen` names the collective (step << 16 | communication class)",
    [MS_HOOK_STEP] = "a decode step begins (phase 0, after the step start published it) or ends (phase 1)",
    [MS_HOOK_REQUEST] = "a request is admitted (phase 0), emits its first token (1), a later token (2), or finishes (3)",
    [MS_HOOK_QUEUE_PRESSURE] = "a queue's depth crossed its declared threshold (64): the JIT dispatch queue (queue_kind 0) when a push reaches it, the request mailbox (1) at a step start",
};

/* Each field's C type and meaning (docs/hooks.md, `megascope hooks`). */
static const struct {
  const char *type, *meaning;
} field_doc[MS_F_COUNT] = {
    [MS_F_ABI_VERSION] = {"__u32", "MS_HOOK_ABI_VERSION of the engine"},
    [MS_F_HOOK] = {"__u32", "enum ms_hook_id"},
    [MS_F_NOW_NS] = {"__u64", "engine clock (simulated time on the sim backend)"},
    [MS_F_WORKER] = {"__u32", "worker (SM) index"},
    [MS_F_DEVICE] = {"__u32", "device index"},
    [MS_F_STEP] = {"__u64", "global decode step"},
    [MS_F_BATCH_SIZE] = {"__u32", "rows in the step"},
    [MS_F_BUCKET] = {"__u32", "rows of the step's plan"},
    [MS_F_TASK_CLASS] = {"__u32", "schema class id"},
    [MS_F_OP] = {"__u32", "kernel id"},
    [MS_F_TASK_INDEX] = {"__u32", "index in the plan"},
    [MS_F_LAUNCH_MODE] = {"__u32", "enum ms_launch_mode"},
    [MS_F_TASK_GEN] = {"__u64", "(step << 32) | task_index"},
    [MS_F_TILE_X] = {"__s32", "output column tile; attention: the part of the row's positions (0 unless the plan cuts it in parts, `ms_compile_opts.attn_parts`)"},
    [MS_F_TILE_Y] = {"__s32", "batch row, -1: all rows"},
    [MS_F_TILE_Z] = {"__s32", "kv head or expert, -1: none"},
    [MS_F_REQ_SLOT] = {"__u32", "request slot of the task's row (or the request), MS_HOOK_NONE32"},
    [MS_F_REQ_GEN] = {"__u32", "that slot's generation, MS_HOOK_NONE32"},
    [MS_F_CTX_LEN] = {"__u32", "positions of the row's request (attention context); 0 when unknown (late task hooks)"},
    [MS_F_T_READY] = {"__u64", "when the task's event fired (step start for the first tasks)"},
    [MS_F_T_BEGIN] = {"__u64", "when the task began"},
    [MS_F_T_END] = {"__u64", "when the task ended"},
    [MS_F_EVENT_ID] = {"__u32", "event index in the plan"},
    [MS_F_EVENT_CLASS] = {"__u32", "layer-free event class"},
    [MS_F_EVENT_NEEDED] = {"__u32", "triggers the event needs per step"},
    [MS_F_WAIT_REASON] = {"__u32", "enum ms_wait_reason"},
    [MS_F_EVENT_COUNT] = {"__u64", "triggers so far this step"},
    [MS_F_QUEUE_DEPTH] = {"__u32", "depth of the queue involved"},
    [MS_F_QUEUE_THRESHOLD] = {"__u32", "queue_pressure: the declared threshold"},
    [MS_F_PEER] = {"__u32", "comm: the next device in the ring"},
    [MS_F_COMM_PHASE] = {"__u32", "enum ms_comm_phase"},
    [MS_F_COMM_GEN] = {"__u64", "comm: the collective, (step << 16) | communication class"},
    [MS_F_PHASE] = {"__u32", "enum ms_step_phase / ms_request_phase"},
    [MS_F_TOKEN] = {"__u32", "request: the token emitted"},
    [MS_F_WAIT_NS] = {"__u64", "task_begin/task_end: time this worker waited for the task's event"},
    [MS_F_QUEUE_KIND] = {"__u32", "queue_pressure: enum ms_queue_kind"},
    [MS_F_RESERVED0] = {"__u32", "reserved, 0"},
    [MS_F_WORK_ROWS] = {"__u32", "rows (tokens) the task processes: an expert's routed rows, attention's positions (those it reads: a local layer's window at most, its part's share of them), a GEMV tile's live rows, 1 or 0 for a row's task"},
    [MS_F_PASSED_OVER] = {"__u32", "JIT tasks: other tasks taken from the JIT queues while it was ready; AOT: 0"},
    [MS_F_WORK_BYTES] = {"__u64", "bytes of weights and KV cache the task reads, `MS_HOOK_NONE64`: unknown"},
    [MS_F_REMOTE_EVENT] = {"__u32", "the remote producer's event, `MS_HOOK_NONE32`: none"},
    [MS_F_REMOTE_DEVICE] = {"__u32", "the device of that producer (comm: the peer), `MS_HOOK_NONE32`: none"},
    [MS_F_REMOTE_GEN] = {"__u64", "the step of that event's firing (its generation), 0: none"},
    [MS_F_PROMPT_TOKENS] = {"__u32", "request: its prompt's tokens"},
    [MS_F_CACHED_TOKENS] = {"__u32", "request: of them, the positions read from the prefix cache, not computed (the request's rows start there; 0 without a hit, and on the CUDA device, which keeps no prefix cache)"},
};

const char *ms_hook_fires(int hook) { return hook >= 0 && hook < MS_HOOK_COUNT ? hook_fires[hook] : "?"; }

const char *ms_hook_field_type(int f) { return f >= 0 && f < MS_F_COUNT ? field_doc[f].type : "?"; }

const char *ms_hook_field_meaning(int f) { return f >= 0 && f < MS_F_COUNT ? field_doc[f].meaning : "?"; }

int ms_hook_field_version(int f) { return f >= MS_F_PROMPT_TOKENS ? 3 : f >= MS_F_WORK_ROWS ? 2 : 1; }

const char *ms_hook_name(int hook) { return hook >= 0 && hook < MS_HOOK_COUNT ? hook_names[hook] : "?"; }

int ms_hook_parse(const char *name) {
  for (int h = 0; h < MS_HOOK_COUNT; h++)
    if (!strcmp(name, hook_names[h])) return h;
  return -1;
}

const char *ms_prog_type_name(int type) {
  return type == MS_PROG_OBSERVE ? "observe" : type == MS_PROG_SCHED_HINT ? "sched_hint" : "?";
}

/* sched_hint returns a priority and nothing else. */
static const uint32_t sched_hint_helpers[] = {MS_BPF_FN_MAP_LOOKUP_ELEM, MS_BPF_FN_KTIME_GET_NS,
                                              MS_BPF_FN_GET_SMP_PROCESSOR_ID, MS_HELPER_LOG2};
#define N_HINT_HELPERS (int)(sizeof sched_hint_helpers / sizeof sched_hint_helpers[0])

/* The verifier's view of each program type on each hook, from the tables
 * above: the same fields everywhere, the hook's mask, and for sched_hint its
 * restrictions (and, anywhere but task_ready, its refusal). */
#define CTX_COMMON(name, mask)                                                                         \
  .hook = name, .size = sizeof(struct ms_hook_ctx), .fields = ms_hook_fields, .n_fields = MS_F_COUNT, \
  .defined = (mask), .abi_version = MS_HOOK_ABI_VERSION, .run_budget = MS_HOOK_RUN_BUDGET
#define CTX(h, name, mask)                                                                              \
  [MS_PROG_OBSERVE][h] = {CTX_COMMON(name, mask), .prog_type = "observe"},                              \
  [MS_PROG_SCHED_HINT][h] = {                                                                           \
      CTX_COMMON(name, mask), .prog_type = "sched_hint", .helpers = sched_hint_helpers,                 \
      .n_helpers = N_HINT_HELPERS, .no_map_writes = 1, .ret_bounded = 1, .ret_max = MS_SCHED_HINT_MAX,      \
      .restricted_why = "a sched_hint program returns a priority and nothing else (no map updates, no " \
                        "ring buffer output)",                                                          \
      .refused = (h) == MS_HOOK_TASK_READY ? NULL                                                       \
                                           : "program type sched_hint is not allowed on hook " name     \
                                             ": sched_hint programs attach only to task_ready"}

static const struct ms_verify_ctx verify_ctx[MS_PROG_TYPE_COUNT][MS_HOOK_COUNT] = {
    CTX(MS_HOOK_TASK_READY, "task_ready", MS_HOOK_FIELDS_TASK_READY),
    CTX(MS_HOOK_TASK_ASSIGN, "task_assign", MS_HOOK_FIELDS_TASK_ASSIGN),
    CTX(MS_HOOK_TASK_BEGIN, "task_begin", MS_HOOK_FIELDS_TASK_BEGIN),
    CTX(MS_HOOK_TASK_END, "task_end", MS_HOOK_FIELDS_TASK_END),
    CTX(MS_HOOK_DEP_WAIT, "dep_wait", MS_HOOK_FIELDS_DEP_WAIT),
    CTX(MS_HOOK_DEP_RELEASE, "dep_release", MS_HOOK_FIELDS_DEP_RELEASE),
    CTX(MS_HOOK_COMM, "comm", MS_HOOK_FIELDS_COMM),
    CTX(MS_HOOK_STEP, "step", MS_HOOK_FIELDS_STEP),
    CTX(MS_HOOK_REQUEST, "request", MS_HOOK_FIELDS_REQUEST),
    CTX(MS_HOOK_QUEUE_PRESSURE, "queue_pressure", MS_HOOK_FIELDS_QUEUE_PRESSURE),
};

const struct ms_verify_ctx *ms_hook_verify_ctx(int type, int hook) {
  if (type < 0 || type >= MS_PROG_TYPE_COUNT || hook < 0 || hook >= MS_HOOK_COUNT) return NULL;
  return &verify_ctx[type][hook];
}

int ms_hook_parse_section(const char *section, int *type, int *hook, char *why, size_t why_size) {
  const char *prefix = "megascope/";
  if (!section || strncmp(section, prefix, strlen(prefix))) {
    snprintf(why, why_size, "section '%s' is not megascope/<observe|sched_hint>/<hook>", section ? section : "");
    return -EINVAL;
  }
  const char *t = section + strlen(prefix), *slash = strchr(t, '/');
  if (!slash) {
    snprintf(why, why_size, "section '%s' names no hook", section);
    return -EINVAL;
  }
  size_t tl = (size_t)(slash - t);
  if (tl == 7 && !strncmp(t, "observe", 7))
    *type = MS_PROG_OBSERVE;
  else if (tl == 10 && !strncmp(t, "sched_hint", 10))
    *type = MS_PROG_SCHED_HINT;
  else {
    snprintf(why, why_size, "section '%s': unknown program type '%.*s' (observe or sched_hint)", section, (int)tl, t);
    return -EINVAL;
  }
  *hook = ms_hook_parse(slash + 1);
  if (*hook < 0) {
    snprintf(why, why_size, "section '%s': unknown hook '%s'", section, slash + 1);
    return -EINVAL;
  }
  if (*type == MS_PROG_SCHED_HINT && *hook != MS_HOOK_TASK_READY) {
    snprintf(why, why_size, "section '%s': sched_hint programs attach only to task_ready", section);
    return -EINVAL;
  }
  return 0;
}
