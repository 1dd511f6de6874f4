"""The CUDA kernels against their numpy twins (engine/kernels/reference.py), under the simulator.

Small shapes: the simulator runs each CUDA thread as a Python thread (~0.1 s per block of 32).
"""
from __future__ import annotations

import numpy as np
import pytest
from numba import config

from engine import quant
from engine.kernels import cuda as K
from engine.kernels import reference as ref

assert config.ENABLE_CUDASIM, "run through tests/test_cuda_sim.py (NUMBA_ENABLE_CUDASIM=1)"
CODES = {"f16": 1, "q8_0": 8, "q4_0": 2, "q4_1": 3}


@pytest.fixture(scope="module")
def backend() -> K.CudaBackend:
    return K.CudaBackend()


def stored(rng, qtype: str, rows: int, n: int) -> np.ndarray:
    w = quant.get(qtype).quantize(rng.standard_normal((rows, n)).astype(np.float32))
    return np.ascontiguousarray(w).view(np.uint8).reshape(rows, -1)


@pytest.mark.parametrize("qtype", CODES)
def test_matmul_matches_reference(backend, qtype):
    rng = np.random.default_rng(CODES[qtype])
    rows, T = 6, 3 if qtype != "q4_1" else K.TT + 2  # q4_1 also crosses a token tile
    n = 48 if qtype == "f16" else 96  # f16 rows need not be whole blocks (Qwen2-MoE's shared expert)
    w, x = stored(rng, qtype, rows, n), rng.standard_normal((T, n)).astype(np.float32)
    got = backend.matmul(backend.upload(w), CODES[qtype], x)
    want = ref.matmul(w, qtype, n, x)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)


def test_rmsnorm_matches_reference(backend):
    rng = np.random.default_rng(5)
    x, weight = rng.standard_normal((3, 80)).astype(np.float32), rng.standard_normal(80).astype(np.float32)
    np.testing.assert_allclose(backend.rmsnorm(x, weight, 1e-6), ref.rmsnorm(x, weight, 1e-6), rtol=1e-5,
                               atol=1e-6)


@pytest.mark.parametrize("window", [0, 3])
def test_attention_matches_reference(backend, window):
    rng = np.random.default_rng(6 + window)
    T, H, KV, hd, pos0 = 2, 4, 2, 8, 3  # GQA: two query heads per KV head; 3 cached positions
    q = rng.standard_normal((T, H, hd)).astype(np.float32)
    k, v = (rng.standard_normal((pos0 + T, KV, hd)).astype(np.float32) for _ in range(2))
    got = backend.attention(q, k, v, pos0, window, 0.35)
    np.testing.assert_allclose(got, ref.attention(q, k, v, pos0, window, 0.35), rtol=1e-5, atol=1e-6)
