"""CPU kernels in Numba. Weights stay in their stored format and are dequantized a row at a time.

Layout: a weight matrix is uint8 (rows, row_bytes): row r holds output feature r's weights over
the input dimension, as consecutive blocks of its format (see engine.quant). Activations are
float32 (tokens, features), row-major. Format codes are GGML type ids.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

import engine.kernels  # noqa: F401  (numba settings first)

F32, F16, Q4_0, Q4_1, Q8_0, Q4_K, Q5_K, Q6_K, BF16 = 0, 1, 2, 3, 8, 12, 13, 14, 30
ROWS_PER_TASK = 16
_POW2 = np.array([2.0 ** (e - 25) for e in range(32)], dtype=np.float32)  # f16 exponent e -> scale


@njit(inline="always", cache=True)
def _h2f(lo, hi):
    """Two little-endian bytes of an IEEE half -> float32, exactly."""
    h = np.int32(lo) | (np.int32(hi) << 8)
    e = (h >> 10) & 31
    m = h & 1023
    if e == 0:
        v = np.float32(m) * np.float32(5.9604644775390625e-08)
    elif e == 31:
        v = np.float32(np.inf) if m == 0 else np.float32(np.nan)
    else:
        v = np.float32(m | 1024) * _POW2[e]
    return -v if h & 0x8000 else v


@njit(inline="always", cache=True)
def _i8(b):
    v = np.int32(b)
    return v - 256 if v > 127 else v


@njit(inline="always", cache=True)
def _k_scale_min(s, j):
    """Six-bit scale and minimum j (0..7) of a Q4_K/Q5_K super-block's 12 scale bytes at s."""
    if j < 4:
        return np.int32(s[j]) & 63, np.int32(s[j + 4]) & 63
    sc = (np.int32(s[j + 4]) & 15) | ((np.int32(s[j - 4]) >> 6) << 4)
    mn = (np.int32(s[j + 4]) >> 4) | ((np.int32(s[j]) >> 6) << 4)
    return sc, mn


@njit(cache=True, nogil=True)
def dequantize_row(row, code, out):
    """One stored row (uint8 bytes) -> float32 weights `out` (n,)."""
    n = out.shape[0]
    if code == F32:
        out[:] = row.view(np.float32)
    elif code == F16:
        for j in range(n):
            out[j] = _h2f(row[2 * j], row[2 * j + 1])
    elif code == BF16:
        bits = out.view(np.uint32)
        for j in range(n):
            bits[j] = (np.uint32(row[2 * j + 1]) << 24) | (np.uint32(row[2 * j]) << 16)
    elif code == Q8_0:  # f16 d | int8 q[32]
        for b in range(n // 32):
            o = 34 * b
            d = _h2f(row[o], row[o + 1])
            for j in range(32):
                out[32 * b + j] = d * np.float32(_i8(row[o + 2 + j]))
    elif code == Q4_0:  # f16 d | 16 bytes: low nibbles = weights 0-15, high = 16-31; w = d (q - 8)
        for b in range(n // 32):
            o = 18 * b
            d = _h2f(row[o], row[o + 1])
            for j in range(16):
                q = np.int32(row[o + 2 + j])
                out[32 * b + j] = d * np.float32((q & 15) - 8)
                out[32 * b + j + 16] = d * np.float32((q >> 4) - 8)
    elif code == Q4_1:  # f16 d | f16 m | nibbles as Q4_0; w = d q + m
        for b in range(n // 32):
            o = 20 * b
            d, m = _h2f(row[o], row[o + 1]), _h2f(row[o + 2], row[o + 3])
            for j in range(16):
                q = np.int32(row[o + 4 + j])
                out[32 * b + j] = d * np.float32(q & 15) + m
                out[32 * b + j + 16] = d * np.float32(q >> 4) + m
    elif code == Q4_K or code == Q5_K:  # d | dmin | scales[12] | (qh[32]) | qs[128]
        size = 144 if code == Q4_K else 176
        qs0 = 16 if code == Q4_K else 48
        for b in range(n // 256):
            o = size * b
            d, dmin = _h2f(row[o], row[o + 1]), _h2f(row[o + 2], row[o + 3])
            for j in range(8):
                sc, mn = _k_scale_min(row[o + 4:o + 16], j)
                ds, dm = d * np.float32(sc), dmin * np.float32(mn)
                chunk, shift = o + qs0 + 32 * (j // 2), 4 * (j % 2)
                for i in range(32):
                    q = (np.int32(row[chunk + i]) >> shift) & 15
                    if code == Q5_K:
                        q |= ((np.int32(row[o + 16 + i]) >> j) & 1) << 4
                    out[256 * b + 32 * j + i] = ds * np.float32(q) - dm
    elif code == Q6_K:  # ql[128] | qh[64] | int8 scales[16] | f16 d; weight e = 128 h + 32 s + i
        for b in range(n // 256):
            o = 210 * b
            d = _h2f(row[o + 208], row[o + 209])
            for h in range(2):
                for s in range(4):
                    for i in range(32):
                        e = 128 * h + 32 * s + i
                        lo = (np.int32(row[o + 64 * h + 32 * (s % 2) + i]) >> (4 * (s // 2))) & 15
                        hi = (np.int32(row[o + 128 + 32 * h + i]) >> (2 * s)) & 3
                        scale = d * np.float32(_i8(row[o + 192 + e // 16]))
                        out[256 * b + e] = scale * np.float32((lo | (hi << 4)) - 32)


@njit(parallel=True, fastmath=True, cache=True, nogil=True)
def matmul(w, code, x, out):
    """out (T, rows) = x (T, n) @ W.T; W (rows, row_bytes) stored; each row dequantized once."""
    rows, T, n = w.shape[0], x.shape[0], x.shape[1]
    for task in prange((rows + ROWS_PER_TASK - 1) // ROWS_PER_TASK):
        wrow = np.empty(n, np.float32)
        for r in range(task * ROWS_PER_TASK, min(rows, (task + 1) * ROWS_PER_TASK)):
            dequantize_row(w[r], code, wrow)
            for t in range(T):
                acc = np.float32(0.0)
                for j in range(n):
                    acc += wrow[j] * x[t, j]
                out[t, r] = acc


@njit(parallel=True, cache=True, nogil=True)
def gather_rows(w, code, ids, out):
    """out (T, n) = dequantized rows ids of W (the embedding lookup)."""
    for t in prange(ids.shape[0]):
        dequantize_row(w[ids[t]], code, out[t])


@njit(parallel=True, fastmath=True, cache=True, nogil=True)
def rmsnorm(x, weight, eps, out):
    """out (R, n) = x / sqrt(mean(x²) + eps) * weight, per row of x (R, n)."""
    R, n = x.shape
    for r in prange(R):
        ss = np.float32(0.0)
        for j in range(n):
            ss += x[r, j] * x[r, j]
        inv = np.float32(1.0) / np.float32(math.sqrt(ss / n + eps))
        for j in range(n):
            out[r, j] = weight[j] * (x[r, j] * inv)


@njit(parallel=True, fastmath=True, cache=True, nogil=True)
def rope(x, cos, sin):
    """In place on x (T, heads, hd): rotate pairs (i, i + hd/2) by angle t·f_i (cos/sin (T, hd/2))."""
    T, H, hd = x.shape
    half = hd // 2
    for th in prange(T * H):
        t, h = th // H, th % H
        for i in range(half):
            a, b = x[t, h, i], x[t, h, i + half]
            x[t, h, i] = a * cos[t, i] - b * sin[t, i]
            x[t, h, i + half] = b * cos[t, i] + a * sin[t, i]


@njit(parallel=True, fastmath=True, cache=True, nogil=True)
def attention(q, k, v, pos0, window, scale, scores, out):
    """Causal grouped-query attention of new tokens over the cache.

    q (T, H, hd) for positions pos0..pos0+T-1; k, v (S, KV, hd) with S >= pos0 + T; query head h
    reads KV head h // (H / KV). window > 0 limits each token to its last `window` positions.
    scores (T*H, S) is scratch; out (T, H, hd).
    """
    T, H, hd = q.shape
    group = H // k.shape[1]
    for th in prange(T * H):
        t, h = th // H, th % H
        kh = h // group
        last = pos0 + t
        first = max(0, last - window + 1) if window > 0 else 0
        top = np.float32(-np.inf)
        for s in range(first, last + 1):
            acc = np.float32(0.0)
            for d in range(hd):
                acc += q[t, h, d] * k[s, kh, d]
            acc *= scale
            scores[th, s] = acc
            top = max(top, acc)
        total = np.float32(0.0)
        for s in range(first, last + 1):
            e = np.float32(math.exp(scores[th, s] - top))
            scores[th, s] = e
            total += e
        for d in range(hd):
            out[t, h, d] = 0.0
        for s in range(first, last + 1):
            p = scores[th, s] / total
            for d in range(hd):
                out[t, h, d] += p * v[s, kh, d]


@njit(parallel=True, fastmath=True, cache=True, nogil=True)
def swiglu(gate, up, out):
    """out = silu(gate) * up, elementwise over (T, n)."""
    T, n = gate.shape
    for t in prange(T):
        for j in range(n):
            g = gate[t, j]
            out[t, j] = g / (np.float32(1.0) + np.float32(math.exp(-g))) * up[t, j]
