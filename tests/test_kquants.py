"""The K-quant integer kernels (engine.kernels.kquants) against their numpy twin
(reference.matmul_int_k: the same integer sums in float64; the kernels sum in float32 in another
order, so they agree to float rounding: rtol 1e-5 of the largest output), through every entry
point that takes them: matmul (stored rows and 8-row groups, decode and prefill with its tail),
matmul_int, swiglu_int, moe_int, and a K-quant model's fused decode. The avx2 and generic
instruction paths: test_kernels.test_every_dot_product_path_computes_the_same_products."""
from __future__ import annotations

import numpy as np
import pytest
from test_kernels import check_repacked, stored_matrix

from engine import quant
from engine.kernels import cpu
from engine.kernels import reference as ref

K_FORMATS = ["q4_k", "q5_k", "q6_k"]


def close(got, want, rtol=1e-5):
    np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * np.abs(want).max())


def packed(w: np.ndarray, name: str) -> np.ndarray:
    p = w.copy()
    cpu.repack_x8(p, quant.get(name).type_id)
    return p


@pytest.mark.parametrize("name", K_FORMATS)
def test_stored_rows_match_the_twin(name):
    """Rows as stored: 37 rows (a partial task), 2 super-blocks, one token and five (TOKENS
    tokens at a time, then one)."""
    n, rows = 512, 37
    w = stored_matrix(name, rows, n, seed=1)
    x = np.random.default_rng(2).standard_normal((cpu.TOKENS + 1, n)).astype(np.float32)
    for T in (1, cpu.TOKENS + 1):
        out = np.empty((T, rows), np.float32)
        cpu.matmul(w, quant.get(name).type_id, x[:T], out, False)
        close(out, ref.matmul_int_k(w, name, x[:T]))


@pytest.mark.parametrize("name", K_FORMATS)
def test_repacked_groups_match_the_twin(name):
    """8-row groups: the layout round-trips (dequantize_x8_row is the format's dequantization),
    and decode (T < TOKENS), prefill (TOKENS tokens a pass, a tail that re-does some) and the
    float path (`exact`) give the stored matrix's products."""
    check_repacked(name, 48, 768)


@pytest.mark.parametrize("name", K_FORMATS)
def test_integer_path_stays_within_the_activation_quantization_budget(name):
    """The int8 rounding of x against the float product of the same stored weights."""
    n, rows = 1024, 32
    w = stored_matrix(name, rows, n, seed=21)
    x = np.random.default_rng(22).standard_normal((2, n)).astype(np.float32)
    out = np.empty((2, rows), np.float32)
    cpu.matmul(w, quant.get(name).type_id, x, out, False)
    want = ref.matmul(w, name, n, x)
    assert np.abs(out - want).max() / np.abs(want).max() < 1e-2


def test_fused_kernels_take_mixed_k_quant_matrices():
    """q/k/v of a Q4_K_M model (Q4_K, Q6_K, Q8_0; repacked or not) in one matmul_int call,
    SwiGLU's gate+up (Q4_K and Q5_K, both repacked) and a token's experts in one moe_int
    (gate/up Q4_K, down Q6_K), against the numpy twins."""
    n, T = 512, 2
    x = np.random.default_rng(3).standard_normal((T, n)).astype(np.float32) * np.float32(1e-3)  # random
    spec = [("q4_k", 40, True), ("q6_k", 17, False), ("q8_0", 24, True), ("q5_k", 9, False)]
    ws = [stored_matrix(f, rows, n, seed=i) for i, (f, rows, _) in enumerate(spec)]
    used = tuple(packed(w, f) if pk else w for w, (f, _, pk) in zip(ws, spec))
    codes = tuple(quant.get(f).type_id + (cpu.PACKED if pk else 0) for f, _, pk in spec)
    outs = tuple(np.empty((T, w.shape[0]), np.float32) for w in ws)
    cpu.matmul_int(used, codes, x, outs)
    for out, w, (f, _, _) in zip(outs, ws, spec):
        close(out, ref.matmul_int(w, f, x))
    g, u = stored_matrix("q4_k", 48, n, seed=7), stored_matrix("q5_k", 48, n, seed=8)
    out = np.empty((T, 48), np.float32)
    cpu.swiglu_int(packed(g, "q4_k"), cpu.Q4_KX8, packed(u, "q5_k"), cpu.Q5_KX8, x, out)
    want = ref.swiglu(ref.matmul_int_k(g, "q4_k", x).astype(np.float64), ref.matmul_int_k(u, "q5_k", x))
    close(out, want, 1e-4)


@pytest.mark.parametrize("repack", [True, False])
def test_moe_experts_in_one_call(repack):
    n, ff, k = 256, 512, 2
    mats = [[stored_matrix(f, rows, cols, seed=10 * e + i)
             for i, (f, rows, cols) in enumerate([("q4_k", ff, n), ("q4_k", ff, n), ("q6_k", n, ff)])]
            for e in range(k)]
    x = np.random.default_rng(30).standard_normal((1, n)).astype(np.float32) * np.float32(1e-3)
    mix = np.array([0.7, 0.3], np.float32)
    want = np.zeros((1, n))
    for (g, u, d), m in zip(mats, mix):
        act = ref.swiglu(ref.matmul_int_k(g, "q4_k", x).astype(np.float64), ref.matmul_int_k(u, "q4_k", x))
        want += m * ref.matmul_int_k(d, "q6_k", act.astype(np.float32))
    codes = [cpu.Q4_K, cpu.Q4_K, cpu.Q6_K]
    if repack:
        mats = [[packed(w, f) for w, f in zip(ws, ("q4_k", "q4_k", "q6_k"))] for ws in mats]
        codes = [c + cpu.PACKED for c in codes]
    out, act = np.empty((1, n), np.float32), np.empty((k, ff), np.float32)
    cpu.moe_int(tuple(ws[0] for ws in mats), tuple(ws[1] for ws in mats), tuple(ws[2] for ws in mats), *codes,
                mix, x, act, out)
    close(out, want, 1e-3)


def test_a_k_quant_model_decodes_fused_as_layered_and_near_the_float_forward(tmp_path):
    """A Q4_K_M-like GGUF (Q4_K feed-forward and head, Q6_K attention, Q5_K down): the fused
    decode kernel gives the layered path's logits bit for bit (both on the K-quant kernels),
    and the logits stay within the int8-activation budget of the float forward pass of the
    same GGUF (gguf_fixtures.reference_forward)."""
    from gguf import GGMLQuantizationType as Q
    from gguf_fixtures import make_wide_gguf, reference_forward
    from test_fused_decode import assert_same, decode, resident

    from engine.api import Engine
    from engine.convert.convert import convert
    path = make_wide_gguf(tmp_path / "k.gguf", qtypes={"blk.*.ffn_down*": Q.Q5_K, "blk.*.ffn_*": Q.Q4_K,
                                                       "blk.*.attn_*": Q.Q6_K, "output*": Q.Q6_K, "*": Q.Q4_K})
    eng = Engine(convert(path, tmp_path / "out").path, context_length=64)
    codes = {m.code for m in (eng.weights.output, eng.weights.layers[0].q, eng.weights.layers[0].o)}
    assert codes == {cpu.Q6_KX8}, codes  # repacked at load
    prompt, tokens = [1, 5, 9, 14], [11, 2, 30, 4]
    eng = resident(eng, prompt)
    assert eng.net.fused is not None
    start = eng.cache.length
    assert_same(decode(eng, tokens, True, start), decode(eng, tokens, False, start))
    eng.reset()
    logits = eng.net.forward(np.array(prompt + tokens), eng.cache, 0, all_logits=True)
    want = reference_forward(path, prompt + tokens)
    # (2.6% measured: these formats read activations quantized per 256, llama.cpp's Q8_K; per 32 gave 1.5%)
    assert np.abs(logits - want).max() / np.abs(want).max() < 3.5e-2
