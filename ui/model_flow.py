"""The engine link: the worker's thread, model loading and conversion with their dialogs.

Requests go to the worker as queued signals (`load_requested`, `generate_requested`, …); the
worker's answers come back as queued signals. The GUI thread never calls the engine.
"""
from __future__ import annotations

import logging
from pathlib import Path

from PySide6.QtCore import QCoreApplication, QObject, Qt, QThread, Signal
from PySide6.QtWidgets import QMessageBox, QProgressDialog, QWidget

from app import model_library
from app.settings import Settings
from app.worker import EngineWorker, FitReport
from engine import default_model

log = logging.getLogger("colibri.ui")


def _tr(text: str) -> str:
    return QCoreApplication.translate("ModelFlow", text)


# what failed, as the worker names it: fixed phrases, and phrases that end with a file or setting name
_WHAT = ("Generating a reply", "Defragmenting the memory pool", "Reading the engine's figures",
         "Converting the default model", "Exporting the chat")
_WHAT_OF = ("Loading", "Converting", "Setting", "Reading")


def translate_what(what: str) -> str:
    if what in _WHAT:
        return _tr(what)
    head, _, name = what.partition(" ")
    return _tr(head + " {name}").format(name=name) if head in _WHAT_OF and name else what


def show_error(parent: QWidget, title: str, text: str) -> QMessageBox:
    """A non-blocking error dialog with the engine's specific message (it names the file, tensor or key)."""
    title = translate_what(title)
    box = QMessageBox(QMessageBox.Critical, title, _tr("{what} failed.").format(what=title), QMessageBox.Ok, parent)
    box.setTextFormat(Qt.PlainText)  # an endpoint's or a file's words: never rich text, never a link
    box.setInformativeText(text)
    box.setAccessibleName(title)
    box.setAccessibleDescription(text)
    box.setAttribute(Qt.WA_DeleteOnClose)
    box.setObjectName("error_dialog")
    box.open()
    return box


class ModelFlow(QObject):
    pick_requested = Signal(list)
    load_requested = Signal(str, dict, bool)
    convert_requested = Signal(str)
    generate_requested = Signal(int, list, dict)
    count_requested = Signal(int, list, str, str, dict)  # conversation id, messages, policy, "chat"/"draft",
    # template variables (the thinking switch): answered by `planned`
    count_attachment_requested = Signal(int, str)  # key, the text as sent: `attachment_counted`
    fit_requested = Signal(str, dict, int)  # model folder, engine settings, extra free bytes: `fit_explained`
    set_param_requested = Signal(str, object)
    serve_requested = Signal(bool, int, str)  # on/off, port, API key ("": localhost only): the worker answers `served`
    close_requested = Signal()

    ready = Signal(object)  # StatsSnapshot: a model is loaded and warm
    busy = Signal(str)  # "" when idle, else what is happening ("loading", "converting")
    no_model = Signal(str)  # why there is no model (cancelled, failed)

    def __init__(self, window: QWidget, settings: Settings):
        super().__init__(window)
        self.window, self.settings = window, settings
        self.thread = QThread(objectName="engine_thread")
        self.worker = EngineWorker()
        self.worker.moveToThread(self.thread)
        w = self.worker
        for signal, slot in ((self.pick_requested, w.pick), (self.load_requested, w.load),
                             (self.convert_requested, w.convert), (self.generate_requested, w.generate),
                             (self.count_requested, w.count_context),
                             (self.count_attachment_requested, w.count_attachment),
                             (self.fit_requested, w.explain_fit), (self.set_param_requested, w.set_param),
                             (self.serve_requested, w.serve), (w.stage, self._stage), (w.progress, self._progress),
                             (w.converted, self.load), (w.loaded, self._loaded),
                             (w.model_defaults, self._model_defaults), (w.wont_fit, self._wont_fit),
                             (w.failed, self._failed), (w.cancelled, self._cancelled), (w.picked, self._picked)):
            signal.connect(slot)
        self.close_requested.connect(w.close, Qt.BlockingQueuedConnection)
        self.dialog: QProgressDialog | None = None
        self.loading: str | None = None  # the model folder being loaded
        self.model: str | None = None  # the model folder loaded
        self.model_defaults: dict = {}  # the loaded model's own sampling defaults (its generation config)
        self.thread.start()

    # --- requests ----------------------------------------------------------------------------
    def start(self, model_arg: str | None = None) -> None:
        """First run converts the default model; later runs load the last (or default) model."""
        if model_arg:
            p = Path(model_arg).expanduser()
            return self.import_source(str(p)) if p.is_file() else self.load(str(p))
        self._progress_dialog(self.tr("Loading"), self.tr("looking for your model"), cancel=False)
        self.busy.emit("loading")
        self.pick_requested.emit([c for c in (self.settings.model, str(model_library.default_model_dir())) if c])

    def _picked(self, path: str) -> None:
        """The worker's answer to start(): a valid model folder to load, or "" (convert the default)."""
        if path:
            return self.load(path)
        self._convert("", self.tr("Preparing {name}").format(name=default_model.NAME),
                      self.tr("Converting the default model into your data folder (first run only).")
                      + f"\n{default_model.NAME}: {default_model.NOTE}.")

    def load(self, path: str, force: bool = False) -> None:
        self.loading = path
        self._progress_dialog(self.tr("Loading {name}").format(name=Path(path).name), self.tr("checking memory"),
                              cancel=False)
        self.busy.emit("loading")
        self.load_requested.emit(path, self.settings.engine_values(), force)

    def import_source(self, source: str) -> None:
        self._convert(source, self.tr("Importing {name}").format(name=Path(source).name),
                      self.tr("Converting into your model library…"))

    def _convert(self, source: str, title: str, text: str) -> None:
        self._progress_dialog(title, text, cancel=True)
        self.busy.emit("converting")
        self.worker.arm()
        self.convert_requested.emit(source)

    def generate(self, request: int, messages: list, sampling: dict) -> None:
        self.worker.arm()
        self.generate_requested.emit(request, messages, sampling)

    def shutdown(self) -> None:
        self.worker.request_stop()
        self.worker.request_cancel()
        if self.thread.isRunning():
            self.close_requested.emit()  # blocks until the worker has closed its engine
            self.thread.quit()
            self.thread.wait()

    # --- dialogs -----------------------------------------------------------------------------
    def _progress_dialog(self, title: str, text: str, cancel: bool) -> None:
        self._close_dialog()
        d = QProgressDialog(text, self.tr("Cancel") if cancel else "", 0, 1000 if cancel else 0, self.window)
        d.setObjectName("progress_dialog")
        d.setWindowTitle(title)
        d.setAccessibleName(title)
        d.setWindowModality(Qt.WindowModal)
        d.setMinimumDuration(0)
        d.setMinimumWidth(440)
        d.setAutoClose(False)
        d.setAutoReset(False)
        if cancel:
            d.canceled.connect(lambda: self.worker.request_cancel())  # direct: the worker thread is busy
        else:
            d.setCancelButton(None)
        d.show()
        self.dialog = d

    def _close_dialog(self) -> None:
        if self.dialog is not None:
            self.dialog.close()
            self.dialog.deleteLater()
            self.dialog = None
            # the keyboard goes back to the chat window: without a window manager to hand it back, no
            # window was active after the dialog and every shortcut (Ctrl+Shift+P…) did nothing
            self.window.activateWindow()

    # --- worker answers ----------------------------------------------------------------------
    def _stage(self, text: str) -> None:
        if self.dialog is not None:
            self.dialog.setLabelText(f"{Path(self.loading or '').name}: {self.tr(text)}…")

    def _progress(self, fraction: float, tensor: str) -> None:
        if self.dialog is not None:
            self.dialog.setValue(int(fraction * 1000))
            self.dialog.setLabelText(self.tr("Converting {tensor}  ({fraction:.0%})").format(tensor=tensor,
                                                                                            fraction=fraction))

    def _model_defaults(self, path: str, values: dict) -> None:
        self.model_defaults = dict(values)

    def _loaded(self, snapshot) -> None:
        self._close_dialog()
        self.model = self.loading
        self.settings.model = self.loading
        self.settings.save()
        self.busy.emit("")
        self.ready.emit(snapshot)

    def _wont_fit(self, report: FitReport, path: str) -> None:
        self._close_dialog()
        self.busy.emit("")
        box = QMessageBox(QMessageBox.Warning, self.tr("Not enough memory"),
                          self.tr("{model} will not fit in memory.").format(model=report.model),
                          QMessageBox.Cancel, self.window)
        box.setObjectName("fit_dialog")
        box.setInformativeText(report.explain())
        anyway = box.addButton(self.tr("Load anyway"), QMessageBox.AcceptRole)
        box.setAttribute(Qt.WA_DeleteOnClose)
        box.finished.connect(lambda _: self._fit_answer(box.clickedButton() is anyway, path, report))
        box.open()

    def _fit_answer(self, load_anyway: bool, path: str, report: FitReport) -> None:
        if load_anyway:
            self.load(path, force=True)
        elif self.model is None:  # a model already loaded stays loaded
            self.no_model.emit(report.explain())

    def _failed(self, what: str, message: str) -> None:
        self._close_dialog()
        if what.startswith(("Loading", "Converting")):
            if what.startswith("Loading"):
                self.model = None  # the previous engine was closed before this one was opened
            self.busy.emit("")
            self.no_model.emit(message)
        show_error(self.window, what, message)

    def _cancelled(self, source: str) -> None:
        self._close_dialog()
        self.busy.emit("")
        self.no_model.emit(self.tr("The conversion was cancelled; nothing was written."))
