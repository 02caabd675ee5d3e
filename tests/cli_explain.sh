#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# megascope explain against a live `megascope serve` with a fault whose cause
# is known (serve --fault): the summary names the slowed class, the evidence
# is that class's tasks alone, exactly as many records as asked (the engine's
# ring budget stops the rest, counted as lost), and everything is detached
# after; two faults on different classes and ops; a healthy engine has no
# culprit. Usage errors exit 2.
set -euo pipefail
MS=$1
SRC=${MS_SRC:-$(cd "$(dirname "$0")/.." && pwd)}
for t in curl python3; do
  command -v "$t" >/dev/null || { echo "skipped: no $t"; exit 77; }
done
tmp=$(mktemp -d)
SERVE_PID=""
cleanup() {
  touch "$tmp/stop"
  if [ -n "$SERVE_PID" ] && kill -0 "$SERVE_PID" 2>/dev/null; then kill -KILL "$SERVE_PID"; fi
  wait 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT
# shellcheck source=tests/serve_lib.sh
source "$SRC/tests/serve_lib.sh"
fail() { echo "FAILED: $*"; exit 1; }

set +e
"$MS" explain --socket /nonexistent 2>"$tmp/u.err"; rc=$?
set -e
[ "$rc" = 2 ] && grep -q "slo tpot=DURATION is required" "$tmp/u.err" || fail "explain without --slo: $rc"

# explain_case NAME FAULT CULPRIT
explain_case() {
  start_serve "$1" --synthetic tiny --workers 2 --fault "$2"
  rm -f "$tmp/stop"
  ( for i in $(seq 1 400); do
      [ -e "$tmp/stop" ] && break
      code=$(completion "load $i" 8 "$tmp/load.json")
      [ "$code" = 200 ] || { echo "HTTP $code" >"$tmp/load.fail"; break; }
    done ) &
  local bg=$!
  sleep 0.3
  # a timing diagnosis on a shared machine: a second measurement when the first
  # missed (another test's load can land on one class's tasks), said so
  local try
  for try in 1 2; do
    "$MS" explain --socket "$SOCK" --slo tpot=1s --window 1s --evidence 50 --json >"$tmp/$1.json" 2>"$tmp/$1.err" ||
      { cat "$tmp/$1.err"; fail "explain $1"; }
    check_report "$tmp/$1.json" "$3" && break
    [ "$try" = 1 ] && echo "explain $1: the first window missed; measuring once more" && cat "$tmp/$1.json"
    [ "$try" = 2 ] && { cat "$tmp/$1.json"; fail "explain $1"; }
  done
  touch "$tmp/stop"
  wait "$bg"
  [ ! -e "$tmp/load.fail" ] || fail "a completion failed: $(cat "$tmp/load.fail")"
  "$MS" ls --socket "$SOCK" --json | grep -q '"attached": true' && fail "explain left an attachment"
  stop_serve "$1"
  SERVE_PID=""
}
check_report() {
  python3 - "$1" "$2" <<'PY'
import json, sys
r, want = json.load(open(sys.argv[1])), sys.argv[2]
assert r["culprit"] == want, (r["culprit"], want)
assert r["slo"]["missed"] is False and r["summary_coverage"]["executed"] == r["summary_coverage"]["eligible"]
ev = r["evidence"]
assert ev["records"] == 50 and ev["bytes"] == 50 * 56, ev
c = {x["class"]: x for x in r["classes"]}[want]
assert c["median_ns"] >= 1.5 * c["peers_median_ns"], c
PY
}
explain_case wo slow_class:blk.1.wo:8 blk.1.wo
explain_case gate slow_class:blk.0.gate_up:6 blk.0.gate_up

# a healthy engine: no culprit, and no evidence taken
start_serve healthy --synthetic tiny --workers 2
rm -f "$tmp/stop"
( for i in $(seq 1 400); do
    [ -e "$tmp/stop" ] && break
    completion "load $i" 8 "$tmp/load.json" >/dev/null
  done ) &
bg=$!
sleep 0.3
"$MS" explain --socket "$SOCK" --slo tpot=1s --window 1s --json >"$tmp/healthy.json"
touch "$tmp/stop"
wait "$bg"
python3 -c "
import json; r = json.load(open('$tmp/healthy.json'))
assert r['culprit'] is None and r['evidence'] is None, r['culprit']" || { cat "$tmp/healthy.json"; fail "healthy"; }
stop_serve healthy
SERVE_PID=""
echo "1 passed, 0 failed"
