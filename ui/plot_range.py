"""How the dashboard's plots behave: no keyboard focus, and y ranges with round ends that do not
follow every new figure."""
from __future__ import annotations

import math

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt


def no_focus(plot: pg.PlotWidget) -> None:
    """A plot is a picture, mouse and keys off: Tab passes it by (its figures are in the caption below)."""
    plot.setFocusPolicy(Qt.NoFocus)
    plot.viewport().setFocusPolicy(Qt.NoFocus)


_NICE = (1.0, 1.2, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0)


def nice_ceil(v: float) -> float:
    """`v` rounded up to 1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6 or 8 times a power of ten."""
    if v <= 0:
        return v
    scale = 10.0 ** math.floor(math.log10(v))
    return next(m * scale for m in _NICE if m * scale >= v * (1 - 1e-9))


def fit_y(plot: pg.PlotWidget, values: np.ndarray, low: float | None, min_span: float = 10.0) -> None:
    """The y range over the finite values: from `low` to at least 15% above the largest, or (low None)
    around them, at least min_span wide, its ends rounded so the axis does not redraw at every snapshot;
    nothing to show leaves the range as it is."""
    v = values[np.isfinite(values)]
    if not len(v):
        return
    top, bottom = float(v.max()), float(v.min())
    if low is not None:
        plot.setYRange(low, low + nice_ceil(max((top - low) * 1.15, 1.0)), padding=0)
    else:
        step = min_span / 2
        mid, half = (top + bottom) / 2, max(top - bottom, min_span) / 2 * 1.15
        plot.setYRange(math.floor((mid - half) / step) * step, math.ceil((mid + half) / step) * step, padding=0)
