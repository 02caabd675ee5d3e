#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Mutation testing of the modules whose results users read (`make mutate`).

For each module below, universalmutator (PyPI; `make mutate` installs it into
.venv) writes every mutant its C rules make of the module's source, limited to
the functions that compute what a user reads; a seeded sample of them is built,
one at a time, in a private copy of the committed tree (`git archive HEAD`:
the working tree, which others may be editing, is never touched), and the
tests that reach the module run against each, fastest first, until one fails.
A mutant that does not build is not counted; one that a test fails (or that
runs past the timeout) is killed; one that every test passes survives and is
printed with its line. The kill rate is killed / (killed + survived), per
module. universalmutator generates the mutants; this driver does what it
leaves to the user: the sampling, the private build and the test selection.

  scripts/mutate.py [--modules a,b] [--per-module N] [--seed S] [--build DIR] [--report FILE]

Exit 0 when every sampled mutant built or not was accounted for (survivors are a
finding, not an error), 1 when a module's tests fail before any mutation."""
import argparse
import datetime
import difflib
import filecmp
import os
import random
import re
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# name: (source, functions mutated (None: the whole file), build targets, tests fastest first)
MODULES = {
    "query_output": ("src/query/output.c",
                     ["merge", "total", "sort_key", "collect_one", "sketch_bucket", "quantile_of", "hist_bucket",
                      "text_buckets", "text_entry", "json_entry"],
                     ["test_query_answers", "test_query", "megascope"],
                     ["test_query_answers", "test_query", "cli_query"]),
    "bench_reports": ("tools/benchmarks/cmd_bench.c", ["decode_rounds", "bench_decode"],
                      ["megascope"], ["cli_bench", "cli_usage"]),
    "sampling": ("src/model/sample.c", None, ["test_sample", "megascope"], ["test_sample", "cli_run_sampling"]),
    "verifier_bounds": ("src/bpf/verifier_scalar.c", None, ["test_bpf_verifier", "test_bpf_verify_bound"],
                        ["test_bpf_verifier", "test_bpf_verify_bound"]),
    "tokenizer": ("src/model/tokenizer_bpe.c", None, ["test_tokenizer", "megascope"],
                  ["test_tokenizer", "cli_tokenizer_vectors"]),
    "prometheus": ("src/export/prometheus.c", None, ["test_export", "megascope"], ["test_export", "cli_prometheus"]),
    "otlp": ("src/export/otlp.c", None, ["test_export", "megascope"], ["test_export", "cli_otlp"]),
    "bench_score": ("src/bench/score.c", None, ["test_bench_score"], ["test_bench_score"]),
}


def run(cmd, cwd=None, timeout=None, quiet=True):
    try:
        p = subprocess.run(cmd, cwd=cwd, timeout=timeout, stdout=subprocess.PIPE if quiet else None,
                           stderr=subprocess.STDOUT if quiet else None, text=True)
        return p.returncode, p.stdout or ""
    except subprocess.TimeoutExpired as e:
        return None, (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")


def function_lines(path, names):
    """The 1-based line numbers of the named functions' bodies (a definition
    starts at column 0 and ends at the first '}' at column 0 after it)."""
    lines = open(path).read().split("\n")
    keep = set()
    for name in names:
        pat = re.compile(r"^[A-Za-z].*\b%s\(" % re.escape(name))
        starts = [i for i, l in enumerate(lines) if pat.match(l) and not l.rstrip().endswith(";")]
        if not starts:
            sys.exit(f"mutate: no function {name} in {path}")
        i = starts[0]
        while i < len(lines) and lines[i] != "}":
            keep.add(i + 1)
            i += 1
    return keep


def changed_line(orig, mutant):
    """(line number, original line, mutated line) of a one-line mutant."""
    a, b = orig.split("\n"), mutant.split("\n")
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if op != "equal":
            return i1 + 1, "\n".join(a[i1:i2]).strip(), "\n".join(b[j1:j2]).strip()
    return 0, "", ""


def sync(src, dst):
    """dst becomes a copy of src, copying only the files whose bytes differ."""
    for d, _, files in os.walk(src):
        for f in files:
            a = os.path.join(d, f)
            b = os.path.join(dst, os.path.relpath(a, src))
            if not os.path.exists(b) or not filecmp.cmp(a, b, shallow=False):
                os.makedirs(os.path.dirname(b), exist_ok=True)
                shutil.copyfile(a, b)  # a new time: an older commit time would hide the change from ninja
    for d, _, files in os.walk(dst):
        for f in files:
            b = os.path.join(d, f)
            if not os.path.islink(b) and not os.path.exists(os.path.join(src, os.path.relpath(b, dst))):
                os.remove(b)


def setup_tree(build):
    """The committed tree in build/tree/main, ../shared beside it, configured
    without CUDA (the modules are CPU code) in build/b and built whole, with
    -Werror as CI builds it (a mutant the compiler warns about does not build)."""
    tree = os.path.join(build, "tree")
    main, new = os.path.join(tree, "main"), os.path.join(tree, "main.new")
    shutil.rmtree(new, ignore_errors=True)
    os.makedirs(new)
    subprocess.run(f"git -C '{ROOT}' archive HEAD | tar -x -C '{new}'", shell=True, check=True)
    sync(new, main)  # unchanged files keep their times: a second run rebuilds only what changed
    shutil.rmtree(new)
    links = {os.path.join(tree, "shared"): os.path.join(os.path.dirname(ROOT), "shared"),
             os.path.join(main, ".venv"): os.path.join(ROOT, ".venv")}
    for link, to in links.items():
        if os.path.isdir(to) and not os.path.lexists(link):
            os.symlink(to, link)
    b = os.path.join(build, "b")
    if not os.path.exists(os.path.join(b, "build.ninja")):
        subprocess.run(["cmake", "-S", main, "-B", b, "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release", "-DMS_CUDA=OFF"], check=True, stdout=subprocess.DEVNULL)
    rc, out = run(["ninja", "-C", b], timeout=3600)
    if rc != 0:
        sys.exit("mutate: the unmutated tree does not build:\n" + out[-3000:])
    return main, b


def ctest(b, name, timeout):
    rc, out = run(["ctest", "--test-dir", b, "-R", f"^{name}$", "--timeout", str(int(timeout))], timeout=timeout + 60)
    if rc is None:
        return "timeout", out
    if rc != 0:
        return "failed", out
    if re.search(r"\b1 tests? (did not run|skipped)|\*\*\*Skipped|Not Run", out):
        return "skipped", out
    if "100% tests passed" not in out:
        return "failed", out
    return "passed", out


def module_run(name, spec, main, b, per, seed, log, only=None):
    src, funcs, targets, tests = spec
    path = os.path.join(main, src)
    orig = open(path).read()
    res = {"name": name, "source": src, "functions": funcs, "tests": tests, "killed": 0, "survived": [],
           "invalid": 0, "generated": 0, "sampled": 0, "killed_by": {}}
    # the tests pass on the unmutated tree, and how long each takes sets its timeout
    base = {}
    for t in tests:
        t0 = time.time()
        st, out = ctest(b, t, 1200)
        base[t] = time.time() - t0
        if st != "passed":
            log(f"{name}: {t} does not pass unmutated ({st}):\n{out[-2000:]}")
            res["error"] = f"{t} {st} unmutated"
            return res
    mdir = os.path.join(os.path.dirname(b), "mutants", name)
    shutil.rmtree(mdir, ignore_errors=True)
    os.makedirs(mdir)
    cmd = [os.path.join(ROOT, ".venv", "bin", "mutate"), path, "c", "--noCheck", "--mutantDir", mdir]
    if funcs:
        lines_file = os.path.join(mdir, "..", name + ".lines")
        with open(lines_file, "w") as f:
            f.write("\n".join(str(n) for n in sorted(function_lines(path, funcs))) + "\n")
        cmd += ["--lines", lines_file]
    rc, out = run(cmd, timeout=1800)
    mutants = sorted(os.listdir(mdir), key=lambda s: int(re.search(r"mutant\.(\d+)\.", s).group(1)))
    res["generated"] = len(mutants)
    if only:  # named mutants (a rerun of survivors): the same files, regenerated the same way
        pick = [m for m in mutants if m in only]
    else:
        pick = random.Random(f"{seed}:{name}").sample(mutants, min(per, len(mutants)))  # the same alone or with others
    res["sampled"] = len(pick)
    try:
        for k, m in enumerate(pick):
            text = open(os.path.join(mdir, m)).read()
            line, was, now = changed_line(orig, text)
            with open(path, "w") as f:
                f.write(text)
            rc, out = run(["ninja", "-C", b] + targets, timeout=900)
            if rc != 0:
                res["invalid"] += 1
                log(f"{name} [{k + 1}/{len(pick)}] {src}:{line}: does not build")
                continue
            verdict = None
            for t in tests:
                st, _ = ctest(b, t, 3 * base[t] + 30)
                if st in ("failed", "timeout"):
                    verdict = t + (" (timeout)" if st == "timeout" else "")
                    break
            if verdict:
                res["killed"] += 1
                res["killed_by"][verdict] = res["killed_by"].get(verdict, 0) + 1
                log(f"{name} [{k + 1}/{len(pick)}] {src}:{line}: killed by {verdict}")
            else:
                res["survived"].append({"mutant": m, "line": line, "was": was, "now": now})
                log(f"{name} [{k + 1}/{len(pick)}] {src}:{line}: SURVIVED: {was}  ->  {now}")
    finally:
        with open(path, "w") as f:
            f.write(orig)
        run(["ninja", "-C", b] + targets, timeout=900)
    return res


def report(results, args, started, seconds):
    out = [f"# Mutation testing, {started}", "",
           f"`scripts/mutate.py --per-module {args.per_module} --seed {args.seed}` on the committed tree "
           f"({subprocess.run(['git', '-C', ROOT, 'rev-parse', '--short', 'HEAD'], stdout=subprocess.PIPE, text=True).stdout.strip()}), "
           f"{seconds / 60:.0f} minutes. Mutants by universalmutator's C rules, limited to the functions named; "
           "a seeded sample of each module's mutants is built and tested (not all: each costs a build and the tests).",
           "", "| module | source (functions) | tests | mutants | sampled | did not build | killed | survived | kill rate |",
           "|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        n = r["killed"] + len(r["survived"])
        rate = f"{100 * r['killed'] / n:.0f}%" if n else "-"
        fn = f" ({', '.join(r['functions'])})" if r["functions"] else ""
        if r.get("error"):
            rate = "not run: " + r["error"]
        out.append(f"| {r['name']} | `{r['source']}`{fn} | {', '.join(r['tests'])} | {r['generated']} | "
                   f"{r['sampled']} | {r['invalid']} | {r['killed']} | {len(r['survived'])} | {rate} |")
    out += ["", "## Surviving mutants", ""]
    for r in results:
        for s in r["survived"]:
            was = f"`{s['was']}`" if s["was"] else "(inserted)"
            out.append(f"* {r['name']} `{s['mutant']}`: `{r['source']}:{s['line']}`: {was} -> `{s['now']}`")
    if not any(r["survived"] for r in results):
        out.append("None.")
    return "\n".join(out) + "\n"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--modules", default=",".join(MODULES))
    ap.add_argument("--per-module", type=int, default=20)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--build", default=os.path.join(ROOT, "build-mutate"))
    ap.add_argument("--report")
    ap.add_argument("--mutant", action="append", default=[],
                    help="MODULE:FILE: test this mutant (as a report names it) instead of a sample; repeatable")
    args = ap.parse_args()
    if not os.access(os.path.join(ROOT, ".venv", "bin", "mutate"), os.X_OK):
        sys.exit("mutate: no universalmutator in .venv (make mutate installs it)")
    names = [n for n in args.modules.split(",") if n]
    for n in names:
        if n not in MODULES:
            sys.exit(f"mutate: no module {n} (modules: {', '.join(MODULES)})")
    started = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    t0 = time.time()
    build = os.path.abspath(args.build)
    main_tree, b = setup_tree(build)

    def log(msg):
        print(msg, flush=True)

    only = {}
    for spec in args.mutant:
        mod, _, f = spec.partition(":")
        if mod not in MODULES or not f:
            sys.exit(f"mutate: --mutant {spec}: MODULE:FILE")
        only.setdefault(mod, set()).add(f)
    if only:
        names = [n for n in names if n in only]
    results = [module_run(n, MODULES[n], main_tree, b, args.per_module, args.seed, log, only.get(n)) for n in names]
    text = report(results, args, started, time.time() - t0)
    print(text)
    if args.report:
        with open(args.report, "w") as f:
            f.write(text)
    return 1 if any(r.get("error") for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
