"""The conversation view (Markdown in a QTextBrowser) and the message input box.

Streaming is rate-limited: text is appended to a buffer and the view is re-rendered by the named
timer `stream_render_timer`, never once per token.
"""
from __future__ import annotations

import html

from PySide6.QtCore import QCoreApplication, QTimer, QUrl, Signal
from PySide6.QtGui import QDesktopServices, QGuiApplication, QKeyEvent, Qt
from PySide6.QtWidgets import QPlainTextEdit, QTextBrowser

from app.history import Message
from ui.markdown import MarkdownRenderer

RENDER_MS = 50  # re-render a streaming reply at most 20 times a second


def _tr(text: str) -> str:
    return QCoreApplication.translate("ChatView", text)


def stats_line(stats: dict) -> str:
    if not stats.get("generated_tokens"):
        return ""
    parts = [_tr("{n} tokens").format(n=stats["generated_tokens"]),
             _tr("{rate:.1f} tok/s").format(rate=stats.get("decode_tok_s", 0)),
             _tr("first token {ttft:.2f} s").format(ttft=stats.get("ttft_s", 0))]
    if stats.get("finish_reason") == "cancelled":
        parts.append(_tr("stopped"))
    elif stats.get("finish_reason") == "length":
        parts.append(_tr("hit the token limit"))
    return " · ".join(parts)


class ChatView(QTextBrowser):
    copy_requested = Signal(str)  # text put on the clipboard
    edit_requested = Signal(int)  # message id
    regenerate_requested = Signal()

    def __init__(self, colors: dict[str, str], font_pt: int):
        super().__init__()
        self.setOpenLinks(False)
        self.setObjectName("chat")
        self.setAccessibleName(self.tr("Conversation"))
        self.anchorClicked.connect(self._anchor)
        self.colors, self.font_pt = colors, font_pt
        self.messages: list[Message] = []
        self.streaming: str | None = None  # the reply being written, or None
        self.empty_text = ""
        self._codes: list[str] = []
        self.render_timer = QTimer(self, objectName="stream_render_timer", singleShot=True, interval=RENDER_MS)
        self.render_timer.timeout.connect(self.render)

    def set_style(self, colors: dict[str, str], font_pt: int) -> None:
        self.colors, self.font_pt = colors, font_pt
        self.render()

    def set_messages(self, messages: list[Message], streaming: str | None = None) -> None:
        self.messages, self.streaming = list(messages), streaming
        self.render()

    def begin_stream(self) -> None:
        self.streaming = ""
        self.render()

    def append(self, text: str) -> None:
        self.streaming = (self.streaming or "") + text
        if not self.render_timer.isActive():
            self.render_timer.start()

    def end_stream(self) -> None:
        self.streaming = None
        self.render_timer.stop()

    # --- rendering ---------------------------------------------------------------------------
    def _block(self, who: str, body: str, bg: str, footer: str = "") -> str:
        c = self.colors
        foot = f'<p style="color: {c["muted"]}; margin-top: 6px">{footer}</p>' if footer else ""
        return (f'<table width="100%" cellspacing="0" cellpadding="12" bgcolor="{bg}" style="margin-bottom: 10px">'
                f'<tr><td><p style="font-weight: bold; color: {c["muted"]}; margin-bottom: 4px">{who}</p>'
                f'{body}{foot}</td></tr></table>')

    def _link(self, href: str, label: str) -> str:
        return f'<a href="{href}" style="color: {self.colors["link"]}; text-decoration: none">{label}</a>'

    def html(self) -> str:
        c = self.colors
        md = MarkdownRenderer(c)
        parts = [f'<body style="font-size: {self.font_pt}pt; color: {c["text"]}">']
        last_user = max((i for i, m in enumerate(self.messages) if m.role == "user"), default=-1)
        last = len(self.messages) - 1
        for i, m in enumerate(self.messages):
            if m.role == "user":
                body = "<p>" + html.escape(m.content).replace("\n", "<br>") + "</p>"
                foot = self._link(f"edit:{m.id}", self.tr("Edit and resend")) \
                    if i == last_user and self.streaming is None else ""
                parts.append(self._block(self.tr("You"), body, c["user"], foot))
            else:
                foot = stats_line(m.stats)
                if i == last and self.streaming is None:
                    links = (f'{self._link("regenerate:", self.tr("Regenerate"))} &nbsp; '
                             f'{self._link(f"copymsg:{m.id}", self.tr("Copy"))}')
                    foot = f"{foot} &nbsp; {links}" if foot else links
                parts.append(self._block(self.tr("Assistant"), md.render(m.content), c["assistant"], foot))
        if self.streaming is not None:
            body = md.render(self.streaming) if self.streaming else f'<p style="color: {c["muted"]}">…</p>'
            parts.append(self._block(self.tr("Assistant"), body, c["assistant"]))
        if not self.messages and self.streaming is None and self.empty_text:
            parts.append(f'<p align="center" style="color: {c["muted"]}; margin-top: 40px">{self.empty_text}</p>')
        self._codes = md.codes
        return "".join(parts) + "</body>"

    def render(self) -> None:
        bar = self.verticalScrollBar()
        at_bottom = bar.value() >= bar.maximum() - 8
        keep = bar.value()
        self.setHtml(self.html())
        bar.setValue(bar.maximum() if at_bottom else keep)

    def _anchor(self, url: QUrl) -> None:
        kind, _, arg = url.toString().partition(":")
        if kind == "copy":
            self._copy(self._codes[int(arg)])
        elif kind == "copymsg":
            self._copy(next(m.content for m in self.messages if m.id == int(arg)))
        elif kind == "edit":
            self.edit_requested.emit(int(arg))
        elif kind == "regenerate":
            self.regenerate_requested.emit()
        elif kind in ("http", "https"):
            QDesktopServices.openUrl(url)

    def _copy(self, text: str) -> None:
        QGuiApplication.clipboard().setText(text)
        self.copy_requested.emit(text)


class MessageInput(QPlainTextEdit):
    """Enter sends; Shift+Enter adds a line. Grows with its text up to a few lines."""
    submitted = Signal(str)

    def __init__(self):
        super().__init__()
        self.setPlaceholderText(self.tr("Message Colibri — Enter sends, Shift+Enter adds a line"))
        self.setAccessibleName(self.tr("Message"))
        self.document().contentsChanged.connect(self._fit_height)
        self._fit_height()

    def keyPressEvent(self, e: QKeyEvent) -> None:
        if e.key() in (Qt.Key_Return, Qt.Key_Enter) and not e.modifiers() & Qt.ShiftModifier:
            text = self.toPlainText()
            if text.strip():
                self.submitted.emit(text)
            return
        super().keyPressEvent(e)

    def _fit_height(self) -> None:
        line = self.fontMetrics().lineSpacing()
        lines = min(max(self.document().blockCount(), 2), 8)
        self.setFixedHeight(lines * line + 26)
