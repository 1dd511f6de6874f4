"""A decoded token in one kernel call (engine.kernels.decode) instead of ten per layer, or N
sequences' tokens of a dense model in one (engine.kernels.batched): Transformer.forward's fused routes.

It applies when the model's spec has only parts the kernel computes (FEATURES) and everything the
token could touch sits in memory, unmoving, in a form the integer kernels read (INT_CODES), the
experts included once all are loaded in a cache with room for every one (then nothing is evicted,
so the kernel may reach any expert by address without pinning it). Otherwise, and for prompts, GPU
offload, float activations or a dump, the layer-by-layer path in engine.models.base runs, with the
same arithmetic (tests/test_fused_decode.py holds the two equal on every architecture).
"""
from __future__ import annotations

import weakref
from contextlib import ExitStack
from typing import TYPE_CHECKING, Callable

import numpy as np

from engine.kernels import cpu
from engine.kernels.batched import decode_rows
from engine.kernels.decode import SPAN, decode_layers
from engine.kvcache import KVCache
from engine.models.blocks import linear, rmsnorm
from engine.weight_types import Matrix

if TYPE_CHECKING:
    from engine.models.base import Transformer
    from engine.models.blocks import Step

FILL_WAIT_S = 600.0  # the longest the first fused token waits for the experts to load


def _row(m: Matrix) -> list[int]:
    return [m.data.ctypes.data, m.rows, m.data.shape[1], m.code]


def _contiguous(m: Matrix) -> bool:
    """Rows back to back: the matrix can be rebuilt from its address and shape."""
    return m.data.ndim == 2 and m.data.strides == (m.data.shape[1], 1)


def _readable(m: Matrix) -> bool:
    """Whether decode_layers can dot m in integers: contiguous, whole 8-row spans, an integer-dot format."""
    return _contiguous(m) and m.rows % SPAN == 0 and m.code in cpu.INT_CODES


# The features (engine.arch.FEATURES) decode_layers computes; a model needing any other one
# decodes layer by layer (FusedDecode.refusal says which).
FEATURES = frozenset({"attention", "sliding_attention", "router:softmax_topk", "rope:default", "rope:linear",
                      "qkv_bias", "qk_norm:head", "qk_norm:full", "clip_qkv"})
QK_NORM = {"none": 0, "head": 1, "full": 2}  # decode_layers' qk_norm argument


class FusedDecode:
    """The address tables of one model for decode_layers, rebuilt whenever the expert cache changes."""

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
        self._held_key, self._held = None, None  # held_table's
        self._held_rows: dict = {}  # (layer, expert) -> a weak reference to the ExpertWeights its row points into
        self._streamable: bool | None = None  # _stream_refusal() is None, once asked
        self.streamed = 0  # tokens that streamed experts between decode_layers calls
        # benchmark hook (colibri-bench memory --trace): () -> (layers, top_k) experts the next
        # token takes instead of its routers' picks, at equal weights; None: the routers pick
        self.given: Callable[[], np.ndarray] | None = None

    @staticmethod
    def refusal(model: Transformer) -> str | None:
        """Why the fused kernel cannot take this model (a feature, a shape, a format), or None."""
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
        layer), rebuilt when the cache changes; None when they cannot take it."""
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

    def held_table(self) -> np.ndarray | None:
        """The table of the experts the cache holds now (address 0 for the rest: decode_layers stops
        there), kept up to date by what came or went since the last call; None when the experts are not
        all in one readable layout."""
        cache = self.model.w.experts
        key = (id(cache), cache.generation)
        if key == self._held_key:
            return self._held
        if self._streamable is None:
            self._streamable = self._stream_refusal() is None
        held = cache.held() if self._streamable else None
        if held is None:
            self._held_key, self._held, self._held_rows = key, None, {}
            return None
        table, rows = self._held, self._held_rows
        if table is None or self._held_key is None or self._held_key[0] != key[0]:
            table, rows = np.zeros((len(self.norms), cache.num_experts, 3, 4), np.int64), {}
        for k in rows.keys() - held.keys():
            table[k] = 0
            del rows[k]
        for k, ew in held.items():
            if (ref := rows.get(k)) is None or ref() is not ew:
                mats = (ew.gate, ew.up, ew.down)
                if not all(_readable(m) for m in mats):
                    self._held_key, self._held, self._held_rows = key, None, {}
                    return None
                table[k] = [_row(m) for m in mats]
                rows[k] = weakref.ref(ew)  # (a strong one would keep an evicted expert's views alive)
        self._held_key, self._held, self._held_rows = key, table, rows  # (addresses: valid while frozen)
        return table

    def _stream_refusal(self) -> str | None:
        """Why a token cannot stream through decode_layers (experts coming in between its calls):
        a dense model, or experts stored in a layout the kernel cannot dot."""
        if self.dense:
            return "a dense model"
        store, cfg = self.model.w.store, self.model.cfg
        rows = set()
        for L in range(cfg.dense_layers, cfg.num_layers):
            for e in range(cfg.num_experts):
                parts = store.span(L, e).parts  # (relative offset, rows, row_bytes, code, cols)
                if any(code not in cpu.INT_CODES or r % SPAN for _, r, _, code, _ in parts):
                    return f"layer {L} expert {e}: not an integer-dot format in whole {SPAN}-row spans"
                rows.add(parts[0][1])
        return None if len(rows) == 1 and cfg.dense_layers == 0 else "experts of different widths, or dense layers"

    def ready(self) -> bool:
        """Whether the next token takes the fused kernel (missing experts loaded first where all fit)."""
        return self.expert_table() is not None

    def run(self, x: np.ndarray, step: Step) -> str | None:
        """x (1, hidden) through every layer, in place; the route's name, or None (nothing done) when the
        fused kernel cannot take this token. With room for all, missing experts are loaded first; else
        the token streams (stream()): which path runs never depends on timing."""
        cache, pos = step.cache, step.pos0
        if pos >= cache.capacity:
            return None
        experts = self.expert_table()
        if experts is None:
            return "fused (streaming experts)" if self.stream(x, step) else None
        t0 = step.timer.start() if step.timer is not None else 0.0
        picks, mixes = self._picks(len(self.norms))
        decode_layers(*self._args(x, cache, pos, step.cos[0], step.sin[0], experts, len(self.norms), picks, mixes))
        if step.timer is not None:
            step.timer.stop("decode_layers (fused)", t0)
        self.model.w.experts.count_uses(picks, routed=not self.dense)
        return "fused"

    def rows(self, x: np.ndarray, step: Step) -> str | None:
        """x (N, hidden), row i step.seqs[i]'s token, through every dense layer in one call, in place,
        each row bit for bit its lone run(); None (nothing done): experts, or caches unlike."""
        caches, pos = [c for c, _ in step.seqs], np.array([p for _, p in step.seqs], np.int64)
        kind = caches[0].kind
        if not self.dense or not self.ready() or \
                any(c.kind != kind or not (c.k.flags.c_contiguous and c.v.flags.c_contiguous) for c in caches):
            return None
        t0 = step.timer.start() if step.timer is not None else 0.0
        like = caches[0].k.view(np.uint16) if kind == "f16" else caches[0].k
        kv = np.array([[c.k.ctypes.data, c.v.ctypes.data, c.k_scale.ctypes.data, c.v_scale.ctypes.data, c.capacity]
                       for c in caches], np.int64)
        cfg = self.model.cfg
        decode_rows(x, self.norms, self.attn, self.bias, self.qk_norms, QK_NORM[cfg.qk_norm],
                    np.float32(cfg.clip_qkv or 0.0), np.ascontiguousarray(self.expert_table()[:, 0]),
                    np.float32(cfg.rms_norm_eps), self.model.scale, cfg.sliding_window or 0,
                    np.ascontiguousarray(step.cos, dtype=np.float32), np.ascontiguousarray(step.sin, dtype=np.float32),
                    pos, kv, like, caches[0].k_scale, kind == "int8", cfg.num_heads, cfg.num_kv_heads, cfg.head_dim)
        if step.timer is not None:
            step.timer.stop("decode_rows (fused, batched)", t0)
        self.model.w.experts.count_uses(np.zeros((len(self.norms), len(caches)), np.int64), routed=False)  # as N lone decodes
        return f"fused rows ({len(caches)} sequences)"

    def stream(self, x: np.ndarray, step: Step) -> bool:
        """x through every layer with an expert cache that holds only some experts: decode_layers runs
        over the held ones (the cache frozen) and stops at the first layer whose picks it lacks; those come
        in through the cache, and the next call resumes there. False: experts in a layout it cannot read."""
        cache, n = self.model.w.experts, len(self.norms)
        if self.held_table() is None:
            return False
        picks, mixes = self._picks(n)
        start, resume, counted, taken = 0, False, 0, []
        uses = ExitStack()  # the stopped layer's experts, pinned until the call that resumes there returns
        try:
            while True:
                t0 = step.timer.start() if step.timer is not None else 0.0
                with cache.frozen(start):  # (the table made inside: nothing it points to goes before the call ends)
                    table = self.held_table()
                    if table is None:
                        raise RuntimeError("an expert in the cache is not in a layout decode_layers reads")
                    if resume:  # the stopped layer's picks, as their use() gave them
                        table = table.copy()
                        for e, ew in zip(picks[start].tolist(), taken):
                            table[start, e] = [_row(ew.gate), _row(ew.up), _row(ew.down)]
                        del ew  # (a mapped expert goes with its last view, before the next stop maps more)
                    stop = decode_layers(*self._args(x, step.cache, step.pos0, step.cos[0], step.sin[0], table, n, picks,
                                                     mixes, start, resume))
                    # the held ones' hits, while they are still held: leaving frozen() enforces the budget,
                    # and its evictions (or the loader's) may take them
                    cache.count_uses(picks, layers=range(counted, stop))
                if step.timer is not None:
                    step.timer.stop("decode_layers (streamed)", t0)
                uses.close()  # the last stop's experts: their use is over (a mapped one unmapped)
                taken = []
                if stop == n:
                    break
                cache.record(stop, picks[stop:stop + 1])
                self._prefetch(stop, x, step)
                got = {}
                order = cache.order_for_use(stop, picks[stop])
                for i, e in enumerate(order):
                    if i + 1 < len(order):
                        cache.load_ahead(stop, order[i + 1])  # the next one loads while this one does
                    got[e] = uses.enter_context(cache.use(stop, e))
                taken = [got[e] for e in picks[stop].tolist()]
                if not all(_readable(m) for ew in taken for m in (ew.gate, ew.up, ew.down)):
                    raise RuntimeError(f"layer {stop}: an expert came in that decode_layers cannot read")
                start, resume, counted = stop, True, stop + 1
        finally:
            uses.close()
        self.streamed += 1
        return True

    def _prefetch(self, L: int, x: np.ndarray, step: Step) -> None:
        """At a stop, what the layered path asks of the prefetcher at every layer, where it would go out."""
        cache, model = self.model.w.experts, self.model
        if not cache.prediction_due():
            return
        lw = model.w.layers[L]
        h = rmsnorm(x, lw.ffn_norm, model.cfg.rms_norm_eps, step)
        model.prefetch(L, h, linear(h, lw.router, step), step)

    def _picks(self, layers: int) -> tuple[np.ndarray, np.ndarray]:
        """The (layers, top_k) picks and mixes decode_layers fills: -1 (its routers choose), or the
        benchmark hook's given experts at equal weights."""
        picks = np.full((layers, self.top_k), -1, np.int64)
        mixes = np.zeros((layers, self.top_k), np.float32)
        if self.given is not None and layers:
            picks[:] = self.given()
            mixes[:] = np.float32(1.0 / self.top_k)
        return picks, mixes

    def compile(self, kv_kind: str) -> None:
        """Compile the kernel for this KV cache format now (or load it from numba's cache), by a
        call through no layers: the first decoded token then does not wait for it."""
        cfg = self.model.cfg
        cache = KVCache(0, 1, cfg.num_kv_heads, cfg.head_dim, kv_kind)
        rot = np.zeros(cfg.head_dim // 2, np.float32)
        decode_layers(*self._args(np.zeros((1, cfg.hidden_size), np.float32), cache, 0, rot, rot,
                                  np.zeros((0, cfg.num_experts, 3, 4), np.int64), 0, *self._picks(0)))

    def _args(self, x: np.ndarray, cache: KVCache, pos: int, cos: np.ndarray, sin: np.ndarray,
              experts: np.ndarray, layers: int, picks: np.ndarray, mixes: np.ndarray, start: int = 0,
              resume: bool = False) -> tuple:
        """decode_layers' arguments from `start` (resume: its feed-forward part); it returns where it stopped."""
        cfg = self.model.cfg
        keys, values = (cache.k.view(np.uint16), cache.v.view(np.uint16)) if cache.kind == "f16" else (cache.k, cache.v)
        return (x, self.norms[:layers], self.attn[:layers], self.bias[:layers], self.qk_norms[:layers],
                QK_NORM[cfg.qk_norm], np.float32(cfg.clip_qkv or 0.0), self.router[:layers], experts, self.top_k,
                bool(self.renormalise), np.float32(cfg.rms_norm_eps), self.model.scale, cfg.sliding_window or 0,
                cos, sin, pos, keys, values, cache.k_scale, cache.v_scale, cache.kind == "int8", cfg.num_heads,
                cfg.num_kv_heads, cfg.head_dim, picks, mixes, start, resume)
