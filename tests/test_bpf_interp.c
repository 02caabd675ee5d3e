/* SPDX-License-Identifier: MIT */
/* The interpreter and the instruction check: semantics the conformance suite
 * does not pin down (frames, budget, depth, helpers, map binding) and, above
 * all, that a hostile program stops with an error naming the instruction
 * instead of touching memory outside its regions. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "megascope/bpf.h"
#include "test.h"

static char logbuf[1024];
static struct ms_textbuf tlog;

static void log_reset(void) {
  logbuf[0] = 0;
  tlog = (struct ms_textbuf){logbuf, sizeof logbuf, 0, 0};
}

static struct ms_bpf_prog *prog_of(const char *text) {
  struct ms_bpf_insn *insns;
  size_t n;
  log_reset();
  if (ms_bpf_asm(text, &insns, &n, &tlog)) return NULL;
  struct ms_bpf_prog_opts po = {.sz = sizeof po, .log = &tlog};
  struct ms_bpf_prog *p = ms_bpf_prog_new(insns, n, &po);
  free(insns);
  return p;
}

/* Assembles, checks and runs text; returns the run's error. */
static int run(const char *text, struct ms_bpf_run_opts *o, struct ms_bpf_run_result *res) {
  struct ms_bpf_prog *p = prog_of(text);
  if (!p) return -12345;
  struct ms_bpf_run_opts def = {.sz = sizeof def};
  if (!o) o = &def;
  o->log = &tlog;
  int err = ms_bpf_run(p, o, res);
  ms_bpf_prog_free(p);
  return err;
}

static int insns_rejected(const struct ms_bpf_insn *insns, size_t n, const char *want) {
  log_reset();
  struct ms_bpf_prog_opts po = {.sz = sizeof po, .log = &tlog};
  struct ms_bpf_prog *p = ms_bpf_prog_new(insns, n, &po);
  ms_bpf_prog_free(p);
  return !p && strstr(logbuf, want) != NULL;
}

static void test_check_refuses(void) {
  struct ms_bpf_insn exit_ = {.code = MS_BPF_JMP | MS_BPF_EXIT};
  struct ms_bpf_insn r11[] = {{.code = MS_BPF_ALU64 | MS_BPF_MOV | MS_BPF_K, .dst_reg = 11}, exit_};
  CHECK(insns_rejected(r11, 2, "insn 0: ALU writes r10 or a register above it"));
  struct ms_bpf_insn w10[] = {{.code = MS_BPF_ALU64 | MS_BPF_ADD | MS_BPF_K, .dst_reg = 10, .imm = 8}, exit_};
  CHECK(insns_rejected(w10, 2, "insn 0:"));
  struct ms_bpf_insn far[] = {{.code = MS_BPF_JMP | MS_BPF_JA, .off = 5}, exit_};
  CHECK(insns_rejected(far, 2, "insn 0: jump to 6 is outside the program"));
  struct ms_bpf_insn into_lddw[] = {{.code = MS_BPF_JMP | MS_BPF_JA, .off = 1},
                                    {.code = MS_BPF_LD | MS_BPF_IMM | MS_BPF_DW}, {0}, exit_};
  CHECK(insns_rejected(into_lddw, 4, "lands inside an lddw"));
  struct ms_bpf_insn cut[] = {exit_, {.code = MS_BPF_LD | MS_BPF_IMM | MS_BPF_DW}};
  CHECK(insns_rejected(cut, 2, "insn 1: lddw without its second slot"));
  struct ms_bpf_insn reserved[] = {{.code = MS_BPF_ALU64 | MS_BPF_ADD | MS_BPF_K, .src_reg = 3}, exit_};
  CHECK(insns_rejected(reserved, 2, "immediate ALU with non-zero src_reg"));
  struct ms_bpf_insn callx[] = {{.code = MS_BPF_JMP | MS_BPF_CALL | MS_BPF_X, .dst_reg = 2}, exit_};
  CHECK(insns_rejected(callx, 2, "callx"));
  struct ms_bpf_insn bad_map[] = {{.code = MS_BPF_LD | MS_BPF_IMM | MS_BPF_DW, .src_reg = MS_BPF_PSEUDO_MAP_FD, .imm = 0},
                                  {0}, exit_};
  CHECK(insns_rejected(bad_map, 3, "names map 0 but the program has 0 maps"));
  struct ms_bpf_insn packet[] = {{.code = MS_BPF_LD | MS_BPF_ABS | MS_BPF_W}, exit_};
  CHECK(insns_rejected(packet, 2, "legacy packet load"));
  struct ms_bpf_insn movsx32[] = {{.code = MS_BPF_ALU | MS_BPF_MOV | MS_BPF_X, .off = 32}, exit_};
  CHECK(insns_rejected(movsx32, 2, "ALU offset"));
  CHECK(insns_rejected(NULL, 0, "empty program"));
  struct ms_bpf_insn ok[] = {{.code = MS_BPF_ALU64 | MS_BPF_MOV | MS_BPF_K, .imm = 1}, exit_};
  log_reset();
  CHECK(ms_bpf_insns_check(ok, 2, 0, &tlog) == 0);
}

static void test_memory_safety(void) {
  struct ms_bpf_run_result res;
  uint8_t mem[16] = {1, 2, 3, 4};
  struct ms_bpf_run_opts o = {.sz = sizeof o, .mem = mem, .mem_size = sizeof mem};
  CHECK(run("ldxdw %r0, [%r1+8]\nexit", &o, &res) == 0 && res.r0 == 0);
  /* one byte past the buffer */
  int err = run("mov %r0, 0\nldxdw %r0, [%r1+9]\nexit", &o, &res);
  CHECKF(err == -EFAULT && res.err_insn == 1 && strstr(logbuf, "insn 1: invalid read of 8 bytes"), "%d %s", err, logbuf);
  /* a wild pointer */
  err = run("lddw %r1, 0x1000\nstxb [%r1], %r1\nexit", &o, &res);
  CHECKF(err == -EFAULT && res.err_insn == 2 && strstr(logbuf, "insn 2: invalid write"), "%s", logbuf);
  /* below the stack and above r10 */
  CHECK(run("stxdw [%r10-512], %r1\nmov %r0, 0\nexit", &o, &res) == 0);
  CHECK(run("stxdw [%r10+0], %r1\nexit", &o, &res) == -EFAULT);
  CHECK(run("stxdw [%r10-4100], %r1\nexit", &o, &res) == -EFAULT);
  /* a pointer wrapping around the address space */
  CHECK(run("mov %r2, -1\nadd %r1, %r2\nldxb %r0, [%r1+1]\nexit", &o, &res) == 0 && res.r0 == 1);
  CHECK(run("mov %r2, -1\nadd %r1, %r2\nldxb %r0, [%r1+0]\nexit", &o, &res) == -EFAULT);
  CHECK(run("lddw %r2, 0xffffffffffffffff\nldxdw %r0, [%r2+0]\nexit", &o, &res) == -EFAULT);
  /* the context is read-only */
  uint64_t ctx[2] = {7, 9};
  struct ms_bpf_run_opts oc = {.sz = sizeof oc, .ctx = ctx, .ctx_size = sizeof ctx};
  CHECK(run("ldxdw %r0, [%r1+8]\nexit", &oc, &res) == 0 && res.r0 == 9);
  CHECK(run("stdw [%r1+0], 1\nexit", &oc, &res) == -EFAULT);
  CHECK(run("mov %r2, 1\nlock add [%r1+0], %r2\nexit", &oc, &res) == -EFAULT);
  /* misaligned atomics stop */
  CHECK(run("mov %r2, 1\nlock add [%r10-12], %r2\nexit", &o, &res) == -EFAULT && strstr(logbuf, "misaligned"));
  /* falling off the end */
  err = run("mov %r0, 0\njeq %r0, 1, +0\nmov %r0, 2", &o, &res);
  CHECKF(err == -EFAULT && res.err_insn == 3 && strstr(logbuf, "insn 3: fell off the end"), "%s", logbuf);
  CHECK(run("mov %r0, 1\nja +0", &o, &res) == -12345 && strstr(logbuf, "insn 1: jump to 2 is outside"));
}

static void test_budget_and_count(void) {
  struct ms_bpf_run_result res;
  struct ms_bpf_run_opts o = {.sz = sizeof o, .insn_budget = 1000};
  int err = run("mov %r0, 0\nL: add %r0, 1\nja L\nexit", &o, &res);
  CHECKF(err == -MS_E_LIMIT && res.insns == 1000 && strstr(logbuf, "budget of 1000"), "%d %llu", err,
         (unsigned long long)res.insns);
  o.insn_budget = 0; /* the default */
  CHECK(run("mov %r0, 0\nL: add %r0, 1\njlt %r0, 100, L\nexit", &o, &res) == 0 && res.r0 == 100);
  CHECK(res.insns == 1 + 2 * 100 + 1);
  CHECK(run("lddw %r0, 5\nexit", &o, &res) == 0 && res.insns == 2); /* lddw counts once */
}

static void test_local_calls(void) {
  struct ms_bpf_run_result res;
  /* the callee's frame is its own: writes there leave the caller's slot alone */
  const char *frames =
      "mov %r6, 6\nmov %r1, 11\nstxdw [%r10-8], %r1\ncall local f\n"
      "ldxdw %r1, [%r10-8]\njne %r1, 11, bad\njne %r6, 6, bad\nmov %r0, 1\nexit\n"
      "bad: mov %r0, 0\nexit\n"
      "f: mov %r1, 99\nstxdw [%r10-8], %r1\nmov %r6, 0\nldxdw %r0, [%r10-16]\nexit";
  CHECK(run(frames, NULL, &res) == 0 && res.r0 == 1);
  /* the callee's stack starts zeroed */
  CHECK(run("mov %r1, 5\nstxdw [%r10-520], %r1\ncall local f\nexit\nf: ldxdw %r0, [%r10-8]\nexit", NULL, &res) == 0 &&
        res.r0 == 0);
  /* unbounded recursion stops at the depth limit */
  int err = run("f: call local f\nexit", NULL, &res);
  CHECKF(err == -MS_E_LIMIT && strstr(logbuf, "call depth exceeds 8"), "%s", logbuf);
  /* seven nested calls are fine */
  CHECK(run("mov %r0, 0\ncall local a\nexit\na: add %r0, 1\njeq %r0, 7, out\ncall local a\nout: exit", NULL, &res) == 0 &&
        res.r0 == 7);
}

static uint64_t add_helper(struct ms_bpf_exec *x, uint64_t a1, uint64_t a2, uint64_t a3, uint64_t a4,
                           uint64_t a5) {
  return a1 + a2 + a3 + a4 + a5 + ms_bpf_exec_env(x)->worker;
}

static uint64_t peek_helper(struct ms_bpf_exec *x, uint64_t a1, uint64_t a2, uint64_t a3, uint64_t a4,
                            uint64_t a5) {
  const uint8_t *p = ms_bpf_exec_mem(x, a1, a2, 0);
  if (!p) {
    ms_bpf_exec_abort(x, -EFAULT, "peek of %llu bytes outside", (unsigned long long)a2);
    return 0;
  }
  return p[0];
}

static uint64_t fake_clock(void *user) { return *(uint64_t *)user; }

static void test_helpers(void) {
  struct ms_bpf_helpers *h = ms_bpf_helpers_new();
  struct ms_bpf_run_result res;
  struct ms_bpf_helper_proto add = {MS_BPF_HELPER_OWN_BASE + 1, "add5", MS_BPF_RET_INTEGER, {1, 1, 1, 1, 1}, 0};
  struct ms_bpf_helper_proto peek = {MS_BPF_HELPER_OWN_BASE + 2, "peek", MS_BPF_RET_INTEGER,
                                     {MS_BPF_ARG_MEM, MS_BPF_ARG_SIZE}, 0};
  CHECK(ms_bpf_helpers_set(h, &add, add_helper) == 0);
  CHECK(ms_bpf_helpers_set(h, &peek, peek_helper) == 0);
  struct ms_bpf_helper_proto out = add;
  out.id = 300;
  CHECK(ms_bpf_helpers_set(h, &out, add_helper) == -ERANGE);
  out.id = MS_BPF_HELPER_OWN_BASE + MS_BPF_HELPER_OWN_MAX;
  CHECK(ms_bpf_helpers_set(h, &out, add_helper) == -ERANGE);
  CHECK(ms_bpf_helpers_add_std(h) == 0);
  CHECK(ms_bpf_helpers_proto(h, 1) && !strcmp(ms_bpf_helpers_proto(h, 1)->name, "map_lookup_elem"));
  CHECK(ms_bpf_helpers_proto(h, MS_BPF_HELPER_OWN_BASE + 1) == ms_bpf_helpers_proto(h, 65537));
  CHECK(ms_bpf_helpers_proto(h, 4) == NULL);
  const struct ms_bpf_helper_proto *p131 = ms_bpf_helper_proto_std(131);
  CHECK(p131 && p131->ret == MS_BPF_RET_RINGBUF_REC_OR_NULL && p131->args[1] == MS_BPF_ARG_CONST_SIZE);

  struct ms_bpf_env env = {.worker = 3};
  struct ms_bpf_run_opts o = {.sz = sizeof o, .helpers = h, .env = &env};
  CHECK(run("mov %r1, 1\nmov %r2, 2\nmov %r3, 3\nmov %r4, 4\nmov %r5, 5\ncall 65537\nexit", &o, &res) == 0 &&
        res.r0 == 18);
  CHECK(run("call 8\nexit", &o, &res) == 0 && res.r0 == 3); /* get_smp_processor_id = worker */
  uint64_t now = 123456789;
  env.clock = fake_clock;
  env.clock_user = &now;
  CHECK(run("call 5\nexit", &o, &res) == 0 && res.r0 == 123456789);
  env.clock = NULL;
  CHECK(run("call 5\nexit", &o, &res) == 0 && res.r0 > 0 && res.r0 <= ms_now_ns());
  /* a helper checks pointers with the run's regions, and may stop the run */
  CHECK(run("stb [%r10-1], 77\nmov %r1, %r10\nadd %r1, -1\nmov %r2, 1\ncall 65538\nexit", &o, &res) == 0 &&
        res.r0 == 77);
  int err = run("mov %r0, 0\nmov %r1, %r10\nmov %r2, 1\ncall 65538\nexit", &o, &res);
  CHECKF(err == -EFAULT && res.err_insn == 3 && strstr(logbuf, "insn 3: helper 65538: peek of 1 bytes outside"),
         "%s", logbuf);
  err = run("call 4\nexit", &o, &res);
  CHECK(err == -ENOENT && strstr(logbuf, "insn 0: call to unknown helper 4"));
  /* std map helpers refuse a value that is not a bound map */
  err = run("mov %r1, 42\nmov %r2, %r10\ncall 1\nexit", &o, &res);
  CHECKF(err == -EINVAL && strstr(logbuf, "not a map bound to this run"), "%s", logbuf);
  /* no table at all */
  struct ms_bpf_run_opts none = {.sz = sizeof none};
  CHECK(run("call 5\nexit", &none, &res) == -ENOENT);
  ms_bpf_helpers_free(h);
}

static void test_map_binding(void) {
  struct ms_bpf_map_def def = {.name = "a", .type = MS_BPF_MAP_ARRAY, .key_size = 4, .value_size = 8, .max_entries = 4};
  struct ms_bpf_insn insns[] = {
      {.code = MS_BPF_LD | MS_BPF_IMM | MS_BPF_DW, .dst_reg = 1, .src_reg = MS_BPF_PSEUDO_MAP_VALUE, .imm = 0},
      {.imm = 4},
      {.code = MS_BPF_LDX | MS_BPF_MEM | MS_BPF_W, .dst_reg = 0, .src_reg = 1},
      {.code = MS_BPF_JMP | MS_BPF_EXIT},
  };
  log_reset();
  struct ms_bpf_prog_opts po = {.sz = sizeof po, .maps = &def, .n_maps = 1, .log = &tlog};
  struct ms_bpf_prog *p = ms_bpf_prog_new(insns, 4, &po);
  CHECK(p && ms_bpf_prog_map_count(p) == 1 && ms_bpf_prog_map(p, 0)->value_size == 8);
  struct ms_bpf_run_result res;
  struct ms_bpf_run_opts o = {.sz = sizeof o, .log = &tlog};
  int err = ms_bpf_run(p, &o, &res);
  CHECKF(err == -EINVAL && strstr(logbuf, "insn 0: map 0 is not bound"), "%s", logbuf);
  struct ms_bpf_map *m = ms_bpf_map_new(&def, 1, &tlog);
  uint32_t k = 0;
  uint64_t v = 0xaabbccdd11223344ull;
  CHECK(m && ms_bpf_map_update(m, &k, &v, MS_BPF_ANY, 0) == 0);
  o.maps = &m;
  o.n_maps = 1;
  CHECK(ms_bpf_run(p, &o, &res) == 0 && res.r0 == 0xaabbccdd);
  ms_bpf_prog_free(p);
  ms_bpf_map_free(m);
}

/* ---- random well-formed programs ---------------------------------------- */

static uint64_t rng = 0x853c49e6748fea9bull;
static uint32_t rnd(uint32_t n) {
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return (uint32_t)(rng % n);
}

/* One instruction (two for lddw) that passes the encoding check, except that
 * jumps may land inside an lddw (the check refuses those programs). */
static size_t random_insn(struct ms_bpf_insn *in, size_t i, size_t n, size_t n_maps) {
  static const int32_t helpers[] = {1, 2, 3, 5, 8, 130, 131, 132, 133, 4};
  static const int32_t atomics[] = {0x00, 0x01, 0x40, 0x41, 0x50, 0x51, 0xa0, 0xa1, 0xe1, 0xf1};
  static const uint8_t sizes[] = {MS_BPF_W, MS_BPF_H, MS_BPF_B, MS_BPF_DW};
  static const uint8_t conds[] = {1, 2, 3, 4, 5, 6, 7, 10, 11, 12, 13}; /* JEQ..JSGE, JLT..JSLE */
  memset(in, 0, sizeof *in);
  uint8_t dst = (uint8_t)rnd(10), src = (uint8_t)(rnd(3) ? rnd(11) : 10);
  int16_t off = (int16_t)(rnd(4) ? (int)rnd(600) - 536 : (int)rnd(70000) - 35000);
  switch (rnd(9)) {
  case 0: case 1: { /* ALU */
    uint8_t cls = rnd(2) ? MS_BPF_ALU64 : MS_BPF_ALU, op = (uint8_t)(rnd(14) << 4), x = rnd(2) ? MS_BPF_X : MS_BPF_K;
    if (op == MS_BPF_NEG) x = MS_BPF_K;
    if (op == MS_BPF_END && cls == MS_BPF_ALU64) x = MS_BPF_K;
    *in = (struct ms_bpf_insn){.code = (uint8_t)(cls | op | x), .dst_reg = dst};
    if (op == MS_BPF_END) in->imm = 16 << rnd(3);
    else if (op != MS_BPF_NEG && x == MS_BPF_X) in->src_reg = src;
    else if (op != MS_BPF_NEG) in->imm = (int32_t)(rnd(3) ? rnd(64) - 8 : (uint32_t)rng);
    if ((op == MS_BPF_DIV || op == MS_BPF_MOD) && rnd(2)) in->off = 1;
    if (op == MS_BPF_MOV && x == MS_BPF_X && rnd(3) == 0) in->off = (int16_t)(8 << rnd(cls == MS_BPF_ALU64 ? 3 : 2));
    return 1;
  }
  case 2: /* load */
    *in = (struct ms_bpf_insn){.code = (uint8_t)(MS_BPF_LDX | MS_BPF_MEM | sizes[rnd(4)]), .dst_reg = dst, .src_reg = src, .off = off};
    if (rnd(4) == 0 && MS_BPF_SIZE(in->code) != MS_BPF_DW) in->code = (uint8_t)(MS_BPF_LDX | MS_BPF_MEMSX | MS_BPF_SIZE(in->code));
    return 1;
  case 3: /* store */
    if (rnd(4) == 0) {
      *in = (struct ms_bpf_insn){.code = (uint8_t)(MS_BPF_STX | MS_BPF_ATOMIC | (rnd(2) ? MS_BPF_W : MS_BPF_DW)),
                                 .dst_reg = (uint8_t)rnd(11), .src_reg = src, .off = off, .imm = atomics[rnd(10)]};
    } else if (rnd(2)) {
      *in = (struct ms_bpf_insn){.code = (uint8_t)(MS_BPF_STX | MS_BPF_MEM | sizes[rnd(4)]), .dst_reg = (uint8_t)rnd(11), .src_reg = src, .off = off};
    } else {
      *in = (struct ms_bpf_insn){.code = (uint8_t)(MS_BPF_ST | MS_BPF_MEM | sizes[rnd(4)]), .dst_reg = (uint8_t)rnd(11), .off = off, .imm = (int32_t)rnd(1000)};
    }
    return 1;
  case 4: /* conditional jump */
    *in = (struct ms_bpf_insn){.code = (uint8_t)((rnd(2) ? MS_BPF_JMP : MS_BPF_JMP32) | conds[rnd(11)] << 4),
                               .dst_reg = (uint8_t)rnd(11), .off = (int16_t)((int)rnd((uint32_t)n) - (int)i - 1)};
    if (rnd(2)) in->code |= MS_BPF_X, in->src_reg = src;
    else in->imm = (int32_t)rnd(64);
    return 1;
  case 5: /* ja, ja32, local call */
    if (rnd(3) == 0) *in = (struct ms_bpf_insn){.code = MS_BPF_JMP32 | MS_BPF_JA, .imm = (int32_t)rnd((uint32_t)n) - (int32_t)i - 1};
    else if (rnd(2)) *in = (struct ms_bpf_insn){.code = MS_BPF_JMP | MS_BPF_JA, .off = (int16_t)((int)rnd((uint32_t)n) - (int)i - 1)};
    else *in = (struct ms_bpf_insn){.code = MS_BPF_JMP | MS_BPF_CALL, .src_reg = MS_BPF_PSEUDO_CALL, .imm = (int32_t)rnd((uint32_t)n) - (int32_t)i - 1};
    return 1;
  case 6: /* helper call */
    *in = (struct ms_bpf_insn){.code = MS_BPF_JMP | MS_BPF_CALL, .imm = helpers[rnd(10)]};
    return 1;
  case 7: /* lddw: a constant, a map or a map value */
    if (i + 1 >= n) break;
    in[0] = (struct ms_bpf_insn){.code = MS_BPF_LD | MS_BPF_IMM | MS_BPF_DW, .dst_reg = dst};
    in[1] = (struct ms_bpf_insn){0};
    if (rnd(2)) {
      in[0].src_reg = rnd(3) ? MS_BPF_PSEUDO_MAP_FD : MS_BPF_PSEUDO_MAP_VALUE;
      in[0].imm = (int32_t)rnd((uint32_t)n_maps);
      if (in[0].src_reg == MS_BPF_PSEUDO_MAP_VALUE) in[1].imm = (int32_t)rnd(40);
    } else {
      in[0].imm = (int32_t)(uint32_t)rng;
      in[1].imm = (int32_t)rnd(3);
    }
    return 2;
  default: break;
  }
  *in = (struct ms_bpf_insn){.code = MS_BPF_JMP | MS_BPF_EXIT};
  return 1;
}

/* Unverified but well-formed programs, with maps and helpers bound, stop or
 * finish; whatever they do, the process survives (ASan builds watch too). */
static void test_random_programs(void) {
  struct ms_bpf_map_def defs[3] = {
      {.name = "a", .type = MS_BPF_MAP_ARRAY, .key_size = 4, .value_size = 16, .max_entries = 4},
      {.name = "h", .type = MS_BPF_MAP_HASH, .key_size = 4, .value_size = 8, .max_entries = 8},
      {.name = "r", .type = MS_BPF_MAP_RINGBUF, .max_entries = 4096}};
  struct ms_bpf_map *maps[3];
  for (int i = 0; i < 3; i++) maps[i] = ms_bpf_map_new(&defs[i], 2, NULL);
  struct ms_bpf_helpers *h = ms_bpf_helpers_new();
  ms_bpf_helpers_add_std(h);
  uint8_t mem[64];
  struct ms_bpf_env env = {.worker = 1};
  struct ms_bpf_run_opts o = {.sz = sizeof o, .helpers = h, .maps = maps, .n_maps = 3, .mem = mem,
                              .mem_size = sizeof mem, .insn_budget = 5000, .env = &env};
  struct ms_bpf_prog_opts po = {.sz = sizeof po, .maps = defs, .n_maps = 3};
  int accepted = 0, finished = 0, odd = 0;
  for (int iter = 0; iter < 20000; iter++) {
    struct ms_bpf_insn insns[48];
    size_t n = 4 + rnd(44);
    for (size_t i = 0; i < n;) i += random_insn(&insns[i], i, n, 3);
    insns[n - 1] = (struct ms_bpf_insn){.code = MS_BPF_JMP | MS_BPF_EXIT};
    if (insns[n - 2].code == (MS_BPF_LD | MS_BPF_IMM | MS_BPF_DW)) insns[n - 2] = insns[n - 1];
    struct ms_bpf_prog *p = ms_bpf_prog_new(insns, n, &po);
    if (!p) continue;
    accepted++;
    memset(mem, 0x5a, sizeof mem);
    struct ms_bpf_run_result res;
    int err = ms_bpf_run(p, &o, &res);
    finished += err == 0;
    odd += err && err != -EFAULT && err != -MS_E_LIMIT && err != -ENOENT && err != -EINVAL;
    odd += (err == 0) != (res.err_insn < 0) || res.insns > 5000;
    ms_bpf_prog_free(p);
  }
  CHECKF(accepted > 5000 && finished > 500 && odd == 0, "%d accepted, %d finished, %d odd", accepted, finished, odd);
  fprintf(stderr, "random programs: %d of 20000 well-formed, %d ran to exit, the rest stopped\n", accepted, finished);
  for (int i = 0; i < 3; i++) ms_bpf_map_free(maps[i]);
  ms_bpf_helpers_free(h);
}

int main(void) {
  test_check_refuses();
  test_memory_safety();
  test_budget_and_count();
  test_local_calls();
  test_helpers();
  test_map_binding();
  test_random_programs();
  TEST_MAIN_END();
}
