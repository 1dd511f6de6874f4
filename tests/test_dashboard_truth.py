"""Issue 47 item 6 on a real Qt loop (offscreen) with real engines on the worker's thread: the
dashboard says true things on a dense model and an MoE one, in either theme, at any text size."""
from __future__ import annotations

import dataclasses
import gc
import time

import pytest
import test_dashboard as D
from PySide6.QtCore import QMetaObject, Qt, QThread

from app import worker as W
from engine.throttle import ThrottleEvent
from ui import theme

moe, worker, dash = D.moe, D.worker, D.dash
pytestmark = D.pytestmark
DARK = theme.palette("dark")


@pytest.fixture(scope="module")
def dense(tmp_path_factory):
    from conftest import HF_FIXTURES
    from engine.convert.convert import convert
    return str(convert(HF_FIXTURES / "qwen2", tmp_path_factory.mktemp("dense") / "qwen2", "keep").path)


@pytest.fixture
def dense_worker(qtbot, dense):
    th = QThread()
    wk = W.EngineWorker()
    wk.moveToThread(th)
    wk.front = D.Front()
    wk.front.load.connect(wk.load)
    wk.front.generate.connect(wk.generate)
    for name in ("loaded", "finished", "stats", "defragged"):
        getattr(wk, name).connect(getattr(wk.front, name))
    th.start()
    with qtbot.waitSignal(wk.front.loaded, timeout=60_000):
        wk.front.load.emit(dense, {"threads": 1}, True)
    yield wk
    wk.request_stop()
    QMetaObject.invokeMethod(wk, "close", Qt.BlockingQueuedConnection)
    th.quit()
    th.wait()


def reply(qtbot, wk, max_tokens: int) -> int:
    """Tokens the reply wrote."""
    with qtbot.waitSignal(wk.front.finished, timeout=60_000) as done:
        wk.front.generate.emit(1, D.CHAT, {"max_tokens": max_tokens, "temperature": 0.8, "seed": 3})
    return done.args[1].step.generated_tokens


def idle_snapshot(qtbot, wk, d):
    with qtbot.waitSignal(wk.front.stats, timeout=5_000):
        pass
    with qtbot.waitSignal(wk.front.stats, timeout=5_000) as got:
        pass
    qtbot.waitUntil(lambda: d.snapshot is got.args[0], timeout=2_000)
    d.draw_now()
    return got.args[0]


def test_a_dense_model_shows_no_expert_cache_and_last_reply_is_that_reply(qtbot, dense_worker, dense):
    from ui.dashboard import Dashboard
    gc.collect()
    d = Dashboard(dense_worker, theme.palette("light"), dense)
    qtbot.addWidget(d)
    d.show()
    assert all(p.isHidden() for p in d.moe_panels)  # not even empty axes before the first figures
    first = reply(qtbot, dense_worker, 12)
    second = reply(qtbot, dense_worker, 5)
    snap = idle_snapshot(qtbot, dense_worker, d)
    assert snap.num_experts == 1 and all(p.isHidden() for p in d.moe_panels)
    shown = " ".join(lab.text() for lab in d.findChildren(type(d.speed_text)) if lab.isVisibleTo(d))
    assert "hit rate" not in shown and "prefetch" not in shown
    text = d.speed_text.text()
    assert text.startswith("last reply: ") and f", {second} tokens written" in text  # the second reply's only
    assert f"since the model loaded: {snap.tokens_generated:,} tokens generated" in text
    assert snap.tokens_generated >= first + second > second
    d.close()
    gc.collect()


def test_prefetch_missing_temperature_and_thread_changes_are_told_apart(qtbot, worker, dash):
    snap = dash.snapshot
    assert not any(p.isHidden() for p in dash.moe_panels)  # an MoE model: its expert panels, under Speed
    qtbot.waitUntil(lambda: dash.panels[0].geometry().bottom() < dash.moe_panels[0].geometry().top(), timeout=2_000)
    off = dataclasses.replace(snap, expert_cache=dataclasses.replace(snap.expert_cache, prefetch_enabled=False))
    dash.on_stats(off)
    dash.draw_now()
    assert "prefetch accuracy — (off: prefetch_window is 0)" in dash.cache_text.text()
    unknown = dataclasses.replace(snap, expert_cache=dataclasses.replace(
        snap.expert_cache, prefetch_enabled=True, prefetch_accuracy=None, prefetch_paused=False))
    dash.on_stats(unknown)
    dash.draw_now()
    assert "prefetch accuracy — (no guess checked yet)" in dash.cache_text.text()

    temps = dash.history["temp"]
    for i in range(len(temps)):
        temps[i] = float("nan")  # a machine without a temperature sensor
    now = time.time()
    events = (ThrottleEvent(now - 20, 2, 1, 91.0, "91.0 °C is above the high-water mark 85 °C"),
              ThrottleEvent(now - 5, 1, 2, float("nan"), "other programs use 0.01 CPUs: back to 2 threads"))
    cold = dataclasses.replace(snap, hardware=dataclasses.replace(snap.hardware, cpu_temp_c=None),
                               threads=2, configured_threads=2, throttle_events=events)
    dash.on_stats(cold)
    dash.draw_now()
    pi = dash.temp_plot.getPlotItem()
    assert dash.temp_chart.currentIndex() == 0  # the thread changes are drawn…
    assert not pi.getAxis("left").isVisible()  # …with no °C axis for a sensor that is missing
    assert "CPU temperature" not in [label.text for _, label in pi.legend.items]
    text = dash.temp_text.text()
    assert "thermal: 1 throttle event(s)" in text and "thread tuner: 1 change(s)" in text
    colors = sorted(m.pen.color().name() for m in dash._markers)
    assert colors == sorted([dash.colors["danger"], dash.colors["muted"]])


def test_large_text_leaves_every_axis_title_whole(qtbot, worker, moe):
    from ui.dashboard import Dashboard
    gc.collect()
    d = Dashboard(worker, theme.palette("light"), moe, font_pt=18)
    qtbot.addWidget(d)
    d.resize(460, 800)  # the dock's width
    with qtbot.waitSignal(worker.front.stats, timeout=10_000):
        d.show()
    qtbot.waitUntil(lambda: d.snapshot is not None, timeout=5_000)
    d.draw_now()
    qtbot.wait(50)
    for plot in (d.speed_plot, d.cache_plot, d.rss_plot, d.temp_plot, d.power_plot, d.load_plot, d.gpu_plot):
        for side in ("left", "right"):
            ax = plot.getAxis(side)
            if ax.isVisible() and ax.labelText:  # a vertical title: its length against the axis's height
                assert ax.label.boundingRect().width() <= ax.boundingRect().height(), (ax.labelText, side)
    d.close()
    gc.collect()


def test_the_charts_follow_the_dark_theme(qtbot, tmp_path, monkeypatch, moe):
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
    w.open_dashboard()
    qtbot.waitUntil(lambda: w.dashboard.snapshot is not None, timeout=10_000)
    w.toggle_theme()
    d = w.dashboard
    assert d.colors == DARK and d.isVisible()
    assert d.speed_plot.backgroundBrush().color().name() == DARK["bg"]
    assert d.speed_plot.getAxis("bottom").textPen().color().name() == DARK["text"]
    assert d.snapshot is not None  # its figures kept
    d.close()
    w.close()
    gc.collect()


def test_threads_the_tuner_took_are_not_called_thermal_throttling(qtbot, worker, dash):
    from app import advice as A
    tuned = dataclasses.replace(dash.snapshot, threads=1, configured_threads=2, throttle_events=(
        ThrottleEvent(time.time() - 5, 2, 1, float("nan"), "decode 9.0 ms a token at 1 thread, 12.0 at 2: "
                                                           "other programs share the cores"),))
    assert not any("Thermal throttling" in line or "nan" in line for line in A.advice(tuned))
    dash.on_stats(tuned)
    dash.draw_now()
    assert "no thermal throttling · thread tuner: 1 change(s)" in dash.temp_text.text()
