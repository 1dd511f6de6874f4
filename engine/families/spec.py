"""The shared spec of an architecture family: the vocabulary of parts (`ArchSpec`) and the facts
the converters read (`Family`). Each family declares both once, in its own file beside this one
(engine/families/<family>.py); engine.arch gathers them.

A spec says which *kinds* of parts a family has (layer kinds, router function, shared expert,
norms, biases, rope variants); the numbers of one model (sizes, eps, theta, top-k, window,
the rope scaling factor) are its `ModelConfig`. `spec.check(cfg)` refuses, naming the
architecture and the feature, whatever the forward pass does not implement yet, before any
weight is read.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Literal

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
# The families (one file each in engine/families, its Hugging Face tensor names among its facts).
FamilyName = Literal["dense", "mixtral", "qwen_moe", "olmoe", "lfm2", "gpt_oss", "qwen3_5", "gemma4"]

FEATURES = ("attention", "sliding_attention", "linear_attention", "short_conv", "router:softmax_topk",
            "router:topk_softmax", "router:sigmoid_bias", "router:gemma4", "shared_expert:plain", "shared_expert:sigmoid_gate",
            "qk_norm:head", "qk_norm:full", "qkv_bias", "o_bias", "expert_bias", "attention_sinks",
            "dense_leading_layers", "swiglu_clamp", "logit_softcap", "norm:offset", "norm:sandwich",
            "rope:default", "rope:linear", "rope:llama3", "rope:yarn", "partial_rotary", "clip_qkv", "attention_gate",
            "gelu", "parallel_dense", "k_eq_v", "v_norm", "embed_scale", "rope:proportional", "per_layer_inputs",
            "kv_sharing")
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
                         "v_norm", "embed_scale", "rope:proportional", "per_layer_inputs", "kv_sharing"})
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
    family: FamilyName  # the file in engine/families that declares it
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
                                    ("gelu", self.activation == "gelu_tanh"), ("parallel_dense", self.parallel_dense and cfg.is_moe),
                                    ("rope:proportional", self.full_rope == "proportional"),
                                    ("dense_leading_layers", self.dense_leading_layers and cfg.dense_layers > 0),
                                    ("norm:offset", self.norm_weight == "offset"),
                                    ("norm:sandwich", self.norm_place == "sandwich"),
                                    ("per_layer_inputs", cfg.per_layer_input_size > 0),
                                    ("kv_sharing", cfg.kv_shared_layers > 0)) if on}
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


# internal name (GGUF's vocabulary, `{L}` a layer, `{E}` an expert) -> source name(s), the first
# present in the checkpoint used; the grammar of source names is engine.convert.names'.
Rows = tuple[tuple[str, tuple[str, ...]], ...]
HF_LAYER = "model.layers.{L}"
# transformers 5's fused experts (saved with save_original_format=False): gate rows, then up rows
HF_FUSED = (f"{HF_LAYER}.mlp.experts.gate_up_proj[{{E}}]#0/2", f"{HF_LAYER}.mlp.experts.gate_up_proj[{{E}}]#1/2",
            f"{HF_LAYER}.mlp.experts.down_proj[{{E}}]")


@dataclass(frozen=True)
class Family:
    """What the converters know of one family, declared in its file: its architectures' spec rows,
    its Hugging Face tensor names (GGUF's are one vocabulary for all: engine.convert.names), and
    the hyper-parameters it reads beyond the shared ones, as hooks returning ModelConfig fields."""
    name: str  # the `family` of each of its specs
    specs: tuple[ArchSpec, ...]
    hf_tensors: Rows  # the first row matching an internal name wins
    # (config.json as an engine.convert.hf.HFConfig, the layer kinds) -> fields
    hf_config: Callable[[Any, tuple[str, ...] | None], dict] | None = None
    # (the shared fields, an engine.convert.gguf_file.GGUFModel) -> fields replacing or adding to them
    gguf_config: Callable[[dict, Any], dict] | None = None
    gguf_limits: dict[str, tuple[int, int]] = field(default_factory=dict)  # bounds of the integer keys it reads
