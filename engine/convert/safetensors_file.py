"""The one safetensors reader: a header checked against its file, and whole files as arrays.

Parsed here rather than by the `safetensors` package: its numpy API cannot read BF16, and each
lie in a header (sizes, offsets, dtypes) is named precisely. The converter (engine.convert.hf)
reads the header and then rows lazily; `read_tensors` (tests, tools) reads everything at once.
Layout: 8 bytes little-endian header length n, n bytes of JSON {name: {dtype, shape,
data_offsets: [begin, end)}} (+ "__metadata__"), then the data, offsets relative to its start.
"""
from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np

from engine.errors import SourceFormatError

_ITEMSIZE = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1,
             "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}


def read_safetensors_header(path: Path) -> tuple[dict[str, dict], int, int]:
    """(tensor entries, data start, file size); every entry checked against the file."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise SourceFormatError(f"{path}: not a safetensors file ({size} bytes, no header)")
        (hlen,) = struct.unpack("<Q", head)
        if hlen > size - 8 or hlen > 100_000_000:
            raise SourceFormatError(f"{path}: safetensors header claims {hlen} bytes but the file has "
                                    f"{size} (truncated or not a safetensors file)")
        try:
            doc = json.loads(f.read(hlen))
        except (ValueError, UnicodeDecodeError) as e:
            raise SourceFormatError(f"{path}: safetensors header is not valid JSON: {e}") from None
    if not isinstance(doc, dict):
        raise SourceFormatError(f"{path}: safetensors header is not a JSON object")
    doc.pop("__metadata__", None)
    data_start, data_size = 8 + hlen, size - 8 - hlen
    for name, e in doc.items():
        try:
            dtype, shape, (begin, end) = e["dtype"], [int(d) for d in e["shape"]], e["data_offsets"]
        except (KeyError, TypeError, ValueError):
            raise SourceFormatError(f"{path}: tensor {name!r} has a malformed header entry: {e!r}") from None
        if dtype not in _ITEMSIZE:
            raise SourceFormatError(f"{path}: tensor {name!r} has unknown dtype {dtype!r}")
        want = int(np.prod(shape, dtype=np.int64)) * _ITEMSIZE[dtype]
        if end - begin != want or begin < 0:
            raise SourceFormatError(f"{path}: tensor {name!r} is {dtype}{shape} = {want} bytes but its "
                                    f"header offsets [{begin}, {end}) span {end - begin}")
        if end > data_size:
            raise SourceFormatError(f"{path}: tensor {name!r} ends at data byte {end} but the file holds "
                                    f"only {data_size} data bytes (truncated?)")
    return doc, data_start, size


_NUMPY = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "BF16": "<u2", "I64": "<i8", "I32": "<i4", "I16": "<i2",
          "I8": "i1", "U8": "u1", "BOOL": "?"}


def read_tensors(path: Path | str) -> dict[str, tuple[str, np.ndarray]]:
    """name -> (safetensors dtype, array) in header order, every entry checked; BF16 widened to
    float32 (its bits << 16), other dtypes as stored."""
    path = Path(path)
    entries, start, _ = read_safetensors_header(path)
    data = path.read_bytes()
    out = {}
    for name, e in entries.items():
        if e["dtype"] not in _NUMPY:
            raise SourceFormatError(f"{path}: tensor {name!r} has dtype {e['dtype']}, which read_tensors does not hold")
        a, b = e["data_offsets"]
        arr = np.frombuffer(data, np.dtype(_NUMPY[e["dtype"]]), (b - a) // _ITEMSIZE[e["dtype"]], start + a)
        if e["dtype"] == "BF16":
            arr = (arr.astype(np.uint32) << 16).view(np.float32)
        out[name] = (e["dtype"], arr.reshape([int(d) for d in e["shape"]]).copy())
    return out
