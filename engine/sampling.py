"""Choosing the next token from logits: greedy, or sampled after the penalties (repeat, frequency,
presence), top-k, top-p and min-p, with the temperature last (llama.cpp's order). The same seed
gives the same tokens.

The definition (what `reference_distribution` computes over the whole vocabulary): penalise the
tokens of the last 64; sort by logit (ties: lower id first); keep the top_k; p = softmax of the
kept logits; keep the shortest prefix whose p sums to top_p, and only tokens with
p >= min_p * p[0]; sample the kept ones from softmax(logit / temperature).

The fast path never sorts the vocabulary and never copies it to float64: a bound from 16-token
column maxima picks the few candidates that can survive top-k (the penalised tokens merged in
afterwards), and only those are sorted; with no top-k a threshold pass gathers the tokens top-p
and min-p can keep. Penalties touch only the tokens seen.
"""
from __future__ import annotations

import math

import numpy as np

import engine.kernels.ready  # noqa: F401  (engine.kernels.setup() first: fails otherwise)
from numba import njit

from engine import params
from engine.errors import ColibriError

REPEAT_LAST_N = 64  # tokens the penalties look back over
FAST_TOP_K = 256  # sample() takes the one-call kernel (sample_top_k) for top_k up to this, without penalties


# --- partial selection ------------------------------------------------------------------------
GROUPS = 16  # the vocabulary is cut into 16 rows; the maximum over them is one vector pass


def top_candidates(x: np.ndarray, m: int) -> np.ndarray:
    """Indices (ascending) of a superset of the m largest of x (V,), every tie with the m-th
    included. Column j of x viewed as (16, V // 16) holds 16 tokens; the m-th largest column
    maximum t is met by at least m tokens, so the tokens >= t (all in columns whose maximum
    is >= t, or in the V % 16 tail) hold the m largest: one vector pass for the maxima, a
    partition of V/16 values, and a look at a few hundred tokens instead of a sort of V."""
    v = len(x)
    if m >= v:
        return np.arange(v)
    cols = v // GROUPS
    if m * 4 > cols:  # too many wanted for the bound to save anything: the exact m-th value
        t = np.partition(x, v - m)[v - m]
        return np.flatnonzero(x >= t)
    colmax = x[:cols * GROUPS].reshape(GROUPS, cols).max(axis=0)
    t = np.partition(colmax, cols - m)[cols - m]
    idx = (np.flatnonzero(colmax >= t) + cols * np.arange(GROUPS)[:, None]).ravel()
    if v > cols * GROUPS:
        idx = np.concatenate([idx, np.arange(cols * GROUPS, v)])
    return np.sort(idx[x[idx] >= t])


# --- the definition ----------------------------------------------------------------------------
def penalise(logits: np.ndarray, ids: np.ndarray, counts: np.ndarray, repeat: float, frequency: float,
             presence: float) -> np.ndarray:
    """Penalised float64 logits of tokens `ids` seen `counts` times (repeat, then frequency and presence)."""
    v = logits[ids].astype(np.float64)
    v = np.where(v > 0, v / repeat, v * repeat) if repeat != 1.0 else v
    return v - counts * frequency - (counts > 0) * presence


def _truncate(z: np.ndarray, top_p: float, min_p: float, total: float | None = None) -> int:
    """How many of the sorted logits z (descending, the top-k set or a prefix of it) top-p and
    min-p keep; `total`: the softmax denominator over the whole set when z is only a prefix."""
    e = np.exp(z - z[0])
    p = e / (e.sum() if total is None else total)
    keep = int(np.searchsorted(np.cumsum(p), top_p) + 1) if top_p < 1.0 else len(p)
    return max(1, min(keep, len(p), int(np.count_nonzero(p >= min_p * p[0]))))


def reference_distribution(logits: np.ndarray, history: list[int], temperature: float, top_k: int, top_p: float,
                           min_p: float, repeat_penalty: float = 1.0, frequency_penalty: float = 0.0,
                           presence_penalty: float = 0.0) -> np.ndarray:
    """The sampling definition, straightforwardly, over the whole vocabulary: (vocab,) probabilities
    (greedy: one-hot). The slow twin that tests hold the Sampler to."""
    z = logits.astype(np.float64)
    if history:
        ids, counts = np.unique(np.asarray(history[-REPEAT_LAST_N:], np.int64), return_counts=True)
        z[ids] = penalise(logits, ids, counts, repeat_penalty, frequency_penalty, presence_penalty)
    out = np.zeros(len(z))
    if temperature == 0.0:
        out[int(np.argmax(z))] = 1.0
        return out
    order = np.argsort(-z, kind="stable")
    if top_k > 0:
        order = order[:top_k]
    keep = _truncate(z[order], top_p, min_p)
    t = np.exp((z[order[:keep]] - z[order[0]]) / temperature)
    out[order[:keep]] = t / t.sum()
    return out


def _absent(idx: np.ndarray, seen: np.ndarray) -> np.ndarray:
    """Mask of the idx not in `seen` (sorted, as np.unique gives it): np.isin sorts both."""
    at = np.minimum(np.searchsorted(seen, idx), len(seen) - 1)
    return seen[at] != idx


SCAN_BLOCK = 256  # logits per block of sample_top_k's scan: one vector pass each, most blocks skipped


_MAGNITUDE = np.int32(0x7FFFFFFF)


@njit(inline="always", cache=True, nogil=True)
def _block_max(bits):
    """(max, whether a NaN or +inf is among them) of a block of float32 logits given as their int32
    bits, the max as an order key: two integer max reductions (which vectorise; LLVM leaves a float
    max scalar). A float's bits with the magnitude flipped for negatives order as the floats do (the
    flip is its own inverse: sample_top_k turns the keys back into floats), and the largest magnitude
    bits say NaN (above +inf's 0x7F800000) whatever the sign."""
    key_max = np.int32(-2147483648)
    abs_max = np.int32(0)
    for i in range(bits.shape[0]):
        s = bits[i]
        key_max = max(key_max, s ^ ((s >> 31) & _MAGNITUDE))
        abs_max = max(abs_max, s & _MAGNITUDE)
    return key_max, abs_max > np.int32(0x7F800000) or key_max == np.int32(0x7F800000)


@njit(cache=True, nogil=True)
def sample_top_k(x, k, top_p, min_p, temperature, u):
    """One draw from the top_k logits of x (V,) float32 after top-p and min-p, at `temperature`,
    with u in [0, 1): distribution() then sample()'s cumulative search, in one compiled pass
    (no penalties). -1: a NaN or +inf logit; -2: every logit -inf (check_finite says which).

    Why: right after a decode step the caches hold the weights, not numpy's code and data, and
    the dozen numpy calls of the general path cost many times their warm time there, a visible
    share of a small model's decode step; one kernel call costs one scan of the logits. The
    k best are kept sorted (value descending, ties: the lower id, as distribution's lexsort) by
    insertion, a logit below the k-th best costing one compare; only the blocks of SCAN_BLOCK
    logits whose maximum reaches the k-th largest block maximum are looked at, a few of them on a
    real vocabulary."""
    v = x.shape[0]
    k = min(k, v)
    vals = np.empty(k, np.float64)
    ids = np.empty(k, np.int64)
    n = 0
    bits = x.view(np.int32)
    blocks, whole = (v + SCAN_BLOCK - 1) // SCAN_BLOCK, v // SCAN_BLOCK
    keys = np.empty(blocks, np.int32)
    rows = bits[:whole * SCAN_BLOCK].reshape(whole, SCAN_BLOCK)
    for b in range(blocks):
        key, bad = _block_max(rows[b] if b < whole else bits[whole * SCAN_BLOCK:])
        if bad:  # NaN or +inf
            return -1
        keys[b] = key
    maxima = (keys ^ ((keys >> 31) & _MAGNITUDE)).astype(np.int32).view(np.float32)  # the keys back to floats
    # the k-th largest block maximum: k logits reach it, so the k best all do and lie in blocks
    # whose maximum does; the others cannot enter (a tie with the k-th is in such a block too)
    bound = np.partition(maxima, blocks - k)[blocks - k] if k <= blocks else np.float32(-np.inf)
    for b in range(blocks):
        lo, hi = b * SCAN_BLOCK, min(v, (b + 1) * SCAN_BLOCK)
        if maxima[b] < bound or (n == k and not maxima[b] > vals[k - 1]):
            continue
        for i in range(lo, hi):
            xi = x[i]
            if n == k and not xi > vals[k - 1]:
                continue
            j = n if n < k else k - 1
            f = np.float64(xi)
            while j > 0 and vals[j - 1] < f:
                vals[j], ids[j] = vals[j - 1], ids[j - 1]
                j -= 1
            vals[j], ids[j] = f, i
            if n < k:
                n += 1
    if vals[0] == -np.inf:
        return -2
    # _truncate: top-p (the shortest prefix whose mass reaches top_p) and min-p over the k
    e = np.empty(k, np.float64)
    total = 0.0
    for j in range(k):
        e[j] = math.exp(vals[j] - vals[0])
        total += e[j]
    keep = k
    if top_p < 1.0:
        acc, keep = 0.0, k
        for j in range(k):
            acc += e[j] / total
            if acc >= top_p:
                keep = j + 1
                break
    above = 0
    for j in range(k):
        if e[j] / total >= min_p * (e[0] / total):
            above += 1
    keep = max(1, min(keep, k, above))
    if keep == 1:
        return ids[0]
    # temperature last; the draw: the first cumulative weight above u times the total
    total = 0.0
    for j in range(keep):
        e[j] = math.exp((vals[j] - vals[0]) / temperature)
        total += e[j]
    for j in range(keep):
        e[j] /= total
    acc = 0.0
    for j in range(keep):
        acc += e[j]
        e[j] = acc
    target = u * e[keep - 1]
    for j in range(keep):
        if e[j] > target:
            return ids[j]
    return ids[keep - 1]


class SamplingError(ColibriError, ValueError):
    """The logits cannot be sampled (NaN or +inf: a numerical fault upstream)."""


def check_finite(x: np.ndarray) -> None:
    """NaN or +inf logits are a numerical fault upstream: say which token (one vector pass)."""
    mx = x.max()
    if not mx < np.inf:  # max propagates NaN
        i = int(np.flatnonzero(~(x < np.inf))[0])
        raise SamplingError(f"logit of token {i} is {x[i]}: the model produced a non-finite value")
    if mx == -np.inf:
        raise SamplingError("every logit is -inf: nothing can be sampled")


class Sampler:
    def __init__(self, **settings):
        s = params.defaults("sampling") | params.validate(settings, scope="sampling")
        self.temperature, self.top_k, self.top_p = s["temperature"], s["top_k"], s["top_p"]
        self.min_p, self.repeat_penalty = s["min_p"], s["repeat_penalty"]
        self.frequency_penalty, self.presence_penalty = s["frequency_penalty"], s["presence_penalty"]
        self.rng = np.random.default_rng(s["seed"])

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def penalised(self) -> bool:
        return self.repeat_penalty != 1.0 or self.frequency_penalty != 0.0 or self.presence_penalty != 0.0

    def _seen(self, logits: np.ndarray, history: list[int]) -> tuple[np.ndarray, np.ndarray]:
        """(ids, penalised logits) of the tokens the penalties touch; empty without penalties."""
        if not self.penalised or not history:
            return np.empty(0, np.int64), np.empty(0)
        ids, counts = np.unique(np.asarray(history[-REPEAT_LAST_N:], np.int64), return_counts=True)
        return ids, penalise(logits, ids, counts, self.repeat_penalty, self.frequency_penalty,
                             self.presence_penalty)

    def _pool(self, x: np.ndarray, k: int, seen: np.ndarray, pen: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The k best tokens after the penalties, sorted (value descending, ties: lower id): the
        k + len(seen) best raw logits hold every unseen one of them; the seen ones join penalised."""
        idx = top_candidates(x, k + len(seen))
        val = x[idx].astype(np.float64)
        if len(seen):
            unseen = _absent(idx, seen)
            idx, val = np.concatenate([idx[unseen], seen]), np.concatenate([val[unseen], pen])
        order = np.lexsort((idx, -val))[:k]  # never all -inf: check_finite ran, no penalty makes -inf
        return idx[order], val[order]

    def distribution(self, logits: np.ndarray, history: list[int]) -> tuple[np.ndarray, np.ndarray]:
        """(token ids, probabilities) of the tokens that can be drawn next; greedy: one token."""
        x = np.ascontiguousarray(logits, np.float32).reshape(-1)
        check_finite(x)
        seen, pen = self._seen(x, history)
        if (self.greedy or self.top_k == 1) and not len(seen):
            return np.array([np.argmax(x)]), np.ones(1)
        if self.greedy or self.top_k == 1:
            idx, _ = self._pool(x, 1, seen, pen)
            return idx, np.ones(1)
        if 0 < self.top_k < len(x):
            idx, z = self._pool(x, self.top_k, seen, pen)
            keep, zmax = _truncate(z, self.top_p, self.min_p), z[0]
        else:
            idx, z, keep, zmax = self._untruncated(x, seen, pen)
        t = np.exp((z[:keep] - zmax) / self.temperature)  # temperature last, as llama.cpp does
        return idx[:keep], t / t.sum()

    def _untruncated(self, x: np.ndarray, seen: np.ndarray, pen: np.ndarray) -> tuple[np.ndarray, np.ndarray, int, float]:
        """No top-k: gather the tokens above a threshold that holds the min-p survivors (or
        enough top-p mass), widening it until it does; sort only those. (ids, logits, how many
        are kept, the largest logit)."""
        z0 = float(self._pool(x, 1, seen, pen)[1][0])
        whole = self.top_p >= 1.0 and self.min_p == 0.0  # every token is kept: no order needed
        thr = -np.inf if whole else z0 + (np.log(self.min_p) - 1e-6 if self.min_p > 0 else -8.0)
        total = 0.0 if whole else float(np.exp(x.astype(np.float64) - z0).sum())
        if len(seen) and not whole:
            total += float(np.exp(pen - z0).sum() - np.exp(x[seen].astype(np.float64) - z0).sum())
        while True:
            idx = np.flatnonzero(x >= thr)
            z = x[idx].astype(np.float64)
            if len(seen):
                unseen = _absent(idx, seen)
                hit = pen >= thr
                idx, z = np.concatenate([idx[unseen], seen[hit]]), np.concatenate([z[unseen], pen[hit]])
            if whole:
                return idx, z, len(idx), z0
            order = np.lexsort((idx, -z))
            idx, z = idx[order], z[order]
            if self.min_p > 0 or thr == -np.inf or np.exp(z - z0).sum() >= self.top_p * total:
                return idx, z, _truncate(z, self.top_p, self.min_p, total), z0  # the kept ones are all here
            thr = z0 + 2 * (thr - z0) if thr - z0 > -64 else -np.inf

    def sample(self, logits: np.ndarray, history: list[int]) -> int:
        """logits (vocab,) -> token id."""
        if not self.greedy and 1 < self.top_k <= FAST_TOP_K and not self.penalised and self.top_k < logits.size:
            x = np.ascontiguousarray(logits, np.float32).reshape(-1)
            tok = sample_top_k(x, self.top_k, self.top_p, self.min_p, self.temperature, self.rng.random())
            if tok < 0:
                check_finite(x)  # raises, naming the token
            return int(tok)
        idx, p = self.distribution(logits, history)
        if len(idx) == 1:
            return int(idx[0])
        c = np.cumsum(p)
        return int(idx[min(int(np.searchsorted(c, self.rng.random() * c[-1], side="right")), len(idx) - 1)])
