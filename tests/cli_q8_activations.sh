#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# --q8-activations, as a user runs it: on synthetic GGUF files in q8_0, q4_0 and
# q4_1, `megascope run --check` generates its tokens with logits within 1e-4 of
# the reference of the 8-bit activations (each matrix input rounded as the
# engine rounds it) at most positions (the median: an input that the engine's
# f32 sums put on the other side of a rounding step than the reference's
# doubles moves what follows it in its request, 0.03 on q4_0 here once the
# attention's parts sum in another order) and within 0.25 of the exact
# reference (these models' logits have a standard deviation of about 1;
# tests/test_q8_engine.c), further off than the f32 path (the mode is on); the
# same tokens and the same largest difference at every worker count, mode,
# tiling and on the simulator (in the CPU's two attention parts); f16
# weights keep the f32 path; without a flag `run` takes 8-bit activations and
# `run --check` the exact path; `bench decode` takes the flag too.
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
print(hashlib.sha1(json.dumps(d["tokens"]).encode()).hexdigest(), repr(d["max_abs_logit_diff"]),
      repr(d["median_abs_logit_diff"]))
PY
}

n=0
args=(--batch 4 --requests 6 --steps 12 --check --json)
for t in q8_0 q4_0 q4_1 f16; do
  f=$tmp/tiny-$t.gguf
  "$MS" model synth --preset tiny --type "$t" --out "$f" > /dev/null
  "$MS" run --model "$f" "${args[@]}" --f32-activations > "$tmp/off.json"
  off=$(summary "$tmp/off.json" 0)
  "$MS" run --model "$f" "${args[@]}" --q8-activations --tolerance 0.25 > "$tmp/on.json"
  want=$(summary "$tmp/on.json" 1)
  # the same tokens' logits against the exact reference: the activations' rounding
  for m in --q8-activations "--reference --f32-activations"; do
    # shellcheck disable=SC2086
    "$MS" model logits --model "$f" --tokens 5,17,99,3,42,7,11,64 $m --out "$tmp/lg.${m%% *}" > /dev/null
  done
  # shellcheck disable=SC2086
  python3 - $off $want "$t" "$tmp/lg.--q8-activations" "$tmp/lg.--reference" <<'PY'
import sys
import numpy as np
off, on, on_median, t = float(sys.argv[2]), float(sys.argv[5]), float(sys.argv[6]), sys.argv[7]
exact = float(np.abs(np.fromfile(sys.argv[8], np.float32) - np.fromfile(sys.argv[9], np.float32)).max())
assert off <= 1e-3, off
if t == "f16":
    assert on <= 1e-3 and exact <= 1e-3, (on, exact)   # f16 weights keep f32 activations
else:
    assert on_median <= 1e-4, on_median                # against the reference of its own rounding
    assert on <= 0.25, on
    assert 1e-4 < exact <= 0.25 and exact > 10 * off, (off, exact)
print("%s: f32 path %.2g, 8-bit path %.2g (median %.2g) from its reference, %.2g from the exact one"
      % (t, off, on, on_median, exact))
PY
  n=$((n + 1))
  # no flag: 8-bit activations; --check alone checks the exact path
  "$MS" run --model "$f" --batch 4 --requests 6 --steps 12 --json | python3 -c \
    'import json,sys; d=json.load(sys.stdin); assert d["q8_activations"] is True, d["q8_activations"]'
  "$MS" run --model "$f" "${args[@]}" | python3 -c \
    'import json,sys; d=json.load(sys.stdin); assert d["q8_activations"] is False and d["check_passed"], d'
  [ "$t" = f16 ] && continue
  for extra in "--workers 1" "--workers 3" "--mode per-op" "--tile-rows 8" "--shuffle --seed 3 --workers 3" \
               "--backend sim --compute --attn-parts 2"; do
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
