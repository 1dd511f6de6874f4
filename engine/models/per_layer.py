"""Gemma 4's edge models (E2B/E4B): each layer's own input, and the last layers' shared keys and values.

Per-layer inputs (transformers' `embed_tokens_per_layer`, `per_layer_input_gate`): a token's row of a
(vocab, layers * P) table, times sqrt(P), plus the scaled embedding projected to the same width,
times hidden^-1/2 and RMS-normed per layer; their sum times 2^-1/2 is split into one (T, P) input per
layer. After its feed-forward part a layer adds norm(proj(gelu_tanh(gate h) * its input)).

KV sharing (`num_kv_shared_layers`): the last layers compute no keys or values; each attends over
those its source layer (ModelConfig.kv_source) stored in this pass, so its cache slot holds nothing.
"""
from __future__ import annotations

import numpy as np

from engine.models.blocks import Step, linear, rmsnorm
from engine.ops import ffn
from engine.weight_types import PerLayerInput


def per_layer_inputs(weights, ids: np.ndarray, x: np.ndarray, P: int, eps: float, step: Step) -> np.ndarray:
    """(T, layers, P) inputs of every layer, from the token ids and the scaled embeddings x (T, D)."""
    T, D = x.shape
    tok = step.empty((T, weights.per_layer_embd.cols))
    step.k.gather_rows(weights.per_layer_embd.data, weights.per_layer_embd.code, np.asarray(ids, np.int64), tok)
    proj = linear(x, weights.per_layer_model_proj, step) * np.float32(D ** -0.5)
    proj = rmsnorm(proj.reshape(T, -1, P), weights.per_layer_proj_norm, eps, step)
    return (proj + tok.reshape(T, -1, P) * np.float32(P ** 0.5)) * np.float32(2 ** -0.5)


def add_per_layer_input(x: np.ndarray, pl: PerLayerInput, inp: np.ndarray, eps: float, step: Step) -> None:
    """x (T, D) += norm(proj(gelu_tanh(gate x) * inp)), inp (T, P) this layer's input; in place."""
    g = ffn.gelu_tanh(linear(x, pl.gate, step)) * inp
    x += rmsnorm(linear(g, pl.proj, step), pl.norm, eps, step)


class SharedKV:
    """A KV-shared layer's cache slot: it stores nothing (its source layer's cache holds the keys)."""
    nbytes = 0

    def copy(self) -> SharedKV:
        return self

    def reset(self) -> None:
        pass
