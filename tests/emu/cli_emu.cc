// SPDX-License-Identifier: MIT
// The CLI built over the emulated CUDA sources (the megascope-emu binary, for
// tests): engine.cu and the persistent kernel as tests/emu/engine_emu.cc
// compiles them for the CPU, so `run`, `serve` and `bench decode` take
// --backend cuda on a machine without a GPU. The task bodies' check against
// their CPU twins (`megascope cuda ops`) is test_ops_host's in this build.
#include "engine_emu.cc"

extern "C" int ms_cuda_ops_check(const struct ms_model *m, int batch, struct ms_textbuf *log) {
  (void)m;
  (void)batch;
  ms_textbuf_printf(log, "cuda: the emulated build does not check task bodies here (test_ops_host does)\n");
  return -MS_E_UNSUPP;
}
