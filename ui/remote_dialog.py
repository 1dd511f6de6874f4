"""Server → Use a remote endpoint…: the address, API key and model of an OpenAI-compatible server
to chat through instead of a local model. The model list is fetched off the GUI thread; the key is
kept only in the system keyring (app.remote), never in a file.
"""
from __future__ import annotations

import itertools
import threading

from PySide6.QtCore import QObject, Qt, Signal
from PySide6.QtWidgets import (QComboBox, QDialog, QDialogButtonBox, QFormLayout, QHBoxLayout, QLabel,
                               QLineEdit, QPushButton, QVBoxLayout, QWidget)

from app import remote
from app.settings import Settings
from ui.boxes import fill

DEFAULT_URL = "http://127.0.0.1:8080/v1"  # llama-server's own default address


class _Answers(QObject):
    """Carries the background jobs' results to the GUI thread (queued signals), for every dialog."""
    models = Signal(int, str, list, str)  # dialog, url asked, model ids, error ("" when it worked)
    key = Signal(int, str, bool)  # dialog, url, whether the keyring holds a key for it


_answers: _Answers | None = None
_dialogs = itertools.count()


def _relay() -> _Answers:
    """The one relay, made on the GUI thread and kept for the application's life: a job holds no Qt
    object it could be the last owner of (a dialog dropped while its job ran was freed on the job's
    thread, a segfault)."""
    global _answers
    if _answers is None:
        _answers = _Answers()
    return _answers


class RemoteDialog(QDialog):
    """Emits `chosen(url, model, key)` on Connect; the caller hands it to the worker."""
    chosen = Signal(str, str, str)

    def __init__(self, settings: Settings, parent: QWidget | None = None):
        super().__init__(parent, objectName="remote_dialog")
        self.settings = settings
        self.setWindowTitle(self.tr("Remote endpoint"))
        self.setAccessibleName(self.tr("Remote endpoint"))
        self.url = QLineEdit(settings.remote.get("url", DEFAULT_URL), objectName="remote_url")
        self.url.setAccessibleName(self.tr("Endpoint address"))
        self.url.setPlaceholderText(DEFAULT_URL)
        self.key = QLineEdit(objectName="remote_key")
        self.key.setEchoMode(QLineEdit.Password)
        self.key.setAccessibleName(self.tr("API key"))
        self.key.setPlaceholderText(self.tr("none"))
        self.model = QComboBox(objectName="remote_model", editable=True)
        self.model.setAccessibleName(self.tr("Model"))
        if settings.remote.get("model"):
            self.model.addItem(settings.remote["model"])
        self.fetch_button = QPushButton(self.tr("Fetch models"), objectName="remote_fetch")
        self.fetch_button.clicked.connect(self.fetch)
        self.status = QLabel(objectName="remote_status", wordWrap=True)
        self.status.setTextFormat(Qt.PlainText)  # an endpoint's error text: never rich text, never a link
        self.status.setAccessibleName(self.tr("Connection status"))
        row = fill(QHBoxLayout(), (self.model, 1), self.fetch_button)
        form = QFormLayout()
        form.addRow(self.tr("Address"), self.url)
        form.addRow(self.tr("API key"), self.key)
        form.addRow(self.tr("Model"), row)
        self.buttons = QDialogButtonBox(QDialogButtonBox.Cancel)
        self.connect_button = self.buttons.addButton(self.tr("Connect"), QDialogButtonBox.AcceptRole)
        self.connect_button.setObjectName("remote_connect")
        self.buttons.accepted.connect(self.accept)
        self.buttons.rejected.connect(self.reject)
        intro = QLabel(self.tr("Chat through an OpenAI-compatible server: llama.cpp's llama-server, vLLM, "
                               "Ollama or another Colibri. The key is kept in the system keyring."), wordWrap=True)
        fill(QVBoxLayout(self), intro, form, self.status, self.buttons)
        self.setMinimumWidth(480)
        self._id = next(_dialogs)  # which dialog a job's answer is for
        _relay().models.connect(self._fetched)  # (disconnected when the dialog is deleted)
        _relay().key.connect(self._key_known)
        self._told = False  # the user was told the keyring cannot keep the key
        self._plain_ok = ""  # the address the user chose to send a key to over plain http anyway
        self._stored_for = ""  # the address the keyring holds a key for
        url, me, answers = self._url(), self._id, _relay()
        self._run(lambda: answers.key.emit(me, url, remote.stored_key(url) is not None))

    def _url(self) -> str:
        return self.url.text().strip() or DEFAULT_URL

    def _checked_url(self) -> str | None:
        """The address as the endpoint is asked at, or None with what is wrong in the status line."""
        try:
            return remote.normalize_url(self._url())
        except remote.RemoteError as e:
            self._say(str(e))
            return None

    def _say(self, text: str) -> None:
        """The status line, the dialog grown to show all of it (a long keyring error was clipped)."""
        self.status.setText(text)
        self.adjustSize()

    @staticmethod
    def _run(job) -> None:
        """Off the GUI thread. A job holds plain values taken before it starts and the relay, never the
        dialog or a widget (read off the GUI thread, or freed there as the job's last owner)."""
        threading.Thread(target=job, name="colibri-remote-dialog", daemon=True).start()

    def _key_known(self, dialog: int, url: str, known: bool) -> None:
        if dialog == self._id and known:
            self._stored_for = url
        if dialog == self._id and known and url == self._url() and not self.key.text():
            self.key.setPlaceholderText(self.tr("kept in the system keyring (type to replace)"))

    def _plain_http(self, url: str, key: str | None) -> str:
        """The warning to give before a key goes unencrypted to another machine, once per address."""
        if url == self._plain_ok or not (key or self._stored_for == self._url()) \
                or not remote.plain_http_to_another_machine(url):
            return ""
        self._plain_ok = url
        return self.tr("The API key would travel unencrypted (http://) to another machine, where anyone on the "
                       "network can read it; use https:// if the server offers it.")

    def fetch(self) -> None:
        """The endpoint's /v1/models into the model list, or the reason it cannot be read."""
        url = self._checked_url()
        if url is None:
            return
        key = self.key.text() or None
        if warning := self._plain_http(url, key):
            self._say(warning + " " + self.tr("Press Fetch again to send it anyway."))
            return
        self.fetch_button.setEnabled(False)
        self._say(self.tr("Asking {url} for its models…").format(url=url))
        me, answers = self._id, _relay()

        def job() -> None:
            try:
                ids, error = [m.id for m in remote.list_models(url, key)], ""
            except remote.RemoteError as e:
                ids, error = [], str(e)
            answers.models.emit(me, url, ids, error)
        self._run(job)

    def _fetched(self, dialog: int, url: str, ids: list, error: str) -> None:
        if dialog != self._id:
            return
        self.fetch_button.setEnabled(True)
        if error:
            self._say(error)
            return
        current = self.model.currentText()
        self.model.clear()
        self.model.addItems(ids)
        if current in ids:
            self.model.setCurrentText(current)
        self._say(self.tr("{url} serves {n} model(s)").format(url=url, n=len(ids)) if ids
                            else self.tr("{url} serves no model").format(url=url))

    def accept(self) -> None:
        """Keep the address and model in the settings and a typed key in the keyring, then connect."""
        url = self._checked_url()
        if url is None:
            return
        key, model = self.key.text(), self.model.currentText().strip()
        notes = []
        if key and not self._told:
            try:
                remote.store_key(url, key)
            except remote.RemoteError as e:  # no keyring: said here; Connect again uses it for this session
                notes.append(f"{e}.")
        if warning := self._plain_http(url, key):
            notes.append(warning)
        if notes:
            self._say(" ".join(notes) + " " + self.tr("Press Connect again to use it anyway."))
            self._told = True
            return
        self.settings.remote = {"url": url, "model": model}
        self.settings.save()
        self.chosen.emit(url, model, key)
        super().accept()
