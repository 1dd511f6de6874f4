"""Issue 47 item 5 on a real Qt loop (offscreen), real SQLite and a real engine: every message has its
actions — Copy, Regenerate and Delete on each reply, Edit, Copy and Delete on each of the user's — and
regenerating an earlier reply makes a new version there, a branch, as the newest reply's does."""
from __future__ import annotations

import pytest
import test_ui_main_window as M
from PySide6.QtWidgets import QApplication, QMessageBox
from test_ui_versions import click

home, tiny = M.home, M.tiny
pytestmark = [pytest.mark.qt_log_level_fail("WARNING"), pytest.mark.qt_log_ignore("propagateSizeHints")]


def test_every_message_has_its_actions_and_an_earlier_reply_gets_a_new_version(qtbot, home, tiny):
    w = M.open_window(qtbot, tiny, max_tokens=6, temperature=1.0, seed=1)
    M.send(qtbot, w, "Name a bird")
    M.send(qtbot, w, "Why that one?")
    u1, a1, u2, a2 = w.history.messages(w.conv_id)
    shown = w.view.toHtml()
    for m in (u1, a1, u2, a2):  # the older exchange too, not only the newest reply
        assert f":copymsg:{m.id}" in shown and f":delete:{m.id}" in shown
    for m in (a1, a2):
        assert f":regenerate:{m.id}" in shown
    for m in (u1, u2):
        assert f":edit:{m.id}" in shown

    click(w, f"copymsg:{u1.id}")
    assert QApplication.clipboard().text() == "Name a bird"

    w.history.set_options(w.conv_id, "", {"seed": 2, "temperature": 1.0, "max_tokens": 6})
    click(w, f"regenerate:{a1.id}")  # the first reply, not the last
    qtbot.waitUntil(lambda: w.busy == "", timeout=30_000)
    path = w.history.messages(w.conv_id)
    assert [m.id for m in path[:1]] == [u1.id] and len(path) == 2  # a branch at the first reply
    assert path[1].id not in (a1.id, a2.id) and (path[1].version, path[1].versions) == (2, 2)
    click(w, f"version:{path[1].id}:-1")  # ‹ : the first reply and what followed it, kept
    assert [m.id for m in w.history.messages(w.conv_id)] == [u1.id, a1.id, u2.id, a2.id]

    click(w, f"delete:{u2.id}")  # the second question and its reply
    qtbot.waitUntil(lambda: bool(M.dialogs("delete_message_dialog")), timeout=5_000)
    box = M.dialogs("delete_message_dialog")[0]
    assert "below it" in box.text()
    box.button(QMessageBox.Yes).click()
    qtbot.waitUntil(lambda: [m.id for m in w.history.messages(w.conv_id)] == [u1.id, a1.id], timeout=5_000)
    assert "Why that one?" not in w.view.toPlainText()
