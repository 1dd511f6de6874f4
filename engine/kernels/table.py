"""The kernel table: one place that lists each operation -> its kernel per weight format, layout and
instruction path -> its numpy twin -> the tolerance its test holds it to.

Why: the per-format kernels are spread over simd.py (q4_0/q4_1/q8_0), blocks32.py (q5_x, iq4_nl,
mxfp4, iq4_xs), kquants.py (q2_k..q6_k), tiles.py (q4_k..q6_k and iq4_xs prefill from TILE_MIN_T tokens on),
formats.py (dequantize, repacking), matmul.py (the parallel drivers) and smallops.py (norm, rope, attention); this table
says which code computes what, the tests iterate it (each kernel against its twin at its
tolerance: tests/test_kernels.py, tests/test_kernel_table.py), and tools (the profiler's per-op
timing hook, stats) read its operation names instead of replacing engine functions at run time.

Names are dotted paths ("module:function"), resolved on demand (`resolve`), so importing the table
compiles nothing. Tolerances: out ≈ twin within rtol, and atol times max|twin| (0, 0: bit for bit).
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

PATHS = ("vnni", "avx2", "generic")  # simd.DOT: the byte dot-product instructions
LAYOUTS = ("stored", "x8")  # rows as in the file; repacked in 8-row groups at load (formats.repack_x8)


@dataclass(frozen=True)
class Kernel:
    """One operation on a set of weight formats: which driver runs it, where the per-format inner
    code lives, its numpy twin, the tolerance, the layouts and instruction paths it is tested on."""
    op: str
    formats: tuple[str, ...]  # engine.quant names; () for an operation that reads no weights
    driver: str  # the numba kernel the engine calls
    inner: str  # the module with the per-format code (the vector intrinsics)
    twin: str  # the numpy twin
    rtol: float
    atol: float  # times max|twin|
    layouts: tuple[str, ...] = ("stored",)
    paths: tuple[str, ...] = ("any",)  # PATHS it has code for, or "any" (plain numba loops)
    note: str = ""


INT_SIMD = ("q4_0", "q4_1", "q8_0")
INT_BLOCKS32 = ("q5_0", "q5_1", "iq4_nl", "mxfp4", "iq4_xs")
INT_KQUANTS = ("q4_k", "q5_k", "q6_k")
INT_LOW_K = ("q2_k", "q3_k")
FLOATS = ("f32", "f16", "bf16")
ALL = FLOATS + INT_SIMD + INT_BLOCKS32 + INT_LOW_K + INT_KQUANTS

TABLE: tuple[Kernel, ...] = (
    # --- x @ W.T with int8 activations (decode, prefill; matmul_int, swiglu_int, moe_int, tiles.swiglu_tiles and
    # the one-call decode reach the same inner code through matmul._int_dot / _group_dot / _tokens_dot / _group_tokens)
    Kernel("matmul", INT_SIMD, "engine.kernels.matmul:matmul", "engine.kernels.simd", "engine.kernels.reference:matmul_int",
           1e-5, 1e-5, LAYOUTS, PATHS, "per block d_w·d_x·Σ q_w q_x (+ m_w·s_x, - 8·d·Σq_x)"),
    Kernel("matmul", INT_BLOCKS32, "engine.kernels.matmul:matmul", "engine.kernels.blocks32",
           "engine.kernels.blocks32:matmul_reference", 1e-5, 1e-5, LAYOUTS, PATHS,
           "16-entry grids through vpshufb; q5_x's fifth bits; iq4_xs sub-blocks as iq4_nl blocks (x8 prefill: tiles.py)"),
    Kernel("matmul", INT_KQUANTS, "engine.kernels.matmul:matmul", "engine.kernels.kquants",
           "engine.kernels.reference:matmul_int_k", 1e-5, 1e-5, LAYOUTS, PATHS, "sub-block scales per 32 (Q6_K: 16); x8 prefill: tiles.py"),
    Kernel("matmul", INT_LOW_K, "engine.kernels.matmul:matmul", "engine.kernels.kquants",
           "engine.kernels.reference:matmul_int_low_k", 1e-5, 1e-5, ("stored",), PATHS,
           "2-bit weights, scales applied in integers per 16"),
    Kernel("matmul", FLOATS, "engine.kernels.matmul:matmul", "engine.kernels.formats", "engine.kernels.reference:matmul",
           1e-5, 1e-5, ("stored",), ("any",), "rows dequantized 4 at a time, float dots"),
    Kernel("swiglu_int", INT_KQUANTS + ("iq4_xs",), "engine.kernels.tiles:swiglu_tiles", "engine.kernels.tiles",
           "engine.kernels.reference:swiglu_int", 1e-4, 1e-5, ("x8",), PATHS,
           "prefill (TILE_MIN_T tokens on): gate and up tiles dotted in one pass, each product matmul's bit for bit"),
    # --- the same product with float activations (the `exact` switch, and every format's fallback)
    Kernel("matmul_exact", ALL, "engine.kernels.matmul:matmul", "engine.kernels.formats", "engine.kernels.reference:matmul",
           1e-5, 1e-5, ("stored",), ("any",), "dequantize_row, then float dots"),
    Kernel("dequantize_row", ALL, "engine.kernels.formats:dequantize_row", "engine.kernels.formats", "engine.quant:dequantize",
           0.0, 0.0, ("stored",), ("any",), "bit for bit (gguf.quants equals the twin: tests/test_quant.py)"),
    Kernel("gather_rows", ALL, "engine.kernels.formats:gather_rows", "engine.kernels.formats", "engine.quant:dequantize",
           0.0, 0.0, LAYOUTS, ("any",), "the embedding lookup; repacked tables read back exactly"),
    Kernel("quantize_activations", (), "engine.kernels.formats:quantize_activations", "engine.kernels.simd",
           "engine.kernels.reference:quantize_activations", 0.0, 0.0, note="llama.cpp's Q8_1, bit for bit"),
    Kernel("quantize_activations_k", (), "engine.kernels.formats:quantized_for", "engine.kernels.formats",
           "engine.kernels.reference:quantize_activations_k", 0.0, 0.0,
           note="llama.cpp's Q8_K (per 256), read by the K-quants and IQ4_XS (formats.per_256); bit for bit"),
    # --- small float operations
    Kernel("rmsnorm", (), "engine.kernels.smallops:rmsnorm", "engine.kernels.rows", "engine.kernels.reference:rmsnorm",
           1e-5, 1e-6),
    Kernel("rope", (), "engine.kernels.smallops:rope", "engine.kernels.rows", "engine.kernels.reference:rope", 1e-5, 1e-6),
    Kernel("swiglu", (), "engine.kernels.smallops:swiglu", "engine.kernels.rows", "engine.kernels.reference:swiglu",
           1e-5, 1e-6),
    Kernel("attention", (), "engine.kernels.smallops:attention", "engine.kernels.float_rows",
           "engine.kernels.reference:attention", 1e-5, 1e-5, note="f32, f16 and int8 KV caches"),
    Kernel("store_f16", (), "engine.kernels.smallops:store_f16", "engine.kernels.simd", "engine.kernels.reference:store_f16",
           0.0, 0.0, note="the f16 KV cache's write, bit for bit"),
    Kernel("softmax_top_k", (), "engine.kernels.smallops:softmax_top_k", "engine.kernels.smallops",
           "engine.kernels.reference:softmax_top_k", 1e-6, 0.0, note="ids exactly (ties: the lower id)"),
)


def int_formats() -> tuple[str, ...]:
    """Formats dotted with int8 activations (the "matmul" entries that are not float)."""
    return tuple(f for k in TABLE if k.op == "matmul" and k.twin != "engine.kernels.reference:matmul"
                 for f in k.formats)


def packed_formats() -> tuple[str, ...]:
    """Formats with 8-row group kernels (repacked at load)."""
    return tuple(f for k in TABLE if k.op == "matmul" and "x8" in k.layouts for f in k.formats)


def lookup(op: str, fmt: str = "") -> Kernel:
    """The entry computing `op` on weights in format `fmt` (engine.quant name; "" for weightless ops)."""
    for k in TABLE:
        if k.op == op and (fmt in k.formats or (not fmt and not k.formats)):
            return k
    raise KeyError(f"kernel table: no entry for operation {op!r}" + (f" on {fmt} weights" if fmt else ""))


def resolve(name: str) -> Any:
    """"module:function" -> the function (importing its module, which may compile kernels)."""
    module, _, attr = name.partition(":")
    return getattr(importlib.import_module(module), attr)


def describe(fmt: str) -> str:
    """What runs for x @ W.T on `fmt` weights in this process: e.g. "blocks32 (vnni)"."""
    from engine.kernels import simd
    k = lookup("matmul", fmt)
    path = simd.DOT if k.paths != ("any",) else "float"
    return f"{k.inner.rsplit('.', 1)[-1]} ({path})"
