"""Colibri tensor files (`*.bin`): a small self-describing header, then 64-byte aligned tensors.

    offset 0   b"CLBT"                      magic
    offset 4   uint32 LE                    file layout version: 1, or 2 where a tensor is repacked
                                            (an x8 type, engine.quant; version 1 readers refuse it)
    offset 8   uint64 LE                    header length H
    offset 16  H bytes of UTF-8 JSON        {"tensors": {name: {"type", "type_id", "shape",
                                             "offset", "nbytes"}}, "meta": {...}},
                                            space-padded so the data starts 64-byte aligned
    data       each tensor at an absolute offset that is a multiple of 64

A tensor is handed out as a read-only numpy view of the file's mapping (nothing copied on open):
quantized ones as uint8 (..., rows, row_bytes) block arrays, float ones as element arrays.
"""
from __future__ import annotations

import hashlib
import json
import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Callable, Iterable

import numpy as np

from engine import quant
from engine.errors import BadHeaderError, NewerFormatError, SizeMismatchError, UnknownQuantTypeError

MAGIC = b"CLBT"
TENSORFILE_VERSION = 2  # the newest this reads; files without repacked tensors are still written as 1
ALIGN = 64
_PREAMBLE = struct.Struct("<4sIQ")  # magic, version, header length


TensorFileError = BadHeaderError  # a malformed tensor file; the message names file and problem


def align_up(n: int, alignment: int = ALIGN) -> int:
    return (n + alignment - 1) // alignment * alignment


@dataclass(frozen=True)
class TensorInfo:
    name: str
    qtype: quant.QuantType
    shape: tuple[int, ...]
    offset: int
    nbytes: int


# --- writing ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class TensorPlan:
    """A tensor to be written: its name, format and logical shape (data comes later)."""
    name: str
    qtype: quant.QuantType
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return self.qtype.nbytes(self.shape)


def layout(plans: Iterable[TensorPlan], meta: dict | None = None) -> tuple[bytes, list[TensorInfo]]:
    """The header bytes (preamble included) and each tensor's place for a file of `plans`."""
    plans = list(plans)
    # The header length depends on the offsets and the offsets on the header length:
    # iterate until the padded header size stops growing (twice at most in practice).
    header_len = 0
    while True:
        data_start = align_up(_PREAMBLE.size + header_len)
        infos, pos = [], data_start
        for p in plans:
            infos.append(TensorInfo(p.name, p.qtype, tuple(p.shape), pos, p.nbytes))
            pos = align_up(pos + p.nbytes)
        doc = {
            "tensors": {
                i.name: {"type": i.qtype.name, "type_id": i.qtype.type_id, "shape": list(i.shape),
                         "offset": i.offset, "nbytes": i.nbytes}
                for i in infos
            },
            "meta": meta or {},
        }
        body = json.dumps(doc, separators=(",", ":")).encode()
        if _PREAMBLE.size + len(body) <= data_start:
            body = body.ljust(data_start - _PREAMBLE.size, b" ")
            version = 2 if any(p.qtype.base is not None for p in plans) else 1
            return _PREAMBLE.pack(MAGIC, version, len(body)) + body, infos
        header_len = len(body)


class TensorFileWriter:
    """Writes one tensor file sequentially (its tensors fixed up front), hashing every byte as it goes."""

    def __init__(self, path: Path, plans: Iterable[TensorPlan], meta: dict | None = None):
        self.path = Path(path)
        header, self.infos = layout(plans, meta)
        self._next = 0  # index of the tensor being written
        self._done = 0  # bytes of it written so far
        self._sha = hashlib.sha256()
        self._file: BinaryIO = open(self.path, "wb")
        self._put(header)

    def _put(self, data: bytes | memoryview) -> None:
        self._file.write(data)
        self._sha.update(data)

    def write(self, name: str, stored: np.ndarray) -> None:
        """Append rows of tensor `name` (the whole tensor, or the next chunk of its rows)."""
        if self._next >= len(self.infos) or name != self.infos[self._next].name:
            expected = self.infos[self._next].name if self._next < len(self.infos) else "nothing"
            raise ValueError(f"{self.path}: expected {expected!r} next, got {name!r}")
        info = self.infos[self._next]
        full = info.qtype.stored_shape(info.shape)
        if stored.dtype != info.qtype.storage or tuple(stored.shape[1:]) != full[1:] and len(full) > 1:
            raise ValueError(f"{self.path}: tensor {name!r} chunk is {stored.dtype}{list(stored.shape)}, "
                             f"expected {info.qtype.storage} rows of {list(full[1:])}")
        if self._done == 0:
            pad = info.offset - self._file.tell()
            self._put(b"\0" * pad)
        data = memoryview(np.ascontiguousarray(stored)).cast("B")
        if self._done + data.nbytes > info.nbytes:
            raise ValueError(f"{self.path}: tensor {name!r} given more than its {info.nbytes} bytes")
        self._put(data)
        self._done += data.nbytes
        if self._done == info.nbytes:
            self._next, self._done = self._next + 1, 0

    def close(self) -> tuple[int, str]:
        """Finish the file; returns (size, sha256 hex)."""
        if self._next != len(self.infos):
            missing = [i.name for i in self.infos[self._next:]]
            raise ValueError(f"{self.path}: closed before writing {missing}")
        self._file.flush()
        os.fsync(self._file.fileno())
        size = self._file.tell()
        self._file.close()
        return size, self._sha.hexdigest()

    def abort(self) -> None:
        self._file.close()


def write_tensor_file(path: Path, tensors: dict[str, tuple[np.ndarray, str]],
                      meta: dict | None = None) -> tuple[int, str]:
    """Write float tensors, each quantized to its named format; returns (size, sha256)."""
    plans = [TensorPlan(n, quant.get(t), tuple(a.shape)) for n, (a, t) in tensors.items()]
    w = TensorFileWriter(path, plans, meta)
    for p in plans:
        w.write(p.name, quant.quantize(tensors[p.name][0], p.qtype))
    return w.close()


# --- reading ---------------------------------------------------------------------------------

HEAD_READ = 16 << 10  # a header read takes this much at once (an expert file's header: ~1 KB)
MAX_HEADER = 16 << 20  # a header's JSON past this is a lie (a file of all of one layer's experts: ~100 KB)


def _first_bytes(path: Path, n: int, quiet: bool) -> bytes:
    """The file's first n bytes (fewer if it is shorter). `quiet`: past the page cache (O_DIRECT, else
    buffered without readahead), so no small folios block the expert store's later 2 MiB ones."""
    if quiet and hasattr(os, "O_DIRECT"):
        try:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
        except OSError:
            fd = None
        if fd is not None:
            buf = mmap.mmap(-1, max(1, -(-n // mmap.PAGESIZE)) * mmap.PAGESIZE)  # (page-aligned)
            try:
                return buf[:min(n, os.preadv(fd, [buf], 0))]
            except OSError:
                pass  # (a filesystem that takes the open but not the read)
            finally:
                buf.close()
                os.close(fd)
    with open(path, "rb", buffering=0) as f:
        if quiet and hasattr(os, "posix_fadvise"):
            os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_RANDOM)
        out = b""
        while len(out) < n and (more := f.read(n - len(out))):
            out += more
        return out


def read_header(path: Path, file_size: int | None = None, quiet: bool = False) -> tuple[dict[str, TensorInfo], dict]:
    """Parse and check a tensor file's header without mapping its data (`quiet`: see _first_bytes)."""
    path = Path(path)
    size = path.stat().st_size if file_size is None else file_size
    head = _first_bytes(path, HEAD_READ, quiet)
    pre = head[:_PREAMBLE.size]
    if len(pre) < _PREAMBLE.size:
        raise TensorFileError(f"{path}: bad header: file is {size} bytes, too short for a header")
    magic, version, hlen = _PREAMBLE.unpack(pre)
    if magic != MAGIC:
        raise TensorFileError(f"{path}: bad header: magic {magic!r}, expected {MAGIC!r}")
    if version > TENSORFILE_VERSION:
        raise NewerFormatError(f"{path}: tensor file version {version} is newer than this Colibri "
                              f"reads ({TENSORFILE_VERSION}); update Colibri")
    if hlen > MAX_HEADER:
        raise TensorFileError(f"{path}: bad header: header length {hlen} is over the {MAX_HEADER}-byte limit")
    if _PREAMBLE.size + hlen > size:
        raise TensorFileError(f"{path}: bad header: header length {hlen} runs past the end of "
                              f"the {size}-byte file")
    if len(head) < _PREAMBLE.size + hlen:
        head = _first_bytes(path, _PREAMBLE.size + hlen, quiet)
    try:
        doc = json.loads(head[_PREAMBLE.size:_PREAMBLE.size + hlen])
        entries = doc["tensors"]
    except (ValueError, KeyError, TypeError) as e:
        raise TensorFileError(f"{path}: bad header: {e}") from None
    infos: dict[str, TensorInfo] = {}
    for name, e in entries.items():
        try:
            qtype = quant.get(int(e["type_id"]))
            shape, offset, nbytes = tuple(int(d) for d in e["shape"]), int(e["offset"]), int(e["nbytes"])
        except quant.QuantError as err:
            raise UnknownQuantTypeError(f"{path}: tensor {name!r}: {err}") from None
        except (KeyError, TypeError, ValueError) as err:
            raise TensorFileError(f"{path}: bad header: tensor {name!r}: {err!r}") from None
        if e.get("type") not in (None, qtype.name):
            raise TensorFileError(f"{path}: bad header: tensor {name!r} says type {e['type']!r} "
                                  f"but id {qtype.type_id} is {qtype.name}")
        try:
            expected = qtype.nbytes(shape)
        except quant.QuantError as err:
            raise TensorFileError(f"{path}: tensor {name!r}: {err}") from None
        if nbytes != expected:
            raise TensorFileError(f"{path}: bad header: tensor {name!r} {qtype.name}{list(shape)} "
                                  f"needs {expected} bytes, header says {nbytes}")
        if offset % ALIGN or offset < _PREAMBLE.size + hlen:
            raise TensorFileError(f"{path}: bad header: tensor {name!r} offset {offset} is not a "
                                  f"64-byte aligned position after the header")
        if offset + nbytes > size:
            raise SizeMismatchError(f"{path}: tensor {name!r} ends at byte {offset + nbytes} but the "
                                  f"file has {size} bytes (truncated?)")
        infos[name] = TensorInfo(name, qtype, shape, offset, nbytes)
    spans = sorted((i.offset, i.offset + i.nbytes, i.name) for i in infos.values())
    for (_, end, a), (start, _, b) in zip(spans, spans[1:]):
        if start < end:
            raise TensorFileError(f"{path}: bad header: tensors {a!r} and {b!r} overlap")
    return infos, doc.get("meta", {})


class TensorFile:
    """A read-only memory mapping of one tensor file; tensors are zero-copy numpy views.

    Given `infos`, the file is another's (a GGUF run in place, engine.gguf_index): only the range of
    those tensors is mapped, and `made` names the tensors read otherwise than stored, each with its
    stored format and the function that makes it from the stored view (a small copy)."""

    def __init__(self, path: Path, infos: dict[str, TensorInfo] | None = None,
                 made: dict[str, tuple[quant.QuantType, Callable[[np.ndarray], np.ndarray]]] | None = None):
        self.path = Path(path)
        self.infos, self.meta = read_header(self.path) if infos is None else (infos, {})
        self._made = made or {}
        self._fd = os.open(self.path, os.O_RDONLY)  # the mapped file itself (os.stat would follow a rename)
        lo, hi = 0, 0
        if infos is not None and infos:
            lo = min(i.offset for i in infos.values()) // mmap.ALLOCATIONGRANULARITY * mmap.ALLOCATIONGRANULARITY
            hi = max(i.offset + i.nbytes for i in infos.values())
        try:
            self._mmap = mmap.mmap(self._fd, hi - lo, access=mmap.ACCESS_READ, offset=lo)
        except BaseException:
            os.close(self._fd)
            raise
        self._base = lo  # the file offset of the mapping's first byte
        self._size = lo + len(self._mmap)

    def check(self) -> None:
        """Raise SizeMismatchError if the mapped file has shrunk since it was opened: touching pages
        past the new end would kill the process with SIGBUS."""
        if self._fd < 0:
            return
        size = os.fstat(self._fd).st_size
        if size < self._size:
            raise SizeMismatchError(f"{self.path}: the weight file shrank to {size} bytes (the model reads up to "
                                    f"byte {self._size}) while the model was loaded (changed on disk?): "
                                    f"load the model again")

    def __contains__(self, name: str) -> bool:
        return name in self.infos

    def names(self) -> list[str]:
        return list(self.infos)

    def tensor(self, name: str) -> np.ndarray:
        """The stored array, mapped in place (read-only)."""
        try:
            i = self.infos[name]
        except KeyError:
            raise KeyError(f"{self.path}: no tensor {name!r}; has {sorted(self.infos)}") from None
        made = self._made.get(name)
        qt = made[0] if made else i.qtype
        view = np.frombuffer(self._mmap, qt.storage, i.nbytes // qt.storage.itemsize,
                             i.offset - self._base).reshape(qt.stored_shape(i.shape))
        return made[1](view) if made else view

    def stored(self, name: str) -> np.ndarray:
        """The tensor in its format's stored (GGUF) layout: the mapped view, or for a repacked
        (x8) tensor an unpacked copy (its format: infos[name].qtype.base)."""
        qt = self.infos[name].qtype
        if qt.base is None:
            return self.tensor(name)
        t = self.tensor(name)
        return quant.unpack_x8(t.reshape(-1, t.shape[-1]), qt.base.name).reshape(t.shape)

    def release(self, name: str) -> None:
        """Unmap this process's whole pages of a tensor copied elsewhere (they stay in the page cache)."""
        i = self.infos[name]
        page = mmap.PAGESIZE
        at = i.offset - self._base
        start, end = -(-at // page) * page, (at + i.nbytes) // page * page
        if end > start and hasattr(mmap, "MADV_DONTNEED"):
            self._mmap.madvise(mmap.MADV_DONTNEED, start, end - start)

    def dequantize(self, name: str) -> np.ndarray:
        return quant.dequantize(self.tensor(name), self.infos[name].qtype)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        try:
            self._mmap.close()
        except BufferError:
            pass  # views are still alive; the mapping goes when they do

    def __enter__(self) -> TensorFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
