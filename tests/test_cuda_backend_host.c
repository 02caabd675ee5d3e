/* SPDX-License-Identifier: MIT */
/* The engine's CUDA backend end to end on the CPU: test_cuda_backend's checks
 * (ms_engine with MS_BACKEND_CUDA against the CPU engine) with the CUDA sources
 * compiled by g++ through tests/emu/engine_emu.cc: the resident kernel's CTAs
 * are OS threads of 256 fibers each; the emulated runtime also checks that
 * nothing beside the resident kernel makes a call that could wait for it. No
 * nvcc, no GPU. */
#define MS_CUDA_ENGINE_SMALL 1
#define MS_CUDA_EMU_COUNTS 1
#include "test_cuda_backend.c"
