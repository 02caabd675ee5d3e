/* SPDX-License-Identifier: MIT */
/* Loading and verifying a monitor off the caller's thread.
 *
 * ms_monitor_open_mem verifies every program of an object, which for an
 * adversarial program takes up to the verifier's work cap (about a second).
 * A server thread that must keep answering others (the control socket's)
 * starts a job instead, polls its descriptor with everything else, and takes
 * the monitor when it is readable. The verifier remembers what it accepted,
 * so attaching the taken monitor (whose JIT compilation proves each program
 * again) repeats no exploration on the caller's thread. */
#ifndef MEGASCOPE_MONITOR_JOB_H
#define MEGASCOPE_MONITOR_JOB_H

#include <stddef.h>

#include "megascope/monitor.h"

#ifdef __cplusplus
extern "C" {
#endif

struct ms_monitor_job;

/* Starts loading the object buf[0..size) (copied: the caller may free it at
 * once) on a thread of its own, as ms_monitor_open_mem(buf, size, name) with a
 * log of log_size bytes. NULL + errno (ENOMEM, EAGAIN no thread). */
struct ms_monitor_job *ms_monitor_job_start(const void *buf, size_t size, const char *name, size_t log_size);

/* A descriptor that becomes readable (and stays so) once the job is done: for
 * poll() beside the caller's other descriptors. */
int ms_monitor_job_fd(const struct ms_monitor_job *j);

/* 1 once the monitor is loaded or refused, 0 while it is being verified. */
int ms_monitor_job_done(const struct ms_monitor_job *j);

/* Waits for the job (at once when done), and hands over its result: the
 * monitor (the caller frees it, or attaches it), or NULL with *err the
 * negative errno ms_monitor_open_mem set (-MS_E_VERIFY rejected, -EINVAL
 * malformed, ...). *log: the verifier's log, valid until ms_monitor_job_free.
 * A second call returns NULL with *err -EALREADY. */
struct ms_monitor *ms_monitor_job_take(struct ms_monitor_job *j, int *err, const char **log);

/* Cancels the job if it still runs (its verification is refused at the
 * verifier's next check, so the wait is short) and waits for its thread;
 * frees a monitor not taken, the log and the descriptor. NULL: nothing. */
void ms_monitor_job_free(struct ms_monitor_job *j);

#ifdef __cplusplus
}
#endif
#endif
