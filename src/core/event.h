/* SPDX-License-Identifier: MIT */
/* The event rule, one for every backend (the CPU engine, the simulator, the
 * megakernel on the device). */
#ifndef MS_CORE_EVENT_H
#define MS_CORE_EVENT_H

#include <stdint.h>

#include "core/hostdev.h"
#include "megascope/plan_ir.h"

/* An event's counter counts its triggers since the runtime started and is
 * never reset, so in generation gen (the gen-th run of its plan, from 0)
 * event e has fired once its counter reaches this. */
MS_HOSTDEV static inline uint64_t ms_event_target(const struct ms_event *e, uint64_t gen) {
  return (uint64_t)e->needed * (gen + 1);
}

#endif
