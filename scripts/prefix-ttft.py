#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""The prefix cache seen from a client: the time to first token of a chat request
that shares a long system prompt (269 tokens on SmolLM2) with the request before
it, against that first request, in ROUNDS rounds of a fresh system prompt (so
each round's first request is cold). Streamed, greedy, max_tokens 2.

  scripts/prefix-ttft.py URL [ROUNDS]     (against `megascope serve`, with and
                                          without --no-prefix-cache)"""
import json, sys, time, urllib.request
url, rounds = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 3
def ttft(sys_prompt, q):
    body = json.dumps({"messages": [{"role": "system", "content": sys_prompt}, {"role": "user", "content": q}],
                       "max_tokens": 2, "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}).encode()
    req = urllib.request.Request(url + "/v1/chat/completions", data=body, headers={"Content-Type": "application/json"})
    t0 = time.time(); first = None; usage = None
    with urllib.request.urlopen(req, timeout=600) as r:
        for line in r:
            line = line.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]": continue
            d = json.loads(line[6:])
            if d.get("usage"): usage = d["usage"]
            if d["choices"] and first is None and d["choices"][0]["delta"].get("content"): first = time.time()
    return (first or time.time()) - t0, usage
base = ("You are a careful assistant for a hardware shop. Answer in one short sentence. The shop sells tools, "
        "paint, timber, fixings, garden supplies and electrical parts; it opens at eight and closes at six, "
        "except on Sundays, when it opens at ten and closes at four. Deliveries within ten miles are free for "
        "orders over fifty pounds. Returns are accepted within thirty days with a receipt. ") * 3
for k in range(rounds):
    sp = "Round %d. " % k + base
    a, ua = ttft(sp, "When do you open on Sunday?")
    b, ub = ttft(sp, "Is delivery free for a sixty pound order?")
    print(json.dumps({"round": k, "first_s": round(a, 4), "second_s": round(b, 4), "ratio": round(a / b, 2),
                      "first_prompt": ua and ua["prompt_tokens"], "second_prompt": ub and ub["prompt_tokens"],
                      "second_cached": ub and (ub.get("prompt_tokens_details") or {}).get("cached_tokens")}))
