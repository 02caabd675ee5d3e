/* SPDX-License-Identifier: MIT */
/* Each device task body against its CPU twin (ms_cuda_ops_check) on bf16
 * synthetic models of the small presets, batch 1 and 4. Skipped (77) without a
 * CUDA device. */
#include <stdio.h>
#include <stdlib.h>

#include "megascope/cuda.h"
#include "megascope/cuda_diag.h"
#include "megascope/model.h"
#include "test.h"

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
  int rc = ms_cuda_ops_check(m, batch, &log);
  printf("== %s, batch %d: %d\n%s", preset, batch, rc, buf ? buf : "");
  CHECKF(rc == 0, "%s batch %d: ms_cuda_ops_check returned %d", preset, batch, rc);
  free(buf);
  ms_model_free(m);
}

int main(void) {
  char why[256];
  if (!ms_cuda_available(why, sizeof why)) {
    printf("skipped: %s\n", why);
    return 77;
  }
  static const char *const presets[] = {"tiny", "tiny-moe", "tiny-qwen3", "tiny-qwen2", "tiny-gemma3",
                                        "smollm2-135m"};
  for (size_t i = 0; i < sizeof presets / sizeof *presets; i++) {
    check_preset(presets[i], 1);
    check_preset(presets[i], 4);
  }
  TEST_MAIN_END();
}
