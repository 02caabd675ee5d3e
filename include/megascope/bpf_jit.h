/* SPDX-License-Identifier: MIT */
/* megascope eBPF x86-64 JIT: the same bytecode as the reference interpreter,
 * compiled to native code for the hooks' hot path.
 *
 * The interpreter checks every memory access at run time; the JIT does not.
 * Its safety is the verifier's proof instead, so ms_bpf_jit_new runs the
 * verifier itself (with the options the caller gives) and compiles only a
 * program that verified: no caller can JIT an unproven program. What the
 * verifier cannot know stays checked at run time, as in the interpreter:
 * division by zero and INT_MIN / -1 give the RFC 9669 results, a helper that
 * aborts stops the run, ring buffer records left reserved are discarded, and
 * the instruction budget is counted as the interpreter counts it (every
 * instruction executed, lddw once; the verifier already proved the program's
 * longest run within the budget it was verified for).
 *
 * Helpers and maps are bound when the program is compiled: helper addresses
 * and map addresses are constants in the code, so a run must pass the same
 * helper table and maps (checked). Helpers see the same struct ms_bpf_exec as
 * under the interpreter (ms_bpf_exec_mem, ms_bpf_exec_env, ...), so one helper
 * table serves both.
 *
 * Code lives in its own mapping, written and then made read-only executable
 * (never writable and executable at once). On a host that is not x86-64,
 * ms_bpf_jit_supported() is 0 and ms_bpf_jit_new fails with ENOTSUP; callers
 * fall back to the interpreter. */
#ifndef MEGASCOPE_BPF_JIT_H
#define MEGASCOPE_BPF_JIT_H

#include <stddef.h>
#include <stdint.h>

#include "megascope/base.h"
#include "megascope/bpf.h"
#include "megascope/verifier.h"

#ifdef __cplusplus
extern "C" {
#endif

struct ms_bpf_jit_opts {
  size_t sz;                            /* sizeof(struct ms_bpf_jit_opts) */
  const struct ms_verify_opts *verify;  /* how to verify (kind, hook, mem_size, ...);
                                         * its helpers must be the helpers below */
  const struct ms_bpf_helpers *helpers; /* the table every run passes */
  struct ms_bpf_map *const *maps;       /* maps[i] bound to the program's map index i */
  size_t n_maps;
  struct ms_textbuf *log;               /* the verifier's log, or why compiling failed */
};

struct ms_bpf_jit;

/* 1 when this build can JIT on this host (x86-64). */
int ms_bpf_jit_supported(void);

/* Verifies prog, then compiles it. NULL + errno: ENOTSUP (no JIT for this host,
 * or a construct it does not compile, logged), MS_E_VERIFY (rejected, the
 * verifier's reason in log), EINVAL (options), ENOMEM. */
struct ms_bpf_jit *ms_bpf_jit_new(const struct ms_bpf_prog *prog, const struct ms_bpf_jit_opts *o);
void ms_bpf_jit_free(struct ms_bpf_jit *j);

/* Runs the compiled program. opts as for ms_bpf_run, with helpers and maps the
 * same as at compile time (else -EINVAL); a RAW_MEM program needs mem_size at
 * least the verified size, a hook program a context (the hook context).
 * insn_budget counts executed instructions exactly as ms_bpf_run does (each
 * basic block takes its length as it is entered), so a run exhausts it
 * exactly when the interpreter's would.
 * 0, or: -MS_E_LIMIT budget exhausted, -EINVAL a helper's refusal or a
 * program that exited holding ring buffer records, or what a helper aborted
 * with. res->insns: the instructions executed, as the interpreter reports them
 * (the budget when it ran out; after a helper's abort, up to the end of the
 * aborting block). */
int ms_bpf_jit_run(const struct ms_bpf_jit *j, const struct ms_bpf_run_opts *opts,
                   struct ms_bpf_run_result *res);

/* Bytes of native code, and the program it came from. */
size_t ms_bpf_jit_code_size(const struct ms_bpf_jit *j);
/* The native code itself (read-only), for inspection: `objdump -D -b binary
 * -m i386:x86-64` disassembles it. */
const void *ms_bpf_jit_code(const struct ms_bpf_jit *j);
const struct ms_bpf_prog *ms_bpf_jit_prog(const struct ms_bpf_jit *j);

#ifdef __cplusplus
}
#endif
#endif
