#!/usr/bin/env bash
# megascope run, as a user runs it: the reference check passes, and every mode,
# worker count, shuffled interleaving and the MoE preset give the same greedy tokens.
set -euo pipefail
MS=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

check() {  # file -> prints the tokens' digest after checking the keys and the diff
  python3 - "$1" <<'PY'
import hashlib, json, sys
d = json.load(open(sys.argv[1]))
for k in ("tokens", "max_abs_logit_diff", "tokens_per_s", "mode"):
    assert k in d, "missing key " + k
assert d["check_passed"] is True and d["max_abs_logit_diff"] <= 1e-3, d["max_abs_logit_diff"]
assert len(d["tokens"]) == d["requests"] and all(len(t) == 64 for t in d["tokens"])
print(hashlib.sha1(json.dumps(d["tokens"]).encode()).hexdigest())
PY
}

base_args=(--synthetic tiny --batch 4 --steps 64 --check --json)
"$MS" run "${base_args[@]}" > "$tmp/base.json"
want=$(check "$tmp/base.json")
n=0
for extra in "--mode per-op" "--workers 1" "--workers 2" "--workers 3" "--workers 4" \
             "--shuffle --seed 1" "--shuffle --seed 2 --workers 3" "--shuffle --seed 3 --mode per-op --workers 4"; do
  # shellcheck disable=SC2086
  "$MS" run "${base_args[@]}" $extra > "$tmp/v.json"
  got=$(check "$tmp/v.json")
  if [ "$got" != "$want" ]; then echo "tokens differ with $extra"; exit 1; fi
  n=$((n + 1))
done
moe=""
for extra in "" "--mode per-op" "--shuffle --seed 5 --workers 3"; do
  # shellcheck disable=SC2086
  "$MS" run --synthetic tiny-moe --batch 4 --steps 64 --check --json $extra > "$tmp/m.json"
  got=$(check "$tmp/m.json")
  if [ -n "$moe" ] && [ "$got" != "$moe" ]; then echo "tiny-moe tokens differ with $extra"; exit 1; fi
  moe=$got
  n=$((n + 1))
done
# continuous batching: more requests than rows, different prompt lengths
"$MS" run --synthetic tiny-qwen3 --batch 3 --requests 7 --steps 9 --check --json > "$tmp/cb.json"
python3 - "$tmp/cb.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
assert d["check_passed"] and len(d["tokens"]) == 7 and all(len(t) == 9 for t in d["tokens"])
PY
# a slot's row moves on each step (runtime/step.c): a request's attention runs
# on the batch's rows in turn, so no request keeps one place in the workers'
# task order (explain holds a request against its batch)
"$MS" run --synthetic tiny --batch 4 --steps 8 \
  --query 'task_end /class == "blk.0.attn" && req_slot != 0xffffffff/ { @r[req_slot, tile_y] = count() }' \
  >"$tmp/rows.out"
python3 - "$tmp/rows.out" <<'PY'
import re, sys
rows = {}
for slot, row in re.findall(r"^@r\[(\d+), (\d+)\]: \d+$", open(sys.argv[1]).read(), re.M):
    rows.setdefault(int(slot), set()).add(int(row))
# which requests are in at once depends on when run submits them: every slot
# that ran beside others ran on more than one row (in slot order, slot 0 is row 0 always)
assert len(rows) >= 2 and all(len(r) >= 2 for r in rows.values()), rows
PY
echo "$((n + 3)) passed, 0 failed"
