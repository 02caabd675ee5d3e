#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# megascope interfere: each kind of real interference starts, does what it says
# (a spinning thread uses CPU time, the bandwidth hog streams bytes, the
# preemptor spins bursts and names its scheduling policy, cold drops a file's
# pages from the page cache, long_context writes a valid request), stops by
# itself or on SIGTERM and leaves no process behind; bad arguments are refused.
set -euo pipefail
MS=$1
command -v python3 >/dev/null || { echo "skipped: no python3"; exit 77; }
tmp=$(mktemp -d "${TMPDIR:-/var/tmp}/ms-interfere.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAILED: $*"; exit 1; }

"$MS" interfere --help | grep -q -- '--kind K' || fail "--help"
rc=0; "$MS" interfere 2>"$tmp/err" || rc=$?
[ "$rc" -eq 2 ] && grep -q 'kind is required' "$tmp/err" || fail "no --kind: exit $rc"
rc=0; "$MS" interfere --kind spin --cpu 0 --worker 0 2>"$tmp/err" || rc=$?
[ "$rc" -eq 2 ] || fail "--cpu and --worker together: exit $rc"
rc=0; "$MS" interfere --kind cold 2>"$tmp/err" || rc=$?
[ "$rc" -eq 2 ] && grep -q 'needs --file' "$tmp/err" || fail "cold without --file: exit $rc"
rc=0; "$MS" interfere --kind spin --cpu 4095 --for 100ms 2>"$tmp/err" || rc=$?
[ "$rc" -eq 1 ] && grep -q 'cannot run on CPU 4095' "$tmp/err" || { cat "$tmp/err"; fail "a CPU that is not there: exit $rc"; }

"$MS" interfere --kind spin --worker 0 --for 200ms --json >"$tmp/spin.json"
"$MS" interfere --kind membw --worker 0 --for 200ms --buffer 16777216 --json >"$tmp/membw.json"
"$MS" interfere --kind preempt --worker 0 --for 300ms --gap 5ms --burst 1ms --json >"$tmp/preempt.json"
python3 - "$tmp" <<'PY'
import json, sys
d = sys.argv[1]
s = json.load(open(d + "/spin.json"))
assert s["kind"] == "spin" and s["cpu"] >= 0 and s["cpu_s"] > 0 and not s["interrupted"], s
m = json.load(open(d + "/membw.json"))
assert m["kind"] == "membw" and m["bytes"] > 0 and m["gb_per_s"] > 0, m
p = json.load(open(d + "/preempt.json"))
assert p["kind"] == "preempt" and p["bursts"] > 0 and p["policy"].startswith("SCHED_"), p
PY

# SIGTERM ends a long one early, cleanly
"$MS" interfere --kind spin --worker 0 --for 60s >"$tmp/term.out" 2>&1 &
pid=$!
sleep 0.3
kill -TERM "$pid"
for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$pid" 2>/dev/null; then kill -KILL "$pid"; fail "did not stop within 10 s of SIGTERM"; fi
wait "$pid" || fail "exit $? after SIGTERM"
grep -q 'stopped by a signal' "$tmp/term.out" || { cat "$tmp/term.out"; fail "no stop line"; }

# cold: a file read into the page cache, then dropped from it
head -c 8388608 /dev/urandom >"$tmp/model.bin"
sync "$tmp/model.bin" 2>/dev/null || sync
cat "$tmp/model.bin" >/dev/null
"$MS" interfere --kind cold --file "$tmp/model.bin" --json >"$tmp/cold.json"
python3 - "$tmp/cold.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
assert c["pages"] == 8388608 // 4096 or c["pages"] > 0, c
# a filesystem that keeps files in memory (tmpfs) cannot drop them: then nothing moves
assert c["resident_after"] <= c["resident_before"], c
print("cold: %d of %d pages cached before, %d after" % (c["resident_before"], c["pages"], c["resident_after"]))
PY

"$MS" interfere --kind long_context --tokens 300 --max-tokens 8 >"$tmp/req.json"
python3 - "$tmp/req.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
words = r["messages"][0]["content"].split()
assert len(words) >= 300 and r["max_tokens"] == 8 and r["stream"] is True, r
PY
echo "interfere: spin, membw, preempt, cold and long_context as described"
