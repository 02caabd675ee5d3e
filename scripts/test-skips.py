#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""The tests a ctest run skipped (exit 77), each with the reason it printed,
read from ctest's JUnit report (ctest --output-junit FILE).

  scripts/test-skips.py JUNIT.xml [--allowed tests/ci-may-skip.txt] [--strict]

Prints "skipped tests: none" or the list. With --strict, exits 1 when a test
skipped that the allowed list does not name (CI: every input the suite needs is
installed by `make test`'s set-up, so any other skip is a defect). A missing or
unreadable report is an error (exit 2), never an empty list."""
import argparse
import re
import sys
import xml.etree.ElementTree as ET


def allowed_names(path):
    names = {}
    for line in open(path):
        line = line.split("#", 1)
        name = line[0].strip()
        if name:
            names[name] = line[1].strip() if len(line) > 1 else ""
    return names


def reason(out):
    lines = [l.strip() for l in (out or "").splitlines()]
    hits = [l for l in lines if re.match(r"(?i)skip", l) or re.search(r"(?i)\bskipped\b", l)]
    return "; ".join(hits[:3]) if hits else (lines[-1] if lines else "(nothing printed)")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("junit")
    ap.add_argument("--allowed")
    ap.add_argument("--strict", action="store_true")
    a = ap.parse_args()
    try:
        root = ET.parse(a.junit).getroot()
    except (OSError, ET.ParseError) as e:
        print(f"test-skips: cannot read {a.junit}: {e}", file=sys.stderr)
        return 2
    skipped = [(tc.get("name"), reason(tc.findtext("system-out"))) for tc in root.iter("testcase")
               if tc.find("skipped") is not None]
    allowed = allowed_names(a.allowed) if a.allowed else {}
    if not skipped:
        print("skipped tests: none")
        return 0
    print(f"skipped tests ({len(skipped)}):")
    bad = []
    for name, why in skipped:
        mark = ""
        if a.allowed:
            # without --strict (make test on a machine that lacks an input, e.g. ../shared beside a
            # clone in /tmp) the skip is reported, and CI, which runs --strict, would fail on it
            missing = ("  [NOT ALLOWED to skip here]" if a.strict
                       else "  [CI may not skip this: an input is missing here]")
            mark = "  [allowed: %s]" % allowed[name] if name in allowed else missing
            if name not in allowed:
                bad.append(name)
        print(f"  {name}: {why}{mark}")
    if a.strict and bad:
        print(f"test-skips: {len(bad)} test(s) skipped that must run here: {', '.join(bad)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
