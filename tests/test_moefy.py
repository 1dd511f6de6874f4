"""MoEfication (engine.convert.moefy) and the routing replay (app.bench.routing): with every expert
picked the MoE computes the dense model; planted co-activation groups are recovered; the
replayed policies agree with hand-counted caches and none beats Belady's optimum."""
from __future__ import annotations

from collections import OrderedDict

import numpy as np
import pytest
from conftest import HF_FIXTURES

from app.bench import routing
from engine.api import Engine
from engine.convert.convert import convert
from engine.convert.moefy import balanced_clusters, moefy, moefy_layer
from engine.errors import ConfigError
from engine.model_dir import open_model_dir

TEXT = "def heappush(heap, item):\n    heap.append(item)\n    _siftdown(heap, 0, len(heap) - 1)\n" * 12


@pytest.fixture(scope="module")
def dense(tmp_path_factory):
    """The tiny transformers Llama (FFN of 96 neurons) in float32: regrouping it is exact."""
    return convert(HF_FIXTURES / "llama", tmp_path_factory.mktemp("dense") / "m", "f32").path


def test_all_experts_picked_is_the_dense_model(dense, tmp_path):
    r = moefy(dense, tmp_path / "moe", 3, 3, text=TEXT, tokens=256)
    m = open_model_dir(r.path)
    assert (m.config.architecture, m.config.num_experts, m.config.top_k, m.config.intermediate_size) == \
        ("mixtral", 3, 3, 32)
    ids = list(range(5, 60))
    want = Engine(dense, int8_activations=False).logits(ids)
    got = Engine(r.path, int8_activations=False).logits(ids)
    # top-k weights are 1/K to LOGIT_SCALE (1e-3) and down is multiplied by K: the same sums
    np.testing.assert_allclose(got, want, rtol=0, atol=5e-3 * np.abs(want).max())
    assert m.meta["moefy"]["layers"][0]["error_oracle"] < 1e-5  # nothing left out


def test_fewer_experts_route_through_the_engine(dense, tmp_path):
    r = moefy(dense, tmp_path / "moe", 3, 1, text=TEXT, tokens=256)
    eng = Engine(r.path, expert_cache_size=1, prefetch_window=0)
    for t in range(5, 40):
        eng.forward([t])  # one token at a time: a lookup per layer each
    st = eng.stats().expert_cache
    assert st.hits + st.misses == 2 * 35 and sum(map(sum, st.activations)) == 2 * 35
    for rep in r.layers:
        assert rep.error_oracle <= min(rep.error_lsq, rep.error_gate) + 1e-6
    eng.close()


def test_bad_requests_are_refused(dense, tmp_path):
    with pytest.raises(ConfigError, match="do not split into 5 equal experts"):
        moefy(dense, tmp_path / "a", 5, 1, text=TEXT)
    with pytest.raises(ConfigError, match="top_k"):
        moefy(dense, tmp_path / "b", 3, 4, text=TEXT)
    r = moefy(dense, tmp_path / "c", 3, 1, text=TEXT, tokens=128)
    with pytest.raises(ConfigError, match="already an MoE"):
        moefy(r.path, tmp_path / "d", 3, 1, text=TEXT)


def test_planted_co_activation_groups_are_recovered_and_routed():
    """Neurons in 4 groups; each token excites one group (through 4 hidden directions): the
    clusters are the groups and the least-squares router picks the token's group."""
    rng = np.random.default_rng(0)
    T, D, n, per = 400, 16, 4, 8
    topic = rng.integers(0, n, T)
    dirs = np.linalg.qr(rng.standard_normal((D, D)))[0][:n]  # (n, D) orthonormal
    h = (3 * dirs[topic] + 0.1 * rng.standard_normal((T, D))).astype(np.float32)
    group = rng.permutation(np.repeat(np.arange(n), per))
    gate = (2 * dirs[group] + 0.05 * rng.standard_normal((n * per, D))).astype(np.float32)
    up = np.abs(gate)
    down = rng.standard_normal((D, n * per)).astype(np.float32)
    labels = balanced_clusters(np.abs(gate @ h.T), n)
    assert all(len(set(group[labels == e])) == 1 for e in range(n))  # each cluster one group
    labels, router, rep = moefy_layer(h, gate, up, down, n, 1, router="lsq")
    assert rep.recall_lsq > 0.95 and rep.error_lsq < 0.2


def lru_by_hand(stream, slots):
    cache, hits = OrderedDict(), 0
    for row in stream:
        for e in row:
            if e in cache:
                hits += 1
                cache.move_to_end(e)
                continue
            if len(cache) >= slots:
                cache.pop(next(c for c in cache if c not in row))
            cache[e] = None
    return hits


def test_replayed_policies_against_hand_counts_and_belady():
    assert routing.replay(np.array([[0], [1], [2], [0], [1], [3], [0]]), 2, "belady", 4) == (2, 7)  # 0,1 kept
    assert routing.replay(np.array([[0], [1], [2], [0], [1], [3], [0]]), 2, "lru", 4) == (0, 7)
    rng = np.random.default_rng(3)
    for slots in (2, 3, 5):
        stream = np.stack([rng.choice(8, 2, replace=False, p=np.arange(1, 9) / 36) for _ in range(300)])
        got = {p: routing.replay(stream, slots, p, 8, np.arange(8))[0] for p in routing.POLICIES}
        assert got["lru"] == lru_by_hand(stream.tolist(), slots)
        assert got["belady"] >= max(got.values())
    ids = rng.integers(0, 4, (50, 3, 1))
    assert routing.overlap(ids) == pytest.approx(np.mean(ids[1:] == ids[:-1]))


def test_colibri_convert_moefy_in_one_command(tmp_path):
    """From a Hugging Face folder: converted, then MoEfied on the default calibration text."""
    import subprocess
    import sys
    out = tmp_path / "moe"
    p = subprocess.run([sys.executable, "-m", "app.cli_convert", "--model_path", str(HF_FIXTURES / "llama"),
                        "--output_path", str(out), "--quantize", "f32", "--moefy", "3", "--top_k", "2"],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert "3 experts per layer, top-2" in p.stdout
    m = open_model_dir(out)
    assert (m.config.num_experts, m.config.top_k) == (3, 2) and m.meta["moefy"]["calibration_tokens"] > 1000
    assert not list(tmp_path.glob(".moefy-dense-*"))  # the intermediate dense folder is gone


def test_colibri_convert_moefy_needs_top_k(tmp_path):
    from app.cli_convert import main
    with pytest.raises(SystemExit):
        main(["--model_path", str(HF_FIXTURES / "llama"), "--output_path", str(tmp_path / "m"), "--moefy", "3"])
    assert not (tmp_path / "m").exists()
