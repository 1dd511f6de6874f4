"""The numpy twin of each kernel in cpu.py: slow, obvious, and what the tests compare against."""
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


def swiglu(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    return gate / (1.0 + np.exp(-gate)) * up
