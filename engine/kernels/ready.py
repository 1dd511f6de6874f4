"""Imported first by every module that compiles with numba: fails unless engine.kernels.setup() ran
in this process (why a failure and not a silent setup: engine.kernels)."""
from engine import kernels

if kernels.SIMD is None:
    raise RuntimeError("engine.kernels.setup() must run before a module that compiles is imported: numba's "
                       "cache folder, target and dot-product path are fixed then (every colibri command and "
                       "Engine() do it; code that imports engine modules below engine.api: `from engine import "
                       "kernels; kernels.setup()` first)")
