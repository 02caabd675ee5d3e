#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Tensor parallelism across processes: `mpirun -np 2 megascope run --tp 2`
# (and `bench decode --tp 2`) gives the greedy tokens of `--tp 1` on the tiny
# presets and on SmolLM2, its logits pass --check against the reference
# forward, each rank packs only its rows of the split matrices, and the
# failures are named: a mismatched launch (another --tp, model
# file or executable on one rank) is refused at the start, a rank that hangs
# stops the others with a report naming the rank and the event, and a rank
# that dies ends the job. Skipped (77) only when mpirun is absent
# (scripts/deps.sh installs openmpi-bin).
set -euo pipefail
MS=$1
command -v mpirun >/dev/null || { echo "mpirun not found: skipped (scripts/deps.sh installs openmpi-bin)"; exit 77; }
# Open MPI refuses root unless told; CI runs as root. A CPU may hold both ranks.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
F=${MS_SMOLLM2:-$HOME/.cache/megascope/SmolLM2-135M-Instruct.Q4_1.gguf}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
mp() { timeout 300 mpirun -np 2 "$@"; }

tokens() { python3 -c 'import json,sys; print(json.dumps(json.load(open(sys.argv[1]))["tokens"]))' "$1"; }
same_tokens() {  # name, args...: --tp 1 in one process against --tp 2 across two
  local name=$1
  shift
  "$MS" run "$@" --json > "$tmp/one.json"
  mp "$MS" run "$@" --tp 2 --comm-timeout-ms 120000 --json > "$tmp/two.json" 2> "$tmp/two.err" || { cat "$tmp/two.err" >&2; fail "$name: mpirun"; }
  [ "$(tokens "$tmp/one.json")" = "$(tokens "$tmp/two.json")" ] ||
    fail "$name: the tokens of --tp 2 across two ranks differ from --tp 1: $(tokens "$tmp/two.json") vs $(tokens "$tmp/one.json")"
  python3 - "$tmp/two.json" <<'PY' || fail "$name: the run across ranks"
import json, sys
j = json.load(open(sys.argv[1]))
assert j["ranks"] == 2, j.get("ranks")
assert j["generated_tokens"] > 0
PY
  echo "ok: $name: $(python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); print(sum(len(t) for t in j["tokens"]), "tokens equal")' "$tmp/two.json")"
}

# tiny: four rows decoded together over a long generation, the requests joining
# as earlier ones finish; the 8-bit and the f32 paths; the per-op baseline; a
# chunked prefill
same_tokens "tiny, batch 4, 6 requests, 200 steps" --synthetic tiny --batch 4 --requests 6 --steps 200 --prompt-len 9 --workers 1
same_tokens "tiny, f32 activations, 2 workers a rank" --synthetic tiny --batch 2 --steps 120 --f32-activations --workers 2
same_tokens "tiny, per-op" --synthetic tiny --batch 2 --steps 60 --mode per-op --workers 1
same_tokens "tiny-gemma3 (post-norms)" --synthetic tiny-gemma3 --batch 2 --steps 60 --workers 1
same_tokens "tiny-qwen2, chunked prefill" --synthetic tiny-qwen2 --batch 3 --steps 40 --prompt-len 20 --max-batched-tokens 16 --workers 1

# every position's logits against the reference forward, within --check's
# own tolerance (1e-3 on the f32 path); and since a gather moves each share
# whole (no reduction across ranks), the same largest difference as --tp 1
"$MS" run --synthetic tiny --batch 2 --steps 40 --check --workers 1 --json > "$tmp/check1.json"
mp "$MS" run --synthetic tiny --batch 2 --steps 40 --tp 2 --check --workers 1 --comm-timeout-ms 120000 --json > "$tmp/check.json" 2> "$tmp/check.err" ||
  { cat "$tmp/check.err" >&2; fail "--check across ranks"; }
python3 - "$tmp/check1.json" "$tmp/check.json" <<'PY' || fail "--check across ranks: $(cat "$tmp/check.json")"
import json, sys
one, two = (json.load(open(p)) for p in sys.argv[1:])
assert two["check_passed"] and two["max_abs_logit_diff"] <= 1e-3, two
assert two["max_abs_logit_diff"] == one["max_abs_logit_diff"], (two["max_abs_logit_diff"], one["max_abs_logit_diff"])
PY
echo "ok: --check across ranks: $(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["max_abs_logit_diff"])' "$tmp/check.json"), as --tp 1"

# each rank packs only the rows of the split matrices it reads (the last
# same_tokens' runs): at most 60% of what one process packs (about half, and
# the tiles across a share's edge), where the tokens were the same
packed_share() {  # name
  python3 - "$1" "$tmp/one.json" "$tmp/two.json" <<'PY' || fail "$1: the ranks' packed weights"
import json, sys
one, two = (json.load(open(p)) for p in sys.argv[2:])
whole = one["packed_bytes"][0]
assert whole == one["packed_bytes_whole"] == two["packed_bytes_whole"], (one, two["packed_bytes_whole"])
assert len(two["packed_bytes"]) == 2, two["packed_bytes"]
for r, b in enumerate(two["packed_bytes"]):
    assert b <= 0.6 * whole, f"rank {r} packs {b} bytes, the whole model {whole}"
mib = " and ".join(f"{b / 2**20:.1f}" for b in two["packed_bytes"])
print(f"ok: {sys.argv[1]}: the ranks pack {mib} MiB, one process {whole / 2**20:.1f} MiB")
PY
}

# SmolLM2: greedy text over a long generation, then a batch
if [ -r "$F" ]; then
  same_tokens "SmolLM2, 200 greedy tokens" --model "$F" --prompt "The capital of France is" --steps 200 --batch 1 --workers 1 --max-ctx 256
  same_tokens "SmolLM2, batch 3, 64 steps" --model "$F" --batch 3 --steps 64 --workers 1
  packed_share "SmolLM2"
else
  echo "SmolLM2 not cached ($F): its comparisons skipped; scripts/get-smollm2.sh fetches it"
fi
G=${MS_GEMMA3:-$HOME/.cache/megascope/gemma-3-270m-q4_k_m.gguf}
if [ -r "$G" ]; then  # post-norms, local layers, a vocabulary of 262144 gathered each step
  same_tokens "Gemma-3-270M, 40 greedy tokens" --model "$G" --prompt "The capital of France is" --steps 40 --batch 1 --workers 1
  packed_share "Gemma-3-270M"
fi

# hooks on rank 0: the rank is the device, and the tasks after a gather name
# rank 1 as the remote producer whose share completed their event
mp "$MS" run --synthetic tiny --tp 2 --workers 1 --batch 2 --steps 30 --comm-timeout-ms 120000 \
  --query 'task_begin /op == rope/ { @[device, remote_device] = count() } comm { @c[device, comm_phase] = count() }' \
  > "$tmp/q.out" 2> "$tmp/q.err" || { cat "$tmp/q.err" >&2; fail "--query across ranks"; }
grep -Eq '^@\[0, 1\]: [1-9]' "$tmp/q.out" || { cat "$tmp/q.out" >&2; fail "rank 0's rope tasks name no remote producer on rank 1"; }
grep -Eq '^@c\[0, complete\]: [1-9]' "$tmp/q.out" || { cat "$tmp/q.out" >&2; fail "rank 0's comm hook"; }
! grep -Eq '^@\[1,' "$tmp/q.out" || fail "rank 0's hooks say device 1"
echo "ok: hooks on rank 0: $(grep -E '^@\[0, 1\]' "$tmp/q.out") (rope tasks whose event rank 1's share completed)"

# bench decode across two ranks: both engines, the ranks said
mp "$MS" bench decode --synthetic tiny --tp 2 --workers 1 --steps 8 --rounds 1 --comm-timeout-ms 120000 --json > "$tmp/bench.json" 2> "$tmp/bench.err" ||
  { cat "$tmp/bench.err" >&2; fail "bench decode --tp 2"; }
python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); assert j["ranks"] == 2 and j["megakernel_tokens_per_s"] > 0 and j["per_op_tokens_per_s"] > 0, j' "$tmp/bench.json" ||
  fail "bench decode --tp 2: $(cat "$tmp/bench.json")"
echo "ok: bench decode --tp 2"

# ---- refusals at the start, by name ----
refused() {  # name, expected message, mpirun args...
  local name=$1 want=$2
  shift 2
  if timeout 120 mpirun "$@" > "$tmp/r.out" 2> "$tmp/r.err"; then fail "$name: accepted"; fi
  grep -q -- "$want" "$tmp/r.err" || { cat "$tmp/r.err" >&2; fail "$name: no '$want'"; }
  echo "ok: $name refused: $(grep -m1 -- "$want" "$tmp/r.err")"
}
refused "--tp 3 on 2 ranks" "must equal the number of ranks" -np 2 "$MS" run --synthetic tiny --tp 3 --steps 4
refused "another --tp on rank 1" "rank 1 was started with --tp 3, rank 0 with --tp 2" \
  -np 1 "$MS" run --synthetic tiny --tp 2 --steps 4 : -np 1 "$MS" run --synthetic tiny --tp 3 --steps 4
refused "another model on rank 1" "rank 1's model is not rank 0's" \
  -np 1 "$MS" run --synthetic tiny --tp 2 --steps 4 : -np 1 "$MS" run --synthetic tiny-qwen3 --tp 2 --steps 4
cp "$MS" "$tmp/megascope-other" && printf 'x' >> "$tmp/megascope-other"
refused "another executable on rank 1" "rank 1 runs another megascope than rank 0" \
  -np 1 "$MS" run --synthetic tiny --tp 2 --steps 4 : -np 1 "$tmp/megascope-other" run --synthetic tiny --tp 2 --steps 4
refused "other arguments on rank 1" "rank 1 was started with other arguments" \
  -np 1 "$MS" run --synthetic tiny --tp 2 --steps 4 : -np 1 "$MS" run --synthetic tiny --tp 2 --steps 5
refused "the simulator across ranks" "runs on the cpu backend" -np 2 "$MS" run --synthetic tiny --tp 2 --steps 4 --backend sim
refused "a MoE model across ranks" "dense models only" -np 2 "$MS" run --synthetic tiny-moe --tp 2 --steps 4

# ---- a rank that hangs, a rank that dies ----
# Each rank writes its pid, then becomes megascope; a long run (1000 requests
# of 1000 tokens, four at a time), so that the signal lands mid-generation:
# once rank 1 has used 1.5 s of CPU, which its start (MPI_Init, the launch
# check, the model) does not, so the signal never lands inside MPI_Init.
long_run() {
  timeout 300 mpirun -np 2 bash -c 'echo $$ > '"$tmp"'/pid.$OMPI_COMM_WORLD_RANK; exec "$0" "$@"' \
    "$MS" run --synthetic tiny --tp 2 --workers 1 --batch 4 --requests 1000 --steps 1000 --max-ctx 1100 \
    --comm-timeout-ms 1500 > "$tmp/long.out" 2> "$tmp/long.err"
}
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat" 2>/dev/null || echo 0; }
signal_rank1() {  # signal
  for _ in $(seq 1 600); do [ -s "$tmp/pid.1" ] && break; sleep 0.1; done
  local pid
  pid=$(cat "$tmp/pid.1")
  for _ in $(seq 1 1200); do [ "$(cpu_ticks "$pid")" -ge 150 ] && break; sleep 0.1; done
  kill -"$1" "$pid"
}
rm -f "$tmp"/pid.*
long_run & job=$!
signal_rank1 STOP
set +e
wait $job
rc=$?
set -e
kill -CONT "$(cat "$tmp/pid.1")" 2>/dev/null || true
[ "$rc" -ne 0 ] || fail "a hung rank: mpirun exited 0"
[ "$rc" -ne 124 ] || { cat "$tmp/long.err" >&2; fail "a hung rank: still waiting after 300 s"; }
grep -q "stopped: rank 0: waited [0-9]* ms for rank 1's share of .* (task [0-9]*; the remote event it releases: [0-9]*" "$tmp/long.err" ||
  grep -q "stopped: rank 0: rank 1 did not take rank 0's share of .* (task [0-9]*, which triggers event [0-9]*" "$tmp/long.err" ||
  grep -q "stopped: rank 0: rank 1 sent nothing for the start of step [0-9]*" "$tmp/long.err" ||
  grep -q "rank 0: the launch check had no answer from rank 1" "$tmp/long.err" ||
  { cat "$tmp/long.err" >&2; fail "a hung rank: no report naming rank 1 and the event"; }
echo "ok: a hung rank: $(grep -m1 'stopped: rank 0' "$tmp/long.err")"

rm -f "$tmp"/pid.*
long_run & job=$!
signal_rank1 KILL
set +e
wait $job
rc=$?
set -e
[ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] || { cat "$tmp/long.err" >&2; fail "a dead rank: mpirun exited $rc"; }
grep -q "rank 1" "$tmp/long.err" || { cat "$tmp/long.err" >&2; fail "a dead rank: rank 1 not named"; }
echo "ok: a dead rank: mpirun exited $rc: $(grep -m1 'rank 1' "$tmp/long.err")"
echo "all passed"
