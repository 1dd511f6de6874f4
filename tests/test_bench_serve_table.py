"""colibri-bench serve's block of docs/bench/serve.md comes from its saved JSON: every level's figures, the
ratios to llama-server, grouping and the soak; the stale block is replaced and the rest of the page kept."""
from __future__ import annotations

from app.bench import serve_table


def level(tok_s, p50=0.1, p99=0.2, errors=0, lost=0, garbled=0):
    return {"clients": 1, "requests": 2, "seconds": 1.0, "completion_tokens": 64, "tok_s": tok_s, "ttft_p50_s": p50,
            "ttft_p99_s": p99, "errors": errors, "lost": lost, "garbled": garbled, "first_errors": []}


REPORT = {"gguf": "/x/SmolLM2-135M-Instruct.Q4_1.gguf", "max_tokens": 32, "temperature": 0.7, "threads": 2,
          "requests": 2, "machine": {"cpu": "Test CPU", "flags": ["avx2", "fma"], "physical_cores": 2,
                                     "logical_cpus": 2, "memory_gb": 8.0},
          "levels": {"1": {"colibri": level(40.0), "llama": level(80.0)},
                     "8": {"colibri": level(120.0, garbled=1), "llama": level(100.0)},
                     "16": {"colibri": level(130.0, p99=None)}},
          "expert_grouping": {"model": "/m/mix-Q4_0", "clients": 8, "steps": 9, "grouped_mb_per_step": 100.0,
                              "ungrouped_mb_per_step": 230.0, "ratio": 2.3},
          "soak_colibri": {"requests": 1000, "errors": 0, "lost": 0, "rss_start_mb": 350.0, "rss_after_50_mb": 360.0,
                           "rss_end_mb": 358.2, "growth_after_50_pct": -0.5}}


def test_the_block_is_made_from_the_json_and_replaces_the_stale_one(tmp_path):
    readme = tmp_path / "serve.md"
    readme.write_text("# X\n\n<!-- colibri-bench serve: begin (old) -->\nstale 21.8 tok/s\n"
                      "<!-- colibri-bench serve: end -->\n\nafter\n")
    serve_table.write_readme(REPORT, readme, "app/bench/results/serve.json")
    text = readme.read_text()
    assert "stale" not in text and text.startswith("# X\n\n<!-- colibri-bench serve: begin (generated from "
                                                   "app/bench/results/serve.json; do not edit) -->")
    assert text.endswith("<!-- colibri-bench serve: end -->\n\nafter\n")
    assert "| 1 | 40.0 | 100 / 200 | 80.0 | 100 / 200 | 0.50× | 0, 0, 0 |" in text
    assert "| 8 | 120.0 | 100 / 200 | 100.0 | 100 / 200 | 1.20× | 0, 0, 1 |" in text
    assert "| 16 | 130.0 | 100 / — | — | — | — | 0, 0, 0 |" in text  # llama-server not run at 16
    assert "8 clients / 1: 3.00×" in text and "16 clients / 1: 3.25×" in text
    assert "100.0 MB grouped against 230.0 MB" in text and "(2.30×" in text
    assert "RSS 360.0 MB after 50, 358.2 MB at the end (-0.5%)" in text and "Test CPU" in text


def test_a_page_without_the_markers_is_refused(tmp_path):
    import pytest
    readme = tmp_path / "serve.md"
    readme.write_text("# no block\n")
    with pytest.raises(SystemExit, match="no generated serve block"):
        serve_table.write_readme(REPORT, readme, "r.json")
    assert readme.read_text() == "# no block\n"


def test_rounds_give_each_level_its_median_round_and_the_round_by_round_ratios():
    from app.bench.serve import LoadResult, _median_round
    runs = [LoadResult(8, 32, 1.0, 400, tok, 0.02, 0.09, errors, 0, 0, [f"e{tok:.0f}"] * errors)
            for tok, errors in ((300.0, 0), (450.0, 1), (400.0, 0))]
    level8 = _median_round(runs)
    assert level8["tok_s"] == 400.0 and level8["errors"] == 1 and level8["first_errors"] == ["e450"]
    assert level8["rounds_tok_s"] == [300.0, 450.0, 400.0]
    level1 = level(150.0) | {"rounds_tok_s": [100.0, 150.0, 200.0]}
    text = serve_table.markdown(REPORT | {"rounds": 3, "levels": {"1": {"colibri": level1}, "8": {"colibri": level8}}})
    assert "each level's median of 3 rounds" in text
    assert "8 clients / 1: 2.67× (round by round: 3.00, 3.00, 2.00)" in text
