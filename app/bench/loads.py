"""colibri-bench loads and pool: how an expert is read (mmap, pread, O_DIRECT; cold and warm), what
repacking on a miss costs against experts stored repacked, decode paired across the two layouts, and
the memory pool's per-tier locks. Kernel- and I/O-level measurements beside `colibri-bench memory`'s
whole-engine matrix (app/bench/memory.py, whose page-cache helpers these use)."""
from __future__ import annotations

import mmap
import time
from pathlib import Path

from app.bench.memory import page_cache_bytes, evict, warm

def _load_mmap(path: Path, offset: int, nbytes: int, out) -> None:
    with open(path, "rb") as f:
        start = offset // mmap.ALLOCATIONGRANULARITY * mmap.ALLOCATIONGRANULARITY
        mm = mmap.mmap(f.fileno(), nbytes + offset - start, access=mmap.ACCESS_READ, offset=start)
        try:
            out[:nbytes] = memoryview(mm)[offset - start:offset - start + nbytes]
        finally:
            mm.close()  # nothing stays mapped, as with the other two


def measure_loads(model: Path, repeats: int = 7) -> dict:
    """Cold (page cache evicted) and warm (file in the page cache) loads of experts, medians: the
    expert store's own read modes into a pool slot (auto: page-cache copy + O_DIRECT for the rest,
    direct, dontneed: pread then FADV_DONTNEED, cached: plain pread, the copy stays), beside mmap
    + copy; and what each leaves in the page cache. Each repeat reads a different expert."""
    import statistics

    import numpy as np

    from engine.expert_store import ExpertStore
    from engine.mempool import MemoryPool
    from engine.model_dir import open_model_dir
    md = open_model_dir(model)
    cfg = md.config
    keys = [(L, e) for L in range(cfg.num_layers) for e in range(cfg.num_experts)][:repeats]
    pool = MemoryPool()
    probe = ExpertStore(md)
    block = pool.alloc(max(probe.span(*k).slot_bytes for k in keys))
    buf = block.array(np.uint8, (block.size,))
    buf[:] = 0  # a reused slot: its pages are already there
    result = {"expert_mb": probe.span(*keys[0]).nbytes / 1e6}
    for mode in ("auto", "direct", "dontneed", "cached", "mmap"):
        store = ExpertStore(md, read_mode="cached" if mode == "mmap" else mode)
        for state in ("cold", "warm"):
            times, left = [], 0
            for k in keys:
                sp = store.span(*k)
                if state == "cold":
                    evict([sp.path])
                else:
                    warm([sp.path])
                t = time.perf_counter()
                if mode == "mmap":
                    _load_mmap(sp.path, sp.offset, sp.nbytes, buf)
                else:
                    store.read_into(*k, buf)
                times.append(time.perf_counter() - t)
                left += max(0, page_cache_bytes(sp.path))
            med = statistics.median(times)
            result[f"{mode}_{state}_ms"] = med * 1e3
            result[f"{mode}_{state}_mb_s"] = result["expert_mb"] / med
            result[f"{mode}_{state}_page_cache_left_mb"] = left / len(keys) / 1e6
        store.close()
    block.free()
    return result


def measure_repack(model: Path, repeats: int = 15) -> dict:
    """A streamed expert's miss, then one token through it (gate, up, down), medians in ms, the
    ways alternating. A model in the stored layout: its kernels on the stored layout ("stored"),
    or repack_x8 on the miss and the 8-row-group kernels ("repacked"). A model repacked at convert
    time: the read alone and the 8-row-group kernels ("on_disk"), beside the stored layout's
    kernels on an unpacked copy of the same expert ("stored_token_ms") and what repacking that
    copy costs the old path on each miss ("repack_ms"). `repacked_on_disk` says which it was."""
    import statistics

    import numpy as np

    from engine import quant
    from engine.expert_store import ExpertStore
    from engine.kernels import cpu
    from engine.mempool import MemoryPool
    from engine.model_dir import open_model_dir
    from engine.weight_types import ExpertWeights, Matrix
    store, pool = ExpertStore(open_model_dir(model)), MemoryPool()
    sp = store.span(0, 0)
    block = pool.alloc(sp.slot_bytes)
    buf = block.array(np.uint8, (block.size,))
    w = store.read_into(0, 0, buf)
    on_disk = w.gate.code > cpu.PACKED
    x = np.random.default_rng(0).standard_normal((1, w.gate.cols)).astype(np.float32)
    out: dict = {"repacked_on_disk": float(on_disk)}

    def token(ew):
        g = np.empty((1, ew.gate.rows), np.float32)
        cpu.matmul(ew.gate.data, ew.gate.code, x, g, False)
        cpu.matmul(ew.up.data, ew.up.code, x, g, False)
        d = np.empty((1, ew.down.rows), np.float32)
        cpu.matmul(ew.down.data, ew.down.code, np.zeros((1, ew.down.cols), np.float32), d, False)

    def unpacked(ew):  # the same expert in the stored layout (a copy)
        return ExpertWeights(*(Matrix(m.name, quant.unpack_x8(m.data, quant.get(m.code).base.name), m.code - cpu.PACKED,
                                      m.rows, m.cols) if m.code > cpu.PACKED else m for m in (ew.gate, ew.up, ew.down)))
    stored = unpacked(w) if on_disk else None

    def repack(ew) -> float:
        """Seconds repack_x8 takes on a copy of each stored matrix (the copies not counted)."""
        spent = 0.0
        for m in (ew.gate, ew.up, ew.down):
            if m.code in cpu.PACKABLE and m.rows % 8 == 0:
                data = m.data.copy()
                t = time.perf_counter()
                cpu.repack_x8(data, m.code)
                spent += time.perf_counter() - t
        return spent
    ways = (("on_disk", False),) if on_disk else (("stored", False), ("repacked", True))
    for _, rp in ways:  # compile each variant first
        token(store.read_into(0, 0, buf, repack=rp))
    if on_disk:
        token(stored)
        repack(stored)
    times: dict = {}
    for i in range(repeats):  # the miss path: read (and repack), then the token's first use
        for name, rp in ways if i % 2 == 0 else ways[::-1]:
            t = time.perf_counter()
            ew = store.read_into(0, 0, buf, repack=rp)
            t1 = time.perf_counter()
            token(ew)
            times.setdefault(f"{name}_read_ms", []).append(t1 - t)
            times.setdefault(f"{name}_token_ms", []).append(time.perf_counter() - t1)
        if on_disk:
            t = time.perf_counter()
            token(stored)
            times.setdefault("stored_token_ms", []).append(time.perf_counter() - t)
            times.setdefault("repack_ms", []).append(repack(stored))
    out |= {k: statistics.median(v) * 1e3 for k, v in times.items()}
    if not on_disk:
        out["miss_ms_repacked_minus_stored"] = (out["repacked_read_ms"] + out["repacked_token_ms"]
                                                - out["stored_read_ms"] - out["stored_token_ms"])
    block.free()
    store.close()
    return out


def measure_layout_decode(models: dict[str, Path], threads: int = 1, tokens: int = 150, cache: int = 2) -> dict:
    """The same model in two layouts (e.g. repacked on disk and --no-repack_experts), `cache` experts
    a layer, both loaded in this process and fed the same tokens, each token to one then the other
    (order alternating): paired, so the machine's noise falls on both (greedy decoding would drift
    apart on the stored kernels' last bits and route differently). Per layout: median ms a token,
    and a token's waits for expert reads (the cache's counters); the median paired difference."""
    import statistics

    import numpy as np

    from engine.api import Engine
    engs = {name: Engine(path, threads=threads, expert_cache_size=cache, context_length=tokens + 64, log_level="WARN")
            for name, path in models.items()}
    try:
        for e in engs.values():
            e.warmup()
            e.reset()
        rng = np.random.default_rng(0)
        vocab = min(e.cfg.vocab_size for e in engs.values())
        prompt, feed = ([int(i) for i in rng.integers(vocab // 4, vocab, k)] for k in (16, tokens))
        for e in engs.values():
            e.forward(prompt)
        wait0 = {k: sum(c.wait_s for c in e.weights.experts.counters) for k, e in engs.items()}
        spent: dict[str, list[float]] = {k: [] for k in engs}
        for i, tok in enumerate(feed):
            for k in list(engs) if i % 2 == 0 else list(engs)[::-1]:
                t = time.perf_counter()
                engs[k].forward([tok])
                spent[k].append(time.perf_counter() - t)
        out = {}
        for k, e in engs.items():
            out[f"{k}_ms_per_token"] = statistics.median(spent[k]) * 1e3
            out[f"{k}_read_wait_ms_per_token"] = (sum(c.wait_s for c in e.weights.experts.counters) - wait0[k]) / tokens * 1e3
        a, b = list(engs)
        out[f"{a}_minus_{b}_ms_per_token"] = statistics.median(x - y for x, y in zip(spent[a], spent[b])) * 1e3
        return out
    finally:
        for e in engs.values():
            e.close()


# --- memory pool: one lock per tier against one global lock ----------------------------------

def measure_pool_locks(ops: int = 20000, repeats: int = 5) -> dict:
    """Two threads allocate, touch and free blocks of every tier; medians of `repeats` runs."""
    import random
    import statistics
    import threading

    import numpy as np

    from engine.mempool import MemoryPool

    def churn(pool: MemoryPool, seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(ops):
            b = pool.alloc(rng.choice([200, 3000, 64 << 10, 512 << 10, 2 << 20]))
            b.array(np.uint8, (b.requested,))[:4096] = 1  # touch it, as a real user would
            b.free()

    out = {}
    for name, global_lock in (("per_tier", False), ("global", True)):
        times = []
        for _ in range(repeats):
            pool = MemoryPool(global_lock=global_lock)
            ts = [threading.Thread(target=churn, args=(pool, s)) for s in range(2)]
            t0 = time.perf_counter()
            for t in ts:
                t.start()
            for t in ts:
                t.join()
            times.append(time.perf_counter() - t0)
        out[f"{name}_s"] = statistics.median(times)
    out["global_over_per_tier"] = out["global_s"] / out["per_tier_s"]
    return out
