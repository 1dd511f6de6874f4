"""Installed models: the folder of converted models in the user's data folder.

The default model is converted there on first run. Each model converted from a file or folder is
recorded in the library's index (`.sources.json`: folder name -> the source's path, size and time),
so two sources with one file name get two folders, and importing a source again finds its model.
"""
from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Callable

from app.paths import models_dir
from engine import default_model
from engine.convert.convert import Progress, convert, recover_replaced
from engine.errors import ModelFormatError
from engine.model_dir import open_model_dir

log = logging.getLogger("colibri.app")

INDEX = ".sources.json"


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
        if p.name.startswith("."):  # the index, partial conversions, a model set aside
            continue
        try:
            open_model_dir(p)
            found.append(p)
        except ModelFormatError:
            continue
    return found


def recover(folder: Path | None = None) -> list[Path]:
    """At start: put back the models an interrupted replacement had set aside (see
    engine.convert.recover_replaced); logged, and returned for the caller to say."""
    return recover_replaced(folder or models_dir())


def _identity(source: Path) -> dict:
    st = source.stat()
    return {"source": str(source.resolve()), "size": st.st_size, "mtime": st.st_mtime}


def _index(folder: Path) -> dict[str, dict]:
    try:
        doc = json.loads((folder / INDEX).read_text())
        return doc if isinstance(doc, dict) else {}
    except (OSError, ValueError):
        return {}


def source_of(folder: Path, name: str) -> str | None:
    """The source a library model was converted from, when the index knows it."""
    entry = _index(folder).get(name)
    return entry.get("source") if isinstance(entry, dict) else None


def record_source(model: Path, source: str | Path) -> None:
    """Remember which source `model` (a folder in the library) was converted from."""
    model, source = Path(model), Path(source)
    doc = _index(model.parent)
    doc[model.name] = _identity(source)
    tmp = model.parent / (INDEX + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1))
    os.replace(tmp, model.parent / INDEX)


def library_name(folder: Path, source: str | Path, base: str) -> str:
    """A folder name for `source` in the library: `base`, unless another source's model holds it."""
    source = Path(source).resolve()
    index = _index(folder)

    def free(name: str) -> bool:
        entry = index.get(name)
        if isinstance(entry, dict) and entry.get("source") == str(source):
            return True  # this source's own model (to reuse or to replace)
        return not (folder / name).exists() and name not in index
    parent = source.parent.name
    for name in [base, f"{base}-{parent}" if parent else None, *(f"{base}-{i}" for i in range(2, 1000))]:
        if name and free(name):
            return name
    raise FileExistsError(f"{folder}: no free name for {base}")


def converted_from(folder: Path, source: str | Path) -> Path | None:
    """The library model converted from this very source (same path, size and time), if whole."""
    ident = _identity(Path(source))
    for name, entry in _index(folder).items():
        if entry == ident:
            try:
                open_model_dir(folder / name)
                return folder / name
            except ModelFormatError:
                return None
    return None
