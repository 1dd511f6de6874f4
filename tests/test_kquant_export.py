"""K-quant export against llama.cpp: the bytes llama-quantize writes (with and without an importance
matrix) and the type its presets give each tensor. Fixtures: tests/make_kquant_fixtures.py."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from engine import quant
from engine.convert import kquant_export as K

FIX = Path(__file__).parent / "fixtures" / "kquant"
ROWS = np.load(FIX / "rows.npz")
META = json.loads((FIX / "types.json").read_text())


def _cases(where: str) -> list[tuple[str, str]]:
    return [(p, k.split("/", 2)[2]) for k in ROWS.files if k.startswith(where + "/")
            for p in [k.split("/")[1]]]


@pytest.mark.parametrize("where", ["presets", "imatrix_presets"])
def test_bytes_match_llama_quantize(where):
    """Every sampled row (awkward ones included: all zero, constant, all positive, an outlier,
    tiny, half zero) of every preset, in every type the preset chose, byte for byte."""
    seen = set()
    for preset, name in _cases(where):
        qtype = META[where][preset][name]
        src = ROWS[f"src/{name}"].astype(np.float32)
        imatrix = ROWS[f"imatrix/{name}"] if where == "imatrix_presets" and f"imatrix/{name}" in ROWS.files else None
        ours = K.quantize(src, qtype, imatrix)
        want = ROWS[f"{where}/{preset}/{name}"]
        bad = np.nonzero((ours != want).any(axis=1))[0]
        assert ours.shape == want.shape and bad.size == 0, f"{preset} {name} ({qtype}): rows {bad} differ"
        seen.add((qtype, imatrix is not None))
    expected = {"q4_k", "q5_k", "q6_k", "q5_0", "q5_1", "q8_0"} | ({"q4_1"} if where == "imatrix_presets" else set())
    assert {t for t, _ in seen} >= expected


def _shape(name: str, c: dict) -> tuple[int, ...]:
    D, F, hd = c["hidden_size"], c["intermediate_size"], c.get("head_dim", c["hidden_size"] // c["num_attention_heads"])
    q, kv = c["num_attention_heads"] * hd, c["num_key_value_heads"] * hd
    for key, shape in (("token_embd", (c["vocab_size"], D)), ("output.", (c["vocab_size"], D)),
                       ("attn_q.", (q, D)), ("attn_k.", (kv, D)), ("attn_v.", (kv, D)),
                       ("attn_output.", (D, q)), ("ffn_gate", (F, D)), ("ffn_up", (F, D)), ("ffn_down", (D, F))):
        if key in name:
            return shape
    raise KeyError(name)


SMOLLM2 = {"hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30, "num_attention_heads": 9,
           "num_key_value_heads": 3, "head_dim": 64, "vocab_size": 49152}


@pytest.mark.parametrize("case", ["presets", "moe", "smollm2"])
def test_types_match_llama_presets(case):
    """The preset mix: more bits for attn_v / ffn_down in llama.cpp's chosen layers, the output head
    at Q6_K (Q8_0 when its rows do not divide into 256), the 8-expert rules, the fallbacks."""
    if case == "presets":
        runs = [(p, t, META["config"], False, 1) for p, t in META["presets"].items()]
    elif case == "moe":
        runs = [("Q4_K_M", META["moe_q4_k_m"], META["moe_config"], False, 8)]
    else:
        runs = [("Q4_K_M", META["smollm2_q4_k_m"], SMOLLM2, True, 1)]
    for preset, types, c, tied, experts in runs:
        for name, want in types.items():
            if not name.endswith(".weight") or "norm" in name or "gate_inp" in name:
                continue
            got = K.preset_type(name, _shape(name, c), preset.lower(), c["num_hidden_layers"], experts, tied)
            assert got == want, f"{case} {preset} {name}: ours {got}, llama.cpp {want}"


def test_more_bits_layers():
    assert [i for i in range(8) if K.more_bits(i, 8)] == [0, 3, 6, 7]
    assert [i for i in range(30) if K.more_bits(i, 30)][:6] == [0, 1, 2, 5, 8, 11]


def test_round_trip_error_and_bad_input():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((8, 512)).astype(np.float32)
    errs = {}
    for t in ("q4_k", "q5_k", "q6_k"):
        y = quant.dequantize(K.quantize(x, t), t)
        errs[t] = float(np.sqrt(np.mean((y - x) ** 2)))
    assert errs["q6_k"] < errs["q5_k"] < errs["q4_k"] < 0.12, errs
    with pytest.raises(quant.QuantError, match="multiple of 256"):
        K.quantize(x[:, :320], "q4_k")
    with pytest.raises(quant.QuantError, match="importance weights"):
        K.quantize(x, "q4_k", np.ones(256, np.float32))


def test_importance_weights_lower_weighted_error():
    """Weighted rounding puts its error where the weights are large (what calibration relies on)."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal((64, 256)).astype(np.float32)
    w = np.exp(2 * rng.standard_normal(256)).astype(np.float32)
    for t in ("q4_k", "q4_1", "q6_k"):
        plain = quant.dequantize(K.quantize(x, t), t)
        weighted = quant.dequantize(K.quantize(x, t, w), t)
        cost = lambda y: float(np.sum(w * (y - x) ** 2))  # noqa: E731
        assert cost(weighted) < cost(plain), t
    q8 = quant.dequantize(K.weighted_q8_0(x, w), "q8_0")
    assert float(np.sum(w * (q8 - x) ** 2)) <= float(np.sum(w * (quant.dequantize(K.quantize(x, "q8_0"), "q8_0") - x) ** 2))


def test_converter_writes_the_preset(tmp_path):
    """colibri-convert --quantize q4_k_m of a llama.cpp-made GGUF: every matrix in the preset's type."""
    from engine.convert.convert import QUANTIZE_CHOICES, convert
    from engine.model_dir import open_model_dir
    assert {"q4_k_m", "q4_k_s", "q5_k_m", "q5_k_s", "q6_k"} <= set(QUANTIZE_CHOICES)
    src = Path(__file__).parent / "fixtures" / "llamacpp_presets" / "tiny-q8_0.gguf"
    r = convert(src, tmp_path / "m", "q4_k_m")
    m = open_model_dir(r.path)
    cfg = m.config
    for rel, tensors in m.files().items():
        tf = m.tensor_file(rel)
        for name in tensors:
            info = tf.infos[name]
            if len(info.shape) == 1:
                continue
            want = K.preset_type(name, info.shape, "q4_k_m", cfg.num_layers, cfg.num_experts, cfg.tie_word_embeddings)
            assert info.qtype.plain.name == want, name
    assert r.tensor_types.get("q4_k") and r.tensor_types.get("q6_k")


TEXT = Path(__file__).parent / "fixtures" / "texts" / "en_python_docs.txt"
PRESET_GGUF = Path(__file__).parent / "fixtures" / "llamacpp_presets"


def test_calibration_energies_of_the_first_layer(tmp_path):
    """The energy of blk.0's q/k/v input is mean((rmsnorm(embedding) * norm)^2) over the tokens:
    computed here straight from the GGUF, independently of the calibration forward."""
    from gguf import GGUFReader

    from engine.convert import calibrate
    from engine.convert.convert import calibration_for
    text = tmp_path / "cal.txt"
    text.write_text(TEXT.read_text(encoding="utf-8")[:3000], encoding="utf-8")
    src = PRESET_GGUF / "tiny-q8_0.gguf"
    cal = calibration_for(src, text)
    t = {x.name: x for x in GGUFReader(str(src)).tensors}
    emb = quant.dequantize(np.asarray(t["token_embd.weight"].data), "q8_0")
    norm = np.asarray(t["blk.0.attn_norm.weight"].data, np.float32)
    from engine.convert.convert import open_source
    s = open_source(src)
    try:
        chunks = calibrate.token_chunks(text.read_text(encoding="utf-8"), s.tokenizer.tokenizer_json, None)
    finally:
        s.close()
    x = emb[np.concatenate(chunks)]
    x = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + 1e-5) * norm
    want = np.mean(x.astype(np.float64) ** 2, axis=0)
    assert cal.tokens == sum(len(c) for c in chunks) and cal.chunks == len(chunks)
    for name in ("blk.0.attn_q.weight", "blk.0.attn_k.weight", "blk.0.attn_v.weight"):
        np.testing.assert_allclose(cal.energies[name], want, rtol=2e-3)
    assert cal.energies["blk.1.ffn_down.0.weight"].shape == (160,) and "token_embd.weight" not in cal.energies
    assert len(cal.energies) == 2 * 7 + 1  # q k v o gate up down per layer, and the output head


def test_calibrated_conversion_of_a_moe(tmp_path):
    """Experts the text never reaches keep weight-only rounding, and the result says how many."""
    from engine.convert.convert import convert
    text = tmp_path / "cal.txt"
    text.write_text(TEXT.read_text(encoding="utf-8")[:400], encoding="utf-8")  # a few tokens: some experts idle
    r = convert(PRESET_GGUF / "tiny-moe-mxfp4_moe.gguf", tmp_path / "m", "q4_k_m", calibration_data=text)
    c = r.calibration
    assert c["expert_matrices"] == 12 and c["tokens"] >= 16
    assert c["weighted_matrices"] == 5 + 12 - c["unrouted_expert_matrices"]
    with pytest.raises(Exception, match="calibration text has"):
        (tmp_path / "short.txt").write_text("hi", encoding="utf-8")
        convert(PRESET_GGUF / "tiny-q8_0.gguf", tmp_path / "n", "int4", calibration_data=tmp_path / "short.txt")


def test_the_wizard_reads_the_measured_table(tmp_path):
    """app/bench/results/quality.json (colibri-bench quality) holds each choice's measured cost."""
    from app.bench.quality import table
    from app.quality_table import RESULTS, expected_cost
    plain, cal = expected_cost("q4_k_m"), expected_cost("q4_k_m", calibrated=True)
    assert plain and cal and cal["kld_mean"] < plain["kld_mean"]
    assert expected_cost("int8")["same_top_pct"] > plain["same_top_pct"]
    assert expected_cost("keep") is None and expected_cost("int8", path=tmp_path / "none.json") is None
    doc = json.loads(RESULTS.read_text(encoding="utf-8"))
    assert doc["q4_k_m_imatrix_bytes_identical"] == "272 of 272"
    assert len(table(doc).splitlines()) == len(doc["rows"]) + 2  # a header, a rule, a row each


def test_calibrating_a_moe_with_a_gated_shared_expert(tmp_path):
    """Qwen2-MoE's shared expert has a one-logit sigmoid gate: its calibration forward runs, and the
    shared expert's matrices (always used) are weighted by their activations."""
    from engine.convert.convert import convert
    text = tmp_path / "cal.txt"
    text.write_text(TEXT.read_text(encoding="utf-8")[:2000], encoding="utf-8")
    r = convert(Path(__file__).parent / "fixtures" / "hf" / "qwen2_moe", tmp_path / "m", "int8", calibration_data=text)
    c = r.calibration
    assert c["tokens"] >= 16 and c["weighted_matrices"] > c["expert_matrices"] - c["unrouted_expert_matrices"]


def test_calibration_reports_its_progress(tmp_path):
    """The forward over the calibration text reports each layer (the CLI prints it with the time
    left), then writing reports bytes as before; Cancel is honoured between layers."""
    import io
    import threading

    from app.cli_convert import _progress_printer
    from engine.convert.convert import convert
    from engine.errors import ConversionCancelled
    text = tmp_path / "cal.txt"
    text.write_text(TEXT.read_text(encoding="utf-8")[:2000], encoding="utf-8")
    seen, out = [], io.StringIO()
    printer = _progress_printer(out)

    def progress(p):
        seen.append(p)
        printer(p)
    convert(PRESET_GGUF / "tiny-q8_0.gguf", tmp_path / "m", "q4_k_m", calibration_data=text, progress=progress)
    cal = [p for p in seen if p.stage == "calibration"]
    layers = cal[0].total_bytes
    assert [p.done_bytes for p in cal] == list(range(1, layers + 1)) and layers >= 2
    assert seen[:layers] == cal and all(p.stage == "write" for p in seen[layers:]) and seen[-1].fraction == 1.0
    assert f"calibration: layer {layers} of {layers} (" in cal[-1].tensor and "tokens)" in cal[-1].tensor
    assert f"calibration: layer {layers} of {layers}" in out.getvalue() and " MB  " in out.getvalue()
    other = tmp_path / "cal2.txt"  # another text: not the calibration this process has kept
    other.write_text(TEXT.read_text(encoding="utf-8")[2000:4000], encoding="utf-8")
    stop = threading.Event()
    with pytest.raises(ConversionCancelled):  # Cancel pressed during the first layer
        convert(PRESET_GGUF / "tiny-q8_0.gguf", tmp_path / "n", "q4_k_m", calibration_data=other,
                progress=lambda p: stop.set(), cancel=stop)
    assert not (tmp_path / "n").exists()


def test_time_left_is_each_stages_own():
    from app.cli_convert import _time_left
    assert _time_left(10, 0.25) == ", 30 s left" and _time_left(60, 0.5) == ", 1 min 0 s left"
    assert _time_left(5, 0) == "" and _time_left(5, 1) == ""


def test_the_wizard_restarts_its_clock_when_writing_follows_calibration(qtbot, tmp_path):
    """The bar runs over the calibration layers, then over the bytes written: the time left of the
    second stage is extrapolated from its own start, not from the calibration's."""
    import gc
    import time as _time

    from ui.wizard import ConvertWizard
    gc.collect()
    w = ConvertWizard(None, tmp_path / "models")
    qtbot.addWidget(w)
    w._started = _time.monotonic() - 100  # 100 s of calibration behind
    w._progress(0.5, "calibration: layer 15 of 30 (5 chunks, 2560 tokens)")
    assert "calibration: layer 15 of 30" in w.tensor_label.text() and "left" in w.tensor_label.text()
    w._progress(1.0, "calibration: layer 30 of 30 (5 chunks, 2560 tokens)")
    before = w._started
    w._progress(0.1, "blk.0.attn_q.weight")
    assert w._started > before + 50 and w.bar.value() == 100
    w.done(0)  # stops the wizard's worker thread (close() of a dialog never shown does not)
    gc.collect()
