"""Qwen3.5/3.6-MoE: gated DeltaNet (linear_attention) and gated attention layers, zero-centred
norms, rope on part of each head, softmax top-k routing and a gated shared expert."""
from engine.families.dense import LLAMA
from engine.families.qwen_moe import MLP_EXPERTS, SHARED_EXPERT
from engine.families.spec import ArchSpec, Family
from engine.families.spec import HF_LAYER as _L

_LINEAR = {"linear_key_heads": "linear_num_key_heads", "linear_value_heads": "linear_num_value_heads",
           "linear_key_dim": "linear_key_head_dim", "linear_value_dim": "linear_value_head_dim"}


def _hf_config(c, kinds) -> dict:
    """Gated DeltaNet dims (ModelConfig.linear_*) when the model has linear_attention layers."""
    if not kinds or "linear_attention" not in kinds:
        return {}
    out = {ours: int(c.need(theirs)) for ours, theirs in _LINEAR.items()}
    if out["linear_value_heads"] % out["linear_key_heads"]:
        raise c.error("linear_num_value_heads must be a multiple of linear_num_key_heads")
    return out | {"conv_kernel": int(c.get("linear_conv_kernel_dim") or 0)}


def _gguf_config(f: dict, g) -> dict:
    """Each layer's kind from attention.recurrent_layers; DeltaNet dims from the ssm.* keys
    (llama.cpp's value heads are tiled)."""
    recurrent = g.value("attention.recurrent_layers")
    if not isinstance(recurrent, list):
        return {}
    kinds = tuple("linear_attention" if r else "attention" for r in recurrent)
    if "linear_attention" not in kinds:
        return {"layer_types": kinds}
    nv = g.integer("ssm.time_step_rank", required=True)
    return {"layer_types": kinds, "conv_kernel": g.integer("ssm.conv_kernel", required=True),
            "linear_key_heads": g.integer("ssm.group_count", required=True), "linear_value_heads": nv,
            "linear_key_dim": g.integer("ssm.state_size", required=True),
            "linear_value_dim": g.integer("ssm.inner_size", required=True) // nv, "delta_tiled": True}


# (first: these rows win over LLAMA's.) Its norms are zero-centred: "@plus1" stores 1 + w as
# llama.cpp does; "@negexp" stores A = -exp(A_log) (llama.cpp's ssm_a)
FAMILY = Family("qwen3_5", (
    ArchSpec("qwen3_5_moe", ("Qwen3_5MoeForCausalLM", "Qwen3_5MoeForConditionalGeneration"), "qwen35moe", "qwen3_5",
             layer_kinds=("linear_attention", "attention"), layer_types_key="layer_types", norm_weight="offset",
             qk_norm="head", qkv_bias_key="attention_bias", partial_rotary=True, attention_gate=True,
             rope=("default",), moe=True, renormalise=True, gguf_renormalise=True, shared_expert="sigmoid_gate",
             hf_ff_key="moe_intermediate_size"),
), hf_tensors=(
    ("output_norm.weight",               ("model.norm.weight@plus1",)),
    ("blk.{L}.attn_norm.weight",         (f"{_L}.input_layernorm.weight@plus1",)),
    ("blk.{L}.ffn_norm.weight",          (f"{_L}.post_attention_layernorm.weight@plus1",)),
    ("blk.{L}.attn_q_norm.weight",       (f"{_L}.self_attn.q_norm.weight@plus1",)),
    ("blk.{L}.attn_k_norm.weight",       (f"{_L}.self_attn.k_norm.weight@plus1",)),
    ("blk.{L}.attn_qkv.weight",          (f"{_L}.linear_attn.in_proj_qkv.weight",)),
    ("blk.{L}.attn_gate.weight",         (f"{_L}.linear_attn.in_proj_z.weight",)),
    ("blk.{L}.ssm_beta.weight",          (f"{_L}.linear_attn.in_proj_b.weight",)),
    ("blk.{L}.ssm_alpha.weight",         (f"{_L}.linear_attn.in_proj_a.weight",)),
    ("blk.{L}.ssm_a",                    (f"{_L}.linear_attn.A_log@negexp",)),
    ("blk.{L}.ssm_dt.bias",              (f"{_L}.linear_attn.dt_bias",)),
    ("blk.{L}.ssm_conv1d.weight",        (f"{_L}.linear_attn.conv1d.weight",)),
    ("blk.{L}.ssm_norm.weight",          (f"{_L}.linear_attn.norm.weight",)),
    ("blk.{L}.ssm_out.weight",           (f"{_L}.linear_attn.out_proj.weight",)),
) + LLAMA + MLP_EXPERTS + SHARED_EXPERT, hf_config=_hf_config, gguf_config=_gguf_config,
    gguf_limits={"ssm.conv_kernel": (2, 64), "ssm.time_step_rank": (1, 4096), "ssm.group_count": (1, 4096),
                 "ssm.state_size": (1, 1 << 16), "ssm.inner_size": (1, 1 << 22)})
