"""The thinking switch of the main window: shown for a model that thinks and whose chat template can
turn it off, kept per chat, and told to the template for counting as for writing.

A part of MainWindow (mixed into it)."""
from __future__ import annotations

from ui.chat_view import STREAM


class ThinkingSwitch:
    """`reasons`: (the loaded model thinks, its template has a switch), from the worker."""

    def _on_reasoning(self, path: str, reasons: bool, switchable: bool) -> None:
        if self.closed:  # a model that finished loading after the window (and its history) closed
            return
        self.reasons = (reasons, switchable)
        self._show_thinking_switch()

    def _template_vars(self, conv) -> dict:
        """What the chat template is told besides the messages: its thinking switch."""
        on = self._thinking_on(conv)
        return {} if on is None else {"enable_thinking": on}

    def _thinking_on(self, conv) -> bool | None:
        """The chat's thinking switch as the template gets it; None where it has no switch."""
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
