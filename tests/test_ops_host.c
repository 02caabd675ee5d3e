/* SPDX-License-Identifier: MIT */
/* The device task bodies (src/cuda/ops.cuh) on the CPU against their CPU twins
 * (ms_ops_run): src/cuda/ops_check.cu and upload.cu compiled by g++ through
 * tests/emu/ops_emu.cc, on tests/emu's host-memory CUDA runtime, every launch's
 * CTAs run as 256 fibers with CTA and warp barriers (tests/emu/cta_emu.h).
 * The same check as test_cuda_ops, on every machine: no nvcc, no GPU. bf16
 * synthetic models of the small presets, batch 1 and 4; every task class, a
 * few tasks each (first, quartiles, last); a deadlock, a divergent barrier or
 * a partial-mask warp operation fails the class that did it. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "megascope/base.h"
#include "megascope/model.h"
#include "test.h"

int ms_emu_ops_check(const struct ms_model *m, int batch, struct ms_textbuf *log);  /* ops_emu.cc */
void ms_emu_cuda_drain(void);

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void check_preset(const char *preset, int batch) {
  struct ms_model_config cfg;
  struct ms_model *m = NULL;
  CHECK(ms_preset_config(preset, MS_DTYPE_BF16, &cfg) == 0);
  if (!(m = ms_model_synth(&cfg, 11))) {
    CHECKF(0, "%s: ms_model_synth failed", preset);
    return;
  }
  size_t n = 1 << 20;
  char *buf = calloc(n, 1);
  struct ms_textbuf log = {buf, n, 0, 0};
  double t0 = now();
  int rc = ms_emu_ops_check(m, batch, &log);
  printf("== %s, batch %d: %d (%.1f s)\n%s", preset, batch, rc, now() - t0, buf ? buf : "");
  CHECKF(rc == 0, "%s batch %d: ms_emu_ops_check returned %d", preset, batch, rc);
  free(buf);
  ms_model_free(m);
  ms_emu_cuda_drain();
}

int main(void) {
  static const char *const presets[] = {"tiny", "tiny-moe", "tiny-qwen3", "smollm2-135m"};
  for (size_t i = 0; i < sizeof presets / sizeof *presets; i++) {
    check_preset(presets[i], 1);
    check_preset(presets[i], 4);
  }
  TEST_MAIN_END();
}
