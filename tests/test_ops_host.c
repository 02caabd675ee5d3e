/* SPDX-License-Identifier: MIT */
/* The device task bodies (src/cuda/ops.cuh) on the CPU against their CPU twins
 * (ms_ops_run): src/cuda/ops_check.cu and upload.cu compiled by g++ through
 * tests/emu/ops_emu.cc, on tests/emu's host-memory CUDA runtime, every launch's
 * CTAs run as 256 fibers with CTA and warp barriers (tests/emu/cta_emu.h).
 * The same check as test_cuda_ops, on every machine: no nvcc, no GPU. bf16
 * synthetic models of the small presets, batch 1 and 4, then shapes that take
 * the bodies' other paths (batch 16, context 4096, odd and wide dims, 16 q
 * heads per kv head); every task class, a few tasks each (first, quartiles,
 * last); a deadlock, a divergent barrier or a partial-mask warp operation fails
 * the class that did it. Opens with the emulation's own self-test. */
#include <stdio.h>
#include <string.h>
#include <stdlib.h>

#include "megascope/base.h"
#include "megascope/model.h"
#include "test.h"

/* tests/emu/ops_emu.cc */
int ms_emu_ops_check(const struct ms_model *m, int batch, struct ms_textbuf *log);
void ms_emu_ops_set_ctx(int n);
unsigned long long ms_emu_ops_switches(void);
int ms_emu_cta_selftest(char *msg, size_t n);
int ms_emu_sample_check(float skew, int draws[4], int back[4], int *mismatch, char *msg, size_t n);
void ms_emu_cuda_drain(void);

/* One check of cfg at batch, ctx positions per request. */
static void check_cfg(const struct ms_model_config *cfg, int batch, int ctx) {
  struct ms_model *m = ms_model_synth(cfg, 11);
  if (!m) {
    CHECKF(0, "%s: ms_model_synth failed", cfg->name);
    return;
  }
  size_t n = 1 << 20;
  char *buf = calloc(n, 1);
  struct ms_textbuf log = {buf, n, 0, 0};
  uint64_t t0 = ms_now_ns();
  unsigned long long s0 = ms_emu_ops_switches();
  ms_emu_ops_set_ctx(ctx);
  int rc = ms_emu_ops_check(m, batch, &log);
  printf("== %s, batch %d, context %d: %d (%.1f s, %.1fM fiber resumes)\n%s", cfg->name, batch, ctx, rc,
         (double)(ms_now_ns() - t0) / 1e9, (double)(ms_emu_ops_switches() - s0) / 1e6, buf ? buf : "");
  CHECKF(rc == 0, "%s batch %d context %d: ms_emu_ops_check returned %d", cfg->name, batch, ctx, rc);
  free(buf);
  ms_model_free(m);
  ms_emu_cuda_drain();
}

static void check_preset(const char *preset, int batch, int ctx) {
  struct ms_model_config cfg;
  CHECK(ms_preset_config(preset, MS_DTYPE_BF16, &cfg) == 0);
  check_cfg(&cfg, batch, ctx);
}

/* The fed sample task's draws (ops.cuh's msd_sample) against ms_sample:
 * vocabularies of 7 to 12289; logits spread, on a grid (ties), with one far
 * ahead, and with near-equal pairs (an ulp apart); greedy, temperature
 * alone, top-k, top-p, min-p and mixes; every token the device draws is the
 * CPU's, and a row it gives back carries its logits. With an expf that
 * differs from the C library's (by 2^-20 on every other result: more than a
 * device's 2 ulp), still no token differs: the draws too close to call are
 * given back instead. (With the margin cut to 1e-12 the skewed run draws 12
 * tokens the CPU would not: the check can fail.) */
static void check_sampler(void) {
  static const char *const shape[4] = {"spread", "ties", "one ahead", "near pairs"};
  char msg[512];
  for (int skewed = 0; skewed < 2; skewed++) {
    int draws[4], back[4], mismatch = 0;
    int rc = ms_emu_sample_check(skewed ? 1.0f / (1 << 20) : 0.0f, draws, back, &mismatch, msg, sizeof msg);
    printf("device sampler%s:", skewed ? " (expf skewed by 2^-20)" : "");
    for (int k = 0; k < 4; k++) printf(" %s %d of %d given back;", shape[k], back[k], draws[k]);
    printf(" %d differ%s%s\n", mismatch, msg[0] ? ": " : "", msg);
    CHECKF(rc == 0 && mismatch == 0, "device sampler%s: %s", skewed ? " (skewed)" : "", msg);
    /* on shapes without near-equal weights, given back only near an edge: rarely */
    int d = draws[0] + draws[1] + draws[2], b = back[0] + back[1] + back[2];
    CHECKF(d >= 500 && b * 20 < d, "device sampler: %d of %d draws given back", b, d);
  }
}

int main(void) {
  char msg[1024];
  int fails = ms_emu_cta_selftest(msg, sizeof msg);
  printf("%s", msg);
  CHECKF(fails == 0, "the CTA emulation failed %d of its own checks", fails);
  /* test_cuda_ops' presets and batches */
  static const char *const presets[] = {"tiny", "tiny-moe", "tiny-qwen3", "tiny-qwen2", "tiny-gemma3",
                                        "smollm2-135m"};
  for (size_t i = 0; i < sizeof presets / sizeof *presets; i++) {
    check_preset(presets[i], 1, 64);
    check_preset(presets[i], 4, 64);
  }
  /* paths those miss: more rows than a GEMV pass takes (MSD_MAXB), an expert
   * with more routed rows than a chunk; a context whose scores overflow shared
   * memory (attention from the per-CTA scratch, row 2 at position 4095) */
  check_preset("tiny", 16, 64);
  check_preset("tiny-moe", 16, 64);
  check_preset("tiny", 4, 4096);
  check_preset("tiny-qwen3", 4, 4096);
  /* rows that are not 16-byte aligned and lengths not a multiple of 8: the
   * scalar GEMV path; an odd expert count */
  struct ms_model_config odd;
  CHECK(ms_preset_config("tiny-moe", MS_DTYPE_BF16, &odd) == 0);
  snprintf(odd.name, sizeof odd.name, "tiny-moe-odd");
  odd.dim = 60, odd.ffn_dim = 100, odd.expert_ffn_dim = 90, odd.n_experts = 5, odd.vocab = 250;
  check_cfg(&odd, 4, 64);
  odd.n_experts = 0, odd.top_k = 0, odd.expert_ffn_dim = 0;
  snprintf(odd.name, sizeof odd.name, "tiny-odd");
  check_cfg(&odd, 3, 64);
  /* an input row too long to stage in shared memory (down: 8200 columns) */
  struct ms_model_config wide;
  CHECK(ms_preset_config("tiny", MS_DTYPE_BF16, &wide) == 0);
  snprintf(wide.name, sizeof wide.name, "tiny-wide");
  wide.ffn_dim = 8200;
  check_cfg(&wide, 4, 64);
  /* one kv head for 16 q heads: rope's warps rotate several vectors each */
  struct ms_model_config mqa;
  CHECK(ms_preset_config("tiny-qwen3", MS_DTYPE_BF16, &mqa) == 0);
  snprintf(mqa.name, sizeof mqa.name, "tiny-qwen3-mqa");
  mqa.n_heads = 16, mqa.n_kv_heads = 1;
  check_cfg(&mqa, 4, 64);
  /* gemma3 past its sliding window (tiny-gemma3's window is 8 positions; its
   * sixth layer is global) */
  check_preset("tiny-gemma3", 4, 256);
  check_sampler();
  TEST_MAIN_END();
}
