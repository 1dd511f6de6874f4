"""Qwen2-MoE and Qwen3-MoE: Llama attention (Qwen3: q/k norms per head), softmax top-k routing,
experts as mlp.experts.E.*; Qwen2-MoE adds a shared expert behind a sigmoid gate."""
from engine.families.dense import LLAMA
from engine.families.spec import HF_FUSED, ArchSpec, Family
from engine.families.spec import HF_LAYER as _L

_GATE, _UP, _DOWN = HF_FUSED
# the router and experts of mlp.experts (OLMoE and Qwen3.5 too)
MLP_EXPERTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("blk.{L}.ffn_gate_inp.weight",      (f"{_L}.mlp.gate.weight",)),
    ("blk.{L}.ffn_gate.{E}.weight",      (f"{_L}.mlp.experts.{{E}}.gate_proj.weight", _GATE)),
    ("blk.{L}.ffn_up.{E}.weight",        (f"{_L}.mlp.experts.{{E}}.up_proj.weight", _UP)),
    ("blk.{L}.ffn_down.{E}.weight",      (f"{_L}.mlp.experts.{{E}}.down_proj.weight", _DOWN)),
)
SHARED_EXPERT: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("blk.{L}.ffn_gate_inp_shexp.weight", (f"{_L}.mlp.shared_expert_gate.weight",)),
    ("blk.{L}.ffn_gate_shexp.weight",    (f"{_L}.mlp.shared_expert.gate_proj.weight",)),
    ("blk.{L}.ffn_up_shexp.weight",      (f"{_L}.mlp.shared_expert.up_proj.weight",)),
    ("blk.{L}.ffn_down_shexp.weight",    (f"{_L}.mlp.shared_expert.down_proj.weight",)),
)

FAMILY = Family("qwen_moe", (
    ArchSpec("qwen2_moe", ("Qwen2MoeForCausalLM",), "qwen2moe", "qwen_moe", moe=True, qkv_bias=True,
             qkv_bias_key="qkv_bias", shared_expert="sigmoid_gate", hf_ff_key="moe_intermediate_size"),
    ArchSpec("qwen3_moe", ("Qwen3MoeForCausalLM",), "qwen3moe", "qwen_moe", moe=True, qk_norm="head", gguf_renormalise=True,
             qkv_bias_key="attention_bias", hf_ff_key="moe_intermediate_size"),
), hf_tensors=LLAMA + MLP_EXPERTS + SHARED_EXPERT)
