"""Conversation history in SQLite (WAL): conversations, their messages, export to JSON and Markdown.

Every message keeps its source text (never its rendering), the origin of each character of an answer ("d" accepted
draft token, "t" target token, " " unknown) and the answer's stats. Answers are written while they stream, so a crash
or kill loses nothing already shown. A file that SQLite cannot read is moved aside and a fresh one started; the store
then carries a notice for the window to show.
"""
from __future__ import annotations

import json
import os
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path

SCHEMA_VERSION = 1
SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS conversations (
    id INTEGER PRIMARY KEY, title TEXT NOT NULL, system_prompt TEXT NOT NULL DEFAULT '',
    created REAL NOT NULL, updated REAL NOT NULL);
CREATE TABLE IF NOT EXISTS messages (
    id INTEGER PRIMARY KEY,
    conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
    position INTEGER NOT NULL, role TEXT NOT NULL, content TEXT NOT NULL,
    origins TEXT NOT NULL DEFAULT '', stats TEXT, complete INTEGER NOT NULL DEFAULT 1, created REAL NOT NULL);
CREATE INDEX IF NOT EXISTS messages_by_conversation ON messages(conversation_id, position);
"""
ROLES = ("user", "assistant")


class HistoryError(RuntimeError):
    """The history could not be read or written."""


@dataclass
class Message:
    """One chat message as stored: source text, per-character origins (answers only), stats (answers only)."""

    role: str
    content: str
    origins: str = ""
    stats: dict | None = None
    complete: bool = True
    id: int | None = None


@dataclass
class Conversation:
    """A conversation's header and, when loaded, its messages in order."""

    id: int
    title: str
    system_prompt: str = ""
    updated: float = 0.0
    messages: list[Message] = field(default_factory=list)


class HistoryStore:
    """The history database at ``path``; created when missing, moved aside and recreated when unreadable."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.notice: str | None = None  # set when a corrupt file was moved aside
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._conn = self._connect()
        except sqlite3.DatabaseError as exc:
            if not self.path.is_file():  # nothing to move aside: the folder itself is unusable
                raise HistoryError(f"cannot open the chat history at {self.path}: {exc}") from exc
            moved = self._move_aside()
            self.notice = (f"The chat history file could not be read ({exc}). It was moved to {moved} and a new, "
                           "empty history was started.")
            self._conn = self._connect()

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(str(self.path))
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute("PRAGMA foreign_keys=ON")
            check = conn.execute("PRAGMA quick_check").fetchone()[0]
            if check != "ok":
                raise sqlite3.DatabaseError(f"integrity check failed: {check}")
            conn.executescript(SCHEMA)
            version = conn.execute("SELECT value FROM meta WHERE key='schema'").fetchone()
            if version is None:
                conn.execute("INSERT INTO meta VALUES ('schema', ?)", (str(SCHEMA_VERSION),))
            elif int(version[0]) > SCHEMA_VERSION:
                raise sqlite3.DatabaseError(f"written by a newer SpecLens (schema {version[0]})")
            conn.commit()
        except (sqlite3.DatabaseError, ValueError) as exc:
            conn.close()
            raise sqlite3.DatabaseError(str(exc)) from exc
        return conn

    def _move_aside(self) -> Path:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        target = self.path.with_name(f"{self.path.stem}.corrupt-{stamp}{self.path.suffix}")
        n = 1
        while target.exists():
            target = self.path.with_name(f"{self.path.stem}.corrupt-{stamp}-{n}{self.path.suffix}")
            n += 1
        os.replace(self.path, target)
        for suffix in ("-wal", "-shm"):  # a stale journal must not be replayed into the new file
            side = Path(str(self.path) + suffix)
            if side.exists():
                os.replace(side, Path(str(target) + suffix))
        return target

    def close(self) -> None:
        """Flush and close the database."""
        self._conn.close()

    def _write(self, sql: str, args: tuple = ()) -> sqlite3.Cursor:
        try:
            with self._conn:
                return self._conn.execute(sql, args)
        except sqlite3.Error as exc:
            raise HistoryError(f"could not save the chat history to {self.path}: {exc}") from exc

    # conversations
    def create_conversation(self, title: str = "New chat", system_prompt: str = "") -> int:
        """A new empty conversation; returns its id."""
        now = time.time()
        cur = self._write("INSERT INTO conversations (title, system_prompt, created, updated) VALUES (?, ?, ?, ?)",
                          (title, system_prompt, now, now))
        return int(cur.lastrowid)

    def conversations(self) -> list[Conversation]:
        """All conversations (without messages), most recently updated first."""
        rows = self._conn.execute(
            "SELECT id, title, system_prompt, updated FROM conversations ORDER BY updated DESC, id DESC").fetchall()
        return [Conversation(id=r[0], title=r[1], system_prompt=r[2], updated=r[3]) for r in rows]

    def conversation(self, conversation_id: int) -> Conversation:
        """One conversation with its messages."""
        row = self._conn.execute("SELECT id, title, system_prompt, updated FROM conversations WHERE id=?",
                                 (conversation_id,)).fetchone()
        if row is None:
            raise HistoryError(f"no conversation with id {conversation_id}")
        conv = Conversation(id=row[0], title=row[1], system_prompt=row[2], updated=row[3])
        for mid, role, content, origins, stats, complete in self._conn.execute(
                "SELECT id, role, content, origins, stats, complete FROM messages WHERE conversation_id=? "
                "ORDER BY position", (conversation_id,)):
            conv.messages.append(Message(role=role, content=content, origins=origins,
                                         stats=json.loads(stats) if stats else None, complete=bool(complete), id=mid))
        return conv

    def rename(self, conversation_id: int, title: str) -> None:
        title = title.strip()
        if not title:
            raise HistoryError("a conversation needs a non-empty title")
        self._write("UPDATE conversations SET title=? WHERE id=?", (title, conversation_id))

    def set_system_prompt(self, conversation_id: int, text: str) -> None:
        self._write("UPDATE conversations SET system_prompt=? WHERE id=?", (text, conversation_id))

    def delete(self, conversation_id: int) -> None:
        self._write("DELETE FROM conversations WHERE id=?", (conversation_id,))

    # messages
    def add_message(self, conversation_id: int, message: Message) -> int:
        """Append ``message`` to the conversation; sets and returns its id."""
        if message.role not in ROLES:
            raise HistoryError(f"unknown message role {message.role!r}")
        now = time.time()
        pos = self._conn.execute("SELECT COALESCE(MAX(position) + 1, 0) FROM messages WHERE conversation_id=?",
                                 (conversation_id,)).fetchone()[0]
        cur = self._write(
            "INSERT INTO messages (conversation_id, position, role, content, origins, stats, complete, created) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (conversation_id, pos, message.role, message.content, message.origins,
             json.dumps(message.stats) if message.stats is not None else None, int(message.complete), now))
        self._touch(conversation_id, now)
        message.id = int(cur.lastrowid)
        return message.id

    def update_message(self, message: Message) -> None:
        """Store the current text, origins, stats and completeness of a message added earlier."""
        if message.id is None:
            raise HistoryError("update_message needs a message that was added first")
        self._write("UPDATE messages SET content=?, origins=?, stats=?, complete=? WHERE id=?",
                    (message.content, message.origins,
                     json.dumps(message.stats) if message.stats is not None else None, int(message.complete),
                     message.id))

    def delete_messages_from(self, conversation_id: int, message_id: int) -> None:
        """Delete message ``message_id`` and every later message of the conversation (for edit and regenerate)."""
        row = self._conn.execute("SELECT position FROM messages WHERE id=? AND conversation_id=?",
                                 (message_id, conversation_id)).fetchone()
        if row is None:
            raise HistoryError(f"message {message_id} is not in conversation {conversation_id}")
        self._write("DELETE FROM messages WHERE conversation_id=? AND position>=?", (conversation_id, row[0]))

    def _touch(self, conversation_id: int, when: float) -> None:
        self._write("UPDATE conversations SET updated=? WHERE id=?", (when, conversation_id))

    # export
    def export_json(self, conversation_id: int, path: Path) -> None:
        """Write the conversation (title, system prompt, messages with stats) as JSON."""
        conv = self.conversation(conversation_id)
        data = {"title": conv.title, "system_prompt": conv.system_prompt,
                "messages": [{"role": m.role, "content": m.content, "complete": m.complete,
                              **({"stats": m.stats} if m.stats else {})} for m in conv.messages]}
        Path(path).write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")

    def export_markdown(self, conversation_id: int, path: Path) -> None:
        """Write the conversation as a Markdown document (message text verbatim)."""
        conv = self.conversation(conversation_id)
        parts = [f"# {conv.title}\n"]
        if conv.system_prompt:
            parts.append(f"**System:** {conv.system_prompt}\n")
        for m in conv.messages:
            heading = "User" if m.role == "user" else "Assistant" + ("" if m.complete else " (stopped)")
            parts.append(f"## {heading}\n\n{m.content}\n")
        Path(path).write_text("\n".join(parts), encoding="utf-8")
