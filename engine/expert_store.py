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
    """Where an expert's bytes are: one run of its file (gate, up, down consecutive in a Colibri
    expert file) or several (a GGUF run in place: a slice of each of the layer's stacked tensors).
    A slot read with O_DIRECT holds each run widened to whole 4 KiB pages of the file, one after
    the other; a buffered read packs the runs."""
    path: Path
    offset: int  # file offset of the gate tensor
    nbytes: int  # through the end of the down tensor, or of all the runs
    parts: tuple  # (offset in the packed runs, rows, row_bytes, code, cols) for gate, up, down
    runs: tuple = ()  # (file offset, bytes) of each run; () for the one run (offset, nbytes)

    def __post_init__(self) -> None:
        if not self.runs:
            object.__setattr__(self, "runs", ((self.offset, self.nbytes),))

    @property
    def head(self) -> int:
        """Where the span starts in a slot read with O_DIRECT (its offset within a 4 KiB page)."""
        return self.offset % DIRECT_ALIGN

    def windows(self) -> list[int]:
        """Each run widened to whole 4 KiB pages of the file: the bytes an O_DIRECT read takes."""
        return [-(-(o % DIRECT_ALIGN + n) // DIRECT_ALIGN) * DIRECT_ALIGN for o, n in self.runs]

    @property
    def slot_bytes(self) -> int:
        """Bytes a slot needs: the runs widened to whole 4 KiB pages of the file."""
        return sum(self.windows())

    def places(self, direct: bool) -> list[int]:
        """Where each run starts in the slot, as read with O_DIRECT or buffered."""
        out, at = [], 0
        for (o, n), w in zip(self.runs, self.windows()):
            out.append(at + o % DIRECT_ALIGN if direct else at)
            at += w if direct else n
        return out


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
        self._expert_bytes: int | None = None  # every expert's bytes (keeps_page_cache)
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
        path = self.model.data_path(rel)
        sfx = "_shexp" if expert == "shared" else f".{expert}"
        try:
            infos = self.model.headers.get(rel) or tensorfile.read_header(path, quiet=True)[0]  # (see engine.folios)
            listed = self.model.manifest["files"].get(rel, {}).get("size")
            if listed is not None and path.stat().st_size != listed:
                raise ModelFormatError(f"size {path.stat().st_size} bytes, manifest.json says {listed}")
            ts = [infos[f"blk.{layer}.ffn_{p}{sfx}.weight"] for p in PARTS]
        except (OSError, ModelFormatError, KeyError) as e:
            raise ExpertLoadError(f"layer {layer} expert {expert}: {path}: {e}") from None
        runs: list[list[int]] = []  # a part starting within a page after the previous one's end: the same run
        for t in ts:
            if runs and 0 <= t.offset - sum(runs[-1]) < DIRECT_ALIGN:
                runs[-1][1] = t.offset + t.nbytes - runs[-1][0]
            else:
                runs.append([t.offset, t.nbytes])
        parts = []
        for t in ts:
            i = next(i for i, (o, n) in enumerate(runs) if o <= t.offset < o + n)
            rows = int(np.prod(t.shape[:-1]))
            parts.append((sum(n for _, n in runs[:i]) + t.offset - runs[i][0], rows, t.nbytes // rows,
                          t.qtype.type_id, t.shape[-1]))
        return ExpertSpan(path, runs[0][0], sum(n for _, n in runs), tuple(parts), tuple((o, n) for o, n in runs))

    def read_into(self, layer: int, expert: int | str, buf: np.ndarray, repack: bool = False) -> ExpertWeights:
        """Read the expert into `buf` (uint8; its matrices view it): O_DIRECT into a page-aligned `buf` of
        span.slot_bytes (each run where span.places puts it), else buffered. `repack`: stored-layout
        PACKABLE matrices rearranged in place into the kernels' 8-row groups (for experts that stay)."""
        sp = self.span(layer, expert)
        direct = self.direct and buf.nbytes >= sp.slot_bytes and buf.ctypes.data % DIRECT_ALIGN == 0
        places = sp.places(direct)
        if buf.nbytes < places[-1] + sp.runs[-1][1]:
            raise ValueError(f"layer {layer} expert {expert}: a {buf.nbytes}-byte buffer for {sp.nbytes} bytes")
        try:
            got = self._read(sp, memoryview(buf), places, direct)
        except OSError as e:
            raise ExpertLoadError(f"layer {layer} expert {expert}: {sp.path}: {e.strerror}") from None
        if got < sp.nbytes:
            raise ExpertLoadError(f"layer {layer} expert {expert}: {sp.path}: read {got} of {sp.nbytes} bytes "
                                  f"(file truncated?)")
        return self._weights(layer, expert, sp, buf, places if len(places) > 1 else places[0], repack)

    def map(self, layer: int, expert: int) -> ExpertWeights:
        """The expert's matrices over shared read-only mappings of its runs (a miss served once)."""
        sp = self.span(layer, expert)
        views = []
        try:
            fd = os.open(sp.path, os.O_RDONLY)
            try:
                size = os.fstat(fd).st_size  # mapped pages past a file's end are SIGBUS when read
                if size < max(o + n for o, n in sp.runs):
                    raise ExpertLoadError(f"layer {layer} expert {expert}: {sp.path}: the file has {size} bytes, "
                                          f"the expert ends past it (file truncated?)")
                for off, n in sp.runs:
                    start = off // mmap.ALLOCATIONGRANULARITY * mmap.ALLOCATIONGRANULARITY
                    views.append((mmap.mmap(fd, off + n - start, mmap.MAP_SHARED, mmap.PROT_READ, offset=start),
                                  start, off))
            finally:
                os.close(fd)
        except (OSError, ValueError) as e:
            raise ExpertLoadError(f"layer {layer} expert {expert}: {sp.path}: {e}") from None
        try:
            for mm, _, _ in views:
                advise_huge(mm)
                populate(mm)
        except OSError as e:  # (a read error populating, e.g. EIO, EFAULT past a truncated file's end)
            raise ExpertLoadError(f"layer {layer} expert {expert}: {sp.path}: {e.strerror}") from None
        with self._lock:
            self.read_bytes["mapped"] += sp.nbytes
        if len(views) == 1:
            self._check_folios(sp, views[0][0], views[0][1])
        bufs, starts = [_typed_writable(mm) for mm, _, _ in views], [off - start for _, start, off in views]
        return self._weights(layer, expert, sp, bufs if len(bufs) > 1 else bufs[0],
                             starts if len(starts) > 1 else starts[0], False)

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
    def _weights(layer: int, expert: int | str, sp: ExpertSpan, buf: np.ndarray | list, start: int | list,
                 repack: bool) -> ExpertWeights:
        """gate, up, down viewing buf, whose byte `start` is the span's first; a span of several runs:
        run i at start[i] of buf, or of buf[i] (a list: a mapping a run)."""
        sfx = "_shexp" if expert == "shared" else f".{expert}"
        mats, ends = [], np.cumsum([n for _, n in sp.runs])
        for p, (off, rows, rb, code, cols) in zip(PARTS, sp.parts):
            i = int(np.searchsorted(ends, off, side="right"))  # the run holding the part
            at = (start[i] if isinstance(start, list) else start) + off - (ends[i] - sp.runs[i][1])
            data = (buf[i] if isinstance(buf, list) else buf)[at:at + rows * rb].reshape(rows, rb)
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
            if self._expert_bytes is None:
                self._expert_bytes = sum(n for rel, n in self.model.tensor_bytes().items() if rel.startswith("experts/"))
            experts = self._expert_bytes
            self._keep, self._keep_at = source == "MemAvailable" and free >= KEEP_ROOM_FACTOR * experts, now
        return self._keep

    def _read(self, sp: ExpertSpan, buf: memoryview, places: list[int], direct: bool) -> int:
        """Bytes of the span now in buf, run i at places[i], read as the module's docstring says (a plain
        pread in `cached` mode or with room to spare; else copied or O_DIRECT, then dropped from the page
        cache)."""
        fd = os.open(sp.path, os.O_RDONLY)
        try:
            if self.keeps_page_cache():
                got = 0
                for (off, n), at in zip(sp.runs, places):
                    cached = _cached_share(fd, off, n) >= 0.5
                    if not cached:  # the copy the page cache keeps, in 2 MiB folios
                        read_ahead_huge(fd, off, n)
                    more = os.preadv(fd, [buf[at:at + n]], off)
                    self.read_bytes["page_cache" if cached else "buffered"] += more
                    got += more
                return got
            have = [0] * len(sp.runs)
            for i, ((off, n), at) in enumerate(zip(sp.runs, places)):
                if self.read_mode == "auto" and _cached_share(fd, off, n) >= 0.5:
                    have[i] = os.preadv(fd, [buf[at:at + n]], off)  # mostly a copy from memory
                    self.read_bytes["page_cache"] += have[i]
            if direct and any(h < n for h, (_, n) in zip(have, sp.runs)):
                done = self._read_direct(sp, buf, places, have)
                if done is not None:
                    self.read_bytes["direct"] += sum(done) - sum(have)
                    have = done
            for i, ((off, n), at) in enumerate(zip(sp.runs, places)):
                if have[i] < n:  # buffered: O_DIRECT refused, or a buffer it cannot take
                    more = os.preadv(fd, [buf[at + have[i]:at + n]], off + have[i])
                    self.read_bytes["buffered"] += more
                    have[i] += more
                if hasattr(os, "posix_fadvise"):  # the copy in our slot is the only one
                    os.posix_fadvise(fd, off, n, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
        return sum(have)

    def _read_direct(self, sp: ExpertSpan, buf: memoryview, places: list[int], have: list[int]) -> list[int] | None:
        """O_DIRECT reads of each run from its byte have[i] on, whole pages of the file (the run's
        window: a GGUF run starts anywhere in a page), in IO_CHUNK pieces on the I/O threads; how much of
        each run is in buf afterwards, None when the filesystem refuses O_DIRECT."""
        pieces = []  # (run, first file byte, end, file offset of buf[0] for this run: a multiple of DIRECT_ALIGN)
        for i, ((off, n), at, w) in enumerate(zip(sp.runs, places, sp.windows())):
            if have[i] < n:
                a, b = (off + have[i]) // DIRECT_ALIGN * DIRECT_ALIGN, off // DIRECT_ALIGN * DIRECT_ALIGN + w
                pieces += [(i, o, min(b, o + IO_CHUNK), off - at) for o in range(a, b, IO_CHUNK)]
        try:
            fd = os.open(sp.path, os.O_RDONLY | os.O_DIRECT)
        except OSError as e:
            if e.errno != errno.EINVAL:
                raise
            return self._no_direct(sp, e)
        try:
            read = lambda p: os.preadv(fd, [buf[p[1] - p[3]:p[2] - p[3]]], p[1])  # noqa: E731
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
        done, short = list(have), set()  # contiguous bytes of each run: a short piece is the end of the file
        for (i, lo, hi, _), c in zip(pieces, counts):
            if i not in short:
                off, n = sp.runs[i]
                done[i] = max(have[i], min(n, lo + c - off))
                if c < hi - lo:
                    short.add(i)
        return done

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
