"""colibri-bench fuzz: mutated files are opened or refused with a ColibriError, never a crash."""
from __future__ import annotations

import json

import pytest
from conftest import HF_FIXTURES, TESTS

from app.bench import fuzz as bench_fuzz
from app.bench.cli import main
from engine import errors
from engine.convert.tokenizer_import import from_gguf_fields

TINY = TESTS / "fixtures" / "llamacpp_presets" / "tiny-q4_0.gguf"


def cap_gb(headroom: float = 4.0) -> float:
    """The cases' address-space cap: `headroom` GB above what this process maps already. A forked
    case inherits the test process's mappings, and a pytest-xdist worker that ran the kernel tests
    first maps over 4 GB (numba, OpenMP stacks, malloc arenas): an absolute 4 GB cap, the command's
    default for its own small process, failed every mmap of a case there."""
    import psutil
    return psutil.Process().memory_info().vms / 2 ** 30 + headroom


def test_fuzz_command_reports_no_crash_and_no_hang(tmp_path, capsys):
    out = tmp_path / "fuzz.json"
    code = main(["fuzz", "--files", f"{TINY},{HF_FIXTURES / 'llama'}", "--seconds", "600", "--cases", "60",
                 "--seed", "3", "--memory_cap_gb", f"{cap_gb():.3f}", "--json", str(out)])
    report = json.loads(out.read_text())
    assert code == 0 and report["cases"] == 60, report
    assert report["crashes"] == [] and report["hangs"] == []
    assert sum(report["refused"].values()) > 0  # the mutations do reach the checks
    assert "0 crashes, 0 hangs" in capsys.readouterr().out


def test_a_case_is_classified(tmp_path, monkeypatch):
    """The child's outcome: opened, refused (a ColibriError), crash (another exception) or hang."""
    cap = int(cap_gb() * 2 ** 30)
    assert bench_fuzz.run_case(TINY, 60, cap)[0] == "opened"
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + bytes(40))
    assert bench_fuzz.run_case(bad, 60, cap)[0] == "refused"
    monkeypatch.setattr(bench_fuzz, "_target", lambda p: [][1])
    outcome, detail = bench_fuzz.run_case(TINY, 60, cap)
    assert outcome == "crash" and detail.startswith("IndexError")
    monkeypatch.setattr(bench_fuzz, "_target", lambda p: __import__("time").sleep(30))
    assert bench_fuzz.run_case(TINY, 0.5, cap)[0] == "hang"


@pytest.mark.parametrize("scaling,match", [
    ({"rope_type": "llama3", "factor": 0, "original_max_position_embeddings": 32}, "rope_scaling.factor = 0"),
    ({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 4.0, "high_freq_factor": 4.0,
      "original_max_position_embeddings": 32}, "low_freq_factor must be below high_freq_factor"),
    ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": -1}, "original_max_position_embeddings = -1"),
])
def test_rope_scaling_that_would_divide_by_zero_is_named(tmp_path, scaling, match):
    """Found by the fuzzer: a llama3 rope factor of 0 was a ZeroDivisionError."""
    import shutil

    from engine.convert.convert import convert
    folder = tmp_path / "hf"
    shutil.copytree(HF_FIXTURES / "llama", folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["rope_scaling"] = scaling
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(errors.ConfigError, match=match):
        convert(folder, tmp_path / "out")


@pytest.mark.parametrize("merges", [["Ā e"], ["nospace"], [3]])
def test_gguf_merges_that_do_not_fit_the_vocabulary_are_named(merges):
    fields = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": ["a", "b", "ab"], "tokenizer.ggml.merges": merges}
    with pytest.raises(errors.SourceFormatError, match="tokenizer.ggml"):
        from_gguf_fields(fields, "x.gguf")


def test_server_fuzz_reports_no_crash_no_hang_and_a_prompt_answer(tmp_path, capsys):
    """colibri-bench fuzz --server: hostile clients of a real colibri-serve (the tiny test model),
    every kind of case run; the server still answers a well-formed request within 1 s at the end."""
    out = tmp_path / "fuzz.json"
    code = main(["fuzz", "--server", "--seconds", "600", "--cases", "60", "--seed", "5", "--json", str(out)])
    report = json.loads(out.read_text())
    assert report["crashes"] == [] and report["hangs"] == [], report
    assert code == 0 and report["cases"] == 60 and report["final_s"] < 1.0, report
    seen = report["outcomes"]
    for outcome in ("200", "400", "403", "413", "415", "client gone"):  # the cases reach each defence
        assert seen.get(outcome, 0) > 0, seen
    assert report["stalled_probe_s"] and max(report["stalled_probe_s"]) < 1.0, report
    assert "0 crashes, 0 hangs" in capsys.readouterr().out
