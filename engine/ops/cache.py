"""One cache per layer kind (as mlx-lm's cache.py): full attention keeps every key (FullKV), a
sliding-window layer a ring of `window` slots (RingKV), a DeltaNet layer its (H, dk, dv) state plus
its conv tail, a short-conv layer its conv tail (ConvState). Each exposes nbytes, reset() and copy().
Prefix reuse: FullKV.trim(n) forgets every position from n on; a ring or a recurrent state cannot
be rewound, so a conversation that edits its past restarts from a copy() taken where the kept
prefix ended.

The attention kernel reads (k, v, kpos) with absolute positions per slot, so a ring's slot order
never matters. For a ring and a chunk of T > 1 tokens, update(k, v, pos) returns the old slots
followed by the new ones, so queries early in the chunk still see keys the chunk's own later
tokens push out. Both attention caches store f32, f16 or int8 (kv_cache_quantize, as
engine.kvcache); update_stored() hands the stored elements and scales to the attention kernel,
which widens them as it reads, so a decoded token does not copy the cache to float32 first.
"""
from __future__ import annotations

import copy

import numpy as np

from engine.ops.attention import NO_SCALE

KINDS = ("f32", "f16", "int8")


def position_bytes(kv_heads: int, head_dim: int, v_dim: int | None = None, kind: str = "f32") -> int:
    """Bytes one cached position takes in a FullKV or RingKV: keys, values, int8 scales, position."""
    elems = kv_heads * (head_dim + (v_dim or head_dim))
    scales = 2 * kv_heads * 4 if kind == "int8" else 0
    return elems * {"f32": 4, "f16": 2, "int8": 1}[kind] + scales + 8


class _Copyable:
    def copy(self):
        """A snapshot: every array copied (a recurrent state or ring cannot be rewound otherwise)."""
        return copy.deepcopy(self)


class _Store(_Copyable):
    """Keys or values of `rows` positions stored as `kind`, read back as float32."""

    def __init__(self, rows: int, heads: int, dim: int, kind: str):
        if kind not in KINDS:
            raise ValueError(f"kv_cache_quantize: {kind!r} is not one of {', '.join(KINDS)}")
        self.kind = kind
        self.x = np.zeros((rows, heads, dim), {"f32": np.float32, "f16": np.float16, "int8": np.int8}[kind])
        self.scale = np.zeros((rows, heads), np.float32) if kind == "int8" else None

    @property
    def nbytes(self) -> int:
        return self.x.nbytes + (0 if self.scale is None else self.scale.nbytes)

    def rows_bytes(self, n: int) -> int:
        return self.x[:n].nbytes + (0 if self.scale is None else self.scale[:n].nbytes)

    def put(self, rows, x: np.ndarray) -> None:
        """Store x (n, heads, dim) float32 at `rows` (a slice or an index array)."""
        if self.scale is None:
            self.x[rows] = x
            return
        s = np.abs(x).max(axis=-1) / np.float32(127.0)  # per position and head, as engine.kvcache
        self.scale[rows] = s
        self.x[rows] = np.clip(np.rint(x / np.where(s == 0, 1.0, s)[..., None]), -127, 127)

    def get(self, rows=slice(None)) -> np.ndarray:
        """float32 (n, heads, dim) of `rows`."""
        if self.kind == "f32":
            return self.x[rows]
        if self.scale is None:
            return self.x[rows].astype(np.float32)
        return self.x[rows].astype(np.float32) * self.scale[rows][..., None]

    def stored(self, rows=slice(None)) -> tuple[np.ndarray, np.ndarray]:
        """`rows` as stored, for the attention kernel to widen as it reads them (f16 as its bits,
        uint16), and their scales (NO_SCALE unless int8)."""
        x = self.x[rows]
        return (x.view(np.uint16) if self.kind == "f16" else x), (NO_SCALE if self.scale is None else self.scale[rows])


class _StoredKV(_Copyable):
    """What a full and a ring cache share: keys and values in two `_Store`s, their positions in `pos`."""
    ks: _Store
    vs: _Store
    pos: np.ndarray

    @property
    def kind(self) -> str:
        return self.ks.kind

    @property
    def k(self) -> np.ndarray:
        """The keys as stored (slots, KVH, hd)."""
        return self.ks.x

    @property
    def v(self) -> np.ndarray:
        return self.vs.x

    @property
    def nbytes(self) -> int:
        return self.ks.nbytes + self.vs.nbytes + self.pos.nbytes


class FullKV(_StoredKV):
    """Keys/values of every position, in a preallocated (capacity, KVH, hd) buffer of `kind`."""

    def __init__(self, capacity: int, kv_heads: int, head_dim: int, v_dim: int | None = None, kind: str = "f32"):
        self.ks = _Store(capacity, kv_heads, head_dim, kind)
        self.vs = _Store(capacity, kv_heads, v_dim or head_dim, kind)
        self.pos = np.full(capacity, -1, np.int64)
        self.length = 0

    def bytes_used(self) -> int:
        """Bytes of the filled positions (what the conversation costs so far)."""
        n = self.length
        return self.ks.rows_bytes(n) + self.vs.rows_bytes(n) + self.pos[:n].nbytes

    def update(self, k_new: np.ndarray, v_new: np.ndarray, pos_new: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Store the chunk, return every stored (k, v, pos)."""
        n, T = self.length, len(pos_new)
        if n + T > len(self.pos):
            raise ValueError(f"FullKV: {n} cached + {T} new positions exceed its capacity {len(self.pos)}")
        self.ks.put(slice(n, n + T), k_new)
        self.vs.put(slice(n, n + T), v_new)
        self.pos[n:n + T] = pos_new
        self.length = n + T
        return self.ks.get(slice(0, n + T)), self.vs.get(slice(0, n + T)), self.pos[:n + T]

    def update_stored(self, k_new: np.ndarray, v_new: np.ndarray, pos_new: np.ndarray) -> tuple:
        """update(), returning what the chunk attends to as stored: (k, v, k scales, v scales, pos)."""
        self.update(k_new, v_new, pos_new)  # (its float32 views of an f32 cache cost nothing)
        rows = slice(0, self.length)
        return *self.ks.stored(rows), *self.vs.stored(rows), self.pos[rows]

    def reset(self) -> None:
        self.length = 0
        self.pos[:] = -1

    def trim(self, length: int) -> None:
        """Keep the first `length` positions (prefix reuse: a new turn re-runs only what follows)."""
        if not 0 <= length <= self.length:
            raise ValueError(f"FullKV: cannot trim to {length} positions, it holds {self.length}")
        self.length = length
        self.pos[length:] = -1


class RingKV(_StoredKV):
    """A sliding-window layer's keys: `window` slots, position p in slot p % window."""

    def __init__(self, window: int, kv_heads: int, head_dim: int, v_dim: int | None = None, kind: str = "f32"):
        if window <= 0:
            raise ValueError(f"RingKV: window must be positive, got {window}")
        self.window = window
        self.ks = _Store(window, kv_heads, head_dim, kind)
        self.vs = _Store(window, kv_heads, v_dim or head_dim, kind)
        self.pos = np.full(window, -1, np.int64)

    def update(self, k_new: np.ndarray, v_new: np.ndarray, pos_new: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Store the chunk's last `window` keys; return what the chunk's queries attend to."""
        seen = None
        if len(pos_new) > 1:  # the chunk's own keys as the ring would round them
            kq, vq = _Store(len(pos_new), *k_new.shape[1:], self.kind), _Store(len(pos_new), *v_new.shape[1:], self.kind)
            kq.put(slice(None), k_new)
            vq.put(slice(None), v_new)
            seen = (np.concatenate([self.ks.get(), kq.get()]), np.concatenate([self.vs.get(), vq.get()]),
                    np.concatenate([self.pos, pos_new]))
        keep = slice(max(0, len(pos_new) - self.window), len(pos_new))
        slots = pos_new[keep] % self.window
        self.ks.put(slots, k_new[keep])
        self.vs.put(slots, v_new[keep])
        self.pos[slots] = pos_new[keep]
        return seen or (self.ks.get(), self.vs.get(), self.pos)  # decode: the ring holds the window itself

    def update_stored(self, k_new: np.ndarray, v_new: np.ndarray, pos_new: np.ndarray) -> tuple:
        """update(), returning what the chunk attends to as stored: (k, v, k scales, v scales, pos);
        a chunk of T > 1 tokens gets update()'s float32 temporary."""
        if len(pos_new) > 1:
            k, v, pos = self.update(k_new, v_new, pos_new)
            return k, NO_SCALE, v, NO_SCALE, pos
        keep = pos_new % self.window
        self.ks.put(keep, k_new)
        self.vs.put(keep, v_new)
        self.pos[keep] = pos_new
        return *self.ks.stored(), *self.vs.stored(), self.pos

    def reset(self) -> None:
        self.pos[:] = -1


class ConvState(_Copyable):
    """The last kernel-1 inputs of a causal depthwise conv (C channels), oldest first."""

    def __init__(self, kernel: int, channels: int):
        self.x = np.zeros((kernel - 1, channels), np.float32)

    @property
    def nbytes(self) -> int:
        return self.x.nbytes

    def reset(self) -> None:
        self.x[:] = 0


class DeltaState(_Copyable):
    """A gated-DeltaNet layer: the (Hv, dk, dv) recurrent state and the conv tail of its q|k|v input."""

    def __init__(self, v_heads: int, k_dim: int, v_dim: int, conv_kernel: int, conv_channels: int):
        self.s = np.zeros((v_heads, k_dim, v_dim), np.float32)
        self.conv = ConvState(conv_kernel, conv_channels)

    @property
    def nbytes(self) -> int:
        return self.s.nbytes + self.conv.nbytes

    def reset(self) -> None:
        self.s[:] = 0
        self.conv.reset()
