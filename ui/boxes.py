"""Filling a Qt box layout from a list: the windows build many rows and columns of widgets."""
from __future__ import annotations

from PySide6.QtWidgets import QLayout


def fill(layout: QLayout, *items, margins: tuple[int, int, int, int] | None = None) -> QLayout:
    """`layout` with `items` added in order: a widget or a layout, an int (a stretch), or a tuple
    (widget or layout, stretch[, alignment]); returned for nesting."""
    if margins is not None:
        layout.setContentsMargins(*margins)
    for item in items:
        if isinstance(item, int):
            layout.addStretch(item)
            continue
        item, *rest = item if isinstance(item, tuple) else (item,)
        (layout.addLayout if isinstance(item, QLayout) else layout.addWidget)(item, *rest)
    return layout
