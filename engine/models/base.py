"""Shared blocks of every architecture: embedding, attention with RoPE over the KV cache,
SwiGLU experts, top-k routing, and the decoder loop.

An architecture file subclasses `Transformer` and says only what differs: its feed-forward
block (`ffn`) and, for MoE, how router logits become expert weights (`route`).

Every intermediate has a name (`blk.3.attn_out`, `blk.3.ffn_out`, `blk.3.out`, `logits`, ...);
pass a dict as `dump` and each is stored there, so a mismatch with transformers can be traced
layer by layer.
"""
from __future__ import annotations

import math
from contextlib import ExitStack
from contextvars import ContextVar
from dataclasses import dataclass

import numpy as np

from engine.kernels import cpu
from engine.kvcache import KVCache
from engine.mempool import Arena
from engine.model_dir import ModelConfig
from engine.models.fused import FusedDecode
from engine.weights import ExpertWeights, LayerWeights, Matrix, ModelWeights

ATTENTION_BLOCK = 256  # query tokens per attention call
PREFETCH_MAX_TOKENS = 4  # prefetch while decoding; a prompt's union of experts is most of them


# --- GPU hook (issue 8) ----------------------------------------------------------------------
# While a Transformer whose `gpu` runner is set (engine.scheduler, gpu_layers > 0 and a GPU present)
# runs forward(), linear() offers each matmul to it first; the runner returns None for the ones the
# CPU should do. Unset (the default, and always on a CPU-only machine) it costs one lookup.
_gpu: ContextVar = ContextVar("colibri_gpu", default=None)
# Activations of the running forward pass come from its Transformer's arena (pool memory).
_arena: ContextVar = ContextVar("colibri_arena", default=None)
# True while a Transformer with int8_activations off runs: every matmul in float activations.
_exact: ContextVar = ContextVar("colibri_exact", default=False)
# Called with the layer index before each layer of a multi-token pass (engine.api: Stop during a
# long prompt raises from it; the KV cache keeps its old length, so nothing half-done is kept).
before_layer: ContextVar = ContextVar("colibri_before_layer", default=None)


def _empty(shape) -> np.ndarray:
    """A float32 scratch buffer for the current pass (numpy memory outside a forward pass)."""
    arena = _arena.get()
    return np.empty(shape, np.float32) if arena is None else arena.empty(shape)


def linear(x: np.ndarray, m: Matrix) -> np.ndarray:
    """x (T, cols) @ m.T -> (T, rows)."""
    g = _gpu.get()  # issue 8
    if g is not None:
        y = g.linear(x, m)
        if y is not None:
            return y
    out = _empty((x.shape[0], m.rows))
    cpu.matmul(m.data, m.code, np.ascontiguousarray(x, dtype=np.float32), out, _exact.get())
    return out


def _integer_path(x: np.ndarray, ms: tuple[Matrix, ...], mixed: bool = True) -> bool:
    """Whether the fused integer kernels take these matmuls: decode-sized x, formats with an
    integer dot, contiguous matrices, no GPU runner to offer them to, float activations not
    asked for; `mixed` False: all repacked or none (swiglu_int)."""
    if x.shape[0] > cpu.INT_MAX_T or _gpu.get() is not None or _exact.get():
        return False
    packed = sum(m.code > cpu.PACKED for m in ms)
    return (mixed or packed in (0, len(ms))) and \
        all(m.code in cpu.INT_CODES and m.data.flags.c_contiguous for m in ms)


def linears(x: np.ndarray, ms: tuple[Matrix, ...]) -> tuple[np.ndarray, ...]:
    """x @ m.T for each m of ms (one kernel call on the integer path)."""
    if not _integer_path(x, ms):
        return tuple(linear(x, m) for m in ms)
    outs = tuple(_empty((x.shape[0], m.rows)) for m in ms)
    cpu.matmul_int(tuple(m.data for m in ms), tuple(m.code for m in ms), np.ascontiguousarray(x, dtype=np.float32),
                   outs)
    return outs


def rmsnorm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """Over the last axis of x (..., n)."""
    flat = np.ascontiguousarray(x, dtype=np.float32).reshape(-1, x.shape[-1])
    out = _empty(flat.shape)
    cpu.rmsnorm(flat, weight, np.float32(eps), out)
    return out.reshape(x.shape)


def expert_mlp(h: np.ndarray, e: ExpertWeights) -> np.ndarray:
    """SwiGLU: down(silu(gate h) * up h)."""
    if _integer_path(h, (e.gate, e.up), mixed=False):
        a = _empty((h.shape[0], e.gate.rows))
        cpu.swiglu_int(e.gate.data, e.gate.code, e.up.data, e.up.code, np.ascontiguousarray(h, dtype=np.float32), a)
        return linear(a, e.down)
    g, u = linear(h, e.gate), linear(h, e.up)
    a = _empty(g.shape)
    cpu.swiglu(g, u, a)
    return linear(a, e.down)


def softmax_top_k(logits: np.ndarray, k: int, renormalise: bool) -> tuple[np.ndarray, np.ndarray]:
    """(T, E) router logits -> the top-k softmax weights (T, k) and expert ids (T, k), most likely
    first, renormalised to sum to 1 if asked."""
    T = logits.shape[0]
    weights, ids = np.empty((T, k), np.float32), np.empty((T, k), np.int64)
    cpu.softmax_top_k(np.ascontiguousarray(logits, dtype=np.float32), k, renormalise, weights, ids)
    return weights, ids


@dataclass
class Step:
    """What one forward call works on."""
    cache: KVCache
    pos0: int  # position of the first new token
    cos: np.ndarray  # (T, head_dim/2)
    sin: np.ndarray
    dump: dict | None


class Transformer:
    """The decoder loop: x += attention(norm x); x += ffn(norm x); then the output head."""
    gpu = None  # issue 8: the GPU runner (engine.scheduler.Scheduler.runner); None = CPU only
    exact = False  # int8_activations off: float activations in every matmul
    fused_decode = True  # a decoded token in one kernel call where engine.models.fused applies

    def __init__(self, cfg: ModelConfig, weights: ModelWeights):
        self.cfg, self.w = cfg, weights
        hd = cfg.head_dim
        if cfg.rope_scaling and cfg.rope_scaling.get("type") not in ("linear",):
            raise NotImplementedError(f"rope scaling {cfg.rope_scaling.get('type')!r} is not supported yet")
        # float32 throughout, as transformers computes it
        inv = np.float32(1.0) / (np.float32(cfg.rope_theta) ** (np.arange(0, hd, 2, dtype=np.float32) / np.float32(hd)))
        if weights.rope_freqs is not None:
            inv = inv / weights.rope_freqs
        if cfg.rope_scaling:  # linear: positions divided by the factor
            inv = inv / np.float32(cfg.rope_scaling["factor"])
        self.inv_freq = inv.astype(np.float32)
        self.scale = np.float32(1.0 / math.sqrt(hd))
        self.arena = Arena(weights.pool)  # activation buffers, reused by every pass
        routing = self.decode_routing()
        self.fused = FusedDecode(self, routing) if FusedDecode.applies(self, routing) else None

    # --- per-architecture parts ----------------------------------------------------------------
    def ffn(self, L: int, h: np.ndarray, lw: LayerWeights, step: Step) -> np.ndarray:
        raise NotImplementedError

    def route(self, logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        raise NotImplementedError

    def decode_routing(self) -> tuple[int, bool] | None:
        """(top_k, renormalise) if route() is softmax_top_k and ffn() nothing but sparse_moe, so
        the fused decode kernel may route; None for a dense model (or one it cannot route)."""
        return None

    # --- shared blocks -------------------------------------------------------------------------
    def dense_ffn(self, L: int, h: np.ndarray) -> np.ndarray:
        with self.w.experts.use(L, 0) as e:
            return expert_mlp(h, e)

    def sparse_moe(self, L: int, h: np.ndarray, lw: LayerWeights, step: Step) -> np.ndarray:
        """Each token's top-k experts, weighted; tokens grouped by expert so each expert is
        loaded and read once per layer, however many tokens chose it."""
        cache = self.w.experts
        logits = linear(h, lw.router)
        weights, ids = self.route(logits)
        cache.record(L, ids)
        if h.shape[0] <= PREFETCH_MAX_TOKENS:
            self.prefetch(L, h, logits)
        if step.dump is not None:
            step.dump[f"blk.{L}.router_logits"] = logits.copy()
            step.dump[f"blk.{L}.expert_ids"] = ids.copy()
        one = h.shape[0] == 1  # decode: no grouping needed, each pick is one expert
        if one and self._fusable(L, ids[0].tolist()) and _integer_path(h, ()) and cache.all_ready(L, ids[0].tolist()):
            return self._experts_in_one_call(L, h, ids[0].tolist(), weights[0])
        out = _empty(h.shape)
        out[...] = 0
        pick = dict(zip(ids[0].tolist(), weights[0].tolist())) if one else None
        order = cache.order_for_use(L, ids[0] if one else np.unique(ids))  # resident experts first
        for i, e in enumerate(order):
            if i + 1 < len(order):
                cache.load_ahead(L, order[i + 1])  # the next one loads while this one computes
            if one:
                with cache.use(L, e) as ew:
                    y = expert_mlp(h, ew)
                y *= pick[e]
                out += y
                continue
            rows, slot = np.nonzero(ids == e)
            with cache.use(L, e) as ew:
                y = expert_mlp(h[rows], ew)
            out[rows] += weights[rows, slot, None] * y
        return out

    def _fusable(self, L: int, experts: list[int]) -> bool:
        """Whether these experts are stored in one integer-dot format per matrix (gate, up, down),
        so that cpu.moe_int can take them together."""
        codes = {tuple(p[3] for p in self.w.store.span(L, e).parts) for e in experts}
        return len(codes) == 1 and all(c in cpu.PACKABLE for c in next(iter(codes)))

    def _experts_in_one_call(self, L: int, h: np.ndarray, experts: list[int], mix: np.ndarray) -> np.ndarray:
        """A token's loaded experts in one kernel call (cpu.moe_int), pinned meanwhile."""
        with ExitStack() as pins:
            ews = [pins.enter_context(self.w.experts.use(L, e)) for e in experts]
            out = _empty(h.shape)
            act = _empty((len(ews), ews[0].gate.rows))
            cpu.moe_int(tuple(ew.gate.data for ew in ews), tuple(ew.up.data for ew in ews),
                        tuple(ew.down.data for ew in ews), ews[0].gate.code, ews[0].up.code, ews[0].down.code,
                        np.ascontiguousarray(mix, np.float32), np.ascontiguousarray(h, np.float32), act, out)
            return out

    def prefetch(self, L: int, h: np.ndarray, logits: np.ndarray) -> None:
        """Queue the experts the next layer's router picks from this layer's hidden state, and
        this layer's runners-up (ranked just after the top-k) for the next token."""
        cache, k = self.w.experts, self.cfg.top_k
        if cache.holds_all():  # nothing could be brought in
            return
        if L + 1 < len(self.w.layers) and self.w.layers[L + 1].router is not None:
            nxt = np.argsort(-linear(h, self.w.layers[L + 1].router), axis=-1)[:, :k]
            cache.prefetch(L + 1, np.unique(nxt))
        ranked = np.argsort(-logits, axis=-1)
        cache.prefetch(L, np.unique(ranked[:, k:k + 1]), spare_only=True)

    def attention(self, L: int, h: np.ndarray, lw: LayerWeights, step: Step) -> np.ndarray:
        cfg, T = self.cfg, h.shape[0]
        H, KV, hd = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        q, k, v = linears(h, (lw.q, lw.k, lw.v))
        if lw.q_bias is not None:
            q += lw.q_bias
            k += lw.k_bias
            v += lw.v_bias
        if cfg.qk_norm == "full":  # OLMoE: one norm over all heads
            q, k = rmsnorm(q, lw.q_norm, cfg.rms_norm_eps), rmsnorm(k, lw.k_norm, cfg.rms_norm_eps)
        q, k, v = q.reshape(T, H, hd), k.reshape(T, KV, hd), v.reshape(T, KV, hd)
        if cfg.qk_norm == "head":  # Qwen3: a norm per head
            q, k = rmsnorm(q, lw.q_norm, cfg.rms_norm_eps), rmsnorm(k, lw.k_norm, cfg.rms_norm_eps)
        if cfg.clip_qkv:
            for a in (q, k, v):
                np.clip(a, -cfg.clip_qkv, cfg.clip_qkv, out=a)
        cpu.rope(q, step.cos, step.sin)
        cpu.rope(k, step.cos, step.sin)
        step.cache.write(L, step.pos0, k, v)
        keys, values, ks, vs, scaled = step.cache.views(L, step.pos0 + T)
        out = _empty(q.shape)
        for a in range(0, T, ATTENTION_BLOCK):  # query blocks bound the scores buffer on long prompts
            b = min(T, a + ATTENTION_BLOCK)
            scores = _empty(((b - a) * H, step.pos0 + b))
            cpu.attention(q[a:b], keys, values, ks, vs, scaled, step.pos0 + a, cfg.sliding_window or 0,
                          self.scale, scores, out[a:b])
        if step.dump is not None:
            step.dump |= {f"blk.{L}.q": q.copy(), f"blk.{L}.k": k.copy(), f"blk.{L}.v": v.copy(),
                          f"blk.{L}.attn_out": out.reshape(T, -1).copy()}
        return linear(out.reshape(T, H * hd), lw.o)

    def rotary(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        angles = positions.astype(np.float32)[:, None] * self.inv_freq[None, :]
        return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)

    def forward(self, ids: np.ndarray, cache: KVCache, pos0: int, all_logits: bool = False,
                dump: dict | None = None) -> np.ndarray:
        """Run tokens `ids` at positions pos0.. through the model, filling the cache.

        Returns logits (T, vocab) if all_logits, else those of the last token (1, vocab).
        """
        gpu = _gpu.set(self.gpu) if self.gpu is not None else None  # issue 8: offer matmuls to the GPU
        self.arena.reset()
        arena, exact = _arena.set(self.arena), _exact.set(self.exact)
        try:
            return self._forward(ids, cache, pos0, all_logits, dump).copy()  # results leave the arena
        finally:
            _exact.reset(exact)
            _arena.reset(arena)
            if gpu is not None:
                _gpu.reset(gpu)

    def _forward(self, ids: np.ndarray, cache: KVCache, pos0: int, all_logits: bool,
                 dump: dict | None) -> np.ndarray:
        cfg, T = self.cfg, len(ids)
        cos, sin = self.rotary(np.arange(pos0, pos0 + T))
        step = Step(cache, pos0, cos, sin, dump)
        x = _empty((T, cfg.hidden_size))
        cpu.gather_rows(self.w.token_embd.data, self.w.token_embd.code, np.asarray(ids, np.int64), x)
        if dump is not None:
            dump["token_embd"] = x.copy()
        arena, hook = _arena.get(), before_layer.get() if T > 1 else None
        fused = T == 1 and dump is None and self.fused is not None and self.fused_decode and \
            _gpu.get() is None and not _exact.get() and self.fused.run(x, cache, pos0, cos, sin)
        for L, lw in enumerate(self.w.layers if not fused else ()):
            if hook is not None:
                hook(L)
            mark = arena.mark() if arena is not None else None
            x += self.attention(L, rmsnorm(x, lw.attn_norm, cfg.rms_norm_eps), lw, step)
            f = self.ffn(L, rmsnorm(x, lw.ffn_norm, cfg.rms_norm_eps), lw, step)
            x += f
            if dump is not None:
                dump[f"blk.{L}.ffn_out"] = f.copy()
                dump[f"blk.{L}.out"] = x.copy()
            if mark is not None:
                arena.release(mark)  # the layer's buffers are dead: the next layer reuses them
        cache.length = pos0 + T
        h = rmsnorm(x if all_logits else x[-1:], self.w.output_norm, cfg.rms_norm_eps)
        logits = linear(h, self.w.output)
        if dump is not None:
            dump["output_norm"] = h.copy()
            dump["logits"] = logits.copy()
        return logits
