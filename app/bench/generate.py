"""Per-token cost of the chat path on the default model: a bare forward() loop, generate()
greedy, generate() with the chat window's default sampling, and the sampler alone.

    python -m app.bench.generate [--tokens 32] [--runs 15] [--threads 2]

Prints the median and the minimum of several interleaved runs (milliseconds per token); asserts nothing. The gap between
`generate` and `forward` is generate()'s own per-token overhead (sampling, detokenizing, stop
strings, the Step records).
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

PROMPT = [{"role": "user", "content": "Write a short story about a hummingbird who learns to code."}]


def _forward_loop(eng, ids: list[int], n: int) -> float:
    eng.reset()
    tok = eng.forward(ids)
    t0 = time.perf_counter()
    for _ in range(n):
        tok = eng.forward([tok])
    return (time.perf_counter() - t0) / n


class _ForwardClock:
    """Wraps the engine's runner (Engine.prefill and Engine.decode) to add up the time spent in
    the model: what generate() spends besides it is its own overhead, a figure that a noisy
    neighbour disturbs far less."""

    def __init__(self, eng):
        self.seconds = 0.0
        for name in ("prefill", "decode"):
            setattr(eng, name, self._timed(getattr(eng, name)))

    def _timed(self, inner):
        def call(*args, **kwargs):
            t = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - t
        return call


def _generate(eng, clock: _ForwardClock, n: int, overhead: list[float], **sampling) -> float:
    """Seconds per decoded token after the first (the prefill and first token are excluded);
    appends generate()'s own seconds per token (the time outside the model) to `overhead`."""
    eng.reset()
    t_first, count = None, 0
    for step in eng.generate(PROMPT, max_tokens=n + 1, **sampling):
        if step.generated_tokens == 1:
            t_first, model_s = time.perf_counter(), clock.seconds
        count = step.generated_tokens
    if count < 2:
        raise RuntimeError("the model stopped before the second token: raise --tokens or change the prompt")
    total = time.perf_counter() - t_first
    overhead.append((total - (clock.seconds - model_s)) / (count - 1))
    return total / (count - 1)


def _sampler(eng, history: list[int], reps: int = 200, **settings) -> float:
    from engine.sampling import Sampler
    s = Sampler(**(eng.sampling | settings))
    logits = eng.logits(history)[-1].astype(np.float32)
    s.sample(logits, history)
    t0 = time.perf_counter()
    for _ in range(reps):
        s.sample(logits, history)
    return (time.perf_counter() - t0) / reps


def _stub_overhead(eng, ids: list[int], n: int = 400) -> dict[str, float]:
    """Per-token seconds of forward() and generate() around a stub model that returns the real
    last-prompt logits at once (with a moving top token, so text keeps coming): the API's own
    cost, free of the model and nearly free of a noisy neighbour."""
    real = eng.logits(ids)[-1:].copy()
    inner = eng.prefill, eng.decode

    def prefill(ids, cache, pos0, before_layer=None):
        out = real.copy()
        out[0, 300 + pos0 % 2000] = float(real.max()) + 10.0
        cache.length = pos0 + len(ids)
        return out

    eng.prefill, eng.decode = prefill, lambda tokens, caches: prefill(tokens, caches[0], caches[0].length)
    try:
        out = {"forward()": _forward_loop(eng, ids, n)}
        for name, kw in [("generate() greedy", {"temperature": 0.0}), ("generate() default", {}),
                         ("generate() default + repeat_penalty 1.1", {"repeat_penalty": 1.1})]:
            eng.reset()
            steps = eng.generate(PROMPT, max_tokens=n + 1, seed=1, **kw)
            next(steps)
            t0 = time.perf_counter()
            count = sum(1 for _ in steps)
            out[name] = (time.perf_counter() - t0) / count
        return out
    finally:
        eng.prefill, eng.decode = inner
        eng.reset()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args(argv)
    from app.model_library import ensure_default_model
    from engine.api import Engine
    eng = Engine(ensure_default_model(), threads=args.threads, log_level="WARN")
    eng.warmup()
    clock = _ForwardClock(eng)
    ids = eng.prompt_ids(PROMPT)
    default = {k: eng.sampling[k] for k in ("temperature", "top_k", "top_p", "min_p", "repeat_penalty")}
    own: dict[str, list[float]] = {"greedy": [], "default": [], "repeat": []}
    cases = {
        "forward() loop": lambda: _forward_loop(eng, ids, args.tokens),
        "generate() greedy": lambda: _generate(eng, clock, args.tokens, own["greedy"], temperature=0.0, seed=1),
        "generate() default sampling": lambda: _generate(eng, clock, args.tokens, own["default"], seed=1),
        "generate() default + repeat_penalty 1.1": lambda: _generate(eng, clock, args.tokens, own["repeat"], seed=1,
                                                                     repeat_penalty=1.1),
        "sampler alone, default": lambda: _sampler(eng, ids),
        "sampler alone, top_k=0": lambda: _sampler(eng, ids, top_k=0),
        "sampler alone, greedy": lambda: _sampler(eng, ids, temperature=0.0),
    }
    results = {name: [] for name in cases}
    for _ in range(args.runs):  # interleaved, so that a noisy neighbour hits every case alike
        for name, fn in cases.items():
            results[name].append(fn())
    base = statistics.median(results["forward() loop"])
    print(f"default model, {eng.threads} threads, {args.tokens} tokens, medians of {args.runs} runs; sampling "
          f"defaults {default}")
    best = min(results["forward() loop"])
    print("  (min: the quietest run of each, the fairest figure on a shared machine)")
    for name, xs in results.items():
        m = statistics.median(xs)
        print(f"  {name:42s} median {m * 1e3:7.3f} ms/token ({m / base * 100:6.1f}%)   min {min(xs) * 1e3:7.3f} "
              f"({min(xs) / best * 100:6.1f}% of a forward step)")
    stub = [_stub_overhead(eng, ids) for _ in range(5)]
    print("  around a stub model (the API's own per-token cost; min of 5 runs):")
    for name in stub[0]:
        m = min(r[name] for r in stub)
        print(f"    {name:42s} {m * 1e6:7.1f} us/token ({m / best * 100:5.2f}% of the quietest forward step)")
    for name, xs in own.items():
        m = statistics.median(xs)
        print(f"  generate() {name}: its own time outside the model, median {m * 1e3:.3f} ms/token "
              f"({m / best * 100:.1f}% of the quietest forward step), min {min(xs) * 1e3:.3f}")
    eng.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
