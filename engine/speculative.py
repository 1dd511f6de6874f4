"""Speculative decoding with n-gram drafts: tokens guessed from the conversation's own tokens
(prompt lookup), checked in one batched step of the decoder loop, kept as far as the model agrees.

Why it can pay: a verify step runs k+1 positions through each layer at once, as a prompt does, so
each weight matrix (and each routed expert, read once for all the positions routed to it) is read
once for k+1 tokens; a reply that copies its input (a code edit, a rewrite, a quote) accepts most
drafts. Why it can lose: drafts that miss cost a wider step for nothing, and an MoE's wider step
reads more distinct experts. So drafts stop early where nothing matches, their length follows
what was accepted, and `auto` times the conversation's tokens with and without, keeping whichever
is faster (and looking again now and then).

Correct by construction: a drafted token is accepted with the target's probability of it, else
the token is drawn from the target with that token removed (renormalised); so every token follows
the plain sampler's distribution (greedy: the argmax, exactly as plain decoding chooses it).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

NGRAM_MAX = 4  # longest suffix looked up
NGRAM_MIN = 2  # a single repeated token predicts too little to pay for a wider step
AUTO_NGRAM_MIN = 3  # auto: a 2-gram match in ordinary chat misses more often than it pays
DRAFT_START = 4
PLAIN_EVERY = 64  # auto: at least one plain step this often, so the comparison stays current
RETRY_AFTER = 64  # auto: tokens decoded plainly before speculation is tried again
MIN_SAMPLES = 3  # auto: steps of each kind before deciding
EMA = 0.2


def refusal(net: Any) -> str | None:
    """Why a model cannot speculate, or None. A verify step writes k+1 positions and keeps only the
    accepted ones: a KV cache forgets the rest by its length; rings and recurrent states would need
    copies taken before the step, which they do not keep yet."""
    if getattr(net, "recurrent", False):
        kinds = sorted({k for k in net.kinds if k != "attention"} or {"own attention caches"})
        return f"recurrent or ring states ({', '.join(kinds)}) cannot be rolled back yet"
    return None


class NgramIndex:
    """The latest position after each 2..4-gram of a token list, kept as the list grows: a lookup
    is one dict access per n, however long the conversation."""

    def __init__(self) -> None:
        self.maps: dict[int, dict[tuple, int]] = {n: {} for n in range(NGRAM_MIN, NGRAM_MAX + 1)}
        self.done = 0  # n-grams ending at positions <= done - 1 are indexed (the last token's never)

    def update(self, tokens: list[int]) -> None:
        """Index the n-grams that end before the last token (they have a token after them)."""
        for end in range(max(self.done, NGRAM_MIN), len(tokens)):
            for n, m in self.maps.items():
                if end >= n:
                    m[tuple(tokens[end - n:end])] = end
        self.done = max(self.done, len(tokens))

    def draft(self, tokens: list[int], k: int, n_min: int = NGRAM_MIN) -> list[int]:
        """Up to k tokens that followed the longest earlier occurrence of the list's last n tokens
        (n >= n_min)."""
        self.update(tokens)
        for n in range(NGRAM_MAX, n_min - 1, -1):
            if len(tokens) <= n:
                continue
            at = self.maps[n].get(tuple(tokens[-n:]))
            if at is not None:
                return tokens[at:at + k]
        return []


def accept(sampler: Any, logits: np.ndarray, history: list[int], draft: int) -> int:
    """The next token given the target's logits and a drafted token: the draft with the target's
    probability of it, else a draw from the target without it (renormalised). Greedy: the argmax."""
    if sampler.greedy:
        return sampler.sample(logits, history)
    idx, p = sampler.distribution(logits, history)
    hit = idx == draft
    pd = float(p[hit].sum())
    if sampler.rng.random() < pd:
        return draft
    rest = np.where(hit, 0.0, p)
    c = np.cumsum(rest)
    return int(idx[min(int(np.searchsorted(c, sampler.rng.random() * c[-1], side="right")), len(idx) - 1)])


@dataclass
class SpecTotals:
    """What speculation did on this engine (stats()): drafted and accepted tokens, the time and
    tokens of verify steps and of plain steps, and the expert bytes each read."""
    verify_steps: int = 0
    drafted: int = 0
    accepted: int = 0
    verify_s: float = 0.0
    verify_tokens: int = 0  # tokens committed by verify steps (accepted + the one after)
    plain_s: float = 0.0
    plain_tokens: int = 0
    verify_expert_bytes: int = 0
    plain_expert_bytes: int = 0
    plain_spt: float | None = None  # seconds per plain step (EMA over conversations): auto's first guess

    def snapshot(self, mode: str, state: str) -> dict[str, Any]:
        v = self.verify_tokens / self.verify_s if self.verify_s else None
        p = self.plain_tokens / self.plain_s if self.plain_s else None
        per = lambda b, n: b / n if n else None  # noqa: E731
        return {"mode": mode, "state": state, "drafted": self.drafted, "accepted": self.accepted,
                "acceptance": self.accepted / self.drafted if self.drafted else None,
                "verify_steps": self.verify_steps, "verify_tok_s": v, "plain_tok_s": p,
                "net_gain": v / p if v and p else None,
                "expert_bytes_per_token_verify": per(self.verify_expert_bytes, self.verify_tokens),
                "expert_bytes_per_token_plain": per(self.plain_expert_bytes, self.plain_tokens)}


class Speculator:
    """One conversation's drafting and its auto decision; lives as long as the conversation cache."""

    def __init__(self, refused: str | None = None, totals: SpecTotals | None = None):
        self.refused = refused
        self.index = NgramIndex()
        self.k = DRAFT_START
        self.totals = totals or SpecTotals()  # the engine's, across conversations
        self.plain_spt = self.totals.plain_spt  # auto: seconds per token, plain steps (EMA), the engine's so far
        self.spec_spt: float | None = None  # auto: seconds per committed token, verify steps (EMA)
        self.plain_n = MIN_SAMPLES if self.plain_spt is not None else 0
        self.spec_n = 0
        self.off_until = 0  # auto: no drafts until this many tokens were decoded
        self.since_plain = 0
        self.decoded = 0
        self.mode = "off"

    def state(self) -> str:
        if self.refused:
            return f"off ({self.refused})"
        if self.mode == "auto" and self.decoded < self.off_until:
            return "off (auto: plain decoding measured faster)"
        return "on" if self.mode != "off" else "off"

    def wanted(self, mode: str, sampler: Any, seeded: bool) -> bool:
        """Whether this reply drafts at all: never when refused or off; auto with a seed only greedy,
        as auto's timing-made switches would otherwise change which text a seed gives."""
        self.mode, self.index = mode, NgramIndex()  # a reply's own tokens: its prompt and what it writes
        if self.refused or mode == "off":
            return False
        return mode == "ngram" or sampler.greedy or not seeded

    def draft(self, tokens: list[int], room: int, k_max: int) -> list[int]:
        """The tokens to verify after the pending one (none: a plain step)."""
        if self.mode == "auto":
            if self.decoded < self.off_until:
                return []
            if self.plain_n and self.since_plain >= PLAIN_EVERY or self.plain_n < MIN_SAMPLES <= self.spec_n:
                return []  # a plain step now and then: the comparison needs both
        return self.index.draft(tokens, max(0, min(self.k, k_max, room)),
                                AUTO_NGRAM_MIN if self.mode == "auto" else NGRAM_MIN)

    def observe(self, drafted: int, accepted: int, seconds: float, expert_bytes: int) -> None:
        """A step's outcome: `drafted` 0 is a plain step (one token)."""
        t = self.totals
        tokens = accepted + 1 if drafted else 1
        self.decoded += tokens
        if drafted:
            t.verify_steps += 1
            t.drafted, t.accepted = t.drafted + drafted, t.accepted + accepted
            t.verify_s, t.verify_tokens = t.verify_s + seconds, t.verify_tokens + tokens
            t.verify_expert_bytes += expert_bytes
            self.spec_spt = _ema(self.spec_spt, seconds / tokens)
            self.spec_n += 1
            self.since_plain += tokens
            # longer drafts while they are all taken (llama.cpp found long ones pay on MoE); short after a miss
            self.k = min(64, self.k * 2) if accepted == drafted else max(2, accepted + 1)
        else:
            t.plain_s, t.plain_tokens = t.plain_s + seconds, t.plain_tokens + 1
            t.plain_expert_bytes += expert_bytes
            self.plain_spt = t.plain_spt = _ema(self.plain_spt, seconds)
            self.plain_n += 1
            self.since_plain = 0
        if self.mode == "auto" and self.spec_n >= MIN_SAMPLES and self.plain_n >= MIN_SAMPLES \
                and self.spec_spt > self.plain_spt:
            self.off_until = self.decoded + RETRY_AFTER  # slower with: off for a while, then measured again
            self.spec_n, self.spec_spt = 0, None


def _ema(old: float | None, new: float) -> float:
    return new if old is None else (1 - EMA) * old + EMA * new

