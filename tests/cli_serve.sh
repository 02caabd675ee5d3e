#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# megascope serve operated from outside while completions are being served:
# attach, ls, maps, replace, detach, schema, stats and trace through the control
# socket; unsafe programs, unknown hooks, non-ELF objects, detaching twice and a
# user of another uid are refused with clear messages; every HTTP request made
# meanwhile succeeds; SIGTERM stops the server cleanly. Usage errors exit 2.
set -euo pipefail
MS=$1
SRC=${MS_SRC:-$(cd "$(dirname "$0")/.." && pwd)}
MON=${MS_MONITORS:-}
if [ -z "$MON" ] || [ ! -f "$MON/class_time.bpf.o" ] || [ ! -f "$MON/queueing.bpf.o" ]; then
  echo "skipped: no shipped monitors (MS_MONITORS)"; exit 77
fi
for t in curl python3 clang; do
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
# out_has PATTERN CMD...: CMD succeeds and its output holds PATTERN (no pipe: no SIGPIPE)
out_has() {
  local pat=$1
  shift
  "$@" >"$tmp/cmd.out" && grep -q -- "$pat" "$tmp/cmd.out"
}
out_has_re() {
  local pat=$1
  shift
  "$@" >"$tmp/cmd.out" && grep -Eq -- "$pat" "$tmp/cmd.out"
}
pass=0
ok() { pass=$((pass + 1)); }

# expect_fail WANT_RC PATTERN CMD...: exit status and a message naming the problem
expect_fail() {
  local want=$1 pat=$2 rc=0
  shift 2
  "$@" >"$tmp/out" 2>"$tmp/err" || rc=$?
  [ "$rc" -eq "$want" ] || { cat "$tmp/out" "$tmp/err"; fail "$* exited $rc, expected $want"; }
  grep -q -- "$pat" "$tmp/err" || { cat "$tmp/err"; fail "$*: no '$pat' in the message"; }
  ok
}

# ---- usage ----
expect_fail 2 "unrecognized option" "$MS" serve --synthetic tiny --bogus
expect_fail 2 "expected ADDR:PORT" "$MS" serve --synthetic tiny --http nowhere
expect_fail 2 "expected PROG.o" "$MS" attach --socket "$tmp/none.sock"
expect_fail 2 "expected an integer" "$MS" detach --socket "$tmp/none.sock" one
expect_fail 2 "does not apply" "$MS" detach --socket "$tmp/none.sock" --json 1
expect_fail 2 "required" "$MS" trace --socket "$tmp/none.sock" --seconds 1
expect_fail 1 "cannot connect" "$MS" ls --socket "$tmp/none.sock"
for c in serve attach replace detach ls maps schema stats trace; do
  out_has "usage: megascope $c" "$MS" "$c" --help || fail "$c --help"
  ok
done

# ---- the test programs the engine must refuse ----
inc=(-I"$SRC/include" -I"/usr/include/$(uname -m)-linux-gnu")
for p in unsafe_null_deref unknown_hook; do
  clang -O2 -g -target bpf -Wall "${inc[@]}" -c "$SRC/tests/data/monitors/$p.bpf.c" -o "$tmp/$p.bpf.o"
done
printf 'not an object file\n' >"$tmp/garbage.bpf.o"

start_serve s --synthetic tiny --batch 4 --workers 2 --max-ctx 256
echo "serving at $URL, socket $SOCK"

# ---- a steady load: 4 clients sending completions until told to stop ----
load() {  # client index
  local i=0
  while [ ! -e "$tmp/stop" ] && [ $i -lt 500 ]; do
    completion "client $1 request $i" 48 "$tmp/load/$1.$i.json" >"$tmp/load/$1.$i.status" || true
    i=$((i + 1))
  done
}
mkdir -p "$tmp/load"
load_pids=()
for k in 1 2 3 4; do
  load $k &
  load_pids+=($!)
done
sleep 0.5

# ---- operate the engine while the load runs ----
id=$("$MS" attach --socket "$SOCK" "$MON/class_time.bpf.o")
[[ "$id" =~ ^[0-9]+$ ]] || fail "attach printed '$id', not an id"
ok
for _ in $(seq 1 100); do  # until the monitor has run (bounded: 10 s)
  "$MS" ls --socket "$SOCK" --json >"$tmp/ls.json"
  python3 - "$tmp/ls.json" "$id" <<'PY' && break
import json, sys
d = json.load(open(sys.argv[1]))
a = [x for x in d["attachments"] if x["id"] == int(sys.argv[2])][0]
sys.exit(0 if a["coverage"]["executed"] > 0 else 1)
PY
  sleep 0.1
done
python3 - "$tmp/ls.json" "$id" <<'PY' || fail "ls --json"
import json, sys
d = json.load(open(sys.argv[1]))
a = [x for x in d["attachments"] if x["id"] == int(sys.argv[2])][0]
assert a["name"] == "class_time" and a["attached"] and a["generation"] == 1
assert sorted(a["hooks"]) == ["task_begin", "task_end"]
c = a["coverage"]
for k in ("eligible", "executed", "throttled", "lost"):
    assert k in c, k
assert c["executed"] > 0 and c["eligible"] >= c["executed"]
PY
ok
out_has_re "^$id +class_time +attached +1 +task_begin,task_end +jit " "$MS" ls --socket "$SOCK" || fail "ls table"
ok
# the same monitor again, interpreted: ls says how each runs
iid=$("$MS" attach --socket "$SOCK" --interp --name class_interp "$MON/class_time.bpf.o")
[[ "$iid" =~ ^[0-9]+$ ]] || fail "attach --interp printed '$iid'"
out_has_re "^$iid +class_interp +attached +1 +task_begin,task_end +interp " "$MS" ls --socket "$SOCK" ||
  fail "ls table: interpreted attachment"
"$MS" ls --socket "$SOCK" --json >"$tmp/ls2.json"
python3 - "$tmp/ls2.json" "$id" "$iid" <<'PY' || fail "ls --json: programs and jitted"
import json, sys
d = {x["id"]: x for x in json.load(open(sys.argv[1]))["attachments"]}
j, i = d[int(sys.argv[2])], d[int(sys.argv[3])]
assert (j["programs"], j["jitted"]) == (2, 2), j
assert (i["programs"], i["jitted"]) == (2, 0), i
PY
out_has "detached $iid" "$MS" detach --socket "$SOCK" "$iid" || fail "detach the interpreted one"
ok

expect_fail 1 "possible NULL dereference" "$MS" attach --socket "$SOCK" "$tmp/unsafe_null_deref.bpf.o"
grep -q "verifier rejected" "$tmp/err" || fail "the unsafe program's message"
grep -q "^insn [0-9]*:" "$tmp/err" || fail "the verifier log names the instruction"
expect_fail 1 "unknown hook 'task_teleport'" "$MS" attach --socket "$SOCK" "$tmp/unknown_hook.bpf.o"
expect_fail 1 "not an ELF" "$MS" attach --socket "$SOCK" "$tmp/garbage.bpf.o"
expect_fail 1 "no attachment 999" "$MS" detach --socket "$SOCK" 999
expect_fail 1 "no attachment 999" "$MS" replace --socket "$SOCK" 999 "$MON/queueing.bpf.o"
expect_fail 1 "cannot open" "$MS" attach --socket "$SOCK" "$tmp/missing.bpf.o"

"$MS" maps --socket "$SOCK" "$id" >"$tmp/maps1.txt"
grep -q "hist_class_task_ns" "$tmp/maps1.txt" && grep -q "eligible" "$tmp/maps1.txt" || fail "maps text"
ok
out_has "generation 2" "$MS" replace --socket "$SOCK" "$id" "$MON/queueing.bpf.o" || fail "replace"
ok
for _ in $(seq 1 100); do
  "$MS" maps --socket "$SOCK" "$id" --json >"$tmp/maps2.json"
  python3 - "$tmp/maps2.json" <<'PY' && break
import json, sys
d = json.load(open(sys.argv[1]))
sys.exit(0 if "hist_class_queue_ns" in json.dumps(d["attachment"]) and "executed" in json.dumps(d) else 1)
PY
  sleep 0.1
done
python3 - "$tmp/maps2.json" <<'PY' || fail "maps --json after replace"
import json, sys
d = json.load(open(sys.argv[1]))
assert d["ok"] and "hist_class_queue_ns" in json.dumps(d["attachment"])
PY
ok
out_has "memfd 0 (read-only): map hist_class_queue_ns" "$MS" maps --socket "$SOCK" "$id" --fds || fail "maps --fds"
ok
out_has "detached $id" "$MS" detach --socket "$SOCK" "$id" || fail "detach"
ok
expect_fail 1 "detached already" "$MS" detach --socket "$SOCK" "$id"
out_has "generation 1" "$MS" maps --socket "$SOCK" "$id" || fail "maps of a detached attachment"
ok

"$MS" schema --socket "$SOCK" >"$tmp/schema.json"
python3 -c "import json,sys; d=json.load(open(sys.argv[1])); assert d['schema_version']>=1 and d['task_classes']" \
  "$tmp/schema.json" || fail "schema"
ok
out_has "^TTFT  n=" "$MS" stats --socket "$SOCK" || fail "stats"
"$MS" stats --socket "$SOCK" --json >"$tmp/stats.json"
python3 -c "import json,sys; d=json.load(open(sys.argv[1])); assert d['steps']>0 and d['tokens']>0 and 'p99_s' in d['tpot']" \
  "$tmp/stats.json" || fail "stats --json"
ok

out_has "wrote" "$MS" trace --socket "$SOCK" --seconds 0.5 --out "$tmp/trace.json" || fail "trace"
python3 - "$tmp/trace.json" <<'PY' || fail "the trace's content"
import json, sys
d = json.load(open(sys.argv[1]))
ev = d["traceEvents"]
x = [e for e in ev if e["ph"] == "X"]
assert x, "no task slices"
args = x[-1]["args"]
for k in ("class", "task_gen", "step", "request", "wait_reason"):
    assert k in args, k
assert any(e["ph"] == "s" for e in ev) and any(e["ph"] == "f" for e in ev), "no flow arrows"
assert any(e["ph"] == "C" for e in ev), "no counter track"
names = [e for e in ev if e["ph"] == "M" and e["name"] == "thread_name"]
assert len(names) >= 2, "one track per worker"
PY
ok

# ---- another user is refused (the socket's directory is 0700) ----
if [ "$(id -u)" -eq 0 ] && command -v setpriv >/dev/null; then
  pub=$(mktemp -d)
  chmod 755 "$pub"
  cp "$MS" "$pub/megascope"
  rc=0
  setpriv --reuid=65534 --regid=65534 --clear-groups "$pub/megascope" ls --socket "$SOCK" \
    >"$tmp/out" 2>"$tmp/err" || rc=$?
  rm -rf "$pub"
  [ "$rc" -eq 1 ] && grep -q "Permission denied" "$tmp/err" || { cat "$tmp/err"; fail "uid 65534 was not refused"; }
  ok
else
  echo "SKIP: not root (or no setpriv): the other-uid check not run"
  skipped=1
fi

# ---- the load: every request made meanwhile succeeded ----
touch "$tmp/stop"
for p in "${load_pids[@]}"; do wait "$p"; done  # each ends after its request in flight (curl --max-time)
python3 - "$tmp/load" <<'PY' || fail "a request made during the test failed"
import glob, json, os, sys
n = 0
for st in sorted(glob.glob(os.path.join(sys.argv[1], "*.status"))):
    code = open(st).read().strip()
    body = st[: -len(".status")] + ".json"
    assert code == "200", "%s answered %s: %s" % (st, code, open(body).read() if os.path.exists(body) else "")
    d = json.load(open(body))
    assert d["object"] == "text_completion" and d["choices"][0]["finish_reason"] in ("length", "stop")
    u = d["usage"]
    assert u["completion_tokens"] == 48 or d["choices"][0]["finish_reason"] == "stop", u
    n += 1
assert n >= 8, "only %d requests completed during the test" % n
print("%d completions, all 200, while attaching, replacing and detaching" % n)
PY
ok

# ---- errors over HTTP ----
code=$(curl -s -o "$tmp/e.json" -w '%{http_code}' -d '{"prompt": ' "$URL/v1/completions")
[ "$code" = 400 ] && grep -q "malformed JSON" "$tmp/e.json" || fail "malformed body: $code"
code=$(curl -s -o "$tmp/e.json" -w '%{http_code}' -d '{"prompt": "hi", "max_tokens": 1000}' "$URL/v1/completions")
[ "$code" = 400 ] && grep -q "exceed this server's context" "$tmp/e.json" || fail "too long: $code"
code=$(curl -s -o "$tmp/e.json" -w '%{http_code}' -d '{"prompt": [1, 2, 3], "max_tokens": 4}' "$URL/v1/completions")
[ "$code" = 200 ] && check_completion "$tmp/e.json" 4 || fail "token-id prompt: $code"
code=$(curl -s -o "$tmp/e.json" -w '%{http_code}' "$URL/v1/completions")
[ "$code" = 405 ] || fail "GET /v1/completions: $code"
code=$(curl -s -o "$tmp/e.json" -w '%{http_code}' "$URL/nowhere")
[ "$code" = 404 ] || fail "/nowhere: $code"
ok

stop_serve s || fail "clean stop"
ok
if [ -n "${skipped:-}" ]; then  # a part not run: the whole test is a skip (77), never a pass
  echo "$pass passed, 0 failed, 1 skipped"
  exit 77
fi
echo "$pass passed, 0 failed"
