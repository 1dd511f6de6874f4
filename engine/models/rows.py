"""N sequences' next tokens in one pass of the decoder loop (Transformer.forward), each row on its
own KV cache at its own position: continuous batching's step (engine.batch). Each weight matrix
is read once a step for all rows, and an MoE layer groups the rows by routed expert, so each
expert is read once a step however many rows picked it (`expert_bytes` counts both ways).

Exactness: a dense model's rows, and an MoE's with top-2 routing, are each the lone decode's bits
at any N; with top-k > 2 the experts add in another order: float rounding, the same greedy tokens.
"""
from __future__ import annotations

from collections.abc import Sequence as Seq
from typing import TYPE_CHECKING

import numpy as np

from engine.kernels import cpu
from engine.kvcache import KVCache

if TYPE_CHECKING:
    from engine.models.base import Transformer


def batchable(net: Transformer) -> bool:
    """Whether N sequences can share a forward pass: every layer attends over the shared KV block."""
    return not net.recurrent


def check_rows(tokens: Seq[int], caches: Seq[KVCache]) -> None:
    """N rows' next tokens need a cache each, none shared, none full."""
    if len(tokens) != len(caches) or len(tokens) == 0:
        raise ValueError(f"decode_batch needs one cache per token, got {len(tokens)} tokens and {len(caches)} caches")
    if len(set(map(id, caches))) != len(caches):
        raise ValueError("decode_batch: two rows share one KV cache")
    for c in caches:
        if c.length >= c.capacity:
            raise ValueError(f"a sequence's KV cache is full ({c.capacity} positions)")


def decode_batch(net: Transformer, tokens: Seq[int], caches: Seq[KVCache],
                 routes: list | None = None) -> np.ndarray:
    """The next token of N sequences in one pass: tokens[i] at position caches[i].length on
    caches[i]; logits (N, vocab). `routes` receives (layer, expert ids (N, k)) of each MoE layer."""
    return net.forward(np.asarray(tokens, np.int64), list(caches), 0, all_logits=True, routes=routes)


def _rows_per_read(net: Transformer, L: int, e: int) -> int:
    """How many rows of a step one read of expert (L, e) serves (all where its SwiGLU takes swiglu_int)."""
    if net.exact or net.gpu is not None or net.act != "silu":
        return cpu.INT_MAX_T
    with net.w.experts.use(L, e) as ew:
        ms = (ew.gate, ew.up)
        packed = sum(m.code > cpu.PACKED for m in ms)
        fused = packed in (0, 2) and all(m.code in cpu.INT_CODES and m.data.flags.c_contiguous for m in ms)
    return 1 << 30 if fused else cpu.INT_MAX_T


def expert_bytes(net: Transformer, routes: list) -> tuple[int, int]:
    """Expert bytes a step read, from its routes (grouped: each (layer, expert) once per call), and
    would have read with each row computing its own experts (once per row and pick)."""
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
