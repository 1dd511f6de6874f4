"""generate() faults that lose work or hang: an abandoned generator, Stop during the prompt,
prompt progress, a context that fills mid-reply."""
from __future__ import annotations

import threading

import pytest
from conftest import HF_FIXTURES

from engine.api import Engine
from engine.convert.convert import convert

PROMPT = "one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen"


@pytest.fixture(scope="module")
def dense(tmp_path_factory):
    return convert(HF_FIXTURES / "llama", tmp_path_factory.mktemp("dense") / "m", "keep").path


@pytest.fixture(scope="module")
def moe(tmp_path_factory):
    return convert(HF_FIXTURES / "qwen3_moe", tmp_path_factory.mktemp("moe") / "m", "keep").path


class CountingEvent(threading.Event):
    """Reports set from its n-th check on: a Stop that arrives in the middle of a computation."""

    def __init__(self, n: int):
        super().__init__()
        self.n, self.checks = n, 0

    def is_set(self) -> bool:
        self.checks += 1
        return self.checks >= self.n


def run_in_thread(fn, timeout: float = 60.0):
    """fn() on another thread; fails (instead of hanging the suite) if it blocks."""
    out: dict = {}
    t = threading.Thread(target=lambda: out.setdefault("value", fn()), daemon=True)
    t.start()
    t.join(timeout)
    assert not t.is_alive(), f"{fn} blocked: the engine lock was still held"
    return out.get("value")


def test_an_abandoned_generator_blocks_nothing(dense):
    eng = Engine(dense)
    gen = eng.generate(PROMPT, temperature=0, max_tokens=50)
    first = next(gen)
    assert first.finish_reason is None
    run_in_thread(lambda: eng.set_param("temperature", 0.5))
    run_in_thread(lambda: eng.set_param("kv_cache_quantize", "f32"))  # rebuilds the cache
    assert run_in_thread(lambda: eng.forward(eng.tokenize("hello"))) is not None
    rest = list(gen)  # resumed after others used the cache: it ends, touching nothing
    assert len(rest) == 1 and rest[-1].finish_reason == "cancelled" and rest[-1].text == ""
    assert eng.tokens == eng.tokenize("hello") and eng.cache.length == len(eng.tokens)
    again = eng.generate(PROMPT, temperature=0, max_tokens=2)
    next(again)
    del again  # dropped mid-reply: its cleanup accounts for it, and the lock is free
    run_in_thread(eng.close)


def test_a_second_generate_supersedes_a_suspended_one(dense):
    eng = Engine(dense)
    a = eng.generate(PROMPT, temperature=0, max_tokens=50)
    next(a)
    b = list(eng.generate("other words", temperature=0, max_tokens=3))
    assert b[-1].finish_reason == "length"
    assert list(a)[-1].finish_reason == "cancelled"
    assert eng.cache.length == len(eng.tokens)
    assert eng.stats().tokens_generated >= 4


def test_prompt_progress_and_stop_between_chunks(dense):
    eng = Engine(dense, batch_size=4)
    n = len(eng.tokenize(PROMPT))
    steps = list(eng.generate(PROMPT, temperature=0, max_tokens=2, prompt_progress=True))
    prompt = [s for s in steps if s.kind == "prompt"]
    assert [s.prompt_done for s in prompt] == list(range(4, n, 4))
    assert all(s.text == "" and s.token_id is None and s.prompt_tokens == n for s in prompt)
    assert steps[-1].kind == "token" and steps[-1].prompt_done == n and steps[-1].finish_reason == "length"
    assert not any(s.kind == "prompt" for s in eng.generate(PROMPT + " x", temperature=0, max_tokens=1))

    eng.reset()
    gen = eng.generate(PROMPT, temperature=0, max_tokens=20, prompt_progress=True)
    assert next(gen).kind == "prompt"
    eng.stop()  # as the worker does when a prompt Step arrives after Stop was pressed
    rest = list(gen)
    assert len(rest) == 1 and rest[0].finish_reason == "cancelled" and rest[0].generated_tokens == 0
    assert rest[0].prompt_done == 4 == eng.cache.length == len(eng.tokens)  # the work done is kept
    after = list(eng.generate(PROMPT, temperature=0, max_tokens=1))
    assert after[-1].cached_tokens == 4  # and reused by the next turn


def test_cancel_event_stops_inside_one_prefill_pass(moe):
    eng = Engine(moe)
    eng.generate("warm", temperature=0, max_tokens=1)  # never iterated: nothing happens
    stop = CountingEvent(3)  # the chunk check passes, then layer 0; layer 1's check stops it
    steps = list(eng.generate(PROMPT, temperature=0, max_tokens=20, cancel=stop))
    assert len(steps) == 1 and steps[0].finish_reason == "cancelled" and steps[0].generated_tokens == 0
    assert stop.checks == 3 and eng.cache.length == 0 and eng.tokens == []
    steps = list(eng.generate(PROMPT, temperature=0, max_tokens=3))  # the engine is intact
    assert steps[-1].finish_reason == "length" and steps[-1].generated_tokens == 3


def test_cancel_event_between_tokens(moe):
    eng = Engine(moe)
    stop = threading.Event()
    gen = eng.generate("Tell", temperature=0, max_tokens=10_000, cancel=stop)
    next(gen)
    stop.set()
    assert list(gen)[-1].finish_reason == "cancelled"


def test_context_full_is_its_own_finish_reason(dense):
    eng = Engine(dense, context_length=24)
    last = list(eng.generate("x " * 8, temperature=0, max_tokens=500, stop=["never"]))[-1]
    assert last.finish_reason == "context" and last.length_limited and last.context_used <= 24
    last = list(eng.generate("x " * 8, temperature=0, max_tokens=2))[-1]
    assert last.finish_reason == "length" and last.length_limited
