"""One-row building blocks shared by cpu.py's kernels and the fused decode kernel (decode.py):
the same compiled code in both, so a decoded token comes out bit for bit the same either way.

They are separate functions, not inlined: numba compiles each once. Each states its fastmath
(that of the parallel kernels calling it): without it numba lends a callee the flags of whichever
caller compiled it first, and its cache keeps that variant for every process. Their sums go through float_rows.dot, whose order is fixed, rather than a loop LLVM
may vectorise differently in each caller.

Layout: rows are float32 (n,) arrays; the KV cache (S, kv_heads, hd) as KVCache stores it,
each element widened as it is read (float_rows.dot_rows, float_rows.add_weighted_rows).
"""
from __future__ import annotations

import math

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

import engine.kernels.ready  # noqa: F401  (engine.kernels.setup() first: fails otherwise)
from engine.kernels.float_rows import (HEADS, add_weighted_rows, add_weighted_rows_heads, dot, dot_rows, dot_rows_heads,
                                       sum_in_order, sums_in_order_heads)
from engine.kernels.simd import _ieee_divide


@intrinsic
def _times_power_of_two(typingctx, p, n):
    """p · 2^n for a float32 p near 1 and an integral float32 n in [-126, 127]: n is added to
    p's exponent bits (one integer add, vectorisable, where ldexp is a libm call)."""
    def codegen(context, builder, sig, args):
        i32 = ir.IntType(32)
        bits = builder.bitcast(args[0], i32)
        shift = builder.shl(builder.fptosi(args[1], i32), ir.Constant(i32, 23))
        return builder.bitcast(builder.add(bits, shift), ir.FloatType())
    return types.float32(types.float32, types.float32), codegen


@intrinsic
def divide(typingctx, a, b):
    """a / b as one IEEE division. Numba's own `/` tests b for zero first (to raise
    ZeroDivisionError), a branch that keeps LLVM from vectorising the loop around it: SwiGLU's
    sigmoid over a row ran an order of magnitude slower (scalar vdivss) and attention's softmax
    normalisation likewise. `nsz` keeps a fastmath caller from making it a multiply by the
    reciprocal (simd._ieee_divide), so every kernel rounds it alike."""
    if a != b or a not in (types.float32, types.float64):
        return None
    return a(a, b), lambda context, builder, sig, args: _ieee_divide(builder, *args)


@njit(inline="always", cache=True)
def exp32(x):
    """e^x in float32 to about 4e-7 relative (3 ulp), clamped to [e^-87.3, e^88.3]: x = n ln 2 + r
    with |r| <= ln 2 / 2, e^r by its degree-6 Taylor polynomial, times 2^n. Without a vector math
    library numba calls libm's expf once per value; this vectorises, which
    matters for softmax over a long context and SwiGLU's sigmoid over every row."""
    x = min(max(x, np.float32(-87.3)), np.float32(88.3))
    n = np.float32(np.rint(x * np.float32(1.4426950408889634)))
    r = x - n * np.float32(0.693145751953125)  # ln 2 in two parts: r stays exact
    r = r - n * np.float32(1.428606765330187e-06)
    p = np.float32(1.0) + r * (np.float32(1.0) + r * (np.float32(0.5) + r * (
        np.float32(1.0 / 6) + r * (np.float32(1.0 / 24) + r * (np.float32(1.0 / 120) + r * np.float32(1.0 / 720))))))
    return _times_power_of_two(p, n)


@njit(inline="always", cache=True)
def silu(g):
    """g · sigmoid(g), SwiGLU's gate."""
    return divide(g, np.float32(1.0) + exp32(-g))


@njit(fastmath=False, cache=True, nogil=True)
def rmsnorm_row(x, weight, eps, out):
    """One row (n,) of rmsnorm. (Fastmath off: a kernel compiled in this process and the same kernel
    loaded from numba's cache gave the final norm 1 ulp apart, which the int8 activations of the
    output layer turned into logits 0.1 apart; IEEE arithmetic is the same in every module.)"""
    n = x.shape[0]
    ss = dot(x, x)
    inv = np.float32(1.0) / np.float32(math.sqrt(ss / n + eps))
    for j in range(n):
        out[j] = weight[j] * (x[j] * inv)


@njit(fastmath=True, cache=True, nogil=True)
def rope_head(x, cos, sin):
    """One head (hd,) of rope, in place (also engine.kernels.decode's)."""
    half = x.shape[0] // 2
    for i in range(half):
        a, b = x[i], x[i + half]
        x[i] = a * cos[i] - b * sin[i]
        x[i + half] = b * cos[i] + a * sin[i]


@njit(inline="always", cache=True)
def _exp_in_place(row, ks, scaled, kh, first, last, scale):
    """_softmax_in_place's first half: row[first..last] scaled, then exp(x - max). The loops run over
    zero-based views: an index numba cannot prove non-negative gets a wraparound select per access,
    which kept LLVM from vectorising them (prefill attention ran at half speed with `first` a variable)."""
    r = row[first:last + 1]
    n = r.shape[0]
    if scaled:
        kc = ks[first:last + 1, kh]
        for s in range(n):
            r[s] = r[s] * (scale * kc[s])
    else:
        for s in range(n):
            r[s] = r[s] * scale
    m0 = m1 = m2 = m3 = np.float32(-np.inf)
    for b in range(n // 4):
        m0, m1, m2, m3 = max(m0, r[4 * b]), max(m1, r[4 * b + 1]), max(m2, r[4 * b + 2]), max(m3, r[4 * b + 3])
    top = max(max(m0, m1), max(m2, m3))
    for t in range(n - n % 4, n):
        top = max(top, r[t])
    for s in range(n):
        r[s] = exp32(r[s] - top)


@njit(inline="always", cache=True)
def _normalise(row, vs, scaled, kh, first, last, total):
    """_softmax_in_place's second half: row[first..last] / total (times each value's scale)."""
    r = row[first:last + 1]
    if scaled:
        vc = vs[first:last + 1, kh]
        for s in range(r.shape[0]):
            r[s] = divide(r[s], total) * vc[s]
    else:
        for s in range(r.shape[0]):
            r[s] = divide(r[s], total)


@njit(inline="always", cache=True)
def _softmax_in_place(row, ks, vs, scaled, kh, first, last, scale):
    """row[first..last] (scores q·k) -> attention weights: scaled by `scale` (and each key's
    scale), exp(x - max) / Σ, times each value's scale. The max is taken in 4 interleaved
    chains (a max is exact in any order), the exponentials in a loop of their own (exp32
    vectorises) and the sum in position order (float_rows.sum_in_order: the same total in every
    kernel, fastmath or not); one loop per case, no branch inside, so LLVM vectorises all but the sum."""
    _exp_in_place(row, ks, scaled, kh, first, last, scale)
    _normalise(row, vs, scaled, kh, first, last, sum_in_order(row, first, last))


@njit(fastmath=True, cache=True, nogil=True)
def attend(q, k, v, ks, vs, scaled, kh, first, last, scale, scores, out):
    """One query head q (hd,) over KV head kh at positions first..last -> out (hd,); scores (S,)
    scratch (also engine.kernels.decode's)."""
    dot_rows(q, k, kh, first, last, scores)
    _softmax_in_place(scores, ks, vs, scaled, kh, first, last, scale)
    out[:] = 0.0
    add_weighted_rows(out, scores, v, kh, first, last)


@njit(fastmath=True, cache=True, nogil=True)
def attend_heads(q, k, v, ks, vs, scaled, kh, first, last, scale, scores, out):
    """attend for HEADS query heads q (HEADS, hd) that read KV head kh -> out (HEADS, hd); scores
    (HEADS, S) scratch. Each key and value row is widened once for the HEADS heads; every head's
    figures are attend's, step for step (its dots, the same softmax, its weighted sums)."""
    dot_rows_heads(q, k, kh, first, last, scores)
    for h in range(HEADS):
        _exp_in_place(scores[h], ks, scaled, kh, first, last, scale)
    totals = np.empty(HEADS, np.float32)
    sums_in_order_heads(scores, first, last, totals)  # (the heads' sums side by side, each in order)
    for h in range(HEADS):
        _normalise(scores[h], vs, scaled, kh, first, last, totals[h])
        out[h, :] = 0.0
    add_weighted_rows_heads(out, scores, v, kh, first, last)
