"""colibri-bench speed: a quick smoke run on a tiny model (figures are printed, never asserted)."""
from __future__ import annotations

import json

from conftest import HF_FIXTURES

from app import bench_speed
from app.cli_bench import main


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
