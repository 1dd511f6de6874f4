"""What the benchmark workers run (speed, fidelity, memory): the interpreter for each engine, the
one for llama.cpp's converter, and Colibri opened as the workers open it. Its top level imports the
standard library only: a worker's interpreter (llama.cpp's binding) may lack Colibri's dependencies."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from app.bench.llamacpp import find_llama_bench

ROOT = Path(__file__).resolve().parents[2]
MODULES = {"colibri": "numba", "colibri-chat": "numba", "llama.cpp": "llama_cpp", "transformers": "transformers"}
VENVS = {"llama.cpp": ".venv-bench", "transformers": ".venv-fixtures"}


def find_python(engine: str, given: str | None) -> tuple[str | None, str]:
    """An interpreter that can import the engine's package, or None and why not."""
    if engine == "llama-bench":
        return find_llama_bench(given)
    candidates = [given] if given else [sys.executable, str(ROOT / VENVS.get(engine, ".venv") / "bin" / "python")]
    for py in candidates:
        if py and Path(py).exists() and subprocess.run([py, "-c", f"import {MODULES[engine]}, numpy"],
                                                       capture_output=True).returncode == 0:
            return py, ""
    return None, f"no interpreter with `{MODULES[engine]}` (tried {', '.join(c for c in candidates if c)})"


def converter_python() -> str:
    """An interpreter with torch for llama.cpp's convert_hf_to_gguf.py: $COLIBRI_CONVERT_PYTHON, this one,
    or .venv-fixtures (the `fixtures` extra)."""
    py, why = find_python("transformers", os.environ.get("COLIBRI_CONVERT_PYTHON"))
    if py is None:
        raise SystemExit(f"convert_hf_to_gguf.py needs torch: {why} (or set COLIBRI_CONVERT_PYTHON)")
    return py


def open_colibri(model: str, threads: int, context: int):
    from engine import kernels
    kernels.setup()  # (a worker process: before engine.api)
    from engine.api import Engine
    from engine.model_dir import open_model_dir
    cfg = open_model_dir(model).config  # every expert resident: this measures kernels, not the cache
    eng = Engine(model, threads=threads, context_length=context,
                 **({"expert_cache_size": cfg.num_experts} if cfg.is_moe else {}))
    eng.warmup()  # loads the compiled kernels (numba cache): part of a real start
    return eng
