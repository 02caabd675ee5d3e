/* SPDX-License-Identifier: MIT */
/* megascope bench: measured comparisons, each side by side in one process.
 *   decode: the megakernel against the per-op baseline and the bandwidth bound. */
#include <getopt.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "common.h"
#include "megascope/engine.h"
#include "megascope/json.h"

static void usage(FILE *f) {
  fprintf(f,
          "usage: megascope bench <benchmark> [options]\n\n"
          "benchmarks:\n"
          "  decode   decode tokens/s: megakernel vs per-op vs the memory-bandwidth bound\n"
          "  prefill  time to first token: chunked prefill vs one prompt position per step\n"
          "  hooks    what hooks cost: off vs armed vs a monitor attached (JIT, interpreted); JIT vs interpreter\n"
          "  attach   attach / replace latency over the control socket, throughput dip around them\n"
          "  sim      the simulator against published megakernel figures\n"
          "  diagnose the counterexample benchmark: injected faults, five ways of observing\n\n"
          "'megascope bench <benchmark> --help' describes one.\n");
}

static void decode_usage(FILE *f) {
  fprintf(f,
          "usage: megascope bench decode (--synthetic PRESET | --model F.gguf) [options]\n\n"
          "Runs the same requests through the megakernel and through the per-op baseline\n"
          "in one process, measures memory bandwidth with a STREAM-like read and copy on as many\n"
          "threads as the engine has workers, and reports tokens/s, their ratio, the bytes a token\n"
          "moves (weights once per step, each row's KV cache), and the fraction of each bound reached.\n\n" CLI_MODEL_HELP
          "  --batch N            concurrent requests (default 1)\n"
          "  --steps N            tokens per request (default 16)\n"
          "  --warmup N           tokens per request in an unmeasured first run (default 2)\n"
          "  --workers N          worker threads (default: one per core)\n"
          CLI_ACT_HELP
          "  --json               print the result as JSON\n"
          "  -h, --help           this text\n");
}

/* ---- STREAM-like copy and read ---- */

struct copy_arg {
  float *dst, *src;
  size_t n;
  uint64_t sum;  /* read: what was read, so the loop is not optimised away */
};

static void *copy_main(void *p) {
  struct copy_arg *a = p;
  memcpy(a->dst, a->src, a->n * sizeof(float));
  return NULL;
}

/* A read of n floats as 64-bit words, four independent XOR chains (vectorised). */
static void *read_main(void *p) {
  struct copy_arg *a = p;
  const uint64_t *w = (const uint64_t *)a->src;
  size_t n = a->n / 2;
  uint64_t x0 = 0, x1 = 0, x2 = 0, x3 = 0;
  for (size_t i = 0; i + 4 <= n; i += 4) {
    x0 ^= w[i];
    x1 ^= w[i + 1];
    x2 ^= w[i + 2];
    x3 ^= w[i + 3];
  }
  a->sum = x0 ^ x1 ^ x2 ^ x3;
  return NULL;
}

/* Best of five copies of 2 x 128 MiB split over `threads`; bytes counted as
 * STREAM does for Copy (read + write). Returns GB/s, or 0 on failure. */
static double stream_gbps(int threads, int read_only) {
  size_t n = (size_t)32 << 20;  /* floats: 128 MiB per array */
  float *a = malloc(n * sizeof(float)), *b = malloc(n * sizeof(float));
  double best = 0;
  if (!a || !b) goto out;
  for (size_t i = 0; i < n; i++) a[i] = (float)i, b[i] = 0;
  for (int rep = 0; rep < 5; rep++) {
    pthread_t th[64];
    struct copy_arg args[64];
    int T = threads > 64 ? 64 : threads;
    uint64_t t0 = ms_now_ns();
    for (int t = 0; t < T; t++) {
      size_t lo = n * (size_t)t / (size_t)T, hi = n * (size_t)(t + 1) / (size_t)T;
      args[t] = (struct copy_arg){b + lo, a + lo, hi - lo, 0};
      pthread_create(&th[t], NULL, read_only ? read_main : copy_main, &args[t]);
    }
    for (int t = 0; t < T; t++) pthread_join(th[t], NULL);
    double s = (double)(ms_now_ns() - t0) / 1e9;
    double gbps = (read_only ? 1.0 : 2.0) * (double)n * sizeof(float) / s / 1e9;
    for (int t = 0; t < T; t++) b[0] += (float)(args[t].sum & 1);  /* the reads are used */
    if (gbps > best) best = gbps;
  }
out:
  free(a);
  free(b);
  return best;
}

/* Generated tokens per second for `batch` requests of `steps` tokens each. */
static double decode_tps(const struct ms_model *m, enum ms_mode mode, int workers, int batch, int steps,
                         int warmup, int q8, int *workers_out) {
  char logbuf[1024] = "";
  struct ms_textbuf log = {logbuf, sizeof logbuf, 0, 0};
  struct ms_engine_opts eo = {.sz = sizeof eo, .n_workers = workers, .mode = mode, .max_batch = batch,
                              .max_ctx = steps + warmup + 2, .q8_activations = q8};
  struct ms_engine *e = ms_engine_new(m, &eo, &log);
  if (!e) {
    fprintf(stderr, "megascope bench: %s", logbuf);
    return -1;
  }
  *workers_out = ms_engine_n_workers(e);
  double tps = -1;
  for (int round = 0; round < 2; round++) {
    int n = round == 0 ? warmup : steps;
    if (n > 0) tps = cli_decode_tps(e, m, batch, n);
  }
  ms_engine_free(e);
  return tps;
}

static int bench_decode(int argc, char **argv) {
  static const struct option opts[] = {
      {"synthetic", required_argument, 0, 0}, {"dtype", required_argument, 0, 0},
      {"model-seed", required_argument, 0, 0}, {"batch", required_argument, 0, 0},
      {"steps", required_argument, 0, 0},     {"warmup", required_argument, 0, 0},
      {"workers", required_argument, 0, 0},   {"json", no_argument, 0, 0},
      {"model", required_argument, 0, 0},    CLI_ACT_OPTIONS,
      {"help", no_argument, 0, 'h'},          {0, 0, 0, 0}};
  struct cli_model cm = {0};
  long batch = 1, steps = 16, warmup = 2, workers = 0;
  int as_json = 0, q8 = 1, c, idx;
  optind = 1;
  while ((c = getopt_long(argc, argv, "h", opts, &idx)) != -1) {
    if (c == 'h') {
      decode_usage(stdout);
      return 0;
    }
    if (c != 0) {
      decode_usage(stderr);
      return 2;
    }
    const char *n = opts[idx].name;
    int r = cli_model_opt(&cm, n, optarg);
    if (r < 0) return 2;
    if (r) continue;
    if (!strcmp(n, "batch")) r = cli_int("--batch", optarg, 1, 4096, &batch);
    else if (!strcmp(n, "steps")) r = cli_int("--steps", optarg, 1, 1 << 20, &steps);
    else if (!strcmp(n, "warmup")) r = cli_int("--warmup", optarg, 0, 1 << 20, &warmup);
    else if (!strcmp(n, "workers")) r = cli_int("--workers", optarg, 1, 1024, &workers);
    else if (!strcmp(n, "json")) as_json = 1;
    else if (cli_act_opt(n, &q8)) continue;
    if (r) return 2;
  }
  struct ms_model *m = cli_model_load(&cm);
  if (!m) return 2;
  int W = 0;
  if (!as_json) fprintf(stderr, "bench decode: megakernel...\n");
  double mk = decode_tps(m, MS_MODE_MEGAKERNEL, (int)workers, (int)batch, (int)steps, (int)warmup, q8, &W);
  if (!as_json) fprintf(stderr, "bench decode: per-op...\n");
  double po = decode_tps(m, MS_MODE_PER_OP, (int)workers, (int)batch, (int)steps, (int)warmup, q8, &W);
  if (!as_json) fprintf(stderr, "bench decode: memory bandwidth...\n");
  double gbps = stream_gbps(W, 0), rgbps = stream_gbps(W, 1);
  /* What a step reads: every weight once, and each row's KV cache (at the
   * run's mean position: a 1-token prompt, then `steps` tokens). */
  const struct ms_model_config *mc = &m->cfg;
  size_t wbytes = ms_model_weight_bytes(m);
  double mean_pos = 1.0 + (double)(warmup + steps) / 2.0;
  double kv_per_row = 2.0 * mc->n_layers * mc->n_kv_heads * mc->head_dim * sizeof(float) * mean_pos;
  double step_bytes = (double)wbytes + kv_per_row * (double)batch;
  double bound = gbps * 1e9 / step_bytes * (double)batch, rbound = rgbps * 1e9 / step_bytes * (double)batch;
  int rc = mk > 0 && po > 0 && gbps > 0 && rgbps > 0 ? 0 : 1;
  if (as_json) {
    struct ms_json j;
    ms_json_init(&j, stdout, 1);
    ms_json_obj_begin(&j);
    ms_json_kstr(&j, "model", m->cfg.name);
    ms_json_kstr(&j, "dtype", ms_dtype_name(m->cfg.dtype));
    ms_json_kint(&j, "batch", batch);
    ms_json_kint(&j, "steps", steps);
    ms_json_kint(&j, "workers", W);
    ms_json_kbool(&j, "q8_activations", q8);
    ms_json_knum(&j, "megakernel_tokens_per_s", mk);
    ms_json_knum(&j, "per_op_tokens_per_s", po);
    ms_json_knum(&j, "ratio", mk / po);
    ms_json_kuint(&j, "weight_bytes_per_step", wbytes);
    ms_json_knum(&j, "kv_bytes_per_token", kv_per_row);
    ms_json_knum(&j, "bytes_per_token", step_bytes / (double)batch);
    ms_json_knum(&j, "stream_copy_gb_per_s", gbps);
    ms_json_knum(&j, "stream_read_gb_per_s", rgbps);
    ms_json_knum(&j, "bandwidth_bound_tokens_per_s", bound);
    ms_json_knum(&j, "read_bound_tokens_per_s", rbound);
    ms_json_knum(&j, "fraction_of_bound", mk / bound);
    ms_json_knum(&j, "fraction_of_read_bound", mk / rbound);
    ms_json_obj_end(&j);
    ms_json_end(&j);
  } else {
    printf("%s (%s%s), batch %ld, %d workers\n", m->cfg.name, ms_dtype_name(m->cfg.dtype),
           q8 ? ", 8-bit activations" : "", batch, W);
    printf("  megakernel  %10.2f tokens/s\n", mk);
    printf("  per-op      %10.2f tokens/s   (megakernel / per-op = %.3f)\n", po, mk / po);
    printf("  moved       %10.0f bytes per token (%zu weight bytes per step, %.0f KV bytes per row)\n",
           step_bytes / (double)batch, wbytes, kv_per_row);
    printf("  read bound  %10.2f tokens/s   (%.2f GB/s STREAM-like read, %d threads)\n", rbound, rgbps, W);
    printf("  copy bound  %10.2f tokens/s   (%.2f GB/s STREAM-like copy)\n", bound, gbps);
    printf("  megakernel reaches %.1f%% of the read bound, %.1f%% of the copy bound\n", 100.0 * mk / rbound,
           100.0 * mk / bound);
  }
  ms_model_free(m);
  return rc;
}

int cmd_bench(int argc, char **argv) {
  if (argc < 2) {
    usage(stderr);
    return 2;
  }
  if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
    usage(stdout);
    return 0;
  }
  if (!strcmp(argv[1], "decode")) return bench_decode(argc - 1, argv + 1);
  if (!strcmp(argv[1], "hooks")) return bench_hooks(argc - 1, argv + 1);
  if (!strcmp(argv[1], "attach")) return bench_attach(argc - 1, argv + 1);
  if (!strcmp(argv[1], "sim")) return bench_sim(argc - 1, argv + 1);
  if (!strcmp(argv[1], "prefill")) return bench_prefill(argc - 1, argv + 1);
  if (!strcmp(argv[1], "diagnose")) return bench_diagnose_main(argc - 1, argv + 1);
  fprintf(stderr, "megascope bench: unknown benchmark '%s'\n", argv[1]);
  usage(stderr);
  return 2;
}
