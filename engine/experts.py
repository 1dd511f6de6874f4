"""Experts on disk, loaded on demand into a bounded LRU cache, with a background prefetcher.

Load path: one `pread` of an expert's byte span (gate, up, down are consecutive in its file)
into a slot from the memory pool. Nothing stays mapped afterwards, so resident memory follows
the cache budget, not the model size. pread won the measurement (`colibri-bench loads`): as
fast as mmap+copy when the file is in the page cache, faster cold, and it leaves no mapping;
O_DIRECT skips the page cache, so every warm load pays the disk again.

Concurrency: the compute thread pins what it uses (`with cache.use(L, e) as w:`); the loader
thread never evicts a pinned slot. Kernels release the GIL, so loads overlap compute.
"""
from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections import Counter, OrderedDict, deque
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import numpy as np

from engine import tensorfile
from engine.errors import ModelFormatError
from engine.kernels import cpu
from engine.mempool import Block, MemoryPool
from engine.model_dir import ModelDir, expert_file
from engine.weights import ExpertWeights, Matrix

log = logging.getLogger("colibri.experts")
PARTS = ("gate", "up", "down")
SPARE_SLOTS = 2  # evicted slots kept for reuse


class ExpertLoadError(ModelFormatError):
    """An expert's file is missing or damaged; the message names layer and expert."""


@dataclass(frozen=True)
class ExpertSpan:
    path: Path
    offset: int  # file offset of the gate tensor
    nbytes: int  # through the end of the down tensor
    parts: tuple  # (relative offset, rows, row_bytes, code, cols) for gate, up, down


class ExpertStore:
    """Where every expert lives on disk, and how to read one into a buffer."""

    def __init__(self, model: ModelDir):
        self.model = model
        self._spans: dict[tuple[int, int | str], ExpertSpan] = {}
        self._lock = threading.Lock()

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
        """pread the expert into `buf` (uint8, at least span.nbytes); matrices view `buf`.

        `repack`: q4_0/q4_1/q8_0 matrices are rearranged in place into the kernels' 8-row groups
        (cpu.repack_x8: about a third faster to decode, for about 2 ms per 2.4 MB once) — worth
        it for experts that stay, not for ones streamed through a small cache."""
        sp = self.span(layer, expert)
        try:
            fd = os.open(sp.path, os.O_RDONLY)
            try:
                got = os.preadv(fd, [memoryview(buf)[:sp.nbytes]], sp.offset)
            finally:
                os.close(fd)
        except OSError as e:
            raise ExpertLoadError(f"layer {layer} expert {expert}: {sp.path}: {e.strerror}") from None
        if got != sp.nbytes:
            raise ExpertLoadError(f"layer {layer} expert {expert}: {sp.path}: read {got} of {sp.nbytes} bytes "
                                  f"(file truncated?)")
        sfx = "_shexp" if expert == "shared" else f".{expert}"
        mats = []
        for p, (off, rows, rb, code, cols) in zip(PARTS, sp.parts):
            data = buf[off:off + rows * rb].reshape(rows, rb)
            if repack and code in cpu.PACKABLE and rows % 8 == 0:
                cpu.repack_x8(data, code)
                code += cpu.PACKED
            mats.append(Matrix(f"blk.{layer}.ffn_{p}{sfx}.weight", data, code, rows, cols))
        return ExpertWeights(*mats)


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
    block: Block | None = None
    weights: ExpertWeights | None = None
    ready: threading.Event = field(default_factory=threading.Event)
    pins: int = 0
    reserved: bool = False  # a demand load started early; the coming use() takes it over
    early: bool = False
    prefetched: bool = False
    used: bool = False
    error: Exception | None = None


@dataclass(frozen=True)
class CacheStats:
    """Counters of the expert cache, overall and per layer."""
    capacity_per_layer: int
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


class ExpertCache:
    """At most `capacity` experts per layer in memory; least recently used goes first."""

    def __init__(self, store: ExpertStore, pool: MemoryPool, num_layers: int, num_experts: int,
                 capacity: int, prefetch_window: int = 16, top_k: int = 1, repack: bool = True):
        self.store, self.pool = store, pool
        # experts that stay (room for all of them) are repacked for the CPU kernels once
        self.repack = repack and capacity >= num_experts
        self._holds_all = False  # holds_all(), remembered once true
        self.generation = 0  # counts loads and evictions: what a table of expert addresses checks
        self._filling = False
        self.capacity = max(1, capacity)
        self.spare = max(0, self.capacity - top_k)  # slots beyond what one token needs
        self.num_experts = num_experts
        self._lru = [OrderedDict() for _ in range(num_layers)]  # expert -> _Slot, oldest first
        self._lock = threading.Lock()
        self.counters = [LayerCounters() for _ in range(num_layers)]
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
        self._spare: list[Block] = []

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
                    self.counters[layer].wait_s += time.perf_counter() - t0
            if slot.error is not None:
                raise slot.error
            yield slot.weights
        finally:
            with self._lock:
                slot.pins -= 1
                if slot.error is not None:
                    self._drop(layer, expert, slot)
                self._make_room(layer, keep=self.capacity)  # back within budget once released

    def all_ready(self, layer: int, experts) -> bool:
        """Whether every one of these experts is loaded (one kernel call may then take them all)."""
        with self._lock:
            lru = self._lru[layer]
            return all(e in lru and lru[e].ready.is_set() for e in experts)

    def order_for_use(self, layer: int, experts) -> list[int]:
        """The experts of a step with the resident ones first, so loads overlap compute."""
        experts = [int(e) for e in experts]
        with self._lock:
            lru = self._lru[layer]
            ready = [e for e in experts if e in lru and lru[e].ready.is_set()]
        return ready + [e for e in experts if e not in ready]

    def load_ahead(self, layer: int, expert: int) -> None:
        """Start loading the expert needed next on the loader thread (a demand load begun
        early: the compute thread works on the current expert meanwhile)."""
        if self._loader is None:
            return
        slot, load = self._acquire(layer, expert, prefetch=False, reserve=True)
        if load:
            self._queue.put((layer, expert, slot))

    def holds_all(self) -> bool:
        """Whether every expert of every layer is loaded (the cache has room for all and they have
        all been used): prefetching is then pointless."""
        if self._holds_all or self.capacity < self.num_experts:
            return self._holds_all
        with self._lock:  # once true it stays true: with room for every expert nothing is evicted
            self._holds_all = all(len(lru) == self.num_experts for lru in self._lru)
        return self._holds_all

    def resident(self) -> list[list[ExpertWeights]] | None:
        """Every expert of every layer, when the cache has room for all and all are loaded: they
        then stay where they are (nothing is ever evicted), so a kernel may reach them by address
        without pins (engine.models.fused). None otherwise."""
        if self.capacity < self.num_experts:
            return None
        with self._lock:
            out = []
            for lru in self._lru:
                slots = [lru.get(e) for e in range(self.num_experts)]
                if any(s is None or not s.ready.is_set() or s.weights is None for s in slots):
                    return None
                out.append([s.weights for s in slots])
            return out

    def fill(self) -> None:
        """With room for every expert, queue the ones never loaded (once per cache): a small MoE
        then decodes without misses, as a mapped file would (no-op with prefetch off)."""
        if self._filling or self._loader is None or self.capacity < self.num_experts:
            return
        self._filling = True
        for layer in range(len(self._lru)):
            self.prefetch(layer, range(self.num_experts))

    def count_uses(self, picks: np.ndarray, routed: bool = True) -> None:
        """Count a fused decode step's picks (layers, k) as use() and record() count them: hits on
        resident experts, and (routed) the heatmap and the prefetch window."""
        with self._lock:
            for layer, row in enumerate(picks.tolist()):
                c, lru = self.counters[layer], self._lru[layer]
                for e in row:
                    slot = lru[e]
                    lru.move_to_end(e)
                    c.hits += 1
                    c.ready_hits += 1
                    if slot.prefetched and not slot.used:
                        c.prefetch_used += 1
                    slot.used = True
                    if routed:
                        self.activations[layer, e] += 1
                        self._recent[layer].append(e)

    def record(self, layer: int, experts: np.ndarray) -> None:
        """Note the experts a token picked (for the sliding-window prefetch and the heatmap)."""
        with self._lock:
            for e in np.asarray(experts).ravel():
                self.activations[layer, int(e)] += 1
                self._recent[layer].append(int(e))

    def prefetch(self, layer: int, experts, spare_only: bool = False) -> None:
        """Ask the loader to bring these experts of `layer` in (no-op when prefetch is off).

        Predicted picks may replace the least recently used expert; guesses (`spare_only`:
        runners-up, the window's favourites) only use room the top-k does not need.
        """
        if self._loader is None or layer >= len(self._lru):
            return
        wanted = [int(x) for x in experts]
        if spare_only:
            with self._lock:
                window = [e for e, _ in Counter(self._recent[layer]).most_common(self.spare)]
            wanted = list(dict.fromkeys(wanted + window))[:self.spare]
        with self._lock:  # already there or on its way: don't wake the loader for it
            lru = self._lru[layer]
            wanted = [e for e in wanted if e not in lru]
        for e in wanted:
            self._queue.put((layer, e, None))

    # --- internals -------------------------------------------------------------------------
    def _acquire(self, layer: int, expert: int, prefetch: bool,
                 reserve: bool = False) -> tuple[_Slot | None, bool]:
        with self._lock:
            lru, c = self._lru[layer], self.counters[layer]
            slot = lru.get(expert)
            if slot is not None:
                if prefetch or reserve:
                    return slot, False
                lru.move_to_end(expert)
                if slot.reserved:  # counted as a miss when its early load began
                    slot.reserved = False
                    slot.pins += 1
                    return slot, False
                c.hits += 1
                if slot.ready.is_set():
                    c.ready_hits += 1
                if slot.prefetched and not slot.used:
                    c.prefetch_used += 1
                slot.used = True
                slot.pins += 1
                return slot, False
            if prefetch and len(lru) >= self.capacity and not self._evictable(layer):
                return None, False
            self._make_room(layer)
            slot = _Slot(prefetched=prefetch, used=not prefetch, reserved=reserve, early=reserve)
            lru[expert] = slot
            if prefetch:
                c.prefetched += 1
            else:
                c.misses += 1
                slot.pins += 0 if reserve else 1
            return slot, True

    def _evictable(self, layer: int) -> bool:
        return any(s.pins == 0 and not s.reserved and s.ready.is_set() for s in self._lru[layer].values())

    def _make_room(self, layer: int, keep: int | None = None) -> None:
        """Evict least recently used, unpinned experts until the layer holds fewer than its
        capacity (room for one more), or at most `keep`."""
        lru = self._lru[layer]
        limit = self.capacity - 1 if keep is None else keep
        while len(lru) > limit:
            victim = next((e for e, s in lru.items() if s.pins == 0 and not s.reserved and s.ready.is_set()), None)
            if victim is None:
                return  # everything pinned or loading: allow a temporary overflow
            slot = lru.pop(victim)
            c = self.counters[layer]
            c.evictions += 1
            if slot.prefetched and not slot.used:
                c.prefetch_wasted += 1
            self._release(slot)

    def _release(self, slot: _Slot) -> None:
        """Called with the lock held. An evicted slot's memory is kept for the next load (its
        pages are already faulted in, and unmapping is not free), up to SPARE_SLOTS of them."""
        slot.weights = None  # drop the views before the memory is reused
        self.generation += 1
        if slot.block is not None:
            if len(self._spare) < SPARE_SLOTS:
                self._spare.append(slot.block)
            else:
                slot.block.free()
            slot.block = None

    def _take_block(self, nbytes: int) -> Block:
        with self._lock:
            for i, b in enumerate(self._spare):
                if nbytes <= b.size <= 2 * nbytes:
                    return self._spare.pop(i)
        return self.pool.alloc(nbytes)

    def _drop(self, layer: int, expert: int, slot: _Slot) -> None:
        if self._lru[layer].get(expert) is slot and slot.pins == 0:
            self._lru[layer].pop(expert)
            self._release(slot)
            self._holds_all = False

    def _load(self, layer: int, expert: int, slot: _Slot) -> None:
        t0 = time.perf_counter()
        try:
            nbytes = self.store.span(layer, expert).nbytes
            block = self._take_block(nbytes)
            slot.weights = self.store.read_into(layer, expert, block.array(np.uint8, (block.size,)), self.repack)
            slot.block = block
        except Exception as e:  # kept on the slot: the waiting compute thread re-raises it
            slot.error = e
        finally:
            with self._lock:
                c = self.counters[layer]
                if slot.error is None:
                    c.bytes_loaded += nbytes
                self.generation += 1
                if not slot.prefetched and not slot.early:
                    c.wait_s += time.perf_counter() - t0
            slot.ready.set()

    def _prefetch_loop(self) -> None:
        while not self._stop.is_set():
            try:
                layer, expert, slot = self._queue.get(timeout=0.1)
            except queue.Empty:
                continue
            if slot is not None:  # an early demand load: its use() waits for it
                self._load(layer, expert, slot)
                continue
            slot, load = self._acquire(layer, expert, prefetch=True)
            if load:
                self._load(layer, expert, slot)
                if slot.error is not None:
                    with self._lock:
                        self._drop(layer, expert, slot)

    # --- reporting -------------------------------------------------------------------------
    def stats(self) -> CacheStats:
        with self._lock:
            cs = self.counters
            hits, misses = sum(c.hits for c in cs), sum(c.misses for c in cs)
            used, wasted = sum(c.prefetch_used for c in cs), sum(c.prefetch_wasted for c in cs)
            resident = [s for lru in self._lru for s in lru.values() if s.block is not None]
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
                activations=tuple(tuple(int(v) for v in row) for row in self.activations))

    def check_prefetch(self) -> None:
        """Warn once per 256 requests while prefetch accuracy stays under 60%."""
        st = self.stats()
        if st.prefetch_accuracy is not None and st.hits + st.misses - self._warned_at >= 256:
            self._warned_at = st.hits + st.misses
            log.info("expert_cache_hit_rate=%.3f prefetch_accuracy=%.3f", st.hit_rate, st.prefetch_accuracy)
            if st.prefetch_accuracy < 0.6:
                log.warning("prefetch accuracy %.0f%% < 60%%: prefetching wastes loads; consider "
                            "prefetch_window 0 or a larger expert cache", 100 * st.prefetch_accuracy)

    def drop_spares(self) -> None:
        with self._lock:
            for b in self._spare:
                b.free()
            self._spare.clear()

    def close(self) -> None:
        self._stop.set()
        if self._loader is not None:
            self._loader.join(timeout=2)
        with self._lock:
            for lru in self._lru:
                for slot in lru.values():
                    slot.ready.wait(timeout=2)
                    self._release(slot)
                lru.clear()
            for b in self._spare:
                b.free()
            self._spare.clear()


@dataclass(frozen=True)
class CachePlan:
    """How the model's memory splits: what always stays resident, the expert cache, the KV cache."""
    capacity: int  # experts per layer
    expert_bytes: int  # one routed expert
    reason: str
    resident_bytes: int  # embeddings, attention, routers, shared experts (all of a dense model)
    cache_bytes: int  # the routed experts kept: capacity per layer
    kv_bytes: int  # a full KV cache
    available: int  # memory free for this process when planned


def plan_expert_cache(model: ModelDir, params: dict, context_limit: int,
                      available: int | None = None) -> CachePlan:
    """Experts per layer to keep in memory: what the user asked for, or (auto) what fits in the
    memory still available after the resident weights, the KV cache and a safety margin. The one
    estimate of a model's memory: the engine sizes its cache from it, the app's fit check shows it."""
    from engine.kvcache import kv_cache_bytes
    from engine.sysmem import available_memory
    cfg, files = model.config, model.manifest["files"]
    E, L = cfg.num_experts, cfg.num_layers
    routed = lambda rel: rel.startswith("experts/") and not rel.endswith("_shared.bin")  # noqa: E731
    one = sum(e["size"] for rel, e in files.items() if routed(rel)) // max(1, E * L)
    kv = kv_cache_bytes(L, context_limit, cfg.num_kv_heads, cfg.head_dim, params.get("kv_cache_quantize") or "f16")
    avail = available_memory() if available is None else available
    if E == 1:  # dense: the MLP is resident like everything else
        resident = sum(e["size"] for rel, e in files.items() if rel.endswith(".bin"))
        return CachePlan(1, one, "dense model: its one MLP per layer stays in memory", resident, 0, kv, avail)
    resident = sum(e["size"] for rel, e in files.items() if rel.endswith(".bin") and not routed(rel))
    if params.get("expert_cache_size"):
        cap = min(E, params["expert_cache_size"])
        reason = f"{cap} of {E} experts per layer (expert_cache_size)"
    elif params.get("expert_cache_bytes"):
        cap = max(1, min(E, params["expert_cache_bytes"] // max(1, one * L)))
        reason = f"{cap} of {E} experts per layer (expert_cache_bytes)"
    else:
        margin = max(512 << 20, avail // 7)
        cap = max(cfg.top_k, min(E, (avail - kv - resident - margin) // max(1, one * L)))
        reason = (f"auto: {cap} of {E} experts per layer ({cap * one * L / 1e6:.0f} MB; "
                  f"{avail / 1e6:.0f} MB available, KV cache {kv / 1e6:.0f} MB)")
    return CachePlan(cap, one, reason, resident, cap * one * L, kv, avail)
