/* SPDX-License-Identifier: MIT */
/* The assembler for the uBPF-style text of the conformance suite.
 *
 * One instruction per line; `#` starts a comment; `name:` defines a label
 * (alone or before an instruction); jump and local-call targets are labels or
 * signed offsets (+3, -2); the label `exit` means the first exit instruction
 * unless a line defines it. Operands: registers %r0..%r10 (or r0..r10),
 * immediates (decimal, or hex with 0x), memory [%rN+off] / [%rN-off] / [%rN].
 * Besides the suite's syntax: `lddw %rN, map[i]` / `map[i]+off` (the loader's
 * map references), `call helper N`, `call runtime N`, `call %rN` (callx, which
 * the checker refuses) and `.insn 0x<16 hex digits>` for any raw word, so that
 * whatever the disassembler prints assembles back to the same words. */
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bpf/bpf_internal.h"

#define MAX_OPERANDS 4
#define LABEL_MAX 64

struct label {
  char name[LABEL_MAX];
  size_t at;
};

struct fixup {
  char name[LABEL_MAX];
  size_t insn;
  int line;
  int wide; /* 1: the target goes in imm (ja32, call local), 0: in off */
};

struct assembler {
  struct ms_bpf_insn *out;
  size_t n, cap;
  struct label *labels;
  size_t n_labels, cap_labels;
  struct fixup *fixups;
  size_t n_fixups, cap_fixups;
  long first_exit; /* -1 until an exit is seen */
  int line;
  struct ms_textbuf *log;
};

/* One parsed line: the mnemonic and its operands, split on commas/blanks
 * (brackets kept whole, blanks inside them dropped). */
struct line {
  char *mnem;
  char *ops[MAX_OPERANDS + 1];
  int n_ops;
};

__attribute__((format(printf, 2, 3))) static int fail(struct assembler *a, const char *fmt, ...) {
  char msg[200];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  ms_textbuf_printf(a->log, "line %d: %s\n", a->line, msg);
  return -MS_E_FORMAT;
}

static int grow(void **p, size_t *cap, size_t need, size_t elem) {
  if (need <= *cap) return 0;
  size_t c = *cap ? *cap * 2 : 64;
  while (c < need) c *= 2;
  void *q = realloc(*p, c * elem);
  if (!q) return -ENOMEM;
  *p = q;
  *cap = c;
  return 0;
}

static int emit(struct assembler *a, struct ms_bpf_insn in) {
  if (grow((void **)&a->out, &a->cap, a->n + 1, sizeof *a->out)) return -ENOMEM;
  a->out[a->n++] = in;
  return 0;
}

/* ---- operands ----------------------------------------------------------- */

enum { DST, SRC };

/* Sets in's dst or src register from %rN / rN. */
static int parse_reg(struct assembler *a, const char *s, struct ms_bpf_insn *in, int which) {
  const char *p = s;
  if (*p == '%') p++;
  if (*p == 'r') {
    char *end;
    errno = 0;
    long v = strtol(p + 1, &end, 10);
    if (p[1] && isdigit((unsigned char)p[1]) && !*end && !errno && v >= 0 && v <= 10) {
      if (which == DST) in->dst_reg = (uint8_t)v;
      else in->src_reg = (uint8_t)v;
      return 0;
    }
  }
  return fail(a, "invalid register '%s'", s);
}

static int is_reg(const char *s) { return s[0] == '%' || (s[0] == 'r' && isdigit((unsigned char)s[1])); }

/* Parses a whole token as a number: [+-] then decimal or 0x hex. */
static int parse_num(const char *s, int *neg, unsigned long long *mag) {
  const char *p = s;
  *neg = 0;
  if (*p == '+' || *p == '-') *neg = *p++ == '-';
  if (!*p || !isxdigit((unsigned char)*p)) return -1;
  int hex = p[0] == '0' && (p[1] == 'x' || p[1] == 'X');
  if (hex && !isxdigit((unsigned char)p[2])) return -1;
  char *end;
  errno = 0;
  *mag = strtoull(p, &end, hex ? 16 : 10);
  return *end || errno ? -1 : 0;
}

/* imm32: anything in [INT32_MIN, UINT32_MAX], stored as its 32 bits. */
static int parse_imm32(struct assembler *a, const char *s, int32_t *imm) {
  int neg;
  unsigned long long m;
  if (parse_num(s, &neg, &m) || (neg ? m > 0x80000000ull : m > 0xffffffffull))
    return fail(a, "immediate '%s' is not a 32-bit value", s);
  *imm = (int32_t)(uint32_t)(neg ? -m : m);
  return 0;
}

static int parse_imm64(struct assembler *a, const char *s, uint64_t *v) {
  int neg;
  unsigned long long m;
  if (parse_num(s, &neg, &m) || (neg && m > 0x8000000000000000ull))
    return fail(a, "immediate '%s' is not a 64-bit value", s);
  *v = neg ? -(uint64_t)m : m;
  return 0;
}

static int parse_off16(struct assembler *a, const char *s, int16_t *off) {
  int neg;
  unsigned long long m;
  if (parse_num(s, &neg, &m) || m > (neg ? 32768ull : 32767ull))
    return fail(a, "offset '%s' is not a signed 16-bit value", s);
  *off = (int16_t)(neg ? -(long long)m : (long long)m);
  return 0;
}

/* [%rN+off], [%rN-off] or [%rN]: in's dst or src register and its offset */
static int parse_mem(struct assembler *a, const char *s, struct ms_bpf_insn *in, int which) {
  int16_t *off = &in->off;
  size_t len = strlen(s);
  if (len < 3 || s[0] != '[' || s[len - 1] != ']') return fail(a, "expected [%%rN+off], got '%s'", s);
  char buf[64];
  if (len - 2 >= sizeof buf) return fail(a, "memory operand too long: '%s'", s);
  memcpy(buf, s + 1, len - 2);
  buf[len - 2] = 0;
  char *sign = strpbrk(buf, "+-");
  *off = 0;
  if (sign) {
    if (parse_off16(a, sign, off)) return -MS_E_FORMAT;
    *sign = 0;
  }
  return parse_reg(a, buf, in, which);
}

/* A jump target: +N/-N now, or a label resolved at the end. */
static int parse_target(struct assembler *a, const char *s, int wide, int32_t *val) {
  *val = 0;
  if (s[0] == '+' || s[0] == '-') {
    if (!wide) {
      int16_t off = 0;
      if (parse_off16(a, s, &off)) return -MS_E_FORMAT;
      *val = off;
      return 0;
    }
    return parse_imm32(a, s, val);
  }
  if (strlen(s) >= LABEL_MAX) return fail(a, "label '%s' is too long", s);
  if (grow((void **)&a->fixups, &a->cap_fixups, a->n_fixups + 1, sizeof *a->fixups)) return -ENOMEM;
  struct fixup *f = &a->fixups[a->n_fixups++];
  strcpy(f->name, s);
  f->insn = a->n;
  f->line = a->line;
  f->wide = wide;
  return 0;
}

static int want_ops(struct assembler *a, const struct line *l, int n) {
  if (l->n_ops == n) return 0;
  return fail(a, "'%s' takes %d operand%s, got %d", l->mnem, n, n == 1 ? "" : "s", l->n_ops);
}

/* ---- mnemonics ---------------------------------------------------------- */

/* Splits "add32" into "add" and class ALU; "add"/"add64" into ALU64. */
static const char *strip_width(const char *m, char *base, size_t size, int *is32) {
  size_t len = strlen(m);
  *is32 = len > 2 && !strcmp(m + len - 2, "32");
  int is64 = len > 2 && !strcmp(m + len - 2, "64");
  if ((*is32 || is64) && len - 2 < size) {
    memcpy(base, m, len - 2);
    base[len - 2] = 0;
    return base;
  }
  return m;
}

static int find_name(const char *const *names, const char *s) {
  for (int i = 0; i < 16; i++)
    if (names[i] && !strcmp(names[i], s)) return i;
  return -1;
}

static int asm_alu(struct assembler *a, const struct line *l, int *handled) {
  char base[32];
  int is32;
  const char *op = strip_width(l->mnem, base, sizeof base, &is32);
  struct ms_bpf_insn in = {0};
  in.code = is32 ? MS_BPF_ALU : MS_BPF_ALU64;
  if (!strncmp(op, "movsx", 5) && op[5]) {
    int16_t off = 0;
    if (parse_off16(a, op + 5, &off)) return -MS_E_FORMAT;
    in.off = off;
    op = "mov";
  } else if (!strcmp(op, "sdiv") || !strcmp(op, "smod")) {
    in.off = 1;
    op = op[1] == 'd' ? "div" : "mod";
  }
  int idx = find_name(ms_bpf_alu_names, op);
  if (idx < 0 || idx == (MS_BPF_END >> 4)) return *handled = 0;
  *handled = 1;
  in.code |= (uint8_t)(idx << 4);
  if (want_ops(a, l, idx == (MS_BPF_NEG >> 4) ? 1 : 2) || parse_reg(a, l->ops[0], &in, DST))
    return -MS_E_FORMAT;
  if (l->n_ops == 2) {
    if (is_reg(l->ops[1])) {
      in.code |= MS_BPF_X;
      if (parse_reg(a, l->ops[1], &in, SRC)) return -MS_E_FORMAT;
    } else if (parse_imm32(a, l->ops[1], &in.imm)) {
      return -MS_E_FORMAT;
    }
  }
  return emit(a, in);
}

static int asm_endian(struct assembler *a, const struct line *l, int *handled) {
  static const struct { const char *prefix; uint8_t code; } forms[] = {
      {"le", MS_BPF_ALU | MS_BPF_END | MS_BPF_TO_LE}, {"be", MS_BPF_ALU | MS_BPF_END | MS_BPF_TO_BE},
      {"bswap", MS_BPF_ALU64 | MS_BPF_END}, {"swap", MS_BPF_ALU64 | MS_BPF_END}};
  for (size_t i = 0; i < sizeof forms / sizeof forms[0]; i++) {
    size_t k = strlen(forms[i].prefix);
    const char *w = l->mnem + k;
    if (strncmp(l->mnem, forms[i].prefix, k) || (strcmp(w, "16") && strcmp(w, "32") && strcmp(w, "64")))
      continue;
    *handled = 1;
    struct ms_bpf_insn in = {.code = forms[i].code, .imm = atoi(w)};
    if (want_ops(a, l, 1) || parse_reg(a, l->ops[0], &in, DST)) return -MS_E_FORMAT;
    return emit(a, in);
  }
  return *handled = 0;
}

static int asm_jmp(struct assembler *a, const struct line *l, int *handled) {
  char base[32];
  int is32;
  const char *op = strip_width(l->mnem, base, sizeof base, &is32);
  int idx = find_name(ms_bpf_jmp_names, op);
  if (idx < 0 || idx == (MS_BPF_JA >> 4) || idx == (MS_BPF_CALL >> 4) || idx == (MS_BPF_EXIT >> 4) ||
      (!is32 && strcmp(op, l->mnem)))
    return *handled = 0;
  *handled = 1;
  struct ms_bpf_insn in = {.code = (uint8_t)((is32 ? MS_BPF_JMP32 : MS_BPF_JMP) | idx << 4)};
  int32_t t;
  if (want_ops(a, l, 3) || parse_reg(a, l->ops[0], &in, DST)) return -MS_E_FORMAT;
  if (is_reg(l->ops[1])) {
    in.code |= MS_BPF_X;
    if (parse_reg(a, l->ops[1], &in, SRC)) return -MS_E_FORMAT;
  } else if (parse_imm32(a, l->ops[1], &in.imm)) {
    return -MS_E_FORMAT;
  }
  if (parse_target(a, l->ops[2], 0, &t)) return -MS_E_FORMAT;
  in.off = (int16_t)t;
  return emit(a, in);
}

static int asm_call(struct assembler *a, const struct line *l) {
  struct ms_bpf_insn in = {.code = MS_BPF_JMP | MS_BPF_CALL};
  const char *mode = l->n_ops == 2 ? l->ops[0] : "helper";
  const char *target = l->ops[l->n_ops - 1];
  if (l->n_ops != 1 && l->n_ops != 2) return want_ops(a, l, 1);
  if (!strcmp(mode, "local")) {
    in.src_reg = MS_BPF_PSEUDO_CALL;
    if (parse_target(a, target, 1, &in.imm)) return -MS_E_FORMAT;
  } else if (!strcmp(mode, "helper") && is_reg(target)) {
    in.code |= MS_BPF_X; /* callx: the register is in dst_reg */
    if (parse_reg(a, target, &in, DST)) return -MS_E_FORMAT;
  } else if (!strcmp(mode, "helper") || !strcmp(mode, "runtime")) {
    in.src_reg = mode[0] == 'r' ? 2 : 0;
    if (parse_imm32(a, target, &in.imm)) return -MS_E_FORMAT;
  } else {
    return fail(a, "call mode '%s' (helper, local or runtime)", mode);
  }
  return emit(a, in);
}

static int asm_ja(struct assembler *a, const struct line *l, int wide) {
  struct ms_bpf_insn in = {.code = wide ? MS_BPF_JMP32 | MS_BPF_JA : MS_BPF_JMP | MS_BPF_JA};
  int32_t t;
  if (want_ops(a, l, 1) || parse_target(a, l->ops[0], wide, &t)) return -MS_E_FORMAT;
  if (wide) in.imm = t;
  else in.off = (int16_t)t;
  return emit(a, in);
}

/* lddw %rN, imm64 | map[i] | map[i]+off | mapidx[i] | mapidx[i]+off */
static int asm_lddw(struct assembler *a, const struct line *l) {
  struct ms_bpf_insn in[2] = {{.code = MS_BPF_LD | MS_BPF_IMM | MS_BPF_DW}, {0}};
  if (want_ops(a, l, 2) || parse_reg(a, l->ops[0], &in[0], DST)) return -MS_E_FORMAT;
  const char *s = l->ops[1];
  int idx_form = !strncmp(s, "mapidx[", 7);
  if (idx_form || !strncmp(s, "map[", 4)) {
    char *end;
    const char *p = s + (idx_form ? 7 : 4);
    errno = 0;
    unsigned long m = strtoul(p, &end, 10);
    if (end == p || *end != ']' || errno || m > INT32_MAX) return fail(a, "bad map reference '%s'", s);
    in[0].imm = (int32_t)m;
    in[0].src_reg = idx_form ? MS_BPF_PSEUDO_MAP_IDX : MS_BPF_PSEUDO_MAP_FD;
    if (end[1]) {
      in[0].src_reg = idx_form ? MS_BPF_PSEUDO_MAP_IDX_VALUE : MS_BPF_PSEUDO_MAP_VALUE;
      if (end[1] != '+' || parse_imm32(a, end + 2, &in[1].imm)) return fail(a, "bad map value reference '%s'", s);
    }
  } else {
    uint64_t v = 0;
    if (parse_imm64(a, s, &v)) return -MS_E_FORMAT;
    in[0].imm = (int32_t)(uint32_t)v;
    in[1].imm = (int32_t)(uint32_t)(v >> 32);
  }
  if (emit(a, in[0]) || emit(a, in[1])) return -ENOMEM;
  return 0;
}

static int asm_ldst(struct assembler *a, const struct line *l, int *handled) {
  static const char *const sizes[] = {"w", "h", "b", "dw"}; /* by MS_BPF_SIZE >> 3 */
  static const struct { const char *prefix; uint8_t code; } forms[] = {
      {"ldxs", MS_BPF_LDX | MS_BPF_MEMSX}, {"ldx", MS_BPF_LDX | MS_BPF_MEM},
      {"stx", MS_BPF_STX | MS_BPF_MEM},    {"st", MS_BPF_ST | MS_BPF_MEM}};
  for (size_t f = 0; f < sizeof forms / sizeof forms[0]; f++) {
    size_t k = strlen(forms[f].prefix);
    if (strncmp(l->mnem, forms[f].prefix, k)) continue;
    for (int s = 0; s < 4; s++) {
      if (strcmp(l->mnem + k, sizes[s])) continue;
      *handled = 1;
      struct ms_bpf_insn in = {.code = (uint8_t)(forms[f].code | s << 3)};
      if (want_ops(a, l, 2)) return -MS_E_FORMAT;
      int err = MS_BPF_CLASS(in.code) == MS_BPF_LDX
                    ? parse_reg(a, l->ops[0], &in, DST) || parse_mem(a, l->ops[1], &in, SRC)
                    : parse_mem(a, l->ops[0], &in, DST) ||
                          (MS_BPF_CLASS(in.code) == MS_BPF_STX ? parse_reg(a, l->ops[1], &in, SRC)
                                                               : parse_imm32(a, l->ops[1], &in.imm));
      return err ? -MS_E_FORMAT : emit(a, in);
    }
  }
  return *handled = 0;
}

/* lock [fetch] add|or|and|xor|xchg|cmpxchg[32] [%rN+off], %rM */
static int asm_lock(struct assembler *a, const struct line *l) {
  static const struct { const char *name; int imm; } ops[] = {
      {"add", MS_BPF_ADD}, {"or", MS_BPF_OR}, {"and", MS_BPF_AND}, {"xor", MS_BPF_XOR},
      {"xchg", MS_BPF_XCHG}, {"cmpxchg", MS_BPF_CMPXCHG}};
  int fetch = l->n_ops > 0 && !strcmp(l->ops[0], "fetch"), i = fetch;
  if (l->n_ops != 3 + fetch) return fail(a, "expected 'lock [fetch] OP [%%rN+off], %%rM'");
  char base[32];
  int is32;
  const char *op = strip_width(l->ops[i], base, sizeof base, &is32);
  struct ms_bpf_insn in = {.code = MS_BPF_STX | MS_BPF_ATOMIC | (is32 ? MS_BPF_W : MS_BPF_DW)};
  size_t k = 0;
  while (k < sizeof ops / sizeof ops[0] && strcmp(ops[k].name, op)) k++;
  if (k == sizeof ops / sizeof ops[0] || (fetch && ops[k].imm & MS_BPF_FETCH))
    return fail(a, "unknown atomic operation '%s%s'", fetch ? "fetch " : "", l->ops[i]);
  in.imm = ops[k].imm | (fetch ? MS_BPF_FETCH : 0);
  if (parse_mem(a, l->ops[i + 1], &in, DST) || parse_reg(a, l->ops[i + 2], &in, SRC))
    return -MS_E_FORMAT;
  return emit(a, in);
}

static int asm_raw(struct assembler *a, const struct line *l) {
  int neg;
  unsigned long long w;
  if (want_ops(a, l, 1)) return -MS_E_FORMAT;
  if (parse_num(l->ops[0], &neg, &w) || neg) return fail(a, ".insn wants a 64-bit word, got '%s'", l->ops[0]);
  struct ms_bpf_insn in;
  memcpy(&in, &w, sizeof in); /* the suite's -- raw words: little-endian */
  return emit(a, in);
}

static int asm_insn(struct assembler *a, const struct line *l) {
  const char *m = l->mnem;
  int handled = 0, err;
  if (!strcmp(m, "exit")) {
    if (want_ops(a, l, 0)) return -MS_E_FORMAT;
    if (a->first_exit < 0) a->first_exit = (long)a->n;
    return emit(a, (struct ms_bpf_insn){.code = MS_BPF_JMP | MS_BPF_EXIT});
  }
  if (!strcmp(m, "ja") || !strcmp(m, "ja32")) return asm_ja(a, l, m[2] == '3');
  if (!strcmp(m, "call")) return asm_call(a, l);
  if (!strcmp(m, "lddw")) return asm_lddw(a, l);
  if (!strcmp(m, "lock")) return asm_lock(a, l);
  if (!strcmp(m, ".insn")) return asm_raw(a, l);
  if ((err = asm_endian(a, l, &handled)) || handled) return err;
  if ((err = asm_ldst(a, l, &handled)) || handled) return err;
  if ((err = asm_jmp(a, l, &handled)) || handled) return err;
  if ((err = asm_alu(a, l, &handled)) || handled) return err;
  return fail(a, "unknown mnemonic '%s'", m);
}

/* ---- lines and labels --------------------------------------------------- */

/* Splits text (modified in place) into l. */
static int split_line(struct assembler *a, char *text, struct line *l) {
  char *w = text;
  int depth = 0;
  for (char *r = text; *r; r++) { /* drop blanks inside brackets */
    if (*r == '[') depth++;
    if (*r == ']') depth--;
    if (depth > 0 && isspace((unsigned char)*r)) continue;
    *w++ = *r;
  }
  *w = 0;
  char *save = NULL;
  l->n_ops = 0;
  l->mnem = strtok_r(text, " \t,", &save);
  for (char *t; (t = strtok_r(NULL, " \t,", &save));) {
    if (l->n_ops == MAX_OPERANDS) return fail(a, "too many operands");
    l->ops[l->n_ops++] = t;
  }
  return 0;
}

static int add_label(struct assembler *a, const char *name) {
  if (!*name || strlen(name) >= LABEL_MAX) return fail(a, "bad label '%s'", name);
  for (size_t i = 0; i < a->n_labels; i++)
    if (!strcmp(a->labels[i].name, name)) return fail(a, "label '%s' defined twice", name);
  if (grow((void **)&a->labels, &a->cap_labels, a->n_labels + 1, sizeof *a->labels)) return -ENOMEM;
  strcpy(a->labels[a->n_labels].name, name);
  a->labels[a->n_labels++].at = a->n;
  return 0;
}

static int asm_line(struct assembler *a, char *text) {
  char *hash = strchr(text, '#');
  if (hash) *hash = 0;
  struct line l;
  int err = split_line(a, text, &l);
  if (err || !l.mnem) return err;
  size_t len = strlen(l.mnem);
  if (l.mnem[len - 1] == ':') { /* a label, perhaps followed by an instruction */
    l.mnem[len - 1] = 0;
    if ((err = add_label(a, l.mnem)) || l.n_ops == 0) return err;
    l.mnem = l.ops[0];
    memmove(l.ops, l.ops + 1, --l.n_ops * sizeof l.ops[0]);
  }
  return asm_insn(a, &l);
}

static int resolve(struct assembler *a) {
  for (size_t i = 0; i < a->n_fixups; i++) {
    const struct fixup *f = &a->fixups[i];
    long at = -1;
    for (size_t j = 0; j < a->n_labels && at < 0; j++)
      if (!strcmp(a->labels[j].name, f->name)) at = (long)a->labels[j].at;
    if (at < 0 && !strcmp(f->name, "exit")) at = a->first_exit;
    a->line = f->line;
    if (at < 0) return fail(a, "unknown label '%s'", f->name);
    long delta = at - (long)f->insn - 1;
    if (f->wide) {
      a->out[f->insn].imm = (int32_t)delta;
    } else {
      if (delta < INT16_MIN || delta > INT16_MAX) return fail(a, "label '%s' is too far for a 16-bit offset", f->name);
      a->out[f->insn].off = (int16_t)delta;
    }
  }
  return 0;
}

int ms_bpf_asm(const char *text, struct ms_bpf_insn **out, size_t *n_out, struct ms_textbuf *log) {
  struct assembler a = {.first_exit = -1, .log = log};
  *out = NULL;
  *n_out = 0;
  char *copy = strdup(text ? text : "");
  if (!copy) return -ENOMEM;
  int err = 0;
  char *p = copy;
  for (a.line = 1; p && !err; a.line++) {
    char *nl = strchr(p, '\n');
    if (nl) *nl = 0;
    err = asm_line(&a, p);
    p = nl ? nl + 1 : NULL;
  }
  if (!err) err = resolve(&a);
  if (!err && a.n == 0) {
    ms_textbuf_printf(log, "no instructions\n");
    err = -MS_E_FORMAT;
  }
  free(copy);
  free(a.labels);
  free(a.fixups);
  if (err) {
    free(a.out);
    return err;
  }
  *out = a.out;
  *n_out = a.n;
  return 0;
}

int ms_bpf_asm_line(const char *line, struct ms_bpf_insn out[2], size_t *n_out) {
  struct ms_bpf_insn *insns;
  int err = ms_bpf_asm(line, &insns, n_out, NULL);
  if (err) return err;
  if (*n_out > 2) {
    free(insns);
    return -MS_E_FORMAT;
  }
  memcpy(out, insns, *n_out * sizeof *insns);
  free(insns);
  return 0;
}
