"""Context counting of the main window: how much of the model's context the open chat takes under
its policy (with the draft and its files), the markers where messages are left out, the warning
when a message will not fit, and attaching files. The worker counts; its answers come back to
`_on_counted` and `_on_planned`. A part of MainWindow (mixed into it).
"""
from __future__ import annotations

import threading
from pathlib import Path

from PySide6.QtCore import QEvent, QObject, Signal
from PySide6.QtWidgets import QFileDialog

from app.chat_session import reply_room
from app.history import chat_messages
from app.passages import excerpt
from ui.context_ui import marker_texts
from ui.model_flow import show_error

DRAFT_MS = 400  # the message being written is counted this long after the last keystroke


class _Reads(QObject):
    """Carries files read off the GUI thread back to it (a queued signal), for every window."""
    done = Signal(object, object, str)  # window id, Attachment or None, error ("" when read)


_reads: _Reads | None = None


def _relay() -> _Reads:
    """The one relay, made on the GUI thread and kept for the application's life: a job never
    holds a Qt object it could be the last owner of."""
    global _reads
    if _reads is None:
        _reads = _Reads()
    return _reads


class ContextCounting:
    """`context_counts`, `plans` (per chat) and `draft_plan` (the open chat with the message being written)."""

    def count_context(self) -> None:
        """Ask the worker how much of the context the open chat takes under its policy."""
        if self.flow.model is None or self.conv_id is None or self.conv_id == self.gen_conv:
            return
        conv = self.history.conversation(self.conv_id)
        self.flow.count_requested.emit(conv.id, chat_messages(conv, self.history.messages(conv.id)),
                                       self.history.context_policy(conv.id), "chat", self._template_vars(conv))

    def _markers(self, conv) -> dict[int, str]:
        """Where the open chat's next prompt leaves messages out: lines before the first message
        left out and before the first one read again (indices into its messages)."""
        plan = self.plans.get(conv.id)
        drafting = self.tray.items or self.input.toPlainText().strip()
        if self.draft_plan is not None and drafting and self.editing is None and self.gen_conv != conv.id:
            plan = self.draft_plan  # what sending the message being written leaves out: the banner's count
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
                self._refresh_markers()
                self._update_status()
            return
        old = self.plans.get(cid)
        self.plans[cid] = plan
        if cid == self.conv_id and (old is None or old.marker_before != plan.marker_before
                                    or old.dropped != plan.dropped) and self.gen_conv != cid:
            self.render_conversation()
        if cid == self.conv_id:
            self._update_status()

    def _on_counted(self, cid: int, tokens: int) -> None:
        if self.closed:  # a model that finished loading after the window (and its history) closed
            return
        self.context_counts[cid] = tokens
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
        """Read a file into the message being written (its tokens are counted by the worker). A PDF
        is read off the GUI thread, its chip added when read: None then, as for a refused file."""
        from app.attachments import AttachmentError, is_pdf, read_attachment
        if is_pdf(path):
            self._read_off_the_gui_thread(Path(path))
            return None
        try:
            a = read_attachment(path)
        except AttachmentError as e:
            show_error(self, self.tr("Attaching a file"), str(e))
            return None
        return self._add_attachment(a)

    def _read_off_the_gui_thread(self, path: Path) -> None:
        from app.attachments import AttachmentError, read_attachment
        relay, me = _relay(), id(self)
        if not getattr(self, "_reads_connected", False):
            relay.done.connect(self._on_read)
            self._reads_connected = True

        def job() -> None:  # plain values and the app-long relay only (see ui.remote_dialog._relay)
            try:
                relay.done.emit(me, read_attachment(path), "")
            except AttachmentError as e:
                relay.done.emit(me, None, str(e))
        threading.Thread(target=job, name="colibri-attach", daemon=True).start()
        self.statusBar().showMessage(self.tr("Reading {name}…").format(name=path.name), 5000)

    def _on_read(self, window: int, a, error: str) -> None:
        if window != id(self) or self.closed:
            return
        if error:
            show_error(self, self.tr("Attaching a file"), error)
        else:
            self._add_attachment(a)

    def _add_attachment(self, a) -> int:
        from app.attachments import with_attachments
        key = self.tray.add(a)
        if self.flow.model is not None:
            self.flow.count_attachment_requested.emit(key, with_attachments("", [a]))
        return key

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

    def _draft_changed(self) -> None:
        self.draft_plan = None
        self.draft_timer.start()

    def count_draft(self) -> None:
        """Ask whether the open chat with the message being written still fits (the warning)."""
        if self.closed:
            return
        text = self.input.toPlainText().strip()
        if self.flow.model is None or self.conv_id is None or not (text or self.tray.items):
            self._set_warning("")
            self._refresh_markers()
            return
        from app.attachments import with_attachments
        for key, e in list(self.tray.excerpts.items()):  # re-ranked for the question as it reads now
            self.tray.set_excerpt(key, excerpt(self.tray.items[key], text, e.budget))
        conv = self.history.conversation(self.conv_id)
        path = self.history.messages(conv.id)
        if self.editing is not None:  # the edited message replaces itself and what follows it (a branch)
            at = next((i for i, m in enumerate(path) if m.id == self.editing), len(path))
            path = path[:at]
        msgs = chat_messages(conv, path)
        msgs.append({"role": "user", "content": with_attachments(text, self.tray.records())})
        self.flow.count_requested.emit(conv.id, msgs, self.history.context_policy(conv.id), "draft",
                                       self._template_vars(conv))

    def _send_passages(self, p) -> bool:
        """A message that does not fit because of long files: each long file is cut to the passages
        most relevant to the message (app.passages), and the draft counted again; False when that
        cannot help (a file not counted yet, or one passage long)."""
        tray = self.tray
        if any(a.tokens is None for a in tray.items.values()):
            return False
        sent = {k: len(tray.excerpts[k].attachment.text) * a.tokens // max(1, len(a.text)) if k in tray.excerpts
                else a.tokens for k, a in tray.items.items()}
        room = p.limit - reply_room(p.limit) - (p.tokens - sum(sent.values()))
        if tray.excerpts:  # cut already and still too long: the characters-per-token estimate was short
            room = min(room, int(sum(sent.values()) * 0.8))
        room = int(room * 0.9)
        short = {k: t for k, t in sent.items() if k not in tray.excerpts and t <= room // max(1, len(sent))}
        long = [k for k in tray.items if k not in short]
        each = (room - sum(short.values())) // max(1, len(long))
        cut = {k: excerpt(tray.items[k], self.input.toPlainText(), each) for k in long}
        if not long or any(e is None for e in cut.values()):
            return False
        for k, e in cut.items():
            tray.set_excerpt(k, e)
        self.count_draft()
        return True

    def _show_draft_warning(self) -> None:
        p = self.draft_plan
        if p is None:
            return
        if not p.fits and p.policy != "stop" and self._send_passages(p):
            return
        if not p.fits and p.policy == "stop":
            self._set_warning(self.tr("Will not fit: with this message the chat takes {used:,} of the model's "
                                          "{limit:,} tokens, and this chat stops at the limit. Start a new chat or "
                                          "choose another policy below.").format(used=p.tokens, limit=p.limit), "full")
        elif not p.fits:
            self._set_warning(self.tr("Will not fit: this message and its attachments take {used:,} of the "
                                          "model's {limit:,} tokens even with every earlier message left out. Remove "
                                          "an attachment or shorten the message.").format(used=p.tokens,
                                                                                          limit=p.limit), "full")
        elif p.dropped:
            self._set_warning(self.tr("Sending leaves {n} earlier messages out of the model's context to make "
                                          "room.").format(n=len(p.dropped)), "dropped")
        else:
            self._set_warning("")

    def _set_warning(self, text: str, level: str = "") -> None:
        """The tray's warning; the status bar's copy of the old one (a refused Send) goes with it."""
        old = self.tray.warning.text()
        if old and old != text and self.statusBar().currentMessage() == old:
            self.statusBar().clearMessage()
        self.tray.set_warning(text, level)

    def _refresh_markers(self) -> None:
        """The open chat laid out again where its markers changed (a draft that leaves more out)."""
        if self.conv_id is None or self.gen_conv == self.conv_id:
            return
        if self._markers(self.history.conversation(self.conv_id)) != self.view.markers:
            self.render_conversation()
