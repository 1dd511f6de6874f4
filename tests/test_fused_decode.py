"""The fused decode kernel (engine.kernels.decode: every layer of a decoded token in one call)
against the layer-by-layer path it stands in for, which is itself held to transformers
(test_forward) and to the kernels' numpy twins (test_kernels): the same logits bit for bit, the
same KV cache bytes, the same expert counters — on converted tiny models of each architecture
it takes, random shapes beside the committed fixtures, every KV cache format, and the real
default model. And where it must not run, that it does not."""
from __future__ import annotations

import json
import shutil
import time

import numpy as np
import pytest
from conftest import HF_ARCHS, HF_FIXTURES
from gguf_fixtures import make_random_hf

import engine.models.fused as fused_module
from engine.api import Engine
from engine.convert.convert import convert
from engine.models.base import Step


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("fused")
    cache = {}

    def get(name: str, quantize: str, **shape):
        key = (name, quantize, tuple(sorted(shape.items())))
        if key not in cache:
            src = HF_FIXTURES / name
            if shape:  # a random model of another shape than the committed fixtures
                src = make_random_hf(root / f"hf-{len(cache)}", name, **shape)
            cache[key] = convert(src, root / f"{name}-{quantize}-{len(cache)}", quantize).path
        return cache[key]
    return get


@pytest.fixture
def calls(monkeypatch):
    """How many times the fused kernel ran (the real one: this only counts)."""
    count = [0]
    real = fused_module.decode_layers

    def counting(*args):
        count[0] += 1
        return real(*args)
    monkeypatch.setattr(fused_module, "decode_layers", counting)
    return count


def resident(eng: Engine, prompt: list[int]) -> Engine:
    """The engine after a prompt, once every expert has been loaded (fill() queues them)."""
    if prompt:
        eng.forward(prompt)
    deadline = time.monotonic() + 20
    while not eng.net.fused.ready():
        assert time.monotonic() < deadline, "the experts were never all loaded"
        time.sleep(0.01)
    return eng


def decode(eng: Engine, tokens: list[int], fused: bool, start: int) -> dict:
    """Logits, KV cache bytes and expert counters of decoding `tokens` one by one from `start`."""
    eng.net.fused_decode = fused
    eng.cache.truncate(start)
    cache, experts = eng.cache, eng.weights.experts
    before = experts.stats()
    logits = np.concatenate([eng.net.forward(np.array([t]), cache, cache.length) for t in tokens])
    after = experts.stats()
    end = start + len(tokens)
    kv = [a[:, start:end].copy() for a in (cache.k, cache.v)]
    if cache.kind == "int8":
        kv += [a[:, start:end].copy() for a in (cache.k_scale, cache.v_scale)]
    return {"logits": logits, "kv": kv, "hits": after.hits - before.hits,
            "activations": np.array(after.activations) - np.array(before.activations)}


def assert_same(a: dict, b: dict) -> None:
    np.testing.assert_array_equal(a["logits"], b["logits"])
    for x, y in zip(a["kv"], b["kv"]):
        np.testing.assert_array_equal(x, y)
    assert a["hits"] == b["hits"]
    np.testing.assert_array_equal(a["activations"], b["activations"])


CASES = [  # (architecture, quantize, KV cache, shape of a random model or {} for the fixture)
    ("mixtral", "int4", "f16", {}),
    ("mixtral", "int8", "int8", {}),
    ("llama", "int4", "f32", {}),
    ("llama", "int8", "f16", {}),
    ("mixtral", "int4", "int8", {"hidden": 128, "n_layer": 3, "n_head": 8, "n_head_kv": 2, "n_expert": 6, "n_expert_used": 1,
                                     "moe_intermediate": 64, "seed": 3}),
    ("llama", "int4", "f16", {"hidden": 96, "intermediate": 160, "n_layer": 2, "n_head": 3, "n_head_kv": 1, "head_dim": 32,
                                  "seed": 5, "tie_embeddings": True}),
]


@pytest.mark.parametrize("arch,quantize,kv,shape", CASES)
def test_fused_decode_is_the_layered_path_bit_for_bit(models, calls, arch, quantize, kv, shape):
    eng = resident(Engine(models(arch, quantize, **shape), kv_cache_quantize=kv), [1, 5, 9, 14, 3, 7])
    start, tokens = eng.cache.length, [11, 2, 30, 4, 17, 8, 21]
    calls[0] = 0
    layered = decode(eng, tokens, False, start)
    assert calls[0] == 0
    fused = decode(eng, tokens, True, start)
    assert calls[0] == len(tokens)
    assert_same(fused, layered)
    assert fused["hits"] == len(tokens) * eng.cfg.num_layers * eng.cfg.top_k


def test_sliding_window(tmp_path, calls):
    """A Mistral-style window shorter than the context: the fused kernel drops the same keys."""
    hf = tmp_path / "hf"
    shutil.copytree(HF_FIXTURES / "mistral", hf)
    cfg = json.loads((hf / "config.json").read_text())
    (hf / "config.json").write_text(json.dumps({**cfg, "sliding_window": 4}))
    eng = resident(Engine(convert(hf, tmp_path / "model", "int8").path), [1, 2, 3, 4, 5, 6, 7])
    assert eng.cfg.sliding_window == 4
    tokens = [9, 8, 7, 6, 5]
    assert_same(decode(eng, tokens, True, 7), decode(eng, tokens, False, 7))
    assert calls[0] == len(tokens)


def test_clip_qkv(tmp_path, calls):
    """OLMoE with a q/k/v clip small enough to bite: the fused kernel clips the same values."""
    hf = tmp_path / "hf"
    shutil.copytree(HF_FIXTURES / "olmoe", hf)
    cfg = json.loads((hf / "config.json").read_text())
    (hf / "config.json").write_text(json.dumps({**cfg, "clip_qkv": 0.05}))
    eng = resident(Engine(convert(hf, tmp_path / "model", "int8").path), [1, 2, 3, 4])
    assert eng.cfg.clip_qkv == 0.05 and eng.net.fused is not None
    dump: dict = {}
    eng.logits([1, 2, 3], dump=dump)
    assert np.isclose(np.abs(dump["blk.0.v"]).max(), 0.05)  # the clip bites (v is not rotated after it)
    tokens = [9, 8, 7, 6]
    assert_same(decode(eng, tokens, True, 4), decode(eng, tokens, False, 4))
    assert calls[0] == len(tokens)


def test_the_real_default_model(default_converted, calls):
    """SmolLM2's Q4_1 weights, repacked: greedy tokens and logits as the layered path gives them."""
    eng = Engine(default_converted, context_length=256)
    eng.warmup()
    ids = eng.prompt_ids("The capital of Japan is")
    eng = resident(eng, ids)
    start, tokens = eng.cache.length, [578, 4081, 28, 314, 11, 2013]
    assert_same(decode(eng, tokens, True, start), decode(eng, tokens, False, start))
    eng.cache.truncate(start)
    eng.net.fused_decode = True
    eng.tokens = ids
    got = [eng.forward([tokens[0]])]
    for _ in range(4):
        got.append(eng.forward([got[-1]]))
    eng.net.fused_decode = False
    eng.cache.truncate(start)
    eng.tokens = ids
    want = [eng.forward([tokens[0]])]
    for _ in range(4):
        want.append(eng.forward([want[-1]]))
    assert got == want
    assert calls[0] >= 5


@pytest.mark.parametrize("arch", HF_ARCHS)
def test_every_architecture_decodes_alike_on_both_paths(models, calls, arch):
    """Each architecture's fixture: the fused decode gives the layered path's logits and KV cache
    bit for bit and the same greedy tokens — or, where the spec has a part the kernel does not
    compute, it is refused at load naming that part, and every token runs layer by layer."""
    eng = Engine(models(arch, "int8"))
    prompt, tokens = [1, 5, 9, 14, 3], [11, 2, 30, 4, 17]
    if arch == "qwen2_moe":  # its sigmoid-gated shared expert
        assert eng.net.fused is None and "shared_expert:sigmoid_gate" in eng.net.fused_refusal
        eng.forward(prompt)
        eng.forward([tokens[0]])
        assert calls[0] == 0
        return
    assert eng.net.fused_refusal is None
    eng = resident(eng, prompt)
    start = eng.cache.length
    assert_same(decode(eng, tokens, True, start), decode(eng, tokens, False, start))
    greedy = {}
    for fused in (True, False):
        eng.net.fused_decode = fused
        eng.cache.truncate(start)
        eng.tokens = prompt
        got = [eng.forward([tokens[0]])]
        for _ in range(4):
            got.append(eng.forward([got[-1]]))
        greedy[fused] = got
    assert greedy[True] == greedy[False]
    assert calls[0] == 2 * len(tokens)


def test_given_picks_stand_in_for_the_routers_as_on_the_layered_path(models, calls, tmp_path):
    """colibri-bench memory --trace on a resident model: the kernel takes the trace's picks at
    equal weights (FusedDecode.given), as the layered path takes them from its route hook."""
    from app.bench.memory import replay_routing
    eng = resident(Engine(models("mixtral", "int8")), [1, 5, 9, 14, 3, 7])
    L, E, K = eng.cfg.num_layers, eng.cfg.num_experts, eng.cfg.top_k
    rng = np.random.default_rng(2)
    ids = np.array([[rng.permutation(E)[:K] for _ in range(L + 1)] for _ in range(12)], np.int16)
    np.savez(tmp_path / "t.npz", ids=ids, ahead=ids[:, 1:], num_experts=E)
    start, tokens = eng.cache.length, [11, 2, 30, 4, 17, 8, 21]
    replay_routing(eng, str(tmp_path / "t.npz"))
    layered = decode(eng, tokens, False, start)
    replay_routing(eng, str(tmp_path / "t.npz"))  # the trace from its first token again
    calls[0] = 0
    fused = decode(eng, tokens, True, start)
    assert calls[0] == len(tokens)
    assert_same(fused, layered)
    expected = [[int((ids[:len(tokens), layer] == e).sum()) for e in range(E)] for layer in range(L)]
    np.testing.assert_array_equal(fused["activations"], expected)
    eng.net.fused.given = None  # the routers pick again
    assert not np.array_equal(decode(eng, tokens, True, start)["logits"], fused["logits"])


def test_not_taken_without_integer_weights_or_with_float_activations(models, calls):
    assert Engine(models("llama", "keep")).net.fused is None  # f32 weights: no integer dot
    eng = Engine(models("llama", "int8"), int8_activations=False)
    eng.forward([1, 2, 3])
    eng.forward([4])
    assert calls[0] == 0
    eng.set_param("int8_activations", True)
    eng.forward([5])
    assert calls[0] == 1


def test_stats_name_the_route_of_the_last_step(models):
    """Engine.stats().route: the decoder loop's route at the last step, and why where it ran
    layer by layer (the model's refusal, a prompt, float activations)."""
    eng = resident(Engine(models("mixtral", "int8")), [1, 5, 9])
    assert eng.stats().route == "layered (a prompt of 3 tokens)"
    eng.forward([4])
    assert eng.stats().route == "fused"
    eng.set_param("int8_activations", False)
    eng.forward([5])
    assert eng.stats().route == "layered (float activations)"
    small = Engine(models("mixtral", "int8"), expert_cache_size=3, prefetch_window=0)
    small.forward([1, 5, 9, 14, 3, 7])
    small.forward([11])
    assert small.stats().route == "fused (streaming experts)"
    refused = Engine(models("qwen2_moe", "int8"))
    assert refused.stats().route == f"layered ({refused.net.fused_refusal})" and "shared_expert" in refused.stats().route


@pytest.mark.parametrize("quantize", ["int4", "int8"])
def test_a_small_expert_cache_streams_through_the_kernel_as_the_layered_path(models, calls, quantize):
    """With room for 3 of 8 experts a layer, experts come and go: decode_layers runs over the held
    ones and stops at a layer whose pick is missing; the cache brings it in (a slot, or mapped for
    its one use) and the next call resumes at that layer's feed-forward part. Logits, KV cache,
    hits and misses as the layered path's, bit for bit (no loader thread: the same evictions)."""
    engines = {}
    for fused in (True, False):
        eng = Engine(models("mixtral", quantize), expert_cache_size=3, prefetch_window=0)
        eng.forward([1, 5, 9, 14, 3, 7])
        engines[fused] = eng
    start, tokens = engines[True].cache.length, [11, 2, 30, 4, 17, 8, 21, 6, 13]
    got = {f: decode(e, tokens, f, start) | {"misses": e.weights.experts.stats().misses} for f, e in engines.items()}
    assert_same(got[True], got[False])
    assert got[True]["misses"] == got[False]["misses"] > 0
    net = engines[True].net
    assert not net.fused.ready() and net.fused.streamed == len(tokens)
    assert len(tokens) < calls[0] < len(tokens) * (eng.cfg.num_layers + 1)  # a call per layer that missed, and one
    st = engines[True].weights.experts.stats()
    assert st.resident <= 3 * eng.cfg.num_layers


def test_a_budget_cut_during_a_streamed_call_leaves_its_hits_counted(models, monkeypatch):
    """Memory pressure while decode_layers runs (a smaller budget, or the loader's guesses): the way
    out of frozen() evicts down to the budget, and may take experts the call has just read. Their
    hits are counted inside, while they are held: counted after, a KeyError ended the bench's run
    at cap 0.9 (q4_k_m, random routing, 2 of 3 runs)."""
    shape = {"hidden": 128, "n_layer": 6, "n_head": 8, "n_head_kv": 2, "n_expert": 8, "moe_intermediate": 64, "seed": 4}
    eng = Engine(models("mixtral", "int8", **shape), expert_cache_size=6, prefetch_window=0)
    eng.forward([1, 5, 9, 14, 3, 7])
    ec, real, asked = eng.weights.experts, fused_module.decode_layers, eng.weights.experts.budget

    def cut(*args):
        stop = real(*args)
        ec.set_budget(0)  # the working minimum: fewer slots than the call read (evicted on the way out)
        return stop

    def restore(*args, **kw):  # ... and the asked size back before each token, so that its first call reads a few layers
        ec.set_budget(asked)
        return forward(*args, **kw)
    forward = eng.net.forward
    monkeypatch.setattr(eng.net, "forward", restore)
    monkeypatch.setattr(fused_module, "decode_layers", cut)
    tokens, before, streamed = [11, 2, 30, 4, 17], ec.stats(), eng.net.fused.streamed
    for t in tokens:
        eng.forward([t])
    st = ec.stats()
    assert eng.net.fused.streamed == streamed + len(tokens)
    assert (st.hits + st.misses) - (before.hits + before.misses) == len(tokens) * eng.cfg.num_layers * eng.cfg.top_k
    assert st.evictions > before.evictions


def test_room_for_every_expert_loads_the_rest_in_the_background(models):
    eng = Engine(models("mixtral", "int8"))
    eng.forward([1, 2])
    eng.forward([3])  # the first decoded token asks for the experts no token has picked yet
    resident(eng, [])
    st = eng.weights.experts.stats()
    assert st.resident == eng.cfg.num_layers * eng.cfg.num_experts and st.evictions == 0
    quiet = Engine(models("mixtral", "int8"), prefetch_window=0)  # no loader thread: nothing extra
    quiet.forward([1, 2])
    quiet.forward([3])
    assert not quiet.net.fused.ready()
    assert quiet.weights.experts.stats().resident < quiet.cfg.num_layers * quiet.cfg.num_experts


def test_a_full_kv_cache_is_left_to_the_layered_path(models, calls):
    """The kernel writes the cache without bounds checks: a position past its end never reaches it."""
    eng = resident(Engine(models("llama", "int8")), [1, 2, 3])
    cache = eng.cache
    cos, sin = eng.net.rotary(np.array([cache.capacity]))
    assert not eng.net.fused.run(np.zeros((1, eng.cfg.hidden_size), np.float32), Step(cache, cache.capacity, cos, sin))
    assert calls[0] == 0


@pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")  # 1e5 has no half
@pytest.mark.parametrize("kind", ["f32", "f16", "int8"])
def test_the_kernels_kv_store_is_kvcache_write(kind):
    """decode._store_kv against its numpy twin, KVCache.write, including values a half cannot
    hold (overflow, subnormals), ties and an all-zero head."""
    from engine.kernels.decode import _store_kv
    from engine.kvcache import KVCache
    rng = np.random.default_rng(7)
    for scale in (1e-6, 1e-3, 1.0, 300.0, 1e5):
        k = (rng.standard_normal((1, 3, 32)) * scale).astype(np.float32)
        k[0, 1] = 0.0
        k[0, 2, :4] = [0.5, 1.5, 65520.0, -1e-7]
        want = KVCache(1, 4, 3, 32, kind)
        want.write(0, 2, k, k)
        got = KVCache(1, 4, 3, 32, kind)
        stored = got.k.view(np.uint16) if kind == "f16" else got.k
        _store_kv(k[0], stored[0, 2], got.k_scale[0], 2, kind == "int8")
        np.testing.assert_array_equal(got.k, want.k)
        np.testing.assert_array_equal(got.k_scale, want.k_scale)


def test_the_timing_hook_times_each_operation_without_replacing_any(models):
    """engine.timing.OpTimer on Transformer.timer: a prompt's kernels by name, its matmuls by
    tensor, the fused decode as one row; exclusive times add up to no more than the wall time."""
    import time as _time

    from engine.timing import OpTimer
    eng = resident(Engine(models("mixtral", "int8")), [])
    timer = eng.net.timer = OpTimer()
    t0 = _time.perf_counter()
    eng.forward([1, 5, 9])
    eng.forward([4])
    wall = _time.perf_counter() - t0
    L = eng.cfg.num_layers
    assert timer.calls["rmsnorm"] == 2 * L + 2 and timer.calls["attention"] == L and timer.calls["rope"] == 2 * L
    assert timer.calls["blk.0.attn_q.weight"] == 1 and timer.calls["blk.1.ffn_gate_inp.weight"] >= 1
    assert timer.calls["decode_layers (fused)"] == 1 and timer.calls["output.weight"] == 2
    assert 0 < sum(timer.spent.values()) <= wall
    eng.net.timer = None
    timer.reset()
    eng.forward([7])
    assert not timer.calls


def test_warmup_compiles_the_expert_call_a_small_cache_decodes_with(models, monkeypatch):
    """A token decoded layer by layer (a model the fused kernel does not take) whose picks are all
    loaded, in a cache that does not hold every expert, takes cpu.moe_int; warm-up's own tokens seldom find their picks so, and the first reply compiled it
    (minutes with a cold numba cache on a 2-core VM). Warm-up calls it with the argument types the
    decode then calls it with, so nothing is left to compile."""
    import numba

    from engine.kernels import cpu
    seen, inputs = [], []
    real = cpu.moe_int

    def spy(*args):
        seen.append(tuple(numba.typeof(a) for a in args))
        inputs.append(args[7].shape)
        return real(*args)
    monkeypatch.setattr(cpu, "moe_int", spy)
    eng = Engine(models("mixtral", "int8"), expert_cache_size=3, prefetch_window=0)
    eng.net.fused_decode = False  # as for a model decode_layers does not take: a token goes layer by layer
    eng.warmup()
    assert (1, 0) in inputs  # Transformer.compile_expert_call's empty call, whatever warm-up's tokens met
    warm = len(seen)
    eng.forward([1, 5, 9, 14, 3, 7])
    for t in (11, 2, 30, 4, 17, 8, 21, 6, 13, 11, 2, 30):
        eng.forward([t])
    assert len(seen) > warm and all(types == seen[0] for types in seen)
