"""Thinking blocks, versions, branches, Continue and per-message facts in the chat window, on a
real Qt event loop (offscreen) with a real engine on its thread and real SQLite."""
from __future__ import annotations

import json

import pytest
from conftest import HF_FIXTURES
from PySide6.QtCore import Qt, QUrl

from app import export
import test_ui_main_window as M
from thinking_model import make_thinking_model

home, open_window, send = M.home, M.open_window, M.send  # a fixture and helpers of the window's tests
pytestmark = [pytest.mark.qt_log_level_fail("WARNING"), pytest.mark.qt_log_ignore("propagateSizeHints")]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from engine.convert.convert import convert
    return str(convert(HF_FIXTURES / "qwen2", tmp_path_factory.mktemp("ver") / "qwen2", "keep").path)


@pytest.fixture(scope="module")
def thinker(tmp_path_factory):
    return str(make_thinking_model(tmp_path_factory.mktemp("think")))


def click(w, href: str) -> None:
    w.view.anchorClicked.emit(QUrl(f"{w.view.token}:{href}"))  # what a click on the view's own link sends


def test_a_thinking_reply_folds_into_a_block_with_its_count_and_the_switch_turns_it_off(qtbot, home, thinker):
    w = open_window(qtbot, thinker, max_tokens=12)
    assert w.thinking_button.isVisibleTo(w) and w.thinking_button.isChecked()
    assert w.thinking_button.accessibleName() == "Thinking" and w.thinking_button.text() == "Thinking: on"
    seen = []  # the view rendered after each piece of streamed text: a loaded machine may send the
    append = w.view.append  # whole reply between two ticks of the render timer, so render each piece here

    def rendered(text: str) -> None:
        append(text)
        w.view.render_stream()
        seen.append(w.view.toPlainText())
    w.view.append = rendered
    send(qtbot, w, "What is 2+2?")
    assert any("▾ Thinking…" in t for t in seen)  # open, and counting, while it thinks
    m = w.history.messages(w.conv_id)[-1]
    assert m.reasoning and m.content == "" and m.stats["thinking_tokens"] == 12 and m.stats["thinking_open"]
    assert m.facts["thinking"] is True and m.facts["model"] == "thinker"
    text = w.view.toPlainText()
    assert "▸ Thought for 12 tokens" in text and m.reasoning.strip()[:20] not in text  # folded once done
    click(w, f"think:{m.id}")
    assert "▾ Thought for 12 tokens" in w.view.toPlainText() and m.reasoning.strip()[:20] in w.view.toPlainText()
    qtbot.mouseClick(w.thinking_button, Qt.LeftButton)  # off, for this chat
    assert w.history.conversation(w.conv_id).thinking is False and w.thinking_button.text() == "Thinking: off"
    send(qtbot, w, "And 3+3?")
    off = w.history.messages(w.conv_id)[-1]
    assert off.facts["thinking"] is False and off.stats["thinking_tokens"] == 0 and off.content
    sent = w.history.messages(w.conv_id)
    assert sent[1].reasoning and sent[1].id == m.id  # the earlier thinking is kept, apart from its answer
    w.new_conversation()  # a new chat thinks again (the template's default)
    assert w.thinking_button.isChecked() and w.history.conversation(w.conv_id).thinking is None


def test_regenerate_keeps_versions_and_editing_an_earlier_message_branches(qtbot, home, tiny):
    w = open_window(qtbot, tiny, max_tokens=6, temperature=1.0, seed=1)
    send(qtbot, w, "Name a bird")
    send(qtbot, w, "Why that one?")
    first = w.history.messages(w.conv_id)
    w.history.set_options(w.conv_id, "", {"seed": 2, "temperature": 1.0, "max_tokens": 6})
    click(w, "regenerate:")
    qtbot.waitUntil(lambda: w.busy == "", timeout=30_000)
    path = w.history.messages(w.conv_id)
    assert len(path) == 4 and (path[-1].version, path[-1].versions) == (2, 2) and path[-1].id != first[-1].id
    assert "2/2" in w.view.toPlainText() and path[-1].facts["sampling"]["seed"] == 2
    click(w, f"version:{path[-1].id}:-1")  # ‹ : the first reply again
    assert w.history.messages(w.conv_id)[-1].id == first[-1].id and "1/2" in w.view.toPlainText()
    w.show_version(None, 1)  # Alt+Right
    assert w.history.messages(w.conv_id)[-1].id == path[-1].id
    click(w, f"edit:{first[0].id}")  # the first message, not the last
    assert w.input.toPlainText() == "Name a bird" and w.notice.isVisibleTo(w)
    send(qtbot, w, "Name a fish")
    branch = w.history.messages(w.conv_id)
    assert [m.role for m in branch] == ["user", "assistant"] and branch[0].content == "Name a fish"
    assert (branch[0].version, branch[0].versions) == (2, 2)
    click(w, f"version:{branch[0].id}:-1")  # back to the first branch: all four messages, newest reply
    assert [m.id for m in w.history.messages(w.conv_id)] == [m.id for m in path]
    doc = json.loads(export.to_json(w.history, w.conv_id))
    assert len(doc["messages"]) == 7 and "Name a fish" not in export.to_markdown(w.history, w.conv_id)


def test_continue_resumes_a_reply_cut_by_the_token_limit(qtbot, home, tiny):
    w = open_window(qtbot, tiny, max_tokens=4)
    send(qtbot, w, "Tell me a story")
    cut = w.history.messages(w.conv_id)[-1]
    assert cut.stats["finish_reason"] == "length" and "Continue" in w.view.toPlainText()
    click(w, "continue:")
    qtbot.waitUntil(lambda: w.busy == "", timeout=30_000)
    msgs = w.history.messages(w.conv_id)
    assert len(msgs) == 2 and msgs[-1].id == cut.id and msgs[-1].stats["generated_tokens"] == 8
    assert msgs[-1].content.startswith(cut.content) and len(msgs[-1].content) > len(cut.content)
    # (that greedy 4 + 4 equal 8 at once: test_reasoning_chat; this model's bytes are not all UTF-8)
    md = export.to_markdown(w.history, w.conv_id)
    assert "*qwen2 · temperature 0.0" in md and "max_tokens 4 · 8 tokens at" in md
    click(w, f"details:{msgs[-1].id}")
    assert "temperature 0.0" in w.view.toPlainText()


def test_long_thinking_streams_its_tail_and_shows_whole_once_unfolded(qtbot):
    from app.history import Message
    from ui import theme
    from ui.chat_view import LIVE_CHARS, ChatView
    view = ChatView(theme.palette("light"), 11)
    qtbot.addWidget(view)
    thinking = " ".join(f"w{i}" for i in range(3000))
    view.set_messages([Message(1, 1, "user", "Hi", 0.0)], "<think>\n" + thinking)
    view.set_stream_tokens(3000)
    view.render_stream()
    text = view.toPlainText()
    assert "▾ Thinking… 3000 tokens" in text and "… " in text and "w2999" in text and "w0 " not in text
    assert len(text) < LIVE_CHARS + 200  # the tail only, while it streams
    view.end_stream()
    view.set_messages([Message(1, 1, "user", "Hi", 0.0), Message(2, 1, "assistant", "Done.", 0.0,
                                                                 {"thinking_tokens": 3000}, 1, thinking)])
    assert "▸ Thought for 3000 tokens" in view.toPlainText() and "w0 " not in view.toPlainText()
    view.anchorClicked.emit(QUrl(f"{view.token}:think:2"))
    assert "w0 w1" in view.toPlainText() and "w2999" in view.toPlainText()  # all of it, once finished


def test_the_context_count_follows_the_thinking_switch(qtbot, home, thinker):
    w = open_window(qtbot, thinker)
    from app.history import chat_messages
    cid = w.conv_id
    w.history.add_message(cid, "user", "What is 2+2?")
    w.history.add_message(cid, "assistant", "4")
    w.history.add_message(cid, "user", "And 3+3?")
    engine = w.flow.worker.engine  # read here only to check the counts
    msgs = chat_messages(w.history.conversation(cid), w.history.messages(cid))
    on, off = (len(engine.prompt_ids(msgs, {"enable_thinking": t})) for t in (True, False))
    assert on != off  # off: the template writes an empty thinking block
    w.count_context()  # (the empty chat's count, asked at start, may still be on its way: wait for this one)
    qtbot.waitUntil(lambda: w.context_counts.get(cid) == on, timeout=10_000)
    qtbot.mouseClick(w.thinking_button, Qt.LeftButton)
    qtbot.waitUntil(lambda: w.context_counts.get(cid) == off, timeout=10_000)
    w._update_status()
    assert w.context_label.text() == f"context {off} / {w.snapshot.context_limit:,}"
