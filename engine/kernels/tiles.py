"""Prefill (many tokens) for the 8-row groups of Q4_K, Q5_K, Q6_K and IQ4_XS: each group's
weights are unpacked once into a small tile of bytes (codes) and floats (per-32 or per-16 scales
and minimums), which then serves every token with plain byte dot products and no bit unpacking.

The tiles' layout and per-format code: tile_formats.py.
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

import engine.kernels.ready  # noqa: F401  (engine.kernels.setup() first: fails otherwise)
from engine.kernels import dispatch, formats
from engine.kernels.rows import silu
from engine.kernels.simd import TOKENS
from engine.kernels.tile_formats import Q6_K, ROWS, TILE_CODES  # noqa: F401  (TILE_CODES: cpu.py reads it here)

TILE_MIN_T = 16  # fewer tokens: the group kernels (unpacking a tile costs about 4 tokens' dot products)


@njit(fastmath=True, cache=True, nogil=True)
def unpack(w, t, code, tq, ta, tb, td):
    """Rows ROWS·t.. of a repacked Q4_K/Q5_K/Q6_K/IQ4_XS matrix (code: the GGML id) -> its tile, one
    8-row group at a time (rows past the matrix's last group: zeros)."""
    if ROWS * (t + 1) > w.shape[0]:
        tq[:] = 0
        ta[:] = 0
        tb[:] = 0
        td[:] = 0
    for h in range(ROWS // 8):
        g = ROWS // 8 * t + h
        if 8 * g < w.shape[0]:
            dispatch.tile_unpack(w, g, h, code, tq, ta, tb, td)


@njit(inline="always", cache=True)
def _q6k_offsets(xq, offsets, t):
    """Token t's offsets (T, n/16) a Q6_K tile reads beside its int8 activations: -32·Σ of each 16,
    where a sub-block's sums start (its codes are q + 32). (Q4_K/Q5_K and IQ4_XS read the block sums xi.)"""
    for k in range(xq.shape[1] // 16):
        total = 0
        for i in range(16):
            total += xq[t, 16 * k + i]
        offsets[t, k] = -32 * total


@njit(inline="always", cache=True)
def _tile_buffers(n):
    """Scratch for one tile of ROWS rows of n weights (module docstring): tq, ta, tb, td."""
    return (np.empty(ROWS * n, np.uint8), np.empty(ROWS * n // 16, np.float32), np.empty(ROWS * n // 32, np.float32),
            np.empty(ROWS * n // 128, np.float32))


@njit(fastmath=True, cache=True, nogil=True)
def quantized_tokens(x, c1, c2):
    """Scratch for x (T, n)'s int8 activations and the sums tiles of formats c1 and c2 read: xq, xd, xs,
    xi, offsets (Q6_K's (T, n/16); else (T, 1)), filled by _quantize_token."""
    T, n = x.shape
    return (np.empty((T, n), np.int8), np.empty((T, n // 32), np.float32), np.empty((T, n // 32), np.float32),
            np.empty((T, n // 32), np.int32), np.empty((T, n // 16 if c1 == Q6_K or c2 == Q6_K else 1), np.int32))


@njit(inline="always", cache=True)
def _quantize_token(x, c1, c2, xq, xd, xs, xi, offsets, t):
    """Token t of x into int8, per 256 as every TILE_CODES format reads it (formats.per_256: the bits of
    matmul's quantization), then Q6_K's offsets where c1 or c2 is Q6_K."""
    for s in range(x.shape[1] // 256):
        formats.quantize_k_block(x[t], xq[t], xd[t], xs[t], xi[t], s)
    if c1 == Q6_K or c2 == Q6_K:
        _q6k_offsets(xq, offsets, t)


@njit(parallel=True, fastmath=True, cache=True, nogil=True)
def matmul_tiles(w, code, x, out):
    """out (T, rows) = x (T, n) float32 (T >= TOKENS) @ W.T for a matrix repacked in TILE_CODES (code: the
    GGML id), in two parallel loops: x quantized with its sums (per token), then ROWS rows at a time:
    their tile (about 1.4 bytes per weight: 22 KB for 16 rows of n = 1024, L1/L2 resident) is unpacked
    once and dotted with every token."""
    rows, T, n = w.shape[0], x.shape[0], x.shape[1]
    xq, xd, xs, xi, offsets = quantized_tokens(x, code, code)
    for t in prange(T):
        _quantize_token(x, code, code, xq, xd, xs, xi, offsets, t)
    for tile in prange((rows + ROWS - 1) // ROWS):
        tq, ta, tb, td = _tile_buffers(n)
        res = np.empty(TOKENS * ROWS, np.float32)
        unpack(w, tile, code, tq, ta, tb, td)
        r0 = ROWS * tile
        m = min(ROWS, rows - r0)
        t = 0
        while t < T:
            t0 = min(t, T - TOKENS)  # a short tail re-does some tokens: same values
            dispatch.tile_dot(code, tq, ta, tb, td, xq, xd, xs, offsets, xi, t0, res)
            for k in range(TOKENS):
                for i in range(m):
                    out[t0 + k, r0 + i] = res[ROWS * k + i]
            t = t0 + TOKENS


@njit(parallel=True, fastmath=True, cache=True, nogil=True)
def swiglu_tiles(wg, cg, wu, cu, x, out):
    """out (T, rows) = silu(x @ Wg.T) · (x @ Wu.T), x (T, n) float32 with T >= TOKENS, for gate and up
    matrices repacked in TILE_CODES (cg, cu: GGML ids): a prompt's SwiGLU first half in two parallel
    loops (x quantized with its sums, then ROWS rows of both matrices: the gate tile dotted with every
    token, then the up tile) instead of two matmuls and a swiglu pass over their (T, rows) outputs.
    Each product is matmul_tiles' bit for bit; silu as swiglu_int's (rows.silu)."""
    rows, T, n = wg.shape[0], x.shape[0], x.shape[1]
    xq, xd, xs, xi, offsets = quantized_tokens(x, cg, cu)
    for t in prange(T):
        _quantize_token(x, cg, cu, xq, xd, xs, xi, offsets, t)
    for tile in prange((rows + ROWS - 1) // ROWS):
        tq, ta, tb, td = _tile_buffers(n)
        res = np.empty(TOKENS * ROWS, np.float32)
        gates = np.empty(T * ROWS, np.float32)  # the tile's gate products of every token, token by token
        r0 = ROWS * tile
        m = min(ROWS, rows - r0)
        for half in range(2):  # the gate tile, then the up tile: one at a time stays in L1 (22 KB each)
            unpack(wg if half == 0 else wu, tile, cg if half == 0 else cu, tq, ta, tb, td)
            t = 0
            while t < T:
                t0 = min(t, T - TOKENS)  # a short tail re-does some tokens: same values
                dispatch.tile_dot(cg if half == 0 else cu, tq, ta, tb, td, xq, xd, xs, offsets, xi, t0, res)
                if half == 0:
                    gates[ROWS * t0:ROWS * (t0 + TOKENS)] = res
                else:
                    for j in range(TOKENS * ROWS):  # one vector loop: silu's exp32 vectorises
                        res[j] = silu(gates[ROWS * t0 + j]) * res[j]
                    for k in range(TOKENS):
                        for i in range(m):
                            out[t0 + k, r0 + i] = res[ROWS * k + i]
                t = t0 + TOKENS
