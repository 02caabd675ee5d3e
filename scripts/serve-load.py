#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""The serving load benchmark: streamed chat completions at several
concurrencies against `megascope serve` (and `llama-server`, when a path to one
is given), the servers taking turns with the very same requests.

Each server is started once on the same model with the same threads and
parallel slots; then for every repetition and concurrency level each server
in turn runs the level's requests: prompts of 20-400 tokens drawn from a fixed
seed (cut to their length with the first server's /tokenize; fresh ones for
every repetition and level, the same for every server), max_tokens 64,
greedy, streamed, CONCURRENCY clients each taking the next request when its
last one ends. Per server and level it prints output tokens/s (the level's
completion tokens over its wall time), time to first token p50/p90 and
inter-token latency p50/p90/p99 (the gaps between a stream's content chunks),
each as the median over the repetitions with their spread (min-max).

  scripts/serve-load.py [--megascope build/megascope] [--model F.gguf]
                        [--llama-server PATH] [--workers 2] [--levels 1,4,8,16]
                        [--requests 24] [--reps 3] [--no-prefix-cache]
                        [--variant NAME='serve options' ...] [--tp-ranks N] [--json]

Variants are more megascope servers with extra options, run beside the
default one: `--no-prefix-cache` adds one with the prefix cache off, and
`--variant budget-off='--step-target-ms 0'` one without the step budget
(an A/B in one run); `--tp-ranks 2` one engine in two processes over MPI
(`mpirun -np 2 megascope serve --tp 2`, half the threads each). --url drives a server already running instead (no
others). The machine's other load moves the figures: alternate, repeat, read
the spread."""
import argparse, json, os, random, re, shlex, signal, statistics, subprocess, sys, tempfile, threading, time
import http.client, urllib.parse

WORDS = ("the a of and to in is it that was for on are with as his they be at one have this from or had by "
         "hot word but what some we can out other were all there when up use your how said an each she which "
         "do their time if will way about many then them write would like so these her long make thing see "
         "him two has look more day could go come did number sound no most people my over know water than "
         "call first who may down side been now find any new work part take get place made live where after "
         "back little only round man year came show every good me give our under name very through just form "
         "sentence great think say help low line differ turn cause much mean before move right boy old too "
         "same tell does set three want air well also play small end put home read hand port large spell add "
         "even land here must big high such follow act why ask men change went light kind off need house "
         "picture try us again animal point mother world near build self earth father head stand own page").split()


def pct(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    k = (len(xs) - 1) * p / 100.0
    i = int(k)
    return xs[i] if i + 1 >= len(xs) else xs[i] + (xs[i + 1] - xs[i]) * (k - i)


class Server:
    """A server under test: its name, base URL and (when started here) process."""

    def __init__(self, name, url, proc=None, log=None):
        self.name, self.url, self.proc, self.log = name, url, proc, log
        u = urllib.parse.urlparse(url)
        self.host, self.port = u.hostname, u.port

    def post(self, path, body, timeout=600):
        c = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        c.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        r = c.getresponse()
        data = r.read()
        c.close()
        if r.status != 200:
            raise RuntimeError("%s %s: HTTP %d %s" % (self.name, path, r.status, data[:200]))
        return json.loads(data)

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start_megascope(a, name, extra, tmp, ranks=1):
    """megascope serve; ranks > 1: one engine in that many processes
    (mpirun -np RANKS serve --tp RANKS), the threads split among them."""
    sock = os.path.join(tmp, name + ".sock")
    out = open(os.path.join(tmp, name + ".out"), "w+")
    cmd = [a.megascope, "serve", "--http", "127.0.0.1:0", "--socket", sock, "--workers",
           str(max(1, a.workers // ranks)), "--batch", str(a.parallel), "--max-ctx", str(a.ctx)]
    cmd += ["--model", a.model] if a.model else []
    cmd += shlex.split(a.serve_args) + extra
    env = None
    if ranks > 1:
        cmd = ["mpirun", "--bind-to", "none", "-np", str(ranks)] + cmd + ["--tp", str(ranks)]
        env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                   OMPI_MCA_rmaps_base_oversubscribe="1", OMPI_MCA_btl_vader_single_copy_mechanism="none")
    p = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    deadline = time.time() + 300
    while time.time() < deadline:
        time.sleep(0.2)
        out.seek(0)
        text = out.read()
        if re.search(r"^ready", text, re.M):
            url = re.search(r"http://127\.0\.0\.1:\d+", text).group(0)
            return Server(name, url, p, out)
        if p.poll() is not None:
            break
    p.kill()
    out.seek(0)
    sys.exit("serve-load: %s did not become ready:\n%s" % (" ".join(cmd), out.read()[-2000:]))


def start_llama(a, tmp):
    out = open(os.path.join(tmp, "llama-server.out"), "w+")
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    cmd = [a.llama_server, "-m", a.model or default_model(), "--host", "127.0.0.1", "--port", str(port),
           "-t", str(a.workers), "-np", str(a.parallel), "-c", str(a.parallel * a.ctx)]
    p = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    srv = Server("llama-server", "http://127.0.0.1:%d" % port, p, out)
    deadline = time.time() + 300
    while time.time() < deadline:
        time.sleep(0.3)
        if p.poll() is not None:
            break
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            c.request("GET", "/health")
            if c.getresponse().status == 200:
                return srv
        except OSError:
            pass
    p.kill()
    out.seek(0)
    sys.exit("serve-load: llama-server did not become ready:\n" + out.read()[-2000:])


def default_model():
    p = os.path.expanduser("~/.cache/megascope/SmolLM2-135M-Instruct.Q4_1.gguf")
    if not os.path.exists(p):
        sys.exit("serve-load: llama-server needs --model (no %s)" % p)
    return p


def make_prompts(srv, n, seed):
    """n prompts of 20-400 tokens (by srv's tokenizer) drawn from seed."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        want = rng.randint(20, 400)
        words = [rng.choice(WORDS) for _ in range(want)]
        for _ in range(6):
            text = "Request %d. %s." % (i, " ".join(words))
            have = len(srv.post("/tokenize", {"content": text})["tokens"])
            if have <= want or len(words) <= 1:
                break
            words = words[:max(1, len(words) - (have - want))]
        out.append(text)
    return out


def one_request(srv, prompt, max_tokens):
    """One streamed chat completion: (ttft s or None, [gaps s], completion tokens, True); raises on an
    HTTP error."""
    body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    c = http.client.HTTPConnection(srv.host, srv.port, timeout=600)
    t0 = time.perf_counter()
    c.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        err = r.read()[:200]
        c.close()
        raise RuntimeError("HTTP %d %s" % (r.status, err))
    stamps, usage = [], None
    while True:
        line = r.readline()
        if not line:
            break
        line = line.strip()
        if not line.startswith(b"data: ") or line == b"data: [DONE]":
            continue
        d = json.loads(line[6:])
        if d.get("usage"):
            usage = d["usage"]
        ch = d.get("choices") or []
        if ch and (ch[0].get("delta") or {}).get("content"):
            stamps.append(time.perf_counter())
    c.close()
    n = usage["completion_tokens"] if usage else len(stamps)
    if not stamps:  # an answer with no text (an end of turn at once): no first token to time
        return None, [], n, True
    return stamps[0] - t0, [b - a for a, b in zip(stamps, stamps[1:])], n, True


def run_level(srv, prompts, conc, max_tokens):
    pending = list(range(len(prompts)))
    lock = threading.Lock()
    ttft, itl, toks, failed, done = [], [], [0], [0], [0]

    def client():
        while True:
            with lock:
                if not pending:
                    return
                i = pending.pop(0)
            try:
                t, gaps, n, ok = one_request(srv, prompts[i], max_tokens)
            except (OSError, http.client.HTTPException, ValueError, RuntimeError) as ex:
                t, gaps, n, ok = None, [], 0, False
                print("serve-load: %s: request %d failed: %s" % (srv.name, i, ex), file=sys.stderr, flush=True)
            with lock:
                if not ok:
                    failed[0] += 1
                    continue
                done[0] += 1
                if t is not None:
                    ttft.append(t)
                itl.extend(gaps)
                toks[0] += n

    t0 = time.perf_counter()
    th = [threading.Thread(target=client) for _ in range(conc)]
    for t in th:
        t.start()
    for t in th:
        t.join()
    wall = time.perf_counter() - t0
    return {"tokens_per_s": toks[0] / wall, "ttft_p50": pct(ttft, 50), "ttft_p90": pct(ttft, 90),
            "itl_p50": pct(itl, 50), "itl_p90": pct(itl, 90), "itl_p99": pct(itl, 99),
            "completion_tokens": toks[0], "requests": done[0], "failed": failed[0], "wall_s": wall}


KEYS = [("tokens_per_s", "tok/s", 1, "%.1f"), ("ttft_p50", "TTFT p50 s", 1, "%.2f"),
        ("ttft_p90", "TTFT p90 s", 1, "%.2f"), ("itl_p50", "ITL p50 ms", 1e3, "%.0f"),
        ("itl_p90", "ITL p90 ms", 1e3, "%.0f"), ("itl_p99", "ITL p99 ms", 1e3, "%.0f")]


def summary(runs):
    s = {}
    for k, _, _, _ in KEYS:
        v = [r[k] for r in runs if r[k] == r[k]]
        s[k] = {"median": statistics.median(v) if v else None, "min": min(v) if v else None,
                "max": max(v) if v else None}
    s["failed"] = sum(r["failed"] for r in runs)
    return s


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--megascope", default=os.path.join(here, "..", "build", "megascope"))
    ap.add_argument("--model", help="GGUF file (default: megascope's default model)")
    ap.add_argument("--serve-args", default="", help="more options for every megascope serve")
    ap.add_argument("--llama-server", help="path to a llama-server binary (none: megascope only)")
    ap.add_argument("--url", help="drive this running server only (started elsewhere)")
    ap.add_argument("--workers", type=int, default=2, help="threads of each server (default 2)")
    ap.add_argument("--parallel", type=int, default=16, help="requests each server runs at once (default 16)")
    ap.add_argument("--ctx", type=int, default=1024, help="positions a request (default 1024)")
    ap.add_argument("--levels", default="1,4,8,16")
    ap.add_argument("--requests", type=int, default=24, help="requests a level (default 24)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--seed", type=int, default=32)
    ap.add_argument("--warmup-s", type=float, default=3, help="wait after the servers start (default 3)")
    ap.add_argument("--no-prefix-cache", action="store_true", help="also megascope with --no-prefix-cache")
    ap.add_argument("--variant", action="append", default=[], metavar="NAME=OPTS",
                    help="also megascope with these serve options")
    ap.add_argument("--tp-ranks", type=int, default=1, metavar="N",
                    help="also megascope as one engine in N processes (mpirun -np N serve --tp N, "
                         "--workers / N threads each)")
    ap.add_argument("--json", action="store_true", help="print the results as JSON")
    a = ap.parse_args()
    levels = [int(x) for x in a.levels.split(",")]
    say = (lambda *x: print(*x, file=sys.stderr, flush=True)) if a.json else (lambda *x: print(*x, flush=True))
    tmp = tempfile.mkdtemp(prefix="serve-load.")
    servers = []
    try:
        if a.url:
            servers.append(Server("server", a.url))
        else:
            servers.append(start_megascope(a, "megascope", [], tmp))
            if a.no_prefix_cache:
                servers.append(start_megascope(a, "megascope-no-prefix-cache", ["--no-prefix-cache"], tmp))
            for v in a.variant:
                name, _, opts = v.partition("=")
                servers.append(start_megascope(a, "megascope-" + name, shlex.split(opts), tmp))
            if a.tp_ranks > 1:
                servers.append(start_megascope(a, "megascope-%d-ranks" % a.tp_ranks, [], tmp, a.tp_ranks))
            if a.llama_server:
                servers.append(start_llama(a, tmp))
            else:
                say("llama-server not given: megascope only")
        # fresh prompts for every repetition and level (the same for every
        # server), so a prefix cache holds no earlier run's prompts
        prompts = {(rep, c): make_prompts(servers[0], a.requests, a.seed * 1000003 + rep * 1009 + c)
                   for rep in range(a.reps) for c in levels}
        warm = make_prompts(servers[0], 2, a.seed - 1)
        say("%d requests a level, prompts of 20-400 tokens (seed %d), max_tokens %d, greedy, streamed; "
            "servers: %s" % (a.requests, a.seed, a.max_tokens, ", ".join(s.name for s in servers)))
        time.sleep(a.warmup_s)  # megascope compiles its prompt-chunk plans after it is ready
        for s in servers:  # warm-up: pages touched, plans run
            for p in warm:
                one_request(s, p, 8)
        runs = {(s.name, c): [] for s in servers for c in levels}
        for rep in range(a.reps):
            for c in levels:
                order = servers if rep % 2 == 0 else servers[::-1]
                for s in order:
                    r = run_level(s, prompts[(rep, c)], c, a.max_tokens)
                    runs[(s.name, c)].append(r)
                    say("rep %d conc %2d %-28s %6.1f tok/s  TTFT p90 %.2f s  ITL p90 %.0f ms%s" %
                        (rep + 1, c, s.name, r["tokens_per_s"], r["ttft_p90"], r["itl_p90"] * 1e3,
                         "  (%d failed)" % r["failed"] if r["failed"] else ""))
        result = {"levels": levels, "requests": a.requests, "reps": a.reps, "max_tokens": a.max_tokens,
                  "workers": a.workers, "seed": a.seed, "llama_server": bool(a.llama_server),
                  "servers": [{"name": s.name, "levels": [dict(concurrency=c, runs=runs[(s.name, c)],
                                                                **summary(runs[(s.name, c)]))
                                                           for c in levels]} for s in servers]}
        if a.json:
            print(json.dumps(result, indent=1))
        else:
            print("\nmedian over %d repetitions [min-max]" % a.reps)
            print("%-28s %4s " % ("server", "conc") + " ".join("%-19s" % h for _, h, _, _ in KEYS))
            for s in result["servers"]:
                for lv in s["levels"]:
                    cells = []
                    for k, _, mul, f in KEYS:
                        m = lv[k]
                        cells.append("%-19s" % ("-" if m["median"] is None else
                                                (f + " [" + f + "-" + f + "]") % (m["median"] * mul, m["min"] * mul,
                                                                               m["max"] * mul)))
                    print("%-28s %4d " % (s["name"], lv["concurrency"]) + " ".join(cells) +
                          ("  %d failed" % lv["failed"] if lv["failed"] else ""))
        bad = sum(lv["failed"] for s in result["servers"] for lv in s["levels"])
        return 1 if bad else 0
    finally:
        for s in servers:
            s.stop()


if __name__ == "__main__":
    sys.exit(main())
