#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The KV cache in f16 (--kv-f16): the engine against the reference that rounds
# its cache alike (run --check), on a synthetic model and on SmolLM2 when it is
# cached; the same tokens whatever the worker count and natively or on the AVX2
# path (the conversions are exact one way and round to nearest even the other,
# on every path); a backend that keeps f32 says so.
set -euo pipefail
MS=$1
F=${MS_SMOLLM2:-$HOME/.cache/megascope/SmolLM2-135M-Instruct.Q4_1.gguf}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

"$MS" run --synthetic tiny --steps 24 --batch 2 --prompt-len 5 --check --json >"$tmp/f32.json" ||
  fail "tiny: run --check"
"$MS" run --synthetic tiny --steps 24 --batch 2 --prompt-len 5 --check --kv-f16 --json >"$tmp/f16.json" ||
  fail "tiny: run --check --kv-f16"
python3 - "$tmp" <<'PY' || fail "tiny: the JSON"
import json, sys
a = json.load(open(sys.argv[1] + "/f32.json"))
d = json.load(open(sys.argv[1] + "/f16.json"))
assert d["kv_f16"] is True and a["kv_f16"] is False, (d.get("kv_f16"), a.get("kv_f16"))
assert d["check_passed"] is True, d
# the cache's rounding shows: further from the f32 reference than the f32 cache is, within its tolerance
assert a["max_abs_logit_diff"] < d["max_abs_logit_diff"] <= d["tolerance"], (a["max_abs_logit_diff"], d)
PY
echo "ok: tiny against its reference"

if "$MS" run --synthetic tiny --backend sim --kv-f16 --steps 2 >/dev/null 2>"$tmp/sim.err"; then
  fail "the sim backend took --kv-f16"
fi
grep -q "kv_f16: the sim backend keeps its KV cache in f32" "$tmp/sim.err" ||
  fail "sim's refusal not named: $(cat "$tmp/sim.err")"
echo "ok: the sim backend refuses it by name"

[ -r "$F" ] || { echo "SmolLM2 not cached ($F): its part skipped"; exit 0; }
"$MS" run --model "$F" --prompt "The capital of France is" --steps 48 --check --kv-f16 >"$tmp/check.txt" ||
  fail "SmolLM2: run --check --kv-f16: $(tail -1 "$tmp/check.txt")"
grep -q "passed" "$tmp/check.txt" || fail "SmolLM2: no check line"
for v in "1 native" "2 native" "2 avx2"; do
  set -- $v
  MEGASCOPE_SIMD=$2 "$MS" run --model "$F" --prompt "The capital of France is" --steps 32 --workers "$1" --kv-f16 \
    --json >"$tmp/w$1.$2.json" || fail "SmolLM2 --kv-f16, $1 workers, $2"
done
python3 - "$tmp" <<'PY' || fail "SmolLM2 --kv-f16: the runs disagree"
import json, sys
t = {k: json.load(open("%s/%s.json" % (sys.argv[1], k)))["tokens"] for k in ("w1.native", "w2.native", "w2.avx2")}
t = {k: v[0] if v and isinstance(v[0], list) else v for k, v in t.items()}
assert len(t["w1.native"]) >= 16, t  # up to 32: it may end on EOS
assert t["w1.native"] == t["w2.native"] == t["w2.avx2"], t
PY
echo "ok: SmolLM2 against its reference; the same tokens on 1 and 2 workers and on the AVX2 path"
