/* SPDX-License-Identifier: MIT */
/* How sure explain is: a stated confidence is the share of answers that were
 * right among the training split's answers of the same kind and strength
 * (scripts/explain-eval.sh writes the table; docs/query.md holds it beside
 * the held-out split's reliability). A culprit's strength is its z; a "none"
 * answer's is how many scatters a 1.5x class would have stood out. Each
 * bin's rate is shrunk toward 1/2 by two pseudo-answers, so a bin of few
 * answers says little. */
#include <math.h>

#include "megascope/explain.h"

/* The bins' lower edges, in units of MS_EXPLAIN_Z. */
static const double edges[] = {1, 1.5, 2, 4, 8};
#define N_BINS (int)(sizeof edges / sizeof edges[0])

struct bin_rate {
  int n, right;
};

/* The training split's answers per bin: culprits (every kind), and "none".
 * From `scripts/explain-eval.py --seed 1` and `--seed 3` (SmolLM2-135M Q4_1
 * and Gemma-3-270M Q4_K_M, 2 pinned workers, 36 runs each: healthy, four
 * injected faults at 1.5x, 2x and 3x, a noisy neighbour, random preemption, a
 * long context), merged with `--report ... --calibrate`, 2026-12-04. */
static const struct bin_rate culprit_rate[N_BINS] = {{1, 1}, {6, 5}, {9, 9}, {12, 12}, {29, 29}};
static const struct bin_rate none_rate[N_BINS] = {{0, 0}, {0, 0}, {1, 1}, {8, 6}, {6, 5}};

static int bin_of(double z) {
  int b = -1;
  for (int i = 0; i < N_BINS; i++)
    if (z >= edges[i] * MS_EXPLAIN_Z) b = i;
  return b;
}

double ms_explain_confidence(enum ms_explain_kind k, double z) {
  int b = bin_of(z);
  if (isnan(z) || b < 0) return 0;
  const struct bin_rate *r = k == MS_EXPLAIN_KIND_COUNT ? &none_rate[b] : &culprit_rate[b];
  return (r->right + 1.0) / (r->n + 2.0);
}
