"""Issue 47 item 10 on a real Qt loop (offscreen) and a real engine: the attachment chips keep their
size under the "will not fit" warning, the status line lets go of the warning with the file, and the
transcript's ✂ marker counts what the banner counts."""
from __future__ import annotations

import re

import pytest
import test_ui_context as C
import test_ui_main_window as M
from PySide6.QtWidgets import QToolButton

home, tiny = M.home, M.tiny
pytestmark = [pytest.mark.qt_log_level_fail("WARNING"), pytest.mark.qt_log_ignore("propagateSizeHints")]


def test_chips_keep_their_size_and_the_status_line_drops_the_warning_with_the_file(qtbot, home, tiny, tmp_path):
    w = C.small_window(qtbot, tiny)
    w.resize(900, 700)
    note = tmp_path / "note.md"
    note.write_text("a short note")
    key = w.attach(note)
    qtbot.waitUntil(lambda: w.tray.items[key].tokens is not None, timeout=10_000)
    chip = w.tray._chips[key][0]
    qtbot.waitUntil(lambda: chip.isVisible() and chip.size() == chip.sizeHint(), timeout=5_000)  # laid out
    size = chip.size()
    big = tmp_path / "big.txt"
    big.write_text("lorem ipsum dolor " * 200)
    big_key = w.attach(big)
    qtbot.waitUntil(lambda: "Will not fit" in w.tray.warning.text(), timeout=10_000)
    qtbot.waitUntil(lambda: w.tray.warning.isVisible(), timeout=2_000)
    qtbot.wait(50)  # the layout settles
    assert chip.size() == size  # the wrapped warning does not stretch the chips

    w.send("summarise")  # refused: the status line repeats the warning
    assert w.statusBar().currentMessage().startswith("Will not fit")
    w.tray._chips[big_key][0].findChild(QToolButton).click()
    qtbot.waitUntil(lambda: w.draft_plan is not None and w.draft_plan.fits, timeout=10_000)
    assert w.tray.warning.text() == "" and not w.tray.warning.isVisible()
    assert w.statusBar().currentMessage() == ""  # not a warning about a file that is gone


def test_the_marker_counts_the_messages_the_banner_counts(qtbot, home, tiny):
    w = C.small_window(qtbot, tiny)
    cid = C.long_chat(w)
    w.open_conversation(cid)
    qtbot.waitUntil(C.planned(w, cid), timeout=10_000)
    before = len(w.plans[cid].dropped)
    w.input.setPlainText("and now a longer message " + "word " * 30)
    qtbot.waitUntil(lambda: "Sending leaves" in w.tray.warning.text(), timeout=10_000)
    banner = int(re.search(r"Sending leaves (\d+) earlier", w.tray.warning.text()).group(1))
    assert banner > before  # the draft leaves more out than the chat alone
    qtbot.waitUntil(lambda: f"From here, {banner} messages are not sent" in w.view.toPlainText(), timeout=5_000)
    w.input.clear()  # and without the draft, the chat's own count again
    qtbot.waitUntil(lambda: f"From here, {before} messages are not sent" in w.view.toPlainText(), timeout=5_000)
