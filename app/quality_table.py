"""The measured quality cost of each conversion choice, for the wizard (data: colibri-bench quality).

The table (app/bench/results/quality.json) holds one model's figures, the default model's, against
its f16: a guide to the relative cost of the choices, not a promise for another model.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

RESULTS = Path(__file__).parent / "bench" / "results" / "quality.json"


def expected_cost(quantize: str, calibrated: bool = False, path: Path = RESULTS) -> dict | None:
    """The measured cost of one converter choice (ΔPPL %, mean KL, top-1 agreement %, size MB), or
    None without a row for it."""
    try:
        rows = json.loads(path.read_text(encoding="utf-8"))["rows"]
    except (OSError, ValueError, KeyError):
        return None
    for r in rows:
        if r.get("by") == "colibri" and r.get("format") == quantize and r.get("calibrated") == calibrated:
            return {k: r[k] for k in ("delta_ppl_pct", "kld_mean", "same_top_pct", "size_mb")}
    return None


def measured_on(path: Path = RESULTS) -> dict | None:
    """Which model and text the table was measured on (for the wizard's "one model's figures" note):
    {"model", "source_format" (the storage format of the model the rows were converted from, as its
    file name says, e.g. "q4_1"; "" when the name does not say), "positions"}; None without a table."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        model, rows = str(data["model"]), data["rows"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    fmt = re.search(r"\.((?:I?Q\d\w*)|F16|BF16|F32)\.gguf$", model, re.IGNORECASE)
    positions = next((r.get("positions") for r in rows if r.get("positions")), 0)
    return {"model": model, "source_format": fmt.group(1).lower() if fmt else "", "positions": positions}


def already_stored(quantize: str, path: Path = RESULTS) -> bool:
    """Whether the table's model was stored in `quantize`'s own format before it was measured (its
    Q4_1 GGUF for int4): then the row shows no loss, which a 16-bit source would not."""
    from engine import quant
    table = measured_on(path)
    target = quant.TARGETS.get(quantize)
    return bool(table and table["source_format"] and target is not None and table["source_format"] == str(target))
