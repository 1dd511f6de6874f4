"""Runs tests/cuda_sim/ (the CUDA kernels and the GPU hook under Numba's CUDA simulator) in a fresh
interpreter: NUMBA_ENABLE_CUDASIM must be set before numba is imported, and this process has
imported it already. A failure inside fails this test, with the inner output."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytest.importorskip("numba.cuda", reason="numba-cuda is not installed (the `gpu` extra)")


def test_cuda_kernels_under_simulator(tmp_path):
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "1", "COLIBRI_HOME": str(tmp_path)}
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
                        str(ROOT / "tests" / "cuda_sim")], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=300)
    tail = (r.stdout + r.stderr)[-6000:]
    assert r.returncode == 0, f"simulator tests failed (exit {r.returncode}):\n{tail}"
    summary = [ln for ln in r.stdout.splitlines() if ln.strip()][-1]
    assert " passed" in summary and "skipped" not in summary, tail
