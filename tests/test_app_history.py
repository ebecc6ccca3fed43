"""History: restored after a restart, renamed, deleted, exported; a corrupt file is moved aside, not fatal."""
from __future__ import annotations

import json
import sqlite3
import threading
from dataclasses import replace

import pytest
from PySide6.QtCore import Qt

from app.chat.history import HistoryError, HistoryStore, Message
from app.main import HISTORY_FILE
from app.settings import load_settings


def test_restart_restores_conversations_and_settings(make_window, ask, qtbot, data_dir):
    window = make_window()
    window.apply_settings(replace(window.settings, strategy="tree", tree_branching="2,1"))
    qtbot.waitUntil(lambda: window.session.is_warm, timeout=60_000)
    result = ask(window, "Remember this conversation")
    window.system_edit.setText("Be brief.")
    window.system_edit.editingFinished.emit()
    window.close()

    restored_settings = load_settings()
    assert (restored_settings.strategy, restored_settings.tree_branching) == ("tree", "2,1")
    again = make_window(**{k: getattr(restored_settings, k) for k in ("strategy", "tree_branching")})
    assert again.sidebar.list.count() == 1
    item = again.sidebar.list.item(0)
    assert item.text() == "Remember this conversation"
    again.session.open_conversation(item.data(Qt.ItemDataRole.UserRole))
    messages = again.session.conv.messages
    assert [(m.role, m.content) for m in messages] == [("user", "Remember this conversation"),
                                                       ("assistant", result.text)]
    assert again.system_edit.text() == "Be brief."
    assert messages[-1].origins and messages[-1].stats["tokens"] == result.stats.new_tokens
    assert f"{result.stats.new_tokens} tokens" in again.transcript.stats_text(1)
    assert "Tree(2x1)" in again.strategy_label.text()


def test_interrupted_answer_is_restored_and_marked(make_window, data_dir):
    store = HistoryStore(data_dir / HISTORY_FILE)
    cid = store.create_conversation("cut off")
    store.add_message(cid, Message("user", "question"))
    store.add_message(cid, Message("assistant", "half an ans", complete=False))  # as a killed app leaves it
    store.close()
    window = make_window()
    window.session.open_conversation(cid)
    assert window.session.conv.messages[-1].content == "half an ans"
    assert "interrupted" in window.transcript.stats_text(1)


def test_corrupt_history_is_moved_aside_and_a_new_one_started(make_window, data_dir, ask, monkeypatch, saved):
    data_dir.mkdir(parents=True)
    garbage = b"this is not an sqlite database at all\x00\x01" * 100
    (data_dir / HISTORY_FILE).write_bytes(garbage)
    shown = []
    from app.main_window import MainWindow

    original = MainWindow.show_message

    def record(self, title, text, *args):
        shown.append((title, text))
        return original(self, title, text, *args)

    monkeypatch.setattr(MainWindow, "show_message", record)  # the notice comes from the constructor
    window = make_window()
    assert len(shown) == 1
    title, text = shown[0]
    moved = [p for p in data_dir.iterdir() if ".corrupt-" in p.name]
    assert len(moved) == 1 and moved[0].read_bytes() == garbage
    assert title == "Chat history" and str(moved[0]) in text and "new, empty history" in text
    assert window.sidebar.list.count() == 0
    ask(window, "works again")
    saved(window)
    with sqlite3.connect(data_dir / HISTORY_FILE) as conn:
        assert conn.execute("SELECT COUNT(*) FROM messages").fetchone()[0] == 2


def test_history_uses_wal_and_a_newer_schema_is_refused(tmp_path):
    store = HistoryStore(tmp_path / "h.sqlite3")
    assert store._conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    store._conn.execute("UPDATE meta SET value='99' WHERE key='schema'")
    store._conn.commit()
    store.close()
    before = (tmp_path / "h.sqlite3").read_bytes()
    with pytest.raises(HistoryError, match="newer SpecLens"):
        HistoryStore(tmp_path / "h.sqlite3")
    assert (tmp_path / "h.sqlite3").read_bytes() == before


def test_rename_delete_and_export(make_window, ask, tmp_path, saved):
    window = make_window()
    session = window.session
    result = ask(window, "Export me")
    saved(window)
    cid = session.conv.id
    session.rename(cid, "  Renamed chat  ")
    saved(window)
    assert window.sidebar.list.item(0).text() == "Renamed chat"
    with pytest.raises(HistoryError):
        session.store.rename(cid, "   ")

    session.export(cid, "json", tmp_path / "c.json")
    data = json.loads((tmp_path / "c.json").read_text(encoding="utf-8"))
    assert data["title"] == "Renamed chat"
    assert [(m["role"], m["content"]) for m in data["messages"]] == [("user", "Export me"),
                                                                     ("assistant", result.text)]
    assert data["messages"][1]["stats"]["tokens"] == result.stats.new_tokens
    session.export(cid, "md", tmp_path / "c.md")
    md = (tmp_path / "c.md").read_text(encoding="utf-8")
    assert md.startswith("# Renamed chat\n") and "## User\n\nExport me\n" in md and result.text in md

    session.delete(cid)
    saved(window)
    assert session.conv is None and window.sidebar.list.count() == 0 and window.transcript.count() == 0
    assert session.store.conversations() == []
    with pytest.raises(HistoryError):
        session.store.conversation(cid)


def test_unusable_history_folder_is_a_clear_error(tmp_path):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the data folder should be")
    with pytest.raises((HistoryError, OSError)) as info:
        HistoryStore(blocker / "history.sqlite3")
    assert "not-a-folder" in str(info.value)


def test_a_locked_history_is_waited_for_and_nothing_is_lost(make_window, ask, qtbot, data_dir, saved):
    window = make_window()
    other = sqlite3.connect(data_dir / HISTORY_FILE, isolation_level=None)   # another program, holding the lock
    other.execute("BEGIN IMMEDIATE")
    statuses = []
    window.session.status.connect(statuses.append)
    try:
        result = ask(window, "wait for the lock")   # chats on while the file is locked
        qtbot.waitUntil(lambda: any("holding the chat history" in s for s in statuses), timeout=30_000)
        assert window.session.writer.pending > 0 and window.session.conv.id < 0   # in the window, not the file yet
    finally:
        other.execute("ROLLBACK")
        other.close()
    saved(window)   # retried every second: written once the lock is gone
    with sqlite3.connect(data_dir / HISTORY_FILE) as conn:
        rows = conn.execute("SELECT role, content FROM messages ORDER BY position").fetchall()
    assert rows == [("user", "wait for the lock"), ("assistant", result.text)]
    assert window.session.conv.id > 0 and window.sidebar.list.count() == 1


def test_no_history_write_runs_on_the_gui_thread(make_window, ask, qtbot, monkeypatch, saved):
    # a write waits for another program's lock for seconds: on the GUI thread that froze the window
    writes = set()
    for name in ("create_conversation", "add_message", "update_messages", "delete_messages_from", "rename",
                 "set_system_prompt", "delete"):
        original = getattr(HistoryStore, name)
        monkeypatch.setattr(HistoryStore, name, lambda self, *a, _o=original, **k: writes.add(
            threading.get_ident()) or _o(self, *a, **k))
    window = make_window()
    ask(window, "first")
    window.system_edit.setText("Be brief.")
    window.system_edit.editingFinished.emit()
    with qtbot.waitSignal(window.session.answer_finished, timeout=60_000):
        assert window.session.regenerate()
    saved(window)
    window.session.rename(window.session.conv.id, "renamed")
    window.session.delete(window.session.conv.id)
    saved(window)
    assert writes and threading.get_ident() not in writes


def test_closing_while_the_history_is_locked_asks_and_closes_once_written(make_window, ask, qtbot, data_dir):
    window = make_window()
    ask(window, "keep me")
    other = sqlite3.connect(data_dir / HISTORY_FILE, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    try:
        ask(window, "and me")
        with qtbot.waitSignal(window.message_shown, timeout=30_000) as shown:
            window.close()
        assert window.isVisible() and "not saved yet" in shown.args[1]   # told, and still open
    finally:
        other.execute("ROLLBACK")
        other.close()
    qtbot.waitUntil(lambda: not window.isVisible(), timeout=30_000)   # closed by itself once written
    with sqlite3.connect(data_dir / HISTORY_FILE) as conn:
        rows = conn.execute("SELECT content FROM messages WHERE role='user' ORDER BY position").fetchall()
    assert rows == [("keep me",), ("and me",)]


def test_a_read_only_history_says_so_once_and_keeps_the_chat_in_the_window(make_window, ask, qtbot, monkeypatch):
    window = make_window()
    monkeypatch.setattr(window.session.store, "read_only", True)
    shown = []
    window.message_shown.connect(lambda title, text: shown.append(text))
    result = ask(window, "not saved")
    ask(window, "nor this")
    assert len([t for t in shown if "read-only" in t]) == 1
    assert [m.content for m in window.session.conv.messages][:2] == ["not saved", result.text]
