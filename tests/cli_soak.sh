#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The short soak (tests/soak.py, 30 cycles): attach / replace / detach cycles
# with budgets, read-outs (the last one releasing the attachment), traces,
# listings, schema and /metrics while completions stream; idle control clients
# that must not lock an operator out. No failed request, coverage that adds up
# for every closed generation, the same file descriptors at the end as at the
# baseline and RSS within 8 MiB of it; then the same on the CUDA backend
# (megascope-emu). `make soak` runs the long version. Each runs once: a failure
# is a failure (no second try).
set -euo pipefail
MS=$1
SRC=${MS_SRC:-$(cd "$(dirname "$0")/.." && pwd)}
MON=${MS_MONITORS:-}
for m in class_time queueing dep_wait step_trace; do
  [ -n "$MON" ] && [ -f "$MON/$m.bpf.o" ] || { echo "skipped: no shipped monitors (MS_MONITORS)"; exit 77; }
done
command -v python3 >/dev/null || { echo "skipped: no python3"; exit 77; }
soak() {  # [BINARY [soak.py options]]
  local bin=${1:-$MS}
  [ $# -gt 0 ] && shift
  python3 "$SRC/tests/soak.py" --ms "$bin" --monitors "$MON" --cycles "${SOAK_CYCLES:-30}" --warmup 8 \
    --retention 1 --max-seconds 240 --ring-loss-ok "$@"
}
# A short soak beside other tests on two cores can starve the ring reader
# (step_trace's 4 KiB ring holds about 16 ms of records): --ring-loss-ok lets
# records be lost as long as every one is counted lost, by the reader and by
# the attachment's coverage alike; `make soak` (alone on the machine) keeps
# "none lost".
soak
# The same on the engine's CUDA backend, through megascope-emu (the CLI over
# the emulated CUDA sources): the emulation keeps freed
# device memory in a quarantine, bounded here so the RSS shows what the code keeps.
EMU=$(dirname "$MS")/megascope-emu
if [ ! -x "$EMU" ]; then
  echo "SKIP: the CUDA-backend soak: no megascope-emu beside $MS"
  echo "1 passed, 0 failed, 1 skipped"
  exit 77
fi
MS_EMU_QUARANTINE_KIB=0 soak "$EMU" --backend cuda
echo "2 passed, 0 failed"
