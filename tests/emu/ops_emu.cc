// SPDX-License-Identifier: MIT
// src/cuda/ops_check.cu (with upload.cu and the device task bodies of ops.cuh),
// compiled by g++ for the CPU (tests/test_ops_host.c): the CUDA runtime is
// tests/emu's, on host memory, and each launch runs its CTAs as 256 fibers
// with CTA and warp barriers (tests/emu/cta_emu.h). ms_cuda_ops_check is
// renamed ms_emu_ops_check so the test can say which it runs. The real build
// compiles these files with nvcc, untouched by this one.
#define MS_EMU_CUDA_IMPL
#include "cuda_runtime.h"  // tests/emu: before any <cuda_runtime.h>
#include "cta_emu.h"
#define ms_cuda_ops_check ms_emu_ops_check
#include "../../src/cuda/upload.cu"
#include "../../src/cuda/ops_check.cu"
