/* SPDX-License-Identifier: MIT */
/* megascope eBPF verifier: proves, before a monitor program runs, that it stays
 * inside what its hook allows.
 *
 * It is a path-sensitive abstract interpreter in the style of the Linux
 * verifier. Every register carries a type (scalar, context, stack, map,
 * map value, ring buffer record, ...) and, for scalars and pointer offsets, a
 * value range (unsigned and signed bounds plus known bits); the stack carries
 * per-byte initialisation and spilled registers. Both sides of every
 * conditional jump are explored with the condition applied; a state reached
 * again at an instruction is pruned when it is included in one already fully
 * explored there. What it proves:
 *   - every load lies inside one context field the hook defines (the context
 *     is read-only), the stack [r10-512, r10) (reads only of bytes written
 *     before on that path), a map value, a ring buffer record or the RAW_MEM
 *     buffer; map lookups are NULL-checked before use;
 *   - no pointer leaves the program: none is stored into a map value, a ring
 *     buffer record, a map key or helper data, none is returned in r0, none is
 *     truncated or mixed with non-constant arithmetic it cannot bound;
 *   - helper arguments have the kinds and sizes of the helper's prototype
 *     (from the caller's helper table); unknown helpers are refused;
 *   - ring buffer reservations are submitted or discarded on every path and
 *     not used after;
 *   - no uninitialised register is read, r10 is never written;
 *   - what the context description (struct ms_verify_ctx) restricts: a
 *     sched_hint program sits on task_ready, returns a scalar in 0..7, calls
 *     only its program type's helpers (no map updates, no ring buffer output)
 *     and writes no map value;
 *   - no run executes more than the run budget (run_budget; for hooks the
 *     context's, MS_HOOK_RUN_BUDGET, what the engines give every run), counted as the
 *     interpreters and the JIT count: every instruction executed, lddw once.
 *     The bound is the longest path the exploration finds: a path that ends
 *     adds its length, a pruned one its length so far plus the longest
 *     continuation of the state that pruned it (stats: max_run_insns). So a
 *     verified program never stops for budget in any engine;
 *   - exploration ends within the work cap: instructions processed (default
 *     1,000,000) and, since comparing and copying states is what costs time,
 *     verifier work (instructions processed + state frames compared + state
 *     frames copied, default MS_VERIFY_WORK_LIMIT). Either refusal names the
 *     figures; both bound every loop the program has.
 * bpf-to-bpf calls (call src=1) are verified with a new frame per call site:
 * the callee gets the caller's r1-r5, its own 512-byte stack, and may read
 * the caller's stack through pointers passed to it.
 *
 * The log is the Linux verifier's shape: with verbose, one line per processed
 * instruction `N: (<opcode>) <disassembly>` and the register state where a
 * path starts; a rejection ends with `insn N: <disassembly> ; <reason>`; the
 * last line is always the stats line
 *   processed N insns (limit L) max_states_per_insn M total_states T peak_states P time_us U
 *   max_run_insns R work W
 * (one line; R is 0 when the program was rejected).
 * The verbose trace is cut (with a note) before it could crowd out those
 * last lines when the caller's buffer is small.
 *
 * An acceptance is remembered (the program, its map definitions, the
 * prototypes of the helpers it calls and the options, compared exactly):
 * verifying the same again without verbose returns it without exploring
 * (stats.cached), so a monitor verified at load is not explored again when
 * the JIT compiles it. */
#ifndef MEGASCOPE_VERIFIER_H
#define MEGASCOPE_VERIFIER_H

#include <stddef.h>
#include <stdint.h>

#include "megascope/base.h"
#include "megascope/bpf.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What r1 (and r2) hold at entry. */
enum ms_verify_kind {
  MS_VERIFY_HOOK = 0,    /* r1 = a read-only context that opts.ctx describes */
  MS_VERIFY_RAW_MEM = 1, /* r1 = a read-write buffer of mem_size bytes (8-byte aligned,
                          * as atomics need), r2 = mem_size */
  MS_VERIFY_KIND_COUNT
};

#define MS_VERIFY_INSN_LIMIT 1000000u  /* default complexity cap: instructions processed */
#define MS_VERIFY_INSN_LIMIT_MAX (1u << 28) /* the largest cap accepted (larger ones are lowered) */
#define MS_VERIFY_STATES_PER_INSN 64u  /* default cap on states kept per instruction */
#define MS_VERIFY_WORK_LIMIT 4000000u  /* default cap on verifier work (see above) */

/* One field of a context: a read must lie inside one. */
struct ms_verify_field {
  const char *name;
  uint32_t offset, size;
};

/* What a program of one type on one hook may read, call, write and return,
 * as data. The verifier knows nothing of hooks: the hook ABI's tables build
 * one of these per program type and hook (ms_hook_verify_ctx, megascope/hook.h)
 * and the caller passes it in ms_verify_opts.ctx. */
struct ms_verify_ctx {
  const char *hook, *prog_type;         /* names, for messages */
  uint32_t size;                        /* bytes of the context (read-only) */
  const struct ms_verify_field *fields; /* every field of its layout */
  int n_fields;                         /* at most 64 */
  uint64_t defined;                     /* bit f: fields[f] is defined on this hook */
  uint32_t abi_version;                 /* the newest ABI version it describes: a
                                         * program built for a newer one is refused */
  uint64_t run_budget;                  /* a run's instructions when the options give none */
  const char *refused;                  /* non-NULL: the type may not sit on this hook: why */
  /* A restricted program type (sched_hint) says so here; zeros: unrestricted. */
  const uint32_t *helpers;              /* the helper ids it may call; NULL: every one */
  int n_helpers;
  int no_map_writes;                    /* 1: it writes no map value */
  int ret_bounded;                      /* 1: r0 at every exit lies in 0..ret_max */
  uint64_t ret_max;
  const char *restricted_why;           /* appended to a refusal of the above */
};

struct ms_verify_opts {
  size_t sz;                            /* sizeof(struct ms_verify_opts) */
  int kind;                             /* enum ms_verify_kind */
  int prog_type;                        /* enum ms_prog_type (HOOK) */
  int hook;                             /* enum ms_hook_id (HOOK) */
  uint32_t mem_size;                    /* RAW_MEM: bytes at r1 (0: r1 is NULL) */
  const struct ms_bpf_helpers *helpers; /* prototypes of callable helpers; NULL: none */
  int verbose;                          /* trace every processed instruction */
  uint64_t insn_limit;                  /* 0: MS_VERIFY_INSN_LIMIT; at most MS_VERIFY_INSN_LIMIT_MAX */
  uint32_t max_states_per_insn;         /* 0: MS_VERIFY_STATES_PER_INSN */
  uint32_t abi_version;                 /* the object's megascope_abi_version; 0: not declared */
  uint64_t run_budget;                  /* the most instructions one run may execute; 0: MS_HOOK_RUN_BUDGET
                                         * (HOOK), MS_BPF_DEFAULT_BUDGET (RAW_MEM) */
  uint64_t work_limit;                  /* 0: MS_VERIFY_WORK_LIMIT */
  /* HOOK: the context, what prog_type on hook may do (ms_hook_verify_ctx);
   * prog_type and hook above name it (the verifier does not read them but for
   * the cache's key and messages). NULL: refused as an unknown hook. */
  const struct ms_verify_ctx *ctx;
};

struct ms_verify_stats {
  uint64_t processed;           /* instructions processed over all paths */
  uint64_t insn_limit;          /* the cap that applied */
  uint64_t total_states;        /* states kept for pruning */
  uint64_t peak_states;         /* most states held at once (kept + pending branches) */
  uint64_t max_states_per_insn; /* most states kept at one instruction */
  uint64_t pruned;              /* paths cut by a state already explored */
  uint64_t time_us;
  int64_t err_insn;             /* the rejected instruction, -1 if none (or not one) */
  /* What the program may return: the union of R0's ranges over every exit
   * (valid when it verified). A run's r0 lies in both. */
  uint64_t r0_umin, r0_umax;
  int64_t r0_smin, r0_smax;
  uint64_t max_run_insns; /* the most instructions one run executes (verified programs) */
  uint64_t run_budget;    /* the budget it was held to */
  uint64_t work;          /* processed + state frames compared + state frames copied */
  uint64_t work_limit;
  uint64_t compared;      /* state frames compared (after the fingerprint filter) */
  uint64_t evicted;       /* kept states dropped for pruning nothing */
  uint32_t cached;        /* 1: the verdict of an identical earlier verification in this
                           * process (these figures are its; time_us is the lookup's) */
};

/* Verifies prog. 0 when it is proven safe; -MS_E_VERIFY when rejected (the
 * reason is the log's last lines before the stats line); -EINVAL for bad
 * options; -ENOMEM. log and st may be NULL. */
int ms_bpf_verify(const struct ms_bpf_prog *prog, const struct ms_verify_opts *o,
                  struct ms_textbuf *log, struct ms_verify_stats *st);

/* Verifications on the calling thread from now on stop, refused with
 * "verification cancelled", soon after *flag becomes non-zero (read with a
 * relaxed atomic load; NULL: never). For a thread that verifies on another's
 * behalf (ms_monitor_job), so that its owner need not wait for a verification
 * nobody wants any more. */
void ms_bpf_verify_set_cancel(const int *flag);

/* The conformance-suite form: r1 = mem_size read-write bytes (NULL when 0),
 * r2 = mem_size, any helper of the table callable. */
int ms_bpf_verify_raw(const struct ms_bpf_prog *prog, uint32_t mem_size,
                      const struct ms_bpf_helpers *helpers, struct ms_textbuf *log);

/* The ABI version an object declares (its `megascope_abi_version` global in
 * section "megascope_abi", MS_HOOK_ABI_DECLARE): 0 with *version = 0 when it
 * declares none, -MS_E_FORMAT when the section is not one 32-bit word. */
int ms_bpf_object_abi_version(const struct ms_bpf_object *obj, uint32_t *version,
                              struct ms_textbuf *log);

#ifdef __cplusplus
}
#endif
#endif
