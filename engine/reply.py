"""One reply loop: a checked request, then sample -> stream the text -> stop strings -> finish
reason -> a `Step` record per token. Engine.generate (on the conversation cache) and the
server's sequences (engine.batch, a cache each) are both a `Reply`: they differ only in where
the prompt's positions live and who runs the model (Engine.prefill and Engine.decode)."""
from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from engine import params as P
from engine.errors import ColibriError
from engine.tokenizer import StopMatcher, StreamDecoder

if TYPE_CHECKING:
    from engine.api import Engine
    from engine.kvcache import KVCache


class ContextOverflowError(ColibriError, ValueError):
    """The prompt does not fit in the context; raised before any work is done."""


@dataclass(frozen=True)
class Step:
    """One streamed piece of a reply. The last step has `finish_reason` set.

    finish_reason: "stop" (the model's end token or a stop string), "length" (max_tokens),
    "context" (the context filled up mid-reply; OpenAI calls both "length": see
    `length_limited`), "cancelled" (Engine.stop() or the `cancel` event, during the prompt too).
    kind "prompt" (only with generate(prompt_progress=True)): no text yet, `prompt_done` of
    `prompt_tokens` are in the cache.
    """
    text: str
    token_id: int | None
    generated_tokens: int
    prompt_tokens: int
    cached_tokens: int  # prompt tokens reused from the previous turn (not prefilled again)
    prefill_tok_s: float
    decode_tok_s: float
    ttft_s: float
    context_used: int
    context_limit: int
    finish_reason: str | None = None  # "stop", "length", "context", "cancelled"
    kind: str = "token"  # "token" (a piece of the reply) or "prompt" (prefill progress)
    prompt_done: int = 0  # prompt tokens in the cache so far (== prompt_tokens once decoding)

    @property
    def length_limited(self) -> bool:
        """Cut short by a limit: max_tokens or a full context (OpenAI's "length")."""
        return self.finish_reason in ("length", "context")


def check_ids(ids: Sequence[int], vocab_size: int) -> None:
    bad = [i for i in ids if not 0 <= int(i) < vocab_size]
    if bad:
        raise ValueError(f"token ids out of range 0..{vocab_size - 1}: {bad[:5]}")


class Reply:
    """One reply between two tokens: its prompt, sampler (its own seeded RNG and settings), stream
    decoder, stop strings, history, counters and timings. Its subclass says where `cache` is and
    runs the model; `feed(logits)` samples the next token and gives the Step to stream, setting
    `finish` when the reply ends, else `token` for the next decode step.

    The request is checked here, once for every caller: bad sampling settings, prompt ids out of
    range, an empty prompt or one that leaves no room for the reply raise before anything runs."""
    cache: KVCache

    def __init__(self, engine: Engine, prompt: str | list[dict], stop: Sequence[str] = (),
                 cancel: threading.Event | None = None, template_vars: dict | None = None, resume: str = "",
                 sampling: dict[str, Any] | None = None):
        sampling = sampling or {}
        e = self.e = engine
        from engine.sampling import Sampler  # (compiled: after engine.kernels.setup(), which Engine() ran)
        self.options = e.sampling | sampling  # (speculative, draft_max: read by the reply loop)
        self.sampler = Sampler(**self.options)
        self.max_tokens = P.check("max_tokens", sampling.get("max_tokens", e.sampling["max_tokens"]))
        spec = sampling.get("grammar", e.sampling.get("grammar"))
        ids = e.prompt_ids(prompt, template_vars, resume)
        if not ids:  # as llama-cli: a model that adds BOS starts from it; any other empty prompt is an error
            if not e.codec.add_bos:
                raise ValueError("the prompt is empty (no tokens): give some text to continue")
            ids = [e.codec.bos_id]
        check_ids(ids, e.cfg.vocab_size)
        if len(ids) >= e.context_limit:
            raise ContextOverflowError(f"the prompt is {len(ids)} tokens but the context holds {e.context_limit} "
                                       f"(room is needed for the reply): shorten the conversation or raise "
                                       f"context_length")
        self.ids, self.cancel = ids, cancel
        self.constraint = None  # constrained decoding (engine.grammar): its first mask computes during prefill
        if spec is not None:
            from engine import grammar
            self.constraint = grammar.constraint(P.check("grammar", spec), e.codec, e.cfg.vocab_size)
        self.decoder, self.stops, self.history = StreamDecoder(e.codec), StopMatcher(tuple(stop)), list(ids)
        # prompt tokens per prefill pass: the engine's batch_size; an MoE's prompt goes through each layer
        # at once (its experts then read once per prompt, and per-expert row counts, hence rounding, unchanged)
        self.chunk: int | None = None if e.cfg.is_moe else int(e.params["batch_size"])
        self.generated = self.reused = self.filled = 0  # filled: prompt positions in the cache
        self.token: int | None = None  # the sampled token the next decode step runs
        self.finish: str | None = None
        self.t0 = self.t_first = time.perf_counter()
        self.prefill_tok_s = self.decode_tok_s = self.ttft = 0.0

    def cancelled(self) -> bool:
        return self.cancel is not None and self.cancel.is_set()

    def next_chunk(self, whole: bool = False) -> list[int]:
        """The prompt tokens the next prefill pass reads (the rest of the prompt if `whole`)."""
        end = len(self.ids) if whole or self.chunk is None else min(len(self.ids), self.filled + self.chunk)
        return self.ids[self.filled:end]

    def prompt_read(self) -> None:
        self.prefill_tok_s = (len(self.ids) - self.reused) / max(time.perf_counter() - self.t0, 1e-9)

    def feed(self, logits: np.ndarray, draft: int | None = None) -> Step:
        """Sample the next token from `logits` (vocab,) or (1, vocab); the Step to stream. `draft`:
        the token a speculative step guessed here (engine.speculative.accept decides)."""
        x = logits.reshape(-1)
        if self.constraint is not None:  # the tokens the grammar forbids get -inf
            x = self.constraint.mask(x)
        if draft is None:
            tok = self.sampler.sample(x, self.history)
        else:
            from engine.speculative import accept
            tok = accept(self.sampler, x, self.history, draft)
        if self.generated == 0:
            self.t_first = time.perf_counter()
            self.ttft = self.t_first - self.t0
        stop_ids, finish = self.e.codec.stop_ids, None
        if tok in stop_ids:
            finish = "stop"
            piece, _ = self.stops.push(self.decoder.flush())
            piece += self.stops.flush()
        else:
            self.generated += 1
            self.history.append(tok)
            piece, hit = self.stops.push(self.decoder.feed(tok))
            ended = self.constraint is not None and self.constraint.advance(tok)  # the grammar is complete
            if hit:
                finish = "stop"
            elif ended:
                finish = "stop"
                more, _ = self.stops.push(self.decoder.flush())
                piece += more + self.stops.flush()
            elif self.generated >= self.max_tokens:
                finish = "length"
            elif self.cache.length + 1 >= self.cache.capacity:
                finish = "context"
            elif self.cancelled():
                finish = "cancelled"
            if finish not in (None, "stop"):
                more, _ = self.stops.push(self.decoder.flush())
                piece += more + self.stops.flush()
        self.finish, self.token = finish, None if finish is not None else tok
        return self.step(piece, None if tok in stop_ids else tok)

    def end(self, finish: str = "cancelled") -> Step:
        """The last Step of a reply stopped from outside (Stop, a client gone, the cache taken)."""
        self.finish, self.token = finish, None
        return self.step()

    def step(self, piece: str = "", tok: int | None = None, kind: str = "token") -> Step:
        """kind "prompt": `prompt_done` of the prompt's tokens are in the cache, no text yet."""
        if self.generated > 1:
            self.decode_tok_s = (self.generated - 1) / max(time.perf_counter() - self.t_first, 1e-9)
        return Step(piece, tok, self.generated, len(self.ids), self.reused, self.prefill_tok_s, self.decode_tok_s,
                    self.ttft, self.cache.length, self.e.context_limit, self.finish, kind, self.filled)
