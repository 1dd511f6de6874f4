"""colibri-bench speed: a quick smoke run on a tiny model (figures are printed, never asserted)."""
from __future__ import annotations

import json

from conftest import HF_FIXTURES

from app.bench import speed as bench_speed
from app.bench.cli import main


def test_speed_command_writes_every_figure(tmp_path, capsys):
    out = tmp_path / "speed.json"
    # an HF folder: llama.cpp (GGUF only) is skipped with its reason; transformers is left out for time
    code = main(["speed", "--model", str(HF_FIXTURES / "llama"), "--engines", "colibri,llama.cpp", "--threads", "1",
                 "--runs", "1", "--prompt_tokens", "8", "--gen_tokens", "4", "--workdir", str(tmp_path / "w"),
                 "--json", str(out)])
    assert code == 0
    report = json.loads(out.read_text())
    assert report["bandwidth_gb_s"] > 0 and report["weight_bytes_per_token"] > 0
    assert "llama.cpp" in report["skipped"] and "GGUF" in report["skipped"]["llama.cpp"]
    (row,) = report["results"]
    assert row["engine"] == "colibri" and row["threads"] == 1
    for key in ("decode_tok_s", "prefill_tok_s", "ttft_s", "load_s", "peak_rss_mb", "bandwidth_fraction"):
        assert row[key] > 0, key
    assert "| colibri | 1 |" in capsys.readouterr().out


def test_missing_interpreter_is_reported_not_fatal(tmp_path):
    py, why = bench_speed.find_python("llama.cpp", str(tmp_path / "no-python"))
    assert py is None and "llama_cpp" in why


def test_several_models_in_one_run(tmp_path, capsys):
    out = tmp_path / "speed.json"
    models = f"{HF_FIXTURES / 'llama'},{HF_FIXTURES / 'mixtral'}"
    code = main(["speed", "--model", models, "--engines", "colibri", "--threads", "1,2", "--runs", "1",
                 "--prompt_tokens", "8", "--gen_tokens", "4", "--workdir", str(tmp_path / "w"), "--json", str(out)])
    assert code == 0
    report = json.loads(out.read_text())
    assert [m["name"] for m in report["models"]] == ["llama", "mixtral"]
    assert {(r["model"], r["threads"]) for r in report["results"]} == {(m, t) for m in ("llama", "mixtral") for t in (1, 2)}
    assert set(report["bandwidth_by_threads_gb_s"]) >= {"1"} and report["bandwidth_gb_s"] > 0
    probes = report["bandwidth_probes_gb_s"]  # before the first model and after each: the best is the limit
    assert len(probes) == 3 and report["bandwidth_gb_s"] == max(probes)
    for r in report["results"]:
        m = next(m for m in report["models"] if m["name"] == r["model"])
        assert abs(r["bandwidth_fraction"] - r["decode_tok_s"] * m["weight_bytes_per_token"] / max(probes) / 1e9) < 1e-9
    assert all("colibri" in m["decode_scaling_vs_1_thread"] for m in report["models"])
    text = capsys.readouterr().out
    assert text.count("| colibri | 2 |") == 2 and "decode scaling 1 → 2 threads" in text


def test_unknown_model_name_is_refused(tmp_path):
    import pytest
    with pytest.raises(SystemExit, match="moe-q8_0"):
        main(["speed", "--model", "no-such-model", "--workdir", str(tmp_path)])


def test_profile_splits_a_token_by_tensor(tmp_path, capsys):
    """colibri-bench profile on a tiny MoE: each tensor group and kernel has a row, and the rows
    add up to the timed token."""
    out = tmp_path / "profile.json"
    code = main(["profile", "--model", str(HF_FIXTURES / "mixtral"), "--threads", "1", "--prompt_tokens", "4",
                 "--tokens", "3", "--workdir", str(tmp_path / "w"), "--json", str(out)])
    assert code == 0
    report = json.loads(out.read_text())
    rows = report["rows"]
    experts = "experts (gate, up, down: one call per layer)"
    for part in ("attn_qkv", "attn_output", experts, "ffn_gate_inp (router)", "output", "attention",
                 "python and the rest"):
        assert part in rows, part
    assert rows[experts]["calls_per_token"] == 2  # 2 layers, their top-2 experts in one call each
    total = sum(r["ms_per_token"] for r in rows.values())
    assert abs(total - report["timed_ms_per_token"]) < 1e-6 and report["untimed_ms_per_token"] > 0
    # every expert resident: decoded tokens took the one-call kernel, which is timed apart
    assert 0 < report["fused_kernel_ms_per_token"] < report["untimed_ms_per_token"]
    assert report["layered_ms_per_token"] > 0
    assert "| attn_output |" in capsys.readouterr().out
