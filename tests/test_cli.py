"""The command-line converter as a user runs it: exit codes, messages, and the model it writes."""
from __future__ import annotations

import subprocess
import sys

from conftest import HF_FIXTURES

from engine.model_dir import open_model_dir


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "app.cli_convert", *args], capture_output=True, text=True)


def test_convert_with_flags(tmp_path):
    out = tmp_path / "mix"
    r = run("--model_path", str(HF_FIXTURES / "mixtral"), "--output_path", str(out), "--quantize", "int4",
            "--split_experts", "--num_experts", "8", "--top_k", "2")
    assert r.returncode == 0, r.stderr
    assert "wrote" in r.stdout and "mixtral, 2 layers, 8 expert(s)" in r.stdout and "q4_1" in r.stdout
    assert "100.0%" in r.stderr  # the progress line reached the end
    m = open_model_dir(out, verify=True)
    assert m.meta["quantization"]["requested"] == "int4" and m.split_experts
    with m.tensor_file("experts/layer_0_expert_0.bin") as f:
        assert f.infos["blk.0.ffn_up.0.weight"].qtype.name == "q4_1x8"  # repacked on disk (the default)


def test_no_repack_experts_writes_the_stored_layout(tmp_path):
    r = run("--model_path", str(HF_FIXTURES / "mixtral"), "--output_path", str(tmp_path / "m"), "--quantize", "int8",
            "--no-repack_experts", "--quiet")
    assert r.returncode == 0, r.stderr
    with open_model_dir(tmp_path / "m", verify=True).tensor_file("experts/layer_1_expert_7.bin") as f:
        assert {i.qtype.name for i in f.infos.values()} == {"q8_0"}


def test_errors_are_one_clear_line(tmp_path):
    out = tmp_path / "o"
    out.mkdir()
    (out / "x").write_text("x")
    r = run("--model_path", str(HF_FIXTURES / "llama"), "--output_path", str(out))
    assert r.returncode == 1
    assert "colibri-convert: error:" in r.stderr and "--force" in r.stderr and "Traceback" not in r.stderr
    r = run("--model_path", str(HF_FIXTURES / "mixtral"), "--output_path", str(tmp_path / "n"), "--num_experts", "3")
    assert r.returncode == 1 and "the source model has 8 experts" in r.stderr
    assert not (tmp_path / "n").exists()


def test_help_and_bad_choice():
    r = run("--help")
    assert r.returncode == 0 and "--quantize" in r.stdout and "--no-split_experts" in r.stdout
    r = run("--model_path", "x", "--output_path", "y", "--quantize", "int3")
    assert r.returncode == 2 and "invalid choice: 'int3'" in r.stderr
