"""The composer's context controls: the meter beside the input, the chat's context policy, and the
tray of attached files with their token counts and the warning when a message will not fit: thin
widgets over app.chat_session plans and app.attachments records.
"""
from __future__ import annotations

from PySide6.QtCore import QCoreApplication, Qt, Signal
from PySide6.QtWidgets import (QComboBox, QHBoxLayout, QLabel, QProgressBar, QSizePolicy, QToolButton, QVBoxLayout,
                               QWidget)

from app.attachments import Attachment
from app.chat_session import LABELS, POLICIES
from app.passages import Excerpt
from ui.boxes import fill


def _tr(text: str) -> str:
    return QCoreApplication.translate("ContextUi", text)


def policy_label(policy: str) -> str:
    return _tr(LABELS[policy])


def marker_texts(dropped: int, policy: str) -> tuple[str, str]:
    """The two lines the chat shows around the messages left out of the model's context."""
    return (_tr("From here, {n} messages are not sent to the model: the context is full").format(n=dropped),
            _tr("The model reads on from here (this chat's policy: {policy})").format(policy=policy_label(policy)))


class ContextMeter(QProgressBar):
    """Tokens of the open chat's next prompt against the model's context: green, amber past 80 %,
    red once messages are left out or it cannot fit."""

    def __init__(self):
        super().__init__(objectName="context_meter")
        self.setRange(0, 1000)
        self.setTextVisible(True)
        self.setFixedWidth(150)
        self.setAlignment(Qt.AlignCenter)
        self.state = "none"  # "none", "ok", "high", "dropped", "full": the stylesheet's `level`
        self.show_plan(None, None)

    def show_plan(self, used: int | None, limit: int | None, dropped: int = 0, fits: bool = True,
                  with_draft: bool = False) -> None:
        """`with_draft`: the figure counts the message being written (and its files) too."""
        if limit is None:
            self.setValue(0)
            self.setFormat(_tr("context —"))
            self.setToolTip(_tr("No model is loaded"))
            state = "none"
        elif used is None:
            self.setValue(0)
            self.setFormat(_tr("… / {limit:,}").format(limit=limit))
            self.setToolTip(_tr("Counting this chat's tokens…"))
            state = "none"
        else:
            self.setValue(min(1000, round(1000 * used / max(1, limit))))
            self.setFormat(_tr("{used:,} / {limit:,}").format(used=used, limit=limit))
            state = "full" if not fits else "dropped" if dropped else "high" if used > 0.8 * limit else "ok"
            tip = (_tr("With the message you are writing, this chat's next prompt takes {used:,} of the model's "
                       "{limit:,} context tokens") if with_draft else
                   _tr("This chat's next prompt takes {used:,} of the model's {limit:,} context tokens")).format(
                used=used, limit=limit)
            if dropped:
                tip += "\n" + _tr("{n} earlier messages are left out to make it fit").format(n=dropped)
            if not fits:
                tip += "\n" + _tr("It does not fit: start a new chat or change the context policy")
            self.setToolTip(tip)
        self.setAccessibleDescription(self.toolTip())
        if state != self.state:
            self.state = state
            self.setProperty("level", state)
            self.style().unpolish(self)
            self.style().polish(self)


class PolicyBox(QComboBox):
    """What the open chat does when it outgrows the context."""
    policy_changed = Signal(str)

    def __init__(self):
        super().__init__(objectName="context_policy")
        self.set_texts()
        self.activated.connect(lambda i: self.policy_changed.emit(self.itemData(i)))

    def set_texts(self) -> None:
        current = self.currentData()
        self.blockSignals(True)
        self.clear()
        for p in POLICIES:
            self.addItem(policy_label(p), p)
        self.blockSignals(False)
        self.set_policy(current or POLICIES[0])
        self.setAccessibleName(_tr("When the context is full"))
        self.setToolTip(_tr("What this chat does when it no longer fits the model's context: leave out the "
                            "oldest messages, keep the system prompt and first exchange and leave out the middle, "
                            "or stop and say so"))

    def set_policy(self, policy: str) -> None:
        i = self.findData(policy)
        self.setCurrentIndex(max(i, 0))

    def policy(self) -> str:
        return self.currentData()


class AttachmentTray(QWidget):
    """The files attached to the message being written: a chip each (name, tokens, remove), and
    the warning line when the message will not fit."""
    changed = Signal()

    def __init__(self):
        super().__init__(objectName="attachments")
        self.items: dict[int, Attachment] = {}
        self.excerpts: dict[int, Excerpt] = {}  # a file too long for the context: the passages sent instead
        self._chips: dict[int, tuple[QWidget, QLabel]] = {}
        self._next = 0
        # the chips in a row of their own and the warning under it: beside them, a warning wrapped
        # over three lines stretched every chip to its height
        self.row = QHBoxLayout()
        self.row.setSpacing(6)
        self.row.addStretch(1)
        self.warning = QLabel(objectName="attach_warning")
        self.warning.setWordWrap(True)
        self.warning.setSizePolicy(QSizePolicy.Expanding, QSizePolicy.Preferred)
        self.warning.setAccessibleName(_tr("Context warning"))
        self.warning.hide()
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 4)
        lay.setSpacing(4)
        lay.addLayout(self.row)
        lay.addWidget(self.warning)
        self.setVisible(False)

    def add(self, a: Attachment) -> int:
        key, self._next = self._next, self._next + 1
        self.items[key] = a
        chip = QWidget(objectName="attachment_chip")
        chip.setAttribute(Qt.WA_StyledBackground, True)
        label = QLabel()
        remove = QToolButton(objectName="attachment_remove", text="✕", autoRaise=True)
        remove.setAccessibleName(_tr("Remove {name}").format(name=a.name))
        remove.setToolTip(remove.accessibleName())
        remove.clicked.connect(lambda: self.remove(key))
        fill(QHBoxLayout(chip), label, remove, margins=(8, 2, 2, 2))
        self.row.insertWidget(len(self._chips), chip)
        self._chips[key] = (chip, label)
        self._label(key)
        self.setVisible(True)
        self.changed.emit()
        return key

    def _label(self, key: int) -> None:
        a = self.items[key]
        chip, label = self._chips[key]
        kind = {"pdf": "PDF", "markdown": "Markdown", "code": _tr("code"), "text": _tr("text")}[a.kind]
        tokens = _tr("counting…") if a.tokens is None else _tr("{n:,} tokens").format(n=a.tokens)
        if key in self.excerpts:
            e = self.excerpts[key]
            tokens += " · " + _tr("{sent} of {total} passages sent").format(sent=e.sent, total=e.total)
        label.setText(f"{a.name} · {tokens}")
        chip.setToolTip(_tr("{kind}, {chars:,} characters: sent as plain text after your message").format(
            kind=kind, chars=len(a.text)))
        chip.setAccessibleName(f"{a.name}, {tokens}")

    def set_tokens(self, key: int, tokens: int) -> None:
        if key in self.items:
            a = self.items[key]
            self.items[key] = Attachment(a.name, a.kind, a.text, tokens)
            self._label(key)
            self.changed.emit()

    def set_excerpt(self, key: int, e: Excerpt | None) -> None:
        """Send these passages in place of the whole file (None: the whole file again)."""
        if key in self.items and self.excerpts.get(key) != e:
            if e is None:
                del self.excerpts[key]
            else:
                self.excerpts[key] = e
            self._label(key)

    def remove(self, key: int) -> None:
        self.excerpts.pop(key, None)
        chip, _ = self._chips.pop(key)
        del self.items[key]
        chip.hide()
        chip.deleteLater()
        self.setVisible(bool(self.items) or bool(self.warning.text()))
        self.changed.emit()

    def clear(self) -> None:
        for key in list(self.items):
            self.remove(key)

    def records(self) -> list[dict]:
        return [(self.excerpts[k].attachment if k in self.excerpts else a).as_dict() for k, a in self.items.items()]

    def set_warning(self, text: str, level: str = "") -> None:
        self.warning.setText(text)
        self.warning.setProperty("level", level)
        self.warning.style().unpolish(self.warning)
        self.warning.style().polish(self.warning)
        self.warning.setVisible(bool(text))
        self.setVisible(bool(self.items) or bool(text))
