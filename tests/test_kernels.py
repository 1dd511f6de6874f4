"""Each Numba kernel against its numpy twin, on small shapes, for every stored format."""
from __future__ import annotations

import numpy as np
import pytest
from test_quant import random_blocks

from engine import quant
from engine.kernels import cpu, table, tiles
from engine.kernels import reference as ref

# What is tested comes from the kernel table (engine/kernels/table.py): its formats, twins and tolerances.
FORMATS = list(table.ALL)
INT_FORMATS = list(table.int_formats())  # decoded with int8 activations (llama.cpp's scheme)
PACK_FORMATS = list(table.packed_formats())  # repacked into 8-row groups when resident


def twin(name: str, w: np.ndarray, x: np.ndarray, op: str = "matmul") -> tuple[np.ndarray, float, float]:
    """The table's numpy twin of `op` on `name` weights, with the (rtol, atol) it is held to."""
    k = table.lookup(op, name)
    fn = table.resolve(k.twin)
    want = fn(w, name, x.shape[1], x) if k.twin == "engine.kernels.reference:matmul" else fn(w, name, x)
    return want, k.rtol, k.atol


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
    cpu.matmul(w, quant.get(name).type_id, x, out, False)
    want, rtol, atol = twin(name, w, x)
    np.testing.assert_allclose(out, want, rtol=rtol, atol=atol * np.abs(want).max())
    exact = np.empty_like(out)  # int8_activations off: float activations, the float reference
    cpu.matmul(w, quant.get(name).type_id, x, exact, True)
    want, rtol, atol = twin(name, w, x, "matmul_exact")
    np.testing.assert_allclose(exact, want, rtol=rtol, atol=atol * np.abs(want).max())


def test_activation_quantization_is_the_numpy_twin_bit_for_bit():
    rng = np.random.default_rng(11)
    x = rng.standard_normal((3, 128)).astype(np.float32) * np.float32(3)
    x[1, :32] = 0  # an all-zero block: scale 0, quants 0
    x[2, 32:64] = np.arange(32) - np.float32(15.5)  # ties: 127/16.5-scaled halves round to even
    x[2, 64:96] = np.linspace(-1e-30, 1e-30, 32, dtype=np.float32)  # a scale below the half's range
    T, n = x.shape
    xq, xd = np.empty((T, n), np.int8), np.empty((T, n // 32), np.float32)
    xs, xi = np.empty_like(xd), np.empty((T, n // 32), np.int32)
    cpu.quantize_activations(x, xq, xd, xs, xi)
    for got, want in zip((xq, xd, xs, xi), ref.quantize_activations(x)):
        np.testing.assert_array_equal(got, want)
    assert np.abs(xq).max() == 127 and not xq[1, :32].any()


def test_per_256_activation_quantization_is_llama_cpps_q8_k_and_its_twin_bit_for_bit():
    """The activations K-quant and IQ4_XS rows read (formats.per_256): one scale per 256 as llama.cpp's
    quantize_row_q8_K, d = max / -127 with max the value of largest magnitude, which becomes -127."""
    from engine.kernels.formats import Q4_K, Q4_0, quantized_for
    rng = np.random.default_rng(12)
    x = rng.standard_normal((3, 512)).astype(np.float32)
    x[0, 7] = np.float32(9.0)  # a positive maximum: its quant is -127 and d negative
    x[1, 256:] = 0  # an all-zero super-block: scale 0, quants 0
    x[2, 3], x[2, 100] = np.float32(-5.0), np.float32(5.0)  # a tie in |x|: the first is the maximum, -127
    got = quantized_for(x, Q4_K)
    for g, want in zip(got, ref.quantize_activations_k(x)):
        np.testing.assert_array_equal(g, want)
    xq, xd, xs, xi = got
    assert xq[0, 7] == -127 and xd[0, 0] == np.float32(1) / (np.float32(-127) / np.float32(9))
    assert xq[2, 3] == -127 and xq[2, 100] == 127 and (xd[2, :8] > 0).all()  # (d·q = x, and capped at 127)
    assert not xq[1, 256:].any() and not xd[1, 8:].any()
    assert (xd[:, :8] == xd[:, :1]).all()  # one scale for the 8 blocks of 32 of a super-block
    np.testing.assert_array_equal(xi, xq.reshape(3, 16, 32).sum(-1, dtype=np.int32))
    np.testing.assert_allclose(xq * np.repeat(xd, 32, axis=1), x, atol=float(np.abs(x).max()) / 254 * 1.0001)
    for g, want in zip(quantized_for(x, Q4_0), ref.quantize_activations(x)):  # per 32 for the others
        np.testing.assert_array_equal(g, want)


@pytest.mark.parametrize("name", INT_FORMATS)
def test_integer_path_stays_within_the_activation_quantization_budget(name):
    """Decode (int8 activations) against the float product of the same stored weights: the
    int8 rounding of x costs well under 1% of the largest output (2% for the formats that read
    one activation scale per 256, as llama.cpp's Q8_K: measured 1.1% for IQ4_XS)."""
    from engine.kernels.formats import per_256
    n, rows = 1024, 96
    w = stored_matrix(name, rows, n, seed=21)
    x = np.random.default_rng(22).standard_normal((2, n)).astype(np.float32)
    out = np.empty((2, rows), np.float32)
    cpu.matmul(w, quant.get(name).type_id, x, out, False)
    want = ref.matmul(w, name, n, x)
    assert np.abs(out - want).max() / np.abs(want).max() < (2e-2 if per_256(quant.get(name).type_id) else 1e-2)


def test_fused_integer_kernels_match_numpy():
    """q/k/v in one call (matrices of different formats and heights) and SwiGLU's gate+up."""
    n, T = 256, 2
    ws = [stored_matrix(f, rows, n, seed=i) for i, (f, rows) in enumerate([("q4_1", 40), ("q8_0", 17), ("q4_0", 33)])]
    codes = tuple(quant.get(f).type_id for f in ("q4_1", "q8_0", "q4_0"))
    x = np.random.default_rng(3).standard_normal((T, n)).astype(np.float32)
    outs = tuple(np.empty((T, w.shape[0]), np.float32) for w in ws)
    cpu.matmul_int(tuple(ws), codes, x, outs)
    for out, w, f in zip(outs, ws, ("q4_1", "q8_0", "q4_0")):
        want = ref.matmul_int(w, f, x)
        np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    g, u = stored_matrix("q4_1", 50, n, seed=7), stored_matrix("q8_0", 50, n, seed=8)
    out = np.empty((T, 50), np.float32)
    cpu.swiglu_int(g, codes[0], u, codes[1], x, out)
    want = ref.swiglu(ref.matmul_int(g, "q4_1", x).astype(np.float64), ref.matmul_int(u, "q8_0", x))
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-5 * np.abs(want).max())


@pytest.mark.parametrize("packed", [False, True])
def test_one_input_read_per_32_and_per_256_by_its_matrices(packed):
    """Matrices that share an input but read it quantized differently (a Q4_K q beside a Q8_0 v, a Q6_K
    gate beside a Q5_0 up: formats.per_256): each gets its own quantization, its twin's products."""
    from engine.kernels.formats import PACKED
    n, T = 512, 2
    fmts = ("q4_k", "q8_0", "q6_k", "q5_0")
    ws = [stored_matrix(f, 16, n, seed=i) for i, f in enumerate(fmts)]
    codes = [quant.get(f).type_id for f in fmts]
    if packed:  # repacked at load, as resident matrices are
        ws = [w.copy() for w in ws]
        for w, c in zip(ws, codes):
            cpu.repack_x8(w, c)
        codes = [PACKED + c for c in codes]
    x = np.random.default_rng(5).standard_normal((T, n)).astype(np.float32)
    want = [twin(f, w0, x)[0] for f, w0 in zip(fmts, (stored_matrix(f, 16, n, seed=i) for i, f in enumerate(fmts)))]
    outs = tuple(np.empty((T, 16), np.float32) for _ in ws)
    cpu.matmul_int(tuple(ws[:2]), (codes[0], codes[1]), x, outs[:2])
    cpu.matmul_int(tuple(ws[2:]), (codes[2], codes[3]), x, outs[2:])
    for out, w in zip(outs, want):
        np.testing.assert_allclose(out, w, rtol=1e-5, atol=1e-5 * np.abs(w).max())
    out = np.empty((T, 16), np.float32)
    cpu.swiglu_int(ws[2], codes[2], ws[3], codes[3], x, out)
    np.testing.assert_allclose(out, ref.swiglu(want[2].astype(np.float64), want[3]), rtol=1e-4,
                               atol=1e-5 * np.abs(out).max())


DOT_CHECK = """
import sys, numpy as np
import engine.kernels
engine.kernels.setup()
sys.path.insert(0, "tests")
from test_kernels import stored_matrix
from engine import quant
from engine.kernels import cpu, simd
from engine.kernels import reference as ref
from engine.kernels import tiles
assert simd.DOT == sys.argv[1], simd.DOT
assert tiles.ROWS == 8 and not simd.WIDE, tiles.ROWS  # (every forced path is 256 bits wide)
for name in ("q4_0", "q4_1", "q8_0", "q2_k", "q3_k", "q4_k", "q5_k", "q6_k"):
    n = 512 if name.endswith("_k") else 128  # (K-quants: stored rows and groups, decode and prefill tiles)
    w = stored_matrix(name, 19, n, seed=2)
    x = np.random.default_rng(4).standard_normal((1, n)).astype(np.float32)
    out = np.empty((1, 19), np.float32)
    cpu.matmul(w, quant.get(name).type_id, x, out, False)
    want = ref.matmul_int(w, name, x)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    if quant.get(name).type_id in cpu.PACKABLE:
        w8 = stored_matrix(name, 16, n, seed=3)
        many = np.random.default_rng(5).standard_normal((cpu.TOKENS + 1, n)).astype(np.float32)
        cases = (x, many) if name.endswith("_k") else (x,)
        wants = [ref.matmul_int(w8, name, xs) for xs in cases]
        cpu.repack_x8(w8, quant.get(name).type_id)
        for xs, want in zip(cases, wants):
            out = np.empty((xs.shape[0], 16), np.float32)
            cpu.matmul(w8, quant.get(name).type_id + cpu.PACKED, xs, out, False)
            np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
from test_kernels import check_rows_alone  # rows of a multi-row matmul: each row's own, bit for bit
for name in ("q4_0", "q4_1", "q8_0", "q5_1", "iq4_xs", "q3_k", "q4_k", "q5_k", "q6_k"):
    check_rows_alone(name)
from test_blocks32 import FORMATS, check_fused  # q5_0, q5_1, iq4_nl, mxfp4 (engine/kernels/blocks32.py)
for name in FORMATS:
    for tokens in (1, 6):
        n = 768 if name == "iq4_xs" else 160
        check_fused(name, 19, n, tokens, seed=5)
        check_fused(name, 16, n, tokens, seed=6, packed=True)  # 8-row groups (avx2: vpsignb for the grids)
print("ok")
"""


@pytest.mark.parametrize("path", ["avx2", "generic", "vnni-256"])
def test_every_dot_product_path_computes_the_same_products(path, tmp_path):
    """The instruction paths this host does not pick by itself (simd.py), forced one at a time in
    a fresh process (numba compiles for one path per process). vnni-256: vnni with AVX-512 off
    (COLIBRI_SIMD=avx2, Intel's default; AVX-VNNI laptops), so 8-row tiles (tiles.ROWS) on a host
    whose own vnni path is 512 bits wide."""
    import os
    import subprocess
    import sys

    from engine.kernels import simd
    if path == "avx2" and not simd._features().get("avx2"):
        pytest.skip("this CPU has no AVX2")
    if path == simd.DOT:
        pytest.skip("the natural path here: the other tests cover it")
    if path == "vnni-256" and not (simd.WIDE and simd._features().get("avxvnni")):
        pytest.skip("the natural vnni path here is 256 bits wide (or this CPU has no AVX-VNNI): the other tests cover it")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    dot = path.split("-")[0]
    env = dict(os.environ, COLIBRI_DOT=dot, PYTHONPATH=root)
    if path == "vnni-256":
        env.update(COLIBRI_SIMD="avx2")
        env.pop("NUMBA_CPU_NAME", None), env.pop("NUMBA_CPU_FEATURES", None)
    r = subprocess.run([sys.executable, "-c", DOT_CHECK, dot, path], cwd=root, env=env, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-2000:]


@pytest.mark.parametrize("name", FORMATS)
def test_dequantize_row_matches_the_format_definition(name):
    n = 512
    w = stored_matrix(name, 3, n, seed=4)
    t = quant.get(name)
    want = quant.dequantize(w if t.is_block else w.view(t.storage).reshape(3, -1), t)
    got = np.empty(n, np.float32)
    for r in range(3):
        cpu.dequantize_row(w[r], t.type_id, got)
        assert np.array_equal(got.view(np.uint32), want[r].view(np.uint32)), name  # bit for bit


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
    one = np.ones((1, 1), np.float32)
    cpu.attention(q, k, v, one, one, False, pos0, window, np.float32(0.25), scores, out)
    np.testing.assert_allclose(out, ref.attention(q, k, v, pos0, window, 0.25), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", ["f16", "int8"])
def test_attention_reads_the_stored_cache(kind):
    """Keys and values as the f16 and int8 caches store them, widened inside the kernel."""
    from engine.kvcache import KVCache
    rng = np.random.default_rng(8)
    H, KV, hd, S = 4, 2, 16, 9
    cache = KVCache(1, 16, KV, hd, kind)
    k = rng.standard_normal((S, KV, hd)).astype(np.float32)
    v = rng.standard_normal((S, KV, hd)).astype(np.float32)
    cache.write(0, 0, k, v)
    keys, values, ks, vs, scaled = cache.views(0, S)
    if kind == "f16":
        kw, vw = keys.view(np.float16).astype(np.float32), values.view(np.float16).astype(np.float32)
    else:
        kw, vw = keys * ks[..., None], values * vs[..., None]
    assert np.abs(kw - k).max() < (2e-3 if kind == "f16" else 2e-2)
    q = rng.standard_normal((1, H, hd)).astype(np.float32)
    out = np.empty_like(q)
    cpu.attention(q, keys, values, ks, vs, scaled, S - 1, 0, np.float32(0.25), np.empty((H, S), np.float32), out)
    np.testing.assert_allclose(out, ref.attention(q, kw, vw, S - 1, 0, 0.25), rtol=1e-5, atol=1e-5)


def _attention_head_by_head(q, k, v, ks, vs, scaled, pos0, window, scale, scores, out):
    """cpu.attention as it was before query heads were taken HEADS at a time: one head per
    rows.attend call, in a kernel with cpu.attention's flags."""
    from numba import njit, prange

    from engine.kernels.rows import attend

    @njit(parallel=True, fastmath=True)
    def run(q, k, v, ks, vs, scaled, pos0, window, scale, scores, out):
        T, H = q.shape[0], q.shape[1]
        group = H // k.shape[1]
        for th in prange(T * H):
            t, h = th // H, th % H
            last = pos0 + t
            first = max(0, last - window + 1) if window > 0 else 0
            attend(q[t, h], k, v, ks, vs, scaled, h // group, first, last, scale, scores[th], out[t, h])
    run(q, k, v, ks, vs, scaled, pos0, window, scale, scores, out)


@pytest.mark.parametrize("kind,hd,window", [("f32", 64, 0), ("f16", 40, 0), ("int8", 72, 5), ("f32", 17, 3)])
def test_attention_heads_together_are_each_heads_own(kind, hd, window):
    """Query heads taken 4 at a time (float_rows.dot_rows_heads / add_weighted_rows_heads: each
    key and value row widened once for them) give each head exactly its one-head figures, so
    prefill, layered decode and the fused decode kernel (rows.attend) still agree bit for bit."""
    rng = np.random.default_rng(hd)
    T, H, KV, S = 3, 8, 2, 37
    q = rng.standard_normal((T, H, hd)).astype(np.float32)
    k = rng.standard_normal((S, KV, hd)).astype(np.float32)
    v = rng.standard_normal((S, KV, hd)).astype(np.float32)
    ks = vs = np.ones((S, KV), np.float32)
    scaled = kind == "int8"
    if kind == "f16":
        k, v = k.astype(np.float16).view(np.uint16), v.astype(np.float16).view(np.uint16)
    elif scaled:
        ks, vs = ((np.abs(a).max(axis=-1) / 127).astype(np.float32) for a in (k, v))
        k, v = (np.round(a / s[..., None]).astype(np.int8) for a, s in ((k, ks), (v, vs)))
    outs = []
    for fn in (cpu.attention, _attention_head_by_head):
        out = np.empty_like(q)
        fn(q, k, v, ks, vs, scaled, S - T, window, np.float32(0.2), np.empty((T * H, S), np.float32), out)
        outs.append(out)
    np.testing.assert_array_equal(outs[0], outs[1])


@pytest.mark.parametrize("hd", [8, 17, 40, 96, 136])
def test_attention_head_sizes_past_the_vector_widths(hd):
    """Head sizes that leave every part of simd.dot_rows / add_weighted_rows a share: 64-wide
    column blocks, 16-wide ones and single columns (the usual 64 and 128 take only the first)."""
    rng = np.random.default_rng(hd)
    H, KV, S = 4, 2, 37
    q = rng.standard_normal((2, H, hd)).astype(np.float32)
    k = rng.standard_normal((S, KV, hd)).astype(np.float32)
    v = rng.standard_normal((S, KV, hd)).astype(np.float32)
    out = np.empty_like(q)
    one = np.ones((1, 1), np.float32)
    cpu.attention(q, k, v, one, one, False, S - 2, 0, np.float32(0.3), np.empty((2 * H, S), np.float32), out)
    np.testing.assert_allclose(out, ref.attention(q, k, v, S - 2, 0, 0.3), rtol=1e-5, atol=1e-5)


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


@pytest.mark.parametrize("name", INT_FORMATS)
def test_decode_and_prefill_paths_agree(name):
    """A token's products are the same bits whether it comes alone (decode: a row or an 8-row group
    at a time) or among many (prefill: TOKENS tokens per loaded block or tile, and a tail), rows as
    stored and repacked: so a batch of rows in one matmul is each row's own matmul (engine/batch.py)."""
    check_rows_alone(name)


def check_rows_alone(name: str) -> None:
    """Each row of a multi-row matmul equals that row's one-row matmul bit for bit (both layouts)."""
    from engine.kernels import tiles
    n, rows = (512 if quant.get(name).block_size == 256 else 480), 64  # (480: an odd count of blocks, the tail)
    code = quant.get(name).type_id
    for T, packed in [(2 * cpu.TOKENS + 1, False)] + [(T, True) for T in (2 * cpu.TOKENS + 1, tiles.TILE_MIN_T + 1)
                                                       if code in cpu.PACKABLE]:  # (a few tokens, and tiles)
        x = np.random.default_rng(5).standard_normal((T, n)).astype(np.float32)
        w = stored_matrix(name, rows, n, seed=3)
        if packed:
            cpu.repack_x8(w, code)
        c = code + cpu.PACKED * packed
        many = np.empty((x.shape[0], rows), np.float32)
        cpu.matmul(w, c, x, many, False)
        for t in range(x.shape[0]):
            one = np.empty((1, rows), np.float32)
            cpu.matmul(w, c, x[t:t + 1], one, False)
            np.testing.assert_array_equal(one[0], many[t], err_msg=f"{name} packed={packed} token {t} of {T}")


def check_repacked(name: str, rows: int, n: int):
    """A stored matrix repacked in 8-row groups (cpu.repack_x8): its rows dequantize as the stored
    ones, and decode, prefill (a tail that re-does some) and the float path give its products.
    Returns (stored, repacked, GGML id, the rng it drew x from)."""
    w = stored_matrix(name, rows, n, seed=12)
    code = quant.get(name).type_id
    packed = w.copy()
    cpu.repack_x8(packed, code)
    assert not np.array_equal(packed, w) and packed.shape == w.shape
    got = np.empty(n, np.float32)
    for r in (0, 7, 8, 45):
        cpu.dequantize_x8_row(packed, r, code + cpu.PACKED, got)
        np.testing.assert_array_equal(got, quant.dequantize(w[r:r + 1], name)[0])
    rng = np.random.default_rng(13)
    for T in (1, 3, cpu.TOKENS, cpu.TOKENS + 2):
        x = rng.standard_normal((T, n)).astype(np.float32)
        out = np.empty((T, rows), np.float32)
        cpu.matmul(packed, code + cpu.PACKED, x, out, False)
        want, rtol, atol = twin(name, w, x)
        np.testing.assert_allclose(out, want, rtol=rtol, atol=atol * np.abs(want).max())
        cpu.matmul(packed, code + cpu.PACKED, x, out, True)
        want, rtol, atol = twin(name, w, x, "matmul_exact")
        np.testing.assert_allclose(out, want, rtol=rtol, atol=atol * np.abs(want).max())
    return w, packed, code, rng


# the quant bytes of a block (start, end): all ones makes every weight its format's largest unsigned value
LARGEST = {"q4_0": [(2, 18)], "q4_1": [(4, 20)], "q5_0": [(2, 22)], "q5_1": [(4, 24)], "mxfp4": [(1, 17)],
           "q4_k": [(16, 144)], "q5_k": [(16, 176)], "q6_k": [(0, 192)]}


@pytest.mark.parametrize("name", sorted(LARGEST))
def test_the_largest_weights_times_the_largest_activations_sum_exactly(name):
    """Every weight at its largest magnitude and every activation at ±127 with one sign: the most
    a repacked kernel's partial sums can reach (avx2 adds several byte products in int16 before
    widening them: simd.dots_accumulate). Decode, a few tokens and a prompt's tiles against the twin."""
    t = quant.get(name)
    n, rows = 512, 16
    w = stored_matrix(name, rows, n, seed=31)
    blocks = w.reshape(rows, n // t.block_size, -1)
    for a, b in LARGEST[name]:
        blocks[:, :, a:b] = 0xFF
    packed = w.copy()
    cpu.repack_x8(packed, t.type_id)
    for T in (1, cpu.TOKENS, tiles.TILE_MIN_T):
        x = np.full((T, n), 0.5, np.float32)
        x[1::2] = -3.0  # other tokens: the other sign
        out = np.empty((T, rows), np.float32)
        cpu.matmul(packed, t.type_id + cpu.PACKED, x, out, False)
        want, rtol, atol = twin(name, w, x)
        np.testing.assert_allclose(out, want, rtol=rtol, atol=atol * np.abs(want).max())


@pytest.mark.parametrize("name", PACK_FORMATS)
def test_repacked_matrices_give_the_same_products(name):
    """8-row groups (cpu.repack_x8): decode's group dot products, prefill's dequantized rows and
    the fused SwiGLU against the numpy twin of the original layout."""
    n, rows = 256, 48
    w, packed, code, rng = check_repacked(name, rows, n)
    up = stored_matrix(name, rows, n, seed=14)
    up_packed = up.copy()
    cpu.repack_x8(up_packed, code)
    x = rng.standard_normal((1, n)).astype(np.float32)
    out = np.empty((1, rows), np.float32)
    cpu.swiglu_int(packed, code + cpu.PACKED, up_packed, code + cpu.PACKED, x, out)
    want = ref.swiglu(twin(name, w, x)[0].astype(np.float64), twin(name, up, x)[0])
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-5 * np.abs(want).max())


@pytest.mark.parametrize("renormalise", [True, False])
def test_softmax_top_k_matches_numpy(renormalise):
    logits = np.random.default_rng(6).standard_normal((5, 8)).astype(np.float32)
    logits[2, 3] = logits[2, 6] = logits[2].max() + 1  # a tie: the lower expert id first, as a stable sort
    w, ids = np.empty((5, 2), np.float32), np.empty((5, 2), np.int64)
    cpu.softmax_top_k(logits, 2, renormalise, w, ids)
    want_w, want_ids = ref.softmax_top_k(logits, 2, renormalise)
    np.testing.assert_array_equal(ids, want_ids)
    assert ids[2].tolist() == [3, 6]
    np.testing.assert_allclose(w, want_w, rtol=1e-6)


def test_f16_store_is_numpys_rounding_bit_for_bit():
    """The f16 KV cache's write (cpu.store_f16) rounds as astype(float16): ties to even, subnormals,
    overflow to infinity, signed zeros, NaN and infinities kept."""
    rng = np.random.default_rng(8)
    x = (rng.standard_normal((7, 96)) * np.exp(rng.uniform(-20, 12, (7, 96)))).astype(np.float32)
    x[0, :8] = [0.0, -0.0, np.inf, -np.inf, 65504.0, 65520.0, 6e-8, -3e-5]
    x[1, :3] = [1 + 2.0 ** -11, 1 + 3 * 2.0 ** -11, np.nan]  # ties: to even
    out = np.empty(x.shape, np.uint16)
    cpu.store_f16(x, out)
    want = table.resolve(table.lookup("store_f16").twin)(x)
    nan = np.isnan(x)
    np.testing.assert_array_equal(out[~nan], want[~nan])
    assert np.isnan(out.view(np.float16)[nan]).all()


def test_f16_cache_write_past_its_capacity_is_refused():
    """KVCache.write through cpu.store_f16 (which checks no bounds): rows past the capacity are a
    ValueError, as numpy's copy made them, not a write past the buffer; rows inside are kept."""
    from engine.kvcache import KVCache
    cache = KVCache(2, 4, 2, 8, "f16")
    kv = np.random.default_rng(9).standard_normal((3, 2, 8)).astype(np.float32)
    cache.write(1, 1, kv, kv)
    before = cache.k.copy()
    with pytest.raises(ValueError, match="KV cache write"):  # positions 3..4 of 4: one row's room, whose
        cache.write(1, 3, kv[:2], kv[:2])                    # elements reshape to 2 short rows
    np.testing.assert_array_equal(cache.k, before)
    np.testing.assert_array_equal(cache.k[1, 1:4], kv.astype(np.float16))


@pytest.mark.parametrize("name,repack", [("q4_0", True), ("q4_1", False), ("q8_0", False), ("q8_0", True)])
def test_moe_experts_in_one_call_match_numpy(name, repack):
    """cpu.moe_int: one token through k experts (SwiGLU each, weighted sum) against the numpy
    twins composed expert by expert."""
    n, ff, k = 64, 96, 3
    code = quant.get(name).type_id
    shapes = [(ff, n), (ff, n), (n, ff)]  # gate, up, down
    mats = [[stored_matrix(name, rows, cols, seed=10 * e + i) for i, (rows, cols) in enumerate(shapes)]
            for e in range(k)]
    x = np.random.default_rng(30).standard_normal((1, n)).astype(np.float32)
    mix = np.array([0.5, 0.3, 0.2], np.float32)
    want = np.zeros((1, n))
    for (g, u, d), m in zip(mats, mix):
        act = ref.swiglu(ref.matmul_int(g, name, x).astype(np.float64), ref.matmul_int(u, name, x)).astype(np.float32)
        want += m * ref.matmul_int(d, name, act)
    used = code
    if repack:
        mats = [[w.copy() for w in ws] for ws in mats]
        for ws in mats:
            for w in ws:
                cpu.repack_x8(w, code)
        used = code + cpu.PACKED
    out, act = np.empty((1, n), np.float32), np.empty((k, ff), np.float32)
    cpu.moe_int(tuple(ws[0] for ws in mats), tuple(ws[1] for ws in mats), tuple(ws[2] for ws in mats), used, used, used,
                mix, x, act, out)
    np.testing.assert_allclose(out, want, rtol=1e-3, atol=2e-3 * np.abs(want).max())


def test_exp32_is_exp_to_a_few_ulp():
    """rows.exp32 (vectorisable: softmax and SwiGLU use it) against numpy's float64 exp."""
    from numba import njit

    from engine.kernels.rows import exp32

    @njit(fastmath=True)
    def run(x, out):
        for i in range(x.shape[0]):
            out[i] = exp32(x[i])
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.uniform(-87, 88, 200_000), rng.standard_normal(10_000),
                        [0.0, -0.0, 1e-30, -0.34657359, 0.34657359, 88.0, -87.0]]).astype(np.float32)
    out = np.empty_like(x)
    run(x, out)
    want = np.exp(x.astype(np.float64))
    assert (np.abs(out - want) / want).max() < 1e-6
    run(np.array([-1e4, -np.inf, 1e4], np.float32), out[:3])  # clamped: no overflow, no garbage
    assert 0 <= out[0] < 2e-38 and 0 <= out[1] < 2e-38 and 1e38 < out[2] < np.inf


def test_compiled_names_do_not_repeat_across_processes():
    """Numba's per-process counter in each compiled function's name is replaced by random ids
    (engine.kernels._RandomUids): two processes never give two different bodies one name, which
    LLVM's weak merge would confuse once one loads what the other cached (numba issue #10486)."""
    import subprocess
    import sys
    code = ("import engine.kernels, numba\nengine.kernels.setup()\n"
            "f = numba.njit(lambda x: x + 1)\nf(1)\n"
            "print(next(iter(f.overloads.values())).fndesc.mangled_name)")
    names = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
             for _ in range(2)}
    assert len(names) == 2, names


def test_expert_gather_and_scatter_are_numpys():
    """ffn.take_rows and ffn.add_weighted_rows (a prompt's tokens of one expert, gathered and added
    back on every thread) give numpy's h[rows] and out[rows] += w[rows, slot, None] · y bit for bit."""
    from engine.ops import ffn
    rng = np.random.default_rng(7)
    T, n, k = 37, 96, 2
    h = rng.standard_normal((T, n)).astype(np.float32)
    ids = np.stack([rng.permutation(4)[:k] for _ in range(T)])
    w = rng.random((T, k)).astype(np.float32)
    out, want = (rng.standard_normal((T, n)).astype(np.float32) for _ in range(2))
    want[...] = out
    for e in range(4):
        rows, slot = np.nonzero(ids == e)
        got = np.empty((len(rows), n), np.float32)
        ffn.take_rows(h, rows, got)
        np.testing.assert_array_equal(got, h[rows])
        y = np.sin(got * np.float32(3)) * np.float32(1.7)  # some expert's output
        ffn.add_weighted_rows(out, rows, np.ascontiguousarray(w[rows, slot]), y)
        want[rows] += w[rows, slot, None] * y
        np.testing.assert_array_equal(out, want, err_msg=f"expert {e}")
