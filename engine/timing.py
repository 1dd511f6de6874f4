"""A per-operation timing hook for the forward pass: set `Transformer.timer` to an `OpTimer` and every
kernel call adds its wall time to a row named after the operation (`rmsnorm`, `attention`, ...) or,
for a matmul, after the tensor it reads (`blk.3.attn_q.weight`).

Why a hook: tools (colibri-bench profile) measure without replacing engine functions at run time.
Off (None) it costs one attribute test per call. Times are exclusive: a timed call inside another
is not counted twice.
"""
from __future__ import annotations

import time
from collections import defaultdict
from typing import Any, Callable


class OpTimer:
    """label -> seconds and calls, accumulated over every forward pass it is attached to."""

    def __init__(self) -> None:
        self.spent: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self._inner: list[float] = []  # time of timed calls nested in each running one

    def start(self) -> float:
        self._inner.append(0.0)
        return time.perf_counter()

    def stop(self, label: str, t0: float) -> None:
        elapsed = time.perf_counter() - t0
        nested = self._inner.pop()
        self.spent[label] += elapsed - nested
        self.calls[label] += 1
        if self._inner:
            self._inner[-1] += elapsed

    def call(self, label: str, fn: Callable[..., Any], *args: Any) -> Any:
        t0 = self.start()
        try:
            return fn(*args)
        finally:
            self.stop(label, t0)

    def reset(self) -> None:
        self.spent.clear()
        self.calls.clear()


class Kernels:
    """A module of kernels whose every function, looked up through this, is timed under its own name."""

    def __init__(self, module: Any, timer: OpTimer) -> None:
        self._module, self._timer = module, timer

    def __getattr__(self, name: str) -> Any:
        fn = getattr(self._module, name)
        if not callable(fn):
            return fn
        return lambda *args: self._timer.call(name, fn, *args)
