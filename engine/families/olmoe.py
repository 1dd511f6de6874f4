"""OLMoE: Llama attention with q/k norms over all heads at once, softmax top-k routing."""
from engine.families.dense import LLAMA
from engine.families.qwen_moe import MLP_EXPERTS
from engine.families.spec import ArchSpec, Family

FAMILY = Family("olmoe", (
    ArchSpec("olmoe", ("OlmoeForCausalLM",), "olmoe", "olmoe", moe=True, qk_norm="full", qkv_bias_key="attention_bias"),
), hf_tensors=LLAMA + MLP_EXPERTS)
