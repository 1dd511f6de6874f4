"""What our quantizations cost in quality, on the real default model and real text.

SmolLM2-135M-Instruct (the Q4_1 GGUF) dequantized to f16 is the reference; our conversions of
that GGUF to int8 (Q8_0) and int4, and our own Q4_0 re-rounding of the f16 weights (export_gguf's
requantize, imported back), are measured against it as llama-perplexity --kl-divergence does
(app/bench/perplexity.py), on a slice of tests/fixtures/texts/en_python_docs.txt: 2 chunks of
256 tokens, 254 scored positions. Bounds are the measured figures with a margin (docs/bench/quality.md,
"Bounds in the suite"). The weights' cost is measured with float activations (int8_activations off: what the
conversion decides); the engine's default, activations rounded to 8-bit blocks as well, is
measured for int8 too: on this model the rounding of activations costs more than Q8_0 weights.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from app.bench import perplexity as P
from engine.api import Engine
from engine.convert.convert import convert
from engine.convert.gguf_export import export_gguf

TEXT = Path(__file__).parent / "fixtures" / "texts" / "en_python_docs.txt"
CTX, CHUNKS = 256, 2


def _engine(path: Path, **params) -> Engine:
    return Engine(path, context_length=CTX, threads=2, **params)


@pytest.fixture(scope="module")
def chunks_and_reference(tmp_path_factory, default_gguf):
    """The slice's chunks and the f16 reference's logits for each (2 x 256 x 49152 float32: 100 MB)."""
    root = tmp_path_factory.mktemp("quality")
    ref_dir = convert(default_gguf, root / "f16", "f16").path
    eng = _engine(ref_dir)
    try:
        tokens = P.text_tokens(eng, TEXT.read_text(encoding="utf-8"))
        bos = eng.codec.bos_id if eng.codec.add_bos else None
        chunks = list(P.chunk_tokens(tokens, CTX, CHUNKS, bos))
        ref = [eng.logits(c) for c in chunks]
    finally:
        eng.close()
    return root, ref_dir, chunks, ref


def _measure(model: Path, chunks, ref, int8_activations: bool = False) -> dict:
    eng = _engine(model, int8_activations=int8_activations)
    try:
        acc = P.Accumulator()
        for c, r in zip(chunks, ref):
            acc.add_chunk(eng.logits(c), c, r)
    finally:
        eng.close()
    return P.summarize(acc)


@pytest.fixture(scope="module")
def measured(chunks_and_reference, default_gguf):
    root, ref_dir, chunks, ref = chunks_and_reference
    out = {}
    for target in ("int8", "int4"):
        out[target] = _measure(convert(default_gguf, root / target, target).path, chunks, ref)
    out["int8 (int8 activations)"] = _measure(root / "int8", chunks, ref, int8_activations=True)
    q4_0 = export_gguf(ref_dir, root / "q4_0.gguf", requantize="q4_0")
    out["q4_0"] = _measure(convert(q4_0, root / "q4_0", "keep").path, chunks, ref)
    for name, r in out.items():
        print(f"{name}: PPL {r['ppl']:.4f} (f16 {r['ppl_ref']:.4f}, {r['delta_ppl_pct']:+.3f}%), KLD {r['kld_mean']:.5f} "
              f"(99%: {r['kld_p99']:.4f}), same top {r['same_top_pct']:.2f}%")
    return out


def test_the_reference_knows_english(measured):
    # a model that knew nothing would score about its vocabulary size (49152): the slice discriminates
    assert measured["int8"]["positions"] == CHUNKS * (CTX - CTX // 2 - 1)
    assert measured["int8"]["ppl_ref"] < 30


def test_q8_0_costs_almost_nothing(measured):
    r = measured["int8"]
    assert abs(r["delta_ppl_pct"]) <= 0.5
    assert r["same_top_pct"] >= 97
    assert r["kld_mean"] <= 0.01


def test_int8_activations_cost_is_bounded(measured):
    # measured: dPPL +0.45%, KLD 0.0044, same top 94.9% +- 1.4 (241 of 254) since rmsnorm_row lost its
    # fastmath (before: +0.77%, 0.0046, 96.5%): four near-ties flipped while dPPL and KLD improved
    r = measured["int8 (int8 activations)"]
    assert abs(r["delta_ppl_pct"]) <= 1.5
    assert r["same_top_pct"] >= 93
    assert r["kld_mean"] <= 0.006


def test_int4_keeps_the_top_token(measured):
    # the source's Q4_1 blocks are already int4: copied, never re-rounded (measured: dPPL -0.001%,
    # KLD < 1e-5, same top 100%); what is left is the f16 rounding of the reference
    r = measured["int4"]
    assert r["same_top_pct"] >= 85
    assert abs(r["delta_ppl_pct"]) <= 0.1
    assert r["kld_mean"] <= 1e-3


def test_re_rounding_to_q4_0_is_bounded(measured):
    # new 4-bit rounding of a 135M model is harsh (measured: +13.7% PPL, KLD 0.31, same top 68.9%;
    # llama.cpp's own Q4_0 of it: +23.8%, 0.28, 71.7% on 1020 positions)
    r = measured["q4_0"]
    assert r["same_top_pct"] >= 60
    assert r["delta_ppl_pct"] <= 20
    assert measured["int8"]["kld_mean"] * 20 < r["kld_mean"] <= 0.45


# --- K-quant export and calibration (issue 20 items 2-4) -----------------------------------------
# Every re-rounding starts from the f16 reference exported as a GGUF; the calibration text is the
# tail of the same file (never among the scored chunks, which are its first 512 tokens).
CALIBRATION_CHARS = 3000  # about 700 tokens: one chunk of 512 through the calibration forward


@pytest.fixture(scope="module")
def kquant_measured(chunks_and_reference):
    root, ref_dir, chunks, ref = chunks_and_reference
    f16 = export_gguf(ref_dir, root / "f16.gguf")
    cal = root / "calibration.txt"
    cal.write_text(TEXT.read_text(encoding="utf-8")[-CALIBRATION_CHARS:], encoding="utf-8")
    out = {}
    for target, calibrated in (("q4_k_m", False), ("q4_k_m", True), ("int4", False), ("int4", True)):
        name = f"{target}{' +cal' if calibrated else ''}"
        r = convert(f16, root / f"k-{name.replace(' +', '-')}", target, calibration_data=cal if calibrated else None)
        out[name] = _measure(r.path, chunks, ref)
        out[name]["calibration"] = r.calibration
        res = out[name]
        print(f"{name}: dPPL {res['delta_ppl_pct']:+.3f}%, KLD {res['kld_mean']:.5f}, same top {res['same_top_pct']:.2f}%")
    return out


def test_q4_k_m_bounds(kquant_measured):
    # our Q4_K_M (byte for byte llama-quantize's: tests/test_kquant_export.py) on the real model;
    # measured on this slice: +5.84%, KLD 0.061, same top 83.5% (+/- 4.6 at 95% on 254 positions);
    # on the bench's 510 (colibri-bench quality): +4.63%, 87.8% +/- 2.8; on all 20 chunks of 512
    # (5,100 positions, llama-perplexity --kl-divergence on these bytes): +7.4%, 87.7% +/- 0.9. The
    # >= 85% of the issue holds there; this slice is too small to hold it (2 chunks of 512 pass
    # every test here, 87.84%, but cost the file 281 s of CPU instead of 120), so it asserts 80%
    r = kquant_measured["q4_k_m"]
    assert r["delta_ppl_pct"] <= 6
    assert r["same_top_pct"] >= 80


def test_calibration_lowers_the_4_bit_cost(kquant_measured):
    plain, cal = kquant_measured["q4_k_m"], kquant_measured["q4_k_m +cal"]
    assert cal["calibration"]["weighted_matrices"] == 211 and cal["calibration"]["tokens"] == 512
    assert cal["delta_ppl_pct"] < plain["delta_ppl_pct"]
    assert cal["kld_mean"] < plain["kld_mean"]
    assert cal["same_top_pct"] >= 85


def test_calibrated_int4_keeps_the_grid(kquant_measured):
    # the weights lie on a Q4_1 grid, which plain rounding recovers (dPPL ~ 0); the calibrated
    # rounding keeps a block's plain rounding unless the weighted error is lower, so it cannot lose
    plain, cal = kquant_measured["int4"], kquant_measured["int4 +cal"]
    assert cal["kld_mean"] <= plain["kld_mean"] * 1.05 + 1e-6
    assert cal["same_top_pct"] >= 85
