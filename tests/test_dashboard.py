"""The performance dashboard on a real Qt loop (offscreen) with a real Engine on the worker's thread."""
from __future__ import annotations

import dataclasses
import gc
import time

import numpy as np
import pytest
from conftest import HF_FIXTURES
from PySide6.QtCore import QMetaObject, QObject, Qt, QThread, Signal

from app import worker as W
from engine.throttle import ThrottleEvent
from ui import theme

# the offscreen platform notes what it cannot do (size hints, raising a window): no bug of ours
pytestmark = [pytest.mark.qt_log_level_fail("WARNING"),
              pytest.mark.qt_log_ignore("propagateSizeHints", "does not support raise")]
CHAT = [{"role": "user", "content": "Tell me about hummingbirds."}]


@pytest.fixture(scope="module")
def moe(tmp_path_factory):
    from engine.convert.convert import convert
    return str(convert(HF_FIXTURES / "mixtral", tmp_path_factory.mktemp("dash") / "mixtral", "int8").path)


class Front(QObject):
    """The GUI side of the worker, as ModelFlow is: requests out, and the worker's answers relayed
    on the GUI thread (waiting on a worker-thread signal directly would run the wait's slot there)."""
    load = Signal(str, dict, bool)
    generate = Signal(int, list, dict)
    loaded, finished, stats, defragged = Signal(object), Signal(int, object), Signal(object), Signal(object)


@pytest.fixture
def worker(qtbot, moe):
    th = QThread()
    wk = W.EngineWorker()
    wk.moveToThread(th)
    wk.front = Front()
    wk.front.load.connect(wk.load)
    wk.front.generate.connect(wk.generate)
    for name in ("loaded", "finished", "stats", "defragged"):
        getattr(wk, name).connect(getattr(wk.front, name))
    th.start()
    with qtbot.waitSignal(wk.front.loaded, timeout=60_000):
        wk.front.load.emit(moe, {"threads": 1, "expert_cache_size": 2}, True)
    yield wk
    wk.request_stop()
    QMetaObject.invokeMethod(wk, "close", Qt.BlockingQueuedConnection)
    th.quit()
    th.wait()


@pytest.fixture
def dash(qtbot, worker, moe):
    from ui.dashboard import Dashboard
    gc.collect()  # Qt garbage of earlier tests goes now, on the GUI thread, not in a worker's collection
    d = Dashboard(worker, theme.palette("light"), moe)
    qtbot.addWidget(d)
    with qtbot.waitSignal(worker.front.stats, timeout=10_000):  # showing it starts the worker's stats timer
        d.show()
    yield d
    d.close()
    del d
    gc.collect()  # pyqtgraph's items form cycles: collect them here, on the GUI thread


def test_live_figures_follow_real_snapshots(qtbot, worker, dash):
    with qtbot.waitSignal(worker.front.finished, timeout=60_000):
        worker.front.generate.emit(1, CHAT, {"max_tokens": 40, "temperature": 0.8, "seed": 3})
    with qtbot.waitSignal(worker.front.stats, timeout=5_000):  # the snapshot after the reply
        pass
    with qtbot.waitSignal(worker.front.stats, timeout=5_000) as got:  # the named timer keeps ticking when idle
        pass
    snap = got.args[0]
    qtbot.waitUntil(lambda: dash.snapshot is snap, timeout=2_000)
    dash.draw_now()  # its panels, drawn one per turn of the event loop
    acts = np.array(snap.expert_cache.activations)
    assert dash.heat.image.shape == (snap.num_layers, snap.num_experts) == (2, 8)
    assert np.array_equal(dash.heat.image, acts) and acts.sum() > 0
    assert "busiest" in dash.heat_text.text()
    rss = np.asarray(dash.history["rss"])
    assert len(rss) >= 3 and rss[-1] == pytest.approx(snap.rss_bytes / 1e6)
    decode = np.asarray(dash.history["decode"])
    assert np.isfinite(decode).any() and np.isnan(decode[-1])  # measured while generating, a gap when idle
    assert f"{snap.expert_cache.hit_rate:.0%}" in dash.cache_text.text() and dash.cache_chart.currentIndex() == 0
    assert dash.pool_table.item(1, 0).text() and "peak" in dash.pool_text.text()
    assert "mixtral" in dash.header.text() and "8 experts, top-2" in dash.header.text()
    # hardware panels: a value or the engine's reason, never empty
    assert "°C" in dash.temp_text.text() or "not available" in dash.temp_text.text()
    assert dash.gpu_text.text() or "NVIDIA" in dash.gpu_chart.widget(1).text()
    assert "J per token" in dash.power_text.text()


def test_hiding_stops_the_stats_timer(qtbot, worker, dash):
    seen = []
    worker.front.stats.connect(lambda s: seen.append(time.monotonic()))
    qtbot.wait(1_200)
    assert len(seen) >= 2  # every STATS_MS
    dash.hide()
    qtbot.wait(200)
    seen.clear()
    qtbot.wait(1_200)
    assert seen == []


def test_defrag_round_trips_through_the_worker(qtbot, worker, dash):
    with qtbot.waitSignal(worker.front.defragged, timeout=10_000) as done:
        qtbot.mouseClick(dash.defrag_button, Qt.LeftButton)
        assert not dash.defrag_button.isEnabled()
    r = done.args[0]
    assert r.returned_bytes >= 0 and r.rss_before > 0 and r.rss_after > 0
    qtbot.waitUntil(lambda: dash.defrag_button.isEnabled(), timeout=2_000)
    text = dash.defrag_text.text()
    assert "RSS" in text and text.startswith(("Gave", "Released", "Nothing to give back"))
    assert "Gave" not in text or -r.rss_change >= r.returned_bytes // 2  # never a claim RSS does not show


def test_throttling_is_marked_and_advised(qtbot, worker, dash):
    snap = dash.snapshot
    hot = dataclasses.replace(snap, threads=1, configured_threads=2, throttle_events=(
        ThrottleEvent(time.time() - 5, 2, 1, 91.0, "91.0 °C is above the high-water mark 85 °C"),))
    dash.on_stats(hot)
    dash.draw_now()  # before the worker's next snapshot draws over it
    assert any("Thermal throttling is active" in line for line in dash.advice)
    assert len(dash._markers) == 1 and "2→1" in dash._markers[0].label.toPlainText()
    assert "threads 1 of 2" in dash.temp_text.text() and "1 throttle event" in dash.temp_text.text()
    assert "Advice" in dash.advice_label.text()


def test_view_menu_opens_the_dashboard(qtbot, tmp_path, monkeypatch, moe):
    from app import settings as S
    from app.history import History
    from ui.main_window import MainWindow
    monkeypatch.setenv("COLIBRI_HOME", str(tmp_path))
    gc.collect()
    settings = S.load()
    settings.model = moe
    w = MainWindow(settings, History())
    qtbot.addWidget(w)
    w.show()
    with qtbot.waitSignal(w.flow.ready, timeout=60_000):
        w.flow.start()
    action = next(a for m in w.menuBar().actions() if m.text() == "&View"
                  for a in m.menu().actions() if a.text() == "Performance dashboard")
    action.trigger()  # the worker's stats reach the dashboard queued, on this thread
    dashboard = w.dashboard
    qtbot.waitUntil(lambda: dashboard.snapshot is not None, timeout=10_000)
    assert w.dashboard.isVisible() and w.dashboard.model_path == moe
    w.dashboard.close()
    w.close()
    del w
    gc.collect()
