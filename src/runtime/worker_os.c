/* SPDX-License-Identifier: MIT */
/* What the operating system says of a worker thread: the time it ran, the
 * time it was runnable but another thread had its CPU (the scheduler's own
 * accounting, /proc/self/task/TID/schedstat), how often it was preempted and
 * where it last ran. No hook can see this: a task's t_end - t_begin is wall
 * time, and a worker descheduled inside a task just looks slow. explain reads
 * it to tell "this worker's tasks are slow" from "this worker's CPU is
 * shared". Read from /proc on request only; nothing on the workers' path. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "runtime/runtime_impl.h"

/* Reads /proc/self/task/TID/NAME into buf; 0 or -errno. */
static int read_task_file(int tid, const char *name, char *buf, size_t size) {
  char path[64];
  snprintf(path, sizeof path, "/proc/self/task/%d/%s", tid, name);
  FILE *f = fopen(path, "r");
  if (!f) return -errno;
  size_t n = fread(buf, 1, size - 1, f);
  buf[n] = 0;
  fclose(f);
  return n ? 0 : -EIO;
}

/* The 39th field of stat, after the command name (which may hold spaces and
 * parentheses: the fields start after its last ')'). */
static int last_cpu_of(const char *stat) {
  const char *p = strrchr(stat, ')');
  if (!p) return -1;
  int field = 2, cpu = -1;
  for (p++; *p && field < 39; p++)
    if (*p == ' ') field++;
  if (field == 39 && sscanf(p, "%d", &cpu) != 1) cpu = -1;
  return cpu;
}

int ms_engine_worker_os(const struct ms_engine *e, int worker, struct ms_worker_os *out) {
  memset(out, 0, sizeof *out);
  out->pinned_cpu = out->last_cpu = -1;
  if (!e || worker < 0 || worker >= e->n_workers) return -EINVAL;
  const struct worker *w = &e->workers[worker];
  out->pinned_cpu = w->pinned_cpu;
  int tid = atomic_load_explicit(&((struct worker *)w)->tid, memory_order_relaxed);
  if (tid <= 0) return -ENOENT;
  char buf[2048];
  int rc = read_task_file(tid, "schedstat", buf, sizeof buf);
  unsigned long long run = 0, wait = 0;
  if (!rc && sscanf(buf, "%llu %llu", &run, &wait) == 2) out->run_ns = run, out->runqueue_ns = wait;
  else if (!rc) rc = -EIO;
  if (!read_task_file(tid, "stat", buf, sizeof buf)) out->last_cpu = last_cpu_of(buf);
  if (!read_task_file(tid, "status", buf, sizeof buf)) {
    const char *p = strstr(buf, "nonvoluntary_ctxt_switches:");
    unsigned long long n;
    if (p && sscanf(p + strlen("nonvoluntary_ctxt_switches:"), "%llu", &n) == 1) out->preempted = n;
  }
  return rc;
}
