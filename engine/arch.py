"""What an architecture is: one frozen `ArchSpec` per architecture, the single source for what
differs between them.

The converters (engine.convert.hf, gguf_file, names) read it to build a model's `ModelConfig`
(whose flags the model-directory layout, engine.model_dir.expected_tensors, follows); the forward
pass (engine.models.base) and the fused decode (engine.models.fused) read it at load. None of
them holds a table of architectures of its own.

A spec says which *kinds* of parts a family has (layer kinds, router function, shared expert,
norms, biases, rope variants); the numbers of one model (sizes, eps, theta, top-k, window,
the rope scaling factor) are its `ModelConfig`. `spec.check(cfg)` refuses, naming the
architecture and the feature, whatever the forward pass does not implement yet, before any
weight is read. The next architectures are new `ArchSpec(...)` rows in `SPECS`, not new classes.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from engine.errors import ModelFormatError

if TYPE_CHECKING:
    from engine.model_dir import ModelConfig

# --- the vocabulary ----------------------------------------------------------------------------
# Layer kinds (the token mixer of one decoder layer). Each gets its own cache kind later:
# "attention" and "sliding_attention" a KV cache (the second a ring of `sliding_window`
# positions), "linear_attention" (Qwen3-Next / Qwen3.5 gated DeltaNet) and "short_conv" (LFM2)
# a fixed-size recurrent state.
LayerKind = Literal["attention", "sliding_attention", "linear_attention", "short_conv"]
# Router functions, (T, E) logits -> (T, k) weights and expert ids:
#   "softmax_topk": softmax over all experts, the top k, renormalised to sum 1 if cfg.norm_topk_prob
#                   (Mixtral, Qwen-MoE, OLMoE);
#   "topk_softmax": the top k logits, softmax over those k (gpt-oss);
#   "sigmoid_bias": sigmoid scores, top k by score + a learned per-expert bias (selection only),
#                   weights = the unbiased scores renormalised (DeepSeek-V3, LFM2-MoE).
#   "gemma4":       softmax over all of (rms(h) * scale * H^-1/2) W^T from the raw residual, top k
#                   renormalised, times a per-expert scale.
Router = Literal["softmax_topk", "topk_softmax", "sigmoid_bias", "gemma4"]
# A shared (always-on) expert beside the routed ones: none, plain (added as is), or scaled by
# sigmoid(h · ffn_gate_inp_shexp) (Qwen2-MoE).
SharedExpert = Literal["none", "plain", "sigmoid_gate"]
# q/k RMSNorm: none, per head over head_dim (Qwen3), or over all heads at once (OLMoE).
QKNorm = Literal["none", "head", "full"]
# RMSNorm weight: x·w ("weight") or x·(1 + w) ("offset", Gemma). Placement: "pre" (x += f(norm x))
# or "sandwich" (x += norm_post(f(norm_pre x)), Gemma).
NormWeight = Literal["weight", "offset"]
NormPlace = Literal["pre", "sandwich"]
# Rope variants (cfg.rope_scaling["type"], or "default" when it is None).
Rope = Literal["default", "linear", "llama3", "yarn"]
# Tensor-name families of engine.convert.names (one Hugging Face table per family).
Family = Literal["dense", "mixtral", "qwen_moe", "olmoe", "lfm2", "gpt_oss", "qwen3_5", "gemma4"]

FEATURES = ("attention", "sliding_attention", "linear_attention", "short_conv", "router:softmax_topk",
            "router:topk_softmax", "router:sigmoid_bias", "router:gemma4", "shared_expert:plain", "shared_expert:sigmoid_gate",
            "qk_norm:head", "qk_norm:full", "qkv_bias", "o_bias", "expert_bias", "attention_sinks",
            "dense_leading_layers", "swiglu_clamp", "logit_softcap", "norm:offset", "norm:sandwich",
            "rope:default", "rope:linear", "rope:llama3", "rope:yarn", "partial_rotary", "clip_qkv", "attention_gate",
            "gelu", "parallel_dense", "k_eq_v", "v_norm", "embed_scale", "rope:proportional")
"""Every feature name a spec can resolve to for a model (`ArchSpec.features`)."""

# What engine.models.base computes today; anything else a model needs is refused by check().
# (llama3 rope is converted into rope_freqs divisors, which a model directory then runs as
# "default" with rope_freq_factors.)
IMPLEMENTED = frozenset({"attention", "sliding_attention", "router:softmax_topk", "shared_expert:sigmoid_gate",
                         "qk_norm:head", "qk_norm:full", "qkv_bias", "rope:default", "rope:linear", "clip_qkv",
                         "short_conv", "router:sigmoid_bias", "dense_leading_layers", "router:topk_softmax",
                         "o_bias", "expert_bias", "attention_sinks", "swiglu_clamp", "rope:yarn",
                         "linear_attention", "attention_gate", "partial_rotary", "norm:offset",
                         "router:gemma4", "norm:sandwich", "logit_softcap", "gelu", "parallel_dense", "k_eq_v",
                         "v_norm", "embed_scale", "rope:proportional"})
# (norm:offset is folded into the stored norm weights (1 + w) by the converter, as llama.cpp stores them)


class UnsupportedFeatureError(ModelFormatError, NotImplementedError):
    """A model needs a part of its architecture the engine does not compute yet."""


@dataclass(frozen=True)
class ArchSpec:
    """One architecture family: its names in every source format and the kinds of parts it has.

    Fields that are also model numbers (`qkv_bias`, `renormalise`) give the family's default;
    the config keys named beside them override it when converting."""
    name: str  # ours: config.json "architecture"
    hf_classes: tuple[str, ...]  # Hugging Face config.json "architectures"
    gguf_arch: str | None  # GGUF general.architecture (None: reached another way, see gguf_experts)
    family: Family  # which Hugging Face tensor-name table (engine.convert.names)
    # --- decoder layers ---
    layer_kinds: tuple[LayerKind, ...] = ("attention", "sliding_attention")  # kinds it may use
    layer_types_key: str | None = None  # HF config key listing each layer's kind (None: all one kind)
    norm_weight: NormWeight = "weight"
    norm_place: NormPlace = "pre"
    qk_norm: QKNorm = "none"
    qkv_bias: bool = False
    qkv_bias_key: str | None = None  # HF config key that overrides qkv_bias
    o_bias: bool = False
    attention_sinks: bool = False  # a learned per-head logit in the softmax (gpt-oss)
    logit_softcap: bool = False  # final logits c·tanh(x / c) (Gemma)
    rope: tuple[Rope, ...] = ("default", "linear", "llama3", "yarn")  # variants a config may ask for
    partial_rotary: bool = False  # rope on the first fraction of head_dim only
    attention_gate: bool = False  # q_proj also gives a per-head output gate: out * sigmoid(gate) (Qwen3.5)
    k_eq_v: bool = False  # full-attention layers have no v_proj: v is the raw k projection (Gemma 4)
    v_norm: bool = False  # v is RMS-normalised per head, without a weight (Gemma 4)
    attention_scale: float | None = None  # q.k scale (None: head_dim^-1/2; Gemma 4: 1, its q_norm scales)
    full_rope: Literal["same", "proportional"] = "same"  # full layers' rope (Gemma 4: proportional, own theta)
    embed_scale: bool = False  # embeddings times sqrt(hidden_size) (Gemma)
    # --- feed-forward ---
    moe: bool = False
    router: Router = "softmax_topk"
    renormalise: bool = False  # cfg.norm_topk_prob when a Hugging Face config does not say
    renormalise_key: str | None = "norm_topk_prob"  # HF config key that overrides it (None: fixed)
    gguf_renormalise: bool = False  # ... when a GGUF has no expert_weights_norm (llama.cpp's default)
    shared_expert: SharedExpert = "none"
    expert_bias: bool = False  # biases on the experts' gate/up/down (gpt-oss)
    dense_leading_layers: bool = False  # the first k layers are dense (DeepSeek first_k_dense_replace)
    swiglu_clamp: bool = False  # gate/up clamped before the SwiGLU (gpt-oss swiglu_limit)
    activation: Literal["silu", "gelu_tanh"] = "silu"  # of the gated MLPs: act(gate) * up
    parallel_dense: bool = False  # a dense MLP beside the experts in every layer (Gemma 4; stored as "shared")
    hf_ff_key: str = "intermediate_size"  # HF config key of one expert's width
    # --- GGUF ---
    gguf_permuted_qk: bool = False  # llama.cpp's converter permuted q/k rows (undone on import)
    gguf_experts: str | None = None  # this architecture is `gguf_experts` with expert_count > 1

    def renormalises(self, cfg: ModelConfig) -> bool:
        """Whether the top-k router weights are renormalised to sum 1 (fixed by the family, or
        the model's norm_topk_prob)."""
        return self.renormalise if self.renormalise_key is None else cfg.norm_topk_prob

    def layer_types(self, cfg: ModelConfig) -> tuple[LayerKind, ...]:
        """The kind of each of the model's layers."""
        if cfg.layer_types:
            return tuple(cfg.layer_types)  # type: ignore[arg-type]
        kind: LayerKind = "sliding_attention" if cfg.sliding_window else "attention"
        return (kind,) * cfg.num_layers

    def rope_kind(self, cfg: ModelConfig) -> Rope:
        return (cfg.rope_scaling or {}).get("type", "default")

    def features(self, cfg: ModelConfig) -> frozenset[str]:
        """The feature names (FEATURES) this model uses: what a forward pass must compute."""
        f = set(self.layer_types(cfg)) | {f"rope:{self.rope_kind(cfg)}"}
        if cfg.is_moe:
            f.add(f"router:{self.router}")
        if cfg.shared_expert_intermediate_size:
            f.add(f"shared_expert:{self.shared_expert}")
        if cfg.qk_norm != "none":
            f.add(f"qk_norm:{cfg.qk_norm}")
        f |= {name for name, on in (("qkv_bias", cfg.attention_bias), ("clip_qkv", bool(cfg.clip_qkv)),
                                    ("o_bias", self.o_bias), ("expert_bias", self.expert_bias),
                                    ("attention_sinks", self.attention_sinks), ("logit_softcap", self.logit_softcap),
                                    ("swiglu_clamp", self.swiglu_clamp), ("partial_rotary", self.partial_rotary),
                                    ("attention_gate", self.attention_gate), ("k_eq_v", self.k_eq_v),
                                    ("v_norm", self.v_norm), ("embed_scale", self.embed_scale),
                                    ("gelu", self.activation == "gelu_tanh"), ("parallel_dense", self.parallel_dense),
                                    ("rope:proportional", self.full_rope == "proportional"),
                                    ("dense_leading_layers", self.dense_leading_layers and cfg.dense_layers > 0),
                                    ("norm:offset", self.norm_weight == "offset"),
                                    ("norm:sandwich", self.norm_place == "sandwich")) if on}
        return frozenset(f)

    def check(self, cfg: ModelConfig, implemented: frozenset[str] = IMPLEMENTED) -> None:
        """Raise UnsupportedFeatureError naming the architecture and each feature the model needs
        that `implemented` lacks (or that this architecture cannot have)."""
        kind = self.rope_kind(cfg)
        if kind not in self.rope:
            raise UnsupportedFeatureError(f"{self.name}: rope scaling {kind!r} is not a variant of this architecture "
                                          f"({', '.join(self.rope)})")
        missing = sorted(self.features(cfg) - implemented)
        if missing:
            raise UnsupportedFeatureError(f"{self.name}: {', '.join(missing)} not supported yet by this engine")



SPECS: dict[str, ArchSpec] = {s.name: s for s in (
    ArchSpec("llama", ("LlamaForCausalLM",), "llama", "dense", qkv_bias_key="attention_bias", gguf_permuted_qk=True),
    ArchSpec("mistral", ("MistralForCausalLM",), None, "dense", qkv_bias_key="attention_bias"),
    ArchSpec("qwen2", ("Qwen2ForCausalLM",), "qwen2", "dense", qkv_bias=True),
    ArchSpec("qwen3", ("Qwen3ForCausalLM",), "qwen3", "dense", qk_norm="head", qkv_bias_key="attention_bias"),
    ArchSpec("mixtral", ("MixtralForCausalLM",), None, "mixtral", moe=True, renormalise=True, renormalise_key=None,
             gguf_renormalise=True,
             qkv_bias_key="attention_bias", gguf_permuted_qk=True, gguf_experts="llama"),
    ArchSpec("qwen2_moe", ("Qwen2MoeForCausalLM",), "qwen2moe", "qwen_moe", moe=True, qkv_bias=True,
             qkv_bias_key="qkv_bias", shared_expert="sigmoid_gate", hf_ff_key="moe_intermediate_size"),
    ArchSpec("qwen3_moe", ("Qwen3MoeForCausalLM",), "qwen3moe", "qwen_moe", moe=True, qk_norm="head", gguf_renormalise=True,
             qkv_bias_key="attention_bias", hf_ff_key="moe_intermediate_size"),
    ArchSpec("olmoe", ("OlmoeForCausalLM",), "olmoe", "olmoe", moe=True, qk_norm="full",
             qkv_bias_key="attention_bias"),
    ArchSpec("lfm2_moe", ("Lfm2MoeForCausalLM",), "lfm2moe", "lfm2", layer_kinds=("short_conv", "attention"),
             layer_types_key="layer_types",
             qk_norm="head", moe=True, router="sigmoid_bias", renormalise=True, gguf_renormalise=True,
             dense_leading_layers=True, hf_ff_key="moe_intermediate_size"),
    ArchSpec("gpt_oss", ("GptOssForCausalLM",), "gpt-oss", "gpt_oss", layer_types_key="layer_types", qkv_bias=True,
             qkv_bias_key="attention_bias", o_bias=True, attention_sinks=True, rope=("default", "yarn"), moe=True,
             router="topk_softmax", renormalise=True, renormalise_key=None, gguf_renormalise=True, expert_bias=True,
             swiglu_clamp=True),
    ArchSpec("qwen3_5_moe", ("Qwen3_5MoeForCausalLM", "Qwen3_5MoeForConditionalGeneration"), "qwen35moe", "qwen3_5",
             layer_kinds=("linear_attention", "attention"), layer_types_key="layer_types", norm_weight="offset",
             qk_norm="head", qkv_bias_key="attention_bias", partial_rotary=True, attention_gate=True,
             rope=("default",), moe=True, renormalise=True, gguf_renormalise=True, shared_expert="sigmoid_gate",
             hf_ff_key="moe_intermediate_size"),
    ArchSpec("gemma4", ("Gemma4ForCausalLM", "Gemma4ForConditionalGeneration"), "gemma4", "gemma4", layer_types_key="layer_types",
             norm_place="sandwich", qk_norm="head", logit_softcap=True, moe=True, router="gemma4", renormalise=True,
             renormalise_key=None, gguf_renormalise=True, hf_ff_key="moe_intermediate_size", activation="gelu_tanh",
             parallel_dense=True, k_eq_v=True, v_norm=True, attention_scale=1.0, full_rope="proportional",
             embed_scale=True),
)}
ARCHITECTURES = tuple(SPECS)
HF_CLASSES = {c: s for s in SPECS.values() for c in s.hf_classes}  # Hugging Face class -> spec
GGUF_ARCHS = {s.gguf_arch: s for s in SPECS.values() if s.gguf_arch}  # general.architecture -> spec


def spec(architecture: str) -> ArchSpec:
    """The spec of one of our architecture names; unknown ones name the supported list."""
    try:
        return SPECS[architecture]
    except KeyError:
        raise ModelFormatError(f"architecture {architecture!r} is not supported; supported: "
                               f"{', '.join(SPECS)}") from None


def gguf_spec(gguf_arch: str, experts: int) -> ArchSpec | None:
    """The spec of a GGUF general.architecture with `experts` experts (llama with experts is Mixtral)."""
    if experts > 1:
        for s in SPECS.values():
            if s.gguf_experts == gguf_arch:
                return s
    return GGUF_ARCHS.get(gguf_arch)
