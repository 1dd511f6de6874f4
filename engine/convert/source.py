"""Source tensors read lazily, a slice of rows at a time, with `pread` into private buffers (never
mmap, whose pages would stay counted in RSS), so the converter holds about one slice of one tensor.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from engine import quant
from engine.errors import ConversionError, SourceFormatError

RowReader = Callable[[int, int], np.ndarray]  # rows [start, stop) -> stored array


@dataclass(frozen=True)
class SourceTensor:
    """A tensor of a source checkpoint: its shape, storage format and a reader of row ranges
    (rows are the leading dimensions flattened; a 1-D tensor is a single row)."""
    name: str
    shape: tuple[int, ...]
    qtype: quant.QuantType
    read_rows: RowReader = field(repr=False)
    at: int | None = None  # file offset of row 0 where the rows lie in the file as stored (a GGUF's), else None
    reorder: tuple | None = None  # ("unpermute", heads): rows in gguf_file.unpermute_order (llama's q/k)

    @property
    def rows(self) -> int:
        return int(np.prod(self.shape[:-1], dtype=np.int64)) if len(self.shape) > 1 else 1

    @property
    def row_bytes(self) -> int:
        return self.qtype.row_bytes(int(self.shape[-1]))

    @property
    def nbytes(self) -> int:
        return self.rows * self.row_bytes

    def read(self, start: int = 0, stop: int | None = None) -> np.ndarray:
        """Stored rows [start, stop) as an array (rows, stored row) — or the whole 1-D tensor."""
        stop = self.rows if stop is None else stop
        data = self.read_rows(start, stop)
        if len(self.shape) == 1:
            return data.reshape(self.qtype.stored_shape(self.shape))
        return data.reshape(stop - start, -1)

    def expert(self, index: int) -> SourceTensor:
        """Slice `index` of a tensor stacked along its first axis."""
        if len(self.shape) < 2 or not 0 <= index < self.shape[0]:
            raise ConversionError(f"{self.name}: no slice {index} in shape {list(self.shape)}")
        per = self.rows // self.shape[0]
        return SourceTensor(f"{self.name}[{index}]", self.shape[1:], self.qtype,
                            lambda a, b: self.read_rows(index * per + a, index * per + b),
                            self._at_row(index * per))

    def _at_row(self, row: int) -> int | None:
        return None if self.at is None or self.reorder else self.at + row * self.row_bytes

    def row_part(self, part: int, parts: int) -> SourceTensor:
        """Rows block `part` of `parts` equal blocks along the first axis (a fused gate_up)."""
        if len(self.shape) != 2 or self.shape[0] % parts:
            raise ConversionError(f"{self.name}: shape {list(self.shape)} does not split in {parts} row blocks")
        n = self.shape[0] // parts
        return SourceTensor(f"{self.name}#{part}/{parts}", (n, self.shape[1]), self.qtype,
                            lambda a, b: self.read_rows(part * n + a, part * n + b), self._at_row(part * n))

    def columns(self, part: int, parts: int) -> SourceTensor:
        """Columns part, part + parts, ... of a float tensor (gpt-oss interleaves gate and up)."""
        if self.qtype.name not in ("f32", "f16", "bf16") or self.shape[-1] % parts:
            raise ConversionError(f"{self.name}: shape {list(self.shape)} {self.qtype.name} does not split in "
                                  f"{parts} interleaved column sets")
        shape = self.shape[:-1] + (self.shape[-1] // parts,)
        if len(self.shape) == 1:
            return SourceTensor(f"{self.name}~{part}/{parts}", shape, self.qtype,
                                lambda a, b: self.read_rows(0, 1)[part::parts])
        return SourceTensor(f"{self.name}~{part}/{parts}", shape, self.qtype,
                            lambda a, b: np.ascontiguousarray(self.read(a, b)[:, part::parts]).reshape(-1))

    def transposed(self) -> SourceTensor:
        """A float matrix with its two axes swapped (read whole: one expert's slice)."""
        if len(self.shape) != 2 or self.qtype.name not in ("f32", "f16", "bf16"):
            raise ConversionError(f"{self.name}: shape {list(self.shape)} {self.qtype.name} cannot be transposed")
        def read(a: int, b: int) -> np.ndarray:
            return np.ascontiguousarray(self.read().T[a:b]).reshape(-1)
        return SourceTensor(f"{self.name}'", self.shape[::-1], self.qtype, read)

    def mapped(self, fn: str) -> SourceTensor:
        """The values through `fn`, as float32: "plus1" (a zero-centred norm's 1 + w), "negexp"
        (-exp(x): Qwen3.5's A from A_log)."""
        funcs = {"plus1": lambda x: x + np.float32(1), "negexp": lambda x: -np.exp(x)}
        if fn not in funcs or self.qtype.name not in ("f32", "f16", "bf16"):
            raise ConversionError(f"{self.name}: cannot map {self.qtype.name} values through {fn!r}")
        f32 = quant.get("f32")

        def read(a: int, b: int) -> np.ndarray:
            x = quant.dequantize(self.read_rows(a, b) if len(self.shape) > 1 else self.read_rows(0, 1), self.qtype)
            return funcs[fn](np.asarray(x, np.float32).reshape(-1)).astype(np.float32)
        return SourceTensor(f"{self.name}@{fn}", self.shape, f32, read)

    def permute_rows(self, order: np.ndarray, reorder: tuple | None = None) -> SourceTensor:
        """Rows reordered: new row i is old row order[i] (a lossless move of whole rows); `reorder`
        names the order for a reader of the file in place (SourceTensor.reorder)."""
        def read(a: int, b: int) -> np.ndarray:
            return self.read().reshape(self.rows, -1)[order[a:b]]
        return SourceTensor(self.name, self.shape, self.qtype, read, self.at if reorder else None, reorder)

    def reshaped(self, shape: tuple[int, ...]) -> SourceTensor:
        """Same data, other leading dims (e.g. a (1, n) matrix as an (n,) vector)."""
        assert shape[-1] == self.shape[-1] and np.prod(shape) == np.prod(self.shape)
        if len(shape) == 1:
            return SourceTensor(self.name, shape, self.qtype, lambda a, b: self.read_rows(0, self.rows), self.at,
                                self.reorder)
        return SourceTensor(self.name, shape, self.qtype, self.read_rows, self.at, self.reorder)


class FileReader:
    """One open source file; reads byte ranges with pread and checks they exist."""

    def __init__(self, path: Path):
        self.path = Path(path)
        try:
            self.fd = os.open(self.path, os.O_RDONLY)
        except OSError as e:
            raise SourceFormatError(f"{self.path}: cannot open: {e.strerror}") from None
        self.size = os.fstat(self.fd).st_size

    def rows(self, name: str, offset: int, row_bytes: int, dtype: np.dtype) -> RowReader:
        """A reader of rows of `row_bytes` bytes starting at byte `offset`."""
        def read(a: int, b: int) -> np.ndarray:
            want = (b - a) * row_bytes
            buf = bytearray(want)
            got = os.preadv(self.fd, [buf], offset + a * row_bytes) if want else 0
            if got != want:
                raise SourceFormatError(f"{self.path}: tensor {name!r} is cut short "
                                        f"(read {got} of {want} bytes: file truncated?)")
            return np.frombuffer(buf, dtype=dtype)
        return read

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
