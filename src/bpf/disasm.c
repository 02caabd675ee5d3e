/* SPDX-License-Identifier: MIT */
/* The two text forms of one instruction:
 *  - ms_bpf_insn_asm: the uBPF-style syntax the assembler reads. Each line is
 *    assembled back and compared, and an instruction the syntax cannot carry
 *    (a non-zero reserved field, an unknown opcode) prints as `.insn 0x...`,
 *    so a disassembly always reassembles to the same words.
 *  - ms_bpf_insn_linux: the Linux verifier log's form (kernel/bpf/disasm.c),
 *    e.g. `r3 = *(u64 *)(r1 +40)`, `if w1 > 0x5 goto pc+3`, `call 1`, which
 *    the verifier's `insn N: ...` lines print. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "bpf/bpf_internal.h"

const char *const ms_bpf_alu_names[16] = {
    "add", "sub", "mul", "div", "or", "and", "lsh", "rsh", "neg", "mod", "xor", "mov", "arsh", "end",
};
const char *const ms_bpf_jmp_names[16] = {
    "ja", "jeq", "jgt", "jge", "jset", "jne", "jsgt", "jsge", "call", "exit", "jlt", "jle", "jslt", "jsle",
};

static const char *const size_suffix[4] = {"w", "h", "b", "dw"}; /* by MS_BPF_SIZE >> 3 */
static const char *const size_type[4] = {"u32", "u16", "u8", "u64"};
static const char *const ssize_type[4] = {"s32", "s16", "s8", "?"};

static int is_lddw(const struct ms_bpf_insn *in) { return in->code == (MS_BPF_LD | MS_BPF_IMM | MS_BPF_DW); }

/* ---- uBPF-style --------------------------------------------------------- */

/* Small immediates read best in decimal; large ones as their 32 bits in hex. */
static void fmt_imm(char *buf, size_t size, int32_t v) {
  if (v > -65536 && v < 65536)
    snprintf(buf, size, "%d", v);
  else
    snprintf(buf, size, "0x%x", (uint32_t)v);
}

static void fmt_mem(char *buf, size_t size, unsigned reg, int16_t off) {
  if (off)
    snprintf(buf, size, "[%%r%u%+d]", reg, off);
  else
    snprintf(buf, size, "[%%r%u]", reg);
}

static void asm_alu(const struct ms_bpf_insn *in, char *buf, size_t size) {
  int is32 = MS_BPF_CLASS(in->code) == MS_BPF_ALU;
  unsigned op = MS_BPF_OP(in->code) >> 4;
  const char *w = is32 ? "32" : "";
  char imm[24];
  if (op == (MS_BPF_END >> 4)) {
    const char *kind = !is32 ? "bswap" : MS_BPF_SRC(in->code) ? "be" : "le";
    snprintf(buf, size, "%s%d %%r%u", kind, in->imm, in->dst_reg);
    return;
  }
  if (op == (MS_BPF_NEG >> 4)) {
    snprintf(buf, size, "neg%s %%r%u", w, in->dst_reg);
    return;
  }
  char name[24];
  if (op == (MS_BPF_MOV >> 4) && in->off)
    snprintf(name, sizeof name, "movsx%d%s", in->off, is32 ? "32" : "64");
  else if ((op == (MS_BPF_DIV >> 4) || op == (MS_BPF_MOD >> 4)) && in->off == 1)
    snprintf(name, sizeof name, "s%s%s", ms_bpf_alu_names[op], w);
  else
    snprintf(name, sizeof name, "%s%s", ms_bpf_alu_names[op], w);
  if (MS_BPF_SRC(in->code) == MS_BPF_X) {
    snprintf(buf, size, "%s %%r%u, %%r%u", name, in->dst_reg, in->src_reg);
  } else {
    fmt_imm(imm, sizeof imm, in->imm);
    snprintf(buf, size, "%s %%r%u, %s", name, in->dst_reg, imm);
  }
}

static void asm_jmp(const struct ms_bpf_insn *in, char *buf, size_t size) {
  int is32 = MS_BPF_CLASS(in->code) == MS_BPF_JMP32;
  unsigned op = MS_BPF_OP(in->code);
  char imm[24];
  switch (op) {
  case MS_BPF_JA:
    if (is32) snprintf(buf, size, "ja32 %+d", in->imm);
    else snprintf(buf, size, "ja %+d", in->off);
    return;
  case MS_BPF_EXIT: snprintf(buf, size, "exit"); return;
  case MS_BPF_CALL:
    if (MS_BPF_SRC(in->code) == MS_BPF_X) snprintf(buf, size, "call %%r%u", in->dst_reg);
    else if (in->src_reg == MS_BPF_PSEUDO_CALL) snprintf(buf, size, "call local %+d", in->imm);
    else if (in->src_reg == 2) snprintf(buf, size, "call runtime %d", in->imm);
    else snprintf(buf, size, "call %d", in->imm);
    return;
  default: {
    const char *name = ms_bpf_jmp_names[op >> 4];
    if (!name) {
      buf[0] = 0;
      return;
    }
    if (MS_BPF_SRC(in->code) == MS_BPF_X)
      snprintf(buf, size, "%s%s %%r%u, %%r%u, %+d", name, is32 ? "32" : "", in->dst_reg, in->src_reg, in->off);
    else {
      fmt_imm(imm, sizeof imm, in->imm);
      snprintf(buf, size, "%s%s %%r%u, %s, %+d", name, is32 ? "32" : "", in->dst_reg, imm, in->off);
    }
  }
  }
}

static void asm_atomic(const struct ms_bpf_insn *in, char *buf, size_t size) {
  const char *w = MS_BPF_SIZE(in->code) == MS_BPF_W ? "32" : "";
  const char *op;
  switch (in->imm & ~MS_BPF_FETCH) {
  case MS_BPF_ADD: op = "add"; break;
  case MS_BPF_OR: op = "or"; break;
  case MS_BPF_AND: op = "and"; break;
  case MS_BPF_XOR: op = "xor"; break;
  case MS_BPF_XCHG & ~MS_BPF_FETCH: op = "xchg"; break;
  default: op = "cmpxchg"; break;
  }
  int plain_fetch = (in->imm & MS_BPF_FETCH) && in->imm != MS_BPF_XCHG && in->imm != MS_BPF_CMPXCHG;
  char mem[40];
  fmt_mem(mem, sizeof mem, in->dst_reg, in->off);
  snprintf(buf, size, "lock %s%s%s %s, %%r%u", plain_fetch ? "fetch " : "", op, w, mem, in->src_reg);
}

/* The text of insns[idx] before the round-trip check; *slots 2 for lddw. */
static void asm_text(const struct ms_bpf_insn *insns, size_t n, size_t idx, char *buf, size_t size,
                     int *slots) {
  const struct ms_bpf_insn *in = &insns[idx];
  char mem[40], imm[24];
  unsigned sz = MS_BPF_SIZE(in->code) >> 3;
  *slots = 1;
  buf[0] = 0;
  switch (MS_BPF_CLASS(in->code)) {
  case MS_BPF_ALU: case MS_BPF_ALU64: asm_alu(in, buf, size); break;
  case MS_BPF_JMP: case MS_BPF_JMP32: asm_jmp(in, buf, size); break;
  case MS_BPF_LD:
    if (!is_lddw(in) || idx + 1 >= n) break;
    *slots = 2;
    if (in->src_reg == 0) {
      uint64_t v = (uint64_t)(uint32_t)in[0].imm | (uint64_t)(uint32_t)in[1].imm << 32;
      snprintf(buf, size, "lddw %%r%u, 0x%llx", in->dst_reg, (unsigned long long)v);
    } else {
      const char *kind = in->src_reg >= MS_BPF_PSEUDO_MAP_IDX ? "mapidx" : "map";
      int value = in->src_reg == MS_BPF_PSEUDO_MAP_VALUE || in->src_reg == MS_BPF_PSEUDO_MAP_IDX_VALUE;
      if (value) snprintf(buf, size, "lddw %%r%u, %s[%d]+%u", in->dst_reg, kind, in->imm, (uint32_t)in[1].imm);
      else snprintf(buf, size, "lddw %%r%u, %s[%d]", in->dst_reg, kind, in->imm);
    }
    break;
  case MS_BPF_LDX:
    fmt_mem(mem, sizeof mem, in->src_reg, in->off);
    snprintf(buf, size, "ldx%s%s %%r%u, %s", MS_BPF_MODE(in->code) == MS_BPF_MEMSX ? "s" : "",
             size_suffix[sz], in->dst_reg, mem);
    break;
  case MS_BPF_ST:
    fmt_mem(mem, sizeof mem, in->dst_reg, in->off);
    fmt_imm(imm, sizeof imm, in->imm);
    snprintf(buf, size, "st%s %s, %s", size_suffix[sz], mem, imm);
    break;
  default:
    if (MS_BPF_MODE(in->code) == MS_BPF_ATOMIC) {
      asm_atomic(in, buf, size);
      break;
    }
    fmt_mem(mem, sizeof mem, in->dst_reg, in->off);
    snprintf(buf, size, "stx%s %s, %%r%u", size_suffix[sz], mem, in->src_reg);
  }
}

int ms_bpf_insn_asm(const struct ms_bpf_insn *insns, size_t n, size_t idx, char *buf, size_t size) {
  if (!insns || idx >= n || !buf || size == 0) return -EINVAL;
  char text[128];
  int slots;
  asm_text(insns, n, idx, text, sizeof text, &slots);
  struct ms_bpf_insn back[2];
  size_t n_back = 0;
  if (text[0] && ms_bpf_asm_line(text, back, &n_back) == 0 && n_back == (size_t)slots &&
      !memcmp(back, &insns[idx], n_back * sizeof back[0])) {
    snprintf(buf, size, "%s", text);
    return slots;
  }
  uint64_t word;
  memcpy(&word, &insns[idx], sizeof word);
  snprintf(buf, size, ".insn 0x%016llx", (unsigned long long)word);
  return 1;
}

/* ---- Linux verifier style ----------------------------------------------- */

static const char *const linux_alu_ops[16] = {
    "+=", "-=", "*=", "/=", "|=", "&=", "<<=", ">>=", "neg", "%=", "^=", "=", "s>>=", "endian",
};
static const char *const linux_jmp_ops[16] = {
    "jmp", "==", ">", ">=", "&", "!=", "s>", "s>=", "call", "exit", "<", "<=", "s<", "s<=",
};

static void linux_alu(const struct ms_bpf_insn *in, char *buf, size_t size) {
  int is64 = MS_BPF_CLASS(in->code) == MS_BPF_ALU64;
  char r = is64 ? 'r' : 'w';
  unsigned op = MS_BPF_OP(in->code);
  if (op == MS_BPF_END) {
    if (is64) snprintf(buf, size, "r%u = bswap%d r%u", in->dst_reg, in->imm, in->dst_reg);
    else snprintf(buf, size, "r%u = %s%d r%u", in->dst_reg, MS_BPF_SRC(in->code) ? "be" : "le", in->imm, in->dst_reg);
    return;
  }
  if (op == MS_BPF_NEG) {
    snprintf(buf, size, "%c%u = -%c%u", r, in->dst_reg, r, in->dst_reg);
    return;
  }
  const char *sym = linux_alu_ops[op >> 4];
  if ((op == MS_BPF_DIV || op == MS_BPF_MOD) && in->off == 1) sym = op == MS_BPF_DIV ? "s/=" : "s%=";
  if (MS_BPF_SRC(in->code) == MS_BPF_X && op == MS_BPF_MOV && in->off)
    snprintf(buf, size, "%c%u = (s%d)%c%u", r, in->dst_reg, in->off, r, in->src_reg);
  else if (MS_BPF_SRC(in->code) == MS_BPF_X)
    snprintf(buf, size, "%c%u %s %c%u", r, in->dst_reg, sym, r, in->src_reg);
  else
    snprintf(buf, size, "%c%u %s %d", r, in->dst_reg, sym, in->imm);
}

static void linux_jmp(const struct ms_bpf_insn *in, char *buf, size_t size) {
  int is32 = MS_BPF_CLASS(in->code) == MS_BPF_JMP32;
  char r = is32 ? 'w' : 'r';
  unsigned op = MS_BPF_OP(in->code);
  switch (op) {
  case MS_BPF_JA:
    if (is32) snprintf(buf, size, "gotol pc%+d", in->imm);
    else snprintf(buf, size, "goto pc%+d", in->off);
    return;
  case MS_BPF_EXIT: snprintf(buf, size, "exit"); return;
  case MS_BPF_CALL:
    if (MS_BPF_SRC(in->code) == MS_BPF_X) snprintf(buf, size, "callx r%u", in->dst_reg);
    else if (in->src_reg == MS_BPF_PSEUDO_CALL) snprintf(buf, size, "call pc%+d", in->imm);
    else snprintf(buf, size, "call %u", (uint32_t)in->imm);
    return;
  default:
    if (!linux_jmp_ops[op >> 4]) snprintf(buf, size, "(%02x) unknown jump", in->code);
    else if (MS_BPF_SRC(in->code) == MS_BPF_X)
      snprintf(buf, size, "if %c%u %s %c%u goto pc%+d", r, in->dst_reg, linux_jmp_ops[op >> 4], r,
               in->src_reg, in->off);
    else
      snprintf(buf, size, "if %c%u %s 0x%x goto pc%+d", r, in->dst_reg, linux_jmp_ops[op >> 4],
               (uint32_t)in->imm, in->off);
  }
}

static void linux_atomic(const struct ms_bpf_insn *in, char *buf, size_t size) {
  static const char *const names[16] = {[MS_BPF_ADD >> 4] = "add", [MS_BPF_OR >> 4] = "or",
                                        [MS_BPF_AND >> 4] = "and", [MS_BPF_XOR >> 4] = "xor"};
  unsigned sz = MS_BPF_SIZE(in->code) >> 3;
  const char *w = MS_BPF_SIZE(in->code) == MS_BPF_DW ? "64" : "";
  int op = in->imm & ~MS_BPF_FETCH;
  if (in->imm == MS_BPF_CMPXCHG)
    snprintf(buf, size, "r0 = atomic%s_cmpxchg((%s *)(r%u %+d), r0, r%u)", w, size_type[sz],
             in->dst_reg, in->off, in->src_reg);
  else if (in->imm == MS_BPF_XCHG)
    snprintf(buf, size, "r%u = atomic%s_xchg((%s *)(r%u %+d), r%u)", in->src_reg, w, size_type[sz],
             in->dst_reg, in->off, in->src_reg);
  else if (op > 0xf0 || !names[op >> 4] || op & 0x0f)
    snprintf(buf, size, "(%02x) unknown atomic 0x%x", in->code, (uint32_t)in->imm);
  else if (in->imm & MS_BPF_FETCH)
    snprintf(buf, size, "r%u = atomic%s_fetch_%s((%s *)(r%u %+d), r%u)", in->src_reg, w,
             names[op >> 4], size_type[sz], in->dst_reg, in->off, in->src_reg);
  else
    snprintf(buf, size, "lock *(%s *)(r%u %+d) %s r%u", size_type[sz], in->dst_reg, in->off,
             linux_alu_ops[op >> 4], in->src_reg);
}

int ms_bpf_insn_linux(const struct ms_bpf_insn *insns, size_t n, size_t idx, char *buf, size_t size) {
  if (!insns || idx >= n || !buf || size == 0) return -EINVAL;
  const struct ms_bpf_insn *in = &insns[idx];
  unsigned sz = MS_BPF_SIZE(in->code) >> 3;
  switch (MS_BPF_CLASS(in->code)) {
  case MS_BPF_ALU: case MS_BPF_ALU64: linux_alu(in, buf, size); return 1;
  case MS_BPF_JMP: case MS_BPF_JMP32: linux_jmp(in, buf, size); return 1;
  case MS_BPF_LDX:
    snprintf(buf, size, "r%u = *(%s *)(r%u %+d)", in->dst_reg,
             MS_BPF_MODE(in->code) == MS_BPF_MEMSX ? ssize_type[sz] : size_type[sz], in->src_reg, in->off);
    return 1;
  case MS_BPF_ST:
    snprintf(buf, size, "*(%s *)(r%u %+d) = %d", size_type[sz], in->dst_reg, in->off, in->imm);
    return 1;
  case MS_BPF_STX:
    if (MS_BPF_MODE(in->code) == MS_BPF_ATOMIC) linux_atomic(in, buf, size);
    else snprintf(buf, size, "*(%s *)(r%u %+d) = r%u", size_type[sz], in->dst_reg, in->off, in->src_reg);
    return 1;
  default:
    if (!is_lddw(in) || idx + 1 >= n) {
      snprintf(buf, size, "(%02x) unknown load", in->code);
      return 1;
    }
    if (in->src_reg == MS_BPF_PSEUDO_MAP_FD || in->src_reg == MS_BPF_PSEUDO_MAP_IDX)
      snprintf(buf, size, "r%u = map[%d]", in->dst_reg, in->imm);
    else if (in->src_reg == MS_BPF_PSEUDO_MAP_VALUE || in->src_reg == MS_BPF_PSEUDO_MAP_IDX_VALUE)
      snprintf(buf, size, "r%u = map[%d][0]+%u", in->dst_reg, in->imm, (uint32_t)in[1].imm);
    else
      snprintf(buf, size, "r%u = 0x%llx", in->dst_reg,
               (unsigned long long)((uint64_t)(uint32_t)in[0].imm | (uint64_t)(uint32_t)in[1].imm << 32));
    return 2;
  }
}
