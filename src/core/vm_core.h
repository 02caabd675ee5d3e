/* SPDX-License-Identifier: MIT */
/* The eBPF instruction loop, written once for the reference interpreter
 * (interp.c) and the device interpreter (src/core/bpf_core.h, which compiles
 * both as C11 and as CUDA): the step over an instruction, loads and stores
 * through the run's memory check, atomics, lddw, helper and local calls with
 * their frames, exit, jumps, the budget and falling off the end. What differs
 * between the two is what an interpreter's memory, maps and helpers are, and
 * whether a stop can carry a message; the includer says that with macros:
 *
 *   MS_VMC_FN                        qualifiers of the functions defined here
 *   MS_VMC_VM                        the VM struct: uint64_t reg[MS_BPF_REG_COUNT],
 *                                    pc, count, budget; uint32_t depth; frames[
 *                                    MS_BPF_MAX_CALL_DEPTH] of {uint64_t saved[4], r10, ret_pc}
 *   MS_VMC_MEM(vm, addr, size, w)    the memory at [addr, addr + size) when the run
 *                                    may touch it (w: to write), else NULL
 *   MS_VMC_LOAD(p, size), MS_VMC_STORE(p, size, v)   1, 2, 4 or 8 bytes, little-endian
 *   MS_VMC_ATOMIC(p, size, imm, s, r0)  one bpf atomic on an aligned word (seq_cst):
 *                                    the old value; cmpxchg compares with and sets *r0
 *   MS_VMC_LDDW(vm, in)              the lddw pair's value into dst (a map's pseudo
 *                                    forms resolved): 0, or the stop's code
 *   MS_VMC_HELPER(vm, id)            r0 = helper id(r1..r5): 0, or the stop's code
 *   MS_VMC_FRAME_TOP(vm, depth)      the top of frame `depth`'s 512 bytes (uint8_t *)
 *   MS_VMC_ZERO(p, n)                n bytes of zeros
 *   MS_VMC_STOP(vm, err, fmt, ...)   a stop at vm->pc: evaluates to err, and says
 *                                    why where the includer keeps a log
 *
 * Semantics (RFC 9669, as interp.c's comment says): the ALU is core/alu.h,
 * which the includer has included; a local call saves r6-r9 and gets a fresh
 * zeroed 512-byte frame; the instruction count is the budget's unit, lddw
 * counting once. Codes: -EFAULT (a bad access, a misaligned atomic, falling
 * off the end), -MS_E_LIMIT (the call depth, the budget), and what the
 * includer's lddw and helpers return. On a stop vm->pc is the instruction
 * that stopped. */
#ifndef MS_CORE_VM_CORE_H
#define MS_CORE_VM_CORE_H

MS_VMC_FN unsigned ms_vmc_size(uint8_t code) {
  switch (MS_BPF_SIZE(code)) {
  case MS_BPF_W: return 4;
  case MS_BPF_H: return 2;
  case MS_BPF_B: return 1;
  default: return 8;
  }
}

MS_VMC_FN void ms_vmc_alu(MS_VMC_VM *vm, const struct ms_bpf_insn *in) {
  uint64_t *reg = vm->reg;
  int x = MS_BPF_SRC(in->code) == MS_BPF_X;
  unsigned op = MS_BPF_OP(in->code);
  if (MS_BPF_CLASS(in->code) == MS_BPF_ALU64) {
    uint64_t s = x && op != MS_BPF_END ? reg[in->src_reg] : (uint64_t)(int64_t)in->imm;
    reg[in->dst_reg] = ms_bpf_alu64(op, in->off, in->imm, reg[in->dst_reg], s);
  } else {
    uint64_t s = x && op != MS_BPF_END ? reg[in->src_reg] : (uint64_t)(uint32_t)in->imm;
    reg[in->dst_reg] = ms_bpf_alu32(op, in->off, in->imm, x, reg[in->dst_reg], s);
  }
}

MS_VMC_FN int ms_vmc_ldx(MS_VMC_VM *vm, const struct ms_bpf_insn *in) {
  unsigned size = ms_vmc_size(in->code);
  uint64_t addr = vm->reg[in->src_reg] + (uint64_t)(int64_t)in->off;
  const void *p = MS_VMC_MEM(vm, addr, size, 0);
  if (!p)
    return MS_VMC_STOP(vm, -EFAULT, "invalid read of %u bytes at 0x%llx: outside the stack, context, mem and map "
                       "values", size, (unsigned long long)addr);
  uint64_t v = MS_VMC_LOAD(p, size);
  if (MS_BPF_MODE(in->code) == MS_BPF_MEMSX)
    v = size == 1 ? (uint64_t)(int64_t)(int8_t)v
        : size == 2 ? (uint64_t)(int64_t)(int16_t)v : (uint64_t)(int64_t)(int32_t)v;
  vm->reg[in->dst_reg] = v;
  return 0;
}

MS_VMC_FN int ms_vmc_st(MS_VMC_VM *vm, const struct ms_bpf_insn *in, uint64_t v) {
  unsigned size = ms_vmc_size(in->code);
  uint64_t addr = vm->reg[in->dst_reg] + (uint64_t)(int64_t)in->off;
  void *p = MS_VMC_MEM(vm, addr, size, 1);
  if (!p)
    return MS_VMC_STOP(vm, -EFAULT, "invalid write of %u bytes at 0x%llx: outside the stack, context, mem and map "
                       "values", size, (unsigned long long)addr);
  MS_VMC_STORE(p, size, v);
  return 0;
}

MS_VMC_FN int ms_vmc_atomic(MS_VMC_VM *vm, const struct ms_bpf_insn *in) {
  unsigned size = MS_BPF_SIZE(in->code) == MS_BPF_DW ? 8 : 4;
  uint64_t addr = vm->reg[in->dst_reg] + (uint64_t)(int64_t)in->off;
  void *p = MS_VMC_MEM(vm, addr, size, 1);
  if (!p)
    return MS_VMC_STOP(vm, -EFAULT, "invalid atomic access of %u bytes at 0x%llx: outside the stack, context, mem "
                       "and map values", size, (unsigned long long)addr);
  if (addr % size)
    return MS_VMC_STOP(vm, -EFAULT, "misaligned %u-byte atomic at 0x%llx", size, (unsigned long long)addr);
  uint64_t *src = &vm->reg[in->src_reg];
  uint64_t old = MS_VMC_ATOMIC(p, size, in->imm, size == 8 ? *src : (uint32_t)*src, &vm->reg[0]);
  if (in->imm != MS_BPF_CMPXCHG && (in->imm & MS_BPF_FETCH)) *src = size == 8 ? old : (uint32_t)old;
  return 0;
}

MS_VMC_FN int ms_vmc_local_call(MS_VMC_VM *vm, int32_t imm) {
  if (vm->depth + 1 >= MS_BPF_MAX_CALL_DEPTH)
    return MS_VMC_STOP(vm, -MS_E_LIMIT, "call depth exceeds %d frames", MS_BPF_MAX_CALL_DEPTH);
  uint32_t d = vm->depth++;
  for (int i = 0; i < 4; i++) vm->frames[d].saved[i] = vm->reg[6 + i];
  vm->frames[d].r10 = vm->reg[10];
  vm->frames[d].ret_pc = vm->pc + 1;
  uint8_t *top = MS_VMC_FRAME_TOP(vm, vm->depth);
  MS_VMC_ZERO(top - MS_BPF_STACK_SIZE, MS_BPF_STACK_SIZE);
  vm->reg[10] = (uint64_t)(uintptr_t)top;
  vm->pc = (uint64_t)((int64_t)vm->pc + 1 + imm);
  return 0;
}

/* 1 when the entry program exited. */
MS_VMC_FN int ms_vmc_exit(MS_VMC_VM *vm) {
  if (vm->depth == 0) return 1;
  uint32_t d = --vm->depth;
  for (int i = 0; i < 4; i++) vm->reg[6 + i] = vm->frames[d].saved[i];
  vm->reg[10] = vm->frames[d].r10;
  vm->pc = vm->frames[d].ret_pc;
  return 0;
}

MS_VMC_FN int ms_vmc_jmp(MS_VMC_VM *vm, const struct ms_bpf_insn *in, int *exited) {
  unsigned op = MS_BPF_OP(in->code);
  int is32 = MS_BPF_CLASS(in->code) == MS_BPF_JMP32, err;
  switch (op) {
  case MS_BPF_JA: vm->pc += 1 + (is32 ? (int64_t)in->imm : (int64_t)in->off); return 0;
  case MS_BPF_CALL:
    if (in->src_reg == MS_BPF_PSEUDO_CALL) return ms_vmc_local_call(vm, in->imm);
    if ((err = MS_VMC_HELPER(vm, (uint32_t)in->imm))) return err;
    vm->pc++;
    return 0;
  case MS_BPF_EXIT: *exited = ms_vmc_exit(vm); return 0;
  default: {
    uint64_t a = vm->reg[in->dst_reg];
    uint64_t b = MS_BPF_SRC(in->code) == MS_BPF_X ? vm->reg[in->src_reg] : (uint64_t)(int64_t)in->imm;
    int taken = is32 ? ms_bpf_cond32(op, (uint32_t)a, (uint32_t)b) : ms_bpf_cond64(op, a, b);
    vm->pc += 1 + (taken ? (int64_t)in->off : 0);
    return 0;
  }
  }
}

MS_VMC_FN int ms_vmc_step(MS_VMC_VM *vm, const struct ms_bpf_insn *in, int *exited) {
  int err = 0;
  switch (MS_BPF_CLASS(in->code)) {
  case MS_BPF_ALU: case MS_BPF_ALU64: ms_vmc_alu(vm, in); break;
  case MS_BPF_LD:
    if (!(err = MS_VMC_LDDW(vm, in))) vm->pc++; /* the second slot */
    break;
  case MS_BPF_LDX: err = ms_vmc_ldx(vm, in); break;
  case MS_BPF_ST: err = ms_vmc_st(vm, in, (uint64_t)(int64_t)in->imm); break;
  case MS_BPF_STX:
    err = MS_BPF_MODE(in->code) == MS_BPF_ATOMIC ? ms_vmc_atomic(vm, in) : ms_vmc_st(vm, in, vm->reg[in->src_reg]);
    break;
  default: return ms_vmc_jmp(vm, in, exited);
  }
  if (err) return err;
  vm->pc++;
  return 0;
}

/* Runs from vm->pc until the entry program exits (0) or a stop (its code). */
MS_VMC_FN int ms_vmc_loop(MS_VMC_VM *vm, const struct ms_bpf_insn *insns, uint64_t n) {
  for (;;) {
    if (vm->pc >= n) return MS_VMC_STOP(vm, -EFAULT, "fell off the end of the program");
    if (vm->count >= vm->budget)
      return MS_VMC_STOP(vm, -MS_E_LIMIT, "instruction budget of %llu exhausted", (unsigned long long)vm->budget);
    vm->count++;
    int exited = 0, err = ms_vmc_step(vm, &insns[vm->pc], &exited);
    if (err || exited) return err;
  }
}

#endif
