#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# What a ring-buffer reader costs a serving engine: `megascope serve` on MODEL
# (default SmolLM2 from the cache) with WORKERS workers and a monitor attached
# (default the shipped step_trace; any object with a ring buffer), then, in
# turn, REPS times: one greedy completion of TOKENS tokens with no reader, one
# with `megascope records` reading the ring (it sleeps until the engine wakes
# it at half full, or 50 ms), and one with a reader polling every 200 us
# (`--interval-us 200`, how the reader read before the wake-up).
#
# Prints each round's tokens/s and, at the end, the medians and each reader's
# ratio to no reader, with what each reader got and lost; a last JSON line
# (RECORDS_COST_JSON) holds every run.
#
# usage: scripts/records-cost.sh [MODEL.gguf]
#   env: MONITOR (build/monitors/step_trace.bpf.o), WORKERS (2), REPS (3),
#        TOKENS (400), PORT (18097), MS (build/megascope)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
case ${1:-} in -h|--help) sed -n '3,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;; esac
MS=${MS:-$root/build/megascope}
MONITOR=${MONITOR:-$root/build/monitors/step_trace.bpf.o}
WORKERS=${WORKERS:-2}
REPS=${REPS:-3}
TOKENS=${TOKENS:-400}
PORT=${PORT:-18097}
[ -x "$MS" ] || { echo "records-cost: $MS not built (make)" >&2; exit 2; }
[ -f "$MONITOR" ] || { echo "records-cost: no monitor $MONITOR (make builds the shipped ones)" >&2; exit 2; }
model=${1:-$(bash "$root/scripts/get-smollm2.sh")}
tmp=$(mktemp -d)
SP=""
cleanup() { [ -n "$SP" ] && kill "$SP" 2>/dev/null; wait 2>/dev/null || true; rm -rf "$tmp"; }
trap cleanup EXIT
sock=$tmp/ctl.sock
"$MS" serve --model "$model" --workers "$WORKERS" --http "127.0.0.1:$PORT" --socket "$sock" >"$tmp/serve.log" 2>&1 &
SP=$!
for _ in $(seq 1 300); do
  [ -S "$sock" ] && curl -sf "127.0.0.1:$PORT/health" >/dev/null && break
  kill -0 "$SP" 2>/dev/null || { cat "$tmp/serve.log" >&2; exit 1; }
  sleep 0.2
done
id=$("$MS" attach --socket "$sock" "$MONITOR")
echo "records-cost: $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) CPUs, $(basename "$model"), $WORKERS workers," \
  "$(basename "$MONITOR") attached, $TOKENS tokens a completion, $REPS rounds" \
  "($(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo '?'))"

# one greedy completion: prints tokens/s
complete() {
  python3 - "$PORT" "$TOKENS" <<'PY'
import json, sys, time, urllib.request
body = json.dumps({"prompt": "Once upon a time", "max_tokens": int(sys.argv[2]), "temperature": 0,
                   "ignore_eos": True}).encode()
t = time.time()
req = urllib.request.Request("http://127.0.0.1:%s/v1/completions" % sys.argv[1], body,
                             {"Content-Type": "application/json"})
n = json.loads(urllib.request.urlopen(req, timeout=600).read())["usage"]["completion_tokens"]
print("%.2f" % (n / (time.time() - t)))
PY
}

# a completion with a reader: prints tokens/s records lost
with_reader() {
  "$MS" records --socket "$sock" "$id" --json "$@" >"$tmp/rec.jsonl" 2>"$tmp/rec.err" &
  local rp=$!
  for _ in $(seq 1 100); do grep -q '^megascope records: ring' "$tmp/rec.err" && break; sleep 0.02; done
  local tps
  tps=$(complete)
  sleep 0.2
  kill -INT "$rp"
  wait "$rp" || { cat "$tmp/rec.err" >&2; exit 1; }
  python3 -c 'import json,sys; s=json.loads(open(sys.argv[1]).read().splitlines()[-1])["summary"]
print(sys.argv[2], s["records"], s["lost_ring_full"] + s["lost_coverage"])' "$tmp/rec.jsonl" "$tps"
}

runs=()
for r in $(seq 1 "$REPS"); do
  none=$(complete)
  read -r woken wrec wlost < <(with_reader)
  read -r polled prec plost < <(with_reader --interval-us 200)
  echo "round $r: no reader $none tokens/s, reader woken $woken ($wrec records, $wlost lost)," \
    "reader polling every 200 us $polled ($prec records, $plost lost)"
  fmt='{"none": %s, "woken": %s, "woken_records": %s, "woken_lost": %s, '
  fmt+='"polled": %s, "polled_records": %s, "polled_lost": %s}'
  runs+=("$(printf "$fmt" "$none" "$woken" "$wrec" "$wlost" "$polled" "$prec" "$plost")")
done
printf '%s\n' "${runs[@]}" | python3 -c '
import json, statistics as st, sys
runs = [json.loads(l) for l in sys.stdin]
med = {k: st.median(r[k] for r in runs) for k in ("none", "woken", "polled")}
print("medians: no reader %.1f, woken %.1f (%.2fx), polling every 200 us %.1f (%.2fx) tokens/s" %
      (med["none"], med["woken"], med["woken"] / med["none"], med["polled"], med["polled"] / med["none"]))
print("RECORDS_COST_JSON " + json.dumps({"runs": runs, "medians": med}))'
