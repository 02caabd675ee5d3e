#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Watching an engine across ranks as one: `mpirun -np 2 megascope serve --tp 2`
# answers a query on rank 0's socket for both ranks. Under load, the query's
# program is carried to rank 1, verified and attached there; its maps are read
# on both ranks and merged: @n[device] has both devices, each count is that
# rank's own executions, every rank's coverage is under "ranks" and the total
# is their sum (text: one line a rank); record() rows come from both. A
# monitor object attached there runs on both (ls: a line a rank; maps: rank
# 1's maps too), is replaced on both (or, refused by rank 1, detached on
# both); stats and /metrics count every rank's tasks and workers; one
# trace has both ranks' workers as tracks, with flows from a sending rank's
# task to the receiving one's; `records` consumes both ranks' rings; explain
# judges both ranks' workers. Refusals leave nothing attached on any rank
# (`ls --json`'s "ranks"): an unsafe program (rank 0's verifier, named), and a
# program rank 1 alone cannot take (rank 1 runs under a file-size limit, so a
# map of a million keys cannot be made there), named "rank 1".
# Skipped (77) only when mpirun is absent (scripts/deps.sh installs openmpi-bin).
set -euo pipefail
MS=$1
SRC=${MS_SRC:-$(cd "$(dirname "$0")/.." && pwd)}
# shellcheck source=tests/serve_lib.sh
source "$SRC/tests/serve_lib.sh"
MS_MONITORS=${MS_MONITORS:-$(dirname "$MS")/monitors}
command -v mpirun >/dev/null || { echo "mpirun not found: skipped (scripts/deps.sh installs openmpi-bin)"; exit 77; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
tmp=$(mktemp -d)
MPI_PID=""
cleanup() {
  touch "$tmp/stop"
  stop_mpirun "$MPI_PID"
  wait 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*" >&2
  tail -20 "$tmp/s/err" >&2 2>/dev/null || true
  exit 1
}

# The unsafe program the verifier must refuse.
clang -O2 -g -target bpf -Wall -I"$SRC/include" -I"/usr/include/$(uname -m)-linux-gnu" \
  -c "$SRC/tests/data/monitors/unsafe_null_deref.bpf.c" -o "$tmp/unsafe.bpf.o"

# Two ranks; rank 1 under a 16 MiB file-size limit (its maps are memfds: a
# map over the limit cannot be made there), the same arguments on both.
SOCK="$tmp/s/engine.sock"
mkdir -p "$tmp/s"
chmod 700 "$tmp/s"
# (a wait on the other rank gets 30 s: this machine may be loaded by others)
A=(serve --tp 2 --synthetic tiny --workers 1 --batch 4 --comm-timeout-ms 30000 --http 127.0.0.1:0 --socket "$SOCK")
timeout 600 mpirun -np 1 "$MS" "${A[@]}" : -np 1 bash -c "ulimit -f 16384; trap '' XFSZ; exec \"\$0\" \"\$@\"" \
  "$MS" "${A[@]}" >"$tmp/s/out" 2>"$tmp/s/err" &
MPI_PID=$!
wait_ready "$tmp/s/out" "$MPI_PID" 900 || :
[ -n "$URL" ] && [ -S "$SOCK" ] || { cat "$tmp/s/out" "$tmp/s/err" >&2; fail "not ready"; }

load() {
  while [ ! -e "$tmp/stop" ]; do
    curl -s -m 30 "$URL/v1/completions" -d '{"prompt":"hello","max_tokens":24}' >/dev/null || true
  done
}
load &
load &

# nothing attached anywhere: rank r holds n (ls --json's "ranks")
held() {
  "$MS" ls --socket "$SOCK" --json >"$tmp/ls.json"
  python3 - "$tmp/ls.json" <<'PY' || fail "an attachment is left on a rank: $(cat "$tmp/ls.json")"
import json, sys
d = json.load(open(sys.argv[1]))
assert [r["rank"] for r in d["ranks"]] == [0, 1], d["ranks"]
assert d["ranks"][1]["attachments"] == 0, d["ranks"]
assert not any(a["attached"] for a in d["attachments"]), d["attachments"]
PY
}

# ---- one query, both ranks ----
"$MS" query --socket "$SOCK" 'task_end { @n[device] = count() }' --for 2s --json >"$tmp/q.json" \
  || fail "query across ranks"
python3 - "$tmp/q.json" <<'PY' || fail "the merged answer: $(cat "$tmp/q.json")"
import json, sys
d = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
n = {e["key"]["device"] if isinstance(e["key"], dict) else e["key"][0]: e["value"] for e in d["maps"][0]["entries"]}
ranks = d["ranks"]
assert [r["rank"] for r in ranks] == [0, 1], ranks
assert sorted(n) == [0, 1], n
for r in ranks:
    c = r["coverage"]
    assert c["executed"] > 0, r
    # each device's count is its rank's executions (rank 1's read with them at
    # one step boundary; rank 0's live maps a moment after its coverage)
    assert n[r["rank"]] >= c["executed"] and n[r["rank"]] <= c["executed"] * 1.05, (n, r)
for k in ("eligible", "executed", "throttled", "lost", "failed"):
    assert d["coverage"][k] == sum(r["coverage"][k] for r in ranks), k
print("merged:", n, "coverage", [r["coverage"]["executed"] for r in ranks])
PY
"$MS" query --socket "$SOCK" 'task_end { @n[device] = count() }' --for 1s >"$tmp/q.txt" 2>&1 \
  || fail "query across ranks, text"
grep -q '^rank 1: eligible [1-9]' "$tmp/q.txt" || fail "text: rank 1's line: $(cat "$tmp/q.txt")"
# record() rows from both ranks (rank 1's ring moved into rank 0's copy at each read)
"$MS" query --socket "$SOCK" 'step /phase == 1/ { @ev = record(step, device) }' --for 1s --json >"$tmp/r.json" \
  || fail "record() across ranks"
python3 - "$tmp/r.json" <<'PY' || fail "record() rows of both ranks: $(cat "$tmp/r.json")"
import json, sys
d = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
rows = d["maps"][0]["records"]
devices = {r[1] for r in rows}
assert devices == {0, 1}, devices
PY
grep -q "^every rank's coverage: " "$tmp/q.txt" || fail "text: the total: $(cat "$tmp/q.txt")"
held

# ---- a monitor object on every rank: ls (a line a rank under the row), maps (rank 1's decoded too) ----
id=$("$MS" attach --socket "$SOCK" --name class_time "$MS_MONITORS/class_time.bpf.o") || fail "attach across ranks"
sleep 1
"$MS" ls --socket "$SOCK" >"$tmp/ls.txt" || fail "ls"
grep -qE '^ +rank 1 +[1-9][0-9]* +[1-9]' "$tmp/ls.txt" || fail "ls: rank 1's line: $(cat "$tmp/ls.txt")"
"$MS" maps --socket "$SOCK" "$id" >"$tmp/maps.txt" || fail "maps"
grep -q '^rank 1: monitor class_time' "$tmp/maps.txt" || fail "maps: rank 1's maps: $(cat "$tmp/maps.txt")"
# /metrics: the attachment's coverage on each rank
curl -s -m 30 "$URL/metrics" >"$tmp/am.txt" || fail "/metrics with an attachment"
python3 - "$tmp/am.txt" "$id" <<'PY' || fail "/metrics: the attachment's coverage per rank"
import re, sys
m, aid = open(sys.argv[1]).read(), sys.argv[2]
ex = {int(r): int(v) for r, v in re.findall(
    r'^megascope_attachment_rank_executed_total\{id="%s",monitor="class_time",rank="(\d)"\} (\d+)$' % aid, m, re.M)}
el = {int(r): int(v) for r, v in re.findall(
    r'^megascope_attachment_rank_eligible_total\{id="%s",monitor="class_time",rank="(\d)"\} (\d+)$' % aid, m, re.M)}
assert sorted(ex) == [0, 1] and all(ex.values()), ex
assert all(el[r] >= ex[r] for r in ex), (el, ex)
print("attachment coverage per rank:", ex)
PY
# replace: the new monitor on every rank (its maps read afresh from rank 1)
"$MS" replace --socket "$SOCK" "$id" "$MS_MONITORS/dep_wait.bpf.o" --json >"$tmp/rep.json" ||
  fail "replace across ranks"
python3 - "$tmp/rep.json" <<'PY' || fail "replace across ranks: $(cat "$tmp/rep.json")"
import json, sys
d = json.load(open(sys.argv[1]))
assert d["ok"] and d["name"] == "dep_wait" and d["generation"] == 2 and d["ranks"] == 2, d
PY
sleep 1
"$MS" maps --socket "$SOCK" "$id" >"$tmp/maps.txt" || fail "maps after the replace"
grep -q '^rank 1: monitor dep_wait' "$tmp/maps.txt" || fail "maps after the replace: rank 1's: $(cat "$tmp/maps.txt")"
"$MS" ls --socket "$SOCK" --json >"$tmp/ls.json" || fail "ls after the replace"
python3 - "$tmp/ls.json" "$id" <<'PY' || fail "ls after the replace: $(cat "$tmp/ls.json")"
import json, sys
d, aid = json.load(open(sys.argv[1])), int(sys.argv[2])
a = [a for a in d["attachments"] if a["id"] == aid and a["attached"]]
assert a and a[0]["name"] == "dep_wait", d["attachments"]
assert d["ranks"][1]["attachments"] == 1, d["ranks"]
PY
# a replace rank 1 cannot take (a map over its file-size limit): refused by
# name, and the attachment detached on every rank rather than two programs
"$MS" query --socket "$SOCK" --max-keys 1048576 'task_end { @n[device] = count() }' --emit "$tmp/big.o" >/dev/null ||
  fail "query --emit"
if "$MS" replace --socket "$SOCK" "$id" "$tmp/big.o" >"$tmp/out" 2>"$tmp/err"; then fail "rank 1 took a map it cannot make"; fi
grep -q "failed across ranks, attachment $id detached on every rank: rank 1 refused it" "$tmp/err" ||
  fail "rank 1's refusal of the replace: $(cat "$tmp/err")"
held

# ---- records: every rank's ring (rank 1's as rank 0's copy, "@rank1") ----
id=$("$MS" attach --socket "$SOCK" "$MS_MONITORS/step_trace.bpf.o") || fail "attach step_trace across ranks"
"$MS" records --socket "$SOCK" "$id" --seconds 2 --json >"$tmp/rec.json" 2>"$tmp/rec.err" || fail "records"
python3 - "$tmp/rec.json" <<'PY' || fail "records of both ranks: $(head -c 2000 "$tmp/rec.json")"
import collections, json, sys
n = collections.Counter(json.loads(l).get("map") for l in open(sys.argv[1]))
assert n["step_events"] > 0 and n["step_events@rank1"] > 0, n
PY
"$MS" detach --socket "$SOCK" "$id" >/dev/null || fail "detach step_trace"
held

# ---- stats and /metrics count every rank ----
"$MS" stats --socket "$SOCK" --json >"$tmp/stats.json" || fail "stats"
curl -s -m 30 "$URL/metrics" >"$tmp/metrics.txt" || fail "/metrics"
python3 - "$tmp/stats.json" "$tmp/metrics.txt" <<'PY' || fail "stats and /metrics across ranks"
import json, re, sys
d = json.load(open(sys.argv[1]))
ranks, eng = d["ranks"], d["engine"]
assert [r["rank"] for r in ranks] == [0, 1] and eng["ranks"] == 2, (ranks, eng)
assert all(r["workers"] == 1 and r["tasks"] > 0 and r["comm"]["received"] > 0 for r in ranks), ranks
assert eng["workers"] == 2 and eng["tasks"] == sum(r["tasks"] for r in ranks), eng
m = open(sys.argv[2]).read()
tasks = {int(r): int(v) for r, v in re.findall(r'^megascope_rank_tasks_total\{rank="(\d)"\} (\d+)$', m, re.M)}
assert sorted(tasks) == [0, 1] and all(tasks.values()), tasks
total = int(re.search(r"^megascope_tasks_total (\d+)$", m, re.M).group(1))
assert total == sum(tasks.values()), (total, tasks)
assert re.search(r"^megascope_workers 2$", m, re.M)
PY

# ---- one trace, every rank's workers as tracks, flows from a remote sender ----
"$MS" trace --socket "$SOCK" --seconds 1 --out "$tmp/trace.json" >/dev/null || fail "trace across ranks"
python3 - "$tmp/trace.json" <<'PY' || fail "the trace across ranks"
import json, sys
d = json.load(open(sys.argv[1]))
ev, meta = d["traceEvents"], d["metadata"]
names = {e["tid"]: e["args"]["name"] for e in ev if e.get("ph") == "M" and "tid" in e}
assert names == {0: "rank 0 worker 0", 1: "rank 1 worker 0"}, names
assert meta["ranks"] == 2 and meta["rank_workers"] == 1 and "clock_error_ns" in meta, meta
slices = {t: sum(1 for e in ev if e.get("ph") == "X" and e["tid"] == t) for t in (0, 1)}
assert all(slices.values()), slices
ends = {}
for e in ev:
    if e.get("ph") in ("s", "f"):
        ends.setdefault(e["id"], {})[e["ph"]] = e["tid"]
remote = sum(1 for x in ends.values() if x.get("s") != x.get("f"))
assert remote > 0, "no flow from one rank's sender to another rank's receiver"
print("trace:", slices, "flows across ranks", remote, "clock error bound", meta["clock_error_ns"], "ns")
PY

# ---- explain judges every rank's workers, numbered rank after rank ----
"$MS" explain --socket "$SOCK" --slo tpot=50ms --window 2s --json >"$tmp/explain.json" 2>"$tmp/explain.err" ||
  fail "explain across ranks: $(cat "$tmp/explain.err")"
python3 - "$tmp/explain.json" <<'PY' || fail "explain across ranks: $(cat "$tmp/explain.json")"
import json, sys
d = json.load(open(sys.argv[1]))
assert d["rank_workers"] == 1 and d["steps"] > 0, d
PY
held

# ---- refusals leave nothing anywhere ----
if "$MS" attach --socket "$SOCK" "$tmp/unsafe.bpf.o" >"$tmp/out" 2>"$tmp/err"; then fail "the unsafe program attached"; fi
grep -q "rank 0: .*verifier rejected" "$tmp/err" || fail "the unsafe program's message: $(cat "$tmp/err")"
held
if "$MS" query --socket "$SOCK" --max-keys 1048576 'task_end { @n[device] = count() }' --for 1s \
  >"$tmp/out" 2>"$tmp/err"; then fail "a map rank 1 cannot make attached"; fi
grep -q "attach failed across ranks, detached on every rank: rank 1 refused it" "$tmp/err" ||
  fail "rank 1's refusal: $(cat "$tmp/err")"
held
# and the engine still answers for both ranks
"$MS" query --socket "$SOCK" 'task_end { @n[device] = count() }' --for 1s --json >"$tmp/q2.json" ||
  fail "a query after the refusals"
grep -q '"rank":1' "$tmp/q2.json" || fail "rank 1 after the refusals"

touch "$tmp/stop"
kill -TERM "$(grep -o ', pid [0-9]*' "$tmp/s/out" | head -1 | grep -o '[0-9]*')"
for _ in $(seq 1 300); do kill -0 "$MPI_PID" 2>/dev/null || break; sleep 0.1; done
wait "$MPI_PID" || fail "mpirun exit $?"
MPI_PID=""
echo "ok: query, ls and refusals across 2 ranks"
