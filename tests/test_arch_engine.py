"""The 2026 architectures through the Engine itself (colibri-convert's model directory, the one
forward pass, the engine's per-layer caches), against transformers' fixtures and llama.cpp's runs
of its own GGUF of the same tiny models (tests/fixtures/arch, arch_llamacpp)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from arch_reference import ARCH_FIXTURES

from engine.api import Engine
from engine.convert.convert import convert
from engine.kvcache import KVCache

GGUFS = Path(__file__).resolve().parent / "fixtures" / "arch_llamacpp"
# the architectures the Engine runs end to end (the rest: engine.arch refuses them); gemma4_e2b: Gemma 4's
# edge models (dense, per-layer inputs, KV shared by the last layers)
WIRED = ["lfm2_moe", "gpt_oss", "qwen3_5_moe", "gemma4", "gemma4_e2b"]
# held to transformers only (no llama.cpp run of their own): an odd partial rotary width
VARIANTS = ["qwen3_5_moe_rope5"]


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    """(arch, "hf" | "gguf") -> an Engine over the converted fixture (f32 weights, f32 KV cache)."""
    made: dict[tuple[str, str], Engine] = {}

    def get(arch: str, source: str) -> Engine:
        if (arch, source) not in made:
            src = ARCH_FIXTURES / arch if source == "hf" else GGUFS / f"{arch}-f16.gguf"
            out = tmp_path_factory.mktemp(f"{arch}-{source}") / "model"
            convert(src, out, "f32")
            made[arch, source] = Engine(out, threads=2, kv_cache_quantize="f32")
        return made[arch, source]
    yield get
    for e in made.values():
        e.close()


def _greedy(e: Engine, ids: list[int], n: int) -> list[int]:
    """n greedy tokens: the prompt in one pass, then one token at a time through the cache."""
    e.reset()
    out, t = [], e.forward(ids)
    for _ in range(n):
        out.append(t)
        t = e.forward([t])
    return out


@pytest.mark.parametrize("arch", WIRED + VARIANTS)
def test_logits_and_greedy_match_transformers(engines, arch):
    ref = np.load(ARCH_FIXTURES / arch / "reference.npz")
    e = engines(arch, "hf")
    logits = e.logits(ref["input_ids"].tolist())
    err = np.abs(logits - ref["logits"]).max() / np.abs(ref["logits"]).max()
    assert err < 1e-4, err
    assert _greedy(e, ref["input_ids"].tolist(), 8) == ref["greedy_ids"].tolist()


@pytest.mark.parametrize("arch", WIRED)
def test_llamacpp_gguf_agrees_with_llamacpp(engines, arch):
    runs = json.loads((ARCH_FIXTURES / arch / "llamacpp.json").read_text())["runs"]
    e = engines(arch, "gguf")
    for name in ("prompt", "long"):
        run = runs[name]
        ours = e.logits(run["ids"]).argmax(-1)
        confident = np.array(run["margins"]) >= 0.05
        assert confident.sum() >= 10, name
        assert (ours == np.array(run["argmax"]))[confident].mean() >= 0.98, name
    assert _greedy(e, runs["prompt"]["ids"], 8) == runs["prompt"]["greedy_ids"][:8]


@pytest.mark.parametrize("arch", WIRED + VARIANTS)
def test_long_conversation_token_by_token(engines, arch):
    """The 4x-window sequence a token at a time equals the one-pass logits, and the rings and
    recurrent states stay the same size however long the conversation."""
    ids = np.load(ARCH_FIXTURES / arch / "long.npz")["input_ids"]
    e = engines(arch, "hf")
    whole = e.logits(ids.tolist())
    c = e.cfg
    cache = KVCache(c.num_layers, len(ids), c.num_kv_heads, c.head_dim, "f32")
    sizes = []
    for p, t in enumerate(ids):
        step = e.net.forward(np.array([t]), cache, p)
        np.testing.assert_allclose(step[0], whole[p], atol=1e-5 * np.abs(whole).max())
        sizes.append(cache.fixed_state_bytes)
    assert cache.length == len(ids) and len(set(sizes)) == 1 and sizes[0] > 0


def test_recurrent_cache_rewinds_to_zero_only(engines):
    """A recurrent state cannot forget its last tokens: truncating a cache that holds one keeps
    all of it or nothing, and the engine then re-runs the prompt from the start, exactly."""
    e = engines("lfm2_moe", "hf")
    ids = np.load(ARCH_FIXTURES / "lfm2_moe" / "reference.npz")["input_ids"].tolist()
    c = e.cfg
    cache = KVCache(c.num_layers, len(ids), c.num_kv_heads, c.head_dim, "f32")
    e.net.forward(np.array(ids[:10]), cache, 0)
    assert cache.truncate(10) == 10 and cache.states is not None
    assert cache.truncate(7) == 0 and cache.states is None  # no snapshot: back to the start
    with pytest.raises(ValueError, match="recurrent"):
        e.net.forward(np.array(ids[:10]), cache, 0)  # (fills it again from 0: fine)
        e.net.forward(np.array(ids[12:14]), cache, 12)  # a gap: refused
    fresh = e.net.forward(np.array(ids), KVCache(c.num_layers, len(ids), c.num_kv_heads, c.head_dim, "f32"), 0)
    e.net.forward(np.array(ids[:10]), cache, 0)
    again = e.net.forward(np.array(ids[10:]), cache, 10)
    np.testing.assert_allclose(again, fresh, atol=1e-5 * np.abs(fresh).max())

    def stop(layer: int) -> None:  # a Stop during a long prompt, after some layers advanced their states
        if layer == 2:
            raise KeyboardInterrupt
    e.net.forward(np.array(ids[:10]), cache, 0)
    with pytest.raises(KeyboardInterrupt):
        e.net.forward(np.array(ids[10:]), cache, 10, before_layer=stop)
    assert cache.length == 0 and cache.states is None  # half-advanced states are dropped, not kept


@pytest.mark.parametrize("arch", WIRED + VARIANTS)
def test_next_prompt_rewinds_to_the_snapshot(engines, arch):
    """A snapshot at the end of a prompt (the Engine takes one after each prefill) lets the next
    prompt that starts with it rewind there, not to 0, and go on exactly; writing before it
    drops it."""
    e = engines(arch, "hf")
    ids = np.load(ARCH_FIXTURES / arch / "reference.npz")["input_ids"].tolist()
    c = e.cfg
    new = lambda: KVCache(c.num_layers, len(ids), c.num_kv_heads, c.head_dim, "f32")  # noqa: E731
    fresh = e.net.forward(np.array(ids), new(), 0, all_logits=True)
    cache, a = new(), len(ids) // 2
    e.net.forward(np.array(ids[:a]), cache, 0)
    cache.snapshot()
    e.net.forward(np.array(ids[a:a + 3]), cache, a)  # a reply the next prompt does not repeat
    assert cache.truncate(a + 1) == a
    again = e.net.forward(np.array(ids[a:]), cache, a, all_logits=True)
    np.testing.assert_allclose(again, fresh[a:], atol=1e-5 * np.abs(fresh).max())
    e.net.forward(np.array(ids[:5]), cache, 0)  # a new conversation over the old positions
    assert cache.truncate(3) == 0


@pytest.mark.parametrize("arch", WIRED)  # (the variants add no layer or cache kind)
def test_kv_cache_quantize_reaches_every_layer_kind_and_the_estimate_counts_it(engines, arch):
    """f16 and int8 reach the rings and per-layer KV caches (gpt-oss, Gemma 4) as they reach the
    shared block; the memory estimate (model_cache_bytes) equals what the 4x-window conversation
    holds for every kind, and the fixed-size states stay flat; argmax as with f32."""
    from engine.kvcache import model_cache_bytes
    ids = np.load(ARCH_FIXTURES / arch / "long.npz")["input_ids"]
    e, c = engines(arch, "hf"), engines(arch, "hf").cfg
    got, used = {}, {}
    for kind in ("f32", "f16", "int8"):
        cache = KVCache(c.num_layers, len(ids), c.num_kv_heads, c.head_dim, kind)
        sizes, rows = [], []
        for p, t in enumerate(ids):
            rows.append(e.net.forward(np.array([t]), cache, p)[0])
            sizes.append(cache.fixed_state_bytes)
        got[kind], used[kind] = np.array(rows), cache.nbytes_used
        assert used[kind] == model_cache_bytes(c, len(ids), kind), kind
        assert len(set(sizes)) == 1, kind
        assert all(getattr(s, "kind", kind) == kind for s in cache.states), kind
    scale = np.abs(got["f32"]).max()
    assert np.abs(got["f16"] - got["f32"]).max() <= 1e-2 * scale
    assert np.abs(got["int8"] - got["f32"]).max() <= 1e-1 * scale
    assert (got["int8"].argmax(-1) == got["f32"].argmax(-1)).all()
    assert used["int8"] < used["f16"] < used["f32"]
