#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""`megascope serve` against hostile and greedy clients, on loopback only.

Attackers speak from 127.0.0.2 and up (every 127/8 address is loopback on
Linux), the well-behaved client from 127.0.0.1, so per-client limits see them
apart. Phases:

  connections  2,000 idle connections, then 2,000 slowloris ones (a header byte
               a second), each time a normal client must get /health, /metrics
               and a completion; slow ones closed by the read deadline with 408;
               half-closed clients get their whole answer (streamed and not), a
               closed one still cancels; request smuggling answered 400 and the
               connection closed; descriptors and threads back to the baseline.
  shares       one request over the bounds (400), a greedy client over its share
               (429 with Retry-After), a normal client admitted ahead of the
               greedy one's queue, the queue full (429), a client's connections
               all busy (429), each counted in /metrics.
  busy         every connection answering: clients with few connections
               served on the margin (64 places); past it /health and /metrics
               still answered (reserve places), anything else 503.
  descriptors  under a descriptor limit of 192: 300 attach/detach cycles that
               never fail, attaches beyond the budget refused with the budget's
               message, HTTP serving throughout; then a server told to take more
               connections than it has descriptors: 503 "out of file
               descriptors", no thread spinning, serving again once they go.

  hostile.py --ms BIN --monitors DIR [--phase P ...] [--soak SECONDS] [--json OUT]

Every wait is bounded; the normal client's bound is a generous timeout
(--bound, 20 s), never a precise figure: the latencies measured are printed.
--soak runs all the attackers at once for that many seconds while the normal
client asks once a second, then checks the same. Exit 0 when every check held,
1 otherwise, 77 when loopback aliases cannot be bound."""
import argparse
import base64
import errno
import http.client
import json
import os
import resource
import shutil
import signal
import socket
import re
import subprocess
import sys
import tempfile
import threading
import time

failures = []
figures = {}


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what, flush=True)
    if not ok:
        failures.append(what)
    return ok


# ---- the server ----

class Server:
    def __init__(self, ms, name, args, nofile=None):
        self.dir = tempfile.mkdtemp(prefix="megascope-hostile-%s-" % name)
        os.chmod(self.dir, 0o700)
        self.sock = os.path.join(self.dir, "engine.sock")
        self.out = open(os.path.join(self.dir, "serve.out"), "w+")
        self.err = open(os.path.join(self.dir, "serve.err"), "w+")

        def limit():
            if nofile:
                resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))
        self.p = subprocess.Popen([ms, "serve", "--synthetic", "tiny", "--workers", "2", "--http", "127.0.0.1:0",
                                   "--socket", self.sock] + args, stdout=self.out, stderr=self.err,
                                  preexec_fn=limit)
        self.port = None
        for _ in range(600):
            self.out.seek(0)
            text = self.out.read()
            if "ready" in text:
                url = [w for w in text.split() if w.startswith("http://127.0.0.1:")][0]
                self.port = int(url.rsplit(":", 1)[1])
                break
            if self.p.poll() is not None:
                break
            time.sleep(0.1)
        if not self.port:
            self.err.seek(0)
            raise SystemExit("serve did not become ready: " + self.err.read())

    def fds(self):
        return len(os.listdir("/proc/%d/fd" % self.p.pid))

    def threads(self):
        with open("/proc/%d/status" % self.p.pid) as f:
            return int([l for l in f if l.startswith("Threads:")][0].split()[1])

    def cpu_s(self):
        with open("/proc/%d/stat" % self.p.pid) as f:
            v = f.read().rsplit(")", 1)[1].split()
        return (int(v[11]) + int(v[12])) / os.sysconf("SC_CLK_TCK")

    def rss_kib(self):
        with open("/proc/%d/status" % self.p.pid) as f:
            return int([l for l in f if l.startswith("VmRSS:")][0].split()[1])

    def stop(self):
        self.p.send_signal(signal.SIGTERM)
        try:
            rc = self.p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.p.kill()
            rc = "killed"
        check(rc == 0, "serve exits 0 on SIGTERM (got %s)" % rc)
        if rc != 0:
            self.err.seek(0)
            print(self.err.read()[-2000:])
        self.out.close()
        self.err.close()
        shutil.rmtree(self.dir, ignore_errors=True)


# ---- clients ----

def request(port, method, path, body=None, src="127.0.0.1", timeout=20.0, headers=None):
    """One request on a fresh connection from src: (status, headers, body bytes, seconds)."""
    t0 = time.monotonic()
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout, source_address=(src, 0))
    try:
        h = {"Content-Type": "application/json"}
        h.update(headers or {})
        c.request(method, path, json.dumps(body) if body is not None else None, h)
        r = c.getresponse()
        data = r.read()
        return r.status, dict(r.getheaders()), data, time.monotonic() - t0
    finally:
        c.close()


def metrics(port):
    st, _, data, _ = request(port, "GET", "/metrics")
    out = {}
    for line in data.decode().splitlines():
        if line and not line.startswith("#"):
            k, v = line.rsplit(" ", 1)
            # the serving series carry the served model's name (model_name): keyed here without it
            k = re.sub(r'model_name="(?:[^"\\]|\\.)*",?', "", k).replace("{}", "").replace(",}", "}")
            out[k] = float(v)
    return out


def normal_client(port, bound, what):
    """The well-behaved client: /health, /metrics, a completion, each within bound seconds."""
    lat = []
    for method, path, body in (("GET", "/health", None), ("GET", "/metrics", None),
                               ("POST", "/v1/completions", {"prompt": "hello", "max_tokens": 4, "temperature": 0})):
        try:
            st, _, data, dt = request(port, method, path, body, timeout=bound)
            lat.append(dt)
            if not check(st == 200, "%s: %s %s answered 200 in %.2f s (bound %g s)" % (what, method, path, dt, bound)):
                print("   ", data[:300])
        except Exception as e:  # noqa: BLE001 - a failed request is a failed check
            check(False, "%s: %s %s: %r" % (what, method, path, e))
    return lat


def raw(port, data, half=False, src="127.0.0.1", timeout=20.0):
    """Bytes in, everything the server sends until it closes (or the timeout)."""
    s = socket.socket()
    s.bind((src, 0))
    s.settimeout(timeout)
    s.connect(("127.0.0.1", port))
    s.sendall(data)
    if half:
        s.shutdown(socket.SHUT_WR)
    got = b""
    try:
        while True:
            b = s.recv(65536)
            if not b:
                break
            got += b
    except socket.timeout:
        got += b"<timeout>"
    except OSError as e:
        got += b"<" + errno.errorcode.get(e.errno, "?").encode() + b">"
    s.close()
    return got


def flood(port, n, first_host=2, per_host=50, payload=None):
    """n connections from 127.0.0.<first_host>.., per_host each; payload sent once connected."""
    socks = []
    for i in range(n):
        s = socket.socket()
        s.setblocking(False)
        s.bind(("127.0.0.%d" % (first_host + i // per_host), 0))
        try:
            s.connect(("127.0.0.1", port))
        except BlockingIOError:
            pass
        socks.append(s)
    if payload:
        time.sleep(0.5)
        for s in socks:
            try:
                s.send(payload)
            except OSError:
                pass
    return socks


def closed_state(s):
    """'open', 'closed' (EOF or reset) or the bytes the server sent before closing."""
    try:
        b = s.recv(4096)
        if not b:
            return "closed", b""
        rest = b
        try:
            while True:
                more = s.recv(4096)
                if not more:
                    break
                rest += more
        except (BlockingIOError, OSError):
            pass
        return "answered", rest
    except BlockingIOError:
        return "open", b""
    except OSError:
        return "closed", b""


def dechunk(resp):
    """The body of one HTTP/1.1 response, chunked or not."""
    head, _, rest = resp.partition(b"\r\n\r\n")
    if b"transfer-encoding: chunked" not in head.lower():
        return rest
    out, pos = b"", 0
    while True:
        end = rest.find(b"\r\n", pos)
        if end < 0:
            return out
        size = int(rest[pos:end].split(b";")[0] or b"0", 16)
        if not size:
            return out
        out += rest[end + 2:end + 2 + size]
        pos = end + 4 + size


def http_responses(data):
    return data.count(b"HTTP/1.1 ")


# ---- control socket: soak.py's client ----

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from soak import call as soak_call  # noqa: E402


def ctl(path, req, timeout=30):
    return soak_call(path, req, timeout=timeout)[0]


# ---- phases ----

def settle(srv, base_fds, base_threads, what, slack=4, wait=30):
    """Waits (bounded) for the server's descriptors and threads to come back to the baseline."""
    fds = thr = None
    for _ in range(int(wait * 10)):
        fds, thr = srv.fds(), srv.threads()
        if fds <= base_fds + slack and thr <= base_threads + slack:
            break
        time.sleep(0.1)
    check(fds <= base_fds + slack, "%s: descriptors back to the baseline (%d, baseline %d)" % (what, fds, base_fds))
    check(thr <= base_threads + slack, "%s: threads back to the baseline (%d, baseline %d)" % (what, thr, base_threads))


def phase_connections(a):
    srv = Server(a.ms, "conn", ["--batch", "4", "--read-timeout", "3", "--idle-timeout", "4"])
    port = srv.port
    try:
        normal_client(port, a.bound, "warm-up")
        time.sleep(0.5)
        base_fds, base_threads = srv.fds(), srv.threads()

        # 2,000 idle connections
        n = a.flood
        socks = flood(port, n)
        time.sleep(2.0)
        lat = normal_client(port, a.bound, "beside %d idle connections" % n)
        figures["idle_flood_normal_s"] = lat
        m = metrics(port)
        if n > m['megascope_http_limit{limit="max_connections"}']:
            check(m['megascope_http_connections_closed_total{reason="evicted"}'] > 0,
                  "idle connections were closed to make room (%d evicted)" %
                  m['megascope_http_connections_closed_total{reason="evicted"}'])
        bound = m['megascope_http_limit{limit="max_connections"}'] + 64 + 16  # the margin, the reserve places
        check(m["megascope_http_connections_open"] <= bound,
              "open connections within the bound, its margin and its reserve (%d <= %d)" %
              (m["megascope_http_connections_open"], bound))
        for s in socks:
            s.close()
        settle(srv, base_fds, base_threads, "after the idle flood")

        # 2,000 slowloris connections: a request line, then a header byte a second
        socks = flood(port, n, first_host=60, payload=b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
        t0 = time.monotonic()
        lat = []
        for i in range(3):
            for s in socks:
                try:
                    s.send(b"X")
                except OSError:
                    pass
            if i == 1:
                lat = normal_client(port, a.bound, "beside %d slowloris connections" % n)
            time.sleep(1.0)
        figures["slowloris_normal_s"] = lat
        seen = [None] * len(socks)  # (state, bytes) once the server has closed it
        deadline = t0 + 3 + 10  # --read-timeout 3, generously
        while time.monotonic() < deadline and any(v is None for v in seen):
            for i, s in enumerate(socks):
                if seen[i] is None:
                    try:
                        s.send(b"X")
                    except OSError:
                        pass
                    st, data = closed_state(s)
                    if st != "open":
                        seen[i] = (st, data)
            time.sleep(1.0)
        states = {"open": 0, "closed": 0, "answered": 0}
        answers = set()
        for i, s in enumerate(socks):
            st, data = seen[i] or ("open", b"")
            states[st] += 1
            if data:
                answers.add(data.split(b"\r\n", 1)[0])
            s.close()
        figures["slowloris_states"] = states
        check(states["open"] == 0, "every slowloris connection was closed by the read deadline (%s)" % states)
        # 408: its deadline passed; 503: refused at accept while evicted ones were still closing
        check(answers <= {b"HTTP/1.1 408 Request Timeout", b"HTTP/1.1 503 Service Unavailable"},
              "what they were answered is 408, or 503 at accept (%s)" % sorted(answers))
        m = metrics(port)
        check(m['megascope_http_connections_closed_total{reason="timeout_head"}'] > 0,
              "counted as head timeouts (%d)" % m['megascope_http_connections_closed_total{reason="timeout_head"}'])
        settle(srv, base_fds, base_threads, "after the slowloris flood")

        # half-closed clients get their whole answer
        body = json.dumps({"prompt": "half", "max_tokens": 6, "temperature": 0}).encode()
        req = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
        got = raw(port, req, half=True)
        head, text = got.partition(b"\r\n\r\n")[0], dechunk(got)
        ok = head.startswith(b"HTTP/1.1 200")
        try:
            ok = ok and json.loads(text)["usage"]["completion_tokens"] == 6
        except (ValueError, KeyError):
            ok = False
        check(ok, "a half-closed client gets its whole answer (%r...)" % got[:80])
        sb = json.dumps({"prompt": "half", "max_tokens": 6, "stream": True, "temperature": 0}).encode()
        got = raw(port, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(sb), sb),
                  half=True)
        events = [e for e in dechunk(got).split(b"\n\n") if e.startswith(b"data: ")]
        try:
            last = json.loads(events[-2][6:])["choices"][0]["finish_reason"] if len(events) >= 2 else None
        except ValueError:
            last = None
        check(got.startswith(b"HTTP/1.1 200") and events and events[-1] == b"data: [DONE]" and last == "length",
              "a half-closed streaming client gets every event, the finish and [DONE] (%d events, finish %s)" %
              (len(events), last))

        # request smuggling
        cases = [
            ("Content-Length and Transfer-Encoding",
             b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n"
             b"0\r\n\r\nGET /health HTTP/1.1\r\nHost: x\r\n\r\n", b"400"),
            ("two Content-Lengths",
             b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 44\r\n\r\n"
             b"abcdeGET /health HTTP/1.1\r\nHost: x\r\n\r\n", b"400"),
            ("Transfer-Encoding not chunked",
             b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: xchunked\r\n\r\n"
             b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n", b"400"),
            ("Transfer-Encoding twice",
             b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
             b"Transfer-Encoding: identity\r\n\r\n0\r\n\r\nGET /health HTTP/1.1\r\nHost: x\r\n\r\n", b"400"),
            ("Transfer-Encoding in HTTP/1.0",
             b"POST /v1/completions HTTP/1.0\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", b"400"),
            ("a coding before chunked",
             b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n", b"501"),
            ("a malformed chunk size",
             b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nab\r\n0\r\n\r\n"
             b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n", b"400"),
        ]
        for what, data, status in cases:
            got = raw(port, data)
            check(got.startswith(b"HTTP/1.1 " + status) and http_responses(got) == 1 and b"<timeout>" not in got,
                  "%s: %s, one response, the connection closed (%r)" % (what, status.decode(), got[:60]))
        pipelined = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\nGET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        got = raw(port, pipelined)
        check(http_responses(got) == 2, "two honest pipelined requests get two answers")
        chunked = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n" \
                  b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
        check(raw(port, chunked).startswith(b"HTTP/1.1 200"), "a well-formed chunked body is served")
        settle(srv, base_fds, base_threads, "at the end")
        figures["conn_rss_kib"] = srv.rss_kib()
    finally:
        srv.stop()


def phase_shares(a):
    # every step held 2 ms by a fault, so that requests last long enough to queue
    srv = Server(a.ms, "shares", ["--batch", "2", "--max-batched-tokens", "0", "--client-max-requests", "6",
                                  "--max-queued", "12", "--max-connections-per-client", "4",
                                  "--fault", "delayed_release:rope->attn:2ms"])
    port = srv.port
    try:
        normal_client(port, a.bound, "warm-up")
        st, _, data, _ = request(port, "POST", "/v1/completions", {"prompt": "x", "n": 64, "max_tokens": 400})
        check(st == 400 and json.loads(data)["error"]["code"] == "request_too_large",
              "n 64 x max_tokens 400 is refused 400 (%d %s)" % (st, data[:120]))
        st, _, data, _ = request(port, "POST", "/v1/completions",
                                 {"prompt": [[1 + i % 250 for i in range(300)]], "n": 32, "max_tokens": 1})
        check(st == 400 and json.loads(data)["error"]["param"] == "prompt",
              "32 choices of a 300-token prompt are refused 400 (%d %s)" % (st, data[:120]))

        # a greedy client takes its whole share (6) with three long requests of two choices
        results = {}

        def greedy(i):
            try:
                results[i] = request(port, "POST", "/v1/completions",
                                     {"prompt": "greedy %d" % i, "max_tokens": 100, "ignore_eos": True, "n": 2,
                                      "temperature": 0}, src="127.0.0.2", timeout=300)[0]
            except Exception as e:  # noqa: BLE001
                results[i] = repr(e)
        threads = []
        for i in range(3):
            t = threading.Thread(target=greedy, args=(i,))
            t.start()
            threads.append(t)
            time.sleep(0.05)
        for _ in range(100):
            if metrics(port)["megascope_http_clients_holding"] >= 1 and \
                    metrics(port)["megascope_num_requests_waiting"] >= 4:
                break
            time.sleep(0.1)
        st, hd, data, dt = request(port, "POST", "/v1/completions", {"prompt": "more", "max_tokens": 10},
                                   src="127.0.0.2")
        check(st == 429 and hd.get("Retry-After") == "1" and json.loads(data)["error"]["code"] == "rate_limit_exceeded",
              "over its share the greedy client gets 429 with Retry-After at once (%d, %.2f s, %s)" %
              (st, dt, data[:150]))
        # the normal client is admitted before the greedy client's queue
        st, _, data, dt = request(port, "POST", "/v1/completions", {"prompt": "me", "max_tokens": 4,
                                                                   "temperature": 0}, timeout=a.bound * 6)
        pending = sum(1 for t in threads if t.is_alive())
        figures["shares_normal_s"] = dt
        check(st == 200, "the normal client is answered beside the greedy one (%.2f s)" % dt)
        check(pending >= 2, "... before the greedy client's queued requests (%d of its 3 still unfinished)" % pending)

        # a client whose connections are all busy: 429 on the next
        busy = []
        for i in range(4):
            s = socket.socket()
            s.bind(("127.0.0.9", 0))
            s.connect(("127.0.0.1", port))
            b = json.dumps({"prompt": "busy", "max_tokens": 200, "ignore_eos": True, "stream": True}).encode()
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(b), b))
            busy.append(s)
        time.sleep(0.5)
        st, hd, data, _ = request(port, "GET", "/health", src="127.0.0.9")
        check(st == 429 and hd.get("Retry-After") == "1" and b"too many connections" in data,
              "a client's fifth connection beside four busy ones gets 429 (%d %s)" % (st, data[:100]))
        for s in busy:
            s.close()

        # the queue full: every client within its share, the engine's queue is not
        codes = []
        lock = threading.Lock()

        def filler(host):
            try:
                st, hd, data, _ = request(port, "POST", "/v1/completions",
                                          {"prompt": "fill", "max_tokens": 20, "ignore_eos": True}, src=host,
                                          timeout=300)
                with lock:
                    codes.append((st, hd.get("Retry-After"), data[:200]))
            except Exception as e:  # noqa: BLE001
                with lock:
                    codes.append((repr(e), None, b""))
        fill = [threading.Thread(target=filler, args=("127.0.0.%d" % (20 + i // 3),)) for i in range(18)]
        for t in fill:
            t.start()
        for t in fill:
            t.join(timeout=600)
        full = [c for c in codes if c[0] == 429]
        check(full and all(c[1] == "1" and b"queue_full" in c[2] for c in full),
              "a full queue answers 429 queue_full with Retry-After (%d of 18)" % len(full))
        check(all(c[0] in (200, 429) for c in codes), "every other filler was served (%s)" %
              sorted(set(str(c[0]) for c in codes)))
        for t in threads:
            t.join(timeout=600)
        check(all(results[i] == 200 for i in range(3)), "the greedy client's own requests were all served (%s)" % results)
        m = metrics(port)
        for reason in ("request_tokens", "prompt_tokens", "client_requests", "queue_full"):
            check(m['megascope_http_requests_refused_total{reason="%s"}' % reason] > 0,
                  "/metrics counts %s refusals" % reason)
        check(m['megascope_http_connections_refused_total{reason="client"}'] > 0, "/metrics counts the client's 429")
    finally:
        srv.stop()


def closed_cancels(port):
    """A client that closes (not half) while its whole answer is made has its request cancelled.
    Run on the busy server, whose steps are slowed by a fault: on the plain tiny model 500 tokens
    take about 60 ms, done before the client has gone."""
    before = metrics(port)["megascope_http_cancelled_total"]
    lb = json.dumps({"prompt": "gone", "max_tokens": 500, "temperature": 0, "ignore_eos": True}).encode()
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(lb), lb))
    time.sleep(0.2)
    s.close()
    cancelled = False
    for _ in range(200):
        if metrics(port)["megascope_http_cancelled_total"] > before:
            cancelled = True
            break
        time.sleep(0.1)
    check(cancelled, "a client that closed while waiting has its request cancelled")
    done = metrics(port)["megascope_http_completions_total"]
    check(done == 1, "... and it was not answered as a completion (completions %d, the warm-up's alone)" % done)


def phase_busy(a):
    """Every connection answering: a client with few connections still gets one of the margin's
    places; past the margin too, /health and /metrics still answer (reserve places), anything else 503."""
    srv = Server(a.ms, "busy", ["--batch", "2", "--max-connections", "4", "--fault", "delayed_release:rope->attn:2ms"])
    port = srv.port
    busy = []

    def stream_from(host):
        s = socket.socket()
        s.bind((host, 0))
        s.settimeout(a.bound)
        s.connect(("127.0.0.1", port))
        b = json.dumps({"prompt": "busy", "max_tokens": 300, "ignore_eos": True, "stream": True}).encode()
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(b), b))
        busy.append(s)
        return s.recv(12)  # answering once its headers come (asking /metrics before could close it)

    try:
        normal_client(port, a.bound, "warm-up")
        closed_cancels(port)
        heads = [stream_from("127.0.0.%d" % (40 + i)) for i in range(4)]
        check(heads == [b"HTTP/1.1 200"] * 4, "four streams take the four connections")
        heads = [stream_from("127.1.0.%d" % (1 + i)) for i in range(64)]
        check(heads == [b"HTTP/1.1 200"] * 64, "64 clients with few connections are served on the margin (%d)" %
              heads.count(b"HTTP/1.1 200"))
        for path in ("/health", "/metrics"):
            st, _, _, dt = request(port, "GET", path, timeout=a.bound)
            check(st == 200, "margin full, GET %s is answered 200 on a reserve place (%.2f s)" % (path, dt))
        st, _, data, _ = request(port, "POST", "/v1/completions", {"prompt": "x", "max_tokens": 2}, timeout=a.bound)
        check(st == 503 and b"only /health and /metrics" in data,
              "... and a completion gets 503 saying so (%d %s)" % (st, data[:100]))
    finally:
        for s in busy:
            s.close()
        srv.stop()


def phase_descriptors(a):
    with open(os.path.join(a.monitors, "class_time.bpf.o"), "rb") as f:
        obj = base64.b64encode(f.read()).decode()
    srv = Server(a.ms, "fds", ["--batch", "2"], nofile=192)
    port = srv.port
    try:
        normal_client(port, a.bound, "warm-up")
        failed = []
        for i in range(a.cycles):
            rep = ctl(srv.sock, {"cmd": "attach", "name": "c%d" % i, "object": obj})
            if not rep.get("ok"):
                failed.append(rep.get("error", rep))
                continue
            ctl(srv.sock, {"cmd": "detach", "id": rep["id"]})
            if i % 50 == 0:
                st = request(port, "GET", "/health", timeout=a.bound)[0]
                if st != 200:
                    failed.append("health %d" % st)
        check(not failed, "%d attach/detach cycles under a descriptor limit of 192, none failed (%s)" %
              (a.cycles, failed[:2]))
        m = metrics(port)
        check(m["megascope_attach_freed_early_total"] > 0,
              "retained generations were freed early for room (%d)" % m["megascope_attach_freed_early_total"])
        check(srv.fds() < 192, "the server holds fewer descriptors than its limit (%d)" % srv.fds())
        ids, refusal = [], None
        for i in range(400):
            rep = ctl(srv.sock, {"cmd": "attach", "name": "live%d" % i, "object": obj})
            if not rep.get("ok"):
                refusal = json.dumps(rep)
                break
            ids.append(rep["id"])
        check(refusal is not None and "refused by the attachments' budget" in refusal,
              "attaching beyond the budget is refused with the budget's message (after %d: %s)" %
              (len(ids), (refusal or "")[:200]))
        normal_client(port, a.bound, "beside %d attachments at the budget" % len(ids))
        for i in ids:
            ctl(srv.sock, {"cmd": "detach", "id": i})
    finally:
        srv.stop()

    # more connections allowed than descriptors: accept meets EMFILE
    srv = Server(a.ms, "emfile", ["--batch", "2", "--max-connections", "400", "--read-timeout", "30"], nofile=192)
    port = srv.port
    try:
        normal_client(port, a.bound, "warm-up")
        socks = flood(port, 300, first_host=100)
        time.sleep(1.5)
        c0 = srv.cpu_s()
        time.sleep(3.0)
        used = srv.cpu_s() - c0
        figures["emfile_cpu_s_in_3s"] = used
        check(used < 1.5, "out of descriptors, no thread spins (%.2f s of CPU in 3 s)" % used)
        got = raw(port, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n", timeout=a.bound)
        check(got.startswith(b"HTTP/1.1 503") and b"out of file descriptors" in got,
              "a connection past the descriptors is answered 503 out of file descriptors (%r)" % got[:80])
        for s in socks:
            s.close()
        time.sleep(1.0)
        normal_client(port, a.bound, "once the flood has gone")
        m = metrics(port)
        check(m['megascope_http_connections_refused_total{reason="fds"}'] > 0, "/metrics counts it (%d)" %
              m['megascope_http_connections_refused_total{reason="fds"}'])
    finally:
        srv.stop()


def soak(a):
    """Every attacker at once for a.soak seconds; the normal client asks once a second."""
    with open(os.path.join(a.monitors, "class_time.bpf.o"), "rb") as f:
        obj = base64.b64encode(f.read()).decode()
    srv = Server(a.ms, "soak", ["--batch", "4", "--read-timeout", "3", "--idle-timeout", "4",
                                "--client-max-requests", "8", "--detached-retention", "60"])
    port = srv.port
    stop = threading.Event()
    counts = {"normal": 0, "normal_failed": 0, "greedy_200": 0, "greedy_429": 0, "attach": 0, "attach_failed": 0,
              "idle_opened": 0, "slow_opened": 0}
    lat, why = [], []

    def greedy():
        while not stop.is_set():
            try:
                st = request(port, "POST", "/v1/completions", {"prompt": "g", "max_tokens": 64, "ignore_eos": True},
                             src="127.0.0.2", timeout=600)[0]
                counts["greedy_200" if st == 200 else "greedy_429"] += 1
                if st == 429:
                    time.sleep(0.2)
            except Exception:  # noqa: BLE001
                pass

    def idle():
        while not stop.is_set():
            socks = flood(port, 1000, first_host=30)
            counts["idle_opened"] += 1000
            stop.wait(5)
            for s in socks:
                s.close()

    def slow():
        while not stop.is_set():
            socks = flood(port, 500, first_host=60, payload=b"GET /health HTTP/1.1\r\n")
            counts["slow_opened"] += 500
            for _ in range(5):
                if stop.wait(1):
                    break
                for s in socks:
                    try:
                        s.send(b"X")
                    except OSError:
                        pass
            for s in socks:
                s.close()

    def attacher():
        while not stop.is_set():
            rep = ctl(srv.sock, {"cmd": "attach", "name": "s", "object": obj})
            if rep.get("ok"):
                counts["attach"] += 1
                ctl(srv.sock, {"cmd": "detach", "id": rep["id"]})
            else:
                counts["attach_failed"] += 1
            stop.wait(0.05)

    try:
        normal_client(port, a.bound, "warm-up")
        time.sleep(0.5)
        base_fds, base_threads, base_rss = srv.fds(), srv.threads(), srv.rss_kib()
        workers = [threading.Thread(target=f) for f in (greedy, greedy, idle, slow, attacher)]
        for t in workers:
            t.start()
        t_end = time.monotonic() + a.soak
        while time.monotonic() < t_end:
            t0 = time.monotonic()
            try:
                st, _, data, dt = request(port, "POST", "/v1/completions", {"prompt": "n", "max_tokens": 4},
                                          timeout=a.bound)
                st2, _, data2, _ = request(port, "GET", "/health", timeout=a.bound)
                counts["normal"] += 1
                lat.append(dt)
                if st != 200 or st2 != 200:
                    counts["normal_failed"] += 1
                    why.append("%d %d %s" % (st, st2, (data if st != 200 else data2)[:120]))
            except Exception as e:  # noqa: BLE001
                counts["normal_failed"] += 1
                why.append(repr(e))
            time.sleep(max(0.0, 1.0 - (time.monotonic() - t0)))
        stop.set()
        for t in workers:
            t.join(timeout=120)
        lat.sort()
        figures["soak"] = dict(counts, seconds=a.soak,
                               normal_p50_s=lat[len(lat) // 2] if lat else None,
                               normal_p99_s=lat[min(len(lat) - 1, int(len(lat) * 0.99))] if lat else None,
                               normal_max_s=lat[-1] if lat else None)
        check(counts["normal_failed"] == 0, "soak: the normal client was always served (%d asks; %s)" %
              (counts["normal"], why[:5]))
        figures["soak"]["failures"] = why
        check(counts["attach_failed"] == 0, "soak: no attach failed (%d cycles)" % counts["attach"])
        settle(srv, base_fds, base_threads, "after the soak", wait=60)
        rss = srv.rss_kib()
        figures["soak"].update(base_fds=base_fds, base_rss_kib=base_rss, end_rss_kib=rss)
        check(rss < base_rss + 65536, "soak: RSS within 64 MiB of the baseline (%d -> %d KiB)" % (base_rss, rss))
    finally:
        stop.set()
        srv.stop()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ms", required=True)
    ap.add_argument("--monitors", required=True)
    ap.add_argument("--phase", action="append", choices=["connections", "shares", "busy", "descriptors"])
    ap.add_argument("--flood", type=int, default=2000, help="idle and slowloris connections")
    ap.add_argument("--cycles", type=int, default=300, help="attach/detach cycles")
    ap.add_argument("--bound", type=float, default=20.0, help="the normal client's timeout, seconds")
    ap.add_argument("--soak", type=float, default=0, help="seconds of everything at once")
    ap.add_argument("--max-seconds", type=int, default=900)
    ap.add_argument("--json")
    a = ap.parse_args()
    signal.alarm(a.max_seconds if not a.soak else int(a.soak) + a.max_seconds)
    try:
        s = socket.socket()
        s.bind(("127.0.0.2", 0))
        s.close()
    except OSError as e:
        print("SKIP: cannot bind 127.0.0.2 (%s): attackers need loopback addresses of their own" % e)
        return 77
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = a.flood + 512
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(want, soft)), hard))
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft < want:
        a.flood = max(200, soft - 512)
        print("note: descriptor limit %d: floods of %d connections" % (soft, a.flood))
    if a.soak:
        soak(a)
    else:
        for p in a.phase or ["connections", "shares", "busy", "descriptors"]:
            print("== %s" % p, flush=True)
            {"connections": phase_connections, "shares": phase_shares, "busy": phase_busy,
             "descriptors": phase_descriptors}[p](a)
    print(json.dumps(figures, default=str))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(figures, f, indent=1, default=str)
    print("%d checks failed" % len(failures) if failures else "all hostile-client checks passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
