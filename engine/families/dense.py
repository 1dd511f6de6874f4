"""Dense Llama-style models (Llama, Mistral, Qwen2, Qwen3): the Hugging Face names most families share."""
from engine.families.spec import HF_LAYER as _L
from engine.families.spec import ArchSpec, Family

# the Llama layout of embeddings, attention and norms (other families list these after their own)
LLAMA: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("token_embd.weight",                ("model.embed_tokens.weight",)),
    ("output_norm.weight",               ("model.norm.weight",)),
    ("output.weight",                    ("lm_head.weight",)),
    ("blk.{L}.attn_norm.weight",         (f"{_L}.input_layernorm.weight",)),
    ("blk.{L}.attn_q.weight",            (f"{_L}.self_attn.q_proj.weight",)),
    ("blk.{L}.attn_k.weight",            (f"{_L}.self_attn.k_proj.weight",)),
    ("blk.{L}.attn_v.weight",            (f"{_L}.self_attn.v_proj.weight",)),
    ("blk.{L}.attn_output.weight",       (f"{_L}.self_attn.o_proj.weight",)),
    ("blk.{L}.attn_q.bias",              (f"{_L}.self_attn.q_proj.bias",)),
    ("blk.{L}.attn_k.bias",              (f"{_L}.self_attn.k_proj.bias",)),
    ("blk.{L}.attn_v.bias",              (f"{_L}.self_attn.v_proj.bias",)),
    ("blk.{L}.attn_q_norm.weight",       (f"{_L}.self_attn.q_norm.weight",)),
    ("blk.{L}.attn_k_norm.weight",       (f"{_L}.self_attn.k_norm.weight",)),
    ("blk.{L}.ffn_norm.weight",          (f"{_L}.post_attention_layernorm.weight",)),
)

FAMILY = Family("dense", (
    ArchSpec("llama", ("LlamaForCausalLM",), "llama", "dense", qkv_bias_key="attention_bias", gguf_permuted_qk=True),
    ArchSpec("mistral", ("MistralForCausalLM",), None, "dense", qkv_bias_key="attention_bias"),
    ArchSpec("qwen2", ("Qwen2ForCausalLM",), "qwen2", "dense", qkv_bias=True),
    ArchSpec("qwen3", ("Qwen3ForCausalLM",), "qwen3", "dense", qk_norm="head", qkv_bias_key="attention_bias"),
), hf_tensors=LLAMA + (  # the MLP is our expert 0
    ("blk.{L}.ffn_gate.0.weight",        (f"{_L}.mlp.gate_proj.weight",)),
    ("blk.{L}.ffn_up.0.weight",          (f"{_L}.mlp.up_proj.weight",)),
    ("blk.{L}.ffn_down.0.weight",        (f"{_L}.mlp.down_proj.weight",)),
))
