"""colibri-bench make-scale: the preset mix against the real llama-quantize, the written file read back
by the gguf package and by Colibri's own reader, and the routing entropy it reports."""
from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest

from app.bench import scale_models as S
from app.bench.llamacpp import find_llama_cpp
from engine import quant


def tiny(layers: int, experts: int, top_k: int = 2) -> S.MoeShape:
    """qwen3moe with every row length a multiple of 256 (no fallback rule fires)."""
    return S.MoeShape("qwen3moe", layers=layers, hidden=256, heads=2, kv_heads=1, head_dim=128, experts=experts,
                      expert_rows=256, top_k=top_k, vocab=512, rope_theta=1e6, rms_eps=1e-6, context=4096)


@pytest.mark.parametrize("layers,experts", [(5, 8), (12, 16), (48, 2)])
def test_plan_matches_llama_quantize(tmp_path, layers, experts):
    """An f16 file of the same architecture through llama-quantize Q4_K_M: every tensor in the type the
    maker plans. 8 experts fire llama.cpp's 8-expert rules; 12 and 48 layers its use_more_bits pattern
    (48: Qwen3-30B-A3B's count)."""
    tools, why = find_llama_cpp()
    if tools is None:
        pytest.skip(why)
    s = tiny(layers, experts)
    src, dst = tmp_path / "f16.gguf", tmp_path / "q4_k_m.gguf"
    S.make(s, "F16", src)
    proc = subprocess.run([str(tools / "build/bin/llama-quantize"), str(src), str(dst), "Q4_K_M", "1"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    from gguf import GGUFReader
    got = {t.name: t.tensor_type.name.lower() for t in GGUFReader(dst).tensors}
    want = {t.name: t.qtype for t in S.plan(s, "Q4_K_M")}
    assert got == want, {n: (got.get(n), want.get(n)) for n in got.keys() | want.keys() if got.get(n) != want.get(n)}
    assert {"q4_k", "q6_k", "f32"} <= set(want.values())


def test_written_file_reads_back(tmp_path):
    """Both readers see the planned names, types and shapes; the data is sane: finite, each matrix at
    about 1/sqrt(fan-in), norms of ones, router rows of unit norm."""
    from gguf import GGUFReader

    from engine.convert.gguf_file import GGUFModel
    s = tiny(3, 16, top_k=4)
    out = tmp_path / "m.gguf"
    info = S.make(s, "Q4_K_M", out)
    planned = S.plan(s, "Q4_K_M")
    assert info["file_bytes"] == out.stat().st_size and info["tensor_bytes"] == sum(t.nbytes for t in planned)
    r = GGUFReader(out)
    assert [(t.name, t.tensor_type.name.lower(), tuple(int(d) for d in reversed(t.shape))) for t in r.tensors] == \
        [(t.name, t.qtype, t.shape) for t in planned]
    m = GGUFModel(out)
    try:
        assert {n: (t.shape, t.qtype.name) for n, t in m.tensors.items()} == {t.name: (t.shape, t.qtype) for t in planned}
        cfg = m.config()
        assert (cfg.num_layers, cfg.num_experts, cfg.top_k, cfg.vocab_size) == (3, 16, 4, 512)
    finally:
        m.close()
    for t in r.tensors:
        x = quant.dequantize(np.asarray(t.data), quant.get(int(t.tensor_type))).astype(np.float32)
        assert np.isfinite(x).all(), t.name
        if "norm" in t.name:
            assert (x == 1).all(), t.name
        elif "gate_inp" in t.name:
            assert np.allclose(np.linalg.norm(x, axis=-1), 1, atol=1e-5)
        else:
            assert abs(x.std() * np.sqrt(x.shape[-1]) - 1) < 0.15, (t.name, x.std())


def test_routing_entropy_sees_balance_and_collapse(tmp_path):
    """Balanced routers route near-uniformly; the same file with one layer's router zeroed (every
    token ties, and the ties go to the first top_k experts) reads as collapsed in that layer alone."""
    from gguf import GGUFReader
    s = tiny(2, 16, top_k=2)
    out = tmp_path / "m.gguf"
    S.make(s, "Q4_K_M", out)
    ent = S.routing_entropy(out, tokens=512)
    assert len(ent["per_layer"]) == 2 and ent["min"] > 0.95, ent
    router = next(t for t in GGUFReader(out, "r+").tensors if t.name == "blk.1.ffn_gate_inp.weight").data
    router[:] = 0
    collapsed = S.routing_entropy(out, tokens=512)
    assert collapsed["per_layer"][0] == ent["per_layer"][0]
    assert collapsed["per_layer"][1] == round(np.log(2) / np.log(16), 4) and collapsed["max_share"][1] == 8


def test_full_size_figures_match_the_published_model():
    """Qwen3-30B-A3B: 30.5 B parameters, 3.3 B active (its model card); llama.cpp's Q4_K_M of it holds
    579 tensors and 17.2 GiB of weights (llama.cpp's loader log of it, ollama/ollama#10458)."""
    full = S.totals(S.SHAPES["qwen3-30b-a3b"], "Q4_K_M")
    assert 30.3e9 < full["params"] < 30.7e9 and 3.2e9 < full["active_params"] < 3.5e9, full
    assert 17.15 < full["tensor_bytes"] / 2**30 < 17.35, full
    assert len(S.plan(S.SHAPES["qwen3-30b-a3b"], "Q4_K_M")) == 579


def test_vocab_and_bad_input():
    tokens, types, merges = S.vocab(70000)
    assert len(tokens) == len(set(tokens)) == len(types) == 70000 and tokens[-3:] == list(S.SPECIALS)
    assert all(" " in m and m.replace(" ", "") in tokens for m in merges[:100])
    with pytest.raises(ValueError, match="preset"):
        S.plan(tiny(2, 4), "Q3_K_XL")
    with pytest.raises(ValueError, match="qwen3moe"):
        S.plan(S.MoeShape("gpt-oss", 1, 256, 1, 1, 256, 4, 256, 2, 512, 1e4, 1e-5, 4096), "Q4_K_M")


def test_cli_writes_and_reports(tmp_path, monkeypatch, capsys):
    """`colibri-bench make-scale` prints the full-size figures, writes the reduced file and the JSON."""
    import json

    from app.bench import cli
    monkeypatch.setitem(S.SHAPES, "tiny", tiny(2, 8))
    out, js = tmp_path / "t.gguf", tmp_path / "t.json"
    assert cli.main(["make-scale", "--shape", "tiny", "--layers", "1", "--out", str(out), "--json", str(js),
                     "--entropy_tokens", "64"]) == 0
    result = json.loads(js.read_text())
    assert result["layers"] == 1 and result["full"]["layers"] == 2 and out.stat().st_size == result["file_bytes"]
    assert len(result["routing_entropy"]["per_layer"]) == 1
    assert "full size (2 layers)" in capsys.readouterr().out
    assert cli.main(["make-scale", "--measure", str(out), "--entropy_tokens", "64", "--json", str(js)]) == 0
    assert json.loads(js.read_text())["routing_entropy"]["per_layer"] == result["routing_entropy"]["per_layer"]
    assert "layer 0: routing entropy" in capsys.readouterr().out


def test_routing_measure_refuses_other_architectures():
    other = Path(__file__).parent / "fixtures" / "llamacpp_presets" / "tiny-q8_0.gguf"
    with pytest.raises(ValueError, match="qwen3moe"):
        S.routing_entropy(other, tokens=8)
