"""Forms generated from `Param` records (engine/params.py and app/settings.APPEARANCE).

A parameter added to the engine's table appears in the dialogs without any change here.
"""
from __future__ import annotations

from typing import Any

from PySide6.QtCore import QCoreApplication, Qt
from PySide6.QtWidgets import (QCheckBox, QComboBox, QDialog, QDialogButtonBox, QDoubleSpinBox, QFormLayout,
                               QLabel, QLineEdit, QPlainTextEdit, QScrollArea, QSpinBox, QTabWidget, QVBoxLayout,
                               QWidget)

from app import settings as S
from engine.params import Param

INT_MAX = 2**31 - 1  # QSpinBox holds a C int
CHOICE_LABELS = {"en": "English", "zh_CN": "简体中文"}  # each language under its own name, in every language


def _tr(text: str) -> str:
    """Parameter names, help and choices are translated in the "Param" context (English if none)."""
    return QCoreApplication.translate("Param", text)


def label(name: str) -> str:
    return name.replace("_", " ").capitalize().replace("Kv ", "KV ").replace("Top k", "Top-k") \
        .replace("Top p", "Top-p").replace("Min p", "Min-p")


def choice_label(choice: Any) -> str:
    return CHOICE_LABELS.get(str(choice)) or _tr(str(choice))


def scrolled(form: QWidget) -> QScrollArea:
    """A form in a scroll area: a long table fits small screens, and wrapped help lines get the
    height they need (the area sizes its widget by height-for-width)."""
    area = QScrollArea(widgetResizable=True, frameShape=QScrollArea.NoFrame, focusPolicy=Qt.NoFocus)
    area.setWidget(form)
    area.viewport().setAutoFillBackground(False)
    form.setAutoFillBackground(False)
    return area


def name_buttons(box: QDialogButtonBox) -> QDialogButtonBox:
    """Standard buttons are named by their (translated) text, mnemonic marks removed."""
    for b in box.buttons():
        b.setAccessibleName(b.text().replace("&", ""))
    return box


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
            name, help_ = _tr(label(p.name)), _tr(p.help)
            editor.setToolTip(f"{help_} ({p.range_text()})")
            editor.setAccessibleName(name)
            editor.setAccessibleDescription(help_)
            self.editors[p.name] = editor
            form.addRow(name, editor)
            help_text = help_ + (f" — {_tr(notes[p.name])}" if notes and p.name in notes else "")
            help_label = QLabel(help_text, objectName="help", wordWrap=True)
            form.addRow("", help_label)

    def _editor(self, p: Param, value: Any) -> QWidget:
        if p.choices is not None:
            w = QComboBox()
            for c in p.choices:
                w.addItem(choice_label(c), c)
            w.setCurrentIndex(max(w.findData(value), 0))
        elif p.type is bool:
            w = QCheckBox()
            w.setChecked(bool(value))
        elif p.type is int:
            w = QSpinBox()
            lo = int(p.min) if p.min is not None else -INT_MAX
            hi = min(int(p.max), INT_MAX) if p.max is not None else INT_MAX
            if p.nullable:  # one step below the minimum stands for "not set"
                lo -= 1
                w.setSpecialValueText(_tr("auto") if p.name == "threads" else _tr("random") if p.name == "seed"
                                      else _tr("default"))
            w.setRange(lo, hi)
            w.setValue(lo if value is None else min(int(value), hi))
        elif p.type is float:
            w = QDoubleSpinBox()
            w.setDecimals(3)
            lo = p.min if p.min is not None else -1e9
            if p.nullable:  # one step below the minimum stands for "not set"
                lo -= 1
                w.setSpecialValueText(_tr("as is"))
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
            w.setCurrentIndex(max(w.findData(value), 0))
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
        self.setWindowTitle(self.tr("Settings"))
        self.setMinimumWidth(520)
        self.resize(640, 680)
        notes = {p.name: "applies at once; the next reply reads the conversation again"  # translated by ParamForm
                 for p in S.engine_params() if not p.live}
        self.engine_form = ParamForm(S.engine_params(), settings.engine_values(), notes)
        self.ui_form = ParamForm(list(S.APPEARANCE.values()), settings.ui)
        tabs = QTabWidget(objectName="settings_tabs")
        tabs.setAccessibleName(self.tr("Settings sections"))
        tabs.tabBar().setAccessibleName(self.tr("Settings sections"))
        tabs.addTab(scrolled(self.engine_form), self.tr("&Engine"))
        tabs.addTab(scrolled(self.ui_form), self.tr("&Appearance"))
        buttons = QDialogButtonBox(QDialogButtonBox.Ok | QDialogButtonBox.Cancel)
        name_buttons(buttons)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        lay = QVBoxLayout(self)
        lay.addWidget(tabs)
        lay.addWidget(buttons)


class ConversationDialog(QDialog):
    """This conversation's system prompt and sampling parameters."""

    def __init__(self, parent: QWidget | None, system_prompt: str, sampling: dict[str, Any]):
        super().__init__(parent)
        self.setWindowTitle(self.tr("Chat settings"))
        self.setMinimumWidth(520)
        self.system = QPlainTextEdit(system_prompt, objectName="system_prompt")
        self.system.setPlaceholderText(self.tr("e.g. You are a concise assistant."))
        self.system.setAccessibleName(self.tr("System prompt"))
        self.system.setTabChangesFocus(True)
        self.system.setFixedHeight(90)
        self.form = ParamForm(S.sampling_params(), sampling)
        buttons = QDialogButtonBox(QDialogButtonBox.Ok | QDialogButtonBox.Cancel | QDialogButtonBox.RestoreDefaults)
        name_buttons(buttons)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        buttons.button(QDialogButtonBox.RestoreDefaults).clicked.connect(self.restore_defaults)
        lay = QVBoxLayout(self)
        prompt_label = QLabel(self.tr("&System prompt"))
        prompt_label.setBuddy(self.system)
        lay.addWidget(prompt_label)
        lay.addWidget(self.system)
        lay.addWidget(QLabel(self.tr("Sampling")))
        lay.addWidget(self.form)
        lay.addWidget(buttons)

    def restore_defaults(self) -> None:
        for p in S.sampling_params():
            self.form.set_value(p.name, p.default)
