"""Conversation history: conversations and their messages in one SQLite file in the data folder.

Plain dataclasses come out; the UI puts thin Qt models over them. A database that cannot be
read is never deleted: it is renamed aside (`history.db.corrupt-<time>`), a fresh one is
created and `History.notice` says what happened and where the old file is.
"""
from __future__ import annotations

import json
import sqlite3
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from app.attachments import with_attachments
from app.paths import data_dir

FILENAME = "history.db"
SCHEMA_VERSION = 1
SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS conversations (
    id INTEGER PRIMARY KEY,
    title TEXT NOT NULL,
    system_prompt TEXT NOT NULL DEFAULT '',
    sampling TEXT NOT NULL DEFAULT '{}',      -- JSON: sampling parameters of engine/params.py
    created REAL NOT NULL,
    updated REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS messages (
    id INTEGER PRIMARY KEY,
    conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
    role TEXT NOT NULL CHECK (role IN ('user', 'assistant')),
    content TEXT NOT NULL,
    created REAL NOT NULL,
    stats TEXT NOT NULL DEFAULT '{}'          -- JSON: tokens/s, first token, finish reason
);
CREATE INDEX IF NOT EXISTS messages_by_conversation ON messages (conversation_id, id);
"""
# context policy and attachments (app/context_policy.py, app/attachments.py): tables of their own,
# created on every open (IF NOT EXISTS), so a database of any schema version gets them, no migration
CONTEXT_SCHEMA = """
CREATE TABLE IF NOT EXISTS chat_context (
    conversation_id INTEGER PRIMARY KEY REFERENCES conversations(id) ON DELETE CASCADE,
    policy TEXT NOT NULL                       -- one of app.context_policy.POLICIES
);
CREATE TABLE IF NOT EXISTS attachments (
    id INTEGER PRIMARY KEY,
    message_id INTEGER NOT NULL REFERENCES messages(id) ON DELETE CASCADE,
    name TEXT NOT NULL,
    kind TEXT NOT NULL,                        -- text, markdown, code, pdf
    text TEXT NOT NULL,                        -- what the model reads
    tokens INTEGER                             -- counted by the model it was attached for
);
CREATE INDEX IF NOT EXISTS attachments_by_message ON attachments (message_id, id);
"""
NEW_TITLE = "New chat"


class HistoryError(Exception):
    """The history database is from a newer Colibri or cannot be written."""


@dataclass
class Message:
    id: int
    conversation_id: int
    role: str  # "user" or "assistant"
    content: str
    created: float
    stats: dict[str, Any] = field(default_factory=dict)
    attachments: list[dict[str, Any]] = field(default_factory=list)  # {"name", "kind", "text", "tokens"}


@dataclass
class Conversation:
    id: int
    title: str
    system_prompt: str
    sampling: dict[str, Any]
    created: float
    updated: float


def _conversation(row: sqlite3.Row) -> Conversation:
    return Conversation(row["id"], row["title"], row["system_prompt"], json.loads(row["sampling"]),
                        row["created"], row["updated"])


def _message(row: sqlite3.Row) -> Message:
    return Message(row["id"], row["conversation_id"], row["role"], row["content"], row["created"],
                   json.loads(row["stats"]))


class History:
    def __init__(self, path: str | Path | None = None):
        self.path = Path(path) if path is not None else data_dir() / FILENAME
        self.notice: str | None = None  # set when a damaged database was set aside
        try:
            self.db = self._open()
        except sqlite3.DatabaseError as e:
            aside = self.path.with_name(f"{self.path.name}.corrupt-{time.strftime('%Y%m%d-%H%M%S')}")
            self.path.rename(aside)
            for suffix in ("-wal", "-shm", "-journal"):  # leftovers belong to the old file
                side = self.path.with_name(self.path.name + suffix)
                if side.exists():
                    side.rename(aside.with_name(aside.name + suffix))
            self.notice = (f"The conversation history could not be read ({e}). It was kept as {aside} "
                           f"and a new, empty history was started.")
            self.db = self._open()

    def _open(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path)
        db.row_factory = sqlite3.Row
        try:
            if db.execute("PRAGMA quick_check").fetchone()[0] != "ok":
                raise sqlite3.DatabaseError("integrity check failed")
            db.execute("PRAGMA foreign_keys = ON")
            db.executescript(SCHEMA)
            db.executescript(CONTEXT_SCHEMA)
            row = db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
            if row is None:
                db.execute("INSERT INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
                db.commit()
            elif int(row[0]) > SCHEMA_VERSION:
                db.close()
                raise HistoryError(f"{self.path}: history schema version {row[0]} is newer than this "
                                   f"Colibri reads ({SCHEMA_VERSION}); update Colibri")
        except BaseException:
            db.close()
            raise
        return db

    def close(self) -> None:
        self.db.close()

    # --- conversations -----------------------------------------------------------------------
    def conversations(self, search: str = "") -> list[Conversation]:
        """Newest first; `search` matches titles and message text (case-insensitive)."""
        if not search:
            rows = self.db.execute("SELECT * FROM conversations ORDER BY updated DESC, id DESC")
        else:
            like = "%" + search.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
            rows = self.db.execute(
                "SELECT * FROM conversations c WHERE c.title LIKE ?1 ESCAPE '\\' OR EXISTS "
                "(SELECT 1 FROM messages m WHERE m.conversation_id = c.id AND m.content LIKE ?1 ESCAPE '\\') "
                "ORDER BY updated DESC, id DESC", (like,))
        return [_conversation(r) for r in rows]

    def conversation(self, cid: int) -> Conversation:
        row = self.db.execute("SELECT * FROM conversations WHERE id = ?", (cid,)).fetchone()
        if row is None:
            raise KeyError(f"conversation {cid} does not exist")
        return _conversation(row)

    def create(self, title: str = NEW_TITLE, system_prompt: str = "",
               sampling: dict[str, Any] | None = None) -> Conversation:
        now = time.time()
        with self.db:
            cur = self.db.execute("INSERT INTO conversations (title, system_prompt, sampling, created, updated) "
                                  "VALUES (?, ?, ?, ?, ?)", (title, system_prompt, json.dumps(sampling or {}), now, now))
        return self.conversation(cur.lastrowid)

    def rename(self, cid: int, title: str) -> None:
        with self.db:
            self.db.execute("UPDATE conversations SET title = ? WHERE id = ?", (title.strip() or NEW_TITLE, cid))

    def set_options(self, cid: int, system_prompt: str, sampling: dict[str, Any]) -> None:
        with self.db:
            self.db.execute("UPDATE conversations SET system_prompt = ?, sampling = ? WHERE id = ?",
                            (system_prompt, json.dumps(sampling), cid))

    def delete(self, cid: int) -> None:
        with self.db:
            self.db.execute("DELETE FROM conversations WHERE id = ?", (cid,))

    # --- messages ----------------------------------------------------------------------------
    def messages(self, cid: int) -> list[Message]:
        rows = self.db.execute("SELECT * FROM messages WHERE conversation_id = ? ORDER BY id", (cid,))
        return self._with_attachments(cid, [_message(r) for r in rows])

    def add_message(self, cid: int, role: str, content: str, stats: dict[str, Any] | None = None,
                    attachments: list[dict[str, Any]] | None = None) -> Message:
        now = time.time()
        with self.db:
            cur = self.db.execute("INSERT INTO messages (conversation_id, role, content, created, stats) "
                                  "VALUES (?, ?, ?, ?, ?)", (cid, role, content, now, json.dumps(stats or {})))
            self._add_attachments(cur.lastrowid, attachments)
            self.db.execute("UPDATE conversations SET updated = ? WHERE id = ?", (now, cid))
        return Message(cur.lastrowid, cid, role, content, now, stats or {}, attachments=list(attachments or []))

    # --- attachments and the context policy (app/attachments.py, app/context_policy.py) --------
    def _with_attachments(self, cid: int, messages: list[Message]) -> list[Message]:
        """Fill each message's `attachments` (one query for the conversation)."""
        files: dict[int, list[dict[str, Any]]] = {}
        for r in self.db.execute("SELECT a.* FROM attachments a JOIN messages m ON m.id = a.message_id "
                                 "WHERE m.conversation_id = ? ORDER BY a.id", (cid,)):
            files.setdefault(r["message_id"], []).append(
                {"name": r["name"], "kind": r["kind"], "text": r["text"], "tokens": r["tokens"]})
        for m in messages:
            m.attachments = files.get(m.id, [])
        return messages

    def _add_attachments(self, message_id: int, attachments: list[dict[str, Any]] | None) -> None:
        """Inside add_message's transaction: the files of a new message."""
        for a in attachments or []:
            self.db.execute("INSERT INTO attachments (message_id, name, kind, text, tokens) VALUES (?, ?, ?, ?, ?)",
                            (message_id, a["name"], a["kind"], a["text"], a.get("tokens")))

    def context_policy(self, cid: int) -> str:
        """The chat's context policy (app.context_policy); the default for a chat that never chose."""
        from app.context_policy import DEFAULT_POLICY
        row = self.db.execute("SELECT policy FROM chat_context WHERE conversation_id = ?", (cid,)).fetchone()
        return row["policy"] if row is not None else DEFAULT_POLICY

    def set_context_policy(self, cid: int, policy: str) -> None:
        from app.context_policy import POLICIES
        if policy not in POLICIES:
            raise ValueError(f"context policy {policy!r}: expected one of {', '.join(POLICIES)}")
        with self.db:
            self.db.execute("INSERT OR REPLACE INTO chat_context VALUES (?, ?)", (cid, policy))

    def delete_from(self, cid: int, message_id: int) -> None:
        """Delete a message and every later one of its conversation (regenerate, edit and resend)."""
        with self.db:
            self.db.execute("DELETE FROM messages WHERE conversation_id = ? AND id >= ?", (cid, message_id))

    # --- export ------------------------------------------------------------------------------
    def export_json(self, cid: int) -> str:
        conv = self.conversation(cid)
        doc = {"format": "colibri-conversation", "version": 1, **asdict(conv),
               "messages": [{k: v for k, v in asdict(m).items() if k != "conversation_id"}
                            for m in self.messages(cid)]}
        return json.dumps(doc, indent=2, ensure_ascii=False)

    def export_markdown(self, cid: int) -> str:
        conv = self.conversation(cid)
        parts = [f"# {conv.title}\n"]
        if conv.system_prompt:
            parts.append(f"**System:** {conv.system_prompt}\n")
        for m in self.messages(cid):
            parts.append(f"## {'User' if m.role == 'user' else 'Assistant'}\n\n{m.content}\n")
        return "\n".join(parts)


def chat_messages(conv: Conversation, messages: list[Message]) -> list[dict[str, str]]:
    """The engine's chat prompt: the system prompt, then every message in order."""
    out = [{"role": "system", "content": conv.system_prompt}] if conv.system_prompt.strip() else []
    return out + [{"role": m.role, "content": with_attachments(m.content, m.attachments) if m.attachments
                   else m.content} for m in messages]
