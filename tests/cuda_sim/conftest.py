"""These tests need Numba's CUDA simulator, which must be switched on before numba is imported:
tests/test_cuda_sim.py runs this folder in a fresh interpreter with NUMBA_ENABLE_CUDASIM=1. Collected
in the main suite's process (where numba is already loaded for real), they are skipped by design."""
import os

if os.environ.get("NUMBA_ENABLE_CUDASIM") != "1":
    collect_ignore_glob = ["test_*.py"]
