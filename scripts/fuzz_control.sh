#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Fuzzes the control socket's request handling (tests/fuzz/fuzz_control.c) with
# libFuzzer under AddressSanitizer and UndefinedBehaviorSanitizer.
#
# Builds the target and the whole core with clang into $FUZZ_DIR (default
# build-fuzz-control/, outside the CMake build), seeds the corpus with
# tests/fuzz/control/ and attach requests carrying the shipped monitors, and
# runs for FUZZ_SECONDS (default 60). Crashes land in $FUZZ_DIR/artifacts/;
# copy a reproducer into tests/fuzz/control/ once fixed, so ctest replays it
# (test_control_fuzz_corpus).
#
#   scripts/fuzz_control.sh                 build, seed, fuzz 60 s
#   FUZZ_SECONDS=600 scripts/fuzz_control.sh
#   scripts/fuzz_control.sh path/to/crash   replay one input
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
dir=${FUZZ_DIR:-$root/build-fuzz-control}
secs=${FUZZ_SECONDS:-60}
cc=${FUZZ_CC:-clang}
arch=$(uname -m)
command -v "$cc" >/dev/null || { echo "fuzz_control.sh: $cc not found" >&2; exit 77; }
mkdir -p "$dir/obj" "$dir/corpus" "$dir/seeds" "$dir/artifacts"

san="-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer"
# the rest of the core (the engine the requests run against) with ASan only: UB
# reports there belong to the other parts' own sanitizer runs, not to this target
san_other="-fsanitize=address -fno-omit-frame-pointer"
cflags="-g -O1 -std=gnu11 -D_GNU_SOURCE -Wall -Wno-unused-parameter -I$root/include -I$root/src -I$root/tests"
libs="$(pkg-config --libs libbpf libelf jansson libmicrohttpd libcurl) -lpthread -lm"

objs=()  # the core without its CUDA sources (no nvcc here): src/cuda/without_cuda.c stands for them
while IFS= read -r src; do
  obj="$dir/obj/$(echo "${src#"$root"/src/}" | tr / _ | sed 's/\.c$/.o/')"
  if [ ! -f "$obj" ] || [ "$src" -nt "$obj" ]; then
    # a file this clang cannot build (a gcc-only builtin) is built by gcc, uninstrumented
    case "$src" in
      "$root"/src/control/* | "$root"/src/export/*) flags=$san ;;
      *) flags=$san_other ;;
    esac
    "$cc" $cflags $flags -fsanitize=fuzzer-no-link -c "$src" -o "$obj" 2>"$dir/obj/cc.err" ||
      { echo "fuzz_control.sh: $src: built with gcc, uninstrumented" >&2; gcc $cflags -c "$src" -o "$obj"; }
  fi
  objs+=("$obj")
done < <(find "$root/src" -name '*.c' -not -path '*/cuda/*' | sort; echo "$root/src/cuda/without_cuda.c")
"$cc" $cflags $san -fsanitize=fuzzer "$root/tests/fuzz/fuzz_control.c" "${objs[@]}" $libs -o "$dir/fuzz_control"

# Seeds: the request corpus, and attach requests carrying each shipped monitor.
cp -n "$root"/tests/fuzz/control/* "$dir/seeds/" 2>/dev/null || true
for src in "$root"/monitors/*.bpf.c; do
  name=$(basename "$src" .bpf.c)
  "$cc" -O2 -g -target bpf -I"$root/include" -I"/usr/include/$arch-linux-gnu" -c "$src" -o "$dir/obj/$name.bpf.o" \
    2>/dev/null || continue
  printf '{"cmd":"attach","name":"%s","object":"%s"}' "$name" "$(base64 -w0 "$dir/obj/$name.bpf.o")" \
    >"$dir/seeds/attach_$name.json"
done

cd "$dir"
if [ $# -gt 0 ]; then
  exec ./fuzz_control "$@"
fi
./fuzz_control -max_total_time="$secs" -timeout=20 -max_len=65536 -artifact_prefix="$dir/artifacts/" \
  -print_final_stats=1 "$dir/corpus" "$dir/seeds"
