#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# SmolLM2 against llama.cpp (through llama-cpp-python) on the same file and the
# same token ids (scripts/llamacpp-compare.sh logits): identical tokenizer ids,
# and teacher-forced logits that agree. On the q4_1 file llama.cpp quantizes its
# activations to 8 bits for the dot products (megascope keeps them f32), which
# bounds the agreement; on an f32 copy of the same weights (made with gguf-py)
# that effect is gone and the logits must agree closely. Skipped (77) without
# the cached model or a python with llama_cpp (scripts/llamacpp-compare.sh setup).
set -euo pipefail
MS=$1
SRC=${MS_SRC:-$(cd "$(dirname "$0")/.." && pwd)}
F=${MS_SMOLLM2:-$HOME/.cache/megascope/SmolLM2-135M-Instruct.Q4_1.gguf}
[ -r "$F" ] || { echo "SmolLM2 not cached ($F): skipped"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
set +e
MS=$MS MODEL=$F bash "$SRC/scripts/llamacpp-compare.sh" logits > "$tmp/q.txt"
rc=$?
set -e
[ $rc = 77 ] && { echo "no python with llama_cpp: skipped (scripts/llamacpp-compare.sh setup)"; exit 77; }
[ $rc = 0 ] || { cat "$tmp/q.txt"; exit 1; }
cat "$tmp/q.txt"
python3 - "$tmp/q.txt" 0.9 2.5 <<'PY'
import json, sys
r = json.loads(next(l for l in open(sys.argv[1]) if l.startswith("LOGITS_JSON "))[12:])
assert r["tokenizer_ids_identical"], r
assert r["top1_fraction"] >= float(sys.argv[2]), r
assert r["max_abs_logit_diff"] <= float(sys.argv[3]), r
PY
if python3 -c 'import gguf, numpy' 2>/dev/null; then
  python3 "$SRC/tests/gguf_pyref.py" f32 "$F" "$tmp/f32.gguf"
  MS=$MS MODEL=$tmp/f32.gguf bash "$SRC/scripts/llamacpp-compare.sh" logits > "$tmp/f.txt"
  sed 's/^logits,/f32 copy: logits,/' "$tmp/f.txt"
  python3 - "$tmp/f.txt" 1.0 0.1 <<'PY'
import json, sys
r = json.loads(next(l for l in open(sys.argv[1]) if l.startswith("LOGITS_JSON "))[12:])
assert r["tokenizer_ids_identical"] and r["top1_fraction"] >= float(sys.argv[2]), r
assert r["max_abs_logit_diff"] <= float(sys.argv[3]), r
PY
fi
