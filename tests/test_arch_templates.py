"""The 2026 families' real chat templates through Colibri's sandboxed renderer (engine/tokenizer.py),
against transformers' rendering of the same conversations (tests/fixtures/templates/rendered.json)."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from arch_reference import ARCH_FIXTURES

from engine.tokenizer import TextCodec

TEMPLATES = Path(__file__).resolve().parent / "fixtures" / "templates"
RENDERED = json.loads((TEMPLATES / "rendered.json").read_text())["cases"]
FILES = {"gpt_oss": "openai-gpt-oss-120b.jinja", "qwen3_5_moe": "Qwen3.5-4B.jinja",
         "lfm2_moe": "LFM2-8B-A1B.jinja", "gemma4": "google-gemma-4-31B-it.jinja"}
CASES = [(arch, case) for arch, cases in RENDERED.items() for case in cases]


def undated(text: str) -> str:
    return re.sub(r"Current date: \d{4}-\d\d-\d\d", "Current date: D", text)


@pytest.mark.parametrize("arch,case", CASES, ids=[f"{a}-{c['label']}" for a, c in CASES])
def test_template_renders_as_transformers(arch, case):
    codec = TextCodec(ARCH_FIXTURES / arch / "tokenizer.json", (TEMPLATES / FILES[arch]).read_text(),
                      {"bos_token": case["bos_token"] or None})
    if case["vars"]:  # switches (enable_thinking, reasoning_effort): the same sandboxed template, given them
        text = codec.template.render(messages=case["messages"], add_generation_prompt=True,
                                     bos_token=case["bos_token"], eos_token="", **case["vars"])
    else:
        text = codec.render(case["messages"])
    assert undated(text) == undated(case["text"])


def test_the_switches_change_what_the_families_render():
    """What each family reads: Qwen3.5 and Gemma 4 enable_thinking, gpt-oss reasoning_effort; LFM2 none."""
    by = {(a, c["label"]): c["text"] for a, c in CASES}
    assert by["qwen3_5_moe", "thinking off"].endswith("<think>\n\n</think>\n\n")
    assert by["qwen3_5_moe", "one turn"].endswith("<think>\n")  # the reply starts inside its reasoning
    assert by["gemma4", "thinking on"].startswith("<bos><|turn>system\n<|think|>")
    assert by["gemma4", "one turn"].endswith("<|turn>model\n<|channel>thought\n<channel|>")  # empty thought
    assert "Reasoning: high" in by["gpt_oss", "effort high"] and "Reasoning: medium" in by["gpt_oss", "one turn"]
    assert len({by["lfm2_moe", label] for label in ("thinking off", "thinking on", "effort high")}) == 1
    # earlier turns' reasoning is dropped from the prompt by all four
    assert all("greet back" not in by[a, "history with reasoning"] for a in FILES)
