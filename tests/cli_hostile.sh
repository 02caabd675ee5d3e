#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# megascope serve against hostile and greedy clients, on loopback only
# (tests/hostile.py): idle and slowloris floods of 2,000 connections beside a
# normal client that must still get /health, /metrics and a completion;
# half-closed clients that get their whole answer; request smuggling answered
# 400 with the connection closed; one request over the bounds (400), a greedy
# client over its share (429 with Retry-After) while a normal one is admitted
# ahead of its queue, a full queue (429), a client's connections all busy
# (429); attach/detach under a descriptor limit of 192 and attaches beyond the
# budget refused with its message; accept out of descriptors answered 503
# without a thread spinning; descriptors and threads back to the baseline.
# `make soak-hostile` runs all of it at once for an hour.
set -euo pipefail
MS=$1
SRC=${MS_SRC:-$(cd "$(dirname "$0")/.." && pwd)}
MON=${MS_MONITORS:-}
[ -n "$MON" ] && [ -f "$MON/class_time.bpf.o" ] || { echo "skipped: no shipped monitors (MS_MONITORS)"; exit 77; }
command -v python3 >/dev/null || { echo "skipped: no python3"; exit 77; }
python3 "$SRC/tests/hostile.py" --ms "$MS" --monitors "$MON" --max-seconds 600
