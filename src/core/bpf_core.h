/* SPDX-License-Identifier: MIT */
/* The eBPF interpreter and map operations of the device, in one header that
 * compiles both as C11 (the host test, tests/test_bpf_devcore.c, checks it
 * against the reference) and as CUDA C++17 device code (bpf_dev.cuh).
 *
 * The instruction loop is the reference interpreter's own (src/core/vm_core.h,
 * included by interp.c too, with this file's memory, lddw and helpers); the
 * ALU is core/alu.h, also shared. The helpers, maps and ring buffer below are a
 * second implementation of src/bpf/helpers.c, maps.c and ringbuf.c with the
 * same semantics and the same bytes in memory:
 *   - RFC 9669 as interp.c runs it: zero-extended alu32, masked shifts, x/0 = 0,
 *     x%0 = x, INT_MIN/-1 = INT_MIN, INT_MIN%-1 = 0, atomics (add/or/and/xor,
 *     their fetch forms, xchg, cmpxchg), local calls that save r6-r9 with a
 *     fresh 512-byte frame, lddw with the loader's map pseudo forms (imm = the
 *     object's map index; MAP_VALUE: element 0 of an array + next imm), every
 *     load, store and atomic checked against the run's regions (the stack,
 *     the context read-only, the mem buffer, the value areas of bound maps),
 *     an instruction budget, and the same error codes (-EFAULT, -MS_E_LIMIT,
 *     -ENOENT, -EINVAL) with the index of the instruction that stopped.
 *   - Helpers 1-3 (map lookup/update/delete), 5 (ktime_get_ns: the caller's
 *     clock in C, %globaltimer on the device), 8 (the worker), 130-133 (ring
 *     buffer, with fire.c's byte budget and lost count) and megascope's
 *     ms_log2 (0x10000). Any other id stops the run with -ENOENT. On the device
 *     there are no strings: a run reports its code, instruction and helper id.
 *   - Maps on the shared-memory layout of struct ms_bpf_map_shm (maps.c): the
 *     hash state machine EMPTY -> CLAIMING -> LIVE, LIVE -> KEYED (delete),
 *     KEYED -> WRITING -> LIVE, the FNV-1a + avalanche hash, linear probing,
 *     the live count reserved before a bucket turns LIVE, per-worker slots
 *     (a new key starts with the other workers' slots zero), the ring buffer's
 *     records (8-byte header, BUSY/DISCARD bits, producer spinlock, lost).
 *
 * A map here is a struct msd_map: the decoded offsets of one shared-memory
 * image, which may be a host map's memfd mapping (the test) or a device mirror
 * of it (monitors.cu). Only a ring buffer differs: the host maps its data
 * twice back to back; a device buffer instead has ring_size spare bytes after
 * the data, a record that wraps is written there contiguously and its wrapped
 * part is copied to the start of the data before it is submitted (on a double
 * mapping that copy is a no-op).
 *
 * Ordering (maps.c's DESIGN): a bucket's key and value are written before the
 * release store (or the acq_rel CAS) that makes it LIVE; states are loaded with
 * acquire; 8-byte value words move with relaxed atomic stores so a reader never
 * sees a torn counter. On the device acquire/release are ld.acquire.gpu /
 * st.release.gpu, read-modify-writes are atomicCAS/Add/Exch/Or/And/Xor between
 * two __threadfence() (seq_cst as interp.c's atomics). A bpf atomic on the
 * stack (local memory, private to the thread) is a plain read-modify-write:
 * CUDA atomics do not operate on local memory.
 *
 * The caller guarantees the instructions passed ms_bpf_insns_check (registers,
 * jump targets and lddw pairs are trusted, as in interp.c). No dynamic
 * allocation, no recursion, no libc on the device path; a run's state is about
 * 4.5 KiB of local memory (eight 512-byte frames). */
#ifndef MS_CORE_BPF_CORE_H
#define MS_CORE_BPF_CORE_H

#include <errno.h>
#include <stdint.h>

#include "megascope/base.h"
#include "megascope/bpf.h"
#include "megascope/bpf/megascope.h"

#ifdef __CUDACC__
#define MSD_FN static __device__ __forceinline__
#define MSD_BIG static __device__ __noinline__
#define MSD_HD static __host__ __device__ inline
#else
#define MSD_FN static inline
#define MSD_BIG static inline
#define MSD_HD static inline
#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "bpf_core assumes a little-endian host"
#endif
#endif

/* the ALU and the jump conditions: the reference interpreter's own */
#define MS_BPF_ALU_FN MSD_FN
#include "core/alu.h"

/* atomics and plain memory moves: ms_at_* (core/atomics.h, maps.c's too) */
#include "core/atomics.h"

/* ---- maps --------------------------------------------------------------- */

/* One map's image decoded (maps.c's struct map_view). Pointers are into the
 * image: device addresses for a device mirror, host addresses in the test. */
struct msd_map {
  struct ms_bpf_map_shm *hdr;  /* the image's header: count and lost are updated in it */
  uint8_t *base;
  uint32_t type, key_size, value_size, max_entries, n_workers, flags;
  uint32_t key_stride, value_stride, n_slots;
  uint32_t *state;      /* hash: one per slot */
  uint8_t *keys;        /* hash: key_stride per slot */
  uint8_t *values;      /* [n_workers][n_slots] value_stride each */
  uint64_t *cons_pos;   /* ring buffer */
  uint64_t *prod_pos;
  uint32_t *prod_lock;
  uint8_t *data;        /* ring_size bytes, then ring_size spare (or the second mapping) */
  uint64_t ring_size;
  uint64_t region_len;  /* bytes at values (or data) a program may touch */
  uint32_t writable;    /* 0 for MS_BPF_MAP_F_RDONLY_PROG maps */
  uint32_t pad;
};

/* Bytes an image of h needs on the device: the memfd's, plus the ring buffer's
 * spare copy of its data. */
MSD_HD uint64_t msd_map_image_size(const struct ms_bpf_map_shm *h) {
  return h->total_size + (h->type == MS_BPF_MAP_RINGBUF ? h->ring_size : 0);
}

/* ---- the maps: core/map_core.h, maps.c's own ------------------------------ */

#define MS_MAPC_FN MSD_FN
#define MS_MAPC_HD MSD_HD
#define MS_MAPC_VIEW struct msd_map
#define MS_MAPC_RELAX(spins) ms_at_relax()
#define MS_MAPC_RING_SPARE 1
#include "core/map_core.h"

/* Decodes m from h, a header already checked (it comes from ms_bpf_map_new),
 * for the image at base (which need not be readable from the caller): the
 * layout as maps.c decodes it, and what a device run checks accesses with. */
MSD_HD void msd_map_init(struct msd_map *m, const struct ms_bpf_map_shm *h, uint8_t *base) {
  uint8_t *z = (uint8_t *)m;
  for (uint64_t i = 0; i < sizeof *m; i++) z[i] = 0;
  ms_mapc_view_init(m, h, base);
  m->flags = h->flags;
  m->writable = h->type == MS_BPF_MAP_RINGBUF || !(h->flags & MS_BPF_MAP_F_RDONLY_PROG);
  m->region_len = h->type == MS_BPF_MAP_RINGBUF ? 2 * h->ring_size
                                                : (uint64_t)h->value_stride * h->n_slots * h->n_workers;
}

/* ---- ring buffer (ringbuf.c) --------------------------------------------- */

/* ms_mapc_ring_reserve (core/map_core.h) on a ring buffer map; release is ms_mapc_ring_release. */
MSD_FN void *msd_ringbuf_reserve(const struct msd_map *m, uint64_t size) {
  return m->type == MS_BPF_MAP_RINGBUF ? ms_mapc_ring_reserve(m, size) : 0;
}

/* ---- the interpreter ---------------------------------------------------- */

/* What a run gets. Plain data; fill every field (msd_run_init zeroes it). */
#define MSD_RUN_CONFORMANCE 1u /* helper 5 returns r1 and is the only helper (the suite's runner) */
struct msd_run {
  const struct ms_bpf_insn *insns;
  uint32_t n_insns;
  uint32_t n_maps;
  const struct msd_map *maps;   /* maps[i]: the program's map index i; handle = &maps[i] */
  const void *ctx;              /* read-only; r1 = ctx when set */
  uint64_t ctx_size;
  void *mem;                    /* read-write; without ctx r1 = mem, r2 = mem_size */
  uint64_t mem_size;
  uint64_t budget;              /* 0: MS_BPF_DEFAULT_BUDGET */
  uint32_t worker;              /* helper 8 and the per-worker slot */
  uint32_t flags;               /* MSD_RUN_* */
  uint64_t *ring_bytes;         /* the attachment's ring bytes this epoch (atomic), or NULL */
  uint64_t ring_budget;         /* 0: no limit */
#ifndef __CUDACC__
  uint64_t (*clock)(void *user); /* helper 5; NULL: ms_now_ns */
  void *clock_user;
#endif
};

struct msd_result {
  uint64_t r0;
  uint64_t insns;      /* executed (lddw once) */
  int64_t err_insn;    /* instruction that stopped the run, -1 if none */
  uint32_t lost;       /* ring buffer records refused (full, over budget, bad size or flags) */
  uint32_t helper;     /* the helper that failed the run, 0 if none */
};

MSD_FN void msd_run_init(struct msd_run *r) {
  uint8_t *z = (uint8_t *)r;
  for (uint64_t i = 0; i < sizeof *r; i++) z[i] = 0;
}

#define MSD_MAX_RECORDS 32

struct msd_frame {
  uint64_t saved[4]; /* r6..r9 of the caller */
  uint64_t r10;
  uint64_t ret_pc;
};

struct msd_vm {
  const struct msd_run *in;
  uint64_t reg[MS_BPF_REG_COUNT];
  struct msd_frame frames[MS_BPF_MAX_CALL_DEPTH];
  void *rec[MSD_MAX_RECORDS];
  uint32_t rec_map[MSD_MAX_RECORDS];
  uint32_t n_rec;
  uint32_t depth;
  uint64_t count, budget, pc;
  uint32_t lost, helper;
  uint64_t stack[MS_BPF_MAX_CALL_DEPTH * MS_BPF_STACK_SIZE / 8]; /* 8-aligned */
};

/* The host address of [addr, addr+size) if inside one allowed region, else 0. */
MSD_FN void *msd_mem(const struct msd_vm *vm, uint64_t addr, uint64_t size, int write) {
  const struct msd_run *in = vm->in;
  uint64_t d = addr - (uint64_t)(uintptr_t)vm->stack; /* wraps for addr below base */
  if (d < sizeof vm->stack && size <= sizeof vm->stack - d) return (void *)(uintptr_t)addr;
  if (in->ctx && in->ctx_size) {
    d = addr - (uint64_t)(uintptr_t)in->ctx;
    if (d < in->ctx_size && size <= in->ctx_size - d) return write ? 0 : (void *)(uintptr_t)addr;
  }
  if (in->mem && in->mem_size) {
    d = addr - (uint64_t)(uintptr_t)in->mem;
    if (d < in->mem_size && size <= in->mem_size - d) return (void *)(uintptr_t)addr;
  }
  for (uint32_t i = 0; i < in->n_maps; i++) {
    const struct msd_map *m = &in->maps[i];
    uint64_t base = (uint64_t)(uintptr_t)(m->type == MS_BPF_MAP_RINGBUF ? m->data : m->values);
    if (!base || !m->region_len) continue;
    d = addr - base;
    if (d < m->region_len && size <= m->region_len - d)
      return (write && !m->writable) ? 0 : (void *)(uintptr_t)addr;
  }
  return 0;
}

/* One bpf atomic on an aligned word; returns the old value. */
MSD_FN uint64_t msd_atomic_rmw(void *p, unsigned size, int32_t imm, uint64_t s, uint64_t *r0) {
  int op = imm & ~MS_BPF_FETCH;
#ifdef __CUDACC__
  if (!__isGlobal(p)) { /* the stack: local memory, this thread's alone */
    uint64_t old = ms_at_load(p, size), nv;
    if (imm == MS_BPF_CMPXCHG) {
      uint64_t want = size == 8 ? *r0 : (uint32_t)*r0;
      if (old == want) ms_at_store(p, size, s);
      *r0 = old;
      return old;
    }
    nv = imm == MS_BPF_XCHG ? s
         : op == MS_BPF_ADD ? old + s : op == MS_BPF_OR ? old | s : op == MS_BPF_AND ? old & s : old ^ s;
    ms_at_store(p, size, nv);
    return old;
  }
  uint64_t old;
  __threadfence();
  if (size == 8) {
    unsigned long long *q = (unsigned long long *)p, v = (unsigned long long)s;
    if (imm == MS_BPF_CMPXCHG) old = atomicCAS(q, (unsigned long long)*r0, v);
    else if (imm == MS_BPF_XCHG) old = atomicExch(q, v);
    else if (op == MS_BPF_ADD) old = atomicAdd(q, v);
    else if (op == MS_BPF_OR) old = atomicOr(q, v);
    else if (op == MS_BPF_AND) old = atomicAnd(q, v);
    else old = atomicXor(q, v);
  } else {
    unsigned int *q = (unsigned int *)p, v = (unsigned int)s;
    if (imm == MS_BPF_CMPXCHG) old = atomicCAS(q, (unsigned int)*r0, v);
    else if (imm == MS_BPF_XCHG) old = atomicExch(q, v);
    else if (op == MS_BPF_ADD) old = atomicAdd(q, v);
    else if (op == MS_BPF_OR) old = atomicOr(q, v);
    else if (op == MS_BPF_AND) old = atomicAnd(q, v);
    else old = atomicXor(q, v);
  }
  __threadfence();
  if (imm == MS_BPF_CMPXCHG) *r0 = old;
  return old;
#else
  if (size == 8) {
    uint64_t *q = (uint64_t *)p, old;
    switch (imm) {
    case MS_BPF_XCHG: return __atomic_exchange_n(q, s, __ATOMIC_SEQ_CST);
    case MS_BPF_CMPXCHG:
      old = *r0;
      __atomic_compare_exchange_n(q, &old, s, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
      *r0 = old;
      return old;
    default:
      return op == MS_BPF_ADD ? __atomic_fetch_add(q, s, __ATOMIC_SEQ_CST)
             : op == MS_BPF_OR ? __atomic_fetch_or(q, s, __ATOMIC_SEQ_CST)
             : op == MS_BPF_AND ? __atomic_fetch_and(q, s, __ATOMIC_SEQ_CST)
             : __atomic_fetch_xor(q, s, __ATOMIC_SEQ_CST);
    }
  }
  uint32_t *q = (uint32_t *)p, v = (uint32_t)s, o32;
  switch (imm) {
  case MS_BPF_XCHG: return __atomic_exchange_n(q, v, __ATOMIC_SEQ_CST);
  case MS_BPF_CMPXCHG:
    o32 = (uint32_t)*r0;
    __atomic_compare_exchange_n(q, &o32, v, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
    *r0 = o32;
    return o32;
  default:
    return op == MS_BPF_ADD ? __atomic_fetch_add(q, v, __ATOMIC_SEQ_CST)
           : op == MS_BPF_OR ? __atomic_fetch_or(q, v, __ATOMIC_SEQ_CST)
           : op == MS_BPF_AND ? __atomic_fetch_and(q, v, __ATOMIC_SEQ_CST)
           : __atomic_fetch_xor(q, v, __ATOMIC_SEQ_CST);
  }
#endif
}

MSD_FN int msd_do_lddw(struct msd_vm *vm, const struct ms_bpf_insn *in) {
  uint64_t v = (uint64_t)(uint32_t)in[0].imm | (uint64_t)(uint32_t)in[1].imm << 32;
  if (in->src_reg) {
    uint32_t idx = (uint32_t)in->imm;
    if (idx >= vm->in->n_maps) return -EINVAL; /* not bound to this run */
    const struct msd_map *m = &vm->in->maps[idx];
    v = (uint64_t)(uintptr_t)m;
    if (in->src_reg == MS_BPF_PSEUDO_MAP_VALUE || in->src_reg == MS_BPF_PSEUDO_MAP_IDX_VALUE) {
      uint32_t off = (uint32_t)in[1].imm;
      if (m->type != MS_BPF_MAP_ARRAY || off >= m->value_size) return -EINVAL; /* array maps only */
      v = (uint64_t)(uintptr_t)(m->values + off);
    }
  }
  vm->reg[in->dst_reg] = v;
  return 0;
}

/* ---- helpers (helpers.c and fire.c) ------------------------------------- */

#define MSD_KV_TYPES                                                             \
  (1u << MS_BPF_MAP_HASH | 1u << MS_BPF_MAP_ARRAY | 1u << MS_BPF_MAP_PERCPU_HASH | \
   1u << MS_BPF_MAP_PERCPU_ARRAY)
#define MSD_HASH_TYPES (1u << MS_BPF_MAP_HASH | 1u << MS_BPF_MAP_PERCPU_HASH)
#define MSD_RING_TYPES (1u << MS_BPF_MAP_RINGBUF)

/* A helper's failure that stops the run (ms_bpf_exec_abort): *err gets the code. */
MSD_FN const struct msd_map *msd_arg_map(struct msd_vm *vm, uint64_t handle, uint32_t types, int *err) {
  const struct msd_run *in = vm->in;
  uint64_t d = handle - (uint64_t)(uintptr_t)in->maps;
  if (!in->maps || d % sizeof(struct msd_map) || d / sizeof(struct msd_map) >= in->n_maps) {
    *err = -EINVAL; /* not a map bound to this run */
    return 0;
  }
  const struct msd_map *m = &in->maps[d / sizeof(struct msd_map)];
  if (m->type >= 32 || !(types & (1u << m->type))) {
    *err = -EINVAL; /* a map of a type not accepted here */
    return 0;
  }
  return m;
}

MSD_FN const void *msd_arg_mem(struct msd_vm *vm, uint64_t addr, uint64_t size, int *err) {
  const void *p = msd_mem(vm, addr, size, 0);
  if (!p) *err = -EFAULT;
  return p;
}

/* helper 5's clock (megakernel.cuh has its own msd_now) */
MSD_FN uint64_t msd_run_now(const struct msd_run *in) {
#ifdef __CUDACC__
  return ms_at_clock_now();
#else
  return in->clock ? in->clock(in->clock_user) : ms_now_ns();
#endif
}

/* fire.c's byte budget of the attachment's ring buffers, per epoch. */
MSD_FN int msd_over_ring_budget(const struct msd_run *in, uint64_t size) {
  if (!in->ring_budget || !in->ring_bytes) return 0;
  return ms_at_fetch_add64(in->ring_bytes, size) + size > in->ring_budget;
}

/* fire.c's wrappers first (the byte budget, then the lost count of whatever
 * the standard helper refuses), then helpers.c's argument checks. */
MSD_FN uint64_t msd_h_ringbuf_output(struct msd_vm *vm, const uint64_t *r, int *err) {
  if (msd_over_ring_budget(vm->in, r[3])) {
    vm->lost++;
    return (uint64_t)(int64_t)-EAGAIN;
  }
  const struct msd_map *m = msd_arg_map(vm, r[1], MSD_RING_TYPES, err);
  if (!m) return 0;
  if (r[4] & ~(uint64_t)(MS_BPF_RB_NO_WAKEUP | MS_BPF_RB_FORCE_WAKEUP)) {
    vm->lost++;
    return (uint64_t)(int64_t)-EINVAL;
  }
  const void *data = msd_arg_mem(vm, r[2], r[3], err);
  if (!data) return 0;
  void *rec = msd_ringbuf_reserve(m, r[3]);
  if (!rec) {
    vm->lost++;
    return (uint64_t)(int64_t)-EAGAIN;
  }
  ms_at_bytes_copy(rec, data, r[3]);
  ms_mapc_ring_release(m, rec, 0);
  return 0;
}

MSD_FN uint64_t msd_h_ringbuf_reserve(struct msd_vm *vm, const uint64_t *r, int *err) {
  if (msd_over_ring_budget(vm->in, r[2])) {
    vm->lost++;
    return 0;
  }
  const struct msd_map *m = msd_arg_map(vm, r[1], MSD_RING_TYPES, err);
  void *rec = m && !r[3] ? msd_ringbuf_reserve(m, r[2]) : 0; /* Linux: reserve takes no flags */
  if (rec && vm->n_rec == MSD_MAX_RECORDS) {
    ms_mapc_ring_release(m, rec, 1); /* more records open than a run may hold */
    rec = 0;
  }
  if (!rec) {
    vm->lost++;
    return 0;
  }
  vm->rec[vm->n_rec] = rec;
  vm->rec_map[vm->n_rec++] = (uint32_t)(m - vm->in->maps);
  return (uint64_t)(uintptr_t)rec;
}

MSD_FN uint64_t msd_h_ringbuf_release(struct msd_vm *vm, uint64_t rec, int discard, int *err) {
  for (uint32_t i = 0; i < vm->n_rec; i++) {
    if ((uint64_t)(uintptr_t)vm->rec[i] != rec) continue;
    const struct msd_map *m = &vm->in->maps[vm->rec_map[i]];
    vm->n_rec--;
    vm->rec[i] = vm->rec[vm->n_rec];
    vm->rec_map[i] = vm->rec_map[vm->n_rec];
    ms_mapc_ring_release(m, (void *)(uintptr_t)rec, discard);
    return 0;
  }
  *err = -EINVAL; /* not a record this run reserved */
  return 0;
}

MSD_FN uint64_t msd_h_map(struct msd_vm *vm, uint32_t id, const uint64_t *r, int *err) {
  const struct msd_map *m =
      msd_arg_map(vm, r[1], id == MS_BPF_FN_MAP_DELETE_ELEM ? MSD_HASH_TYPES : MSD_KV_TYPES, err);
  const void *key = m ? msd_arg_mem(vm, r[2], m->key_size, err) : 0;
  if (!key) return 0;
  if (id == MS_BPF_FN_MAP_LOOKUP_ELEM)
    return (uint64_t)(uintptr_t)ms_mapc_lookup(m, key, vm->in->worker);
  if (id == MS_BPF_FN_MAP_DELETE_ELEM) return (uint64_t)(int64_t)ms_mapc_delete(m, key);
  const void *value = msd_arg_mem(vm, r[3], m->value_size, err);
  if (!value) return 0;
  if (m->flags & MS_BPF_MAP_F_RDONLY_PROG) return (uint64_t)(int64_t)-EPERM;
  return (uint64_t)(int64_t)ms_mapc_update(m, key, value, r[4], vm->in->worker);
}

/* Whether the device implements helper id (monitors.cu refuses others). */
MSD_HD int msd_helper_supported(uint32_t id) {
  switch (id) {
  case MS_BPF_FN_MAP_LOOKUP_ELEM: case MS_BPF_FN_MAP_UPDATE_ELEM: case MS_BPF_FN_MAP_DELETE_ELEM:
  case MS_BPF_FN_KTIME_GET_NS: case MS_BPF_FN_GET_SMP_PROCESSOR_ID:
  case MS_BPF_FN_RINGBUF_OUTPUT: case MS_BPF_FN_RINGBUF_RESERVE: case MS_BPF_FN_RINGBUF_SUBMIT:
  case MS_BPF_FN_RINGBUF_DISCARD: case MS_HELPER_LOG2:
    return 1;
  default: return 0;
  }
}

MSD_FN int msd_do_helper(struct msd_vm *vm, uint32_t id) {
  uint64_t *r = vm->reg;
  int err = 0;
  if (vm->in->flags & MSD_RUN_CONFORMANCE) {
    if (id != MS_BPF_FN_KTIME_GET_NS) err = -ENOENT;
    else r[0] = r[1];
  } else {
    switch (id) {
    case MS_BPF_FN_MAP_LOOKUP_ELEM: case MS_BPF_FN_MAP_UPDATE_ELEM: case MS_BPF_FN_MAP_DELETE_ELEM:
      r[0] = msd_h_map(vm, id, r, &err);
      break;
    case MS_BPF_FN_KTIME_GET_NS: r[0] = msd_run_now(vm->in); break;
    case MS_BPF_FN_GET_SMP_PROCESSOR_ID: r[0] = vm->in->worker; break;
    case MS_BPF_FN_RINGBUF_OUTPUT: r[0] = msd_h_ringbuf_output(vm, r, &err); break;
    case MS_BPF_FN_RINGBUF_RESERVE: r[0] = msd_h_ringbuf_reserve(vm, r, &err); break;
    case MS_BPF_FN_RINGBUF_SUBMIT: r[0] = msd_h_ringbuf_release(vm, r[1], 0, &err); break;
    case MS_BPF_FN_RINGBUF_DISCARD: r[0] = msd_h_ringbuf_release(vm, r[1], 1, &err); break;
    case MS_HELPER_LOG2: r[0] = r[1] ? (uint64_t)(63 - ms_at_clz64(r[1])) : 0; break;
    default: err = -ENOENT; /* unknown helper */
    }
  }
  if (err) vm->helper = id;
  return err;
}

MSD_FN uint8_t *msd_frame_top(struct msd_vm *vm, uint32_t depth) {
  return (uint8_t *)vm->stack + sizeof vm->stack - (uint64_t)depth * MS_BPF_STACK_SIZE;
}

/* ---- the loop: core/vm_core.h, the reference interpreter's own ------------ */

#define MS_VMC_FN MSD_FN
#define MS_VMC_VM struct msd_vm
#define MS_VMC_MEM(vm, addr, size, w) msd_mem((vm), (addr), (size), (w))
#define MS_VMC_LOAD(p, size) ms_at_load((p), (size))
#define MS_VMC_STORE(p, size, v) ms_at_store((p), (size), (v))
#define MS_VMC_ATOMIC(p, size, imm, s, r0) msd_atomic_rmw((p), (size), (imm), (s), (r0))
#define MS_VMC_LDDW(vm, in) msd_do_lddw((vm), (in))
#define MS_VMC_HELPER(vm, id) msd_do_helper((vm), (id))
#define MS_VMC_FRAME_TOP(vm, d) msd_frame_top((vm), (d))
#define MS_VMC_ZERO(p, n) ms_at_bytes_zero((p), (n))
#define MS_VMC_STOP(vm, err, ...) (err) /* no strings on the device: the code and vm->pc say it */
#include "core/vm_core.h"

/* Runs in->insns to its exit: 0 or interp.c's code for the same stop
 * (-EFAULT, -MS_E_LIMIT, -ENOENT, -EINVAL); res says where. The result of
 * ms_bpf_run on the same program and memory, without the message. */
MSD_BIG int msd_bpf_run(const struct msd_run *in, struct msd_result *res) {
  struct msd_vm vm;
  vm.in = in;
  vm.n_rec = 0;
  vm.depth = 0;
  vm.count = 0;
  vm.budget = in->budget ? in->budget : MS_BPF_DEFAULT_BUDGET;
  vm.pc = 0;
  vm.lost = 0;
  vm.helper = 0;
  for (int i = 0; i < MS_BPF_REG_COUNT; i++) vm.reg[i] = 0;
  ms_at_bytes_zero(msd_frame_top(&vm, 0) - MS_BPF_STACK_SIZE, MS_BPF_STACK_SIZE);
  vm.reg[1] = (uint64_t)(uintptr_t)(in->ctx ? in->ctx : in->mem);
  vm.reg[2] = in->ctx ? 0 : in->mem_size;
  vm.reg[10] = (uint64_t)(uintptr_t)msd_frame_top(&vm, 0);
  int err = ms_vmc_loop(&vm, in->insns, in->n_insns);
  res->err_insn = err ? (int64_t)vm.pc : -1;
  /* Records left reserved are discarded; leaving one is the program's fault. */
  uint32_t left = vm.n_rec;
  while (vm.n_rec) {
    vm.n_rec--;
    ms_mapc_ring_release(&in->maps[vm.rec_map[vm.n_rec]], vm.rec[vm.n_rec], 1);
  }
  if (left && !err) {
    err = -EINVAL;
    res->err_insn = (int64_t)vm.pc;
  }
  res->r0 = vm.reg[0];
  res->insns = vm.count;
  res->lost = vm.lost;
  res->helper = vm.helper;
  return err;
}

#endif
