#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The real Gemma-3-270M (Q4_K_M: q5_0, q8_0, q4_K and q6_K matrices, a q8_0
# embedding of 262,144 rows, a SentencePiece vocabulary) when it is in the
# cache (scripts/get-gemma3.sh; `make test-real` fetches it); skipped (77)
# otherwise. It loads as gemma3 with the window and RoPE bases llama.cpp gives
# it, greedy generation answers factual prompts (Paris, Berlin), the engine
# matches the reference forward on the mapped quantized weights past the
# sliding window, and the text does not depend on the worker count.
set -euo pipefail
MS=$1
F=${MS_GEMMA3:-$HOME/.cache/megascope/gemma-3-270m-q4_k_m.gguf}
[ -r "$F" ] || { echo "Gemma-3-270M not cached ($F): skipped; scripts/get-gemma3.sh fetches it"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

"$MS" model info "$F" --json > "$tmp/info.json"
python3 - "$tmp/info.json" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))["model"]
want = {"arch": "gemma3", "layers": 18, "dim": 640, "ffn_dim": 2048, "heads": 4, "kv_heads": 1, "head_dim": 256,
        "vocab": 262144, "tied_embeddings": True, "bos": 2, "eos": 1, "tokenizer": "llama/spm"}
for k, v in want.items():
    assert m[k] == v, (k, m[k], v)
PY
echo "ok: model info"

gen() {  # prompt, steps, extra args -> the generated text (JSON texts[0])
  local p=$1 n=$2
  shift 2
  "$MS" run --model "$F" --prompt "$p" --steps "$n" --batch 1 --requests 1 --json "$@" |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["texts"][0])'
}
t1=$(gen "Paris is the capital of" 8)
echo "greedy: Paris is the capital of|$t1"
case "$t1" in *France*) ;; *) fail "no France in '$t1'" ;; esac
t2=$(gen "The capital of France is Paris. The capital of Germany is" 8)
echo "greedy: The capital of France is Paris. The capital of Germany is|$t2"
case "$t2" in *Berlin*) ;; *) fail "no Berlin in '$t2'" ;; esac
t3=$(gen "The capital of France is" 12)
echo "greedy: The capital of France is|$t3"
python3 - "$t3" <<'PY'
import sys
t = sys.argv[1]
assert len(t.split()) >= 5 and "\ufffd" not in t, t
assert sum(c.isalpha() or c in " ,.'-\n" for c in t) >= 0.9 * len(t), t  # English prose
PY
# the first token megascope picks is the argmax of an independent numpy forward
# on gguf-py's dequantization of the same file (" Paris" is in its top 5 too)
if python3 -c 'import gguf, numpy' 2>/dev/null; then
  ids=$("$MS" model tokenize --model "$F" --text "The capital of France is")
  top=$(python3 "$(dirname "$0")/gemma3_pyref.py" "$F" "$ids" | sed -n 's/^top5 \([0-9,]*\) .*/\1/p')
  first=$("$MS" run --model "$F" --prompt "The capital of France is" --steps 1 --batch 1 --requests 1 --json |
          python3 -c 'import json,sys; print(json.load(sys.stdin)["tokens"][0][0])')
  paris=$("$MS" model tokenize --model "$F" --text " Paris")
  echo "numpy forward top 5: $top; megascope's first token: $first; ' Paris' is $paris"
  [ "$first" = "${top%%,*}" ] || fail "megascope's first token $first is not the numpy forward's argmax (top 5 $top)"
  case ",$top," in *",$paris,"*) ;; *) fail "' Paris' ($paris) not in the numpy forward's top 5 ($top)" ;; esac
else
  echo "SKIP: python3 has no gguf/numpy: the numpy forward's check not run"
  gguf_missing=1
fi
[ "$t1" = "$(gen "Paris is the capital of" 8 --workers 1)" ] || fail "1 worker gives other text"
echo "ok: factual greedy English, the same on 1 and 2 workers"

# the engine against the reference forward (double precision, scalar decode of
# the blocks), two requests batched, 12 positions each
"$MS" run --model "$F" --prompt "Gravity is the force that" --steps 6 --batch 2 --requests 2 --check --json > "$tmp/c.json"
python3 - "$tmp/c.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
assert d["check_passed"] and d["max_abs_logit_diff"] <= 1e-2, d["max_abs_logit_diff"]
print("ok: engine vs reference, max |logit difference| %.3g" % d["max_abs_logit_diff"])
PY
# run's text: the prompt (its BOS is a control token, not text) and the answer
"$MS" run --model "$F" --prompt "Paris is the capital of" --steps 4 --batch 1 > "$tmp/run.txt"
grep -q "prompt tokens" "$tmp/run.txt" && grep -q "^Paris is the capital of" "$tmp/run.txt" && ! grep -q "<bos>" "$tmp/run.txt" ||
  { cat "$tmp/run.txt"; fail "run's text shows a control token"; }
echo "ok: run prints no <bos>"
# a part not run makes the whole test a skip (77), never a pass
[ -z "${gguf_missing:-}" ] || exit 77
