"""What a source is before converting it: facts, parameter counts and memory estimates (no Qt)."""
from __future__ import annotations

import pytest
from conftest import HF_FIXTURES
from gguf import GGMLQuantizationType as Q
from gguf_fixtures import write_gguf

from app.model_info import QUANTIZE, default_target, human_bytes, inspect
from engine.convert.convert import convert
from engine.errors import ColibriError


def test_hf_mixtral_facts_params_and_sizes_match_a_real_conversion(tmp_path):
    s = inspect(HF_FIXTURES / "mixtral")
    c = s.config
    assert (s.kind, c.architecture, c.num_layers, c.num_experts, c.top_k) == ("huggingface", "mixtral", 2, 8, 2)
    facts = dict(s.facts())
    assert facts["Experts"].startswith("8 per layer") and facts["Top-k"].startswith("2 experts")
    expert = 3 * c.intermediate_size * c.hidden_size  # gate, up, down of one expert
    assert s.params_total - s.params_active == (c.num_experts - c.top_k) * c.num_layers * expert
    assert s.sizes["int4"].total < s.sizes["int8"].total < s.sizes["f16"].total < s.sizes["keep"].total
    for q in ("keep", "int8"):  # the plan's bytes are the converter's bytes
        result = convert(HF_FIXTURES / "mixtral", tmp_path / q, q)
        assert result.bytes_written == s.sizes[q].total
        assert s.sizes[q].one_expert * c.num_layers * c.num_experts == s.sizes[q].experts


def test_memory_table_grows_by_one_expert_per_layer_per_cache_slot():
    s = inspect(HF_FIXTURES / "mixtral")
    rows = s.memory_table("int8")
    assert [r.experts_per_layer for r in rows] == [2, 4, 8]
    step = s.sizes["int8"].one_expert * s.config.num_layers
    assert rows[1].ram_bytes - rows[0].ram_bytes == 2 * step
    assert rows[0].ram_bytes == s.sizes["int8"].dense + 2 * step + s.kv_bytes()
    assert "disk" in rows[0].note and "all experts" in rows[-1].note
    assert s.kv_bytes(kind="int8") < s.kv_bytes(kind="f16") < s.kv_bytes(kind="f32")


def test_gguf_source_keeps_its_blocks_by_default(tmp_path):
    path = write_gguf(HF_FIXTURES / "qwen2_moe", tmp_path / "m.gguf", qtypes=Q.Q8_0)
    s = inspect(path)
    assert s.kind == "gguf" and s.default_quantize == "keep" and s.name == "m"
    assert "Q8_0" in dict(s.facts())["Source"] and "shared expert" in dict(s.facts())["Experts"]
    assert s.sizes["keep"].total == s.sizes["int8"].total  # Q8_0 is int8's family: kept as it is


def test_dense_model_has_one_memory_row(tmp_path):
    s = inspect(HF_FIXTURES / "llama")
    assert not s.config.is_moe and s.params_active == s.params_total
    rows = s.memory_table("f16")
    assert len(rows) == 1 and rows[0].ram_bytes == s.sizes["f16"].total + s.kv_bytes()
    assert default_target(tmp_path, s, "keep") == tmp_path / "llama"
    assert default_target(tmp_path, s, "int4") == tmp_path / "llama-int4"
    assert set(s.sizes) == set(QUANTIZE)


def test_a_source_the_converter_refuses_is_refused_with_its_message(tmp_path):
    (tmp_path / "config.json").write_text('{"architectures": ["GPT2LMHeadModel"]}')
    with pytest.raises(ColibriError, match="GPT2LMHeadModel|supported"):
        inspect(tmp_path)
    assert human_bytes(999) == "999 B" and human_bytes(1_500_000) == "1.5 MB"
