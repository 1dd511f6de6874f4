"""Qwen2-MoE and Qwen3-MoE: softmax top-k, renormalised only if the config says so
(Qwen2-MoE: no, Qwen3-MoE: yes); Qwen2-MoE adds an always-on shared expert scaled by a
sigmoid gate. Qwen3-MoE's per-head q/k norm lives in the shared attention block."""
from __future__ import annotations

import numpy as np

from engine.models.base import Step, Transformer, expert_mlp, softmax_top_k
from engine.weights import LayerWeights


class QwenMoe(Transformer):
    def route(self, logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return softmax_top_k(logits, self.cfg.top_k, renormalise=self.cfg.norm_topk_prob)

    def ffn(self, L: int, h: np.ndarray, lw: LayerWeights, step: Step) -> np.ndarray:
        out = self.sparse_moe(L, h, lw, step)
        if lw.shared is not None:
            gate = 1.0 / (1.0 + np.exp(-(h @ lw.shared_gate)))  # (T,)
            out += gate[:, None].astype(np.float32) * expert_mlp(h, lw.shared)
        return out
