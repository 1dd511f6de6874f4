"""A model's weights as the kernels see them: stored matrices mapped in place from the model dir.

Nothing is dequantized or copied at load except small vectors (norms, biases), which become
float32. Experts are loaded on demand into the expert cache (`ModelWeights.experts.use(L, e)`).
"""
from __future__ import annotations

import numpy as np

from engine.arch import spec
from engine.model_dir import ModelDir
from engine.tensorfile import TensorFile
from engine.weight_types import DeltaWeights, ExpertWeights, LayerWeights, Matrix, PerLayerInput, SandwichNorms

__all__ = ["ExpertWeights", "LayerWeights", "Matrix", "ModelWeights", "load_matrix", "load_vector"]


def load_matrix(tf: TensorFile, name: str) -> Matrix:
    info = tf.infos[name]
    stored = tf.tensor(name)
    rows = int(np.prod(info.shape[:-1]))
    return Matrix(name, stored.view(np.uint8).reshape(rows, -1), info.qtype.type_id, rows, info.shape[-1])


def load_vector(tf: TensorFile, name: str) -> np.ndarray:
    return np.ascontiguousarray(tf.dequantize(name), dtype=np.float32).reshape(-1)


class ModelWeights:
    def __init__(self, model: ModelDir, pool, store, experts, repack: bool = True):
        """`experts` (the cache over `store`) is built by the Engine, which replaces it when its settings
        change. `repack`: q4/q8_0 matrices in the CPU kernels' 8-row groups (off when a GPU may take them)."""
        cfg = model.config
        self.files: list[TensorFile] = []
        self.pool = pool
        self.store = store
        self.experts = experts
        self._shared_blocks = []
        self._packed_blocks = []  # repacked copies of mapped matrices (_repacked)
        self.repack = repack
        emb = self._open(model, "embeddings.bin")
        self.token_embd = load_matrix(emb, "token_embd.weight")  # a few rows a token: stays mapped
        if cfg.tie_word_embeddings:  # also the output head, read whole every token: repacked
            self.token_embd = self.output = self._repacked(self.token_embd, emb)  # (lookups read the groups)
        else:
            self.output = self._repacked(load_matrix(emb, "output.weight"), emb)
        self.output_norm = load_vector(emb, "output_norm.weight")
        self.rope_freqs = load_vector(emb, "rope_freqs.weight") if cfg.rope_freq_factors else None
        # Gemma 4 E2B/E4B: every layer's input by token id (a few rows a token: mapped), and from the embedding
        self.per_layer_embd = self.per_layer_model_proj = self.per_layer_proj_norm = None
        if cfg.per_layer_input_size:
            self.per_layer_embd = load_matrix(emb, "per_layer_token_embd.weight")
            self.per_layer_model_proj = self._repacked(load_matrix(emb, "per_layer_model_proj.weight"), emb)
            self.per_layer_proj_norm = load_vector(emb, "per_layer_proj_norm.weight")
        self.layers = [self._layer(model, L) for L in range(cfg.num_layers)]
        self._bytes = sum(model.tensor_bytes().values())

    def _open(self, model: ModelDir, rel: str) -> TensorFile:
        tf = model.tensor_file(rel)
        self.files.append(tf)
        return tf

    def _layer(self, model: ModelDir, L: int) -> LayerWeights:
        cfg, b = model.config, f"blk.{L}."
        at = self._open(model, f"attention/layer_{L}.bin")
        opt = lambda n: load_vector(at, b + n) if b + n in at else None  # noqa: E731
        mat = lambda n: self._repacked(load_matrix(at, b + n), at)  # noqa: E731
        opt_mat = lambda n: mat(n) if b + n in at else None  # noqa: E731  (k, v: not in a KV-shared layer)
        sp = spec(cfg.architecture)
        dense = self._resident(L, "shared") if L < cfg.dense_layers or sp.parallel_dense and cfg.is_moe else None
        routed = cfg.is_moe and L >= cfg.dense_layers
        if cfg.layer_types and cfg.layer_types[L] == "short_conv":
            rest = self._router(model, L) if routed else {}
            return LayerWeights(attn_norm=load_vector(at, b + "attn_norm.weight"), q=None, k=None, v=None, o=None,
                                ffn_norm=load_vector(at, b + "ffn_norm.weight"), dense=dense,
                                conv_in=mat("shortconv.in_proj.weight"), conv_out=mat("shortconv.out_proj.weight"),
                                conv_w=np.ascontiguousarray(at.dequantize(b + "shortconv.conv.weight"), np.float32),
                                **rest)
        rest = self._router(model, L) if routed else {}
        if cfg.layer_types and cfg.layer_types[L] == "linear_attention":
            vec = lambda n: load_vector(at, b + n)  # noqa: E731
            delta = DeltaWeights(mat("attn_qkv.weight"), mat("attn_gate.weight"), mat("ssm_beta.weight"),
                                 mat("ssm_alpha.weight"), vec("ssm_a"), vec("ssm_dt.bias"),
                                 np.ascontiguousarray(at.dequantize(b + "ssm_conv1d.weight"), np.float32),
                                 vec("ssm_norm.weight"), mat("ssm_out.weight"))
            return LayerWeights(attn_norm=vec("attn_norm.weight"), q=None, k=None, v=None, o=None,
                                ffn_norm=vec("ffn_norm.weight"), delta=delta, **rest)
        if sp.norm_place == "sandwich":
            rt = self.files[-1] if routed else None  # the router file _router opened
            vec = lambda n: load_vector(at, b + n)  # noqa: E731
            moe = lambda n, f=at: load_vector(f, b + n) if routed else None  # noqa: E731
            rest["sandwich"] = SandwichNorms(
                vec("post_attention_norm.weight"), moe("post_ffw_norm_1.weight"), moe("pre_ffw_norm_2.weight"),
                moe("post_ffw_norm_2.weight"), vec("post_ffw_norm.weight"), float(vec("layer_output_scale.weight")[0]),
                moe("ffn_gate_inp.scale", rt), moe("ffn_down_exps.scale", rt))
        if b + "inp_gate.weight" in at:
            rest["per_layer"] = PerLayerInput(mat("inp_gate.weight"), mat("proj.weight"),
                                              load_vector(at, b + "post_norm.weight"))
        return LayerWeights(
            attn_norm=load_vector(at, b + "attn_norm.weight"), q=mat("attn_q.weight"),
            k=opt_mat("attn_k.weight"), v=opt_mat("attn_v.weight"),
            o=mat("attn_output.weight"), ffn_norm=load_vector(at, b + "ffn_norm.weight"),
            q_bias=opt("attn_q.bias"), k_bias=opt("attn_k.bias"), v_bias=opt("attn_v.bias"),
            q_norm=opt("attn_q_norm.weight"), k_norm=opt("attn_k_norm.weight"),
            o_bias=opt("attn_output.bias"), sinks=opt("attn_sinks.weight"), dense=dense, **rest)

    def _router(self, model: ModelDir, L: int) -> dict:
        """Layer L's router matrix, a sigmoid_bias router's selection bias, and a gated shared
        expert (Qwen2-MoE) with its gate, as LayerWeights fields."""
        b = f"blk.{L}."
        rt = self._open(model, f"router/layer_{L}.bin")
        out = {"router": load_matrix(rt, b + "ffn_gate_inp.weight")}
        if b + "exp_probs_b.bias" in rt:
            out["expert_bias"] = load_vector(rt, b + "exp_probs_b.bias")
        if b + "ffn_gate_inp.bias" in rt:
            out["router_bias"] = load_vector(rt, b + "ffn_gate_inp.bias")
        if b + "ffn_gate_exps.bias" in rt:
            E = model.config.num_experts
            out["expert_biases"] = tuple(load_vector(rt, f"{b}ffn_{p}_exps.bias").reshape(E, -1)
                                         for p in ("gate", "up", "down"))
        if model.config.shared_expert_intermediate_size:
            out["shared_gate"] = load_vector(rt, b + "ffn_gate_inp_shexp.weight")
            out["shared"] = self._resident(L, "shared")
        return out

    def _repacked(self, m: Matrix, source: TensorFile) -> Matrix:
        """A q4/q8_0 attention or output matrix copied out of its mapped file into pool memory in the
        kernels' 8-row groups: the same resident bytes, faster to decode. Others stay mapped."""
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

    def nbytes(self) -> int:
        """Bytes of all weight files (every expert, resident or not; a GGUF run in place: its tensors)."""
        return self._bytes

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
