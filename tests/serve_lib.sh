# SPDX-License-Identifier: MIT
# Helpers the serve tests source: start `megascope serve` on loopback with a
# free HTTP port and a private control socket, wait until it is ready (bounded),
# and stop it with SIGTERM, checking that it exits 0 and removes its socket.
# Expects MS (the binary) and tmp (a scratch directory) to be set; serve_scratch
# sets tmp for a test that needs nothing else removed at its exit.

# serve_scratch: tmp (a scratch directory) and SERVE_PID; at exit a server still
# running is killed, background jobs are waited for and tmp is removed.
serve_scratch() {
  tmp=$(mktemp -d)
  SERVE_PID=""
  trap serve_cleanup EXIT
}
serve_cleanup() {
  if [ -n "$SERVE_PID" ] && kill -0 "$SERVE_PID" 2>/dev/null; then kill -KILL "$SERVE_PID"; fi
  wait 2>/dev/null || true
  rm -rf "$tmp"
}

# start_serve NAME [serve options...]: sets SERVE_PID, SOCK, URL (http://127.0.0.1:PORT).
start_serve() {
  local name=$1
  shift
  SOCK="$tmp/$name/engine.sock"
  mkdir -p "$tmp/$name"
  chmod 700 "$tmp/$name"
  "$MS" serve --http 127.0.0.1:0 --socket "$SOCK" "$@" >"$tmp/$name/serve.out" 2>"$tmp/$name/serve.err" &
  SERVE_PID=$!
  wait_ready "$tmp/$name/serve.out" "$SERVE_PID" 600 || :  # at most 60 s (synthesising the model's weights)
  if [ -z "$URL" ] || [ ! -S "$SOCK" ]; then
    echo "serve did not become ready"
    cat "$tmp/$name/serve.out" "$tmp/$name/serve.err"
    kill "$SERVE_PID" 2>/dev/null || true
    return 1
  fi
}

# wait_ready OUT PID TENTHS: waits (at most TENTHS tenths of a second, or until
# PID ends) for the server's "ready" line in OUT; sets URL from it ("" if none).
# Under mpirun only rank 0 prints it (rank 1's stdout is /dev/null).
wait_ready() {
  URL=""
  for _ in $(seq 1 "$3"); do
    if grep -q '^ready' "$1" 2>/dev/null; then
      URL=$(grep -o 'http://127\.0\.0\.1:[0-9]*' "$1" | head -1)
      return 0
    fi
    kill -0 "$2" 2>/dev/null || return 1
    sleep 0.1
  done
  return 1
}

# mpi_prelude [two_cpus]: skips (77) without mpirun (or, with two_cpus, on
# fewer than two CPUs) and lets Open MPI run as root, oversubscribed, without
# the single-copy mechanism a container refuses.
mpi_prelude() {
  command -v mpirun >/dev/null || { echo "mpirun not found: skipped (scripts/deps.sh installs openmpi-bin)"; exit 77; }
  if [ "${1:-}" = two_cpus ] && [ "$(nproc)" -lt 2 ]; then echo "fewer than two CPUs: skipped"; exit 77; fi
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
}

# start_mpi_tiny SOCK OUT ERR [serve args...]: two ranks of the tiny preset,
# one pinned worker each (`mpirun --bind-to none`), serving on SOCK; waits for
# ready. Sets MPI_PID and URL ("" when not ready).
start_mpi_tiny() {
  local sock=$1 out=$2 err=$3
  shift 3
  timeout 600 mpirun --bind-to none -np 2 "$MS" serve --tp 2 --synthetic tiny --workers 1 --batch 4 --pin-workers \
    --comm-timeout-ms 30000 --http 127.0.0.1:0 --socket "$sock" "$@" >"$out" 2>"$err" &
  MPI_PID=$!
  wait_ready "$out" "$MPI_PID" 900 || :
}

# stop_mpirun PID: ends `timeout ... mpirun` and its ranks: TERM first, which
# timeout passes on to mpirun (a KILL would end timeout alone and leave mpirun
# and the ranks running), KILL after 5 s.
stop_mpirun() {
  [ -n "$1" ] && kill -0 "$1" 2>/dev/null || return 0
  kill -TERM "$1" 2>/dev/null || :
  for _ in $(seq 1 50); do kill -0 "$1" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "$1" 2>/dev/null || :
}

# stop_serve NAME: SIGTERM, wait (bounded), exit status 0, socket removed.
stop_serve() {
  local name=$1 rc=0
  kill -TERM "$SERVE_PID"
  for _ in $(seq 1 300); do
    kill -0 "$SERVE_PID" 2>/dev/null || break
    sleep 0.1
  done
  if kill -0 "$SERVE_PID" 2>/dev/null; then
    echo "serve did not stop within 30 s of SIGTERM"
    kill -KILL "$SERVE_PID"
    return 1
  fi
  wait "$SERVE_PID" || rc=$?
  if [ "$rc" -ne 0 ]; then
    echo "serve exited $rc"
    cat "$tmp/$name/serve.err"
    return 1
  fi
  grep -q 'stopped after' "$tmp/$name/serve.out" || { echo "no clean-stop line"; return 1; }
  if [ -e "$SOCK" ]; then echo "the control socket was left behind"; return 1; fi
}

# completion PROMPT MAX_TOKENS OUT: POST /v1/completions (greedy), body to OUT, prints the status.
completion() {
  curl -s -o "$3" -w '%{http_code}' --max-time 120 -H 'Content-Type: application/json' \
    -d "{\"prompt\": \"$1\", \"max_tokens\": $2, \"temperature\": 0}" "$URL/v1/completions"
}

# check_completion FILE MAX_TOKENS: the OpenAI shape with max_tokens tokens or an early stop.
check_completion() {
  python3 - "$1" "$2" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
want = int(sys.argv[2])
assert d["object"] == "text_completion", d
assert d["id"].startswith("cmpl-") and isinstance(d["created"], int) and d["model"]
c = d["choices"][0]
assert c["index"] == 0 and isinstance(c["text"], str)
assert c["finish_reason"] in ("length", "stop")
u = d["usage"]
assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"]
assert u["completion_tokens"] == want or (c["finish_reason"] == "stop" and u["completion_tokens"] < want), u
PY
}
