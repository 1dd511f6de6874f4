"""Export a converted Llama-family or Mixtral model back to GGUF, block for block.

Used to give llama.cpp exactly our weights in benchmarks: int8 is GGUF's Q8_0 and int4 its
Q4_1, so nothing is re-rounded. `requantize` ("q4_0", ...) re-rounds the matrices instead
(embeddings, the output head and routers keep theirs, as llama.cpp's own low-bit presets do), to make a
GGUF in a format our converter does not write, which Colibri then imports block for block. Rows of attn_q/attn_k go back into llama.cpp's rotary order,
and experts are stacked into `ffn_*_exps`. Written tensor by tensor (one layer's experts at a
time in memory).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from engine import quant
from engine.convert.gguf_file import unpermute_order
from engine.errors import ConversionError
from engine.model_dir import open_model_dir

SUPPORTED = ("llama", "mistral", "mixtral")


def _tokenizer_kv(w, tokenizer_json: Path, meta: dict) -> None:
    import gguf
    tok = json.loads(tokenizer_json.read_text())
    model = tok["model"]
    if model.get("type") != "BPE":
        raise ConversionError(f"{tokenizer_json}: only byte-level BPE tokenizers export to GGUF")
    vocab = dict(model["vocab"])
    for added in tok.get("added_tokens", []):
        vocab[added["content"]] = added["id"]
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    special = {a["content"] for a in tok.get("added_tokens", []) if a.get("special")}
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(meta.get("gguf_pre_tokenizer") or "default")  # the source's split rules, kept
    w.add_token_list(tokens)
    w.add_token_types([gguf.TokenType.CONTROL if t in special else gguf.TokenType.NORMAL for t in tokens])
    w.add_token_merges(merges)
    if meta.get("bos_token_id") is not None:
        w.add_bos_token_id(meta["bos_token_id"])
    if meta.get("eos_token_ids"):
        w.add_eos_token_id(meta["eos_token_ids"][0])
    w.add_add_bos_token(bool(meta.get("add_bos_token")))


def export_gguf(model_path: str | Path, out_path: str | Path, requantize: str | None = None) -> Path:
    import gguf
    model = open_model_dir(model_path)
    cfg = model.config
    if cfg.architecture not in SUPPORTED:
        raise ConversionError(f"GGUF export supports {', '.join(SUPPORTED)}, not {cfg.architecture}")
    out_path = Path(out_path)
    w = gguf.GGUFWriter(out_path, "llama")
    w.add_block_count(cfg.num_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_heads)
    w.add_head_count_kv(cfg.num_kv_heads)
    w.add_key_length(cfg.head_dim)
    w.add_value_length(cfg.head_dim)
    w.add_rope_dimension_count(cfg.head_dim)
    w.add_rope_freq_base(cfg.rope_theta)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_vocab_size(cfg.vocab_size)
    if cfg.is_moe:
        w.add_expert_count(cfg.num_experts)
        w.add_expert_used_count(cfg.top_k)
    _tokenizer_kv(w, model.path / "tokenizer.json", model.meta.get("tokenizer", {}))

    plan = []  # (gguf name, callable giving the stored uint8/float array, logical shape, ggml type)
    for rel, tensors in model.files().items():
        if rel.startswith("experts/"):
            continue
        tf = model.tensor_file(rel)
        for name in tensors:
            if name == "rope_freqs.weight" and not cfg.rope_freq_factors:
                continue
            info = tf.infos[name]
            plan.append((name, _reader(tf, name, cfg), info.shape, _stored_type(info.qtype)))
    for L in range(cfg.num_layers):
        for part in ("gate", "up", "down"):
            if cfg.is_moe:
                plan.append(_stacked(model, L, part, cfg.num_experts))
            else:
                tf = model.tensor_file(f"experts/layer_{L}_expert_0.bin" if model.split_experts
                                       else f"experts/layer_{L}.bin")
                name = f"blk.{L}.ffn_{part}.0.weight"
                plan.append((f"blk.{L}.ffn_{part}.weight", _reader(tf, name, cfg), tf.infos[name].shape,
                             _stored_type(tf.infos[name].qtype)))
    if requantize:
        def kept(name: str) -> bool:  # as llama-quantize keeps them
            return name in ("token_embd.weight", "output.weight") or name.endswith(".ffn_gate_inp.weight")
        plan = [_requantized(p, quant.get(requantize)) if not kept(p[0]) and len(p[2]) >= 2 else p for p in plan]
    for name, _, shape, qt in plan:
        w.add_tensor_info(name, list(shape), np.dtype(np.float32), qt.nbytes(tuple(shape)),
                          raw_dtype=gguf.GGMLQuantizationType(qt.type_id))
    w.write_header_to_file(out_path)
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for _, read, _, _ in plan:
        w.write_tensor_data(np.ascontiguousarray(read()).view(np.uint8))
    w.close()
    return out_path


def _requantized(item, target):
    name, read, shape, qt = item

    def again():
        data = read()
        return np.stack([quant.quantize(quant.dequantize(d, qt), target) for d in data.reshape(-1, *data.shape[-2:])]) \
            .reshape(*data.shape[:-1], -1)
    return name, again, shape, target


def _stored_type(qt):
    """A tensor's GGML type: a matrix repacked on disk (x8) goes out in its format's stored layout."""
    return qt.plain


def _reader(tf, name: str, cfg):
    def read():
        data = tf.stored(name)
        if name.endswith((".attn_q.weight", ".attn_k.weight")):
            heads = cfg.num_heads if ".attn_q." in name else cfg.num_kv_heads
            order = np.argsort(unpermute_order(heads, data.shape[0]))  # HF rows -> llama.cpp rows
            data = data[order]
        return data
    return read


def _stacked(model, L: int, part: str, experts: int):
    from engine.model_dir import expert_file
    files = [model.tensor_file(expert_file(L, e, model.split_experts)) for e in range(experts)]
    names = [f"blk.{L}.ffn_{part}.{e}.weight" for e in range(experts)]
    info = files[0].infos[names[0]]

    def read():
        return np.stack([f.stored(n) for f, n in zip(files, names)])
    return f"blk.{L}.ffn_{part}_exps.weight", read, (experts, *info.shape), _stored_type(info.qtype)
