"""The memory pool: alignment, tiers, counters, and defrag returning memory to the OS (real RSS)."""
from __future__ import annotations

import gc
import os
import random
import threading
from pathlib import Path

import numpy as np
import psutil
import pytest

from engine.mempool import MEDIUM_MAX, SMALL_MAX, MemoryPool


def test_tiers_alignment_and_counters():
    pool = MemoryPool()
    sizes = [1, 63, 64, 100, 4000, SMALL_MAX, 5000, 300_000, MEDIUM_MAX, MEDIUM_MAX + 1, 3 << 20]
    blocks = [pool.alloc(n) for n in sizes]
    assert [b.tier for b in blocks] == ["small"] * 5 + ["medium"] * 4 + ["large"] * 2
    for b, n in zip(blocks, sizes):
        a = b.array(np.uint8, (n,))
        assert a.ctypes.data % 64 == 0 and b.size >= n
        a[:] = 1
    st = pool.stats()
    assert st.allocated == sum(sizes) == st.peak
    assert st.small.blocks == 5 and st.medium.blocks == 4 and st.large.blocks == 2
    for b in blocks:
        b.free()
    st = pool.stats()
    assert st.allocated == 0 and st.peak == sum(sizes) and st.large.blocks == 0


def test_blocks_do_not_overlap():
    pool = MemoryPool()
    rng = random.Random(1)
    live = []
    for i in range(2000):
        if live and rng.random() < 0.4:
            b, val = live.pop(rng.randrange(len(live)))
            assert (b.array(np.uint8, (b.requested,)) == val).all()
            b.free()
        else:
            n = rng.choice([32, 200, 3000, 9000, 70_000, 500_000])
            b = pool.alloc(n)
            b.array(np.uint8, (n,))[:] = i % 251
            live.append((b, i % 251))
    for b, val in live:
        assert (b.array(np.uint8, (b.requested,)) == val).all()


class Chat:
    """What an open conversation holds: a KV block and a few small buffers."""

    def __init__(self, pool, tokens):
        self.block = pool.alloc(tokens * 1024)
        self.kv = self.block.array(np.float32, (tokens, 256))
        self.kv[:] = tokens
        self.small = [pool.alloc(n) for n in (96, 700, 3000)]
        self.tokens = tokens

    def close(self):
        self.kv = None
        self.block.free()
        for b in self.small:
            b.free()


def test_defrag_returns_what_it_says_and_rss_drops_by_it():
    gc.collect()  # earlier tests' pools, unmapped now rather than in the middle of this one
    proc, pool, rng = psutil.Process(), MemoryPool(), random.Random(0)
    rss0 = proc.memory_info().rss
    chats = [Chat(pool, rng.choice([8, 40, 200, 900])) for _ in range(400)]
    rss_open = proc.memory_info().rss
    for c in rng.sample(chats, 320):
        c.close()
        chats.remove(c)
    rss_closed = proc.memory_info().rss
    returned = pool.defrag()
    rss_after = proc.memory_info().rss
    assert rss_open - rss0 > 80e6  # the chats really used memory
    assert returned > 50e6
    assert abs((rss_closed - rss_after) - returned) < 0.05 * returned + (2 << 20)  # the RSS change it reports
    assert pool.defrag() == 0  # nothing more to give back
    for c in chats:  # blocks in use kept their contents (nothing moves)
        assert (c.kv == c.tokens).all()


def test_defrag_counts_no_memory_that_was_never_touched():
    pool = MemoryPool()
    blocks = [pool.alloc(n) for n in (5000, 300_000, 900_000, 2000)]
    for b in blocks:
        b.free()
    assert pool.defrag() == 0  # the old count said 4 MiB arenas here, none of it resident
    assert pool.release([pool.alloc(8 << 20)]) == 0


def test_release_counts_the_resident_pages_of_large_blocks():
    pool = MemoryPool()
    b = pool.alloc(8 << 20)
    b.array(np.uint8, (b.size,))[: 3 << 20] = 1  # 3 MiB touched (THP may round it to 4)
    got = pool.release([b])
    assert 3 << 20 <= got <= 4 << 20


@pytest.mark.parametrize("global_lock", [False, True])
def test_threads_share_a_pool(global_lock):
    pool = MemoryPool(global_lock=global_lock)

    def churn(seed):
        rng = random.Random(seed)
        for _ in range(3000):
            b = pool.alloc(rng.choice([100, 2000, 16 << 10, 100 << 10]))
            b.array(np.uint8, (b.requested,))[:8] = 1
            b.free()
    ts = [threading.Thread(target=churn, args=(s,)) for s in range(2)]
    [t.start() for t in ts]
    [t.join() for t in ts]
    assert pool.stats().allocated == 0


def _smaps_entry(address: int) -> dict[str, int]:
    """The /proc/self/smaps fields (kB) of the mapping that holds `address`."""
    fields, inside = {}, False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()
            if "-" in head[0] and len(head) >= 5 and ":" not in head[0]:
                lo, hi = (int(v, 16) for v in head[0].split("-"))
                inside = lo <= address < hi
            elif inside and line.rstrip().endswith("kB"):
                fields[head[0].rstrip(":")] = int(head[1])
    return fields


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="Linux only")
def test_large_blocks_are_private_and_ask_for_huge_pages():
    """Expert slots stream through the kernels: 2 MB-aligned private pages that can be huge
    (shared anonymous memory is shmem: never huge, and DONTNEED does not free it)."""
    pool = MemoryPool()
    block = pool.alloc(8 << 20)
    a = block.array(np.uint8, (block.size,))
    a[:] = 1
    address = a.ctypes.data
    assert address % (2 << 20) == 0
    entry = _smaps_entry(address)
    assert entry.get("Shared_Clean", 0) + entry.get("Shared_Dirty", 0) == 0 and entry["Anonymous"] >= 8 << 10
    thp = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    if thp.exists() and "[never]" not in thp.read_text():
        assert entry.get("AnonHugePages", 0) > 0, entry
    del a
    block.free()


def test_a_kv_cache_is_paid_as_its_context_fills():
    """A KV cache's first position in each layer must not fault in a 2 MB huge page: a 16-slot
    server held 1.9 GB for SmolLM2 that way (30 layers x K and V x 2 MB per cache)."""
    from engine.kvcache import KVCache
    from engine.mempool import resident_bytes
    pool = MemoryPool()
    cache = KVCache(8, 8192, 3, 64, "f16", pool)  # 3 MB of keys a layer
    cache.k[:, :4] = 1  # the first 4 positions of every layer, keys and values
    cache.v[:, :4] = 1
    held = sum(resident_bytes(b.buf, b.offset - b.offset % 4096, b.size) for b in cache._blocks)
    assert held <= 2 * 8 * 16 * 4096, held  # a page or so per layer each, not 2 MB
    cache.free()


def _mapped_rss_kb(name: str) -> int:
    rss, mapped = 0, False
    for line in open("/proc/self/smaps"):
        head = line.split()
        if "-" in head[0] and len(head) >= 5 and ":" in head[3]:
            mapped = head[-1].endswith("/" + name)
        elif mapped and head[0] == "Rss:":
            rss += int(head[1])
    return rss


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="Linux only")
def test_unmapping_a_library_drops_only_clean_read_only_pages(tmp_path):
    """unmap_library_pages (warm-up runs it on LLVM's library) drops the resident pages of clean,
    read-only mappings of the named file, and leaves a page the process wrote (copy-on-write)
    alone, writable or made read-only since (as a library's RELRO is): dropping it would revert
    it to the file's bytes."""
    import ctypes
    import mmap

    from engine.mempool import unmap_library_pages
    size = 64 * mmap.PAGESIZE
    lib = tmp_path / "libfake.so"
    lib.write_bytes(bytes(range(256)) * (size // 256))
    with open(lib, "rb") as f:
        clean = mmap.mmap(f.fileno(), size, prot=mmap.PROT_READ)  # read-only, private
        written = mmap.mmap(f.fileno(), size, flags=mmap.MAP_PRIVATE)  # copy-on-write
        relro = mmap.mmap(f.fileno(), size, flags=mmap.MAP_PRIVATE)
    assert sum(clean[i] for i in range(0, size, mmap.PAGESIZE)) >= 0  # fault every page in
    written[0] = relro[0] = 7
    libc = ctypes.CDLL(None, use_errno=True)
    addr = ctypes.addressof(ctypes.c_char.from_buffer(relro))
    assert libc.mprotect(ctypes.c_void_p(addr), ctypes.c_size_t(size), mmap.PROT_READ) == 0
    assert _mapped_rss_kb("libfake.so") >= size // 1024
    released = unmap_library_pages("libfake.so")
    assert released == size  # the clean mapping's 64 pages, nothing of the other two
    assert written[0] == 7 and relro[0] == 7 and written[1] == 1  # what was written is still there
    assert clean[5 * mmap.PAGESIZE + 3] == 3  # a dropped page faults back in from the file
    assert unmap_library_pages("libnothing.so") == 0
