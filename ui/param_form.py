"""Forms generated from `Param` records (engine/params.py and app/settings.APPEARANCE).

A parameter added to the engine's table appears in the dialogs without any change here.
"""
from __future__ import annotations

from typing import Any, Callable

import psutil
from PySide6.QtCore import QCoreApplication, Qt, QTimer, Signal
from PySide6.QtWidgets import (QCheckBox, QComboBox, QDialog, QDialogButtonBox, QDoubleSpinBox, QFormLayout,
                               QHBoxLayout, QLabel, QLineEdit, QPlainTextEdit, QPushButton, QScrollArea, QSpinBox,
                               QTabWidget, QVBoxLayout, QWidget)

from app import settings as S
from engine.params import Param
from ui.boxes import fill

INT_MAX = 2**31 - 1  # QSpinBox holds a C int
LANGUAGE_NAMES = {"en": "English", "zh_CN": "简体中文"}  # each language under its own name, in every language
# what a choice reads as on screen (translated in the "Param" context); choices not here are names
# users know as they are (f16, int8, avx2, INFO)
CHOICE_LABELS = {"light": "Light", "dark": "Dark", "system": "Same as the desktop", "auto": "Automatic"}
BYTE_UNITS = (("MB", 10**6), ("GB", 10**9))  # a byte budget is typed in these, as free memory is shown


def _tr(text: str) -> str:
    """Parameter names, help and choices are translated in the "Param" context (English if none)."""
    return QCoreApplication.translate("Param", text)


def label(name: str) -> str:
    return name.replace("_", " ").capitalize().replace("Kv ", "KV ").replace("Top k", "Top-k") \
        .replace("Top p", "Top-p").replace("Min p", "Min-p")


def preset_label(name: str) -> str:
    """A preset's name on screen: the built-in ones translated, the user's own as typed."""
    return _tr(name) if name in S.BUILTIN_PRESETS else name


def choice_label(choice: Any) -> str:
    c = str(choice)
    return LANGUAGE_NAMES.get(c) or _tr(CHOICE_LABELS.get(c, c))


def unset_label(p: Param) -> str:
    """What a nullable number reads as when it is not set: the help's own word for it."""
    if p.name == "seed":
        return _tr("random")
    if p.name == "threads" or "auto" in p.help:
        return _tr("auto")
    return _tr("not set") if p.name.endswith("_bytes") else _tr("default")


class ByteSizeEdit(QWidget):
    """A byte budget in MB or GB (a spin box of bytes holds at most 2 GB), free memory beside it;
    0 is "auto" when the parameter may be unset."""
    valueChanged = Signal()

    def __init__(self, p: Param, value: int | None):
        super().__init__()
        self.p = p
        self.number = QDoubleSpinBox(objectName=f"param_{p.name}_value", decimals=1, singleStep=0.5)
        self.number.setRange(0.0, 1e9)
        if p.nullable:
            self.number.setSpecialValueText(unset_label(p))
        self.unit = QComboBox(objectName=f"param_{p.name}_unit")
        for name, factor in BYTE_UNITS:
            self.unit.addItem(name, factor)
        self.unit.setAccessibleName(_tr("Unit"))
        self.free = QLabel(objectName="help")
        vm = psutil.virtual_memory()
        self.free.setText(_tr("{free} free now, of {total}").format(free=_gb(vm.available), total=_gb(vm.total)))
        fill(QHBoxLayout(self), (self.number, 1), self.unit, self.free, margins=(0, 0, 0, 0))
        self.set_bytes(value)
        self.number.valueChanged.connect(self.valueChanged)
        self.unit.currentIndexChanged.connect(self._unit_changed)

    def setAccessibleName(self, name: str) -> None:  # noqa: N802 - Qt's name
        super().setAccessibleName(name)
        self.number.setAccessibleName(name)

    def setAccessibleDescription(self, text: str) -> None:  # noqa: N802 - Qt's name
        super().setAccessibleDescription(text)
        self.number.setAccessibleDescription(text)

    def set_bytes(self, value: int | None) -> None:
        gb = value is not None and value >= 10**9
        self.unit.blockSignals(True)
        self.unit.setCurrentIndex(1 if gb else 0)
        self.unit.blockSignals(False)
        self._factor = self.unit.currentData()
        self.number.setValue(0.0 if not value else value / self._factor)

    def bytes(self) -> int | None:
        n = round(self.number.value() * self.unit.currentData())
        if n <= 0:
            return None if self.p.nullable else int(self.p.min or 0)
        return n

    def _unit_changed(self) -> None:
        """The same budget in the other unit (2048 MB -> 2.0 GB), not a new one."""
        n = self.number.value() * self._factor
        self._factor = self.unit.currentData()
        self.number.setValue(n / self._factor)
        self.valueChanged.emit()


def _gb(n: float) -> str:
    return f"{n / 1e9:.1f} GB" if n >= 1e9 else f"{n / 1e6:.0f} MB"


def scrolled(form: QWidget) -> QScrollArea:
    """A form in a scroll area: a long table fits small screens, and wrapped help lines get their height."""
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
            form.addRow("", QLabel(help_text, objectName="help", wordWrap=True))

    def _editor(self, p: Param, value: Any) -> QWidget:
        if p.type is int and p.name.endswith("_bytes"):
            w: QWidget = ByteSizeEdit(p, value)
        elif p.choices is not None:
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
                w.setSpecialValueText(unset_label(p))
            w.setRange(lo, hi)
            w.setValue(lo if value is None else min(int(value), hi))
        elif p.type is float:
            w = QDoubleSpinBox()
            w.setDecimals(3)
            lo = p.min if p.min is not None else -1e9
            if p.nullable:  # one step below the minimum stands for "not set"
                lo -= 1
                w.setSpecialValueText(unset_label(p))
            w.setRange(lo, p.max if p.max is not None else 1e9)
            w.setSingleStep(0.05)
            w.setValue(lo if value is None else float(value))
        else:
            w = QLineEdit("" if value is None else str(value))
        return w

    def value(self, name: str) -> Any:
        p, w = self.params[name], self.editors[name]
        if isinstance(w, ByteSizeEdit):
            raw: Any = w.bytes()
        elif isinstance(w, QComboBox):
            raw = p.choices[w.currentIndex()]
        elif isinstance(w, QCheckBox):
            raw = w.isChecked()
        elif isinstance(w, (QSpinBox, QDoubleSpinBox)):
            raw = None if p.nullable and w.value() == w.minimum() else w.value()
        else:
            raw = w.text() or None
        return p.check(raw)

    def set_value(self, name: str, value: Any) -> None:
        w, p = self.editors[name], self.params[name]
        if isinstance(w, ByteSizeEdit):
            w.set_bytes(value)
        elif isinstance(w, QComboBox):
            w.setCurrentIndex(max(w.findData(value), 0))
        elif isinstance(w, QCheckBox):
            w.setChecked(bool(value))
        elif isinstance(w, (QSpinBox, QDoubleSpinBox)):
            w.setValue(w.minimum() if value is None and p.nullable else (int if isinstance(w, QSpinBox) else float)(value))
        else:
            w.setText("" if value is None else str(value))

    def values(self) -> dict[str, Any]:
        return {name: self.value(name) for name in self.params}

    def on_change(self, slot: Callable[[], None]) -> None:
        """Call `slot` whenever any editor's value changes."""
        for w in self.editors.values():
            for sig in ("valueChanged", "currentIndexChanged", "toggled", "textChanged"):
                if hasattr(w, sig):
                    getattr(w, sig).connect(slot)
                    break


class SettingsDialog(QDialog):
    """Engine parameters (the whole engine table) and appearance."""

    def __init__(self, parent: QWidget | None, settings: S.Settings,
                 fit: Callable[[dict[str, Any]], Any] | None = None):
        """`fit(engine values)` asks what the loaded model needs; its text answer goes to `fit_label`."""
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
        engine_page = QWidget()
        self.fit_label = QLabel(objectName="fit_note", wordWrap=True)
        self.fit_label.setAccessibleName(self.tr("What fits in memory"))
        self.fit_label.setVisible(fit is not None)
        fill(QVBoxLayout(engine_page), self.fit_label, (scrolled(self.engine_form), 1), margins=(0, 0, 0, 0))
        self._fit = fit
        self.fit_timer = QTimer(self, objectName="fit_timer", singleShot=True, interval=200)
        self.fit_timer.timeout.connect(self.update_fit)
        self.engine_form.on_change(self.fit_timer.start)
        self.update_fit()
        tabs.addTab(engine_page, self.tr("&Engine"))
        tabs.addTab(scrolled(self.ui_form), self.tr("&Appearance"))
        buttons = QDialogButtonBox(QDialogButtonBox.Ok | QDialogButtonBox.Cancel)
        name_buttons(buttons)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        fill(QVBoxLayout(self), tabs, buttons)

    def update_fit(self) -> None:
        if self._fit is not None:
            try:
                text = self._fit(self.engine_form.values())
            except ValueError as e:  # a value the table refuses: say which
                text = str(e)
            if isinstance(text, str):
                self.fit_label.setText(text)
            elif not self.fit_label.text():  # the worker answers (after a reply being written, if any)
                self.fit_label.setText(self.tr("Working out what the model needs with these settings…"))


class ConversationDialog(QDialog):
    """This conversation's system prompt and sampling parameters, and the presets to start from.

    `defaults`: what "Restore defaults" and a preset build on (the table's values under the model's
    own, `model_defaults`, from its generation config)."""

    def __init__(self, parent: QWidget | None, system_prompt: str, sampling: dict[str, Any],
                 settings: S.Settings | None = None, defaults: dict[str, Any] | None = None,
                 model_defaults: dict[str, Any] | None = None):
        super().__init__(parent)
        self.setWindowTitle(self.tr("Chat settings"))
        self.setMinimumWidth(520)
        self.settings = settings
        self.defaults = defaults if defaults is not None else {p.name: p.default for p in S.sampling_params()}
        self.presets_changed = False
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
        if settings is not None:
            lay.addLayout(self._preset_row())
        prompt_label = QLabel(self.tr("&System prompt"))
        prompt_label.setBuddy(self.system)
        md = model_defaults or {}
        self.model_note = QLabel(objectName="help", wordWrap=True)
        self.model_note.setText(
            self.tr("This model recommends: {values} (from its generation config); Restore defaults uses them.")
            .format(values=", ".join(f"{label(k)} {v:g}" if isinstance(v, float) else f"{label(k)} {v}"
                                     for k, v in md.items())) if md else
            self.tr("This model recommends no sampling values: the defaults below are Colibri's."))
        # the form scrolled: laid out bare, five help lines lost their last line
        fill(lay, prompt_label, self.system, QLabel(self.tr("Sampling")), self.model_note, (scrolled(self.form), 1),
             buttons)
        self.resize(560, 800)

    def _preset_row(self) -> QHBoxLayout:
        self.preset_box = QComboBox(objectName="preset")
        self.preset_box.setAccessibleName(self.tr("Preset"))
        self.preset_box.setToolTip(self.tr("A named system prompt and sampling: picking one fills the fields below"))
        self._fill_presets()
        self.preset_box.activated.connect(lambda _: self.apply_preset(self.preset_box.currentData()))
        save = QPushButton(self.tr("Save as preset…"), objectName="save_preset")
        save.setAccessibleName(self.tr("Save as preset"))
        save.clicked.connect(self._ask_preset_name)
        default = QPushButton(self.tr("Use for new chats"), objectName="default_preset")
        default.setAccessibleName(self.tr("Use this preset for new chats"))
        default.clicked.connect(lambda: self.make_default(self.preset_box.currentData()))
        for b in (save, default):
            b.setAutoDefault(False)
        self.default_label = QLabel(objectName="help")
        self._show_default()
        preset_label = QLabel(self.tr("&Preset"))
        preset_label.setBuddy(self.preset_box)
        row = fill(QHBoxLayout(), preset_label, (self.preset_box, 1), save, default)
        return fill(QVBoxLayout(), row, self.default_label)

    def _fill_presets(self, current: str | None = None) -> None:
        self.preset_box.clear()
        for name in self.settings.all_presets():
            self.preset_box.addItem(preset_label(name), name)
        self.preset_box.setCurrentIndex(max(0, self.preset_box.findData(current or self.settings.default_preset)))

    def _show_default(self) -> None:
        self.default_label.setText(self.tr("New chats start from “{name}”.").format(
            name=preset_label(self.settings.default_preset)))

    def apply_preset(self, name: str) -> None:
        """Fill the fields from a preset: its system prompt, its values over the defaults."""
        p = self.settings.preset(name)
        self.system.setPlainText(p["system_prompt"])
        for k, v in (self.defaults | p["sampling"]).items():
            if k in self.form.params:
                self.form.set_value(k, v)

    def save_preset(self, name: str) -> None:
        """The fields as a preset: only the values that differ from the defaults."""
        values = {k: v for k, v in self.form.values().items() if v != self.defaults.get(k)}
        self.settings.save_preset(name, self.system.toPlainText().strip(), values)
        self.presets_changed = True
        self._fill_presets(name.strip())

    def make_default(self, name: str) -> None:
        self.settings.default_preset = name
        self.presets_changed = True
        self._show_default()

    def _ask_preset_name(self) -> None:
        from PySide6.QtWidgets import QInputDialog, QMessageBox
        name, ok = QInputDialog.getText(self, self.tr("Save as preset"), self.tr("Name of the preset:"))
        if ok and name.strip():
            try:
                self.save_preset(name)
            except ValueError as e:
                QMessageBox.warning(self, self.tr("Save as preset"), str(e))

    def restore_defaults(self) -> None:
        for p in S.sampling_params():
            self.form.set_value(p.name, self.defaults.get(p.name, p.default))
