#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# megascope model and run --model, as a user runs them: every preset in every
# weight type written as GGUF, inspected, and run against the reference; text
# in and out through the byte-level vocabulary; seeded sampling reproducible;
# broken input refused with a message that names what is wrong.
set -euo pipefail
MS=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

n=0
for preset in tiny tiny-qwen3 tiny-qwen2 tiny-gemma3; do
  for t in f32 f16 bf16 q8_0 q4_0 q4_1; do
    f=$tmp/$preset-$t.gguf
    "$MS" model synth --preset "$preset" --type "$t" --out "$f" > /dev/null
    "$MS" model info "$f" --json > "$tmp/info.json"
    "$MS" run --model "$f" --batch 2 --requests 3 --steps 8 --check --f32-activations --json > "$tmp/run.json"
    python3 - "$tmp/info.json" "$tmp/run.json" "$preset" "$t" <<'PY'
import json, sys
info, run = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
preset, t = sys.argv[3], sys.argv[4]
m = info["model"]
assert m["name"] == preset and m["dtype"] == t and m["tokenizer"] == "gpt2/gpt2", m
assert m["arch"] == {"tiny-qwen3": "qwen3", "tiny-qwen2": "qwen2", "tiny-gemma3": "gemma3"}.get(preset, "llama"), m
types = {x["type"] for x in info["tensors"]}
assert types == ({"f32"} if t == "f32" else {"f32", t}), types
assert run["check_passed"] and run["max_abs_logit_diff"] <= 1e-3, run["max_abs_logit_diff"]
assert run["dtype"] == t
PY
    n=$((n + 1))
  done
done
echo "ok: $n preset x type files written, read, run and checked against the reference"

# the real model's shapes, tied embeddings, written quantized
"$MS" model synth --preset smollm2-135m --type q4_1 --out "$tmp/s.gguf" > /dev/null
"$MS" model info "$tmp/s.gguf" | grep -q "30 layers, dim 576, ffn 1536, heads 9/3 x 64, vocab 49152, tied embeddings" ||
  fail "smollm2-135m shapes"
echo "ok: smollm2-135m written as q4_1 ($(stat -c %s "$tmp/s.gguf") bytes)"

# text in, text out: the byte-level vocabulary echoes bytes; --json has the text and timings
f=$tmp/tiny-q8_0.gguf
"$MS" model tokenize --model "$f" --text "hi there" | grep -qx "104,105,32,116,104,101,114,101" || fail "tokenize"
[ "$("$MS" model tokenize --model "$f" --decode 104,105)" = "hi" ] || fail "decode"
# llama.cpp's tokenizer test files: texts each followed by the separator, a " ID ..." line per text
printf 'hi there\n__ggml_vocab_test__\n\n__ggml_vocab_test__\nhi\n\nthere\n__ggml_vocab_test__\n' > "$tmp/t.inp"
printf ' 104 105 32 116 104 101 114 101\n\n 104 105 10 10 116 104 101 114 101\n' > "$tmp/t.want"
"$MS" model tokenize --model "$f" --inp "$tmp/t.inp" | cmp -s - "$tmp/t.want" || fail "tokenize --inp"
# teacher-forced logits: the engine's f32 path is the reference's; 8-bit activations move them a little
for m in --reference --f32-activations --q8-activations; do
  "$MS" model logits --model "$f" --tokens 5,17,99,3,42,7 --workers 2 $m --out "$tmp/lg$m.bin" > /dev/null
done
python3 - "$tmp/lg--reference.bin" "$tmp/lg--f32-activations.bin" "$tmp/lg--q8-activations.bin" <<'PY'
import sys
import numpy as np
r, f, q = (np.fromfile(p, np.float32) for p in sys.argv[1:])
assert r.size == f.size == q.size and r.size % 6 == 0, (r.size, f.size, q.size)
assert np.abs(f - r).max() < 1e-3, np.abs(f - r).max()
assert 0 < np.abs(q - f).max() < 0.25, np.abs(q - f).max()
PY
echo "ok: tokenize --inp; model logits --reference, --f32-activations, --q8-activations"
"$MS" run --model "$f" --prompt "hello" --steps 6 --batch 1 --requests 1 --json > "$tmp/p.json"
python3 - "$tmp/p.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
assert d["tokenizer"] == "gpt2/gpt2" and d["prompt_tokens"] == [5], d
assert len(d["tokens"][0]) == 6 and isinstance(d["texts"][0], str)
assert d["ttft_s"][0] > 0 and d["tpot_s"][0] > 0
PY
"$MS" run --model "$f" --prompt "hello" --steps 6 --batch 1 --requests 1 | grep -q "^--- request 0: 5 prompt tokens, 6 generated" ||
  fail "run --prompt text output"
echo "ok: run --prompt (text, tokens, ttft, tpot)"

# seeded sampling: the same seed gives the same tokens at any worker count; another seed differs
s() { "$MS" run --model "$f" --prompt "abc" --steps 24 --batch 2 --requests 2 --temperature 1.0 --top-k 50 --top-p 0.95 \
        --sample-seed "$1" --workers "$2" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["tokens"])'; }
a=$(s 7 1)
[ "$a" = "$(s 7 2)" ] || fail "sampling with seed 7 depends on the worker count"
[ "$a" != "$(s 8 2)" ] || fail "sampling ignores the seed"
echo "ok: seeded sampling reproducible"

# refusals
expect() {  # exit code, needle, command...
  local code=$1 needle=$2
  shift 2
  set +e
  "$@" > "$tmp/out" 2> "$tmp/err"
  local rc=$?
  set -e
  [ "$rc" = "$code" ] || fail "$* exited $rc, expected $code: $(cat "$tmp/err")"
  grep -qF -- "$needle" "$tmp/err" || fail "$*: '$needle' not in: $(cat "$tmp/err")"
}
expect 2 "expected f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl, q2_k, q3_k, q4_k, q5_k, q6_k or q8_k" \
  "$MS" model synth --preset tiny --type iq2_xxs --out "$tmp/x.gguf"
expect 1 "are not multiples of the q5_k block (256)" "$MS" model synth --preset tiny --type q5_k --out "$tmp/x.gguf"
expect 1 "mixture-of-experts" "$MS" model synth --preset tiny-moe --type q8_0 --out "$tmp/x.gguf"
expect 1 "No such file" "$MS" model info "$tmp/none.gguf"
head -c 3000 "$f" > "$tmp/cut.gguf"
expect 2 "offset" "$MS" run --model "$tmp/cut.gguf" --steps 2
printf 'GGUF\x03\x00\x00\x00' > "$tmp/bad.gguf"
head -c 100 /dev/zero >> "$tmp/bad.gguf"
"$MS" model info "$tmp/bad.gguf" > "$tmp/out"
grep -q "key 'general.architecture': missing" "$tmp/out" || fail "an empty GGUF is not a model: $(cat "$tmp/out")"
expect 2 "ends a turn with '<|im_end|>', which this vocabulary lacks" "$MS" run --model "$f" --prompt hi --chat --steps 2
expect 2 "either --model or --synthetic" "$MS" run --model "$f" --synthetic tiny --steps 2
echo "ok: refusals name the problem"
