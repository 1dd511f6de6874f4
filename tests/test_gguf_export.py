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
