"""Quant formats against the gguf package (the peer) and their documented error budgets."""
import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as G

from engine import quant

BLOCK_TYPES = {"q8_0": G.Q8_0, "q4_0": G.Q4_0, "q4_1": G.Q4_1, "q5_0": G.Q5_0, "q5_1": G.Q5_1,
               "q2_k": G.Q2_K, "q3_k": G.Q3_K, "q4_k": G.Q4_K, "q5_k": G.Q5_K, "q6_k": G.Q6_K,
               "iq4_nl": G.IQ4_NL, "iq4_xs": G.IQ4_XS, "mxfp4": G.MXFP4}
# byte offsets of the f16 scale fields inside each block (kept finite in random blocks)
SCALE_OFFSETS = {"q8_0": [0], "q4_0": [0], "q4_1": [0, 2], "q5_0": [0], "q5_1": [0, 2], "q2_k": [80, 82],
                 "q3_k": [108], "q4_k": [0, 2], "q5_k": [0, 2], "q6_k": [208], "iq4_nl": [0], "iq4_xs": [0],
                 "mxfp4": []}


def random_blocks(name: str, rows: int, blocks_per_row: int, seed: int) -> np.ndarray:
    t = quant.get(name)
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, size=(rows, blocks_per_row, t.type_size), dtype=np.uint8)
    for off in SCALE_OFFSETS[name]:
        scales = rng.normal(0, 0.05, size=(rows, blocks_per_row)).astype(np.float16)
        raw[:, :, off:off + 2] = scales.view(np.uint8).reshape(rows, blocks_per_row, 2)
    if name == "mxfp4":  # the e8m0 exponent: weights around 2^-5 .. 2^0
        raw[:, :, 0] = rng.integers(121, 128, size=(rows, blocks_per_row), dtype=np.uint8)
    return raw.reshape(rows, -1)


def test_table_matches_ggml():
    for name, g in BLOCK_TYPES.items():
        t = quant.get(name)
        assert t.type_id == int(g)
        assert (t.block_size, t.type_size) == gguf.GGML_QUANT_SIZES[g]
    assert quant.get("f32").type_id == int(G.F32) and quant.get("f16").type_id == int(G.F16)
    assert quant.get("bf16").type_id == int(G.BF16)


@pytest.mark.parametrize("name", BLOCK_TYPES)
@pytest.mark.parametrize("seed", [0, 1])
def test_dequantize_is_bit_exact_with_gguf(name, seed):
    raw = random_blocks(name, rows=5, blocks_per_row=3, seed=seed)
    ours = quant.dequantize(raw, name)
    ref = gguf.quants.dequantize(raw, BLOCK_TYPES[name]).astype(np.float32)
    assert ours.dtype == np.float32 and ours.shape == ref.shape
    assert np.array_equal(ours.view(np.uint32), ref.view(np.uint32))


def test_every_mxfp4_exponent_and_ggml_type_size():
    """All 256 e8m0 exponents (subnormal 0 and 1, 2^127 at 254, 255) decode as gguf's do."""
    raw = np.random.default_rng(5).integers(0, 256, size=(256, 17), dtype=np.uint8)
    raw[:, 0] = np.arange(256)
    with np.errstate(over="ignore", invalid="ignore"):
        ref = gguf.quants.dequantize(raw, G.MXFP4).astype(np.float32)
        ours = quant.dequantize(raw, "mxfp4")
    assert np.array_equal(ours.view(np.uint32), ref.view(np.uint32))


@pytest.mark.parametrize("name", ["q8_0", "q4_0", "q4_1"])
def test_quantize_is_bit_exact_with_gguf(name):
    rng = np.random.default_rng(7)
    x = rng.standard_normal((16, 256)).astype(np.float32)
    x[0, :32] = 0.0  # an all-zero block
    x[1, :32] = 3.0  # a constant block
    x[2] *= 1e-4
    assert np.array_equal(quant.quantize(x, name), gguf.quants.quantize(x, BLOCK_TYPES[name]))


@pytest.mark.parametrize("name", ["f16", "bf16", "q8_0", "q4_0", "q4_1"])
def test_error_budget(name):
    """quantize -> dequantize on N(0,1) weights stays within the budget declared in the table."""
    t = quant.get(name)
    x = np.random.default_rng(3).standard_normal((64, 512)).astype(np.float32)
    y = quant.dequantize(quant.quantize(x, t), t)
    rel = np.sqrt(np.mean((y - x) ** 2) / np.mean(x ** 2))
    assert rel <= t.rms_budget
    assert rel > t.rms_budget / 20  # the budget is tight enough to catch a regression


def test_bf16_rounds_to_nearest_even():
    x = np.array([1.0, 1.00390625, 1.01171875, -2.5, np.inf, 3e38], np.float32)
    bits = quant.quantize(x, "bf16")
    back = quant.dequantize(bits, "bf16")
    assert back[0] == 1.0 and back[1] == 1.0 and back[2] == 1.015625  # ties to even
    assert back[3] == -2.5 and np.isinf(back[4])
    assert np.isnan(quant.dequantize(quant.quantize(np.array([np.nan], np.float32), "bf16"), "bf16"))[0]


def test_quantized_formats_keep_shape_and_size():
    x = np.zeros((3, 4, 64), np.float32)
    for name in ("q8_0", "q4_0", "q4_1"):
        t = quant.get(name)
        s = quant.quantize(x, t)
        assert s.shape == t.stored_shape(x.shape) and s.nbytes == t.nbytes(x.shape)
        assert quant.dequantize(s, t).shape == x.shape


def test_bad_requests_are_named():
    with pytest.raises(quant.QuantError, match="unknown quant type 'q3_x'"):
        quant.get("q3_x")
    with pytest.raises(quant.QuantError, match="not a multiple of 32"):
        quant.quantize(np.zeros((2, 48), np.float32), "q8_0")
    with pytest.raises(quant.QuantError, match="imported but not produced"):
        quant.quantize(np.zeros((1, 256), np.float32), "q4_k")
