/* SPDX-License-Identifier: MIT */
/* The ELF loader on objects clang compiles at run time from tests/data/bpf/
 * (exit 77 when clang is missing): maps, programs, relocations, linked
 * subprograms, global data, a run of the loaded programs in the interpreter;
 * loading with no kernel BPF (bpf() blocked by seccomp, privileges dropped);
 * refusals that name what and where; and truncated and bit-flipped copies of
 * a real object, which must be refused or loaded — never crash — and whose
 * loaded programs must run safely. */
#include <elf.h>
#include <errno.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "megascope/bpf.h"
#include "test.h"

static char logbuf[4096];
static struct ms_textbuf tlog;
static char tmpdir[] = "/tmp/ms-bpf-loader-XXXXXX";

static void log_reset(void) {
  logbuf[0] = 0;
  tlog = (struct ms_textbuf){logbuf, sizeof logbuf, 0, 0};
}

/* Compiles tests/data/bpf/<name>.bpf.c; returns the object's bytes. */
static uint8_t *compile(const char *name, size_t *len) {
  char src[1024], obj[1024], cmd[3072];
  const char *here = __FILE__, *slash = strrchr(here, '/');
  snprintf(src, sizeof src, "%.*s/data/bpf/%s.bpf.c", slash ? (int)(slash - here) : 1, slash ? here : ".", name);
  snprintf(obj, sizeof obj, "%s/%s.o", tmpdir, name);
  snprintf(cmd, sizeof cmd, "clang -O2 -g -target bpf -c '%s' -o '%s'", src, obj);
  if (system(cmd) != 0) {
    fprintf(stderr, "failed: %s\n", cmd);
    return NULL;
  }
  return (uint8_t *)ms_test_slurp(obj, len);
}

static struct ms_bpf_object *open_buf(const void *buf, size_t len) {
  log_reset();
  return ms_bpf_object_open_mem(buf, len, "loader_test", &tlog);
}

/* ---- the good object ---------------------------------------------------- */

struct task_ctx {
  uint64_t duration_ns;
  uint32_t worker;
  uint32_t task_class;
};

static int find_map(const struct ms_bpf_object *o, const char *name) {
  for (size_t i = 0; i < ms_bpf_object_map_count(o); i++)
    if (strstr(ms_bpf_object_map(o, i)->name, name)) return (int)i;
  return -1;
}

static void test_contents(const struct ms_bpf_object *o) {
  CHECK(!strcmp(ms_bpf_object_license(o), "Dual MIT/GPL"));
  CHECK(ms_bpf_object_map_count(o) == 6 && ms_bpf_object_prog_count(o) == 2);
  const struct ms_bpf_map_def *hist = ms_bpf_object_map(o, (size_t)find_map(o, "hist"));
  CHECK(hist->type == MS_BPF_MAP_ARRAY && hist->key_size == 4 && hist->value_size == 8 && hist->max_entries == 64);
  const struct ms_bpf_map_def *pc = ms_bpf_object_map(o, (size_t)find_map(o, "per_class"));
  CHECK(pc->type == MS_BPF_MAP_HASH && pc->max_entries == 128);
  CHECK(ms_bpf_object_map(o, (size_t)find_map(o, "runs"))->type == MS_BPF_MAP_PERCPU_ARRAY);
  CHECK(ms_bpf_object_map(o, (size_t)find_map(o, "slow"))->type == MS_BPF_MAP_RINGBUF);
  int ro = find_map(o, ".rodata");
  CHECK(ro >= 0 && ms_bpf_object_map(o, (size_t)ro)->flags & MS_BPF_MAP_F_RDONLY_PROG);
  size_t size = 0;
  const uint64_t *init = ro >= 0 ? ms_bpf_object_map_init(o, (size_t)ro, &size) : NULL;
  CHECK(init && size == 8 && *init == 1000); /* slow_ns */
  const uint32_t *abi = ms_bpf_object_section(o, "megascope_abi", &size);
  CHECK(abi && size == 4 && *abi == 1);
  CHECK(ms_bpf_object_section(o, "no_such_section", &size) == NULL);

  const struct ms_bpf_prog *end = ms_bpf_object_find_prog(o, "megascope/observe/task_end");
  const struct ms_bpf_prog *hint = ms_bpf_object_find_prog(o, "megascope/sched_hint/task_ready");
  CHECK(end && hint && !strcmp(ms_bpf_prog_name(end), "on_task_end") && ms_bpf_prog_map_count(end) == 6);
  size_t n;
  const struct ms_bpf_insn *insns = ms_bpf_prog_insns(end, &n);
  int map_refs = 0, value_refs = 0, local_calls = 0;
  for (size_t i = 0; i < n; i++) {
    if (insns[i].code == (MS_BPF_LD | MS_BPF_IMM | MS_BPF_DW)) {
      map_refs += insns[i].src_reg == MS_BPF_PSEUDO_MAP_FD;
      value_refs += insns[i].src_reg == MS_BPF_PSEUDO_MAP_VALUE;
      if (insns[i].src_reg == MS_BPF_PSEUDO_MAP_VALUE) CHECK(insns[i].imm == ro || insns[i].imm == find_map(o, ".bss"));
      i++;
    }
    local_calls += insns[i].code == (MS_BPF_JMP | MS_BPF_CALL) && insns[i].src_reg == MS_BPF_PSEUDO_CALL;
  }
  CHECKF(map_refs == 5 && value_refs == 2 && local_calls == 2, "%d map refs, %d value refs, %d local calls",
         map_refs, value_refs, local_calls);
}

struct bound {
  struct ms_bpf_map *maps[MS_BPF_MAX_MAPS];
  size_t n;
};

/* Creates a map for each definition, with global data's initial bytes. */
static int bind_maps(const struct ms_bpf_object *o, struct bound *b, uint32_t workers) {
  b->n = ms_bpf_object_map_count(o);
  for (size_t i = 0; i < b->n; i++) {
    b->maps[i] = ms_bpf_map_new(ms_bpf_object_map(o, i), workers, NULL);
    if (!b->maps[i]) return -1;
    size_t size;
    const void *init = ms_bpf_object_map_init(o, i, &size);
    uint32_t zero = 0;
    if (init) ms_bpf_map_update(b->maps[i], &zero, init, MS_BPF_ANY, 0);
  }
  return 0;
}

static void unbind(struct bound *b) {
  for (size_t i = 0; i < b->n; i++) ms_bpf_map_free(b->maps[i]);
  b->n = 0;
}

static int count_records(void *user, const void *data, uint32_t size) {
  (*(int *)user)++;
  return size == 8 ? 0 : -1;
}

static void test_run(const struct ms_bpf_object *o) {
  struct bound b = {0};
  CHECK(bind_maps(o, &b, 2) == 0);
  struct ms_bpf_helpers *h = ms_bpf_helpers_new();
  ms_bpf_helpers_add_std(h);
  struct task_ctx ctx = {0};
  struct ms_bpf_env env = {.worker = 1};
  log_reset();
  struct ms_bpf_run_opts ro = {.sz = sizeof ro, .helpers = h, .maps = b.maps, .n_maps = b.n, .ctx = &ctx,
                               .ctx_size = sizeof ctx, .env = &env, .log = &tlog};
  struct ms_bpf_run_result res;
  const struct ms_bpf_prog *end = ms_bpf_object_find_prog(o, "megascope/observe/task_end");
  const uint64_t durations[] = {1, 2, 3, 500, 1024, 1025, 5000, 1u << 20};
  for (size_t i = 0; i < sizeof durations / sizeof durations[0]; i++) {
    ctx.duration_ns = durations[i];
    ctx.task_class = (uint32_t)(i % 3);
    CHECKF(ms_bpf_run(end, &ro, &res) == 0 && res.r0 == 0, "%s", logbuf);
  }
  uint32_t k = 10; /* log2(1024) = log2(1025) = 10 */
  CHECK(*(uint64_t *)ms_bpf_map_lookup(b.maps[find_map(o, "hist")], &k, 0) == 2);
  k = 0;
  CHECK(*(uint64_t *)ms_bpf_map_lookup(b.maps[find_map(o, "runs")], &k, 1) == 8);
  CHECK(*(uint64_t *)ms_bpf_map_lookup(b.maps[find_map(o, ".bss")], &k, 0) == 8);
  k = 1; /* class 1: durations 2, 1024, 1 << 20 */
  CHECK(*(uint64_t *)ms_bpf_map_lookup(b.maps[find_map(o, "per_class")], &k, 0) == 2 + 1024 + (1u << 20));
  int slow = 0; /* durations above slow_ns (1000): 1024, 1025, 5000, 1 << 20 */
  CHECK(ms_bpf_ringbuf_consume(b.maps[find_map(o, "slow")], count_records, &slow) == 4 && slow == 4);
  const struct ms_bpf_prog *hint = ms_bpf_object_find_prog(o, "megascope/sched_hint/task_ready");
  ctx.duration_ns = 1u << 13;
  CHECK(ms_bpf_run(hint, &ro, &res) == 0 && res.r0 == (13 & 7));
  ms_bpf_helpers_free(h);
  unbind(&b);
}

static void test_ringbuf_records(const struct ms_bpf_object *o) {
  struct bound b = {0};
  bind_maps(o, &b, 1);
  struct ms_bpf_helpers *h = ms_bpf_helpers_new();
  ms_bpf_helpers_add_std(h);
  struct task_ctx ctx = {.duration_ns = 999};
  struct ms_bpf_run_opts ro = {.sz = sizeof ro, .helpers = h, .maps = b.maps, .n_maps = b.n, .ctx = &ctx, .ctx_size = sizeof ctx};
  struct ms_bpf_run_result res;
  const struct ms_bpf_prog *end = ms_bpf_object_find_prog(o, "megascope/observe/task_end");
  ms_bpf_run(end, &ro, &res);
  ctx.duration_ns = 1001; /* above slow_ns (.rodata) */
  ms_bpf_run(end, &ro, &res);
  ms_bpf_run(end, &ro, &res);
  int n = 0;
  CHECK(ms_bpf_ringbuf_consume(b.maps[find_map(o, "slow")], count_records, &n) == 2 && n == 2);
  ms_bpf_helpers_free(h);
  unbind(&b);
}

/* ---- no kernel BPF needed ----------------------------------------------- */

/* In a child: drop root if we are root, make bpf() fail, then load. */
static void test_no_kernel(const uint8_t *obj, size_t len) {
  fflush(NULL);
  pid_t pid = fork();
  if (pid == 0) {
    if (geteuid() == 0 && (setgid(65534) || setuid(65534))) _exit(10);
    struct sock_filter f[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_bpf, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | ENOSYS),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_fprog prog = {sizeof f / sizeof f[0], f};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) || prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog)) _exit(11);
    if (syscall(__NR_bpf, 0, NULL, 0) != -1 || errno != ENOSYS) _exit(12); /* the filter works */
    struct ms_bpf_object *o = ms_bpf_object_open_mem(obj, len, "loader_test", NULL);
    int ok = o && ms_bpf_object_prog_count(o) == 2;
    ms_bpf_object_free(o);
    _exit(ok ? 0 : 13);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  CHECKF(WIFEXITED(status) && WEXITSTATUS(status) == 0, "unprivileged, no-bpf() load: status 0x%x", status);
}

/* ---- refusals that point ------------------------------------------------ */

static Elf64_Shdr *shdr(uint8_t *obj, size_t i) {
  Elf64_Ehdr *eh = (Elf64_Ehdr *)obj;
  return (Elf64_Shdr *)(obj + eh->e_shoff) + i;
}

static size_t find_section(uint8_t *obj, const char *name) {
  Elf64_Ehdr *eh = (Elf64_Ehdr *)obj;
  const char *names = (const char *)obj + shdr(obj, eh->e_shstrndx)->sh_offset;
  for (size_t i = 1; i < eh->e_shnum; i++)
    if (!strcmp(names + shdr(obj, i)->sh_name, name)) return i;
  return 0;
}

static int refused(const uint8_t *obj, size_t len, const char *want) {
  struct ms_bpf_object *o = open_buf(obj, len);
  ms_bpf_object_free(o);
  if (o || !strstr(logbuf, want)) fprintf(stderr, "want refusal '%s', got %s: %s\n", want, o ? "an object" : "", logbuf);
  return !o && strstr(logbuf, want);
}

static void test_refusals(const uint8_t *good, size_t len) {
  uint8_t *obj = malloc(len);
  CHECK(refused((const uint8_t *)"\x7f" "ELF garbage", 11, "not an ELF"));
  CHECK(refused((const uint8_t *)"", 0, "not an ELF"));

  memcpy(obj, good, len);
  ((Elf64_Ehdr *)obj)->e_machine = EM_X86_64;
  CHECK(refused(obj, len, "machine 62 is not BPF"));

  memcpy(obj, good, len);
  size_t text = find_section(obj, ".text");
  shdr(obj, text)->sh_offset = len + 4096;
  CHECK(refused(obj, len, "section 2 (.text): offset"));

  memcpy(obj, good, len);
  size_t rel = find_section(obj, ".relmegascope/observe/task_end");
  Elf64_Rel *r = (Elf64_Rel *)(obj + shdr(obj, rel)->sh_offset);
  r[0].r_offset = 0x100000;
  CHECK(refused(obj, len, "relocation 0 at offset 0x100000 is outside"));

  memcpy(obj, good, len);
  r = (Elf64_Rel *)(obj + shdr(obj, rel)->sh_offset);
  r[1].r_info = ELF64_R_INFO(9999, ELF64_R_TYPE(r[1].r_info));
  CHECK(refused(obj, len, "relocation 1 names symbol 9999, out of range"));

  memcpy(obj, good, len);
  r = (Elf64_Rel *)(obj + shdr(obj, rel)->sh_offset);
  r[0].r_offset = 8; /* onto an instruction that is neither lddw nor call */
  /* libbpf notices this one first ("insns[1]"); either way the instruction is named */
  CHECK(refused(obj, len, "insns[1]") || refused(obj, len, "task_end insn 1: relocation against"));

  memcpy(obj, good, len);
  shdr(obj, find_section(obj, ".symtab"))->sh_entsize = 7;
  CHECK(refused(obj, len, "symbol table"));
  free(obj);

  size_t blen;
  uint8_t *bad = compile("bad_map_type", &blen);
  CHECK(bad && refused(bad, blen, "map 'lru': type 9 is not supported"));
  free(bad);
  bad = compile("extern_kconfig", &blen);
  CHECK(bad && refused(bad, blen, ".kconfig"));
  free(bad);
}

/* ---- truncated and bit-flipped copies ----------------------------------- */

static uint64_t rng = 0x2545f4914f6cdd1dull;
static uint64_t next_rand(void) {
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return rng;
}

/* Runs every program of an object that loaded, with its maps, on a budget. */
static int run_all(const struct ms_bpf_object *o, const struct ms_bpf_helpers *h) {
  struct bound b = {0};
  int runs = 0;
  if (bind_maps(o, &b, 2) == 0) {
    struct task_ctx ctx = {.duration_ns = 4096, .task_class = 1};
    struct ms_bpf_run_opts ro = {.sz = sizeof ro, .helpers = h, .maps = b.maps, .n_maps = b.n, .ctx = &ctx,
                                 .ctx_size = sizeof ctx, .insn_budget = 20000};
    for (size_t i = 0; i < ms_bpf_object_prog_count(o); i++) {
      struct ms_bpf_run_result res;
      ms_bpf_run(ms_bpf_object_prog(o, i), &ro, &res);
      runs++;
    }
  }
  unbind(&b);
  return runs;
}

static void test_hostile_copies(const uint8_t *good, size_t len) {
  uint8_t *obj = malloc(len);
  int truncated_ok = 1;
  for (size_t cut = 0; cut < len; cut += cut < 128 ? 1 : 61) {
    struct ms_bpf_object *o = open_buf(good, cut);
    truncated_ok &= !o && logbuf[0];
    ms_bpf_object_free(o);
  }
  CHECK(truncated_ok);
  struct ms_bpf_helpers *h = ms_bpf_helpers_new();
  ms_bpf_helpers_add_std(h);
  int loaded = 0, refused_n = 0, silent = 0, runs = 0;
  for (int iter = 0; iter < 3000; iter++) {
    memcpy(obj, good, len);
    int flips = 1 + (int)(next_rand() % 4);
    for (int f = 0; f < flips; f++) {
      /* half the flips land in the ELF header, section headers or code */
      size_t at = next_rand() % 2 ? next_rand() % len : (next_rand() % 2 ? next_rand() % 64 : len - 1 - next_rand() % 2200 % len);
      obj[at] ^= (uint8_t)(1u << (next_rand() % 8));
    }
    struct ms_bpf_object *o = open_buf(obj, len);
    if (o) {
      loaded++;
      runs += run_all(o, h);
    } else {
      refused_n++;
      silent += logbuf[0] == 0;
    }
    ms_bpf_object_free(o);
  }
  CHECKF(silent == 0, "%d refusals without a message", silent);
  CHECKF(loaded > 0 && refused_n > 0, "%d loaded, %d refused", loaded, refused_n);
  fprintf(stderr, "bit flips: %d loaded (%d program runs), %d refused\n", loaded, runs, refused_n);
  ms_bpf_helpers_free(h);
  free(obj);
}

int main(void) {
  if (system("command -v clang >/dev/null 2>&1") != 0) {
    printf("clang not found: skipped\n");
    return 77;
  }
  if (!mkdtemp(tmpdir)) return 1;
  size_t len;
  uint8_t *obj = compile("loader_test", &len);
  CHECK(obj != NULL);
  if (obj) {
    struct ms_bpf_object *o = open_buf(obj, len);
    CHECKF(o != NULL, "%s", logbuf);
    if (o) {
      test_contents(o);
      test_run(o);
      test_ringbuf_records(o);
    }
    ms_bpf_object_free(o);
    test_no_kernel(obj, len);
    test_refusals(obj, len);
    test_hostile_copies(obj, len);
  }
  free(obj);
  char cmd[256];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
  TEST_MAIN_END();
}
