#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# docs/alerts.yml: the example alert rules are valid (promtool check rules) and
# fire, or stay quiet, on synthetic series as they should (promtool test rules
# with tests/data/alerts_test.yml).
set -euo pipefail
SRC=${MS_SRC:-$(cd "$(dirname "$0")/.." && pwd)}
command -v promtool >/dev/null || { echo "skipped: no promtool (Debian package prometheus)"; exit 77; }
promtool check rules "$SRC/docs/alerts.yml"
(cd "$SRC/tests/data" && promtool test rules alerts_test.yml)
echo "2 passed, 0 failed"
