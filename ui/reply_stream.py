"""Reply streaming of the main window: sending a message, the reply as it streams in (saved as it
grows, so a kill loses at most PARTIAL_S of it), stop, regenerate, continue, versions and editing.
A part of MainWindow (mixed into it): requests go through `flow.generate`; the worker's signals
come back to `_on_text` and `_on_finished`.
"""
from __future__ import annotations

import logging
import time
from pathlib import Path

from app.history import NEW_TITLE, chat_messages
from app.reasoning import joined, split
from app.worker import CONTEXT_POLICY, RESUME, TEMPLATE_VARS, prompt_progress

log = logging.getLogger("colibri.ui")

PARTIAL_S = 1.0  # a reply being written is saved to the history this often: a kill loses at most this


class ReplyStreaming:
    """`request` (the latest generation's id), `gen_conv` (the chat it writes for), `streams` (its text so far)."""

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
        """The reply so far into the history: a kill now loses at most the last PARTIAL_S of it."""
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
                self.history.add_message(cid, "assistant", content, stats, reasoning, self.gen_facts,
                                         parent=self.gen_parent)  # what it answers, wherever the leaf went
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

    def regenerate(self, message_id: int | None = None) -> None:
        """A new version of a reply (None: the last); the earlier ones stay, browsable as ‹ 1/2 ›.
        An earlier reply's new version starts a branch there: what followed it stays in the old one."""
        if self.busy or self.flow.model is None:
            return
        msgs = self.history.messages(self.conv_id)
        if not msgs:
            return
        target = msgs[-1] if message_id is None else next((m for m in msgs if m.id == message_id), None)
        if target is None:
            return
        if target.role == "assistant":
            self.regenerating = target.id
            self.history.select(self.conv_id, target.parent_id, descend=False)  # the new one is its sibling
        self._generate()

    def delete_message(self, message_id: int) -> None:
        """Delete a message and the replies below it, once the user agrees (they cannot come back)."""
        if self.busy:
            return
        from PySide6.QtWidgets import QMessageBox
        _, children = self.history.tree(self.conv_id)
        text = self.tr("Delete this message?") if not children.get(message_id) else self.tr(
            "Delete this message and the replies below it (every version of them)?")
        box = QMessageBox(QMessageBox.Question, self.tr("Delete"), text, QMessageBox.Yes | QMessageBox.Cancel, self)
        box.setObjectName("delete_message_dialog")
        box.setDefaultButton(QMessageBox.Cancel)

        def done(answer: int) -> None:
            if answer == QMessageBox.Yes and not self.busy and not self.closed:
                self.history.delete_from(self.conv_id, message_id)
                self.render_conversation()
                self.refresh_conversations()
                self.count_context()
        box.finished.connect(done)
        box.open()

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
