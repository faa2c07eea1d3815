"""Aggregate decode speed of `sparsa serve` with N concurrent greedy streams against 1, and
time to first token / inter-token latency percentiles. Standard library only.

usage: python3 benches/serve_load.py URL [--streams 1,2,4,8] [--tokens 64] [--rounds 1]
       (URL like http://127.0.0.1:8080; start the server with --parallel >= the largest N)

Two rates per level: end to end (all tokens over the wall time, prefills included) and while
decoding together (the token events of every stream between the last stream's first token
and the first stream's last one), each against one stream's.
"""

import argparse
import http.client
import json
import statistics
import threading
import time
import urllib.parse

PROMPTS = [
    "ROMEO:",
    "KING RICHARD:\nWhat news",
    "Now is the winter of our discontent",
    "HAMLET:\nTo be, or not to be",
    "JULIET:\nO Romeo, Romeo",
    "MACBETH:\nIs this a dagger",
    "PORTIA:\nThe quality of mercy",
    "LEAR:\nBlow, winds",
]


def stream(url, prompt, tokens, out):
    u = urllib.parse.urlparse(url)
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=600)
    body = json.dumps(
        {"prompt": prompt, "max_tokens": tokens, "temperature": 0, "ignore_eos": True,
         "stream": True, "stream_options": {"include_usage": True}}
    )
    t0 = time.perf_counter()
    c.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    r = c.getresponse()
    times, usage, buf = [], None, b""
    while True:
        chunk = r.read1(65536)
        if not chunk:
            break
        buf += chunk
        while b"\n\n" in buf:
            event, buf = buf.split(b"\n\n", 1)
            data = event.decode()[len("data: "):]
            if data == "[DONE]":
                continue
            v = json.loads(data)
            if v.get("usage"):
                usage = v["usage"]
            elif v["choices"] and v["choices"][0]["text"]:
                times.append(time.perf_counter() - t0)
    out.append({"times": times, "tokens": usage["completion_tokens"], "secs": time.perf_counter() - t0})


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))] if xs else float("nan")


def run_level(url, n, tokens):
    out = []
    threads = [
        threading.Thread(target=stream, args=(url, PROMPTS[i % len(PROMPTS)], tokens, out))
        for i in range(n)
    ]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    return out, wall


def steady_rate(out):
    """Tokens per second while every stream is decoding: the token events of all streams
    between the last stream's first token and the first stream's last token."""
    if any(len(r["times"]) < 2 for r in out):
        return float("nan")  # text held back (e.g. a random model's bytes): no timing
    lo = max(r["times"][0] for r in out)
    hi = min(r["times"][-1] for r in out)
    if hi <= lo:
        return float("nan")
    n = sum(1 for r in out for t in r["times"] if lo < t <= hi)
    return n / (hi - lo)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("url")
    ap.add_argument("--streams", default="1,2,4,8")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=1, help="runs per level; the median is shown")
    a = ap.parse_args()
    base = base_steady = None
    for n in [int(x) for x in a.streams.split(",")]:
        # Warm-up: the server compiles the pipelines of a step of n rows the first time.
        run_level(a.url, n, 8)
        runs = [run_level(a.url, n, a.tokens) for _ in range(a.rounds)]
        rates = sorted(sum(r["tokens"] for r in out) / wall for out, wall in runs)
        steadies = sorted(steady_rate(out) for out, _ in runs)
        rate = rates[len(rates) // 2]
        steady = steadies[len(steadies) // 2]
        base = base or rate
        base_steady = base_steady or steady
        out = [r for o, _ in runs for r in o]
        tokens = sum(r["tokens"] for r in out) // len(runs)
        ttft = [r["times"][0] for r in out if r["times"]]
        itl = [b - a_ for r in out for a_, b in zip(r["times"], r["times"][1:])]
        print(
            f"{n} streams: {tokens} tokens, {rate:.1f} tok/s end to end ({rate / base:.2f}x one "
            f"stream), {steady:.1f} tok/s decoding together ({steady / base_steady:.2f}x) | "
            f"TTFT p50 {pct(ttft, 50) * 1e3:.0f} ms p99 {pct(ttft, 99) * 1e3:.0f} ms | "
            f"ITL p50 {pct(itl, 50) * 1e3:.1f} ms p99 {pct(itl, 99) * 1e3:.1f} ms",
            flush=True,
        )


if __name__ == "__main__":
    main()
