"""Synthetic Hugging Face checkpoints of any size, for conversion and memory benchmarks.

Written tensor by tensor (the header first, then each tensor as it is drawn), so making a
multi-gigabyte checkpoint takes little memory. Weights are random: these models measure
throughput and memory, never quality.
"""
from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from engine import quant

_DTYPES = {"bf16": ("BF16", 2), "f16": ("F16", 2), "f32": ("F32", 4)}


@dataclass(frozen=True)
class MixtralShape:
    hidden: int = 1024
    layers: int = 8
    heads: int = 16
    kv_heads: int = 4
    experts: int = 8
    top_k: int = 2
    ff: int = 2048
    vocab: int = 32000

    def tensors(self) -> dict[str, tuple[int, ...]]:
        D, hd = self.hidden, self.hidden // self.heads
        out = {"model.embed_tokens.weight": (self.vocab, D), "model.norm.weight": (D,),
               "lm_head.weight": (self.vocab, D)}
        for L in range(self.layers):
            p = f"model.layers.{L}."
            out |= {p + "input_layernorm.weight": (D,), p + "post_attention_layernorm.weight": (D,),
                    p + "self_attn.q_proj.weight": (self.heads * hd, D),
                    p + "self_attn.k_proj.weight": (self.kv_heads * hd, D),
                    p + "self_attn.v_proj.weight": (self.kv_heads * hd, D),
                    p + "self_attn.o_proj.weight": (D, self.heads * hd),
                    p + "block_sparse_moe.gate.weight": (self.experts, D)}
            for e in range(self.experts):
                q = f"{p}block_sparse_moe.experts.{e}."
                out |= {q + "w1.weight": (self.ff, D), q + "w3.weight": (self.ff, D), q + "w2.weight": (D, self.ff)}
        return out

    def config(self) -> dict:
        return {"architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "hidden_size": self.hidden,
                "num_hidden_layers": self.layers, "num_attention_heads": self.heads,
                "num_key_value_heads": self.kv_heads, "intermediate_size": self.ff,
                "num_local_experts": self.experts, "num_experts_per_tok": self.top_k, "vocab_size": self.vocab,
                "rms_norm_eps": 1e-5, "rope_theta": 1e6, "max_position_embeddings": 4096,
                "tie_word_embeddings": False}

    def params(self) -> int:
        return sum(int(np.prod(s)) for s in self.tensors().values())


def shape_for_size(megabytes: float, dtype: str = "bf16", **fixed) -> MixtralShape:
    """The layer count that brings a Mixtral-style model closest to `megabytes`."""
    base = MixtralShape(**{**fixed, "layers": 1})
    one = MixtralShape(**{**fixed, "layers": 2}).params() - base.params()
    fixed_params = base.params() - one
    layers = max(1, round((megabytes * 1e6 / _DTYPES[dtype][1] - fixed_params) / one))
    return MixtralShape(**{**fixed, "layers": layers})


def _byte_tokenizer() -> Tokenizer:
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {"<|endoftext|>": 0, "<|im_start|>": 1, "<|im_end|>": 2}
    vocab |= {ch: i + 3 for i, ch in enumerate(sorted(alphabet))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    return tok


def write_checkpoint(folder: Path, shape: MixtralShape, dtype: str = "bf16", seed: int = 0,
                     balanced_router: bool = False, tokenizer_json: str | None = None,
                     embed_std: float = 0.02) -> Path:
    """A random checkpoint. `balanced_router`: router rows orthogonal and of equal norm, so that
    picks spread evenly over the experts as in trained MoE models (iid rows can favour a few).
    `embed_std` 1.0 keeps the residual stream close to isotropic, which keeps picks balanced in
    deep layers too (measured: 2.99 of 3 bits in every layer, against 1.1-2.5 at 0.02)."""
    folder.mkdir(parents=True, exist_ok=True)
    st_dtype, size = _DTYPES[dtype]
    shapes = shape.tensors()
    head, pos = {}, 0
    for name, s in shapes.items():
        n = int(np.prod(s)) * size
        head[name] = {"dtype": st_dtype, "shape": list(s), "data_offsets": [pos, pos + n]}
        pos += n
    body = json.dumps(head).encode()
    body += b" " * (-len(body) % 8)
    rng = np.random.default_rng(seed)
    with open(folder / "model.safetensors", "wb") as f:
        f.write(struct.pack("<Q", len(body)) + body)
        for name, s in shapes.items():
            x = rng.standard_normal(s, dtype=np.float32) * (1.0 if len(s) == 1 else 0.02)
            if name == "model.embed_tokens.weight":
                x *= embed_std / 0.02
            if len(s) == 1:
                x = 1.0 + 0.1 * x
            elif balanced_router and name.endswith("block_sparse_moe.gate.weight"):
                q, _ = np.linalg.qr(rng.standard_normal((s[1], s[0])))  # (D, E), orthonormal columns
                x = (q.T * np.sqrt(s[1]) * 0.05).astype(np.float32)
            f.write(quant.quantize(x, dtype).tobytes())
    (folder / "config.json").write_text(json.dumps(shape.config(), indent=1))
    if tokenizer_json is None:
        _byte_tokenizer().save(str(folder / "tokenizer.json"))
    else:
        (folder / "tokenizer.json").write_text(tokenizer_json)
    template = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
                "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": "<|endoftext|>", "eos_token": "<|im_end|>", "chat_template": template}))
    return folder
