/* SPDX-License-Identifier: MIT */
/* One meaning per program whatever runs it: the reference interpreter, the
 * x86-64 JIT and the device interpreter (bpf_core.h, run here on the CPU)
 * count a run's instructions alike (every instruction executed, lddw once)
 * and stop it at the same budget; the verifier's proven bound (the longest
 * run, max_run_insns) is exactly what they count, and a hook program whose
 * longest run exceeds MS_HOOK_RUN_BUDGET is refused, so a verified program
 * never stops for budget in any engine.
 *
 * Programs sit at the boundary: longest run = the budget (verified, runs to
 * the end everywhere with that budget, stops everywhere one below it) and the
 * budget + 1 (refused; unverified runs stop everywhere at the budget and
 * finish everywhere one above it), as a plain loop, a loop in a callee after
 * an lddw, the 40,000-iteration loop, and data-dependent paths of
 * unequal length whose bound must be the longer one. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/bpf_core.h"
#include "megascope/bpf.h"
#include "megascope/bpf_jit.h"
#include "megascope/hook.h"
#include "megascope/verifier.h"
#include "test.h"

#define B MS_HOOK_RUN_BUDGET

enum { ENG_INTERP, ENG_JIT, ENG_DEVICE, ENG_COUNT };
static const char *const eng_name[ENG_COUNT] = {"interpreter", "jit", "device"};

static char logbuf[1 << 16];
static struct ms_textbuf tlog;
static struct ms_bpf_helpers *helpers;

static void log_reset(void) {
  logbuf[0] = 0;
  tlog = (struct ms_textbuf){logbuf, sizeof logbuf, 0, 0};
}

static struct ms_bpf_prog *prog_of(const char *text) {
  struct ms_bpf_insn *insns = NULL;
  size_t n = 0;
  log_reset();
  if (ms_bpf_asm(text, &insns, &n, &tlog)) {
    fprintf(stderr, "assembly failed: %s\n%s\n", logbuf, text);
    return NULL;
  }
  struct ms_bpf_prog_opts po = {.sz = sizeof po, .name = "budget", .log = &tlog};
  struct ms_bpf_prog *p = ms_bpf_prog_new(insns, n, &po);
  free(insns);
  return p;
}

static struct ms_verify_opts hook_opts(uint64_t run_budget) {
  return (struct ms_verify_opts){.sz = sizeof(struct ms_verify_opts), .kind = MS_VERIFY_HOOK,
                                 .prog_type = MS_PROG_OBSERVE, .hook = MS_HOOK_TASK_END, .helpers = helpers,
                                 .run_budget = run_budget,
                                 .ctx = ms_hook_verify_ctx(MS_PROG_OBSERVE, MS_HOOK_TASK_END)};
}

struct runs {
  int rc[ENG_COUNT];
  uint64_t insns[ENG_COUNT], r0[ENG_COUNT];
};

/* Runs p (and j, its compiled form, when given) on ctx with budget in every
 * engine. */
static void run_all(const struct ms_bpf_prog *p, const struct ms_bpf_jit *j, const struct ms_hook_ctx *ctx,
                    uint64_t budget, struct runs *out) {
  struct ms_bpf_run_opts ro = {.sz = sizeof ro, .helpers = helpers, .ctx = ctx, .ctx_size = sizeof *ctx,
                               .insn_budget = budget};
  struct ms_bpf_run_result r;
  out->rc[ENG_INTERP] = ms_bpf_run(p, &ro, &r);
  out->insns[ENG_INTERP] = r.insns, out->r0[ENG_INTERP] = r.r0;
  out->rc[ENG_JIT] = j ? ms_bpf_jit_run(j, &ro, &r) : -ENOTSUP;
  out->insns[ENG_JIT] = j ? r.insns : 0, out->r0[ENG_JIT] = j ? r.r0 : 0;
  size_t n;
  struct msd_run in;
  msd_run_init(&in);
  in.insns = ms_bpf_prog_insns(p, &n);
  in.n_insns = (uint32_t)n;
  in.ctx = ctx;
  in.ctx_size = sizeof *ctx;
  in.budget = budget;
  struct msd_result d;
  out->rc[ENG_DEVICE] = msd_bpf_run(&in, &d);
  out->insns[ENG_DEVICE] = d.insns, out->r0[ENG_DEVICE] = d.r0;
}

/* Every engine (the JIT when j) returned rc; when 0, each executed insns. */
static void expect_all(const char *what, const struct runs *r, int have_jit, int rc, uint64_t insns) {
  for (int e = 0; e < ENG_COUNT; e++) {
    if (e == ENG_JIT && !have_jit) continue;
    CHECKF(r->rc[e] == rc, "%s: %s returned %d (%s), expected %d", what, eng_name[e], r->rc[e],
           ms_strerror(r->rc[e]), rc);
    if (!rc)
      CHECKF(r->insns[e] == insns, "%s: %s executed %llu instructions, expected %llu", what, eng_name[e],
             (unsigned long long)r->insns[e], (unsigned long long)insns);
  }
}

static struct ms_bpf_jit *jit_of(const struct ms_bpf_prog *p, uint64_t run_budget) {
  if (!ms_bpf_jit_supported()) return NULL;
  struct ms_verify_opts vo = hook_opts(run_budget);
  struct ms_bpf_jit_opts jo = {.sz = sizeof jo, .verify = &vo, .helpers = helpers, .log = &tlog};
  log_reset();
  struct ms_bpf_jit *j = ms_bpf_jit_new(p, &jo);
  CHECKF(j, "the JIT did not compile a verified program: %s", logbuf);
  return j;
}

/* A program whose every run executes exactly `len` instructions (len <= B):
 * verified with max_run_insns == len when len <= B; at budget len it ends in
 * every engine with that count, at len - 1 it stops in every engine. Over B:
 * refused, and the same holds of its unverified runs. */
static void boundary(const char *what, const char *text, uint64_t len) {
  struct ms_bpf_prog *p = prog_of(text);
  CHECKF(p, "%s: not assembled", what);
  if (!p) return;
  struct ms_hook_ctx ctx = {.hook = MS_HOOK_TASK_END, .step = 3};
  struct ms_verify_opts vo = hook_opts(0);
  struct ms_verify_stats st;
  log_reset();
  int rc = ms_bpf_verify(p, &vo, &tlog, &st);
  char name[160];
  if (len <= B) {
    CHECKF(rc == 0, "%s: a run of %llu instructions (budget %u) was refused: %s", what, (unsigned long long)len, B,
           logbuf);
    CHECKF(st.max_run_insns == len, "%s: proven bound %llu, every run executes %llu", what,
           (unsigned long long)st.max_run_insns, (unsigned long long)len);
  } else {
    CHECKF(rc == -MS_E_VERIFY && strstr(logbuf, "program too long for one run") &&
               strstr(logbuf, "more than the run budget of 100000"),
           "%s: a run of %llu instructions (budget %u) was not refused for it: rc %d %s", what,
           (unsigned long long)len, B, rc, logbuf);
    /* verified for a larger budget: the bound is exact */
    vo.run_budget = len;
    log_reset();
    rc = ms_bpf_verify(p, &vo, &tlog, &st);
    CHECKF(rc == 0 && st.max_run_insns == len, "%s: with run budget %llu: rc %d, bound %llu: %s", what,
           (unsigned long long)len, rc, (unsigned long long)st.max_run_insns, logbuf);
  }
  struct ms_bpf_jit *j = jit_of(p, len);
  struct runs r;
  run_all(p, j, &ctx, len, &r);
  snprintf(name, sizeof name, "%s, budget %llu", what, (unsigned long long)len);
  expect_all(name, &r, j != NULL, 0, len);
  run_all(p, j, &ctx, len - 1, &r);
  snprintf(name, sizeof name, "%s, budget %llu", what, (unsigned long long)len - 1);
  expect_all(name, &r, j != NULL, -MS_E_LIMIT, 0);
  if (len > B) { /* what the engines give a hook run: a refused program would stop in every one */
    run_all(p, j, &ctx, B, &r);
    snprintf(name, sizeof name, "%s, the hook budget", what);
    expect_all(name, &r, j != NULL, -MS_E_LIMIT, 0);
  }
  ms_bpf_jit_free(j);
  ms_bpf_prog_free(p);
}

/* mov r0, 0; [pad]; L: add r0, 1; jlt r0, n, L; exit: 2 + pad + 2n instructions. */
static void loop_text(char *buf, size_t size, int pad, uint64_t n) {
  snprintf(buf, size, "mov %%r0, 0\n%sL:\nadd %%r0, 1\njlt %%r0, %llu, L\nexit", pad ? "mov %r1, 0\n" : "",
           (unsigned long long)n);
}

static void test_boundaries(void) {
  char t[512];
  loop_text(t, sizeof t, 0, (B - 2) / 2); /* 2 + 2n = B */
  boundary("loop of the budget", t, B);
  loop_text(t, sizeof t, 1, (B - 2) / 2); /* 3 + 2n = B + 1 */
  boundary("loop of the budget + 1", t, B + 1);
  /* an lddw (one instruction), a local call, the loop in the callee: 6 + 2k */
  snprintf(t, sizeof t, "lddw %%r6, 0x100000000\nmov %%r1, 0\ncall local f\nexit\nf:\nmov %%r0, 0\nL:\n"
           "add %%r0, 1\njlt %%r0, %u, L\nexit", (B - 6) / 2);
  boundary("lddw, a call, a loop in the callee", t, B);
  snprintf(t, sizeof t, "lddw %%r6, 0x100000000\nmov %%r1, 0\ncall local f\nmov %%r1, 0\nexit\nf:\nmov %%r0, 0\n"
           "L:\nadd %%r0, 1\njlt %%r0, %u, L\nexit", (B - 6) / 2);
  boundary("lddw, a call, a loop in the callee, + 1", t, B + 1);
  /* the issue's: 40,000 iterations of three instructions */
  boundary("40,000 iterations", "mov %r0, 0\nmov %r2, 0\nL:\nadd %r0, 3\nadd %r2, 1\njlt %r2, 40000, L\nexit",
           3 * 40000 + 3);
}

/* Paths of unequal length chosen by the context: the bound is the longest,
 * and no run on any context executes more (nor differs between engines). */
static void test_paths(void) {
  /* step odd: a loop of 100 (2 + 200 + ...); even: straight on */
  static const char text[] = "ldxdw %r2, [%r1+24]\nmov %r0, 0\njset %r2, 1, odd\nadd %r0, 7\nexit\n"
                             "odd:\nadd %r0, 1\njlt %r0, 100, odd\nexit";
  struct ms_bpf_prog *p = prog_of(text);
  CHECK(p);
  if (!p) return;
  struct ms_verify_opts vo = hook_opts(0);
  struct ms_verify_stats st;
  log_reset();
  int rc = ms_bpf_verify(p, &vo, &tlog, &st);
  /* odd: ldx, mov, jset, then 100 x (add, jlt), exit = 3 + 200 + 1 */
  CHECKF(rc == 0 && st.max_run_insns == 204, "unequal paths: rc %d bound %llu (want 204): %s", rc,
         (unsigned long long)st.max_run_insns, logbuf);
  struct ms_bpf_jit *j = jit_of(p, 0);
  for (uint64_t step = 0; step < 4; step++) {
    struct ms_hook_ctx ctx = {.hook = MS_HOOK_TASK_END, .step = step};
    struct runs r;
    run_all(p, j, &ctx, B, &r);
    char name[64];
    snprintf(name, sizeof name, "unequal paths, step %llu", (unsigned long long)step);
    expect_all(name, &r, j != NULL, 0, step & 1 ? 204 : 5);
    CHECKF(r.insns[ENG_INTERP] <= st.max_run_insns, "step %llu ran %llu, more than the bound %llu",
           (unsigned long long)step, (unsigned long long)r.insns[ENG_INTERP], (unsigned long long)st.max_run_insns);
  }
  ms_bpf_jit_free(j);
  ms_bpf_prog_free(p);
}

int main(void) {
  helpers = ms_bpf_helpers_new();
  CHECK(helpers && !ms_bpf_helpers_add_std(helpers));
  test_boundaries();
  test_paths();
  ms_bpf_helpers_free(helpers);
  TEST_MAIN_END();
}
