/* SPDX-License-Identifier: MIT */
/* Seeds for fuzz_bpf: every program of the conformance suite as raw
 * instructions followed by two bytes (hook task_end; the RAW_MEM size = the
 * file's -- mem length), the form fuzz_bpf's raw path reads.
 * Included by tests/test_bpf_fuzz_corpus.c (seeds_foreach); built alone with
 * -DMS_FUZZ_SEEDS_MAIN by scripts/fuzz.sh: `make_seeds DIR OUT` writes one
 * file per .data file of DIR into OUT. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "megascope/bpf.h"
#include "megascope/bpf/megascope.h"

typedef void (*seed_fn)(void *user, const char *name, const uint8_t *data, size_t size);

static char *seeds_slurp(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *buf = n >= 0 ? malloc((size_t)n + 1) : NULL;
  *len = buf ? fread(buf, 1, (size_t)n, f) : 0;
  if (buf) buf[*len] = 0;
  fclose(f);
  return buf;
}

/* The number of bytes in the file's -- mem section. */
static size_t seeds_mem_len(const char *text) {
  const char *m = strstr(text, "-- mem");
  size_t n = 0;
  for (const char *p = m ? strchr(m, '\n') : NULL; p && *p;) {
    while (*p == ' ' || *p == '\n' || *p == '\t' || *p == '\r') p++;
    if (!*p || !strncmp(p, "--", 2)) break;
    if (*p == '#') {
      p = strchr(p, '\n');
      continue;
    }
    char *end;
    strtoul(p, &end, 16);
    if (end == p) break;
    n++;
    p = end;
  }
  return n;
}

static int seeds_is_data(const struct dirent *d) {
  size_t n = strlen(d->d_name);
  return n > 5 && !strcmp(d->d_name + n - 5, ".data");
}

/* Calls fn for each conformance program of dir; returns how many, or -1. */
static int seeds_foreach(const char *dir, seed_fn fn, void *user) {
  struct dirent **names;
  int n = scandir(dir, &names, seeds_is_data, alphasort), count = 0;
  if (n < 0) return -1;
  for (int i = 0; i < n; i++) {
    char path[4400];
    size_t len;
    snprintf(path, sizeof path, "%s/%s", dir, names[i]->d_name);
    char *text = seeds_slurp(path, &len);
    struct ms_bpf_testfile *t = text ? ms_bpf_testfile_parse(text, len, NULL) : NULL;
    struct ms_bpf_insn *insns = NULL;
    size_t k = 0;
    if (t && ms_bpf_testfile_asm(t) && !ms_bpf_asm(ms_bpf_testfile_asm(t), &insns, &k, NULL)) {
      uint8_t *buf = malloc(k * 8 + 2);
      if (buf) {
        memcpy(buf, insns, k * 8);
        buf[k * 8] = MS_HOOK_TASK_END;
        buf[k * 8 + 1] = (uint8_t)seeds_mem_len(text);
        fn(user, names[i]->d_name, buf, k * 8 + 2);
        count++;
      }
      free(buf);
    }
    free(insns);
    ms_bpf_testfile_free(t);
    free(text);
    free(names[i]);
  }
  free(names);
  return count;
}

#ifdef MS_FUZZ_SEEDS_MAIN
static void write_seed(void *user, const char *name, const uint8_t *data, size_t size) {
  char path[4400];
  snprintf(path, sizeof path, "%s/conf-%s.raw", (const char *)user, name);
  FILE *f = fopen(path, "wb");
  if (!f || fwrite(data, 1, size, f) != size) fprintf(stderr, "make_seeds: cannot write %s\n", path);
  if (f) fclose(f);
}

int main(int argc, char **argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: make_seeds CONFORMANCE_DIR OUT_DIR\n");
    return 2;
  }
  int n = seeds_foreach(argv[1], write_seed, argv[2]);
  if (n < 0) {
    fprintf(stderr, "make_seeds: cannot read %s\n", argv[1]);
    return 1;
  }
  printf("%d conformance seeds\n", n);
  return 0;
}
#endif
