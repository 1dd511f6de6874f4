"""The engine's memory pool: three tiers, each with its own lock, every block 64-byte aligned.

    small   < 4 KiB      fixed-size slabs (64 B … 4 KiB classes) carved from 64 KiB pages
    medium  4 KiB–1 MiB  a buddy allocator over 4 MiB arenas
    large   > 1 MiB      one anonymous mmap per block, unmapped on free

All memory is anonymous mmap, so pages cost nothing until touched and `defrag()` can hand free
ranges back to the OS (madvise DONTNEED on free buddy ranges, unmapping empty slab pages and
arenas). Nothing is ever moved (kernels and the fused decode's tables hold raw addresses), so
defrag cannot lower fragmentation inside an arena. It returns the resident bytes that went back,
counted with mincore before each release, so the number matches the RSS drop.
"""
from __future__ import annotations

import ctypes
import math
import mmap
import sys
import threading
from dataclasses import dataclass

import numpy as np

ALIGN = 64
PAGE = mmap.PAGESIZE
HUGE_PAGE = 2 << 20
SMALL_MAX = 4096
MEDIUM_MAX = 1 << 20
SLAB_PAGE = 64 << 10
ARENA = 4 << 20
MIN_ORDER, MAX_ORDER = 12, 22  # buddy blocks 4 KiB … 4 MiB (one arena)
SMALL_CLASSES = (64, 128, 256, 512, 1024, 2048, 4096)


class Block:
    """A piece of pool memory. Use `array()` for numpy views; `free()` gives it back."""

    def __init__(self, pool: MemoryPool, tier: str, buf: mmap.mmap, offset: int, size: int, requested: int,
                 key: object):
        self.pool, self.tier, self.buf, self.offset = pool, tier, buf, offset
        self.size, self.requested, self.key = size, requested, key
        self.freed = False

    def array(self, dtype, shape) -> np.ndarray:
        dtype = np.dtype(dtype)
        count = int(np.prod(shape))
        if count * dtype.itemsize > self.size:
            raise ValueError(f"{count * dtype.itemsize} bytes do not fit a {self.size}-byte block")
        return np.frombuffer(self.buf, dtype, count, self.offset).reshape(shape)

    def free(self) -> None:
        if not self.freed:
            self.freed = True
            self.pool._free(self)


@dataclass(frozen=True)
class TierStats:
    used: int  # bytes handed out (rounded block sizes)
    free: int  # bytes reserved from the OS but not handed out
    blocks: int
    fragmentation: float  # 0 = all free memory in one usable piece, 1 = scattered


@dataclass(frozen=True)
class PoolStats:
    allocated: int  # bytes requested by live blocks
    peak: int
    reserved: int  # bytes mapped from the OS
    small: TierStats
    medium: TierStats
    large: TierStats

    @property
    def fragmentation(self) -> float:
        free = self.small.free + self.medium.free
        if not free:
            return 0.0
        return (self.small.fragmentation * self.small.free + self.medium.fragmentation * self.medium.free) / free


class _SmallTier:
    """Slabs: a 64 KiB page holds blocks of one size class; a bitmap-free list per page."""

    def __init__(self):
        self.pages: dict[int, list[dict]] = {c: [] for c in SMALL_CLASSES}

    def alloc(self, size: int) -> tuple[mmap.mmap, int, int, object]:
        cls = next(c for c in SMALL_CLASSES if c >= size)
        for page in self.pages[cls]:
            if page["free"]:
                return page["buf"], page["free"].pop(), cls, page
        page = {"buf": _anonymous(SLAB_PAGE), "free": list(range(SLAB_PAGE - cls, -1, -cls)), "cls": cls}
        self.pages[cls].append(page)
        return page["buf"], page["free"].pop(), cls, page

    def release(self, block: Block) -> None:
        block.key["free"].append(block.offset)

    def stats(self) -> TierStats:
        used = free = blocks = 0
        partial_free = 0
        for cls, pages in self.pages.items():
            for p in pages:
                n_free = len(p["free"])
                n_used = SLAB_PAGE // cls - n_free
                used += n_used * cls
                free += n_free * cls
                blocks += n_used
                if n_used:
                    partial_free += n_free * cls
        return TierStats(used, free, blocks, partial_free / free if free else 0.0)

    def trim(self) -> int:
        """Unmap pages with no block in use; the resident bytes that went."""
        returned = 0
        for cls, pages in self.pages.items():
            keep = []
            for p in pages:
                empty = len(p["free"]) == SLAB_PAGE // cls
                held = resident_bytes(p["buf"], 0, SLAB_PAGE) if empty else 0  # counted before the unmap
                if empty and _try_close(p["buf"]):
                    returned += held
                else:
                    keep.append(p)
            self.pages[cls] = keep
        return returned


class _Arena:
    def __init__(self):
        self.buf = _anonymous(ARENA)
        self.free: dict[int, set[int]] = {o: set() for o in range(MIN_ORDER, MAX_ORDER + 1)}
        self.free[MAX_ORDER].add(0)
        self.used: dict[int, int] = {}  # offset -> order
        self.returned: set[tuple[int, int]] = set()  # free ranges already given back to the OS

    def alloc(self, order: int) -> int | None:
        o = order
        while o <= MAX_ORDER and not self.free[o]:
            o += 1
        if o > MAX_ORDER:
            return None
        off = min(self.free[o])  # lowest address first: keeps the arena dense
        self.free[o].discard(off)
        while o > order:  # split, keeping the lower half
            o -= 1
            self.free[o].add(off + (1 << o))
        self.used[off] = order
        self.returned.discard((off, order))
        return off

    def release(self, off: int) -> None:
        order = self.used.pop(off)
        while order < MAX_ORDER:
            buddy = off ^ (1 << order)
            if buddy not in self.free[order]:
                break
            self.free[order].discard(buddy)
            off = min(off, buddy)
            order += 1
        self.free[order].add(off)

    def free_bytes(self) -> int:
        return sum(len(s) << o for o, s in self.free.items())

    def largest_free(self) -> int:
        return max((1 << o for o, s in self.free.items() if s), default=0)


class _MediumTier:
    def __init__(self):
        self.arenas: list[_Arena] = []

    @staticmethod
    def order(size: int) -> int:
        return max(MIN_ORDER, (size - 1).bit_length())

    def alloc(self, size: int) -> tuple[mmap.mmap, int, int, object]:
        order = self.order(size)
        # the fullest arena that fits, so that emptier arenas can drain and be unmapped
        for arena in sorted(self.arenas, key=lambda a: a.free_bytes()):
            off = arena.alloc(order)
            if off is not None:
                return arena.buf, off, 1 << order, arena
        arena = _Arena()
        self.arenas.append(arena)
        return arena.buf, arena.alloc(order), 1 << order, arena

    def release(self, block: Block) -> None:
        block.key.release(block.offset)

    def stats(self) -> TierStats:
        used = sum(sum(1 << o for o in a.used.values()) for a in self.arenas)
        free = sum(a.free_bytes() for a in self.arenas)
        largest = max((a.largest_free() for a in self.arenas), default=0)
        blocks = sum(len(a.used) for a in self.arenas)
        return TierStats(used, free, blocks, 1.0 - largest / free if free else 0.0)

    def trim(self) -> int:
        """Unmap empty arenas, DONTNEED free ranges; the resident bytes that went."""
        returned, keep = 0, []
        for a in self.arenas:
            held = resident_bytes(a.buf, 0, ARENA) if not a.used else 0
            if not a.used and _try_close(a.buf):
                returned += held
                continue
            keep.append(a)
            for order, offsets in a.free.items():  # give free ranges' pages back, keep the mapping
                for off in offsets:
                    if (off, order) not in a.returned:
                        returned += resident_bytes(a.buf, off, 1 << order)
                        a.buf.madvise(mmap.MADV_DONTNEED, off, 1 << order)
                        a.returned.add((off, order))
        self.arenas = keep
        return returned


def _anonymous(size: int) -> mmap.mmap:
    """Private anonymous pages (shared ones, Python's default, get no huge pages and survive DONTNEED)."""
    if hasattr(mmap, "MAP_PRIVATE"):
        return mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    return mmap.mmap(-1, size)  # Windows: no flags; private already


def _map_large(size: int, huge: bool = True) -> tuple[mmap.mmap, int]:
    """Fresh anonymous pages for a large block, and its offset in them: blocks of 2 MB and more start on
    a 2 MB boundary with transparent huge pages (fewer TLB misses), unless `huge` is False (memory
    paid as it fills: a KV cache)."""
    if not huge or size < HUGE_PAGE or not hasattr(mmap, "MADV_HUGEPAGE"):
        return _anonymous(size), 0
    buf = _anonymous(size + HUGE_PAGE)  # the unaligned head is never touched, so never paid for
    probe = np.frombuffer(buf, np.uint8, 1)
    off = -probe.ctypes.data % HUGE_PAGE
    del probe  # (a live view would keep the mapping from closing)
    buf.madvise(mmap.MADV_HUGEPAGE, off, size)
    return buf, off


_libc = None


def resident_bytes(buf: mmap.mmap, offset: int, length: int) -> int:
    """Bytes of buf[offset:offset + length] in memory now (mincore); 0 where mincore is unavailable."""
    global _libc
    if length <= 0 or buf.closed:
        return 0
    try:
        _libc = _libc or ctypes.CDLL(None, use_errno=True)
        view = np.frombuffer(buf, np.uint8, length, offset)
    except (OSError, AttributeError, ValueError):
        return 0
    pages = -(-length // PAGE)
    vec = np.zeros(pages, np.uint8)
    ok = _libc.mincore(ctypes.c_void_p(view.ctypes.data), ctypes.c_size_t(length),
                       vec.ctypes.data_as(ctypes.c_void_p)) == 0
    del view
    return int((vec & 1).sum()) * PAGE if ok else 0


def return_freed_heap() -> None:
    """Give the C heap's free pages back to the OS (glibc's malloc_trim; elsewhere nothing)."""
    global _libc
    if not sys.platform.startswith("linux"):
        return
    try:
        _libc = _libc or ctypes.CDLL(None, use_errno=True)
        _libc.malloc_trim(0)
    except (OSError, AttributeError):  # not glibc (musl has no malloc_trim)
        pass


def unmap_library_pages(name: str, smaps: str = "/proc/self/smaps") -> int:
    """Drop this process's page-table entries for the clean, read-only pages of the shared library
    whose file is called `name`; returns the resident bytes they held (Linux; elsewhere 0).

    LLVM's library (libllvmlite) is a large share of the process's RSS once numba has compiled or
    loaded the kernels, and nothing on the decode path runs it again. The pages stay in the page
    cache, clean and unmapped (the first the kernel reclaims), and fault back in if a kernel is
    compiled later. Only mappings with no anonymous (copy-on-write) pages and no write permission
    are dropped: madvise(MADV_DONTNEED) would revert a written private page to the file's bytes."""
    global _libc
    if not sys.platform.startswith("linux"):
        return 0
    try:
        _libc = _libc or ctypes.CDLL(None, use_errno=True)
        text = open(smaps).read()
    except OSError:
        return 0
    released = 0
    vma: list | None = None  # [start, end, perms, rss_kB, anonymous_kB]
    for line in text.splitlines() + [""]:
        head = line.split(maxsplit=5)
        if not line or (len(head) >= 5 and "-" in head[0] and ":" in head[3]):  # a mapping's first line
            if vma and vma[3] and vma[4] == 0 and "w" not in vma[2] and \
                    _libc.madvise(ctypes.c_void_p(vma[0]), ctypes.c_size_t(vma[1] - vma[0]), 4) == 0:  # MADV_DONTNEED
                released += vma[3] << 10
            vma = None
            if line and len(head) == 6 and head[5].rsplit("/", 1)[-1] == name:
                lo, hi = head[0].split("-")
                vma = [int(lo, 16), int(hi, 16), head[1], 0, -1]
        elif vma and line.startswith("Rss:"):
            vma[3] = int(line.split()[1])
        elif vma and line.startswith("Anonymous:"):
            vma[4] = int(line.split()[1])
    return released


def unmap_compiler_pages() -> int:
    """unmap_library_pages for LLVM's library, once the kernels are compiled or loaded (warm-ups)."""
    from llvmlite.binding import ffi
    return unmap_library_pages(ffi.get_library_name())


def _try_close(buf: mmap.mmap) -> bool:
    try:
        buf.close()
        return True
    except BufferError:  # someone still holds a numpy view of it
        return False


class MemoryPool:
    """Thread-safe: one lock per tier (or one global lock, for comparison)."""

    def __init__(self, global_lock: bool = False):
        self._small, self._medium = _SmallTier(), _MediumTier()
        self._large: set[Block] = set()
        one = threading.Lock()
        self._locks = {t: one if global_lock else threading.Lock() for t in ("small", "medium", "large")}
        self._count_lock = threading.Lock()
        self._live: set[Block] = set()
        self.allocated = self.peak = 0

    @staticmethod
    def block_size(nbytes: int) -> int:
        """The size of the block alloc(nbytes) hands out (what it costs in memory)."""
        size = (max(1, int(nbytes)) + ALIGN - 1) // ALIGN * ALIGN
        if size < SMALL_MAX:
            return next(c for c in SMALL_CLASSES if c >= size)
        if size <= MEDIUM_MAX:
            return 1 << _MediumTier.order(size)
        return (size + PAGE - 1) // PAGE * PAGE

    def alloc(self, nbytes: int, huge: bool = True) -> Block:
        """A zero-filled block of at least `nbytes`, 64-byte aligned; `huge` False: no transparent huge pages."""
        nbytes = max(1, int(nbytes))
        size = (nbytes + ALIGN - 1) // ALIGN * ALIGN
        if size < SMALL_MAX:
            tier = "small"
            with self._locks[tier]:
                buf, off, got, key = self._small.alloc(size)
        elif size <= MEDIUM_MAX:
            tier = "medium"
            with self._locks[tier]:
                buf, off, got, key = self._medium.alloc(size)
        else:
            tier, got = "large", (size + PAGE - 1) // PAGE * PAGE
            (buf, off), key = _map_large(got, huge), None
        block = Block(self, tier, buf, off, got, nbytes, key)
        with self._count_lock:
            self._live.add(block)
            if tier == "large":
                self._large.add(block)
            self.allocated += nbytes
            self.peak = max(self.peak, self.allocated)
        return block

    def empty(self, shape, dtype=np.float32, huge: bool = True) -> tuple[np.ndarray, Block]:
        dtype = np.dtype(dtype)
        block = self.alloc(int(np.prod(shape)) * dtype.itemsize, huge)
        return block.array(dtype, shape), block

    def _free(self, block: Block) -> None:
        with self._count_lock:
            self._live.discard(block)
            self._large.discard(block)
            self.allocated -= block.requested
        if block.tier == "large":
            _try_close(block.buf)  # views still alive keep it mapped until they go
            return
        with self._locks[block.tier]:
            (self._small if block.tier == "small" else self._medium).release(block)

    def stats(self) -> PoolStats:
        with self._locks["small"]:
            small = self._small.stats()
        with self._locks["medium"]:
            medium = self._medium.stats()
        with self._count_lock:
            large_used = sum(b.size for b in self._large)
            allocated, peak = self.allocated, self.peak
        large = TierStats(large_used, 0, len(self._large), 0.0)
        reserved = small.used + small.free + medium.used + medium.free + large_used
        return PoolStats(allocated, peak, reserved, small, medium, large)

    def release(self, blocks: list[Block]) -> int:
        """Free these blocks now; the resident bytes that went back to the OS (large blocks at once)."""
        returned = 0
        for b in blocks:
            held = resident_bytes(b.buf, b.offset, b.size) if b.tier == "large" and not b.freed else 0
            b.free()
            returned += held if b.buf.closed else 0  # a live view keeps the mapping until it goes
        return returned

    def defrag(self) -> int:
        """Return free memory to the OS: unmap empty slab pages and arenas, DONTNEED free buddy
        ranges. Nothing moves. Returns the bytes that were resident and went back."""
        with self._locks["medium"]:
            returned = self._medium.trim()
        with self._locks["small"]:
            returned += self._small.trim()
        return returned


class Arena:
    """Activation buffers of one forward pass, bump-allocated from one pool block; `reset()` starts a pass.
    A pass that outgrows the block gets numpy memory for the excess, and the next reset resizes the block."""

    def __init__(self, pool: MemoryPool, nbytes: int = 1 << 20):
        self.pool = pool
        self.block = pool.alloc(nbytes)
        self.used = self.high = 0

    def reset(self) -> None:
        want = (self.high + ALIGN - 1) // ALIGN * ALIGN
        if want > self.block.size or (self.block.size > 16 << 20 and want * 4 < self.block.size):
            self.block.free()
            self.block = self.pool.alloc(max(want, 1 << 20))
        self.used = self.high = 0

    def empty(self, shape, dtype=np.float32) -> np.ndarray:
        dtype = np.dtype(dtype)
        count = math.prod(shape) if isinstance(shape, tuple) else int(shape)  # called per op: no numpy here
        nbytes = (count * dtype.itemsize + ALIGN - 1) // ALIGN * ALIGN
        start, self.used = self.used, self.used + nbytes
        self.high = max(self.high, self.used)
        if self.used > self.block.size:
            return np.empty(shape, dtype)
        return np.frombuffer(self.block.buf, dtype, count, self.block.offset + start).reshape(shape)

    def mark(self) -> int:
        return self.used

    def release(self, mark: int) -> None:
        """Everything handed out since `mark` is dead; its space is handed out again."""
        self.used = mark

    def zeros(self, shape, dtype=np.float32) -> np.ndarray:
        a = self.empty(shape, dtype)
        a[...] = 0
        return a

    def free(self) -> None:
        self.block.free()
