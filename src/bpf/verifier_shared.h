/* SPDX-License-Identifier: MIT */
/* Shared by the verifier's files (src/bpf/verifier*.c), private to them: the
 * abstract values, the abstract state of one path, and the environment of one
 * verification.
 *
 *  - verifier_scalar.c: the scalar domain — tristate numbers (known bits)
 *    and unsigned/signed 64-bit bounds — with the ALU transfer functions and
 *    the refinement a conditional jump applies to each side.
 *  - verifier_state.c: states (frames, registers, stack bytes and spills,
 *    live ring buffer reservations), copying, inclusion for pruning, printing.
 *  - verifier_mem.c: loads, stores and atomics on each kind of memory, and
 *    helper calls checked against their prototypes.
 *  - verifier_env.c: the environment of one verification: the log (the
 *    verbose trace, rejections) and the current frame's registers.
 *  - verifier.c: the program's shape (functions, prune points, liveness),
 *    the exploration loop, ALU and jumps on typed registers, exits and the
 *    public entry points. */
#ifndef MS_BPF_VERIFIER_SHARED_H
#define MS_BPF_VERIFIER_SHARED_H

#include <stdint.h>

#include "bpf/bpf_internal.h"
#include "megascope/verifier.h"

/* ---- the scalar domain -------------------------------------------------- */

/* A tristate number: bit i is known to be v's bit i where m's bit i is 0,
 * unknown where it is 1 (v & m == 0). */
struct ms_bpf_tnum {
  uint64_t v, m;
};

/* A set of 64-bit values: within [umin, umax] unsigned, [smin, smax] signed,
 * and matching t. The empty set never escapes: operations that could make one
 * (refinements) report it instead. */
struct ms_bpf_scalar {
  uint64_t umin, umax;
  int64_t smin, smax;
  struct ms_bpf_tnum t;
};

/* A condition that is not an opcode: (a & b) == 0, the false side of JSET. */
#define MS_BPF_JNSET 0x100u

struct ms_bpf_scalar ms_bpf_sc_unknown(void);
struct ms_bpf_scalar ms_bpf_sc_const(uint64_t v);
struct ms_bpf_scalar ms_bpf_sc_urange(uint64_t lo, uint64_t hi);
int ms_bpf_sc_is_const(const struct ms_bpf_scalar *s);
/* Tightens bounds and known bits against each other; -1 when s is empty. */
int ms_bpf_sc_sync(struct ms_bpf_scalar *s);
/* The low `bytes` bytes, zero-extended (a load, a 32-bit result). */
struct ms_bpf_scalar ms_bpf_sc_cast(struct ms_bpf_scalar s, unsigned bytes);
/* The low `bits` bits sign-extended to 64 (movsx, ldxs). */
struct ms_bpf_scalar ms_bpf_sc_sext(struct ms_bpf_scalar s, unsigned bits);
/* dst = dst OP src for an ALU instruction on scalars (in: its code, off, imm;
 * src already holds the immediate for K forms, as the interpreter reads it). */
void ms_bpf_sc_alu(const struct ms_bpf_insn *in, struct ms_bpf_scalar *dst,
                   const struct ms_bpf_scalar *src);
/* Refines a and b under "a OP b" (OP a jump operation or MS_BPF_JNSET; is32:
 * the low 32 bits compared, as JMP32 does). -1 when the condition cannot hold. */
int ms_bpf_sc_refine(unsigned op, int is32, struct ms_bpf_scalar *a, struct ms_bpf_scalar *b);
/* The jump operation that holds when op does not. */
unsigned ms_bpf_sc_negate(unsigned op);
/* cur is a subset of old (pruning). */
int ms_bpf_sc_within(const struct ms_bpf_scalar *old, const struct ms_bpf_scalar *cur);
int ms_bpf_sc_equal(const struct ms_bpf_scalar *a, const struct ms_bpf_scalar *b);
/* "5", "scalar(0..63)", "scalar(u=0..4294967295,s=-1..5,var=0x0/0xff)". */
void ms_bpf_sc_print(const struct ms_bpf_scalar *s, char *buf, size_t size);

/* ---- registers and state ------------------------------------------------ */

enum ms_bpf_vtype {
  MS_VT_NOT_INIT = 0,
  MS_VT_SCALAR,
  MS_VT_CTX,               /* the hook context (read-only) */
  MS_VT_STACK,             /* a frame's stack; frame says which */
  MS_VT_MAP_PTR,           /* a map (lddw MAP_FD); map is its index */
  MS_VT_MAP_VALUE,         /* value_size bytes of map `map` */
  MS_VT_MAP_VALUE_OR_NULL, /* a lookup's result before its NULL check; id links copies */
  MS_VT_MEM,               /* the RAW_MEM buffer, size bytes */
  MS_VT_REC,               /* a ring buffer record of size bytes, reservation ref */
  MS_VT_REC_OR_NULL,       /* a reserve's result before its NULL check */
  MS_VT_RELEASED,          /* a record after submit/discard (size: the release insn) */
  MS_VT_COUNT
};

/* The id of pointers into a global-data map's value (lddw MAP_VALUE): one per
 * map, above the ids the verifier hands out. */
#define MS_VT_GLOBAL_ID 0x80000000u

struct ms_bpf_vreg {
  struct ms_bpf_scalar s; /* the value of a scalar; the variable offset of a pointer */
  uint8_t type;           /* enum ms_bpf_vtype */
  uint8_t frame;          /* STACK: the frame */
  uint16_t pad;
  int32_t off;            /* pointers: the fixed offset */
  uint32_t id;            /* scalar: copies of one value; MAP_VALUE*, REC*: one lookup or
                           * reservation (its NULL check, its base address) */
  uint32_t ref;           /* REC, REC_OR_NULL, RELEASED: the reservation */
  uint32_t map;           /* MAP_PTR, MAP_VALUE*: map index */
  uint32_t size;          /* MEM, REC*: bytes; RELEASED: where it was released */
};

#define MS_VT_SLOTS (MS_BPF_STACK_SIZE / 8)

/* Stack bytes, indexed by 512 + (offset from r10). */
enum ms_bpf_vstack {
  MS_VS_INVALID = 0, /* never written on this path */
  MS_VS_MISC = 1,    /* written, value unknown */
  MS_VS_SPILL = 2,   /* holds (part of) the slot's spilled register */
};

struct ms_bpf_vframe {
  struct ms_bpf_vreg regs[MS_BPF_REG_COUNT];
  int32_t callsite;   /* the call instruction that made this frame; -1: the entry */
  uint32_t lo;        /* lowest stack byte index ever written (512: none) */
  uint8_t st[MS_BPF_STACK_SIZE];
  uint8_t spill_at[MS_VT_SLOTS];  /* first byte (0..7) of the slot's spill */
  uint8_t spill_len[MS_VT_SLOTS]; /* its bytes; 0: no spill */
  struct ms_bpf_vreg spill[MS_VT_SLOTS];
};

#define MS_VT_MAX_REFS 64

struct ms_bpf_vref {
  uint32_t id;   /* the reservation */
  uint32_t insn; /* the reserve call */
};

struct ms_bpf_vstate {
  struct ms_bpf_vframe *frames[MS_BPF_MAX_CALL_DEPTH];
  uint32_t curframe;
  uint32_t n_refs;
  struct ms_bpf_vref refs[MS_VT_MAX_REFS];
  /* exploration */
  struct ms_bpf_vstate *parent; /* the nearest kept ancestor */
  struct ms_bpf_vstate *next;   /* kept: the next state at the same instruction */
  uint32_t branches;            /* kept: unfinished paths and kept children below it */
  uint64_t fingerprint;         /* kept: ms_bpf_vs_fingerprint at its instruction */
  uint32_t insn;                /* pending: where it resumes; kept: where it is kept */
  uint32_t from;                /* pending: the jump that made it */
  uint64_t depth;               /* instructions this path has executed since the entry */
  uint64_t since_kept;          /* ... since it last kept a state */
  uint64_t max_end;             /* kept: the longest path through it, in instructions from the
                                 * entry (final once branches is 0) */
  uint32_t hits, misses;        /* kept, finished: paths it pruned, comparisons that did not */
};

struct ms_bpf_vstate *ms_bpf_vs_new(void);
void ms_bpf_vs_free(struct ms_bpf_vstate *s);
/* Deep copy of src's frames and refs into dst (bookkeeping fields untouched). */
int ms_bpf_vs_copy(struct ms_bpf_vstate *dst, const struct ms_bpf_vstate *src);
/* A new frame for a call (regs NOT_INIT, stack INVALID). */
struct ms_bpf_vframe *ms_bpf_vs_frame_new(int32_t callsite);

/* The live registers (bit r) a frame's values matter for, frame by frame. */
struct ms_bpf_vlive {
  uint16_t mask[MS_BPF_MAX_CALL_DEPTH];
};
/* Scratch space for matching ids between two states (free() it). */
struct ms_bpf_idmap;
struct ms_bpf_idmap *ms_bpf_idmap_new(void);
/* cur is included in old (exact: equal), given the registers that are live. */
int ms_bpf_vs_within(const struct ms_bpf_vstate *old, const struct ms_bpf_vstate *cur,
                     const struct ms_bpf_vlive *live, int exact, struct ms_bpf_idmap *m);

/* A hash of everything exact equality compares except ids (frames and their
 * call sites, references, live registers, every written stack slot and its
 * spill): equal states have equal fingerprints, and states that differ only in
 * a stack slot (a loop counter kept there) differ in fingerprint. */
uint64_t ms_bpf_vs_fingerprint(const struct ms_bpf_vstate *s, const struct ms_bpf_vlive *live);

const char *ms_bpf_vtype_name(int type);
/* "R1=ctx(off=0) R10=fp0 ..." for the registers that are initialised. */
void ms_bpf_vs_print(const struct ms_bpf_vstate *s, const struct ms_bpf_prog *prog,
                     char *buf, size_t size);
void ms_bpf_vreg_print(const struct ms_bpf_vreg *r, const struct ms_bpf_prog *prog,
                       char *buf, size_t size);

/* Register constructors. */
void ms_bpf_vreg_scalar(struct ms_bpf_vreg *r, struct ms_bpf_scalar s);
void ms_bpf_vreg_unknown(struct ms_bpf_vreg *r);
void ms_bpf_vreg_const(struct ms_bpf_vreg *r, uint64_t v);
void ms_bpf_vreg_not_init(struct ms_bpf_vreg *r);
int ms_bpf_vreg_is_ptr(const struct ms_bpf_vreg *r);

/* ---- the environment ---------------------------------------------------- */

struct ms_bpf_venv {
  const struct ms_bpf_prog *prog;
  const struct ms_bpf_insn *insns;
  size_t n;
  struct ms_verify_opts o;
  struct ms_textbuf *log;
  size_t log_reserve;      /* bytes kept free for the last lines */
  int log_cut;             /* the verbose trace was cut */
  struct ms_bpf_vstate *cur;
  uint32_t pc;             /* the instruction being processed */
  uint32_t next_id;        /* ids for values, results and reservations */
  int64_t err_insn;
  int rejected;
};

/* verifier_env.c: the environment's log and accessors. */
/* A line of the verbose trace (nothing unless opts.verbose; cut, once, before
 * it could crowd out the last lines). */
void ms_bpf_vtrace(struct ms_bpf_venv *env, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Instruction pc as Linux prints it ("?" when it cannot be read). */
void ms_bpf_vinsn_text(const struct ms_bpf_venv *env, uint32_t pc, char *buf, size_t size);
/* The current state's registers, after prefix, into the verbose trace. */
void ms_bpf_vtrace_state(struct ms_bpf_venv *env, const char *prefix);
/* Rejects at env->pc: logs "insn N: <disassembly> ; <reason>" and returns
 * -MS_E_VERIFY. */
int ms_bpf_vreject(struct ms_bpf_venv *env, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The register r of the current frame; its check for being initialised. */
struct ms_bpf_vreg *ms_bpf_vregs(struct ms_bpf_venv *env);
int ms_bpf_vcheck_read(struct ms_bpf_venv *env, unsigned r);
uint32_t ms_bpf_vnew_id(struct ms_bpf_venv *env);
/* Marks every copy (registers and spills, all frames) of a value of this id. */
typedef void (*ms_bpf_vreg_fn)(struct ms_bpf_vreg *r, void *user);
void ms_bpf_vs_foreach_reg(struct ms_bpf_vstate *s, ms_bpf_vreg_fn fn, void *user);

/* verifier_cache.c: acceptances remembered. Lookup fills *st (1) for the very
 * same program, map definitions, helper prototypes and options (opts as
 * ms_bpf_verify normalised them); store keeps an acceptance. Thread-safe. */
int ms_bpf_vcache_lookup(const struct ms_bpf_prog *prog, const struct ms_verify_opts *o,
                         struct ms_verify_stats *st);
void ms_bpf_vcache_store(const struct ms_bpf_prog *prog, const struct ms_verify_opts *o,
                         const struct ms_verify_stats *st);

/* verifier_mem.c */
int ms_bpf_vmem_ldx(struct ms_bpf_venv *env, const struct ms_bpf_insn *in);
int ms_bpf_vmem_st(struct ms_bpf_venv *env, const struct ms_bpf_insn *in);
int ms_bpf_vmem_atomic(struct ms_bpf_venv *env, const struct ms_bpf_insn *in);
int ms_bpf_vmem_helper(struct ms_bpf_venv *env, const struct ms_bpf_insn *in);
/* Bytes [lo, hi) of frame f's stack as a helper reads them: written, and no
 * pointer among them. */
int ms_bpf_vmem_stack_readable(struct ms_bpf_venv *env, unsigned regno, const struct ms_bpf_vreg *r,
                               int64_t lo, int64_t hi, const char *what);

#endif
