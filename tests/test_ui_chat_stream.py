"""Issue 18's chat-window defects on a real Qt event loop (offscreen): the streaming reply per chat,
re-rendering only the streaming message, and an honest status line."""
from __future__ import annotations

import dataclasses
import threading

import pytest
import test_ui_main_window as M
from PySide6.QtCore import Qt

from app import worker as W
from engine.api import Step
from ui import theme

home, tiny, open_window = M.home, M.tiny, M.open_window
pytestmark = [pytest.mark.qt_log_level_fail("WARNING"), pytest.mark.qt_log_ignore("propagateSizeHints")]


def step(text: str = "", n: int = 1, **kw) -> Step:
    return Step(text, 1, n, 12, 0, 900.0, 30.0, 0.25, 12 + n, 4096, **kw)


def start_fake_reply(w) -> int:
    """The window's state right after `_generate`, without asking an engine: the test then plays the
    worker's `text` signals itself (emitted for real, delivered by the event loop)."""
    w.request += 1
    w.gen_conv = w.conv_id
    path = w.history.messages(w.conv_id)
    w.gen_parent = path[-1].id if path else None
    w.streams[w.conv_id] = ""
    w.render_conversation()
    w._set_busy("generating")
    return w.request


def test_a_streaming_reply_survives_switching_chats_and_back(qtbot, home):
    w = open_window(qtbot, None, wait=False)
    first = w.conv_id
    w.history.add_message(first, "user", "Tell me about birds")
    w.render_conversation()
    req = start_fake_reply(w)
    w.flow.worker.text.emit(req, "Hummingbirds ", step("Hummingbirds ", 1))
    qtbot.waitUntil(lambda: "Hummingbirds" in w.view.toPlainText(), timeout=2_000)
    w.new_conversation()  # away, while it streams
    assert w.conv_id != first and "Hummingbirds" not in w.view.toPlainText()
    assert w.send_button.text() == "Stop" and "being written" in w.notice.text() and w.notice.isVisibleTo(w)
    w.flow.worker.text.emit(req, "hover.", step("hover.", 2))  # words arrive while another chat is open
    qtbot.wait(150)
    assert "hover" not in w.view.toPlainText()
    w.open_conversation(first)  # and back: everything written so far is there
    qtbot.waitUntil(lambda: "Hummingbirds hover." in w.view.toPlainText(), timeout=2_000)
    assert w.send_button.text() == "Stop" and not w.notice.isVisibleTo(w)
    w.flow.worker.text.emit(req, " Fast.", step(" Fast.", 3))
    qtbot.waitUntil(lambda: "Hummingbirds hover. Fast." in w.view.toPlainText(), timeout=2_000)
    w.flow.worker.finished.emit(req, W.Reply("Hummingbirds hover. Fast.", step("", 3, finish_reason="stop"), 0))
    qtbot.waitUntil(lambda: w.busy == "", timeout=2_000)
    assert w.history.messages(first)[-1].content == "Hummingbirds hover. Fast." and first not in w.streams
    req = start_fake_reply(w)  # a reply that fills the context ends as "context" (the engine's own reason)
    w.flow.worker.finished.emit(req, W.Reply("More.", step("More.", 4, finish_reason="context"), 0))
    qtbot.waitUntil(lambda: w.busy == "", timeout=2_000)
    assert "context is full" in w.statusBar().currentMessage() and "the context is full" in w.view.toPlainText()


def test_only_the_streaming_message_is_rendered_again(qtbot, home):
    from app.history import Message
    from ui.chat_view import ChatView
    view = ChatView(theme.palette("light"), 12)
    qtbot.addWidget(view)
    view.show()
    msgs = []
    for i in range(40):  # a long chat: re-laying it out 20 times a second is what made streaming heavy
        msgs.append(Message(2 * i, 1, "user", f"question {i}", 0.0))
        msgs.append(Message(2 * i + 1, 1, "assistant", f"answer {i}\n\n```python\nx = {i}\n```", 0.0))
    msgs.append(Message(99, 1, "user", "last question", 0.0))
    view.set_messages(msgs, "")
    assert view.full_renders == 1
    for i in range(30):
        view.append(f"word{i} ")
        if i == 10:
            view.append("\n\n```python\ny = 2\n```\n\n")
        qtbot.wait(12)
    qtbot.waitUntil(lambda: "word29" in view.toPlainText(), timeout=2_000)
    assert view.full_renders == 1 and view.stream_renders >= 3  # ticks of the named timer, not one per word
    assert view.stream_renders < 31
    ref = ChatView(theme.palette("light"), 12)  # the same conversation laid out in one piece
    qtbot.addWidget(ref)
    ref.messages, ref.streaming = view.messages, view.streaming
    ref.setHtml(ref.html())
    assert view.toPlainText() == ref.toPlainText()
    assert view._codes == ref._codes and view._codes[-1] == "y = 2"  # Copy links number on
    assert view.document().blockCount() == ref.document().blockCount()  # nothing piles up at the end
    view.end_stream()
    view.set_messages(msgs + [Message(100, 1, "assistant", view.toPlainText()[-10:], 0.0)])
    assert view.full_renders == 2 and "Regenerate" in view.toPlainText()


def prompt_step(done: int, total: int) -> Step:
    """The engine's prefill progress: Step(kind="prompt") of generate(prompt_progress=True)."""
    return dataclasses.replace(step(""), kind="prompt", token_id=None, generated_tokens=0, prompt_tokens=total,
                               prompt_done=done)


def test_prompt_progress_and_context_steps_are_passed_on():
    """Prompt processing comes as `kind="prompt"` steps (prompt_done of prompt_tokens): stream_reply
    asks for them and for Stop during the prompt, passes them on without text, and they never become
    the reply's last step."""
    asked = {}

    class Engine:
        context_limit = 4096

        def prompt_ids(self, msgs, template_vars=None):
            return [0] * len(msgs)

        def generate(self, msgs, **kw):
            asked.update(kw)
            yield prompt_step(64, 256)
            yield prompt_step(256, 256)
            yield step("Hi", 1)
            yield step("!", 2, finish_reason="context")

        def stop(self):
            pass
    got = []
    t = iter(range(100))
    reply = W.stream_reply(Engine(), [{"role": "user", "content": "x"}], {}, threading.Event(),
                           lambda text, s: got.append((text, W.prompt_progress(s))), frame_s=0.5,
                           clock=lambda: float(next(t)))
    assert reply.text == "Hi!" and reply.step.finish_reason == "context"
    assert ("", 0.25) in got and ("", 1.0) in got and got[-1][0].endswith("!")
    assert W.prompt_progress(step("a")) is None
    assert W.prompt_progress(prompt_step(0, 0)) is None
    assert asked["prompt_progress"] is True and isinstance(asked["cancel"], threading.Event)


def test_the_status_line_says_nothing_yet_then_reading_then_the_speed(qtbot, home, tiny):
    w = open_window(qtbot, tiny)
    w._update_status()
    assert w.speed_label.text() == "no reply yet"  # not "0.0 tok/s · first token 0.00 s"
    qtbot.waitUntil(lambda: w.context_counts.get(w.conv_id) == 0, timeout=10_000)
    req = start_fake_reply(w)
    w._update_status()
    assert w.speed_label.text() == "reading your message…"

    w.flow.worker.text.emit(req, "", prompt_step(43, 100))
    qtbot.waitUntil(lambda: w.prompt_read == pytest.approx(0.43), timeout=2_000)
    w._update_status()
    assert w.speed_label.text() == "reading your message: 43%"
    qtbot.waitUntil(lambda: "reading your message: 43%" in w.view.toPlainText(), timeout=2_000)
    w.flow.worker.text.emit(req, "Hi", Step("Hi", 1, 1, 12, 0, 900.0, 0.0, 0.25, 13, 4096))
    qtbot.waitUntil(lambda: w.last_step is not None, timeout=2_000)
    w._update_status()
    assert w.speed_label.text() == "first token 0.25 s · writing…"  # one token: no rate yet, not "0.0 tok/s"
    w.flow.worker.text.emit(req, " there", step(" there", 5))
    qtbot.waitUntil(lambda: w.last_step.generated_tokens == 5, timeout=2_000)
    w._update_status()
    assert w.speed_label.text() == "30.0 tok/s · first token 0.25 s" and w.context_label.text() == "context 17 / 4,096"
    w.flow.worker.finished.emit(req, W.Reply("", None, 0))
    qtbot.waitUntil(lambda: w.busy == "", timeout=2_000)


def test_the_context_meter_follows_the_open_chat(qtbot, home, tiny):
    w = open_window(qtbot, tiny)
    w.input.setPlainText("Hello there, a few words of context please")
    qtbot.keyClick(w.input, Qt.Key_Return)
    qtbot.waitUntil(lambda: w.busy == "", timeout=60_000)
    long_chat = w.conv_id
    used = w.context_counts[long_chat]
    assert used > 10 and f"context {used:,} / " in w.context_label.text()
    assert w.speed_label.text().startswith("last reply ")
    w.new_conversation()  # an empty chat takes no context, whatever the last one did
    qtbot.waitUntil(lambda: w.context_label.text().startswith("context 0 / "), timeout=10_000)
    assert w.speed_label.text() == "no reply yet"
    w.open_conversation(long_chat)
    qtbot.waitUntil(lambda: w.context_label.text().startswith(f"context {used:,} / "), timeout=10_000)
    w.context_counts.clear()
    with qtbot.waitSignal(w.flow.ready, timeout=60_000):  # another model: counted again, with its tokenizer
        w.flow.load(tiny)
    qtbot.waitUntil(lambda: w.context_counts.get(long_chat) is not None, timeout=10_000)


def test_a_long_code_line_wraps_instead_of_widening_the_chat(qtbot):
    from app.history import Message
    from ui.chat_view import ChatView
    view = ChatView(theme.palette("light"), 11)
    qtbot.addWidget(view)
    view.resize(600, 400)
    view.show()
    long = "```python\nprint(1)  # " + "abcdefgh" * 60 + "\n```"
    view.set_messages([Message(1, 1, "user", "x", 0.0), Message(2, 1, "assistant", long, 0.0)])
    qtbot.waitUntil(lambda: view.document().size().width() > 0, timeout=2_000)
    assert view.horizontalScrollBar().maximum() == 0  # the whole chat no longer scrolls sideways
    assert "abcdefgh" * 60 in view.toPlainText().replace("\n", "").replace("\u2028", "")


def test_stop_interrupts_a_prompt_being_read(qtbot, home, tiny, monkeypatch):
    """Defect 3: Stop (Esc) during "reading your message" ends the reply before its first token."""
    from engine.api import Engine
    generate = Engine.generate

    def slow_prompt(self, *args, **kwargs):  # 20 ms per chunk of 4 prompt tokens: Stop lands mid-prompt
        for s in generate(self, *args, **kwargs):
            if s.kind == "prompt":
                threading.Event().wait(0.02)
            yield s
    monkeypatch.setattr(Engine, "generate", slow_prompt)
    w = open_window(qtbot, None, wait=False)
    w.settings.model, w.settings.engine = tiny, {"batch_size": 4}
    with qtbot.waitSignal(w.flow.ready, timeout=120_000):
        w.flow.start()
    w.input.setPlainText("please read all of this " * 8)  # ~140 tokens: 35 chunks
    qtbot.keyClick(w.input, Qt.Key_Return)
    qtbot.waitUntil(lambda: w.prompt_read is not None, timeout=30_000)
    assert w.busy == "generating" and w.send_button.text() == "Stop"
    qtbot.keyClick(w.input, Qt.Key_Escape)
    qtbot.waitUntil(lambda: w.busy == "", timeout=10_000)
    msgs = w.history.messages(w.conv_id)
    assert [m.role for m in msgs] == ["user"]  # no reply: none was written, and nothing is left half-saved
    assert w.history.db.execute("SELECT COUNT(*) FROM partial_replies").fetchone()[0] == 0
    engine = w.flow.worker.engine
    assert engine.cache.length < len(engine.prompt_ids(W_prompt(w)))  # the prompt was cut, not read whole


def W_prompt(w) -> list:  # noqa: N802 - the chat as the worker sent it
    from app.history import chat_messages
    return chat_messages(w.history.conversation(w.conv_id), w.history.messages(w.conv_id))


def test_the_footer_says_whether_the_context_or_the_token_limit_ended_a_reply():
    """Defect 10: a context that fills mid-reply is not reported as max_tokens."""
    from ui.chat_view import stats_line
    base = {"generated_tokens": 5, "decode_tok_s": 10.0, "ttft_s": 0.1}
    assert stats_line(base | {"finish_reason": "context"}).endswith("the context is full")
    assert stats_line(base | {"finish_reason": "length"}).endswith("hit the token limit")
    assert stats_line(base | {"finish_reason": "interrupted"}).endswith("interrupted: the app closed while it was "
                                                                       "written")
