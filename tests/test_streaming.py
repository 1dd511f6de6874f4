"""Conversion streams: peak memory stays below 3 × the largest tensor + 300 MB, whatever the size."""
from __future__ import annotations

from app.bench.models import MixtralShape, write_checkpoint
from app.bench.cli import measure_conversion
from engine.model_dir import open_model_dir


def test_peak_rss_is_bounded_for_a_model_larger_than_the_bound(tmp_path):
    shape = MixtralShape(hidden=512, layers=20, heads=8, kv_heads=2, experts=8, ff=1024, vocab=8000)
    src = write_checkpoint(tmp_path / "src", shape)
    r = measure_conversion(src, tmp_path / "out", "int8")
    assert r["source_mb"] > 1.4 * r["rss_bound_mb"], "the model must not fit under the bound, or this proves nothing"
    assert r["peak_rss_mb"] < r["rss_bound_mb"], r
    model = open_model_dir(tmp_path / "out")
    assert model.config.num_layers == 20 and model.config.num_experts == 8
