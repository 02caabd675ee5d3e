/* SPDX-License-Identifier: MIT */
/* The fuzz target (tests/fuzz/fuzz_bpf.c) as a regression test, without
 * libFuzzer: its entry point replays the seed corpus — the conformance
 * programs as raw instructions, the monitors of tests/data and monitors/
 * compiled by clang (when it exists) with deterministic truncations and bit
 * flips of each, and the inputs kept in tests/fuzz/corpus/ (what fuzzing
 * found). A verified program that fails at run time, or that the JIT runs
 * to another result than the interpreter, aborts the target, and so this
 * test. */
#include <sys/utsname.h>
#include <unistd.h>

#include "fuzz/fuzz_bpf.c"
#include "fuzz/seeds.c"
#include "test.h"

static int replayed;

static void replay(void *user, const char *name, const uint8_t *data, size_t size) {
  LLVMFuzzerTestOneInput(data, size);
  replayed++;
}

static const char *src_root(void) {
  static char root[1024];
  const char *here = __FILE__, *slash = strrchr(here, '/');
  snprintf(root, sizeof root, "%.*s/..", slash ? (int)(slash - here) : 1, slash ? here : ".");
  return root;
}

static uint64_t rng = 0x2545f4914f6cdd1dull;
static uint64_t next_rand(void) {
  rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
  return rng;
}

/* An object and 64 damaged copies of it. */
static void replay_object(const uint8_t *obj, size_t size) {
  replay(NULL, "object", obj, size);
  uint8_t *copy = malloc(size);
  for (int i = 0; copy && i < 64; i++) {
    memcpy(copy, obj, size);
    size_t n = size;
    if (i % 4 == 0) n = next_rand() % size;
    for (int k = 0; k < 1 + i % 8; k++) copy[next_rand() % size] ^= (uint8_t)(1u << (next_rand() % 8));
    replay(NULL, "mutant", copy, n);
  }
  free(copy);
}

static int is_src(const struct dirent *d) {
  size_t n = strlen(d->d_name);
  return n > 6 && !strcmp(d->d_name + n - 6, ".bpf.c");
}

static void replay_sources(const char *dir, const char *tmp) {
  struct dirent **names;
  struct utsname u;
  uname(&u);
  int n = scandir(dir, &names, is_src, alphasort);
  for (int i = 0; i < n; i++) {
    char cmd[16384], obj[4400];
    snprintf(obj, sizeof obj, "%s/%s.o", tmp, names[i]->d_name);
    snprintf(cmd, sizeof cmd, "clang -O2 -g -target bpf -I'%s/include' -I'%s/tests/data/bpf' "
             "-I/usr/include/%s-linux-gnu -c '%s/%s' -o '%s' 2>/dev/null", src_root(), src_root(), u.machine, dir,
             names[i]->d_name, obj);
    size_t len;
    char *bytes = system(cmd) == 0 ? seeds_slurp(obj, &len) : NULL;
    if (bytes) replay_object((const uint8_t *)bytes, len);
    free(bytes);
    free(names[i]);
  }
  if (n > 0) free(names);
}

static int is_file(const struct dirent *d) { return d->d_name[0] != '.'; }

static void replay_kept(const char *dir) {
  struct dirent **names;
  int n = scandir(dir, &names, is_file, alphasort);
  for (int i = 0; i < n; i++) {
    char path[4400];
    size_t len;
    snprintf(path, sizeof path, "%s/%s", dir, names[i]->d_name);
    char *bytes = seeds_slurp(path, &len);
    if (bytes) replay(NULL, names[i]->d_name, (const uint8_t *)bytes, len);
    free(bytes);
    free(names[i]);
  }
  if (n > 0) free(names);
}

int main(void) {
  const char *shared = getenv("MS_SHARED");
  char dir[2048], tmp[] = "/tmp/ms-fuzz-corpus-XXXXXX";
  snprintf(dir, sizeof dir, "%s/third_party/bpf_conformance/tests", shared ? shared : "../shared");
  int conf = seeds_foreach(dir, replay, NULL);
  printf("conformance seeds: %d\n", conf < 0 ? 0 : conf);
  if (system("clang --version >/dev/null 2>&1") == 0 && mkdtemp(tmp)) {
    const char *subdirs[] = {"tests/data/verifier", "tests/data/bpf", "monitors"};
    for (size_t i = 0; i < 3; i++) {
      snprintf(dir, sizeof dir, "%s/%s", src_root(), subdirs[i]);
      replay_sources(dir, tmp);
    }
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmp);
  } else {
    SKIP_PART("clang not found: the compiled seeds not replayed");
  }
  snprintf(dir, sizeof dir, "%s/tests/fuzz/corpus", src_root());
  replay_kept(dir);
  printf("%d inputs replayed through the fuzz target: %lu verified programs run, %lu of them also by the JIT "
         "and compared\n", replayed, fuzz_runs, fuzz_jit_runs);
  CHECK(replayed > 0);
  CHECK(fuzz_runs > 0);
  /* the JIT compiles what verifies; a few constructs may be left to the interpreter */
  if (ms_bpf_jit_supported()) CHECKF(fuzz_jit_runs * 10 >= fuzz_runs * 9, "%lu of %lu", fuzz_jit_runs, fuzz_runs);
  ms_bpf_helpers_free(fuzz_helpers);
  for (int s = 0; s < 2; s++)
    for (size_t i = 0; i < FUZZ_N_MAPS; i++) ms_bpf_map_free(fuzz_fixed_sets[s][i]);
  TEST_MAIN_END();
}
