"""GGUF files: the header read with struct (gguf_header), tensor data with pread.

Quantized blocks are copied as they are (lossless). ggml lists shapes innermost first; here
every shape is in numpy order (rows, row length). For the `llama` architecture llama.cpp's
converter reorders the rows of attn_q/attn_k (interleaved rotary pairs); we undo that so
every architecture uses the Hugging Face row order.
"""
from __future__ import annotations

import math
import mmap
import struct
from collections.abc import Callable
from pathlib import Path

import numpy as np

from engine import quant
from engine.convert.gguf_header import read_header
from engine.convert.source import FileReader, SourceTensor
from engine.convert.tokenizer_import import TokenizerBundle, from_gguf_fields
from engine.errors import ConfigError, SourceFormatError, UnsupportedArchitectureError
from engine.gguf_index import unpermute_order
from engine.model_dir import ModelConfig
from engine.arch import FAMILIES, GGUF_ARCHS, family, gguf_spec  # what each GGUF architecture is

# Bounds of the integer hyper-parameters (arch.KEY; a family's own keys: Family.gguf_limits): far
# beyond any real model, far below what would make an allocation fail or a loop run for hours.
LIMITS = {"block_count": (1, 4096), "embedding_length": (1, 1 << 20), "attention.head_count": (1, 4096),
          "attention.head_count_kv": (1, 4096), "attention.key_length": (1, 1 << 16),
          "feed_forward_length": (1, 1 << 22), "expert_feed_forward_length": (1, 1 << 22),
          "expert_shared_feed_forward_length": (0, 1 << 22), "expert_count": (0, 1 << 16),
          "expert_used_count": (1, 1 << 16), "vocab_size": (1, 1 << 24), "context_length": (1, 1 << 24),
          "rope.dimension_count": (2, 1 << 16)} | {k: v for f in FAMILIES for k, v in f.gguf_limits.items()}


# --- the layout, checked before the gguf package reads anything ---------------------------------
# The package walks every array item in Python and trusts every count and offset: a corrupt
# count of 2^40 would hang it, a dimension past the file would allocate. One pass over the
# header checks each count against the bytes that remain, so those are errors naming the key
# or tensor, raised before any allocation.
_SCALAR = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}  # GGUF value type -> bytes
_STRING, _ARRAY = 8, 9
MAX_DIMS = 4  # GGML_MAX_DIMS


class _Cursor:
    def __init__(self, path: Path, buf) -> None:
        self.path, self.buf, self.at = path, buf, 0

    def take(self, n: int, what: str) -> int:
        if n < 0 or self.at + n > len(self.buf):
            raise SourceFormatError(f"{self.path}: GGUF {what} needs {n} bytes at byte {self.at} but the file has "
                                    f"{len(self.buf)} (truncated or corrupt)")
        at, self.at = self.at, self.at + n
        return at

    def u32(self, what: str) -> int:
        return struct.unpack_from("<I", self.buf, self.take(4, what))[0]

    def u64(self, what: str) -> int:
        return struct.unpack_from("<Q", self.buf, self.take(8, what))[0]

    def string(self, what: str) -> bytes:
        n = self.u64(what)
        at = self.take(n, what)
        return bytes(self.buf[at:at + n])

    def value(self, vtype: int, what: str, depth: int = 0) -> None:
        if vtype in _SCALAR:
            self.take(_SCALAR[vtype], what)
        elif vtype == _STRING:
            self.take(self.u64(what), what)  # skipped, not copied: a vocabulary is 10^5 of them
        elif vtype == _ARRAY and depth < 2:
            item, count = self.u32(what), self.u64(what)
            least = _SCALAR.get(item, 8)  # a string or an array takes at least its 8-byte count
            if count * least > len(self.buf) - self.at:
                raise SourceFormatError(f"{self.path}: GGUF {what} claims {count} items, more than the "
                                        f"{len(self.buf) - self.at} bytes left in the file hold")
            if item in _SCALAR:
                self.take(count * least, what)
            else:
                for _ in range(count):
                    self.value(item, what, depth + 1)
        else:
            raise SourceFormatError(f"{self.path}: GGUF {what} has value type {vtype}, which GGUF does not define")


def check_layout(path: Path) -> int:
    """Walk the header: every count, string, array and extent must fit the file; the header's size."""
    import gguf
    with open(path, "rb") as f:
        size = f.seek(0, 2)
        if size < 24:
            raise SourceFormatError(f"{path}: GGUF file of {size} bytes is truncated")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            c = _Cursor(path, buf)
            c.take(4, "magic")
            version = c.u32("version")
            if version not in (2, 3):
                raise SourceFormatError(f"{path}: GGUF version {version} is not supported (2 or 3)")
            n_tensors, n_kv = c.u64("tensor count"), c.u64("metadata count")
            if n_kv * 13 > size or n_tensors * 24 > size:  # the least one entry can take
                raise SourceFormatError(f"{path}: GGUF header claims {n_kv} metadata keys and {n_tensors} tensors, "
                                        f"more than {size} bytes can hold")
            alignment = 32
            for _ in range(n_kv):
                key = c.string("metadata key").decode("utf-8", "replace")
                vtype = c.u32(f"metadata {key!r}")
                at = c.at
                c.value(vtype, f"metadata {key!r}")
                if key == "general.alignment":  # any integer type (UINT64 0 once divided by zero)
                    code = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 10: "Q", 11: "q"}.get(vtype)
                    alignment = struct.unpack_from("<" + code, buf, at)[0] if code else 0
                    if alignment <= 0 or alignment & (alignment - 1):
                        raise SourceFormatError(f"{path}: GGUF metadata 'general.alignment' = {alignment} is not "
                                                f"a power of two")
            extents = []
            for _ in range(n_tensors):
                name = c.string("tensor name").decode("utf-8", "replace")
                n_dims = c.u32(f"tensor {name!r}")
                if not 1 <= n_dims <= MAX_DIMS:
                    raise SourceFormatError(f"{path}: tensor {name!r} has {n_dims} dimensions (GGUF: 1 to {MAX_DIMS})")
                dims = [c.u64(f"tensor {name!r}") for _ in range(n_dims)]
                ttype, offset = c.u32(f"tensor {name!r}"), c.u64(f"tensor {name!r}")
                try:
                    block, type_size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(ttype)]
                except (ValueError, KeyError):
                    raise SourceFormatError(f"{path}: tensor {name!r} has GGML type id {ttype}, which GGML does "
                                            f"not define") from None
                elements = math.prod(dims)
                if 0 in dims or dims[0] % block:
                    raise SourceFormatError(f"{path}: tensor {name!r} has dimensions {dims} (each must be "
                                            f"positive, the first a multiple of {block})")
                extents.append((name, offset, elements // block * type_size))
            data = -(-c.at // alignment) * alignment
            for name, offset, nbytes in extents:
                if data + offset + nbytes > size:
                    raise SourceFormatError(f"{path}: tensor {name!r} ends at byte {data + offset + nbytes} but the "
                                            f"file has {size} bytes (truncated?)")
            return c.at


class GGUFModel:
    def __init__(self, path: Path, progress: Callable[[float], None] | None = None):
        self.path = path
        with open(path, "rb") as f:
            magic = f.read(4)
        if magic != b"GGUF":
            raise SourceFormatError(f"{path}: not a GGUF file (magic {magic!r})")
        size = self.header_bytes = check_layout(path)
        # the header only (gguf_header, much faster than gguf.GGUFReader)
        header = read_header(path, progress, size)
        self.fields: dict = header.fields
        self.file = FileReader(path)
        self.tensors: dict[str, SourceTensor] = {}
        for t in header.tensors:
            self.tensors[t.name] = self._tensor(t)

    def _tensor(self, t) -> SourceTensor:
        try:
            qtype = quant.get(int(t.tensor_type))
            if qtype.base is not None:  # our repacked ids are no GGML type
                raise quant.QuantError(qtype.name)
        except quant.QuantError:  # raised while the file is opened: before any conversion work
            supported = ", ".join(q.name.upper() for q in quant.BY_NAME.values() if q.base is None)
            import gguf
            try:
                type_name = gguf.GGMLQuantizationType(t.tensor_type).name
            except ValueError:
                type_name = str(t.tensor_type)
            raise SourceFormatError(f"{self.path}: tensor {t.name!r} has GGML type {type_name}, "
                                    f"which Colibri does not import; {quant.PRESETS_ADVICE} "
                                    f"(supported types: {supported})") from None
        shape = tuple(int(d) for d in reversed(t.shape))
        if qtype.is_block and shape[-1] % qtype.block_size:
            raise SourceFormatError(f"{self.path}: tensor {t.name!r} row length {shape[-1]} is not a "
                                    f"multiple of the {qtype.name} block")
        end = t.data_offset + qtype.nbytes(shape)
        if end > self.file.size:
            raise SourceFormatError(f"{self.path}: tensor {t.name!r} ends at byte {end} but the file has "
                                    f"{self.file.size} bytes (truncated?)")
        return SourceTensor(t.name, shape, qtype,
                            self.file.rows(t.name, t.data_offset, qtype.row_bytes(shape[-1]), qtype.storage),
                            t.data_offset)

    def value(self, key: str, default=None, required: bool = False):
        arch = self.fields.get("general.architecture")
        value = self.fields.get(f"{arch}.{key}", default)
        if value is None and required:
            raise ConfigError(f"{self.path}: GGUF metadata has no {arch}.{key}")
        return value

    def integer(self, key: str, default=None, required: bool = False, high: int | None = None) -> int:
        """An integer hyper-parameter within LIMITS (absurd values are errors naming the key)."""
        value = self.value(key, default, required)
        lo, hi = LIMITS[key]
        hi = hi if high is None else high
        what = f"{self.path}: GGUF metadata {self.fields.get('general.architecture')}.{key}"
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise ConfigError(f"{what} = {value!r} is not an integer")
        if not lo <= int(value) <= hi:
            raise ConfigError(f"{what} = {value} is out of range (expected {lo} to {hi})")
        return int(value)

    def positive(self, key: str, default: float) -> float:
        value = self.value(key, default)
        if isinstance(value, bool) or not isinstance(value, (int, float, np.number)) or not 0 < value < 1e30:
            raise ConfigError(f"{self.path}: GGUF metadata {self.fields.get('general.architecture')}.{key} = "
                              f"{value!r} is not a positive number")
        return float(value)

    def config(self) -> ModelConfig:
        """The model's shape from the metadata: shared keys here, the rest from its family's gguf_config."""
        garch = self.fields.get("general.architecture")
        if garch not in GGUF_ARCHS:
            raise UnsupportedArchitectureError(
                f"{self.path}: GGUF architecture {garch!r} is not supported; supported: "
                f"{', '.join(GGUF_ARCHS)}")
        experts = self.integer("expert_count", 0)
        sp = gguf_spec(garch, experts)  # llama with experts is Mixtral-style
        hidden = self.integer("embedding_length", required=True)
        heads = self.integer("attention.head_count", required=True)
        per_layer = self.kv_per_layer() is not None  # the family's gguf_config reads such a list
        moe = experts > 1
        # experts' width: its own key where the arch has one (Qwen MoE), else the FFN width
        ff_key = "expert_feed_forward_length" if moe and self.value("expert_feed_forward_length") else \
            "feed_forward_length"
        tokens = self.fields.get("tokenizer.ggml.tokens") or []
        head_dim = self.integer("attention.key_length", hidden // heads)
        scaling = None
        kind = self.value("rope.scaling.type")
        if kind and kind != "none":
            if kind not in ("linear", "yarn"):
                raise ConfigError(f"{self.path}: rope scaling {kind!r} is not supported (linear, yarn)")
            scaling = {"type": kind, "factor": self.positive("rope.scaling.factor", 1.0),
                       "original_max_position_embeddings": self.value("rope.scaling.original_context_length")}
            if kind == "yarn":
                scaling |= {"beta_fast": self.positive("rope.scaling.yarn_beta_fast", 32.0),
                            "beta_slow": self.positive("rope.scaling.yarn_beta_slow", 1.0), "truncate": True}
        fields = dict(
            architecture=sp.name,
            vocab_size=self.integer("vocab_size", len(tokens)) or len(tokens),
            hidden_size=hidden,
            num_layers=self.integer("block_count", required=True),
            num_heads=heads,
            num_kv_heads=None if per_layer else self.integer("attention.head_count_kv", heads),
            head_dim=head_dim,
            intermediate_size=self.integer(ff_key, required=True) if not isinstance(self.value(ff_key), list) else 1,
            # (a width per layer: the family's gguf_config reads the list, Gemma 4 E2B/E4B)
            num_experts=experts if moe else 1,
            top_k=self.integer("expert_used_count", required=moe, high=experts) if moe else 1,
            norm_topk_prob=bool(self.value("expert_weights_norm", sp.gguf_renormalise)),
            shared_expert_intermediate_size=self.integer("expert_shared_feed_forward_length", 0)
            if sp.shared_expert != "none" else 0,
            rms_norm_eps=self.positive("attention.layer_norm_rms_epsilon", 1e-6),
            rope_theta=self.positive("rope.freq_base", 10000.0),
            rope_scaling=scaling,
            rope_freq_factors="rope_freqs.weight" in self.tensors,
            max_position_embeddings=self.integer("context_length", 4096),
            tie_word_embeddings="output.weight" not in self.tensors,
            attention_bias="blk.0.attn_q.bias" in self.tensors,
            qk_norm=sp.qk_norm,
            layer_types=None,
            partial_rotary_factor=self.integer("rope.dimension_count", head_dim) / head_dim if sp.partial_rotary else 1.0,
        )
        fam = family(sp.name)
        fields |= fam.gguf_config(fields, self) if fam.gguf_config else {}
        if fields["num_kv_heads"] is None:
            raise self.kv_error(self.kv_per_layer())
        if heads % fields["num_kv_heads"]:
            raise ConfigError(f"{self.path}: GGUF metadata {garch}.attention.head_count = {heads} is not a multiple "
                              f"of {garch}.attention.head_count_kv = {fields['num_kv_heads']}")
        window, kinds = self.value("attention.sliding_window"), fields["layer_types"]
        fields["sliding_window"] = int(window) if window and kinds and "sliding_attention" in kinds else None
        return ModelConfig(**fields)  # type: ignore[arg-type]

    def kv_per_layer(self) -> list[int] | None:
        """attention.head_count_kv where it lists each layer's KV heads, else None."""
        value = self.value("attention.head_count_kv")
        return [int(v) for v in value] if isinstance(value, list) else None

    def kv_error(self, per: list[int] | None) -> ConfigError:
        return ConfigError(f"{self.path}: GGUF metadata {self.fields.get('general.architecture')}."
                           f"attention.head_count_kv = {per} is not one KV head count per layer (0 for a short-conv "
                           f"layer) that this engine runs")

    def source_tensor(self, name: str, cfg: ModelConfig) -> SourceTensor:
        """A GGUF tensor in Hugging Face row order (undoes llama.cpp's q/k permutation)."""
        t = self.tensors[name]
        garch = self.fields.get("general.architecture")
        sp = GGUF_ARCHS.get(garch)
        if sp is not None and sp.gguf_permuted_qk and name.endswith((".attn_q.weight", ".attn_k.weight")):
            heads = cfg.num_heads if ".attn_q." in name else cfg.num_kv_heads
            if t.rows % (2 * heads) or not t.rows:
                raise ConfigError(f"{self.path}: tensor {name!r} has {t.rows} rows, which do not split into "
                                  f"{heads} heads of rotary pairs (a head count that does not match the weights?)")
            return t.permute_rows(unpermute_order(heads, t.rows), ("unpermute", heads))
        return t

    def tokenizer(self) -> TokenizerBundle:
        keys = {k: v for k, v in self.fields.items() if k.startswith("tokenizer.")}
        return from_gguf_fields(keys, str(self.path))

    def close(self) -> None:
        self.file.close()
