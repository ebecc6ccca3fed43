"""The chat history's errors, and the one place where SQLite's errors become them.

The window must never see a raw ``sqlite3`` exception: what it does next depends on the kind of failure (wait and
retry a lock, stop saving on a read-only file, tell the user about a damaged one), so every SQLite error is sorted
here by its result code into one of the classes below, with a message that names the file.
"""
from __future__ import annotations

import sqlite3
from pathlib import Path

# SQLite's primary result codes (https://sqlite.org/rescode.html). Python 3.11+ exposes them on the exception as
# ``sqlite_errorcode``; on 3.10 the code is recovered from SQLite's fixed English message for it.
SQLITE_PERM, SQLITE_BUSY, SQLITE_LOCKED, SQLITE_READONLY = 3, 5, 6, 8
SQLITE_CORRUPT, SQLITE_CANTOPEN, SQLITE_NOTADB = 11, 14, 26
_CODE_BY_MESSAGE = {
    "database is locked": SQLITE_BUSY,
    "database table is locked": SQLITE_LOCKED,
    "attempt to write a readonly database": SQLITE_READONLY,
    "unable to open database file": SQLITE_CANTOPEN,
    "database disk image is malformed": SQLITE_CORRUPT,
    "file is not a database": SQLITE_NOTADB,
}
LOCKED_CODES = frozenset({SQLITE_BUSY, SQLITE_LOCKED})
READ_ONLY_CODES = frozenset({SQLITE_READONLY, SQLITE_CANTOPEN, SQLITE_PERM})
DAMAGED_CODES = frozenset({SQLITE_CORRUPT, SQLITE_NOTADB})


class HistoryError(RuntimeError):
    """The history could not be read or written; the message says why and names the file."""


class HistoryLockedError(HistoryError):
    """Another SpecLens window or process held the history longer than the busy timeout. Nothing is wrong with the
    file: try again a little later."""


class HistoryReadOnlyError(HistoryError):
    """The history cannot be written (read-only file or folder): reading works, nothing new is saved."""


class HistoryReplacedError(HistoryError):
    """The file at the history's path is no longer the one this store opened (another window repaired the damaged
    file and moved it aside, or someone moved it). Writing on would go into the moved-aside copy and be lost from
    sight, so the store refuses: close it and open the path again."""


class DeletedElsewhereError(HistoryError):
    """The conversation or message written to no longer exists, typically deleted in another window. Ids are never
    reused, so the write is refused rather than landing in another conversation."""


def sqlite_code(exc: sqlite3.Error) -> int | None:
    """The primary SQLite result code of ``exc`` (extended codes folded), or None when unknown."""
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF
    return _CODE_BY_MESSAGE.get(str(exc).strip().lower())


def is_locked(exc: sqlite3.Error) -> bool:
    return sqlite_code(exc) in LOCKED_CODES


def is_read_only(exc: sqlite3.Error) -> bool:
    return sqlite_code(exc) in READ_ONLY_CODES


def is_damaged(exc: sqlite3.Error) -> bool:
    return sqlite_code(exc) in DAMAGED_CODES


def locked_error(path: Path, doing: str) -> HistoryLockedError:
    return HistoryLockedError(f"Could not {doing}: another SpecLens window or process is holding the chat history at "
                              f"{path}. SpecLens will try again.")


def read_only_error(path: Path, doing: str) -> HistoryReadOnlyError:
    return HistoryReadOnlyError(f"Could not {doing}: the chat history at {path} is read-only, so new messages are "
                                "not saved.")


def translate(exc: sqlite3.Error, path: Path, doing: str) -> HistoryError:
    """The HistoryError for SQLite error ``exc`` met while trying to ``doing`` (a verb phrase: "save the message")."""
    if is_locked(exc):
        return locked_error(path, doing)
    if is_read_only(exc):
        return read_only_error(path, doing)
    if is_damaged(exc):
        return HistoryError(f"Could not {doing}: the chat history at {path} is damaged ({exc}). Restart SpecLens to "
                            "repair it.")
    return HistoryError(f"Could not {doing} in the chat history at {path}: {exc}")
