"""The engine worker: its plain bodies without threads, then the QObject on a real QThread."""
from __future__ import annotations

import threading
import types

import pytest
from conftest import HF_FIXTURES

from app import worker as W
from engine.api import Engine
from engine.convert.convert import convert

pytestmark = pytest.mark.qt_log_level_fail("WARNING")
CHAT = [{"role": "user", "content": "Hello there, how are you?"}]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return convert(HF_FIXTURES / "qwen2", tmp_path_factory.mktemp("worker") / "qwen2", "keep").path


@pytest.fixture(scope="module")
def engine(tiny):
    eng = Engine(tiny, threads=1)
    yield eng
    eng.close()


def test_stream_reply_batches_text_per_frame(engine):
    calls = []
    reply = W.stream_reply(engine, CHAT, {"max_tokens": 12, "temperature": 0}, threading.Event(),
                           lambda t, s: calls.append((t, s)), frame_s=1e9)
    assert len(calls) == 1  # the frame never ended: everything comes in one batch at the end
    assert "".join(t for t, _ in calls) == reply.text
    assert reply.step.finish_reason == "length" and reply.step.generated_tokens == 12
    every = []
    W.stream_reply(engine, CHAT, {"max_tokens": 12, "temperature": 0}, threading.Event(),
                   lambda t, s: every.append(t), frame_s=0)
    assert "".join(every) == reply.text and len(every) >= 12


def test_stop_takes_effect_within_one_token(engine):
    stop = threading.Event()
    stop.set()
    reply = W.stream_reply(engine, CHAT, {"max_tokens": 200, "temperature": 0}, stop, lambda t, s: None)
    assert reply.step.finish_reason == "cancelled" and reply.step.generated_tokens <= 2


def test_a_full_context_drops_the_oldest_exchanges(tiny):
    eng = Engine(tiny, threads=1, context_length=64)
    try:
        long = [{"role": "system", "content": "Be brief."}]
        for i in range(4):
            long += [{"role": "user", "content": f"question {i} " + "word " * 12},
                     {"role": "assistant", "content": "answer " * 8}]
        long.append({"role": "user", "content": "last"})
        reply = W.stream_reply(eng, long, {"max_tokens": 2, "temperature": 0}, threading.Event(), lambda t, s: None)
        assert reply.dropped >= 2 and reply.step is not None
        assert reply.plan.dropped[0] == 1 and reply.step.prompt_tokens == reply.plan.tokens <= 64 - 8
        short_start = long[:1] + [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}] + long[1:]
        keep = W.stream_reply(eng, short_start, {"max_tokens": 2, "temperature": 0}, threading.Event(),
                              lambda t, s: None, policy="keep_first")
        assert keep.plan.keep[:3] == (0, 1, 2) and keep.dropped >= 2 and keep.step.prompt_tokens == keep.plan.tokens
        with pytest.raises(W.ContextFullError, match="policy is to stop at the limit"):
            W.stream_reply(eng, long, {}, threading.Event(), lambda t, s: None, policy="stop")
        with pytest.raises(W.ContextFullError, match="shorten the message"):
            W.stream_reply(eng, [{"role": "user", "content": "word " * 80}], {}, threading.Event(), lambda t, s: None)
    finally:
        eng.close()


def test_fit_check_counts_weights_and_kv_cache(tiny):
    r = W.check_fit(tiny, {"context_length": 256, "kv_cache_quantize": "f32"}, available=1 << 40)
    assert r.fits and r.weights_bytes > 0 and r.expert_cache_bytes == 0
    r16 = W.check_fit(tiny, {"context_length": 256, "kv_cache_quantize": "f16"}, available=1 << 40)
    assert r16.kv_cache_bytes * 2 == r.kv_cache_bytes
    small = W.check_fit(tiny, {}, available=1000)
    assert not small.fits
    assert "0.00 GB is free" in small.explain() and "KV cache" in small.explain()


@pytest.fixture
def threaded(qtbot):
    """A worker on its own thread, and a front whose signals reach its slots queued (as the GUI's do)."""
    from PySide6.QtCore import QObject, QThread, Signal

    class Front(QObject):  # lives on the test's (GUI) thread: answers reach it queued
        load = Signal(str, dict, bool)
        generate = Signal(int, list, dict)
        loaded, text, finished = Signal(object), Signal(int, str, object), Signal(int, object)
        failed, wont_fit = Signal(str, str), Signal(object, str)
    th = QThread()
    wk = W.EngineWorker()
    wk.moveToThread(th)
    wk.front = front = Front()
    front.load.connect(wk.load)
    front.generate.connect(wk.generate)
    for name in ("loaded", "text", "finished", "failed", "wont_fit"):
        getattr(wk, name).connect(getattr(front, name))
    th.start()
    yield wk
    from PySide6.QtCore import QMetaObject, Qt
    wk.request_stop()
    QMetaObject.invokeMethod(wk, "close", Qt.BlockingQueuedConnection)
    th.quit()
    th.wait()


def test_worker_on_its_thread_loads_streams_and_stops(qtbot, threaded, tiny):
    front = threaded.front
    with qtbot.waitSignal(front.loaded, timeout=60_000) as loaded:
        front.load.emit(str(tiny), {"threads": 1}, False)
    assert loaded.args[0].model == "qwen2"
    texts = []
    front.text.connect(lambda req, t, s: texts.append((req, t)))
    with qtbot.waitSignal(front.finished, timeout=60_000) as done:
        front.generate.emit(7, CHAT, {"max_tokens": 8, "temperature": 0})
    req, reply = done.args
    assert req == 7 and reply.step.generated_tokens == 8
    assert "".join(t for _, t in texts) == reply.text and {r for r, _ in texts} == {7}
    threaded.arm()  # as the GUI does before it queues a request; a Stop pressed after it still counts
    with qtbot.waitSignal(front.finished, timeout=60_000) as done:
        front.generate.emit(8, CHAT, {"max_tokens": 10_000, "temperature": 0})
        threaded.request_stop()
    assert done.args[1].step.finish_reason == "cancelled" and done.args[1].step.generated_tokens <= 2


def test_worker_errors_and_fit_failures_are_signals(qtbot, threaded, tiny, tmp_path, monkeypatch):
    with qtbot.waitSignal(threaded.front.failed, timeout=30_000) as failed:
        threaded.front.load.emit(str(tmp_path / "nowhere"), {}, False)
    assert failed.args[0] == "Loading nowhere" and "model directory not found" in failed.args[1]
    monkeypatch.setattr(W.psutil, "virtual_memory", lambda: types.SimpleNamespace(available=1000))
    with qtbot.waitSignal(threaded.front.wont_fit, timeout=30_000) as nofit:
        threaded.front.load.emit(str(tiny), {}, False)
    assert not nofit.args[0].fits and nofit.args[1] == str(tiny)
    with qtbot.waitSignal(threaded.front.failed, timeout=30_000) as failed:
        threaded.front.generate.emit(1, CHAT, {})
    assert "no model is loaded" in failed.args[1]


def test_the_chats_policy_rides_with_its_sampling(tiny):
    """generate(request, messages, sampling) takes the chat's context policy from sampling's
    CONTEXT_POLICY (beside the sampler's values, which never see it)."""
    wk = W.EngineWorker()
    wk.engine = Engine(tiny, threads=1, context_length=64)
    failed, finished = [], []
    wk.failed.connect(lambda what, why: failed.append(why))
    wk.finished.connect(lambda r, reply: finished.append(reply))
    try:
        long = [{"role": "user", "content": "word " * 30}, {"role": "assistant", "content": "ok " * 20},
                {"role": "user", "content": "last"}]
        wk.generate(1, long, {"max_tokens": 2, "temperature": 0, W.CONTEXT_POLICY: "stop"})
        assert "policy is to stop at the limit" in failed[-1] and finished[-1].step is None
        wk.generate(2, long, {"max_tokens": 2, "temperature": 0, W.CONTEXT_POLICY: "drop_oldest"})
        assert finished[-1].dropped == 2 and finished[-1].plan.keep == (2,) and len(failed) == 1
    finally:
        wk.engine.close()
