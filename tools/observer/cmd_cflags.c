/* SPDX-License-Identifier: MIT */
/* megascope cflags: the clang flags a monitor author compiles with, from any
 * directory:
 *   clang $(megascope cflags) -c my.bpf.c -o my.bpf.o
 * The include directory is the first of $MEGASCOPE_INCLUDE, <prefix>/include
 * next to the binary's bin/ (an installed tree), and this source tree's
 * include/ (a build directory anywhere), that holds megascope/bpf/megascope.h.
 * The architecture's include directory (/usr/include/<machine>-linux-gnu, for
 * <asm/types.h> under -target bpf) is added when it exists. */
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <unistd.h>

#include "cli.h"
#include "opt.h"

static int has_header(const char *dir) {
  char p[PATH_MAX + 64];
  struct stat st;
  if (snprintf(p, sizeof p, "%s/megascope/bpf/megascope.h", dir) >= (int)sizeof p) return 0;
  return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

/* The include directory, canonical, in out; -1 when none is found. */
static int find_include(char *out, size_t n) {
  char cand[3][PATH_MAX];
  int k = 0;
  const char *env = getenv("MEGASCOPE_INCLUDE");
  if (env && env[0] && snprintf(cand[k], sizeof cand[0], "%s", env) < (int)sizeof cand[0]) k++;
  char exe[PATH_MAX];
  ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (len > 0) {
    exe[len] = 0;
    if (snprintf(cand[k], sizeof cand[0], "%s/../include", dirname(exe)) < (int)sizeof cand[0]) k++;  /* <prefix>/bin */
  }
  char src[PATH_MAX];
  snprintf(src, sizeof src, "%s", __FILE__);  /* <source>/tools/observer/cmd_cflags.c */
  if (snprintf(cand[k], sizeof cand[0], "%s/../../include", dirname(src)) < (int)sizeof cand[0]) k++;
  for (int i = 0; i < k; i++) {
    char real[PATH_MAX];
    if (has_header(cand[i]) && realpath(cand[i], real)) {
      return snprintf(out, n, "%s", real) < (int)n ? 0 : -1;
    }
  }
  return -1;
}

static const struct cli_opt cflags_opts[] = {
    {.kind = CLI_FLAG, .name = "include-dir", .set = 1, .help = "print only megascope's include directory"},
    {0}};

int cmd_cflags(int argc, char **argv) {
  int include_only = 0;
  int prc = cli_parse("cflags",
                      "usage: megascope cflags [--include-dir]\n\n"
                      "Prints the clang flags that compile a monitor, from any directory:\n"
                      "  clang $(megascope cflags) -c my.bpf.c -o my.bpf.o\n"
                      "(-O2 -g -target bpf and the include directories: megascope's, for\n"
                      "<megascope/bpf/megascope.h>, and the architecture's, for <asm/types.h>).\n"
                      "$MEGASCOPE_INCLUDE overrides where the header is looked for.\n\n",
                      cflags_opts, &include_only, argc, argv, NULL);
  if (prc) return prc > 0 ? 0 : 2;
  char inc[PATH_MAX];
  if (find_include(inc, sizeof inc)) {
    fprintf(stderr, "megascope cflags: megascope/bpf/megascope.h not found (set MEGASCOPE_INCLUDE to the directory "
                    "that holds megascope/)\n");
    return 1;
  }
  if (include_only) {
    printf("%s\n", inc);
    return 0;
  }
  printf("-O2 -g -target bpf -I%s", inc);
  struct utsname u;
  char arch[PATH_MAX];
  struct stat st;
  if (!uname(&u)) {
    if (snprintf(arch, sizeof arch, "/usr/include/%s-linux-gnu", u.machine) < (int)sizeof arch && !stat(arch, &st) &&
        S_ISDIR(st.st_mode))
      printf(" -I%s", arch);
  }
  printf("\n");
  return 0;
}
