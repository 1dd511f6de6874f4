"""Causal attention over keys that carry their absolute positions: one kernel serves a full KV cache,
a sliding-window ring buffer (slots in any order), attention sinks (gpt_oss) and logit softcapping.

A key at position p is seen by a query at position q when p <= q and (window == 0 or q - p < window)
(transformers' sliding window: the query and the window-1 keys before it). Empty slots have
position -1. With sinks, each head's softmax runs over [scores..., sink] and the sink's share is
dropped, so a head may attend to "nothing" (gpt-oss). GQA: query head h reads KV head h // (H / KVH).
"""
from __future__ import annotations

import math

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic

import engine.kernels.ready  # noqa: F401  (engine.kernels.setup() first: fails otherwise)

NO_SCALE = np.ones((1, 1), np.float32)  # the scales argument of keys and values stored unscaled


@intrinsic
def _widen(typingctx, x):
    """A stored key or value element as float32: float32 as is, uint16 as the f16 whose bits it
    holds, int8 as its integer value (exact in every case)."""
    if x == types.float32:
        return types.float32(x), lambda context, builder, sig, args: args[0]
    if x == types.uint16:
        def half(context, builder, sig, args):
            return builder.fpext(builder.bitcast(args[0], ir.HalfType()), ir.FloatType())
        return types.float32(x), half
    if x == types.int8:
        return types.float32(x), lambda context, builder, sig, args: builder.sitofp(args[0], ir.FloatType())
    return None


def attention_ref(q: np.ndarray, k: np.ndarray, v: np.ndarray, qpos: np.ndarray, kpos: np.ndarray,
                  scale: float, window: int = 0, sinks: np.ndarray | None = None, softcap: float = 0.0
                  ) -> np.ndarray:
    """numpy twin of attention(): q (T, H, hd), k (S, KVH, hd), v (S, KVH, hdv), qpos (T,), kpos (S,)."""
    T, H, _ = q.shape
    group = H // k.shape[1]
    out = np.zeros((T, H, v.shape[2]), np.float32)
    for t in range(T):
        seen = (kpos >= 0) & (kpos <= qpos[t])
        if window > 0:
            seen &= qpos[t] - kpos < window
        idx = np.nonzero(seen)[0]
        for h in range(H):
            s = (k[idx, h // group].astype(np.float64) @ q[t, h].astype(np.float64)) * scale
            if softcap > 0:
                s = softcap * np.tanh(s / softcap)
            m = s.max() if len(s) else -np.inf
            if sinks is not None:
                m = max(m, float(sinks[h]))
            p = np.exp(s - m)
            total = p.sum() + (math.exp(float(sinks[h]) - m) if sinks is not None else 0.0)
            out[t, h] = (p / total) @ v[idx, h // group].astype(np.float64)
    return out


@njit(parallel=True, fastmath=True, cache=True, nogil=True)
def attention(q, k, v, ks, vs, scaled, qpos, kpos, scale, window, sinks, use_sinks, softcap, scores, out):
    # q (T, H, hd) f32; k (S, KVH, hd), v (S, KVH, hdv) as a cache stores them: float32, f16 bits as
    # uint16, or int8 times the scales ks, vs (S, KVH) f32 (read only if scaled), widened as they are
    # read (no float32 copy of the cache per token); qpos (T,), kpos (S,) int64 (-1: empty slot);
    # sinks (H,) f32 read only if use_sinks; scores (T, H, S) scratch; out (T, H, hdv) written.
    # One thread per (token, KV head): each key and value row is read once for the heads sharing it.
    T, H, hd = q.shape
    S, KVH, hdv = v.shape
    group = H // KVH
    for tg in prange(T * KVH):
        t, g = tg // KVH, tg % KVH
        h0 = g * group
        for s in range(S):
            p = kpos[s]
            hidden = p < 0 or p > qpos[t] or (window > 0 and qpos[t] - p >= window)
            for h in range(h0, h0 + group):
                if hidden:
                    scores[t, h, s] = np.float32(-np.inf)
                    continue
                acc = np.float32(0.0)
                if scaled:
                    sk = ks[s, g]
                    for i in range(hd):
                        acc += q[t, h, i] * (_widen(k[s, g, i]) * sk)
                else:
                    for i in range(hd):
                        acc += q[t, h, i] * _widen(k[s, g, i])
                acc *= scale
                if softcap > 0:
                    acc = softcap * np.tanh(acc / softcap)
                scores[t, h, s] = acc
        for h in range(h0, h0 + group):  # softmax of each head's row (plus its sink)
            m = sinks[h] if use_sinks else np.float32(-np.inf)
            for s in range(S):
                m = max(m, scores[t, h, s])
            total = np.exp(sinks[h] - m) if use_sinks else np.float32(0.0)
            for s in range(S):
                e = np.exp(scores[t, h, s] - m)  # exp(-inf) = 0 for the hidden
                scores[t, h, s] = e
                total += e
            inv = np.float32(1.0) / total
            for s in range(S):
                scores[t, h, s] *= inv
            for i in range(hdv):
                out[t, h, i] = 0.0
        for s in range(S):
            for h in range(h0, h0 + group):
                w = scores[t, h, s]
                if w != 0.0 and scaled:
                    sv = vs[s, g]
                    for i in range(hdv):
                        out[t, h, i] += w * (_widen(v[s, g, i]) * sv)
                elif w != 0.0:
                    for i in range(hdv):
                        out[t, h, i] += w * _widen(v[s, g, i])


def attend(q: np.ndarray, k: np.ndarray, v: np.ndarray, qpos: np.ndarray, kpos: np.ndarray, scale: float,
           window: int = 0, sinks: np.ndarray | None = None, softcap: float = 0.0) -> np.ndarray:
    """attention() with its shapes checked and its scratch and output allocated (tests, prototypes)."""
    T, H, hd = q.shape
    if k.ndim != 3 or k.shape[2] != hd or H % k.shape[1] or v.shape[:2] != k.shape[:2] \
            or len(qpos) != T or len(kpos) != k.shape[0]:
        raise ValueError(f"attention: q {q.shape}, k {k.shape}, v {v.shape}, qpos ({len(qpos)},), kpos "
                         f"({len(kpos)},) do not fit: need q (T, H, hd), k (S, KVH, hd) with KVH dividing H, "
                         "v (S, KVH, hdv), one position per query and per key")
    scores = np.empty((T, H, k.shape[0]), np.float32)
    out = np.empty((T, H, v.shape[2]), np.float32)
    s = np.zeros(H, np.float32) if sinks is None else np.ascontiguousarray(sinks, np.float32)
    attention(np.ascontiguousarray(q, np.float32), np.ascontiguousarray(k, np.float32),
              np.ascontiguousarray(v, np.float32), NO_SCALE, NO_SCALE, False, qpos.astype(np.int64), kpos.astype(np.int64),
              np.float32(scale), int(window), s, sinks is not None, np.float32(softcap), scores, out)
    return out
