#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# make demo: the default synthetic model (SmolLM2-135M shapes, bf16 weights) in the
# megakernel. First the plan's statistics; then the engine as a server: a batch of
# completions over HTTP decoded with continuous batching while a shipped monitor is
# attached through the control socket, a one-line query asked while it runs, the
# monitor read, replaced by another, read again (each result with its coverage), a
# task trace is written, and the server stops cleanly. When the real SmolLM2 file is
# in ~/.cache/megascope (scripts/get-smollm2.sh), it ends with a streamed chat answer
# from it, token by token over the OpenAI API.
set -euo pipefail
B=${1:-build}
MS="$B/megascope"
MON="$B/monitors"
MODEL=(--synthetic smollm2-135m --dtype bf16)
echo "== the plan for a batch of 4 (megascope compile ${MODEL[*]} --batch 4 --stats)"
"$MS" compile "${MODEL[@]}" --batch 4 --stats
echo

tmp=$(mktemp -d)
chmod 700 "$tmp"
SERVE_PID=""
cleanup() {
  if [ -n "$SERVE_PID" ] && kill -0 "$SERVE_PID" 2>/dev/null; then kill -TERM "$SERVE_PID"; fi
  wait 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT
SOCK="$tmp/engine.sock"

echo "== megascope serve ${MODEL[*]} --batch 4 --http 127.0.0.1:0 --socket $SOCK"
"$MS" serve "${MODEL[@]}" --batch 4 --http 127.0.0.1:0 --socket "$SOCK" >"$tmp/serve.out" 2>"$tmp/serve.err" &
SERVE_PID=$!
for _ in $(seq 1 600); do
  grep -q '^ready' "$tmp/serve.out" 2>/dev/null && break
  kill -0 "$SERVE_PID" 2>/dev/null || { cat "$tmp/serve.err"; exit 1; }
  sleep 0.1
done
cat "$tmp/serve.out"
URL=$(grep -o 'http://127\.0\.0\.1:[0-9]*' "$tmp/serve.out" | head -1)
[ -n "$URL" ] || { echo "the server did not start"; exit 1; }
echo

echo "== 8 completions at once (4 decode together; the others join as rows free up)"
prompts=("The megakernel" "Once upon a time" "Hello" "Semantic hooks let us" "A" "Tasks and events"
         "Continuous batching" "eBPF")
pids=()
for i in "${!prompts[@]}"; do
  curl -s --max-time 600 -o "$tmp/c$i.json" -w '%{http_code}\n' -H 'Content-Type: application/json' \
    -d "{\"prompt\": \"${prompts[$i]}\", \"max_tokens\": 24, \"temperature\": 0}" "$URL/v1/completions" >"$tmp/c$i.status" &
  pids+=($!)
done
sleep 1

echo "== mid-run: megascope attach --socket \$S $MON/class_time.bpf.o"
id=$("$MS" attach --socket "$SOCK" "$MON/class_time.bpf.o")
echo "attachment $id"
Q='task_end /op == attn/ { @us[class] = hist((t_end - t_begin) / 1000) } step /phase == end/ { @rows[batch_size] = count() }'
echo "== meanwhile, a question in one line, compiled here without clang: megascope query --socket \$S --for 2s --top 2 '$Q'"
"$MS" query --socket "$SOCK" --for 2s --top 2 "$Q"
echo
"$MS" ls --socket "$SOCK"
echo
echo "== megascope maps --socket \$S $id   (class_time: task time per class, with its coverage)"
"$MS" maps --socket "$SOCK" "$id" >"$tmp/maps1.txt"
head -16 "$tmp/maps1.txt"
echo "  ... ($(wc -l <"$tmp/maps1.txt") lines)"
echo
echo "== megascope replace --socket \$S $id $MON/queueing.bpf.o"
"$MS" replace --socket "$SOCK" "$id" "$MON/queueing.bpf.o"
echo "== megascope trace --socket \$S --seconds 1 --out $tmp/trace.json"
"$MS" trace --socket "$SOCK" --seconds 1 --out "$tmp/trace.json"
echo
echo "== megascope maps --socket \$S $id   (queueing: ready -> begin per class; both generations' coverage)"
"$MS" maps --socket "$SOCK" "$id" >"$tmp/maps2.txt"
head -16 "$tmp/maps2.txt"
echo "  ... ($(wc -l <"$tmp/maps2.txt") lines)"
echo

for p in "${pids[@]}"; do wait "$p"; done
ok=0
for i in "${!prompts[@]}"; do [ "$(cat "$tmp/c$i.status")" = 200 ] && ok=$((ok + 1)); done
echo "== $ok of ${#prompts[@]} completions answered 200; the first:"
cat "$tmp/c0.json"
echo
"$MS" detach --socket "$SOCK" "$id"
echo "== megascope stats --socket \$S"
"$MS" stats --socket "$SOCK"
echo
echo "== /metrics (excerpt)"
curl -s --max-time 30 "$URL/metrics" | grep -E '^megascope_(ttft_seconds_count|tokens_generated_total|steps_total|attachment_executed_total)' || true
echo
echo "== stopping (SIGTERM)"
kill -TERM "$SERVE_PID"
wait "$SERVE_PID"
SERVE_PID=""
tail -1 "$tmp/serve.out"
mkdir -p "$B/demo"
cp "$tmp/trace.json" "$B/demo/trace.json"
echo "the trace is in $B/demo/trace.json: open it in https://ui.perfetto.dev"
[ "$ok" -eq "${#prompts[@]}" ]

real="$HOME/.cache/megascope/SmolLM2-135M-Instruct.Q4_1.gguf"
if [ -f "$real" ]; then
  echo
  echo "== the real SmolLM2-135M-Instruct: megascope serve --model $real"
  "$MS" serve --model "$real" --batch 4 --http 127.0.0.1:0 --socket "$SOCK" >"$tmp/real.out" 2>"$tmp/real.err" &
  SERVE_PID=$!
  for _ in $(seq 1 600); do
    grep -q '^ready' "$tmp/real.out" 2>/dev/null && break
    kill -0 "$SERVE_PID" 2>/dev/null || { cat "$tmp/real.err"; exit 1; }
    sleep 0.1
  done
  URL=$(grep -o 'http://127\.0\.0\.1:[0-9]*' "$tmp/real.out" | head -1)
  echo "== a streamed chat (POST /v1/chat/completions, \"stream\": true), printed as the tokens arrive:"
  echo "   user: Name three colours of the rainbow."
  printf '   assistant: '
  curl -sN --max-time 120 -H 'Content-Type: application/json' "$URL/v1/chat/completions" -d \
    '{"messages": [{"role": "user", "content": "Name three colours of the rainbow."}], "max_tokens": 48, "temperature": 0, "stream": true}' |
    python3 -c '
import json, sys
for line in sys.stdin:
    if line.startswith("data: ") and line.strip() != "data: [DONE]":
        d = json.loads(line[6:])
        if d["choices"]:
            print(d["choices"][0]["delta"].get("content", ""), end="", flush=True)
            if d["choices"][0]["finish_reason"]:
                print("\n   (finish_reason: %s)" % d["choices"][0]["finish_reason"])
'
  kill -TERM "$SERVE_PID"
  wait "$SERVE_PID"
  SERVE_PID=""
else
  echo "(scripts/get-smollm2.sh fetches the real SmolLM2 file; the demo then ends with a streamed chat from it)"
fi
