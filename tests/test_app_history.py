"""History: restored after a restart, renamed, deleted, exported; a corrupt file is moved aside, not fatal."""
from __future__ import annotations

import json
import sqlite3
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


def test_corrupt_history_is_moved_aside_and_a_new_one_started(make_window, data_dir, ask, monkeypatch):
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


def test_rename_delete_and_export(make_window, ask, tmp_path):
    window = make_window()
    session = window.session
    result = ask(window, "Export me")
    cid = session.conv.id
    session.rename(cid, "  Renamed chat  ")
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


def test_a_locked_history_is_waited_for_and_nothing_is_lost(make_window, ask, qtbot, data_dir, monkeypatch):
    from app.chat.history import HistoryLockedError

    window = make_window()
    store = window.session.store
    original = store.add_message
    calls = []

    def locked_once(cid, message):
        calls.append(message.content)
        if len(calls) == 1:
            raise HistoryLockedError("another SpecLens window or process is holding the chat history")
        return original(cid, message)

    monkeypatch.setattr(store, "add_message", locked_once)
    statuses = []
    window.session.status.connect(statuses.append)
    result = ask(window, "wait for the lock")
    assert any("holding the chat history" in s for s in statuses)        # shown, not a traceback
    qtbot.waitUntil(lambda: window.session.writer.pending == 0, timeout=10_000)   # retried a second later
    with sqlite3.connect(data_dir / HISTORY_FILE) as conn:
        rows = conn.execute("SELECT role, content FROM messages ORDER BY position").fetchall()
    assert rows == [("user", "wait for the lock"), ("assistant", result.text)]


def test_a_read_only_history_says_so_once_and_keeps_the_chat_in_the_window(make_window, ask, qtbot, monkeypatch):
    window = make_window()
    monkeypatch.setattr(window.session.store, "read_only", True)
    shown = []
    window.message_shown.connect(lambda title, text: shown.append(text))
    result = ask(window, "not saved")
    ask(window, "nor this")
    assert len([t for t in shown if "read-only" in t]) == 1
    assert [m.content for m in window.session.conv.messages][:2] == ["not saved", result.text]
