"""How llama.cpp's converter lays out the four 2026 architectures in GGUF, as a table per architecture:
(GGUF name, HF name, transform), read back into HF names and shapes (tests only; the engine's names
table takes these rows). `{i}` is the layer, `{e}` an expert of an HF checkpoint that stores one
tensor per expert (GGUF stacks them). Every GGUF tensor must be consumed by a row, every HF tensor
produced (test_arch_gguf.py checks both, and that the values are the HF ones).

Transforms (GGUF value -> HF value; numpy shapes, which are ggml's reversed):
  =            as is
  minus1       zero-centred norm: llama.cpp stores 1 + w (qwen3.5 layer, q/k and final norms)
  log_neg      A_log = log(-ssm_a): llama.cpp stores A = -exp(A_log)
  conv         (C, K) -> (C, 1, K): the depthwise conv weight without its middle axis
  T            the last two axes swapped (gpt-oss stores its experts (E, in, out))
  vtiled:D     qwen3.5 linear attention: value heads of D dims each, llama.cpp's tiled order back to HF's
               grouped order, along axis 0 (rows); vtiled_cols:D along the last axis; for qkv and
               conv only the value rows (after 2 * Hk * dk) move
  gate_up      gpt-oss: HF gate_up_proj (E, H, 2I) interleaves gate (even) and up (odd) columns;
               GGUF has ffn_gate_exps / ffn_up_exps (E, I, H); the bias likewise
"""
from __future__ import annotations

import numpy as np

GLOBAL = {
    "gpt_oss": [("token_embd.weight", "model.embed_tokens.weight", "="), ("output.weight", "lm_head.weight", "="),
                ("output_norm.weight", "model.norm.weight", "=")],
    "qwen3_5_moe": [("token_embd.weight", "model.embed_tokens.weight", "="),
                    ("output.weight", "lm_head.weight", "="), ("output_norm.weight", "model.norm.weight", "minus1")],
    # lfm2: HF's final norm is model.embedding_norm, which llama.cpp names token_embd_norm; tied output
    "lfm2_moe": [("token_embd.weight", "model.embed_tokens.weight", "="),
                 ("token_embd_norm.weight", "model.embedding_norm.weight", "=")],
    # gemma4: tied output; rope_freqs (head_dim/2,) = 1 for the pairs that turn, 1e30 for the rest (no HF tensor)
    "gemma4": [("token_embd.weight", "model.embed_tokens.weight", "="), ("output_norm.weight", "model.norm.weight", "="),
               ("rope_freqs.weight", None, "=")],
}

_ATTN = [("attn_q.weight", "self_attn.q_proj.weight", "="), ("attn_k.weight", "self_attn.k_proj.weight", "="),
         ("attn_v.weight", "self_attn.v_proj.weight", "=")]

BLOCK = {
    "gpt_oss": _ATTN + [
        ("attn_q.bias", "self_attn.q_proj.bias", "="), ("attn_k.bias", "self_attn.k_proj.bias", "="),
        ("attn_v.bias", "self_attn.v_proj.bias", "="), ("attn_output.weight", "self_attn.o_proj.weight", "="),
        ("attn_output.bias", "self_attn.o_proj.bias", "="), ("attn_sinks.weight", "self_attn.sinks", "="),
        ("attn_norm.weight", "input_layernorm.weight", "="),
        ("post_attention_norm.weight", "post_attention_layernorm.weight", "="),
        ("ffn_gate_inp.weight", "mlp.router.weight", "="), ("ffn_gate_inp.bias", "mlp.router.bias", "="),
        ("ffn_gate_exps.weight|ffn_up_exps.weight", "mlp.experts.gate_up_proj", "gate_up"),
        ("ffn_gate_exps.bias|ffn_up_exps.bias", "mlp.experts.gate_up_proj_bias", "gate_up"),
        ("ffn_down_exps.weight", "mlp.experts.down_proj", "T"), ("ffn_down_exps.bias", "mlp.experts.down_proj_bias", "="),
    ],
    "qwen3_5_moe": _ATTN + [
        ("attn_output.weight", "self_attn.o_proj.weight", "="),
        ("attn_q_norm.weight", "self_attn.q_norm.weight", "minus1"),
        ("attn_k_norm.weight", "self_attn.k_norm.weight", "minus1"),
        ("attn_qkv.weight", "linear_attn.in_proj_qkv.weight", "vtiled_qkv"),
        ("attn_gate.weight", "linear_attn.in_proj_z.weight", "vtiled:dv"),
        ("ssm_beta.weight", "linear_attn.in_proj_b.weight", "vtiled:1"),
        ("ssm_alpha.weight", "linear_attn.in_proj_a.weight", "vtiled:1"),
        ("ssm_a", "linear_attn.A_log", "vtiled:1,log_neg"), ("ssm_dt.bias", "linear_attn.dt_bias", "vtiled:1"),
        ("ssm_conv1d.weight", "linear_attn.conv1d.weight", "vtiled_qkv,conv"),
        ("ssm_norm.weight", "linear_attn.norm.weight", "="),
        ("ssm_out.weight", "linear_attn.out_proj.weight", "vtiled_cols:dv"),
        ("attn_norm.weight", "input_layernorm.weight", "minus1"),
        ("post_attention_norm.weight", "post_attention_layernorm.weight", "minus1"),
        ("ffn_gate_inp.weight", "mlp.gate.weight", "="),
        ("ffn_gate_exps.weight", "mlp.experts.{e}.gate_proj.weight", "="),
        ("ffn_up_exps.weight", "mlp.experts.{e}.up_proj.weight", "="),
        ("ffn_down_exps.weight", "mlp.experts.{e}.down_proj.weight", "="),
        ("ffn_gate_shexp.weight", "mlp.shared_expert.gate_proj.weight", "="),
        ("ffn_up_shexp.weight", "mlp.shared_expert.up_proj.weight", "="),
        ("ffn_down_shexp.weight", "mlp.shared_expert.down_proj.weight", "="),
        ("ffn_gate_inp_shexp.weight", "mlp.shared_expert_gate.weight", "="),
    ],
    "lfm2_moe": _ATTN + [
        ("attn_output.weight", "self_attn.out_proj.weight", "="),
        ("attn_q_norm.weight", "self_attn.q_layernorm.weight", "="),
        ("attn_k_norm.weight", "self_attn.k_layernorm.weight", "="),
        ("shortconv.in_proj.weight", "conv.in_proj.weight", "="),
        ("shortconv.conv.weight", "conv.conv.weight", "conv"),
        ("shortconv.out_proj.weight", "conv.out_proj.weight", "="),
        ("attn_norm.weight", "operator_norm.weight", "="), ("ffn_norm.weight", "ffn_norm.weight", "="),
        ("ffn_gate.weight", "feed_forward.w1.weight", "="), ("ffn_up.weight", "feed_forward.w3.weight", "="),
        ("ffn_down.weight", "feed_forward.w2.weight", "="),
        ("ffn_gate_inp.weight", "feed_forward.gate.weight", "="),
        ("exp_probs_b.bias", "feed_forward.expert_bias", "="),
        ("ffn_gate_exps.weight", "feed_forward.experts.{e}.w1.weight", "="),
        ("ffn_up_exps.weight", "feed_forward.experts.{e}.w3.weight", "="),
        ("ffn_down_exps.weight", "feed_forward.experts.{e}.w2.weight", "="),
    ],
    "gemma4": _ATTN + [
        ("attn_output.weight", "self_attn.o_proj.weight", "="),
        ("attn_q_norm.weight", "self_attn.q_norm.weight", "="), ("attn_k_norm.weight", "self_attn.k_norm.weight", "="),
        ("attn_norm.weight", "input_layernorm.weight", "="),
        ("post_attention_norm.weight", "post_attention_layernorm.weight", "="),
        ("ffn_norm.weight", "pre_feedforward_layernorm.weight", "="),
        ("post_ffw_norm.weight", "post_feedforward_layernorm.weight", "="),
        ("post_ffw_norm_1.weight", "post_feedforward_layernorm_1.weight", "="),
        ("pre_ffw_norm_2.weight", "pre_feedforward_layernorm_2.weight", "="),
        ("post_ffw_norm_2.weight", "post_feedforward_layernorm_2.weight", "="),
        ("layer_output_scale.weight", "layer_scalar", "="),
        ("ffn_gate.weight", "mlp.gate_proj.weight", "="), ("ffn_up.weight", "mlp.up_proj.weight", "="),
        ("ffn_down.weight", "mlp.down_proj.weight", "="),
        ("ffn_gate_inp.weight", "router.proj.weight", "="), ("ffn_gate_inp.scale", "router.scale", "="),
        ("ffn_down_exps.scale", "router.per_expert_scale", "="),
        ("ffn_gate_up_exps.weight", "experts.gate_up_proj", "="), ("ffn_down_exps.weight", "experts.down_proj", "="),
    ],
}


def _untile(a: np.ndarray, axis: int, nk: int, nv: int, dim: int) -> np.ndarray:
    """llama.cpp's tiled value-head order [j * nk + g] back to HF's grouped [g * (nv/nk) + j]."""
    a = np.moveaxis(a, axis, 0)
    rest = a.shape[1:]
    a = a.reshape(nv // nk, nk, dim, *rest).transpose(1, 0, 2, *range(3, 3 + len(rest)))
    return np.moveaxis(a.reshape(nv * dim, *rest), 0, axis)


def _apply(transform: str, a: np.ndarray, cfg: dict) -> np.ndarray:
    for t in transform.split(","):
        if t == "=":
            continue
        if t == "minus1":
            a = a - 1
        elif t == "log_neg":
            a = np.log(-a)
        elif t == "conv":
            a = a[:, None, :]
        elif t == "T":
            a = np.swapaxes(a, -1, -2)
        elif t.startswith(("vtiled", "vtiled_cols")):
            nk, nv = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
            dim = cfg["linear_value_head_dim"] if t.endswith(("dv", "qkv")) else 1
            if t == "vtiled_qkv":
                qk = 2 * nk * cfg["linear_key_head_dim"]
                a = np.concatenate([a[:qk], _untile(a[qk:], 0, nk, nv, dim)])
            else:
                a = _untile(a, -1 if t.startswith("vtiled_cols") else 0, nk, nv, dim)
        else:
            raise ValueError(f"unknown transform {t!r}")
    return a


def hf_from_gguf(arch: str, tensors: dict[str, np.ndarray], cfg: dict) -> tuple[dict[str, np.ndarray], set[str]]:
    """GGUF tensors (numpy, float32) -> HF-named tensors; also the GGUF names that were consumed."""
    out, used = {}, set()
    for g, h, t in GLOBAL[arch]:
        if g in tensors:
            used.add(g)
            if h is not None:
                out[h] = _apply(t, tensors[g], cfg)
    for i in range(cfg["num_hidden_layers"]):
        for g, h, t in BLOCK[arch]:
            names = [f"blk.{i}.{x}" for x in g.split("|")]
            if not all(n in tensors for n in names):
                continue
            used.update(names)
            hname = f"model.layers.{i}.{h}"
            if t == "gate_up":  # interleave gate and up back into HF's fused tensor
                gate, up = (tensors[n] for n in names)
                fused = np.empty(gate.shape[:-2] + (gate.shape[-2] * 2, gate.shape[-1]) if gate.ndim == 3
                                 else gate.shape[:-1] + (gate.shape[-1] * 2,), np.float32)
                if gate.ndim == 3:
                    fused[:, ::2], fused[:, 1::2] = gate, up
                    fused = np.swapaxes(fused, -1, -2)
                else:
                    fused[:, ::2], fused[:, 1::2] = gate, up
                out[hname] = fused
            elif "{e}" in h:
                for e, a in enumerate(tensors[names[0]]):
                    out[hname.format(e=e)] = _apply(t, a, cfg)
            else:
                out[hname] = _apply(t, tensors[names[0]], cfg)
    return out, used


def read_gguf(path) -> dict[str, np.ndarray]:
    import gguf
    r = gguf.GGUFReader(str(path))
    return {t.name: np.asarray(t.data).astype(np.float32) for t in r.tensors}


def _fields(path) -> dict:
    import gguf
    r = gguf.GGUFReader(str(path))
    out = {}
    for k, f in r.fields.items():
        if k.startswith(("GGUF.", "tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.token_type")):
            continue
        out[k] = f.contents()
    return out


def config_from_gguf(arch: str, path, tensors: dict[str, np.ndarray]) -> dict:
    """The HF config fields arch_reference.Model reads, from the GGUF's metadata alone: what an engine
    needs from a GGUF of each architecture. Values llama.cpp fixes in code (not in the file) are
    marked FIXED."""
    f = _fields(path)
    p = f["general.architecture"] + "."
    n = f[p + "block_count"]
    heads = f[p + "attention.head_count"]
    kv = f[p + "attention.head_count_kv"]
    c = {"hidden_size": f[p + "embedding_length"], "num_hidden_layers": n, "num_attention_heads": heads,
         "rms_norm_eps": f[p + "attention.layer_norm_rms_epsilon"], "vocab_size": len(tensors["token_embd.weight"])}
    theta = f[p + "rope.freq_base"]
    if arch == "gpt_oss":
        c |= {"num_key_value_heads": kv, "head_dim": f[p + "attention.key_length"],
              "sliding_window": f[p + "attention.sliding_window"], "num_experts_per_tok": f[p + "expert_used_count"],
              # FIXED: llama.cpp's gpt-oss marks every other layer sliding, from layer 0
              "layer_types": ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(n)],
              "swiglu_alpha": 1.702, "swiglu_limit": 7.0,  # FIXED in ggml_swiglu_oai
              "rope_parameters": {"rope_type": "yarn", "rope_theta": theta,
                                  "factor": f[p + "rope.scaling.factor"],
                                  "original_max_position_embeddings": f[p + "rope.scaling.original_context_length"],
                                  "beta_fast": f[p + "rope.scaling.yarn_beta_fast"],
                                  "beta_slow": f[p + "rope.scaling.yarn_beta_slow"],
                                  # not in the file: gpt-oss's HF config says truncate false
                                  "truncate": False}}
    elif arch == "qwen3_5_moe":
        hd, nv = f[p + "attention.key_length"], f[p + "ssm.time_step_rank"]
        c |= {"num_key_value_heads": kv, "head_dim": hd, "num_experts_per_tok": f[p + "expert_used_count"],
              "layer_types": ["linear_attention" if r else "full_attention" for r in f[p + "attention.recurrent_layers"]],
              "linear_key_head_dim": f[p + "ssm.state_size"], "linear_num_key_heads": f[p + "ssm.group_count"],
              "linear_num_value_heads": nv, "linear_value_head_dim": f[p + "ssm.inner_size"] // nv,
              "linear_conv_kernel_dim": f[p + "ssm.conv_kernel"],
              "rope_parameters": {"rope_type": "default", "rope_theta": theta,
                                  "partial_rotary_factor": f[p + "rope.dimension_count"] / hd}}
    elif arch == "lfm2_moe":
        c |= {"num_key_value_heads": max(kv), "norm_eps": c.pop("rms_norm_eps"),
              "layer_types": ["full_attention" if k else "conv" for k in kv],
              "conv_L_cache": f[p + "shortconv.l_cache"], "num_dense_layers": f[p + "leading_dense_block_count"],
              "num_experts_per_tok": f[p + "expert_used_count"],
              "norm_topk_prob": True, "routed_scaling_factor": 1.0,  # FIXED (expert_gating_func 2 = sigmoid)
              "rope_parameters": {"rope_type": "default", "rope_theta": theta}}
    elif arch == "gemma4":
        swa = f[p + "attention.sliding_window_pattern"]
        hd_full = f[p + "attention.key_length"]
        turning = int((tensors["rope_freqs.weight"] == 1).sum())  # pairs that turn in full layers
        c |= {"num_key_value_heads": kv[swa.index(True)], "head_dim": f[p + "attention.key_length_swa"],
              "layer_types": ["sliding_attention" if s else "full_attention" for s in swa],
              "per_layer_config": {str(i): {"head_dim": hd_full, "num_key_value_heads": kv[i]}
                                   for i, s in enumerate(swa) if not s},
              "sliding_window": f[p + "attention.sliding_window"], "top_k_experts": f[p + "expert_used_count"],
              "final_logit_softcapping": f.get(p + "final_logit_softcapping"),
              "rope_parameters": {"sliding_attention": {"rope_type": "default", "rope_theta": f[p + "rope.freq_base_swa"]},
                                  "full_attention": {"rope_type": "proportional", "rope_theta": theta,
                                                     "partial_rotary_factor": 2 * turning / hd_full}}}
    return c
