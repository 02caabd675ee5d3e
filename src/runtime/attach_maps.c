/* SPDX-License-Identifier: MIT */
/* The maps of an attachment's current generation, for readers that decode or
 * reopen them themselves (megascope run --query, the query tests, the control
 * server's "maps" and "records" descriptors): the hook table is read under its
 * mutex here alone, and readers above the runtime go through
 * ms_engine_attach_visit. */
#include <errno.h>

#include "hook/hook_impl.h"
#include "megascope/attach.h"
#include "runtime/runtime_impl.h"

int ms_engine_attach_visit(struct ms_engine *e, int id, int (*fn)(const struct ms_attach_view *v, void *arg),
                           void *arg) {
  struct ms_hook_table *t = e->hooks;
  int rc = -ENOENT;
  ms_engine_attach_sync(e, id);  /* the device's copies first (CUDA backend) */
  pthread_mutex_lock(&t->mu);
  struct attachment *a = ms_hook_find(t, id);
  if (a && a->cur) {
    struct ms_attach_view v = {a->cur->generation, a->cur->mon, a->cur->maps, a->cur->n_maps};
    rc = fn(&v, arg);
  }
  pthread_mutex_unlock(&t->mu);
  return rc;
}

struct maps_out {
  struct ms_bpf_map **out;
  int max;
};

static int copy_maps(const struct ms_attach_view *v, void *arg) {
  struct maps_out *o = arg;
  int n = v->n_maps < o->max ? v->n_maps : o->max;
  for (int i = 0; i < n; i++) o->out[i] = v->maps[i];
  return n;
}

int ms_engine_attach_maps(struct ms_engine *e, int id, struct ms_bpf_map **out, int max) {
  struct maps_out o = {out, max};
  return ms_engine_attach_visit(e, id, copy_maps, &o);
}
