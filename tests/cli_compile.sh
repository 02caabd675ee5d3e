#!/usr/bin/env bash
# megascope compile --stats --json and --schema-out, on the SmolLM2-135M shapes;
# --backend cpu compiles the plan `run` executes on the CPU (SmolLM2's file:
# `run --batch 1 --steps 2` ran twice its tasks), so does --backend sim without
# --sms (the simulator's default GPU, as `run --backend sim`); cuda wants --sms.
# --backend cpu cuts attention in two parts whatever the tiling; --attn-parts says.
set -euo pipefail
MS=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$MS" compile --synthetic smollm2-135m --dtype bf16 --batch 1 --stats --json --schema-out "$tmp/schema.json" > "$tmp/stats.json"
"$MS" compile --synthetic tiny --batch all --json > "$tmp/all.json"
python3 - "$tmp" <<'PY'
import json, sys
d = sys.argv[1]
s = json.load(open(d + "/stats.json"))
for k in ("tasks", "events", "pairwise_edges", "fused_edges", "metadata_bytes", "task_classes"):
    assert isinstance(s[k], int) and s[k] > 0, k
assert s["fused_edges"] < s["pairwise_edges"]
sc = json.load(open(d + "/schema.json"))
assert sc["schema_version"] == 1
names = {c["name"] for c in sc["task_classes"]}
assert "blk.29.attn" in names and "lm_head" in names and "step_start" in names
for c in sc["task_classes"]:
    for k in ("name", "op", "kernel", "dependency_class", "launch"):
        assert k in c
    assert c["launch"] == ("jit" if c["op"] == "attn" else "aot"), c
a = json.load(open(d + "/all.json"))
assert [b["batch"] for b in a["buckets"]] == [1, 2, 4, 8, 16]
PY
F=${MS_SMOLLM2:-$HOME/.cache/megascope/SmolLM2-135M-Instruct.Q4_1.gguf}
tasks() { python3 -c 'import json,sys; print(json.load(sys.stdin)["tasks"])'; }
cpu=$("$MS" compile --model "$F" --backend cpu --json | tasks)
dflt=$("$MS" compile --model "$F" --json | tasks)
ran=$("$MS" run --model "$F" --batch 1 --steps 2 --prompt-len 1 2>&1 | grep -o '2 steps, [0-9]* tasks' | grep -o '[0-9]* tasks$')
[ "$ran" = "$((2 * cpu)) tasks" ] || { echo "FAIL: run: $ran, compile --backend cpu: $cpu a step" >&2; exit 1; }
[ "$dflt" -gt "$cpu" ] || { echo "FAIL: 64 KiB tiles $dflt tasks, the CPU's $cpu" >&2; exit 1; }
[ "$("$MS" compile --model "$F" --backend cpu --tile-kb 64 --attn-parts 1 --json | tasks)" = "$dflt" ] ||
  { echo "FAIL: --tile-kb did not override --backend" >&2; exit 1; }
# the CPU's attention in two parts whatever the tiling: one more task a layer, KV group and row
parts=$("$MS" compile --model "$F" --backend cpu --tile-kb 64 --json | tasks)
[ "$parts" = "$((dflt + 30 * 3))" ] || { echo "FAIL: attention in parts: $parts tasks, $dflt in one" >&2; exit 1; }
[ "$("$MS" compile --model "$F" --attn-parts 2 --json | tasks)" = "$parts" ] ||
  { echo "FAIL: --attn-parts 2 without a backend" >&2; exit 1; }
[ "$("$MS" compile --model "$F" --backend sim --sms 8 --json | tasks)" -lt "$dflt" ] ||
  { echo "FAIL: --backend sim --sms 8" >&2; exit 1; }
# without --sms the simulator's default GPU, as `run --backend sim` tiles it
sim=$("$MS" compile --model "$F" --backend sim --json | tasks)
ran=$("$MS" run --backend sim --model "$F" --batch 1 --steps 2 --prompt-len 1 2>&1 |
  grep -o '2 steps, [0-9]* tasks' | grep -o '[0-9]* tasks$')
[ "$ran" = "$((2 * sim)) tasks" ] || { echo "FAIL: run --backend sim: $ran, compile --backend sim: $sim a step" >&2; exit 1; }
for bad in "--backend cuda" "--sms 8" "--backend cpu --sms 8"; do
  # shellcheck disable=SC2086
  if "$MS" compile --model "$F" $bad 2>"$tmp/err" >/dev/null; then echo "FAIL: compile $bad ran" >&2; exit 1; fi
  grep -q "sms" "$tmp/err" || { echo "FAIL: compile $bad: $(cat "$tmp/err")" >&2; exit 1; }
done
echo "5 passed, 0 failed"
