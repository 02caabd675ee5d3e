#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Fuzzes the query language's compiler (tests/fuzz/fuzz_query.c) with
# libFuzzer under AddressSanitizer and UndefinedBehaviorSanitizer: any text
# compiles to programs the verifier accepts or is refused with its column.
#
# Builds into $FUZZ_DIR (default build-fuzz-query/), seeds with
# tests/fuzz/query/*.q (the documented examples) and runs for FUZZ_SECONDS
# (default 60). Crashes land in $FUZZ_DIR/artifacts/; copy a reproducer into
# tests/fuzz/query/ once fixed, so test_query replays it.
#
#   scripts/fuzz_query.sh                 build, seed, fuzz 60 s
#   scripts/fuzz_query.sh path/to/crash   replay one input
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dir=${FUZZ_DIR:-$root/build-fuzz-query}
secs=${FUZZ_SECONDS:-60}
cc=${FUZZ_CC:-clang}
command -v "$cc" >/dev/null || { echo "fuzz_query.sh: $cc not found" >&2; exit 77; }
mkdir -p "$dir/obj" "$dir/corpus" "$dir/artifacts"
san="-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer"
cflags="-g -O1 -std=gnu11 -D_GNU_SOURCE -Wall -Wno-unused-parameter -I$root/include -I$root/src"
libs="$(pkg-config --libs libbpf libelf jansson) -lpthread -lm"
# the parts a query needs: base, bpf (loader, verifier), the hook ABI and monitors, the query compiler
# (without plan_names.c, its one file that reads a compiled plan)
srcs=("$root"/src/base/*.c "$root"/src/bpf/*.c "$root"/src/hook/*.c "$root"/src/query/codegen.c
      "$root"/src/query/output.c "$root"/src/query/parse.c "$root"/src/query/query.c "$root"/src/query/reference.c
      "$root"/src/query/union.c)
objs=()
for src in "${srcs[@]}"; do
  obj="$dir/obj/$(basename "$(dirname "$src")")_$(basename "$src" .c).o"
  "$cc" $cflags $san -fsanitize=fuzzer-no-link -c "$src" -o "$obj"
  objs+=("$obj")
done
python3 - "$root/tests/fuzz/query/schema.json" "$dir/schema.c" <<'PY'
import json, sys
text = json.dumps(json.load(open(sys.argv[1])), separators=(",", ":"))
open(sys.argv[2], "w").write("const char ms_fuzz_schema[] = " + json.dumps(text) + ";\n")
PY
"$cc" $cflags $san -fsanitize=fuzzer "$root/tests/fuzz/fuzz_query.c" "$dir/schema.c" "${objs[@]}" $libs \
  -o "$dir/fuzz_query"
if [ $# -gt 0 ]; then exec "$dir/fuzz_query" "$@"; fi
echo "fuzz_query.sh: fuzzing for ${secs}s; corpus $dir/corpus, crashes in $dir/artifacts/"
exec "$dir/fuzz_query" -max_total_time="$secs" -timeout=20 -max_len=4096 -artifact_prefix="$dir/artifacts/" \
  -print_final_stats=1 "$dir/corpus" "$root/tests/fuzz/query"
