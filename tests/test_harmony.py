"""engine/harmony.py: the renderer against gpt-oss's own chat template (tests/fixtures/templates,
rendered here as transformers renders chat templates), and the streaming reply parser."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer

from engine import harmony

TEMPLATES = Path(__file__).resolve().parent / "fixtures" / "templates"
TOKENIZER = Path(__file__).resolve().parent / "fixtures" / "arch" / "gpt_oss" / "tokenizer.json"
DATE = "2026-12-01"


def real_template(messages, **kw) -> str:
    """gpt-oss's chat template as transformers renders it (its tojson: keys kept in order, no escapes)."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = lambda x, ensure_ascii=False, indent=None, separators=None, sort_keys=False: json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)
    env.globals["strftime_now"] = lambda fmt: DATE
    env.globals["raise_exception"] = lambda msg: (_ for _ in ()).throw(ValueError(msg))
    template = env.from_string((TEMPLATES / "openai-gpt-oss-120b.jinja").read_text())
    return template.render(messages=messages, **kw)


CALL = {"role": "assistant", "content": "", "thinking": "I need the weather.",
        "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Zürich", "unit": "C"}}}]}
CONVERSATIONS = [
    ([{"role": "user", "content": "What is 2+3?"}], {}),
    ([{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Hi"},
      {"role": "assistant", "content": "Hello!", "thinking": "greet back"}, {"role": "user", "content": "2+3?"}],
     {"reasoning_effort": "high"}),
    ([{"role": "user", "content": "2+3?"}, {"role": "assistant", "content": "5", "thinking": "2+3=5"}],
     {"add_generation_prompt": False, "model_identity": "You are a tiny test model."}),
    ([{"role": "user", "content": "Weather in Zürich?"}, CALL, {"role": "tool", "content": {"temp": 3}}], {}),
    ([{"role": "user", "content": "Weather?"}, CALL, {"role": "tool", "content": "3 C"},
      {"role": "assistant", "content": "It is 3 C."}, {"role": "user", "content": "Thanks"}], {"reasoning_effort": "low"}),
]


@pytest.mark.parametrize("messages,kw", CONVERSATIONS)
def test_render_matches_gpt_oss_template(messages, kw):
    kw = {"add_generation_prompt": True, **kw}
    assert harmony.render(messages, current_date=DATE, **kw) == real_template(messages, **kw)


@pytest.mark.parametrize("messages,match", [
    ([{"role": "assistant", "content": "<|channel|>final<|message|>hi"}], "harmony channel tags"),
    ([{"role": "user", "content": "x"}, {"role": "tool", "content": "y"}], "no assistant tool call"),
    ([{"role": "user", "content": "x"}, {"role": "system", "content": "y"}], "system/developer only first"),
])
def test_render_names_bad_conversations(messages, match):
    with pytest.raises(ValueError, match=match):
        harmony.render(messages)
    with pytest.raises(ValueError, match="reasoning_effort"):
        harmony.render([], reasoning_effort="max")


REPLY = ("<|channel|>analysis<|message|>User asks 2+3. Easy: 5.<|end|>"
         "<|start|>assistant<|channel|>final<|message|>2+3 is **5**.<|return|>")
TOOL_REPLY = ("<|channel|>analysis<|message|>Need weather.<|end|>"
              "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
              '{"city":"Paris"}<|call|>')


def stream(text: str, step: int) -> tuple[str, str, harmony.HarmonyParser]:
    p, r, c = harmony.HarmonyParser(), [], []
    for i in range(0, len(text), step):
        a, b = p.push(text[i:i + step])
        r.append(a)
        c.append(b)
    a, b = p.flush()
    return "".join(r) + a, "".join(c) + b, p


@pytest.mark.parametrize("step", [1, 2, 3, 7, 1000])
def test_parser_splits_reasoning_from_answer_in_any_pieces(step):
    reasoning, content, p = stream(REPLY, step)
    assert (reasoning, content) == ("User asks 2+3. Easy: 5.", "2+3 is **5**.")
    assert p.done and p.stop == harmony.RETURN and [m.channel for m in p.messages] == ["analysis", "final"]


@pytest.mark.parametrize("step", [1, 5, 1000])
def test_parser_collects_tool_calls(step):
    reasoning, content, p = stream(TOOL_REPLY, step)
    assert reasoning == "Need weather." and content == ""
    assert p.stop == harmony.CALL
    (call,) = p.calls
    assert (call.recipient, call.content_type, json.loads(call.arguments)) == ("functions.get_weather", "json",
                                                                                {"city": "Paris"})
    # the other header order: recipient in the role part, content type bare
    (m,) = harmony.parse("<|start|>assistant to=functions.f<|channel|>commentary json<|message|>{}<|call|>"[
        len("<|start|>assistant"):])
    assert (m.recipient, m.channel, m.content_type) == ("functions.f", "commentary", "json")


def test_parser_tolerates_a_missing_start_and_stray_markers():
    r, c, p = stream("<|channel|>analysis<|message|>hm<|end|><|channel|>final<|message|>a <|message|> b<|return|>", 2)
    assert (r, c) == ("hm", "a <|message|> b") and [m.role for m in p.messages] == ["assistant", "assistant"]
    (m,) = harmony.parse("<|channel|>commentary<|message|>Checking the weather.<|end|>")
    assert (m.channel, m.recipient, m.complete) == ("commentary", None, True)  # a preamble: shown to the user


def test_parser_keeps_text_outside_messages_and_stops_at_return():
    r, c, p = stream("Plain answer without channels", 4)
    assert (r, c) == ("", "Plain answer without channels")
    r, c, p = stream("<|channel|>final<|message|>done<|return|>ignored", 3)
    assert c == "done" and p.done


def test_parser_reads_the_fixture_tokenizer_decoding_token_by_token():
    """The harmony markers are single special tokens of the gpt-oss vocabulary; decoded one id at a
    time (skip_special=False) the reply parses the same."""
    tok = Tokenizer.from_file(str(TOKENIZER))
    ids = tok.encode(REPLY, add_special_tokens=False).ids
    for t in harmony.SPECIALS:
        assert tok.token_to_id(t) is not None, t
    assert tok.token_to_id("<|end|>") in ids and tok.token_to_id("<|return|>") == ids[-1]
    p, r, c = harmony.HarmonyParser(), "", ""
    for i in ids:
        a, b = p.push(tok.decode([i], skip_special_tokens=False))
        r, c = r + a, c + b
    assert (r, c) == ("User asks 2+3. Easy: 5.", "2+3 is **5**.")
