#!/usr/bin/env bash
# make bench: the benchmarks, each printing ratios measured in one run.
set -euo pipefail
B=${1:-build}
MS="$B/megascope"
for batch in 1 8; do
  echo "== megascope bench decode --synthetic smollm2-135m --batch $batch --json"
  "$MS" bench decode --synthetic smollm2-135m --batch "$batch" --json
done
