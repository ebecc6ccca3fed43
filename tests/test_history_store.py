"""The history store on its own: locks, read-only files, damage and salvage, schema migration, several windows and
processes on one file, text SQLite cannot encode, long chats.

Damage is made the way a disk makes it: one page of a closed file overwritten, found with SQLite's dbstat table.
"""
from __future__ import annotations

import json
import multiprocessing
import shutil
import sqlite3
import struct
import subprocess
from contextlib import closing
from pathlib import Path

import pytest

import app.chat.history_open as history_open
from app.chat.history import (Conversation, DeletedElsewhereError, HistoryError, HistoryLockedError,
                              HistoryReadOnlyError, HistoryReplacedError, HistoryStore, Message)

LONG_CHAT = 2000
SHORT_WAIT_S = 0.05  # busy timeout for tests that expect a lock to win
PROCESS_WAIT_S = 120.0  # generous: the machine is shared, and a slow machine must not fail the test

# Version 1's schema, verbatim, to build the files that old SpecLens versions left behind.
V1_SCHEMA = """
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
INSERT INTO meta VALUES ('schema', '1');
"""


# ----------------------------------------------------------------------------------------------- helpers
def text_of(i: int) -> str:
    return f"message {i}: " + "lorem ipsum " * 3


@pytest.fixture(scope="module")
def long_chat_file(tmp_path_factory) -> Path:
    """A closed history holding one conversation of LONG_CHAT messages (built once, copied by each test)."""
    path = tmp_path_factory.mktemp("long") / "history.sqlite3"
    store = HistoryStore(path)
    cid = store.create_conversation("long chat")
    for i in range(LONG_CHAT):
        store.add_message(cid, Message("user" if i % 2 == 0 else "assistant", text_of(i)))
    store.close()
    return path


@pytest.fixture
def long_chat(long_chat_file, tmp_path) -> Path:
    path = tmp_path / "history.sqlite3"
    shutil.copy(long_chat_file, path)
    return path


def opened(path: Path) -> closing[sqlite3.Connection]:
    """A plain connection, closed (not merely committed) at the end of the with-block, so no -wal is left behind."""
    return closing(sqlite3.connect(path, isolation_level=None))


def all_rows(path: Path) -> list[tuple]:
    """(id, conversation_id, role, content) of every message, read straight from the file in chat order."""
    with opened(path) as conn:
        return conn.execute("SELECT id, conversation_id, role, content FROM messages "
                            "ORDER BY conversation_id, position").fetchall()


def pages_of(path: Path, name: str, pagetype: str) -> tuple[list[int], int]:
    """The pages of b-tree ``name`` of type ``pagetype`` ('leaf', 'internal') in key order, and the page size."""
    conn = sqlite3.connect(path)
    try:
        pages = [row[0] for row in conn.execute("SELECT pageno FROM dbstat WHERE name=? AND pagetype=? ORDER BY path",
                                                (name, pagetype))]
        return pages, conn.execute("PRAGMA page_size").fetchone()[0]
    finally:
        conn.close()


def read_varint(data: bytes, at: int) -> tuple[int, int]:
    """SQLite's big-endian varint at ``at``: (value, offset after it)."""
    value = 0
    for k in range(9):
        byte = data[at + k]
        if k == 8:
            return (value << 8) | byte, at + 9
        value = (value << 7) | (byte & 0x7F)
        if byte < 0x80:
            return value, at + k + 1
    raise AssertionError("unreachable")


def rowids_on_leaf(path: Path, page: int, page_size: int) -> list[int]:
    """The rowids stored on table-leaf ``page`` (file format: https://sqlite.org/fileformat2.html#b_tree_pages)."""
    data = path.read_bytes()[(page - 1) * page_size: page * page_size]
    assert data[0] == 0x0D, "not a table leaf page"
    cells = struct.unpack(">H", data[3:5])[0]
    rowids = []
    for j in range(cells):
        offset = struct.unpack(">H", data[8 + 2 * j: 10 + 2 * j])[0]
        _, after_size = read_varint(data, offset)
        rowids.append(read_varint(data, after_size)[0])
    return rowids


def smash_page(path: Path, page: int, page_size: int) -> None:
    wal = Path(f"{path}-wal")
    assert not wal.exists() or wal.stat().st_size == 0, "the file must be checkpointed before it is damaged"
    with open(path, "r+b") as f:
        f.seek((page - 1) * page_size)
        f.write(b"\xff" * page_size)


def moved_aside(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if ".corrupt-" in p.name and p.suffix == ".sqlite3")


def chattr_works(folder: Path) -> bool:
    """Whether this machine lets us set the immutable attribute, which even root cannot write through."""
    probe = folder / "chattr-probe"
    probe.write_text("x")
    try:
        return shutil.which("chattr") is not None and subprocess.run(
            ["chattr", "+i", str(probe)], capture_output=True).returncode == 0
    finally:
        subprocess.run(["chattr", "-i", str(probe)], capture_output=True)
        probe.unlink()


# ----------------------------------------------------------------------------------------------- locks
def test_locked_history_waits_then_raises_locked_and_keeps_the_file(tmp_path):
    path = tmp_path / "history.sqlite3"
    store = HistoryStore(path)
    cid = store.create_conversation("mine")
    store.add_message(cid, Message("user", "kept"))
    store.close()

    other = sqlite3.connect(path, isolation_level=None)  # another process holding the file exclusively
    other.execute("PRAGMA locking_mode=EXCLUSIVE")
    other.execute("BEGIN EXCLUSIVE")
    other.execute("UPDATE conversations SET title='written while locked'")
    with pytest.raises(HistoryLockedError) as info:
        HistoryStore(path, busy_timeout=SHORT_WAIT_S)
    assert "another SpecLens window or process" in str(info.value) and str(path) in str(info.value)
    assert "try again" in str(info.value)
    assert moved_aside(tmp_path) == [] and path.is_file()
    other.execute("COMMIT")
    other.close()

    again = HistoryStore(path, busy_timeout=SHORT_WAIT_S)
    assert again.notice is None and not again.read_only
    conv = again.conversation(cid)
    assert conv.title == "written while locked" and [m.content for m in conv.messages] == ["kept"]


def test_a_write_meeting_a_lock_raises_locked_and_can_be_retried(tmp_path):
    path = tmp_path / "history.sqlite3"
    store = HistoryStore(path, busy_timeout=SHORT_WAIT_S)
    cid = store.create_conversation("chat")
    answer = Message("assistant", "first")
    store.add_message(cid, answer)

    other = sqlite3.connect(path, isolation_level=None)  # another window in the middle of a write
    other.execute("BEGIN IMMEDIATE")
    answer.content = "first, then more"
    for attempt in (lambda: store.add_message(cid, Message("user", "blocked")), lambda: store.update_message(answer),
                    lambda: store.rename(cid, "blocked"), lambda: store.create_conversation("blocked")):
        with pytest.raises(HistoryLockedError):
            attempt()
    other.execute("ROLLBACK")
    other.close()

    assert [m.content for m in store.conversation(cid).messages] == ["first"]  # nothing half-written
    store.update_message(answer)  # the retry the window makes
    store.add_message(cid, Message("user", "after"))
    assert [m.content for m in store.conversation(cid).messages] == ["first, then more", "after"]


# ----------------------------------------------------------------------------------------------- read-only
def test_read_only_folder_opens_read_only_and_refuses_writes_clearly(tmp_path, monkeypatch):
    path = tmp_path / "history.sqlite3"
    store = HistoryStore(path)
    cid = store.create_conversation("old chat", "be brief")
    answer = Message("assistant", "an answer")
    store.add_message(cid, answer)
    store.close()
    before = path.read_bytes()

    checked = []
    monkeypatch.setattr(history_open, "writable", lambda p: checked.append(p) or False)
    ro = HistoryStore(path)
    assert checked == [path]
    assert ro.read_only and "opened read-only" in ro.notice and "new messages will not be saved" in ro.notice
    assert [m.content for m in ro.conversation(cid).messages] == ["an answer"]
    assert [c.title for c in ro.conversations()] == ["old chat"]
    answer.content = "changed"
    for write in (lambda: ro.add_message(cid, Message("user", "new")), lambda: ro.update_message(answer),
                  lambda: ro.create_conversation("new"), lambda: ro.rename(cid, "new"),
                  lambda: ro.set_system_prompt(cid, "new"), lambda: ro.delete(cid),
                  lambda: ro.delete_messages_from(cid, answer.id)):
        with pytest.raises(HistoryReadOnlyError) as info:
            write()
        assert str(path) in str(info.value) and "read-only" in str(info.value)
    ro.close()
    assert path.read_bytes() == before and moved_aside(tmp_path) == []


def test_missing_history_in_a_read_only_folder_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setattr(history_open, "writable", lambda p: False)
    with pytest.raises(HistoryReadOnlyError) as info:
        HistoryStore(tmp_path / "history.sqlite3")
    assert "read-only" in str(info.value) and str(tmp_path) in str(info.value)


def test_sqlite_refusing_a_write_is_read_only_not_a_raw_error(tmp_path):
    path = tmp_path / "history.sqlite3"
    store = HistoryStore(path)
    cid = store.create_conversation("chat")
    # query_only makes SQLite refuse writes exactly as it does for a write-protected file: SQLITE_READONLY
    store._conn.execute("PRAGMA query_only=ON")
    with pytest.raises(HistoryReadOnlyError) as info:
        store.add_message(cid, Message("user", "lost?"))
    assert not isinstance(info.value, sqlite3.Error) and str(path) in str(info.value)
    assert store.read_only
    with pytest.raises(HistoryReadOnlyError):
        store.rename(cid, "still refused")
    assert store.conversation(cid).messages == []


def test_write_protection_enforced_by_the_os_opens_read_only(tmp_path, monkeypatch):
    """Root ignores permission bits but not the immutable attribute: the real thing, where the machine allows it."""
    if not chattr_works(tmp_path):
        pytest.skip("chattr +i is not available here")
    folder = tmp_path / "data"
    folder.mkdir()
    path = folder / "history.sqlite3"
    store = HistoryStore(path)
    cid = store.create_conversation("protected")
    store.add_message(cid, Message("user", "readable"))
    store.close()

    subprocess.run(["chattr", "+i", str(path)], check=True)
    try:  # the permission check is fooled; SQLite opens the file read-only without saying so
        monkeypatch.setattr(history_open, "writable", lambda p: True)
        fooled = HistoryStore(path)
        assert fooled.read_only and "opened read-only" in fooled.notice
        assert [m.content for m in fooled.conversation(cid).messages] == ["readable"]
        with pytest.raises(HistoryReadOnlyError):
            fooled.add_message(cid, Message("user", "refused"))
        fooled.close()
    finally:
        subprocess.run(["chattr", "-i", str(path)], check=True)
    monkeypatch.undo()

    for side in folder.glob("history.sqlite3-*"):  # as a clean shutdown leaves it: no -wal, no -shm
        side.unlink()
    subprocess.run(["chattr", "+i", str(folder)], check=True)
    try:  # a read-only folder: no -shm can be created, so only an immutable read works
        ro = HistoryStore(path)
        assert ro.read_only and [m.content for m in ro.conversation(cid).messages] == ["readable"]
        with pytest.raises(HistoryReadOnlyError):
            ro.create_conversation("refused")
        ro.close()
    finally:
        subprocess.run(["chattr", "-i", str(folder)], check=True)
    assert moved_aside(folder) == []


# ----------------------------------------------------------------------------------------------- damage
def test_bad_index_page_is_salvaged_with_every_row(long_chat):
    before = all_rows(long_chat)
    with opened(long_chat) as conn:
        [(index,)] = conn.execute("SELECT name FROM sqlite_master WHERE type='index' AND tbl_name='messages'")
    leaves, page_size = pages_of(long_chat, index, "leaf")
    smash_page(long_chat, leaves[len(leaves) // 2], page_size)
    with opened(long_chat) as conn:  # the damage as the probe saw it: the check fails, the rows read
        assert conn.execute("PRAGMA quick_check").fetchone()[0] != "ok"
        assert conn.execute("SELECT COUNT(*) FROM messages NOT INDEXED").fetchone()[0] == LONG_CHAT
    damaged = long_chat.read_bytes()

    store = HistoryStore(long_chat)
    assert f"{LONG_CHAT} messages were recovered" in store.notice and "1 conversation " in store.notice
    assert "could not be recovered" not in store.notice
    [moved] = moved_aside(long_chat.parent)
    assert str(moved) in store.notice and moved.read_bytes() == damaged
    [conv] = store.conversations()
    assert [(m.id, m.role, m.content) for m in store.conversation(conv.id).messages] == \
        [(mid, role, content) for mid, _, role, content in before]
    new = store.add_message(conv.id, Message("user", "the repaired file takes new messages"))
    assert new > max(row[0] for row in before)
    store.close()
    with opened(long_chat) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    assert HistoryStore(long_chat).notice is None


def test_bad_table_page_loses_only_the_rows_stored_on_it(long_chat):
    before = all_rows(long_chat)
    leaves, page_size = pages_of(long_chat, "messages", "leaf")
    bad = leaves[len(leaves) // 2]
    lost = set(rowids_on_leaf(long_chat, bad, page_size))
    assert 0 < len(lost) < LONG_CHAT // 10
    smash_page(long_chat, bad, page_size)

    store = HistoryStore(long_chat)
    kept = LONG_CHAT - len(lost)
    assert f"{kept} messages were recovered" in store.notice and "could not be recovered" in store.notice
    [conv] = store.conversations()
    assert [(m.id, m.content) for m in store.conversation(conv.id).messages] == \
        [(mid, content) for mid, _, _, content in before if mid not in lost]
    assert store.message_count(conv.id) == kept
    new = store.add_message(conv.id, Message("user", "after the repair"))
    assert new > max(lost)  # an id that may still sit in an open window is never handed out again


def test_a_window_never_writes_into_a_file_another_window_moved_aside(long_chat):
    a = HistoryStore(long_chat)
    [conv] = a.conversations()
    last_id = a.conversation(conv.id).messages[-1].id
    a._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    leaves, page_size = pages_of(long_chat, "messages", "leaf")
    smash_page(long_chat, leaves[len(leaves) // 2], page_size)  # damaged while window A is open
    b = HistoryStore(long_chat)  # window B starts, finds the damage, repairs and moves the file aside
    assert "recovered" in b.notice
    with pytest.raises(HistoryReplacedError) as info:
        a.add_message(conv.id, Message("user", "from A"))
    assert str(long_chat) in str(info.value)
    a.close()
    [moved] = moved_aside(long_chat.parent)
    with opened(moved) as conn:  # nothing after the last message went into the moved-aside file
        assert conn.execute("SELECT COUNT(*) FROM messages WHERE rowid > ?", (last_id,)).fetchone()[0] == 0

    a = HistoryStore(long_chat)  # what window A does: open the path again
    a.add_message(conv.id, Message("user", "from A"))
    assert b.conversation(conv.id).messages[-1].content == "from A"


def test_unreadable_file_is_moved_aside_and_an_empty_history_started(tmp_path):
    path = tmp_path / "history.sqlite3"
    garbage = b"this is not an sqlite database at all\x00\x01" * 100
    path.write_bytes(garbage)
    store = HistoryStore(path)
    [moved] = moved_aside(tmp_path)
    assert moved.read_bytes() == garbage
    assert str(moved) in store.notice and "new, empty history" in store.notice
    assert store.conversations() == []
    store.add_message(store.create_conversation("fresh"), Message("user", "works"))


def test_newer_schema_is_refused_and_left_in_place(tmp_path):
    path = tmp_path / "history.sqlite3"
    store = HistoryStore(path)
    store.create_conversation("from the future")
    store._conn.execute("UPDATE meta SET value='99' WHERE key='schema'")
    store.close()
    before = path.read_bytes()
    with pytest.raises(HistoryError) as info:
        HistoryStore(path)
    assert "newer SpecLens" in str(info.value) and str(path) in str(info.value)
    assert path.read_bytes() == before and moved_aside(tmp_path) == []


def test_unusable_folder_is_a_clear_error(tmp_path):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the data folder should be")
    with pytest.raises(HistoryError) as info:
        HistoryStore(blocker / "history.sqlite3")
    assert "not-a-folder" in str(info.value)
    with pytest.raises(HistoryError) as info:  # the history path itself is a folder
        HistoryStore(tmp_path)
    assert str(tmp_path) in str(info.value) and tmp_path.is_dir()


# ----------------------------------------------------------------------------------------------- schema
def test_version_1_file_is_migrated_keeping_every_row_and_id(tmp_path):
    path = tmp_path / "history.sqlite3"
    with opened(path) as conn:
        conn.executescript(V1_SCHEMA)
        conn.executemany("INSERT INTO conversations VALUES (?, ?, ?, ?, ?)",
                         [(1, "first", "sys", 1.0, 3.0), (4, "second", "", 2.0, 5.0)])
        # ids with holes, and the duplicate position two version-1 windows could write
        conn.executemany("INSERT INTO messages VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                         [(2, 1, 0, "user", "q1", "", None, 1, 1.0),
                          (5, 1, 1, "assistant", "a1", "dt", '{"tokens": 2}', 1, 1.1),
                          (7, 4, 0, "user", "q2", "", None, 1, 2.0),
                          (8, 4, 0, "user", "q2 again (same position)", "", None, 1, 2.1),
                          (9, 4, 1, "assistant", "a2", "t", None, 0, 2.2)])
    store = HistoryStore(path)
    assert store.notice is None
    assert [(c.id, c.title, c.system_prompt) for c in store.conversations()] == [(4, "second", ""),
                                                                                  (1, "first", "sys")]
    first, second = store.conversation(1), store.conversation(4)
    assert [(m.id, m.content, m.origins, m.stats) for m in first.messages] == [(2, "q1", "", None),
                                                                               (5, "a1", "dt", {"tokens": 2})]
    assert [(m.id, m.content, m.complete) for m in second.messages] == [
        (7, "q2", True), (8, "q2 again (same position)", True), (9, "a2", False)]
    with opened(path) as conn:
        assert conn.execute("SELECT value FROM meta WHERE key='schema'").fetchone()[0] == "2"
        assert conn.execute("SELECT position FROM messages WHERE conversation_id=4 ORDER BY position").fetchall() == \
            [(0,), (1,), (2,)]

    store.delete(4)  # the newest ids: version 1 would hand them out again
    assert store.create_conversation("after") not in (1, 4)
    assert store.add_message(1, Message("user", "new")) > 9


def test_deleted_ids_are_never_reused(tmp_path):
    store = HistoryStore(tmp_path / "history.sqlite3")
    cid = store.create_conversation("a")
    mid = store.add_message(cid, Message("user", "hi"))
    store.delete(cid)
    again = store.create_conversation("b")
    assert again != cid and store.add_message(again, Message("user", "hi")) != mid


# ----------------------------------------------------------------------------------------------- several windows
def test_two_windows_on_one_file_never_mix_conversations(tmp_path):
    path = tmp_path / "history.sqlite3"
    a, b = HistoryStore(path), HistoryStore(path)
    chat = a.create_conversation("shared")
    for i in range(6):
        (a if i % 2 == 0 else b).add_message(chat, Message("user", f"turn {i}"))
    assert [m.content for m in b.conversation(chat).messages] == [f"turn {i}" for i in range(6)]
    with opened(path) as conn:
        assert [p for (p,) in conn.execute("SELECT position FROM messages ORDER BY position")] == list(range(6))

    b_answer = b.conversation(chat).messages[-1]
    a.delete(chat)  # window A deletes the chat and starts a new one; window B still shows the old one
    fresh = a.create_conversation("a's new chat")
    assert fresh != chat
    with pytest.raises(DeletedElsewhereError, match="deleted in another window"):
        b.add_message(chat, Message("user", "late message from B"))
    b_answer.content = "late edit from B"
    for late in (lambda: b.update_message(b_answer), lambda: b.rename(chat, "late title"),
                 lambda: b.set_system_prompt(chat, "late prompt"), lambda: b.conversation(chat),
                 lambda: b.delete_messages_from(chat, b_answer.id)):
        with pytest.raises(DeletedElsewhereError):
            late()
    assert a.conversation(fresh).messages == [] and a.conversation(fresh).title == "a's new chat"
    assert all_rows(path) == []


def _add_many(path: Path, chat: int, who: str, count: int, start) -> None:
    """One process (window) adding ``count`` messages to ``chat`` as fast as it can, once both are ready."""
    store = HistoryStore(path, busy_timeout=PROCESS_WAIT_S)
    start.wait(PROCESS_WAIT_S)
    for i in range(count):
        store.add_message(chat, Message("user", f"{who} {i}"))
    store.close()


def test_two_processes_adding_to_one_chat_get_distinct_positions(tmp_path):
    path = tmp_path / "history.sqlite3"
    store = HistoryStore(path)
    chat = store.create_conversation("busy")
    count = 200
    context = multiprocessing.get_context("fork")
    start = context.Barrier(2)
    workers = [context.Process(target=_add_many, args=(path, chat, who, count, start)) for who in ("A", "B")]
    for w in workers:
        w.start()
    for w in workers:
        w.join(PROCESS_WAIT_S)
    assert [w.exitcode for w in workers] == [0, 0]

    messages = store.conversation(chat).messages
    assert len(messages) == 2 * count
    with opened(path) as conn:
        positions = [p for (p,) in conn.execute("SELECT position FROM messages WHERE conversation_id=?", (chat,))]
    assert sorted(positions) == list(range(2 * count))
    for who in ("A", "B"):  # each window's messages in the order it sent them
        assert [m.content for m in messages if m.content.startswith(who)] == [f"{who} {i}" for i in range(count)]


# ----------------------------------------------------------------------------------------------- text and errors
def test_lone_surrogates_are_stored_as_replacement_characters(tmp_path):
    store = HistoryStore(tmp_path / "history.sqlite3")
    chat = store.create_conversation("title \ud800", "prompt \udfff")
    answer = Message("assistant", "half \ud83d", origins="ddddddt")
    store.add_message(chat, answer)
    answer.content, answer.origins = "half \ud83d\ude00 done", "ddddddtttttt"
    store.update_message(answer)
    store.add_message(chat, Message("user", "\udc80 question"))
    conv = store.conversation(chat)
    assert (conv.title, conv.system_prompt) == ("title \ufffd", "prompt \ufffd")
    assert [m.content for m in conv.messages] == ["half \ufffd\ufffd done", "\ufffd question"]
    assert len(conv.messages[0].content) == len(conv.messages[0].origins)  # origins stay aligned
    store.rename(chat, "renamed \ud800")
    store.set_system_prompt(chat, "\udbff system")
    conv = store.conversation(chat)
    assert (conv.title, conv.system_prompt) == ("renamed \ufffd", "\ufffd system")


def test_any_sqlite_error_on_write_is_a_history_error_naming_the_file(tmp_path):
    path = tmp_path / "history.sqlite3"
    store = HistoryStore(path)
    chat = store.create_conversation("chat")
    with opened(path) as other:  # the file changed under the window in a way nothing expects
        other.execute("DROP TABLE messages")
    with pytest.raises(HistoryError) as info:
        store.add_message(chat, Message("user", "hello"))
    assert not isinstance(info.value, sqlite3.Error) and str(path) in str(info.value)
    store.rename(chat, "the store is still usable")
    assert store.conversations()[0].title == "the store is still usable"


# ----------------------------------------------------------------------------------------------- what works stays
def test_wal_and_normal_sync(tmp_path):
    path = tmp_path / "history.sqlite3"
    store = HistoryStore(path)
    assert store._conn.execute("PRAGMA synchronous").fetchone()[0] == 1  # NORMAL
    with opened(path) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_export_json_and_markdown(tmp_path):
    store = HistoryStore(tmp_path / "history.sqlite3")
    chat = store.create_conversation("Exported", "Be brief.")
    store.add_message(chat, Message("user", "Question?"))
    store.add_message(chat, Message("assistant", "Half an", origins="dddtttt", stats={"tokens": 3}, complete=False))
    store.export_json(chat, tmp_path / "c.json")
    data = json.loads((tmp_path / "c.json").read_text(encoding="utf-8"))
    assert data == {"title": "Exported", "system_prompt": "Be brief.", "messages": [
        {"role": "user", "content": "Question?", "complete": True},
        {"role": "assistant", "content": "Half an", "complete": False, "stats": {"tokens": 3}}]}
    store.export_markdown(chat, tmp_path / "c.md")
    assert (tmp_path / "c.md").read_text(encoding="utf-8") == (
        "# Exported\n\n**System:** Be brief.\n\n## User\n\nQuestion?\n\n## Assistant (stopped)\n\nHalf an\n")


# ----------------------------------------------------------------------------------------------- long chats
def test_long_chat_is_read_in_one_query_and_can_be_paged(long_chat):
    store = HistoryStore(long_chat)
    [conv] = store.conversations()
    statements = []
    store._conn.set_trace_callback(statements.append)
    full = store.conversation(conv.id)
    store._conn.set_trace_callback(None)
    selects = [s for s in statements if s.lstrip().upper().startswith("SELECT")]
    assert len(selects) == 2  # the header and all messages, not one query per message
    assert [m.content for m in full.messages] == [text_of(i) for i in range(LONG_CHAT)]

    assert store.message_count(conv.id) == LONG_CHAT
    page = store.messages(conv.id, offset=LONG_CHAT - 10, limit=50)
    assert [m.content for m in page] == [text_of(i) for i in range(LONG_CHAT - 10, LONG_CHAT)]
    assert [m.id for m in store.messages(conv.id, 100, 3)] == [m.id for m in full.messages[100:103]]
    assert store.messages(conv.id, 0, 0) == [] and store.messages(conv.id, LONG_CHAT) == []
    with pytest.raises(ValueError):
        store.messages(conv.id, -1)
    store.delete(conv.id)
    for gone in (lambda: store.message_count(conv.id), lambda: store.messages(conv.id, 0, 10)):
        with pytest.raises(DeletedElsewhereError):
            gone()
    assert isinstance(full, Conversation)
