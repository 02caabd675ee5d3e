/* SPDX-License-Identifier: MIT */
/* The verifier's driver: the program's shape, the exploration of its paths,
 * ALU and jumps on typed registers, exits, the public entry points (the log
 * is the environment's, verifier_env.c).
 *
 * Before exploring, the instructions are checked again (r10 never written,
 * ms_bpf_insns_check), cut into functions (the entry and every bpf-to-bpf
 * call target; a jump may not leave its function), and analysed for which
 * registers are live at each instruction (pruning ignores dead ones) and
 * where paths may meet (jump targets, fall-throughs of conditional jumps,
 * function entries, returns from calls): the prune points.
 *
 * Exploration is depth first. At a conditional jump whose both sides are
 * possible, the taken side is pushed with its condition applied and the
 * fall-through continues. At a prune point the current state is compared
 * with the states kept there: included in one whose exploration has finished
 * means the path is safe and ends; equal (on live registers) to one still
 * being explored — necessarily an ancestor on this path, as exploration is
 * last-in first-out — means a loop that makes no progress, rejected. Else the
 * state is kept (up to a cap per instruction) when the point is a function
 * entry or a loop head (a backward jump's target), or the path has run
 * KEEP_EVERY instructions since it last kept one: as in Linux, fewer kept
 * states cost less to copy and compare and lose little pruning, since the
 * next point is near. Kept states count their unfinished descendants
 * (`branches`) so that "finished" is known exactly.
 *
 * The fingerprint, a hash of everything exact equality compares but ids, is
 * what the loop check compares first: a loop that counts in a stack slot
 * brings a state whose registers equal its ancestors' at every iteration,
 * and only the stack tells them apart.
 *
 * The longest run. Each path counts the instructions it executes (`depth`);
 * a path that ends passes depth + what follows (nothing at an exit, the
 * pruning state's longest continuation when pruned) to its kept ancestors,
 * each keeping the largest (`max_end`), final once it is finished. The
 * program's largest is the most instructions any run executes, counted as
 * every engine counts; over the run budget, the program is refused — as soon
 * as one path is longer, which also ends a long loop's exploration early.
 *
 * Work. Every instruction processed counts against the complexity cap, and
 * it plus every state frame compared or copied against the work cap;
 * exceeding either rejects the program, so time is bounded as well as
 * instructions. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bpf/verifier_shared.h"

#define LOG_RESERVE 1024          /* bytes of the log kept for the last lines */
#define MAX_PENDING 8192          /* branches waiting to be explored */
#define MAX_KEPT 32768            /* states kept for pruning, in all */
#define MAX_KEPT_BYTES (256u << 20) /* ... and their memory */
#define MAX_PENDING_BYTES (256u << 20)
#define R6_TO_R9 0x3c0u           /* callee-saved registers */
#define KEEP_EVERY 8              /* instructions between kept states off loop heads */
#define EVICT_MISSES 8            /* a finished state compared this many times per prune it made
                                   * (plus one) without pruning is dropped, as Linux does */
#define PRUNE_POINT 1             /* prune[i]: paths may meet at i */
#define KEEP_POINT 2              /* ... and a state is always kept there (entries, loop heads) */
#define NO_FUNC UINT32_MAX

struct explore {
  struct ms_bpf_venv env;
  uint32_t *func;                 /* first instruction of the function holding i */
  uint32_t *func_end;             /* one past its last */
  uint8_t *prune;                 /* i is a prune point */
  uint16_t *live;                 /* registers r0..r9 live before i */
  struct ms_bpf_vstate **kept;    /* states kept at i, a list */
  uint32_t *n_kept;
  struct ms_bpf_vstate **pending; /* the stack of branches to explore */
  size_t n_pending;
  struct ms_verify_stats st;
  uint64_t limit;
  uint32_t states_cap;
  uint64_t n_kept_all;
  struct ms_bpf_idmap *idmap;     /* scratch for state comparisons */
  uint64_t exits;                 /* exits of the entry function reached */
  uint64_t kept_bytes, pending_bytes;
  uint64_t run_budget;            /* the most instructions one run may execute */
  uint64_t max_run;               /* the longest path found so far */
  uint64_t tail;                  /* visit() pruned: the pruning state's longest continuation */
  uint64_t work_limit;
  uint64_t copied;                /* state frames copied */
};

static uint64_t state_bytes(const struct ms_bpf_vstate *s) {
  return sizeof *s + (uint64_t)(s->curframe + 1) * sizeof(struct ms_bpf_vframe);
}

static int is_lddw(const struct ms_bpf_insn *in) { return in->code == (MS_BPF_LD | MS_BPF_IMM | MS_BPF_DW); }

static int is_local_call(const struct ms_bpf_insn *in) {
  return in->code == (MS_BPF_JMP | MS_BPF_CALL) && in->src_reg == MS_BPF_PSEUDO_CALL;
}

/* The target of a jump or local call at i; 0 when i has none. */
static int jump_target(const struct ms_bpf_insn *in, size_t i, int64_t *t) {
  unsigned cls = MS_BPF_CLASS(in->code), op = MS_BPF_OP(in->code);
  if (cls != MS_BPF_JMP && cls != MS_BPF_JMP32) return 0;
  if (op == MS_BPF_EXIT) return 0;
  if (op == MS_BPF_CALL) {
    if (in->src_reg != MS_BPF_PSEUDO_CALL) return 0;
    *t = (int64_t)i + 1 + in->imm;
    return 1;
  }
  *t = (int64_t)i + 1 + (op == MS_BPF_JA && cls == MS_BPF_JMP32 ? in->imm : in->off);
  return 1;
}

/* ---- the program's shape ------------------------------------------------ */

/* Writes to r10 are refused by ms_bpf_insns_check too; saying it here gives
 * the verifier's own pointing message. */
static int check_r10(struct explore *x) {
  for (size_t i = 0; i < x->env.n; i++) {
    const struct ms_bpf_insn *in = &x->env.insns[i];
    unsigned cls = MS_BPF_CLASS(in->code);
    int writes = cls == MS_BPF_ALU || cls == MS_BPF_ALU64 || cls == MS_BPF_LDX || is_lddw(in);
    if (writes && in->dst_reg == 10) {
      x->env.pc = (uint32_t)i;
      return ms_bpf_vreject(&x->env, "frame pointer r10 is read-only");
    }
    if (is_lddw(in)) i++;
  }
  return 0;
}

static int find_functions(struct explore *x) {
  size_t n = x->env.n;
  for (size_t i = 0; i < n; i++) x->func[i] = NO_FUNC;
  x->func[0] = 0;
  for (size_t i = 0; i < n; i++) {
    int64_t t;
    if (is_local_call(&x->env.insns[i]) && jump_target(&x->env.insns[i], i, &t)) x->func[t] = (uint32_t)t;
    if (is_lddw(&x->env.insns[i])) i++;
  }
  uint32_t start = 0;
  for (size_t i = 0; i < n; i++) {
    if (x->func[i] == i) start = (uint32_t)i;
    x->func[i] = start;
  }
  uint32_t end = (uint32_t)n;
  for (size_t i = n; i-- > 0;) {
    x->func_end[i] = end;
    if (x->func[i] == i) end = (uint32_t)i;
  }
  for (size_t i = 0; i < n; i++) {
    const struct ms_bpf_insn *in = &x->env.insns[i];
    int64_t t;
    if (!is_local_call(in) && jump_target(in, i, &t) && (t < 0 || (size_t)t >= n || x->func[t] != x->func[i])) {
      x->env.pc = (uint32_t)i;
      return ms_bpf_vreject(&x->env, "jump to insn %lld leaves the function at insn %u", (long long)t, x->func[i]);
    }
    if (is_lddw(in)) i++;
  }
  return 0;
}

static void mark_prune_points(struct explore *x) {
  for (size_t i = 0; i < x->env.n; i++) {
    const struct ms_bpf_insn *in = &x->env.insns[i];
    int64_t t;
    if (x->func[i] == i) x->prune[i] = KEEP_POINT;
    if (jump_target(in, i, &t)) {
      x->prune[t] |= (size_t)t <= i ? KEEP_POINT | PRUNE_POINT : PRUNE_POINT; /* a loop head */
      unsigned op = MS_BPF_OP(in->code);
      if (op != MS_BPF_JA && i + 1 < x->env.n) x->prune[i + 1] |= PRUNE_POINT; /* fall-through, return point */
    }
    if (is_lddw(in)) i++;
  }
}

/* ---- liveness ----------------------------------------------------------- */

static uint16_t reg_bit(unsigned r) { return r < 10 ? (uint16_t)(1u << r) : 0; }

static uint16_t helper_uses(const struct explore *x, int32_t id) {
  const struct ms_bpf_helper_proto *p = x->env.o.helpers ? ms_bpf_helpers_proto(x->env.o.helpers, (uint32_t)id) : NULL;
  if (!p) return 0x3e;
  uint16_t use = 0;
  for (unsigned a = 0; a < 5 && p->args[a] != MS_BPF_ARG_NONE; a++) use |= reg_bit(a + 1);
  return use;
}

static void use_def(const struct explore *x, const struct ms_bpf_insn *in, uint16_t *use, uint16_t *def) {
  unsigned cls = MS_BPF_CLASS(in->code), op = MS_BPF_OP(in->code), xsrc = MS_BPF_SRC(in->code) == MS_BPF_X;
  *use = *def = 0;
  switch (cls) {
  case MS_BPF_ALU: case MS_BPF_ALU64:
    if (op != MS_BPF_MOV) *use |= reg_bit(in->dst_reg);
    if (xsrc && op != MS_BPF_END) *use |= reg_bit(in->src_reg);
    *def = reg_bit(in->dst_reg);
    return;
  case MS_BPF_LD: *def = reg_bit(in->dst_reg); return;
  case MS_BPF_LDX: *use = reg_bit(in->src_reg); *def = reg_bit(in->dst_reg); return;
  case MS_BPF_ST: *use = reg_bit(in->dst_reg); return;
  case MS_BPF_STX:
    *use = reg_bit(in->dst_reg) | reg_bit(in->src_reg);
    if (MS_BPF_MODE(in->code) != MS_BPF_ATOMIC) return;
    if (in->imm == MS_BPF_CMPXCHG) *use |= 1, *def = 1;
    else if (in->imm & MS_BPF_FETCH) *def = reg_bit(in->src_reg);
    return;
  default:
    if (op == MS_BPF_JA) return;
    if (op == MS_BPF_EXIT) { *use = 1; return; }
    if (op == MS_BPF_CALL) {
      *use = in->src_reg == MS_BPF_PSEUDO_CALL ? 0x3e : helper_uses(x, in->imm);
      *def = 0x3f;
      return;
    }
    *use = reg_bit(in->dst_reg) | (xsrc ? reg_bit(in->src_reg) : 0);
  }
}

/* Successors of i inside its function; returns how many. */
static unsigned successors(const struct explore *x, size_t i, uint32_t succ[2]) {
  const struct ms_bpf_insn *in = &x->env.insns[i];
  unsigned cls = MS_BPF_CLASS(in->code), op = MS_BPF_OP(in->code), k = 0;
  int jmp = cls == MS_BPF_JMP || cls == MS_BPF_JMP32;
  int64_t t;
  if (jmp && op == MS_BPF_EXIT) return 0;
  if (jmp && op != MS_BPF_CALL && jump_target(in, i, &t)) succ[k++] = (uint32_t)t;
  if (jmp && op == MS_BPF_JA) return k;
  size_t next = i + (is_lddw(in) ? 2 : 1);
  if (next < x->func_end[i]) succ[k++] = (uint32_t)next;
  return k;
}

/* Predecessor lists in one array: preds[start[i] .. start[i + 1]) lead to i. */
static int build_preds(const struct explore *x, uint32_t **start_out, uint32_t **preds_out) {
  size_t n = x->env.n;
  uint32_t *start = calloc(n + 1, sizeof *start), *pos = malloc(n * sizeof *pos);
  uint32_t *preds = malloc(2 * n * sizeof *preds), s[2];
  if (!start || !pos || !preds) {
    free(start), free(pos), free(preds);
    return -ENOMEM;
  }
  for (size_t i = 0; i < n; i++)
    for (unsigned k = successors(x, i, s); k-- > 0;) start[s[k] + 1]++;
  for (size_t i = 0; i < n; i++) start[i + 1] += start[i];
  memcpy(pos, start, n * sizeof *pos);
  for (size_t i = 0; i < n; i++)
    for (unsigned k = successors(x, i, s); k-- > 0;) preds[pos[s[k]]++] = (uint32_t)i;
  free(pos);
  *start_out = start;
  *preds_out = preds;
  return 0;
}

/* Backward dataflow with a worklist: each live set only grows, so it ends. */
static int compute_liveness(struct explore *x) {
  size_t n = x->env.n, top = 0;
  uint32_t *start = NULL, *preds = NULL, s[2];
  uint32_t *work = malloc(n * sizeof *work);
  uint8_t *queued = calloc(n, 1);
  int err = work && queued ? build_preds(x, &start, &preds) : -ENOMEM;
  for (size_t i = 0; !err && i < n; i++) {
    work[top++] = (uint32_t)i; /* the last instruction is taken first */
    queued[i] = 1;
  }
  while (!err && top) {
    uint32_t i = work[--top];
    queued[i] = 0;
    uint16_t use, def, out = 0;
    use_def(x, &x->env.insns[i], &use, &def);
    for (unsigned k = successors(x, i, s); k-- > 0;) out |= x->live[s[k]];
    uint16_t in = (uint16_t)(use | (out & ~def));
    if (in == x->live[i]) continue;
    x->live[i] = in;
    for (uint32_t p = start[i]; p < start[i + 1]; p++)
      if (!queued[preds[p]]) queued[preds[p]] = 1, work[top++] = preds[p];
  }
  free(start);
  free(preds);
  free(work);
  free(queued);
  return err;
}

/* ---- kept states and pending branches ----------------------------------- */

static void count_peak(struct explore *x) {
  uint64_t now = x->n_kept_all + x->n_pending;
  if (now > x->st.peak_states) x->st.peak_states = now;
}

static void live_masks(const struct explore *x, const struct ms_bpf_vstate *s, uint32_t pc,
                       struct ms_bpf_vlive *lv) {
  for (unsigned i = 0; i <= s->curframe; i++)
  {
    uint32_t ret = i == s->curframe ? pc : (uint32_t)s->frames[i + 1]->callsite + 1;
    uint16_t m = ret < x->env.n ? x->live[ret] : 0;
    lv->mask[i] = i == s->curframe ? m : (uint16_t)(m & R6_TO_R9);
  }
}

/* Work done so far: over the cap, the program is refused. */
static uint64_t work(const struct explore *x) { return x->st.processed + x->st.compared + x->copied; }

static _Thread_local const int *cancel_flag; /* ms_bpf_verify_set_cancel, per thread */

void ms_bpf_verify_set_cancel(const int *flag) { cancel_flag = flag; }

static int check_work(struct explore *x) {
  if (cancel_flag && __atomic_load_n(cancel_flag, __ATOMIC_RELAXED)) /* relaxed: a request, it orders nothing */
    return ms_bpf_vreject(&x->env, "verification cancelled");
  if (work(x) <= x->work_limit) return 0;
  return ms_bpf_vreject(&x->env, "program too complex: verifier work %llu exceeds the limit %llu (%llu insns "
                        "processed, %llu state frames compared, %llu copied)", (unsigned long long)work(x),
                        (unsigned long long)x->work_limit, (unsigned long long)x->st.processed,
                        (unsigned long long)x->st.compared, (unsigned long long)x->copied);
}

static int over_budget(struct explore *x, uint64_t n, const char *how) {
  return ms_bpf_vreject(&x->env, "program too long for one run: %s %llu instructions, more than the run "
                        "budget of %llu (every engine stops a run there)", how, (unsigned long long)n,
                        (unsigned long long)x->run_budget);
}

/* The current path ends after `end` instructions in all (its own and, when
 * pruned, the longest continuation of the state that pruned it): each kept
 * ancestor takes it in; those with nothing left below them are finished and
 * pass their own longest path up. */
static int finish_path(struct explore *x, uint64_t end) {
  if (end > x->run_budget) return over_budget(x, end, "a path through here may run");
  if (end > x->max_run) x->max_run = end;
  for (struct ms_bpf_vstate *s = x->env.cur->parent; s; s = s->parent) {
    if (end > s->max_end) s->max_end = end;
    if (--s->branches) break;
    end = s->max_end;
  }
  return 0;
}

static uint64_t frames_of(const struct ms_bpf_vstate *s) { return s->curframe + 1; }

/* A finished state no longer compared: nothing refers to it (only unfinished
 * states are parents of paths still to end), so it is freed. */
static void evict(struct explore *x, struct ms_bpf_vstate *s) {
  x->n_kept[s->insn]--;
  x->n_kept_all--;
  x->kept_bytes -= state_bytes(s);
  x->st.evicted++;
  ms_bpf_vs_free(s);
}

/* The current state's fingerprint, computed once per visit (*have) and only
 * when needed: it reads every frame. */
static uint64_t fingerprint(struct explore *x, const struct ms_bpf_vlive *lv, uint64_t *fp, int *have) {
  if (*have) return *fp;
  x->st.compared += frames_of(x->env.cur);
  *have = 1;
  return *fp = ms_bpf_vs_fingerprint(x->env.cur, lv);
}

/* 1: the path is pruned; 0: go on; < 0: rejected. */
static int visit(struct explore *x) {
  struct ms_bpf_venv *env = &x->env;
  struct ms_bpf_vlive lv;
  live_masks(x, env->cur, env->pc, &lv);
  uint64_t fp = 0;
  int have_fp = 0;
  struct ms_bpf_vstate **link = &x->kept[env->pc], *s;
  while ((s = *link)) {
    if (s->curframe == env->cur->curframe && s->n_refs == env->cur->n_refs && !s->branches) {
      x->st.compared += frames_of(s);
      if (ms_bpf_vs_within(s, env->cur, &lv, 0, x->idmap)) {
        s->hits++;
        x->tail = s->max_end - s->depth;
        return 1;
      }
      if (++s->misses > EVICT_MISSES * (s->hits + 1)) { /* it prunes nothing: compare no more */
        *link = s->next;
        evict(x, s);
        continue;
      }
    } else if (s->curframe == env->cur->curframe && s->n_refs == env->cur->n_refs &&
               fingerprint(x, &lv, &fp, &have_fp) == s->fingerprint) {
      x->st.compared += frames_of(s);
      if (ms_bpf_vs_within(s, env->cur, &lv, 1, x->idmap))
        return ms_bpf_vreject(env, "infinite loop detected: the path came back to this instruction in the same "
                              "state, so it would never end");
    }
    link = &s->next;
  }
  if (check_work(x)) return -MS_E_VERIFY;
  if (!(x->prune[env->pc] & KEEP_POINT) && env->cur->since_kept < KEEP_EVERY) return 0;
  if (x->n_kept[env->pc] >= x->states_cap || x->n_kept_all >= MAX_KEPT || x->kept_bytes >= MAX_KEPT_BYTES)
    return 0; /* explore on without keeping: only pruning suffers */
  struct ms_bpf_vstate *k = calloc(1, sizeof *k);
  if (!k || ms_bpf_vs_copy(k, env->cur)) {
    ms_bpf_vs_free(k);
    return -ENOMEM;
  }
  x->copied += frames_of(k);
  k->insn = env->pc;
  k->branches = 1;
  k->fingerprint = fingerprint(x, &lv, &fp, &have_fp);
  k->depth = env->cur->depth;
  k->max_end = env->cur->depth;
  env->cur->since_kept = 0;
  k->parent = env->cur->parent;
  env->cur->parent = k;
  k->next = x->kept[env->pc];
  x->kept[env->pc] = k;
  x->st.total_states++;
  x->n_kept_all++;
  x->kept_bytes += state_bytes(k);
  if (++x->n_kept[env->pc] > x->st.max_states_per_insn) x->st.max_states_per_insn = x->n_kept[env->pc];
  count_peak(x);
  return 0;
}

/* Pushes a copy of the current state to resume at insn `to`; *out is the
 * copy, for the caller to apply the branch condition to. */
static int push_branch(struct explore *x, uint32_t to, struct ms_bpf_vstate **out) {
  struct ms_bpf_venv *env = &x->env;
  if (x->n_pending >= MAX_PENDING || x->pending_bytes >= MAX_PENDING_BYTES)
    return ms_bpf_vreject(env, "program too complex: %zu branches pending exploration (limit %d, %u MiB)",
                          x->n_pending, MAX_PENDING, MAX_PENDING_BYTES >> 20);
  struct ms_bpf_vstate *b = calloc(1, sizeof *b);
  if (!b || ms_bpf_vs_copy(b, env->cur)) {
    ms_bpf_vs_free(b);
    return -ENOMEM;
  }
  x->copied += frames_of(b);
  b->depth = env->cur->depth;
  b->since_kept = env->cur->since_kept;
  b->parent = env->cur->parent;
  if (b->parent) b->parent->branches++;
  b->insn = to;
  b->from = env->pc;
  x->pending[x->n_pending++] = b;
  x->pending_bytes += state_bytes(b);
  count_peak(x);
  *out = b;
  return 0;
}

/* ---- ALU ---------------------------------------------------------------- */

static const char *const alu_op_names[16] = {"+", "-", "*", "/", "|", "&", "<<", ">>", "neg", "%", "^", "mov",
                                             "s>>", "bswap"};

static int ptr_add_const(struct ms_bpf_venv *env, unsigned regno, struct ms_bpf_vreg *p, int64_t c) {
  int64_t off = (int64_t)p->off + c;
  if (off < -(1ll << 29) || off > (1ll << 29))
    return ms_bpf_vreject(env, "R%u pointer offset %lld out of range", regno, (long long)off);
  p->off = (int32_t)off;
  return 0;
}

/* dst = ptr +/- scalar (ptr and s may come from either operand of an add). */
static int ptr_offset(struct ms_bpf_venv *env, unsigned regno, unsigned op, struct ms_bpf_vreg ptr,
                      const struct ms_bpf_scalar *s, struct ms_bpf_vreg *dst) {
  switch (ptr.type) {
  case MS_VT_MAP_VALUE_OR_NULL:
  case MS_VT_REC_OR_NULL:
    return ms_bpf_vreject(env, "R%u pointer arithmetic on %s prohibited: compare it with 0 first", regno,
                          ms_bpf_vtype_name(ptr.type));
  case MS_VT_MAP_PTR:
    return ms_bpf_vreject(env, "R%u pointer arithmetic on map_ptr prohibited", regno);
  case MS_VT_CTX:
    if (!ms_bpf_sc_is_const(s))
      return ms_bpf_vreject(env, "R%u ctx pointer arithmetic only by constants (the offset is not known)", regno);
    break;
  default: break;
  }
  if (ms_bpf_sc_is_const(s)) {
    int64_t c = (int64_t)s->t.v;
    if (c < -(1ll << 30) || c > (1ll << 30))
      return ms_bpf_vreject(env, "R%u pointer offset by %lld out of range", regno, (long long)c);
    if (ptr_add_const(env, regno, &ptr, op == MS_BPF_SUB ? -c : c)) return -MS_E_VERIFY;
  } else {
    struct ms_bpf_vreg v;
    ms_bpf_vreg_scalar(&v, ptr.s);
    struct ms_bpf_insn alu = {.code = (uint8_t)(MS_BPF_ALU64 | op | MS_BPF_X)};
    ms_bpf_sc_alu(&alu, &v.s, s);
    ptr.s = v.s;
  }
  *dst = ptr;
  return 0;
}

/* Two pointers into the same kind of memory (a map's values, a frame's stack). */
static int same_region(const struct ms_bpf_vreg *a, const struct ms_bpf_vreg *b) {
  return a->type == b->type && a->frame == b->frame && a->map == b->map && a->size == b->size &&
         a->ref == b->ref && a->type != MS_VT_MAP_VALUE_OR_NULL && a->type != MS_VT_REC_OR_NULL &&
         a->type != MS_VT_MAP_PTR;
}

/* ... and from the same base address: the same lookup (id) of a map, the same
 * global data, the same record, frame, context or buffer. Only then do their
 * offsets tell their distance and order. */
static int same_base(const struct ms_bpf_vreg *a, const struct ms_bpf_vreg *b) {
  return same_region(a, b) && a->id == b->id;
}

static int ptr_alu(struct ms_bpf_venv *env, const struct ms_bpf_insn *in, struct ms_bpf_vreg *dst,
                   const struct ms_bpf_vreg *src) {
  unsigned op = MS_BPF_OP(in->code), d = in->dst_reg;
  int dp = ms_bpf_vreg_is_ptr(dst), sp = ms_bpf_vreg_is_ptr(src);
  const struct ms_bpf_vreg *p = dp ? dst : src;
  if (MS_BPF_CLASS(in->code) == MS_BPF_ALU)
    return ms_bpf_vreject(env, "R%u 32-bit arithmetic on a pointer (%s) prohibited", dp ? d : in->src_reg,
                          ms_bpf_vtype_name(p->type));
  if (op != MS_BPF_ADD && op != MS_BPF_SUB)
    return ms_bpf_vreject(env, "R%u pointer arithmetic with %s operator prohibited (type=%s)", dp ? d : in->src_reg,
                          alu_op_names[op >> 4], ms_bpf_vtype_name(p->type));
  if (dp && sp) {
    if (op == MS_BPF_ADD) return ms_bpf_vreject(env, "R%u pointer + pointer prohibited", d);
    if (!same_region(dst, src))
      return ms_bpf_vreject(env, "R%u subtraction of pointers to different regions (%s, %s) prohibited", d,
                            ms_bpf_vtype_name(dst->type), ms_bpf_vtype_name(src->type));
    if (!same_base(dst, src)) { /* two values of one map: their distance is not known */
      ms_bpf_vreg_unknown(dst);
      return 0;
    }
    struct ms_bpf_insn add = {.code = MS_BPF_ALU64 | MS_BPF_ADD | MS_BPF_X};
    struct ms_bpf_insn sub = {.code = MS_BPF_ALU64 | MS_BPF_SUB | MS_BPF_X};
    struct ms_bpf_scalar a = ms_bpf_sc_const((uint64_t)(int64_t)dst->off), b = ms_bpf_sc_const((uint64_t)(int64_t)src->off);
    ms_bpf_sc_alu(&add, &a, &dst->s);
    ms_bpf_sc_alu(&add, &b, &src->s);
    ms_bpf_sc_alu(&sub, &a, &b);
    ms_bpf_vreg_scalar(dst, a);
    return 0;
  }
  if (sp && op == MS_BPF_SUB)
    return ms_bpf_vreject(env, "R%u subtraction of a pointer (%s) from a scalar prohibited", d,
                          ms_bpf_vtype_name(src->type));
  struct ms_bpf_scalar s = dp ? src->s : dst->s;
  return ptr_offset(env, d, op, dp ? *dst : *src, &s, dst);
}

static int do_mov(struct ms_bpf_venv *env, const struct ms_bpf_insn *in, struct ms_bpf_vreg *dst,
                  struct ms_bpf_vreg *src, int xsrc) {
  int is64 = MS_BPF_CLASS(in->code) == MS_BPF_ALU64;
  if (!xsrc) {
    ms_bpf_vreg_const(dst, is64 ? (uint64_t)(int64_t)in->imm : (uint32_t)in->imm);
    return 0;
  }
  if (ms_bpf_vreg_is_ptr(src)) {
    if (!is64 || in->off)
      return ms_bpf_vreject(env, "R%u partial copy of a pointer (%s) by a 32-bit or sign-extending move",
                            in->src_reg, ms_bpf_vtype_name(src->type));
    *dst = *src;
    return 0;
  }
  if (!in->off && (is64 || src->s.umax <= UINT32_MAX)) { /* an exact copy: link the two */
    if (!src->id) src->id = ms_bpf_vnew_id(env);
    *dst = *src;
    return 0;
  }
  struct ms_bpf_scalar v = ms_bpf_sc_unknown();
  ms_bpf_sc_alu(in, &v, &src->s);
  ms_bpf_vreg_scalar(dst, v);
  return 0;
}

static int do_alu(struct explore *x, const struct ms_bpf_insn *in) {
  struct ms_bpf_venv *env = &x->env;
  struct ms_bpf_vreg *regs = ms_bpf_vregs(env), imm;
  unsigned op = MS_BPF_OP(in->code);
  int xsrc = MS_BPF_SRC(in->code) == MS_BPF_X && op != MS_BPF_END;
  int is64 = MS_BPF_CLASS(in->code) == MS_BPF_ALU64;
  if (in->dst_reg >= 10 || in->src_reg > 10) return ms_bpf_vreject(env, "bad register");
  if (op != MS_BPF_MOV && ms_bpf_vcheck_read(env, in->dst_reg)) return -MS_E_VERIFY;
  if (xsrc && ms_bpf_vcheck_read(env, in->src_reg)) return -MS_E_VERIFY;
  struct ms_bpf_vreg *dst = &regs[in->dst_reg], *src = xsrc ? &regs[in->src_reg] : &imm;
  if (!xsrc) ms_bpf_vreg_const(&imm, is64 ? (uint64_t)(int64_t)in->imm : (uint32_t)in->imm);
  if (op == MS_BPF_MOV) return do_mov(env, in, dst, src, xsrc);
  if (ms_bpf_vreg_is_ptr(dst) || ms_bpf_vreg_is_ptr(src)) return ptr_alu(env, in, dst, src);
  struct ms_bpf_scalar v = dst->s;
  ms_bpf_sc_alu(in, &v, &src->s);
  ms_bpf_vreg_scalar(dst, v);
  return 0;
}

static int do_lddw(struct explore *x, const struct ms_bpf_insn *in) {
  struct ms_bpf_venv *env = &x->env;
  struct ms_bpf_vreg *r = &ms_bpf_vregs(env)[in->dst_reg];
  if (env->pc + 1 >= env->n || in->dst_reg >= 10) return ms_bpf_vreject(env, "malformed lddw");
  uint32_t next = (uint32_t)in[1].imm;
  if (!in->src_reg) {
    ms_bpf_vreg_const(r, (uint64_t)(uint32_t)in->imm | (uint64_t)next << 32);
    return 0;
  }
  const struct ms_bpf_map_def *d = in->imm >= 0 ? ms_bpf_prog_map(env->prog, (size_t)in->imm) : NULL;
  if (!d) return ms_bpf_vreject(env, "lddw names map %d, which the program does not have", in->imm);
  ms_bpf_vreg_const(r, 0);
  r->map = (uint32_t)in->imm;
  switch (in->src_reg) {
  case MS_BPF_PSEUDO_MAP_FD:
  case MS_BPF_PSEUDO_MAP_IDX:
    r->type = MS_VT_MAP_PTR;
    return 0;
  case MS_BPF_PSEUDO_MAP_VALUE:
  case MS_BPF_PSEUDO_MAP_IDX_VALUE:
    if (d->type != MS_BPF_MAP_ARRAY)
      return ms_bpf_vreject(env, "lddw of a value address needs an array map (global data); %s has type %u",
                            d->name, d->type);
    if (next >= d->value_size)
      return ms_bpf_vreject(env, "lddw value offset %u is beyond map %s's value_size %u", next, d->name,
                            d->value_size);
    r->type = MS_VT_MAP_VALUE;
    r->off = (int32_t)next;
    r->id = MS_VT_GLOBAL_ID | r->map; /* one base per map: its value of key 0 */
    return 0;
  default:
    return ms_bpf_vreject(env, "lddw kind %u not supported", in->src_reg);
  }
}

/* ---- jumps -------------------------------------------------------------- */

struct id_set {
  uint32_t id;
  const struct ms_bpf_scalar *s;
};

static void set_by_id(struct ms_bpf_vreg *r, void *user) {
  const struct id_set *u = user;
  if (r->type == MS_VT_SCALAR && r->id == u->id) r->s = *u->s;
}

/* Sets register regno of s (and every copy linked to it) to v. */
static void apply_scalar(struct ms_bpf_vstate *s, unsigned regno, const struct ms_bpf_scalar *v) {
  struct ms_bpf_vreg *r = &s->frames[s->curframe]->regs[regno];
  if (r->id) {
    struct id_set u = {r->id, v};
    ms_bpf_vs_foreach_reg(s, set_by_id, &u);
  }
  r->s = *v;
}

struct null_mark {
  uint32_t id;
  int is_null;
};

static void mark_null(struct ms_bpf_vreg *r, void *user) {
  const struct null_mark *m = user;
  if ((r->type != MS_VT_MAP_VALUE_OR_NULL && r->type != MS_VT_REC_OR_NULL) || r->id != m->id) return;
  if (m->is_null) ms_bpf_vreg_const(r, 0);
  else r->type = r->type == MS_VT_MAP_VALUE_OR_NULL ? MS_VT_MAP_VALUE : MS_VT_REC;
}

/* After "ptr == NULL" (is_null) or "ptr != NULL": every copy learns it; a
 * reservation that failed is no longer held. */
static void apply_null(struct ms_bpf_vstate *s, const struct ms_bpf_vreg *p, int is_null) {
  struct null_mark m = {p->id, is_null};
  if (is_null && p->type == MS_VT_REC_OR_NULL) {
    for (unsigned i = 0; i < s->n_refs; i++)
      if (s->refs[i].id == p->ref) {
        memmove(&s->refs[i], &s->refs[i + 1], (s->n_refs - i - 1) * sizeof s->refs[0]);
        s->n_refs--;
        break;
      }
  }
  ms_bpf_vs_foreach_reg(s, mark_null, &m);
}

/* Continues on the fall-through (taken = 0) or the jump (taken = 1). */
static void go(struct ms_bpf_venv *env, const struct ms_bpf_insn *in, int taken) {
  env->pc = taken ? env->pc + 1 + (uint32_t)(int32_t)in->off : env->pc + 1;
}

/* Both sides possible: the taken side is pushed; *tb receives its state. */
static int fork_jump(struct explore *x, const struct ms_bpf_insn *in, struct ms_bpf_vstate **tb) {
  return push_branch(x, x->env.pc + 1 + (uint32_t)(int32_t)in->off, tb);
}

static int ptr_cond(struct explore *x, const struct ms_bpf_insn *in, const struct ms_bpf_vreg *a,
                    const struct ms_bpf_vreg *b) {
  struct ms_bpf_venv *env = &x->env;
  unsigned op = MS_BPF_OP(in->code);
  if (MS_BPF_CLASS(in->code) == MS_BPF_JMP32)
    return ms_bpf_vreject(env, "pointer comparison in a 32-bit jump prohibited");
  int ap = ms_bpf_vreg_is_ptr(a), bp = ms_bpf_vreg_is_ptr(b);
  const struct ms_bpf_vreg *p = ap ? a : b, *o = ap ? b : a;
  unsigned pno = ap ? in->dst_reg : in->src_reg;
  if (ap != bp) { /* pointer against a scalar: only NULL checks */
    int zero = ms_bpf_sc_is_const(&o->s) && o->s.t.v == 0;
    if (!zero || (op != MS_BPF_JEQ && op != MS_BPF_JNE))
      return ms_bpf_vreject(env, "R%u pointer (%s) comparison with a scalar prohibited (only == 0 and != 0)",
                            pno, ms_bpf_vtype_name(p->type));
    int or_null = p->type == MS_VT_MAP_VALUE_OR_NULL || p->type == MS_VT_REC_OR_NULL;
    if (!or_null) { /* never NULL */
      go(env, in, op == MS_BPF_JNE);
      return 0;
    }
    struct ms_bpf_vreg pv = *p;
    struct ms_bpf_vstate *tb;
    if (fork_jump(x, in, &tb)) return -MS_E_VERIFY;
    apply_null(tb, &pv, op == MS_BPF_JEQ);
    apply_null(env->cur, &pv, op != MS_BPF_JEQ);
    go(env, in, 0);
    return 0;
  }
  if (!same_region(a, b) || op == MS_BPF_JSET)
    return ms_bpf_vreject(env, "comparison of pointers to different regions (%s, %s) prohibited",
                          ms_bpf_vtype_name(a->type), ms_bpf_vtype_name(b->type));
  if (same_base(a, b) && ms_bpf_sc_is_const(&a->s) && ms_bpf_sc_is_const(&b->s)) { /* offsets decide */
    /* signed order of the offsets, as unsigned order of values with the sign bit flipped */
    struct ms_bpf_scalar ea = ms_bpf_sc_const(((uint64_t)(int64_t)a->off + a->s.t.v) ^ (1ull << 63));
    struct ms_bpf_scalar eb = ms_bpf_sc_const(((uint64_t)(int64_t)b->off + b->s.t.v) ^ (1ull << 63));
    struct ms_bpf_scalar ta = ea, tb2 = eb;
    unsigned uop = op == MS_BPF_JSGT ? MS_BPF_JGT : op == MS_BPF_JSGE ? MS_BPF_JGE
                 : op == MS_BPF_JSLT ? MS_BPF_JLT : op == MS_BPF_JSLE ? MS_BPF_JLE : op;
    go(env, in, ms_bpf_sc_refine(uop, 0, &ta, &tb2) == 0);
    return 0;
  }
  struct ms_bpf_vstate *tb;
  if (fork_jump(x, in, &tb)) return -MS_E_VERIFY;
  go(env, in, 0);
  return 0;
}

static int do_cond(struct explore *x, const struct ms_bpf_insn *in, int *done) {
  struct ms_bpf_venv *env = &x->env;
  struct ms_bpf_vreg *regs = ms_bpf_vregs(env), imm;
  int xsrc = MS_BPF_SRC(in->code) == MS_BPF_X, is32 = MS_BPF_CLASS(in->code) == MS_BPF_JMP32;
  unsigned op = MS_BPF_OP(in->code);
  if (ms_bpf_vcheck_read(env, in->dst_reg) || (xsrc && ms_bpf_vcheck_read(env, in->src_reg)))
    return -MS_E_VERIFY;
  if (!xsrc) ms_bpf_vreg_const(&imm, (uint64_t)(int64_t)in->imm);
  const struct ms_bpf_vreg *a = &regs[in->dst_reg], *b = xsrc ? &regs[in->src_reg] : &imm;
  if (ms_bpf_vreg_is_ptr(a) || ms_bpf_vreg_is_ptr(b)) return ptr_cond(x, in, a, b);
  struct ms_bpf_scalar ta = a->s, tb = b->s, fa = a->s, fb = b->s;
  int taken = ms_bpf_sc_refine(op, is32, &ta, &tb) == 0;
  int fall = ms_bpf_sc_refine(ms_bpf_sc_negate(op), is32, &fa, &fb) == 0;
  if (taken && fall) {
    struct ms_bpf_vstate *br;
    if (fork_jump(x, in, &br)) return -MS_E_VERIFY;
    apply_scalar(br, in->dst_reg, &ta);
    if (xsrc) apply_scalar(br, in->src_reg, &tb);
  }
  if (fall || taken) {
    apply_scalar(env->cur, in->dst_reg, fall ? &fa : &ta);
    if (xsrc) apply_scalar(env->cur, in->src_reg, fall ? &fb : &tb);
  }
  if (!fall && !taken) *done = 1; /* cannot happen for a consistent state; end the path */
  go(env, in, !fall);
  return 0;
}

static int do_local_call(struct explore *x, const struct ms_bpf_insn *in) {
  struct ms_bpf_venv *env = &x->env;
  struct ms_bpf_vstate *s = env->cur;
  if (s->curframe + 1 >= MS_BPF_MAX_CALL_DEPTH)
    return ms_bpf_vreject(env, "call depth exceeds %d frames", MS_BPF_MAX_CALL_DEPTH);
  struct ms_bpf_vframe *f = ms_bpf_vs_frame_new((int32_t)env->pc);
  if (!f) return -ENOMEM;
  const struct ms_bpf_vreg *caller = s->frames[s->curframe]->regs;
  for (unsigned r = 1; r <= 5; r++) f->regs[r] = caller[r];
  f->regs[10].type = MS_VT_STACK;
  f->regs[10].s = ms_bpf_sc_const(0);
  f->regs[10].frame = (uint8_t)(s->curframe + 1);
  s->frames[++s->curframe] = f;
  env->pc = env->pc + 1 + (uint32_t)in->imm;
  return 0;
}

/* Widens the stats' R0 range to take in r. */
static void note_r0(struct explore *x, const struct ms_bpf_scalar *r) {
  struct ms_verify_stats *st = &x->st;
  if (!x->exits++) {
    st->r0_umin = r->umin, st->r0_umax = r->umax, st->r0_smin = r->smin, st->r0_smax = r->smax;
    return;
  }
  if (r->umin < st->r0_umin) st->r0_umin = r->umin;
  if (r->umax > st->r0_umax) st->r0_umax = r->umax;
  if (r->smin < st->r0_smin) st->r0_smin = r->smin;
  if (r->smax > st->r0_smax) st->r0_smax = r->smax;
}

static int exit_main(struct explore *x) {
  struct ms_bpf_venv *env = &x->env;
  const struct ms_bpf_vreg *r0 = &ms_bpf_vregs(env)[0];
  if (env->cur->n_refs)
    return ms_bpf_vreject(env, "unreleased ringbuf reservation from insn %u: submit or discard it on every path",
                          env->cur->refs[0].insn);
  if (r0->type != MS_VT_SCALAR)
    return ms_bpf_vreject(env, "R0 at exit is a pointer (%s): a program returns a scalar, never a pointer",
                          ms_bpf_vtype_name(r0->type));
  const struct ms_verify_ctx *c = env->o.kind == MS_VERIFY_HOOK ? env->o.ctx : NULL;
  if (c && c->ret_bounded && r0->s.umax > c->ret_max) {
    char v[128] = "";
    if (!ms_bpf_sc_is_const(&r0->s)) {
      char s[112];
      ms_bpf_sc_print(&r0->s, s, sizeof s);
      snprintf(v, sizeof v, " (R0=%s)", s);
    }
    return ms_bpf_vreject(env, "R0 at exit may be %llu%s: %s must return 0..%llu",
                          (unsigned long long)(r0->s.umin > c->ret_max ? r0->s.umin : r0->s.umax), v,
                          c->prog_type, (unsigned long long)c->ret_max);
  }
  note_r0(x, &r0->s);
  return 0;
}

static int do_exit(struct explore *x, int *done) {
  struct ms_bpf_venv *env = &x->env;
  struct ms_bpf_vstate *s = env->cur;
  if (ms_bpf_vcheck_read(env, 0)) return -MS_E_VERIFY;
  if (s->curframe == 0) {
    *done = 1;
    return exit_main(x);
  }
  struct ms_bpf_vframe *f = s->frames[s->curframe];
  if (f->regs[0].type == MS_VT_STACK && f->regs[0].frame == s->curframe)
    return ms_bpf_vreject(env, "R0 points to the callee's own stack, which ends with the call");
  struct ms_bpf_vreg r0 = f->regs[0];
  uint32_t ret = (uint32_t)f->callsite + 1;
  if (ret >= x->func_end[f->callsite])
    return ms_bpf_vreject(env, "the call at insn %d is the last instruction of its function: nothing to "
                          "return to", f->callsite);
  free(f);
  s->frames[s->curframe--] = NULL;
  struct ms_bpf_vreg *caller = s->frames[s->curframe]->regs;
  caller[0] = r0;
  for (unsigned r = 1; r <= 5; r++) ms_bpf_vreg_not_init(&caller[r]);
  env->pc = ret;
  return 0;
}

static int do_jmp(struct explore *x, const struct ms_bpf_insn *in, int *done) {
  struct ms_bpf_venv *env = &x->env;
  switch (MS_BPF_OP(in->code)) {
  case MS_BPF_JA:
    env->pc += 1 + (uint32_t)(MS_BPF_CLASS(in->code) == MS_BPF_JMP32 ? in->imm : in->off);
    return 0;
  case MS_BPF_CALL:
    if (in->src_reg == MS_BPF_PSEUDO_CALL) return do_local_call(x, in);
    if (in->src_reg || MS_BPF_SRC(in->code) == MS_BPF_X)
      return ms_bpf_vreject(env, "call kind not supported (only helpers by id and bpf-to-bpf calls)");
    if (ms_bpf_vmem_helper(env, in)) return -MS_E_VERIFY;
    env->pc++;
    return 0;
  case MS_BPF_EXIT: return do_exit(x, done);
  default: return do_cond(x, in, done);
  }
}

/* ---- one instruction, the loop ------------------------------------------ */

static int step(struct explore *x, int *done) {
  struct ms_bpf_venv *env = &x->env;
  uint32_t pc = env->pc, fn = x->func[pc];
  const struct ms_bpf_insn *in = &env->insns[pc];
  int err = 0;
  switch (MS_BPF_CLASS(in->code)) {
  case MS_BPF_ALU: case MS_BPF_ALU64: err = do_alu(x, in); env->pc++; break;
  case MS_BPF_LD: err = do_lddw(x, in); env->pc += 2; break;
  case MS_BPF_LDX: err = ms_bpf_vmem_ldx(env, in); env->pc++; break;
  case MS_BPF_ST: err = ms_bpf_vmem_st(env, in); env->pc++; break;
  case MS_BPF_STX:
    err = MS_BPF_MODE(in->code) == MS_BPF_ATOMIC ? ms_bpf_vmem_atomic(env, in) : ms_bpf_vmem_st(env, in);
    env->pc++;
    break;
  default: {
    unsigned op = MS_BPF_OP(in->code);
    err = do_jmp(x, in, done);
    if (err || *done || op == MS_BPF_JA || op == MS_BPF_EXIT || in->src_reg == MS_BPF_PSEUDO_CALL) return err;
    break; /* a helper call or a conditional jump: the fall-through must stay inside */
  }
  }
  if (err) {
    env->pc = pc; /* name the failing instruction */
    return err;
  }
  if (env->pc >= x->func_end[pc] || x->func[env->pc] != fn) {
    env->pc = pc;
    return ms_bpf_vreject(env, "the function falls through past its end at insn %u (no exit or jump back)", pc);
  }
  return 0;
}

static int pop(struct explore *x) {
  struct ms_bpf_venv *env = &x->env;
  ms_bpf_vs_free(env->cur);
  env->cur = NULL;
  if (!x->n_pending) return 0;
  env->cur = x->pending[--x->n_pending];
  x->pending_bytes -= state_bytes(env->cur);
  env->pc = env->cur->insn;
  if (env->o.verbose) {
    char prefix[64];
    snprintf(prefix, sizeof prefix, "from %u to %u: ", env->cur->from, env->pc);
    ms_bpf_vtrace_state(env, prefix);
  }
  return 1;
}

static int explore_paths(struct explore *x) {
  struct ms_bpf_venv *env = &x->env;
  char text[128];
  for (int done = 0;;) {
    if (done) {
      if (finish_path(x, env->cur->depth + x->tail)) return -MS_E_VERIFY;
      x->tail = 0;
      if (!pop(x)) return 0;
      done = 0;
    }
    if (x->prune[env->pc]) {
      int v = visit(x);
      if (v < 0) return v;
      if (v) {
        x->st.pruned++;
        ms_bpf_vtrace(env, "%u: safe\n", env->pc);
        done = 1;
        continue;
      }
    }
    if (++x->st.processed > x->limit)
      return ms_bpf_vreject(env, "program too complex: processed %llu insns (limit %llu)",
                            (unsigned long long)x->st.processed, (unsigned long long)x->limit);
    env->cur->since_kept++;
    if (++env->cur->depth > x->run_budget) return over_budget(x, env->cur->depth, "a path runs");
    if ((x->st.processed & 1023) == 0 && check_work(x)) return -MS_E_VERIFY;
    if (env->o.verbose) {
      ms_bpf_vinsn_text(env, env->pc, text, sizeof text);
      ms_bpf_vtrace(env, "%u: (%02x) %s\n", env->pc, env->insns[env->pc].code, text);
    }
    const struct ms_bpf_insn *in = &env->insns[env->pc];
    int err = step(x, &done);
    if (err) return err;
    unsigned cls = MS_BPF_CLASS(in->code), op = MS_BPF_OP(in->code);
    if (!done && (cls == MS_BPF_JMP || cls == MS_BPF_JMP32) && op != MS_BPF_JA && op != MS_BPF_CALL &&
        op != MS_BPF_EXIT) {
      char prefix[32];
      snprintf(prefix, sizeof prefix, "%u: ", env->pc);
      ms_bpf_vtrace_state(env, prefix);
    }
  }
}

/* ---- setting up --------------------------------------------------------- */

static int init_state(struct explore *x) {
  struct ms_bpf_venv *env = &x->env;
  env->cur = ms_bpf_vs_new();
  if (!env->cur) return -ENOMEM;
  struct ms_bpf_vreg *r = env->cur->frames[0]->regs;
  r[10].type = MS_VT_STACK;
  r[10].s = ms_bpf_sc_const(0);
  if (env->o.kind == MS_VERIFY_HOOK) {
    r[1].type = MS_VT_CTX;
    r[1].s = ms_bpf_sc_const(0);
  } else {
    ms_bpf_vreg_const(&r[1], 0); /* no buffer: r1 is NULL */
    if (env->o.mem_size) r[1].type = MS_VT_MEM, r[1].size = env->o.mem_size;
    ms_bpf_vreg_const(&r[2], env->o.mem_size);
  }
  return 0;
}

static int alloc_shape(struct explore *x) {
  size_t n = x->env.n;
  x->func = calloc(n, sizeof *x->func);
  x->func_end = calloc(n, sizeof *x->func_end);
  x->prune = calloc(n, 1);
  x->live = calloc(n, sizeof *x->live);
  x->kept = calloc(n, sizeof *x->kept);
  x->n_kept = calloc(n, sizeof *x->n_kept);
  x->pending = calloc(MAX_PENDING, sizeof *x->pending);
  x->idmap = ms_bpf_idmap_new();
  return x->idmap && x->func && x->func_end && x->prune && x->live && x->kept && x->n_kept && x->pending ? 0 : -ENOMEM;
}

static void free_explore(struct explore *x) {
  if (x->kept)
    for (size_t i = 0; i < x->env.n; i++)
      for (struct ms_bpf_vstate *s = x->kept[i], *nx; s; s = nx) {
        nx = s->next;
        ms_bpf_vs_free(s);
      }
  for (size_t i = 0; x->pending && i < x->n_pending; i++) ms_bpf_vs_free(x->pending[i]);
  ms_bpf_vs_free(x->env.cur);
  free(x->func);
  free(x->func_end);
  free(x->prune);
  free(x->live);
  free(x->kept);
  free(x->n_kept);
  free(x->pending);
  free(x->idmap);
}

/* The context the caller described and the ABI version it asked for, checked. */
static int check_opts(struct explore *x) {
  const struct ms_verify_opts *o = &x->env.o;
  struct ms_textbuf *log = x->env.log;
  if (o->kind == MS_VERIFY_RAW_MEM) return 0;
  if (o->kind != MS_VERIFY_HOOK) {
    ms_textbuf_printf(log, "unknown verification kind %d\n", o->kind);
    return -EINVAL;
  }
  const struct ms_verify_ctx *c = o->ctx;
  if (!c || c->n_fields < 0 || c->n_fields > 64 || (c->n_fields && !c->fields)) {
    ms_textbuf_printf(log, "unknown hook %d or program type %d\n", o->hook, o->prog_type);
    return -EINVAL;
  }
  if (c->refused) {
    ms_textbuf_printf(log, "%s\n", c->refused);
    return -MS_E_VERIFY;
  }
  if (o->abi_version > c->abi_version) {
    ms_textbuf_printf(log, "program built for hook ABI version %u, newer than this engine's version %u\n",
                      o->abi_version, c->abi_version);
    return -MS_E_VERIFY;
  }
  return 0;
}

static int verify(struct explore *x) {
  int err = check_opts(x);
  if (err) return err;
  if (check_r10(x)) return -MS_E_VERIFY;
  err = ms_bpf_insns_check(x->env.insns, x->env.n, ms_bpf_prog_map_count(x->env.prog), x->env.log);
  if (err) return err == -ENOMEM ? err : -MS_E_VERIFY;
  err = alloc_shape(x);
  if (!err && find_functions(x)) err = -MS_E_VERIFY;
  if (!err) mark_prune_points(x);
  if (!err) err = compute_liveness(x);
  if (!err) err = init_state(x);
  if (!err) err = explore_paths(x);
  return err;
}

int ms_bpf_verify(const struct ms_bpf_prog *prog, const struct ms_verify_opts *opts, struct ms_textbuf *log,
                  struct ms_verify_stats *st) {
  struct explore *x = calloc(1, sizeof *x);
  if (!x) return -ENOMEM;
  uint64_t t0 = ms_now_ns();
  int err = 0;
  if (opts) memcpy(&x->env.o, opts, opts->sz < sizeof x->env.o ? opts->sz : sizeof x->env.o);
  x->env.log = log;
  x->env.log_reserve = LOG_RESERVE;
  x->env.err_insn = -1;
  x->limit = x->env.o.insn_limit ? x->env.o.insn_limit : MS_VERIFY_INSN_LIMIT;
  if (x->limit > MS_VERIFY_INSN_LIMIT_MAX) x->limit = MS_VERIFY_INSN_LIMIT_MAX; /* ids stay below MS_VT_GLOBAL_ID */
  x->states_cap = x->env.o.max_states_per_insn ? x->env.o.max_states_per_insn : MS_VERIFY_STATES_PER_INSN;
  x->run_budget = x->env.o.run_budget ? x->env.o.run_budget
                  : x->env.o.kind == MS_VERIFY_HOOK && x->env.o.ctx && x->env.o.ctx->run_budget
                      ? x->env.o.ctx->run_budget
                      : MS_BPF_DEFAULT_BUDGET;
  x->work_limit = x->env.o.work_limit ? x->env.o.work_limit : MS_VERIFY_WORK_LIMIT;
  if (!prog || !opts) {
    ms_textbuf_printf(log, "no program or no options\n");
    err = -EINVAL;
  } else {
    x->env.prog = prog;
    x->env.insns = ms_bpf_prog_insns(prog, &x->env.n);
    x->env.o.insn_limit = x->limit, x->env.o.max_states_per_insn = x->states_cap; /* the key: as applied */
    x->env.o.run_budget = x->run_budget, x->env.o.work_limit = x->work_limit;
    if (!x->env.o.verbose && ms_bpf_vcache_lookup(prog, &x->env.o, &x->st)) x->st.cached = 1;
    else err = verify(x);
  }
  if (!x->st.cached) {
    x->st.insn_limit = x->limit;
    x->st.err_insn = x->env.err_insn;
    x->st.max_run_insns = err ? 0 : x->max_run;
    x->st.run_budget = x->run_budget;
    x->st.work = work(x);
    x->st.work_limit = x->work_limit;
    if (!err && !x->env.o.verbose) ms_bpf_vcache_store(prog, &x->env.o, &x->st);
  }
  x->st.time_us = (ms_now_ns() - t0) / 1000;
  if (err == -ENOMEM) ms_textbuf_printf(log, "out of memory\n");
  ms_textbuf_printf(log, "processed %llu insns (limit %llu) max_states_per_insn %llu total_states %llu "
                    "peak_states %llu time_us %llu max_run_insns %llu work %llu\n",
                    (unsigned long long)x->st.processed, (unsigned long long)x->limit,
                    (unsigned long long)x->st.max_states_per_insn, (unsigned long long)x->st.total_states,
                    (unsigned long long)x->st.peak_states, (unsigned long long)x->st.time_us,
                    (unsigned long long)x->st.max_run_insns, (unsigned long long)x->st.work);
  if (st) *st = x->st;
  free_explore(x);
  free(x);
  return err;
}

/* ---- the other entry points --------------------------------------------- */

int ms_bpf_verify_raw(const struct ms_bpf_prog *prog, uint32_t mem_size, const struct ms_bpf_helpers *helpers,
                      struct ms_textbuf *log) {
  struct ms_verify_opts o = {.sz = sizeof o, .kind = MS_VERIFY_RAW_MEM, .mem_size = mem_size, .helpers = helpers};
  return ms_bpf_verify(prog, &o, log, NULL);
}

int ms_bpf_object_abi_version(const struct ms_bpf_object *obj, uint32_t *version, struct ms_textbuf *log) {
  size_t size = 0;
  *version = 0;
  const void *p = obj ? ms_bpf_object_section(obj, "megascope_abi", &size) : NULL;
  if (!p) return 0;
  if (size != sizeof(uint32_t)) {
    ms_textbuf_printf(log, "section megascope_abi holds %zu bytes, not one 32-bit version\n", size);
    return -MS_E_FORMAT;
  }
  memcpy(version, p, sizeof *version);
  return 0;
}
