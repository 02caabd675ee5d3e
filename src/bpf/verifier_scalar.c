/* SPDX-License-Identifier: MIT */
/* The verifier's scalar domain: a value is known as a set given by unsigned
 * bounds, signed bounds and a tristate number (which bits are known, and
 * their values). Each ALU operation maps sets to a set that contains every
 * result the interpreter can compute from members of its inputs (RFC 9669
 * semantics: wrap-around, masked shift counts, x/0 = 0, x%0 = x, 32-bit
 * results zero-extended); a conditional jump narrows its operands on each
 * side. Soundness over precision: when in doubt the result is "any value".
 *
 * 32-bit operations are computed on the zero-extended low halves of their
 * operands with the 64-bit functions, then truncated: the low 32 bits of an
 * add, sub, mul, and, or, xor or left shift depend only on the low 32 bits of
 * the inputs, and right shifts and divisions take the low halves as the
 * interpreter does. JMP32 compares the same views and writes what it learns
 * back where the view is the whole value (upper half known zero or a sign
 * extension), and into the low known bits otherwise. */
#include <stdio.h>

#include "bpf/verifier_shared.h"

typedef struct ms_bpf_scalar sc_t;
typedef struct ms_bpf_tnum tnum_t;

#define SIGN64 (1ull << 63)

static uint64_t umax64(uint64_t a, uint64_t b) { return a > b ? a : b; }
static uint64_t umin64(uint64_t a, uint64_t b) { return a < b ? a : b; }
static int64_t smax64(int64_t a, int64_t b) { return a > b ? a : b; }
static int64_t smin64(int64_t a, int64_t b) { return a < b ? a : b; }
static uint64_t low_mask(unsigned bits) { return bits >= 64 ? ~0ull : (1ull << bits) - 1; }

/* ---- tristate numbers --------------------------------------------------- */

static tnum_t tn(uint64_t v, uint64_t m) { return (tnum_t){v & ~m, m}; }
static tnum_t tn_unknown(void) { return (tnum_t){0, ~0ull}; }

/* The smallest tnum holding every value of [lo, hi]. */
static tnum_t tn_range(uint64_t lo, uint64_t hi) {
  uint64_t diff = lo ^ hi;
  if (!diff) return tn(lo, 0);
  unsigned bits = 64 - (unsigned)__builtin_clzll(diff);
  uint64_t m = low_mask(bits);
  return tn(lo, m);
}

/* Carries are what make addition hard: a bit of the sum is unknown when a
 * carry into it may differ between the all-unknown-zero and all-unknown-one
 * extremes, or when an input bit there is unknown. */
static tnum_t tn_add(tnum_t a, tnum_t b) {
  uint64_t sm = a.m + b.m, sv = a.v + b.v;
  uint64_t sigma = sm + sv, chi = sigma ^ sv;
  uint64_t mu = chi | a.m | b.m;
  return tn(sv, mu);
}

static tnum_t tn_sub(tnum_t a, tnum_t b) {
  uint64_t dv = a.v - b.v;
  uint64_t alpha = dv + a.m, beta = dv - b.m, chi = alpha ^ beta;
  uint64_t mu = chi | a.m | b.m;
  return tn(dv, mu);
}

static tnum_t tn_and(tnum_t a, tnum_t b) {
  uint64_t may_a = a.v | a.m, may_b = b.v | b.m, v = a.v & b.v;
  return tn(v, may_a & may_b & ~v);
}

static tnum_t tn_or(tnum_t a, tnum_t b) {
  uint64_t v = a.v | b.v;
  return tn(v, (a.m | b.m) & ~v);
}

static tnum_t tn_xor(tnum_t a, tnum_t b) { return tn(a.v ^ b.v, a.m | b.m); }

/* A product keeps the known trailing zeros of both factors. */
static tnum_t tn_mul(tnum_t a, tnum_t b) {
  if (!a.m && !b.m) return tn(a.v * b.v, 0);
  unsigned za = a.v | a.m ? (unsigned)__builtin_ctzll(a.v | a.m) : 64;
  unsigned zb = b.v | b.m ? (unsigned)__builtin_ctzll(b.v | b.m) : 64;
  unsigned z = za + zb >= 64 ? 64 : za + zb;
  return tn(0, ~low_mask(z));
}

static tnum_t tn_lsh(tnum_t a, unsigned k) { return tn(a.v << k, a.m << k); }
static tnum_t tn_rsh(tnum_t a, unsigned k) { return tn(a.v >> k, a.m >> k); }
static tnum_t tn_arsh(tnum_t a, unsigned k) {
  return tn((uint64_t)((int64_t)a.v >> k), (uint64_t)((int64_t)a.m >> k));
}

/* -1 when a and b share no value. */
static int tn_intersect(tnum_t a, tnum_t b, tnum_t *out) {
  if ((a.v ^ b.v) & ~a.m & ~b.m) return -1;
  uint64_t m = a.m & b.m;
  *out = tn(a.v | b.v, m);
  return 0;
}

/* b is a subset of a. */
static int tn_within(tnum_t a, tnum_t b) {
  if (b.m & ~a.m) return 0;
  return (b.v & ~a.m) == a.v;
}

/* ---- construction and normalisation ------------------------------------- */

sc_t ms_bpf_sc_unknown(void) { return (sc_t){0, ~0ull, INT64_MIN, INT64_MAX, tn_unknown()}; }

sc_t ms_bpf_sc_const(uint64_t v) { return (sc_t){v, v, (int64_t)v, (int64_t)v, tn(v, 0)}; }

sc_t ms_bpf_sc_urange(uint64_t lo, uint64_t hi) {
  sc_t s = ms_bpf_sc_unknown();
  s.umin = lo;
  s.umax = hi;
  s.t = tn_range(lo, hi);
  if (ms_bpf_sc_sync(&s)) s = ms_bpf_sc_unknown(); /* lo > hi: a caller's mistake, stay sound */
  return s;
}

int ms_bpf_sc_is_const(const sc_t *s) { return s->t.m == 0; }

/* Signed and unsigned bounds describe the same set: where the signed range
 * stays on one side of zero, the two orders agree. */
static int deduce_cross(sc_t *s) {
  if (s->smin >= 0 || s->smax < 0) {
    uint64_t lo = umax64((uint64_t)s->smin, s->umin), hi = umin64((uint64_t)s->smax, s->umax);
    if (lo > hi) return -1;
    s->umin = lo, s->umax = hi, s->smin = (int64_t)lo, s->smax = (int64_t)hi;
  } else if ((int64_t)s->umax >= 0) { /* every value below 2^63: non-negative */
    uint64_t hi = umin64((uint64_t)s->smax, s->umax);
    if (s->umin > hi) return -1;
    s->smin = (int64_t)s->umin, s->smax = (int64_t)hi, s->umax = hi;
  } else if ((int64_t)s->umin < 0) { /* every value at or above 2^63: negative */
    uint64_t lo = umax64((uint64_t)s->smin, s->umin);
    if (lo > s->umax) return -1;
    s->umin = lo, s->smin = (int64_t)lo, s->smax = (int64_t)s->umax;
  }
  return 0;
}

int ms_bpf_sc_sync(sc_t *s) {
  for (int round = 0; round < 2; round++) {
    s->umin = umax64(s->umin, s->t.v);
    s->umax = umin64(s->umax, s->t.v | s->t.m);
    s->smin = smax64(s->smin, (int64_t)(s->t.v | (s->t.m & SIGN64)));
    s->smax = smin64(s->smax, (int64_t)(s->t.v | (s->t.m & ~SIGN64)));
    if (s->umin > s->umax || s->smin > s->smax) return -1;
    if (deduce_cross(s)) return -1;
    if (tn_intersect(s->t, tn_range(s->umin, s->umax), &s->t)) return -1;
  }
  return 0;
}

/* For results computed from non-empty inputs: never empty, but if a bound
 * computation were ever inconsistent, fall back to "anything". */
static void settle(sc_t *s) {
  if (ms_bpf_sc_sync(s)) *s = ms_bpf_sc_unknown();
}

sc_t ms_bpf_sc_cast(sc_t s, unsigned bytes) {
  if (bytes >= 8) return s;
  unsigned bits = bytes * 8;
  uint64_t mask = low_mask(bits);
  sc_t r = ms_bpf_sc_unknown();
  r.t = tn(s.t.v & mask, s.t.m & mask);
  if (s.umax <= mask) {
    r.umin = s.umin, r.umax = s.umax;
  } else if ((s.umin >> bits) == (s.umax >> bits)) { /* one block: truncation keeps order */
    r.umin = s.umin & mask, r.umax = s.umax & mask;
  } else {
    r.umin = 0, r.umax = mask;
  }
  r.smin = 0, r.smax = (int64_t)mask;
  settle(&r);
  return r;
}

sc_t ms_bpf_sc_sext(sc_t s, unsigned bits) {
  if (bits >= 64) return s;
  sc_t c = ms_bpf_sc_cast(s, bits / 8);
  uint64_t half = 1ull << (bits - 1), high = ~low_mask(bits);
  if (c.umax < half) return c; /* all non-negative: unchanged */
  sc_t r = ms_bpf_sc_unknown();
  if (c.umin >= half) { /* all negative: the high bits are ones */
    r.umin = c.umin | high, r.umax = c.umax | high;
    r.t = tn(c.t.v | high, c.t.m);
  } else {
    r.smin = -(int64_t)half, r.smax = (int64_t)(half - 1);
    int sign_unknown = (c.t.m & half) != 0;
    r.t = sign_unknown ? tn(c.t.v, c.t.m | high) : (c.t.v & half) ? tn(c.t.v | high, c.t.m) : c.t;
  }
  settle(&r);
  return r;
}

/* ---- 64-bit operations -------------------------------------------------- */

static sc_t sc_add(sc_t a, sc_t b) {
  sc_t r = ms_bpf_sc_unknown();
  r.t = tn_add(a.t, b.t);
  int64_t lo, hi;
  if (!__builtin_add_overflow(a.smin, b.smin, &lo) && !__builtin_add_overflow(a.smax, b.smax, &hi))
    r.smin = lo, r.smax = hi;
  uint64_t ulo, uhi;
  if (!__builtin_add_overflow(a.umax, b.umax, &uhi)) {
    ulo = a.umin + b.umin;
    r.umin = ulo, r.umax = uhi;
  }
  settle(&r);
  return r;
}

static sc_t sc_sub(sc_t a, sc_t b) {
  sc_t r = ms_bpf_sc_unknown();
  r.t = tn_sub(a.t, b.t);
  int64_t lo, hi;
  if (!__builtin_sub_overflow(a.smin, b.smax, &lo) && !__builtin_sub_overflow(a.smax, b.smin, &hi))
    r.smin = lo, r.smax = hi;
  if (a.umin >= b.umax) r.umin = a.umin - b.umax, r.umax = a.umax - b.umin;
  settle(&r);
  return r;
}

static sc_t sc_mul(sc_t a, sc_t b) {
  sc_t r = ms_bpf_sc_unknown();
  r.t = tn_mul(a.t, b.t);
  if (a.umax <= UINT32_MAX && b.umax <= UINT32_MAX) r.umin = a.umin * b.umin, r.umax = a.umax * b.umax;
  settle(&r);
  return r;
}

static sc_t sc_div(sc_t a, sc_t b) {
  if (b.umin > 0) return ms_bpf_sc_urange(a.umin / b.umax, a.umax / b.umin);
  return ms_bpf_sc_urange(0, a.umax); /* x / 0 = 0 */
}

static sc_t sc_mod(sc_t a, sc_t b) {
  if (b.umin > a.umax) return a; /* every divisor above every dividend (also excludes 0) */
  if (b.umin > 0) return ms_bpf_sc_urange(0, umin64(a.umax, b.umax - 1));
  return ms_bpf_sc_urange(0, a.umax); /* x % 0 = x, x % y <= x */
}

static sc_t sc_and(sc_t a, sc_t b) {
  sc_t r = ms_bpf_sc_unknown();
  r.t = tn_and(a.t, b.t);
  r.umax = umin64(a.umax, b.umax);
  settle(&r);
  return r;
}

static sc_t sc_or(sc_t a, sc_t b) {
  sc_t r = ms_bpf_sc_unknown();
  r.t = tn_or(a.t, b.t);
  r.umin = umax64(a.umin, b.umin);
  settle(&r);
  return r;
}

static sc_t sc_xor(sc_t a, sc_t b) {
  sc_t r = ms_bpf_sc_unknown();
  r.t = tn_xor(a.t, b.t);
  settle(&r);
  return r;
}

/* Shifts by an amount whose low bits (the ones the machine uses) are known. */
static int shift_amount(sc_t b, unsigned width, unsigned *k) {
  uint64_t m = width - 1;
  if (b.t.m & m) return -1;
  *k = (unsigned)(b.t.v & m);
  return 0;
}

static sc_t sc_lsh(sc_t a, sc_t b) {
  unsigned k;
  if (shift_amount(b, 64, &k)) return ms_bpf_sc_unknown();
  sc_t r = ms_bpf_sc_unknown();
  r.t = tn_lsh(a.t, k);
  if (k == 0 || a.umax >> (64 - k) == 0) r.umin = a.umin << k, r.umax = a.umax << k;
  settle(&r);
  return r;
}

static sc_t sc_rsh(sc_t a, sc_t b) {
  unsigned k;
  if (shift_amount(b, 64, &k)) return ms_bpf_sc_urange(0, a.umax);
  sc_t r = ms_bpf_sc_unknown();
  r.t = tn_rsh(a.t, k);
  r.umin = a.umin >> k, r.umax = a.umax >> k;
  settle(&r);
  return r;
}

static sc_t sc_arsh(sc_t a, sc_t b) {
  unsigned k;
  if (shift_amount(b, 64, &k)) return ms_bpf_sc_unknown();
  sc_t r = ms_bpf_sc_unknown();
  r.t = tn_arsh(a.t, k);
  r.smin = a.smin >> k, r.smax = a.smax >> k;
  settle(&r);
  return r;
}

static sc_t sc_op64(unsigned op, int is_signed, sc_t a, sc_t b) {
  switch (op) {
  case MS_BPF_ADD: return sc_add(a, b);
  case MS_BPF_SUB: return sc_sub(a, b);
  case MS_BPF_MUL: return sc_mul(a, b);
  case MS_BPF_DIV: return is_signed ? ms_bpf_sc_unknown() : sc_div(a, b);
  case MS_BPF_MOD: return is_signed ? ms_bpf_sc_unknown() : sc_mod(a, b);
  case MS_BPF_OR: return sc_or(a, b);
  case MS_BPF_AND: return sc_and(a, b);
  case MS_BPF_LSH: return sc_lsh(a, b);
  case MS_BPF_RSH: return sc_rsh(a, b);
  case MS_BPF_XOR: return sc_xor(a, b);
  case MS_BPF_ARSH: return sc_arsh(a, b);
  default: return ms_bpf_sc_unknown();
  }
}

/* ---- byte swaps --------------------------------------------------------- */

static uint64_t bswap_n(uint64_t v, int imm) {
  if (imm == 16) return __builtin_bswap16((uint16_t)v);
  if (imm == 32) return __builtin_bswap32((uint32_t)v);
  return __builtin_bswap64(v);
}

static sc_t sc_end(const struct ms_bpf_insn *in, sc_t a) {
  int swap = MS_BPF_CLASS(in->code) == MS_BPF_ALU64 || MS_BPF_SRC(in->code) == MS_BPF_TO_BE;
  if (!swap) return in->imm == 64 ? a : ms_bpf_sc_cast(a, (unsigned)in->imm / 8); /* to_le: truncation */
  if (ms_bpf_sc_is_const(&a)) return ms_bpf_sc_const(bswap_n(a.t.v, in->imm));
  return in->imm == 64 ? ms_bpf_sc_unknown() : ms_bpf_sc_urange(0, low_mask((unsigned)in->imm));
}

/* ---- the ALU entry ------------------------------------------------------ */

static sc_t alu64(const struct ms_bpf_insn *in, sc_t a, sc_t b) {
  unsigned op = MS_BPF_OP(in->code);
  switch (op) {
  case MS_BPF_MOV: return in->off ? ms_bpf_sc_sext(b, (unsigned)in->off) : b;
  case MS_BPF_NEG: return sc_sub(ms_bpf_sc_const(0), a);
  case MS_BPF_END: return sc_end(in, a);
  default: return sc_op64(op, in->off == 1, a, b);
  }
}

static sc_t alu32(const struct ms_bpf_insn *in, sc_t a64, sc_t b64) {
  unsigned op = MS_BPF_OP(in->code), k;
  sc_t a = ms_bpf_sc_cast(a64, 4), b = ms_bpf_sc_cast(b64, 4), r;
  switch (op) {
  case MS_BPF_MOV:
    r = in->off ? ms_bpf_sc_sext(b64, (unsigned)in->off) : b;
    break;
  case MS_BPF_NEG: r = sc_sub(ms_bpf_sc_const(0), a); break;
  case MS_BPF_END: return sc_end(in, a64); /* works on the whole register */
  case MS_BPF_LSH: case MS_BPF_RSH: case MS_BPF_ARSH:
    if (shift_amount(b, 32, &k)) return ms_bpf_sc_urange(0, UINT32_MAX);
    r = op == MS_BPF_ARSH ? sc_arsh(ms_bpf_sc_sext(a, 32), ms_bpf_sc_const(k))
                          : sc_op64(op, 0, a, ms_bpf_sc_const(k));
    break;
  default: r = sc_op64(op, in->off == 1, a, b); break;
  }
  return ms_bpf_sc_cast(r, 4);
}

void ms_bpf_sc_alu(const struct ms_bpf_insn *in, sc_t *dst, const sc_t *src) {
  int is64 = MS_BPF_CLASS(in->code) == MS_BPF_ALU64;
  *dst = is64 ? alu64(in, *dst, *src) : alu32(in, *dst, *src);
}

/* ---- conditions --------------------------------------------------------- */

unsigned ms_bpf_sc_negate(unsigned op) {
  switch (op) {
  case MS_BPF_JEQ: return MS_BPF_JNE;
  case MS_BPF_JNE: return MS_BPF_JEQ;
  case MS_BPF_JGT: return MS_BPF_JLE;
  case MS_BPF_JLE: return MS_BPF_JGT;
  case MS_BPF_JGE: return MS_BPF_JLT;
  case MS_BPF_JLT: return MS_BPF_JGE;
  case MS_BPF_JSGT: return MS_BPF_JSLE;
  case MS_BPF_JSLE: return MS_BPF_JSGT;
  case MS_BPF_JSGE: return MS_BPF_JSLT;
  case MS_BPF_JSLT: return MS_BPF_JSGE;
  case MS_BPF_JSET: return MS_BPF_JNSET;
  default: return MS_BPF_JSET; /* JNSET */
  }
}

static int refine_eq(sc_t *a, sc_t *b) {
  sc_t r = *a;
  r.umin = umax64(a->umin, b->umin), r.umax = umin64(a->umax, b->umax);
  r.smin = smax64(a->smin, b->smin), r.smax = smin64(a->smax, b->smax);
  if (tn_intersect(a->t, b->t, &r.t)) return -1;
  *a = *b = r;
  return 0;
}

/* a != b: only a constant at the edge of the other's range can be cut. */
static int refine_ne(sc_t *a, const sc_t *b) {
  if (!ms_bpf_sc_is_const(b)) return 0;
  uint64_t v = b->t.v;
  if (ms_bpf_sc_is_const(a)) return a->t.v == v ? -1 : 0;
  if (a->umin == v) a->umin++;
  else if (a->umax == v) a->umax--;
  if (a->smin == (int64_t)v) a->smin++;
  else if (a->smax == (int64_t)v) a->smax--;
  return 0;
}

/* a > b (strict) or a >= b, unsigned. */
static int refine_ugt(sc_t *a, sc_t *b, int strict) {
  if (strict && (b->umin == UINT64_MAX || a->umax == 0)) return -1;
  a->umin = umax64(a->umin, b->umin + (uint64_t)strict);
  b->umax = umin64(b->umax, a->umax - (uint64_t)strict);
  return 0;
}

static int refine_sgt(sc_t *a, sc_t *b, int strict) {
  if (strict && (b->smin == INT64_MAX || a->smax == INT64_MIN)) return -1;
  a->smin = smax64(a->smin, b->smin + strict);
  b->smax = smin64(b->smax, a->smax - strict);
  return 0;
}

/* (a & b) != 0 (set) or == 0 (!set), learning bits when b is a constant. */
static int refine_set(sc_t *a, sc_t *b, int set) {
  if (set) {
    if (!((a->t.v | a->t.m) & (b->t.v | b->t.m))) return -1;
    if (ms_bpf_sc_is_const(b) && b->t.v && !(b->t.v & (b->t.v - 1))) {
      if (!(a->t.m & b->t.v) && !(a->t.v & b->t.v)) return -1;
      a->t = tn(a->t.v | b->t.v, a->t.m & ~b->t.v);
    }
    return 0;
  }
  if (a->t.v & b->t.v) return -1;
  if (ms_bpf_sc_is_const(b)) a->t = tn(a->t.v, a->t.m & ~b->t.v);
  if (ms_bpf_sc_is_const(a)) b->t = tn(b->t.v, b->t.m & ~a->t.v);
  return 0;
}

static int refine64(unsigned op, sc_t *a, sc_t *b) {
  int err;
  switch (op) {
  case MS_BPF_JEQ: err = refine_eq(a, b); break;
  case MS_BPF_JNE: err = refine_ne(a, b) || refine_ne(b, a) ? -1 : 0; break;
  case MS_BPF_JGT: err = refine_ugt(a, b, 1); break;
  case MS_BPF_JGE: err = refine_ugt(a, b, 0); break;
  case MS_BPF_JLT: err = refine_ugt(b, a, 1); break;
  case MS_BPF_JLE: err = refine_ugt(b, a, 0); break;
  case MS_BPF_JSGT: err = refine_sgt(a, b, 1); break;
  case MS_BPF_JSGE: err = refine_sgt(a, b, 0); break;
  case MS_BPF_JSLT: err = refine_sgt(b, a, 1); break;
  case MS_BPF_JSLE: err = refine_sgt(b, a, 0); break;
  case MS_BPF_JSET: err = refine_set(a, b, 1); break;
  default: err = refine_set(a, b, 0); break; /* JNSET */
  }
  if (err) return -1;
  return ms_bpf_sc_sync(a) || ms_bpf_sc_sync(b) ? -1 : 0;
}

static int is_signed_op(unsigned op) {
  return op == MS_BPF_JSGT || op == MS_BPF_JSGE || op == MS_BPF_JSLT || op == MS_BPF_JSLE;
}

/* What a JMP32 learnt on the view of x's low half goes back into x. */
static int view_back(sc_t *x, const sc_t *view, int is_signed) {
  tnum_t low = tn(view->t.v & UINT32_MAX, view->t.m | ~(uint64_t)UINT32_MAX);
  if (tn_intersect(x->t, low, &x->t)) return -1;
  int whole = is_signed ? x->smin >= INT32_MIN && x->smax <= INT32_MAX : x->umax <= UINT32_MAX;
  if (whole) {
    x->umin = umax64(x->umin, view->umin), x->umax = umin64(x->umax, view->umax);
    x->smin = smax64(x->smin, view->smin), x->smax = smin64(x->smax, view->smax);
  }
  return ms_bpf_sc_sync(x);
}

static sc_t view32(const sc_t *x, int is_signed) {
  sc_t v = ms_bpf_sc_cast(*x, 4);
  return is_signed ? ms_bpf_sc_sext(v, 32) : v;
}

int ms_bpf_sc_refine(unsigned op, int is32, sc_t *a, sc_t *b) {
  if (!is32) return refine64(op, a, b);
  int sgn = is_signed_op(op);
  sc_t va = view32(a, sgn), vb = view32(b, sgn);
  if (refine64(op, &va, &vb)) return -1;
  return view_back(a, &va, sgn) || view_back(b, &vb, sgn) ? -1 : 0;
}

/* ---- comparison and printing -------------------------------------------- */

int ms_bpf_sc_within(const sc_t *old, const sc_t *cur) {
  return old->umin <= cur->umin && cur->umax <= old->umax && old->smin <= cur->smin &&
         cur->smax <= old->smax && tn_within(old->t, cur->t);
}

int ms_bpf_sc_equal(const sc_t *a, const sc_t *b) {
  return a->umin == b->umin && a->umax == b->umax && a->smin == b->smin && a->smax == b->smax &&
         a->t.v == b->t.v && a->t.m == b->t.m;
}

void ms_bpf_sc_print(const sc_t *s, char *buf, size_t size) {
  if (ms_bpf_sc_is_const(s)) {
    if (s->smin > -65536 && s->smin < 65536) snprintf(buf, size, "%lld", (long long)s->smin);
    else snprintf(buf, size, "0x%llx", (unsigned long long)s->t.v);
    return;
  }
  int n;
  if (s->umin == 0 && s->umax == UINT64_MAX && s->smin == INT64_MIN && s->smax == INT64_MAX && s->t.m == ~0ull) {
    snprintf(buf, size, "scalar()");
    return;
  }
  if ((int64_t)s->umax >= 0)
    n = snprintf(buf, size, "scalar(%llu..%llu", (unsigned long long)s->umin, (unsigned long long)s->umax);
  else
    n = snprintf(buf, size, "scalar(u=%llu..%llu,s=%lld..%lld", (unsigned long long)s->umin,
                 (unsigned long long)s->umax, (long long)s->smin, (long long)s->smax);
  if (n < 0 || (size_t)n >= size) return;
  tnum_t r = tn_range(s->umin, s->umax);
  if (s->t.v != r.v || s->t.m != r.m)
    snprintf(buf + n, size - (size_t)n, ",var=0x%llx/0x%llx)", (unsigned long long)s->t.v,
             (unsigned long long)s->t.m);
  else
    snprintf(buf + n, size - (size_t)n, ")");
}
