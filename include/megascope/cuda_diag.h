/* SPDX-License-Identifier: MIT */
/* The CUDA kernel on its own, without the engine: the door of `megascope cuda`
 * (a diagnostic: is there a device, does each task body agree with its CPU
 * twin, the kernel's own requests and monitors) and of the GPU tests. The
 * engine's cuda backend does not use it (megascope/cuda.h is its door).
 *
 * Requests are handed to the running kernel through host-mapped memory;
 * tokens come back the same way. Sampling is greedy. Without nvcc every
 * function here reports -MS_E_UNSUPP ("built without CUDA"), as cuda.h's do. */
#ifndef MEGASCOPE_CUDA_DIAG_H
#define MEGASCOPE_CUDA_DIAG_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "megascope/base.h"
#include "megascope/cuda.h"
#include "megascope/model.h"
#include "megascope/monitor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* 1 when this build has the CUDA backend and a device is present; else 0 with
 * the reason ("built without CUDA", "no CUDA device: ...") in why. */
int ms_cuda_available(char *why, size_t n);
/* "H200 (132 SMs, sm_90, 141 GiB)" or the reason there is none. */
void ms_cuda_describe(char *buf, size_t n);

/* One request for ms_cuda_generate. tokens receives up to max_new tokens;
 * logits, when set, receives (n_prompt + max_new - 1) rows of vocab floats: the
 * logits of every position (for checks against the CPU). */
struct ms_cuda_request {
  const int32_t *prompt;
  int n_prompt, max_new;
  int stop_at_eos;          /* finish early on the model's eos token (the eos is emitted) */
  int32_t *tokens;          /* out: [max_new] */
  int n_tokens;             /* out */
  float *logits;            /* out, optional */
  uint64_t t_submit, t_first, t_done;  /* out: ms_now_ns() */
};

/* Runs requests to completion with continuous batching: all are queued at once,
 * admitted as rows free up. 0 or a negative error (-MS_E_STALL with a report in
 * log when the watchdog fired). */
int ms_cuda_generate(struct ms_cuda_engine *e, struct ms_cuda_request *r, int n, struct ms_textbuf *log);

/* Starts the persistent kernel for the n requests r (all handed over before
 * the launch) and returns at once; ms_cuda_wait waits for them to finish and
 * for the kernel to exit. Monitors can be attached, replaced and detached in
 * between. */
int ms_cuda_start(struct ms_cuda_engine *e, struct ms_cuda_request *r, int n, struct ms_textbuf *log);
/* Requests finished so far, and steps the running kernel has finished
 * (polling; host-mapped counters). */
int ms_cuda_finished(struct ms_cuda_engine *e);
uint64_t ms_cuda_steps_done(const struct ms_cuda_engine *e);
int ms_cuda_wait(struct ms_cuda_engine *e, struct ms_textbuf *log);

/* Monitors on the device: the same verified programs and map layouts as the CPU
 * engine; attach/replace/detach work while the kernel runs (see monitor.h). */
int ms_cuda_attach(struct ms_cuda_engine *e, struct ms_monitor *m, const struct ms_attach_opts *o,
                   struct ms_textbuf *log);
int ms_cuda_replace(struct ms_cuda_engine *e, int id, struct ms_monitor *m, struct ms_textbuf *log);
int ms_cuda_coverage(struct ms_cuda_engine *e, int id, struct ms_coverage *out);
/* Copies the attachment's device maps into its host maps (on a copy stream, the
 * kernel keeps running) and writes them decoded, as monitor.h's
 * ms_engine_attach_write does. */
int ms_cuda_attach_write(struct ms_cuda_engine *e, int id, FILE *f, int as_json);

/* Each device task body against its CPU twin (src/kernels/ops.c) on the same
 * inputs, one class at a time, for a model (bf16 weights) and batch. Writes a line
 * per class to log; 0 when all agree within tolerance, -MS_E_VERIFY otherwise. */
int ms_cuda_ops_check(const struct ms_model *m, int batch, struct ms_textbuf *log);

#ifdef __cplusplus
}
#endif
#endif
