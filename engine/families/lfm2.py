"""LFM2-MoE: short-conv and attention layers, the first layers dense, a sigmoid router with a
per-expert selection bias. The final norm is model.embedding_norm (applied after the last
layer); the output is tied; a leading dense layer's MLP is stored as its shared expert."""
from engine.families.spec import ArchSpec, Family
from engine.families.spec import HF_LAYER as _L


def _hf_config(c, kinds) -> dict:
    dense = int(c.get("num_dense_layers") or 0)
    return {"dense_layers": dense, "dense_intermediate_size": int(c.need("intermediate_size")) if dense else 0,
            "conv_kernel": int(c.get("conv_L_cache") or 0) if kinds and "short_conv" in kinds else 0}


def _gguf_config(f: dict, g) -> dict:
    """attention.head_count_kv lists each layer's KV heads, 0 for a short-conv layer."""
    dense = g.integer("leading_dense_block_count", 0)
    out = {"dense_layers": dense, "dense_intermediate_size": g.integer("feed_forward_length", required=True)
           if dense else 0}
    per = g.kv_per_layer()
    if per is not None:
        used = sorted({v for v in per if v})
        if len(per) != f["num_layers"] or len(used) != 1:
            raise g.kv_error(per)
        out |= {"num_kv_heads": used[0], "layer_types": tuple("attention" if v else "short_conv" for v in per)}
    if "short_conv" in (out.get("layer_types") or ()):
        out["conv_kernel"] = g.integer("shortconv.l_cache", required=True)
    return out


FAMILY = Family("lfm2", (
    ArchSpec("lfm2_moe", ("Lfm2MoeForCausalLM",), "lfm2moe", "lfm2", layer_kinds=("short_conv", "attention"),
             layer_types_key="layer_types", qk_norm="head", moe=True, router="sigmoid_bias", renormalise=True,
             gguf_renormalise=True, dense_leading_layers=True, hf_ff_key="moe_intermediate_size"),
), hf_tensors=(
    ("token_embd.weight",                ("model.embed_tokens.weight",)),
    ("output_norm.weight",               ("model.embedding_norm.weight",)),
    ("output.weight",                    ("lm_head.weight",)),
    ("blk.{L}.attn_norm.weight",         (f"{_L}.operator_norm.weight",)),
    ("blk.{L}.ffn_norm.weight",          (f"{_L}.ffn_norm.weight",)),
    ("blk.{L}.attn_q.weight",            (f"{_L}.self_attn.q_proj.weight",)),
    ("blk.{L}.attn_k.weight",            (f"{_L}.self_attn.k_proj.weight",)),
    ("blk.{L}.attn_v.weight",            (f"{_L}.self_attn.v_proj.weight",)),
    ("blk.{L}.attn_output.weight",       (f"{_L}.self_attn.out_proj.weight",)),
    ("blk.{L}.attn_q_norm.weight",       (f"{_L}.self_attn.q_layernorm.weight",)),
    ("blk.{L}.attn_k_norm.weight",       (f"{_L}.self_attn.k_layernorm.weight",)),
    ("blk.{L}.shortconv.in_proj.weight", (f"{_L}.conv.in_proj.weight",)),
    ("blk.{L}.shortconv.conv.weight",    (f"{_L}.conv.conv.weight",)),
    ("blk.{L}.shortconv.out_proj.weight", (f"{_L}.conv.out_proj.weight",)),
    ("blk.{L}.ffn_gate_shexp.weight",    (f"{_L}.feed_forward.w1.weight",)),
    ("blk.{L}.ffn_up_shexp.weight",      (f"{_L}.feed_forward.w3.weight",)),
    ("blk.{L}.ffn_down_shexp.weight",    (f"{_L}.feed_forward.w2.weight",)),
    ("blk.{L}.ffn_gate_inp.weight",      (f"{_L}.feed_forward.gate.weight",)),
    ("blk.{L}.exp_probs_b.bias",         (f"{_L}.feed_forward.expert_bias",)),
    ("blk.{L}.ffn_gate.{E}.weight",      (f"{_L}.feed_forward.experts.{{E}}.w1.weight",
                                          f"{_L}.feed_forward.experts.gate_up_proj[{{E}}]#0/2")),
    ("blk.{L}.ffn_up.{E}.weight",        (f"{_L}.feed_forward.experts.{{E}}.w3.weight",
                                          f"{_L}.feed_forward.experts.gate_up_proj[{{E}}]#1/2")),
    ("blk.{L}.ffn_down.{E}.weight",      (f"{_L}.feed_forward.experts.{{E}}.w2.weight",
                                          f"{_L}.feed_forward.experts.down_proj[{{E}}]")),
), hf_config=_hf_config, gguf_config=_gguf_config,
    gguf_limits={"leading_dense_block_count": (0, 4096), "shortconv.l_cache": (2, 64)})
