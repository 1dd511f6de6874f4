"""The per-format dispatch of the integer kernels: for each operation, which function dots a row, an
8-row group or a tile of each format. GENERATED from engine/kernels/table.py's FORMATS by
`python -m engine.kernels.table`: edit the table, not this file (tests/test_kernel_table.py checks
that they agree)."""
from __future__ import annotations

from numba import njit

PACKED = 1000  # + a GGML id: that format repacked in groups of 8 rows
Q5_0 = 6
Q5_0X8 = PACKED + Q5_0
Q5_1 = 7
Q5_1X8 = PACKED + Q5_1
IQ4_NL = 20
IQ4_NLX8 = PACKED + IQ4_NL
IQ4_XS = 23
IQ4_XSX8 = PACKED + IQ4_XS
MXFP4 = 39
MXFP4X8 = PACKED + MXFP4
Q4_K = 12
Q4_KX8 = PACKED + Q4_K
Q2_K = 10
Q3_K = 11
Q5_K = 13
Q5_KX8 = PACKED + Q5_K
Q6_K = 14
Q6_KX8 = PACKED + Q6_K
Q4_1 = 3
Q4_1X8 = PACKED + Q4_1
Q4_0 = 2
Q4_0X8 = PACKED + Q4_0
Q8_0 = 8
Q8_0X8 = PACKED + Q8_0


@njit(inline="always", cache=True)
def is_int_code(code):
    """Whether `code` (a GGML id, or PACKED + one) is dotted with int8 activations."""
    c = code - PACKED if code > PACKED else code
    return (c == Q5_0 or c == Q5_1 or c == IQ4_NL or c == IQ4_XS or c == MXFP4 or c == Q4_K
            or c == Q2_K or c == Q3_K or c == Q5_K or c == Q6_K or c == Q4_1 or c == Q4_0
            or c == Q8_0)


@njit(inline="always", cache=True)
def per_256(code):
    """Whether rows of `code` (a GGML id, or PACKED + one) read activations quantized per 256
    (llama.cpp's Q8_K) rather than per 32 (Q8_1)."""
    c = code - PACKED if code > PACKED else code
    return c == IQ4_XS or c == Q4_K or c == Q2_K or c == Q3_K or c == Q5_K or c == Q6_K


@njit(inline="always", cache=True)
def in_blocks32(code):
    """Whether `code` (a GGML id, or PACKED + one) has its dot products in blocks32.py."""
    c = code - PACKED if code > PACKED else code
    return c == Q5_0 or c == Q5_1 or c == IQ4_NL or c == IQ4_XS or c == MXFP4


@njit(inline="always", cache=True)
def in_kquants(code):
    """Whether `code` (a GGML id, or PACKED + one) has its dot products in kquants.py."""
    c = code - PACKED if code > PACKED else code
    return c == Q4_K or c == Q2_K or c == Q3_K or c == Q5_K or c == Q6_K


@njit(inline="always", cache=True)
def in_simd(code):
    """Whether `code` (a GGML id, or PACKED + one) has its dot products in simd.py."""
    c = code - PACKED if code > PACKED else code
    return c == Q4_1 or c == Q4_0 or c == Q8_0


@njit(inline="always", cache=True)
def tiled(code):
    """Whether prefill on this format (a GGML id, repacked) takes tiles.py from TILE_MIN_T tokens on."""
    return code == IQ4_XS or code == Q4_K or code == Q5_K or code == Q6_K


@njit(inline="always", cache=True)
def pairable(code, N):
    """Whether N rows on a matrix in `code` go through pair, two groups at once (simd.WIDE only)."""
    return N >= simd.TOKENS and (code == Q4_1X8 or code == Q4_0X8 or code == Q8_0X8)


from engine.kernels import blocks32, kquants, simd, tile_formats  # noqa: E402  (below what formats.py reads)


@njit(inline="always", cache=True)
def blocks32_row(w, r, code, xq, xd, xs, xi):
    """int_dot on blocks32.py's formats (code: the GGML id)."""
    if code == Q5_0:
        return blocks32.row_dot_q5_0(w, r, xq, xd, xs, xi)
    if code == Q5_1:
        return blocks32.row_dot_q5_1(w, r, xq, xd, xs, xi)
    if code == IQ4_NL:
        return blocks32.row_dot_iq4_nl(w, r, xq, xd, xs, xi)
    if code == IQ4_XS:
        return blocks32.row_dot_iq4_xs(w, r, xq, xd, xs, xi)
    return blocks32.row_dot_mxfp4(w, r, xq, xd, xs, xi)


@njit(inline="always", cache=True)
def blocks32_tokens(w, r, code, xq, xd, xs, xi, t0):
    """tokens_dot on blocks32.py's formats (code: the GGML id)."""
    if code == Q5_0:
        return blocks32.tokens_q5_0(w, r, xq, xd, xs, xi, t0)
    if code == Q5_1:
        return blocks32.tokens_q5_1(w, r, xq, xd, xs, xi, t0)
    if code == IQ4_NL:
        return blocks32.tokens_iq4_nl(w, r, xq, xd, xs, xi, t0)
    if code == IQ4_XS:
        return blocks32.tokens_iq4_xs(w, r, xq, xd, xs, xi, t0)
    return blocks32.tokens_mxfp4(w, r, xq, xd, xs, xi, t0)


@njit(fastmath=True, cache=True, nogil=True)
def blocks32_group(w, g, code, xq, xd, xs, xi):
    """group_dot on blocks32.py's formats (code: the GGML id)."""
    if code == Q5_0:
        return blocks32.group_q5_0(w, g, xq, xd, xs, xi)
    if code == Q5_1:
        return blocks32.group_q5_1(w, g, xq, xd, xs, xi)
    if code == IQ4_NL:
        return blocks32.group_iq4_nl(w, g, xq, xd, xs, xi)
    if code == IQ4_XS:
        return blocks32.group_iq4_xs(w, g, xq, xd, xs, xi)
    return blocks32.group_mxfp4(w, g, xq, xd, xs, xi)


@njit(fastmath=True, cache=True, nogil=True)
def blocks32_group_tokens(w, g, code, xq, xd, xs, xi, t0):
    """group_tokens on blocks32.py's formats (code: the GGML id)."""
    if code == Q5_0:
        return blocks32.group_tokens_q5_0(w, g, xq, xd, xs, xi, t0)
    if code == Q5_1:
        return blocks32.group_tokens_q5_1(w, g, xq, xd, xs, xi, t0)
    if code == IQ4_NL:
        return blocks32.group_tokens_iq4_nl(w, g, xq, xd, xs, xi, t0)
    if code == IQ4_XS:
        return blocks32.group_tokens_iq4_xs(w, g, xq, xd, xs, xi, t0)
    return blocks32.group_tokens_mxfp4(w, g, xq, xd, xs, xi, t0)


@njit(fastmath=True, cache=True, nogil=True)
def kquants_row(w, r, code, xq, xd, xs, xi):
    """int_dot on kquants.py's formats (code: the GGML id)."""
    if code == Q4_K:
        return kquants._row_q4_k(w, r, xq, xd, xs, xi)
    if code == Q2_K:
        return kquants._row_q2_k(w, r, xq, xd, xs, xi)
    if code == Q3_K:
        return kquants._row_q3_k(w, r, xq, xd, xs, xi)
    if code == Q5_K:
        return kquants._row_q5_k(w, r, xq, xd, xs, xi)
    return kquants._row_q6_k(w, r, xq, xd, xs, xi)


@njit(inline="always", cache=True)
def int_dot(w, r, code, xq, xd, xs, xi):
    """int_dot: row r of a stored matrix · one token's int8 activations (code: the GGML id)."""
    if code == Q5_0 or code == Q5_1 or code == IQ4_NL or code == IQ4_XS or code == MXFP4:
        return blocks32_row(w, r, code, xq, xd, xs, xi)
    if code == Q4_K or code == Q2_K or code == Q3_K or code == Q5_K or code == Q6_K:
        return kquants_row(w, r, code, xq, xd, xs, xi)
    if code == Q4_1:
        return simd.row_dot_q4_1(w, r, xq, xd, xs, xi)
    if code == Q4_0:
        return simd.row_dot_q4_0(w, r, xq, xd, xs, xi)
    return simd.row_dot_q8_0(w, r, xq, xd, xs, xi)


@njit(inline="always", cache=True)
def tokens_dot(w, r, code, xq, xd, xs, xi, t0):
    """tokens_dot: row r · tokens t0..t0+TOKENS-1 (code: the GGML id)."""
    if code == Q5_0 or code == Q5_1 or code == IQ4_NL or code == IQ4_XS or code == MXFP4:
        return blocks32_tokens(w, r, code, xq, xd, xs, xi, t0)
    if code == Q4_K or code == Q2_K or code == Q3_K or code == Q5_K or code == Q6_K:
        return (kquants_row(w, r, code, xq[t0], xd[t0], xs[t0], xi[t0]),
                kquants_row(w, r, code, xq[t0 + 1], xd[t0 + 1], xs[t0 + 1], xi[t0 + 1]),
                kquants_row(w, r, code, xq[t0 + 2], xd[t0 + 2], xs[t0 + 2], xi[t0 + 2]),
                kquants_row(w, r, code, xq[t0 + 3], xd[t0 + 3], xs[t0 + 3], xi[t0 + 3]))
    if code == Q4_1:
        return simd.tokens_q4_1(w, r, xq, xd, xs, xi, t0)
    if code == Q4_0:
        return simd.tokens_q4_0(w, r, xq, xd, xs, xi, t0)
    return simd.tokens_q8_0(w, r, xq, xd, xs, xi, t0)


@njit(inline="always", cache=True)
def group_dot(w, g, code, xq, xd, xs, xi):
    """group_dot: rows 8g..8g+7 of a repacked matrix · one token (code: PACKED + the GGML id)."""
    if code == Q5_0X8 or code == Q5_1X8 or code == IQ4_NLX8 or code == IQ4_XSX8 or code == MXFP4X8:
        return blocks32_group(w, g, code - PACKED, xq, xd, xs, xi)
    if code == Q4_KX8:
        return kquants._group_q4_k(w, g, xq, xd, xs, xi)
    if code == Q5_KX8:
        return kquants._group_q5_k(w, g, xq, xd, xs, xi)
    if code == Q6_KX8:
        return kquants._group_q6_k(w, g, xq, xd, xs, xi)
    if code == Q4_1X8:
        return simd.group_dot_q4_1x8(w, g, xq, xd, xs, xi)
    if code == Q4_0X8:
        return simd.group_dot_q4_0x8(w, g, xq, xd, xs, xi)
    return simd.group_dot_q8_0x8(w, g, xq, xd, xs, xi)


@njit(inline="always", cache=True)
def group_tokens(w, g, code, xq, xd, xs, xi, t0):
    """group_tokens: rows 8g..8g+7 · tokens t0..t0+TOKENS-1: 8 rows a token (code: PACKED + the GGML id)."""
    if code == Q5_0X8 or code == Q5_1X8 or code == IQ4_NLX8 or code == IQ4_XSX8 or code == MXFP4X8:
        return blocks32_group_tokens(w, g, code - PACKED, xq, xd, xs, xi, t0)
    if code == Q4_KX8:
        return kquants._tokens_q4_k(w, g, xq, xd, xs, xi, t0)
    if code == Q5_KX8:
        return kquants._tokens_q5_k(w, g, xq, xd, xs, xi, t0)
    if code == Q6_KX8:
        return kquants._tokens_q6_k(w, g, xq, xd, xs, xi, t0)
    if code == Q4_1X8:
        return simd.group_tokens_q4_1x8(w, g, xq, xd, xs, xi, t0)
    if code == Q4_0X8:
        return simd.group_tokens_q4_0x8(w, g, xq, xd, xs, xi, t0)
    return simd.group_tokens_q8_0x8(w, g, xq, xd, xs, xi, t0)


@njit(inline="always", cache=True)
def pair(m, g, code, xq, xd, xs, xi, t0):
    """pair: rows 8g..8g+15 · tokens t0..t0+TOKENS-1: 16 rows a token (code: PACKED + the GGML id)."""
    if code == Q4_1X8:
        return simd.pair_tokens_q4_1x8(m, g, xq, xd, xs, xi, t0)
    if code == Q4_0X8:
        return simd.pair_tokens_q4_0x8(m, g, xq, xd, xs, xi, t0)
    return simd.pair_tokens_q8_0x8(m, g, xq, xd, xs, xi, t0)


@njit(inline="always", cache=True)
def pair8(m, g, code, xq, xd, xs, xi, t0):
    """pair8: pair for PAIR_TOKENS tokens t0.. in one pass (code: PACKED + the GGML id)."""
    if code == Q4_1X8:
        return simd.pair8_tokens_q4_1x8(m, g, xq, xd, xs, xi, t0)
    if code == Q4_0X8:
        return simd.pair8_tokens_q4_0x8(m, g, xq, xd, xs, xi, t0)
    return simd.pair8_tokens_q8_0x8(m, g, xq, xd, xs, xi, t0)


@njit(fastmath=True, cache=True, nogil=True)
def tile_unpack(w, g, h, code, tq, ta, tb, td):
    """tile_unpack: 8-row group g into half h of a tile (tq, ta, tb, td) (code: the GGML id)."""
    if code == IQ4_XS:
        tile_formats._unpack_iq4_xs(w, g, h, tq, ta, tb, td)
    elif code == Q4_K:
        tile_formats._unpack_q4_k(w, g, h, tq, ta, tb, td)
    elif code == Q5_K:
        tile_formats._unpack_q5_k(w, g, h, tq, ta, tb, td)
    else:
        tile_formats._unpack_q6_k(w, g, h, tq, ta, tb, td)


@njit(fastmath=True, cache=True, nogil=True)
def tile_dot(code, tq, ta, tb, td, xq, xd, xs, offsets, xi, t0, res):
    """tile_dot: res = a tile · tokens t0..t0+TOKENS-1 (code: the GGML id)."""
    if code == IQ4_XS:
        tile_formats._tile_grid(tq, ta, tb, td, xq, xd, xs, xi, t0, res)
    elif code == Q4_K or code == Q5_K:
        tile_formats._tile_k(tq, ta, tb, td, xq, xd, xs, xi, t0, res)
    else:
        tile_formats._tile_q6(tq, ta, tb, td, xq, xd, offsets, xi, t0, res)
