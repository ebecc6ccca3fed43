"""Repairing a damaged history file: copy every row that can still be read into a fresh file, keep the damaged one.

Only a file that SQLite itself reports as damaged comes here (a failed integrity check, or "malformed" / "not a
database" while opening). One bad page usually leaves almost everything readable: a damaged index loses nothing at
all, since the tables are read without it, and a damaged table page loses only the rows stored on it. The damaged
file is never deleted, only moved aside next to the new one, so a better tool can still be tried on it.
"""
from __future__ import annotations

import os
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from app.chat.history_errors import is_damaged, is_locked
from app.chat.history_schema import CONVERSATION_COLUMNS, MESSAGE_COLUMNS, create, fill, keep_ids_above

MIN_ROWID, MAX_ROWID = -(2 ** 63), 2 ** 63 - 1
SIDE_FILES = ("-wal", "-shm")  # SQLite's WAL journal and its index, which belong to the file they sit next to
PROBLEM_CHARS = 200  # an integrity report can list a hundred problems; the notice quotes the start


@dataclass(frozen=True)
class Repair:
    """What a repair did: where the damaged file went and how much of it was carried into the new one."""

    problem: str
    moved: Path
    conversations: int
    messages: int
    complete: bool  # every row of both tables could be read

    @property
    def notice(self) -> str:
        """A message for the window to show once."""
        if not (self.conversations or self.messages):
            return (f"The chat history file could not be read ({self.problem}). It was moved to {self.moved} and a "
                    "new, empty history was started.")
        lost = "" if self.complete else (" Parts of the file could not be read; the messages stored there could "
                                         "not be recovered.")
        return (f"The chat history file was damaged ({self.problem}). {_count(self.conversations, 'conversation')} "
                f"and {_count(self.messages, 'message')} were recovered into a new history file.{lost} The damaged "
                f"file was moved to {self.moved}.")


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def integrity_problem(conn: sqlite3.Connection) -> str | None:
    """What ``PRAGMA quick_check`` found wrong, or None for a sound file. A check that stops because a page is
    malformed is a problem too; any other error (a lock, an I/O error) is no damage to repair, and propagates."""
    try:
        found = [row[0] for row in conn.execute("PRAGMA quick_check")]
    except sqlite3.DatabaseError as exc:
        if not is_damaged(exc):
            raise
        return str(exc)
    return None if found == ["ok"] else " ".join(" ".join(found).split())[:PROBLEM_CHARS]


def repair(path: Path, problem: str, connect: Callable[[Path], sqlite3.Connection]) -> Repair:
    """Replace the damaged file at ``path`` by a fresh one holding every readable row; return what happened.

    The damaged file is write-locked while it is read, so a window still using it cannot add a message that the
    copy would miss; a lock held by someone else propagates (a window is still writing there: not ours to move).
    Nothing is moved until the fresh file is complete, so a failure (disk full) leaves everything as it was. With
    nothing readable, the file is only moved aside and the caller starts an empty history.
    """
    damaged = connect(path)
    try:
        _lock(damaged)
        conversations, conversations_complete = read_table(damaged, "conversations", CONVERSATION_COLUMNS)
        messages, messages_complete = read_table(damaged, "messages", MESSAGE_COLUMNS)
        fresh = None
        if conversations or messages:
            fresh = _write_fresh(path, conversations, messages, _issued_ids(damaged))
    finally:
        damaged.close()
    moved = move_aside(path)
    if fresh is not None:
        os.replace(fresh, path)
    return Repair(problem=problem, moved=moved, conversations=len(conversations), messages=len(messages),
                  complete=conversations_complete and messages_complete)


def read_table(conn: sqlite3.Connection, table: str, columns: tuple[str, ...]) -> tuple[list[tuple], bool]:
    """Every row of ``table`` that can be read, in rowid order, and whether that was all of them.

    The table's own b-tree is walked (NOT INDEXED), so a damaged index costs nothing. A scan stops at the first
    unreadable page; the row fetched just before (Python's sqlite3 drops it when the following step fails) is read
    again on its own, the first rowid whose page can be reached after the damage is found by bisection, and the scan
    resumes there. Rows on a damaged page are lost; so, when a table has several damaged pages, may be a sound page
    between two of them that the bisection steps over. ``columns[0]`` must be the rowid (INTEGER PRIMARY KEY).
    """
    scan = f"SELECT {', '.join(columns)} FROM {table} NOT INDEXED WHERE rowid >= ? ORDER BY rowid"
    first = scan + " LIMIT 1"
    rows: list[tuple] = []
    complete = True
    start = MIN_ROWID
    while True:
        try:
            for row in conn.execute(scan, (start,)):
                rows.append(row)
                start = row[0] + 1
            return rows, complete
        except sqlite3.DatabaseError as exc:
            _unless_locked(exc)
            complete = False
        if start > MAX_ROWID:
            return rows, complete
        try:
            row = conn.execute(first, (start,)).fetchone()
        except sqlite3.DatabaseError as exc:
            _unless_locked(exc)
            resume = _first_reachable(conn, first, start)
            if resume is None:
                return rows, complete
            start = resume
            continue
        if row is None:
            return rows, complete
        rows.append(row)
        start = row[0] + 1


def _first_reachable(conn: sqlite3.Connection, first: str, unreachable: int) -> int | None:
    """The smallest rowid above ``unreachable`` from which ``first`` can run, or None if there is none.

    A rowid search fails exactly when its path down the b-tree meets a damaged page, which for one damaged page is a
    contiguous run of rowids: bisection finds its end in at most 64 queries.
    """
    def reachable(rowid: int) -> bool:
        try:
            conn.execute(first, (rowid,)).fetchone()
        except sqlite3.DatabaseError as exc:
            _unless_locked(exc)
            return False
        return True

    if unreachable >= MAX_ROWID or not reachable(MAX_ROWID):
        return None
    low, high = unreachable, MAX_ROWID  # low cannot be searched from, high can
    while high - low > 1:
        middle = (low + high) // 2
        if reachable(middle):
            high = middle
        else:
            low = middle
    return high


def _unless_locked(exc: sqlite3.DatabaseError) -> None:
    if is_locked(exc):
        raise exc


def _lock(conn: sqlite3.Connection) -> None:
    """Take the write lock on the damaged file; damage that prevents even that is no reason not to read it."""
    try:
        conn.execute("BEGIN IMMEDIATE")
    except sqlite3.DatabaseError as exc:
        _unless_locked(exc)


def _issued_ids(conn: sqlite3.Connection) -> dict[str, int]:
    """The highest ids the damaged file ever handed out, per table, as far as they can still be read."""
    try:
        return {name: seq for name, seq in conn.execute("SELECT name, seq FROM sqlite_sequence")
                if name in ("conversations", "messages")}
    except sqlite3.DatabaseError as exc:  # a version-1 file has no sqlite_sequence; a damaged one may hide it
        _unless_locked(exc)
        return {}


def _write_fresh(path: Path, conversations: list[tuple], messages: list[tuple], issued: dict[str, int]) -> Path:
    """A complete new history file next to ``path`` holding the given rows; its rollback journal is gone when this
    returns, so the file can be renamed into place on its own."""
    fresh = path.with_name(path.name + ".repairing")
    for leftover in (fresh, Path(f"{fresh}-journal")):  # from a repair that was interrupted
        leftover.unlink(missing_ok=True)
    conn = sqlite3.connect(fresh, isolation_level=None)
    try:
        conn.execute("BEGIN")
        create(conn)
        fill(conn, conversations, messages)
        keep_ids_above(conn, issued)
        conn.execute("COMMIT")
    finally:
        conn.close()
    return fresh


def move_aside(path: Path) -> Path:
    """Rename ``path`` (with its -wal and -shm, which must never be replayed into another file) to a free
    ``<stem>.corrupt-<time><suffix>`` name next to it; returns the new name."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    target = path.with_name(f"{path.stem}.corrupt-{stamp}{path.suffix}")
    n = 1
    while target.exists():
        target = path.with_name(f"{path.stem}.corrupt-{stamp}-{n}{path.suffix}")
        n += 1
    os.replace(path, target)
    for suffix in SIDE_FILES:
        side = Path(f"{path}{suffix}")
        if side.exists():
            os.replace(side, Path(f"{target}{suffix}"))
    return target
