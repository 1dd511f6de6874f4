"""A guard against a reference-count bug of the Qt binding, on Python before 3.12.

Measured here with PySide6 6.12.0 on Python 3.11: every call of a void method (QLabel.setText,
QPen.setWidthF, QPointF.setX, ...) drops one reference to None, and some calls drop one to True.
Python 3.12+ makes those objects immortal, so nothing happens there; on 3.11 the count of None
reaches zero after a few thousand calls and the process aborts with "Fatal Python error:
none_dealloc". A window that redraws plots twice a second (the dashboard: ~500 such calls per
redraw) gets there within seconds; the chat window's status line within minutes.

`install()` probes for the bug once and, only where it is present, adds 2**40 references to None,
True and False, which no session can use up. It changes nothing where the binding is correct.
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
