"""The measured quality cost of each conversion choice, for the wizard (data: colibri-bench quality).

The table (app/bench/results/quality.json) holds one model's figures, the default model's, against
its f16: a guide to the relative cost of the choices, not a promise for another model.
"""
from __future__ import annotations

import json
from pathlib import Path

RESULTS = Path(__file__).parent / "bench" / "results" / "quality.json"


def expected_cost(quantize: str, calibrated: bool = False, path: Path = RESULTS) -> dict | None:
    """The measured cost of one converter choice (ΔPPL %, mean KL, top-1 agreement %, size MB), or
    None where the table has no row for it (keep, f16: no rounding beyond the source's)."""
    try:
        rows = json.loads(path.read_text(encoding="utf-8"))["rows"]
    except (OSError, ValueError, KeyError):
        return None
    for r in rows:
        if r.get("by") == "colibri" and r.get("format") == quantize and r.get("calibrated") == calibrated:
            return {k: r[k] for k in ("delta_ppl_pct", "kld_mean", "same_top_pct", "size_mb")}
    return None
