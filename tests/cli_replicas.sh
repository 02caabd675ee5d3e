#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# One question to several engines: two `megascope serve` replicas (tiny) under
# concurrent load. A query given both sockets runs beside each engine's own
# query of the same program, all attached before the load and read after it:
# the merged counts, sums, histogram buckets and max equal what the engines'
# own answers add up to (and the requests sent); each engine's coverage is in
# the answer beside the total. stats over both: counters add, the total's
# quantiles lie between the engines'. A socket nobody serves is named
# unreachable (exit 1, the others answer); an engine killed in the window is
# named gone with its counts kept, one that hangs is gone after 5 s without
# an answer; an engine that refuses the attach leaves
# nothing attached anywhere; replicas of different plans are refused by name.
set -euo pipefail
MS=$1
SRC=${MS_SRC:-$(cd "$(dirname "$0")/.." && pwd)}
for t in curl python3; do
  command -v "$t" >/dev/null || { echo "skipped: no $t"; exit 77; }
done
# shellcheck source=tests/serve_lib.sh
source "$SRC/tests/serve_lib.sh"
tmp=$(mktemp -d)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() { echo "FAILED: $*"; exit 1; }

# replica NAME [serve options]: starts one; its socket and URL in S_NAME, U_NAME, P_NAME
replica() {
  local name=$1
  shift
  start_serve "$name" "$@" || fail "serve $name"
  PIDS+=("$SERVE_PID")
  printf -v "S_$name" '%s' "$SOCK"
  printf -v "U_$name" '%s' "$URL"
  printf -v "P_$name" '%s' "$SERVE_PID"
}
replica a --synthetic tiny --workers 1
replica b --synthetic tiny --workers 2  # engines of different sizes merge as workers do
# attachments attached now on a socket
attached() { "$MS" ls --socket "$1" --json | grep -c '"attached": true' || true; }
wait_attached() { # SOCKET N
  for _ in $(seq 1 300); do
    [ "$(attached "$1")" -ge "$2" ] && return 0
    sleep 0.05
  done
  fail "$1: $2 attachments did not attach"
}
# load URL CLIENTS REQUESTS_EACH: concurrent completions, every one must succeed
load() {
  python3 - "$@" <<'EOF'
import json, sys, threading, urllib.request
url, clients, each = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
bad = []
def client(c):
    for i in range(each):
        body = {"prompt": "replica " + "word " * (1 + (c * 5 + i) % 7), "max_tokens": 4 + (c + i) % 5,
                "temperature": 0}
        req = urllib.request.Request(url + "/v1/completions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=120) as r:
                json.load(r)
        except Exception as e:
            bad.append(str(e))
ts = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
[t.start() for t in ts]
[t.join() for t in ts]
sys.exit(f"{len(bad)} requests failed: {bad[0]}" if bad else 0)
EOF
}

PROG='request /phase == finished/ { @done = count() } request /phase == token/ { @tok = count() }
  task_end { @us = hist((t_end - t_begin) / 1000); @max = max(t_end - t_begin); @avg = avg(t_end - t_begin) }'

# ---- the same program merged and on each engine, over the same window ----
"$MS" query --socket "$S_a" --socket "$S_b" --json "$PROG" >"$tmp/both.json" 2>"$tmp/both.err" &
q_both=$!
"$MS" query --socket "$S_a" --json "$PROG" >"$tmp/a.json" 2>"$tmp/a.err" &
q_a=$!
"$MS" query --socket "$S_b" --json "$PROG" >"$tmp/b.json" 2>"$tmp/b.err" &
q_b=$!
wait_attached "$S_a" 2
wait_attached "$S_b" 2
"$MS" stats --socket "$S_a" --json >"$tmp/stats_a0.json"
"$MS" stats --socket "$S_b" --json >"$tmp/stats_b0.json"
load "$U_a" 4 6 &
la=$!
load "$U_b" 3 5 || fail "load on b"
wait $la || fail "load on a"
kill -INT $q_both $q_a $q_b
wait $q_both || { cat "$tmp/both.err"; fail "the merged query failed"; }
wait $q_a || { cat "$tmp/a.err"; fail "a's query failed"; }
wait $q_b || { cat "$tmp/b.err"; fail "b's query failed"; }
[ "$(attached "$S_a")" = 0 ] && [ "$(attached "$S_b")" = 0 ] || fail "a query left an attachment"
python3 - "$tmp/both.json" "$tmp/a.json" "$tmp/b.json" "$S_a" "$S_b" <<'EOF' || fail "the merged answer"
import json, sys
both, a, b = (json.loads(open(p).read().splitlines()[-1]) for p in sys.argv[1:4])
def m(r, name): return next(x for x in r["maps"] if x["name"] == name)
def v(r, name): return m(r, name)["entries"][0]
# every request sent finished inside the window: 4 x 6 on a, 3 x 5 on b
assert v(a, "@done")["value"] == 24 and v(b, "@done")["value"] == 15, (v(a, "@done"), v(b, "@done"))
assert v(both, "@done")["value"] == v(a, "@done")["value"] + v(b, "@done")["value"], v(both, "@done")
assert v(both, "@tok")["value"] == v(a, "@tok")["value"] + v(b, "@tok")["value"] > 0
assert v(both, "@max")["value"] == max(v(a, "@max")["value"], v(b, "@max")["value"])
assert v(both, "@avg")["count"] == v(a, "@avg")["count"] + v(b, "@avg")["count"]
assert v(both, "@avg")["sum"] == v(a, "@avg")["sum"] + v(b, "@avg")["sum"]
def buckets(r): return {(x["lo"], x["hi"]): x["count"] for x in v(r, "@us")["buckets"]}
ba, bb, bm = buckets(a), buckets(b), buckets(both)
assert bm == {k: ba.get(k, 0) + bb.get(k, 0) for k in set(ba) | set(bb)}, (bm, ba, bb)
# each engine's coverage beside the total, which sums them
reps = both["replicas"]
assert [r["socket"] for r in reps] == sys.argv[4:6] and all(r["state"] == "answering" and r["in_total"] for r in reps)
assert both["engines"] == 2 and both["engines_in_total"] == 2
for k in ("eligible", "executed", "throttled", "lost"):
    assert both["coverage"][k] == sum(r["coverage"][k] for r in reps), k
assert all(r["coverage"]["executed"] > 0 and r["coverage"]["throttled"] == 0 for r in reps), reps
assert both["dropped"] == 0 and both["final"]
EOF

# the text form names both engines and the total
"$MS" query --socket "$S_a" --socket "$S_b" --for 300ms 'request { @ = count() }' >"$tmp/text.out"
grep -q "^replica $S_a: answering, attachment [0-9]*; eligible" "$tmp/text.out" || fail "text: $(cat "$tmp/text.out")"
grep -q "^coverage of 2 of 2 engines: eligible" "$tmp/text.out" || fail "text total: $(cat "$tmp/text.out")"

# ---- stats: counters add; the total's quantiles between the engines' ----
"$MS" stats --socket "$S_a" --socket "$S_b" --json >"$tmp/stats.json"
"$MS" stats --socket "$S_a" --json >"$tmp/stats_a.json"
"$MS" stats --socket "$S_b" --json >"$tmp/stats_b.json"
python3 - "$tmp/stats.json" "$tmp/stats_a.json" "$tmp/stats_b.json" "$tmp/stats_a0.json" "$tmp/stats_b0.json" <<'EOF' || fail "stats"
import json, sys
t, a, b, a0, b0 = (json.load(open(p)) for p in sys.argv[1:6])
assert t["engines"] == 2 and t["engines_in_total"] == 2 and len(t["replicas"]) == 2
tot = t["total"]
for k in ("steps", "tokens", "requests_finished", "workers", "tasks"):
    assert tot[k] == sum(r["stats"][k] for r in t["replicas"]), k
assert a["requests_finished"] - a0["requests_finished"] == 24 and b["requests_finished"] - b0["requests_finished"] == 15
assert tot["requests_finished"] == a["requests_finished"] + b["requests_finished"]
for lat in ("ttft", "tpot"):
    T, A, B = tot[lat], a[lat], b[lat]
    assert T["count"] == A["count"] + B["count"] and abs(T["sum_s"] - A["sum_s"] - B["sum_s"]) < 1e-6, lat
    assert T["quantiles_of"] == A["quantiles_of"] + B["quantiles_of"] and "recent" in T["quantiles_from"], T
    lo, hi = sorted((A["p50_s"], B["p50_s"]))
    assert lo <= T["p50_s"] <= hi, (lat, T["p50_s"], lo, hi)  # a union's median lies between its parts'
    assert T["max_s"] == max(A["max_s"], B["max_s"]) and T["min_s"] == min(A["min_s"], B["min_s"])
EOF
"$MS" stats --socket "$S_a" --socket "$S_b" >"$tmp/stats.txt"
grep -q "^total of 2 of 2 engines: tiny, 3 workers" "$tmp/stats.txt" || fail "stats text: $(cat "$tmp/stats.txt")"

# ---- a socket nobody serves: named, left out, exit 1; the others answer ----
set +e
"$MS" query --socket "$S_a" --socket "$tmp/none.sock" --socket "$S_b" --for 300ms --json 'request { @ = count() }' \
  >"$tmp/none.json" 2>"$tmp/none.err"
rc=$?
"$MS" stats --socket "$S_a" --socket "$tmp/none.sock" >"$tmp/none_stats.txt" 2>/dev/null
rc2=$?
set -e
[ "$rc" = 1 ] && [ "$rc2" = 1 ] || fail "an unreachable engine: exit $rc, stats $rc2"
python3 - "$tmp/none.json" "$tmp/none.sock" <<'EOF' || fail "the unreachable engine: $(cat "$tmp/none.err")"
import json, sys
r = json.load(open(sys.argv[1]))
gone = [x for x in r["replicas"] if x["socket"] == sys.argv[2]][0]
assert gone["state"] == "unreachable" and not gone["in_total"] and "cannot connect" in gone["error"], gone
assert r["engines"] == 3 and r["engines_in_total"] == 2
EOF
grep -q "^replica $tmp/none.sock: unreachable (cannot connect" "$tmp/none_stats.txt" || fail "stats: $(cat "$tmp/none_stats.txt")"
[ "$(attached "$S_a")" = 0 ] || fail "left attached"

# ---- an engine killed in the window: named gone, what it counted kept ----
replica c --synthetic tiny --workers 1
"$MS" query --socket "$S_a" --socket "$S_c" --json "$PROG" >"$tmp/dead.json" 2>"$tmp/dead.err" &
qd=$!
wait_attached "$S_c" 1
wait_attached "$S_a" 1
load "$U_c" 2 3 || fail "load on c"
sleep 0.6 # the query reads its engines' coverage every 250 ms
kill -KILL "$P_c"
wait "$P_c" 2>/dev/null || true
load "$U_a" 1 2 || fail "load on a"
sleep 0.6
kill -INT $qd
set +e
wait $qd
rc=$?
set -e
[ "$rc" = 1 ] || { cat "$tmp/dead.err"; fail "a dead engine: exit $rc"; }
grep -q "$S_c stopped answering" "$tmp/dead.err" || fail "not said: $(cat "$tmp/dead.err")"
python3 - "$tmp/dead.json" "$S_c" <<'EOF' || fail "the dead engine"
import json, sys
r = json.loads(open(sys.argv[1]).read().splitlines()[-1])
c = [x for x in r["replicas"] if x["socket"] == sys.argv[2]][0]
assert c["state"] == "gone" and c["in_total"] and "stopped answering" in c["error"], c
assert c["coverage"]["executed"] > 0, c
done = next(x for x in r["maps"] if x["name"] == "@done")["entries"][0]["value"]
assert done == 6 + 2, done  # c's six before it died, a's two after
EOF
[ "$(attached "$S_a")" = 0 ] || fail "left attached after a dead engine"

# ---- an engine that hangs (stopped): gone after its 5 s to answer, the query still ends ----
replica f --synthetic tiny --workers 1
"$MS" query --socket "$S_a" --socket "$S_f" --for 2s --json 'request { @ = count() }' >"$tmp/hung.json" 2>"$tmp/hung.err" &
qh=$!
wait_attached "$S_f" 1
# the engine lists the attachment before the query has read its reply: stopped then, f is "unreachable"
sleep 0.5
kill -STOP "$P_f"
set +e
wait $qh
rc=$?
set -e
kill -CONT "$P_f"
[ "$rc" = 1 ] || { cat "$tmp/hung.err"; fail "a hung engine: exit $rc"; }
python3 - "$tmp/hung.json" "$S_f" <<'EOF2' || fail "the hung engine: $(cat "$tmp/hung.err")"
import json, sys
r = json.loads(open(sys.argv[1]).read().splitlines()[-1])
f = [x for x in r["replicas"] if x["socket"] == sys.argv[2]][0]
assert f["state"] == "gone" and "no reply" in f["error"], f
EOF2
[ "$(attached "$S_a")" = 0 ] || fail "left attached after a hung engine"
grep -q "$S_f may still hold attachment [0-9]* (it did not answer): \`megascope detach --socket $S_f" "$tmp/hung.err" ||
  fail "the hung engine's attachment not named: $(cat "$tmp/hung.err")"

# ---- a refusal by one engine: nothing left attached anywhere ----
replica d --synthetic tiny --workers 1 --attach-bytes 4096
set +e
"$MS" query --socket "$S_a" --socket "$S_d" --socket "$S_b" --for 1s 'request { @ = count() }' >/dev/null 2>"$tmp/refused.err"
rc=$?
set -e
[ "$rc" = 1 ] || fail "a refusal: exit $rc"
grep -q "query: $S_d refused the query; the others are detached" "$tmp/refused.err" || fail "$(cat "$tmp/refused.err")"
for s in "$S_a" "$S_b" "$S_d"; do [ "$(attached "$s")" = 0 ] || fail "$s: left attached after a refusal"; done

# ---- replicas of different plans: refused by name before anything attaches ----
replica e --synthetic tiny-qwen3 --workers 1
set +e
"$MS" query --socket "$S_a" --socket "$S_e" --for 1s 'request { @ = count() }' >/dev/null 2>"$tmp/plan.err"
rc=$?
set -e
[ "$rc" = 1 ] && grep -q "$S_e serves another plan than $S_a" "$tmp/plan.err" || fail "plans: $rc $(cat "$tmp/plan.err")"
[ "$(attached "$S_a")" = 0 ] || fail "left attached after a plan mismatch"
echo "cli_replicas: merged answers equal their parts; unreachable, dead and refusing engines named"
