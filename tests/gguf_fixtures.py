"""Write GGUF test fixtures the way llama.cpp's ``convert_hf_to_gguf.py`` would.

No torch, no transformers: numpy, ``gguf``, ``tokenizers`` (only for the tiny tokenizer
of :func:`make_random_hf` and the pre-tokenizer hash) and :mod:`kquant_ref`.

Main entry points
-----------------
``write_gguf(hf_dir, out_path, *, arch=None, qtypes=None, ...) -> Path``
    Convert a Hugging Face folder (config.json, safetensors -- single, sharded, f32/f16/bf16
    --, tokenizer.json, tokenizer_config.json) to GGUF.
``convert_hf(hf_dir, *, arch=None, qtypes=None, ...) -> GGUFPlan``
    The same conversion, in memory: metadata (``plan.metadata`` / ``plan.kv``) and every
    tensor (``plan.tensors[name]`` -> :class:`TensorSpec` with the float values, the GGML
    type and the encoded bytes).  ``plan.write(path)`` writes it; the plan can be edited
    first (drop or add tensors, change keys) to make malformed-but-parseable files.
``write_raw_gguf(out_path, arch, tensors, metadata) -> Path``
    Hand-made files: any architecture string (or none), any tensors, any keys.
``make_random_hf(hf_dir, kind, ...) -> Path`` / ``make_wide_gguf(out_path, ...) -> Path``
    Randomly initialised (fixed seed) HF checkpoints of every supported kind; the "wide"
    llama has rows of 256/512 so every K-quant applies to real tensors.
``read_gguf(path) -> GGUFSummary``
    Architecture, metadata values and tensors (numpy shapes, GGML types, dequantized values)
    of a written file, via ``gguf.GGUFReader``.
``reference_forward(path_or_summary, ids) -> logits``
    float64 numpy forward pass of a written file with llama.cpp's semantics (NORM rope for
    llama, NEOX otherwise, ``rope_freqs``, hard-coded top-k renormalisation ...).  F32 files
    written from tests/fixtures/hf reproduce transformers' reference logits to ~1e-5.

Shapes are numpy order everywhere (the reverse of GGML's ``ne``).
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import math
import re
import shutil
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping

import numpy as np
import gguf
from gguf import GGMLQuantizationType, GGUFValueType, GGUFWriter
from gguf.gguf_writer import GGUFValue

try:  # imported as ``tests.gguf_fixtures`` or, with tests/ on sys.path, as ``gguf_fixtures``
    from . import kquant_ref
except ImportError:  # pragma: no cover
    import kquant_ref  # type: ignore[no-redef]

Q = GGMLQuantizationType

__all__ = [
    "Q",
    "HF_ARCH_TO_GGUF",
    "MODEL_TYPE_TO_GGUF",
    "PERMUTE_QK_ARCHS",
    "TensorSpec",
    "GGUFPlan",
    "GGUFSummary",
    "convert_hf",
    "write_gguf",
    "write_raw_gguf",
    "read_gguf",
    "read_safetensors",
    "load_hf_tensors",
    "llama_permute",
    "llama_unpermute",
    "llama3_rope_factors",
    "default_qtype",
    "make_tiny_tokenizer",
    "make_random_hf",
    "make_wide_hf",
    "make_wide_gguf",
    "HF_KINDS",
    "MOE_NORM_TOPK",
    "reference_forward",
]

# ---------------------------------------------------------------------------------------
# architecture tables
# ---------------------------------------------------------------------------------------

#: HF ``architectures[0]`` -> GGUF ``general.architecture`` (the convert_hf_to_gguf model classes)
HF_ARCH_TO_GGUF: dict[str, str] = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "llama",
    "MixtralForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "Qwen2MoeForCausalLM": "qwen2moe",
    "Qwen3MoeForCausalLM": "qwen3moe",
    "OlmoeForCausalLM": "olmoe",
}

#: HF ``model_type`` fallback
MODEL_TYPE_TO_GGUF: dict[str, str] = {
    "llama": "llama",
    "mistral": "llama",
    "mixtral": "llama",
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "qwen2_moe": "qwen2moe",
    "qwen3_moe": "qwen3moe",
    "olmoe": "olmoe",
}

#: GGUF architectures whose q_proj/k_proj rows the converter permutes (LlamaModel.undo_permute).
#: llama.cpp runs these with LLAMA_ROPE_TYPE_NORM (rotate adjacent pairs); qwen2/qwen3/
#: qwen2moe/qwen3moe/olmoe use LLAMA_ROPE_TYPE_NEOX (rotate halves, HF's layout) and are
#: written unpermuted -- OLMoE's full-width q_norm/k_norm included.
PERMUTE_QK_ARCHS = frozenset({"llama"})

_ARCH_ENUM = {name: arch for arch, name in gguf.MODEL_ARCH_NAMES.items()}

#: file type written to ``general.file_type`` for the dominant weight type
_FILE_TYPE = {
    Q.F32: gguf.LlamaFileType.ALL_F32,
    Q.F16: gguf.LlamaFileType.MOSTLY_F16,
    Q.BF16: gguf.LlamaFileType.MOSTLY_BF16,
    Q.Q4_0: gguf.LlamaFileType.MOSTLY_Q4_0,
    Q.Q4_1: gguf.LlamaFileType.MOSTLY_Q4_1,
    Q.Q5_0: gguf.LlamaFileType.MOSTLY_Q5_0,
    Q.Q5_1: gguf.LlamaFileType.MOSTLY_Q5_1,
    Q.Q8_0: gguf.LlamaFileType.MOSTLY_Q8_0,
    Q.Q4_K: gguf.LlamaFileType.MOSTLY_Q4_K_M,
    Q.Q5_K: gguf.LlamaFileType.MOSTLY_Q5_K_M,
    Q.Q6_K: gguf.LlamaFileType.MOSTLY_Q6_K,
}

#: llama-quantize's substitutes when a row is not a multiple of 256 (llama-quant.cpp)
_LLAMA_QUANTIZE_FALLBACK = {Q.Q4_K: Q.Q5_0, Q.Q5_K: Q.Q5_1, Q.Q6_K: Q.Q8_0}

# ---------------------------------------------------------------------------------------
# safetensors (own reader: the numpy API of safetensors cannot load BF16)
# ---------------------------------------------------------------------------------------

def read_safetensors(path: Path | str) -> dict[str, tuple[np.ndarray, str]]:
    """Return ``{name: (array, dtype_str)}`` in header order. BF16 is widened to float32
    (engine.convert.safetensors_file: the one safetensors reader)."""
    from engine.convert.safetensors_file import read_tensors
    return {name: (arr, dt) for name, (dt, arr) in read_tensors(path).items()}


def load_hf_tensors(hf_dir: Path | str) -> dict[str, tuple[np.ndarray, str]]:
    """All tensors of an HF folder (single file or sharded with model.safetensors.index.json)."""
    hf_dir = Path(hf_dir)
    index = hf_dir / "model.safetensors.index.json"
    if index.is_file():
        weight_map: dict[str, str] = json.loads(index.read_text())["weight_map"]
        parts = sorted(dict.fromkeys(weight_map.values()))
    else:
        weight_map = {}
        parts = sorted(p.name for p in hf_dir.iterdir()
                       if p.name.startswith("model") and p.name.endswith(".safetensors"))
    if not parts:
        raise FileNotFoundError(f"no model*.safetensors in {hf_dir}")
    tensors: dict[str, tuple[np.ndarray, str]] = {}
    for part in parts:
        tensors.update(read_safetensors(hf_dir / part))
    if weight_map and set(weight_map) != set(tensors):
        missing = sorted(set(weight_map) - set(tensors))
        extra = sorted(set(tensors) - set(weight_map))
        raise ValueError(f"weight map and shards disagree: missing {missing}, extra {extra}")
    return tensors


# ---------------------------------------------------------------------------------------
# tensor transforms
# ---------------------------------------------------------------------------------------

def llama_permute(w: np.ndarray, n_head: int, n_head_kv: int | None = None) -> np.ndarray:
    """convert_hf_to_gguf LlamaModel.permute: HF (rotate-half) rows -> GGML NORM-rope rows.

    Within every head of ``hd`` rows, GGUF row ``2*i + j`` = HF row ``j*hd/2 + i``
    (i < hd/2, j in {0, 1}): the two halves are interleaved.  For k_proj pass
    ``n_head_kv`` (it replaces n_head when they differ).  Works for weights and biases.
    """
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def llama_unpermute(w: np.ndarray, n_head: int, n_head_kv: int | None = None) -> np.ndarray:
    """Inverse of :func:`llama_permute` (GGUF rows -> HF rows)."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def llama3_rope_factors(head_dim: int, theta: float, factor: float = 8.0, low_freq_factor: float = 1.0,
                        high_freq_factor: float = 4.0, original_context: int = 8192) -> np.ndarray:
    """The ``rope_freqs.weight`` tensor LlamaModel.generate_extra_tensors writes (shape (head_dim/2,), F32).

    llama.cpp divides the rotation frequency of pair ``i`` by ``factors[i]``.
    """
    freqs = 1.0 / (np.float32(theta) ** (np.arange(0, head_dim, 2, dtype=np.float32) / np.float32(head_dim)))
    low_wavelen = original_context / low_freq_factor
    high_wavelen = original_context / high_freq_factor
    out = []
    for f in freqs.astype(np.float32):
        wavelen = 2 * math.pi / float(f)
        if wavelen < high_wavelen:
            out.append(1.0)
        elif wavelen > low_wavelen:
            out.append(factor)
        else:
            smooth = (original_context / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
            out.append(1.0 / ((1 - smooth) / factor + smooth))
    return np.asarray(out, dtype=np.float32)


# ---------------------------------------------------------------------------------------
# plan / spec
# ---------------------------------------------------------------------------------------

@dataclass
class TensorSpec:
    """One tensor of a plan. ``data`` is the float32 value (numpy order) before encoding."""

    name: str
    data: np.ndarray
    qtype: GGMLQuantizationType
    requested: GGMLQuantizationType | None = None
    source: tuple[str, ...] = ()
    _encoded: np.ndarray | None = field(default=None, repr=False, compare=False)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(int(s) for s in self.data.shape)

    @property
    def ggml_shape(self) -> tuple[int, ...]:
        return tuple(reversed(self.shape))

    def encoded(self) -> np.ndarray:
        """What goes into the file: float32/float16 array, or uint8 row bytes for block types."""
        if self._encoded is None:
            self._encoded = kquant_ref.quantize(self.data, self.qtype)
        return self._encoded

    def dequantized(self) -> np.ndarray:
        """The float32 values a correct reader gets back (numpy shape)."""
        enc = self.encoded()
        if self.qtype in (Q.F32, Q.F16):
            return enc.astype(np.float32)
        return gguf.quants.dequantize(enc, self.qtype).reshape(self.shape)

    @property
    def nbytes(self) -> int:
        return int(self.encoded().nbytes)


@dataclass
class GGUFPlan:
    arch: str
    kv: dict[str, GGUFValue]
    tensors: dict[str, TensorSpec]
    hf_arch: str | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def metadata(self) -> dict[str, Any]:
        """Plain ``{key: value}`` view of ``kv``."""
        return {k: v.value for k, v in self.kv.items()}

    def set_key(self, key: str, value: Any, vtype: GGUFValueType | None = None,
                sub_type: GGUFValueType | None = None) -> None:
        self.kv[key] = _gguf_value(value, vtype, sub_type)

    def write(self, out_path: Path | str) -> Path:
        return _write(Path(out_path), self.arch, self.kv, self.tensors.values())


@dataclass
class GGUFSummary:
    arch: str | None
    metadata: dict[str, Any]
    tensors: dict[str, tuple[tuple[int, ...], GGMLQuantizationType]]
    reader: gguf.GGUFReader

    def tensor(self, name: str) -> np.ndarray:
        """Dequantized float32 values of a tensor, numpy shape."""
        for t in self.reader.tensors:
            if t.name == name:
                shape = tuple(int(s) for s in reversed(t.shape.tolist()))
                if t.tensor_type in (Q.F32, Q.F16):
                    return np.asarray(t.data, dtype=np.float32).reshape(shape)
                return gguf.quants.dequantize(np.asarray(t.data), t.tensor_type).reshape(shape)
        raise KeyError(name)


def _gguf_value(value: Any, vtype: GGUFValueType | None = None,
                sub_type: GGUFValueType | None = None) -> GGUFValue:
    if isinstance(value, GGUFValue):
        return value
    if isinstance(value, tuple) and len(value) in (2, 3) and isinstance(value[1], GGUFValueType):
        return GGUFValue(value[0], value[1], value[2] if len(value) == 3 else None)
    if vtype is None:
        if isinstance(value, (list, tuple)):
            vtype = GGUFValueType.ARRAY
            value = list(value)
            if sub_type is None:
                first = value[0] if value else ""
                sub_type = (GGUFValueType.STRING if isinstance(first, (str, bytes)) else
                            GGUFValueType.BOOL if isinstance(first, bool) else
                            GGUFValueType.INT32 if isinstance(first, (int, np.integer)) else
                            GGUFValueType.FLOAT32)
        else:
            vtype = GGUFValueType.get_type(value)
            if vtype == GGUFValueType.INT32 and isinstance(value, (int, np.integer)):
                vtype = (GGUFValueType.UINT32 if 0 <= value < 2**32 else
                         GGUFValueType.INT64 if value < 0 else GGUFValueType.UINT64)
    return GGUFValue(value, vtype, sub_type)


def _write(out_path: Path, arch: str | None, kv: Mapping[str, GGUFValue],
           tensors: Iterable[TensorSpec]) -> Path:
    out_path.parent.mkdir(parents=True, exist_ok=True)
    gw = GGUFWriter(out_path, arch or "")
    gw.kv_data[0] = {}
    if arch is not None and "general.architecture" not in kv:
        gw.kv_data[0]["general.architecture"] = GGUFValue(arch, GGUFValueType.STRING)
    for k, v in kv.items():
        gw.kv_data[0][k] = v
    for spec in tensors:
        enc = spec.encoded()
        if enc.dtype == np.uint8 and spec.qtype not in (Q.F32, Q.F16):
            gw.add_tensor(spec.name, enc, raw_dtype=spec.qtype)
        else:
            gw.add_tensor(spec.name, enc)
    gw.write_header_to_file()
    gw.write_kv_data_to_file()
    gw.write_tensors_to_file()
    gw.close()
    return out_path


# ---------------------------------------------------------------------------------------
# quantization type policy
# ---------------------------------------------------------------------------------------

QTypes = (GGMLQuantizationType | Mapping[str, GGMLQuantizationType]
          | Callable[[str, tuple], "GGMLQuantizationType | None"] | None)

_ALWAYS_F32 = (".ffn_gate_inp.weight", ".ffn_gate_inp_shexp.weight")


def _forced_f32(name: str, ndim: int) -> bool:
    """convert_hf_to_gguf's always-F32 rules (1-D, *_norm.weight, non-.weight, routers, rope_freqs)."""
    return (ndim <= 1 or name.endswith("_norm.weight") or not name.endswith(".weight")
            or name.endswith(_ALWAYS_F32) or name == "rope_freqs.weight")


def default_qtype(name: str, shape: tuple[int, ...],
                  weight_type: GGMLQuantizationType = Q.Q8_0) -> GGMLQuantizationType:
    """Default: F32 for 1-D/norms/biases/routers, F16 for token_embd, ``weight_type`` (Q8_0) otherwise."""
    if _forced_f32(name, len(shape)):
        return Q.F32
    if name == "token_embd.weight":
        return Q.F16
    return weight_type


def _resolve_qtype(name: str, shape: tuple[int, ...], qtypes: QTypes) -> GGMLQuantizationType:
    if qtypes is None:
        return default_qtype(name, shape)
    if isinstance(qtypes, (GGMLQuantizationType, int)) and not isinstance(qtypes, bool):
        return Q.F32 if _forced_f32(name, len(shape)) else Q(qtypes)
    if isinstance(qtypes, Mapping):
        if name in qtypes:  # exact names win over everything, norms included
            return Q(qtypes[name])
        if not _forced_f32(name, len(shape)):
            for pat, qt in qtypes.items():
                if any(c in pat for c in "*?[") and fnmatch.fnmatchcase(name, pat):
                    return Q(qt)
        return default_qtype(name, shape)
    if callable(qtypes):
        got = qtypes(name, shape)
        return default_qtype(name, shape) if got is None else Q(got)
    raise TypeError(f"bad qtypes: {qtypes!r}")


def _fallback(qtype: GGMLQuantizationType, shape: tuple[int, ...], mode: str) -> GGMLQuantizationType:
    if kquant_ref.can_quantize(shape, qtype):
        return qtype
    if mode == "llama-quantize" and qtype in _LLAMA_QUANTIZE_FALLBACK:
        alt = _LLAMA_QUANTIZE_FALLBACK[qtype]
        if kquant_ref.can_quantize(shape, alt):
            return alt
    if mode == "f32":
        return Q.F32
    return Q.F16


# ---------------------------------------------------------------------------------------
# tokenizer metadata (TextModel._set_vocab_gpt2 without transformers)
# ---------------------------------------------------------------------------------------

_CHKTXT = (
    "\n \n\n \n\n\n \t \t\t \t\n  \n   \n    \n     \n🚀 (normal) 😶\u200d🌫️ (multiple emojis concatenated) ✅ 🦙🦙 3 33 333 3333 33333"  # noqa: E501
    " 333333 3333333 33333333 3.3 3..3 3...3 កាន់តែពិសេសអាច😁 ?我想在apple工作1314151天～ ------======= нещо на Български"  # noqa: E501
    " ''''''```````\"\"\"\"......!!!!!!?????? I've been 'told he's there, 'RE you sure? 'M not sure I'll make it, 'D you like some tea? We'Ve a'lL"  # noqa: E501
)

#: a few hashes of convert_hf_to_gguf.get_vocab_base_pre (real tokenizers only)
_KNOWN_CHKHSH = {
    "0ef9807a4087ebef797fc749390439009c3b9eda9ad1a097abbe738f486c01e5": "llama-bpe",
    "e636dc30a262dcc0d8c323492e32ae2b70728f4df7dfe9737d9f920a282b8aea": "qwen2",
    "d4540891389ea895b53b399da6ac824becc30f2fba0e9ddbb98f92e55ca0e97c": "qwen2",
    "b6dc8df998e1cfbdc4eac8243701a65afe638679230920b50d6f17d81c098166": "olmo",
    "3ce83efda5659b07b1ad37ca97ca5797ea4285d9b9ab0dc679e4a720c9da7454": "gpt-2",
}

_QWEN2_REGEX = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"  # noqa: E501
_LLAMA3_REGEX = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"  # noqa: E501


def _tokenizer_chkhsh(tokenizer_json: Path) -> str | None:
    try:
        from tokenizers import Tokenizer
    except ImportError:  # pragma: no cover
        return None
    ids = Tokenizer.from_file(str(tokenizer_json)).encode(_CHKTXT).ids
    return hashlib.sha256(str(ids).encode()).hexdigest()


def _guess_pre(tok: dict, arch: str, chkhsh: str | None) -> str:
    """tokenizer.ggml.pre. The real converter hashes the encoding of a test string and *fails*
    on unknown hashes (every tiny fixture tokenizer); here known hashes are honoured and
    otherwise the pre-tokenizer regex decides."""
    if chkhsh in _KNOWN_CHKHSH:
        return _KNOWN_CHKHSH[chkhsh]
    pre = tok.get("pre_tokenizer") or {}
    items = pre.get("pretokenizers", [pre]) if pre.get("type") == "Sequence" else [pre]
    for item in items:
        if item.get("type") == "Split":
            pat = (item.get("pattern") or {}).get("Regex")
            if pat == _QWEN2_REGEX:
                return "qwen2"
            if pat == _LLAMA3_REGEX:
                return "llama-bpe"
    for item in items:
        if item.get("type") == "ByteLevel" and item.get("use_regex", True):
            return "olmo" if arch == "olmoe" else "gpt-2"
    return "default"


def _looks_special(tok: str) -> bool:
    return (tok in ("<pad>", "<mask>", "<2mass>", "[@BOS@]")
            or (tok.startswith("<|") and tok.endswith("|>"))
            or (tok.startswith("<｜") and tok.endswith("｜>"))
            or (tok.startswith("<unused") and tok.endswith(">")))


def _vocab_kv(gw: GGUFWriter, hf_dir: Path, arch: str, vocab_size: int | None,
              tokenizer_pre: str | None) -> list[str]:
    notes: list[str] = []
    tj_path = hf_dir / "tokenizer.json"
    if not tj_path.is_file():
        notes.append("no tokenizer.json: tokenizer keys omitted")
        return notes
    tok = json.loads(tj_path.read_text(encoding="utf-8"))
    model = tok.get("model", {})
    if model.get("type") != "BPE":
        raise ValueError(f"{tj_path}: only BPE tokenizers are supported, got {model.get('type')}")
    vocab: dict[str, int] = dict(model["vocab"])
    added = {a["content"]: a for a in tok.get("added_tokens", [])}
    for content, a in added.items():
        vocab.setdefault(content, a["id"])
    reverse = {i: t for t, i in vocab.items()}
    n = vocab_size if vocab_size is not None else max(reverse) + 1
    if max(reverse) >= n:
        raise ValueError(f"tokenizer id {max(reverse)} >= vocab_size {n}")
    tokens: list[str] = []
    types: list[int] = []
    for i in range(n):
        if i not in reverse:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
            continue
        t = reverse[i]
        if t in added:
            if added[t].get("special") or _looks_special(t):
                types.append(gguf.TokenType.CONTROL)
            else:
                t = t.replace("\u2581", " ")
                types.append(gguf.TokenType.USER_DEFINED)
        else:
            types.append(gguf.TokenType.NORMAL)
        tokens.append(t)
    chkhsh = _tokenizer_chkhsh(tj_path)
    pre = tokenizer_pre or _guess_pre(tok, arch, chkhsh)
    if chkhsh not in _KNOWN_CHKHSH and tokenizer_pre is None:
        notes.append(f"pre-tokenizer hash {chkhsh} unknown to convert_hf_to_gguf (it would raise); "
                     f"wrote pre={pre!r}")
    gw.add_tokenizer_model("gpt2")
    gw.add_tokenizer_pre(pre)
    gw.add_token_list(tokens)
    gw.add_token_types(types)
    gguf.SpecialVocab(hf_dir, load_merges=True).add_to_gguf(gw, quiet=True)
    return notes


# ---------------------------------------------------------------------------------------
# conversion
# ---------------------------------------------------------------------------------------

_MIXTRAL_EXPERT = re.compile(r"^model\.layers\.(\d+)\.block_sparse_moe\.experts\.(\d+)\.(w1|w2|w3)\.weight$")
_MLP_EXPERT = re.compile(
    r"^model\.layers\.(\d+)\.mlp\.experts\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")
_FUSED_GATE_UP = re.compile(r"^model\.layers\.(\d+)\.mlp\.experts\.gate_up_proj(\.weight)?$")
_FUSED_DOWN = re.compile(r"^model\.layers\.(\d+)\.mlp\.experts\.down_proj(\.weight)?$")
_SKIP_SUFFIXES = (".attention.masked_bias", ".attention.bias", ".rotary_emb.inv_freq")


def _detect_arch(cfg: dict) -> tuple[str, str | None]:
    hf_arch = (cfg.get("architectures") or [None])[0]
    if hf_arch in HF_ARCH_TO_GGUF:
        return HF_ARCH_TO_GGUF[hf_arch], hf_arch
    mt = cfg.get("model_type")
    if mt in MODEL_TYPE_TO_GGUF:
        return MODEL_TYPE_TO_GGUF[mt], hf_arch
    raise ValueError(f"unsupported HF architecture {hf_arch!r} / model_type {mt!r}")


def _find(cfg: dict, *keys: str, default: Any = None) -> Any:
    for k in keys:
        if k in cfg and cfg[k] is not None:
            return cfg[k]
    return default


def _rope_params(cfg: dict) -> dict:
    """TextModel.__init__: rope_parameters (or rope_scaling) with rope_theta/rope_type mirrored in."""
    rp = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
    if "full_attention" not in rp and "sliding_attention" not in rp:
        theta = _find(cfg, "rope_theta", "rotary_emb_base")
        if "rope_theta" not in rp and theta is not None:
            rp["rope_theta"] = theta
        if "rope_type" not in rp and rp.get("type") is not None:
            rp["rope_type"] = rp["type"]
    return rp.get("full_attention", rp)


def _hparam_kv(gw: GGUFWriter, cfg: dict, arch: str, hf_arch: str | None) -> list[str]:
    """TextModel.set_gguf_parameters + the per-class additions, in the converter's order."""
    notes: list[str] = []
    gw.add_block_count(cfg["num_hidden_layers"])
    if (v := _find(cfg, "max_position_embeddings", "n_ctx", "n_positions")) is not None:
        gw.add_context_length(v)
    gw.add_embedding_length(cfg["hidden_size"])
    if (v := _find(cfg, "intermediate_size", "n_inner")) is not None:
        gw.add_feed_forward_length(v)
    gw.add_head_count(cfg["num_attention_heads"])
    if (v := _find(cfg, "num_key_value_heads", "n_kv_heads")) is not None:
        gw.add_head_count_kv(v)
    rp = _rope_params(cfg)
    rope_type = rp.get("rope_type")
    if rope_type == "linear" and rp.get("factor") is not None:
        gw.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        gw.add_rope_scaling_factor(rp["factor"])
    elif rope_type == "yarn" and rp.get("factor") is not None:
        gw.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        gw.add_rope_scaling_factor(rp["factor"])
        gw.add_rope_scaling_orig_ctx_len(rp["original_max_position_embeddings"])
    if rp.get("rope_theta") is not None:
        gw.add_rope_freq_base(rp["rope_theta"])
    if (v := _find(cfg, "rms_norm_eps", "norm_eps")) is not None:
        gw.add_layer_norm_rms_eps(v)
    if (v := _find(cfg, "num_local_experts", "num_experts")) is not None:
        gw.add_expert_count(v)
    if (v := _find(cfg, "num_experts_per_tok", "num_experts_per_token")) is not None:
        gw.add_expert_used_count(v)
    if cfg.get("head_dim") is not None:
        gw.add_key_length(cfg["head_dim"])
        gw.add_value_length(cfg["head_dim"])
    # general.file_type is added by the caller once the tensor types are known
    if arch == "llama":
        gw.add_vocab_size(cfg["vocab_size"])
        gw.add_rope_dimension_count(cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"])
    elif arch in ("qwen2moe", "qwen3moe"):
        if (v := cfg.get("moe_intermediate_size")) is not None:
            gw.add_expert_feed_forward_length(v)
        if (v := cfg.get("shared_expert_intermediate_size")) is not None:
            gw.add_expert_shared_feed_forward_length(v)
    elif arch == "olmoe":
        if cfg.get("rms_norm_eps") not in (None, 1e-5):
            notes.append(f"olmoe: converter overwrites rms eps {cfg['rms_norm_eps']} with 1e-5")
        # OlmoeModel re-adds these two keys (GGUFWriter logs "Duplicated key" and keeps the last)
        gw.kv_data[0].pop(gguf.Keys.Attention.LAYERNORM_RMS_EPS.format(arch=arch), None)
        gw.add_layer_norm_rms_eps(1e-5)  # hard-coded by OlmoeModel
        if (v := cfg.get("num_experts")) is not None:
            gw.kv_data[0].pop(gguf.Keys.LLM.EXPERT_COUNT.format(arch=arch), None)
            gw.add_expert_count(v)
    return notes


def _iter_converted(raw: dict[str, tuple[np.ndarray, str]], cfg: dict, arch: str, tmap: gguf.TensorNameMap,
                    n_layer: int) -> Iterator[tuple[str, np.ndarray, tuple[str, ...]]]:
    """Yield (gguf_name, float32 array, hf_source_names) in the converter's order."""
    n_head = cfg["num_attention_heads"]
    n_kv = cfg.get("num_key_value_heads") or n_head
    n_expert = _find(cfg, "num_local_experts", "num_experts")
    permute = arch in PERMUTE_QK_ARCHS
    pending: dict[int, dict[tuple[str, int], np.ndarray]] = {}

    def mapped(hf_name: str) -> str:
        new = tmap.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if new is None:
            raise ValueError(f"cannot map tensor {hf_name!r} for arch {arch}")
        return new

    for hf_name, (arr, _dt) in raw.items():
        if hf_name.endswith(_SKIP_SUFFIXES):
            continue
        data = np.asarray(arr, dtype=np.float32)
        if permute:
            if hf_name.endswith(("q_proj.weight", "q_proj.bias")):
                data = llama_permute(data, n_head, n_head)
            elif hf_name.endswith(("k_proj.weight", "k_proj.bias")):
                data = llama_permute(data, n_head, n_kv)

        m = _MIXTRAL_EXPERT.match(hf_name) or _MLP_EXPERT.match(hf_name)
        if m:
            bid, xid, w = int(m.group(1)), int(m.group(2)), m.group(3)
            if n_expert is None:
                raise ValueError(f"{hf_name}: per-expert tensor but no expert count in config")
            layer = pending.setdefault(bid, {})
            layer[(w, xid)] = data
            if len(layer) >= 3 * n_expert:
                mixtral = w in ("w1", "w2", "w3")
                order = ("w1", "w2", "w3") if mixtral else ("down_proj", "gate_proj", "up_proj")
                for wid in order:
                    stacked = np.stack([layer.pop((wid, e)) for e in range(n_expert)], axis=0)
                    merged = (f"layers.{bid}.feed_forward.experts.{wid}.weight" if mixtral
                              else f"model.layers.{bid}.mlp.experts.{wid}.weight")
                    src = tuple(
                        (f"model.layers.{bid}.block_sparse_moe.experts.{e}.{wid}.weight" if mixtral
                         else f"model.layers.{bid}.mlp.experts.{e}.{wid}.weight") for e in range(n_expert))
                    yield mapped(merged), stacked, src
                del pending[bid]
            continue

        m = _FUSED_GATE_UP.match(hf_name)
        if m:
            bid = int(m.group(1))
            if data.ndim != 3 or data.shape[-2] % 2:
                raise ValueError(f"unexpected gate_up_proj shape {data.shape}")
            if data.shape[-1] != cfg["hidden_size"] and data.shape[-2] == cfg["hidden_size"]:
                data = np.ascontiguousarray(data.swapaxes(-1, -2))  # (E, n_embd, 2*n_ff) layout
            half = data.shape[-2] // 2
            prefix = f"model.layers.{bid}.mlp.experts."
            yield mapped(prefix + "gate_proj.weight"), np.ascontiguousarray(data[:, :half]), (hf_name,)
            yield mapped(prefix + "up_proj.weight"), np.ascontiguousarray(data[:, half:]), (hf_name,)
            continue
        m = _FUSED_DOWN.match(hf_name)
        if m:
            bid = int(m.group(1))
            if data.shape[-2] != cfg["hidden_size"] and data.shape[-1] == cfg["hidden_size"]:
                data = np.ascontiguousarray(data.swapaxes(-1, -2))
            yield mapped(f"model.layers.{bid}.mlp.experts.down_proj.weight"), data, (hf_name,)
            continue

        yield mapped(hf_name), data, (hf_name,)

    left = [k for d in pending.values() for k in d]
    if left:
        raise ValueError(f"unprocessed experts: {left}")


def convert_hf(hf_dir: Path | str, *, arch: str | None = None, qtypes: QTypes = None,
               fallback: str = "f16", tokenizer_pre: str | None = None,
               llama3_orig_ctx: str = "rope_scaling", name: str | None = None) -> GGUFPlan:
    """Build (without writing) the GGUF convert_hf_to_gguf would produce for ``hf_dir``.

    ``arch``: GGUF architecture override (default from config.json; mistral/mixtral -> llama).
    ``qtypes``: None (F32 1-D/norms/biases/routers, F16 token_embd, Q8_0 the rest); a single
    GGMLQuantizationType for every weight that is not forced F32; a mapping from GGUF tensor
    name -- exact names override everything, glob patterns ("blk.*.ffn_down_exps.weight")
    apply to non-forced tensors only -- to type; or ``f(name, shape) -> type | None``.
    ``fallback``: row length not a multiple of the block size -> "f16" (convert_hf_to_gguf),
    "f32", or "llama-quantize" (Q4_K->Q5_0, Q5_K->Q5_1, Q6_K->Q8_0, else F16).
    ``llama3_orig_ctx``: "rope_scaling" (HF semantics: rope_scaling.original_max_position_embeddings)
    or "top_level" (upstream converter literally reads the top-level key, default 8192).
    """
    hf_dir = Path(hf_dir)
    cfg = json.loads((hf_dir / "config.json").read_text())
    if "text_config" in cfg:
        cfg = {**cfg, **cfg["text_config"]}
    det_arch, hf_arch = _detect_arch(cfg)
    arch = arch or det_arch
    if arch not in _ARCH_ENUM:
        raise ValueError(f"unknown GGUF arch {arch!r}")
    n_layer = cfg["num_hidden_layers"]
    tmap = gguf.get_tensor_name_map(_ARCH_ENUM[arch], n_layer)
    raw = load_hf_tensors(hf_dir)

    notes: list[str] = []
    items: list[tuple[str, np.ndarray, tuple[str, ...]]] = []

    # LlamaModel.generate_extra_tensors (emitted before the checkpoint's tensors)
    rp = _rope_params(cfg)
    if arch == "llama" and str(rp.get("rope_type", "")).lower() == "llama3":
        head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
        if llama3_orig_ctx == "top_level":
            orig = cfg.get("original_max_position_embeddings", 8192)
        else:
            orig = rp.get("original_max_position_embeddings",
                          cfg.get("original_max_position_embeddings", 8192))
        if ("original_max_position_embeddings" not in cfg
                and rp.get("original_max_position_embeddings", 8192) != 8192):
            notes.append("llama3 rope: upstream converter reads top-level original_max_position_embeddings "
                         f"(absent -> 8192) but rope_scaling has {rp['original_max_position_embeddings']}; "
                         f"wrote factors for {orig}")
        items.append(("rope_freqs.weight", llama3_rope_factors(
            head_dim, rp.get("rope_theta", 10000.0), rp.get("factor", 8.0), rp.get("low_freq_factor", 1.0),
            rp.get("high_freq_factor", 4.0), orig), ()))
    items.extend(_iter_converted(raw, cfg, arch, tmap, n_layer))

    tensors: dict[str, TensorSpec] = {}
    for gname, data, src in items:
        if gname in tensors:
            raise ValueError(f"duplicate tensor {gname}")
        if not _known_tensor(gname, arch):
            raise ValueError(f"{gname} is not a {arch} tensor")
        req = _resolve_qtype(gname, data.shape, qtypes)
        tensors[gname] = TensorSpec(gname, data, _fallback(req, data.shape, fallback), req, src)

    gw = GGUFWriter(None, arch)
    gw.add_type(gguf.GGUFType.MODEL)
    gw.add_name(name or hf_dir.name)
    notes += _hparam_kv(gw, cfg, arch, hf_arch)
    gw.add_file_type(_file_type(tensors.values()))
    gw.add_quantization_version(gguf.GGML_QUANT_VERSION)
    if arch == "llama":
        tc = hf_dir / "tokenizer_config.json"
        if tc.is_file() and (aps := json.loads(tc.read_text()).get("add_prefix_space")) is not None:
            gw.add_add_space_prefix(aps)
    notes += _vocab_kv(gw, hf_dir, arch, cfg.get("vocab_size"), tokenizer_pre)
    return GGUFPlan(arch=arch, kv=dict(gw.kv_data[0]), tensors=tensors, hf_arch=hf_arch, notes=notes)


def _known_tensor(gname: str, arch: str) -> bool:
    base = gname.rsplit(".", 1)[0]
    for t in gguf.MODEL_TENSORS[_ARCH_ENUM[arch]]:
        tmpl = gguf.TENSOR_NAMES[t]
        if re.fullmatch(tmpl.replace(".", r"\.").replace("{bid}", r"\d+"), base):
            return True
    return False


def _file_type(specs: Iterable[TensorSpec]) -> int:
    counts: dict[GGMLQuantizationType, int] = {}
    for s in specs:
        if (len(s.shape) >= 2 and not _forced_f32(s.name, len(s.shape))
                and s.name not in ("token_embd.weight", "output.weight")):
            counts[s.qtype] = counts.get(s.qtype, 0) + int(np.prod(s.shape))
    if not counts:
        return int(gguf.LlamaFileType.ALL_F32)
    dom = max(counts, key=counts.__getitem__)
    return int(_FILE_TYPE.get(dom, gguf.LlamaFileType.GUESSED))


def write_gguf(hf_dir: Path | str, out_path: Path | str, *, arch: str | None = None, qtypes: QTypes = None,
               **kwargs: Any) -> Path:
    """Convert ``hf_dir`` and write ``out_path``; see :func:`convert_hf` for the options."""
    return convert_hf(hf_dir, arch=arch, qtypes=qtypes, **kwargs).write(out_path)


def write_raw_gguf(out_path: Path | str, arch: str | None,
                   tensors: Mapping[str, tuple[np.ndarray, GGMLQuantizationType] | np.ndarray],
                   metadata: Mapping[str, Any] | None = None) -> Path:
    """Hand-made GGUF. ``arch`` may be any string (unknown architectures) or None (no key).

    ``tensors``: name -> (array, qtype) -- float arrays are quantized (K-quants included);
    a uint8 array with a block qtype is taken as already-encoded row bytes -- or a bare
    float array (written as F32).  ``metadata``: key -> plain value (int -> UINT32, float ->
    FLOAT32, str, bool, list), ``(value, GGUFValueType[, sub_type])`` or a ``GGUFValue``.
    """
    specs = []
    for name, item in tensors.items():
        arr, qt = (item, Q.F32) if isinstance(item, np.ndarray) else item
        qt = Q(qt)
        spec = TensorSpec(name, np.zeros(0, np.float32), qt)
        if arr.dtype == np.uint8 and qt not in (Q.F32, Q.F16):
            spec._encoded = arr
            spec.data = np.zeros(gguf.quant_shape_from_byte_shape(arr.shape, qt), np.float32)
        else:
            spec.data = np.asarray(arr, dtype=np.float32)
        specs.append(spec)
    kv = {k: _gguf_value(v) for k, v in (metadata or {}).items()}
    return _write(Path(out_path), arch, kv, specs)


def read_gguf(path: Path | str) -> GGUFSummary:
    reader = gguf.GGUFReader(path)
    meta: dict[str, Any] = {}
    for key, f in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        meta[key] = f.contents()
    tensors = {t.name: (tuple(int(s) for s in reversed(t.shape.tolist())), Q(t.tensor_type))
               for t in reader.tensors}
    return GGUFSummary(meta.get("general.architecture"), meta, tensors, reader)


# ---------------------------------------------------------------------------------------
# numpy forward with llama.cpp's semantics of the written tensors
# ---------------------------------------------------------------------------------------

#: llama.cpp renormalises the top-k router weights for these archs (hard-coded in the graph
#: builders, not read from the file): llama (Mixtral) and qwen3moe yes, qwen2moe and olmoe no.
MOE_NORM_TOPK = {"llama": True, "qwen3moe": True, "qwen2moe": False, "olmoe": False}


def _rms(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def _rope(x: np.ndarray, pos: np.ndarray, base: float, neox: bool, factors: np.ndarray | None) -> np.ndarray:
    """x: (T, H, D). GGML rope: NORM rotates pairs (2i, 2i+1), NEOX rotates (i, i + D/2)."""
    d = x.shape[-1]
    inv = base ** (-np.arange(0, d, 2, dtype=np.float64) / d)
    if factors is not None:
        inv = inv / factors
    ang = pos[:, None, None].astype(np.float64) * inv[None, None, :]
    c, s = np.cos(ang), np.sin(ang)
    if neox:
        a, b = x[..., : d // 2], x[..., d // 2:]
        return np.concatenate([a * c - b * s, a * s + b * c], axis=-1)
    a, b = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = a * c - b * s
    out[..., 1::2] = a * s + b * c
    return out


def _silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def reference_forward(gguf_file: Path | str | GGUFSummary, ids: Iterable[int]) -> np.ndarray:
    """Logits (T, vocab) of a written GGUF, computed in float64 numpy the way llama.cpp reads it.

    Supports llama (dense and Mixtral experts, ``rope_freqs``), qwen2, qwen3, qwen2moe,
    qwen3moe, olmoe.  Handy to check that a file is right (against transformers' logits)
    and as a second opinion for an engine's GGUF import.
    """
    s = gguf_file if isinstance(gguf_file, GGUFSummary) else read_gguf(gguf_file)
    arch, m = s.arch, s.metadata
    W: dict[str, np.ndarray] = {n: s.tensor(n).astype(np.float64) for n in s.tensors}
    n_layer = m[f"{arch}.block_count"]
    n_head = m[f"{arch}.attention.head_count"]
    n_kv = m.get(f"{arch}.attention.head_count_kv", n_head)
    hd = m.get(f"{arch}.attention.key_length", m[f"{arch}.embedding_length"] // n_head)
    eps = m[f"{arch}.attention.layer_norm_rms_epsilon"]
    base = m.get(f"{arch}.rope.freq_base", 10000.0)
    neox = arch not in PERMUTE_QK_ARCHS
    factors = W.get("rope_freqs.weight")
    n_used = m.get(f"{arch}.expert_used_count", 0)
    ids = np.asarray(list(ids))
    T = len(ids)
    pos = np.arange(T)
    x = W["token_embd.weight"][ids]
    mask = np.triu(np.full((T, T), -np.inf), 1)
    for i in range(n_layer):
        b = f"blk.{i}."
        h = _rms(x, W[b + "attn_norm.weight"], eps)
        q, k, v = (h @ W[b + f"attn_{t}.weight"].T + W.get(b + f"attn_{t}.bias", 0.0) for t in "qkv")
        if arch == "olmoe":  # full-width q/k norms before the head split
            q = _rms(q, W[b + "attn_q_norm.weight"], eps)
            k = _rms(k, W[b + "attn_k_norm.weight"], eps)
        q, k, v = q.reshape(T, n_head, hd), k.reshape(T, n_kv, hd), v.reshape(T, n_kv, hd)
        if arch in ("qwen3", "qwen3moe"):
            q = _rms(q, W[b + "attn_q_norm.weight"], eps)
            k = _rms(k, W[b + "attn_k_norm.weight"], eps)
        q, k = _rope(q, pos, base, neox, factors), _rope(k, pos, base, neox, factors)
        rep = n_head // n_kv
        k, v = np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1)
        att = np.einsum("thd,shd->hts", q, k) / math.sqrt(hd) + mask
        att = np.exp(att - att.max(-1, keepdims=True))
        att /= att.sum(-1, keepdims=True)
        o = np.einsum("hts,shd->thd", att, v).reshape(T, n_head * hd)
        x = x + o @ W[b + "attn_output.weight"].T
        h = _rms(x, W[b + "ffn_norm.weight"], eps)
        if b + "ffn_gate_inp.weight" not in W:
            act = _silu(h @ W[b + "ffn_gate.weight"].T) * (h @ W[b + "ffn_up.weight"].T)
            y = act @ W[b + "ffn_down.weight"].T
        else:
            logits = h @ W[b + "ffn_gate_inp.weight"].T
            p = np.exp(logits - logits.max(-1, keepdims=True))
            p /= p.sum(-1, keepdims=True)
            top = np.argsort(-p, axis=-1, kind="stable")[:, :n_used]
            wsel = np.take_along_axis(p, top, axis=-1)
            if MOE_NORM_TOPK[arch]:
                wsel = wsel / wsel.sum(-1, keepdims=True)
            gate, up, down = (W[b + f"ffn_{t}_exps.weight"] for t in ("gate", "up", "down"))
            y = np.zeros_like(h)
            for t in range(T):
                for e, we in zip(top[t], wsel[t]):
                    y[t] += we * ((_silu(gate[e] @ h[t]) * (up[e] @ h[t])) @ down[e].T)
            if b + "ffn_gate_inp_shexp.weight" in W:
                g = 1.0 / (1.0 + np.exp(-(h @ W[b + "ffn_gate_inp_shexp.weight"].reshape(-1))))
                sh = _silu(h @ W[b + "ffn_gate_shexp.weight"].T) * (h @ W[b + "ffn_up_shexp.weight"].T)
                y = y + g[:, None] * (sh @ W[b + "ffn_down_shexp.weight"].T)
        x = x + y
    x = _rms(x, W["output_norm.weight"], eps)
    return x @ W.get("output.weight", W["token_embd.weight"]).T


# ---------------------------------------------------------------------------------------
# random HF checkpoints
# ---------------------------------------------------------------------------------------

HF_KINDS = ("llama", "mistral", "mixtral", "qwen2", "qwen3", "qwen2_moe", "qwen3_moe", "olmoe")

_KIND_ARCH = {
    "llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "mixtral": "MixtralForCausalLM",
    "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM", "qwen2_moe": "Qwen2MoeForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM", "olmoe": "OlmoeForCausalLM",
}

_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
_CHATML = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
           "'<|im_end|>' + '\\n' }}{% endfor %}"
           "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
_CORPUS = ("The quick brown fox jumps over the lazy dog. Hello world! hello there, the cat sat on the mat. "
           "Numbers 123 4567 and code: def f(x): return x * 2\n") * 4


def make_tiny_tokenizer(out_dir: Path | str, vocab_size: int = 300) -> Path:
    """A tiny byte-level BPE (GPT-2 regex) with ChatML specials: tokenizer.json + tokenizer_config.json."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=_SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tk.train_from_iterator([_CORPUS], trainer=trainer)
    tk.save(str(out_dir / "tokenizer.json"))
    (out_dir / "tokenizer_config.json").write_text(json.dumps({
        "add_prefix_space": False,
        "added_tokens_decoder": {
            str(i): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                     "single_word": False, "special": True} for i, t in enumerate(_SPECIALS)},
        "bos_token": "<|endoftext|>", "eos_token": "<|im_end|>", "pad_token": "<|im_end|>",
        "chat_template": _CHATML, "model_max_length": 256, "tokenizer_class": "PreTrainedTokenizerFast",
    }, indent=2))
    return out_dir


def _save_safetensors(path: Path, tensors: Mapping[str, np.ndarray], dtype: str) -> None:
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    blobs = []
    off = 0
    for name, arr in tensors.items():
        a = np.asarray(arr, dtype=np.float32)
        if dtype == "bf16":
            u = a.view(np.uint32)
            b = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype("<u2").tobytes()  # round to nearest even
            st = "BF16"
        elif dtype == "f16":
            b, st = a.astype("<f2").tobytes(), "F16"
        else:
            b, st = a.astype("<f4").tobytes(), "F32"
        header[name] = {"dtype": st, "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    path.write_bytes(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def make_random_hf(hf_dir: Path | str, kind: str = "llama", *, hidden: int = 64, intermediate: int = 96,
                   n_layer: int = 2, n_head: int = 4, n_head_kv: int = 2, head_dim: int | None = None,
                   vocab_size: int | None = None, n_expert: int = 4, n_expert_used: int = 2,
                   moe_intermediate: int = 32, shared_intermediate: int = 48, dtype: str = "f32",
                   n_shards: int = 1, fused_experts: bool = False, tie_embeddings: bool = False,
                   rope_scaling: dict | None = None, rope_theta: float = 10000.0, seed: int = 0,
                   tokenizer_from: Path | str | None = None, std: float = 0.05) -> Path:
    """Write a randomly initialised HF checkpoint of ``kind`` with standard HF tensor names.

    MoE experts are per expert (``...experts.{e}.gate_proj`` / Mixtral ``w1/w2/w3``) or,
    with ``fused_experts``, transformers-5 style 3-D ``mlp.experts.gate_up_proj`` (E, 2F, H)
    and ``mlp.experts.down_proj`` (E, H, F).  ``dtype``: f32, f16 or bf16.  The tokenizer is
    copied from ``tokenizer_from`` or built with :func:`make_tiny_tokenizer`.
    """
    if kind not in HF_KINDS:
        raise ValueError(f"kind must be one of {HF_KINDS}")
    hf_dir = Path(hf_dir)
    hf_dir.mkdir(parents=True, exist_ok=True)
    if tokenizer_from is not None:
        for f in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(Path(tokenizer_from) / f, hf_dir / f)
    else:
        make_tiny_tokenizer(hf_dir)
    tj = json.loads((hf_dir / "tokenizer.json").read_text())
    n_tok = max([*tj["model"]["vocab"].values(), *(a["id"] for a in tj.get("added_tokens", []))]) + 1
    V = vocab_size or n_tok
    hd = head_dim or hidden // n_head
    rng = np.random.default_rng(seed)

    def w(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * std).astype(np.float32)

    def norm(n: int) -> np.ndarray:
        return (1.0 + rng.standard_normal(n) * 0.1).astype(np.float32)

    moe = kind in ("mixtral", "qwen2_moe", "qwen3_moe", "olmoe")
    F_exp = intermediate if kind == "mixtral" else moe_intermediate
    t: dict[str, np.ndarray] = {"model.embed_tokens.weight": w(V, hidden)}
    for i in range(n_layer):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = norm(hidden)
        t[p + "self_attn.q_proj.weight"] = w(n_head * hd, hidden)
        t[p + "self_attn.k_proj.weight"] = w(n_head_kv * hd, hidden)
        t[p + "self_attn.v_proj.weight"] = w(n_head_kv * hd, hidden)
        if kind in ("qwen2", "qwen2_moe"):
            t[p + "self_attn.q_proj.bias"] = w(n_head * hd)
            t[p + "self_attn.k_proj.bias"] = w(n_head_kv * hd)
            t[p + "self_attn.v_proj.bias"] = w(n_head_kv * hd)
        t[p + "self_attn.o_proj.weight"] = w(hidden, n_head * hd)
        if kind in ("qwen3", "qwen3_moe"):
            t[p + "self_attn.q_norm.weight"] = norm(hd)
            t[p + "self_attn.k_norm.weight"] = norm(hd)
        if kind == "olmoe":
            t[p + "self_attn.q_norm.weight"] = norm(n_head * hd)
            t[p + "self_attn.k_norm.weight"] = norm(n_head_kv * hd)
        t[p + "post_attention_layernorm.weight"] = norm(hidden)
        if not moe:
            t[p + "mlp.gate_proj.weight"] = w(intermediate, hidden)
            t[p + "mlp.up_proj.weight"] = w(intermediate, hidden)
            t[p + "mlp.down_proj.weight"] = w(hidden, intermediate)
            continue
        gate = w(n_expert, F_exp, hidden)
        up = w(n_expert, F_exp, hidden)
        down = w(n_expert, hidden, F_exp)
        if fused_experts:
            t[p + "mlp.gate.weight"] = w(n_expert, hidden)
            t[p + "mlp.experts.gate_up_proj"] = np.concatenate([gate, up], axis=1)
            t[p + "mlp.experts.down_proj"] = down
        elif kind == "mixtral":
            t[p + "block_sparse_moe.gate.weight"] = w(n_expert, hidden)
            for e in range(n_expert):
                t[p + f"block_sparse_moe.experts.{e}.w1.weight"] = gate[e]
                t[p + f"block_sparse_moe.experts.{e}.w2.weight"] = down[e]
                t[p + f"block_sparse_moe.experts.{e}.w3.weight"] = up[e]
        else:
            t[p + "mlp.gate.weight"] = w(n_expert, hidden)
            for e in range(n_expert):
                t[p + f"mlp.experts.{e}.gate_proj.weight"] = gate[e]
                t[p + f"mlp.experts.{e}.up_proj.weight"] = up[e]
                t[p + f"mlp.experts.{e}.down_proj.weight"] = down[e]
        if kind == "qwen2_moe":
            t[p + "mlp.shared_expert.gate_proj.weight"] = w(shared_intermediate, hidden)
            t[p + "mlp.shared_expert.up_proj.weight"] = w(shared_intermediate, hidden)
            t[p + "mlp.shared_expert.down_proj.weight"] = w(hidden, shared_intermediate)
            t[p + "mlp.shared_expert_gate.weight"] = w(1, hidden)
    t["model.norm.weight"] = norm(hidden)
    if not tie_embeddings:
        t["lm_head.weight"] = w(V, hidden)
    t = dict(sorted(t.items()))

    cfg: dict[str, Any] = {
        "architectures": [_KIND_ARCH[kind]], "model_type": kind, "hidden_size": hidden,
        "intermediate_size": intermediate, "num_hidden_layers": n_layer, "num_attention_heads": n_head,
        "num_key_value_heads": n_head_kv, "head_dim": hd, "max_position_embeddings": 256,
        "rms_norm_eps": 1e-6 if kind.startswith("qwen") else 1e-5, "rope_theta": rope_theta,
        "rope_scaling": rope_scaling, "vocab_size": V, "tie_word_embeddings": tie_embeddings,
        "bos_token_id": 0, "eos_token_id": 2, "hidden_act": "silu",
        "torch_dtype": {"f32": "float32", "f16": "float16", "bf16": "bfloat16"}[dtype],
    }
    if kind == "mixtral":
        cfg.update(num_local_experts=n_expert, num_experts_per_tok=n_expert_used)
    elif kind in ("qwen2_moe", "qwen3_moe"):
        cfg.update(num_experts=n_expert, num_experts_per_tok=n_expert_used,
                   moe_intermediate_size=moe_intermediate,
                   norm_topk_prob=kind == "qwen3_moe", decoder_sparse_step=1, mlp_only_layers=[])
        if kind == "qwen2_moe":
            cfg.update(shared_expert_intermediate_size=shared_intermediate, qkv_bias=True)
    elif kind == "olmoe":
        cfg.update(num_experts=n_expert, num_experts_per_tok=n_expert_used, norm_topk_prob=False,
                   clip_qkv=None)
        cfg["intermediate_size"] = moe_intermediate
    (hf_dir / "config.json").write_text(json.dumps(cfg, indent=2))

    for old in hf_dir.glob("model*.safetensors*"):
        old.unlink()
    names = list(t)
    if n_shards <= 1:
        _save_safetensors(hf_dir / "model.safetensors", t, dtype)
    else:
        chunks = [names[i::n_shards] for i in range(n_shards)]
        weight_map = {}
        for k, chunk in enumerate(chunks):
            fname = f"model-{k + 1:05d}-of-{n_shards:05d}.safetensors"
            _save_safetensors(hf_dir / fname, {n: t[n] for n in sorted(chunk)}, dtype)
            weight_map.update({n: fname for n in chunk})
        (hf_dir / "model.safetensors.index.json").write_text(json.dumps(
            {"metadata": {"total_size": 0}, "weight_map": dict(sorted(weight_map.items()))}, indent=2))
    return hf_dir


def _default_tokenizer_dir() -> Path | None:
    d = Path(__file__).resolve().parent / "fixtures" / "hf" / "llama"
    return d if (d / "tokenizer.json").is_file() and (d / "tokenizer_config.json").is_file() else None


def make_wide_hf(hf_dir: Path | str, *, n_embd: int = 256, n_ff: int = 512, n_layer: int = 2, n_head: int = 4,
                 n_head_kv: int = 2, seed: int = 0, tokenizer_from: Path | str | None = None,
                 **kwargs: Any) -> Path:
    """Random llama HF checkpoint whose rows are 256/512 wide (every K-quant applies)."""
    tok = tokenizer_from if tokenizer_from is not None else _default_tokenizer_dir()
    vocab = kwargs.pop("vocab_size", None)
    if vocab is None and tok is not None:
        vocab = json.loads((Path(tok) / "tokenizer.json").read_text())["model"]["vocab"].__len__()
        vocab = max(vocab, 256)
    return make_random_hf(hf_dir, "llama", hidden=n_embd, intermediate=n_ff, n_layer=n_layer, n_head=n_head,
                          n_head_kv=n_head_kv, seed=seed, tokenizer_from=tok, vocab_size=vocab, **kwargs)


def make_wide_gguf(out_path: Path | str, arch: str = "llama", n_embd: int = 256, *, n_ff: int = 512,
                   n_layer: int = 2, n_head: int = 4, n_head_kv: int = 2, qtypes: QTypes = Q.Q4_K,
                   seed: int = 0, hf_dir: Path | str | None = None, **kwargs: Any) -> Path:
    """Write a random dense llama-arch GGUF with 256/512-wide rows.

    The HF checkpoint it comes from is kept in ``hf_dir`` (default: ``<out_path stem>_hf``
    next to the file) so tests can compare against the unquantized weights; use
    ``convert_hf(hf_dir, qtypes=...)`` for the plan.  ``qtypes`` defaults to Q4_K for every
    non-1-D weight (token_embd and output included).
    """
    if arch != "llama":
        raise ValueError("make_wide_gguf writes the dense llama architecture only")
    out_path = Path(out_path)
    hf_dir = Path(hf_dir) if hf_dir is not None else out_path.with_name(out_path.stem + "_hf")
    make_wide_hf(hf_dir, n_embd=n_embd, n_ff=n_ff, n_layer=n_layer, n_head=n_head, n_head_kv=n_head_kv,
                 seed=seed, **kwargs)
    return write_gguf(hf_dir, out_path, qtypes=qtypes)
