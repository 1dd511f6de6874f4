"""A guard against a reference-count bug of the Qt binding, on Python before 3.12.

With PySide6 6.12 on Python 3.11 every call of a void method (QLabel.setText, ...) drops one
reference to None (some calls one to True), until the process aborts ("Fatal Python error:
none_dealloc"). `install()` probes for the bug once and, only where it is present, adds 2**40
references to None, True and False, which no session can use up.
"""
from __future__ import annotations

import ctypes
import logging
import sys

log = logging.getLogger("colibri.ui")
_done = False


def leaks_none() -> bool:
    from PySide6.QtCore import QPointF
    p = QPointF()
    before = sys.getrefcount(None)
    for _ in range(64):
        p.setX(1.0)
    return sys.getrefcount(None) < before - 32


def install() -> bool:
    """Compensate once per process if the binding leaks; True when it did."""
    global _done
    if _done or sys.version_info >= (3, 12) or sys.implementation.name != "cpython":
        return False
    _done = True
    if not leaks_none():
        return False
    import PySide6
    for obj in (None, True, False):
        ctypes.c_ssize_t.from_address(id(obj)).value += 1 << 40  # ob_refcnt is a PyObject's first field
    log.warning("PySide6 %s drops references to None on Python %d.%d; compensated (upgrade PySide6 or Python "
                "to remove this guard)", PySide6.__version__, *sys.version_info[:2])
    return True
