#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The real models against llama.cpp (through llama-cpp-python) on the same file
# and the same token ids (scripts/llamacpp-compare.sh logits): identical
# tokenizer ids, and teacher-forced logits that agree. On the quantized files
# llama.cpp quantizes its activations to 8 bits for the dot products (megascope
# keeps them f32 by default), which bounds the agreement; on an f32 copy of the
# same weights (made with gguf-py) that effect is gone and the logits must agree
# closely. SmolLM2 (q4_1) and, when cached, Gemma-3-270M (Q4_K_M), whose GEMV
# inputs have outliers 10-20x their RMS, so llama.cpp's 8-bit blocks (q8_0 for
# q5_0/q8_0 weights, 256-wide q8_K for q4_K/q6_K) move its logits much more:
# its thresholds are set from the measured figures (docs/performance.md) with a margin.
# Skipped (77) without either cached model or a python with llama_cpp
# (scripts/llamacpp-compare.sh setup).
set -euo pipefail
MS=$1
SRC=${MS_SRC:-$(cd "$(dirname "$0")/.." && pwd)}
S=${MS_SMOLLM2:-$HOME/.cache/megascope/SmolLM2-135M-Instruct.Q4_1.gguf}
G=${MS_GEMMA3:-$HOME/.cache/megascope/gemma-3-270m-q4_k_m.gguf}
[ -r "$S" ] || [ -r "$G" ] || { echo "neither SmolLM2 ($S) nor Gemma-3-270M ($G) cached: skipped"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# compare LABEL FILE MIN_TOP1_FRACTION MAX_ABS MAX_MEAN [megascope logits options]
compare() {
  local label=$1 f=$2 top=$3 mx=$4 mean=$5 rc
  shift 5
  set +e
  MS=$MS MODEL=$f MS_LOGITS_ARGS="$*" bash "$SRC/scripts/llamacpp-compare.sh" logits > "$tmp/out.txt"
  rc=$?
  set -e
  [ $rc = 77 ] && { echo "no python with llama_cpp: skipped (scripts/llamacpp-compare.sh setup)"; exit 77; }
  [ $rc = 0 ] || { cat "$tmp/out.txt"; exit 1; }
  sed "s/^logits,/$label: logits,/" "$tmp/out.txt" | grep -v '^LOGITS_JSON'
  python3 - "$tmp/out.txt" "$top" "$mx" "$mean" <<'PY'
import json, sys
r = json.loads(next(l for l in open(sys.argv[1]) if l.startswith("LOGITS_JSON "))[12:])
assert r["tokenizer_ids_identical"], r
assert r["top1_fraction"] >= float(sys.argv[2]), r
assert r["max_abs_logit_diff"] <= float(sys.argv[3]), r
assert r["mean_abs_logit_diff"] <= float(sys.argv[4]), r
PY
}
skipped=""
have_gguf() {
  python3 -c 'import gguf, numpy' 2>/dev/null && return 0
  echo "SKIP: python3 has no gguf/numpy: the f32 copy's comparison not run"
  skipped=1
  return 1
}

if [ -r "$S" ]; then  # measured 53/53, 0.93, mean 0.15 (f32 copy: 53/53, 0.018)
  compare "SmolLM2 q4_1, megascope --f32-activations" "$S" 0.9 2.5 0.4 --f32-activations
  # measured 52/53, 1.20, 0.178; 49/53, 1.12, 0.165 since attention is cut in parts (2026-12-07): the
  # flips sit on near-ties (the exact reference's top two 0.02-0.06 apart), as against that reference
  compare "SmolLM2 q4_1, megascope's 8-bit activations" "$S" 0.9 2.5 0.4
  if have_gguf; then
    python3 "$SRC/tests/gguf_pyref.py" f32 "$S" "$tmp/f32.gguf"
    compare "SmolLM2 f32 copy" "$tmp/f32.gguf" 1.0 0.1 0.01 --f32-activations
    rm -f "$tmp/f32.gguf"
  fi
else
  echo "SKIP: SmolLM2 not cached ($S): its comparison not run (scripts/get-smollm2.sh)"
  skipped=1
fi

if [ -r "$G" ]; then
  # measured 48/52, 14.5, mean 0.83; with --q8-activations 49/52, 14.2, 0.76 (Intel Xeon, AVX-512 VNNI
  # and AMX); on an AMD EPYC (Zen 5) the same llama.cpp gives 46/52, 23.0, 0.93 and 46/52, 22.5, 0.77
  # while megascope's f32 path stays within 1e-4 of its double-precision reference: the largest
  # difference is llama.cpp's own quantized arithmetic (docs/performance.md), which moves with the CPU it runs on
  compare "Gemma-3-270M Q4_K_M, megascope --f32-activations" "$G" 0.85 30 1.2 --f32-activations
  # 8-bit activations add megascope's own rounding to llama.cpp's: 44/52, 20.3, 0.72 on that Xeon since
  # attention is cut in parts (46/52 before, 2026-12-07); against megascope's double-precision reference
  # the same path agrees at 46/52 (45 before) and llama.cpp at 46/52: two independent 8-bit roundings of
  # a model whose near-ties are 0.003-0.3 apart, so 0.8 here, and the f32 copy below holds the graphs
  compare "Gemma-3-270M Q4_K_M, megascope's 8-bit activations" "$G" 0.8 30 1.2
  if have_gguf; then  # measured 52/52, 0.246, mean 0.009: the graphs agree
    python3 "$SRC/tests/gguf_pyref.py" f32 "$G" "$tmp/f32.gguf"
    compare "Gemma-3-270M f32 copy" "$tmp/f32.gguf" 0.98 0.6 0.03
    rm -f "$tmp/f32.gguf"
  fi
else
  echo "SKIP: Gemma-3-270M not cached ($G): its comparison not run (scripts/get-gemma3.sh)"
  skipped=1
fi
# a part not run makes the whole test a skip (77), never a pass
[ -z "$skipped" ] || exit 77
