/* SPDX-License-Identifier: MIT */
/* megascope semantic hook ABI, version 2: the header monitor authors include.
 *
 * A monitor is C compiled with stock clang (`clang -O2 -g -target bpf -c m.bpf.c`)
 * with libbpf's <bpf/bpf_helpers.h> and this header. Its programs sit in sections
 * that name the program type and the hook:
 *
 *     SEC("megascope/observe/task_end")      int on_end(struct ms_hook_ctx *ctx)
 *     SEC("megascope/sched_hint/task_ready") int prio(struct ms_hook_ctx *ctx)
 *
 * observe programs read the context and update their own maps and ring buffers;
 * they change nothing in the scheduler (their return value is ignored). sched_hint
 * programs exist only on task_ready and return a priority 0-7, nothing else.
 * No program writes the context.
 *
 * The context is one flat struct. Fields are only appended, never moved; each hook
 * defines a subset of them (MS_HOOK_FIELDS_* below, and docs/hooks.md), and the
 * verifier rejects a read of a field the hook does not define. A program records
 * the ABI version it was built for (MS_HOOK_ABI_DECLARE) and an engine refuses a
 * program newer than itself.
 *
 * Stable IDs: task_class indexes the plan's schema (megascope compile
 * --schema-out), task_gen = (step << 32) | task_index, req_gen grows each time a
 * request slot is reused, event_class names layer-free event kinds ("attn->wo").
 *
 * Late task hooks: task_ready, task_assign and dep_release (and queue_pressure
 * of a JIT push) fire after the trigger that released their task, so they can
 * run after the task's step ended and the batch was laid out for the next one.
 * Their step, task_gen and batch_size still name the task's step. req_slot,
 * req_gen and ctx_len are the row's request in that step, or MS_HOOK_NONE32,
 * MS_HOOK_NONE32 and 0 when the rows were laid out again while the hook read
 * them: never another step's request. Every backend reports them this way. */
#ifndef MEGASCOPE_BPF_MEGASCOPE_H
#define MEGASCOPE_BPF_MEGASCOPE_H

#include <linux/types.h>

/* 1: the first layout (184 bytes); 2: appended the data-dependent work
 * (work_rows, passed_over, work_bytes) and the remote producer (remote_event,
 * remote_device, remote_gen) fields; 3: appended a request's prompt and how
 * much of it the prefix cache held (prompt_tokens, cached_tokens). A program
 * of an earlier version loads and runs unchanged: every field it can read
 * keeps its offset, size and hooks. */
#define MS_HOOK_ABI_VERSION 3

/* Hook ids. Append-only. */
enum ms_hook_id {
  MS_HOOK_TASK_READY = 0,     /* a task's event fired: it can run */
  MS_HOOK_TASK_ASSIGN = 1,    /* a task was placed on a worker (JIT dispatch; AOT at step start) */
  MS_HOOK_TASK_BEGIN = 2,     /* a worker starts a task */
  MS_HOOK_TASK_END = 3,       /* a worker finished a task */
  MS_HOOK_DEP_WAIT = 4,       /* a worker reached a task whose event has not fired and waits */
  MS_HOOK_DEP_RELEASE = 5,    /* an event reached its count and released its successors */
  MS_HOOK_COMM = 6,           /* a communication task issues / completes a transfer (reserved) */
  MS_HOOK_STEP = 7,           /* a decode step begins / ends */
  MS_HOOK_REQUEST = 8,        /* a request is admitted / emits its first token / a token / finishes */
  MS_HOOK_QUEUE_PRESSURE = 9, /* a queue's depth crossed its declared threshold */
  MS_HOOK_COUNT = 10
};

/* Program types. */
enum ms_prog_type {
  MS_PROG_OBSERVE = 0,
  MS_PROG_SCHED_HINT = 1,
  MS_PROG_TYPE_COUNT = 2
};

/* ms_hook_ctx.phase for the step, request and comm hooks. */
enum ms_step_phase { MS_STEP_BEGIN = 0, MS_STEP_END = 1 };
enum ms_request_phase {
  MS_REQ_ADMITTED = 0,
  MS_REQ_FIRST_TOKEN = 1,
  MS_REQ_TOKEN = 2,
  MS_REQ_FINISHED = 3
};
enum ms_comm_phase { MS_COMM_ISSUE = 0, MS_COMM_COMPLETE = 1 };

/* ms_hook_ctx.wait_reason for dep_wait. */
enum ms_wait_reason {
  MS_WAIT_DEPENDENCY = 0,     /* the task's event has not fired */
  MS_WAIT_STEP_END = 1,       /* the worker's queue is done; it waits for the step to end */
  MS_WAIT_REASON_COUNT
};

/* ms_hook_ctx.launch_mode */
enum ms_launch_mode { MS_LAUNCH_MODE_AOT = 0, MS_LAUNCH_MODE_JIT = 1 };

/* ms_hook_ctx.queue_kind for queue_pressure */
enum ms_queue_kind { MS_QUEUE_JIT = 0, MS_QUEUE_MAILBOX = 1 };

#define MS_HOOK_NONE32 0xffffffffu   /* a field with no value for this firing (e.g. no row) */
#define MS_HOOK_NONE64 0xffffffffffffffffull  /* a 64-bit field with no value (e.g. not known on a backend) */

struct ms_hook_ctx {
  /* every hook */
  __u32 abi_version;   /* 0: MS_HOOK_ABI_VERSION of the engine */
  __u32 hook;          /* 4: enum ms_hook_id */
  __u64 now_ns;        /* 8: engine clock (simulated time on the sim backend) */
  __u32 worker;        /* 16: worker (SM) index */
  __u32 device;        /* 20: device index */
  __u64 step;          /* 24: global decode step */
  __u32 batch_size;    /* 32: rows in the step */
  __u32 bucket;        /* 36: rows of the step's plan */
  /* tasks */
  __u32 task_class;    /* 40: schema class id */
  __u32 op;            /* 44: kernel id */
  __u32 task_index;    /* 48: index in the plan */
  __u32 launch_mode;   /* 52: enum ms_launch_mode */
  __u64 task_gen;      /* 56: (step << 32) | task_index */
  __s32 tile_x;        /* 64: output column tile; attention: the part of the row's positions */
  __s32 tile_y;        /* 68: batch row, -1: all rows */
  __s32 tile_z;        /* 72: kv head or expert, -1: none */
  __u32 req_slot;      /* 76: request slot of the task's row (or the request), MS_HOOK_NONE32 */
  __u32 req_gen;       /* 80: that slot's generation, MS_HOOK_NONE32 */
  __u32 ctx_len;       /* 84: positions of the row's request (attention context) */
  __u64 t_ready;       /* 88: when the task's event fired (step start for the first tasks) */
  __u64 t_begin;       /* 96: when the task began */
  __u64 t_end;         /* 104: when the task ended */
  /* events */
  __u32 event_id;      /* 112: event index in the plan */
  __u32 event_class;   /* 116: layer-free event class */
  __u32 event_needed;  /* 120: triggers the event needs per step */
  __u32 wait_reason;   /* 124: enum ms_wait_reason */
  __u64 event_count;   /* 128: triggers so far this step */
  /* queues */
  __u32 queue_depth;   /* 136: depth of the queue involved */
  __u32 queue_threshold; /* 140: queue_pressure: the declared threshold */
  /* communication (reserved for backends that communicate) */
  __u32 peer;          /* 144 */
  __u32 comm_phase;    /* 148: enum ms_comm_phase */
  __u64 comm_gen;      /* 152 */
  /* step and request progress */
  __u32 phase;         /* 160: enum ms_step_phase / ms_request_phase */
  __u32 token;         /* 164: request: the token emitted */
  __u64 wait_ns;       /* 168: task_begin/task_end: time this worker waited for the task's event */
  __u32 queue_kind;    /* 176: queue_pressure: enum ms_queue_kind */
  __u32 reserved0;     /* 180 */
  /* version 2: data-dependent work (task_begin, task_end) */
  __u32 work_rows;     /* 184: rows (tokens) the task processes: an expert's routed rows, attention's
                          positions, a GEMV tile's live rows, 1 or 0 for a row's task */
  __u32 passed_over;   /* 188: JIT tasks: other tasks taken from the JIT queues while it was ready; AOT: 0 */
  __u64 work_bytes;    /* 192: bytes of weights and KV cache the task reads, MS_HOOK_NONE64: unknown */
  /* version 2: remote producers (comm; task_begin, task_end of a remote dependency) */
  __u32 remote_event;  /* 200: the remote producer's event, MS_HOOK_NONE32: none */
  __u32 remote_device; /* 204: the device of that producer (comm: the peer), MS_HOOK_NONE32: none */
  __u64 remote_gen;    /* 208: the step of that event's firing (its generation), 0: none */
  /* version 3: the prefix cache (request) */
  __u32 prompt_tokens; /* 216: the request's prompt tokens */
  __u32 cached_tokens; /* 220: of them, positions read from the prefix cache, not computed: the
                          request's rows start at this position */
};                     /* 184 bytes in version 1, 216 in version 2, 224 in version 3 */

/* Fields, as bits of a hook's field mask (bit i: field i in declaration order). */
enum ms_hook_field {
  MS_F_ABI_VERSION, MS_F_HOOK, MS_F_NOW_NS, MS_F_WORKER, MS_F_DEVICE, MS_F_STEP, MS_F_BATCH_SIZE,
  MS_F_BUCKET, MS_F_TASK_CLASS, MS_F_OP, MS_F_TASK_INDEX, MS_F_LAUNCH_MODE, MS_F_TASK_GEN,
  MS_F_TILE_X, MS_F_TILE_Y, MS_F_TILE_Z, MS_F_REQ_SLOT, MS_F_REQ_GEN, MS_F_CTX_LEN, MS_F_T_READY,
  MS_F_T_BEGIN, MS_F_T_END, MS_F_EVENT_ID, MS_F_EVENT_CLASS, MS_F_EVENT_NEEDED, MS_F_WAIT_REASON,
  MS_F_EVENT_COUNT, MS_F_QUEUE_DEPTH, MS_F_QUEUE_THRESHOLD, MS_F_PEER, MS_F_COMM_PHASE,
  MS_F_COMM_GEN, MS_F_PHASE, MS_F_TOKEN, MS_F_WAIT_NS, MS_F_QUEUE_KIND, MS_F_RESERVED0,
  /* version 2 */
  MS_F_WORK_ROWS, MS_F_PASSED_OVER, MS_F_WORK_BYTES, MS_F_REMOTE_EVENT, MS_F_REMOTE_DEVICE,
  MS_F_REMOTE_GEN,
  /* version 3 */
  MS_F_PROMPT_TOKENS, MS_F_CACHED_TOKENS,
  MS_F_COUNT
};

#define MS_FB(f) (1ull << (f))
#define MS_HOOK_FIELDS_COMMON                                                          \
  (MS_FB(MS_F_ABI_VERSION) | MS_FB(MS_F_HOOK) | MS_FB(MS_F_NOW_NS) | MS_FB(MS_F_WORKER) | \
   MS_FB(MS_F_DEVICE) | MS_FB(MS_F_STEP) | MS_FB(MS_F_BATCH_SIZE) | MS_FB(MS_F_BUCKET))
#define MS_HOOK_FIELDS_TASK                                                                 \
  (MS_FB(MS_F_TASK_CLASS) | MS_FB(MS_F_OP) | MS_FB(MS_F_TASK_INDEX) | MS_FB(MS_F_LAUNCH_MODE) | \
   MS_FB(MS_F_TASK_GEN) | MS_FB(MS_F_TILE_X) | MS_FB(MS_F_TILE_Y) | MS_FB(MS_F_TILE_Z) |        \
   MS_FB(MS_F_REQ_SLOT) | MS_FB(MS_F_REQ_GEN) | MS_FB(MS_F_CTX_LEN))
#define MS_HOOK_FIELDS_EVENT \
  (MS_FB(MS_F_EVENT_ID) | MS_FB(MS_F_EVENT_CLASS) | MS_FB(MS_F_EVENT_NEEDED) | MS_FB(MS_F_EVENT_COUNT))

/* version 2 */
#define MS_HOOK_FIELDS_WORK (MS_FB(MS_F_WORK_ROWS) | MS_FB(MS_F_PASSED_OVER) | MS_FB(MS_F_WORK_BYTES))
#define MS_HOOK_FIELDS_REMOTE \
  (MS_FB(MS_F_REMOTE_EVENT) | MS_FB(MS_F_REMOTE_DEVICE) | MS_FB(MS_F_REMOTE_GEN))

#define MS_HOOK_FIELDS_TASK_READY \
  (MS_HOOK_FIELDS_COMMON | MS_HOOK_FIELDS_TASK | MS_HOOK_FIELDS_EVENT | MS_FB(MS_F_T_READY))
#define MS_HOOK_FIELDS_TASK_ASSIGN \
  (MS_HOOK_FIELDS_COMMON | MS_HOOK_FIELDS_TASK | MS_FB(MS_F_T_READY) | MS_FB(MS_F_QUEUE_DEPTH))
#define MS_HOOK_FIELDS_TASK_BEGIN                                                       \
  (MS_HOOK_FIELDS_COMMON | MS_HOOK_FIELDS_TASK | MS_HOOK_FIELDS_EVENT | MS_FB(MS_F_T_READY) | \
   MS_FB(MS_F_T_BEGIN) | MS_FB(MS_F_WAIT_NS) | MS_HOOK_FIELDS_WORK | MS_HOOK_FIELDS_REMOTE)
#define MS_HOOK_FIELDS_TASK_END (MS_HOOK_FIELDS_TASK_BEGIN | MS_FB(MS_F_T_END))
#define MS_HOOK_FIELDS_DEP_WAIT \
  (MS_HOOK_FIELDS_COMMON | MS_HOOK_FIELDS_TASK | MS_HOOK_FIELDS_EVENT | MS_FB(MS_F_WAIT_REASON))
#define MS_HOOK_FIELDS_DEP_RELEASE (MS_HOOK_FIELDS_COMMON | MS_HOOK_FIELDS_TASK | MS_HOOK_FIELDS_EVENT)
#define MS_HOOK_FIELDS_COMM                                                              \
  (MS_HOOK_FIELDS_COMMON | MS_HOOK_FIELDS_TASK | MS_FB(MS_F_PEER) | MS_FB(MS_F_COMM_PHASE) | \
   MS_FB(MS_F_COMM_GEN) | MS_HOOK_FIELDS_REMOTE)
#define MS_HOOK_FIELDS_STEP (MS_HOOK_FIELDS_COMMON | MS_FB(MS_F_PHASE))
#define MS_HOOK_FIELDS_REQUEST                                                       \
  (MS_HOOK_FIELDS_COMMON | MS_FB(MS_F_REQ_SLOT) | MS_FB(MS_F_REQ_GEN) | MS_FB(MS_F_CTX_LEN) | \
   MS_FB(MS_F_PHASE) | MS_FB(MS_F_TOKEN) | MS_FB(MS_F_PROMPT_TOKENS) | MS_FB(MS_F_CACHED_TOKENS))
#define MS_HOOK_FIELDS_QUEUE_PRESSURE                                                      \
  (MS_HOOK_FIELDS_COMMON | MS_FB(MS_F_QUEUE_DEPTH) | MS_FB(MS_F_QUEUE_THRESHOLD) |          \
   MS_FB(MS_F_QUEUE_KIND))

/* megascope's own helpers (Linux's helpers 1, 2, 3, 5, 8, 130-133 keep their ids
 * and meaning; see <bpf/bpf_helpers.h>). Ids from 0x10000 up are megascope's. */
#define MS_HELPER_BASE 0x10000
#define MS_HELPER_LOG2 (MS_HELPER_BASE + 0)     /* u64 ms_log2(u64 v): floor(log2 v), 0 for 0 */

/* Map conventions: how `megascope run --attach`, `maps` and the exporters decode
 * a monitor's maps (per-worker maps are summed over workers):
 *   hist_*        u64 counts, key = row * MS_HIST_BUCKETS + log2 bucket: a
 *                 histogram per row; rows are task classes when the name contains
 *                 "class" but not "evclass", event classes when it contains
 *                 "evclass", plain numbers otherwise;
 *   *class* keys  (hash or array) a u32 task class; *evclass* keys an event class;
 *   *req* keys    a u64 (req_slot << 32 | req_gen);
 *   other maps    key -> the value's u64 words. */
#define MS_HIST_BUCKETS 64

/* Declares the ABI version a program was built for (a read-only global the
 * loader finds in the object). */
#define MS_HOOK_ABI_DECLARE() \
  const volatile __u32 megascope_abi_version __attribute__((section("megascope_abi"), used)) = MS_HOOK_ABI_VERSION

#ifdef __bpf__
/* Helper stubs of megascope's own helpers, in the style of bpf_helper_defs.h. */
static __u64 (*ms_log2)(__u64 v) = (void *)MS_HELPER_LOG2;
#endif

/* Kernel ids: ctx->op of task hooks, and "kernel_id" of a class in
 * `megascope schema`. Stable (append-only): the engine's own list of task
 * bodies has the same numbers (checked where the engine is built). */
enum ms_op {
  MS_OP_STEP_START = 0,   /* the step's first task: retire, admit, lay out rows */
  MS_OP_EMBED = 1,
  MS_OP_RMSNORM = 2,      /* attn_norm, ffn_norm, out_norm */
  MS_OP_QKV = 3,
  MS_OP_ROPE = 4,         /* q/k norm (qwen3), RoPE, KV-cache append */
  MS_OP_ATTN = 5,         /* paged attention for one (row, kv head) */
  MS_OP_WO = 6,           /* output projection + residual */
  MS_OP_SWIGLU = 7,       /* gate and up projections (gate_up) */
  MS_OP_DOWN = 8,         /* down projection + residual */
  MS_OP_ROUTER = 9,       /* MoE router */
  MS_OP_EXPERT_UP = 10,
  MS_OP_EXPERT_DOWN = 11,
  MS_OP_MOE_COMBINE = 12,
  MS_OP_LM_HEAD = 13,
  MS_OP_SAMPLE = 14,
  MS_OP_EMPTY = 15,       /* inserted by normalisation: waits, then triggers */
  MS_OP_COMM = 16,        /* tensor parallel: a share of an all-gather */
  MS_OP_COUNT
};

#endif
