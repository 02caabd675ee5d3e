#!/usr/bin/env bash
# megascope compile --stats --json and --schema-out, on the SmolLM2-135M shapes.
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
echo "3 passed, 0 failed"
