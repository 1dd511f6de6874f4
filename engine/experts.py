"""The expert cache: routed experts loaded on demand (engine.expert_store reads them) into pool
slots under one byte budget (engine.cache_plan sizes it), LFU by default, LRU on request, with a
prefetcher whose predictions pause while most of the latest guesses are evicted unused.

Concurrency: the compute thread pins what it uses (`with cache.use(L, e) as w:`); the loader
thread never evicts a pinned slot. Kernels and reads release the GIL, so loads overlap compute.
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from collections import Counter, OrderedDict, deque
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator

import numpy as np

from engine.expert_store import ExpertStore, routed_bytes
from engine.mempool import Block, MemoryPool
from engine.weight_types import CacheStats, ExpertWeights

log = logging.getLogger("colibri.experts")
PARTS = ("gate", "up", "down")
MiB = 1 << 20
# evicted slots kept for reuse (counted in the budget): a miss that evicts takes its victim's block,
# already faulted in. A second spare cost RSS and gained no decode speed
SPARE_SLOTS = 1
# eviction policies; lfu ages by LFU_DECAY a token. lfu is the default: on the default model's
# routing trace one LFU over all layers beat LRU, most where memory is short (test_experts replays it)
POLICIES = ("lfu", "lru")
LFU_DECAY = 0.98
# predictions go out only while, of the last PREFETCH_OUTCOMES resolved ones, at least
# PREFETCH_MIN_ACCURACY were used: a wasted guess costs a read and evicts an expert someone wanted.
# While paused, one call in PREFETCH_PROBE still goes out so the estimate follows the routing
PREFETCH_MIN_ACCURACY = 0.6
PREFETCH_OUTCOMES = 32
PREFETCH_PROBE = 16
# a layer's misses are read together, this many at a time (each on its own reader thread, its 1 MiB
# pieces on the store's I/O threads): one miss after another left the disk mostly idle
READ_AHEAD = 8


def min_budget(top_k: int, slot: int) -> int:
    """The smallest expert cache: one layer's picks, one ahead, and the spare slots."""
    return (top_k + 1 + SPARE_SLOTS) * slot


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


class ExpertCache:
    """Experts in memory under one byte budget shared by all layers (optionally at most `per_layer`
    of each layer), evicted by `policy`: "lfu" (the default) or "lru"."""

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
        # (layer, expert) in _slots, loaded in a pool slot (not mapped): eviction's candidates, before pins
        self._loaded = np.zeros((num_layers, num_experts), bool)
        self.num_layers, self.num_experts, self.top_k = num_layers, num_experts, top_k
        self.per_layer = None if per_layer is None else max(1, min(per_layer, num_experts))
        self.slot = pool.block_size(store.span(store.model.config.dense_layers, 0).slot_bytes) if num_layers else 0  # a routed expert
        self.all_bytes = routed_bytes(store) if num_layers else 0  # every routed expert's slot
        self.generation = 0  # counts loads and evictions into slots: what a table of expert addresses checks
        self._lock = threading.Lock()
        self._slots: OrderedDict[tuple[int, int], _Slot] = OrderedDict()  # least recently used first
        self._count = [0] * num_layers  # experts of each layer in _slots
        self._scanning = False  # a prompt's pass over the layers (scan())
        self._used = 0  # bytes of the slots in _slots and of the spare blocks
        self._spare: list[Block] = []
        self._holds_all = False  # holds_all(), remembered once true
        self._filling = self._quiet = False
        self._frozen: int | None = None  # inside frozen(L): only experts of layers below L are evicted
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
        self._readers: ThreadPoolExecutor | None = None  # early demand loads (load_ahead), READ_AHEAD at a time
        self._order: dict[int, list[int]] = {}  # each layer's last order_for_use: what load_ahead reads ahead in
        if prefetch_window > 0:
            self._loader = threading.Thread(target=self._prefetch_loop, name="colibri-prefetch", daemon=True)
            self._loader.start()
        self._warned_at = 0
        self._outcomes: deque = deque(maxlen=PREFETCH_OUTCOMES)  # 1 used, 0 evicted unused: the latest guesses
        self._probe = 0
        self.prefetch_skipped = 0

    def set_budget(self, budget: int) -> None:
        """A new byte budget (memory pressure changed); evicts down to it at once where it can."""
        E, k = self.num_experts, self.top_k
        with self._lock:
            self.budget = max(int(budget), min_budget(k, self.slot))  # one layer's picks + one ahead
            if E == 1:  # a dense model's MLPs: counted with its dense weights, never evicted
                self.budget = max(self.budget, self.all_bytes + SPARE_SLOTS * self.slot)
            # room for all: by bytes (layers' experts may differ in size), as _make_room counts them
            fits_all = self.budget - SPARE_SLOTS * self.slot >= self.all_bytes
            self.room_for_all = fits_all and (self.per_layer is None or self.per_layer >= E)
            # experts of a mean size: layers' experts may differ (Q4_K_M's Q6_K downs), and layer 0's
            # slot taken for all read an explicit 2 of 8 as 1 a layer
            per_layer = (self.budget - SPARE_SLOTS * self.slot) * E // max(1, self.all_bytes)
            per_layer = E if fits_all else min(E - 1, per_layer)
            self.capacity = min(E, self.per_layer or E, max(1, per_layer))  # experts per layer it amounts to
            self.store.holds_every_expert = self.room_for_all
            self.spare = max(0, self.capacity - k)  # slots a layer has beyond what one token needs
            # predictions only pay when the next layer's picks fit beside this layer's, and when a
            # layer holds more than one token's picks: with exactly k a guess evicts an expert the
            # next token reuses
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
        """The experts of a step with the resident ones first, so loads overlap compute (load_ahead
        reads the missing ones in this order)."""
        experts = [int(e) for e in experts]
        with self._lock:
            ready = [e for e in experts if (s := self._slots.get((layer, e))) is not None and s.ready.is_set()]
        order = ready + [e for e in experts if e not in ready]
        self._order[layer] = order
        return order

    def load_ahead(self, layer: int, expert: int) -> None:
        """Start loading the expert needed next and the missing ones after it in the layer's order
        (order_for_use's), READ_AHEAD in flight at most (and what the budget holds beside one token's
        picks), on the reader threads while this one computes."""
        if not self._ahead_pays():
            return
        order = self._order.get(layer, ())
        i = order.index(expert) if expert in order else -1
        room = max(1, min(READ_AHEAD, self.budget // max(1, self.slot) - self.top_k - SPARE_SLOTS))
        todo: list[int] = []
        with self._lock:
            busy = 0
            for e in [expert] if i < 0 else order[i:]:
                s = self._slots.get((layer, e))
                if s is not None:
                    busy += not s.ready.is_set()
                elif busy + len(todo) < room:
                    todo.append(e)
                if busy + len(todo) >= room:
                    break
        for e in todo:
            slot, load = self._acquire(layer, e, prefetch=False, reserve=True)
            if load:
                if self._readers is None:
                    self._readers = ThreadPoolExecutor(READ_AHEAD, "colibri-read")
                self._readers.submit(self._load, layer, e, slot)

    def holds_all(self) -> bool:
        """Whether every expert of every layer is loaded (then prefetching is pointless)."""
        if self._holds_all or not self.room_for_all:
            return self._holds_all
        with self._lock:  # once true it stays true: with room for every expert nothing is evicted
            self._holds_all = all(c == self.num_experts for c in self._count)
        return self._holds_all

    def resident(self) -> list[list[ExpertWeights]] | None:
        """Every expert of every layer when the budget has room for all and all are loaded (nothing is
        then evicted, so a kernel may reach them by address without pins); None otherwise."""
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
        """With room for every expert, queue the ones never loaded (once per cache), so a small MoE decodes
        without misses; these loads count in fill_bytes, not in prefetch accuracy."""
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
        """Lookups inside (warmup) are not counted: no hits, misses, activations, window or prefetch use."""
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

    @contextmanager
    def frozen(self, below: int = 0) -> Iterator[None]:
        """Inside, only experts of layers below `below` are evicted, so a kernel going through the
        layers from `below` on may read the held experts (held()) by address, unpinned. A load meanwhile
        that finds no such victim gives up; the budget is enforced again on the way out."""
        with self._lock:
            self._frozen = below
        try:
            yield
        finally:
            with self._lock:
                self._frozen = None
                self._make_room(None, 0)

    def held(self) -> dict[tuple[int, int], ExpertWeights]:
        """The experts loaded in pool slots now, by (layer, expert): what frozen() lets a kernel reach."""
        with self._lock:
            return {k: s.weights for k, s in self._slots.items()
                    if s.ready.is_set() and s.weights is not None and s.error is None and not s.mapped}

    @contextmanager
    def scan(self) -> Iterator[None]:
        """A prompt's pass: each layer's routed experts in turn, once each. Its loads evict within their own
        layer once that holds its share, else from a layer above its share (not the first layers, where
        the decode that follows starts)."""
        with self._lock:
            self._scanning = True
        try:
            yield
        finally:
            with self._lock:
                self._scanning = False

    def drain(self, timeout: float = 10.0) -> None:
        """Wait until the loader has nothing queued or loading."""
        t_end = time.monotonic() + timeout
        while time.monotonic() < t_end:
            with self._lock:
                busy = any(not s.ready.is_set() for s in self._slots.values())
            if self._queue.unfinished_tasks == 0 and not busy:  # (task_done after each item is handled)
                return
            time.sleep(0.002)

    def count_uses(self, picks: np.ndarray, routed: bool = True, layers: range | None = None) -> None:
        """Count a fused decode step's picks (layers, k), or those of `layers`, as use() and record() do."""
        with self._lock:
            if self._quiet:
                return
            for layer in layers if layers is not None else range(len(picks)):
                c = self.counters[layer]
                for e in picks[layer].tolist():
                    self._warm(layer, e)
                    self._slots.move_to_end((layer, e))
                    self._hit(c, self._slots[(layer, e)], ready=True)
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

    def prefetch(self, layer: int, experts, spare_only: bool = False, due: bool = False) -> None:
        """Ask the loader to bring these experts of `layer` in (no-op without predictions). Guesses
        (`spare_only`: runners-up, the window's favourites) only use room the top-k does not need.
        `due`: the caller asked prediction_due() already (held-back predictions are not counted twice)."""
        if layer >= self.num_layers or not self.predict or not self._ahead_pays() or \
                not (due or self._prefetch_pays()):
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

    def prediction_due(self) -> bool:
        """Whether a layer's predictions go out now: prefetching(), and not held back (prefetch_paused).
        Asked before the router looks ahead: held back, that matmul is not worth doing either."""
        return not self.holds_all() and self.prefetching() and self._prefetch_pays()

    def prefetching(self) -> bool:
        """Whether predictions can go out at all: a loader, misses that read the disk, room (predict)."""
        return self.predict and self._ahead_pays()

    def _ahead_pays(self) -> bool:
        """Whether loading ahead can pay: a loader thread, and misses that read the disk."""
        return self._loader is not None and not self.store.keeps_page_cache()

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
                    self._hit(c, slot, slot.ready.is_set())
                slot.pins += 1
                return slot, False
            if prefetch and (self._full(layer) or self._over(nbytes)) and not self._evictable(layer):
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
            if not mapped and (block := self._fitting_spare(nbytes)) is not None:
                slot.block, slot.nbytes = block, block.size  # (its bytes, counted as a spare, become the slot's)
            else:
                self._used += nbytes
            if prefetched:
                c.prefetched += 1
            elif not prefetch and count:
                c.misses += 1
            slot.pins += 0 if reserve or prefetch else 1
            return slot, True

    def _hit(self, c: LayerCounters, slot: _Slot, ready: bool) -> None:
        c.hits += 1
        c.ready_hits += ready
        if slot.prefetched and not slot.used:
            c.prefetch_used += 1
            self._outcomes.append(1)
        slot.used = True

    def _warm(self, layer: int, expert: int) -> None:
        """Lock held, once per counted lookup: one more use, weighing 1/decay more than the last
        (comparing these sums compares decayed counts), rescaled before the weights overflow."""
        self._weight *= self._grow
        self._heat[layer, expert] += self._weight
        if self._weight > 1e200:
            self._heat /= self._weight
            self._weight = 1.0

    def _full(self, layer: int) -> bool:
        return self.per_layer is not None and self._count[layer] >= self.per_layer

    def _over(self, nbytes: int) -> bool:
        """Whether `nbytes` more overflow the budget (spare blocks count as room: a load reuses one)."""
        return self._used - sum(b.size for b in self._spare) + nbytes > self.budget - SPARE_SLOTS * self.slot

    def _evictable(self, layer: int) -> bool:
        """Whether _make_room could free room for one more expert of `layer` (a full layer: its own)."""
        return self._victim(layer if self._full(layer) else None) is not None

    def _make_room(self, layer: int | None, nbytes: int) -> None:
        """Lock held. Evict unpinned experts (by the policy) until `nbytes` more fit (and, per_layer set,
        `layer`'s count); everything pinned or loading: a temporary overflow."""
        if layer is not None and self.per_layer is not None:
            while self._count[layer] + 1 > self.per_layer and (k := self._victim(layer)) is not None:
                self._evict(k)
        scan = layer is not None and self._scanning
        while self._over(nbytes) and (k := self._scan_victim(layer) if scan else self._victim(None)) is not None:
            self._evict(k)
        while self._spare and self._used + nbytes > self.budget:  # spares last: they save a fresh mapping
            block = self._spare.pop()
            self._used -= block.size
            block.free()

    def _victim(self, in_layer: int | None, among: set[int] | None = None) -> tuple[int, int] | None:
        """Lock held: the expert the policy evicts next (of `in_layer`, of the layers `among`, or any)."""
        below = self.num_layers if self._frozen is None else self._frozen
        ok = lambda s: s.pins == 0 and not s.reserved and s.ready.is_set()  # noqa: E731
        if self.policy == "lru":
            return next((k for k, s in self._slots.items() if (in_layer is None or k[0] == in_layer) and k[0] < below
                         and (among is None or k[0] in among) and ok(s) and not s.mapped), None)
        rows = np.zeros(self.num_layers, bool)  # lfu: the coldest loaded expert (numpy: a scan of the
        if in_layer is not None:  # slots in Python cost more than a miss's read at a thousand slots)
            rows[in_layer] = in_layer < below
        else:
            rows[:below] = True
        if among is not None:
            rows &= np.isin(np.arange(self.num_layers), list(among))
        heat = np.where(self._loaded & rows[:, None], self._heat, np.inf)
        while (v := heat.min()) < np.inf:
            ties = np.flatnonzero(heat == v)
            keys = {divmod(int(t), self.num_experts) for t in ties}
            if len(keys) == 1 and ok(self._slots[k := next(iter(keys))]):
                return k
            if len(keys) > 1:  # LRU among ties
                k = next((k for k, s in self._slots.items() if k in keys and ok(s)), None)
                if k is not None:
                    return k
            heat.flat[ties] = np.inf  # pinned, reserved or still loading
        return None

    def _scan_victim(self, layer: int) -> tuple[int, int] | None:
        """Lock held, in scan(): of `layer` once it holds its share, else of a layer above its share."""
        if self._count[layer] >= self.capacity and (k := self._victim(layer)) is not None:
            return k
        over = {L for L, n in enumerate(self._count) if n > self.capacity}
        return (self._victim(None, over) if over else None) or self._victim(None)

    def _pass_through(self, layer: int, expert: int, nbytes: int) -> bool:
        """Lock held, for a demand miss: serve it mapped from the page cache for its one use instead of a
        pool slot, while misses keep their page-cache copy, under LFU, if the expert it would evict is hotter."""
        if self.policy != "lfu" or self.room_for_all or not self.store.keeps_page_cache():
            return False
        if self._full(layer):
            v = self._victim(layer)
        elif self._over(nbytes):
            v = self._victim(None)
        else:
            return False  # room without evicting anything
        return v is not None and self._heat[layer, expert] <= self._heat[v]

    def _evict(self, key: tuple[int, int]) -> None:
        slot = self._slots.pop(key)
        self._loaded[key] = False
        self._count[key[0]] -= 1
        c = self.counters[key[0]]
        if not self._quiet:
            c.evictions += 1
            c.prefetch_wasted += slot.prefetched and not slot.used
            if slot.prefetched and not slot.used:
                self._outcomes.append(0)
        self._release(slot)

    def _release(self, slot: _Slot) -> None:
        """Lock held. An evicted slot's memory is kept for the next load, up to SPARE_SLOTS of them."""
        slot.weights = None  # drop the views before the memory is reused
        self.generation += not slot.mapped  # (a mapped miss is in no address table)
        self._used -= slot.nbytes
        if slot.block is not None:
            if len(self._spare) < SPARE_SLOTS:
                self._spare.append(slot.block)
                self._used += slot.block.size
            else:
                slot.block.free()
            slot.block = None

    def _fitting_spare(self, nbytes: int) -> Block | None:
        """Lock held: a spare block that fits `nbytes`, taken out of the spares (its bytes stay counted)."""
        for i, b in enumerate(self._spare):
            if nbytes <= b.size <= 2 * nbytes:
                return self._spare.pop(i)
        return None

    def _take_block(self, slot: _Slot, nbytes: int) -> Block:
        """The block _acquire handed the slot (its victim's, already faulted in: a fresh block's first
        touch cost several times the read itself), else a spare that fits, else a fresh one of the size
        _acquire counted (slot.nbytes)."""
        with self._lock:
            if slot.block is not None:
                return slot.block
            if (b := self._fitting_spare(nbytes)) is not None:  # its bytes, counted as a spare, become the slot's
                self._used -= slot.nbytes
                slot.nbytes = b.size
                return b
        return self.pool.alloc(nbytes)

    def _drop(self, layer: int, expert: int, slot: _Slot) -> None:
        if self._slots.get((layer, expert)) is slot and slot.pins == 0:
            self._slots.pop((layer, expert))
            self._loaded[layer, expert] = False
            self._count[layer] -= 1
            self._release(slot)
            self._holds_all = False

    def _load(self, layer: int, expert: int, slot: _Slot, fill: bool = False) -> None:
        t0, nbytes = time.perf_counter(), 0
        try:
            sp = self.store.span(layer, expert)
            nbytes = sp.nbytes
            if slot.mapped:
                slot.weights = self.store.map(layer, expert)
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
                    if not slot.mapped and self._slots.get((layer, expert)) is slot:
                        self._loaded[layer, expert] = True
                    if fill:
                        self.fill_bytes += nbytes
                    c.bytes_loaded += nbytes
                self.generation += not slot.mapped
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
                prefetch_paused=self.prefetch_paused, prefetch_skipped=self.prefetch_skipped)

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
        if self._readers is not None:
            self._readers.shutdown(wait=True)
        with self._lock:
            for slot in self._slots.values():
                slot.ready.wait(timeout=2)
                self._release(slot)
            self._slots.clear()
            self._loaded[:] = False
            self._count = [0] * self.num_layers
            for b in self._spare:
                b.free()
            self._spare.clear()
            self._used = 0
