"""Causal depthwise conv1d with a carried state: qwen3.5's DeltaNet conv over [q|k|v] (kernel 4,
SiLU) and LFM2's short conv (kernel 3, no activation). y[t, c] = sum_j w[c, j] * x[t - K + 1 + j, c],
inputs before the first token taken from the state (zeros in a new conversation), so a chunked
prefill followed by one-token decode steps gives exactly the one-pass result."""
from __future__ import annotations

import numpy as np
from numba import njit, prange

import engine.kernels.ready  # noqa: F401  (engine.kernels.setup() first: fails otherwise)


def causal_conv_ref(x: np.ndarray, w: np.ndarray, state: np.ndarray, silu: bool) -> tuple[np.ndarray, np.ndarray]:
    """numpy twin: x (T, C), w (C, K), state (K-1, C) -> y (T, C), new state (K-1, C)."""
    K = w.shape[1]
    full = np.concatenate([state, x]).astype(np.float64)
    y = np.zeros(x.shape, np.float64)
    for j in range(K):
        y += full[j:j + len(x)] * w[:, j]
    if silu:
        y = y / (1 + np.exp(-y))
    return y.astype(np.float32), full[len(full) - (K - 1):].astype(np.float32)


@njit(parallel=True, fastmath=True, cache=True, nogil=True)
def causal_conv(x, w, state, silu, out):
    # x (T, C), w (C, K), state (K-1, C) f32, oldest first, updated in place; out (T, C)
    T, C = x.shape
    K = w.shape[1]
    for c in prange(C):
        for t in range(T):
            acc = np.float32(0.0)
            for j in range(K):
                src = t - (K - 1) + j  # < 0: from the state
                acc += w[c, j] * (x[src, c] if src >= 0 else state[K - 1 + src, c])
            out[t, c] = acc / (1 + np.exp(-acc)) if silu else acc
        for j in range(K - 1):  # the new tail: the last K-1 inputs of state + x
            src = T - (K - 1) + j
            state[j, c] = x[src, c] if src >= 0 else state[j + T, c]


def short_conv(x: np.ndarray, w: np.ndarray, state: np.ndarray, silu: bool = False) -> np.ndarray:
    """causal_conv() with its shapes checked and its output allocated; the state is updated in place."""
    C, K = w.shape
    if x.ndim != 2 or x.shape[1] != C or state.shape != (K - 1, C) or state.dtype != np.float32:
        raise ValueError(f"causal conv: x {x.shape}, w {w.shape}, state {state.shape} {state.dtype} do not fit: "
                         "need x (T, C), w (C, K), a float32 state (K-1, C)")
    out = np.empty(x.shape, np.float32)
    causal_conv(np.ascontiguousarray(x, np.float32), np.ascontiguousarray(w, np.float32), state, silu, out)
    return out
