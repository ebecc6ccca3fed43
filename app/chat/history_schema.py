"""The history's tables: schema version 2, creating it, migrating a version-1 file, copying rows into it.

Version 2 exists because version 1 let two windows on one file mix their conversations: a plain INTEGER PRIMARY KEY
hands out the highest id again after a delete, so a window still holding a deleted conversation's id wrote into the
next new one, and positions computed outside the write transaction collided. AUTOINCREMENT never hands out an id
twice, and UNIQUE(conversation_id, position) makes any position race an error instead of a shuffled chat.
"""
from __future__ import annotations

import sqlite3
from itertools import groupby
from operator import itemgetter

SCHEMA_VERSION = 2
CONVERSATION_COLUMNS = ("id", "title", "system_prompt", "created", "updated")
MESSAGE_COLUMNS = ("id", "conversation_id", "position", "role", "content", "origins", "stats", "complete", "created")
_TABLES = (
    "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    """CREATE TABLE conversations (
        id INTEGER PRIMARY KEY AUTOINCREMENT, title TEXT NOT NULL, system_prompt TEXT NOT NULL DEFAULT '',
        created REAL NOT NULL, updated REAL NOT NULL)""",
    # The UNIQUE constraint's index also serves every "messages of a conversation in order" query.
    """CREATE TABLE messages (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
        position INTEGER NOT NULL, role TEXT NOT NULL, content TEXT NOT NULL, origins TEXT NOT NULL DEFAULT '',
        stats TEXT, complete INTEGER NOT NULL DEFAULT 1, created REAL NOT NULL,
        UNIQUE (conversation_id, position))""",
)


def stored_version(conn: sqlite3.Connection) -> int:
    """The schema version the file says it has: 0 for a new, empty file. Raises ValueError for a version that is
    not a number (not a SpecLens file, or one from a future that changed the format of the number)."""
    tables = {name for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    row = conn.execute("SELECT value FROM meta WHERE key='schema'").fetchone() if "meta" in tables else None
    if row is None:
        return 1 if "conversations" in tables else 0
    try:
        return int(row[0])
    except ValueError:
        raise ValueError(f"unknown history schema version {row[0]!r}") from None


def prepare(conn: sqlite3.Connection) -> None:
    """Create the tables of a new file or migrate a version-1 file, in one write transaction.

    The version is read again inside the transaction, so two windows opening an old file at once migrate it once.
    The closing no-op UPDATE is a write probe: SQLite silently opens a write-protected file read-only, and this is
    where that shows up (as SQLITE_READONLY) rather than at the first message. A file newer than this code is left
    untouched (the caller refuses it before coming here).
    """
    conn.execute("BEGIN IMMEDIATE")
    try:
        version = stored_version(conn)
        if version == 0:
            create(conn)
        elif version == 1:
            _migrate_v1(conn)
        conn.execute("UPDATE meta SET value=value WHERE key='schema'")
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise


def create(conn: sqlite3.Connection) -> None:
    """The current schema in an empty database (inside the caller's transaction)."""
    for statement in _TABLES:
        conn.execute(statement)
    conn.execute("INSERT OR REPLACE INTO meta VALUES ('schema', ?)", (str(SCHEMA_VERSION),))


def _migrate_v1(conn: sqlite3.Connection) -> None:
    """Rebuild a version-1 file as version 2, keeping every row and id (inside the caller's transaction).

    SQLite cannot add AUTOINCREMENT or a UNIQUE constraint to a table, so the rows are read, the old tables dropped
    (messages first, so nothing cascades) and the new ones filled.
    """
    conversations = conn.execute(f"SELECT {', '.join(CONVERSATION_COLUMNS)} FROM conversations").fetchall()
    messages = conn.execute(f"SELECT {', '.join(MESSAGE_COLUMNS)} FROM messages").fetchall()
    conn.execute("DROP TABLE messages")
    conn.execute("DROP TABLE conversations")
    create(conn)
    fill(conn, conversations, messages)


def fill(conn: sqlite3.Connection, conversations: list[tuple], messages: list[tuple]) -> None:
    """Insert rows given in CONVERSATION_COLUMNS / MESSAGE_COLUMNS order, keeping every id.

    Positions are renumbered 0, 1, 2... per conversation in stored order (position, then id): a version-1 file can
    hold duplicate positions (two windows wrote the same one) and a salvaged chat can have holes, and only the order
    ever meant anything. A message whose conversation row is gone gets a stand-in conversation, so no readable
    message is dropped.
    """
    known = {row[0] for row in conversations}
    orphan_times: dict[int, list[float]] = {}
    for message in messages:
        if message[1] not in known:
            orphan_times.setdefault(message[1], []).append(message[8])
    stand_ins = [(cid, f"Recovered chat {cid}", "", min(times), max(times)) for cid, times in orphan_times.items()]
    conn.executemany(_insert("conversations", CONVERSATION_COLUMNS), [*conversations, *stand_ins])
    renumbered = []
    for _, chat in groupby(sorted(messages, key=itemgetter(1, 2, 0)), key=itemgetter(1)):
        renumbered.extend((*m[:2], position, *m[3:]) for position, m in enumerate(chat))
    conn.executemany(_insert("messages", MESSAGE_COLUMNS), renumbered)


def keep_ids_above(conn: sqlite3.Connection, highest: dict[str, int]) -> None:
    """Make AUTOINCREMENT continue above ``highest`` (table -> highest id the old file ever handed out), so an id
    that a salvage could not recover is not given to a new row that an open window would then mistake for it."""
    for table, seq in highest.items():
        row = conn.execute("SELECT seq FROM sqlite_sequence WHERE name=?", (table,)).fetchone()
        if row is None:
            conn.execute("INSERT INTO sqlite_sequence (name, seq) VALUES (?, ?)", (table, seq))
        elif row[0] < seq:
            conn.execute("UPDATE sqlite_sequence SET seq=? WHERE name=?", (seq, table))


def _insert(table: str, columns: tuple[str, ...]) -> str:
    return f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})"
