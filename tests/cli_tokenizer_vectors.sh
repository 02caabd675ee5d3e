#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# llama.cpp's tokenizer test vectors for the vocabularies of the real models
# (tests/data/tokenizer/NAME.inp and .out, made by tests/tokenizer_vectors.py
# with llama-cpp-python 0.3.36, llama.cpp 0c1e570): `megascope model tokenize
# --vocab MODEL --inp NAME.inp` must print NAME.out exactly. SmolLM2's
# byte-level BPE and Gemma-3's SentencePiece, each checked when its file is in
# the cache (scripts/get-smollm2.sh, scripts/get-gemma3.sh); llama.cpp is not
# needed. Skipped (77) when neither file is cached.
set -euo pipefail
MS=$1
SRC=${MS_SRC:-$(cd "$(dirname "$0")/.." && pwd)}
D=$SRC/tests/data/tokenizer
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
checked=0 skipped=0
check() {  # name model
  local name=$1 f=$2
  if [ ! -r "$f" ]; then
    echo "SKIP: $name: $f not cached"
    skipped=$((skipped + 1))
    return
  fi
  "$MS" model tokenize --vocab "$f" --inp "$D/$name.inp" > "$tmp/$name.out"
  if ! cmp -s "$tmp/$name.out" "$D/$name.out"; then
    python3 - "$D/$name.inp" "$D/$name.out" "$tmp/$name.out" <<'PY'
import sys
texts = open(sys.argv[1], encoding="utf-8", newline="").read().split("\n__ggml_vocab_test__\n")[:-1]
want, got = (open(p).read().split("\n")[:-1] for p in sys.argv[2:])
bad = [i for i in range(len(texts)) if i >= len(got) or want[i] != got[i]]
for i in bad[:10]:
    print(f"text {i} {texts[i]!r}: llama.cpp{want[i]}, megascope{got[i] if i < len(got) else ' (none)'}")
print(f"FAIL: {len(bad)} of {len(texts)} texts differ")
PY
    exit 1
  fi
  echo "ok: $name: $(wc -l < "$D/$name.out") texts tokenized as llama.cpp does"
  checked=$((checked + 1))
}
check smollm2-135m "${MS_SMOLLM2:-$HOME/.cache/megascope/SmolLM2-135M-Instruct.Q4_1.gguf}"
check gemma-3-270m "${MS_GEMMA3:-$HOME/.cache/megascope/gemma-3-270m-q4_k_m.gguf}"
# a file not cached makes the whole test a skip (77), never a pass
[ $skipped -eq 0 ] || exit 77
