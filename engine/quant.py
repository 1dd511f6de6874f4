"""Weight formats: each declared once, with the pure-numpy reference that *is* its definition.

Type ids are GGML's numbers, never renumbered, so a GGUF block is copied into our files byte for
byte (lossless import). Our `int8` is the Q8_0 block and our `int4` the Q4_1 block. Every type
llama.cpp's presets write is imported; the float types, q4_0, q4_1 and q8_0 are produced.

Layout: blocks run along a matrix row (the input dimension). A row of `n` weights is
`n // block_size` blocks of `type_size` bytes; a stored quantized matrix is a uint8 array
(..., rows, row_bytes). Float types are stored as plain element arrays (bf16 as uint16). Every
dequantizer uses float32 arithmetic in the same order as `gguf.quants.dequantize`, so the two
agree bit for bit (tested).

Repacked (x8): the same blocks of 8 rows at a time interleaved for the CPU kernels' group dot
products, id PACKED + the GGML id (cpu.repack_x8 does it in place at load; the converter writes
expert matrices so). X8_REGIONS declares each layout; pack_x8 / unpack_x8 are its numpy definition.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

QK = 32  # weights per block of the simple formats
QK_K = 256  # weights per super-block of the K-quants


class QuantError(ValueError):
    """A tensor cannot be stored in the requested format."""


@dataclass(frozen=True)
class QuantType:
    name: str
    type_id: int  # on-disk id (GGML's); never renumber
    block_size: int
    type_size: int  # bytes per block
    storage: np.dtype  # dtype of the stored array
    dequantize: Callable[[np.ndarray], np.ndarray]
    quantize: Callable[[np.ndarray], np.ndarray] | None
    rms_budget: float | None  # max relative RMS error of quantize→dequantize on N(0,1) weights
    base: "QuantType | None" = field(default=None, repr=False)  # an x8 type: the format it interleaves

    @property
    def plain(self) -> QuantType:
        """The format itself: for a repacked (x8) type its base, else this type."""
        return self.base or self

    @property
    def is_block(self) -> bool:
        return self.block_size > 1

    def row_bytes(self, n: int) -> int:
        if n % self.block_size:
            raise QuantError(f"{self.name}: row length {n} is not a multiple of {self.block_size}")
        return n // self.block_size * self.type_size

    def nbytes(self, shape: tuple[int, ...]) -> int:
        rows = int(np.prod(shape[:-1], dtype=np.int64)) if len(shape) > 1 else 1
        return rows * self.row_bytes(int(shape[-1])) if shape else self.type_size

    def stored_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """Shape of the stored array for a logical tensor shape."""
        if not self.is_block:
            return tuple(shape)
        return (*shape[:-1], self.row_bytes(int(shape[-1])))


# --- helpers ---------------------------------------------------------------------------------

def _blocks(raw: np.ndarray, type_size: int) -> tuple[np.ndarray, tuple[int, ...]]:
    """(..., row_bytes) uint8 -> (n_blocks, type_size), and the leading shape to restore."""
    raw = np.ascontiguousarray(raw, dtype=np.uint8)
    return raw.reshape(-1, type_size), raw.shape[:-1]


def _f16(b: np.ndarray) -> np.ndarray:
    """Two bytes per row (n, 2) -> float32 (n, 1), exactly."""
    return np.ascontiguousarray(b).view(np.float16).astype(np.float32)


def _round_away(x: np.ndarray) -> np.ndarray:
    """C roundf: halves away from zero (np.round rounds halves to even)."""
    a = np.abs(x)
    whole = np.floor(a)
    return np.copysign(whole + (a - whole >= np.float32(0.5)), x).astype(np.float32)


def _group(x: np.ndarray, size: int) -> tuple[np.ndarray, tuple[int, ...]]:
    x = np.asarray(x, dtype=np.float32)
    if x.shape[-1] % size:
        raise QuantError(f"row length {x.shape[-1]} is not a multiple of {size}")
    return x.reshape(-1, size), x.shape[:-1] + (x.shape[-1] // size,)


def _pack_nibbles(q: np.ndarray) -> np.ndarray:
    """(n, 32) values 0..15 -> (n, 16) bytes: byte j = q[j] | q[j + 16] << 4."""
    q = q.astype(np.uint8)
    return q[:, :16] | (q[:, 16:] << np.uint8(4))


def _unpack_nibbles(qs: np.ndarray) -> np.ndarray:
    """(n, 16k) bytes -> (n, 32k): each 16-byte chunk gives its low nibbles, then its high ones."""
    n, width = qs.shape
    qs = qs.reshape(n, width // 16, 1, 16)
    return ((qs >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)) & np.uint8(15)).reshape(n, -1)


def _unshape(values: np.ndarray, lead: tuple[int, ...]) -> np.ndarray:
    return values.reshape(*lead, -1)


# --- float formats ---------------------------------------------------------------------------

def _f32_deq(a: np.ndarray) -> np.ndarray:
    return np.asarray(a, dtype=np.float32)


def _f16_q(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, dtype=np.float32).astype(np.float16)


def _f16_deq(a: np.ndarray) -> np.ndarray:
    return np.asarray(a).astype(np.float32)


def _bf16_q(x: np.ndarray) -> np.ndarray:
    """float32 -> bf16 bits, round to nearest even (NaN kept quiet)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = ((u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16))
    nan = (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    return np.where(nan, (u >> np.uint32(16)) | np.uint32(0x40), rounded).astype(np.uint16)


def _bf16_deq(a: np.ndarray) -> np.ndarray:
    return (np.asarray(a, dtype=np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)


# --- Q8_0 (our int8): f16 d, int8 q[32]; w = d * q -------------------------------------------
# The quantizers follow ggml's reference (quantize_row_*_ref): the scale is computed in float32
# and rounded to f16 only when stored. Our output equals `gguf.quants.quantize` bit for bit.

def _inverse(d: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore"):
        return np.where(d == 0, np.float32(0), np.float32(1) / d).astype(np.float32)


def _q8_0_q(x: np.ndarray) -> np.ndarray:
    g, lead = _group(x, QK)
    d = np.abs(g).max(axis=1, keepdims=True) / np.float32(127)
    q = _round_away(g * _inverse(d)).astype(np.int8)
    out = np.concatenate([d.astype(np.float16).view(np.uint8), q.view(np.uint8)], axis=1)
    return out.reshape(*lead[:-1], -1)


def _q8_0_deq(raw: np.ndarray) -> np.ndarray:
    b, lead = _blocks(raw, 34)
    return _unshape(_f16(b[:, :2]) * b[:, 2:].view(np.int8).astype(np.float32), lead)


# --- Q4_0: f16 d, nibbles; w = d * (q - 8) ---------------------------------------------------

def _q4_0_q(x: np.ndarray) -> np.ndarray:
    g, lead = _group(x, QK)
    signed_max = np.take_along_axis(g, np.abs(g).argmax(axis=1)[:, None], axis=1)
    d = signed_max / np.float32(-8)
    q = np.clip(np.trunc(g * _inverse(d) + np.float32(8.5)), 0, 15)
    out = np.concatenate([d.astype(np.float16).view(np.uint8), _pack_nibbles(q)], axis=1)
    return out.reshape(*lead[:-1], -1)


def _q4_0_deq(raw: np.ndarray) -> np.ndarray:
    b, lead = _blocks(raw, 18)
    q = (_unpack_nibbles(b[:, 2:]).astype(np.int8) - np.int8(8)).astype(np.float32)
    return _unshape(_f16(b[:, :2]) * q, lead)


# --- Q4_1 (our int4): f16 d, f16 m, nibbles; w = d * q + m -----------------------------------

def _q4_1_q(x: np.ndarray) -> np.ndarray:
    g, lead = _group(x, QK)
    lo, hi = g.min(axis=1, keepdims=True), g.max(axis=1, keepdims=True)
    d = (hi - lo) / np.float32(15)
    q = np.clip(np.trunc((g - lo) * _inverse(d) + np.float32(0.5)), 0, 15)
    head = [d.astype(np.float16).view(np.uint8), lo.astype(np.float16).view(np.uint8)]
    return np.concatenate([*head, _pack_nibbles(q)], axis=1).reshape(*lead[:-1], -1)


def _q4_1_deq(raw: np.ndarray) -> np.ndarray:
    b, lead = _blocks(raw, 20)
    q = _unpack_nibbles(b[:, 4:]).astype(np.float32)
    return _unshape(_f16(b[:, :2]) * q + _f16(b[:, 2:4]), lead)


# --- Q5_0 / Q5_1: f16 d, (f16 m,) u32 qh, nibbles; bit j of qh is bit 4 of weight j ----------

def _fifth_bits(qh: np.ndarray) -> np.ndarray:
    """(n, 4) bytes of a little-endian uint32 -> (n, 32) bits, weight j's from bit j."""
    return (qh.reshape(-1, 4, 1) >> np.arange(8, dtype=np.uint8).reshape(1, 1, 8)).reshape(-1, 32) & np.uint8(1)


def _q5_0_deq(raw: np.ndarray) -> np.ndarray:
    # w = d * (q5 - 16)
    b, lead = _blocks(raw, 22)
    q = _unpack_nibbles(b[:, 6:]) | (_fifth_bits(b[:, 2:6]) << np.uint8(4))
    return _unshape(_f16(b[:, :2]) * (q.astype(np.int8) - np.int8(16)).astype(np.float32), lead)


def _q5_1_deq(raw: np.ndarray) -> np.ndarray:
    # w = d * q5 + m
    b, lead = _blocks(raw, 24)
    q = _unpack_nibbles(b[:, 8:]) | (_fifth_bits(b[:, 4:8]) << np.uint8(4))
    return _unshape(_f16(b[:, :2]) * q.astype(np.float32) + _f16(b[:, 2:4]), lead)


# --- IQ4_NL: f16 d, nibbles (Q4_0 order) indexing a 16-value non-linear grid; w = d * grid[q] ---
IQ4_GRID = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.int8)
# --- MXFP4 (gpt-oss): e8m0 exponent e, nibbles (Q4_0 order) indexing e2m1 values doubled;
# w = 2^(e - 128) * grid[q] (the exponent is halved because the grid is doubled)
MXFP4_GRID = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], np.int8)


def _iq4_nl_deq(raw: np.ndarray) -> np.ndarray:
    b, lead = _blocks(raw, 18)
    return _unshape(_f16(b[:, :2]) * IQ4_GRID[_unpack_nibbles(b[:, 2:])].astype(np.float32), lead)


def e8m0_half(e: np.ndarray) -> np.ndarray:
    """e8m0 exponent bytes -> float32 2^(e - 128), exactly, as ggml's GGML_E8M0_TO_FP32_HALF."""
    e = np.asarray(e, dtype=np.uint32)
    bits = np.where(e < 2, np.uint32(0x00200000) << e, (e - np.uint32(1)) << np.uint32(23))
    return bits.astype(np.uint32).view(np.float32)


def _mxfp4_deq(raw: np.ndarray) -> np.ndarray:
    b, lead = _blocks(raw, 17)
    return _unshape(e8m0_half(b[:, :1]) * MXFP4_GRID[_unpack_nibbles(b[:, 1:])].astype(np.float32), lead)


# --- K-quants (import only): 256 weights in 8 sub-blocks of 32 (Q2_K, Q3_K, Q6_K: 16 of 16) --

def _k_scales(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """12 bytes -> 8 six-bit scales and 8 six-bit minimums.

    bytes 0-3: sc[0:4] in bits 0-5, top bits of sc[4:8] in bits 6-7
    bytes 4-7: m[0:4] in bits 0-5, top bits of m[4:8] in bits 6-7
    bytes 8-11: low 4 bits of sc[4:8] (low nibble) and of m[4:8] (high nibble)
    """
    lo_s, lo_m, mix = s[:, 0:4], s[:, 4:8], s[:, 8:12]
    sc = np.concatenate([lo_s & 63, (mix & 15) | ((lo_s >> 6) << 4)], axis=1)
    mn = np.concatenate([lo_m & 63, (mix >> 4) | ((lo_m >> 6) << 4)], axis=1)
    return sc.astype(np.float32), mn.astype(np.float32)


def _q2_k_deq(raw: np.ndarray) -> np.ndarray:
    # scales[16] (low nibble: scale, high: minimum of 16 weights) | qs[64] | d f16 | dmin f16;
    # w = d * sc * q2 - dmin * m; weight 128c + 32s + i is bits 2s..2s+1 of qs[32c + i]
    b, lead = _blocks(raw, 84)
    sc = b[:, :16]
    dl = (_f16(b[:, 80:82]) * (sc & np.uint8(15)).astype(np.float32))[:, :, None]
    ml = (_f16(b[:, 82:84]) * (sc >> np.uint8(4)).astype(np.float32))[:, :, None]
    q = (b[:, 16:80].reshape(-1, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)) & np.uint8(3)
    return _unshape(dl * q.reshape(-1, 16, 16).astype(np.float32) - ml, lead)


def _q3_k_scales(s: np.ndarray) -> np.ndarray:
    """12 bytes -> 16 six-bit scales minus 32: low 4 bits from bytes 0-7 (low nibbles, then high
    ones), top 2 bits from bytes 8-11 (bits 2k..2k+1 of byte 8 + j % 4 for scale 4k + j)."""
    lo = (s[:, :8].reshape(-1, 1, 8) >> np.array([0, 4], np.uint8).reshape(1, 2, 1)).reshape(-1, 16)
    hi = (s[:, 8:12].reshape(-1, 1, 4) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 4, 1)).reshape(-1, 16)
    return (((lo & np.uint8(15)) | ((hi & np.uint8(3)) << np.uint8(4))).astype(np.int8) - np.int8(32)).astype(np.float32)


def _q3_k_deq(raw: np.ndarray) -> np.ndarray:
    # hmask[32] | qs[64] | scales[12] | d f16; w = d * scale * (q2 - 4 * !h), 16 sub-blocks of 16;
    # weight 128c + 32s + i: bits 2s..2s+1 of qs[32c + i], h = bit 4c + s of hmask[i]
    b, lead = _blocks(raw, 110)
    dl = (_f16(b[:, 108:110]) * _q3_k_scales(b[:, 96:108]))[:, :, None]
    ql = (b[:, 32:96].reshape(-1, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)) & np.uint8(3)
    h = (b[:, :32].reshape(-1, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 8, 1)) & np.uint8(1)
    q = ql.reshape(-1, 16, 16).astype(np.int8) - ((h ^ np.uint8(1)) << np.uint8(2)).reshape(-1, 16, 16).astype(np.int8)
    return _unshape(dl * q.astype(np.float32), lead)


def _q4_k_deq(raw: np.ndarray) -> np.ndarray:
    # d f16 | dmin f16 | scales[12] | qs[128]: 32-byte chunk c holds sub-blocks 2c (low), 2c+1 (high)
    b, lead = _blocks(raw, 144)
    sc, mn = _k_scales(b[:, 4:16])
    d = (_f16(b[:, 0:2]) * sc)[:, :, None]
    dm = (_f16(b[:, 2:4]) * mn)[:, :, None]
    qs = b[:, 16:].reshape(-1, 4, 1, 32) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)
    q = (qs & np.uint8(15)).reshape(-1, 8, 32).astype(np.float32)
    return _unshape(d * q - dm, lead)


def _q5_k_deq(raw: np.ndarray) -> np.ndarray:
    # d f16 | dmin f16 | scales[12] | qh[32] | qs[128]; bit i of qh[j] is bit 4 of sub-block i, weight j
    b, lead = _blocks(raw, 176)
    sc, mn = _k_scales(b[:, 4:16])
    d = (_f16(b[:, 0:2]) * sc)[:, :, None]
    dm = (_f16(b[:, 2:4]) * mn)[:, :, None]
    qs = b[:, 48:].reshape(-1, 4, 1, 32) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)
    lo = (qs & np.uint8(15)).reshape(-1, 8, 32)
    hi = (b[:, 16:48].reshape(-1, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 8, 1)) & np.uint8(1)
    q = (lo | (hi << np.uint8(4))).astype(np.float32)
    return _unshape(d * q - dm, lead)


def _q6_k_deq(raw: np.ndarray) -> np.ndarray:
    # ql[128] | qh[64] | scales int8[16] | d f16; w = d * scale[sub16] * (q6 - 32)
    b, lead = _blocks(raw, 210)
    ql = b[:, :128].reshape(-1, 2, 1, 64) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)
    ql = (ql & np.uint8(15)).reshape(-1, 8, 32)
    qh = b[:, 128:192].reshape(-1, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)
    qh = (qh & np.uint8(3)).reshape(-1, 8, 32)
    q = ((ql | (qh << np.uint8(4))).astype(np.int8) - np.int8(32)).reshape(-1, 16, 16).astype(np.float32)
    d = (_f16(b[:, 208:210]) * b[:, 192:208].view(np.int8).astype(np.float32))[:, :, None]
    return _unshape(d * q, lead)


def _iq4_xs_deq(raw: np.ndarray) -> np.ndarray:
    # d f16 | scales_h u16 | scales_l[4] | qs[128]; 8 sub-blocks of 32, w = d * (s6 - 32) * grid[q],
    # s6 of sub-block j = nibble j of scales_l | bits 2j..2j+1 of scales_h << 4; sub-block j's
    # weights are qs[16j:16j+16] in Q4_0 order
    b, lead = _blocks(raw, 136)
    lo = (b[:, 4:8].reshape(-1, 4, 1) >> np.array([0, 4], np.uint8).reshape(1, 1, 2)).reshape(-1, 8) & np.uint8(15)
    sh = np.ascontiguousarray(b[:, 2:4]).view(np.uint16)
    hi = ((sh >> np.arange(0, 16, 2, dtype=np.uint16).reshape(1, 8)).astype(np.uint8) & np.uint8(3))
    scale = ((lo | (hi << np.uint8(4))).astype(np.int8) - np.int8(32)).astype(np.float32)
    dl = (_f16(b[:, :2]) * scale)[:, :, None]
    q = IQ4_GRID[_unpack_nibbles(b[:, 8:])].astype(np.float32).reshape(-1, 8, 32)
    return _unshape(dl * q, lead)


# --- the table -------------------------------------------------------------------------------

_TYPES = [
    QuantType("f32", 0, 1, 4, np.dtype(np.float32), _f32_deq, _f32_deq, 0.0),
    QuantType("f16", 1, 1, 2, np.dtype(np.float16), _f16_deq, _f16_q, 4e-4),
    QuantType("q4_0", 2, QK, 18, np.dtype(np.uint8), _q4_0_deq, _q4_0_q, 0.11),
    QuantType("q4_1", 3, QK, 20, np.dtype(np.uint8), _q4_1_deq, _q4_1_q, 0.09),
    QuantType("q5_0", 6, QK, 22, np.dtype(np.uint8), _q5_0_deq, None, None),
    QuantType("q5_1", 7, QK, 24, np.dtype(np.uint8), _q5_1_deq, None, None),
    QuantType("q8_0", 8, QK, 34, np.dtype(np.uint8), _q8_0_deq, _q8_0_q, 0.006),
    QuantType("q2_k", 10, QK_K, 84, np.dtype(np.uint8), _q2_k_deq, None, None),
    QuantType("q3_k", 11, QK_K, 110, np.dtype(np.uint8), _q3_k_deq, None, None),
    QuantType("q4_k", 12, QK_K, 144, np.dtype(np.uint8), _q4_k_deq, None, None),
    QuantType("q5_k", 13, QK_K, 176, np.dtype(np.uint8), _q5_k_deq, None, None),
    QuantType("q6_k", 14, QK_K, 210, np.dtype(np.uint8), _q6_k_deq, None, None),
    QuantType("iq4_nl", 20, QK, 18, np.dtype(np.uint8), _iq4_nl_deq, None, None),
    QuantType("iq4_xs", 23, QK_K, 136, np.dtype(np.uint8), _iq4_xs_deq, None, None),
    QuantType("bf16", 30, 1, 2, np.dtype(np.uint16), _bf16_deq, _bf16_q, 2.5e-3),
    QuantType("mxfp4", 39, QK, 17, np.dtype(np.uint8), _mxfp4_deq, None, None),
]


# --- repacked in groups of 8 rows (the CPU kernels' layout) ----------------------------------
PACKED = 1000  # a repacked type's id: PACKED + its format's GGML id (engine.kernels.cpu.PACKED)
# format -> per block, the regions (offset, bytes, unit) interleaved over 8 rows: in a group of 8
# rows, block b holds at 8·size·b + 8·offset + 8·unit·c + unit·i the unit c of the region of row i
X8_REGIONS: dict[str, list[tuple[int, int, int]]] = {
    "q4_0": [(0, 2, 2), (2, 16, 4)], "q4_1": [(0, 4, 2), (4, 16, 4)], "q8_0": [(0, 2, 2), (2, 32, 4)],
    "q5_0": [(0, 2, 2), (2, 4, 4), (6, 16, 4)], "q5_1": [(0, 4, 2), (4, 4, 4), (8, 16, 4)],
    "iq4_nl": [(0, 2, 2), (2, 16, 4)], "mxfp4": [(0, 1, 1), (1, 16, 4)],
    "q4_k": [(0, 4, 2), (4, 12, 1), (16, 128, 4)],  # d, dmin | scales[12] | qs[128]
    "q5_k": [(0, 4, 2), (4, 12, 1), (16, 32, 4), (48, 128, 4)],  # ... | qh[32] | qs[128]
    "q6_k": [(0, 128, 4), (128, 64, 4), (192, 16, 1), (208, 2, 2)],  # ql | qh | scales[16] | d
    "iq4_xs": [(0, 2, 2), (2, 2, 2), (4, 4, 4), (8, 128, 4)],  # d | scales_h | scales_l | qs
}


def _x8_views(raw: np.ndarray, size: int):
    """A (rows, row_bytes) matrix's 8-row groups, as (groups, blocks, 8·size) and (groups, 8, blocks, size)."""
    rows, rb = raw.shape[-2], raw.shape[-1]
    if rows % 8:
        raise QuantError(f"repacked (x8) layout: {rows} rows is not a multiple of 8")
    return raw.reshape(rows // 8, rb // size, 8 * size), raw.reshape(rows // 8, 8, rb // size, size)


def pack_x8(stored: np.ndarray, name: str) -> np.ndarray:
    """A stored matrix (rows, row_bytes) of format `name`, rows a multiple of 8 -> a repacked copy."""
    size = BY_NAME[name].type_size
    out = np.empty_like(stored)
    dst, src = _x8_views(out, size)[0], _x8_views(np.ascontiguousarray(stored), size)[1]
    for off, length, unit in X8_REGIONS[name]:  # (groups, rows i, blocks, units c, unit) -> (groups, blocks, c, i, unit)
        part = src[..., off:off + length].reshape(*src.shape[:3], length // unit, unit).transpose(0, 2, 3, 1, 4)
        dst[..., 8 * off:8 * (off + length)] = part.reshape(*dst.shape[:2], 8 * length)
    return out


def unpack_x8(packed: np.ndarray, name: str) -> np.ndarray:
    """The inverse of pack_x8: a repacked matrix -> its rows in the stored layout (a copy)."""
    size = BY_NAME[name].type_size
    out = np.empty_like(packed)
    dst, src = _x8_views(out, size)[1], _x8_views(np.ascontiguousarray(packed), size)[0]
    for off, length, unit in X8_REGIONS[name]:
        part = src[..., 8 * off:8 * (off + length)].reshape(*src.shape[:2], length // unit, 8, unit)
        dst[..., off:off + length] = part.transpose(0, 3, 1, 2, 4).reshape(*dst.shape[:3], length)
    return out


def _x8_type(t: QuantType) -> QuantType:
    deq = lambda raw: t.dequantize(unpack_x8(raw.reshape(-1, raw.shape[-1]), t.name).reshape(raw.shape))  # noqa: E731
    q = None if t.quantize is None else \
        lambda x: pack_x8(t.quantize(np.reshape(x, (-1, np.shape(x)[-1]))), t.name).reshape(*np.shape(x)[:-1], -1)
    return QuantType(t.name + "x8", PACKED + t.type_id, t.block_size, t.type_size, t.storage, deq, q, None, t)


_TYPES += [_x8_type(t) for t in _TYPES if t.name in X8_REGIONS]
BY_NAME: dict[str, QuantType] = {t.name: t for t in _TYPES}
BY_ID: dict[int, QuantType] = {t.type_id: t for t in _TYPES}


def repacked(qtype: QuantType, shape: tuple[int, ...]) -> QuantType:
    """The repacked (x8) variant of `qtype` for a matrix of `shape`, or qtype itself where there is none."""
    rows = int(np.prod(shape[:-1], dtype=np.int64)) if len(shape) > 1 else 0
    if qtype.base is not None or qtype.name not in X8_REGIONS or rows == 0 or rows % 8:
        return qtype
    return BY_ID[PACKED + qtype.type_id]

# What users ask for on the command line -> the format that holds it.
TARGETS: dict[str, str] = {"f32": "f32", "f16": "f16", "int8": "q8_0", "int4": "q4_1"}
# Source formats already in a target's family are copied as they are, never re-rounded.
FAMILY: dict[str, frozenset[str]] = {
    "f32": frozenset({"f32"}),
    "f16": frozenset({"f16"}),
    "int8": frozenset({"q8_0"}),
    "int4": frozenset({"q4_0", "q4_1", "q4_k", "iq4_nl", "iq4_xs", "mxfp4", "q3_k", "q2_k"}),
}
# What to tell someone whose GGUF holds a type this table lacks (IQ1_*, IQ2_*, IQ3_*, TQ*_0, ...).
PRESETS_ADVICE = ("re-quantize it with a preset Colibri imports: Q4_K_M, Q5_K_M, Q6_K, Q8_0 or IQ4_XS "
                  "(also Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K_M, IQ4_NL)")


def get(name_or_id: str | int) -> QuantType:
    """Look a format up by name or on-disk id; unknown ones are an error naming the known ones."""
    table = BY_ID if isinstance(name_or_id, (int, np.integer)) else BY_NAME
    try:
        return table[name_or_id]  # type: ignore[index]
    except KeyError:
        known = ", ".join(f"{t.name} ({t.type_id})" for t in _TYPES)
        raise QuantError(f"unknown quant type {name_or_id!r}; known: {known}") from None


def quantize(x: np.ndarray, qtype: str | QuantType) -> np.ndarray:
    """float weights (..., n) -> the stored array of `qtype`."""
    t = qtype if isinstance(qtype, QuantType) else get(qtype)
    if t.quantize is None:
        raise QuantError(f"{t.name} can be imported but not produced")
    if t.is_block:
        t.row_bytes(int(np.shape(x)[-1]))
    return t.quantize(x)


def dequantize(stored: np.ndarray, qtype: str | QuantType) -> np.ndarray:
    """The stored array of `qtype` -> float32 weights (..., n)."""
    t = qtype if isinstance(qtype, QuantType) else get(qtype)
    return t.dequantize(stored)
