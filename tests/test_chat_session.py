"""The chat session every front end writes replies through, over stand-in backends: one that counts
tokens as a local Engine does, one that cannot (a remote endpoint, which says when a prompt overflows)."""
from __future__ import annotations

import threading
import types

import pytest

from app.chat_session import ChatSession, ContextFullError, reply_room
from engine.api import ContextOverflowError, Step

WORDS = ["Hummingbirds", " hover", "."]


def tokens(msgs) -> int:
    return sum(len(m["content"].split()) + 1 for m in msgs)  # a token per word and one per message


class Counting:
    """An Engine's face: `tokens` counts, WORDS is every reply."""
    context_limit = 64

    def __init__(self):
        self.sent = []

    def prompt_ids(self, msgs, template_vars=None, resume=""):
        return [0] * tokens(msgs)

    def generate(self, msgs, cancel=None, prompt_progress=False, template_vars=None, resume="", **sampling):
        self.sent.append(([m["content"] for m in msgs], resume))
        self.cancel = cancel  # an Engine and a RemoteBackend check it between tokens
        n = tokens(msgs)

        def steps():
            yield Step("", None, 0, n, 0, 0.0, 0.0, 0.0, n, self.context_limit, kind="prompt", prompt_done=n)
            for i, w in enumerate(WORDS, 1):
                yield Step(w, i, i, n, 0, 1.0, 1.0, 0.1, n + i, self.context_limit,
                           "length" if i == len(WORDS) else None)
        return steps()


class Endpoint(Counting):
    """A remote backend's face: nothing counted here; the endpoint refuses a prompt that leaves
    less room for the reply than a counted plan would."""
    remote = True

    def prompt_ids(self, msgs, template_vars=None, resume=""):
        raise AssertionError("an endpoint's tokens cannot be counted here")

    def generate(self, msgs, **kw):
        if tokens(msgs) + reply_room(self.context_limit) > self.context_limit:
            raise ContextOverflowError("answered 400: the prompt does not fit")
        return super().generate(msgs, **kw)


def chat_of(backend, policy="drop_oldest"):
    msgs = [{"role": "system", "content": "Be brief."}]
    for i in range(5):
        msgs += [{"role": "user", "content": f"question {i} " + "word " * 8},
                 {"role": "assistant", "content": "answer " * 4}]
    return ChatSession(backend, msgs + [{"role": "user", "content": "last"}], policy)


def test_send_regenerate_resume_and_edit_shape_the_chat():
    b = Counting()
    s = ChatSession(b, [{"role": "system", "content": "Be brief."}])
    assert "".join(st.text for st in s.send("Hi")) == "".join(WORDS)
    assert s.messages[-1] == {"role": "assistant", "content": "".join(WORDS)} and s.reply.step.finish_reason == "length"
    list(s.regenerate())
    assert b.sent[-1] == (["Be brief.", "Hi"], "") and len(s.messages) == 3  # the old reply let go, not sent
    list(s.resume())
    assert b.sent[-1] == (["Be brief.", "Hi"], "".join(WORDS))  # the cut reply goes on from its text
    assert s.messages[-1]["content"] == "".join(WORDS) * 2 and len(s.messages) == 3
    list(s.send("And?"))
    list(s.edit(1, "Hello"))  # the first question replaced: what followed it is let go
    assert b.sent[-1] == (["Be brief.", "Hello"], "") and [m["role"] for m in s.messages] == ["system", "user",
                                                                                             "assistant"]


@pytest.mark.parametrize("policy", ["drop_oldest", "keep_first"])
def test_a_full_context_is_cut_the_same_way_counted_or_refused(policy):
    """A local engine's chat is counted and cut before it is sent; an endpoint's is cut as the same
    policy says each time the endpoint refuses it: the same messages go out."""
    local, remote = chat_of(Counting(), policy), chat_of(Endpoint(), policy)
    list(local.answer())
    list(remote.answer())
    assert local.backend.sent == remote.backend.sent[-1:] and local.reply.dropped == remote.reply.dropped >= 2
    sent = local.backend.sent[0][0]
    assert sent[0] == "Be brief." and sent[-1] == "last" and len(remote.backend.sent) == 1
    assert ("question 0" in sent[1]) == (policy == "keep_first")
    assert local.reply.plan.dropped and remote.reply.plan is None  # an endpoint's tokens are not counted


def test_a_chat_no_cut_fits_fails_before_anything_is_sent():
    local, remote = chat_of(Counting(), "stop"), chat_of(Endpoint(), "stop")
    with pytest.raises(ContextFullError, match="policy is to stop at the limit"):
        local.answer()
    with pytest.raises(ContextOverflowError, match="answered 400"):  # the endpoint's own words
        remote.answer()
    assert local.backend.sent == [] and remote.backend.sent == []
    with pytest.raises(ContextFullError, match="the context holds 64"):
        list(ChatSession(Counting()).send("word " * 80))


def test_stop_reaches_the_backend_and_a_reply_closed_early_is_kept():
    b, cancel = Counting(), threading.Event()
    s = ChatSession(b)
    steps = s.send("Hi", cancel=cancel)
    assert [next(steps).kind, next(steps).text] == ["prompt", WORDS[0]] and b.cancel is cancel
    steps.close()  # Ctrl-C in the terminal
    assert s.reply.text == WORDS[0] and s.reply.step.generated_tokens == 1
    assert s.messages[-1] == {"role": "assistant", "content": WORDS[0]}


def test_the_terminal_chat_cuts_a_full_context_by_the_same_policy(monkeypatch, capsys):
    from app import cli_chat
    b, first, second = Counting(), "first " + "word " * 25, "second " + "word " * 25
    b.stats = lambda: types.SimpleNamespace(model="stand-in", remote=None)
    lines = iter([first, second, "/retry", "/continue", "/exit"])
    monkeypatch.setattr("builtins.input", lambda prompt: next(lines))
    cli_chat.chat(b, "Be brief.", {})
    out, err = capsys.readouterr()
    assert out.count("".join(WORDS)) == 4 and "chatting with stand-in" in err
    assert err.count("[context full: 2 earlier messages were left out of this reply]") == 3
    assert b.sent == [(["Be brief.", first], "")] + [(["Be brief.", second], "")] * 2 + [
        (["Be brief.", second], "".join(WORDS))]  # /retry writes the reply again, /continue goes on with it
