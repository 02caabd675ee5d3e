/* SPDX-License-Identifier: MIT */
/* What the runtime says of each backend (ms_backend_info, ms_backend_injects,
 * ms_backend_device in megascope/engine.h), which the benchmark and the CLI
 * ask instead of comparing backend ids: the names round-trip, each property
 * is the one its backend has (the simulator's virtual clock and cost model,
 * the CPU's OS threads, the device's SMs), the CUDA backend injects exactly
 * the faults its tables carry, and a host backend has no device. */
#include <string.h>

#include "megascope/engine.h"
#include "megascope/fault.h"
#include "test.h"

static void check_names(void) {
  for (int b = 0; b < MS_BACKEND_COUNT; b++) {
    const struct ms_backend_info *i = ms_backend_info((enum ms_backend)b);
    enum ms_backend back;
    CHECKF(i && i->name && i->label, "backend %d: no description", b);
    if (!i) continue;
    CHECKF(!strcmp(i->name, ms_backend_name((enum ms_backend)b)), "backend %d: %s", b, i->name);
    CHECKF(ms_backend_parse(i->name, &back) == 0 && back == (enum ms_backend)b, "%s: no round trip", i->name);
    /* a virtual clock is the cost model's; workers are OS threads or a device's, not both */
    CHECKF(i->virtual_clock == i->cost_model, "%s: clock and cost model disagree", i->name);
    CHECKF(!(i->os_workers && i->on_device), "%s: OS threads on a device", i->name);
  }
  CHECK(ms_backend_info(MS_BACKEND_COUNT) == NULL);
  CHECK(ms_backend_info((enum ms_backend)-1) == NULL);
}

static void check_properties(void) {
  const struct ms_backend_info *cpu = ms_backend_info(MS_BACKEND_CPU), *sim = ms_backend_info(MS_BACKEND_SIM),
                               *cuda = ms_backend_info(MS_BACKEND_CUDA);
  CHECK(cpu->os_workers && !cpu->virtual_clock && !cpu->on_device && !cpu->tiles_per_worker);
  CHECK(cpu->q8_activations && cpu->prefix_cache && !cpu->device_sms && !cpu->bf16_weights);
  CHECK(sim->virtual_clock && sim->cost_model && sim->tiles_per_worker && !sim->os_workers && !sim->on_device);
  CHECK(cuda->on_device && cuda->device_sms && cuda->tiles_per_worker && cuda->bf16_weights);
  CHECK(!cuda->virtual_clock && !cuda->os_workers && !cuda->q8_activations && !cuda->prefix_cache);
}

static void check_faults(void) {
  for (int t = 0; t < MS_FAULT_TYPE_COUNT; t++) {
    CHECKF(ms_backend_injects(MS_BACKEND_CPU, t) && ms_backend_injects(MS_BACKEND_SIM, t), "fault %d", t);
    CHECKF(ms_backend_injects(MS_BACKEND_CUDA, t) == ms_fault_on_device((enum ms_fault_type)t), "fault %d", t);
  }
  CHECK(!ms_backend_injects(MS_BACKEND_COUNT, 0));
}

static void check_device(void) {
  struct ms_device_info d;
  char why[256] = "";
  CHECK(ms_backend_device(MS_BACKEND_CPU, &d, why, sizeof why) == -MS_E_UNSUPP);
  CHECKF(!strcmp(why, "the cpu backend runs on no device"), "why: %s", why);
  int rc = ms_backend_device(MS_BACKEND_CUDA, &d, why, sizeof why);
  CHECKF(rc == 0 ? d.sms > 0 && d.name[0] : rc == -MS_E_UNSUPP && why[0], "cuda: %d, %s", rc, why);
}

int main(void) {
  check_names();
  check_properties();
  check_faults();
  check_device();
  TEST_MAIN_END();
}
