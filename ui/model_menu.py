"""The model picker of the main window: the installed models (and the remote endpoint in use), loading
one, importing one with the conversion wizard, and what the chat shows once a model is ready or none is.

A part of MainWindow (mixed into it): loading is ModelFlow's (`flow.load`)."""
from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt

from app import model_library
from app.paths import models_dir

IMPORT = "__import__"
REMOTE = "remote: "  # ModelFlow.model while the chat goes to a remote endpoint: "remote: MODEL at URL"


class ModelMenu:
    """The picker lists paths; the last entry (IMPORT) opens the wizard."""

    def refresh_models(self) -> None:
        self.model_picker.blockSignals(True)
        self.model_picker.clear()
        paths = [str(p) for p in model_library.installed_models()]
        current = self.flow.model or self.flow.loading
        if current and current not in paths:
            paths.insert(0, current)
        for p in paths:
            self.model_picker.addItem(p[len(REMOTE):] if p.startswith(REMOTE) else Path(p).name, p)
        if not paths:
            self.model_picker.addItem(self.tr("No model"), None)
        self.model_picker.insertSeparator(self.model_picker.count())
        self.model_picker.addItem(self.tr("Import…"), IMPORT)
        index = self.model_picker.findData(current) if current else 0
        self.model_picker.setCurrentIndex(max(index, 0))
        self.model_picker.blockSignals(False)

    def _pick_model(self, index: int) -> None:
        data = self.model_picker.itemData(index)
        if data == IMPORT:
            self.refresh_models()
            self.import_model()
        elif data and data != self.flow.model and not self.busy:
            self.flow.load(data)
        else:
            self.refresh_models()

    def import_model(self, source: str | None = None):
        """The conversion wizard (its own thread: chatting goes on); "Open in chat" loads the result."""
        from ui.wizard import ConvertWizard
        wizard = ConvertWizard(self, models_dir(), source)
        wizard.setAttribute(Qt.WA_DeleteOnClose)
        wizard.open_requested.connect(self._open_converted)
        wizard.open()
        return wizard

    def _open_converted(self, path: str) -> None:
        self.refresh_models()
        if not self.busy and path != self.flow.model:
            self.flow.load(path)

    def _on_ready(self, snapshot) -> None:
        if self.closed:  # a model that finished loading after the window (and its history) closed
            return
        self.snapshot = snapshot
        self.last_step = None
        self.context_counts.clear()  # another model counts with its own tokenizer and template
        self.plans.clear()
        for key, a in self.tray.items.items():
            from app.attachments import with_attachments
            self.flow.count_attachment_requested.emit(key, with_attachments("", [a]))
        self.count_context()
        if self.dashboard is not None:
            self.dashboard.set_model_path(self.flow.model)
        self.refresh_models()
        self._show_ready_text()
        self.render_conversation()
        self._update_controls()
        self.input.setFocus()

    def _show_ready_text(self) -> None:
        self.view.empty_text = self.tr("{model} is ready. Type a message below.").format(model=self.snapshot.model)

    def _show_loading(self) -> None:
        """Until a model is ready the empty chat and the picker say what is being loaded."""
        if self.flow.model is not None or self.closed or self.busy not in ("loading", "converting"):
            return
        if self.busy == "converting":
            self.view.empty_text = self.tr("Converting the model into your data folder…")
        elif self.flow.loading:
            self.view.empty_text = self.tr("Loading {name}…").format(name=Path(self.flow.loading).name)
        else:
            self.view.empty_text = self.tr("Looking for your model…")
        self.refresh_models()
        self.render_conversation()

    def _on_no_model(self, reason: str) -> None:
        if self.flow.model is not None or self.closed:
            return
        self.view.empty_text = self.tr("No model is loaded. {reason} Pick or import one from the model list "
                                       "above.").format(reason=reason)
        self.refresh_models()
        self.render_conversation()

    def _on_stats(self, snapshot) -> None:
        self.snapshot = snapshot
