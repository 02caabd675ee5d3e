/* SPDX-License-Identifier: MIT */
/* The reference eBPF interpreter (RFC 9669).
 *
 * A run gets a list of memory regions it may touch — its stack (all frames),
 * the context (read-only), the caller's mem buffer and the value areas of the
 * maps bound to it — and every load, store and atomic is checked against that
 * list before it happens, so even an unverified program cannot reach memory
 * outside them. Instruction encodings were checked when the program was built
 * (ms_bpf_insns_check), so registers, jump targets and lddw pairs are trusted
 * here; falling off the end, the call depth and the instruction budget are
 * checked as the program runs. Any violation stops the run with a message
 * naming the instruction.
 *
 * Semantics follow RFC 9669: 32-bit ALU results are zero-extended, shift
 * counts are masked, division by zero gives 0, modulo by zero leaves dst (the
 * ALU form zero-extends it), INT_MIN / -1 gives INT_MIN and INT_MIN % -1 gives
 * 0 (no host trap). Local calls save r6-r9 and get a fresh 512-byte frame.
 *
 * The instruction loop itself is core/vm_core.h, which the device interpreter
 * (src/core/bpf_core.h) includes too: this file gives it the region check,
 * lddw of the bound maps, the helper table and stops that log a message. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "core/alu.h"
#include "bpf/bpf_internal.h"

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the interpreter assumes a little-endian host (to_le is a truncation)"
#endif

struct frame {
  uint64_t saved[4]; /* r6..r9 of the caller */
  uint64_t r10;
  uint64_t ret_pc;
};

/* A run's mutable state, kept on the C stack. */
struct vm {
  struct ms_bpf_exec x;
  uint64_t reg[MS_BPF_REG_COUNT];
  struct frame frames[MS_BPF_MAX_CALL_DEPTH];
  uint32_t depth;
  uint64_t count;
  uint64_t budget;
  uint64_t pc; /* index of the instruction being executed */
  int64_t err_insn;
  _Alignas(16) uint8_t stack[MS_BPF_MAX_CALL_DEPTH * MS_BPF_STACK_SIZE];
};

/* ---- regions ------------------------------------------------------------ */

void *ms_bpf_exec_mem(struct ms_bpf_exec *x, uint64_t addr, uint64_t size, int write) {
  for (size_t i = 0; i < x->n_regions; i++) {
    const struct ms_bpf_region *r = &x->regions[i];
    uint64_t d = addr - (uint64_t)r->base; /* wraps for addr below base */
    if (d < r->len && size <= r->len - d) return (write && !r->writable) ? NULL : (void *)(uintptr_t)addr;
  }
  return NULL;
}

struct ms_bpf_map *ms_bpf_exec_map(struct ms_bpf_exec *x, uint64_t handle) {
  for (size_t i = 0; i < x->opts->n_maps; i++)
    if (x->opts->maps[i] && (uint64_t)(uintptr_t)x->opts->maps[i] == handle) return x->opts->maps[i];
  return NULL;
}

const struct ms_bpf_env *ms_bpf_exec_env(const struct ms_bpf_exec *x) { return x->env; }

void ms_bpf_exec_abort(struct ms_bpf_exec *x, int err, const char *fmt, ...) {
  if (x->abort_err) return; /* the first reason wins */
  x->abort_err = err ? err : -EINVAL;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(x->abort_msg, sizeof x->abort_msg, fmt, ap);
  va_end(ap);
}

int ms_bpf_exec_record_add(struct ms_bpf_exec *x, struct ms_bpf_map *map, void *rec) {
  if (x->n_records == MS_BPF_EXEC_MAX_RECORDS) return -MS_E_LIMIT;
  x->records[x->n_records++] = (struct ms_bpf_exec_record){map, rec};
  return 0;
}

struct ms_bpf_map *ms_bpf_exec_record_take(struct ms_bpf_exec *x, void *rec) {
  for (size_t i = 0; i < x->n_records; i++) {
    if (x->records[i].rec != rec) continue;
    struct ms_bpf_map *m = x->records[i].map;
    x->records[i] = x->records[--x->n_records];
    return m;
  }
  return NULL;
}

/* base as an integer: a region is an address range, never read here */
static void add_region(struct ms_bpf_exec *x, uintptr_t base, uint64_t len, int writable) {
  if (!base || !len) return;
  x->regions[x->n_regions++] = (struct ms_bpf_region){base, len, writable};
}

void ms_bpf_exec_setup(struct ms_bpf_exec *x, const struct ms_bpf_prog *prog,
                       const struct ms_bpf_run_opts *o, uint8_t *stack, size_t stack_size,
                       const struct ms_bpf_region *map_regions, size_t n_map_regions) {
  static const struct ms_bpf_env default_env = {0};
  x->prog = prog;
  x->opts = o;
  x->env = o->env ? o->env : &default_env;
  x->n_regions = 0;
  x->n_records = 0;
  x->abort_err = 0;
  add_region(x, (uintptr_t)stack, stack_size, 1);
  add_region(x, (uintptr_t)o->ctx, o->ctx_size, 0);
  add_region(x, (uintptr_t)o->mem, o->mem_size, 1);
  if (map_regions) {
    memcpy(&x->regions[x->n_regions], map_regions, n_map_regions * sizeof *map_regions);
    x->n_regions += n_map_regions;
  }
  for (size_t i = 0; !map_regions && i < o->n_maps; i++) {
    if (!o->maps[i]) continue;
    struct ms_bpf_region r;
    ms_bpf_map_region(o->maps[i], &r);
    add_region(x, r.base, r.len, r.writable);
  }
  /* The interpreter's entry frame starts zeroed, so even an unverified program
   * reads no stale bytes there. The JIT runs only verified programs, which
   * read (or hand helpers) no stack byte they did not write: it skips this. */
  if (!map_regions) memset(stack + stack_size - MS_BPF_STACK_SIZE, 0, MS_BPF_STACK_SIZE);
}

size_t ms_bpf_exec_release(struct ms_bpf_exec *x) {
  size_t left = x->n_records;
  while (x->n_records) {
    struct ms_bpf_exec_record *r = &x->records[--x->n_records];
    ms_bpf_ringbuf_discard(r->map, r->rec);
  }
  return left;
}

/* ---- errors ------------------------------------------------------------- */

__attribute__((format(printf, 3, 4))) static int stop(struct vm *vm, int err, const char *fmt, ...) {
  char msg[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  vm->err_insn = (int64_t)vm->pc;
  ms_textbuf_printf(vm->x.opts->log, "insn %llu: %s\n", (unsigned long long)vm->pc, msg);
  return err;
}

/* ---- memory ------------------------------------------------------------- */

static uint64_t load_n(const void *p, unsigned size) {
  uint8_t b; uint16_t h; uint32_t w; uint64_t d;
  switch (size) {
  case 1: memcpy(&b, p, 1); return b;
  case 2: memcpy(&h, p, 2); return h;
  case 4: memcpy(&w, p, 4); return w;
  default: memcpy(&d, p, 8); return d;
  }
}

static void store_n(void *p, unsigned size, uint64_t v) {
  uint8_t b = (uint8_t)v; uint16_t h = (uint16_t)v; uint32_t w = (uint32_t)v;
  switch (size) {
  case 1: memcpy(p, &b, 1); break;
  case 2: memcpy(p, &h, 2); break;
  case 4: memcpy(p, &w, 4); break;
  default: memcpy(p, &v, 8); break;
  }
}

/* Linux's atomics are fully ordered for the fetch forms; seq_cst for all keeps
 * one rule and costs nothing that matters here. */
uint64_t ms_bpf_atomic_rmw(void *p, int is64, int32_t imm, uint64_t src, uint64_t *r0) {
  int op = imm & ~MS_BPF_FETCH;
  if (is64) {
    uint64_t *q = p, old = *r0;
    if (imm == MS_BPF_CMPXCHG) {
      __atomic_compare_exchange_n(q, &old, src, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
      return *r0 = old;
    }
    return imm == MS_BPF_XCHG ? __atomic_exchange_n(q, src, __ATOMIC_SEQ_CST)
           : op == MS_BPF_ADD ? __atomic_fetch_add(q, src, __ATOMIC_SEQ_CST)
           : op == MS_BPF_OR  ? __atomic_fetch_or(q, src, __ATOMIC_SEQ_CST)
           : op == MS_BPF_AND ? __atomic_fetch_and(q, src, __ATOMIC_SEQ_CST)
                              : __atomic_fetch_xor(q, src, __ATOMIC_SEQ_CST);
  }
  uint32_t *q = p, s = (uint32_t)src, old = (uint32_t)*r0;
  if (imm == MS_BPF_CMPXCHG) {
    __atomic_compare_exchange_n(q, &old, s, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
    return *r0 = old;
  }
  return imm == MS_BPF_XCHG ? __atomic_exchange_n(q, s, __ATOMIC_SEQ_CST)
         : op == MS_BPF_ADD ? __atomic_fetch_add(q, s, __ATOMIC_SEQ_CST)
         : op == MS_BPF_OR  ? __atomic_fetch_or(q, s, __ATOMIC_SEQ_CST)
         : op == MS_BPF_AND ? __atomic_fetch_and(q, s, __ATOMIC_SEQ_CST)
                            : __atomic_fetch_xor(q, s, __ATOMIC_SEQ_CST);
}

/* ---- lddw, calls, exit -------------------------------------------------- */

static int do_lddw(struct vm *vm, const struct ms_bpf_insn *in) {
  const struct ms_bpf_run_opts *o = vm->x.opts;
  uint64_t v = (uint64_t)(uint32_t)in[0].imm | (uint64_t)(uint32_t)in[1].imm << 32;
  if (in->src_reg) {
    size_t idx = (size_t)in->imm; /* checked against the program's map count */
    struct ms_bpf_map *m = idx < o->n_maps ? o->maps[idx] : NULL;
    if (!m) return stop(vm, -EINVAL, "map %zu is not bound to this run", idx);
    v = (uint64_t)(uintptr_t)m;
    if (in->src_reg == MS_BPF_PSEUDO_MAP_VALUE || in->src_reg == MS_BPF_PSEUDO_MAP_IDX_VALUE) {
      void *p = ms_bpf_map_direct_value(m, (uint32_t)in[1].imm);
      if (!p) return stop(vm, -EINVAL, "map %zu has no value at offset %u (array maps only)", idx,
                          (uint32_t)in[1].imm);
      v = (uint64_t)(uintptr_t)p;
    }
  }
  vm->reg[in->dst_reg] = v;
  return 0;
}

static int do_helper(struct vm *vm, uint32_t id) {
  const struct ms_bpf_helpers *h = vm->x.opts->helpers;
  const struct ms_bpf_helper_slot *s = h ? ms_bpf_helpers_slot(h, id) : NULL;
  if (!s || !s->fn) return stop(vm, -ENOENT, "call to unknown helper %u", id);
  uint64_t *r = vm->reg;
  r[0] = s->fn(&vm->x, r[1], r[2], r[3], r[4], r[5]);
  if (vm->x.abort_err) return stop(vm, vm->x.abort_err, "helper %u: %s", id, vm->x.abort_msg);
  return 0;
}

static uint8_t *frame_top(struct vm *vm, unsigned depth) {
  return vm->stack + sizeof vm->stack - (size_t)depth * MS_BPF_STACK_SIZE;
}

/* ---- the loop: core/vm_core.h, shared with the device interpreter -------- */

#define MS_VMC_FN static inline
#define MS_VMC_VM struct vm
#define MS_VMC_MEM(vm, addr, size, w) ms_bpf_exec_mem(&(vm)->x, (addr), (size), (w))
#define MS_VMC_LOAD(p, size) load_n((p), (size))
#define MS_VMC_STORE(p, size, v) store_n((p), (size), (v))
#define MS_VMC_ATOMIC(p, size, imm, s, r0) ms_bpf_atomic_rmw((p), (size) == 8, (imm), (s), (r0))
#define MS_VMC_LDDW(vm, in) do_lddw((vm), (in))
#define MS_VMC_HELPER(vm, id) do_helper((vm), (id))
#define MS_VMC_FRAME_TOP(vm, d) frame_top((vm), (d))
#define MS_VMC_ZERO(p, n) memset((p), 0, (n))
#define MS_VMC_STOP(vm, err, ...) stop((vm), (err), __VA_ARGS__)
#include "core/vm_core.h"

/* Records a run left reserved are discarded; leaving one is the program's fault. */
static int release_records(struct vm *vm, int err) {
  size_t left = ms_bpf_exec_release(&vm->x);
  if (left && !err)
    return stop(vm, -EINVAL, "exit with %zu ring buffer record(s) neither submitted nor discarded",
                left);
  return err;
}

int ms_bpf_run(const struct ms_bpf_prog *prog, const struct ms_bpf_run_opts *opts,
               struct ms_bpf_run_result *res) {
  struct ms_bpf_run_opts o = {0};
  if (!prog || !res) return -EINVAL;
  if (opts) memcpy(&o, opts, opts->sz < sizeof o ? opts->sz : sizeof o);
  res->r0 = 0;
  res->insns = 0;
  res->err_insn = -1;
  if (o.n_maps > MS_BPF_MAX_MAPS || (o.n_maps && !o.maps)) return -EINVAL;

  struct vm vm;
  ms_bpf_exec_setup(&vm.x, prog, &o, vm.stack, sizeof vm.stack, NULL, 0);
  vm.depth = 0;
  vm.count = 0;
  vm.budget = o.insn_budget ? o.insn_budget : MS_BPF_DEFAULT_BUDGET;
  vm.pc = 0;
  vm.err_insn = -1;
  memset(vm.reg, 0, sizeof vm.reg);
  vm.reg[1] = (uint64_t)(uintptr_t)(o.ctx ? o.ctx : o.mem);
  vm.reg[2] = o.ctx ? 0 : o.mem_size;
  vm.reg[10] = (uint64_t)(uintptr_t)frame_top(&vm, 0);

  int err = release_records(&vm, ms_vmc_loop(&vm, prog->insns, prog->n));
  res->r0 = vm.reg[0];
  res->insns = vm.count;
  res->err_insn = vm.err_insn;
  return err;
}
