/* SPDX-License-Identifier: MIT */
/* Whether an engine's GEMVs take 8-bit activations: asked for, and the model's
 * weights in a block format that has an integer dot product (f32, f16 and bf16
 * keep f32 inputs whatever the option says). */
#include "kernels/quant.h"
#include "runtime/runtime_impl.h"

int ms_engine_q8_active(const struct ms_engine *e) {
  return e->o.q8_activations && !e->shape_only && ms_q8_handles(e->m->cfg.dtype);
}
