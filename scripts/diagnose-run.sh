#!/usr/bin/env bash
# The counterexample benchmark's full runs, as docs/benchmark.md reports them:
# the simulator's training and held-out splits (bench/scenarios/train.json and
# heldout-4.json, 60 scenarios each over every preset, GPU, batch 1-16 and tp 1-4,
# the calibration learned on the training split) and the CPU backend's
# training and held-out scenarios (bench/scenarios/cpu-train.json, cpu-heldout.json). Writes the JSON reports, the text
# tables and the plots into OUT, then prints the paired healthy and faulty run
# times per fault type (the outer view).
#   usage: scripts/diagnose-run.sh [BUILD_DIR] [OUT_DIR]   (build, out: build, bench-out)
set -euo pipefail
BUILD=${1:-build}
OUT=${2:-bench-out}
MS="$BUILD/megascope"
SRC=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$OUT"
"$MS" bench diagnose --scenarios "$SRC/bench/scenarios/train.json" --heldout "$SRC/bench/scenarios/heldout-4.json" \
  --budgets 4k,16k,64k --out "$OUT/sim.json" --plot "$OUT/sim.png" > "$OUT/sim.txt"
"$MS" bench diagnose --scenarios "$SRC/bench/scenarios/cpu-train.json" --heldout "$SRC/bench/scenarios/cpu-heldout.json" --budgets 4k,16k,64k,1m \
  --out "$OUT/cpu.json" --plot "$OUT/cpu.png" > "$OUT/cpu.txt"
cat "$OUT/sim.txt" "$OUT/cpu.txt"
python3 - "$OUT/sim.json" "$OUT/cpu.json" <<'PY'
import json, sys
for path in sys.argv[1:]:
    r = json.load(open(path))
    rows = {}
    for s in r["scenarios"]:
        if "error" in s:
            continue
        rows.setdefault(s["ground_truth"]["cause"], []).append(s)
    print("\n%s: paired unobserved runs (same seed), per fault type" % path)
    print("%-17s %3s %12s %12s %9s %9s %9s" % ("fault", "n", "healthy ms", "faulty ms", "mean", "min", "max"))
    for cause, ss in sorted(rows.items()):
        h = sum(s["healthy_ns"] for s in ss) / len(ss) / 1e6
        f = sum(s["faulty_ns"] for s in ss) / len(ss) / 1e6
        d = [s["slowdown"] * 100 for s in ss]
        print("%-17s %3d %12.3f %12.3f %+8.2f%% %+8.2f%% %+8.2f%%" % (cause, len(ss), h, f, sum(d) / len(d), min(d), max(d)))
PY
