"""Server → Server panel: the local server at a glance — on/off, port, the address with a copy
button, "serve on the local network" with the API key it needs, and a live log of the requests it
answers. A thin widget: the window's ServerMenu starts and stops the server through the worker, the
records arrive as app.request_log.RequestRecord values through a queued signal."""
from __future__ import annotations

import time

from PySide6.QtCore import QCoreApplication, Qt, Signal
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import (QAbstractItemView, QCheckBox, QDockWidget, QFormLayout, QHBoxLayout, QHeaderView,
                               QLabel, QLineEdit, QPushButton, QSpinBox, QTableWidget, QTableWidgetItem, QVBoxLayout,
                               QWidget)

from app.request_log import RequestRecord
from ui.boxes import fill

LOG_ROWS = 500  # the newest requests kept in the table


def _tr(text: str) -> str:
    return QCoreApplication.translate("ServerPanel", text)


def _copy_row(field: QLineEdit, name: str) -> QHBoxLayout:
    button = QPushButton(_tr("Copy"), objectName=f"copy_{name}")
    button.setAccessibleName(_tr("Copy the {what}").format(what=field.accessibleName()))
    button.clicked.connect(lambda: QGuiApplication.clipboard().setText(field.text()))
    return fill(QHBoxLayout(), (field, 1), button)


class ServerPanel(QDockWidget):
    """`switched(on, port, lan)`: the user asked for the server on or off (the window answers with
    `set_address` once the worker has started or stopped it)."""
    switched = Signal(bool, int, bool)

    def __init__(self, port: int, lan: bool, parent=None):
        super().__init__(_tr("Local server"), parent, objectName="server_panel")
        self.serve = QCheckBox(_tr("Serve the loaded model (OpenAI-compatible API)"), objectName="serve")
        self.port = QSpinBox(objectName="port", minimum=0, maximum=65535, value=port)
        self.port.setSpecialValueText(_tr("any free port"))
        self.lan = QCheckBox(_tr("Serve on the local network (other machines need the API key)"), objectName="lan")
        self.lan.setChecked(lan)
        self.address = QLineEdit(objectName="address", readOnly=True, placeholderText=_tr("not serving"))
        self.address.setAccessibleName(_tr("server address"))
        self.key = QLineEdit(objectName="api_key", readOnly=True)
        self.key.setAccessibleName(_tr("API key"))
        self.key_note = QLabel(objectName="key_note", wordWrap=True)
        self.log = QTableWidget(0, 6, objectName="request_log")
        self.log.setHorizontalHeaderLabels([_tr("Time"), _tr("Method"), _tr("Path"), _tr("Status"), _tr("Took"),
                                            _tr("Tokens")])
        self.log.verticalHeader().hide()
        self.log.setEditTriggers(QAbstractItemView.NoEditTriggers)
        self.log.setSelectionBehavior(QAbstractItemView.SelectRows)
        head = self.log.horizontalHeader()
        head.setSectionResizeMode(QHeaderView.ResizeToContents)
        head.setSectionResizeMode(2, QHeaderView.Stretch)
        form = QFormLayout()
        form.addRow(self.serve)
        form.addRow(_tr("Port"), self.port)
        form.addRow(self.lan)
        form.addRow(_tr("Address"), _copy_row(self.address, "address"))
        self.key_row = QWidget()
        fill(QVBoxLayout(self.key_row), _copy_row(self.key, "api_key"), self.key_note, margins=(0, 0, 0, 0))
        form.addRow(_tr("API key"), self.key_row)
        body = QWidget()
        fill(QVBoxLayout(body), form, QLabel(_tr("Requests")), (self.log, 1))
        self.setWidget(body)
        self.set_key("", False)
        self.serve.toggled.connect(self._switch)
        self.lan.toggled.connect(lambda _: self.serve.isChecked() and self._switch(True))
        self.port.editingFinished.connect(lambda: self.serve.isChecked() and self._switch(True))

    def _switch(self, on: bool) -> None:
        self.switched.emit(on, self.port.value(), self.lan.isChecked())

    def set_address(self, url: str) -> None:
        """The worker's answer: the address served at, "" when off."""
        self.serve.blockSignals(True)
        self.serve.setChecked(bool(url))
        self.serve.blockSignals(False)
        self.address.setText(url)

    def set_key(self, key: str, kept: bool) -> None:
        self.key.setText(key)
        self.key_note.setText(_tr("kept in the system keyring") if kept else
                              _tr("no keyring to keep it in: a new key each session"))
        self.key_row.setVisible(bool(key))

    def add_record(self, r: RequestRecord) -> None:
        tokens = "" if r.generated_tokens is None else f"{r.prompt_tokens} → {r.generated_tokens}"
        cells = (time.strftime("%H:%M:%S", time.localtime(r.at)), r.method, r.path, str(r.status or "—"),
                 f"{r.seconds * 1000:.0f} ms" if r.seconds < 10 else f"{r.seconds:.1f} s", tokens)
        self.log.insertRow(0)
        for col, text in enumerate(cells):
            item = QTableWidgetItem(text)
            if col in (3, 4, 5):
                item.setTextAlignment(Qt.AlignRight | Qt.AlignVCenter)
            self.log.setItem(0, col, item)
        if self.log.rowCount() > LOG_ROWS:
            self.log.removeRow(LOG_ROWS)
