"""The chat template's render budget has no holes: constructs whose cost the sandbox cannot see
before it is paid (widths taken from arguments, filters that build lists of any length, values
that nest the same list into themselves) are refused with a named error, quickly, and the real
templates of the supported families still render."""
from __future__ import annotations

import time

import pytest
from conftest import TESTS
from tokenizers import Tokenizer, models

from engine.tokenizer import TemplateBudgetError, TemplateError, TextCodec

HELLO = [{"role": "user", "content": "hello"}]
DOUBLED = "{% set ns = namespace(x=[1]) %}{% for i in range(25) %}{% set ns.x = [ns.x, ns.x] %}{% endfor %}"


@pytest.fixture
def codec_for(tmp_path):
    path = tmp_path / "tokenizer.json"
    Tokenizer(models.WordLevel({"<unk>": 0}, unk_token="<unk>")).save(str(path))

    def make(template: str) -> TextCodec:
        return TextCodec(path, template, {"bos_token": "<s>", "eos_token": "</s>"})
    return make


@pytest.mark.parametrize("template,error,match", [
    ("{{ '{:>{}}'.format('', 1000000000) }}", TemplateError, "nested replacement field in a format spec"),
    ("{{ '{0:{1}}'.format('', 1000000000) }}", TemplateError, "nested replacement field in a format spec"),
    ("{{ '{:>{w}}'.format_map({'w': 1000000000}) }}", TemplateError, "nested replacement field"),
    ("{{ '%*s' % (1000000000, 'x') }}", TemplateError, r"'\*' width or precision"),
    ("{{ '%.*f' % (1000000000, 1.5) }}", TemplateError, r"'\*' width or precision"),
    ("{{ '%*s'|format(1000000000, 'x') }}", TemplateError, r"'\*' width or precision"),
    ("{{ [1]|batch(1000000000, 'x')|list }}", TemplateError, "filter 'batch' is not allowed"),
    ("{{ [1, 2]|slice(1000000000)|list }}", TemplateError, "filter 'slice' is not allowed"),
    ("{{ messages|pprint }}", TemplateError, "filter 'pprint' is not allowed"),
    (DOUBLED + "{{ ns.x }}", TemplateBudgetError, "size budget"),
    (DOUBLED + "{{ ns.x|tojson }}", TemplateBudgetError, "size budget"),
    (DOUBLED + "{{ ns.x|string|length }}", TemplateBudgetError, "size budget"),
    (DOUBLED + "{{ ns.x ~ '' }}", TemplateBudgetError, "size budget"),
    (DOUBLED + "{{ '%s' % [ns.x] }}", TemplateBudgetError, "size budget"),
    (DOUBLED + "{{ '{}'.format(ns.x) }}", TemplateBudgetError, "size budget"),
    (DOUBLED + "{{ [ns.x]|join }}", TemplateBudgetError, "size budget"),
    (DOUBLED + "{{ ns.x|e }}", TemplateBudgetError, "size budget"),
])
def test_constructs_that_bypassed_the_budget_are_refused_by_name(codec_for, template, error, match):
    codec = codec_for(template)
    t0 = time.perf_counter()
    with pytest.raises(error, match=match):
        codec.render(HELLO)
    assert time.perf_counter() - t0 < codec.budget.seconds  # refused before it spent the budget


@pytest.mark.parametrize("name", sorted(p.name for p in (TESTS / "fixtures" / "templates").glob("*.jinja")))
def test_the_families_real_templates_still_render(codec_for, name):
    codec = codec_for((TESTS / "fixtures" / "templates" / name).read_text())
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi {:>{}} %*s"},
            {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Again"}]
    out = codec.render(chat)
    assert "Be brief." in out and "Hi {:>{}} %*s" in out and out.count("Again") == 1
