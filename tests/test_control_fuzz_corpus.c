/* SPDX-License-Identifier: MIT */
/* The control fuzz target (tests/fuzz/fuzz_control.c) as a regression test,
 * without libFuzzer: its entry point replays tests/fuzz/control/ (requests,
 * including what fuzzing found), deterministic byte mutations of each, and
 * attach and replace requests carrying every shipped monitor and damaged
 * copies of it (bit flips, truncations), so that the loader's and the
 * verifier's messages travel through the reply path. A reply that is not a
 * well-formed JSON object aborts the target, and so this test. */
#include <dirent.h>

#include "control/control_impl.h"
#include "fuzz/fuzz_control.c"
#include "test.h"

static int replayed;
static uint64_t rng = 0x2545f4914f6cdd1dull;
static uint64_t next_rand(void) {
  rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
  return rng;
}

static void replay(const void *data, size_t size) {
  LLVMFuzzerTestOneInput(data, size);
  replayed++;
}

static uint8_t *slurp(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  uint8_t *buf = malloc(1 << 20);
  *n = buf ? fread(buf, 1, 1 << 20, f) : 0;
  fclose(f);
  return buf;
}

/* A request and 16 mutants (flipped, inserted, cut bytes). */
static void replay_request(const uint8_t *req, size_t n) {
  replay(req, n);
  uint8_t *copy = malloc(n + 16);
  for (int i = 0; copy && i < 16 && n; i++) {
    memcpy(copy, req, n);
    size_t m = n;
    for (int k = 0; k < 1 + i % 4; k++) {
      size_t at = next_rand() % m;
      if (k % 3 == 2 && m > 1) m = at ? at : 1;
      else copy[at] = (uint8_t)next_rand();
    }
    replay(copy, m);
  }
  free(copy);
}

static void replay_object(const char *cmd, const uint8_t *obj, size_t size) {
  char *b64 = malloc(ms_base64_encoded_len(size) + 1), *req = malloc(ms_base64_encoded_len(size) + 128);
  uint8_t *copy = malloc(size);
  for (int i = 0; b64 && req && copy && i < 24; i++) {
    memcpy(copy, obj, size);
    size_t n = size;
    if (i > 0 && i % 3 == 0) n = next_rand() % size;
    for (int k = 0; i > 0 && k < i % 5; k++) copy[next_rand() % size] ^= (uint8_t)(1u << (next_rand() % 8));
    ms_base64_encode(copy, n, b64);
    int len = sprintf(req, "{\"cmd\":\"%s\",%s\"name\":\"m%d\",\"object\":\"%s\"}", cmd,
                      strcmp(cmd, "replace") ? "" : "\"id\":1,", i, b64);
    replay(req, (size_t)len);
  }
  free(b64);
  free(req);
  free(copy);
}

static const char *src_root(void) {
  const char *env = getenv("MS_SRC");
  static char root[1024];
  if (env) return env;
  const char *here = __FILE__, *slash = strrchr(here, '/');
  snprintf(root, sizeof root, "%.*s/..", slash ? (int)(slash - here) : 1, slash ? here : ".");
  return root;
}

int main(void) {
  char dir[1200];
  snprintf(dir, sizeof dir, "%s/tests/fuzz/control", src_root());
  struct dirent **names;
  int n = scandir(dir, &names, NULL, alphasort), files = 0;
  for (int i = 0; i < n; i++) {
    if (names[i]->d_name[0] != '.') {
      char path[2400];
      size_t size;
      snprintf(path, sizeof path, "%s/%s", dir, names[i]->d_name);
      uint8_t *buf = slurp(path, &size);
      if (buf) replay_request(buf, size), files++;
      free(buf);
    }
    free(names[i]);
  }
  if (n > 0) free(names);
  CHECKF(files >= 10, "%d corpus files in %s", files, dir);

  const char *mons = getenv("MS_MONITORS");
  int objects = 0;
  DIR *d = mons ? opendir(mons) : NULL;
  for (struct dirent *de; d && (de = readdir(d));) {
    size_t len = strlen(de->d_name), size;
    if (len < 6 || strcmp(de->d_name + len - 6, ".bpf.o")) continue;
    char path[2400];
    snprintf(path, sizeof path, "%s/%s", mons, de->d_name);
    uint8_t *obj = slurp(path, &size);
    if (obj && size) {
      replay_object("attach", obj, size);
      replay_object("replace", obj, size);
      objects++;
    }
    free(obj);
  }
  if (d) closedir(d);
  if (!objects) SKIP_PART("no shipped monitors (MS_MONITORS): the attach and replace requests not replayed");
  printf("replayed %d requests (%d corpus files, %d monitors)\n", replayed, files, objects);
  CHECK(replayed > 100);
  TEST_MAIN_END();
}
