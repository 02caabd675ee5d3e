/* SPDX-License-Identifier: MIT */
/* The sampler: greedy, the distribution after temperature, top-k and top-p
 * against brute force, draws against that distribution (a chi-square test on
 * a fixed seed, so the test is deterministic), reproducibility by (seed,
 * counter), and in the engine: a sampled request gives the same tokens
 * whatever the worker count and whatever shares its batch. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "megascope/engine.h"
#include "megascope/sample.h"
#include "megascope/telemetry.h"
#include "test.h"

static void softmax_ref(const float *l, int n, double t, double *p) {
  double mx = l[0], z = 0;
  for (int i = 1; i < n; i++) mx = fmax(mx, l[i]);
  for (int i = 0; i < n; i++) z += p[i] = exp((l[i] - mx) / t);
  for (int i = 0; i < n; i++) p[i] /= z;
}

/* The nucleus by brute force: sort by probability (ties by id), keep top-k, then the prefix reaching p. */
static const double *order_p;  /* qsort has no context argument */
static int by_p(const void *a, const void *b) {
  int x = *(const int *)a, y = *(const int *)b;
  if (order_p[x] != order_p[y]) return order_p[x] > order_p[y] ? -1 : 1;
  return x - y;
}

static void brute(const float *l, int n, const struct ms_sample_params *sp, double *want) {
  double *p = malloc(sizeof *p * (size_t)n);
  int *idx = malloc(sizeof *idx * (size_t)n);
  softmax_ref(l, n, sp->temperature, p);
  for (int i = 0; i < n; i++) idx[i] = i;
  order_p = p;
  qsort(idx, (size_t)n, sizeof *idx, by_p);
  int k = sp->top_k > 0 && sp->top_k < n ? sp->top_k : n;
  double mass = 0;
  for (int i = 0; i < k; i++) mass += p[idx[i]];
  int keep = k;
  if (sp->top_p > 0 && sp->top_p < 1) {
    double cum = 0;
    for (keep = 0; keep < k && (keep == 0 || cum < sp->top_p * mass);) cum += p[idx[keep++]];
  }
  if (sp->min_p > 0) {  /* then min-p: at least min_p x the most probable */
    int m = 1;
    while (m < keep && p[idx[m]] >= sp->min_p * p[idx[0]] * (1 - 1e-6)) m++;
    keep = m;
  }
  double z = 0;
  for (int i = 0; i < n; i++) want[i] = 0;
  for (int i = 0; i < keep; i++) z += p[idx[i]];
  for (int i = 0; i < keep; i++) want[idx[i]] = p[idx[i]] / z;
  free(p);
  free(idx);
}

/* The greedy rule against the plain loop it replaces: ties to the lowest id,
 * NaNs never taken (and a NaN first is the answer), infinities, lengths that
 * end a block of 64 anywhere, and a vocabulary's worth. */
static void test_argmax(void) {
  static float v[49152 + 7];
  uint64_t z = 12345;
  int bad = 0, cases = 0;
  for (int t = 0; t < 20000; t++) {
    int n = t % 97 == 0 ? 49152 + t % 7 : 1 + t % 301;
    for (int i = 0; i < n; i++) {
      z = z * 6364136223846793005ull + 1442695040888963407ull;
      int r = (int)(z >> 33) % 23;
      v[i] = r == 0 ? NAN : r == 1 ? INFINITY : r == 2 ? -INFINITY : (float)(r % 7) - 3.0f;
    }
    int want = 0;
    for (int i = 1; i < n; i++)
      if (v[i] > v[want]) want = i;
    bad += ms_sample_argmax(v, n) != want, cases++;
  }
  CHECKF(bad == 0, "argmax: %d of %d cases differ from the plain loop", bad, cases);
  float nan_first[3] = {NAN, 1.0f, 2.0f}, tie[4] = {1.0f, 3.0f, 3.0f, 2.0f};
  CHECK(ms_sample_argmax(nan_first, 3) == 0);
  CHECK(ms_sample_argmax(tie, 4) == 1);
}

static void test_filters(void) {
  enum { N = 1000 };
  float l[N], probs[N];
  double want[N];
  uint64_t r = 7;
  for (int i = 0; i < N; i++) r = r * 6364136223846793005ull + 1442695040888963407ull, l[i] = (float)((r >> 40) % 1000) / 100.0f;
  l[17] = l[400] = 12.5f;  /* a tie at the top */
  struct ms_sample_params cases[] = {{1.0f, 0, 0, 1, 0},      {0.7f, 0, 0.9f, 1, 0},   {1.3f, 50, 0, 1, 0},
                                     {1.0f, 20, 0.5f, 1, 0},  {2.0f, 0, 0.3f, 1, 0},   {0.5f, 1, 0, 1, 0},
                                     {1.0f, 5000, 0.999f, 1, 0}, {1.0f, 0, 0, 1, 0.05f}, {0.8f, 0, 0.95f, 1, 0.2f},
                                     {1.5f, 100, 0, 1, 0.5f}};
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    CHECK(ms_sample_probs(l, N, &cases[c], probs) == 0);
    brute(l, N, &cases[c], want);
    double worst = 0, sum = 0;
    int support_differs = 0;
    for (int i = 0; i < N; i++) {
      worst = fmax(worst, fabs(probs[i] - want[i]));
      support_differs += (probs[i] > 0) != (want[i] > 0);
      sum += probs[i];
    }
    CHECKF(worst < 1e-5 && support_differs == 0 && fabs(sum - 1) < 1e-4, "case %zu: worst %.3g, support differs at %d",
           c, worst, support_differs);
  }
  struct ms_sample_params greedy = {0};
  CHECK(ms_sample(l, N, &greedy, 0) == 17 && ms_sample(l, N, NULL, 3) == 17);  /* lowest id on ties */
  CHECK(ms_sample_is_greedy(&greedy) && ms_sample_is_greedy(NULL));
  CHECK(ms_sample(l, 0, &cases[0], 0) == -EINVAL);
  float none[N];
  CHECK(ms_sample_probs(l, 0, &cases[0], none) == -EINVAL && ms_sample_probs(l, -1, &cases[0], none) == -EINVAL);
  struct ms_sample_params k1 = {1.0f, 1, 0, 9, 0};
  int all17 = 1;
  for (int i = 0; i < 50; i++) all17 &= ms_sample(l, N, &k1, (uint64_t)i) == 17;
  CHECK(all17);  /* top-1 is greedy */
}

/* The uniform numbers are SplitMix64's (Vigna's splitmix64.c: from state 0 the
 * first outputs are 0xe220a8397b1dcdaf, 0x6e789e6aa1b965f4, 0x06c45d188009454f),
 * combined as sample.h says: the CUDA sampler computes the same numbers with its
 * own copy, so a seed draws the same tokens on both. */
static uint64_t splitmix_ref(uint64_t *state) {
  uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static uint64_t splitmix_of(uint64_t x) { return splitmix_ref(&x); }

static void test_uniform(void) {
  uint64_t st = 0;
  CHECK(splitmix_ref(&st) == 0xe220a8397b1dcdafull && splitmix_ref(&st) == 0x6e789e6aa1b965f4ull &&
        splitmix_ref(&st) == 0x06c45d188009454full);  /* the reference itself, against the published outputs */
  int bad = 0;
  for (uint64_t seed = 0; seed < 40; seed++)
    for (uint64_t c = 0; c < 40; c++) {
      uint64_t s = seed * 0x1234567ull, r = splitmix_of(splitmix_of(s) ^ splitmix_of(c ^ 0x5851f42d4c957f2dull));
      bad += ms_sample_uniform(s, c) != (double)(r >> 11) / 9007199254740992.0;
    }
  CHECKF(bad == 0, "%d of 1600 uniform numbers are not SplitMix64's", bad);
}

/* Draws follow the distribution: Pearson's chi-square over 6 outcomes. */
static void test_draws(void) {
  float l[6] = {2.0f, 1.0f, 0.5f, 0.0f, -1.0f, 1.5f};
  struct ms_sample_params sp[] = {{1.0f, 0, 0, 42, 0}, {0.7f, 0, 0.9f, 43, 0}, {1.5f, 3, 0, 44, 0}, {1.0f, 0, 0, 45, 0.3f}};
  for (size_t c = 0; c < sizeof sp / sizeof sp[0]; c++) {
    float p[6];
    ms_sample_probs(l, 6, &sp[c], p);
    long count[6] = {0}, n = 60000, outside = 0;
    for (long i = 0; i < n; i++) {
      int t = ms_sample(l, 6, &sp[c], (uint64_t)i);
      if (t >= 0 && t < 6) count[t]++;
      if (t < 0 || t >= 6 || p[t] == 0) outside++;
    }
    double chi = 0;
    int df = -1;
    for (int i = 0; i < 6; i++)
      if (p[i] > 0) {
        double e = p[i] * (double)n;
        chi += (count[i] - e) * (count[i] - e) / e;
        df++;
      }
    /* 99.9% points of chi-square: df 2: 13.8, df 4: 18.5, df 5: 20.5 */
    double crit = df <= 2 ? 13.8 : df <= 4 ? 18.5 : 20.5;
    CHECKF(outside == 0 && chi < crit, "case %zu: chi-square %.2f (df %d, limit %.1f), %ld draws outside the support",
           c, chi, df, crit, outside);
  }
  double mean = 0;
  int in_range = 1;
  for (int i = 0; i < 100000; i++) {
    double u = ms_sample_uniform(5, (uint64_t)i);
    in_range &= u >= 0 && u < 1;
    mean += u / 100000;
  }
  CHECK(in_range && fabs(mean - 0.5) < 0.005);
  CHECK(ms_sample_uniform(5, 9) == ms_sample_uniform(5, 9) && ms_sample_uniform(5, 9) != ms_sample_uniform(6, 9));
}

/* A vocabulary-sized nucleus (the candidate bound must not change the result). */
static void test_large(void) {
  enum { N = 49152 };
  float *l = malloc(sizeof *l * N), *p = malloc(sizeof *p * N);
  double *want = malloc(sizeof *want * N);
  for (int i = 0; i < N; i++) l[i] = (float)sin(i * 0.37) * 6.0f + (i % 97 == 0 ? 4.0f : 0.0f);
  struct ms_sample_params sp = {0.8f, 0, 0.95f, 3, 0};
  ms_sample_probs(l, N, &sp, p);
  brute(l, N, &sp, want);
  int differs = 0;
  for (int i = 0; i < N; i++) differs += fabs(p[i] - want[i]) > 1e-6 || (p[i] > 0) != (want[i] > 0);
  CHECKF(differs == 0, "%d probabilities differ", differs);
  int t = ms_sample(l, N, &sp, 11);
  CHECK(t >= 0 && t < N && p[t] > 0);
  free(l), free(p), free(want);
}

/* ---- in the engine ---- */

static void run(const struct ms_model *m, int workers, int with_others, uint64_t seed, int32_t *out) {
  struct ms_engine_opts eo = {.sz = sizeof eo, .n_workers = workers, .max_batch = 4, .max_ctx = 64};
  struct ms_engine *e = ms_engine_new(m, &eo, NULL);
  int32_t prompt[3] = {1, 2, 3}, other[2] = {9, 8};
  struct ms_request_opts ro = {.sz = sizeof ro, .prompt = prompt, .n_prompt = 3, .max_new_tokens = 20,
                               .temperature = 1.0f, .top_k = 40, .top_p = 0.95f, .sample_seed = seed};
  struct ms_request *o[3] = {0};
  for (int i = 0; i < with_others; i++) {  /* greedy and sampled neighbours */
    struct ms_request_opts oo = {.sz = sizeof oo, .prompt = other, .n_prompt = 1 + i % 2, .max_new_tokens = 5 + 7 * i,
                                 .temperature = i == 1 ? 0.8f : 0.0f, .sample_seed = 77};
    o[i] = ms_engine_submit(e, &oo);
  }
  struct ms_request *r = ms_engine_submit(e, &ro);
  memset(out, 0xff, sizeof(int32_t) * 20);
  if (r && !ms_request_wait(r, 60000)) {
    struct ms_request_info info;
    ms_request_get_info(r, &info);
    memcpy(out, info.tokens, sizeof(int32_t) * (size_t)info.n_tokens);
  }
  for (int i = 0; i < 3; i++) ms_request_free(o[i]);
  ms_request_free(r);
  ms_engine_free(e);
}

static void test_engine(void) {
  struct ms_model_config cfg;
  ms_preset_config("tiny", MS_DTYPE_F32, &cfg);
  struct ms_model *m = ms_model_synth(&cfg, 1);
  int32_t a[20], b[20], c[20], d[20];
  run(m, 1, 0, 5, a);
  run(m, 3, 3, 5, b);
  run(m, 2, 2, 6, c);
  run(m, 2, 0, 6, d);
  CHECK(!memcmp(a, b, sizeof a));  /* seed 5: same text, alone on 1 worker or with neighbours on 3 */
  CHECK(!memcmp(c, d, sizeof c));
  CHECK(memcmp(a, c, sizeof a));   /* another seed, other tokens */
  int valid = 1;
  for (int i = 0; i < 20; i++) valid &= a[i] >= 0 && a[i] < cfg.vocab;
  CHECK(valid);
  ms_model_free(m);
}

/* ---- the request options a server passes through ---- */

static struct ms_request_info finish(struct ms_engine *e, struct ms_request_opts *ro, struct ms_request **keep) {
  struct ms_request_info info = {0};
  struct ms_request *r = ms_engine_submit(e, ro);
  CHECK(r != NULL);
  if (r && !ms_request_wait(r, 60000)) ms_request_get_info(r, &info);
  *keep = r;  /* the info's arrays live as long as the request */
  return info;
}

#define LONG_TOKENS 4000  /* a request long enough to be cancelled before its end */

static void test_request_options(void) {
  struct ms_model_config cfg;
  ms_preset_config("tiny", MS_DTYPE_F32, &cfg);
  struct ms_model *m = ms_model_synth(&cfg, 1);
  struct ms_engine_opts eo = {.sz = sizeof eo, .n_workers = 2, .max_batch = 2, .max_ctx = LONG_TOKENS + 8};
  struct ms_engine *e = ms_engine_new(m, &eo, NULL);
  int32_t prompt[3] = {5, 6, 7};
  struct ms_request *r0, *r1, *r2, *r3, *r4;
  struct ms_request_opts ro = {.sz = sizeof ro, .prompt = prompt, .n_prompt = 3, .max_new_tokens = 24,
                               .logprobs = 1, .top_logprobs = 4};
  struct ms_request_info base = finish(e, &ro, &r0);
  CHECK(base.n_tokens == 24 && base.finish == MS_FINISH_LENGTH);
  int32_t base_tokens[24] = {0};
  memcpy(base_tokens, base.tokens, sizeof base_tokens);
  /* logprobs: the greedy token is the most probable, the top list descends and is a distribution's part */
  int lp_ok = base.logprob && base.top_ids && base.top_logprobs == 4;
  for (int i = 0; lp_ok && i < base.n_tokens; i++) {
    const float *v = base.top_lp + i * 4;
    lp_ok &= base.top_ids[i * 4] == base.tokens[i] && base.logprob[i] == v[0] && v[0] <= 0;
    lp_ok &= v[0] >= v[1] && v[1] >= v[2] && v[2] >= v[3];
    lp_ok &= expf(v[0]) + expf(v[1]) + expf(v[2]) + expf(v[3]) <= 1.0001f;
  }
  CHECK(lp_ok);
  /* a stop id ends the request at its first occurrence, kept as the last token */
  int32_t stop = base.tokens[5];
  int first = 0;
  while (base.tokens[first] != stop) first++;
  struct ms_request_opts rs = ro;
  rs.stop_ids = &stop;
  rs.n_stop_ids = 1;
  struct ms_request_info st = finish(e, &rs, &r1);
  CHECKF(st.finish == MS_FINISH_STOP && st.n_tokens == first + 1 && st.tokens[first] == stop,
         "finish %d after %d tokens (want stop after %d)", st.finish, st.n_tokens, first + 1);
  /* logit_bias: a large bias makes a token the greedy choice */
  int32_t bid = 77;
  float bval = 1000.0f;
  struct ms_request_opts rb = ro;
  rb.bias_ids = &bid;
  rb.bias_vals = &bval;
  rb.n_bias = 1;
  struct ms_request_info bi = finish(e, &rb, &r2);
  int all77 = bi.n_tokens == 24;
  for (int i = 0; i < bi.n_tokens; i++) all77 &= bi.tokens[i] == 77;
  CHECK(all77);
  /* a strong frequency penalty: no token twice */
  struct ms_request_opts rf = ro;
  rf.frequency_penalty = 1000.0f;
  struct ms_request_info fr = finish(e, &rf, &r3);
  int distinct = fr.n_tokens == 24;
  for (int i = 0; i < fr.n_tokens; i++)
    for (int j = 0; j < i; j++) distinct &= fr.tokens[i] != fr.tokens[j];
  CHECK(distinct);
  ms_request_free(r0), ms_request_free(r1), ms_request_free(r2), ms_request_free(r3);
  /* bad options are refused */
  struct ms_request_opts bad = ro;
  bad.top_logprobs = 21;
  CHECK(!ms_engine_submit(e, &bad) && errno == EINVAL);
  bad = rb;
  bid = cfg.vocab;
  CHECK(!ms_engine_submit(e, &bad) && errno == EINVAL);
  /* cancel: a long request stops early; one queued behind a full batch never starts. Long: the cancel
   * races the request's end (tiny decodes two rows in about 75 us a step, so 120 tokens once ended
   * before a cancel issued after the first token, on a loaded machine) */
  struct ms_request_opts rl = {.sz = sizeof rl, .prompt = prompt, .n_prompt = 3, .max_new_tokens = LONG_TOKENS};
  struct ms_request *a = ms_engine_submit(e, &rl), *b = ms_engine_submit(e, &rl), *c = ms_engine_submit(e, &rl);
  CHECK(a && b && c);
  ms_request_cancel(c);
  CHECK(ms_request_wait_tokens(a, 0, 60000) == 0);
  ms_request_cancel(a);
  CHECK(ms_request_wait(a, 60000) == 0 && ms_request_wait(c, 60000) == 0 && ms_request_wait(b, 60000) == 0);
  struct ms_request_info ia, ib, ic;
  ms_request_get_info(a, &ia), ms_request_get_info(b, &ib), ms_request_get_info(c, &ic);
  CHECKF(ia.state == MS_REQ_CANCELLED && ia.finish == MS_FINISH_CANCELLED && ia.n_tokens < LONG_TOKENS,
         "a: %d, %d tokens", ia.state, ia.n_tokens);
  CHECK(ic.state == MS_REQ_CANCELLED && ic.n_tokens == 0 && ic.t_admit == 0);
  CHECK(ib.state == MS_REQ_DONE && ib.finish == MS_FINISH_LENGTH && ib.n_tokens == LONG_TOKENS);
  struct ms_latency_stats lat;
  ms_engine_latency(e, &lat);
  CHECK(lat.requests_cancelled == 2);
  struct ms_engine_stats es;
  ms_engine_get_stats(e, &es);
  CHECKF(es.kv_pages > 0 && es.waiting == 0, "kv pages %d, waiting %d", es.kv_pages, es.waiting);
  ms_request_free(a), ms_request_free(b), ms_request_free(c);
  /* a fresh request after the cancellations gets the same tokens as the first: nothing leaked into its slot */
  struct ms_request_info again = finish(e, &ro, &r4);
  CHECKF(again.n_tokens == 24 && !memcmp(again.tokens, base_tokens, sizeof base_tokens), "%d tokens", again.n_tokens);
  ms_request_free(r4);
  ms_engine_free(e);
  ms_model_free(m);
}

int main(void) {
  test_argmax();
  test_filters();
  test_uniform();
  test_draws();
  test_large();
  test_engine();
  test_request_options();
  TEST_MAIN_END();
}
