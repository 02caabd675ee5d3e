/* SPDX-License-Identifier: MIT */
/* Read-only descriptors of an attachment's maps, for the "maps" command's
 * "fds": true. The maps live in memfds (megascope/bpf.h); each is reopened
 * through /proc/self/fd with O_RDONLY, so the receiver can map it PROT_READ
 * (ms_bpf_map_reader_new) and watch it live, and cannot write it (across
 * ranks, another rank's maps are rank 0's copies of them). They are
 * reopened inside ms_engine_attach_visit, under the lock of the engine's
 * attachments, so no reap closes a memfd in between. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "control/control_impl.h"
#include "megascope/attach.h"
#include "megascope/bpf.h"

struct map_fds {
  int *fds;
  char (*names)[64];
  int max;
};

static int reopen_maps(const struct ms_attach_view *v, void *arg) {
  struct map_fds *o = arg;
  int n = 0;
  for (int i = 0; i < v->n_maps && n < o->max; i++) {
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", ms_bpf_map_fd(v->maps[i]));
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      int rc = -errno;
      while (n) close(o->fds[--n]);
      return rc;
    }
    o->fds[n] = fd;
    snprintf(o->names[n], 64, "%s", ms_bpf_map_info(v->maps[i])->name);
    n++;
  }
  return n;
}

int ms_control_map_fds(struct ms_engine *e, int id, int *fds, char (*names)[64], int max) {
  struct map_fds o = {fds, names, max};
  return ms_engine_attach_visit(e, id, reopen_maps, &o);
}

int ms_control_map_fds_of_rank(struct ms_engine *e, int id, int rank, int *fds, char (*names)[64], int max) {
  struct map_fds o = {fds, names, max};
  return ms_engine_ranks_visit(e, id, rank, reopen_maps, &o);
}
