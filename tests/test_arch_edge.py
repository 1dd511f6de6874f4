"""Gemma 4's edge models (E2B/E4B) beyond their logits (tests/test_arch_engine.py holds those to
transformers): the KV-shared layers keep no cache, the memory estimate knows it, and the configs
transformers refuses or this engine cannot run are refused by name."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest
from arch_reference import ARCH_FIXTURES

from engine.arch import spec
from engine.convert.hf import config_from_hf
from engine.errors import ConfigError
from engine.kvcache import model_cache_bytes, position_bytes

E2B = ARCH_FIXTURES / "gemma4_e2b"


def test_edge_config_reads_every_part():
    c = config_from_hf(E2B)
    assert (c.num_experts, c.intermediate_size, c.dense_intermediate_size) == (1, 48, 0)
    assert (c.per_layer_input_size, c.per_layer_vocab_size, c.kv_shared_layers) == (8, 456, 2)
    assert c.double_wide_mlp and c.full_v
    assert [c.kv_source(L) for L in range(6)] == [0, 1, 2, 3, 2, 3]  # the last of each kind before 4
    assert [c.mlp_width(L) for L in range(6)] == [48] * 4 + [96] * 2
    assert {"per_layer_inputs", "kv_sharing"} <= spec(c.architecture).features(c)


def test_shared_layers_hold_no_cache():
    c = config_from_hf(E2B)
    alone = replace(c, kv_shared_layers=0)
    for n in (3, 100):  # the shared ones would hold a ring (layer 4) and a growing full cache (layer 5)
        kv = min(n, 5) * position_bytes(2, 20, kind="f32") + n * position_bytes(2, 40, kind="f32")
        assert model_cache_bytes(alone, n, "f32") - model_cache_bytes(c, n, "f32") == kv


@pytest.mark.parametrize("change,words", [({"num_kv_shared_layers": 6}, "num_kv_shared_layers"),
                                          ({"num_kv_shared_layers": 5}, "no layer before 1"),
                                          ({"use_bidirectional_attention": "all"}, "bidirectional")])
def test_what_runs_otherwise_is_refused_by_name(tmp_path, change, words):
    cfg = json.loads((E2B / "config.json").read_text()) | change
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match=words):
        config_from_hf(tmp_path)


def test_kept_keys_of_shared_layers_are_ignored(tmp_path):
    """A checkpoint that keeps the KV-shared layers' k/v projections and k norm (transformers ignores
    them on load) converts, and runs as without them."""
    import numpy as np
    from safetensors.numpy import save_file

    from engine.api import Engine
    from engine.convert.convert import convert
    for f in E2B.iterdir():
        (tmp_path / f.name).write_bytes(f.read_bytes())
    rng, a = np.random.default_rng(0), "model.layers.{}.self_attn."
    save_file({a.format(4) + "k_proj.weight": rng.standard_normal((40, 72), np.float32),
               a.format(4) + "v_proj.weight": rng.standard_normal((40, 72), np.float32),
               a.format(5) + "k_norm.weight": rng.standard_normal(40, np.float32)}, tmp_path / "extra.safetensors")
    convert(tmp_path, tmp_path / "model", "f32")
    ref = np.load(E2B / "reference.npz")
    with Engine(tmp_path / "model", threads=2, kv_cache_quantize="f32") as e:
        got = e.logits(ref["input_ids"].tolist())
    assert np.abs(got - ref["logits"]).max() < 1e-4 * np.abs(ref["logits"]).max()


def test_per_layer_table_is_not_counted_resident(tmp_path):
    """The per-layer table (E2B: 262144 x 35 x 256) stays mapped like the embedding: the load plan
    does not count it as resident memory."""
    from engine import tensorfile
    from engine.cache_plan import plan_expert_cache
    from engine.convert.convert import convert
    from engine.model_dir import open_model_dir
    convert(E2B, tmp_path / "model", "f32")
    model = open_model_dir(tmp_path / "model")
    infos, _ = tensorfile.read_header(tmp_path / "model" / "embeddings.bin")
    bins = sum(e["size"] for rel, e in model.manifest["files"].items() if rel.endswith(".bin"))
    plan = plan_expert_cache(model, {}, 64, available=1 << 34)
    assert plan.resident_bytes == bins - infos["per_layer_token_embd.weight"].nbytes  # (the embedding is tied)
