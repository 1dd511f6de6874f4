"""The KV cache of one sequence: keys and values of every layer at every cached position.

Storage: f32, f16 (half the memory) or int8 with one float32 scale per position and KV head
(about a quarter). The attention kernel reads the stored elements and widens each as it goes
(`views`), so a longer context costs no conversion pass per token.
"""
from __future__ import annotations

import numpy as np

from engine.mempool import MemoryPool
from engine.ops.cache import position_bytes

KINDS = ("f32", "f16", "int8")
ELEMENT_BYTES = {"f32": 4, "f16": 2, "int8": 1}


def kv_cache_bytes(layers: int, capacity: int, kv_heads: int, head_dim: int, kind: str) -> int:
    """Bytes a full cache of this shape holds (keys and values; int8 adds a scale per head)."""
    per_head = head_dim * ELEMENT_BYTES[kind] + (4 if kind == "int8" else 0)
    return 2 * layers * capacity * kv_heads * per_head


def own_attention_caches(cfg) -> bool:
    """Whether every attention layer keeps its own cache (engine.ops.cache): sinks or per-layer shapes."""
    from engine.arch import spec
    return spec(cfg.architecture).attention_sinks or cfg.full_head_dim > 0 or cfg.kv_shared_layers > 0


def model_cache_bytes(cfg, context: int, kind: str = "f16") -> int:
    """Bytes one conversation of `context` tokens holds in the caches, per layer kind: a full
    attention layer's grow with the context; a ring and the recurrent states do not."""
    kinds = cfg.layer_types or ("attention",) * cfg.num_layers
    own = own_attention_caches(cfg)
    total = 0
    for L, k in enumerate(kinds):
        if k == "short_conv":
            total += (cfg.conv_kernel - 1) * cfg.hidden_size * 4
        elif k == "linear_attention":
            nk, nv, dk, dv = cfg.linear_key_heads, cfg.linear_value_heads, cfg.linear_key_dim, cfg.linear_value_dim
            total += nv * dk * dv * 4 + (cfg.conv_kernel - 1) * (2 * nk * dk + nv * dv) * 4
        elif own and cfg.kv_source(L) != L:  # (its keys and values are another layer's)
            continue
        elif own:
            kvh, hd = cfg.attention_shape(L)
            n = min(context, cfg.sliding_window) if k == "sliding_attention" and cfg.sliding_window else context
            total += n * position_bytes(kvh, hd, kind=kind)
        else:
            total += kv_cache_bytes(1, context, cfg.num_kv_heads, cfg.head_dim, kind)
    return total


class KVCache:
    def __init__(self, layers: int, capacity: int, kv_heads: int, head_dim: int, kind: str = "f16",
                 pool: MemoryPool | None = None):
        if kind not in KINDS:
            raise ValueError(f"kv_cache_quantize: {kind!r} is not one of {', '.join(KINDS)}")
        self.kind, self.capacity, self.length = kind, capacity, 0
        # per layer, the fixed-size state of a layer that is not full attention (engine.ops.cache:
        # ConvState for short_conv ...), None for the others; set by the forward pass on first use
        self.states: list | None = None
        self._snapshot: tuple[int, list] | None = None  # (length, copies of the fixed-size states)
        self._pool, self._blocks = pool, []
        shape = (layers, capacity, kv_heads, head_dim)
        dtype = {"f32": np.float32, "f16": np.float16, "int8": np.int8}[kind]
        # fresh anonymous pages cost nothing until written: memory is paid as the context fills
        self.k, self.v = self._zeros(shape, dtype), self._zeros(shape, dtype)
        if kind == "int8":
            self.k_scale = self._zeros(shape[:3], np.float32)
            self.v_scale = self._zeros(shape[:3], np.float32)
        else:
            self.k_scale = self.v_scale = np.ones((layers, 1, 1), np.float32)  # unscaled: never read

    def _zeros(self, shape, dtype) -> np.ndarray:
        if self._pool is None:
            return np.zeros(shape, dtype)
        arr, block = self._pool.empty(shape, dtype, huge=False)  # paid as the context fills, 4 KB at a time
        if block.tier != "large":  # reused pool memory may hold old bytes; large blocks are fresh pages
            arr[...] = 0
        self._blocks.append(block)
        return arr

    def free(self) -> None:
        """Give the memory back to the pool (the cache is unusable afterwards)."""
        self.k = self.v = self.k_scale = self.v_scale = None
        for b in self._blocks:
            b.free()
        self._blocks = []

    @property
    def nbytes_used(self) -> int:
        layers = self.k.shape[0] if self.states is None else sum(s is None for s in self.states)  # in the block
        per_pos = self.k[0, 0].nbytes * 2 * layers
        if self.kind == "int8":
            per_pos += self.k_scale[0, 0].nbytes * 2 * layers
        return per_pos * self.length + self.state_bytes

    @property
    def state_bytes(self) -> int:
        """Bytes the per-layer states hold (a per-layer full KV cache: its filled positions)."""
        total = 0
        for s in self.states or ():
            if s is not None:
                total += s.bytes_used() if hasattr(s, "length") else s.nbytes  # a FullKV grows with the context
        return total

    @property
    def fixed_state_bytes(self) -> int:
        """Bytes of the states that do not grow with the context (rings, conv tails, DeltaNet)."""
        return sum(s.nbytes for s in self.states or () if s is not None and not hasattr(s, "length"))

    def write(self, layer: int, pos0: int, k: np.ndarray, v: np.ndarray) -> None:
        """Store k, v (T, kv_heads, head_dim) at positions pos0..pos0+T-1."""
        end = pos0 + k.shape[0]
        if self.kind == "int8":
            for src, dst, scale in ((k, self.k, self.k_scale), (v, self.v, self.v_scale)):
                s = np.abs(src).max(axis=-1) / 127.0
                scale[layer, pos0:end] = s
                safe = np.where(s == 0, 1.0, s)[..., None]
                dst[layer, pos0:end] = np.clip(np.rint(src / safe), -127, 127)
        elif self.kind == "f16":
            from engine.kernels.cpu import store_f16  # (here: the GUI imports this module for its sizes only)
            for src, dst in ((k, self.k), (v, self.v)):
                rows = dst[layer, pos0:end]
                if rows.shape != src.shape:  # (past the capacity: the kernel checks no bounds, numpy's copy did)
                    raise ValueError(f"KV cache write of {src.shape} at position {pos0} into {rows.shape}")
                store_f16(np.ascontiguousarray(src, np.float32).reshape(len(src), -1),
                          rows.view(np.uint16).reshape(len(src), -1))
        else:
            self.k[layer, pos0:end] = k
            self.v[layer, pos0:end] = v

    def views(self, layer: int, length: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, bool]:
        """What the attention kernel reads for positions 0..length-1 of `layer`: keys, values as stored,
        their per-head scales, and whether the scales apply (int8 only)."""
        k, v = self.k[layer, :length], self.v[layer, :length]
        if self.kind == "f16":
            k, v = k.view(np.uint16), v.view(np.uint16)
        scaled = self.kind == "int8"
        return k, v, self.k_scale[layer, :length if scaled else 1], self.v_scale[layer, :length if scaled else 1], scaled

    def truncate(self, length: int) -> int:
        """Forget positions from `length` on; returns the length kept. Rings and recurrent states cannot
        rewind: they go back to the snapshot if `length` reaches it, else the cache to 0."""
        if self.states is not None and length < self.length:
            snap = self._snapshot
            if snap is None or snap[0] > length:
                self.states, self._snapshot, length = None, None, 0
            else:
                length = snap[0]
                for i, (live, kept) in enumerate(zip(self.states, snap[1], strict=True)):
                    if hasattr(live, "trim"):  # a layer's own full KV cache forgets what follows
                        live.trim(length)
                    elif kept is not None:  # a ring or a recurrent state: its copy comes back
                        self.states[i] = kept.copy()
        self.length = min(self.length, length)
        return self.length

    def snapshot(self) -> None:
        """Copy the fixed-size states at the end of a prompt, so a next prompt that starts so rewinds here."""
        if self.states is not None:
            self._snapshot = (self.length, [None if s is None or hasattr(s, "trim") else s.copy()
                                            for s in self.states])

    def overwrite(self, pos0: int) -> None:
        """Positions from pos0 on are being written anew: a snapshot past pos0 no longer holds."""
        if self._snapshot is not None and pos0 < self._snapshot[0]:
            self._snapshot = None
