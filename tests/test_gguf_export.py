"""GGUF export: our blocks go back into llama.cpp's layout without re-rounding."""
from __future__ import annotations

import gguf
import numpy as np
import pytest
from conftest import HF_FIXTURES
from test_convert_hf import converted_tensors

from engine.convert.convert import convert
from engine.convert.gguf_export import export_gguf
from engine.errors import ConversionError
from engine.model_dir import open_model_dir


@pytest.mark.parametrize("arch,quantize", [("mixtral", "int8"), ("llama", "keep"), ("mistral", "int4")])
def test_export_then_import_is_identity(tmp_path, arch, quantize):
    ours = convert(HF_FIXTURES / arch, tmp_path / "a", quantize).path
    path = export_gguf(ours, tmp_path / "m.gguf")
    r = gguf.GGUFReader(path)
    assert r.fields["general.architecture"].contents() == "llama"
    names = {t.name for t in r.tensors}
    if arch == "mixtral":
        assert "blk.0.ffn_gate_exps.weight" in names and r.fields["llama.expert_count"].contents() == 8
    back = converted_tensors(convert(path, tmp_path / "b").path)
    first = converted_tensors(ours)
    assert back.keys() == first.keys()
    assert all(np.array_equal(back[k], first[k]) for k in first)


def test_unsupported_architecture(tmp_path):
    ours = convert(HF_FIXTURES / "qwen2_moe", tmp_path / "a", "keep").path
    with pytest.raises(ConversionError, match="GGUF export supports"):
        export_gguf(ours, tmp_path / "x.gguf")


def test_requantized_export_rounds_the_matrices_and_keeps_the_rest(tmp_path):
    """The benchmark's Q4_0 model: matrices re-rounded to Q4_0, embeddings/output/routers kept,
    and Colibri imports the Q4_0 blocks unchanged (both engines read the same bytes)."""
    ours = convert(HF_FIXTURES / "mixtral", tmp_path / "a", "int8").path
    path = export_gguf(ours, tmp_path / "q4.gguf", requantize="q4_0")
    types = {t.name: gguf.GGMLQuantizationType(t.tensor_type).name for t in gguf.GGUFReader(path).tensors}
    assert types["blk.0.attn_q.weight"] == types["blk.1.ffn_down_exps.weight"] == "Q4_0"
    assert types["blk.0.attn_output.weight"] == "Q4_0" and types["output.weight"] == "Q8_0"
    assert types["token_embd.weight"] == "Q8_0" and types["blk.0.ffn_gate_inp.weight"] == "F32"
    assert types["blk.0.attn_norm.weight"] == "F32"
    model = convert(path, tmp_path / "b").path
    with open_model_dir(model).tensor_file("attention/layer_0.bin") as f:
        assert f.infos["blk.0.attn_q.weight"].qtype.name == "q4_0"
    back, first = converted_tensors(model), converted_tensors(ours)
    w4, w8 = back["blk.0.attn_q.weight"], first["blk.0.attn_q.weight"]
    assert not np.array_equal(w4, w8) and np.abs(w4 - w8).max() < 0.2 * np.abs(w8).max()  # re-rounded, at 4 bits
    assert np.array_equal(back["token_embd.weight"], first["token_embd.weight"])
