#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# explain on an engine across processes names a rank's worker as an operator
# finds it: `mpirun --bind-to none -np 2 megascope serve --tp 2 --workers 1
# --pin-workers` puts each rank's worker on its own CPU (workers counted rank
# after rank: before, both ranks pinned theirs to the first CPU), and with a
# real noisy neighbour spinning on rank 1's CPU (`megascope interfere`),
# `explain` names "rank 1 worker 0 (CPU c)" under a steady load of streamed
# chats; nothing on rank 0 is named but the OS's view of every CPU (the
# machine runs more threads than CPUs). Skipped (77) when mpirun is absent or
# the process may run on fewer than two CPUs.
set -euo pipefail
MS=$1
SRC=${MS_SRC:-$(cd "$(dirname "$0")/.." && pwd)}
# shellcheck source=tests/serve_lib.sh
source "$SRC/tests/serve_lib.sh"
mpi_prelude two_cpus
tmp=$(mktemp -d)
MPI_PID="" LOAD_PID="" SIDE_PID=""
cleanup() {
  touch "$tmp/stop"
  for p in $SIDE_PID $LOAD_PID; do kill -KILL "$p" 2>/dev/null || :; done
  stop_mpirun "$MPI_PID"
  wait 2>/dev/null || :
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*" >&2
  tail -20 "$tmp/err" >&2 2>/dev/null || true
  exit 1
}

SOCK="$tmp/s/engine.sock"
mkdir -p "$tmp/s"
chmod 700 "$tmp/s"
start_mpi_tiny "$SOCK" "$tmp/out" "$tmp/err"
[ -n "$URL" ] && [ -S "$SOCK" ] || { cat "$tmp/out" >&2; fail "not ready"; }

# each rank's worker on its own CPU
"$MS" stats --socket "$SOCK" --json >"$tmp/stats.json" || fail "stats"
CPU1=$(python3 - "$tmp/stats.json" <<'PY'
import json, sys
r = {x["rank"]: x["worker_os"][0]["pinned_cpu"] for x in json.load(open(sys.argv[1]))["ranks"]}
assert set(r) == {0, 1} and r[0] >= 0 and r[1] >= 0 and r[0] != r[1], ("each rank's worker on its own CPU", r)
print(r[1])
PY
) || fail "pinned CPUs: $(cat "$tmp/stats.json")"

python3 "$SRC/tests/chat_load.py" "$URL" --clients 4 --max-tokens 24 --stop "$tmp/stop" 2>"$tmp/load.err" &
LOAD_PID=$!
sleep 3
"$MS" interfere --kind spin --cpu "$CPU1" --for 60s >"$tmp/interfere.out" &
SIDE_PID=$!
sleep 1
"$MS" explain --socket "$SOCK" --slo tpot=1s --window 4s --evidence 50 --json >"$tmp/explain.json" 2>"$tmp/explain.err" ||
  fail "explain: $(cat "$tmp/explain.err")"
kill -TERM "$SIDE_PID"
wait "$SIDE_PID" || fail "interfere exited $?"
SIDE_PID=""
python3 - "$tmp/explain.json" <<'PY' || fail "explain across ranks with a neighbour on rank 1's CPU"
import json, sys
r = json.load(open(sys.argv[1]))
named = [(c["kind"], c["name"], c["cause"]) for c in r["culprits"]]
print("named:", named)
assert r["rank_workers"] == 1, r.get("rank_workers")
assert any(k in ("worker", "cpu") and n.startswith("rank 1 worker 0") for k, n, _ in named), named
# rank 0's parts stay unnamed; the OS's view of every worker's CPU is allowed
other = [c for c in named if not c[1].startswith("rank 1 ") and not (c[0] == "cpu" and c[1] == "every worker's CPU")
         and c[1] != "rank 1"]
assert not other, ("named but not injected", other)
PY

touch "$tmp/stop"
wait "$LOAD_PID" || fail "the load's requests failed: $(tail -5 "$tmp/load.err")"
LOAD_PID=""
kill -TERM "$(grep -o ', pid [0-9]*' "$tmp/out" | head -1 | grep -o '[0-9]*')"
for _ in $(seq 1 300); do kill -0 "$MPI_PID" 2>/dev/null || break; sleep 0.1; done
wait "$MPI_PID" || fail "mpirun exit $?"
MPI_PID=""
echo "ok: explain named rank 1's worker beside a neighbour on its CPU"
