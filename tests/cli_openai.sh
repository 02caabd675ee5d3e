#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# megascope serve against real OpenAI clients: the official openai SDK (from the
# project's .venv, installed by scripts/deps.sh) runs tests/openai_client.py on
# a synthetic model behind an API key, on a name (localhost) and on IPv6; then
# SIGTERM is checked twice: with a long --drain-timeout a stream in flight
# finishes and a new request gets 503; with a short one the stream is cut with
# an error event and the server still exits 0. With the SmolLM2 file in
# ~/.cache/megascope the client also asks it a chat question.
set -euo pipefail
MS=$1
here=$(cd "$(dirname "$0")" && pwd)
PY=$here/../.venv/bin/python
if ! "$PY" -c 'import openai' 2>/dev/null; then
  echo "SKIP: the openai package is not in .venv (scripts/deps.sh installs it)"
  exit 77
fi
tmp=$(mktemp -d)
trap 'kill $SERVE_PID 2>/dev/null || true; rm -rf "$tmp"' EXIT
skipped=""
fail() { echo "FAIL: $*"; exit 1; }
. "$here/serve_lib.sh"

# ---- the SDK on a synthetic model, behind a key, bound by name ----
start_serve main --synthetic tiny --batch 8 --max-ctx 2048 --api-key sekrit --host localhost --port 0
"$PY" "$here/openai_client.py" "$URL" sekrit || fail "the openai client checks"
code=$(curl -s -o "$tmp/e.json" -w '%{http_code}' "$URL/v1/models")
[ "$code" = 401 ] || fail "no key: $code"
grep -q '"code":"invalid_api_key"' "$tmp/e.json" || fail "401 body: $(cat "$tmp/e.json")"
stop_serve main

# ---- IPv6 ----
if python3 -c 'import socket; s = socket.socket(socket.AF_INET6); s.bind(("::1", 0))' 2>/dev/null; then
  SOCK="$tmp/v6/engine.sock"
  mkdir -p "$tmp/v6" && chmod 700 "$tmp/v6"
  "$MS" serve --synthetic tiny --host ::1 --port 0 --socket "$SOCK" >"$tmp/v6/out" 2>&1 &
  SERVE_PID=$!
  for _ in $(seq 1 300); do grep -q '^ready' "$tmp/v6/out" && break; sleep 0.1; done
  url6=$(grep -o 'http://\[::1\]:[0-9]*' "$tmp/v6/out" | head -1)
  [ -n "$url6" ] || fail "no IPv6 URL: $(cat "$tmp/v6/out")"
  curl -s -g "$url6/health" | grep -q '"ok"' || fail "IPv6 /health"
  kill -TERM "$SERVE_PID"
  wait "$SERVE_PID" || fail "the IPv6 server exited $?"
else
  echo "SKIP: no IPv6 loopback here; the IPv6 bind not checked"
  skipped=1
fi

# ---- SIGTERM drains: a stream in flight finishes, a new request gets 503 ----
stream() {  # stream OUT MAX_TOKENS: a streamed completion, its raw events in OUT
  curl -sN --max-time 120 -H 'Content-Type: application/json' \
    -d "{\"prompt\": \"drain\", \"max_tokens\": $2, \"stream\": true, \"temperature\": 0}" \
    "$URL/v1/completions" >"$1"
}
start_serve drain --synthetic tiny --max-ctx 8192 --drain-timeout 60 --watchdog-ms 0
stream "$tmp/d1" 8000 &
spid=$!
for _ in $(seq 1 100); do [ -s "$tmp/d1" ] && break; sleep 0.05; done
kill -TERM "$SERVE_PID"
for _ in $(seq 1 100); do grep -q 'stopping' "$tmp/drain/serve.out" && break; sleep 0.05; done
code=$(curl -s -o "$tmp/late.json" -w '%{http_code}' -d '{"prompt": "late", "max_tokens": 2}' "$URL/v1/completions") \
  || fail "a request during the drain reached no server (code $code; the stream had $(grep -c '^data:' "$tmp/d1") events)"
[ "$code" = 503 ] || fail "a request during the drain: $code"
wait "$spid" || true
tail -c 200 "$tmp/d1" | grep -q 'data: \[DONE\]' || fail "the drained stream did not end with [DONE]"
grep -q '"finish_reason":"length"' "$tmp/d1" || fail "the drained stream did not finish: $(tail -c 300 "$tmp/d1")"
wait "$SERVE_PID" || fail "serve exited $? after draining"
grep -q 'drained (0 requests cancelled' "$tmp/drain/serve.out" || fail "$(cat "$tmp/drain/serve.out")"

# ---- a short --drain-timeout: the stream is cut with an error event, exit 0 ----
start_serve cut --synthetic tiny --max-ctx 8192 --drain-timeout 0 --watchdog-ms 0
stream "$tmp/d2" 8000 &
spid=$!
for _ in $(seq 1 100); do [ -s "$tmp/d2" ] && break; sleep 0.05; done
kill -TERM "$SERVE_PID"
wait "$spid" || true
grep -q '"code":"aborted"' "$tmp/d2" || fail "no error event in the cut stream: $(tail -c 300 "$tmp/d2")"
tail -c 100 "$tmp/d2" | grep -q 'data: \[DONE\]' || fail "the cut stream did not end with [DONE]"
wait "$SERVE_PID" || fail "serve exited $? after cutting a stream"
grep -q 'drained (1 request cancelled' "$tmp/cut/serve.out" || fail "$(cat "$tmp/cut/serve.out")"

# ---- the real model, when it is here ----
real="$HOME/.cache/megascope/SmolLM2-135M-Instruct.Q4_1.gguf"
if [ -f "$real" ]; then
  start_serve real --model "$real" --batch 8 --max-ctx 1024
  "$PY" "$here/openai_client.py" "$URL" unused real || fail "the openai client checks on SmolLM2"
  stop_serve real
  start_serve real-f32 --model "$real" --batch 8 --max-ctx 1024 --f32-activations
  "$PY" "$here/openai_client.py" "$URL" unused real-f32 || fail "the openai client checks on SmolLM2, f32 activations"
  stop_serve real-f32
else
  echo "SKIP: $real is not here (scripts/get-smollm2.sh fetches it); the real-model chat not checked"
  skipped=1
fi
echo "cli_openai: ok"
# a part not run makes the whole test a skip (77), never a pass
[ -z "$skipped" ] || exit 77
