#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Structured output on the real SmolLM2-135M-Instruct file, served as the
# default model (no --model: serve says which file it took): response_format
# json_object and json_schema through the openai SDK and LangChain
# (tests/structured_client.py), and the refusals. Needs the file (make test
# fetches it) and the .venv's openai, langchain-openai and llguidance
# (scripts/deps.sh); exits 77 without them.
set -euo pipefail
MS=$1
here=$(cd "$(dirname "$0")" && pwd)
PY=$here/../.venv/bin/python
MODEL=${MS_CACHE:-$HOME/.cache/megascope}/SmolLM2-135M-Instruct.Q4_1.gguf
if [ ! -f "$MODEL" ]; then
  echo "SKIP: $MODEL is missing (scripts/get-smollm2.sh fetches it)"
  exit 77
fi
if ! "$PY" -c 'import openai, langchain_openai, llguidance' 2>/dev/null; then
  echo "SKIP: openai, langchain-openai or llguidance is not in .venv (scripts/deps.sh installs them)"
  exit 77
fi
fail() { echo "FAIL: $*"; exit 1; }
. "$here/serve_lib.sh"
serve_scratch

# the default model: the cache's SmolLM2, named on stderr and in the banner
MS_CACHE=$(dirname "$MODEL") start_serve main --batch 4 --watchdog-ms 0
grep -q "no model named: the default, SmolLM2-135M-Instruct, from $MODEL" "$tmp/main/serve.err" ||
  fail "serve did not say which model: $(cat "$tmp/main/serve.err")"
grep -q "model:  $MODEL" "$tmp/main/serve.out" || fail "no model line: $(cat "$tmp/main/serve.out")"
grep -q "context: 8192 positions a request (the model's trained context" "$tmp/main/serve.out" ||
  grep -q "the model's trained context is 8192" "$tmp/main/serve.out" || fail "context line: $(cat "$tmp/main/serve.out")"
"$PY" "$here/structured_client.py" "$URL" || fail "the structured-output clients"
stop_serve main

# without the default model: how to get it, exit 2
out=$(MS_CACHE="$tmp/empty" "$MS" serve --http 127.0.0.1:0 2>&1) && fail "serve without a model ran"
grep -q "scripts/get-smollm2.sh" <<<"$out" || fail "no way to get the model: $out"

# llguidance missing: response_format is a 501 that says how to get it, not a crash
MEGASCOPE_LLGUIDANCE=$tmp/none.so start_serve nollg --model "$MODEL" --batch 1 --watchdog-ms 0
code=$(curl -s -o "$tmp/e.json" -w '%{http_code}' --max-time 60 -H 'Content-Type: application/json' \
  -d '{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "response_format": {"type": "json_object"}}' \
  "$URL/v1/chat/completions")
[ "$code" = 501 ] || fail "no llguidance: status $code: $(cat "$tmp/e.json")"
grep -q "cannot load llguidance" "$tmp/e.json" || fail "no llguidance: $(cat "$tmp/e.json")"
code=$(curl -s -o "$tmp/ok.json" -w '%{http_code}' --max-time 60 -H 'Content-Type: application/json' \
  -d '{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}' "$URL/v1/chat/completions")
[ "$code" = 200 ] || fail "a plain chat after the 501: $code"
stop_serve nollg
echo "cli_structured: passed"
