"""The tokenizers of the 2026 architectures: each fixture's tokenizer.json and the tokenizer Colibri
builds from llama.cpp's GGUF of it, against llama.cpp's own tokenization (tests/fixtures/arch/*/
llamacpp.json, special tokens matched, no BOS added)."""
from __future__ import annotations

import json
import unicodedata
from pathlib import Path

import pytest
from arch_reference import ARCH_FIXTURES, ARCHS
from tokenizers import Tokenizer

from engine.convert.tokenizer_import import from_gguf_fields

GGUFS = Path(__file__).resolve().parent / "fixtures" / "arch_llamacpp"


def llamacpp(arch: str) -> list[dict]:
    return json.loads((ARCH_FIXTURES / arch / "llamacpp.json").read_text())["tokenize"]


def gguf_tokenizer(arch: str):
    import gguf
    r = gguf.GGUFReader(str(GGUFS / f"{arch}-f16.gguf"))
    fields = {k: f.contents() for k, f in r.fields.items() if k.startswith("tokenizer.")}
    return from_gguf_fields(fields, arch), fields


@pytest.mark.parametrize("arch", ARCHS)
def test_gguf_tokenizer_encodes_as_llamacpp(arch):
    bundle, fields = gguf_tokenizer(arch)
    tok = Tokenizer.from_str(bundle.tokenizer_json)
    for case in llamacpp(arch):
        assert tok.encode(case["text"], add_special_tokens=False).ids == case["ids"], case["text"]
        text = tok.decode(case["ids"], skip_special_tokens=False)
        assert text == case["text"], case["text"]
    assert bundle.meta["eos_token_ids"] and bundle.meta["eos_token"] == json.loads(
        (ARCH_FIXTURES / arch / "tokenizer_config.json").read_text())["eos_token"]


@pytest.mark.parametrize("arch", ARCHS)
def test_fixture_tokenizer_encodes_as_llamacpp_except_qwen_nfc(arch):
    """transformers' tokenizer.json and llama.cpp agree, but for one known difference: Qwen's
    tokenizer.json normalises to NFC first, llama.cpp does not (a decomposed "é" differs)."""
    tok = Tokenizer.from_file(str(ARCH_FIXTURES / arch / "tokenizer.json"))
    for case in llamacpp(arch):
        same = tok.encode(case["text"], add_special_tokens=False).ids == case["ids"]
        nfc_differs = unicodedata.normalize("NFC", case["text"]) != case["text"]
        assert same != (arch == "qwen3_5_moe" and nfc_differs), case["text"]


def test_gguf_tokenizer_models_are_named_when_unsupported():
    with pytest.raises(Exception, match="'gpt2'.*'gemma4'"):
        from_gguf_fields({"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": ["a"],
                          "tokenizer.ggml.merges": []}, "x.gguf")


def test_harmony_markers_reach_the_reasoning_splitter_token_by_token():
    """gpt-oss's channel tokens are special: a decoded reply keeps them as text (engine.harmony
    MARKERS) so the chat's splitter folds the analysis channel away, streamed one token at a time
    as generate() streams; other special tokens are still dropped."""
    from app.reasoning import ThinkSplitter
    from engine.harmony import MARKERS
    from engine.tokenizer import StreamDecoder, TextCodec
    cfg = json.loads((ARCH_FIXTURES / "gpt_oss" / "tokenizer_config.json").read_text())
    codec = TextCodec(ARCH_FIXTURES / "gpt_oss" / "tokenizer.json", cfg.get("chat_template"), {})
    reply = "<|channel|>analysis<|message|>Add them.<|end|><|start|>assistant<|channel|>final<|message|>It is 5."
    ids = codec.encode(reply)
    assert set(codec.marker_ids.values()) == {m for m in MARKERS if m in reply or m == "<|constrain|>"}
    assert codec.decode(ids) == reply
    assert codec.decode(codec.encode("<|endoftext|>It is 5.")) == "It is 5."  # not a marker: dropped
    dec, split, parts = StreamDecoder(codec), ThinkSplitter(), ["", ""]
    for i in ids:
        r, c = split.push(dec.feed(i))
        parts = [parts[0] + r, parts[1] + c]
    r, c = split.push(dec.flush())
    parts = [parts[0] + r, parts[1] + c]
    r, c = split.flush()
    assert (parts[0] + r).strip() == "Add them." and (parts[1] + c).strip() == "It is 5."
