/* SPDX-License-Identifier: MIT */
/* The verifier's abstract state of one path: a stack of frames (registers,
 * stack bytes, spilled registers) and the ring buffer reservations it holds;
 * copying it, deciding whether one state is included in another (which lets
 * the verifier prune a path reaching an instruction in a state already proven
 * safe there), and printing it.
 *
 * Inclusion follows the Linux verifier's regsafe/stacksafe: a register the
 * old state never needed (dead, uninitialised, a released record) matches
 * anything; a scalar must lie within the old range and known bits; a pointer
 * must be of the same kind and region with its offset within the old one;
 * ids that link copies of one value (NULL checks, equal scalars) and
 * reservations must correspond one to one between the two states. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bpf/verifier_shared.h"

/* ---- registers ---------------------------------------------------------- */

void ms_bpf_vreg_scalar(struct ms_bpf_vreg *r, struct ms_bpf_scalar s) {
  memset(r, 0, sizeof *r);
  r->type = MS_VT_SCALAR;
  r->s = s;
}

void ms_bpf_vreg_unknown(struct ms_bpf_vreg *r) { ms_bpf_vreg_scalar(r, ms_bpf_sc_unknown()); }

void ms_bpf_vreg_const(struct ms_bpf_vreg *r, uint64_t v) { ms_bpf_vreg_scalar(r, ms_bpf_sc_const(v)); }

void ms_bpf_vreg_not_init(struct ms_bpf_vreg *r) { memset(r, 0, sizeof *r); }

int ms_bpf_vreg_is_ptr(const struct ms_bpf_vreg *r) {
  return r->type != MS_VT_NOT_INIT && r->type != MS_VT_SCALAR;
}

/* ---- states ------------------------------------------------------------- */

struct ms_bpf_vframe *ms_bpf_vs_frame_new(int32_t callsite) {
  struct ms_bpf_vframe *f = calloc(1, sizeof *f);
  if (!f) return NULL;
  f->callsite = callsite;
  f->lo = MS_BPF_STACK_SIZE;
  return f;
}

struct ms_bpf_vstate *ms_bpf_vs_new(void) {
  struct ms_bpf_vstate *s = calloc(1, sizeof *s);
  if (!s) return NULL;
  s->frames[0] = ms_bpf_vs_frame_new(-1);
  if (!s->frames[0]) {
    free(s);
    return NULL;
  }
  return s;
}

void ms_bpf_vs_free(struct ms_bpf_vstate *s) {
  if (!s) return;
  for (unsigned i = 0; i < MS_BPF_MAX_CALL_DEPTH; i++) free(s->frames[i]);
  free(s);
}

int ms_bpf_vs_copy(struct ms_bpf_vstate *dst, const struct ms_bpf_vstate *src) {
  for (unsigned i = 0; i < MS_BPF_MAX_CALL_DEPTH; i++) {
    if (i > src->curframe) {
      free(dst->frames[i]);
      dst->frames[i] = NULL;
      continue;
    }
    if (!dst->frames[i] && !(dst->frames[i] = malloc(sizeof *dst->frames[i]))) return -ENOMEM;
    memcpy(dst->frames[i], src->frames[i], sizeof *dst->frames[i]);
  }
  dst->curframe = src->curframe;
  dst->n_refs = src->n_refs;
  memcpy(dst->refs, src->refs, src->n_refs * sizeof src->refs[0]);
  return 0;
}

void ms_bpf_vs_foreach_reg(struct ms_bpf_vstate *s, ms_bpf_vreg_fn fn, void *user) {
  for (unsigned i = 0; i <= s->curframe; i++) {
    struct ms_bpf_vframe *f = s->frames[i];
    for (unsigned r = 0; r < MS_BPF_REG_COUNT; r++) fn(&f->regs[r], user);
    for (unsigned k = 0; k < MS_VT_SLOTS; k++)
      if (f->spill_len[k]) fn(&f->spill[k], user);
  }
}

/* ---- inclusion ---------------------------------------------------------- */

/* A one-to-one correspondence between the ids of the old and current state. */
#define IDMAP_MAX 1024
struct ms_bpf_idmap {
  uint32_t old[IDMAP_MAX], cur[IDMAP_MAX];
  unsigned n;
  uint32_t fresh; /* stands for "no id" on the current side: matches one old id only */
};

static int ids_match(struct ms_bpf_idmap *m, uint32_t old_id, uint32_t cur_id) {
  if (!old_id) return 1; /* the old state relied on no link */
  if (!cur_id) cur_id = --m->fresh;
  for (unsigned i = 0; i < m->n; i++) {
    if (m->old[i] == old_id) return m->cur[i] == cur_id;
    if (m->cur[i] == cur_id) return 0;
  }
  if (m->n == IDMAP_MAX) return 0;
  m->old[m->n] = old_id;
  m->cur[m->n++] = cur_id;
  return 1;
}

static int reg_equal(const struct ms_bpf_vreg *o, const struct ms_bpf_vreg *c, struct ms_bpf_idmap *m) {
  if (o->type != c->type) return 0;
  if (o->type == MS_VT_NOT_INIT) return 1;
  return o->frame == c->frame && o->off == c->off && o->map == c->map && o->size == c->size &&
         ms_bpf_sc_equal(&o->s, &c->s) && ids_match(m, o->id, c->id) && ids_match(m, o->ref, c->ref) &&
         (o->id || !c->id) && (o->ref || !c->ref);
}

static int same_region(const struct ms_bpf_vreg *o, const struct ms_bpf_vreg *c) {
  return o->type == c->type && o->frame == c->frame && o->map == c->map && o->size == c->size &&
         o->off == c->off;
}

/* cur's register can stand where old's was proven safe. */
static int reg_within(const struct ms_bpf_vreg *o, const struct ms_bpf_vreg *c, struct ms_bpf_idmap *m) {
  switch (o->type) {
  case MS_VT_NOT_INIT:
  case MS_VT_RELEASED: /* any use was an error: the old path made none */
    return 1;
  case MS_VT_SCALAR:
    return c->type == MS_VT_SCALAR && ms_bpf_sc_within(&o->s, &c->s) && ids_match(m, o->id, c->id);
  case MS_VT_MAP_PTR:
    return c->type == MS_VT_MAP_PTR && c->map == o->map;
  default:
    return same_region(o, c) && ms_bpf_sc_within(&o->s, &c->s) && ids_match(m, o->ref, c->ref) &&
           ids_match(m, o->id, c->id);
  }
}

static int regs_ok(const struct ms_bpf_vreg *o, const struct ms_bpf_vreg *c, struct ms_bpf_idmap *m, int exact) {
  return exact ? reg_equal(o, c, m) : reg_within(o, c, m);
}

/* A spilled scalar the old state knew nothing about is as good as written bytes. */
static int spill_is_misc(const struct ms_bpf_vframe *f, unsigned k) {
  const struct ms_bpf_vreg *r = &f->spill[k];
  if (r->type != MS_VT_SCALAR || r->id) return 0;
  unsigned len = f->spill_len[k];
  struct ms_bpf_scalar any = len == 8 ? ms_bpf_sc_unknown() : ms_bpf_sc_urange(0, (1ull << (8 * len)) - 1);
  return ms_bpf_sc_equal(&r->s, &any);
}

static int byte_is_scalar(const struct ms_bpf_vframe *f, unsigned b) {
  if (f->st[b] == MS_VS_MISC) return 1;
  return f->st[b] == MS_VS_SPILL && f->spill[b / 8].type == MS_VT_SCALAR;
}

static int slot_within(const struct ms_bpf_vframe *o, const struct ms_bpf_vframe *c, unsigned k,
                       struct ms_bpf_idmap *m, int exact) {
  if (exact) {
    if (memcmp(&o->st[8 * k], &c->st[8 * k], 8) || o->spill_len[k] != c->spill_len[k]) return 0;
    return !o->spill_len[k] || (o->spill_at[k] == c->spill_at[k] && reg_equal(&o->spill[k], &c->spill[k], m));
  }
  int old_spill = o->spill_len[k] && !spill_is_misc(o, k);
  if (old_spill) {
    if (c->spill_len[k] != o->spill_len[k] || c->spill_at[k] != o->spill_at[k] ||
        !reg_within(&o->spill[k], &c->spill[k], m))
      return 0;
  }
  for (unsigned b = 8 * k; b < 8 * k + 8; b++) {
    if (o->st[b] == MS_VS_INVALID) continue;
    if (o->st[b] == MS_VS_SPILL && old_spill) continue; /* compared as a register above */
    if (!byte_is_scalar(c, b)) return 0;
  }
  return 1;
}

static int frame_within(const struct ms_bpf_vframe *o, const struct ms_bpf_vframe *c, uint16_t live,
                        struct ms_bpf_idmap *m, int exact) {
  if (o->callsite != c->callsite) return 0;
  for (unsigned r = 0; r < MS_BPF_REG_COUNT - 1; r++)
    if ((live >> r & 1) && !regs_ok(&o->regs[r], &c->regs[r], m, exact)) return 0;
  unsigned lo = o->lo < c->lo ? o->lo : c->lo;
  for (unsigned k = lo / 8; k < MS_VT_SLOTS; k++)
    if (!slot_within(o, c, k, m, exact)) return 0;
  return 1;
}

struct ms_bpf_idmap *ms_bpf_idmap_new(void) { return malloc(sizeof(struct ms_bpf_idmap)); }

int ms_bpf_vs_within(const struct ms_bpf_vstate *old, const struct ms_bpf_vstate *cur,
                     const struct ms_bpf_vlive *live, int exact, struct ms_bpf_idmap *m) {
  if (old->curframe != cur->curframe || old->n_refs != cur->n_refs) return 0;
  m->n = 0;
  m->fresh = 0;
  int ok = 1;
  for (unsigned i = 0; ok && i < old->n_refs; i++) ok = ids_match(m, old->refs[i].id, cur->refs[i].id);
  for (unsigned i = 0; ok && i <= old->curframe; i++)
    ok = frame_within(old->frames[i], cur->frames[i], live->mask[i], m, exact);
  return ok;
}

static uint64_t mix(uint64_t h, uint64_t v) {
  h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
  return h * 0xff51afd7ed558ccdull;
}

static uint64_t rotl(uint64_t v, unsigned k) { return v << k | v >> (64 - k); }

/* What reg_equal compares of a register, but its ids, folded into one word
 * (rotations keep equal values in different fields from cancelling), then
 * mixed in once: the fingerprint is computed at every prune point of a loop,
 * over every slot of every frame, so it must cost little per slot. */
static uint64_t reg_hash(uint64_t h, const struct ms_bpf_vreg *g) {
  uint64_t v = (uint64_t)g->type | (uint64_t)g->frame << 8 | (uint64_t)(uint32_t)g->off << 32;
  if (g->type != MS_VT_NOT_INIT)
    v ^= rotl((uint64_t)g->map << 32 | g->size, 7) ^ rotl(g->s.umin, 17) ^ rotl(g->s.umax, 29) ^
         rotl(g->s.t.v, 41) ^ rotl(g->s.t.m, 53);
  return mix(h, v);
}

/* What slot_within(exact) compares: the slot's byte states and its spill.
 * A slot never written (all INVALID, no spill) adds nothing, so the frame's
 * lowest written byte (lo) need not be hashed. */
static uint64_t stack_hash(uint64_t h, const struct ms_bpf_vframe *f) {
  for (unsigned k = f->lo / 8; k < MS_VT_SLOTS; k++) {
    uint64_t bytes;
    memcpy(&bytes, &f->st[8 * k], 8);
    if (!bytes && !f->spill_len[k]) continue;
    h = mix(h, bytes ^ rotl((uint64_t)k << 16 | (uint64_t)f->spill_len[k] << 8 | f->spill_at[k], 48));
    if (f->spill_len[k]) h = reg_hash(h, &f->spill[k]);
  }
  return h;
}

uint64_t ms_bpf_vs_fingerprint(const struct ms_bpf_vstate *s, const struct ms_bpf_vlive *live) {
  uint64_t h = mix(s->curframe, s->n_refs);
  for (unsigned i = 0; i <= s->curframe; i++) {
    const struct ms_bpf_vframe *f = s->frames[i];
    h = mix(h, (uint64_t)(uint32_t)f->callsite);
    for (unsigned r = 0; r < MS_BPF_REG_COUNT - 1; r++)
      if (live->mask[i] >> r & 1) h = reg_hash(h, &f->regs[r]);
    h = stack_hash(h, f);
  }
  return h;
}

/* ---- printing ----------------------------------------------------------- */

const char *ms_bpf_vtype_name(int type) {
  static const char *const names[MS_VT_COUNT] = {
      "uninit", "scalar", "ctx", "fp", "map_ptr", "map_value", "map_value_or_null",
      "mem", "ringbuf_mem", "ringbuf_mem_or_null", "released_ringbuf_mem",
  };
  return type >= 0 && type < MS_VT_COUNT ? names[type] : "?";
}

static const char *map_name(const struct ms_bpf_prog *prog, uint32_t idx) {
  const struct ms_bpf_map_def *d = prog ? ms_bpf_prog_map(prog, idx) : NULL;
  return d ? d->name : "?";
}

/* ",var=<scalar>" when a pointer's offset has a variable part. */
static void var_part(const struct ms_bpf_vreg *r, char *buf, size_t size) {
  buf[0] = 0;
  if (ms_bpf_sc_is_const(&r->s) && r->s.t.v == 0) return;
  char v[128];
  ms_bpf_sc_print(&r->s, v, sizeof v);
  snprintf(buf, size, ",var=%s", v);
}

void ms_bpf_vreg_print(const struct ms_bpf_vreg *r, const struct ms_bpf_prog *prog, char *buf, size_t size) {
  char var[160];
  var_part(r, var, sizeof var);
  const char *tn = ms_bpf_vtype_name(r->type);
  switch (r->type) {
  case MS_VT_SCALAR: ms_bpf_sc_print(&r->s, buf, size); break;
  case MS_VT_CTX: snprintf(buf, size, "ctx(off=%d%s)", r->off, var); break;
  case MS_VT_STACK:
    if (var[0]) snprintf(buf, size, "fp%d(frame%u%s)", r->off, r->frame, var);
    else snprintf(buf, size, r->frame ? "fp%d(frame%u)" : "fp%d", r->off, r->frame);
    break;
  case MS_VT_MAP_PTR: snprintf(buf, size, "map_ptr(%s)", map_name(prog, r->map)); break;
  case MS_VT_MAP_VALUE:
  case MS_VT_MAP_VALUE_OR_NULL:
    snprintf(buf, size, "%s(%s,off=%d%s,id=%u)", tn, map_name(prog, r->map), r->off, var, r->id);
    break;
  case MS_VT_MEM: snprintf(buf, size, "mem(size=%u,off=%d%s)", r->size, r->off, var); break;
  case MS_VT_REC:
  case MS_VT_REC_OR_NULL:
    snprintf(buf, size, "%s(size=%u,off=%d%s,ref=%u)", tn, r->size, r->off, var, r->ref);
    break;
  case MS_VT_RELEASED: snprintf(buf, size, "%s(released at insn %u)", tn, r->size); break;
  default: snprintf(buf, size, "%s", tn); break;
  }
}

static size_t append(char *buf, size_t size, size_t at, const char *fmt, const char *a, const char *b) {
  if (at >= size) return at;
  int n = snprintf(buf + at, size - at, fmt, a, b);
  return n < 0 ? at : at + (size_t)n;
}

void ms_bpf_vs_print(const struct ms_bpf_vstate *s, const struct ms_bpf_prog *prog, char *buf, size_t size) {
  const struct ms_bpf_vframe *f = s->frames[s->curframe];
  char one[256], name[24];
  size_t at = 0;
  buf[0] = 0;
  for (unsigned r = 0; r < MS_BPF_REG_COUNT; r++) {
    if (f->regs[r].type == MS_VT_NOT_INIT) continue;
    ms_bpf_vreg_print(&f->regs[r], prog, one, sizeof one);
    snprintf(name, sizeof name, "R%u", r);
    at = append(buf, size, at, at ? " %s=%s" : "%s=%s", name, one);
  }
  for (unsigned k = 0; k < MS_VT_SLOTS; k++) {
    if (!f->spill_len[k]) continue;
    ms_bpf_vreg_print(&f->spill[k], prog, one, sizeof one);
    snprintf(name, sizeof name, "fp%d", (int)(8 * k + f->spill_at[k]) - MS_BPF_STACK_SIZE);
    at = append(buf, size, at, " %s=%s", name, one);
  }
}
