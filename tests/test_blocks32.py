"""The fused 32-weight block kernels (engine/kernels/blocks32.py) against their numpy twin, on
every instruction path."""
from __future__ import annotations

import numpy as np
import pytest
from test_quant import random_blocks

from engine import quant
from engine.kernels import blocks32, cpu
from engine.kernels import reference as ref

FORMATS = list(blocks32.FORMATS)


def check_fused(name: str, rows: int, n: int, tokens: int, seed: int, packed: bool = False) -> None:
    """Stored rows, or (`packed`) the same matrix repacked in 8-row groups (rows a multiple of 8)."""
    w = random_blocks(name, rows, n // quant.get(name).block_size, seed)
    x = np.random.default_rng(seed + 1).standard_normal((tokens, n)).astype(np.float32)
    want = blocks32.matmul_reference(w, name, x)
    code = quant.get(name).type_id
    if packed:
        cpu.repack_x8(w, code)
        code += cpu.PACKED
    out = np.empty((tokens, rows), np.float32)
    cpu.matmul(w, code, x, out, False)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


@pytest.mark.parametrize("name", FORMATS)
@pytest.mark.parametrize("tokens", [1, 2, cpu.TOKENS + 3])  # decode, decode of a few, prefill with a tail
def test_fused_kernels_match_the_numpy_twin(name, tokens):
    check_fused(name, 37, 256 * 3 if name == "iq4_xs" else 32 * 11, tokens, seed=tokens)  # an odd block count: the tail


@pytest.mark.parametrize("name", FORMATS)
@pytest.mark.parametrize("tokens", [1, cpu.TOKENS + 3])
def test_fused_group_kernels_match_the_numpy_twin(name, tokens):
    """8-row groups (cpu.repack_x8 -> blocks32.repack32): decode and prefill with a tail."""
    check_fused(name, 24, 256 * 2 if name == "iq4_xs" else 32 * 5, tokens, seed=10 + tokens, packed=True)


@pytest.mark.parametrize("name", FORMATS)
def test_repacked_rows_dequantize_as_stored(name):
    """The embedding lookup and the float path of a repacked matrix read its rows back exactly."""
    n = 3 * quant.get(name).block_size
    w = random_blocks(name, 16, 3, seed=7)
    code = quant.get(name).type_id
    want = np.empty((16, n), np.float32)
    for r in range(16):
        cpu.dequantize_row(w[r], code, want[r])
    cpu.repack_x8(w, code)
    got = np.empty((4, n), np.float32)
    cpu.gather_rows(w, code + cpu.PACKED, np.array([0, 5, 9, 15]), got)
    np.testing.assert_array_equal(got, want[[0, 5, 9, 15]])


@pytest.mark.parametrize("name", FORMATS)
def test_twin_is_the_dequantized_product_up_to_activation_rounding(name):
    """The twin itself against the float definition (engine.quant): int8 activations cost well
    under 1% of the largest output, and exact integer sums nothing more."""
    w = random_blocks(name, 24, 256 // quant.get(name).block_size, seed=3)
    x = np.random.default_rng(4).standard_normal((3, 256)).astype(np.float32)
    want = ref.matmul(w, name, 256, x)
    got = blocks32.matmul_reference(w, name, x)
    assert np.abs(got - want).max() / np.abs(want).max() < 1e-2
    exact = np.empty_like(got)  # int8_activations off: the float path
    cpu.matmul(w, quant.get(name).type_id, x, exact, True)
    np.testing.assert_allclose(exact, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())

# The instruction paths this host does not pick by itself (avx2, generic) run check_fused in
# test_kernels.py's subprocess (test_every_dot_product_path_computes_the_same_products).
