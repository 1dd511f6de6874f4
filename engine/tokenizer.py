"""Text in and out: the `tokenizers` library, sandboxed chat templates, streaming detokenizing.

A model's chat template is untrusted input: it is rendered in Jinja2's immutable sandbox, and
anything the sandbox blocks (private attributes, mutation, huge ranges) is reported as a
TemplateError naming what went wrong, never executed.
"""
from __future__ import annotations

import datetime
from pathlib import Path

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer

from engine.errors import ColibriError
from engine.model_dir import ModelDir

# Used only when a model ships no template: ChatML, the most common layout.
FALLBACK_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                     "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


class TemplateError(ColibriError, ValueError):
    """The chat template failed or tried something the sandbox forbids."""


def _raise(message: str):
    raise TemplateError(f"chat template raised: {message}")


class TextCodec:
    """Tokenizer, chat template and special tokens of one model."""

    def __init__(self, tokenizer_path: Path, template: str | None, meta: dict):
        self.tok = Tokenizer.from_file(str(tokenizer_path))
        self.meta = meta
        self.template_source = template if template is not None else FALLBACK_TEMPLATE
        self.has_template = template is not None
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=["jinja2.ext.loopcontrols"])
        env.globals["raise_exception"] = _raise
        env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
        try:
            self.template = env.from_string(self.template_source)
        except jinja2.TemplateSyntaxError as e:
            raise TemplateError(f"chat template does not parse: {e.message} (line {e.lineno})") from None
        self.bos_token, self.eos_token = meta.get("bos_token"), meta.get("eos_token")
        self.bos_id = meta.get("bos_token_id")
        self.add_bos = bool(meta.get("add_bos_token")) and self.bos_id is not None
        self.stop_ids = frozenset(int(i) for i in meta.get("eos_token_ids") or [])

    @classmethod
    def from_model(cls, model: ModelDir) -> TextCodec:
        return cls(model.path / "tokenizer.json", model.chat_template, model.meta.get("tokenizer", {}))

    @property
    def vocab_size(self) -> int:
        return self.tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_bos: bool | None = None) -> list[int]:
        """Special tokens written in the text (e.g. <|im_start|>) become their ids."""
        ids = self.tok.encode(text, add_special_tokens=False).ids
        if (self.add_bos if add_bos is None else add_bos) and self.bos_id is not None and ids[:1] != [self.bos_id]:
            ids = [self.bos_id] + ids
        return ids

    def decode(self, ids: list[int], skip_special: bool = True) -> str:
        return self.tok.decode(list(ids), skip_special_tokens=skip_special)

    def render(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or "role" not in m or "content" not in m:
                raise ValueError(f"message {i} must be a dict with 'role' and 'content', got {m!r}")
        try:
            return self.template.render(messages=messages, add_generation_prompt=add_generation_prompt,
                                        bos_token=self.bos_token or "", eos_token=self.eos_token or "")
        except TemplateError:
            raise
        except jinja2.exceptions.SecurityError as e:
            raise TemplateError(f"chat template tried something unsafe and was stopped: {e}") from None
        except (jinja2.TemplateError, TypeError, ValueError, AttributeError, KeyError, IndexError,
                OverflowError, RecursionError) as e:
            raise TemplateError(f"chat template failed: {type(e).__name__}: {e}") from None


class StreamDecoder:
    """Turns a growing list of token ids into text pieces that never split a UTF-8 character.

    Only the last few tokens are re-decoded each step (a byte-level token may hold half of a
    Chinese character or emoji; the piece waits until the character is complete).
    """

    def __init__(self, codec: TextCodec):
        self.codec = codec
        self.ids: list[int] = []
        self.prefix = 0  # ids[prefix:read] is text already emitted, kept as context
        self.read = 0

    def feed(self, token: int) -> str:
        self.ids.append(token)
        before = self.codec.decode(self.ids[self.prefix:self.read])
        after = self.codec.decode(self.ids[self.prefix:])
        if len(after) > len(before) and not after.endswith("\ufffd"):
            self.prefix, self.read = self.read, len(self.ids)
            return after[len(before):]
        return ""

    def flush(self) -> str:
        """Whatever is still held back (an incomplete character at the very end)."""
        before = self.codec.decode(self.ids[self.prefix:self.read])
        after = self.codec.decode(self.ids[self.prefix:])
        self.prefix = self.read = len(self.ids)
        return after[len(before):]


class StopMatcher:
    """Holds back text that might be the start of a stop string, so none of it is ever shown."""

    def __init__(self, stops: tuple[str, ...]):
        self.stops = [s for s in stops if s]
        self.pending = ""

    def push(self, piece: str) -> tuple[str, bool]:
        """(text safe to show now, whether a stop string was reached)."""
        self.pending += piece
        hits = [i for i in (self.pending.find(s) for s in self.stops) if i >= 0]
        if hits:
            out, self.pending = self.pending[:min(hits)], ""
            return out, True
        hold = 0
        for s in self.stops:
            hold = max(hold, next((k for k in range(min(len(s) - 1, len(self.pending)), 0, -1)
                                   if self.pending.endswith(s[:k])), 0))
        out, self.pending = self.pending[:len(self.pending) - hold], self.pending[len(self.pending) - hold:]
        return out, False

    def flush(self) -> str:
        out, self.pending = self.pending, ""
        return out
