#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# make demo: megascope on a real model, in about two minutes after the build.
# SmolLM2-135M-Instruct (fetched into ~/.cache/megascope by scripts/get-smollm2.sh
# when it is not there) is served as the default model, with one known fault
# injected (blk.15.gate_up, the 16th layer's FFN, at twice its time) and its
# workers pinned to CPUs. Then: a streamed chat answer; a load of chat clients
# (tests/chat_load.py); while it runs, a one-line question about the requests
# in flight, answered with its coverage; `megascope explain` finding the fault
# with its evidence; a task trace recorded under the load and drawn to a PNG;
# the server's statistics. Every figure printed is measured in this run.
set -euo pipefail
B=${1:-build}
MS="$B/megascope"
here=$(cd "$(dirname "$0")" && pwd)
OUT="$B/demo"
mkdir -p "$OUT"
FAULT=slow_class:blk.15.gate_up:2

bash "$here/get-smollm2.sh" >/dev/null  # a no-op when the file is in the cache

tmp=$(mktemp -d)
chmod 700 "$tmp"
SERVE_PID="" LOAD_PID=""
cleanup() {
  touch "$tmp/stop"
  if [ -n "$LOAD_PID" ]; then wait "$LOAD_PID" 2>/dev/null || true; fi
  if [ -n "$SERVE_PID" ] && kill -0 "$SERVE_PID" 2>/dev/null; then kill -TERM "$SERVE_PID"; wait "$SERVE_PID" || true; fi
  rm -rf "$tmp"
}
trap cleanup EXIT
SOCK="$tmp/engine.sock"
say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

say "megascope serve --pin-workers --fault $FAULT   (no model named: the default)"
"$MS" serve --pin-workers --fault "$FAULT" --batch 4 --http 127.0.0.1:0 --socket "$SOCK" \
  >"$tmp/serve.out" 2>"$tmp/serve.err" &
SERVE_PID=$!
for _ in $(seq 1 600); do
  grep -q '^ready' "$tmp/serve.out" 2>/dev/null && break
  kill -0 "$SERVE_PID" 2>/dev/null || { cat "$tmp/serve.err"; exit 1; }
  sleep 0.1
done
cat "$tmp/serve.err" "$tmp/serve.out"
URL=$(grep -o 'http://127\.0\.0\.1:[0-9]*' "$tmp/serve.out" | head -1)
[ -n "$URL" ] || { echo "the server did not start"; exit 1; }

say "a streamed chat answer (POST /v1/chat/completions, \"stream\": true), printed as the tokens arrive"
echo "   user: Name three colours of the rainbow."
printf '   assistant: '
curl -sN --max-time 120 -H 'Content-Type: application/json' "$URL/v1/chat/completions" -d \
  '{"messages": [{"role": "user", "content": "Name three colours of the rainbow."}], "max_tokens": 48,
    "temperature": 0, "stream": true, "stream_options": {"include_usage": true}}' |
  python3 -c '
import json, sys, time
t0 = time.time(); first = None; n = 0
for line in sys.stdin:
    if not line.startswith("data: ") or line.strip() == "data: [DONE]":
        continue
    d = json.loads(line[6:])
    if d.get("usage"):
        n = d["usage"]["completion_tokens"]
    if d["choices"]:
        piece = d["choices"][0]["delta"].get("content", "")
        if piece and first is None:
            first = time.time()
        print(piece, end="", flush=True)
        if d["choices"][0]["finish_reason"]:
            fin = d["choices"][0]["finish_reason"]
t1 = time.time()
print("\n   (%d tokens, finish_reason %s; first text after %.0f ms, then %.1f tokens/s, timed by this client)"
      % (n, fin, 1e3 * (first - t0), (n - 1) / (t1 - first) if n > 1 else 0))
'

say "a load: 6 chat clients (tests/chat_load.py), each asking again when its answer ends"
python3 "$here/../tests/chat_load.py" "$URL" --clients 6 --max-tokens 48 --stop "$tmp/stop" --for 120 &
LOAD_PID=$!
sleep 4

Q='request /phase == token/ { @tokens[req_slot] = count() } task_end /op == attn/ { @attn_us[ctx_len / 64 * 64] = avg((t_end - t_begin) / 1000) }'
say "while they run, a question in one line (compiled to eBPF here, verified, attached, answered, detached):"
echo "   how many tokens did each batch slot get in 3 s, and what does attention cost as the context grows?"
echo "   megascope query --for 3s '$Q'"
"$MS" query --socket "$SOCK" --for 3s "$Q"

say "megascope explain --slo tpot=50ms   (what stands out, with its evidence)"
"$MS" explain --socket "$SOCK" --slo tpot=50ms

say "a task trace recorded while the load runs: megascope trace --seconds 2"
"$MS" trace --socket "$SOCK" --seconds 2 --out "$OUT/trace.json"
python3 "$here/trace-png.py" "$OUT/trace.json" "$OUT/trace.png" --steps 3 --mark blk.15.gate_up ||
  echo "   (no picture: trace-png.py said why above)"

touch "$tmp/stop"
wait "$LOAD_PID" || { echo "the load's requests failed"; exit 1; }
LOAD_PID=""

say "megascope stats   (quantiles measured on the requests' own figures)"
"$MS" stats --socket "$SOCK"

say "stopping (SIGTERM: the server drains, then exits)"
kill -TERM "$SERVE_PID"
wait "$SERVE_PID"
SERVE_PID=""
tail -1 "$tmp/serve.out"
echo
echo "The trace: $OUT/trace.json (open it in https://ui.perfetto.dev); its picture: $OUT/trace.png"
