"""The status line of the main window and the state of its controls: this chat's speed, its
context use, the process memory and the local server's address; Send turns into Stop while a reply
is written. Refreshed every STATUS_MS, never per token. A part of MainWindow (mixed into it).
"""
from __future__ import annotations

import psutil
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QLabel

STATUS_MS = 500  # the status line is refreshed at this fixed rate, never per token


class StatusLine:
    """`busy`: "" or what the engine is doing ("generating", "loading", …)."""

    def _build_status_line(self) -> None:
        self.speed_label = QLabel(objectName="speed")
        self.context_label = QLabel(objectName="context")
        self.memory_label = QLabel(objectName="memory")
        self.server_label = QLabel(objectName="server")  # the local server's address while it is on
        self.server_label.setTextInteractionFlags(Qt.TextSelectableByMouse)
        self.server_label.hide()
        for lab in (self.server_label, self.speed_label, self.context_label, self.memory_label):
            self.statusBar().addPermanentWidget(lab)

    def _set_busy(self, what: str) -> None:
        self.busy = what
        self._update_controls()
        self._show_loading()

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
        """This chat's reply speed (live while written), its context use, the process memory."""
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

    def _on_slowed(self, why: str) -> None:
        """The worker saw decode fall while other programs took the CPU, or saw it end ("")."""
        self.slow_reason = why
        if self.closed:
            return
        if why:
            self.statusBar().showMessage(self.tr("Slower than usual: {why}").format(why=why), 15000)
        self._update_status()
