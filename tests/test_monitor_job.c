/* SPDX-License-Identifier: MIT */
/* A monitor loaded and verified off the caller's thread: an adversarial
 * object (tests/data/verifier/bad_deep_loop.bpf.c, refused) and a good one
 * (hist_class) verified at once on their own threads while this thread polls
 * their descriptors; each result taken once, with its log; jobs freed
 * without being taken (the adversarial one cancelled); and the good monitor's programs proven again with the
 * options the JIT uses at attach are answered by the verifier's memory
 * (stats.cached), not explored a second time. Skipped (77) without clang. */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <unistd.h>

#include "megascope/bpf.h"
#include "megascope/hook.h"
#include "megascope/monitor.h"
#include "megascope/monitor_job.h"
#include "megascope/verifier.h"
#include "test.h"

static char tmpdir[] = "/tmp/ms-monitor-job-XXXXXX";

static const char *src_root(void) {
  static char root[1024];
  const char *env = getenv("MS_SRC");
  if (env) return env;
  const char *here = __FILE__, *slash = strrchr(here, '/');
  snprintf(root, sizeof root, "%.*s/..", slash ? (int)(slash - here) : 1, slash ? here : ".");
  return root;
}

/* The object clang builds from tests/data/verifier/<name>.bpf.c (malloc'ed). */
static void *build(const char *name, size_t *size) {
  char obj[256], cmd[4096];
  struct utsname u;
  uname(&u);
  snprintf(obj, sizeof obj, "%s/%s.o", tmpdir, name);
  snprintf(cmd, sizeof cmd, "clang -O2 -g -target bpf -I'%s/include' -I/usr/include/%s-linux-gnu -c "
           "'%s/tests/data/verifier/%s.bpf.c' -o '%s'", src_root(), u.machine, src_root(), name, obj);
  if (system(cmd) != 0) return NULL;
  return ms_test_slurp(obj, size);
}

static void test_jobs(void) {
  size_t n_bad = 0, n_good = 0;
  void *bad = build("bad_deep_loop", &n_bad), *good = build("hist_class", &n_good);
  CHECK(bad && good);
  if (!bad || !good) goto out;
  struct ms_monitor_job *jb = ms_monitor_job_start(bad, n_bad, "bad_deep_loop", 1 << 16);
  struct ms_monitor_job *jg = ms_monitor_job_start(good, n_good, "hist_class", 1 << 16);
  free(bad), free(good); /* the jobs copied them */
  bad = good = NULL;
  CHECK(jb && jg);
  if (!jb || !jg) {
    ms_monitor_job_free(jb);
    ms_monitor_job_free(jg);
    goto out;
  }
  /* this thread stays free: it polls both, as a server polls its clients */
  struct pollfd pf[2] = {{ms_monitor_job_fd(jb), POLLIN, 0}, {ms_monitor_job_fd(jg), POLLIN, 0}};
  int readable = 0;
  for (int waits = 0; readable < 2 && waits < 600; waits++) { /* 60 s at most: a guard, not a measure */
    if (poll(pf, 2, 100) <= 0) continue;
    for (int i = 0; i < 2; i++)
      if (pf[i].revents & POLLIN) pf[i].fd = -1, readable++; /* readable stays so: poll it no more */
  }
  CHECKF(readable == 2 && ms_monitor_job_done(jb) && ms_monitor_job_done(jg), "the jobs did not finish");
  int err = 0;
  const char *log = NULL;
  struct ms_monitor *m = ms_monitor_job_take(jb, &err, &log);
  CHECKF(!m && err == -MS_E_VERIFY && log && strstr(log, "program too long for one run"),
         "adversarial monitor: %p err %d log %s", (void *)m, err, log ? log : "(none)");
  m = ms_monitor_job_take(jg, &err, &log);
  CHECKF(m && err == 0 && ms_monitor_prog_count(m) > 0, "hist_class: err %d: %s", err, log ? log : "");
  CHECK(log && strstr(log, "processed "));
  struct ms_monitor *again = ms_monitor_job_take(jg, &err, NULL);
  CHECK(!again && err == -EALREADY);
  /* attaching proves each program again (the JIT): a lookup now */
  for (int i = 0; m && i < ms_monitor_prog_count(m); i++) {
    int type, hook = ms_monitor_prog_hook(m, i, &type);
    struct ms_verify_opts vo = {.sz = sizeof vo, .kind = MS_VERIFY_HOOK, .prog_type = type, .hook = hook,
                                .helpers = ms_monitor_helpers(), .ctx = ms_hook_verify_ctx(type, hook)};
    struct ms_verify_stats st;
    int rc = ms_bpf_verify(ms_bpf_object_prog(ms_monitor_object(m), (size_t)i), &vo, NULL, &st);
    CHECKF(rc == 0 && st.cached, "program %d proven again: rc %d cached %u", i, rc, st.cached);
  }
  ms_monitor_free(m);
  ms_monitor_job_free(jb);
  ms_monitor_job_free(jg);
  /* jobs freed untaken, while they may still run: cancelled, waited for, freed */
  good = build("hist_class", &n_good);
  struct ms_monitor_job *j = good ? ms_monitor_job_start(good, n_good, "untaken", 4096) : NULL;
  CHECK(j);
  ms_monitor_job_free(j);
  bad = build("bad_deep_loop", &n_bad);
  j = bad ? ms_monitor_job_start(bad, n_bad, "cancelled", 4096) : NULL;
  CHECK(j);
  ms_monitor_job_free(j);
out:
  free(bad);
  free(good);
}

int main(void) {
  if (system("clang --version >/dev/null 2>&1") != 0) {
    printf("clang not found: skipped\n");
    return 77;
  }
  CHECK(mkdtemp(tmpdir));
  test_jobs();
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
  CHECK(system(cmd) == 0);
  TEST_MAIN_END();
}
