#!/usr/bin/env bash
# make demo: the default synthetic model (SmolLM2-135M shapes, bf16 weights) in the
# megakernel: the plan's statistics, then requests of different prompt lengths
# decoded with continuous batching, step by step.
set -euo pipefail
B=${1:-build}
MS="$B/megascope"
MODEL=(--synthetic smollm2-135m --dtype bf16)
echo "== the plan for a batch of 4 (megascope compile ${MODEL[*]} --batch 4 --stats)"
"$MS" compile "${MODEL[@]}" --batch 4 --stats
echo
echo "== 8 requests, prompts of 1 to 10 tokens, 12 tokens each, at most 4 at a time"
"$MS" run "${MODEL[@]}" --batch 4 --requests 8 --steps 12 --prompt-len 10 --show-steps
