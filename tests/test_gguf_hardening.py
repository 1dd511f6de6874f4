"""Corrupt and absurd GGUF headers are errors that name the key or tensor, raised before any
allocation or long loop (engine/convert/gguf_file.py: check_layout and the metadata limits)."""
from __future__ import annotations

import struct

import gguf
import pytest
from conftest import HF_FIXTURES, TESTS
from gguf import GGUFValueType as V

from engine import errors
from engine.convert.convert import convert

TINY = TESTS / "fixtures" / "llamacpp_presets" / "tiny-q4_0.gguf"


@pytest.mark.parametrize("key,value,vtype,match", [
    ("llama.block_count", 2 ** 31, V.UINT32, r"llama.block_count = 2147483648 is out of range \(expected 1 to 4096\)"),
    ("llama.attention.head_count", 0, V.UINT32, r"llama.attention.head_count = 0 is out of range"),
    ("llama.vocab_size", 2 ** 40, V.UINT64, r"llama.vocab_size = 1099511627776 is out of range"),
    ("llama.context_length", -5, V.INT32, r"llama.context_length = -5 is out of range"),
    ("llama.embedding_length", "64", V.STRING, r"llama.embedding_length = '64' is not an integer"),
    ("llama.attention.head_count_kv", 3, V.UINT32, r"head_count = 4 is not a multiple of llama.attention.head_count_kv"),
    ("llama.rope.freq_base", float("nan"), V.FLOAT32, r"llama.rope.freq_base = nan is not a positive number"),
])
def test_absurd_hyper_parameters_name_the_key(tmp_path, key, value, vtype, match):
    from gguf_fixtures import convert_hf
    plan = convert_hf(HF_FIXTURES / "llama", qtypes=gguf.GGMLQuantizationType.F32)
    plan.set_key(key, value, vtype)
    plan.write(tmp_path / "bad.gguf")
    with pytest.raises(errors.ConfigError, match=match):
        convert(tmp_path / "bad.gguf", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def _patched(tmp_path, patch) -> object:
    """A copy of TINY with `patch(reader, bytearray)` applied."""
    data = bytearray(TINY.read_bytes())
    patch(gguf.GGUFReader(TINY), data)
    out = tmp_path / "corrupt.gguf"
    out.write_bytes(data)
    return out


def _tensor_info(reader, name: str) -> tuple[int, int]:
    """Byte offsets of a tensor info's first dimension and of its data offset."""
    t = next(t for t in reader.tensors if t.name == name)
    dims = t.field.offset + 8 + len(name.encode()) + 4
    return dims, dims + 8 * len(t.shape) + 4


def _array_count(reader, key: str) -> int:
    return reader.fields[key].offset + 8 + len(key.encode()) + 4 + 4


@pytest.mark.parametrize("what,patch,match", [
    ("a tensor offset past the end",
     lambda r, d: struct.pack_into("<Q", d, _tensor_info(r, "blk.1.ffn_up.weight")[1], 1 << 40),
     r"tensor 'blk.1.ffn_up.weight' ends at byte \d+ but the file has \d+ bytes"),
    ("a dimension past the end",
     lambda r, d: struct.pack_into("<Q", d, _tensor_info(r, "output.weight")[0] + 8, 1 << 50),
     r"tensor 'output.weight' ends at byte"),
    ("a zero dimension",
     lambda r, d: struct.pack_into("<Q", d, _tensor_info(r, "output.weight")[0], 0),
     r"tensor 'output.weight' has dimensions \[0, 384\]"),
    ("an array of 2^40 strings",
     lambda r, d: struct.pack_into("<Q", d, _array_count(r, "tokenizer.ggml.tokens"), 1 << 40),
     r"metadata 'tokenizer.ggml.tokens' claims 1099511627776 items"),
    ("a tensor count of 2^60",
     lambda r, d: struct.pack_into("<Q", d, 8, 1 << 60), r"header claims \d+ metadata keys and 1152921504606846976"),
    ("a key longer than the file",
     lambda r, d: struct.pack_into("<Q", d, 24, 1 << 33), r"GGUF metadata key needs 8589934592 bytes"),
    ("version 7", lambda r, d: struct.pack_into("<I", d, 4, 7), r"GGUF version 7 is not supported"),
    ("a cut header", lambda r, d: d.__delitem__(slice(2000, None)), r"(needs \d+ bytes at byte \d+ but the file has 2000|claims \d+ items, more than the \d+ bytes left)"),
])
def test_corrupt_layout_is_named_before_any_allocation(tmp_path, what, patch, match):
    path = _patched(tmp_path, patch)
    with pytest.raises(errors.SourceFormatError, match=match):  # (2^40 items: no walk over them)
        convert(path, tmp_path / "out")
    assert not (tmp_path / "out").exists(), what


@pytest.mark.parametrize("key,value", [("num_hidden_layers", 2 ** 31), ("num_attention_heads", 0),
                                       ("vocab_size", 2 ** 40), ("hidden_size", "64"), ("intermediate_size", -1)])
def test_absurd_hf_config_values_name_the_key(tmp_path, key, value):
    """The same for a Hugging Face folder's config.json."""
    import json
    import shutil
    folder = tmp_path / "hf"
    shutil.copytree(HF_FIXTURES / "llama", folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg[key] = value
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(errors.ConfigError, match=rf"config.json '{key}' = {value!r} is out of range"):
        convert(folder, tmp_path / "out")


def test_a_head_count_that_does_not_split_the_rows_is_named(tmp_path):
    """Found by the fuzzer: llama's q/k rows are un-permuted per head before the shape check."""
    def patch(r, d):
        f = r.fields["llama.attention.head_count"]
        struct.pack_into("<I", d, f.offset + 8 + len(b"llama.attention.head_count") + 4, 6)
    with pytest.raises(errors.ConfigError, match=r"tensor 'blk.0.attn_q.weight' has 256 rows, which do not split into "
                                                 r"6 heads"):
        convert(_patched(tmp_path, patch), tmp_path / "out")
