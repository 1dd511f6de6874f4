"""Forms generated from `Param` records (engine/params.py and app/settings.APPEARANCE).

A parameter added to the engine's table appears in the dialogs without any change here.
"""
from __future__ import annotations

from typing import Any

from PySide6.QtWidgets import (QCheckBox, QComboBox, QDialog, QDialogButtonBox, QDoubleSpinBox, QFormLayout,
                               QLabel, QLineEdit, QPlainTextEdit, QSpinBox, QTabWidget, QVBoxLayout, QWidget)

from app import settings as S
from engine.params import Param

INT_MAX = 2**31 - 1  # QSpinBox holds a C int


def label(name: str) -> str:
    return name.replace("_", " ").capitalize().replace("Kv ", "KV ").replace("Top k", "Top-k") \
        .replace("Top p", "Top-p").replace("Min p", "Min-p")


class ParamForm(QWidget):
    """One row per parameter: an editor that fits its type and range, and its help below."""

    def __init__(self, params: list[Param], values: dict[str, Any], notes: dict[str, str] | None = None):
        super().__init__()
        self.params = {p.name: p for p in params}
        self.editors: dict[str, QWidget] = {}
        form = QFormLayout(self)
        form.setVerticalSpacing(4)
        for p in params:
            editor = self._editor(p, values.get(p.name, p.default))
            editor.setObjectName(f"param_{p.name}")
            editor.setToolTip(f"{p.help} ({p.range_text()})")
            self.editors[p.name] = editor
            form.addRow(label(p.name), editor)
            help_text = p.help + (f" — {notes[p.name]}" if notes and p.name in notes else "")
            help_label = QLabel(help_text, objectName="help", wordWrap=True)
            form.addRow("", help_label)

    def _editor(self, p: Param, value: Any) -> QWidget:
        if p.choices is not None:
            w = QComboBox()
            w.addItems([str(c) for c in p.choices])
            w.setCurrentText(str(value))
        elif p.type is bool:
            w = QCheckBox()
            w.setChecked(bool(value))
        elif p.type is int:
            w = QSpinBox()
            lo = int(p.min) if p.min is not None else -INT_MAX
            hi = min(int(p.max), INT_MAX) if p.max is not None else INT_MAX
            if p.nullable:  # one step below the minimum stands for "not set"
                lo -= 1
                w.setSpecialValueText("auto" if p.name == "threads" else "random" if p.name == "seed" else "default")
            w.setRange(lo, hi)
            w.setValue(lo if value is None else min(int(value), hi))
        elif p.type is float:
            w = QDoubleSpinBox()
            w.setDecimals(3)
            lo = p.min if p.min is not None else -1e9
            if p.nullable:  # one step below the minimum stands for "not set"
                lo -= 1
                w.setSpecialValueText("as is")
            w.setRange(lo, p.max if p.max is not None else 1e9)
            w.setSingleStep(0.05)
            w.setValue(lo if value is None else float(value))
        else:
            w = QLineEdit("" if value is None else str(value))
        return w

    def value(self, name: str) -> Any:
        p, w = self.params[name], self.editors[name]
        if isinstance(w, QComboBox):
            raw: Any = p.choices[w.currentIndex()]
        elif isinstance(w, QCheckBox):
            raw = w.isChecked()
        elif isinstance(w, QSpinBox):
            raw = None if p.nullable and w.value() == w.minimum() else w.value()
        elif isinstance(w, QDoubleSpinBox):
            raw = None if p.nullable and w.value() == w.minimum() else w.value()
        else:
            raw = w.text() or None
        return p.check(raw)

    def set_value(self, name: str, value: Any) -> None:
        w, p = self.editors[name], self.params[name]
        if isinstance(w, QComboBox):
            w.setCurrentText(str(value))
        elif isinstance(w, QCheckBox):
            w.setChecked(bool(value))
        elif isinstance(w, QSpinBox):
            w.setValue(w.minimum() if value is None and p.nullable else int(value))
        elif isinstance(w, QDoubleSpinBox):
            w.setValue(w.minimum() if value is None and p.nullable else float(value))
        else:
            w.setText("" if value is None else str(value))

    def values(self) -> dict[str, Any]:
        return {name: self.value(name) for name in self.params}


class SettingsDialog(QDialog):
    """Engine parameters (the whole engine table) and appearance."""

    def __init__(self, parent: QWidget | None, settings: S.Settings):
        super().__init__(parent)
        self.setWindowTitle("Settings")
        self.setMinimumWidth(520)
        notes = {p.name: "applies at once; the next reply reads the conversation again"
                 for p in S.engine_params() if not p.live}
        self.engine_form = ParamForm(S.engine_params(), settings.engine_values(), notes)
        self.ui_form = ParamForm(list(S.APPEARANCE.values()), settings.ui)
        tabs = QTabWidget()
        tabs.addTab(self.engine_form, "Engine")
        tabs.addTab(self.ui_form, "Appearance")
        buttons = QDialogButtonBox(QDialogButtonBox.Ok | QDialogButtonBox.Cancel)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        lay = QVBoxLayout(self)
        lay.addWidget(tabs)
        lay.addWidget(buttons)


class ConversationDialog(QDialog):
    """This conversation's system prompt and sampling parameters."""

    def __init__(self, parent: QWidget | None, system_prompt: str, sampling: dict[str, Any]):
        super().__init__(parent)
        self.setWindowTitle("Chat settings")
        self.setMinimumWidth(520)
        self.system = QPlainTextEdit(system_prompt, objectName="system_prompt")
        self.system.setPlaceholderText("e.g. You are a concise assistant.")
        self.system.setFixedHeight(90)
        self.form = ParamForm(S.sampling_params(), sampling)
        buttons = QDialogButtonBox(QDialogButtonBox.Ok | QDialogButtonBox.Cancel | QDialogButtonBox.RestoreDefaults)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        buttons.button(QDialogButtonBox.RestoreDefaults).clicked.connect(self.restore_defaults)
        lay = QVBoxLayout(self)
        lay.addWidget(QLabel("System prompt"))
        lay.addWidget(self.system)
        lay.addWidget(QLabel("Sampling"))
        lay.addWidget(self.form)
        lay.addWidget(buttons)

    def restore_defaults(self) -> None:
        for p in S.sampling_params():
            self.form.set_value(p.name, p.default)
