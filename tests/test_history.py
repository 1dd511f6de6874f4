"""Conversation history in real SQLite: persistence across reopen, search, edits, export, corruption."""
from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

import pytest

from app import export
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
    md = export.to_markdown(h, c.id)
    assert md.startswith("# Code\n") and "**System:** You write Python." in md
    assert "## User\n\nAdd two numbers" in md and "```python\ndef add(a, b):" in md
    doc = json.loads(export.to_json(h, c.id))
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


# schema 1, as Colibri wrote it before message versions (app/history.py at SCHEMA_VERSION = 1)
V1_SCHEMA = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE conversations (id INTEGER PRIMARY KEY, title TEXT NOT NULL, system_prompt TEXT NOT NULL DEFAULT '',
    sampling TEXT NOT NULL DEFAULT '{}', created REAL NOT NULL, updated REAL NOT NULL);
CREATE TABLE messages (id INTEGER PRIMARY KEY,
    conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
    role TEXT NOT NULL CHECK (role IN ('user', 'assistant')), content TEXT NOT NULL, created REAL NOT NULL,
    stats TEXT NOT NULL DEFAULT '{}');
CREATE INDEX messages_by_conversation ON messages (conversation_id, id);
INSERT INTO meta VALUES ('schema_version', '1');
INSERT INTO conversations VALUES (1, 'Old chat', 'Be terse.', '{"temperature": 0.2}', 1.0, 2.0);
INSERT INTO conversations VALUES (2, 'Interleaved', '', '{}', 1.0, 2.0);
INSERT INTO conversations VALUES (3, 'Empty', '', '{}', 1.0, 2.0);
INSERT INTO messages VALUES (1, 1, 'user', 'Hello', 1.0, '{}');
INSERT INTO messages VALUES (2, 2, 'user', 'Other', 1.0, '{}');
INSERT INTO messages VALUES (3, 1, 'assistant', 'Hi!', 1.1, '{"generated_tokens": 2}');
INSERT INTO messages VALUES (4, 1, 'user', 'Bye', 1.2, '{}');
INSERT INTO messages VALUES (5, 2, 'assistant', 'Reply', 1.3, '{}');
"""


def test_a_schema_1_database_is_migrated_keeping_every_message_in_order(db):
    old = sqlite3.connect(db)
    old.executescript(V1_SCHEMA)
    old.commit()
    old.close()
    h = History(db)
    assert h.db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()[0] == "2"
    msgs = h.messages(1)
    assert [(m.id, m.role, m.content, m.parent_id) for m in msgs] == [
        (1, "user", "Hello", None), (3, "assistant", "Hi!", 1), (4, "user", "Bye", 3)]
    assert msgs[1].stats == {"generated_tokens": 2} and msgs[1].reasoning == "" and msgs[1].facts == {}
    assert [m.content for m in h.messages(2)] == ["Other", "Reply"] and h.messages(3) == []
    assert h.conversation(1).leaf_id == 4 and h.conversation(1).thinking is None
    h.add_message(1, "assistant", "Bye!")  # a migrated chat goes on where it was
    h.close()
    h = History(db)  # and opens again as schema 2, without migrating twice
    assert [m.content for m in h.messages(1)] == ["Hello", "Hi!", "Bye", "Bye!"]


def test_regenerated_replies_are_versions_and_an_edit_starts_a_branch(db):
    h = History(db)
    c = h.create()
    q = h.add_message(c.id, "user", "Name a bird")
    a1 = h.add_message(c.id, "assistant", "Robin")
    a2 = h.add_message(c.id, "assistant", "Wren", parent=q.id)  # Regenerate: a sibling of a1
    assert [m.content for m in h.messages(c.id)] == ["Name a bird", "Wren"]
    assert [(m.version, m.versions) for m in h.messages(c.id)] == [(1, 1), (2, 2)]
    assert [m.id for m in h.versions(a1.id)] == [a1.id, a2.id]
    h.add_message(c.id, "user", "Why?")
    h.select(c.id, a1.id)  # ‹ 1/2: the older reply, and the path below it (nothing yet)
    assert [m.content for m in h.messages(c.id)] == ["Name a bird", "Robin"]
    h.select(c.id, a2.id)  # back: down to the newest message below it
    assert [m.content for m in h.messages(c.id)] == ["Name a bird", "Wren", "Why?"]
    q2 = h.add_message(c.id, "user", "Name a fish", parent=None)  # editing the first message: a branch
    h.add_message(c.id, "assistant", "Trout")
    assert [(m.content, m.version, m.versions) for m in h.messages(c.id)] == [("Name a fish", 2, 2),
                                                                              ("Trout", 1, 1)]
    h.select(c.id, q.id)  # the first branch is all still there
    assert [m.content for m in h.messages(c.id)] == ["Name a bird", "Wren", "Why?"]
    h.delete_from(c.id, q2.id)  # a branch goes with everything below it
    assert h.db.execute("SELECT COUNT(*) FROM messages WHERE conversation_id = ?", (c.id,)).fetchone()[0] == 4
    assert [m.content for m in h.messages(c.id)] == ["Name a bird", "Wren", "Why?"]


def test_thinking_and_facts_are_kept_and_left_out_of_the_content_sent_back(db):
    h = History(db)
    c = h.create(system_prompt="Think first.")
    h.set_thinking(c.id, False)
    assert h.conversation(c.id).thinking is False
    h.add_message(c.id, "user", "2+2?")
    facts = {"model": "qwen3-tiny", "sampling": {"temperature": 0.6, "top_p": 0.95}, "thinking": True}
    m = h.add_message(c.id, "assistant", "4", {"generated_tokens": 9, "finish_reason": "length",
                                               "thinking_tokens": 7}, reasoning="2 and 2 make 4.", facts=facts)
    h.update_message(m.id, "4.", "2 and 2 make 4.", m.stats | {"generated_tokens": 10, "finish_reason": "stop"})
    h.close()
    h = History(db)
    again = h.messages(c.id)[-1]
    assert (again.content, again.reasoning, again.facts) == ("4.", "2 and 2 make 4.", facts)
    assert again.stats["generated_tokens"] == 10
    sent = chat_messages(h.conversation(c.id), h.messages(c.id))
    assert sent[-1] == {"role": "assistant", "content": "4.", "reasoning_content": "2 and 2 make 4.",
                        "thinking": "2 and 2 make 4."}
    assert sent[1] == {"role": "user", "content": "2+2?"}
    md = export.to_markdown(h, c.id)
    assert "<details><summary>Thinking (7 tokens)</summary>\n\n2 and 2 make 4.\n\n</details>\n\n4." in md
    assert "*qwen3-tiny · thinking on · temperature 0.6 · top_p 0.95 · 10 tokens at 0.0 tok/s · 7 of them " \
           "thinking*" in md
    doc = json.loads(export.to_json(h, c.id))
    assert doc["version"] == 2 and doc["thinking"] is False and doc["path"] == [mm.id for mm in h.messages(c.id)]
    assert doc["messages"][-1]["facts"] == facts and doc["messages"][-1]["reasoning"] == "2 and 2 make 4."


def test_exports_hold_every_version_in_json_and_the_shown_one_in_markdown(db):
    h = History(db)
    c = h.create("Birds")
    q = h.add_message(c.id, "user", "Name a bird")
    h.add_message(c.id, "assistant", "Robin")
    h.add_message(c.id, "assistant", "Wren", parent=q.id)
    md = export.to_markdown(h, c.id)
    assert "## Assistant (version 2 of 2)\n\nWren" in md and "Robin" not in md
    doc = json.loads(export.to_json(h, c.id))
    assert [(m["content"], m["parent_id"]) for m in doc["messages"]] == [("Name a bird", None), ("Robin", q.id),
                                                                         ("Wren", q.id)]
    assert len(doc["path"]) == 2


def test_a_database_written_by_schema_1_colibri_opens_with_its_chats_whole(db):
    """tests/fixtures/history_v1.db was written by the schema-1 History itself (tests/make_history_v1.py)."""
    shutil.copy(Path(__file__).parent / "fixtures" / "history_v1.db", db)
    h = History(db)
    birds, fish = sorted(h.conversations(), key=lambda c: c.title)
    assert (birds.title, birds.system_prompt, birds.sampling) == ("Birds", "Be brief.", {"temperature": 0.3})
    assert [(m.role, m.content) for m in h.messages(birds.id)] == [
        ("user", "Name a bird"), ("assistant", "Robin"), ("user", "Another?"), ("assistant", "Wren")]
    assert [m.content for m in h.messages(fish.id)] == ["Name a fish", "Trout"]
    assert h.messages(birds.id)[1].stats == {"generated_tokens": 2, "finish_reason": "stop"}
    h.add_message(birds.id, "assistant", "Sparrow", parent=h.messages(birds.id)[2].id)  # a version, at once
    assert [(m.content, m.version, m.versions) for m in h.messages(birds.id)][-1] == ("Sparrow", 2, 2)


def test_a_partial_reply_left_by_a_killed_app_opens_as_an_interrupted_reply(db):
    h = History(db)
    c = h.create()
    q = h.add_message(c.id, "user", "Tell me a story")
    h.save_partial(c.id, q.id, "Once upon", "", {"generated_tokens": 2}, {"model": "m"})
    h.save_partial(c.id, q.id, "Once upon a time", "plot", {"generated_tokens": 4}, {"model": "m"})  # replaces it
    h.db.close()  # as a kill leaves it: no finish
    h = History(db)
    assert h.recovered == 1
    user, reply = h.messages(c.id)
    assert (user.id, reply.role, reply.parent_id) == (q.id, "assistant", q.id)
    assert (reply.content, reply.reasoning, reply.facts) == ("Once upon a time", "plot", {"model": "m"})
    assert reply.stats == {"generated_tokens": 4, "finish_reason": "interrupted"}
    h.close()
    assert History(db).recovered == 0  # recovered once, not again


def test_a_finished_reply_replaces_its_partial_copy_and_a_resumed_one_keeps_its_place(db):
    h = History(db)
    c = h.create()
    h.add_message(c.id, "user", "Hi")
    h.save_partial(c.id, None, "Hel", "", {}, {})
    h.add_message(c.id, "assistant", "Hello!")  # the same commit drops the partial copy
    old = h.add_message(c.id, "user", "More")
    cut = h.add_message(c.id, "assistant", "One, two", {"finish_reason": "length", "generated_tokens": 2})
    assert old.id < cut.id
    h.save_partial(c.id, None, "One, two, three", "", {"generated_tokens": 3}, {}, resumes=cut.id)  # Continue
    h.db.close()
    h = History(db)
    msgs = h.messages(c.id)
    assert [m.content for m in msgs] == ["Hi", "Hello!", "More", "One, two, three"] and msgs[-1].id == cut.id
    assert msgs[-1].stats == {"generated_tokens": 3, "finish_reason": "interrupted"}


def test_exports_list_attachments_with_their_text_folded(db):
    h = History(db)
    c = h.create(title="files")
    h.add_message(c.id, "user", "Read this", attachments=[
        {"name": "notes.md", "kind": "markdown", "text": "# Title\n```code```", "tokens": 12}])
    h.add_message(c.id, "assistant", "Done.")
    md = export.to_markdown(h, c.id)
    assert "<details><summary>Attached: notes.md (Markdown, 12 tokens)</summary>" in md
    assert "````\n# Title\n```code```\n````" in md  # a fence longer than any run of backticks inside
    assert md.index("Read this") < md.index("notes.md") < md.index("Done.")
    doc = json.loads(export.to_json(h, c.id))
    assert doc["messages"][0]["attachments"] == [{"name": "notes.md", "kind": "markdown",
                                                  "text": "# Title\n```code```", "tokens": 12}]
    assert doc["messages"][1]["attachments"] == []
