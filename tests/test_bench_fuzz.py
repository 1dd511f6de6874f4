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


def test_fuzz_command_reports_no_crash_and_no_hang(tmp_path, capsys):
    out = tmp_path / "fuzz.json"
    code = main(["fuzz", "--files", f"{TINY},{HF_FIXTURES / 'llama'}", "--seconds", "4", "--seed", "3",
                 "--json", str(out)])
    report = json.loads(out.read_text())
    assert code == 0 and report["cases"] >= 4, report
    assert report["crashes"] == [] and report["hangs"] == []
    assert sum(report["refused"].values()) > 0  # the mutations do reach the checks
    assert "0 crashes, 0 hangs" in capsys.readouterr().out


def test_a_case_is_classified(tmp_path, monkeypatch):
    """The child's outcome: opened, refused (a ColibriError), crash (another exception) or hang."""
    assert bench_fuzz.run_case(TINY, 60, 4 << 30)[0] == "opened"
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + bytes(40))
    assert bench_fuzz.run_case(bad, 60, 4 << 30)[0] == "refused"
    monkeypatch.setattr(bench_fuzz, "_target", lambda p: [][1])
    outcome, detail = bench_fuzz.run_case(TINY, 60, 4 << 30)
    assert outcome == "crash" and detail.startswith("IndexError")
    monkeypatch.setattr(bench_fuzz, "_target", lambda p: __import__("time").sleep(30))
    assert bench_fuzz.run_case(TINY, 0.5, 4 << 30)[0] == "hang"


@pytest.mark.parametrize("merges", [["Ā e"], ["nospace"], [3]])
def test_gguf_merges_that_do_not_fit_the_vocabulary_are_named(merges):
    fields = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": ["a", "b", "ab"], "tokenizer.ggml.merges": merges}
    with pytest.raises(errors.SourceFormatError, match="tokenizer.ggml"):
        from_gguf_fields(fields, "x.gguf")
