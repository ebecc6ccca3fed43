"""Opening the history file: read-write when possible, read-only when not, repaired when damaged, and never thrown
away because someone else holds it.

Each failure has its own answer. A lock is another SpecLens window or process, not damage: wait (SQLite's busy
timeout), then raise HistoryLockedError so the window can retry; moving a locked file aside, as version 1 did, left
the other process writing into the renamed copy. A read-only file or folder still shows past chats. A file written
by a newer SpecLens is refused and left untouched. Only what SQLite reports as damaged is repaired (history_repair).
"""
from __future__ import annotations

import os
import sqlite3
from dataclasses import dataclass
from pathlib import Path

from app.chat.history_errors import (HistoryError, HistoryReadOnlyError, is_damaged, is_read_only, translate)
from app.chat.history_repair import SIDE_FILES, integrity_problem, repair
from app.chat.history_schema import SCHEMA_VERSION, prepare, stored_version

BUSY_TIMEOUT_S = 5.0  # how long a write waits for another window's transaction before HistoryLockedError
OPENING = "open the chat history"


@dataclass
class Opened:
    """An open history: the connection, whether it may be written, and a message for the window (or None)."""

    conn: sqlite3.Connection
    read_only: bool
    notice: str | None


class _Damaged(Exception):
    """SQLite reported damage while opening; carries what it said."""


class _CannotWrite(Exception):
    """SQLite refused to write although the permissions looked fine."""


def writable(path: Path) -> bool:
    """Whether the history at ``path`` may be written: its folder (SQLite creates the -wal and -shm files there) and
    each of its files that exists. The one place that decides, so tests, which run as root and are never refused by
    permission bits, can stand in for a read-only folder."""
    files = [path, *(Path(f"{path}{suffix}") for suffix in SIDE_FILES)]
    return os.access(path.parent, os.W_OK | os.X_OK) and all(os.access(f, os.W_OK) for f in files if f.exists())


def connect(path: Path, query: str, busy_timeout: float) -> sqlite3.Connection:
    """A connection through a ``file:`` URI (``query`` as in "mode=ro"), in autocommit mode: every transaction is
    explicit (BEGIN IMMEDIATE for writes), which is what lets several windows share the file."""
    return sqlite3.connect(f"{path.resolve().as_uri()}?{query}", uri=True, timeout=busy_timeout,
                           isolation_level=None)


def open_history(path: Path, busy_timeout: float = BUSY_TIMEOUT_S) -> Opened:
    """Open (creating, migrating or repairing as needed) the history at ``path``; raises HistoryError subclasses."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise HistoryError(f"Cannot use {path.parent} as the chat history folder: {exc}") from exc
    if writable(path):
        try:
            return _open_read_write(path, busy_timeout)
        except _CannotWrite:
            pass  # SQLite knew better than the permission bits (a write-protected file, a read-only mount)
    return _open_read_only(path, busy_timeout)


def _open_read_write(path: Path, busy_timeout: float) -> Opened:
    try:
        return Opened(_checked(path, busy_timeout), read_only=False, notice=None)
    except _Damaged as damage:
        problem = str(damage)
    try:
        done = repair(path, problem, lambda p: connect(p, "mode=rw", busy_timeout))
    except sqlite3.Error as exc:
        raise translate(exc, path, "repair the damaged chat history") from exc
    except OSError as exc:
        raise HistoryError(f"Could not repair the damaged chat history at {path}: {exc}") from exc
    try:
        return Opened(_checked(path, busy_timeout), read_only=False, notice=done.notice)
    except _Damaged as damage:
        raise HistoryError(f"The chat history at {path} is still damaged after a repair ({damage}).") from None


def _checked(path: Path, busy_timeout: float) -> sqlite3.Connection:
    """A read-write connection to a sound file of a known schema, created or migrated to the current one."""
    conn = None
    try:
        conn = connect(path, "mode=rwc", busy_timeout)
        conn.execute("PRAGMA journal_mode=WAL")  # readers never wait for the writer, and a kill loses nothing saved
        _set_up(conn)
        _known_version(conn, path)
        problem = integrity_problem(conn)
        if problem is not None:
            raise _Damaged(problem)
        prepare(conn)
        return conn
    except sqlite3.Error as exc:
        if conn is not None:
            conn.close()
        if is_damaged(exc):
            raise _Damaged(str(exc)) from exc
        if is_read_only(exc):
            raise _CannotWrite from exc
        raise translate(exc, path, OPENING) from exc
    except BaseException:
        if conn is not None:
            conn.close()
        raise


def _set_up(conn: sqlite3.Connection) -> None:
    """The settings each read-write connection needs (SQLite keeps them per connection, not in the file)."""
    conn.execute("PRAGMA synchronous=NORMAL")  # in WAL mode: durable on checkpoint, consistent always
    conn.execute("PRAGMA foreign_keys=ON")  # deleting a conversation deletes its messages


def another_connection(path: Path, read_only: bool, busy_timeout: float) -> Opened:
    """One more connection to a history that :func:`open_history` opened (checked, migrated or repaired), for another
    thread: a connection serves one thread. It writes nothing while opening, so it never waits for a lock."""
    conn = None
    try:
        conn = connect(path, "mode=ro" if read_only else "mode=rw", busy_timeout)
        if not read_only:
            _set_up(conn)
    except sqlite3.Error as exc:
        if conn is not None:
            conn.close()
        raise translate(exc, path, OPENING) from exc
    return Opened(conn, read_only, notice=None)


def _open_read_only(path: Path, busy_timeout: float) -> Opened:
    """The existing file at ``path`` for reading only, with a notice saying nothing new will be saved.

    A damaged file is opened as it is: repairing it needs a writable folder. A version-1 file needs no migration to
    be read (the columns are the same).
    """
    if not path.is_file():
        if path.exists():
            raise HistoryError(f"Cannot open the chat history at {path}: it is not a file.")
        raise HistoryReadOnlyError(f"Cannot create the chat history at {path}: its folder is read-only.")
    conn = None
    try:
        conn = _connect_read_only(path, busy_timeout)
        if _known_version(conn, path) == 0:
            raise HistoryReadOnlyError(f"Cannot create the chat history at {path}: the file is read-only.")
        problem = integrity_problem(conn)
    except sqlite3.Error as exc:
        if conn is not None:
            conn.close()
        raise translate(exc, path, OPENING) from exc
    except BaseException:
        if conn is not None:
            conn.close()
        raise
    notice = (f"The chat history at {path} was opened read-only: past conversations can be read, but new messages "
              "will not be saved. Make the file and its folder writable (or set SPECLENS_DATA_DIR to a writable "
              "folder) and restart SpecLens to save again.")
    if problem is not None:
        notice += f" The file is also damaged ({problem}); it can be repaired once it is writable."
    return Opened(conn, read_only=True, notice=notice)


def _connect_read_only(path: Path, busy_timeout: float) -> sqlite3.Connection:
    """A read-only connection. In WAL mode even a reader needs the -shm file; in a read-only folder where the last
    writer removed it only immutable mode can read, which is safe when no -wal file holds changes the main file
    lacks."""
    conn = connect(path, "mode=ro", busy_timeout)
    try:
        conn.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()  # the first read opens the WAL files
        return conn
    except sqlite3.Error as exc:
        conn.close()
        if not is_read_only(exc) or Path(f"{path}-wal").exists():
            raise
    return connect(path, "mode=ro&immutable=1", busy_timeout)


def _known_version(conn: sqlite3.Connection, path: Path) -> int:
    """The file's schema version; a newer one (or one that is not a number) is refused, and the file left as it is."""
    try:
        version = stored_version(conn)
    except ValueError as exc:
        raise HistoryError(f"The chat history at {path} is not one SpecLens can read ({exc}); it was left "
                           "untouched.") from None
    if version > SCHEMA_VERSION:
        raise HistoryError(f"The chat history at {path} was written by a newer SpecLens (schema {version}; this "
                           f"version reads up to {SCHEMA_VERSION}). Update SpecLens, or set SPECLENS_DATA_DIR to "
                           "another folder; the file was left untouched.")
    return version
