"""The wizard's first page lists the models already on the disk, and Colibri's own with a Delete.

The search reads other apps' folders and GGUF headers (app.disk_models): it runs on a plain thread,
and the lists fill when it is done. Picking a found model reads it as a typed path would.
"""
from __future__ import annotations

import threading

from PySide6.QtCore import QObject, Qt, Signal
from PySide6.QtWidgets import (QAbstractItemView, QHBoxLayout, QHeaderView, QLabel, QMessageBox, QPushButton,
                               QTableWidget, QTableWidgetItem, QVBoxLayout, QWidget)

from app import disk_models
from app.disk_models import FoundModel, InstalledModel
from app.model_info import human_bytes
from ui.boxes import fill



class _Search(QObject):
    done = Signal(object, object, object)  # found, installed, free memory (bytes: beyond a C int)


def _table(name: str, heads: list[str]) -> QTableWidget:
    t = QTableWidget(0, len(heads), objectName=name)
    t.setHorizontalHeaderLabels(heads)
    t.setEditTriggers(QAbstractItemView.NoEditTriggers)
    t.setSelectionBehavior(QAbstractItemView.SelectRows)
    t.setSelectionMode(QAbstractItemView.SingleSelection)
    t.verticalHeader().hide()
    t.setWordWrap(False)
    h = t.horizontalHeader()
    h.setSectionResizeMode(QHeaderView.ResizeToContents)
    h.setSectionResizeMode(0, QHeaderView.Stretch)  # the name gives way (elided, whole in its tooltip)
    t.setHorizontalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
    return t


class FoundModelsPanel(QWidget):
    chosen = Signal(str)  # a found model's file, to read as the source
    scanned = Signal()  # both lists are filled

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.found: list[FoundModel] = []
        self.installed: list[InstalledModel] = []
        self.title = QLabel(objectName="found_title")
        self.table = _table("found_models", [self.tr("Model"), self.tr("Where"), self.tr("Architecture"),
                                             self.tr("Size"), self.tr("Quantization"), self.tr("Experts"),
                                             self.tr("Memory on this computer"), self.tr("Opening it")])
        self.table.horizontalHeader().setSectionResizeMode(6, QHeaderView.Stretch)  # an error: whole in its tooltip
        self.table.setTextElideMode(Qt.ElideMiddle)
        self.table.setAccessibleName(self.tr("Models found on this computer"))
        self.table.itemSelectionChanged.connect(self._picked)
        self.mine_title = QLabel(objectName="installed_title")
        self.mine = _table("installed_models", [self.tr("Converted model"), self.tr("On disk"), ""])
        self.mine.setAccessibleName(self.tr("Your converted models"))
        self.mine.setSelectionMode(QAbstractItemView.NoSelection)
        self.table.setMinimumHeight(120)
        self.mine.setMinimumHeight(80)
        self.mine.setMaximumHeight(110)
        fill(QVBoxLayout(self), self.title, (self.table, 1), self.mine_title, self.mine, margins=(0, 6, 0, 0))
        self._search = _Search(self)
        self._search.done.connect(self._fill)

    def refresh(self) -> None:
        """Search again, on a plain thread: the headers of a dozen big GGUFs take a moment."""
        self.title.setText(self.tr("Looking for models on this computer…"))
        search = self._search

        def run() -> None:
            found, mine = disk_models.find_models(), disk_models.installed()
            try:
                search.done.emit(found, mine, disk_models.free_memory())
            except RuntimeError:  # the wizard closed meanwhile
                pass
        threading.Thread(target=run, name="model_search", daemon=True).start()

    def _fill(self, found: list[FoundModel], mine: list[InstalledModel], free: int) -> None:
        self.found, self.installed = found, mine
        self.title.setText(self.tr("<b>Models on this computer</b> ({n}): pick one to read it, or give a path "
                                   "above").format(n=len(found)) if found else
                           self.tr("No GGUF found in Downloads, LM Studio, Ollama or the Hugging Face cache: "
                                   "give a path above."))
        self.table.setRowCount(len(found))
        for r, m in enumerate(found):
            cells = (m.name, self.tr(m.where), m.architecture or "—",
                     human_bytes(m.size) + (self.tr(" ({n} parts)").format(n=m.parts) if m.parts > 1 else ""),
                     m.quantization or "—", self.experts_text(m), self.memory_text(m, free), self.opening_text(m))
            for c, text in enumerate(cells):
                item = QTableWidgetItem(text)
                item.setToolTip(str(m.path) if c == 0 else m.error if c == 6 and m.error else
                                self.tr("{free} free now").format(free=human_bytes(free)) if c == 6 else text)
                if c in (3, 5):
                    item.setTextAlignment(Qt.AlignRight | Qt.AlignVCenter)
                self.table.setItem(r, c, item)
        self._fill_installed()
        self.scanned.emit()

    def _fill_installed(self) -> None:
        mine = self.installed
        self.mine_title.setText(self.tr("<b>Your converted models</b> ({n}, {size} on disk)").format(
            n=len(mine), size=human_bytes(sum(m.disk_bytes for m in mine))) if mine else
            self.tr("<b>Your converted models</b>: none yet"))
        self.mine.setRowCount(len(mine))
        for r, m in enumerate(mine):
            self.mine.setItem(r, 0, QTableWidgetItem(m.name))
            size = QTableWidgetItem(human_bytes(m.disk_bytes))
            size.setTextAlignment(Qt.AlignRight | Qt.AlignVCenter)
            self.mine.setItem(r, 1, size)
            button = QPushButton(self.tr("Delete…"), objectName=f"delete_{m.name}", autoDefault=False)
            button.setAccessibleName(self.tr("Delete {name}").format(name=m.name))
            button.clicked.connect(lambda _=False, m=m: self.ask_delete(m))
            self.mine.setCellWidget(r, 2, self._cell(button))

    @staticmethod
    def _cell(button: QPushButton) -> QWidget:
        w = QWidget()
        fill(QHBoxLayout(w), button, 1, margins=(2, 0, 2, 0))
        return w

    def experts_text(self, m: FoundModel) -> str:
        return self.tr("{used} of {n}").format(used=m.experts_used, n=m.experts) if m.experts > 1 else \
            self.tr("dense") if m.architecture else "—"

    def memory_text(self, m: FoundModel, free: int) -> str:
        if m.error:
            return m.error
        if not m.need_bytes:
            return "—"
        words = self.tr("fits: needs {need}") if m.need_bytes <= free else \
            self.tr("too big: needs {need}, {free} free")
        return words.format(need=human_bytes(m.need_bytes), free=human_bytes(free))

    def opening_text(self, m: FoundModel) -> str:
        if m.error:
            return "—"
        n = disk_models.copies_bytes(m)
        return self.tr("opened in place, no copy") if n == 0 else self.tr("copies {size}").format(size=human_bytes(n))

    def _picked(self) -> None:
        rows = self.table.selectionModel().selectedRows()
        if rows:
            self.chosen.emit(str(self.found[rows[0].row()].path))

    def ask_delete(self, m: InstalledModel) -> QMessageBox:
        """Asks first (non-blocking): a deleted model is gone, its source stays where it was."""
        box = QMessageBox(QMessageBox.Warning, self.tr("Delete a converted model"),
                          self.tr("Delete {name} ({size}) from your library? Its source file is not touched.").format(
                              name=m.name, size=human_bytes(m.disk_bytes)),
                          QMessageBox.Yes | QMessageBox.Cancel, self, objectName="delete_confirm")
        box.setDefaultButton(QMessageBox.Cancel)
        box.buttonClicked.connect(lambda b: box.standardButton(b) == QMessageBox.Yes and self._delete(m))
        box.open()
        return box

    def _delete(self, m: InstalledModel) -> None:
        try:
            disk_models.delete_installed(m.path)
        except (OSError, ValueError) as e:
            self.mine_title.setText(self.tr("Not deleted: {error}").format(error=e))
            return
        self.installed = [x for x in self.installed if x.path != m.path]
        self._fill_installed()
