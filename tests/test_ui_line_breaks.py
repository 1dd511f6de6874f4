"""Text as it was written: a single newline in a message is a line break in the chat view (as chat
apps render it), outside code blocks too; commonmark alone joined such lines into one."""
from __future__ import annotations


def test_single_newlines_stay_line_breaks_in_the_chat_view(qtbot):
    from app.history import Message
    from ui import theme
    from ui.chat_view import ChatView
    view = ChatView(theme.palette("light"), 11)
    qtbot.addWidget(view)
    poem = "Roses are red,\nviolets are blue.\n\nA new stanza\nhere."
    code = "```python\nx = 1\ny = 2\n```"
    view.set_messages([Message(1, 1, "user", "A poem, please", 0.0), Message(2, 1, "assistant", poem + "\n\n" + code,
                                                                             0.0)])
    lines = [line.strip() for line in view.toPlainText().replace("\u2028", "\n").splitlines()]
    for line in ("Roses are red,", "violets are blue.", "A new stanza", "here.", "x = 1", "y = 2"):
        assert line in lines, (line, lines)
