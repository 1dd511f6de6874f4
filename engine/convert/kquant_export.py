"""K-quant export: Q4_K, Q5_K and Q6_K (and the 32-weight fallbacks Q5_0, Q5_1, Q8_0) written
from float weights the way llama.cpp's llama-quantize writes them, and its preset mixes.

Why byte for byte: a model we export is then the model llama.cpp would have made, so a figure of
ours compares like with like. The algorithms are ggml's reference quantizers (quantize_row_q4_K_ref
& co.; with importance weights `imatrix`, one per input column, the *_impl versions, as
llama-quantize --imatrix), in numpy over many blocks at once, every float32 operation in C's order
(sums element by element, never pairwise), so the rounding is the same.

Layout: a matrix (..., n) float32 in, the stored uint8 array (..., n // 256 * type_size) out;
blocks run along the row, a row's blocks are independent, so any slice of rows quantizes alone.
"""
from __future__ import annotations

import re

import numpy as np

from engine import quant

QK_K = 256
F = np.float32
EPS = F(1e-15)  # ggml's GROUP_MAX_EPS

# --- helpers ---------------------------------------------------------------------------------


def _rint(v: np.ndarray) -> np.ndarray:
    """ggml's nearest_int (adds 1.5 * 2^23: halves to even) as float32 values."""
    return np.rint(v).astype(F)


def _seqsum(a: np.ndarray) -> np.ndarray:
    """Sum over the last axis element by element (C's loop order), float32."""
    cols = np.ascontiguousarray(np.moveaxis(a, -1, 0), dtype=F)  # each column contiguous: fast adds
    acc = np.zeros(a.shape[:-1], F)
    for c in cols:
        acc += c
    return acc


def _f16(v: np.ndarray) -> np.ndarray:
    """float32 -> its f16 value, rounded to nearest even, back in float32 (and the f16 bits)."""
    h = np.asarray(v, F).astype(np.float16)
    return h.astype(F), h


def _as_u8(l: np.ndarray) -> np.ndarray:
    """An int result stored into a uint8 (C wraps modulo 256), as float32."""
    return (l.astype(np.int64) & 0xFF).astype(F)


def _signed_absmax(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(amax, the first value reaching it) per row; 0.0 (positive) when all are zero."""
    a = np.abs(x)
    amax = a.max(axis=-1)
    mx = np.take_along_axis(x, a.argmax(axis=-1)[..., None], axis=-1)[..., 0]
    return amax, np.where(amax > 0, mx, F(0)).astype(F)


def _seq_minmax(x: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """C's `if (v < min) min = v; if (v > max) max = v;` over the last axis from (lo, hi)."""
    for i in range(x.shape[-1]):
        v = x[..., i]
        lo = np.where(v < lo, v, lo)
        hi = np.where(v > hi, v, hi)
    return lo.astype(F), hi.astype(F)


# --- the scale searches (ggml's make_qkx2/qkx3, make_qx, make_qp) ------------------------------


def _colsum(a: np.ndarray) -> np.ndarray:
    """Sum over the first axis element by element (C's loop order), float32; rows contiguous."""
    acc = np.zeros(a.shape[1:], F)
    for row in a:
        acc += row
    return acc


def _qkx(x: np.ndarray, w: np.ndarray, nmax: int, rmin: float, rdelta: float, nstep: int,
         strict_flat: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Fit x ~ scale * L - m (L in 0..nmax, m >= 0) per row of x (N, n) under weights w: a
    min/max grid, then `nstep` stretched grids each refit by weighted least squares, the lowest
    weighted squared error kept. Returns (scale, m, L). make_qkx2 (strict_flat: max == min is
    flat) and make_qkx3 (max <= min). Worked on transposed (n, N), so each sum adds whole rows."""
    x, w = np.ascontiguousarray(x.T, F), np.ascontiguousarray(w.T, F)
    lo, hi = x[0].copy(), x[0].copy()
    for v in x[1:]:
        lo = np.where(v < lo, v, lo)
        hi = np.where(v > hi, v, hi)
    sum_w = _colsum(w)
    sum_x = _colsum(w * x)
    lo = lo0 = np.where(lo > 0, F(0), lo).astype(F)
    flat = (hi == lo) if strict_flat else (hi <= lo)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        span = np.where(flat, F(1), hi - lo).astype(F)
        iscale = F(nmax) / span
        scale = F(1) / iscale
        L = np.clip(_rint(iscale * (x - lo)), 0, nmax).astype(F)
        diff = scale * L + lo - x
        best = _colsum(w * (diff * diff))
        for step in range(nstep + 1):
            span = np.where(flat, F(1), hi - lo).astype(F)  # the refit minimum moves the grid
            iscale = (F(rmin) + F(rdelta) * F(step) + F(nmax)) / span
            La = np.clip(_rint(iscale * (x - lo)), 0, nmax).astype(F)
            wl = w * La
            sum_l, sum_l2, sum_xl = _colsum(wl), _colsum(wl * La), _colsum(wl * x)
            D = sum_w * sum_l2 - sum_l * sum_l
            this_scale = (sum_w * sum_xl - sum_x * sum_l) / D
            this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D
            pos = this_min > 0
            this_min = np.where(pos, F(0), this_min).astype(F)
            this_scale = np.where(pos, sum_xl / sum_l2, this_scale).astype(F)
            diff = this_scale * La + this_min - x
            cur = _colsum(w * (diff * diff))
            take = (D > 0) & (cur < best)
            L = np.where(take, La, L)
            best = np.where(take, cur, best)
            scale = np.where(take, this_scale, scale).astype(F)
            lo = np.where(take, this_min, lo).astype(F)
    L = np.where(flat, F(0), L)
    scale = np.where(flat, F(0), scale).astype(F)
    return scale, (-np.where(flat, lo0, lo)).astype(F), np.ascontiguousarray(L.T)


def _qx(x: np.ndarray, nmax: int, qw: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric fit x ~ scale * (L - nmax), L in 0..2*nmax-1, per row of x (N, n): the grid
    through the largest magnitude and 18 stretched ones, the best weighted least-squares scale
    kept (weights qw, or x^2). ggml's make_qx_quants with rmse_type 1. Returns (scale, L).
    Worked on transposed (n, N)."""
    amax, mx = _signed_absmax(x)
    zero = amax < EPS
    mx = np.where(zero, F(1), mx).astype(F)
    x = np.ascontiguousarray(x.T, F)
    w = (x * x) if qw is None else np.ascontiguousarray(qw.T, F)
    wx = w * x

    def fit(iscale):
        l = np.clip(_rint(iscale * x), -nmax, nmax - 1).astype(F)
        return l, _colsum(wx * l), _colsum((w * l) * l)

    iscale = F(-nmax) / mx
    l, sumlx, suml2 = fit(iscale)
    with np.errstate(divide="ignore", invalid="ignore"):
        scale = np.where(suml2 != 0, sumlx / suml2, F(0)).astype(F)
        best = scale * sumlx
        for step in range(-9, 10):
            if step == 0:
                continue
            iscale = -(F(nmax) + F(0.1) * F(step)) / mx
            lt, sumlx, suml2 = fit(iscale)
            take = (suml2 > 0) & (sumlx * sumlx > best * suml2)
            l = np.where(take, lt, l)
            scale = np.where(take, sumlx / suml2, scale).astype(F)
            best = np.where(take, scale * sumlx, best).astype(F)
    L = np.where(zero, F(0), l + F(nmax))
    return np.where(zero, F(0), scale).astype(F), np.ascontiguousarray(L.T)


def _qp(x: np.ndarray, nmax: int, qw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Positive values x (N, n) ~ scale * L, L in 0..nmax, under weights qw (N, n): the best of 9
    grids, then up to 5 passes moving single levels while the weighted fit improves. ggml's
    make_qp_quants (the super-block scale of Q4_K/Q5_K with an importance matrix)."""
    mx = np.zeros(x.shape[0], F)
    for i in range(x.shape[1]):
        mx = np.where(mx > x[:, i], mx, x[:, i]).astype(F)
    zero = mx < EPS
    mx = np.where(zero, F(1), mx).astype(F)
    with np.errstate(divide="ignore", invalid="ignore"):
        iscale = F(nmax) / mx
        L = _as_u8(_rint(iscale[:, None] * x))
        scale = F(1) / iscale
        diff = x - scale[:, None] * L
        best = _seqsum((qw * diff) * diff)
        for step in range(-4, 5):
            if step == 0:
                continue
            iscale_is = (F(0.1) * F(step) + F(nmax)) / mx
            scale_is = F(1) / iscale_is
            l = np.minimum(_rint(iscale_is[:, None] * x), F(nmax))
            diff = x - scale_is[:, None] * l
            mse = _seqsum((qw * diff) * diff)
            take = mse < best
            best = np.where(take, mse, best)
            iscale = np.where(take, iscale_is, iscale).astype(F)
        l = np.minimum(_rint(iscale[:, None] * x), F(nmax))
        L = _as_u8(l)
        sumlx, suml2 = _seqsum((qw * x) * l), _seqsum((qw * l) * l)
        for _ in range(5):
            for i in range(x.shape[1]):
                w, xi, Li = qw[:, i], x[:, i], L[:, i]
                slx = sumlx - (w * xi) * Li
                sl2 = suml2 - (w * Li) * Li
                ok = (slx > 0) & (sl2 > 0)
                new_l = np.minimum(_rint((xi * sl2) / np.where(ok, slx, F(1))), F(nmax))
                ok &= new_l != Li
                slx2 = slx + (w * xi) * new_l
                sl22 = sl2 + (w * new_l) * new_l
                ok &= (slx2 * slx2) * suml2 > (sumlx * sumlx) * sl22
                L[:, i] = np.where(ok, _as_u8(new_l), Li)
                sumlx = np.where(ok, slx2, sumlx).astype(F)
                suml2 = np.where(ok, sl22, suml2).astype(F)
        out = np.where(suml2 > 0, sumlx / suml2, F(0)).astype(F)
    return np.where(zero, F(0), out).astype(F), np.where(zero[:, None], F(0), L)


# --- Q4_K / Q5_K: d, dmin f16 | 12 bytes of 6-bit scales and mins | 4-bit (and 1 high bit) ----


def _pack_scales(ls: np.ndarray, lm: np.ndarray) -> np.ndarray:
    """(N, 8) six-bit scales and mins -> (N, 12) bytes (get_scale_min_k4's layout)."""
    ls, lm = ls.astype(np.uint8), lm.astype(np.uint8)
    s = np.zeros((ls.shape[0], 12), np.uint8)
    s[:, 0:4] = ls[:, :4] | ((ls[:, 4:] >> 4) << 6)
    s[:, 4:8] = lm[:, :4] | ((lm[:, 4:] >> 4) << 6)
    s[:, 8:12] = (ls[:, 4:] & 0xF) | ((lm[:, 4:] & 0xF) << 4)
    return s


def _k_asym(x: np.ndarray, nmax: int, imatrix: np.ndarray | None) -> tuple[np.ndarray, ...]:
    """The shared part of Q4_K (nmax 15) and Q5_K (nmax 31): per super-block of 256 (rows of x),
    the f16 d and dmin bits, the 12 scale bytes and the levels L (N, 256)."""
    N = x.shape[0]
    sub = x.reshape(N * 8, 32)
    if imatrix is None:
        av = np.sqrt(_seqsum(sub * sub) / F(32))
        w = av[:, None] + np.abs(sub)
        rmin, rdelta, nstep = (-1.0, 0.1, 20) if nmax == 15 else (-0.5, 0.1, 15)
        scales, mins, L = _qkx(sub, w, nmax, rmin, rdelta, nstep, True)
        scales, mins = scales.reshape(N, 8), mins.reshape(N, 8)
        max_scale = np.maximum(scales.max(axis=1), F(0))
        max_min = np.maximum(mins.max(axis=1), F(0))
        with np.errstate(divide="ignore"):
            inv_scale = np.where(max_scale > 0, F(63) / max_scale, F(0)).astype(F)
            inv_min = np.where(max_min > 0, F(63) / max_min, F(0)).astype(F)
        ls = np.minimum(_as_u8(_rint(inv_scale[:, None] * scales)), F(63))
        lm = np.minimum(_as_u8(_rint(inv_min[:, None] * mins)), F(63))
        d, d_bits = _f16(max_scale / F(63))
        dmin, dmin_bits = _f16(max_min / F(63))
    else:
        sigma2 = F(2) * _seqsum(x * x) / F(QK_K)
        qw = np.broadcast_to(imatrix, x.shape).reshape(N * 8, 32)
        s2 = np.repeat(sigma2, 8)[:, None]
        w = qw * np.sqrt(s2 + sub * sub)
        sw = _seqsum(w).reshape(N, 8)
        scales, mins, L = _qkx(sub, w, nmax, -0.9, 0.05, 36, False)
        d_block, ls = _qp(scales.reshape(N, 8), 63, sw)
        m_block, lm = _qp(mins.reshape(N, 8), 63, sw)
        if nmax == 31:  # Q5_K's clamps them; Q4_K's stores them as they are
            ls, lm = np.minimum(ls, F(63)), np.minimum(lm, F(63))
        d, d_bits = _f16(d_block)
        dmin, dmin_bits = _f16(m_block)
    L = L.reshape(N, 8, 32)
    dd = (d[:, None] * ls)[:, :, None]
    dm = (dmin[:, None] * lm)[:, :, None]
    xs = x.reshape(N, 8, 32)
    with np.errstate(divide="ignore", invalid="ignore"):
        again = np.clip(_rint((xs + dm) / np.where(dd != 0, dd, F(1))), 0, nmax)
    L = np.where(dd != 0, again, L).reshape(N, QK_K).astype(np.uint8)
    head = np.concatenate([d_bits.reshape(N, 1).view(np.uint8), dmin_bits.reshape(N, 1).view(np.uint8),
                           _pack_scales(ls, lm)], axis=1)
    return head, L


def _q4_k(x: np.ndarray, imatrix: np.ndarray | None) -> np.ndarray:
    head, L = _k_asym(x, 15, imatrix)
    L = L.reshape(-1, 4, 2, 32)  # 4 groups of 64: the first 32 in low nibbles, the next 32 high
    qs = (L[:, :, 0] | (L[:, :, 1] << 4)).reshape(-1, 128)
    return np.concatenate([head, qs], axis=1)


def _q5_k(x: np.ndarray, imatrix: np.ndarray | None) -> np.ndarray:
    head, L = _k_asym(x, 31, imatrix)
    L = L.reshape(-1, 4, 2, 32)
    low = L & 0xF
    qs = (low[:, :, 0] | (low[:, :, 1] << 4)).reshape(-1, 128)
    hi = (L >> 4).astype(np.uint8)  # bit 2g of qh[j]: element j of 32-group 2g; bit 2g+1: group 2g+1
    shifts = (np.arange(8, dtype=np.uint8)).reshape(1, 4, 2, 1)
    qh = np.bitwise_or.reduce((hi << shifts).reshape(-1, 8, 32), axis=1).astype(np.uint8)
    return np.concatenate([head, qh, qs], axis=1)


# --- Q6_K: ql 128 | qh 64 | 16 int8 scales | f16 d ---------------------------------------------


def _q6_k(x: np.ndarray, imatrix: np.ndarray | None) -> np.ndarray:
    N = x.shape[0]
    sub = x.reshape(N * 16, 16)
    qw = None if imatrix is None else np.broadcast_to(imatrix, x.shape).reshape(N * 16, 16)
    scales, L = _qx(sub, 32, qw)
    scales, L = scales.reshape(N, 16), L.reshape(N, 16, 16)
    a = np.abs(scales)
    max_abs = a.max(axis=1)
    max_scale = np.take_along_axis(scales, a.argmax(axis=1)[:, None], axis=1)[:, 0]
    zero = max_abs < EPS
    with np.errstate(divide="ignore", invalid="ignore"):
        iscale = F(-128) / np.where(zero, F(1), max_scale)
        d, d_bits = _f16(F(1) / iscale)
        sc = np.minimum(_rint(iscale[:, None] * scales), F(127)).astype(np.int8)
        dd = (d[:, None] * sc.astype(F))[:, :, None]
        again = np.clip(_rint(sub.reshape(N, 16, 16) / np.where(dd != 0, dd, F(1))), -32, 31) + F(32)
    L = np.where(dd != 0, again, L).reshape(N, 2, 4, 32).astype(np.uint8)  # halves of 128, 4 rows of 32
    ql = np.concatenate([(L[:, :, 0] & 0xF) | ((L[:, :, 2] & 0xF) << 4),
                         (L[:, :, 1] & 0xF) | ((L[:, :, 3] & 0xF) << 4)], axis=2).reshape(N, 128)
    qh = ((L[:, :, 0] >> 4) | ((L[:, :, 1] >> 4) << 2) | ((L[:, :, 2] >> 4) << 4)
          | ((L[:, :, 3] >> 4) << 6)).reshape(N, 64)
    out = np.concatenate([ql, qh, sc.view(np.uint8), d_bits.reshape(N, 1).view(np.uint8)], axis=1)
    out[zero] = 0
    return out


# --- 32-weight formats: the fallbacks (Q5_0, Q5_1, Q8_0) and our int4 (Q4_1) with weights -------


def _fifth_bits(q: np.ndarray) -> np.ndarray:
    """(N, 32) levels 0..31 -> the (N, 4) little-endian bytes of qh (bit j: bit 4 of level j)."""
    bits = ((q >> 4) & 1).astype(np.uint32)
    qh = np.bitwise_or.reduce(bits << np.arange(32, dtype=np.uint32), axis=1).astype(np.uint32)
    return qh.astype("<u4").view(np.uint8).reshape(-1, 4)


def _nibbles(q: np.ndarray) -> np.ndarray:
    q = q.astype(np.uint8) & 0xF
    return q[:, :16] | (q[:, 16:] << 4)


def _row_sigma2(x: np.ndarray, n_per_row: int) -> np.ndarray:
    """Per block of 32, the mean square of its whole row (the *_impl's sigma2), (N,)."""
    rows = x.reshape(-1, n_per_row)
    s = _seqsum(rows * rows) / F(n_per_row)
    return np.repeat(s, n_per_row // 32)


def _q5_0(x: np.ndarray, imatrix: np.ndarray | None, n_per_row: int) -> np.ndarray:
    g = x.reshape(-1, 32)
    if imatrix is None:
        _, mx = _signed_absmax(g)
        d = mx / F(-16)
        with np.errstate(divide="ignore"):
            inv = np.where(d != 0, F(1) / d, F(0)).astype(F)
        q = np.minimum(np.trunc(g * inv[:, None] + F(16.5)), F(31)).astype(np.uint8)
    else:
        qw = np.broadcast_to(imatrix, x.shape).reshape(-1, 32)
        w = qw * np.sqrt(_row_sigma2(x, n_per_row)[:, None] + g * g)
        d, q = _qx(g, 16, w)
        q = q.astype(np.uint8)
    return np.concatenate([_f16(d)[1].reshape(-1, 1).view(np.uint8), _fifth_bits(q), _nibbles(q)], axis=1)


def _q5_1(x: np.ndarray, imatrix: np.ndarray | None, n_per_row: int) -> np.ndarray:
    g = x.reshape(-1, 32)
    if imatrix is None:
        lo, hi = _seq_minmax(g, np.full(len(g), np.finfo(F).max, F), np.full(len(g), -np.finfo(F).max, F))
        d = (hi - lo) / F(31)
        with np.errstate(divide="ignore"):
            inv = np.where(d != 0, F(1) / d, F(0)).astype(F)
        q = np.trunc((g - lo[:, None]) * inv[:, None] + F(0.5)).astype(np.int64).astype(np.uint8)
        m = lo
    else:
        qw = np.broadcast_to(imatrix, x.shape).reshape(-1, 32)
        w = qw * np.sqrt(_row_sigma2(x, n_per_row)[:, None] + g * g)
        d, m, q = _qkx(g, w, 31, -0.9, 0.05, 36, False)
        q, m = q.astype(np.uint8), -m
    return np.concatenate([_f16(d)[1].reshape(-1, 1).view(np.uint8), _f16(m)[1].reshape(-1, 1).view(np.uint8),
                           _fifth_bits(q), _nibbles(q)], axis=1)


def _q4_1(x: np.ndarray, imatrix: np.ndarray | None, n_per_row: int) -> np.ndarray:
    if imatrix is None:
        return quant.quantize(x, "q4_1").reshape(-1, 20)
    g = x.reshape(-1, 32)
    qw = np.broadcast_to(imatrix, x.shape).reshape(-1, 32)
    w = qw * np.sqrt(_row_sigma2(x, n_per_row)[:, None] + g * g)
    d, m, q = _qkx(g, w, 15, -0.9, 0.05, 36, False)
    return np.concatenate([_f16(d)[1].reshape(-1, 1).view(np.uint8), _f16(-m)[1].reshape(-1, 1).view(np.uint8),
                           _nibbles(q)], axis=1)


def _q8_0(x: np.ndarray, imatrix: np.ndarray | None, n_per_row: int) -> np.ndarray:
    return quant.quantize(x, "q8_0").reshape(-1, 34)  # llama.cpp's Q8_0 ignores an importance matrix


def weighted_q8_0(x: np.ndarray, imatrix: np.ndarray) -> np.ndarray:
    """Q8_0 blocks whose scale is chosen under importance weights (ours; llama.cpp has none): the
    make_qx search (128 levels a side) with the weights Q5_0's --imatrix path uses. x (..., n)."""
    n_per_row = int(x.shape[-1])
    lead = x.shape[:-1]
    x = np.ascontiguousarray(x, F).reshape(-1, n_per_row)
    g = x.reshape(-1, 32)
    qw = np.broadcast_to(imatrix, x.shape).reshape(-1, 32)
    w = qw * np.sqrt(_row_sigma2(x, n_per_row)[:, None] + g * g)
    d, q = _qx(g, 128, w)
    d16, bits = _f16(d)
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.clip(_rint(g / np.where(d16 != 0, d16, F(1))[:, None]), -128, 127)
    q = np.where(d16[:, None] != 0, q, F(0)).astype(np.int8)
    return np.concatenate([bits.reshape(-1, 1).view(np.uint8), q.view(np.uint8)], axis=1).reshape(*lead, -1)


_SUPER = {"q4_k": _q4_k, "q5_k": _q5_k, "q6_k": _q6_k}
_SMALL = {"q5_0": _q5_0, "q5_1": _q5_1, "q4_1": _q4_1, "q8_0": _q8_0}
PRODUCED = tuple(_SUPER) + tuple(_SMALL)


def best_per_block(x: np.ndarray, qtype: str, imatrix: np.ndarray) -> np.ndarray:
    """Our importance-weighted rounding for the 32-weight formats of int4 (Q4_1) and int8 (Q8_0):
    per block, whichever of the reference rounding and the weighted search (llama.cpp's Q4_1
    --imatrix algorithm; for Q8_0 weighted_q8_0) has the lower activation-weighted squared error
    sum_i E[a_i^2] (w_i - q_i)^2, so weights that already lie on the grid keep it. x (..., n)."""
    x = np.ascontiguousarray(x, F)
    plain = quant.quantize(x, qtype)
    if quant.get(qtype).block_size == 1:  # a float type (f16 for rows no block divides): nothing to weigh
        return plain
    weighted = weighted_q8_0(x, imatrix) if qtype == "q8_0" else quantize(x, qtype, imatrix)
    size = quant.get(qtype).type_size
    errs = []
    for cand in (plain, weighted):
        d = (quant.dequantize(cand, qtype) - x).reshape(-1, 32)
        w = np.broadcast_to(imatrix, x.shape).reshape(-1, 32)
        errs.append(np.einsum("bi,bi->b", w, d * d))
    take = (errs[1] < errs[0])[:, None]
    out = np.where(take, weighted.reshape(-1, size), plain.reshape(-1, size))
    return out.reshape(plain.shape)


def quantize(x: np.ndarray, qtype: str | quant.QuantType, imatrix: np.ndarray | None = None) -> np.ndarray:
    """float weights (..., n) -> the stored array of `qtype`, as llama-quantize writes it.

    `imatrix` (n,), the mean squared activation of each input column, selects llama.cpp's
    importance-weighted algorithms (llama-quantize --imatrix); other formats go to engine.quant."""
    t = qtype if isinstance(qtype, quant.QuantType) else quant.get(qtype)
    x = np.ascontiguousarray(x, dtype=F)
    n = int(x.shape[-1])
    if t.name not in PRODUCED:
        return quant.quantize(x, t)
    t.row_bytes(n)  # a clear error for a row that does not divide into blocks
    if imatrix is not None:
        imatrix = np.ascontiguousarray(imatrix, dtype=F)
        if imatrix.shape != (n,):
            raise quant.QuantError(f"importance weights have shape {imatrix.shape}, the rows {n} columns")
    lead = x.shape[:-1]
    rows = x.reshape(-1, n)
    if t.name in _SUPER:
        blocks = rows.reshape(-1, QK_K)
        imat = None if imatrix is None else np.tile(imatrix.reshape(-1, QK_K), (rows.shape[0], 1))
        out = _SUPER[t.name](blocks, imat)
    else:
        out = _SMALL[t.name](rows, imatrix, n)
    return out.reshape(*lead, -1)


# --- the presets: which tensor gets which type (llama.cpp's llama_tensor_get_type) -------------

PRESETS = {"q4_k_s": "q4_k", "q4_k_m": "q4_k", "q5_k_s": "q5_k", "q5_k_m": "q5_k", "q6_k": "q6_k"}
FALLBACK = {"q4_k": "q5_0", "q5_k": "q5_1", "q6_k": "q8_0"}  # rows that are not a multiple of 256
_LAYER = re.compile(r"^blk\.(\d+)\.")


def more_bits(layer: int, n_layers: int) -> bool:
    """llama.cpp's use_more_bits: the first and last eighth of the layers and every third between."""
    return layer < n_layers // 8 or layer >= 7 * n_layers // 8 or (layer - n_layers // 8) % 3 == 2


def preset_type(name: str, shape: tuple[int, ...], preset: str, n_layers: int, n_experts: int = 1,
                tied: bool = False) -> str:
    """The type llama-quantize's `preset` gives tensor `name` (a GGUF name; our per-expert names
    `blk.L.ffn_down.E.weight` count as the layer's stacked tensor) of `shape` (..., n)."""
    base = PRESETS[preset]
    new = base
    layer = int(m.group(1)) if (m := _LAYER.match(name)) else 0
    if name == "output.weight" or (tied and name == "token_embd.weight"):
        new = "q8_0" if shape[-1] % QK_K else "q6_k"
        return new if shape[-1] % 32 == 0 else "f16"
    if name == "token_embd.weight":
        pass
    elif "attn_v.weight" in name:
        if preset in ("q4_k_m", "q5_k_m") and more_bits(layer, n_layers):
            new = "q6_k"
        elif preset == "q4_k_s" and layer < 4:
            new = "q5_k"
        if n_experts == 8:
            new = "q8_0"
    elif "attn_k.weight" in name:
        if n_experts == 8:
            new = "q8_0"
    elif "ffn_down" in name:
        if preset == "q4_k_m" and more_bits(layer, n_layers):
            new = "q6_k"
        elif preset == "q5_k_m" and more_bits(layer, n_layers):
            new = "q6_k"
        elif preset == "q4_k_s" and layer < n_layers // 8:
            new = "q5_k"
    elif "attn_output.weight" in name:
        if n_experts == 8 and preset in ("q4_k_s", "q4_k_m"):
            new = "q5_k"
    if shape[-1] % QK_K and new in FALLBACK:
        new = FALLBACK[new]
    if shape[-1] % quant.get(new).block_size:
        new = "f16"  # llama.cpp: "must use F16 due to unusual shape"
    return new
