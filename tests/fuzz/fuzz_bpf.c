/* SPDX-License-Identifier: MIT */
/* libFuzzer target over the ELF loader, the verifier and the interpreter.
 *
 * One input is tried two ways:
 *  (a) as an ELF object (ms_bpf_object_open_mem); if it loads, every program
 *      is verified against the hook its section names;
 *  (b) as raw instructions (size / 8 of them; the bytes left over choose the
 *      hook, the program type and the RAW_MEM size), given five maps of every
 *      kind, verified as an observe (or sched_hint) program on a hook and as
 *      a RAW_MEM program;
 *  (c) as a recipe for a well-formed program (see try_generated), verified
 *      and run the same two ways.
 * Whatever verifies is run by the interpreter — on a context of fuzz bytes,
 * or on a buffer — with its maps bound; where the host has the x86-64 JIT,
 * it is also compiled and run natively from the same starting state (a twin
 * set of maps, a fresh copy of the buffer), and the two runs must agree on
 * the return code, r0, the instructions executed and every byte of the
 * buffer. The interpreter checks every access at run time; a verified program
 * that faults, overruns its budget, runs more instructions than the verifier's
 * bound (max_run_insns), calls an unknown helper or hands a helper a bad map
 * or record is a verifier soundness bug, and the target abort()s with the
 * verifier's and the run's logs. Budgets keep each input cheap: a verification cap of FUZZ_INSN_LIMIT
 * instructions processed, runs of at most twice that (a verified program's
 * longest path is bounded by what the verifier processed).
 *
 * Built by scripts/fuzz.sh with clang -fsanitize=fuzzer,address,undefined;
 * tests/test_bpf_fuzz_corpus.c includes this file and replays a corpus
 * through LLVMFuzzerTestOneInput without libFuzzer. */
#include <elf.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "megascope/bpf.h"
#include "megascope/bpf_jit.h"
#include "megascope/hook.h"
#include "megascope/verifier.h"

#define FUZZ_INSN_LIMIT 20000
#define FUZZ_MAX_INSNS 4096
#define FUZZ_MAX_MAP_BYTES (8u << 20)
#define FUZZ_LOG (64u << 10)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static struct ms_bpf_helpers *fuzz_helpers;
static unsigned long fuzz_runs; /* verified programs run (for drivers that report it) */
static unsigned long fuzz_jit_runs; /* of those, also run by the JIT and compared */
static char fuzz_vlog[FUZZ_LOG], fuzz_rlog[4096];
static struct ms_verify_stats fuzz_st; /* of the last verification */

static uint64_t fuzz_log2(struct ms_bpf_exec *x, uint64_t v, uint64_t a2, uint64_t a3, uint64_t a4, uint64_t a5) {
  return v ? 63 - (uint64_t)__builtin_clzll(v) : 0;
}

/* A clock that reads the same in every run, so the JIT's run and the
 * interpreter's can be compared exactly. */
static uint64_t fuzz_ktime(struct ms_bpf_exec *x, uint64_t a1, uint64_t a2, uint64_t a3, uint64_t a4, uint64_t a5) {
  return 1000003;
}

static const struct ms_bpf_helpers *fuzz_helpers_get(void) {
  static const struct ms_bpf_helper_proto log2_proto = {
      MS_HELPER_LOG2, "ms_log2", MS_BPF_RET_INTEGER, {MS_BPF_ARG_ANYTHING}, 0};
  if (!fuzz_helpers) {
    fuzz_helpers = ms_bpf_helpers_new();
    if (!fuzz_helpers || ms_bpf_helpers_add_std(fuzz_helpers) ||
        ms_bpf_helpers_set(fuzz_helpers, &log2_proto, fuzz_log2) ||
        ms_bpf_helpers_set(fuzz_helpers, ms_bpf_helper_proto_std(MS_BPF_FN_KTIME_GET_NS), fuzz_ktime))
      abort();
  }
  return fuzz_helpers;
}

/* The maps raw programs may name with lddw map[i]. One entry each (and one
 * worker when bound), so that the interpreter's run-time region of a map is
 * exactly one value: an access the verifier wrongly allowed then faults. */
static const struct ms_bpf_map_def fuzz_maps[] = {
    {"hash8", MS_BPF_MAP_HASH, 4, 8, 1, 0},
    {"array8", MS_BPF_MAP_ARRAY, 4, 8, 1, 0},
    {"rb", MS_BPF_MAP_RINGBUF, 0, 0, 4096, 0},
    {".rodata", MS_BPF_MAP_ARRAY, 4, 16, 1, MS_BPF_MAP_F_RDONLY_PROG},
    {"pcpu64", MS_BPF_MAP_PERCPU_ARRAY, 4, 64, 1, 0},
};
#define FUZZ_N_MAPS (sizeof fuzz_maps / sizeof fuzz_maps[0])

static uint64_t map_bytes(const struct ms_bpf_map_def *d) {
  if (d->type == MS_BPF_MAP_RINGBUF) return 2ull * d->max_entries;
  return ((uint64_t)d->key_size + d->value_size + 16) * d->max_entries * 2 * 2;
}

/* The maps of raw and generated programs, made once (memfd maps are costly
 * to make) and emptied before each run: set 0 for the interpreter, set 1 for
 * the JIT. Both see the same operations, so their ring buffers fill alike. */
static struct ms_bpf_map *fuzz_fixed_sets[2][FUZZ_N_MAPS];
#define fuzz_fixed fuzz_fixed_sets[0]

static int uses_fixed_maps(const struct ms_bpf_prog *p) {
  if (ms_bpf_prog_map_count(p) != FUZZ_N_MAPS) return 0;
  for (size_t i = 0; i < FUZZ_N_MAPS; i++)
    if (memcmp(ms_bpf_prog_map(p, i), &fuzz_maps[i], sizeof fuzz_maps[i])) return 0;
  return 1;
}

/* Binds a map to each of prog's map indices; 0 when one cannot be made (too
 * big, or refused): the program is then not run. */
static int bind_maps(const struct ms_bpf_prog *p, struct ms_bpf_map **maps, int set) {
  size_t n = ms_bpf_prog_map_count(p);
  struct ms_bpf_map **fixed = fuzz_fixed_sets[set];
  memset(maps, 0, MS_BPF_MAX_MAPS * sizeof *maps);
  if (uses_fixed_maps(p)) {
    for (size_t i = 0; i < FUZZ_N_MAPS; i++) {
      if (!fixed[i] && !(fixed[i] = ms_bpf_map_new(&fuzz_maps[i], 1, NULL))) return 0;
      if (fuzz_maps[i].type != MS_BPF_MAP_RINGBUF) ms_bpf_map_clear(fixed[i]);
      if (fuzz_maps[i].type == MS_BPF_MAP_HASH) { /* key 0 present, so lookups of it succeed */
        uint64_t zero = 0;
        ms_bpf_map_update(fixed[i], &zero, &zero, MS_BPF_ANY, 0);
      }
      maps[i] = fixed[i];
    }
    return 1;
  }
  for (size_t i = 0; i < n; i++) {
    const struct ms_bpf_map_def *d = ms_bpf_prog_map(p, i);
    if (map_bytes(d) > FUZZ_MAX_MAP_BYTES || !(maps[i] = ms_bpf_map_new(d, 1, NULL))) return 0;
  }
  return 1;
}

static void unbind_maps(struct ms_bpf_map **maps, int set) {
  for (size_t i = 0; i < MS_BPF_MAX_MAPS; i++)
    if (i >= FUZZ_N_MAPS || maps[i] != fuzz_fixed_sets[set][i]) ms_bpf_map_free(maps[i]);
}

/* A verified program failed at run time: the verifier let through what it
 * should not have. */
static void soundness_bug(const char *what, int rc) {
  fprintf(stderr, "fuzz_bpf: %s: a verified program failed at run time (%d)\n--- verifier log:\n%s\n"
          "--- run log:\n%s\n", what, rc, fuzz_vlog, fuzz_rlog);
  abort();
}

/* The options of the last verification, for the JIT to verify with. */
static struct ms_verify_opts fuzz_vo;

/* Runs a verified program natively, from the state the interpreter started
 * in (maps of set 1, mem0 copied), and requires the interpreter's outcome. */
static void run_jit(const struct ms_bpf_prog *p, const struct ms_bpf_run_opts *iro, const void *mem0,
                    uint32_t mem_size, uint64_t r0, uint64_t insns, const void *mem_after, const char *what) {
  struct ms_bpf_map *maps[MS_BPF_MAX_MAPS];
  uint64_t *mem = NULL;
  struct ms_bpf_jit *j = NULL;
  if (!bind_maps(p, maps, 1)) goto out;
  struct ms_bpf_jit_opts jo = {.sz = sizeof jo, .verify = &fuzz_vo, .helpers = fuzz_helpers_get(), .maps = maps,
                               .n_maps = ms_bpf_prog_map_count(p)};
  if (!(j = ms_bpf_jit_new(p, &jo))) goto out; /* a construct the JIT leaves to the interpreter */
  struct ms_bpf_run_opts ro = *iro;
  ro.maps = maps;
  if (iro->mem) {
    if (!(mem = malloc(mem_size + 8))) goto out;
    memcpy(mem, mem0, mem_size);
    ro.mem = mem;
  }
  struct ms_textbuf rlog = {fuzz_rlog, sizeof fuzz_rlog, 0, 0};
  ro.log = &rlog;
  struct ms_bpf_run_result res;
  int rc = ms_bpf_jit_run(j, &ro, &res);
  fuzz_jit_runs++;
  if (rc || res.r0 != r0 || res.insns != insns || (mem && memcmp(mem, mem_after, mem_size))) {
    fprintf(stderr, "fuzz_bpf: %s: the JIT disagrees with the interpreter: rc %d, r0 0x%llx (interpreter 0x%llx), "
            "%llu instructions (interpreter %llu)%s\n--- run log:\n%s\n", what, rc, (unsigned long long)res.r0,
            (unsigned long long)r0, (unsigned long long)res.insns, (unsigned long long)insns,
            mem && memcmp(mem, mem_after, mem_size) ? ", the buffer differs" : "", fuzz_rlog);
    abort();
  }
out:
  ms_bpf_jit_free(j);
  free(mem);
  unbind_maps(maps, 1);
}

/* Runs a verified program: on a context of fuzz bytes (hook programs) or
 * with r1 = mem, r2 = mem_size (raw programs; mem NULL when mem_size is 0);
 * then the same through the JIT. */
static void run_verified(const struct ms_bpf_prog *p, const uint8_t *data, size_t size, int raw, void *mem,
                         uint32_t mem_size, const char *what) {
  struct ms_bpf_map *maps[MS_BPF_MAX_MAPS] = {0};
  void *mem0 = mem ? malloc(mem_size + 8) : NULL;
  if (mem0) memcpy(mem0, mem, mem_size);
  int ran = 0;
  uint64_t r0 = 0, insns = 0;
  if ((!mem || mem0) && bind_maps(p, maps, 0)) {
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
    fuzz_runs++;
    if (rc) soundness_bug(what, rc);
    if (res.r0 < fuzz_st.r0_umin || res.r0 > fuzz_st.r0_umax || (int64_t)res.r0 < fuzz_st.r0_smin ||
        (int64_t)res.r0 > fuzz_st.r0_smax) {
      snprintf(fuzz_rlog, sizeof fuzz_rlog, "r0 = 0x%llx, outside the verifier's R0 range u[%llu, %llu] s[%lld, %lld]",
               (unsigned long long)res.r0, (unsigned long long)fuzz_st.r0_umin, (unsigned long long)fuzz_st.r0_umax,
               (long long)fuzz_st.r0_smin, (long long)fuzz_st.r0_smax);
      soundness_bug(what, 0);
    }
    if (res.insns > fuzz_st.max_run_insns) {
      snprintf(fuzz_rlog, sizeof fuzz_rlog, "ran %llu instructions, more than the verifier's bound of %llu",
               (unsigned long long)res.insns, (unsigned long long)fuzz_st.max_run_insns);
      soundness_bug(what, 0);
    }
    ran = 1;
    r0 = res.r0;
    insns = res.insns;
  }
  unbind_maps(maps, 0); /* also what a failed bind made */
  if (ran && ms_bpf_jit_supported()) {
    struct ms_bpf_run_opts ro = {.sz = sizeof ro, .helpers = fuzz_helpers_get(), .n_maps = ms_bpf_prog_map_count(p),
                                 .insn_budget = 2 * FUZZ_INSN_LIMIT + 16};
    uint64_t ctx[sizeof(struct ms_hook_ctx) / 8] = {0};
    memcpy(ctx, data, size < sizeof ctx ? size : sizeof ctx);
    if (raw) ro.mem = mem, ro.mem_size = mem ? mem_size : 0;
    else ro.ctx = ctx, ro.ctx_size = sizeof ctx;
    run_jit(p, &ro, mem0, mem_size, r0, insns, mem, what);
  }
  free(mem0);
}

static int verify(const struct ms_bpf_prog *p, int kind, int type, int hook, uint32_t mem_size) {
  struct ms_textbuf log = {fuzz_vlog, sizeof fuzz_vlog, 0, 0};
  struct ms_verify_opts o = {.sz = sizeof o, .kind = kind, .prog_type = type, .hook = hook, .mem_size = mem_size,
                             .helpers = fuzz_helpers_get(), .insn_limit = FUZZ_INSN_LIMIT,
                             .ctx = kind == MS_VERIFY_HOOK ? ms_hook_verify_ctx(type, hook) : NULL};
  fuzz_vo = o;
  fuzz_vlog[0] = 0;
  int rc = ms_bpf_verify(p, &o, &log, &fuzz_st);
  if (rc != 0 && rc != -MS_E_VERIFY && rc != -ENOMEM) {
    fprintf(stderr, "fuzz_bpf: the verifier returned %d\n%s\n", rc, fuzz_vlog);
    abort();
  }
  if (!strstr(fuzz_vlog, "processed ")) abort(); /* the stats line is always there */
  return rc;
}

/* An ELF section (such as a NOBITS .bss) claiming more than this makes the
 * loader allocate that much for the global data's initial value; such inputs
 * only exhaust the fuzzer's memory, so they are skipped until the loader
 * refuses global data larger than a map value can be (65536 bytes). */
#define FUZZ_MAX_SECTION (1u << 20)

static int elf_claims_too_much(const uint8_t *data, size_t size) {
  Elf64_Ehdr eh;
  if (size < sizeof eh || memcmp(data, ELFMAG, SELFMAG)) return 0;
  memcpy(&eh, data, sizeof eh);
  if (eh.e_shentsize != sizeof(Elf64_Shdr)) return 0;
  for (size_t i = 0; i < eh.e_shnum; i++) {
    Elf64_Shdr sh;
    uint64_t at = eh.e_shoff + i * sizeof sh;
    if (at < eh.e_shoff || at > size || size - at < sizeof sh) return 0;
    memcpy(&sh, data + at, sizeof sh);
    if (sh.sh_size > FUZZ_MAX_SECTION) return 1;
  }
  return 0;
}

static void try_object(const uint8_t *data, size_t size) {
  if (elf_claims_too_much(data, size)) return;
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

/* ---- generated programs ------------------------------------------------- */

/* Random bytes rarely encode a valid program, so (c) reads the input as a
 * recipe instead: each 4 bytes pick one instruction from the encodings the
 * checker accepts (or a short idiom: a map lookup, a ring buffer reservation,
 * a NULL check, a release, a call to a subprogram), with registers, offsets and immediates
 * drawn from values that matter (bounds, signs, sizes). Jumps land inside the
 * program; it ends with exit. This reaches the verifier's deep states. */
struct gen {
  struct ms_bpf_insn *out;
  size_t n, cap;
};

static void emit(struct gen *g, uint8_t code, unsigned dst, unsigned src, int16_t off, int32_t imm) {
  if (g->n < g->cap) g->out[g->n++] = (struct ms_bpf_insn){code, (uint8_t)dst, (uint8_t)src, off, imm};
}

static int32_t gen_imm(uint8_t b) {
  static const int32_t vals[16] = {0, 1, -1, 2, 7, 8, 15, 16, 63, 64, 255, 4096, -8, 0x7fffffff, INT32_MIN, 32};
  return b < 128 ? vals[b & 15] : (int8_t)b;
}

/* Offsets near the edges that matter: of an 8-byte value, a 64-byte one, a
 * record, the context (184 bytes), the stack (-512). */
static int16_t gen_off(uint8_t b) {
  static const int16_t edges[16] = {0, 4, 8, 7, 16, 56, 60, 64, 176, 180, 184, -1, -8, -16, -512, -520};
  if (b < 96) return (int16_t)(-8 * (int)(b & 63));
  if (b < 192) return edges[b & 15];
  return (int16_t)(int8_t)b;
}

/* The register an access goes through: mostly one that holds a pointer
 * (r0 a lookup or reservation, r1/r6 the context or buffer, r7/r10 the stack). */
static unsigned gen_base(uint8_t b) {
  static const uint8_t regs[8] = {0, 0, 1, 6, 7, 10, 2, 3};
  return b & 0x80 ? (b & 15) % 11 : regs[b & 7];
}

static void gen_lddw(struct gen *g, unsigned dst, unsigned src_kind, int32_t imm, int32_t next) {
  emit(g, MS_BPF_LD | MS_BPF_IMM | MS_BPF_DW, dst, src_kind, 0, imm);
  emit(g, 0, 0, 0, 0, next);
}

#define GEN_CALL_MARK 0x7fff0000 /* a local call whose target is the subprogram, fixed at the end */

static void gen_idiom(struct gen *g, uint8_t which, uint8_t a, uint8_t b) {
  switch (which % 7) {
  case 6: /* a bpf-to-bpf call, r1 = a stack slot, the context or a value */
    if (a % 3 == 0) emit(g, MS_BPF_ALU64 | MS_BPF_MOV | MS_BPF_X, 1, 10, 0, 0), emit(g, MS_BPF_ALU64 | MS_BPF_ADD | MS_BPF_K, 1, 0, 0, -8 * (1 + (b & 3)));
    else emit(g, MS_BPF_ALU64 | MS_BPF_MOV | MS_BPF_X, 1, a % 3 == 1 ? 6 : b % 10, 0, 0);
    emit(g, MS_BPF_JMP | MS_BPF_CALL, 0, MS_BPF_PSEUDO_CALL, 0, GEN_CALL_MARK);
    break;
  case 0: /* map lookup of a key on the stack */
    emit(g, MS_BPF_ST | MS_BPF_MEM | MS_BPF_DW, 10, 0, -8, gen_imm(a));
    emit(g, MS_BPF_ALU64 | MS_BPF_MOV | MS_BPF_X, 2, 10, 0, 0);
    emit(g, MS_BPF_ALU64 | MS_BPF_ADD | MS_BPF_K, 2, 0, 0, -8);
    gen_lddw(g, 1, MS_BPF_PSEUDO_MAP_FD, (int32_t)(b % FUZZ_N_MAPS), 0);
    emit(g, MS_BPF_JMP | MS_BPF_CALL, 0, 0, 0, b & 0x80 ? MS_BPF_FN_MAP_UPDATE_ELEM : MS_BPF_FN_MAP_LOOKUP_ELEM);
    break;
  case 1: /* ring buffer reservation */
    gen_lddw(g, 1, MS_BPF_PSEUDO_MAP_FD, 2, 0);
    emit(g, MS_BPF_ALU64 | MS_BPF_MOV | MS_BPF_K, 2, 0, 0, 8 << (a & 3));
    emit(g, MS_BPF_ALU64 | MS_BPF_MOV | MS_BPF_K, 3, 0, 0, 0);
    emit(g, MS_BPF_JMP | MS_BPF_CALL, 0, 0, 0, MS_BPF_FN_RINGBUF_RESERVE);
    break;
  case 2: /* NULL check of r0 */
    emit(g, MS_BPF_JMP | MS_BPF_JNE | MS_BPF_K, 0, 0, 2, 0);
    emit(g, MS_BPF_ALU64 | MS_BPF_MOV | MS_BPF_K, 0, 0, 0, a & 7);
    emit(g, MS_BPF_JMP | MS_BPF_EXIT, 0, 0, 0, 0);
    break;
  case 3: /* release a record (or whatever the register holds) */
    emit(g, MS_BPF_ALU64 | MS_BPF_MOV | MS_BPF_X, 1, a % 10, 0, 0);
    emit(g, MS_BPF_ALU64 | MS_BPF_MOV | MS_BPF_K, 2, 0, 0, 0);
    emit(g, MS_BPF_JMP | MS_BPF_CALL, 0, 0, 0, b & 1 ? MS_BPF_FN_RINGBUF_DISCARD : MS_BPF_FN_RINGBUF_SUBMIT);
    break;
  case 4: /* global data */
    gen_lddw(g, a % 10, MS_BPF_PSEUDO_MAP_VALUE, b & 1 ? 1 : 3, (b >> 1) & 15);
    break;
  default: /* a helper with data: ringbuf_output of stack bytes */
    gen_lddw(g, 1, MS_BPF_PSEUDO_MAP_FD, 2, 0);
    emit(g, MS_BPF_ALU64 | MS_BPF_MOV | MS_BPF_X, 2, 10, 0, 0);
    emit(g, MS_BPF_ALU64 | MS_BPF_ADD | MS_BPF_K, 2, 0, 0, -8 * (1 + (a & 7)));
    emit(g, MS_BPF_ALU64 | MS_BPF_MOV | MS_BPF_K, 3, 0, 0, 1 + (b & 31));
    emit(g, MS_BPF_ALU64 | MS_BPF_MOV | MS_BPF_K, 4, 0, 0, 0);
    emit(g, MS_BPF_JMP | MS_BPF_CALL, 0, 0, 0, MS_BPF_FN_RINGBUF_OUTPUT);
    break;
  }
}

static void gen_one(struct gen *g, const uint8_t *b) {
  static const uint8_t sizes[4] = {MS_BPF_W, MS_BPF_H, MS_BPF_B, MS_BPF_DW};
  static const int32_t atomics[10] = {MS_BPF_ADD, MS_BPF_OR, MS_BPF_AND, MS_BPF_XOR, MS_BPF_ADD | MS_BPF_FETCH,
                                      MS_BPF_OR | MS_BPF_FETCH, MS_BPF_AND | MS_BPF_FETCH,
                                      MS_BPF_XOR | MS_BPF_FETCH, MS_BPF_XCHG, MS_BPF_CMPXCHG};
  static const int32_t helpers[6] = {1, 2, 5, 8, 130, MS_HELPER_LOG2};
  unsigned dst = (b[1] & 15) % 10, src = (b[1] >> 4) % 11, kind = b[0] % 16;
  uint8_t x = b[0] & 0x10 ? MS_BPF_X : MS_BPF_K;
  unsigned op = (b[0] >> 5) % 14;
  switch (kind) {
  case 0: case 1: case 2: case 3: { /* ALU, ALU64 */
    uint8_t cls = kind & 1 ? MS_BPF_ALU64 : MS_BPF_ALU;
    int16_t off = 0;
    if (op << 4 == MS_BPF_NEG) x = MS_BPF_K, src = 0;
    if (op << 4 == MS_BPF_END) {
      src = 0;
      if (cls == MS_BPF_ALU64) x = 0;
      emit(g, (uint8_t)(cls | MS_BPF_END | x), dst, 0, 0, 16 << (b[3] % 3));
      return;
    }
    if ((op << 4 == MS_BPF_DIV || op << 4 == MS_BPF_MOD) && b[2] & 1) off = 1;
    if (op << 4 == MS_BPF_MOV && x && b[2] & 1) off = (int16_t)(8 << (b[2] >> 1) % (cls == MS_BPF_ALU64 ? 3 : 2));
    emit(g, (uint8_t)(cls | op << 4 | x), dst, x ? src : 0, off, x || op << 4 == MS_BPF_NEG ? 0 : gen_imm(b[3]));
    return;
  }
  case 4: case 5: { /* conditional jumps, forward or back by a little */
    static const uint8_t conds[11] = {MS_BPF_JEQ, MS_BPF_JGT, MS_BPF_JGE, MS_BPF_JSET, MS_BPF_JNE, MS_BPF_JSGT,
                                      MS_BPF_JSGE, MS_BPF_JLT, MS_BPF_JLE, MS_BPF_JSLT, MS_BPF_JSLE};
    uint8_t cls = kind == 5 ? MS_BPF_JMP32 : MS_BPF_JMP;
    unsigned c = ((b[0] >> 5) | (b[1] & 0x80 ? 8u : 0u)) % 11;
    emit(g, (uint8_t)(cls | conds[c] | x), dst, x ? src : 0, (int16_t)((int8_t)b[2] % 12), x ? 0 : gen_imm(b[3]));
    return;
  }
  case 6: emit(g, (uint8_t)(MS_BPF_LDX | MS_BPF_MEM | sizes[b[3] & 3]), dst, gen_base(b[1] >> 4 | (b[3] & 0x80)),
               gen_off(b[2]), 0);
    return;
  case 7: emit(g, (uint8_t)(MS_BPF_ST | MS_BPF_MEM | sizes[b[3] & 3]), gen_base(b[1]), 0, gen_off(b[2]),
               gen_imm(b[3] >> 2));
    return;
  case 8: emit(g, (uint8_t)(MS_BPF_STX | MS_BPF_MEM | sizes[b[3] & 3]), gen_base(b[1]), src % 11, gen_off(b[2]), 0);
    return;
  case 9: emit(g, (uint8_t)(MS_BPF_STX | MS_BPF_ATOMIC | (b[3] & 1 ? MS_BPF_DW : MS_BPF_W)), gen_base(b[1]), src % 10,
               gen_off(b[2]), atomics[(b[3] >> 1) % 10]);
    return;
  case 10: emit(g, MS_BPF_JMP | MS_BPF_CALL, 0, 0, 0, helpers[b[3] % 6]); return;
  case 11: emit(g, MS_BPF_JMP | MS_BPF_EXIT, 0, 0, 0, 0); return;
  case 12: emit(g, MS_BPF_JMP | MS_BPF_JA, 0, 0, (int16_t)(int8_t)b[2] % 8, 0); return;
  case 13: gen_lddw(g, dst, 0, gen_imm(b[2]), gen_imm(b[3])); return;
  case 14: emit(g, (uint8_t)(MS_BPF_LDX | MS_BPF_MEMSX | sizes[b[3] % 3]), dst, src, gen_off(b[2]), 0); return;
  default: gen_idiom(g, b[2], b[3], b[1]); return;
  }
}

/* The subprogram local calls go to, appended after the entry function. */
static void gen_subprog(struct gen *g, uint8_t kind) {
  switch (kind & 3) {
  case 0: emit(g, MS_BPF_LDX | MS_BPF_MEM | MS_BPF_DW, 0, 1, 0, 0); break;
  case 1:
    emit(g, MS_BPF_ST | MS_BPF_MEM | MS_BPF_DW, 1, 0, 0, 7);
    emit(g, MS_BPF_ALU64 | MS_BPF_MOV | MS_BPF_K, 0, 0, 0, 0);
    break;
  case 2: emit(g, MS_BPF_ALU64 | MS_BPF_MOV | MS_BPF_X, 0, kind & 4 ? 10 : 1, 0, 0); break;
  default:
    emit(g, MS_BPF_ALU64 | MS_BPF_MOV | MS_BPF_X, 0, 1, 0, 0);
    emit(g, MS_BPF_ALU64 | MS_BPF_AND | MS_BPF_K, 0, 0, 0, 15);
    break;
  }
  emit(g, MS_BPF_JMP | MS_BPF_EXIT, 0, 0, 0, 0);
}

/* Jumps that would leave the entry function or land inside an lddw go to the
 * next instruction instead; local calls go to the subprogram at sub. */
static void gen_fix_jumps(struct gen *g, size_t sub) {
  uint8_t *second = calloc(g->n + 1, 1);
  if (!second) return;
  for (size_t i = 0; i + 1 < g->n; i++)
    if (g->out[i].code == (MS_BPF_LD | MS_BPF_IMM | MS_BPF_DW)) second[++i] = 1;
  for (size_t i = 0; i < g->n; i++) {
    struct ms_bpf_insn *in = &g->out[i];
    unsigned cls = MS_BPF_CLASS(in->code), op = MS_BPF_OP(in->code);
    if ((cls != MS_BPF_JMP && cls != MS_BPF_JMP32) || op == MS_BPF_EXIT || second[i] || i >= sub) continue;
    if (op == MS_BPF_CALL) {
      if (in->src_reg == MS_BPF_PSEUDO_CALL) in->imm = (int32_t)((int64_t)sub - (int64_t)i - 1);
      continue;
    }
    int64_t t = (int64_t)i + 1 + in->off;
    if (t < 0 || t >= (int64_t)sub || second[t]) in->off = 0;
  }
  free(second);
}

static void try_generated(const uint8_t *data, size_t size) {
  if (size < 5) return;
  size_t steps = (size - 1) / 4;
  struct gen g = {NULL, 0, steps * 8 + 16};
  if (steps > FUZZ_MAX_INSNS / 16 || !(g.out = calloc(g.cap, sizeof *g.out))) return;
  /* every register starts initialised: r6 keeps r1, r7 the frame pointer */
  emit(&g, MS_BPF_ALU64 | MS_BPF_MOV | MS_BPF_X, 6, 1, 0, 0);
  emit(&g, MS_BPF_ALU64 | MS_BPF_MOV | MS_BPF_X, 7, 10, 0, 0);
  for (unsigned r = 0; r < 10; r++)
    if (r != 1 && r != 6 && r != 7) emit(&g, MS_BPF_ALU64 | MS_BPF_MOV | MS_BPF_K, r, 0, 0, gen_imm((uint8_t)(data[0] + r)));
  for (size_t i = 0; i < steps; i++) gen_one(&g, data + 1 + 4 * i);
  emit(&g, MS_BPF_ALU64 | MS_BPF_MOV | MS_BPF_K, 0, 0, 0, 0);
  emit(&g, MS_BPF_JMP | MS_BPF_EXIT, 0, 0, 0, 0);
  size_t sub = g.n;
  gen_subprog(&g, data[0] >> 4);
  gen_fix_jumps(&g, sub);
  struct ms_bpf_prog_opts po = {.sz = sizeof po, .name = "gen", .maps = fuzz_maps, .n_maps = FUZZ_N_MAPS};
  struct ms_bpf_prog *p = ms_bpf_prog_new(g.out, g.n, &po);
  free(g.out);
  if (!p) return;
  int hook = data[0] % MS_HOOK_COUNT;
  if (verify(p, MS_VERIFY_HOOK, MS_PROG_OBSERVE, hook, 0) == 0)
    run_verified(p, data, size, 0, NULL, 0, "generated observe program");
  if (verify(p, MS_VERIFY_HOOK, MS_PROG_SCHED_HINT, MS_HOOK_TASK_READY, 0) == 0)
    run_verified(p, data, size, 0, NULL, 0, "generated sched_hint program");
  uint32_t mem_size = 8u * (data[0] & 15);
  if (verify(p, MS_VERIFY_RAW_MEM, 0, 0, mem_size) == 0) {
    uint64_t *mem = calloc(1, mem_size + 8);
    if (mem) run_verified(p, data, size, 1, mem_size ? mem : NULL, mem_size, "generated mem program");
    free(mem);
  }
  ms_bpf_prog_free(p);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  try_object(data, size);
  try_raw(data, size);
  try_generated(data, size);
  return 0;
}
