/* SPDX-License-Identifier: MIT */
/* The CUDA backend when this build has none (no nvcc, or -DMS_CUDA=OFF): every
 * call of megascope/cuda.h and megascope/cuda_diag.h answers that, so callers
 * need no #ifdefs and GPU tests skip. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "megascope/cuda.h"
#include "megascope/cuda_diag.h"

static const char *const why_none = "built without CUDA (no nvcc when configured, or -DMS_CUDA=OFF)";

int ms_cuda_available(char *why, size_t n) {
  if (why && n) snprintf(why, n, "%s", why_none);
  return 0;
}

int ms_cuda_device_info(struct ms_cuda_device *out, char *why, size_t n) {
  memset(out, 0, sizeof *out);
  if (why && n) snprintf(why, n, "%s", why_none);
  return -MS_E_UNSUPP;
}

void ms_cuda_describe(char *buf, size_t n) {
  if (buf && n) snprintf(buf, n, "%s", why_none);
}

struct ms_cuda_engine *ms_cuda_engine_new(const struct ms_model *m, const struct ms_cuda_opts *o,
                                          struct ms_textbuf *log) {
  ms_textbuf_printf(log, "cuda: %s\n", why_none);
  errno = MS_E_UNSUPP;
  return NULL;
}

void ms_cuda_engine_free(struct ms_cuda_engine *e) {}
int ms_cuda_generate(struct ms_cuda_engine *e, struct ms_cuda_request *r, int n, struct ms_textbuf *log) {
  return -MS_E_UNSUPP;
}
int ms_cuda_start(struct ms_cuda_engine *e, struct ms_cuda_request *r, int n, struct ms_textbuf *log) {
  return -MS_E_UNSUPP;
}
int ms_cuda_finished(struct ms_cuda_engine *e) { return -MS_E_UNSUPP; }
uint64_t ms_cuda_steps_done(const struct ms_cuda_engine *e) { return 0; }
int ms_cuda_wait(struct ms_cuda_engine *e, struct ms_textbuf *log) { return -MS_E_UNSUPP; }
void ms_cuda_get_stats(const struct ms_cuda_engine *e, struct ms_cuda_stats *out) {
  *out = (struct ms_cuda_stats){0};
}
int ms_cuda_attach(struct ms_cuda_engine *e, struct ms_monitor *m, const struct ms_attach_opts *o,
                   struct ms_textbuf *log) {
  return -MS_E_UNSUPP;
}
int ms_cuda_replace(struct ms_cuda_engine *e, int id, struct ms_monitor *m, struct ms_textbuf *log) {
  return -MS_E_UNSUPP;
}
int ms_cuda_detach(struct ms_cuda_engine *e, int id) { return -MS_E_UNSUPP; }
int ms_cuda_coverage(struct ms_cuda_engine *e, int id, struct ms_coverage *out) { return -MS_E_UNSUPP; }
int ms_cuda_attach_write(struct ms_cuda_engine *e, int id, FILE *f, int as_json) { return -MS_E_UNSUPP; }
int ms_cuda_ops_check(const struct ms_model *m, int batch, struct ms_textbuf *log) {
  ms_textbuf_printf(log, "cuda: %s\n", why_none);
  return -MS_E_UNSUPP;
}
int ms_cuda_feed_start(struct ms_cuda_engine *e, struct ms_textbuf *log) { return -MS_E_UNSUPP; }
int ms_cuda_feed_step(struct ms_cuda_engine *e, uint64_t step, const struct ms_cuda_row *rows, int n,
                      const struct ms_cuda_event *ev, int n_ev, struct ms_textbuf *log) {
  return -MS_E_UNSUPP;
}
int ms_cuda_feed_wait(struct ms_cuda_engine *e, const int32_t **tokens, const float **logits,
                      struct ms_textbuf *log) {
  return -MS_E_UNSUPP;
}
int ms_cuda_feed_stop(struct ms_cuda_engine *e, struct ms_textbuf *log) { return -MS_E_UNSUPP; }
const struct ms_plan *ms_cuda_plan(const struct ms_cuda_engine *e) { return NULL; }
int ms_cuda_ctas(const struct ms_cuda_engine *e) { return 0; }
int ms_cuda_attach_shared(struct ms_cuda_engine *e, struct ms_monitor *m, struct ms_bpf_map **maps, int n_maps,
                          const struct ms_attach_opts *o, struct ms_textbuf *log) {
  return -MS_E_UNSUPP;
}
int ms_cuda_replace_shared(struct ms_cuda_engine *e, int id, struct ms_monitor *m, struct ms_bpf_map **maps,
                           int n_maps, const struct ms_attach_opts *o, struct ms_textbuf *log) {
  return -MS_E_UNSUPP;
}
int ms_cuda_sync_maps(struct ms_cuda_engine *e, int id) { return -MS_E_UNSUPP; }
int ms_cuda_sync_maps_try(struct ms_cuda_engine *e, int id) { return -MS_E_UNSUPP; }
int ms_cuda_feed_totals(struct ms_cuda_engine *e, uint64_t *cls, uint64_t *ev) { return -MS_E_UNSUPP; }
int ms_cuda_feed_trace(struct ms_cuda_engine *e, int on) { return -MS_E_UNSUPP; }
int ms_cuda_feed_trace_drain(struct ms_cuda_engine *e,
                             void (*fn)(void *user, int worker, const struct ms_cuda_trace_rec *r), void *user,
                             uint64_t *lost) {
  *lost = 0;
  return -MS_E_UNSUPP;
}
int ms_cuda_workers(int n_sms) { return -1; }
int ms_cuda_sample(const struct ms_cuda_engine *e, int32_t *running, int32_t *waiting, int max) { return 0; }
int ms_cuda_coverage_of(struct ms_cuda_engine *e, int id, uint32_t generation, struct ms_coverage *out) {
  return -MS_E_UNSUPP;
}
int ms_cuda_forget(struct ms_cuda_engine *e, int id) { return -MS_E_UNSUPP; }
int ms_cuda_set_faults(struct ms_cuda_engine *e, const float *cls, int n_cls, const float *worker, int n_workers,
                       int slot, float slot_coef, const uint64_t *release_ns, int n_ev, struct ms_textbuf *log) {
  return -MS_E_UNSUPP;
}
