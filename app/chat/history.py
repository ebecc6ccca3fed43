"""Conversation history in SQLite (WAL): conversations, their messages, paging through long chats, export.

Every message keeps its source text (never its rendering), the origin of each character of an answer ("d" accepted
draft token, "t" target token, " " unknown) and the answer's stats. Answers are written while they stream, so a crash
or kill loses nothing already shown.

Several windows (or processes) may share one file. Every write is one BEGIN IMMEDIATE transaction, so what it reads
first (does the conversation still exist, which position comes next) cannot change before it writes; ids are never
reused, so a window holding the id of a conversation deleted elsewhere gets DeletedElsewhereError instead of writing
into a newer chat. Opening (locks, read-only files, damage, old schemas) lives in history_open, and every SQLite
error reaches the caller as a HistoryError subclass naming the file (history_errors).
"""
from __future__ import annotations

import json
import os
import re
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

from app.chat.history_errors import (DeletedElsewhereError, HistoryError, HistoryLockedError, HistoryReadOnlyError,
                                     HistoryReplacedError, read_only_error, translate)
from app.chat.history_open import BUSY_TIMEOUT_S, Opened, another_connection, open_history

__all__ = ["ROLES", "Conversation", "DeletedElsewhereError", "HistoryError", "HistoryLockedError",
           "HistoryReadOnlyError", "HistoryReplacedError", "HistoryStore", "Message", "storable"]

ROLES = ("user", "assistant")
_SURROGATE = re.compile("[\ud800-\udfff]")
_MESSAGE_FIELDS = "id, role, content, origins, stats, complete"


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


def storable(text: str) -> str:
    """``text`` with every surrogate code point replaced by U+FFFD.

    Python strings can hold lone surrogates (a tokenizer's split byte pair, a clipboard, an OS API) but UTF-8, and so
    SQLite, cannot: they raised UnicodeEncodeError on save. One character for one keeps an answer's per-character
    origins aligned with its text.
    """
    return _SURROGATE.sub("\ufffd", text)


def _file_identity(path: Path) -> tuple[int, int] | None:
    """(device, inode) of the file at ``path``, None when there is none: which file a path names right now."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _conversation_gone(conversation_id: int) -> DeletedElsewhereError:
    return DeletedElsewhereError(f"Conversation {conversation_id} is no longer in the chat history: this conversation "
                                 "was deleted in another window.")


def _require_conversation(conn: sqlite3.Connection, conversation_id: int) -> None:
    if conn.execute("SELECT 1 FROM conversations WHERE id=?", (conversation_id,)).fetchone() is None:
        raise _conversation_gone(conversation_id)


class HistoryStore:
    """The history database at ``path``: created when missing, migrated when old, repaired when damaged.

    ``read_only`` is True when the file can only be read (every write then raises HistoryReadOnlyError), and
    ``notice`` holds a message for the window to show once (read-only, repaired, or moved aside), else None.
    ``busy_timeout`` is how many seconds an operation waits for another window's transaction before raising
    HistoryLockedError.
    """

    def __init__(self, path: Path, busy_timeout: float = BUSY_TIMEOUT_S, opened: Opened | None = None) -> None:
        self.path = Path(path)
        self.busy_timeout = busy_timeout
        opened = opened or open_history(self.path, busy_timeout)
        self._conn = opened.conn
        self.read_only = opened.read_only
        self.notice = opened.notice
        self._identity = _file_identity(self.path)

    def alongside(self) -> "HistoryStore":
        """Another connection to this file for another thread (a writer's), opened without waiting for any lock."""
        return HistoryStore(self.path, self.busy_timeout, another_connection(self.path, self.read_only,
                                                                              self.busy_timeout))

    def close(self) -> None:
        """Flush and close the database."""
        self._conn.close()

    @contextmanager
    def _transaction(self, doing: str, write: bool = True) -> Iterator[sqlite3.Connection]:
        """One transaction; SQLite errors inside become HistoryErrors saying what could not be done (``doing``).

        Writes take the write lock up front (BEGIN IMMEDIATE), waiting up to the busy timeout for another window,
        and are refused when the path now names another file than the one opened (SQLite would go on writing into
        the renamed one without noticing). Reads get one consistent snapshot (BEGIN). A write refused as read-only
        marks the store read-only: SQLite opens a write-protected file without saying so, and from then on nothing
        will be saved.
        """
        if write and self.read_only:
            raise read_only_error(self.path, doing)
        conn = self._conn
        try:
            conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
            if write and _file_identity(self.path) != self._identity:  # checked under the lock a repair takes too
                raise HistoryReplacedError(f"Could not {doing}: the chat history at {self.path} was replaced by "
                                           "another window (a repair) or moved; it has to be opened again.")
            yield conn
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            self._rollback()
            error = translate(exc, self.path, doing)
            if write and isinstance(error, HistoryReadOnlyError):
                self.read_only = True
            raise error from exc
        except BaseException:
            self._rollback()
            raise

    def _rollback(self) -> None:
        if self._conn.in_transaction:
            with suppress(sqlite3.Error):  # the error being reported matters more than a failed rollback
                self._conn.execute("ROLLBACK")

    # conversations
    def create_conversation(self, title: str = "New chat", system_prompt: str = "") -> int:
        """A new empty conversation; returns its id (never one used before in this file)."""
        now = time.time()
        with self._transaction("save the new conversation") as conn:
            cur = conn.execute("INSERT INTO conversations (title, system_prompt, created, updated) VALUES (?, ?, ?, ?)",
                               (storable(title), storable(system_prompt), now, now))
        return int(cur.lastrowid)

    def conversations(self) -> list[Conversation]:
        """All conversations (without messages), most recently updated first."""
        with self._transaction("read the list of conversations", write=False) as conn:
            rows = conn.execute("SELECT id, title, system_prompt, updated FROM conversations "
                                "ORDER BY updated DESC, id DESC").fetchall()
        return [Conversation(*row) for row in rows]

    def conversation(self, conversation_id: int) -> Conversation:
        """One conversation with all its messages in order (two queries on one snapshot, however long the chat)."""
        with self._transaction("read the conversation", write=False) as conn:
            row = conn.execute("SELECT id, title, system_prompt, updated FROM conversations WHERE id=?",
                               (conversation_id,)).fetchone()
            if row is None:
                raise _conversation_gone(conversation_id)
            return Conversation(*row, messages=self._messages(conn, conversation_id, 0, -1))

    def message_count(self, conversation_id: int) -> int:
        """How many messages the conversation has (for a view that pages through a long chat)."""
        with self._transaction("read the conversation", write=False) as conn:
            _require_conversation(conn, conversation_id)
            return conn.execute("SELECT COUNT(*) FROM messages WHERE conversation_id=?",
                                (conversation_id,)).fetchone()[0]

    def messages(self, conversation_id: int, offset: int = 0, limit: int | None = None) -> list[Message]:
        """Messages ``offset`` .. ``offset + limit - 1`` of the conversation in order (all from ``offset`` when
        ``limit`` is None), so a view can show part of a long chat without loading all of it."""
        if offset < 0 or (limit is not None and limit < 0):
            raise ValueError(f"offset and limit must not be negative (got {offset}, {limit})")
        with self._transaction("read the conversation", write=False) as conn:
            _require_conversation(conn, conversation_id)
            return self._messages(conn, conversation_id, offset, -1 if limit is None else limit)

    @staticmethod
    def _messages(conn: sqlite3.Connection, conversation_id: int, offset: int, limit: int) -> list[Message]:
        """One query, served by the (conversation_id, position) index; ``limit`` -1 means no limit."""
        rows = conn.execute(f"SELECT {_MESSAGE_FIELDS} FROM messages WHERE conversation_id=? ORDER BY position "
                            "LIMIT ? OFFSET ?", (conversation_id, limit, offset))
        return [Message(role=role, content=content, origins=origins, stats=json.loads(stats) if stats else None,
                        complete=bool(complete), id=mid) for mid, role, content, origins, stats, complete in rows]

    def rename(self, conversation_id: int, title: str) -> None:
        """Give the conversation a new, non-empty title (surrounding spaces dropped)."""
        title = title.strip()
        if not title:
            raise HistoryError("a conversation needs a non-empty title")
        self._set_conversation_field(conversation_id, "title", title, "save the new title")

    def set_system_prompt(self, conversation_id: int, text: str) -> None:
        self._set_conversation_field(conversation_id, "system_prompt", text, "save the system prompt")

    def _set_conversation_field(self, conversation_id: int, column: str, value: str, doing: str) -> None:
        with self._transaction(doing) as conn:
            cur = conn.execute(f"UPDATE conversations SET {column}=? WHERE id=?", (storable(value), conversation_id))
            if cur.rowcount == 0:
                raise _conversation_gone(conversation_id)

    def delete(self, conversation_id: int) -> None:
        """Delete the conversation and its messages (nothing happens if it is already gone)."""
        with self._transaction("delete the conversation") as conn:
            conn.execute("DELETE FROM conversations WHERE id=?", (conversation_id,))

    # messages
    def add_message(self, conversation_id: int, message: Message) -> int:
        """Append ``message`` to the conversation; sets and returns its id.

        The position is computed inside the write transaction, so two windows adding to one chat never take the
        same one; a conversation deleted in another window raises DeletedElsewhereError.
        """
        if message.role not in ROLES:
            raise HistoryError(f"unknown message role {message.role!r}")
        now = time.time()
        with self._transaction("save the message") as conn:
            _require_conversation(conn, conversation_id)
            position = conn.execute("SELECT COALESCE(MAX(position) + 1, 0) FROM messages WHERE conversation_id=?",
                                    (conversation_id,)).fetchone()[0]
            cur = conn.execute(
                "INSERT INTO messages (conversation_id, position, role, content, origins, stats, complete, created) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (conversation_id, position, message.role, *self._values(message), now))
            conn.execute("UPDATE conversations SET updated=? WHERE id=?", (now, conversation_id))
        message.id = int(cur.lastrowid)
        return message.id

    def update_message(self, message: Message) -> None:
        """Store the current text, origins, stats and completeness of a message added earlier."""
        self.update_messages([message])

    def update_messages(self, messages: list[Message]) -> None:
        """Store several messages added earlier in one transaction: all of them or none."""
        if any(m.id is None for m in messages):
            raise HistoryError("update_message needs a message that was added first")
        with self._transaction("save the answer") as conn:
            for m in messages:
                cur = conn.execute("UPDATE messages SET content=?, origins=?, stats=?, complete=? WHERE id=?",
                                   (*self._values(m), m.id))
                if cur.rowcount == 0:
                    raise DeletedElsewhereError(f"Message {m.id} is no longer in the chat history: it was deleted in "
                                                "another window.")

    @staticmethod
    def _values(message: Message) -> tuple:
        """content, origins, stats, complete as stored."""
        stats = json.dumps(message.stats) if message.stats is not None else None
        return storable(message.content), storable(message.origins), stats, int(message.complete)

    def delete_messages_from(self, conversation_id: int, message_id: int) -> None:
        """Delete message ``message_id`` and every later message of the conversation (for edit and regenerate)."""
        with self._transaction("delete the messages") as conn:
            row = conn.execute("SELECT position FROM messages WHERE id=? AND conversation_id=?",
                               (message_id, conversation_id)).fetchone()
            if row is None:
                raise DeletedElsewhereError(f"Message {message_id} is no longer in conversation {conversation_id} "
                                            "(deleted in another window?)")
            conn.execute("DELETE FROM messages WHERE conversation_id=? AND position>=?", (conversation_id, row[0]))

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
