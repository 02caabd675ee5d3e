#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Tensor parallelism across processes against one process, on this machine:
# `mpirun -np 2 megascope bench decode --tp 2 --workers 1` (two ranks of one
# worker, MPI between them) alternating with `megascope bench decode --workers 2`
# (one process, two workers), REPS times each, at each batch of BATCHES, on
# each model given (default: SmolLM2 and Gemma-3 from the cache).
#
# Prints, per (model, batch): both engines' decode tokens/s (median and range
# over the repetitions), their ratio, the megakernel / per-op ratio of each
# (bench decode measures both in every run), and where the ranks' time goes:
# shares received per token, rank 0's wait on other ranks' shares (share of its
# workers' time, microseconds per share and per token). A last JSON line
# (TP_JSON) holds every run.
#
# usage: scripts/tp-compare.sh [MODEL.gguf ...]
#   env: BATCHES ("1 8"), REPS (3), STEPS (32), MS (build/megascope)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
case ${1:-} in -h|--help) sed -n '3,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;; esac
MS=${MS:-$root/build/megascope}
BATCHES=${BATCHES:-1 8}
REPS=${REPS:-3}
STEPS=${STEPS:-32}
command -v mpirun >/dev/null || { echo "tp-compare: mpirun not found (scripts/deps.sh installs openmpi-bin)" >&2; exit 2; }
[ -x "$MS" ] || { echo "tp-compare: $MS not built (make)" >&2; exit 2; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
models=("$@")
if [ ${#models[@]} -eq 0 ]; then
  models=("$(bash "$root/scripts/get-smollm2.sh")" "$(bash "$root/scripts/get-gemma3.sh")")
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "tp-compare: $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) CPUs, $STEPS decode steps, $REPS alternating runs each" \
  "($(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo '?'))"
runs=()
for model in "${models[@]}"; do
  for b in $BATCHES; do
    for r in $(seq 1 "$REPS"); do
      echo "tp-compare: $(basename "$model") batch $b, run $r of $REPS" >&2
      timeout 600 mpirun --bind-to none -np 2 "$MS" bench decode --tp 2 --workers 1 --model "$model" --batch "$b" \
        --steps "$STEPS" --rounds 1 --comm-timeout-ms 60000 --json 2>"$tmp/err" >"$tmp/tp.json" ||
        { cat "$tmp/err" >&2; exit 1; }
      "$MS" bench decode --workers 2 --model "$model" --batch "$b" --steps "$STEPS" --rounds 1 --json \
        2>"$tmp/err" >"$tmp/one.json" || { cat "$tmp/err" >&2; exit 1; }
      runs+=("$(python3 -c 'import json,sys; print(json.dumps({"model": sys.argv[1], "batch": int(sys.argv[2]),
        "tp2": json.load(open(sys.argv[3])), "tp1": json.load(open(sys.argv[4]))}))' \
        "$(basename "$model")" "$b" "$tmp/tp.json" "$tmp/one.json")")
    done
  done
done
printf '%s\n' "${runs[@]}" | python3 -c '
import json, statistics as st, sys
runs = [json.loads(l) for l in sys.stdin]
def med(xs): return "%.1f (%.1f-%.1f)" % (st.median(xs), min(xs), max(xs))
print("| model | batch | 2 ranks x 1 worker tokens/s | 1 rank x 2 workers tokens/s | ratio | megakernel / per-op, 2 ranks | "
      "megakernel / per-op, 1 rank | shares / step | rank 0 waiting on shares | wait per share (us) |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
keys = sorted({(r["model"], r["batch"]) for r in runs}, key=lambda k: (k[0], k[1]))
for m, b in keys:
    rs = [r for r in runs if r["model"] == m and r["batch"] == b]
    two = [r["tp2"]["megakernel_tokens_per_s"] for r in rs]
    one = [r["tp1"]["megakernel_tokens_per_s"] for r in rs]
    w = [r["tp2"]["remote_waits"]["megakernel"] for r in rs]
    steps = rs[0]["tp2"]["steps"]
    print("| %s | %d | %s | %s | %.2f | %.2f | %.2f | %.0f | %.1f%% | %.2f |" % (
        m, b, med(two), med(one), st.median(two) / st.median(one),
        st.median([r["tp2"]["ratio"] for r in rs]), st.median([r["tp1"]["ratio"] for r in rs]),
        w[0]["shares_received"] / steps, 100 * st.median([x["wait_share"] for x in w]),
        st.median([x["wait_us_per_share"] for x in w])))
print("TP_JSON " + json.dumps(runs))
'
