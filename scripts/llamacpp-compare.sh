#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# megascope against llama.cpp on the same GGUF file, on the same machine, with
# the same number of threads, in one run. llama.cpp is driven through the C API
# that llama-cpp-python binds (scripts/llamacpp-compare.py).
#
#   scripts/llamacpp-compare.sh setup    build llama-cpp-python (it compiles llama.cpp:
#                                        4.5 minutes on a 2-vCPU Xeon) into $MS_CACHE/llamacpp-venv
#   scripts/llamacpp-compare.sh logits   the same token ids through both: tokenizer
#                                        agreement, top-1 agreement, largest |logit difference|
#   scripts/llamacpp-compare.sh speed    decode tokens/s of both at each batch size, and the ratio
#   scripts/llamacpp-compare.sh prompt   prompt processing tokens/s of both for PROMPT tokens
#                                        (llama-bench -p PROMPT; megascope: bench prefill's chunked
#                                        engine, --max-batched-tokens PREFILL_CHUNK)
#   scripts/llamacpp-compare.sh types    speed on SmolLM2 written in every type megascope loads by
#                                        llama.cpp's own quantizer (llama_model_quantize) from an
#                                        f32 copy (cached in $MS_CACHE/smollm2-types): TYPES (default
#                                        "Q8_0 Q4_0 Q4_1 Q5_0 Q5_1 IQ4_NL Q2_K Q3_K_M Q4_K_M Q5_K_M Q6_K";
#                                        rows that are not whole 256-blocks fall back to the types
#                                        llama.cpp picks for them, as in any such file)
#   scripts/llamacpp-compare.sh all      logits, then speed (the default)
#
# Through llama.cpp's own tools instead of Python (no llama-cpp-python needed):
#   scripts/llamacpp-compare.sh build [native|noamx|avx2]
#                                        llama-bench, llama-batched-bench and llama-server from the
#                                        pinned llama-cpp-python sdist's vendored llama.cpp (commit
#                                        0c1e570), CMake, GGML_NATIVE=ON (native), AVX-512 without
#                                        AMX (noamx: where native's AMX path crashes), or AVX2 without
#                                        AVX-512 (avx2); cached in $MS_CACHE/llamacpp-bin/VARIANT
#   scripts/llamacpp-compare.sh bench    decode (batch 1: llama-bench -n STEPS; batch 8:
#                                        llama-batched-bench -npl 8) and prompt processing
#                                        (llama-bench -p PROMPT) at each of THREADS_LIST, against
#                                        megascope bench decode / bench prefill, REPS alternating runs
#                                        pinned to the same cores (taskset); the median of each and
#                                        the ratio of medians, with the range
#   scripts/llamacpp-compare.sh serve [serve-load.py options]
#                                        scripts/serve-load.py against the built llama-server
#   VARIANT (default native) picks the build bench and serve use; THREADS_LIST (default "1 2").
#
# What "speed" compares, exactly: B sequences each start from a 1-token prompt
# and generate STEPS tokens greedily; tokens/s = B * STEPS / wall seconds of the
# measured round (after an unmeasured warm-up), THREADS threads each.
#   megascope: `megascope bench decode --model F --batch B --steps STEPS --workers THREADS`
#              (the megakernel: B requests batched by the runtime, its default 8-bit
#              activations and integer dot products, as llama.cpp's)
#   llama.cpp: one context with n_seq_max = B; each step is one llama_decode of B
#              tokens, one per sequence (its CPU backend: activations quantized to
#              8 bits for the q4_1/q8_0 dot products), then argmax of each row.
# Each side runs REPS times, alternating, and the best run of each is reported,
# because these machines are shared and noisy.
#
# Environment: MS (default build/megascope), MODEL (default: scripts/get-smollm2.sh),
# THREADS (default: nproc), STEPS (default 32), BATCHES (default "1 8"), REPS (default 3), WHATS (bench:
# default "decode1 decode8 prompt"),
# MS_LOGITS_ARGS (extra options to `megascope model logits`, e.g. --f32-activations for
# the exact path; default none: megascope's default, 8-bit activations as llama.cpp's),
# KEEP_LOGITS (a folder: logits mode leaves ms.bin, lc.bin and ids.txt there),
# LLAMA_PY (a python with llama_cpp and numpy; default $MS_CACHE/llamacpp-venv/bin/python,
# else python3), MS_CACHE (default ~/.cache/megascope). Exit 77: llama_cpp is not installed.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cache=${MS_CACHE:-$HOME/.cache/megascope}
venv=$cache/llamacpp-venv
cmd=${1:-all}
case "$cmd" in
  setup | build | bench | serve | logits | speed | types | prompt | all) ;;
  -h | --help) sed -n '3,59p' "$0"; exit 0 ;;
  *) echo "llamacpp-compare: unknown command '$cmd'" >&2; sed -n '3,59p' "$0" >&2; exit 2 ;;
esac

setup() {
  if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c 'import llama_cpp, numpy' 2>/dev/null; then
    echo "$venv/bin/python"
    return
  fi
  mkdir -p "$cache"
  python3 -m venv "$venv" >&2
  echo "llamacpp-compare: building llama-cpp-python (compiles llama.cpp; this takes a while)" >&2
  CMAKE_ARGS="-DGGML_NATIVE=ON" "$venv/bin/pip" install --quiet --disable-pip-version-check \
    "llama-cpp-python==0.3.36" numpy >&2
  echo "$venv/bin/python"
}

if [ "$cmd" = setup ]; then
  setup
  exit 0
fi

LLAMACPP_PY_VERSION=0.3.36  # its vendored llama.cpp: commit 0c1e570

# build_tools VARIANT: prints the folder of the built tools (cached).
build_tools() {
  local variant=$1 out=$cache/llamacpp-bin/$1 src=$cache/llamacpp-src/llama_cpp_python-$LLAMACPP_PY_VERSION/vendor/llama.cpp
  local tools="llama-bench llama-batched-bench llama-server" t flags pip
  if [ -x "$out/bin/llama-server" ] && [ -x "$out/bin/llama-bench" ] && [ -x "$out/bin/llama-batched-bench" ]; then
    echo "$out/bin"
    return
  fi
  case $variant in
    native) flags=(-DGGML_NATIVE=ON) ;;
    avx2) flags=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON
                 -DGGML_AVX512=OFF -DGGML_AVX512_VNNI=OFF -DGGML_AVX512_BF16=OFF -DGGML_AVX_VNNI=OFF) ;;
    # AVX-512 as native has it, without AMX: on an Intel Xeon VM with AMX (2026-12-07) the native
    # build's AMX matmul (ggml_backend_amx_mul_mat) crashed on every batch over one row
    noamx) flags=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON
                  -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON
                  -DGGML_AVX_VNNI=ON -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF) ;;
    *) echo "llamacpp-compare: build: variant '$variant' is not native, noamx or avx2" >&2; exit 2 ;;
  esac
  if [ ! -f "$src/CMakeLists.txt" ]; then
    mkdir -p "$cache/llamacpp-src"
    if [ -x "$root/.venv/bin/pip" ]; then pip=("$root/.venv/bin/pip"); else pip=(python3 -m pip); fi
    echo "llamacpp-compare: fetching llama-cpp-python $LLAMACPP_PY_VERSION's source (its vendored llama.cpp)" >&2
    "${pip[@]}" download --quiet --disable-pip-version-check --no-deps --no-binary :all: \
      "llama-cpp-python==$LLAMACPP_PY_VERSION" -d "$cache/llamacpp-src" >&2
    tar xzf "$cache/llamacpp-src/llama_cpp_python-$LLAMACPP_PY_VERSION.tar.gz" -C "$cache/llamacpp-src"
  fi
  echo "llamacpp-compare: building $tools ($variant; 6 minutes on the 2-core Xeon of 2026-12-07, up to an hour on busy or slower cores)" >&2
  cmake -S "$src" -B "$out/build" -G Ninja -DCMAKE_BUILD_TYPE=Release "${flags[@]}" -DLLAMA_CURL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON \
    -DBUILD_SHARED_LIBS=OFF >&2
  # shellcheck disable=SC2086  # tools is a list of targets
  cmake --build "$out/build" -j"$(nproc)" --target $tools >&2
  mkdir -p "$out/bin"
  for t in $tools; do cp "$out/build/bin/$t" "$out/bin/"; done
  echo "$out/bin"
}
if [ "$cmd" = build ]; then
  build_tools "${2:-native}"
  exit 0
fi

MS=${MS:-$root/build/megascope}
MODEL=${MODEL:-$(bash "$root/scripts/get-smollm2.sh")}
STEPS=${STEPS:-32}
REPS=${REPS:-3}
PROMPT=${PROMPT:-512}
PREFILL_CHUNK=${PREFILL_CHUNK:-64}
jget() { python3 -c 'import json, sys; d = json.load(sys.stdin); print(eval(sys.argv[1]))' "$1"; }
# stats NAME VALUES...: the median, min and max of VALUES
stats() { python3 -c 'import statistics, sys; v = [float(x) for x in sys.argv[1:]]; print("%.2f %.2f %.2f" % (statistics.median(v), min(v), max(v)))' "$@"; }

# One measurement of each side: what (decode1, decode8, prompt) at T threads.
# VARIANT=avx2: megascope's AVX2 path too (MEGASCOPE_SIMD=avx2).
ms_once() {
  local what=$1 T=$2
  if [ "${VARIANT:-native}" = avx2 ]; then export MEGASCOPE_SIMD=avx2; fi
  case $what in
    decode1|decode8)
      taskset -c "0-$((T - 1))" "$MS" bench decode --model "$MODEL" --batch "${what#decode}" --steps "$STEPS" \
        --workers "$T" --rounds 1 --json 2>/dev/null | jget 'd["megakernel_tokens_per_s"]' ;;
    prompt)
      taskset -c "0-$((T - 1))" "$MS" bench prefill --model "$MODEL" --prompts "$PROMPT" --rounds 1 --workers "$T" \
        --max-batched-tokens "$PREFILL_CHUNK" --json 2>/dev/null | jget 'd["prompts"][0]["chunked_prompt_tokens_per_s"]' ;;
  esac
}
lc_once() {
  local what=$1 T=$2 bin=$3
  case $what in
    decode1)
      taskset -c "0-$((T - 1))" "$bin/llama-bench" -m "$MODEL" -t "$T" -p 0 -n "$STEPS" -r 1 -o json 2>/dev/null |
        jget 'd[0]["avg_ts"]' ;;
    decode8)  # 8 sequences of a 1-token prompt, STEPS tokens each: S_TG
      taskset -c "0-$((T - 1))" "$bin/llama-batched-bench" -m "$MODEL" -t "$T" -c $((8 * (STEPS + 16))) -b 512 -ub 512 \
        -npp 1 -ntg "$STEPS" -npl 8 --output-format jsonl 2>/dev/null | grep '^{' | tail -1 | jget 'd["speed_tg"]' ;;
    prompt)
      taskset -c "0-$((T - 1))" "$bin/llama-bench" -m "$MODEL" -t "$T" -p "$PROMPT" -n 0 -r 1 -o json 2>/dev/null |
        jget 'd[0]["avg_ts"]' ;;
  esac
}

tools_bench() {
  local bin T what ms_all lc_all m l rows=()
  bin=$(build_tools "${VARIANT:-native}")
  echo "bench: $(basename "$MODEL"), llama.cpp ${VARIANT:-native} tools in $bin; decode $STEPS tokens, prompt $PROMPT" \
       "tokens (megascope chunks of $PREFILL_CHUNK); $REPS alternating runs each, pinned to CPUs 0..T-1"
  printf '| what | threads | megascope tokens/s (median, range) | llama.cpp tokens/s (median, range) | megascope / llama.cpp |\n'
  printf '|---|---:|---:|---:|---:|\n'
  for T in ${THREADS_LIST:-1 2}; do
    for what in ${WHATS:-decode1 decode8 prompt}; do
      ms_all=() lc_all=()
      for _ in $(seq "$REPS"); do
        ms_all+=("$(ms_once "$what" "$T")")
        lc_all+=("$(lc_once "$what" "$T" "$bin")")
      done
      read -r m mlo mhi <<<"$(stats "${ms_all[@]}")"
      read -r l llo lhi <<<"$(stats "${lc_all[@]}")"
      printf '| %s | %d | %s (%s-%s) | %s (%s-%s) | %.2f |\n' "$what" "$T" "$m" "$mlo" "$mhi" "$l" "$llo" "$lhi" \
        "$(python3 -c "print($m / $l)")"
      rows+=("{\"what\": \"$what\", \"threads\": $T, \"megascope_runs\": [$(IFS=,; echo "${ms_all[*]}")], \"llamacpp_runs\": [$(IFS=,; echo "${lc_all[*]}")]}")
    done
  done
  echo "BENCH_JSON {\"model\": \"$(basename "$MODEL")\", \"variant\": \"${VARIANT:-native}\", \"steps\": $STEPS, \"prompt\": $PROMPT, \"reps\": $REPS, \"rows\": [$(IFS=,; echo "${rows[*]}")]}"
}

case "$cmd" in
  bench) tools_bench; exit 0 ;;
  serve)
    shift
    bin=$(build_tools "${VARIANT:-native}")
    exec python3 "$root/scripts/serve-load.py" --megascope "$MS" --model "$MODEL" --llama-server "$bin/llama-server" "$@" ;;
esac

THREADS=${THREADS:-$(nproc)}
BATCHES=${BATCHES:-1 8}
if [ -z "${LLAMA_PY:-}" ]; then
  if [ -x "$venv/bin/python" ]; then LLAMA_PY=$venv/bin/python; else LLAMA_PY=python3; fi
fi
if ! "$LLAMA_PY" -c 'import llama_cpp, numpy' 2>/dev/null; then
  echo "llamacpp-compare: $LLAMA_PY has no llama_cpp; run 'scripts/llamacpp-compare.sh setup' first" >&2
  exit 77
fi
py="$LLAMA_PY $root/scripts/llamacpp-compare.py"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# A fixed paragraph of plain English, 53 tokens for SmolLM2.
TEXT="The history of the printing press begins in the fifteenth century, when Johannes Gutenberg developed a system of movable metal type in Mainz. His invention made books cheaper and faster to produce, and within a few decades printing shops had spread across Europe. This change helped ideas travel"

logits() {
  local ids theirs
  ids=$("$MS" model tokenize --model "$MODEL" --text "$TEXT")
  theirs=$($py tokenize "$MODEL" "$TEXT" 2>"$tmp/llama.log")
  # shellcheck disable=SC2086  # MS_LOGITS_ARGS is a list of options
  "$MS" model logits --model "$MODEL" --tokens "$ids" --workers "$THREADS" ${MS_LOGITS_ARGS:-} \
    --out "$tmp/ms.bin" >/dev/null
  $py logits "$MODEL" "$ids" "$tmp/lc.bin" 2>>"$tmp/llama.log"
  if [ -n "${KEEP_LOGITS:-}" ]; then
    mkdir -p "$KEEP_LOGITS"
    cp "$tmp/ms.bin" "$tmp/lc.bin" "$KEEP_LOGITS/"
    echo "$ids" > "$KEEP_LOGITS/ids.txt"
  fi
  "$LLAMA_PY" - "$tmp/ms.bin" "$tmp/lc.bin" "$ids" "$theirs" "$MODEL" "${MS_LOGITS_ARGS:-}" <<'PY'
import json, sys
import numpy as np
ms, lc = np.fromfile(sys.argv[1], np.float32), np.fromfile(sys.argv[2], np.float32)
ids, theirs = sys.argv[3].split(","), sys.argv[4].split(",")
n = len(ids)
ms, lc = ms.reshape(n, -1), lc.reshape(n, -1)
d = np.abs(ms - lc)
top = ms.argmax(1) == lc.argmax(1)
r = {"model": sys.argv[5].rsplit("/", 1)[-1], "positions": n, "tokenizer_ids_identical": ids == theirs,
     "top1_agreement": int(top.sum()), "top1_fraction": float(top.mean()),
     "max_abs_logit_diff": float(d.max()), "mean_abs_logit_diff": float(d.mean()),
     "logit_std": float(lc.std()), "worst_position": int(d.max(1).argmax()),
     "megascope_args": sys.argv[6]}
print(f"logits, {n} teacher-forced positions of the same ids: tokenizer ids identical: {r['tokenizer_ids_identical']}; "
      f"top-1 agreement {r['top1_agreement']}/{n}; largest |difference| {r['max_abs_logit_diff']:.3f}, "
      f"mean {r['mean_abs_logit_diff']:.3f} (logits have std {r['logit_std']:.2f})")
print("LOGITS_JSON " + json.dumps(r))
PY
}

ms_tps() {  # batch -> megakernel tokens/s
  "$MS" bench decode --model "$MODEL" --batch "$1" --steps "$STEPS" --workers "$THREADS" --rounds 1 --json 2>/dev/null |
    "$LLAMA_PY" -c 'import json,sys; print(json.load(sys.stdin)["megakernel_tokens_per_s"])'
}

lc_tps() {  # batch -> llama.cpp tokens/s
  $py bench "$MODEL" "$THREADS" "$1" "$STEPS" 2>>"$tmp/llama.log" |
    "$LLAMA_PY" -c 'import json,sys; print(json.load(sys.stdin)["tokens_per_s"])'
}

best() { printf '%s\n' "$@" | sort -g | tail -1; }
worst() { printf '%s\n' "$@" | sort -g | head -1; }

speed() {
  local rows=() b m l ms_all lc_all
  echo "speed: $(basename "$MODEL"), $THREADS threads, $STEPS tokens per sequence, best of $REPS alternating runs"
  printf '| batch | megascope tokens/s | llama.cpp tokens/s | megascope / llama.cpp | megascope runs | llama.cpp runs |\n'
  printf '|---:|---:|---:|---:|---:|---:|\n'
  for b in $BATCHES; do
    ms_all=() lc_all=()
    for _ in $(seq "$REPS"); do
      ms_all+=("$(ms_tps "$b")")
      lc_all+=("$(lc_tps "$b")")
    done
    m=$(best "${ms_all[@]}")
    l=$(best "${lc_all[@]}")
    printf '| %d | %.1f | %.1f | %.2f | %.1f-%.1f | %.1f-%.1f |\n' "$b" "$m" "$l" "$("$LLAMA_PY" -c "print($m / $l)")" \
      "$(worst "${ms_all[@]}")" "$m" "$(worst "${lc_all[@]}")" "$l"
    rows+=("{\"batch\": $b, \"megascope_tokens_per_s\": $m, \"llamacpp_tokens_per_s\": $l, \"megascope_runs\": [$(IFS=,; echo "${ms_all[*]}")], \"llamacpp_runs\": [$(IFS=,; echo "${lc_all[*]}")]}")
  done
  echo "SPEED_JSON {\"threads\": $THREADS, \"steps\": $STEPS, \"reps\": $REPS, \"rows\": [$(IFS=,; echo "${rows[*]}")]}"
}

prompt() {  # one round of each, REPS times alternating; best of each
  local ms_all=() lc_all=() m l
  echo "prompt: $(basename "$MODEL"), $THREADS threads, $PROMPT prompt tokens, best of $REPS alternating runs"
  for _ in $(seq "$REPS"); do
    ms_all+=("$("$MS" bench prefill --model "$MODEL" --prompts "$PROMPT" --rounds 1 --workers "$THREADS" \
      --max-batched-tokens "$PREFILL_CHUNK" --json 2>/dev/null |
      "$LLAMA_PY" -c 'import json,sys; print(json.load(sys.stdin)["prompts"][0]["chunked_prompt_tokens_per_s"])')")
    lc_all+=("$($py prompt "$MODEL" "$THREADS" "$PROMPT" 1 2>>"$tmp/llama.log" |
      "$LLAMA_PY" -c 'import json,sys; print(json.load(sys.stdin)["tokens_per_s"])')")
  done
  m=$(best "${ms_all[@]}")
  l=$(best "${lc_all[@]}")
  printf '| prompt tokens | megascope tokens/s | llama.cpp tokens/s | megascope / llama.cpp |\n|---:|---:|---:|---:|\n'
  printf '| %d | %.1f | %.1f | %.3f |\n' "$PROMPT" "$m" "$l" "$("$LLAMA_PY" -c "print($m / $l)")"
  echo "PROMPT_JSON {\"threads\": $THREADS, \"tokens\": $PROMPT, \"chunk\": $PREFILL_CHUNK, \"megascope_runs\": [$(IFS=,; echo "${ms_all[*]}")], \"llamacpp_runs\": [$(IFS=,; echo "${lc_all[*]}")]}"
}

types() {
  local dir=$cache/smollm2-types t f
  mkdir -p "$dir"
  if [ ! -s "$dir/f32.gguf" ]; then
    echo "types: an f32 copy of $(basename "$MODEL") (gguf-py)" >&2
    python3 "$root/tests/gguf_pyref.py" f32 "$MODEL" "$dir/f32.gguf" >&2
  fi
  for t in ${TYPES:-Q8_0 Q4_0 Q4_1 Q5_0 Q5_1 IQ4_NL Q2_K Q3_K_M Q4_K_M Q5_K_M Q6_K}; do
    f=$dir/$t.gguf
    if [ ! -s "$f" ]; then
      echo "types: llama.cpp quantizes to $t" >&2
      $py quantize "$dir/f32.gguf" "$f" "$t" 2>>"$tmp/llama.log" >&2
    fi
    echo "== $t: $("$MS" model info "$f" --json | "$LLAMA_PY" -c '
import json, sys, collections
d = json.load(sys.stdin)
c = collections.Counter(x["type"] for x in d["tensors"] if len(x["shape"]) > 1)
print(", ".join("%d %s" % (n, k) for k, n in c.most_common()), "matrices")')"
    MODEL=$f speed
  done
}

case "$cmd" in
  logits) logits ;;
  speed) speed ;;
  types) types ;;
  prompt) prompt ;;
  all) logits; speed ;;
  *) sed -n '3,59p' "$0"; exit 2 ;;
esac
