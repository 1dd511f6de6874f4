"""The expert cache: exact hit/miss/eviction counts on a model whose routing is known, loads
under concurrency, and damaged expert files."""
from __future__ import annotations

import json
import shutil
import threading
from collections import OrderedDict

import numpy as np
import pytest
from conftest import HF_FIXTURES
from hf_util import write_safetensors

from engine.api import Engine
from engine.convert.convert import convert
from engine.experts import ExpertCache, ExpertLoadError, ExpertStore
from engine.mempool import MemoryPool
from engine.model_dir import open_model_dir

D, E, LAYERS, FF, VOCAB = 64, 4, 2, 32, 384


def routing_table(seed=0):
    """layer -> token -> expert (tokens 0..63)."""
    rng = np.random.default_rng(seed)
    return rng.integers(0, E, size=(LAYERS, D))


@pytest.fixture(scope="module")
def routed_model(tmp_path_factory):
    """A Mixtral-style model whose router sends token t to expert table[L][t] in layer L.

    Embeddings are one-hot (token t -> basis vector t mod 64); attention and experts output
    zero, so the hidden state stays one-hot and each layer's router reads the token id.
    """
    root = tmp_path_factory.mktemp("routed")
    src = root / "hf"
    src.mkdir()
    table = routing_table()
    t: dict = {}
    emb = np.zeros((VOCAB, D), np.float32)
    emb[np.arange(VOCAB), np.arange(VOCAB) % D] = 1.0
    t["model.embed_tokens.weight"] = ("F32", emb)
    t["lm_head.weight"] = ("F32", np.random.default_rng(1).standard_normal((VOCAB, D)).astype(np.float32))
    t["model.norm.weight"] = ("F32", np.ones(D, np.float32))
    for L in range(LAYERS):
        p = f"model.layers.{L}."
        t[p + "input_layernorm.weight"] = ("F32", np.ones(D, np.float32))
        t[p + "post_attention_layernorm.weight"] = ("F32", np.ones(D, np.float32))
        for n, rows in (("q", 64), ("k", 32), ("v", 32)):
            t[p + f"self_attn.{n}_proj.weight"] = ("F32", np.zeros((rows, D), np.float32))
        t[p + "self_attn.o_proj.weight"] = ("F32", np.zeros((D, 64), np.float32))
        router = np.zeros((E, D), np.float32)
        router[table[L], np.arange(D)] = 10.0
        t[p + "block_sparse_moe.gate.weight"] = ("F32", router)
        for e in range(E):
            q = f"{p}block_sparse_moe.experts.{e}."
            t[q + "w1.weight"] = ("F32", np.full((FF, D), 0.01 * (e + 1), np.float32))
            t[q + "w3.weight"] = ("F32", np.full((FF, D), 0.01, np.float32))
            t[q + "w2.weight"] = ("F32", np.zeros((D, FF), np.float32))
    write_safetensors(src / "model.safetensors", t)
    cfg = {"architectures": ["MixtralForCausalLM"], "hidden_size": D, "num_hidden_layers": LAYERS,
           "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32, "intermediate_size": FF,
           "num_local_experts": E, "num_experts_per_tok": 1, "vocab_size": VOCAB, "rms_norm_eps": 1e-6,
           "rope_theta": 10000.0, "max_position_embeddings": 512}
    (src / "config.json").write_text(json.dumps(cfg))
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(HF_FIXTURES / "mixtral" / f, src / f)
    return convert(src, root / "model", "keep").path, table


def simulate(table, tokens, capacity):
    """Independent LRU model: (hits, misses, evictions) per layer."""
    out = []
    for L in range(LAYERS):
        lru, h, m, ev = OrderedDict(), 0, 0, 0
        for tok in tokens:
            e = int(table[L][tok])
            if e in lru:
                h += 1
                lru.move_to_end(e)
            else:
                m += 1
                if len(lru) >= capacity:
                    lru.popitem(last=False)
                    ev += 1
                lru[e] = True
        out.append((h, m, ev))
    return out


@pytest.mark.parametrize("capacity", [1, 2, 3, 4])
def test_counts_match_an_lru_model_exactly(routed_model, capacity):
    path, table = routed_model
    eng = Engine(path, expert_cache_size=capacity, prefetch_window=0)
    tokens = [int(t) for t in np.random.default_rng(capacity).integers(0, D, 40)]
    eng.forward(tokens[:1])
    for t in tokens[1:]:
        eng.forward([t])  # one token at a time: the decode path
    st = eng.stats().expert_cache
    assert st.per_layer == tuple(simulate(table, tokens, capacity))
    assert st.hits + st.misses == LAYERS * len(tokens)
    assert st.resident <= capacity * LAYERS
    assert st.activations == tuple(tuple(int((table[L][tokens] == e).sum()) for e in range(E))
                                   for L in range(LAYERS))
    eng.close()


def test_prefill_loads_each_expert_once_per_layer(routed_model):
    path, table = routed_model
    eng = Engine(path, expert_cache_size=1, prefetch_window=0, batch_size=4)
    tokens = list(range(40))
    eng.forward(tokens)
    st = eng.stats().expert_cache
    for L, (_, misses, _) in enumerate(st.per_layer):
        assert misses == len(set(table[L][tokens]))  # grouped by expert: one load each
    eng.close()


def test_expert_outputs_do_not_depend_on_the_cache(routed_model):
    path, _ = routed_model
    ids = list(range(3, 30))
    full = Engine(path, expert_cache_size=4, prefetch_window=0).logits(ids)
    for cap, window in ((1, 0), (2, 16)):
        np.testing.assert_array_equal(Engine(path, expert_cache_size=cap, prefetch_window=window).logits(ids), full)


def test_concurrent_loader_and_compute_keep_invariants(routed_model):
    path, _ = routed_model
    model = open_model_dir(path)
    store, pool = ExpertStore(model), MemoryPool()
    cache = ExpertCache(store, pool, LAYERS, E, capacity=2, prefetch_window=8, top_k=1)
    want = {}
    for L in range(LAYERS):
        for e in range(E):
            buf = np.zeros(store.span(L, e).nbytes, np.uint8)
            want[L, e] = store.read_into(L, e, buf).gate.data.copy()
    rng = np.random.default_rng(0)
    errors = []

    def flood():
        for _ in range(3000):
            cache.prefetch(int(rng.integers(LAYERS)), rng.integers(0, E, 2), spare_only=bool(rng.integers(2)))

    flooder = threading.Thread(target=flood)
    flooder.start()
    for step in range(3000):
        L, e = int(step % LAYERS), int(rng.integers(E))
        with cache.use(L, e) as w:
            if not np.array_equal(w.gate.data, want[L, e]):
                errors.append((step, L, e))
        if step % 100 == 0:
            st = cache.stats()
            assert st.resident <= (cache.capacity + 1) * LAYERS  # at most one pinned overflow
    flooder.join()
    st = cache.stats()
    cache.close()
    assert not errors
    assert st.hits + st.misses == 3000
    assert pool.stats().allocated == 0  # every slot went back to the pool


def test_missing_or_corrupt_expert_file_names_layer_and_expert(routed_model, tmp_path):
    path, table = routed_model
    broken = shutil.copytree(path, tmp_path / "broken")
    victim = broken / "experts" / f"layer_1_expert_{table[1][5]}.bin"
    saved = victim.read_bytes()
    eng = Engine(broken, expert_cache_size=4, prefetch_window=0)  # opened while intact, damaged later
    victim.unlink()
    with pytest.raises(ExpertLoadError, match=f"layer 1 expert {table[1][5]}"):
        eng.forward([5])
    victim.write_bytes(saved[:100])  # truncated
    with pytest.raises(ExpertLoadError, match=f"layer 1 expert {table[1][5]}"):
        eng.forward([5])
    ok = next(t for t in range(D) if table[1][t] != table[1][5] and table[0][t] != table[0][5])
    eng.reset()
    assert isinstance(eng.forward([ok]), int)  # the engine serves the next request
    victim.write_bytes(saved)
    eng.reset()
    assert isinstance(eng.forward([5]), int)


def test_auto_plan_and_parameters(routed_model):
    path, _ = routed_model
    eng = Engine(path)
    assert eng.cache_plan.capacity == E and eng.cache_plan.reason.startswith("auto")
    eng.set_param("expert_cache_size", 2)
    assert eng.weights.experts.capacity == 2 and eng.stats().expert_cache_plan.startswith("2 of 4")
    eng.set_param("expert_cache_size", "auto")
    assert eng.weights.experts.capacity == E
    with pytest.raises(ValueError, match="prefetch_window"):
        eng.set_param("prefetch_window", -1)
