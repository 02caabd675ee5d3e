/* SPDX-License-Identifier: MIT */
/* The x86-64 eBPF JIT (megascope/bpf_jit.h).
 *
 * One pass over the verified instructions emits System V x86-64 code into a
 * buffer; jumps are always rel32, so an instruction's code never depends on
 * where its target lands and one pass plus fix-ups suffices. The buffer is
 * then copied into its own mapping, made read-only executable.
 *
 * Registers, as Linux's x86 JIT maps them (r1-r5 in argument registers, so a
 * helper call is a shuffle by one; r6-r9 and r10 in callee-saved registers,
 * so they survive helper calls for free):
 *   r0 rax  r1 rdi  r2 rsi  r3 rdx  r4 rcx  r5 r8
 *   r6 rbx  r7 r13  r8 r14  r9 r15  r10 rbp
 *   r12: the run's state (struct jit_state: the exec helpers see, the budget,
 *        the saved stack pointer); r10, r11: scratch.
 * The BPF stack is the caller's buffer (as in the interpreter, a region the
 * helpers know), frame k's top at its end minus k * 512; a local call is a
 * native call into the subprogram's own prologue, which saves r6-r10 and
 * moves rbp down one frame. The native stack stays 16-byte aligned at every
 * call (entry: 6 pushes + 8; subprogram: return address + 5 pushes).
 *
 * Rare operations (division, modulo, the atomics other than add) call small C
 * functions built on the interpreter's own ALU (core/alu.h), so they cannot
 * disagree with it; the hot ones (moves, add/sub/logic/shifts/mul, loads,
 * stores, atomic add, jumps, calls, lddw) are native.
 *
 * A run stops early for two reasons only: a helper called ms_bpf_exec_abort,
 * or the budget ran out. The budget counts what the interpreters count, every
 * instruction executed (lddw once): each basic block (from a jump target, a
 * function's start or the instruction after a conditional jump or a local
 * call, to the next jump, exit, local call or block start) takes its length
 * from the budget as it is entered, and stops the run when less was left. A
 * block, once entered, runs to its end unless a helper aborts, so a run that
 * ends normally was charged exactly its instructions (res->insns, as the
 * interpreter reports), and a run stops for budget exactly when the
 * interpreter's would. Both stops jump to the shared tail code (emit_tails),
 * which restores the entry's stack pointer and so unwinds any local-call
 * frames. No
 * memory access is checked: that is the verifier's proof, and
 * ms_bpf_jit_new runs the verifier itself. */
#include "megascope/bpf_jit.h"

#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "core/alu.h"
#include "bpf/bpf_internal.h"

#if defined(__x86_64__)
#define JIT_HOST 1
#else
#define JIT_HOST 0
#endif

/* What the code reaches through r12. The exec comes first: helpers get its
 * address, which is r12 itself. */
struct jit_state {
  struct ms_bpf_exec x;
  uint64_t budget;    /* instructions left (blocks take theirs as they are entered) */
  uint64_t saved_rsp; /* the entry's rsp after its prologue, for early exits */
  int32_t err;        /* why the code stopped early (0: it did not) */
  int32_t insn;       /* the instruction that stopped it, or the last helper call */
};

typedef uint64_t (*jit_entry)(struct jit_state *st, uint64_t r1, uint64_t r2, uint64_t fp);

struct ms_bpf_jit {
  const struct ms_bpf_prog *prog;
  const struct ms_bpf_helpers *helpers;
  struct ms_bpf_map *maps[MS_BPF_MAX_MAPS];
  size_t n_maps;
  struct ms_bpf_region regions[MS_BPF_MAX_MAPS]; /* the maps' value regions, for helpers' checks */
  size_t n_regions;
  int kind;          /* enum ms_verify_kind */
  uint32_t mem_size; /* RAW_MEM: the verified buffer size */
  void *code;
  size_t code_size, map_size;
};

int ms_bpf_jit_supported(void) { return JIT_HOST; }

/* ---- x86-64 encoding -------------------------------------------------------- */

enum { RAX = 0, RCX = 1, RDX = 2, RBX = 3, RSP = 4, RBP = 5, RSI = 6, RDI = 7,
       R8 = 8, R9 = 9, R10 = 10, R11 = 11, R12 = 12, R13 = 13, R14 = 14, R15 = 15 };

static const uint8_t reg_of[MS_BPF_REG_COUNT] = {RAX, RDI, RSI, RDX, RCX, R8,
                                                  RBX, R13, R14, R15, RBP};

/* Labels a jump may name besides instructions. */
enum { L_EXIT = -1, L_STOP = -2, L_LIMIT = -3 };

struct fixup {
  uint32_t at;   /* offset of the rel32 */
  int32_t to;    /* instruction index, or L_* */
  int to_entry;  /* a local call: the subprogram's prologue, not its first insn */
};

struct emit {
  uint8_t *b;
  size_t n, cap;
  int oom;
  struct fixup *fix;
  size_t n_fix, cap_fix;
  uint32_t *insn_at;  /* code offset of each instruction's body */
  uint32_t *entry_at; /* code offset of a subprogram's prologue (by its first insn) */
  uint32_t label[3];  /* L_EXIT, L_STOP, L_LIMIT */
};

static void put(struct emit *e, const void *p, size_t len) {
  if (e->n + len > e->cap) {
    size_t cap = e->cap ? e->cap * 2 : 4096;
    while (cap < e->n + len) cap *= 2;
    uint8_t *b = realloc(e->b, cap);
    if (!b) {
      e->oom = 1;
      return;
    }
    e->b = b, e->cap = cap;
  }
  memcpy(e->b + e->n, p, len);
  e->n += len;
}
static void u8(struct emit *e, unsigned v) { uint8_t b = (uint8_t)v; put(e, &b, 1); }
static void u32(struct emit *e, uint32_t v) { put(e, &v, 4); }
static void u64(struct emit *e, uint64_t v) { put(e, &v, 8); }

/* REX with W, and R/B from the registers' high bits; force: a byte register
 * (sil/dil) needs a REX even when nothing else does. */
static void rex(struct emit *e, int w, int reg, int rm, int force) {
  unsigned v = 0x40 | (w ? 8 : 0) | (reg & 8 ? 4 : 0) | (rm & 8 ? 1 : 0);
  if (v != 0x40 || force) u8(e, v);
}
static void modrm_rr(struct emit *e, int reg, int rm) { u8(e, 0xc0 | (reg & 7) << 3 | (rm & 7)); }
/* [base + disp32]; rsp and r12 as base need a SIB byte */
static void modrm_mem(struct emit *e, int reg, int base, int32_t disp) {
  u8(e, 0x80 | (reg & 7) << 3 | (base & 7));
  if ((base & 7) == RSP) u8(e, 0x24);
  u32(e, (uint32_t)disp);
}

/* op rm, reg (register-direct): add/sub/and/or/xor/cmp/test/mov forms */
static void op_rr(struct emit *e, int w, uint8_t op, int reg, int rm) {
  rex(e, w, reg, rm, 0);
  u8(e, op);
  modrm_rr(e, reg, rm);
}
static void mov_rr(struct emit *e, int w, int dst, int src) { op_rr(e, w, 0x89, src, dst); }

/* group-1 op with an immediate: ext 0 add, 1 or, 4 and, 5 sub, 6 xor, 7 cmp */
static void op_ri(struct emit *e, int w, int ext, int rm, int32_t imm) {
  rex(e, w, 0, rm, 0);
  if (imm >= -128 && imm <= 127) {
    u8(e, 0x83), modrm_rr(e, ext, rm), u8(e, (uint8_t)imm);
  } else {
    u8(e, 0x81), modrm_rr(e, ext, rm), u32(e, (uint32_t)imm);
  }
}

static void mov_ri(struct emit *e, int w, int dst, int32_t imm) {
  if (!w || imm >= 0) { /* mov r32, imm32 zero-extends: the same value when imm >= 0 */
    rex(e, 0, 0, dst, 0);
    u8(e, 0xb8 + (dst & 7));
    u32(e, (uint32_t)imm);
  } else { /* mov r/m64, imm32 sign-extends */
    rex(e, 1, 0, dst, 0);
    u8(e, 0xc7), modrm_rr(e, 0, dst), u32(e, (uint32_t)imm);
  }
}
static void mov_ri64(struct emit *e, int dst, uint64_t v) {
  if (v <= UINT32_MAX) {
    mov_ri(e, 0, dst, (int32_t)(uint32_t)v);
    return;
  }
  if ((int64_t)v >= INT32_MIN && (int64_t)v < 0) {
    mov_ri(e, 1, dst, (int32_t)(int64_t)v);
    return;
  }
  rex(e, 1, 0, dst, 0);
  u8(e, 0xb8 + (dst & 7));
  u64(e, v);
}

/* shift group: ext 4 shl, 5 shr, 7 sar; by cl when imm < 0 */
static void shift(struct emit *e, int w, int ext, int rm, int imm) {
  rex(e, w, 0, rm, 0);
  if (imm < 0) {
    u8(e, 0xd3), modrm_rr(e, ext, rm);
  } else {
    u8(e, 0xc1), modrm_rr(e, ext, rm), u8(e, (uint8_t)imm);
  }
}

/* loads and stores, [base + off] */
static void load(struct emit *e, unsigned size, int sx, int dst, int base, int32_t off) {
  switch (size) {
  case 1: rex(e, sx, dst, base, 0), u8(e, 0x0f), u8(e, sx ? 0xbe : 0xb6); break;
  case 2: rex(e, sx, dst, base, 0), u8(e, 0x0f), u8(e, sx ? 0xbf : 0xb7); break;
  case 4:
    if (sx) rex(e, 1, dst, base, 0), u8(e, 0x63);
    else rex(e, 0, dst, base, 0), u8(e, 0x8b);
    break;
  default: rex(e, 1, dst, base, 0), u8(e, 0x8b); break;
  }
  modrm_mem(e, dst, base, off);
}
static void store_r(struct emit *e, unsigned size, int base, int32_t off, int src) {
  if (size == 2) u8(e, 0x66);
  rex(e, size == 8, src, base, size == 1);
  u8(e, size == 1 ? 0x88 : 0x89);
  modrm_mem(e, src, base, off);
}
static void store_i(struct emit *e, unsigned size, int base, int32_t off, int32_t imm) {
  if (size == 2) u8(e, 0x66);
  rex(e, size == 8, 0, base, 0);
  u8(e, size == 1 ? 0xc6 : 0xc7);
  modrm_mem(e, 0, base, off);
  if (size == 1) u8(e, (uint8_t)imm);
  else if (size == 2) put(e, &(uint16_t){(uint16_t)imm}, 2);
  else u32(e, (uint32_t)imm);
}

/* jumps to labels or instructions, patched once all code is out */
static void fixup(struct emit *e, int32_t to, int to_entry) {
  if (e->n_fix == e->cap_fix) {
    size_t cap = e->cap_fix ? e->cap_fix * 2 : 64;
    struct fixup *f = realloc(e->fix, cap * sizeof *f);
    if (!f) {
      e->oom = 1;
      return;
    }
    e->fix = f, e->cap_fix = cap;
  }
  e->fix[e->n_fix++] = (struct fixup){(uint32_t)e->n, to, to_entry};
  u32(e, 0);
}
static void jmp_to(struct emit *e, int32_t to) { u8(e, 0xe9), fixup(e, to, 0); }
static void jcc_to(struct emit *e, uint8_t cc, int32_t to) { u8(e, 0x0f), u8(e, cc), fixup(e, to, 0); }

/* r12-relative fields of struct jit_state */
static void state_store32(struct emit *e, size_t field, int32_t v) {
  rex(e, 0, 0, R12, 0), u8(e, 0xc7), modrm_mem(e, 0, R12, (int32_t)field), u32(e, (uint32_t)v);
}

/* ---- rare operations, in C --------------------------------------------------- */

static uint64_t slow_alu(uint64_t d, uint64_t s, uint64_t word) {
  struct ms_bpf_insn in;
  memcpy(&in, &word, sizeof in);
  unsigned op = MS_BPF_OP(in.code);
  if (MS_BPF_CLASS(in.code) == MS_BPF_ALU64) return ms_bpf_alu64(op, in.off, in.imm, d, s);
  return ms_bpf_alu32(op, in.off, in.imm, MS_BPF_SRC(in.code) == MS_BPF_X, d, s);
}

/* The atomics the code does not inline, through the interpreter's own. Returns
 * the register's new value: r0 for cmpxchg, src for the fetch forms (ignored
 * for the others). */
static uint64_t slow_atomic(uint64_t addr, uint64_t src, uint64_t word, uint64_t r0) {
  struct ms_bpf_insn in;
  memcpy(&in, &word, sizeof in);
  uint64_t old = ms_bpf_atomic_rmw((void *)(uintptr_t)addr, MS_BPF_SIZE(in.code) == MS_BPF_DW, in.imm, src, &r0);
  return in.imm == MS_BPF_CMPXCHG ? r0 : old;
}

/* The caller-saved registers that hold BPF registers (r0-r5). Six pushes keep
 * rsp 16-byte aligned for the call. */
static const uint8_t caller_saved[6] = {RAX, RDI, RSI, RDX, RCX, R8};

/* Calls fn(r10, r11, insn word, r9) with r0-r5 preserved; the result in r10. */
static void call_c(struct emit *e, uint64_t fn, const struct ms_bpf_insn *in) {
  uint64_t word;
  memcpy(&word, in, sizeof word);
  for (int i = 0; i < 6; i++) rex(e, 0, 0, caller_saved[i], 0), u8(e, 0x50 + (caller_saved[i] & 7));
  mov_rr(e, 1, RDI, R10);
  mov_rr(e, 1, RSI, R11);
  mov_ri64(e, RDX, word);
  mov_rr(e, 1, RCX, R9);
  mov_ri64(e, RAX, fn);
  u8(e, 0xff), u8(e, 0xd0); /* call rax */
  mov_rr(e, 1, R10, RAX);
  for (int i = 5; i >= 0; i--) rex(e, 0, 0, caller_saved[i], 0), u8(e, 0x58 + (caller_saved[i] & 7));
}

/* ---- instructions ------------------------------------------------------------ */

static void emit_shift_reg(struct emit *e, int w, int ext, int dst, int src) {
  if (src == RCX) { /* the count is already in cl (also when dst is rcx) */
    shift(e, w, ext, dst, -1);
    return;
  }
  mov_rr(e, 1, R11, RCX);
  mov_rr(e, 1, RCX, src);
  if (dst == RCX) {
    shift(e, w, ext, R11, -1); /* rcx's own value, saved in r11 */
    mov_rr(e, 1, RCX, R11);
    return;
  }
  shift(e, w, ext, dst, -1);
  mov_rr(e, 1, RCX, R11);
}

static void emit_end(struct emit *e, const struct ms_bpf_insn *in, int dst) {
  int swap = MS_BPF_CLASS(in->code) == MS_BPF_ALU64 || MS_BPF_SRC(in->code) == MS_BPF_TO_BE;
  if (in->imm == 16) {
    if (swap) { /* ror r16, 8 */
      u8(e, 0x66), rex(e, 0, 0, dst, 0), u8(e, 0xc1), modrm_rr(e, 1, dst), u8(e, 8);
    }
    rex(e, 0, dst, dst, 0), u8(e, 0x0f), u8(e, 0xb7), modrm_rr(e, dst, dst); /* movzx r32, r16 */
  } else if (in->imm == 32) {
    if (swap) rex(e, 0, 0, dst, 0), u8(e, 0x0f), u8(e, 0xc8 + (dst & 7)); /* bswap r32 */
    else mov_rr(e, 0, dst, dst);                                         /* zero-extends */
  } else if (swap) {
    rex(e, 1, 0, dst, 0), u8(e, 0x0f), u8(e, 0xc8 + (dst & 7)); /* bswap r64 */
  }
}

/* mov with sign extension (off 8/16/32) */
static void emit_movsx(struct emit *e, int w, int off, int dst, int src) {
  if (off == 32) {
    rex(e, 1, dst, src, 0), u8(e, 0x63); /* movsxd r64, r32 (ALU64 only) */
  } else {
    rex(e, w, dst, src, 1), u8(e, 0x0f), u8(e, off == 8 ? 0xbe : 0xbf);
  }
  modrm_rr(e, dst, src);
}

static void emit_alu(struct emit *e, const struct ms_bpf_insn *in) {
  int w = MS_BPF_CLASS(in->code) == MS_BPF_ALU64, x = MS_BPF_SRC(in->code) == MS_BPF_X;
  int dst = reg_of[in->dst_reg], src = reg_of[in->src_reg];
  unsigned op = MS_BPF_OP(in->code);
  static const int8_t grp1[16] = {[MS_BPF_ADD >> 4] = 0, [MS_BPF_SUB >> 4] = 5, [MS_BPF_OR >> 4] = 1,
                                  [MS_BPF_AND >> 4] = 4, [MS_BPF_XOR >> 4] = 6};
  static const uint8_t grp1_rr[16] = {[MS_BPF_ADD >> 4] = 0x01, [MS_BPF_SUB >> 4] = 0x29,
                                      [MS_BPF_OR >> 4] = 0x09, [MS_BPF_AND >> 4] = 0x21,
                                      [MS_BPF_XOR >> 4] = 0x31};
  switch (op) {
  case MS_BPF_ADD: case MS_BPF_SUB: case MS_BPF_OR: case MS_BPF_AND: case MS_BPF_XOR:
    if (x) op_rr(e, w, grp1_rr[op >> 4], src, dst);
    else op_ri(e, w, grp1[op >> 4], dst, in->imm);
    return;
  case MS_BPF_MOV:
    if (!x) mov_ri(e, w, dst, in->imm);
    else if (in->off) emit_movsx(e, w, in->off, dst, src);
    else mov_rr(e, w, dst, src);
    return;
  case MS_BPF_MUL:
    if (x) {
      rex(e, w, dst, src, 0), u8(e, 0x0f), u8(e, 0xaf), modrm_rr(e, dst, src);
    } else {
      rex(e, w, dst, dst, 0), u8(e, 0x69), modrm_rr(e, dst, dst), u32(e, (uint32_t)in->imm);
    }
    return;
  case MS_BPF_LSH: case MS_BPF_RSH: case MS_BPF_ARSH: {
    int ext = op == MS_BPF_LSH ? 4 : op == MS_BPF_RSH ? 5 : 7;
    if (x) emit_shift_reg(e, w, ext, dst, src);
    else shift(e, w, ext, dst, in->imm & (w ? 63 : 31));
    return;
  }
  case MS_BPF_NEG:
    rex(e, w, 0, dst, 0), u8(e, 0xf7), modrm_rr(e, 3, dst);
    return;
  case MS_BPF_END: emit_end(e, in, dst); return;
  default: /* DIV, MOD (unsigned and signed): the interpreter's arithmetic */
    mov_rr(e, 1, R10, dst);
    if (x) mov_rr(e, 1, R11, src);
    else mov_ri64(e, R11, w ? (uint64_t)(int64_t)in->imm : (uint32_t)in->imm);
    call_c(e, (uint64_t)(uintptr_t)slow_alu, in);
    mov_rr(e, 1, dst, R10);
    return;
  }
}

static const unsigned size_bytes[4] = {4, 2, 1, 8}; /* by MS_BPF_SIZE >> 3 */

static void emit_atomic(struct emit *e, const struct ms_bpf_insn *in) {
  int w = MS_BPF_SIZE(in->code) == MS_BPF_DW;
  int dst = reg_of[in->dst_reg], src = reg_of[in->src_reg];
  if (in->imm == MS_BPF_ADD || in->imm == (MS_BPF_ADD | MS_BPF_FETCH)) {
    u8(e, 0xf0); /* lock */
    rex(e, w, src, dst, 0);
    if (in->imm & MS_BPF_FETCH) u8(e, 0x0f), u8(e, 0xc1); /* xadd: the old value into src */
    else u8(e, 0x01);                                      /* add */
    modrm_mem(e, src, dst, in->off);
    return;
  }
  /* r10 = address, r11 = src, r9 = r0 */
  mov_rr(e, 1, R10, dst);
  if (in->off) op_ri(e, 1, 0, R10, in->off);
  mov_rr(e, 1, R11, src);
  mov_rr(e, 1, R9, RAX);
  call_c(e, (uint64_t)(uintptr_t)slow_atomic, in);
  if (in->imm == MS_BPF_CMPXCHG) mov_rr(e, 1, RAX, R10);
  else if (in->imm & MS_BPF_FETCH) mov_rr(e, w, src, R10); /* 32-bit: zero-extended */
}

static size_t jcc_local(struct emit *e, uint8_t cc);
static void land(struct emit *e, size_t at);

/* A block of n instructions starting at idx is entered: sub qword
 * [r12+budget], n; on a borrow (fewer than n were left) name idx and stop. */
static void emit_charge(struct emit *e, size_t idx, uint32_t n) {
  rex(e, 1, 0, R12, 0), u8(e, n <= 127 ? 0x83 : 0x81), modrm_mem(e, 5, R12, offsetof(struct jit_state, budget));
  if (n <= 127) u8(e, (uint8_t)n);
  else u32(e, n);
  size_t ok = jcc_local(e, 0x83); /* jae: enough was left */
  state_store32(e, offsetof(struct jit_state, insn), (int32_t)idx);
  jmp_to(e, L_LIMIT);
  land(e, ok);
}

static void emit_jmp(struct emit *e, const struct ms_bpf_insn *in, size_t idx) {
  unsigned op = MS_BPF_OP(in->code);
  int w = MS_BPF_CLASS(in->code) == MS_BPF_JMP;
  int64_t rel = op == MS_BPF_JA && !w ? in->imm : in->off;
  int32_t to = (int32_t)((int64_t)idx + 1 + rel);
  if (op == MS_BPF_JA) {
    jmp_to(e, to);
    return;
  }
  int dst = reg_of[in->dst_reg], src = reg_of[in->src_reg], x = MS_BPF_SRC(in->code) == MS_BPF_X;
  if (op == MS_BPF_JSET) {
    if (x) {
      op_rr(e, w, 0x85, src, dst);
    } else {
      rex(e, w, 0, dst, 0), u8(e, 0xf7), modrm_rr(e, 0, dst), u32(e, (uint32_t)in->imm);
    }
  } else if (x) {
    op_rr(e, w, 0x39, src, dst); /* cmp dst, src */
  } else {
    op_ri(e, w, 7, dst, in->imm);
  }
  static const uint8_t cc[16] = {
      [MS_BPF_JEQ >> 4] = 0x84, [MS_BPF_JNE >> 4] = 0x85, [MS_BPF_JSET >> 4] = 0x85,
      [MS_BPF_JGT >> 4] = 0x87, [MS_BPF_JGE >> 4] = 0x83, [MS_BPF_JLT >> 4] = 0x82,
      [MS_BPF_JLE >> 4] = 0x86, [MS_BPF_JSGT >> 4] = 0x8f, [MS_BPF_JSGE >> 4] = 0x8d,
      [MS_BPF_JSLT >> 4] = 0x8c, [MS_BPF_JSLE >> 4] = 0x8e};
  jcc_to(e, cc[op >> 4], to);
}

static void emit_helper_call(struct emit *e, uint64_t fn, size_t idx) {
  state_store32(e, offsetof(struct jit_state, insn), (int32_t)idx);
  /* fn(exec, r1..r5): every argument moves one register along */
  mov_rr(e, 1, R9, R8);
  mov_rr(e, 1, R8, RCX);
  mov_rr(e, 1, RCX, RDX);
  mov_rr(e, 1, RDX, RSI);
  mov_rr(e, 1, RSI, RDI);
  mov_rr(e, 1, RDI, R12);
  mov_ri64(e, RAX, fn);
  u8(e, 0xff), u8(e, 0xd0); /* call rax */
  /* cmp dword [r12+abort_err], 0 ; jne stop */
  rex(e, 0, 0, R12, 0), u8(e, 0x83);
  modrm_mem(e, 7, R12, (int32_t)offsetof(struct jit_state, x.abort_err));
  u8(e, 0);
  jcc_to(e, 0x85, L_STOP);
}

static const uint8_t sub_saved[5] = {RBX, R13, R14, R15, RBP};

static void emit_sub_prologue(struct emit *e) {
  for (int i = 0; i < 5; i++) rex(e, 0, 0, sub_saved[i], 0), u8(e, 0x50 + (sub_saved[i] & 7));
  rex(e, 1, 0, RBP, 0), u8(e, 0x81), modrm_rr(e, 5, RBP), u32(e, MS_BPF_STACK_SIZE); /* sub rbp, 512 */
}

static void emit_sub_epilogue(struct emit *e) {
  for (int i = 4; i >= 0; i--) rex(e, 0, 0, sub_saved[i], 0), u8(e, 0x58 + (sub_saved[i] & 7));
  u8(e, 0xc3);
}

static const uint8_t entry_saved[6] = {RBP, RBX, R12, R13, R14, R15};

static void emit_entry_prologue(struct emit *e) {
  for (int i = 0; i < 6; i++) rex(e, 0, 0, entry_saved[i], 0), u8(e, 0x50 + (entry_saved[i] & 7));
  op_ri(e, 1, 5, RSP, 8); /* sub rsp, 8: aligned for calls */
  mov_rr(e, 1, R12, RDI);
  mov_rr(e, 1, RDI, RSI); /* r1 */
  mov_rr(e, 1, RSI, RDX); /* r2 */
  mov_rr(e, 1, RBP, RCX); /* r10 */
  /* mov [r12+saved_rsp], rsp */
  rex(e, 1, RSP, R12, 0), u8(e, 0x89), modrm_mem(e, RSP, R12, offsetof(struct jit_state, saved_rsp));
  op_rr(e, 0, 0x31, RAX, RAX); /* r0 = 0 */
}

/* The shared tails: normal exit, early stop, budget exhausted. */
static void emit_tails(struct emit *e) {
  e->label[-L_LIMIT - 1] = (uint32_t)e->n;
  state_store32(e, offsetof(struct jit_state, err), -MS_E_LIMIT);
  e->label[-L_STOP - 1] = (uint32_t)e->n;
  /* mov rsp, [r12+saved_rsp]: unwinds any local-call frames */
  rex(e, 1, RSP, R12, 0), u8(e, 0x8b), modrm_mem(e, RSP, R12, offsetof(struct jit_state, saved_rsp));
  e->label[-L_EXIT - 1] = (uint32_t)e->n;
  op_ri(e, 1, 0, RSP, 8);
  for (int i = 5; i >= 0; i--) rex(e, 0, 0, entry_saved[i], 0), u8(e, 0x58 + (entry_saved[i] & 7));
  u8(e, 0xc3);
}

/* ---- the program -------------------------------------------------------------- */

struct layout {
  uint8_t *fn_start; /* 1 at the first instruction of each function */
  uint32_t *fn_of;   /* function (its first instruction) of each instruction */
  uint8_t *entered;  /* 1 where control can arrive other than from the previous
                      * instruction: a jump target or a function's start */
  uint8_t *second;   /* 1 at the second slot of an lddw */
  uint32_t *block;   /* at a block's first instruction: its length in instructions; else 0 */
};

static int target_of(const struct ms_bpf_insn *in, size_t i) {
  unsigned op = MS_BPF_OP(in->code);
  if (op == MS_BPF_JA && MS_BPF_CLASS(in->code) == MS_BPF_JMP32) return (int)((int64_t)i + 1 + in->imm);
  return (int)((int64_t)i + 1 + in->off);
}

static int is_jump(const struct ms_bpf_insn *in) {
  unsigned c = MS_BPF_CLASS(in->code), op = MS_BPF_OP(in->code);
  return (c == MS_BPF_JMP || c == MS_BPF_JMP32) && op != MS_BPF_CALL && op != MS_BPF_EXIT;
}

/* Functions: the entry and every local call's target. Jumps must stay inside
 * their function (the loader links subprograms that way; refuse otherwise). */
static int find_functions(const struct ms_bpf_prog *p, struct layout *L, struct ms_textbuf *log) {
  for (size_t i = 0; i < p->n; i++) {
    const struct ms_bpf_insn *in = &p->insns[i];
    if (MS_BPF_CLASS(in->code) == MS_BPF_JMP && MS_BPF_OP(in->code) == MS_BPF_CALL &&
        in->src_reg == MS_BPF_PSEUDO_CALL) {
      int64_t t = (int64_t)i + 1 + in->imm;
      if (t == 0) { /* the entry has no subprogram prologue to call */
        ms_textbuf_printf(log, "insn %zu: local call to the entry program: not compiled\n", i);
        return -ENOTSUP;
      }
      L->fn_start[t] = 1;
    }
  }
  L->fn_start[0] = 1;
  uint32_t f = 0;
  for (size_t i = 0; i < p->n; i++) {
    if (L->fn_start[i]) f = (uint32_t)i;
    L->fn_of[i] = f;
    L->entered[i] |= L->fn_start[i];
    if (MS_BPF_CLASS(p->insns[i].code) == MS_BPF_LD && i + 1 < p->n) { /* its second slot (code 0) is no lddw */
      L->second[i + 1] = 1;
      L->fn_of[++i] = f;
    }
  }
  for (size_t i = 0; i < p->n; i++) {
    if (!is_jump(&p->insns[i])) continue;
    int t = target_of(&p->insns[i], i);
    L->entered[t] = 1;
    if (L->fn_of[t] != L->fn_of[i] || (L->fn_start[t] && t != (int)L->fn_of[i])) {
      ms_textbuf_printf(log, "insn %zu: jump to insn %d leaves its function: not compiled\n", i, t);
      return -ENOTSUP;
    }
  }
  return 0;
}

static int ends_block(const struct ms_bpf_insn *in) {
  unsigned c = MS_BPF_CLASS(in->code), op = MS_BPF_OP(in->code);
  if (c != MS_BPF_JMP && c != MS_BPF_JMP32) return 0;
  return op != MS_BPF_CALL || in->src_reg == MS_BPF_PSEUDO_CALL;
}

/* Basic blocks: one starts where control arrives other than from the
 * previous instruction (L->entered) and after every jump, exit and local
 * call; it ends before the next start. Its length counts an lddw once. */
static void find_blocks(const struct ms_bpf_prog *p, struct layout *L) {
  uint32_t start = 0, len = 0;
  for (size_t i = 0; i < p->n; i++) {
    if (L->second[i]) continue;
    if (i == 0 || L->entered[i] || L->fn_start[i]) {
      if (len) L->block[start] = len;
      start = (uint32_t)i, len = 0;
    }
    len++;
    if (ends_block(&p->insns[i])) {
      L->block[start] = len;
      len = 0;
      start = (uint32_t)i + 1;
    }
  }
  if (len) L->block[start] = len;
}

static int emit_lddw(struct emit *e, const struct ms_bpf_jit *j, const struct ms_bpf_insn *in, size_t i,
                     struct ms_textbuf *log) {
  uint64_t v = (uint64_t)(uint32_t)in[0].imm | (uint64_t)(uint32_t)in[1].imm << 32;
  if (in->src_reg) {
    size_t idx = (size_t)in->imm;
    struct ms_bpf_map *m = idx < j->n_maps ? j->maps[idx] : NULL;
    if (!m) {
      ms_textbuf_printf(log, "insn %zu: map %zu is not bound to the compiled program\n", i, idx);
      return -EINVAL;
    }
    v = (uint64_t)(uintptr_t)m;
    if (in->src_reg == MS_BPF_PSEUDO_MAP_VALUE || in->src_reg == MS_BPF_PSEUDO_MAP_IDX_VALUE) {
      void *p = ms_bpf_map_direct_value(m, (uint32_t)in[1].imm);
      if (!p) {
        ms_textbuf_printf(log, "insn %zu: map %zu has no value at offset %u\n", i, idx, (uint32_t)in[1].imm);
        return -EINVAL;
      }
      v = (uint64_t)(uintptr_t)p;
    }
  }
  mov_ri64(e, reg_of[in->dst_reg], v);
  return 0;
}

/* Whether in may change r1 (or leave the straight line before a call). */
static int touches_r1(const struct ms_bpf_insn *in) {
  switch (MS_BPF_CLASS(in->code)) {
  case MS_BPF_ALU: case MS_BPF_ALU64: case MS_BPF_LDX: case MS_BPF_LD: return in->dst_reg == 1;
  case MS_BPF_ST: return 0;
  case MS_BPF_STX:
    return MS_BPF_MODE(in->code) == MS_BPF_ATOMIC && (in->imm & MS_BPF_FETCH) && in->imm != MS_BPF_CMPXCHG &&
           in->src_reg == 1;
  default: /* calls clobber r1; after exit or ja the call is reached only by a jump */
    return MS_BPF_OP(in->code) == MS_BPF_CALL || MS_BPF_OP(in->code) == MS_BPF_EXIT ||
           MS_BPF_OP(in->code) == MS_BPF_JA;
  }
}

/* The map r1 holds at the call at i, when the straight line before it loads
 * it with lddw and nothing between changes r1 or can be jumped into; else NULL. */
static struct ms_bpf_map *map_in_r1(const struct ms_bpf_jit *j, const struct layout *L, size_t i) {
  const struct ms_bpf_insn *p = j->prog->insns;
  for (size_t x = i; x > L->fn_of[i]; x--) {
    if (L->entered[x]) return NULL; /* another path reaches the call */
    size_t k = L->second[x - 1] ? x - 2 : x - 1;
    const struct ms_bpf_insn *in = &p[k];
    if (MS_BPF_CLASS(in->code) == MS_BPF_LD && in->dst_reg == 1) {
      if (in->src_reg != MS_BPF_PSEUDO_MAP_FD && in->src_reg != MS_BPF_PSEUDO_MAP_IDX) return NULL;
      return (size_t)in->imm < j->n_maps ? j->maps[in->imm] : NULL;
    }
    if (touches_r1(in)) return NULL;
    x = k + 1;
  }
  return NULL;
}

/* A forward jump inside the emitted code, patched by land(). */
static size_t jcc_local(struct emit *e, uint8_t cc) {
  u8(e, 0x0f), u8(e, cc), u32(e, 0);
  return e->n - 4;
}
static size_t jmp_local(struct emit *e) {
  u8(e, 0xe9), u32(e, 0);
  return e->n - 4;
}
static void land(struct emit *e, size_t at) {
  if (e->oom) return;
  int32_t rel = (int32_t)(e->n - (at + 4));
  memcpy(e->b + at, &rel, 4);
}

/* map_lookup_elem on an array map whose address is known, without the helper
 * (as Linux's JIT inlines it): r0 = &values[(worker * n_slots + key) * stride],
 * or NULL when the key (or, per worker, the worker) is out of range. The key
 * pointer in r2 (rsi) is the verifier's proof; the helper's checks of it and
 * of the map handle are what this saves. r1-r5 are left as they are (a call
 * leaves them undefined). 0 when emitted, -1 when the layout does not fit. */
static int emit_array_lookup(struct emit *e, const struct ms_bpf_map *m) {
  struct ms_bpf_array_layout a;
  if (ms_bpf_map_array_layout(m, &a) || a.n_slots > INT32_MAX || a.stride > INT32_MAX) return -1;
  rex(e, 0, RAX, RSI, 0), u8(e, 0x8b), modrm_mem(e, RAX, RSI, 0); /* mov eax, [rsi]: the u32 key */
  op_ri(e, 0, 7, RAX, (int32_t)a.max_entries);                      /* cmp eax, max_entries */
  size_t null1 = jcc_local(e, 0x83), null2 = 0;                      /* jae null */
  if (a.per_worker) {
    /* r11 = exec.env->worker, checked against the map's workers */
    rex(e, 1, R11, R12, 0), u8(e, 0x8b);
    modrm_mem(e, R11, R12, (int32_t)(offsetof(struct jit_state, x) + offsetof(struct ms_bpf_exec, env)));
    rex(e, 0, R11, R11, 0), u8(e, 0x8b), modrm_mem(e, R11, R11, (int32_t)offsetof(struct ms_bpf_env, worker));
    op_ri(e, 0, 7, R11, (int32_t)a.n_workers);
    null2 = jcc_local(e, 0x83);
    rex(e, 1, R11, R11, 0), u8(e, 0x69), modrm_rr(e, R11, R11), u32(e, a.n_slots); /* imul r11, n_slots */
    op_rr(e, 1, 0x01, R11, RAX);                                                    /* add rax, r11 */
  }
  rex(e, 1, RAX, RAX, 0), u8(e, 0x69), modrm_rr(e, RAX, RAX), u32(e, a.stride); /* imul rax, stride */
  mov_ri64(e, R11, (uint64_t)(uintptr_t)a.values);
  op_rr(e, 1, 0x01, R11, RAX); /* add rax, r11 */
  size_t done = jmp_local(e);
  land(e, null1);
  if (a.per_worker) land(e, null2);
  op_rr(e, 0, 0x31, RAX, RAX); /* r0 = NULL */
  land(e, done);
  return 0;
}

static int emit_call(struct emit *e, const struct ms_bpf_jit *j, const struct layout *L,
                     const struct ms_bpf_insn *in, size_t i, struct ms_textbuf *log) {
  if (in->src_reg == MS_BPF_PSEUDO_CALL) {
    u8(e, 0xe8), fixup(e, (int32_t)((int64_t)i + 1 + in->imm), 1);
    return 0;
  }
  const struct ms_bpf_helper_slot *s = j->helpers ? ms_bpf_helpers_slot(j->helpers, (uint32_t)in->imm) : NULL;
  if (!s || !s->fn) {
    ms_textbuf_printf(log, "insn %zu: call to unknown helper %d\n", i, in->imm);
    return -ENOENT;
  }
  if (in->imm == MS_BPF_FN_MAP_LOOKUP_ELEM && ms_bpf_helper_is_std_lookup(s->fn)) {
    const struct ms_bpf_map *m = map_in_r1(j, L, i);
    if (m && !emit_array_lookup(e, m)) return 0;
  }
  emit_helper_call(e, (uint64_t)(uintptr_t)s->fn, i);
  return 0;
}

static int emit_insn(struct emit *e, const struct ms_bpf_jit *j, const struct layout *L, size_t i,
                     struct ms_textbuf *log) {
  const struct ms_bpf_insn *in = &j->prog->insns[i];
  unsigned size = size_bytes[MS_BPF_SIZE(in->code) >> 3];
  switch (MS_BPF_CLASS(in->code)) {
  case MS_BPF_ALU: case MS_BPF_ALU64: emit_alu(e, in); return 0;
  case MS_BPF_LD: return emit_lddw(e, j, in, i, log);
  case MS_BPF_LDX:
    load(e, size, MS_BPF_MODE(in->code) == MS_BPF_MEMSX, reg_of[in->dst_reg], reg_of[in->src_reg], in->off);
    return 0;
  case MS_BPF_ST: store_i(e, size, reg_of[in->dst_reg], in->off, in->imm); return 0;
  case MS_BPF_STX:
    if (MS_BPF_MODE(in->code) == MS_BPF_ATOMIC) emit_atomic(e, in);
    else store_r(e, size, reg_of[in->dst_reg], in->off, reg_of[in->src_reg]);
    return 0;
  default:
    if (MS_BPF_OP(in->code) == MS_BPF_CALL) return emit_call(e, j, L, in, i, log);
    if (MS_BPF_OP(in->code) == MS_BPF_EXIT) {
      if (L->fn_of[i] == 0) jmp_to(e, L_EXIT);
      else emit_sub_epilogue(e);
      return 0;
    }
    emit_jmp(e, in, i);
    return 0;
  }
}

static void patch(struct emit *e) {
  for (size_t k = 0; k < e->n_fix; k++) {
    const struct fixup *f = &e->fix[k];
    uint32_t to = f->to < 0 ? e->label[-f->to - 1] : f->to_entry ? e->entry_at[f->to] : e->insn_at[f->to];
    int32_t rel = (int32_t)((int64_t)to - (int64_t)(f->at + 4));
    memcpy(e->b + f->at, &rel, 4);
  }
}

static int compile(struct ms_bpf_jit *j, struct ms_textbuf *log) {
  const struct ms_bpf_prog *p = j->prog;
  struct emit e = {0};
  struct layout L = {calloc(p->n + 1, 1), calloc(p->n + 1, sizeof *L.fn_of), calloc(p->n + 1, 1),
                     calloc(p->n + 1, 1), calloc(p->n + 1, sizeof *L.block)};
  e.insn_at = calloc(p->n + 1, sizeof *e.insn_at);
  e.entry_at = calloc(p->n + 1, sizeof *e.entry_at);
  int err = -ENOMEM;
  if (!L.fn_start || !L.fn_of || !L.entered || !L.second || !L.block || !e.insn_at || !e.entry_at) goto out;
  if ((err = find_functions(p, &L, log))) goto out;
  find_blocks(p, &L);
  emit_entry_prologue(&e);
  for (size_t i = 0; i < p->n; i++) {
    if (L.fn_start[i] && i) {
      e.entry_at[i] = (uint32_t)e.n;
      emit_sub_prologue(&e);
    }
    e.insn_at[i] = (uint32_t)e.n;
    if (L.block[i]) emit_charge(&e, i, L.block[i]);
    if ((err = emit_insn(&e, j, &L, i, log))) goto out;
    if (MS_BPF_CLASS(p->insns[i].code) == MS_BPF_LD) e.insn_at[++i] = (uint32_t)e.n; /* lddw's 2nd slot */
  }
  emit_tails(&e);
  err = -ENOMEM;
  if (e.oom) goto out;
  patch(&e);
  size_t page = 4096, size = (e.n + page - 1) / page * page;
  void *code = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (code == MAP_FAILED) goto out;
  memcpy(code, e.b, e.n);
  if (mprotect(code, size, PROT_READ | PROT_EXEC)) {
    munmap(code, size);
    goto out;
  }
  j->code = code, j->code_size = e.n, j->map_size = size;
  err = 0;
out:
  free(e.b), free(e.fix), free(e.insn_at), free(e.entry_at), free(L.fn_start), free(L.fn_of);
  free(L.entered), free(L.second), free(L.block);
  return err;
}

/* ---- the handle ----------------------------------------------------------------- */

void ms_bpf_jit_free(struct ms_bpf_jit *j) {
  if (!j) return;
  if (j->code) munmap(j->code, j->map_size);
  free(j);
}

struct ms_bpf_jit *ms_bpf_jit_new(const struct ms_bpf_prog *prog, const struct ms_bpf_jit_opts *opts) {
  struct ms_bpf_jit_opts o = {0};
  if (opts) memcpy(&o, opts, opts->sz < sizeof o ? opts->sz : sizeof o);
  if (!JIT_HOST) {
    ms_textbuf_printf(o.log, "no eBPF JIT for this host (x86-64 only): use the interpreter\n");
    errno = ENOTSUP;
    return NULL;
  }
  if (!prog || !o.verify || o.n_maps > MS_BPF_MAX_MAPS || (o.n_maps && !o.maps)) {
    errno = EINVAL;
    return NULL;
  }
  struct ms_verify_opts vo = *o.verify;
  vo.sz = sizeof vo;
  if (vo.helpers && vo.helpers != o.helpers) { /* the code would call other helpers than were proven */
    ms_textbuf_printf(o.log, "the verifier's helper table is not the JIT's\n");
    errno = EINVAL;
    return NULL;
  }
  vo.helpers = o.helpers;
  int rc = ms_bpf_verify(prog, &vo, o.log, NULL);
  if (rc) {
    errno = rc < 0 ? -rc : rc;
    return NULL;
  }
  struct ms_bpf_jit *j = calloc(1, sizeof *j);
  if (!j) return NULL;
  j->prog = prog;
  j->helpers = o.helpers;
  j->n_maps = o.n_maps;
  for (size_t i = 0; i < o.n_maps; i++) {
    j->maps[i] = o.maps[i];
    struct ms_bpf_region r = {0};
    if (o.maps[i]) ms_bpf_map_region(o.maps[i], &r);
    if (r.base && r.len) j->regions[j->n_regions++] = r;
  }
  j->kind = vo.kind;
  j->mem_size = vo.mem_size;
  if ((rc = compile(j, o.log))) {
    ms_bpf_jit_free(j);
    errno = -rc;
    return NULL;
  }
  return j;
}

size_t ms_bpf_jit_code_size(const struct ms_bpf_jit *j) { return j ? j->code_size : 0; }
const void *ms_bpf_jit_code(const struct ms_bpf_jit *j) { return j ? j->code : NULL; }
const struct ms_bpf_prog *ms_bpf_jit_prog(const struct ms_bpf_jit *j) { return j ? j->prog : NULL; }

/* The run must hand the code what it was compiled and verified for. */
static int check_binding(const struct ms_bpf_jit *j, const struct ms_bpf_run_opts *o) {
  if (o->helpers != j->helpers || o->n_maps != j->n_maps) return -EINVAL;
  for (size_t i = 0; i < j->n_maps; i++)
    if (o->maps[i] != j->maps[i]) return -EINVAL;
  if (j->kind == MS_VERIFY_RAW_MEM) {
    if (o->ctx || (j->mem_size && (!o->mem || o->mem_size < j->mem_size))) return -EINVAL;
  } else if (!o->ctx || !o->ctx_size) {
    return -EINVAL;
  }
  return 0;
}

int ms_bpf_jit_run(const struct ms_bpf_jit *j, const struct ms_bpf_run_opts *opts,
                   struct ms_bpf_run_result *res) {
  struct ms_bpf_run_opts o = {0};
  if (!j || !res) return -EINVAL;
  if (opts) memcpy(&o, opts, opts->sz < sizeof o ? opts->sz : sizeof o);
  res->r0 = 0, res->insns = 0, res->err_insn = -1;
  int err = check_binding(j, &o);
  if (err) {
    ms_textbuf_printf(o.log, "run options differ from what the program was compiled for\n");
    return err;
  }
  _Alignas(16) uint8_t stack[MS_BPF_MAX_CALL_DEPTH * MS_BPF_STACK_SIZE];
  struct jit_state st;
  ms_bpf_exec_setup(&st.x, j->prog, &o, stack, sizeof stack, j->regions, j->n_regions);
  const uint64_t budget = o.insn_budget ? o.insn_budget : MS_BPF_DEFAULT_BUDGET;
  st.budget = budget;
  st.err = 0;
  st.insn = -1;
  uint64_t r1 = (uint64_t)(uintptr_t)(o.ctx ? o.ctx : o.mem), r2 = o.ctx ? 0 : o.mem_size;
  jit_entry fn;
  memcpy(&fn, &j->code, sizeof fn); /* object to function pointer, without the cast ISO C lacks */
  res->r0 = fn(&st, r1, r2, (uint64_t)(uintptr_t)(stack + sizeof stack));
  if (st.x.abort_err) {
    err = st.x.abort_err;
    ms_textbuf_printf(o.log, "insn %d: helper %d: %s\n", st.insn,
                      st.insn >= 0 ? j->prog->insns[st.insn].imm : -1, st.x.abort_msg);
  } else if (st.err) {
    err = st.err;
    ms_textbuf_printf(o.log, "insn %d: instruction budget of %llu exhausted\n", st.insn,
                      (unsigned long long)budget);
  }
  res->insns = err == -MS_E_LIMIT ? budget : budget - st.budget;
  if (err) res->err_insn = st.insn;
  size_t left = ms_bpf_exec_release(&st.x);
  if (left && !err) {
    ms_textbuf_printf(o.log, "exit with %zu ring buffer record(s) neither submitted nor discarded\n", left);
    err = -EINVAL;
  }
  return err;
}
