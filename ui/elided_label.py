"""A one-line label that ends a text too long for it with an ellipsis (the chat's title)."""
from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QLabel, QSizePolicy


class ElidedLabel(QLabel):
    """A one-line label that ends a text too long for it with an ellipsis."""

    def __init__(self, objectName: str):  # noqa: N803 - Qt's keyword
        super().__init__(objectName=objectName)
        self.full = ""
        self.setSizePolicy(QSizePolicy.Ignored, QSizePolicy.Preferred)  # a long title never squeezes the rest

    def set_full_text(self, text: str) -> None:
        self.full = text
        self._elide()

    def resizeEvent(self, e) -> None:  # noqa: N802 - Qt's name
        super().resizeEvent(e)
        self._elide()

    def _elide(self) -> None:
        self.setText(self.fontMetrics().elidedText(self.full, Qt.ElideRight, max(self.width(), 40)))
        self.setToolTip(self.full)
