"""Dense Llama family: Llama, Mistral (sliding window), Qwen2 (q/k/v biases), Qwen3 (per-head
q/k norm). A dense MLP is the model directory's expert 0."""
from __future__ import annotations

import numpy as np

from engine.models.base import Step, Transformer
from engine.weights import LayerWeights


class Llama(Transformer):
    def ffn(self, L: int, h: np.ndarray, lw: LayerWeights, step: Step) -> np.ndarray:
        return self.dense_ffn(L, h)
