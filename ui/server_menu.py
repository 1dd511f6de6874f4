"""The Server menu of the main window: serving the loaded model on localhost (an OpenAI-compatible
API, its address in the status line) and chatting through a remote OpenAI-compatible endpoint.

A part of MainWindow (mixed into it): the worker starts the server and connects the endpoint."""
from __future__ import annotations

from PySide6.QtCore import Qt

from ui.model_flow import show_error
from ui.model_menu import REMOTE


class ServerMenu:
    """`server_url`: the local server's address while it is on; `server_panel` once opened."""
    server_panel = None
    serve_lan_key = ""  # the API key while the panel's "serve on the local network" is on

    def server_port(self) -> int:
        from app.settings import DEFAULT_SERVE_PORT
        return int(self.settings.ui.get("serve_port", DEFAULT_SERVE_PORT))

    def toggle_server(self, on: bool) -> None:
        self.flow.serve_requested.emit(bool(on), self.server_port(), self.serve_lan_key)

    def open_server_panel(self):
        """Server → Server panel: a dock beside the chat; its log fills while it exists."""
        from ui.server_panel import ServerPanel
        if self.server_panel is None:
            self.server_panel = ServerPanel(self.server_port(), bool(self.serve_lan_key), self)
            self.server_panel.switched.connect(self._panel_switched)
            self.flow.worker.request_logged.connect(self.server_panel.add_record, Qt.QueuedConnection)
            self.server_panel.set_address(self.server_url)
            self.addDockWidget(Qt.RightDockWidgetArea, self.server_panel)
        self.server_panel.show()
        self.server_panel.raise_()
        return self.server_panel

    def _panel_switched(self, on: bool, port: int, lan: bool) -> None:
        from app.serve_access import serve_key
        self.settings.ui["serve_port"] = port
        key, kept = serve_key() if lan else ("", False)
        self.serve_lan_key = key
        self.server_panel.set_key(key, kept)
        self.toggle_server(on)

    def _served(self, url: str, why: str) -> None:
        self.server_url = url
        if hasattr(self, "serve_action"):
            self.serve_action.setChecked(bool(url))
        self.server_label.setText(self.tr("serving at {url}").format(url=url) if url else "")
        self.server_label.setVisible(bool(url))
        if self.server_panel is not None:
            self.server_panel.set_address(url)
        if why:
            show_error(self, self.tr("Serve on localhost"), why)

    def open_remote_dialog(self):
        """Server → Use a remote endpoint…: Connect hands address, model and key to the worker."""
        from ui.remote_dialog import RemoteDialog
        dialog = RemoteDialog(self.settings, self)
        dialog.setAttribute(Qt.WA_DeleteOnClose)
        dialog.chosen.connect(self.remote_requested)
        dialog.open()
        return dialog

    def _on_remote_ready(self, snapshot) -> None:
        r = snapshot.remote
        self.flow.model, self.flow.loading = f"{REMOTE}{r.model} at {r.url}", None
        self._on_ready(snapshot)
