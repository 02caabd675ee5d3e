#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The tokenizers against Hugging Face `tokenizers` and `sentencepiece` on a
# generated corpus (tests/tokenizer_ref.py): vocabularies trained by the
# reference libraries, written as vocabulary-only GGUF files and read with
# `megascope model tokenize --vocab`. Skipped (77) when python3 lacks
# tokenizers, sentencepiece or gguf (scripts/deps.sh installs them).
set -euo pipefail
MS=$1
python3 -c 'import tokenizers, sentencepiece, gguf' 2>/dev/null ||
  { echo "python3 has no tokenizers/sentencepiece/gguf: skipped"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 "${MS_SRC:-$(dirname "$0")/..}/tests/tokenizer_ref.py" "$MS" "$tmp"
