"""One cache per layer kind (as mlx-lm's cache.py): full attention keeps every key (FullKV), a
sliding-window layer a ring of `window` slots (RingKV), a DeltaNet layer its (H, dk, dv) state plus
its conv tail, a short-conv layer its conv tail (ConvState). The recurrent ones are fixed-size: a
conversation of any length costs the same memory. Each exposes nbytes (what the dashboard sums)
reset() (a new conversation) and copy() (a snapshot). Prefix reuse: FullKV.trim(n) forgets every
position from n on; a ring or a recurrent state cannot be rewound (what it forgot is gone), so a
conversation that edits its past restarts from a copy() taken where the kept prefix ended.

The attention kernel reads (k, v, kpos) with absolute positions per slot, so a ring's slot order
never matters. update(k, v, pos) stores a chunk and returns what its queries attend to: for a ring
and a chunk of T > 1 tokens, the old slots followed by the new ones (a temporary of window + T
rows), so queries early in the chunk still see keys that the chunk's own later tokens push out.
"""
from __future__ import annotations

import numpy as np


class FullKV:
    """Keys/values of every position, in a preallocated (capacity, KVH, hd) buffer."""

    def __init__(self, capacity: int, kv_heads: int, head_dim: int, v_dim: int | None = None):
        self.k = np.zeros((capacity, kv_heads, head_dim), np.float32)
        self.v = np.zeros((capacity, kv_heads, v_dim or head_dim), np.float32)
        self.pos = np.full(capacity, -1, np.int64)
        self.length = 0

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes + self.pos.nbytes

    def update(self, k_new: np.ndarray, v_new: np.ndarray, pos_new: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Store the chunk, return every stored (k, v, pos)."""
        n, T = self.length, len(pos_new)
        if n + T > len(self.pos):
            raise ValueError(f"FullKV: {n} cached + {T} new positions exceed its capacity {len(self.pos)}")
        self.k[n:n + T], self.v[n:n + T], self.pos[n:n + T] = k_new, v_new, pos_new
        self.length = n + T
        return self.k[:n + T], self.v[:n + T], self.pos[:n + T]

    def reset(self) -> None:
        self.length = 0
        self.pos[:] = -1

    def trim(self, length: int) -> None:
        """Keep the first `length` positions (prefix reuse: a new turn re-runs only what follows)."""
        if not 0 <= length <= self.length:
            raise ValueError(f"FullKV: cannot trim to {length} positions, it holds {self.length}")
        self.length = length
        self.pos[length:] = -1

    def copy(self) -> FullKV:
        new = FullKV.__new__(FullKV)
        new.k, new.v, new.pos, new.length = self.k.copy(), self.v.copy(), self.pos.copy(), self.length
        return new


class RingKV:
    """A sliding-window layer's keys: `window` slots, position p in slot p % window."""

    def __init__(self, window: int, kv_heads: int, head_dim: int, v_dim: int | None = None):
        if window <= 0:
            raise ValueError(f"RingKV: window must be positive, got {window}")
        self.window = window
        self.k = np.zeros((window, kv_heads, head_dim), np.float32)
        self.v = np.zeros((window, kv_heads, v_dim or head_dim), np.float32)
        self.pos = np.full(window, -1, np.int64)

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes + self.pos.nbytes

    def update(self, k_new: np.ndarray, v_new: np.ndarray, pos_new: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Store the chunk's last `window` keys; return what the chunk's queries attend to."""
        seen = None
        if len(pos_new) > 1:
            seen = (np.concatenate([self.k, k_new]), np.concatenate([self.v, v_new]),
                    np.concatenate([self.pos, pos_new]))
        keep = slice(max(0, len(pos_new) - self.window), len(pos_new))
        slots = pos_new[keep] % self.window
        self.k[slots], self.v[slots], self.pos[slots] = k_new[keep], v_new[keep], pos_new[keep]
        return seen or (self.k, self.v, self.pos)  # decode: the ring holds the window itself

    def reset(self) -> None:
        self.pos[:] = -1

    def copy(self) -> RingKV:
        new = RingKV.__new__(RingKV)
        new.window, new.k, new.v, new.pos = self.window, self.k.copy(), self.v.copy(), self.pos.copy()
        return new


class ConvState:
    """The last kernel-1 inputs of a causal depthwise conv (C channels), oldest first."""

    def __init__(self, kernel: int, channels: int):
        self.x = np.zeros((kernel - 1, channels), np.float32)

    @property
    def nbytes(self) -> int:
        return self.x.nbytes

    def reset(self) -> None:
        self.x[:] = 0

    def copy(self) -> ConvState:
        new = ConvState.__new__(ConvState)
        new.x = self.x.copy()
        return new


class DeltaState:
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

    def copy(self) -> DeltaState:
        new = DeltaState.__new__(DeltaState)
        new.s, new.conv = self.s.copy(), self.conv.copy()
        return new
