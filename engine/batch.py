"""Many replies at once on one engine: each `Sequence` has its own KV cache (pool blocks), and
one decode step runs the next token of every sequence in one forward pass (`decode_batch`,
engine.models.rows). A `PrefixCache` keeps the KV of recent prompts, so a request sharing a
system prompt or earlier turns skips their prefill.
"""
from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Sequence as Seq
from typing import TYPE_CHECKING, Any

import numpy as np

from engine.kernels import cpu
from engine.kvcache import KVCache
from engine.mempool import unmap_compiler_pages
from engine.models.rows import batchable, expert_bytes
from engine.reply import Reply

if TYPE_CHECKING:
    from engine.api import Engine


class PrefixCache:
    """The KV of recent prompts by their tenant and token ids, least recently used first out,
    bounded in bytes: a new prompt copies the positions it shares with the best entry of its own
    tenant instead of prefilling them (causal attention: a position's K and V depend on the tokens
    up to it only). Tenants never share: a reused prefix shows in a reply's cached_tokens and in
    its speed, so a shared entry would let one caller read another's prompt a guessed token at a time."""

    def __init__(self, max_bytes: int):
        self.max_bytes, self.bytes = max_bytes, 0
        self._entries: OrderedDict[tuple[str, tuple[int, ...]], list[np.ndarray]] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = self.reused_tokens = 0

    def __len__(self) -> int:
        return len(self._entries)

    def store(self, ids: Seq[int], cache: KVCache, tenant: str = "") -> None:
        """Keep positions 0..len(ids)-1 of `cache` (a copy) under `tenant` and `ids`."""
        n = len(ids)
        if n == 0 or cache.length < n:
            return
        arrays = [cache.k[:, :n].copy(), cache.v[:, :n].copy()]
        if cache.kind == "int8":
            arrays += [cache.k_scale[:, :n].copy(), cache.v_scale[:, :n].copy()]
        size = sum(a.nbytes for a in arrays)
        if size > self.max_bytes:
            return
        key = (tenant, tuple(int(i) for i in ids))
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self.bytes -= sum(a.nbytes for a in old)
            self._entries[key] = arrays
            self.bytes += size
            while self.bytes > self.max_bytes:
                _, gone = self._entries.popitem(last=False)
                self.bytes -= sum(a.nbytes for a in gone)

    def restore(self, ids: Seq[int], cache: KVCache, tenant: str = "") -> int:
        """Copy into an empty `cache` the longest prefix of `ids` an entry of `tenant` holds, leaving at
        least cpu.INT_MAX_T + 1 tokens to run: a prompt's positions then all come from the
        prefill kernels, which round otherwise than the decode ones (by up to 2% of max|logit|),
        so a reply is the same with or without the cache. Returns how many positions."""
        want = [int(i) for i in ids]
        best, key = 0, None
        with self._lock:
            for who, k in self._entries:
                if who != tenant:
                    continue
                n, m = 0, min(len(k), len(want) - cpu.INT_MAX_T - 1)
                while n < m and k[n] == want[n]:
                    n += 1
                if n > best:
                    best, key = n, (who, k)
            if key is None:
                return 0
            self._entries.move_to_end(key)
            arrays = self._entries[key]
            dst = [cache.k, cache.v] + ([cache.k_scale, cache.v_scale] if cache.kind == "int8" else [])
            for a, d in zip(arrays, dst):
                d[:, :best] = a[:, :best]
            self.hits += 1
            self.reused_tokens += best
        cache.length = best
        return best


class Sequence(Reply):
    """One reply in a batch (engine.reply.Reply) on a KV cache of its own: its prompt is read in
    steps between the others' decode steps, and what a PrefixCache holds of it is copied, not run."""

    def __init__(self, engine: Engine, prompt: str | list[dict], stop: Seq[str], cancel: threading.Event | None,
                 template_vars: dict | None, resume: str, sampling: dict[str, Any],
                 prefixes: PrefixCache | None = None, spares: SpareCaches | None = None, tenant: str = ""):
        super().__init__(engine, prompt, stop, cancel, template_vars, resume, sampling)
        self.tenant = tenant  # whose prefixes it may reuse (PrefixCache)
        c = engine.cfg
        self.prefixes = prefixes if batchable(engine.net) else None  # a recurrent state cannot be copied in part
        self.spares = spares if batchable(engine.net) else None
        self.cache = (self.spares.take() if self.spares is not None else None) or \
            KVCache(c.num_layers, engine.context_limit, c.num_kv_heads, c.head_dim, engine.params["kv_cache_quantize"],
                    engine.pool)
        self.started = self.closed = False

    def prefill(self, before_layer: Any = None) -> np.ndarray:
        """The prompt into this sequence's cache; returns the last prompt token's logits (1, vocab).
        `before_layer(L)` may raise to stop."""
        return self.prefill_step(before_layer, whole=True)

    def prefill_step(self, before_layer: Any = None, whole: bool = False) -> np.ndarray | None:
        """The next chunk of the prompt into the cache (all of it if `whole`): the last prompt
        token's logits (1, vocab) once the prompt is in, else None. Between two steps the
        scheduler runs a decode step of the other sequences (chunked prefill): the same
        computation as the prompt in one call, since the chunks are Engine.generate's."""
        if not self.started:  # the first step: what the prefix cache holds is copied
            self.started = True
            reused = self.prefixes.restore(self.ids, self.cache, self.tenant) if self.prefixes is not None else 0
            self.reused = self.filled = reused
            self.e.count(reused=self.reused)  # the engine's stats count served replies too
        part = self.next_chunk(whole)
        logits = self.e.prefill(part, self.cache, self.filled, before_layer)
        self.filled += len(part)
        if self.filled < len(self.ids):
            return None
        if self.prefixes is not None:
            self.prefixes.store(self.ids, self.cache, self.tenant)
        self.prompt_read()
        return logits

    def close(self) -> None:
        """Give the KV cache back (to the spares, else the pool), once, counting the reply's tokens
        in the engine's stats."""
        if not self.closed:  # (the cache may serve another sequence from now on)
            self.closed = True
            if self.spares is None or not self.spares.give(self.cache):
                self.cache.free()
            self.e.count(generated=self.generated)


class SpareCaches:
    """KV caches of finished sequences, kept for the next ones (at most `keep`): a fresh cache's
    first writes fault its pages in, 13-14 ms of a 14-token prompt's 56 ms prefill on SmolLM2
    (1 thread; 42 ms into a cache used before). A cache keeps the pages it touched; stale
    positions past its length are never read (attention reads positions < length)."""

    def __init__(self, engine: Engine, keep: int):
        self.e, self.keep = engine, max(int(keep), 0)
        self._caches: list[KVCache] = []
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._caches)

    def _fits(self, cache: KVCache) -> bool:
        c, e = self.e.cfg, self.e
        return cache.k is not None and cache.kind == e.params["kv_cache_quantize"] and \
            cache.capacity == e.context_limit and cache.k.shape == (c.num_layers, e.context_limit, c.num_kv_heads,
                                                                    c.head_dim)

    def take(self) -> KVCache | None:
        """A spare cache of the engine's current shape and kind, emptied; None if there is none."""
        with self._lock:
            while self._caches:
                cache = self._caches.pop()
                if self._fits(cache):
                    cache.length, cache.states, cache._snapshot = 0, None, None
                    return cache
                cache.free()  # the settings changed since (context_length, kv_cache_quantize)
        return None

    def give(self, cache: KVCache) -> bool:
        """Keep `cache` for a later sequence; False (the caller frees it) when full or unfit."""
        with self._lock:
            if len(self._caches) >= self.keep or not self._fits(cache):
                return False
            self._caches.append(cache)
            return True

    def clear(self) -> None:
        """Free every spare (the server stops)."""
        with self._lock:
            for cache in self._caches:
                cache.free()
            self._caches = []


class Batcher:
    """The engine side of continuous batching: opens sequences (checked as Engine.generate
    checks a request) and steps them together through the engine's runner (Engine.prefill and
    Engine.decode take its lock), so a reply that Engine.generate streams meanwhile (on the
    conversation cache) interleaves with them."""

    def __init__(self, engine: Engine, prefix_bytes: int = 64 << 20, spare_caches: int = 0):
        self.e = engine
        self.prefixes = PrefixCache(prefix_bytes) if prefix_bytes > 0 else None
        self.spares = SpareCaches(engine, spare_caches) if spare_caches > 0 else None
        self.count_experts = False  # expert bytes per step, grouped and not (colibri-bench serve)
        self.expert_bytes: list[tuple[int, int]] = []

    def open(self, prompt: str | list[dict], stop: Seq[str] = (), *, cancel: threading.Event | None = None,
             template_vars: dict | None = None, resume: str = "", tenant: str = "",
             **sampling: Any) -> Sequence:
        """A sequence for this request (nothing computed yet); bad input raises as generate().
        `tenant`: whose cached prefixes it may reuse (an API key's requests, the window's chats)."""
        return Sequence(self.e, prompt, stop, cancel, template_vars, resume, sampling, self.prefixes,
                        self.spares, tenant)

    def warmup(self) -> float:
        """Compile (or load) what batched steps run, on the calling thread (the one that will step):
        a step of 2 rows (the output head's one-token kernels) and of TOKENS + 1 (its prefill
        kernels, and decode_rows' 4-rows-per-block path with a leftover row). Engine.warmup runs
        one sequence only: a server's first 2-client step compiled decode_rows there, 66 s of
        CPU on a loaded 2-core machine, with every client waiting on it. Returns the seconds."""
        e = self.e
        t0 = time.perf_counter()
        if not batchable(e.net):
            return 0.0
        c, tok = e.cfg, e.codec.bos_id or 0
        for n in (2, cpu.INT_MAX_T + 2):
            caches = [KVCache(c.num_layers, 2, c.num_kv_heads, c.head_dim, e.params["kv_cache_quantize"])
                      for _ in range(n)]
            e.decode([tok] * n, caches, warmup=True)
            e.decode([tok] * n, caches, warmup=True)  # a second position: attention over a cache
            for cache in caches:
                cache.free()
        unmap_compiler_pages()  # compiling faulted LLVM's library back in
        return time.perf_counter() - t0

    def step(self, seqs: Seq[Sequence]) -> np.ndarray:
        """One decode step of every sequence (each has a `token`); logits (N, vocab)."""
        routes: list | None = [] if self.count_experts and self.e.cfg.is_moe else None
        logits = self.e.decode([s.token for s in seqs], [s.cache for s in seqs], routes)
        if routes:
            self.expert_bytes.append(expert_bytes(self.e.net, routes))
        return logits
