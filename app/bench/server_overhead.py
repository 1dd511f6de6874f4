"""What colibri-serve costs over calling the engine directly, on the default model.

    python -m app.bench.server_overhead [--tokens 64] [--runs 3]

Prints medians of: a greedy reply of N tokens through Engine.generate and through the server
(the official openai client, streamed), /v1/models latency while a reply streams, and the
time from a client's disconnect to the engine being free again.
"""
from __future__ import annotations

import argparse
import json
import socket
import statistics
import time
import urllib.request

PROMPT = "1, 2, 3, 4, 5,"  # counts on for hundreds of tokens: every run generates all N


def _direct(engine, n: int) -> float:
    engine.reset()
    t0 = time.perf_counter()
    steps = list(engine.generate(PROMPT, temperature=0, max_tokens=n))
    assert steps[-1].generated_tokens == n
    return time.perf_counter() - t0


def _served(client, model: str, engine, n: int) -> float:
    engine.reset()
    t0 = time.perf_counter()
    text = "".join(c.choices[0].text for c in client.completions.create(
        model=model, prompt=PROMPT, max_tokens=n, temperature=0, stream=True))
    assert text
    return time.perf_counter() - t0


def _models_while_streaming(client, model: str, url: str) -> float:
    stream = client.completions.create(model=model, prompt=PROMPT, max_tokens=40, temperature=0, stream=True)
    next(iter(stream))
    t0 = time.perf_counter()
    urllib.request.urlopen(url + "/models", timeout=30).read()
    took = time.perf_counter() - t0
    for _ in stream:
        pass
    return took


def _free_after_disconnect(handle) -> float:
    host, port = handle.url.split("//")[1].split("/")[0].split(":")
    body = json.dumps({"prompt": PROMPT, "max_tokens": 400, "temperature": 0, "stream": True}).encode()
    sock = socket.create_connection((host, int(port)))
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n" % len(body) + body)
    seen = b""
    while seen.count(b"data: {") < 3:
        seen += sock.recv(4096)
    sock.close()
    t0 = time.perf_counter()
    while handle.status()["busy"]:
        time.sleep(0.001)
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m app.bench.server_overhead", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args(argv)
    import openai

    from app import server
    from app.model_library import ensure_default_model
    from engine.api import Engine
    engine = Engine(ensure_default_model(), threads=args.threads, log_level="WARN")
    engine.warmup()
    handle = server.start(engine, port=0)
    client = openai.OpenAI(base_url=handle.url, api_key="unused", max_retries=0, timeout=300)
    try:
        rows = {"direct": [], "served": [], "models": [], "free": []}
        for i in range(args.runs):  # alternate which goes first: the machine's load drifts
            pair = [("direct", lambda: _direct(engine, args.tokens)),
                    ("served", lambda: _served(client, handle.model_id, engine, args.tokens))]
            for name, run in pair[::1 if i % 2 == 0 else -1]:
                rows[name].append(run())
            rows["models"].append(_models_while_streaming(client, handle.model_id, handle.url))
            rows["free"].append(_free_after_disconnect(handle))
        med = {k: statistics.median(v) for k, v in rows.items()}
        print(f"{args.tokens} tokens, greedy, median of {args.runs} (threads {engine.threads}):")
        print(f"  Engine.generate        {med['direct']:.2f} s  ({args.tokens / med['direct']:.1f} tok/s)")
        print(f"  server, openai stream  {med['served']:.2f} s  ({args.tokens / med['served']:.1f} tok/s; "
              f"x{med['served'] / med['direct']:.3f} the direct time)")
        print(f"  /v1/models while a reply streams  {med['models'] * 1000:.1f} ms")
        print(f"  disconnect -> engine free          {med['free'] * 1000:.1f} ms")
    finally:
        handle.stop()
        engine.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
