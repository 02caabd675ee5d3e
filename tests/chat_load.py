#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""A steady load of streamed chat completions against `megascope serve`:
CLIENTS clients, each sending its next request when the last one ends, until
the file STOP exists (or --for seconds pass). Prompts of a few lengths, greedy,
MAX_TOKENS each. Exits 1 when a request failed (the count on stderr).

  tests/chat_load.py URL --clients 8 --max-tokens 48 --stop FILE [--for S]"""
import argparse, json, os, sys, threading, time, urllib.request

ap = argparse.ArgumentParser()
ap.add_argument("url")
ap.add_argument("--clients", type=int, default=8)
ap.add_argument("--max-tokens", type=int, default=48)
ap.add_argument("--stop", default="")
ap.add_argument("--for", dest="secs", type=float, default=600)
a = ap.parse_args()
end = time.time() + a.secs
failed = []


def done():
    return time.time() > end or (a.stop and os.path.exists(a.stop))


def client(i):
    n = 0
    while not done():
        words = " ".join(["about the weather and the sea"] * (1 + (i * 7 + n) % 9))
        body = {"messages": [{"role": "user", "content": f"Tell me a short story {words}, number {i}-{n}."}],
                "max_tokens": a.max_tokens, "temperature": 0, "stream": True}
        req = urllib.request.Request(a.url + "/v1/chat/completions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=300) as r:
                for line in r:
                    if done():
                        break
        except Exception as e:
            if not done():
                failed.append(str(e))
                time.sleep(0.2)
        n += 1


ts = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(a.clients)]
for t in ts:
    t.start()
for t in ts:
    t.join()
if failed:
    print(f"chat_load: {len(failed)} requests failed, the first: {failed[0]}", file=sys.stderr)
    sys.exit(1)
