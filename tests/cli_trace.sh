#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# megascope trace against a serving engine, as an operator keeps traces: Chrome
# JSON and Perfetto protobuf (--format), each checked by tests/trace_check.py
# (exact times, ordered tracks, flows inside their producers; the Perfetto file
# decoded with Perfetto's own definitions) against the counts the command
# printed; --max-events and --max-bytes keep to their budgets and say what they
# dropped; bad options are refused with messages. Exits 77 when python3 lacks
# the perfetto package (scripts/deps.sh installs it) after the JSON checks.
set -euo pipefail
MS=$1
SRC=${MS_SRC:-$(cd "$(dirname "$0")/.." && pwd)}
for t in curl python3; do
  command -v "$t" >/dev/null || { echo "skipped: no $t"; exit 77; }
done
tmp=$(mktemp -d)
SERVE_PID=""
cleanup() {
  touch "$tmp/stop" 2>/dev/null || true
  if [ -n "$SERVE_PID" ] && kill -0 "$SERVE_PID" 2>/dev/null; then kill -KILL "$SERVE_PID"; fi
  wait 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT
# shellcheck source=tests/serve_lib.sh
source "$SRC/tests/serve_lib.sh"
fail() { echo "FAILED: $*"; exit 1; }
pass=0
ok() { pass=$((pass + 1)); }
expect_fail() {
  local want=$1 pat=$2 rc=0
  shift 2
  "$@" >"$tmp/out" 2>"$tmp/err" || rc=$?
  [ "$rc" -eq "$want" ] || { cat "$tmp/out" "$tmp/err"; fail "$* exited $rc, expected $want"; }
  grep -q -- "$pat" "$tmp/err" || { cat "$tmp/err"; fail "$*: no '$pat' in the message"; }
  ok
}

expect_fail 2 "expected perfetto or json" "$MS" trace --socket "$tmp/none.sock" --seconds 1 --out x --format xml
expect_fail 2 "expected" "$MS" trace --socket "$tmp/none.sock" --seconds 1 --out x --max-events lots

start_serve s --synthetic tiny --batch 8 --workers 3 --max-ctx 256
# requests of different lengths, so steps of several buckets are traced
load() {
  local i=0
  while [ ! -e "$tmp/stop" ]; do
    i=$((i + 1))
    completion "client $1 request $i" $((8 * $1)) "$tmp/load.$1.json" >/dev/null || true
  done
}
load_pids=()
for k in 1 2 3 4 5; do
  load $k &
  load_pids+=($!)
done

expect_fail 1 "at least 4096" "$MS" trace --socket "$SOCK" --seconds 0.1 --out "$tmp/x" --max-bytes 100

# trace FILE ARGS...: records TRACE_SECONDS (0.4 s); sets COUNTS to the printed
# slices/flows/counters/budget_dropped
TRACE_SECONDS=0.4
trace() {
  local out=$1
  shift
  "$MS" trace --socket "$SOCK" --seconds "$TRACE_SECONDS" --out "$out" "$@" >"$tmp/trace.out" || fail "trace $*"
  COUNTS=$(python3 - "$tmp/trace.out" <<'PY'
import re, sys
t = open(sys.argv[1]).read()
m = re.search(r"(\d+) slices, (\d+) flows,\s+(\d+) counter samples, (\d+) events over the budget dropped", t)
assert m, t
print("slices=%s flows=%s counters=%s budget_dropped=%s" % m.groups())
PY
)
}

trace "$tmp/t.json" --format json
# shellcheck disable=SC2086
python3 "$SRC/tests/trace_check.py" json "$tmp/t.json" $COUNTS || fail "the JSON trace"
ok
json_slices=$(sed 's/.*slices=\([0-9]*\).*/\1/' <<<"$COUNTS")

trace "$tmp/e.json" --max-events 300
grep -q "events over the budget dropped" "$tmp/trace.out" || fail "no dropped count"
python3 - "$tmp/e.json" <<'PY' || fail "--max-events 300"
import json, sys
d = json.load(open(sys.argv[1]))
ev = [e for e in d["traceEvents"] if e["ph"] in ("X", "C")]
assert len(ev) == 300, len(ev)
assert d["metadata"]["budget_dropped"] > 0 and d["metadata"]["kept_us"] < d["metadata"]["window_us"]
PY
ok

perfetto=1
trace "$tmp/t.pftrace" --format perfetto
rc=0
# shellcheck disable=SC2086
python3 "$SRC/tests/trace_check.py" perfetto "$tmp/t.pftrace" $COUNTS || rc=$?
if [ "$rc" -eq 77 ]; then
  perfetto=0
  echo "note: python3 has no perfetto package: the Perfetto decode is skipped"
elif [ "$rc" -ne 0 ]; then
  fail "the Perfetto trace"
fi
ok
pf_slices=$(sed 's/.*slices=\([0-9]*\).*/\1/' <<<"$COUNTS")
# several times smaller per task slice (the two recordings differ in length).
# Each file has a fixed part (the interned names of every class, track
# descriptors) that a short recording on a loaded machine does not amortise
# (62 slices: 145 bytes a slice); the comparison needs 400 slices of each, so
# a recording with fewer is taken again for longer (not a retry: the first
# answer is not judged).
# long_enough FILE FORMAT SLICES: records FILE again, 2 s then 8 s, until it
# holds 400 slices; sets BYTES and SLICES to its size and slice count
long_enough() {
  local file=$1 format=$2 secs
  SLICES=$3
  for secs in 2 8; do
    [ "$SLICES" -ge 400 ] && break
    TRACE_SECONDS=$secs trace "$file" --format "$format"
    SLICES=$(sed 's/.*slices=\([0-9]*\).*/\1/' <<<"$COUNTS")
  done
  BYTES=$(stat -c %s "$file")
}
long_enough "$tmp/t.json" json "$json_slices"
json_bytes=$BYTES json_slices=$SLICES
long_enough "$tmp/t.pftrace" perfetto "$pf_slices"
pf_bytes=$BYTES pf_slices=$SLICES
[ "$json_slices" -ge 400 ] && [ "$pf_slices" -ge 400 ] ||
  fail "too few slices to compare sizes (json $json_slices, perfetto $pf_slices, in up to 8 s each)"
python3 -c "import sys; j, js, p, ps = map(int, sys.argv[1:]); r = (j / js) / (p / ps); print('json %.0f bytes per slice, perfetto %.0f (%.1fx)' % (j / js, p / ps, r)); sys.exit(0 if r >= 3 else 1)" \
  "$json_bytes" "$json_slices" "$pf_bytes" "$pf_slices" || fail "the Perfetto trace is not several times smaller"
ok

trace "$tmp/b.pftrace" --format perfetto --max-bytes 65536
[ "$(stat -c %s "$tmp/b.pftrace")" -le 65536 ] || fail "--max-bytes 65536 wrote $(stat -c %s "$tmp/b.pftrace") bytes"
if [ "$perfetto" -eq 1 ]; then
  # shellcheck disable=SC2086
  python3 "$SRC/tests/trace_check.py" perfetto "$tmp/b.pftrace" $COUNTS || fail "the budgeted Perfetto trace"
fi
grep -q "events over the budget dropped" "$tmp/trace.out" && ! grep -q " 0 events over the budget" "$tmp/trace.out" ||
  fail "--max-bytes dropped nothing"
ok

touch "$tmp/stop"
for p in "${load_pids[@]}"; do wait "$p"; done
stop_serve s || fail "stop"
ok
echo "cli_trace: $pass checks passed"
[ "$perfetto" -eq 1 ] || exit 77
