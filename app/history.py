"""Conversation history: conversations and their messages in one SQLite file in the data folder.

Messages form a tree: each has a parent (the message it answers or follows), so a regenerated
reply is a sibling of the earlier ones (its versions, browsable) and an edited user message
starts a branch. A conversation's `leaf_id` ends the path that is shown and sent to the model.
Each reply keeps its thinking apart from its answer and the facts of what wrote it (model,
sampling). Every write is one committed transaction: a process killed mid-reply loses at most
that reply. A reply being written is saved apart (`save_partial`, about once a second) and, when
the app died before it ended, becomes an "interrupted" reply the next time the history opens. Plain dataclasses come out; the UI puts thin Qt models over them. A database that cannot be
read is never deleted: it is renamed aside (`history.db.corrupt-<time>`), a fresh one is
created and `History.notice` says what happened and where the old file is. One process owns a
history at a time (a lock file beside it): a second Colibri is refused with a reason, so partial
replies are recovered only once their owner is gone, and a database that is merely locked by
another program is never mistaken for a corrupt one.
"""
from __future__ import annotations

import json
import os
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.attachments import with_attachments
from app.paths import data_dir

FILENAME = "history.db"
SCHEMA_VERSION = 2
SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS conversations (
    id INTEGER PRIMARY KEY,
    title TEXT NOT NULL,
    system_prompt TEXT NOT NULL DEFAULT '',
    sampling TEXT NOT NULL DEFAULT '{}',      -- JSON: sampling parameters of engine/params.py
    created REAL NOT NULL,
    updated REAL NOT NULL,
    leaf_id INTEGER,                          -- the last message of the path shown (NULL: empty)
    thinking INTEGER                          -- enable_thinking: 1 on, 0 off, NULL the template's default
);
CREATE TABLE IF NOT EXISTS messages (
    id INTEGER PRIMARY KEY,
    conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
    role TEXT NOT NULL CHECK (role IN ('user', 'assistant')),
    content TEXT NOT NULL,
    created REAL NOT NULL,
    stats TEXT NOT NULL DEFAULT '{}',         -- JSON: tokens/s, first token, finish reason
    parent_id INTEGER REFERENCES messages(id) ON DELETE CASCADE,  -- NULL: a first message
    reasoning TEXT NOT NULL DEFAULT '',       -- a reply's thinking, apart from its answer
    facts TEXT NOT NULL DEFAULT '{}'          -- JSON: the model and sampling that wrote a reply
);
CREATE INDEX IF NOT EXISTS messages_by_conversation ON messages (conversation_id, id);
CREATE INDEX IF NOT EXISTS messages_by_parent ON messages (parent_id);
"""
# context policy and attachments (app/chat_session.py, app/attachments.py): tables of their own,
# created on every open (IF NOT EXISTS), so a database of any schema version gets them, no migration
CONTEXT_SCHEMA = """
CREATE TABLE IF NOT EXISTS chat_context (
    conversation_id INTEGER PRIMARY KEY REFERENCES conversations(id) ON DELETE CASCADE,
    policy TEXT NOT NULL                       -- one of app.chat_session.POLICIES
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
CREATE TABLE IF NOT EXISTS partial_replies (  -- a reply being written, saved about once a second
    conversation_id INTEGER PRIMARY KEY REFERENCES conversations(id) ON DELETE CASCADE,
    parent_id INTEGER,                         -- the message it answers (NULL: a first message)
    resumes INTEGER,                           -- the reply Continue resumes (content is all of it), or NULL
    content TEXT NOT NULL,
    reasoning TEXT NOT NULL,
    stats TEXT NOT NULL,
    facts TEXT NOT NULL
);
"""
# schema 1 -> 2: the linear order becomes parent links, the last message the leaf
MIGRATE_1_2 = """
ALTER TABLE conversations ADD COLUMN leaf_id INTEGER;
ALTER TABLE conversations ADD COLUMN thinking INTEGER;
ALTER TABLE messages ADD COLUMN parent_id INTEGER REFERENCES messages(id) ON DELETE CASCADE;
ALTER TABLE messages ADD COLUMN reasoning TEXT NOT NULL DEFAULT '';
ALTER TABLE messages ADD COLUMN facts TEXT NOT NULL DEFAULT '{}';
UPDATE messages SET parent_id = (SELECT MAX(p.id) FROM messages p
                                 WHERE p.conversation_id = messages.conversation_id AND p.id < messages.id);
UPDATE conversations SET leaf_id = (SELECT MAX(m.id) FROM messages m WHERE m.conversation_id = conversations.id);
CREATE INDEX IF NOT EXISTS messages_by_parent ON messages (parent_id);
UPDATE meta SET value = '2' WHERE key = 'schema_version';
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
    parent_id: int | None = None
    reasoning: str = ""  # the thinking of a reasoning model's reply (never sent back as content)
    facts: dict[str, Any] = field(default_factory=dict)  # model, sampling, thinking switch of a reply
    version: int = 1  # this message's place among its siblings (1-based) ...
    versions: int = 1  # ... and how many there are: regenerated replies, edited messages
    attachments: list[dict[str, Any]] = field(default_factory=list)  # {"name", "kind", "text", "tokens"}


@dataclass
class Conversation:
    id: int
    title: str
    system_prompt: str
    sampling: dict[str, Any]
    created: float
    updated: float
    leaf_id: int | None = None
    thinking: bool | None = None  # enable_thinking for this chat; None: what the template does


def _conversation(row: sqlite3.Row) -> Conversation:
    thinking = None if row["thinking"] is None else bool(row["thinking"])
    return Conversation(row["id"], row["title"], row["system_prompt"], json.loads(row["sampling"]),
                        row["created"], row["updated"], row["leaf_id"], thinking)


def _message(row: sqlite3.Row) -> Message:
    return Message(row["id"], row["conversation_id"], row["role"], row["content"], row["created"],
                   json.loads(row["stats"]), row["parent_id"], row["reasoning"], json.loads(row["facts"]))


_HELD: dict[Path, list] = {}  # lock file -> [its open file, the History objects of this process using it]


def _own(path: Path) -> Path:
    """Hold `path` (a lock file) for this process: HistoryError naming the holder when another
    process holds it. The OS lets go when the process dies, however it dies; within one process
    the history is one owner's (a reopening after a simulated kill reuses the hold)."""
    path = path.resolve()
    if path in _HELD:
        _HELD[path][1] += 1
        return path
    f = os.fdopen(os.open(path, os.O_RDWR | os.O_CREAT, 0o600), "r+")
    try:
        if os.name == "nt":
            import msvcrt
            msvcrt.locking(f.fileno(), msvcrt.LK_NBLCK, 1)
        else:
            import fcntl
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        try:
            holder = f.read().strip()
        except OSError:  # (Windows: the holder's locked byte cannot be read)
            holder = ""
        f.close()
        raise HistoryError(f"another Colibri (process {holder or '?'}) has this history open ({path.parent}); "
                           f"close it first, or give each its own data folder (COLIBRI_HOME)") from None
    f.seek(0)
    f.truncate()
    f.write(str(os.getpid()))
    f.flush()
    _HELD[path] = [f, 1]
    return path


def _let_go(path: Path) -> None:
    held = _HELD.get(path)
    if held is not None:
        held[1] -= 1
        if held[1] == 0:
            del _HELD[path]
            held[0].close()


class History:
    def __init__(self, path: str | Path | None = None, timeout: float = 5.0):
        self.path = Path(path) if path is not None else data_dir() / FILENAME
        self.notice: str | None = None  # set when a damaged database was set aside
        self.timeout = timeout  # how long an open waits for another program's lock on the database
        if not self.path.parent.exists():
            self.path.parent.mkdir(parents=True, mode=0o700)
        self._lock = _own(self.path.with_name(self.path.name + ".lock"))
        if not self.path.exists():  # private from the start (SQLite gives its -wal and -shm the same mode)
            os.close(os.open(self.path, os.O_CREAT | os.O_WRONLY, 0o600))
        try:
            self.db = self._open_or_set_aside()
        except BaseException:
            _let_go(self._lock)
            raise
        self.recovered = self._recover_partials()  # replies a killed app was writing, now "interrupted"

    def _open_or_set_aside(self) -> sqlite3.Connection:
        try:
            return self._open()
        except sqlite3.OperationalError as e:  # locked, busy, unreadable: the file is not at fault
            raise HistoryError(f"{self.path} is locked or cannot be read ({e}); it was left as it is: close "
                               f"the program that holds it and try again") from None
        except sqlite3.DatabaseError as e:
            aside = self.path.with_name(f"{self.path.name}.corrupt-{time.strftime('%Y%m%d-%H%M%S')}")
            self.path.rename(aside)
            for suffix in ("-wal", "-shm", "-journal"):  # leftovers belong to the old file
                side = self.path.with_name(self.path.name + suffix)
                if side.exists():
                    side.rename(aside.with_name(aside.name + suffix))
            self.notice = (f"The conversation history could not be read ({e}). It was kept as {aside} "
                           f"and a new, empty history was started.")
            return self._open()

    def _open(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, timeout=self.timeout)
        db.row_factory = sqlite3.Row
        try:
            if db.execute("PRAGMA quick_check").fetchone()[0] != "ok":
                raise sqlite3.DatabaseError("integrity check failed")
            db.execute("PRAGMA foreign_keys = ON")
            # write-ahead log, synced at checkpoints: a commit costs a tiny fraction of an fsync on
            # the GUI thread (the reply saved every second), and survives the app being
            # killed at any point; a power cut may lose the last commits, never the file
            db.execute("PRAGMA journal_mode = WAL")
            db.execute("PRAGMA synchronous = NORMAL")
            fresh = db.execute("SELECT name FROM sqlite_master WHERE name = 'meta'").fetchone() is None
            if fresh:
                db.executescript(SCHEMA)
                db.execute("INSERT INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
                db.commit()
            row = db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
            version = int(row[0]) if row is not None else 1
            if version > SCHEMA_VERSION:
                raise HistoryError(f"{self.path}: history schema version {version} is newer than this "
                                   f"Colibri reads ({SCHEMA_VERSION}); update Colibri")
            if version == 1:
                self._migrate_1_2(db)
            db.executescript(CONTEXT_SCHEMA)
        except BaseException:
            db.close()
            raise
        return db

    def _migrate_1_2(self, db: sqlite3.Connection) -> None:
        """One transaction: a database killed mid-migration is still schema 1 when reopened."""
        db.commit()
        try:
            db.execute("BEGIN")
            db.execute("INSERT OR IGNORE INTO meta VALUES ('schema_version', '1')")
            for statement in MIGRATE_1_2.split(";"):
                if statement.strip():
                    db.execute(statement)
            db.execute("COMMIT")
        except sqlite3.Error as e:
            db.execute("ROLLBACK")
            raise HistoryError(f"{self.path}: moving the history to schema {SCHEMA_VERSION} failed: {e}") from e

    def close(self) -> None:
        self.db.close()
        if self._lock is not None:
            _let_go(self._lock)
            self._lock = None

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

    def set_thinking(self, cid: int, thinking: bool | None) -> None:
        with self.db:
            self.db.execute("UPDATE conversations SET thinking = ? WHERE id = ?",
                            (None if thinking is None else int(thinking), cid))

    # --- messages ----------------------------------------------------------------------------
    def tree(self, cid: int) -> tuple[dict[int, Message], dict[int | None, list[Message]]]:
        """Every message of a conversation by id, and the children of each (None: the first ones)."""
        rows = self.db.execute("SELECT * FROM messages WHERE conversation_id = ? ORDER BY id", (cid,))
        by_id, children = {}, {}
        for r in rows:
            m = _message(r)
            by_id[m.id] = m
            children.setdefault(m.parent_id, []).append(m)
        for kids in children.values():
            for i, m in enumerate(kids):
                m.version, m.versions = i + 1, len(kids)
        return by_id, children

    def messages(self, cid: int, leaf: int | None = None) -> list[Message]:
        """The path from the first message to `leaf` (the conversation's current leaf by default),
        each with its version number among its siblings."""
        by_id, _ = self.tree(cid)
        at = self.conversation(cid).leaf_id if leaf is None else leaf
        path = []
        while at is not None and at in by_id:
            path.append(by_id[at])
            at = by_id[at].parent_id
        return self.attach_files(cid, path[::-1])

    def message(self, message_id: int) -> Message:
        row = self.db.execute("SELECT * FROM messages WHERE id = ?", (message_id,)).fetchone()
        if row is None:
            raise KeyError(f"message {message_id} does not exist")
        return _message(row)

    def versions(self, message_id: int) -> list[Message]:
        """The message and its siblings (the same parent), oldest first: a reply's regenerations,
        a user message's edits."""
        m = self.message(message_id)
        _, children = self.tree(m.conversation_id)
        return children[m.parent_id]

    def add_message(self, cid: int, role: str, content: str, stats: dict[str, Any] | None = None,
                    reasoning: str = "", facts: dict[str, Any] | None = None,
                    parent: int | None | str = "leaf", attachments: list[dict[str, Any]] | None = None) -> Message:
        """Append a message under `parent` (by default the current leaf; None: a first message) and
        make it the leaf. A parent that already has children gets one more version."""
        now = time.time()
        with self.db:
            if parent == "leaf":
                parent = self.conversation(cid).leaf_id
            cur = self.db.execute("INSERT INTO messages (conversation_id, role, content, created, stats, parent_id, "
                                  "reasoning, facts) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                                  (cid, role, content, now, json.dumps(stats or {}), parent, reasoning,
                                   json.dumps(facts or {})))
            self._add_attachments(cur.lastrowid, attachments)
            if role == "assistant":  # the reply is whole now: its partial copy goes in the same commit
                self.db.execute("DELETE FROM partial_replies WHERE conversation_id = ?", (cid,))
            self.db.execute("UPDATE conversations SET updated = ?, leaf_id = ? WHERE id = ?",
                            (now, cur.lastrowid, cid))
        m = self.message(cur.lastrowid)
        m.attachments = list(attachments or [])
        return m

    def update_message(self, message_id: int, content: str, reasoning: str,
                       stats: dict[str, Any], facts: dict[str, Any] | None = None) -> Message:
        """A reply resumed by Continue: its text, thinking and figures replaced in place."""
        m = self.message(message_id)
        with self.db:
            self.db.execute("UPDATE messages SET content = ?, reasoning = ?, stats = ?, facts = ? WHERE id = ?",
                            (content, reasoning, json.dumps(stats), json.dumps(m.facts if facts is None else facts),
                             message_id))
            self.db.execute("UPDATE conversations SET updated = ? WHERE id = ?", (time.time(), m.conversation_id))
            self.db.execute("DELETE FROM partial_replies WHERE conversation_id = ?", (m.conversation_id,))
        return self.message(message_id)

    # --- a reply being written (durability: a kill loses at most its last second) --------------
    def save_partial(self, cid: int, parent: int | None, content: str, reasoning: str, stats: dict[str, Any],
                     facts: dict[str, Any], resumes: int | None = None) -> None:
        """The reply written so far for `cid`, replacing the last save (one committed row)."""
        with self.db:
            self.db.execute("INSERT OR REPLACE INTO partial_replies VALUES (?, ?, ?, ?, ?, ?, ?)",
                            (cid, parent, resumes, content, reasoning, json.dumps(stats), json.dumps(facts)))

    def drop_partial(self, cid: int) -> None:
        """The reply ended with nothing to keep (stopped before a token, failed)."""
        with self.db:
            self.db.execute("DELETE FROM partial_replies WHERE conversation_id = ?", (cid,))

    def _recover_partials(self) -> int:
        """Replies the app was writing when it died become messages marked `finish_reason`
        "interrupted" (a resumed one gets its text so far); one transaction."""
        rows = self.db.execute("SELECT * FROM partial_replies").fetchall()
        if not rows:
            return 0
        now = time.time()
        with self.db:
            for r in rows:
                stats = json.loads(r["stats"]) | {"finish_reason": "interrupted"}
                old = self.db.execute("SELECT id FROM messages WHERE id = ?", (r["resumes"],)).fetchone() \
                    if r["resumes"] is not None else None
                if old is not None:
                    self.db.execute("UPDATE messages SET content = ?, reasoning = ?, stats = ? WHERE id = ?",
                                    (r["content"], r["reasoning"], json.dumps(stats), r["resumes"]))
                    leaf = r["resumes"]
                else:
                    parent = r["parent_id"] if r["parent_id"] is not None and self.db.execute(
                        "SELECT 1 FROM messages WHERE id = ?", (r["parent_id"],)).fetchone() else None
                    leaf = self.db.execute("INSERT INTO messages (conversation_id, role, content, created, stats, "
                                           "parent_id, reasoning, facts) VALUES (?, 'assistant', ?, ?, ?, ?, ?, ?)",
                                           (r["conversation_id"], r["content"], now, json.dumps(stats), parent,
                                            r["reasoning"], r["facts"])).lastrowid
                self.db.execute("UPDATE conversations SET leaf_id = ?, updated = ? WHERE id = ?",
                                (leaf, now, r["conversation_id"]))
            self.db.execute("DELETE FROM partial_replies")
        return len(rows)

    def select(self, cid: int, message_id: int | None, descend: bool = True) -> None:
        """Show the path through `message_id`: with `descend`, down to its newest descendant
        (following the newest child at each step), as ‹ 2/3 › browsing does."""
        if descend:  # from None: the newest first message
            _, children = self.tree(cid)
            while children.get(message_id):
                message_id = children[message_id][-1].id
        with self.db:
            self.db.execute("UPDATE conversations SET leaf_id = ? WHERE id = ?", (message_id, cid))

    # --- attachments and the context policy (app/attachments.py, app/chat_session.py) --------
    def attach_files(self, cid: int, messages: list[Message]) -> list[Message]:
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
        """The chat's context policy (app.chat_session); the default for a chat that never chose."""
        from app.chat_session import DEFAULT_POLICY
        row = self.db.execute("SELECT policy FROM chat_context WHERE conversation_id = ?", (cid,)).fetchone()
        return row["policy"] if row is not None else DEFAULT_POLICY

    def set_context_policy(self, cid: int, policy: str) -> None:
        from app.chat_session import POLICIES
        if policy not in POLICIES:
            raise ValueError(f"context policy {policy!r}: expected one of {', '.join(POLICIES)}")
        with self.db:
            self.db.execute("INSERT OR REPLACE INTO chat_context VALUES (?, ?)", (cid, policy))

    def delete_from(self, cid: int, message_id: int) -> None:
        """Delete a message and every reply below it (its subtree); its parent becomes the leaf."""
        parent = self.message(message_id).parent_id
        with self.db:
            self.db.execute("DELETE FROM messages WHERE conversation_id = ? AND id = ?", (cid, message_id))
        self.select(cid, parent)


def chat_messages(conv: Conversation, messages: list[Message]) -> list[dict[str, Any]]:
    """The engine's chat prompt: the system prompt, then every message in order.

    A reply's thinking is never part of its content; it goes along as `reasoning_content` (the
    key Qwen3's and DeepSeek's templates read) and `thinking` (gpt-oss's), so only a template
    that asks for earlier thinking gets it back — the others never mention those keys."""
    out: list[dict[str, Any]] = [{"role": "system", "content": conv.system_prompt}] if conv.system_prompt.strip() \
        else []
    for m in messages:
        msg: dict[str, Any] = {"role": m.role, "content": with_attachments(m.content, m.attachments)
                               if m.attachments else m.content}
        if m.reasoning:
            msg["reasoning_content"] = msg["thinking"] = m.reasoning
        out.append(msg)
    return out
