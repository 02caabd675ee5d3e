/* SPDX-License-Identifier: MIT */
/* Conformance test files (the bpf_conformance suite's `.data` format) and the
 * check of one file against the interpreter.
 *
 * The parser follows the suite's own (lib/src/bpf_test_parser.cc): `#` starts
 * a comment, a line holding `--` switches section (asm, raw, mem, result,
 * error; `-- c` and `-- no register offset` are ignored; any other directive
 * is an error here rather than a silent skip), the last result/error line
 * wins, -- raw takes precedence over -- asm. The assembly text keeps the
 * file's line numbers (other lines become blank) so assembler errors point
 * into the file. The runner's conventions: r1 = a private copy of -- mem,
 * r2 = its length, a 512-byte stack, and helper 5 returning its first
 * argument — registered here, in the checker's own table, not among the
 * engine's helpers. */
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bpf/bpf_internal.h"
#include "megascope/bpf_jit.h"

#define TEST_BUDGET (1u << 24)

struct ms_bpf_testfile {
  char *asm_text; /* one line per file line, blank outside -- asm */
  size_t asm_len, asm_cap;
  int has_asm;
  struct ms_bpf_insn *raw;
  size_t n_raw, cap_raw;
  int has_raw;
  uint8_t *mem;
  size_t mem_size, cap_mem;
  int has_result;
  uint64_t result;
  int has_error;
  char error[256];
};

enum section { SEC_IGNORE, SEC_ASM, SEC_RAW, SEC_MEM, SEC_RESULT, SEC_ERROR };

static int grow(void **p, size_t *cap, size_t need, size_t elem) {
  if (need <= *cap) return 0;
  size_t c = *cap ? *cap * 2 : 256;
  while (c < need) c *= 2;
  void *q = realloc(*p, c * elem);
  if (!q) return -ENOMEM;
  *p = q;
  *cap = c;
  return 0;
}

static int asm_append(struct ms_bpf_testfile *t, const char *s, size_t len) {
  if (grow((void **)&t->asm_text, &t->asm_cap, t->asm_len + len + 2, 1)) return -ENOMEM;
  memcpy(t->asm_text + t->asm_len, s, len);
  t->asm_len += len;
  t->asm_text[t->asm_len++] = '\n';
  t->asm_text[t->asm_len] = 0;
  return 0;
}

static char *trim(char *s) {
  while (isspace((unsigned char)*s)) s++;
  size_t n = strlen(s);
  while (n && isspace((unsigned char)s[n - 1])) s[--n] = 0;
  return s;
}

static enum section directive(const char *line, int *known) {
  *known = 1;
  if (strstr(line, "asm")) return SEC_ASM;
  if (strstr(line, "result")) return SEC_RESULT;
  if (strstr(line, "mem")) return SEC_MEM;
  if (strstr(line, "raw")) return SEC_RAW;
  if (strstr(line, "no register offset") || strstr(line, " c")) return SEC_IGNORE;
  if (strstr(line, "error")) return SEC_ERROR;
  *known = 0;
  return SEC_IGNORE;
}

static int parse_words(struct ms_bpf_testfile *t, char *s, int lineno, struct ms_textbuf *log) {
  char *save = NULL;
  for (char *tok = strtok_r(s, " \t", &save); tok; tok = strtok_r(NULL, " \t", &save)) {
    char *end;
    errno = 0;
    uint64_t w = strtoull(tok, &end, strncmp(tok, "0x", 2) ? 10 : 16);
    if (*end || errno) {
      ms_textbuf_printf(log, "line %d: bad -- raw word '%s'\n", lineno, tok);
      return -MS_E_FORMAT;
    }
    if (grow((void **)&t->raw, &t->cap_raw, t->n_raw + 1, sizeof *t->raw)) return -ENOMEM;
    memcpy(&t->raw[t->n_raw++], &w, sizeof w);
  }
  t->has_raw = 1;
  return 0;
}

static int parse_mem(struct ms_bpf_testfile *t, char *s, int lineno, struct ms_textbuf *log) {
  char *save = NULL;
  for (char *tok = strtok_r(s, " \t", &save); tok; tok = strtok_r(NULL, " \t", &save)) {
    char *end;
    unsigned long v = strtoul(tok, &end, 16);
    if (*end || v > 0xff) {
      ms_textbuf_printf(log, "line %d: bad -- mem byte '%s'\n", lineno, tok);
      return -MS_E_FORMAT;
    }
    if (grow((void **)&t->mem, &t->cap_mem, t->mem_size + 1, 1)) return -ENOMEM;
    t->mem[t->mem_size++] = (uint8_t)v;
  }
  return 0;
}

static int parse_result(struct ms_bpf_testfile *t, const char *s, int lineno, struct ms_textbuf *log) {
  char *end;
  errno = 0;
  t->result = strtoull(s, &end, strstr(s, "0x") ? 16 : 10);
  if (*end || errno) {
    ms_textbuf_printf(log, "line %d: bad -- result '%s'\n", lineno, s);
    return -MS_E_FORMAT;
  }
  t->has_result = 1;
  return 0;
}

static int parse_line(struct ms_bpf_testfile *t, enum section *sec, char *line, int lineno,
                      struct ms_textbuf *log) {
  char *hash = strchr(line, '#');
  if (hash) *hash = 0;
  if (strstr(line, "--")) {
    int known;
    *sec = directive(line, &known);
    if (!known) {
      ms_textbuf_printf(log, "line %d: unknown directive '%s'\n", lineno, trim(line));
      return -MS_E_FORMAT;
    }
    t->has_asm |= *sec == SEC_ASM;
    return asm_append(t, "", 0);
  }
  char *s = trim(line);
  int in_asm = *sec == SEC_ASM;
  if (asm_append(t, in_asm ? s : "", in_asm ? strlen(s) : 0)) return -ENOMEM;
  if (!*s) return 0;
  switch (*sec) {
  case SEC_RAW: return parse_words(t, s, lineno, log);
  case SEC_MEM: return parse_mem(t, s, lineno, log);
  case SEC_RESULT: return parse_result(t, s, lineno, log);
  case SEC_ERROR:
    t->has_error = 1;
    snprintf(t->error, sizeof t->error, "%s", s);
    return 0;
  default: return 0;
  }
}

void ms_bpf_testfile_free(struct ms_bpf_testfile *t) {
  if (!t) return;
  free(t->asm_text);
  free(t->raw);
  free(t->mem);
  free(t);
}

struct ms_bpf_testfile *ms_bpf_testfile_parse(const char *text, size_t len, struct ms_textbuf *log) {
  struct ms_bpf_testfile *t = calloc(1, sizeof *t);
  char *copy = malloc(len + 1);
  int err = t && copy ? 0 : -ENOMEM;
  if (!err) {
    memcpy(copy, text, len);
    copy[len] = 0;
  }
  enum section sec = SEC_IGNORE;
  char *p = copy;
  for (int lineno = 1; !err && p; lineno++) {
    char *nl = strchr(p, '\n');
    if (nl) *nl = 0;
    size_t n = strlen(p);
    if (n && p[n - 1] == '\r') p[n - 1] = 0;
    err = parse_line(t, &sec, p, lineno, log);
    p = nl ? nl + 1 : NULL;
  }
  free(copy);
  if (!err && !t->has_result && !t->has_error) {
    ms_textbuf_printf(log, "neither -- result nor -- error\n");
    err = -MS_E_FORMAT;
  }
  if (!err && !t->has_asm && !t->has_raw) {
    ms_textbuf_printf(log, "neither -- asm nor -- raw\n");
    err = -MS_E_FORMAT;
  }
  if (err) {
    ms_bpf_testfile_free(t);
    errno = -err;
    return NULL;
  }
  return t;
}

const char *ms_bpf_testfile_asm(const struct ms_bpf_testfile *t) {
  return t->has_asm ? t->asm_text : NULL;
}

/* ---- checking one file -------------------------------------------------- */

static uint64_t identity_helper(struct ms_bpf_exec *x, uint64_t a1, uint64_t a2, uint64_t a3,
                                uint64_t a4, uint64_t a5) {
  return a1;
}

static int has_callx(const struct ms_bpf_insn *insns, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (insns[i].code == (MS_BPF_JMP | MS_BPF_CALL | MS_BPF_X)) return 1;
  return 0;
}

/* An error (what) at a stage: a pass when the file expects one. Returns 1,
 * "the outcome is decided". */
static int outcome_error(struct ms_bpf_test_report *rep, const char *stage, const char *what) {
  snprintf(rep->why, sizeof rep->why, "%s: %s", stage, what);
  for (char *c = rep->why; *c; c++)
    if (*c == '\n') *c = *(c + 1) ? ' ' : 0;
  rep->status = rep->expect_error ? MS_BPF_TEST_PASS : MS_BPF_TEST_FAIL;
  return 1;
}

/* The instructions to run (malloc'ed): -- raw, checked against -- asm when
 * both exist, or the assembled -- asm. 0, 1 when the outcome is already
 * decided (rep filled), or -ENOMEM. */
static int test_insns(const struct ms_bpf_testfile *t, struct ms_bpf_test_report *rep,
                      struct ms_bpf_insn **insns, size_t *n) {
  char logbuf[256] = "";
  struct ms_textbuf log = {logbuf, sizeof logbuf, 0, 0};
  *insns = NULL;
  *n = 0;
  if (t->has_asm) {
    int err = ms_bpf_asm(t->asm_text, insns, n, &log);
    if (err == -ENOMEM) return err;
    if (err) return outcome_error(rep, "assembly", logbuf);
  }
  if (!t->has_raw) return 0;
  if (*insns && (*n != t->n_raw || memcmp(*insns, t->raw, *n * sizeof **insns))) {
    free(*insns);
    *insns = NULL;
    rep->status = MS_BPF_TEST_FAIL;
    snprintf(rep->why, sizeof rep->why, "-- asm assembles to other words than -- raw");
    return 1;
  }
  free(*insns);
  *insns = malloc(t->n_raw * sizeof **insns);
  if (!*insns) return -ENOMEM;
  memcpy(*insns, t->raw, t->n_raw * sizeof **insns);
  *n = t->n_raw;
  return 0;
}

/* Runs prog under mode; 1 when the JIT mode skipped it (the report says why). */
static int run_mode(const struct ms_bpf_prog *prog, int mode, const struct ms_bpf_run_opts *ro,
                    struct ms_bpf_run_result *res, int *rc, struct ms_bpf_test_report *rep) {
  if (mode == MS_BPF_EXEC_INTERP) {
    *rc = ms_bpf_run(prog, ro, res);
    return 0;
  }
  if (!ms_bpf_jit_supported()) {
    rep->status = MS_BPF_TEST_SKIP;
    rep->group = "nojit";
    snprintf(rep->why, sizeof rep->why, "no JIT for this host");
    return 1;
  }
  struct ms_verify_opts vo = {.sz = sizeof vo, .kind = MS_VERIFY_RAW_MEM,
                              .mem_size = (uint32_t)ro->mem_size, .helpers = ro->helpers};
  struct ms_bpf_jit_opts jo = {.sz = sizeof jo, .verify = &vo, .helpers = ro->helpers};
  struct ms_bpf_jit *j = ms_bpf_jit_new(prog, &jo);
  if (!j) {
    if (errno == ENOMEM) return -ENOMEM;
    rep->status = MS_BPF_TEST_SKIP;
    rep->group = "unverified";
    snprintf(rep->why, sizeof rep->why, "%s: the JIT runs only verified programs",
             errno == MS_E_VERIFY ? "rejected by the verifier" : ms_strerror(errno));
    return 1;
  }
  *rc = ms_bpf_jit_run(j, ro, res);
  ms_bpf_jit_free(j);
  return 0;
}

static int test_run(const struct ms_bpf_testfile *t, const struct ms_bpf_insn *insns, size_t n, int mode,
                    struct ms_bpf_test_report *rep) {
  char logbuf[256] = "";
  struct ms_textbuf log = {logbuf, sizeof logbuf, 0, 0};
  struct ms_bpf_prog_opts po = {.sz = sizeof po, .name = "test", .log = &log};
  struct ms_bpf_prog *prog = ms_bpf_prog_new(insns, n, &po);
  if (!prog) {
    if (errno == ENOMEM) return -ENOMEM;
    outcome_error(rep, "rejected", logbuf);
    return 0;
  }
  static const struct ms_bpf_helper_proto identity = {5, "identity", MS_BPF_RET_INTEGER, {MS_BPF_ARG_ANYTHING}, 0};
  struct ms_bpf_helpers *h = ms_bpf_helpers_new();
  uint8_t *mem = t->mem_size ? malloc(t->mem_size) : NULL;
  int err = (!h || (t->mem_size && !mem)) ? -ENOMEM : ms_bpf_helpers_set(h, &identity, identity_helper);
  if (!err) {
    if (mem) memcpy(mem, t->mem, t->mem_size);
    struct ms_bpf_run_opts ro = {.sz = sizeof ro, .helpers = h, .mem = mem, .mem_size = t->mem_size,
                                 .insn_budget = TEST_BUDGET, .log = &log};
    struct ms_bpf_run_result res;
    int rc = 0, skipped = run_mode(prog, mode, &ro, &res, &rc, rep);
    if (skipped < 0) err = skipped;
    if (!skipped) {
      rep->r0 = res.r0;
      rep->insns = res.insns;
      if (rc) {
        outcome_error(rep, "run", logbuf);
      } else if (rep->expect_error) {
        rep->status = MS_BPF_TEST_FAIL;
        snprintf(rep->why, sizeof rep->why, "expected an error, got r0 = 0x%" PRIx64, res.r0);
      } else if (res.r0 != t->result) {
        rep->status = MS_BPF_TEST_FAIL;
        snprintf(rep->why, sizeof rep->why, "r0 = 0x%" PRIx64 ", expected 0x%" PRIx64, res.r0, t->result);
      } else {
        rep->status = MS_BPF_TEST_PASS;
      }
    }
  }
  free(mem);
  ms_bpf_helpers_free(h);
  ms_bpf_prog_free(prog);
  return err;
}

int ms_bpf_testfile_check_mode(const struct ms_bpf_testfile *t, int mode, struct ms_bpf_test_report *rep) {
  memset(rep, 0, sizeof *rep);
  if (mode < 0 || mode >= MS_BPF_EXEC_MODE_COUNT) return -EINVAL;
  rep->expect_error = t->has_error;
  rep->expected = t->result;
  struct ms_bpf_insn *insns;
  size_t n;
  int err = test_insns(t, rep, &insns, &n);
  if (err) return err < 0 ? err : 0;
  if (has_callx(insns, n)) {
    rep->status = MS_BPF_TEST_SKIP;
    rep->group = "callx";
    snprintf(rep->why, sizeof rep->why, "call by register (non-standard group callx)");
  } else {
    err = test_run(t, insns, n, mode, rep);
  }
  free(insns);
  return err;
}

int ms_bpf_testfile_check(const struct ms_bpf_testfile *t, struct ms_bpf_test_report *rep) {
  return ms_bpf_testfile_check_mode(t, MS_BPF_EXEC_INTERP, rep);
}
