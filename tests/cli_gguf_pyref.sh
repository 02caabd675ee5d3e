#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The GGUF reader and writer cross-checked against the `gguf` Python package,
# llama.cpp's own implementation (tests/gguf_pyref.py): files megascope writes
# read back identically there (metadata, tensor table, every value, and the
# quantized bytes equal to gguf-py's quantizers where it has them), files gguf-py
# writes load and run here, and random blocks of every block type decode to the
# same bits as gguf.quants.dequantize, and a Q4_K_M-style mix gguf-py assembles
# from megascope's q4_K, q6_K and q8_0 files reads the same and runs. Skipped (77) when python3 lacks gguf and numpy (scripts/deps.sh
# installs them).
set -euo pipefail
MS=$1
python3 -c 'import gguf, numpy' 2>/dev/null || { echo "python3 has no gguf/numpy: skipped"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 "${MS_SRC:-$(dirname "$0")/..}/tests/gguf_pyref.py" write "$MS" "$tmp"
python3 "${MS_SRC:-$(dirname "$0")/..}/tests/gguf_pyref.py" read "$MS" "$tmp"
python3 "${MS_SRC:-$(dirname "$0")/..}/tests/gguf_pyref.py" blocks "$MS" "$tmp"
python3 "${MS_SRC:-$(dirname "$0")/..}/tests/gguf_pyref.py" mix "$MS" "$tmp"
