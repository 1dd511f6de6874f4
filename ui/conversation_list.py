"""The conversation list of the main window: the sidebar (new chat, search, the chats), opening,
creating, renaming, deleting and exporting a chat, and its own options (system prompt, sampling).

A part of MainWindow (mixed into it): it uses the window's history, settings, flow and chat view."""
from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFileDialog, QInputDialog, QListView, QLineEdit, QMenu, QMessageBox, QPushButton, \
    QVBoxLayout, QWidget

from app import export
from ui.boxes import fill
from ui.model_flow import show_error
from ui.models import ConversationListModel, shown_title
from ui.param_form import ConversationDialog


class ConversationList:
    """The chats: `conv_id` is the open one; `model` lists what the search shows."""

    def _build_sidebar(self) -> QWidget:
        """New chat, the search and the list of chats."""
        side = QWidget(objectName="sidebar")
        self.search = QLineEdit(clearButtonEnabled=True, objectName="search")
        self.search.textChanged.connect(lambda _: self.refresh_conversations())
        self.new_button = QPushButton(objectName="new_chat")
        self.new_button.clicked.connect(self.new_conversation)
        self.model = ConversationListModel()
        self.list = QListView(objectName="conversations")
        self.list.setModel(self.model)
        self.list.setContextMenuPolicy(Qt.CustomContextMenu)
        self.list.customContextMenuRequested.connect(self._conversation_menu)
        self.list.selectionModel().currentChanged.connect(
            lambda cur, _: cur.isValid() and self.open_conversation(cur.data(ConversationListModel.IdRole)))
        self.list.setHorizontalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
        self.list.setTextElideMode(Qt.ElideRight)
        side.setMinimumWidth(220)
        fill(QVBoxLayout(side), self.new_button, self.search, (self.list, 1), margins=(10, 10, 10, 10))
        return side

    def refresh_conversations(self) -> None:
        self.model.set_items(self.history.conversations(self.search.text().strip()))
        row = self.model.row_of(self.conv_id) if self.conv_id is not None else -1
        if row >= 0:
            self.list.selectionModel().blockSignals(True)
            self.list.setCurrentIndex(self.model.index(row))
            self.list.selectionModel().blockSignals(False)

    def open_conversation(self, cid: int) -> None:
        if cid == self.conv_id:
            return
        self.conv_id, self.editing = cid, None
        self.notice.hide()
        self.policy_box.set_policy(self.history.context_policy(cid))
        self._draft_changed()  # a message being written is counted again against this chat
        self._show_thinking_switch()
        self.refresh_conversations()
        self.render_conversation()
        self.count_context()
        self._update_status()

    def render_conversation(self) -> None:
        conv = self.history.conversation(self.conv_id)
        self.title.set_full_text(shown_title(conv.title))
        messages = self.history.messages(self.conv_id)
        if self.continuing is not None and self.gen_conv == self.conv_id and messages \
                and messages[-1].id == self.continuing.id:
            messages = messages[:-1]  # the reply being continued is the streaming one
        self.last_reply = next((m.stats for m in reversed(messages) if m.role == "assistant"), {})
        self.view.markers = self._markers(conv)
        self.view.set_messages(messages, self.streams.get(self.conv_id))
        self._show_elsewhere()

    def _show_elsewhere(self) -> None:
        """While a reply is written in another chat, the notice says where (Stop stops that one)."""
        if self.editing is not None:
            return
        if self.gen_conv is not None and self.gen_conv != self.conv_id:
            title = shown_title(self.history.conversation(self.gen_conv).title)
            self.notice.setText(self.tr("A reply is being written in “{title}”; Stop (Esc) ends it.")
                                .format(title=title))
            self.notice.show()
        else:
            self.notice.hide()

    def _create_conversation(self):
        """A new chat starts from the default preset: its system prompt and the sampling it sets."""
        preset = self.settings.preset()
        return self.history.create(system_prompt=preset["system_prompt"],
                                   sampling=self.settings.sampling | preset["sampling"])

    def sampling_for(self, conv) -> dict:
        """The table's defaults, under the model's own (its generation config), under the app's and the
        chat's values: what a reply of this chat is generated with."""
        return self.settings.sampling_values() | self.flow.model_defaults | self.settings.sampling | conv.sampling

    def new_conversation(self) -> None:
        conv = self._create_conversation()
        self.search.clear()
        self.open_conversation(conv.id)
        self.input.setFocus()

    def rename_conversation(self, cid: int, title: str) -> None:
        self.history.rename(cid, title)
        self.refresh_conversations()
        if cid == self.conv_id:
            self.title.set_full_text(shown_title(self.history.conversation(cid).title))

    def rename_dialog(self, cid: int | None) -> None:
        if cid is None:
            return
        title, ok = QInputDialog.getText(self, self.tr("Rename chat"), self.tr("Title:"),
                                         text=self.history.conversation(cid).title)
        if ok:
            self.rename_conversation(cid, title)

    def delete_conversation(self, cid: int | None, confirm: bool = False) -> None:
        if cid is None or cid == self.gen_conv:
            return
        title = self.history.conversation(cid).title
        if confirm and QMessageBox.question(self, self.tr("Delete chat"),
                                            self.tr("Delete “{title}” and all its messages?").format(title=title)) \
                != QMessageBox.Yes:
            return
        self.history.delete(cid)
        if cid == self.conv_id:
            self.conv_id = None
            rest = self.history.conversations()
            self.open_conversation(rest[0].id if rest else self._create_conversation().id)
        self.refresh_conversations()

    def _conversation_menu(self, pos) -> None:
        index = self.list.indexAt(pos)
        if not index.isValid():
            return
        cid = index.data(ConversationListModel.IdRole)
        menu = QMenu(self)
        menu.addAction(self.tr("Rename…"), lambda: self.rename_dialog(cid))
        menu.addAction(self.tr("Delete"), lambda: self.delete_conversation(cid, confirm=True))
        menu.exec(self.list.viewport().mapToGlobal(pos))

    def edit_conversation_options(self) -> None:
        conv = self.history.conversation(self.conv_id)
        d = ConversationDialog(self, conv.system_prompt, self.sampling_for(conv), self.settings,
                               self.settings.sampling_values() | self.flow.model_defaults, self.flow.model_defaults)
        if d.exec():
            self.history.set_options(conv.id, d.system.toPlainText().strip(), d.form.values())
        if d.presets_changed:
            self.settings.save()

    def export_conversation(self, cid: int, path: str | Path, fmt: str) -> None:
        text = export.to_markdown(self.history, cid) if fmt == "md" else export.to_json(self.history, cid)
        Path(path).write_text(text, encoding="utf-8")

    def export_dialog(self, fmt: str) -> None:
        conv = self.history.conversation(self.conv_id)
        name = "".join(ch if ch.isalnum() or ch in " -_" else "_" for ch in conv.title).strip() or "chat"
        path, _ = QFileDialog.getSaveFileName(self, self.tr("Export chat"), str(Path.home() / f"{name}.{fmt}"),
                                              "Markdown (*.md)" if fmt == "md" else "JSON (*.json)")
        if path:
            try:
                self.export_conversation(conv.id, path, fmt)
                self.statusBar().showMessage(self.tr("Exported to {path}").format(path=path), 4000)
            except OSError as e:
                show_error(self, "Exporting the chat", f"{path}: {e.strerror or e}")
