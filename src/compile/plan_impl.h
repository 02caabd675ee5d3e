/* SPDX-License-Identifier: MIT */
/* The plan's IR moved to the public megascope/plan_ir.h; this name forwards to
 * it for src/runtime/engine_impl.h alone (cmake/layers.cmake lets runtime,
 * control and bench see src/compile/ for it) and goes when that file includes
 * megascope/plan_ir.h. New code includes megascope/plan_ir.h. */
#ifndef MS_COMPILE_PLAN_IMPL_H
#define MS_COMPILE_PLAN_IMPL_H

#include "megascope/plan_ir.h"

#endif
