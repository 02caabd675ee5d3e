/* SPDX-License-Identifier: MIT */
/* Private to src/bpf: the layouts behind the opaque handles of megascope/bpf.h
 * that more than one file of the folder needs — the program, the helper table,
 * the running program (struct ms_bpf_exec) and what the interpreter asks of a
 * map (its value region, direct value addresses, ring buffer records). */
#ifndef MS_BPF_INTERNAL_H
#define MS_BPF_INTERNAL_H

#include <stdint.h>

#include "megascope/bpf.h"

struct ms_bpf_prog {
  struct ms_bpf_insn *insns;
  size_t n;
  char *name;
  char *section;
  struct ms_bpf_map_def *maps;
  size_t n_maps;
};

struct ms_bpf_helper_slot {
  struct ms_bpf_helper_proto proto;
  ms_bpf_helper_fn fn;
};

struct ms_bpf_helpers {
  struct ms_bpf_helper_slot linux_ids[MS_BPF_HELPER_LINUX_MAX];
  struct ms_bpf_helper_slot own_ids[MS_BPF_HELPER_OWN_MAX];
};

/* The slot of id, or NULL when id is outside both ranges. */
static inline const struct ms_bpf_helper_slot *ms_bpf_helpers_slot(const struct ms_bpf_helpers *h,
                                                                   uint32_t id) {
  if (id < MS_BPF_HELPER_LINUX_MAX) return &h->linux_ids[id];
  if (id - MS_BPF_HELPER_OWN_BASE < MS_BPF_HELPER_OWN_MAX)
    return &h->own_ids[id - MS_BPF_HELPER_OWN_BASE];
  return NULL;
}

/* A memory region a run allows. */
struct ms_bpf_region {
  uintptr_t base;
  uint64_t len;
  int writable;
};

/* Ring buffer records a run reserved and has not yet released: at exit any left
 * are discarded so that a faulty program cannot wedge the consumer. */
#define MS_BPF_EXEC_MAX_RECORDS 32
struct ms_bpf_exec_record {
  struct ms_bpf_map *map;
  void *rec;
};

struct ms_bpf_exec {
  const struct ms_bpf_prog *prog;
  const struct ms_bpf_run_opts *opts;
  const struct ms_bpf_env *env;
  struct ms_bpf_region regions[3 + MS_BPF_MAX_MAPS];
  size_t n_regions;
  struct ms_bpf_exec_record records[MS_BPF_EXEC_MAX_RECORDS];
  size_t n_records;
  int abort_err; /* set by ms_bpf_exec_abort: the run stops after the helper */
  char abort_msg[192];
};

/* A run's exec state over opts (kept by the caller for the run's life): its
 * regions (stack, context, mem, bound maps' values) and no records. Shared by
 * the interpreter and the JIT so that helpers see the same run under both.
 * map_regions: the bound maps' regions computed once by the JIT (its maps are
 * fixed at compile time; its programs are verified, so the entry frame is not
 * zeroed), or NULL: computed from o->maps, and the entry frame at the top of
 * stack zeroed (the interpreter). */
void ms_bpf_exec_setup(struct ms_bpf_exec *x, const struct ms_bpf_prog *prog,
                       const struct ms_bpf_run_opts *o, uint8_t *stack, size_t stack_size,
                       const struct ms_bpf_region *map_regions, size_t n_map_regions);
/* Discards the ring buffer records a run left reserved; returns how many. */
size_t ms_bpf_exec_release(struct ms_bpf_exec *x);

/* The atomic read-modify-write of STX|ATOMIC imm on the 4- or 8-byte word at
 * p (seq_cst): returns the old value (32-bit forms zero-extended); cmpxchg
 * compares with *r0 and leaves the old value there. (interp.c, for the
 * interpreter and the JIT) */
uint64_t ms_bpf_atomic_rmw(void *p, int is64, int32_t imm, uint64_t src, uint64_t *r0);

/* Ring buffer records of a run (interp.c). */
int ms_bpf_exec_record_add(struct ms_bpf_exec *x, struct ms_bpf_map *map, void *rec);
/* Removes rec from the run's records and returns its map, or NULL if rec is
 * not a record this run holds. */
struct ms_bpf_map *ms_bpf_exec_record_take(struct ms_bpf_exec *x, void *rec);

/* Mnemonic stems by operation (op >> 4), shared by the assembler and the
 * disassembler (disasm.c): "add".."arsh", "end"; "ja".."jsle". */
extern const char *const ms_bpf_alu_names[16];
extern const char *const ms_bpf_jmp_names[16];

/* Assembles one line with no labels (disasm.c checks its output with it). */
int ms_bpf_asm_line(const char *line, struct ms_bpf_insn out[2], size_t *n_out);

/* Checks an object's .BTF section before libbpf reads it (btf_check.c). */
int ms_bpf_btf_check(const uint8_t *data, size_t size, struct ms_textbuf *log);

/* What the interpreter asks of a map (maps.c). */
/* The bytes a program may touch through pointers the map hands out. */
void ms_bpf_map_region(const struct ms_bpf_map *m, struct ms_bpf_region *r);
/* Where an array map's values live, for code that indexes them itself (the
 * JIT inlines lookups): element k of worker w is at values + (w * n_slots + k)
 * * stride. 0 for ARRAY and PERCPU_ARRAY maps (per_worker says which), -1 for
 * other types. */
struct ms_bpf_array_layout {
  uint8_t *values;
  uint32_t max_entries, n_slots, n_workers, stride;
  int per_worker;
};
int ms_bpf_map_array_layout(const struct ms_bpf_map *m, struct ms_bpf_array_layout *out);
/* Whether fn is the standard map_lookup_elem (helper 1) of ms_bpf_helpers_add_std:
 * only then may a lookup be inlined, since a table may carry another. */
int ms_bpf_helper_is_std_lookup(ms_bpf_helper_fn fn);

/* Address of byte off of element 0 (array maps, the lddw MAP_VALUE form). */
void *ms_bpf_map_direct_value(struct ms_bpf_map *m, uint32_t off);

#endif
