"""A plain forward pass of each 2026 architecture over engine/ops, for the tests (and as the recipe
the engine's declarative specs wire): every layer kind as one function over its weights, its cache
and a chunk of tokens, so the same code runs a whole prompt at once or one token at a time.

Reads the fixture checkpoints of tests/fixtures/arch/<arch>/ (HF names, bf16 widened to f32).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from hf_util import read_folder

from engine.ops import attention as att
from engine.ops import cache as caches
from engine.ops import conv, deltanet, ffn, norms, rope

ARCH_FIXTURES = Path(__file__).resolve().parent / "fixtures" / "arch"
ARCHS = ["gpt_oss", "qwen3_5_moe", "lfm2_moe", "gemma4"]


def silu(x):
    return (x / (1 + np.exp(-x.astype(np.float64)))).astype(np.float32)


def sigmoid(x):
    return (1 / (1 + np.exp(-x.astype(np.float64)))).astype(np.float32)


class Model:
    """Weights + config of one fixture, the caches of one sequence, and its forward pass."""

    def __init__(self, arch: str, weights: dict[str, np.ndarray] | None = None, cfg: dict | None = None,
                 tiled: bool = False):
        """weights/cfg: HF-named tensors and config fields (default: the fixture's safetensors and
        config.json); tiled: DeltaNet value heads in llama.cpp's order."""
        self.arch, self.dir, self.tiled = arch, ARCH_FIXTURES / arch, tiled
        self.cfg = json.loads((self.dir / "config.json").read_text()) if cfg is None else cfg
        self.w = read_folder(self.dir) if weights is None else weights
        c = self.cfg
        self.types = c["layer_types"]
        self.H = c["hidden_size"]
        self.eps = c.get("rms_norm_eps", c.get("norm_eps"))
        self.reset()

    # --- per-layer geometry and caches ---------------------------------------------------------
    def head_dim(self, i: int) -> int:
        c = self.cfg
        if self.arch == "gemma4" and self.types[i] == "full_attention":
            return c["per_layer_config"][str(i)]["head_dim"]
        return c.get("head_dim") or self.H // c["num_attention_heads"]

    def kv_heads(self, i: int) -> int:
        c = self.cfg
        if self.arch == "gemma4" and self.types[i] == "full_attention":
            return c["per_layer_config"][str(i)]["num_key_value_heads"]
        return c["num_key_value_heads"]

    def new_cache(self, i: int, capacity: int = 256):
        c, t = self.cfg, self.types[i]
        if t == "sliding_attention":
            return caches.RingKV(c["sliding_window"], self.kv_heads(i), self.head_dim(i))
        if t == "full_attention":
            return caches.FullKV(capacity, self.kv_heads(i), self.head_dim(i))
        if t == "linear_attention":
            kd, vd = c["linear_key_head_dim"], c["linear_value_head_dim"]
            ch = 2 * c["linear_num_key_heads"] * kd + c["linear_num_value_heads"] * vd
            return caches.DeltaState(c["linear_num_value_heads"], kd, vd, c["linear_conv_kernel_dim"], ch)
        if t == "conv":
            return caches.ConvState(c["conv_L_cache"], self.H)
        raise ValueError(f"{self.arch}: unknown layer type {t!r}")

    def reset(self) -> None:
        self.caches = [self.new_cache(i) for i in range(len(self.types))]
        self.pos = 0

    def rope_tables(self, i: int, positions: np.ndarray):
        c, hd = self.cfg, self.head_dim(i)
        rp = c["rope_parameters"]
        if self.arch == "gemma4":
            rp = rp[self.types[i]]
        kind = rp.get("rope_type", "default")
        if kind == "yarn":
            inv, f = rope.yarn_inv_freq(rp["rope_theta"], hd, rp["factor"], rp["original_max_position_embeddings"],
                                        rp.get("beta_fast", 32), rp.get("beta_slow", 1), rp.get("truncate", True))
            return rope.tables(inv, positions, f)
        if kind == "proportional":
            return rope.tables(rope.proportional_inv_freq(rp["rope_theta"], hd, rp["partial_rotary_factor"]),
                               positions)
        return rope.tables(rope.default_inv_freq(rp["rope_theta"], hd, rp.get("partial_rotary_factor", 1.0)),
                           positions)

    def p(self, name: str) -> np.ndarray:
        return self.w[name]

    # --- mixers --------------------------------------------------------------------------------
    def attention(self, i: int, x: np.ndarray, positions: np.ndarray) -> np.ndarray:
        c, a, pre = self.cfg, self.arch, f"model.layers.{i}.self_attn."
        T, hd, kvh, nh = len(x), self.head_dim(i), self.kv_heads(i), c["num_attention_heads"]
        W = self.w

        def lin(name):
            y = x @ W[pre + name + ".weight"].T
            return y + W[pre + name + ".bias"] if pre + name + ".bias" in W else y
        gate = None
        if a == "qwen3_5_moe":
            qg = lin("q_proj").reshape(T, nh, 2 * hd)
            q, gate = qg[..., :hd], qg[..., hd:].reshape(T, nh * hd)
        else:
            q = lin("q_proj").reshape(T, nh, hd)
        k = lin("k_proj").reshape(T, kvh, hd)
        v = lin("v_proj").reshape(T, kvh, hd) if pre + "v_proj.weight" in W else k.copy()
        if a in ("qwen3_5_moe", "lfm2_moe", "gemma4"):
            qn, kn = ("q_layernorm", "k_layernorm") if a == "lfm2_moe" else ("q_norm", "k_norm")
            zc = a == "qwen3_5_moe"
            q = norms.rmsnorm(q, W[pre + qn + ".weight"], self.eps, zc)
            k = norms.rmsnorm(k, W[pre + kn + ".weight"], self.eps, zc)
        if a == "gemma4":
            v = norms.rmsnorm(v, None, self.eps)
        cos, sin = self.rope_tables(i, positions)
        q, k = np.ascontiguousarray(q, np.float32), np.ascontiguousarray(k, np.float32)
        rope.rope(q, cos, sin)
        rope.rope(k, cos, sin)
        ks, vs, kpos = self.caches[i].update(k, np.ascontiguousarray(v, np.float32), positions)
        window = c["sliding_window"] if self.types[i] == "sliding_attention" else 0
        scale = 1.0 if a == "gemma4" else hd ** -0.5
        sinks = W[pre + "sinks"] if a == "gpt_oss" else None
        o = att.attend(q, ks, vs, positions, kpos, scale, window, sinks).reshape(T, nh * hd)
        if gate is not None:
            o = o * sigmoid(gate)
        out = "out_proj" if a == "lfm2_moe" else "o_proj"
        y = o @ W[pre + out + ".weight"].T
        return y + W[pre + out + ".bias"] if pre + out + ".bias" in W else y

    def deltanet(self, i: int, x: np.ndarray) -> np.ndarray:
        c, W, pre, st = self.cfg, self.w, f"model.layers.{i}.linear_attn.", self.caches[i]
        T, nk, nv = len(x), c["linear_num_key_heads"], c["linear_num_value_heads"]
        kd, vd = c["linear_key_head_dim"], c["linear_value_head_dim"]
        qkv = np.ascontiguousarray(x @ W[pre + "in_proj_qkv.weight"].T, np.float32)
        mixed = np.empty_like(qkv)
        conv.causal_conv(qkv, np.ascontiguousarray(W[pre + "conv1d.weight"][:, 0]), st.conv.x, True, mixed)
        q = mixed[:, :nk * kd].reshape(T, nk, kd)
        k = mixed[:, nk * kd:2 * nk * kd].reshape(T, nk, kd)
        v = mixed[:, 2 * nk * kd:].reshape(T, nv, vd)
        beta = sigmoid(x @ W[pre + "in_proj_b.weight"].T)
        a = (x @ W[pre + "in_proj_a.weight"].T + W[pre + "dt_bias"]).astype(np.float64)
        g = (-np.exp(W[pre + "A_log"].astype(np.float64)) * np.logaddexp(0, a)).astype(np.float32)
        core = np.empty((T, nv, vd), np.float32)
        deltanet.delta_rule(np.ascontiguousarray(q), np.ascontiguousarray(k), np.ascontiguousarray(v), g, beta,
                            st.s, self.tiled, deltanet.work_for(nv, kd, vd), core)
        z = (x @ W[pre + "in_proj_z.weight"].T).reshape(T, nv, vd)
        o = norms.gated_rmsnorm(core, z, W[pre + "norm.weight"], self.eps).reshape(T, nv * vd)
        return o @ W[pre + "out_proj.weight"].T

    def shortconv(self, i: int, x: np.ndarray) -> np.ndarray:
        W, pre, H = self.w, f"model.layers.{i}.conv.", self.H
        bcx = x @ W[pre + "in_proj.weight"].T
        b, cc, xx = bcx[:, :H], bcx[:, H:2 * H], bcx[:, 2 * H:]
        y = np.empty((len(x), H), np.float32)
        conv.causal_conv(np.ascontiguousarray(b * xx, np.float32), np.ascontiguousarray(W[pre + "conv.weight"][:, 0]),
                         self.caches[i].x, False, y)
        return (cc * y) @ W[pre + "out_proj.weight"].T

    def mixer(self, i: int, x: np.ndarray, positions: np.ndarray) -> np.ndarray:
        t = self.types[i]
        if t == "linear_attention":
            return self.deltanet(i, x)
        if t == "conv":
            return self.shortconv(i, x)
        return self.attention(i, x, positions)

    # --- feed-forward --------------------------------------------------------------------------
    def experts(self, pre: str, x: np.ndarray, ids: np.ndarray, wts: np.ndarray) -> np.ndarray:
        a, W, out = self.arch, self.w, np.zeros_like(x)
        for t in range(len(x)):
            for e, wt in zip(ids[t], wts[t], strict=True):
                if a == "gpt_oss":
                    gu = x[t:t + 1] @ W[pre + "gate_up_proj"][e] + W[pre + "gate_up_proj_bias"][e]
                    act = np.empty((1, gu.shape[1] // 2), np.float32)
                    ffn.clamped_swiglu(np.ascontiguousarray(gu, np.float32), np.float32(self.cfg["swiglu_alpha"]),
                                       np.float32(self.cfg["swiglu_limit"]), act)
                    y = act @ W[pre + "down_proj"][e] + W[pre + "down_proj_bias"][e]
                elif a == "gemma4":
                    gu = x[t] @ W[pre + "gate_up_proj"][e].T
                    n = gu.shape[0] // 2
                    y = (ffn.gelu_tanh(gu[:n]) * gu[n:]) @ W[pre + "down_proj"][e].T
                else:
                    g_, u_, d_ = ("w1", "w3", "w2") if a == "lfm2_moe" else ("gate_proj", "up_proj", "down_proj")
                    q = f"{pre}{e}."
                    y = (silu(x[t] @ W[q + g_ + ".weight"].T) * (x[t] @ W[q + u_ + ".weight"].T)) @ W[q + d_ + ".weight"].T
                out[t] += wt * y.reshape(-1)
        return out

    def ffn(self, i: int, x: np.ndarray, raw: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray | None]:
        """-> block output, router scores (what transformers records) or None for a dense layer."""
        a, c, W, L = self.arch, self.cfg, self.w, f"model.layers.{i}."
        if a == "gpt_oss":
            logits, ids, wts = ffn.route_gpt_oss(x, W[L + "mlp.router.weight"], W[L + "mlp.router.bias"],
                                                 c["num_experts_per_tok"])
            return self.experts(L + "mlp.experts.", x, ids, wts), logits
        if a == "qwen3_5_moe":
            logits, ids, wts = ffn.route_softmax(x, W[L + "mlp.gate.weight"], c["num_experts_per_tok"])
            s = L + "mlp.shared_expert."
            shared = (silu(x @ W[s + "gate_proj.weight"].T) * (x @ W[s + "up_proj.weight"].T)) @ W[s + "down_proj.weight"].T
            shared = shared * sigmoid(x @ W[L + "mlp.shared_expert_gate.weight"].T)
            return self.experts(L + "mlp.experts.", x, ids, wts) + shared, logits
        if a == "lfm2_moe":
            f = L + "feed_forward."
            if i < c["num_dense_layers"]:
                return (silu(x @ W[f + "w1.weight"].T) * (x @ W[f + "w3.weight"].T)) @ W[f + "w2.weight"].T, None
            logits, ids, wts = ffn.route_sigmoid_bias(x, W[f + "gate.weight"], W[f + "expert_bias"],
                                                      c["num_experts_per_tok"], c["norm_topk_prob"],
                                                      c["routed_scaling_factor"])
            return self.experts(f + "experts.", x, ids, wts), logits
        # gemma4: dense MLP on the normed stream beside experts routed from the raw residual
        m = (ffn.gelu_tanh(x @ W[L + "mlp.gate_proj.weight"].T) * (x @ W[L + "mlp.up_proj.weight"].T)) @ W[L + "mlp.down_proj.weight"].T
        m1 = norms.rmsnorm(m, W[L + "post_feedforward_layernorm_1.weight"], self.eps)
        probs, ids, wts = ffn.route_gemma4(raw, W[L + "router.proj.weight"], W[L + "router.scale"],
                                           W[L + "router.per_expert_scale"], c["top_k_experts"], self.eps)
        x2 = norms.rmsnorm(raw, W[L + "pre_feedforward_layernorm_2.weight"], self.eps)
        m2 = norms.rmsnorm(self.experts(L + "experts.", x2, ids, wts), W[L + "post_feedforward_layernorm_2.weight"],
                           self.eps)
        return m1 + m2, probs

    # --- the whole model -----------------------------------------------------------------------
    def norm_names(self, i: int) -> tuple[str, str]:
        return ("operator_norm", "ffn_norm") if self.arch == "lfm2_moe" else ("input_layernorm", "post_attention_layernorm")

    def layer(self, i: int, h: np.ndarray, positions: np.ndarray, dump: dict | None = None) -> np.ndarray:
        W, L, zc = self.w, f"model.layers.{i}.", self.arch == "qwen3_5_moe"
        n1, n2 = self.norm_names(i)
        y = self.mixer(i, norms.rmsnorm(h, W[L + n1 + ".weight"], self.eps, zc), positions)
        if self.arch == "gemma4":
            h = h + norms.rmsnorm(y, W[L + "post_attention_layernorm.weight"], self.eps)
            f, scores = self.ffn(i, norms.rmsnorm(h, W[L + "pre_feedforward_layernorm.weight"], self.eps), raw=h)
            h = (h + norms.rmsnorm(f, W[L + "post_feedforward_layernorm.weight"], self.eps)) * W[L + "layer_scalar"]
        else:
            h = h + y
            f, scores = self.ffn(i, norms.rmsnorm(h, W[L + n2 + ".weight"], self.eps, zc))
            h = h + f
        if dump is not None and scores is not None:
            dump.setdefault("router", []).append(scores)
        return h.astype(np.float32)

    def forward(self, ids: np.ndarray, dump: dict | None = None) -> np.ndarray:
        """Logits (T, V) of the next chunk of tokens; the caches carry the sequence."""
        W, T = self.w, len(ids)
        positions = np.arange(self.pos, self.pos + T, dtype=np.int64)
        h = W["model.embed_tokens.weight"][ids]
        if self.arch == "gemma4":
            h = h * np.float32(self.H ** 0.5)
        if dump is not None:
            dump["hidden"] = [h]
        for i in range(len(self.types)):
            h = self.layer(i, h, positions, dump)
            if dump is not None:
                dump["hidden"].append(h)
        self.pos += T
        final = "model.embedding_norm.weight" if self.arch == "lfm2_moe" else "model.norm.weight"
        hn = norms.rmsnorm(h, W[final], self.eps, self.arch == "qwen3_5_moe")
        head = W.get("lm_head.weight", W["model.embed_tokens.weight"])
        logits = (hn @ head.T).astype(np.float32)
        if self.cfg.get("final_logit_softcapping"):
            logits = norms.softcap(logits, self.cfg["final_logit_softcapping"])
        if dump is not None:
            dump["final_norm_input"], dump["final_norm"] = h, hn
        return logits
