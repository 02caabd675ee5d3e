/* SPDX-License-Identifier: MIT */
/* The eBPF ALU and jump conditions (RFC 9669), shared by the reference
 * interpreter (interp.c) and the device interpreter (src/core/bpf_core.h), so
 * the two cannot disagree on arithmetic. Plain C that is also CUDA C++: the
 * includer may define MS_BPF_ALU_FN (default static inline) to qualify the
 * functions for the device.
 *
 * 32-bit results are zero-extended, shift counts masked, division by zero
 * gives 0, modulo by zero leaves dst, INT_MIN / -1 gives INT_MIN and
 * INT_MIN % -1 gives 0 (no host trap); END to little-endian truncates (the
 * hosts are little-endian), to big-endian swaps. */
#ifndef MS_CORE_ALU_H
#define MS_CORE_ALU_H

#include <stdint.h>

#include "megascope/bpf.h"

#ifndef MS_BPF_ALU_FN
#define MS_BPF_ALU_FN static inline
#endif

MS_BPF_ALU_FN uint16_t ms_bpf_bswap16(uint16_t x) { return (uint16_t)(x << 8 | x >> 8); }
MS_BPF_ALU_FN uint32_t ms_bpf_bswap32(uint32_t x) {
  return x << 24 | (x & 0xff00u) << 8 | (x >> 8 & 0xff00u) | x >> 24;
}
MS_BPF_ALU_FN uint64_t ms_bpf_bswap64(uint64_t x) {
  return (uint64_t)ms_bpf_bswap32((uint32_t)x) << 32 | ms_bpf_bswap32((uint32_t)(x >> 32));
}

MS_BPF_ALU_FN uint64_t ms_bpf_alu64(unsigned op, int16_t off, int32_t imm, uint64_t d, uint64_t s) {
  switch (op) {
  case MS_BPF_ADD: return d + s;
  case MS_BPF_SUB: return d - s;
  case MS_BPF_MUL: return d * s;
  case MS_BPF_DIV:
    if (!s) return 0;
    if (off == 1) return (int64_t)s == -1 ? (uint64_t)0 - d : (uint64_t)((int64_t)d / (int64_t)s);
    return d / s;
  case MS_BPF_OR: return d | s;
  case MS_BPF_AND: return d & s;
  case MS_BPF_LSH: return d << (s & 63);
  case MS_BPF_RSH: return d >> (s & 63);
  case MS_BPF_NEG: return (uint64_t)0 - d;
  case MS_BPF_MOD:
    if (!s) return d;
    if (off == 1) return (int64_t)s == -1 ? 0 : (uint64_t)((int64_t)d % (int64_t)s);
    return d % s;
  case MS_BPF_XOR: return d ^ s;
  case MS_BPF_MOV:
    if (off == 8) return (uint64_t)(int64_t)(int8_t)s;
    if (off == 16) return (uint64_t)(int64_t)(int16_t)s;
    if (off == 32) return (uint64_t)(int64_t)(int32_t)s;
    return s;
  case MS_BPF_ARSH: return (uint64_t)((int64_t)d >> (s & 63));
  default: /* END in ALU64: unconditional byte swap */
    if (imm == 16) return ms_bpf_bswap16((uint16_t)d);
    if (imm == 32) return ms_bpf_bswap32((uint32_t)d);
    return ms_bpf_bswap64(d);
  }
}

MS_BPF_ALU_FN uint64_t ms_bpf_alu32(unsigned op, int16_t off, int32_t imm, int to_be, uint64_t d64, uint64_t s64) {
  uint32_t d = (uint32_t)d64, s = (uint32_t)s64;
  switch (op) {
  case MS_BPF_ADD: return (uint32_t)(d + s);
  case MS_BPF_SUB: return (uint32_t)(d - s);
  case MS_BPF_MUL: return (uint32_t)(d * s);
  case MS_BPF_DIV:
    if (!s) return 0;
    if (off == 1) return (int32_t)s == -1 ? (uint32_t)(0u - d) : (uint32_t)((int32_t)d / (int32_t)s);
    return d / s;
  case MS_BPF_OR: return d | s;
  case MS_BPF_AND: return d & s;
  case MS_BPF_LSH: return (uint32_t)(d << (s & 31));
  case MS_BPF_RSH: return d >> (s & 31);
  case MS_BPF_NEG: return (uint32_t)(0u - d);
  case MS_BPF_MOD:
    if (!s) return d;
    if (off == 1) return (int32_t)s == -1 ? 0 : (uint32_t)((int32_t)d % (int32_t)s);
    return d % s;
  case MS_BPF_XOR: return d ^ s;
  case MS_BPF_MOV:
    if (off == 8) return (uint32_t)(int32_t)(int8_t)s;
    if (off == 16) return (uint32_t)(int32_t)(int16_t)s;
    return s;
  case MS_BPF_ARSH: return (uint32_t)((int32_t)d >> (s & 31));
  default: /* END: to little-endian truncates, to big-endian swaps */
    if (imm == 16) return to_be ? ms_bpf_bswap16((uint16_t)d64) : (uint16_t)d64;
    if (imm == 32) return to_be ? ms_bpf_bswap32((uint32_t)d64) : (uint32_t)d64;
    return to_be ? ms_bpf_bswap64(d64) : d64;
  }
}

MS_BPF_ALU_FN int ms_bpf_cond64(unsigned op, uint64_t a, uint64_t b) {
  switch (op) {
  case MS_BPF_JEQ: return a == b;
  case MS_BPF_JGT: return a > b;
  case MS_BPF_JGE: return a >= b;
  case MS_BPF_JSET: return (a & b) != 0;
  case MS_BPF_JNE: return a != b;
  case MS_BPF_JSGT: return (int64_t)a > (int64_t)b;
  case MS_BPF_JSGE: return (int64_t)a >= (int64_t)b;
  case MS_BPF_JLT: return a < b;
  case MS_BPF_JLE: return a <= b;
  case MS_BPF_JSLT: return (int64_t)a < (int64_t)b;
  default: return (int64_t)a <= (int64_t)b; /* JSLE */
  }
}

MS_BPF_ALU_FN int ms_bpf_cond32(unsigned op, uint32_t a, uint32_t b) {
  switch (op) {
  case MS_BPF_JSGT: return (int32_t)a > (int32_t)b;
  case MS_BPF_JSGE: return (int32_t)a >= (int32_t)b;
  case MS_BPF_JSLT: return (int32_t)a < (int32_t)b;
  case MS_BPF_JSLE: return (int32_t)a <= (int32_t)b;
  default: return ms_bpf_cond64(op, a, b);
  }
}

#endif
