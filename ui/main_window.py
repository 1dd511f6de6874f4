"""The chat window: conversations on the left, the chat in the middle, figures in the status line.

MainWindow builds the widgets and wires them; each idea is a part mixed into it, in its own module:
the conversation list, context counting, reply streaming, the thinking switch, the model picker, the
Server menu, the dashboard dock and the status line."""
from __future__ import annotations

import itertools
import logging

import psutil
from PySide6.QtCore import QEvent, QSize, Qt, QTimer, Signal
from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import (QApplication, QComboBox, QDockWidget, QHBoxLayout, QLabel, QMainWindow, QMenu,
                               QPushButton, QSplitter, QVBoxLayout, QWidget)

from app.history import History
from app.settings import Settings
from ui import i18n, theme
from ui.boxes import fill
from ui.chat_view import ChatView, MessageInput
from ui.context_counting import DRAFT_MS, ContextCounting
from ui.context_ui import AttachmentTray, ContextMeter, PolicyBox
from ui.conversation_list import ConversationList
from ui.dashboard_dock import DashboardDock
from ui.elided_label import ElidedLabel
from ui.model_flow import ModelFlow
from ui.model_menu import ModelMenu
from ui.param_form import SettingsDialog
from ui.reply_stream import ReplyStreaming
from ui.server_menu import ServerMenu
from ui.status_line import STATUS_MS, StatusLine
from ui.thinking_switch import ThinkingSwitch

log = logging.getLogger("colibri.ui")


class MainWindow(ConversationList, ContextCounting, ReplyStreaming, ThinkingSwitch, ModelMenu, ServerMenu,
                 DashboardDock, StatusLine, QMainWindow):
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
        w = self.flow.worker
        for signal, slot in ((self.flow.ready, self._on_ready), (self.flow.busy, self._set_busy),
                             (self.flow.no_model, self._on_no_model), (w.text, self._on_text),
                             (w.finished, self._on_finished), (w.stats, self._on_stats), (w.counted, self._on_counted),
                             (w.planned, self._on_planned), (w.slowed, self._on_slowed),
                             (w.attachment_counted, self.tray.set_tokens), (w.reasoning, self._on_reasoning)):
            signal.connect(slot)
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
        side = self._build_sidebar()

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
        fill(QHBoxLayout(top), (self.title, 1), self.model_picker, self.thinking_button, self.chat_settings_button,
             settings_button, margins=(14, 8, 14, 8))

        self.view = ChatView(theme.palette(self.settings.theme), self.settings.font_size)
        self.view.edit_requested.connect(self.edit_message)
        self.view.regenerate_requested.connect(lambda mid: self.regenerate(mid or None))
        self.view.delete_requested.connect(self.delete_message)
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
        row = fill(QHBoxLayout(), (self.attach_button, 0, Qt.AlignBottom), (self.input, 1),
                   (self.send_button, 0, Qt.AlignBottom))
        under = fill(QHBoxLayout(), self.policy_label, self.policy_box, 1, self.meter)
        fill(QVBoxLayout(composer), self.notice, self.tray, row, under, margins=(14, 8, 14, 10))

        center = QWidget()
        fill(QVBoxLayout(center), top, (self.view, 1), composer, margins=(0, 0, 0, 0)).setSpacing(0)
        split = QSplitter()
        split.addWidget(side)
        split.addWidget(center)
        split.setStretchFactor(1, 1)
        split.setSizes([250, 850])
        split.setHandleWidth(1)
        self.setCentralWidget(split)

        self._build_status_line()
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
            self._show_ready_text()
        else:
            self._show_loading()
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
        act(s, self.tr("Server &panel"), self.open_server_panel)
        self.remote_action = act(s, self.tr("Use a &remote endpoint…"), self.open_remote_dialog)
        s.setToolTipsVisible(True)

    def sizeHint(self) -> QSize:  # noqa: N802 - Qt's name
        return QSize(1100, 720)

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
        d = self.dashboard
        if d is not None and (d.colors, d.font_pt) != (theme.palette(self.settings.theme), self.settings.font_size):
            self._rebuild_dashboard()  # its charts in the new colours and text size

    # --- closing -----------------------------------------------------------------------------
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
