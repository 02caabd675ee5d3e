#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Serving across ranks: `mpirun -np 2 megascope serve --tp 2` is one server
# whose rank 0 serves HTTP and decides every step while rank 1 follows its step
# headers. Concurrent streamed chat completions give the tokens of `serve
# --tp 1` (greedy, seeded sampling, a stop string that stops a request early),
# on the tiny preset and on SmolLM2; clients that disconnect mid-stream (one
# beside the streams, then six at once after 8 s of load) leave the ranks in
# step (a later request answers as on one process);
# SIGTERM to rank 0 stops both ranks, exit 0, rank 1 saying why; a rank 0 that
# hangs or dies ends rank 1 too, named; a rank 1 that hangs: the request in
# flight gets an error, rank 0 names rank 1, every rank ends. Refusals:
# --tp without mpirun, --tp on another backend, ranks that are not --tp.
# Skipped (77) only when mpirun is absent (scripts/deps.sh installs openmpi-bin).
set -euo pipefail
MS=$1
command -v mpirun >/dev/null || { echo "mpirun not found: skipped (scripts/deps.sh installs openmpi-bin)"; exit 77; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=serve_lib.sh
. "$HERE/serve_lib.sh"
F=${MS_SMOLLM2:-$HOME/.cache/megascope/SmolLM2-135M-Instruct.Q4_1.gguf}
MPI_PID=""
tmp=$(mktemp -d)
SERVE_PID=""
cleanup() {
  stop_mpirun "$MPI_PID"
  serve_cleanup
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
streams() { python3 "$HERE/serve_streams.py" "$@"; }

# start_mpi NAME [serve options...]: two ranks; sets MPI_PID (mpirun under
# timeout), RANK0 (rank 0's pid, from its banner), URL, SOCK.
start_mpi() {
  local name=$1
  shift
  SOCK="$tmp/$name/engine.sock"
  mkdir -p "$tmp/$name"
  chmod 700 "$tmp/$name"
  timeout 600 mpirun -np 2 "$MS" serve --tp 2 --http 127.0.0.1:0 --socket "$SOCK" "$@" \
    > "$tmp/$name/serve.out" 2> "$tmp/$name/serve.err" &
  MPI_PID=$!
  wait_ready "$tmp/$name/serve.out" "$MPI_PID" 900 || :
  [ -n "$URL" ] && [ -S "$SOCK" ] || { cat "$tmp/$name/serve.out" "$tmp/$name/serve.err" >&2; fail "$name: not ready"; }
  RANK0=$(grep -o ', pid [0-9]*' "$tmp/$name/serve.out" | head -1 | grep -o '[0-9]*')
}

# wait_mpi SECONDS: mpirun's exit status (124: still running after SECONDS, then killed)
wait_mpi() {
  local rc=0
  for _ in $(seq 1 $(($1 * 10))); do
    kill -0 "$MPI_PID" 2>/dev/null || break
    sleep 0.1
  done
  if kill -0 "$MPI_PID" 2>/dev/null; then
    kill -KILL "$MPI_PID"
    wait "$MPI_PID" 2>/dev/null || true
    MPI_RC=124
    return
  fi
  wait "$MPI_PID" || rc=$?
  MPI_RC=$rc
}

same() {  # name, file of --tp 1, file of --tp 2
  python3 - "$2" "$3" <<'PY' || fail "$1: the tokens of --tp 2 across two ranks differ from --tp 1"
import json, sys
one, two = (json.load(open(p)) for p in sys.argv[1:])
assert one.keys() == two.keys(), (one.keys(), two.keys())
for k in one:
    a, b = one[k], two[k]
    assert a["tokens"] and a["tokens"] == b["tokens"], (k, a, b)
    assert a["finish"] == b["finish"], (k, a["finish"], b["finish"])
PY
  echo "ok: $1: $(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(len(d), "streams,", sum(len(v["tokens"]) for v in d.values()), "tokens equal")' "$3")"
}

# compare NAME N MAX_TOKENS [serve options...]: --tp 1 against --tp 2 on the
# same requests; then, on the two ranks, a disconnect and a later request,
# then SIGTERM to rank 0.
compare() {
  local name=$1 n=$2 mt=$3
  shift 3
  start_serve "$name-tp1" --workers 1 "$@"
  streams "$URL" --n "$n" --max-tokens "$mt" --out "$tmp/$name.one.json" > /dev/null
  streams "$URL" --n 2 --first 40 --max-tokens "$mt" --temperature 0.9 --out "$tmp/$name.one-seeded.json" > /dev/null
  # a stop string from the middle of the first answer: the server stops that request early there
  stop=$(python3 - "$tmp/$name.one.json" <<'PY'
import json, sys
t = json.load(open(sys.argv[1]))["0"]["text"]
ok = lambda c: c.isascii() and c.isprintable()
i = next(i for i in range(len(t) // 2, len(t) - 1) if ok(t[i]) and ok(t[i + 1]))
print(t[i:i + 2], end="")
PY
)
  streams "$URL" --n 2 --max-tokens "$mt" --stop "$stop" --out "$tmp/$name.one-stop.json" > /dev/null
  streams "$URL" --n 1 --first 50 --max-tokens "$mt" --out "$tmp/$name.one-after.json" > /dev/null
  stop_serve "$name-tp1" || fail "$name: serve --tp 1 did not stop cleanly"
  SERVE_PID=""

  start_mpi "$name-tp2" --workers 1 --comm-timeout-ms 60000 "$@"
  # the streams, and beside them a client gone mid-stream: rank 0 cancels its
  # request at a step start, rank 1 retires it with rank 0 (its step header)
  streams "$URL" --n "$n" --max-tokens "$mt" --out "$tmp/$name.two.json" > /dev/null & local job=$!
  streams "$URL" --disconnect-after 4 --max-tokens 150 > /dev/null || fail "$name: the disconnecting client"
  wait "$job" || fail "$name: streams across ranks"
  same "$name, $n concurrent streamed chat completions, greedy" "$tmp/$name.one.json" "$tmp/$name.two.json"
  streams "$URL" --n 2 --first 40 --max-tokens "$mt" --temperature 0.9 --out "$tmp/$name.two-seeded.json" > /dev/null ||
    fail "$name: seeded streams across ranks"
  same "$name, seeded sampling (temperature 0.9)" "$tmp/$name.one-seeded.json" "$tmp/$name.two-seeded.json"
  streams "$URL" --n 2 --max-tokens "$mt" --stop "$stop" --out "$tmp/$name.two-stop.json" > /dev/null ||
    fail "$name: streams with a stop string across ranks"
  same "$name, a stop string (a request stopped early)" "$tmp/$name.one-stop.json" "$tmp/$name.two-stop.json"
  python3 -c 'import json,sys; assert json.load(open(sys.argv[1]))["0"]["finish"] == "stop"' "$tmp/$name.two-stop.json" ||
    fail "$name: the stop string did not stop the request"
  # a load of streams that ends with every client leaving mid-stream at once
  python3 "$HERE/chat_load.py" "$URL" --clients 6 --max-tokens 32 --for 8 || fail "$name: a load across ranks"
  streams "$URL" --n 1 --first 50 --max-tokens "$mt" --out "$tmp/$name.two-after.json" > /dev/null ||
    fail "$name: a request after a disconnect"
  same "$name, a request after clients disconnected mid-stream" "$tmp/$name.one-after.json" "$tmp/$name.two-after.json"
  curl -s --max-time 10 "$URL/metrics" > "$tmp/$name.metrics"
  grep -Eq '^megascope_requests_cancelled_total(\{[^}]*\})? [1-9]' "$tmp/$name.metrics" ||
    fail "$name: /metrics counts no cancelled request after the disconnect"

  # rank 0's control socket: a query's hooks fire on rank 0 (device 0), the
  # tasks after a gather naming rank 1 as the remote producer
  python3 "$HERE/chat_load.py" "$URL" --clients 2 --max-tokens 32 --for 4 & local load=$!
  "$MS" query --socket "$SOCK" --for 2 'task_begin /op == rope/ { @[device, remote_device] = count() }' \
    > "$tmp/$name.query" 2>&1 || { cat "$tmp/$name.query" >&2; fail "$name: query on rank 0's socket"; }
  wait "$load" || fail "$name: the load beside the query"
  grep -Eq '^@\[0, 1\]: [1-9]' "$tmp/$name.query" || { cat "$tmp/$name.query" >&2; fail "$name: no remote producer on rank 1"; }
  echo "ok: $name: a query on rank 0's socket: $(grep -E '^@\[0, 1\]' "$tmp/$name.query") (rope tasks whose event rank 1's share completed)"

  # SIGTERM to rank 0: it drains, tells rank 1, both exit 0 within seconds
  local t0
  t0=$(date +%s)
  kill -TERM "$RANK0"
  wait_mpi 30
  [ "$MPI_RC" -eq 0 ] || { cat "$tmp/$name-tp2/serve.err" >&2; fail "$name: SIGTERM to rank 0: mpirun exited $MPI_RC"; }
  grep -q 'rank 1: rank 0 stopped serving; this rank stops too' "$tmp/$name-tp2/serve.err" ||
    { cat "$tmp/$name-tp2/serve.err" >&2; fail "$name: rank 1 did not say why it stopped"; }
  grep -q 'stopped after' "$tmp/$name-tp2/serve.out" || fail "$name: no clean-stop line from rank 0"
  [ ! -e "$SOCK" ] || fail "$name: the control socket was left behind"
  echo "ok: $name: SIGTERM to rank 0: both ranks exited 0 in $(( $(date +%s) - t0 )) s; rank 1: $(grep -o 'rank 0 stopped serving.*' "$tmp/$name-tp2/serve.err")"
  MPI_PID=""
}

compare tiny 4 24 --synthetic tiny --batch 4
if [ -r "$F" ]; then
  compare SmolLM2 4 20 --model "$F" --batch 4 --max-ctx 256
else
  echo "SmolLM2 not cached ($F): its comparison skipped; scripts/get-smollm2.sh fetches it"
fi

# ---- rank 0 hangs or dies: rank 1 does not wait forever ----
# SIGSTOP while idle: rank 1 hears no header for --comm-timeout-ms, says so and ends every rank
start_mpi hang --synthetic tiny --workers 1 --comm-timeout-ms 2000
t0=$(date +%s)
kill -STOP "$RANK0"
wait_mpi 60
kill -CONT "$RANK0" 2>/dev/null || true
[ "$MPI_RC" -ne 0 ] && [ "$MPI_RC" -ne 124 ] || { cat "$tmp/hang/serve.err" >&2; fail "a hung rank 0: mpirun exited $MPI_RC"; }
grep -q 'stopped: rank 1: rank 0 sent no step header for [0-9]* ms' "$tmp/hang/serve.err" ||
  { cat "$tmp/hang/serve.err" >&2; fail "a hung rank 0: rank 1 did not name it"; }
echo "ok: a hung rank 0: mpirun exited $MPI_RC in $(( $(date +%s) - t0 )) s: $(grep -m1 -o 'rank 1: rank 0 sent no step header.*' "$tmp/hang/serve.err")"
MPI_PID=""

# rank 1 hangs: the next request finds it (its step header or the layout
# check waits --comm-timeout-ms), rank 0 answers it with an error, names rank 1
# and ends every rank, non-zero
start_mpi hang1 --synthetic tiny --workers 1 --comm-timeout-ms 2000
for _ in $(seq 1 100); do grep -q '(pid [0-9]*)' "$tmp/hang1/serve.err" && break; sleep 0.1; done
RANK1=$(grep -o '(pid [0-9]*)' "$tmp/hang1/serve.err" | head -1 | grep -o '[0-9]*')
[ -n "$RANK1" ] || { cat "$tmp/hang1/serve.err" >&2; fail "rank 1 did not say its pid"; }
kill -STOP "$RANK1"
t0=$(date +%s)
if streams "$URL" --n 1 --first 70 --max-tokens 100 --out "$tmp/hang1.json" > "$tmp/hang1/client.out" 2>&1; then
  fail "a hung rank 1: the request was answered as if nothing happened"
fi
wait_mpi 60
kill -CONT "$RANK1" 2>/dev/null || true
[ "$MPI_RC" -ne 0 ] && [ "$MPI_RC" -ne 124 ] || { cat "$tmp/hang1/serve.err" >&2; fail "a hung rank 1: mpirun exited $MPI_RC"; }
grep -Eq 'stopped: rank 0: (rank 1 did not take|rank 1 sent nothing|waited [0-9]* ms for rank 1)' "$tmp/hang1/serve.err" ||
  { cat "$tmp/hang1/serve.err" >&2; fail "a hung rank 1: rank 0 did not name it"; }
echo "ok: a hung rank 1: the client got $(grep -o "'code': '[a-z_]*'" "$tmp/hang1/client.out" || grep -m1 -o 'requests failed.*' "$tmp/hang1/client.out"); mpirun exited $MPI_RC in $(( $(date +%s) - t0 )) s: $(grep -m1 -o 'rank 0: rank 1 .*\|rank 0: waited .*' "$tmp/hang1/serve.err")"
MPI_PID=""

# SIGKILL mid-stream: mpirun names the dead rank and ends rank 1
start_mpi dead --synthetic tiny --workers 1 --comm-timeout-ms 2000
streams "$URL" --n 1 --first 60 --max-tokens 250 --out "$tmp/dead.json" > /dev/null 2>&1 &
client=$!
sleep 1
t0=$(date +%s)
kill -KILL "$RANK0"
wait_mpi 60
wait "$client" 2>/dev/null || true
[ "$MPI_RC" -ne 0 ] && [ "$MPI_RC" -ne 124 ] || { cat "$tmp/dead/serve.err" >&2; fail "a dead rank 0: mpirun exited $MPI_RC"; }
grep -q "rank 0" "$tmp/dead/serve.err" || { cat "$tmp/dead/serve.err" >&2; fail "a dead rank 0: not named"; }
echo "ok: a dead rank 0: mpirun exited $MPI_RC in $(( $(date +%s) - t0 )) s"
MPI_PID=""

# ---- refusals, by name ----
"$MS" serve --help > "$tmp/help.txt"
grep -q -- '--tp N' "$tmp/help.txt" || fail "serve --help does not list --tp"
refused() {  # name, expected message, command...
  local name=$1 want=$2
  shift 2
  if timeout 120 "$@" > "$tmp/r.out" 2> "$tmp/r.err"; then fail "$name: accepted"; fi
  grep -q -- "$want" "$tmp/r.err" || { cat "$tmp/r.err" >&2; fail "$name: no '$want'"; }
  echo "ok: $name refused: $(grep -m1 -- "$want" "$tmp/r.err")"
}
refused "serve --tp 2 without mpirun" "start it as \`mpirun -np 2 megascope serve --tp 2" "$MS" serve --synthetic tiny --tp 2
refused "serve --tp 2 on cuda" "runs on the cpu backend, not cuda" "$MS" serve --synthetic tiny --tp 2 --backend cuda
refused "serve on 2 ranks without --tp 2" "must equal the number of ranks" mpirun -np 2 "$MS" serve --synthetic tiny --http off
echo "all passed"
