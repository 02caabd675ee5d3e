#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The K-quants, Q5_0, Q5_1 and IQ4_NL end to end: `megascope model synth` writes
# tiny-256 (every matrix width a multiple of 256) in each type, and `run --check`
# passes on it with f32 activations (engine and reference read the same blocks:
# only the f32 accumulation differs, 1e-3) and with --q8-activations (the
# activations' 8-bit rounding: within 0.25, as for q4_1; these logits have a
# standard deviation of about 1), with the same tokens and largest difference at
# every worker count and tiling (test_gguf checks the refusal of other types).
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
print(hashlib.sha1(json.dumps(d["tokens"]).encode()).hexdigest(), repr(d["max_abs_logit_diff"]))
PY
}

args=(--batch 3 --requests 4 --steps 6 --check --json)
for t in q5_0 q5_1 iq4_nl q2_k q3_k q4_k q5_k q6_k q8_k; do
  f=$tmp/tiny-$t.gguf
  "$MS" model synth --preset tiny-256 --type "$t" --out "$f" > /dev/null
  "$MS" model info "$f" > "$tmp/info"
  grep -qi "blk.0.ffn_down.weight *$t " "$tmp/info" || { echo "$t: model info does not show the type"; exit 1; }
  "$MS" run --model "$f" "${args[@]}" --f32-activations > "$tmp/off.json"
  off=$(summary "$tmp/off.json" 0)
  "$MS" run --model "$f" "${args[@]}" --q8-activations --tolerance 0.25 > "$tmp/on.json"
  want=$(summary "$tmp/on.json" 1)
  for extra in "--workers 1" "--workers 3" "--tile-rows 8"; do
    # shellcheck disable=SC2086
    "$MS" run --model "$f" "${args[@]}" --q8-activations --tolerance 0.25 $extra > "$tmp/v.json"
    got=$(summary "$tmp/v.json" 1)
    [ "$got" = "$want" ] || { echo "$t: tokens or logits differ with $extra: $got vs $want"; exit 1; }
  done
  echo "ok: $t: run --check max |logit diff| ${off#* } (f32 activations), ${want#* } (8-bit activations)"
done
