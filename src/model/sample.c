/* SPDX-License-Identifier: MIT */
/* The sampler (see megascope/sample.h).
 *
 * Candidates are gathered cheaply before anything is sorted: top-k keeps a
 * min-heap of the k best; top-p alone keeps only tokens whose probability is at
 * least (1 - p) / (n - 1) (llama2.c's bound: all the others together weigh less
 * than 1 - p, so the nucleus never reaches them). Only the survivors are sorted. */
#include "megascope/sample.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif

struct cand {
  int32_t id;
  float w;  /* exp((logit - max) / temperature): unnormalised probability */
};

int ms_sample_is_greedy(const struct ms_sample_params *p) { return !p || !(p->temperature > 0.0f); }

static int top_p_on(const struct ms_sample_params *p) { return p->top_p > 0.0f && p->top_p < 1.0f; }

static uint64_t splitmix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

double ms_sample_uniform(uint64_t seed, uint64_t counter) {
  uint64_t r = splitmix64(splitmix64(seed) ^ splitmix64(counter ^ 0x5851f42d4c957f2dull));
  return (double)(r >> 11) * (1.0 / 9007199254740992.0);  /* 53 bits */
}

/* The largest of m and v[0..n), NaNs passed over: max(x, m) is x only when x
 * > m, as MAXPS computes it with the new value first. */
static float block_max(const float *v, int n, float m) {
  int i = 0;
#ifdef __SSE2__
  __m128 a = _mm_set1_ps(m), c = a;
  for (; i + 8 <= n; i += 8) a = _mm_max_ps(_mm_loadu_ps(v + i), a), c = _mm_max_ps(_mm_loadu_ps(v + i + 4), c);
  float l[8];
  _mm_storeu_ps(l, a), _mm_storeu_ps(l + 4, c);
  for (int j = 0; j < 8; j++) m = l[j] > m ? l[j] : m;
#endif
  for (; i < n; i++) m = v[i] > m ? v[i] : m;
  return m;
}

/* The first i with v[i] above every v before it, as the plain loop `if (v[i] >
 * v[best]) best = i` finds it (the lowest index on ties; a NaN is never
 * taken, and a NaN at 0 stays the answer), 64 values at a time: a block whose
 * largest value (block_max) is not above the best so far is skipped, the
 * others are scanned by that loop. The plain loop read v[best] from memory
 * each time: SmolLM2's sample task (49152 logits) took 74 us a token, 17 now
 * (an Intel Xeon, 2026-12-07), of a step of about 5 ms. */
int ms_sample_argmax(const float *v, int n) {
  enum { BLK = 64 };
  if (n <= 0 || v[0] != v[0]) return 0;
  int best = 0;
  float top = v[0];
  for (int b = 1; b < n; b += BLK) {
    int e = b + BLK < n ? b + BLK : n;
    if (!(block_max(v + b, e - b, top) > top)) continue;
    for (int i = b; i < e; i++)
      if (v[i] > top) top = v[i], best = i;
  }
  return best;
}

/* a before b: more probable, then lower id */
static int better(const struct cand *a, const struct cand *b) { return a->w > b->w || (a->w == b->w && a->id < b->id); }

static int cand_cmp(const void *x, const void *y) {
  const struct cand *a = x, *b = y;
  return better(a, b) ? -1 : better(b, a) ? 1 : 0;
}

/* Keeps the k best of c[0..n) in c[0..k) (a min-heap on `better`), returns k. */
static int select_top_k(struct cand *c, int n, int k) {
  int h = 0;
  for (int i = 0; i < n; i++) {
    struct cand x = c[i];
    if (h == k && !better(&x, &c[0])) continue;
    int j;
    if (h < k) {
      for (j = h++; j > 0 && better(&c[(j - 1) / 2], &x); j = (j - 1) / 2) c[j] = c[(j - 1) / 2];
    } else {  /* replace the root, sift down */
      for (j = 0;;) {
        int ch = 2 * j + 1;
        if (ch >= h) break;
        if (ch + 1 < h && better(&c[ch], &c[ch + 1])) ch++;
        if (!better(&x, &c[ch])) break;
        c[j] = c[ch];
        j = ch;
      }
    }
    c[j] = x;
  }
  return h;
}

/* Fills c with the surviving candidates, best first; returns their count and
 * their total weight in *mass. */
static int filter(const float *logits, int n, const struct ms_sample_params *p, struct cand *c, double *mass) {
  float mx = logits[ms_sample_argmax(logits, n)], inv_t = 1.0f / p->temperature;
  double z = 0;
  for (int i = 0; i < n; i++) {
    c[i] = (struct cand){i, expf((logits[i] - mx) * inv_t)};
    z += c[i].w;
  }
  int m = n;
  if (p->top_k > 0 && p->top_k < n) {
    m = select_top_k(c, n, p->top_k);
    z = 0;
    for (int i = 0; i < m; i++) z += c[i].w;
  } else if ((top_p_on(p) || p->min_p > 0.0f) && n > 1) {
    /* the most probable token weighs 1: min-p's floor is min_p itself */
    double cut = top_p_on(p) ? (1.0 - p->top_p) / (n - 1) * z : 0.0;
    if (p->min_p > 0.0f && p->min_p > cut) cut = p->min_p;
    m = 0;
    for (int i = 0; i < n; i++)
      if (c[i].w >= cut) c[m++] = c[i];
  }
  qsort(c, (size_t)m, sizeof *c, cand_cmp);
  if (top_p_on(p)) {
    double want = p->top_p * z, cum = 0;
    int keep = 0;
    while (keep < m && (keep == 0 || cum < want)) cum += c[keep++].w;
    m = keep;
  }
  if (p->min_p > 0.0f && m > 1) {  /* c[0] is the most probable */
    double floor_w = (double)p->min_p * c[0].w;
    int keep = 1;
    while (keep < m && c[keep].w >= floor_w) keep++;
    m = keep;
  }
  *mass = 0;
  for (int i = 0; i < m; i++) *mass += c[i].w;
  return m;
}

int ms_sample(const float *logits, int n, const struct ms_sample_params *p, uint64_t counter) {
  if (!logits || n < 1) return -EINVAL;
  if (ms_sample_is_greedy(p)) return ms_sample_argmax(logits, n);
  struct cand *c = malloc(sizeof *c * (size_t)n);
  if (!c) return -ENOMEM;
  double mass, cum = 0;
  int m = filter(logits, n, p, c, &mass), tok = c[m - 1].id;
  double u = ms_sample_uniform(p->seed, counter) * mass;
  for (int i = 0; i < m; i++)
    if ((cum += c[i].w) > u) {
      tok = c[i].id;
      break;
    }
  free(c);
  return tok;
}

int ms_sample_probs(const float *logits, int n, const struct ms_sample_params *p, float *probs) {
  if (!logits || n < 1 || !probs) return -EINVAL;
  for (int i = 0; i < n; i++) probs[i] = 0.0f;
  if (ms_sample_is_greedy(p)) {
    probs[ms_sample_argmax(logits, n)] = 1.0f;
    return 0;
  }
  struct cand *c = malloc(sizeof *c * (size_t)n);
  if (!c) return -ENOMEM;
  double mass;
  int m = filter(logits, n, p, c, &mass);
  for (int i = 0; i < m; i++) probs[c[i].id] = (float)(c[i].w / mass);
  free(c);
  return 0;
}
