"""The real default model (SmolLM2-135M-Instruct Q4_1 GGUF): located, converted losslessly."""
from __future__ import annotations

import gguf
import numpy as np
import pytest
from tokenizers import Tokenizer

from engine.convert.gguf_file import unpermute_order
from engine.model_dir import open_model_dir


@pytest.fixture(scope="module")
def reader(default_gguf):
    return gguf.GGUFReader(default_gguf)


def internal_name(gguf_name: str) -> str:
    """GGUF name -> ours: a dense MLP is expert 0."""
    for proj in ("ffn_gate", "ffn_up", "ffn_down"):
        if gguf_name.endswith(f".{proj}.weight"):
            return gguf_name.replace(f".{proj}.weight", f".{proj}.0.weight")
    return gguf_name


def test_default_model_is_installed(default_gguf):
    assert default_gguf.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and default_gguf.stat().st_size > 90e6


def test_converted_model_verifies(default_converted):
    m = open_model_dir(default_converted, verify=True)
    c = m.config
    assert (c.architecture, c.num_layers, c.hidden_size, c.num_heads, c.num_kv_heads) == ("llama", 30, 576, 9, 3)
    assert c.tie_word_embeddings and c.num_experts == 1 and c.vocab_size == 49152
    assert m.meta["quantization"]["tensor_types"] == {"q4_1": 210, "q8_0": 1, "f32": 61}


def test_every_tensor_is_lossless(default_converted, reader):
    """Our blocks are the GGUF's blocks (q/k rows back in HF order): dequantized bit for bit."""
    m = open_model_dir(default_converted)
    ours = {}
    for rel in m.files():
        f = m.tensor_file(rel)
        ours.update({n: (f.stored(n), f.infos[n].qtype.plain.name) for n in f.names()})  # (experts: repacked on disk)
    assert len(ours) == len(reader.tensors)
    for t in reader.tensors:
        stored, qname = ours[internal_name(t.name)]
        assert qname == t.tensor_type.name.lower()
        raw = np.asarray(t.data)
        ref = gguf.quants.dequantize(raw, t.tensor_type).astype(np.float32)
        if t.name.endswith((".attn_q.weight", ".attn_k.weight")):
            heads = 9 if ".attn_q." in t.name else 3
            order = unpermute_order(heads, raw.shape[0])
            raw, ref = raw[order], ref[order]
        assert np.array_equal(stored.reshape(raw.shape), raw), t.name
        from engine import quant
        assert np.array_equal(quant.dequantize(stored, qname).view(np.uint32), ref.view(np.uint32)), t.name


def test_tokenizer_from_gguf_vocabulary(default_converted, reader):
    tok = Tokenizer.from_file(str(default_converted / "tokenizer.json"))
    tokens = [bytes(reader.fields["tokenizer.ggml.tokens"].parts[i]).decode()
              for i in reader.fields["tokenizer.ggml.tokens"].data[:3]]
    assert [tok.token_to_id(t) for t in tokens] == [0, 1, 2]
    for text in ["Hello, world!", "def f(x):\n    return x ** 2\n", "数字 12345 and émoji 🐦",
                 "<|im_start|>user\nHi<|im_end|>\n", "  leading   spaces\t\ttabs"]:
        ids = tok.encode(text).ids
        assert tok.decode(ids, skip_special_tokens=False) == text
    assert tok.encode("<|im_start|>user").ids[0] == 1  # special tokens stay whole
    assert tok.encode("123").ids == [tok.token_to_id(d) for d in "123"]  # smollm: digits one by one


def test_chat_template_and_special_tokens(default_converted, reader):
    template = (default_converted / "chat_template.jinja").read_text()
    assert template == reader.fields["tokenizer.chat_template"].contents()
    meta = open_model_dir(default_converted).meta["tokenizer"]
    assert meta["eos_token"] == "<|im_end|>" and meta["eos_token_ids"] == [2] and meta["add_bos_token"] is False


def test_requantized_to_int8(tmp_path, default_gguf):
    """Asking for int8 re-rounds the Q4_1 weights once: small error against the source values."""
    from engine.convert.convert import convert
    out = convert(default_gguf, tmp_path / "int8", "int8").path
    m = open_model_dir(out)
    f = m.tensor_file("experts/layer_5_expert_0.bin")
    assert f.infos["blk.5.ffn_up.0.weight"].qtype.plain.name == "q8_0"
    r = gguf.GGUFReader(default_gguf)
    src = next(t for t in r.tensors if t.name == "blk.5.ffn_up.weight")
    ref = gguf.quants.dequantize(np.asarray(src.data), src.tensor_type)
    got = f.dequantize("blk.5.ffn_up.0.weight")
    assert np.sqrt(np.mean((got - ref) ** 2) / np.mean(ref ** 2)) < 0.006
    assert m.meta["quantization"]["tensor_types"]["q8_0"] == 211
