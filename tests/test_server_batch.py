"""colibri-serve's continuous batching (app.server_jobs.BatchScheduler) with real parts: the
default model, uvicorn on a free port, the official openai client. Concurrent requests share
decode steps, and each stream is what the same seeded request gives alone."""
from __future__ import annotations

import threading
import time

import openai
import pytest

from app import server as S
from engine.api import Engine

QUESTIONS = ["Name three colours.", "What is 2 + 2?", "Write a haiku about the sea."]


@pytest.fixture(scope="module")
def engine(default_converted):
    eng = Engine(default_converted, threads=2, kv_cache_quantize="f16", context_length=512)
    yield eng
    eng.close()


@pytest.fixture
def widths(monkeypatch):
    """How many sequences each decode step ran (the real step: this only records; warm-up steps aside)."""
    seen: list[int] = []
    real = Engine.decode

    def decode(self, tokens, caches, routes=None, warmup=False):
        if not warmup:
            seen.append(len(tokens))
        return real(self, tokens, caches, routes, warmup)
    monkeypatch.setattr(Engine, "decode", decode)
    return seen


def ask(client, model: str, i: int, out: dict, max_tokens: int = 24) -> None:
    text = ""
    for chunk in client.chat.completions.create(model=model, messages=[{"role": "user", "content": QUESTIONS[i]}],
                                                max_tokens=max_tokens, temperature=0.8, seed=100 + i, stream=True):
        if chunk.choices and chunk.choices[0].delta.content:
            text += chunk.choices[0].delta.content
    out[i] = text


def test_concurrent_streams_share_steps_and_each_equals_its_request_alone(engine, widths):
    handle = S.start(engine, "127.0.0.1", 0, limits=S.Limits(slots=3))
    try:
        client = openai.OpenAI(base_url=handle.url, api_key="x", max_retries=0, timeout=300)
        alone: dict = {}
        for i in range(3):
            ask(client, handle.model_id, i, alone)
        assert max(widths) == 1
        widths.clear()
        together: dict = {}
        threads = [threading.Thread(target=ask, args=(client, handle.model_id, i, together)) for i in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
        assert together == alone and all(alone.values())
        assert max(widths) >= 2  # the streams shared decode steps
    finally:
        handle.stop()


def test_a_client_that_leaves_frees_its_slot_and_the_others_go_on(engine):
    handle = S.start(engine, "127.0.0.1", 0, limits=S.Limits(slots=2))
    try:
        client = openai.OpenAI(base_url=handle.url, api_key="x", max_retries=0, timeout=300)
        want: dict = {}
        ask(client, handle.model_id, 1, want, max_tokens=40)
        leaving = client.chat.completions.create(model=handle.model_id, max_tokens=400, stream=True,
                                                 messages=[{"role": "user", "content": "Count to 1000."}])
        got: dict = {}
        other = threading.Thread(target=ask, args=(client, handle.model_id, 1, got, 40))
        for n, _ in enumerate(leaving):
            if n == 3:
                other.start()
            if n == 8:
                break
        leaving.close()  # the client goes away mid-stream
        sched = handle.service.scheduler
        deadline = time.monotonic() + 30
        while len(sched.active) > (1 if other.is_alive() else 0):
            assert time.monotonic() < deadline, "the vanished client still holds its slot"
            time.sleep(0.02)
        other.join(300)
        assert got == want
    finally:
        handle.stop()


def test_a_chat_reply_runs_while_requests_are_served(engine):
    handle = S.start(engine, "127.0.0.1", 0, limits=S.Limits(slots=2))
    try:
        client = openai.OpenAI(base_url=handle.url, api_key="x", max_retries=0, timeout=300)
        chat = [{"role": "user", "content": "Hi"}]
        alone_chat = "".join(s.text for s in engine.generate(chat, temperature=0.0, max_tokens=30))
        want: dict = {}
        ask(client, handle.model_id, 0, want, max_tokens=30)
        got: dict = {}
        served = threading.Thread(target=ask, args=(client, handle.model_id, 0, got, 30))
        served.start()
        while handle.service.scheduler.running is None and served.is_alive():
            time.sleep(0.01)
        reply = "".join(s.text for s in engine.generate(chat, temperature=0.0, max_tokens=30))  # the GUI's path
        served.join(300)
        assert reply == alone_chat and got == want
    finally:
        handle.stop()


SECRET = [{"role": "user", "content": "My bank PIN is 4821 and the vault code is 7719; keep both to yourself."}]


def test_the_windows_chats_never_prefix_a_served_request(engine):
    """The prefix cache leaked prompts: a served request's cached_tokens counted the positions it
    shared with the window's chat (or another key's requests), one guessed token at a time. Now
    entries are per tenant: a request reuses, and reports, only its own caller's prefixes."""
    from app.server_jobs import local_steps
    handle = S.start(engine, "127.0.0.1", 0)
    try:
        window = list(local_steps(handle.service.scheduler, SECRET, {"max_tokens": 1, "temperature": 0.0},
                                  threading.Event()))
        client = openai.OpenAI(base_url=handle.url, api_key="x", max_retries=0, timeout=300)
        probe = client.chat.completions.create(model=handle.model_id, messages=SECRET, max_tokens=1, temperature=0)
        assert probe.usage.prompt_tokens == window[-1].prompt_tokens > 8
        assert probe.usage.prompt_tokens_details.cached_tokens == 0, "the window's chat served a request"
        again = client.chat.completions.create(model=handle.model_id, messages=SECRET, max_tokens=1, temperature=0)
        assert again.usage.prompt_tokens_details.cached_tokens > 0  # a caller's own prefix still helps it
        window = list(local_steps(handle.service.scheduler, SECRET, {"max_tokens": 1, "temperature": 0.0},
                                  threading.Event()))
        assert window[-1].cached_tokens > 0  # and the window's own
    finally:
        handle.stop()


def test_prefix_entries_are_kept_per_tenant(engine):
    from engine.batch import Batcher
    batcher = Batcher(engine, 8 << 20)
    reused = {}
    for tenant in ("key-a", "key-b", "key-a"):
        seq = batcher.open(SECRET[0]["content"], tenant=tenant, max_tokens=1, temperature=0.0)
        seq.prefill()
        reused.setdefault(tenant, []).append(seq.reused)
        seq.close()
    assert reused == {"key-a": [0, reused["key-a"][1]], "key-b": [0]} and reused["key-a"][1] > 0


def test_idle_spare_kv_caches_are_released(engine):
    """The scheduler keeps the KV caches of finished requests for the next ones, but once idle
    it gives their pages back instead of holding them for the server's life."""
    before = engine.pool.stats().allocated
    handle = S.start(engine, "127.0.0.1", 0, limits=S.Limits(spare_idle_s=0.5))
    try:
        client = openai.OpenAI(base_url=handle.url, api_key="x", max_retries=0, timeout=300)
        client.completions.create(model=handle.model_id, prompt="one two three four", max_tokens=2)
        spares = handle.service.scheduler.batcher.spares
        deadline = time.monotonic() + 10
        while len(spares) or engine.pool.stats().allocated > before:
            assert time.monotonic() < deadline, f"{len(spares)} idle spare caches still held"
            time.sleep(0.05)
        client.completions.create(model=handle.model_id, prompt="one two three four", max_tokens=2)  # still serves
    finally:
        handle.stop()


def test_the_chat_window_replies_through_the_scheduler_while_it_serves(qapp, engine, widths):
    """Serving on, the GUI's reply (EngineWorker.generate) joins the served requests' decode steps
    (BatchScheduler), streams, is what it is alone, and its Stop ends it with the partial text."""
    from PySide6.QtCore import Qt

    from app.worker import EngineWorker
    chat = [{"role": "user", "content": "Hi"}]
    alone_chat = "".join(s.text for s in engine.generate(chat, temperature=0.0, max_tokens=30))
    worker = EngineWorker()
    worker.engine = engine
    worker.serve(True, 0)
    texts, replies, failed = [], [], []
    direct = Qt.DirectConnection  # emitted on this test's threads, where no event loop runs
    worker.text.connect(lambda r, t, s: texts.append(t), direct)
    worker.finished.connect(lambda r, reply: replies.append(reply), direct)
    worker.failed.connect(lambda what, why: failed.append(why), direct)
    try:
        client = openai.OpenAI(base_url=worker.server.url, api_key="x", max_retries=0, timeout=300)
        want: dict = {}
        ask(client, worker.server.model_id, 2, want, max_tokens=60)
        widths.clear()
        got: dict = {}
        served = threading.Thread(target=ask, args=(client, worker.server.model_id, 2, got, 60))
        served.start()
        while worker.server.service.scheduler.running is None and served.is_alive():
            time.sleep(0.01)
        worker.arm()
        worker.generate(1, chat, {"temperature": 0.0, "max_tokens": 30})
        served.join(300)
        assert not failed and replies[-1].text == alone_chat == "".join(texts) and got == want
        assert max(widths) >= 2  # the chat's reply and the served request shared decode steps
        texts.clear()
        worker.text.connect(lambda r, t, s: worker.request_stop() if t else None, direct)
        worker.arm()
        worker.generate(2, chat, {"temperature": 0.0, "max_tokens": 400})
        stopped = replies[-1]
        assert stopped.step.finish_reason == "cancelled" and 0 < stopped.step.generated_tokens < 400
        assert stopped.text == "".join(texts) and alone_chat.startswith(stopped.text[:8])
        deadline = time.monotonic() + 10
        while worker.server.service.scheduler.active:  # its slot is freed at the end of that step
            assert time.monotonic() < deadline, "the stopped reply still holds its slot"
            time.sleep(0.01)
    finally:
        worker.serve(False, 0)


def test_the_gui_runs_its_replies_and_the_served_requests_on_one_thread(qapp, engine, monkeypatch):
    """Every forward pass of the GUI's worker — a reply alone, then with serving on a served
    request and a reply in the same steps — runs on its EngineThread: one OpenMP team (libgomp
    keeps one per thread that ran a parallel kernel), not the QThread's beside the scheduler's."""
    from PySide6.QtCore import Qt

    from app.worker import EngineWorker
    seen: list[threading.Thread] = []
    forward = engine.net.forward  # every pass, a reply's or a batched step's, is the one decoder loop's
    monkeypatch.setattr(engine.net, "forward", lambda *a, **k: (seen.append(threading.current_thread()),
                                                               forward(*a, **k))[1])
    worker = EngineWorker()
    worker.engine = engine
    replies: list = []
    worker.finished.connect(lambda r, reply: replies.append(reply), Qt.DirectConnection)
    chat = [{"role": "user", "content": "Hi"}]
    worker.arm()
    worker.generate(1, chat, {"temperature": 0.0, "max_tokens": 8})
    alone = len(seen)
    worker.serve(True, 0)
    try:
        client = openai.OpenAI(base_url=worker.server.url, api_key="x", max_retries=0, timeout=300)
        served = threading.Thread(target=ask, args=(client, worker.server.model_id, 0, {}, 40))
        served.start()
        worker.arm()
        worker.generate(2, chat, {"temperature": 0.0, "max_tokens": 8})
        served.join(300)
    finally:
        worker.serve(False, 0)
        worker.close()
    assert len(replies) == 2 and replies[0].text == replies[1].text and replies[0].text
    assert 0 < alone < len(seen)
    assert {t.name for t in seen} == {"colibri-engine"} and len(set(seen)) == 1

