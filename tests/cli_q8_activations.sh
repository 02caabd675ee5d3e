#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# --q8-activations, as a user runs it: on synthetic GGUF files in q8_0, q4_0 and
# q4_1, `megascope run` generates its tokens with logits within 0.25 of the
# double-precision reference (these models' logits have a standard deviation of
# about 1; tests/test_q8_engine.c), further off than the f32 path (the mode is
# on), and the same tokens and the same largest difference at every worker
# count, mode, tiling and on the simulator; f16 weights keep the f32 path;
# `bench decode` takes the flag too.
set -euo pipefail
MS=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

summary() {  # run.json q8(0/1) -> "digest max_diff", after checking the run
  python3 - "$1" "$2" <<'PY'
import hashlib, json, sys
d, q8 = json.load(open(sys.argv[1])), sys.argv[2] == "1"
assert d["q8_activations"] is q8, d["q8_activations"]
assert d["check_passed"] is True, d["max_abs_logit_diff"]
assert len(d["tokens"]) == d["requests"] and all(len(t) == 12 for t in d["tokens"])
print(hashlib.sha1(json.dumps(d["tokens"]).encode()).hexdigest(), repr(d["max_abs_logit_diff"]))
PY
}

n=0
args=(--batch 4 --requests 6 --steps 12 --check --json)
for t in q8_0 q4_0 q4_1 f16; do
  f=$tmp/tiny-$t.gguf
  "$MS" model synth --preset tiny --type "$t" --out "$f" > /dev/null
  "$MS" run --model "$f" "${args[@]}" > "$tmp/off.json"
  off=$(summary "$tmp/off.json" 0)
  "$MS" run --model "$f" "${args[@]}" --q8-activations --tolerance 0.25 > "$tmp/on.json"
  want=$(summary "$tmp/on.json" 1)
  python3 - "${off#* }" "${want#* }" "$t" <<'PY'
import sys
off, on, t = float(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
assert off <= 1e-3, off
if t == "f16":
    assert on <= 1e-3, on                   # f16 weights keep f32 activations
else:
    assert 1e-4 < on <= 0.25 and on > 10 * off, (off, on)
PY
  n=$((n + 1))
  [ "$t" = f16 ] && continue
  for extra in "--workers 1" "--workers 3" "--mode per-op" "--tile-rows 8" "--shuffle --seed 3 --workers 3" \
               "--backend sim --compute"; do
    # shellcheck disable=SC2086
    "$MS" run --model "$f" "${args[@]}" --q8-activations --tolerance 0.25 $extra > "$tmp/v.json"
    got=$(summary "$tmp/v.json" 1)
    if [ "$got" != "$want" ]; then echo "$t: tokens or logits differ with $extra: $got vs $want"; exit 1; fi
    n=$((n + 1))
  done
done

"$MS" run --synthetic tiny --steps 2 --q8-activations | grep -q "(f32, 8-bit activations)" || {
  echo "run: the summary line does not say 8-bit activations"; exit 1; }
"$MS" bench decode --model "$tmp/tiny-q4_1.gguf" --steps 4 --warmup 1 --q8-activations --json > "$tmp/b.json"
python3 - "$tmp/b.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
assert d["q8_activations"] is True and d["megakernel_tokens_per_s"] > 0 and d["per_op_tokens_per_s"] > 0, d
PY
"$MS" run --help | grep -q -- "--q8-activations" && "$MS" bench decode --help | grep -q -- "--q8-activations"
echo "$((n + 3)) passed, 0 failed"
