"""A GGUF run in place: the model directory holds an index of each tensor's bytes in the GGUF file.

    gguf_index.json  {"format": "colibri-gguf-index", "version": 1,
                      "gguf": {"path", "size", "mtime_ns", "header_bytes", "header_sha256"},
                      "tensors": {internal name: {"type_id", "shape", "offset", "nbytes",
                                                  "stored_type_id"?, "unpermute"?}}}

Internal names and shapes are the model directory's (engine.model_dir.expected_tensors): a routed
expert's gate, up and down are slices of the layer's stacked ffn_*_exps tensors, each one contiguous
run of rows. `offset` is absolute in the GGUF. Where the engine wants a tensor other than as stored
(a float router llama.cpp kept in f16; llama's q/k rows in rotary-pair order) the entry names the
stored type or the head count, and the tensor is made so in memory at load: those are small.

The file is checked on every open (its path, size and mtime, and a hash of its header: never the data,
18 GB would take minutes), so a GGUF moved, cut short or rewritten since is an error naming it, never
wrong weights.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from engine import quant
from engine.errors import BadHeaderError, MissingFileError, SizeMismatchError
from engine.tensorfile import TensorInfo

INDEX_FILE = "gguf_index.json"
INDEX_FORMAT, INDEX_VERSION = "colibri-gguf-index", 1


@dataclass(frozen=True)
class IndexedTensor:
    """How one tensor the engine reads is made from the GGUF's bytes."""
    info: TensorInfo  # as the engine sees it; offset/nbytes: its bytes in the GGUF
    stored: quant.QuantType  # its type in the GGUF (info.qtype where no conversion)
    unpermute: int = 0  # heads: rows in gguf_file.unpermute_order (0: as stored)


def header_sha256(path: Path, header_bytes: int) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read(header_bytes)).hexdigest()


def write_index(path: Path, gguf: Path, header_bytes: int, tensors: dict[str, dict]) -> None:
    """`tensors`: internal name -> {"type_id", "shape", "offset", "nbytes", and the optional keys}."""
    st = gguf.stat()
    doc = {"format": INDEX_FORMAT, "version": INDEX_VERSION,
           "gguf": {"path": str(gguf.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns,
                    "header_bytes": header_bytes, "header_sha256": header_sha256(gguf, header_bytes)},
           "tensors": tensors}
    path.write_text(json.dumps(doc, separators=(",", ":")) + "\n", encoding="utf-8")


def _again(gguf: Path) -> str:
    return (f"the model folder indexes {gguf} in place: put the file back as it was, or convert it again "
            f"(colibri-convert --model_path GGUF --output_path FOLDER --force)")


def read_index(path: Path) -> tuple[Path, dict[str, IndexedTensor]]:
    """The GGUF's path and every indexed tensor, after checking the GGUF is the file indexed."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        g, entries = doc["gguf"], doc["tensors"]
        gguf, size, mtime, hb, sha = Path(g["path"]), int(g["size"]), int(g["mtime_ns"]), int(g["header_bytes"]), \
            str(g["header_sha256"])
        if doc.get("format") != INDEX_FORMAT or not isinstance(entries, dict):
            raise ValueError(f"format {doc.get('format')!r}, expected {INDEX_FORMAT!r}")
        if int(doc.get("version", 0)) > INDEX_VERSION:
            raise ValueError(f"version {doc.get('version')} is newer than this Colibri reads ({INDEX_VERSION})")
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise BadHeaderError(f"{path}: not a readable GGUF index: {e}") from None
    if not gguf.is_absolute():
        raise BadHeaderError(f"{path}: the GGUF path {str(gguf)!r} is not absolute")
    try:
        st = gguf.stat()
    except OSError as e:
        raise MissingFileError(f"{gguf}: the GGUF file is gone ({e.strerror}; moved or deleted?); "
                               f"{_again(gguf)}") from None
    if st.st_size != size:
        raise SizeMismatchError(f"{gguf}: the GGUF file has {st.st_size} bytes, {size} when it was indexed "
                                f"(truncated or rewritten?); {_again(gguf)}")
    if st.st_mtime_ns != mtime or header_sha256(gguf, hb) != sha:
        raise SizeMismatchError(f"{gguf}: the GGUF file was modified after it was indexed; {_again(gguf)}")
    out = {}
    for name, e in entries.items():
        try:
            qt, stored = quant.get(int(e["type_id"])), quant.get(int(e.get("stored_type_id", e["type_id"])))
            shape, offset, nbytes = tuple(int(d) for d in e["shape"]), int(e["offset"]), int(e["nbytes"])
            heads = int(e.get("unpermute", 0))
            ok = nbytes == stored.nbytes(shape) and offset >= hb and offset + nbytes <= size and heads >= 0
        except (KeyError, TypeError, ValueError, quant.QuantError) as err:
            raise BadHeaderError(f"{path}: tensor {name!r}: {err!r}") from None
        if not ok:
            raise BadHeaderError(f"{path}: tensor {name!r}: {nbytes} bytes at {offset} do not fit "
                                 f"{stored.name}{list(shape)} inside the {size}-byte GGUF")
        out[name] = IndexedTensor(TensorInfo(name, qt, shape, offset, nbytes), stored, heads)
    return gguf, out


def unpermute_order(n_head: int, rows: int) -> np.ndarray:
    """Row order that turns llama.cpp's rotary layout back into Hugging Face's: per head,
    llama.cpp stores row (j, t) (pair j, half t) where HF has (t, j)."""
    return np.arange(rows).reshape(n_head, rows // n_head // 2, 2).swapaxes(1, 2).reshape(-1)


def made_in_memory(t: IndexedTensor, view: np.ndarray) -> np.ndarray:
    """A tensor the engine reads otherwise than stored, from its mapped stored bytes (a copy)."""
    if t.unpermute:
        rows = view.reshape(-1, view.shape[-1]) if view.ndim > 1 else view.reshape(1, -1)
        view = rows[unpermute_order(t.unpermute, rows.shape[0])].reshape(view.shape)
    if t.stored is not t.info.qtype:
        view = quant.quantize(quant.dequantize(view, t.stored), t.info.qtype)
    return np.ascontiguousarray(view)
