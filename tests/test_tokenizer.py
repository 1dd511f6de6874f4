"""Tokenizer, sandboxed chat templates and streaming detokenization."""
from __future__ import annotations

import pytest

from engine.model_dir import open_model_dir
from engine.tokenizer import StreamDecoder, TemplateError, TextCodec


@pytest.fixture(scope="module")
def codec(default_converted):
    return TextCodec.from_model(open_model_dir(default_converted))


def test_stop_tokens_come_from_the_model(codec):
    assert codec.stop_ids == {codec.tok.token_to_id("<|im_end|>")}
    assert not codec.add_bos


def test_chat_template_renders_chatml_with_default_system(codec):
    text = codec.render([{"role": "user", "content": "Hi"}])
    assert text.startswith("<|im_start|>system\n") and text.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    ids = codec.encode(text)
    assert ids[0] == codec.tok.token_to_id("<|im_start|>")


@pytest.mark.parametrize("text", ["数学是科学的语言。天空为什么是蓝色的？", "emoji 🐦🌍🚀 ok", "naïve café — ½", "ｆｕｌｌｗｉｄｔｈ"])
def test_streaming_never_emits_broken_utf8(codec, text):
    ids = codec.encode(text)
    dec = StreamDecoder(codec)
    pieces = [dec.feed(i) for i in ids] + [dec.flush()]
    assert "".join(pieces) == text
    assert not any("\ufffd" in p for p in pieces)


@pytest.mark.parametrize("template,fragment", [
    ("{{ ''.__class__.__mro__[1].__subclasses__() }}", "unsafe"),
    ("{{ messages.append({'role': 'x'}) }}", "unsafe"),
    ("{% for m in messages %}{{ m.__init__.__globals__ }}{% endfor %}", "unsafe"),
    ("{{ raise_exception('only user and assistant roles are supported') }}", "only user and assistant"),
    ("{% for i in range(10**9) %}x{% endfor %}", "failed"),
    ("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", "failed"),
])
def test_hostile_or_failing_templates_are_stopped(tmp_path, default_converted, template, fragment):
    model = open_model_dir(default_converted)
    codec = TextCodec(model.path / "tokenizer.json", template, model.meta["tokenizer"])
    with pytest.raises(TemplateError, match=fragment):
        codec.render([{"role": "user", "content": "hi"}])


def test_template_syntax_error(default_converted):
    model = open_model_dir(default_converted)
    with pytest.raises(TemplateError, match="does not parse"):
        TextCodec(model.path / "tokenizer.json", "{% if %}", model.meta["tokenizer"])


def test_malformed_messages(codec):
    with pytest.raises(ValueError, match="message 0 must be a dict with 'role' and 'content'"):
        codec.render(["hello"])


def test_tojson_is_transformers_tojson(default_converted):
    """Keys keep their order and <>&' stay as they are (jinja's own tojson sorts and HTML-escapes,
    so tool calls rendered unlike the format the model was trained on)."""
    model = open_model_dir(default_converted)
    template = "{{ {'name': 'f', 'arguments': {'b': '<x & y>', 'a': \"it's\"}} | tojson }}|{{ 'é' | tojson }}"
    codec = TextCodec(model.path / "tokenizer.json", template, model.meta["tokenizer"])
    assert codec.render([{"role": "user", "content": "hi"}]) == \
        '{"name": "f", "arguments": {"b": "<x & y>", "a": "it\'s"}}|"é"'
