"""The dashboard's speed plot after a reply: a short reply's decode figure stays on the plot."""
from __future__ import annotations

import numpy as np
import pytest
from PySide6.QtCore import QObject, Signal

from ui import theme

pytestmark = [pytest.mark.qt_log_level_fail("WARNING"), pytest.mark.qt_log_ignore("propagateSizeHints")]


class FakeWorker(QObject):
    """The signals and slots the dashboard uses; the test plays the worker's answers."""
    stats, text, defragged, failed = Signal(object), Signal(int, str, object), Signal(object), Signal(str, str)

    def watch_stats(self, ms: int) -> None:
        pass

    def defrag(self) -> None:
        pass


def test_a_short_replys_decode_speed_is_drawn_after_it_ends(qtbot, default_converted):
    from engine.api import Engine
    from ui.dashboard import Dashboard
    eng = Engine(default_converted, threads=1)
    try:
        steps = list(eng.generate([{"role": "user", "content": "Hi"}], max_tokens=6, temperature=0))
        snap = eng.stats()
    finally:
        eng.close()
    wk = FakeWorker()
    d = Dashboard(wk, theme.palette("light"), str(default_converted))
    qtbot.addWidget(d)
    d.show()
    wk.stats.emit(snap)  # opened after the reply: none in its history, and the plot says so instead of 0-1 axes
    assert d.speed_chart.currentIndex() == 1 and "before the dashboard opened" in d.speed_chart.widget(1).text()
    assert d.speed_text.text().startswith("last reply: prefill")
    wk.text.emit(1, steps[-1].text, steps[-1])  # the reply's last step, then the snapshot after it
    wk.stats.emit(snap)
    assert d.speed_chart.currentIndex() == 0
    for _ in range(3):  # idle snapshots: no step since
        wk.stats.emit(snap)
    decode = np.asarray(d.history["decode"], float)
    assert np.isfinite(decode).sum() == 1 and np.isnan(decode[-1])
    x, y = d.decode_dots.getData()
    assert len(y) == 1 and y[0] == pytest.approx(steps[-1].decode_tok_s) and x[0] < 0
    low, high = d.speed_plot.getPlotItem().getViewBox().viewRange()[1]  # one figure: drawn from zero, not
    assert low == 0 and y[0] < high <= y[0] * 1.2 + 1                 # on a 1 tok/s range around it
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
    wk.stats.emit(snap)
    assert d.speed_text.text() == "No reply yet: the speeds appear with the first one."
    assert d.speed_chart.currentIndex() == 0  # the caption says it: not twice
    assert d.cache_chart.currentIndex() == 1 and "dense" in d.cache_chart.widget(1).text()  # SmolLM2: no experts
    assert d.speed_plot.getPlotItem().getAxis("bottom").labelText == "seconds ago"
    d.close()
