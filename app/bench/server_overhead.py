"""What colibri-serve costs over calling the engine directly, on the default model.

    python -m app.bench.server_overhead [--tokens 64] [--runs 3]

Prints medians of: a greedy reply of N tokens through Engine.generate and through the server
(the official openai client, streamed), with the median gap between two tokens of each,
/v1/models latency while a reply streams, the time from a client's disconnect to the engine
being free again, and where one served request's CPU time goes by thread (the engine's
scheduler thread, its OpenMP workers, the event loop, the client): on a quiet machine a served
reply far slower than the direct one with about the same CPU is waiting, not computing.
"""
from __future__ import annotations

import argparse
import json
import socket
import statistics
import time
import urllib.request

PROMPT = "1, 2, 3, 4, 5,"  # counts on for hundreds of tokens: every run generates all N


def _gap(times: list[float]) -> float:
    return statistics.median(b - a for a, b in zip(times, times[1:])) if len(times) > 2 else 0.0


def _direct(engine, n: int) -> tuple[float, float]:
    """(seconds, median seconds between two tokens)."""
    engine.reset()
    t0, times, last = time.perf_counter(), [], None
    for last in engine.generate(PROMPT, temperature=0, max_tokens=n):  # noqa: B007 - the last step is checked
        times.append(time.perf_counter())
    assert last is not None and last.generated_tokens == n
    return time.perf_counter() - t0, _gap(times)


def _served(client, model: str, engine, n: int) -> tuple[float, float]:
    engine.reset()
    t0, times, text = time.perf_counter(), [], ""
    for c in client.completions.create(model=model, prompt=PROMPT, max_tokens=n, temperature=0, stream=True):
        if c.choices and c.choices[0].text:
            times.append(time.perf_counter())
            text += c.choices[0].text
    assert text
    return time.perf_counter() - t0, _gap(times)


def _sleeps() -> int:
    """Voluntary context switches of this process's threads so far (Linux; 0 elsewhere): OpenMP
    workers that sleep and wake at each parallel region show as hundreds per token."""
    import glob
    import os
    total = 0
    for f in glob.glob(f"/proc/{os.getpid()}/task/*/status"):
        try:
            with open(f) as fh:
                total += sum(int(line.split()[1]) for line in fh if line.startswith("voluntary_ctxt_switches"))
        except OSError:  # a thread that ended meanwhile
            pass
    return total


def _thread_cpu() -> dict[str, float]:
    """CPU seconds so far of this process's threads, by Python thread name (the native threads
    Python does not know, numba's OpenMP workers here, under one name)."""
    import threading

    import psutil
    names = {t.native_id: t.name for t in threading.enumerate()}
    out: dict[str, float] = {}
    for t in psutil.Process().threads():
        name = names.get(t.id, "OpenMP workers (numba)")
        name = "client (openai, this thread)" if name == "MainThread" else name
        out[name] = out.get(name, 0.0) + t.user_time + t.system_time
    return out


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

    from engine import kernels
    kernels.setup()  # before app.server and engine.api
    from app import server
    from app.model_library import ensure_default_model
    from engine.api import Engine
    from app.cli_serve import warm_apart
    engine = Engine(ensure_default_model(), threads=args.threads, log_level="WARN")
    warm_apart(engine)  # as colibri-serve (the direct runs below start a second OpenMP team, on this thread)
    handle = server.start(engine, port=0)
    client = openai.OpenAI(base_url=handle.url, api_key="unused", max_retries=0, timeout=300)
    try:
        rows: dict[str, list] = {"direct": [], "served": [], "direct_gap": [], "served_gap": [], "models": [],
                                 "free": []}
        for i in range(args.runs):  # alternate which goes first: the machine's load drifts
            pair = [("direct", lambda: _direct(engine, args.tokens)),
                    ("served", lambda: _served(client, handle.model_id, engine, args.tokens))]
            for name, run in pair[::1 if i % 2 == 0 else -1]:
                took, gap = run()
                rows[name].append(took)
                rows[name + "_gap"].append(gap)
            rows["models"].append(_models_while_streaming(client, handle.model_id, handle.url))
            rows["free"].append(_free_after_disconnect(handle))
        before, slept = _thread_cpu(), _sleeps()
        _served(client, handle.model_id, engine, args.tokens)
        after, slept = _thread_cpu(), _sleeps() - slept
        med = {k: statistics.median(v) for k, v in rows.items()}
        print(f"{args.tokens} tokens, greedy, median of {args.runs} (threads {engine.threads}):")
        print(f"  Engine.generate        {med['direct']:.2f} s  ({args.tokens / med['direct']:.1f} tok/s; "
              f"{med['direct_gap'] * 1000:.2f} ms between tokens)")
        print(f"  server, openai stream  {med['served']:.2f} s  ({args.tokens / med['served']:.1f} tok/s; "
              f"x{med['served'] / med['direct']:.3f} the direct time; {med['served_gap'] * 1000:.2f} ms between tokens)")
        cpu = {k: v - before.get(k, 0.0) for k, v in after.items() if v - before.get(k, 0.0) > 5e-4}
        print("  one served request's CPU by thread: " + ", ".join(
            f"{k} {v * 1000:.0f} ms" for k, v in sorted(cpu.items(), key=lambda kv: -kv[1])) +
            f"; {slept / args.tokens:.0f} voluntary context switches per token")
        print(f"  /v1/models while a reply streams  {med['models'] * 1000:.1f} ms")
        print(f"  disconnect -> engine free          {med['free'] * 1000:.1f} ms")
    finally:
        handle.stop()
        engine.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
