"""Reading experts from disk (engine.experts decides which are held, and when they are read).

One read of an expert's byte span (gate, up, down are consecutive in its file) into a pool slot,
leaving no second copy in the page cache (under a memory cgroup the page cache is charged like
anonymous memory, so a second copy halves the experts a cap can hold): an expert the page cache
mostly holds (mincore says; a RWF_NOWAIT read would start a readahead) is copied out and dropped
(POSIX_FADV_DONTNEED); any other comes with O_DIRECT straight into the page-aligned slot, in 1 MiB
pieces read by a small pool of I/O threads (`colibri-bench loads` times each way). Where O_DIRECT
is refused: buffered pread, then DONTNEED. With room to spare (no cgroup binds, MemAvailable holds
twice the experts) a miss is a plain pread that leaves the page cache alone, so the next miss of
that expert is a copy from memory; a demand miss colder (LFU) than the expert it would push out is
then mapped from the page cache for its one use instead (no copy, no slot).

Experts come in the layout the kernels consume: the converter writes expert matrices whose format
has 8-row-group kernels (cpu.PACKABLE) already repacked (engine.quant's x8 types), so a miss is one
read and nothing else; repacking on each miss would cost more than the token's work through the
expert. Model dirs converted in the stored layout still load: their experts are repacked on their
one load when the budget holds every expert, else streamed in the stored layout.
"""
from __future__ import annotations

import ctypes
import errno
import logging
import math
import mmap
import os
import queue
import threading
import time
import weakref
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from engine import sysmem, tensorfile
from engine.errors import ModelFormatError
from engine.folios import HUGE, MADV_HUGEPAGE, advise_huge, pmd_mapped_bytes, populate, read_ahead_huge
from engine.kernels import cpu
from engine.mempool import MemoryPool, resident_bytes
from engine.model_dir import ModelDir, expert_file
from engine.weight_types import ExpertWeights, Matrix

log = logging.getLogger("colibri.experts")
PARTS = ("gate", "up", "down")
DIRECT_ALIGN = 4096  # O_DIRECT: file offset, length and buffer address multiples of this
IO_CHUNK = 1 << 20  # one O_DIRECT request; several in flight read faster than one large read
IO_THREADS = 4
READ_MODES = ("auto", "direct", "dontneed", "cached")  # cached: plain pread, the page-cache copy stays
# room to spare (see the module's docstring): no memory cgroup binds, and MemAvailable holds
# KEEP_ROOM_FACTOR x the expert files; checked again every KEEP_CHECK_S
KEEP_ROOM_FACTOR = 2
KEEP_CHECK_S = 1.0


def routed_bytes(store: "ExpertStore") -> int:
    """What holding every routed expert costs in pool blocks, summed per expert where layers' layouts
    differ (llama.cpp's Q4_K_M stores some layers' down in Q6_K)."""
    cfg = store.model.config
    E, split = cfg.num_experts, store.model.split_experts
    return sum(E * MemoryPool.block_size(store.span(L, 0).slot_bytes) if split else
               sum(MemoryPool.block_size(store.span(L, e).slot_bytes) for e in range(E))
               for L in range(cfg.dense_layers, cfg.num_layers))


class ExpertLoadError(ModelFormatError):
    """An expert's file is missing or damaged; the message names layer and expert."""


@dataclass(frozen=True)
class ExpertSpan:
    path: Path
    offset: int  # file offset of the gate tensor
    nbytes: int  # through the end of the down tensor
    parts: tuple  # (relative offset, rows, row_bytes, code, cols) for gate, up, down

    @property
    def head(self) -> int:
        """Where the span starts in a slot read with O_DIRECT (its offset within a 4 KiB page)."""
        return self.offset % DIRECT_ALIGN

    @property
    def slot_bytes(self) -> int:
        """Bytes a slot needs: the span widened to whole 4 KiB pages of the file."""
        return -(-(self.head + self.nbytes) // DIRECT_ALIGN) * DIRECT_ALIGN


# A file read by someone else sits in the page cache in small folios, and a mapped miss of it pays
# for them every time (512 page-table entries per 2 MiB, and TLB misses). A mapped miss that finds
# its range in small folios (PAGEMAP_SCAN, Linux >= 6.7) has it dropped and read again through a
# MADV_HUGEPAGE mapping on a background thread, once; after REFOLIO_TRIES such reads that still
# leave small folios (no large folios in this filesystem) the store stops trying.
REFOLIO_TRIES = 4


def _typed_writable(mm: mmap.mmap) -> np.ndarray:
    """A read-only shared mapping's bytes as a uint8 array typed writable, as the kernels were
    compiled for (nothing writes weights); the array's base keeps the mapping."""
    view = (ctypes.c_uint8 * len(mm)).from_address(np.frombuffer(mm, np.uint8).ctypes.data)
    view.mapping = mm
    return np.frombuffer(view, np.uint8)


def _cached_share(fd: int, offset: int, nbytes: int) -> float:
    """The share of the file range in the page cache (mincore over a brief mapping); 0 if unknown."""
    start = offset // mmap.ALLOCATIONGRANULARITY * mmap.ALLOCATIONGRANULARITY
    try:
        mm = mmap.mmap(fd, offset + nbytes - start, mmap.MAP_SHARED, mmap.PROT_READ, offset=start)
    except (OSError, ValueError, AttributeError):
        return 0.0
    try:
        return resident_bytes(mm, 0, len(mm)) / max(1, len(mm))
    finally:
        mm.close()


class ExpertStore:
    """Where every expert lives on disk, and how to read one into a buffer."""

    def __init__(self, model: ModelDir, read_mode: str = "auto"):
        if read_mode not in READ_MODES:
            raise ValueError(f"read_mode {read_mode!r} is not one of {', '.join(READ_MODES)}")
        self.model, self.read_mode = model, read_mode
        self._spans: dict[tuple[int, int | str], ExpertSpan] = {}
        self._lock = threading.Lock()
        self._io: ThreadPoolExecutor | None = None
        self.direct = hasattr(os, "O_DIRECT") and read_mode in ("auto", "direct")
        self.read_bytes = Counter()  # bytes by way: page_cache (copied), direct, buffered, mapped
        self._keep, self._keep_at = False, -math.inf
        self.holds_every_expert = False  # set by the cache: each expert is read once and stays, keep no copy
        self._folios_seen: set[tuple[Path, int]] = set()  # spans whose mapped folios were looked at
        self._refolio_q: queue.SimpleQueue = queue.SimpleQueue()  # spans to read again (put from finalizers)
        self._refolio: threading.Thread | None = None
        self._refolio_left = REFOLIO_TRIES  # 0: no more refreshes (closed, or they came back small)
        self.refolio = Counter()  # refreshed: experts read again into 2 MiB folios; small: still small after

    def span(self, layer: int, expert: int | str) -> ExpertSpan:
        key = (layer, expert)
        with self._lock:
            if key not in self._spans:
                self._spans[key] = self._locate(layer, expert)
            return self._spans[key]

    def _locate(self, layer: int, expert: int | str) -> ExpertSpan:
        rel = expert_file(layer, expert, self.model.split_experts)
        path = self.model.path / rel
        sfx = "_shexp" if expert == "shared" else f".{expert}"
        try:
            infos = self.model.headers.get(rel) or tensorfile.read_header(path, quiet=True)[0]  # (see engine.folios)
            listed = self.model.manifest["files"].get(rel, {}).get("size")
            if listed is not None and path.stat().st_size != listed:
                raise ModelFormatError(f"size {path.stat().st_size} bytes, manifest.json says {listed}")
            ts = [infos[f"blk.{layer}.ffn_{p}{sfx}.weight"] for p in PARTS]
        except (OSError, ModelFormatError, KeyError) as e:
            raise ExpertLoadError(f"layer {layer} expert {expert}: {path}: {e}") from None
        start = ts[0].offset
        parts = tuple((t.offset - start, int(np.prod(t.shape[:-1])), t.nbytes // int(np.prod(t.shape[:-1])),
                       t.qtype.type_id, t.shape[-1]) for t in ts)
        return ExpertSpan(path, start, ts[2].offset + ts[2].nbytes - start, parts)

    def read_into(self, layer: int, expert: int | str, buf: np.ndarray, repack: bool = False) -> ExpertWeights:
        """Read the expert into `buf` (uint8; its matrices view it): O_DIRECT into a page-aligned `buf` of
        span.slot_bytes (the span from span.head), else buffered. `repack`: stored-layout PACKABLE matrices
        rearranged in place into the kernels' 8-row groups (for experts that stay)."""
        sp = self.span(layer, expert)
        direct = self.direct and buf.nbytes >= sp.slot_bytes and buf.ctypes.data % DIRECT_ALIGN == 0
        start = sp.head if direct else 0
        if buf.nbytes < start + sp.nbytes:
            raise ValueError(f"layer {layer} expert {expert}: a {buf.nbytes}-byte buffer for {sp.nbytes} bytes")
        try:
            got = self._read(sp, memoryview(buf), start, direct)
        except OSError as e:
            raise ExpertLoadError(f"layer {layer} expert {expert}: {sp.path}: {e.strerror}") from None
        if got < sp.nbytes:
            raise ExpertLoadError(f"layer {layer} expert {expert}: {sp.path}: read {got} of {sp.nbytes} bytes "
                                  f"(file truncated?)")
        return self._weights(layer, expert, sp, buf, start, repack)

    def map(self, layer: int, expert: int) -> ExpertWeights:
        """The expert's matrices over a shared read-only mapping of its span (a miss served once)."""
        sp = self.span(layer, expert)
        start = sp.offset // mmap.ALLOCATIONGRANULARITY * mmap.ALLOCATIONGRANULARITY
        try:
            fd = os.open(sp.path, os.O_RDONLY)
            try:
                size = os.fstat(fd).st_size  # mapped pages past a file's end are SIGBUS when read
                if size < sp.offset + sp.nbytes:
                    raise ExpertLoadError(f"layer {layer} expert {expert}: {sp.path}: the file has {size} bytes, "
                                          f"the expert ends at byte {sp.offset + sp.nbytes} (file truncated?)")
                mm = mmap.mmap(fd, sp.offset + sp.nbytes - start, mmap.MAP_SHARED, mmap.PROT_READ, offset=start)
            finally:
                os.close(fd)
        except (OSError, ValueError) as e:
            raise ExpertLoadError(f"layer {layer} expert {expert}: {sp.path}: {e}") from None
        try:
            advise_huge(mm)
            populate(mm)
        except OSError as e:  # (a read error populating, e.g. EIO, EFAULT past a truncated file's end)
            raise ExpertLoadError(f"layer {layer} expert {expert}: {sp.path}: {e.strerror}") from None
        with self._lock:
            self.read_bytes["mapped"] += sp.nbytes
        self._check_folios(sp, mm, start)
        return self._weights(layer, expert, sp, _typed_writable(mm), sp.offset - start, False)

    def _check_folios(self, sp: ExpertSpan, mm: mmap.mmap, start: int) -> None:
        """The first mapping of a span: whether its 2 MiB-aligned interior came mapped 2 MiB at a time;
        if not, its pages are read again into 2 MiB folios once this mapping is gone."""
        a, b = -(-start // HUGE) * HUGE, (start + len(mm)) // HUGE * HUGE  # (of the file, as mapped)
        with self._lock:
            if MADV_HUGEPAGE is None or self._refolio_left <= 0 or b <= a or (sp.path, sp.offset) in self._folios_seen:
                return
            self._folios_seen.add((sp.path, sp.offset))
        addr = np.frombuffer(mm, np.uint8, 1).ctypes.data - start  # where file byte 0 would be
        if addr % HUGE:  # the mapping is not 2 MiB-congruent with the file: no folio size would help
            return
        got = pmd_mapped_bytes(addr + a, b - a)
        if got is None or got >= b - a:
            return
        with self._lock:
            if self._refolio is None:
                self._refolio = threading.Thread(target=self._refolio_loop, name="colibri-folios", daemon=True)
                self._refolio.start()
        # once unmapped (DONTNEED leaves mapped pages alone); SimpleQueue.put is safe in a finalizer
        weakref.finalize(mm, self._refolio_q.put, sp).atexit = False

    def _refolio_loop(self) -> None:
        while (item := self._refolio_q.get()) is not None:
            if isinstance(item, threading.Event):
                item.set()
            elif self._refolio_left > 0:
                self._read_again_huge(item)

    def _read_again_huge(self, sp: ExpertSpan) -> None:
        """Read the span's pages again (whole 2 MiB around it) through a MADV_HUGEPAGE mapping."""
        a, end = sp.offset // HUGE * HUGE, -(-(sp.offset + sp.nbytes) // HUGE) * HUGE
        start = sp.offset // mmap.ALLOCATIONGRANULARITY * mmap.ALLOCATIONGRANULARITY  # as map() maps it
        lo, hi = -(-start // HUGE) * HUGE, (sp.offset + sp.nbytes) // HUGE * HUGE
        try:
            fd = os.open(sp.path, os.O_RDONLY)
        except OSError:
            return
        try:
            end = min(end, os.fstat(fd).st_size)
            os.posix_fadvise(fd, a, end - a, os.POSIX_FADV_DONTNEED)
            mm = mmap.mmap(fd, end - a, mmap.MAP_SHARED, mmap.PROT_READ, offset=a)
        except (OSError, ValueError):
            return
        finally:
            os.close(fd)
        try:  # the read itself, through the huge mapping; then how it came mapped
            advise_huge(mm)
            populate(mm)
            got = pmd_mapped_bytes(np.frombuffer(mm, np.uint8, 1).ctypes.data + lo - a, hi - lo)
        except OSError:
            got = None
        finally:
            mm.close()
        with self._lock:
            self.read_bytes["refolio"] += end - a
            if got is not None and got >= hi - lo:
                self.refolio["refreshed"] += 1
                return
            self.refolio["small"] += 1
            if not self.refolio["refreshed"]:  # (after one success, a small one raced a new mapping)
                self._refolio_left -= 1
                if self._refolio_left == 0:
                    log.info("%s: experts read again still came in small folios; mapped misses stay in "
                             "small pages", sp.path.parent)

    @staticmethod
    def _weights(layer: int, expert: int | str, sp: ExpertSpan, buf: np.ndarray, start: int,
                 repack: bool) -> ExpertWeights:
        """gate, up, down viewing buf, whose byte `start` is the span's first."""
        sfx = "_shexp" if expert == "shared" else f".{expert}"
        mats = []
        for p, (off, rows, rb, code, cols) in zip(PARTS, sp.parts):
            data = buf[start + off:start + off + rows * rb].reshape(rows, rb)
            if repack and code in cpu.PACKABLE and rows % 8 == 0:  # (a code > PACKED: repacked on disk)
                cpu.repack_x8(data, code)
                code += cpu.PACKED
            mats.append(Matrix(f"blk.{layer}.ffn_{p}{sfx}.weight", data, code, rows, cols))
        return ExpertWeights(*mats)

    def keeps_page_cache(self) -> bool:
        """auto: whether misses now leave their pages in the page cache (room to spare, see
        KEEP_ROOM_FACTOR); re-measured at most every KEEP_CHECK_S."""
        if self.read_mode == "cached":
            return True
        if self.read_mode != "auto" or self.holds_every_expert:
            return False
        now = time.monotonic()
        if now - self._keep_at >= KEEP_CHECK_S:
            free, source = sysmem.room()
            files = self.model.manifest["files"]
            experts = sum(e["size"] for rel, e in files.items() if rel.startswith("experts/"))
            self._keep, self._keep_at = source == "MemAvailable" and free >= KEEP_ROOM_FACTOR * experts, now
        return self._keep

    def _read(self, sp: ExpertSpan, buf: memoryview, start: int, direct: bool) -> int:
        """Bytes of the span now in buf[start:], read as the module's docstring says (a plain pread in
        `cached` mode or with room to spare; else copied or O_DIRECT, then dropped from the page cache)."""
        n, got = sp.nbytes, 0
        fd = os.open(sp.path, os.O_RDONLY)
        try:
            if self.keeps_page_cache():
                cached = _cached_share(fd, sp.offset, n) >= 0.5
                if not cached:  # the copy the page cache keeps, in 2 MiB folios
                    read_ahead_huge(fd, sp.offset, n)
                got = os.preadv(fd, [buf[start:start + n]], sp.offset)
                self.read_bytes["page_cache" if cached else "buffered"] += got
                return got
            if self.read_mode == "auto" and _cached_share(fd, sp.offset, n) >= 0.5:
                got = os.preadv(fd, [buf[start:start + n]], sp.offset)  # mostly a copy from memory
                self.read_bytes["page_cache"] += got
            if got < n and direct:
                done = self._read_direct(sp, buf, start, got)
                if done is not None:
                    self.read_bytes["direct"] += done - got
                    got = done
            if got < n:  # buffered: O_DIRECT refused, or a buffer it cannot take
                more = os.preadv(fd, [buf[start + got:start + n]], sp.offset + got)
                self.read_bytes["buffered"] += more
                got += more
            if hasattr(os, "posix_fadvise"):  # the copy in our slot is the only one
                os.posix_fadvise(fd, sp.offset, n, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
        return got

    def _read_direct(self, sp: ExpertSpan, buf: memoryview, start: int, have: int) -> int | None:
        """O_DIRECT reads of the span from byte `have` on, in IO_CHUNK pieces on the I/O threads; how
        much of the span is in buf afterwards, None when the filesystem refuses O_DIRECT."""
        base = sp.offset - start  # file offset of buf[0], a multiple of DIRECT_ALIGN
        a = (sp.offset + have) // DIRECT_ALIGN * DIRECT_ALIGN
        b = base + sp.slot_bytes
        try:
            fd = os.open(sp.path, os.O_RDONLY | os.O_DIRECT)
        except OSError as e:
            if e.errno != errno.EINVAL:
                raise
            return self._no_direct(sp, e)
        try:
            pieces = [(o, min(b, o + IO_CHUNK)) for o in range(a, b, IO_CHUNK)]
            read = lambda p: os.preadv(fd, [buf[p[0] - base:p[1] - base]], p[0])  # noqa: E731
            try:
                if len(pieces) == 1:
                    counts = [read(pieces[0])]
                else:
                    if self._io is None:
                        with self._lock:
                            self._io = self._io or ThreadPoolExecutor(IO_THREADS, "colibri-io")
                    counts = list(self._io.map(read, pieces))
            except OSError as e:
                if e.errno != errno.EINVAL:
                    raise
                return self._no_direct(sp, e)
        finally:
            os.close(fd)
        end = a  # contiguous bytes read from a: a short piece is the end of the file
        for (lo, hi), c in zip(pieces, counts):
            end = lo + c
            if c < hi - lo:
                break
        return max(have, min(sp.nbytes, end - sp.offset))

    def _no_direct(self, sp: ExpertSpan, e: OSError) -> None:
        if self.direct:
            self.direct = False
            log.warning("O_DIRECT refused for %s (%s): fallback to buffered reads, each dropped from the "
                        "page cache after the copy", sp.path.parent, e.strerror)

    def settle(self, timeout: float = 10.0) -> None:
        """Wait for the folio refreshes queued so far."""
        if self._refolio is not None:
            done = threading.Event()
            self._refolio_q.put(done)
            done.wait(timeout)

    def close(self) -> None:
        with self._lock:
            self._refolio_left = 0
            refolio, self._refolio = self._refolio, None
        if refolio is not None:
            self._refolio_q.put(None)
            refolio.join(timeout=5)
        if self._io is not None:
            self._io.shutdown(wait=True)
            self._io = None
