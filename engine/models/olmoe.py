"""OLMoE: softmax top-k without renormalisation (unless the config asks); its q/k RMSNorm
spans all heads at once (qk_norm "full"), handled by the shared attention block."""
from __future__ import annotations

import numpy as np

from engine.models.base import Step, Transformer, softmax_top_k
from engine.weights import LayerWeights


class Olmoe(Transformer):
    def route(self, logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return softmax_top_k(logits, *self.decode_routing())

    def decode_routing(self) -> tuple[int, bool] | None:
        return self.cfg.top_k, self.cfg.norm_topk_prob

    def ffn(self, L: int, h: np.ndarray, lw: LayerWeights, step: Step) -> np.ndarray:
        return self.sparse_moe(L, h, lw, step)
