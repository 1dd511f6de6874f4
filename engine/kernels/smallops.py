"""The small float operations of a layer on the CPU, parallel over rows, tokens or heads:
RMS norm, rotary embedding, causal attention over the KV cache, SwiGLU and the router's top-k
softmax (the per-row code they share with the one-call decode is in rows.py and float_rows.py).
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

import engine.kernels.ready  # noqa: F401  (engine.kernels.setup() first: fails otherwise)
from engine.kernels.float_rows import HEADS
from engine.kernels.rows import attend, attend_heads, rmsnorm_row, rope_head, silu
from engine.kernels.simd import half_bits


@njit(parallel=True, fastmath=True, cache=True, nogil=True)
def rmsnorm(x, weight, eps, out):
    """out (R, n) = x / sqrt(mean(x²) + eps) * weight, per row of x (R, n)."""
    for r in prange(x.shape[0]):
        rmsnorm_row(x[r], weight, eps, out[r])


@njit(parallel=True, fastmath=True, cache=True, nogil=True)
def rope(x, cos, sin):
    """In place on x (T, heads, hd): rotate pairs (i, i + hd/2) by angle t·f_i (cos/sin (T, hd/2))."""
    T, H = x.shape[0], x.shape[1]
    for th in prange(T * H):
        t, h = th // H, th % H
        rope_head(x[t, h], cos[t], sin[t])


@njit(inline="always", cache=True)
def _balanced(i, T):
    """The i-th of T tokens in the order 0, T-1, 1, T-2, ...: a token's causal attention costs as many
    positions as precede it, and the threads take contiguous halves of a parallel loop (OpenMP's
    static schedule), so the first half holding the earliest tokens only would get a quarter of the work."""
    return i // 2 if i % 2 == 0 else T - 1 - i // 2


@njit(parallel=True, fastmath=True, cache=True, nogil=True)
def attention(q, k, v, ks, vs, scaled, pos0, window, scale, scores, out):
    """Causal grouped-query attention of new tokens over the cache.

    q (T, H, hd) for positions pos0..pos0+T-1; k, v (S, KV, hd) with S >= pos0 + T, as the cache
    stores them (float32, f16 bits as uint16, or int8 times the scales ks, vs (S, KV) if
    `scaled`); query head h reads KV head h // (H / KV). window > 0 limits each token to its
    last `window` positions. scores (T*H, S) is scratch (unread where HEADS heads share a KV head:
    each group of them takes a small block of its own, which stays in cache: a prompt's T*H rows
    were 16 MB at 512 tokens); out (T, H, hd).
    """
    T, H = q.shape[0], q.shape[1]
    group = H // k.shape[1]
    if group % HEADS == 0:  # HEADS query heads of one KV head at a time: each key and value read once for them
        for tq in prange(T * H // HEADS):
            t, h = _balanced(tq // (H // HEADS), T), HEADS * (tq % (H // HEADS))
            last = pos0 + t
            first = max(0, last - window + 1) if window > 0 else 0
            rows = np.empty((HEADS, last + 1), np.float32)  # (not scores' rows: a block this size stays in L1/L2)
            attend_heads(q[t, h:h + HEADS], k, v, ks, vs, scaled, h // group, first, last, scale, rows,
                         out[t, h:h + HEADS])
        return
    for th in prange(T * H):
        t, h = _balanced(th // H, T), th % H
        last = pos0 + t
        first = max(0, last - window + 1) if window > 0 else 0
        attend(q[t, h], k, v, ks, vs, scaled, h // group, first, last, scale, scores[th], out[t, h])


@njit(fastmath=False, cache=True, nogil=True)
def store_f16(src, dst):
    """dst (R, n) uint16 = src (R, n) float32 as IEEE halves (the KV cache's f16 write): 512 tokens of
    numpy casts one value at a time, this kernel converts a vector at once."""
    for r in range(src.shape[0]):
        for j in range(src.shape[1]):
            dst[r, j] = half_bits(src[r, j])


@njit(fastmath=False, cache=True, nogil=True)
def softmax_top_k(logits, k, renormalise, weights, ids):
    """Per row of router logits (T, E): the k largest softmax probabilities, largest first (ties:
    the lower expert id first, as a stable sort), renormalised to sum to 1 if asked; into
    weights (T, k) float32 and ids (T, k) int64. One call instead of a handful of numpy ones
    per layer and token."""
    T, E = logits.shape
    p = np.empty(E, np.float32)
    for t in range(T):
        top = logits[t, 0]
        for e in range(1, E):
            top = max(top, logits[t, e])
        total = np.float32(0.0)
        for e in range(E):
            p[e] = np.float32(math.exp(logits[t, e] - top))
            total += p[e]
        for e in range(E):
            p[e] /= total
        chosen = np.float32(0.0)
        for j in range(k):
            best = -1
            for e in range(E):
                if p[e] >= 0 and (best < 0 or p[e] > p[best]):
                    best = e
            ids[t, j], weights[t, j] = best, p[best]
            chosen += p[best]
            p[best] = -1.0
        if renormalise:
            for j in range(k):
                weights[t, j] /= chosen


@njit(parallel=True, fastmath=True, cache=True, nogil=True)
def swiglu(gate, up, out):
    """out = silu(gate) * up, elementwise over (T, n)."""
    T, n = gate.shape
    for t in prange(T):
        for j in range(n):
            g = gate[t, j]
            out[t, j] = silu(g) * up[t, j]
