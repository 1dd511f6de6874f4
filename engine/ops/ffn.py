"""Feed-forward pieces the 2026 architectures add: gpt_oss's clamped SwiGLU with biases (numpy twin +
kernel), GELU-tanh (gemma4), and the routers that are not plain softmax-top-k: gpt_oss (linear
with bias, softmax over the chosen k), lfm2 (sigmoid, chosen by sigmoid + expert_bias, weights
without the bias), gemma4 (unscaled rmsnorm, * scale * H^-1/2, softmax, top-k renormalised,
* per_expert_scale). qwen3.5's router is Qwen3-MoE's (softmax, top-k renormalised) plus the
shared expert scaled by sigmoid(shared_expert_gate . x)."""
from __future__ import annotations

import numpy as np
from numba import njit, prange

import engine.kernels.ready  # noqa: F401  (engine.kernels.setup() first: fails otherwise)
from engine.ops.norms import rms


def clamped_swiglu_ref(gate_up: np.ndarray, alpha: float, limit: float) -> np.ndarray:
    """gpt-oss: gate_up (..., 2I) interleaved (gate = [::2], up = [1::2]) -> (..., I)."""
    gate = np.minimum(gate_up[..., ::2], limit)
    up = np.clip(gate_up[..., 1::2], -limit, limit)
    return ((up + 1) * gate / (1 + np.exp(-alpha * gate.astype(np.float64)))).astype(np.float32)


@njit(parallel=True, fastmath=True, cache=True, nogil=True)
def clamped_swiglu(gate_up, alpha, limit, out):
    # gate_up (T, 2I) f32 with gate and up interleaved per column pair; out (T, I)
    T, I2 = gate_up.shape
    for t in prange(T):
        for i in range(I2 // 2):
            gt = min(gate_up[t, 2 * i], limit)
            up = max(-limit, min(gate_up[t, 2 * i + 1], limit))
            out[t, i] = (up + 1) * gt / (1 + np.exp(-alpha * gt))


@njit(parallel=True, fastmath=True, cache=True, nogil=True)
def biased_clamped_swiglu(gate, up, gate_bias, up_bias, alpha, limit, out):
    """gpt-oss's expert activation from its gate and up projections, biases added and clamped in one
    pass (no interleaved temporary); numpy twin: clamped_swiglu_ref."""
    # gate, up, out (T, I) f32; gate_bias, up_bias (I,) f32
    T, n = gate.shape
    for t in prange(T):
        for i in range(n):
            gt = min(gate[t, i] + gate_bias[i], limit)
            u = max(-limit, min(up[t, i] + up_bias[i], limit))
            out[t, i] = (u + 1) * gt / (1 + np.exp(-alpha * gt))


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    """numpy twin of gelu_mul's activation (float64 inside, as transformers' f32 gelu rounds)."""
    x64 = x.astype(np.float64)
    return (0.5 * x64 * (1 + np.tanh(np.sqrt(2 / np.pi) * (x64 + 0.044715 * x64 ** 3)))).astype(np.float32)


GELU_C = float(np.sqrt(2 / np.pi))


@njit(parallel=True, fastmath=False, cache=True, nogil=True)
def gelu_mul(gate, up, out):
    """out = gelu_tanh(gate) * up in one pass (Gemma 4's MLPs), instead of numpy's five
    temporaries per call: numpy twin gelu_tanh(gate) * up."""
    # gate, up, out (T, F) float32, C-contiguous: walked as one flat run of T*F values
    g, u, o = gate.reshape(-1), up.reshape(-1), out.reshape(-1)
    for i in prange(g.shape[0]):
        x = np.float64(g[i])
        a = np.float32(0.5 * x * (1.0 + np.tanh(GELU_C * (x + 0.044715 * (x * x * x)))))
        o[i] = a * u[i]


def _topk(scores: np.ndarray, k: int) -> np.ndarray:
    return np.argsort(-scores, axis=-1, kind="stable")[..., :k]


def route_gpt_oss(x: np.ndarray, w: np.ndarray, b: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """-> logits (T, E), ids (T, k), weights (T, k): softmax over the k chosen logits."""
    logits = (x @ w.T + b).astype(np.float32)
    ids, weights = pick_topk_softmax(logits, k)
    return logits, ids, weights


def pick_topk_softmax(logits: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(T, E) router logits -> ids (T, k) of the k largest, weights (T, k) their softmax."""
    ids = _topk(logits, k)
    top = np.take_along_axis(logits, ids, -1).astype(np.float64)
    e = np.exp(top - top.max(-1, keepdims=True))
    return ids, (e / e.sum(-1, keepdims=True)).astype(np.float32)


def route_softmax(x: np.ndarray, w: np.ndarray, k: int, renormalise: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """qwen3.5 (Qwen3-MoE): softmax over all experts, top-k, renormalised."""
    logits = (x @ w.T).astype(np.float32)
    p = np.exp(logits.astype(np.float64) - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    ids = _topk(p, k)
    top = np.take_along_axis(p, ids, -1)
    return logits, ids, (top / top.sum(-1, keepdims=True) if renormalise else top).astype(np.float32)


def route_sigmoid_bias(x: np.ndarray, w: np.ndarray, bias: np.ndarray, k: int, renormalise: bool = True,
                       scaling: float = 1.0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """lfm2: chosen by sigmoid(logits) + bias; weights are the sigmoids (+1e-6 renormalised) * scaling."""
    logits = (x @ w.T).astype(np.float32)
    ids, weights = pick_sigmoid_bias(logits, bias, k, renormalise, scaling)
    return logits, ids, weights


def pick_sigmoid_bias(logits: np.ndarray, bias: np.ndarray, k: int, renormalise: bool = True,
                      scaling: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """(T, E) router logits -> ids (T, k) chosen by sigmoid + bias, weights (T, k) from the
    unbiased sigmoids (renormalised with +1e-6 as transformers does, times scaling)."""
    s = 1 / (1 + np.exp(-logits.astype(np.float64)))
    ids = _topk(s + bias, k)
    top = np.take_along_axis(s, ids, -1)
    if renormalise:
        top = top / (top.sum(-1, keepdims=True) + 1e-6)
    return ids, (top * scaling).astype(np.float32)


def route_gemma4(x: np.ndarray, proj: np.ndarray, scale: np.ndarray, per_expert_scale: np.ndarray, k: int,
                 eps: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """gemma4: rms(x) (no weight) * scale * H^-1/2 -> proj -> softmax -> top-k renormalised, * per-expert scale.
    Returns the probabilities (what transformers records as router logits), ids, weights."""
    h = rms(x, eps) * scale * np.float32(x.shape[-1] ** -0.5)
    logits = (h @ proj.T).astype(np.float64)
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    ids, weights = pick_gemma4(logits, per_expert_scale, k)
    return p.astype(np.float32), ids, weights


def pick_gemma4(logits: np.ndarray, per_expert_scale: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(T, E) router logits -> ids (T, k) of the top-k softmax, weights (T, k) renormalised to sum
    1 and times each expert's scale."""
    logits = logits.astype(np.float64)
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    ids = _topk(p, k)
    top = np.take_along_axis(p, ids, -1)
    return ids, (top / top.sum(-1, keepdims=True) * per_expert_scale[ids]).astype(np.float32)


@njit(parallel=True, fastmath=False, cache=True, nogil=True)
def take_rows(x, rows, out):
    """out (m, n) = x[rows] (x (T, n) f32 C-contiguous, rows (m,) int64): a prompt's tokens of one
    expert gathered on every thread (numpy's fancy indexing runs on one)."""
    for i in prange(rows.shape[0]):
        r = rows[i]
        for j in range(x.shape[1]):
            out[i, j] = x[r, j]


@njit(parallel=True, fastmath=False, cache=True, nogil=True)  # out + w·y rounded as numpy's `out[rows] += w * y`
def add_weighted_rows(out, rows, weights, y):
    """out[rows[i]] += weights[i] · y[i] (out (T, n), y (m, n) f32 C-contiguous; rows distinct): an
    expert's outputs scattered back to its tokens, weighted, on every thread."""
    for i in prange(rows.shape[0]):
        r, w = rows[i], weights[i]
        for j in range(out.shape[1]):
            out[r, j] += w * y[i, j]
