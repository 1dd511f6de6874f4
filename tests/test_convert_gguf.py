"""GGUF files of every GGUF architecture (written as llama.cpp's converter writes them)."""
from __future__ import annotations

import gguf
import numpy as np
import pytest
from conftest import HF_ARCHS, HF_FIXTURES
from gguf import GGMLQuantizationType as Q
from gguf_fixtures import write_gguf, write_raw_gguf
from test_convert_hf import converted_tensors
from tokenizers import Tokenizer

from engine import errors
from engine.convert.convert import convert
from engine.model_dir import open_model_dir

GGUF_ARCH = {"llama": "llama", "mistral": "llama", "mixtral": "llama", "qwen2": "qwen2", "qwen3": "qwen3",
             "qwen2_moe": "qwen2moe", "qwen3_moe": "qwen3moe", "olmoe": "olmoe"}


@pytest.fixture(scope="module")
def hf_kept(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    return {a: converted_tensors(convert(HF_FIXTURES / a, root / a, "keep").path) for a in HF_ARCHS}


@pytest.mark.parametrize("arch", HF_ARCHS)
def test_f32_gguf_equals_the_hf_checkpoint(tmp_path, hf_kept, arch):
    """Same weights through GGUF (stacked experts, llama's permuted q/k) or safetensors: same model."""
    path = write_gguf(HF_FIXTURES / arch, tmp_path / "m.gguf", qtypes=Q.F32)
    assert gguf.GGUFReader(path).fields["general.architecture"].contents() == GGUF_ARCH[arch]
    out = convert(path, tmp_path / "out").path
    model = open_model_dir(out, verify=True)
    via_gguf, via_hf = converted_tensors(out), hf_kept[arch]
    assert via_gguf.keys() == via_hf.keys()
    for name in via_hf:
        if name == "rope_freqs.weight":
            np.testing.assert_allclose(via_gguf[name], via_hf[name], rtol=1e-6)
        else:
            assert np.array_equal(via_gguf[name], via_hf[name]), name
    cfg = model.config
    assert cfg.architecture == arch if arch != "mistral" else cfg.architecture == "llama"
    assert cfg.num_experts == {"mixtral": 8, "qwen3_moe": 8, "qwen2_moe": 4, "olmoe": 4}.get(arch, 1)


@pytest.mark.parametrize("arch", ["llama", "mixtral", "qwen2_moe", "olmoe"])
@pytest.mark.parametrize("qtype", [Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.MXFP4])
def test_quantized_gguf_is_imported_losslessly(tmp_path, arch, qtype):
    path = write_gguf(HF_FIXTURES / arch, tmp_path / "m.gguf", qtypes=qtype)
    reader = gguf.GGUFReader(path)
    out = convert(path, tmp_path / "out").path
    ours = converted_tensors(out)
    model = open_model_dir(out)
    stored_types = {}
    for rel in model.files():
        stored_types |= {n: i.qtype.plain.type_id for n, i in model.tensor_file(rel).infos.items()}
    e = 0
    for t in reader.tensors:
        ref = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type).astype(np.float32)
        name = t.name
        if "_exps." in name:  # stacked experts: compare expert e of the GGUF with our expert file
            for e in range(ref.shape[0]):
                ours_name = name.replace("_exps.weight", f".{e}.weight")
                assert np.array_equal(ours[ours_name], ref[e]), ours_name
                assert stored_types[ours_name] == int(t.tensor_type)
            continue
        if name.endswith((".ffn_gate.weight", ".ffn_up.weight", ".ffn_down.weight")):
            name = name.replace(".weight", ".0.weight")
        if arch in ("llama", "mixtral") and name.endswith((".attn_q.weight", ".attn_k.weight")):
            continue  # rows reordered: covered by the f32 comparison above
        assert np.array_equal(ours[name].reshape(ref.shape), ref), name
        assert stored_types[name] == int(t.tensor_type), name


@pytest.mark.parametrize("qtype", [Q.Q4_K, Q.Q5_K, Q.Q6_K])
def test_k_quants_are_imported_losslessly(tmp_path, qtype):
    from gguf_fixtures import make_wide_gguf
    path = make_wide_gguf(tmp_path / "wide.gguf", qtypes=qtype)
    reader = gguf.GGUFReader(path)
    assert sum(t.tensor_type == qtype for t in reader.tensors) >= 7
    out = convert(path, tmp_path / "out").path
    model = open_model_dir(out, verify=True)
    f = model.tensor_file("experts/layer_1_expert_0.bin")
    src = next(t for t in reader.tensors if t.name == "blk.1.ffn_down.weight")
    assert f.infos["blk.1.ffn_down.0.weight"].qtype.plain.type_id == int(qtype)
    assert np.array_equal(f.stored("blk.1.ffn_down.0.weight"), np.asarray(src.data))  # same bytes (repacked on disk)
    ref = gguf.quants.dequantize(np.asarray(src.data), qtype)
    assert np.array_equal(f.dequantize("blk.1.ffn_down.0.weight"), ref)


def test_k_quant_source_requantized_to_int4_keeps_q4_k(tmp_path):
    """Q4_K is already 4-bit: --quantize int4 copies it; Q6_K gets re-rounded to Q4_1."""
    from gguf_fixtures import make_wide_gguf
    path = make_wide_gguf(tmp_path / "w.gguf", qtypes={"blk.*.ffn_*": Q.Q4_K, "blk.*.attn_*": Q.Q6_K})
    out = convert(path, tmp_path / "out", "int4").path
    model = open_model_dir(out)
    types = {}
    for rel in model.files():
        types |= {n: i.qtype.plain.name for n, i in model.tensor_file(rel).infos.items()}
    assert types["blk.0.ffn_up.0.weight"] == "q4_k"
    assert types["blk.0.attn_v.weight"] == "q4_1"


def test_tokenizer_built_from_gguf_matches_hf(tmp_path):
    """The BPE rebuilt from the GGUF vocabulary and merges encodes like the original tokenizer.json."""
    path = write_gguf(HF_FIXTURES / "qwen2", tmp_path / "m.gguf", qtypes=Q.F16)
    out = convert(path, tmp_path / "out").path
    ours = Tokenizer.from_file(str(out / "tokenizer.json"))
    ref = Tokenizer.from_file(str(HF_FIXTURES / "qwen2" / "tokenizer.json"))
    texts = ["Hello, world! What is 2+3?", "def add(a, b):\n    return a + b\n\n", "中文 text 12345 ok",
             "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n", "tabs\tand   spaces  \n\n"]
    for text in texts:
        assert ours.encode(text).ids == ref.encode(text).ids, text
        assert ours.decode(ours.encode(text).ids, skip_special_tokens=False) == text
    meta = open_model_dir(out).meta["tokenizer"]
    assert meta["eos_token_ids"] == [ref.token_to_id("<|im_end|>")]


def test_truncated_gguf(tmp_path, default_gguf):
    cut = tmp_path / "cut.gguf"
    with open(default_gguf, "rb") as f:
        cut.write_bytes(f.read(40_000_000))
    with pytest.raises(errors.SourceFormatError, match="truncated"):
        convert(cut, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_not_a_gguf(tmp_path):
    p = tmp_path / "x.gguf"
    p.write_bytes(b"PK\x03\x04 not a gguf at all")
    with pytest.raises(errors.SourceFormatError, match="not a GGUF file"):
        convert(p, tmp_path / "out")


def test_unknown_gguf_architecture(tmp_path):
    p = write_raw_gguf(tmp_path / "gpt2.gguf", "gpt2", {"token_embd.weight": np.zeros((4, 32), np.float32)})
    with pytest.raises(errors.UnsupportedArchitectureError, match="'gpt2' is not supported; supported: llama"):
        convert(p, tmp_path / "out")


@pytest.mark.parametrize("qtype", [Q.IQ2_XXS, Q.IQ3_S, Q.IQ1_M, Q.TQ1_0])
def test_unsupported_gguf_tensor_type(tmp_path, qtype):
    """Types no preset of Colibri's list writes are refused on opening, naming the tensor, the
    type and the presets to use instead."""
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    raw = np.zeros((4, 256 // block * size), np.uint8)
    p = write_raw_gguf(tmp_path / "iq.gguf", "llama", {"blk.0.attn_v.weight": (raw, qtype)})
    with pytest.raises(errors.SourceFormatError, match=rf"'blk.0.attn_v.weight' has GGML type {qtype.name}, which "
                                                       r"Colibri does not import; re-quantize it with a preset "
                                                       r"Colibri imports: Q4_K_M, Q5_K_M, Q6_K, Q8_0 or IQ4_XS"):
        convert(p, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_gguf_missing_and_extra_tensors(tmp_path):
    from gguf_fixtures import TensorSpec, convert_hf
    plan = convert_hf(HF_FIXTURES / "qwen3", qtypes=Q.F32)
    plan.tensors.pop("blk.1.attn_k_norm.weight")
    plan.write(tmp_path / "missing.gguf")
    with pytest.raises(errors.MissingTensorError, match="'blk.1.attn_k_norm.weight'"):
        convert(tmp_path / "missing.gguf", tmp_path / "out")
    plan = convert_hf(HF_FIXTURES / "qwen3", qtypes=Q.F32)
    plan.tensors["blk.0.mystery.weight"] = TensorSpec("blk.0.mystery.weight", np.zeros((2, 32), np.float32), Q.F32)
    plan.write(tmp_path / "extra.gguf")
    with pytest.raises(errors.UnexpectedTensorError, match="blk.0.mystery.weight"):
        convert(tmp_path / "extra.gguf", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_gguf_metadata_contradicts_weights(tmp_path):
    from gguf_fixtures import convert_hf
    plan = convert_hf(HF_FIXTURES / "olmoe", qtypes=Q.F32)
    plan.set_key("olmoe.attention.head_count_kv", 4)
    plan.write(tmp_path / "bad.gguf")
    with pytest.raises(errors.ConfigError, match=r"'blk.0.attn_k.weight' has shape \[32, 64\] but the config "
                                                 r"implies \[64, 64\]"):
        convert(tmp_path / "bad.gguf", tmp_path / "out")
