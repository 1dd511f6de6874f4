"""Mixtral: Llama attention, softmax top-k routing renormalised (fixed), experts w1/w3/w2; in
GGUF it is `llama` with expert_count > 1."""
from engine.families.dense import LLAMA
from engine.families.spec import HF_FUSED, ArchSpec, Family
from engine.families.spec import HF_LAYER as _L

_GATE, _UP, _DOWN = HF_FUSED
FAMILY = Family("mixtral", (
    ArchSpec("mixtral", ("MixtralForCausalLM",), None, "mixtral", moe=True, renormalise=True, renormalise_key=None,
             gguf_renormalise=True, qkv_bias_key="attention_bias", gguf_permuted_qk=True, gguf_experts="llama"),
), hf_tensors=LLAMA + (
    ("blk.{L}.ffn_gate_inp.weight",      (f"{_L}.block_sparse_moe.gate.weight", f"{_L}.mlp.gate.weight")),
    ("blk.{L}.ffn_gate.{E}.weight",      (f"{_L}.block_sparse_moe.experts.{{E}}.w1.weight", _GATE)),
    ("blk.{L}.ffn_down.{E}.weight",      (f"{_L}.block_sparse_moe.experts.{{E}}.w2.weight", _DOWN)),
    ("blk.{L}.ffn_up.{E}.weight",        (f"{_L}.block_sparse_moe.experts.{{E}}.w3.weight", _UP)),
))
