/* SPDX-License-Identifier: MIT */
/* The backends by id (enum ms_backend): the one place that lists them. */
#include "runtime/engine_impl.h"

const struct ms_backend_ops *ms_backend_get(enum ms_backend b) {
  static const struct ms_backend_ops *const all[MS_BACKEND_COUNT] = {
      [MS_BACKEND_CPU] = &ms_backend_cpu,
      [MS_BACKEND_SIM] = &ms_backend_sim,
  };
  return (int)b >= 0 && b < MS_BACKEND_COUNT ? all[b] : NULL;
}
