"""Compute kernels: Numba (cpu.py) with a numpy twin of each (reference.py).

Numba's settings must be in place before it is first imported: the compiled-kernel cache goes to
the user's cache folder (so a read-only install still caches), and the threading layer must be
one that is safe when two Python threads run kernels at once (missing → a loud error, never a
silent fallback that crashes under threads).
"""
from __future__ import annotations

import os

import platformdirs

if "NUMBA_CACHE_DIR" not in os.environ:
    home = os.environ.get("COLIBRI_HOME")
    base = os.path.join(home, "cache") if home else platformdirs.user_cache_dir("colibri", appauthor=False)
    os.environ["NUMBA_CACHE_DIR"] = os.path.join(base, "numba")
os.environ.setdefault("NUMBA_THREADING_LAYER", "threadsafe")
