#!/usr/bin/env bash
# Where a prompt's time goes, for two builds side by side: `perf record` (CPU-clock samples, which count
# this process's time on a CPU, so a busy neighbour moves them less than it moves the wall clock) on
# `bench prefill --chunked-only`, the builds alternating A B B A ... REPS times each, then each run's
# samples per function and its tokens/s.
#
#   MODEL=F.gguf scripts/prefill-profile.sh A/megascope B/megascope [REPS]
#
# Environment: MODEL (required), PROMPT (512), WORKERS (1), ROUNDS (3), TOP (10 functions).
set -euo pipefail
A=${1:?usage: MODEL=F.gguf $0 A/megascope B/megascope [REPS]}
B=${2:?usage: MODEL=F.gguf $0 A/megascope B/megascope [REPS]}
REPS=${3:-2}
MODEL=${MODEL:?set MODEL to a .gguf file}
PROMPT=${PROMPT:-512} WORKERS=${WORKERS:-1} ROUNDS=${ROUNDS:-3} TOP=${TOP:-10}
command -v perf >/dev/null || { echo "prefill-profile: perf not found" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
one() {  # label binary
  local out
  out=$(perf record -q -o "$tmp/p.data" -- "$2" bench prefill --model "$MODEL" --workers "$WORKERS" \
    --prompts "$PROMPT" --chunked-only --rounds "$ROUNDS" 2>/dev/null | awk -v p="$PROMPT" '$1 == p { print $NF }')
  perf report -i "$tmp/p.data" --no-children --stdio -n 2>/dev/null >"$tmp/r.txt"
  printf '%s  tok/s %s  samples %s\n' "$1" "$out" "$(awk '/^ +[0-9.]+%/ { s += $2 } END { print s }' "$tmp/r.txt")"
  awk -v top="$TOP" '/^ +[0-9.]+%/ && n < top { printf "    %8d  %s\n", $2, $NF; n++ }' "$tmp/r.txt"
}
for ((i = 0; i < REPS; i++)); do
  if ((i % 2 == 0)); then one A "$A"; one B "$B"; else one B "$B"; one A "$A"; fi
done
