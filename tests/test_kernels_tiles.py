"""Prefill tiles (engine/kernels/tiles.py): the repacked K-quant and IQ4_XS groups unpacked once
and dotted with many tokens, against the numpy twin, over several super-blocks and a tail of
tokens that re-does some (the other instruction paths: test_kernels.py's child processes)."""
from __future__ import annotations

import numpy as np
import pytest
from test_kernels import stored_matrix, twin

from engine import quant
from engine.kernels import cpu, tiles


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
    cpu.matmul(packed, code + cpu.PACKED, x, out)
    want, rtol, atol = twin(name, w, x)
    np.testing.assert_allclose(out, want, rtol=rtol, atol=atol * np.abs(want).max())
    assert not out[3].any()


def test_tile_layout_holds_the_codes_and_scales():
    """One Q4_K group's tile against the format definition: codes 0..15, row i's 4 weights of chunk c
    at 32c + 4i, and d·sc_j · q - dmin·m_j the dequantized weight."""
    n = 512
    w = stored_matrix("q4_k", 8, n, seed=23)
    want = quant.dequantize(w, "q4_k").reshape(8, n)
    packed = w.copy()
    cpu.repack_x8(packed, quant.get("q4_k").type_id)
    tq, ta, tb = np.empty(8 * n, np.uint8), np.empty(n // 2, np.float32), np.empty(n // 4, np.float32)
    td = np.empty(n // 16, np.float32)
    tiles.unpack(packed, 0, quant.get("q4_k").type_id, tq, ta, tb, td)
    q = tq.reshape(n // 32, 8, 8, 4).transpose(2, 0, 1, 3).reshape(8, n).astype(np.float32)  # (row, weight)
    assert q.max() <= 15
    d, dmin = (np.repeat(td.reshape(n // 256, 2, 8)[:, k].T, 256, axis=1) for k in (0, 1))
    scale = np.repeat(ta.reshape(n // 32, 16)[:, :8].T, 32, axis=1)
    minimum = np.repeat(tb.reshape(n // 32, 8).T, 32, axis=1)
    np.testing.assert_allclose(d * scale * q - dmin * minimum, want, rtol=1e-6, atol=1e-6 * np.abs(want).max())
