/* SPDX-License-Identifier: MIT */
/* The CUDA backend's host engine (src/cuda/engine.cu) end to end on the CPU:
 * test_cuda_engine's checks (tokens of the persistent kernel and of the per-op
 * baseline equal the CPU engine's on tiny and tiny-moe, bf16 weights, more
 * requests than rows; logits within 1e-2; a monitor attached, replaced and
 * detached while the kernel runs, making no call that could wait for it)
 * against engine.cu compiled by g++ through tests/emu/engine_emu.cc: tests/emu's host-memory CUDA runtime, the persistent
 * kernel's CTAs as OS threads of 256 fibers each (tests/emu/cta_emu.h), the
 * per-op CUDA Graph replayed on the caller. No nvcc, no GPU. smollm2-135m is
 * left to the GPU test (minutes of fibers on the CPU). */
#define MS_CUDA_ENGINE_SMALL 1
#define MS_CUDA_EMU_COUNTS 1
#include "test_cuda_engine.c"
