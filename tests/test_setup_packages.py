"""The window opens on a fresh Linux desktop: every shared library Qt's X11 platform plugin needs is
there once packaging/setup.sh has run (CI runs it on a clean machine before this test). A missing
one (libxcb-cursor0 since Qt 6.5) used to stop the window with "could not load the Qt platform
plugin xcb" while the offscreen tests passed."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

PySide6 = pytest.importorskip("PySide6")
PLUGIN = Path(PySide6.__file__).parent / "Qt" / "plugins" / "platforms" / "libqxcb.so"


@pytest.mark.skipif(not sys.platform.startswith("linux") or shutil.which("ldd") is None, reason="Linux only (ldd)")
def test_qts_x11_plugin_finds_every_library_it_needs():
    assert PLUGIN.is_file(), PLUGIN
    out = subprocess.run(["ldd", str(PLUGIN)], capture_output=True, text=True, check=True).stdout
    missing = [line.split()[0] for line in out.splitlines() if "not found" in line]
    assert not missing, f"install the Debian packages that provide {missing} (packaging/setup.sh SYSTEM_PACKAGES)"
