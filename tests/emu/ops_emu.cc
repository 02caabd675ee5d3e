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

// ---- the device sampler against the CPU's (src/model/sample.c) ----

extern "C" {
#include "megascope/sample.h"
}

// One row of V logits through the fed sample task (ops.cuh's msd_sample) with
// parameters f; the token it wrote (-1: the host's), and whether it copied the
// logits for the host when it gave the row back.
static int emu_sample_row(const float *lg, int V, const struct msd_feed_row *f, float *samp_w, float *copy,
                          const char **why) {
  static float *bufs[1];
  static int32_t cols[1], n_rows = 1, row_slot[1] = {0}, sampled[1];
  bufs[0] = (float *)lg;
  cols[0] = V;
  static struct msd_ctx x;
  memset(&x, 0, sizeof x);
  x.cfg.vocab = V;
  x.buf = bufs;
  x.buf_cols = cols;
  x.n_bufs = 1;
  x.max_rows = x.batch = 1;
  x.n_rows = &n_rows;
  x.row_slot = row_slot;
  x.sampled = sampled;
  x.logits_out = copy;
  x.feed_rows = f;
  x.samp_w = samp_w;
  static struct msd_class k;
  static struct ms_task t;
  memset(&k, 0, sizeof k);
  memset(&t, 0, sizeof t);
  k.in = 0;
  t.tile[1] = 0;
  sampled[0] = -2;
  const struct msd_ctx *xp = &x;
  if (msd_emu_launch(1, [xp] { msd_sample(xp, &k, &t); }, why)) return -3;
  return sampled[0];
}

// Logits of shape `kind` (0: spread, 1: on a coarse grid, so many are equal;
// 2: one far ahead; 3: on a grid with every tenth an ulp above its
// neighbour, near-equal weights whose order an expf an ulp off can swap),
// from a seeded generator.
static void emu_logits(float *lg, int V, int kind, uint64_t seed) {
  uint64_t z = seed * 0x9e3779b97f4a7c15ull + 1;
  for (int i = 0; i < V; i++) {
    z ^= z << 13, z ^= z >> 7, z ^= z << 17;
    double u = (double)(z >> 11) / 9007199254740992.0;
    double g = (u - 0.5) * 12.0;
    lg[i] = kind == 1 ? (float)(floor(g * 4.0) / 4.0) : (float)g;
    if (kind == 3) lg[i] = i % 10 == 1 ? nextafterf(lg[i - 1], 100.0f) : (float)(floor(g * 64.0) / 64.0);
  }
  if (kind == 2) lg[V / 3] = 30.0f;
}

// Draws through the device sampler, for vocabularies, logit shapes,
// parameters, seeds and draw numbers, each against ms_sample on the same
// logits: *mismatch counts tokens that differ (the device gave a token the
// CPU would not draw); per logit shape, draws[shape] the draws and
// back[shape] the rows given back to the host (each must carry its logits).
// skew: the emulated expf differs from the C library's by that much on half
// its results (0: not).
extern "C" int ms_emu_sample_check(float skew, int draws[4], int back[4], int *mismatch, char *msg, size_t n) {
  static const struct ms_sample_params ps[] = {
      {0.0f, 0, 0.0f, 1, 0.0f},     {0.7f, 0, 0.0f, 2, 0.0f},    {1.0f, 40, 0.0f, 3, 0.0f},
      {1.0f, 1, 0.0f, 4, 0.0f},     {0.8f, 0, 0.9f, 5, 0.0f},    {1.2f, 100, 0.5f, 6, 0.0f},
      {1.0f, 0, 0.0f, 7, 0.05f},    {0.9f, 0, 0.95f, 8, 0.02f},  {1.5f, 0, 0.0f, 9, 0.0f},
      {1.0f, 3, 0.99f, 10, 0.0f},
  };
  static const int vocabs[] = {7, 1000, 12289};
  msd_emu_exp_skew = skew;
  *mismatch = 0;
  memset(draws, 0, 4 * sizeof *draws);
  memset(back, 0, 4 * sizeof *back);
  msg[0] = 0;
  int rc = 0;
  for (int vi = 0; vi < 3 && !rc; vi++) {
    const int V = vocabs[vi];
    float *lg = (float *)malloc(sizeof(float) * V), *w = (float *)malloc(sizeof(float) * V);
    float *copy = (float *)malloc(sizeof(float) * V);
    for (int kind = 0; kind < 4 && !rc; kind++) {
      emu_logits(lg, V, kind, 100 + (uint64_t)vi * 7 + (uint64_t)kind);
      for (size_t pi = 0; pi < sizeof ps / sizeof ps[0] && !rc; pi++)
        for (uint64_t draw = 0; draw < 6 && !rc; draw++) {
          struct msd_feed_row f;
          memset(&f, 0, sizeof f);
          f.temperature = ps[pi].temperature;
          f.top_k = ps[pi].top_k;
          f.top_p = ps[pi].top_p;
          f.min_p = ps[pi].min_p;
          f.seed = ps[pi].seed;
          f.draw = draw;
          memset(copy, 0, sizeof(float) * V);
          const char *why = NULL;
          int dev = emu_sample_row(lg, V, &f, w, copy, &why);
          int cpu = ms_sample(lg, V, &ps[pi], draw);
          draws[kind]++;
          if (dev == -3) {
            snprintf(msg, n, "vocab %d: the sample task failed in the emulation: %s", V, why ? why : "");
            rc = -1;
          } else if (dev == -1) {
            back[kind]++;
            if (memcmp(copy, lg, sizeof(float) * V)) {
              snprintf(msg, n, "vocab %d params %zu draw %llu: given back without its logits", V, pi,
                       (unsigned long long)draw);
              rc = -1;
            }
          } else if (dev != cpu) {
            (*mismatch)++;
            if (!msg[0])
              snprintf(msg, n, "vocab %d shape %d params %zu draw %llu: the device drew %d, the CPU %d", V, kind, pi,
                       (unsigned long long)draw, dev, cpu);
          }
        }
    }
    free(lg), free(w), free(copy);
  }
  msd_emu_exp_skew = 0;
  return rc;
}
