"""The numpy twin of each kernel in cpu.py (formats, matmul, smallops): slow, obvious, and what the tests compare against."""
from __future__ import annotations

import numpy as np

from engine import quant


def matmul(w: np.ndarray, qtype: str, n: int, x: np.ndarray) -> np.ndarray:
    stored = w.view(quant.get(qtype).storage).reshape(w.shape[0], -1) if not quant.get(qtype).is_block else w
    return x @ quant.dequantize(stored, qtype).reshape(w.shape[0], n).T


def rmsnorm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    return weight * (x / np.sqrt(np.mean(x.astype(np.float64) ** 2, axis=-1, keepdims=True) + eps)).astype(np.float32)


def rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    half = x.shape[-1] // 2
    a, b = x[..., :half], x[..., half:]
    c, s = cos[:, None, :], sin[:, None, :]
    return np.concatenate([a * c - b * s, b * c + a * s], axis=-1)


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, pos0: int, window: int, scale: float) -> np.ndarray:
    T, H, hd = q.shape
    group = H // k.shape[1]
    out = np.zeros_like(q)
    for t in range(T):
        last = pos0 + t
        first = max(0, last - window + 1) if window > 0 else 0
        for h in range(H):
            s = k[first:last + 1, h // group] @ q[t, h] * scale
            p = np.exp(s - s.max())
            out[t, h] = (p / p.sum()) @ v[first:last + 1, h // group]
    return out


def store_f16(src: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):  # (past 65504: infinity, as the kernel)
        return src.astype(np.float16).view(np.uint16)


def swiglu(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    return gate / (1.0 + np.exp(-gate)) * up


def int_product(w: np.ndarray, qtype: str, x: np.ndarray) -> np.ndarray:
    """x @ W.T with int8 activations for W stored in the integer format qtype: its "matmul" twin in the
    kernel table (engine/kernels/table.py), whichever module that is (the fused kernels read the same)."""
    from engine.kernels import table
    return table.resolve(table.lookup("matmul", qtype).twin)(w, qtype, x)


def swiglu_int(ws: tuple[np.ndarray, np.ndarray], qtype: str, x: np.ndarray) -> np.ndarray:
    """silu(x @ Wg.T) · (x @ Wu.T) for ws = (gate, up) stored in the integer format qtype: each product
    int_product's, the SwiGLU in float64."""
    g, u = (int_product(w, qtype, x).astype(np.float64) for w in ws)
    return swiglu(g, u).astype(np.float32)


def quantize_activations(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """x (T, n) -> int8 blocks of 32 as llama.cpp's Q8_1: (q, d as a half, d·Σq as a half, Σq)."""
    T, n = x.shape
    g = x.reshape(T, n // 32, 32).astype(np.float32)
    amax = np.abs(g).max(axis=-1)
    d = amax / np.float32(127)
    inv = np.where(amax > 0, np.float32(127) / np.where(amax > 0, amax, 1), 0).astype(np.float32)
    q = np.rint(g * inv[..., None]).astype(np.int8)
    total = q.sum(axis=-1, dtype=np.int32)
    half = lambda v: v.astype(np.float16).astype(np.float32)  # noqa: E731
    return q.reshape(T, n), half(d), half(d * total.astype(np.float32)), total


def quantize_activations_k(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """x (T, n) -> int8 as llama.cpp's Q8_K (per 256: d = -max/127, max the value of largest magnitude),
    in quantize_activations' per-32 arrays: (q, d for each 32, d·Σq as float32, Σq)."""
    T, n = x.shape
    g = x.reshape(T, n // 256, 256).astype(np.float32)
    top = np.take_along_axis(g, np.abs(g).argmax(axis=-1)[..., None], axis=-1)[..., 0]
    with np.errstate(divide="ignore"):
        iscale = np.where(top != 0, np.float32(-127) / top, np.float32(0)).astype(np.float32)
        d = np.where(top != 0, np.float32(1) / iscale, np.float32(0)).astype(np.float32)
    q = np.minimum(np.rint(g * iscale[..., None]), np.float32(127)).astype(np.int8).reshape(T, n // 32, 32)
    total = q.sum(axis=-1, dtype=np.int32)
    d32 = np.repeat(d, 8, axis=-1)
    return q.reshape(T, n), d32, (d32 * total.astype(np.float32)).astype(np.float32), total


def matmul_int(w: np.ndarray, qtype: str, x: np.ndarray) -> np.ndarray:
    """x @ W.T the way the integer kernels compute it: x quantized (quantize_activations), then per
    block d_w·d_x·Σ q_w q_x (+ m_w·s_x for q4_1, - 8·d_w·d_x·Σ q_x for q4_0). q4_0, q4_1, q8_0
    (K-quants: matmul_int_k)."""
    if qtype in ("q4_k", "q5_k", "q6_k"):
        return matmul_int_k(w, qtype, x)
    if qtype in ("q2_k", "q3_k"):
        return matmul_int_low_k(w, qtype, x)
    xq, xd, xs, xi = quantize_activations(x)
    T, nb = xd.shape
    t = quant.get(qtype)
    blocks = w.reshape(w.shape[0], nb, t.type_size)
    f16 = lambda a: a.copy().view(np.float16)[..., 0].astype(np.float64)  # noqa: E731
    d = f16(blocks[..., 0:2])
    if qtype == "q8_0":
        q = blocks[..., 2:].view(np.int8)
    else:
        nib = blocks[..., 4 if qtype == "q4_1" else 2:]
        q = np.concatenate([nib & 15, nib >> 4], axis=-1)
    isum = np.einsum("rbj,tbj->trb", q.astype(np.int64), xq.reshape(T, nb, 32).astype(np.int64))
    scale = d[None] * xd.astype(np.float64)[:, None, :]
    out = (scale * isum).sum(axis=-1)
    if qtype == "q4_0":
        out -= (8 * scale * xi[:, None, :]).sum(axis=-1)
    elif qtype == "q4_1":
        out += (f16(blocks[..., 2:4])[None] * xs.astype(np.float64)[:, None, :]).sum(axis=-1)
    return out.astype(np.float32)


def softmax_top_k(logits: np.ndarray, k: int, renormalise: bool) -> tuple[np.ndarray, np.ndarray]:
    e = np.exp(logits - logits.max(axis=-1, keepdims=True))
    probs = e / e.sum(axis=-1, keepdims=True)
    ids = np.argsort(-probs, axis=-1, kind="stable")[:, :k]
    w = np.take_along_axis(probs, ids, axis=-1)
    if renormalise:
        w = w / w.sum(axis=-1, keepdims=True)
    return w.astype(np.float32), ids


def _k_integers(w: np.ndarray, qtype: str) -> tuple[np.ndarray, ...]:
    """A K-quant matrix (rows, row_bytes) -> its integers per sub-block: Q4_K/Q5_K (d, dmin (R, S),
    sc, m (R, S, 8), q (R, S, 8, 32) in 0..15 / 0..31); Q6_K (d (R, S), sc (R, S, 16), q - 32
    (R, S, 16, 16)). S super-blocks of 256 a row."""
    t = quant.get(qtype)
    b = w.reshape(w.shape[0], -1, t.type_size)
    f16 = lambda a: a.copy().view(np.float16)[..., 0].astype(np.float64)  # noqa: E731
    if qtype == "q6_k":
        ql = b[..., :128].reshape(*b.shape[:2], 2, 1, 64) >> np.array([0, 4], np.uint8).reshape(2, 1)
        ql = (ql & 15).reshape(*b.shape[:2], 2, 4, 32)  # (h, s, i): ql[64h + 32(s % 2) + i] >> 4(s // 2)
        qh = b[..., 128:192].reshape(*b.shape[:2], 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(4, 1)
        q = (ql | ((qh & 3) << 4)).astype(np.int64).reshape(*b.shape[:2], 16, 16) - 32
        return f16(b[..., 208:210]), b[..., 192:208].view(np.int8).astype(np.int64), q
    s = b[..., 4:16].astype(np.int64)
    lo_s, lo_m, mix = s[..., 0:4], s[..., 4:8], s[..., 8:12]
    sc = np.concatenate([lo_s & 63, (mix & 15) | ((lo_s >> 6) << 4)], axis=-1)
    m = np.concatenate([lo_m & 63, (mix >> 4) | ((lo_m >> 6) << 4)], axis=-1)
    qs = b[..., 48 if qtype == "q5_k" else 16:].reshape(*b.shape[:2], 4, 1, 32) >> np.array([0, 4], np.uint8).reshape(2, 1)
    q = (qs & 15).astype(np.int64).reshape(*b.shape[:2], 8, 32)  # sub-block 2c: low nibbles of qs[32c..], 2c+1: high
    if qtype == "q5_k":  # bit j of qh[i]: bit 4 of sub-block j's weight i
        q |= ((b[..., None, 16:48].astype(np.int64) >> np.arange(8).reshape(8, 1)) & 1) << 4
    return f16(b[..., 0:2]), f16(b[..., 2:4]), sc, m, q


def matmul_int_k(w: np.ndarray, qtype: str, x: np.ndarray) -> np.ndarray:
    """x @ W.T for a Q4_K/Q5_K/Q6_K matrix the way the kernels compute it (engine.kernels.kquants):
    x quantized per 256 (quantize_activations_k: llama.cpp's Q8_K), per sub-block the exact integer
    sum Σ q_w q_x times d·sc_j·d_x, minus dmin·m_j·d_x·Σq_x (Q4_K, Q5_K); Q6_K: d·sc_k·d_x·Σ (q_w - 32) q_x
    per 16. In float64: the kernels differ from it by float32 rounding only."""
    xq, xd, _, xi = quantize_activations_k(x)
    T = x.shape[0]
    parts = _k_integers(w, qtype)
    S = parts[-1].shape[1]
    dx = xd.astype(np.float64).reshape(T, S, 8)
    if qtype == "q6_k":
        d, sc, q = parts
        isum = np.einsum("rsjk,tsjk->trsj", q, xq.reshape(T, S, 16, 16).astype(np.int64))
        return (d[None, :, :, None] * sc[None] * np.repeat(dx, 2, axis=-1)[:, None] * isum).sum(axis=(2, 3)) \
            .astype(np.float32)
    d, dmin, sc, m, q = parts
    isum = np.einsum("rsjk,tsjk->trsj", q, xq.reshape(T, S, 8, 32).astype(np.int64))
    out = (d[None, :, :, None] * sc[None] * dx[:, None] * isum).sum(axis=(2, 3))
    out -= (dmin[None, :, :, None] * m[None] * (dx * xi.reshape(T, S, 8))[:, None]).sum(axis=(2, 3))
    return out.astype(np.float32)


def matmul_int_low_k(w: np.ndarray, qtype: str, x: np.ndarray) -> np.ndarray:
    """x @ W.T for a Q2_K/Q3_K matrix the way kquants' kernels compute it: x quantized per 256 (Q8_K),
    per sub-block k of 16 the exact integer sum Σ q_w q_x times d·sc_k·d_x (Q3_K: q_w = q + 4h - 4,
    sc six bits - 32; Q2_K: q_w = q, sc the low nibble), minus Q2_K's dmin·m_k·d_x·Σ q_x. Float64."""
    xq, xd, _, _ = quantize_activations_k(x)
    T = x.shape[0]
    t = quant.get(qtype)
    b = w.reshape(w.shape[0], -1, t.type_size)
    R, S = b.shape[:2]
    f16 = lambda a: a.copy().view(np.float16)[..., 0].astype(np.float64)  # noqa: E731
    qs_at = 16 if qtype == "q2_k" else 32
    qs = b[..., qs_at:qs_at + 64].reshape(R, S, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(4, 1)
    q = (qs & 3).astype(np.int64).reshape(R, S, 8, 32)  # activation block j = 4c + s: bits 2s of qs[32c + i]
    if qtype == "q2_k":
        sc, m = (b[..., :16] & 15).astype(np.int64), (b[..., :16] >> 4).astype(np.int64)
        d, dmin = f16(b[..., 80:82]), f16(b[..., 82:84])
    else:
        h = (b[..., None, :32].astype(np.int64) >> np.arange(8).reshape(8, 1)) & 1  # (R, S, j, i)
        q = q + 4 * h - 4
        k = np.arange(16)
        lo = (b[..., 96 + k % 8].astype(np.int64) >> (4 * (k // 8))) & 15
        hi = (b[..., 104 + k % 4].astype(np.int64) >> (2 * (k // 4))) & 3
        sc, m, d, dmin = (lo | hi << 4) - 32, None, f16(b[..., 108:110]), None
    xs = xq.reshape(T, S, 16, 16).astype(np.int64)
    isum = np.einsum("rsjk,tsjk->trsj", q.reshape(R, S, 16, 16), xs)
    dx = np.repeat(xd.astype(np.float64).reshape(T, S, 8), 2, axis=-1)[:, None]
    out = (d[None, :, :, None] * sc[None] * dx * isum).sum(axis=(2, 3))
    if m is not None:
        out -= (dmin[None, :, :, None] * m[None] * dx * xs.sum(axis=-1)[:, None]).sum(axis=(2, 3))
    return out.astype(np.float32)
