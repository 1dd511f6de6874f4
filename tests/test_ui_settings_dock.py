"""Issue 18's settings and dashboard defects on a real Qt event loop (offscreen): byte budgets in
MB/GB with what fits, readable choices, a live language switch, the window's place restored, and
the dashboard as a dock with two speed axes and an honest Defrag line."""
from __future__ import annotations

import pytest
import test_ui_main_window as M
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QApplication, QDockWidget

from app import settings as S
from app.worker import STATS_MS, DefragResult
from engine import params as P
from ui import i18n

home, tiny = M.home, M.tiny
pytestmark = [pytest.mark.qt_log_level_fail("WARNING"),
              pytest.mark.qt_log_ignore("propagateSizeHints", "does not support raise")]


def test_byte_budgets_are_megabytes_or_gigabytes_and_choices_read_as_words(qtbot, tmp_path):
    from ui.param_form import ByteSizeEdit, SettingsDialog
    s = S.load(tmp_path / "settings.json")
    s.engine["expert_cache_bytes"] = 6 * 10**9  # above the 2^31-1 a spin box of bytes could hold
    d = SettingsDialog(None, s, fit=lambda values: f"needs {values['expert_cache_bytes']}")
    qtbot.addWidget(d)
    e = d.engine_form.editors["expert_cache_bytes"]
    assert isinstance(e, ByteSizeEdit) and e.unit.currentText() == "GB" and e.number.value() == 6.0
    assert d.engine_form.value("expert_cache_bytes") == 6 * 10**9
    e.unit.setCurrentIndex(0)  # the same budget in MB, not a new one
    assert e.number.value() == 6000.0 and d.engine_form.value("expert_cache_bytes") == 6 * 10**9
    e.number.setValue(1500)
    assert d.engine_form.value("expert_cache_bytes") == 1_500_000_000
    e.number.setValue(0)
    assert d.engine_form.value("expert_cache_bytes") is None and e.number.text() == "not set"
    assert "free now, of" in e.free.text() and e.accessibleName() and e.unit.accessibleName() == "Unit"
    e.number.setValue(2)
    qtbot.waitUntil(lambda: d.fit_label.text() == "needs 2000000", timeout=2_000)  # 2 MB: what fits, live
    theme, language = d.ui_form.editors["theme"], d.ui_form.editors["language"]
    assert [theme.itemText(i) for i in range(theme.count())] == ["Light", "Dark"]
    assert language.itemText(0) == "Same as the desktop" and d.ui_form.value("theme") == "light"
    simd = d.engine_form.editors["simd"]
    assert simd.itemText(0) == "Automatic" and d.engine_form.value("simd") == "auto"
    # the box says what the help says: "auto (default)" in the help reads "auto" in the box
    assert "auto" in P.PARAMS["expert_cache_size"].help
    assert d.engine_form.editors["expert_cache_size"].specialValueText() == "auto"
    assert d.engine_form.editors["threads"].specialValueText() == "auto"
    assert d.engine_form.values() | {} == P.defaults("engine") | {"expert_cache_bytes": 2_000_000}


def test_the_fit_line_names_what_the_model_needs(tiny):
    from app.worker import fit_text
    assert "fits" in fit_text(tiny, P.defaults("engine"), available=10**12)
    assert "does not fit" in fit_text(tiny, P.defaults("engine"), available=1000)


def test_the_language_changes_live(qtbot, home, tiny, qapp):
    w = M.open_window(qtbot, tiny)
    dash = w.open_dashboard()
    try:
        w.apply_settings({}, {"language": "zh_CN"})
        assert S.load().language == "zh_CN"
        assert w.send_button.text() == "发送" and w.new_button.text() == "新建对话"
        assert [a.text() for a in w.menuBar().actions()] == ["文件(&F)", "对话(&C)", "视图(&V)", "服务器(&R)"]
        assert w.input.placeholderText().startswith("给 Colibri 发消息")
        assert w.dashboard is not dash and w.dashboard_dock.widget() is w.dashboard  # rebuilt in Chinese
        w.apply_settings({}, {"language": "en"})
        assert w.send_button.text() == "Send" and w.translators == []
    finally:
        i18n.uninstall(qapp, w.translators)


def test_the_window_and_the_dashboard_dock_keep_their_place(qtbot, home, tiny):
    w = M.open_window(qtbot, tiny)
    assert w.dashboard_dock is None
    # the loading dialog hands the keyboard back: without that no window was active and no shortcut worked
    qtbot.waitUntil(lambda: QApplication.activeWindow() is w, timeout=2_000)
    qtbot.keyClick(w, Qt.Key_P, Qt.ControlModifier | Qt.ShiftModifier)  # Ctrl+Shift+P opens it
    dock = w.dashboard_dock
    # the rate is set at once, not queued behind a reply being written (whose loop sends the snapshots)
    assert w.flow.worker._stats_ms == STATS_MS
    assert isinstance(dock, QDockWidget) and dock.isVisible() and w.dockWidgetArea(dock) == Qt.RightDockWidgetArea
    assert not w.dashboard.isWindow()  # a dock in the chat window, not a window over it
    qtbot.waitUntil(lambda: w.dashboard.snapshot is not None, timeout=10_000)
    w.removeDockWidget(dock)
    w.addDockWidget(Qt.BottomDockWidgetArea, dock)
    dock.show()
    w.resize(720, 520)  # within the offscreen screen (800 x 600): restoreGeometry keeps a window on screen
    qtbot.keyClick(w, Qt.Key_P, Qt.ControlModifier | Qt.ShiftModifier)  # and hides it again
    assert not dock.isVisible()
    qtbot.keyClick(w, Qt.Key_P, Qt.ControlModifier | Qt.ShiftModifier)
    assert dock.isVisible()
    size = w.size()
    w.close()
    saved = S.load().window
    assert saved["dashboard"] == "shown" and saved["geometry"] and saved["state"]
    again = M.open_window(qtbot, tiny)
    assert again.size() == size
    assert again.dashboard_dock is not None and again.dockWidgetArea(again.dashboard_dock) == Qt.BottomDockWidgetArea


def test_decode_and_prefill_have_their_own_axes_and_defrag_says_what_changed(qtbot):
    from PySide6.QtCore import QObject, Signal

    from ui import theme
    from ui.dashboard import Dashboard
    from ui.dashboard_text import defrag_text

    class Worker(QObject):
        stats, text, defragged, failed = Signal(object), Signal(int, str, object), Signal(object), Signal(str, str)

        def watch_stats(self, ms):
            pass

        def defrag(self):
            pass
    d = Dashboard(Worker(), theme.palette("light"))
    qtbot.addWidget(d)
    d.prefill_curve.setData([-3.0, -1.0], [2500.0, 3100.0])
    d.decode_curve.setData([-3.0, -2.0, -1.0], [31.0, 29.0, 30.0])
    d.speed_plot.getPlotItem().vb.autoRange()
    assert d.prefill_curve.getViewBox() is d.prefill_view  # its own scale, on the right axis
    assert d.decode_curve.getViewBox() is d.speed_plot.getPlotItem().vb
    lo, hi = d.speed_plot.getPlotItem().vb.viewRange()[1]
    assert hi < 100  # decode fills its own axis instead of lying flat under prefill's thousands
    assert d.speed_plot.getPlotItem().getAxis("right").labelText == "prefill tok/s (dots)"
    mb = 10**6
    assert defrag_text(DefragResult(int(2.7 * mb), 595 * mb, 595 * mb)).startswith("Released 2.7 MB of free pool")
    assert defrag_text(DefragResult(40 * mb, 600 * mb, 562 * mb)).startswith("Gave 40.0 MB back to the system")
    assert defrag_text(DefragResult(0, 600 * mb, 600 * mb)).startswith("Nothing to give back")
    text = theme.palette("light")["text"]
    for axis in (d.heat_plot.getAxis("left"), d.heat_plot.getAxis("bottom"), d.heat_bar.getAxis("right"),
                 d.speed_plot.getAxis("bottom")):  # axis titles in the text colour (they were border-grey)
        assert axis.labelStyle["color"] == text, (axis.labelText, axis.labelStyle)
    tip = d.pool_table.horizontalHeaderItem(3).toolTip()
    assert "slab pages" in tip and "Defrag cannot lower it" in tip  # "small 100% fragmented" explained
    d.show()
    d.resize(500, 800)
    qtbot.waitUntil(lambda: d.columns == 1, timeout=2_000)  # a narrow dock: one column that scrolls
    d.resize(1400, 800)
    qtbot.waitUntil(lambda: d.columns == 3, timeout=2_000)


class _WideScreen:
    """A 1920-pixel desktop (the offscreen platform's screen is 800 x 600)."""

    def availableGeometry(self):  # noqa: N802 - Qt's name
        from PySide6.QtCore import QRect
        return QRect(0, 0, 1920, 1080)


def test_the_dashboard_shown_again_in_a_narrowed_window_gets_a_column_of_room(qtbot, home, tiny):
    """Shown, hidden, the window made narrow (1024 wide), shown again: the dock was squeezed to what the
    chat left it (about 220 pixels, its plots cut off behind a scroll bar); now the window grows where the
    screen has room, as at the first showing."""
    from ui.dashboard_dock import DOCK_W
    w = M.open_window(qtbot, tiny)
    w.screen = _WideScreen  # an instance attribute: the window's own calls of self.screen() see the wide desktop
    w.resize(1100, 640)
    w.open_dashboard()
    qtbot.waitUntil(lambda: w.dashboard_dock.width() >= DOCK_W - 10, timeout=5_000)
    w.open_dashboard(toggle=True)
    assert not w.dashboard_dock.isVisible()
    w.resize(1024, 640)
    qtbot.waitUntil(lambda: w.width() == 1024, timeout=5_000)
    w.open_dashboard()
    qtbot.waitUntil(lambda: w.dashboard_dock.width() >= DOCK_W - 10, timeout=5_000)
    assert w.width() > 1024 and w.centralWidget().width() >= w.centralWidget().minimumSizeHint().width()


def test_no_help_line_of_the_settings_dialogs_is_cut_off(qtbot, tmp_path):
    """Wrapped help lines get the height their text needs: the chat settings dialog laid its form out
    bare, and five help lines (top-p, min-p, the three penalties) lost their last line."""
    from PySide6.QtWidgets import QLabel
    from ui.param_form import ConversationDialog, SettingsDialog
    s = S.load(tmp_path / "settings.json")
    for d in (ConversationDialog(None, "", s.sampling_values(), s, s.sampling_values(), {}), SettingsDialog(None, s)):
        qtbot.addWidget(d)
        d.show()
        qtbot.waitExposed(d)
        wrapped = [lab for lab in d.findChildren(QLabel) if lab.wordWrap() and lab.isVisible() and lab.text()]

        def cut(labels: list[QLabel]) -> list[str]:
            return [lab.text() for lab in labels if lab.height() < lab.heightForWidth(lab.width())]
        qtbot.waitUntil(lambda labels=wrapped: not cut(labels), timeout=2_000)  # laid out by then
        assert len(wrapped) >= 8, type(d).__name__
