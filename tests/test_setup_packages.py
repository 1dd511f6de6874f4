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


def test_a_missing_library_is_named_by_its_debian_package():
    from app import qt_platform as Q
    out = ("\tlinux-vdso.so.1 (0x00007ffd)\n\tlibxcb-cursor.so.0 => not found\n"
           "\tlibxkbcommon-x11.so.0 => not found\n\tlibX11-xcb.so.1 => not found\n"
           "\tlibxcb.so.1 => /lib/x86_64-linux-gnu/libxcb.so.1 (0x00007f)\n")
    libs = Q.missing_libraries(out)
    assert libs == ["libX11-xcb.so.1", "libxcb-cursor.so.0", "libxkbcommon-x11.so.0"]
    assert [Q.debian_package(lib) for lib in libs] == ["libx11-xcb1", "libxcb-cursor0", "libxkbcommon-x11-0"]


@pytest.mark.skipif(not sys.platform.startswith("linux") or shutil.which("dpkg") is None, reason="Debian only")
def test_the_package_names_are_the_ones_that_hold_the_plugins_libraries():
    """Debian's naming rule, held to dpkg: each library the plugin links names the package that holds it."""
    from app import qt_platform as Q
    out = subprocess.run(["ldd", str(Q.xcb_plugin())], capture_output=True, text=True, check=True).stdout
    checked = 0
    for line in out.splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[1] == "=>" and parts[0].startswith("libxcb-") and Path(parts[2]).exists():
            owner = subprocess.run(["dpkg", "-S", str(Path(parts[2]).resolve())], capture_output=True, text=True)
            if owner.returncode == 0:
                assert owner.stdout.split(":")[0] == Q.debian_package(parts[0]), line
                checked += 1
    assert checked >= 5
