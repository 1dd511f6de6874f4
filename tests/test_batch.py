"""Continuous batching's engine side (engine.batch) against the single-sequence path: N
sequences per forward pass, each on its own KV cache, give what each gets decoded alone."""
from __future__ import annotations

import numpy as np
import pytest
from conftest import HF_FIXTURES

from engine.api import Engine
from engine.batch import Batcher, PrefixCache
from engine.models.rows import decode_batch, expert_bytes
from engine.convert.convert import convert
from engine.kernels import cpu
from engine.kvcache import KVCache
from engine.models import fused as fused_module

PROMPTS = [[1, 5, 9, 14, 3, 7], [2, 8], [4, 4, 6, 10, 12, 3, 9, 1, 5, 2, 11], [7], [13, 2, 5], [3, 3, 3, 9],
           [6, 1], [12, 11, 10, 9, 8, 7, 6], [5, 5]]
FORCED = [[11, 2, 30, 4, 17], [5, 6, 7, 8, 9], [21, 1, 3, 3, 2], [9, 9, 8, 1, 4], [2, 4, 6, 8, 10], [1, 2, 1, 2, 1],
          [3, 14, 15, 9, 2], [6, 5, 3, 5, 8], [9, 7, 9, 3, 2]]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root, made = tmp_path_factory.mktemp("batch"), {}

    def get(name: str, quantize: str, kv: str = "f16") -> Engine:
        if (name, quantize) not in made:
            made[(name, quantize)] = convert(HF_FIXTURES / name, root / f"{name}-{quantize}", quantize).path
        return Engine(made[(name, quantize)], kv_cache_quantize=kv, context_length=64)
    return get


def new_cache(eng: Engine) -> KVCache:
    c = eng.cfg
    return KVCache(c.num_layers, 64, c.num_kv_heads, c.head_dim, eng.params["kv_cache_quantize"], eng.pool)


def alone(eng: Engine, n: int) -> list[np.ndarray]:
    """Each sequence decoded by itself: its prompt, then its forced tokens one at a time."""
    out = []
    for prompt, forced in zip(PROMPTS[:n], FORCED[:n]):
        cache = new_cache(eng)
        rows = [eng.net.forward(np.array(prompt), cache, 0)]
        rows += [eng.net.forward(np.array([t]), cache, cache.length) for t in forced]
        out.append(np.concatenate(rows))
    return out


def together(eng: Engine, n: int, routes: list | None = None) -> list[np.ndarray]:
    """The same sequences: prompts one at a time, then every decode step in one pass."""
    caches = [new_cache(eng) for _ in range(n)]
    rows = [[eng.net.forward(np.array(p), c, 0)] for p, c in zip(PROMPTS[:n], caches)]
    for j in range(len(FORCED[0])):
        logits = decode_batch(eng.net, [f[j] for f in FORCED[:n]], caches, routes)
        for i in range(n):
            rows[i].append(logits[i:i + 1])
    return [np.concatenate(r) for r in rows]


@pytest.mark.parametrize("name,weights,kv,n", [("llama", "int4", "f16", 3), ("llama", "int4", "int8", 6),
                                                 ("qwen2", "int4", "f16", 6), ("qwen3", "int4", "int8", 4),
                                                 ("llama", "int8", "f16", 5), ("llama", "int4", "f16", 9),
                                                 ("llama", "int8", "int8", 8)])
@pytest.mark.parametrize("fused", [True, False])
def test_a_dense_batch_is_each_sequence_alone_bit_for_bit(models, monkeypatch, name, weights, kv, n, fused):
    """Through the batched one-call kernel (decode_rows; qwen2: q/k/v biases, qwen3: q/k norms;
    with AVX-512, 4-row blocks over two 8-row groups at once for q4/q8_0 weights, 8-row blocks from 8
    rows on) and through the layered path, each row is its sequence decoded alone, bit for bit."""
    eng = models(name, weights, kv)
    assert n <= len(PROMPTS) and cpu.INT_MAX_T == 3  # 6 rows: one call of the fused integer kernels
    calls = []
    real = fused_module.decode_rows if fused else (lambda *a: calls.append(a))
    monkeypatch.setattr(fused_module, "decode_rows", lambda *a: (calls.append(a), real(*a))[1] if fused else real(*a))
    if not fused:
        monkeypatch.setattr(fused_module.FusedDecode, "rows", lambda *a: None)
    for a, b in zip(alone(eng, n), together(eng, n)):
        np.testing.assert_array_equal(a, b)
    assert len(calls) == (len(FORCED[0]) if fused else 0)  # every step took the path asked for


def test_stats_name_a_batched_steps_route(models):
    """A step of N sequences is named in Engine.stats().route: the one call of a dense model, or
    layer by layer where the rows are grouped by expert."""
    dense, moe = models("llama", "int4"), models("mixtral", "int8")
    together(dense, 3)
    assert dense.stats().route == "fused rows (3 sequences)"
    together(moe, 4)
    assert moe.stats().route == "layered (4 sequences with experts)"


@pytest.mark.parametrize("preset", ["q4_0", "q8_0"])
def test_a_batch_of_a_llama_cpp_gguf_is_each_sequence_alone_bit_for_bit(tmp_path, preset):
    """The same on GGUFs llama.cpp's quantize wrote (q4_0 and q8_0 layers, imported as stored)."""
    from conftest import TESTS
    gguf = TESTS / "fixtures" / "llamacpp_presets" / f"tiny-{preset}.gguf"
    eng = Engine(convert(gguf, tmp_path / preset, "keep").path, context_length=64)
    if eng.net.fused is None or not eng.net.fused.dense:
        pytest.skip(f"{gguf.name} does not take the fused decode")
    vocab = eng.cfg.vocab_size
    for a, b in zip(alone(eng, 5), together(eng, 5)):
        assert a.shape[1] == vocab
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("name", ["mixtral", "qwen3_moe"])
def test_an_moe_batch_groups_experts_and_matches_alone(models, name):
    eng = models(name, "int8")
    routes: list = []
    ref, got = alone(eng, 6), together(eng, 6, routes)
    for a, b in zip(ref, got):
        if eng.cfg.top_k == 2:  # two experts add the same in either order
            np.testing.assert_array_equal(a, b)
        np.testing.assert_allclose(b, a, rtol=0, atol=1e-5 * np.abs(a).max())
        np.testing.assert_array_equal(a.argmax(-1), b.argmax(-1))
    assert len(routes) == len(FORCED[0]) * eng.cfg.num_layers
    assert all(ids.shape == (6, eng.cfg.top_k) for _, ids in routes)
    grouped, each = expert_bytes(eng.net, routes)
    assert each == 6 * eng.cfg.top_k * len(FORCED[0]) * eng.cfg.num_layers * eng.net.w.store.span(0, 0).nbytes
    assert grouped < each  # six rows over few experts: some are shared, read once
    span = eng.net.w.store.span(0, 0).nbytes  # every expert's size here
    assert grouped == span * sum(len(np.unique(ids)) for _, ids in routes)  # the fused kernel: once per step


def test_bad_batches_are_refused(models):
    eng = models("llama", "int4")
    c = new_cache(eng)
    with pytest.raises(ValueError, match="one cache per token"):
        decode_batch(eng.net, [1, 2], [c])
    with pytest.raises(ValueError, match="share one KV cache"):
        decode_batch(eng.net, [1, 2], [c, c])
    c.length = c.capacity
    with pytest.raises(ValueError, match="full"):
        decode_batch(eng.net, [1], [c])


def test_batched_replies_equal_generate_alone(models):
    eng = models("qwen3_moe", "int8")
    batcher = Batcher(eng, prefix_bytes=0)
    requests = [("Once upon", {"temperature": 0.0}), ("The sky", {"temperature": 0.9, "seed": 3}),
                ("A B C", {"temperature": 0.7, "top_k": 5, "seed": 11})]
    want = ["".join(s.text for s in eng.generate(p, max_tokens=6, **kw)) for p, kw in requests]
    seqs = [batcher.open(p, max_tokens=6, **kw) for p, kw in requests]
    text = [s.feed(s.prefill()).text for s in seqs]
    while any(s.finish is None for s in seqs):
        live = [i for i, s in enumerate(seqs) if s.finish is None]
        logits = batcher.step([seqs[i] for i in live])
        for row, i in enumerate(live):
            text[i] += seqs[i].feed(logits[row]).text
    assert text == want
    assert all(s.finish == "length" and s.generated == 6 for s in seqs)


def test_a_shared_system_prompt_skips_its_prefill_and_keeps_the_tokens(models):
    eng = models("llama", "int8")
    system = [{"role": "system", "content": "You are a terse assistant who answers in one word."}]
    first = system + [{"role": "user", "content": "Hello"}]
    second = system + [{"role": "user", "content": "Goodbye"}]
    batcher = Batcher(eng, prefix_bytes=1 << 20)

    def reply(messages) -> tuple[list[int], int]:
        s = batcher.open(messages, max_tokens=5, temperature=0.0)
        toks = [s.feed(s.prefill()).token_id]
        while s.finish is None:
            toks.append(s.feed(batcher.step([s])).token_id)
        s.close()
        return toks, s.reused

    a, reused_a = reply(first)
    b, reused_b = reply(second)
    assert reused_a == 0
    ids_a, ids_b = eng.prompt_ids(first), eng.prompt_ids(second)
    shared = next(i for i, (x, y) in enumerate(zip(ids_a, ids_b)) if x != y)
    assert shared > 10 and reused_b == shared  # the system prompt was copied, not run
    fresh = Batcher(eng, prefix_bytes=0)
    s = fresh.open(second, max_tokens=5, temperature=0.0)
    want = [s.feed(s.prefill()).token_id]
    while s.finish is None:
        want.append(s.feed(fresh.step([s])).token_id)
    assert b == want and s.reused == 0


def test_the_prefix_cache_stays_within_its_bytes(models):
    eng = models("llama", "int8")
    cache = new_cache(eng)
    eng.net.forward(np.arange(1, 21), cache, 0)
    per_token = sum(a[:, :1].nbytes for a in (cache.k, cache.v))
    lru = PrefixCache(per_token * 30)
    lru.store(list(range(1, 21)), cache)
    lru.store(list(range(1, 16)), cache)  # 35 positions > 30: the older entry goes
    assert len(lru) == 1 and lru.bytes == 15 * per_token
    fresh = new_cache(eng)
    assert lru.restore(list(range(1, 11)) + [99], fresh) == 7  # 4 tokens left to prefill
    np.testing.assert_array_equal(fresh.k[:, :7], cache.k[:, :7])
    assert lru.restore([5, 6], new_cache(eng)) == 0


def test_a_prompt_read_in_chunks_is_the_prompt_read_whole(models):
    eng = models("llama", "int8")
    eng.set_param("batch_size", 4)
    try:
        batcher = Batcher(eng, prefix_bytes=0)
        prompt = "one two three four five six seven eight nine ten eleven"
        whole, steps = batcher.open(prompt, max_tokens=2), batcher.open(prompt, max_tokens=2)
        want = whole.prefill()
        got, calls = None, 0
        while got is None:
            got, calls = steps.prefill_step(), calls + 1
        assert calls == -(-len(steps.ids) // 4) > 2 and steps.filled == len(steps.ids) == steps.cache.length
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(steps.cache.k[:, :len(steps.ids)], whole.cache.k[:, :len(whole.ids)])
        whole.close()
        steps.close()
    finally:
        eng.set_param("batch_size", 128)


def test_the_scheduler_decodes_the_others_between_a_long_prompts_chunks(models, monkeypatch):
    """Chunked prefill: a long prompt is read a chunk at a time, a decode step of the replies
    already running after each chunk; each reply is what it is alone."""
    import threading
    import time

    from app.server_jobs import BatchScheduler, local_steps
    from engine.batch import Sequence
    eng = models("llama", "int8")
    eng.set_param("batch_size", 4)
    events: list[str] = []
    real_fill, real_decode = Sequence.prefill_step, type(eng).decode

    def decode(self, tokens, caches, routes=None, warmup=False):  # a decode step of the scheduler (warm-ups aside)
        if not warmup:
            events.append(f"step{len(tokens)}")
        return real_decode(self, tokens, caches, routes, warmup)
    monkeypatch.setattr(Sequence, "prefill_step", lambda self, *a, **k: events.append("fill") or real_fill(self, *a, **k))
    monkeypatch.setattr(type(eng), "decode", decode)
    sched = BatchScheduler(eng, max_queue=4, slots=2, prefix_bytes=0)
    short, long = "Once upon", "a b c d e f g h i j k l m n o p q r s t u v w x y z"

    kinds: list[list[str]] = []

    def reply(prompt: str, n: int, out: list | None = None) -> str:
        steps = list(local_steps(sched, prompt, {"temperature": 0.0, "max_tokens": n}, threading.Event()))
        kinds.append([s.kind for s in steps])
        text = "".join(s.text for s in steps)
        if out is not None:
            out.append(text)
        return text
    try:
        alone = [reply(short, 40), reply(long, 4)]
        events.clear()
        got: list = []
        first = threading.Thread(target=reply, args=(short, 40, got))
        first.start()
        while "step1" not in events:  # the short reply is decoding…
            assert first.is_alive()
            time.sleep(0.001)
        second = reply(long, 4)  # …when the long prompt arrives
        first.join(60)
        chunks = [i for i, e in enumerate(events) if e == "fill"][1:]  # the long prompt's
        assert len(chunks) >= 5 and all("step1" in events[a:b] for a, b in zip(chunks, chunks[1:]))
        assert [got[0], second] == alone
        assert kinds[1].count("prompt") == -(-len(eng.prompt_ids(long)) // 4) - 1 > 0  # after each chunk but the last
        assert set(kinds[1][kinds[1].count("prompt"):]) == {"token"}
    finally:
        sched.close()
        eng.set_param("batch_size", 128)


def test_requests_waiting_together_start_decoding_together(models, monkeypatch):
    """Prompts that wait together are all read before the next decode step (up to the slots and
    PREFILL_TOKENS): the first step has every row, not one more row per step."""
    import threading

    from app.server_jobs import BatchScheduler, local_steps
    eng = models("llama", "int8")
    widths: list[int] = []
    real_decode = type(eng).decode

    def decode(self, tokens, caches, routes=None, warmup=False):  # a decode step's rows (warm-ups aside)
        if not warmup:
            widths.append(len(tokens))
        return real_decode(self, tokens, caches, routes, warmup)
    monkeypatch.setattr(type(eng), "decode", decode)
    sched = BatchScheduler(eng, max_queue=8, slots=4, prefix_bytes=0)
    gate = threading.Lock()
    real_work = sched._admit
    sched._admit = lambda: (gate.acquire(), gate.release(), real_work())  # held while the jobs queue up
    outs: dict[int, str] = {}

    def reply(i: int) -> None:
        outs[i] = "".join(s.text for s in local_steps(sched, f"Story {i}:", {"temperature": 0.0, "max_tokens": 3},
                                                      threading.Event()))
    try:
        gate.acquire()
        threads = [threading.Thread(target=reply, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        while sched.waiting < 6:
            threading.Event().wait(0.005)
        gate.release()
        for t in threads:
            t.join(60)
        assert widths[0] == 4  # the slots' worth at once; the other two join as slots free up
        alone = {i: "".join(s.text for s in eng.generate(f"Story {i}:", temperature=0.0, max_tokens=3))
                 for i in range(6)}
        assert outs == alone
    finally:
        sched.close()


def test_a_finished_sequences_cache_serves_the_next_one_unchanged(models):
    """SpareCaches: the next sequence writes over a used cache (its pages already in) and gets
    what a fresh cache gives; a cache of other settings is not taken."""
    eng = models("llama", "int8")
    spare, fresh = Batcher(eng, prefix_bytes=0, spare_caches=1), Batcher(eng, prefix_bytes=0)

    def reply(batcher: Batcher, prompt: str):
        s = batcher.open(prompt, max_tokens=6, temperature=0.0)
        toks = [s.feed(s.prefill()).token_id]
        while s.finish is None:
            toks.append(s.feed(batcher.step([s])).token_id)
        cache = s.cache
        s.close()
        s.close()  # once only
        return toks, cache
    _, used = reply(spare, "a long first prompt that fills more of the cache than the next")
    assert len(spare.spares) == 1
    got, cache = reply(spare, "Once upon")
    assert cache is used and got == reply(fresh, "Once upon")[0]
    eng.set_param("kv_cache_quantize", "int8")
    try:
        _, other = reply(spare, "Once upon")
        assert other is not used and other.kind == "int8"
    finally:
        eng.set_param("kv_cache_quantize", "f16")


def _compiled_kernels() -> dict:
    """Every numba dispatcher of engine.kernels with the signatures it holds now."""
    import sys

    from numba.core.registry import CPUDispatcher
    out = {}
    for name, mod in list(sys.modules.items()):
        if name.startswith("engine."):
            for attr, v in vars(mod).items():
                if isinstance(v, CPUDispatcher):
                    out[(name, attr)] = len(v.signatures)
    return out


@pytest.mark.parametrize("name,quantize", [("llama", "int8"), ("qwen3_moe", "int8")])
def test_the_batchers_warmup_leaves_nothing_to_compile_for_a_steps_first_call(models, name, quantize):
    eng = models(name, quantize)
    eng.warmup()
    batcher = Batcher(eng, prefix_bytes=0)
    looked_up = eng.stats().expert_cache.hits + eng.stats().expert_cache.misses
    assert batcher.warmup() > 0
    assert eng.stats().expert_cache.hits + eng.stats().expert_cache.misses == looked_up  # not counted
    before = _compiled_kernels()
    for n in (2, 3, 5, 8):  # the numbers of sequences a server's steps take, after their prompts
        seqs = [batcher.open(f"Hello {i}", max_tokens=4, temperature=0.0) for i in range(n)]
        for s in seqs:
            s.feed(s.prefill())
        batcher.step(seqs)
        for s in seqs:
            s.close()
    grown = {k: (v, before.get(k)) for k, v in _compiled_kernels().items() if v != before.get(k)}
    assert grown == {}, f"compiled on a served step, not in the warm-up: {grown}"
