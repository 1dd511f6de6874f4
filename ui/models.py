"""Thin Qt list models over plain dataclass lists."""
from __future__ import annotations

from typing import Any

from PySide6.QtCore import QAbstractListModel, QCoreApplication, QModelIndex, Qt

from app.history import NEW_TITLE, Conversation


def shown_title(title: str) -> str:
    """A conversation's title on screen: the untitled placeholder in the interface's language."""
    return QCoreApplication.translate("ConversationListModel", "New chat") if title == NEW_TITLE else title


class ConversationListModel(QAbstractListModel):
    IdRole = Qt.UserRole + 1

    def __init__(self):
        super().__init__()
        self.items: list[Conversation] = []

    def set_items(self, items: list[Conversation]) -> None:
        self.beginResetModel()
        self.items = list(items)
        self.endResetModel()

    def rowCount(self, parent: QModelIndex = QModelIndex()) -> int:  # noqa: B008, N802 - Qt's name
        return 0 if parent.isValid() else len(self.items)

    def data(self, index: QModelIndex, role: int = Qt.DisplayRole) -> Any:
        if not index.isValid():
            return None
        conv = self.items[index.row()]
        if role in (Qt.DisplayRole, Qt.ToolTipRole, Qt.AccessibleTextRole):
            return shown_title(conv.title)
        if role == self.IdRole:
            return conv.id
        return None

    def row_of(self, cid: int) -> int:
        return next((i for i, c in enumerate(self.items) if c.id == cid), -1)
