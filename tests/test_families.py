"""engine/families: each family declared once, in its own file, and gathered by engine.arch."""
from __future__ import annotations

from pathlib import Path

import pytest

import engine.families
from engine import arch
from engine.convert import gguf_file, names


def test_every_family_file_is_gathered_and_declares_its_own_specs():
    files = {p.stem for p in Path(engine.families.__file__).parent.glob("*.py")} - {"__init__", "spec"}
    assert {f.name for f in arch.FAMILIES} == files  # a new file that is not listed would be ignored
    for f in arch.FAMILIES:
        assert f.specs and all(s.family == f.name for s in f.specs), f.name
        assert all(arch.family(s.name) is f for s in f.specs)
    assert list(arch.SPECS) == [s.name for f in arch.FAMILIES for s in f.specs]  # no name declared twice


@pytest.mark.parametrize("fam", arch.FAMILIES, ids=lambda f: f.name)
def test_a_family_names_its_tensors_by_its_own_table(fam):
    """The first row of the family's table answers; Hugging Face names are not shared between
    families by accident (LFM2's attention norm is operator_norm, Gemma 4's ffn_norm the pre-FFN norm)."""
    internal, sources = fam.hf_tensors[0]
    assert names.hf_names(internal.replace("{L}", "3").replace("{E}", "5"), fam) == \
        [s.replace("{L}", "3").replace("{E}", "5") for s in sources]
    want = {"lfm2": "model.layers.3.operator_norm.weight", "qwen3_5": "model.layers.3.input_layernorm.weight@plus1"}
    assert names.hf_names("blk.3.attn_norm.weight", fam) == [want.get(fam.name, "model.layers.3.input_layernorm.weight")]
    assert names.hf_names("blk.3.ffn_norm.weight", fam)[0].endswith(
        {"lfm2": "ffn_norm.weight", "gemma4": "pre_feedforward_layernorm.weight",
         "qwen3_5": "post_attention_layernorm.weight@plus1"}.get(fam.name, "post_attention_layernorm.weight"))


def test_a_familys_own_gguf_keys_are_bounded_once():
    for f in arch.FAMILIES:
        for key, bounds in f.gguf_limits.items():
            assert gguf_file.LIMITS[key] == bounds
    own = [k for f in arch.FAMILIES for k in f.gguf_limits]
    assert len(own) == len(set(own))  # no two families bound the same key differently
