"""The GGUF header (metadata and tensor table) read with struct, without touching tensor data.

gguf.GGUFReader builds a numpy memmap view per field part, slow on a large vocabulary. This reads
the same records in one pass: metadata values as Python values (what `ReaderField.contents()`
gives), tensors as (name, ggml shape, type id, absolute data offset).
`check_layout` (gguf_file.py) has already bounded every count against the file.
Layout (little-endian): magic, u32 version, u64 n_tensors, u64 n_kv, the key/values, the tensor
infos, then the data at the next multiple of general.alignment (32 by default).
"""
from __future__ import annotations

import mmap
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from engine.errors import SourceFormatError

# GGUF value type -> (struct code, numpy dtype) for the fixed-size ones
_FIXED = {0: ("B", np.uint8), 1: ("b", np.int8), 2: ("H", np.uint16), 3: ("h", np.int16), 4: ("I", np.uint32),
          5: ("i", np.int32), 6: ("f", np.float32), 7: ("?", np.bool_), 10: ("Q", np.uint64), 11: ("q", np.int64),
          12: ("d", np.float64)}
_STRING, _ARRAY = 8, 9


@dataclass(frozen=True)
class TensorInfo:
    """One tensor-table entry, named as gguf.ReaderTensor names them (so callers read either)."""
    name: str
    shape: tuple[int, ...]  # ggml order: innermost dimension first
    tensor_type: int  # GGML type id
    data_offset: int  # absolute, in the file


@dataclass(frozen=True)
class GGUFHeader:
    version: int
    fields: dict[str, Any]
    tensors: list[TensorInfo]
    data_start: int


def read_header(path: str | Path, progress: Callable[[float], None] | None = None,
                header_bytes: int | None = None) -> GGUFHeader:
    """Metadata and tensor table of a GGUF file; `progress` gets the fraction of the header read
    every 256 KB, against `header_bytes` (check_layout's answer; the whole file when not known)."""
    path = Path(path)
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        return _Parser(path, buf, progress, header_bytes).run()


class _Parser:
    def __init__(self, path: Path, buf, progress: Callable[[float], None] | None, header_bytes: int | None):
        self.path, self.buf, self.at, self.progress = path, buf, 0, progress
        self._said = 0
        self.estimate = max(1, header_bytes or len(buf))

    def _u(self, fmt: str, n: int) -> Any:
        if self.at + n > len(self.buf):
            raise SourceFormatError(f"{self.path}: GGUF header is truncated at byte {self.at}")
        v = struct.unpack_from(fmt, self.buf, self.at)
        self.at += n
        return v[0]

    def _str(self) -> str:
        n = self._u("<Q", 8)
        if self.at + n > len(self.buf):
            raise SourceFormatError(f"{self.path}: GGUF string of {n} bytes at byte {self.at} runs past the file")
        s = self.buf[self.at:self.at + n].decode("utf-8", "replace")
        self.at += n
        return s

    def _tick(self) -> None:
        if self.progress is not None and self.at - self._said >= 1 << 18:
            self._said = self.at
            self.progress(min(0.99, self.at / self.estimate))

    def _value(self, vtype: int) -> Any:
        if vtype in _FIXED:
            code, _ = _FIXED[vtype]
            return self._u("<" + code, struct.calcsize(code))
        if vtype == _STRING:
            return self._str()
        if vtype != _ARRAY:
            raise SourceFormatError(f"{self.path}: GGUF value type {vtype} at byte {self.at} is not defined")
        item, count = self._u("<I", 4), self._u("<Q", 8)
        if item in _FIXED:
            dtype = np.dtype(_FIXED[item][1]).newbyteorder("<")
            end = self.at + count * dtype.itemsize
            if end > len(self.buf):
                raise SourceFormatError(f"{self.path}: GGUF array of {count} items runs past the file")
            out = np.frombuffer(self.buf, dtype, count, self.at).tolist()
            self.at = end
            return out
        out = []
        for i in range(count):
            out.append(self._value(item))
            if not i & 4095:
                self._tick()
        return out

    def run(self) -> GGUFHeader:
        if bytes(self.buf[:4]) != b"GGUF":
            raise SourceFormatError(f"{self.path}: not a GGUF file (magic {bytes(self.buf[:4])!r})")
        self.at = 4
        version = self._u("<I", 4)
        n_tensors, n_kv = self._u("<Q", 8), self._u("<Q", 8)
        fields: dict[str, Any] = {}
        for _ in range(n_kv):
            key = self._str()
            fields[key] = self._value(self._u("<I", 4))
            self._tick()
        infos = []
        for _ in range(n_tensors):
            name = self._str()
            n_dims = self._u("<I", 4)
            dims = tuple(self._u("<Q", 8) for _ in range(n_dims))
            infos.append((name, dims, self._u("<I", 4), self._u("<Q", 8)))
        alignment = fields.get("general.alignment", 32)
        start = -(-self.at // alignment) * alignment
        if self.progress is not None:
            self.progress(1.0)
        return GGUFHeader(version, fields, [TensorInfo(n, d, t, start + o) for n, d, t, o in infos], start)
