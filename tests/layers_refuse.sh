#!/usr/bin/env bash
# The layer check refuses what the direction of flow forbids (cmake/layers.cmake):
# a public header above the part (MS_DENIES: bpf including the hook ABI; a
# door whose owner, MS_OWNS, is not below the part), a public header no part
# owns, a private header of a folder the part may not see, a path out of its
# folder, a circle between parts; and passes the includes the table allows. Run on a tree of a few files
# beside a copy of the table, so it says nothing about the real tree (the
# test `layers` does that).
set -euo pipefail
SRC=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/cmake" "$tmp/src/bpf" "$tmp/src/runtime" "$tmp/src/bench" "$tmp/src/hook" "$tmp/src/core"
cp "$SRC/cmake/layers.cmake" "$SRC/cmake/check_layers.cmake" "$tmp/cmake/"
check() {  # cmake folds its messages: the output as one line
  local rc=0
  cmake -DMS_SRC="$tmp" -P "$tmp/cmake/check_layers.cmake" > "$tmp/raw" 2>&1 || rc=$?
  tr -s ' \n' '  ' < "$tmp/raw" > "$tmp/out"
  return $rc
}

printf '#include "megascope/verifier.h"\n#include "core/alu.h"\n' > "$tmp/src/bpf/ok.c"
printf '#include "megascope/monitor.h"\n#include "hook/hook_impl.h"\n' > "$tmp/src/hook/ok.c"
printf '#include "megascope/bpf/megascope.h"\n' > "$tmp/src/core/hookish.h"
printf '#include "core/hookish.h"\n' > "$tmp/src/runtime/ok.c"
check || { echo "allowed includes refused:"; cat "$tmp/out"; exit 1; }

expect_refused() {  # file, include, what the refusal says
  printf '#include "%s"\n' "$2" > "$tmp/src/$1"
  if check; then echo "src/$1: #include \"$2\" was not refused"; exit 1; fi
  grep -qF "$3" "$tmp/out" || { echo "src/$1: expected \"$3\":"; cat "$tmp/out"; exit 1; }
  rm "$tmp/src/$1"
}
expect_refused bpf/bad.c megascope/hook.h "is above bpf in the direction of flow (cmake/layers.cmake, MS_DENIES_bpf)"
expect_refused bpf/bad.c megascope/bpf/megascope.h "MS_DENIES_bpf"
expect_refused bpf/bad.c hook/hook_impl.h "is a private header of src/hook/, and bpf may include no private header"
expect_refused runtime/bad.c bench/bench.h "is a private header of src/bench/, and runtime may include only"
expect_refused hook/bad.c ../core/alu.h "reaches out of src/hook/ by a relative path"
expect_refused hook/bad.c megascope/engine.h "is the door of runtime (cmake/layers.cmake, MS_OWNS_runtime), which is not below hook"
expect_refused hook/bad.c megascope/nonesuch.h "no part owns this public header"
expect_refused core/bad.h bpf/map_view.h "is a private header of src/bpf/, and core may include no private header"
expect_refused core/bad.h megascope/engine.h "core includes only its own headers and the public headers MS_PUBLIC_core names"
expect_refused bpf/bad.c core/hookish.h "brings \"megascope/bpf/megascope.h\", which is above bpf"
printf '#ifdef __CUDACC__\n#endif\n' > "$tmp/src/hook/bad.h"
if check; then echo "src/hook/bad.h: __CUDACC__ outside src/core was not refused"; exit 1; fi
grep -qF "tests __CUDACC__, which only src/core/ does" "$tmp/out" || { echo "expected the __CUDACC__ refusal:"; cat "$tmp/out"; exit 1; }
rm "$tmp/src/hook/bad.h"
check || { echo "refused after the bad files went:"; cat "$tmp/out"; exit 1; }

# A circle: a private edge the table allows against the links (bpf sees hook,
# which links bpf) closes bpf -> hook -> bpf.
echo 'set(MS_SEES_bpf hook)' >> "$tmp/cmake/layers.cmake"
printf '#include "hook/hook_impl.h"\n' > "$tmp/src/bpf/up.c"
printf '#include "megascope/bpf.h"\n' > "$tmp/src/hook/down.c"
if check; then echo "a circle between bpf and hook was not refused"; exit 1; fi
grep -qF 'closes a circle between parts (bpf -> hook -> bpf)' "$tmp/out" || { echo "expected the circle:"; cat "$tmp/out"; exit 1; }
echo "layers_refuse: ok"
