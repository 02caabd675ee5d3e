/* SPDX-License-Identifier: MIT */
/* megascope bench: measured comparisons, each side by side in one process.
 *   decode: the megakernel against the per-op baseline and the bandwidth bound. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "cli.h"
#include "common.h"
#include "opt.h"
#include "megascope/engine.h"
#include "megascope/json.h"
#include "megascope/transport.h"

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

static uint64_t read_plain(const uint8_t *p, size_t n, int k);

/* A read of n floats as one stream of 64-bit words (the compiler's loads). */
static void *read_main(void *p) {
  struct copy_arg *a = p;
  a->sum = read_plain((const uint8_t *)a->src, a->n * sizeof(float), 1);
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

/* ---- the read bound: the step's bytes, read as the kernels read ---- */

/* A 128 MiB stream measures DRAM; a model that fits the last-level cache is
 * read from the cache, by the engine and by any read of its bytes alike
 * (SmolLM2's 97 MB of weights ran at 1.96x such a bound on a Xeon with a
 * 480 MiB L3: no bound). So the read bound reads a buffer the size of the
 * bytes a step reads, in huge pages as the packed weights are, with the
 * widest loads the kernels take (ms_cpu_level), split over as many threads
 * as the engine has workers, each thread's share as 1, 4 or 16 streams
 * read side by side, the fastest counted: a GEMV reads several rows at once,
 * and on that Xeon one thread read 97 MB at 15 GB/s as one stream, 29 as 16
 * (the engine's steps read it at 20). */
#define STEP_READ_MIN_BYTES ((size_t)64 << 20) /* a pass reads at least this (small buffers: again) */
#define STEP_READ_MAX_BYTES ((size_t)1 << 30)  /* a larger step is read from memory all the same */
#define STEP_READ_CHUNK 256                    /* bytes of one stream read before the next stream's */

struct step_read_arg {
  const uint8_t *p;
  size_t n, reps;  /* n: a multiple of streams x STEP_READ_CHUNK */
  int level, streams;
  uint64_t sum;  /* what was read, so the loop is not optimised away */
};

#if defined(__x86_64__)
__attribute__((target("avx512f"))) static uint64_t read_avx512(const uint8_t *p, size_t n, int k) {
  __m512i x0 = _mm512_setzero_si512(), x1 = x0, x2 = x0, x3 = x0;
  size_t len = n / (size_t)k;
  for (size_t i = 0; i + STEP_READ_CHUNK <= len; i += STEP_READ_CHUNK)
    for (int s = 0; s < k; s++) {
      const uint8_t *q = p + (size_t)s * len + i;
      x0 = _mm512_xor_si512(x0, _mm512_load_si512(q));
      x1 = _mm512_xor_si512(x1, _mm512_load_si512(q + 64));
      x2 = _mm512_xor_si512(x2, _mm512_load_si512(q + 128));
      x3 = _mm512_xor_si512(x3, _mm512_load_si512(q + 192));
    }
  return (uint64_t)_mm512_reduce_add_epi64(_mm512_xor_si512(_mm512_xor_si512(x0, x1), _mm512_xor_si512(x2, x3)));
}

__attribute__((target("avx2"))) static uint64_t read_avx2(const uint8_t *p, size_t n, int k) {
  __m256i x0 = _mm256_setzero_si256(), x1 = x0, x2 = x0, x3 = x0;
  size_t len = n / (size_t)k;
  for (size_t i = 0; i + STEP_READ_CHUNK <= len; i += STEP_READ_CHUNK)
    for (int s = 0; s < k; s++)
      for (int c = 0; c < STEP_READ_CHUNK; c += 128) {
        const uint8_t *q = p + (size_t)s * len + i + c;
        x0 = _mm256_xor_si256(x0, _mm256_load_si256((const __m256i *)q));
        x1 = _mm256_xor_si256(x1, _mm256_load_si256((const __m256i *)(q + 32)));
        x2 = _mm256_xor_si256(x2, _mm256_load_si256((const __m256i *)(q + 64)));
        x3 = _mm256_xor_si256(x3, _mm256_load_si256((const __m256i *)(q + 96)));
      }
  __m256i x = _mm256_xor_si256(_mm256_xor_si256(x0, x1), _mm256_xor_si256(x2, x3));
  return (uint64_t)_mm256_extract_epi64(x, 0) ^ (uint64_t)_mm256_extract_epi64(x, 3);
}
#endif

static uint64_t read_plain(const uint8_t *p, size_t n, int k) {
  uint64_t x0 = 0, x1 = 0, x2 = 0, x3 = 0;
  size_t len = n / (size_t)k;
  for (size_t i = 0; i + STEP_READ_CHUNK <= len; i += STEP_READ_CHUNK)
    for (int s = 0; s < k; s++) {
      const uint64_t *w = (const uint64_t *)(p + (size_t)s * len + i);
      for (int c = 0; c < STEP_READ_CHUNK / 8; c += 4) x0 ^= w[c], x1 ^= w[c + 1], x2 ^= w[c + 2], x3 ^= w[c + 3];
    }
  return x0 ^ x1 ^ x2 ^ x3;
}

static void *step_read_main(void *v) {
  struct step_read_arg *a = v;
  for (size_t r = 0; r < a->reps; r++) {
#if defined(__x86_64__)
    if (a->level >= MS_CPU_AVX512_VNNI) a->sum ^= read_avx512(a->p, a->n, a->streams);
    else if (a->level >= MS_CPU_AVX2) a->sum ^= read_avx2(a->p, a->n, a->streams);
    else
#endif
      a->sum ^= read_plain(a->p, a->n, a->streams);
  }
  return NULL;
}

/* A buffer of a step's bytes (in huge pages, as the packed weights are),
 * split over `threads` threads, each share a multiple of 16 chunks. */
struct step_read {
  uint8_t *buf;
  size_t per, len;  /* a thread's bytes; all of them */
  int T, level, streams;  /* streams: a thread's, of the fastest pass (step_read_best) */
  const char *loads;
};

static int step_read_open(struct step_read *s, int threads, size_t bytes) {
  int T = threads < 1 ? 1 : threads > 64 ? 64 : threads, level = ms_cpu_level();
  if (bytes > STEP_READ_MAX_BYTES) bytes = STEP_READ_MAX_BYTES;
  size_t unit = 16 * STEP_READ_CHUNK, per = (bytes / (size_t)T + unit - 1) / unit * unit;
  *s = (struct step_read){.per = per, .len = per * (size_t)T, .T = T, .level = level, .streams = 16,
                          .loads = level >= MS_CPU_AVX512_VNNI ? "avx512" : level >= MS_CPU_AVX2 ? "avx2" : "portable"};
  if (!(s->buf = ms_huge_map(s->len))) return -1;
  for (size_t i = 0; i + 8 <= s->len; i += 8) memcpy(s->buf + i, &i, sizeof i);  /* committed, not the zero page */
  return 0;
}

static void step_read_close(struct step_read *s) {
  if (s->buf) ms_huge_unmap(s->buf, s->len);
  s->buf = NULL;
}

/* Seconds to read the buffer `reps` times on its threads, `streams` a thread. */
static double step_read_pass(struct step_read *s, int streams, size_t reps) {
  pthread_t th[64];
  struct step_read_arg args[64];
  uint64_t sink = 0, t0 = ms_now_ns();
  for (int t = 0; t < s->T; t++) {
    args[t] = (struct step_read_arg){s->buf + s->per * (size_t)t, s->per, reps, s->level, streams, 0};
    pthread_create(&th[t], NULL, step_read_main, &args[t]);
  }
  for (int t = 0; t < s->T; t++) pthread_join(th[t], NULL), sink ^= args[t].sum;
  double sec = (double)(ms_now_ns() - t0) / 1e9;
  s->buf[0] = (uint8_t)sink;  /* the reads are used */
  return sec;
}

/* GB/s of the fastest of seven passes a stream count (after one that warms
 * the buffer, as the engine's warm-up steps warmed its weights); s->streams:
 * the streams a thread of the fastest pass. */
static double step_read_best(struct step_read *s) {
  static const int ks[] = {1, 4, 16};
  size_t reps = s->len >= STEP_READ_MIN_BYTES ? 1 : STEP_READ_MIN_BYTES / s->len + 1;
  double best = 0;
  for (size_t ki = 0; ki < sizeof ks / sizeof ks[0]; ki++)
    for (int pass = 0; pass < 8; pass++) {
      double gbps = (double)s->len * (double)reps / step_read_pass(s, ks[ki], reps) / 1e9;
      if (pass > 0 && gbps > best) best = gbps, s->streams = ks[ki];
    }
  return best;
}

/* step_read_best over a buffer of `bytes` on `threads` threads; 0 on failure. */
static double step_read_gbps(int threads, size_t bytes, const char **loads, int *streams) {
  struct step_read s;
  *streams = 0;
  if (step_read_open(&s, threads, bytes)) return 0;
  double best = step_read_best(&s);
  *loads = s.loads, *streams = s.streams;
  step_read_close(&s);
  return best;
}

/* ---- the engines, alternating ---- */

enum { ENG_MK, ENG_PER_OP, N_ENG };
static const char *const eng_name[N_ENG] = {"megakernel", "per-op"};
static const char *const eng_key[N_ENG] = {"megakernel", "per_op"};

struct decode_run {
  int batch, steps, warmup, workers, q8, rounds;
  enum ms_backend backend;
  int sms;         /* cuda: CTAs; 0: every SM */
  int fresh;       /* one engine at a time, made for each run (cuda: one resident kernel holds every SM) */
  int null_check;  /* --null: the per-op member is a second megakernel engine */
  int kv_f16;      /* both engines keep their KV cache in f16 */
  int n_workers, q8_on;  /* as the engines report them */
  int tp;                /* with tx: the ranks */
  int comm_timeout_ms;
  struct ms_transport *tx;  /* tensor parallelism across processes; NULL: one process */
  struct cli_dist_pack *pack;  /* with tx: this rank's weights, packed by the first engine */
  struct ms_engine *e[N_ENG];
  double *tps[N_ENG];  /* [rounds] */
  /* cpu, one process: a read of the bytes `steps` steps read, as a member of
   * each round (the machine's speed moves between rounds: a fraction taken
   * within a round compares the engine and the read in the same minute) */
  double step_bytes;   /* what a step reads (weights, each row's KV cache) */
  struct step_read rd; /* rd.buf NULL: no read in the rounds */
  double *rtps;        /* [rounds]: the read's tokens/s */
  double rfrac, rlo, rhi;  /* megakernel / read within a round: median, range */
  double rbest;            /* the read's best tokens/s */
  double best[N_ENG];
  double ratio[N_ENG]; /* median over rounds of tps / per-op tps in the same round */
  double lo[N_ENG], hi[N_ENG];
  /* across processes: measured rounds' receives, waits and wall time per engine */
  uint64_t recv[N_ENG], wait_ns[N_ENG], wall_ns[N_ENG], msg_bytes[N_ENG];
};

static struct ms_engine *decode_engine(const struct ms_model *m, const struct decode_run *d, int which) {
  char logbuf[1024] = "";
  struct ms_textbuf log = {logbuf, sizeof logbuf, 0, 0};
  struct ms_engine_opts eo = {.sz = sizeof eo, .n_workers = d->workers,
                              .mode = which == ENG_PER_OP && !d->null_check ? MS_MODE_PER_OP : MS_MODE_MEGAKERNEL,
                              .max_batch = d->batch, .max_ctx = d->steps + d->warmup + 2,
                              .q8_activations = d->q8, .kv_f16 = d->kv_f16, .backend = d->backend,
                              .cuda_sms = d->sms,
                              .tp = d->tx ? d->tp : 0, .transport = d->tx,
                              .comm_timeout_ms = d->comm_timeout_ms};
  if (d->tx) eo.weight_rows_hook = cli_dist_pack, eo.weight_rows_user = d->pack;
  struct ms_engine *e = ms_engine_new(m, &eo, &log);
  if (!e) fprintf(stderr, "megascope bench: %s", logbuf);
  return e;
}

static int decode_open(const struct ms_model *m, struct decode_run *d, int k) {
  if (!(d->e[k] = decode_engine(m, d, k))) return -1;
  d->n_workers = ms_engine_n_workers(d->e[k]);
  d->q8_on = ms_engine_q8_active(d->e[k]);
  return d->warmup > 0 && cli_decode_tps_at(d->e[k], m, d->batch, d->warmup, d->tx != NULL) < 0 ? -1 : 0;
}

/* The rounds' read: the warm buffer, its stream count chosen by the
 * fastest of step_read_best's passes. */
static int decode_read_open(struct decode_run *d) {
  if (d->fresh || d->tx || d->step_bytes <= 0) return 0;
  if (step_read_open(&d->rd, d->n_workers, (size_t)d->step_bytes)) {  /* the rounds go on without it */
    fprintf(stderr, "bench decode: no memory for a second copy of a step's %.1f MB beside the engines: the "
            "rounds run without the read\n", d->step_bytes / 1e6);
    return 0;
  }
  if (!(d->rtps = calloc((size_t)d->rounds, sizeof(double)))) return -1;
  return step_read_best(&d->rd) > 0 ? 0 : -1;
}

/* Round r's member k: an engine's tokens/s, or (k == N_ENG) the read's:
 * the bytes of `steps` steps (at least STEP_READ_MIN_BYTES, so that starting
 * its threads does not weigh on a small model) at the rate they were read. */
static int decode_member(const struct ms_model *m, struct decode_run *d, int k, int r) {
  if (k == N_ENG) {
    size_t reps = (size_t)d->steps, least = STEP_READ_MIN_BYTES / d->rd.len + 1;
    if (reps < least) reps = least;
    step_read_pass(&d->rd, d->rd.streams, reps);  /* unmeasured: see decode_rounds */
    double sec = step_read_pass(&d->rd, d->rd.streams, reps);
    d->rtps[r] = (double)d->rd.len * (double)reps / sec / d->step_bytes * (double)d->batch;
    return 0;
  }
  if (d->fresh && decode_open(m, d, k)) return -1;
  struct ms_comm_stats c0, c1;
  ms_engine_comm_stats(d->e[k], &c0);
  uint64_t t0 = ms_now_ns();
  if ((d->tps[k][r] = cli_decode_tps_at(d->e[k], m, d->batch, d->steps, d->tx != NULL)) <= 0) return -1;
  d->wall_ns[k] += ms_now_ns() - t0;
  ms_engine_comm_stats(d->e[k], &c1);
  d->recv[k] += c1.received - c0.received;
  d->wait_ns[k] += c1.wait_ns - c0.wait_ns;
  d->msg_bytes[k] += c1.bytes_received - c0.bytes_received;
  if (d->fresh) {
    ms_engine_free(d->e[k]);
    d->e[k] = NULL;
  }
  return 0;
}

/* Round r runs every engine once, which of them first rotating with r so that
 * none always runs first (after a quiet spell) or last. With the read as a
 * member, each is measured after a run of its own kind: the read reads twice,
 * the first unmeasured, then an unmeasured run of the engine measured next
 * (the round's first), then the engines. On a 2-vCPU Xeon (260 MiB
 * of last-level cache, the weights and the read's copy in it) what ran before
 * weighed on a whole run: an engine measured right after the read ran
 * 3-5% slower (two warm-up steps did not bring it back, 50 ms idle took half),
 * the read right after an engine 2.5-5%; and with the three rotated the
 * megakernel followed the read in two rounds of three. --null measured that: a
 * second megakernel engine in the per-op member, 30 rounds: 0.951-0.976 in
 * seven runs with the rotation, 0.993 and 1.001 without the read, 0.965-1.013
 * in five in this order. */
static int decode_rounds(const struct ms_model *m, struct decode_run *d, int verbose) {
  for (int k = 0; k < N_ENG; k++) {
    if (!(d->tps[k] = calloc((size_t)d->rounds, sizeof(double)))) return -1;
    if (!d->fresh && decode_open(m, d, k)) return -1;
  }
  if (decode_read_open(d)) return -1;
  for (int r = 0; r < d->rounds; r++) {
    if (verbose) fprintf(stderr, "bench decode: round %d of %d\n", r + 1, d->rounds);
    if (d->rd.buf && (decode_member(m, d, N_ENG, r) ||
                      cli_decode_tps_at(d->e[r % N_ENG], m, d->batch, d->steps, d->tx != NULL) <= 0))
      return -1;
    for (int i = 0; i < N_ENG; i++)
      if (decode_member(m, d, (r + i) % N_ENG, r)) return -1;
  }
  double *q = calloc((size_t)d->rounds, sizeof(double));
  if (!q) return -1;
  for (int k = 0; k < N_ENG; k++) {
    d->best[k] = 0;
    for (int r = 0; r < d->rounds; r++) {
      if (d->tps[k][r] > d->best[k]) d->best[k] = d->tps[k][r];
      q[r] = d->tps[k][r] / d->tps[ENG_PER_OP][r];
    }
    d->ratio[k] = cli_median(q, d->rounds);  /* sorts q ascending */
    d->lo[k] = q[0];
    d->hi[k] = q[d->rounds - 1];
  }
  if (d->rd.buf) {
    for (int r = 0; r < d->rounds; r++) {
      q[r] = d->tps[ENG_MK][r] / d->rtps[r];
      if (d->rtps[r] > d->rbest) d->rbest = d->rtps[r];
    }
    d->rfrac = cli_median(q, d->rounds);
    d->rlo = q[0];
    d->rhi = q[d->rounds - 1];
  }
  free(q);
  return 0;
}

static void decode_stop(struct decode_run *d) {
  for (int k = 0; k < N_ENG; k++) {
    if (d->e[k]) ms_engine_free(d->e[k]);
    d->e[k] = NULL;
  }
}

static void decode_free(struct decode_run *d) {
  decode_stop(d);
  step_read_close(&d->rd);
  for (int k = 0; k < N_ENG; k++) free(d->tps[k]);
  free(d->rtps);
}

struct decode_args {
  struct cli_model cm;
  struct cli_backend be;
  long batch, steps, warmup, workers, rounds, tp, comm_timeout_ms;
  int as_json, q8, null_check, kv_f16;
};

/* The bytes a step reads on the device: matrices as bf16, vectors and the
 * router f32 (how src/cuda/upload.cu holds them). */
static size_t device_weight_bytes(const struct ms_model *m) {
#define W(w) ((w).rows > 0 ? (size_t)(w).rows * (size_t)(w).cols * ((w).rows > 1 ? 2 : 4) : 0)
  size_t b = W(m->out_norm) + W(m->lm_head);
  for (int l = 0; l < m->cfg.n_layers; l++) {
    const struct ms_layer_weights *L = &m->layers[l];
    b += W(L->attn_norm) + W(L->wq) + W(L->wk) + W(L->wv) + W(L->wo) + W(L->ffn_norm) + W(L->w_gate) +
         W(L->w_up) + W(L->w_down) + W(L->bq) + W(L->bk) + W(L->bv) + W(L->attn_post_norm) +
         W(L->ffn_post_norm) + 2 * W(L->router);  /* f32: twice the bf16 count */
    if (m->cfg.qk_norm) b += W(L->q_norm) + W(L->k_norm);
    for (int e = 0; e < m->cfg.n_experts; e++) b += W(L->exp_gate[e]) + W(L->exp_up[e]) + W(L->exp_down[e]);
  }
#undef W
  return b;
}

#define DA struct decode_args
static const struct cli_opt decode_opts[] = {
    CLI_OPT_GROUP(DA, cm, cli_model_opts),
    CLI_OPT_INT(DA, batch, "batch", "N", 1, 4096, "concurrent requests (default 1)"),
    CLI_OPT_INT(DA, steps, "steps", "N", 1, 1 << 20, "tokens per request (default 16)"),
    CLI_OPT_INT(DA, warmup, "warmup", "N", 0, 1 << 20, "tokens per request in an unmeasured first run (default 2)"),
    CLI_OPT_GROUP(DA, workers, cli_workers_opts),
    CLI_OPT_GROUP(DA, be, cli_backend_opts),
    CLI_OPT_INT(DA, rounds, "rounds", "N", 1, 1000,
                "alternating rounds, each engine once per round (default 3):\n"
                "the best of each is reported, and the median of the ratios\n"
                "within a round"),
    CLI_OPT_GROUP(DA, q8, cli_act_opts),
    CLI_OPT_INT(DA, tp, "tp", "N", 1, 64,
                "under mpirun -np N: one engine in N processes, a device each\n"
                "(tensor parallelism across processes, cpu backend)"),
    CLI_OPT_INT(DA, comm_timeout_ms, "comm-timeout-ms", "N", 1, 1 << 30,
                "under mpirun: stop every rank when one waits on another this long\n"
                "(default 10000)"),
    CLI_OPT_FLAG(DA, null_check, "null",
                 "a check of the rounds themselves: the per-op member is a second\n"
                 "megakernel engine, so the ratio is what the order of the rounds\n"
                 "alone gives (1 when fair)"),
    CLI_OPT_FLAG(DA, kv_f16, "kv-f16", "both engines keep their KV cache in f16 (run --kv-f16)"),
    CLI_OPT_FLAG(DA, as_json, "json", "print the result as JSON"),
    {0}};
#undef DA

static const char decode_head[] =
    "usage: megascope bench decode [--model F.gguf | --synthetic PRESET] [options]\n\n"
    "With no model named: SmolLM2-135M-Instruct from the model cache (~/.cache/megascope).\n\n"
    "Runs the same requests through the megakernel and through the per-op baseline\n"
    "in one process, alternating in rounds, then measures memory bandwidth on as many threads\n"
    "as the engine has workers, and reports tokens/s, their ratio, the bytes a token moves\n"
    "(weights once per step, each row's KV cache), and the fraction of each bound reached.\n"
    "The read bound reads a buffer of a step's bytes with the kernels' widest loads (a model\n"
    "that fits the cache is read from it, as the engine reads it); the copy bound is a\n"
    "STREAM-like copy of 2 x 128 MiB. On the cpu backend in one process each round also\n"
    "reads the bytes its steps read (64 MiB at least), beside the engines: the megakernel's\n"
    "fraction of that read within a round (median and range over the rounds) compares the\n"
    "two in the same minute, where the read bound's fastest pass, taken after the rounds,\n"
    "may fall in a quieter or a busier one than the engine's best round. Each member is\n"
    "measured after a run of its own kind (what ran before slowed a whole run): a round\n"
    "reads twice, the first unmeasured, runs the engine measured next once unmeasured, then\n"
    "both engines, which first alternating (--null checks the engines' part).\n\n";

static int bench_decode(int argc, char **argv) {
  struct decode_args a = {.batch = 1, .steps = 16, .warmup = 2, .rounds = 3, .q8 = 1};
  int rc0 = cli_parse("bench decode", decode_head, decode_opts, &a, argc, argv, NULL);
  if (rc0) return rc0 > 0 ? 0 : 2;
  struct cli_model cm = a.cm;
  long batch = a.batch, steps = a.steps, warmup = a.warmup, workers = a.workers, rounds = a.rounds;
  int as_json = a.as_json, q8 = a.q8;
  const struct ms_backend_info *be = ms_backend_info((enum ms_backend)a.be.backend);
  if (be->virtual_clock) {
    fprintf(stderr, "megascope bench decode: --backend %s: the simulator's figures are `bench sim`'s\n", be->name);
    return 2;
  }
  const int cuda = be->on_device;
  struct ms_device_info dev;
  char why[256] = "";
  if (cuda && ms_backend_device((enum ms_backend)a.be.backend, &dev, why, sizeof why)) {
    fprintf(stderr, "megascope bench decode: --backend %s: %s\n", be->name, why);
    return 1;
  }
  int dist_failed;
  struct ms_transport *tx = cli_dist_start("bench decode", (int)a.tp, &cm, argc, argv, &dist_failed);
  if (dist_failed) return 2;
  if (!tx && a.tp > 1) {
    fprintf(stderr, "megascope bench decode: --tp %ld: run it under mpirun -np %ld (one process a device)\n", a.tp,
            a.tp);
    return 2;
  }
  cm.unpacked = tx != NULL;  /* a rank packs the rows it reads once its first engine knows them */
  struct ms_model *m = cli_model_load(&cm);
  if (!m) {
    cli_dist_end(tx);
    return 2;
  }
  /* What a step reads: every weight once (as the device holds them on cuda),
   * and each row's KV cache (at the run's mean position: a 1-token prompt,
   * then `steps` tokens). */
  size_t wbytes = cuda ? device_weight_bytes(m) : ms_model_weight_bytes(m);
  double mean_pos = 1.0 + (double)(warmup + steps) / 2.0;
  double kv_per_row = (double)ms_engine_kv_position_bytes(m, a.kv_f16) * mean_pos;
  double step_bytes = (double)wbytes + kv_per_row * (double)batch;
  struct cli_dist_pack pack = {.m = m, .rank = tx ? tx->rank : 0};
  struct decode_run d = {.step_bytes = step_bytes, .batch = (int)batch, .steps = (int)steps, .warmup = (int)warmup,
                         .workers = (int)workers, .q8 = q8, .rounds = (int)rounds,
                         .backend = (enum ms_backend)a.be.backend, .sms = (int)a.be.sms, .fresh = cuda,
                         .null_check = a.null_check, .kv_f16 = a.kv_f16,
                         .tp = (int)a.tp, .tx = tx, .pack = &pack, .comm_timeout_ms = (int)a.comm_timeout_ms};
  if (decode_rounds(m, &d, !as_json && (!tx || tx->rank == 0))) {
    for (int k = 0; k < N_ENG; k++) cli_dist_check_failed("bench decode", tx, d.e[k]);
    decode_free(&d);
    ms_model_free(m);
    cli_dist_end(tx);
    return 1;
  }
  int W = d.n_workers, q8_on = d.q8_on;
  decode_stop(&d);  /* the bandwidth is measured with no engine thread about */
  if (!as_json) fprintf(stderr, "bench decode: memory bandwidth...\n");
  const char *loads = "";
  int streams = 0;
  /* cuda: the device's HBM peak (2 x memory clock x bus width) for every bound */
  double gbps = cuda ? dev.peak_gbs : stream_gbps(W, 0), sgbps = cuda ? dev.peak_gbs : stream_gbps(W, 1);
  double rgbps;
  if (cuda) {
    rgbps = dev.peak_gbs;
  } else if (d.rd.buf) {  /* the rounds' buffer, already of a step's bytes and warm */
    rgbps = step_read_best(&d.rd);
    loads = d.rd.loads, streams = d.rd.streams;
  } else {
    rgbps = step_read_gbps(W, (size_t)step_bytes, &loads, &streams);
  }
  double bound = gbps * 1e9 / step_bytes * (double)batch, rbound = rgbps * 1e9 / step_bytes * (double)batch;
  /* The copy bound streams DRAM; a step whose bytes fit the last-level cache is read from the cache
   * (SmolLM2's 98 MB on a Xeon with 480 MiB of L3 ran at 1.6x it), so there it bounds nothing. */
  long llc = sysconf(_SC_LEVEL3_CACHE_SIZE);
  int in_cache = !cuda && llc > 0 && step_bytes < (double)llc;
  double mk = d.best[ENG_MK], po = d.best[ENG_PER_OP];
  int rc = gbps > 0 && rgbps > 0 && sgbps > 0 ? 0 : 1;
  if (as_json) {
    struct ms_json j;
    ms_json_init(&j, stdout, 1);
    ms_json_obj_begin(&j);
    ms_json_kstr(&j, "model", m->cfg.name);
    ms_json_kstr(&j, "dtype", ms_dtype_name(m->cfg.dtype));
    ms_json_kint(&j, "batch", batch);
    ms_json_kint(&j, "steps", steps);
    ms_json_kint(&j, "workers", W);
    if (tx) ms_json_kint(&j, "ranks", tx->size);
    ms_json_kstr(&j, "backend", ms_backend_name(d.backend));
    if (cuda) ms_json_kstr(&j, "device", dev.name);
    ms_json_kint(&j, "rounds", rounds);
    ms_json_kbool(&j, "q8_activations", q8_on);
    ms_json_kbool(&j, "null", a.null_check);  /* per_op: a second megakernel engine */
    ms_json_kbool(&j, "kv_f16", a.kv_f16);
    ms_json_knum(&j, "megakernel_tokens_per_s", mk);
    ms_json_knum(&j, "per_op_tokens_per_s", po);
    ms_json_knum(&j, "ratio", d.ratio[ENG_MK]);
    ms_json_knum(&j, "ratio_min", d.lo[ENG_MK]);
    ms_json_knum(&j, "ratio_max", d.hi[ENG_MK]);
    ms_json_key(&j, "rounds_tokens_per_s");
    ms_json_obj_begin(&j);
    for (int k = 0; k < N_ENG; k++) {
      ms_json_key(&j, eng_key[k]);
      ms_json_arr_begin(&j);
      for (int r = 0; r < d.rounds; r++) ms_json_num(&j, d.tps[k][r]);
      ms_json_arr_end(&j);
    }
    if (d.rtps) {
      ms_json_key(&j, "read");
      ms_json_arr_begin(&j);
      for (int r = 0; r < d.rounds; r++) ms_json_num(&j, d.rtps[r]);
      ms_json_arr_end(&j);
    }
    ms_json_obj_end(&j);
    if (tx) {
      ms_json_key(&j, "remote_waits");
      ms_json_obj_begin(&j);
      for (int k = 0; k < N_ENG; k++) {
        ms_json_key(&j, eng_key[k]);
        ms_json_obj_begin(&j);
        ms_json_kuint(&j, "shares_received", d.recv[k]);
        ms_json_kuint(&j, "bytes_received", d.msg_bytes[k]);
        ms_json_knum(&j, "wait_share", d.wall_ns[k] ? (double)d.wait_ns[k] / ((double)d.wall_ns[k] * W) : 0);
        ms_json_knum(&j, "wait_us_per_share", d.recv[k] ? (double)d.wait_ns[k] / 1e3 / (double)d.recv[k] : 0);
        ms_json_knum(&j, "wait_us_per_token",
                     (double)d.wait_ns[k] / 1e3 / ((double)d.batch * d.steps * d.rounds));
        ms_json_obj_end(&j);
      }
      ms_json_obj_end(&j);
    }
    ms_json_kuint(&j, "weight_bytes_per_step", wbytes);
    ms_json_knum(&j, "kv_bytes_per_token", kv_per_row);
    ms_json_knum(&j, "bytes_per_token", step_bytes / (double)batch);
    ms_json_knum(&j, "stream_copy_gb_per_s", gbps);
    ms_json_knum(&j, "stream_read_gb_per_s", sgbps);
    ms_json_knum(&j, "step_read_gb_per_s", rgbps);
    if (!cuda) ms_json_kstr(&j, "step_read_loads", loads), ms_json_kint(&j, "step_read_streams", streams);
    ms_json_knum(&j, "bandwidth_bound_tokens_per_s", bound);
    ms_json_knum(&j, "read_bound_tokens_per_s", rbound);
    if (d.rtps) ms_json_knum(&j, "read_in_rounds_tokens_per_s", d.rbest);
    ms_json_knum(&j, "fraction_of_bound", mk / bound);
    ms_json_kbool(&j, "copy_bound_applies", !in_cache);
    ms_json_knum(&j, "fraction_of_read_bound", mk / rbound);
    if (d.rtps) {
      ms_json_knum(&j, "fraction_of_read_in_round", d.rfrac);
      ms_json_knum(&j, "fraction_of_read_in_round_min", d.rlo);
      ms_json_knum(&j, "fraction_of_read_in_round_max", d.rhi);
    }
    ms_json_obj_end(&j);
    ms_json_end(&j);
  } else {
    if (cuda)
      printf("%s (%s as bf16 on %s), batch %ld, best of %ld alternating rounds\n", m->cfg.name,
             ms_dtype_name(m->cfg.dtype), dev.name, batch, rounds);
    else {
      char ranks[48] = "";
      if (tx) snprintf(ranks, sizeof ranks, " a rank x %d ranks (mpirun)", tx->size);
      printf("%s (%s%s), batch %ld, %d workers%s, best of %ld alternating rounds\n", m->cfg.name,
             ms_dtype_name(m->cfg.dtype), q8_on ? ", 8-bit activations" : "", batch, W, ranks, rounds);
    }
    const char *name[N_ENG] = {eng_name[ENG_MK], a.null_check ? "megakernel2" : eng_name[ENG_PER_OP]};
    if (a.null_check)
      printf("  --null: the per-op member is a second megakernel engine; their ratio is the rounds' own bias\n");
    for (int k = 0; k < N_ENG; k++) {
      printf("  %-11s %10.2f tokens/s", name[k], d.best[k]);
      if (k != ENG_PER_OP)
        printf("   (%s / %s in one round: median %.3f, %.3f-%.3f)", name[k], name[ENG_PER_OP], d.ratio[k], d.lo[k],
               d.hi[k]);
      printf("\n");
      if (tx)
        printf("              rank 0 waited on other ranks' shares %.1f%% of its workers' time (%.1f us a token, "
               "%.1f us a share, %llu shares of %.0f bytes on average)\n",
               d.wall_ns[k] ? 100.0 * (double)d.wait_ns[k] / ((double)d.wall_ns[k] * W) : 0.0,
               (double)d.wait_ns[k] / 1e3 / ((double)d.batch * d.steps * d.rounds),
               d.recv[k] ? (double)d.wait_ns[k] / 1e3 / (double)d.recv[k] : 0.0, (unsigned long long)d.recv[k],
               d.recv[k] ? (double)d.msg_bytes[k] / (double)d.recv[k] : 0.0);
    }
    printf("  moved       %10.0f bytes per token (%zu weight bytes per step, %.0f KV bytes per row)\n",
           step_bytes / (double)batch, wbytes, kv_per_row);
    if (cuda) {
      printf("  HBM bound   %10.2f tokens/s   (%.0f GB/s peak of %s)\n", rbound, rgbps, dev.name);
    } else {
      printf("  read bound  %10.2f tokens/s   (%.2f GB/s reading a step's %.1f MB, %s loads, %d threads x %d "
             "streams; a 128 MiB stream: %.2f GB/s)\n", rbound, rgbps, step_bytes / 1e6, loads, W, streams, sgbps);
      printf("  copy bound  %10.2f tokens/s   (%.2f GB/s STREAM-like copy of 2 x 128 MiB%s)\n", bound, gbps,
             in_cache ? ": DRAM, no bound for a step read from the cache" : "");
    }
    if (cuda)
      printf("  megakernel reaches %.1f%% of the HBM bound\n", 100.0 * mk / rbound);
    else if (in_cache)  /* over 100% of a "bound" would read as a contradiction */
      printf("  megakernel reaches %.1f%% of the read bound (the step's %.1f MB fit the %.0f MiB last-level "
             "cache)\n", 100.0 * mk / rbound, step_bytes / 1e6, (double)llc / (1 << 20));
    else
      printf("  megakernel reaches %.1f%% of the read bound, %.1f%% of the copy bound\n", 100.0 * mk / rbound,
             100.0 * mk / bound);
    if (d.rtps)
      printf("  in a round  %.1f%% of a read of the round's bytes in the same round (median; %.1f-%.1f%%; the read "
             "best %.2f tokens/s)\n", 100.0 * d.rfrac, 100.0 * d.rlo, 100.0 * d.rhi, d.rbest);
  }
  decode_free(&d);
  ms_model_free(m);
  cli_dist_end(tx);
  return rc;
}

/* The benchmarks, in --help's order (frame/cli.h reads the table). */
static const struct cli_cmd bench_cmds[] = {
    CLI_CMD("decode", NULL, "decode tokens/s: megakernel vs per-op vs the memory-bandwidth bound", bench_decode),
    CLI_CMD("prefill", NULL, "time to first token: chunked prefill vs one prompt position per step", bench_prefill),
    CLI_CMD("hooks", NULL,
            "what hooks cost: off vs armed vs a monitor attached (JIT, interpreted); JIT vs interpreter",
            bench_hooks),
    CLI_CMD("attach", NULL, "attach / replace latency over the control socket, throughput dip around them",
            bench_attach),
    CLI_CMD("sim", NULL, "the simulator against published megakernel figures", bench_sim),
    CLI_CMD("diagnose", NULL, "the counterexample benchmark: injected faults, five ways of observing",
            bench_diagnose_main),
    {0}};

const struct cli_group bench_group = {
    .path = "megascope bench", .noun = "benchmark", .one = "one", .width = 8, .cmds = bench_cmds};
