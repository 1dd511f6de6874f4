"""A decoded token in one kernel call (engine.kernels.decode) instead of ten per layer.

It applies when everything the token could touch sits in memory, unmoving, in a form the
integer kernels read: a dense or softmax top-k MoE model without biases, q/k norms or clipping;
q4_0/q4_1/q8_0 attention and expert matrices; an expert cache with room for every expert and
all of them loaded (then nothing is evicted, so the kernel may reach any expert through its
address without pinning it). Otherwise — and for prompts, GPU offload, float activations or a
dump — the layer-by-layer path in engine.models.base runs, with the same arithmetic.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from engine.kernels import cpu
from engine.kernels.decode import SPAN, decode_layers
from engine.kvcache import KVCache
from engine.weights import Matrix

if TYPE_CHECKING:
    from engine.models.base import Transformer


def _row(m: Matrix) -> list[int]:
    return [m.data.ctypes.data, m.rows, m.data.shape[1], m.code]


def _contiguous(m: Matrix) -> bool:
    """Rows back to back: the matrix can be rebuilt from its address and shape."""
    return m.data.ndim == 2 and m.data.strides == (m.data.shape[1], 1)


def _readable(m: Matrix) -> bool:
    """Whether decode_layers can dot m in integers: contiguous, whole 8-row spans, a format
    with an integer dot."""
    return _contiguous(m) and m.rows % SPAN == 0 and m.code in cpu.INT_CODES


class FusedDecode:
    """The address tables of one model for decode_layers, rebuilt whenever the expert cache
    changes (a new cache, a load, an eviction)."""

    def __init__(self, model: Transformer, routing: tuple[int, bool] | None):
        self.model, self.top_k, self.renormalise = model, *(routing or (1, False))
        self.dense = routing is None
        w = model.w
        self.norms = np.stack([np.stack([lw.attn_norm, lw.ffn_norm]) for lw in w.layers]).astype(np.float32)
        attn = [[_row(m) for m in (lw.q, lw.k, lw.v, lw.o)] for lw in w.layers]
        self.attn = np.array(attn, np.int64).reshape(len(w.layers), 4, 4)
        self.router = np.zeros((len(w.layers), 4), np.int64)
        if not self.dense:
            self.router[:] = [_row(lw.router) for lw in w.layers]
        self._key = None
        self._experts = None  # (layers, E, 3, 4) table, or None while some expert is not loaded
        self._keep = None  # the ExpertWeights the table points into

    @staticmethod
    def applies(model: Transformer, routing: tuple[int, bool] | None) -> bool:
        """Whether the model's shape and stored formats allow the fused kernel at all."""
        cfg, w = model.cfg, model.w
        if cfg.qk_norm not in (None, "none") or cfg.clip_qkv or cfg.shared_expert_intermediate_size:
            return False
        if cfg.num_heads % cfg.num_kv_heads or cfg.head_dim % 2 or cfg.hidden_size % SPAN:
            return False
        if (routing is None) != (cfg.num_experts == 1):
            return False
        for lw in w.layers:
            if lw.q_bias is not None or lw.q_norm is not None or lw.shared is not None:
                return False
            if not all(_readable(m) for m in (lw.q, lw.k, lw.v, lw.o)):
                return False
            if routing is not None and (lw.router is None or not _contiguous(lw.router) or
                                        lw.router.code > cpu.PACKED):
                return False
        return True

    def _expert_table(self) -> np.ndarray | None:
        cache = self.model.w.experts
        key = (id(cache), cache.generation)
        if key == self._key:
            return self._experts
        self._key, self._experts, self._keep = key, None, None
        resident = cache.resident()
        if resident is None:
            cache.fill()  # with room for every expert, the rest load in the background
            return None
        mats = [m for layer in resident for ew in layer for m in (ew.gate, ew.up, ew.down)]
        if not all(_readable(m) for m in mats) or len({m.rows for m in mats[::3]}) != 1 or \
                mats[0].rows % SPAN:
            return None
        table = np.array([_row(m) for m in mats], np.int64).reshape(len(resident), len(resident[0]), 3, 4)
        self._experts, self._keep = table, resident
        return table

    def ready(self) -> bool:
        """Whether the next decoded token takes the fused kernel (every expert loaded); asks for
        the missing ones otherwise."""
        return self._expert_table() is not None

    def run(self, x: np.ndarray, cache: KVCache, pos: int, cos: np.ndarray, sin: np.ndarray) -> bool:
        """x (1, hidden) through every layer, in place; False (nothing done) when the fused
        kernel does not apply now (an expert not loaded yet, no room in the KV cache)."""
        experts = self._expert_table()
        if experts is None or pos >= cache.capacity:
            return False
        picks = self._launch(x, cache, pos, cos[0], sin[0], experts, len(self.norms))
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
        picks = np.empty((layers, self.top_k), np.int64)
        decode_layers(x, self.norms[:layers], self.attn[:layers], self.router[:layers], experts, self.top_k,
                      bool(self.renormalise), np.float32(cfg.rms_norm_eps), self.model.scale, cfg.sliding_window or 0,
                      cos, sin, pos, keys, values, cache.k_scale, cache.v_scale, cache.kind == "int8", cfg.num_heads,
                      cfg.num_kv_heads, cfg.head_dim, picks)
        return picks
