"""Choosing the next token from logits: greedy, or sampled after temperature, repetition
penalty, top-k, top-p and min-p (in llama.cpp's order). The same seed gives the same tokens."""
from __future__ import annotations

import numpy as np

from engine import params

REPEAT_LAST_N = 64  # tokens the repetition penalty looks back over


class Sampler:
    def __init__(self, **settings):
        s = params.defaults("sampling") | params.validate(settings, scope="sampling")
        self.temperature, self.top_k, self.top_p = s["temperature"], s["top_k"], s["top_p"]
        self.min_p, self.repeat_penalty = s["min_p"], s["repeat_penalty"]
        self.rng = np.random.default_rng(s["seed"])

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def penalise(self, logits: np.ndarray, history: list[int]) -> np.ndarray:
        if self.repeat_penalty == 1.0 or not history:
            return logits
        seen = np.unique(np.asarray(history[-REPEAT_LAST_N:], np.int64))
        out = logits.copy()
        v = out[seen]
        out[seen] = np.where(v > 0, v / self.repeat_penalty, v * self.repeat_penalty)
        return out

    def sample(self, logits: np.ndarray, history: list[int]) -> int:
        """logits (vocab,) -> token id."""
        logits = self.penalise(logits.astype(np.float64), history)
        if self.greedy:
            return int(np.argmax(logits))
        order = np.argsort(-logits, kind="stable")
        if self.top_k > 0:
            order = order[:self.top_k]
        z = logits[order]
        p = np.exp(z - z[0])
        p /= p.sum()
        keep = int(np.searchsorted(np.cumsum(p), self.top_p) + 1) if self.top_p < 1.0 else len(p)
        keep = max(1, min(keep, len(p), int(np.count_nonzero(p >= self.min_p * p[0]))))
        t = np.exp((z[:keep] - z[0]) / self.temperature)  # temperature last, as llama.cpp does
        return int(order[self.rng.choice(keep, p=t / t.sum())])
