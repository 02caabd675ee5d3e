/* SPDX-License-Identifier: MIT */
/* The syntactic check of eBPF instructions and the program object.
 *
 * ms_bpf_insns_check accepts exactly the RFC 9669 encodings megascope runs
 * (every field the RFC says "shall be zero" must be zero, as Linux demands)
 * and refuses what it does not run: legacy packet loads, call by register,
 * calls by BTF id, lddw forms other than plain immediates and map references.
 * After it, the interpreter may trust register numbers, jump targets and
 * lddw pairs; only memory, helpers, call depth and the budget remain for run
 * time. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "bpf/bpf_internal.h"

_Static_assert(sizeof(struct ms_bpf_insn) == 8, "eBPF instructions are 8 bytes");

struct check {
  const struct ms_bpf_insn *insns;
  size_t n;
  size_t n_maps;
  unsigned char *second_half; /* 1 at the second slot of each lddw */
  struct ms_textbuf *log;
};

static int refuse(const struct check *c, size_t i, const char *why) {
  ms_textbuf_printf(c->log, "insn %zu: %s (code 0x%02x)\n", i, why, c->insns[i].code);
  return -EINVAL;
}

/* A jump from i to i + 1 + delta must land on an instruction start. */
static int check_target(const struct check *c, size_t i, int64_t delta) {
  int64_t t = (int64_t)i + 1 + delta;
  if (t < 0 || t >= (int64_t)c->n) {
    ms_textbuf_printf(c->log, "insn %zu: jump to %lld is outside the program (0..%zu)\n", i,
                      (long long)t, c->n - 1);
    return -EINVAL;
  }
  if (c->second_half[t]) {
    ms_textbuf_printf(c->log, "insn %zu: jump to %lld lands inside an lddw\n", i, (long long)t);
    return -EINVAL;
  }
  return 0;
}

static int check_lddw(const struct check *c, size_t i) {
  const struct ms_bpf_insn *in = &c->insns[i];
  if (i + 1 >= c->n) return refuse(c, i, "lddw without its second slot");
  const struct ms_bpf_insn *nx = &c->insns[i + 1];
  if (nx->code || nx->dst_reg || nx->src_reg || nx->off)
    return refuse(c, i, "lddw second slot has non-zero fields besides imm");
  if (in->off) return refuse(c, i, "lddw offset must be 0");
  if (in->dst_reg >= 10) return refuse(c, i, "lddw writes r10 or a register above it");
  switch (in->src_reg) {
  case 0: return 0;
  case MS_BPF_PSEUDO_MAP_FD:
  case MS_BPF_PSEUDO_MAP_IDX:
    if (nx->imm) return refuse(c, i, "lddw map reference with a non-zero second imm");
    /* fallthrough */
  case MS_BPF_PSEUDO_MAP_VALUE:
  case MS_BPF_PSEUDO_MAP_IDX_VALUE:
    if (in->imm < 0 || (size_t)in->imm >= c->n_maps) {
      ms_textbuf_printf(c->log, "insn %zu: lddw names map %d but the program has %zu maps\n", i,
                        in->imm, c->n_maps);
      return -EINVAL;
    }
    return 0;
  default: return refuse(c, i, "lddw kind (src_reg) not supported");
  }
}

static int check_ldst(const struct check *c, size_t i) {
  const struct ms_bpf_insn *in = &c->insns[i];
  unsigned cls = MS_BPF_CLASS(in->code), mode = MS_BPF_MODE(in->code);
  unsigned size = MS_BPF_SIZE(in->code);
  if (in->dst_reg > 10 || in->src_reg > 10) return refuse(c, i, "register above r10");
  switch (cls) {
  case MS_BPF_LDX:
    if (mode != MS_BPF_MEM && !(mode == MS_BPF_MEMSX && size != MS_BPF_DW))
      return refuse(c, i, "unknown load mode");
    if (in->dst_reg == 10) return refuse(c, i, "load into the read-only r10");
    if (in->imm) return refuse(c, i, "load with non-zero imm");
    return 0;
  case MS_BPF_ST:
    if (mode != MS_BPF_MEM) return refuse(c, i, "unknown store mode");
    if (in->src_reg) return refuse(c, i, "store immediate with non-zero src_reg");
    return 0;
  default: /* STX */
    if (mode == MS_BPF_MEM) return in->imm ? refuse(c, i, "store with non-zero imm") : 0;
    if (mode != MS_BPF_ATOMIC) return refuse(c, i, "unknown store mode");
    if (size != MS_BPF_W && size != MS_BPF_DW) return refuse(c, i, "atomic of 8 or 16 bits");
    switch (in->imm) {
    case MS_BPF_ADD: case MS_BPF_OR: case MS_BPF_AND: case MS_BPF_XOR:
    case MS_BPF_ADD | MS_BPF_FETCH: case MS_BPF_OR | MS_BPF_FETCH:
    case MS_BPF_AND | MS_BPF_FETCH: case MS_BPF_XOR | MS_BPF_FETCH:
    case MS_BPF_XCHG: case MS_BPF_CMPXCHG:
      return 0;
    default: return refuse(c, i, "unknown atomic operation");
    }
  }
}

static int check_alu(const struct check *c, size_t i) {
  const struct ms_bpf_insn *in = &c->insns[i];
  int is64 = MS_BPF_CLASS(in->code) == MS_BPF_ALU64, x = MS_BPF_SRC(in->code) == MS_BPF_X;
  unsigned op = MS_BPF_OP(in->code);
  if (in->dst_reg >= 10) return refuse(c, i, "ALU writes r10 or a register above it");
  if (in->src_reg > 10) return refuse(c, i, "register above r10");
  if (op == MS_BPF_END) {
    if (in->src_reg || in->off) return refuse(c, i, "byte swap with non-zero src_reg or offset");
    if (is64 && x) return refuse(c, i, "bswap has no big-endian form");
    if (in->imm != 16 && in->imm != 32 && in->imm != 64) return refuse(c, i, "byte swap width not 16/32/64");
    return 0;
  }
  if (op == MS_BPF_NEG) {
    if (x || in->src_reg || in->imm || in->off) return refuse(c, i, "neg with operands");
    return 0;
  }
  if (op > MS_BPF_ARSH) return refuse(c, i, "unknown ALU operation");
  if (!x && in->src_reg) return refuse(c, i, "immediate ALU with non-zero src_reg");
  if (x && in->imm) return refuse(c, i, "register ALU with non-zero imm");
  if (in->off == 0) return 0;
  if ((op == MS_BPF_DIV || op == MS_BPF_MOD) && in->off == 1) return 0;
  if (op == MS_BPF_MOV && x && (in->off == 8 || in->off == 16 || (is64 && in->off == 32)))
    return 0;
  return refuse(c, i, "ALU offset must be 0 (1 for sdiv/smod, 8/16/32 for movsx)");
}

static int check_jmp(const struct check *c, size_t i) {
  const struct ms_bpf_insn *in = &c->insns[i];
  int is32 = MS_BPF_CLASS(in->code) == MS_BPF_JMP32, x = MS_BPF_SRC(in->code) == MS_BPF_X;
  unsigned op = MS_BPF_OP(in->code);
  if (in->dst_reg > 10 || in->src_reg > 10) return refuse(c, i, "register above r10");
  switch (op) {
  case MS_BPF_JA:
    if (x || in->dst_reg || in->src_reg) return refuse(c, i, "ja with registers");
    if (is32) return in->off ? refuse(c, i, "ja32 with non-zero offset") : check_target(c, i, in->imm);
    return in->imm ? refuse(c, i, "ja with non-zero imm") : check_target(c, i, in->off);
  case MS_BPF_CALL:
    if (is32) return refuse(c, i, "call in the JMP32 class");
    if (x) return refuse(c, i, "call by register (callx) is not supported");
    if (in->dst_reg || in->off) return refuse(c, i, "call with non-zero dst_reg or offset");
    if (in->src_reg == 0) return 0;
    if (in->src_reg == MS_BPF_PSEUDO_CALL) return check_target(c, i, in->imm);
    return refuse(c, i, "call kind (src_reg) not supported");
  case MS_BPF_EXIT:
    if (is32 || x || in->dst_reg || in->src_reg || in->off || in->imm)
      return refuse(c, i, "exit with operands");
    return 0;
  case 0xe0: case 0xf0: return refuse(c, i, "unknown jump operation");
  default:
    if (!x && in->src_reg) return refuse(c, i, "immediate jump with non-zero src_reg");
    if (x && in->imm) return refuse(c, i, "register jump with non-zero imm");
    return check_target(c, i, in->off);
  }
}

static int check_one(const struct check *c, size_t i) {
  const struct ms_bpf_insn *in = &c->insns[i];
  switch (MS_BPF_CLASS(in->code)) {
  case MS_BPF_LD:
    if (in->code != (MS_BPF_LD | MS_BPF_IMM | MS_BPF_DW))
      return refuse(c, i, "legacy packet load or unknown LD form");
    return check_lddw(c, i);
  case MS_BPF_LDX: case MS_BPF_ST: case MS_BPF_STX: return check_ldst(c, i);
  case MS_BPF_ALU: case MS_BPF_ALU64: return check_alu(c, i);
  default: return check_jmp(c, i);
  }
}

int ms_bpf_insns_check(const struct ms_bpf_insn *insns, size_t n, size_t n_maps,
                       struct ms_textbuf *log) {
  if (!insns || n == 0) {
    ms_textbuf_printf(log, "empty program\n");
    return -EINVAL;
  }
  if (n > MS_BPF_MAX_INSNS) {
    ms_textbuf_printf(log, "program of %zu instructions, the limit is %d\n", n, MS_BPF_MAX_INSNS);
    return -MS_E_LIMIT;
  }
  struct check c = {insns, n, n_maps, calloc(n, 1), log};
  if (!c.second_half) return -ENOMEM;
  for (size_t i = 0; i + 1 < n; i++)
    if (insns[i].code == (MS_BPF_LD | MS_BPF_IMM | MS_BPF_DW)) c.second_half[++i] = 1;
  int err = 0;
  for (size_t i = 0; i < n && !err; i++) {
    if (c.second_half[i]) continue;
    err = check_one(&c, i);
  }
  free(c.second_half);
  return err;
}

void ms_bpf_prog_free(struct ms_bpf_prog *p) {
  if (!p) return;
  free(p->insns);
  free(p->name);
  free(p->section);
  free(p->maps);
  free(p);
}

struct ms_bpf_prog *ms_bpf_prog_new(const struct ms_bpf_insn *insns, size_t n,
                                    const struct ms_bpf_prog_opts *opts) {
  struct ms_bpf_prog_opts o = {0};
  if (opts) memcpy(&o, opts, opts->sz < sizeof o ? opts->sz : sizeof o);
  if (o.n_maps > MS_BPF_MAX_MAPS || (o.n_maps && !o.maps)) {
    ms_textbuf_printf(o.log, "a program may name at most %d maps\n", MS_BPF_MAX_MAPS);
    errno = EINVAL;
    return NULL;
  }
  int err = ms_bpf_insns_check(insns, n, o.n_maps, o.log);
  if (err) {
    errno = -err;
    return NULL;
  }
  struct ms_bpf_prog *p = calloc(1, sizeof *p);
  if (!p) goto nomem;
  p->insns = malloc(n * sizeof *insns);
  p->name = strdup(o.name ? o.name : "prog");
  p->section = strdup(o.section ? o.section : "");
  p->maps = o.n_maps ? malloc(o.n_maps * sizeof *o.maps) : NULL;
  if (!p->insns || !p->name || !p->section || (o.n_maps && !p->maps)) goto nomem;
  memcpy(p->insns, insns, n * sizeof *insns);
  if (o.n_maps) memcpy(p->maps, o.maps, o.n_maps * sizeof *o.maps);
  p->n = n;
  p->n_maps = o.n_maps;
  return p;
nomem:
  ms_bpf_prog_free(p);
  errno = ENOMEM;
  return NULL;
}

const struct ms_bpf_insn *ms_bpf_prog_insns(const struct ms_bpf_prog *p, size_t *n) {
  if (n) *n = p->n;
  return p->insns;
}

const char *ms_bpf_prog_name(const struct ms_bpf_prog *p) { return p->name; }
const char *ms_bpf_prog_section(const struct ms_bpf_prog *p) { return p->section; }
size_t ms_bpf_prog_map_count(const struct ms_bpf_prog *p) { return p->n_maps; }

const struct ms_bpf_map_def *ms_bpf_prog_map(const struct ms_bpf_prog *p, size_t idx) {
  return idx < p->n_maps ? &p->maps[idx] : NULL;
}
