"""The Server menu of the main window: serving the loaded model on localhost (an OpenAI-compatible
API, its address in the status line) and chatting through a remote OpenAI-compatible endpoint.

A part of MainWindow (mixed into it): the worker starts the server and connects the endpoint."""
from __future__ import annotations

from PySide6.QtCore import Qt

from ui.model_flow import show_error
from ui.model_menu import REMOTE


class ServerMenu:
    """`server_url`: the local server's address while it is on."""

    def server_port(self) -> int:
        from app.settings import DEFAULT_SERVE_PORT
        return int(self.settings.ui.get("serve_port", DEFAULT_SERVE_PORT))

    def toggle_server(self, on: bool) -> None:
        self.flow.serve_requested.emit(bool(on), self.server_port())

    def _served(self, url: str, why: str) -> None:
        self.server_url = url
        if hasattr(self, "serve_action"):
            self.serve_action.setChecked(bool(url))
        self.server_label.setText(self.tr("serving at {url}").format(url=url) if url else "")
        self.server_label.setVisible(bool(url))
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
