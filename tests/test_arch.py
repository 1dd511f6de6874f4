"""engine.arch: the one spec per architecture — what each resolves to for a model, what it
refuses (by architecture and feature name), and that the next architectures are spec rows."""
from __future__ import annotations

import dataclasses
import json

import pytest
from conftest import HF_ARCHS, HF_FIXTURES

from engine import arch
from engine.arch import ArchSpec, UnsupportedFeatureError
from engine.convert.hf import config_from_hf
from engine.errors import ModelFormatError
from engine.model_dir import ModelConfig

# what each committed fixture's model uses (read from transformers' config.json by the converter)
WANT = {
    "llama": {"rope:llama3"}, "mistral": set(), "qwen2": {"qkv_bias"}, "qwen3": {"qk_norm:head"},
    "mixtral": {"router:softmax_topk"}, "qwen2_moe": {"router:softmax_topk", "qkv_bias", "shared_expert:sigmoid_gate"},
    "qwen3_moe": {"router:softmax_topk", "qk_norm:head"}, "olmoe": {"router:softmax_topk", "qk_norm:full"},
}


def _cfg(**kw) -> ModelConfig:
    base = dict(architecture="llama", vocab_size=32, hidden_size=16, num_layers=2, num_heads=2, num_kv_heads=1,
                head_dim=8, intermediate_size=32)
    return ModelConfig(**(base | kw))


@pytest.mark.parametrize("name", HF_ARCHS)
def test_each_fixture_resolves_to_the_parts_it_has(name):
    cfg = config_from_hf(HF_FIXTURES / name)
    sp = arch.spec(cfg.architecture)
    hf_class = json.loads((HF_FIXTURES / name / "config.json").read_text())["architectures"][0]
    assert arch.HF_CLASSES[hf_class] is sp and sp.name == name
    rope = set() if name == "llama" else {"rope:default"}
    assert sp.features(cfg) == WANT[name] | {"attention"} | rope
    if name == "llama":  # llama3 rope: the converter turns it into rope_freqs divisors
        with pytest.raises(UnsupportedFeatureError, match="llama: rope:llama3"):
            sp.check(cfg)
        cfg = dataclasses.replace(cfg, rope_scaling=None, rope_freq_factors=True)
    sp.check(cfg)  # the engine computes all of them
    windowed = dataclasses.replace(cfg, sliding_window=4)
    assert sp.layer_types(windowed) == ("sliding_attention",) * cfg.num_layers
    assert sp.features(windowed) - sp.features(cfg) == {"sliding_attention"}


def test_unimplemented_features_are_refused_by_name():
    with pytest.raises(UnsupportedFeatureError, match=r"llama: rope:llama3 not supported yet"):
        arch.spec("llama").check(_cfg(rope_scaling={"type": "llama3", "factor": 8.0}))
    with pytest.raises(UnsupportedFeatureError, match="rope scaling 'ntk' is not a variant"):
        arch.spec("llama").check(_cfg(rope_scaling={"type": "ntk", "factor": 4.0}))
    assert issubclass(UnsupportedFeatureError, NotImplementedError) and issubclass(UnsupportedFeatureError,
                                                                                   ModelFormatError)


def test_unknown_architecture_names_the_supported_ones():
    with pytest.raises(ModelFormatError, match="'gpt2' is not supported; supported: llama, mistral"):
        arch.spec("gpt2")


def test_the_next_architectures_are_spec_rows_not_classes():
    """gpt-oss and an LFM2-style MoE, written as specs: their parts are named features, and
    what a forward pass lacks is refused with the architecture's name (engine.arch.SPECS now has
    both as rows, which the engine runs: tests/test_arch_engine.py)."""
    without = arch.IMPLEMENTED - {"attention_sinks", "expert_bias", "o_bias", "router:topk_softmax", "swiglu_clamp",
                                  "dense_leading_layers", "router:sigmoid_bias"}
    gpt_oss = ArchSpec("gpt_oss", ("GptOssForCausalLM",), "gpt-oss", "mixtral", moe=True, router="topk_softmax",
                       attention_sinks=True, o_bias=True, qkv_bias=True, expert_bias=True, swiglu_clamp=True)
    cfg = _cfg(architecture="gpt_oss", num_experts=4, top_k=2, attention_bias=True, sliding_window=8)
    assert {"attention_sinks", "router:topk_softmax", "o_bias", "expert_bias", "swiglu_clamp"} <= gpt_oss.features(cfg)
    with pytest.raises(UnsupportedFeatureError, match="gpt_oss: attention_sinks, expert_bias, o_bias, "
                                                      "router:topk_softmax, swiglu_clamp not supported yet"):
        gpt_oss.check(cfg, without)
    lfm2 = ArchSpec("lfm2_moe", ("Lfm2MoeForCausalLM",), None, "mixtral", moe=True, router="sigmoid_bias",
                    layer_kinds=("attention", "short_conv"), dense_leading_layers=True)
    cfg = _cfg(architecture="lfm2_moe", num_experts=4, top_k=2, dense_layers=1)
    assert {"router:sigmoid_bias", "dense_leading_layers"} <= lfm2.features(cfg) <= set(arch.FEATURES)
    with pytest.raises(UnsupportedFeatureError, match="lfm2_moe: dense_leading_layers, router:sigmoid_bias not"):
        lfm2.check(cfg, without)


def test_specs_are_frozen_and_each_source_name_maps_once():
    with pytest.raises(dataclasses.FrozenInstanceError):
        arch.spec("llama").moe = True  # type: ignore[misc]
    assert len(arch.HF_CLASSES) == sum(len(s.hf_classes) for s in arch.SPECS.values())
    assert arch.gguf_spec("llama", 8).name == "mixtral" and arch.gguf_spec("llama", 0).name == "llama"
    assert arch.gguf_spec("qwen3moe", 8).name == "qwen3_moe" and arch.gguf_spec("gpt2", 0) is None
    assert arch.spec("mixtral").renormalises(_cfg(norm_topk_prob=False))  # fixed by the family
    assert not arch.spec("olmoe").renormalises(_cfg(norm_topk_prob=False))  # the model's own setting
