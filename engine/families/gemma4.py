"""Gemma 4: sandwich norms, sliding and full attention layers (the full ones with their own head
shape, no v_proj and a proportional rope of their own theta), a GELU dense MLP beside the experts
(stored as the shared expert), the gemma4 router with its scales, embedding scale and a final
softcap; the output is tied. The dense models' MLP is their expert 0; the edge models (E2B/E4B)
add per-layer inputs and keys and values shared by the last layers."""
import numpy as np

from engine import quant
from engine.errors import ConfigError
from engine.families.dense import LLAMA
from engine.families.spec import ArchSpec, Family
from engine.families.spec import HF_LAYER as _L


def _hf_config(c, kinds) -> dict:
    """Rope parameters per layer kind (the sliding ones are the model's, the full ones its own
    theta and rotary fraction); the full layers' head shape (per_layer_config, or global_head_dim
    / num_global_key_value_heads)."""
    moe = c.get("enable_moe_block", True) is not False
    out, rope = {"dense_intermediate_size": int(c.need("intermediate_size")) if moe else 0,
                 "final_logit_softcap": float(c.get("final_logit_softcapping") or 0.0)} | _edge(c, kinds), c
    per_kind = c.get("rope_parameters") or {}
    if "sliding_attention" in per_kind:
        full = per_kind.get("full_attention") or {}
        rope = {**c, "rope_parameters": per_kind["sliding_attention"],
                "partial_rotary_factor": full.get("partial_rotary_factor", 1.0)}
        theta, scaling = c.rope(rope)
        out |= {"rope_theta": theta, "rope_scaling": scaling, "rope_theta_full": float(full.get("rope_theta", 10000.0))}
    out["partial_rotary_factor"] = float((rope.get("rope_parameters") or {}).get(
        "partial_rotary_factor", rope.get("partial_rotary_factor", 1.0)))
    if not kinds or "attention" not in kinds or "sliding_attention" not in kinds:
        return out
    per = (c.get("per_layer_config") or {}).get(str(kinds.index("attention"))) or {}
    hd = per.get("head_dim") or c.get("global_head_dim")
    kv = per.get("num_key_value_heads") or c.get("num_global_key_value_heads")
    if not hd or hd == c.get("head_dim") and kv in (None, c.get("num_key_value_heads")):
        return out
    return out | {"full_head_dim": int(hd), "full_kv_heads": int(kv or c.get("num_key_value_heads"))}


def _edge(c, kinds) -> dict:
    """The edge models' (E2B/E4B) parts: per-layer inputs, the last layers' shared keys and values and
    their double-wide MLPs."""
    L, P = int(c.need("num_hidden_layers")), int(c.get("hidden_size_per_layer_input") or 0)
    shared = int(c.get("num_kv_shared_layers") or 0)
    if not 0 <= shared < L:
        raise c.error(f"num_kv_shared_layers = {shared}: from 0 to num_hidden_layers - 1 are supported "
                      f"(every layer sharing keys and values is not)")
    kinds = kinds or ("attention",) * L
    if c.get("use_bidirectional_attention") == "all":  # ("vision": text stays causal)
        raise c.error("use_bidirectional_attention = 'all' (an encoder: every token sees every other) is not supported")
    if set(kinds[L - shared:]) - set(kinds[:L - shared]):
        raise c.error(f"num_kv_shared_layers = {shared}: no layer before {L - shared} is of the kind of "
                      f"{sorted(set(kinds[L - shared:]) - set(kinds[:L - shared]))} to share its keys and values")
    if not 0 <= P <= 1 << 16:
        raise c.error(f"hidden_size_per_layer_input = {P} is out of range")
    vocab = int(c.get("vocab_size_per_layer_input") or c.need("vocab_size")) if P else 0
    if not 0 <= vocab <= 1 << 24:
        raise c.error(f"vocab_size_per_layer_input = {vocab} is out of range")
    return {"per_layer_input_size": P, "per_layer_vocab_size": vocab, "kv_shared_layers": shared,
            "double_wide_mlp": bool(c.get("use_double_wide_mlp")) and shared > 0,
            "full_v": c.get("attention_k_eq_v", True) is False}


def _gguf_config(f: dict, g) -> dict:
    """Sliding layers from attention.sliding_window_pattern with their own head_dim and theta
    (*_swa); the full layers' KV heads from the per-layer head_count_kv; proportional rope:
    rope_freqs holds 1 for the pairs that turn, 1e30 for the rest."""
    head_dim, full_kv, out = f["head_dim"], 0, {}
    per, swa = g.kv_per_layer(), g.value("attention.sliding_window_pattern")
    if per is not None:
        if not isinstance(swa, list) or len(swa) != len(per):
            raise g.kv_error(per)
        full_kv = max((v for v, s in zip(per, swa, strict=True) if not s), default=0)
        out = {"num_kv_heads": max((v for v, s in zip(per, swa, strict=True) if s), default=per[0])}
    elif isinstance(swa, list) and len(swa) == f["num_layers"]:  # one KV head count for all (E2B)
        full_kv = f["num_kv_heads"]
    if isinstance(swa, list) and len(swa) == f["num_layers"]:
        out["layer_types"] = tuple("sliding_attention" if s else "attention" for s in swa)
    out |= _gguf_edge(f, g, out.get("layer_types"))
    freqs = g.tensors.get("rope_freqs.weight")
    turning = int((np.asarray(quant.dequantize(freqs.read(), freqs.qtype)).reshape(-1) == 1).sum()) \
        if freqs is not None else head_dim // 2
    return out | {"head_dim": g.integer("attention.key_length_swa", head_dim), "full_head_dim": head_dim,
                  "full_kv_heads": full_kv or 1, "rope_theta": g.positive("rope.freq_base_swa", 10000.0),
                  "rope_theta_full": g.positive("rope.freq_base", 10000.0),
                  "partial_rotary_factor": 2 * turning / head_dim,
                  "dense_intermediate_size": g.integer("feed_forward_length", required=True) if f["num_experts"] > 1 else 0,
                  "final_logit_softcap": float(g.value("final_logit_softcapping") or 0.0), "rope_freq_factors": False}


def _gguf_edge(f: dict, g, kinds) -> dict:
    """The edge models' parts in llama.cpp's keys: embedding_length_per_layer_input,
    attention.shared_kv_layers, feed_forward_length per layer (the shared layers' doubled)."""
    L, P = f["num_layers"], g.integer("embedding_length_per_layer_input", 0)
    shared = g.integer("attention.shared_kv_layers", 0, high=L - 1)
    ff, out = g.value("feed_forward_length"), {}
    if isinstance(ff, list):
        widths = {int(v) for v in ff[:L - shared]}
        if len(ff) != L or len(widths) != 1 or {int(v) for v in ff[L - shared:]} - {min(widths), 2 * min(widths)} \
                or not 1 <= min(widths) <= 1 << 22:
            raise ConfigError(f"{g.path}: GGUF metadata gemma4.feed_forward_length = {ff} is not one width, "
                              f"doubled or not in the {shared} KV-shared layers")
        out = {"intermediate_size": min(widths), "double_wide_mlp": 2 * min(widths) in ff[L - shared:]}
    if kinds and set(kinds[L - shared:]) - set(kinds[:L - shared]):
        raise ConfigError(f"{g.path}: GGUF metadata gemma4.attention.shared_kv_layers = {shared}: no layer before "
                          f"{L - shared} is of each shared layer's kind")
    embd = g.tensors.get("per_layer_token_embd.weight")
    full = next((i for i, k in enumerate(kinds or ()) if k == "attention"), None)
    return out | {"per_layer_input_size": P, "per_layer_vocab_size": embd.shape[0] if P and embd else 0,
                  "kv_shared_layers": shared, "full_v": full is not None and f"blk.{full}.attn_v.weight" in g.tensors}


# (first: these rows win over LLAMA's) full layers have no v_proj (k_eq_v); the dense MLP is
# stored as the shared expert
FAMILY = Family("gemma4", (
    ArchSpec("gemma4", ("Gemma4ForCausalLM", "Gemma4ForConditionalGeneration"), "gemma4", "gemma4",
             layer_types_key="layer_types", norm_place="sandwich", qk_norm="head", logit_softcap=True, moe=True,
             router="gemma4", renormalise=True, renormalise_key=None, gguf_renormalise=True,
             hf_ff_key="moe_intermediate_size", activation="gelu_tanh", parallel_dense=True, k_eq_v=True, v_norm=True,
             attention_scale=1.0, full_rope="proportional", embed_scale=True),
), hf_tensors=(
    ("blk.{L}.post_attention_norm.weight", (f"{_L}.post_attention_layernorm.weight",)),
    ("blk.{L}.ffn_norm.weight",          (f"{_L}.pre_feedforward_layernorm.weight",)),
    ("blk.{L}.post_ffw_norm_1.weight",   (f"{_L}.post_feedforward_layernorm_1.weight",)),
    ("blk.{L}.pre_ffw_norm_2.weight",    (f"{_L}.pre_feedforward_layernorm_2.weight",)),
    ("blk.{L}.post_ffw_norm_2.weight",   (f"{_L}.post_feedforward_layernorm_2.weight",)),
    ("blk.{L}.post_ffw_norm.weight",     (f"{_L}.post_feedforward_layernorm.weight",)),
    ("blk.{L}.layer_output_scale.weight", (f"{_L}.layer_scalar",)),
    ("blk.{L}.ffn_gate_inp.weight",      (f"{_L}.router.proj.weight",)),
    ("blk.{L}.ffn_gate_inp.scale",       (f"{_L}.router.scale",)),
    ("blk.{L}.ffn_down_exps.scale",      (f"{_L}.router.per_expert_scale",)),
    ("blk.{L}.ffn_gate_shexp.weight",    (f"{_L}.mlp.gate_proj.weight",)),
    ("blk.{L}.ffn_up_shexp.weight",      (f"{_L}.mlp.up_proj.weight",)),
    ("blk.{L}.ffn_down_shexp.weight",    (f"{_L}.mlp.down_proj.weight",)),
    # (the second: a dense model's MLP is its expert 0)
    ("blk.{L}.ffn_gate.{E}.weight",      (f"{_L}.experts.gate_up_proj[{{E}}]#0/2", f"{_L}.mlp.gate_proj.weight")),
    ("blk.{L}.ffn_up.{E}.weight",        (f"{_L}.experts.gate_up_proj[{{E}}]#1/2", f"{_L}.mlp.up_proj.weight")),
    ("blk.{L}.ffn_down.{E}.weight",      (f"{_L}.experts.down_proj[{{E}}]", f"{_L}.mlp.down_proj.weight")),
    # per-layer inputs (E2B/E4B)
    ("per_layer_token_embd.weight",      ("model.embed_tokens_per_layer.weight",)),
    ("per_layer_model_proj.weight",      ("model.per_layer_model_projection.weight",)),
    ("per_layer_proj_norm.weight",       ("model.per_layer_projection_norm.weight",)),
    ("blk.{L}.inp_gate.weight",          (f"{_L}.per_layer_input_gate.weight",)),
    ("blk.{L}.proj.weight",              (f"{_L}.per_layer_projection.weight",)),
    ("blk.{L}.post_norm.weight",         (f"{_L}.post_per_layer_input_norm.weight",)),
) + LLAMA, hf_config=_hf_config, gguf_config=_gguf_config,
    gguf_limits={"attention.key_length_swa": (1, 1 << 16), "embedding_length_per_layer_input": (0, 1 << 16),
                 "attention.shared_kv_layers": (0, 4096)})
