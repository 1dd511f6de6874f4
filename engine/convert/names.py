"""Tensor names: one table per source format, internal name -> source name(s).

Internal names are GGUF's vocabulary with one tensor per expert (`blk.{L}.ffn_gate.{E}.weight`).
A source name ending in `[{E}]` is slice E of a stacked tensor (experts along the first axis);
`[{E}]#p/n` is part p of n equal row blocks of that slice (transformers 5 fuses gate and up
projections as `gate_up_proj` [E, 2·F, D], gate rows first). Where a row lists several source
names, the first one present in the checkpoint is used.
"""
from __future__ import annotations

import re

from engine.arch import SPECS

ALL = frozenset({"dense", "mixtral", "qwen_moe", "olmoe", "gpt_oss", "qwen3_5"})
DENSE, MIXTRAL = frozenset({"dense"}), frozenset({"mixtral"})
QWEN_MOE, OLMOE = frozenset({"qwen_moe", "qwen3_5"}), frozenset({"olmoe"})
MLP_EXPERTS = QWEN_MOE | OLMOE
LFM2, GPT_OSS, QWEN35 = frozenset({"lfm2"}), frozenset({"gpt_oss"}), frozenset({"qwen3_5"})
GEMMA4 = frozenset({"gemma4"})

HF_FAMILY = {s.name: s.family for s in SPECS.values()}  # architecture -> its table's family (engine.arch)


_L = "model.layers.{L}"
_ROUTER = f"{_L}.mlp.gate.weight"
_GATE, _UP = f"{_L}.mlp.experts.gate_up_proj[{{E}}]#0/2", f"{_L}.mlp.experts.gate_up_proj[{{E}}]#1/2"
_DOWN = f"{_L}.mlp.experts.down_proj[{{E}}]"  # transformers 5 fused layout, saved with save_original_format=False
# internal name                          Hugging Face name(s)                                      families
HF_NAMES: list[tuple[str, tuple[str, ...], frozenset[str]]] = [
    # Qwen3.5-MoE (first: these rows win over the shared ones below). Its norms are zero-centred:
    # "@plus1" stores 1 + w as llama.cpp does; "@negexp" stores A = -exp(A_log) (llama.cpp's ssm_a)
    ("output_norm.weight",               ("model.norm.weight@plus1",),                              QWEN35),
    ("blk.{L}.attn_norm.weight",         (f"{_L}.input_layernorm.weight@plus1",),                   QWEN35),
    ("blk.{L}.ffn_norm.weight",          (f"{_L}.post_attention_layernorm.weight@plus1",),          QWEN35),
    ("blk.{L}.attn_q_norm.weight",       (f"{_L}.self_attn.q_norm.weight@plus1",),                  QWEN35),
    ("blk.{L}.attn_k_norm.weight",       (f"{_L}.self_attn.k_norm.weight@plus1",),                  QWEN35),
    ("blk.{L}.attn_qkv.weight",          (f"{_L}.linear_attn.in_proj_qkv.weight",),                 QWEN35),
    ("blk.{L}.attn_gate.weight",         (f"{_L}.linear_attn.in_proj_z.weight",),                   QWEN35),
    ("blk.{L}.ssm_beta.weight",          (f"{_L}.linear_attn.in_proj_b.weight",),                   QWEN35),
    ("blk.{L}.ssm_alpha.weight",         (f"{_L}.linear_attn.in_proj_a.weight",),                   QWEN35),
    ("blk.{L}.ssm_a",                    (f"{_L}.linear_attn.A_log@negexp",),                       QWEN35),
    ("blk.{L}.ssm_dt.bias",              (f"{_L}.linear_attn.dt_bias",),                            QWEN35),
    ("blk.{L}.ssm_conv1d.weight",        (f"{_L}.linear_attn.conv1d.weight",),                      QWEN35),
    ("blk.{L}.ssm_norm.weight",          (f"{_L}.linear_attn.norm.weight",),                        QWEN35),
    ("blk.{L}.ssm_out.weight",           (f"{_L}.linear_attn.out_proj.weight",),                    QWEN35),
    ("token_embd.weight",                ("model.embed_tokens.weight",),                            ALL),
    ("output_norm.weight",               ("model.norm.weight",),                                    ALL),
    ("output.weight",                    ("lm_head.weight",),                                       ALL),
    ("blk.{L}.attn_norm.weight",         (f"{_L}.input_layernorm.weight",),                         ALL),
    ("blk.{L}.attn_q.weight",            (f"{_L}.self_attn.q_proj.weight",),                        ALL),
    ("blk.{L}.attn_k.weight",            (f"{_L}.self_attn.k_proj.weight",),                        ALL),
    ("blk.{L}.attn_v.weight",            (f"{_L}.self_attn.v_proj.weight",),                        ALL),
    ("blk.{L}.attn_output.weight",       (f"{_L}.self_attn.o_proj.weight",),                        ALL),
    ("blk.{L}.attn_q.bias",              (f"{_L}.self_attn.q_proj.bias",),                          ALL),
    ("blk.{L}.attn_k.bias",              (f"{_L}.self_attn.k_proj.bias",),                          ALL),
    ("blk.{L}.attn_v.bias",              (f"{_L}.self_attn.v_proj.bias",),                          ALL),
    ("blk.{L}.attn_q_norm.weight",       (f"{_L}.self_attn.q_norm.weight",),                        ALL),
    ("blk.{L}.attn_k_norm.weight",       (f"{_L}.self_attn.k_norm.weight",),                        ALL),
    ("blk.{L}.ffn_norm.weight",          (f"{_L}.post_attention_layernorm.weight",),                ALL),
    # gpt-oss: o bias, sinks, a biased router; experts (E, in, out) with gate/up interleaved along
    # the columns of gate_up_proj: "~p/n" takes columns p::n, "'" transposes the slice
    ("blk.{L}.attn_output.bias",         (f"{_L}.self_attn.o_proj.bias",),                          GPT_OSS),
    ("blk.{L}.attn_sinks.weight",        (f"{_L}.self_attn.sinks",),                                GPT_OSS),
    ("blk.{L}.ffn_gate_inp.weight",      (f"{_L}.mlp.router.weight",),                              GPT_OSS),
    ("blk.{L}.ffn_gate_inp.bias",        (f"{_L}.mlp.router.bias",),                                GPT_OSS),
    # (the released checkpoints: MXFP4 *_blocks/*_scales, read by engine.convert.hf as `.mxfp4`
    # tensors (out, in) in ggml's block layout, gate and up rows already taken apart)
    ("blk.{L}.ffn_gate.{E}.weight",      (f"{_L}.mlp.experts.gate_up_proj[{{E}}]~0/2'",
                                          f"{_L}.mlp.experts.gate_proj.mxfp4[{{E}}]"),                 GPT_OSS),
    ("blk.{L}.ffn_up.{E}.weight",        (f"{_L}.mlp.experts.gate_up_proj[{{E}}]~1/2'",
                                          f"{_L}.mlp.experts.up_proj.mxfp4[{{E}}]"),                   GPT_OSS),
    ("blk.{L}.ffn_down.{E}.weight",      (f"{_L}.mlp.experts.down_proj[{{E}}]'",
                                          f"{_L}.mlp.experts.down_proj.mxfp4[{{E}}]"),                 GPT_OSS),
    ("blk.{L}.ffn_gate_exps.bias",       (f"{_L}.mlp.experts.gate_up_proj_bias~0/2",),              GPT_OSS),
    ("blk.{L}.ffn_up_exps.bias",         (f"{_L}.mlp.experts.gate_up_proj_bias~1/2",),              GPT_OSS),
    ("blk.{L}.ffn_down_exps.bias",       (f"{_L}.mlp.experts.down_proj_bias",),                     GPT_OSS),
    ("blk.{L}.ffn_gate.0.weight",        (f"{_L}.mlp.gate_proj.weight",),                           DENSE),
    ("blk.{L}.ffn_up.0.weight",          (f"{_L}.mlp.up_proj.weight",),                             DENSE),
    ("blk.{L}.ffn_down.0.weight",        (f"{_L}.mlp.down_proj.weight",),                           DENSE),
    ("blk.{L}.ffn_gate_inp.weight",      (f"{_L}.block_sparse_moe.gate.weight", _ROUTER),            MIXTRAL),
    ("blk.{L}.ffn_gate.{E}.weight",      (f"{_L}.block_sparse_moe.experts.{{E}}.w1.weight", _GATE),  MIXTRAL),
    ("blk.{L}.ffn_down.{E}.weight",      (f"{_L}.block_sparse_moe.experts.{{E}}.w2.weight", _DOWN),  MIXTRAL),
    ("blk.{L}.ffn_up.{E}.weight",        (f"{_L}.block_sparse_moe.experts.{{E}}.w3.weight", _UP),    MIXTRAL),
    ("blk.{L}.ffn_gate_inp.weight",      (_ROUTER,),                                                MLP_EXPERTS),
    ("blk.{L}.ffn_gate.{E}.weight",      (f"{_L}.mlp.experts.{{E}}.gate_proj.weight", _GATE),       MLP_EXPERTS),
    ("blk.{L}.ffn_up.{E}.weight",        (f"{_L}.mlp.experts.{{E}}.up_proj.weight", _UP),           MLP_EXPERTS),
    ("blk.{L}.ffn_down.{E}.weight",      (f"{_L}.mlp.experts.{{E}}.down_proj.weight", _DOWN),       MLP_EXPERTS),
    ("blk.{L}.ffn_gate_inp_shexp.weight", (f"{_L}.mlp.shared_expert_gate.weight",),                 QWEN_MOE),
    ("blk.{L}.ffn_gate_shexp.weight",    (f"{_L}.mlp.shared_expert.gate_proj.weight",),             QWEN_MOE),
    ("blk.{L}.ffn_up_shexp.weight",      (f"{_L}.mlp.shared_expert.up_proj.weight",),               QWEN_MOE),
    ("blk.{L}.ffn_down_shexp.weight",    (f"{_L}.mlp.shared_expert.down_proj.weight",),             QWEN_MOE),
    # Gemma 4: sandwich norms, a dense MLP beside the experts (stored as the shared expert), the
    # router's scales; full layers have no v_proj (k_eq_v); tied output
    ("token_embd.weight",                ("model.embed_tokens.weight",),                            GEMMA4),
    ("output_norm.weight",               ("model.norm.weight",),                                    GEMMA4),
    ("output.weight",                    ("lm_head.weight",),                                       GEMMA4),
    ("blk.{L}.attn_norm.weight",         (f"{_L}.input_layernorm.weight",),                         GEMMA4),
    ("blk.{L}.post_attention_norm.weight", (f"{_L}.post_attention_layernorm.weight",),              GEMMA4),
    ("blk.{L}.ffn_norm.weight",          (f"{_L}.pre_feedforward_layernorm.weight",),               GEMMA4),
    ("blk.{L}.post_ffw_norm_1.weight",   (f"{_L}.post_feedforward_layernorm_1.weight",),            GEMMA4),
    ("blk.{L}.pre_ffw_norm_2.weight",    (f"{_L}.pre_feedforward_layernorm_2.weight",),             GEMMA4),
    ("blk.{L}.post_ffw_norm_2.weight",   (f"{_L}.post_feedforward_layernorm_2.weight",),            GEMMA4),
    ("blk.{L}.post_ffw_norm.weight",     (f"{_L}.post_feedforward_layernorm.weight",),              GEMMA4),
    ("blk.{L}.layer_output_scale.weight", (f"{_L}.layer_scalar",),                                  GEMMA4),
    ("blk.{L}.attn_q.weight",            (f"{_L}.self_attn.q_proj.weight",),                        GEMMA4),
    ("blk.{L}.attn_k.weight",            (f"{_L}.self_attn.k_proj.weight",),                        GEMMA4),
    ("blk.{L}.attn_v.weight",            (f"{_L}.self_attn.v_proj.weight",),                        GEMMA4),
    ("blk.{L}.attn_output.weight",       (f"{_L}.self_attn.o_proj.weight",),                        GEMMA4),
    ("blk.{L}.attn_q_norm.weight",       (f"{_L}.self_attn.q_norm.weight",),                        GEMMA4),
    ("blk.{L}.attn_k_norm.weight",       (f"{_L}.self_attn.k_norm.weight",),                        GEMMA4),
    ("blk.{L}.ffn_gate_inp.weight",      (f"{_L}.router.proj.weight",),                             GEMMA4),
    ("blk.{L}.ffn_gate_inp.scale",       (f"{_L}.router.scale",),                                   GEMMA4),
    ("blk.{L}.ffn_down_exps.scale",      (f"{_L}.router.per_expert_scale",),                        GEMMA4),
    ("blk.{L}.ffn_gate_shexp.weight",    (f"{_L}.mlp.gate_proj.weight",),                           GEMMA4),
    ("blk.{L}.ffn_up_shexp.weight",      (f"{_L}.mlp.up_proj.weight",),                             GEMMA4),
    ("blk.{L}.ffn_down_shexp.weight",    (f"{_L}.mlp.down_proj.weight",),                           GEMMA4),
    ("blk.{L}.ffn_gate.{E}.weight",      (f"{_L}.experts.gate_up_proj[{{E}}]#0/2",),                GEMMA4),
    ("blk.{L}.ffn_up.{E}.weight",        (f"{_L}.experts.gate_up_proj[{{E}}]#1/2",),                GEMMA4),
    ("blk.{L}.ffn_down.{E}.weight",      (f"{_L}.experts.down_proj[{{E}}]",),                       GEMMA4),
    # LFM2-MoE: the final norm is model.embedding_norm (applied after the last layer); tied output;
    # a leading dense layer's MLP (feed_forward.w1/w3/w2) is stored as its shared expert
    ("token_embd.weight",                ("model.embed_tokens.weight",),                            LFM2),
    ("output_norm.weight",               ("model.embedding_norm.weight",),                          LFM2),
    ("output.weight",                    ("lm_head.weight",),                                       LFM2),
    ("blk.{L}.attn_norm.weight",         (f"{_L}.operator_norm.weight",),                           LFM2),
    ("blk.{L}.ffn_norm.weight",          (f"{_L}.ffn_norm.weight",),                                LFM2),
    ("blk.{L}.attn_q.weight",            (f"{_L}.self_attn.q_proj.weight",),                        LFM2),
    ("blk.{L}.attn_k.weight",            (f"{_L}.self_attn.k_proj.weight",),                        LFM2),
    ("blk.{L}.attn_v.weight",            (f"{_L}.self_attn.v_proj.weight",),                        LFM2),
    ("blk.{L}.attn_output.weight",       (f"{_L}.self_attn.out_proj.weight",),                      LFM2),
    ("blk.{L}.attn_q_norm.weight",       (f"{_L}.self_attn.q_layernorm.weight",),                   LFM2),
    ("blk.{L}.attn_k_norm.weight",       (f"{_L}.self_attn.k_layernorm.weight",),                   LFM2),
    ("blk.{L}.shortconv.in_proj.weight", (f"{_L}.conv.in_proj.weight",),                            LFM2),
    ("blk.{L}.shortconv.conv.weight",    (f"{_L}.conv.conv.weight",),                               LFM2),
    ("blk.{L}.shortconv.out_proj.weight", (f"{_L}.conv.out_proj.weight",),                          LFM2),
    ("blk.{L}.ffn_gate_shexp.weight",    (f"{_L}.feed_forward.w1.weight",),                         LFM2),
    ("blk.{L}.ffn_up_shexp.weight",      (f"{_L}.feed_forward.w3.weight",),                         LFM2),
    ("blk.{L}.ffn_down_shexp.weight",    (f"{_L}.feed_forward.w2.weight",),                         LFM2),
    ("blk.{L}.ffn_gate_inp.weight",      (f"{_L}.feed_forward.gate.weight",),                       LFM2),
    ("blk.{L}.exp_probs_b.bias",         (f"{_L}.feed_forward.expert_bias",),                       LFM2),
    ("blk.{L}.ffn_gate.{E}.weight",      (f"{_L}.feed_forward.experts.{{E}}.w1.weight",
                                          f"{_L}.feed_forward.experts.gate_up_proj[{{E}}]#0/2"),    LFM2),
    ("blk.{L}.ffn_up.{E}.weight",        (f"{_L}.feed_forward.experts.{{E}}.w3.weight",
                                          f"{_L}.feed_forward.experts.gate_up_proj[{{E}}]#1/2"),    LFM2),
    ("blk.{L}.ffn_down.{E}.weight",      (f"{_L}.feed_forward.experts.{{E}}.w2.weight",
                                          f"{_L}.feed_forward.experts.down_proj[{{E}}]"),           LFM2),
]
# Present in some checkpoints, derived by the engine: consumed without being stored.
HF_IGNORED = (re.compile(r"model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq"),)

_B = "blk.{L}"
# internal name                          GGUF name(s): stacked experts first, old per-expert second
GGUF_NAMES: list[tuple[str, tuple[str, ...]]] = [
    ("token_embd.weight",                ("token_embd.weight",)),
    ("output_norm.weight",               ("output_norm.weight", "token_embd_norm.weight")),  # (the second: LFM2)
    ("output.weight",                    ("output.weight",)),
    ("rope_freqs.weight",                ("rope_freqs.weight",)),
    ("blk.{L}.attn_norm.weight",         (f"{_B}.attn_norm.weight",)),
    ("blk.{L}.attn_q.weight",            (f"{_B}.attn_q.weight",)),
    ("blk.{L}.attn_k.weight",            (f"{_B}.attn_k.weight",)),
    ("blk.{L}.attn_v.weight",            (f"{_B}.attn_v.weight",)),
    ("blk.{L}.attn_output.weight",       (f"{_B}.attn_output.weight",)),
    ("blk.{L}.attn_q.bias",              (f"{_B}.attn_q.bias",)),
    ("blk.{L}.attn_k.bias",              (f"{_B}.attn_k.bias",)),
    ("blk.{L}.attn_v.bias",              (f"{_B}.attn_v.bias",)),
    ("blk.{L}.attn_q_norm.weight",       (f"{_B}.attn_q_norm.weight",)),
    ("blk.{L}.attn_k_norm.weight",       (f"{_B}.attn_k_norm.weight",)),
    ("blk.{L}.ffn_norm.weight",          (f"{_B}.ffn_norm.weight", f"{_B}.post_attention_norm.weight")),  # (gpt-oss)
    ("blk.{L}.ffn_gate_inp.weight",      (f"{_B}.ffn_gate_inp.weight",)),
    ("blk.{L}.ffn_gate.{E}.weight",      (f"{_B}.ffn_gate_exps.weight[{{E}}]", f"{_B}.ffn_gate.{{E}}.weight",
                                          f"{_B}.ffn_gate_up_exps.weight[{{E}}]#0/2")),  # (the third: Gemma 4)
    ("blk.{L}.ffn_up.{E}.weight",        (f"{_B}.ffn_up_exps.weight[{{E}}]", f"{_B}.ffn_up.{{E}}.weight",
                                          f"{_B}.ffn_gate_up_exps.weight[{{E}}]#1/2")),
    ("blk.{L}.ffn_down.{E}.weight",      (f"{_B}.ffn_down_exps.weight[{{E}}]", f"{_B}.ffn_down.{{E}}.weight")),
    ("blk.{L}.ffn_gate_inp_shexp.weight", (f"{_B}.ffn_gate_inp_shexp.weight",)),
    # a shared expert, or (second) a leading dense layer's MLP in an MoE model (LFM2-MoE)
    ("blk.{L}.ffn_gate_shexp.weight",    (f"{_B}.ffn_gate_shexp.weight", f"{_B}.ffn_gate.weight")),
    ("blk.{L}.ffn_up_shexp.weight",      (f"{_B}.ffn_up_shexp.weight", f"{_B}.ffn_up.weight")),
    ("blk.{L}.ffn_down_shexp.weight",    (f"{_B}.ffn_down_shexp.weight", f"{_B}.ffn_down.weight")),
    ("blk.{L}.exp_probs_b.bias",         (f"{_B}.exp_probs_b.bias",)),
    ("blk.{L}.attn_output.bias",         (f"{_B}.attn_output.bias",)),
    ("blk.{L}.attn_qkv.weight",          (f"{_B}.attn_qkv.weight",)),
    ("blk.{L}.post_attention_norm.weight", (f"{_B}.post_attention_norm.weight",)),
    ("blk.{L}.post_ffw_norm_1.weight",   (f"{_B}.post_ffw_norm_1.weight",)),
    ("blk.{L}.pre_ffw_norm_2.weight",    (f"{_B}.pre_ffw_norm_2.weight",)),
    ("blk.{L}.post_ffw_norm_2.weight",   (f"{_B}.post_ffw_norm_2.weight",)),
    ("blk.{L}.post_ffw_norm.weight",     (f"{_B}.post_ffw_norm.weight",)),
    ("blk.{L}.layer_output_scale.weight", (f"{_B}.layer_output_scale.weight",)),
    ("blk.{L}.ffn_gate_inp.scale",       (f"{_B}.ffn_gate_inp.scale",)),
    ("blk.{L}.ffn_down_exps.scale",      (f"{_B}.ffn_down_exps.scale",)),
    ("blk.{L}.attn_gate.weight",         (f"{_B}.attn_gate.weight",)),
    ("blk.{L}.ssm_beta.weight",          (f"{_B}.ssm_beta.weight",)),
    ("blk.{L}.ssm_alpha.weight",         (f"{_B}.ssm_alpha.weight",)),
    ("blk.{L}.ssm_a",                    (f"{_B}.ssm_a",)),
    ("blk.{L}.ssm_dt.bias",              (f"{_B}.ssm_dt.bias",)),
    ("blk.{L}.ssm_conv1d.weight",        (f"{_B}.ssm_conv1d.weight",)),
    ("blk.{L}.ssm_norm.weight",          (f"{_B}.ssm_norm.weight",)),
    ("blk.{L}.ssm_out.weight",           (f"{_B}.ssm_out.weight",)),
    ("blk.{L}.attn_sinks.weight",        (f"{_B}.attn_sinks.weight",)),
    ("blk.{L}.ffn_gate_inp.bias",        (f"{_B}.ffn_gate_inp.bias",)),
    ("blk.{L}.ffn_gate_exps.bias",       (f"{_B}.ffn_gate_exps.bias",)),
    ("blk.{L}.ffn_up_exps.bias",         (f"{_B}.ffn_up_exps.bias",)),
    ("blk.{L}.ffn_down_exps.bias",       (f"{_B}.ffn_down_exps.bias",)),
    ("blk.{L}.shortconv.in_proj.weight", (f"{_B}.shortconv.in_proj.weight",)),
    ("blk.{L}.shortconv.conv.weight",    (f"{_B}.shortconv.conv.weight",)),
    ("blk.{L}.shortconv.out_proj.weight", (f"{_B}.shortconv.out_proj.weight",)),
]
# A dense GGUF model's MLP is our expert 0.
GGUF_DENSE_MLP = {"blk.{L}.ffn_gate.0.weight": f"{_B}.ffn_gate.weight",
                  "blk.{L}.ffn_up.0.weight": f"{_B}.ffn_up.weight",
                  "blk.{L}.ffn_down.0.weight": f"{_B}.ffn_down.weight"}


def _pattern(internal: str) -> re.Pattern[str]:
    return re.compile("^" + re.escape(internal).replace(r"\{L\}", r"(?P<L>\d+)").replace(r"\{E\}", r"(?P<E>\d+)") + "$")


_HF = [(_pattern(i), srcs, fams) for i, srcs, fams in HF_NAMES]
_GGUF = [(_pattern(i), srcs) for i, srcs in GGUF_NAMES]
_GGUF_DENSE = [(_pattern(i), (s,)) for i, s in GGUF_DENSE_MLP.items()]


def _fill(templates: tuple[str, ...], m: re.Match[str]) -> list[str]:
    return [t.format(**m.groupdict()) for t in templates]


def hf_names(internal: str, family: str) -> list[str]:
    """Candidate Hugging Face names for an internal tensor name."""
    for pat, srcs, fams in _HF:
        if family in fams and (m := pat.match(internal)):
            return _fill(srcs, m)
    return []


def gguf_names(internal: str, dense: bool) -> list[str]:
    """Candidate GGUF names (possibly `name[E]` slices) for an internal tensor name."""
    for pat, srcs in (_GGUF_DENSE if dense else []) + _GGUF:
        if m := pat.match(internal):
            return _fill(srcs, m)
    return []


def split_transforms(source_name: str) -> tuple[str, tuple[int, int] | None, bool, str | None]:
    """"x[3]~0/2'" -> ("x[3]", (0, 2), True, None): columns 0::2 of the slice, then transposed;
    "x@plus1" -> ("x", None, False, "plus1"): the values mapped (SourceTensor.mapped)."""
    m = re.fullmatch(r"(.*?)(?:~(\d+)/(\d+))?('?)(?:@(\w+))?", source_name)
    cols = (int(m.group(2)), int(m.group(3))) if m.group(2) else None
    return m.group(1), cols, bool(m.group(4)), m.group(5)


def split_slice(source_name: str) -> tuple[str, int | None, tuple[int, int] | None]:
    """'x.gate_up_proj[3]#1/2' -> ('x.gate_up_proj', 3, (1, 2)); plain names -> (name, None, None)."""
    m = re.fullmatch(r"(.*)\[(\d+)\](?:#(\d+)/(\d+))?", source_name)
    if not m:
        return source_name, None, None
    part = (int(m.group(3)), int(m.group(4))) if m.group(3) else None
    return m.group(1), int(m.group(2)), part
