"""Why the window cannot open, said in plain words before Qt aborts: on a Linux desktop without the
libraries Qt's X11 platform plugin links to, Qt stops the process with a hint that names the wrong
package. The plugin's own library check (ldd) names the missing libraries; each maps to its Debian
package by Debian's naming rule."""
from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys
from pathlib import Path


def xcb_plugin() -> Path:
    import PySide6
    return Path(PySide6.__file__).parent / "Qt" / "plugins" / "platforms" / "libqxcb.so"


def will_use_xcb() -> bool:
    """Whether Qt will load its X11 plugin here (an X display, no other platform asked for)."""
    asked = os.environ.get("QT_QPA_PLATFORM", "")
    return sys.platform.startswith("linux") and bool(os.environ.get("DISPLAY")) and \
        (asked == "xcb" or (not asked and not os.environ.get("WAYLAND_DISPLAY")))


def missing_libraries(ldd_output: str) -> list[str]:
    return sorted({line.split()[0] for line in ldd_output.splitlines() if "not found" in line})


def debian_package(library: str) -> str:
    """libxcb-cursor.so.0 -> libxcb-cursor0, libxkbcommon-x11.so.0 -> libxkbcommon-x11-0 (a dash
    where the name ends in a digit), libX11-xcb.so.1 -> libx11-xcb1."""
    name, _, version = library.partition(".so.")
    major = version.split(".")[0]
    name = name.lower()
    return f"{name}{'-' if major and name[-1].isdigit() else ''}{major}"


def missing_packages() -> list[str]:
    """The Debian packages whose libraries the X11 plugin lacks ([] when it lacks none, or when this
    cannot be told: no X11 plugin in use, no ldd). Only a plugin that fails to load is looked into."""
    plugin = xcb_plugin()
    if not will_use_xcb() or not plugin.is_file():
        return []
    try:  # the usual case: it loads (as Qt is about to load it anyway), and no ldd runs at start-up
        ctypes.CDLL(str(plugin))
        return []
    except OSError:
        pass
    if shutil.which("ldd") is None:
        return []
    try:
        out = subprocess.run(["ldd", str(plugin)], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return sorted({debian_package(lib) for lib in missing_libraries(out)})
