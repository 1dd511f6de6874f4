"""Where Colibri keeps the user's things: folders only the user can read."""
from __future__ import annotations

import os
import stat

from app import paths


def test_data_and_cache_folders_are_private_whatever_the_umask(tmp_path, monkeypatch):
    monkeypatch.setenv("COLIBRI_HOME", str(tmp_path / "home"))
    old = os.umask(0o022)  # the usual one: new folders readable by every user of the machine
    try:
        made = [paths.data_dir(), paths.cache_dir(), paths.models_dir()]
    finally:
        os.umask(old)
    for folder in made:
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700, folder
