"""Text in and out: the `tokenizers` library, sandboxed chat templates, streaming detokenizing.

A model's chat template is untrusted input: it is rendered in Jinja2's immutable sandbox, and
anything the sandbox blocks (private attributes, mutation, huge ranges) is reported as a
TemplateError naming what went wrong, never executed. Rendering also has a budget of time and
size (`RenderBudget`): a template that loops or grows strings without bound is stopped with an
error naming the budget. What the budget cannot size before paying for it is refused by name:
widths taken from arguments (`'{:>{}}'.format`, `%*s`), the list-building filters batch, slice
and pprint, and values that nest one list into themselves until printing them never ends (every
value is weighed before it is turned into text).

Messages are text, never structure: `encode_chat` turns special-token strings written in a
message (`<|im_end|>`, `<|eot_id|>`, `</s>` ...) into plain text, so only the template itself
yields control tokens.
"""
from __future__ import annotations

import datetime
import functools
import json
import math
import re
import string
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2
from jinja2 import filters as jinja_filters
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer

from engine.errors import ColibriError
from engine.harmony import MARKERS
from engine.model_dir import ModelDir

# Used only when a model ships no template: ChatML, the most common layout.
FALLBACK_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                     "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


class TemplateError(ColibriError, ValueError):
    """The chat template failed or tried something the sandbox forbids."""


def _raise(message: str):
    raise TemplateError(f"chat template raised: {message}")


# --- the render budget -------------------------------------------------------------------------
@dataclass(frozen=True)
class RenderBudget:
    """What one render may spend: seconds, and characters in any one value or in the output
    (`chars` plus `per_input` × the characters of the messages, which the output quotes)."""
    seconds: float = 2.0
    chars: int = 1 << 20
    per_input: int = 8
    int_bits: int = 1 << 16  # integers the template computes (2 ** 10 ** 9 never finishes)


class TemplateBudgetError(TemplateError):
    """The chat template went over its render budget (time or size)."""


class _Meter:
    """The running render's budget: checked by the sandbox hooks below and by a line tracer."""

    def __init__(self, budget: RenderBudget, input_chars: int):
        self.budget, self.chars = budget, budget.chars + budget.per_input * input_chars
        self.deadline = time.perf_counter() + budget.seconds
        self.lines = 0

    def size(self, n: int, what: str) -> None:
        if n > self.chars:
            raise TemplateBudgetError(f"chat template went over its size budget of {self.chars:,} characters "
                                      f"({what} of {n:,})")

    def weigh(self, value: Any, what: str) -> None:
        """`value` as text takes at most the size budget: counted node by node (a list nested into
        itself counts each time it is reached), stopping at the budget, before any str() of it."""
        if isinstance(value, (list, tuple, dict, set, frozenset)):
            self.size(_weight(value, self.chars), what)

    def clock(self) -> None:
        if time.perf_counter() > self.deadline:
            raise TemplateBudgetError(f"chat template went over its time budget of {self.budget.seconds:g} s "
                                      f"(a loop that does not end?)")

    def tracer(self, frame, event, arg):
        """sys.settrace hook: only the template's own frames are traced, every 256th line timed."""
        if event == "call" and frame.f_code.co_filename == "<template>":
            return self._line
        return None

    def _line(self, frame, event, arg):
        self.lines += 1
        if not self.lines & 255:
            self.clock()
        return self._line


_SIZE_ARGS = {"center", "ljust", "rjust", "zfill", "expandtabs"}  # str methods whose int argument is a width
_WIDTHS = re.compile(r"\d+")


_STARS = re.compile(r"%[-#0 +]*(\*|\d*\.\*)")  # a %-format width or precision taken from the arguments
REFUSED_FILTERS = ("batch", "slice", "pprint")  # they build values of any size in one C call


def _length(v: Any) -> int:
    return len(v) if isinstance(v, (str, list, tuple)) else 0


def _weight(value: Any, limit: int) -> int:
    """At least the characters str(value) takes, counted until past `limit`."""
    total, stack = 0, [value]
    while stack and total <= limit:
        v = stack.pop()
        if isinstance(v, str):
            total += len(v)
        elif isinstance(v, (list, tuple, set, frozenset)):
            total += 2 + len(v)
            stack.extend(v)
        elif isinstance(v, dict):
            total += 2 + 2 * len(v)
            stack.extend(v.keys())
            stack.extend(v.values())
        else:
            total += 1
    return total


def _refused(name: str):
    def refuse(*args: Any, **kwargs: Any):
        raise TemplateError(f"chat template uses a filter that is not allowed here: filter {name!r} is not allowed "
                            f"(its result's size cannot be checked before it is built)")
    return refuse


class _BudgetEnvironment(ImmutableSandboxedEnvironment):
    """The immutable sandbox with its operators and calls held to the running render's budget
    (one per thread: two threads may render with the same codec)."""
    intercepted_binops = frozenset({"*", "**", "+", "%"})

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs, finalize=self._weighed_output)
        self._local = threading.local()

    def _weighed_output(self, value: Any) -> Any:
        if self.meter is not None:
            self.meter.weigh(value, "a printed value")
        return value

    @property
    def meter(self) -> _Meter | None:
        return getattr(self._local, "meter", None)

    @meter.setter
    def meter(self, value: _Meter | None) -> None:
        self._local.meter = value

    def call_binop(self, context, operator, left, right):
        m = self.meter
        if m is not None:
            if operator == "*":
                if isinstance(left, int) and isinstance(right, (str, list, tuple)):
                    left, right = right, left
                if isinstance(left, (str, list, tuple)) and isinstance(right, int):
                    m.size(len(left) * right, "a repeated value")
                elif isinstance(left, int) and isinstance(right, int):
                    self._bits(left.bit_length() + right.bit_length())
            elif operator == "**" and isinstance(left, int) and isinstance(right, int) and abs(left) > 1:
                self._bits(right * math.log2(abs(left)))
            elif operator == "+":
                m.size(_length(left) + _length(right), "a joined value")
            elif operator == "%" and isinstance(left, str):
                self._widths(left, percent=True)
                m.weigh(right, "a %-format's values")
        return super().call_binop(context, operator, left, right)

    def _bits(self, bits: float) -> None:
        if self.meter is not None and bits > self.meter.budget.int_bits:
            raise TemplateBudgetError(f"chat template went over its integer budget of "
                                      f"{self.meter.budget.int_bits:,} bits")

    def _widths(self, fmt: str, percent: bool) -> None:
        """A format string's field widths ("{:>99999999}", "%99999999s") within the size budget; a
        width the arguments give ("{:>{}}", "%*s") is refused, as it cannot be checked here."""
        fmt = str(fmt)
        if percent and _STARS.search(fmt.replace("%%", "")):
            raise TemplateError("chat template uses a '*' width or precision in a %-format, which is not allowed here")
        if not percent and any(spec and "{" in spec for _, _, spec, _ in string.Formatter().parse(fmt)):
            raise TemplateError("chat template uses a nested replacement field in a format spec ('{:>{}}'), which "
                                "is not allowed here")
        for w in _WIDTHS.findall(fmt):
            if len(w) > 12 or int(w) > self.meter.chars:
                self.meter.size(int(w[:13]), "a format width")

    def call(self, context, obj, /, *args, **kwargs):
        m = self.meter
        if m is not None:
            m.clock()
            owner, name = getattr(obj, "__self__", None), getattr(obj, "__name__", "")
            if isinstance(owner, str):
                if name in _SIZE_ARGS and args and isinstance(args[0], int):
                    m.size(args[0], f"str.{name} width")
                elif name == "replace" and len(args) >= 2 and isinstance(args[0], str) and isinstance(args[1], str):
                    hits = owner.count(args[0]) if args[0] else len(owner) + 1
                    m.size(len(owner) + hits * len(args[1]), "str.replace result")
                elif name == "join":
                    args = (list(args[0]),) if args else args
                    m.weigh(args[0] if args else [], "str.join's values")
                    m.size(sum(map(_length, args[0])) + len(owner) * len(args[0]) if args else 0, "str.join result")
        return super().call(context, obj, *args, **kwargs)

    def wrap_str_format(self, value: Any):
        """str.format and format_map, as the sandbox wraps them, with their widths checked."""
        wrapped = super().wrap_str_format(value)
        if wrapped is None:
            return None

        def checked(*args: Any, **kwargs: Any) -> str:
            if self.meter is not None:
                self._widths(value.__self__, percent=False)
                self.meter.weigh([*args, *kwargs.values()], "a format's values")
            return wrapped(*args, **kwargs)
        return checked

    def checked_join(self, seq) -> str:
        """The template's `~` operator (jinja's str_join), sized before it joins."""
        seq = list(seq)
        if self.meter is not None:
            self.meter.weigh(seq, "a joined value")
        seq = [str(v) for v in seq]
        if self.meter is not None:
            self.meter.size(sum(map(len, seq)), "a joined value")
        return "".join(seq)


def _checked_filters(env: _BudgetEnvironment) -> None:
    """Filters that can multiply a size get it checked first (center/indent/wordwrap widths,
    replace and join results, format widths); lipsum is dropped (no template needs it)."""
    def meter() -> _Meter | None:
        return env.meter

    def center(value, width=80):
        if meter() is not None and isinstance(width, int):
            meter().size(width, "center width")
        return jinja_filters.do_center(value, width)

    def indent(s, width=4, first=False, blank=False):
        if meter() is not None:
            pad = width if isinstance(width, int) else len(str(width))
            meter().size(len(str(s)) + pad * (str(s).count("\n") + 1), "indent result")
        return jinja_filters.do_indent(s, width, first, blank)

    @jinja2.pass_eval_context
    def replace(eval_ctx, s, old, new, count=None):
        if meter() is not None and isinstance(s, str) and isinstance(old, str) and isinstance(new, str):
            meter().size(len(s) + (s.count(old) if old else len(s) + 1) * len(new), "replace result")
        return jinja_filters.do_replace(eval_ctx, s, old, new, count)

    @jinja2.pass_eval_context
    def join(eval_ctx, value, d="", attribute=None):
        items = list(value)
        if meter() is not None:
            meter().size(sum(len(str(v)) for v in items) + len(str(d)) * len(items), "join result")
        return jinja_filters.do_join(eval_ctx, items, d, attribute)

    def format_(value, *args, **kwargs):
        if meter() is not None and isinstance(value, str):
            env._widths(value, percent=True)
        return jinja_filters.do_format(value, *args, **kwargs)

    def wordwrap(environment, s, width=79, break_long_words=True, wrapstring=None, break_on_hyphens=True):
        if meter() is not None:
            meter().size(len(str(s)) * (1 + len(wrapstring or "\n")), "wordwrap result")
        return jinja_filters.do_wordwrap(environment, s, width, break_long_words, wrapstring, break_on_hyphens)

    def tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        # transformers' own tojson: keys in their order, no HTML escaping (jinja's sorts and escapes
        # <>&', so a tool call rendered differently from the model's training format)
        out = json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)
        if meter() is not None:
            meter().size(len(out), "tojson result")
        return out

    env.filters.update(center=center, indent=indent, replace=replace, join=join, format=format_,
                       wordwrap=jinja2.pass_environment(wordwrap), tojson=tojson)
    env.filters.update({name: _refused(name) for name in REFUSED_FILTERS})
    for name, f in env.filters.items():  # every filter's values weighed before it turns them into text
        env.filters[name] = _weighing(env, f)
    env.globals.pop("lipsum", None)


def _weighing(env: _BudgetEnvironment, f):
    @functools.wraps(f)  # (keeps jinja's pass_context / pass_environment mark)
    def weighed(*args: Any, **kwargs: Any):
        if env.meter is not None:
            for v in (*args, *kwargs.values()):
                env.meter.weigh(v, "a filter's value")
        return f(*args, **kwargs)
    return weighed


# --- messages as text ----------------------------------------------------------------------------
_BREAK = "\ufdd0"  # a Unicode noncharacter: breaks a special-token string written inside a message
_UNBREAK = re.compile(_BREAK + "(" + _BREAK + ")?")  # a break dropped, a doubled one made single


def _special_patterns(tok: Tokenizer) -> tuple[re.Pattern | None, re.Pattern | None, dict[str, int]]:
    """Regexes matching the tokenizer's special (control) tokens: as `tokenizers` splits on them
    (lstrip/rstrip tokens take the whitespace beside them), and their bare strings; their ids."""
    added = {t.content: t for t in tok.get_added_tokens_decoder().values() if t.special and len(t.content) > 1}
    if not added:
        return None, None, {}
    order = sorted(added, key=len, reverse=True)
    split = [(r"\s*" if added[c].lstrip else "") + re.escape(c) + (r"\s*" if added[c].rstrip else "") for c in order]
    return (re.compile("|".join(split)), re.compile("|".join(map(re.escape, order))),
            {c: tok.token_to_id(c) for c in order})


def _never_prepend(spec: Any) -> Any:
    """A tokenizer.json pre_tokenizer with Metaspace's prepend_scheme "first" made "never": how
    `tokenizers` treats every piece after a special token, which we encode on its own."""
    if isinstance(spec, dict):
        out = {k: _never_prepend(v) for k, v in spec.items()}
        if out.get("type") == "Metaspace" and out.get("prepend_scheme") == "first":
            out["prepend_scheme"] = "never"
        return out
    if isinstance(spec, list):
        return [_never_prepend(v) for v in spec]
    return spec


class TextCodec:
    """Tokenizer, chat template and special tokens of one model."""

    def __init__(self, tokenizer_path: Path, template: str | None, meta: dict):
        self.tok = Tokenizer.from_file(str(tokenizer_path))
        self.meta = meta
        self.template_source = template if template is not None else FALLBACK_TEMPLATE
        self.has_template = template is not None
        env = _BudgetEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
        env.globals["raise_exception"] = _raise
        env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
        _checked_filters(env)
        self.env, self.budget = env, RenderBudget()
        env.meter = _Meter(self.budget, 0)  # constant folding at compile time runs filters: budget it too
        try:
            self.template = env.from_string(self.template_source)
        except jinja2.TemplateSyntaxError as e:
            raise TemplateError(f"chat template does not parse: {e.message} (line {e.lineno})") from None
        finally:
            env.meter = None
        # `~` compiles to the template module's str_join: the sized one instead
        self.template.root_render_func.__globals__["str_join"] = env.checked_join
        self.template.root_render_func.__globals__["markup_join"] = env.checked_join
        self._special_re, self._bare_re, self.special_ids = _special_patterns(self.tok)
        self.marker_ids = {self.special_ids[m]: m for m in MARKERS if m in self.special_ids}  # id -> text
        # plain pieces (special-token strings as text) go through the same tokenizer with
        # encode_special_tokens switched on for the call, under _lock: a second instance cost its
        # whole vocabulary again (half the tokenizer's memory). Only a tokenizer that prepends a
        # space to every piece (SentencePiece style) gets one more, for pieces that are not first.
        # (parsed into Python only when there is one: a vocabulary's objects outlive their use as
        # heap fragments)
        self._lock, self._plain_rest = threading.Lock(), None
        serialized = self.tok.to_str()
        if re.search(r'"prepend_scheme"\s*:\s*"first"', serialized):
            spec = json.loads(serialized)
            rest = _never_prepend(spec)
            if rest != spec:
                self._plain_rest = Tokenizer.from_str(json.dumps(rest))
                self._plain_rest.encode_special_tokens = True
            del spec, rest
        del serialized
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
        with self._lock:
            ids = self.tok.encode(text, add_special_tokens=False).ids
        return self._with_bos(ids, add_bos)

    def _with_bos(self, ids: list[int], add_bos: bool | None = None) -> list[int]:
        if (self.add_bos if add_bos is None else add_bos) and self.bos_id is not None and ids[:1] != [self.bos_id]:
            return [self.bos_id] + ids
        return ids

    def decode(self, ids: list[int], skip_special: bool = True) -> str:
        """Text of ids; skip_special drops the special tokens except the reply markers
        (engine.harmony.MARKERS: harmony's channel tokens, <think>), which the reasoning splitter reads."""
        ids = list(ids)
        if not skip_special or not self.marker_ids or self.marker_ids.keys().isdisjoint(ids):
            return self.tok.decode(ids, skip_special_tokens=skip_special)
        out, run = [], []
        for i in ids:
            if i in self.marker_ids:
                out += [self.tok.decode(run, skip_special_tokens=True), self.marker_ids[i]]
                run = []
            else:
                run.append(i)
        return "".join(out + [self.tok.decode(run, skip_special_tokens=True)])

    def render(self, messages: list[dict], add_generation_prompt: bool = True,
               template_vars: dict[str, Any] | None = None) -> str:
        """The chat template applied, within the render budget. `template_vars` are the template's
        own switches (Qwen3's `enable_thinking`), passed as template variables the way
        transformers' apply_chat_template passes its extra keyword arguments."""
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or "role" not in m or "content" not in m:
                raise ValueError(f"message {i} must be a dict with 'role' and 'content', got {m!r}")
        extra = _template_vars(template_vars)
        meter = _Meter(self.budget, sum(_text_size(m) for m in messages))
        old_trace = sys.gettrace()
        self.env.meter = meter
        sys.settrace(meter.tracer)
        try:
            out, size = [], 0
            for piece in self.template.generate(**extra, messages=messages, add_generation_prompt=add_generation_prompt,
                                                bos_token=self.bos_token or "", eos_token=self.eos_token or ""):
                size += len(piece)
                meter.size(size, "output")
                out.append(piece)
            meter.clock()
            return "".join(out)
        except TemplateError:
            raise
        except jinja2.exceptions.SecurityError as e:
            raise TemplateError(f"chat template tried something unsafe and was stopped: {e}") from None
        except MemoryError:
            raise TemplateBudgetError("chat template ran out of memory while rendering") from None
        except (jinja2.TemplateError, TypeError, ValueError, AttributeError, KeyError, IndexError,
                OverflowError, RecursionError) as e:
            raise TemplateError(f"chat template failed: {type(e).__name__}: {e}") from None
        finally:
            sys.settrace(old_trace)
            self.env.meter = None

    def encode_chat(self, messages: list[dict], add_generation_prompt: bool = True,
                    template_vars: dict[str, Any] | None = None, resume: str = "") -> list[int]:
        """Token ids of a conversation: the template's structure with its special tokens, every
        message's text as plain text (a `<|im_end|>` a user types is the characters, not the
        token). Special-token strings inside messages are broken with a noncharacter before
        rendering, so the rendered text holds only the template's own; the pieces between those
        are encoded with special tokens off, as `tokenizers` itself splits on them.

        `resume`: the start of the reply, as the model wrote it after the generation prompt (its
        `<think>` tags included), appended as plain text: the prompt a reply cut short is
        continued from is the one it was written after, followed by what it wrote."""
        tail = self._encode_plain(resume, first=False) if resume else []
        if self._special_re is None:
            return self.encode(self.render(messages, add_generation_prompt, template_vars)) + tail
        text = self.render([_break_specials(m, self._bare_re) for m in messages], add_generation_prompt,
                           template_vars)
        ids, at = [], 0
        for m in self._special_re.finditer(text):
            if m.start() > at:
                ids += self._plain_piece(text[at:m.start()], at == 0)
            g = m.group()  # an lstrip/rstrip token's match holds the whitespace it takes
            ids.append(self.special_ids[g if g in self.special_ids else g.strip()])
            at = m.end()
        if at < len(text):
            ids += self._plain_piece(text[at:], at == 0)
        return self._with_bos(ids) + tail

    def _plain_piece(self, text: str, first: bool) -> list[int]:
        return self._encode_plain(_UNBREAK.sub(lambda m: m.group(1) or "", text), first)

    def _encode_plain(self, text: str, first: bool) -> list[int]:
        """Ids of text whose special-token strings are characters, not tokens."""
        if not first and self._plain_rest is not None:
            return self._plain_rest.encode(text, add_special_tokens=False).ids
        with self._lock:
            was, self.tok.encode_special_tokens = self.tok.encode_special_tokens, True
            try:
                return self.tok.encode(text, add_special_tokens=False).ids
            finally:
                self.tok.encode_special_tokens = was


RESERVED_VARS = frozenset({"messages", "add_generation_prompt", "bos_token", "eos_token"})


def _template_vars(values: dict[str, Any] | None) -> dict[str, Any]:
    """Template switches are names and plain values; the names the renderer sets are not theirs."""
    values = dict(values or {})
    for k, v in values.items():
        if not isinstance(k, str) or not k.isidentifier() or k in RESERVED_VARS:
            raise ValueError(f"template variable {k!r} is not allowed (a name other than {sorted(RESERVED_VARS)})")
        if not isinstance(v, (bool, int, float, str, type(None))):
            raise ValueError(f"template variable {k} must be a bool, number, string or None, got {type(v).__name__}")
    return values


def _text_size(v: Any) -> int:
    if isinstance(v, str):
        return len(v)
    if isinstance(v, dict):
        return sum(_text_size(x) for x in v.values())
    if isinstance(v, (list, tuple)):
        return sum(_text_size(x) for x in v)
    return 0


def _break_specials(v: Any, pattern: re.Pattern) -> Any:
    """Every string in a message with special-token strings broken (a noncharacter after their
    first character; a noncharacter already there is doubled, so unbreaking restores the text)."""
    if isinstance(v, str):
        v = v.replace(_BREAK, _BREAK + _BREAK)
        while True:  # again until none is left: a match can hide another that overlaps it
            broken = pattern.sub(lambda m: m.group()[0] + _BREAK + m.group()[1:], v)
            if broken == v:
                return v
            v = broken
    if isinstance(v, dict):
        return {k: _break_specials(x, pattern) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_break_specials(x, pattern) for x in v]
    return v


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
