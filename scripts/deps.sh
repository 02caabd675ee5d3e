#!/usr/bin/env bash
# Installs the Debian packages megascope builds and tests with, when any is missing.
# Runs as root on a fresh machine (CI); elsewhere it only reports what is missing.
set -euo pipefail
pkgs=(cmake ninja-build gcc g++ make pkg-config clang llvm libbpf-dev libelf-dev zlib1g-dev
      libclang-rt-dev  # clang's libFuzzer and sanitizer runtimes: the fuzz scripts (tests/cli_fuzz_scripts.sh)
      libjansson-dev libmicrohttpd-dev libcurl4-openssl-dev prometheus curl python3
      gnuplot-nox python3-venv python3-pip libpython3-dev
      libopenmpi-dev openmpi-bin)  # MPI: tensor parallelism across processes (tests/cli_mpi_tp.sh)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -ne 0 ]; then
  echo "deps: installing ${missing[*]}" >&2
  if [ "$(id -u)" -ne 0 ]; then
    echo "deps: not root; install these packages: ${missing[*]}" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
# Python packages from PyPI: gguf (llama.cpp's own GGUF reader and writer) and
# numpy, for the GGUF cross-check (tests/cli_gguf_pyref.sh). Not fatal: without
# them that test reports itself skipped.
if ! python3 -c 'import gguf, numpy' 2>/dev/null; then
  echo "deps: installing the Python packages gguf and numpy (pip)" >&2
  python3 -m pip install --quiet --disable-pip-version-check gguf numpy >&2 2>/dev/null ||
    python3 -m pip install --quiet --disable-pip-version-check --user --break-system-packages gguf numpy >&2 ||
    echo "deps: could not install gguf with pip; its cross-check test will be skipped" >&2
fi
# perfetto (Perfetto's own generated protobuf definitions, perfetto_trace_pb2)
# and protobuf (6.31.1 or newer, which those definitions require), for decoding
# the Perfetto trace output (tests/trace_check.py). Not fatal: without them the
# decode reports itself skipped.
if ! python3 -c 'import perfetto.protos.perfetto.trace.perfetto_trace_pb2' 2>/dev/null; then
  echo "deps: installing the Python packages perfetto and protobuf (pip)" >&2
  python3 -m pip install --quiet --disable-pip-version-check perfetto 'protobuf>=6.31.1' >&2 2>/dev/null ||
    python3 -m pip install --quiet --disable-pip-version-check --user --break-system-packages perfetto \
      'protobuf>=6.31.1' >&2 ||
    echo "deps: could not install perfetto with pip; the Perfetto trace decode will be skipped" >&2
fi
# tokenizers (Hugging Face) and sentencepiece, the references the tokenizers are
# compared with (tests/cli_tokenizer_ref.sh), and unicodedata2 16.0.0, the Unicode
# 16 data scripts/tokenizer-unicode-tables.py generates the tables from. Not
# fatal: without them that test reports itself skipped.
if ! python3 -c 'import tokenizers, sentencepiece, unicodedata2' 2>/dev/null; then
  echo "deps: installing the Python packages tokenizers, sentencepiece and unicodedata2 (pip)" >&2
  python3 -m pip install --quiet --disable-pip-version-check tokenizers sentencepiece 'unicodedata2==16.0.0' >&2 2>/dev/null ||
    python3 -m pip install --quiet --disable-pip-version-check --user --break-system-packages tokenizers sentencepiece \
      'unicodedata2==16.0.0' >&2 ||
    echo "deps: could not install tokenizers/sentencepiece with pip; the tokenizer cross-check will be skipped" >&2
fi
# The OpenAI clients the server is tested with (tests/cli_openai.sh): the official
# openai SDK in the project's own virtual environment (.venv), so that the
# system's Python stays as it is. Not fatal: without it that test reports itself
# skipped.
root=$(cd "$(dirname "$0")/.." && pwd)
if ! "$root/.venv/bin/python" -c 'import openai' 2>/dev/null; then
  echo "deps: installing the Python package openai into $root/.venv (pip)" >&2
  { python3 -m venv "$root/.venv" &&
    "$root/.venv/bin/python" -m pip install --quiet --disable-pip-version-check openai >&2; } ||
    echo "deps: could not install openai into .venv; the OpenAI client test will be skipped" >&2
fi
# Structured output: llguidance (its shared library's C API is the grammar
# engine `serve` loads for response_format, src/control/structured.h; pinned:
# the API declared there is 1.8.0's), and LangChain's OpenAI client, which
# tests/structured_client.py drives against a live server as applications do.
if ! "$root/.venv/bin/python" -c 'import llguidance, langchain_openai' 2>/dev/null ||
   [ "$("$root/.venv/bin/python" -c 'import importlib.metadata as m; print(m.version("llguidance"))' 2>/dev/null)" != 1.8.0 ]; then
  echo "deps: installing the Python packages llguidance 1.8.0 and langchain-openai into $root/.venv (pip)" >&2
  "$root/.venv/bin/python" -m pip install --quiet --disable-pip-version-check 'llguidance==1.8.0' langchain-openai >&2 ||
    echo "deps: could not install llguidance into .venv; structured output (response_format) will be refused" >&2
fi
