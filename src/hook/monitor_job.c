/* SPDX-License-Identifier: MIT */
/* A monitor loaded and verified on a thread of its own (megascope/monitor_job.h).
 *
 * DESIGN
 * Who runs what. ms_monitor_job_start (any thread: the owner) copies the
 * object and starts one thread, which runs ms_monitor_open_mem into the job's
 * result fields, then publishes `done` and writes the job's eventfd. The owner
 * polls the eventfd or reads `done`, and calls ms_monitor_job_take and
 * ms_monitor_job_free; nobody else touches the job.
 * Ordering. The thread writes the result (monitor, error, log) before its
 * release store of `done`; the owner reads them only after an acquire load
 * that saw done set, or after joining the thread. The eventfd is a wake-up
 * only, never the synchronisation.
 * Shutdown. ms_monitor_job_free sets `cancel` (the verifier, told so by
 * ms_bpf_verify_set_cancel on the job's thread, refuses soon after: at its
 * next prune point or within 1024 instructions), joins the thread and frees
 * what was not taken. ms_monitor_job_take does not cancel: it waits. */
#include "megascope/monitor_job.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "megascope/verifier.h"

struct ms_monitor_job {
  pthread_t thread;
  int joined, efd;
  _Atomic int done;           /* release by the thread after the result is written */
  int cancel;                 /* set by ms_monitor_job_free (__atomic, relaxed) */
  void *obj;
  size_t size;
  char name[64];
  char *log;                  /* log_size bytes */
  size_t log_size;
  struct ms_monitor *mon;     /* the result; NULL once taken or when refused */
  int err;                    /* ms_monitor_open_mem's errno, negated; 0 on success */
  int taken;
};

static void *job_main(void *arg) {
  struct ms_monitor_job *j = arg;
  struct ms_textbuf tb = {j->log, j->log_size, 0, 0};
  ms_bpf_verify_set_cancel(&j->cancel);
  j->mon = ms_monitor_open_mem(j->obj, j->size, j->name, &tb);
  ms_bpf_verify_set_cancel(NULL);
  j->err = j->mon ? 0 : -(errno ? errno : EINVAL);
  free(j->obj);
  j->obj = NULL;
  atomic_store_explicit(&j->done, 1, memory_order_release); /* the result above is complete */
  uint64_t one = 1;
  ssize_t k = write(j->efd, &one, sizeof one); /* a wake-up: an eventfd write cannot fail here */
  (void)k;
  return NULL;
}

struct ms_monitor_job *ms_monitor_job_start(const void *buf, size_t size, const char *name, size_t log_size) {
  struct ms_monitor_job *j = calloc(1, sizeof *j);
  if (!j) return NULL;
  j->efd = -1;
  j->joined = 1; /* nothing to join until the thread exists */
  j->log_size = log_size ? log_size : 1;
  j->log = calloc(1, j->log_size);
  j->obj = malloc(size ? size : 1);
  j->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (!j->log || !j->obj || j->efd < 0) {
    int e = j->efd < 0 ? errno : ENOMEM;
    ms_monitor_job_free(j);
    errno = e;
    return NULL;
  }
  memcpy(j->obj, buf, size);
  j->size = size;
  snprintf(j->name, sizeof j->name, "%s", name ? name : "monitor");
  int rc = pthread_create(&j->thread, NULL, job_main, j);
  if (rc) {
    ms_monitor_job_free(j);
    errno = rc;
    return NULL;
  }
  j->joined = 0;
  return j;
}

int ms_monitor_job_fd(const struct ms_monitor_job *j) { return j ? j->efd : -1; }

int ms_monitor_job_done(const struct ms_monitor_job *j) {
  return j && atomic_load_explicit(&j->done, memory_order_acquire); /* pairs with job_main's release */
}

static void join(struct ms_monitor_job *j) {
  if (j->joined) return;
  pthread_join(j->thread, NULL);
  j->joined = 1;
}

struct ms_monitor *ms_monitor_job_take(struct ms_monitor_job *j, int *err, const char **log) {
  if (!j) {
    if (err) *err = -EINVAL;
    return NULL;
  }
  join(j);
  if (log) *log = j->log;
  if (j->taken) {
    if (err) *err = -EALREADY;
    return NULL;
  }
  j->taken = 1;
  if (err) *err = j->err;
  struct ms_monitor *m = j->mon;
  j->mon = NULL;
  return m;
}

void ms_monitor_job_free(struct ms_monitor_job *j) {
  if (!j) return;
  __atomic_store_n(&j->cancel, 1, __ATOMIC_RELAXED); /* relaxed: the join below is the synchronisation */
  join(j);
  ms_monitor_free(j->mon);
  if (j->efd >= 0) close(j->efd);
  free(j->obj);
  free(j->log);
  free(j);
}
