"""The weight formats on the CPU: their GGML codes, each stored row dequantized to float32
(dequantize_row, bit for bit with engine.quant), the int8 quantization of activations every
integer kernel reads (quantize_activations: llama.cpp's Q8_1), and the 8-row repacking done at
load (repack_x8; its rows read back by dequantize_x8_row and gather_rows). The products of these
formats are in matmul.py; table.py lists which module holds each format's code.

Layout: a weight matrix is uint8 (rows, row_bytes): row r holds output feature r's weights over
the input dimension, as consecutive blocks of its format (see engine.quant). Activations are
float32 (tokens, features), row-major. Format codes are GGML type ids.
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

import engine.kernels.ready  # noqa: F401  (engine.kernels.setup() first: fails otherwise)
from engine import quant
from engine.kernels import blocks32, kquants
from engine.kernels.dispatch import in_blocks32, in_kquants, is_int_code, per_256  # noqa: F401  (is_int_code: cpu.py)
from engine.kernels.quantizers import quantize32, quantize256

F32, F16, Q4_0, Q4_1, Q8_0, Q4_K, Q5_K, Q6_K, BF16 = 0, 1, 2, 3, 8, 12, 13, 14, 30
Q5_0, Q5_1, Q2_K, Q3_K, IQ4_NL, IQ4_XS, MXFP4 = 6, 7, 10, 11, 20, 23, 39
PACKED = quant.PACKED  # + a GGML id: that format in groups of 8 rows (repack_x8, at load or by the converter)
Q4_0X8, Q4_1X8, Q8_0X8 = PACKED + Q4_0, PACKED + Q4_1, PACKED + Q8_0
Q4_KX8, Q5_KX8, Q6_KX8 = PACKED + Q4_K, PACKED + Q5_K, PACKED + Q6_K
PACKABLE = (Q4_0, Q4_1, Q8_0, Q4_K, Q5_K, Q6_K, Q5_0, Q5_1, IQ4_NL, MXFP4, IQ4_XS)
INT_CODES = PACKABLE + (Q2_K, Q3_K) + tuple(PACKED + c for c in PACKABLE)  # dotted in integers (int8 activations)
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
def _k_scale_min(s, j):
    """Six-bit scale and minimum j (0..7) of a Q4_K/Q5_K super-block's 12 scale bytes at s."""
    if j < 4:
        return np.int32(s[j]) & 63, np.int32(s[j + 4]) & 63
    sc = (np.int32(s[j + 4]) & 15) | ((np.int32(s[j - 4]) >> 6) << 4)
    mn = (np.int32(s[j + 4]) >> 4) | ((np.int32(s[j]) >> 6) << 4)
    return sc, mn


@njit(fastmath=False, cache=True, nogil=True)
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


@njit(fastmath=False, cache=True, nogil=True)  # the rounding must be exactly the numpy twin's
def quantize_activations(x, xq, xd, xs, xi):
    """Each 32-block of x (T, n) -> int8 xq (T, n) with scale xd (T, n/32), as llama.cpp's Q8_1:
    d = max|x| / 127 stored as a half, q = round-half-even(x · 127 / max|x|); xi = Σ q (int32)
    and xs = d · Σ q as a half (the Q4_1 minimum's term)."""
    T, n = x.shape
    for t in range(T):
        for b in range(n // 32):
            quantize_block(x[t], xq[t], xd[t], xs[t], xi[t], b)


@njit(fastmath=False, cache=True, nogil=True)  # the rounding must be exactly the numpy twin's
def quantize_k_block(x, xq, xd, xs, xi, s):
    """Super-block s (values 256s..256s+255) of one token's x (n,) as llama.cpp's Q8_K, the activations
    its K-quant and IQ4_XS dot products read: one float32 scale per 256, d = -max/127 with max the value
    of largest magnitude (the first such, its sign kept), q = round-half-even(x · (-127/max)) capped at
    127. Stored in the per-32 arrays every integer kernel reads: xd[8s..8s+7] = d, xi = Σq of each 32,
    xs = d·Σq (float32, not a half). (quantizers.quantize256, in vectors; reference.quantize_activations_k is
    the twin.) Rows of these formats dotted with Q8_1 activations (quantize_block, finer) agreed with
    llama.cpp's argmax less often (SmolLM2 Q4_K_M: 96.3% of confident positions, 97.9% per 256)."""
    quantize256(x, xq, xd, xs, xi, s)


@njit(fastmath=False, cache=True, nogil=True)
def quantize_block(x, xq, xd, xs, xi, b):
    """Block b (values 32b..32b+31) of one token's x (n,) into xq, xd[b], xs[b], xi[b]
    (quantize_activations; engine.kernels.decode quantizes blocks as soon as they are done)."""
    quantize32(x, xq, xd, xs, xi, b)


@njit(fastmath=False, cache=True, nogil=True)
def quantized(x):
    """x (T, n) as quantize_activations leaves it: (int8 blocks, scales, scaled sums, sums)."""
    T, n = x.shape
    xq, xd = np.empty((T, n), np.int8), np.empty((T, n // 32), np.float32)
    xs, xi = np.empty((T, n // 32), np.float32), np.empty((T, n // 32), np.int32)
    quantize_activations(x, xq, xd, xs, xi)
    return xq, xd, xs, xi


@njit(inline="always", cache=True)
def quantize_row_for(code, x, xq, xd, xs, xi):
    """One token's x (n,) into int8 as rows of `code` read it (per_256)."""
    if per_256(code):
        for s in range(x.shape[0] // 256):
            quantize_k_block(x, xq, xd, xs, xi, s)
    else:
        for b in range(x.shape[0] // 32):
            quantize_block(x, xq, xd, xs, xi, b)


@njit(fastmath=False, cache=True, nogil=True)
def quantized_for(x, code):
    """x (T, n) as rows of `code` read it: (int8 blocks, scales, scaled sums, sums) as quantized()."""
    T, n = x.shape
    xq, xd = np.empty((T, n), np.int8), np.empty((T, n // 32), np.float32)
    xs, xi = np.empty((T, n // 32), np.float32), np.empty((T, n // 32), np.int32)
    for t in range(T):
        quantize_row_for(code, x[t], xq[t], xd[t], xs[t], xi[t])
    return xq, xd, xs, xi


@njit(fastmath=False, cache=True, nogil=True)
def quantized_sets(x, want_256, want_32):
    """x (T, n) for several matrices that read it (q, k and v; gate and up): (per-256 set, per-32 set),
    each as quantized() returns it; a set nobody wants is the other one, not a second pass. A matrix
    takes the first if per_256(its code)."""
    if want_256 and want_32:
        return quantized_for(x, Q4_K), quantized(x)
    if want_256:
        k = quantized_for(x, Q4_K)
        return k, k
    b = quantized(x)
    return b, b


@njit(fastmath=False, cache=True, nogil=True)
def quantized_pair(x, c1, c2):
    """x as rows of c1 read it, and as rows of c2 read it (gate and up): one quantization where both
    read alike (quantized_sets)."""
    k, b = quantized_sets(x, per_256(c1) or per_256(c2), not (per_256(c1) and per_256(c2)))
    return (k if per_256(c1) else b), (k if per_256(c2) else b)


@njit(inline="always", cache=True)
def _group_block(code):
    """(block bytes, halves at its head) of a repackable format."""
    if code == Q4_0:
        return 18, 1
    return (20, 2) if code == Q4_1 else (34, 1)


@njit(fastmath=False, cache=True, nogil=True)
def repack_x8(w, code):
    """In place, a PACKABLE matrix (rows, row_bytes), rows a multiple of 8 -> groups of 8
    rows stored block by block: the 8 rows' head halves (d; d then m for q4_1: 16 bytes each),
    then their quants in chunks of 32 bytes (4 for q4, 8 for q8_0), chunk c holding bytes
    4c..4c+3 of row 0, then of row 1, ... (the same size in all). Layout of simd's group dot
    products: one 4-byte vector lane per row (q4_0/q4_1/q8_0 here). K-quants: kquants.repack_k8;
    q5_0/q5_1/iq4_nl/mxfp4/iq4_xs: blocks32.repack32 (their own regions)."""
    if in_kquants(code):
        kquants.repack_k8(w, code)
        return
    if in_blocks32(code):
        blocks32.repack32(w, code)
        return
    size, halves = _group_block(code)
    regions = np.zeros((4, 3), np.int64)  # (offset, bytes, unit): the halves, the quants; no more
    regions[:, 2] = 1
    regions[0, 1], regions[0, 2] = 2 * halves, 2
    regions[1, 0], regions[1, 1], regions[1, 2] = 2 * halves, size - 2 * halves, 4
    kquants.repack8(w, size, regions)


@njit(fastmath=False, cache=True, nogil=True)
def dequantize_x8_row(w, r, code, out):
    """Row r of a matrix repacked by repack_x8 (code: the packed id) -> float32 weights (n,)."""
    base_code = code - PACKED
    if in_kquants(base_code):
        row = np.empty(w.shape[1], np.uint8)
        kquants.unpack_k8_row(w, r, base_code, row)
        dequantize_row(row, base_code, out)
        return
    if in_blocks32(base_code):
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
def _gather_row(w, code, ids, out, t):
    if code > PACKED:
        dequantize_x8_row(w, ids[t], code, out[t])
    else:
        dequantize_row(w[ids[t]], code, out[t])


@njit(parallel=True, fastmath=False, cache=True, nogil=True)
def _gather_parallel(w, code, ids, out):
    for t in prange(ids.shape[0]):
        _gather_row(w, code, ids, out, t)


GATHER_PARALLEL_T = 16  # fewer rows: one thread (a parallel region costs more than a decode step's one row)


@njit(fastmath=False, cache=True, nogil=True)
def gather_rows(w, code, ids, out):
    """out (T, n) = dequantized rows ids of W (the embedding lookup; a tied table is repacked,
    as the output head)."""
    if ids.shape[0] >= GATHER_PARALLEL_T:
        _gather_parallel(w, code, ids, out)
        return
    for t in range(ids.shape[0]):
        _gather_row(w, code, ids, out, t)
