#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# task_assign carries the depth of the queue the task joined (docs/hooks.md):
# on the CPU backend (a worker's AOT queue at the step's start: the tasks left
# in it, and the JIT queue a released task is pushed on) and on the simulator,
# a monitor reading queue_depth on task_assign sees more than 0 (it read 0
# everywhere but on the device before the hook sites shared one fill).
set -euo pipefail
MS=$1
fail() { echo "FAILED: $*"; exit 1; }
q='task_assign { @d = max(queue_depth); @n = count() }'
for be in cpu sim; do
  out=$("$MS" run --synthetic tiny --backend "$be" --requests 4 --steps 8 --query "$q" 2>&1) ||
    { echo "$out"; fail "$be: run --query exited non-zero"; }
  n=$(sed -n 's/^@n: \([0-9]*\).*/\1/p' <<<"$out")
  d=$(sed -n 's/^@d: \([0-9]*\).*/\1/p' <<<"$out")
  [ -n "$n" ] && [ "$n" -gt 0 ] || { echo "$out"; fail "$be: no task_assign fired"; }
  [ -n "$d" ] && [ "$d" -gt 0 ] || { echo "$out"; fail "$be: task_assign's queue_depth was never above 0"; }
  echo "$be: $n task_assign firings, max queue_depth $d"
done
echo "cli_assign_depth: ok"
