"""The KV cache of one sequence: keys and values of every layer at every cached position.

Storage: f32, f16 (half the memory) or int8 with one float32 scale per position and KV head
(about a quarter). Attention reads float32: f16/int8 layers are widened into one scratch
buffer per read.
"""
from __future__ import annotations

import numpy as np

from engine.mempool import MemoryPool

KINDS = ("f32", "f16", "int8")
ELEMENT_BYTES = {"f32": 4, "f16": 2, "int8": 1}


def kv_cache_bytes(layers: int, capacity: int, kv_heads: int, head_dim: int, kind: str) -> int:
    """Bytes a full cache of this shape holds (keys and values; int8 adds a scale per head)."""
    per_head = head_dim * ELEMENT_BYTES[kind] + (4 if kind == "int8" else 0)
    return 2 * layers * capacity * kv_heads * per_head


class KVCache:
    def __init__(self, layers: int, capacity: int, kv_heads: int, head_dim: int, kind: str = "f16",
                 pool: MemoryPool | None = None):
        if kind not in KINDS:
            raise ValueError(f"kv_cache_quantize: {kind!r} is not one of {', '.join(KINDS)}")
        self.kind, self.capacity, self.length = kind, capacity, 0
        self._pool, self._blocks = pool, []
        shape = (layers, capacity, kv_heads, head_dim)
        dtype = {"f32": np.float32, "f16": np.float16, "int8": np.int8}[kind]
        # fresh anonymous pages cost nothing until written: memory is paid as the context fills
        self.k, self.v = self._zeros(shape, dtype), self._zeros(shape, dtype)
        if kind == "int8":
            self.k_scale = self._zeros(shape[:3], np.float32)
            self.v_scale = self._zeros(shape[:3], np.float32)
        if kind != "f32":
            self._k32 = self._zeros(shape[1:], np.float32)
            self._v32 = self._zeros(shape[1:], np.float32)

    def _zeros(self, shape, dtype) -> np.ndarray:
        if self._pool is None:
            return np.zeros(shape, dtype)
        arr, block = self._pool.empty(shape, dtype)
        if block.tier != "large":  # reused pool memory may hold old bytes; large blocks are fresh pages
            arr[...] = 0
        self._blocks.append(block)
        return arr

    @property
    def nbytes_reserved(self) -> int:
        return sum(b.size for b in self._blocks)

    def free(self) -> None:
        """Give the memory back to the pool (the cache is unusable afterwards)."""
        self.k = self.v = self._k32 = self._v32 = self.k_scale = self.v_scale = None
        for b in self._blocks:
            b.free()
        self._blocks = []

    @property
    def nbytes_used(self) -> int:
        per_pos = self.k[0, 0].nbytes * 2 * self.k.shape[0]
        if self.kind == "int8":
            per_pos += self.k_scale[0, 0].nbytes * 2 * self.k.shape[0]
        return per_pos * self.length

    def write(self, layer: int, pos0: int, k: np.ndarray, v: np.ndarray) -> None:
        """Store k, v (T, kv_heads, head_dim) at positions pos0..pos0+T-1."""
        end = pos0 + k.shape[0]
        if self.kind == "int8":
            for src, dst, scale in ((k, self.k, self.k_scale), (v, self.v, self.v_scale)):
                s = np.abs(src).max(axis=-1) / 127.0
                scale[layer, pos0:end] = s
                safe = np.where(s == 0, 1.0, s)[..., None]
                dst[layer, pos0:end] = np.clip(np.rint(src / safe), -127, 127)
        else:
            self.k[layer, pos0:end] = k
            self.v[layer, pos0:end] = v

    def read(self, layer: int, length: int) -> tuple[np.ndarray, np.ndarray]:
        """Keys and values of positions 0..length-1 as float32 (length, kv_heads, head_dim)."""
        if self.kind == "f32":
            return self.k[layer, :length], self.v[layer, :length]
        k32, v32 = self._k32[:length], self._v32[:length]
        if self.kind == "f16":
            k32[:] = self.k[layer, :length]
            v32[:] = self.v[layer, :length]
        else:
            np.multiply(self.k[layer, :length], self.k_scale[layer, :length, :, None], out=k32)
            np.multiply(self.v[layer, :length], self.v_scale[layer, :length, :, None], out=v32)
        return k32, v32

    def truncate(self, length: int) -> None:
        self.length = min(self.length, length)
