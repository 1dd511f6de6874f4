"""Accessibility: every control a keyboard can reach has a name for screen readers, Tab walks the
main controls in reading order, and the main actions have shortcuts."""
from __future__ import annotations

import pytest
import test_ui_main_window as M
from PySide6.QtCore import Qt
from PySide6.QtGui import QAccessible
from PySide6.QtWidgets import QAbstractSpinBox, QApplication, QWidget

home, tiny = M.home, M.tiny  # fixtures shared with the main window's tests

# the offscreen platform's notes about size hints and raise() are no bug of ours
pytestmark = [pytest.mark.qt_log_level_fail("WARNING"),
              pytest.mark.qt_log_ignore("propagateSizeHints", r"does not support raise\(\)")]


def focusable(root: QWidget) -> list[QWidget]:
    """Widgets Tab can reach; a spin box's inner line edit is part of the named spin box."""
    return [w for w in root.findChildren(QWidget) if w.isVisible() and w.focusPolicy() & Qt.TabFocus
            and not isinstance(w.parentWidget(), QAbstractSpinBox)]


def unnamed(root: QWidget) -> list[str]:
    """Focusable widgets with no accessible name, set on the widget and as a screen reader reads it."""
    out = []
    for w in focusable(root):
        iface = QAccessible.queryAccessibleInterface(w)
        if not w.accessibleName().strip() or iface is None or not iface.text(QAccessible.Name).strip():
            out.append(f"{type(w).__name__} {w.objectName()!r}")
    return out


def test_every_focusable_control_of_the_main_window_and_its_dialogs_has_a_name(qtbot, home, tiny):
    from ui.param_form import ConversationDialog, SettingsDialog
    w = M.open_window(qtbot, tiny)
    controls = focusable(w)
    assert {c.objectName() for c in controls} >= {"new_chat", "search", "conversations", "model_picker",
                                                   "chat_settings", "settings", "chat", "input", "primary"}
    assert unnamed(w) == []
    assert w.send_button.accessibleName() == "Send the message"
    s = SettingsDialog(w, w.settings)
    c = ConversationDialog(w, "", w.settings.sampling_values())
    for d in (s, c):
        d.show()
        assert len(focusable(d)) > 5 and unnamed(d) == []
        d.reject()
    wizard = w.import_model()
    qtbot.waitExposed(wizard)
    assert unnamed(wizard) == []
    wizard.close()
    dashboard = w.open_dashboard()
    qtbot.waitExposed(dashboard)
    assert unnamed(dashboard) == []
    dashboard.close()


def test_tab_cycles_through_the_main_controls_in_reading_order(qtbot, home, tiny):
    w = M.open_window(qtbot, tiny)
    w.activateWindow()
    qtbot.waitUntil(lambda: QApplication.activeWindow() is w)
    w.new_button.setFocus()
    chain = [w.new_button, w.search, w.list, w.model_picker, w.chat_settings_button, w.settings_button,
             w.view, w.attach_button, w.input, w.send_button, w.policy_box]
    seen = [QApplication.focusWidget()]
    for _ in range(len(chain)):
        qtbot.keyClick(QApplication.focusWidget(), Qt.Key_Tab)
        seen.append(QApplication.focusWidget())
    names = [x.objectName() for x in seen]
    assert names == [x.objectName() for x in chain + [w.new_button]]  # and round again
    qtbot.keyClick(QApplication.focusWidget(), Qt.Key_Backtab)
    assert QApplication.focusWidget() is w.policy_box


def test_the_main_actions_have_shortcuts(qtbot, home, tiny):
    w = M.open_window(qtbot, tiny)
    shortcuts = {a.text().replace("&", ""): a.shortcut().toString()
                 for m in w.menuBar().actions() for a in m.menu().actions()}
    assert shortcuts["New chat"] == "Ctrl+N" and shortcuts["Send"] == "Ctrl+Return"
    assert shortcuts["Stop"] == "Esc" and shortcuts["Regenerate"] == "Ctrl+R"
    assert shortcuts["Settings…"] == "Ctrl+," and shortcuts["Performance dashboard"] == "Ctrl+Shift+P"
    w.activateWindow()
    qtbot.waitUntil(lambda: QApplication.activeWindow() is w)
    w.list.setFocus()
    first = w.conv_id
    qtbot.keyClick(w.list, Qt.Key_N, Qt.ControlModifier)  # through the shortcut map, as a user's key
    assert w.conv_id != first and QApplication.focusWidget() is w.input
