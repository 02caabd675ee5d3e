#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Batch 1 against the read bound, both ways `bench decode` measures it, on both real files at two
# workers and one: RUNS runs a line of `bench decode --steps 64 --rounds 5 --json`, each printed as
# tokens/s, the fraction of the read bound's fastest pass, and the median (range) of the fraction of the
# read within each round (bench/results/cpu-read-in-round-2026-12-07.txt).
# usage: scripts/read-bound.sh [RUNS]   (MS: the binary, default build/megascope; models from the cache)
set -euo pipefail
runs=${1:-4}
case "$runs" in -h | --help) sed -n 3,7p "$0"; exit 0 ;; *[!0-9]* | "") sed -n 3,7p "$0" >&2; exit 2 ;; esac
ms=${MS:-build/megascope}
cache=${MS_CACHE:-$HOME/.cache/megascope}
echo "# $(date -u '+%F %T') UTC; $(lscpu | sed -n 's/^Model name: *//p')"
for m in "$cache/SmolLM2-135M-Instruct.Q4_1.gguf" "$cache/gemma-3-270m-q4_k_m.gguf"; do
  [ -r "$m" ] || { echo "read-bound: $m not cached (make models)" >&2; exit 1; }
  for w in 2 1; do
    for _ in $(seq 1 "$runs"); do
      "$ms" bench decode --model "$m" --workers "$w" --steps 64 --rounds 5 --json 2>/dev/null | python3 -c '
import json, sys
d = json.load(sys.stdin)
print("%s w%d mk %.1f read_bound(fastest pass) %.1f -> %.3f | in round: read best %.1f, fraction median %.3f (%.3f-%.3f)"
      % (d["model"][:12], d["workers"], d["megakernel_tokens_per_s"], d["read_bound_tokens_per_s"],
         d["fraction_of_read_bound"], d["read_in_rounds_tokens_per_s"], d["fraction_of_read_in_round"],
         d["fraction_of_read_in_round_min"], d["fraction_of_read_in_round_max"]))'
    done
  done
done
