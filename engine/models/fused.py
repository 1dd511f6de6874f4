"""A decoded token in one kernel call (engine.kernels.decode) instead of ten per layer.

It applies when the model's spec has only parts the kernel computes (FEATURES: q/k/v biases,
q/k norms and clipping included; no shared expert yet) and everything the token could touch sits in memory,
unmoving, in a form the integer kernels read: q4_0/q4_1/q8_0 (and the other INT_CODES)
attention and expert matrices; an expert cache with room for every expert, all of them loaded
(the first decoded token waits for the rest: then nothing is evicted, so the kernel may reach any
expert through its address without pinning it). Otherwise — and for prompts, GPU offload, float
activations or a dump — the layer-by-layer path in engine.models.base runs, with the same
arithmetic (tests/test_fused_decode.py holds the two equal on every architecture).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import numpy as np

from engine.kernels import cpu
from engine.kernels.decode import SPAN, decode_layers
from engine.kvcache import KVCache
from engine.weight_types import Matrix

if TYPE_CHECKING:
    from engine.models.base import Step, Transformer

FILL_WAIT_S = 600.0  # the longest the first fused token waits for the experts to load


def _row(m: Matrix) -> list[int]:
    return [m.data.ctypes.data, m.rows, m.data.shape[1], m.code]


def _contiguous(m: Matrix) -> bool:
    """Rows back to back: the matrix can be rebuilt from its address and shape."""
    return m.data.ndim == 2 and m.data.strides == (m.data.shape[1], 1)


def _readable(m: Matrix) -> bool:
    """Whether decode_layers can dot m in integers: contiguous, whole 8-row spans, a format
    with an integer dot."""
    return _contiguous(m) and m.rows % SPAN == 0 and m.code in cpu.INT_CODES


# The features (engine.arch.FEATURES) decode_layers computes; a model needing any other one
# decodes layer by layer (FusedDecode.refusal says which).
FEATURES = frozenset({"attention", "sliding_attention", "router:softmax_topk", "rope:default", "rope:linear",
                      "qkv_bias", "qk_norm:head", "qk_norm:full", "clip_qkv"})
QK_NORM = {"none": 0, "head": 1, "full": 2}  # decode_layers' qk_norm argument


class FusedDecode:
    """The address tables of one model for decode_layers, rebuilt whenever the expert cache
    changes (a new cache, a load, an eviction)."""

    def __init__(self, model: Transformer):
        cfg, w = model.cfg, model.w
        self.model, self.dense = model, not cfg.is_moe
        self.top_k, self.renormalise = (1, False) if self.dense else (cfg.top_k, model.renormalise)
        self.norms = np.stack([np.stack([lw.attn_norm, lw.ffn_norm]) for lw in w.layers]).astype(np.float32)
        n, qd = len(w.layers), cfg.num_heads * cfg.head_dim
        self.bias = np.zeros((n, 3, qd if cfg.attention_bias else 0), np.float32)
        self.qk_norms = np.zeros((n, 2, qd if cfg.qk_norm != "none" else 0), np.float32)
        for L, lw in enumerate(w.layers):
            for i, b in enumerate((lw.q_bias, lw.k_bias, lw.v_bias) if cfg.attention_bias else ()):
                self.bias[L, i, :b.size] = b
            for i, g in enumerate((lw.q_norm, lw.k_norm) if cfg.qk_norm != "none" else ()):
                self.qk_norms[L, i, :g.size] = g
        attn = [[_row(m) for m in (lw.q, lw.k, lw.v, lw.o)] for lw in w.layers]
        self.attn = np.array(attn, np.int64).reshape(len(w.layers), 4, 4)
        self.router = np.zeros((len(w.layers), 4), np.int64)
        if not self.dense:
            self.router[:] = [_row(lw.router) for lw in w.layers]
        self._key = None
        self._experts = None  # (layers, E, 3, 4) table, or None while some expert is not loaded
        self._keep = None  # the ExpertWeights the table points into
        # benchmark hook (colibri-bench memory --trace): () -> (layers, top_k) experts the next
        # token takes instead of its routers' picks, at equal weights; None: the routers pick
        self.given: Callable[[], np.ndarray] | None = None

    @staticmethod
    def refusal(model: Transformer) -> str | None:
        """Why the fused kernel cannot take this model (a feature of its spec it does not
        compute, a shape, a stored format), or None when it can."""
        cfg, w = model.cfg, model.w
        missing = sorted(model.spec.features(cfg) - FEATURES)
        if missing:
            return f"{cfg.architecture}: the fused decode does not compute {', '.join(missing)}"
        if cfg.num_heads % cfg.num_kv_heads or cfg.head_dim % 2 or cfg.hidden_size % SPAN:
            return f"heads {cfg.num_heads}/{cfg.num_kv_heads}, head_dim {cfg.head_dim}, hidden {cfg.hidden_size}"
        for lw in w.layers:
            bad = [m.name for m in (lw.q, lw.k, lw.v, lw.o) if not _readable(m)]
            if cfg.is_moe and (lw.router is None or not _contiguous(lw.router) or lw.router.code > cpu.PACKED):
                bad.append(lw.router.name if lw.router is not None else "router")
            if bad:
                return f"{bad[0]} is not in an integer-dot format in whole {SPAN}-row spans"
        return None

    def expert_table(self) -> np.ndarray | None:
        """The resident experts' matrix table the fused kernels read (a dense model: one "expert" a
        layer), rebuilt when the cache changes; None when they cannot take it. Also engine.batch's."""
        cache = self.model.w.experts
        key = (id(cache), cache.generation)
        if key == self._key:
            return self._experts
        resident = cache.resident()
        if resident is None and cache.room_for_all:  # load the rest now, and wait for them
            cache.fill()  # (queued once per cache; a no-op without a loader thread)
            cache.drain(timeout=FILL_WAIT_S)
            key, resident = (id(cache), cache.generation), cache.resident()
        self._key, self._experts, self._keep = key, None, None
        if resident is None:
            return None
        mats = [m for layer in resident for ew in layer for m in (ew.gate, ew.up, ew.down)]
        if not all(_readable(m) for m in mats) or len({m.rows for m in mats[::3]}) != 1 or \
                mats[0].rows % SPAN:
            return None
        table = np.array([_row(m) for m in mats], np.int64).reshape(len(resident), len(resident[0]), 3, 4)
        self._experts, self._keep = table, resident
        return table

    def ready(self) -> bool:
        """Whether the next decoded token takes the fused kernel (every expert loaded, those
        missing loaded first where the cache has room for all)."""
        return self.expert_table() is not None

    def run(self, x: np.ndarray, step: Step) -> bool:
        """x (1, hidden) through every layer, in place; False (nothing done) when the fused
        kernel cannot take this token: no room in the KV cache, or an expert cache without room
        for every expert (or an expert that failed to load). With room for all, the experts not
        loaded yet are loaded first, waiting for them: which path runs never depends on timing."""
        cache, pos = step.cache, step.pos0
        if pos >= cache.capacity:
            return False
        experts = self.expert_table()
        if experts is None:
            return False
        t0 = step.timer.start() if step.timer is not None else 0.0
        picks = self._launch(x, cache, pos, step.cos[0], step.sin[0], experts, len(self.norms))
        if step.timer is not None:
            step.timer.stop("decode_layers (fused)", t0)
        self.model.w.experts.count_uses(picks, routed=not self.dense)
        return True

    def compile(self, kv_kind: str) -> None:
        """Compile the kernel for this KV cache format now (or load it from numba's cache), by a
        call through no layers: the first decoded token then does not wait for it."""
        cfg = self.model.cfg
        cache = KVCache(0, 1, cfg.num_kv_heads, cfg.head_dim, kv_kind)
        rot = np.zeros(cfg.head_dim // 2, np.float32)
        self._launch(np.zeros((1, cfg.hidden_size), np.float32), cache, 0, rot, rot,
                     np.zeros((0, cfg.num_experts, 3, 4), np.int64), 0)

    def _launch(self, x: np.ndarray, cache: KVCache, pos: int, cos: np.ndarray, sin: np.ndarray,
                experts: np.ndarray, layers: int) -> np.ndarray:
        cfg = self.model.cfg
        keys, values = (cache.k.view(np.uint16), cache.v.view(np.uint16)) if cache.kind == "f16" else (cache.k, cache.v)
        picks = np.full((layers, self.top_k), -1, np.int64)
        if self.given is not None and layers:
            picks[:] = self.given()
        decode_layers(x, self.norms[:layers], self.attn[:layers], self.bias[:layers], self.qk_norms[:layers],
                      QK_NORM[cfg.qk_norm], np.float32(cfg.clip_qkv or 0.0), self.router[:layers], experts, self.top_k,
                      bool(self.renormalise), np.float32(cfg.rms_norm_eps), self.model.scale, cfg.sliding_window or 0,
                      cos, sin, pos, keys, values, cache.k_scale, cache.v_scale, cache.kind == "int8", cfg.num_heads,
                      cfg.num_kv_heads, cfg.head_dim, picks)
        return picks
