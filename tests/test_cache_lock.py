"""engine/kernels/cache_lock.py: processes sharing numba's cache folder, on real numba and real files."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("fcntl")  # (without it cache_lock installs nothing)
ROOT = Path(__file__).resolve().parents[1]
ROUNDS = 12

# Each round a fresh module: f is compiled by both racers at once for two signatures (int64 and
# float64, so that the two entries land in one index together), g by both for the same one.
MODULE = '''
from numba import njit


@njit(cache=True)
def f(x):
    return x * 3 + 1


@njit(cache=True)
def g(x):
    return x - 7
'''

# A racer: sys.argv = [modules folder, rounds, "int" | "float"]. numba's index write is slowed down
# so that two unlocked saves overlap nearly every round (each would read the index before the
# other wrote it, and both take data file 1); the locks must make that harmless.
RACER = '''
import importlib, json, os, sys, time
import numpy as np
import engine.kernels
engine.kernels.setup()  # (installs the locks)
from numba.core import caching

folder, rounds, me = sys.argv[1], int(sys.argv[2]), sys.argv[3]
other = "float" if me == "int" else "int"
save_index = caching.IndexDataCacheFile._save_index

def slow_save_index(self, overloads):
    time.sleep(0.03)
    save_index(self, overloads)

caching.IndexDataCacheFile._save_index = slow_save_index

def meet(step):
    open(os.path.join(folder, f"{step}-{me}"), "w").close()
    end = time.monotonic() + 60
    while not os.path.exists(os.path.join(folder, f"{step}-{other}")):
        assert time.monotonic() < end, f"the other racer never reached {step}"
        time.sleep(0.001)

g_compiles = []
for r in range(rounds):
    m = importlib.import_module(f"racy{r}")
    meet(f"f{r}")
    m.f(np.int64(r) if me == "int" else r + 0.5)
    meet(f"g{r}")
    m.g(np.int64(r))
    g_compiles.append(sum(m.g.stats.cache_misses.values()))
print(json.dumps(g_compiles))
'''

# The loader: every signature the racers saved loads from the cache, each with its own code.
LOADER = '''
import importlib, sys
import numpy as np
import engine.kernels
engine.kernels.setup()
from numba import types

bad = []
for r in range(int(sys.argv[1])):
    m = importlib.import_module(f"racy{r}")
    got = (m.f(np.int64(r)), m.f(r + 0.5), m.g(np.int64(r)))
    if got != (3 * r + 1, 3 * (r + 0.5) + 1, r - 7) or type(got[0]) is not int:
        bad.append(f"round {r}: {got}")
    if set(m.f.signatures) != {(types.int64,), (types.float64,)}:
        bad.append(f"round {r}: f signatures {m.f.signatures}")
    for fn in (m.f, m.g):
        if sum(fn.stats.cache_misses.values()):
            bad.append(f"round {r}: {fn.__name__} compiled again (its cache entry was lost)")
print("\\n".join(bad) or "ok")
'''


def _env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("COLIBRI_DOT", "NUMBA_CACHE_DIR")}
    env.update(NUMBA_CACHE_DIR=str(tmp_path / "cache"), COLIBRI_SIMD_BENCH="0",
               PYTHONPATH=os.pathsep.join([str(tmp_path / "modules"), str(ROOT)]))
    return env


def test_two_processes_share_one_cache_folder(tmp_path):
    """Two racers compile into one fresh cache folder at once, round after round: then a third
    process loads every signature with its own code, and of two racers meeting one signature
    only one compiled it (the other waited and loaded it)."""
    modules = tmp_path / "modules"
    modules.mkdir()
    for r in range(ROUNDS):
        (modules / f"racy{r}.py").write_text(MODULE)
    env = _env(tmp_path)
    racers = [subprocess.Popen([sys.executable, "-c", RACER, str(modules), str(ROUNDS), me], env=env, cwd=ROOT,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
              for me in ("int", "float")]
    outs = [p.communicate(timeout=120) for p in racers]
    for p, (_, err) in zip(racers, outs):
        assert p.returncode == 0, err[-3000:]
    g_compiles = [sum(c) for c in zip(*(json.loads(out) for out, _ in outs))]
    assert g_compiles == [1] * ROUNDS, f"g compiled by both racers in some rounds: {g_compiles}"
    loader = subprocess.run([sys.executable, "-c", LOADER, str(ROUNDS)], env=env, cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert loader.returncode == 0, loader.stderr[-3000:]
    assert loader.stdout.strip() == "ok", loader.stdout


def test_installed_once_by_setup():
    """engine.kernels.setup() patches numba (the test suite's, in conftest); installing again wraps
    nothing twice."""
    from numba.core import caching, dispatcher

    from engine.kernels import cache_lock
    assert cache_lock.installed()
    patched = (dispatcher.Dispatcher.compile, caching.IndexDataCacheFile.save, caching.IndexDataCacheFile.load)
    assert all(f.__module__ == "engine.kernels.cache_lock" for f in patched)
    assert cache_lock.install()
    assert (dispatcher.Dispatcher.compile, caching.IndexDataCacheFile.save, caching.IndexDataCacheFile.load) == patched


def test_kernels_cache_in_the_digest_folder_when_numba_was_imported_first(tmp_path):
    """numba reads NUMBA_CACHE_DIR at its own import: a program that imported numba before the
    engine cached the kernels beside their sources, keyed by each file's timestamp only, so an
    edited simd.py left cpu.py's kernels stale (seen in benchmark scripts). The engine points
    numba's settings at the digest folder as well."""
    env = {k: v for k, v in os.environ.items() if k not in ("COLIBRI_DOT", "NUMBA_CACHE_DIR",
                                                            "NUMBA_THREADING_LAYER")}
    env.update(COLIBRI_HOME=str(tmp_path / "home"), COLIBRI_SIMD_BENCH="0")
    code = ("import numba\nimport engine.kernels\nengine.kernels.setup()\nfrom numba.core import config\nfrom engine.kernels import batched\n"
            "print(batched._rows_n._cache._cache_path)\nprint(config.THREADING_LAYER)\n")
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    path, layer = out.stdout.split()
    assert Path(path).is_relative_to(tmp_path / "home" / "cache" / "numba"), path
    assert layer == "threadsafe"
