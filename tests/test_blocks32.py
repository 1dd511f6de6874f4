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


def check_fused(name: str, rows: int, n: int, tokens: int, seed: int) -> None:
    w = random_blocks(name, rows, n // 32, seed)
    x = np.random.default_rng(seed + 1).standard_normal((tokens, n)).astype(np.float32)
    out = np.empty((tokens, rows), np.float32)
    cpu.matmul(w, quant.get(name).type_id, x, out)
    want = blocks32.matmul_reference(w, name, x)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


@pytest.mark.parametrize("name", FORMATS)
@pytest.mark.parametrize("tokens", [1, 2, cpu.TOKENS + 3])  # decode, decode of a few, prefill with a tail
def test_fused_kernels_match_the_numpy_twin(name, tokens):
    check_fused(name, 37, 32 * 11, tokens, seed=tokens)  # an odd block count: the decode loop's tail


@pytest.mark.parametrize("name", FORMATS)
def test_twin_is_the_dequantized_product_up_to_activation_rounding(name):
    """The twin itself against the float definition (engine.quant): int8 activations cost well
    under 1% of the largest output, and exact integer sums nothing more."""
    w = random_blocks(name, 24, 8, seed=3)
    x = np.random.default_rng(4).standard_normal((3, 256)).astype(np.float32)
    want = ref.matmul(w, name, 256, x)
    got = blocks32.matmul_reference(w, name, x)
    assert np.abs(got - want).max() / np.abs(want).max() < 1e-2
    exact = np.empty_like(got)  # int8_activations off: the float path
    cpu.matmul(w, quant.get(name).type_id, x, exact, True)
    np.testing.assert_allclose(exact, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())

# The instruction paths this host does not pick by itself (avx2, generic) run check_fused in
# test_kernels.py's subprocess (test_every_dot_product_path_computes_the_same_products).
