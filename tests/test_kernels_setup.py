"""Importing is free of side effects: engine.kernels.setup() puts numba's settings in place when a
command starts or a program asks, and a kernel imported before it fails with a clear message."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

IMPORTS = """
import os, sys
before = dict(os.environ)
import engine.kernels, engine.kernels.isa, engine.params
import app.gui_main, app.cli_chat, app.cli_serve, app.cli_convert, app.bench.cli
changed = sorted(k for k in set(before) | set(os.environ) if before.get(k) != os.environ.get(k)
                 and k.startswith(("COLIBRI_", "NUMBA_", "OMP_")))  # (PySide6 sets one of its own)
print(changed, "numba" in sys.modules)
import typing
import engine.api  # the Python API's one import: nothing compiled comes with it
typing.get_type_hints(engine.api.StatsSnapshot)  # (the remote path builds blank snapshots from them)
print("numba" in sys.modules, engine.kernels.SIMD)
try:
    import engine.kvcache
except RuntimeError as e:
    print("refused:", e)
try:
    engine.api.Engine(sys.argv[1], simd="avx2")  # no model there: Engine() sets the kernels up first
except Exception as e:
    print(type(e).__name__)
import engine.kvcache
print("after setup:", engine.kernels.SIMD, os.environ["NUMBA_CACHE_DIR"], engine.kernels.SIMD_REQUESTED)
"""


def _env(tmp_path: Path) -> dict[str, str]:
    drop = ("NUMBA_CACHE_DIR", "NUMBA_CPU_NAME", "NUMBA_CPU_FEATURES", "COLIBRI_USER_TARGET", "COLIBRI_DOT",
            "COLIBRI_SIMD")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    return env | {"COLIBRI_HOME": str(tmp_path), "COLIBRI_SIMD_BENCH": "0", "QT_QPA_PLATFORM": "offscreen",
                  "PYTHONPATH": str(ROOT)}


def test_imports_change_nothing_and_the_engine_sets_up_with_its_choices(tmp_path):
    r = subprocess.run([sys.executable, "-c", IMPORTS, str(tmp_path / "no-model")], env=_env(tmp_path), cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = r.stdout.splitlines()
    assert lines[0] == "[] False", lines  # no variable of ours changed, numba not imported
    assert lines[1] == "False None", lines  # engine.api too
    assert lines[2].startswith("refused: engine.kernels.setup() must run before"), lines
    assert lines[3] == "MissingFileError", lines
    simd, cache, asked = lines[4].split()[2:]
    assert simd in ("avx2", "native") and asked == "avx2", lines  # the Engine's own simd choice was set up
    assert Path(cache).is_relative_to(tmp_path / "cache" / "numba"), lines


def test_setup_is_idempotent():
    """The suite's setup (conftest) holds: a second call changes nothing and reports the target."""
    import engine.kernels as k
    cache = os.environ["NUMBA_CACHE_DIR"]
    assert k.setup() == k.SIMD == k.setup("avx512", "generic") and os.environ["NUMBA_CACHE_DIR"] == cache
