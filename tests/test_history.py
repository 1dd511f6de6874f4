"""Conversation history in real SQLite: persistence across reopen, search, edits, export, corruption."""
from __future__ import annotations

import json
import sqlite3

import pytest

from app.history import NEW_TITLE, History, HistoryError, chat_messages


@pytest.fixture
def db(tmp_path):
    return tmp_path / "history.db"


def test_conversations_and_messages_survive_a_restart(db):
    h = History(db)
    a = h.create(system_prompt="Be terse.", sampling={"temperature": 0.2})
    h.add_message(a.id, "user", "Hello")
    h.add_message(a.id, "assistant", "Hi!", {"decode_tok_s": 12.5})
    b = h.create()
    h.rename(b.id, "Second")
    h.close()
    h = History(db)
    assert h.notice is None
    convs = h.conversations()
    assert [c.title for c in convs] == ["Second", NEW_TITLE]  # newest first
    again = h.conversation(a.id)
    assert (again.system_prompt, again.sampling) == ("Be terse.", {"temperature": 0.2})
    msgs = h.messages(a.id)
    assert [(m.role, m.content) for m in msgs] == [("user", "Hello"), ("assistant", "Hi!")]
    assert msgs[1].stats == {"decode_tok_s": 12.5}
    assert chat_messages(again, msgs) == [{"role": "system", "content": "Be terse."},
                                          {"role": "user", "content": "Hello"},
                                          {"role": "assistant", "content": "Hi!"}]


def test_search_matches_titles_and_message_text_and_escapes_wildcards(db):
    h = History(db)
    a, b = h.create("Rust lifetimes"), h.create("Cooking")
    h.add_message(b.id, "user", "How long to boil an egg? 100% sure")
    assert [c.id for c in h.conversations("rust")] == [a.id]
    assert [c.id for c in h.conversations("EGG")] == [b.id]
    assert [c.id for c in h.conversations("100%")] == [b.id]
    assert h.conversations("_") == []


def test_delete_from_removes_a_message_and_everything_after(db):
    h = History(db)
    c = h.create()
    ids = [h.add_message(c.id, r, t).id for r, t in [("user", "1"), ("assistant", "2"), ("user", "3"),
                                                     ("assistant", "4")]]
    h.delete_from(c.id, ids[2])
    assert [m.content for m in h.messages(c.id)] == ["1", "2"]
    h.delete(c.id)
    assert h.conversations() == []
    assert h.db.execute("SELECT COUNT(*) FROM messages").fetchone()[0] == 0  # cascaded
    with pytest.raises(KeyError, match=f"conversation {c.id} does not exist"):
        h.conversation(c.id)


def test_export_markdown_and_json(db):
    h = History(db)
    c = h.create("Code", system_prompt="You write Python.")
    h.add_message(c.id, "user", "Add two numbers")
    h.add_message(c.id, "assistant", "```python\ndef add(a, b):\n    return a + b\n```")
    md = h.export_markdown(c.id)
    assert md.startswith("# Code\n") and "**System:** You write Python." in md
    assert "## User\n\nAdd two numbers" in md and "```python\ndef add(a, b):" in md
    doc = json.loads(h.export_json(c.id))
    assert doc["format"] == "colibri-conversation" and doc["title"] == "Code"
    assert [m["role"] for m in doc["messages"]] == ["user", "assistant"]


def test_a_corrupt_database_is_set_aside_with_a_notice(db):
    db.write_bytes(b"this is not a database" * 100)
    h = History(db)
    assert h.notice is not None and "could not be read" in h.notice
    aside = [p for p in db.parent.iterdir() if p.name.startswith("history.db.corrupt-")]
    assert len(aside) == 1 and aside[0].read_bytes().startswith(b"this is not")  # nothing lost
    assert str(aside[0]) in h.notice
    c = h.create()  # the fresh database works
    assert h.conversations()[0].id == c.id


def test_a_newer_schema_is_refused_not_overwritten(db):
    History(db).close()
    con = sqlite3.connect(db)
    con.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    con.commit()
    con.close()
    with pytest.raises(HistoryError, match="schema version 99 is newer"):
        History(db)
    assert db.exists()
