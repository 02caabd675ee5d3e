#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Concurrent streamed chat completions against `megascope serve`, their
tokens written out for comparison between servers: N clients at once, each
one greedy (or seeded) request with logprobs (the bytes of every token), prompts of a few
lengths. Exits 1 when a request failed.

  tests/serve_streams.py URL --n 4 --max-tokens 24 --out FILE [--first I] [--temperature T] [--stop S]
  tests/serve_streams.py URL --disconnect-after K --max-tokens M  # one stream, closed after K chunks"""
import argparse, json, socket, sys, threading, urllib.parse, urllib.request

ap = argparse.ArgumentParser()
ap.add_argument("url")
ap.add_argument("--n", type=int, default=4)
ap.add_argument("--first", type=int, default=0, help="the first client's number (its prompt)")
ap.add_argument("--max-tokens", type=int, default=24)
ap.add_argument("--out", default="")
ap.add_argument("--disconnect-after", type=int, default=0)
ap.add_argument("--temperature", type=float, default=0, help="> 0: sampled, client i with seed 1000 + i")
ap.add_argument("--stop", default=None, help="a stop string (the server stops the request early there)")
a = ap.parse_args()


def body(i, max_tokens):
    words = " ".join(["about the weather and the sea"] * (1 + (i * 7) % 5))
    b = {"messages": [{"role": "user", "content": f"Tell me a short story {words}, number {i}."}],
         "max_tokens": max_tokens, "temperature": a.temperature, "stream": True, "logprobs": True}
    if a.temperature > 0:
        b["seed"] = 1000 + i
    if a.stop is not None:
        b["stop"] = [a.stop]
    return b


def disconnect(k):
    """A long stream read for k chunks, then the connection dropped."""
    u = urllib.parse.urlparse(a.url)
    data = json.dumps(body(99, a.max_tokens)).encode()
    s = socket.create_connection((u.hostname, u.port), timeout=120)
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n" % len(data) + data)
    seen, buf = 0, b""
    while seen < k:
        chunk = s.recv(65536)
        if not chunk:
            sys.exit("the stream ended before %d chunks" % k)
        buf += chunk
        seen = buf.count(b"data: ")
    s.close()
    print("disconnected after %d chunks" % seen)


def client(i, out, failed):
    req = urllib.request.Request(a.url + "/v1/chat/completions", json.dumps(body(i, a.max_tokens)).encode(),
                                 {"Content-Type": "application/json"})
    toks, text, finish = [], "", None
    try:
        with urllib.request.urlopen(req, timeout=300) as r:
            for line in r:
                line = line.strip()
                if not line.startswith(b"data: ") or line == b"data: [DONE]":
                    continue
                d = json.loads(line[6:])
                if "error" in d:
                    raise RuntimeError(d["error"])
                c = d["choices"][0]
                text += c["delta"].get("content") or ""
                for t in (c.get("logprobs") or {}).get("content") or []:
                    toks.append(t["bytes"])
                finish = c.get("finish_reason") or finish
    except Exception as e:
        failed.append("%d: %s" % (i, e))
        return
    out[i] = {"tokens": toks, "text": text, "finish": finish}


if a.disconnect_after:
    disconnect(a.disconnect_after)
    sys.exit(0)
out, failed = {}, []
th = [threading.Thread(target=client, args=(i, out, failed)) for i in range(a.first, a.first + a.n)]
for t in th:
    t.start()
for t in th:
    t.join()
if failed:
    sys.exit("requests failed: " + "; ".join(failed))
json.dump({str(k): out[k] for k in sorted(out)}, open(a.out, "w") if a.out else sys.stdout, indent=1)
print("%d streams, %d tokens" % (len(out), sum(len(v["tokens"]) for v in out.values())))
