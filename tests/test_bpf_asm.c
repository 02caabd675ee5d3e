/* SPDX-License-Identifier: MIT */
/* Assembler, disassemblers and the conformance-file checker:
 *  - every suite program reassembles from its own disassembly to the same
 *    words, without falling back to `.insn`, and passes the checker;
 *  - random words round-trip too (the `.insn` fallback keeps them exact);
 *  - errors name the line; the Linux form matches the verifier log's. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "megascope/bpf.h"
#include "test.h"

static char logbuf[1024];
static struct ms_textbuf tlog;

static void log_reset(void) {
  logbuf[0] = 0;
  tlog = (struct ms_textbuf){logbuf, sizeof logbuf, 0, 0};
}

/* The disassembly of insns, one line each; *fallbacks counts `.insn` lines. */
static char *disassemble(const struct ms_bpf_insn *insns, size_t n, int *fallbacks) {
  size_t cap = n * 64 + 1, len = 0;
  char *text = malloc(cap), line[160];
  *fallbacks = 0;
  text[0] = 0;
  for (size_t i = 0; i < n;) {
    int k = ms_bpf_insn_asm(insns, n, i, line, sizeof line);
    if (k <= 0) break;
    if (!strncmp(line, ".insn", 5)) (*fallbacks)++;
    len += (size_t)snprintf(text + len, cap - len, "%s\n", line);
    i += (size_t)k;
  }
  return text;
}

static int round_trips(const struct ms_bpf_insn *insns, size_t n, int *fallbacks) {
  char *text = disassemble(insns, n, fallbacks);
  struct ms_bpf_insn *back;
  size_t nb;
  log_reset();
  int ok = ms_bpf_asm(text, &back, &nb, &tlog) == 0 && nb == n && !memcmp(back, insns, n * sizeof *insns);
  if (!ok) fprintf(stderr, "round trip failed:\n%s%s", text, logbuf);
  if (ok) free(back);
  free(text);
  return ok;
}

static void test_suite(void) {
  const char *shared = getenv("MS_SHARED");
  char dir[1024];
  snprintf(dir, sizeof dir, "%s/third_party/bpf_conformance/tests", shared ? shared : "../shared");
  DIR *d = opendir(dir);
  if (!d) {
    SKIP_PART("%s absent: the conformance suite's round trip not run", dir);
    return;
  }
  int files = 0, passed = 0, skipped = 0, fallbacks_total = 0;
  for (struct dirent *e; (e = readdir(d));) {
    size_t nl = strlen(e->d_name);
    if (nl < 6 || strcmp(e->d_name + nl - 5, ".data")) continue;
    char path[2048];
    size_t len;
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    char *text = ms_test_slurp(path, &len);
    log_reset();
    struct ms_bpf_testfile *t = text ? ms_bpf_testfile_parse(text, len, &tlog) : NULL;
    CHECKF(t != NULL, "%s: %s", e->d_name, logbuf);
    if (t) {
      struct ms_bpf_insn *insns;
      size_t n;
      log_reset();
      CHECKF(ms_bpf_asm(ms_bpf_testfile_asm(t), &insns, &n, &tlog) == 0, "%s: %s", e->d_name, logbuf);
      int fb = 0;
      CHECKF(round_trips(insns, n, &fb), "%s", e->d_name);
      fallbacks_total += fb;
      char line[160];
      for (size_t i = 0; i < n;) { /* the Linux form knows every suite instruction */
        int k = ms_bpf_insn_linux(insns, n, i, line, sizeof line);
        if (strstr(line, "unknown")) CHECKF(0, "%s insn %zu: %s", e->d_name, i, line);
        i += k > 0 ? (size_t)k : 1;
      }
      free(insns);
      struct ms_bpf_test_report rep;
      CHECK(ms_bpf_testfile_check(t, &rep) == 0);
      CHECKF(rep.status != MS_BPF_TEST_FAIL, "%s: %s", e->d_name, rep.why);
      passed += rep.status == MS_BPF_TEST_PASS;
      if (rep.status == MS_BPF_TEST_SKIP) {
        skipped++;
        CHECKF(!strcmp(rep.group, "callx") && !strcmp(e->d_name, "callx.data"), "%s skipped", e->d_name);
      }
    }
    files++;
    ms_bpf_testfile_free(t);
    free(text);
  }
  closedir(d);
  CHECKF(files == 313 && passed == 312 && skipped == 1, "%d files, %d passed, %d skipped", files, passed, skipped);
  CHECKF(fallbacks_total == 0, "%d suite instructions printed as .insn", fallbacks_total);
}

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint64_t next_rand(void) {
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return rng;
}

/* Random words, biased to real opcodes, reassemble exactly. */
static void test_random_round_trip(void) {
  enum { N = 48, ROUNDS = 4000 };
  struct ms_bpf_insn insns[N];
  int ok = 1, fb = 0;
  for (int r = 0; r < ROUNDS && ok; r++) {
    for (int i = 0; i < N; i++) {
      uint64_t w = next_rand();
      memcpy(&insns[i], &w, 8);
      if (next_rand() % 4) insns[i].dst_reg %= 11, insns[i].src_reg %= (next_rand() % 2 ? 11 : 16);
      if (next_rand() % 3 == 0) insns[i].imm %= 1000;
      if (next_rand() % 3 == 0) insns[i].off = (int16_t)(insns[i].off % 64);
    }
    int f;
    ok = round_trips(insns, N, &f);
    fb += f;
  }
  CHECK(ok);
  CHECKF(fb < ROUNDS * N, "every random word fell back to .insn (%d)", fb);
}

static int asm_fails(const char *text, const char *want) {
  struct ms_bpf_insn *insns = NULL;
  size_t n;
  log_reset();
  int err = ms_bpf_asm(text, &insns, &n, &tlog);
  free(insns);
  if (!err || !strstr(logbuf, want)) fprintf(stderr, "asm of '%s': want '%s', got '%s'\n", text, want, logbuf);
  return err == -MS_E_FORMAT && strstr(logbuf, want);
}

static void test_errors(void) {
  CHECK(asm_fails("mov %r0, 1\n\nfrob %r0, 1\nexit", "line 3: unknown mnemonic 'frob'"));
  CHECK(asm_fails("mov %r11, 1", "line 1: invalid register '%r11'"));
  CHECK(asm_fails("mov32 %r0, 0x100000000", "line 1: immediate '0x100000000' is not a 32-bit value"));
  CHECK(asm_fails("mov %r0, -2147483649", "not a 32-bit value"));
  CHECK(asm_fails("ldxb %r0, [%r1+40000]", "offset '+40000' is not a signed 16-bit value"));
  CHECK(asm_fails("ldxb %r0, %r1", "expected [%rN+off]"));
  CHECK(asm_fails("ja nowhere\nexit", "line 1: unknown label 'nowhere'"));
  CHECK(asm_fails("a:\na:\nexit", "line 2: label 'a' defined twice"));
  CHECK(asm_fails("add %r0", "line 1: 'add' takes 2 operands, got 1"));
  CHECK(asm_fails("lock fetch xchg [%r10-8], %r1", "unknown atomic operation"));
  CHECK(asm_fails("call sideways 3", "call mode 'sideways'"));
  CHECK(asm_fails("# nothing\n", "no instructions"));
  CHECK(asm_fails("lddw %r1, map[x]", "bad map reference"));
}

static int asm_is(const char *text, const struct ms_bpf_insn *want, size_t n_want) {
  struct ms_bpf_insn *insns;
  size_t n;
  log_reset();
  if (ms_bpf_asm(text, &insns, &n, &tlog)) return 0;
  int ok = n == n_want && !memcmp(insns, want, n * sizeof *want);
  free(insns);
  return ok;
}

static void test_encodings(void) {
  struct ms_bpf_insn ldxb = {.code = MS_BPF_LDX | MS_BPF_MEM | MS_BPF_B, .dst_reg = 0, .src_reg = 1, .off = 2};
  CHECK(asm_is("ldxb %r0, [%r1+0x2]", &ldxb, 1));
  CHECK(asm_is("  ldxb r0 , [ %r1 + 2 ]  # blanks", &ldxb, 1));
  struct ms_bpf_insn jmp[] = {{.code = MS_BPF_JMP | MS_BPF_JEQ | MS_BPF_K, .dst_reg = 1, .off = 0},
                              {.code = MS_BPF_JMP | MS_BPF_EXIT},
                              {.code = MS_BPF_JMP | MS_BPF_JA, .off = -3}};
  CHECK(asm_is("top: jeq %r1, 0, exit\nexit\nja top", jmp, 3)); /* `exit` names the first exit */
  struct ms_bpf_insn lbl[] = {{.code = MS_BPF_JMP32 | MS_BPF_JA, .imm = 0}, {.code = MS_BPF_JMP | MS_BPF_EXIT}};
  CHECK(asm_is("ja32 t\nt: exit", lbl, 2));
  struct ms_bpf_insn atom = {.code = MS_BPF_STX | MS_BPF_ATOMIC | MS_BPF_W, .dst_reg = 10, .src_reg = 3,
                             .off = -4, .imm = MS_BPF_AND | MS_BPF_FETCH};
  CHECK(asm_is("lock fetch and32 [%r10-4], %r3", &atom, 1));
  struct ms_bpf_insn sx = {.code = MS_BPF_ALU64 | MS_BPF_MOV | MS_BPF_X, .dst_reg = 0, .src_reg = 1, .off = 32};
  CHECK(asm_is("movsx3264 %r0, %r1", &sx, 1));
  struct ms_bpf_insn sdiv = {.code = MS_BPF_ALU | MS_BPF_DIV | MS_BPF_K, .off = 1, .imm = -3};
  CHECK(asm_is("sdiv32 %r0, -3", &sdiv, 1));
  struct ms_bpf_insn map[] = {{.code = MS_BPF_LD | MS_BPF_IMM | MS_BPF_DW, .dst_reg = 1, .src_reg = 2, .imm = 3},
                              {.imm = 16}};
  CHECK(asm_is("lddw %r1, map[3]+16", map, 2));
  struct ms_bpf_insn raw = {.code = 0x18, .imm = 0x55667788};
  CHECK(asm_is(".insn 0x5566778800000018", &raw, 1));
}

static int linux_is(const char *text, const char *want) {
  struct ms_bpf_insn *insns;
  size_t n;
  char line[160] = "";
  log_reset();
  if (ms_bpf_asm(text, &insns, &n, &tlog)) return 0;
  ms_bpf_insn_linux(insns, n, 0, line, sizeof line);
  free(insns);
  if (strcmp(line, want)) fprintf(stderr, "linux form of '%s': '%s', want '%s'\n", text, line, want);
  return !strcmp(line, want);
}

static void test_linux_form(void) {
  CHECK(linux_is("ldxdw %r3, [%r1+40]", "r3 = *(u64 *)(r1 +40)"));
  CHECK(linux_is("ldxsh %r3, [%r1-2]", "r3 = *(s16 *)(r1 -2)"));
  CHECK(linux_is("jgt %r1, 5, +3", "if r1 > 0x5 goto pc+3"));
  CHECK(linux_is("jsle32 %r1, %r2, -1", "if w1 s<= w2 goto pc-1"));
  CHECK(linux_is("call 1", "call 1"));
  CHECK(linux_is("call local +4", "call pc+4"));
  CHECK(linux_is("exit", "exit"));
  CHECK(linux_is("mov %r0, 0", "r0 = 0"));
  CHECK(linux_is("add32 %r1, %r2", "w1 += w2"));
  CHECK(linux_is("sdiv %r1, -7", "r1 s/= -7"));
  CHECK(linux_is("movsx864 %r1, %r2", "r1 = (s8)r2"));
  CHECK(linux_is("neg32 %r4", "w4 = -w4"));
  CHECK(linux_is("be16 %r1", "r1 = be16 r1"));
  CHECK(linux_is("bswap64 %r1", "r1 = bswap64 r1"));
  CHECK(linux_is("stxdw [%r10-8], %r1", "*(u64 *)(r10 -8) = r1"));
  CHECK(linux_is("stw [%r10-4], 7", "*(u32 *)(r10 -4) = 7"));
  CHECK(linux_is("lock add [%r1+0], %r2", "lock *(u64 *)(r1 +0) += r2"));
  CHECK(linux_is("lock fetch add [%r1+0], %r2", "r2 = atomic64_fetch_add((u64 *)(r1 +0), r2)"));
  CHECK(linux_is("lock xchg32 [%r1+8], %r2", "r2 = atomic_xchg((u32 *)(r1 +8), r2)"));
  CHECK(linux_is("lock cmpxchg [%r1+0], %r2", "r0 = atomic64_cmpxchg((u64 *)(r1 +0), r0, r2)"));
  CHECK(linux_is("lddw %r1, 0x1122334455667788", "r1 = 0x1122334455667788"));
  CHECK(linux_is("lddw %r1, map[2]", "r1 = map[2]"));
  CHECK(linux_is("ja -1", "goto pc-1"));
  CHECK(linux_is("ja32 +1000000", "gotol pc+1000000"));
}

int main(void) {
  test_encodings();
  test_errors();
  test_linux_form();
  test_random_round_trip();
  test_suite();
  TEST_MAIN_END();
}
