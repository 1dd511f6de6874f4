"""Many replies at once on one engine: each `Sequence` has its own KV cache (pool blocks), and
one decode step runs the next token of every sequence in one forward pass (`decode_batch`).

All matmuls take the N rows together (each weight matrix is read once per step, not once per
sequence); attention runs per row on that sequence's own cache at its own position; an MoE
layer groups the step's rows by routed expert, so each expert is read and computed once per
step however many sequences picked it (`expert_bytes` counts both ways). A `PrefixCache` keeps
the KV of recent prompts, so a request sharing a system prompt or earlier turns skips their
prefill.

A dense model whose lone token takes the fused one-call decode (engine.models.fused) runs the
whole step in one call as well (engine.kernels.batched.decode_rows: every layer, all N rows per
parallel task, 4 rows per unpacked weight block), each row bit for bit its lone decode; the
layer-by-layer pass below is the path for the rest (MoE, GPU, float activations).

Exactness: the fused integer decode kernels (matmul_int, swiglu_int) dot each row on its own,
so a step's matmuls give all N rows to one call of them (each weight read once per step); other
formats go through the 1-token kernels up to cpu.INT_MAX_T rows a call (the prefill kernels, for
4 rows or more, differ by up to 2% of max|logit| on SmolLM2 Q4_1): a dense model's logits are
the lone decode's bit for bit at any N, and an MoE's with top-2 routing too (two experts' sum
does not depend on the order); with top-k > 2 the experts add in another order: float rounding,
the same greedy tokens (tests/test_batch.py). `expert_bytes` counts an expert of the second kind
once per INT_MAX_T rows that picked it.
"""
from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Sequence as Seq
from typing import TYPE_CHECKING, Any

import numpy as np

from engine.kernels import cpu
from engine.kernels.batched import decode_rows
from engine.kvcache import KVCache
from engine.mempool import unmap_compiler_pages
from engine.models.base import Step as PassStep
from engine.models.base import linear, rmsnorm
from engine.models.fused import QK_NORM
from engine.ops import norms, rope
from engine.reply import Reply

if TYPE_CHECKING:
    from engine.api import Engine
    from engine.models.base import Transformer


def batchable(net: Transformer) -> bool:
    """Whether N sequences can share a forward pass: every layer attends over the shared KV
    block (no recurrent state, no per-layer own cache: those decode one sequence per pass)."""
    return not net.recurrent


def decode_batch(net: Transformer, tokens: Seq[int], caches: Seq[KVCache],
                 routes: list | None = None) -> np.ndarray:
    """The next token of N sequences in one pass: tokens[i] at position caches[i].length on
    caches[i]. Returns logits (N, vocab). One sequence takes the ordinary path (the fused
    one-call decode) unless `routes` is asked; a model that cannot batch runs its sequences one
    after another. `routes` (a list) receives (layer, expert ids (N, k)) of each MoE layer."""
    if len(tokens) != len(caches) or not tokens:
        raise ValueError(f"decode_batch needs one cache per token, got {len(tokens)} tokens and {len(caches)} caches")
    if len(set(map(id, caches))) != len(caches):
        raise ValueError("decode_batch: two rows share one KV cache")
    for c in caches:
        if c.length >= c.capacity:
            raise ValueError(f"a sequence's KV cache is full ({c.capacity} positions)")
    if (len(tokens) == 1 and routes is None) or not batchable(net):
        return np.concatenate([net.forward(np.array([t], np.int64), c, c.length) for t, c in zip(tokens, caches)])
    cfg, arena = net.cfg, net.arena
    arena.reset()
    pos = np.array([c.length for c in caches], np.int64)
    cos, sin = net.rotary(pos)
    net.full_tables = rope.tables(net.inv_full, pos) if net.spec.full_rope == "proportional" else None
    step = PassStep(None, 0, cos, sin, None, arena, net.gpu, net.exact, None, net.timer,
                    seqs=list(zip(caches, pos.tolist())), routes=routes)
    x = step.empty((len(tokens), cfg.hidden_size))
    step.k.gather_rows(net.w.token_embd.data, net.w.token_embd.code, np.asarray(tokens, np.int64), x)
    if net.spec.embed_scale:
        x *= np.float32(cfg.hidden_size ** 0.5)
    fused = _fused_rows(net, x, caches, pos, cos, sin, step)
    for L, lw in enumerate(net.w.layers if not fused else ()):  # as Transformer.forward's loop (attention)
        mark = arena.mark()
        if lw.sandwich is not None:
            net.sandwich_layer(L, x, lw, net.attention, step)
        else:
            x += net.attention(L, rmsnorm(x, lw.attn_norm, cfg.rms_norm_eps, step), lw, step)
            x += net.ffn(L, rmsnorm(x, lw.ffn_norm, cfg.rms_norm_eps, step), lw, step)
        arena.release(mark)
    for c in caches:
        c.length += 1
    logits = linear(rmsnorm(x, net.w.output_norm, cfg.rms_norm_eps, step), net.w.output, step)
    if cfg.final_logit_softcap:
        logits = norms.softcap(logits, cfg.final_logit_softcap)
    return logits.copy()  # results leave the arena


def _fused_rows(net: Transformer, x: np.ndarray, caches: Seq[KVCache], pos: np.ndarray, cos: np.ndarray,
                sin: np.ndarray, step: PassStep) -> bool:
    """x (N, hidden) through every layer in one call of engine.kernels.batched.decode_rows, in
    place, where each row alone would take the fused one-call decode (a dense model, every
    matrix in an integer-dot format, nothing asking for the layered path): each row then gets
    that decode's logits bit for bit. False (nothing done) otherwise."""
    fd = net.fused
    if fd is None or not fd.dense or not net.takes_fused(step) or not fd.ready():
        return False
    kind = caches[0].kind
    if any(c.kind != kind or not (c.k.flags.c_contiguous and c.v.flags.c_contiguous) for c in caches):
        return False
    t0 = step.timer.start() if step.timer is not None else 0.0
    like = caches[0].k.view(np.uint16) if kind == "f16" else caches[0].k
    kv = np.array([[c.k.ctypes.data, c.v.ctypes.data, c.k_scale.ctypes.data, c.v_scale.ctypes.data, c.capacity]
                   for c in caches], np.int64)
    mlp = fd.expert_table()[:, 0]  # (layers, 3, 4): the one dense "expert" per layer, gate/up/down
    cfg = net.cfg
    decode_rows(x, fd.norms, fd.attn, fd.bias, fd.qk_norms, QK_NORM[cfg.qk_norm], np.float32(cfg.clip_qkv or 0.0),
                np.ascontiguousarray(mlp), np.float32(cfg.rms_norm_eps), net.scale, cfg.sliding_window or 0,
                np.ascontiguousarray(cos, dtype=np.float32), np.ascontiguousarray(sin, dtype=np.float32), pos, kv,
                like, caches[0].k_scale, kind == "int8", cfg.num_heads, cfg.num_kv_heads, cfg.head_dim)
    if step.timer is not None:
        step.timer.stop("decode_rows (fused, batched)", t0)
    net.w.experts.count_uses(np.zeros((len(fd.norms), len(caches)), np.int64), routed=False)  # as N lone decodes
    return True


def _rows_per_read(net: Transformer, L: int, e: int) -> int:
    """How many rows of a step one read of expert (L, e) serves: all of them when its SwiGLU
    takes the fused integer kernel (engine.models.base._integer_path), else cpu.INT_MAX_T."""
    if net.exact or net.gpu is not None or net.act != "silu":
        return cpu.INT_MAX_T
    with net.w.experts.use(L, e) as ew:
        ms = (ew.gate, ew.up)
        packed = sum(m.code > cpu.PACKED for m in ms)
        fused = packed in (0, 2) and all(m.code in cpu.INT_CODES and m.data.flags.c_contiguous for m in ms)
    return 1 << 30 if fused else cpu.INT_MAX_T


def expert_bytes(net: Transformer, routes: list) -> tuple[int, int]:
    """Expert bytes a step read (grouped: each (layer, expert) once, or once per cpu.INT_MAX_T
    rows that picked it off the fused integer kernels) and would have read with each row
    computing its own experts (ungrouped: once per row and pick), from its routes."""
    store, grouped, each = net.w.store, 0, 0
    size: dict[tuple[int, int], int] = {}
    per_read = _rows_per_read(net, routes[0][0], int(routes[0][1].flat[0])) if routes else 1
    for L, ids in routes:
        picks, counts = np.unique(ids, return_counts=True)
        for e, n in zip(picks.tolist(), counts.tolist()):
            b = size.get((L, e))
            if b is None:
                b = size[(L, e)] = store.span(L, e).nbytes
            grouped += -(-n // per_read) * b
            each += n * b
    return grouped, each


class PrefixCache:
    """The KV of recent prompts by their token ids, least recently used first out, bounded in
    bytes: a new prompt copies the positions it shares with the best entry instead of
    prefilling them (causal attention: a position's K and V depend on the tokens up to it only)."""

    def __init__(self, max_bytes: int):
        self.max_bytes, self.bytes = max_bytes, 0
        self._entries: OrderedDict[tuple[int, ...], list[np.ndarray]] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = self.reused_tokens = 0

    def __len__(self) -> int:
        return len(self._entries)

    def store(self, ids: Seq[int], cache: KVCache) -> None:
        """Keep positions 0..len(ids)-1 of `cache` (a copy) under `ids`."""
        n = len(ids)
        if n == 0 or cache.length < n:
            return
        arrays = [cache.k[:, :n].copy(), cache.v[:, :n].copy()]
        if cache.kind == "int8":
            arrays += [cache.k_scale[:, :n].copy(), cache.v_scale[:, :n].copy()]
        size = sum(a.nbytes for a in arrays)
        if size > self.max_bytes:
            return
        key = tuple(int(i) for i in ids)
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self.bytes -= sum(a.nbytes for a in old)
            self._entries[key] = arrays
            self.bytes += size
            while self.bytes > self.max_bytes:
                _, gone = self._entries.popitem(last=False)
                self.bytes -= sum(a.nbytes for a in gone)

    def restore(self, ids: Seq[int], cache: KVCache) -> int:
        """Copy into an empty `cache` the longest prefix of `ids` an entry holds, leaving at
        least cpu.INT_MAX_T + 1 tokens to run: a prompt's positions then all come from the
        prefill kernels, which round otherwise than the decode ones (by up to 2% of max|logit|),
        so a reply is the same with or without the cache. Returns how many positions."""
        want = [int(i) for i in ids]
        best, key = 0, None
        with self._lock:
            for k in self._entries:
                n, m = 0, min(len(k), len(want) - cpu.INT_MAX_T - 1)
                while n < m and k[n] == want[n]:
                    n += 1
                if n > best:
                    best, key = n, k
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
                 prefixes: PrefixCache | None = None, spares: SpareCaches | None = None):
        super().__init__(engine, prompt, stop, cancel, template_vars, resume, sampling)
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
            self.reused = self.filled = self.prefixes.restore(self.ids, self.cache) if self.prefixes is not None else 0
            self.e.count(reused=self.reused)  # the engine's stats count served replies too
        part = self.next_chunk(whole)
        logits = self.e.prefill(part, self.cache, self.filled, before_layer)
        self.filled += len(part)
        if self.filled < len(self.ids):
            return None
        if self.prefixes is not None:
            self.prefixes.store(self.ids, self.cache)
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
             template_vars: dict | None = None, resume: str = "", **sampling: Any) -> Sequence:
        """A sequence for this request (nothing computed yet); bad input raises as generate()."""
        return Sequence(self.e, prompt, stop, cancel, template_vars, resume, sampling, self.prefixes, self.spares)

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
