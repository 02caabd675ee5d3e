#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""What `megascope explain` finds on real models: for each model, a live
`megascope serve --pin-workers` under a steady load of streamed chat
completions, with one known fault at a time (injected with --fault at 1.5x, 2x
and 3x; a worker's queue saturated with 10, 20 and 30% of the others' AOT
tasks; or real interference from `megascope interfere`: a noisy neighbour on
one worker's CPU, a worker preempted at random, a long-context request among
short ones) and healthy runs, then `megascope explain --json`; each answer is
scored against the fault: found (the culprit is named), missed, and any other
part named (a false culprit).

Targets (which class, layer, worker, slot) are drawn from --seed, so a
training split (--seed 1) and a held-out split (another seed, never used to
set anything) name different parts. With --calibrate the training split's
answers are binned by strength (z) as src/explain/confidence.c bins them and
the table to paste there is printed; the reliability of stated confidences is
printed for any split.

  scripts/explain-eval.py --ms build/megascope --models smollm2,gemma3 --seed 1 --out train.json
  scripts/explain-eval.py --ms build/megascope --seed 2 --out heldout.json

Needs the model files in ~/.cache/megascope (scripts/get-smollm2.sh,
scripts/get-gemma3.sh). Standard library only."""
import argparse, json, os, random, signal, socket, subprocess, sys, tempfile, threading, time, urllib.request

CACHE = os.environ.get("MS_CACHE", os.path.expanduser("~/.cache/megascope"))
MODELS = {"smollm2": "SmolLM2-135M-Instruct.Q4_1.gguf", "gemma3": "gemma-3-270m-q4_k_m.gguf"}
Z_EDGES = [1, 1.5, 2, 4, 8]  # in units of MS_EXPLAIN_Z, as confidence.c
Z = 6.0
MIN_STEP_SHARE = 0.001  # MS_EXPLAIN_MIN_STEP_SHARE


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Load:
    """Clients streaming chat completions, as many at once as `conc`."""

    def __init__(self, url, conc, max_tokens=48):
        self.url, self.stop, self.errors, self.done = url, threading.Event(), 0, 0
        self.threads = [threading.Thread(target=self.client, args=(i, max_tokens), daemon=True) for i in range(conc)]
        for t in self.threads:
            t.start()

    def client(self, i, max_tokens):
        n = 0
        while not self.stop.is_set():
            words = " ".join(["about the weather and the sea"] * (1 + (i * 7 + n) % 9))
            body = {"messages": [{"role": "user", "content": f"Tell me a short story {words}, number {i}-{n}."}],
                    "max_tokens": max_tokens, "temperature": 0, "stream": True}
            req = urllib.request.Request(self.url + "/v1/chat/completions", json.dumps(body).encode(),
                                         {"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=300) as r:
                    for _ in r:
                        if self.stop.is_set():
                            break
                self.done += 1
            except Exception:
                self.errors += 1
                time.sleep(0.2)
            n += 1

    def close(self):
        self.stop.set()
        for t in self.threads:
            t.join(timeout=30)


def serve(ms, model, workers, tmp, extra):
    port, sock = free_port(), os.path.join(tmp, "engine.sock")
    cmd = [ms, "serve", "--model", model, "--workers", str(workers), "--batch", "8", "--pin-workers",
           "--max-ctx", "4096", "--http", f"127.0.0.1:{port}", "--socket", sock] + extra
    out = open(os.path.join(tmp, "serve.out"), "w")
    p = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    for _ in range(600):
        time.sleep(0.1)
        if p.poll() is not None:
            raise RuntimeError("serve exited: " + open(os.path.join(tmp, "serve.out")).read()[-2000:])
        if "ready" in open(os.path.join(tmp, "serve.out")).read() and os.path.exists(sock):
            return p, f"http://127.0.0.1:{port}", sock
    p.kill()
    raise RuntimeError("serve did not become ready")


def classes_of(ms, model, tmp):
    """The schema's judged classes (with a layer) and layer count, from a short-lived compile of the
    CPU engine's plan (its classes: the pre-norms fused into their consumers)."""
    path = os.path.join(tmp, "schema.json")
    subprocess.run([ms, "compile", "--backend", "cpu", "--model", model, "--schema-out", path], capture_output=True,
                   check=True)
    s = json.load(open(path))
    cls = [c["name"] for c in s["task_classes"] if c["layer"] >= 0 and c["op"] not in ("comm",)]
    layers = 1 + max(c["layer"] for c in s["task_classes"])
    return cls, layers


def scenarios(rng, cls, layers, workers):
    """(name, kind of fault, serve args, interference, expected culprits (kind, name-or-id) or None)."""
    out = [("healthy", "healthy", [], None, None) for _ in range(3)]
    for mag in (1.5, 2, 3):
        c = rng.choice(cls)
        out.append((f"slow_class {c} {mag}x", f"slow_class {mag}x", ["--fault", f"slow_class:{c}:{mag}"], None,
                    [("class", c)]))
        lay = rng.randrange(layers)
        out.append((f"slow_layer {lay} {mag}x", f"slow_layer {mag}x", ["--fault", f"slow_layer:{lay}:{mag}"], None,
                    [("layer", f"layer {lay}")]))
        w = rng.randrange(workers)
        out.append((f"slow_worker {w} {mag}x", f"slow_worker {mag}x", ["--fault", f"slow_worker:{w}:{mag}"], None,
                    [("worker", w)]))
        slot = rng.randrange(8)
        out.append((f"slow_request slot {slot} {mag}x", f"slow_request {mag}x",
                    ["--fault", f"slow_request:{slot}:{mag}"], None, [("slot", slot)]))
    w = rng.randrange(workers)
    out.append((f"noisy neighbour on worker {w}", "noisy neighbour", [], ["--kind", "spin", "--worker", str(w)],
                [("worker", w)]))
    w = rng.randrange(workers)
    out.append((f"preempted at random, worker {w}", "random preemption", [],
                ["--kind", "preempt", "--worker", str(w), "--gap", "10ms", "--burst", "4ms"], [("worker", w)]))
    out.append(("long-context request", "long context", [], "long_context", [("request", "long context")]))
    # a saturated queue: worker w's queue also holds this share of the other
    # workers' AOT tasks (none slower); drawn last so the draws above stay
    # those of the seeds run before it was added
    for share in (0.1, 0.2, 0.3):
        w = rng.randrange(workers)
        out.append((f"queue_saturation {w} {share}", f"queue_saturation {share}",
                    ["--fault", f"queue_saturation:{w}:{share}"], None, [("worker", w)]))
    return out


def matches(c, want, workers):
    kind, what = want
    if kind == "class":
        return c["kind"] == "class" and c["name"] == what
    if kind == "layer":
        return c["kind"] == "layer" and c["name"] == what
    if kind == "worker":
        return c["kind"] in ("worker", "cpu") and c["id"] == what
    if kind == "slot":  # one request of the slot, or the slot
        return (c["kind"] == "slot" and c["id"] == what) or (c["kind"] == "request" and c["name"].startswith(f"request slot {what} "))
    if kind == "request":
        return c["kind"] == "request" and c["cause"] == what
    return False


def long_request(url, words, stop, decoding):
    """A long prompt; `decoding` is set once its first token has come (its prompt is in)."""
    body = {"messages": [{"role": "user", "content": "Summarise this: " + " ".join(["the quick brown fox"] * (words // 4))}],
            "max_tokens": 400, "temperature": 0, "stream": True}
    req = urllib.request.Request(url + "/v1/chat/completions", json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=600) as r:
            for line in r:
                if line.startswith(b"data: {") and not decoding.is_set():
                    delta = json.loads(line[6:])["choices"][0].get("delta", {})
                    if delta.get("content"):  # a token (the first chunk carries the role alone)
                        decoding.set()
                if stop.is_set():
                    break
    except Exception:
        pass


def run_one(a, ms, model, name, kind, extra, interf, want, tmp, base=None, save=None):
    p, url, sock = serve(ms, model, a.workers, tmp, extra)
    load, side, stop, t_inter = Load(url, a.clients), None, threading.Event(), None
    try:
        time.sleep(a.warmup)
        if interf == "long_context":
            decoding = threading.Event()
            t_inter = threading.Thread(target=long_request, args=(url, 2400, stop, decoding), daemon=True)
            t_inter.start()
            # the window while it decodes: its prompt in (a 3,000-token prefill takes
            # seconds beside the load), then a second of its decode
            if not decoding.wait(timeout=120):
                raise RuntimeError("the long request's first token did not come in 120 s")
            time.sleep(1)
        elif interf:
            side = subprocess.Popen([ms, "interfere"] + interf + ["--for", "%ds" % (a.window + 20)],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(1)
        t0 = time.time()
        out = subprocess.run([ms, "explain", "--socket", sock, "--slo", "tpot=50ms", "--window", f"{a.window}s",
                              "--evidence", "100", "--json"] + [x for b in (base or []) for x in ("--baseline", b)],
                             capture_output=True, text=True, timeout=4 * a.window + 120)
        took = time.time() - t0
        if out.returncode != 0:
            raise RuntimeError("explain exited %d: %s" % (out.returncode, out.stderr[-1000:]))
        rep = json.loads(out.stdout)
        if save:
            with open(save, "w") as f:
                f.write(out.stdout)
        if a.keep:
            os.makedirs(a.keep, exist_ok=True)
            # one file a run: runs of one name (the healthy ones) are numbered, none overwritten
            stem = os.path.join(a.keep, "%s-%s" % (os.path.basename(model).split(".")[0], name.replace(" ", "_")))
            path, n = stem + ".json", 1
            while os.path.exists(path):
                n += 1
                path = "%s-%d.json" % (stem, n)
            with open(path, "w") as f:
                f.write(out.stdout)
    finally:
        stop.set()
        if side:
            side.send_signal(signal.SIGTERM)
            side.wait(timeout=30)
        load.close()
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            p.kill()
    culprits = rep["culprits"]
    found = bool(want) and any(any(matches(c, w, a.workers) for w in want) for c in culprits)
    # a class or layer fault that cost the steps less than explain's least share
    # (MS_EXPLAIN_MIN_STEP_SHARE, a thousandth): no measurable slowdown, scored apart
    step_ns = rep["window_s"] * 1e9 / rep["steps"] if rep["steps"] else 0
    immaterial = False
    if want and not found and step_ns:
        for part, target in want:
            table = {"class": "classes", "layer": "layers"}.get(part)
            for row in rep.get(table, []) if table else []:
                if row.get("class", row.get("name")) == target or (part == "layer" and "layer %s" % row.get("layer") == target):
                    immaterial |= (row.get("excess_ns_per_step") or 0) < MIN_STEP_SHARE * step_ns
    extra_named = [c for c in culprits if not (want and any(matches(c, w, a.workers) for w in want))]
    return {"model": os.path.basename(model), "scenario": name, "kind": kind, "want": want, "found": found,
            "immaterial": immaterial,
            "false": [f'{c["kind"]}:{c["name"]}' for c in extra_named],
            "culprits": [{k: c[k] for k in ("kind", "id", "name", "cause", "ratio", "z", "confidence")} for c in culprits],
            "none_confidence": rep["none_confidence"], "class_noise": rep["class_noise"],
            "runqueue_share": rep["runqueue_share"], "steps": rep["steps"], "explain_s": round(took, 1),
            "summary_bytes": rep["summary_bytes"], "evidence_bytes": rep["evidence_bytes"],
            "none_z": (0.4054651 / rep["class_noise"]) if rep["class_noise"] else None}


def table(results):
    rows = {}
    for r in results:
        k = (r["model"], r["kind"])
        x = rows.setdefault(k, [0, 0, 0, 0, 0])
        x[0] += 1
        x[1] += r["found"]
        x[2] += bool(r["want"]) and not r["found"] and not r.get("immaterial")
        x[3] += bool(r["false"])
        x[4] += bool(r.get("immaterial"))
    print("%-34s %-22s %5s %6s %7s %16s %11s" % ("model", "fault", "runs", "found", "missed", "false culprit",
                                                "immaterial"))
    for (m, k), (n, f, miss, fa, im) in sorted(rows.items()):
        print("%-34s %-22s %5d %6d %7d %16d %11d" % (m, k, n, f, miss, fa, im))


def answers(results):
    """Every answer as (kind of answer, strength, right): each culprit named, and each "none"."""
    for r in results:
        if not r["culprits"]:
            yield "none", r["none_z"] or 0, not r["want"]
        for c in r["culprits"]:
            right = bool(r["want"]) and any(matches(c, w, 0) for w in r["want"])
            yield "culprit", c["z"], right


def reliability(results):
    print("\nreliability: stated confidence against the share right")
    print("%-8s %10s %5s %6s %8s" % ("answer", "stated", "n", "right", "share"))
    bins = {}
    for r in results:
        if not r["culprits"]:
            key = ("none", round(r["none_confidence"], 1))
            x = bins.setdefault(key, [0, 0])
            x[0] += 1
            x[1] += not r["want"]
        for c in r["culprits"]:
            key = ("culprit", round(c["confidence"], 1))
            x = bins.setdefault(key, [0, 0])
            x[0] += 1
            x[1] += bool(r["want"]) and any(matches(c, w, 0) for w in r["want"])
    for (k, s), (n, right) in sorted(bins.items()):
        print("%-8s %10.1f %5d %6d %8.2f" % (k, s, n, right, right / n))


def calibrate(results):
    table_ = {"culprit": [[0, 0] for _ in Z_EDGES], "none": [[0, 0] for _ in Z_EDGES]}
    for kind, z, right in answers(results):
        b = -1
        for i, e in enumerate(Z_EDGES):
            if z >= e * Z:
                b = i
        if b >= 0:
            table_[kind][b][0] += 1
            table_[kind][b][1] += right
    for kind in ("culprit", "none"):
        print("static const struct bin_rate %s_rate[N_BINS] = {%s};" %
              (kind, ", ".join("{%d, %d}" % tuple(x) for x in table_[kind])))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ms", default="build/megascope")
    ap.add_argument("--models", default="smollm2,gemma3")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--window", type=float, default=4)
    ap.add_argument("--warmup", type=float, default=5)
    ap.add_argument("--only", default="", help="run the scenarios whose name contains this")
    ap.add_argument("--out", default="")
    ap.add_argument("--keep", default="", help="write each run's whole explain report into this folder")
    ap.add_argument("--baseline", type=int, nargs="?", const=1, default=0, metavar="N",
                    help="first N (1 when not given) healthy runs of each model (not scored) whose reports "
                         "every run's explain then takes as --baseline")
    ap.add_argument("--calibrate", action="store_true", help="print confidence.c's table from these answers")
    ap.add_argument("--report", default="", help="score an earlier --out file instead of running")
    a = ap.parse_args()
    if a.report:
        results = json.load(open(a.report))["runs"]
    else:
        results = []
        for m in a.models.split(","):
            model = os.path.join(CACHE, MODELS[m])
            if not os.path.exists(model):
                sys.exit(f"explain-eval: {model} is missing (scripts/get-{m}.sh fetches it)")
            with tempfile.TemporaryDirectory() as tmp:
                cls, layers = classes_of(a.ms, model, tmp)
                rng = random.Random(f"{a.seed}:{m}")
                base = []
                for k in range(a.baseline):
                    log(f"explain-eval: {m}: baseline {k + 1} of {a.baseline} (a healthy run, not scored) ...")
                    base.append(os.path.join(tmp, f"baseline-{k + 1}.json"))
                    run_one(a, a.ms, model, f"baseline {k + 1}", "healthy", [], None, None, tmp, save=base[-1])
                for sc in scenarios(rng, cls, layers, a.workers):
                    if a.only and a.only not in sc[0]:
                        continue
                    log(f"explain-eval: {m}: {sc[0]} ...")
                    try:
                        r = run_one(a, a.ms, model, *sc, tmp, base=base)
                    except Exception as e:  # a run that fails is reported, not scored
                        log(f"explain-eval: {m}: {sc[0]}: {e}")
                        results.append({"model": MODELS[m], "scenario": sc[0], "kind": sc[1], "error": str(e)})
                        continue
                    log("  found" if r["found"] else "  missed" if r["want"] else "  healthy",
                        "; false:", r["false"], "; named:", [c["kind"] + ":" + c["name"] for c in r["culprits"]])
                    results.append(r)
        if a.out:
            json.dump({"seed": a.seed, "workers": a.workers, "window_s": a.window, "baseline": a.baseline,
                       "runs": results}, open(a.out, "w"), indent=1)
    ok = [r for r in results if "error" not in r]
    table(ok)
    reliability(ok)
    if a.calibrate:
        calibrate(ok)
    errors = [r for r in results if "error" in r]
    if errors:
        print(f"\n{len(errors)} runs failed:", [r["scenario"] for r in errors])


if __name__ == "__main__":
    main()
