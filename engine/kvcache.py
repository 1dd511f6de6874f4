"""The KV cache of one sequence: keys and values of every layer at every cached position.

Storage: f32, f16 (half the memory) or int8 with one float32 scale per position and KV head
(about a quarter). Attention reads float32: f16/int8 layers are widened into one scratch
buffer per read.
"""
from __future__ import annotations

import numpy as np

KINDS = ("f32", "f16", "int8")


class KVCache:
    def __init__(self, layers: int, capacity: int, kv_heads: int, head_dim: int, kind: str = "f16"):
        if kind not in KINDS:
            raise ValueError(f"kv_cache_quantize: {kind!r} is not one of {', '.join(KINDS)}")
        self.kind, self.capacity, self.length = kind, capacity, 0
        shape = (layers, capacity, kv_heads, head_dim)
        dtype = {"f32": np.float32, "f16": np.float16, "int8": np.int8}[kind]
        # np.zeros maps untouched pages lazily: memory is paid as the context fills
        self.k, self.v = np.zeros(shape, dtype), np.zeros(shape, dtype)
        if kind == "int8":
            self.k_scale = np.zeros(shape[:3], np.float32)
            self.v_scale = np.zeros(shape[:3], np.float32)
        if kind != "f32":
            self._k32 = np.zeros(shape[1:], np.float32)
            self._v32 = np.zeros(shape[1:], np.float32)

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
