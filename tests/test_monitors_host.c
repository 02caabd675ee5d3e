/* SPDX-License-Identifier: MIT */
/* Monitors on the device, run on the CPU: the persistent kernel
 * (src/cuda/megakernel.cuh) on CPU threads as in test_megakernel_host
 * (tests/emu/harness.h), with the REAL device hook code (src/cuda/bpf_dev.cuh:
 * attach table, interpreter, maps, coverage, QSBR) and the REAL host side
 * (src/cuda/monitors.cu, compiled by g++ through tests/emu/monitors_emu.cc on
 * a CUDA runtime over host memory, tests/emu/cuda_runtime.h). Runs on every
 * machine, GPU or not. Checks, on tiny (bf16), 3 CTAs, requests fed while
 * the kernel runs:
 *   - a monitor attached before the launch sees every task: class_time's
 *     histogram and began counts sum to steps x tasks, its coverage says so;
 *     so does a query (src/query) compiled to a bundle, read back through
 *     the query's own writer with class names;
 *   - while the kernel runs: attach class_time, see it execute, replace it by
 *     queueing (generation 2), see that execute, detach; a detached id is
 *     refused (-ENOENT) by detach and replace; a final generation's maps
 *     agree exactly with its coverage (nothing ran after quiescence);
 *   - budgets: max_per_step and sample_every throttle; a sched_hint monitor
 *     (attn_priority) runs on task_ready; a ring buffer (step_trace) fills
 *     and then counts lost records;
 *   - a program calling a helper the device lacks is refused with a message
 *     naming program, instruction and helper; an attach that does not fit the
 *     monitor arena is refused by name and leaves nothing behind;
 *   - nothing the attach, replace and detach calls do could wait for the
 *     running kernel: no allocation, free, memset or synchronisation
 *     (tests/emu/cuda_runtime.h counts them; an allocation made on purpose is
 *     counted, so the count is live);
 *   - map read-outs while programs write are whole copies (the SMs' seqlock);
 *   - coverage adds up (eligible = executed + throttled once quiet, failed 0),
 *     maps come back as JSON (ms_monitor_write_maps), tokens equal the CPU
 *     engine's, and every device allocation is freed with the table. */
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/host_emu.h"
#include "cuda/bpf_dev.cuh"
#include "cuda/monitors.h"
#include "emu/cuda_runtime.h"
#include "megascope/monitor.h"
#include "megascope/query.h"
#include "test.h"

__thread struct msd_emu_dim blockIdx;

#include "emu/harness.h"

#define NCTA 3
#define NREQ 30
#define NEW 40
#define WAIT_MS 20000

static char logbuf[4096];
static struct ms_textbuf tb = {logbuf, sizeof logbuf, 0, 0};

static void log_reset(void) {
  tb.len = 0;
  logbuf[0] = 0;
}

static struct ms_monitor *open_monitor(const char *name) {
  const char *dir = getenv("MS_MONITORS");
  char path[1024];
  snprintf(path, sizeof path, "%s/%s.bpf.o", dir ? dir : "build/monitors", name);
  log_reset();
  struct ms_monitor *m = ms_monitor_open(path, &tb);
  CHECKF(m != NULL, "open %s: %s", path, logbuf);
  return m;
}

/* A query compiled against the plan, as a monitor: the same bundle the
 * control socket's attach takes. */
static struct ms_monitor *open_query(const char *src, const struct ms_plan *p, struct ms_query **q) {
  log_reset();
  struct ms_query_schema *s = ms_query_schema_of_plan(p, &tb);
  *q = s ? ms_query_compile(src, s, NULL, &tb) : NULL;
  ms_query_schema_free(s);
  void *b = NULL;
  size_t n = 0;
  struct ms_monitor *m = *q && !ms_query_bundle(*q, &b, &n) ? ms_monitor_open_mem(b, n, "query", &tb) : NULL;
  free(b);
  CHECKF(m != NULL, "query %s: %s", src, logbuf);
  return m;
}

/* The query's read-out of the device maps: the sum of map 0's values, and
 * the class names it printed. */
static double query_total(struct ms_cuda_mon *mon, int id, const struct ms_query *q, char **json) {
  struct ms_bpf_map **maps = NULL;
  int n = 0;
  CHECK(ms_cuda_mon_sync_maps(mon, id) == 0);
  CHECK(ms_cuda_mon_maps(mon, id, &maps, &n) == 0);
  struct ms_query_maps src;
  ms_query_maps_of_engine(&src, maps);
  size_t len = 0;
  FILE *f = open_memstream(json, &len);
  struct ms_query_print po = {.sz = sizeof po, .as_json = 1};
  ms_query_write(q, &src, NULL, &po, f);
  fclose(f);
  double t = 0;
  for (const char *v = *json; (v = strstr(v, "\"value\":")); v += 8) t += strtod(v + 8, NULL);
  return t;
}

static struct ms_coverage cov_of(struct ms_cuda_mon *mon, int id) {
  struct ms_coverage c;
  memset(&c, 0, sizeof c);
  int rc = ms_cuda_mon_coverage(mon, id, &c);
  CHECKF(rc == 0, "coverage %d: %d", id, rc);
  return c;
}

/* Requests go to the kernel as it needs them: a few at the start, more each
 * time it has finished what it was given, so it runs through every stage. */
static void feed(struct harness *h, int n) {
  uint32_t s = h->host.n_submitted;
  s = s + (uint32_t)n > NREQ ? NREQ : s + (uint32_t)n;
  MSD_EMU_FENCE(__ATOMIC_RELEASE);
  h->host.n_submitted = s;
}

/* Waits until attachment id's coverage has generation gen and executed > 0. */
static int wait_executed(struct harness *h, struct ms_cuda_mon *mon, int id, uint32_t gen) {
  for (int ms = 0; ms < WAIT_MS; ms++) {
    struct ms_coverage c = cov_of(mon, id);
    if (c.generation == gen && c.executed > 0) return 1;
    if (h->host.n_finished == h->host.n_submitted) {
      if (h->host.n_submitted == NREQ) break;
      feed(h, 2);
    }
    usleep(1000);
  }
  return 0;
}

static struct ms_bpf_map *map_named(struct ms_cuda_mon *mon, int id, const char *name) {
  struct ms_bpf_map **maps = NULL;
  int n = 0;
  CHECK(ms_cuda_mon_sync_maps(mon, id) == 0);
  CHECK(ms_cuda_mon_maps(mon, id, &maps, &n) == 0);
  for (int i = 0; i < n; i++)
    if (!strcmp(ms_bpf_map_info(maps[i])->name, name)) return maps[i];
  CHECKF(0, "attachment %d has no map %s", id, name);
  return NULL;
}

struct sum {
  uint32_t n_workers;
  uint64_t total;
};

static int add_values(void *user, const void *key, const void *values) {
  struct sum *s = user;
  const uint64_t *v = values;
  for (uint32_t w = 0; w < s->n_workers; w++) s->total += v[w];
  return 0;
}

/* The sum of a per-worker u64 map's values over keys and workers. */
static uint64_t map_sum(struct ms_bpf_map *m) {
  struct sum s = {ms_bpf_map_workers(m), 0};
  if (m) ms_bpf_map_foreach(m, add_values, &s);
  return s.total;
}

static void check_quiet_cov(const char *what, const struct ms_coverage *c, uint32_t gen) {
  CHECKF(c->generation == gen, "%s: generation %u, want %u", what, c->generation, gen);
  CHECKF(c->eligible == c->executed + c->throttled, "%s: eligible %llu, executed %llu + throttled %llu", what,
         (unsigned long long)c->eligible, (unsigned long long)c->executed, (unsigned long long)c->throttled);
  CHECKF(c->failed == 0, "%s: %llu failed runs", what, (unsigned long long)c->failed);
  CHECKF(c->t_start > 0 && (!c->t_end || c->t_end >= c->t_start), "%s: epoch %llu..%llu", what,
         (unsigned long long)c->t_start, (unsigned long long)c->t_end);
}

/* A program calling helper 7 (get_prandom_u32: the CPU lacks it too, so the
 * verifier would refuse such an object; the helper set of a verified program
 * is patched instead, as a CPU-only helper would look to the device). */
static void check_unsupported(struct ms_cuda_mon *mon) {
  struct ms_monitor *m = open_monitor("class_time");
  if (!m) return;
  const struct ms_bpf_object *obj = ms_monitor_object(m);
  int patched = -1;
  for (int p = 0; p < ms_monitor_prog_count(m) && patched < 0; p++) {
    size_t n;
    struct ms_bpf_insn *in = (struct ms_bpf_insn *)ms_bpf_prog_insns(ms_bpf_object_prog(obj, (size_t)p), &n);
    for (size_t i = 0; i < n && patched < 0; i++)
      if (in[i].code == (MS_BPF_JMP | MS_BPF_CALL) && in[i].src_reg == 0 && in[i].imm == MS_HELPER_LOG2) {
        in[i].imm = 7;
        patched = (int)i;
      }
  }
  CHECKF(patched >= 0, "class_time calls no ms_log2");
  log_reset();
  int rc = ms_cuda_mon_attach(mon, m, NULL, &tb);
  char want[96];
  snprintf(want, sizeof want, "program 'on_end' of class_time.bpf.o: insn %d: helper 7 is not supported on the device",
           patched);
  CHECKF(rc == -MS_E_UNSUPP && strstr(logbuf, want), "unsupported helper: rc %d, log: %s", rc, logbuf);
  ms_monitor_free(m);  /* the caller keeps it on failure */
}

/* An attach that does not fit the arena (small: made for this): -ENOMEM, a
 * message naming the arena, and what was built is gone. */
static void check_arena_full(struct ms_cuda_mon *small) {
  struct ms_monitor *m = open_monitor("queueing");
  if (!m) return;
  uint64_t live = ms_emu_cuda_live;
  size_t size, used0, used, kept;
  ms_cuda_mon_arena(small, &size, &used0, &kept);
  log_reset();
  int rc = ms_cuda_mon_attach(small, m, NULL, &tb);
  ms_cuda_mon_arena(small, &size, &used, &kept);
  CHECKF(rc == -ENOMEM && strstr(logbuf, "out of memory: the monitor arena"), "arena full: rc %d, log: %s", rc,
         logbuf);
  CHECKF(used == used0 && kept == 0, "a refused attach left %zu arena bytes in use (%zu kept)", used - used0, kept);
  CHECKF(ms_emu_cuda_live == live, "an attach made %lld device allocations", (long long)(ms_emu_cuda_live - live));
  ms_monitor_free(m);
}

static void check_json(struct ms_cuda_mon *mon, int id, const struct ms_plan *p, const char *map) {
  struct ms_bpf_map **maps = NULL;
  int n = 0;
  struct ms_coverage c = cov_of(mon, id);
  CHECK(ms_cuda_mon_sync_maps(mon, id) == 0);
  CHECK(ms_cuda_mon_maps(mon, id, &maps, &n) == 0);
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  int rc = ms_monitor_write_maps(ms_cuda_mon_name(mon, id), maps, n, NCTA, &c, p, f, 1);
  fclose(f);
  CHECKF(rc == 0 && buf && strstr(buf, map) && strstr(buf, "\"executed\""), "write_maps %d: %.300s", rc,
         buf ? buf : "");
  free(buf);
}

static void check_live(void) {
  struct ms_model_config cfg;
  CHECK(ms_preset_config("tiny", MS_DTYPE_BF16, &cfg) == 0);
  struct ms_model *m = ms_model_synth(&cfg, 1);
  int32_t *ref = calloc((size_t)NREQ * NEW, sizeof *ref);
  harness_cpu_tokens(m, NREQ, NEW, ref);

  log_reset();
  struct ms_cuda_mon *mon = ms_cuda_mon_new(NCTA, 0, &tb);
  struct ms_cuda_mon *small = ms_cuda_mon_new(NCTA, 64 << 10, &tb);
  CHECKF(mon != NULL && small != NULL, "ms_cuda_mon_new: %s", logbuf);
  if (!mon || !small) return;
  struct harness *h = calloc(1, sizeof *h);
  CHECK(harness_setup(h, m, NCTA, NREQ, NEW, ms_cuda_mon_device(mon), NULL) == 0);
  const struct ms_plan *p = h->plan;
  h->host.n_submitted = 4;
  h->host.exit_when_idle = 0;  /* the host says when: after the last stage */

  /* before the launch: sees every task of every step */
  int all = ms_cuda_mon_attach(mon, open_monitor("class_time"), NULL, &tb);
  CHECKF(all > 0, "attach class_time before the launch: %d %s", all, logbuf);
  struct ms_query *query = NULL;
  struct ms_monitor *qm = open_query("task_end { @[class] = count() }", p, &query);
  int qid = qm ? ms_cuda_mon_attach(mon, qm, NULL, &tb) : -1;
  CHECKF(qid > 0, "attach a query before the launch: %d %s", qid, logbuf);

  struct harness_bg bg;
  CHECK(harness_start(&bg, h, NCTA) == 0);
  ms_cuda_mon_set_running(mon, 1);
  /* the harness's CTAs are a kernel the emulated runtime did not launch: say it runs */
  __atomic_store_n(&ms_emu_cuda_kernels, 1, __ATOMIC_RELEASE);
  const uint64_t blocking0 = ms_emu_cuda_blocking;

  /* while it runs */
  log_reset();
  int id = ms_cuda_mon_attach(mon, open_monitor("class_time"), NULL, &tb);
  CHECKF(id > 0, "attach class_time: %d %s", id, logbuf);
  struct ms_attach_opts per_step = {.sz = sizeof per_step, .max_per_step = 1};
  int budget = ms_cuda_mon_attach(mon, open_monitor("class_time"), &per_step, &tb);
  struct ms_attach_opts sampled = {.sz = sizeof sampled, .sample_every = 4};
  int sample = ms_cuda_mon_attach(mon, open_monitor("queueing"), &sampled, &tb);
  int hint = ms_cuda_mon_attach(mon, open_monitor("attn_priority"), NULL, &tb);
  int ring = ms_cuda_mon_attach(mon, open_monitor("step_trace"), NULL, &tb);  /* 4 KiB ring, never consumed */
  CHECKF(budget > 0 && sample > 0 && hint > 0 && ring > 0, "attach: %d %d %d %d %s", budget, sample, hint, ring,
         logbuf);
  check_unsupported(mon);
  check_arena_full(small);

  CHECKF(wait_executed(h, mon, id, 1), "class_time never executed while the kernel ran");
  struct ms_coverage c1 = cov_of(mon, id);
  CHECK(c1.generation == 1 && c1.t_end == 0 && c1.failed == 0);
  CHECK(!strcmp(ms_cuda_mon_name(mon, id), "class_time.bpf.o"));

  log_reset();
  struct ms_monitor *q = open_monitor("queueing");
  int rc = ms_cuda_mon_replace(mon, id, q, &tb);
  CHECKF(rc == 0, "replace: %d %s", rc, logbuf);
  if (rc) ms_monitor_free(q);
  CHECKF(wait_executed(h, mon, id, 2), "queueing (generation 2) never executed while the kernel ran");
  CHECK(!strcmp(ms_cuda_mon_name(mon, id), "queueing.bpf.o"));
  CHECK(ms_cuda_mon_detach(mon, id) == 0);
  uint64_t steps_at_detach = h->host.steps;
  CHECKF(!h->host.exited, "the kernel exited before the detach: the test did not run it live");
  /* attach, replace, detach and their read-outs made no call that could wait for the kernel */
  CHECKF(ms_emu_cuda_blocking == blocking0, "%llu calls that may wait for the running kernel, the last %s",
         (unsigned long long)(ms_emu_cuda_blocking - blocking0), ms_emu_cuda_blocking_what);
  {  /* and the count is live: a device allocation now is one */
    ms_emu_cuda_malloc_free();
    CHECKF(ms_emu_cuda_blocking == blocking0 + 2 && !strcmp(ms_emu_cuda_blocking_what, "cudaFreeAsync"),
           "a cudaMallocAsync and a cudaFreeAsync beside the kernel were not counted (%llu)",
           (unsigned long long)(ms_emu_cuda_blocking - blocking0));
  }

  /* detached: refused, its final generation readable */
  CHECK(ms_cuda_mon_detach(mon, id) == -ENOENT);
  struct ms_monitor *again = open_monitor("class_time");
  CHECK(ms_cuda_mon_replace(mon, id, again, &tb) == -ENOENT);
  ms_monitor_free(again);
  CHECK(ms_cuda_mon_detach(mon, 999) == -ENOENT && ms_cuda_mon_name(mon, 999) == NULL);
  struct ms_coverage c2 = cov_of(mon, id);
  check_quiet_cov("queueing after detach", &c2, 2);
  CHECK(c2.executed > 0 && c2.throttled == 0 && c2.t_end > 0);
  /* nothing ran after quiescence: the retired maps hold exactly what coverage counts */
  uint64_t queued = map_sum(map_named(mon, id, "hist_class_queue_ns"));
  CHECKF(queued == c2.executed, "queueing's histogram holds %llu, coverage says %llu runs",
         (unsigned long long)queued, (unsigned long long)c2.executed);

  /* the rest of the requests, then the exit */
  h->host.n_submitted = NREQ;
  h->host.exit_when_idle = 1;
  CHECK(harness_join(&bg) == 0);
  CHECKF(ms_cuda_mon_torn(mon) == 0, "%llu map read-outs gave up on a torn copy while the kernel ran",
         (unsigned long long)ms_cuda_mon_torn(mon));
  {  /* an SM inside a firing (its word odd) for good: a read-out gives up rather than copy torn maps */
    struct msd_qs *qs = ms_cuda_mon_device(mon)->qs;
    uint64_t w0 = __atomic_load_n(&qs[1].wseq, __ATOMIC_RELAXED);
    __atomic_store_n(&qs[1].wseq, w0 + 1, __ATOMIC_RELEASE);
    int busy = ms_cuda_mon_sync_maps(mon, all);
    __atomic_store_n(&qs[1].wseq, w0 + 2, __ATOMIC_RELEASE);
    CHECKF(busy == -EAGAIN && ms_cuda_mon_torn(mon) == 1 && ms_cuda_mon_sync_maps(mon, all) == 0,
           "a read-out beside an SM inside a firing: %d (torn %llu)", busy, (unsigned long long)ms_cuda_mon_torn(mon));
  }
  ms_cuda_mon_set_running(mon, 0);
  __atomic_store_n(&ms_emu_cuda_kernels, 0, __ATOMIC_RELEASE);
  uint64_t steps = h->host.steps;
  CHECKF(steps > steps_at_detach, "no step after the detach (%llu)", (unsigned long long)steps);

  int same = 1;
  for (int i = 0; i < NREQ * NEW; i++) same &= ref[i] == h->out[i];
  CHECKF(same, "tokens differ from the CPU engine's with monitors attached");
  CHECK(h->host.exited && h->host.n_finished == NREQ && h->host.tokens == (uint64_t)NREQ * NEW);
  CHECK(cov_of(mon, id).executed == c2.executed);  /* final since the detach */

  /* attached before the launch: every task of every step, begin and end */
  uint64_t tasks = steps * (uint64_t)harness_body_tasks(p);
  struct ms_coverage ca = cov_of(mon, all);
  check_quiet_cov("class_time from the start", &ca, 1);
  CHECKF(ca.executed == 2 * tasks && ca.throttled == 0, "class_time executed %llu, want 2 x %llu",
         (unsigned long long)ca.executed, (unsigned long long)tasks);
  uint64_t ended = map_sum(map_named(mon, all, "hist_class_task_ns"));
  uint64_t began = map_sum(map_named(mon, all, "began_by_class"));
  CHECKF(ended == tasks && began == tasks, "class_time's maps: %llu ended, %llu began, want %llu each",
         (unsigned long long)ended, (unsigned long long)began, (unsigned long long)tasks);
  CHECK(ca.first_step == 0 && ca.last_step == steps - 1);
  check_json(mon, all, p, "hist_class_task_ns");
  /* the query on the device: every task by class, read back and named as on the CPU */
  if (qid > 0) {
    char *json = NULL;
    double total = query_total(mon, qid, query, &json);
    CHECKF(total == (double)tasks && strstr(json, "\"blk.1.attn\""), "the query on the device: %.0f of %llu tasks: %.300s",
           total, (unsigned long long)tasks, json ? json : "");
    free(json);
  }
  ms_query_free(query);

  /* budgets */
  struct ms_coverage cb = cov_of(mon, budget), cs = cov_of(mon, sample), ch = cov_of(mon, hint);
  check_quiet_cov("max_per_step 1", &cb, 1);
  check_quiet_cov("sample_every 4", &cs, 1);
  check_quiet_cov("attn_priority", &ch, 1);
  CHECKF(cb.throttled > 0 && cb.executed > 0, "max_per_step: executed %llu throttled %llu",
         (unsigned long long)cb.executed, (unsigned long long)cb.throttled);
  /* one run per step per SM at most, begin and end together: only the workers run tasks */
  CHECKF(cb.executed <= (NCTA - 1) * (cb.last_step - cb.first_step + 1), "max_per_step 1 ran %llu times in steps %llu..%llu",
         (unsigned long long)cb.executed, (unsigned long long)cb.first_step, (unsigned long long)cb.last_step);
  CHECKF(cs.throttled > 0 && cs.executed > 0 && cs.executed < cs.eligible / 2,
         "sample_every 4: executed %llu of %llu", (unsigned long long)cs.executed, (unsigned long long)cs.eligible);
  CHECK(map_sum(map_named(mon, sample, "hist_class_queue_ns")) == cs.executed);
  CHECKF(ch.executed > 0 && ch.throttled == 0, "attn_priority (sched_hint) executed %llu",
         (unsigned long long)ch.executed);
  check_json(mon, id, p, "hist_class_queue_ns");
  /* a ring buffer nobody consumes: records until it is full, then lost ones */
  struct ms_coverage cr = cov_of(mon, ring);
  check_quiet_cov("step_trace", &cr, 1);
  CHECKF(cr.executed > 0 && cr.lost > 0 && cr.lost < cr.executed, "step_trace: executed %llu lost %llu",
         (unsigned long long)cr.executed, (unsigned long long)cr.lost);
  check_json(mon, ring, p, "step_events");

  /* detached with the kernel stopped: the same numbers */
  CHECK(ms_cuda_mon_detach(mon, all) == 0);
  struct ms_coverage cd = cov_of(mon, all);
  CHECK(cd.executed == ca.executed && cd.t_end > 0);
  CHECK(map_sum(map_named(mon, all, "hist_class_task_ns")) == tasks);

  printf("%llu steps; class_time from the start: %llu runs; live class_time -> queueing: %llu + %llu runs "
         "(generation %u); max_per_step 1: %llu run, %llu throttled; sample_every 4: %llu of %llu; "
         "attn_priority: %llu; tokens %s\n",
         (unsigned long long)steps, (unsigned long long)ca.executed, (unsigned long long)c1.executed,
         (unsigned long long)c2.executed, c2.generation, (unsigned long long)cb.executed,
         (unsigned long long)cb.throttled, (unsigned long long)cs.executed, (unsigned long long)cs.eligible,
         (unsigned long long)ch.executed, same ? "equal" : "DIFFER");

  ms_cuda_mon_free(mon);
  ms_cuda_mon_free(small);
  CHECKF(ms_emu_cuda_live == 0, "%llu device allocations outlive the table", (unsigned long long)ms_emu_cuda_live);
  ms_emu_cuda_drain();
  harness_teardown(h);
  free(h);
  free(ref);
  ms_model_free(m);
}

int main(void) {
  const char *dir = getenv("MS_MONITORS");
  char path[1024];
  snprintf(path, sizeof path, "%s/class_time.bpf.o", dir ? dir : "build/monitors");
  if (access(path, R_OK)) {
    printf("skipped: no %s (set MS_MONITORS to the built monitors)\n", path);
    return 77;
  }
  check_live();
  TEST_MAIN_END();
}
