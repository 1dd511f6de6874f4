"""The wizard's first page lists the models already on the disk (a fake home as LM Studio, Ollama, the
HF cache and Downloads keep them) and Colibri's own with a Delete asked first, on a real Qt loop."""
from __future__ import annotations

import gc

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QApplication, QMessageBox, QPushButton
from test_disk_models import TINY, converted, fake_home

from app import disk_models
from app.model_info import human_bytes
from app.paths import models_dir

pytestmark = [pytest.mark.qt_log_level_fail("WARNING"), pytest.mark.qt_log_ignore("propagateSizeHints")]

HEADS = ["Model", "Where", "Architecture", "Size", "Quantization", "Experts", "Memory on this computer", "Opening it"]


@pytest.fixture
def wizard(qtbot, tmp_path, monkeypatch):
    fake_home(tmp_path, monkeypatch)
    converted("tiny-mine")
    from ui.wizard import ConvertWizard
    gc.collect()
    w = ConvertWizard(None, models_dir())
    qtbot.addWidget(w)
    with qtbot.waitSignal(w.library.scanned, timeout=60_000):
        w.show()
    yield w
    w.close()
    gc.collect()


def rows(table) -> dict[str, list[str]]:
    return {table.item(r, 0).text(): [table.item(r, c).text() for c in range(table.columnCount())]
            for r in range(table.rowCount())}


def test_the_first_page_lists_the_models_found(wizard):
    t = wizard.library.table
    assert [t.horizontalHeaderItem(c).text() for c in range(t.columnCount())] == HEADS
    found = rows(t)
    assert len(found) == 8 and "Models on this computer</b> (8)" in wizard.library.title.text()
    name, where, arch, size, quant, experts, memory, opening = found["tinymoe:latest"]
    assert (where, arch, quant, experts) == ("Ollama", "llama", "MXFP4_MOE", "2 of 4")
    assert memory.startswith("fits: needs ") and " free now" in wizard.library.table.item(
        [r for r in range(t.rowCount()) if t.item(r, 0).text() == name][0], 6).toolTip()
    assert opening == "opened in place, no copy"
    hf = found["unsloth/tiny-GGUF/tiny-Q4_0.gguf"]
    assert (hf[1], hf[2], hf[4], hf[5]) == ("Hugging Face", "llama", "Q4_0", "dense")
    assert found["LiquidAI/LFM2-GGUF/lfm2_moe-f16.gguf"][1] == "LM Studio"
    big = found["big-00001-of-00002.gguf"]
    assert big[3].endswith(" (2 parts)") and big[7].startswith("copies ")  # a split GGUF is copied
    broken = found["broken.gguf"]
    assert broken[2] == "—" and "bytes" in broken[6] and broken[7] == "—"  # listed with its error, not opened


def test_picking_a_found_model_reads_it(qtbot, wizard):
    t = wizard.library.table
    row = next(r for r in range(t.rowCount()) if t.item(r, 0).text() == "tiny-q4_0.gguf")
    qtbot.mouseClick(t.viewport(), Qt.LeftButton, pos=t.visualItemRect(t.item(row, 0)).center())
    qtbot.waitUntil(lambda: wizard.summary is not None or wizard.state == "failed", timeout=20_000)
    assert wizard.summary.source.name == "tiny-q4_0.gguf" and "GGUF file" in wizard.facts.text()
    assert wizard.next_button.isEnabled()


def test_a_gguf_is_said_to_open_in_place(qtbot, wizard):
    with qtbot.waitSignal(wizard.library.scanned, timeout=60_000):
        wizard.library.refresh()
    assert rows(wizard.library.table)["tiny-q4_0.gguf"][7] == "opened in place, no copy"


def test_converted_models_are_listed_and_deleted_after_asking(qtbot, wizard):
    mine = wizard.library.mine
    assert mine.rowCount() == 1 and mine.item(0, 0).text() == "tiny-mine"
    assert mine.item(0, 1).text() == human_bytes(disk_models.disk_bytes(models_dir() / "tiny-mine"))
    button = wizard.findChild(QPushButton, "delete_tiny-mine")
    qtbot.mouseClick(button, Qt.LeftButton)
    box = next(w for w in QApplication.topLevelWidgets() if w.objectName() == "delete_confirm" and w.isVisible())
    qtbot.mouseClick(box.button(QMessageBox.Cancel), Qt.LeftButton)
    assert (models_dir() / "tiny-mine").is_dir()
    qtbot.mouseClick(button, Qt.LeftButton)
    box = next(w for w in QApplication.topLevelWidgets() if w.objectName() == "delete_confirm" and w.isVisible())
    assert "tiny-mine" in box.text()
    qtbot.mouseClick(box.button(QMessageBox.Yes), Qt.LeftButton)
    assert not (models_dir() / "tiny-mine").exists() and TINY.exists()
    assert mine.rowCount() == 0 and "none yet" in wizard.library.mine_title.text()
