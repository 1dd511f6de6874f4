"""The CPU kernels in Numba, by idea: formats.py (format codes, dequantize, activation quantization,
the 8-row repacking), matmul.py (x @ W.T straight from the blocks, and the fused SwiGLU / MoE
products) and smallops.py (norm, rope, attention, SwiGLU, router top-k). This module gathers
their names, so the engine, its timing hook (engine.timing.Kernels) and the tests reach every
kernel as cpu.NAME; engine/kernels/table.py lists where each format's code lives.
"""
from __future__ import annotations

from engine.kernels.formats import (BF16, F16, F32, INT_CODES, IQ4_NL, IQ4_XS, MXFP4, PACKABLE, PACKED, Q2_K, Q3_K,
                                    Q4_0, Q4_0X8, Q4_1, Q4_1X8, Q4_K, Q4_KX8, Q5_0, Q5_1, Q5_K, Q5_KX8, Q6_K, Q6_KX8,
                                    Q8_0, Q8_0X8, dequantize_row, dequantize_x8_row, gather_rows, is_int_code,
                                    quantize_activations, quantize_block, quantized, repack_x8)
from engine.kernels.matmul import INT_MAX_T, ROWS_PER_TASK, matmul, matmul_int, moe_int, swiglu_int
from engine.kernels.simd import TOKENS
from engine.kernels.smallops import attention, rmsnorm, rope, softmax_top_k, store_f16, swiglu
from engine.kernels.tiles import TILE_CODES, TILE_MIN_T, swiglu_tiles

__all__ = ["BF16", "F16", "F32", "INT_CODES", "INT_MAX_T", "IQ4_NL", "IQ4_XS", "MXFP4", "PACKABLE", "PACKED", "Q2_K",
           "Q3_K", "Q4_0", "Q4_0X8", "Q4_1", "Q4_1X8", "Q4_K", "Q4_KX8", "Q5_0", "Q5_1", "Q5_K", "Q5_KX8", "Q6_K",
           "Q6_KX8", "Q8_0", "Q8_0X8", "ROWS_PER_TASK", "TILE_CODES", "TILE_MIN_T", "TOKENS", "attention",
           "dequantize_row", "dequantize_x8_row", "gather_rows", "is_int_code", "matmul", "matmul_int", "moe_int",
           "quantize_activations", "quantize_block", "quantized", "repack_x8", "rmsnorm", "rope", "softmax_top_k",
           "store_f16", "swiglu", "swiglu_int", "swiglu_tiles"]
