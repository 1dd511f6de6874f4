"""Each Numba kernel against its numpy twin, on small shapes, for every stored format."""
from __future__ import annotations

import numpy as np
import pytest
from test_quant import random_blocks

from engine import quant
from engine.kernels import cpu
from engine.kernels import reference as ref

FORMATS = ["f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q4_k", "q5_k", "q6_k"]


def stored_matrix(name: str, rows: int, n: int, seed: int) -> np.ndarray:
    t = quant.get(name)
    if t.quantize is None:  # K-quants: random valid blocks
        return random_blocks(name, rows, n // t.block_size, seed)
    x = np.random.default_rng(seed).standard_normal((rows, n)).astype(np.float32)
    return quant.quantize(x, name).view(np.uint8).reshape(rows, -1)


@pytest.mark.parametrize("name", FORMATS)
@pytest.mark.parametrize("tokens", [1, 5])
def test_matmul_matches_numpy(name, tokens):
    n, rows = 512, 37  # rows not a multiple of the kernel's task size
    w = stored_matrix(name, rows, n, seed=tokens)
    x = np.random.default_rng(9).standard_normal((tokens, n)).astype(np.float32)
    out = np.empty((tokens, rows), np.float32)
    cpu.matmul(w, quant.get(name).type_id, x, out)
    want = ref.matmul(w, name, n, x)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


@pytest.mark.parametrize("name", FORMATS)
def test_dequantize_row_matches_the_format_definition(name):
    n = 512
    w = stored_matrix(name, 3, n, seed=4)
    t = quant.get(name)
    want = quant.dequantize(w if t.is_block else w.view(t.storage).reshape(3, -1), t)
    got = np.empty(n, np.float32)
    for r in range(3):
        cpu.dequantize_row(w[r], t.type_id, got)
        np.testing.assert_allclose(got, want[r], rtol=1e-6, atol=1e-7)


def test_gather_rows_is_an_embedding_lookup():
    w = stored_matrix("q8_0", 50, 64, seed=1)
    ids = np.array([3, 0, 49, 3], np.int64)
    out = np.empty((4, 64), np.float32)
    cpu.gather_rows(w, quant.get("q8_0").type_id, ids, out)
    np.testing.assert_allclose(out, quant.dequantize(w, "q8_0")[ids], rtol=1e-6)


def test_half_decoding_covers_subnormals_and_specials():
    vals = np.array([0.0, -0.0, 1.0, -2.5, 65504.0, 6e-8, -3e-5, np.inf, -np.inf], np.float16)
    raw = vals.view(np.uint8).reshape(1, -1)
    out = np.empty(vals.size, np.float32)
    cpu.dequantize_row(raw[0], quant.get("f16").type_id, out)
    np.testing.assert_array_equal(out, vals.astype(np.float32))
    nan = np.array([np.nan], np.float16).view(np.uint8)
    cpu.dequantize_row(nan, quant.get("f16").type_id, out[:1])
    assert np.isnan(out[0])


def test_rmsnorm_rope_swiglu():
    rng = np.random.default_rng(2)
    x, w = rng.standard_normal((4, 48)).astype(np.float32), rng.standard_normal(48).astype(np.float32)
    out = np.empty_like(x)
    cpu.rmsnorm(x, w, np.float32(1e-5), out)
    np.testing.assert_allclose(out, ref.rmsnorm(x, w, 1e-5), rtol=1e-5, atol=1e-6)
    q = rng.standard_normal((3, 2, 16)).astype(np.float32)
    ang = rng.uniform(0, 6, (3, 8)).astype(np.float32)
    cos, sin = np.cos(ang), np.sin(ang)
    want = ref.rope(q, cos, sin)
    cpu.rope(q, cos, sin)
    np.testing.assert_allclose(q, want, rtol=1e-5, atol=1e-6)
    g, u = rng.standard_normal((2, 40)).astype(np.float32), rng.standard_normal((2, 40)).astype(np.float32)
    o = np.empty_like(g)
    cpu.swiglu(g, u, o)
    np.testing.assert_allclose(o, ref.swiglu(g, u), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("pos0,tokens,window", [(0, 6, 0), (5, 1, 0), (3, 4, 3)])
def test_attention_causal_gqa_and_window(pos0, tokens, window):
    rng = np.random.default_rng(pos0 + tokens)
    H, KV, hd = 6, 2, 16
    q = rng.standard_normal((tokens, H, hd)).astype(np.float32)
    k = rng.standard_normal((pos0 + tokens, KV, hd)).astype(np.float32)
    v = rng.standard_normal((pos0 + tokens, KV, hd)).astype(np.float32)
    out = np.empty_like(q)
    scores = np.empty((tokens * H, pos0 + tokens), np.float32)
    cpu.attention(q, k, v, pos0, window, np.float32(0.25), scores, out)
    np.testing.assert_allclose(out, ref.attention(q, k, v, pos0, window, 0.25), rtol=1e-5, atol=1e-5)


def test_simd_setting_reaches_numba_before_it_compiles():
    import numba

    import engine.kernels as k
    from engine import params
    p = params.PARAMS["simd"]
    assert p.choices == k.SIMD_CHOICES and not p.live
    assert k.SIMD in ("avx2", "avx512", "native", "custom")
    assert k._apply_simd("avx512") in ("avx512", "custom")
    if k.SIMD == "avx2":  # the host has AVX-512 and it is switched off for every kernel
        assert "-avx512f" in numba.config.CPU_FEATURES and "+avx512f" not in numba.config.CPU_FEATURES


@pytest.mark.parametrize("name", ["q4_0", "q4_1", "q8_0"])
def test_direct_and_dequantized_paths_agree(name):
    """Decode (<= DIRECT_MAX_T tokens, dotted from the blocks) equals prefill (dequantized rows)."""
    n, rows = 256, 64
    w = stored_matrix(name, rows, n, seed=3)
    x = np.random.default_rng(5).standard_normal((cpu.DIRECT_MAX_T + 1, n)).astype(np.float32)
    many = np.empty((x.shape[0], rows), np.float32)
    cpu.matmul(w, quant.get(name).type_id, x, many)
    one = np.empty((1, rows), np.float32)
    cpu.matmul(w, quant.get(name).type_id, x[:1], one)
    np.testing.assert_allclose(one[0], many[0], rtol=1e-5, atol=1e-5 * np.abs(many).max())
