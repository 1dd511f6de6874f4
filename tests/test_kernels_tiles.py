"""Prefill tiles (engine/kernels/tiles.py): the repacked K-quant and IQ4_XS groups unpacked once
and dotted with many tokens, against the numpy twin, over several super-blocks and a tail of
tokens that re-does some (the other instruction paths: test_kernels.py's child processes)."""
from __future__ import annotations

import numpy as np
import pytest
from test_kernels import stored_matrix, twin

from engine import quant
from engine.kernels import cpu, table, tiles


@pytest.mark.parametrize("name", ["q4_k", "q5_k", "q6_k", "iq4_xs"])
def test_tiles_match_the_numpy_twin(name):
    n, rows, T = 768, 24, tiles.TILE_MIN_T + 3  # (a tail that re-does some tokens)
    w = stored_matrix(name, rows, n, seed=21)
    code = quant.get(name).type_id
    assert code in tiles.TILE_CODES
    packed = w.copy()
    cpu.repack_x8(packed, code)
    x = np.random.default_rng(22).standard_normal((T, n)).astype(np.float32)
    x[3] = 0.0  # an all-zero token: zero scales and sums
    out = np.full((T, rows), np.nan, np.float32)
    cpu.matmul(packed, code + cpu.PACKED, x, out, False)
    want, rtol, atol = twin(name, w, x)
    np.testing.assert_allclose(out, want, rtol=rtol, atol=atol * np.abs(want).max())
    assert not out[3].any()


@pytest.mark.parametrize("gate, up", [("q5_k", "q5_k"), ("q4_k", "q6_k"), ("iq4_xs", "iq4_xs")])
def test_swiglu_tiles_is_two_matmuls_and_a_swiglu(gate, up):
    """Prefill's gate, up and SwiGLU in one pass (tiles.swiglu_tiles): each product matmul's bit for bit
    (so the silu alone can differ, by rounding), against the table's numpy twin at its tolerance; rows
    not a multiple of the tile (a half-empty last tile) and a tail of tokens."""
    n, rows, T = 512, 40, tiles.TILE_MIN_T + 3
    x = np.random.default_rng(24).standard_normal((T, n)).astype(np.float32)
    ws, packed, codes = [], [], []
    for i, name in enumerate((gate, up)):
        ws.append(stored_matrix(name, rows, n, seed=25 + i))
        packed.append(ws[-1].copy())
        codes.append(quant.get(name).type_id)
        cpu.repack_x8(packed[-1], codes[-1])
    out = np.full((T, rows), np.nan, np.float32)
    cpu.swiglu_tiles(packed[0], codes[0], packed[1], codes[1], x, out)
    g, u, a = (np.empty((T, rows), np.float32) for _ in range(3))
    cpu.matmul(packed[0], codes[0] + cpu.PACKED, x, g, False)
    cpu.matmul(packed[1], codes[1] + cpu.PACKED, x, u, False)
    cpu.swiglu(g, u, a)
    np.testing.assert_allclose(out, a, rtol=1e-6, atol=1e-7 * np.abs(a).max())
    if gate == up:  # (the twin takes one format)
        k = table.lookup("swiglu_int", gate)
        want = table.resolve(k.twin)((ws[0], ws[1]), gate, x)
        np.testing.assert_allclose(out, want, rtol=k.rtol, atol=k.atol * np.abs(want).max())


def test_tile_layout_holds_the_codes_and_scales():
    """One Q4_K tile against the format definition: codes 0..15, row i's 4 weights of chunk c at
    4Rc + 4i (R = tiles.ROWS rows), the six-bit sc_j and m_j as int32, and d·sc_j · q - dmin·m_j the
    dequantized weight; a matrix of one 8-row group fills a 16-row tile's other half with zeros."""
    n, R = 512, tiles.ROWS
    code = quant.get("q4_k").type_id
    for rows in sorted({R, 8}):
        w = stored_matrix("q4_k", rows, n, seed=23)
        want = np.zeros((R, n), np.float32)
        want[:rows] = quant.dequantize(w, "q4_k").reshape(rows, n)
        packed = w.copy()
        cpu.repack_x8(packed, code)
        tq, ta, tb = np.full(R * n, 7, np.uint8), np.full(R * n // 16, 7, np.float32), np.full(R * n // 32, 7, np.float32)
        td = np.full(R * n // 128, 7, np.float32)
        tiles.unpack(packed, 0, code, tq, ta, tb, td)
        q = tq.reshape(n // 32, 8, R, 4).transpose(2, 0, 1, 3).reshape(R, n).astype(np.float32)  # (row, weight)
        assert q.max() <= 15
        d, dmin = (np.repeat(td.reshape(n // 256, 2, R)[:, k].T, 256, axis=1) for k in (0, 1))
        scale = np.repeat(ta.view(np.int32).reshape(n // 32, 2, R)[:, 0].T, 32, axis=1)  # (integers)
        minimum = np.repeat(tb.view(np.int32).reshape(n // 32, R).T, 32, axis=1)
        np.testing.assert_allclose(d * scale * q - dmin * minimum, want, rtol=1e-6, atol=1e-6 * np.abs(want).max())
        assert not q[rows:].any() and not d[rows:].any()
