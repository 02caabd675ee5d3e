/* SPDX-License-Identifier: MIT */
/* `megascope bpf ...`: the eBPF tools.
 *   conformance DIR [--jit] [--verbose] [--json]  run every .data file of the suite
 *   asm FILE                               assemble (a .data file's -- asm, or plain text) to hex words
 *   disasm FILE [--linux]                  disassemble a .data file or raw instruction bytes
 *   objdump FILE.o                         maps and programs of a clang -target bpf object
 * Exit codes: 0 success, 1 the work failed (a test, an assembly), 2 usage. */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "opt.h"
#include "megascope/bpf.h"

static int usage_error(const char *sub, const char *fmt, const char *arg) {
  fprintf(stderr, "megascope bpf %s: ", sub);
  fprintf(stderr, fmt, arg);
  fprintf(stderr, "\n(try 'megascope bpf %s --help')\n", sub);
  return 2;
}

/* A subcommand of one positional argument (what: its name in the usage) and
 * the options of its table: 0 with *path set, 1 (--help printed), 2 (a usage
 * error printed). */
static int parse_one(const char *sub, const char *head, const struct cli_opt *opts, void *dst, int argc, char **argv,
                     const char *what, const char **path) {
  char cmd[64];
  snprintf(cmd, sizeof cmd, "bpf %s", sub);
  int first, rc = cli_parse(cmd, head, opts, dst, argc, argv, &first);
  if (rc) return rc > 0 ? 1 : 2;
  if (first == argc) return usage_error(sub, "missing %s", what);
  if (first + 1 < argc) return usage_error(sub, "one argument only (extra '%s')", argv[first + 1]);
  *path = argv[first];
  return 0;
}

/* --linux, the one option of disasm and objdump. */
static const struct cli_opt linux_opts[] = {
    {.kind = CLI_FLAG, .name = "linux", .set = 1, .help = "the Linux verifier log's form"}, {0}};
static const struct cli_opt no_opts[] = {{0}};

/* Reads a whole file; *len excludes the terminating NUL it adds. */
static char *read_file(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  size_t cap = 4096, n = 0;
  char *buf = malloc(cap);
  while (buf) {
    if (n + 1 >= cap) {
      char *b = realloc(buf, cap *= 2);
      if (!b) {
        free(buf);
        buf = NULL;
        break;
      }
      buf = b;
    }
    size_t k = fread(buf + n, 1, cap - n - 1, f);
    n += k;
    if (k == 0) break;
  }
  int failed = ferror(f);
  fclose(f);
  if (!buf || failed) {
    free(buf);
    return NULL;
  }
  buf[n] = 0;
  *len = n;
  return buf;
}

static void json_string(FILE *f, const char *s) {
  fputc('"', f);
  for (; *s; s++) {
    unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
    else if (c < 0x20) fprintf(f, "\\u%04x", c);
    else fputc(c, f);
  }
  fputc('"', f);
}

/* ---- conformance -------------------------------------------------------- */

static const char conformance_head[] =
    "usage: megascope bpf conformance DIR [--jit] [--verbose] [--json]\n\n"
    "Runs every .data file in DIR (sorted by name) through the assembler and the\n"
    "interpreter: r1 = a copy of -- mem, r2 = its length, helper 5 returns its first\n"
    "argument; r0 must equal -- result, or the file's -- error must happen. Files\n"
    "with call-by-register (the non-standard callx group) are skipped.\n"
    "Ends with 'N passed, M failed' (and ', K skipped (...)'). Exit 0 when none failed.\n\n";

struct conf_args {
  int jit, verbose, json;
};

static const struct cli_opt conformance_opts[] = {
    CLI_OPT_FLAG(struct conf_args, jit, "jit",
                 "run the x86-64 JIT instead: each program is verified first (r1 =\n"
                 "the -- mem buffer) and one the verifier rejects is skipped as\n"
                 "'unverified', since the JIT runs only verified programs"),
    {.kind = CLI_FLAG, .name = "verbose", .shrt = 'v', .off = offsetof(struct conf_args, verbose), .set = 1,
     .help = "one line per file"},
    CLI_OPT_FLAG(struct conf_args, json, "json", "a JSON report instead of text"),
    {0}};

struct outcome {
  char *name;
  struct ms_bpf_test_report rep;
  int error; /* the file could not be read or parsed */
};

static int data_file(const struct dirent *d) {
  size_t n = strlen(d->d_name);
  return n > 5 && !strcmp(d->d_name + n - 5, ".data");
}

static void check_file(const char *dir, const char *name, int mode, struct outcome *o) {
  char path[4096], logbuf[256] = "";
  struct ms_textbuf log = {logbuf, sizeof logbuf, 0, 0};
  size_t len;
  snprintf(path, sizeof path, "%s/%s", dir, name);
  char *text = read_file(path, &len);
  struct ms_bpf_testfile *t = text ? ms_bpf_testfile_parse(text, len, &log) : NULL;
  if (!t) {
    o->error = 1;
    o->rep.status = MS_BPF_TEST_FAIL;
    snprintf(o->rep.why, sizeof o->rep.why, "%s", text ? logbuf : strerror(errno));
    char *nl = strchr(o->rep.why, '\n');
    if (nl) *nl = 0;
  } else if (ms_bpf_testfile_check_mode(t, mode, &o->rep) < 0) {
    o->rep.status = MS_BPF_TEST_FAIL;
    snprintf(o->rep.why, sizeof o->rep.why, "out of memory");
  }
  ms_bpf_testfile_free(t);
  free(text);
}

static void print_text(const struct outcome *o, int n, int verbose, const int count[3]) {
  static const char *const label[] = {"PASS", "FAIL", "SKIP"};
  for (int i = 0; i < n; i++) {
    const struct ms_bpf_test_report *r = &o[i].rep;
    if (!verbose && r->status != MS_BPF_TEST_FAIL) continue;
    printf("%s %s", label[r->status], o[i].name);
    if (r->status != MS_BPF_TEST_PASS || r->expect_error) printf(": %s", r->why);
    else printf(" (r0 0x%" PRIx64 ", %" PRIu64 " insns)", r->r0, r->insns);
    printf("\n");
  }
  printf("%d passed, %d failed", count[MS_BPF_TEST_PASS], count[MS_BPF_TEST_FAIL]);
  if (count[MS_BPF_TEST_SKIP]) {
    printf(", %d skipped (", count[MS_BPF_TEST_SKIP]);
    const char *sep = "";
    for (int i = 0; i < n; i++)
      if (o[i].rep.status == MS_BPF_TEST_SKIP) {
        printf("%s%s: %s", sep, o[i].rep.group, o[i].name);
        sep = ", ";
      }
    printf(")");
  }
  printf("\n");
}

static void print_json(const char *dir, const struct outcome *o, int n, const int count[3]) {
  static const char *const label[] = {"pass", "fail", "skip"};
  printf("{\"dir\": ");
  json_string(stdout, dir);
  printf(", \"passed\": %d, \"failed\": %d, \"skipped\": %d, \"tests\": [", count[0], count[1], count[2]);
  for (int i = 0; i < n; i++) {
    const struct ms_bpf_test_report *r = &o[i].rep;
    printf("%s\n  {\"name\": ", i ? "," : "");
    json_string(stdout, o[i].name);
    printf(", \"status\": \"%s\"", label[r->status]);
    if (r->status == MS_BPF_TEST_SKIP) printf(", \"group\": \"%s\"", r->group);
    if (!o[i].error && r->status != MS_BPF_TEST_SKIP)
      printf(", \"expected\": \"0x%" PRIx64 "\", \"r0\": \"0x%" PRIx64 "\", \"insns\": %" PRIu64,
             r->expected, r->r0, r->insns);
    if (r->why[0]) {
      printf(", \"detail\": ");
      json_string(stdout, r->why);
    }
    printf("}");
  }
  printf("\n]}\n");
}

static int cmd_conformance(int argc, char **argv) {
  struct conf_args a = {0};
  const char *dir = NULL;
  int rc0 = parse_one("conformance", conformance_head, conformance_opts, &a, argc, argv, "DIR", &dir);
  if (rc0) return rc0 == 1 ? 0 : rc0;
  int verbose = a.verbose, json = a.json, mode = a.jit ? MS_BPF_EXEC_JIT : MS_BPF_EXEC_INTERP;
  struct dirent **names;
  int n = scandir(dir, &names, data_file, alphasort);
  if (n < 0) {
    fprintf(stderr, "megascope bpf conformance: %s: %s\n", dir, strerror(errno));
    return 1;
  }
  struct outcome *o = calloc((size_t)n + 1, sizeof *o);
  int count[3] = {0, 0, 0};
  for (int i = 0; i < n && o; i++) {
    o[i].name = names[i]->d_name;
    check_file(dir, o[i].name, mode, &o[i]);
    count[o[i].rep.status]++;
  }
  if (o && json) print_json(dir, o, n, count);
  else if (o) print_text(o, n, verbose, count);
  int rc = !o || count[MS_BPF_TEST_FAIL] ? 1 : 0;
  if (!o) fprintf(stderr, "megascope bpf conformance: out of memory\n");
  free(o);
  for (int i = 0; i < n; i++) free(names[i]);
  free(names);
  return rc;
}

/* ---- asm / disasm ------------------------------------------------------- */

static const char asm_usage[] =
    "usage: megascope bpf asm FILE\n\n"
    "Assembles uBPF-style text (a .data file's -- asm section, or a plain text file)\n"
    "and prints one 64-bit instruction word per line in hex (the -- raw form).\n\n";

static const char disasm_usage[] =
    "usage: megascope bpf disasm FILE [--linux]\n\n"
    "Disassembles a .data file (its -- raw, else its assembled -- asm) or a file of\n"
    "raw 8-byte instructions. Default: the assembler's syntax, which reassembles to\n"
    "the same words; --linux: the Linux verifier log's form.\n\n";

static int is_data_text(const char *text) { return strstr(text, "-- asm") || strstr(text, "-- raw"); }

/* The instructions of FILE: a .data file, raw bytes, or (text) assembly. */
static int load_insns(const char *sub, const char *path, int allow_raw, struct ms_bpf_insn **insns,
                      size_t *n) {
  char logbuf[512] = "";
  struct ms_textbuf log = {logbuf, sizeof logbuf, 0, 0};
  size_t len;
  char *text = read_file(path, &len);
  if (!text) {
    fprintf(stderr, "megascope bpf %s: %s: %s\n", sub, path, strerror(errno));
    return 1;
  }
  int err = 0;
  if (is_data_text(text)) {
    struct ms_bpf_testfile *t = ms_bpf_testfile_parse(text, len, &log);
    err = t ? 0 : -errno;
    if (t && ms_bpf_testfile_asm(t)) {
      err = ms_bpf_asm(ms_bpf_testfile_asm(t), insns, n, &log);
    } else if (t) {
      err = -EINVAL;
      ms_textbuf_printf(&log, "the file has no -- asm section\n");
    }
    ms_bpf_testfile_free(t);
  } else if (allow_raw && (len % 8 || memchr(text, 0, len) || len == 0)) {
    if (len % 8 || len == 0) {
      fprintf(stderr, "megascope bpf %s: %s: %zu bytes is not a whole number of instructions\n", sub, path, len);
      free(text);
      return 1;
    }
    *insns = malloc(len);
    if (*insns) memcpy(*insns, text, len);
    *n = len / 8;
    err = *insns ? 0 : -ENOMEM;
  } else {
    err = ms_bpf_asm(text, insns, n, &log);
  }
  free(text);
  if (err) {
    fprintf(stderr, "megascope bpf %s: %s: %s", sub, path, logbuf[0] ? logbuf : ms_strerror(err));
    if (!logbuf[0]) fputc('\n', stderr);
    return 1;
  }
  return 0;
}

static int cmd_asm(int argc, char **argv) {
  const char *path = NULL;
  int rc0 = parse_one("asm", asm_usage, no_opts, NULL, argc, argv, "FILE", &path);
  if (rc0) return rc0 == 1 ? 0 : rc0;
  struct ms_bpf_insn *insns = NULL;
  size_t n = 0;
  int rc = load_insns("asm", path, 0, &insns, &n);
  for (size_t i = 0; !rc && i < n; i++) {
    uint64_t w;
    memcpy(&w, &insns[i], 8);
    printf("0x%016" PRIx64 "\n", w);
  }
  free(insns);
  return rc;
}

static void print_disasm(const struct ms_bpf_insn *insns, size_t n, int linux_form) {
  char line[160];
  for (size_t i = 0; i < n;) {
    int k = linux_form ? ms_bpf_insn_linux(insns, n, i, line, sizeof line)
                       : ms_bpf_insn_asm(insns, n, i, line, sizeof line);
    if (k <= 0) break;
    if (linux_form) printf("%zu: %s\n", i, line);
    else printf("%s\n", line);
    i += (size_t)k;
  }
}

static int cmd_disasm(int argc, char **argv) {
  const char *path = NULL;
  int linux_form = 0;
  int rc0 = parse_one("disasm", disasm_usage, linux_opts, &linux_form, argc, argv, "FILE", &path);
  if (rc0) return rc0 == 1 ? 0 : rc0;
  struct ms_bpf_insn *insns = NULL;
  size_t n = 0;
  int rc = load_insns("disasm", path, 1, &insns, &n);
  if (!rc) print_disasm(insns, n, linux_form);
  free(insns);
  return rc;
}

/* ---- objdump ------------------------------------------------------------ */

static const char objdump_usage[] =
    "usage: megascope bpf objdump FILE.o [--linux]\n\n"
    "Reads an object from 'clang -O2 -g -target bpf -c' (nothing is loaded into a\n"
    "kernel) and lists its license, maps and programs with their instructions\n"
    "(map references resolved, bpf-to-bpf calls linked).\n\n";

static int cmd_objdump(int argc, char **argv) {
  const char *path = NULL;
  int linux_form = 0;
  int rc0 = parse_one("objdump", objdump_usage, linux_opts, &linux_form, argc, argv, "FILE.o", &path);
  if (rc0) return rc0 == 1 ? 0 : rc0;
  char logbuf[2048] = "";
  struct ms_textbuf log = {logbuf, sizeof logbuf, 0, 0};
  struct ms_bpf_object *o = ms_bpf_object_open_file(path, &log);
  if (!o) {
    fprintf(stderr, "megascope bpf objdump: %s: %s", path, logbuf[0] ? logbuf : strerror(errno));
    if (!logbuf[0]) fputc('\n', stderr);
    return 1;
  }
  printf("license: %s\n", ms_bpf_object_license(o));
  for (size_t i = 0; i < ms_bpf_object_map_count(o); i++) {
    const struct ms_bpf_map_def *d = ms_bpf_object_map(o, i);
    printf("map %zu: %s type %u key %u value %u max_entries %u flags 0x%x\n", i, d->name, d->type,
           d->key_size, d->value_size, d->max_entries, d->flags);
  }
  for (size_t i = 0; i < ms_bpf_object_prog_count(o); i++) {
    const struct ms_bpf_prog *p = ms_bpf_object_prog(o, i);
    size_t n;
    const struct ms_bpf_insn *insns = ms_bpf_prog_insns(p, &n);
    printf("prog %zu: %s section %s, %zu insns\n", i, ms_bpf_prog_name(p), ms_bpf_prog_section(p), n);
    print_disasm(insns, n, linux_form);
  }
  ms_bpf_object_free(o);
  return 0;
}

/* ---- dispatch ----------------------------------------------------------- */

/* The subcommands, in --help's order (frame/cli.h reads the table). */
static const struct cli_cmd bpf_cmds[] = {
    CLI_CMD("conformance", NULL, "run the BPF conformance suite's .data files", cmd_conformance),
    CLI_CMD("asm", NULL, "assemble uBPF-style text to instruction words", cmd_asm),
    CLI_CMD("disasm", NULL, "disassemble a .data file or raw instructions", cmd_disasm),
    CLI_CMD("objdump", NULL, "list maps and programs of a BPF ELF object", cmd_objdump),
    {0}};

const struct cli_group bpf_group = {.path = "megascope bpf",
                                    .noun = "subcommand",
                                    .one = "one",
                                    .width = 12,
                                    .help_word = 1,
                                    .cmds = bpf_cmds};
