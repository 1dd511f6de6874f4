"""What a model source is, before converting it: the conversion wizard's facts and estimates.

`inspect(path)` opens a GGUF file or a Hugging Face folder the way the converter will (refusing
what it would refuse, with its message), plans the conversion for each quantization choice
without writing anything, and returns a `ModelSummary`. No Qt here.
"""
from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from engine import quant
from engine.convert.convert import open_source, plan
from engine.kvcache import model_cache_bytes
from engine.model_dir import ModelConfig

QUANTIZE = ("keep", "f16", "int8", "q4_k_m", "int4")  # the wizard's choices, in its order
QUANTIZE_HELP = {  # one line each: the wizard shows them in a row beside size, memory and quality
    "keep": "as the source stores them (a GGUF imports losslessly)",
    "f16": "16-bit floats: practically lossless",
    "int8": "8 bits per weight: a very small loss",
    "q4_k_m": "llama.cpp's Q4_K_M: ~5 bits, more where it matters",
    "int4": "4 bits per weight: a noticeable loss",
}
CONTEXT = 4096  # the default context_length the memory estimates assume


@dataclass(frozen=True)
class Sizes:
    """Bytes of the converted model for one quantization."""
    dense: int  # embeddings, attention, routers, norms, shared experts: always in memory
    experts: int  # all routed experts of all layers (on disk; the expert cache holds some)
    one_expert: int  # one routed expert of one layer
    kept: dict[str, int] = field(default_factory=dict)  # matrix name -> bytes, stored wider than asked

    @property
    def total(self) -> int:
        return self.dense + self.experts

    @property
    def kept_bytes(self) -> int:
        return sum(self.kept.values())


@dataclass(frozen=True)
class CacheRow:
    experts_per_layer: int
    ram_bytes: int
    note: str


@dataclass(frozen=True)
class ModelSummary:
    source: Path
    kind: str  # "gguf" or "huggingface"
    config: ModelConfig
    source_bytes: int  # size of the source file(s)
    source_types: dict[str, int]  # storage format -> tensor count, in the source
    params_total: int
    params_active: int  # used for one token: everything but the experts not picked
    sizes: dict[str, Sizes]  # quantization choice -> sizes

    @property
    def name(self) -> str:
        return self.source.stem if self.source.is_file() else self.source.name

    @property
    def default_quantize(self) -> str:
        return "keep" if self.kind == "gguf" else "int8"  # what convert() picks when not told

    def kv_bytes(self, context: int = CONTEXT, kind: str = "f16") -> int:
        """Per layer kind: KV, ring, or fixed recurrent state."""
        return model_cache_bytes(self.config, min(context, self.config.max_position_embeddings), kind)

    def memory_table(self, quantize: str, context: int = CONTEXT, kv: str = "f16") -> list[CacheRow]:
        """Expert cache size (experts kept per layer) -> memory the model needs, for `quantize`."""
        c, s = self.config, self.sizes[quantize]
        base = s.dense + self.kv_bytes(context, kv)
        if not c.is_moe:
            return [CacheRow(1, base + s.experts, "dense model: all weights stay in memory")]
        counts = sorted({c.top_k, 2 * c.top_k, c.num_experts // 4, c.num_experts // 2, c.num_experts})
        rows = []
        for n in (n for n in counts if c.top_k <= n <= c.num_experts):
            note = ("the fewest: the others load from disk" if n == c.top_k else
                    "all experts in memory: never waits for the disk" if n == c.num_experts else "")
            rows.append(CacheRow(n, base + n * s.one_expert * (c.num_layers - c.dense_layers), note))
        return rows

    def facts(self, tr: Callable[[str], str] = str) -> list[tuple[str, str]]:
        """(label, value) rows of what the source is; `tr` translates each text before its figures go in
        (the wizard passes Qt's translate: app/ never imports Qt)."""
        c = self.config
        kinds = ", ".join(f"{k.upper()} × {n}" for k, n in sorted(self.source_types.items(), key=lambda kv: -kv[1]))
        rows = [(tr("Source"), f"{tr('GGUF file') if self.kind == 'gguf' else tr('Hugging Face folder')} · "
                               f"{human_bytes(self.source_bytes)} · {kinds}"),
                (tr("Architecture"), c.architecture),
                (tr("Layers"), tr("{n} (hidden size {hidden}, {heads} heads, {kv} KV heads)").format(
                    n=c.num_layers, hidden=c.hidden_size, heads=c.num_heads, kv=c.num_kv_heads))]
        if c.layer_types and len(set(c.layer_types)) > 1:  # the 2026 hybrids: say what each layer keeps
            words = {"attention": tr("full attention"),
                     "sliding_attention": tr("sliding window of {n}").format(n=c.sliding_window),
                     "linear_attention": tr("linear attention (fixed state)"),
                     "short_conv": tr("short conv (fixed state)")}
            counts = {k: c.layer_types.count(k) for k in dict.fromkeys(c.layer_types)}
            rows.append((tr("Layer kinds"), ", ".join(f"{n} {words.get(k, k)}" for k, n in counts.items())))
        if c.is_moe:
            shared = tr(", plus a shared expert of width {width}").format(width=c.shared_expert_intermediate_size) \
                if c.shared_expert_intermediate_size else ""
            rows += [(tr("Experts"), tr("{n} per layer, width {width}").format(n=c.num_experts,
                                                                              width=c.intermediate_size) + shared),
                     (tr("Top-k"), tr("{k} experts picked per token").format(k=c.top_k))]
        else:
            rows.append((tr("Experts"), tr("none: a dense model (one MLP per layer)")))
        rows += [(tr("Parameters"), tr("{total} in all, {active} used per token").format(
                    total=human_count(self.params_total), active=human_count(self.params_active))),
                 (tr("Vocabulary"), tr("{n:,} tokens").format(n=c.vocab_size)),
                 (tr("Context"), tr("up to {n:,} tokens").format(n=c.max_position_embeddings))]
        return rows


def _target_bytes(q: str, shape: tuple[int, ...]) -> int:
    """Bytes of a matrix stored as `q` asks (0 where its rows do not split into that format's blocks, or
    where `q` is a mix with no single target format, as q4_k_m)."""
    if q not in quant.TARGETS:
        return 0
    try:
        return quant.get(quant.TARGETS[q]).nbytes(shape)
    except quant.QuantError:
        return 0


def size_note(summary: ModelSummary, quantize: str) -> str:
    """Why a size surprises: matrices the converter keeps wider than asked (int4's token embeddings)."""
    s = summary.sizes[quantize]
    if not s.kept or not s.total:
        return ""
    names = sorted(s.kept, key=lambda n: -s.kept[n])
    friendly = {"token_embd.weight": "the token embeddings", "output.weight": "the output head"}
    shown = ", ".join(f"{friendly[n]} ({n})" if n in friendly else n for n in names[:2]) \
        + (f" and {len(names) - 2} more" if len(names) > 2 else "")
    return (f"{human_bytes(s.kept_bytes)} of it ({s.kept_bytes / s.total:.0%}) stays at higher precision for "
            f"quality: {shown}")


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1000 or unit == "GB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"


def human_count(n: int) -> str:
    for div, unit in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= div:
            return f"{n / div:.1f}{unit}"
    return str(n)


def _source_bytes(path: Path) -> int:
    return path.stat().st_size if path.is_file() else sum(p.stat().st_size for p in path.glob("*.safetensors"))


def inspect(path: str | Path, progress: Callable[[float], None] | None = None) -> ModelSummary:
    """Open `path` as the converter would and plan every quantization; nothing is written. A
    GGUF's header alone is read (`progress` gets the fraction read). Raises the converter's errors."""
    path = Path(path).expanduser()
    src = open_source(path, progress)
    try:
        cfg = src.config
        if cfg.rope_scaling and cfg.rope_scaling.get("type") == "llama3":
            cfg = replace(cfg, rope_freq_factors=True)  # as convert() does
        sizes: dict[str, Sizes] = {}
        params_total = params_routed = 0
        for q in QUANTIZE:
            dense = experts = 0
            kept: dict[str, int] = {}
            items = plan(src, cfg, q, split_experts=True)
            for it in items:
                n = it.qtype.nbytes(it.source.shape)
                routed = cfg.is_moe and "_expert_" in it.file
                experts += n if routed else 0
                dense += 0 if routed else n
                if q in quant.FAMILY and len(it.source.shape) > 1 and it.qtype.name not in quant.FAMILY[q] \
                        and n > _target_bytes(q, it.source.shape):
                    kept[it.name] = n  # e.g. int4's token embeddings kept 8-bit, a row too short for blocks
            moe_layers = cfg.num_layers - cfg.dense_layers  # (leading dense layers have no experts)
            sizes[q] = Sizes(dense, experts, experts // max(1, moe_layers * cfg.num_experts) if cfg.is_moe else 0,
                             kept)
        for it in items:
            count = math.prod(it.source.shape)
            params_total += count
            params_routed += count if cfg.is_moe and "_expert_" in it.file else 0
        types = dict(Counter(t.qtype.name for t in src.tensors.values()))
        active = params_total - params_routed + (params_routed * cfg.top_k // cfg.num_experts if cfg.is_moe else 0)
        return ModelSummary(path, src.kind, cfg, _source_bytes(path), types, params_total, active, sizes)
    finally:
        src.close()


def default_target(models: Path, summary: ModelSummary, quantize: str) -> Path:
    """Where the wizard proposes to put the converted model: named after source and choice, unique."""
    from app.model_library import library_name
    base = summary.name if quantize == "keep" else f"{summary.name}-{quantize}"
    return models / library_name(models, summary.source, base)
