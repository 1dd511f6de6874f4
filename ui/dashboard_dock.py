"""The performance dashboard's dock and the window's place: where the user left them is saved in the
settings and restored at the next start.

A part of MainWindow (mixed into it)."""
from __future__ import annotations

from PySide6.QtCore import QByteArray, Qt
from PySide6.QtWidgets import QDockWidget

from ui import theme


DOCK_W = 460  # the dashboard dock's width at first: one column of panels (dashboard.PANEL_W) and margins


class DashboardDock:
    """`dashboard` and `dashboard_dock`: None until the dashboard is first shown."""

    def _make_dashboard(self):
        from ui.dashboard import Dashboard
        return Dashboard(self.flow.worker, theme.palette(self.settings.theme), self.flow.model, self,
                         font_pt=self.settings.font_size)

    def open_dashboard(self, toggle: bool = False):
        """The performance dashboard, docked where the user last left it (right of the chat at first);
        Ctrl+Shift+P shows it, and hides it again when it is showing."""
        if self.dashboard_dock is None:
            self.dashboard = self._make_dashboard()
            dock = QDockWidget(self.tr("Performance"), self, objectName="dashboard_dock")
            dock.setAccessibleName(self.tr("Performance dashboard"))
            dock.setWidget(self.dashboard)
            dock.setAllowedAreas(Qt.AllDockWidgetAreas)
            self.dashboard_dock = dock
            if not self.restoreDockWidget(dock):
                # the first time: right of the chat, the window made wider where the screen has room
                self._widen(DOCK_W)
                self.addDockWidget(Qt.RightDockWidgetArea, dock)
                self.resizeDocks([dock], [DOCK_W], Qt.Horizontal)
        elif not self.dashboard_dock.isVisible() and self._side_docked():
            # shown again: a window made narrower since would squeeze it behind a scroll bar
            short = DOCK_W - (self.centralWidget().width() - self.centralWidget().minimumSizeHint().width())
            if short > 0:
                self._widen(short)
                self.resizeDocks([self.dashboard_dock], [DOCK_W], Qt.Horizontal)
        if toggle and self.dashboard_dock.isVisible():
            self.dashboard_dock.hide()
        else:
            self.dashboard_dock.show()
            self.dashboard_dock.raise_()
        return self.dashboard

    def _side_docked(self) -> bool:
        return not self.dashboard_dock.isFloating() and self.dockWidgetArea(self.dashboard_dock) in (
            Qt.LeftDockWidgetArea, Qt.RightDockWidgetArea)

    def _widen(self, by: int) -> None:
        """The window `by` pixels wider, or as much as the screen has room for."""
        room = self.screen().availableGeometry().width() - self.frameGeometry().width()
        self.resize(self.width() + max(0, min(room, by)), self.height())

    def _rebuild_dashboard(self) -> None:
        """The dashboard again in the new language, theme or text size; its history of figures is kept."""
        old, self.dashboard = self.dashboard, self._make_dashboard()
        self.dashboard.history, self.dashboard.snapshot = old.history, old.snapshot
        self.dashboard._reply_step = old._reply_step
        if old.snapshot is not None:
            self.dashboard.on_stats(old.snapshot)  # drawn at once, not blank until the next snapshot
        self.dashboard_dock.setWindowTitle(self.tr("Performance"))
        self.dashboard_dock.setAccessibleName(self.tr("Performance dashboard"))
        self.dashboard_dock.setWidget(self.dashboard)
        old.hide()
        old.deleteLater()

    def save_place(self) -> None:
        """The window's size and place and the dashboard dock's, into the settings file."""
        self.settings.window = {"geometry": bytes(self.saveGeometry().toBase64()).decode(),
                                "state": bytes(self.saveState().toBase64()).decode(),
                                "dashboard": "shown" if self.dashboard_dock is not None
                                and self.dashboard_dock.isVisible() else "hidden"}
        self.settings.save()

    def restore_place(self) -> None:
        w = self.settings.window
        if w.get("geometry"):
            self.restoreGeometry(QByteArray.fromBase64(w["geometry"].encode()))
        if w.get("state"):
            self.restoreState(QByteArray.fromBase64(w["state"].encode()))
        if w.get("dashboard") == "shown":
            self.open_dashboard()
