"""Slowdown under load: decode far below this model's own measured speed while other programs keep
the CPU busy.

`SlowdownWatch` is pure logic fed by the worker: the model's speed is learned from replies written
while the machine was quiet; during a reply, a recent decode rate under `SLOW` of it while other
programs use more than `BUSY` of the CPUs is a slowdown, said in plain words and answered with a
thread cap, lifted once the other programs calm down (engine.contention.OtherLoad measures them).
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass


SLOW = 0.5  # a decode rate below half of the model's own speed is a slowdown...
BUSY = 0.5  # ...when other programs use more than half of the CPUs
QUIET = 0.25  # the model's own speed is learned only while they use less than a quarter
WINDOW_S = 2.0  # the recent rate is measured over this many seconds of decoding
MIN_TOKENS = 8  # and over at least this many tokens


@dataclass(frozen=True)
class Slowdown:
    """A detected slowdown: what the status line says, and the thread count that fits the free CPUs."""
    rate: float  # tok/s now
    usual: float  # tok/s this model decodes at on a quiet machine
    others: float  # CPUs other programs keep busy
    cpus: int
    threads: int  # the cap: at most the CPUs left free (at least 1)

    def explain(self) -> str:
        return (f"decode {self.rate:.1f} tok/s, {self.usual:.1f} usually: other programs use {self.others:.1f} of "
                f"{self.cpus} CPUs; now {self.threads} thread{'s' if self.threads != 1 else ''}")


class SlowdownWatch:
    """Per model: its quiet-machine decode speed, and the current reply's verdict."""

    def __init__(self, cpus: int):
        self.cpus = max(1, cpus)
        self.usual: dict[str, float] = {}  # model -> tok/s on a quiet machine (the best reply seen)
        self._recent: deque[tuple[float, int]] = deque()
        self.active: Slowdown | None = None

    def start_reply(self) -> None:
        self._recent.clear()

    def rate(self, t: float, generated: int) -> float | None:
        """The decode rate over the last WINDOW_S seconds, or the last MIN_TOKENS tokens where those
        took longer (None until there are MIN_TOKENS)."""
        self._recent.append((t, generated))
        while len(self._recent) > 2 and t - self._recent[1][0] >= WINDOW_S and generated - self._recent[1][1] >= \
                MIN_TOKENS:
            self._recent.popleft()
        t0, n0 = self._recent[0]
        if generated - n0 < MIN_TOKENS or t <= t0:
            return None
        return (generated - n0) / (t - t0)

    def learn(self, model: str, rate: float, generated: int, others: float | None) -> None:
        """A finished reply: its rate is this model's own when the machine was quiet."""
        if others is not None and others < QUIET * self.cpus and generated >= MIN_TOKENS and rate > 0:
            self.usual[model] = max(rate, self.usual.get(model, 0.0))

    def check(self, model: str, rate: float | None, others: float | None) -> Slowdown | None:
        """The verdict now: a Slowdown while decode is far below usual and the machine busy;
        None when all is well (a slowdown ends when the others calm down or decode recovers)."""
        usual = self.usual.get(model)
        if rate is None or others is None or usual is None:
            return self.active
        if rate < SLOW * usual and others > BUSY * self.cpus:
            threads = max(1, int(self.cpus - others + 0.5))
            self.active = Slowdown(rate, usual, others, self.cpus, threads)
        elif self.active is not None and others < QUIET * self.cpus:  # not on recovery alone: the cap did that
            self.active = None
        return self.active

    def react(self, governor, model: str, rate: float | None, others: float | None) -> str | None:
        """Check, and cap or free the governor's threads to match: the status line's new words
        ("" once the slowdown is over), or None when nothing changed."""
        was = self.active
        now = self.check(model, rate, others)
        if now is not None:
            if governor.load_cap != now.threads:
                governor.set_load_cap(now.threads, now.explain())
            return now.explain() if was is None or (was.threads, round(was.rate)) != (now.threads, round(now.rate)) \
                else None
        if was is not None or governor.load_cap is not None:
            governor.set_load_cap(None, f"other programs use {others or 0:.1f} of {self.cpus} CPUs again")
            return ""
        return None
