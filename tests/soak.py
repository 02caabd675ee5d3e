#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""A soak of `megascope serve`: attach / replace / detach cycles, read-outs,
ring buffers read by `megascope records` (nothing lost, every record of every
run), traces, listings, schema and /metrics scrapes over the control socket while
completions are streamed over HTTP, and idle control connections that must not
lock an operator out. Throughout, it checks that no request fails and that every
closed generation's coverage adds up (eligible == executed + throttled, failed
== 0, lost == 0 for monitors without a ring buffer); at the end, with the same
state as at the baseline (nothing attached), that the server holds the same
file descriptors and its RSS is flat within a tolerance.

  soak.py --ms BIN --monitors DIR [--cycles N] [--max-seconds S] [--json OUT]

Exit 0 when every check held (the figures are printed, and written to --json),
1 otherwise. Bounded: it stops cycling after --max-seconds whatever --cycles
says, and every wait has a bound."""
import argparse
import array
import base64
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

MAX_FDS = 16


class Fail(Exception):
    pass


def call(path, req, want_fds=False, timeout=60):
    """One request on a fresh connection; returns (reply, fds)."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    s.connect(path)
    try:
        body = json.dumps(req).encode()
        s.sendall(struct.pack("<I", len(body)) + body)
        return recv_frame(s, want_fds)
    finally:
        s.close()


def recv_frame(s, want_fds):
    buf, fds = b"", []
    while len(buf) < 4:
        data, anc, _, _ = s.recvmsg(4 - len(buf), socket.CMSG_LEN(MAX_FDS * 4))
        if not data:
            raise Fail("the server closed the connection")
        buf += data
        fds += fds_of(anc)
    n = struct.unpack("<I", buf)[0]
    body = b""
    while len(body) < n:
        data, anc, _, _ = s.recvmsg(min(1 << 20, n - len(body)), socket.CMSG_LEN(MAX_FDS * 4))
        if not data:
            raise Fail("the server closed the connection mid-reply")
        body += data
        fds += fds_of(anc)
    if not want_fds:
        for fd in fds:
            os.close(fd)
        fds = []
    return json.loads(body), fds


def fds_of(anc):
    out = []
    for level, kind, data in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            a = array.array("i")
            a.frombytes(data[: len(data) - len(data) % 4])
            out += list(a)
    return out


def ok(rep, what):
    if not rep.get("ok"):
        raise Fail(f"{what}: {rep.get('code')}: {rep.get('error')}")
    return rep


def proc_fds(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


def proc_rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise Fail("no VmRSS")


def check_closed_generations(att, what):
    """Every generation of a detached attachment is closed: its counts are final."""
    for g in att["generations"]:
        if g["eligible"] != g["executed"] + g["throttled"]:
            raise Fail(f"{what}: generation {g['generation']}: eligible {g['eligible']} != executed "
                       f"{g['executed']} + throttled {g['throttled']}")
        if g["failed"]:
            raise Fail(f"{what}: generation {g['generation']}: {g['failed']} failed runs")


def check_live_generation(att, workers, what):
    """A live generation: a reader may see a firing counted eligible before it is
    counted executed or throttled, at most one per worker."""
    g = att["coverage"]
    gap = g["eligible"] - g["executed"] - g["throttled"]
    if gap < 0 or gap > workers:
        raise Fail(f"{what}: live generation {g['generation']}: eligible - executed - throttled = {gap}")


class Completions:
    """Threads that stream completions and count what failed."""

    def __init__(self, url, n):
        self.url, self.stop, self.done, self.failed, self.errors = url, threading.Event(), 0, 0, []
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self.run, args=(i,), daemon=True) for i in range(n)]
        self.paused = threading.Event()
        self.idle = [threading.Event() for _ in range(n)]

    def start(self):
        for t in self.threads:
            t.start()

    def run(self, i):
        k = 0
        while not self.stop.is_set():
            if self.paused.is_set():
                self.idle[i].set()
                time.sleep(0.02)
                continue
            self.idle[i].clear()
            k += 1
            body = json.dumps({"prompt": [1 + (k + i) % 200, 7, 11], "max_tokens": 4 + k % 5}).encode()
            req = urllib.request.Request(self.url + "/v1/completions", data=body,
                                         headers={"Content-Type": "application/json", "Connection": "close"})
            try:
                with urllib.request.urlopen(req, timeout=120) as r:
                    data = r.read()
                    if r.status != 200 or not data:
                        raise Fail(f"status {r.status}")
                with self.lock:
                    self.done += 1
            except Exception as e:  # every failure is counted and reported
                with self.lock:
                    self.failed += 1
                    self.errors.append(repr(e))

    def pause(self):
        self.paused.set()
        for ev in self.idle:
            ev.wait(120)

    def resume(self):
        self.paused.clear()

    def finish(self):
        self.stop.set()
        for t in self.threads:
            t.join(130)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ms", required=True)
    ap.add_argument("--monitors", required=True)
    ap.add_argument("--cycles", type=int, default=40)
    ap.add_argument("--max-seconds", type=float, default=600)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--retention", type=int, default=2)
    ap.add_argument("--clients", type=int, default=2, help="completion threads")
    ap.add_argument("--rss-tolerance-kib", type=int, default=8192)
    ap.add_argument("--json")
    ap.add_argument("--backend", default="cpu", help="serve's backend (cuda: megascope-emu or a GPU)")
    ap.add_argument("--ring-loss-ok", action="store_true",
                    help="records a starved reader lost are allowed, but each must be counted as lost")
    a = ap.parse_args()

    objs = {}
    for name in ("class_time", "queueing", "dep_wait", "step_trace"):
        with open(os.path.join(a.monitors, name + ".bpf.o"), "rb") as f:
            objs[name] = base64.b64encode(f.read()).decode()

    tmp = tempfile.mkdtemp(prefix="megascope-soak-")
    os.chmod(tmp, 0o700)
    sock = os.path.join(tmp, "engine.sock")
    out = open(os.path.join(tmp, "serve.out"), "w+")
    err = open(os.path.join(tmp, "serve.err"), "w+")
    serve = subprocess.Popen([a.ms, "serve", "--synthetic", "tiny", "--workers", "2", "--batch", "4",
                              "--backend", a.backend,
                              "--http", "127.0.0.1:0", "--socket", sock, "--detached-retention",
                              str(a.retention), "--control-idle", "30"], stdout=out, stderr=err)
    url = None
    result = {"ok": False}
    t0 = time.monotonic()
    comp = None
    idle_socks = []
    try:
        for _ in range(600):
            out.seek(0)
            text = out.read()
            if "ready" in text:
                url = [w for w in text.split() if w.startswith("http://127.0.0.1:")][0]
                break
            if serve.poll() is not None:
                break
            time.sleep(0.1)
        if not url:
            err.seek(0)
            raise Fail("serve did not become ready: " + err.read())
        pid = serve.pid
        workers = ok(call(sock, {"cmd": "info"})[0], "info")["workers"]
        comp = Completions(url, a.clients)
        comp.start()
        counts = {"cycles": 0, "attach": 0, "replace": 0, "detach": 0, "readouts": 0, "released": 0,
                  "traces": 0, "scrapes": 0, "lists": 0, "ring_reads": 0, "ring_records": 0, "ring_lost": 0, "idle_evictions": 0}
        fd_series, rss_series = [], []
        baseline = None
        budgets = [{}, {"max_per_step": 3}, {"sample": 2}, {"ringbuf_bytes": 4096}]

        # one long-lived attachment, replaced every cycle: its old generations
        # are freed after the retention
        long_id = ok(call(sock, {"cmd": "attach", "name": "long", "object": objs["dep_wait"]})[0], "attach")["id"]

        def quiescent_sample():
            comp.pause()
            time.sleep(0.2)  # the server closes the HTTP connections it answered
            v = (proc_fds(pid), proc_rss_kib(pid))
            comp.resume()
            return v

        cycle = 0
        while cycle < a.warmup + a.cycles and time.monotonic() - t0 < a.max_seconds:
            i = cycle
            b = budgets[i % len(budgets)]
            rep = ok(call(sock, dict({"cmd": "attach", "name": "soak", "object": objs["class_time"]}, **b))[0],
                     "attach")
            aid = rep["id"]
            counts["attach"] += 1
            rb = budgets[(i + 1) % len(budgets)]
            ok(call(sock, dict({"cmd": "replace", "id": aid, "name": "soak2", "object": objs["queueing"]}, **rb))[0],
               "replace")
            counts["replace"] += 1
            ok(call(sock, {"cmd": "replace", "id": long_id, "name": "long", "object": objs["dep_wait"]})[0],
               "replace long")
            counts["replace"] += 1
            live, fds = call(sock, {"cmd": "maps", "id": aid, "fds": i % 3 == 0}, want_fds=True)
            for fd in fds:
                os.close(fd)
            check_live_generation(ok(live, "maps")["attachment"], workers, f"cycle {i}")
            got = ok(call(sock, {"cmd": "list"})[0], "list")["attachments"]
            bud = [x for x in got if x["id"] == aid][0]["budget"]
            # replace sets the budget fields it is given and keeps the others
            want = dict({"max_per_step": 0, "sample": 1, "ringbuf_bytes": 0}, **b)
            want.update(rb)
            if want != bud:
                raise Fail(f"cycle {i}: attach {b}, replace {rb}: the attachment has {bud}, expected {want}")
            counts["lists"] += 1
            ok(call(sock, {"cmd": "detach", "id": aid})[0], "detach")
            counts["detach"] += 1
            if i % 4 == 3:
                # left for the retention to free
                pass
            else:
                final = ok(call(sock, {"cmd": "maps", "id": aid, "release": True})[0], "final read-out")
                check_closed_generations(final["attachment"], f"cycle {i}")
                counts["readouts"] += 1
                gone = call(sock, {"cmd": "maps", "id": aid})[0]
                if gone.get("ok") or gone.get("code") != "ENOENT":
                    raise Fail(f"cycle {i}: attachment {aid} still readable after its release: {gone}")
                counts["released"] += 1
            if i % 5 == 0:
                tr, fds = call(sock, {"cmd": "trace", "seconds": 0.05, "records_per_worker": 4096}, want_fds=True)
                ok(tr, "trace")
                for fd in fds:
                    os.close(fd)
                counts["traces"] += 1
            if i % 10 == 7:
                read_ring(a.ms, sock, objs["step_trace"], tmp, counts, i, comp, a.ring_loss_ok)
            if i % 5 == 2:
                with urllib.request.urlopen(url + "/metrics", timeout=30) as r:
                    page = r.read().decode()
                if "megascope_attachment_eligible_total{" not in page:
                    raise Fail("no attachment series in /metrics")
                counts["scrapes"] += 1
                ok(call(sock, {"cmd": "schema"})[0], "schema")
                ok(call(sock, {"cmd": "stats"})[0], "stats")
            cycle += 1
            counts["cycles"] = cycle
            if cycle == a.warmup:
                # the baseline: nothing but the long-lived attachment; wait for
                # the retained ones to be freed
                wait_retained(sock, long_id, a.retention)
                baseline = quiescent_sample()
            elif cycle > a.warmup:
                fd_series.append(proc_fds(pid))
                rss_series.append(proc_rss_kib(pid))

        # idle connections: fill the server's 32 client slots with idle
        # clients, wait past a second, then an operator must still be served
        for _ in range(32):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(sock)
            idle_socks.append(s)
        time.sleep(1.3)
        ok(call(sock, {"cmd": "info"})[0], "info with 32 idle clients connected")
        st = ok(call(sock, {"cmd": "stats"})[0], "stats")
        counts["idle_evictions"] = st["control"]["idle_closed"]
        if counts["idle_evictions"] < 1:
            raise Fail("no idle client was closed to make room")
        for s in idle_socks:
            s.close()
        idle_socks = []
        time.sleep(0.2)

        wait_retained(sock, long_id, a.retention)
        if baseline is None:
            raise Fail("fewer cycles than the warm-up: no baseline")
        final = quiescent_sample()
        comp.finish()
        if comp.failed:
            raise Fail(f"{comp.failed} completions failed: {comp.errors[:3]}")
        fd_ok = final[0] <= baseline[0]
        rss_growth = final[1] - baseline[1]
        result = {
            "ok": fd_ok and rss_growth <= a.rss_tolerance_kib,
            "seconds": round(time.monotonic() - t0, 1),
            "counts": counts,
            "completions": comp.done,
            "completions_failed": comp.failed,
            "fds_baseline": baseline[0], "fds_final": final[0],
            "fds_max_during": max(fd_series) if fd_series else None,
            "rss_kib_baseline": baseline[1], "rss_kib_final": final[1],
            "rss_kib_max_during": max(rss_series) if rss_series else None,
            "rss_tolerance_kib": a.rss_tolerance_kib,
        }
        if not fd_ok:
            raise Fail(f"file descriptors grew: {baseline[0]} at the baseline, {final[0]} at the end")
        if rss_growth > a.rss_tolerance_kib:
            raise Fail(f"RSS grew {rss_growth} KiB (baseline {baseline[1]} KiB, end {final[1]} KiB), "
                       f"more than {a.rss_tolerance_kib} KiB")
        # the long-lived attachment's closed generations add up too
        ok(call(sock, {"cmd": "detach", "id": long_id})[0], "detach long")
        last = ok(call(sock, {"cmd": "maps", "id": long_id, "release": True})[0], "final read-out long")
        check_closed_generations(last["attachment"], "long-lived attachment")
        if len(last["attachment"]["generations"]) > a.cycles + a.warmup:
            raise Fail("old generations were not freed")
        print(json.dumps(result, indent=1))
        return 0
    except Fail as e:
        result["ok"] = False
        result["error"] = str(e)
        print("FAILED:", e)
        print(json.dumps(result, indent=1))
        return 1
    finally:
        for s in idle_socks:
            s.close()
        if comp:
            comp.stop.set()
        if a.json:
            with open(a.json, "w") as f:
                json.dump(result, f, indent=1)
        serve.send_signal(signal.SIGTERM)
        try:
            rc = serve.wait(60)
            if rc != 0 and result.get("ok"):
                print(f"FAILED: serve exited {rc}")
                sys.exit(1)
        except subprocess.TimeoutExpired:
            serve.kill()
            print("FAILED: serve did not stop within 60 s of SIGTERM")
            sys.exit(1)


def read_ring(ms, sock, obj, tmp, counts, cycle, comp, loss_ok):
    """step_trace read by `megascope records` while completions run: every
    program run's record arrives and none is lost. The completions pause while
    the reader starts (a ring of 4 KiB fills in milliseconds, faster than a
    process starts), then run while it reads. With loss_ok (the short soak,
    beside other tests on two cores, where the reader can be starved past the
    ring's 16 ms of records), records may be lost, but every program run is a
    record received or a record counted lost, by the reader and by the
    attachment's coverage alike."""
    comp.pause()
    sid = ok(call(sock, {"cmd": "attach", "name": "step_trace", "object": obj})[0], "attach step_trace")["id"]
    errf = os.path.join(tmp, "records.err")
    with open(os.path.join(tmp, "records.out"), "w") as out, open(errf, "w") as err:
        rec = subprocess.Popen([ms, "records", "--socket", sock, str(sid), "--json"], stdout=out, stderr=err)
        for _ in range(400):
            if "ring step_events" in open(errf).read() or rec.poll() is not None:
                break
            time.sleep(0.01)
        comp.resume()
        time.sleep(0.15)
        ok(call(sock, {"cmd": "detach", "id": sid})[0], "detach step_trace")
        try:
            rc = rec.wait(30)
        except subprocess.TimeoutExpired:
            rec.kill()
            raise Fail(f"cycle {cycle}: records did not stop after the detach")
    if rc != 0:
        raise Fail(f"cycle {cycle}: records exited {rc}: {open(errf).read()}")
    lines = open(os.path.join(tmp, "records.out")).read().splitlines()
    summary = json.loads(lines[-1])["summary"]
    final = ok(call(sock, {"cmd": "maps", "id": sid, "release": True})[0], "final read-out step_trace")
    check_closed_generations(final["attachment"], f"cycle {cycle}: step_trace")
    g = final["attachment"]["generations"][0]
    lost = summary["lost_ring_full"] + summary["lost_before_reader"]
    if loss_ok:
        bad = (summary["records"] + lost != g["executed"] or g["lost"] != lost or len(lines) - 1 != summary["records"]
               or summary["records"] == 0)
    else:
        bad = g["lost"] or lost or summary["records"] != g["executed"] or len(lines) - 1 != g["executed"]
    if bad:
        raise Fail(f"cycle {cycle}: step_trace read by records: {summary}, coverage {g}")
    counts["ring_lost"] += lost
    counts["ring_reads"] += 1
    counts["ring_records"] += summary["records"]


def wait_retained(sock, keep_id, retention):
    """Waits (bounded) until only keep_id is held: detached attachments left to
    the retention have been freed."""
    for _ in range(int((retention + 5) * 20)):
        atts = ok(call(sock, {"cmd": "list"})[0], "list")["attachments"]
        if [x["id"] for x in atts] == [keep_id]:
            # and its old generations too
            if atts[0]["first_generation"] == atts[0]["generation"]:
                return
        time.sleep(0.05)
    raise Fail(f"detached attachments or old generations not freed within the retention of {retention} s + 5 s: "
               f"{[(x['id'], x['attached'], x['first_generation'], x['generation']) for x in atts]}")


if __name__ == "__main__":
    sys.exit(main())
