"""The performance dashboard: live figures of the engine, drawn from the worker's StatsSnapshots.

While it is shown the worker sends one snapshot per `STATS_MS`; each adds one point to every
series. The window only emits requests (`watch_requested`, `defrag_requested`) and reads plain
records: it never calls the engine. Figures an engine does not report read "not available" with
the reason, through app.advice's readers.
"""
from __future__ import annotations

import math
import time
from collections import deque

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QCoreApplication, Qt, QTimer, Signal
from PySide6.QtWidgets import (QAbstractItemView, QFrame, QGraphicsItem, QGridLayout, QGroupBox, QHBoxLayout, QHeaderView, QLabel,
                               QPushButton, QScrollArea, QStackedWidget, QTableWidget, QTableWidgetItem, QVBoxLayout,
                               QWidget)

from app import advice as A
from app.model_info import human_bytes
from app.worker import STATS_MS
from ui import pyside_refcount
from ui.boxes import fill
from ui.dashboard_text import (defrag_text, events_text, gpu_text, kernels_line, no_gpu, pct, prefetch_text, speed_line,
                               thermal, watts)
from ui.plot_range import fit_y, nice_ceil, no_focus
from ui.steady_label import SteadyLabel

WINDOW_S = 120  # seconds of history on every time plot
NAN = float("nan")
SERIES = ("prefill", "decode", "hit", "prefetch", "rss", "temp", "threads", "cpu_w", "gpu_w", "cpu_pct", "gpu_pct")
TIERS = ("small", "medium", "large")
PANEL_W = 400  # a column's width: the dock lays out as many columns as fit (one in a side dock)
_mb = human_bytes


def _tr(text: str) -> str:
    return QCoreApplication.translate("Dashboard", text)


class Dashboard(QWidget):
    """The dashboard's panels (docked by the main window) over the app's EngineWorker `worker`."""
    watch_requested = Signal(int)  # ms between snapshots; 0 = stop
    defrag_requested = Signal()

    def __init__(self, worker, colors: dict[str, str], model_path: str | None = None, parent: QWidget | None = None,
                 font_pt: int = 11):
        super().__init__(parent)
        pyside_refcount.install()
        self.setObjectName("dashboard")
        self.setWindowTitle(self.tr("Performance"))
        self.setAccessibleName(self.tr("Performance dashboard"))
        self.colors, self.font_pt = colors, font_pt
        self.model_path = model_path
        self.mounts = A.read_mounts()
        self.snapshot = None
        self.advice: list[str] = []
        self.history = {k: deque(maxlen=WINDOW_S * 1000 // STATS_MS + 1) for k in ("t", *SERIES)}
        self.worker = worker
        self._step, self._step_fresh, self._prefill_seen = None, False, None
        self._reply_step = None
        self._markers: list[pg.InfiniteLine] = []
        self._pending: list = []  # what is left to draw of the last snapshot, a panel per turn (on_stats)
        self._pending_timer = QTimer(self, singleShot=True, interval=0, objectName="dashboard_pending")
        self._pending_timer.timeout.connect(self._draw_next)
        pg.setConfigOptions(antialias=True)
        self._build()
        self.watch_requested.connect(worker.watch_stats)
        self.defrag_requested.connect(worker.defrag)
        worker.stats.connect(self.on_stats)
        worker.text.connect(self.on_step)
        worker.defragged.connect(self.on_defragged)
        worker.failed.connect(lambda what, _: what.startswith("Defrag") and self._defrag_done("Defrag failed."))

    # --- layout ------------------------------------------------------------------------------
    def _no_figures(self) -> None:
        self.header.setText(self.tr("Waiting for the engine's first figures (a reply being written sends them "
                                    "between its words)…") if self.model_path else self.tr("No model is loaded."))

    def _bare_plot(self, sides: tuple[str, ...]) -> pg.PlotWidget:
        """A still plot (no mouse, no buttons, no focus) with its axes in the theme's colours."""
        c = self.colors
        p = pg.PlotWidget(background=c["bg"])
        p.setMinimumHeight(self._chart_h())
        no_focus(p)
        p.setMouseEnabled(x=False, y=False)
        p.hideButtons()
        for side in sides:
            ax = p.getAxis(side)
            ax.enableAutoSIPrefix(False)  # "(x0.001)" beside a title read as noise
            ax.setPen(pg.mkPen(c["border"]))
            ax.setTextPen(pg.mkPen(c["text"]))
        return p

    def _plot(self, y_label: str, legend: bool = False, color: str | None = None) -> pg.PlotWidget:
        c = self.colors
        p = self._bare_plot(("left", "bottom", "right"))
        for side in ("left", "bottom", "right"):
            # an axis (and its grid) kept as a pixmap while its range and size stay: replaying its
            # ticks, labels and grid each time the curves move was most of a plot's paint
            p.getAxis(side).setCacheMode(QGraphicsItem.CacheMode.DeviceCoordinateCache)
        p.setLabel("left", y_label, **self._label_style(color))
        p.setLabel("bottom", _tr("seconds ago"), **self._label_style())
        p.setXRange(-WINDOW_S, 0, padding=0.01)
        p.showGrid(x=True, y=True, alpha=0.15)
        if legend:
            p.addLegend(offset=(6, 2), labelTextColor=c["text"], brush=pg.mkBrush(c["bg"] + "c0"),
                        labelTextSize="8pt", verSpacing=-6)
        return p

    def _label_style(self, color: str | None = None) -> dict:
        """Axis titles in the text colour (or `color`) at the UI's size: muted grey on a plot was near-invisible."""
        return {"color": color or self.colors["text"], "font-size": f"{max(9, self.font_pt - 1)}pt"}

    def _chart_h(self) -> int:
        """A chart's least height: its vertical axis titles whole at the UI's text size."""
        return 190 * max(11, self.font_pt) // 11  # (150 cut "decode tok/s (line)" at 11 pt)

    def _right_axis(self, plot: pg.PlotWidget, label: str, color: str | None = None) -> pg.ViewBox:
        """A second y axis on the right with its own view (its own scale), x linked to the plot."""
        view = pg.ViewBox()
        pi = plot.getPlotItem()
        pi.showAxis("right")
        pi.scene().addItem(view)
        pi.getAxis("right").linkToView(view)
        pi.getAxis("right").setLabel(label, **self._label_style(color))
        view.setXLink(pi)
        view.setMouseEnabled(x=False, y=False)
        pi.vb.sigResized.connect(lambda: view.setGeometry(pi.vb.sceneBoundingRect()))
        return view

    def _chart(self, plot: pg.PlotWidget) -> QStackedWidget:
        """The plot, or in its place a message saying why it has nothing to show."""
        stack = QStackedWidget()
        stack.addWidget(plot)
        msg = QLabel(alignment=Qt.AlignCenter, wordWrap=True)
        msg.setStyleSheet(f"color: {self.colors['muted']}; font-size: 12pt; padding: 12px;")
        stack.addWidget(msg)
        stack.setMinimumHeight(self._chart_h())
        return stack

    @staticmethod
    def _say(stack: QStackedWidget, message: str | None) -> None:
        if message:
            stack.widget(1).setText(message)
        stack.setCurrentIndex(1 if message else 0)

    def _curve(self, plot: pg.PlotWidget, color: str, name: str, width: float = 2, step: bool = False):
        kw = {"stepMode": "right"} if step else {}
        return plot.plot([], [], pen=pg.mkPen(color, width=width), name=name, connect="finite", **kw)

    def _panel(self, title: str, *widgets: QWidget) -> QGroupBox:
        box = QGroupBox(title)
        lay = QVBoxLayout(box)
        lay.setContentsMargins(8, 6, 8, 6)
        lay.setSpacing(4)
        for w in widgets:
            lay.addWidget(w, 1 if isinstance(w, (pg.PlotWidget, QTableWidget, QStackedWidget)) else 0)
            if isinstance(w, (pg.PlotWidget, QStackedWidget)):
                w.setAccessibleName(title)
        return box

    def _caption(self, name: str) -> QLabel:
        lab = SteadyLabel(name)
        lab.setTextInteractionFlags(Qt.TextSelectableByMouse)
        lab.setStyleSheet(f"color: {self.colors['muted']};")
        return lab

    def _build(self) -> None:
        c = self.colors
        blue, orange, green, red, purple = c["accent"], "#e8893a", "#3aa757", c["danger"], "#9b6bd6"
        self.header = SteadyLabel("dash_header")
        self._no_figures()
        self.header.setStyleSheet("font-weight: 600;")
        self.advice_label = QLabel(objectName="advice", wordWrap=True)
        self.advice_label.setTextFormat(Qt.RichText)

        # decode (tens of tok/s) on the left axis, prefill (thousands) on its own right axis, each
        # title in its curve's colour (no legend over the data)
        decode, prefill = _tr("decode tok/s (line)"), _tr("prefill tok/s (dots)")
        self.speed_plot = self._plot(decode, color=blue)
        self.decode_curve = self._curve(self.speed_plot, blue, "decode")
        # and a dot per snapshot: a short reply gives one figure, which a line alone never draws (the
        # plot was empty once the reply had ended)
        self.decode_dots = pg.PlotDataItem([], [], pen=None, symbol="o", symbolSize=5, symbolPen=None,
                                           symbolBrush=blue, name="decode")
        self.speed_plot.addItem(self.decode_dots)
        self.prefill_view = self._right_axis(self.speed_plot, prefill, color=orange)
        self.prefill_curve = pg.PlotDataItem([], [], pen=None, symbol="o", symbolSize=7, symbolPen=None,
                                             symbolBrush=orange, name="prefill, one dot per reply")
        self.prefill_view.addItem(self.prefill_curve)
        self.speed_chart = self._chart(self.speed_plot)
        self.speed_text = self._caption("speed_text")

        self.cache_plot = self._plot("%", legend=True)
        self.cache_plot.setYRange(0, 100, padding=0.05)
        self.cache_plot.addItem(pg.InfiniteLine(pos=100 * A.HIT_RATE_LOW, angle=0,
                                                pen=pg.mkPen(c["muted"], style=Qt.DashLine)))
        self.hit_curve = self._curve(self.cache_plot, blue, "hit rate")
        self.prefetch_curve = self._curve(self.cache_plot, green, "prefetch accuracy")
        self.cache_chart = self._chart(self.cache_plot)
        self.cache_text = self._caption("cache_text")

        self.heat_plot = self._bare_plot(("left", "bottom"))
        self.heat_plot.invertY(True)  # layer 0 on top, as in a table
        # titles after the pens: AxisItem.setPen recolours the title, which is how it became border-grey
        self.heat_plot.setLabel("bottom", "expert", **self._label_style())
        self.heat_plot.setLabel("left", "layer", **self._label_style())
        self.heat = pg.ImageItem(axisOrder="row-major")
        self.heat_plot.addItem(self.heat)
        cmap = pg.colormap.get("viridis")
        self.heat_bar = pg.ColorBarItem(values=(0, 1), colorMap=cmap, interactive=False, width=14,
                                        pen=pg.mkPen(c["border"]))  # (titled below, once, in the text colour)
        self.heat_bar.setImageItem(self.heat, insert_in=self.heat_plot.getPlotItem())
        self.heat_bar.getAxis("right").setTextPen(pg.mkPen(c["text"]))
        self.heat_bar.getAxis("right").setLabel("picks", **self._label_style())
        self.heat_text = self._caption("heat_text")
        self.heat_chart = self._chart(self.heat_plot)

        self.pool_table = QTableWidget(4, 4, objectName="pool_table")
        self.pool_table.setAccessibleName(self.tr("Memory pool"))
        self.pool_table.setHorizontalHeaderLabels([self.tr("used"), self.tr("free"), self.tr("blocks"),
                                                   self.tr("fragmented")])
        self.pool_table.setVerticalHeaderLabels([self.tr("small"), self.tr("medium"), self.tr("large"),
                                                 self.tr("all")])
        self.pool_table.setEditTriggers(QAbstractItemView.NoEditTriggers)
        self.pool_table.setSelectionMode(QAbstractItemView.NoSelection)
        self.pool_table.horizontalHeader().setSectionResizeMode(QHeaderView.Stretch)
        self.pool_table.horizontalHeader().setSectionResizeMode(3, QHeaderView.ResizeToContents)  # its long title whole
        self.pool_table.verticalHeader().setSectionResizeMode(QHeaderView.Stretch)
        for col, tip in enumerate([
                self.tr("Memory handed out to the engine's buffers"),
                self.tr("Memory the pool holds from the system but has not handed out"),
                self.tr("Live buffers"),
                self.tr("Share of the free memory that is scattered: small tier, free slots in slab pages that "
                        "still hold live buffers (they cannot go back to the system); medium tier, free memory "
                        "outside its largest free piece. Nothing is ever moved, so Defrag cannot lower it")]):
            self.pool_table.horizontalHeaderItem(col).setToolTip(tip)
        self.pool_text = self._caption("pool_text")
        self.defrag_button = QPushButton(self.tr("&Defrag"), objectName="defrag")
        self.defrag_button.setAccessibleName(self.tr("Defragment the memory pool"))
        self.defrag_button.setToolTip(self.tr("Free the expert cache's spare slots and give the pool's free pages "
                                              "back to the system (nothing is moved)"))
        self.defrag_button.setAccessibleDescription(self.defrag_button.toolTip())
        self.defrag_button.clicked.connect(self.request_defrag)
        self.defrag_text = self._caption("defrag_text")
        row = QWidget()
        fill(QHBoxLayout(row), self.defrag_button, (self.defrag_text, 1), margins=(0, 0, 0, 0))

        self.rss_plot = self._plot("MB")
        self.rss_curve = self._curve(self.rss_plot, purple, "RSS")
        self.rss_text = self._caption("rss_text")

        self.temp_plot = self._plot("°C", legend=True)
        self.temp_curve = self._curve(self.temp_plot, red, "CPU temperature")
        self.threads_view = self._right_axis(self.temp_plot, "threads")
        pi = self.temp_plot.getPlotItem()
        self.threads_curve = pg.PlotDataItem([], [], pen=pg.mkPen(blue, width=2, style=Qt.DashLine), name="threads",
                                             connect="finite")
        self.threads_view.addItem(self.threads_curve)
        pi.legend.addItem(self.threads_curve, "threads")
        self.temp_chart = self._chart(self.temp_plot)
        self.temp_text = self._caption("temp_text")

        self.power_plot = self._plot("W", legend=True)
        self.cpu_w_curve = self._curve(self.power_plot, orange, "CPU")
        self.gpu_w_curve = self._curve(self.power_plot, green, "GPU")
        self.power_chart = self._chart(self.power_plot)
        self.power_text = self._caption("power_text")

        self.load_plot = self._plot("% of all CPUs")
        self.load_plot.setYRange(0, 100, padding=0.05)
        self.load_curve = self._curve(self.load_plot, blue, "CPU load")
        self.load_chart = self._chart(self.load_plot)
        self.load_text = self._caption("load_text")

        self.gpu_plot = self._plot("% busy")
        self.gpu_plot.setYRange(0, 100, padding=0.05)
        self.gpu_curve = self._curve(self.gpu_plot, green, "GPU busy")
        self.gpu_chart = self._chart(self.gpu_plot)
        self.gpu_text = self._caption("gpu_text")

        self._curves = {"hit": self.hit_curve, "prefetch": self.prefetch_curve, "rss": self.rss_curve,
                        "cpu_pct": self.load_curve, "cpu_w": self.cpu_w_curve, "gpu_w": self.gpu_w_curve,
                        "gpu_pct": self.gpu_curve}
        self.grid = grid = QGridLayout()
        grid.setSpacing(8)
        self.panels = panels = [
            self._panel(self.tr("Speed"), self.speed_chart, self.speed_text),
            self._panel(self.tr("Expert cache: hit rate and prefetch accuracy"), self.cache_chart, self.cache_text),
            self._panel(self.tr("Expert activations (layer × expert)"), self.heat_chart, self.heat_text),
            self._panel(self.tr("Memory pool"), self.pool_table, self.pool_text, row),
            self._panel(self.tr("Memory (RSS)"), self.rss_plot, self.rss_text),
            self._panel(self.tr("CPU load"), self.load_chart, self.load_text),
            self._panel(self.tr("CPU temperature and threads"), self.temp_chart, self.temp_text),
            self._panel(self.tr("Power"), self.power_chart, self.power_text),
            self._panel(self.tr("GPU"), self.gpu_chart, self.gpu_text),
        ]
        for panel in panels:
            panel.setMinimumWidth(PANEL_W - 40)
        self.moe_panels = panels[1:3]  # expert cache and activations: shown once a snapshot has experts
        self._moe = False
        for panel in self.moe_panels:
            panel.setVisible(False)
        self.columns = 0
        self._lay_out(3)
        body = QWidget(objectName="dashboard_body")
        body.setLayout(grid)
        self.scroll = QScrollArea(widgetResizable=True, frameShape=QFrame.NoFrame, objectName="dashboard_scroll")
        self.scroll.setWidget(body)
        self.scroll.setAccessibleName(self.tr("Dashboard panels"))
        fill(QVBoxLayout(self), self.header, self.advice_label, (self.scroll, 1), margins=(12, 10, 12, 10))
        self._show_advice([])

    def _lay_out(self, columns: int, again: bool = False) -> None:
        """The shown panels in `columns` columns (as many as the dock's width holds; it scrolls down)."""
        if columns == self.columns and not again:
            return
        self.columns = columns
        for panel in self.panels:
            self.grid.removeWidget(panel)
        shown = [p for p in self.panels if self._moe or p not in self.moe_panels]
        for i, panel in enumerate(shown):
            self.grid.addWidget(panel, i // columns, i % columns)
        self.grid.activate()

    def _show_moe(self, moe: bool) -> None:
        """A dense model has no expert cache and no experts to pick: no panels for them (laid out
        first, then shown: a panel shown outside the grid was drawn over the first one)."""
        if moe != self._moe:
            self._moe = moe
            if not moe:
                for panel in self.moe_panels:
                    panel.setVisible(False)
            self._lay_out(self.columns, again=True)
            if moe:
                for panel in self.moe_panels:
                    panel.setVisible(True)

    def resizeEvent(self, e) -> None:  # noqa: N802 - Qt's name
        super().resizeEvent(e)
        self._lay_out(max(1, min(3, (self.width() - 24) // PANEL_W)))

    # --- watching ----------------------------------------------------------------------------
    def showEvent(self, e) -> None:  # noqa: N802 - Qt's name
        super().showEvent(e)
        self._want(STATS_MS)

    def hideEvent(self, e) -> None:  # noqa: N802 - Qt's name
        self._want(0)
        super().hideEvent(e)

    def _want(self, ms: int) -> None:
        """Snapshots every `ms`: by a queued request to the worker's timer and, for a dashboard opened
        mid-reply, directly (a plain attribute the reply loop reads)."""
        if hasattr(self.worker, "want_stats"):
            self.worker.want_stats(ms)
        self.watch_requested.emit(ms)

    def set_model_path(self, path: str | None) -> None:
        self.model_path = path
        for label in self.findChildren(SteadyLabel):
            label.forget_height()
        self.mounts = A.read_mounts()
        if self.snapshot is None:
            self._no_figures()

    def request_defrag(self) -> None:
        self.defrag_button.setEnabled(False)
        self.defrag_text.setText(self.tr("Defragmenting… (after the reply being written, if any)"))
        self.defrag_requested.emit()

    def _defrag_done(self, text: str) -> None:
        self.defrag_button.setEnabled(True)
        self.defrag_text.setText(text)

    # --- worker answers ----------------------------------------------------------------------
    def on_step(self, request: int, text: str, step) -> None:
        self._step, self._step_fresh = step, True
        if getattr(step, "kind", None) != "prompt":
            self._reply_step = step  # the last reply's own counts, for "last reply" once it has ended

    def on_defragged(self, r) -> None:
        self._defrag_done(defrag_text(r))

    def on_stats(self, snap) -> None:
        """One snapshot: a point on every series, then the panels redrawn, one per turn of the event loop."""
        self.snapshot = snap
        hw, ec, step = A.hardware(snap), snap.expert_cache, self._step if self._step_fresh else None
        self._step_fresh = False
        g = A.gpu(snap)
        new_reply = step is not None and (step.prompt_tokens, step.ttft_s) != self._prefill_seen \
            and step.prompt_tokens - step.cached_tokens >= 8  # fewer tokens time the overhead, not the speed
        if new_reply:
            self._prefill_seen = (step.prompt_tokens, step.ttft_s)
        point = {
            "t": time.time(),
            "prefill": step.prefill_tok_s if new_reply else NAN,
            "decode": step.decode_tok_s if step is not None and step.generated_tokens >= 4 else NAN,
            "hit": 100 * ec.hit_rate if ec.hits + ec.misses else NAN,
            "prefetch": NAN if ec.prefetch_accuracy is None else 100 * ec.prefetch_accuracy,
            "rss": snap.rss_bytes / 1e6,
            "temp": NAN if hw is None or hw.cpu_temp_c is None else hw.cpu_temp_c,
            "threads": A.effective_threads(snap),
            "cpu_w": NAN if hw is None or hw.cpu_power_w is None else hw.cpu_power_w,
            "gpu_w": NAN if g is None or g.power_w is None else g.power_w,
            "cpu_pct": NAN if hw is None else hw.cpu_percent,
            "gpu_pct": NAN if g is None or g.util_percent is None else g.util_percent,
        }
        for k, v in point.items():
            self.history[k].append(v)
        # drawn a panel per turn of the event loop, not all at once (the chat would stutter); the
        # steps draw the history as copied here, and a newer snapshot drops what is left of them
        h = {k: np.asarray(v, float) for k, v in self.history.items()}
        x = h["t"] - point["t"]
        self._pending = [
            lambda: self._show_advice(A.advice(snap, model_path=self.model_path, mounts=self.mounts)),
            lambda: self._draw_text(snap, step),  # first: it decides which charts show a message instead
            lambda: self._draw_speed(x, h, snap),
            lambda: self._draw_lines(self.cache_chart, self.cache_plot, x, h, ("hit", "prefetch"), fit=None),
            lambda: self._draw_heatmap(ec.activations, snap.num_experts),
            lambda: self._draw_pool(snap.mem_pool),
            lambda: self._draw_lines(None, self.rss_plot, x, h, ("rss",), fit=0.0),
            lambda: self._draw_lines(self.load_chart, self.load_plot, x, h, ("cpu_pct",), fit=None),
            lambda: self._draw_temp(x, h, point["t"], snap),
            lambda: self._draw_lines(self.power_chart, self.power_plot, x, h, ("cpu_w", "gpu_w"), fit=0.0),
            lambda: self._draw_lines(self.gpu_chart, self.gpu_plot, x, h, ("gpu_pct",), fit=None),
        ]
        self._draw_next()

    @property
    def drawing(self) -> bool:
        """Whether panels of the last snapshot are still to be drawn."""
        return bool(self._pending)

    def draw_now(self) -> None:
        """Draw what is left of the last snapshot at once (before a screenshot, or a test's checks)."""
        while self._pending:
            self._pending.pop(0)()

    def _draw_next(self) -> None:
        if self._pending:
            self._pending.pop(0)()
        if self._pending:
            self._pending_timer.start()

    # --- drawing -----------------------------------------------------------------------------
    def _show_advice(self, lines: list[str]) -> None:
        if lines == self.advice and self.advice_label.text():
            return  # the same advice: a style sheet set again re-polished and relaid the whole dashboard
        self.advice = lines
        c = self.colors
        if not lines:
            self.advice_label.setText(self.tr("No advice: nothing in these figures asks for a change."))
            self.advice_label.setStyleSheet(f"color: {c['muted']}; padding: 4px 2px;")
            return
        items = "".join(f"<li>{line}</li>" for line in lines)
        self.advice_label.setText(f"<b>{self.tr('Advice')}</b><ul style='margin: 2px 0 0 -20px;'>{items}</ul>")
        self.advice_label.setStyleSheet(f"background: {c['user']}; color: {c['text']}; border: 1px solid "
                                        f"{c['border']}; border-radius: 6px; padding: 6px 10px;")

    def _draw_speed(self, x: np.ndarray, h: dict[str, np.ndarray], snap) -> None:
        prefill = h["prefill"]
        dots = np.isfinite(prefill)  # a scatter of NaNs warns: only the replies' dots
        decode = h["decode"]
        seen = np.isfinite(decode)
        # replies written before the dashboard opened are not in its history: an empty plot with a
        # 0-1 axis said nothing of them (with no reply at all the caption says so)
        self._say(self.speed_chart, None if dots.any() or seen.any() or not snap.tokens_generated else
                  _tr("The last reply was written before the dashboard opened (its figures are below); "
                      "the next one is drawn here."))
        self.prefill_curve.setData(x[dots], prefill[dots])
        if dots.any():
            self.prefill_view.setYRange(0, nice_ceil(float(prefill[dots].max()) * 1.15), padding=0)
        self.decode_dots.setData(x[seen], decode[seen])
        self.decode_curve.setData(x, decode, connect="finite")
        fit_y(self.speed_plot, decode, 0.0)

    def _draw_lines(self, chart: QStackedWidget | None, plot: pg.PlotWidget, x: np.ndarray,
                    h: dict[str, np.ndarray], keys: tuple[str, ...], fit: float | None) -> None:
        """A chart of lines for `keys`, y fitted from `fit` up (None: fixed), unless it shows a message."""
        if chart is not None and chart.currentIndex() != 0:
            return
        for key in keys:
            self._curves[key].setData(x, h[key], connect="finite")
        if fit is not None:
            fit_y(plot, np.concatenate([h[k] for k in keys]), fit)

    def _draw_temp(self, x: np.ndarray, h: dict[str, np.ndarray], now: float, snap) -> None:
        if self.temp_chart.currentIndex() != 0:
            return
        # a span of at least 10 °C: a near-constant figure autoscaled to 1 °C drew a jagged line
        temp = h["temp"]
        self.temp_curve.setData(x, temp, connect="finite")
        fit_y(self.temp_plot, temp, None)
        threads = h["threads"]
        self.threads_curve.setData(x, threads, connect="finite")
        self.threads_view.setYRange(0, max(A.configured_threads(snap), int(np.nanmax(threads)) if len(threads) else 1) + 1)
        for m in self._markers:
            self.temp_plot.removeItem(m)
        self._markers = []
        for e in A.throttle_events(snap):
            if now - e.time <= WINDOW_S:  # heat in red, the thread tuner's changes in the muted colour
                color = self.colors["danger"] if thermal(e) else self.colors["muted"]
                m = pg.InfiniteLine(pos=e.time - now, angle=90, pen=pg.mkPen(color, width=1),
                                    label=f"{e.from_threads}→{e.to_threads}", labelOpts={"position": 0.9, "color": color})
                m.setToolTip(e.reason)
                self.temp_plot.addItem(m)
                self._markers.append(m)

    def _temp_axis(self, shown: bool) -> None:
        """No °C axis (nor its legend entry) without a temperature: only the threads are drawn then."""
        pi = self.temp_plot.getPlotItem()
        if pi.getAxis("left").isVisible() != shown:
            pi.showAxis("left", shown)
            pi.showGrid(y=shown, alpha=0.15)
            if shown:
                pi.legend.addItem(self.temp_curve, "CPU temperature")
            else:
                pi.legend.removeItem(self.temp_curve)

    def _draw_heatmap(self, activations, num_experts: int) -> None:
        a = np.asarray(activations, dtype=np.int64)
        if num_experts <= 1 or a.ndim != 2 or a.size == 0:
            self.heat.clear()
            self._say(self.heat_chart, _tr("A dense model: one MLP per layer, no experts to pick.\n"
                                           "Load a Mixture-of-Experts model to see which experts each layer uses."))
            self.heat_text.setText("")
            return
        self._say(self.heat_chart, None)
        top = max(1, int(a.max()))
        self.heat.setImage(a, levels=(0, top), autoLevels=False)
        self.heat.setRect(0, 0, a.shape[1], a.shape[0])
        self.heat_bar.setLevels((0, top))
        for axis, n in (("bottom", a.shape[1]), ("left", a.shape[0])):
            every = max(1, math.ceil(n / 16))
            self.heat_plot.getAxis(axis).setTicks([[(i + 0.5, str(i)) for i in range(0, n, every)]])
        self.heat_plot.setRange(xRange=(0, a.shape[1]), yRange=(0, a.shape[0]), padding=0)
        L, E = np.unravel_index(int(a.argmax()), a.shape)
        self.heat_text.setText(f"{int(a.sum()):,} picks so far · busiest: layer {L} expert {E} ({top:,} picks) · "
                               f"least used: {int(a.min()):,} picks")

    def _draw_pool(self, pool) -> None:
        tiers = [getattr(pool, t) for t in TIERS]
        total_used, total_free = sum(t.used for t in tiers), sum(t.free for t in tiers)
        rows = [(t.used, t.free, t.blocks, t.fragmentation) for t in tiers]
        rows.append((total_used, total_free, sum(t.blocks for t in tiers), pool.fragmentation))
        for r, (used, free, blocks, frag) in enumerate(rows):
            cells = [_mb(used), _mb(free), f"{blocks:,}", f"{frag:.0%}"]
            for col, text in enumerate(cells):
                item = QTableWidgetItem(text)
                item.setTextAlignment(Qt.AlignRight | Qt.AlignVCenter)
                self.pool_table.setItem(r, col, item)
        self.pool_text.setText(f"allocated {_mb(pool.allocated)} · peak {_mb(pool.peak)} · reserved from the "
                               f"system {_mb(pool.reserved)} · " + _tr(
                                   "fragmented: the share of free memory that is scattered (small: free slots in "
                                   "slab pages still in use, normal for slabs; medium: outside its largest free "
                                   "piece; nothing is moved, so Defrag cannot lower it)"))

    def _draw_text(self, snap, step) -> None:
        ec, hw, g = snap.expert_cache, A.hardware(snap), A.gpu(snap)
        experts = (f"{snap.num_layers} layers × {snap.num_experts} experts, top-{snap.top_k}"
                   if snap.num_experts > 1 else f"{snap.num_layers} layers, dense")
        name = snap.model if snap.model == snap.architecture else f"{snap.model} · {snap.architecture}"
        name = snap.remote.describe() if getattr(snap, "remote", None) is not None else name  # app/remote.py
        self.header.setText(f"{name} · {experts} · {human_bytes(snap.weights_bytes)} of "
                            f"weights · {A.effective_threads(snap)} thread{'s' if A.effective_threads(snap) != 1 else ''} · context {snap.context_used:,} / "
                            f"{snap.context_limit:,} ({snap.kv_cache_kind} KV cache, {_mb(snap.kv_cache_bytes)})")
        if step is None and not snap.tokens_generated:  # a fresh engine: no reply to report ("0 tok/s" misled)
            self.speed_text.setText(_tr("No reply yet: the speeds appear with the first one."))
        else:
            self.speed_text.setText(speed_line(snap, step, self._reply_step))
        self._show_moe(snap.num_experts > 1)
        self._draw_rest(snap, ec, hw, g)

    def _draw_rest(self, snap, ec, hw, g) -> None:
        self._say(self.cache_chart, _tr("A dense model has no experts to cache: all its weights stay in memory.")
                  if snap.num_experts <= 1 else None)  # (and its panels are hidden: no expert-cache figures)
        if snap.num_experts > 1:
            self.cache_text.setText(f"hit rate {pct(ec.hit_rate if ec.hits + ec.misses else None)} · prefetch "
                                    f"accuracy {prefetch_text(ec)} · served without waiting "
                                    f"{pct(ec.served_without_wait)} · {ec.resident} experts in memory "
                                    f"({_mb(ec.resident_bytes)}), {_mb(ec.bytes_loaded)} loaded · "
                                    f"{snap.expert_cache_plan}")
        self.rss_text.setText(f"RSS {_mb(snap.rss_bytes)} · weights {_mb(snap.weights_bytes)} · KV cache "
                              f"{_mb(snap.kv_cache_bytes)}" + kernels_line(snap))
        configured, effective = A.configured_threads(snap), A.effective_threads(snap)
        temp = f"{hw.cpu_temp_c:.0f} °C ({hw.cpu_temp_sensor})" if hw is not None and hw.cpu_temp_c is not None \
            else f"CPU temperature {A.missing(snap, 'cpu_temp')}"
        events = A.throttle_events(snap)
        self.temp_text.setText(f"{temp} · threads {effective} of {configured or effective} · {events_text(events)}")
        has_temp = any(not math.isnan(v) for v in self.history["temp"])
        self._temp_axis(has_temp)
        self._say(self.temp_chart, None if has_temp or events else
                  f"CPU temperature {A.missing(snap, 'cpu_temp')}.\nThreads: {effective} of {configured or effective}; "
                  f"the thermal governor needs a temperature to act.")
        jpt = A.joules_per_token(snap)
        parts = [watts("CPU", hw and hw.cpu_power_w, hw and hw.cpu_power_limit_w, A.missing(snap, "cpu_power")),
                 watts("GPU", g and g.power_w, g and g.power_limit_w, A.missing(snap, "gpu"))]
        has = lambda key: any(not math.isnan(v) for v in self.history[key])  # noqa: E731
        power = has("cpu_w") or has("gpu_w")
        self._say(self.power_chart, None if power else
                  f"No power readings.\nCPU: {A.missing(snap, 'cpu_power')}\nGPU: {A.missing(snap, 'gpu')}")
        if jpt is not None:
            parts.append(f"{jpt:.2f} J per token (last reply)")
        elif power or snap is None or getattr(snap, "energy", None) is None:
            parts.append(f"J per token {A.energy_missing(snap)}")
        else:
            parts.append("J per token: not available without an energy counter (RAPL or NVML)")
        self.power_text.setText(" · ".join(parts) if power else parts[-1])
        load = f"{hw.cpu_percent:.0f}% of all CPUs now" if hw is not None else f"CPU load {A.NO_HARDWARE}"
        self.load_text.setText(load)
        self._say(self.load_chart, None if has("cpu_pct") else f"CPU load {A.NO_HARDWARE}")
        self.gpu_text.setText(gpu_text(snap, hw, g))
        self._say(self.gpu_chart, None if g is not None else no_gpu(snap, hw))
