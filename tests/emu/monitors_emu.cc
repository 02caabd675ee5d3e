// SPDX-License-Identifier: MIT
// src/cuda/monitors.cu, compiled by g++ for the CPU run of the persistent
// kernel (tests/test_monitors_host.c): the CUDA runtime is tests/emu's, on host
// memory, and bpf_dev.cuh takes its MSD_HOST_EMU paths (cuda/host_emu.h). The
// real build compiles monitors.cu with nvcc, untouched by this file.
#define MS_EMU_CUDA_IMPL
#include "cuda_runtime.h"  // tests/emu: before any <cuda_runtime.h>
#include "cuda/host_emu.h"
#include "../../src/cuda/monitors.cu"
