#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# `megascope run`'s sampling options reach the sampler unchanged, on `tiny`
# (random weights: flat enough logits that the nucleus matters), seeded at
# temperature 0.8: --top-p 1 is sampling without a nucleus; a nucleus of one
# token (--top-p 1e-6, or --top-k 1) is greedy; a seed gives the same tokens
# twice and another seed other tokens; --top-p 0.5 differs from both ends. The
# sampler's own distribution is checked against brute force in test_sample.
set -euo pipefail
MS=$1
fail() { echo "FAILED: $*"; exit 1; }
n=0
toks() {  # options -> the generated token ids of one request, as one line
  "$MS" run --synthetic tiny --steps 16 --batch 1 --requests 1 --json "$@" |
    python3 -c 'import json, sys; t = json.load(sys.stdin)["tokens"][0]; assert len(t) == 16, t; print(t)'
}
greedy=$(toks)
plain=$(toks --temperature 0.8 --sample-seed 3)
again=$(toks --temperature 0.8 --sample-seed 3)
other=$(toks --temperature 0.8 --sample-seed 4)
full=$(toks --temperature 0.8 --sample-seed 3 --top-p 1)
one=$(toks --temperature 0.8 --sample-seed 3 --top-p 0.000001)
k1=$(toks --temperature 0.8 --sample-seed 3 --top-k 1)
half=$(toks --temperature 0.8 --sample-seed 3 --top-p 0.5)
# every run above printed 16 tokens (toks asserts it), so no comparison is of two empty strings
[ "$plain" = "$again" ] || fail "seed 3 twice: $plain / $again"; n=$((n + 1))
[ "$plain" != "$other" ] || fail "seeds 3 and 4 gave the same tokens: $plain"; n=$((n + 1))
[ "$plain" != "$greedy" ] || fail "temperature 0.8 gave the greedy tokens: $plain"; n=$((n + 1))
[ "$full" = "$plain" ] || fail "--top-p 1 is not sampling without a nucleus: $full / $plain"; n=$((n + 1))
[ "$one" = "$greedy" ] || fail "--top-p 1e-6 is not greedy: $one / $greedy"; n=$((n + 1))
[ "$k1" = "$greedy" ] || fail "--top-k 1 is not greedy: $k1 / $greedy"; n=$((n + 1))
[ "$half" != "$plain" ] && [ "$half" != "$greedy" ] || fail "--top-p 0.5: $half (plain $plain, greedy $greedy)"
n=$((n + 1))
echo "$n passed, 0 failed"
