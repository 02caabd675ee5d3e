#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Llama-2- and Mistral-style `llama` files with a SentencePiece vocabulary,
# written by gguf-py as llama.cpp's converter writes them (tests/llama2_spm.py):
# model info, run --chat with the file's template, tokenization against
# sentencepiece, and teacher-forced logits against an independent numpy
# forward. Skipped (77) when python3 lacks gguf, numpy or sentencepiece
# (scripts/deps.sh installs them).
set -euo pipefail
MS=$1
python3 -c 'import gguf, numpy, sentencepiece' 2>/dev/null ||
  { echo "python3 has no gguf/numpy/sentencepiece: skipped"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 "${MS_SRC:-$(dirname "$0")/..}/tests/llama2_spm.py" "$MS" "$tmp"
"$MS" run --model "$tmp/mistral.gguf" --steps 6 --batch 2 --requests 3 --check --json > "$tmp/c.json"
python3 - "$tmp/c.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
assert d["check_passed"], d
print("ok: mistral-style file, 3 requests batched, run --check passes (max |logit difference| %.2g)"
      % d["max_abs_logit_diff"])
PY
