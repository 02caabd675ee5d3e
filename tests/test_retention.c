/* SPDX-License-Identifier: MIT */
/* Attachments over a long life: ids past any fixed cap (300 attachments, all
 * listed), detached ones and replaced generations freed after the retention
 * (reap) or at once (release), their memfds closed, a read-out working until
 * then, and replace with a new budget. Uses the shipped monitors in
 * $MS_MONITORS. */
#include <dirent.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "megascope/attach.h"
#include "test.h"

static char mon_dir[4096];

static struct ms_monitor *open_mon(const char *name) {
  char path[4200];
  snprintf(path, sizeof path, "%s/%s.bpf.o", mon_dir, name);
  return ms_monitor_open(path, NULL);
}

static int count_fds(void) {
  DIR *d = opendir("/proc/self/fd");
  int n = 0;
  for (struct dirent *de; d && (de = readdir(d));) n += de->d_name[0] != '.';
  if (d) closedir(d);
  return n;
}

static int held(struct ms_engine *e, int id) {
  struct ms_coverage c;
  return ms_engine_attach_coverage(e, id, 0, &c) == 0;
}

int main(void) {
  const char *md = getenv("MS_MONITORS");
  snprintf(mon_dir, sizeof mon_dir, "%s", md ? md : "build/monitors");
  struct ms_monitor *probe = open_mon("class_time");
  if (!probe) {
    printf("skipped: no shipped monitors in %s\n", mon_dir);
    return 77;
  }
  ms_monitor_free(probe);
  struct ms_model_config cfg;
  ms_preset_config("tiny", MS_DTYPE_F32, &cfg);
  struct ms_model *m = ms_model_synth(&cfg, 5);
  struct ms_engine_opts eo = {.sz = sizeof eo, .n_workers = 2, .max_batch = 2, .max_ctx = 64};
  struct ms_engine *e = ms_engine_new(m, &eo, NULL);
  CHECK(e != NULL);
  int fds0 = count_fds();

  /* 300 attachments, more than the 256 the listing once held: all listed, in id order */
  enum { N = 300 };
  static int ids[N];
  for (int i = 0; i < N; i++) {
    struct ms_attach_opts ao = {.sz = sizeof ao, .interpret = 1};
    ids[i] = ms_engine_attach(e, open_mon("class_time"), &ao, NULL);
    if (ids[i] <= 0) break;
  }
  CHECK(ids[N - 1] == N);
  CHECK(ms_engine_attach_count(e) == N);
  int n = 0;
  struct ms_attach_info *info = ms_engine_attach_list_all(e, &n);
  CHECK(info && n == N);
  int ordered = 1;
  for (int i = 0; info && i < n; i++) ordered &= info[i].id == i + 1 && info[i].attached;
  CHECK(ordered);
  free(info);
  CHECK(count_fds() > fds0);

  /* detached: readable until reaped after the retention */
  ms_engine_set_detached_retention(e, 3600ull * 1000000000ull);
  for (int i = 0; i < N; i++) CHECK(ms_engine_detach(e, ids[i]) == 0);
  CHECK(ms_engine_attach_reap(e) == 0);
  CHECK(ms_engine_attach_count(e) == N);
  char buf[1 << 12];
  FILE *f = fmemopen(buf, sizeof buf, "w");
  CHECK(ms_engine_attach_write(e, ids[7], f, 1) == 0);  /* a read-out still works */
  fclose(f);
  /* release frees one now; it is gone for good, and only detached ones release */
  CHECK(ms_engine_attach_release(e, ids[0]) == 0);
  CHECK(!held(e, ids[0]));
  CHECK(ms_engine_attach_release(e, ids[0]) == -ENOENT);
  /* retention 0: the next reap frees every detached attachment */
  ms_engine_set_detached_retention(e, 0);
  CHECK(ms_engine_attach_reap(e) == N - 1);
  CHECK(ms_engine_attach_count(e) == 0);
  CHECKF(count_fds() == fds0, "%d descriptors, %d before the attachments", count_fds(), fds0);

  /* ids keep growing: an id is never reused */
  struct ms_attach_opts ao = {.sz = sizeof ao, .max_per_step = 2};
  int id = ms_engine_attach(e, open_mon("class_time"), &ao, NULL);
  CHECK(id == N + 1);
  CHECK(ms_engine_attach_release(e, id) == -MS_E_STATE);  /* attached */

  /* replace with a new budget; the old generation is freed by the reap */
  ms_engine_set_detached_retention(e, 3600ull * 1000000000ull);
  struct ms_attach_opts ro = {.sz = sizeof ro, .sample_every = 4};
  CHECK(ms_engine_replace_opts(e, id, open_mon("queueing"), &ro, NULL) == 0);
  CHECK(ms_engine_replace(e, id, open_mon("class_time"), NULL) == 0);  /* keeps sample 4 */
  info = ms_engine_attach_list_all(e, &n);
  CHECK(info && n == 1 && info[0].cov.generation == 3 && info[0].first_generation == 1);
  CHECK(info && info[0].opts.sample_every == 4 && info[0].opts.max_per_step == 0);
  free(info);
  char name[64] = "";
  struct ms_coverage c;
  CHECK(ms_engine_attach_generation(e, id, 2, name, sizeof name, &c) == 0 && !strcmp(name, "queueing.bpf.o"));
  CHECK(c.t_end != 0);
  ms_engine_set_detached_retention(e, 0);
  CHECK(ms_engine_attach_reap(e) == 2);  /* generations 1 and 2; 3 is live */
  info = ms_engine_attach_list_all(e, &n);
  CHECK(info && n == 1 && info[0].attached && info[0].first_generation == 3);
  free(info);
  CHECK(ms_engine_attach_generation(e, id, 2, NULL, 0, NULL) == -ENOENT);
  CHECK(ms_engine_detach(e, id) == 0);
  CHECK(ms_engine_attach_reap(e) == 1);
  CHECKF(count_fds() == fds0, "%d descriptors, %d before the attachments", count_fds(), fds0);

  ms_engine_free(e);
  ms_model_free(m);
  TEST_MAIN_END();
}
