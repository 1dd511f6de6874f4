"""Where Colibri keeps the user's things: one data folder (models, chats) and one cache folder.

`COLIBRI_HOME` moves both (tests, portable installs); otherwise platformdirs picks the
platform's usual places (~/.local/share/colibri and ~/.cache/colibri on Linux). Each is created
readable by the user alone (0700), whatever the umask: chats and models are nobody else's.
"""
from __future__ import annotations

import os
from pathlib import Path

import platformdirs

APP = "colibri"


def _private(path: Path) -> Path:
    path.mkdir(mode=0o700, parents=True, exist_ok=True)  # (the umask can only narrow the mode)
    return path


def data_dir() -> Path:
    home = os.environ.get("COLIBRI_HOME")
    return _private(Path(home) / "data" if home else Path(platformdirs.user_data_dir(APP, appauthor=False)))


def cache_dir() -> Path:
    home = os.environ.get("COLIBRI_HOME")
    return _private(Path(home) / "cache" if home else Path(platformdirs.user_cache_dir(APP, appauthor=False)))


def models_dir() -> Path:
    return _private(data_dir() / "models")
