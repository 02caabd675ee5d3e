#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The three fuzz scripts (scripts/fuzz.sh, fuzz_query.sh, fuzz_control.sh)
# still build their libFuzzer targets under AddressSanitizer and
# UndefinedBehaviorSanitizer, and each target replays its seed corpus once
# (-runs=0: every seed, no mutation, so the test is deterministic) without a
# crash or a sanitizer report. Nothing else runs them, and they had stopped
# linking twice unnoticed (a part's new dependency, a clang without a builtin).
# The targets are kept under the build tree between runs (the scripts rebuild
# what changed). Skipped without clang or its libFuzzer runtime.
set -euo pipefail
MS=$1
SRC=${MS_SRC:-$(cd "$(dirname "$0")/.." && pwd)}
BUILD=$(cd "$(dirname "$MS")" && pwd)
command -v clang >/dev/null || { echo "skipped: no clang"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo 'int LLVMFuzzerTestOneInput(const char *d, unsigned long n) { return 0; }' >"$tmp/t.c"
clang -fsanitize=fuzzer,address "$tmp/t.c" -o "$tmp/t" 2>/dev/null ||
  { echo "skipped: clang cannot link -fsanitize=fuzzer (libclang-rt-dev)"; exit 77; }
fail() { echo "FAILED: $*"; exit 1; }

run() {  # script, its seed folder (relative to its FUZZ_DIR, or absolute)
  local name=$1 seeds=$2 dir="$BUILD/fuzz/$1"
  mkdir -p "$dir"
  # building: the script fuzzes FUZZ_SECONDS after it; -runs=0 below replays instead
  FUZZ_DIR=$dir MS_SHARED=${MS_SHARED:-$SRC/../shared} bash "$SRC/scripts/$name.sh" -runs=0 \
    "$(case $seeds in /*) echo "$seeds" ;; *) echo "$dir/$seeds" ;; esac)" >"$tmp/$name.log" 2>&1 ||
    fail "$name.sh: $(tail -20 "$tmp/$name.log")"
  grep -q 'Done [0-9]* runs\|INFO: seed corpus: files: [0-9]' "$tmp/$name.log" ||
    fail "$name.sh replayed nothing: $(tail -20 "$tmp/$name.log")"
  ! grep -q 'ERROR: AddressSanitizer\|runtime error:\|ERROR: libFuzzer' "$tmp/$name.log" ||
    fail "$name.sh: $(grep -m3 'ERROR\|runtime error' "$tmp/$name.log")"
  echo "$name.sh: $(grep -o 'Done [0-9]* runs' "$tmp/$name.log" | tail -1) over its seeds"
}
run fuzz seeds
run fuzz_query "$SRC/tests/fuzz/query"
run fuzz_control seeds
echo "PASS: the three fuzz targets build and replay their seeds"
