"""Splitting a reasoning model's thinking from its answer, as text streams in.

Two layouts: `<think>…</think>` (Qwen3, DeepSeek-R1, QwQ) and gpt-oss's harmony channels
(`<|channel|>analysis<|message|>…<|end|>`, then `<|start|>assistant<|channel|>final<|message|>`
and the answer). Qt-free and engine-free: the server puts the two parts in `reasoning_content`
and `content`; the chat view folds the thinking away with the same splitter.
"""
from __future__ import annotations

from collections.abc import Callable

OPEN, CLOSE = "<think>", "</think>"
# harmony: the analysis channel is the thinking; the final channel's header is dropped from the answer
H_OPEN, H_CLOSE, H_FINAL = "<|channel|>analysis<|message|>", "<|end|>", "<|channel|>final<|message|>"
CLOSE_OF = {OPEN: CLOSE, H_OPEN: H_CLOSE}


def is_reasoning_model(template: str, vocab_has: Callable[[str], bool]) -> bool:
    """Whether the template or vocabulary knows `<think>`, or the template writes harmony's analysis."""
    return OPEN in template or H_OPEN in template or vocab_has(OPEN)


def starts_inside(prompt: str) -> bool:
    """Some templates (DeepSeek-R1, QwQ) end the prompt with an open `<think>`: the reply starts
    inside the reasoning, without an opening tag of its own."""
    return prompt.rfind(OPEN) > prompt.rfind(CLOSE)


def _held(text: str, tags: list[str]) -> int:
    """How many characters at the end of `text` may be the start of one of `tags`."""
    return max((k for tag in tags for k in range(min(len(tag) - 1, len(text)), 0, -1) if text.endswith(tag[:k])),
               default=0)


class ThinkSplitter:
    """Feeds text pieces, returns (reasoning, content) pieces; a tag split over two pieces is held back.
    Only a leading opening tag opens reasoning; the whitespace right after each tag is dropped; after
    harmony's analysis channel, what precedes the final channel's header is dropped."""

    def __init__(self, inside: bool = False):
        self.inside = inside
        self.close = CLOSE  # the closing tag of the reasoning that is open
        self.opened = inside  # reasoning has been entered once: later tags are plain text
        self.header = False  # between harmony's analysis and final channels: dropped
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

    def _tags(self) -> list[str]:
        if self.inside:
            return [self.close]
        if self.header:
            return [H_FINAL]
        if not self.opened and not self.content_seen:
            return [OPEN, H_OPEN, H_FINAL]
        return []

    def push(self, piece: str) -> tuple[str, str]:
        out = ["", ""]
        self.pending += piece
        while self.pending:
            tags = self._tags()
            if not tags:
                self._emit(self.pending, out)
                self.pending = ""
                break
            hits = [(i, tag) for tag in tags if (i := self.pending.find(tag)) >= 0]
            i, tag = min(hits) if hits else (-1, "")
            cut = i if i >= 0 else len(self.pending) - _held(self.pending, tags)
            if not self.inside and not self.header and self.pending[:cut].strip():
                self.content_seen = True  # text before any tag: an answer, not reasoning
                continue
            if not self.header:
                self._emit(self.pending[:cut], out)
            if i < 0:
                self.pending = self.pending[cut:]  # maybe the start of a tag: wait for more
                break
            self.pending = self.pending[i + len(tag):]
            self.opened, self.strip = True, True
            if tag in CLOSE_OF:
                self.inside, self.close = True, CLOSE_OF[tag]
            else:  # a closing tag, or harmony's final header
                self.inside, self.header = False, tag == H_CLOSE
        return out[0], out[1]

    def flush(self) -> tuple[str, str]:
        out = ["", ""]
        if not self.header:
            self._emit(self.pending, out)
        self.pending = ""
        return out[0], out[1]


def can_switch(template: str) -> bool:
    """The template has its own thinking switch (Qwen3's `enable_thinking`)."""
    return "enable_thinking" in template


def split(raw: str, final: bool = True) -> tuple[str, str, bool]:
    """(thinking, answer, still thinking) of a reply's whole text, tags included as written; not `final`:
    a tag half-written at the end is held back."""
    s = ThinkSplitter()
    r, c = s.push(raw)
    if final:
        r2, c2 = s.flush()
        r, c = r + r2, c + c2
    return r, c, s.inside


def joined(reasoning: str, content: str, still_thinking: bool) -> str:
    """A stored reply as the model wrote it (split's inverse, up to whitespace): what Continue resumes."""
    if still_thinking:
        return f"{OPEN}\n{reasoning}"
    return f"{OPEN}\n{reasoning}{CLOSE}\n\n{content}" if reasoning else content
