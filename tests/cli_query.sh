#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# megascope query against a live `megascope serve`: the worked one-liners of
# docs/query.md, each with the answer the schema determines (requests sent one
# at a time, so every step is bucket 1); a compile error exits 2 with its
# column and attaches nothing; --every prints while it runs; --emit writes a
# bundle that verify and attach take; --list equals the doc's table; run
# --query on the simulator gives the same answer under the JIT and the
# interpreter; the figures a query prints (quantiles, sum, avg, hist) agree with
# the same values recorded raw by the same query (exact quantiles of the records
# within the stated 3.2%, the rest exactly), on the simulator and on the CPU.
# Every request made meanwhile succeeds.
set -euo pipefail
MS=$1
SRC=${MS_SRC:-$(cd "$(dirname "$0")/.." && pwd)}
for t in curl python3; do
  command -v "$t" >/dev/null || { echo "skipped: no $t"; exit 77; }
done
# shellcheck source=tests/serve_lib.sh
source "$SRC/tests/serve_lib.sh"
serve_scratch
fail() { echo "FAILED: $*"; exit 1; }
DOC="$SRC/docs/query.md"

# the doc's reference table is the compiler's
"$MS" query --list >"$tmp/list.md"
python3 - "$DOC" "$tmp/list.md" <<'EOF' || fail "docs/query.md's tables differ from megascope query --list"
import sys
doc = open(sys.argv[1]).read()
table = doc.split("<!-- query --list -->\n", 1)[1].split("<!-- end -->", 1)[0]
sys.exit(0 if table == open(sys.argv[2]).read() else 1)
EOF

start_serve q --synthetic tiny --workers 2 --max-batched-tokens 0  # one row per request: the schema's task counts per step
"$MS" schema --socket "$SOCK" --rows 1 >"$tmp/schema.json"

# the engine's attachments as `ls --json` lists them; a failed ls fails the test
# (a negative grep on its output must not pass because ls printed nothing)
listing() { "$MS" ls --socket "$SOCK" --json >"$tmp/ls.json" || fail "ls failed"; cat "$tmp/ls.json"; }
# waits until the query's attachment is listed (the query process is in the background)
wait_attached() {
  for _ in $(seq 1 200); do
    if "$MS" ls --socket "$SOCK" --json 2>/dev/null | grep -q '"attached": true'; then return 0; fi
    sleep 0.05
  done
  fail "the query did not attach"
}
# requests one at a time; each must succeed
requests() {
  for i in $(seq 1 "$1"); do
    code=$(completion "hello $i" 6 "$tmp/c$i.json")
    [ "$code" = 200 ] || fail "completion $i: HTTP $code"
  done
}
# one_liner NAME PROGRAM: runs it as the doc writes it, with 3 requests inside its window
one_liner() {
  grep -qF -- "megascope query --for 3s --json '$2'" "$DOC" || fail "one-liner $1 is not in docs/query.md"
  "$MS" query --socket "$SOCK" --for 3s --json "$2" >"$tmp/$1.json" 2>"$tmp/$1.err" &
  local qp=$!
  wait_attached
  requests 3
  wait $qp || { cat "$tmp/$1.err"; fail "query $1 failed"; }
  # detached at the end
  listing >"$tmp/ls.out"
  grep -q '"attached": true' "$tmp/ls.out" && fail "query $1 left its attachment"
  return 0
}

one_liner classes 'task_end { @[class] = count() } step /phase == end/ { @steps = count() }'
python3 - "$tmp/classes.json" "$tmp/schema.json" <<'EOF' || fail "tasks per class"
import json, sys
r = json.load(open(sys.argv[1])); s = json.load(open(sys.argv[2]))
assert r["final"] and r["coverage"]["throttled"] == 0 and r["dropped"] == 0, r["coverage"]
maps = {m["name"]: m for m in r["maps"]}
steps = maps["@steps"]["entries"][0]["value"]
assert steps >= 3 * 6, steps  # three requests of six tokens, one at a time
got = {e["key"][0]: e["value"] for e in maps["@"]["entries"]}
for c in s["task_classes"]:
    want = c["tasks"] * steps
    assert got.get(c["name"], 0) == want, (c["name"], got.get(c["name"]), want)
assert r["coverage"]["executed"] == sum(got.values()) + 2 * steps, r["coverage"]  # steps begin and end
EOF

one_liner attn 'task_end /op == attn/ { @[step] = count() }'
python3 - "$tmp/attn.json" "$tmp/schema.json" <<'EOF' || fail "attention tasks per step"
import json, sys
r = json.load(open(sys.argv[1])); s = json.load(open(sys.argv[2]))
per_step = sum(c["tasks"] for c in s["task_classes"] if c["op"] == "attn")
assert per_step == 8, per_step  # tiny: two layers, two KV heads, each in the CPU's two parts
vals = [e["value"] for e in r["maps"][0]["entries"]]
assert len(vals) >= 18 and all(v == per_step for v in vals), vals
EOF

one_liner finished 'request /phase == finished/ { @ = count() }'
python3 -c "
import json,sys; r=json.load(open('$tmp/finished.json'))
assert r['maps'][0]['entries'][0]['value'] == 3, r" || fail "requests finished"

one_liner wo 'task_end /class =~ "blk.*.wo"/ { @[worker] = count() }'
python3 - "$tmp/wo.json" "$tmp/classes.json" <<'EOF' || fail "wo tasks by worker"
import json, sys
r = json.load(open(sys.argv[1]))
total = sum(e["value"] for e in r["maps"][0]["entries"])
assert {e["key"][0] for e in r["maps"][0]["entries"]} <= {0, 1}
assert total > 0 and total % (2 * 8) == 0, total  # two layers of eight wo tasks per step
EOF

# a compile error: exit 2, the column and a caret, nothing attached
set +e
"$MS" query --socket "$SOCK" 'step { @[class] = count() }' >"$tmp/err.out" 2>"$tmp/err.txt"
rc=$?
set -e
[ "$rc" = 2 ] || fail "a compile error exited $rc"
grep -q "column 10: field 'class' is not defined for hook 'step'" "$tmp/err.txt" || { cat "$tmp/err.txt"; fail "message"; }
grep -qF "           ^" "$tmp/err.txt" || fail "no caret under column 10"
listing >"$tmp/ls.out"
grep -q '"attached": true' "$tmp/ls.out" && fail "a refused query attached"
set +e
"$MS" query --socket "$SOCK" 'task_end /class == blk.7.wo/ { @ = count() }' 2>"$tmp/err2.txt"
rc=$?
"$MS" query --socket "$SOCK" --for 2x 'step { @ = count() }' 2>"$tmp/err3.txt"
rc3=$?
set -e
[ "$rc" = 2 ] && grep -q "'blk.7.wo' is not a task class (task classes: step_start" "$tmp/err2.txt" ||
  fail "an unknown class: $(cat "$tmp/err2.txt")"
[ "$rc3" = 2 ] && grep -q "expected a duration" "$tmp/err3.txt" || fail "a bad --for"

# --schema FILE against the engine: a plain compile's classes are not the CPU engine's (its plans
# norm inside qkv, gate_up and the LM head), so it is refused, saying the first id they differ at;
# `compile --backend cpu` writes the engine's, and that one is taken
"$MS" compile --synthetic tiny --schema-out "$tmp/plain.json" >/dev/null
"$MS" compile --synthetic tiny --backend cpu --schema-out "$tmp/cpu.json" >/dev/null
set +e
"$MS" query --socket "$SOCK" --for 1s --schema "$tmp/plain.json" 'task_end { @[class] = count() }' \
  >/dev/null 2>"$tmp/err4.txt"
rc=$?
set -e
[ "$rc" = 2 ] && grep -q "does not name the engine's classes as the engine does: task_class [0-9]* is blk.0.attn_norm" \
  "$tmp/err4.txt" || fail "a plain compile's schema against the CPU engine: rc $rc, $(cat "$tmp/err4.txt")"
listing >"$tmp/ls.out"
grep -q '"attached": true' "$tmp/ls.out" && fail "a query with another plan's schema attached"
"$MS" query --socket "$SOCK" --for 1s --json --schema "$tmp/cpu.json" 'task_end { @[class] = count() }' \
  >"$tmp/cpu-schema.json" 2>"$tmp/err5.txt" &
qp=$!
wait_attached
requests 1
wait $qp || fail "the engine's own schema from compile --backend cpu: $(cat "$tmp/err5.txt")"
grep -q '"blk.0.qkv"' "$tmp/cpu-schema.json" || fail "no blk.0.qkv in $(cat "$tmp/cpu-schema.json")"
# a bundle emitted against a schema file carries that schema's digests: `attach` of one made with a
# plain compile's schema is refused by the CPU engine, naming why; one made with the engine's attaches
"$MS" query --emit "$tmp/plain.bundle" --schema "$tmp/plain.json" 'task_end /op == gate_up/ { @ = count() }'
"$MS" query --emit "$tmp/cpu.bundle" --schema "$tmp/cpu.json" 'task_end /op == gate_up/ { @ = count() }'
set +e
"$MS" attach --socket "$SOCK" "$tmp/plain.bundle" >/dev/null 2>"$tmp/err6.txt"
rc=$?
set -e
[ "$rc" != 0 ] && grep -q "compiled against another plan's task class ids" "$tmp/err6.txt" ||
  fail "a bundle of another plan's class ids attached: rc $rc, $(cat "$tmp/err6.txt")"
listing >"$tmp/ls.out"
grep -q '"attached": true' "$tmp/ls.out" && fail "the refused bundle is listed as attached"
bid=$("$MS" attach --socket "$SOCK" "$tmp/cpu.bundle") || fail "the engine's own bundle: $bid"
"$MS" detach --socket "$SOCK" "$bid" >/dev/null || fail "detach $bid"

# --every prints while the query runs, then the final read-out
"$MS" query --socket "$SOCK" --for 1500ms --every 500ms --json 'step { @[phase] = count() }' >"$tmp/every.json" &
qp=$!
wait_attached
requests 2
wait $qp
python3 - "$tmp/every.json" <<'EOF' || fail "--every"
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
assert len(lines) >= 3 and lines[-1]["final"] and not lines[0]["final"], len(lines)
ends = {e["key"][0]: e["value"] for e in lines[-1]["maps"][0]["entries"]}
assert ends.get("begin") == ends.get("end") and ends["end"] >= 12, ends
EOF

# load in the background, bounded: sequential completions until a stop file (at most 200)
bg_load() {
  rm -f "$tmp/stop"
  ( for i in $(seq 1 200); do
      [ -e "$tmp/stop" ] && break
      code=$(completion "bg $i" 8 "$tmp/bg.json")
      [ "$code" = 200 ] || { echo "background completion $i: HTTP $code" >"$tmp/bg.fail"; break; }
    done ) &
  BG=$!
}
bg_stop() { touch "$tmp/stop"; wait "$BG"; [ ! -e "$tmp/bg.fail" ] || fail "$(cat "$tmp/bg.fail")"; }

# escalation: the summary crosses its threshold, the capture part runs for the
# worst class alone, writes exactly its 30 records, and is detached
bg_load
"$MS" query --socket "$SOCK" --for 3s --json 'task_end { @p99[class] = quantile(t_end - t_begin, 0.99) }
  when @p99 > 1us capture 30: task_end /class == $top/ { @ev = record(class, task_index, t_end - t_begin) }' \
  >"$tmp/esc.json" 2>"$tmp/esc.err" || { cat "$tmp/esc.err"; fail "escalation query"; }
bg_stop
python3 - "$tmp/esc.json" "$tmp/schema.json" <<'EOF2' || fail "escalation"
import json, re, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
ids = {c["name"]: c["id"] for c in json.load(open(sys.argv[2]))["task_classes"]}
trig = [l for l in lines if l.get("event") == "trigger"]
assert len(trig) == 1, lines
top = re.search(r'\$top="([^"]+)"', trig[0]["what"]).group(1)
cap = [l for l in lines if l.get("part") == "capture"]
assert len(cap) == 1 and [l for l in lines if l.get("event") == "capture_done"], lines
ev = cap[0]["maps"][0]
assert ev["agg"] == "record" and ev["total_records"] == 30, ev["total_records"]
assert all(r[0] == ids[top] for r in ev["records"]), (top, ev["records"][:3])
assert lines[-1]["part"] == "summary" and lines[-1]["final"]
EOF2

# sampling that rises while the SLO is in danger and falls back after
bg_load
"$MS" query --socket "$SOCK" --for 4s --every 300ms --sample 16 --slo tpot=1us --json \
  'task_end { @[class] = count() }' >"$tmp/slo.json" 2>"$tmp/slo.err" &
qp=$!
sleep 2
bg_stop
wait $qp || { cat "$tmp/slo.err"; fail "slo query"; }
python3 - "$tmp/slo.json" <<'EOF2' || fail "--slo"
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
ev = [l["event"] for l in lines if "event" in l]
assert "danger" in ev and "safe" in ev and ev.index("danger") < ev.index("safe"), ev
danger = [l for l in lines if l.get("part") == "danger"]
assert danger and danger[0]["coverage"]["executed"] > 0 and danger[0]["coverage"]["throttled"] == 0, danger
summary = [l for l in lines if l.get("part") == "summary"][-1]["coverage"]
assert summary["throttled"] > 0 and summary["executed"] < summary["eligible"], summary  # 1 in 16
EOF2

# --delta: each interval prints what changed in it; the last print is the whole run
"$MS" query --socket "$SOCK" --for 1500ms --every 400ms --delta --json 'step { @[phase] = count() }' \
  >"$tmp/delta.json" &
qp=$!
wait_attached
requests 3
wait $qp
python3 - "$tmp/delta.json" <<'EOF2' || fail "--delta"
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
iv, final = [l for l in lines if l["interval"]], lines[-1]
assert final["final"] and not final["interval"] and len(iv) >= 2, [l["interval"] for l in lines]
ends = lambda l: {e["key"][0]: e["value"] for e in l["maps"][0]["entries"]}.get("end", 0)
total = sum(ends(l) for l in iv)
assert 0 < total <= ends(final), (total, ends(final))
EOF2

# --emit: a bundle that verify and attach take as they take a clang object
"$MS" query --socket "$SOCK" --emit "$tmp/q.msbpf" 'task_end /op == attn/ { @us = hist((t_end - t_begin) / 1000) }'
"$MS" verify "$tmp/q.msbpf" >"$tmp/verify.out" || { cat "$tmp/verify.out"; fail "verify of an emitted bundle"; }
id=$("$MS" attach --socket "$SOCK" "$tmp/q.msbpf")
requests 1
"$MS" maps --socket "$SOCK" "$id" --json | grep -q '"q.us"' || fail "maps of an attached bundle"
"$MS" detach --socket "$SOCK" "$id"
"$MS" query --dump --schema "$tmp/schema.json" 'step { @[batch_size] = count() }' | grep -q "call 1" ||
  fail "--dump"

# the engine stops under a running query: it says so and exits 1
"$MS" query --socket "$SOCK" 'step { @ = count() }' >/dev/null 2>"$tmp/gone.err" &
qp=$!
wait_attached
stop_serve q
set +e
wait $qp
rc=$?
set -e
[ "$rc" = 1 ] && grep -q "is gone (the engine stopped, or it was detached)" "$tmp/gone.err" ||
  fail "a query whose engine stopped: rc $rc: $(cat "$tmp/gone.err")"

# offline: run --query on the simulator, the JIT and the interpreter agree exactly
for mode in jit interp; do
  extra=""
  [ $mode = interp ] && extra=--interp
  "$MS" run --synthetic tiny --backend sim --gpu h100 --batch 4 --requests 4 --steps 8 --json $extra \
    --query 'task_end { @[class] = quantile(t_end - t_begin, 0.5, 0.99) } dep_wait /wait_ns > 0/ { @w[event_class] = sum(wait_ns) }' \
    >"$tmp/sim_$mode.json"
done
python3 - "$tmp/sim_jit.json" "$tmp/sim_interp.json" <<'EOF' || fail "sim: JIT and interpreter differ"
import json, sys
a, b = (json.load(open(p))["query"] for p in sys.argv[1:3])
for x in (a, b):
    x["coverage"].pop("seconds", None)  # the epoch's host time, not simulated
assert a["maps"] == b["maps"] and a["coverage"] == b["coverage"], "differ"
assert a["coverage"]["executed"] > 0 and a["maps"][0]["total_keys"] > 10
EOF

# the printed figures against the raw values: one query aggregates t_end - t_begin
# and records every value; the records give the reference (nearest-rank
# quantiles, the value of rank ceil(q n), within the 3.2% the output states)
for be in sim cpu; do
  extra=""
  [ $be = sim ] && extra="--backend sim --gpu h100"
  # shellcheck disable=SC2086
  "$MS" run --synthetic tiny $extra --batch 4 --requests 4 --steps 8 --json \
    --query 'task_end { @q = quantile(t_end - t_begin, 0.25, 0.5, 0.9, 0.99, 1); @s = sum(t_end - t_begin); @a = avg(t_end - t_begin); @h = hist(t_end - t_begin); @r = record(t_end - t_begin) }' \
    >"$tmp/raw_$be.json"
  python3 - "$tmp/raw_$be.json" <<'EOF' || fail "$be: the printed figures against the recorded values"
import json, math, sys
d = json.load(open(sys.argv[1]))["query"]
maps = {m["name"]: m for m in d["maps"]}
vals = sorted(r[0] for r in maps["@r"]["records"])
n = len(vals)
assert d["coverage"]["lost"] == 0 and n == maps["@r"]["total_records"] == d["coverage"]["executed"] > 100, d["coverage"]
q = maps["@q"]["entries"][0]
assert q["count"] == n and q["relative_error"] <= 0.032, q
for e in q["quantiles"]:
    exact = vals[max(1, math.ceil(e["q"] * n)) - 1]
    assert abs(e["value"] - exact) <= 0.032 * exact, (e, exact)
assert maps["@s"]["entries"][0]["value"] == sum(vals), (maps["@s"], sum(vals))
a = maps["@a"]["entries"][0]
assert a["count"] == n and a["sum"] == sum(vals) and abs(a["value"] - sum(vals) / n) <= 5e-9 * sum(vals) / n, a
want = {}
for v in vals:
    b = v.bit_length()
    want[b] = want.get(b, 0) + 1
got = {}
for bk in maps["@h"]["entries"][0]["buckets"]:
    assert bk["hi"] == (1 if bk["lo"] == 0 else 2 * bk["lo"]), bk
    got[bk["lo"].bit_length()] = bk["count"]
assert got == want, (got, want)
print("%d values: p50 %s (exact %d), p99 %s (exact %d)" % (n, q["quantiles"][1]["value"], vals[math.ceil(0.5 * n) - 1],
      q["quantiles"][3]["value"], vals[math.ceil(0.99 * n) - 1]))
EOF
done
echo "1 passed, 0 failed"
