#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Attention in one task a row and KV group against two (run --attn-parts 1 / 2), alternating in
# pairs on one binary, batch 1 on two workers; prints each run's tokens/s
# (bench/results/cpu-attn-parts-2026-12-07.txt).
# usage: scripts/attn-parts-ab.sh MODEL.gguf STEPS PAIRS [more run options]   (MS: the binary)
set -euo pipefail
[ $# -ge 3 ] || { sed -n 3,6p "$0"; exit 2; }
m=$1 steps=$2 pairs=$3
shift 3
for i in $(seq 1 "$pairs"); do
  for p in 1 2; do
    t=$("${MS:-build/megascope}" run --model "$m" --batch 1 --workers 2 --steps "$steps" \
      --max-ctx $((steps + 64)) --attn-parts "$p" "$@" 2>&1 | grep -o '[0-9.]* tokens/s' | head -1)
    echo "pair $i parts $p $t"
  done
done
