"""The thread tuner (engine.contention): fewer threads only where timed steps say so, back up when
the cores are free again, nothing tried on a quiet machine; the governor and the engine feed it."""
from __future__ import annotations

import numpy as np
import pytest

from engine.contention import BACKOFF_S, WINDOW, OtherLoad, ThreadTuner
from engine.throttle import ThermalGovernor


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


class Machine:
    """Made-up step times per thread count, and the CPUs other programs use."""

    def __init__(self, cost: dict[int, float], others: float = 0.0):
        self.cost, self.others = cost, others


def tuner() -> tuple[ThreadTuner, Clock, Machine]:
    clock, m = Clock(), Machine(QUIET_COST)
    return ThreadTuner(clock, lambda: m.others), clock, m


def run(t: ThreadTuner, clock: Clock, m: Machine, steps: int, limit: int = 2, rows: int = 1) -> list[int]:
    """`steps` decode steps at m's costs; the thread counts used, in order."""
    used = []
    for _ in range(steps):
        n = t.threads(limit)
        s = m.cost[n]
        clock.t += s
        t.observe(n, s, rows)
        used.append(n)
    return used


QUIET_COST = {1: 3.2e-3, 2: 2.2e-3}  # two threads decode faster than one
BUSY_COST = {1: 3.3e-3, 2: 9.0e-3}  # another program on one core: two threads stall at every barrier


def test_a_quiet_machine_keeps_every_thread_and_tries_nothing():
    t, clock, m = tuner()
    m.cost = {1: 3.2e-3, 2: 9e-3}  # however slow the steps (a neighbour's memory traffic): no program, no try
    assert set(run(t, clock, m, 50 * WINDOW)) == {2}


def test_another_program_and_fewer_threads_faster_drops_a_thread():
    t, clock, m = tuner()
    run(t, clock, m, 4 * WINDOW)
    m.cost, m.others = BUSY_COST, 0.7
    used = run(t, clock, m, 6 * WINDOW)
    assert t.count == 1 and used[-1] == 1
    assert used.index(1) <= 2 * WINDOW  # found within a few windows


class Spent:
    """The others' CPU seconds so far, read as OtherLoad reads /proc/stat: the CPUs they used on
    average since the previous reading."""

    def __init__(self, clock: Clock):
        self.clock, self.total, self._last = clock, 0.0, None

    def __call__(self) -> float | None:
        now = (self.clock(), self.total)
        last, self._last = self._last, now
        return None if last is None or now[0] <= last[0] else (now[1] - last[1]) / (now[0] - last[0])


def test_others_busy_only_while_this_process_was_stopped_or_idle_start_no_trial():
    """As in a duel (this process SIGSTOPped while the other decodes) or between replies: the first
    reading after the pause spans it and is not taken for contention now; the same load met while
    decoding is."""
    clock, m = Clock(), Machine(QUIET_COST)
    spent = Spent(clock)
    t = ThreadTuner(clock, spent)

    def decode(seconds: float, others: float, stopped: float = 0.0) -> list[int]:
        """Steps for `seconds`; the first one stopped for `stopped` s while the others use both cores."""
        used = []
        while seconds > 0:
            n = t.threads(2)
            clock.t += m.cost[n] + stopped
            spent.total += others * m.cost[n] + 2 * stopped
            t.observe(n, m.cost[n] + stopped)
            seconds -= m.cost[n]
            used.append(n)
            stopped = 0.0
        return used
    decode(0.5, 0.0)
    used = []
    for _ in range(6):  # 2 s stopped in a step, then 2 s of decode with the cores free
        used += decode(2.0, 0.0, stopped=2.0)
    assert set(used) == {2}
    m.cost = BUSY_COST  # the same others while decoding: a thread fewer is tried, and kept
    assert decode(1.0, 1.0)[-1] == 1


def test_another_program_that_fewer_threads_do_not_beat_keeps_the_count():
    """A light program beside us (a client of our server): two threads still win; tries grow rare."""
    t, clock, m = tuner()
    m.others = 0.7
    used = run(t, clock, m, int(40 / QUIET_COST[2]))
    tries = sum(1 for a, b in zip(used, used[1:]) if a == 2 and b == 1)
    assert t.count == 2 and used[-1] == 2
    assert 3 <= tries <= 7, tries  # after 1, 2, 4, 8, 16 s
    assert used.count(1) <= tries * WINDOW


def test_the_others_gone_bring_every_thread_back_at_once():
    t, clock, m = tuner()
    m.cost, m.others = BUSY_COST, 1.0
    run(t, clock, m, 6 * WINDOW)
    assert t.count == 1
    m.cost, m.others = QUIET_COST, 0.0
    used = run(t, clock, m, 8 * WINDOW)  # the others' load is read every PROBE_S
    assert t.count == 2 and used[-1] == 2


def test_still_busy_tries_one_more_thread_ever_more_rarely():
    t, clock, m = tuner()
    m.cost, m.others = BUSY_COST, 1.0
    run(t, clock, m, 6 * WINDOW)
    used = run(t, clock, m, int(40 / BUSY_COST[1]))
    tries = sum(1 for a, b in zip(used, used[1:]) if a == 1 and b == 2)
    assert t.count == 1
    assert 3 <= tries <= 7, tries
    assert used.count(2) <= tries * 2  # a stalling try ends after a step


def test_a_light_load_where_more_threads_pay_again_goes_back_up():
    t, clock, m = tuner()
    m.cost, m.others = BUSY_COST, 1.0
    run(t, clock, m, 6 * WINDOW)
    m.cost, m.others = QUIET_COST, 0.4  # the other program calmed down, but not to nothing
    clock.t += BACKOFF_S[1]
    used = run(t, clock, m, 12 * WINDOW)
    assert t.count == 2 and used[-1] == 2


def test_a_stalled_trial_step_ends_the_trial_at_once():
    t, clock, m = tuner()
    m.cost, m.others = BUSY_COST, 1.0
    run(t, clock, m, 6 * WINDOW)
    clock.t += 2 * BACKOFF_S[0]
    m.cost = {1: 3.3e-3, 2: 0.2}
    used = run(t, clock, m, 8 * WINDOW)
    assert used.count(2) == 1 and t.count == 1


def test_batched_steps_are_compared_at_their_own_row_count():
    t, clock, m = tuner()
    m.others = 0.7
    m.cost = {1: 8 * 3.3e-3, 2: 8 * 2.2e-3}
    run(t, clock, m, 2 * WINDOW, rows=8)
    m.cost = {1: 1e-4, 2: 1e-4}
    run(t, clock, m, WINDOW, rows=1)  # lone steps, far faster: no rival for a step of 8 rows
    m.cost = {1: 8 * 3.3e-3, 2: 8 * 2.2e-3}
    assert set(run(t, clock, m, 10 * WINDOW, rows=8)[-WINDOW:]) == {2}


def test_a_new_limit_starts_over():
    t, clock, m = tuner()
    m.cost, m.others = BUSY_COST, 1.0
    run(t, clock, m, 6 * WINDOW)
    assert t.count == 1
    assert t.threads(4) == 4 and t.trial is None


def test_the_governor_records_each_change_and_obeys_the_switch():
    clock, load = Clock(), [1.0]
    g = ThermalGovernor(2, clock=clock, wall_clock=lambda: 0.0)
    g.tuner = ThreadTuner(clock, lambda: load[0])
    for _ in range(6 * WINDOW):
        n = g.update()
        clock.t += BUSY_COST[n]
        g.observe(n, BUSY_COST[n])
    assert g.threads == 1 and g.limit == 2
    (event,) = g.events
    assert (event.from_threads, event.to_threads) == (2, 1)
    assert "other programs share the cores" in event.reason and "at 1 thread" in event.reason
    g.tuning = False
    assert g.update() == 2 and g.threads == 2
    g.observe(2, 1.0)  # off: nothing is tuned
    assert len(g.events) == 1


def _others_cpu_s() -> float:
    """CPU seconds used so far by every process but this one (psutil, process by process)."""
    import os

    import psutil
    total = 0.0
    for proc in psutil.process_iter():
        if proc.pid == os.getpid():
            continue
        try:
            t = proc.cpu_times()
            total += t.user + t.system
        except psutil.Error:
            pass
    return total


def test_the_others_load_is_measured():
    """OtherLoad sees a busy child process and leaves this process's own work out: it agrees with
    the other processes' CPU time counted one by one (beside whatever else the machine runs)."""
    import subprocess
    import sys
    import time
    probe = OtherLoad()
    probe()
    child = subprocess.Popen([sys.executable, "-c", "import time\nt = time.time()\nwhile time.time() - t < 1.5: pass"])
    try:
        time.sleep(1.0)
        busy = probe()
    finally:
        child.wait()
    assert busy is not None and busy > 0.4  # the child, even sharing the cores
    probe()
    before, t0, c0 = _others_cpu_s(), time.monotonic(), time.process_time()
    while time.process_time() - c0 < 0.6:  # our own work
        pass
    mine = probe()
    counted = (_others_cpu_s() - before) / (time.monotonic() - t0)
    assert mine is not None and abs(mine - counted) < 0.35, (mine, counted)


@pytest.mark.parametrize("tuning", [True, False])
def test_the_engine_times_its_decode_steps(default_converted, tuning):
    """Each decoded token reaches the tuner (generate() and forward()); a prompt does not."""
    from engine.api import Engine
    eng = Engine(default_converted, threads=1, context_length=64, thread_tuning=tuning)
    seen: list[tuple] = []
    observe = eng.hw.governor.observe
    eng.hw.governor.observe = lambda *a: (seen.append(a), observe(*a))
    try:
        eng.forward([1, 2, 3, 4])
        assert seen == []
        eng.forward([5])
        assert len(seen) == 1
        tokens = sum(1 for s in eng.generate("Hi", max_tokens=4, temperature=0) if s.kind == "token")
        assert tokens - 1 <= len(seen) - 1 <= tokens  # each token after the prompt's first (and the last fed back)
        assert all(a[0] == 1 and a[1] > 0 for a in seen)
        assert eng.hw.governor.tuning is tuning
        eng.set_param("thread_tuning", not tuning)
        assert eng.hw.governor.tuning is (not tuning)
    finally:
        eng.close()
    assert np.isfinite([a[1] for a in seen]).all()
