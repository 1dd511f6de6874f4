"""Installed models: the folder of converted models in the user's data folder.

The default model is converted there on first run; later runs find it already valid.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

from app.paths import models_dir
from engine import default_model
from engine.convert.convert import Progress, convert
from engine.errors import ModelFormatError
from engine.model_dir import open_model_dir


def default_model_dir() -> Path:
    return models_dir() / default_model.NAME


def ensure_default_model(progress: Callable[[Progress], None] | None = None,
                         cancel: Callable[[], bool] | None = None) -> Path:
    """The converted default model, converting it first if it is missing or damaged."""
    target = default_model_dir()
    try:
        open_model_dir(target)
        return target
    except ModelFormatError:
        pass
    convert(default_model.default_gguf_path(), target, "keep", force=True, progress=progress, cancel=cancel)
    return target


def first_valid(candidates: list[str]) -> str:
    """The first candidate that is a model directory opening cleanly (cheap checks), or ""."""
    for c in candidates:
        try:
            open_model_dir(c)
            return c
        except (ModelFormatError, OSError):
            continue
    return ""


def installed_models() -> list[Path]:
    """Model directories in the library that open cleanly (cheap checks, no checksums)."""
    found = []
    for p in sorted(models_dir().iterdir()):
        try:
            open_model_dir(p)
            found.append(p)
        except ModelFormatError:
            continue
    return found
