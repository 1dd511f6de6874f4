"""A model's weights as the kernels see them: stored matrices mapped in place from the model dir.

Nothing is dequantized or copied at load except small vectors (norms, biases), which become
float32. Experts are reached through `ExpertStore.get(layer, expert)`, the one door the expert
cache (on-demand loading) replaces.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from engine.model_dir import ModelDir, expert_file
from engine.tensorfile import TensorFile


@dataclass(frozen=True)
class Matrix:
    """A stored weight matrix: uint8 (rows, row_bytes) blocks of format `code` (GGML type id)."""
    name: str
    data: np.ndarray
    code: int
    rows: int
    cols: int

    @property
    def nbytes(self) -> int:
        return self.data.nbytes


def load_matrix(tf: TensorFile, name: str) -> Matrix:
    info = tf.infos[name]
    stored = tf.tensor(name)
    rows = int(np.prod(info.shape[:-1]))
    return Matrix(name, stored.view(np.uint8).reshape(rows, -1), info.qtype.type_id, rows, info.shape[-1])


def load_vector(tf: TensorFile, name: str) -> np.ndarray:
    return np.ascontiguousarray(tf.dequantize(name), dtype=np.float32).reshape(-1)


@dataclass(frozen=True)
class ExpertWeights:
    gate: Matrix
    up: Matrix
    down: Matrix


@dataclass(frozen=True)
class LayerWeights:
    attn_norm: np.ndarray
    q: Matrix
    k: Matrix
    v: Matrix
    o: Matrix
    ffn_norm: np.ndarray
    q_bias: np.ndarray | None = None
    k_bias: np.ndarray | None = None
    v_bias: np.ndarray | None = None
    q_norm: np.ndarray | None = None
    k_norm: np.ndarray | None = None
    router: Matrix | None = None
    shared_gate: np.ndarray | None = None  # Qwen2-MoE: sigmoid gate of the shared expert
    shared: ExpertWeights | None = None


class ExpertStore:
    """Every expert of every layer, each file opened (mapped) the first time it is asked for."""

    def __init__(self, model: ModelDir):
        self._model = model
        self._files: dict[str, TensorFile] = {}
        self._cache: dict[tuple[int, int | str], ExpertWeights] = {}

    def _file(self, rel: str) -> TensorFile:
        if rel not in self._files:
            self._files[rel] = self._model.tensor_file(rel)
        return self._files[rel]

    def get(self, layer: int, expert: int | str) -> ExpertWeights:
        key = (layer, expert)
        if key not in self._cache:
            tf = self._file(expert_file(layer, expert, self._model.split_experts))
            sfx = "_shexp" if expert == "shared" else f".{expert}"
            self._cache[key] = ExpertWeights(*(load_matrix(tf, f"blk.{layer}.ffn_{p}{sfx}.weight")
                                               for p in ("gate", "up", "down")))
        return self._cache[key]

    def close(self) -> None:
        self._cache.clear()
        for tf in self._files.values():
            tf.close()
        self._files.clear()


class ModelWeights:
    def __init__(self, model: ModelDir):
        cfg = model.config
        self.files: list[TensorFile] = []
        emb = self._open(model.path / "embeddings.bin")
        self.token_embd = load_matrix(emb, "token_embd.weight")
        self.output = self.token_embd if cfg.tie_word_embeddings else load_matrix(emb, "output.weight")
        self.output_norm = load_vector(emb, "output_norm.weight")
        self.rope_freqs = load_vector(emb, "rope_freqs.weight") if cfg.rope_freq_factors else None
        self.experts = ExpertStore(model)
        self.layers = [self._layer(model, L) for L in range(cfg.num_layers)]
        self._bytes = sum(e["size"] for rel, e in model.manifest["files"].items() if rel.endswith(".bin"))

    def _open(self, path: Path) -> TensorFile:
        tf = TensorFile(path)
        self.files.append(tf)
        return tf

    def _layer(self, model: ModelDir, L: int) -> LayerWeights:
        cfg, b = model.config, f"blk.{L}."
        at = self._open(model.path / f"attention/layer_{L}.bin")
        opt = lambda n: load_vector(at, b + n) if b + n in at else None  # noqa: E731
        router = shared_gate = shared = None
        if cfg.is_moe:
            rt = self._open(model.path / f"router/layer_{L}.bin")
            router = load_matrix(rt, b + "ffn_gate_inp.weight")
            if cfg.shared_expert_intermediate_size:
                shared_gate = load_vector(rt, b + "ffn_gate_inp_shexp.weight")
                shared = self.experts.get(L, "shared")
        return LayerWeights(
            attn_norm=load_vector(at, b + "attn_norm.weight"), q=load_matrix(at, b + "attn_q.weight"),
            k=load_matrix(at, b + "attn_k.weight"), v=load_matrix(at, b + "attn_v.weight"),
            o=load_matrix(at, b + "attn_output.weight"), ffn_norm=load_vector(at, b + "ffn_norm.weight"),
            q_bias=opt("attn_q.bias"), k_bias=opt("attn_k.bias"), v_bias=opt("attn_v.bias"),
            q_norm=opt("attn_q_norm.weight"), k_norm=opt("attn_k_norm.weight"),
            router=router, shared_gate=shared_gate, shared=shared)


    def nbytes(self) -> int:
        """Bytes of all weight files (every expert, resident or not)."""
        return self._bytes

    def close(self) -> None:
        self.experts.close()
        for f in self.files:
            f.close()
