"""Convert a GGUF file or a Hugging Face folder into a Colibri model directory.

Streaming: tensors are read, converted and written a slice of rows at a time, so memory stays flat
whatever the model size; expert matrices are written repacked for the CPU kernels where their
format has a repacked layout. Safety: everything is written into a hidden folder beside the
destination and renamed into place only when complete; a failure, a cancel or Ctrl-C removes it,
and a destination that exists is never touched without `force`.
"""
from __future__ import annotations

import ctypes
import errno
import json
import logging
import math
import os
import shutil
import threading
import time
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Iterable

import numpy as np

from engine import quant
from engine.arch import family
from engine.convert import hf as hf_src
from engine.convert import kquant_export
from engine.convert.gguf_file import GGUFModel
from engine.convert.names import gguf_names, hf_names, split_slice, split_transforms
from engine.convert.source import SourceTensor
from engine.convert.tokenizer_import import TokenizerBundle, from_hf_folder
from engine.errors import (ConfigError, ConversionCancelled, ConversionError, DiskSpaceError,
                           MissingTensorError, ModelFormatError, OutputExistsError, SourceFormatError,
                           UnexpectedTensorError)
from engine.gguf_index import INDEX_FILE, write_index
from engine.model_dir import (CONFIG_FILE, TEMPLATE_FILE, TOKENIZER_FILE, Manifest, ModelConfig,
                              config_document, expected_tensors, open_model_dir)
from engine.tensorfile import TensorFileWriter, TensorPlan, align_up

log = logging.getLogger("colibri.convert")

QUANTIZE_CHOICES = ("f32", "f16", "int8", "int4", "keep", *kquant_export.PRESETS)  # + llama.cpp's K presets
CHUNK_BYTES = 16 << 20  # float32 bytes converted per slice of a large tensor
_PARTIAL = ".partial-"
_OLD = ".old-"  # a replaced model set aside for a moment (only where an atomic swap is impossible)


@dataclass(frozen=True)
class Progress:
    done_bytes: int  # (for stage "calibration": layers of the calibration forward done, of total_bytes layers)
    total_bytes: int
    tensor: str
    file: str
    stage: str = "write"  # "calibration" while --calibration_data's text runs through the model

    @property
    def fraction(self) -> float:
        return self.done_bytes / self.total_bytes if self.total_bytes else 1.0


@dataclass(frozen=True)
class ConvertResult:
    path: Path
    config: ModelConfig
    bytes_written: int
    seconds: float
    tensor_types: dict[str, int]  # format name -> tensor count
    calibration: dict | None = None  # calibrate.Calibration.summary() when --calibration_data was given


@dataclass
class _Source:
    kind: str  # "gguf" or "huggingface"
    config: ModelConfig
    tokenizer: TokenizerBundle
    tensors: dict[str, SourceTensor]  # by source name
    resolve: Callable[[str, ModelConfig, set[str]], SourceTensor | None]  # internal name -> tensor
    ignorable: Callable[[str], bool]
    close: Callable[[], None]
    generation: dict | None = None  # the model's own sampling defaults (see generation_defaults)
    header_bytes: int = 0  # a GGUF's header (metadata and tensor table) before its data


# the model's recommended sampling, by our parameter name: Hugging Face generation_config.json keys and
# llama.cpp's general.sampling.* GGUF keys (gguf-py constants Keys.General.SAMPLING_*)
HF_SAMPLING = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p",
               "repetition_penalty": "repeat_penalty"}
GGUF_SAMPLING = {"general.sampling.temp": "temperature", "general.sampling.top_p": "top_p",
                 "general.sampling.top_k": "top_k", "general.sampling.min_p": "min_p",
                 "general.sampling.penalty_repeat": "repeat_penalty"}


def generation_defaults(values: dict, names: dict[str, str], where: str) -> dict:
    """The sampling a model recommends, checked against the parameter table (a refused value: logged)."""
    from engine import params as P
    out = {}
    for key, name in names.items():
        if values.get(key) is None:
            continue
        try:
            out[name] = P.check(name, values[key])
        except ValueError as e:
            log.warning("%s: the model's %s is not used: %s", where, key, e)
    if values.get("do_sample") is False and "temperature" not in out:
        out["temperature"] = 0.0  # transformers decodes greedily unless do_sample
    return out


def _hf_generation(folder: Path) -> dict:
    gen = folder / "generation_config.json"
    try:
        doc = json.loads(gen.read_text(encoding="utf-8")) if gen.is_file() else {}
    except (OSError, ValueError) as e:
        log.warning("%s: not read (%s); no sampling defaults from it", gen, e)
        return {}
    return generation_defaults(doc, HF_SAMPLING, str(gen)) if isinstance(doc, dict) else {}


# --- opening sources -------------------------------------------------------------------------

def _lookup(tensors: dict[str, SourceTensor], candidates: Iterable[str],
            consumed: set[str]) -> SourceTensor | None:
    for cand in candidates:
        sliced, cols, transpose, fn = split_transforms(cand)
        base, index, part = split_slice(sliced)
        if base in tensors:
            consumed.add(base)
            t = tensors[base] if index is None else tensors[base].expert(index)
            t = t if part is None else t.row_part(*part)
            t = t if cols is None else t.columns(*cols)
            t = t.transposed() if transpose else t
            return t if fn is None else t.mapped(fn)
    return None


def open_source(path: Path, progress: Callable[[float], None] | None = None) -> _Source:
    path = Path(path)
    if path.is_dir():
        cfg = hf_src.config_from_hf(path)
        ckpt = hf_src.HFCheckpoint(path)
        fam = family(cfg.architecture)
        try:
            tok = from_hf_folder(path)
        except BaseException:
            ckpt.close()
            raise
        src = _Source("huggingface", cfg, tok, ckpt.tensors, None, ckpt.ignorable, ckpt.close,  # type: ignore[arg-type]
                      _hf_generation(path))
        src.resolve = lambda name, c, consumed: _lookup(ckpt.tensors, hf_names(name, fam), consumed)
        return src
    if path.is_file():
        g = GGUFModel(path, progress)  # progress: the fraction of the header read (the wizard's bar)
        try:
            cfg, tok = g.config(), g.tokenizer()
        except BaseException:
            g.close()
            raise
        dense = cfg.num_experts == 1

        def resolve(name: str, c: ModelConfig, consumed: set[str]) -> SourceTensor | None:
            t = _lookup(g.tensors, gguf_names(name, dense), consumed)
            if t is not None and "[" not in t.name and t.name in g.tensors:
                return g.source_tensor(t.name, c)
            return t
        # (Gemma 4's rope_freqs only mark its proportional rope, which the config now describes)
        ignorable = lambda n: n == "rope_freqs.weight" and not cfg.rope_freq_factors  # noqa: E731
        return _Source("gguf", cfg, tok, g.tensors, resolve, ignorable, g.close,
                       generation_defaults(g.fields, GGUF_SAMPLING, str(path)), g.header_bytes)
    raise SourceFormatError(f"{path}: no such file or folder (give a .gguf file or a Hugging Face folder)")


# --- planning --------------------------------------------------------------------------------

def _llama3_factors(cfg: ModelConfig) -> np.ndarray:
    """Per-frequency divisors equivalent to Hugging Face's llama3 rope scaling."""
    s = cfg.rope_scaling or {}
    factor, lo, hi = float(s["factor"]), float(s.get("low_freq_factor", 1.0)), float(s.get("high_freq_factor", 4.0))
    old = float(s.get("original_max_position_embeddings", 8192))
    freqs = 1.0 / cfg.rope_theta ** (np.arange(0, cfg.head_dim, 2, dtype=np.float64) / cfg.head_dim)
    wavelen = 2 * math.pi / freqs
    smooth = np.clip((old / wavelen - lo) / (hi - lo), 0.0, 1.0)
    out = np.where(wavelen > old / lo, factor, np.where(wavelen < old / hi, 1.0, 1.0 / ((1 - smooth) / factor + smooth)))
    return out.astype(np.float32)


def _memory_tensor(name: str, values: np.ndarray) -> SourceTensor:
    return SourceTensor(name, values.shape, quant.get("f32"), lambda a, b: values)


def choose_type(name: str, src: quant.QuantType, shape: tuple[int, ...], target: str,
                cfg: ModelConfig | None = None) -> quant.QuantType:
    """A tensor's stored format: vectors and routers exact, quantized families kept (or a K preset's)."""
    floats = {"f32", "f16", "bf16"}
    if len(shape) == 1 or name.endswith(("ffn_gate_inp.weight", "conv.weight", "conv1d.weight")):  # (convs' taps)
        return quant.get("f32") if src.name in floats else src
    if target == "keep":
        return src
    if target in kquant_export.PRESETS:
        return quant.get(kquant_export.preset_type(name, shape, target, cfg.num_layers if cfg else 1,
                                                   cfg.num_experts if cfg else 1,
                                                   bool(cfg and cfg.tie_word_embeddings)))
    if target == "int4" and name in ("token_embd.weight", "output.weight"):
        target = "int8"  # the embedding and output matrices are the most sensitive: 8 bits
    if src.name in quant.FAMILY[target]:
        return src
    want = quant.get(quant.TARGETS[target])
    if shape[-1] % want.block_size:
        log.warning("%s: row length %d is not a multiple of %d; stored as f16", name, shape[-1], want.block_size)
        return quant.get("f16")
    return want


@dataclass(frozen=True)
class _Item:
    file: str
    name: str
    source: SourceTensor
    qtype: quant.QuantType


def plan(src: _Source, cfg: ModelConfig, target: str, split_experts: bool) -> list[_Item]:
    consumed: set[str] = set()
    extra: dict[str, SourceTensor] = {}
    if cfg.rope_scaling and cfg.rope_scaling.get("type") == "llama3":
        extra["rope_freqs.weight"] = _memory_tensor("rope_freqs (computed from llama3 rope_scaling)",
                                                    _llama3_factors(cfg))
    items = []
    layout = expected_tensors(cfg, split_experts)
    for rel, tensors in layout.items():
        for name, shape in tensors.items():
            t = extra.get(name) or src.resolve(name, cfg, consumed)
            if t is None:
                raise MissingTensorError(f"source has no tensor for {name!r} (the {cfg.architecture} config "
                                         f"requires it); looked for: {', '.join(_candidates(src, name, cfg))}")
            if t.shape != shape:
                if t.shape[-1] == shape[-1] and math.prod(t.shape) == math.prod(shape):
                    t = t.reshaped(shape)
                else:
                    raise ConfigError(f"tensor {t.name!r} has shape {list(t.shape)} but the config implies "
                                      f"{list(shape)} for {name!r}")
            items.append(_Item(rel, name, t, choose_type(name, t.qtype, shape, target, cfg)))
    if cfg.tie_word_embeddings:
        src.resolve("output.weight", cfg, consumed)  # some checkpoints store the tied copy too
    for L in range(cfg.num_layers - cfg.kv_shared_layers, cfg.num_layers):  # (Gemma 4 E2B/E4B: unused, as in
        for n in ("attn_k.weight", "attn_v.weight", "attn_k_norm.weight"):  # transformers, where kept)
            src.resolve(f"blk.{L}.{n}", cfg, consumed)
    left = sorted(n for n in src.tensors if n not in consumed and not src.ignorable(n))
    if left:
        more = f" and {len(left) - 8} more" if len(left) > 8 else ""
        raise UnexpectedTensorError(f"source tensors not used by the {cfg.architecture} layout: "
                                    f"{', '.join(left[:8])}{more} (a different architecture or a config "
                                    f"that does not match the weights?)")
    return items


def _candidates(src: _Source, name: str, cfg: ModelConfig) -> list[str]:
    if src.kind == "gguf":
        return gguf_names(name, cfg.num_experts == 1)
    return hf_names(name, family(cfg.architecture)) or [name]


# --- writing ---------------------------------------------------------------------------------

def _write_tensor(w: TensorFileWriter, item: _Item, check: Callable[[], None],
                  imatrix: np.ndarray | None = None, own: bool = False) -> None:
    t, out = item.source, item.qtype.plain  # (the format; item.qtype may be its x8 layout)
    if len(t.shape) == 1:
        data = t.read()
        w.write(item.name, data if t.qtype is out else quant.quantize(quant.dequantize(data, t.qtype), out))
        return
    step = max(1, CHUNK_BYTES // (4 * t.shape[-1]))
    if item.qtype.base is not None:
        from engine.kernels import cpu
        step = max(8, step // 8 * 8)  # whole 8-row groups a slice
    for start in range(0, t.rows, step):
        check()
        data = t.read(start, min(t.rows, start + step))
        if t.qtype is not out:  # llama.cpp's reference rounding (importance-weighted given an imatrix)
            x = quant.dequantize(data, t.qtype)
            data = kquant_export.best_per_block(x, out.name, imatrix) if own and imatrix is not None \
                else kquant_export.quantize(x, out, imatrix)
        if item.qtype.base is not None:  # the bytes the CPU kernels read, as cpu.repack_x8 leaves them at load
            data = np.array(data, np.uint8).reshape(-1, data.shape[-1])
            cpu.repack_x8(data, out.type_id)
        w.write(item.name, data)


def _dead(p: Path) -> bool:
    pid = p.name.rsplit("-", 1)[-1]
    return pid.isdigit() and not Path(f"/proc/{pid}").exists()


def _clean_stale_partials(dst: Path) -> None:
    """Remove hidden partial folders of earlier runs that were killed outright."""
    for p in dst.parent.glob(f".{dst.name}{_PARTIAL}*"):
        if _dead(p):
            shutil.rmtree(p, ignore_errors=True)
    recover_replaced(dst.parent)


def recover_replaced(folder: str | Path) -> list[Path]:
    """Put back models a replacement killed half-way had set aside (`.NAME.old-PID`) where the model is
    missing or damaged, else remove the leftover. Returns the models put back."""
    back = []
    for old in Path(folder).glob(f".*{_OLD}*"):
        if not old.is_dir() or not _dead(old):
            continue
        dst = old.parent / old.name[1:].rsplit(_OLD, 1)[0]
        try:
            open_model_dir(dst)
            whole = True
        except (ModelFormatError, OSError):
            whole = False
        if whole:
            shutil.rmtree(old, ignore_errors=True)
            continue
        if dst.exists():
            shutil.rmtree(dst)
        os.rename(old, dst)
        log.warning("%s: a replacement of this model was interrupted; the previous model was put back", dst)
        back.append(dst)
    return back


def _check_destination(dst: Path, force: bool) -> None:
    if dst.exists() and not dst.is_dir():
        raise OutputExistsError(f"{dst}: exists and is not a folder")
    if dst.is_dir() and any(dst.iterdir()) and not force:
        raise OutputExistsError(f"{dst}: folder exists and is not empty (use --force to replace it)")


def _check_space(dst: Path, need: int) -> None:
    """The free space where dst will be written: its nearest existing folder (parents come later)."""
    at = dst.parent
    while not at.exists() and at != at.parent:
        at = at.parent
    free = shutil.disk_usage(at).free
    if need > free:
        raise DiskSpaceError(f"{dst.parent}: not enough free disk space: the model needs "
                             f"{need / 1e6:.1f} MB, {free / 1e6:.1f} MB free")


def convert(model_path: str | Path, output_path: str | Path, quantize: str | None = None, *,
            split_experts: bool = True, num_experts: int | None = None, top_k: int | None = None,
            force: bool = False, progress: Callable[[Progress], None] | None = None,
            cancel: threading.Event | Callable[[], bool] | None = None,
            calibration_data: str | Path | None = None, repack_experts: bool = True,
            in_place: bool = False) -> ConvertResult:
    """Convert `model_path` (GGUF file or HF folder) into the Colibri directory `output_path`.

    `quantize`: one of QUANTIZE_CHOICES; None keeps a GGUF's formats and makes int8 of a float
    checkpoint. `cancel` (an Event or a callable) is checked between slices of tensors.
    `calibration_data`: a text file whose activations weight the rounding. `repack_experts` off: every
    tensor in its stored (GGUF) layout. `in_place`: a GGUF kept as it is, the directory holding an
    index of its tensors' bytes (engine.gguf_index) and no tensor data: no copy, seconds for any size."""
    t0 = time.perf_counter()
    src_path, dst = Path(model_path).expanduser(), Path(output_path).expanduser().absolute()
    if quantize is not None and quantize not in QUANTIZE_CHOICES:
        raise ConversionError(f"--quantize {quantize!r}: choose one of {', '.join(QUANTIZE_CHOICES)}")
    _check_destination(dst, force)
    is_cancelled = cancel.is_set if isinstance(cancel, threading.Event) else (cancel or (lambda: False))

    def check() -> None:
        if is_cancelled():
            raise ConversionCancelled("conversion cancelled; nothing was written")

    src = open_source(src_path)
    tmp: Path | None = None
    try:
        target = quantize or ("keep" if src.kind == "gguf" else "int8")
        if in_place:
            why = in_place_refusal(src.kind, target, split_experts, calibration_data)
            if why:
                raise ConversionError(f"{src_path}: cannot be run in place: {why}")
        cfg = _apply_overrides(src.config, num_experts, top_k)
        if cfg.rope_scaling and cfg.rope_scaling.get("type") == "llama3":
            cfg = replace(cfg, rope_freq_factors=True)
        _check_vocab(src.tokenizer, cfg)
        items = plan(src, cfg, target, split_experts)
        cal = None
        if calibration_data is not None:
            from engine.convert.calibrate import calibration_of
            def calibrating(layers_done: int, layers: int, chunks: int, tokens: int) -> None:
                check()  # Cancel works between layers of the calibration forward too
                if progress:
                    progress(Progress(layers_done, layers, f"calibration: layer {layers_done} of {layers} "
                                      f"({chunks} chunks, {tokens} tokens)", "", "calibration"))
            cal = calibration_of(items, cfg, src, calibration_data, src_path, progress=calibrating)
        cfg = replace(cfg, rope_scaling=None) if cfg.rope_freq_factors else cfg
        if in_place:
            return _index_in_place(src, src_path, dst, cfg, items, progress, t0)
        if repack_experts:
            items = [replace(i, qtype=quant.repacked(i.qtype, i.source.shape)) if i.file.startswith("experts/")
                     else i for i in items]
        total = sum(i.qtype.nbytes(i.source.shape) for i in items)
        _check_space(dst, total + sum(align_up(1) for _ in items) + (4 << 20))
        dst.parent.mkdir(parents=True, exist_ok=True)
        _clean_stale_partials(dst)
        tmp = dst.parent / f".{dst.name}{_PARTIAL}{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        manifest, done = Manifest(), 0
        by_file: dict[str, list[_Item]] = {}
        for it in items:
            by_file.setdefault(it.file, []).append(it)
        for rel, file_items in by_file.items():
            (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
            w = TensorFileWriter(tmp / rel, [TensorPlan(i.name, i.qtype, i.source.shape) for i in file_items])
            try:
                for it in file_items:
                    check()
                    _write_tensor(w, it, check, cal.energies.get(it.name) if cal else None,
                                  own=target in ("int4", "int8"))
                    done += it.qtype.nbytes(it.source.shape)
                    if progress:
                        progress(Progress(done, total, it.name, rel))
            except BaseException:
                w.abort()
                raise
            manifest.add(rel, *w.close())
        check()
        types = dict(Counter(it.qtype.plain.name for it in items))  # by format, however laid out
        _write_metadata(tmp, cfg, src, target, split_experts, types, src_path, manifest,
                        cal.summary() if cal else None)
        _move_into_place(tmp, dst)
        tmp = None
    except OSError as e:  # a full disk, a vanished folder, a permission: say where
        raise ConversionError(f"writing {dst}: {e.strerror or e} ({e.filename or dst.parent}); "
                              f"nothing was written") from e
    finally:
        src.close()
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    seconds = time.perf_counter() - t0
    log.info("converted %s -> %s: %.1f MB in %.1f s", src_path, dst, total / 1e6, seconds)
    return ConvertResult(dst, cfg, total, seconds, types, cal.summary() if cal else None)


def in_place_refusal(kind: str, target: str, split_experts: bool, calibration_data: object) -> str | None:
    """Why a source cannot be run in place (None: it can): only a GGUF kept in its own formats."""
    if kind != "gguf":
        return "only a GGUF file runs in place"
    if target != "keep":
        return f"--quantize {target} writes new tensors (keep the GGUF's own formats, or convert a copy)"
    if not split_experts:
        return "--no-split_experts is a layout of copied files"
    return "--calibration_data rounds new tensors" if calibration_data else None


def _index_in_place(src: _Source, src_path: Path, dst: Path, cfg: ModelConfig, items: list[_Item],
                    progress: Callable[[Progress], None] | None, t0: float) -> ConvertResult:
    """The model directory of a GGUF run in place: config, tokenizer, template and the index of every
    tensor's bytes in the GGUF (engine.gguf_index), written as a converted model is (atomically)."""
    entries = {}
    for it in items:
        t = it.source
        if t.at is None:
            raise ConversionError(f"{src_path}: tensor {t.name!r} is not a run of the GGUF's bytes as the engine "
                                  f"reads it; convert a copy instead (colibri-convert --copy)")
        e = {"type_id": it.qtype.type_id, "shape": list(t.shape), "offset": t.at, "nbytes": t.nbytes}
        if it.qtype is not t.qtype:
            e["stored_type_id"] = t.qtype.type_id
        if t.reorder:
            e["unpermute"] = int(t.reorder[1])
        entries[it.name] = e
    dst.parent.mkdir(parents=True, exist_ok=True)
    _clean_stale_partials(dst)
    tmp = dst.parent / f".{dst.name}{_PARTIAL}{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        write_index(tmp / INDEX_FILE, src_path.absolute(), src.header_bytes, entries)
        manifest = Manifest()
        manifest.add_file(tmp, INDEX_FILE)
        types = dict(Counter(it.qtype.name for it in items))
        _write_metadata(tmp, cfg, src, "keep", True, types, src_path, manifest, gguf=INDEX_FILE)
        _move_into_place(tmp, dst)
    except OSError as e:
        raise ConversionError(f"writing {dst}: {e.strerror or e} ({e.filename or dst.parent}); "
                              f"nothing was written") from e
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    size = sum(f.stat().st_size for f in dst.iterdir())
    if progress:
        progress(Progress(1, 1, "", INDEX_FILE))
    seconds = time.perf_counter() - t0
    log.info("indexed %s in place -> %s: %.1f KB in %.1f s", src_path, dst, size / 1e3, seconds)
    return ConvertResult(dst, cfg, size, seconds, types)


def _check_vocab(tok: TokenizerBundle, cfg: ModelConfig) -> None:
    """A tokenizer that can emit ids past the embedding table would crash the engine later."""
    from tokenizers import Tokenizer
    size = Tokenizer.from_str(tok.tokenizer_json).get_vocab_size(with_added_tokens=True)
    if size > cfg.vocab_size:
        raise ConfigError(f"the tokenizer has {size} tokens but the model's embedding table only "
                          f"{cfg.vocab_size} rows (tokenizer and weights from different models?)")


def _apply_overrides(cfg: ModelConfig, num_experts: int | None, top_k: int | None) -> ModelConfig:
    if num_experts is not None and num_experts != cfg.num_experts:
        raise ConfigError(f"--num_experts {num_experts}: the source model has {cfg.num_experts} "
                          f"expert{'s' if cfg.num_experts != 1 else ''} per layer")
    if top_k is not None:
        if not 1 <= top_k <= cfg.num_experts:
            raise ConfigError(f"--top_k {top_k}: must be between 1 and the {cfg.num_experts} experts per layer")
        if top_k != cfg.top_k:
            log.warning("top_k %d overrides the model's %d experts per token", top_k, cfg.top_k)
        cfg = replace(cfg, top_k=top_k)
    return cfg


def _write_metadata(tmp: Path, cfg: ModelConfig, src: _Source, target: str, split: bool,
                    types: dict[str, int], src_path: Path, manifest: Manifest,
                    calibration: dict | None = None, gguf: str | None = None) -> None:
    (tmp / TOKENIZER_FILE).write_text(src.tokenizer.tokenizer_json, encoding="utf-8")
    manifest.add_file(tmp, TOKENIZER_FILE)
    if src.tokenizer.chat_template is not None:
        (tmp / TEMPLATE_FILE).write_text(src.tokenizer.chat_template, encoding="utf-8")
        manifest.add_file(tmp, TEMPLATE_FILE)
    meta = {
        "quantization": {"requested": target, "tensor_types": types,
                         **({"calibration": calibration} if calibration else {})},
        "layout": {"split_experts": split, **({"gguf": gguf} if gguf else {})},
        "tokenizer": {"file": TOKENIZER_FILE,
                      "chat_template_file": TEMPLATE_FILE if src.tokenizer.chat_template is not None else None,
                      **src.tokenizer.meta},
        "source": {"kind": src.kind, "name": src_path.name},
    }
    if src.generation:
        meta["generation"] = src.generation  # the model's own sampling defaults: the chat starts from them
    if src.config.rope_scaling and src.config.rope_scaling.get("type") == "llama3":
        meta["source"]["rope_scaling"] = src.config.rope_scaling
    (tmp / CONFIG_FILE).write_text(json.dumps(config_document(cfg, meta), indent=1) + "\n", encoding="utf-8")
    manifest.add_file(tmp, CONFIG_FILE)
    manifest.write(tmp)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _exchange(a: Path, b: Path) -> bool:
    """Swap two folders in one step (renameat2 RENAME_EXCHANGE); False where the system cannot."""
    fn = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
    if fn is None:
        return False
    at_fdcwd, rename_exchange = -100, 2
    if fn(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.EXDEV, errno.EPERM):
        return False
    raise OSError(err, os.strerror(err), str(b))


def _move_into_place(tmp: Path, dst: Path) -> None:
    """The finished model takes `dst`'s place, swapped atomically where the system can, else with the
    old model set aside until then (`recover_replaced` repairs a kill in between)."""
    _fsync_dir(tmp)
    if dst.exists() and _exchange(tmp, dst):
        _fsync_dir(dst.parent)
        shutil.rmtree(tmp, ignore_errors=True)  # now the old model, under the partial name
        return
    old = None
    if dst.exists():
        old = dst.parent / f".{dst.name}{_OLD}{os.getpid()}"
        os.rename(dst, old)
    try:
        os.rename(tmp, dst)
    except BaseException:
        if old is not None:
            os.rename(old, dst)
        raise
    _fsync_dir(dst.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def calibration_for(model_path: str | Path, text_path: str | Path):
    """colibri-convert --calibration_data's calibration, for a GGUF file or HF folder."""
    from engine.convert.calibrate import calibration_of
    src = open_source(Path(model_path))
    try:
        return calibration_of(plan(src, src.config, "f32", True), src.config, src, text_path, Path(model_path))
    finally:
        src.close()
