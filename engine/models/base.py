"""The forward pass of every architecture, driven by its spec (engine.arch): embedding,
attention with RoPE over the KV cache, SwiGLU experts, routing, and the decoder loop.

What differs between architectures (q/k norms, biases, the router, a shared expert) is read
from the model's `ArchSpec` and `ModelConfig`; there is no class per architecture. Per-call
state (the arena, the GPU runner, float activations, the stop hook, the timer) travels in an
explicit `Step`, passed to every block: nothing steers the kernels from afar.

Every intermediate has a name (`blk.3.attn_out`, `blk.3.ffn_out`, `blk.3.out`, `logits`, ...);
pass a dict as `dump` and each is stored there, so a mismatch with transformers can be traced
layer by layer.
"""
from __future__ import annotations

import logging
import math
from contextlib import ExitStack, nullcontext
from typing import TYPE_CHECKING, Callable

import numpy as np

from engine import arch
from engine.kernels import cpu
from engine.expert_store import ExpertLoadError
from engine.kvcache import KVCache, own_attention_caches
from engine.mempool import Arena
from engine.model_dir import ModelConfig
from engine.models.blocks import Step, _integer_path, expert_mlp, linear, linears, rmsnorm, softmax_top_k
from engine.models.fused import FusedDecode
from engine.models.per_layer import SharedKV, add_per_layer_input, per_layer_inputs
from engine.models.rows import batchable, check_rows
from engine.ops import attention as op_attention
from engine.ops import cache as states
from engine.ops import conv, deltanet, ffn, norms, rope
from engine.timing import OpTimer
from engine.weight_types import LayerWeights

if TYPE_CHECKING:
    from engine.experts import ExpertCache
    from engine.weights import ModelWeights

log = logging.getLogger("colibri.engine")

ATTENTION_BLOCK = 256  # query tokens per attention call
PREFETCH_MAX_TOKENS = 4  # prefetch while decoding; a prompt's union of experts is most of them


class Transformer:
    """The decoder loop: x += attention(norm x); x += ffn(norm x); then the output head. One class for
    every architecture: `self.spec` (engine.arch) says which parts it has."""
    gpu = None  # issue 8: the GPU runner (engine.scheduler.Scheduler.runner); None = CPU only
    exact = False  # int8_activations off: float activations in every matmul
    fused_decode = True  # a decoded token in one kernel call where engine.models.fused applies
    timer: OpTimer | None = None  # the per-operation timing hook (engine.timing); None = off

    def __init__(self, cfg: ModelConfig, weights: ModelWeights):
        self.cfg, self.w = cfg, weights
        self.spec = arch.spec(cfg.architecture)
        self.spec.check(cfg)  # whatever this engine does not compute yet is refused here, by name
        hd = cfg.head_dim
        # float32 throughout, as transformers computes it
        inv = np.float32(1.0) / (np.float32(cfg.rope_theta) ** (np.arange(0, hd, 2, dtype=np.float32) / np.float32(hd)))
        if weights.rope_freqs is not None:
            inv = inv / weights.rope_freqs
        self.rope_factor = 1.0  # cos and sin are multiplied by it (yarn's attention factor)
        s = cfg.rope_scaling or {}
        if s.get("type") == "linear":  # positions divided by the factor
            inv = inv / np.float32(s["factor"])
        elif cfg.partial_rotary_factor < 1 and self.spec.full_rope == "same":  # Qwen3.5: the first head_dim * factor dims turn
            inv = rope.default_inv_freq(cfg.rope_theta, hd, cfg.partial_rotary_factor)
        elif s.get("type") == "yarn":
            inv, self.rope_factor = rope.yarn_inv_freq(cfg.rope_theta, hd, s["factor"],
                                                       s["original_max_position_embeddings"], s.get("beta_fast", 32.0),
                                                       s.get("beta_slow", 1.0), s.get("truncate", True))
        self.inv_freq = inv.astype(np.float32)
        self.full_tables: tuple[np.ndarray, np.ndarray] | None = None  # this pass's full-layer rope (Gemma 4)
        sc = self.spec.attention_scale
        self.scale = np.float32(1.0 / math.sqrt(hd) if sc is None else sc)
        if self.spec.full_rope == "proportional":  # Gemma 4's full layers: their own theta, head_dim
            self.inv_full = rope.proportional_inv_freq(cfg.rope_theta_full or cfg.rope_theta,
                                                       cfg.full_head_dim or hd, cfg.partial_rotary_factor)
        self.arena = Arena(weights.pool)  # activation buffers, reused by every pass
        self.renormalise = self.spec.renormalises(cfg)
        self.act, self.clamp = self.spec.activation, (cfg.swiglu_alpha, cfg.swiglu_limit)  # of expert_mlp
        self.kinds = self.spec.layer_types(cfg)
        self.kv_from = [cfg.kv_source(L) for L in range(cfg.num_layers)]  # Gemma 4 E2B/E4B share the last layers'
        self.shared_kv: dict[int, tuple] = {}  # this pass's keys and values of the layers others read
        self.per_layer_in: np.ndarray | None = None  # this pass's per-layer inputs (T, layers, P)
        # attention sinks: every layer attends through engine.ops over its own f32 cache (a ring
        # for sliding layers); short_conv layers carry a conv tail. Both live in KVCache.states.
        self.op_attention = own_attention_caches(cfg)
        self.recurrent = self.op_attention or any(k in ("short_conv", "linear_attention") for k in self.kinds)
        # engine.ops' rope: the rest of each head passes
        self.partial_rope = cfg.partial_rotary_factor < 1 and self.spec.full_rope == "same"
        if "linear_attention" in self.kinds:
            self.delta_work = deltanet.work_for(cfg.linear_value_heads, cfg.linear_key_dim, cfg.linear_value_dim)
        why = FusedDecode.refusal(self)
        self.fused = FusedDecode(self) if why is None else None
        self.fused_refusal = why  # why a decoded token runs layer by layer (None: it need not)
        self.plan = "fused" if why is None else f"layered ({why})"  # the last step's route (Engine.stats)
        if why is not None:
            log.info("decoding layer by layer (no one-call decode): %s", why)

    # --- the feed-forward block, as the spec says ---------------------------------------------
    def ffn(self, L: int, h: np.ndarray, lw: LayerWeights, step: Step,
            route_in: np.ndarray | None = None) -> np.ndarray:
        """The layer's feed-forward part: a dense MLP where the layer has no router, else each token's
        top-k experts, weighted (plus a shared expert), grouped by expert so each is read once per layer.
        route_in: what the router reads instead of h (Gemma 4)."""
        cache: ExpertCache = self.w.experts
        if lw.router is None:  # a dense model (its MLP is the directory's expert 0) or a leading dense layer
            if lw.dense is not None:
                return expert_mlp(h, lw.dense, step, self.act)
            with cache.use(L, 0) as e:
                return expert_mlp(h, e, step, self.act)
        logits = linear(h if route_in is None else route_in, lw.router, step)
        if lw.router_bias is not None:
            logits += lw.router_bias
        weights, ids = self.route(logits, lw, step)
        cache.record(L, ids)
        if step.routes is not None:
            step.routes.append((L, ids.copy()))
        if h.shape[0] <= PREFETCH_MAX_TOKENS and cache.prediction_due():
            self.prefetch(L, h, logits, step)
        if step.dump is not None:
            step.dump[f"blk.{L}.router_logits"] = logits.copy()
            step.dump[f"blk.{L}.expert_ids"] = ids.copy()
        one = h.shape[0] == 1  # decode: no grouping needed, each pick is one expert
        if one and lw.expert_biases is None and self.act == "silu" and self._fusable(L, ids[0].tolist()) and \
                _integer_path(h, (), step) and cache.all_ready(L, ids[0].tolist()):
            out = self._experts_in_one_call(L, h, ids[0].tolist(), weights[0], step)
        else:
            out = step.empty(h.shape)
            out[...] = 0
            pick = dict(zip(ids[0].tolist(), weights[0].tolist())) if one else None
            h32 = h if one else np.ascontiguousarray(h, dtype=np.float32)  # what take_rows reads, once a layer
            order = cache.order_for_use(L, ids[0] if one else np.unique(ids))  # resident experts first
            with nullcontext() if one else cache.scan():  # a prompt's pass: no layer left empty
                for i, e in enumerate(order):
                    if i + 1 < len(order):
                        cache.load_ahead(L, order[i + 1])  # the next one loads while this one computes
                    rows, slot = (slice(None), None) if one else np.nonzero(ids == e)
                    if not one:  # a prompt: its tokens of e gathered and their outputs added back on every thread
                        hs = step.empty((len(rows), h.shape[1]))
                        ffn.take_rows(h32, rows, hs)
                    with cache.use(L, e) as ew:
                        y = expert_mlp(h if one else hs, ew, step, self.act, self.biases(lw, e), self.clamp)
                    if one:
                        out += pick[e] * y
                    else:
                        ffn.add_weighted_rows(out, rows, np.ascontiguousarray(weights[rows, slot], dtype=np.float32),
                                              np.ascontiguousarray(y, dtype=np.float32))
        if lw.shared is not None:  # spec.shared_expert == "sigmoid_gate" (Qwen2-MoE, Qwen3.5)
            gate = 1.0 / (1.0 + np.exp(-(h @ lw.shared_gate)))  # (T,)
            out += gate[:, None].astype(np.float32) * expert_mlp(h, lw.shared, step)
        return out

    def route(self, logits: np.ndarray, lw: LayerWeights, step: Step) -> tuple[np.ndarray, np.ndarray]:
        """(T, E) router logits -> (T, k) weights and expert ids, by spec.router."""
        if self.spec.router == "gemma4":
            ids, weights = ffn.pick_gemma4(logits, lw.sandwich.expert_scale, self.cfg.top_k)
            return weights, ids.astype(np.int64)
        if self.spec.router == "topk_softmax":  # gpt-oss (its bias is in the logits already)
            ids, weights = ffn.pick_topk_softmax(logits, self.cfg.top_k)
            return weights, ids.astype(np.int64)
        if self.spec.router == "sigmoid_bias":  # E <= 256 per token: numpy
            ids, weights = ffn.pick_sigmoid_bias(logits, lw.expert_bias, self.cfg.top_k, self.renormalise,
                                                 self.cfg.routed_scaling_factor)
            return weights, ids.astype(np.int64)
        return softmax_top_k(logits, self.cfg.top_k, self.renormalise, step)

    @staticmethod
    def biases(lw: LayerWeights, e: int) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """Expert e's gate, up and down bias rows (gpt-oss), or None."""
        return None if lw.expert_biases is None else tuple(b[e] for b in lw.expert_biases)

    def _fusable(self, L: int, experts: list[int]) -> bool:
        """Whether these experts are stored in one integer-dot format per matrix (gate, up, down), so
        that cpu.moe_int can take them together."""
        codes = {tuple(p[3] % cpu.PACKED for p in self.w.store.span(L, e).parts) for e in experts}
        return len(codes) == 1 and all(c in cpu.PACKABLE for c in next(iter(codes)))

    def compile_expert_call(self) -> None:
        """Compile (or load) cpu.moe_int now: a token decoded layer by layer takes it when its picks are
        all loaded, which warm-up's own tokens seldom are, so the first reply would compile it. Empty
        matrices: a real call's types, nothing computed."""
        if not self.cfg.is_moe or self.act != "silu":
            return
        k, z = self.cfg.top_k, np.zeros((0, 0), np.uint8)
        cpu.moe_int((z,) * k, (z,) * k, (z,) * k, cpu.Q8_0, cpu.Q8_0, cpu.Q8_0, np.zeros(k, np.float32),
                    np.zeros((1, 0), np.float32), np.zeros((k, 0), np.float32), np.zeros((1, 0), np.float32))

    def compile_prompt_swiglu(self) -> None:
        """Compile (or load) cpu.swiglu_tiles now where gate and up are in a tiled format: a long prompt
        takes it, and the first reply would map LLVM's library back in. Empty matrices: nothing computed."""
        if self.act != "silu" or not self._gate_up_codes() & set(cpu.TILE_CODES):
            return
        z, c = np.zeros((0, 0), np.uint8), cpu.TILE_CODES[0]
        cpu.swiglu_tiles(z, c, z, c, np.zeros((cpu.TILE_MIN_T, 0), np.float32),
                         np.zeros((cpu.TILE_MIN_T, 0), np.float32))

    def _gate_up_codes(self) -> set[int]:
        """The formats (GGML ids) of the gate and up matrices: resident MLPs and shared experts, and one
        routed expert of each layer (its file's header: nothing loaded)."""
        codes: set[int] = set()
        for L, lw in enumerate(self.w.layers):
            for ew in (lw.dense, lw.shared):
                if ew is not None:
                    codes |= {m.code - cpu.PACKED if m.code >= cpu.PACKED else m.code for m in (ew.gate, ew.up)}
            if lw.dense is None and (lw.router is not None or self.cfg.num_experts == 1):
                try:
                    parts = self.w.experts.store.span(L, 0).parts
                except ExpertLoadError:  # (a broken file says so when it is used)
                    continue
                codes |= {code - cpu.PACKED if code >= cpu.PACKED else code for _, _, _, code, _ in parts[:2]}
        return codes

    def _experts_in_one_call(self, L: int, h: np.ndarray, experts: list[int], mix: np.ndarray,
                             step: Step) -> np.ndarray:
        """A token's loaded experts in one kernel call (cpu.moe_int), pinned meanwhile."""
        with ExitStack() as pins:
            ews = [pins.enter_context(self.w.experts.use(L, e)) for e in experts]
            out = step.empty(h.shape)
            act = step.empty((len(ews), ews[0].gate.rows))
            step.k.moe_int(tuple(ew.gate.data for ew in ews), tuple(ew.up.data for ew in ews),
                           tuple(ew.down.data for ew in ews), ews[0].gate.code, ews[0].up.code, ews[0].down.code,
                           np.ascontiguousarray(mix, np.float32), np.ascontiguousarray(h, np.float32), act, out)
            return out

    def prefetch(self, L: int, h: np.ndarray, logits: np.ndarray, step: Step) -> None:
        """Queue the experts the next layer's router picks from this layer's hidden state, and this
        layer's runners-up for the next token (called where prediction_due() said yes)."""
        cache, k = self.w.experts, self.cfg.top_k
        if L + 1 < len(self.w.layers) and self.w.layers[L + 1].router is not None:
            nxt = np.argsort(-linear(h, self.w.layers[L + 1].router, step), axis=-1)[:, :k]
            cache.prefetch(L + 1, np.unique(nxt), due=True)
        ranked = np.argsort(-logits, axis=-1)
        cache.prefetch(L, np.unique(ranked[:, k:k + 1]), spare_only=True, due=True)

    def sandwich_layer(self, L: int, x: np.ndarray, lw: LayerWeights, mixer, step: Step) -> np.ndarray:
        """Gemma 4, in place on x: x += post(mixer(pre x)); a dense MLP on ffn_norm(x) beside the
        experts on pre_ffw_norm_2(x) (routed from the raw x), each post-normed, their sum
        post-normed and added (a dense model: its MLP alone); the layer's own input (E2B/E4B,
        engine.models.per_layer); x *= the layer scalar. Returns what the feed-forward part added."""
        eps, sw = self.cfg.rms_norm_eps, lw.sandwich
        x += rmsnorm(mixer(L, rmsnorm(x, lw.attn_norm, eps, step), lw, step), sw.post_attention, eps, step)
        if lw.router is None:  # a dense model: its MLP (expert 0) only
            f = rmsnorm(self.ffn(L, rmsnorm(x, lw.ffn_norm, eps, step), lw, step), sw.post_ffw, eps, step)
        else:
            m1 = rmsnorm(expert_mlp(rmsnorm(x, lw.ffn_norm, eps, step), lw.dense, step, self.act), sw.post_ffw_1,
                         eps, step)
            route_in = norms.rms(x, eps) * sw.router_scale * np.float32(self.cfg.hidden_size ** -0.5)
            m2 = self.ffn(L, rmsnorm(x, sw.pre_ffw_2, eps, step), lw, step, route_in)
            f = rmsnorm(m1 + rmsnorm(m2, sw.post_ffw_2, eps, step), sw.post_ffw, eps, step)
        x += f
        if lw.per_layer is not None:  # E2B/E4B: the layer's own input
            add_per_layer_input(x, lw.per_layer, self.per_layer_in[:, L], eps, step)
        x *= np.float32(sw.layer_scale)
        return f

    # --- the token mixers ----------------------------------------------------------------------
    def new_states(self, capacity: int, kind: str = "f32") -> list:
        """A sequence's per-layer caches beside the KV block: a short_conv layer's conv tail; with
        op_attention a ring of sliding_window positions or a FullKV of `capacity`, stored as `kind`
        (kv_cache_quantize); None: the block."""
        cfg = self.cfg
        out = []
        for k in self.kinds:
            if k == "short_conv":
                out.append(states.ConvState(cfg.conv_kernel, cfg.hidden_size))
            elif k == "linear_attention":
                nk, nv, dk, dv = cfg.linear_key_heads, cfg.linear_value_heads, cfg.linear_key_dim, cfg.linear_value_dim
                out.append(states.DeltaState(nv, dk, dv, cfg.conv_kernel, 2 * nk * dk + nv * dv))
            elif self.kv_from[len(out)] != len(out):  # its keys and values are another layer's
                out.append(SharedKV())
            elif self.op_attention and k == "sliding_attention":
                out.append(states.RingKV(cfg.sliding_window, *cfg.attention_shape(len(out)), kind=kind))
            elif self.op_attention:
                out.append(states.FullKV(capacity, *cfg.attention_shape(len(out)), kind=kind))
            else:
                out.append(None)
        return out

    def linear_attention(self, L: int, h: np.ndarray, lw: LayerWeights, step: Step) -> np.ndarray:
        """Qwen3.5's gated DeltaNet: conv (SiLU) over q|k|v with its carried tail, the delta rule
        over the layer's (Hv, dk, dv) state, rms(core) * w * silu(z), out_proj."""
        cfg, d, T = self.cfg, lw.delta, h.shape[0]
        nk, nv, dk, dv = cfg.linear_key_heads, cfg.linear_value_heads, cfg.linear_key_dim, cfg.linear_value_dim
        st = step.cache.states[L]
        qkv = linear(h, d.qkv, step)
        mixed = step.empty(qkv.shape)
        conv.causal_conv(qkv, d.conv, st.conv.x, True, mixed)
        q = np.ascontiguousarray(mixed[:, :nk * dk].reshape(T, nk, dk))
        k = np.ascontiguousarray(mixed[:, nk * dk:2 * nk * dk].reshape(T, nk, dk))
        v = np.ascontiguousarray(mixed[:, 2 * nk * dk:].reshape(T, nv, dv))
        beta = (1 / (1 + np.exp(-linear(h, d.beta, step).astype(np.float64)))).astype(np.float32)
        a = (linear(h, d.alpha, step) + d.dt_bias).astype(np.float64)
        g = (d.a.astype(np.float64) * np.logaddexp(0, a)).astype(np.float32)  # A * softplus(a + dt_bias)
        core = step.empty((T, nv, dv))
        deltanet.delta_rule(q, k, v, g, beta, st.s, cfg.delta_tiled, self.delta_work, core)
        z = linear(h, d.z, step).reshape(T, nv, dv)
        o = norms.gated_rmsnorm(core, z, d.norm, cfg.rms_norm_eps).reshape(T, nv * dv)
        if step.dump is not None:
            step.dump[f"blk.{L}.attn_out"] = o.copy()
        return linear(o, d.out, step)

    def _op_attention(self, L: int, q: np.ndarray, k: np.ndarray | None, v: np.ndarray | None, lw: LayerWeights,
                      step: Step) -> np.ndarray:
        """Attention through engine.ops over layer L's own cache: sinks, a per-layer window."""
        T, H = q.shape[:2]
        qpos = np.arange(step.pos0, step.pos0 + T, dtype=np.int64)
        if self.kv_from[L] != L:  # a KV-shared layer: its source's keys, stored earlier in this pass
            ks, k_scale, vs, v_scale, kpos = self.shared_kv[self.kv_from[L]]
        else:
            ks, k_scale, vs, v_scale, kpos = kv = step.cache.states[L].update_stored(np.ascontiguousarray(k),
                                                                                    np.ascontiguousarray(v), qpos)
            if self.cfg.kv_shared_layers:
                self.shared_kv[L] = kv
        window = self.cfg.sliding_window if self.kinds[L] == "sliding_attention" else 0
        sinks = lw.sinks if lw.sinks is not None else np.zeros(H, np.float32)
        out, scores = step.empty(q.shape), step.empty((T, H, len(kpos)))
        op_attention.attention(np.ascontiguousarray(q), ks, vs, k_scale, v_scale, ks.dtype == np.int8, qpos, kpos,
                               self.scale, int(window or 0), sinks, lw.sinks is not None, np.float32(0.0), scores, out)
        return out

    def short_conv(self, L: int, h: np.ndarray, lw: LayerWeights, step: Step) -> np.ndarray:
        """LFM2: B, C, x = in_proj h; y = C * causal_conv(B * x) over the carried tail; out_proj y."""
        D, T = self.cfg.hidden_size, h.shape[0]
        bcx = linear(h, lw.conv_in, step)
        bx = np.ascontiguousarray(bcx[:, :D] * bcx[:, 2 * D:])
        y = step.empty((T, D))
        conv.causal_conv(bx, lw.conv_w, step.cache.states[L].x, False, y)
        y *= bcx[:, D:2 * D]
        if step.dump is not None:
            step.dump[f"blk.{L}.attn_out"] = y.copy()
        return linear(y, lw.conv_out, step)

    def attention(self, L: int, h: np.ndarray, lw: LayerWeights, step: Step) -> np.ndarray:
        cfg, T = self.cfg, h.shape[0]
        H, (KV, hd) = cfg.num_heads, cfg.attention_shape(L)
        cos, sin = (step.cos, step.sin) if self.kinds[L] != "attention" or self.full_tables is None else \
            self.full_tables
        if lw.k is None:  # a KV-shared layer (Gemma 4 E2B/E4B): q only, over its source layer's keys and values
            q = rmsnorm(linear(h, lw.q, step).reshape(T, H, hd), lw.q_norm, cfg.rms_norm_eps, step)
            step.k.rope(q, cos, sin)
            return linear(self._op_attention(L, q, None, None, lw, step).reshape(T, H * hd), lw.o, step)
        if lw.v is None:  # k_eq_v (Gemma 4's full layers): v is the raw k projection
            q, k = linears(h, (lw.q, lw.k), step)
            v = k.copy()
        else:
            q, k, v = linears(h, (lw.q, lw.k, lw.v), step)
        gate = None
        if self.spec.attention_gate:  # Qwen3.5: per head [q | gate]
            qg = q.reshape(T, H, 2 * hd)
            q, gate = np.ascontiguousarray(qg[..., :hd]).reshape(T, H * hd), qg[..., hd:].reshape(T, H * hd)
        if lw.q_bias is not None:
            q += lw.q_bias
            k += lw.k_bias
            v += lw.v_bias
        if cfg.qk_norm == "full":  # OLMoE: one norm over all heads
            q, k = rmsnorm(q, lw.q_norm, cfg.rms_norm_eps, step), rmsnorm(k, lw.k_norm, cfg.rms_norm_eps, step)
        q, k, v = q.reshape(T, H, hd), k.reshape(T, KV, hd), v.reshape(T, KV, hd)
        if cfg.qk_norm == "head":  # Qwen3: a norm per head
            q, k = rmsnorm(q, lw.q_norm, cfg.rms_norm_eps, step), rmsnorm(k, lw.k_norm, cfg.rms_norm_eps, step)
        if self.spec.v_norm:  # Gemma 4: v RMS-normalised per head, no weight
            v = norms.rms(v, cfg.rms_norm_eps)
        if cfg.clip_qkv:
            for a in (q, k, v):
                np.clip(a, -cfg.clip_qkv, cfg.clip_qkv, out=a)
        turn = rope.rope if self.partial_rope else step.k.rope
        turn(q, cos, sin)
        turn(k, cos, sin)
        if self.op_attention:
            out = self._op_attention(L, q, k, v, lw, step)
        else:
            out = self._block_attention(L, q, k, v, step)
        if step.dump is not None:
            step.dump |= {f"blk.{L}.q": q.copy(), f"blk.{L}.k": k.copy(), f"blk.{L}.v": v.copy(),
                          f"blk.{L}.attn_out": out.reshape(T, -1).copy()}
        if gate is not None:
            out = out.reshape(T, H * hd) * (1 / (1 + np.exp(-gate.astype(np.float64)))).astype(np.float32)
        o = linear(out.reshape(T, H * hd), lw.o, step)
        if lw.o_bias is not None:
            o += lw.o_bias
        return o

    def _block_attention(self, L: int, q: np.ndarray, k: np.ndarray, v: np.ndarray, step: Step) -> np.ndarray:
        """Attention over the KV cache's block (f32, f16 or int8), the engine's attention kernel."""
        T, H = q.shape[:2]
        if step.seqs is not None:  # engine.batch: each row on its own cache, at its own position
            out = step.empty(q.shape)
            for i, (cache, pos) in enumerate(step.seqs):
                cache.write(L, pos, k[i:i + 1], v[i:i + 1])
                keys, values, ks, vs, scaled = cache.views(L, pos + 1)
                step.k.attention(q[i:i + 1], keys, values, ks, vs, scaled, pos, self.cfg.sliding_window or 0,
                                 self.scale, step.empty((H, pos + 1)), out[i:i + 1])
            return out
        step.cache.write(L, step.pos0, k, v)
        keys, values, ks, vs, scaled = step.cache.views(L, step.pos0 + T)
        out = step.empty(q.shape)
        for a in range(0, T, ATTENTION_BLOCK):  # query blocks bound the scores buffer on long prompts
            b = min(T, a + ATTENTION_BLOCK)
            scores = step.empty(((b - a) * H, step.pos0 + b))
            step.k.attention(q[a:b], keys, values, ks, vs, scaled, step.pos0 + a, self.cfg.sliding_window or 0,
                             self.scale, scores, out[a:b])
        return out

    def rotary(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return rope.tables(self.inv_freq, positions, self.rope_factor)

    # --- the decoder loop ---------------------------------------------------------------------
    def forward(self, ids: np.ndarray, cache: KVCache | list[KVCache], pos0: int, all_logits: bool = False,
                dump: dict | None = None, before_layer: Callable[[int], None] | None = None,
                chunk: int | None = None, routes: list | None = None) -> np.ndarray:
        """The one decoder loop: one sequence's T tokens `ids` at positions pos0.. of `cache`, or,
        `cache` a list, N sequences' next token, row i at position cache[i].length of cache[i]
        (engine.models.rows). Each step's route, named in self.plan (Engine.stats): a fused kernel
        through every layer (FusedDecode: a token, its experts resident or streaming; N rows of a
        dense model), else layer by layer. Returns logits (T, vocab) if all_logits, else the last
        token's (1, vocab). `before_layer(L)` is called before each layer of a multi-token pass.
        chunk: at most this many tokens per pass (None: all at once). routes (a list) receives
        (layer, expert ids (T, k)) of each MoE layer."""
        if chunk is not None and len(ids) > chunk:
            out = [self.forward(ids[a:a + chunk], cache, pos0 + a, all_logits, dump, before_layer)
                   for a in range(0, len(ids), chunk)]
            return np.concatenate(out) if all_logits else out[-1]
        if isinstance(cache, list):  # N rows' next tokens
            check_rows(ids, cache)
            if len(cache) == 1 and routes is None:  # one row is one sequence's token (a chat's decode step)
                cache, pos0 = cache[0], cache[0].length
            elif not batchable(self):  # per-layer states: the rows one by one
                return np.concatenate([self.forward(np.asarray(ids[i:i + 1], np.int64), c, c.length)
                                       for i, c in enumerate(cache)])
        cfg, arena, T, rows = self.cfg, self.arena, len(ids), cache if isinstance(cache, list) else None
        arena.reset()
        if self.recurrent:
            cache.overwrite(pos0)
        if self.recurrent and (cache.states is None or pos0 == 0):
            cache.states = self.new_states(cache.capacity, cache.kind)
        elif self.recurrent and pos0 != cache.length:
            raise ValueError(f"a recurrent model's cache holds {cache.length} positions; cannot run from {pos0}")
        pos = np.array([c.length for c in rows], np.int64) if rows else np.arange(pos0, pos0 + T)
        cos, sin = self.rotary(pos)
        self.full_tables = rope.tables(self.inv_full, pos) if self.spec.full_rope == "proportional" else None
        step = Step(None if rows else cache, pos0, cos, sin, dump, arena, self.gpu, self.exact,
                    before_layer if T > 1 else None, self.timer, list(zip(rows, pos.tolist())) if rows else None, routes)
        x = step.empty((T, cfg.hidden_size))
        step.k.gather_rows(self.w.token_embd.data, self.w.token_embd.code, np.asarray(ids, np.int64), x)
        if self.spec.embed_scale:  # Gemma: embeddings times sqrt(hidden_size)
            x *= np.float32(cfg.hidden_size ** 0.5)
        self.shared_kv = {}
        if cfg.per_layer_input_size:  # Gemma 4 E2B/E4B: every layer's own input, from the ids and x
            self.per_layer_in = per_layer_inputs(self.w, ids, x, cfg.per_layer_input_size, cfg.rms_norm_eps, step)
        if dump is not None:
            dump["token_embd"] = x.copy()
        why = self.why_layered(step, T)
        fused = None if why else self.fused.rows(x, step) if step.seqs is not None else self.fused.run(x, step)
        self.plan = fused or f"layered ({why or 'no room in the KV cache, or experts or caches it cannot read'})"
        try:
            for L, lw in enumerate(self.w.layers if not fused else ()):
                if step.before_layer is not None:
                    step.before_layer(L)
                mark = arena.mark()
                mixer = {"short_conv": self.short_conv, "linear_attention": self.linear_attention}.get(
                    self.kinds[L], self.attention)
                if lw.sandwich is not None:
                    f = self.sandwich_layer(L, x, lw, mixer, step)
                else:
                    x += mixer(L, rmsnorm(x, lw.attn_norm, cfg.rms_norm_eps, step), lw, step)
                    f = self.ffn(L, rmsnorm(x, lw.ffn_norm, cfg.rms_norm_eps, step), lw, step)
                    x += f
                if dump is not None:
                    dump[f"blk.{L}.ffn_out"] = f.copy()
                    dump[f"blk.{L}.out"] = x.copy()
                arena.release(mark)  # the layer's buffers are dead: the next layer reuses them
        except BaseException:
            if self.recurrent:  # states half-advanced (a Stop mid-prompt): the sequence restarts
                cache.states, cache.length = None, 0
                cache.overwrite(0)
            raise
        for c, p in step.seqs or [(cache, pos0 + T - 1)]:
            c.length = p + 1
        h = rmsnorm(x if all_logits else x[-1:], self.w.output_norm, cfg.rms_norm_eps, step)
        logits = linear(h, self.w.output, step)
        if cfg.final_logit_softcap:
            logits = norms.softcap(logits, cfg.final_logit_softcap)
        if dump is not None:
            dump["output_norm"] = h.copy()
            dump["logits"] = logits.copy()
        return logits.copy()  # results leave the arena

    def why_layered(self, step: Step, T: int) -> str | None:
        """Why this step cannot take a fused kernel, or None when it may (never a matter of timing)."""
        if self.fused is None or not self.fused_decode:
            return self.fused_refusal or "the fused decode is off"
        why = [w for w, on in (("a dump", step.dump is not None), ("a GPU runner", step.gpu is not None),
                               ("float activations", step.exact), (f"a prompt of {T} tokens", step.seqs is None and T > 1),
                               (f"{T} sequences with experts", step.seqs is not None and not self.fused.dense)) if on]
        return ", ".join(why) or None
