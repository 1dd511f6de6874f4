"""gpt-oss: biased attention with learned sinks, alternating sliding and full layers, a biased
top-k-then-softmax router, biased experts with a clamped SwiGLU (MXFP4 in the released checkpoints)."""
from engine.families.dense import LLAMA
from engine.families.spec import ArchSpec, Family
from engine.families.spec import HF_LAYER as _L


def _hf_config(c, kinds) -> dict:
    return {"swiglu_alpha": float(c.get("swiglu_alpha", 1.702)), "swiglu_limit": float(c.get("swiglu_limit", 7.0))}


def _gguf_config(f: dict, g) -> dict:
    """llama.cpp fixes in code what the file does not say: even layers slide (from 0), and yarn
    does not truncate (as gpt-oss's Hugging Face config says)."""
    out = {}
    if g.value("attention.sliding_window"):
        out["layer_types"] = tuple("sliding_attention" if i % 2 == 0 else "attention" for i in range(f["num_layers"]))
    if f["rope_scaling"] and f["rope_scaling"]["type"] == "yarn":
        out["rope_scaling"] = f["rope_scaling"] | {"truncate": False}
    return out


# experts (E, in, out) with gate/up interleaved along the columns of gate_up_proj: "~p/n" takes
# columns p::n, "'" transposes the slice; the released checkpoints' MXFP4 *_blocks/*_scales are
# read by engine.convert.hf as `.mxfp4` tensors (out, in), gate and up rows already taken apart
FAMILY = Family("gpt_oss", (
    ArchSpec("gpt_oss", ("GptOssForCausalLM",), "gpt-oss", "gpt_oss", layer_types_key="layer_types", qkv_bias=True,
             qkv_bias_key="attention_bias", o_bias=True, attention_sinks=True, rope=("default", "yarn"), moe=True,
             router="topk_softmax", renormalise=True, renormalise_key=None, gguf_renormalise=True, expert_bias=True,
             swiglu_clamp=True),
), hf_tensors=LLAMA + (
    ("blk.{L}.attn_output.bias",         (f"{_L}.self_attn.o_proj.bias",)),
    ("blk.{L}.attn_sinks.weight",        (f"{_L}.self_attn.sinks",)),
    ("blk.{L}.ffn_gate_inp.weight",      (f"{_L}.mlp.router.weight",)),
    ("blk.{L}.ffn_gate_inp.bias",        (f"{_L}.mlp.router.bias",)),
    ("blk.{L}.ffn_gate.{E}.weight",      (f"{_L}.mlp.experts.gate_up_proj[{{E}}]~0/2'",
                                          f"{_L}.mlp.experts.gate_proj.mxfp4[{{E}}]")),
    ("blk.{L}.ffn_up.{E}.weight",        (f"{_L}.mlp.experts.gate_up_proj[{{E}}]~1/2'",
                                          f"{_L}.mlp.experts.up_proj.mxfp4[{{E}}]")),
    ("blk.{L}.ffn_down.{E}.weight",      (f"{_L}.mlp.experts.down_proj[{{E}}]'",
                                          f"{_L}.mlp.experts.down_proj.mxfp4[{{E}}]")),
    ("blk.{L}.ffn_gate_exps.bias",       (f"{_L}.mlp.experts.gate_up_proj_bias~0/2",)),
    ("blk.{L}.ffn_up_exps.bias",         (f"{_L}.mlp.experts.gate_up_proj_bias~1/2",)),
    ("blk.{L}.ffn_down_exps.bias",       (f"{_L}.mlp.experts.down_proj_bias",)),
), hf_config=_hf_config, gguf_config=_gguf_config)
