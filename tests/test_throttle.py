"""Thermal governor on a scripted temperature sequence with an injected clock; CPU pinning on a
fake topology, applied for real to one helper thread."""
from __future__ import annotations

import logging
import os
import threading

import pytest

from engine.throttle import Affinity, ThermalGovernor, ThrottleEvent, _parse_cpu_list, physical_core_cpus


class Script:
    """A clock and a temperature source: each reading pops the next scripted temperature."""

    def __init__(self, temps):
        self.t, self.temps, self.reads = 0.0, list(temps), 0

    def clock(self) -> float:
        return self.t

    def temperature(self):
        self.reads += 1
        return self.temps.pop(0)


def governor(script: Script, threads: int = 4) -> ThermalGovernor:
    return ThermalGovernor(threads, high_c=85, low_c=75, interval_s=2.0, temperature=script.temperature,
                           clock=script.clock, wall_clock=script.clock)


def test_hysteresis_one_thread_per_interval_between_1_and_configured(caplog):
    caplog.set_level(logging.INFO, logger="colibri.hardware")
    temps = [90, 91, 95, 96, 97, 80, 70, 72, 74, 74, 86]
    s = Script(temps)
    g = governor(s)
    counts = []
    for i in range(len(temps)):
        s.t = 2.0 * i
        counts.append(g.update())
        s.t += 1.0  # consulted again within the interval: no reading, no change
        assert g.update() == counts[-1] and s.reads == i + 1
    assert counts == [3, 2, 1, 1, 1, 1, 2, 3, 4, 4, 3]
    assert [(e.time, e.from_threads, e.to_threads, e.temp_c) for e in g.events] == [
        (0.0, 4, 3, 90), (2.0, 3, 2, 91), (4.0, 2, 1, 95), (12.0, 1, 2, 70), (14.0, 2, 3, 72),
        (16.0, 3, 4, 74), (20.0, 4, 3, 86)]
    assert g.events[0].reason == "90.0 °C is above the high-water mark 85 °C"
    assert g.events[3].reason == "70.0 °C is below the low-water mark 75 °C"
    records = [r for r in caplog.records if r.name == "colibri.hardware"]
    assert len(records) == 7 and records[0].levelno == logging.WARNING and records[3].levelno == logging.INFO
    assert records[0].getMessage() == ("thermal throttle: threads 4 -> 3 (of 4): "
                                       "90.0 °C is above the high-water mark 85 °C")


def test_between_the_marks_nothing_changes():
    s = Script([84.9, 75.0, 85.0, 80])
    g = governor(s, threads=2)
    for i in range(4):
        s.t = 10.0 * i
        assert g.update() == 2
    assert g.events == () and not g.throttled and g.last_temp_c == 80


def test_no_sensor_keeps_the_count_and_says_so_once(caplog):
    caplog.set_level(logging.DEBUG, logger="colibri.hardware")
    s = Script([None, None, None])
    g = governor(s)
    for i in range(3):
        s.t = 5.0 * i
        assert g.update() == 4
    assert g.events == () and [r.getMessage() for r in caplog.records] == [
        "no CPU temperature reading: thermal throttling is idle"]


def test_user_thread_changes_while_throttled():
    s = Script([99, 99])
    g = governor(s, threads=4)
    assert g.update() == 3 and g.throttled
    g.configure(8)  # more wanted: stay throttled at 3, may climb back to 8
    assert (g.threads, g.configured) == (3, 8)
    g.configure(2)  # fewer than now: follow down at once
    assert (g.threads, g.configured, g.throttled) == (2, 2, False)
    g.configure(6)  # not throttled: follow
    assert g.threads == 6
    with pytest.raises(ValueError, match="threads: 0"):
        g.configure(0)


def test_marks_must_leave_a_gap():
    with pytest.raises(ValueError, match=r"throttle_low_c \(85 °C\) must be below throttle_high_c"):
        ThermalGovernor(4, high_c=80, low_c=85)
    g = ThermalGovernor(4)
    g.set_limits(95, 90)
    assert (g.high_c, g.low_c) == (95.0, 90.0)
    with pytest.raises(ValueError):
        ThermalGovernor(0)


def test_events_are_bounded():
    s = Script([99, 70] * 10)
    g = ThermalGovernor(2, temperature=s.temperature, clock=s.clock, interval_s=1.0, max_events=5)
    for i in range(20):
        s.t = float(i)
        g.update()
    assert len(g.events) == 5 and isinstance(g.events[-1], ThrottleEvent)


# --- pinning -----------------------------------------------------------------------------------
def topology(root, siblings: dict[int, str], name: str = "core_cpus_list"):
    for cpu, text in siblings.items():
        d = root / f"cpu{cpu}" / "topology"
        d.mkdir(parents=True)
        (d / name).write_text(text + "\n")


def test_one_cpu_per_physical_core(tmp_path):
    topology(tmp_path, {0: "0,4", 1: "1,5", 2: "2,6", 3: "3,7", 4: "0,4", 5: "1,5", 6: "2,6", 7: "3,7"})
    assert physical_core_cpus(range(8), tmp_path) == [0, 1, 2, 3]
    assert physical_core_cpus({4, 5, 2}, tmp_path) == [2, 4, 5]
    topology(tmp_path / "old", {0: "0-1", 1: "0-1", 2: "2-3", 3: "2-3"}, "thread_siblings_list")
    assert physical_core_cpus(range(4), tmp_path / "old") == [0, 2]
    assert physical_core_cpus([0, 1], tmp_path / "none") == [0, 1]  # unreadable topology: own core each
    assert _parse_cpu_list("0-3,8,10-11\n") == [0, 1, 2, 3, 8, 10, 11]


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="Linux only")
def test_affinity_pins_and_restores_a_real_thread(tmp_path):
    """The real sched_setaffinity on one helper thread: the fake task list names only it."""
    result = {}

    def body():
        allowed = os.sched_getaffinity(0)
        topology(tmp_path / "cpu", {c: ",".join(map(str, sorted(allowed))) for c in allowed})  # one core
        (tmp_path / "task").mkdir()
        (tmp_path / "task" / str(threading.get_native_id())).mkdir()
        a = Affinity(tmp_path / "cpu", tmp_path / "task")
        result["status"] = a.apply(True, threads=4)
        result["pinned"] = os.sched_getaffinity(0)
        result["off"] = a.apply(False, threads=4)
        result["restored"], result["allowed"] = os.sched_getaffinity(0), allowed

    main_before = os.sched_getaffinity(0)
    t = threading.Thread(target=body)
    t.start()
    t.join()
    first = min(result["allowed"])
    assert result["status"] == f"pinned to CPU {first}" and result["pinned"] == {first}
    assert result["off"] == "off" and result["restored"] == result["allowed"]
    assert os.sched_getaffinity(0) == main_before
