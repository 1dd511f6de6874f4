"""CPU kernels in Numba. Weights stay in their stored format (no float copy): the formats in
INT_CODES are dotted straight from their blocks with int8 activations (a row, or an 8-row group
repacked at load, at a time; prefill TOKENS tokens per loaded block), the others are dequantized
four rows at a time into a small buffer and dotted in float. engine/kernels/table.py lists which
module holds each format's code, its numpy twin and its tolerance.

Layout: a weight matrix is uint8 (rows, row_bytes): row r holds output feature r's weights over
the input dimension, as consecutive blocks of its format (see engine.quant). Activations are
float32 (tokens, features), row-major. Format codes are GGML type ids.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

import engine.kernels  # noqa: F401  (numba settings first)
from engine import quant
from engine.kernels import blocks32, kquants
from engine.kernels.rows import attend, rmsnorm_row, rope_head, silu
from engine.kernels.simd import (TOKENS, group_dot_q4_0x8, group_dot_q4_1x8, group_dot_q8_0x8,
                                 group_tokens_q4_0x8, group_tokens_q4_1x8, group_tokens_q8_0x8, quantize32,
                                 row_dot_q4_0, row_dot_q4_1, row_dot_q8_0, tokens_q4_0, tokens_q4_1, tokens_q8_0)

F32, F16, Q4_0, Q4_1, Q8_0, Q4_K, Q5_K, Q6_K, BF16 = 0, 1, 2, 3, 8, 12, 13, 14, 30
Q5_0, Q5_1, Q2_K, Q3_K, IQ4_NL, IQ4_XS, MXFP4 = 6, 7, 10, 11, 20, 23, 39
ROWS_PER_TASK = 16
PACKED = 1000  # + a GGML id: that format repacked in groups of 8 rows at load (repack_x8); never in a file
Q4_0X8, Q4_1X8, Q8_0X8 = PACKED + Q4_0, PACKED + Q4_1, PACKED + Q8_0
Q4_KX8, Q5_KX8, Q6_KX8 = PACKED + Q4_K, PACKED + Q5_K, PACKED + Q6_K
PACKABLE = (Q4_0, Q4_1, Q8_0, Q4_K, Q5_K, Q6_K, Q5_0, Q5_1, IQ4_NL, MXFP4, IQ4_XS)
INT_CODES = PACKABLE + (Q2_K, Q3_K) + tuple(PACKED + c for c in PACKABLE)  # dotted in integers (int8 activations)
INT_MAX_T = TOKENS - 1  # up to this many tokens (decode), the fused kernels (matmul_int, swiglu_int) apply
_F16 = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)  # bits -> value
_E8M0 = quant.e8m0_half(np.arange(256))  # MXFP4 exponent byte -> its scale
_IQ4, _MXFP4 = quant.IQ4_GRID.astype(np.float32), quant.MXFP4_GRID.astype(np.float32)  # nibble -> value


@njit(inline="always", cache=True)
def _h2f(lo, hi):
    """Two little-endian bytes of an IEEE half -> float32, exactly (a 64K-entry table)."""
    return _F16[np.int32(lo) | (np.int32(hi) << 8)]


@njit(inline="always", cache=True)
def _i8(b):
    v = np.int32(b)
    return v - 256 if v > 127 else v


@njit(inline="always", cache=True)
def is_int_code(code):
    """Whether `code` (a GGML id, or PACKED + one) has an integer dot product (INT_CODES)."""
    c = code - PACKED if code > PACKED else code
    return c == Q4_0 or c == Q4_1 or c == Q8_0 or _is_k(c) or c == Q2_K or c == Q3_K or blocks32.fused(c)


@njit(inline="always", cache=True)
def _is_k(code):
    """A K-quant, stored or repacked (engine.kernels.kquants)."""
    c = code - PACKED if code > PACKED else code
    return c == Q4_K or c == Q5_K or c == Q6_K


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
    elif code == Q5_0 or code == Q5_1:  # f16 d | (f16 m) | u32 qh | nibbles as Q4_0; bit j of qh: bit 4 of weight j
        size = 22 if code == Q5_0 else 24
        for b in range(n // 32):
            o = size * b
            d = _h2f(row[o], row[o + 1])
            m = _h2f(row[o + 2], row[o + 3]) if code == Q5_1 else np.float32(0.0)
            qs = o + size - 16
            qh = np.int64(row[qs - 4]) | (np.int64(row[qs - 3]) << 8) | (np.int64(row[qs - 2]) << 16) | \
                (np.int64(row[qs - 1]) << 24)
            for j in range(16):
                q = np.int64(row[qs + j])
                lo, hi = (q & 15) | (((qh >> j) & 1) << 4), (q >> 4) | (((qh >> (j + 16)) & 1) << 4)
                if code == Q5_0:
                    out[32 * b + j], out[32 * b + j + 16] = d * np.float32(lo - 16), d * np.float32(hi - 16)
                else:
                    out[32 * b + j], out[32 * b + j + 16] = d * np.float32(lo) + m, d * np.float32(hi) + m
    elif code == IQ4_NL or code == MXFP4:  # f16 d (MXFP4: e8m0 e) | nibbles as Q4_0, through a 16-value grid
        size, qs = (18, 2) if code == IQ4_NL else (17, 1)
        grid = _IQ4 if code == IQ4_NL else _MXFP4
        for b in range(n // 32):
            o = size * b
            d = _h2f(row[o], row[o + 1]) if code == IQ4_NL else _E8M0[row[o]]
            for j in range(16):
                q = np.int32(row[o + qs + j])
                out[32 * b + j], out[32 * b + j + 16] = d * grid[q & 15], d * grid[q >> 4]
    elif code == Q2_K:  # scales[16] (scale | min << 4) | qs[64] | f16 d | f16 dmin; weight e = 128 c + 32 s + i
        for b in range(n // 256):
            o = 84 * b
            d, dmin = _h2f(row[o + 80], row[o + 81]), _h2f(row[o + 82], row[o + 83])
            for e in range(256):
                c, s, i = e // 128, (e % 128) // 32, e % 32
                q = (np.int32(row[o + 16 + 32 * c + i]) >> (2 * s)) & 3
                sc = np.int32(row[o + e // 16])
                out[256 * b + e] = d * np.float32(sc & 15) * np.float32(q) - dmin * np.float32(sc >> 4)
    elif code == Q3_K:  # hmask[32] | qs[64] | scales[12] | f16 d; weight e = 128 c + 32 s + i
        for b in range(n // 256):
            o = 110 * b
            d = _h2f(row[o + 108], row[o + 109])
            for e in range(256):
                k, c, s, i = e // 16, e // 128, (e % 128) // 32, e % 32
                lo = (np.int32(row[o + 96 + k % 8]) >> (4 * (k // 8))) & 15
                hi = (np.int32(row[o + 104 + k % 4]) >> (2 * (k // 4))) & 3
                q = (np.int32(row[o + 32 + 32 * c + i]) >> (2 * s)) & 3
                h = (np.int32(row[o + i]) >> (e // 32)) & 1
                out[256 * b + e] = d * np.float32((lo | (hi << 4)) - 32) * np.float32(q - 4 * (1 - h))
    elif code == IQ4_XS:  # f16 d | u16 scales_h | scales_l[4] | qs[128]: 8 sub-blocks of 32 as IQ4_NL's
        for b in range(n // 256):
            o = 136 * b
            d = _h2f(row[o], row[o + 1])
            sh = np.int32(row[o + 2]) | (np.int32(row[o + 3]) << 8)
            for j in range(8):
                sc = ((np.int32(row[o + 4 + j // 2]) >> (4 * (j % 2))) & 15) | (((sh >> (2 * j)) & 3) << 4)
                dl = d * np.float32(sc - 32)
                for i in range(16):
                    q = np.int32(row[o + 8 + 16 * j + i])
                    out[256 * b + 32 * j + i], out[256 * b + 32 * j + i + 16] = dl * _IQ4[q & 15], dl * _IQ4[q >> 4]
    else:
        raise ValueError("dequantize_row: a format code engine.quant does not declare")


@njit(cache=True, nogil=True)  # no fastmath: the rounding must be exactly the numpy twin's
def quantize_activations(x, xq, xd, xs, xi):
    """Each 32-block of x (T, n) -> int8 xq (T, n) with scale xd (T, n/32), as llama.cpp's Q8_1:
    d = max|x| / 127 stored as a half, q = round-half-even(x · 127 / max|x|); xi = Σ q (int32)
    and xs = d · Σ q as a half (the Q4_1 minimum's term)."""
    T, n = x.shape
    for t in range(T):
        for b in range(n // 32):
            quantize_block(x[t], xq[t], xd[t], xs[t], xi[t], b)


@njit(cache=True, nogil=True)
def quantize_block(x, xq, xd, xs, xi, b):
    """Block b (values 32b..32b+31) of one token's x (n,) into xq, xd[b], xs[b], xi[b]
    (quantize_activations; engine.kernels.decode quantizes blocks as soon as they are done)."""
    quantize32(x, xq, xd, xs, xi, b)


@njit(cache=True, nogil=True)
def quantized(x):
    """x (T, n) as quantize_activations leaves it: (int8 blocks, scales, scaled sums, sums)."""
    T, n = x.shape
    xq, xd = np.empty((T, n), np.int8), np.empty((T, n // 32), np.float32)
    xs, xi = np.empty((T, n // 32), np.float32), np.empty((T, n // 32), np.int32)
    quantize_activations(x, xq, xd, xs, xi)
    return xq, xd, xs, xi


@njit(inline="always", cache=True)
def _group_block(code):
    """(block bytes, halves at its head) of a repackable format."""
    if code == Q4_0:
        return 18, 1
    return (20, 2) if code == Q4_1 else (34, 1)


@njit(cache=True, nogil=True)
def repack_x8(w, code):
    """In place, a PACKABLE matrix (rows, row_bytes), rows a multiple of 8 -> groups of 8
    rows stored block by block: the 8 rows' head halves (d; d then m for q4_1: 16 bytes each),
    then their quants in chunks of 32 bytes (4 for q4, 8 for q8_0), chunk c holding bytes
    4c..4c+3 of row 0, then of row 1, ... (the same size in all). Layout of simd's group dot
    products: one 4-byte vector lane per row (q4_0/q4_1/q8_0 here). K-quants: kquants.repack_k8;
    q5_0/q5_1/iq4_nl/mxfp4/iq4_xs: blocks32.repack32 (their own regions)."""
    if _is_k(code):
        kquants.repack_k8(w, code)
        return
    if blocks32.fused(code):
        blocks32.repack32(w, code)
        return
    size, halves = _group_block(code)
    regions = np.zeros((4, 3), np.int64)  # (offset, bytes, unit): the halves, the quants; no more
    regions[:, 2] = 1
    regions[0, 1], regions[0, 2] = 2 * halves, 2
    regions[1, 0], regions[1, 1], regions[1, 2] = 2 * halves, size - 2 * halves, 4
    kquants.repack8(w, size, regions)


@njit(cache=True, nogil=True)
def dequantize_x8_row(w, r, code, out):
    """Row r of a matrix repacked by repack_x8 (code: the packed id) -> float32 weights (n,)."""
    base_code = code - PACKED
    if _is_k(base_code):
        row = np.empty(w.shape[1], np.uint8)
        kquants.unpack_k8_row(w, r, base_code, row)
        dequantize_row(row, base_code, out)
        return
    if blocks32.fused(base_code):
        row = np.empty(w.shape[1], np.uint8)
        blocks32.unpack32_row(w, r, base_code, row)
        dequantize_row(row, base_code, out)
        return
    size, halves = _group_block(base_code)
    qbytes = size - 2 * halves
    gsize = 16 * halves + 8 * qbytes
    flat = w.reshape(-1)
    i = r % 8
    base = (r - i) * w.shape[1]
    for b in range(out.shape[0] // 32):
        o = base + gsize * b
        d = _h2f(flat[o + 2 * i], flat[o + 2 * i + 1])
        q0 = o + 16 * halves + 4 * i
        if base_code == Q8_0:
            for j in range(32):
                out[32 * b + j] = d * np.float32(_i8(flat[q0 + 32 * (j // 4) + j % 4]))
            continue
        m = _h2f(flat[o + 16 + 2 * i], flat[o + 17 + 2 * i]) if base_code == Q4_1 else -8 * d
        for j in range(16):
            q = np.int32(flat[q0 + 32 * (j // 4) + j % 4])
            out[32 * b + j] = d * np.float32(q & 15) + m
            out[32 * b + j + 16] = d * np.float32(q >> 4) + m


@njit(inline="always", cache=True)
def _tokens_dot(w, r, code, xq, xd, xs, xi, t0):
    """Row r · tokens t0..t0+TOKENS-1 of the quantized activations (prefill, rows as stored;
    simd.py; K-quants a token at a time)."""
    if blocks32.fused(code):
        return blocks32.tokens_dot(w, r, code, xq, xd, xs, xi, t0)
    if _is_k(code) or code == Q2_K or code == Q3_K:
        return (kquants.row_dot(w, r, code, xq[t0], xd[t0], xs[t0], xi[t0]),
                kquants.row_dot(w, r, code, xq[t0 + 1], xd[t0 + 1], xs[t0 + 1], xi[t0 + 1]),
                kquants.row_dot(w, r, code, xq[t0 + 2], xd[t0 + 2], xs[t0 + 2], xi[t0 + 2]),
                kquants.row_dot(w, r, code, xq[t0 + 3], xd[t0 + 3], xs[t0 + 3], xi[t0 + 3]))
    if code == Q4_1:
        return tokens_q4_1(w, r, xq, xd, xs, xi, t0)
    if code == Q4_0:
        return tokens_q4_0(w, r, xq, xd, xs, xi, t0)
    return tokens_q8_0(w, r, xq, xd, xs, xi, t0)


@njit(inline="always", cache=True)
def _group_tokens(w, g, code, xq, xd, xs, xi, t0):
    """Rows 8g..8g+7 of a repacked matrix · tokens t0..t0+TOKENS-1 (prefill; simd.py): 8 rows
    of token t0, then of t0+1, ..."""
    if _is_k(code):
        return kquants.group_tokens(w, g, code - PACKED, xq, xd, xs, xi, t0)
    if blocks32.fused(code - PACKED):
        return blocks32.group_tokens(w, g, code - PACKED, xq, xd, xs, xi, t0)
    if code == Q4_1X8:
        return group_tokens_q4_1x8(w, g, xq, xd, xs, xi, t0)
    if code == Q8_0X8:
        return group_tokens_q8_0x8(w, g, xq, xd, xs, xi, t0)
    return group_tokens_q4_0x8(w, g, xq, xd, xs, xi, t0)


@njit(inline="always", cache=True)
def _group_dot(w, g, code, xq, xd, xs, xi):
    """Rows 8g..8g+7 of a repacked matrix · one token's int8 activations (simd.py, kquants.py,
    blocks32.py)."""
    if _is_k(code):
        return kquants.group_dot(w, g, code - PACKED, xq, xd, xs, xi)
    if blocks32.fused(code - PACKED):
        return blocks32.group_dot(w, g, code - PACKED, xq, xd, xs, xi)
    if code == Q4_1X8:
        return group_dot_q4_1x8(w, g, xq, xd, xs, xi)
    if code == Q8_0X8:
        return group_dot_q8_0x8(w, g, xq, xd, xs, xi)
    return group_dot_q4_0x8(w, g, xq, xd, xs, xi)


@njit(inline="always", cache=True)
def _int_dot(w, r, code, xq, xd, xs, xi):
    """Row r of a stored matrix in an INT_CODES format · int8 activations xq (n,), block by block:
    d_w·d_x·Σ q_w q_x, plus m_w·s_x (q4_1) or minus 8·d_w·d_x·Σ q_x (q4_0) (simd.py; Q5_x, IQ4_NL, MXFP4:
    blocks32.py; K-quants: kquants.py)."""
    if blocks32.fused(code):
        return blocks32.row_dot(w, r, code, xq, xd, xs, xi)
    if _is_k(code) or code == Q2_K or code == Q3_K:  # (Q2_K, Q3_K: stored rows only)
        return kquants.row_dot(w, r, code, xq, xd, xs, xi)
    if code == Q4_1:
        return row_dot_q4_1(w, r, xq, xd, xs, xi)
    if code == Q4_0:
        return row_dot_q4_0(w, r, xq, xd, xs, xi)
    return row_dot_q8_0(w, r, xq, xd, xs, xi)


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
    if not exact and (is_int_code(code) or blocks32.fused(code)):
        xq, xd, xs, xi = quantized(x)
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
    xq, xd, xs, xi = quantized(x)
    first = np.zeros(len(ws) + 1, np.int64)  # first task of each matrix
    for i in range(len(ws)):
        first[i + 1] = first[i] + (ws[i].shape[0] + ROWS_PER_TASK - 1) // ROWS_PER_TASK
    for task in prange(first[-1]):
        i = 0
        while task >= first[i + 1]:
            i += 1
        w, code, out = ws[i], codes[i], outs[i]
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
    xq, xd, xs, xi = quantized(x)
    rows = wg.shape[0]
    if cg > PACKED and cu > PACKED:
        for grp in prange(rows // 8):
            for t in range(T):
                g8 = _group_dot(wg, grp, cg, xq[t], xd[t], xs[t], xi[t])
                u8 = _group_dot(wu, grp, cu, xq[t], xd[t], xs[t], xi[t])
                for i in range(8):
                    g = g8[i]
                    out[t, 8 * grp + i] = silu(g) * u8[i]
        return
    for task in prange((rows + ROWS_PER_TASK - 1) // ROWS_PER_TASK):
        for r in range(task * ROWS_PER_TASK, min(rows, (task + 1) * ROWS_PER_TASK)):
            for t in range(T):
                g = _int_dot(wg, r, cg, xq[t], xd[t], xs[t], xi[t])
                u = _int_dot(wu, r, cu, xq[t], xd[t], xs[t], xi[t])
                out[t, r] = silu(g) * u


@njit(parallel=True, fastmath=True, cache=True, nogil=True)
def moe_int(gates, ups, downs, cg, cu, cd, mix, x, act, out):
    """out (1, n) = Σ_e mix[e] · down_e(silu(gate_e x) · up_e x) over one token's k experts
    (decode), in two parallel loops: every expert's gate and up rows, then the down rows, each
    output row summing its experts. gates, ups, downs: tuples of k matrices in the formats cg,
    cu, cd (INT_CODES, plain or repacked; gate and up both repacked or neither); x (1, n);
    act (k, ff) scratch. One call per MoE layer instead of two per expert."""
    n, k, ff = x.shape[1], len(gates), gates[0].shape[0]
    xq, xd, xs, xi = quantized(x)
    span = 8 if cg > PACKED else ROWS_PER_TASK
    tasks = (ff + span - 1) // span
    for task in prange(k * tasks):
        e, r0 = task // tasks, (task % tasks) * span
        if cg > PACKED:
            g8 = _group_dot(gates[e], r0 // 8, cg, xq[0], xd[0], xs[0], xi[0])
            u8 = _group_dot(ups[e], r0 // 8, cu, xq[0], xd[0], xs[0], xi[0])
            for i in range(8):
                act[e, r0 + i] = silu(g8[i]) * u8[i]
        else:
            for r in range(r0, min(ff, r0 + span)):
                g = _int_dot(gates[e], r, cg, xq[0], xd[0], xs[0], xi[0])
                u = _int_dot(ups[e], r, cu, xq[0], xd[0], xs[0], xi[0])
                act[e, r] = silu(g) * u
    aq, ad, as_, ai = quantized(act)
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


@njit(parallel=True, cache=True, nogil=True)
def gather_rows(w, code, ids, out):
    """out (T, n) = dequantized rows ids of W (the embedding lookup; a tied table is repacked,
    as the output head)."""
    for t in prange(ids.shape[0]):
        if code > PACKED:
            dequantize_x8_row(w, ids[t], code, out[t])
        else:
            dequantize_row(w[ids[t]], code, out[t])


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


@njit(parallel=True, fastmath=True, cache=True, nogil=True)
def attention(q, k, v, ks, vs, scaled, pos0, window, scale, scores, out):
    """Causal grouped-query attention of new tokens over the cache.

    q (T, H, hd) for positions pos0..pos0+T-1; k, v (S, KV, hd) with S >= pos0 + T, as the cache
    stores them (float32, f16 bits as uint16, or int8 times the scales ks, vs (S, KV) if
    `scaled`); query head h reads KV head h // (H / KV). window > 0 limits each token to its
    last `window` positions. scores (T*H, S) is scratch; out (T, H, hd).
    """
    T, H = q.shape[0], q.shape[1]
    group = H // k.shape[1]
    for th in prange(T * H):
        t, h = th // H, th % H
        last = pos0 + t
        first = max(0, last - window + 1) if window > 0 else 0
        attend(q[t, h], k, v, ks, vs, scaled, h // group, first, last, scale, scores[th], out[t, h])


@njit(cache=True, nogil=True)
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
