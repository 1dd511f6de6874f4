"""x @ W.T on the CPU for weights in their stored format (no float copy): the formats in
INT_CODES are dotted straight from their blocks with int8 activations (a row, or an 8-row group
repacked at load, at a time; prefill TOKENS tokens per loaded block), the others are dequantized
four rows at a time into a small buffer and dotted in float. The per-format inner code is in
simd.py (q4_0/q4_1/q8_0), blocks32.py and kquants.py; the formats themselves in formats.py.

Layout: W uint8 (rows, row_bytes), as formats.py describes; activations float32 (tokens, features).
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

import engine.kernels.ready  # noqa: F401  (engine.kernels.setup() first: fails otherwise)
from engine.kernels import kquants, tiles
from engine.kernels.dispatch import group_dot as _group_dot  # (decode.py and batched.py import these from here)
from engine.kernels.dispatch import group_tokens as _group_tokens
from engine.kernels.dispatch import int_dot as _int_dot
from engine.kernels.dispatch import pair as _pair
from engine.kernels.dispatch import pair8 as _pair8
from engine.kernels.dispatch import pairable as _pairable
from engine.kernels.dispatch import tiled
from engine.kernels.dispatch import tokens_dot as _tokens_dot
from engine.kernels.formats import (PACKED, Q6_KX8, dequantize_row, dequantize_x8_row, is_int_code, per_256,
                                    quantize_row_for, quantized_for, quantized_pair, quantized_sets)
from engine.kernels.rows import silu
from engine.kernels.simd import PAIR_TOKENS, TOKENS, WIDE

ROWS_PER_TASK = 16
INT_MAX_T = TOKENS - 1  # up to this many tokens (decode), the fused kernels (matmul_int, swiglu_int) apply


@njit(inline="always", cache=True)
def _f32_dot4(buf, x):
    """Dots of the four float rows buf (4, n) with x (n,): x is loaded once for four rows."""
    a0 = a1 = a2 = a3 = np.float32(0.0)
    for j in range(x.shape[0]):
        xv = x[j]
        a0 += buf[0, j] * xv
        a1 += buf[1, j] * xv
        a2 += buf[2, j] * xv
        a3 += buf[3, j] * xv
    return a0, a1, a2, a3


@njit(parallel=True, fastmath=True, cache=True, nogil=True)
def matmul(w, code, x, out, exact=False):
    """out (T, rows) = x (T, n) @ W.T; W (rows, row_bytes) stored.

    Formats in INT_CODES (plain or repacked; engine/kernels/table.py lists which module dots each)
    unless `exact`: x is quantized to int8 blocks once and
    rows are dotted in integers straight from their blocks (llama.cpp's scheme: byte dot
    products, one float multiply per 32 weights) — for a few tokens a row (or an 8-row group)
    at a time, for more TOKENS tokens per loaded block. Otherwise (other formats, or `exact`)
    each group of 4 rows is dequantized once into a (4, n) float buffer and dotted with every
    token in float.
    """
    rows, T, n = w.shape[0], x.shape[0], x.shape[1]
    if not exact and T >= tiles.TILE_MIN_T and code > PACKED and tiled(code - PACKED):
        tiles.matmul_tiles(w, code - PACKED, x, out)  # each 16 (or 8) rows unpacked once for all T tokens
        return
    if not exact and is_int_code(code):
        if T < TOKENS:
            xq, xd, xs, xi = quantized_for(x, code)
        else:  # prefill: the tokens quantized in parallel (each token alone: the same bits)
            xq, xd = np.empty((T, n), np.int8), np.empty((T, n // 32), np.float32)
            xs, xi = np.empty((T, n // 32), np.float32), np.empty((T, n // 32), np.int32)
            for t in prange(T):
                quantize_row_for(code, x[t], xq[t], xd[t], xs[t], xi[t])
        if code > PACKED and T < TOKENS:
            for g in prange(rows // 8):
                for t in range(T):
                    a = _group_dot(w, g, code, xq[t], xd[t], xs[t], xi[t])
                    for i in range(8):
                        out[t, 8 * g + i] = a[i]
            return
        if code > PACKED:  # each block unpacked once for TOKENS tokens, all 8 rows of a group at once
            if code == Q6_KX8:
                kquants.first_sums(xq, xs)  # (Q6_K reads no scaled sums: its per-16 sums instead)
            if WIDE and rows % 16 == 0 and _pairable(code, T):  # two groups side by side (512-bit vectors)
                for p in prange(rows // 16):
                    t = 0
                    while t + PAIR_TOKENS <= T:
                        a8 = _pair8(w, 2 * p, code, xq, xd, xs, xi, t)
                        for k in range(PAIR_TOKENS):
                            for i in range(16):
                                out[t + k, 16 * p + i] = a8[16 * k + i]
                        t += PAIR_TOKENS
                    while t < T:
                        t0 = min(t, T - TOKENS)
                        a = _pair(w, 2 * p, code, xq, xd, xs, xi, t0)
                        for k in range(TOKENS):
                            for i in range(16):
                                out[t0 + k, 16 * p + i] = a[16 * k + i]
                        t = t0 + TOKENS
                return
            for g in prange(rows // 8):
                t = 0
                while t < T:
                    t0 = min(t, T - TOKENS)  # a short tail re-does some tokens: same values
                    a = _group_tokens(w, g, code, xq, xd, xs, xi, t0)
                    for k in range(TOKENS):
                        for i in range(8):
                            out[t0 + k, 8 * g + i] = a[8 * k + i]
                    t = t0 + TOKENS
            return
        for task in prange((rows + ROWS_PER_TASK - 1) // ROWS_PER_TASK):
            for r in range(task * ROWS_PER_TASK, min(rows, (task + 1) * ROWS_PER_TASK)):
                t = 0
                while t < T:
                    if T - t >= TOKENS:
                        t0 = min(t, T - TOKENS)  # a short tail re-does some tokens: same values
                        a4 = _tokens_dot(w, r, code, xq, xd, xs, xi, t0)
                        for k in range(TOKENS):
                            out[t0 + k, r] = a4[k]
                        t = t0 + TOKENS
                    else:
                        out[t, r] = _int_dot(w, r, code, xq[t], xd[t], xs[t], xi[t])
                        t += 1
        return
    for task in prange((rows + ROWS_PER_TASK - 1) // ROWS_PER_TASK):
        buf = np.zeros((4, n), np.float32)
        for r0 in range(task * ROWS_PER_TASK, min(rows, (task + 1) * ROWS_PER_TASK), 4):
            k = min(4, rows - r0)
            for i in range(k):
                if code > PACKED:
                    dequantize_x8_row(w, r0 + i, code, buf[i])
                else:
                    dequantize_row(w[r0 + i], code, buf[i])
            for t in range(T):
                a = _f32_dot4(buf, x[t])
                for i in range(k):
                    out[t, r0 + i] = a[i]


@njit(parallel=True, fastmath=True, cache=True, nogil=True)
def matmul_int(ws, codes, x, outs):
    """outs[i] (T, rows_i) = x (T, n) @ W_i.T for several matrices in INT_CODES formats (plain or
    repacked) that read the same x (attention's q, k and v): x is quantized once, and one
    parallel loop covers every matrix's rows. T <= INT_MAX_T."""
    T, n = x.shape
    some, every = False, True
    for code in codes:
        some, every = some or per_256(code), every and per_256(code)
    ks, bs = quantized_sets(x, some, not every)
    first = np.zeros(len(ws) + 1, np.int64)  # first task of each matrix
    for i in range(len(ws)):
        first[i + 1] = first[i] + (ws[i].shape[0] + ROWS_PER_TASK - 1) // ROWS_PER_TASK
    for task in prange(first[-1]):
        i = 0
        while task >= first[i + 1]:
            i += 1
        w, code, out = ws[i], codes[i], outs[i]
        xq, xd, xs, xi = ks if per_256(code) else bs
        r0 = (task - first[i]) * ROWS_PER_TASK
        if code > PACKED:  # 8-row groups (ROWS_PER_TASK is a multiple of 8, and so are the rows)
            for g in range(r0 // 8, min(w.shape[0], r0 + ROWS_PER_TASK) // 8):
                for t in range(T):
                    a = _group_dot(w, g, code, xq[t], xd[t], xs[t], xi[t])
                    for j in range(8):
                        out[t, 8 * g + j] = a[j]
            continue
        for r in range(r0, min(w.shape[0], r0 + ROWS_PER_TASK)):
            for t in range(T):
                out[t, r] = _int_dot(w, r, code, xq[t], xd[t], xs[t], xi[t])


@njit(parallel=True, fastmath=True, cache=True, nogil=True)
def swiglu_int(wg, cg, wu, cu, x, out):
    """out (T, rows) = silu(x @ Wg.T) * (x @ Wu.T) for gate and up matrices in INT_CODES formats: the
    SwiGLU feed-forward's first half in one pass, x quantized once. T <= INT_MAX_T."""
    T, n = x.shape
    (gq, gd, gs, gi), (uq, ud, us, ui) = quantized_pair(x, cg, cu)
    rows = wg.shape[0]
    if cg > PACKED and cu > PACKED:
        for grp in prange(rows // 8):
            for t in range(T):
                g8 = _group_dot(wg, grp, cg, gq[t], gd[t], gs[t], gi[t])
                u8 = _group_dot(wu, grp, cu, uq[t], ud[t], us[t], ui[t])
                for i in range(8):
                    g = g8[i]
                    out[t, 8 * grp + i] = silu(g) * u8[i]
        return
    for task in prange((rows + ROWS_PER_TASK - 1) // ROWS_PER_TASK):
        for r in range(task * ROWS_PER_TASK, min(rows, (task + 1) * ROWS_PER_TASK)):
            for t in range(T):
                g = _int_dot(wg, r, cg, gq[t], gd[t], gs[t], gi[t])
                u = _int_dot(wu, r, cu, uq[t], ud[t], us[t], ui[t])
                out[t, r] = silu(g) * u


@njit(parallel=True, fastmath=True, cache=True, nogil=True)
def moe_int(gates, ups, downs, cg, cu, cd, mix, x, act, out):
    """out (1, n) = Σ_e mix[e] · down_e(silu(gate_e x) · up_e x) over one token's k experts
    (decode), in two parallel loops: every expert's gate and up rows, then the down rows, each
    output row summing its experts. gates, ups, downs: tuples of k matrices in the formats cg,
    cu, cd (INT_CODES, plain or repacked; gate and up both repacked or neither); x (1, n);
    act (k, ff) scratch. One call per MoE layer instead of two per expert."""
    n, k, ff = x.shape[1], len(gates), gates[0].shape[0]
    (gq, gd, gs, gi), (uq, ud, us, ui) = quantized_pair(x, cg, cu)
    span = 8 if cg > PACKED else ROWS_PER_TASK
    tasks = (ff + span - 1) // span
    for task in prange(k * tasks):
        e, r0 = task // tasks, (task % tasks) * span
        if cg > PACKED:
            g8 = _group_dot(gates[e], r0 // 8, cg, gq[0], gd[0], gs[0], gi[0])
            u8 = _group_dot(ups[e], r0 // 8, cu, uq[0], ud[0], us[0], ui[0])
            for i in range(8):
                act[e, r0 + i] = silu(g8[i]) * u8[i]
        else:
            for r in range(r0, min(ff, r0 + span)):
                g = _int_dot(gates[e], r, cg, gq[0], gd[0], gs[0], gi[0])
                u = _int_dot(ups[e], r, cu, uq[0], ud[0], us[0], ui[0])
                act[e, r] = silu(g) * u
    aq, ad, as_, ai = quantized_for(act, cd)
    span = 8 if cd > PACKED else ROWS_PER_TASK
    for task in prange((n + span - 1) // span):
        r0 = task * span
        if cd > PACKED:
            acc = np.zeros(8, np.float32)
            for e in range(k):
                d8 = _group_dot(downs[e], r0 // 8, cd, aq[e], ad[e], as_[e], ai[e])
                for i in range(8):
                    acc[i] += mix[e] * d8[i]
            for i in range(8):
                out[0, r0 + i] = acc[i]
        else:
            for r in range(r0, min(n, r0 + span)):
                total = np.float32(0.0)
                for e in range(k):
                    total += mix[e] * _int_dot(downs[e], r, cd, aq[e], ad[e], as_[e], ai[e])
                out[0, r] = total
