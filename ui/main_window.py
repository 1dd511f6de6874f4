"""The chat window: conversations on the left, the chat in the middle, figures in the status line."""
from __future__ import annotations

import itertools
import logging
import time
from pathlib import Path

import psutil
from PySide6.QtCore import QByteArray, QEvent, QSize, Qt, QTimer, Signal
from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import (QApplication, QComboBox, QDockWidget, QFileDialog, QHBoxLayout, QInputDialog, QLabel,
                               QLineEdit, QListView, QMainWindow, QMenu, QMessageBox, QPushButton, QSizePolicy,
                               QSplitter,
                               QVBoxLayout, QWidget)

from app import model_library
from app.paths import models_dir
from app.history import NEW_TITLE, History, chat_messages
from app.reasoning import joined, split
from app.settings import Settings
from app.worker import CONTEXT_POLICY, RESUME, TEMPLATE_VARS, prompt_progress
from ui import i18n
from ui import theme
from ui.chat_view import STREAM, ChatView, MessageInput
from ui.context_ui import AttachmentTray, ContextMeter, PolicyBox, marker_texts
from ui.model_flow import ModelFlow, show_error
from ui.models import ConversationListModel, shown_title
from ui.param_form import ConversationDialog, SettingsDialog

log = logging.getLogger("colibri.ui")

STATUS_MS = 500  # the status line is refreshed at this fixed rate, never per token
DRAFT_MS = 400  # the message being written is counted this long after the last keystroke
PARTIAL_S = 1.0  # a reply being written is saved to the history this often: a kill loses at most this
IMPORT = "__import__"
REMOTE = "remote: "  # ModelFlow.model while the chat goes to a remote endpoint: "remote: MODEL at URL"


class ElidedLabel(QLabel):
    """A one-line label that ends a text too long for it with an ellipsis."""

    def __init__(self, objectName: str):  # noqa: N803 - Qt's keyword
        super().__init__(objectName=objectName)
        self.full = ""
        self.setSizePolicy(QSizePolicy.Ignored, QSizePolicy.Preferred)  # a long title never squeezes the rest

    def set_full_text(self, text: str) -> None:
        self.full = text
        self._elide()

    def resizeEvent(self, e) -> None:  # noqa: N802 - Qt's name
        super().resizeEvent(e)
        self._elide()

    def _elide(self) -> None:
        self.setText(self.fontMetrics().elidedText(self.full, Qt.ElideRight, max(self.width(), 40)))
        self.setToolTip(self.full)


class MainWindow(QMainWindow):
    remote_requested = Signal(str, str, str)  # url, model, key: chat through that endpoint (the worker)

    def __init__(self, settings: Settings, history: History, translators: list | None = None):
        super().__init__()
        self.settings, self.history = settings, history
        self.translators = translators if translators is not None else []  # the installed ones (language switch)
        self.setWindowTitle("Colibri")
        self.setObjectName("main_window")
        self.resize(1100, 720)
        self.dashboard = None
        self.dashboard_dock: QDockWidget | None = None
        self.closed = False  # after closeEvent: the history is closed, nothing is drawn again
        self.conv_id: int | None = None
        self.request = 0  # id of the latest generation request
        self.gen_conv: int | None = None  # conversation a reply is being generated for
        self.editing: int | None = None  # id of the user message being edited (sending it starts a branch)
        self.regenerating: int | None = None  # the reply a new version is being written for
        self.continuing = None  # the reply being resumed by Continue (a Message), its text so far in `streams`
        self.gen_facts: dict = {}  # model and sampling of the reply being written
        self.gen_parent: int | None = None  # the message the reply being written answers
        self.partial_at = 0.0  # when the reply being written was last saved (History.save_partial)
        self.reasons = (False, False)  # the loaded model thinks; its template has a thinking switch
        self.last_step = None  # latest Step of the latest reply
        self.streams: dict[int, str] = {}  # conversation id -> the text so far of the reply it is being written
        self.prompt_read: float | None = None  # fraction of the prompt read, while the engine reports it
        self.context_counts: dict[int, int] = {}  # conversation id -> tokens it takes in the loaded model
        self.plans: dict = {}  # conversation id -> ContextPlan of its next prompt (its policy, the loaded model)
        self.draft_plan = None  # ContextPlan of the open chat with the message being written (and its files)
        self.slow_reason = ""  # why decode is slow now (other programs take the CPU), from the worker
        self.last_reply: dict = {}  # stats of the open chat's last reply (the status line when idle)
        self.snapshot = None  # latest StatsSnapshot
        self.busy = ""
        self.flow = ModelFlow(self, settings)
        self.server_url = ""  # the local server's address while it is on
        self.flow.worker.served.connect(self._served)
        self.flow.worker.remote_ready.connect(self._on_remote_ready)
        self.remote_requested.connect(self.flow.worker.connect_remote)  # queued: the worker's thread
        self._build()
        self._menus()
        self.flow.ready.connect(self._on_ready)
        self.flow.busy.connect(self._set_busy)
        self.flow.no_model.connect(self._on_no_model)
        w = self.flow.worker
        w.text.connect(self._on_text)
        w.finished.connect(self._on_finished)
        w.stats.connect(self._on_stats)
        w.counted.connect(self._on_counted)
        w.planned.connect(self._on_planned)
        w.slowed.connect(self._on_slowed)
        w.attachment_counted.connect(self.tray.set_tokens)
        w.reasoning.connect(self._on_reasoning)
        self.status_timer = QTimer(self, objectName="status_timer", interval=STATUS_MS)
        self.status_timer.timeout.connect(self._update_status)
        self.status_timer.start()
        self.apply_appearance()
        self.refresh_conversations()
        convs = self.model.items
        self.open_conversation(convs[0].id if convs else self._create_conversation().id)
        self._update_controls()
        self.restore_place()

    # --- layout ------------------------------------------------------------------------------
    def _build(self) -> None:
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
        sl = QVBoxLayout(side)
        sl.setContentsMargins(10, 10, 10, 10)
        sl.addWidget(self.new_button)
        sl.addWidget(self.search)
        sl.addWidget(self.list, 1)

        top = QWidget(objectName="topbar")
        self.title = ElidedLabel("title")
        self.model_picker = QComboBox(objectName="model_picker")
        self.model_picker.setMinimumWidth(240)
        self.model_picker.activated.connect(self._pick_model)
        self.thinking_button = QPushButton(objectName="thinking_switch", checkable=True)
        self.thinking_button.toggled.connect(self._set_thinking)
        self.thinking_button.hide()  # only for a model that thinks and whose template can switch it
        self.chat_settings_button = QPushButton(objectName="chat_settings")
        self.chat_settings_button.clicked.connect(self.edit_conversation_options)
        self.settings_button = settings_button = QPushButton(objectName="settings")
        settings_button.clicked.connect(self.open_settings)
        tl = QHBoxLayout(top)
        tl.setContentsMargins(14, 8, 14, 8)
        tl.addWidget(self.title, 1)
        tl.addWidget(self.model_picker)
        tl.addWidget(self.thinking_button)
        tl.addWidget(self.chat_settings_button)
        tl.addWidget(settings_button)

        self.view = ChatView(theme.palette(self.settings.theme), self.settings.font_size)
        self.view.edit_requested.connect(self.edit_message)
        self.view.regenerate_requested.connect(self.regenerate)
        self.view.continue_requested.connect(self.continue_reply)
        self.view.version_requested.connect(self.show_version)
        self.view.copy_requested.connect(lambda _: self.statusBar().showMessage(self.tr("Copied to the clipboard"), 2000))

        composer = QWidget(objectName="composer")
        self.input = MessageInput()
        self.input.setObjectName("input")
        self.input.submitted.connect(self.send)
        self.notice = QLabel(objectName="notice")
        self.notice.hide()
        self.send_button = QPushButton(objectName="primary")
        self.send_button.setMinimumWidth(84)
        self.send_button.clicked.connect(self._send_or_stop)
        self.attach_button = QPushButton(objectName="attach")
        self.attach_button.clicked.connect(self.attach_dialog)
        self.tray = AttachmentTray()
        self.tray.changed.connect(self._draft_changed)
        self.meter = ContextMeter()
        self.policy_box = PolicyBox()
        self.policy_box.policy_changed.connect(self.set_context_policy)
        self.policy_label = QLabel(objectName="policy_label")
        self.policy_label.setBuddy(self.policy_box)
        self.draft_timer = QTimer(self, objectName="draft_count_timer", singleShot=True, interval=DRAFT_MS)
        self.draft_timer.timeout.connect(self.count_draft)
        self.input.textChanged.connect(self._draft_changed)
        for target in (self.input, self.input.viewport()):  # files dropped on the message box are attached
            target.setAcceptDrops(True)
            target.installEventFilter(self)
        cl = QVBoxLayout(composer)
        cl.setContentsMargins(14, 8, 14, 10)
        cl.addWidget(self.notice)
        cl.addWidget(self.tray)
        row = QHBoxLayout()
        row.addWidget(self.attach_button, 0, Qt.AlignBottom)
        row.addWidget(self.input, 1)
        row.addWidget(self.send_button, 0, Qt.AlignBottom)
        cl.addLayout(row)
        under = QHBoxLayout()
        under.addWidget(self.policy_label)
        under.addWidget(self.policy_box)
        under.addStretch(1)
        under.addWidget(self.meter)
        cl.addLayout(under)

        center = QWidget()
        ml = QVBoxLayout(center)
        ml.setContentsMargins(0, 0, 0, 0)
        ml.setSpacing(0)
        ml.addWidget(top)
        ml.addWidget(self.view, 1)
        ml.addWidget(composer)
        split = QSplitter()
        split.addWidget(side)
        split.addWidget(center)
        split.setStretchFactor(1, 1)
        split.setSizes([250, 850])
        split.setHandleWidth(1)
        self.setCentralWidget(split)

        self.speed_label = QLabel(objectName="speed")
        self.context_label = QLabel(objectName="context")
        self.memory_label = QLabel(objectName="memory")
        self.server_label = QLabel(objectName="server")  # the local server's address while it is on
        self.server_label.setTextInteractionFlags(Qt.TextSelectableByMouse)
        self.server_label.hide()
        for lab in (self.server_label, self.speed_label, self.context_label, self.memory_label):
            self.statusBar().addPermanentWidget(lab)
        self.refresh_models()
        self._set_texts()
        self._accessibility()

    def _set_texts(self) -> None:
        """The texts of the controls, in the interface's language (again after a language switch)."""
        self.search.setPlaceholderText(self.tr("Search chats"))
        self.new_button.setText(self.tr("New chat"))
        self.chat_settings_button.setText(self.tr("Chat settings"))
        self._thinking_text()
        self.settings_button.setText(self.tr("Settings"))
        self.input.set_texts()
        self.attach_button.setText(self.tr("Attach…"))
        self.policy_label.setText(self.tr("When the context is full:"))
        self.policy_box.set_texts()

    def eventFilter(self, obj, e) -> bool:  # noqa: N802 - Qt's name
        """Files dragged onto the message box are attached (text dropped stays text)."""
        if obj in (self.input, self.input.viewport()) and e.type() in (QEvent.DragEnter, QEvent.DragMove,
                                                                       QEvent.Drop):
            urls = [u for u in e.mimeData().urls() if u.isLocalFile()] if e.mimeData().hasUrls() else []
            if urls:
                e.acceptProposedAction()
                if e.type() == QEvent.Drop:
                    for u in urls:
                        self.attach(u.toLocalFile())
                return True
        return super().eventFilter(obj, e)

    def changeEvent(self, e) -> None:  # noqa: N802 - Qt's name
        super().changeEvent(e)
        if e.type() == QEvent.LanguageChange and hasattr(self, "status_timer") and not self.closed:
            self.retranslate()

    def retranslate(self) -> None:
        """A new interface language, live: every text of the window is set again."""
        self._set_texts()
        self._accessibility()
        self.menuBar().clear()
        self._menus()
        self._update_controls()
        if self.snapshot is not None and self.flow.model is not None:
            self.view.empty_text = self.tr("{model} is ready. Type a message below.").format(model=self.snapshot.model)
        self.refresh_models()
        self.refresh_conversations()
        self.render_conversation()
        if self.editing is not None:
            self.notice.setText(self._editing_text())
        self._update_status()
        if self.dashboard is not None:
            self._rebuild_dashboard()

    def _accessibility(self) -> None:
        """Names and descriptions for screen readers, and the Tab order: sidebar, top bar, chat, composer."""
        for w, name, description in [
            (self.new_button, self.tr("New chat"), self.tr("Start a new conversation (Ctrl+N)")),
            (self.search, self.tr("Search chats"), self.tr("Show only the chats whose title or messages contain this text")),
            (self.list, self.tr("Conversations"), self.tr("Your chats, newest first; the context menu renames or deletes one")),
            (self.title, self.tr("Chat title"), ""),
            (self.model_picker, self.tr("Model"), self.tr("The model that writes the replies; the last entry imports one")),
            (self.chat_settings_button, self.tr("Chat settings"), self.tr("System prompt and sampling of this chat")),
            (self.thinking_button, self.tr("Thinking"), self.tr("Let the model think before it answers, in this "
                                                                "chat (its template's enable_thinking switch)")),
            (self.settings_button, self.tr("Settings"), self.tr("Engine and appearance settings (Ctrl+,)")),
            (self.view, self.tr("Conversation"), self.tr("The messages of this chat; links edit, regenerate, "
                                                         "continue, copy, browse versions and fold thinking")),
            (self.input, self.tr("Message"), self.tr("Enter sends, Shift+Enter adds a line, Esc stops a reply")),
            (self.speed_label, self.tr("Speed"), ""),
            (self.context_label, self.tr("Context used"), ""),
            (self.memory_label, self.tr("Memory used"), ""),
            (self.server_label, self.tr("Local server address"), ""),
            (self.attach_button, self.tr("Attach files"),
             self.tr("Attach text, Markdown, code or PDF files to the message; each shows the tokens it takes")),
            (self.meter, self.tr("Context meter"), ""),
            (self.tray, self.tr("Attached files"), ""),
        ]:
            w.setAccessibleName(name)
            if description:
                w.setAccessibleDescription(description)
                w.setToolTip(w.toolTip() or description)
        self.input.setTabChangesFocus(True)  # Tab leaves the box; Shift+Enter adds lines
        self.view.setTabChangesFocus(True)  # the links have shortcuts: Tab is not trapped in the chat
        chain = [self.new_button, self.search, self.list, self.model_picker, self.thinking_button,
                 self.chat_settings_button, self.settings_button, self.view, self.attach_button, self.input,
                 self.send_button, self.policy_box]
        for a, b in itertools.pairwise(chain):
            QWidget.setTabOrder(a, b)

    def _menus(self) -> None:
        def act(menu: QMenu, text: str, slot, shortcut: str | None = None) -> QAction:
            a = menu.addAction(text)
            a.triggered.connect(slot)
            if shortcut:
                a.setShortcut(QKeySequence(shortcut))
            return a
        f = self.menuBar().addMenu(self.tr("&File"))
        act(f, self.tr("&New chat"), self.new_conversation, "Ctrl+N")
        act(f, self.tr("Convert model…"), self.import_model, "Ctrl+O")
        f.addSeparator()
        act(f, self.tr("Export chat as &Markdown…"), lambda: self.export_dialog("md"))
        act(f, self.tr("Export chat as &JSON…"), lambda: self.export_dialog("json"))
        f.addSeparator()
        act(f, self.tr("&Quit"), self.close, "Ctrl+Q")
        c = self.menuBar().addMenu(self.tr("&Chat"))
        act(c, self.tr("&Send"), lambda: self.send(self.input.toPlainText()), "Ctrl+Return")
        act(c, self.tr("S&top"), self.stop, "Esc")
        act(c, self.tr("&Regenerate"), self.regenerate, "Ctrl+R")
        act(c, self.tr("C&ontinue the reply"), self.continue_reply, "Ctrl+Shift+R")
        act(c, self.tr("Older version of the reply"), lambda: self.show_version(None, -1), "Alt+Left")
        act(c, self.tr("Newer version of the reply"), lambda: self.show_version(None, 1), "Alt+Right")
        act(c, self.tr("&Edit last message"), lambda: self.edit_message(None), "Ctrl+E")
        act(c, self.tr("Re&name chat…"), lambda: self.rename_dialog(self.conv_id), "F2")
        act(c, self.tr("&Delete chat"), lambda: self.delete_conversation(self.conv_id, confirm=True))
        act(c, self.tr("Chat se&ttings…"), self.edit_conversation_options)
        act(c, self.tr("Go to the &message box"), self.input.setFocus, "Ctrl+L")
        v = self.menuBar().addMenu(self.tr("&View"))
        act(v, self.tr("Toggle &dark theme"), self.toggle_theme, "Ctrl+Shift+D")
        act(v, self.tr("Show or hide the last &thinking"), self._toggle_last_thinking, "Ctrl+Shift+T")
        act(v, self.tr("&Settings…"), self.open_settings, "Ctrl+,")
        dash = act(v, self.tr("Performance dashboard"), lambda: self.open_dashboard(toggle=True), "Ctrl+Shift+P")
        dash.setShortcutContext(Qt.ApplicationShortcut)  # also while the dashboard has the focus
        s = self.menuBar().addMenu(self.tr("Se&rver"))
        self.serve_action = act(s, self.tr("Serve on &localhost"), self.toggle_server)
        self.serve_action.setCheckable(True)
        self.serve_action.setChecked(bool(self.server_url))
        self.serve_action.setToolTip(self.tr("An OpenAI-compatible API at http://127.0.0.1:{port}/v1 for editors, "
                                             "agents and scripts").format(port=self.server_port()))
        self.remote_action = act(s, self.tr("Use a &remote endpoint…"), self.open_remote_dialog)
        s.setToolTipsVisible(True)

    def sizeHint(self) -> QSize:  # noqa: N802 - Qt's name
        return QSize(1100, 720)

    # --- conversations -----------------------------------------------------------------------
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

    def count_context(self) -> None:
        """Ask the worker how much of the context the open chat takes under its policy (answered by
        `_on_counted` and `_on_planned`)."""
        if self.flow.model is None or self.conv_id is None or self.conv_id == self.gen_conv:
            return
        conv = self.history.conversation(self.conv_id)
        self.flow.count_requested.emit(conv.id, chat_messages(conv, self.history.messages(conv.id)),
                                       self.history.context_policy(conv.id), "chat", self._template_vars(conv))

    def _on_slowed(self, why: str) -> None:
        """Defect 9: the worker saw decode fall while other programs took the CPU (and capped the
        threads), or saw it end ("")."""
        self.slow_reason = why
        if self.closed:
            return
        if why:
            self.statusBar().showMessage(self.tr("Slower than usual: {why}").format(why=why), 15000)
        self._update_status()

    # --- context policy and attachments (app/context_policy.py, app/attachments.py) ---------------
    def _markers(self, conv) -> dict[int, str]:
        """Where the open chat's next prompt leaves messages out: lines before the first message
        left out and before the first one read again (indices into its messages)."""
        plan = self.plans.get(conv.id)
        if plan is None or plan.marker_before is None:
            return {}
        offset = 1 if conv.system_prompt.strip() else 0  # chat_messages puts the system prompt first
        start, end = marker_texts(len(plan.dropped), plan.policy)
        return {plan.dropped[0] - offset: start, plan.marker_before - offset: end}

    def _on_planned(self, what: str, cid: int, plan) -> None:
        if self.closed:  # an answer that arrives after the window (and its history) closed
            return
        if what == "draft":
            if cid == self.conv_id:
                self.draft_plan = plan
                self._show_draft_warning()
                self._update_status()
            return
        old = self.plans.get(cid)
        self.plans[cid] = plan
        if cid == self.conv_id and (old is None or old.marker_before != plan.marker_before
                                    or old.dropped != plan.dropped) and self.gen_conv != cid:
            self.render_conversation()
        if cid == self.conv_id:
            self._update_status()

    def set_context_policy(self, policy: str) -> None:
        """The open chat's policy for a full context; the meter, marker and warning follow at once."""
        if self.conv_id is None:
            return
        self.history.set_context_policy(self.conv_id, policy)
        self.policy_box.set_policy(policy)
        self.count_context()
        self._draft_changed()

    def attach_dialog(self) -> None:
        from app.attachments import FILE_FILTER
        paths, _ = QFileDialog.getOpenFileNames(self, self.tr("Attach files"), str(Path.home()), FILE_FILTER)
        for path in paths:
            self.attach(path)

    def attach(self, path: str | Path) -> int | None:
        """Read a file into the message being written (its tokens are counted by the worker)."""
        from app.attachments import AttachmentError, read_attachment, with_attachments
        try:
            a = read_attachment(path)
        except AttachmentError as e:
            show_error(self, self.tr("Attaching a file"), str(e))
            return None
        key = self.tray.add(a)
        if self.flow.model is not None:
            self.flow.count_attachment_requested.emit(key, with_attachments("", [a]))
        return key

    def _draft_changed(self) -> None:
        self.draft_plan = None
        self.draft_timer.start()

    def count_draft(self) -> None:
        """Ask whether the open chat with the message being written still fits (the warning)."""
        text = self.input.toPlainText().strip()
        if self.flow.model is None or self.conv_id is None or not (text or self.tray.items):
            self.tray.set_warning("")
            return
        from app.attachments import with_attachments
        conv = self.history.conversation(self.conv_id)
        path = self.history.messages(conv.id)
        if self.editing is not None:  # the edited message replaces itself and what follows it (a branch)
            at = next((i for i, m in enumerate(path) if m.id == self.editing), len(path))
            path = path[:at]
        msgs = chat_messages(conv, path)
        msgs.append({"role": "user", "content": with_attachments(text, self.tray.records())})
        self.flow.count_requested.emit(conv.id, msgs, self.history.context_policy(conv.id), "draft",
                                       self._template_vars(conv))

    def _show_draft_warning(self) -> None:
        p = self.draft_plan
        if p is None:
            return
        if not p.fits and p.policy == "stop":
            self.tray.set_warning(self.tr("Will not fit: with this message the chat takes {used:,} of the model's "
                                          "{limit:,} tokens, and this chat stops at the limit. Start a new chat or "
                                          "choose another policy below.").format(used=p.tokens, limit=p.limit), "full")
        elif not p.fits:
            self.tray.set_warning(self.tr("Will not fit: this message and its attachments take {used:,} of the "
                                          "model's {limit:,} tokens even with every earlier message left out. Remove "
                                          "an attachment or shorten the message.").format(used=p.tokens,
                                                                                          limit=p.limit), "full")
        elif p.dropped:
            self.tray.set_warning(self.tr("Sending leaves {n} earlier messages out of the model's context to make "
                                          "room.").format(n=len(p.dropped)), "dropped")
        else:
            self.tray.set_warning("")

    def _on_counted(self, cid: int, tokens: int) -> None:
        if self.closed:  # a model that finished loading after the window (and its history) closed
            return
        self.context_counts[cid] = tokens
        if cid == self.conv_id:
            self._update_status()

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

    # --- chatting ----------------------------------------------------------------------------
    def send(self, text: str) -> None:
        if (not text.strip() and not self.tray.items) or self.busy or self.flow.model is None:
            return
        if self.draft_plan is not None and not self.draft_plan.fits:  # the warning already says why
            self.statusBar().showMessage(self.tray.warning.text(), 8000)
            return
        files = self.tray.records()
        text = text.strip() or ", ".join(a["name"] for a in files)
        parent = "leaf"
        if self.editing is not None:  # a new version of that message: a branch, the old one kept
            parent = self.history.message(self.editing).parent_id
            self.editing = None
            self.notice.hide()
        self.history.add_message(self.conv_id, "user", text.strip(), parent=parent, attachments=files or None)
        self.tray.clear()
        self.draft_timer.stop()
        self.draft_plan = None
        self.tray.set_warning("")
        if self.history.conversation(self.conv_id).title == NEW_TITLE:
            first = text.strip().splitlines()[0]
            self.history.rename(self.conv_id, first[:48] + ("…" if len(first) > 48 else ""))
        self.input.clear()
        self.refresh_conversations()
        self._generate()

    def _generate(self, resume=None) -> None:
        """Write a reply to the open chat's path; `resume`: the reply (a Message) to continue."""
        conv = self.history.conversation(self.conv_id)
        sampling = self.sampling_for(conv)
        path = self.history.messages(conv.id)
        self.gen_facts = {"model": Path(self.flow.model).name if self.flow.model else "", "sampling": sampling,
                          "thinking": self._thinking_on(conv)}
        options = dict(sampling)
        if self.gen_facts["thinking"] is not None:
            options[TEMPLATE_VARS] = self._template_vars(conv)
        self.request += 1
        self.gen_conv = conv.id
        self.last_step, self.prompt_read = None, None
        self.continuing = resume
        self.gen_parent = path[-1].id if resume is None and path else None
        self.partial_at = time.monotonic()
        self.streams[conv.id] = ""
        if resume is not None:
            path = path[:-1]
            self.streams[conv.id] = options[RESUME] = joined(resume.reasoning, resume.content,
                                                               resume.stats.get("thinking_open", False))
        self.render_conversation()
        self._set_busy("generating")
        options[CONTEXT_POLICY] = self.history.context_policy(conv.id)  # how the worker cuts a full chat
        self.flow.generate(self.request, chat_messages(conv, path), options)

    def _on_text(self, request: int, text: str, step) -> None:
        if request != self.request or self.gen_conv is None:
            return
        fraction = prompt_progress(step)
        if fraction is not None:
            self.prompt_read = fraction
            if self.gen_conv == self.conv_id:
                self.view.set_stream_note(self.tr("reading your message: {pct:.0%}").format(pct=fraction))
            return
        self.last_step, self.prompt_read = step, None
        self.context_counts[self.gen_conv] = step.context_used
        self.streams[self.gen_conv] = self.streams.get(self.gen_conv, "") + text
        before = self.continuing.stats.get("generated_tokens", 0) if self.continuing is not None else 0
        if self.gen_conv == self.conv_id:
            self.view.set_stream_tokens(before + step.generated_tokens)
            self.view.append(text)
        if time.monotonic() - self.partial_at >= PARTIAL_S:
            self._save_partial(step, before)

    def _save_partial(self, step, before: int) -> None:
        """The reply so far into the history (throttled by the caller): the app killed now loses at
        most the last PARTIAL_S of it, and the next start shows it as an interrupted reply."""
        self.partial_at = time.monotonic()
        reasoning, content, still = split(self.streams[self.gen_conv])
        stats = {"generated_tokens": before + step.generated_tokens, "prompt_tokens": step.prompt_tokens,
                 "decode_tok_s": step.decode_tok_s, "prefill_tok_s": step.prefill_tok_s, "ttft_s": step.ttft_s,
                 "thinking_open": still, "partial": True}
        try:
            self.history.save_partial(self.gen_conv, self.gen_parent, content, reasoning, stats, self.gen_facts,
                                      self.continuing.id if self.continuing is not None else None)
        except Exception as e:  # noqa: BLE001 - a full disk must not stop the reply; the final save says more
            log.warning("saving the reply so far: %s", e)

    def _on_finished(self, request: int, reply) -> None:
        if request != self.request or self.closed:  # closed mid-reply: the history is closed too
            return
        cid, self.gen_conv = self.gen_conv, None
        self.streams.pop(cid, None)
        resumed, self.continuing = self.continuing, None
        regenerating, self.regenerating = self.regenerating, None
        self.prompt_read = None
        if cid == self.conv_id:
            self.view.end_stream()
        s = reply.step
        if getattr(reply, "plan", None) is not None:
            self.plans[cid] = reply.plan  # the marker shows what this reply was written without
        if s is not None and (reply.text or s.generated_tokens):
            reasoning, content, still = split(joined(resumed.reasoning, resumed.content, resumed.stats.get(
                "thinking_open", False)) + reply.text if resumed is not None else reply.text)
            stats = {"generated_tokens": s.generated_tokens, "prompt_tokens": s.prompt_tokens,
                     "decode_tok_s": s.decode_tok_s, "prefill_tok_s": s.prefill_tok_s, "ttft_s": s.ttft_s,
                     "finish_reason": s.finish_reason, "thinking_tokens": reply.thinking_tokens,
                     "thinking_open": still}
            if resumed is not None:  # one reply, written in two goes: its counts add up
                stats["generated_tokens"] += resumed.stats.get("generated_tokens", 0)
                stats["thinking_tokens"] += resumed.stats.get("thinking_tokens", 0)
                self.history.update_message(resumed.id, content, reasoning, stats)
            else:
                self.history.add_message(cid, "assistant", content, stats, reasoning, self.gen_facts)
        else:
            self.history.drop_partial(cid)
            if regenerating is not None:  # nothing written: the reply it was to replace is shown again
                self.history.select(cid, regenerating, descend=False)
        if s is not None and s.finish_reason == "context":
            self.statusBar().showMessage(self.tr("The reply stopped because the context is full: start a new chat, or "
                                                 "raise the context length in Settings"), 10000)
        elif reply.dropped:
            self.statusBar().showMessage(self.tr("The context was full: {n} earlier messages were left out of "
                                                 "this reply").format(n=reply.dropped), 8000)
        self._set_busy("")
        if s is not None:
            self.context_counts[cid] = s.context_used
        self.render_conversation()
        self.refresh_conversations()
        self._update_status()

    def stop(self) -> None:
        if self.busy == "generating":
            self.flow.worker.request_stop()  # a threading.Event; the worker asks the engine to stop
        elif self.editing is not None:
            self.editing = None
            self.notice.hide()
            self.input.clear()
            self.tray.clear()

    def _send_or_stop(self) -> None:
        if self.busy == "generating":
            self.stop()
        else:
            self.send(self.input.toPlainText())

    def regenerate(self) -> None:
        """A new version of the last reply; the earlier ones stay, browsable as ‹ 1/2 ›."""
        if self.busy or self.flow.model is None:
            return
        msgs = self.history.messages(self.conv_id)
        if not msgs:
            return
        if msgs[-1].role == "assistant":
            self.regenerating = msgs[-1].id
            self.history.select(self.conv_id, msgs[-1].parent_id, descend=False)  # the new one is its sibling
        self._generate()

    def continue_reply(self) -> None:
        """Resume the last reply where the token limit (or Stop) cut it."""
        if self.busy or self.flow.model is None:
            return
        msgs = self.history.messages(self.conv_id)
        if msgs and msgs[-1].role == "assistant" and msgs[-1].stats.get("finish_reason") in (
                "length", "cancelled", "interrupted"):
            self._generate(resume=msgs[-1])

    def show_version(self, message_id: int | None, delta: int) -> None:
        """Another version of a message (None: the last reply), and the path below it."""
        if self.busy:
            return
        msgs = self.history.messages(self.conv_id)
        if message_id is None:
            message_id = next((m.id for m in reversed(msgs) if m.role == "assistant"), None)
        if message_id is None:
            return
        versions = self.history.versions(message_id)
        at = [m.id for m in versions].index(message_id) + delta
        if 0 <= at < len(versions):
            self.history.select(self.conv_id, versions[at].id)
            self.render_conversation()
            self.count_context()
            self._update_status()

    def edit_message(self, message_id: int | None) -> None:
        """Edit a user message (None: the last): sending it makes a new version, a branch of the chat."""
        if self.busy:
            return
        users = [m for m in self.history.messages(self.conv_id) if m.role == "user"]
        target = users[-1] if users and message_id is None else next((m for m in users if m.id == message_id), None)
        if target is None:
            return
        self.editing = target.id
        self.tray.clear()  # the message's own files come back with its text: the branch carries them
        from app.attachments import Attachment, with_attachments
        for a in target.attachments:
            key = self.tray.add(Attachment(a["name"], a["kind"], a["text"], a.get("tokens")))
            if self.flow.model is not None:
                self.flow.count_attachment_requested.emit(key, with_attachments("", [self.tray.items[key]]))
        self.input.setPlainText(target.content)
        self.input.setFocus()
        self.notice.setText(self._editing_text())
        self.notice.show()

    def _editing_text(self) -> str:
        return self.tr("Editing a message: Enter sends it as a new version (the earlier one stays, ‹ › browses "
                       "them) · Esc cancels")

    # --- thinking ------------------------------------------------------------------------------
    def _on_reasoning(self, path: str, reasons: bool, switchable: bool) -> None:
        if self.closed:  # a model that finished loading after the window (and its history) closed
            return
        self.reasons = (reasons, switchable)
        self._show_thinking_switch()

    def _template_vars(self, conv) -> dict:
        """What the chat template is told besides the messages (its thinking switch): the same for
        counting a chat as for writing its reply."""
        on = self._thinking_on(conv)
        return {} if on is None else {"enable_thinking": on}

    def _thinking_on(self, conv) -> bool | None:
        """The chat's thinking switch as the template gets it (on unless turned off, as the button
        shows), or None where the template has no switch."""
        if not self.reasons[1]:
            return None
        return conv.thinking is not False

    def _show_thinking_switch(self) -> None:
        if self.conv_id is None:
            return
        conv = self.history.conversation(self.conv_id)
        self.thinking_button.setVisible(self.reasons[1])
        self.thinking_button.blockSignals(True)
        self.thinking_button.setChecked(conv.thinking is not False)  # templates think unless told not to
        self.thinking_button.blockSignals(False)
        self._thinking_text()

    def _thinking_text(self) -> None:
        """The switch says its state in words: a checked button alone looks like any other."""
        self.thinking_button.setText(self.tr("Thinking: on") if self.thinking_button.isChecked()
                                     else self.tr("Thinking: off"))

    def _set_thinking(self, on: bool) -> None:
        self._thinking_text()
        if self.conv_id is not None:
            self.history.set_thinking(self.conv_id, on)
            self.count_context()  # the template's switch changes the prompt: counted again, with the draft
            self._draft_changed()

    def _toggle_last_thinking(self) -> None:
        if self.view.streaming is not None:
            self.view.toggle_thinking(STREAM)
            return
        last = next((m for m in reversed(self.view.messages) if m.reasoning), None)
        if last is not None:
            self.view.toggle_thinking(last.id)

    # --- models ------------------------------------------------------------------------------
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

    def _make_dashboard(self):
        from ui.dashboard import Dashboard
        return Dashboard(self.flow.worker, theme.palette(self.settings.theme), self.flow.model, self)

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
                room = self.screen().availableGeometry().width() - self.frameGeometry().width()
                self.resize(self.width() + max(0, min(room, 460)), self.height())
                self.addDockWidget(Qt.RightDockWidgetArea, dock)
                self.resizeDocks([dock], [460], Qt.Horizontal)
        if toggle and self.dashboard_dock.isVisible():
            self.dashboard_dock.hide()
        else:
            self.dashboard_dock.show()
            self.dashboard_dock.raise_()
        return self.dashboard

    def _rebuild_dashboard(self) -> None:
        """The dashboard again in the new language; its history of figures is kept."""
        old, self.dashboard = self.dashboard, self._make_dashboard()
        self.dashboard.history, self.dashboard.snapshot = old.history, old.snapshot
        self.dashboard_dock.setWindowTitle(self.tr("Performance"))
        self.dashboard_dock.setAccessibleName(self.tr("Performance dashboard"))
        self.dashboard_dock.setWidget(self.dashboard)
        old.hide()
        old.deleteLater()

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
        self.view.empty_text = self.tr("{model} is ready. Type a message below.").format(model=snapshot.model)
        self.render_conversation()
        self._update_controls()
        self.input.setFocus()

    def _on_no_model(self, reason: str) -> None:
        if self.flow.model is not None or self.closed:
            return
        self.view.empty_text = self.tr("No model is loaded. {reason} Pick or import one from the model list "
                                       "above.").format(reason=reason)
        self.refresh_models()
        self.render_conversation()

    def _on_stats(self, snapshot) -> None:
        self.snapshot = snapshot

    # --- settings and appearance ----------------------------------------------------------------
    def open_settings(self) -> None:
        model = self.flow.model

        def fit(values: dict) -> None:
            # free memory counts what Colibri holds now too: a reload gives the loaded model's memory back
            self.flow.fit_requested.emit(model, values, psutil.Process().memory_info().rss)
        d = SettingsDialog(self, self.settings, fit if model else None)
        self.flow.worker.fit_explained.connect(d.fit_label.setText)
        if d.exec():
            self.apply_settings(d.engine_form.values(), d.ui_form.values())
        d.deleteLater()  # and its connection to the worker with it: a dialog per opening piled up otherwise

    def apply_settings(self, engine: dict, ui: dict) -> None:
        """Save the new values; engine changes are applied to the running engine at once."""
        current = self.settings.engine_values()
        for name, value in engine.items():
            if value != current.get(name):
                self.settings.engine[name] = value
                self.flow.set_param_requested.emit(name, value)
        language = self.settings.language
        for name, value in ui.items():
            self.settings.set_ui(name, value)
        self.settings.save()
        self.apply_appearance()
        if self.settings.language != language:
            self.translators = i18n.switch(QApplication.instance(), self.translators, self.settings.language)
            self.retranslate()  # at once (the LanguageChange events come too; this one is not left to them)

    def toggle_theme(self) -> None:
        self.settings.set_ui("theme", "light" if self.settings.theme == "dark" else "dark")
        self.settings.save()
        self.apply_appearance()

    def apply_appearance(self) -> None:
        theme.apply(QApplication.instance(), self.settings.theme, self.settings.font_size)
        self.view.set_style(theme.palette(self.settings.theme), self.settings.font_size)
        f = self.input.font()
        f.setPointSize(self.settings.font_size)
        self.input.setFont(f)

    # --- export ------------------------------------------------------------------------------
    def export_conversation(self, cid: int, path: str | Path, fmt: str) -> None:
        text = self.history.export_markdown(cid) if fmt == "md" else self.history.export_json(cid)
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

    # --- state and status --------------------------------------------------------------------
    def _set_busy(self, what: str) -> None:
        self.busy = what
        self._update_controls()

    def _update_controls(self) -> None:
        generating = self.busy == "generating"
        self.send_button.setText(self.tr("Stop") if generating else self.tr("Send"))
        self.send_button.setAccessibleName(self.tr("Stop the reply") if generating else self.tr("Send the message"))
        self.send_button.setToolTip(self.tr("Stop writing the reply (Esc)") if generating
                                    else self.tr("Send the message (Enter or Ctrl+Return)"))
        self.send_button.setObjectName("danger" if generating else "primary")
        self.send_button.style().unpolish(self.send_button)
        self.send_button.style().polish(self.send_button)
        self.send_button.setEnabled(generating or (not self.busy and self.flow.model is not None))
        self.model_picker.setEnabled(not self.busy)

    def _update_status(self) -> None:
        """Speed of this chat's reply (live while it is written), its context use, the process memory.

        Nothing is made up: before a reply the speed says so, while the prompt is read its progress
        shows, and the context count is this chat's own (counted by the loaded model)."""
        s, snap = self.last_step, self.snapshot
        here = self.gen_conv is not None and self.gen_conv == self.conv_id
        if here and s is not None and (s.generated_tokens < 2 or not s.decode_tok_s):
            # one token gives no rate yet: the first token's time, not "0.0 tok/s"
            self.speed_label.setText(self.tr("first token {ttft:.2f} s · writing…").format(ttft=s.ttft_s))
        elif here and s is not None:
            self.speed_label.setText(self.tr("{rate:.1f} tok/s · first token {ttft:.2f} s")
                                     .format(rate=s.decode_tok_s, ttft=s.ttft_s))
        elif here:
            self.speed_label.setText(self.tr("reading your message: {pct:.0%}").format(pct=self.prompt_read)
                                     if self.prompt_read is not None else self.tr("reading your message…"))
        elif self.last_reply.get("generated_tokens"):
            r = self.last_reply
            self.speed_label.setText(self.tr("last reply {rate:.1f} tok/s · first token {ttft:.2f} s")
                                     .format(rate=r.get("decode_tok_s", 0.0), ttft=r.get("ttft_s", 0.0)))
        else:
            self.speed_label.setText(self.tr("no reply yet"))
        if self.slow_reason:
            self.speed_label.setText(self.speed_label.text() + " · " + self.tr("⚠ slowed by other programs"))
        self.speed_label.setToolTip(self.slow_reason)
        limit = (s.context_limit if here and s is not None else snap.context_limit) if snap is not None else None
        # one figure, shown twice: the meter beside the input and the status line say the same number
        # (the chat's next prompt; with the message being written once that is counted) and say which
        used = self.context_counts.get(self.conv_id)
        plan = self.plans.get(self.conv_id)
        draft = self.draft_plan if not here and (self.tray.items or self.input.toPlainText().strip()) else None
        if draft is not None:  # what sending the message being written would take
            used, dropped, fits = draft.tokens, len(draft.dropped), draft.fits
        else:
            dropped, fits = (len(plan.dropped), plan.fits) if plan is not None and not here else (0, True)
        self.meter.show_plan(used, limit, dropped, fits, with_draft=draft is not None)
        if limit is None:
            self.context_label.setText(self.tr("context —"))
        elif used is None:
            self.context_label.setText(self.tr("context … / {limit:,}").format(limit=limit))
        elif draft is not None:
            self.context_label.setText(self.tr("context with your message {used:,} / {limit:,}")
                                       .format(used=used, limit=limit))
        else:
            self.context_label.setText(self.tr("context {used:,} / {limit:,}").format(used=used, limit=limit))
        self.context_label.setToolTip(self.tr("Counted when the reply being written ends") if used is None and
                                      self.gen_conv is not None else self.meter.toolTip())
        self.memory_label.setText(self.tr("memory {mb:,.0f} MB").format(mb=psutil.Process().memory_info().rss / 2**20))

    # --- place ---------------------------------------------------------------------------------
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

    # --- local server ----------------------------------------------------------------------
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

    # --- remote endpoint -------------------------------------------------------------------
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

    def closeEvent(self, event) -> None:  # noqa: N802 - Qt's name
        try:
            self.save_place()
        except OSError as e:
            log.warning("the window's place was not saved: %s", e)
        self.closed = True
        self.status_timer.stop()
        self.flow.shutdown()
        self.history.close()
        super().closeEvent(event)
