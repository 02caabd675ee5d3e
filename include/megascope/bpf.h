/* SPDX-License-Identifier: MIT */
/* megascope eBPF: instructions, programs, the reference interpreter, helpers,
 * maps in shared memory, the assembler/disassembler and the ELF loader.
 *
 * The bytecode is RFC 9669 eBPF. A program (struct ms_bpf_prog) is a checked,
 * immutable copy of instructions plus the definitions of the maps it names;
 * it comes from the ELF loader (clang -target bpf objects), from the assembler
 * (the uBPF-style text of the conformance suite) or from raw instructions.
 * The interpreter is the reference execution: it bounds-checks every memory
 * access at run time against the regions a run allows (context, stack, the
 * mem buffer, values of bound maps), so even an unverified program cannot
 * crash the process. Helpers are called by id through a table the caller
 * builds; ids keep Linux's numbers and meaning, and megascope's own helpers
 * live from MS_BPF_HELPER_OWN_BASE up. Maps live in memfd shared memory with a
 * self-describing header, so another process can map them read-only.
 *
 * Errors: int functions return 0 or a negative errno / -MS_E_*; constructors
 * return NULL and set errno. Messages that point (instruction index, section,
 * line) go to the caller's struct ms_textbuf. */
#ifndef MEGASCOPE_BPF_H
#define MEGASCOPE_BPF_H

#include <stddef.h>
#include <stdint.h>

#include "megascope/base.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------------
 * Instructions (RFC 9669). Same layout as Linux's struct bpf_insn. */
struct ms_bpf_insn {
  uint8_t code;        /* opcode */
  uint8_t dst_reg : 4; /* destination register */
  uint8_t src_reg : 4; /* source register */
  int16_t off;         /* signed offset */
  int32_t imm;         /* signed immediate */
};

#define MS_BPF_CLASS(code) ((code) & 0x07)
#define MS_BPF_SIZE(code) ((code) & 0x18)
#define MS_BPF_MODE(code) ((code) & 0xe0)
#define MS_BPF_OP(code) ((code) & 0xf0)
#define MS_BPF_SRC(code) ((code) & 0x08)

/* classes */
#define MS_BPF_LD 0x00
#define MS_BPF_LDX 0x01
#define MS_BPF_ST 0x02
#define MS_BPF_STX 0x03
#define MS_BPF_ALU 0x04
#define MS_BPF_JMP 0x05
#define MS_BPF_JMP32 0x06
#define MS_BPF_ALU64 0x07
/* load/store sizes and modes */
#define MS_BPF_W 0x00
#define MS_BPF_H 0x08
#define MS_BPF_B 0x10
#define MS_BPF_DW 0x18
#define MS_BPF_IMM 0x00
#define MS_BPF_ABS 0x20
#define MS_BPF_IND 0x40
#define MS_BPF_MEM 0x60
#define MS_BPF_MEMSX 0x80
#define MS_BPF_ATOMIC 0xc0
/* operand source */
#define MS_BPF_K 0x00
#define MS_BPF_X 0x08
/* ALU operations (SDIV/SMOD: DIV/MOD with off 1; MOVSX: MOV X with off 8/16/32) */
#define MS_BPF_ADD 0x00
#define MS_BPF_SUB 0x10
#define MS_BPF_MUL 0x20
#define MS_BPF_DIV 0x30
#define MS_BPF_OR 0x40
#define MS_BPF_AND 0x50
#define MS_BPF_LSH 0x60
#define MS_BPF_RSH 0x70
#define MS_BPF_NEG 0x80
#define MS_BPF_MOD 0x90
#define MS_BPF_XOR 0xa0
#define MS_BPF_MOV 0xb0
#define MS_BPF_ARSH 0xc0
#define MS_BPF_END 0xd0
#define MS_BPF_TO_LE 0x00 /* END source bit; in ALU64 class: unconditional bswap */
#define MS_BPF_TO_BE 0x08
/* jumps */
#define MS_BPF_JA 0x00
#define MS_BPF_JEQ 0x10
#define MS_BPF_JGT 0x20
#define MS_BPF_JGE 0x30
#define MS_BPF_JSET 0x40
#define MS_BPF_JNE 0x50
#define MS_BPF_JSGT 0x60
#define MS_BPF_JSGE 0x70
#define MS_BPF_CALL 0x80
#define MS_BPF_EXIT 0x90
#define MS_BPF_JLT 0xa0
#define MS_BPF_JLE 0xb0
#define MS_BPF_JSLT 0xc0
#define MS_BPF_JSLE 0xd0
/* atomic operations (imm of STX|ATOMIC): ADD/OR/AND/XOR, optionally |FETCH */
#define MS_BPF_FETCH 0x01
#define MS_BPF_XCHG 0xe1
#define MS_BPF_CMPXCHG 0xf1
/* lddw (LD|IMM|DW) src_reg kinds. The loader writes MAP_FD / MAP_VALUE with
 * imm = the object's map index (megascope has no fds: "fd" is that index);
 * MAP_IDX / MAP_IDX_VALUE mean the same here. next imm = offset into value. */
#define MS_BPF_PSEUDO_MAP_FD 1
#define MS_BPF_PSEUDO_MAP_VALUE 2
#define MS_BPF_PSEUDO_MAP_IDX 5
#define MS_BPF_PSEUDO_MAP_IDX_VALUE 6
/* call src_reg kinds: 0 helper by id, 1 local (bpf-to-bpf, imm = pc-relative) */
#define MS_BPF_PSEUDO_CALL 1

#define MS_BPF_REG_COUNT 11          /* r0..r10, r10 the read-only frame pointer */
#define MS_BPF_STACK_SIZE 512        /* bytes per call frame */
#define MS_BPF_MAX_CALL_DEPTH 8      /* frames, the entry program's included */
#define MS_BPF_MAX_INSNS 65536       /* longest program accepted */
#define MS_BPF_MAX_MAPS 64           /* maps one program may name */
#define MS_BPF_DEFAULT_BUDGET 1000000 /* instructions one run may execute */

/* Checks the encoding of insns[0..n): known opcodes, registers r0..r10, no
 * write to r10, reserved fields zero, jump and call targets inside the program
 * and not into the second half of an lddw, lddw complete, map indices below
 * n_maps. This is the syntactic check every program gets before it exists;
 * the verifier proves the rest. The first problem is logged as "insn N: ...". */
int ms_bpf_insns_check(const struct ms_bpf_insn *insns, size_t n, size_t n_maps,
                       struct ms_textbuf *log);

/* ---------------------------------------------------------------------------
 * Maps: types keep Linux's BPF_MAP_TYPE_* numbers. */
enum ms_bpf_map_type {
  MS_BPF_MAP_HASH = 1,
  MS_BPF_MAP_ARRAY = 2,
  MS_BPF_MAP_PERCPU_HASH = 5,   /* per-worker hash: one value slot per worker */
  MS_BPF_MAP_PERCPU_ARRAY = 6,  /* per-worker array */
  MS_BPF_MAP_RINGBUF = 27,      /* max_entries = data bytes, a power of two >= 4096 */
};

/* map_update flags, Linux's values */
#define MS_BPF_ANY 0
#define MS_BPF_NOEXIST 1
#define MS_BPF_EXIST 2
/* ring buffer flags, Linux's values: a submit wakes a reader asleep on the
 * ring's eventfd at once (FORCE) or never (NO); without either, once the ring
 * is half full (ms_bpf_map_wake_fd) */
#define MS_BPF_RB_NO_WAKEUP 1
#define MS_BPF_RB_FORCE_WAKEUP 2
/* ms_bpf_map_def.flags */
#define MS_BPF_MAP_F_RDONLY_PROG 0x80 /* Linux's BPF_F_RDONLY_PROG: .rodata */

/* What a map is, as an object file declares it. Plain data. */
struct ms_bpf_map_def {
  char name[64];
  uint32_t type; /* enum ms_bpf_map_type */
  uint32_t key_size;
  uint32_t value_size;
  uint32_t max_entries;
  uint32_t flags;
};

struct ms_bpf_map;

/* A map whose storage is one memfd (ms_bpf_map_fd). n_workers >= 1 sets the
 * per-worker slots; other types ignore it but record it. */
struct ms_bpf_map *ms_bpf_map_new(const struct ms_bpf_map_def *def, uint32_t n_workers,
                                  struct ms_textbuf *log);
void ms_bpf_map_free(struct ms_bpf_map *m);
const struct ms_bpf_map_def *ms_bpf_map_info(const struct ms_bpf_map *m);
uint32_t ms_bpf_map_workers(const struct ms_bpf_map *m);
int ms_bpf_map_fd(const struct ms_bpf_map *m);
/* Bytes of the map's memfd (its shared memory), header included. */
uint64_t ms_bpf_map_bytes(const struct ms_bpf_map *m);
/* A copy of the map's shared memory (ms_bpf_map_bytes bytes, header
 * included) into dst, 8-byte words moved whole so no counter is torn: what
 * another process needs to hold the same map (a follower rank's maps carried
 * to rank 0). -EMSGSIZE when n is too small. */
int ms_bpf_map_snapshot(const struct ms_bpf_map *m, void *dst, size_t n);
/* Writes such a copy into m, whose layout must be the copy's (the same
 * definition and worker count): -MS_E_FORMAT otherwise. Readers of m's memfd
 * see the new values word by word, as they see a running engine's writes. */
int ms_bpf_map_restore(struct ms_bpf_map *m, const void *src, size_t n);

/* The value of key for worker (per-worker maps; others ignore worker), or NULL.
 * Array keys are uint32_t indices. Safe against concurrent updates. */
void *ms_bpf_map_lookup(struct ms_bpf_map *m, const void *key, uint32_t worker);
/* flags MS_BPF_ANY/NOEXIST/EXIST. Per-worker maps write only worker's slot (a
 * new key starts with the other slots zero). -EEXIST, -ENOENT, -E2BIG (full or
 * index out of range), -EINVAL (flags, type, worker). */
int ms_bpf_map_update(struct ms_bpf_map *m, const void *key, const void *value,
                      uint64_t flags, uint32_t worker);
/* Hash maps only (-EINVAL for arrays, as Linux); -ENOENT when absent. */
int ms_bpf_map_delete(struct ms_bpf_map *m, const void *key);
/* Live entries (hash), max_entries (array), 0 (ring buffer). */
uint32_t ms_bpf_map_count(const struct ms_bpf_map *m);
/* Zeroes every value and empties a hash. Not safe while others use the map. */
void ms_bpf_map_clear(struct ms_bpf_map *m);

/* Visits every live entry: key (array: the uint32_t index) and the values of
 * all workers, copied contiguously (n_workers * value_size bytes, worker-major)
 * with 8-byte words read untorn. Stops when fn returns non-zero (that value is
 * returned). */
typedef int (*ms_bpf_map_entry_fn)(void *user, const void *key, const void *values);
int ms_bpf_map_foreach(const struct ms_bpf_map *m, ms_bpf_map_entry_fn fn, void *user);

/* Ring buffer (Linux semantics: records of 8-byte header + data rounded to 8;
 * a consumer stops at the first record not yet submitted). */
void *ms_bpf_ringbuf_reserve(struct ms_bpf_map *m, uint64_t size);
void ms_bpf_ringbuf_submit(struct ms_bpf_map *m, void *rec);
void ms_bpf_ringbuf_discard(struct ms_bpf_map *m, void *rec);
int ms_bpf_ringbuf_output(struct ms_bpf_map *m, const void *data, uint64_t size); /* -EAGAIN when full */
/* The same with MS_BPF_RB_NO_WAKEUP / MS_BPF_RB_FORCE_WAKEUP (the helpers' flags). */
void ms_bpf_ringbuf_submit_flags(struct ms_bpf_map *m, void *rec, uint64_t flags);
int ms_bpf_ringbuf_output_flags(struct ms_bpf_map *m, const void *data, uint64_t size, uint64_t flags);
/* Records dropped because the buffer was full (the "lost" coverage figure). */
uint64_t ms_bpf_ringbuf_lost(const struct ms_bpf_map *m);
/* A ring buffer's wake-up eventfd (-1 for other types, or when none could be
 * made): a submit that leaves the ring at least half full while its reader is
 * asleep (ms_bpf_map_reader_arm) adds 1 to it, once a sleep, so a reader in
 * another process can wait in poll() instead of polling the positions. Hand
 * it over with the memfd. */
int ms_bpf_map_wake_fd(const struct ms_bpf_map *m);
/* Consumes submitted records in order; fn(user, data, size). Returns the number
 * consumed, or fn's negative return. One consumer at a time. */
typedef int (*ms_bpf_ringbuf_fn)(void *user, const void *data, uint32_t size);
int ms_bpf_ringbuf_consume(struct ms_bpf_map *m, ms_bpf_ringbuf_fn fn, void *user);

/* The shared-memory header at offset 0 of every map's memfd: an ABI for
 * readers in other processes. Fields are only appended (header_size says how
 * many); counters are updated with atomics and read with atomic loads.
 * Hash layout: u32 state[n_slots] at state_off, keys (key_stride each) at
 * key_off, values [n_workers][n_slots] (value_stride each) at value_off; a key
 * is probed linearly from h & (n_slots - 1), h = FNV-1a 64 of its bytes then
 * h ^= h >> 33; h *= 0xff51afd7ed558ccd; h ^= h >> 33 (stop at an EMPTY slot).
 * Arrays: values [n_workers][max_entries] at value_off. Ring buffer: consumer
 * position (u64) at ring_cons_off, producer position (u64) at ring_prod_off,
 * ring_size data bytes at ring_data_off (map that twice, back to back, to read
 * records that wrap). */
#define MS_BPF_MAP_SHM_MAGIC 0x50414d465042534dull /* "MSBPFMAP" in little-endian bytes */
#define MS_BPF_MAP_SHM_VERSION 1
struct ms_bpf_map_shm {
  uint64_t magic;
  uint32_t version;
  uint32_t header_size;
  uint32_t type, key_size, value_size, max_entries, n_workers, flags;
  uint32_t key_stride, value_stride; /* sizes rounded up to 8 */
  uint32_t n_slots;                  /* hash buckets (a power of two) or array entries */
  uint32_t reserved0;
  uint64_t total_size;               /* bytes of the memfd */
  uint64_t state_off, key_off, value_off;
  uint64_t ring_cons_off, ring_prod_off, ring_data_off, ring_size;
  uint64_t count;                    /* hash: live entries (atomic) */
  uint64_t lost;                     /* ring buffer: records dropped when full (atomic) */
  char name[64];
};
/* Hash bucket states (u32 at state_off): a bucket leaves EMPTY once and keeps
 * its key for the map's life; only LIVE buckets hold an entry. */
#define MS_BPF_SLOT_EMPTY 0
#define MS_BPF_SLOT_CLAIMING 1 /* key being written */
#define MS_BPF_SLOT_KEYED 2    /* key valid, no entry (deleted) */
#define MS_BPF_SLOT_WRITING 3  /* key valid, value being written before LIVE */
#define MS_BPF_SLOT_LIVE 4
/* Ring buffer record header: u32 len (with these bits) then u32 offset. */
#define MS_BPF_RINGBUF_BUSY_BIT (1u << 31)
#define MS_BPF_RINGBUF_DISCARD_BIT (1u << 30)
#define MS_BPF_RINGBUF_HDR_SIZE 8
/* In a ring buffer's consumer page (ring_cons_off; the reader's writable
 * page), a u32 the reader sets to 1 before it sleeps: a producer whose submit
 * leaves the ring at least half full swaps it back to 0 and signals the map's
 * wake-up eventfd (ms_bpf_map_wake_fd). Linux's ring buffer wakes its epoll
 * reader the same way; a half-full threshold keeps the syscall off all but
 * one record in many. */
#define MS_BPF_RINGBUF_WAKE_OFF 64

/* A map seen from another process through its fd, mapped PROT_READ. With
 * MS_BPF_READER_CONSUME a ring buffer's consumer position is mapped writable
 * (the fd must be open for writing) so ms_bpf_map_reader_consume can advance. */
#define MS_BPF_READER_CONSUME 1u
struct ms_bpf_map_reader;
struct ms_bpf_map_reader *ms_bpf_map_reader_new(int fd, unsigned flags, struct ms_textbuf *log);
void ms_bpf_map_reader_free(struct ms_bpf_map_reader *r);
const struct ms_bpf_map_shm *ms_bpf_map_reader_header(const struct ms_bpf_map_reader *r);
int ms_bpf_map_reader_foreach(const struct ms_bpf_map_reader *r, ms_bpf_map_entry_fn fn, void *user);
/* Copies the values of key (n_workers * value_size bytes) into out; -ENOENT. */
int ms_bpf_map_reader_lookup(const struct ms_bpf_map_reader *r, const void *key, void *out);
int ms_bpf_map_reader_consume(struct ms_bpf_map_reader *r, ms_bpf_ringbuf_fn fn, void *user);
/* Before a consumer sleeps on the ring's wake-up eventfd: marks it asleep
 * (MS_BPF_RINGBUF_WAKE_OFF) and returns 1 (and unmarks it) when the ring is
 * already at least half full, so the caller drains instead of sleeping; 0:
 * sleep, a producer will wake it. After it wakes, ms_bpf_map_reader_disarm.
 * -EPERM without MS_BPF_READER_CONSUME. */
int ms_bpf_map_reader_arm(struct ms_bpf_map_reader *r);
void ms_bpf_map_reader_disarm(struct ms_bpf_map_reader *r);

/* ---------------------------------------------------------------------------
 * Helpers. A helper is called with r1..r5 and the running program (for its
 * environment and to check pointers) and returns r0. */
#define MS_BPF_HELPER_LINUX_MAX 256        /* ids 0..255: Linux's numbering */
#define MS_BPF_HELPER_OWN_BASE 0x10000u   /* megascope's own helpers */
#define MS_BPF_HELPER_OWN_MAX 256          /* ids OWN_BASE .. OWN_BASE+255 */

enum ms_bpf_helper_id {
  MS_BPF_FN_MAP_LOOKUP_ELEM = 1,
  MS_BPF_FN_MAP_UPDATE_ELEM = 2,
  MS_BPF_FN_MAP_DELETE_ELEM = 3,
  MS_BPF_FN_KTIME_GET_NS = 5,
  MS_BPF_FN_GET_SMP_PROCESSOR_ID = 8, /* the worker index */
  MS_BPF_FN_RINGBUF_OUTPUT = 130,
  MS_BPF_FN_RINGBUF_RESERVE = 131,
  MS_BPF_FN_RINGBUF_SUBMIT = 132,
  MS_BPF_FN_RINGBUF_DISCARD = 133,
};

/* Argument kinds, for the verifier. */
enum ms_bpf_arg_kind {
  MS_BPF_ARG_NONE = 0,        /* unused argument */
  MS_BPF_ARG_ANYTHING = 1,    /* any initialised scalar */
  MS_BPF_ARG_MAP = 2,         /* map pointer (lddw MAP_FD); map_types filters */
  MS_BPF_ARG_MAP_KEY = 3,     /* pointer to key_size readable bytes (stack or map value) */
  MS_BPF_ARG_MAP_VALUE = 4,   /* pointer to value_size readable bytes */
  MS_BPF_ARG_MEM = 5,         /* pointer to readable bytes, count in the next argument */
  MS_BPF_ARG_SIZE = 6,        /* size of the previous MEM argument, > 0 */
  MS_BPF_ARG_CONST_SIZE = 7,  /* a size known at verification time, > 0 */
  MS_BPF_ARG_FLAGS = 8,       /* a constant */
  MS_BPF_ARG_RINGBUF_REC = 9, /* a record returned by ringbuf_reserve, not yet released */
  MS_BPF_ARG_KIND_COUNT
};
enum ms_bpf_ret_kind {
  MS_BPF_RET_INTEGER = 0,
  MS_BPF_RET_VOID = 1,
  MS_BPF_RET_MAP_VALUE_OR_NULL = 2,  /* value_size bytes of the MAP argument's map */
  MS_BPF_RET_RINGBUF_REC_OR_NULL = 3, /* CONST_SIZE bytes, must be submitted or discarded */
  MS_BPF_RET_KIND_COUNT
};
struct ms_bpf_helper_proto {
  uint32_t id;
  const char *name;
  enum ms_bpf_ret_kind ret;
  enum ms_bpf_arg_kind args[5];
  uint32_t map_types; /* for MS_BPF_ARG_MAP: bit (1u << type) per accepted type */
};
/* The prototype of a standard helper (ids of enum ms_bpf_helper_id), or NULL. */
const struct ms_bpf_helper_proto *ms_bpf_helper_proto_std(uint32_t id);

struct ms_bpf_exec; /* a running program, as a helper sees it */
typedef uint64_t (*ms_bpf_helper_fn)(struct ms_bpf_exec *x, uint64_t a1, uint64_t a2,
                                     uint64_t a3, uint64_t a4, uint64_t a5);

struct ms_bpf_helpers;
struct ms_bpf_helpers *ms_bpf_helpers_new(void);
void ms_bpf_helpers_free(struct ms_bpf_helpers *h);
/* Registers (or replaces) proto->id; ids 0..255 or OWN_BASE..OWN_BASE+255.
 * The proto is copied (its name must outlive the table). */
int ms_bpf_helpers_set(struct ms_bpf_helpers *h, const struct ms_bpf_helper_proto *proto,
                       ms_bpf_helper_fn fn);
/* Registers the standard helpers of enum ms_bpf_helper_id. */
int ms_bpf_helpers_add_std(struct ms_bpf_helpers *h);
const struct ms_bpf_helper_proto *ms_bpf_helpers_proto(const struct ms_bpf_helpers *h, uint32_t id);
ms_bpf_helper_fn ms_bpf_helpers_fn(const struct ms_bpf_helpers *h, uint32_t id);

/* What a run knows of its surroundings. Plain data, given by the caller. */
struct ms_bpf_env {
  uint32_t worker;                /* helper 8, and the slot of per-worker maps */
  uint64_t (*clock)(void *user);  /* helper 5; NULL: ms_now_ns (the engine clock) */
  void *clock_user;
  void *user;                     /* for the engine's own helpers */
};

/* For helpers: the host address of [addr, addr+size) if it lies inside one
 * region the run allows (and that region is writable when write), else NULL. */
void *ms_bpf_exec_mem(struct ms_bpf_exec *x, uint64_t addr, uint64_t size, int write);
/* The map a register value (from lddw MAP_FD) names, or NULL. */
struct ms_bpf_map *ms_bpf_exec_map(struct ms_bpf_exec *x, uint64_t handle);
const struct ms_bpf_env *ms_bpf_exec_env(const struct ms_bpf_exec *x);
/* Stops the program when the helper returns; the run fails with err and msg. */
void ms_bpf_exec_abort(struct ms_bpf_exec *x, int err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* ---------------------------------------------------------------------------
 * Programs. */
struct ms_bpf_prog_opts {
  size_t sz;                          /* sizeof(struct ms_bpf_prog_opts) */
  const char *name;                   /* NULL: "prog" */
  const char *section;                /* ELF section (e.g. megascope/observe/task_end) */
  const struct ms_bpf_map_def *maps;  /* the maps lddw imm indexes, copied */
  size_t n_maps;
  struct ms_textbuf *log;             /* why the instructions were refused */
};
struct ms_bpf_prog;
/* Copies and checks (ms_bpf_insns_check) the instructions. NULL + errno. */
struct ms_bpf_prog *ms_bpf_prog_new(const struct ms_bpf_insn *insns, size_t n,
                                    const struct ms_bpf_prog_opts *opts);
void ms_bpf_prog_free(struct ms_bpf_prog *p);
const struct ms_bpf_insn *ms_bpf_prog_insns(const struct ms_bpf_prog *p, size_t *n);
const char *ms_bpf_prog_name(const struct ms_bpf_prog *p);
const char *ms_bpf_prog_section(const struct ms_bpf_prog *p); /* "" when none */
size_t ms_bpf_prog_map_count(const struct ms_bpf_prog *p);
const struct ms_bpf_map_def *ms_bpf_prog_map(const struct ms_bpf_prog *p, size_t idx);

/* ---------------------------------------------------------------------------
 * The interpreter. */
struct ms_bpf_run_opts {
  size_t sz;                          /* sizeof(struct ms_bpf_run_opts) */
  const struct ms_bpf_helpers *helpers; /* NULL: every call fails */
  struct ms_bpf_map *const *maps;     /* maps[i] bound to the program's map index i */
  size_t n_maps;
  const void *ctx;                    /* read-only region; r1 = ctx when set */
  size_t ctx_size;
  void *mem;                          /* read-write region; without ctx r1 = mem, r2 = mem_size */
  size_t mem_size;
  uint64_t insn_budget;               /* 0: MS_BPF_DEFAULT_BUDGET */
  const struct ms_bpf_env *env;       /* NULL: worker 0, the engine clock */
  struct ms_textbuf *log;             /* why a run stopped: "insn N: ..." */
};
struct ms_bpf_run_result {
  uint64_t r0;
  uint64_t insns;   /* instructions executed (lddw counts once) */
  int64_t err_insn; /* index of the instruction that stopped the run, -1 if none */
};
/* Runs prog to its exit. 0, or: -EFAULT a memory access outside the allowed
 * regions, -MS_E_LIMIT budget or call depth exceeded, -ENOENT unknown helper,
 * -EINVAL a bad map binding or a helper's refusal; res->err_insn names where. */
int ms_bpf_run(const struct ms_bpf_prog *prog, const struct ms_bpf_run_opts *opts,
               struct ms_bpf_run_result *res);

/* ---------------------------------------------------------------------------
 * Text forms. */
/* Assembles the uBPF-style text of the conformance suite (`mov %r0, 1`,
 * `ldxb %r0, [%r1+2]`, `jeq %r1, 0, +3` or a label, `lddw`, `call 5`,
 * `call local f`, `lock fetch add32 [%r10-4], %r1`, `.insn 0x<16 hex>` ...).
 * `#` starts a comment. *out is malloc'ed (free it). Errors name the line. */
int ms_bpf_asm(const char *text, struct ms_bpf_insn **out, size_t *n_out, struct ms_textbuf *log);
/* One instruction in that syntax (jumps as +N/-N); returns the slots used
 * (1, or 2 for lddw) or a negative errno. Instructions the syntax cannot
 * express print as `.insn 0x...` so that text assembles back to the same words. */
int ms_bpf_insn_asm(const struct ms_bpf_insn *insns, size_t n, size_t idx, char *buf, size_t size);
/* One instruction the way the Linux verifier log prints it, e.g.
 * `r3 = *(u64 *)(r1 +40)`, `if r1 > 0x5 goto pc+3`, `call 1`. Returns slots. */
int ms_bpf_insn_linux(const struct ms_bpf_insn *insns, size_t n, size_t idx, char *buf, size_t size);

/* ---------------------------------------------------------------------------
 * Conformance test files (`.data`: -- asm / -- raw / -- mem / -- result / -- error). */
enum ms_bpf_test_status {
  MS_BPF_TEST_PASS = 0,
  MS_BPF_TEST_FAIL = 1,
  MS_BPF_TEST_SKIP = 2,
  MS_BPF_TEST_STATUS_COUNT
};
struct ms_bpf_testfile;
struct ms_bpf_testfile *ms_bpf_testfile_parse(const char *text, size_t len, struct ms_textbuf *log);
void ms_bpf_testfile_free(struct ms_bpf_testfile *t);
const char *ms_bpf_testfile_asm(const struct ms_bpf_testfile *t); /* NULL when absent */
struct ms_bpf_test_report {
  enum ms_bpf_test_status status;
  const char *group;     /* SKIP: the non-standard group ("callx") */
  int expect_error;      /* the file has -- error */
  uint64_t expected, r0; /* -- result, and what the run returned */
  uint64_t insns;        /* instructions executed */
  char why[256];         /* FAIL: the reason; error tests: the error seen */
};
/* Assembles (or takes -- raw, checking -- asm agrees), runs with r1 = a copy
 * of -- mem, r2 its length and helper 5 returning its first argument, and
 * compares r0. Programs with call-by-register are skipped as group "callx". */
int ms_bpf_testfile_check(const struct ms_bpf_testfile *t, struct ms_bpf_test_report *rep);
/* How a test runs: the reference interpreter, or the x86-64 JIT
 * (megascope/bpf_jit.h). The JIT runs only what the verifier proves safe, so
 * in that mode a program the verifier rejects is skipped as group
 * "unverified" (the interpreter mode still runs it); a host without a JIT
 * skips every test as group "nojit". */
enum ms_bpf_exec_mode { MS_BPF_EXEC_INTERP = 0, MS_BPF_EXEC_JIT = 1, MS_BPF_EXEC_MODE_COUNT };
int ms_bpf_testfile_check_mode(const struct ms_bpf_testfile *t, int mode, struct ms_bpf_test_report *rep);

/* ---------------------------------------------------------------------------
 * ELF objects from `clang -O2 -g -target bpf -c x.bpf.c` with libbpf's
 * bpf_helpers.h and BTF-defined maps. Nothing is loaded into a kernel. Map
 * references are rewritten to lddw MAP_FD / MAP_VALUE with imm = map index;
 * bpf-to-bpf calls are linked (subprograms appended, call offsets fixed). */
struct ms_bpf_object;
struct ms_bpf_object *ms_bpf_object_open_mem(const void *buf, size_t size, const char *name,
                                             struct ms_textbuf *log);
struct ms_bpf_object *ms_bpf_object_open_file(const char *path, struct ms_textbuf *log);
void ms_bpf_object_free(struct ms_bpf_object *o);
const char *ms_bpf_object_license(const struct ms_bpf_object *o); /* "" when none */
size_t ms_bpf_object_map_count(const struct ms_bpf_object *o);
const struct ms_bpf_map_def *ms_bpf_object_map(const struct ms_bpf_object *o, size_t idx);
/* Initial bytes of a global-data map (.rodata, .data), NULL for others. */
const void *ms_bpf_object_map_init(const struct ms_bpf_object *o, size_t idx, size_t *size);
size_t ms_bpf_object_prog_count(const struct ms_bpf_object *o);
const struct ms_bpf_prog *ms_bpf_object_prog(const struct ms_bpf_object *o, size_t idx);
/* The first program whose section name equals section, or NULL. */
const struct ms_bpf_prog *ms_bpf_object_find_prog(const struct ms_bpf_object *o, const char *section);
/* The bytes of a section by name (e.g. ".rodata", "megascope_abi"), or NULL. */
const void *ms_bpf_object_section(const struct ms_bpf_object *o, const char *name, size_t *size);

/* ---------------------------------------------------------------------------
 * Program bundles: maps and programs as another compiler (megascope's query
 * language, src/query) hands them over, in a flat little-endian format that
 * ms_bpf_object_open_mem and _open_file recognise by its magic and read as they
 * read an ELF: every count and name checked, the ABI version kept as the
 * object's "megascope_abi" section. Nothing to relocate: lddw MAP_FD imm is
 * already the map index. */
#define MS_BPF_BUNDLE_MAGIC "MSBPFBN1"
/* Format 2 adds the digests of the schema the programs were compiled against
 * (its task class ids, its event class ids: ms_plan_schema_digest,
 * megascope/plan.h; 0: not relied on), read back as a "megascope_schema"
 * section of two little-endian u64 where either is set; format 1 is still read. */
#define MS_BPF_BUNDLE_FORMAT 2
struct ms_bpf_bundle_prog {
  const char *name;    /* 1-63 printable bytes */
  const char *section; /* megascope/<type>/<hook> */
  const struct ms_bpf_insn *insns;
  size_t n;
};
/* Writes the bundle into *out (malloc'ed; free it), its size in *len; schema: NULL, or the digests
 * of the schema its task class ids and event class ids come from (0: not relied on). */
int ms_bpf_bundle_write(const struct ms_bpf_map_def *maps, size_t n_maps, const struct ms_bpf_bundle_prog *progs,
                        size_t n_progs, uint32_t abi_version, const uint64_t *schema, void **out, size_t *len);

#ifdef __cplusplus
}
#endif
#endif
