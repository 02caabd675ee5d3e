/* SPDX-License-Identifier: MIT */
/* Real interference, produced for real: what an operator meets on a CPU server
 * beside the injected faults of fault.h. A noisy neighbour (a thread spinning on
 * one CPU), a memory-bandwidth hog (a thread streaming through a buffer far
 * larger than the caches, on one CPU), a worker preempted at random (a thread on
 * the worker's CPU that sleeps a random interval, then spins a burst of a few
 * ms, at real-time priority where permitted), a cold model (the model file's
 * pages dropped from the page cache before the engine maps it). The fifth kind,
 * a long-context request among short ones, is a request: the benchmark submits
 * it (run.c, observe.c) and `megascope interfere --kind long_context` writes one.
 *
 * DESIGN. One interferer is one thread, started by bench_interfere_start and
 * joined by bench_interfere_stop; nothing else runs. The thread pins itself to
 * its CPU, then works until the stop flag is raised or its deadline passes
 * (every kind is bounded in time: BENCH_INTERFERE_MAX_S at most), checking both
 * at least every 100 us of work. `stop` is the only shared word: a relaxed
 * store/load would do for the spin, but the preemptor sleeps on a condition
 * variable, so the stop is raised under its mutex and broadcast. start returns
 * once the thread runs (its buffer touched, its priority set), so that the
 * interference covers what the caller starts next. Stop joins the thread and
 * frees its buffer: nothing is left behind. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "bench/bench.h"

static const char *const kind_names[BI_COUNT] = {"none", "spin", "membw", "preempt", "cold", "long_context"};

const char *bench_interference_name(int k) { return k >= 0 && k < BI_COUNT ? kind_names[k] : "?"; }

int bench_interference_parse(const char *s, int *k) {
  for (int i = 0; i < BI_COUNT; i++)
    if (!strcmp(s, kind_names[i])) {
      *k = i;
      return 0;
    }
  return -EINVAL;
}

int bench_worker_cpu(int w) {
  cpu_set_t allowed;
  if (w < 0 || sched_getaffinity(0, sizeof allowed, &allowed) || CPU_COUNT(&allowed) < 1) return -1;
  int want = w % CPU_COUNT(&allowed), n = 0;
  for (int i = 0; i < CPU_SETSIZE; i++)
    if (CPU_ISSET(i, &allowed) && n++ == want) return i;
  return -1;
}

/* ---- the page cache ---- */

/* Resident pages of the file mapped at [p, p + len). */
static size_t resident(void *p, size_t len) {
  size_t page = (size_t)sysconf(_SC_PAGESIZE), n = (len + page - 1) / page, r = 0;
  unsigned char *v = malloc(n ? n : 1);
  if (!v || mincore(p, len, v)) {
    free(v);
    return 0;
  }
  for (size_t i = 0; i < n; i++) r += v[i] & 1;
  free(v);
  return r;
}

static int count_resident(int fd, size_t len, size_t *out) {
  void *p = mmap(NULL, len, PROT_READ, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return -errno;
  *out = resident(p, len);
  munmap(p, len);
  return 0;
}

int bench_evict_file(const char *path, struct bench_interfere_stats *st, struct ms_textbuf *log) {
  struct stat sb;
  int fd = open(path, O_RDONLY | O_CLOEXEC), rc = 0;
  if (fd < 0 || fstat(fd, &sb)) {
    rc = -errno;
    ms_textbuf_printf(log, "cold: %s: %s\n", path, strerror(errno));
    goto out;
  }
  size_t len = (size_t)sb.st_size, page = (size_t)sysconf(_SC_PAGESIZE);
  st->file_pages = (len + page - 1) / page;
  if (!len) goto out;
  if ((rc = count_resident(fd, len, &st->resident_before))) goto fail;
  /* pages a running process maps stay: only the unmapped are dropped */
  if ((rc = -posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED))) goto fail;
  if ((rc = count_resident(fd, len, &st->resident_after))) goto fail;
  goto out;
fail:
  ms_textbuf_printf(log, "cold: %s: %s\n", path, strerror(-rc));
out:
  if (fd >= 0) close(fd);
  return rc;
}

/* ---- the threads ---- */

struct bench_interferer {
  struct bench_interfere_opts o;
  pthread_t th;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  _Atomic int stop;      /* raised by stop (under mu, for the preemptor's wait) */
  int started, failed;   /* under mu: the thread runs / could not prepare */
  uint64_t until_ns;     /* the deadline (CLOCK_MONOTONIC, ms_now_ns) */
  char *buf;             /* membw: the buffer */
  struct bench_interfere_stats st;
  char err[160];
};

static int stopping(struct bench_interferer *x) {
  return atomic_load_explicit(&x->stop, memory_order_relaxed) || ms_now_ns() >= x->until_ns;
}

/* About 100 us of integer work that the compiler cannot drop. */
static uint64_t churn(uint64_t v) {
  for (int i = 0; i < 20000; i++) v = v * 6364136223846793005ull + 1442695040888963407ull;
  return v;
}

static uint64_t rnd(uint64_t *s) {
  uint64_t x = (*s += 0x9e3779b97f4a7c15ull);
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

static double unit(uint64_t *s) { return (double)(rnd(s) >> 11) / 9007199254740992.0; }

/* Spins, or with a duty below 1 spins that share of every 10 ms period and
 * sleeps the rest (a neighbour that is busy part of the time). */
static void run_spin(struct bench_interferer *x) {
  volatile uint64_t sink = 0;
  uint64_t v = x->o.seed | 1;
  const uint64_t period = 10000000;
  int partial = x->o.duty > 0 && x->o.duty < 1;
  uint64_t t = ms_now_ns();
  do {
    if (!partial) {
      v = churn(v);
      continue;
    }
    uint64_t busy_end = t + (uint64_t)(x->o.duty * (double)period), next = t + period;
    while (ms_now_ns() < busy_end && !stopping(x)) v = churn(v);
    uint64_t now = ms_now_ns();
    if (now < next) {
      struct timespec ts = {(time_t)((next - now) / 1000000000ull), (long)((next - now) % 1000000000ull)};
      nanosleep(&ts, NULL);
    }
    t = next > now ? next : now;
  } while (!stopping(x));  /* one round at least, however late the thread started */
  sink = v;
  (void)sink;
}

/* Streams one half of the buffer into the other and back, 1 MiB at a time:
 * every byte read once and written once a pass. */
static void run_membw(struct bench_interferer *x) {
  size_t half = x->o.buffer_bytes / 2, chunk = 1 << 20;
  char *a = x->buf, *b = x->buf + half;
  for (int dir = 0, first = 1; first || !stopping(x); dir ^= 1)
    for (size_t off = 0; off + chunk <= half && (first || !stopping(x)); off += chunk, first = 0) {
      memcpy((dir ? a : b) + off, (dir ? b : a) + off, chunk);
      x->st.bytes += 2.0 * (double)chunk;
    }
}

/* The policy the preemptor runs at: SCHED_FIFO when permitted (it then takes
 * the CPU from any normal thread at once), else the highest nice it may set. */
static void preempt_priority(struct bench_interferer *x) {
  struct sched_param sp = {.sched_priority = 10};
  if (!pthread_setschedparam(pthread_self(), SCHED_FIFO, &sp)) {
    snprintf(x->st.policy, sizeof x->st.policy, "SCHED_FIFO priority %d", sp.sched_priority);
    return;
  }
  for (int nice = -20; nice <= 0; nice += 5)
    if (!setpriority(PRIO_PROCESS, (id_t)gettid(), nice)) {
      snprintf(x->st.policy, sizeof x->st.policy, "SCHED_OTHER nice %d (SCHED_FIFO not permitted)", nice);
      return;
    }
  snprintf(x->st.policy, sizeof x->st.policy, "SCHED_OTHER (no priority permitted)");
}

static void run_preempt(struct bench_interferer *x) {
  uint64_t s = x->o.seed ? x->o.seed : 1;
  while (!stopping(x) || !x->st.bursts) {
    /* exponential gaps: the bursts land anywhere in a step */
    double gap_ns = -log(1 - unit(&s)) * x->o.gap_us * 1e3;
    uint64_t wake = ms_now_ns() + (uint64_t)gap_ns;
    if (wake > x->until_ns) wake = x->until_ns;
    struct timespec ts = {(time_t)(wake / 1000000000ull), (long)(wake % 1000000000ull)};
    pthread_mutex_lock(&x->mu);
    while (!atomic_load_explicit(&x->stop, memory_order_relaxed) && ms_now_ns() < wake)
      if (pthread_cond_timedwait(&x->cv, &x->mu, &ts) == ETIMEDOUT) break;
    pthread_mutex_unlock(&x->mu);
    if (stopping(x) && x->st.bursts) break;  /* one burst at least, however late it started */
    double burst = x->o.burst_us_lo + (x->o.burst_us_hi - x->o.burst_us_lo) * unit(&s);
    uint64_t end = ms_now_ns() + (uint64_t)(burst * 1e3), v = s;
    while (ms_now_ns() < end && (!stopping(x) || !x->st.bursts)) v = churn(v);
    s ^= v & 1;
    x->st.bursts++;
  }
}

static int pin_self(int cpu) {
  if (cpu < 0) return 0;
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(cpu, &one);
  return -pthread_setaffinity_np(pthread_self(), sizeof one, &one);
}

static void *interfere_main(void *arg) {
  struct bench_interferer *x = arg;
  int rc = pin_self(x->o.cpu);
  if (rc) snprintf(x->err, sizeof x->err, "cannot run on CPU %d: %s", x->o.cpu, strerror(-rc));
  if (!rc && x->o.kind == BI_MEMBW) {
    /* allocated and touched on its own CPU (its memory node) before it counts */
    x->buf = mmap(NULL, x->o.buffer_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (x->buf == MAP_FAILED) {
      x->buf = NULL;
      rc = -ENOMEM;
      snprintf(x->err, sizeof x->err, "membw: cannot map %zu bytes", x->o.buffer_bytes);
    } else {
      memset(x->buf, 1, x->o.buffer_bytes);
    }
  }
  if (!rc && x->o.kind == BI_PREEMPT) preempt_priority(x);
  pthread_mutex_lock(&x->mu);
  x->until_ns = ms_now_ns() + (uint64_t)(x->o.seconds * 1e9);  /* from when it is ready */
  x->started = 1;
  x->failed = rc != 0;
  pthread_cond_broadcast(&x->cv);
  pthread_mutex_unlock(&x->mu);
  if (rc) return NULL;
  struct timespec c0, c1;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c0);
  uint64_t t0 = ms_now_ns();
  switch (x->o.kind) {
  case BI_SPIN: run_spin(x); break;
  case BI_MEMBW: run_membw(x); break;
  case BI_PREEMPT: run_preempt(x); break;
  default: break;
  }
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c1);
  x->st.wall_s = (double)(ms_now_ns() - t0) / 1e9;
  x->st.cpu_s = (double)(c1.tv_sec - c0.tv_sec) + (double)(c1.tv_nsec - c0.tv_nsec) / 1e9;
  return NULL;
}

void bench_interfere_defaults(struct bench_interfere_opts *o) {
  if (o->buffer_bytes < (2u << 20)) o->buffer_bytes = (size_t)256 << 20;
  if (!(o->burst_us_hi > 0)) o->burst_us_lo = 2500, o->burst_us_hi = 5000;
  if (o->burst_us_lo > o->burst_us_hi) o->burst_us_lo = o->burst_us_hi;
  if (!(o->gap_us > 0)) o->gap_us = 20000;
  if (!(o->seconds > 0) || o->seconds > BENCH_INTERFERE_MAX_S) o->seconds = BENCH_INTERFERE_MAX_S;
}

struct bench_interferer *bench_interfere_start(const struct bench_interfere_opts *o, struct ms_textbuf *log) {
  if (o->kind != BI_SPIN && o->kind != BI_MEMBW && o->kind != BI_PREEMPT) {
    ms_textbuf_printf(log, "interference %s is not a thread (cold: bench_evict_file; long_context: a request)\n",
                      bench_interference_name(o->kind));
    errno = EINVAL;
    return NULL;
  }
  struct bench_interferer *x = calloc(1, sizeof *x);
  if (!x) return NULL;
  x->o = *o;
  bench_interfere_defaults(&x->o);
  x->until_ns = UINT64_MAX;  /* set by the thread when it is ready */
  pthread_mutex_init(&x->mu, NULL);
  pthread_condattr_t ca;  /* the preemptor's waits are deadlines on ms_now_ns's clock */
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&x->cv, &ca);
  pthread_condattr_destroy(&ca);
  int rc = pthread_create(&x->th, NULL, interfere_main, x);
  if (rc) {
    ms_textbuf_printf(log, "interference %s: cannot start a thread: %s\n", bench_interference_name(o->kind),
                      strerror(rc));
    pthread_cond_destroy(&x->cv);
    pthread_mutex_destroy(&x->mu);
    free(x);
    errno = rc;
    return NULL;
  }
  pthread_mutex_lock(&x->mu);
  while (!x->started) pthread_cond_wait(&x->cv, &x->mu);
  int failed = x->failed;
  pthread_mutex_unlock(&x->mu);
  if (failed) {
    ms_textbuf_printf(log, "interference %s: %s\n", bench_interference_name(o->kind), x->err);
    bench_interfere_stop(x, NULL);
    errno = EINVAL;
    return NULL;
  }
  return x;
}

void bench_interfere_stop(struct bench_interferer *x, struct bench_interfere_stats *st) {
  if (!x) return;
  pthread_mutex_lock(&x->mu);
  atomic_store_explicit(&x->stop, 1, memory_order_relaxed);  /* the mutex orders it for the waiter */
  pthread_cond_broadcast(&x->cv);
  pthread_mutex_unlock(&x->mu);
  pthread_join(x->th, NULL);
  if (x->buf) munmap(x->buf, x->o.buffer_bytes);
  if (st) *st = x->st;
  pthread_cond_destroy(&x->cv);
  pthread_mutex_destroy(&x->mu);
  free(x);
}
