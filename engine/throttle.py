"""Thermal throttling of the engine's thread count, and optional thread pinning.

`ThermalGovernor` is consulted before each forward step: above a high-water temperature it drops
one thread per interval, below a low-water mark (the gap is the hysteresis) it gives one back, never
below 1 nor above the configured count. Every change is logged and kept as a `ThrottleEvent`.

Other programs taking the CPU are the other reason for fewer threads: an OpenMP team with more
threads than free cores waits at every barrier for the one the OS preempted. The engine times its
decode steps (`observe`) and keeps fewer threads where they decode faster (engine.contention);
the app can also cap the count with `set_load_cap`.

Pinning (`Affinity`, the `affinity` parameter, off by default) restricts the process to one
logical CPU per physical core: hyper-threads sharing a core only fight over its caches.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from engine.contention import ThreadTuner

log = logging.getLogger("colibri.hardware")


@dataclass(frozen=True)
class ThrottleEvent:
    """One change of the thread count made by the governor."""
    time: float  # wall clock (time.time()) of the change
    from_threads: int
    to_threads: int
    temp_c: float
    reason: str


class ThermalGovernor:
    """The thread count the engine may use now, lowered while the CPU is too hot."""

    def __init__(self, configured_threads: int, high_c: float = 85.0, low_c: float = 75.0,
                 interval_s: float = 2.0, *, temperature: Callable[[], float | None] = lambda: None,
                 clock: Callable[[], float] = time.monotonic, wall_clock: Callable[[], float] = time.time,
                 max_events: int = 1000):
        if configured_threads < 1:
            raise ValueError(f"threads: {configured_threads} (the governor needs at least 1)")
        self.set_limits(high_c, low_c)
        self.interval_s = interval_s
        self._temperature, self._clock, self._wall = temperature, clock, wall_clock
        self._configured = self._threads = configured_threads
        self._next_check: float | None = None
        self._events: deque[ThrottleEvent] = deque(maxlen=max_events)
        self._lock = threading.Lock()
        self._said_no_sensor = False
        self.last_temp_c: float | None = None
        self._load_cap: int | None = None  # at most this many threads while other programs take the CPU
        self.tuner = ThreadTuner(clock)
        self.tuning = True  # the `thread_tuning` parameter

    @property
    def limit(self) -> int:
        """The most threads allowed: the configured count unless throttled (heat) or capped (load)."""
        return self._threads if self._load_cap is None else min(self._threads, self._load_cap)

    @property
    def threads(self) -> int:
        """The thread count in use: the limit, or fewer where the tuner measured fewer decode faster."""
        limit = self.limit
        return min(limit, self.tuner.count) if self.tuning and self.tuner.limit == limit else limit

    def observe(self, threads: int, seconds: float, rows: int = 1) -> None:
        """A decode step of `rows` sequences took `seconds` on `threads`: the tuner's evidence."""
        if not self.tuning:
            return
        with self._lock:
            before = self.threads
            reason = self.tuner.observe(threads, seconds, rows)
            if reason is None:
                return
            after = self.threads
            temp = self.last_temp_c if self.last_temp_c is not None else float("nan")
            self._events.append(ThrottleEvent(self._wall(), before, after, temp, reason))
        log.info("threads %d -> %d (of %d): %s", before, after, self._configured, reason)

    def _next(self) -> int:
        """The count for the next step (a trial count while the tuner compares two); lock held."""
        return self.tuner.threads(self.limit) if self.tuning else self.limit

    @property
    def load_cap(self) -> int | None:
        return self._load_cap

    def set_load_cap(self, threads: int | None, reason: str) -> None:
        """Use at most `threads` while other programs take the CPU (None: the cap is lifted)."""
        with self._lock:
            before = self.threads
            self._load_cap = None if threads is None else max(1, min(int(threads), self._configured))
            after = self.threads
            if after != before:
                temp = self.last_temp_c if self.last_temp_c is not None else float("nan")
                self._events.append(ThrottleEvent(self._wall(), before, after, temp, reason))
                log.log(logging.WARNING if after < before else logging.INFO, "load: threads %d -> %d (of %d): %s",
                        before, after, self._configured, reason)

    @property
    def configured(self) -> int:
        return self._configured

    @property
    def throttled(self) -> bool:
        return self._threads < self._configured

    @property
    def events(self) -> tuple[ThrottleEvent, ...]:
        """Every change so far, oldest first (the last `max_events`)."""
        with self._lock:
            return tuple(self._events)

    def set_limits(self, high_c: float, low_c: float) -> None:
        """New high/low-water marks; low must be below high, or there is no hysteresis."""
        if not low_c < high_c:
            raise ValueError(f"throttle_low_c ({low_c:g} °C) must be below throttle_high_c ({high_c:g} °C)")
        self.high_c, self.low_c = float(high_c), float(low_c)

    def configure(self, threads: int) -> None:
        """The user's thread count changed: follow it, but stay throttled if we are."""
        if threads < 1:
            raise ValueError(f"threads: {threads} (the governor needs at least 1)")
        with self._lock:
            self._threads = threads if not self.throttled else min(self._threads, threads)
            self._configured = threads

    def update(self) -> int:
        """Consult the temperature (at most once per interval); the thread count to use now."""
        now = self._clock()
        with self._lock:
            if self._next_check is not None and now < self._next_check:
                return self._next()
            self._next_check = now + self.interval_s
        temp = self._temperature()  # outside the lock: a sensor read can take milliseconds
        with self._lock:
            if temp is None:
                if not self._said_no_sensor:  # HardwareMonitor logs the sensor's reason at INFO
                    log.debug("no CPU temperature reading: thermal throttling is idle")
                    self._said_no_sensor = True
                return self._next()
            self.last_temp_c = temp
            n = self._threads
            if temp > self.high_c and n > 1:
                self._change(n - 1, temp, f"{temp:.1f} °C is above the high-water mark {self.high_c:g} °C")
            elif temp < self.low_c and n < self._configured:
                self._change(n + 1, temp, f"{temp:.1f} °C is below the low-water mark {self.low_c:g} °C")
            return self._next()

    def _change(self, to: int, temp: float, reason: str) -> None:
        event = ThrottleEvent(self._wall(), self._threads, to, temp, reason)
        self._events.append(event)
        self._threads = to
        level = logging.WARNING if to < event.from_threads else logging.INFO
        log.log(level, "thermal throttle: threads %d -> %d (of %d): %s", event.from_threads, to,
                self._configured, reason)


# --- thread pinning ----------------------------------------------------------------------------
CPU_SYSFS = Path("/sys/devices/system/cpu")


def physical_core_cpus(allowed: Iterable[int], cpu_root: Path | str = CPU_SYSFS) -> list[int]:
    """One logical CPU per physical core (the lowest-numbered sibling), among `allowed`, from each
    CPU's topology/core_cpus_list (or thread_siblings_list); an unreadable topology is its own core."""
    root, seen, out = Path(cpu_root), set(), []
    for cpu in sorted(allowed):
        topo = root / f"cpu{cpu}" / "topology"
        siblings = None
        for name in ("core_cpus_list", "thread_siblings_list"):
            try:
                siblings = frozenset(_parse_cpu_list((topo / name).read_text()))
                break
            except (OSError, ValueError):
                continue
        key = siblings or frozenset([cpu])
        if key not in seen:
            seen.add(key)
            out.append(cpu)
    return out


def _parse_cpu_list(text: str) -> list[int]:
    """ "0-3,8,10-11" -> [0, 1, 2, 3, 8, 10, 11]"""
    cpus: list[int] = []
    for part in text.strip().split(","):
        if "-" in part:
            a, b = part.split("-")
            cpus += range(int(a), int(b) + 1)
        elif part:
            cpus.append(int(part))
    return cpus


class Affinity:
    """Pins every thread of this process (numba's OpenMP workers too) to one CPU per physical core."""

    def __init__(self, cpu_root: Path | str = CPU_SYSFS, task_root: Path | str = "/proc/self/task"):
        self.cpu_root, self.task_root = Path(cpu_root), Path(task_root)
        self._original: set[int] | None = None
        self.status = "off"

    def apply(self, enabled: bool, threads: int) -> str:
        """Pin to `threads` physical cores (enabled) or restore the original mask; a status line."""
        if not hasattr(os, "sched_setaffinity"):
            self.status = "not available: this OS has no sched_setaffinity" if enabled else "off"
            return self.status
        if self._original is None:
            self._original = set(os.sched_getaffinity(0))
        if enabled:
            cpus = set(physical_core_cpus(self._original, self.cpu_root)[:max(1, threads)])
            what = f"pinned to CPU {', '.join(map(str, sorted(cpus)))}"
        else:
            cpus, what = self._original, "off"
        try:
            pin(cpus, self.task_root)
        except OSError as e:
            self.status = f"not available: sched_setaffinity refused ({e.strerror or e})"
            log.warning("affinity: %s", self.status)
            return self.status
        self.status = what
        log.info("affinity: %s", what)
        return what


def pin(cpus: set[int], task_root: Path | str | None = None) -> None:
    """Set the CPU mask of the calling thread (task_root None), or of every thread under task_root."""
    if task_root is None:
        os.sched_setaffinity(0, cpus)
        return
    for task in Path(task_root).iterdir():
        try:
            os.sched_setaffinity(int(task.name), cpus)
        except ProcessLookupError:  # the thread ended meanwhile
            pass
