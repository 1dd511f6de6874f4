"""Where Colibri keeps the user's things: one data folder (models, chats) and one cache folder.

`COLIBRI_HOME` moves both (tests, portable installs); otherwise platformdirs picks the
platform's usual places (~/.local/share/colibri and ~/.cache/colibri on Linux).
"""
from __future__ import annotations

import os
from pathlib import Path

import platformdirs

APP = "colibri"


def _made(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def data_dir() -> Path:
    home = os.environ.get("COLIBRI_HOME")
    return _made(Path(home) / "data" if home else Path(platformdirs.user_data_dir(APP, appauthor=False)))


def cache_dir() -> Path:
    home = os.environ.get("COLIBRI_HOME")
    return _made(Path(home) / "cache" if home else Path(platformdirs.user_cache_dir(APP, appauthor=False)))


def models_dir() -> Path:
    return _made(data_dir() / "models")
