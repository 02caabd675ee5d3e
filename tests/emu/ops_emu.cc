// SPDX-License-Identifier: MIT
// src/cuda/ops_check.cu (with upload.cu and the device task bodies of ops.cuh),
// compiled by g++ for the CPU (tests/test_ops_host.c): the CUDA runtime is
// tests/emu's, on host memory, and each launch runs its CTAs as 256 fibers
// with CTA and warp barriers (tests/emu/cta_emu.h). ms_cuda_ops_check is
// renamed ms_emu_ops_check so the test can say which it runs, and its
// positions per request (CHK_CTX) are a variable: a long context takes
// attention's other path (scores in the per-CTA scratch). The real build
// compiles these files with nvcc, untouched by this one.
#define MS_EMU_CUDA_IMPL
#include "cuda_runtime.h"  // tests/emu: before any <cuda_runtime.h>
#include "cta_emu.h"

static int ms_emu_chk_ctx = 64;
#define CHK_CTX ms_emu_chk_ctx
#define ms_cuda_ops_check ms_emu_ops_check
#include "../../src/cuda/upload.cu"
#include "../../src/cuda/ops_check.cu"

// Positions per request of the next checks (ops_check.cu's default: 64).
extern "C" void ms_emu_ops_set_ctx(int n) { ms_emu_chk_ctx = n; }

// Fiber resumes so far (the emulation's work).
extern "C" unsigned long long ms_emu_ops_switches(void) { return msd_emu.switches; }

// ---- the emulation's own check: what it must compute, and what it must refuse ----

static __device__ int emu_sh[MSD_EMU_THREADS];
static __device__ int emu_bad;

static void emu_expect(int ok, const char *what, char *msg, size_t n, int *fails) {
  if (ok) return;
  size_t at = strlen(msg);
  snprintf(msg + at, n > at ? n - at : 0, "cta_emu: %s\n", what);
  (*fails)++;
}

static int emu_err_has(const char *why, const char *word) { return why && strstr(why, word) != NULL; }

// Failures (0: none), each named in msg.
extern "C" int ms_emu_cta_selftest(char *msg, size_t n) {
  const char *why = NULL;
  int fails = 0;
  msg[0] = 0;
  // barriers, shuffles, ballots compute what a GPU computes, over several CTAs
  emu_bad = 0;
  int rc = msd_emu_launch(3, [] {
    int t = (int)threadIdx.x, lane = t & 31;
    emu_sh[t] = t + (int)blockIdx.x;
    __syncthreads();
    if (emu_sh[255 - t] != 255 - t + (int)blockIdx.x) emu_bad++;
    float v = (float)lane;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (v != 496.0f || __shfl_xor_sync(0xffffffffu, t, 1) != (t ^ 1)) emu_bad++;
    if (__ballot_sync(0xffffffffu, lane & 1) != 0xaaaaaaaau || blockDim.x != 256 || gridDim.x != 3) emu_bad++;
    __syncwarp();
    __syncthreads();
  }, &why);
  emu_expect(rc == 0 && emu_bad == 0, "barriers, shuffles or ballots compute wrong values", msg, n, &fails);
  // a missing barrier shows: threads read their neighbour's slot in the same phase
  emu_bad = 0;
  memset(emu_sh, 0, sizeof emu_sh);
  rc = msd_emu_launch(1, [] {
    int t = (int)threadIdx.x;
    emu_sh[t] = 1;
    __syncwarp();  /* a warp barrier: lets other warps' threads run, orders nothing across warps */
    if (!emu_sh[(t + 32) % MSD_EMU_THREADS]) emu_bad++;
    __syncthreads();
  }, &why);
  emu_expect(rc == 0 && emu_bad > 0, "a read racing with another warp's write always saw the write", msg, n, &fails);
  // refused: divergent __syncthreads, a warp operation with lanes missing, a partial mask
  rc = msd_emu_launch(1, [] {
    if (threadIdx.x < 128) {
      __syncthreads();
    } else {
      __syncthreads();
    }
  }, &why);
  emu_expect(rc < 0 && emu_err_has(why, "divergent"), "divergent __syncthreads() not reported", msg, n, &fails);
  rc = msd_emu_launch(1, [] {
    if ((threadIdx.x & 31) != 31) (void)__shfl_xor_sync(0xffffffffu, 1.0f, 1);
    __syncthreads();
  }, &why);
  emu_expect(rc < 0 && emu_err_has(why, "deadlock"), "a shuffle without lane 31 not reported", msg, n, &fails);
  rc = msd_emu_launch(1, [] { (void)__ballot_sync(0xffffu, 1); }, &why);
  emu_expect(rc < 0 && emu_err_has(why, "mask"), "a partial mask not reported", msg, n, &fails);
  return fails;
}
