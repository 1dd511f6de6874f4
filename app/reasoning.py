"""Splitting a reasoning model's `<think>…</think>` block from its answer, as text streams in.

Qt-free and engine-free: the server puts the two parts in `reasoning_content` and `content`;
a chat view can use the same splitter to fold the thinking away.
"""
from __future__ import annotations

from collections.abc import Callable

OPEN, CLOSE = "<think>", "</think>"


def is_reasoning_model(template: str, vocab_has: Callable[[str], bool]) -> bool:
    """A model reasons when its chat template or its vocabulary knows the `<think>` tag."""
    return OPEN in template or vocab_has(OPEN)


def starts_inside(prompt: str) -> bool:
    """Some templates (DeepSeek-R1, QwQ) end the prompt with an open `<think>`: the reply starts
    inside the reasoning, without an opening tag of its own."""
    return prompt.rfind(OPEN) > prompt.rfind(CLOSE)


class ThinkSplitter:
    """Feeds text pieces, returns (reasoning, content) pieces; a tag split over two pieces is held back.

    Only a leading `<think>` opens reasoning (a tag quoted later in an answer stays text); the
    whitespace right after each tag is dropped, as the templates put a newline there.
    """

    def __init__(self, inside: bool = False):
        self.inside = inside
        self.opened = inside  # reasoning has been entered once: later tags are plain text
        self.pending = ""
        self.strip = inside  # drop whitespace at the start of the current part
        self.content_seen = False

    def _emit(self, text: str, out: list[str]) -> None:
        if self.strip:
            text = text.lstrip()
            if not text:
                return
            self.strip = False
        if not self.inside and text.strip():
            self.content_seen = True
        out[0 if self.inside else 1] += text

    def push(self, piece: str) -> tuple[str, str]:
        out = ["", ""]
        self.pending += piece
        while self.pending:
            if self.inside:
                tag = CLOSE
            elif not self.opened and not self.content_seen:
                tag = OPEN
            else:
                self._emit(self.pending, out)
                self.pending = ""
                break
            i = self.pending.find(tag)
            hold = 0 if i >= 0 else next((k for k in range(min(len(tag) - 1, len(self.pending)), 0, -1)
                                          if self.pending.endswith(tag[:k])), 0)
            cut = i if i >= 0 else len(self.pending) - hold
            if tag == OPEN and self.pending[:cut].strip():
                self.content_seen = True  # text before any tag: an answer, not reasoning
                continue
            self._emit(self.pending[:cut], out)
            if i < 0:
                self.pending = self.pending[cut:]  # maybe the start of a tag: wait for more
                break
            self.pending = self.pending[i + len(tag):]
            self.inside, self.opened, self.strip = tag == OPEN, True, True
        return out[0], out[1]

    def flush(self) -> tuple[str, str]:
        out = ["", ""]
        self._emit(self.pending, out)
        self.pending = ""
        return out[0], out[1]


def can_switch(template: str) -> bool:
    """The template has its own thinking switch (Qwen3's `enable_thinking`)."""
    return "enable_thinking" in template


def split(raw: str, final: bool = True) -> tuple[str, str, bool]:
    """(thinking, answer, still thinking) of a reply's whole text, tags included as written: the
    chat view re-splits the streaming text with it, and history stores the two parts apart.
    Not `final` (still streaming): a tag half-written at the end is held back, not shown."""
    s = ThinkSplitter()
    r, c = s.push(raw)
    if final:
        r2, c2 = s.flush()
        r, c = r + r2, c + c2
    return r, c, s.inside


def joined(reasoning: str, content: str, still_thinking: bool) -> str:
    """A stored reply as the model wrote it (split's inverse, up to the whitespace after tags):
    what Continue resumes from."""
    if still_thinking:
        return f"{OPEN}\n{reasoning}"
    return f"{OPEN}\n{reasoning}{CLOSE}\n\n{content}" if reasoning else content
