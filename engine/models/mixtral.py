"""Mixtral: softmax over all experts, keep the top-k, renormalise them to sum to 1."""
from __future__ import annotations

import numpy as np

from engine.models.base import Step, Transformer, softmax_top_k
from engine.weights import LayerWeights


class Mixtral(Transformer):
    def route(self, logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return softmax_top_k(logits, *self.decode_routing())

    def decode_routing(self) -> tuple[int, bool] | None:
        return self.cfg.top_k, True

    def ffn(self, L: int, h: np.ndarray, lw: LayerWeights, step: Step) -> np.ndarray:
        return self.sparse_moe(L, h, lw, step)
