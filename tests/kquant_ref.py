"""Pure-numpy reference quantizers for the GGUF K-quant types Q4_K, Q5_K and Q6_K.

The ``gguf`` package (0.19) can *dequantize* every K-quant but ``gguf.quants.quantize``
raises ``NotImplementedError`` for them.  Tests need real K-quant bytes, so this module
produces them.  The search is a simplified version of what llama.cpp does (least-squares
refinement over a small grid of candidate scales, unweighted) -- not bit-identical to
``llama-quantize`` but it writes the exact block layout that ``gguf.quants.dequantize``
(and llama.cpp) read.

Output convention is the same as ``gguf.quants.quantize`` for the simple types: a uint8
array of shape ``(*data.shape[:-1], row_bytes)`` where ``row_bytes = n_cols // 256 *
type_size``.

Block layouts (QK_K = 256 values per super-block), as ``gguf.quants`` decodes them:

* Q4_K, 144 bytes: ``d: f16 | dmin: f16 | scales: 12 B | qs: 128 B``.  8 sub-blocks of 32;
  6-bit scale ``sc[j]`` and min ``m[j]`` packed in ``scales``; value =
  ``d*sc[j]*q - dmin*m[j]``, ``q`` in 0..15; ``qs[32*g + i]`` holds sub-block ``2g`` in
  its low nibble and ``2g+1`` in its high nibble.
* Q5_K, 176 bytes: ``d | dmin | scales: 12 B | qh: 32 B | qs: 128 B``.  As Q4_K but
  ``q = nibble | (bit j of qh[i]) << 4`` in 0..31 for element ``i`` of sub-block ``j``.
* Q6_K, 210 bytes: ``ql: 128 B | qh: 64 B | scales: 16 x int8 | d: f16``.  16 sub-blocks of
  16; value = ``d*scales[k]*(q - 32)``, ``q`` in 0..63; element ``e = 128*h + 32*s + i``
  (h in 0..1, s in 0..3, i in 0..31) has low nibble ``ql[64*h + 32*(s%2) + i] >> 4*(s//2)``
  and high two bits ``qh[32*h + i] >> 2*s``.
"""

from __future__ import annotations

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf import quants as _gq

QK_K = 256
K_SCALE_SIZE = 12

__all__ = [
    "KQUANT_TYPES",
    "quantize",
    "quantize_q4_k",
    "quantize_q5_k",
    "quantize_q6_k",
    "can_quantize",
    "pack_k_scales",
]


def _round(x: np.ndarray) -> np.ndarray:
    """Round half away from zero, like llama.cpp's nearest_int / gguf's np_roundf."""
    return np.sign(x) * np.floor(np.abs(x) + 0.5)


def _f16(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, dtype=np.float32).astype(np.float16)


def _rows(data: np.ndarray) -> tuple[np.ndarray, tuple[int, ...]]:
    data = np.asarray(data, dtype=np.float32)
    if data.ndim == 0 or data.shape[-1] % QK_K != 0:
        raise ValueError(f"K-quant row length must be a multiple of {QK_K}, got shape {data.shape}")
    return data.reshape(-1, QK_K), data.shape


def _out_shape(shape: tuple[int, ...], qtype: GGMLQuantizationType) -> tuple[int, ...]:
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    return (*shape[:-1], shape[-1] // block_size * type_size)


# ---------------------------------------------------------------------------------------
# asymmetric sub-block fit (Q4_K / Q5_K)
# ---------------------------------------------------------------------------------------

def _fit_scale_min(x: np.ndarray, nmax: int, rmin: float, rdelta: float,
                   nstep: int) -> tuple[np.ndarray, np.ndarray]:
    """Fit ``x ~= scale * l - mn`` (l integer in 0..nmax, mn >= 0) per sub-block.

    ``x`` has shape (n, sub_len).  Returns (scale, mn), each shape (n,), both >= 0.
    Mirrors llama.cpp's make_qkx2_quants with unit weights: start from the plain
    min/max grid, then try ``nstep`` stretched grids, each refined by a least-squares fit
    of (scale, min) for the rounded levels, keeping the lowest squared error.
    """
    n, k = x.shape
    xmin = np.minimum(x.min(axis=1), 0.0)
    xmax = x.max(axis=1)
    span = xmax - xmin
    flat = span <= 0
    span_safe = np.where(flat, 1.0, span)

    sum_x = x.sum(axis=1)

    best_scale = span / nmax
    best_min = xmin.copy()  # as an additive offset (<= 0): x ~= scale*l + min
    l0 = np.clip(_round((x - xmin[:, None]) * (nmax / span_safe)[:, None]), 0, nmax)
    best_err = ((best_scale[:, None] * l0 + best_min[:, None] - x) ** 2).sum(axis=1)

    for step in range(nstep + 1):
        iscale = (rmin + rdelta * step + nmax) / span_safe
        l = np.clip(_round(iscale[:, None] * (x - xmin[:, None])), 0, nmax)
        sum_l = l.sum(axis=1)
        sum_l2 = (l * l).sum(axis=1)
        sum_xl = (l * x).sum(axis=1)
        det = k * sum_l2 - sum_l * sum_l
        ok = det > 0
        det_safe = np.where(ok, det, 1.0)
        scale = (k * sum_xl - sum_l * sum_x) / det_safe
        mn = (sum_l2 * sum_x - sum_l * sum_xl) / det_safe
        pos = mn > 0
        # an offset above zero cannot be stored (m >= 0): refit the scale alone
        scale = np.where(pos, sum_xl / np.where(sum_l2 > 0, sum_l2, 1.0), scale)
        mn = np.where(pos, 0.0, mn)
        err = ((scale[:, None] * l + mn[:, None] - x) ** 2).sum(axis=1)
        better = ok & (err < best_err) & (scale >= 0)
        best_err = np.where(better, err, best_err)
        best_scale = np.where(better, scale, best_scale)
        best_min = np.where(better, mn, best_min)

    best_scale = np.where(flat, 0.0, best_scale)
    return np.maximum(best_scale, 0.0).astype(np.float32), (-best_min).astype(np.float32)


def pack_k_scales(sc: np.ndarray, mn: np.ndarray) -> np.ndarray:
    """Pack 8 six-bit scales and 8 six-bit mins per block into the 12-byte Q4_K/Q5_K field."""
    sc = sc.astype(np.uint8)
    mn = mn.astype(np.uint8)
    out = np.empty((sc.shape[0], K_SCALE_SIZE), dtype=np.uint8)
    out[:, 0:4] = (sc[:, 0:4] & 0x3F) | ((sc[:, 4:8] >> 4) << 6)
    out[:, 4:8] = (mn[:, 0:4] & 0x3F) | ((mn[:, 4:8] >> 4) << 6)
    out[:, 8:12] = (sc[:, 4:8] & 0x0F) | ((mn[:, 4:8] & 0x0F) << 4)
    return out


def _quantize_qkx(data: np.ndarray, nmax: int, rmin: float, rdelta: float, nstep: int):
    blocks, shape = _rows(data)
    nb = blocks.shape[0]
    sub = blocks.reshape(nb * 8, 32)
    scale, mn = _fit_scale_min(sub, nmax, rmin, rdelta, nstep)
    scale = scale.reshape(nb, 8)
    mn = mn.reshape(nb, 8)

    max_scale = scale.max(axis=1)
    max_min = mn.max(axis=1)
    inv_s = np.where(max_scale > 0, 63.0 / np.where(max_scale > 0, max_scale, 1.0), 0.0)
    inv_m = np.where(max_min > 0, 63.0 / np.where(max_min > 0, max_min, 1.0), 0.0)
    ls = np.clip(_round(scale * inv_s[:, None]), 0, 63).astype(np.uint8)
    lm = np.clip(_round(mn * inv_m[:, None]), 0, 63).astype(np.uint8)
    d16 = _f16(max_scale / 63.0)
    dmin16 = _f16(max_min / 63.0)

    # final levels with the scales exactly as they will be decoded
    dl = d16.astype(np.float32)[:, None] * ls.astype(np.float32)  # (nb, 8)
    dm = dmin16.astype(np.float32)[:, None] * lm.astype(np.float32)
    x = blocks.reshape(nb, 8, 32)
    dl_safe = np.where(dl > 0, dl, 1.0)
    q = np.clip(_round((x + dm[:, :, None]) / dl_safe[:, :, None]), 0, nmax)
    q = np.where((dl > 0)[:, :, None], q, 0).astype(np.uint8)
    return shape, nb, d16, dmin16, pack_k_scales(ls, lm), q


def quantize_q4_k(data: np.ndarray) -> np.ndarray:
    shape, nb, d16, dmin16, scales, q = _quantize_qkx(data, 15, -1.0, 0.1, 20)
    qs = (q[:, 0::2, :] | (q[:, 1::2, :] << 4)).reshape(nb, 128)
    out = np.concatenate(
        [d16.reshape(nb, 1).view(np.uint8), dmin16.reshape(nb, 1).view(np.uint8), scales, qs], axis=1
    )
    assert out.shape[1] == GGML_QUANT_SIZES[GGMLQuantizationType.Q4_K][1]
    return out.reshape(_out_shape(shape, GGMLQuantizationType.Q4_K))


def quantize_q5_k(data: np.ndarray) -> np.ndarray:
    shape, nb, d16, dmin16, scales, q = _quantize_qkx(data, 31, -0.5, 0.1, 15)
    low = q & 0x0F
    qs = (low[:, 0::2, :] | (low[:, 1::2, :] << 4)).reshape(nb, 128)
    hi = (q >> 4) & 0x01  # (nb, 8, 32)
    qh = np.zeros((nb, 32), dtype=np.uint8)
    for j in range(8):
        qh |= (hi[:, j, :] << j).astype(np.uint8)
    out = np.concatenate(
        [d16.reshape(nb, 1).view(np.uint8), dmin16.reshape(nb, 1).view(np.uint8), scales, qh, qs], axis=1
    )
    assert out.shape[1] == GGML_QUANT_SIZES[GGMLQuantizationType.Q5_K][1]
    return out.reshape(_out_shape(shape, GGMLQuantizationType.Q5_K))


# ---------------------------------------------------------------------------------------
# symmetric sub-block fit (Q6_K)
# ---------------------------------------------------------------------------------------

def _fit_symmetric(x: np.ndarray, nmax: int) -> np.ndarray:
    """Per-row signed scale for ``x ~= scale * l``, l in -nmax..nmax-1.

    llama.cpp's make_qx_quants (rmse_type 1) with unit weights.
    """
    idx = np.abs(x).argmax(axis=1)
    vmax = x[np.arange(x.shape[0]), idx]
    zero = np.abs(vmax) < 1e-30
    vmax_safe = np.where(zero, 1.0, vmax)
    best_scale = np.zeros(x.shape[0], dtype=np.float64)
    best_err = np.full(x.shape[0], np.inf)
    for step in range(-9, 10):
        iscale = -(nmax + 0.1 * step) / vmax_safe
        l = np.clip(_round(iscale[:, None] * x), -nmax, nmax - 1)
        sum_l2 = (l * l).sum(axis=1)
        sum_xl = (x * l).sum(axis=1)
        scale = sum_xl / np.where(sum_l2 > 0, sum_l2, 1.0)
        err = ((x - scale[:, None] * l) ** 2).sum(axis=1)
        better = err < best_err
        best_err = np.where(better, err, best_err)
        best_scale = np.where(better, scale, best_scale)
    return np.where(zero, 0.0, best_scale).astype(np.float32)


def quantize_q6_k(data: np.ndarray) -> np.ndarray:
    blocks, shape = _rows(data)
    nb = blocks.shape[0]
    sub = blocks.reshape(nb * 16, 16)
    scale = _fit_symmetric(sub, 32).reshape(nb, 16)

    # the scale with the largest magnitude maps to int8 -128 (as llama.cpp does)
    idx = np.abs(scale).argmax(axis=1)
    smax = scale[np.arange(nb), idx]
    nz = np.abs(smax) > 0
    iscale = np.where(nz, -128.0 / np.where(nz, smax, 1.0), 0.0)
    sc = np.clip(_round(scale * iscale[:, None]), -128, 127).astype(np.int8)
    d16 = _f16(np.where(nz, 1.0 / np.where(nz, iscale, 1.0), 0.0))

    dl = d16.astype(np.float32)[:, None] * sc.astype(np.float32)  # (nb, 16)
    x = blocks.reshape(nb, 16, 16)
    dl_safe = np.where(dl != 0, dl, 1.0)
    q = np.clip(_round(x / dl_safe[:, :, None]), -32, 31)
    q = np.where((dl != 0)[:, :, None], q, 0)
    L = (q + 32).astype(np.uint8).reshape(nb, 2, 4, 32)  # element e = 128*h + 32*s + i

    low = L & 0x0F
    ql = (low[:, :, 0:2, :] | (low[:, :, 2:4, :] << 4)).reshape(nb, 128)
    hi = L >> 4
    qh = hi[:, :, 0, :] | (hi[:, :, 1, :] << 2) | (hi[:, :, 2, :] << 4) | (hi[:, :, 3, :] << 6)
    qh = qh.reshape(nb, 64).astype(np.uint8)
    out = np.concatenate([ql, qh, sc.view(np.uint8), d16.reshape(nb, 1).view(np.uint8)], axis=1)
    assert out.shape[1] == GGML_QUANT_SIZES[GGMLQuantizationType.Q6_K][1]
    return out.reshape(_out_shape(shape, GGMLQuantizationType.Q6_K))


KQUANT_TYPES = {
    GGMLQuantizationType.Q4_K: quantize_q4_k,
    GGMLQuantizationType.Q5_K: quantize_q5_k,
    GGMLQuantizationType.Q6_K: quantize_q6_k,
}


def can_quantize(shape: tuple[int, ...], qtype: GGMLQuantizationType) -> bool:
    """True when a tensor of this (numpy) shape can be stored as ``qtype`` (row length % block size == 0)."""
    if qtype in (GGMLQuantizationType.F32, GGMLQuantizationType.F16):
        return True
    block_size, _ = GGML_QUANT_SIZES[qtype]
    return len(shape) > 0 and shape[-1] % block_size == 0


def quantize(data: np.ndarray, qtype: GGMLQuantizationType) -> np.ndarray:
    """``gguf.quants.quantize`` extended with Q4_K / Q5_K / Q6_K.

    Returns float32/float16 arrays for F32/F16 and uint8 row bytes for block types.
    """
    qtype = GGMLQuantizationType(qtype)
    if qtype in KQUANT_TYPES:
        return KQUANT_TYPES[qtype](data)
    return _gq.quantize(np.asarray(data, dtype=np.float32), qtype)
