"""Template switches (enable_thinking) and continuing a reply, against transformers' own rendering.

The template is Qwen3-0.6B's (tests/fixtures/templates, as llama.cpp keeps it in models/templates);
the expected strings are what transformers 5.24's apply_chat_template renders for the same
messages (`enable_thinking=False` / True / unset).
"""
from __future__ import annotations

from pathlib import Path

import pytest
from conftest import HF_FIXTURES

from engine.tokenizer import TextCodec

QWEN3 = (Path(__file__).parent / "fixtures" / "templates" / "Qwen-Qwen3-0.6B.jinja").read_text()
CHAT = [{"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4", "reasoning_content": "Two and two."},
        {"role": "user", "content": "And 3+3?"}]
HEAD = "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n4<|im_end|>\n<|im_start|>user\nAnd 3+3?<|im_end|>\n"


@pytest.fixture(scope="module")
def codec():
    return TextCodec(HF_FIXTURES / "qwen2" / "tokenizer.json", QWEN3, {"eos_token": "<|im_end|>"})


def test_enable_thinking_reaches_the_template_and_old_thinking_stays_out(codec):
    assert codec.render(CHAT) == HEAD + "<|im_start|>assistant\n"  # the earlier turn's thinking is left out
    assert codec.render(CHAT, template_vars={"enable_thinking": False}) == \
        HEAD + "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    assert codec.render(CHAT, template_vars={"enable_thinking": True}) == HEAD + "<|im_start|>assistant\n"


def test_resume_continues_a_reply_from_the_prompt_it_was_written_after(codec):
    """What the model saw while it wrote the reply: the generation prompt, then its own text
    (thinking tags and all; a `<|im_end|>` in it stays text, as in any message)."""
    written = "<think>\nThree and three make six.\n</think>\n\nSix, be"
    ids = codec.encode_chat(CHAT, resume=written)
    assert ids[:len(codec.encode_chat(CHAT))] == codec.encode_chat(CHAT)
    assert codec.decode(ids, skip_special=False) == HEAD + "<|im_start|>assistant\n" + written
    injected = codec.encode_chat(CHAT, resume="a<|im_end|>")
    assert codec.tok.token_to_id("<|im_end|>") not in injected[len(codec.encode_chat(CHAT)):]


def test_bad_switches_and_uncontinuable_replies_are_clear_errors(codec):
    with pytest.raises(ValueError, match="template variable 'messages' is not allowed"):
        codec.render(CHAT, template_vars={"messages": []})
    with pytest.raises(ValueError, match="template variable enable_thinking must be a bool"):
        codec.render(CHAT, template_vars={"enable_thinking": [1]})
    with pytest.raises(ValueError, match="template variable 'bos_token' is not allowed"):
        codec.encode_chat(CHAT, template_vars={"bos_token": "x"})
