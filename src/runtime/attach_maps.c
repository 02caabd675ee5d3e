/* SPDX-License-Identifier: MIT */
/* The maps of an attachment's current generation, for in-process readers that
 * decode them themselves (megascope run --query, the query tests). The monitor
 * API has no call that lists a generation's maps, so this file reads the hook
 * table under its mutex, as src/control/mapfds.c does. */
#include <errno.h>

#include "hook/hook_impl.h"
#include "megascope/monitor.h"
#include "runtime/runtime_impl.h"

int ms_engine_attach_maps(struct ms_engine *e, int id, struct ms_bpf_map **out, int max) {
  struct ms_hook_table *t = e->hooks;
  int n = -ENOENT;
  ms_engine_attach_sync(e, id);
  pthread_mutex_lock(&t->mu);
  struct attachment *a = ms_hook_find(t, id);
  if (a && a->cur) {
    n = a->cur->n_maps < max ? a->cur->n_maps : max;
    for (int i = 0; i < n; i++) out[i] = a->cur->maps[i];
  }
  pthread_mutex_unlock(&t->mu);
  return n;
}
