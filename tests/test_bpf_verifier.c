/* SPDX-License-Identifier: MIT */
/* The verifier: one rejection per rule, each naming the message it expects;
 * the monitors of tests/data/verifier and monitors (*.bpf.c) compiled by
 * clang (both -mcpu=v1 and v3, so both 64-bit and 32-bit subregister code)
 * which must verify, and then run in the interpreter on random contexts
 * without a fault; the monitors that must not verify; bpf-to-bpf calls; the
 * scalar domain checked against concrete arithmetic (every concrete result
 * inside the abstract one, no live branch declared dead); and the conformance
 * suite through the verifier in RAW_MEM form: never a crash, and every
 * program that verifies runs to the expected r0 without a memory error.
 * clang missing: the compiled parts are skipped, the rest still runs. */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <unistd.h>

#include "bpf/bpf_internal.h"
#include "bpf/verifier_shared.h"
#include "megascope/bpf.h"
#include "megascope/hook.h"
#include "megascope/monitor.h"
#include "megascope/verifier.h"
#include "test.h"

static char logbuf[1 << 20];
static struct ms_textbuf tlog;
static struct ms_bpf_helpers *helpers; /* standard + log2 */
static char tmpdir[] = "/tmp/ms-verifier-XXXXXX";
static int have_clang;

static void log_reset(void) {
  logbuf[0] = 0;
  tlog = (struct ms_textbuf){logbuf, sizeof logbuf, 0, 0};
}

static uint64_t log2_fn(struct ms_bpf_exec *x, uint64_t v, uint64_t a2, uint64_t a3, uint64_t a4, uint64_t a5) {
  return v ? 63 - (uint64_t)__builtin_clzll(v) : 0;
}

static uint64_t identity_fn(struct ms_bpf_exec *x, uint64_t a1, uint64_t a2, uint64_t a3, uint64_t a4,
                            uint64_t a5) {
  return a1;
}

static void helpers_init(void) {
  static const struct ms_bpf_helper_proto log2_proto = {
      MS_HELPER_LOG2, "ms_log2", MS_BPF_RET_INTEGER, {MS_BPF_ARG_ANYTHING}, 0};
  helpers = ms_bpf_helpers_new();
  CHECK(helpers && !ms_bpf_helpers_add_std(helpers) && !ms_bpf_helpers_set(helpers, &log2_proto, log2_fn));
}

/* The last line of the log, and the one before it. */
static const char *nth_last_line(int k) {
  const char *end = logbuf + strlen(logbuf);
  if (end > logbuf && end[-1] == '\n') end--;
  const char *p = end;
  for (int i = 0; i <= k; i++) {
    if (i) p--;
    while (p > logbuf && p[-1] != '\n') p--;
  }
  return p;
}

/* ---- hand-written programs ---------------------------------------------- */

static const struct ms_bpf_map_def test_maps[] = {
    {"hash8", MS_BPF_MAP_HASH, 4, 8, 16, 0},                          /* 0 */
    {"array8", MS_BPF_MAP_ARRAY, 4, 8, 4, 0},                         /* 1 */
    {"rb", MS_BPF_MAP_RINGBUF, 0, 0, 4096, 0},                        /* 2 */
    {".rodata", MS_BPF_MAP_ARRAY, 4, 16, 1, MS_BPF_MAP_F_RDONLY_PROG}, /* 3 */
    {"array64", MS_BPF_MAP_ARRAY, 4, 64, 4, 0},                       /* 4 */
};
#define N_TEST_MAPS (sizeof test_maps / sizeof test_maps[0])

static struct ms_bpf_prog *assemble(const char *text) {
  struct ms_bpf_insn *insns = NULL;
  size_t n = 0;
  log_reset();
  if (ms_bpf_asm(text, &insns, &n, &tlog)) {
    fprintf(stderr, "assembly failed: %s\n%s", logbuf, text);
    return NULL;
  }
  struct ms_bpf_prog_opts po = {.sz = sizeof po, .name = "t", .maps = test_maps, .n_maps = N_TEST_MAPS, .log = &tlog};
  struct ms_bpf_prog *p = ms_bpf_prog_new(insns, n, &po);
  free(insns);
  if (!p) fprintf(stderr, "program refused: %s\n%s", logbuf, text);
  return p;
}

/* Verifies text as a program of type on hook; the log is in logbuf. */
static int verify_text(const char *text, int type, int hook, uint64_t limit, struct ms_verify_stats *st) {
  struct ms_bpf_prog *p = assemble(text);
  if (!p) return -1000;
  struct ms_verify_opts o = {.sz = sizeof o, .kind = MS_VERIFY_HOOK, .prog_type = type, .hook = hook,
                             .helpers = helpers, .insn_limit = limit, .ctx = ms_hook_verify_ctx(type, hook)};
  struct ms_verify_stats s;
  log_reset();
  int rc = ms_bpf_verify(p, &o, &tlog, st ? st : &s);
  ms_bpf_prog_free(p);
  return rc;
}

struct neg {
  const char *name;
  int type, hook;
  const char *text;
  const char *expect;
};

#define OBS MS_PROG_OBSERVE
#define HINT MS_PROG_SCHED_HINT
#define LOOKUP(map) "stdw [%r10-8], 0\nmov %r2, %r10\nadd %r2, -8\nlddw %r1, map[" #map "]\ncall 1\n"

static const struct neg negatives[] = {
    {"ctx store", OBS, MS_HOOK_TASK_END, "mov %r2, 1\nstxdw [%r1+8], %r2\nmov %r0, 0\nexit",
     "invalid write of ctx at offset 8: the context is read-only"},
    {"ctx store imm", OBS, MS_HOOK_TASK_END, "stw [%r1+16], 1\nmov %r0, 0\nexit", "the context is read-only"},
    {"ctx atomic", OBS, MS_HOOK_TASK_END, "mov %r2, 1\nlock add [%r1+8], %r2\nmov %r0, 0\nexit",
     "the context is read-only"},
    {"ctx field of another hook", OBS, MS_HOOK_TASK_BEGIN, "ldxdw %r0, [%r1+104]\nexit",
     "invalid read of ctx field t_end at offset 104 size 8: hook task_begin does not define field t_end"},
    {"ctx field straddle", OBS, MS_HOOK_TASK_END, "ldxdw %r0, [%r1+36]\nexit",
     "straddles fields bucket and task_class"},
    {"ctx beyond the end", OBS, MS_HOOK_TASK_END, "ldxw %r0, [%r1+224]\nexit", "outside the 224-byte context"},
    {"ctx v2 field of another hook", OBS, MS_HOOK_TASK_READY, "ldxw %r0, [%r1+184]\nexit",
     "invalid read of ctx field work_rows at offset 184 size 4: hook task_ready does not define field work_rows"},
    {"ctx v2 remote field of step", OBS, MS_HOOK_STEP, "ldxdw %r0, [%r1+208]\nexit",
     "hook step does not define field remote_gen"},
    {"ctx variable offset", OBS, MS_HOOK_TASK_END, "ldxw %r2, [%r1+16]\nadd %r1, %r2\nldxw %r0, [%r1+0]\nexit",
     "ctx pointer arithmetic only by constants"},
    {"stack out of bounds", OBS, MS_HOOK_TASK_END, "stdw [%r10-520], 1\nmov %r0, 0\nexit",
     "R10 invalid access to stack: write [r10-520] size 8 is outside [r10-512, r10)"},
    {"stack above r10", OBS, MS_HOOK_TASK_END, "ldxw %r0, [%r10+0]\nexit", "invalid access to stack"},
    {"uninitialised stack", OBS, MS_HOOK_TASK_END, "stw [%r10-8], 1\nldxdw %r0, [%r10-8]\nexit",
     "invalid read of uninitialised stack at [r10-8] size 8: fp-4 was never written"},
    {"uninitialised register", OBS, MS_HOOK_TASK_END, "mov %r0, %r3\nexit",
     "R3 is not initialised: read of an uninitialised register"},
    {"r0 not set at exit", OBS, MS_HOOK_TASK_END, "exit", "R0 is not initialised"},
    {"missing NULL check", OBS, MS_HOOK_TASK_END, LOOKUP(0) "ldxdw %r1, [%r0+0]\nmov %r0, 0\nexit",
     "R0 type=map_value_or_null: possible NULL dereference; compare with 0 first"},
    {"NULL check on the copy only", OBS, MS_HOOK_TASK_END,
     LOOKUP(0) "mov %r6, %r0\nmov %r7, %r0\njeq %r6, 0, +2\nadd %r7, 8\nldxdw %r1, [%r7+0]\nmov %r0, 0\nexit",
     "R7 invalid access to map value of hash8: [off+8] size 8 is outside its 8 bytes"},
    {"map value out of bounds", OBS, MS_HOOK_TASK_END, LOOKUP(1) "jeq %r0, 0, +1\nldxdw %r1, [%r0+8]\nmov %r0, 0\nexit",
     "R0 invalid access to map value of array8: [off+8] size 8 is outside its 8 bytes"},
    {"map value negative offset", OBS, MS_HOOK_TASK_END, LOOKUP(1) "jeq %r0, 0, +1\nldxb %r1, [%r0-1]\nmov %r0, 0\nexit",
     "invalid access to map value of array8"},
    {"map value unbounded index", OBS, MS_HOOK_TASK_END,
     "ldxdw %r6, [%r1+24]\n" LOOKUP(4) "jeq %r0, 0, +2\nadd %r0, %r6\nldxb %r1, [%r0+0]\nmov %r0, 0\nexit",
     "variable offset scalar() is unbounded"},
    {"map value index may be negative", OBS, MS_HOOK_TASK_END,
     "ldxw %r6, [%r1+64]\nlsh %r6, 32\narsh %r6, 32\njsgt %r6, 63, +6\n" LOOKUP(4)
     "jeq %r0, 0, +2\nadd %r0, %r6\nldxb %r1, [%r0+0]\nmov %r0, 0\nexit",
     "may be negative"},
    {"read-only map write", OBS, MS_HOOK_TASK_END, "lddw %r1, map[3]+0\nstdw [%r1+0], 1\nmov %r0, 0\nexit",
     "invalid write of map .rodata: it is read-only to programs"},
    {"pointer stored into a map", OBS, MS_HOOK_TASK_END, LOOKUP(1) "jeq %r0, 0, +1\nstxdw [%r0+0], %r10\nmov %r0, 0\nexit",
     "R10 pointer stored into map value (type=fp): pointers must not leave the program"},
    {"pointer stored by an atomic", OBS, MS_HOOK_TASK_END,
     LOOKUP(1) "jeq %r0, 0, +1\nlock add [%r0+0], %r1\nmov %r0, 0\nexit", "R1 is not initialised"},
    {"pointer xchg into a map", OBS, MS_HOOK_TASK_END,
     "mov %r6, %r1\n" LOOKUP(1) "jeq %r0, 0, +1\nlock xchg [%r0+0], %r6\nmov %r0, 0\nexit",
     "R6 pointer stored into memory by an atomic operation (type=ctx)"},
    {"pointer to ringbuf_output", OBS, MS_HOOK_TASK_END,
     "stxdw [%r10-8], %r1\nlddw %r1, map[2]\nmov %r2, %r10\nadd %r2, -8\nmov %r3, 8\nmov %r4, 0\ncall 130\n"
     "mov %r0, 0\nexit",
     "R2 helper data: stack bytes at fp-8 hold a spilled pointer (ctx); pointers cannot be read as data"},
    {"pointer as a map_update value", OBS, MS_HOOK_TASK_END,
     "stdw [%r10-16], 0\nstxdw [%r10-8], %r10\nlddw %r1, map[0]\nmov %r2, %r10\nadd %r2, -16\nmov %r3, %r10\n"
     "add %r3, -8\nmov %r4, 0\ncall 2\nmov %r0, 0\nexit",
     "R3 map value: stack bytes at fp-8 hold a spilled pointer (fp)"},
    {"ringbuf_output of the context", OBS, MS_HOOK_TASK_END,
     "mov %r2, %r1\nlddw %r1, map[2]\nmov %r3, 8\nmov %r4, 0\ncall 130\nmov %r0, 0\nexit",
     "the context cannot be passed to a helper as memory"},
    {"ringbuf_output size may be 0", OBS, MS_HOOK_TASK_END,
     "stdw [%r10-8], 0\nldxw %r3, [%r1+16]\nand %r3, 7\nlddw %r1, map[2]\nmov %r2, %r10\nadd %r2, -8\n"
     "mov %r4, 0\ncall 130\nmov %r0, 0\nexit",
     "R3 size may be 0"},
    {"ringbuf_output size beyond the data", OBS, MS_HOOK_TASK_END,
     "stdw [%r10-8], 0\nldxw %r3, [%r1+16]\nand %r3, 15\nadd %r3, 1\nlddw %r1, map[2]\nmov %r2, %r10\n"
     "add %r2, -8\nmov %r4, 0\ncall 130\nmov %r0, 0\nexit",
     "R2 invalid access to stack: helper data [r10-8] size 16 is outside [r10-512, r10)"},
    {"scalar as a map", OBS, MS_HOOK_TASK_END,
     "stdw [%r10-8], 0\nmov %r1, 0\nmov %r2, %r10\nadd %r2, -8\ncall 1\nmov %r0, 0\nexit",
     "R1 type=scalar expected=map_ptr"},
    {"map of the wrong type", OBS, MS_HOOK_TASK_END,
     "stdw [%r10-8], 0\nlddw %r1, map[2]\nmov %r2, %r10\nadd %r2, -8\ncall 1\nmov %r0, 0\nexit",
     "R1 map rb of type 27 is not accepted by map_lookup_elem"},
    {"key not initialised", OBS, MS_HOOK_TASK_END, "lddw %r1, map[0]\nmov %r2, %r10\nadd %r2, -8\ncall 1\nmov %r0, 0\nexit",
     "R2 map key: uninitialised stack at fp-8"},
    {"delete from an array", OBS, MS_HOOK_TASK_END, LOOKUP(1) "mov %r2, %r10\nadd %r2, -8\nlddw %r1, map[1]\ncall 3\nmov %r0, 0\nexit",
     "R1 map array8 of type 2 is not accepted by map_delete_elem"},
    {"unknown helper", OBS, MS_HOOK_TASK_END, "call 99\nmov %r0, 0\nexit", "call to unknown helper 99"},
    {"sched_hint returns 9", HINT, MS_HOOK_TASK_READY, "mov %r0, 9\nexit",
     "R0 at exit may be 9: sched_hint must return 0..7"},
    {"sched_hint unbounded", HINT, MS_HOOK_TASK_READY, "ldxw %r0, [%r1+68]\nexit",
     "R0 at exit may be 4294967295 (R0=scalar(0..4294967295)): sched_hint must return 0..7"},
    {"sched_hint negative", HINT, MS_HOOK_TASK_READY, "mov %r0, -1\nexit", "sched_hint must return 0..7"},
    {"sched_hint on task_end", HINT, MS_HOOK_TASK_END, "mov %r0, 1\nexit",
     "sched_hint is not allowed on hook task_end: sched_hint programs attach only to task_ready"},
    {"unreleased reservation", OBS, MS_HOOK_TASK_END,
     "lddw %r1, map[2]\nmov %r2, 8\nmov %r3, 0\ncall 131\njeq %r0, 0, +1\nstdw [%r0+0], 1\nmov %r0, 0\nexit",
     "insn 8: exit ; unreleased ringbuf reservation from insn 4"},
    {"use after submit", OBS, MS_HOOK_TASK_END,
     "lddw %r1, map[2]\nmov %r2, 8\nmov %r3, 0\ncall 131\njeq %r0, 0, +6\nmov %r6, %r0\nmov %r1, %r0\nmov %r2, 0\n"
     "call 132\nstdw [%r6+0], 1\nmov %r0, 0\nexit",
     "insn 10: *(u64 *)(r6 +0) = 1 ; R6 use of a ring buffer record after its release at insn 9"},
    {"double submit", OBS, MS_HOOK_TASK_END,
     "lddw %r1, map[2]\nmov %r2, 8\nmov %r3, 0\ncall 131\njeq %r0, 0, +7\nmov %r6, %r0\nmov %r1, %r0\nmov %r2, 0\n"
     "call 132\nmov %r1, %r6\nmov %r2, 0\ncall 133\nmov %r0, 0\nexit",
     "insn 10: r1 = r6 ; R6 use of a ring buffer record after its release at insn 9"},
    {"submit of an unchecked record", OBS, MS_HOOK_TASK_END,
     "lddw %r1, map[2]\nmov %r2, 8\nmov %r3, 0\ncall 131\nmov %r1, %r0\nmov %r2, 0\ncall 132\nmov %r0, 0\nexit",
     "R1 type=ringbuf_mem_or_null: possible NULL dereference"},
    {"record write out of bounds", OBS, MS_HOOK_TASK_END,
     "lddw %r1, map[2]\nmov %r2, 8\nmov %r3, 0\ncall 131\njeq %r0, 0, +4\nstdw [%r0+4], 1\nmov %r1, %r0\nmov %r2, 0\n"
     "call 132\nmov %r0, 0\nexit",
     "invalid access to ring buffer record: [off+4] size 8 is outside its 8 bytes"},
    {"reserve size not constant", OBS, MS_HOOK_TASK_END,
     "ldxw %r2, [%r1+16]\nlddw %r1, map[2]\nmov %r3, 0\ncall 131\nmov %r0, 0\nexit",
     "R2 must be a known constant size > 0"},
    {"infinite loop", OBS, MS_HOOK_TASK_END, "mov %r0, 0\nloop:\nja loop\nexit",
     "infinite loop detected"},
    {"loop without bound", OBS, MS_HOOK_TASK_END, "mov %r0, 0\nloop:\nadd %r0, 1\nja loop\nexit",
     "program too complex: processed 100001 insns (limit 100000)"},
    {"loop on an unknown bound", OBS, MS_HOOK_TASK_END,
     "ldxdw %r2, [%r1+24]\nmov %r0, 0\nloop:\nadd %r0, 1\njlt %r0, %r2, loop\nmov %r0, 0\nexit",
     "program too complex"},
    {"pointers of two lookups compared", OBS, MS_HOOK_TASK_END,
     LOOKUP(1) "jeq %r0, 0, out\nmov %r6, %r0\n" LOOKUP(1) "jeq %r0, 0, out\njeq %r6, %r0, out\n"
     "ldxdw %r1, [%r10-200]\nout:\nmov %r0, 0\nexit",
     "invalid read of uninitialised stack at [r10-200]"},
    {"distance of two lookups used as an offset", OBS, MS_HOOK_TASK_END,
     LOOKUP(1) "jeq %r0, 0, out\nmov %r6, %r0\n" LOOKUP(1) "jeq %r0, 0, out\nsub %r6, %r0\nmov %r1, %r10\n"
     "add %r1, %r6\nstdw [%r1-8], 0\nout:\nmov %r0, 0\nexit",
     "R1 invalid access to stack: variable offset scalar() is unbounded"},
    {"returning a pointer", OBS, MS_HOOK_TASK_END, "mov %r0, %r10\nexit",
     "R0 at exit is a pointer (fp): a program returns a scalar, never a pointer"},
    {"returning the context", HINT, MS_HOOK_TASK_READY, "mov %r0, %r1\nexit", "R0 at exit is a pointer (ctx)"},
    {"pointer multiplied", OBS, MS_HOOK_TASK_END, "mov %r2, %r10\nmul %r2, 2\nmov %r0, 0\nexit",
     "R2 pointer arithmetic with * operator prohibited (type=fp)"},
    {"pointer or", OBS, MS_HOOK_TASK_END, "mov %r2, %r1\nor %r2, 1\nmov %r0, 0\nexit",
     "pointer arithmetic with | operator prohibited"},
    {"pointer truncated", OBS, MS_HOOK_TASK_END, "mov32 %r2, %r1\nmov %r0, 0\nexit",
     "R1 partial copy of a pointer (ctx) by a 32-bit or sign-extending move"},
    {"32-bit pointer arithmetic", OBS, MS_HOOK_TASK_END, "mov %r2, %r10\nadd32 %r2, -8\nmov %r0, 0\nexit",
     "R2 32-bit arithmetic on a pointer (fp) prohibited"},
    {"pointers of different regions compared", OBS, MS_HOOK_TASK_END, "jeq %r1, %r10, +0\nmov %r0, 0\nexit",
     "comparison of pointers to different regions (ctx, fp) prohibited"},
    {"pointer compared with a number", OBS, MS_HOOK_TASK_END, "jgt %r1, 100, +0\nmov %r0, 0\nexit",
     "R1 pointer (ctx) comparison with a scalar prohibited"},
    {"pointer subtraction across regions", OBS, MS_HOOK_TASK_END, "mov %r2, %r10\nsub %r2, %r1\nmov %r0, 0\nexit",
     "subtraction of pointers to different regions (fp, ctx)"},
    {"arithmetic on a lookup result", OBS, MS_HOOK_TASK_END, LOOKUP(0) "add %r0, 8\nmov %r0, 0\nexit",
     "R0 pointer arithmetic on map_value_or_null prohibited: compare it with 0 first"},
    {"partial pointer spill", OBS, MS_HOOK_TASK_END, "stxw [%r10-8], %r1\nmov %r0, 0\nexit",
     "a pointer is stored on the stack only whole and 8-byte aligned"},
    {"partial read of a spilled pointer", OBS, MS_HOOK_TASK_END,
     "stxdw [%r10-8], %r1\nldxw %r0, [%r10-8]\nexit", "invalid read of 4 bytes of a spilled pointer at fp-8"},
    {"misaligned atomic", OBS, MS_HOOK_TASK_END, LOOKUP(4) "jeq %r0, 0, +2\nmov %r1, 1\nlock add [%r0+4], %r1\nmov %r0, 0\nexit",
     "R0 misaligned 8-byte atomic access at offset 4"},
    {"value address of a hash map", OBS, MS_HOOK_TASK_END, "lddw %r1, map[0]+0\nmov %r0, 0\nexit",
     "needs an array map"},
    {"falls off the end", OBS, MS_HOOK_TASK_END, "mov %r0, 0", "falls through past its end"},
    {"callee stack returned", OBS, MS_HOOK_TASK_END, "call local f\nmov %r0, 0\nexit\nf:\nmov %r0, %r10\nexit",
     "R0 points to the callee's own stack"},
    {"callee reads the caller's uninitialised stack", OBS, MS_HOOK_TASK_END,
     "mov %r1, %r10\nadd %r1, -8\ncall local f\nexit\nf:\nldxdw %r0, [%r1+0]\nexit",
     "invalid read of uninitialised stack at [r10-8] size 8"},
    {"callee stack pointer stored in the caller's stack", OBS, MS_HOOK_TASK_END,
     "mov %r1, %r10\nadd %r1, -8\ncall local f\nmov %r0, 0\nexit\nf:\nmov %r2, %r10\nstxdw [%r1+0], %r2\nmov %r0, 0\nexit",
     "cannot store a pointer to frame 1's stack into frame 0's stack"},
    {"pointer bytes partly overwritten then read", OBS, MS_HOOK_TASK_END,
     "stxdw [%r10-8], %r1\nstb [%r10-8], 0\nldxdw %r0, [%r10-8]\nexit",
     "invalid read of uninitialised stack at [r10-8] size 8: fp-7 was never written"},
    {"variable-offset stack read of unwritten bytes", OBS, MS_HOOK_TASK_END,
     "stdw [%r10-8], 0\nldxw %r2, [%r1+16]\nand %r2, 8\nmov %r3, %r10\nsub %r3, %r2\nldxdw %r0, [%r3-8]\nexit",
     "invalid variable-offset read: uninitialised stack at fp-16"},
    {"variable-offset write over a spilled pointer", OBS, MS_HOOK_TASK_END,
     "stxdw [%r10-16], %r1\nldxw %r2, [%r1+16]\nand %r2, 8\nmov %r3, %r10\nsub %r3, %r2\nstdw [%r3-8], 0\n"
     "mov %r0, 0\nexit",
     "variable-offset stack write may overwrite the pointer spilled at fp-16"},
    {"refinement of a copy reaches the spilled original", OBS, MS_HOOK_TASK_END,
     "ldxw %r6, [%r1+16]\nstxdw [%r10-16], %r6\nmov %r7, %r6\njgt %r7, 3, out\nldxdw %r2, [%r10-16]\n"
     "mov %r3, %r10\nsub %r3, %r2\nldxdw %r0, [%r3-1]\nout:\nmov %r0, 0\nexit",
     "R3 invalid access to stack: read [r10-4, r10+7) (variable offset, size 8) is outside [r10-512, r10)"},
    {"recursion", OBS, MS_HOOK_TASK_END, "f:\ncall local f\nmov %r0, 0\nexit", "call depth exceeds 8 frames"},
    {"jump into another function", OBS, MS_HOOK_TASK_END, "call local f\nja g\nexit\nf:\ng:\nmov %r0, 0\nexit",
     "leaves the function at insn 0"},
};

static void test_negatives(void) {
  for (size_t i = 0; i < sizeof negatives / sizeof negatives[0]; i++) {
    const struct neg *t = &negatives[i];
    struct ms_verify_stats st;
    int rc = verify_text(t->text, t->type, t->hook, 100000, &st);
    CHECKF(rc == -MS_E_VERIFY, "%s: rc %d, log:\n%s", t->name, rc, logbuf);
    CHECKF(strstr(logbuf, t->expect) != NULL, "%s: expected \"%s\" in:\n%s", t->name, t->expect, logbuf);
    CHECKF(!strncmp(nth_last_line(0), "processed ", 10), "%s: last line: %s", t->name, nth_last_line(0));
    int insn_rule = strstr(t->expect, "sched_hint is not allowed") == NULL;
    if (insn_rule) {
      CHECKF(!strncmp(nth_last_line(1), "insn ", 5) && st.err_insn >= 0, "%s: reason line: %s", t->name,
             nth_last_line(1));
      CHECKF(strstr(nth_last_line(1), t->expect) || strstr(logbuf, t->expect) < nth_last_line(1),
             "%s: reason not at the end", t->name);
    }
  }
}

/* Write to r10: ms_bpf_prog_new refuses it, and so does the verifier on a
 * program that skipped that check. */
static void test_r10(void) {
  struct ms_bpf_insn insns[] = {
      {MS_BPF_ALU64 | MS_BPF_ADD | MS_BPF_K, 10, 0, 0, -8},
      {MS_BPF_ALU64 | MS_BPF_MOV | MS_BPF_K, 0, 0, 0, 0},
      {MS_BPF_JMP | MS_BPF_EXIT, 0, 0, 0, 0},
  };
  log_reset();
  struct ms_bpf_prog_opts po = {.sz = sizeof po, .log = &tlog};
  CHECK(ms_bpf_prog_new(insns, 3, &po) == NULL && strstr(logbuf, "r10"));
  struct ms_bpf_prog raw = {.insns = insns, .n = 3, .name = "raw", .section = ""};
  struct ms_verify_opts o = {.sz = sizeof o, .kind = MS_VERIFY_HOOK, .prog_type = OBS, .hook = MS_HOOK_STEP,
                             .ctx = ms_hook_verify_ctx(OBS, MS_HOOK_STEP)};
  log_reset();
  CHECK(ms_bpf_verify(&raw, &o, &tlog, NULL) == -MS_E_VERIFY);
  CHECKF(strstr(logbuf, "insn 0: r10 += -8 ; frame pointer r10 is read-only"), "%s", logbuf);
  /* a bad jump target the syntactic check would have refused */
  struct ms_bpf_insn bad[] = {{MS_BPF_JMP | MS_BPF_JA, 0, 0, 5, 0}, {MS_BPF_JMP | MS_BPF_EXIT, 0, 0, 0, 0}};
  struct ms_bpf_prog rb = {.insns = bad, .n = 2, .name = "raw", .section = ""};
  log_reset();
  CHECK(ms_bpf_verify(&rb, &o, &tlog, NULL) == -MS_E_VERIFY && strstr(logbuf, "outside the program"));
}

static const char *const positives[] = {
    /* one lookup's pointers: their distance and order are known */
    LOOKUP(4) "jeq %r0, 0, out\nmov %r6, %r0\nadd %r6, 16\nmov %r7, %r6\nsub %r7, %r0\njgt %r0, %r6, bad\n"
    "add %r0, %r7\nldxdw %r0, [%r0+0]\nout:\nmov %r0, 0\nexit\nbad:\nldxdw %r0, [%r10-300]\nexit",
    /* spill and fill a pointer and a bounded scalar */
    "stxdw [%r10-8], %r1\nldxw %r2, [%r1+40]\nand %r2, 7\nstxdw [%r10-16], %r2\nldxdw %r1, [%r10-8]\n"
    "ldxdw %r3, [%r10-16]\nldxw %r0, [%r1+40]\nmov %r0, %r3\nexit",
    /* a key written in two halves, read by a helper */
    "stw [%r10-8], 0\nstw [%r10-4], 0\n" "mov %r2, %r10\nadd %r2, -8\nlddw %r1, map[0]\ncall 1\n"
    "jne %r0, 0, +2\nmov %r0, 0\nexit\nldxdw %r0, [%r0+0]\nexit",
    /* a bounded index into a 64-byte value, checked on a copy */
    "ldxw %r6, [%r1+64]\n" LOOKUP(4) "jeq %r0, 0, +7\nmov %r7, %r6\njgt %r7, 7, +4\nlsh %r6, 3\nadd %r0, %r6\n"
    "mov %r1, 1\nlock add [%r0+0], %r1\nmov %r0, 0\nexit",
    /* bpf-to-bpf: the callee reads the caller's stack and returns a scalar */
    "stdw [%r10-8], 5\nmov %r1, %r10\nadd %r1, -8\ncall local f\nexit\nf:\nldxdw %r0, [%r1+0]\nadd %r0, 1\nexit",
    /* a record reserved, filled, discarded on one path and submitted on the other */
    "mov %r6, %r1\nlddw %r1, map[2]\nmov %r2, 16\nmov %r3, 0\ncall 131\njeq %r0, 0, +10\nldxdw %r1, [%r6+8]\n"
    "stxdw [%r0+0], %r1\nstdw [%r0+8], 0\nmov %r1, %r0\nmov %r2, 0\nldxw %r3, [%r6+16]\njeq %r3, 0, +2\n"
    "call 132\nja +1\ncall 133\nmov %r0, 0\nexit",
    /* a variable-offset read of written bytes, an index refined through a copy and a spill */
    "stdw [%r10-16], 1\nstdw [%r10-8], 2\nldxw %r6, [%r1+16]\nstxdw [%r10-24], %r6\nmov %r7, %r6\n"
    "jgt %r7, 8, out\nldxdw %r2, [%r10-24]\nmov %r3, %r10\nsub %r3, %r2\nldxdw %r0, [%r3-8]\nexit\n"
    "out:\nmov %r0, 0\nexit",
    /* the callee writes the caller's stack; the caller reads it back */
    "mov %r1, %r10\nadd %r1, -8\ncall local f\nldxdw %r0, [%r10-8]\nexit\nf:\nstdw [%r1+0], 7\nmov %r0, 0\nexit",
    /* global data: read .rodata, loop of 16 over a stack array */
    "lddw %r1, map[3]+8\nldxdw %r6, [%r1+0]\nmov %r2, 0\nloop:\nmov %r3, %r10\nadd %r3, -128\nmov %r4, %r2\nlsh %r4, 3\n"
    "add %r3, %r4\nstxdw [%r3+0], %r6\nadd %r2, 1\njlt %r2, 16, loop\nldxdw %r0, [%r10-8]\nexit",
};

static void test_positives(void) {
  for (size_t i = 0; i < sizeof positives / sizeof positives[0]; i++) {
    int rc = verify_text(positives[i], OBS, MS_HOOK_TASK_END, 0, NULL);
    CHECKF(rc == 0, "positive %zu: rc %d\n%s\n%s", i, rc, positives[i], logbuf);
  }
  /* the ABI version check */
  struct ms_bpf_prog *p = assemble("mov %r0, 0\nexit");
  struct ms_verify_opts o = {.sz = sizeof o, .kind = MS_VERIFY_HOOK, .prog_type = OBS, .hook = MS_HOOK_STEP,
                             .abi_version = MS_HOOK_ABI_VERSION + 1, .ctx = ms_hook_verify_ctx(OBS, MS_HOOK_STEP)};
  log_reset();
  CHECK(p && ms_bpf_verify(p, &o, &tlog, NULL) == -MS_E_VERIFY && strstr(logbuf, "newer than this engine"));
  o.abi_version = MS_HOOK_ABI_VERSION;
  log_reset();
  CHECK(p && ms_bpf_verify(p, &o, &tlog, NULL) == 0);
  /* a verbose trace in the Linux shape */
  o.verbose = 1;
  log_reset();
  CHECK(p && ms_bpf_verify(p, &o, &tlog, NULL) == 0 && strstr(logbuf, "0: (b7) r0 = 0\n1: (95) exit\n"));
  /* a log too small for the trace still ends with the stats line */
  char small[1100];
  struct ms_textbuf tb = {small, sizeof small, 0, 0};
  struct ms_bpf_prog *q = assemble(positives[8]);
  CHECK(q && ms_bpf_verify(q, &o, &tb, NULL) == 0);
  CHECKF(strstr(small, "verbose trace cut") && strstr(small, "processed "), "%s", small);
  ms_bpf_prog_free(q);
  ms_bpf_prog_free(p);
}

/* ---- compiled monitors -------------------------------------------------- */

static const char *src_root(void) {
  static char root[1024];
  const char *here = __FILE__, *slash = strrchr(here, '/');
  snprintf(root, sizeof root, "%.*s/..", slash ? (int)(slash - here) : 1, slash ? here : ".");
  return root;
}

/* Compiles a .bpf.c at path with -mcpu=cpu; NULL when it fails. */
static struct ms_bpf_object *compile(const char *path, const char *cpu) {
  char obj[1200], cmd[4096];
  struct utsname u;
  uname(&u);
  const char *base = strrchr(path, '/');
  snprintf(obj, sizeof obj, "%s/%s.%s.o", tmpdir, base ? base + 1 : path, cpu);
  snprintf(cmd, sizeof cmd, "clang -O2 -g -target bpf -mcpu=%s -I'%s/include' -I/usr/include/%s-linux-gnu -c '%s' -o '%s'",
           cpu, src_root(), u.machine, path, obj);
  if (system(cmd) != 0) {
    fprintf(stderr, "failed: %s\n", cmd);
    return NULL;
  }
  log_reset();
  struct ms_bpf_object *o = ms_bpf_object_open_file(obj, &tlog);
  if (!o) fprintf(stderr, "%s: %s", obj, logbuf);
  return o;
}

/* Runs a verified program on random contexts with its maps bound: no run
 * may fail (the verifier's promise, checked by the interpreter's bounds). */
static void run_random(const struct ms_bpf_object *obj, const struct ms_bpf_prog *p, const char *what) {
  struct ms_bpf_map *maps[MS_BPF_MAX_MAPS] = {0};
  size_t n = ms_bpf_prog_map_count(p);
  for (size_t i = 0; i < n; i++) maps[i] = ms_bpf_map_new(ms_bpf_prog_map(p, i), 4, NULL);
  uint64_t seed = 0x9e3779b97f4a7c15ull;
  for (int k = 0; k < 200; k++) {
    uint64_t ctx[sizeof(struct ms_hook_ctx) / 8];
    for (size_t j = 0; j < sizeof ctx / 8; j++) {
      seed = seed * 6364136223846793005ull + 1442695040888963407ull;
      ctx[j] = k % 3 == 0 ? seed >> (seed & 63) : k % 3 == 1 ? (seed >> 60) : seed;
    }
    struct ms_bpf_env env = {.worker = (uint32_t)k % 4};
    char rlog[512] = "";
    struct ms_textbuf tb = {rlog, sizeof rlog, 0, 0};
    struct ms_bpf_run_opts ro = {.sz = sizeof ro, .helpers = helpers, .maps = maps, .n_maps = n, .ctx = ctx,
                                 .ctx_size = sizeof ctx, .env = &env, .log = &tb};
    struct ms_bpf_run_result res;
    int rc = ms_bpf_run(p, &ro, &res);
    CHECKF(rc == 0, "%s: run %d failed (%d): %s", what, k, rc, rlog);
    if (rc) break;
  }
  for (size_t i = 0; i < n; i++) ms_bpf_map_free(maps[i]);
}

static void verify_object(const char *path, const char *cpu, int expect_ok) {
  struct ms_bpf_object *obj = compile(path, cpu);
  CHECKF(obj != NULL, "%s did not build or load", path);
  if (!obj) return;
  uint32_t abi = 0;
  log_reset();
  CHECK(ms_bpf_object_abi_version(obj, &abi, &tlog) == 0 && abi <= MS_HOOK_ABI_VERSION);
  for (size_t i = 0; i < ms_bpf_object_prog_count(obj); i++) {
    const struct ms_bpf_prog *p = ms_bpf_object_prog(obj, i);
    char what[4200];
    snprintf(what, sizeof what, "%s [%s] %s", path, cpu, ms_bpf_prog_name(p));
    log_reset();
    struct ms_verify_stats st;
    int rc = ms_hook_verify_section(p, helpers, abi, 0, &tlog, &st);
    if (expect_ok) {
      CHECKF(rc == 0, "%s: rejected:\n%s", what, logbuf);
      if (!rc) run_random(obj, p, what);
    } else {
      CHECKF(rc == -MS_E_VERIFY, "%s: should be rejected:\n%s", what, logbuf);
    }
  }
  ms_bpf_object_free(obj);
}

static int is_bpf_c(const struct dirent *d) {
  size_t n = strlen(d->d_name);
  return n > 6 && !strcmp(d->d_name + n - 6, ".bpf.c") && strncmp(d->d_name, "bad_", 4);
}

static void verify_dir(const char *dir) {
  struct dirent **names;
  int n = scandir(dir, &names, is_bpf_c, alphasort);
  CHECKF(n > 0, "no monitors in %s", dir);
  for (int i = 0; i < n; i++) {
    char path[2048];
    snprintf(path, sizeof path, "%s/%s", dir, names[i]->d_name);
    verify_object(path, "v1", 1);
    verify_object(path, "v3", 1);
    free(names[i]);
  }
  free(names);
}

struct bad_expect {
  const char *prog, *msg;
};

static void test_bad_monitors(void) {
  static const struct bad_expect expect[] = {
      {"end_on_begin", "hook task_begin does not define field t_end"},
      {"no_null_check", "possible NULL dereference; compare with 0 first"},
      {"off_by_one", "invalid access to map value of vals"},
      {"leaks_record", "unreleased ringbuf reservation from insn"},
      {"prio_too_big", "R0 at exit may be 15"},
      {"stores_pointer", "pointer stored into map value (type=ctx)"},
      {"hint_updates", "helper map_update_elem (2) is not allowed in sched_hint programs"},
      {"hint_output", "helper ringbuf_output (130) is not allowed in sched_hint programs"},
      {"hint_writes", "invalid write of map vals: sched_hint programs do not update maps"},
  };
  char path[2048];
  snprintf(path, sizeof path, "%s/tests/data/verifier/bad_monitors.bpf.c", src_root());
  struct ms_bpf_object *obj = compile(path, "v1");
  CHECK(obj != NULL);
  for (size_t i = 0; obj && i < sizeof expect / sizeof expect[0]; i++) {
    const struct ms_bpf_prog *p = NULL;
    for (size_t k = 0; k < ms_bpf_object_prog_count(obj); k++)
      if (!strcmp(ms_bpf_prog_name(ms_bpf_object_prog(obj, k)), expect[i].prog)) p = ms_bpf_object_prog(obj, k);
    CHECKF(p != NULL, "no program %s", expect[i].prog);
    if (!p) continue;
    log_reset();
    int rc = ms_hook_verify_section(p, helpers, 0, 0, &tlog, NULL);
    CHECKF(rc == -MS_E_VERIFY && strstr(logbuf, expect[i].msg), "%s: expected \"%s\":\n%s", expect[i].prog,
           expect[i].msg, logbuf);
  }
  ms_bpf_object_free(obj);
}

static void test_compiled(void) {
  char dir[2048];
  snprintf(dir, sizeof dir, "%s/tests/data/verifier", src_root());
  verify_dir(dir);
  snprintf(dir, sizeof dir, "%s/monitors", src_root());
  if (access(dir, F_OK) == 0) verify_dir(dir);
  else SKIP_PART("%s absent: the shipped monitors' sources not verified", dir);
  test_bad_monitors();
}

/* ---- the scalar domain against concrete arithmetic ---------------------- */

static uint64_t rng_state = 88172645463325252ull;
static uint64_t rnd(void) {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return rng_state;
}

/* Interesting 64-bit values: small, near powers of two, near the sign bit. */
static uint64_t rnd_value(void) {
  switch (rnd() % 6) {
  case 0: return rnd() % 16;
  case 1: return (1ull << (rnd() % 64)) + (rnd() % 5) - 2;
  case 2: return (uint64_t)-(int64_t)(rnd() % 300);
  case 3: return rnd() & 0xffffffffull;
  case 4: return (1ull << 63) + rnd() % 3 - 1;
  default: return rnd();
  }
}

static int member(const struct ms_bpf_scalar *s, uint64_t v) {
  return v >= s->umin && v <= s->umax && (int64_t)v >= s->smin && (int64_t)v <= s->smax &&
         (v & ~s->t.m) == s->t.v;
}

/* A random set containing x, and a way to draw its members. */
static struct ms_bpf_scalar rnd_set(uint64_t x) {
  struct ms_bpf_scalar s;
  switch (rnd() % 4) {
  case 0: return ms_bpf_sc_const(x);
  case 1: {
    uint64_t w = rnd() % 3 == 0 ? rnd() : rnd() % 64, below = rnd() % (w == UINT64_MAX ? w : w + 1);
    uint64_t lo = below > x ? 0 : x - below, hi = lo + w < lo ? UINT64_MAX : lo + w;
    if (hi < x) hi = x;
    return ms_bpf_sc_urange(lo, hi);
  }
  case 2:
    s = ms_bpf_sc_unknown();
    s.t.m = rnd() & rnd();
    s.t.v = x & ~s.t.m;
    MS_ASSERT(!ms_bpf_sc_sync(&s));
    return s;
  default: {
    uint64_t below = rnd() % 100, above = rnd() % 100;
    int64_t lo = (int64_t)(x - below), hi = (int64_t)(x + above);
    s = ms_bpf_sc_unknown();
    s.smin = lo <= (int64_t)x ? lo : INT64_MIN;
    s.smax = hi >= (int64_t)x ? hi : INT64_MAX;
    MS_ASSERT(!ms_bpf_sc_sync(&s));
    return s;
  }
  }
}


/* A member of s other than x, when one is found quickly; else x. */
static uint64_t draw(const struct ms_bpf_scalar *s, uint64_t x) {
  for (int i = 0; i < 8; i++) {
    uint64_t v = s->t.v | (rnd() & s->t.m);
    if (member(s, v)) return v;
    uint64_t span = s->umax - s->umin;
    v = s->umin + (span == UINT64_MAX ? rnd() : rnd() % (span + 1));
    if (member(s, v)) return v;
  }
  return x;
}

/* What the interpreter computes for one ALU instruction. */
static uint64_t concrete_alu(const struct ms_bpf_insn *alu, uint64_t a, uint64_t b, int *ok) {
  struct ms_bpf_insn prog[5] = {
      {MS_BPF_LD | MS_BPF_IMM | MS_BPF_DW, 0, 0, 0, (int32_t)(uint32_t)a}, {0, 0, 0, 0, (int32_t)(uint32_t)(a >> 32)},
      {MS_BPF_LD | MS_BPF_IMM | MS_BPF_DW, 1, 0, 0, (int32_t)(uint32_t)b}, {0, 0, 0, 0, (int32_t)(uint32_t)(b >> 32)},
  };
  struct ms_bpf_insn all[7];
  memcpy(all, prog, 4 * sizeof prog[0]);
  all[4] = *alu;
  all[5] = (struct ms_bpf_insn){MS_BPF_JMP | MS_BPF_EXIT, 0, 0, 0, 0};
  struct ms_bpf_prog p = {.insns = all, .n = 6, .name = "alu", .section = ""};
  struct ms_bpf_run_opts ro = {.sz = sizeof ro};
  struct ms_bpf_run_result res;
  *ok = ms_bpf_run(&p, &ro, &res) == 0;
  return res.r0;
}

static int concrete_cond(unsigned op, int is32, uint64_t a, uint64_t b) {
  if (is32) {
    uint32_t x = (uint32_t)a, y = (uint32_t)b;
    switch (op) {
    case MS_BPF_JSGT: return (int32_t)x > (int32_t)y;
    case MS_BPF_JSGE: return (int32_t)x >= (int32_t)y;
    case MS_BPF_JSLT: return (int32_t)x < (int32_t)y;
    case MS_BPF_JSLE: return (int32_t)x <= (int32_t)y;
    default: a = x, b = y;
    }
  }
  switch (op) {
  case MS_BPF_JEQ: return a == b;
  case MS_BPF_JNE: return a != b;
  case MS_BPF_JGT: return a > b;
  case MS_BPF_JGE: return a >= b;
  case MS_BPF_JLT: return a < b;
  case MS_BPF_JLE: return a <= b;
  case MS_BPF_JSET: return (a & b) != 0;
  case MS_BPF_JNSET: return (a & b) == 0;
  case MS_BPF_JSGT: return (int64_t)a > (int64_t)b;
  case MS_BPF_JSGE: return (int64_t)a >= (int64_t)b;
  case MS_BPF_JSLT: return (int64_t)a < (int64_t)b;
  default: return (int64_t)a <= (int64_t)b;
  }
}

static const unsigned alu_ops[] = {MS_BPF_ADD, MS_BPF_SUB, MS_BPF_MUL, MS_BPF_DIV, MS_BPF_OR, MS_BPF_AND,
                                   MS_BPF_LSH, MS_BPF_RSH, MS_BPF_NEG, MS_BPF_MOD, MS_BPF_XOR, MS_BPF_MOV,
                                   MS_BPF_ARSH, MS_BPF_END};
static const unsigned jmp_ops[] = {MS_BPF_JEQ, MS_BPF_JNE, MS_BPF_JGT, MS_BPF_JGE, MS_BPF_JLT, MS_BPF_JLE,
                                   MS_BPF_JSET, MS_BPF_JNSET, MS_BPF_JSGT, MS_BPF_JSGE, MS_BPF_JSLT, MS_BPF_JSLE};

static struct ms_bpf_insn rnd_alu(void) {
  struct ms_bpf_insn in = {0};
  unsigned op = alu_ops[rnd() % (sizeof alu_ops / sizeof alu_ops[0])];
  int is64 = rnd() & 1;
  in.code = (uint8_t)((is64 ? MS_BPF_ALU64 : MS_BPF_ALU) | op | MS_BPF_X);
  in.dst_reg = 0;
  in.src_reg = 1;
  if ((op == MS_BPF_DIV || op == MS_BPF_MOD) && rnd() % 3 == 0) in.off = 1;
  if (op == MS_BPF_MOV && rnd() % 3 == 0) in.off = (int16_t)(8 << (rnd() % (is64 ? 3 : 2)));
  if (op == MS_BPF_NEG) in.code = (uint8_t)((is64 ? MS_BPF_ALU64 : MS_BPF_ALU) | op), in.src_reg = 0;
  if (op == MS_BPF_END) {
    in.src_reg = 0;
    in.imm = 16 << (rnd() % 3);
    in.code = (uint8_t)((is64 ? MS_BPF_ALU64 : MS_BPF_ALU) | op | (is64 ? 0 : (rnd() & 1) * MS_BPF_TO_BE));
  }
  return in;
}

static void test_scalar_alu(void) {
  int bad = 0;
  for (int i = 0; i < 20000 && bad < 5; i++) {
    uint64_t x = rnd_value(), y = rnd_value();
    struct ms_bpf_scalar a = rnd_set(x), b = rnd_set(y);
    MS_ASSERT(member(&a, x) && member(&b, y));
    struct ms_bpf_insn in = rnd_alu();
    struct ms_bpf_scalar r = a;
    ms_bpf_sc_alu(&in, &r, &b);
    for (int k = 0; k < 4; k++) {
      uint64_t cx = k ? draw(&a, x) : x, cy = k ? draw(&b, y) : y;
      int ok;
      uint64_t v = concrete_alu(&in, cx, cy, &ok);
      if (!ok || member(&r, v)) continue;
      char sa[160], sb[160], sr[160];
      ms_bpf_sc_print(&a, sa, sizeof sa), ms_bpf_sc_print(&b, sb, sizeof sb), ms_bpf_sc_print(&r, sr, sizeof sr);
      CHECKF(0, "alu code 0x%02x off %d imm %d: %s op %s = %s, but 0x%llx op 0x%llx = 0x%llx", in.code, in.off,
             in.imm, sa, sb, sr, (unsigned long long)cx, (unsigned long long)cy, (unsigned long long)v);
      bad++;
    }
  }
  CHECK(bad == 0);
}

static void test_scalar_refine(void) {
  int bad = 0;
  for (int i = 0; i < 40000 && bad < 5; i++) {
    uint64_t x = rnd_value(), y = rnd() % 4 == 0 ? x : rnd_value();
    struct ms_bpf_scalar a = rnd_set(x), b = rnd_set(y);
    MS_ASSERT(member(&a, x) && member(&b, y));
    unsigned op = jmp_ops[rnd() % (sizeof jmp_ops / sizeof jmp_ops[0])];
    int is32 = rnd() & 1;
    for (int k = 0; k < 4; k++) {
      uint64_t cx = k ? draw(&a, x) : x, cy = k ? draw(&b, y) : y;
      if (!concrete_cond(op, is32, cx, cy)) continue;
      struct ms_bpf_scalar ra = a, rb = b;
      int live = ms_bpf_sc_refine(op, is32, &ra, &rb) == 0;
      if (live && member(&ra, cx) && member(&rb, cy)) continue;
      char sa[160], sb[160];
      ms_bpf_sc_print(&a, sa, sizeof sa), ms_bpf_sc_print(&b, sb, sizeof sb);
      CHECKF(0, "jump op 0x%x%s: %s vs %s holds for 0x%llx, 0x%llx but the refinement %s", op, is32 ? " (32)" : "",
             sa, sb, (unsigned long long)cx, (unsigned long long)cy, live ? "drops them" : "says it cannot");
      bad++;
    }
  }
  CHECK(bad == 0);
}

static void test_scalar(void) {
  struct ms_bpf_scalar s = ms_bpf_sc_urange(0, 63), c = ms_bpf_sc_const(1);
  struct ms_bpf_insn lsh = {MS_BPF_ALU64 | MS_BPF_LSH | MS_BPF_K, 0, 0, 0, 3};
  struct ms_bpf_scalar three = ms_bpf_sc_const(3);
  ms_bpf_sc_alu(&lsh, &s, &three);
  CHECK(s.umin == 0 && s.umax == 504 && (s.t.m & 7) == 0);
  struct ms_bpf_scalar a = ms_bpf_sc_unknown(), b = ms_bpf_sc_const(16);
  CHECK(ms_bpf_sc_refine(MS_BPF_JLT, 0, &a, &b) == 0 && a.umax == 15);
  a = ms_bpf_sc_const(9);
  b = ms_bpf_sc_const(9);
  CHECK(ms_bpf_sc_refine(MS_BPF_JNE, 0, &a, &b) == -1);
  (void)c;
  test_scalar_alu();
  test_scalar_refine();
}

/* ---- the conformance suite through the verifier ------------------------- */

/* Bytes of the file's -- mem section. */
static uint8_t *mem_of(const char *text, size_t *n) {
  const char *m = strstr(text, "-- mem");
  uint8_t *out = malloc(4096);
  *n = 0;
  if (!m || !out) return out;
  for (const char *p = strchr(m, '\n'); p && *p && *n < 4096;) {
    while (*p == ' ' || *p == '\n' || *p == '\t' || *p == '\r') p++;
    if (!*p || !strncmp(p, "--", 2)) break;
    if (*p == '#') {
      p = strchr(p, '\n');
      continue;
    }
    char *end;
    unsigned long v = strtoul(p, &end, 16);
    if (end == p) break;
    out[(*n)++] = (uint8_t)v;
    p = end;
  }
  return out;
}

struct conf_count {
  int files, verified, rejected, skipped, exact;
};

static void conformance_file(const char *dir, const char *name, struct ms_bpf_helpers *h, struct conf_count *c) {
  char path[4400];
  size_t len, mem_size;
  snprintf(path, sizeof path, "%s/%s", dir, name);
  char *text = ms_test_slurp(path, &len);
  log_reset();
  struct ms_bpf_testfile *t = text ? ms_bpf_testfile_parse(text, len, &tlog) : NULL;
  struct ms_bpf_test_report rep;
  struct ms_bpf_insn *insns = NULL;
  size_t n = 0;
  if (!t || ms_bpf_testfile_check(t, &rep) < 0 || rep.status == MS_BPF_TEST_SKIP || rep.expect_error ||
      !ms_bpf_testfile_asm(t) || ms_bpf_asm(ms_bpf_testfile_asm(t), &insns, &n, &tlog)) {
    c->skipped++;
    goto out;
  }
  struct ms_bpf_prog_opts po = {.sz = sizeof po, .name = name, .log = &tlog};
  struct ms_bpf_prog *p = ms_bpf_prog_new(insns, n, &po);
  uint8_t *mem = mem_of(text, &mem_size);
  c->files++;
  log_reset();
  struct ms_verify_opts o = {.sz = sizeof o, .kind = MS_VERIFY_RAW_MEM, .mem_size = (uint32_t)mem_size, .helpers = h};
  struct ms_verify_stats st;
  int rc = p ? ms_bpf_verify(p, &o, &tlog, &st) : -1;
  CHECKF(rc == 0 || rc == -MS_E_VERIFY || !p, "%s: verifier returned %d", name, rc);
  CHECKF(!strncmp(nth_last_line(0), "processed ", 10), "%s: log ends with: %s", name, nth_last_line(0));
  if (rc == 0) {
    c->verified++;
    char rlog[256] = "";
    struct ms_textbuf tb = {rlog, sizeof rlog, 0, 0};
    struct ms_bpf_run_opts ro = {.sz = sizeof ro, .helpers = h, .mem = mem_size ? mem : NULL,
                                 .mem_size = mem_size, .log = &tb};
    struct ms_bpf_run_result res;
    int run = ms_bpf_run(p, &ro, &res);
    CHECKF(run == 0, "%s: verified but the run failed (%d): %s", name, run, rlog);
    CHECKF(run || res.r0 == rep.expected, "%s: r0 0x%llx, expected 0x%llx", name, (unsigned long long)res.r0,
           (unsigned long long)rep.expected);
    uint64_t e = rep.expected;
    CHECKF(e >= st.r0_umin && e <= st.r0_umax && (int64_t)e >= st.r0_smin && (int64_t)e <= st.r0_smax,
           "%s: expected r0 0x%llx outside the verifier's R0 range u[%llu, %llu] s[%lld, %lld]", name,
           (unsigned long long)e, (unsigned long long)st.r0_umin, (unsigned long long)st.r0_umax,
           (long long)st.r0_smin, (long long)st.r0_smax);
    if (st.r0_umin == st.r0_umax) c->exact++;
  } else if (p) {
    c->rejected++;
    if (getenv("MS_VERBOSE")) fprintf(stderr, "rejected %s: %s", name, nth_last_line(1));
  }
  free(mem);
  ms_bpf_prog_free(p);
out:
  free(insns);
  ms_bpf_testfile_free(t);
  free(text);
}

static int is_data(const struct dirent *d) {
  size_t n = strlen(d->d_name);
  return n > 5 && !strcmp(d->d_name + n - 5, ".data");
}

static void test_conformance(void) {
  const char *shared = getenv("MS_SHARED");
  char dir[2048];
  snprintf(dir, sizeof dir, "%s/third_party/bpf_conformance/tests", shared ? shared : "../shared");
  struct dirent **names;
  int n = scandir(dir, &names, is_data, alphasort);
  if (n <= 0) {
    SKIP_PART("conformance suite not found at %s", dir);
    return;
  }
  static const struct ms_bpf_helper_proto identity = {5, "identity", MS_BPF_RET_INTEGER, {MS_BPF_ARG_ANYTHING}, 0};
  struct ms_bpf_helpers *h = ms_bpf_helpers_new();
  CHECK(h && !ms_bpf_helpers_set(h, &identity, identity_fn));
  struct conf_count c = {0};
  for (int i = 0; i < n; i++) {
    conformance_file(dir, names[i]->d_name, h, &c);
    free(names[i]);
  }
  free(names);
  ms_bpf_helpers_free(h);
  printf("conformance through the verifier: %d verified of %d (%d rejected, %d files not run); "
         "r0 proven exactly for %d\n", c.verified, c.files, c.rejected, c.skipped, c.exact);
  CHECK(c.files > 250 && c.verified > c.files / 2);
}

int main(void) {
  helpers_init();
  have_clang = system("clang --version >/dev/null 2>&1") == 0;
  CHECK(mkdtemp(tmpdir) != NULL);
  test_negatives();
  test_r10();
  test_positives();
  test_scalar();
  if (have_clang) test_compiled();
  else SKIP_PART("clang not found: the compiled monitors not verified");
  test_conformance();
  char cmd[256];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
  ms_bpf_helpers_free(helpers);
  TEST_MAIN_END();
}
