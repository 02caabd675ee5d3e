/* SPDX-License-Identifier: MIT */
/* Read-only descriptors of an attachment's maps, for the "maps" command's
 * "fds": true. The maps live in memfds (megascope/bpf.h); each is reopened
 * through /proc/self/fd with O_RDONLY, so the receiver can map it PROT_READ
 * (ms_bpf_map_reader_new) and watch it live, and cannot write it. The monitor
 * API has no call that lists a generation's maps, so this file reads the hook
 * table under its mutex, as src/runtime/monitor_api.c does. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "control/control_impl.h"
#include "runtime/runtime_impl.h"

int ms_control_map_fds(struct ms_engine *e, int id, int *fds, char (*names)[64], int max) {
  struct ms_hook_table *t = e->hooks;
  int n = 0, rc = 0;
  ms_engine_attach_sync(e, id);  /* the device's copies first (CUDA backend) */
  pthread_mutex_lock(&t->mu);
  struct attachment *a = ms_hook_find(t, id);
  if (!a) rc = -ENOENT;
  for (int i = 0; a && i < a->cur->n_maps && n < max; i++) {
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", ms_bpf_map_fd(a->cur->maps[i]));
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      rc = -errno;
      break;
    }
    fds[n] = fd;
    snprintf(names[n], 64, "%s", ms_bpf_map_info(a->cur->maps[i])->name);
    n++;
  }
  pthread_mutex_unlock(&t->mu);
  if (rc) {
    while (n) close(fds[--n]);
    return rc;
  }
  return n;
}
