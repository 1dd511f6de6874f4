"""Experts on disk, loaded on demand into a cache under one byte budget (LFU by default, LRU on
request), with a prefetcher.

Load path: one read of an expert's byte span (gate, up, down are consecutive in its file) into a
slot from the memory pool, leaving no second copy in the page cache: an expert the page cache
mostly holds (mincore says) is copied out and dropped (POSIX_FADV_DONTNEED); any other comes
with O_DIRECT straight into the page-aligned slot, 1 MiB pieces read by a small pool of I/O
threads. Measured (`colibri-bench loads`, a 9.2 MB q8_0 expert, ext4 on virtio, medians of 7):
cold, O_DIRECT 3.6 ms against 6.0 for pread + DONTNEED and 7.7 for plain pread; warm, a copy
1.4-1.6 ms against 5.6 for O_DIRECT; `auto` takes the faster per case (5.2 cold, 1.6 warm).
(A RWF_NOWAIT read to pick up the cached part starts readahead: 16.5 ms cold.) Where O_DIRECT is
refused, buffered pread then DONTNEED. Under a memory cgroup the page cache is charged like
anonymous memory, so a second copy halves the experts a cap can hold. With room to spare (no
cgroup binds, MemAvailable holds twice the experts) a miss is a plain pread that leaves the page
cache alone: the next miss of that expert is then a copy from memory (1.4-1.6 ms, not 5.6), and the
page cache, reclaimable and not our RSS, holds what the pool does not. Then, too, a demand miss
colder (LFU) than the expert it would push out is not admitted: it is mapped from the page cache
for its one use (no copy, no slot) and the hotter expert stays (`colibri-bench routing`'s
lfu_admit: 59.4% hits at 2 of 8 a layer on the MoEfied trace against LFU's 55.9%). Under a memory
cgroup too, while its room beyond the pool holds a few experts and the page cache is seen keeping
the mapped ones (mincore on their next mapping): pool slots are never reclaimed, page-cache pages
are, so the cache is the pool plus what the cgroup's page cache keeps, as llama.cpp's mmap has it;
where the page cache keeps nothing (heavy caps) misses go back to one O_DIRECT copy into a slot.

Prediction (next layer's picks, runners-up) stays on only while it pays: it pauses when most of
the latest guesses were evicted unused (PREFETCH_MIN_ACCURACY).

Experts come in the layout the kernels consume: the converter writes every expert matrix whose
format has 8-row-group kernels (cpu.PACKABLE, rows a multiple of 8) already repacked (engine.quant's
x8 types), so a miss, read into a slot or mapped from the page cache, is one read and nothing else,
and streamed experts take the repacked kernels as resident ones do. Measured on colibri-bench
memory's moderate model (q8_0, 9.2 MB experts) converted both ways, AMD EPYC Zen 5 VM (avx512f/bw/vl/
vnni, avx_vnni), 2 vCPUs shared with other work (load 1-9), runs alternating, medians:
- a miss and one token through the expert (`colibri-bench loads`, NUMBA_NUM_THREADS=1): read 1.9 ms
  and token 0.30 ms repacked on disk, against the stored layout's token 0.49-0.53 ms, or 12.9-16.9 ms
  of repack_x8 on each miss for the repacked kernels (0.36 ms); with 2 threads the token medians
  (33-36 ms) measure the preempted OpenMP threads, not the kernels (minima 0.26 against 0.38 ms);
- decode, the same tokens fed to both layouts in one process token by token, 1 thread (`colibri-bench
  loads --model DIR --against DIR_CONVERTED_WITH_--no-repack_experts --threads 1 [--cache N]`): at
  2 of 8 experts a layer cached (12 misses, 112 MB a token) the experts' compute is 3.9 ms a token
  less repacked on disk, but the token then waits about that much longer for its reads (feed-forward
  54.1 ms, 26.4 of it waiting, against 53.9 and 22.3 stored): decode there is bound by the miss
  reads more than the kernels (four paired runs: 53.3, 55.1, 60.9, 82.1 ms a token against 52.8,
  53.0, 68.6, 90.7); at 4 of 8, 58.7, 67.0, 71.5 against 63.0, 71.0, 77.1 (-6%); at 6 of 8, 39.6
  against 40.4. With 2 threads the shared machine's preemption of OpenMP threads dominates
  (paired at load ~5: 2 of 8 183.6 against 167.8 ms a token, 4 of 8 148.7 against 168.8).
Model dirs converted in the stored layout still load: their experts are repacked on their one load
when the budget holds every expert, else streamed in the stored layout.

Concurrency: the compute thread pins what it uses (`with cache.use(L, e) as w:`); the loader
thread never evicts a pinned slot. Kernels and reads release the GIL, so loads overlap compute.
"""
from __future__ import annotations

import errno
import logging
import math
import mmap
import os
import queue
import threading
import time
from collections import Counter, OrderedDict, deque
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Iterator

import numpy as np

from engine import sysmem, tensorfile
from engine.errors import ModelFormatError
from engine.kernels import cpu
from engine.mempool import Block, MemoryPool, resident_bytes
from engine.model_dir import ModelDir, expert_file
from engine.sysmem import MemoryBudget
from engine.weight_types import ExpertWeights, Matrix

log = logging.getLogger("colibri.experts")
PARTS = ("gate", "up", "down")
MiB = 1 << 20
SPARE_SLOTS = 2  # evicted slots kept for reuse (counted in the budget)
DIRECT_ALIGN = 4096  # O_DIRECT: file offset, length and buffer address multiples of this
IO_CHUNK = 1 << 20  # one O_DIRECT request; 4 in flight measured 3.6 GB/s against 1.1-3.2 for one read
IO_THREADS = 4
READ_MODES = ("auto", "direct", "dontneed", "cached")  # cached: plain pread, the page-cache copy stays
# auto with room to spare (no memory cgroup binds, and MemAvailable holds KEEP_ROOM_FACTOR x the
# expert files): a miss leaves the file's pages in the page cache, so the next miss of that expert is
# a memcpy, not a disk read, and the page cache (reclaimable, not this process's RSS) holds what the
# pool does not. Under pressure one copy: O_DIRECT or copy + DONTNEED. Checked again every KEEP_CHECK_S.
KEEP_ROOM_FACTOR = 2
KEEP_CHECK_S = 1.0
# under a memory cgroup the pool's slots are never reclaimed (no swap) but page-cache pages are: a
# colder miss may still be mapped from the page cache for its one use (no slot), so the cgroup's room
# beyond the pool's own growth holds experts too, as llama.cpp's mmap does. Only while that room is at
# least MAP_ROOM_SLOTS slots: at heavy caps there is none and misses take one O_DIRECT copy as before
MAP_ROOM_SLOTS = 4
# ...and only while the page cache keeps what was mapped: of the last MAP_OUTCOMES mapped misses of
# experts mapped before, the page cache held at least MAP_MIN_HELD of the bytes (mincore); below that
# a mapped miss is a buffered disk read the pool would have kept. While paused one candidate in
# MAP_PROBE is still mapped, so the estimate follows. Measured (0.68 B Q8_0, auto budget, one run
# each, loaded machine): the page cache held 44% of the mapped bytes at cap 0.9 when the pool had
# shrunk to 243 MB, 3-15% with the pool at its 345 MB (it pauses there), 1-2% at cap 0.5
MAP_MIN_HELD = 0.25
MAP_OUTCOMES = 32
MAP_PROBE = 16
# a mapped miss's page tables are filled by one madvise(MADV_POPULATE_READ) on the loading thread,
# not by the kernels' read faults: measured (a 13.4 MB q8_0 expert of the 1.75 B bench model, in the
# page cache, medians of 40, loaded machine) map + touch 10.6 ms faulting against 1.9 populated (an
# anonymous buffer's touch: 1.1). Populating reads what the page cache lacks, as a pread would.
# Linux >= 5.14; elsewhere (EINVAL) one MADV_WILLNEED readahead and the faults as before
MADV_POPULATE_READ = getattr(mmap, "MADV_POPULATE_READ", 22)
# eviction; lfu ages by LFU_DECAY a token. lfu is the default: on the MoEfied default model's routing
# trace one LFU over all layers hit 74.4% against LRU's 66.3% at 3 of 8 slots a layer, 85.7/81.8% at 4
# (colibri-bench routing; tests/test_experts.py holds the cache to that replay)
POLICIES = ("lfu", "lru")
LFU_DECAY = 0.98
# predictions (next layer's picks, runners-up) go out only while they pay: of the last
# PREFETCH_OUTCOMES resolved ones (used, or evicted unused) at least PREFETCH_MIN_ACCURACY used; a
# wasted guess costs a read and evicts an expert someone wanted. While paused, one call in
# PREFETCH_PROBE still goes out so the estimate follows the routing. Measured (the 0.68 B bench model,
# Q8_0, 4 of 8 experts a layer, the cache driven without compute): prefetch on, accuracy 0.23 on the
# trace and 0.11 on random routing, read 77/143 MB a token against 39/81 MB with it off
PREFETCH_MIN_ACCURACY = 0.6
PREFETCH_OUTCOMES = 32
PREFETCH_PROBE = 16


def min_budget(top_k: int, slot: int) -> int:
    """The smallest expert cache: one layer's picks, one ahead, and the spare slots."""
    return (top_k + 1 + SPARE_SLOTS) * slot


def routed_bytes(store: "ExpertStore") -> int:
    """What holding every routed expert costs in pool blocks. Experts of one layer share a layout
    in split files; layers may differ (llama.cpp's Q4_K_M stores some layers' down in Q6_K: 5.6
    against 4.9 MB an expert), so one layer's slot times all experts would miss room-for-all."""
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


_populate_works = [True]  # cleared by the first EINVAL (a kernel before 5.14)


def _populate(mm: mmap.mmap, held: int) -> None:
    """Fill a fresh private file mapping's page tables from the page cache (reading what it
    lacks) in one call, so the kernels that read it take no page faults."""
    if _populate_works[0]:
        try:
            mm.madvise(MADV_POPULATE_READ)
            return
        except OSError as e:
            if e.errno not in (errno.EINVAL, errno.ENOSYS):
                raise
            _populate_works[0] = False
    if held < len(mm) and hasattr(mmap, "MADV_WILLNEED"):  # the rest: one readahead of the span,
        mm.madvise(mmap.MADV_WILLNEED)  # not a fault per 16 pages from the kernels


def _cached_share(fd: int, offset: int, nbytes: int) -> float:
    """The share of the file range that is in the page cache (mincore over a brief mapping; it
    reads nothing, where a RWF_NOWAIT read would start readahead). 0 when it cannot tell."""
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
        self.read_bytes = Counter()  # bytes by way: page_cache (copied), direct, buffered, mapped (of it mapped_held: in the page cache)
        self._keep, self._keep_at = False, -math.inf
        self._room, self._room_at = None, -math.inf
        self.holds_every_expert = False  # set by the cache: each expert is read once and stays, keep no copy

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
            infos, _ = tensorfile.read_header(path)
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
        """Read the expert into `buf` (uint8); its matrices view `buf`. A page-aligned `buf` of
        span.slot_bytes takes O_DIRECT reads (the span then starts at span.head); any other
        buffer of at least span.nbytes gets a buffered read at its start.

        Matrices the converter wrote repacked (x8 types) come as they are, in the kernels' 8-row
        groups. `repack`: stored-layout ones of a PACKABLE format are rearranged so in place
        (cpu.repack_x8, about 2 ms per 2.4 MB once; model dirs converted before repacking on disk)
        — for experts that stay, not streamed ones."""
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
        """The expert's matrices over a private mapping of its file span: page-cache pages, no
        copy (writable copy-on-write, so the kernels see the array type they were compiled for;
        nothing writes). For a miss served once: the mapping goes when the last view does."""
        return self.map_held(layer, expert)[0]

    def map_held(self, layer: int, expert: int) -> tuple[ExpertWeights, float]:
        """map(), and the share of the span the page cache held when mapped (0..1)."""
        sp = self.span(layer, expert)
        start = sp.offset // mmap.ALLOCATIONGRANULARITY * mmap.ALLOCATIONGRANULARITY
        try:
            with open(sp.path, "rb") as f:
                size = os.fstat(f.fileno()).st_size  # mapped pages past a file's end are SIGBUS when read
                if size < sp.offset + sp.nbytes:
                    raise ExpertLoadError(f"layer {layer} expert {expert}: {sp.path}: the file has {size} bytes, "
                                          f"the expert ends at byte {sp.offset + sp.nbytes} (file truncated?)")
                # (no MAP_POPULATE: on a writable private mapping it breaks copy-on-write, a copy of every
                # page; _populate's MADV_POPULATE_READ maps the page-cache pages as read faults would)
                mm = mmap.mmap(f.fileno(), sp.offset + sp.nbytes - start, mmap.MAP_PRIVATE,
                               mmap.PROT_READ | mmap.PROT_WRITE, offset=start)
        except (OSError, ValueError) as e:
            raise ExpertLoadError(f"layer {layer} expert {expert}: {sp.path}: {e}") from None
        held = resident_bytes(mm, 0, len(mm))  # (mincore: what the page cache held of it)
        try:
            _populate(mm, held)
        except OSError as e:  # (a read error populating, e.g. EIO, EFAULT past a truncated file's end)
            raise ExpertLoadError(f"layer {layer} expert {expert}: {sp.path}: {e.strerror}") from None
        with self._lock:
            self.read_bytes["mapped"] += sp.nbytes
            self.read_bytes["mapped_held"] += min(sp.nbytes, held)
        weights = self._weights(layer, expert, sp, np.frombuffer(mm, np.uint8), sp.offset - start, False)
        return weights, min(1.0, held / max(1, len(mm)))

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

    def cgroup_room(self) -> int | None:
        """auto: the bytes a binding memory cgroup still allows (its inactive page cache counted as
        room, see sysmem), None when none binds or in another read mode; re-measured at most every
        KEEP_CHECK_S. What colder misses may occupy as page cache beyond the pool."""
        if self.read_mode != "auto" or self.holds_every_expert:
            return None
        now = time.monotonic()
        if now - self._room_at >= KEEP_CHECK_S:
            free, source = sysmem.room()
            self._room, self._room_at = (free if source == "cgroup limit" else None), now
        return self._room

    def _read(self, sp: ExpertSpan, buf: memoryview, start: int, direct: bool) -> int:
        """Bytes of the span now in buf[start:]: copied from the page cache when it holds most of
        the span, else with O_DIRECT (or buffered where refused); then dropped from the page cache.
        `cached` mode, or auto with room to spare: a plain pread, nothing dropped."""
        n, got = sp.nbytes, 0
        fd = os.open(sp.path, os.O_RDONLY)
        try:
            if self.keeps_page_cache():
                cached = self.read_mode == "auto" and _cached_share(fd, sp.offset, n) >= 0.5
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
        """O_DIRECT reads of the span from byte `have` on, in IO_CHUNK pieces on the I/O threads
        (buf[start] holds file byte sp.offset, and buf's page boundaries are the file's). How much
        of the span is in buf afterwards; None when the filesystem refuses O_DIRECT."""
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

    def close(self) -> None:
        if self._io is not None:
            self._io.shutdown(wait=True)
            self._io = None


@dataclass
class LayerCounters:
    hits: int = 0
    misses: int = 0
    evictions: int = 0
    bytes_loaded: int = 0
    wait_s: float = 0.0
    ready_hits: int = 0  # served without waiting at all
    prefetched: int = 0
    prefetch_used: int = 0
    prefetch_wasted: int = 0


@dataclass
class _Slot:
    nbytes: int  # what it counts against the budget (the pool block it has or will have)
    block: Block | None = None
    weights: ExpertWeights | None = None
    ready: threading.Event = field(default_factory=threading.Event)
    pins: int = 0
    reserved: bool = False  # a demand load started early; the coming use() takes it over
    early: bool = False
    prefetched: bool = False  # loaded on a prediction: counts toward prefetch accuracy
    used: bool = False
    error: Exception | None = None
    mapped: bool = False  # a miss served from the page cache for its one use (no pool block, no budget)


@dataclass(frozen=True)
class CacheStats:
    """Counters of the expert cache, overall and per layer. Loads by fill() and lookups during
    warmup() are not counted: hits, misses and prefetch accuracy describe real requests."""
    capacity_per_layer: int  # the per-layer limit, or the budget in experts per layer
    resident: int
    resident_bytes: int
    hits: int
    misses: int
    evictions: int
    bytes_loaded: int
    wait_s: float
    hit_rate: float
    served_without_wait: float
    prefetch_accuracy: float | None
    prefetch_enabled: bool
    per_layer: tuple  # (hits, misses, evictions) per layer
    activations: tuple  # per layer, per expert: how often picked
    budget_bytes: int = 0  # the one byte budget shared by every layer (spare slots included)
    cycle_bytes: int = 0  # one token's worst case: layers x top-k x one expert
    fill_bytes: int = 0  # loaded by fill() (room for every expert), not counted as prefetch
    read_bytes: tuple = ()  # (way, bytes): page_cache (copied, then dropped), direct, buffered, mapped, mapped_held
    prefetch_paused: bool = False  # predictions held back: lately they were mostly wasted
    mapping_paused: bool = False  # under a cgroup, colder misses take slots: the page cache kept too little
    prefetch_skipped: int = 0  # prediction calls held back while paused


class ExpertCache:
    """Experts in memory under one byte budget shared by all layers (optionally also at most
    `per_layer` experts of each layer). Evicted first: the unpinned expert least used lately
    (policy "lfu", the default), or least recently used ("lru")."""

    def __init__(self, store: ExpertStore, pool: MemoryPool, num_layers: int, num_experts: int,
                 budget: int, prefetch_window: int = 16, top_k: int = 1, repack: bool = True,
                 per_layer: int | None = None, policy: str = "lfu", decay: float | None = None):
        if policy not in POLICIES:
            raise ValueError(f"expert cache policy {policy!r} is not one of {', '.join(POLICIES)}")
        self.store, self.pool = store, pool
        # lfu: evict the unpinned expert with the least use, each use weighing `decay` less per
        # lookup since (default 0.98 a token); its heat outlives its residency. Ties: LRU.
        self.policy = policy
        self._grow = 1.0 / (decay or LFU_DECAY ** (1.0 / max(1, num_layers * top_k)))
        self._weight = 1.0
        self._heat = np.zeros((num_layers, num_experts))
        self.num_layers, self.num_experts, self.top_k = num_layers, num_experts, top_k
        self.per_layer = None if per_layer is None else max(1, min(per_layer, num_experts))
        self.slot = pool.block_size(store.span(store.model.config.dense_layers, 0).slot_bytes) if num_layers else 0  # a routed expert
        self.all_bytes = routed_bytes(store) if num_layers else 0  # every routed expert's slot
        self.generation = 0  # counts loads and evictions: what a table of expert addresses checks
        self._lock = threading.Lock()
        self._slots: OrderedDict[tuple[int, int], _Slot] = OrderedDict()  # least recently used first
        self._count = [0] * num_layers  # experts of each layer in _slots
        self._used = 0  # bytes of the slots in _slots and of the spare blocks
        self._spare: list[Block] = []
        self._holds_all = False  # holds_all(), remembered once true
        self._filling = self._quiet = False
        self.counters = [LayerCounters() for _ in range(num_layers)]
        self.fill_bytes = 0
        self.set_budget(budget)
        self.repack = repack and self.room_for_all  # experts that stay are repacked once
        self.activations = np.zeros((num_layers, num_experts), np.int64)
        self.window = prefetch_window
        self._recent = [deque(maxlen=max(1, prefetch_window)) for _ in range(num_layers)]
        self._queue: queue.Queue = queue.Queue()
        self._stop = threading.Event()
        self._loader = None
        if prefetch_window > 0:
            self._loader = threading.Thread(target=self._prefetch_loop, name="colibri-prefetch", daemon=True)
            self._loader.start()
        self._warned_at = 0
        self._outcomes: deque = deque(maxlen=PREFETCH_OUTCOMES)  # 1 used, 0 evicted unused: the latest guesses
        self._probe = 0
        self.prefetch_skipped = 0
        self._mapped_before = np.zeros((num_layers, num_experts), bool)
        self._held: deque = deque(maxlen=MAP_OUTCOMES)  # page-cache share of the latest re-mapped misses
        self._map_probe = 0

    def set_budget(self, budget: int) -> None:
        """A new byte budget (memory pressure changed); evicts down to it at once where it can."""
        L, E, k = self.num_layers, self.num_experts, self.top_k
        with self._lock:
            self.budget = max(int(budget), min_budget(k, self.slot))  # one layer's picks + one ahead
            if E == 1:  # a dense model's MLPs: counted with its dense weights, never evicted
                self.budget = max(self.budget, self.all_bytes + SPARE_SLOTS * self.slot)
            # room for all: by bytes (layers' experts may differ in size), as _make_room counts them
            fits_all = self.budget - SPARE_SLOTS * self.slot >= self.all_bytes
            self.room_for_all = fits_all and (self.per_layer is None or self.per_layer >= E)
            per_layer = (self.budget - SPARE_SLOTS * self.slot) // max(1, self.slot * L)
            per_layer = E if fits_all else min(E - 1, per_layer)
            self.capacity = min(E, self.per_layer or E, max(1, per_layer))  # experts per layer it amounts to
            self.store.holds_every_expert = self.room_for_all
            self.spare = max(0, self.capacity - k)  # slots a layer has beyond what one token needs
            # predictions only pay when the next layer's picks fit beside this layer's, and when a
            # layer holds more than one token's picks: with exactly k a guess evicts an expert the
            # next token reuses (measured, trace replay at 2 of 8 per layer, top-2: prefetch on read
            # 183 MB per token at a 0.29 hit rate, off 91 MB at 0.36)
            self.predict = self.budget - SPARE_SLOTS * self.slot >= (2 * k + 1) * self.slot and self.capacity > k
            self._make_room(None, 0)

    @property
    def used_bytes(self) -> int:
        """Bytes the cache holds now: its slots (loading ones included) and spare blocks."""
        return self._used

    @property
    def cycle_bytes(self) -> int:
        """One token's worst case: every layer's top-k experts all different from the last token's."""
        return self.num_layers * self.top_k * self.slot

    # --- the compute side ------------------------------------------------------------------
    @contextmanager
    def use(self, layer: int, expert: int) -> Iterator[ExpertWeights]:
        """The expert's weights, pinned in memory for the duration of the block."""
        slot, load = self._acquire(layer, expert, prefetch=False)
        try:
            if load:
                self._load(layer, expert, slot)
            elif not slot.ready.is_set():
                t0 = time.perf_counter()
                slot.ready.wait()
                with self._lock:
                    if not self._quiet:
                        self.counters[layer].wait_s += time.perf_counter() - t0
            if slot.error is not None:
                raise slot.error
            yield slot.weights
        finally:
            with self._lock:
                slot.pins -= 1
                if slot.error is not None or (slot.mapped and not slot.reserved):
                    self._drop(layer, expert, slot)  # (a mapped miss: its one use is over)
                self._make_room(None, 0)  # back within budget once released

    def all_ready(self, layer: int, experts) -> bool:
        """Whether every one of these experts is loaded (one kernel call may then take them all)."""
        with self._lock:
            slots = [self._slots.get((layer, e)) for e in experts]
            return all(s is not None and s.ready.is_set() for s in slots)

    def order_for_use(self, layer: int, experts) -> list[int]:
        """The experts of a step with the resident ones first, so loads overlap compute."""
        experts = [int(e) for e in experts]
        with self._lock:
            ready = [e for e in experts if (s := self._slots.get((layer, e))) is not None and s.ready.is_set()]
        return ready + [e for e in experts if e not in ready]

    def load_ahead(self, layer: int, expert: int) -> None:
        """Start loading the expert needed next on the loader thread (a demand load begun
        early: the compute thread works on the current expert meanwhile)."""
        if self._loader is None:
            return
        slot, load = self._acquire(layer, expert, prefetch=False, reserve=True)
        if load:
            self._queue.put((layer, expert, slot, False))

    def holds_all(self) -> bool:
        """Whether every expert of every layer is loaded (the budget has room for all and they
        have all been used): prefetching is then pointless."""
        if self._holds_all or not self.room_for_all:
            return self._holds_all
        with self._lock:  # once true it stays true: with room for every expert nothing is evicted
            self._holds_all = all(c == self.num_experts for c in self._count)
        return self._holds_all

    def resident(self) -> list[list[ExpertWeights]] | None:
        """Every expert of every layer, when the budget has room for all and all are loaded: they
        then stay where they are (nothing is ever evicted), so a kernel may reach them by address
        without pins (engine.models.fused). None otherwise."""
        if not self.room_for_all:
            return None
        with self._lock:
            out = []
            for L in range(self.num_layers):
                slots = [self._slots.get((L, e)) for e in range(self.num_experts)]
                if any(s is None or not s.ready.is_set() or s.weights is None for s in slots):
                    return None
                out.append([s.weights for s in slots])
            return out

    def fill(self) -> None:
        """With room for every expert, queue the ones never loaded (once per cache): a small MoE
        then decodes without misses, as a mapped file would (no-op with prefetch off). These loads
        are not predictions: they count in fill_bytes, not in prefetch accuracy."""
        if self._filling or self._loader is None or not self.room_for_all:
            return
        self._filling = True
        for L in range(self.num_layers):
            with self._lock:
                missing = [e for e in range(self.num_experts) if (L, e) not in self._slots]
            for e in missing:
                self._queue.put((L, e, None, True))

    @contextmanager
    def quiet(self) -> Iterator[None]:
        """Lookups inside are not counted (warmup): no hits, misses, activations or window, and
        what they load counts as neither prefetched nor used."""
        with self._lock:
            self._quiet = True
        try:
            yield
        finally:
            self.drain()
            with self._lock:
                self._quiet = False
                for s in self._slots.values():
                    s.prefetched = s.used = False

    def drain(self, timeout: float = 10.0) -> None:
        """Wait until the loader has nothing queued or loading."""
        t_end = time.monotonic() + timeout
        while time.monotonic() < t_end:
            with self._lock:
                busy = any(not s.ready.is_set() for s in self._slots.values())
            if self._queue.unfinished_tasks == 0 and not busy:  # (task_done after each item is handled)
                return
            time.sleep(0.002)

    def count_uses(self, picks: np.ndarray, routed: bool = True) -> None:
        """Count a fused decode step's picks (layers, k) as use() and record() count them: hits on
        resident experts, and (routed) the heatmap and the prefetch window."""
        with self._lock:
            if self._quiet:
                return
            for layer, row in enumerate(picks.tolist()):
                c = self.counters[layer]
                for e in row:
                    slot = self._slots[(layer, e)]
                    self._slots.move_to_end((layer, e))
                    c.hits += 1
                    c.ready_hits += 1
                    if slot.prefetched and not slot.used:
                        c.prefetch_used += 1
                        self._outcomes.append(1)
                    slot.used = True
                    if routed:
                        self.activations[layer, e] += 1
                        self._recent[layer].append(e)

    def record(self, layer: int, experts: np.ndarray) -> None:
        """Note the experts a token picked (for the sliding-window prefetch and the heatmap)."""
        with self._lock:
            if self._quiet:
                return
            picks = np.asarray(experts).ravel()
            self.activations[layer] += np.bincount(picks, minlength=self.num_experts)[:self.num_experts].astype(
                self.activations.dtype)
            recent = self._recent[layer]
            recent.extend(picks[-recent.maxlen:].tolist())  # (a prompt's picks: only the window's last stay)

    def prefetch(self, layer: int, experts, spare_only: bool = False) -> None:
        """Ask the loader to bring these experts of `layer` in (no-op when prefetch is off, or
        when the budget cannot hold the next layer's picks beside this layer's).

        Predicted picks may replace the least recently used expert; guesses (`spare_only`:
        runners-up, the window's favourites) only use room the top-k does not need.
        """
        if self._loader is None or layer >= self.num_layers or not self.predict or not self._prefetch_pays():
            return
        wanted = [int(x) for x in experts]
        if spare_only:
            with self._lock:
                window = [e for e, _ in Counter(self._recent[layer]).most_common(self.spare)]
            wanted = list(dict.fromkeys(wanted + window))[:self.spare]
        with self._lock:  # already there or on its way: don't wake the loader for it
            wanted = [e for e in wanted if (layer, e) not in self._slots]
        for e in wanted:
            self._queue.put((layer, e, None, False))

    @property
    def prefetch_paused(self) -> bool:
        """Whether the latest resolved guesses were mostly wasted (predictions then held back)."""
        out = self._outcomes
        return len(out) >= out.maxlen // 2 and sum(out) < PREFETCH_MIN_ACCURACY * len(out)

    def _prefetch_pays(self) -> bool:
        """Whether a prediction call goes out: always while guesses pay, one in PREFETCH_PROBE while paused."""
        with self._lock:
            if not self.prefetch_paused:
                return True
            self._probe += 1
            if self._probe % PREFETCH_PROBE == 0:
                return True
            self.prefetch_skipped += 1
            return False

    # --- internals -------------------------------------------------------------------------
    def _acquire(self, layer: int, expert: int, prefetch: bool, reserve: bool = False,
                 fill: bool = False) -> tuple[_Slot | None, bool]:
        nbytes = self.pool.block_size(self.store.span(layer, expert).slot_bytes)  # (reads a header once)
        with self._lock:
            c, key, count = self.counters[layer], (layer, expert), not self._quiet
            if count and not prefetch and not reserve:
                self._warm(layer, expert)
            slot = self._slots.get(key)
            if slot is not None:
                if prefetch or reserve:
                    return slot, False
                self._slots.move_to_end(key)
                if slot.reserved:  # counted as a miss when its early load began
                    slot.reserved = False
                    slot.pins += 1
                    return slot, False
                if count:
                    c.hits += 1
                    c.ready_hits += slot.ready.is_set()
                    if slot.prefetched and not slot.used:
                        c.prefetch_used += 1
                        self._outcomes.append(1)
                    slot.used = True
                slot.pins += 1
                return slot, False
            if prefetch and not self._fits(layer, nbytes) and not self._evictable(layer):
                return None, False  # a guess never overflows the budget
            mapped = not prefetch and self._pass_through(layer, expert, nbytes)
            if mapped:
                nbytes = 0
            else:
                self._make_room(layer, nbytes)
            prefetched = prefetch and not fill and count
            slot = _Slot(nbytes, prefetched=prefetched, used=not prefetch and count, reserved=reserve,
                         early=reserve, mapped=mapped)
            self._slots[key] = slot
            self._count[layer] += 1
            self._used += nbytes
            if prefetched:
                c.prefetched += 1
            elif not prefetch and count:
                c.misses += 1
            slot.pins += 0 if reserve or prefetch else 1
            return slot, True

    def _warm(self, layer: int, expert: int) -> None:
        """Called with the lock held, once per counted lookup: one more use, weighing 1/decay more
        than the last one (comparing these sums is comparing decayed counts), rescaled before
        the weights overflow."""
        self._weight *= self._grow
        self._heat[layer, expert] += self._weight
        if self._weight > 1e200:
            self._heat /= self._weight
            self._weight = 1.0

    def _fits(self, layer: int, nbytes: int) -> bool:
        spare = sum(b.size for b in self._spare)
        full_layer = self.per_layer is not None and self._count[layer] >= self.per_layer
        return not full_layer and self._used - spare + nbytes <= self.budget - SPARE_SLOTS * self.slot

    def _evictable(self, layer: int) -> bool:
        """Whether _make_room could make room for one more expert of `layer`: a full layer (its
        per-layer count reached) needs a victim of its own, any other a victim anywhere."""
        full = self.per_layer is not None and self._count[layer] >= self.per_layer
        return any(s.pins == 0 and not s.reserved and s.ready.is_set() and (not full or k[0] == layer)
                   for k, s in self._slots.items())

    def _make_room(self, layer: int | None, nbytes: int) -> None:
        """Called with the lock held. Evict unpinned experts (by the policy) until `nbytes`
        more fit in the budget (and, per_layer set, in `layer`'s count); spare blocks count as
        room, since the next load reuses one. Everything pinned or loading: a temporary overflow."""
        victim = self._victim
        if layer is not None and self.per_layer is not None:
            while self._count[layer] + 1 > self.per_layer and (k := victim(layer)) is not None:
                self._evict(k)
        limit = self.budget - SPARE_SLOTS * self.slot
        while self._used - sum(b.size for b in self._spare) + nbytes > limit and (k := victim(None)) is not None:
            self._evict(k)
        while self._spare and self._used + nbytes > self.budget:  # spares last: they save a fresh mapping
            self._free_spare(self._spare.pop())

    def _victim(self, in_layer: int | None) -> tuple[int, int] | None:
        """Called with the lock held: the expert the policy evicts next (of `in_layer`, or any)."""
        free = (k for k, s in self._slots.items() if (in_layer is None or k[0] == in_layer)
                and s.pins == 0 and not s.reserved and s.ready.is_set() and not s.mapped)
        if self.policy == "lfu":
            return min(free, key=lambda k: self._heat[k], default=None)  # the first minimum: LRU among ties
        return next(free, None)

    def _pass_through(self, layer: int, expert: int, nbytes: int) -> bool:
        """Called with the lock held, for a demand miss: serve it mapped from the page cache for
        its one use instead of taking a pool slot — only while misses keep their page-cache copy
        (room to spare) or a memory cgroup leaves room for page cache beyond the pool's growth
        (MAP_ROOM_SLOTS), under LFU, and when the expert it would push out is at least as hot."""
        if self.policy != "lfu" or self.room_for_all:
            return False
        if self.per_layer is not None and self._count[layer] >= self.per_layer:
            v = self._victim(layer)
        elif self._used - sum(b.size for b in self._spare) + nbytes > self.budget - SPARE_SLOTS * self.slot:
            v = self._victim(None)
        else:
            return False  # room without evicting anything
        return v is not None and self._heat[layer, expert] <= self._heat[v] and self._page_cache_holds()

    def _page_cache_holds(self) -> bool:
        """Whether a mapped miss's pages can stay in the page cache: room to spare, or a cgroup
        whose room, less what the pool may still grow by, is MAP_ROOM_SLOTS slots or more, while
        the page cache is seen keeping what was mapped (MAP_MIN_HELD; else one probe in MAP_PROBE)."""
        if self.store.keeps_page_cache():
            return True
        if self._quiet:  # (warm-up: its pages would count against the plan made after it)
            return False
        room = self.store.cgroup_room()
        if room is None or room - max(0, self.budget - self._used) < MAP_ROOM_SLOTS * self.slot:
            return False
        if len(self._held) < MAP_OUTCOMES or sum(self._held) >= MAP_MIN_HELD * len(self._held):
            return True
        self._map_probe += 1
        return self._map_probe % MAP_PROBE == 0

    @property
    def mapping_paused(self) -> bool:
        """Under a cgroup: colder misses take pool slots because the page cache kept too little."""
        return len(self._held) == MAP_OUTCOMES and sum(self._held) < MAP_MIN_HELD * len(self._held)

    def _evict(self, key: tuple[int, int]) -> None:
        slot = self._slots.pop(key)
        self._count[key[0]] -= 1
        c = self.counters[key[0]]
        if not self._quiet:
            c.evictions += 1
            c.prefetch_wasted += slot.prefetched and not slot.used
            if slot.prefetched and not slot.used:
                self._outcomes.append(0)
        self._release(slot)

    def _release(self, slot: _Slot) -> None:
        """Called with the lock held. An evicted slot's memory is kept for the next load (its
        pages are already faulted in, and unmapping is not free), up to SPARE_SLOTS of them."""
        slot.weights = None  # drop the views before the memory is reused
        self.generation += 1
        self._used -= slot.nbytes
        if slot.block is not None:
            if len(self._spare) < SPARE_SLOTS:
                self._spare.append(slot.block)
                self._used += slot.block.size
            else:
                slot.block.free()
            slot.block = None

    def _free_spare(self, block: Block) -> None:
        self._used -= block.size
        block.free()

    def _take_block(self, slot: _Slot, nbytes: int) -> Block:
        """A spare block that fits, else a fresh one of the size _acquire counted (slot.nbytes)."""
        with self._lock:
            for i, b in enumerate(self._spare):
                if nbytes <= b.size <= 2 * nbytes:  # its bytes, counted as a spare, become the slot's
                    self._used -= slot.nbytes
                    slot.nbytes = b.size
                    return self._spare.pop(i)
        return self.pool.alloc(nbytes)

    def _drop(self, layer: int, expert: int, slot: _Slot) -> None:
        if self._slots.get((layer, expert)) is slot and slot.pins == 0:
            self._slots.pop((layer, expert))
            self._count[layer] -= 1
            self._release(slot)
            self._holds_all = False

    def _load(self, layer: int, expert: int, slot: _Slot, fill: bool = False) -> None:
        t0, nbytes = time.perf_counter(), 0
        try:
            sp = self.store.span(layer, expert)
            nbytes = sp.nbytes
            if slot.mapped:
                slot.weights, held = self.store.map_held(layer, expert)
                with self._lock:
                    if self._mapped_before[layer, expert]:  # (a first mapping cannot find it kept)
                        self._held.append(held)
                    self._mapped_before[layer, expert] = True
            else:
                block = self._take_block(slot, sp.slot_bytes)
                slot.block = block
                slot.weights = self.store.read_into(layer, expert, block.array(np.uint8, (block.size,)), self.repack)
        except Exception as e:  # kept on the slot: the waiting compute thread re-raises it
            slot.error = e
        finally:
            with self._lock:
                c = self.counters[layer]
                if slot.error is None:
                    if fill:
                        self.fill_bytes += nbytes
                    c.bytes_loaded += nbytes
                self.generation += 1
                if not slot.prefetched and not slot.early and not fill and not self._quiet:
                    c.wait_s += time.perf_counter() - t0
            slot.ready.set()

    def _prefetch_loop(self) -> None:
        while not self._stop.is_set():
            try:
                layer, expert, slot, fill = self._queue.get(timeout=0.1)
            except queue.Empty:
                continue
            try:
                self._handle(layer, expert, slot, fill)
            finally:
                self._queue.task_done()

    def _handle(self, layer: int, expert: int, slot: _Slot | None, fill: bool) -> None:
        if slot is not None:  # an early demand load: its use() waits for it
            self._load(layer, expert, slot)
            return
        slot, load = self._acquire(layer, expert, prefetch=True, fill=fill)
        if load:
            self._load(layer, expert, slot, fill)
            if slot.error is not None:
                with self._lock:
                    self._drop(layer, expert, slot)
            with self._lock:
                self._make_room(None, 0)

    # --- reporting -------------------------------------------------------------------------
    def stats(self) -> CacheStats:
        with self._lock:
            cs = self.counters
            hits, misses = sum(c.hits for c in cs), sum(c.misses for c in cs)
            used, wasted = sum(c.prefetch_used for c in cs), sum(c.prefetch_wasted for c in cs)
            resident = [s for s in self._slots.values() if s.block is not None]
            requests = hits + misses
            return CacheStats(
                capacity_per_layer=self.capacity, resident=len(resident),
                resident_bytes=sum(s.block.size for s in resident), hits=hits, misses=misses,
                evictions=sum(c.evictions for c in cs), bytes_loaded=sum(c.bytes_loaded for c in cs),
                wait_s=sum(c.wait_s for c in cs), hit_rate=hits / requests if requests else 0.0,
                served_without_wait=sum(c.ready_hits for c in cs) / requests if requests else 0.0,
                prefetch_accuracy=used / (used + wasted) if used + wasted else None,
                prefetch_enabled=self._loader is not None,
                per_layer=tuple((c.hits, c.misses, c.evictions) for c in cs),
                activations=tuple(tuple(int(v) for v in row) for row in self.activations),
                budget_bytes=self.budget, cycle_bytes=self.cycle_bytes, fill_bytes=self.fill_bytes,
                read_bytes=tuple(sorted(self.store.read_bytes.items())),
                prefetch_paused=self.prefetch_paused, prefetch_skipped=self.prefetch_skipped,
                mapping_paused=self.mapping_paused)

    def check_prefetch(self) -> None:
        """Warn once per 256 requests while prefetch accuracy stays under 60%."""
        st = self.stats()
        if st.prefetch_accuracy is not None and st.hits + st.misses - self._warned_at >= 256:
            self._warned_at = st.hits + st.misses
            log.info("expert_cache_hit_rate=%.3f prefetch_accuracy=%.3f", st.hit_rate, st.prefetch_accuracy)
            if st.prefetch_accuracy < 0.6:
                log.warning("prefetch accuracy %.0f%% < 60%%: prefetching wastes loads; consider "
                            "prefetch_window 0 or a larger expert cache", 100 * st.prefetch_accuracy)

    def drop_spares(self) -> list[Block]:
        """Take the spare slots out of the cache; the caller frees them (and may count their pages)."""
        with self._lock:
            out, self._spare = self._spare, []
            self._used -= sum(b.size for b in out)
            return out

    def close(self) -> None:
        self._stop.set()
        if self._loader is not None:
            self._loader.join(timeout=2)
        with self._lock:
            for slot in self._slots.values():
                slot.ready.wait(timeout=2)
                self._release(slot)
            self._slots.clear()
            self._count = [0] * self.num_layers
            for b in self._spare:
                b.free()
            self._spare.clear()
            self._used = 0


@dataclass(frozen=True)
class CachePlan:
    """How the model's memory splits: what always stays resident, the expert cache, the KV cache."""
    capacity: int  # experts per layer the budget amounts to (the per-layer limit, if one was given)
    expert_bytes: int  # one routed expert's slot
    reason: str
    resident_bytes: int  # output head, attention, routers, shared experts (all of a dense model); an
    # untied embedding table stays mapped and is not counted (a token touches one row of it)
    cache_bytes: int  # the expert cache's byte budget, shared by every layer
    kv_bytes: int  # a full KV cache
    available: int  # memory free for this process when planned
    per_layer: int | None = None  # expert_cache_size: at most this many experts of each layer
    budget: MemoryBudget | None = None  # auto: how the room was split (None for an explicit size)
    auto: bool = False  # re-planned when memory pressure changes
    settled: bool = False  # planned after warm-up: the runtime has grown already (a smaller margin)
    # under a cgroup, its active page cache when settled: what it grows by later is mapped experts'
    # pages (clean, reclaimable), room for the pool, not pressure (else mapping shrinks the pool)
    active_file: int = 0

    @property
    def warning(self) -> str | None:
        return None if self.budget is None else self.budget.warning


def activation_bytes(cfg, tokens: int = 256) -> int:
    """A prefill's activation buffers, estimated: per token the hidden state, attention and one
    expert's gate/up rows several times over (float32), plus the logits."""
    ff = max(cfg.intermediate_size or 0, cfg.hidden_size)
    return tokens * (4 * ff + 12 * cfg.hidden_size) * 4 + 2 * cfg.vocab_size * 4 + 8 * MiB


def _tensor_bytes(path: Path, name: str) -> int:
    try:
        infos, _ = tensorfile.read_header(path)
        return infos[name].nbytes
    except (OSError, ModelFormatError, KeyError):
        return 0


def plan_expert_cache(model: ModelDir, params: dict, context_limit: int,
                      available: int | None = None, refuse: bool = False) -> CachePlan:
    """The expert cache's byte budget: what the user asked for (expert_cache_size experts per
    layer, or expert_cache_bytes), or (auto) the room left after dense weights, the KV cache,
    activations and a margin (engine.sysmem.plan; `refuse`: a model below dense + 200 MB). The
    one estimate of a model's memory: the engine sizes its cache from it, the app's fit check shows it."""
    from engine.kvcache import model_cache_bytes
    cfg, files = model.config, model.manifest["files"]
    E, L, k = cfg.num_experts, cfg.num_layers - cfg.dense_layers, cfg.top_k  # L: the layers with experts
    routed = lambda rel: rel.startswith("experts/") and not rel.endswith("_shared.bin")  # noqa: E731
    expert_files = sum(e["size"] for rel, e in files.items() if routed(rel))
    # a slot: one expert's span widened to whole pages (O_DIRECT), as the memory pool rounds it
    pages = -(-(expert_files // max(1, E * L)) // DIRECT_ALIGN) + 1  # the file's, and one the span may cross
    one = MemoryPool.block_size(pages * DIRECT_ALIGN)
    kv = model_cache_bytes(cfg, context_limit, params.get("kv_cache_quantize") or "f16")
    resident = sum(e["size"] for rel, e in files.items() if rel.endswith(".bin") and (E == 1 or not routed(rel)))
    if not cfg.tie_word_embeddings:  # the embedding table stays mapped: a token reads its one row
        resident -= _tensor_bytes(model.path / "embeddings.bin", "token_embd.weight")
    measured = None if available is None else (available, "given")
    if E > 1 and L > 0:  # every expert's slot as the cache counts it (ExpertCache.all_bytes), and its spares
        probe = ExpertStore(model)
        everything = routed_bytes(probe) + SPARE_SLOTS * MemoryPool.block_size(probe.span(cfg.dense_layers, 0).slot_bytes)
    else:
        everything = one * E * L + SPARE_SLOTS * one
    if E == 1:  # dense: the MLP is resident like everything else (ExpertCache keeps all of them)
        b = sysmem.plan(resident, kv, activation_bytes(cfg), 0, 0, 0, measured, refuse=refuse,
                        compile=sysmem.compile_reserve() if refuse else 0)
        return CachePlan(1, one, "dense model: its one MLP per layer stays in memory", resident, 0, kv, b.room,
                         budget=b)
    if params.get("expert_cache_size"):
        cap = min(E, params["expert_cache_size"])
        nbytes = everything if cap >= E else cap * one * L + SPARE_SLOTS * one
        return CachePlan(cap, one, f"{cap} of {E} experts per layer (expert_cache_size)", resident,
                         nbytes, kv, sysmem.available_memory(), per_layer=cap)
    if params.get("expert_cache_bytes"):
        nbytes = params["expert_cache_bytes"]
        cap = max(1, min(E, (nbytes - SPARE_SLOTS * one) // max(1, one * L)))
        return CachePlan(cap, one, f"{nbytes / 1e6:.0f} MB, about {cap} of {E} experts per layer "
                         f"(expert_cache_bytes)", resident, nbytes, kv, sysmem.available_memory())
    b = sysmem.plan(resident, kv, activation_bytes(cfg), L * k * one, everything, min_budget(k, one),
                    measured, refuse=refuse, compile=sysmem.compile_reserve() if refuse else 0)
    return _auto_plan(b, one, E, L, resident, kv)


def _auto_plan(b: MemoryBudget, one: int, E: int, L: int, resident: int, kv: int) -> CachePlan:
    cap = E if b.experts >= b.all_experts else max(1, min(E - 1, (b.experts - SPARE_SLOTS * one) // max(1, one * L)))
    reason = (f"auto: {b.experts / 1e6:.0f} MB for experts, about {cap} of {E} per layer ({b.room / 1e6:.0f} MB "
              f"free, {b.limited_by}; dense weights {resident / 1e6:.0f} MB, KV cache {kv / 1e6:.0f} MB)")
    return CachePlan(cap, one, reason, resident, b.experts, kv, b.room, budget=b, auto=True)


def replan(plan: CachePlan, num_experts: int, num_layers: int, cache_used: int, kv_used: int,
           settled: bool | None = None) -> CachePlan:
    """The auto plan again with the room measured now (memory pressure changed): the expert
    cache's current bytes and the KV cache's filled part are already inside the usage.
    `settled` (after warm-up; kept by later plans): the runtime has grown, a smaller margin."""
    b, one = plan.budget, plan.expert_bytes
    settled = plan.settled if settled is None else settled
    free, source = sysmem.room()
    active = sysmem.cgroup_active_file() if source == "cgroup limit" else None
    active_file = plan.active_file if plan.settled else (active or 0)
    if plan.settled and active is not None:
        free += max(0, active - plan.active_file)
    k = b.cycle // max(1, num_layers * one)
    held_back = sysmem.margin(free, settled)
    left = cache_used + free - max(0, b.kv - kv_used) - b.activations - held_back
    experts = max(min_budget(k, one), min(b.all_experts, left))
    nb = replace(b, room=free, limited_by=source, experts=experts, margin=held_back)
    return replace(_auto_plan(nb, one, num_experts, num_layers, plan.resident_bytes, plan.kv_bytes), settled=settled,
                   active_file=active_file)
