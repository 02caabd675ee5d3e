/* SPDX-License-Identifier: MIT */
/* The query language's code generator: a parsed query to eBPF programs and
 * map definitions, names resolved through the schema on the way.
 *
 * One program per probe and hook. r6 holds the context for the program's
 * life; expressions evaluate into a stack of nine registers (r0-r5, r7-r9: no
 * helper is called while an expression is live), each value a u64 (the tile
 * fields are s32, sign-extended, and make what they touch signed). A statement
 * stores its keys and its value on the stack, finds the key's value in its
 * per-worker map, inserting a zero value first when absent (from a read-only
 * one-entry map as large as the largest value: a histogram's value is larger
 * than the stack), and adds into it with atomic adds (request hooks share
 * worker 0's slot with worker 0's own tasks, so even per-worker values can be
 * written by two threads; min and max keep a plain compare and store, the one
 * place such a race can lose an update). A key that finds its map full is
 * counted in a drop counter that the read-out prints: nothing is lost without
 * being counted.
 *
 * record() writes its values (u64 each) as one ring-buffer record; a full
 * ring drops the record, and the engine counts it in the coverage's `lost`.
 *
 * Stack: keys at fp-32..fp-1 (8 bytes each), the value at fp-40, a zero u64
 * (the array key 0) at fp-48, record() values from fp-144 up. */
#include <errno.h>
#include <fnmatch.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "query/query_impl.h"

#define FP_KEYBUF (-32)
#define FP_VAL (-40)
#define FP_ZEROKEY (-48)
#define FP_REC (-48 - 8 * Q_MAX_FIELDS) /* record() values, upward */
#define R_CTX 6
#define N_POOL 9
static const int pool[N_POOL] = {0, 1, 2, 3, 4, 5, 7, 8, 9};

struct fix {
  size_t at;
  int label;
};

struct gen {
  struct ms_query *q;
  const struct ms_query_schema *s;
  int hook;         /* where the program runs */
  int as_written;   /* the hook the probe names (dep_wait when rewritten) */
  int wait_rewrite; /* a dep_wait probe that reads wait_ns: runs at task_begin */
  struct ms_bpf_insn *code;
  size_t n, cap;
  size_t *labels;   /* position of each label, SIZE_MAX until bound */
  int n_labels, cap_labels;
  struct fix *fixes;
  size_t n_fixes, cap_fixes;
  struct ms_textbuf *log;
  int err;
};

__attribute__((format(printf, 3, 4))) static int fail(struct gen *g, int col, const char *fmt, ...) {
  if (g->err) return g->err;
  char msg[600];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  ms_textbuf_printf(g->log, "column %d: %s\n", col, msg);
  return g->err = -EINVAL;
}

/* ---- emitting ---- */

static void emit(struct gen *g, uint8_t code, int dst, int src, int16_t off, int32_t imm) {
  if (g->err) return;
  if (g->n == g->cap) {
    size_t cap = g->cap ? 2 * g->cap : 256;
    struct ms_bpf_insn *c = realloc(g->code, cap * sizeof *c);
    if (!c) {
      g->err = -ENOMEM;
      return;
    }
    g->code = c;
    g->cap = cap;
  }
  g->code[g->n++] = (struct ms_bpf_insn){.code = code, .dst_reg = (uint8_t)dst, .src_reg = (uint8_t)src,
                                         .off = off, .imm = imm};
}

#define ALU64(op, src) (MS_BPF_ALU64 | (op) | (src))
static void mov_imm(struct gen *g, int r, int64_t v) {
  if (v >= INT32_MIN && v <= INT32_MAX) {
    emit(g, ALU64(MS_BPF_MOV, MS_BPF_K), r, 0, 0, (int32_t)v);
    return;
  }
  emit(g, MS_BPF_LD | MS_BPF_IMM | MS_BPF_DW, r, 0, 0, (int32_t)(uint32_t)v);
  emit(g, 0, 0, 0, 0, (int32_t)(uint32_t)((uint64_t)v >> 32));
}
static void mov_reg(struct gen *g, int d, int s) { emit(g, ALU64(MS_BPF_MOV, MS_BPF_X), d, s, 0, 0); }
static void alu_imm(struct gen *g, int op, int r, int32_t v) { emit(g, ALU64(op, MS_BPF_K), r, 0, 0, v); }
static void alu_reg(struct gen *g, int op, int d, int s) { emit(g, ALU64(op, MS_BPF_X), d, s, 0, 0); }
static void ld_map(struct gen *g, int r, int map) {
  emit(g, MS_BPF_LD | MS_BPF_IMM | MS_BPF_DW, r, MS_BPF_PSEUDO_MAP_FD, 0, map);
  emit(g, 0, 0, 0, 0, 0);
}
static void ldx(struct gen *g, int size, int d, int s, int16_t off) { emit(g, MS_BPF_LDX | MS_BPF_MEM | size, d, s, off, 0); }
static void stx(struct gen *g, int d, int16_t off, int s) { emit(g, MS_BPF_STX | MS_BPF_MEM | MS_BPF_DW, d, s, off, 0); }
static void atomic_add(struct gen *g, int d, int16_t off, int s) {
  emit(g, MS_BPF_STX | MS_BPF_ATOMIC | MS_BPF_DW, d, s, off, MS_BPF_ADD);
}
static void call(struct gen *g, int32_t id) { emit(g, MS_BPF_JMP | MS_BPF_CALL, 0, 0, 0, id); }

static int label(struct gen *g) {
  if (g->n_labels == g->cap_labels) {
    int cap = g->cap_labels ? 2 * g->cap_labels : 64;
    size_t *l = realloc(g->labels, (size_t)cap * sizeof *l);
    if (!l) {
      g->err = -ENOMEM;
      return 0;
    }
    g->labels = l;
    g->cap_labels = cap;
  }
  g->labels[g->n_labels] = SIZE_MAX;
  return g->n_labels++;
}
static void bind(struct gen *g, int l) {
  if (!g->err) g->labels[l] = g->n;
}
/* A jump to label l: op MS_BPF_JA, or a conditional one against imm or a register. */
static void jump(struct gen *g, int op, int r, int src_is_reg, int64_t rhs, int l) {
  if (g->err) return;
  if (g->n_fixes == g->cap_fixes) {
    size_t cap = g->cap_fixes ? 2 * g->cap_fixes : 64;
    struct fix *f = realloc(g->fixes, cap * sizeof *f);
    if (!f) {
      g->err = -ENOMEM;
      return;
    }
    g->fixes = f;
    g->cap_fixes = cap;
  }
  g->fixes[g->n_fixes++] = (struct fix){g->n, l};
  if (src_is_reg) emit(g, MS_BPF_JMP | op | MS_BPF_X, r, (int)rhs, 0, 0);
  else emit(g, MS_BPF_JMP | op | MS_BPF_K, r, 0, 0, (int32_t)rhs);
}
static int resolve_jumps(struct gen *g) {
  for (size_t i = 0; !g->err && i < g->n_fixes; i++) {
    int64_t d = (int64_t)g->labels[g->fixes[i].label] - (int64_t)g->fixes[i].at - 1;
    if (d < INT16_MIN || d > INT16_MAX) return fail(g, 1, "the generated program is too long to jump across");
    g->code[g->fixes[i].at].off = (int16_t)d;
  }
  return g->err;
}

/* r = cond ? 1 : 0, for a condition already emitted as a jump to t. */
static void materialize(struct gen *g, int r, int t) {
  int end = label(g);
  mov_imm(g, r, 0);
  jump(g, MS_BPF_JA, 0, 0, 0, end);
  bind(g, t);
  mov_imm(g, r, 1);
  bind(g, end);
}

/* ---- names ---- */

struct idset {
  uint32_t *ids;
  size_t n;
};

static int set_add(struct gen *g, struct idset *s, uint32_t id) {
  uint32_t *v = realloc(s->ids, (s->n + 1) * sizeof *v);
  if (!v) return g->err = -ENOMEM;
  s->ids = v;
  s->ids[s->n++] = id;
  return 0;
}

static int cmp_u32(const void *a, const void *b) {
  uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
  return x < y ? -1 : x > y;
}

/* r = (r in set) != negate. Consecutive ids become one range test. */
static void set_test(struct gen *g, int r, struct idset *s, int negate) {
  qsort(s->ids, s->n, sizeof *s->ids, cmp_u32);
  int yes = label(g), end = label(g);
  for (size_t i = 0; i < s->n;) {
    size_t j = i;
    while (j + 1 < s->n && s->ids[j + 1] <= s->ids[j] + 1) j++;
    if (s->ids[i] == s->ids[j]) {
      jump(g, MS_BPF_JEQ, r, 0, s->ids[i], yes);
    } else {
      int skip = label(g);
      jump(g, MS_BPF_JLT, r, 0, s->ids[i], skip);
      jump(g, MS_BPF_JLE, r, 0, s->ids[j], yes);
      bind(g, skip);
    }
    i = j + 1;
  }
  mov_imm(g, r, negate);
  jump(g, MS_BPF_JA, 0, 0, 0, end);
  bind(g, yes);
  mov_imm(g, r, !negate);
  bind(g, end);
}

/* The ABI's enums by field, with the hook where names differ (phase). */
struct enum_name {
  int field, hook; /* hook -1: any */
  const char *name;
  uint32_t value;
};
static const struct enum_name enum_names[] = {
    {MS_F_PHASE, MS_HOOK_STEP, "begin", MS_STEP_BEGIN},
    {MS_F_PHASE, MS_HOOK_STEP, "end", MS_STEP_END},
    {MS_F_PHASE, MS_HOOK_REQUEST, "admitted", MS_REQ_ADMITTED},
    {MS_F_PHASE, MS_HOOK_REQUEST, "first_token", MS_REQ_FIRST_TOKEN},
    {MS_F_PHASE, MS_HOOK_REQUEST, "token", MS_REQ_TOKEN},
    {MS_F_PHASE, MS_HOOK_REQUEST, "finished", MS_REQ_FINISHED},
    {MS_F_WAIT_REASON, -1, "dependency", MS_WAIT_DEPENDENCY},
    {MS_F_WAIT_REASON, -1, "step_end", MS_WAIT_STEP_END},
    {MS_F_LAUNCH_MODE, -1, "aot", MS_LAUNCH_MODE_AOT},
    {MS_F_LAUNCH_MODE, -1, "jit", MS_LAUNCH_MODE_JIT},
    {MS_F_QUEUE_KIND, -1, "jit", MS_QUEUE_JIT},
    {MS_F_QUEUE_KIND, -1, "mailbox", MS_QUEUE_MAILBOX},
    {MS_F_COMM_PHASE, -1, "issue", MS_COMM_ISSUE},
    {MS_F_COMM_PHASE, -1, "complete", MS_COMM_COMPLETE},
};

const char *ms_query_enum_name(int field, int hook, uint64_t v) {
  for (size_t i = 0; i < sizeof enum_names / sizeof *enum_names; i++) {
    const struct enum_name *e = &enum_names[i];
    if (e->field == field && (e->hook < 0 || e->hook == hook) && e->value == v) return e->name;
  }
  if (field == MS_F_HOOK && v < MS_HOOK_COUNT) return ms_hook_name((int)v);
  return NULL;
}

static int named_field(int f) {
  return f == MS_F_TASK_CLASS || f == MS_F_EVENT_CLASS || f == MS_F_OP || f == MS_F_HOOK || f == MS_F_PHASE ||
         f == MS_F_WAIT_REASON || f == MS_F_LAUNCH_MODE || f == MS_F_QUEUE_KIND || f == MS_F_COMM_PHASE;
}

/* The ids a name (or a glob, when glob) stands for in field f's domain, into
 * *s. For op: task-class ids (*via_class set) when the name is an op of the
 * schema, else op ids of a kernel of that name. 0 when found, 1 when not. */
static int name_ids(struct gen *g, int f, const char *name, int glob, struct idset *s, int *via_class) {
  const struct ms_query_schema *sc = g->s;
  *via_class = 0;
#define MATCH(x) ((x) && (glob ? !fnmatch(name, (x), 0) : !strcmp(name, (x))))
  if (f == MS_F_TASK_CLASS) {
    for (size_t i = 0; i < sc->n_classes; i++)
      if (MATCH(sc->classes[i].name) && set_add(g, s, sc->classes[i].id)) return g->err;
  } else if (f == MS_F_EVENT_CLASS) {
    for (size_t i = 0; i < sc->n_evclasses; i++)
      if (MATCH(sc->evclasses[i]) && set_add(g, s, (uint32_t)i)) return g->err;
  } else if (f == MS_F_OP) {
    for (size_t i = 0; i < sc->n_classes; i++)
      if (MATCH(sc->classes[i].op) && set_add(g, s, sc->classes[i].id)) return g->err;
    *via_class = s->n > 0;
    for (size_t i = 0; !s->n && i < sc->n_classes; i++)
      if (MATCH(sc->classes[i].kernel) && set_add(g, s, sc->classes[i].kernel_id)) return g->err;
  } else if (f == MS_F_HOOK) {
    for (int h = 0; h < MS_HOOK_COUNT; h++)
      if (MATCH(ms_hook_name(h)) && set_add(g, s, (uint32_t)h)) return g->err;
  } else {
    for (size_t i = 0; i < sizeof enum_names / sizeof *enum_names; i++) {
      const struct enum_name *e = &enum_names[i];
      if (e->field == f && (e->hook < 0 || e->hook == g->as_written) && MATCH(e->name) && set_add(g, s, e->value))
        return g->err;
    }
  }
#undef MATCH
  return s->n ? 0 : 1;
}

/* "a, b, c" of the names of field f's domain, for a refusal. */
static void domain_names(struct gen *g, int f, char *out, size_t size) {
  const struct ms_query_schema *sc = g->s;
  size_t len = 0;
  out[0] = 0;
#define ADD(x)                                                                     \
  do {                                                                             \
    if (len + 16 < size) len += (size_t)snprintf(out + len, size - len, "%s%s", len ? ", " : "", (x)); \
  } while (0)
  if (f == MS_F_TASK_CLASS)
    for (size_t i = 0; i < sc->n_classes; i++) ADD(sc->classes[i].name);
  else if (f == MS_F_EVENT_CLASS)
    for (size_t i = 0; i < sc->n_evclasses; i++) {
      if (sc->evclasses[i]) ADD(sc->evclasses[i]);
    }
  else if (f == MS_F_OP)
    for (size_t i = 0; i < sc->n_classes; i++) {
      int seen = 0;
      for (size_t j = 0; j < i; j++) seen |= !strcmp(sc->classes[j].op, sc->classes[i].op);
      if (!seen) ADD(sc->classes[i].op);
    }
  else if (f == MS_F_HOOK)
    for (int h = 0; h < MS_HOOK_COUNT; h++) ADD(ms_hook_name(h));
  else
    for (size_t i = 0; i < sizeof enum_names / sizeof *enum_names; i++)
      if (enum_names[i].field == f && (enum_names[i].hook < 0 || enum_names[i].hook == g->as_written))
        ADD(enum_names[i].name);
  if (len + 16 >= size && size > 4) snprintf(out + size - 5, 5, "...");
#undef ADD
}

/* ---- fields ---- */

static uint64_t hook_mask(struct gen *g) {
  if (g->wait_rewrite) return ms_hook_field_mask[MS_HOOK_DEP_WAIT] | MS_FB(MS_F_WAIT_NS);
  return ms_hook_field_mask[g->hook];
}

static int check_field(struct gen *g, int f, int col) {
  if (hook_mask(g) & MS_FB(f)) return 0;
  char all[700] = "";
  size_t len = 0;
  for (int i = 0; i < MS_F_COUNT; i++)
    if ((hook_mask(g) & MS_FB(i)) && i != MS_F_RESERVED0 && len + 24 < sizeof all)
      len += (size_t)snprintf(all + len, sizeof all - len, "%s%s", len ? ", " : "", ms_query_field_name(i));
  return fail(g, col, "field '%s' is not defined for hook '%s' (its fields: %s)", ms_query_field_name(f),
              ms_hook_name(g->as_written), all);
}

static int load_field(struct gen *g, int f, int r, int col) {
  if (check_field(g, f, col)) return g->err;
  if (f == MS_F_EVENT_CLASS) g->q->uses_evclass = 1;  /* the bundle then vouches for the event class ids too */
  if (g->wait_rewrite && f == MS_F_WAIT_REASON) { /* seen at its task's begin: a dependency wait */
    mov_imm(g, r, MS_WAIT_DEPENDENCY);
    return 0;
  }
  const struct ms_verify_field *d = &ms_hook_fields[f];
  ldx(g, d->size == 8 ? MS_BPF_DW : d->size == 2 ? MS_BPF_H : MS_BPF_W, r, R_CTX, (int16_t)d->offset);
  if (ms_query_field_signed(f)) {
    alu_imm(g, MS_BPF_LSH, r, 32);
    alu_imm(g, MS_BPF_ARSH, r, 32);
  }
  return 0;
}

/* ---- expressions ---- */

/* Flags of an evaluated expression. */
#define V_SIGNED 1

static int gen_expr(struct gen *g, const struct q_node *n, int d);

static int is_name_side(struct gen *g, const struct q_node *field, const struct q_node *other) {
  if (field->kind != Q_FIELD || !named_field(field->field)) return 0;
  if (other->kind == Q_NAME) return 1;
  if (other->kind != Q_FIELD || !other->text) return 0;
  /* "phase == token": an identifier in the field's domain is the name, not the field */
  struct idset s = {0};
  int via;
  int found = name_ids(g, field->field, other->text, 0, &s, &via) == 0;
  free(s.ids);
  return found;
}

/* field ==/!= name, or field =~ glob: a set test. */
static int gen_name_cmp(struct gen *g, const struct q_node *field, const char *name, int glob, int negate, int col,
                        int d) {
  struct idset s = {0};
  int via_class = 0;
  int f = field->field;
  if (check_field(g, f, field->col)) return g->err;
  int rc = name_ids(g, f, name, glob, &s, &via_class);
  if (rc == 1) {
    char all[600];
    domain_names(g, f, all, sizeof all);
    const char *what = f == MS_F_TASK_CLASS    ? "task class"
                       : f == MS_F_EVENT_CLASS ? "event class"
                       : f == MS_F_OP          ? "op or kernel"
                                               : ms_query_field_name(f);
    const char *whats = f == MS_F_TASK_CLASS    ? "task classes"
                        : f == MS_F_EVENT_CLASS ? "event classes"
                        : f == MS_F_OP          ? "ops"
                                                : NULL;
    char plural[64];
    if (!whats) snprintf(plural, sizeof plural, "%ss", what), whats = plural;
    if (glob) fail(g, col, "pattern '%s' matches no %s (%s: %s)", name, what, whats, all);
    else fail(g, col, "'%s' is not a %s (%s: %s)", name, what, whats, all);
  }
  if (!rc) {
    int src = via_class ? MS_F_TASK_CLASS : f;
    if (!load_field(g, src, pool[d], field->col)) set_test(g, pool[d], &s, negate);
  }
  free(s.ids);
  return g->err;
}

static int jmp_op(int op, int sgn) {
  switch (op) {
  case Q_OP_EQ: return MS_BPF_JEQ;
  case Q_OP_NE: return MS_BPF_JNE;
  case Q_OP_LT: return sgn ? MS_BPF_JSLT : MS_BPF_JLT;
  case Q_OP_LE: return sgn ? MS_BPF_JSLE : MS_BPF_JLE;
  case Q_OP_GT: return sgn ? MS_BPF_JSGT : MS_BPF_JGT;
  default: return sgn ? MS_BPF_JSGE : MS_BPF_JGE;
  }
}

static int alu_op(int op) {
  static const int ops[] = {[Q_OP_ADD] = MS_BPF_ADD, [Q_OP_SUB] = MS_BPF_SUB, [Q_OP_MUL] = MS_BPF_MUL,
                            [Q_OP_DIV] = MS_BPF_DIV, [Q_OP_MOD] = MS_BPF_MOD, [Q_OP_AND] = MS_BPF_AND,
                            [Q_OP_OR] = MS_BPF_OR,   [Q_OP_XOR] = MS_BPF_XOR, [Q_OP_SHL] = MS_BPF_LSH,
                            [Q_OP_SHR] = MS_BPF_RSH};
  return ops[op];
}

static int gen_logic(struct gen *g, const struct q_node *n, int d) {
  int r = pool[d], out = label(g), end = label(g);
  int is_and = n->op == Q_OP_LAND;
  if (gen_expr(g, n->a, d) < 0) return g->err;
  jump(g, is_and ? MS_BPF_JEQ : MS_BPF_JNE, r, 0, 0, out);
  if (gen_expr(g, n->b, d) < 0) return g->err;
  jump(g, is_and ? MS_BPF_JEQ : MS_BPF_JNE, r, 0, 0, out);
  mov_imm(g, r, is_and);
  jump(g, MS_BPF_JA, 0, 0, 0, end);
  bind(g, out);
  mov_imm(g, r, !is_and);
  bind(g, end);
  return 0;
}

static int gen_binary(struct gen *g, const struct q_node *n, int d) {
  int op = n->op, r = pool[d];
  if (op == Q_OP_LAND || op == Q_OP_LOR) return gen_logic(g, n, d);
  if (op == Q_OP_EQ || op == Q_OP_NE) {
    if (is_name_side(g, n->a, n->b)) return gen_name_cmp(g, n->a, n->b->text, 0, op == Q_OP_NE, n->b->col, d);
    if (is_name_side(g, n->b, n->a)) return gen_name_cmp(g, n->b, n->a->text, 0, op == Q_OP_NE, n->a->col, d);
  }
  if (d + 1 >= N_POOL) return fail(g, n->col, "expression nested too deeply");
  int fa = gen_expr(g, n->a, d);
  if (fa < 0) return g->err;
  int fb;
  const struct q_node *b = n->b;
  int imm = b->kind == Q_NUM && b->u <= INT32_MAX;
  if (imm) fb = 0;
  else if ((fb = gen_expr(g, b, d + 1)) < 0) return g->err;
  int sgn = (fa | fb) & V_SIGNED;
  if (op >= Q_OP_EQ) {
    int t = label(g);
    jump(g, jmp_op(op, sgn), r, !imm, imm ? (int64_t)b->u : pool[d + 1], t);
    materialize(g, r, t);
    return 0;
  }
  if ((op == Q_OP_DIV || op == Q_OP_MOD) && imm && b->u == 0) return fail(g, b->col, "division by zero");
  int16_t off = (int16_t)(sgn && (op == Q_OP_DIV || op == Q_OP_MOD)); /* sdiv / smod */
  int code = alu_op(op);
  if (op == Q_OP_SHR && sgn) code = MS_BPF_ARSH;
  if (imm) emit(g, ALU64(code, MS_BPF_K), r, 0, off, (int32_t)b->u);
  else emit(g, ALU64(code, MS_BPF_X), r, pool[d + 1], off, 0);
  return sgn;
}

static int gen_expr(struct gen *g, const struct q_node *n, int d) {
  int r = pool[d];
  if (g->err) return g->err;
  switch (n->kind) {
  case Q_NUM: mov_imm(g, r, (int64_t)n->u); return 0;
  case Q_FIELD:
    if (load_field(g, n->field, r, n->col)) return g->err;
    return ms_query_field_signed(n->field) ? V_SIGNED : 0;
  case Q_NAME:
    return fail(g, n->col, "'%s' is neither a field of hook '%s' nor compared with one (class == %s)", n->text,
                ms_hook_name(g->as_written), n->text);
  case Q_MATCH:
    if (n->a->kind != Q_FIELD || !(n->a->field == MS_F_TASK_CLASS || n->a->field == MS_F_EVENT_CLASS ||
                                   n->a->field == MS_F_OP || n->a->field == MS_F_HOOK))
      return fail(g, n->col, "'=~' matches names: class, event_class, op or hook on its left");
    return gen_name_cmp(g, n->a, n->text, 1, n->negate, n->col, d) ? g->err : 0;
  case Q_UNARY: {
    int f = gen_expr(g, n->a, d);
    if (f < 0) return f;
    if (n->op == '-') alu_imm(g, MS_BPF_NEG, r, 0);
    else if (n->op == '~') alu_imm(g, MS_BPF_XOR, r, -1);
    else {
      int t = label(g);
      jump(g, MS_BPF_JEQ, r, 0, 0, t);
      materialize(g, r, t);
      return 0;
    }
    return n->op == '-' ? V_SIGNED : f;
  }
  case Q_BINARY: return gen_binary(g, n, d);
  }
  return fail(g, n->col, "internal: unknown node");
}

/* ---- statements ---- */

static void gen_drop(struct gen *g, int drops_map) {
  int end = label(g);
  ld_map(g, 1, drops_map);
  mov_reg(g, 2, 10);
  alu_imm(g, MS_BPF_ADD, 2, FP_ZEROKEY);
  call(g, MS_BPF_FN_MAP_LOOKUP_ELEM);
  jump(g, MS_BPF_JEQ, 0, 0, 0, end);
  mov_imm(g, 1, 1);
  atomic_add(g, 0, 0, 1);
  bind(g, end);
}

/* r7 = the value of the key on the stack, inserted zero when absent; jumps to
 * drop when the map is full. An array map is indexed by the key's low 32 bits
 * (an index past its end finds nothing: dropped and counted). */
static void gen_find(struct gen *g, const struct q_map *m, int map, int zero_map, int drop) {
  int have = label(g);
  if (m->array_size) {
    ld_map(g, 1, map);
    mov_reg(g, 2, 10);
    alu_imm(g, MS_BPF_ADD, 2, FP_KEYBUF);
    call(g, MS_BPF_FN_MAP_LOOKUP_ELEM);
    jump(g, MS_BPF_JEQ, 0, 0, 0, drop);
    mov_reg(g, 7, 0);
    return;
  }
  int key_off = m->n_keys ? FP_KEYBUF : FP_ZEROKEY;
  ld_map(g, 1, map);
  mov_reg(g, 2, 10);
  alu_imm(g, MS_BPF_ADD, 2, key_off);
  call(g, MS_BPF_FN_MAP_LOOKUP_ELEM);
  jump(g, MS_BPF_JNE, 0, 0, 0, have);
  if (m->n_keys) {
    ld_map(g, 1, zero_map);
    mov_reg(g, 2, 10);
    alu_imm(g, MS_BPF_ADD, 2, FP_ZEROKEY);
    call(g, MS_BPF_FN_MAP_LOOKUP_ELEM);
    jump(g, MS_BPF_JEQ, 0, 0, 0, drop);
    mov_reg(g, 3, 0);
    ld_map(g, 1, map);
    mov_reg(g, 2, 10);
    alu_imm(g, MS_BPF_ADD, 2, key_off);
    mov_imm(g, 4, MS_BPF_NOEXIST);
    call(g, MS_BPF_FN_MAP_UPDATE_ELEM); /* -EEXIST when another thread got there first: fine */
    ld_map(g, 1, map);
    mov_reg(g, 2, 10);
    alu_imm(g, MS_BPF_ADD, 2, key_off);
    call(g, MS_BPF_FN_MAP_LOOKUP_ELEM);
    jump(g, MS_BPF_JNE, 0, 0, 0, have);
  }
  jump(g, MS_BPF_JA, 0, 0, 0, drop);
  bind(g, have);
  mov_reg(g, 7, 0);
}

/* r8 = min(r8, max_idx); then one more into bucket r8 of the value at r7. */
static void bucket_add(struct gen *g, int32_t max_idx) {
  int ok = label(g);
  jump(g, MS_BPF_JLE, 8, 0, max_idx, ok);
  mov_imm(g, 8, max_idx);
  bind(g, ok);
  alu_imm(g, MS_BPF_LSH, 8, 3);
  mov_reg(g, 1, 7);
  alu_reg(g, MS_BPF_ADD, 1, 8);
  mov_imm(g, 2, 1);
  atomic_add(g, 1, 0, 2);
}

static void gen_minmax(struct gen *g, const struct q_map *m) {
  int set = label(g), skip = label(g);
  ldx(g, MS_BPF_DW, 1, 10, FP_VAL);
  ldx(g, MS_BPF_DW, 2, 7, 0);
  jump(g, MS_BPF_JEQ, 2, 0, 0, set);
  ldx(g, MS_BPF_DW, 3, 7, 8);
  int keep = m->agg == Q_AGG_MIN ? (m->arg_signed ? MS_BPF_JSGE : MS_BPF_JGE) : (m->arg_signed ? MS_BPF_JSLE : MS_BPF_JLE);
  jump(g, keep, 1, 1, 3, skip);
  bind(g, set);
  stx(g, 7, 8, 1);
  bind(g, skip);
  mov_imm(g, 1, 1);
  atomic_add(g, 7, 0, 1);
}

static void gen_hist(struct gen *g) {
  int z = label(g);
  ldx(g, MS_BPF_DW, 1, 10, FP_VAL);
  mov_imm(g, 8, 0);
  jump(g, MS_BPF_JEQ, 1, 0, 0, z);
  call(g, MS_HELPER_LOG2);
  mov_reg(g, 8, 0);
  alu_imm(g, MS_BPF_ADD, 8, 1);
  bind(g, z);
  bucket_add(g, Q_HIST_BUCKETS - 1);
}

static int gen_lhist(struct gen *g, const struct q_map *m) {
  int64_t nb = (m->hi - m->lo + m->step - 1) / m->step;
  int done = label(g);
  int s = m->arg_signed;
  if (m->lo < INT32_MIN || m->hi > INT32_MAX || m->step > INT32_MAX) return fail(g, m->col, "lhist bounds must fit 32 bits");
  ldx(g, MS_BPF_DW, 1, 10, FP_VAL);
  mov_imm(g, 8, 0);
  jump(g, s || m->lo < 0 ? MS_BPF_JSLT : MS_BPF_JLT, 1, 0, m->lo, done);
  mov_imm(g, 8, nb + 1);
  jump(g, s || m->lo < 0 ? MS_BPF_JSGE : MS_BPF_JGE, 1, 0, m->hi, done);
  alu_imm(g, MS_BPF_SUB, 1, (int32_t)m->lo);
  alu_imm(g, MS_BPF_DIV, 1, (int32_t)m->step);
  mov_reg(g, 8, 1);
  alu_imm(g, MS_BPF_ADD, 8, 1);
  bind(g, done);
  bucket_add(g, (int32_t)nb + 1);
  return 0;
}

static void gen_quantile(struct gen *g) {
  int done = label(g);
  ldx(g, MS_BPF_DW, 1, 10, FP_VAL);
  mov_reg(g, 8, 1);
  jump(g, MS_BPF_JLT, 1, 0, 16, done);
  call(g, MS_HELPER_LOG2); /* e = floor(log2 v), 4..63 */
  ldx(g, MS_BPF_DW, 1, 10, FP_VAL);
  mov_reg(g, 2, 0);
  alu_imm(g, MS_BPF_SUB, 2, 4);
  alu_reg(g, MS_BPF_RSH, 1, 2);
  alu_imm(g, MS_BPF_AND, 1, Q_SKETCH_SUB - 1); /* the four bits after the leading one */
  mov_reg(g, 8, 0);
  alu_imm(g, MS_BPF_SUB, 8, 4);
  alu_imm(g, MS_BPF_LSH, 8, 4);
  alu_reg(g, MS_BPF_ADD, 8, 1);
  alu_imm(g, MS_BPF_ADD, 8, 16);
  bind(g, done);
  bucket_add(g, Q_SKETCH_BUCKETS - 1);
}

static int key_kind(const struct q_node *k, enum q_key_kind *kind, int *field) {
  *field = -1;
  *kind = Q_KEY_NUM;
  if (k->kind != Q_FIELD) return 0;
  *field = k->field;
  switch (k->field) {
  case MS_F_TASK_CLASS: *kind = Q_KEY_CLASS; break;
  case MS_F_EVENT_CLASS: *kind = Q_KEY_EVCLASS; break;
  case MS_F_OP: *kind = Q_KEY_OP; break;
  case MS_F_HOOK: *kind = Q_KEY_HOOK; break;
  default:
    if (named_field(k->field)) *kind = Q_KEY_ENUM;
    else if (ms_query_field_signed(k->field)) *kind = Q_KEY_SIGNED;
  }
  return 0;
}

/* A map of one key whose values the schema bounds (a class, an event class,
 * an op, a hook, an enum) is an array indexed by it: a lookup the JIT inlines
 * and no insertion. Not for sum(), whose written-but-zero entries an array
 * could not tell from entries never written. */
static uint32_t array_size(const struct gen *g, const struct q_map *m) {
  if (m->n_keys != 1 || m->agg == Q_AGG_SUM || g->q->max_keys) return 0;
  const struct ms_query_schema *s = g->s;
  uint32_t n = 0;
  switch (m->key_kind[0]) {
  case Q_KEY_CLASS:
    for (size_t i = 0; i < s->n_classes; i++)
      if (s->classes[i].id + 1 > n) n = s->classes[i].id + 1;
    break;
  case Q_KEY_OP:
    for (size_t i = 0; i < s->n_classes; i++)
      if (s->classes[i].kernel_id != UINT32_MAX && s->classes[i].kernel_id + 1 > n) n = s->classes[i].kernel_id + 1;
    break;
  case Q_KEY_EVCLASS: n = (uint32_t)s->n_evclasses; break;
  case Q_KEY_HOOK: n = MS_HOOK_COUNT; break;
  case Q_KEY_ENUM: n = 16; break;
  default: return 0;
  }
  return n <= 65536 ? n : 0;
}

/* The key as written in this statement: the map keeps its first use's text. */
static const char *st_key_text(const struct q_stmt *st, int k, struct gen *g) {
  const struct q_node *n = st->keys[k];
  return n->kind == Q_FIELD ? ms_query_field_name(n->field) : n->text ? n->text : "an expression";
}

static int gen_record(struct gen *g, const struct q_stmt *st) {
  for (int k = 0; k < st->n_fields; k++) {
    if (gen_expr(g, st->fields[k], 0) < 0) return g->err;
    stx(g, 10, (int16_t)(FP_REC + 8 * k), 0);
  }
  if (g->q->maps[st->map].hook < 0) g->q->maps[st->map].hook = g->as_written;
  ld_map(g, 1, st->map);
  mov_reg(g, 2, 10);
  alu_imm(g, MS_BPF_ADD, 2, FP_REC);
  mov_imm(g, 3, 8 * st->n_fields);
  mov_imm(g, 4, 0);
  call(g, MS_BPF_FN_RINGBUF_OUTPUT);
  return g->err;
}

static int gen_stmt(struct gen *g, const struct q_stmt *st) {
  struct ms_query *q = g->q;
  struct q_map *m = &q->maps[st->map];
  if (m->agg == Q_AGG_RECORD) return gen_record(g, st);
  int next = label(g), drop = label(g);
  for (int k = 0; k < st->n_keys; k++) {
    int f = gen_expr(g, st->keys[k], 0);
    if (f < 0) return g->err;
    stx(g, 10, (int16_t)(FP_KEYBUF + 8 * k), 0);
    enum q_key_kind kind;
    int field;
    key_kind(st->keys[k], &kind, &field);
    if (f & V_SIGNED && kind == Q_KEY_NUM) kind = Q_KEY_SIGNED;
    if (m->hook >= 0 && (m->key_kind[k] != kind || (kind == Q_KEY_ENUM && m->key_field[k] != field)))
      return fail(g, st->keys[k]->col, "%s's key %d is '%s' elsewhere; here '%s' (keys of one map mean one thing)",
                  m->name, k + 1, m->key_text[k], st_key_text(st, k, g));
    m->key_kind[k] = kind;
    m->key_field[k] = field;
  }
  if (st->arg) {
    int f = gen_expr(g, st->arg, 0);
    if (f < 0) return g->err;
    m->arg_signed |= f & V_SIGNED;
    stx(g, 10, FP_VAL, 0);
  }
  if (m->hook < 0) { /* the first use: whose enum names its keys print with, and its storage */
    m->hook = g->as_written;
    m->array_size = array_size(g, m);
  }
  gen_find(g, m, st->map, q->n_maps, drop);
  switch (m->agg) {
  case Q_AGG_COUNT: mov_imm(g, 1, 1); atomic_add(g, 7, 0, 1); break;
  case Q_AGG_SUM: ldx(g, MS_BPF_DW, 1, 10, FP_VAL); atomic_add(g, 7, 0, 1); break;
  case Q_AGG_AVG:
    mov_imm(g, 1, 1);
    atomic_add(g, 7, 0, 1);
    ldx(g, MS_BPF_DW, 1, 10, FP_VAL);
    atomic_add(g, 7, 8, 1);
    break;
  case Q_AGG_MIN: case Q_AGG_MAX: gen_minmax(g, m); break;
  case Q_AGG_HIST: gen_hist(g); break;
  case Q_AGG_LHIST: gen_lhist(g, m); break;
  case Q_AGG_QUANTILE: gen_quantile(g); break;
  default: break;
  }
  jump(g, MS_BPF_JA, 0, 0, 0, next);
  bind(g, drop);
  gen_drop(g, q->n_maps + 1);
  bind(g, next);
  return g->err;
}

static int reads_field(const struct q_node *n, int f) {
  return n && ((n->kind == Q_FIELD && n->field == f) || reads_field(n->a, f) || reads_field(n->b, f));
}

static int stmt_reads(const struct q_stmt *st, int f) {
  if (reads_field(st->arg, f)) return 1;
  for (int k = 0; k < st->n_keys; k++)
    if (reads_field(st->keys[k], f)) return 1;
  for (int k = 0; k < st->n_fields; k++)
    if (reads_field(st->fields[k], f)) return 1;
  return 0;
}

static int probe_reads(const struct q_probe *pr, int f) {
  if (reads_field(pr->pred, f)) return 1;
  for (int i = 0; i < pr->n_stmts; i++)
    if (stmt_reads(&pr->stmts[i], f)) return 1;
  return 0;
}

static int gen_prog(struct gen *g, const struct q_probe *pr, int hook_i, int probe_i) {
  struct ms_query *q = g->q;
  g->as_written = pr->hooks[hook_i];
  g->wait_rewrite = g->as_written == MS_HOOK_DEP_WAIT && probe_reads(pr, MS_F_WAIT_NS);
  g->hook = g->wait_rewrite ? MS_HOOK_TASK_BEGIN : g->as_written;
  g->n = g->n_labels = 0;
  g->n_fixes = 0;
  int out = label(g);
  mov_reg(g, R_CTX, 1);
  emit(g, MS_BPF_ST | MS_BPF_MEM | MS_BPF_DW, 10, 0, FP_ZEROKEY, 0);
  if (g->wait_rewrite) { /* a wait, seen at its task's begin: those that waited */
    ldx(g, MS_BPF_DW, 0, R_CTX, (int16_t)ms_hook_fields[MS_F_WAIT_NS].offset);
    jump(g, MS_BPF_JEQ, 0, 0, 0, out);
  }
  if (pr->pred) {
    if (gen_expr(g, pr->pred, 0) < 0) return g->err;
    jump(g, MS_BPF_JEQ, 0, 0, 0, out);
  }
  for (int i = 0; i < pr->n_stmts; i++)
    if (gen_stmt(g, &pr->stmts[i])) return g->err;
  bind(g, out);
  mov_imm(g, 0, 0);
  emit(g, MS_BPF_JMP | MS_BPF_EXIT, 0, 0, 0, 0);
  if (resolve_jumps(g)) return g->err;
  struct q_prog *p = &q->progs[q->n_progs];
  snprintf(p->name, sizeof p->name, "q%d_%s", probe_i, ms_hook_name(g->as_written));
  snprintf(p->section, sizeof p->section, "megascope/observe/%s", ms_hook_name(g->hook));
  if (!(p->insns = malloc(g->n * sizeof *p->insns))) return g->err = -ENOMEM;
  memcpy(p->insns, g->code, g->n * sizeof *p->insns);
  p->n = g->n;
  q->n_progs++;
  return 0;
}

/* ---- maps ---- */

static void map_sizes(struct q_map *m, uint32_t max_keys) {
  switch (m->agg) {
  case Q_AGG_COUNT: case Q_AGG_SUM: m->value_size = 8; break;
  case Q_AGG_MIN: case Q_AGG_MAX: case Q_AGG_AVG: m->value_size = 16; break;
  case Q_AGG_HIST: m->value_size = 8 * Q_HIST_BUCKETS; break;
  case Q_AGG_LHIST: m->value_size = (uint32_t)(8 * ((m->hi - m->lo + m->step - 1) / m->step + 2)); break;
  case Q_AGG_RECORD: m->value_size = (uint32_t)(8 * m->n_fields); break;
  default: m->value_size = 8 * Q_SKETCH_BUCKETS; break;
  }
  uint32_t def = m->agg == Q_AGG_QUANTILE ? 256 : m->value_size > 16 ? 1024 : 4096;
  m->max_entries = m->n_keys ? (max_keys ? max_keys : def) : 1;
}

static void map_defs(struct ms_query *q, uint32_t max_keys) {
  uint32_t zero_size = 8;
  for (int i = 0; i < q->n_maps; i++) {
    struct q_map *m = &q->maps[i];
    map_sizes(m, max_keys);
    struct ms_bpf_map_def *d = &q->defs[i];
    snprintf(d->name, sizeof d->name, "q.%s", m->name[1] ? m->name + 1 : "_");
    if (m->agg == Q_AGG_RECORD) {
      d->type = MS_BPF_MAP_RINGBUF;
      d->key_size = d->value_size = 0;
      d->max_entries = m->max_entries = q->ring_bytes ? q->ring_bytes : 256u << 10;
      continue;
    }
    d->type = m->n_keys && !m->array_size ? MS_BPF_MAP_PERCPU_HASH : MS_BPF_MAP_PERCPU_ARRAY;
    d->key_size = m->n_keys && !m->array_size ? (uint32_t)(8 * m->n_keys) : 4;
    d->value_size = m->value_size;
    if (m->array_size) m->max_entries = m->array_size;
    d->max_entries = m->max_entries;
    if (m->value_size > zero_size) zero_size = m->value_size;
  }
  q->defs[q->n_maps] = (struct ms_bpf_map_def){.name = "q.zero", .type = MS_BPF_MAP_ARRAY, .key_size = 4,
                                               .value_size = zero_size, .max_entries = 1,
                                               .flags = MS_BPF_MAP_F_RDONLY_PROG};
  q->defs[q->n_maps + 1] = (struct ms_bpf_map_def){.name = "q.dropped", .type = MS_BPF_MAP_PERCPU_ARRAY,
                                                   .key_size = 4, .value_size = 8, .max_entries = 1};
  q->n_defs = q->n_maps + 2;
}

int ms_query_codegen(struct ms_query *q, struct ms_textbuf *log) {
  struct gen g = {.q = q, .s = q->schema, .log = log};
  for (int i = 0; i < q->n_probes && !g.err; i++)
    for (int h = 0; h < q->probes[i].n_hooks && !g.err; h++) gen_prog(&g, &q->probes[i], h, i);
  if (!g.err) map_defs(q, q->max_keys);
  free(g.code);
  free(g.labels);
  free(g.fixes);
  return g.err;
}
