"""Rotary position tables for the rope variants of the 2026 architectures.

Every variant reduces to inverse frequencies `inv_freq` (rot/2,) and an attention factor: the table
is cos/sin(pos * inv_freq) * factor, applied to the first `rot` dims of each head as NeoX halves;
the other dims pass through. gemma4's "proportional" rope is rot = head_dim with zero frequencies
for the pairs that do not turn.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

import engine.kernels.ready  # noqa: F401  (engine.kernels.setup() first: fails otherwise)


def default_inv_freq(theta: float, head_dim: int, partial_rotary_factor: float = 1.0) -> np.ndarray:
    """1 / theta^(2i/rot) for i < ceil(rot/2), rot = int(head_dim * partial) (Llama; qwen3.5: 0.25). An
    odd rot is taken as transformers takes it: its ceil(rot/2) frequencies turn the first rot + 1 dims."""
    rot = int(head_dim * partial_rotary_factor)
    if rot <= 0 or rot + rot % 2 > head_dim:
        raise ValueError(f"rope: head_dim {head_dim} x partial_rotary_factor {partial_rotary_factor} = {rot} "
                         f"rotating dims; it must be from 1 to head_dim (and below it when odd)")
    return (1.0 / theta ** (np.arange(0, rot, 2, dtype=np.float32) / np.float32(rot))).astype(np.float32)


def yarn_inv_freq(theta: float, head_dim: int, factor: float, original_max_position_embeddings: int,
                  beta_fast: float = 32.0, beta_slow: float = 1.0, truncate: bool = True,
                  attention_factor: float | None = None, partial_rotary_factor: float = 1.0
                  ) -> tuple[np.ndarray, float]:
    """YaRN (gpt-oss: factor 32, beta 32/1, truncate False): frequencies that turn fewer than
    beta_slow times over the original context are divided by `factor`, those turning more than
    beta_fast times are kept, a linear ramp between; cos/sin are scaled by 0.1 ln(factor) + 1."""
    dim = int(head_dim * partial_rotary_factor)
    base = np.float32(theta) ** (np.arange(0, dim, 2, dtype=np.float32) / np.float32(dim))
    extra, inter = (1.0 / base).astype(np.float32), (1.0 / (np.float32(factor) * base)).astype(np.float32)

    def corr(rot: float) -> float:
        return dim * math.log(original_max_position_embeddings / (rot * 2 * math.pi)) / (2 * math.log(theta))
    low, high = corr(beta_fast), corr(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(dim // 2, dtype=np.float32) - np.float32(low)) / np.float32(high - low), 0, 1)
    keep = (1 - ramp).astype(np.float32)  # 1: extrapolate (keep), 0: interpolate (/factor)
    inv = (inter * (1 - keep) + extra * keep).astype(np.float32)
    if attention_factor is None:
        attention_factor = 0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0
    return inv, float(attention_factor)


def proportional_inv_freq(theta: float, head_dim: int, partial_rotary_factor: float,
                          factor: float = 1.0) -> np.ndarray:
    """gemma4's full-attention rope: the first int(partial * head_dim / 2) pairs turn with exponents
    over the WHOLE head_dim (not the rotating part), the rest are zero; rot = head_dim."""
    angles = int(partial_rotary_factor * head_dim // 2)
    turn = 1.0 / theta ** (np.arange(0, 2 * angles, 2, dtype=np.float32) / np.float32(head_dim))
    inv = np.concatenate([turn.astype(np.float32), np.zeros(head_dim // 2 - angles, np.float32)])
    return (inv / np.float32(factor)).astype(np.float32)


def tables(inv_freq: np.ndarray, positions: np.ndarray, attention_factor: float = 1.0
           ) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin (T, rot/2) float32 for integer positions (T,), computed as transformers does: f32."""
    freqs = positions.astype(np.float32)[:, None] * inv_freq.astype(np.float32)[None, :]
    f = np.float32(attention_factor)
    return (np.cos(freqs) * f).astype(np.float32), (np.sin(freqs) * f).astype(np.float32)


def rope_ref(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """numpy twin of rope(): x (T, H, hd), cos/sin (T, rot/2) -> rotated copy."""
    half = cos.shape[-1]
    a, b = x[..., :half], x[..., half:2 * half]
    c, s = cos[:, None, :], sin[:, None, :]
    return np.concatenate([a * c - b * s, b * c + a * s, x[..., 2 * half:]], axis=-1).astype(np.float32)


@njit(parallel=True, fastmath=True, cache=True, nogil=True)
def rope(x, cos, sin):
    # x (T, H, hd) f32 C-order, rotated in place on its first 2*half dims; cos/sin (T, half)
    T, H, _ = x.shape
    half = cos.shape[1]
    for t in prange(T):
        for h in range(H):
            for i in range(half):
                a, b = x[t, h, i], x[t, h, i + half]
                x[t, h, i] = a * cos[t, i] - b * sin[t, i]
                x[t, h, i + half] = b * cos[t, i] + a * sin[t, i]
