#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
# Writes src/model/tokenizer_unicode.c: the code-point ranges of the Unicode
# general categories L (letters) and N (numbers) that the BPE pre-tokenizers'
# \p{L}, \p{N} and \p{P} match, from the unicodedata2 package when it is
# installed (it follows the Unicode releases: `pip install unicodedata2==16.0.0`
# for Unicode 16), else Python's own unicodedata (Python 3.11 has Unicode 14);
# the version is recorded in the file, and --require VERSION refuses any other.
# Run: python3 scripts/tokenizer-unicode-tables.py --require 16.0.0 > src/model/tokenizer_unicode.c
import sys

try:
    import unicodedata2 as unicodedata
except ImportError:
    import unicodedata

if len(sys.argv) == 3 and sys.argv[1] == "--require" and unicodedata.unidata_version != sys.argv[2]:
    sys.exit("tokenizer-unicode-tables: Unicode %s here, %s required (pip install unicodedata2==%s)"
             % (unicodedata.unidata_version, sys.argv[2], sys.argv[2]))


def ranges(prefix):
    out, start, prev = [], None, None
    for cp in range(0x110000):
        hit = unicodedata.category(chr(cp)).startswith(prefix)
        if hit and start is None:
            start = cp
        if not hit and start is not None:
            out.append((start, cp - 1))
            start = None
    if start is not None:
        out.append((start, 0x10FFFF))
    return out


def table(name, rs):
    lines = ["static const struct cp_range %s[%d] = {" % (name, len(rs))]
    row = []
    for a, b in rs:
        row.append("{0x%x, 0x%x}," % (a, b))
        if len(row) == 5:
            lines.append("    " + " ".join(row))
            row = []
    if row:
        lines.append("    " + " ".join(row))
    lines.append("};")
    return "\n".join(lines)


L, N, P = ranges("L"), ranges("N"), ranges("P")
sys.stdout.write("""/* SPDX-License-Identifier: MIT */
/* Unicode categories for the BPE pre-tokenizers: \\p{L} (letters: Lu Ll Lt Lm
 * Lo), \\p{N} (numbers: Nd Nl No), \\p{P} (punctuation: Pc Pd Ps Pe Pi Pf Po)
 * and \\s (the White_Space property), as sorted
 * code-point ranges searched by bisection. Generated from Unicode %s by
 * scripts/tokenizer-unicode-tables.py; do not edit by hand. */
#include "model/tokenizer_impl.h"

struct cp_range {
  uint32_t lo, hi;
};

%s

%s

%s

static int in_ranges(const struct cp_range *r, int n, uint32_t cp) {
  int lo = 0, hi = n - 1;
  while (lo <= hi) {
    int mid = (lo + hi) / 2;
    if (cp < r[mid].lo) hi = mid - 1;
    else if (cp > r[mid].hi) lo = mid + 1;
    else return 1;
  }
  return 0;
}

int ms_uni_is_letter(uint32_t cp) {
  if (cp < 0x80) return (cp | 0x20) >= 'a' && (cp | 0x20) <= 'z';
  return in_ranges(letters, (int)(sizeof letters / sizeof letters[0]), cp);
}

int ms_uni_is_number(uint32_t cp) {
  if (cp < 0x80) return cp >= '0' && cp <= '9';
  return in_ranges(numbers, (int)(sizeof numbers / sizeof numbers[0]), cp);
}

int ms_uni_is_punct(uint32_t cp) { return in_ranges(punct, (int)(sizeof punct / sizeof punct[0]), cp); }

int ms_uni_is_space(uint32_t cp) {
  return (cp >= 0x9 && cp <= 0xd) || cp == 0x20 || cp == 0x85 || cp == 0xa0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 || cp == 0x2029 || cp == 0x202f || cp == 0x205f ||
         cp == 0x3000;
}
""" % (unicodedata.unidata_version, table("letters", L), table("numbers", N), table("punct", P)))
