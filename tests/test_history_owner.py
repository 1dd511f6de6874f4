"""One history, one owner: a second Colibri on the same data folder is refused with a reason (it never
turns the first one's streaming reply into an "interrupted" one), a database that is only locked is
never set aside as corrupt, a reply is saved under the message it answers, and the files are private."""
from __future__ import annotations

import os
import sqlite3
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import test_ui_chat_stream as C

from app import worker as W
from app.history import History, HistoryError

home = C.home

ROOT = Path(__file__).parent.parent

OWNER = """
import sys
from app.history import History
h = History(sys.argv[1])
cid = h.create("birds").id
user = h.add_message(cid, "user", "Tell me about birds")
h.save_partial(cid, user.id, "Hummingbirds hover", "", {"generated_tokens": 3}, {})
print("streaming", flush=True)
sys.stdin.read()  # until the test lets go: the app still writing its reply
"""


def test_a_second_instance_is_refused_and_leaves_the_first_ones_reply_alone(tmp_path):
    db = tmp_path / "history.db"
    owner = subprocess.Popen([sys.executable, "-c", OWNER, str(db)], cwd=ROOT, stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True, env=os.environ | {"PYTHONPATH": str(ROOT)})
    try:
        assert owner.stdout.readline().strip() == "streaming"
        with pytest.raises(HistoryError, match=r"another Colibri .*has this history open"):
            History(db)
        raw = sqlite3.connect(db)
        assert raw.execute("SELECT content FROM partial_replies").fetchall() == [("Hummingbirds hover",)]
        assert raw.execute("SELECT role FROM messages").fetchall() == [("user",)]  # nothing "interrupted"
        raw.close()
    finally:
        owner.stdin.close()
        owner.wait(30)
    h = History(db)  # the owner is gone: its reply so far is recovered now
    assert h.recovered == 1
    (reply,) = [m for m in h.messages(h.conversations()[0].id) if m.role == "assistant"]
    assert reply.content == "Hummingbirds hover" and reply.stats["finish_reason"] == "interrupted"
    h.close()


def test_a_database_that_is_only_locked_is_never_set_aside(tmp_path):
    db = tmp_path / "history.db"
    h = History(db)
    h.add_message(h.create("kept").id, "user", "precious")
    h.close()
    other = sqlite3.connect(db, isolation_level=None)  # e.g. a backup tool holding it
    other.execute("PRAGMA journal_mode = DELETE")
    other.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.raises(HistoryError, match=r"is locked .* try again"):
            History(db, timeout=0.2)
        assert sorted(p.name for p in tmp_path.iterdir() if "corrupt" in p.name) == []
    finally:
        other.execute("ROLLBACK")
        other.close()
    h = History(db)
    assert h.notice is None and h.messages(h.conversations()[0].id)[0].content == "precious"
    h.close()


def test_a_corrupt_database_is_still_set_aside(tmp_path):
    db = tmp_path / "history.db"
    db.write_bytes(b"not a database at all" * 100)
    h = History(db)
    assert h.notice and "could not be read" in h.notice
    assert [p.name for p in tmp_path.iterdir() if ".corrupt-" in p.name]
    h.close()


def test_the_history_and_its_folder_are_private_where_created(tmp_path):
    before = os.umask(0o022)
    try:
        h = History(tmp_path / "new" / "history.db")
        h.add_message(h.create().id, "user", "private")
    finally:
        os.umask(before)
    assert stat.S_IMODE((tmp_path / "new").stat().st_mode) == 0o700
    for f in (tmp_path / "new").iterdir():
        assert stat.S_IMODE(f.stat().st_mode) & 0o077 == 0, f
    h.close()


@pytest.mark.qt_log_level_fail("WARNING")
@pytest.mark.qt_log_ignore("propagateSizeHints")
def test_a_reply_is_saved_under_the_message_it_answers(qtbot, home):
    w = C.open_window(qtbot, None, wait=False)
    cid = w.conv_id
    first = w.history.add_message(cid, "user", "first")
    w.history.add_message(cid, "assistant", "one")
    asked = w.history.add_message(cid, "user", "Tell me about birds")
    w.render_conversation()
    req = C.start_fake_reply(w)
    w.flow.worker.text.emit(req, "Hummingbirds", C.step("Hummingbirds", 1))
    w.history.select(cid, first.id, descend=False)  # the leaf moves while the reply streams
    w.flow.worker.finished.emit(req, W.Reply("Hummingbirds", C.step("", 1, finish_reason="stop"), 0))
    qtbot.waitUntil(lambda: w.busy == "", timeout=2_000)
    (reply,) = [m for m in w.history.tree(cid)[0].values() if m.content == "Hummingbirds"]
    assert reply.parent_id == asked.id
