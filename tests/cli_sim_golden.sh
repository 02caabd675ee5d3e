#!/usr/bin/env bash
# The simulator's reports, compared with golden copies bit for bit: the same
# figures, tokens, task counts, hook firings and map contents for a run in
# megakernel and per-op mode, tensor parallel, under each fault that goes
# through the backend (slow_class: cost; delayed_release: a deferred trigger;
# starve_task: a poll), with kernels (--compute, dense and MoE), with monitors
# attached from the start, and `bench sim`. Every figure of these is of virtual
# time, so a run is the same on every machine; before comparing, norm() drops
# the fields of wall-clock time ("seconds", "tokens_per_s", "compile_ms") and
# "q8_activations" (an echo of the CLI's default, which shape-only runs ignore),
# and writes the rest with sorted keys. MS_GOLDEN_UPDATE=1 rewrites the copies
# (after a change meant to move the figures; say why in the commit).
set -euo pipefail
MS=$1
MON=${MS_MONITORS:-$(dirname "$MS")/monitors}
GOLD=${MS_GOLDEN_DIR:-$(cd "$(dirname "$0")" && pwd)/data/sim_golden}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

norm() {  # raw JSON file -> its normalised text on stdout
  python3 - "$1" <<'PY'
import json, sys
DROP = {"seconds", "tokens_per_s", "compile_ms", "q8_activations"}
def strip(x):
    if isinstance(x, dict):
        return {k: strip(v) for k, v in x.items() if k not in DROP}
    if isinstance(x, list):
        return [strip(v) for v in x]
    return x
print(json.dumps(strip(json.load(open(sys.argv[1]))), sort_keys=True, indent=1))
PY
}

SIM=(run --backend sim --synthetic smollm2-135m --batch 8 --requests 16 --steps 8 --json)
cases=(
  "megakernel|${SIM[*]}"
  "per_op|${SIM[*]} --mode per-op"
  "tp2|${SIM[*]} --tp 2"
  "fault_slow_class|${SIM[*]} --fault slow_class:blk.1.wo:2"
  "fault_delayed_release|${SIM[*]} --fault delayed_release:rope->attn:20us"
  "fault_starve_task|${SIM[*]} --fault starve_task:blk.0.attn@3:50us"
  "fault_comm_delay|${SIM[*]} --tp 2 --fault comm_delay:1:10us"
  "compute|run --backend sim --compute --synthetic tiny --batch 4 --requests 6 --steps 16 --check --json"
  "compute_moe|run --backend sim --compute --synthetic tiny-moe --batch 4 --requests 6 --steps 16 --check --json"
  "moe_routing_skew|run --backend sim --synthetic tiny-moe --batch 8 --requests 8 --steps 8 --fault routing_skew:3:0.5 --json"
  "hooks|${SIM[*]} --attach $MON/class_time.bpf.o --attach $MON/dep_wait.bpf.o"
  "bench_sim|bench sim --json"
)

pass=0 fail=0
for c in "${cases[@]}"; do
  name=${c%%|*}
  read -r -a args <<< "${c#*|}"
  "$MS" "${args[@]}" > "$tmp/$name.raw"
  norm "$tmp/$name.raw" > "$tmp/$name.json"
  if [ "${MS_GOLDEN_UPDATE:-0}" = 1 ]; then
    cp "$tmp/$name.json" "$GOLD/$name.json"
  fi
  if cmp -s "$tmp/$name.json" "$GOLD/$name.json"; then
    pass=$((pass + 1))
  else
    echo "FAIL $name: the report differs from $GOLD/$name.json (megascope ${args[*]})"
    diff "$GOLD/$name.json" "$tmp/$name.json" | head -20 || true
    fail=$((fail + 1))
  fi
done
echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
