"""colibri-bench duel's turns (app.bench.duel.duel): two real child processes, stopped and resumed
by signals, their speeds per slice from their own timestamps."""
from __future__ import annotations

import sys

import pytest

from app.bench.duel import duel

# a side that "decodes" a token every DELAY seconds, as the engines' children do (READY, a line, stamps)
CHILD = """
import sys, time
print("READY", flush=True)
sys.stdin.readline()
with open(sys.argv[1], "w") as out:
    while True:
        time.sleep(DELAY)
        out.write(f"{time.monotonic()}\\n")
        out.flush()
"""


def side(delay: float) -> list[str]:
    return [sys.executable, "-c", CHILD.replace("DELAY", repr(delay))]


def test_each_side_is_timed_only_while_it_runs():
    """One side twice as fast as the other: each pair's ratio near 2, each side's speed near its own
    though it is stopped half the time, and no side goes on while the other runs."""
    out = duel({"fast": side(0.01), "slow": side(0.02)}, slices=3, slice_s=0.4)
    assert out["sides"] == ["fast", "slow"] and len(out["ratios"]) == 3
    assert 1.6 < out["median_ratio"] < 2.4
    assert all(60 < r < 110 for r in out["tok_s"]["fast"]) and all(30 < r < 55 for r in out["tok_s"]["slow"])
    assert all(n <= 2 * 3 for n in out["stray_tokens"].values())  # at most one at each slice's end


def test_a_side_that_fails_to_start_is_named():
    bad = [sys.executable, "-c", "import sys; print('no model here', flush=True); sys.exit(3)"]
    with pytest.raises(RuntimeError, match="slow: no model here"):
        duel({"fast": side(0.01), "slow": bad}, slices=1, slice_s=0.1)


def test_a_side_that_dies_mid_duel_is_named():
    """Its later slices would read as 0 tokens a second: an error instead of a ratio."""
    dies = side(0.01).copy()
    dies[-1] = dies[-1].replace("while True:", "for _ in range(5):")
    with pytest.raises(RuntimeError, match="slow: exited during the duel"):
        duel({"fast": side(0.01), "slow": dies}, slices=2, slice_s=0.3)


def test_each_side_runs_the_code_of_its_own_tree(tmp_path):
    """--baseline: one command, two source trees; each side imports its own tree's module (here
    its pace), so the ratio is that of the two trees' code, not of one tree twice."""
    trees = {}
    for name, delay in (("new", 0.01), ("old", 0.02)):
        trees[name] = tmp_path / name
        trees[name].mkdir()
        (trees[name] / "pace.py").write_text(f"DELAY = {delay}\n")
    child = [sys.executable, "-c", "from pace import DELAY\n" + CHILD]
    out = duel({"new": child, "old": child}, slices=2, slice_s=0.4, trees=trees)
    assert 1.6 < out["median_ratio"] < 2.4
