"""Thinking in the chat path: the splitter over whole texts, the worker's reply with its
thinking counted, the template's switch, and Continue resuming a reply cut short."""
from __future__ import annotations

import threading

import pytest
from thinking_model import make_thinking_model

from app import reasoning as R
from app import worker as W
from engine.api import Engine

CHAT = [{"role": "user", "content": "What is 2+2?"}]


@pytest.mark.parametrize("raw,final,expected", [
    ("<think>\nTwo and two.\n</think>\n\nFour.", True, ("Two and two.\n", "Four.", False)),
    ("<think>\nTwo and", True, ("Two and", "", True)),
    ("<think>\nTwo and two.\n</thi", False, ("Two and two.\n", "", True)),  # a half tag waits
    ("Four. <think>no</think>", True, ("", "Four. <think>no</think>", False)),  # a quoted tag is text
    ("", True, ("", "", False)),
])
def test_split_a_whole_reply(raw, final, expected):
    assert R.split(raw, final) == expected


def test_joined_gives_back_what_split_took_apart():
    for raw in ["<think>\nTwo and two.\n</think>\n\nFour.", "<think>\nTwo and", "Four."]:
        assert R.split(R.joined(*R.split(raw))) == R.split(raw)


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    eng = Engine(make_thinking_model(tmp_path_factory.mktemp("think")), threads=1)
    yield eng
    eng.close()


def test_a_thinking_reply_carries_its_tag_and_counts_its_thinking_tokens(engine):
    assert W.reasoning_of(engine) == (True, True)
    reply = W.stream_reply(engine, CHAT, {"max_tokens": 6, "temperature": 0}, threading.Event(), lambda t, s: None)
    assert reply.text.startswith("<think>") and reply.step.generated_tokens == 6
    thinking, answer, still = R.split(reply.text)
    assert still and answer == "" and thinking  # the template opened the thinking; 6 tokens did not close it
    assert reply.thinking_tokens == 6
    off = W.stream_reply(engine, CHAT, {"max_tokens": 6, "temperature": 0}, threading.Event(), lambda t, s: None,
                         template_vars={"enable_thinking": False})
    assert not off.text.startswith("<think>") and off.thinking_tokens == 0
    assert R.split(off.text) == ("", off.text.strip(), False) or "<think>" in off.text  # an answer, not thinking


def test_continue_resumes_where_the_reply_stopped_as_if_never_cut(engine):
    """Greedy: 4 tokens then 4 more by Continue are the 8 tokens written at once."""
    go = lambda n, resume="": W.stream_reply(engine, CHAT, {"max_tokens": n, "temperature": 0},  # noqa: E731
                                             threading.Event(), lambda t, s: None, resume=resume)
    whole, half = go(8), go(4)
    rest = go(4, half.text)
    assert half.text + rest.text == whole.text
    assert rest.thinking_tokens == 4 and not rest.text.startswith("<think>")
