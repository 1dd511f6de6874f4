"""The weight value types every part of the engine passes around: a stored matrix, one expert,
one layer, and the expert cache's counters (CacheStats, which the remote path reads without
compiling anything), in their own module so the loaders, the expert cache and the forward pass
import them without importing each other.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Matrix:
    """A stored weight matrix: uint8 (rows, row_bytes) blocks of format `code` (GGML type id)."""
    name: str
    data: np.ndarray
    code: int
    rows: int
    cols: int

    @property
    def nbytes(self) -> int:
        return self.data.nbytes


@dataclass(frozen=True)
class ExpertWeights:
    """One SwiGLU MLP (a routed expert, the shared one, or a dense model's MLP as expert 0)."""
    gate: Matrix
    up: Matrix
    down: Matrix


@dataclass(frozen=True)
class LayerWeights:
    """A decoder layer's resident weights (its routed experts live in the expert cache). A
    short_conv layer (LFM2) has conv_in/conv_w/conv_out instead of q/k/v/o."""
    attn_norm: np.ndarray
    q: Matrix | None
    k: Matrix | None
    v: Matrix | None
    o: Matrix | None
    ffn_norm: np.ndarray
    q_bias: np.ndarray | None = None
    k_bias: np.ndarray | None = None
    v_bias: np.ndarray | None = None
    q_norm: np.ndarray | None = None
    k_norm: np.ndarray | None = None
    router: Matrix | None = None
    shared_gate: np.ndarray | None = None  # Qwen2-MoE: sigmoid gate of the shared expert
    shared: ExpertWeights | None = None
    dense: ExpertWeights | None = None  # a leading dense layer's MLP (no router: dense_layers)
    expert_bias: np.ndarray | None = None  # sigmoid_bias router: added to the scores for selection only
    conv_in: Matrix | None = None  # short_conv: x -> (B, C, x) rows
    conv_w: np.ndarray | None = None  # short_conv: (channels, taps) float32
    conv_out: Matrix | None = None
    o_bias: np.ndarray | None = None  # gpt-oss: the output projection's bias
    sinks: np.ndarray | None = None  # gpt-oss: (heads,) a logit in each head's softmax denominator
    router_bias: np.ndarray | None = None  # gpt-oss: added to the router logits
    expert_biases: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None  # gpt-oss: (E, F), (E, F), (E, D)
    delta: DeltaWeights | None = None  # a linear_attention layer's (instead of q/k/v/o)
    sandwich: SandwichNorms | None = None  # Gemma 4's extra norms and scales
    per_layer: PerLayerInput | None = None  # Gemma 4 E2B/E4B: the layer's own input's gate and projection


@dataclass(frozen=True)
class PerLayerInput:
    """Gemma 4 E2B/E4B: h += norm(proj(gelu(gate h) * this layer's input)), after the feed-forward."""
    gate: Matrix  # (P, D)
    proj: Matrix  # (D, P)
    norm: np.ndarray  # (D,)


@dataclass(frozen=True)
class DeltaWeights:
    """A gated DeltaNet layer (Qwen3.5): llama.cpp's names and value-head order of the source."""
    qkv: Matrix  # x -> q | k | v rows (conv input)
    z: Matrix  # x -> the output gate (attn_gate)
    beta: Matrix  # x -> (Hv,) write strengths, through a sigmoid
    alpha: Matrix  # x -> (Hv,) decay inputs
    a: np.ndarray  # (Hv,) A = -exp(A_log)
    dt_bias: np.ndarray  # (Hv,)
    conv: np.ndarray  # (channels, taps) float32
    norm: np.ndarray  # (dv,) the output RMSNorm's weight (plain)
    out: Matrix


@dataclass(frozen=True)
class SandwichNorms:
    """Gemma 4: the norms around attention, dense MLP and experts, the layer scalar, the router scales."""
    post_attention: np.ndarray
    post_ffw_1: np.ndarray | None  # after the dense MLP (None: a dense model, these five too)
    pre_ffw_2: np.ndarray | None  # before the experts (on the raw residual)
    post_ffw_2: np.ndarray | None  # after the experts
    post_ffw: np.ndarray  # after their sum (a dense model: after its MLP)
    layer_scale: float
    router_scale: np.ndarray | None  # (D,) times the unweighted rms of the residual
    expert_scale: np.ndarray | None  # (E,) each expert's output weight


@dataclass(frozen=True)
class CacheStats:
    """Counters of the expert cache, overall and per layer. Loads by fill() and lookups during
    warmup() are not counted: hits, misses and prefetch accuracy describe real requests."""
    capacity_per_layer: int  # the per-layer limit, or the budget in experts per layer
    resident: int
    resident_bytes: int
    hits: int
    misses: int
    evictions: int
    bytes_loaded: int
    wait_s: float
    hit_rate: float
    served_without_wait: float
    prefetch_accuracy: float | None
    prefetch_enabled: bool
    per_layer: tuple  # (hits, misses, evictions) per layer
    activations: tuple  # per layer, per expert: how often picked
    budget_bytes: int = 0  # the one byte budget shared by every layer (spare slots included)
    cycle_bytes: int = 0  # one token's worst case: layers x top-k x one expert
    fill_bytes: int = 0  # loaded by fill() (room for every expert), not counted as prefetch
    read_bytes: tuple = ()  # (way, bytes): page_cache (copied, then dropped), direct, buffered, mapped
    prefetch_paused: bool = False  # predictions held back: lately they were mostly wasted
    prefetch_skipped: int = 0  # prediction calls held back while paused
