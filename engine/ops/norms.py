"""RMSNorm variants of the 2026 architectures (numpy; an engine fuses them into its row kernels):
plain x * w (gpt_oss, lfm2, gemma4), zero-centred x * (1 + w) (qwen3.5's layer/q/k norms),
unscaled (gemma4's v_norm and router norm), gated rmsnorm(x) * w * silu(z) (qwen3.5's DeltaNet
output), l2norm, and tanh softcapping (gemma4's final logits)."""
from __future__ import annotations

import numpy as np


def rms(x: np.ndarray, eps: float) -> np.ndarray:
    x = x.astype(np.float32)
    return (x / np.sqrt(np.mean(x.astype(np.float64) ** 2, axis=-1, keepdims=True) + eps)).astype(np.float32)


def rmsnorm(x: np.ndarray, w: np.ndarray | None, eps: float, zero_centred: bool = False) -> np.ndarray:
    """x (..., n); w (n,) or None (no scale); zero_centred: x * (1 + w)."""
    y = rms(x, eps)
    if w is None:
        return y
    return (y * ((1.0 + w) if zero_centred else w)).astype(np.float32)


def gated_rmsnorm(x: np.ndarray, z: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """qwen3.5 DeltaNet output: rmsnorm(x) * w * silu(z), per head (x, z (..., dv))."""
    return (rms(x, eps) * w * (z / (1 + np.exp(-z.astype(np.float64))))).astype(np.float32)


def softcap(x: np.ndarray, cap: float) -> np.ndarray:
    """cap * tanh(x / cap) (gemma4's final logits: cap 30 in the released model)."""
    return (cap * np.tanh(x.astype(np.float64) / cap)).astype(np.float32)
