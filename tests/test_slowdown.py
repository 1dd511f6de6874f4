"""Defect 9: decode far below the model's own speed while other programs take the CPU is detected,
said, and answered by the thread governor with fewer threads (and the cap lifted once it is over)."""
import logging

import pytest

from app.slowdown import SlowdownWatch
from engine.contention import OtherLoad
from engine.throttle import ThermalGovernor

MODEL = "/models/qwen"


def test_the_governor_caps_threads_for_load_and_lifts_the_cap(caplog):
    g = ThermalGovernor(4, temperature=lambda: 60.0, wall_clock=lambda: 1.0)
    with caplog.at_level(logging.WARNING, "colibri.hardware"):
        g.set_load_cap(1, "other programs use 3.1 of 4 CPUs")
    assert g.threads == 1 and g.update() == 1 and g.load_cap == 1 and not g.throttled
    assert "load: threads 4 -> 1 (of 4): other programs use 3.1" in caplog.text
    e = g.events[-1]
    assert (e.from_threads, e.to_threads, e.reason) == (4, 1, "other programs use 3.1 of 4 CPUs")
    g.set_load_cap(9, "more than configured")  # never above the configured count
    assert g.threads == 4 and g.load_cap == 4
    g.set_load_cap(None, "calm again")
    assert g.threads == 4 and g.load_cap is None
    hot = ThermalGovernor(4, temperature=lambda: 99.0, interval_s=60, clock=lambda: 0.0)
    assert hot.update() == 3  # one step down for heat (the next check is a minute away)
    hot.set_load_cap(2, "busy")
    assert hot.threads == 2 and hot.update() == 2  # the lower of heat's and load's counts
    hot.set_load_cap(None, "calm")
    assert hot.threads == hot.update() == 3  # heat still holds it down


def feed(w: SlowdownWatch, rate: float, seconds: float, t0: float = 0.0, n0: int = 0):
    """Tokens at `rate` for `seconds`, one step per token; the last recent rate."""
    w.start_reply() if n0 == 0 else None
    got = None
    for i in range(1, int(rate * seconds) + 1):
        got = w.rate(t0 + i / rate, n0 + i)
    return got


def test_slow_decode_under_load_is_detected_capped_and_lifted():
    w = SlowdownWatch(cpus=2)
    g = ThermalGovernor(2)
    assert w.react(g, MODEL, feed(w, 36.0, 3), others=1.8) is None  # no speed known yet: nothing to compare
    w.learn(MODEL, 36.0, 100, others=0.1)  # a reply on a quiet machine teaches the model's speed
    w.learn(MODEL, 5.0, 100, others=1.9)  # a busy one does not
    assert w.usual[MODEL] == 36.0
    rate = feed(w, 2.5, 8)
    assert rate == pytest.approx(2.5, rel=0.05)
    said = w.react(g, MODEL, rate, others=1.8)
    assert said.startswith("decode 2.5 tok/s, 36.0 usually: other programs use 1.8 of 2 CPUs; now 1 thread")
    assert g.threads == 1 and g.load_cap == 1
    assert w.react(g, MODEL, rate, others=1.8) is None  # said once, not every second
    assert w.react(g, MODEL, 30.0, others=1.2) is None and g.threads == 1  # recovered by the cap: kept
    assert w.react(g, MODEL, 30.0, others=0.2) == "" and g.threads == 2 and g.load_cap is None  # calm: lifted
    assert w.react(g, MODEL, 30.0, others=0.2) is None


def test_a_slow_machine_that_is_not_busy_is_not_a_slowdown():
    w = SlowdownWatch(cpus=2)
    g = ThermalGovernor(2)
    w.learn(MODEL, 36.0, 100, others=0.0)
    assert w.react(g, MODEL, 3.0, others=0.3) is None and g.threads == 2  # slow, but not because of others
    assert w.react(g, MODEL, 30.0, others=1.9) is None and g.threads == 2  # busy, but decode is fine


def test_the_recent_rate_needs_enough_tokens_and_forgets_old_ones():
    w = SlowdownWatch(cpus=2)
    w.start_reply()
    assert [w.rate(t / 10, t) for t in range(1, 8)] == [None] * 7  # fewer than 8 tokens
    fast = feed(w, 40.0, 3)
    slow = feed(w, 4.0, 4, t0=3.0, n0=120)
    assert fast == pytest.approx(40.0, rel=0.05) and slow == pytest.approx(4.0, rel=0.1)  # the window moved on


def test_other_load_measures_cpus_used_by_others():
    load = OtherLoad()
    assert load() is None  # the first call starts the interval
    sum(i * i for i in range(200_000))  # our own work is not "others"
    v = load()
    assert v is None or 0.0 <= v <= load.cpus + 0.5


def test_the_worker_says_it_and_caps_the_engine_while_generating(qtbot, tmp_path):
    """The real worker body and engine: a model known to decode far faster, a machine whose other
    programs use 1.9 of 2 CPUs: `slowed` says why and the engine's governor runs 1 thread."""
    from conftest import HF_FIXTURES

    from app import worker as W
    from engine.convert.convert import convert
    tiny = convert(HF_FIXTURES / "qwen2", tmp_path / "qwen2", "keep").path
    wk = W.EngineWorker()
    wk.engine = W.open_engine(tiny, {"threads": 2}, force=True)
    try:
        wk.others_load = lambda: 1.9
        wk.watch = SlowdownWatch(cpus=2)
        wk.watch.usual[str(wk.engine.model.path)] = 1e9  # "usually" impossibly fast: any real rate is slow
        said = []
        wk.slowed.connect(said.append)
        for n in range(1, 40):  # steps as the reply loop emits them; the load "sampled a second later" each time
            wk._load_at = -1e9
            wk._watch(reply_step(n))
        assert said and said[0].startswith("decode ") and "other programs use 1.9 of 2 CPUs; now 1 thread" in said[0]
        assert wk.engine.threads == 1 and wk.engine.stats().throttle_events[-1].to_threads == 1
        wk.others_load = lambda: 0.1
        wk._load_at = -1e9
        wk._watch(reply_step(41))
        assert said[-1] == "" and wk.engine.threads == 2
    finally:
        wk.engine.close()


def reply_step(n: int):
    from engine.api import Step
    return Step("x", 1, n, 12, 0, 900.0, 30.0, 0.25, 12 + n, 4096)
