"""Fewer threads while other programs share the cores, chosen by timing decode steps.

Why: an OpenMP team waits at every barrier for its slowest thread, and a thread whose core another
program takes stalls the whole team each time the OS preempts it, while on a quiet machine more
threads win. So the count is measured, never assumed: decode steps are timed in windows of WINDOW
steps. After a window, while other programs keep at least BUSY CPUs busy, one thread fewer is tried
for a window and kept when its median step is BETTER; while fewer, one more is tried the same way;
a try that loses waits twice as long before the next. Once the others use less than QUIET CPUs,
every thread comes back at once. Only other programs' CPU time starts a try: step times alone are
no guide on a shared VM, where the neighbours' memory traffic moves a window's median. Pure logic
with an injectable clock and load probe, fed the decode steps the engine times (never prompts).
"""
from __future__ import annotations

import os
import time
from collections.abc import Callable

import psutil

WINDOW = 8  # decode steps per timed window
BUSY = 0.3  # CPUs other programs use that make a try at one thread fewer worth it
QUIET = 0.15  # CPUs other programs use below which every thread comes back
BETTER = 0.9  # a tried count is kept when its median step is at most this share of the other's
GIVE_UP = 2.0  # a trial step slower than this many times the median it competes with ends the trial
BACKOFF_S = (1.0, 16.0)  # the wait before the next try after one that lost, doubling
PROBE_S = 0.1  # the others' CPU use is read at most this often
# A reading that spans more than STALE times the decoding done since the previous one (plus PROBE_S)
# covers mostly time this process was idle between replies or stopped: what the others did then
# says nothing of the cores while it decodes (colibri-bench duel stops it every other 2 s), and
# the reading starts the next one over.
STALE = 2.0


class OtherLoad:
    """CPUs other processes kept busy since the previous call (None on the first)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self.clock, self.cpus = clock, psutil.cpu_count() or os.cpu_count() or 1
        self.me = psutil.Process()
        self._last: tuple[float, float, float] | None = None

    def __call__(self) -> float | None:
        t = self.clock()
        times = psutil.cpu_times()
        busy = times.user + times.system + getattr(times, "nice", 0.0) + getattr(times, "irq", 0.0) + \
            getattr(times, "softirq", 0.0) + getattr(times, "steal", 0.0)
        own = sum(self.me.cpu_times()[:2])
        last, self._last = self._last, (t, busy, own)
        if last is None or t - last[0] <= 0:
            return None
        return max(0.0, ((busy - last[1]) - (own - last[2])) / (t - last[0]))


class ThreadTuner:
    """The thread count for the next decode step, at most `limit` (less what heat or a cap hold back)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, others: Callable[[], float | None] | None = None):
        self._clock = clock
        self._others = others if others is not None else OtherLoad(clock)
        self.limit = 0  # the most threads allowed: a change starts the tuning over
        self.count = 0  # threads chosen
        self.trial: tuple[int, int] | None = None  # (count on trial, count it competes with)
        self._last: dict[tuple[int, int], float] = {}  # (threads, rows) -> its latest window's median
        self._window: list[float] = []
        self._key: tuple[int, int] | None = None  # the (threads, rows) of the steps in the window
        self._backoff = BACKOFF_S[0]
        self._next_try = 0.0
        self._probed = -PROBE_S
        self._decoded = 0.0  # seconds of decode steps since the last reading

    def threads(self, limit: int) -> int:
        """Threads for the next step."""
        if limit != self.limit:
            self.limit, self.count, self.trial = limit, limit, None
            self._last.clear()
            self._window.clear()
            self._backoff, self._next_try = BACKOFF_S[0], 0.0
        return self.trial[0] if self.trial is not None else self.count

    def observe(self, threads: int, seconds: float, rows: int = 1) -> str | None:
        """A decode step of `rows` sequences took `seconds` on `threads`: why the count changed, or None."""
        key = (threads, rows)
        typical = self._last.get(key)  # (a step the process was stopped in counts as a few typical ones)
        self._decoded += seconds if typical is None else min(seconds, 4 * typical)
        if key != self._key:
            self._window.clear()
            self._key = key
        if self.trial is not None and threads == self.trial[0]:
            rival = self._last.get((self.trial[1], rows))
            if rival is not None and seconds > GIVE_UP * rival:  # a trial that stalls ends at once
                return self._end_trial(False, seconds, rival, rows)
        self._window.append(seconds)
        if len(self._window) < WINDOW:
            return None
        median = sorted(self._window)[WINDOW // 2]
        self._window.clear()
        self._last[key] = median
        if self.trial is not None:
            if threads != self.trial[0]:
                return None
            rival = self._last.get((self.trial[1], rows))
            return self._end_trial(rival is not None and median <= BETTER * rival, median, rival, rows)
        if threads != self.count:
            return None
        now = self._clock()
        if now - self._probed < PROBE_S:
            return None
        span, decoded = now - self._probed, self._decoded
        self._probed, self._decoded = now, 0.0
        others = self._others()  # (cheap: /proc/stat and this process's times)
        if others is None or span > STALE * decoded + PROBE_S:  # (idle or stopped for most of it)
            return None
        if threads < self.limit and others < QUIET:
            self.count, self._backoff, self._next_try = self.limit, BACKOFF_S[0], 0.0
            return f"other programs use {others:.2f} CPUs: back to {self.limit} threads"
        if now < self._next_try:
            return None
        if threads > 1 and others >= BUSY:
            self.trial = (threads - 1, threads)
        elif threads < self.limit:
            self.trial = (threads + 1, threads)
        return None

    def _end_trial(self, won: bool, median: float, rival: float | None, rows: int) -> str | None:
        tried, before = self.trial
        self.trial = None
        self._window.clear()
        if not won:  # try again later, ever later while it keeps losing
            self._next_try = self._clock() + self._backoff
            self._backoff = min(2 * self._backoff, BACKOFF_S[1])
            return None
        self.count = tried
        self._backoff = BACKOFF_S[0]
        self._next_try = self._clock() + self._backoff
        per = f" per step of {rows} sequences" if rows > 1 else " a token"
        why = "other programs share the cores" if tried < before else "more threads pay again"
        return (f"decode {1e3 * median:.1f} ms{per} at {tried} thread{'s' if tried != 1 else ''}, "
                f"{1e3 * rival:.1f} at {before}: {why}")
