from __future__ import annotations

import json

from conftest import HF_FIXTURES

from app.bench.cli import main


def test_profile_prefill_splits_a_prompt_token_by_kernel_and_format(tmp_path, capsys):
    """colibri-bench profile --prefill on a tiny MoE: the experts' matrices have rows named with
    their format, the kernels theirs, and the rows add up to the timed prompt."""
    out = tmp_path / "prefill.json"
    code = main(["profile", "--prefill", "--model", str(HF_FIXTURES / "mixtral"), "--threads", "1",
                 "--prompt_tokens", "20", "--workdir", str(tmp_path / "w"), "--json", str(out)])
    assert code == 0
    report = json.loads(out.read_text())
    rows = report["rows"]
    for part in ("attention", "rmsnorm", "python and the rest"):
        assert part in rows, part
    experts = [name for name in rows if name.startswith(("ffn_gate+up ", "ffn_down "))]
    assert experts and all(len(name.split()) == 2 for name in experts), experts  # "<kind> <format>"
    assert any(name.startswith("attn_qkv ") for name in rows)
    total = sum(r["us_per_token"] for r in rows.values())
    assert abs(total - report["timed_us_per_token"]) < 1e-6 * report["timed_us_per_token"]
    assert report["prefill_tok_s"] > 0 and report["cpu_us_per_token"] > 0 and report["prompt_tokens"] == 20
    assert "| attention |" in capsys.readouterr().out
