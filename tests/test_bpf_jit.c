/* SPDX-License-Identifier: MIT */
/* The x86-64 JIT against the reference interpreter. The JIT trusts the
 * verifier instead of checking memory, so every check here runs the same
 * verified program twice, once under ms_bpf_run and once under
 * ms_bpf_jit_run, each on its own copy of the same input, and requires the
 * same return code, the same r0 and the same final bytes of the mem buffer
 * (and of the maps). The interpreter is the reference; the JIT is never
 * compared with a constant alone.
 *
 * What runs:
 *   - the conformance suite (when $MS_SHARED holds it): every file the
 *     verifier accepts in RAW_MEM form, also held to its -- result;
 *   - one instruction at a time inside a frame that loads r0-r9 from mem
 *     first and writes all of them back after, so a JIT that clobbers a
 *     register it should not (x86 division uses rax/rdx, shifts cl) shows up
 *     as well as a wrong result: every ALU operation in both widths with
 *     every pair of registers and every pair of sixteen edge values (INT_MIN,
 *     -1, 0, shift counts past the width, ...), immediates among them; neg,
 *     movsx, byte swaps; every jump condition; loads, stores and atomics of
 *     every size on the mem buffer and the stack; lddw;
 *   - hand-written programs: division by zero, INT_MIN / -1, loops, far
 *     jumps, bpf-to-bpf calls (nested, recursive, r6-r9 kept, own stacks),
 *     helpers with five arguments, on an aligned native stack, one that
 *     aborts; the instruction budget;
 *   - random programs from fixed seeds (straight line with forward branches,
 *     stores, atomics, helper calls);
 *   - array, hash, per-worker and ring buffer maps, compared entry by entry
 *     (record by record) after the runs; a monitor in the hook form;
 *   - misuse: an unverifiable program, runs with other helpers or maps;
 *   - one compiled program run from several threads at once.
 * A host without the JIT reports itself skipped (77). */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "megascope/bpf.h"
#include "megascope/bpf_jit.h"
#include "megascope/hook.h"
#include "megascope/verifier.h"
#include "test.h"

#define MEM_MAX 4096                   /* the largest mem buffer a check uses */
#define RUN_BUDGET (1u << 24)          /* as the conformance checker's */
#define MISMATCH_PRINT_MAX 20          /* detailed reports per section; all are counted */

static char logbuf[1 << 16];
static struct ms_textbuf tlog;
static struct ms_bpf_helpers *helpers; /* std, identity as 5, and the test helpers below */
static const struct ms_bpf_env run_env = {.worker = 3};

static void log_reset(void) {
  logbuf[0] = 0;
  tlog = (struct ms_textbuf){logbuf, sizeof logbuf, 0, 0};
}

/* ---- helpers ------------------------------------------------------------ */

#define H_ARGS5 (MS_BPF_HELPER_OWN_BASE + 1)
#define H_ABORT (MS_BPF_HELPER_OWN_BASE + 2)
#define H_PEEK (MS_BPF_HELPER_OWN_BASE + 3)
#define H_ALIGN (MS_BPF_HELPER_OWN_BASE + 4)
#define ABORT_ERR (-EPERM)

/* The conformance runner's helper 5: returns its first argument. */
static uint64_t identity_fn(struct ms_bpf_exec *x, uint64_t a1, uint64_t a2, uint64_t a3, uint64_t a4,
                            uint64_t a5) {
  return a1;
}

/* Records its five arguments, so a run can show each one arrived. Not
 * thread-safe: only the single-threaded checks call it. */
static uint64_t args5_seen[5];
static uint64_t args5_fn(struct ms_bpf_exec *x, uint64_t a1, uint64_t a2, uint64_t a3, uint64_t a4,
                         uint64_t a5) {
  uint64_t a[5] = {a1, a2, a3, a4, a5};
  memcpy(args5_seen, a, sizeof a);
  return a1 ^ (a2 << 1) ^ (a3 << 2) ^ (a4 << 3) ^ (a5 << 4);
}

/* Stops the run when its argument is 42; otherwise returns it plus one. */
static uint64_t abort_fn(struct ms_bpf_exec *x, uint64_t a1, uint64_t a2, uint64_t a3, uint64_t a4,
                         uint64_t a5) {
  if (a1 == 42) ms_bpf_exec_abort(x, ABORT_ERR, "refused %" PRIu64, a1);
  return a1 + 1;
}

/* Sums a2 bytes at a1, which must lie in a region of the run: shows the JIT
 * gives helpers the same view of the stack and mem as the interpreter. */
static uint64_t peek_fn(struct ms_bpf_exec *x, uint64_t a1, uint64_t a2, uint64_t a3, uint64_t a4,
                        uint64_t a5) {
  const uint8_t *p = ms_bpf_exec_mem(x, a1, a2, 0);
  if (!p) {
    ms_bpf_exec_abort(x, -EFAULT, "peek outside the run's regions");
    return 0;
  }
  uint64_t sum = ms_bpf_exec_env(x)->worker;
  for (uint64_t i = 0; i < a2; i++) sum = sum * 31 + p[i];
  return sum;
}

/* Returns the misalignment of a 16-aligned local: 0 when the code called it
 * with the stack aligned as the SysV ABI requires (SSE spills and varargs
 * depend on it). */
static uint64_t align_fn(struct ms_bpf_exec *x, uint64_t a1, uint64_t a2, uint64_t a3, uint64_t a4,
                         uint64_t a5) {
  _Alignas(16) uint8_t probe[16];
  volatile uintptr_t at = (uintptr_t)probe; /* read back: the compiler may not assume the alignment */
  return at & 15;
}

static struct ms_bpf_helpers *helpers_build(void) {
  static const struct ms_bpf_helper_proto protos[] = {
      {5, "identity", MS_BPF_RET_INTEGER, {MS_BPF_ARG_ANYTHING}, 0},
      {H_ARGS5, "args5", MS_BPF_RET_INTEGER,
       {MS_BPF_ARG_ANYTHING, MS_BPF_ARG_ANYTHING, MS_BPF_ARG_ANYTHING, MS_BPF_ARG_ANYTHING, MS_BPF_ARG_ANYTHING}, 0},
      {H_ABORT, "abort_on_42", MS_BPF_RET_INTEGER, {MS_BPF_ARG_ANYTHING}, 0},
      {H_PEEK, "peek", MS_BPF_RET_INTEGER, {MS_BPF_ARG_MEM, MS_BPF_ARG_SIZE}, 0},
      {H_ALIGN, "stack_misalignment", MS_BPF_RET_INTEGER, {MS_BPF_ARG_NONE}, 0},
  };
  static const ms_bpf_helper_fn fns[] = {identity_fn, args5_fn, abort_fn, peek_fn, align_fn};
  struct ms_bpf_helpers *h = ms_bpf_helpers_new();
  int err = h ? ms_bpf_helpers_add_std(h) : -ENOMEM;
  for (size_t i = 0; !err && i < sizeof protos / sizeof protos[0]; i++)
    err = ms_bpf_helpers_set(h, &protos[i], fns[i]); /* 5 replaces ktime_get_ns */
  if (err) {
    ms_bpf_helpers_free(h);
    return NULL;
  }
  return h;
}

/* ---- one program, two executions ---------------------------------------- */

/* A program of insns (the conformance files' names are its name). */
static struct ms_bpf_prog *prog_of_insns(const struct ms_bpf_insn *insns, size_t n, const char *name,
                                         const struct ms_bpf_map_def *maps, size_t n_maps) {
  struct ms_bpf_prog_opts po = {.sz = sizeof po, .name = name, .maps = maps, .n_maps = n_maps, .log = &tlog};
  log_reset();
  return ms_bpf_prog_new(insns, n, &po);
}

/* Assembles text into a program naming maps (may be NULL). NULL on error,
 * with the message printed: the test's own text is wrong. */
static struct ms_bpf_prog *prog_of(const char *text, const struct ms_bpf_map_def *maps, size_t n_maps) {
  struct ms_bpf_insn *insns = NULL;
  size_t n = 0;
  log_reset();
  if (ms_bpf_asm(text, &insns, &n, &tlog)) {
    fprintf(stderr, "assembly failed: %s---\n%s\n---\n", logbuf, text);
    return NULL;
  }
  struct ms_bpf_prog *p = prog_of_insns(insns, n, "jit_test", maps, n_maps);
  free(insns);
  if (!p) fprintf(stderr, "program refused: %s---\n%s\n---\n", logbuf, text);
  return p;
}

/* Verifies (RAW_MEM, mem_size bytes at r1) and compiles p with maps bound.
 * NULL + errno as ms_bpf_jit_new; the reason is in logbuf. */
static struct ms_bpf_jit *jit_of(const struct ms_bpf_prog *p, uint32_t mem_size, struct ms_bpf_map *const *maps,
                                 size_t n_maps) {
  struct ms_verify_opts vo = {.sz = sizeof vo, .kind = MS_VERIFY_RAW_MEM, .mem_size = mem_size, .helpers = helpers};
  struct ms_bpf_jit_opts jo = {.sz = sizeof jo, .verify = &vo, .helpers = helpers, .maps = maps, .n_maps = n_maps,
                               .log = &tlog};
  log_reset();
  return ms_bpf_jit_new(p, &jo);
}

/* logbuf, or a note that it is empty (the verifier's reason comes before
 * its stats line, so callers print the whole log). */
static const char *log_text(void) { return logbuf[0] ? logbuf : "(empty log)\n"; }

/* What the two executions of one input did. The final mem bytes stay in
 * mem_i / mem_j until the next pair runs. */
struct pair {
  int rc_i, rc_j;
  uint64_t r0_i, r0_j;
  uint64_t insns_i, insns_j; /* instructions executed, as each engine reports them */
  long mem_diff; /* first byte that differs after both succeeded, -1 if none */
};
static _Alignas(16) uint8_t mem_i[MEM_MAX], mem_j[MEM_MAX];

struct maps2 { /* the interpreter's maps and the JIT's, same definitions */
  struct ms_bpf_map *const *interp, *const *jit;
  size_t n;
};

/* Runs p in the interpreter and j, each on a fresh copy of mem. Returns 1
 * when they agree: the same return code and, when both succeeded, the same
 * r0, the same count of instructions executed and the same final mem bytes.
 * A failed run's r0 and mem are not compared: the interpreter stops inside
 * the block where the budget runs out, the JIT as it enters that block. */
static int pair_run(const struct ms_bpf_prog *p, const struct ms_bpf_jit *j, const uint8_t *mem, size_t mem_size,
                    const struct maps2 *m, uint64_t budget, struct pair *out) {
  char rlog[256] = "";
  struct ms_textbuf rtb = {rlog, sizeof rlog, 0, 0};
  struct ms_bpf_run_opts ro = {.sz = sizeof ro, .helpers = helpers, .maps = m ? m->interp : NULL,
                               .n_maps = m ? m->n : 0, .mem = mem_size ? mem_i : NULL, .mem_size = mem_size,
                               .insn_budget = budget, .env = &run_env, .log = &rtb};
  struct ms_bpf_run_result ri, rj;
  if (mem_size) {
    memcpy(mem_i, mem, mem_size);
    memcpy(mem_j, mem, mem_size);
  }
  out->rc_i = ms_bpf_run(p, &ro, &ri);
  ro.mem = mem_size ? mem_j : NULL;
  ro.maps = m ? m->jit : NULL;
  memset(&rj, 0xa5, sizeof rj);
  out->rc_j = ms_bpf_jit_run(j, &ro, &rj);
  out->r0_i = ri.r0;
  out->r0_j = rj.r0;
  out->insns_i = ri.insns;
  out->insns_j = rj.insns;
  out->mem_diff = -1;
  for (size_t i = 0; i < mem_size && !out->rc_i && !out->rc_j; i++)
    if (mem_i[i] != mem_j[i]) {
      out->mem_diff = (long)i;
      break;
    }
  return out->rc_i == out->rc_j &&
         (out->rc_i || (out->r0_i == out->r0_j && out->insns_i == out->insns_j && out->mem_diff < 0));
}

static void pair_print(const struct pair *r) {
  fprintf(stderr, "  interpreter: rc %d (%s) r0 0x%" PRIx64 " insns %" PRIu64 "\n  JIT:         rc %d (%s) r0 0x%"
          PRIx64 " insns %" PRIu64 "\n", r->rc_i, r->rc_i ? ms_strerror(r->rc_i) : "ok", r->r0_i, r->insns_i,
          r->rc_j, r->rc_j ? ms_strerror(r->rc_j) : "ok", r->r0_j, r->insns_j);
  if (r->mem_diff >= 0)
    fprintf(stderr, "  mem differs first at byte %ld: interpreter 0x%02x, JIT 0x%02x\n", r->mem_diff,
            mem_i[r->mem_diff], mem_j[r->mem_diff]);
}

/* Counts of one section: programs compiled, inputs run, disagreements. */
struct tally {
  const char *section;
  int programs, runs, mismatches, not_compiled;
};

static int tally_report(struct tally *t) { return t->mismatches++ < MISMATCH_PRINT_MAX; }

static void tally_print(const struct tally *t) {
  printf("%s: %d programs, %d runs, %d disagreements, %d not compiled\n", t->section, t->programs, t->runs,
         t->mismatches, t->not_compiled);
  CHECKF(t->mismatches == 0 && t->not_compiled == 0, "%s: the JIT disagrees with the interpreter (details above)",
         t->section);
}

/* Compiles text for mem_size bytes of mem; NULL (counted and printed as a
 * failure) when the JIT refuses a program the test means to be valid. */
static struct ms_bpf_jit *jit_expect(struct tally *t, const char *name, const struct ms_bpf_prog *p,
                                     uint32_t mem_size, const char *text) {
  struct ms_bpf_jit *j = p ? jit_of(p, mem_size, NULL, 0) : NULL;
  if (!j && t->not_compiled++ < MISMATCH_PRINT_MAX)
    fprintf(stderr, "%s: %s: not compiled (errno %d, %s):\n%s---\n%s\n---\n", t->section, name, p ? errno : 0,
            p ? ms_strerror(errno) : "assembly", log_text(), text);
  return j;
}

/* One hand-written program on one input: compile, run both, compare. */
static void expect_same(struct tally *t, const char *name, const char *text, const uint8_t *mem, size_t mem_size,
                        uint64_t budget, struct pair *out) {
  struct pair r;
  struct ms_bpf_prog *p = prog_of(text, NULL, 0);
  struct ms_bpf_jit *j = jit_expect(t, name, p, (uint32_t)mem_size, text);
  if (out) *out = (struct pair){.rc_i = -99999, .rc_j = -99999, .mem_diff = -1}; /* not run */
  if (j) {
    t->programs++;
    t->runs++;
    if (!pair_run(p, j, mem, mem_size, NULL, budget, &r) && tally_report(t)) {
      fprintf(stderr, "%s: %s: the JIT disagrees with the interpreter\n", t->section, name);
      pair_print(&r);
      fprintf(stderr, "---\n%s\n---\n", text);
    }
    if (out) *out = r;
  }
  ms_bpf_jit_free(j);
  ms_bpf_prog_free(p);
}

/* ---- 1. the conformance suite ------------------------------------------- */

/* The words of the `-- name` section of a conformance file, comments
 * dropped, joined by blanks (malloc'ed), or NULL when there is none. */
static char *section_of(const char *text, const char *name) {
  size_t cap = strlen(text) + 1, len = 0;
  char *out = malloc(cap);
  int in = 0, found = 0;
  for (const char *p = text; out && *p;) {
    const char *nl = strchr(p, '\n');
    size_t n = nl ? (size_t)(nl - p) : strlen(p);
    const char *hash = memchr(p, '#', n);
    size_t keep = hash ? (size_t)(hash - p) : n;
    const char *s = p;
    while (s < p + keep && (*s == ' ' || *s == '\t')) s++;
    if (p + keep - s >= 2 && !strncmp(s, "--", 2)) {
      s += 2;
      while (*s == ' ') s++;
      size_t k = strlen(name);
      in = !strncmp(s, name, k) && (s + k == p + keep || s[k] == ' ' || s[k] == '\r');
      found |= in;
    } else if (in) {
      memcpy(out + len, p, keep);
      len += keep;
      out[len++] = ' ';
    }
    p += n + (nl != NULL);
  }
  if (out) out[len] = 0;
  if (!found) {
    free(out);
    return NULL;
  }
  return out;
}

/* Hex bytes of -- mem into mem; the count, or -1 when malformed or too big. */
static long parse_mem(const char *words, uint8_t *mem) {
  long n = 0;
  char *copy = strdup(words), *save = NULL;
  for (char *tok = strtok_r(copy, " \t\r", &save); tok; tok = strtok_r(NULL, " \t\r", &save)) {
    char *end;
    unsigned long v = strtoul(tok, &end, 16);
    if (*end || v > 0xff || n >= MEM_MAX) {
      n = -1;
      break;
    }
    mem[n++] = (uint8_t)v;
  }
  free(copy);
  return n;
}

/* -- raw words (little-endian instructions) into *insns (malloc'ed). */
static int parse_raw(const char *words, struct ms_bpf_insn **insns, size_t *n) {
  size_t cap = strlen(words) / 2 + 1;
  char *copy = strdup(words), *save = NULL;
  *insns = malloc(cap * sizeof **insns);
  *n = 0;
  int err = 0;
  for (char *tok = strtok_r(copy, " \t\r", &save); tok && !err; tok = strtok_r(NULL, " \t\r", &save)) {
    char *end;
    errno = 0;
    uint64_t w = strtoull(tok, &end, strncmp(tok, "0x", 2) ? 10 : 16);
    if (*end || errno || *n >= cap) err = -1;
    else memcpy(&(*insns)[(*n)++], &w, sizeof w);
  }
  free(copy);
  return err;
}

struct conf_count {
  int files, compiled, verify_rejected, unsupported, skipped;
  struct tally t;
};

/* The instructions of a conformance file: -- raw when present (it wins in
 * the suite), else the assembled -- asm. */
static int conf_insns(const char *text, const struct ms_bpf_testfile *tf, struct ms_bpf_insn **insns, size_t *n) {
  char *raw = section_of(text, "raw");
  int err;
  if (raw) {
    err = parse_raw(raw, insns, n);
    free(raw);
    return err;
  }
  log_reset();
  return ms_bpf_testfile_asm(tf) ? ms_bpf_asm(ms_bpf_testfile_asm(tf), insns, n, &tlog) : -1;
}

/* One file: compiled and compared, or counted as interpreter-only/skipped. */
static void conf_file(const char *dir, const char *name, struct conf_count *c) {
  char path[4400];
  size_t len;
  snprintf(path, sizeof path, "%s/%s", dir, name);
  char *text = ms_test_slurp(path, &len);
  log_reset();
  struct ms_bpf_testfile *tf = text ? ms_bpf_testfile_parse(text, len, &tlog) : NULL;
  struct ms_bpf_test_report rep = {0};
  struct ms_bpf_insn *insns = NULL;
  struct ms_bpf_prog *p = NULL;
  struct ms_bpf_jit *j = NULL;
  static _Alignas(16) uint8_t mem[MEM_MAX];
  char *mem_words = text ? section_of(text, "mem") : NULL;
  long mem_size = mem_words ? parse_mem(mem_words, mem) : 0;
  size_t n = 0;
  c->files++;
  /* what the interpreter's own checker says: callx files are a group the
   * project does not run, and an -- error file has no result to hold to */
  if (!tf || ms_bpf_testfile_check(tf, &rep) < 0 || rep.status == MS_BPF_TEST_SKIP || mem_size < 0 ||
      conf_insns(text, tf, &insns, &n) || !(p = prog_of_insns(insns, n, name, NULL, 0))) {
    c->skipped++;
    goto out;
  }
  j = jit_of(p, (uint32_t)mem_size, NULL, 0);
  if (!j) {
    /* MS_E_VERIFY: the interpreter alone may run it. ENOTSUP: a construct the
     * JIT may decline (it says which); counted against the share compiled.
     * Anything else is a failure. */
    if (errno == MS_E_VERIFY) {
      c->verify_rejected++;
    } else {
      if (errno == ENOTSUP) c->unsupported++;
      else c->t.not_compiled++;
      fprintf(stderr, "conformance %s: verified but not compiled (errno %d, %s): %s", name, errno, ms_strerror(errno),
              log_text());
    }
    goto out;
  }
  c->compiled++;
  c->t.programs++;
  c->t.runs++;
  struct pair r;
  int same = pair_run(p, j, mem, (size_t)mem_size, NULL, RUN_BUDGET, &r);
  int result_ok = rep.expect_error || r.rc_j || r.r0_j == rep.expected;
  if ((!same || !result_ok) && tally_report(&c->t)) {
    fprintf(stderr, "conformance %s: %s\n", name,
            same ? "JIT and interpreter agree but r0 is not the file's -- result" : "the JIT disagrees");
    pair_print(&r);
    if (!result_ok) fprintf(stderr, "  -- result 0x%" PRIx64 "\n", rep.expected);
  }
out:
  ms_bpf_jit_free(j);
  ms_bpf_prog_free(p);
  free(insns);
  free(mem_words);
  ms_bpf_testfile_free(tf);
  free(text);
}

static int is_data(const struct dirent *d) {
  size_t n = strlen(d->d_name);
  return n > 5 && !strcmp(d->d_name + n - 5, ".data");
}

static void test_conformance(void) {
  const char *shared = getenv("MS_SHARED");
  char dir[2048];
  snprintf(dir, sizeof dir, "%s/third_party/bpf_conformance/tests", shared ? shared : "../shared");
  struct dirent **names;
  int n = scandir(dir, &names, is_data, alphasort);
  if (n <= 0) {
    SKIP_PART("conformance suite not found at %s", dir);
    return;
  }
  struct conf_count c = {.t = {.section = "conformance"}};
  for (int i = 0; i < n; i++) {
    conf_file(dir, names[i]->d_name, &c);
    free(names[i]);
  }
  free(names);
  printf("conformance: %d files, %d JIT-compiled, %d interpreter only (rejected by the verifier), "
         "%d declined by the JIT (ENOTSUP), %d skipped\n",
         c.files, c.compiled, c.verify_rejected, c.unsupported, c.skipped);
  tally_print(&c.t);
  /* most of the suite is plain code the verifier proves: the JIT must run it */
  CHECKF(c.compiled * 10 >= c.files * 6, "only %d of %d conformance files JIT-compiled", c.compiled, c.files);
}

/* ---- 2a. one instruction in a frame that shows every register ------------ */

/* The frame: r1 (mem) is spilled to [r10-8]; r0-r9 are loaded from
 * mem[IN_OFF + 8 i]; the instruction(s) under test run; r0-r9 are spilled to
 * [r10-16-8 i] and, with the marker slot [r10-96], copied to mem[OUT_OFF...].
 * Tests keep their own stack use at [r10-128] and below and their memory
 * accesses in mem[SCRATCH_OFF...]. */
#define IN_OFF 0
#define OUT_OFF 96 /* 11 slots: r0..r9 and the marker */
#define SCRATCH_OFF 192
#define FRAME_MEM 256
#define MARKER "[%r10-96]"
#define MARKER_FMT "[%%r10-96]" /* the same, inside a format */

static void frame_text(char *buf, size_t size, const char *body) {
  struct ms_textbuf b = {buf, size, 0, 0};
  buf[0] = 0;
  ms_textbuf_printf(&b, "stxdw [%%r10-8], %%r1\nstdw " MARKER_FMT ", 0x5a\n");
  for (int i = 0; i < 10; i++)
    if (i != 1) ms_textbuf_printf(&b, "ldxdw %%r%d, [%%r1+%d]\n", i, IN_OFF + 8 * i);
  ms_textbuf_printf(&b, "ldxdw %%r1, [%%r1+%d]\n%s\n", IN_OFF + 8, body);
  for (int i = 0; i < 10; i++) ms_textbuf_printf(&b, "stxdw [%%r10-%d], %%r%d\n", 16 + 8 * i, i);
  ms_textbuf_printf(&b, "ldxdw %%r1, [%%r10-8]\n");
  for (int i = 0; i < 11; i++)
    ms_textbuf_printf(&b, "ldxdw %%r2, [%%r10-%d]\nstxdw [%%r1+%d], %%r2\n", 16 + 8 * i, OUT_OFF + 8 * i);
  ms_textbuf_printf(&b, "ldxdw %%r0, [%%r10-16]\nexit\n");
  MS_ASSERT(!b.truncated);
}

/* Edge values: zero, one, shift counts at and past both widths, the 32-bit
 * and 64-bit extremes, a low half of zero under a non-zero high half. */
static const uint64_t edge[] = {
    0, 1, 2, 33, 63, 64, 0x7fffffff, 0x80000000, 0xffffffff, 0x100000000ull, 0x7fffffffffffffffull,
    0x8000000000000000ull, 0xffffffffffffffffull, 0xfffffffffffffffeull, 0xffffffff80000000ull,
    0x0123456789abcdefull,
};
#define N_EDGE (sizeof edge / sizeof edge[0])

/* Input k of a body whose operands are registers d and s (s < 0: one
 * register): d and s walk every pair of edge values, the other registers and
 * the scratch bytes vary with k. */
static void frame_input(uint8_t *mem, int d, int s, unsigned k) {
  uint64_t r[10];
  for (int i = 0; i < 10; i++) r[i] = edge[(k * 7 + (unsigned)i * 5 + 3) % N_EDGE] ^ ((uint64_t)i << 40);
  if (s >= 0 && s != d) {
    r[d] = edge[k / N_EDGE];
    r[s] = edge[k % N_EDGE];
  } else if (d >= 0) {
    r[d] = edge[k % N_EDGE];
  }
  memcpy(mem + IN_OFF, r, sizeof r);
  memset(mem + OUT_OFF, 0xee, SCRATCH_OFF - OUT_OFF);
  for (unsigned i = SCRATCH_OFF; i < FRAME_MEM; i++) mem[i] = (uint8_t)(i * 37 + k * 11 + 0x80);
}

static unsigned frame_inputs(int d, int s) { return s >= 0 && s != d ? N_EDGE * N_EDGE : N_EDGE; }

/* Names what a frame run shows differently: registers, marker, scratch. */
static void frame_diff_print(const uint8_t *in) {
  for (int i = 0; i < 11; i++) {
    uint64_t a, b;
    memcpy(&a, mem_i + OUT_OFF + 8 * i, 8);
    memcpy(&b, mem_j + OUT_OFF + 8 * i, 8);
    if (a == b) continue;
    if (i < 10) fprintf(stderr, "  r%d: interpreter 0x%016" PRIx64 ", JIT 0x%016" PRIx64 "\n", i, a, b);
    else fprintf(stderr, "  marker: interpreter 0x%" PRIx64 ", JIT 0x%" PRIx64 "\n", a, b);
  }
  for (int i = SCRATCH_OFF; i < FRAME_MEM; i++)
    if (mem_i[i] != mem_j[i])
      fprintf(stderr, "  mem[%d]: interpreter 0x%02x, JIT 0x%02x (was 0x%02x)\n", i, mem_i[i], mem_j[i], in[i]);
  fprintf(stderr, "  inputs:");
  for (int i = 0; i < 10; i++) {
    uint64_t v;
    memcpy(&v, in + IN_OFF + 8 * i, 8);
    fprintf(stderr, " r%d=0x%" PRIx64, i, v);
  }
  fputc('\n', stderr);
}

/* Runs body in the frame on every input for operands d, s. */
static void frame_check(struct tally *t, const char *body, int d, int s) {
  static char text[8192];
  static _Alignas(16) uint8_t in[FRAME_MEM];
  frame_text(text, sizeof text, body);
  struct ms_bpf_prog *p = prog_of(text, NULL, 0);
  struct ms_bpf_jit *j = jit_expect(t, body, p, FRAME_MEM, text);
  if (j) t->programs++;
  for (unsigned k = 0; j && k < frame_inputs(d, s); k++) {
    struct pair r;
    frame_input(in, d, s, k);
    t->runs++;
    if (pair_run(p, j, in, FRAME_MEM, NULL, 0, &r)) continue;
    if (tally_report(t)) {
      fprintf(stderr, "%s: '%s' (input %u): the JIT disagrees with the interpreter\n", t->section, body, k);
      pair_print(&r);
      if (!r.rc_i && !r.rc_j) frame_diff_print(in);
    }
    break; /* one report per body is enough */
  }
  ms_bpf_jit_free(j);
  ms_bpf_prog_free(p);
}

static const char *const bin_ops[] = {"add", "sub", "mul", "div", "sdiv", "mod", "smod",
                                      "or",  "and", "xor", "lsh", "rsh",  "arsh", "mov"};
#define N_BIN_OPS (sizeof bin_ops / sizeof bin_ops[0])
/* Immediates, written as the assembler takes them; for 64-bit operations
 * they are sign-extended, so the negative ones matter most. */
static const char *const imms[] = {"0",  "1",  "-1",         "2",          "-2",     "31",   "32", "33",
                                   "63", "64", "0x7fffffff", "0x80000000", "0x7fff", "-0x8000", "0xff", "0x12345678"};
#define N_IMMS (sizeof imms / sizeof imms[0])

static void test_frame_alu(void) {
  struct tally t = {.section = "ALU, every register pair"};
  char body[128];
  for (int w = 0; w < 2; w++)
    for (size_t o = 0; o < N_BIN_OPS; o++)
      for (int d = 0; d < 10; d++) {
        for (int s = 0; s < 10; s++) {
          snprintf(body, sizeof body, "%s%s %%r%d, %%r%d", bin_ops[o], w ? "32" : "", d, s);
          frame_check(&t, body, d, s);
        }
        for (size_t i = 0; i < N_IMMS; i++) {
          snprintf(body, sizeof body, "%s%s %%r%d, %s", bin_ops[o], w ? "32" : "", d, imms[i]);
          frame_check(&t, body, d, -1);
        }
      }
  tally_print(&t);
}

/* neg, movsx (ALU64 8/16/32, ALU32 8/16), the byte swaps and conversions. */
static void test_frame_unary(void) {
  static const char *const movsx[] = {"movsx8", "movsx16", "movsx3264", "movsx832", "movsx1632"};
  static const char *const swaps[] = {"le16", "le32", "le64", "be16", "be32", "be64", "bswap16", "bswap32",
                                      "bswap64"};
  struct tally t = {.section = "neg, movsx, byte swaps"};
  char body[128];
  for (int d = 0; d < 10; d++) {
    snprintf(body, sizeof body, "neg %%r%d", d);
    frame_check(&t, body, d, -1);
    snprintf(body, sizeof body, "neg32 %%r%d", d);
    frame_check(&t, body, d, -1);
    for (size_t i = 0; i < sizeof swaps / sizeof swaps[0]; i++) {
      snprintf(body, sizeof body, "%s %%r%d", swaps[i], d);
      frame_check(&t, body, d, -1);
    }
    for (size_t i = 0; i < sizeof movsx / sizeof movsx[0]; i++)
      for (int s = 0; s < 10; s++) {
        snprintf(body, sizeof body, "%s %%r%d, %%r%d", movsx[i], d, s);
        frame_check(&t, body, d, s);
      }
  }
  tally_print(&t);
}

/* Every condition, both widths, register and immediate forms: the marker
 * is written only when the branch falls through. */
static void test_frame_jumps(void) {
  static const char *const conds[] = {"jeq", "jne", "jgt", "jge", "jlt", "jle",
                                      "jsgt", "jsge", "jslt", "jsle", "jset"};
  static const char *const jimms[] = {"0", "1", "-1", "-2", "63", "64", "0x7fffffff", "-0x80000000", "0x7ffffffe"};
  struct tally t = {.section = "conditional jumps"};
  char body[160];
  for (int w = 0; w < 2; w++)
    for (size_t c = 0; c < sizeof conds / sizeof conds[0]; c++)
      for (int d = 0; d < 10; d++) {
        for (int s = 0; s < 10; s++) {
          snprintf(body, sizeof body, "%s%s %%r%d, %%r%d, +1\nstdw " MARKER_FMT ", 1", conds[c], w ? "32" : "", d, s);
          frame_check(&t, body, d, s);
        }
        for (size_t i = 0; i < sizeof jimms / sizeof jimms[0]; i++) {
          snprintf(body, sizeof body, "%s%s %%r%d, %s, +1\nstdw " MARKER_FMT ", 1", conds[c], w ? "32" : "", d,
                   jimms[i]);
          frame_check(&t, body, d, -1);
        }
      }
  /* unconditional forms, and a branch whose target is the next instruction */
  frame_check(&t, "ja +1\nstdw " MARKER ", 1", -1, -1);
  frame_check(&t, "ja32 +1\nstdw " MARKER ", 1", -1, -1);
  frame_check(&t, "jeq %r3, %r4, +0\nstdw " MARKER ", 1", 3, 4);
  tally_print(&t);
}

static const char *const sizes[] = {"w", "h", "b", "dw"}; /* by MS_BPF_SIZE >> 3 */
static const unsigned size_bytes[] = {4, 2, 1, 8};

/* The body's pointer: r1's value restored into b, moved by adj. */
static int body_base(char *buf, size_t size, int b, int adj) {
  return snprintf(buf, size, "ldxdw %%r%d, [%%r10-8]\nadd %%r%d, %d\n", b, b, adj);
}

/* After a body used b as a pointer it loads a scalar into it: no pointer
 * may reach the frame's copy to mem. */
static void body_unbase(char *buf, size_t size, int b, int adj) {
  size_t n = strlen(buf);
  snprintf(buf + n, size - n, "\nldxdw %%r%d, [%%r%d%+d]", b, b, IN_OFF - adj);
}

/* Loads of every size, plain and sign-extending, with every base and
 * destination register, offsets unaligned and negative. */
static void test_frame_loads(void) {
  struct tally t = {.section = "loads"};
  static const int adjs[] = {0, 248};
  static const int offs[] = {0, 1, 3, 6};
  char body[256];
  for (int b = 0; b < 10; b++)
    for (int d = 0; d < 10; d++)
      for (int sx = 0; sx < 2; sx++)
        for (int z = 0; z < 4 - sx; z++)
          for (int a = 0; a < 2; a++)
            for (int o = 0; o < 4; o++) {
              int n = body_base(body, sizeof body, b, adjs[a]);
              snprintf(body + n, sizeof body - (size_t)n, "ldx%s%s %%r%d, [%%r%d%+d]", sx ? "s" : "", sizes[z], d, b,
                       SCRATCH_OFF + offs[o] - adjs[a]);
              if (d != b) body_unbase(body, sizeof body, b, adjs[a]);
              frame_check(&t, body, -1, -1);
            }
  tally_print(&t);
}

/* Stores of every size from every register, and store-immediate with
 * negative and extreme immediates, to mem and to the stack (read back with
 * plain and sign-extending loads). */
static void test_frame_stores(void) {
  struct tally t = {.section = "stores"};
  static const char *const st_imms[] = {"0", "-1", "-2", "0x7fffffff", "-0x80000000", "0x12345678", "-0x80", "0x80"};
  static const int stack_offs[] = {128, 131, 512};
  char body[256];
  for (int z = 0; z < 4; z++) {
    for (int b = 0; b < 10; b++)
      for (int s = 0; s < 10; s++) {
        if (s == b) continue;
        int n = body_base(body, sizeof body, b, 0);
        snprintf(body + n, sizeof body - (size_t)n, "stx%s [%%r%d+%d], %%r%d", sizes[z], b, SCRATCH_OFF + 3, s);
        body_unbase(body, sizeof body, b, 0);
        frame_check(&t, body, s, -1);
      }
    for (size_t i = 0; i < sizeof st_imms / sizeof st_imms[0]; i++) {
      snprintf(body, sizeof body, "ldxdw %%r4, [%%r10-8]\nst%s [%%r4+%d], %s\nldxdw %%r4, [%%r4+0]", sizes[z],
               SCRATCH_OFF + 8, st_imms[i]);
      frame_check(&t, body, -1, -1);
      for (size_t o = 0; o < sizeof stack_offs / sizeof stack_offs[0]; o++) {
        snprintf(body, sizeof body, "st%s [%%r10-%d], %s\nldx%s %%r3, [%%r10-%d]", sizes[z], stack_offs[o], st_imms[i],
                 sizes[z], stack_offs[o]);
        frame_check(&t, body, -1, -1);
        if (z == 3) continue;
        snprintf(body, sizeof body, "st%s [%%r10-%d], %s\nldxs%s %%r3, [%%r10-%d]", sizes[z], stack_offs[o],
                 st_imms[i], sizes[z], stack_offs[o]);
        frame_check(&t, body, -1, -1);
      }
    }
    for (int s = 0; s < 10; s++)
      for (size_t o = 0; o < sizeof stack_offs / sizeof stack_offs[0]; o++) {
        snprintf(body, sizeof body, "stx%s [%%r10-%d], %%r%d\nldx%s %%r%d, [%%r10-%d]", sizes[z], stack_offs[o], s,
                 sizes[z], (s + 3) % 10, stack_offs[o]);
        frame_check(&t, body, s, -1);
        if (z == 3) continue;
        snprintf(body, sizeof body, "stx%s [%%r10-%d], %%r%d\nldxs%s %%r%d, [%%r10-%d]", sizes[z], stack_offs[o], s,
                 sizes[z], s, stack_offs[o]);
        frame_check(&t, body, s, -1);
      }
  }
  tally_print(&t);
}

/* Atomics, both widths, with and without fetch, on mem with every base and
 * source register; cmpxchg both failing (r0 as loaded) and succeeding (r0
 * read from the target first); and on the stack. */
static void test_frame_atomics(void) {
  static const char *const ops[] = {"add", "or", "and", "xor", "fetch add", "fetch or", "fetch and", "fetch xor",
                                    "xchg", "cmpxchg"};
  struct tally t = {.section = "atomics"};
  char body[256];
  for (int w = 0; w < 2; w++)
    for (size_t o = 0; o < sizeof ops / sizeof ops[0]; o++) {
      int cmpxchg = !strcmp(ops[o], "cmpxchg");
      int off = SCRATCH_OFF + (w ? 12 : 8);
      for (int b = 0; b < 10; b++)
        for (int s = 0; s < 10; s++) {
          if (s == b || (cmpxchg && b == 0)) continue;
          for (int hit = 0; hit < 1 + cmpxchg; hit++) {
            int n = body_base(body, sizeof body, b, 0);
            size_t left = sizeof body - (size_t)n;
            if (hit) n += snprintf(body + n, left, "ldx%s %%r0, [%%r%d+%d]\n", w ? "w" : "dw", b, off);
            left = sizeof body - (size_t)n;
            snprintf(body + n, left, "lock %s%s [%%r%d+%d], %%r%d", ops[o], w ? "32" : "", b, off, s);
            body_unbase(body, sizeof body, b, 0);
            frame_check(&t, body, s, cmpxchg ? 0 : -1);
          }
        }
      for (int s = 0; s < 10; s++) {
        snprintf(body, sizeof body, "stxdw [%%r10-136], %%r7\nlock %s%s [%%r10-%d], %%r%d\nldxdw %%r7, [%%r10-136]",
                 ops[o], w ? "32" : "", w ? 132 : 136, s);
        frame_check(&t, body, s, 7);
      }
    }
  tally_print(&t);
}

/* lddw into every register: constants whose halves the JIT may shortcut. */
static void test_frame_lddw(void) {
  static const char *const consts[] = {"0", "1", "0x7fffffff", "0x80000000", "0xffffffff", "0x100000000",
                                       "0xffffffff00000000", "0x8000000000000001", "-1", "-0x80000000",
                                       "0x0123456789abcdef", "0xfedcba9876543210"};
  struct tally t = {.section = "lddw"};
  char body[128];
  for (int d = 0; d < 10; d++)
    for (size_t i = 0; i < sizeof consts / sizeof consts[0]; i++) {
      snprintf(body, sizeof body, "lddw %%r%d, %s", d, consts[i]);
      frame_check(&t, body, -1, -1);
    }
  tally_print(&t);
}

/* ---- 2b. hand-written programs ------------------------------------------- */

/* A mem buffer of len bytes whose words hold edge values. */
static void edge_mem(uint8_t *mem, size_t len) {
  for (size_t i = 0; i < len; i++) mem[i] = (uint8_t)(i * 29 + 7);
  for (size_t i = 0; i + 8 <= len && i / 8 < N_EDGE; i += 8) memcpy(mem + i, &edge[i / 8], 8);
}

struct hand {
  const char *name, *text;
};

/* Programs the frame cannot express: control flow, calls, helpers. Each reads
 * its inputs from mem (edge values: mem[8 i] = edge[i]) so that nothing is
 * constant at compile time, and leaves results in r0 and mem. The test
 * helpers by id: 65537 args5, 65538 abort_on_42, 65539 peek, 65540
 * stack_misalignment (H_* above). */
static const struct hand hands[] = {
    {"div and mod by zero, both widths",
     "ldxdw %r3, [%r1+120]\nldxdw %r4, [%r1+0]\nmov %r5, %r3\ndiv %r5, %r4\nstxdw [%r1+128], %r5\n"
     "mov %r5, %r3\nmod %r5, %r4\nstxdw [%r1+136], %r5\nmov %r5, %r3\ndiv32 %r5, %r4\nstxdw [%r1+144], %r5\n"
     "mov %r5, %r3\nmod32 %r5, %r4\nstxdw [%r1+152], %r5\nmov %r5, %r3\nsdiv %r5, %r4\nstxdw [%r1+160], %r5\n"
     "mov %r5, %r3\nsmod %r5, %r4\nstxdw [%r1+168], %r5\nmov %r5, %r3\nsdiv32 %r5, %r4\nstxdw [%r1+176], %r5\n"
     "mov %r5, %r3\nsmod32 %r5, %r4\nstxdw [%r1+184], %r5\n"
     /* a 64-bit divisor whose low half is zero: zero for the 32-bit forms only */
     "ldxdw %r4, [%r1+72]\nmov %r5, %r3\ndiv32 %r5, %r4\nstxdw [%r1+192], %r5\nmov %r5, %r3\nmod32 %r5, %r4\n"
     "stxdw [%r1+200], %r5\nmov %r5, %r3\ndiv %r5, %r4\nstxdw [%r1+208], %r5\n"
     "mov %r0, %r3\ndiv %r0, 0\nmov %r6, %r3\nmod32 %r6, 0\nadd %r0, %r6\nexit"},
    {"INT_MIN / -1 and INT_MIN % -1, both widths, register and immediate",
     "ldxdw %r3, [%r1+88]\nldxdw %r4, [%r1+96]\nmov %r5, %r3\nsdiv %r5, %r4\nstxdw [%r1+128], %r5\n"
     "mov %r5, %r3\nsmod %r5, %r4\nstxdw [%r1+136], %r5\nmov %r5, %r3\nsdiv %r5, -1\nstxdw [%r1+144], %r5\n"
     "mov %r5, %r3\nsmod %r5, -1\nstxdw [%r1+152], %r5\nldxdw %r3, [%r1+56]\nmov %r5, %r3\nsdiv32 %r5, %r4\n"
     "stxdw [%r1+160], %r5\nmov %r5, %r3\nsmod32 %r5, %r4\nstxdw [%r1+168], %r5\nmov %r5, %r3\nsdiv32 %r5, -1\n"
     "stxdw [%r1+176], %r5\nmov %r5, %r3\nsmod32 %r5, -1\nstxdw [%r1+184], %r5\n"
     /* the same through raw words: sdiv64 r0, r4 (0x3f, off 1) and smod32 r0, -1 (0x94, off 1) */
     "mov %r0, %r3\n.insn 0x000000000001403f\n.insn 0xffffffff00010094\nexit"},
    {"shift counts in r4 (x86 rcx), r4 as destination, counts past the width",
     "ldxdw %r0, [%r1+120]\nldxdw %r4, [%r1+40]\nmov %r3, %r0\nlsh %r3, %r4\nstxdw [%r1+128], %r3\n"
     "mov %r3, %r0\nrsh32 %r3, %r4\nstxdw [%r1+136], %r3\nmov %r3, %r0\narsh %r3, %r4\nstxdw [%r1+144], %r3\n"
     "ldxdw %r4, [%r1+24]\nmov %r5, 31\nlsh %r4, %r5\nstxdw [%r1+152], %r4\nldxdw %r4, [%r1+96]\nmov %r5, 65\n"
     "arsh32 %r4, %r5\nstxdw [%r1+160], %r4\nldxdw %r4, [%r1+96]\nlsh %r4, %r4\nstxdw [%r1+168], %r4\n"
     "ldxdw %r4, [%r1+96]\narsh %r4, 63\nstxdw [%r1+176], %r4\nexit"},
    {"bounded loop (backward jump)",
     "ldxdw %r3, [%r1+120]\nmov %r0, 0\nmov %r2, 0\nloop:\nadd %r0, %r3\nrsh %r3, 1\nxor %r0, %r2\nadd %r2, 1\n"
     "jlt %r2, 100, loop\nexit"},
    {"loop whose body is longer than a short jump",
     "mov %r0, 0\nmov %r2, 0\nloop:\n"
#define ADD8 "add %r0, 3\nlsh %r0, 1\nxor %r0, %r2\nrsh %r0, 1\nadd %r0, 5\nmul %r0, 7\nsub %r0, 1\nor %r0, 4\n"
     ADD8 ADD8 ADD8 ADD8 ADD8 ADD8 ADD8 ADD8 "add %r2, 1\njlt %r2, 10, loop\nexit"},
    {"forward branch over a long block",
     "ldxdw %r3, [%r1+8]\nmov %r0, 1\njeq %r3, 1, far\n" ADD8 ADD8 ADD8 ADD8 ADD8 ADD8 ADD8 ADD8 ADD8 ADD8
     "far:\nadd %r0, 1\njne %r3, 1, far2\n" ADD8 ADD8 ADD8 ADD8 ADD8 ADD8 ADD8 ADD8 ADD8 ADD8 "far2:\nexit"},
#undef ADD8
    {"local calls: nested, callee r6-r9 restored, callee stacks their own",
     "stxdw [%r10-16], %r1\nmov %r6, 6\nmov %r7, 7\nldxdw %r8, [%r1+96]\nldxdw %r9, [%r1+120]\n"
     "stdw [%r10-8], 11\nmov %r1, 5\ncall local f\nldxdw %r1, [%r10-16]\nstxdw [%r1+128], %r0\n"
     "stxdw [%r1+136], %r6\nstxdw [%r1+144], %r7\nstxdw [%r1+152], %r8\nstxdw [%r1+160], %r9\n"
     "ldxdw %r2, [%r10-8]\nstxdw [%r1+168], %r2\nexit\n"
     "f:\nmov %r6, 60\nmov %r7, 70\nmov %r8, 80\nmov %r9, 90\nstdw [%r10-8], 99\nstdw [%r10-512], 98\n"
     "mov %r2, %r1\ncall local g\nldxdw %r3, [%r10-8]\nadd %r0, %r3\nldxdw %r3, [%r10-512]\nadd %r0, %r3\n"
     "add %r0, %r6\nadd %r0, %r9\nexit\n"
     "g:\nmov %r6, 600\nmov %r9, 900\nstdw [%r10-8], 1000\nldxdw %r0, [%r10-8]\nadd %r0, %r1\nmul %r0, %r9\n"
     "add %r0, %r6\nexit"},
    {"local call reading and writing the caller's stack and mem through pointers",
     "stxdw [%r10-16], %r1\nstdw [%r10-8], 21\nmov %r2, %r1\nmov %r1, %r10\nadd %r1, -8\ncall local f\n"
     "ldxdw %r1, [%r10-16]\nldxdw %r2, [%r10-8]\nstxdw [%r1+136], %r2\nexit\n"
     "f:\nldxdw %r0, [%r1+0]\nstxdw [%r2+128], %r0\nldxdw %r3, [%r2+120]\nadd %r0, %r3\nstxdw [%r1+0], %r0\nexit"},
    {"call chain seven frames deep",
     "mov %r1, 1\ncall local a\nexit\n"
     "a:\nmul %r1, 3\ncall local b\nexit\nb:\nmul %r1, 5\ncall local c\nexit\nc:\nmul %r1, 7\ncall local d\nexit\n"
     "d:\nmul %r1, 11\ncall local e\nexit\ne:\nmul %r1, 13\ncall local f\nexit\nf:\nmul %r1, 17\ncall local g\nexit\n"
     "g:\nstdw [%r10-512], 19\nldxdw %r0, [%r10-512]\nmul %r0, %r1\nexit"},
    {"bounded recursion to the depth limit (eight frames), a stack slot per frame",
     "mov %r1, 6\ncall local f\nexit\n"
     "f:\nstxdw [%r10-8], %r1\nmov %r0, 0\njeq %r1, 0, out\nsub %r1, 1\ncall local f\nldxdw %r2, [%r10-8]\n"
     "add %r0, %r2\nmul %r0, 3\nout:\nexit"},
    {"helpers called with the native stack aligned, from the entry and from nested calls",
     "call 65540\nmov %r6, %r0\ncall local f\nlsh %r0, 8\nor %r0, %r6\nexit\n"
     "f:\ncall 65540\nmov %r6, %r0\ncall local g\nlsh %r0, 8\nor %r0, %r6\nexit\n"
     "g:\nmov %r2, 77\ndiv %r2, 3\ncall 65540\nexit"},
    {"a subprogram whose first instruction is a loop head",
     "mov %r1, 0\ncall local f\nexit\nf:\nadd %r1, 3\njlt %r1, 100, f\nmov %r0, %r1\nexit"},
    {"local call inside a loop",
     "mov %r6, 0\nmov %r7, 0\nloop:\nmov %r1, %r6\ncall local sq\nadd %r7, %r0\nadd %r6, 1\njlt %r6, 20, loop\n"
     "mov %r0, %r7\nexit\nsq:\nmov %r0, %r1\nmul %r0, %r1\nexit"},
    {"helper with five arguments, r6-r9 kept across it",
     "mov %r6, %r1\nldxdw %r7, [%r1+88]\nlddw %r8, 0x0123456789abcdef\nldxdw %r9, [%r1+96]\n"
     "ldxdw %r1, [%r6+120]\nldxdw %r2, [%r6+88]\nldxdw %r3, [%r6+96]\nlddw %r4, 0xfedcba9876543210\nmov %r5, -7\n"
     "call 65537\nstxdw [%r6+128], %r0\nldxdw %r2, [%r6+0]\nstxdw [%r6+136], %r2\nstxdw [%r6+144], %r7\n"
     "stxdw [%r6+152], %r8\n"
     "stxdw [%r6+160], %r9\nmov %r0, %r7\nexit"},
    {"helpers reading the stack and mem, the worker id, identity",
     "mov %r6, %r1\nstdw [%r10-16], 0x1234\nstdw [%r10-8], -3\nmov %r1, %r10\nadd %r1, -16\nmov %r2, 16\n"
     "call 65539\nmov %r7, %r0\nmov %r1, %r6\nadd %r1, 100\nmov %r2, 40\ncall 65539\nadd %r7, %r0\n"
     "call 8\nadd %r7, %r0\nmov %r1, %r7\ncall 5\nmov %r1, %r0\ncall 65538\nexit"},
    {"a helper that aborts stops the run",
     "mov %r6, %r1\nstdw [%r6+128], 1\nmov %r1, 42\ncall 65538\nstdw [%r6+136], 2\nmov %r0, 0\nexit"},
    {"a helper that aborts inside a local call",
     "mov %r6, %r1\ncall local f\nstdw [%r6+136], 2\nexit\nf:\nmov %r1, 41\ncall 65538\nmov %r1, %r0\n"
     "call 65538\nexit"},
};

static void test_hand_written(void) {
  struct tally t = {.section = "hand-written programs"};
  static _Alignas(16) uint8_t mem[FRAME_MEM];
  edge_mem(mem, sizeof mem);
  for (size_t i = 0; i < sizeof hands / sizeof hands[0]; i++) {
    struct pair r;
    expect_same(&t, hands[i].name, hands[i].text, mem, sizeof mem, 0, &r);
    if (strstr(hands[i].name, "aborts")) /* both runs fail, with the helper's error */
      CHECKF(r.rc_i == ABORT_ERR && r.rc_j == ABORT_ERR, "%s: rc %d / %d", hands[i].name, r.rc_i, r.rc_j);
    else
      CHECKF(r.rc_i == 0, "%s: the interpreter failed (%d): the test is wrong", hands[i].name, r.rc_i);
  }
  tally_print(&t);
}

/* The five arguments of a helper call arrive, in order, under both. */
static void test_helper_args(void) {
  static const char text[] = "mov %r6, %r1\nldxdw %r1, [%r6+120]\nldxdw %r2, [%r6+88]\nldxdw %r3, [%r6+96]\n"
                             "lddw %r4, 0xfedcba9876543210\nmov %r5, -7\ncall 65537\nexit";
  const uint64_t want[5] = {0x0123456789abcdefull, 0x8000000000000000ull, ~0ull, 0xfedcba9876543210ull,
                            (uint64_t)-7};
  static _Alignas(16) uint8_t mem[FRAME_MEM];
  edge_mem(mem, sizeof mem);
  struct ms_bpf_prog *p = prog_of(text, NULL, 0);
  struct ms_bpf_jit *j = p ? jit_of(p, sizeof mem, NULL, 0) : NULL;
  CHECKF(j, "five-argument helper program not compiled: %s", log_text());
  if (j) {
    struct ms_bpf_run_opts ro = {.sz = sizeof ro, .helpers = helpers, .mem = mem, .mem_size = sizeof mem};
    struct ms_bpf_run_result ri, rj;
    memset(args5_seen, 0, sizeof args5_seen);
    CHECK(ms_bpf_run(p, &ro, &ri) == 0 && !memcmp(args5_seen, want, sizeof want));
    memset(args5_seen, 0, sizeof args5_seen);
    int rc = ms_bpf_jit_run(j, &ro, &rj);
    for (int i = 0; i < 5; i++)
      CHECKF(args5_seen[i] == want[i], "JIT: helper argument %d is 0x%" PRIx64 ", expected 0x%" PRIx64, i + 1,
             args5_seen[i], want[i]);
    CHECKF(rc == 0 && rj.r0 == ri.r0, "JIT rc %d r0 0x%" PRIx64 ", interpreter r0 0x%" PRIx64, rc, rj.r0, ri.r0);
  }
  ms_bpf_jit_free(j);
  ms_bpf_prog_free(p);
}

/* The budget bounds a run under both: a loop the verifier accepts (it
 * terminates) still stops early with -MS_E_LIMIT when the budget is tiny, and
 * so do calls without any backward jump; with the default budget both finish. */
static void test_budget(void) {
  struct tally t = {.section = "budget"};
  static const char loop[] = "mov %r0, 0\nL:\nadd %r0, 1\njlt %r0, 1000, L\nexit";
  char calls_prog[4096];
  struct ms_textbuf b = {calls_prog, sizeof calls_prog, 0, 0};
  calls_prog[0] = 0;
  ms_textbuf_printf(&b, "mov %%r6, 0\n");
  for (int i = 0; i < 40; i++) ms_textbuf_printf(&b, "mov %%r1, %%r6\ncall local f\nmov %%r6, %%r0\n");
  ms_textbuf_printf(&b, "mov %%r0, %%r6\nexit\nf:\nmov %%r0, %%r1\nadd %%r0, 1\nexit");
  MS_ASSERT(!b.truncated);
  struct pair r;
  expect_same(&t, "loop, budget 10", loop, NULL, 0, 10, &r);
  CHECKF(r.rc_i == -MS_E_LIMIT && r.rc_j == -MS_E_LIMIT, "loop with budget 10: rc %d / %d", r.rc_i, r.rc_j);
  expect_same(&t, "loop, default budget", loop, NULL, 0, 0, &r);
  CHECKF(r.rc_j == 0 && r.r0_j == 1000, "loop with the default budget: rc %d r0 %" PRIu64, r.rc_j, r.r0_j);
  expect_same(&t, "40 calls, budget 10", calls_prog, NULL, 0, 10, &r);
  CHECKF(r.rc_i == -MS_E_LIMIT && r.rc_j == -MS_E_LIMIT, "40 calls with budget 10: rc %d / %d", r.rc_i, r.rc_j);
  expect_same(&t, "40 calls, default budget", calls_prog, NULL, 0, 0, &r);
  CHECKF(r.rc_j == 0 && r.r0_j == 40, "40 calls with the default budget: rc %d r0 %" PRIu64, r.rc_j, r.r0_j);
  /* the budget runs out two frames deep: the run unwinds from there */
  static const char nested[] = "mov %r1, 0\ncall local f\nexit\nf:\ncall local g\nexit\n"
                               "g:\nmov %r0, 0\nL:\nadd %r0, 1\njlt %r0, 1000, L\nexit";
  expect_same(&t, "loop in a callee, budget 10", nested, NULL, 0, 10, &r);
  CHECKF(r.rc_i == -MS_E_LIMIT && r.rc_j == -MS_E_LIMIT, "loop in a callee with budget 10: rc %d / %d", r.rc_i,
         r.rc_j);
  expect_same(&t, "loop in a callee, default budget", nested, NULL, 0, 0, &r);
  CHECKF(r.rc_j == 0 && r.r0_j == 1000, "loop in a callee with the default budget: rc %d r0 %" PRIu64, r.rc_j,
         r.r0_j);
  tally_print(&t);
}

/* ---- 3. random programs --------------------------------------------------- */

#define RAND_PROGRAMS 2000
#define RAND_SEED0 0x6a17d1ffull
#define RAND_MEM 256
#define RAND_UNITS_MAX 64
#define RAND_LONG_PROGRAMS 10
#define RAND_LONG_UNITS 1000

/* splitmix64: a fixed sequence per seed on every host */
static uint64_t rnd(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
static unsigned below(uint64_t *s, unsigned n) { return (unsigned)(rnd(s) % n); }

/* An immediate: mostly edge values, sometimes any 32 bits. */
static void rand_imm(uint64_t *s, char *buf, size_t size) {
  if (below(s, 3)) snprintf(buf, size, "%s", imms[below(s, N_IMMS)]);
  else snprintf(buf, size, "%d", (int32_t)(uint32_t)rnd(s));
}

/* One ALU instruction on r0-r9. */
static void rand_alu(uint64_t *s, struct ms_textbuf *b) {
  static const char *const unary[] = {"neg", "neg32", "le16", "le32", "le64", "be16", "be32", "be64",
                                      "bswap16", "bswap32", "bswap64"};
  static const char *const movsx[] = {"movsx8", "movsx16", "movsx3264", "movsx832", "movsx1632"};
  unsigned d = below(s, 10), k = below(s, 100);
  char imm[24];
  if (k < 75) {
    const char *w = below(s, 2) ? "32" : "";
    const char *op = bin_ops[below(s, N_BIN_OPS)];
    if (below(s, 2)) {
      ms_textbuf_printf(b, "%s%s %%r%u, %%r%u\n", op, w, d, below(s, 10));
    } else {
      rand_imm(s, imm, sizeof imm);
      ms_textbuf_printf(b, "%s%s %%r%u, %s\n", op, w, d, imm);
    }
  } else if (k < 87) {
    ms_textbuf_printf(b, "%s %%r%u\n", unary[below(s, sizeof unary / sizeof unary[0])], d);
  } else if (k < 95) {
    ms_textbuf_printf(b, "%s %%r%u, %%r%u\n", movsx[below(s, sizeof movsx / sizeof movsx[0])], d, below(s, 10));
  } else {
    ms_textbuf_printf(b, "lddw %%r%u, 0x%" PRIx64 "\n", d, rnd(s));
  }
}

/* A conditional jump forward to unit `to` (label), or ja. */
static void rand_jump(uint64_t *s, struct ms_textbuf *b, unsigned to) {
  static const char *const conds[] = {"jeq", "jne", "jgt", "jge", "jlt", "jle", "jsgt", "jsge", "jslt", "jsle", "jset"};
  char imm[24];
  if (!below(s, 12)) {
    ms_textbuf_printf(b, "ja L%u\n", to);
    return;
  }
  const char *c = conds[below(s, sizeof conds / sizeof conds[0])], *w = below(s, 2) ? "32" : "";
  if (below(s, 2)) {
    ms_textbuf_printf(b, "%s%s %%r%u, %%r%u, L%u\n", c, w, below(s, 10), below(s, 10), to);
  } else {
    rand_imm(s, imm, sizeof imm);
    ms_textbuf_printf(b, "%s%s %%r%u, %s, L%u\n", c, w, below(s, 10), imm, to);
  }
}

/* A store into mem at a constant in-bounds offset, through a register that
 * holds r1's value only for the unit (it ends loaded with a scalar). */
static void rand_mem(uint64_t *s, struct ms_textbuf *b) {
  static const char *const atomics[] = {"add", "or", "and", "xor", "fetch add", "fetch or", "fetch and",
                                        "fetch xor", "xchg", "cmpxchg"};
  unsigned p = below(s, 10), v = below(s, 10), z = below(s, 4), size = size_bytes[z];
  if (v == p) v = (v + 1) % 10;
  ms_textbuf_printf(b, "ldxdw %%r%u, [%%r10-8]\n", p);
  unsigned k = below(s, 10);
  if (k < 5) {
    ms_textbuf_printf(b, "stx%s [%%r%u+%u], %%r%u\n", sizes[z], p, below(s, RAND_MEM - size + 1), v);
  } else if (k < 7) {
    char imm[24];
    rand_imm(s, imm, sizeof imm);
    ms_textbuf_printf(b, "st%s [%%r%u+%u], %s\n", sizes[z], p, below(s, RAND_MEM - size + 1), imm);
  } else {
    const char *op = atomics[below(s, sizeof atomics / sizeof atomics[0])];
    int w32 = below(s, 2);
    if (p == 0 && !strcmp(op, "cmpxchg")) op = "xchg"; /* cmpxchg compares with r0 */
    ms_textbuf_printf(b, "lock %s%s [%%r%u+%u], %%r%u\n", op, w32 ? "32" : "", p,
                      w32 ? 4 * below(s, RAND_MEM / 4) : 8 * below(s, RAND_MEM / 8), v);
  }
  /* the pointer becomes a scalar again, sometimes through a sign-extending load */
  static const struct { const char *m; unsigned size; } reload[] = {
      {"ldxb", 1}, {"ldxh", 2}, {"ldxw", 4}, {"ldxdw", 8}, {"ldxsb", 1}, {"ldxsh", 2}, {"ldxsw", 4}};
  k = below(s, sizeof reload / sizeof reload[0]);
  ms_textbuf_printf(b, "%s %%r%u, [%%r%u+%u]\n", reload[k].m, p, p, below(s, RAND_MEM - reload[k].size + 1));
}

/* A store to or load from the stack slots [r10-72, r10-16), all initialised
 * by the prologue. */
static void rand_stack(uint64_t *s, struct ms_textbuf *b) {
  unsigned z = below(s, 4), r = below(s, 10), size = size_bytes[z];
  unsigned off = 8 + size + below(s, 72 - 8 - size + 1); /* [r10-off, r10-off+size) inside [r10-72, r10-8) */
  if (below(s, 2))
    ms_textbuf_printf(b, "stx%s [%%r10-%u], %%r%u\n", sizes[z], off, r);
  else
    ms_textbuf_printf(b, "ldx%s%s %%r%u, [%%r10-%u]\n", z != 3 && below(s, 2) ? "s" : "", sizes[z], r, off);
}

/* A helper call: identity of a random register; r1-r5 are reset after it
 * (the call clobbers them). */
static void rand_call(uint64_t *s, struct ms_textbuf *b) {
  ms_textbuf_printf(b, "mov %%r1, %%r%u\ncall 5\n", below(s, 10));
  for (int i = 1; i <= 5; i++) ms_textbuf_printf(b, "mov %%r%d, %d\n", i, (int32_t)(uint32_t)rnd(s));
}

/* The program of one seed: prologue, units (each starts with a label, so
 * jumps land between units; 0: 24 to 63 of them), the fold of r0-r9 and the
 * stack into r0. */
static void rand_program(uint64_t seed, unsigned units, char *buf, size_t size) {
  uint64_t s = seed;
  struct ms_textbuf b = {buf, size, 0, 0};
  buf[0] = 0;
  ms_textbuf_printf(&b, "stxdw [%%r10-8], %%r1\n");
  for (int off = 16; off <= 72; off += 8)
    ms_textbuf_printf(&b, "stdw [%%r10-%d], %d\n", off, (int32_t)(uint32_t)rnd(&s));
  static const int order[] = {0, 2, 3, 4, 5, 6, 7, 8, 9, 1}; /* r1 last: it is the loads' base */
  for (int i = 0; i < 10; i++) {
    if (below(&s, 4)) ms_textbuf_printf(&b, "ldxdw %%r%d, [%%r1+%u]\n", order[i], 8 * below(&s, RAND_MEM / 8));
    else ms_textbuf_printf(&b, "mov %%r%d, %d\n", order[i], (int32_t)(uint32_t)rnd(&s));
  }
  unsigned n = units ? units : 24 + below(&s, RAND_UNITS_MAX - 24);
  for (unsigned u = 0; u < n; u++) {
    ms_textbuf_printf(&b, "L%u:\n", u);
    unsigned k = below(&s, 100);
    unsigned to = u + 1 + below(&s, 8); /* a forward target, the fold at the latest */
    if (k >= 58 && k < 75 && units && below(&s, 16)) k = 0; /* long ones branch less: the verifier's
                                                              * work grows with the paths */
    if (k < 58) rand_alu(&s, &b);
    else if (k < 75) rand_jump(&s, &b, to < n ? to : n);
    else if (k < 87) rand_mem(&s, &b);
    else if (k < 96) rand_stack(&s, &b);
    else rand_call(&s, &b);
  }
  ms_textbuf_printf(&b, "L%u:\n", n);
  for (int i = 1; i < 10; i++) ms_textbuf_printf(&b, "mul %%r0, 0x01000193\nxor %%r0, %%r%d\n", i);
  for (int off = 16; off <= 72; off += 8) ms_textbuf_printf(&b, "ldxdw %%r2, [%%r10-%d]\nadd %%r0, %%r2\n", off);
  ms_textbuf_printf(&b, "exit\n");
  MS_ASSERT(!b.truncated);
}

/* Compiles and runs the program of one seed; returns 0, or 1 when the
 * verifier rejected it (the generator means every program to verify). */
static int rand_one(struct tally *t, uint64_t seed, unsigned units, char *text, size_t size) {
  static _Alignas(16) uint8_t mem[RAND_MEM];
  uint64_t ms = seed ^ 0xa5a5a5a5a5a5a5a5ull;
  rand_program(seed, units, text, size);
  for (size_t k = 0; k < sizeof mem; k += 8) {
    uint64_t v = below(&ms, 3) ? rnd(&ms) : edge[below(&ms, N_EDGE)];
    memcpy(mem + k, &v, 8);
  }
  int rejected = 0;
  struct ms_bpf_prog *p = prog_of(text, NULL, 0);
  struct ms_bpf_jit *j = p ? jit_of(p, sizeof mem, NULL, 0) : NULL;
  if (!j && p && errno == MS_E_VERIFY) {
    rejected = 1;
    fprintf(stderr, "random seed 0x%" PRIx64 ": rejected by the verifier:\n%s", seed, log_text());
  } else if (!j) {
    if (t->not_compiled++ < 3)
      fprintf(stderr, "random seed 0x%" PRIx64 ": not compiled (%s): %s---\n%s---\n", seed, ms_strerror(errno),
              log_text(), text);
  } else {
    struct pair r;
    t->programs++;
    t->runs++;
    if (!pair_run(p, j, mem, sizeof mem, NULL, 0, &r) && tally_report(t)) {
      fprintf(stderr, "random seed 0x%" PRIx64 " (%u units): the JIT disagrees with the interpreter\n", seed,
              units);
      pair_print(&r);
      if (t->mismatches == 1) fprintf(stderr, "---\n%s---\n", text);
    }
  }
  ms_bpf_jit_free(j);
  ms_bpf_prog_free(p);
  return rejected;
}

static void test_random(void) {
  struct tally t = {.section = "random programs"};
  static char text[1 << 18];
  int rejected = 0;
  for (int i = 0; i < RAND_PROGRAMS; i++) rejected += rand_one(&t, RAND_SEED0 + (uint64_t)i, 0, text, sizeof text);
  /* a few long ones: code past the first buffer, many jump fix-ups */
  for (int i = 0; i < RAND_LONG_PROGRAMS; i++)
    rejected += rand_one(&t, RAND_SEED0 + RAND_PROGRAMS + (uint64_t)i, RAND_LONG_UNITS, text, sizeof text);
  int n = RAND_PROGRAMS + RAND_LONG_PROGRAMS;
  printf("random programs: seeds 0x%llx..0x%llx, %d verified, %d rejected by the verifier\n",
         (unsigned long long)RAND_SEED0, (unsigned long long)RAND_SEED0 + (unsigned)n - 1, n - rejected, rejected);
  CHECKF(rejected * 20 <= n, "%d of %d random programs rejected: the generator is off", rejected, n);
  tally_print(&t);
}

/* ---- 4. maps --------------------------------------------------------------- */

#define MAP_WORKERS 4 /* run_env.worker is 3: per-worker maps use a slot other than 0 */

static const struct ms_bpf_map_def map_defs[] = {
    {"arr", MS_BPF_MAP_ARRAY, 4, 8, 8, 0},
    {"hash", MS_BPF_MAP_HASH, 4, 8, 32, 0},
    {"rb", MS_BPF_MAP_RINGBUF, 0, 0, 4096, 0},
    {"pcpu", MS_BPF_MAP_PERCPU_ARRAY, 4, 8, 2, 0},
};
#define N_MAP_DEFS (sizeof map_defs / sizeof map_defs[0])

/* The map part of the program: for i in 0..7, arr[i] = (arr[i] + mem[i]) *
 * (i + 1), an atomic +1 on it, and hash[7 i] = that value. */
static void maps_text_updates(struct ms_textbuf *b) {
  for (int i = 0; i < 8; i++)
    ms_textbuf_printf(b,
                      "stw [%%r10-4], %d\nlddw %%r1, map[0]\nmov %%r2, %%r10\nadd %%r2, -4\ncall 1\n"
                      "jeq %%r0, 0, skip%d\nldxdw %%r7, [%%r0+0]\nldxb %%r8, [%%r6+%d]\nadd %%r7, %%r8\nmul %%r7, %d\n"
                      "stxdw [%%r0+0], %%r7\nmov %%r8, 1\nlock add [%%r0+0], %%r8\n"
                      "stw [%%r10-8], %d\nstxdw [%%r10-16], %%r7\nlddw %%r1, map[1]\nmov %%r2, %%r10\nadd %%r2, -8\n"
                      "mov %%r3, %%r10\nadd %%r3, -16\nmov %%r4, 0\ncall 2\nadd %%r9, %%r0\nskip%d:\n",
                      i, i, i, i + 1, 7 * i, i);
}

/* Then: hash[21] ^= itself (fetch xor); the worker's slot of pcpu[1] += 5;
 * two ring buffer records (output from the stack; reserve, fill, submit) and
 * one reserved then discarded; r0 = arr[0] through a direct value address
 * plus the helpers' return codes. */
static void maps_text(char *buf, size_t size) {
  struct ms_textbuf b = {buf, size, 0, 0};
  buf[0] = 0;
  ms_textbuf_printf(&b, "mov %%r6, %%r1\nmov %%r9, 0\n");
  maps_text_updates(&b);
  ms_textbuf_printf(&b,
                    "stw [%%r10-4], 21\nlddw %%r1, map[1]\nmov %%r2, %%r10\nadd %%r2, -4\ncall 1\n"
                    "jeq %%r0, 0, done\nldxdw %%r7, [%%r0+0]\nlock fetch xor [%%r0+0], %%r7\nadd %%r9, %%r7\ndone:\n"
                    "stw [%%r10-4], 1\nlddw %%r1, map[3]\nmov %%r2, %%r10\nadd %%r2, -4\ncall 1\n"
                    "jeq %%r0, 0, nopcpu\nmov %%r7, 5\nlock add [%%r0+0], %%r7\nnopcpu:\n"
                    "stxdw [%%r10-24], %%r9\nlddw %%r1, map[2]\nmov %%r2, %%r10\nadd %%r2, -24\nmov %%r3, 8\n"
                    "mov %%r4, 0\ncall 130\nadd %%r9, %%r0\n"
                    "lddw %%r1, map[2]\nmov %%r2, 16\nmov %%r3, 0\ncall 131\njeq %%r0, 0, norec\n"
                    "stxdw [%%r0+0], %%r9\nldxdw %%r7, [%%r6+8]\nstxdw [%%r0+8], %%r7\nmov %%r1, %%r0\nmov %%r2, 0\n"
                    "call 132\nnorec:\n"
                    "lddw %%r1, map[2]\nmov %%r2, 8\nmov %%r3, 0\ncall 131\njeq %%r0, 0, norec2\n"
                    "stdw [%%r0+0], 99\nmov %%r1, %%r0\nmov %%r2, 0\ncall 133\nnorec2:\n"
                    "lddw %%r1, map[0]+0\nldxdw %%r0, [%%r1+0]\nadd %%r0, %%r9\nexit");
  MS_ASSERT(!b.truncated);
}

static int maps_fill(struct ms_bpf_map **m) {
  int err = 0;
  for (uint32_t i = 0; i < 8 && !err; i++) {
    uint64_t v = 100 * i + 1, h = ~(uint64_t)i;
    uint32_t hk = 1000 + i;
    err = ms_bpf_map_update(m[0], &i, &v, MS_BPF_ANY, 0) || ms_bpf_map_update(m[1], &hk, &h, MS_BPF_ANY, 0);
  }
  for (uint32_t w = 0; w < MAP_WORKERS && !err; w++) {
    uint32_t k = 1;
    uint64_t v = 10 * w;
    err = ms_bpf_map_update(m[3], &k, &v, MS_BPF_ANY, w);
  }
  return err;
}

struct map_cmp {
  struct ms_bpf_map *other;
  uint32_t value_size, workers;
  int differ;
};

static int map_entry_cmp(void *user, const void *key, const void *values) {
  struct map_cmp *c = user;
  for (uint32_t w = 0; w < c->workers; w++) {
    const uint8_t *v = ms_bpf_map_lookup(c->other, key, w);
    if (!v || memcmp(v, (const uint8_t *)values + (size_t)w * c->value_size, c->value_size)) {
      uint32_t k;
      memcpy(&k, key, 4);
      fprintf(stderr, "  map %s key %u worker %u: the interpreter's value %s the JIT's\n",
              ms_bpf_map_info(c->other)->name, k, w, v ? "differs from" : "is missing from");
      c->differ++;
    }
  }
  return 0;
}

/* 1 when a and b (array or hash, per-worker or not) hold the same entries. */
static int maps_same(struct ms_bpf_map *a, struct ms_bpf_map *b) {
  uint32_t type = ms_bpf_map_info(a)->type;
  int per_worker = type == MS_BPF_MAP_PERCPU_ARRAY || type == MS_BPF_MAP_PERCPU_HASH;
  struct map_cmp c = {b, ms_bpf_map_info(a)->value_size, per_worker ? ms_bpf_map_workers(a) : 1, 0};
  ms_bpf_map_foreach(a, map_entry_cmp, &c);
  return !c.differ && ms_bpf_map_count(a) == ms_bpf_map_count(b);
}

struct records {
  uint8_t data[4096];
  size_t len;
  int n;
};

static int record_add(void *user, const void *data, uint32_t size) {
  struct records *r = user;
  if (r->len + size + 4 > sizeof r->data) return -E2BIG;
  memcpy(r->data + r->len, &size, 4);
  memcpy(r->data + r->len + 4, data, size);
  r->len += size + 4;
  r->n++;
  return 0;
}

/* 1 when the two ring buffers hold the same records (consumed here). */
static int ringbufs_same(struct ms_bpf_map *a, struct ms_bpf_map *b) {
  static struct records ra, rb;
  ra.len = rb.len = 0;
  ra.n = rb.n = 0;
  int na = ms_bpf_ringbuf_consume(a, record_add, &ra), nb = ms_bpf_ringbuf_consume(b, record_add, &rb);
  int same = na == nb && na == 2 && ra.len == rb.len && !memcmp(ra.data, rb.data, ra.len);
  if (!same) fprintf(stderr, "  ring buffer: the interpreter's run left %d records, the JIT's %d%s\n", na, nb,
                     na == nb ? " with other contents" : "");
  return same;
}

static int maps_all_same(struct ms_bpf_map **mi, struct ms_bpf_map **mj) {
  int same = 1;
  for (size_t i = 0; i < N_MAP_DEFS; i++)
    same &= map_defs[i].type == MS_BPF_MAP_RINGBUF ? ringbufs_same(mi[i], mj[i]) : maps_same(mi[i], mj[i]);
  return same;
}

/* A run must pass the maps the program was compiled with. */
static void maps_misuse(const struct ms_bpf_jit *j, struct ms_bpf_map **mi, struct ms_bpf_map **mj, uint8_t *mem,
                        size_t mem_size) {
  struct ms_bpf_run_opts ro = {.sz = sizeof ro, .helpers = helpers, .maps = mi, .n_maps = N_MAP_DEFS,
                               .mem = mem, .mem_size = mem_size};
  struct ms_bpf_run_result res;
  CHECK(ms_bpf_jit_run(j, &ro, &res) == -EINVAL);
  ro.maps = mj;
  ro.n_maps = 1;
  CHECK(ms_bpf_jit_run(j, &ro, &res) == -EINVAL);
  ro.n_maps = 0;
  ro.maps = NULL;
  CHECK(ms_bpf_jit_run(j, &ro, &res) == -EINVAL);
}

static void test_maps(void) {
  struct tally t = {.section = "maps"};
  struct ms_bpf_map *mi[N_MAP_DEFS] = {0}, *mj[N_MAP_DEFS] = {0};
  static char text[16384];
  static _Alignas(16) uint8_t mem[64];
  int made = 1;
  for (size_t i = 0; i < N_MAP_DEFS; i++) {
    mi[i] = ms_bpf_map_new(&map_defs[i], MAP_WORKERS, NULL);
    mj[i] = ms_bpf_map_new(&map_defs[i], MAP_WORKERS, NULL);
    made &= mi[i] && mj[i];
  }
  CHECK(made && !maps_fill(mi) && !maps_fill(mj));
  edge_mem(mem, sizeof mem);
  maps_text(text, sizeof text);
  struct ms_bpf_prog *p = made ? prog_of(text, map_defs, N_MAP_DEFS) : NULL;
  struct ms_bpf_jit *j = p ? jit_of(p, sizeof mem, mj, N_MAP_DEFS) : NULL;
  if (!j && ++t.not_compiled)
    fprintf(stderr, "maps: not compiled (%s): %s---\n%s\n---\n", ms_strerror(errno), log_text(), text);
  /* three runs: the second and third start from what the first left */
  struct maps2 m2 = {mi, mj, N_MAP_DEFS};
  for (int run = 0; j && run < 3; run++) {
    struct pair r;
    t.programs += !run;
    t.runs++;
    int same = pair_run(p, j, mem, sizeof mem, &m2, 0, &r);
    CHECKF(r.rc_i == 0, "maps: the interpreter failed (%d): the test is wrong", r.rc_i);
    if ((!maps_all_same(mi, mj) || !same) && tally_report(&t)) {
      fprintf(stderr, "maps: run %d: the JIT disagrees with the interpreter\n", run);
      pair_print(&r);
    }
  }
  if (j) {
    CHECK(ms_bpf_map_count(mj[1]) == 8 + 8); /* the JIT's updates landed */
    maps_misuse(j, mi, mj, mem, sizeof mem);
  }
  ms_bpf_jit_free(j);
  ms_bpf_prog_free(p);
  for (size_t i = 0; i < N_MAP_DEFS; i++) {
    ms_bpf_map_free(mi[i]);
    ms_bpf_map_free(mj[i]);
  }
  tally_print(&t);
}

/* ---- inlined array lookups ------------------------------------------------------- */

/* The JIT inlines map_lookup_elem on array maps when the straight line before
 * the call loads the map into r1. This program looks up keys 0, 7, 8 (one past
 * the end) and 0xffffffff in arr and keys 0, 1, 2 in pcpu (two entries), and
 * once through a map chosen on two paths (not inlined: the helper), and folds
 * which lookups found an entry and what they read into r0. Run for worker 3
 * and for worker 4, outside the per-worker map's four workers, where every
 * pcpu lookup must come back NULL, as the helper says. */
static void lookup_text(char *buf, size_t size) {
  struct ms_textbuf b = {buf, size, 0, 0};
  static const struct { int map; int64_t key; } q[] = {{0, 0}, {0, 7}, {0, 8}, {0, 0xffffffff}, {3, 0}, {3, 1}, {3, 2}};
  ms_textbuf_printf(&b, "mov %%r9, 0\n");
  for (size_t i = 0; i < sizeof q / sizeof q[0]; i++)
    ms_textbuf_printf(&b,
                      "lddw %%r7, %lld\nstxw [%%r10-4], %%r7\nlddw %%r1, map[%d]\nmov %%r2, %%r10\nadd %%r2, -4\n"
                      "call 1\nlsh %%r9, 1\njeq %%r0, 0, miss%zu\nor %%r9, 1\nldxdw %%r7, [%%r0+0]\nadd %%r9, %%r7\n"
                      "miss%zu:\n",
                      (long long)q[i].key, q[i].map, i, i);
  /* r1 from two paths: arr when mem[0] is odd, else pcpu */
  ms_textbuf_printf(&b,
                    "stw [%%r10-4], 1\nldxb %%r7, [%%r6+0]\nlddw %%r1, map[3]\njset %%r7, 1, odd\nja both\n"
                    "odd:\nlddw %%r1, map[0]\nboth:\nmov %%r2, %%r10\nadd %%r2, -4\ncall 1\nlsh %%r9, 1\n"
                    "jeq %%r0, 0, last\nor %%r9, 1\nldxdw %%r7, [%%r0+0]\nadd %%r9, %%r7\nlast:\nmov %%r0, %%r9\nexit");
  MS_ASSERT(!b.truncated);
}

static void test_inline_lookup(void) {
  struct tally t = {.section = "inlined lookups"};
  struct ms_bpf_map *m[N_MAP_DEFS] = {0};
  static char text[16384];
  static _Alignas(16) uint8_t mem[64];
  int made = 1;
  for (size_t i = 0; i < N_MAP_DEFS; i++) made &= (m[i] = ms_bpf_map_new(&map_defs[i], MAP_WORKERS, NULL)) != NULL;
  CHECK(made && !maps_fill(m));
  snprintf(text, sizeof text, "mov %%r6, %%r1\n");
  lookup_text(text + strlen(text), sizeof text - strlen(text));
  struct ms_bpf_prog *p = made ? prog_of(text, map_defs, N_MAP_DEFS) : NULL;
  struct ms_bpf_jit *j = p ? jit_of(p, sizeof mem, m, N_MAP_DEFS) : NULL;
  CHECKF(j != NULL, "not compiled: %s", log_text());
  for (uint32_t worker = 3; j && worker <= MAP_WORKERS; worker++)
    for (int odd = 0; odd < 2; odd++) {
      struct ms_bpf_env env = {.worker = worker};
      memset(mem, 0, sizeof mem);
      mem[0] = (uint8_t)odd;
      struct ms_bpf_run_opts ro = {.sz = sizeof ro, .helpers = helpers, .maps = m, .n_maps = N_MAP_DEFS,
                                   .mem = mem, .mem_size = sizeof mem, .env = &env};
      struct ms_bpf_run_result ri, rj;
      int rci = ms_bpf_run(p, &ro, &ri), rcj = ms_bpf_jit_run(j, &ro, &rj);
      t.programs += worker == 3 && !odd;
      t.runs++;
      /* worker 3: arr keys 0 and 7 and pcpu 0 and 1 found (bits 6,5,2,1), plus the two-path lookup */
      uint64_t found_i = ri.r0;
      if ((rci != rcj || rci || ri.r0 != rj.r0) && tally_report(&t))
        fprintf(stderr, "inlined lookups: worker %u, mem[0] %d: interpreter rc %d r0 0x%" PRIx64
                ", JIT rc %d r0 0x%" PRIx64 "\n", worker, odd, rci, ri.r0, rcj, rj.r0);
      (void)found_i;
    }
  /* the per-worker lookups must really have missed for worker 4: the results differ from worker 3's */
  if (j) {
    struct ms_bpf_env e3 = {.worker = 3}, e4 = {.worker = MAP_WORKERS};
    struct ms_bpf_run_opts ro = {.sz = sizeof ro, .helpers = helpers, .maps = m, .n_maps = N_MAP_DEFS,
                                 .mem = mem, .mem_size = sizeof mem, .env = &e3};
    struct ms_bpf_run_result r3, r4;
    memset(mem, 0, sizeof mem);
    CHECK(ms_bpf_jit_run(j, &ro, &r3) == 0);
    ro.env = &e4;
    CHECK(ms_bpf_jit_run(j, &ro, &r4) == 0);
    CHECKF(r3.r0 != r4.r0, "worker 3 and worker %d read the same: 0x%" PRIx64, MAP_WORKERS, r3.r0);
  }
  ms_bpf_jit_free(j);
  ms_bpf_prog_free(p);
  for (size_t i = 0; i < N_MAP_DEFS; i++) ms_bpf_map_free(m[i]);
  tally_print(&t);
}

/* ---- the hook form ------------------------------------------------------------ */

/* A monitor on task_end: reads context fields (the context is read-only and
 * r2 is 0 in this form) into an array map. The JIT refuses to run without a
 * context. */
static void test_hook_form(void) {
  static const char text[] =
      "mov %r6, %r1\nldxdw %r7, [%r6+104]\nldxdw %r2, [%r6+96]\nsub %r7, %r2\nldxw %r8, [%r6+68]\n"
      "ldxsw %r9, [%r6+64]\nadd %r9, %r8\nldxdw %r2, [%r6+56]\nxor %r9, %r2\nmov %r0, %r2\n"
      "stw [%r10-4], 3\nlddw %r1, map[0]\nmov %r2, %r10\nadd %r2, -4\ncall 1\njeq %r0, 0, out\n"
      "stxdw [%r0+0], %r7\nmov %r0, %r9\nout:\nexit";
  struct tally t = {.section = "hook form"};
  struct ms_bpf_map *mi = ms_bpf_map_new(&map_defs[0], 1, NULL), *mj = ms_bpf_map_new(&map_defs[0], 1, NULL);
  struct ms_bpf_prog *p = prog_of(text, map_defs, 1);
  struct ms_verify_opts vo = {.sz = sizeof vo, .kind = MS_VERIFY_HOOK, .prog_type = MS_PROG_OBSERVE,
                              .hook = MS_HOOK_TASK_END, .helpers = helpers,
                              .ctx = ms_hook_verify_ctx(MS_PROG_OBSERVE, MS_HOOK_TASK_END)};
  struct ms_bpf_jit_opts jo = {.sz = sizeof jo, .verify = &vo, .helpers = helpers, .maps = &mj, .n_maps = 1,
                               .log = &tlog};
  log_reset();
  struct ms_bpf_jit *j = p && mi && mj ? ms_bpf_jit_new(p, &jo) : NULL;
  if (!j && ++t.not_compiled) fprintf(stderr, "hook form: not compiled (%s): %s", ms_strerror(errno), log_text());
  uint64_t s = 0x4e4e;
  for (int k = 0; j && k < 64; k++) {
    struct ms_hook_ctx ctx;
    for (size_t i = 0; i < sizeof ctx; i += 8) {
      uint64_t v = k & 1 ? rnd(&s) : edge[below(&s, N_EDGE)];
      memcpy((uint8_t *)&ctx + i, &v, sizeof ctx - i < 8 ? sizeof ctx - i : 8);
    }
    ctx.hook = MS_HOOK_TASK_END;
    struct ms_bpf_run_opts ro = {.sz = sizeof ro, .helpers = helpers, .maps = &mi, .n_maps = 1, .ctx = &ctx,
                                 .ctx_size = sizeof ctx, .env = &run_env};
    struct ms_bpf_run_result ri, rj;
    int rc_i = ms_bpf_run(p, &ro, &ri);
    ro.maps = &mj;
    int rc_j = ms_bpf_jit_run(j, &ro, &rj);
    t.runs++;
    t.programs += !k;
    if ((rc_i || rc_j || ri.r0 != rj.r0 || !maps_same(mi, mj)) && tally_report(&t))
      fprintf(stderr, "hook form, context %d: interpreter rc %d r0 0x%" PRIx64 ", JIT rc %d r0 0x%" PRIx64 "\n", k,
              rc_i, ri.r0, rc_j, rj.r0);
  }
  if (j) {
    struct ms_bpf_run_opts ro = {.sz = sizeof ro, .helpers = helpers, .maps = &mj, .n_maps = 1};
    struct ms_bpf_run_result res;
    CHECK(ms_bpf_jit_run(j, &ro, &res) == -EINVAL);
  }
  ms_bpf_jit_free(j);
  ms_bpf_prog_free(p);
  ms_bpf_map_free(mi);
  ms_bpf_map_free(mj);
  tally_print(&t);
}

/* ---- 5. misuse ------------------------------------------------------------- */

static void test_misuse(void) {
  static _Alignas(16) uint8_t mem[16];
  struct ms_bpf_run_result res;
  /* a read past the 16 verified bytes: no JIT, and the verifier's reason */
  struct ms_bpf_prog *bad = prog_of("ldxdw %r0, [%r1+16]\nexit", NULL, 0);
  errno = 0;
  struct ms_bpf_jit *j = bad ? jit_of(bad, sizeof mem, NULL, 0) : NULL;
  CHECKF(bad && !j && errno == MS_E_VERIFY, "errno %d (%s)", errno, ms_strerror(errno));
  CHECKF(strstr(logbuf, "insn 0:") && strstr(logbuf, "processed "), "the log names no reason: %s", log_text());
  ms_bpf_jit_free(j);
  ms_bpf_prog_free(bad);
  /* verify options whose helpers are not the run's table */
  struct ms_bpf_prog *p = prog_of("ldxdw %r0, [%r1+8]\nexit", NULL, 0);
  struct ms_bpf_helpers *other = helpers_build();
  struct ms_verify_opts vo = {.sz = sizeof vo, .kind = MS_VERIFY_RAW_MEM, .mem_size = sizeof mem, .helpers = other};
  struct ms_bpf_jit_opts jo = {.sz = sizeof jo, .verify = &vo, .helpers = helpers, .log = &tlog};
  errno = 0;
  j = p ? ms_bpf_jit_new(p, &jo) : NULL;
  CHECKF(!j && errno == EINVAL, "verify helpers differ: errno %d", errno);
  ms_bpf_jit_free(j);
  jo.verify = NULL;
  errno = 0;
  j = p ? ms_bpf_jit_new(p, &jo) : NULL;
  CHECKF(!j && errno == EINVAL, "no verify options: errno %d", errno);
  ms_bpf_jit_free(j);
  /* a run must pass the helper table the program was compiled with */
  j = p ? jit_of(p, sizeof mem, NULL, 0) : NULL;
  CHECK(j && ms_bpf_jit_code_size(j) > 0 && ms_bpf_jit_prog(j) == p);
  if (j) {
    uint64_t v = 0x1122334455667788ull;
    memcpy(mem + 8, &v, 8);
    struct ms_bpf_run_opts ro = {.sz = sizeof ro, .helpers = helpers, .mem = mem, .mem_size = sizeof mem};
    CHECK(ms_bpf_jit_run(j, &ro, &res) == 0 && res.r0 == v);
    ro.helpers = other;
    CHECK(ms_bpf_jit_run(j, &ro, &res) == -EINVAL);
    ro.helpers = NULL;
    CHECK(ms_bpf_jit_run(j, &ro, &res) == -EINVAL);
    /* less mem than was verified would let the program read past it */
    ro.helpers = helpers;
    ro.mem_size = 8;
    CHECK(ms_bpf_jit_run(j, &ro, &res) < 0);
  }
  ms_bpf_jit_free(j);
  ms_bpf_jit_free(NULL);
  ms_bpf_helpers_free(other);
  ms_bpf_prog_free(p);
}

/* ---- one compiled program, several threads -------------------------------- */

#define THREADS 4
#define THREAD_RUNS 2000

struct thread_arg {
  const struct ms_bpf_jit *j;
  uint64_t want; /* the interpreter's r0 */
  int bad;
};

/* A compiled program is shared by the hooks' threads: runs must not share
 * scratch state (stack, budget, helper context). */
static void *thread_main(void *arg) {
  struct thread_arg *a = arg;
  _Alignas(16) uint8_t mem[FRAME_MEM];
  for (int i = 0; i < THREAD_RUNS; i++) {
    edge_mem(mem, sizeof mem);
    struct ms_bpf_run_opts ro = {.sz = sizeof ro, .helpers = helpers, .mem = mem, .mem_size = sizeof mem,
                                 .env = &run_env};
    struct ms_bpf_run_result res;
    if (ms_bpf_jit_run(a->j, &ro, &res) || res.r0 != a->want) a->bad++;
  }
  return NULL;
}

static void test_threads(void) {
  /* calls, a loop, a helper that reads the stack and the stack itself */
  static const char text[] =
      "mov %r6, 0\nmov %r7, 0\nloop:\nstxdw [%r10-8], %r6\nmov %r1, %r10\nadd %r1, -8\nmov %r2, 8\ncall 65539\n"
      "add %r7, %r0\nmov %r1, %r6\ncall local sq\nadd %r7, %r0\nadd %r6, 1\njlt %r6, 50, loop\nmov %r0, %r7\nexit\n"
      "sq:\nstxdw [%r10-16], %r1\nldxdw %r0, [%r10-16]\nmul %r0, %r1\nexit";
  static _Alignas(16) uint8_t mem[FRAME_MEM];
  edge_mem(mem, sizeof mem);
  struct ms_bpf_prog *p = prog_of(text, NULL, 0);
  struct ms_bpf_jit *j = p ? jit_of(p, sizeof mem, NULL, 0) : NULL;
  CHECKF(j, "threads: not compiled: %s", log_text());
  if (!j) goto out;
  struct ms_bpf_run_opts ro = {.sz = sizeof ro, .helpers = helpers, .mem = mem, .mem_size = sizeof mem,
                               .env = &run_env};
  struct ms_bpf_run_result res;
  CHECK(ms_bpf_run(p, &ro, &res) == 0);
  struct thread_arg args[THREADS];
  pthread_t tid[THREADS];
  for (int i = 0; i < THREADS; i++) {
    args[i] = (struct thread_arg){j, res.r0, 0};
    CHECK(pthread_create(&tid[i], NULL, thread_main, &args[i]) == 0);
  }
  int bad = 0;
  for (int i = 0; i < THREADS; i++) {
    pthread_join(tid[i], NULL);
    bad += args[i].bad;
  }
  CHECKF(bad == 0, "%d of %d concurrent JIT runs returned other than the interpreter's 0x%" PRIx64, bad,
         THREADS * THREAD_RUNS, res.r0);
out:
  ms_bpf_jit_free(j);
  ms_bpf_prog_free(p);
}

int main(void) {
  if (!ms_bpf_jit_supported()) {
    printf("no eBPF JIT for this host (x86-64 only): skipped\n");
    return 77;
  }
  helpers = helpers_build();
  CHECK(helpers != NULL);
  if (!helpers) TEST_MAIN_END();
  test_conformance();
  test_frame_alu();
  test_frame_unary();
  test_frame_jumps();
  test_frame_loads();
  test_frame_stores();
  test_frame_atomics();
  test_frame_lddw();
  test_hand_written();
  test_helper_args();
  test_budget();
  test_random();
  test_maps();
  test_inline_lookup();
  test_hook_form();
  test_misuse();
  test_threads();
  ms_bpf_helpers_free(helpers);
  TEST_MAIN_END();
}
