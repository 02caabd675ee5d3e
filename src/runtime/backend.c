/* SPDX-License-Identifier: MIT */
/* The backends by id (enum ms_backend): the one place that lists them. */
#include <errno.h>
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
  return be ? be->name : NULL;
}

int ms_backend_parse(const char *s, enum ms_backend *out) {
  for (int b = 0; b < MS_BACKEND_COUNT; b++)
    if (!strcmp(s, all[b]->name)) {
      *out = (enum ms_backend)b;
      return 0;
    }
  return -EINVAL;
}
