"""The conversation view (Markdown in a QTextBrowser) and the message input box.

Streaming is rate-limited: the finished messages are laid out once (`render`), and the named timer
`stream_render_timer` replaces only the document's tail from `_stream_pos` (`render_stream`), never
once per token, so a long chat costs the same per tick as a short one. A reasoning model's thinking
is a block above the answer, open while it is written, folded once the answer starts.
"""
from __future__ import annotations

import html
import secrets
from contextlib import contextmanager
from typing import Iterator

from PySide6.QtCore import QCoreApplication, QTimer, QUrl, Signal
from PySide6.QtGui import QDesktopServices, QGuiApplication, QKeyEvent, Qt, QTextCursor
from PySide6.QtWidgets import QPlainTextEdit, QTextBrowser

from app.export import SHOWN
from app.history import Message
from app.reasoning import split
from ui.markdown import MarkdownRenderer

RENDER_MS = 50  # re-render a streaming reply at most 20 times a second
STREAM = 0  # the key of the streaming reply (message ids start at 1)
LIVE_CHARS = 1500  # thinking being written shows its tail only: laying out all of it each tick cost ~2x an answer


def _tr(text: str) -> str:
    return QCoreApplication.translate("ChatView", text)


def stats_line(stats: dict) -> str:
    if not stats.get("generated_tokens"):
        return ""
    parts = [_tr("{n} tokens").format(n=stats["generated_tokens"]),
             _tr("{rate:.1f} tok/s").format(rate=stats.get("decode_tok_s", 0)),
             _tr("first token {ttft:.2f} s").format(ttft=stats.get("ttft_s", 0))]
    said = {"cancelled": "stopped", "length": "hit the token limit", "context": "the context is full",
            "interrupted": "interrupted: the app closed while it was written"}.get(stats.get("finish_reason"))
    return " · ".join(parts + ([_tr(said)] if said else []))


def facts_text(facts: dict) -> str:
    """The Details line of a reply: the thinking switch and the sampling it was written with."""
    parts = []
    if facts.get("thinking") is not None:
        parts.append(_tr("thinking on") if facts["thinking"] else _tr("thinking off"))
    sampling = facts.get("sampling", {})
    parts += [f"{k} {sampling[k]}" for k in SHOWN if sampling.get(k) is not None]
    return " · ".join(parts)


def _token() -> str:
    return "c" + secrets.token_hex(8)  # a URL scheme: a letter first


class ChatView(QTextBrowser):
    copy_requested = Signal(str)  # text put on the clipboard
    edit_requested = Signal(int)  # message id
    regenerate_requested = Signal(int)  # reply id (0: the last reply)
    delete_requested = Signal(int)  # message id: it and the replies below it
    continue_requested = Signal()  # resume the last reply (cut short by the token limit or Stop)
    version_requested = Signal(int, int)  # message id, -1 (older) or +1 (newer)

    def __init__(self, colors: dict[str, str], font_pt: int):
        super().__init__()
        self.setOpenLinks(False)
        self.setObjectName("chat")
        self.setAccessibleName(self.tr("Conversation"))
        self.anchorClicked.connect(self._anchor)
        self.colors, self.font_pt = colors, font_pt
        self.token = _token()  # the scheme of this render's own action links (see _anchor)
        self.messages: list[Message] = []
        self.streaming: str | None = None  # the reply being written, or None
        self.empty_text = ""
        self.stream_note = ""  # shown in place of the reply until its first words (e.g. prompt progress)
        self.markers: dict[int, str] = {}  # message index -> a line above it: where the context leaves text out
        self._codes: list[str] = []
        self._stream_codes = 0  # code blocks of the finished messages; the streaming one's follow
        self._stream_pos: int | None = None  # document position where the streaming message starts
        self.full_renders = self.stream_renders = 0  # counted for the tests and the profile
        self.unfolded: set[int] = set()  # replies whose thinking is shown
        self.stream_shown: bool | None = None  # the streaming reply's thinking shown by hand; None: while it thinks
        self.details: set[int] = set()  # replies whose sampling details are shown
        self.stream_tokens = 0  # tokens of the streaming reply so far (its thinking count while it thinks)
        self._think_tokens = 0
        self.render_timer = QTimer(self, objectName="stream_render_timer", singleShot=True, interval=RENDER_MS)
        self.render_timer.timeout.connect(self.render_stream)

    def set_style(self, colors: dict[str, str], font_pt: int) -> None:
        self.colors, self.font_pt = colors, font_pt
        self.render()

    def set_messages(self, messages: list[Message], streaming: str | None = None) -> None:
        self.messages, self.streaming = list(messages), streaming
        self.render()

    def set_stream_tokens(self, n: int) -> None:
        """The streaming reply's token count; while it thinks, that is its thinking count."""
        self.stream_tokens = n

    def append(self, text: str) -> None:
        self.streaming = (self.streaming or "") + text
        if not self.render_timer.isActive():
            self.render_timer.start()

    def set_stream_note(self, note: str) -> None:
        """What the placeholder of a reply without words yet says (e.g. "reading your message: 43%")."""
        if note != self.stream_note:
            self.stream_note = note
            if self.streaming == "" and not self.render_timer.isActive():
                self.render_timer.start()

    def end_stream(self) -> None:
        self.streaming, self.stream_note, self._stream_pos = None, "", None
        self.stream_tokens = self._think_tokens = 0
        self.stream_shown = None
        self.render_timer.stop()

    # --- rendering ---------------------------------------------------------------------------
    def _block(self, who: str, body: str, bg: str, footer: str = "") -> str:
        c = self.colors
        foot = f'<p style="color: {c["muted"]}; margin-top: 6px">{footer}</p>' if footer else ""
        return (f'<table width="100%" cellspacing="0" cellpadding="12" bgcolor="{bg}" style="margin-bottom: 10px">'
                f'<tr><td><p style="font-weight: bold; color: {c["muted"]}; margin-bottom: 4px">{who}</p>'
                f'{body}{foot}</td></tr></table>')

    def _link(self, href: str, label: str) -> str:
        href = f"{self.token}:{href}"  # the view's own action: a link in model text cannot name it
        return f'<a href="{href}" style="color: {self.colors["link"]}; text-decoration: none">{label}</a>'

    def _versions(self, m: Message) -> str:
        """‹ 2/3 › for a message with versions; an end's arrow is plain text, not a link."""
        if m.versions < 2 or self.streaming is not None:
            return ""
        older = self._link(f"version:{m.id}:-1", "‹") if m.version > 1 else "‹"
        newer = self._link(f"version:{m.id}:1", "›") if m.version < m.versions else "›"
        return f"{older} {m.version}/{m.versions} {newer}"

    def _thinking(self, key: int, text: str, tokens: int, live: bool, shown: bool) -> str:
        """The thinking block: a header link that folds and unfolds it, then the thinking itself."""
        c = self.colors
        if live:
            head = self.tr("Thinking… {n} tokens").format(n=tokens) if tokens else self.tr("Thinking…")
        else:
            head = self.tr("Thought for {n} tokens").format(n=tokens) if tokens else self.tr("Thoughts")
        arrow = "▾" if shown else "▸"
        link = self._link(f"think:{key}", f"{arrow} {html.escape(head)}")
        body = ""
        if live and len(text) > LIVE_CHARS:
            text = "… " + text[-LIVE_CHARS:].split(" ", 1)[-1]
        if shown and text.strip():
            body = ('<p style="margin-top: 4px; margin-bottom: 0px; color: {m}">{t}</p>'
                    .format(m=c["muted"], t=html.escape(text.strip()).replace("\n", "<br>")))
        return (f'<table width="100%" cellspacing="0" cellpadding="8" style="margin-bottom: 6px">'
                f'<tr><td bgcolor="{c["code"]}">{link}{body}</td></tr></table>')

    def _reply_foot(self, m: Message, last: bool) -> str:
        """Figures and model; ‹ 2/3 › and the actions; the sampling when Details is open."""
        facts = " · ".join(p for p in (stats_line(m.stats), html.escape(m.facts.get("model", ""))) if p)
        links = [v for v in (self._versions(m),) if v]
        if self.streaming is None:  # every reply's actions, not only the last one's
            if last and m.stats.get("finish_reason") in ("length", "cancelled", "interrupted"):
                links.append(self._link("continue:", self.tr("Continue")))
            links.append(self._link(f"regenerate:{m.id}", self.tr("Regenerate")))
            links.append(self._link(f"copymsg:{m.id}", self.tr("Copy")))
        if m.facts.get("sampling"):
            links.append(self._link(f"details:{m.id}", self.tr("Details")))
        if self.streaming is None:
            links.append(self._link(f"delete:{m.id}", self.tr("Delete")))
        lines = [facts, " &nbsp; ".join(links)]
        if m.id in self.details and m.facts.get("sampling"):
            lines.append(html.escape(facts_text(m.facts)))
        return "<br>".join(line for line in lines if line)

    def _finished_html(self, md: MarkdownRenderer) -> str:
        c = self.colors
        parts = []
        last = len(self.messages) - 1
        for i, m in enumerate(self.messages):
            parts.append(self._marker_html(i))
            if m.role == "user":
                body = "<p>" + html.escape(m.content).replace("\n", "<br>") + "</p>" + self._attachments_html(m)
                links = [v for v in (self._versions(m),) if v]
                if self.streaming is None:
                    links += [self._link(f"edit:{m.id}", self.tr("Edit")), self._link(f"copymsg:{m.id}", self.tr("Copy")),
                              self._link(f"delete:{m.id}", self.tr("Delete"))]
                parts.append(self._block(self.tr("You"), body, c["user"], " &nbsp; ".join(links)))
            else:
                thinking = self._thinking(m.id, m.reasoning, m.stats.get("thinking_tokens", 0), False,
                                          m.id in self.unfolded) if m.reasoning else ""
                parts.append(self._block(self.tr("Assistant"), thinking + md.render(m.content), c["assistant"],
                                         self._reply_foot(m, i == last)))
        if not self.messages and self.streaming is None and self.empty_text:
            parts.append(f'<p align="center" style="color: {c["muted"]}; margin-top: 40px">{self.empty_text}</p>')
        return "".join(parts)

    def _stream_html(self, md: MarkdownRenderer) -> str:
        c = self.colors
        placeholder = html.escape(self.stream_note) or "…"
        thinking, answer, still = split(self.streaming or "", final=False)
        if still:
            self._think_tokens = self.stream_tokens
        block = ""
        if thinking or still:  # open while it thinks (unless folded by hand), folded once the answer starts
            shown = still if self.stream_shown is None else self.stream_shown
            block = self._thinking(STREAM, thinking, self._think_tokens, still, shown)
        body = md.render(answer) if answer else "" if block else f'<p style="color: {c["muted"]}">{placeholder}</p>'
        return self._block(self.tr("Assistant"), block + body, c["assistant"])

    def _open(self) -> str:
        return f'<body style="font-size: {self.font_pt}pt; color: {self.colors["text"]}">'

    def html(self) -> str:
        """The whole conversation as one document (the streaming message last)."""
        md = MarkdownRenderer(self.colors, f"{self.token}:copy")
        text = self._open() + self._finished_html(md)
        if self.streaming is not None:
            text += self._stream_html(md)
        self._codes = md.codes
        return text + "</body>"

    def render(self) -> None:
        """Lay out the whole conversation; a streaming message is then appended by render_stream."""
        self.render_timer.stop()
        self.full_renders += 1
        self.token = _token()  # the links of an earlier layout (or any a model wrote) stop acting
        with self._scroll_kept():
            md = MarkdownRenderer(self.colors, f"{self.token}:copy")
            self.setHtml(self._open() + self._finished_html(md) + "</body>")
            self._codes, self._stream_codes = md.codes, len(md.codes)
            self._stream_pos = None
            if self.streaming is not None:
                end = QTextCursor(self.document())
                end.movePosition(QTextCursor.End)
                self._stream_pos = end.position()
                self._replace_stream()

    def render_stream(self) -> None:
        """Re-render the streaming message only (the timer's slot)."""
        if self.streaming is not None and self._stream_pos is not None:
            with self._scroll_kept():
                self._replace_stream()

    @contextmanager
    def _scroll_kept(self) -> Iterator[None]:
        """The view stays at the bottom if it was there, else where it was."""
        bar = self.verticalScrollBar()
        at_bottom, keep = bar.value() >= bar.maximum() - 8, bar.value()
        yield
        bar.setValue(bar.maximum() if at_bottom else keep)

    def _replace_stream(self) -> None:
        self.stream_renders += 1
        md = MarkdownRenderer(self.colors, f"{self.token}:copy")
        md.codes = self._codes[:self._stream_codes]  # the streaming message's Copy links number on
        cur = QTextCursor(self.document())
        cur.setPosition(self._stream_pos)
        cur.movePosition(QTextCursor.End, QTextCursor.KeepAnchor)
        cur.beginEditBlock()
        cur.removeSelectedText()
        cur.insertHtml(f'<div style="font-size: {self.font_pt}pt; color: {self.colors["text"]}">'
                       f'{self._stream_html(md)}</div>')  # insertHtml does not inherit the body's style
        cur.endEditBlock()
        self._codes = md.codes

    def _marker_html(self, index: int) -> str:
        """The line above the first message the model still reads, when earlier ones are left out."""
        text = self.markers.get(index)
        if text is None:
            return ""
        c = self.colors
        return (f'<table width="100%" cellspacing="0" cellpadding="6" style="margin-bottom: 10px"><tr><td '
                f'style="border-top: 1px dashed {c["muted"]}; border-bottom: 1px dashed {c["muted"]}">'
                f'<p align="center" style="color: {c["muted"]}">✂ {html.escape(text)}</p></td></tr></table>')

    def _attachments_html(self, m: Message) -> str:
        """The files attached to a message: name and token count (their text goes to the model)."""
        files = getattr(m, "attachments", None) or []
        if not files:
            return ""
        items = " &nbsp;·&nbsp; ".join(
            f'<b>{html.escape(a["name"])}</b>' + (f' ({_tr("{n:,} tokens").format(n=a["tokens"])})'
                                                  if a.get("tokens") is not None else "") for a in files)
        return f'<p style="color: {self.colors["muted"]}; margin-top: 6px">{_tr("Attached:")} {items}</p>'

    def _anchor(self, url: QUrl) -> None:
        """A click: the view's own actions carry this render's token; any other link (one a model
        wrote) only opens an http(s) page."""
        scheme, _, action = url.toString().partition(":")
        if scheme in ("http", "https"):
            QDesktopServices.openUrl(url)
            return
        if scheme != self.token:
            return
        kind, _, arg = action.partition(":")
        if kind == "copy":
            self._copy(self._codes[int(arg)])
        elif kind == "copymsg":
            self._copy(next(m.content for m in self.messages if m.id == int(arg)))
        elif kind == "edit":
            self.edit_requested.emit(int(arg))
        elif kind == "regenerate":
            self.regenerate_requested.emit(int(arg or 0))
        elif kind == "delete":
            self.delete_requested.emit(int(arg))
        elif kind == "continue":
            self.continue_requested.emit()
        elif kind == "version":
            mid, _, delta = arg.partition(":")
            self.version_requested.emit(int(mid), int(delta))
        elif kind == "think":
            self.toggle_thinking(int(arg))
        elif kind == "details":
            self.details ^= {int(arg)}
            self.render()

    def toggle_thinking(self, key: int) -> None:
        """Fold or unfold a reply's thinking (STREAM: the one being written)."""
        if key == STREAM:
            still = split(self.streaming or "", final=False)[2]
            self.stream_shown = not (still if self.stream_shown is None else self.stream_shown)
            self.render_stream()
            return
        self.unfolded ^= {key}
        self.render()

    def _copy(self, text: str) -> None:
        QGuiApplication.clipboard().setText(text)
        self.copy_requested.emit(text)


class MessageInput(QPlainTextEdit):
    """Enter sends; Shift+Enter adds a line. Grows with its text up to a few lines."""
    submitted = Signal(str)

    def __init__(self):
        super().__init__()
        self.set_texts()
        self.document().contentsChanged.connect(self._fit_height)
        self._fit_height()

    def set_texts(self) -> None:
        self.setPlaceholderText(self.tr("Message Colibri — Enter sends, Shift+Enter adds a line"))
        self.setAccessibleName(self.tr("Message"))

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
