"""Hugging Face checkpoints: a folder of safetensors (one file or sharded) with config.json.

The safetensors header is parsed by engine.convert.safetensors_file (the one reader). Weights
are never unpickled: `.bin`/`.pt` checkpoints are refused.

`*ForConditionalGeneration` checkpoints (Qwen3.5/3.6-MoE, Gemma 4) hold the text model under
`model.language_model.` (its config under `text_config`), read as the `*ForCausalLM` layout; their
vision/audio towers and multi-token-prediction head are skipped by name (WRAPPER_SKIPPED) and logged.

gpt-oss ships its experts as MXFP4: `*_blocks` (uint8 [E, rows, groups, 16], element 2i in the low
nibble) and `*_scales` (uint8 [E, rows, groups], E8M0), imported losslessly as ggml's block_mxfp4
(the scale byte, then byte j holding elements j and j + 16); gate_up's interleaved rows (gate even,
up odd) become `gate_proj.mxfp4` and `up_proj.mxfp4`.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np

from engine import quant
from engine.arch import HF_CLASSES, family
from engine.convert.names import HF_IGNORED
from engine.convert.safetensors_file import read_safetensors_header
from engine.convert.source import FileReader, SourceTensor
from engine.errors import (ConfigError, SourceFormatError, UnsupportedArchitectureError)
from engine.model_dir import ModelConfig

log = logging.getLogger("colibri.convert")

_DTYPES = {"F32": "f32", "F16": "f16", "BF16": "bf16"}
TEXT_PREFIX = "model.language_model."  # a *ForConditionalGeneration checkpoint's text model
# what a wrapped checkpoint holds beside its text model: prefix -> what it is (skipped, logged)
WRAPPER_SKIPPED = {"model.visual.": "vision tower", "model.vision_tower.": "vision tower",
                   "model.embed_vision.": "vision embedding", "model.multi_modal_projector.": "vision projector",
                   "model.audio_tower.": "audio tower", "model.embed_audio.": "audio embedding",
                   "mtp.": "multi-token-prediction head (unused)"}


class HFCheckpoint:
    """The safetensors of a Hugging Face folder as a catalog of lazily read SourceTensors."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.readers: list[FileReader] = []
        self.tensors: dict[str, SourceTensor] = {}
        self.skipped: dict[str, int] = {}  # WRAPPER_SKIPPED's description -> tensors skipped
        self._mx: dict[str, tuple[tuple[int, ...], FileReader, int]] = {}  # MXFP4 parts: shape, file, offset
        index = folder / "model.safetensors.index.json"
        if index.is_file():
            try:
                weight_map = json.loads(index.read_text())["weight_map"]
                shards = sorted(set(weight_map.values()))
            except (ValueError, KeyError, TypeError, AttributeError) as e:
                raise SourceFormatError(f"{index}: not a valid safetensors index: {e!r}") from None
            for shard in shards:  # a name, not a path: HF cache snapshots link their shards to ../blobs, fine
                if not isinstance(shard, str) or Path(shard).is_absolute() or ".." in Path(shard).parts:
                    raise SourceFormatError(f"{index}: shard {shard!r} is outside the model folder")
        else:
            weight_map, shards = None, sorted(p.name for p in folder.glob("*.safetensors"))
        if not shards:
            pickles = [p.name for p in folder.glob("*.bin")] + [p.name for p in folder.glob("*.pt")]
            hint = f" ({', '.join(pickles)} are pickle files, which Colibri never loads)" if pickles else ""
            raise SourceFormatError(f"{folder}: no .safetensors weights found{hint}")
        for shard in shards:
            p = folder / shard
            if not p.is_file():
                raise SourceFormatError(f"{p}: shard listed in model.safetensors.index.json is missing")
            self._add_shard(p)
        if weight_map is not None:
            for name, shard in weight_map.items():
                if _text_name(name) not in self.tensors and _text_name(name) not in self._mx and _skipped(name) is None:
                    raise SourceFormatError(f"{folder / shard}: tensor {name!r} listed in the index is not in it")
        self._pair_mxfp4()
        if self.skipped:
            log.info("%s: text model only; skipped %s", folder.name,
                     ", ".join(f"{n} {what} tensor(s)" for what, n in self.skipped.items()))

    def _add_shard(self, path: Path) -> None:
        entries, data_start, _ = read_safetensors_header(path)
        reader = FileReader(path)
        self.readers.append(reader)
        for stored, e in entries.items():
            what = _skipped(stored)
            if what is not None:
                self.skipped[what] = self.skipped.get(what, 0) + 1
                continue
            name = _text_name(stored)
            if name in self.tensors or name in self._mx:
                raise SourceFormatError(f"{path}: tensor {name!r} appears in two shards")
            if e["dtype"] == "U8" and name.endswith(("_blocks", "_scales")):  # MXFP4 (gpt-oss)
                self._mx[name] = (tuple(int(d) for d in e["shape"]), reader, data_start + e["data_offsets"][0])
                continue
            if e["dtype"] not in _DTYPES:
                raise SourceFormatError(f"{path}: tensor {name!r} has dtype {e['dtype']}; Colibri converts "
                                        f"F32, F16 and BF16 checkpoints")
            qtype = quant.get(_DTYPES[e["dtype"]])
            shape = tuple(int(d) for d in e["shape"]) or (1,)
            row_bytes = qtype.row_bytes(shape[-1])
            self.tensors[name] = SourceTensor(
                name, shape, qtype, reader.rows(stored, data_start + e["data_offsets"][0], row_bytes, qtype.storage))

    def _pair_mxfp4(self) -> None:
        """Each X_blocks with its X_scales as one mxfp4 tensor X.mxfp4 [E, rows, groups * 32]."""
        for name in sorted(n for n in self._mx if n.endswith("_blocks")):
            base = name[:-len("_blocks")]
            if base + "_scales" not in self._mx:
                raise SourceFormatError(f"{self.folder}: MXFP4 tensor {name!r} has no {base + '_scales'!r}")
            (bshape, breader, boff), (sshape, sreader, soff) = self._mx[name], self._mx[base + "_scales"]
            if len(bshape) < 3 or bshape[-1] != 16 or tuple(sshape) != bshape[:-1]:
                raise SourceFormatError(f"{self.folder}: MXFP4 {name!r} {list(bshape)} and its scales "
                                        f"{list(sshape)} are not [..., groups, 16] and [..., groups]")
            t = _mxfp4(base + ".mxfp4", bshape, breader.rows(name, boff, bshape[-2] * 16, np.dtype(np.uint8)),
                       sreader.rows(base + "_scales", soff, bshape[-2], np.dtype(np.uint8)))
            if base.endswith("gate_up_proj"):  # rows interleaved: gate even, up odd
                stem = base[:-len("gate_up_proj")]
                self.tensors[stem + "gate_proj.mxfp4"] = _every_other_row(t, 0, stem + "gate_proj.mxfp4")
                self.tensors[stem + "up_proj.mxfp4"] = _every_other_row(t, 1, stem + "up_proj.mxfp4")
            else:
                self.tensors[base + ".mxfp4"] = t
        lone = [n for n in self._mx if n.endswith("_scales") and n[:-len("_scales")] + "_blocks" not in self._mx]
        if lone:
            raise SourceFormatError(f"{self.folder}: MXFP4 scales without blocks: {', '.join(lone[:4])}")

    def ignorable(self, name: str) -> bool:
        return any(p.fullmatch(name) for p in HF_IGNORED)

    def close(self) -> None:
        for r in self.readers:
            r.close()


def _mxfp4(name: str, bshape: tuple[int, ...], blocks, scales) -> SourceTensor:
    """HF MXFP4 parts as rows of ggml block_mxfp4 (17 bytes per 32 values), repacked on read."""
    groups = bshape[-2]

    def read(a: int, b: int) -> np.ndarray:
        p, s = blocks(a, b).reshape(b - a, groups, 16), scales(a, b).reshape(b - a, groups)
        vals = np.stack([p & 0x0F, p >> 4], axis=-1).reshape(b - a, groups, 32)  # element order
        qs = vals[..., :16] | (vals[..., 16:] << 4)  # byte j: element j low, element j + 16 high
        return np.concatenate([s[..., None], qs], axis=-1).reshape(-1)
    return SourceTensor(name, bshape[:-2] + (groups * 32,), quant.get("mxfp4"), read)


def _every_other_row(t: SourceTensor, part: int, name: str) -> SourceTensor:
    """Rows part, part + 2, ... of t [E, 2F, C] as [E, F, C] (flat row r is source row 2r + part)."""
    def read(a: int, b: int) -> np.ndarray:
        if a == b:
            return np.empty(0, np.uint8)
        return t.read(2 * a + part, 2 * (b - 1) + part + 1)[::2].reshape(-1)
    return SourceTensor(name, t.shape[:-2] + (t.shape[-2] // 2, t.shape[-1]), t.qtype, read)


def _text_name(name: str) -> str:
    """A wrapped checkpoint's text-model tensor under its *ForCausalLM name."""
    return "model." + name[len(TEXT_PREFIX):] if name.startswith(TEXT_PREFIX) else name


def _skipped(name: str) -> str | None:
    return next((what for p, what in WRAPPER_SKIPPED.items() if name.startswith(p)), None)


# --- config.json -----------------------------------------------------------------------------

def _need(cfg: dict, key: str, path: Path):
    if cfg.get(key) is None:
        raise ConfigError(f"{path}: config.json has no {key!r}")
    return cfg[key]


def _rope(cfg: dict, path: Path) -> tuple[float, dict | None]:
    params = cfg.get("rope_parameters") or {}
    scaling = cfg.get("rope_scaling") or (params if params.get("rope_type", "default") != "default" else None)
    theta = cfg.get("rope_theta", params.get("rope_theta", 10000.0))
    if scaling:
        kind = scaling.get("rope_type", scaling.get("type"))
        if kind not in ("default", "linear", "llama3", "yarn"):
            raise ConfigError(f"{path}: rope scaling type {kind!r} is not supported "
                              f"(supported: linear, llama3, yarn)")
        scaling = None if kind == "default" else {"type": kind, **{k: v for k, v in scaling.items()
                                                                   if k not in ("type", "rope_type", "rope_theta")}}
    for key, v in [("rope_theta", theta)] + [(f"rope_scaling.{k}", v) for k, v in (scaling or {}).items()
                                              if k.endswith(("factor", "position_embeddings")) or k.startswith("beta")]:
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < 1e30):
            raise ConfigError(f"{path}: config.json {key} = {v!r} is not a positive number")
    if scaling and scaling["type"] == "llama3" and \
            not scaling.get("low_freq_factor", 1.0) < scaling.get("high_freq_factor", 4.0):
        raise ConfigError(f"{path}: config.json rope_scaling low_freq_factor must be below high_freq_factor")
    return float(theta), scaling


# Bounds of the integer hyper-parameters: far beyond any real model, far below what would make
# an allocation fail or a loop over layers run for hours.
HF_LIMITS = {"num_hidden_layers": (1, 4096), "hidden_size": (1, 1 << 20), "num_attention_heads": (1, 4096),
             "num_key_value_heads": (1, 4096), "head_dim": (1, 1 << 16), "intermediate_size": (1, 1 << 22),
             "moe_intermediate_size": (1, 1 << 22), "vocab_size": (1, 1 << 24), "num_experts": (1, 1 << 16),
             "num_local_experts": (1, 1 << 16), "num_experts_per_tok": (1, 1 << 16),
             "max_position_embeddings": (1, 1 << 24)}


class HFConfig(dict):
    """config.json's keys, read by the shared fields and a family's hf_config; errors name file and key."""

    def __init__(self, cfg: dict, path: Path):
        super().__init__(cfg)
        self.path = path

    def need(self, key: str):
        return _need(self, key, self.path)

    def rope(self, cfg: dict) -> tuple[float, dict | None]:
        return _rope(cfg, self.path)

    def error(self, what: str) -> ConfigError:
        return ConfigError(f"{self.path}: config.json {what}")


def config_from_hf(folder: Path) -> ModelConfig:
    """The model's shape from config.json: the shared keys here, the rest from its family's hf_config."""
    path = folder / "config.json"
    if not path.is_file():
        raise SourceFormatError(f"{folder}: no config.json (is this a Hugging Face model folder?)")
    try:
        cfg = json.loads(path.read_text())
    except ValueError as e:
        raise ConfigError(f"{path}: not valid JSON: {e}") from None
    classes = cfg.get("architectures") or []
    sp = next((HF_CLASSES[c] for c in classes if c in HF_CLASSES), None)
    if sp is None:
        raise UnsupportedArchitectureError(
            f"{path}: architecture {classes or cfg.get('model_type')!r} is not supported; supported: "
            f"{', '.join(HF_CLASSES)}")
    if isinstance(cfg.get("text_config"), dict):  # *ForConditionalGeneration: the text model's config
        cfg = {**{k: v for k, v in cfg.items() if not k.endswith("_config")}, **cfg["text_config"], "architectures": classes}
    cfg = HFConfig(cfg, path)
    for key, (lo, hi) in HF_LIMITS.items():  # before anything is sized from them
        v = cfg.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi):
            raise ConfigError(f"{path}: config.json {key!r} = {v!r} is out of range (expected an integer from "
                              f"{lo} to {hi})")
    heads = int(_need(cfg, "num_attention_heads", path))
    hidden = int(_need(cfg, "hidden_size", path))
    moe = sp.moe and cfg.get("enable_moe_block", True) is not False  # (Gemma 4's dense models say so)
    if cfg.get("mlp_only_layers") or cfg.get("decoder_sparse_step", 1) != 1:
        raise ConfigError(f"{path}: models that mix dense and MoE layers (mlp_only_layers / "
                          f"decoder_sparse_step) are not supported yet")
    theta, scaling = _rope(cfg, path)
    experts = cfg.get("num_experts") or cfg.get("num_local_experts")  # names vary by version
    if moe and not experts:
        raise ConfigError(f"{path}: config.json has no 'num_experts' / 'num_local_experts'")
    kinds = _layer_kinds(cfg, sp, path)
    fam = family(sp.name)
    return ModelConfig(**dict(
        architecture=sp.name,
        vocab_size=int(_need(cfg, "vocab_size", path)),
        hidden_size=hidden,
        num_layers=int(_need(cfg, "num_hidden_layers", path)),
        num_heads=heads,
        num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
        head_dim=int(cfg.get("head_dim") or hidden // heads),
        intermediate_size=int(_need(cfg, sp.hf_ff_key if moe else "intermediate_size", path)),
        num_experts=int(experts) if moe else 1,
        top_k=int(cfg.get("num_experts_per_tok") or _need(cfg, "top_k_experts", path)) if moe else 1,
        norm_topk_prob=bool(cfg.get(sp.renormalise_key, sp.renormalise) if sp.renormalise_key else sp.renormalise),
        shared_expert_intermediate_size=int(cfg.get("shared_expert_intermediate_size") or 0)
        if sp.shared_expert != "none" else 0,
        rms_norm_eps=float(cfg.get("rms_norm_eps", cfg.get("norm_eps", 1e-6))),
        rope_theta=theta,
        rope_scaling=scaling,
        max_position_embeddings=int(cfg.get("max_position_embeddings", 4096)),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        attention_bias=bool(cfg.get(sp.qkv_bias_key, sp.qkv_bias) if sp.qkv_bias_key else sp.qkv_bias),
        sliding_window=int(cfg["sliding_window"]) if cfg.get("sliding_window") and
        cfg.get("use_sliding_window", True) else None,
        qk_norm=sp.qk_norm,
        clip_qkv=cfg.get("clip_qkv"),
        layer_types=kinds,
        partial_rotary_factor=float((cfg.get("rope_parameters") or {}).get("partial_rotary_factor",
                                                                         cfg.get("partial_rotary_factor", 1.0)))
        if sp.partial_rotary else 1.0,
        routed_scaling_factor=float(cfg.get("routed_scaling_factor") or 1.0),
    ) | (fam.hf_config(cfg, kinds) if fam.hf_config else {}))


# Hugging Face layer_types words -> engine.arch layer kinds
_HF_KINDS = {"full_attention": "attention", "sliding_attention": "sliding_attention",
             "linear_attention": "linear_attention", "conv": "short_conv"}


def _layer_kinds(cfg: dict, sp, path: Path) -> tuple[str, ...] | None:
    """Each layer's kind where not all layers are attention (None: spec.layer_types derives them)."""
    if sp.layer_types_key is None:
        return None
    types = cfg.get(sp.layer_types_key)
    if not isinstance(types, list) or len(types) != cfg.get("num_hidden_layers"):
        raise ConfigError(f"{path}: config.json layer_types must list one kind per layer")
    bad = sorted({t for t in types if _HF_KINDS.get(t) not in sp.layer_kinds})
    if bad:
        raise ConfigError(f"{path}: config.json layer_types {bad} are not layer kinds of {sp.name} "
                          f"({', '.join(sp.layer_kinds)})")
    return tuple(_HF_KINDS[t] for t in types)
