/* SPDX-License-Identifier: MIT */
/* The verifier's memory rules and helper calls.
 *
 * Memory a program may touch, by the type of the pointer it uses:
 *  - ctx: the hook context, read-only; a load must lie inside one field the
 *    hook defines (include/megascope/bpf/megascope.h), at a known offset;
 *  - fp: its frame's 512-byte stack; a load reads only bytes written before
 *    on that path; 8-byte aligned stores of a register keep the register
 *    (type and range) in the slot, smaller ones a scalar; pointers are stored
 *    only whole and aligned, and read back only whole;
 *  - map_value, ringbuf_mem, mem: value_size / record / buffer bytes, with
 *    the whole range an offset may take proven inside; no pointer is stored
 *    there (a reader in another process would see it).
 * Helper arguments follow the helper's prototype (struct ms_bpf_helper_proto):
 * a map of an accepted type, keys and values of the map's sizes in readable
 * memory that holds no pointer, memory with a size whose range fits it, a
 * constant size, a live ring buffer record; results are typed by the
 * prototype's return kind (a lookup's value may be NULL until checked, a
 * reservation is a reference the path must release). */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "bpf/verifier_shared.h"

#define MAX_VAR_OFF (1ll << 29) /* offsets beyond this are never in bounds */

static const unsigned size_bytes[4] = {4, 2, 1, 8}; /* by MS_BPF_SIZE >> 3 */

/* ---- where an access lands ---------------------------------------------- */

enum access { ACC_READ, ACC_WRITE, ACC_ATOMIC };
static const char *const access_name[] = {"read", "write", "atomic access"};

/* The range of offsets [lo, hi) an access of size bytes at reg + off may
 * touch, from the pointer's fixed and variable parts (exact: 128-bit). */
typedef __int128 wide_t;
static void access_range(const struct ms_bpf_vreg *r, int32_t off, uint64_t size, wide_t *lo, wide_t *hi) {
  *lo = (wide_t)r->off + off + r->s.smin;
  *hi = (wide_t)r->off + off + r->s.smax + (wide_t)size;
}

static int unbounded(const struct ms_bpf_vreg *r) { return r->s.smin < -MAX_VAR_OFF && r->s.smax > MAX_VAR_OFF; }

static int is_fixed(const struct ms_bpf_vreg *r) { return ms_bpf_sc_is_const(&r->s); }

static long long clamp64(wide_t v) {
  return v > INT64_MAX ? INT64_MAX : v < INT64_MIN ? INT64_MIN : (long long)v;
}

static void describe_range(char *buf, size_t size, const char *base, wide_t lo, wide_t hi, uint64_t n) {
  if (hi - lo == (wide_t)n) snprintf(buf, size, "[%s%+lld] size %llu", base, clamp64(lo), (unsigned long long)n);
  else snprintf(buf, size, "[%s%+lld, %s%+lld) (variable offset, size %llu)", base, clamp64(lo), base, clamp64(hi),
                (unsigned long long)n);
}

/* An access [lo, hi) must lie in a region of size bytes. */
static int check_bounds(struct ms_bpf_venv *env, unsigned regno, const struct ms_bpf_vreg *r, int32_t off,
                        uint64_t n, uint64_t region, const char *what, const char *name) {
  wide_t lo, hi;
  char where[160], var[128];
  access_range(r, off, n, &lo, &hi);
  if (lo >= 0 && hi <= (wide_t)region) return 0;
  ms_bpf_sc_print(&r->s, var, sizeof var);
  if (unbounded(r))
    return ms_bpf_vreject(env, "R%u invalid access to %s%s: variable offset %s is unbounded; bound it with a "
                          "check first", regno, what, name, var);
  describe_range(where, sizeof where, "off", lo, hi, n);
  if (lo < 0 && !is_fixed(r))
    return ms_bpf_vreject(env, "R%u invalid access to %s%s: %s may be negative (variable offset %s); use an "
                          "unsigned index or check index >= 0", regno, what, name, where, var);
  return ms_bpf_vreject(env, "R%u invalid access to %s%s: %s is outside its %llu bytes", regno, what, name,
                        where, (unsigned long long)region);
}

/* ---- the context -------------------------------------------------------- */

/* The field of c holding [off, off + size), or -1 (straddles, or none). */
static int ctx_field_at(const struct ms_verify_ctx *c, uint64_t off, uint64_t size) {
  for (int f = 0; f < c->n_fields; f++) {
    const struct ms_verify_field *d = &c->fields[f];
    if (off >= d->offset && off + size <= (uint64_t)d->offset + d->size) return f;
  }
  return -1;
}

static int ctx_read(struct ms_bpf_venv *env, unsigned regno, const struct ms_bpf_vreg *r, int32_t off,
                    unsigned n) {
  int64_t at = (int64_t)r->off + off;
  const struct ms_verify_ctx *c = env->o.kind == MS_VERIFY_HOOK ? env->o.ctx : NULL;
  if (!is_fixed(r) || r->s.t.v)
    return ms_bpf_vreject(env, "R%u variable-offset access to ctx prohibited", regno);
  if (!c) return ms_bpf_vreject(env, "R%u read of a context this program type does not have", regno);
  if (at < 0 || at + n > (int64_t)c->size)
    return ms_bpf_vreject(env, "invalid read of ctx at offset %lld size %u: outside the %u-byte context",
                          (long long)at, n, c->size);
  int f = ctx_field_at(c, (uint64_t)at, n);
  if (f < 0) {
    int a = ctx_field_at(c, (uint64_t)at, 1), b = ctx_field_at(c, (uint64_t)at + n - 1, 1);
    return ms_bpf_vreject(env, "invalid read of ctx at offset %lld size %u: straddles fields %s and %s "
                          "(a read must lie inside one field)", (long long)at, n,
                          a >= 0 ? c->fields[a].name : "?", b >= 0 ? c->fields[b].name : "?");
  }
  if (!(c->defined >> f & 1))
    return ms_bpf_vreject(env, "invalid read of ctx field %s at offset %lld size %u: hook %s does not define "
                          "field %s", c->fields[f].name, (long long)at, n, c->hook, c->fields[f].name);
  return 0;
}

/* ---- the stack ---------------------------------------------------------- */

static struct ms_bpf_vframe *stack_frame(struct ms_bpf_venv *env, const struct ms_bpf_vreg *r) {
  return r->frame <= env->cur->curframe ? env->cur->frames[r->frame] : NULL;
}

/* Drops slot k's spill, leaving its bytes written (scalar) or, for a pointer,
 * never written: its bytes must not be read back as a number. */
static void spill_drop(struct ms_bpf_vframe *f, unsigned k) {
  unsigned at = 8 * k + f->spill_at[k], len = f->spill_len[k];
  uint8_t to = f->spill[k].type == MS_VT_SCALAR ? MS_VS_MISC : MS_VS_INVALID;
  for (unsigned b = at; b < at + len; b++) f->st[b] = to;
  f->spill_len[k] = 0;
}

/* Bytes [b, b + n) are about to change: spills they touch are dropped. */
static void stack_clobber(struct ms_bpf_vframe *f, unsigned b, unsigned n) {
  for (unsigned k = b / 8; k <= (b + n - 1) / 8 && k < MS_VT_SLOTS; k++) {
    if (!f->spill_len[k]) continue;
    unsigned s = 8 * k + f->spill_at[k], e = s + f->spill_len[k];
    if (s < b + n && b < e) spill_drop(f, k);
  }
}

static void stack_touch(struct ms_bpf_vframe *f, unsigned b) {
  if (b < f->lo) f->lo = b;
}

/* A store of val (NULL: an unknown scalar) of n bytes at stack byte b. */
static int stack_write_fixed(struct ms_bpf_venv *env, unsigned regno, struct ms_bpf_vframe *f, unsigned fno,
                             unsigned b, unsigned n, const struct ms_bpf_vreg *val, unsigned valno) {
  if (val && ms_bpf_vreg_is_ptr(val)) {
    if (n != 8 || b % 8)
      return ms_bpf_vreject(env, "R%u: a pointer is stored on the stack only whole and 8-byte aligned "
                            "(store of %u bytes at fp%d)", valno, n, (int)b - MS_BPF_STACK_SIZE);
    if (val->type == MS_VT_STACK && val->frame > fno)
      return ms_bpf_vreject(env, "R%u: cannot store a pointer to frame %u's stack into frame %u's stack "
                            "(it would outlive its frame)", valno, val->frame, fno);
  }
  stack_clobber(f, b, n);
  stack_touch(f, b);
  unsigned k = b / 8, in_slot = b % 8 + n <= 8;
  if (!val || !in_slot) {
    for (unsigned i = b; i < b + n; i++) f->st[i] = MS_VS_MISC;
    return 0;
  }
  if (f->spill_len[k]) spill_drop(f, k); /* one spill per slot: the newest wins */
  struct ms_bpf_vreg s = *val;
  if (s.type == MS_VT_SCALAR && n < 8) {
    struct ms_bpf_scalar c = ms_bpf_sc_cast(val->s, n);
    if (!ms_bpf_sc_equal(&c, &val->s)) s.id = 0; /* a truncated copy is another value */
    s.s = c;
  }
  f->spill[k] = s;
  f->spill_at[k] = (uint8_t)(b % 8);
  f->spill_len[k] = (uint8_t)n;
  for (unsigned i = b; i < b + n; i++) f->st[i] = MS_VS_SPILL;
  (void)regno;
  return 0;
}

static int byte_has_pointer(const struct ms_bpf_vframe *f, unsigned b) {
  return f->st[b] == MS_VS_SPILL && f->spill[b / 8].type != MS_VT_SCALAR;
}

/* Bytes [lo, hi) (indices) of f are written and hold no pointer. */
static int stack_bytes_ok(struct ms_bpf_venv *env, unsigned regno, const struct ms_bpf_vframe *f,
                          unsigned lo, unsigned hi, const char *what) {
  for (unsigned b = lo; b < hi; b++) {
    int at = (int)b - MS_BPF_STACK_SIZE;
    if (f->st[b] == MS_VS_INVALID)
      return ms_bpf_vreject(env, "R%u %s: uninitialised stack at fp%d (read of bytes [fp%d, fp%d) of which "
                            "fp%d was never written on this path)", regno, what, at,
                            (int)lo - MS_BPF_STACK_SIZE, (int)hi - MS_BPF_STACK_SIZE, at);
    if (byte_has_pointer(f, b))
      return ms_bpf_vreject(env, "R%u %s: stack bytes at fp%d hold a spilled pointer (%s); pointers cannot "
                            "be read as data", regno, what, at, ms_bpf_vtype_name(f->spill[b / 8].type));
  }
  return 0;
}

static void unknown_of_size(struct ms_bpf_vreg *dst, unsigned n, int sx) {
  struct ms_bpf_scalar s = n == 8 ? ms_bpf_sc_unknown() : ms_bpf_sc_urange(0, (1ull << (8 * n)) - 1);
  ms_bpf_vreg_scalar(dst, sx ? ms_bpf_sc_sext(s, 8 * n) : s);
}

static int stack_read_fixed(struct ms_bpf_venv *env, unsigned regno, const struct ms_bpf_vframe *f, unsigned b,
                            unsigned n, int sx, struct ms_bpf_vreg *dst) {
  unsigned k = b / 8;
  int whole_spill = f->spill_len[k] && f->spill_at[k] == b % 8 && b % 8 + n <= 8;
  if (whole_spill && f->spill[k].type != MS_VT_SCALAR) {
    if (n != 8)
      return ms_bpf_vreject(env, "R%u invalid read of %u bytes of a spilled pointer at fp%d (a pointer is "
                            "read back only whole)", regno, n, (int)b - MS_BPF_STACK_SIZE);
    *dst = f->spill[k];
    return 0;
  }
  for (unsigned i = b; i < b + n; i++)
    if (f->st[i] == MS_VS_INVALID)
      return ms_bpf_vreject(env, "R%u invalid read of uninitialised stack at [r10%+d] size %u: fp%d was "
                            "never written on this path", regno, (int)b - MS_BPF_STACK_SIZE, n,
                            (int)i - MS_BPF_STACK_SIZE);
  if (whole_spill && n <= f->spill_len[k]) {
    *dst = f->spill[k];
    if (n < f->spill_len[k] || sx) {
      struct ms_bpf_scalar c = ms_bpf_sc_cast(f->spill[k].s, n);
      ms_bpf_vreg_scalar(dst, sx ? ms_bpf_sc_sext(c, 8 * n) : c);
    }
    return 0;
  }
  int err = stack_bytes_ok(env, regno, f, b, b + n, "invalid read");
  if (err) return err;
  unknown_of_size(dst, n, sx);
  return 0;
}

/* Variable offsets: every byte the access may touch must be fit for it. */
static int stack_var(struct ms_bpf_venv *env, unsigned regno, struct ms_bpf_vframe *f, unsigned lo,
                     unsigned hi, enum access acc, const struct ms_bpf_vreg *val, unsigned n, int sx,
                     struct ms_bpf_vreg *dst) {
  if (acc == ACC_READ) {
    int err = stack_bytes_ok(env, regno, f, lo, hi, "invalid variable-offset read");
    if (!err) unknown_of_size(dst, n, sx);
    return err;
  }
  if (val && ms_bpf_vreg_is_ptr(val))
    return ms_bpf_vreject(env, "R%u: a pointer is stored on the stack only at a fixed offset", regno);
  for (unsigned b = lo; b < hi; b++)
    if (byte_has_pointer(f, b))
      return ms_bpf_vreject(env, "R%u variable-offset stack write may overwrite the pointer spilled at fp%d",
                            regno, (int)b - MS_BPF_STACK_SIZE);
  if (acc == ACC_ATOMIC)
    return ms_bpf_vreject(env, "R%u atomic access to the stack needs a fixed offset", regno);
  for (unsigned k = lo / 8; k <= (hi - 1) / 8; k++)
    if (f->spill_len[k]) spill_drop(f, k); /* the value may have changed: it is just written bytes now */
  stack_touch(f, lo);
  return 0;
}

static int stack_access(struct ms_bpf_venv *env, unsigned regno, const struct ms_bpf_vreg *r, int32_t off,
                        unsigned n, enum access acc, const struct ms_bpf_vreg *val, unsigned valno, int sx,
                        struct ms_bpf_vreg *dst) {
  struct ms_bpf_vframe *f = stack_frame(env, r);
  wide_t lo, hi;
  char where[160];
  if (!f) return ms_bpf_vreject(env, "R%u points into frame %u, which no longer exists", regno, r->frame);
  access_range(r, off, n, &lo, &hi);
  if (lo < -MS_BPF_STACK_SIZE || hi > 0) {
    if (unbounded(r)) {
      ms_bpf_sc_print(&r->s, where, sizeof where);
      return ms_bpf_vreject(env, "R%u invalid access to stack: variable offset %s is unbounded", regno, where);
    }
    describe_range(where, sizeof where, "r10", lo, hi, n);
    return ms_bpf_vreject(env, "R%u invalid access to stack: %s %s is outside [r10-%d, r10)", regno,
                          access_name[acc], where, MS_BPF_STACK_SIZE);
  }
  unsigned b = (unsigned)(lo + MS_BPF_STACK_SIZE), e = (unsigned)(hi + MS_BPF_STACK_SIZE);
  if (!is_fixed(r)) return stack_var(env, regno, f, b, e, acc, val, n, sx, dst);
  if (acc == ACC_READ) return stack_read_fixed(env, regno, f, b, n, sx, dst);
  if (acc == ACC_ATOMIC) {
    int err = stack_bytes_ok(env, regno, f, b, e, "atomic access");
    if (err) return err;
    return stack_write_fixed(env, regno, f, r->frame, b, n, NULL, valno);
  }
  return stack_write_fixed(env, regno, f, r->frame, b, n, val, valno);
}

/* ---- one load, store or atomic ------------------------------------------ */

static int null_deref(struct ms_bpf_venv *env, unsigned regno, const struct ms_bpf_vreg *r) {
  return ms_bpf_vreject(env, "R%u type=%s: possible NULL dereference; compare with 0 first", regno,
                        ms_bpf_vtype_name(r->type));
}

static const struct ms_bpf_map_def *reg_map(struct ms_bpf_venv *env, const struct ms_bpf_vreg *r) {
  return ms_bpf_prog_map(env->prog, r->map);
}

static int pointer_leak(struct ms_bpf_venv *env, unsigned valno, const struct ms_bpf_vreg *val, const char *into) {
  return ms_bpf_vreject(env, "R%u pointer stored into %s (type=%s): pointers must not leave the program",
                        valno, into, ms_bpf_vtype_name(val->type));
}

/* Checks an access through register regno (value r) at insn offset off;
 * for a read fills *dst; val is the stored register for STX (NULL for ST and
 * atomics, whose stored value is a scalar). */
static int check_access(struct ms_bpf_venv *env, unsigned regno, const struct ms_bpf_vreg *r, int32_t off,
                        unsigned n, enum access acc, const struct ms_bpf_vreg *val, unsigned valno, int sx,
                        struct ms_bpf_vreg *dst) {
  int leak = acc != ACC_READ && val && ms_bpf_vreg_is_ptr(val);
  const struct ms_bpf_map_def *d;
  switch (r->type) {
  case MS_VT_CTX:
    if (acc != ACC_READ)
      return ms_bpf_vreject(env, "invalid %s of ctx at offset %lld: the context is read-only",
                            access_name[acc], (long long)r->off + off);
    if (ctx_read(env, regno, r, off, n)) return -MS_E_VERIFY;
    unknown_of_size(dst, n, sx);
    return 0;
  case MS_VT_STACK: return stack_access(env, regno, r, off, n, acc, val, valno, sx, dst);
  case MS_VT_MAP_VALUE:
    d = reg_map(env, r);
    if (!d) return ms_bpf_vreject(env, "R%u names map %u, which the program does not have", regno, r->map);
    if (leak) return pointer_leak(env, valno, val, "map value");
    if (acc != ACC_READ && (d->flags & MS_BPF_MAP_F_RDONLY_PROG))
      return ms_bpf_vreject(env, "R%u invalid %s of map %s: it is read-only to programs", regno,
                            access_name[acc], d->name);
    if (acc != ACC_READ && env->o.kind == MS_VERIFY_HOOK && env->o.ctx && env->o.ctx->no_map_writes)
      return ms_bpf_vreject(env, "R%u invalid %s of map %s: %s programs do not update maps", regno,
                            access_name[acc], d->name, env->o.ctx->prog_type);
    if (check_bounds(env, regno, r, off, n, d->value_size, "map value of ", d->name)) return -MS_E_VERIFY;
    break;
  case MS_VT_MEM:
    if (leak) return pointer_leak(env, valno, val, "memory");
    if (check_bounds(env, regno, r, off, n, r->size, "mem", "")) return -MS_E_VERIFY;
    break;
  case MS_VT_REC:
    if (leak) return pointer_leak(env, valno, val, "ring buffer record");
    if (check_bounds(env, regno, r, off, n, r->size, "ring buffer record", "")) return -MS_E_VERIFY;
    break;
  case MS_VT_MAP_VALUE_OR_NULL:
  case MS_VT_REC_OR_NULL: return null_deref(env, regno, r);
  default:
    return ms_bpf_vreject(env, "R%u invalid memory access through %s (not a pointer to memory)", regno,
                          ms_bpf_vtype_name(r->type));
  }
  if (acc == ACC_READ) unknown_of_size(dst, n, sx);
  return 0;
}

int ms_bpf_vmem_ldx(struct ms_bpf_venv *env, const struct ms_bpf_insn *in) {
  struct ms_bpf_vreg *regs = ms_bpf_vregs(env), val;
  unsigned n = size_bytes[MS_BPF_SIZE(in->code) >> 3];
  if (ms_bpf_vcheck_read(env, in->src_reg)) return -MS_E_VERIFY;
  int sx = MS_BPF_MODE(in->code) == MS_BPF_MEMSX;
  int err = check_access(env, in->src_reg, &regs[in->src_reg], in->off, n, ACC_READ, NULL, 0, sx, &val);
  if (err) return err;
  regs[in->dst_reg] = val;
  return 0;
}

int ms_bpf_vmem_st(struct ms_bpf_venv *env, const struct ms_bpf_insn *in) {
  struct ms_bpf_vreg *regs = ms_bpf_vregs(env), imm, *val = &imm;
  unsigned n = size_bytes[MS_BPF_SIZE(in->code) >> 3], valno = 0;
  if (ms_bpf_vcheck_read(env, in->dst_reg)) return -MS_E_VERIFY;
  if (MS_BPF_CLASS(in->code) == MS_BPF_STX) {
    if (ms_bpf_vcheck_read(env, in->src_reg)) return -MS_E_VERIFY;
    val = &regs[in->src_reg];
    valno = in->src_reg;
    if (val->type == MS_VT_SCALAR && !val->id && regs[in->dst_reg].type == MS_VT_STACK)
      val->id = ms_bpf_vnew_id(env); /* the spill is a copy: what a check learns of one, the other knows */
  } else {
    ms_bpf_vreg_const(&imm, (uint64_t)(int64_t)in->imm);
  }
  struct ms_bpf_vreg copy = *val; /* val may alias the frame being written */
  return check_access(env, in->dst_reg, &regs[in->dst_reg], in->off, n, ACC_WRITE, &copy, valno, 0, NULL);
}

/* Atomics need natural alignment (the interpreter faults otherwise): every
 * region's base is 8-byte aligned, so the offset must be a multiple of n. */
static int check_aligned(struct ms_bpf_venv *env, unsigned regno, const struct ms_bpf_vreg *r, int32_t off,
                         unsigned n) {
  int64_t fixed = (int64_t)r->off + off;
  uint64_t low = n - 1;
  if ((fixed & (int64_t)low) || ((r->s.t.v | r->s.t.m) & low))
    return ms_bpf_vreject(env, "R%u misaligned %u-byte atomic access at offset %lld%s", regno, n,
                          (long long)fixed, is_fixed(r) ? "" : " plus a variable part");
  return 0;
}

int ms_bpf_vmem_atomic(struct ms_bpf_venv *env, const struct ms_bpf_insn *in) {
  struct ms_bpf_vreg *regs = ms_bpf_vregs(env);
  unsigned n = MS_BPF_SIZE(in->code) == MS_BPF_DW ? 8 : 4, s = in->src_reg;
  if (ms_bpf_vcheck_read(env, in->dst_reg) || ms_bpf_vcheck_read(env, s)) return -MS_E_VERIFY;
  if (in->imm == MS_BPF_CMPXCHG && ms_bpf_vcheck_read(env, 0)) return -MS_E_VERIFY;
  if (ms_bpf_vreg_is_ptr(&regs[s])) return pointer_leak(env, s, &regs[s], "memory by an atomic operation");
  if (in->imm == MS_BPF_CMPXCHG && ms_bpf_vreg_is_ptr(&regs[0]))
    return ms_bpf_vreject(env, "R0 type=%s: cmpxchg compares with a scalar only", ms_bpf_vtype_name(regs[0].type));
  const struct ms_bpf_vreg *r = &regs[in->dst_reg];
  if (r->type == MS_VT_CTX) return check_access(env, in->dst_reg, r, in->off, n, ACC_ATOMIC, NULL, 0, 0, NULL);
  if (ms_bpf_vreg_is_ptr(r) && r->type != MS_VT_MAP_VALUE_OR_NULL && r->type != MS_VT_REC_OR_NULL &&
      check_aligned(env, in->dst_reg, r, in->off, n))
    return -MS_E_VERIFY;
  int err = check_access(env, in->dst_reg, r, in->off, n, ACC_ATOMIC, NULL, 0, 0, NULL);
  if (err) return err;
  struct ms_bpf_vreg old;
  unknown_of_size(&old, n, 0);
  if (in->imm == MS_BPF_CMPXCHG) regs[0] = old;
  else if (in->imm & MS_BPF_FETCH) regs[s] = old; /* XCHG has the FETCH bit too */
  return 0;
}

/* ---- helper calls ------------------------------------------------------- */

int ms_bpf_vmem_stack_readable(struct ms_bpf_venv *env, unsigned regno, const struct ms_bpf_vreg *r,
                               int64_t lo, int64_t hi, const char *what) {
  struct ms_bpf_vframe *f = stack_frame(env, r);
  if (!f) return ms_bpf_vreject(env, "R%u points into frame %u, which no longer exists", regno, r->frame);
  return stack_bytes_ok(env, regno, f, (unsigned)(lo + MS_BPF_STACK_SIZE), (unsigned)(hi + MS_BPF_STACK_SIZE),
                        what);
}

/* regno points to at least min and at most max readable bytes a helper
 * copies or compares (a key, a value, data). */
static int helper_mem(struct ms_bpf_venv *env, unsigned regno, uint64_t max, const char *what) {
  const struct ms_bpf_vreg *r = &ms_bpf_vregs(env)[regno];
  const struct ms_bpf_map_def *d;
  wide_t lo, hi;
  char where[160];
  if (!max) return ms_bpf_vreject(env, "R%u %s of 0 bytes", regno, what);
  switch (r->type) {
  case MS_VT_STACK:
    access_range(r, 0, max, &lo, &hi);
    if (lo < -MS_BPF_STACK_SIZE || hi > 0) {
      describe_range(where, sizeof where, "r10", lo, hi, max);
      return ms_bpf_vreject(env, "R%u invalid access to stack: %s %s is outside [r10-%d, r10)", regno, what,
                            where, MS_BPF_STACK_SIZE);
    }
    return ms_bpf_vmem_stack_readable(env, regno, r, (int64_t)lo, (int64_t)hi, what);
  case MS_VT_MAP_VALUE:
    d = reg_map(env, r);
    if (!d) return ms_bpf_vreject(env, "R%u names map %u, which the program does not have", regno, r->map);
    return check_bounds(env, regno, r, 0, max, d->value_size, "map value of ", d->name);
  case MS_VT_MEM: return check_bounds(env, regno, r, 0, max, r->size, "mem", "");
  case MS_VT_REC: return check_bounds(env, regno, r, 0, max, r->size, "ring buffer record", "");
  case MS_VT_MAP_VALUE_OR_NULL:
  case MS_VT_REC_OR_NULL: return null_deref(env, regno, r);
  case MS_VT_CTX:
    return ms_bpf_vreject(env, "R%u %s: the context cannot be passed to a helper as memory; copy the fields "
                          "it needs to the stack", regno, what);
  default:
    return ms_bpf_vreject(env, "R%u type=%s expected=pointer to %s (stack, map value or record)", regno,
                          ms_bpf_vtype_name(r->type), what);
  }
}

static const char *hname(const struct ms_bpf_helper_proto *p) { return p->name ? p->name : "helper"; }

struct call {
  const struct ms_bpf_helper_proto *proto;
  const struct ms_bpf_map_def *map; /* the MAP argument's */
  uint32_t map_idx;
  uint64_t const_size;              /* the CONST_SIZE argument's */
  int release;                      /* the RINGBUF_REC argument's register, or 0 */
};

static int arg_scalar(struct ms_bpf_venv *env, unsigned regno, const char *what) {
  const struct ms_bpf_vreg *r = &ms_bpf_vregs(env)[regno];
  if (r->type != MS_VT_SCALAR)
    return ms_bpf_vreject(env, "R%u type=%s expected=scalar (%s)", regno, ms_bpf_vtype_name(r->type), what);
  return 0;
}

static int arg_map(struct ms_bpf_venv *env, unsigned regno, struct call *c) {
  const struct ms_bpf_vreg *r = &ms_bpf_vregs(env)[regno];
  if (r->type != MS_VT_MAP_PTR)
    return ms_bpf_vreject(env, "R%u type=%s expected=map_ptr: argument %u of %s must be a map (&map)", regno,
                          ms_bpf_vtype_name(r->type), regno, hname(c->proto));
  const struct ms_bpf_map_def *d = ms_bpf_prog_map(env->prog, r->map);
  if (!d) return ms_bpf_vreject(env, "R%u names map %u, which the program does not have", regno, r->map);
  uint32_t types = c->proto->map_types;
  if (types && (d->type >= 32 || !(types >> d->type & 1)))
    return ms_bpf_vreject(env, "R%u map %s of type %u is not accepted by %s", regno, d->name, d->type,
                          hname(c->proto));
  uint32_t id = c->proto->id;
  if ((id == MS_BPF_FN_MAP_UPDATE_ELEM || id == MS_BPF_FN_MAP_DELETE_ELEM) && (d->flags & MS_BPF_MAP_F_RDONLY_PROG))
    return ms_bpf_vreject(env, "R%u map %s is read-only to programs (%s)", regno, d->name, hname(c->proto));
  c->map = d;
  c->map_idx = r->map;
  return 0;
}

static int arg_size(struct ms_bpf_venv *env, unsigned regno, uint64_t *max) {
  const struct ms_bpf_vreg *r = &ms_bpf_vregs(env)[regno];
  char v[128];
  if (arg_scalar(env, regno, "a size")) return -MS_E_VERIFY;
  ms_bpf_sc_print(&r->s, v, sizeof v);
  if (r->s.umin == 0)
    return ms_bpf_vreject(env, "R%u size may be 0 (R%u=%s): it must be > 0", regno, regno, v);
  if (r->s.umax > (uint64_t)MAX_VAR_OFF)
    return ms_bpf_vreject(env, "R%u size is unbounded (R%u=%s): bound it with a check first", regno, regno, v);
  *max = r->s.umax;
  return 0;
}

static int arg_rec(struct ms_bpf_venv *env, unsigned regno, struct call *c) {
  const struct ms_bpf_vreg *r = &ms_bpf_vregs(env)[regno];
  if (r->type == MS_VT_REC_OR_NULL) return null_deref(env, regno, r);
  if (r->type != MS_VT_REC)
    return ms_bpf_vreject(env, "R%u type=%s expected=ringbuf_mem (a record from ringbuf_reserve)", regno,
                          ms_bpf_vtype_name(r->type));
  if (r->off || !is_fixed(r) || r->s.t.v)
    return ms_bpf_vreject(env, "R%u must point to the start of its record (off=%d)", regno, r->off);
  c->release = (int)regno;
  return 0;
}

static int check_arg(struct ms_bpf_venv *env, struct call *c, unsigned i, int *skip) {
  unsigned regno = i + 1;
  enum ms_bpf_arg_kind k = c->proto->args[i];
  uint64_t max = 0;
  if (ms_bpf_vcheck_read(env, regno)) return -MS_E_VERIFY;
  const struct ms_bpf_vreg *r = &ms_bpf_vregs(env)[regno];
  switch (k) {
  case MS_BPF_ARG_ANYTHING: return arg_scalar(env, regno, "any value");
  case MS_BPF_ARG_FLAGS:
    if (arg_scalar(env, regno, "flags")) return -MS_E_VERIFY;
    return ms_bpf_sc_is_const(&r->s) ? 0 : ms_bpf_vreject(env, "R%u flags must be a known constant", regno);
  case MS_BPF_ARG_MAP: return arg_map(env, regno, c);
  case MS_BPF_ARG_MAP_KEY:
  case MS_BPF_ARG_MAP_VALUE:
    if (!c->map)
      return ms_bpf_vreject(env, "helper %s: argument %u needs a map argument before it", hname(c->proto), regno);
    return helper_mem(env, regno, k == MS_BPF_ARG_MAP_KEY ? c->map->key_size : c->map->value_size,
                      k == MS_BPF_ARG_MAP_KEY ? "map key" : "map value");
  case MS_BPF_ARG_MEM:
    if (i + 1 >= 5 || c->proto->args[i + 1] != MS_BPF_ARG_SIZE)
      return ms_bpf_vreject(env, "helper %s: a memory argument must be followed by its size", hname(c->proto));
    if (ms_bpf_vcheck_read(env, regno + 1) || arg_size(env, regno + 1, &max)) return -MS_E_VERIFY;
    *skip = 1;
    return helper_mem(env, regno, max, "helper data");
  case MS_BPF_ARG_CONST_SIZE:
    if (arg_scalar(env, regno, "a constant size")) return -MS_E_VERIFY;
    if (!ms_bpf_sc_is_const(&r->s) || r->s.t.v == 0 || r->s.t.v > UINT32_MAX / 2)
      return ms_bpf_vreject(env, "R%u must be a known constant size > 0", regno);
    c->const_size = r->s.t.v;
    return 0;
  case MS_BPF_ARG_RINGBUF_REC: return arg_rec(env, regno, c);
  default:
    return ms_bpf_vreject(env, "helper %s: argument %u has a kind (%d) the verifier does not know",
                          hname(c->proto), regno, (int)k);
  }
}

struct release_ctx {
  uint32_t ref, insn;
};

static void mark_released(struct ms_bpf_vreg *r, void *user) {
  const struct release_ctx *rc = user;
  if ((r->type == MS_VT_REC || r->type == MS_VT_REC_OR_NULL) && r->ref == rc->ref) {
    r->type = MS_VT_RELEASED;
    r->size = rc->insn;
  }
}

static int release_ref(struct ms_bpf_venv *env, uint32_t ref) {
  struct ms_bpf_vstate *s = env->cur;
  unsigned i = 0;
  while (i < s->n_refs && s->refs[i].id != ref) i++;
  if (i == s->n_refs) return ms_bpf_vreject(env, "release of a ring buffer record this path does not hold");
  memmove(&s->refs[i], &s->refs[i + 1], (s->n_refs - i - 1) * sizeof s->refs[0]);
  s->n_refs--;
  struct release_ctx rc = {ref, env->pc};
  ms_bpf_vs_foreach_reg(s, mark_released, &rc);
  return 0;
}

static int set_result(struct ms_bpf_venv *env, struct call *c) {
  struct ms_bpf_vreg *r0 = &ms_bpf_vregs(env)[0];
  struct ms_bpf_vstate *s = env->cur;
  switch (c->proto->ret) {
  case MS_BPF_RET_INTEGER: ms_bpf_vreg_unknown(r0); return 0;
  case MS_BPF_RET_VOID: ms_bpf_vreg_not_init(r0); return 0;
  case MS_BPF_RET_MAP_VALUE_OR_NULL:
    if (!c->map) return ms_bpf_vreject(env, "helper %s returns a map value but takes no map", hname(c->proto));
    ms_bpf_vreg_const(r0, 0);
    r0->type = MS_VT_MAP_VALUE_OR_NULL;
    r0->map = c->map_idx;
    r0->id = ms_bpf_vnew_id(env);
    return 0;
  case MS_BPF_RET_RINGBUF_REC_OR_NULL:
    if (!c->const_size) return ms_bpf_vreject(env, "helper %s returns a record but takes no size", hname(c->proto));
    if (s->n_refs == MS_VT_MAX_REFS)
      return ms_bpf_vreject(env, "more than %d ring buffer reservations held at once", MS_VT_MAX_REFS);
    ms_bpf_vreg_const(r0, 0);
    r0->type = MS_VT_REC_OR_NULL;
    r0->size = (uint32_t)c->const_size;
    r0->id = ms_bpf_vnew_id(env);
    r0->ref = ms_bpf_vnew_id(env);
    s->refs[s->n_refs++] = (struct ms_bpf_vref){r0->ref, env->pc};
    return 0;
  default:
    return ms_bpf_vreject(env, "helper %s has a return kind (%d) the verifier does not know", hname(c->proto),
                          (int)c->proto->ret);
  }
}

/* 1 when the context's program type may call helper id (a NULL list: any). */
static int helper_allowed(const struct ms_verify_ctx *c, uint32_t id) {
  if (!c || !c->helpers) return 1;
  for (int i = 0; i < c->n_helpers; i++)
    if (c->helpers[i] == id) return 1;
  return 0;
}

int ms_bpf_vmem_helper(struct ms_bpf_venv *env, const struct ms_bpf_insn *in) {
  uint32_t id = (uint32_t)in->imm;
  struct call c = {0};
  c.proto = env->o.helpers ? ms_bpf_helpers_proto(env->o.helpers, id) : NULL;
  if (!c.proto)
    return ms_bpf_vreject(env, "call to unknown helper %u (not in the helper table of this program type)", id);
  if (env->o.kind == MS_VERIFY_HOOK && !helper_allowed(env->o.ctx, id))
    return ms_bpf_vreject(env, "helper %s (%u) is not allowed in %s programs%s%s", hname(c.proto), id,
                          env->o.ctx->prog_type, env->o.ctx->restricted_why ? ": " : "",
                          env->o.ctx->restricted_why ? env->o.ctx->restricted_why : "");
  for (unsigned i = 0; i < 5 && c.proto->args[i] != MS_BPF_ARG_NONE; i++) {
    int skip = 0;
    if (c.proto->args[i] == MS_BPF_ARG_SIZE)
      return ms_bpf_vreject(env, "helper %s: a size argument must follow a memory argument", hname(c.proto));
    if (check_arg(env, &c, i, &skip)) return -MS_E_VERIFY;
    i += (unsigned)skip;
  }
  if (c.release && release_ref(env, ms_bpf_vregs(env)[c.release].ref)) return -MS_E_VERIFY;
  struct ms_bpf_vreg *regs = ms_bpf_vregs(env);
  for (unsigned r = 1; r <= 5; r++) ms_bpf_vreg_not_init(&regs[r]);
  return set_result(env, &c);
}
