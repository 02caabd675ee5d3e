#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# docs/alerts.yml: the example alert rules are valid (promtool check rules) and
# fire, or stay quiet, on synthetic series as they should (promtool test rules
# with tests/data/alerts_test.yml: healthy and faulty series); and none fires on
# a healthy engine under load: a `megascope serve` serving four clients with
# class_time and step_trace attached (step_trace read by `megascope records`)
# is scraped twice, and eight hours of series at its measured rates
# (tests/alerts_live.py) raise no alert.
set -euo pipefail
MS=${1:-}
SRC=${MS_SRC:-$(cd "$(dirname "$0")/.." && pwd)}
MON=${MS_MONITORS:-}
command -v promtool >/dev/null || { echo "skipped: no promtool (Debian package prometheus)"; exit 77; }
promtool check rules "$SRC/docs/alerts.yml"
(cd "$SRC/tests/data" && promtool test rules alerts_test.yml)
pass=2
if [ -z "$MS" ] || [ -z "$MON" ] || [ ! -f "$MON/step_trace.bpf.o" ] || ! command -v curl >/dev/null; then
  echo "SKIP: the live check: no megascope binary, shipped monitors or curl"
  echo "$pass passed, 0 failed, 1 skipped"
  exit 77
fi
tmp=$(mktemp -d)
SERVE_PID=""
REC_PID=""
cleanup() {
  [ -n "$REC_PID" ] && kill "$REC_PID" 2>/dev/null || true
  if [ -n "$SERVE_PID" ] && kill -0 "$SERVE_PID" 2>/dev/null; then kill -KILL "$SERVE_PID"; fi
  wait 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT
# shellcheck source=tests/serve_lib.sh
source "$SRC/tests/serve_lib.sh"
fail() { echo "FAILED: $*"; exit 1; }
start_serve live --synthetic tiny --workers 2 --batch 4
"$MS" attach --socket "$SOCK" "$MON/class_time.bpf.o" >/dev/null
ST=$("$MS" attach --socket "$SOCK" "$MON/step_trace.bpf.o")
"$MS" records --socket "$SOCK" "$ST" --json >"$tmp/rec.jsonl" 2>"$tmp/rec.err" &
REC_PID=$!
for _ in $(seq 1 200); do
  grep -q 'ring step_events' "$tmp/rec.err" 2>/dev/null && break
  sleep 0.05
done
code=$(completion "warm" 8 "$tmp/warm.json")
[ "$code" = 200 ] || fail "warm-up request: $code"
curl -s --max-time 30 "$URL/metrics" >"$tmp/before.prom"
t0=$(date +%s.%N)
for c in 1 2 3 4; do
  (for i in $(seq 1 8); do
     code=$(completion "c$c r$i" 24 "$tmp/c$c.json")
     [ "$code" = 200 ] || echo "request failed: $code" >>"$tmp/failed"
   done) &
done
for j in $(jobs -p); do [ "$j" = "$REC_PID" ] || [ "$j" = "$SERVE_PID" ] || wait "$j"; done
curl -s --max-time 30 "$URL/metrics" >"$tmp/after.prom"
t1=$(date +%s.%N)
[ ! -s "$tmp/failed" ] || fail "$(cat "$tmp/failed")"
grep -q '^megascope_attachment_lost_total{id="'"$ST"'",generation="1",monitor="step_trace"} 0$' "$tmp/after.prom" \
  || fail "step_trace lost records while read: $(grep attachment_lost "$tmp/after.prom")"
secs=$(python3 -c "print(max(0.5, $t1 - $t0))")
python3 "$SRC/tests/alerts_live.py" "$tmp/before.prom" "$tmp/after.prom" "$secs" "$SRC/docs/alerts.yml" \
  "$tmp/live_test.yml"
(cd "$tmp" && promtool test rules live_test.yml) || fail "an alert fires on a healthy engine's rates"
pass=$((pass + 1))
stop_serve live
echo "$pass passed, 0 failed"
