/* SPDX-License-Identifier: MIT */
/* libFuzzer target over the ELF loader, the verifier and the interpreter.
 *
 * One input is tried two ways:
 *  (a) as an ELF object (ms_bpf_object_open_mem); if it loads, every program
 *      is verified against the hook its section names;
 *  (b) as raw instructions (size / 8 of them; the bytes left over choose the
 *      hook, the program type and the RAW_MEM size), given five maps of every
 *      kind, verified as an observe (or sched_hint) program on a hook and as
 *      a RAW_MEM program.
 * Whatever verifies is run by the interpreter — on a context of fuzz bytes,
 * or on a buffer — with its maps bound. The interpreter checks every access
 * at run time; a verified program that faults, overruns its budget, calls an
 * unknown helper or hands a helper a bad map or record is a verifier
 * soundness bug, and the target abort()s with the verifier's and the run's
 * logs. Budgets keep each input cheap: a verification cap of FUZZ_INSN_LIMIT
 * instructions processed, runs of at most twice that (a verified program's
 * longest path is bounded by what the verifier processed).
 *
 * Built by scripts/fuzz.sh with clang -fsanitize=fuzzer,address,undefined;
 * tests/test_bpf_fuzz_corpus.c includes this file and replays a corpus
 * through LLVMFuzzerTestOneInput without libFuzzer. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "megascope/bpf.h"
#include "megascope/hook.h"
#include "megascope/verifier.h"

#define FUZZ_INSN_LIMIT 20000
#define FUZZ_MAX_INSNS 4096
#define FUZZ_MAX_MAP_BYTES (8u << 20)
#define FUZZ_LOG (64u << 10)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static struct ms_bpf_helpers *fuzz_helpers;
static char fuzz_vlog[FUZZ_LOG], fuzz_rlog[4096];

static uint64_t fuzz_log2(struct ms_bpf_exec *x, uint64_t v, uint64_t a2, uint64_t a3, uint64_t a4, uint64_t a5) {
  return v ? 63 - (uint64_t)__builtin_clzll(v) : 0;
}

static const struct ms_bpf_helpers *fuzz_helpers_get(void) {
  static const struct ms_bpf_helper_proto log2_proto = {
      MS_HELPER_LOG2, "ms_log2", MS_BPF_RET_INTEGER, {MS_BPF_ARG_ANYTHING}, 0};
  if (!fuzz_helpers) {
    fuzz_helpers = ms_bpf_helpers_new();
    if (!fuzz_helpers || ms_bpf_helpers_add_std(fuzz_helpers) ||
        ms_bpf_helpers_set(fuzz_helpers, &log2_proto, fuzz_log2))
      abort();
  }
  return fuzz_helpers;
}

/* The maps raw programs may name with lddw map[i]. */
static const struct ms_bpf_map_def fuzz_maps[] = {
    {"hash8", MS_BPF_MAP_HASH, 4, 8, 16, 0},
    {"array8", MS_BPF_MAP_ARRAY, 4, 8, 4, 0},
    {"rb", MS_BPF_MAP_RINGBUF, 0, 0, 4096, 0},
    {".rodata", MS_BPF_MAP_ARRAY, 4, 16, 1, MS_BPF_MAP_F_RDONLY_PROG},
    {"pcpu64", MS_BPF_MAP_PERCPU_ARRAY, 4, 64, 4, 0},
};
#define FUZZ_N_MAPS (sizeof fuzz_maps / sizeof fuzz_maps[0])

static uint64_t map_bytes(const struct ms_bpf_map_def *d) {
  if (d->type == MS_BPF_MAP_RINGBUF) return 2ull * d->max_entries;
  return ((uint64_t)d->key_size + d->value_size + 16) * d->max_entries * 2 * 2;
}

/* Binds a fresh map to each of prog's map indices; 0 when one cannot be
 * made (too big, or refused): the program is then not run. */
static int bind_maps(const struct ms_bpf_prog *p, struct ms_bpf_map **maps) {
  size_t n = ms_bpf_prog_map_count(p);
  memset(maps, 0, MS_BPF_MAX_MAPS * sizeof *maps);
  for (size_t i = 0; i < n; i++) {
    const struct ms_bpf_map_def *d = ms_bpf_prog_map(p, i);
    if (map_bytes(d) > FUZZ_MAX_MAP_BYTES || !(maps[i] = ms_bpf_map_new(d, 2, NULL))) return 0;
  }
  return 1;
}

static void unbind_maps(struct ms_bpf_map **maps) {
  for (size_t i = 0; i < MS_BPF_MAX_MAPS; i++) ms_bpf_map_free(maps[i]);
}

/* A verified program failed at run time: the verifier let through what it
 * should not have. */
static void soundness_bug(const char *what, int rc) {
  fprintf(stderr, "fuzz_bpf: %s: a verified program failed at run time (%d)\n--- verifier log:\n%s\n"
          "--- run log:\n%s\n", what, rc, fuzz_vlog, fuzz_rlog);
  abort();
}

/* Runs a verified program: on a context of fuzz bytes (hook programs) or
 * with r1 = mem, r2 = mem_size (raw programs; mem NULL when mem_size is 0). */
static void run_verified(const struct ms_bpf_prog *p, const uint8_t *data, size_t size, int raw, void *mem,
                         uint32_t mem_size, const char *what) {
  struct ms_bpf_map *maps[MS_BPF_MAX_MAPS];
  if (bind_maps(p, maps)) {
    uint64_t ctx[sizeof(struct ms_hook_ctx) / 8] = {0};
    memcpy(ctx, data, size < sizeof ctx ? size : sizeof ctx);
    struct ms_textbuf rlog = {fuzz_rlog, sizeof fuzz_rlog, 0, 0};
    fuzz_rlog[0] = 0;
    struct ms_bpf_run_opts ro = {.sz = sizeof ro, .helpers = fuzz_helpers_get(), .maps = maps,
                                 .n_maps = ms_bpf_prog_map_count(p), .insn_budget = 2 * FUZZ_INSN_LIMIT + 16,
                                 .log = &rlog};
    if (raw) ro.mem = mem, ro.mem_size = mem ? mem_size : 0;
    else ro.ctx = ctx, ro.ctx_size = sizeof ctx;
    struct ms_bpf_run_result res;
    int rc = ms_bpf_run(p, &ro, &res);
    if (rc) soundness_bug(what, rc);
  }
  unbind_maps(maps);
}

static int verify(const struct ms_bpf_prog *p, int kind, int type, int hook, uint32_t mem_size) {
  struct ms_textbuf log = {fuzz_vlog, sizeof fuzz_vlog, 0, 0};
  struct ms_verify_opts o = {.sz = sizeof o, .kind = kind, .prog_type = type, .hook = hook, .mem_size = mem_size,
                             .helpers = fuzz_helpers_get(), .insn_limit = FUZZ_INSN_LIMIT};
  struct ms_verify_stats st;
  fuzz_vlog[0] = 0;
  int rc = ms_bpf_verify(p, &o, &log, &st);
  if (rc != 0 && rc != -MS_E_VERIFY && rc != -ENOMEM) {
    fprintf(stderr, "fuzz_bpf: the verifier returned %d\n%s\n", rc, fuzz_vlog);
    abort();
  }
  if (!strstr(fuzz_vlog, "processed ")) abort(); /* the stats line is always there */
  return rc;
}

static void try_object(const uint8_t *data, size_t size) {
  struct ms_bpf_object *obj = ms_bpf_object_open_mem(data, size, "fuzz", NULL);
  if (!obj) return;
  uint32_t abi = 0;
  ms_bpf_object_abi_version(obj, &abi, NULL);
  for (size_t i = 0; i < ms_bpf_object_prog_count(obj); i++) {
    const struct ms_bpf_prog *p = ms_bpf_object_prog(obj, i);
    int type, hook;
    char why[256];
    if (ms_hook_parse_section(ms_bpf_prog_section(p), &type, &hook, why, sizeof why)) continue;
    if (verify(p, MS_VERIFY_HOOK, type, hook, 0) == 0 && abi <= MS_HOOK_ABI_VERSION)
      run_verified(p, data, size, 0, NULL, 0, "object program");
  }
  ms_bpf_object_free(obj);
}

static void try_raw(const uint8_t *data, size_t size) {
  size_t n = size / 8, extra = size % 8;
  if (n == 0 || n > FUZZ_MAX_INSNS) return;
  const uint8_t *t = data + n * 8;
  int hook = extra ? t[0] % MS_HOOK_COUNT : MS_HOOK_TASK_END;
  int type = extra && (t[0] & 0x80) ? MS_PROG_SCHED_HINT : MS_PROG_OBSERVE;
  if (type == MS_PROG_SCHED_HINT) hook = MS_HOOK_TASK_READY;
  uint32_t mem_size = extra > 1 ? t[1] : 64;
  struct ms_bpf_insn *insns = malloc(n * sizeof *insns);
  if (!insns) return;
  memcpy(insns, data, n * sizeof *insns);
  struct ms_bpf_prog_opts po = {.sz = sizeof po, .name = "raw", .maps = fuzz_maps, .n_maps = FUZZ_N_MAPS};
  struct ms_bpf_prog *p = ms_bpf_prog_new(insns, n, &po);
  free(insns);
  if (!p) return;
  if (verify(p, MS_VERIFY_HOOK, type, hook, 0) == 0) run_verified(p, data, size, 0, NULL, 0, "raw hook program");
  if (verify(p, MS_VERIFY_RAW_MEM, 0, 0, mem_size) == 0) {
    uint64_t *mem = calloc(1, mem_size + 8); /* 8-byte aligned, as every region is */
    if (mem) {
      memcpy(mem, data, size < mem_size ? size : mem_size);
      run_verified(p, data, size, 1, mem_size ? mem : NULL, mem_size, "raw mem program");
    }
    free(mem);
  }
  ms_bpf_prog_free(p);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  try_object(data, size);
  try_raw(data, size);
  return 0;
}
