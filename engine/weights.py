"""A model's weights as the kernels see them: stored matrices mapped in place from the model dir.

Nothing is dequantized or copied at load except small vectors (norms, biases), which become
float32. Experts are not mapped: they are loaded on demand into the expert cache
(`engine.experts`), reached through `ModelWeights.experts.use(layer, expert)`.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from engine.model_dir import ModelDir
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


class ModelWeights:
    def __init__(self, model: ModelDir, pool, plan, prefetch_window: int, repack: bool = True):
        """`plan`: the expert cache's budget (engine.experts.CachePlan). `repack`: resident q4
        experts go into the CPU kernels' 8-row groups (engine.experts); off when a GPU may take
        expert matmuls (its kernels read the stored layout)."""
        from engine.experts import ExpertStore
        cfg = model.config
        self.files: list[TensorFile] = []
        self.pool = pool
        self.store = ExpertStore(model)
        self._shared_blocks = []
        self._packed_blocks = []  # repacked copies of mapped matrices (_repacked)
        self.top_k = cfg.top_k
        self.repack = repack
        self.experts = self._expert_cache(cfg.num_layers, cfg.num_experts, plan, prefetch_window)
        emb = self._open(model.path / "embeddings.bin")
        self.token_embd = load_matrix(emb, "token_embd.weight")  # a few rows a token: stays mapped
        if cfg.tie_word_embeddings:  # also the output head, read whole every token: repacked
            self.token_embd = self.output = self._repacked(self.token_embd, emb)  # (lookups read the groups)
        else:
            self.output = self._repacked(load_matrix(emb, "output.weight"), emb)
        self.output_norm = load_vector(emb, "output_norm.weight")
        self.rope_freqs = load_vector(emb, "rope_freqs.weight") if cfg.rope_freq_factors else None
        self.layers = [self._layer(model, L) for L in range(cfg.num_layers)]
        self.model_files = model.manifest["files"]
        self._bytes = sum(e["size"] for rel, e in self.model_files.items() if rel.endswith(".bin"))

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
                shared = self._resident(L, "shared")
        mat = lambda n: self._repacked(load_matrix(at, b + n), at)  # noqa: E731
        return LayerWeights(
            attn_norm=load_vector(at, b + "attn_norm.weight"), q=mat("attn_q.weight"),
            k=mat("attn_k.weight"), v=mat("attn_v.weight"),
            o=mat("attn_output.weight"), ffn_norm=load_vector(at, b + "ffn_norm.weight"),
            q_bias=opt("attn_q.bias"), k_bias=opt("attn_k.bias"), v_bias=opt("attn_v.bias"),
            q_norm=opt("attn_q_norm.weight"), k_norm=opt("attn_k_norm.weight"),
            router=router, shared_gate=shared_gate, shared=shared)

    def _repacked(self, m: Matrix, source: TensorFile) -> Matrix:
        """A q4/q8_0 attention or output matrix (a tied embedding table too) copied out of its
        mapped file into pool memory in the kernels' 8-row groups (as resident experts are):
        the same resident bytes (the file's pages are released to the page cache), faster to decode.
        Others stay mapped."""
        from engine.kernels import cpu
        if not self.repack or m.code not in cpu.PACKABLE or m.rows % 8:
            return m
        block = self.pool.alloc(m.nbytes)
        self._packed_blocks.append(block)
        data = block.array(np.uint8, m.data.shape)
        data[...] = m.data
        source.release(m.name)  # the mapped pages the copy read leave the resident set
        cpu.repack_x8(data, m.code)
        return Matrix(m.name, data, m.code + cpu.PACKED, m.rows, m.cols)

    def _resident(self, layer: int, expert: int | str) -> ExpertWeights:
        """An always-used expert (Qwen2-MoE's shared one), loaded once outside the LRU cache."""
        block = self.pool.alloc(self.store.span(layer, expert).slot_bytes)
        self._shared_blocks.append(block)
        return self.store.read_into(layer, expert, block.array(np.uint8, (block.size,)), self.repack)

    def dense_bytes(self) -> int:
        """Bytes of everything but the routed experts (always resident once touched)."""
        return sum(e["size"] for rel, e in self.model_files.items()
                   if rel.endswith(".bin") and not rel.startswith("experts/")) + \
            sum(b.size for b in self._shared_blocks)

    def nbytes(self) -> int:
        """Bytes of all weight files (every expert, resident or not)."""
        return self._bytes

    def reset_experts(self, plan, prefetch_window: int) -> None:
        """A new, empty expert cache with other settings."""
        old = self.experts
        old.close()
        self.experts = self._expert_cache(len(self.layers), old.num_experts, plan, prefetch_window)

    def _expert_cache(self, num_layers: int, num_experts: int, plan, prefetch_window: int):
        from engine.experts import ExpertCache
        return ExpertCache(self.store, self.pool, num_layers, num_experts, plan.cache_bytes, prefetch_window,
                           self.top_k, self.repack, plan.per_layer)

    def check_files(self) -> None:
        """Each mapped weight file still as long as when it was opened (TensorFile.check); the
        expert files the store reads on demand are not covered."""
        for f in self.files:
            f.check()

    def close(self) -> None:
        self.experts.close()
        self.store.close()
        self.layers = []
        for b in self._shared_blocks + self._packed_blocks:
            b.free()
        for f in self.files:
            f.close()
