"""GGUF files, read with the `gguf` package for metadata and with pread for tensor data.

Quantized blocks are copied as they are (lossless). ggml lists shapes innermost first; here
every shape is in numpy order (rows, row length). For the `llama` architecture llama.cpp's
converter reorders the rows of attn_q/attn_k (interleaved rotary pairs); we undo that so
every architecture uses the Hugging Face row order.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from engine import quant
from engine.convert.source import FileReader, SourceTensor
from engine.convert.tokenizer_import import TokenizerBundle, from_gguf_fields
from engine.errors import ConfigError, SourceFormatError, UnsupportedArchitectureError
from engine.model_dir import ModelConfig

# general.architecture -> our architecture (llama with experts is Mixtral-style)
GGUF_ARCHITECTURES = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "qwen2moe": "qwen2_moe",
                      "qwen3moe": "qwen3_moe", "olmoe": "olmoe"}
NORM_TOPK = {"mixtral": True, "qwen2_moe": False, "qwen3_moe": True, "olmoe": False}
PERMUTED_QK = {"llama"}  # GGUF archs whose q/k rows llama.cpp's converter permuted


def unpermute_order(n_head: int, rows: int) -> np.ndarray:
    """Row order that turns llama.cpp's rotary layout back into Hugging Face's.

    Per head, llama.cpp stores row (j, t) — pair j, half t — where HF has (t, j).
    """
    return np.arange(rows).reshape(n_head, rows // n_head // 2, 2).swapaxes(1, 2).reshape(-1)


class GGUFModel:
    def __init__(self, path: Path):
        import gguf  # imported here: it is only needed while converting
        self.path = path
        with open(path, "rb") as f:
            magic = f.read(4)
        if magic != b"GGUF":
            raise SourceFormatError(f"{path}: not a GGUF file (magic {magic!r})")
        try:
            self.reader = gguf.GGUFReader(path)
        except Exception as e:  # the package raises ValueError, IndexError, ... on bad files
            raise SourceFormatError(f"{path}: GGUF file is truncated or corrupt "
                                    f"({type(e).__name__}: {e})") from None
        self.fields: dict = {}
        for key, field in self.reader.fields.items():
            if key.startswith("GGUF."):
                continue
            try:
                self.fields[key] = field.contents()
            except Exception as e:
                raise SourceFormatError(f"{path}: GGUF metadata {key!r} is unreadable: {e}") from None
        self.file = FileReader(path)
        self.tensors: dict[str, SourceTensor] = {}
        for t in self.reader.tensors:
            self.tensors[t.name] = self._tensor(t)

    def _tensor(self, t) -> SourceTensor:
        try:
            qtype = quant.get(int(t.tensor_type))
        except quant.QuantError:  # raised while the file is opened: before any conversion work
            supported = ", ".join(q.upper() for q in quant.BY_NAME)
            raise SourceFormatError(f"{self.path}: tensor {t.name!r} has GGML type {t.tensor_type.name}, "
                                    f"which Colibri does not import; {quant.PRESETS_ADVICE} "
                                    f"(supported types: {supported})") from None
        shape = tuple(int(d) for d in reversed(t.shape))
        if qtype.is_block and shape[-1] % qtype.block_size:
            raise SourceFormatError(f"{self.path}: tensor {t.name!r} row length {shape[-1]} is not a "
                                    f"multiple of the {qtype.name} block")
        end = t.data_offset + qtype.nbytes(shape)
        if end > self.file.size:
            raise SourceFormatError(f"{self.path}: tensor {t.name!r} ends at byte {end} but the file has "
                                    f"{self.file.size} bytes (truncated?)")
        return SourceTensor(t.name, shape, qtype,
                            self.file.rows(t.name, t.data_offset, qtype.row_bytes(shape[-1]), qtype.storage))

    def _get(self, key: str, default=None, required: bool = False):
        arch = self.fields.get("general.architecture")
        value = self.fields.get(f"{arch}.{key}", default)
        if value is None and required:
            raise ConfigError(f"{self.path}: GGUF metadata has no {arch}.{key}")
        return value

    def config(self) -> ModelConfig:
        garch = self.fields.get("general.architecture")
        if garch not in GGUF_ARCHITECTURES:
            raise UnsupportedArchitectureError(
                f"{self.path}: GGUF architecture {garch!r} is not supported; supported: "
                f"{', '.join(GGUF_ARCHITECTURES)}")
        experts = int(self._get("expert_count", 0) or 0)
        arch = "mixtral" if garch == "llama" and experts > 1 else GGUF_ARCHITECTURES[garch]
        hidden = int(self._get("embedding_length", required=True))
        heads = int(self._get("attention.head_count", required=True))
        moe = experts > 1
        # experts' width: its own key where the arch has one (Qwen MoE), else the FFN width
        ff_key = "expert_feed_forward_length" if moe and self._get("expert_feed_forward_length") else \
            "feed_forward_length"
        tokens = self.fields.get("tokenizer.ggml.tokens") or []
        scaling = None
        kind = self._get("rope.scaling.type")
        if kind and kind != "none":
            if kind not in ("linear", "yarn"):
                raise ConfigError(f"{self.path}: rope scaling {kind!r} is not supported (linear, yarn)")
            scaling = {"type": kind, "factor": float(self._get("rope.scaling.factor", 1.0)),
                       "original_max_position_embeddings": self._get("rope.scaling.original_context_length")}
        return ModelConfig(
            architecture=arch,
            vocab_size=int(self._get("vocab_size", len(tokens)) or len(tokens)),
            hidden_size=hidden,
            num_layers=int(self._get("block_count", required=True)),
            num_heads=heads,
            num_kv_heads=int(self._get("attention.head_count_kv", heads)),
            head_dim=int(self._get("attention.key_length", hidden // heads)),
            intermediate_size=int(self._get(ff_key, required=True)),
            num_experts=experts if moe else 1,
            top_k=int(self._get("expert_used_count", required=moe)) if moe else 1,
            norm_topk_prob=bool(self._get("expert_weights_norm", NORM_TOPK.get(arch, False))),
            shared_expert_intermediate_size=int(self._get("expert_shared_feed_forward_length", 0) or 0)
            if arch == "qwen2_moe" else 0,
            rms_norm_eps=float(self._get("attention.layer_norm_rms_epsilon", 1e-6)),
            rope_theta=float(self._get("rope.freq_base", 10000.0)),
            rope_scaling=scaling,
            rope_freq_factors="rope_freqs.weight" in self.tensors,
            max_position_embeddings=int(self._get("context_length", 4096)),
            tie_word_embeddings="output.weight" not in self.tensors,
            attention_bias="blk.0.attn_q.bias" in self.tensors,
            qk_norm={"qwen3": "head", "qwen3_moe": "head", "olmoe": "full"}.get(arch, "none"),
        )

    def source_tensor(self, name: str, cfg: ModelConfig) -> SourceTensor:
        """A GGUF tensor in Hugging Face row order (undoes llama.cpp's q/k permutation)."""
        t = self.tensors[name]
        garch = self.fields.get("general.architecture")
        if garch in PERMUTED_QK and name.endswith((".attn_q.weight", ".attn_k.weight")):
            heads = cfg.num_heads if ".attn_q." in name else cfg.num_kv_heads
            return t.permute_rows(unpermute_order(heads, t.rows))
        return t

    def tokenizer(self) -> TokenizerBundle:
        keys = {k: v for k, v in self.fields.items() if k.startswith("tokenizer.")}
        return from_gguf_fields(keys, str(self.path))

    def close(self) -> None:
        self.file.close()
        self.reader = None
