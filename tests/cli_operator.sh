#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Operator details of `megascope serve`: `schema` lists every bucket the engine
# runs; `replace` takes attach's budget options (those given change, the others
# stay); /metrics labels each attachment series with its generation, so the new
# generation's counts never appear under the old one's labels; `maps --release`
# is the last read-out of a detached attachment, after which its id is gone; an
# idle control client is closed after --control-idle; a detached attachment
# left alone is freed after --detached-retention.
set -euo pipefail
MS=$1
SRC=${MS_SRC:-$(cd "$(dirname "$0")/.." && pwd)}
MON=${MS_MONITORS:-}
for m in class_time queueing; do
  [ -n "$MON" ] && [ -f "$MON/$m.bpf.o" ] || { echo "skipped: no shipped monitors (MS_MONITORS)"; exit 77; }
done
for t in curl python3; do
  command -v "$t" >/dev/null || { echo "skipped: no $t"; exit 77; }
done
# shellcheck source=tests/serve_lib.sh
source "$SRC/tests/serve_lib.sh"
serve_scratch
fail() { echo "FAILED: $*"; exit 1; }
pass=0
ok() { pass=$((pass + 1)); }

# retention 8 s: the replaced generations must still be there when /metrics is
# scraped after a completion (1 s was too short on a loaded machine)
start_serve op --synthetic tiny --workers 2 --batch 8 --detached-retention 8 --control-idle 1
"$MS" schema --socket "$SOCK" >"$tmp/schema.json"
python3 - "$tmp/schema.json" <<'PY' || fail "schema buckets"
import json, sys
d = json.load(open(sys.argv[1]))
assert [b["bucket"] for b in d["buckets"]] == [1, 2, 4, 8], d["buckets"]
assert all(b["tasks"] > 0 and b["events"] > 0 for b in d["buckets"])
assert d["task_classes"] and d["schema_version"] >= 1
PY
ok

ID=$("$MS" attach --socket "$SOCK" --sample 3 --name first "$MON/class_time.bpf.o")
code=$(completion "one" 8 "$tmp/c1.json")
[ "$code" = 200 ] || fail "request: $code"
"$MS" replace --socket "$SOCK" "$ID" --max-per-step 5 --name second "$MON/queueing.bpf.o" >/dev/null
"$MS" ls --socket "$SOCK" --json >"$tmp/ls.json"
python3 - "$tmp/ls.json" "$ID" <<'PY' || fail "replace budget"
import json, sys
a = [x for x in json.load(open(sys.argv[1]))["attachments"] if x["id"] == int(sys.argv[2])][0]
assert a["budget"] == {"max_per_step": 5, "sample": 3, "ringbuf_bytes": 0}, a["budget"]
assert a["generation"] == 2 and a["name"] == "second"
PY
"$MS" replace --socket "$SOCK" "$ID" --interp --sample 1 --name third "$MON/queueing.bpf.o" >/dev/null
"$MS" ls --socket "$SOCK" --json >"$tmp/ls.json"
python3 - "$tmp/ls.json" "$ID" <<'PY' || fail "replace --interp"
import json, sys
a = [x for x in json.load(open(sys.argv[1]))["attachments"] if x["id"] == int(sys.argv[2])][0]
assert a["budget"] == {"max_per_step": 5, "sample": 1, "ringbuf_bytes": 0}, a["budget"]
assert a["jitted"] == 0 and a["generation"] == 3, a
PY
ok
code=$(completion "two" 8 "$tmp/c2.json")
[ "$code" = 200 ] || fail "request: $code"
curl -s --max-time 30 "$URL/metrics" >"$tmp/m.prom"
python3 - "$tmp/m.prom" "$ID" <<'PY' || fail "metrics generation labels"
import re, sys
page, aid = open(sys.argv[1]).read(), sys.argv[2]
rows = re.findall(r'^megascope_attachment_eligible_total\{id="%s",generation="(\d+)",monitor="([^"]*)"\} (\d+)$' % aid,
                  page, re.M)
names = {g: m for g, m, _ in rows}
assert names.get("1") == "first" and names.get("3") == "third", rows  # each generation under its own monitor
assert int([v for g, _, v in rows if g == "3"][0]) > 0, rows
PY
ok

# the last read-out releases; the id is gone afterwards
"$MS" detach --socket "$SOCK" "$ID" >/dev/null
"$MS" maps --socket "$SOCK" "$ID" --release >"$tmp/final.txt"
grep -q "detached" "$tmp/final.txt" || fail "final read-out: $(cat "$tmp/final.txt")"
if "$MS" maps --socket "$SOCK" "$ID" >/dev/null 2>"$tmp/err"; then fail "attachment $ID readable after its release"; fi
grep -q "freed after its retention" "$tmp/err" || fail "no 'freed' message: $(cat "$tmp/err")"
# --release on an attached one is refused
ID2=$("$MS" attach --socket "$SOCK" "$MON/class_time.bpf.o")
if "$MS" maps --socket "$SOCK" "$ID2" --release >/dev/null 2>"$tmp/err"; then fail "--release of an attached one"; fi
grep -q "is attached" "$tmp/err" || fail "no 'is attached' message: $(cat "$tmp/err")"
ok
# left alone, a detached attachment is freed after the retention (8 s here)
"$MS" detach --socket "$SOCK" "$ID2" >/dev/null
for _ in $(seq 1 300); do
  "$MS" ls --socket "$SOCK" --json >"$tmp/ls.json"
  python3 -c "import json,sys; sys.exit(0 if not json.load(open(sys.argv[1]))['attachments'] else 1)" "$tmp/ls.json" \
    && break
  sleep 0.1
done
python3 -c "import json,sys; sys.exit(0 if not json.load(open(sys.argv[1]))['attachments'] else 1)" "$tmp/ls.json" \
  || fail "detached attachment not freed after its retention: $(cat "$tmp/ls.json")"
ok

# an idle client is closed (--control-idle 1); the server keeps serving
python3 - "$SOCK" <<'PY' || fail "idle client"
import socket, sys
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
s.settimeout(20)
assert s.recv(1) == b"", "expected the server to close an idle connection"
PY
"$MS" stats --socket "$SOCK" --json >"$tmp/stats.json"
python3 -c "import json,sys; sys.exit(0 if json.load(open(sys.argv[1]))['control']['idle_closed'] >= 1 else 1)" \
  "$tmp/stats.json" || fail "idle_closed not counted"
ok
stop_serve op
echo "$pass passed, 0 failed"
