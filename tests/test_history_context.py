"""The history keeps each chat's context policy and each message's attachments (additive tables)."""
import sqlite3

import pytest

from app.history import History, chat_messages


def test_policy_and_attachments_round_trip(tmp_path):
    h = History(tmp_path / "h.db")
    c = h.create(system_prompt="be brief")
    assert h.context_policy(c.id) == "drop_oldest"
    h.set_context_policy(c.id, "keep_first")
    with pytest.raises(ValueError, match="context policy 'all'"):
        h.set_context_policy(c.id, "all")
    files = [{"name": "a.md", "kind": "markdown", "text": "# A", "tokens": 3}]
    m = h.add_message(c.id, "user", "look", attachments=files)
    h.add_message(c.id, "assistant", "ok")
    h.close()
    h = History(tmp_path / "h.db")
    assert h.context_policy(c.id) == "keep_first"
    got = h.messages(c.id)
    assert got[0].attachments == files and got[1].attachments == [] and got[0].id == m.id
    sent = chat_messages(h.conversation(c.id), got)
    assert sent[1] == {"role": "user", "content": "look\n\nAttached file: a.md\n```\n# A\n```"}
    assert sent[2] == {"role": "assistant", "content": "ok"}
    h.delete_from(c.id, m.id)  # the attachments go with their message
    assert h.db.execute("SELECT COUNT(*) FROM attachments").fetchone()[0] == 0
    h.delete(c.id)
    assert h.db.execute("SELECT COUNT(*) FROM chat_context").fetchone()[0] == 0


def test_a_database_from_before_gets_the_new_tables(tmp_path):
    db = sqlite3.connect(tmp_path / "old.db")
    db.executescript("""
        CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
        INSERT INTO meta VALUES ('schema_version', '1');
        CREATE TABLE conversations (id INTEGER PRIMARY KEY, title TEXT NOT NULL, system_prompt TEXT NOT NULL
            DEFAULT '', sampling TEXT NOT NULL DEFAULT '{}', created REAL NOT NULL, updated REAL NOT NULL);
        CREATE TABLE messages (id INTEGER PRIMARY KEY, conversation_id INTEGER NOT NULL REFERENCES
            conversations(id) ON DELETE CASCADE, role TEXT NOT NULL, content TEXT NOT NULL, created REAL NOT NULL,
            stats TEXT NOT NULL DEFAULT '{}');
        INSERT INTO conversations VALUES (1, 'old', '', '{}', 0, 0);
        INSERT INTO messages VALUES (1, 1, 'user', 'hi', 0, '{}');""")
    db.commit()
    db.close()
    h = History(tmp_path / "old.db")
    assert h.notice is None and h.context_policy(1) == "drop_oldest"
    assert [(m.content, m.attachments) for m in h.messages(1)] == [("hi", [])]
