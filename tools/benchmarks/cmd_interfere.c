/* SPDX-License-Identifier: MIT */
/* megascope interfere: real interference for tests, scripts and the
 * benchmark's demonstrations (src/bench/interfere.c does the work).
 *
 *   interfere --kind spin|membw|preempt [--cpu N | --worker W] [--for 10s]
 *   interfere --kind cold --file MODEL.gguf
 *   interfere --kind long_context [--tokens N] [--max-tokens M]
 *
 * spin, membw and preempt run one thread on one CPU until --for has passed or
 * SIGINT/SIGTERM arrives, then stop it, join it and print what it did; cold
 * drops a file's pages from the page cache once; long_context writes a chat
 * completion request with a long prompt (a request, not a process: pipe it to
 * the server). Exit codes: 0 done, 1 failed, 2 usage. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench/bench.h"
#include "cli.h"
#include "opt.h"
#include "megascope/query.h"

#define ME "interfere"

struct args {
  int kind;
  long cpu, worker;
  uint64_t for_ns, burst_ns, gap_ns;
  uint64_t buffer, seed;
  const char *file;
  long tokens, max_tokens;
  int as_json;
};

static const char *const kinds[] = {"spin", "membw", "preempt", "cold", "long_context", NULL};
static const int kind_of[] = {BI_SPIN, BI_MEMBW, BI_PREEMPT, BI_COLD, BI_LONG_CONTEXT};

static int duration(const char *opt, const char *arg, uint64_t *out) {
  if (!ms_query_parse_duration(arg, out) && *out) return 0;
  fprintf(stderr, "megascope " ME ": %s '%s': expected a duration (10s, 500ms, 2m)\n", opt, arg);
  return -1;
}
static int for_opt(void *dst, const char *arg) { return duration("--for", arg, &((struct args *)dst)->for_ns); }
static int burst_opt(void *dst, const char *arg) { return duration("--burst", arg, &((struct args *)dst)->burst_ns); }
static int gap_opt(void *dst, const char *arg) { return duration("--gap", arg, &((struct args *)dst)->gap_ns); }

#define IA struct args
static const struct cli_opt interfere_opts[] = {
    CLI_OPT_CHOICE(IA, kind, "kind", "K", kinds,
                   "spin: a thread spinning on one CPU (a noisy neighbour);\n"
                   "membw: a thread streaming a buffer far larger than the caches\n"
                   "(a memory-bandwidth hog); preempt: a thread that wakes at random\n"
                   "and spins a burst, at real-time priority where permitted (a\n"
                   "worker preempted at random); cold: drop --file's pages from the\n"
                   "page cache; long_context: write a chat completion request with a\n"
                   "long prompt on stdout (a request among short ones)"),
    CLI_OPT_INT(IA, cpu, "cpu", "N", 0, 4095, "the CPU the thread runs on"),
    CLI_OPT_INT(IA, worker, "worker", "W", 0, 4095,
                "the CPU `serve --pin-workers` gives worker W (the W-th CPU this\n"
                "process may run on)"),
    CLI_OPT_FN("for", "DURATION", for_opt, "stop after this long (default 10s, at most 1h)"),
    CLI_OPT_U64(IA, buffer, "buffer", "BYTES", "membw: the buffer (default 268435456: 256 MiB)"),
    CLI_OPT_FN("burst", "DURATION", burst_opt, "preempt: the longest burst (default 5ms; each is half to all of it)"),
    CLI_OPT_FN("gap", "DURATION", gap_opt, "preempt: the mean gap between bursts (default 20ms)"),
    CLI_OPT_U64(IA, seed, "seed", "S", "preempt: the random gaps and bursts (default 1)"),
    CLI_OPT_STR(IA, file, "file", "PATH", "cold: the file whose pages are dropped (the model)"),
    CLI_OPT_INT(IA, tokens, "tokens", "N", 1, 1000000, "long_context: the prompt's length in words (default 1500)"),
    CLI_OPT_INT(IA, max_tokens, "max-tokens", "N", 1, 1000000, "long_context: tokens to generate (default 32)"),
    CLI_OPT_FLAG(IA, as_json, "json", "print what it did as one JSON object"),
    {0}};
#undef IA

static const char interfere_head[] =
    "usage: megascope interfere --kind spin|membw|preempt [--cpu N | --worker W] [--for DURATION]\n"
    "       megascope interfere --kind cold --file MODEL.gguf\n"
    "       megascope interfere --kind long_context [--tokens N] [--max-tokens M]\n\n"
    "Real interference, as an operator meets it on a CPU server: a noisy neighbour, a\n"
    "memory-bandwidth hog, a worker preempted at random, a cold model, a long-context\n"
    "request. A thread stops after --for, on SIGINT or SIGTERM, and leaves nothing\n"
    "behind; what it did is printed on stdout when it ends.\n\n";

static volatile sig_atomic_t interrupted;
static void on_signal(int sig) {
  (void)sig;
  interrupted = 1;
}

/* A long prompt of common words (about one token each for a BPE vocabulary). */
static void long_context(const struct args *a) {
  static const char *const words[] = {"the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog",
                                      "and", "then", "runs", "into", "the", "green", "field", "near", "river"};
  const size_t nw = sizeof words / sizeof *words;
  printf("{\"messages\": [{\"role\": \"user\", \"content\": \"");
  for (long i = 0; i < a->tokens; i++) printf("%s%s", i ? " " : "", words[(size_t)i % nw]);
  printf(". Summarize this.\"}], \"max_tokens\": %ld, \"stream\": true}\n", a->max_tokens);
}

static int cold(const struct args *a) {
  char buf[512] = "";
  struct ms_textbuf log = {buf, sizeof buf, 0, 0};
  struct bench_interfere_stats st = {0};
  if (bench_evict_file(a->file, &st, &log)) {
    fprintf(stderr, "megascope " ME ": %s", buf);
    return 1;
  }
  if (a->as_json)
    printf("{\"kind\": \"cold\", \"file\": \"%s\", \"pages\": %zu, \"resident_before\": %zu, \"resident_after\": %zu}\n",
           a->file, st.file_pages, st.resident_before, st.resident_after);
  else
    printf("cold: %s: %zu pages, %zu in the page cache before, %zu after%s\n", a->file, st.file_pages,
           st.resident_before, st.resident_after,
           st.resident_after ? " (pages a running process maps stay)" : "");
  return 0;
}

static void print_stats(const struct args *a, int cpu, const struct bench_interfere_stats *st) {
  const char *name = bench_interference_name(a->kind);
  double gbs = st->wall_s > 0 ? st->bytes / st->wall_s / 1e9 : 0;
  if (a->as_json) {
    printf("{\"kind\": \"%s\", \"cpu\": %d, \"pid\": %d, \"wall_s\": %.3f, \"cpu_s\": %.3f", name, cpu, (int)getpid(),
           st->wall_s, st->cpu_s);
    if (a->kind == BI_MEMBW) printf(", \"bytes\": %.0f, \"gb_per_s\": %.2f", st->bytes, gbs);
    if (a->kind == BI_PREEMPT) printf(", \"bursts\": %llu, \"policy\": \"%s\"", (unsigned long long)st->bursts, st->policy);
    printf(", \"interrupted\": %s}\n", interrupted ? "true" : "false");
    return;
  }
  printf("%s on CPU %d: %.3f s, %.3f s of CPU time", name, cpu, st->wall_s, st->cpu_s);
  if (a->kind == BI_MEMBW) printf(", %.2f GB/s streamed (read + write)", gbs);
  if (a->kind == BI_PREEMPT) printf(", %llu bursts at %s", (unsigned long long)st->bursts, st->policy);
  printf("%s\n", interrupted ? " (stopped by a signal)" : "");
}

int cmd_interfere(int argc, char **argv) {
  struct args a = {.kind = -1, .cpu = -1, .worker = -1, .for_ns = 10000000000ull, .seed = 1, .tokens = 1500,
                   .max_tokens = 32};
  int rc = cli_parse(ME, interfere_head, interfere_opts, &a, argc, argv, NULL);
  if (rc) return rc > 0 ? 0 : 2;
  if (a.kind < 0) {
    fprintf(stderr, "megascope " ME ": --kind is required (try 'megascope " ME " --help')\n");
    return 2;
  }
  a.kind = kind_of[a.kind];
  if (a.kind == BI_LONG_CONTEXT) {
    long_context(&a);
    return 0;
  }
  if (a.kind == BI_COLD) {
    if (!a.file) {
      fprintf(stderr, "megascope " ME ": --kind cold needs --file PATH\n");
      return 2;
    }
    return cold(&a);
  }
  if (a.cpu >= 0 && a.worker >= 0) {
    fprintf(stderr, "megascope " ME ": give --cpu or --worker, not both\n");
    return 2;
  }
  if (a.for_ns > (uint64_t)(BENCH_INTERFERE_MAX_S * 1e9)) {
    fprintf(stderr, "megascope " ME ": --for: at most 1h\n");
    return 2;
  }
  int cpu = (int)a.cpu;
  if (a.worker >= 0 && (cpu = bench_worker_cpu((int)a.worker)) < 0) {
    fprintf(stderr, "megascope " ME ": --worker %ld: the CPUs this process may run on are not known\n", a.worker);
    return 1;
  }
  struct bench_interfere_opts o = {.kind = a.kind, .cpu = cpu, .seconds = (double)a.for_ns / 1e9,
                                   .buffer_bytes = (size_t)a.buffer, .seed = a.seed};
  if (a.burst_ns) o.burst_us_lo = (double)a.burst_ns / 2e3, o.burst_us_hi = (double)a.burst_ns / 1e3;
  if (a.gap_ns) o.gap_us = (double)a.gap_ns / 1e3;
  struct sigaction sa = {.sa_handler = on_signal};
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
  char buf[512] = "";
  struct ms_textbuf log = {buf, sizeof buf, 0, 0};
  struct bench_interferer *x = bench_interfere_start(&o, &log);
  if (!x) {
    fprintf(stderr, "megascope " ME ": %s", buf);
    return 1;
  }
  fprintf(stderr, "megascope " ME ": %s on CPU %d for %.3f s (pid %d)\n", bench_interference_name(a.kind), cpu,
          (double)a.for_ns / 1e9, (int)getpid());
  uint64_t until = ms_now_ns() + a.for_ns;
  while (!interrupted && ms_now_ns() < until) {
    uint64_t left = until - ms_now_ns();
    struct timespec ts = {0, (long)(left < 50000000ull ? left : 50000000ull)};
    nanosleep(&ts, NULL);
  }
  struct bench_interfere_stats st;
  bench_interfere_stop(x, &st);
  print_stats(&a, cpu, &st);
  return 0;
}
