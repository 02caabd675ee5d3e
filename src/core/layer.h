/* SPDX-License-Identifier: MIT */
/* The layer rules of a model's configuration, compiled for the CPU kernels,
 * the reference forward, the runtime's hook fields and the CUDA task bodies
 * alike (one source, so every backend attends to the same positions). */
#ifndef MS_CORE_LAYER_H
#define MS_CORE_LAYER_H

#include <math.h>

#include "core/hostdev.h"
#include "megascope/model.h"

/* The window of layer l: 0 for a global layer, else the positions a query sees
 * (its own and the window - 1 before it, as llama.cpp's standard SWA mask). */
MS_HOSTDEV static inline int ms_layer_window(const struct ms_model_config *c, int l) {
  if (c->sliding_window <= 0) return 0;
  return c->swa_pattern > 0 && (l + 1) % c->swa_pattern == 0 ? 0 : c->sliding_window;
}

/* The first position attention of layer l reads for a query whose context
 * holds n positions (its own the last): 0 on a global layer, n - window on a
 * local one past its window. The kernels (CPU and device) read positions
 * [first, n) and the hook ABI's work_rows counts them (n - first), on every
 * backend from this one rule. */
MS_HOSTDEV static inline int ms_layer_attn_first(const struct ms_model_config *c, int l, int n) {
  int win = ms_layer_window(c, l);
  return win && n > win ? n - win : 0;
}

/* The share `part` of `parts` (ms_task_class.parts; 0, 1: all) of those
 * positions, [*p0, *p1): cut as evenly as whole positions allow, a part empty
 * where there are fewer positions than parts. Each part's task reads these and
 * its work_rows counts them, so a row's parts sum to the whole. */
MS_HOSTDEV static inline void ms_layer_attn_share(const struct ms_model_config *c, int l, int n, int part, int parts,
                                                  int *p0, int *p1) {
  int first = ms_layer_attn_first(c, l, n);
  if (parts < 1) parts = 1, part = 0;
  *p0 = first + (int)((long long)(n - first) * part / parts);
  *p1 = first + (int)((long long)(n - first) * (part + 1) / parts);
}

/* RoPE base of layer l: rope_base_local for a local layer when set. */
MS_HOSTDEV static inline float ms_layer_rope_base(const struct ms_model_config *c, int l) {
  return ms_layer_window(c, l) && c->rope_base_local > 0 ? c->rope_base_local : c->rope_base;
}

/* The attention scores' scale. */
MS_HOSTDEV static inline float ms_attn_scale(const struct ms_model_config *c) {
  return c->attn_scale > 0 ? c->attn_scale : 1.0f / sqrtf((float)c->head_dim);
}

#endif
