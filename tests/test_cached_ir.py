"""Kernels loaded from numba's cache hold their LLVM IR as bytes (engine.kernels.cached_ir), and a
function compiled later that calls one still links it: in fresh processes over one cache folder."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

MODULE = '''
import numba

@numba.njit(cache=True)
def callee(x):
    return 3 * x + 1
'''

# First run: callee compiled and cached. Second run: callee loaded from the cache (no live IR module),
# then a function compiled now calls it (numba links callee's IR into it: parsed again on demand).
RUN = '''
import sys
import engine.kernels
engine.kernels.setup()  # (installs cached_ir)
import numba
import numpy as np
from engine.kernels import cached_ir
import lazy_callee as m

assert cached_ir.installed()
assert m.callee(np.int64(4)) == 13
library = m.callee.overloads[m.callee.signatures[0]].library
loaded = sum(m.callee.stats.cache_hits.values()) == 1
if loaded:
    assert library._shared_module is None and library._colibri_bitcode, "the IR module was kept live"

@numba.njit
def caller(x):
    return m.callee(x) * 2

assert caller(np.int64(5)) == 32
if loaded:
    assert library._shared_module is not None, "linking did not parse the kept bitcode"
print("loaded" if loaded else "compiled")
'''


def test_cached_kernel_loads_without_ir_and_still_links(tmp_path):
    modules = tmp_path / "modules"
    modules.mkdir()
    (modules / "lazy_callee.py").write_text(MODULE)
    env = {k: v for k, v in os.environ.items() if k not in ("COLIBRI_DOT", "NUMBA_CACHE_DIR")}
    env.update(NUMBA_CACHE_DIR=str(tmp_path / "cache"), COLIBRI_SIMD_BENCH="0",
               PYTHONPATH=os.pathsep.join([str(modules), str(ROOT)]))
    seen = []
    for _ in range(2):
        p = subprocess.run([sys.executable, "-c", RUN], env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stderr[-3000:]
        seen.append(p.stdout.strip())
    assert seen == ["compiled", "loaded"]


def test_installed_once():
    from numba.core import codegen

    from engine.kernels import cached_ir
    assert cached_ir.installed()
    patched = (codegen.CPUCodeLibrary._unserialize, codegen.CPUCodeLibrary._get_module_for_linking)
    assert cached_ir.install()
    assert (codegen.CPUCodeLibrary._unserialize, codegen.CPUCodeLibrary._get_module_for_linking) == patched
