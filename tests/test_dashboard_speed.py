"""The dashboard's speed plot after a reply: a short reply's decode figure stays on the plot."""
from __future__ import annotations

import numpy as np
import pytest
from PySide6.QtCore import QObject, Signal
from PySide6.QtWidgets import QApplication

from ui import theme

pytestmark = [pytest.mark.qt_log_level_fail("WARNING"), pytest.mark.qt_log_ignore("propagateSizeHints")]


class FakeWorker(QObject):
    """The signals and slots the dashboard uses; the test plays the worker's answers."""
    stats, text, defragged, failed = Signal(object), Signal(int, str, object), Signal(object), Signal(str, str)

    def watch_stats(self, ms: int) -> None:
        pass

    def defrag(self) -> None:
        pass


def emit(wk, d, snap) -> None:
    """A snapshot from the worker, its panels drawn (the dashboard draws one per turn of the event loop)."""
    wk.stats.emit(snap)
    d.draw_now()


def short_reply(model) -> tuple[list, object]:
    """A real 6-token reply's steps and the engine's snapshot after it."""
    from engine.api import Engine
    eng = Engine(model, threads=1)
    try:
        steps = list(eng.generate([{"role": "user", "content": "Hi"}], max_tokens=6, temperature=0))
        return steps, eng.stats()
    finally:
        eng.close()


def test_a_short_replys_decode_speed_is_drawn_after_it_ends(qtbot, default_converted):
    from ui.dashboard import Dashboard
    steps, snap = short_reply(default_converted)
    wk = FakeWorker()
    d = Dashboard(wk, theme.palette("light"), str(default_converted))
    qtbot.addWidget(d)
    d.show()
    emit(wk, d, snap)  # opened after the reply: none in its history, and the plot says so instead of 0-1 axes
    assert d.speed_chart.currentIndex() == 1 and "before the dashboard opened" in d.speed_chart.widget(1).text()
    assert d.speed_text.text().startswith("last reply: prefill")
    wk.text.emit(1, steps[-1].text, steps[-1])  # the reply's last step, then the snapshot after it
    emit(wk, d, snap)
    assert d.speed_chart.currentIndex() == 0
    for _ in range(3):  # idle snapshots: no step since
        emit(wk, d, snap)
    decode = np.asarray(d.history["decode"], float)
    assert np.isfinite(decode).sum() == 1 and np.isnan(decode[-1])
    x, y = d.decode_dots.getData()
    assert len(y) == 1 and y[0] == pytest.approx(steps[-1].decode_tok_s) and x[0] < 0
    low, high = d.speed_plot.getPlotItem().getViewBox().viewRange()[1]  # one figure: drawn from zero, not
    assert low == 0 and y[0] * 1.15 <= high <= max(y[0] * 1.15, 1) * 4 / 3  # on a 1 tok/s range around it
    # (the top is 15% above it, rounded up to the next of 1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8 x 10^k: at most
    # 4/3 up, from 1.5 to 2 as at 131 tok/s on a Zen 4 VM, where a bound of 1.25 failed)
    d.close()


def test_a_fresh_engine_reports_no_reply_instead_of_zero_speeds(qtbot, default_converted):
    from engine.api import Engine
    from ui.dashboard import Dashboard
    eng = Engine(default_converted, threads=1)
    try:
        snap = eng.stats()
    finally:
        eng.close()
    wk = FakeWorker()
    d = Dashboard(wk, theme.palette("light"), str(default_converted))
    qtbot.addWidget(d)
    emit(wk, d, snap)
    assert d.speed_text.text() == "No reply yet: the speeds appear with the first one."
    assert d.speed_chart.currentIndex() == 0  # the caption says it: not twice
    assert d.cache_chart.currentIndex() == 1 and "dense" in d.cache_chart.widget(1).text()  # SmolLM2: no experts
    assert d.speed_plot.getPlotItem().getAxis("bottom").labelText == "seconds ago"
    d.close()


def test_changing_figures_neither_move_the_panels_nor_hold_the_loop(qtbot, default_converted):
    """Twice a second the captions change (a line more, a line less): the panels must keep their size
    (each change resized every plot and repainted the whole window, 40-60 ms of the GUI thread), and a
    snapshot is drawn over several turns of the event loop, not in one."""
    import dataclasses

    from PySide6.QtCore import QEvent

    from ui.dashboard import Dashboard
    steps, snap = short_reply(default_converted)
    long = dataclasses.replace(snap, tokens_generated=123_456_789, tokens_prefilled=987_654_321,
                               context_used=3_999)  # longer lines: they wrap once more at this width
    wk = FakeWorker()
    d = Dashboard(wk, theme.palette("light"), str(default_converted))
    qtbot.addWidget(d)
    d.resize(430, 900)
    d.show()

    def one(s, with_step: bool) -> None:
        if with_step:
            wk.text.emit(1, steps[-1].text, steps[-1])
        wk.stats.emit(s)
        assert d.drawing  # the rest waits for later turns of the loop
        qtbot.waitUntil(lambda: not d.drawing, timeout=5_000)

    for s, with_step in ((long, True), (snap, False)):  # each caption at its tallest once
        one(s, with_step)
    qtbot.wait(50)
    moved = []

    class Watch(QObject):
        def eventFilter(self, obj, e):  # noqa: N802 - Qt's name
            if e.type() == QEvent.Resize and obj.isWidgetType() and obj.window() is d:
                moved.append(f"{type(obj).__name__} {obj.objectName()}")
            return False
    watch = Watch()
    QApplication.instance().installEventFilter(watch)
    try:
        for _ in range(3):
            for s, with_step in ((snap, True), (long, False), (snap, False), (long, True)):
                one(s, with_step)
            qtbot.wait(20)
    finally:
        QApplication.instance().removeEventFilter(watch)
    assert moved == []
    d.close()
