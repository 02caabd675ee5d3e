/* SPDX-License-Identifier: MIT */
/* Verification bounded in work, whatever the program: a set of adversarial
 * programs (nested frames with full stacks and a loop counted in a stack slot,
 * long loops, thousands of branches, branches inside loops and in every frame)
 * each verified or refused within a bound on instructions processed and on
 * verifier work (instructions processed + state frames compared and copied),
 * both counted by the verifier itself. Nothing here measures time: work is
 * what the cap bounds, and time follows it.
 *
 * The first program is the shape that used to keep `megascope verify` busy
 * for minutes: eight frames, each with 32 stack slots written, and in the
 * deepest a loop whose counter lives only in a stack slot, so at the loop head
 * every iteration's registers are equal and the states differ in one slot. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "megascope/bpf.h"
#include "megascope/hook.h"
#include "megascope/verifier.h"
#include "test.h"

static char logbuf[1 << 16];
static struct ms_textbuf tlog;
static struct ms_bpf_helpers *helpers;

/* A growing program text. */
struct text {
  char *s;
  size_t len, cap;
};

__attribute__((format(printf, 2, 3))) static void add(struct text *t, const char *fmt, ...) {
  va_list ap;
  for (;;) {
    va_start(ap, fmt);
    int n = vsnprintf(t->s ? t->s + t->len : NULL, t->s ? t->cap - t->len : 0, fmt, ap);
    va_end(ap);
    MS_ASSERT(n >= 0);
    if (t->s && t->len + (size_t)n < t->cap) {
      t->len += (size_t)n;
      return;
    }
    t->cap = (t->cap + (size_t)n + 1) * 2;
    t->s = realloc(t->s, t->cap);
    MS_ASSERT(t->s);
    if (!t->len) t->s[0] = 0;
  }
}

struct outcome {
  int rc;
  size_t n_insns;
  struct ms_verify_stats st;
};

/* Verifies text as an observe program on task_end with opts' limits. */
static struct outcome verify(const struct text *t, uint64_t run_budget, uint64_t work_limit) {
  struct outcome o = {.rc = -1000};
  struct ms_bpf_insn *insns = NULL;
  logbuf[0] = 0;
  tlog = (struct ms_textbuf){logbuf, sizeof logbuf, 0, 0};
  if (ms_bpf_asm(t->s, &insns, &o.n_insns, &tlog)) {
    fprintf(stderr, "assembly failed: %s\n", logbuf);
    return o;
  }
  struct ms_bpf_prog_opts po = {.sz = sizeof po, .name = "adversarial", .log = &tlog};
  struct ms_bpf_prog *p = ms_bpf_prog_new(insns, o.n_insns, &po);
  free(insns);
  if (!p) return o;
  struct ms_verify_opts vo = {.sz = sizeof vo, .kind = MS_VERIFY_HOOK, .prog_type = MS_PROG_OBSERVE,
                              .hook = MS_HOOK_TASK_END, .helpers = helpers, .run_budget = run_budget,
                              .work_limit = work_limit, .ctx = ms_hook_verify_ctx(MS_PROG_OBSERVE, MS_HOOK_TASK_END)};
  logbuf[0] = 0;
  tlog = (struct ms_textbuf){logbuf, sizeof logbuf, 0, 0};
  o.rc = ms_bpf_verify(p, &vo, &tlog, &o.st);
  ms_bpf_prog_free(p);
  return o;
}

static void report(const char *name, const struct outcome *o) {
  printf("%-44s %5zu insns: %-8s processed %7llu  work %8llu  longest run %6llu  (%llu us, for the record)\n",
         name, o->n_insns, o->rc ? "refused" : "verified", (unsigned long long)o->st.processed,
         (unsigned long long)o->st.work, (unsigned long long)o->st.max_run_insns,
         (unsigned long long)o->st.time_us);
}

/* The last line before the stats line: the reason. */
static int reason_has(const char *what) {
  return strstr(logbuf, what) != NULL;
}

/* ---- 1. deep frames, full stacks, a loop counted in a stack slot --------- */

static void fill_stack(struct text *t, int slots) {
  for (int k = 1; k <= slots; k++) add(t, "mov %%r4, %d\nstxdw [%%r10-%d], %%r4\n", k, 8 * k);
}

static void deep_loop(struct text *t, int frames, int slots, unsigned iterations) {
  for (int f = 0; f < frames - 1; f++) {
    if (f) add(t, "f%d:\n", f);
    fill_stack(t, slots);
    add(t, "mov %%r1, 0\ncall local f%d\nexit\n", f + 1);
  }
  add(t, "f%d:\n", frames - 1);
  fill_stack(t, slots);
  int ctr = 8 * (slots + 1);
  add(t, "mov %%r1, 0\nstxdw [%%r10-%d], %%r1\nloop:\nldxdw %%r1, [%%r10-%d]\nadd %%r1, 1\n"
         "stxdw [%%r10-%d], %%r1\njlt %%r1, %u, loop\nmov %%r0, 0\nexit\n", ctr, ctr, ctr, iterations);
}

static void test_deep_loop(void) {
  struct text t = {0};
  deep_loop(&t, 8, 32, 300000);
  /* the hook budget ends it: one path longer than a run may be */
  struct outcome o = verify(&t, 0, 0);
  report("8 frames, 32 slots each, stack-slot loop", &o);
  CHECKF(o.rc == -MS_E_VERIFY && reason_has("program too long for one run"), "deep loop: rc %d: %s", o.rc, logbuf);
  CHECKF(o.st.processed <= MS_HOOK_RUN_BUDGET + 1, "deep loop: processed %llu", (unsigned long long)o.st.processed);
  CHECKF(o.st.work <= 3 * (MS_HOOK_RUN_BUDGET + 1), "deep loop: work %llu", (unsigned long long)o.st.work);
  /* without a run budget, the complexity cap ends it, and the work stays in proportion */
  o = verify(&t, 1ull << 40, 0);
  report("... no run budget", &o);
  CHECKF(o.rc == -MS_E_VERIFY && reason_has("program too complex"), "deep loop, no budget: rc %d: %s", o.rc, logbuf);
  CHECKF(o.st.processed <= MS_VERIFY_INSN_LIMIT + 1, "deep loop, no budget: processed %llu",
         (unsigned long long)o.st.processed);
  CHECKF(o.st.work <= 3ull * (MS_VERIFY_INSN_LIMIT + 1), "deep loop, no budget: work %llu",
         (unsigned long long)o.st.work);
  /* and a work cap below that refuses it at the cap, naming the figures */
  o = verify(&t, 1ull << 40, 150000);
  report("... work cap 150000", &o);
  CHECKF(o.rc == -MS_E_VERIFY && reason_has("verifier work") && reason_has("exceeds the limit 150000"),
         "deep loop, work cap: rc %d: %s", o.rc, logbuf);
  CHECKF(o.st.work <= 150000 + 2048, "deep loop, work cap: work %llu", (unsigned long long)o.st.work);
  /* a cancelled verification stops at its next check, refused */
  int cancel = 1;
  ms_bpf_verify_set_cancel(&cancel);
  o = verify(&t, 1ull << 40, 0);
  ms_bpf_verify_set_cancel(NULL);
  report("... cancelled", &o);
  CHECKF(o.rc == -MS_E_VERIFY && reason_has("verification cancelled") && o.st.processed <= 1024,
         "deep loop, cancelled: rc %d processed %llu: %s", o.rc, (unsigned long long)o.st.processed, logbuf);
  /* a short one verifies: its bound is its one path */
  t.len = 0;
  deep_loop(&t, 8, 32, 1000);
  o = verify(&t, 0, 0);
  report("8 frames, stack-slot loop of 1000", &o);
  CHECKF(o.rc == 0, "deep loop of 1000: %s", logbuf);
  CHECKF(o.st.processed == o.st.max_run_insns, "deep loop of 1000: processed %llu, one path of %llu",
         (unsigned long long)o.st.processed, (unsigned long long)o.st.max_run_insns);
  free(t.s);
}

/* ---- 2. many branches ---------------------------------------------------- */

/* n diamonds, each on a bit of a value loaded afresh from the context (at r6);
 * `exact` makes r0 a different constant on every path (nothing prunes), else
 * the value is folded into r3, unknown on both sides (each join prunes). */
static void diamonds(struct text *t, int n, int exact, int base) {
  for (int k = 0; k < n; k++) {
    add(t, "ldxdw %%r2, [%%r6+24]\njset %%r2, %llu, d%d\n", 1ull << (k % 31), base + k);
    add(t, exact ? "add %%r0, 1\n" : "xor %%r3, %%r2\n");
    add(t, exact ? "d%d:\nlsh %%r0, 1\n" : "d%d:\n", base + k); /* exact: r0 spells the path in bits */
  }
}

static void test_branches(void) {
  struct text t = {0};
  add(&t, "mov %%r6, %%r1\nldxdw %%r3, [%%r6+24]\nmov %%r0, 0\n");
  diamonds(&t, 3000, 0, 0);
  add(&t, "mov %%r0, %%r3\nand %%r0, 1\nexit\n");
  struct outcome o = verify(&t, 0, 0);
  report("3000 branches (2^3000 paths), prunable", &o);
  CHECKF(o.rc == 0, "3000 branches: %s", logbuf);
  CHECKF(o.st.processed <= 5 * o.n_insns, "3000 branches: processed %llu for %zu insns",
         (unsigned long long)o.st.processed, o.n_insns);
  CHECKF(o.st.work <= 20 * o.n_insns, "3000 branches: work %llu", (unsigned long long)o.st.work);
  /* constants that differ on every path: exponential, refused at the cap */
  t.len = 0;
  add(&t, "mov %%r6, %%r1\nmov %%r0, 0\n");
  diamonds(&t, 40, 1, 0);
  add(&t, "and %%r0, 1\nexit\n");
  o = verify(&t, 0, 0);
  report("40 branches, every path a new constant", &o);
  CHECKF(o.rc == -MS_E_VERIFY && reason_has("program too complex"), "40 exact branches: rc %d: %s", o.rc, logbuf);
  CHECKF(o.st.processed <= MS_VERIFY_INSN_LIMIT + 1 && o.st.work <= MS_VERIFY_WORK_LIMIT + 2048,
         "40 exact branches: processed %llu work %llu", (unsigned long long)o.st.processed,
         (unsigned long long)o.st.work);
  free(t.s);
}

/* ---- 3. branches in every one of eight frames ---------------------------- */

static void test_frames(void) {
  struct text t = {0};
  for (int f = 0; f < 8; f++) { /* each frame gets the context in r1 and keeps it in r6 */
    if (f) add(&t, "g%d:\n", f);
    add(&t, "mov %%r6, %%r1\nldxdw %%r3, [%%r6+24]\n");
    fill_stack(&t, 16);
    diamonds(&t, 24, 0, 100 * f);
    if (f < 7) add(&t, "mov %%r1, %%r6\ncall local g%d\nmov %%r3, %%r0\n", f + 1);
    diamonds(&t, 24, 0, 100 * f + 50);
    add(&t, "mov %%r0, %%r3\nand %%r0, 1\nexit\n");
  }
  struct outcome o = verify(&t, 0, 0);
  report("8 frames, 48 branches each", &o);
  CHECKF(o.rc == 0, "8 frames of branches: %s", logbuf);
  CHECKF(o.st.processed <= 4 * o.n_insns, "8 frames of branches: processed %llu for %zu insns",
         (unsigned long long)o.st.processed, o.n_insns);
  free(t.s);
}

/* ---- 4. long loops --------------------------------------------------------- */

static void test_loops(void) {
  struct text t = {0};
  /* 20000 iterations of four instructions: one path, verified exactly */
  add(&t, "mov %%r0, 0\nmov %%r4, 0\nL:\nadd %%r4, 3\nadd %%r0, 1\nxor %%r4, %%r0\njlt %%r0, 20000, L\n"
          "mov %%r0, 0\nexit\n");
  struct outcome o = verify(&t, 0, 0);
  report("loop of 20000", &o);
  CHECKF(o.rc == 0 && o.st.max_run_insns == 2 + 4 * 20000 + 2, "loop of 20000: rc %d bound %llu: %s", o.rc,
         (unsigned long long)o.st.max_run_insns, logbuf);
  CHECKF(o.st.processed == o.st.max_run_insns, "loop of 20000: processed %llu", (unsigned long long)o.st.processed);
  /* a branch on unknown data in each of 2000 iterations */
  t.len = 0;
  add(&t, "ldxdw %%r2, [%%r1+24]\nmov %%r3, %%r2\nmov %%r0, 0\nL:\njset %%r2, 4, M\nxor %%r3, %%r2\nM:\n"
          "add %%r0, 1\njlt %%r0, 2000, L\nmov %%r0, %%r3\nand %%r0, 1\nexit\n");
  o = verify(&t, 0, 0);
  report("loop of 2000 with a branch in each", &o);
  CHECKF(o.rc == 0, "loop with branches: %s", logbuf);
  CHECKF(o.st.processed <= 2 * o.st.max_run_insns, "loop with branches: processed %llu, longest run %llu",
         (unsigned long long)o.st.processed, (unsigned long long)o.st.max_run_insns);
  /* a loop of unknown bound: refused when its path outgrows the run budget */
  t.len = 0;
  add(&t, "ldxdw %%r2, [%%r1+24]\nmov %%r0, 0\nL:\nadd %%r0, 1\njlt %%r0, %%r2, L\nexit\n");
  o = verify(&t, 0, 0);
  report("loop of unknown bound", &o);
  CHECKF(o.rc == -MS_E_VERIFY && reason_has("program too long for one run"), "unknown bound: rc %d: %s", o.rc,
         logbuf);
  CHECKF(o.st.processed <= MS_HOOK_RUN_BUDGET * 2, "unknown bound: processed %llu",
         (unsigned long long)o.st.processed);
  free(t.s);
}

/* ---- 5. verdicts remembered --------------------------------------------- */

/* The same question again is answered without exploring; any difference in
 * the options, the program or the helpers' prototypes is a new question. */
static void test_cache(void) {
  struct text t = {0};
  deep_loop(&t, 4, 8, 500);
  add(&t, "f9:\ncall 1\nexit\n"); /* never reached, but it names helper 1 */
  struct outcome a = verify(&t, 0, 0), b = verify(&t, 0, 0);
  CHECKF(a.rc == 0 && b.rc == 0 && !a.st.cached && b.st.cached, "cache: rc %d/%d cached %u/%u", a.rc, b.rc,
         a.st.cached, b.st.cached);
  CHECKF(a.st.processed == b.st.processed && a.st.max_run_insns == b.st.max_run_insns,
         "cache: the remembered figures differ");
  struct outcome c = verify(&t, 0, MS_VERIFY_WORK_LIMIT - 1);
  CHECKF(c.rc == 0 && !c.st.cached, "cache: another work limit was answered from the cache");
  /* the helper table's contents are part of the question, not its address */
  static const struct ms_bpf_helper_proto other = {MS_BPF_FN_MAP_LOOKUP_ELEM, "map_lookup_elem",
                                                   MS_BPF_RET_INTEGER, {MS_BPF_ARG_ANYTHING}, 0};
  struct ms_bpf_helpers *saved = helpers;
  helpers = ms_bpf_helpers_new();
  CHECK(helpers && !ms_bpf_helpers_add_std(helpers) &&
        !ms_bpf_helpers_set(helpers, &other, ms_bpf_helpers_fn(saved, MS_BPF_FN_MAP_LOOKUP_ELEM)));
  struct outcome d = verify(&t, 0, 0);
  CHECKF(d.rc == 0 && !d.st.cached, "cache: another prototype of helper 1 was answered from the cache");
  ms_bpf_helpers_free(helpers);
  helpers = saved;
  /* a rejection is never remembered */
  t.len = 0;
  deep_loop(&t, 2, 4, 300000);
  a = verify(&t, 0, 0), b = verify(&t, 0, 0);
  CHECKF(a.rc && b.rc && !b.st.cached && a.st.processed == b.st.processed, "cache: a rejection was remembered");
  free(t.s);
}

int main(void) {
  helpers = ms_bpf_helpers_new();
  CHECK(helpers && !ms_bpf_helpers_add_std(helpers));
  test_deep_loop();
  test_branches();
  test_frames();
  test_loops();
  test_cache();
  ms_bpf_helpers_free(helpers);
  TEST_MAIN_END();
}
