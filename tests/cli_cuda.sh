#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# `megascope cuda` on any machine: --help, usage errors (exit 2 naming the
# problem), `info` (text and --json, which says whether a device is there and
# why not), and, without a device, every other subcommand (and run --backend
# cuda) failing (exit 1) with the reason. With a device, `cuda run --check` on tiny must agree with the CPU.
set -uo pipefail
MS=$1
pass=0 fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }

expect() {  # RC TEXT ARGS...: exit code RC and TEXT in stdout+stderr
  local rc_want=$1 want=$2; shift 2
  local out rc
  out=$("$MS" "$@" 2>&1); rc=$?
  if [ "$rc" -eq "$rc_want" ] && grep -q -- "$want" <<<"$out"; then ok; else bad "$* -> rc $rc (want $rc_want, '$want'): $out"; fi
}

expect 0 "usage: megascope cuda info" cuda --help
expect 2 "usage: megascope cuda" cuda
expect 2 "unknown subcommand 'launch'" cuda launch
expect 2 "batch" cuda run --batch 0
expect 2 "batch" cuda run --batch 1000
expect 2 "unexpected argument 'extra'" cuda run extra
expect 2 "unrecognized option\|unknown option" cuda run --fast

info=$("$MS" cuda info --json); rc=$?
[ $rc -eq 0 ] && ok || bad "cuda info --json -> rc $rc"
avail=$(python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["available"]); assert d["available"] or d["reason"]' <<<"$info") \
  && ok || bad "cuda info --json is not the expected JSON: $info"
expect 0 "no CUDA backend here\|SMs, sm_" cuda info
if [ "$avail" = "False" ]; then
  reason=$(python3 -c 'import json,sys; print(json.load(sys.stdin)["reason"])' <<<"$info")
  for sub in run ops bench; do expect 1 "$reason" cuda $sub --synthetic tiny; done
  expect 1 "$reason" run --synthetic tiny --backend cuda   # the engine's CUDA backend
else
  expect 0 "0 of 8 requests differ" cuda run --synthetic tiny --dtype bf16 --check
  expect 0 "check: .*passed" run --synthetic tiny --dtype bf16 --backend cuda --check
fi
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
