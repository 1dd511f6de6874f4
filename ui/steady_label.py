"""A word-wrapped label for figures that change every half second (the dashboard's captions).

A plain QLabel asks for a new height whenever its text wraps to fewer or more lines, which moves
every panel below it and repaints the whole window. This one keeps the tallest height it has needed
at its current width, so a changing figure repaints only its own line.
"""
from __future__ import annotations

from PySide6.QtCore import QSize
from PySide6.QtWidgets import QLabel

_WIDTHS_KEPT = 32  # heights are remembered per width; a dock dragged wider asks for many, forgotten here


class SteadyLabel(QLabel):
    """A word-wrapped label whose height never shrinks while its width stays the same."""

    def __init__(self, objectName: str = "", **kw):  # noqa: N803 - Qt's keyword
        super().__init__(objectName=objectName, wordWrap=True, **kw)
        self._tallest: dict[int, int] = {}

    def heightForWidth(self, width: int) -> int:  # noqa: N802 - Qt's name
        h = super().heightForWidth(width)
        if len(self._tallest) > _WIDTHS_KEPT and width not in self._tallest:
            self._tallest.clear()
        h = max(h, self._tallest.get(width, 0))
        self._tallest[width] = h
        return h

    def forget_height(self) -> None:
        """Fit the text again (a new model: its figures start over)."""
        self._tallest.clear()
        self.updateGeometry()

    def minimumSizeHint(self) -> QSize:  # noqa: N802 - Qt's name
        s = super().minimumSizeHint()
        return QSize(s.width(), max(s.height(), self._tallest.get(self.width(), 0)))
