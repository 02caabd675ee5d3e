/* SPDX-License-Identifier: MIT */
/* The backends by id (enum ms_backend): the one place that lists them, and
 * what the runtime's public header says of them (ms_backend_info). */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "runtime/runtime_impl.h"

static const struct ms_backend_ops *const all[MS_BACKEND_COUNT] = {
    [MS_BACKEND_CPU] = &ms_backend_cpu,
    [MS_BACKEND_SIM] = &ms_backend_sim,
    [MS_BACKEND_CUDA] = &ms_backend_cuda,
};

const struct ms_backend_ops *ms_backend_get(enum ms_backend b) {
  return (int)b >= 0 && b < MS_BACKEND_COUNT ? all[b] : NULL;
}

const char *ms_backend_name(enum ms_backend b) {
  const struct ms_backend_ops *be = ms_backend_get(b);
  return be ? be->info.name : NULL;
}

const struct ms_backend_info *ms_backend_info(enum ms_backend b) {
  const struct ms_backend_ops *be = ms_backend_get(b);
  return be ? &be->info : NULL;
}

void ms_backend_plan_tiling(const struct ms_backend_info *bi, struct ms_compile_opts *co) {
  co->tile_bytes = bi->tile_bytes;
  co->min_tiles = bi->min_tiles;
  co->fuse_norm = bi->fuse_norm;
  co->attn_parts = bi->attn_parts;
}

int ms_backend_injects(enum ms_backend b, int fault_type) {
  const struct ms_backend_ops *be = ms_backend_get(b);
  return be && (!be->injects || be->injects(fault_type));
}

int ms_backend_device(enum ms_backend b, struct ms_device_info *out, char *why, size_t n) {
  const struct ms_backend_ops *be = ms_backend_get(b);
  memset(out, 0, sizeof *out);
  if (be && be->device) return be->device(out, why, n);
  if (n) snprintf(why, n, "the %s backend runs on no device", be ? be->info.name : "unknown");
  return -MS_E_UNSUPP;
}

int ms_backend_parse(const char *s, enum ms_backend *out) {
  for (int b = 0; b < MS_BACKEND_COUNT; b++)
    if (!strcmp(s, all[b]->info.name)) {
      *out = (enum ms_backend)b;
      return 0;
    }
  return -EINVAL;
}
