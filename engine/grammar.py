"""Constrained decoding: a reply that always fits a JSON schema, a grammar or a regex.

llguidance does the parsing. From the model's tokenizer.json it builds a view of every token's
bytes (special tokens apart: a grammar never emits them, the end tokens only where it may end),
once per model; a constraint compiles into a matcher that says, before each token, which tokens
may come next, as a bitmask over the vocabulary. The next mask is computed on a worker thread
while the forward pass runs (llguidance releases the GIL); the sampler only waits for it and
gives the forbidden tokens a logit of -inf.

The `grammar` generation parameter is a JSON schema (its JSON text), a Lark grammar in
llguidance's dialect (docs/syntax.md of guidance-ai/llguidance: Lark rules, /regex/ terminals,
`%json {schema}` to embed a JSON schema), or llguidance's JSON form that `json_schema`,
`json_object` and `regex` below return.
"""
from __future__ import annotations

import json
import logging
import re
import threading
import weakref
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING

import llguidance
import numpy as np

from engine.errors import ColibriError

if TYPE_CHECKING:
    from engine.tokenizer import TextCodec

log = logging.getLogger("colibri.engine")


class GrammarError(ColibriError, ValueError):
    """A constraint llguidance cannot compile (the text names the unsupported keyword or the
    syntax error), or a token it refused."""


def json_schema(schema: dict | str) -> str:
    """The constraint for JSON that validates against `schema`. A keyword llguidance does not
    implement is an error at check() (not silently ignored: the output would not be sure to
    validate)."""
    try:
        return llguidance.LLMatcher.grammar_from_json_schema(schema)
    except ValueError as e:
        raise GrammarError(f"the JSON schema is not a JSON object: {e}") from None


def json_object() -> str:
    """Any JSON object (OpenAI's response_format {"type": "json_object"})."""
    return json_schema({"type": "object"})


def regex(pattern: str) -> str:
    return llguidance.LLMatcher.grammar_from_regex(pattern)


def schema_of(grammar: str) -> dict | None:
    """The JSON schema that a grammar text is (llguidance's JSON form of one schema), else None:
    what an OpenAI-compatible endpoint can be asked for as its response_format."""
    try:
        g = json.loads(grammar)
    except ValueError:
        return None
    if isinstance(g, dict) and "grammars" not in g:  # the schema itself
        return g
    parts = g.get("grammars") if isinstance(g, dict) else None
    if isinstance(parts, list) and len(parts) == 1 and isinstance(parts[0], dict) \
            and isinstance(parts[0].get("json_schema"), dict) and not parts[0].get("lark_grammar"):
        return parts[0]["json_schema"]
    return None


_UNIMPLEMENTED = re.compile(r'Unimplemented keys: \[(.*?)\]')


def unsupported_keywords(message: str) -> list[str]:
    """The schema keywords an llguidance error names as not implemented ([] for other errors)."""
    m = _UNIMPLEMENTED.search(message)
    return json.loads(f"[{m.group(1)}]") if m else []


def compiled(text: str) -> str:
    """What llguidance reads for the grammar parameter's text: a JSON schema's JSON text becomes
    llguidance's JSON form of it; a Lark grammar, or that form itself ("grammars"), is as it is."""
    if text.lstrip().startswith("{"):
        value = json.loads(text)
        if isinstance(value, dict) and "grammars" not in value:
            return json_schema(value)
    return text


def check(grammar: str) -> str:
    """`grammar` compiled (compiled()) if llguidance can, else GrammarError with its reason;
    warnings are logged."""
    grammar = compiled(grammar)
    failed, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar)
    if failed:
        raise GrammarError(f"grammar: {messages[0]}")
    for m in messages:
        log.warning("grammar: %s", m)
    return grammar


# --- the tokenizer view, once per model ---------------------------------------------------------
_views: weakref.WeakKeyDictionary[TextCodec, tuple[int, llguidance.LLTokenizer]] = weakref.WeakKeyDictionary()
_views_lock = threading.Lock()


def tokenizer_view(codec: TextCodec, vocab_size: int) -> llguidance.LLTokenizer:
    """llguidance's view of the model's tokenizer (its tokenizer.json, every stop token an end
    token), built on first use and kept as long as the codec: building it reads every token
    (most of a second on a 50k vocabulary); `vocab_size`: the logits' length, which may pad the
    tokenizer's."""
    with _views_lock:
        got = _views.get(codec)
        if got is None or got[0] != vocab_size:
            eos = sorted(codec.stop_ids) or None
            view = llguidance.LLTokenizer(codec.tok.to_str(), n_vocab=max(vocab_size, codec.vocab_size),
                                          eos_token=eos)
            got = _views[codec] = (vocab_size, view)
        return got[1]


# --- one reply's constraint ---------------------------------------------------------------------
_masks = ThreadPoolExecutor(max_workers=2, thread_name_prefix="colibri-grammar")  # llguidance drops the GIL


class Constraint:
    """One reply's matcher and the mask of its next token, computed ahead (while the model runs)."""

    def __init__(self, grammar: str, view: llguidance.LLTokenizer, vocab_size: int):
        self.matcher = llguidance.LLMatcher(view, grammar)
        if self.matcher.is_error():
            raise GrammarError(f"grammar: {self.matcher.get_error()}")
        self.vocab_size = vocab_size
        self.bits = np.zeros((max(vocab_size, view.vocab_size) + 31) // 32, np.int32)
        self.pending: Future = _masks.submit(self._fill)  # the first mask: while the prompt is read

    def _fill(self) -> None:
        self.matcher.unsafe_compute_mask_ptr(self.bits.ctypes.data, self.bits.nbytes)

    def allowed(self) -> np.ndarray:
        """(vocab,) bool: the tokens the grammar allows next (waits for the mask being computed)."""
        self.pending.result()
        if self.matcher.is_error():
            raise GrammarError(f"grammar: {self.matcher.get_error()}")
        return np.unpackbits(self.bits.view(np.uint8), count=self.vocab_size, bitorder="little").view(bool)

    def mask(self, logits: np.ndarray) -> np.ndarray:
        """logits (vocab,) with -inf for every token the grammar forbids next (a new array)."""
        return np.where(self.allowed(), logits.reshape(-1), np.float32(-np.inf)).astype(np.float32, copy=False)

    def advance(self, token: int) -> bool:
        """Take the sampled token; True when the grammar has ended (nothing may follow), else the
        next mask starts computing."""
        if not self.matcher.consume_token(token):
            raise GrammarError(f"grammar refused token {token}: {self.matcher.get_error()}")
        if self.matcher.is_stopped():
            return True
        self.pending = _masks.submit(self._fill)
        return False


def constraint(grammar: str, codec: TextCodec, vocab_size: int) -> Constraint:
    """A reply's constraint from the grammar parameter's text (compiled())."""
    return Constraint(compiled(grammar), tokenizer_view(codec, vocab_size), vocab_size)
