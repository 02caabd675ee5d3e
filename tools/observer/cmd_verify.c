/* SPDX-License-Identifier: MIT */
/* `megascope verify PROG.o [-v] [--json] [--section S] [--jit-dump DIR]`: verifies every program
 * of a clang -target bpf object (or the one in section S) against the hook
 * its section names, with the standard helpers and megascope's own (log2),
 * and prints the verifier's log: the stats line always, the instruction trace
 * with -v, the rejected instruction and why; then a summary line: the time it
 * took, instructions processed and verifier work against their caps, and the
 * longest run it proved against the hook run budget. The object's declared hook ABI
 * version must not be newer than this build's. With --jit-dump, each verified
 * program is also compiled by the x86-64 JIT (against maps made from the
 * object's definitions) and its native code written to DIR/<program>.bin.
 * Exit codes: 0 every program verified, 1 one was rejected, 2 usage errors
 * and objects that cannot be read. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "opt.h"
#include "megascope/bpf.h"
#include "megascope/bpf_jit.h"
#include "megascope/hook.h"
#include "megascope/json.h"
#include "megascope/monitor.h"
#include "megascope/verifier.h"

#define LOG_SMALL (64u << 10)
#define LOG_VERBOSE (16u << 20)

static const char verify_head[] =
    "usage: megascope verify PROG.o [-v] [--json] [--section S] [--jit-dump DIR]\n\n"
    "Verifies each program of a clang -target bpf object against the hook its section\n"
    "names (megascope/<observe|sched_hint>/<hook>): context reads only of fields the hook\n"
    "defines, stack and map value accesses in bounds and initialised, NULL checks after\n"
    "lookups, no pointer leaving the program, helper arguments of the right kinds, ring\n"
    "buffer reservations released, bounded loops, sched_hint returning 0..7.\n"
    "Exit: 0 all verified, 1 a program was rejected, 2 usage or an unreadable object.\n\n";

struct verify_args {
  const char *path, *section, *jit_dir;
  int verbose, json;
};

#define VA struct verify_args
static const struct cli_opt verify_opts[] = {
    {.kind = CLI_FLAG, .name = "verbose", .shrt = 'v', .off = CLI_O(VA, verbose), .set = 1,
     .help = "the full instruction trace"},
    CLI_OPT_FLAG(VA, json, "json", "one JSON object per program, in an array"),
    CLI_OPT_STR(VA, section, "section", "S", "only the program in section S"),
    CLI_OPT_STR(VA, jit_dir, "jit-dump", "DIR",
                "also compile each verified program with the x86-64 JIT and write\n"
                "its native code to DIR/<program>.bin (for objdump -D -b binary\n"
                "-m i386:x86-64); the code's map addresses are of maps made here"),
    {0}};
#undef VA

/* 0, 1 (--help printed) or 2 (usage error printed). */
static int parse_args(int argc, char **argv, struct verify_args *a) {
  int first, rc = cli_parse("verify", verify_head, verify_opts, a, argc, argv, &first);
  if (rc) return rc > 0 ? 1 : 2;
  if (first == argc) {
    fprintf(stderr, "megascope verify: missing PROG.o\n(try 'megascope verify --help')\n");
    return 2;
  }
  if (first + 1 < argc) {
    fprintf(stderr, "megascope verify: one object only (extra '%s')\n(try 'megascope verify --help')\n", argv[first + 1]);
    return 2;
  }
  a->path = argv[first];
  return 0;
}

/* megascope's log2 helper as the verifier needs it: a prototype in the table.
 * The engine registers its own implementation; this one runs the same way. */
static uint64_t log2_fn(struct ms_bpf_exec *x, uint64_t v, uint64_t a2, uint64_t a3, uint64_t a4, uint64_t a5) {
  return v ? 63 - (uint64_t)__builtin_clzll(v) : 0;
}

static struct ms_bpf_helpers *helpers_new(void) {
  static const struct ms_bpf_helper_proto log2_proto = {
      MS_HELPER_LOG2, "ms_log2", MS_BPF_RET_INTEGER, {MS_BPF_ARG_ANYTHING}, 0};
  struct ms_bpf_helpers *h = ms_bpf_helpers_new();
  if (h && (ms_bpf_helpers_add_std(h) || ms_bpf_helpers_set(h, &log2_proto, log2_fn))) {
    ms_bpf_helpers_free(h);
    h = NULL;
  }
  return h;
}

/* The reason of a rejection: the log's line before the stats line. */
static void last_reason(const char *log, char *out, size_t size) {
  const char *end = log + strlen(log), *lines[3] = {end, end, end};
  for (const char *p = log; p < end;) {
    const char *nl = strchr(p, '\n');
    lines[0] = lines[1];
    lines[1] = lines[2];
    lines[2] = p;
    p = nl ? nl + 1 : end;
  }
  const char *r = lines[1], *nl = strchr(r, '\n');
  size_t n = nl ? (size_t)(nl - r) : strlen(r);
  snprintf(out, size, "%.*s", (int)(n < size ? n : size - 1), r);
}

struct result {
  const struct ms_bpf_prog *prog;
  int type, hook, rc;
  size_t jit_bytes; /* --jit-dump: native code written (0: none) */
  char jit_path[4096];
  struct ms_verify_stats st;
  char *log;
  char reason[512];
};

static void verify_one(const struct ms_bpf_prog *p, const struct ms_bpf_helpers *h, uint32_t abi,
                       const struct verify_args *a, struct result *r) {
  size_t size = a->verbose ? LOG_VERBOSE : LOG_SMALL;
  char why[256];
  r->prog = p;
  r->log = calloc(1, size);
  r->type = r->hook = -1;
  if (!r->log) {
    r->rc = -ENOMEM;
    snprintf(r->reason, sizeof r->reason, "out of memory");
    return;
  }
  struct ms_textbuf tb = {r->log, size, 0, 0};
  ms_hook_parse_section(ms_bpf_prog_section(p), &r->type, &r->hook, why, sizeof why);
  r->rc = ms_hook_verify_section(p, h, abi, a->verbose, &tb, &r->st);
  if (r->rc) last_reason(r->log, r->reason, sizeof r->reason);
}

/* "verified in 0.21 ms: 13 insns processed, work 29 (limit 4000000), longest run 12 of 100000". */
static void print_summary(const struct result *r) {
  const struct ms_verify_stats *st = &r->st;
  printf("%s in %.2f ms: %llu insns processed (limit %llu), work %llu (limit %llu)", r->rc ? "rejected" : "verified",
         (double)st->time_us / 1000.0, (unsigned long long)st->processed, (unsigned long long)st->insn_limit,
         (unsigned long long)st->work, (unsigned long long)st->work_limit);
  if (!r->rc)
    printf(", longest run %llu insns (run budget %llu)", (unsigned long long)st->max_run_insns,
           (unsigned long long)st->run_budget);
  printf("\n");
}

static void print_text(const struct result *r, size_t n, const char *path) {
  for (size_t i = 0; i < n; i++) {
    printf("%s: program %s (section %s): %s\n", path, ms_bpf_prog_name(r[i].prog), ms_bpf_prog_section(r[i].prog),
           r[i].rc ? "REJECTED" : "verified");
    fputs(r[i].log ? r[i].log : "", stdout);
    print_summary(&r[i]);
    if (r[i].rc)
      fprintf(stderr, "megascope verify: %s: program %s rejected: %s\n", path, ms_bpf_prog_name(r[i].prog),
              r[i].reason);
    if (r[i].jit_bytes) printf("jit: %zu bytes of x86-64 code in %s\n", r[i].jit_bytes, r[i].jit_path);
  }
}

static void print_json(const struct result *r, size_t n, const char *path, int with_log) {
  struct ms_json j;
  ms_json_init(&j, stdout, 1);
  ms_json_obj_begin(&j);
  ms_json_kstr(&j, "object", path);
  ms_json_key(&j, "programs");
  ms_json_arr_begin(&j);
  for (size_t i = 0; i < n; i++) {
    ms_json_obj_begin(&j);
    ms_json_kstr(&j, "name", ms_bpf_prog_name(r[i].prog));
    ms_json_kstr(&j, "section", ms_bpf_prog_section(r[i].prog));
    ms_json_kstr(&j, "hook", r[i].hook >= 0 ? ms_hook_name(r[i].hook) : "");
    ms_json_kstr(&j, "type", r[i].type >= 0 ? ms_prog_type_name(r[i].type) : "");
    ms_json_kbool(&j, "verified", r[i].rc == 0);
    ms_json_key(&j, "error");
    if (r[i].rc) ms_json_str(&j, r[i].reason);
    else ms_json_null(&j);
    ms_json_kint(&j, "err_insn", r[i].st.err_insn);
    ms_json_kuint(&j, "processed", r[i].st.processed);
    ms_json_kuint(&j, "insn_limit", r[i].st.insn_limit);
    ms_json_kuint(&j, "max_states_per_insn", r[i].st.max_states_per_insn);
    ms_json_kuint(&j, "total_states", r[i].st.total_states);
    ms_json_kuint(&j, "peak_states", r[i].st.peak_states);
    ms_json_kuint(&j, "time_us", r[i].st.time_us);
    ms_json_kuint(&j, "max_run_insns", r[i].st.max_run_insns);
    ms_json_kuint(&j, "run_budget", r[i].st.run_budget);
    ms_json_kuint(&j, "work", r[i].st.work);
    ms_json_kuint(&j, "work_limit", r[i].st.work_limit);
    if (r[i].jit_bytes) {
      ms_json_kuint(&j, "jit_bytes", r[i].jit_bytes);
      ms_json_kstr(&j, "jit_file", r[i].jit_path);
    }
    if (with_log) ms_json_kstr(&j, "log", r[i].log ? r[i].log : "");
    ms_json_obj_end(&j);
  }
  ms_json_arr_end(&j);
  ms_json_obj_end(&j);
  ms_json_end(&j);
}

/* Compiles a verified program with the JIT, bound to maps made from the
 * object's definitions, and writes its code to dir/<name>.bin. 0, or 1 with
 * the reason on stderr. */
static int jit_dump(const struct ms_bpf_object *obj, const struct ms_bpf_helpers *h, uint32_t abi,
                    const char *dir, struct result *r) {
  char logbuf[4400] = "";
  struct ms_textbuf tb = {logbuf, sizeof logbuf, 0, 0};
  struct ms_bpf_map *maps[MS_BPF_MAX_MAPS] = {0};
  size_t nm = ms_bpf_object_map_count(obj);
  struct ms_bpf_jit *j = NULL;
  int rc = 1;
  for (size_t i = 0; i < nm && i < MS_BPF_MAX_MAPS; i++)
    if (!(maps[i] = ms_bpf_map_new(ms_bpf_object_map(obj, i), 1, &tb))) goto out;
  struct ms_verify_opts vo = {.sz = sizeof vo, .kind = MS_VERIFY_HOOK, .prog_type = r->type, .hook = r->hook,
                              .ctx = ms_hook_verify_ctx(r->type, r->hook),
                              .helpers = h, .abi_version = abi};
  struct ms_bpf_jit_opts jo = {.sz = sizeof jo, .verify = &vo, .helpers = h, .maps = maps, .n_maps = nm,
                               .log = &tb};
  if (!(j = ms_bpf_jit_new(r->prog, &jo))) {
    snprintf(logbuf, sizeof logbuf, "%s", ms_strerror(errno));
    goto out;
  }
  snprintf(r->jit_path, sizeof r->jit_path, "%s/%s.bin", dir, ms_bpf_prog_name(r->prog));
  FILE *f = fopen(r->jit_path, "wb");
  size_t n = ms_bpf_jit_code_size(j);
  if (!f || fwrite(ms_bpf_jit_code(j), 1, n, f) != n) {
    snprintf(logbuf, sizeof logbuf, "%s: %s", r->jit_path, strerror(errno));
    if (f) fclose(f);
    goto out;
  }
  if (fclose(f)) goto out;
  r->jit_bytes = n;
  rc = 0;
out:
  if (rc)
    fprintf(stderr, "megascope verify: program %s: the JIT did not compile it: %s\n", ms_bpf_prog_name(r->prog),
            logbuf);
  ms_bpf_jit_free(j);
  for (size_t i = 0; i < nm && i < MS_BPF_MAX_MAPS; i++) ms_bpf_map_free(maps[i]);
  return rc;
}

/* Opens the object and picks its programs; 0 or an exit code. */
static int open_object(const struct verify_args *a, struct ms_bpf_object **obj, uint32_t *abi) {
  char logbuf[2048] = "";
  struct ms_textbuf tb = {logbuf, sizeof logbuf, 0, 0};
  *obj = ms_bpf_object_open_file(a->path, &tb);
  if (!*obj) {
    fprintf(stderr, "megascope verify: %s: cannot load the object: %s%s", a->path,
            logbuf[0] ? logbuf : strerror(errno), logbuf[0] ? "" : "\n");
    return 2;
  }
  if (ms_bpf_object_abi_version(*obj, abi, &tb)) {
    fprintf(stderr, "megascope verify: %s: %s", a->path, logbuf);
    return 2;
  }
  if (a->section && !ms_bpf_object_find_prog(*obj, a->section)) {
    fprintf(stderr, "megascope verify: %s: no program in section '%s'\n", a->path, a->section);
    return 2;
  }
  if (!ms_bpf_object_prog_count(*obj)) {
    fprintf(stderr, "megascope verify: %s: the object has no programs\n", a->path);
    return 2;
  }
  return 0;
}

int cmd_verify(int argc, char **argv) {
  struct verify_args a = {0};
  int rc = parse_args(argc, argv, &a);
  if (rc) return rc == 1 ? 0 : rc;
  struct ms_bpf_object *obj;
  uint32_t abi = 0;
  if ((rc = open_object(&a, &obj, &abi))) {
    ms_bpf_object_free(obj);
    return rc;
  }
  struct ms_bpf_helpers *h = helpers_new();
  size_t n = ms_bpf_object_prog_count(obj), k = 0;
  struct result *res = calloc(n, sizeof *res);
  if (!h || !res) {
    fprintf(stderr, "megascope verify: out of memory\n");
    rc = 2;
    goto out;
  }
  for (size_t i = 0; i < n; i++) {
    const struct ms_bpf_prog *p = ms_bpf_object_prog(obj, i);
    if (a.section && strcmp(ms_bpf_prog_section(p), a.section)) continue;
    verify_one(p, h, abi, &a, &res[k]);
    if (res[k].rc) rc = 1;
    else if (a.jit_dir && jit_dump(obj, h, abi, a.jit_dir, &res[k])) rc = 1;
    k++;
  }
  if (a.json) print_json(res, k, a.path, a.verbose);
  else print_text(res, k, a.path);
out:
  for (size_t i = 0; res && i < k; i++) free(res[i].log);
  free(res);
  ms_bpf_helpers_free(h);
  ms_bpf_object_free(obj);
  return rc;
}
