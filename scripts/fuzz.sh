#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Fuzzes the eBPF loader, verifier and interpreter (tests/fuzz/fuzz_bpf.c) with
# libFuzzer under AddressSanitizer and UndefinedBehaviorSanitizer.
#
# Builds the target from the sources with clang into $FUZZ_DIR (default
# build-fuzz/, outside the CMake build), makes a seed corpus — the monitors of
# tests/data and monitors/ compiled for the bpf target, and every program of the
# conformance suite as raw instructions — and runs for FUZZ_SECONDS (default
# 60). The corpus grows in $FUZZ_DIR/corpus across runs; crashes land in
# $FUZZ_DIR/artifacts/ (copy a reproducer into tests/fuzz/corpus/ once fixed,
# so ctest replays it). A verified program that faults at run time aborts the
# target: that is a verifier soundness bug.
#
#   scripts/fuzz.sh                 build, seed, fuzz 60 s
#   FUZZ_SECONDS=600 FUZZ_JOBS=8 scripts/fuzz.sh
#   scripts/fuzz.sh path/to/crash   replay one input (any libFuzzer arguments work)
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
dir=${FUZZ_DIR:-$root/build-fuzz}
secs=${FUZZ_SECONDS:-60}
jobs=${FUZZ_JOBS:-1}
cc=${FUZZ_CC:-clang}
shared=${MS_SHARED:-$root/../shared}
arch=$(uname -m)

command -v "$cc" >/dev/null || { echo "fuzz.sh: $cc not found" >&2; exit 77; }
mkdir -p "$dir/obj" "$dir/corpus" "$dir/seeds" "$dir/artifacts"

san="-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer"
cflags="-g -O1 -std=gnu11 -D_GNU_SOURCE -Wall -Wno-unused-parameter -I$root/include -I$root/src -I$root/tests"
libs="$(pkg-config --libs libbpf libelf) -lpthread -lm"

# The library parts the target needs: base, bpf, the hook ABI tables.
srcs=("$root"/src/base/*.c "$root"/src/bpf/*.c "$root/src/hook/abi.c")
objs=()
for src in "${srcs[@]}"; do
  obj="$dir/obj/$(basename "$(dirname "$src")")_$(basename "$src" .c).o"
  if [ ! -f "$obj" ] || [ "$src" -nt "$obj" ] || [ -n "$(find "$root/src/bpf" "$root/include" -newer "$obj" -name '*.h' 2>/dev/null)" ]; then
    "$cc" $cflags $san -fsanitize=fuzzer-no-link -c "$src" -o "$obj"
  fi
  objs+=("$obj")
done
"$cc" $cflags $san -fsanitize=fuzzer "$root/tests/fuzz/fuzz_bpf.c" "${objs[@]}" $libs -o "$dir/fuzz_bpf"
"$cc" $cflags -DMS_FUZZ_SEEDS_MAIN "$root/tests/fuzz/seeds.c" "${srcs[@]}" $libs -o "$dir/make_seeds"

# Seeds: compiled monitors and conformance programs.
for src in "$root"/tests/data/verifier/*.bpf.c "$root"/tests/data/bpf/*.bpf.c "$root"/monitors/*.bpf.c; do
  [ -f "$src" ] || continue
  "$cc" -O2 -g -target bpf -I"$root/include" -I"$root/tests/data/bpf" -I"/usr/include/$arch-linux-gnu" \
    -c "$src" -o "$dir/seeds/$(basename "$src" .c).o" 2>/dev/null || echo "fuzz.sh: seed $src did not build" >&2
done
if [ -d "$shared/third_party/bpf_conformance/tests" ]; then
  "$dir/make_seeds" "$shared/third_party/bpf_conformance/tests" "$dir/seeds"
fi
cp -n "$root"/tests/fuzz/corpus/* "$dir/seeds/" 2>/dev/null || true

if [ $# -gt 0 ]; then
  exec "$dir/fuzz_bpf" "$@"
fi
echo "fuzz.sh: fuzzing for ${secs}s with $jobs job(s); corpus $dir/corpus, crashes in $dir/artifacts/"
fork=()
[ "$jobs" -gt 1 ] && fork=(-fork="$jobs" -ignore_crashes=0)
exec "$dir/fuzz_bpf" -max_total_time="$secs" -timeout=20 -rss_limit_mb=4096 -max_len=65536 \
  -artifact_prefix="$dir/artifacts/" -print_final_stats=1 "${fork[@]}" "$dir/corpus" "$dir/seeds"
