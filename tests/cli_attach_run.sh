#!/usr/bin/env bash
# megascope run --attach: a monitor attached while the engine runs, replaced by
# another, its maps decoded with their coverage; a rejected object fails the run
# with the verifier's reason.
set -euo pipefail
MS=$1
MON=${MS_MONITORS:-$(dirname "$MS")/monitors}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$MS" run --synthetic tiny --batch 3 --requests 6 --steps 24 --workers 3 \
    --attach "$MON/class_time.bpf.o" --attach-at-step 4 \
    --replace-with "$MON/dep_wait.bpf.o" --replace-at-step 15 --json > "$tmp/run.json"
"$MS" run --synthetic tiny --batch 2 --steps 16 --attach "$MON/request_time.bpf.o" \
    --sample 3 --max-per-step 50 --json > "$tmp/budget.json"
python3 - "$tmp" <<'PY'
import json, sys
d = sys.argv[1]
r = json.load(open(d + "/run.json"))
a = r["attachments"][0]
gens = {g["generation"]: g for g in a["generations"]}
assert set(gens) == {1, 2}, gens
for g in gens.values():
    for k in ("eligible", "executed", "throttled", "lost"):
        assert k in g
    assert g["eligible"] == g["executed"] + g["throttled"] and g["executed"] > 0
assert gens[1]["first_step"] >= 4 and gens[2]["first_step"] >= 14
names = [m["name"] for m in a["maps"]]
assert "hist_evclass_wait_ns" in names and "waits_by_evclass" in names, names
assert all(len(t) == 24 for t in r["tokens"])
b = json.load(open(d + "/budget.json"))["attachments"][0]["coverage"]
assert b["throttled"] > 0 and b["eligible"] == b["executed"] + b["throttled"], b
PY
# an object that is not eBPF is refused before the engine starts, with a reason
printf 'not an object' > "$tmp/bad.o"
if "$MS" run --synthetic tiny --steps 2 --attach "$tmp/bad.o" 2> "$tmp/err"; then
  echo "a garbage object was accepted"; exit 1
fi
grep -q "bad.o" "$tmp/err"
echo "3 passed, 0 failed"
