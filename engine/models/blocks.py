"""The blocks every layer is made of, for one or more rows: the pass's `Step` (what it works on and
what steers it), x @ W.T for one or several matrices (`linear`, `linears`), RMSNorm and the one
gated MLP (`expert_mlp`: a routed expert, a shared expert or a dense layer) and top-k routing.
Each picks its kernel from the rows' count and the matrices' formats, so the decoder loop
(engine.models.base) and the fused decode's stops (engine.models.fused) call the same code."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from engine.kernels import cpu
from engine.kvcache import KVCache
from engine.mempool import Arena
from engine.ops import ffn
from engine.timing import Kernels, OpTimer
from engine.weight_types import ExpertWeights, Matrix


@dataclass
class Step:
    """One forward call: what it works on and the state that steers it.

    gpu: the GPU runner (engine.scheduler) every matmul is offered to first (None: CPU only). exact:
    float activations in every matmul. arena: where the pass's activations live (None: numpy memory).
    before_layer: called with the layer index before each layer of a multi-token pass (Stop raises from
    it). timer: the per-operation timing hook (engine.timing); `k` is the kernel module the blocks
    call, timed through it when a timer is set."""
    cache: KVCache | None = None
    pos0: int = 0  # position of the first new token
    cos: np.ndarray | None = None  # (T, head_dim/2)
    sin: np.ndarray | None = None
    dump: dict | None = None
    arena: Arena | None = None
    gpu: Any = None
    exact: bool = False
    before_layer: Callable[[int], None] | None = None
    timer: OpTimer | None = None
    seqs: list | None = None  # N sequences: row i is one sequence's token, (its KVCache, its position)
    routes: list | None = None  # (layer, expert ids (T, k)) of each MoE layer, appended (engine.models.rows)

    def __post_init__(self) -> None:
        self.k = cpu if self.timer is None else Kernels(cpu, self.timer)

    def empty(self, shape) -> np.ndarray:
        """A float32 scratch buffer for this pass."""
        return np.empty(shape, np.float32) if self.arena is None else self.arena.empty(shape)


def _by_rows(fn: Callable, x: np.ndarray, *args: Any) -> Any:
    """N sequences' decode step runs its rows through the one-token kernels, at most
    cpu.INT_MAX_T at a time, so each row gets the bits it would decoded alone; the fused integer
    kernels dot each token on its own at any T, so they take all rows in one call (`_integer_path`)."""
    parts = [fn(x[a:a + cpu.INT_MAX_T], *args) for a in range(0, x.shape[0], cpu.INT_MAX_T)]
    return tuple(map(np.concatenate, zip(*parts))) if isinstance(parts[0], tuple) else np.concatenate(parts)


def linear(x: np.ndarray, m: Matrix, step: Step) -> np.ndarray:
    """x (T, cols) @ m.T -> (T, rows)."""
    if step.seqs is not None and x.shape[0] > cpu.INT_MAX_T and not _integer_path(x, (m,), step):
        return _by_rows(linear, x, m, step)  # (on the integer path each of cpu.matmul's rows is its decode's bits)
    t0 = step.timer.start() if step.timer is not None else 0.0
    y = step.gpu.linear(x, m) if step.gpu is not None else None
    if y is None:
        y = step.empty((x.shape[0], m.rows))
        cpu.matmul(m.data, m.code, np.ascontiguousarray(x, dtype=np.float32), y, step.exact)
    if step.timer is not None:
        step.timer.stop(m.name, t0)
    return y


def _integer_path(x: np.ndarray, ms: tuple[Matrix, ...], step: Step, mixed: bool = True) -> bool:
    """Whether the fused integer kernels take these matmuls: decode-sized x, formats with an
    integer dot, contiguous matrices, no GPU runner to offer them to, float activations not
    asked for; `mixed` False: all repacked or none (swiglu_int)."""
    if (x.shape[0] > cpu.INT_MAX_T and step.seqs is None) or step.gpu is not None or step.exact:
        return False
    packed = sum(m.code > cpu.PACKED for m in ms)
    return (mixed or packed in (0, len(ms))) and \
        all(m.code in cpu.INT_CODES and m.data.flags.c_contiguous for m in ms)


def _tiled_pair(x: np.ndarray, ms: tuple[Matrix, Matrix], step: Step) -> bool:
    """Whether cpu.swiglu_tiles takes a prompt's gate and up matrices: both repacked in a tiled
    format, enough tokens, contiguous, no GPU runner, no batch of sequences (each row there must be
    its decode's bits, and the SwiGLU's silu may round otherwise), float activations not asked for."""
    return x.shape[0] >= cpu.TILE_MIN_T and step.gpu is None and step.seqs is None and not step.exact and \
        all(m.code - cpu.PACKED in cpu.TILE_CODES and m.data.flags.c_contiguous for m in ms)


def linears(x: np.ndarray, ms: tuple[Matrix, ...], step: Step) -> tuple[np.ndarray, ...]:
    """x @ m.T for each m of ms (one kernel call on the integer path)."""
    if step.seqs is not None and x.shape[0] > cpu.INT_MAX_T and not _integer_path(x, ms, step):
        return _by_rows(linears, x, ms, step)
    if not _integer_path(x, ms, step):
        return tuple(linear(x, m, step) for m in ms)
    t0 = step.timer.start() if step.timer is not None else 0.0
    outs = tuple(step.empty((x.shape[0], m.rows)) for m in ms)
    cpu.matmul_int(tuple(m.data for m in ms), tuple(m.code for m in ms), np.ascontiguousarray(x, dtype=np.float32),
                   outs)
    if step.timer is not None:
        step.timer.stop(ms[0].name, t0)
    return outs


def rmsnorm(x: np.ndarray, weight: np.ndarray, eps: float, step: Step) -> np.ndarray:
    """Over the last axis of x (..., n)."""
    flat = np.ascontiguousarray(x, dtype=np.float32).reshape(-1, x.shape[-1])
    out = step.empty(flat.shape)
    step.k.rmsnorm(flat, weight, np.float32(eps), out)
    return out.reshape(x.shape)


def expert_mlp(h: np.ndarray, e: ExpertWeights, step: Step, act: str = "silu",
               biases: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
               clamp: tuple[float, float] = (1.702, 7.0)) -> np.ndarray:
    """The one gated MLP (a routed expert, a shared expert, a dense layer): down(act(gate h) * up h),
    act "silu" (gate and up in one integer kernel where it applies) or "gelu_tanh"; `biases` (gpt-oss)
    added, and the SwiGLU clamped at clamp = (alpha, limit)."""
    if biases is not None:
        gb, ub, db = biases
        T, F = h.shape[0], e.gate.rows
        g, u = linears(h, (e.gate, e.up), step)  # one kernel call on the integer path
        a = step.empty((T, F))
        ffn.biased_clamped_swiglu(np.ascontiguousarray(g), np.ascontiguousarray(u), gb, ub, np.float32(clamp[0]),
                                  np.float32(clamp[1]), a)
        y = linear(a, e.down, step)
        y += db
        return y
    if act == "gelu_tanh":
        g, u = linears(h, (e.gate, e.up), step)  # one kernel call on the integer path
        a = step.empty(g.shape)
        ffn.gelu_mul(np.ascontiguousarray(g), np.ascontiguousarray(u), a)
        return linear(a, e.down, step)
    if step.seqs is not None and h.shape[0] > cpu.INT_MAX_T and not _integer_path(h, (e.gate, e.up), step, mixed=False):
        return _by_rows(expert_mlp, h, e, step)
    if _integer_path(h, (e.gate, e.up), step, mixed=False):
        t0 = step.timer.start() if step.timer is not None else 0.0
        a = step.empty((h.shape[0], e.gate.rows))
        cpu.swiglu_int(e.gate.data, e.gate.code, e.up.data, e.up.code, np.ascontiguousarray(h, dtype=np.float32), a)
        if step.timer is not None:
            step.timer.stop(e.gate.name, t0)
        return linear(a, e.down, step)
    if _tiled_pair(h, (e.gate, e.up), step):  # a prompt: gate, up and SwiGLU in one kernel (tiles.py)
        t0 = step.timer.start() if step.timer is not None else 0.0
        a = step.empty((h.shape[0], e.gate.rows))
        cpu.swiglu_tiles(e.gate.data, e.gate.code - cpu.PACKED, e.up.data, e.up.code - cpu.PACKED,
                         np.ascontiguousarray(h, dtype=np.float32), a)
        if step.timer is not None:
            step.timer.stop(e.gate.name, t0)
        return linear(a, e.down, step)
    g, u = linear(h, e.gate, step), linear(h, e.up, step)
    a = step.empty(g.shape)
    step.k.swiglu(g, u, a)
    return linear(a, e.down, step)


def softmax_top_k(logits: np.ndarray, k: int, renormalise: bool, step: Step) -> tuple[np.ndarray, np.ndarray]:
    """(T, E) router logits -> top-k softmax weights and expert ids (T, k), renormalised if asked."""
    T = logits.shape[0]
    weights, ids = np.empty((T, k), np.float32), np.empty((T, k), np.int64)
    step.k.softmax_top_k(np.ascontiguousarray(logits, dtype=np.float32), k, renormalise, weights, ids)
    return weights, ids
